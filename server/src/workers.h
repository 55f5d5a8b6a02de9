/* workers.h - the registry of inference workers: identity, ranks, URL, labels, health and the
 * circuit breaker; the candidate list every routing decision starts from.
 *
 *   srv_workers (rwlock)
 *    └─ srv_worker  model "llama:default", id 7, url http://10.0.0.5:8000, labels "zone=a"
 *         ├─ ranks: [0: zmq tcp://10.0.0.5:5557 (source 3)], [1: zmq tcp://10.0.0.5:5558 (4)]
 *         ├─ health (active checks, control thread)   ─┐ both under the worker's mutex;
 *         ├─ breaker (request outcomes, any thread)   ─┘ their states cached in atomics
 *         └─ counters (atomics): decisions, ok, failed, retries, in flight
 *
 * Identity: a worker is (model, instance id); ranks are its data-parallel ranks (each a routing
 * candidate and, with an endpoint, a KV-event source). /register adds one rank at a time,
 * /v1/workers adds a worker with ranks 0..dp_size-1.
 *
 * Lifetime: routing reads candidates under the read lock and keeps plain pointers for the
 * microseconds of one decision; anything that holds a worker longer (an in-flight proxy, a
 * connection pool, the health checker) takes a reference (srv_worker_ref/unref). Removal unlinks
 * the worker and parks it in a graveyard; srv_workers_sweep frees graveyard entries that have no
 * reference and were removed more than SRV_GRAVE_MS ago (far longer than any decision), so no
 * plain pointer can dangle.
 *
 * Thread-safety: all functions are thread-safe.
 */
#ifndef KVR_SRV_WORKERS_H
#define KVR_SRV_WORKERS_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "breaker.h"
#include "kvr/buf.h"

struct srv_model;

#define SRV_GRAVE_MS 30000
#define SRV_MAX_RANKS 1024

struct srv_wrank {
    uint32_t rank;   /* dp rank */
    uint32_t sub_id; /* KV-event source id, valid iff subscribed */
    int subscribed;  /* 1 if a ZMQ source feeds the index for this rank */
    int pad_;
    char *zmq;    /* endpoint (owned) or NULL */
    char *replay; /* replay endpoint (owned) or NULL */
};

struct srv_worker {
    _Atomic uint32_t refs;   /* registry + holders */
    _Atomic int removed;     /* unlinked from the registry */
    struct srv_model *model; /* borrowed (models live forever) */
    uint64_t id;             /* instance id */
    uint64_t gen;            /* unique per registration (pools key on it) */
    char *url;               /* base URL (owned) or NULL */
    char host[256];          /* from url */
    char hostport[300];      /* Host header value */
    char prefix[256];        /* path prefix from url ("" or "/v2") */
    uint16_t port;           /* from url */
    uint16_t pad_;
    uint32_t dp_size;        /* declared ranks */
    char *labels;            /* "k=v,k=v" (owned) or NULL */
    struct srv_wrank *ranks; /* under the registry lock */
    size_t n_ranks;
    uint64_t created_ms;
    uint64_t removed_ms;

    pthread_mutex_t mu; /* guards health and breaker */
    struct srv_health health;
    struct srv_breaker breaker;
    _Atomic int health_state;       /* cached enum srv_health_state */
    _Atomic int breaker_state;      /* cached enum srv_breaker_state (OPEN may be stale) */
    _Atomic uint64_t open_until_ms; /* when an OPEN breaker may probe */

    _Atomic uint64_t decisions; /* times chosen by a policy */
    _Atomic uint64_t ok;        /* proxied requests that succeeded */
    _Atomic uint64_t failed;    /* proxied attempts that failed (connect, 5xx, timeout) */
    _Atomic uint64_t retried;   /* attempts retried elsewhere after failing here */
    _Atomic uint64_t in_flight; /* proxied requests in progress */
    _Atomic uint64_t hc_ok;     /* health checks passed */
    _Atomic uint64_t hc_failed; /* health checks failed */
};

struct srv_workers {
    pthread_rwlock_t lock;
    struct srv_worker **v; /* live workers */
    size_t n, cap;
    struct srv_worker **grave; /* removed, waiting for the sweep */
    size_t n_grave, cap_grave;
    _Atomic uint64_t version; /* bumped on every add/remove */
    uint64_t next_gen;
    struct srv_breaker_cfg brk; /* breaker settings */
    struct srv_health_cfg hcfg; /* health thresholds */
};

int srv_workers_init(struct srv_workers *ws, const struct srv_breaker_cfg *brk,
                     const struct srv_health_cfg *hcfg);
/* Frees every worker (live and graveyard) regardless of references (shutdown). */
void srv_workers_free(struct srv_workers *ws);

void srv_worker_ref(struct srv_worker *w);
void srv_worker_unref(struct srv_worker *w);

/* What to register. Strings are borrowed (copied). */
struct srv_worker_spec {
    uint64_t id;
    const char *url;    /* or NULL */
    const char *labels; /* or NULL */
    uint32_t dp_size;   /* declared ranks (>= 1) */
    uint32_t n_ranks;   /* ranks to add */
    const uint32_t *ranks;
    const char *const *zmq;    /* per rank, or NULL entries (array may be NULL) */
    const char *const *replay; /* per rank, or NULL */
    const uint32_t *sub_ids;   /* per rank, valid where subscribed[k] */
    const int *subscribed;     /* per rank (may be NULL: none) */
    int merge;                 /* 1: add ranks to an existing worker (/register); 0: the worker
                                  must not exist (/v1/workers) */
};

/* Registers (or, with merge, extends) a worker of model m. *out (may be NULL) receives it, with
 * a reference the caller must drop. KVR_OK; KVR_EEXIST (the worker exists without merge, or a
 * rank already exists; err says which); KVR_EINVAL (bad URL); KVR_ENOMEM. */
int srv_workers_register(struct srv_workers *ws, struct srv_model *m,
                         const struct srv_worker_spec *spec, struct srv_worker **out, char *err,
                         size_t err_len);

/* KV-event sources that a removal released (for the caller to unsubscribe). */
struct srv_removed {
    struct srv_model *model;
    uint64_t id;
    int whole; /* 1 if the whole worker went away */
    size_t n;  /* sources */
    uint32_t sub_ids[SRV_MAX_RANKS];
};

/* Removes rank `dp_rank` (or every rank when dp_rank < 0) of worker id in model m. The worker
 * disappears with its last rank. KVR_OK or KVR_ENOTFOUND. */
int srv_workers_remove(struct srv_workers *ws, struct srv_model *m, uint64_t id, int64_t dp_rank,
                       struct srv_removed *out);

/* Looks a worker up by (model, id): returns it with a reference, or NULL. m NULL matches any
 * model (first found). */
struct srv_worker *srv_workers_get(struct srv_workers *ws, struct srv_model *m, uint64_t id);

/* A routing candidate: a worker rank (plain pointer, valid for one decision). */
struct srv_cand {
    struct srv_worker *w;
    uint32_t dp_rank;
    int eligible; /* healthy and the breaker lets requests through */
};

/* Writes the candidates (every rank of every live worker of m) into out[0..cap) and returns
 * how many there are (which may exceed cap). */
size_t srv_workers_candidates(struct srv_workers *ws, struct srv_model *m, uint64_t now_ms,
                              struct srv_cand *out, size_t cap);

/* Breaker gate for one request to w: 1 (go; *probe says whether it holds a half-open slot) or 0.
 * srv_worker_report must follow every 1. */
int srv_worker_acquire(struct srv_workers *ws, struct srv_worker *w, uint64_t now_ms, int *probe);
/* Outcome of a request after srv_worker_acquire. ok: 1 success, 0 failure, -1 neutral (the
 * attempt was abandoned, e.g. the client left: only the probe slot is returned). */
void srv_worker_report(struct srv_workers *ws, struct srv_worker *w, int ok, int probe,
                       uint64_t now_ms);
/* Records an active health-check result; returns 1 if the health state changed. */
int srv_worker_health_report(struct srv_workers *ws, struct srv_worker *w, int ok);

/* Calls fn for every live worker under the read lock (fn must not call back into the
 * registry's write paths). */
void srv_workers_foreach(struct srv_workers *ws, void (*fn)(void *ctx, struct srv_worker *w),
                         void *ctx);

/* Frees graveyard workers without references removed at least SRV_GRAVE_MS before now_ms.
 * Returns the number freed. */
size_t srv_workers_sweep(struct srv_workers *ws, uint64_t now_ms);

/* Parses "http://host[:port][/prefix]" into w's host, port, hostport and prefix. 0 or -1. */
int srv_worker_parse_url(const char *url, char *host, size_t host_cap, uint16_t *port, char *prefix,
                         size_t prefix_cap);

#endif
