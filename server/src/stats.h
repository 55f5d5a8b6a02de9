/* stats.h - per-thread counters and histograms, summed at scrape time (metrics.c).
 *
 * Each HTTP thread owns one struct srv_tstats and is its only writer (srv_stat_add: relaxed load
 * + store, no atomic read-modify-write on the hot path); /metrics, served by any thread, reads
 * every thread's struct with relaxed loads. Counters shared by several writers (per worker, per
 * model) live next to their object and use srv_stat_add_shared.
 */
#ifndef KVR_SRV_STATS_H
#define KVR_SRV_STATS_H

#include <stdint.h>

#include "prom.h"

/* Routes, the `route` label of the HTTP metrics. */
enum srv_route {
    SRV_R_REGISTER = 0,
    SRV_R_UNREGISTER,
    SRV_R_WORKERS, /* GET /workers */
    SRV_R_QUERY,
    SRV_R_QUERY_BY_HASH,
    SRV_R_DUMP,
    SRV_R_EVENTS,   /* POST /v1/events */
    SRV_R_ROUTE,    /* POST /v1/route */
    SRV_R_ROUTE_ID, /* /v1/route/{id}[/...] */
    SRV_R_COMPLETIONS,
    SRV_R_CHAT,
    SRV_R_MODELS,
    SRV_R_V1_WORKERS, /* /v1/workers[/{id}] */
    SRV_R_ADMIN,
    SRV_R_METRICS,
    SRV_R_HEALTHZ,
    SRV_R_READYZ,
    SRV_R_OTHER, /* unknown paths (404) */
    SRV_R_COUNT_
};

/* HTTP statuses tracked individually; anything else counts as "other". 499 = client gone. */
#define SRV_NCODES 21
int srv_code_index(int status);
/* The status of a code index ("other" for the last). */
const char *srv_code_name(int idx);
const char *srv_route_name(int route);

/* Upstream (worker) failure kinds. */
enum srv_uperr {
    SRV_UPERR_CONNECT = 0, /* connection refused / reset before a response */
    SRV_UPERR_TIMEOUT,     /* connect or read timeout */
    SRV_UPERR_STATUS_5XX,  /* 5xx before the first byte */
    SRV_UPERR_STATUS_429,  /* 429 before the first byte */
    SRV_UPERR_MIDSTREAM,   /* the worker failed after bytes reached the client */
    SRV_UPERR_COUNT_
};
const char *srv_uperr_name(int kind);

struct srv_tstats {
    _Atomic uint64_t req[SRV_R_COUNT_][SRV_NCODES]; /* answered requests */
    struct srv_hist lat[SRV_R_COUNT_];              /* request latency, µs */
    struct srv_hist overlap;                        /* routed: overlap blocks */
    struct srv_hist hit_ratio;                      /* routed: overlap / request blocks, ‰ */
    struct srv_hist ttft;                           /* proxied: time to first byte, µs */
    struct srv_hist upstream;                       /* proxied: total upstream time, µs */
    struct srv_hist decision;                       /* routing decision time, µs */
    _Atomic uint64_t conns_accepted;
    _Atomic uint64_t conns_closed;
    _Atomic uint64_t accept_pauses; /* times the listener paused at the connection cap */
    _Atomic uint64_t slow_clients;  /* connections cut by the header/body deadline (408) */
    _Atomic uint64_t route_decisions;
    _Atomic uint64_t route_no_worker; /* no eligible candidate */
    _Atomic uint64_t route_degraded;  /* every candidate ineligible: routed anyway? (no: 503) */
    _Atomic uint64_t approx_recorded; /* approx-mode recordings */
    _Atomic uint64_t policy_calls;
    _Atomic uint64_t policy_fallbacks; /* decisions made by the built-in fallback */
    _Atomic uint64_t policy_errors;
    _Atomic uint64_t policy_timeouts;
    _Atomic uint64_t proxy_attempts;
    _Atomic uint64_t proxy_retries;
    _Atomic uint64_t proxy_streams;     /* responses streamed through */
    _Atomic uint64_t proxy_client_gone; /* clients that left before the end */
    _Atomic uint64_t proxy_pauses;      /* worker reads paused for a slow client */
    _Atomic uint64_t upstream_errors[SRV_UPERR_COUNT_];
    _Atomic uint64_t tokenize_worker_ok;
    _Atomic uint64_t tokenize_worker_failed;
    _Atomic uint64_t tokenize_bytes;
    _Atomic uint64_t events_applied; /* POST /v1/events */
    _Atomic uint64_t events_rejected;
    _Atomic uint64_t jobs_events; /* large /v1/events bodies handed to the control thread */
    _Atomic uint64_t jobs_dump;   /* GET /dump built on the control thread */
};

/* Histogram layouts (static tables). */
const struct srv_hist_spec *srv_hist_latency(void); /* µs -> seconds, 25 µs .. 60 s */
const struct srv_hist_spec *srv_hist_blocks(void);  /* blocks, 0 .. 8192 */
const struct srv_hist_spec *srv_hist_ratio(void);   /* ‰ -> ratio, 0 .. 1 */

#endif
