/* prom.h - Prometheus text exposition format (version 0.0.4) writer, and the histogram type.
 *
 *   # HELP kvrouter_http_requests_total HTTP requests answered, by route and status.
 *   # TYPE kvrouter_http_requests_total counter
 *   kvrouter_http_requests_total{route="/v1/route",code="200"} 1027
 *   kvrouter_http_request_duration_seconds_bucket{route="/v1/route",le="0.0001"} 980
 *   ...
 *
 * Label values are escaped (\\, \", \n). One family is written as a header followed by its
 * samples; the writer does not check that names repeat correctly (tests do).
 *
 * Histograms (srv_hist) count observations in integer native units (microseconds, blocks,
 * per-mille) into fixed buckets; srv_hist_spec gives the upper bounds and the factor that
 * converts native units to the exported unit (1e-6 for µs -> seconds). A histogram is written by
 * one thread (its owner) and read by the scraper: counters are relaxed atomics, so a scrape may
 * see a count without its sum for an instant (Prometheus tolerates that).
 *
 * Thread-safety: the writer is single-threaded; srv_hist_observe by the owner thread only,
 * srv_hist_read from any thread.
 */
#ifndef KVR_SRV_PROM_H
#define KVR_SRV_PROM_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "kvr/buf.h"

#define SRV_HIST_MAX 24 /* finite buckets at most; one more for +Inf */

struct srv_hist_spec {
    size_t n;                     /* finite buckets (<= SRV_HIST_MAX) */
    uint64_t bound[SRV_HIST_MAX]; /* inclusive upper bounds, native units, increasing */
    double scale;                 /* native unit -> exported unit */
};

struct srv_hist {
    _Atomic uint64_t count[SRV_HIST_MAX + 1]; /* per bucket (not cumulative); [n] = +Inf */
    _Atomic uint64_t sum;                     /* native units */
};

/* A plain snapshot, summed over threads. */
struct srv_hist_snap {
    uint64_t count[SRV_HIST_MAX + 1];
    uint64_t sum;
};

/* Adds v to the bucket of the first bound >= v (owner thread only). */
void srv_hist_observe(struct srv_hist *h, const struct srv_hist_spec *spec, uint64_t v);
/* Adds h's counts into *s (any thread). */
void srv_hist_read(const struct srv_hist *h, struct srv_hist_snap *s);

/* Single-writer counter increment: a relaxed load + store, cheaper than an atomic RMW; only the
 * owning thread may add. */
static inline void srv_stat_add(_Atomic uint64_t *c, uint64_t n)
{
    atomic_store_explicit(c, atomic_load_explicit(c, memory_order_relaxed) + n,
                          memory_order_relaxed);
}

/* Multi-writer counter increment (shared counters). */
static inline void srv_stat_add_shared(_Atomic uint64_t *c, uint64_t n)
{
    atomic_fetch_add_explicit(c, n, memory_order_relaxed);
}

static inline uint64_t srv_stat_get(const _Atomic uint64_t *c)
{
    return atomic_load_explicit(c, memory_order_relaxed);
}

struct srv_prom_label {
    const char *name;  /* label name (trusted, [a-z_]) */
    const char *value; /* any text; escaped on output */
};

struct srv_prom {
    struct kvr_buf *b; /* output (borrowed) */
    int err;           /* KVR_ENOMEM after the first failure */
};

void srv_prom_init(struct srv_prom *p, struct kvr_buf *b);

/* "# HELP name help\n# TYPE name type\n" (type: counter, gauge, histogram). */
void srv_prom_header(struct srv_prom *p, const char *name, const char *type, const char *help);

/* One sample: name{labels} value. */
void srv_prom_u64(struct srv_prom *p, const char *name, const struct srv_prom_label *l, size_t nl,
                  uint64_t v);
void srv_prom_dbl(struct srv_prom *p, const char *name, const struct srv_prom_label *l, size_t nl,
                  double v);

/* A family of one unlabelled sample: header and value (counter or gauge). */
void srv_prom_counter(struct srv_prom *p, const char *name, const char *help, uint64_t v);
void srv_prom_gauge(struct srv_prom *p, const char *name, const char *help, uint64_t v);

/* The samples of one histogram: name_bucket{labels,le="..."} (cumulative, ending with +Inf),
 * name_sum, name_count. */
void srv_prom_hist(struct srv_prom *p, const char *name, const struct srv_prom_label *l, size_t nl,
                   const struct srv_hist_spec *spec, const struct srv_hist_snap *s);

/* Escapes a label value into out (cap bytes, NUL-terminated, cut if needed); returns out. */
const char *srv_prom_escape(const char *s, char *out, size_t cap);

#endif
