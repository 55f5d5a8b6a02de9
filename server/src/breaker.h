/* breaker.h - per-worker circuit breaker and active-health thresholds (pure state machines).
 *
 * Circuit breaker (consecutive-failure model, as SMG's; spec/http-api.md §6):
 *
 *            failures >= cfg.failures                 open_ms elapsed
 *   CLOSED ──────────────────────────▶ OPEN ─────────────────────────────▶ HALF_OPEN
 *     ▲                                 ▲                                   │  │
 *     │        successes >= cfg.successes│ any failure                       │  │
 *     └──────────────────────────────────┼───────────────────────────────────┘  │
 *                                        └──────────────────────────────────────┘
 *
 *  - a failure is a connection error, a timeout or a 5xx from the worker; 429 is NOT a failure
 *    (the worker is alive and shedding load) and neither is a 4xx;
 *  - CLOSED: a success resets the failure count;
 *  - OPEN: the worker gets no traffic until open_ms has passed, then the breaker is HALF_OPEN;
 *  - HALF_OPEN: at most cfg.probes requests are in flight at a time (srv_breaker_acquire hands
 *    out the slots); cfg.successes successes close it, one failure re-opens it (timer restarts);
 *  - results that arrive for requests sent before the breaker opened are ignored while it is
 *    OPEN (they say nothing about the worker now).
 * cfg.failures == 0 disables the breaker (always CLOSED).
 *
 * Health thresholds (active checks, SMG-style): a HEALTHY worker becomes UNHEALTHY after
 * cfg.fails consecutive failed checks; an UNHEALTHY one recovers after cfg.passes consecutive
 * successes. Workers start HEALTHY so a fresh registration takes traffic at once.
 *
 * Time is always passed in (milliseconds, monotonic), so tests are deterministic.
 * Thread-safety: none; the caller serialises access (workers.c holds the worker's mutex).
 */
#ifndef KVR_SRV_BREAKER_H
#define KVR_SRV_BREAKER_H

#include <stdint.h>

enum srv_breaker_state {
    SRV_BRK_CLOSED = 0,
    SRV_BRK_HALF_OPEN = 1,
    SRV_BRK_OPEN = 2,
};

struct srv_breaker_cfg {
    uint32_t failures;  /* consecutive failures that open it; 0 = breaker disabled */
    uint32_t successes; /* successes in HALF_OPEN that close it (>= 1) */
    uint32_t probes;    /* concurrent requests allowed in HALF_OPEN (>= 1) */
    uint32_t pad_;
    uint64_t open_ms; /* time OPEN before a probe is allowed */
};

struct srv_breaker {
    int state;            /* enum srv_breaker_state */
    uint32_t consec_fail; /* CLOSED: consecutive failures */
    uint32_t half_ok;     /* HALF_OPEN: successes so far */
    uint32_t probes_out;  /* HALF_OPEN: probes in flight */
    uint64_t opened_ms;   /* when it last opened */
    uint64_t opens;       /* times it opened (metrics) */
};

/* A closed breaker. */
void srv_breaker_init(struct srv_breaker *b);

/* Current state at now_ms, moving OPEN to HALF_OPEN when open_ms has passed. */
int srv_breaker_state(struct srv_breaker *b, const struct srv_breaker_cfg *cfg, uint64_t now_ms);

/* 1 if a request may be sent now (CLOSED, or HALF_OPEN with a free probe slot), else 0.
 * Does not take a slot: for candidate filtering. */
int srv_breaker_available(struct srv_breaker *b, const struct srv_breaker_cfg *cfg,
                          uint64_t now_ms);

/* Takes permission for one request: returns 1 (and in HALF_OPEN takes a probe slot, reported
 * back through *probe = 1) or 0 when the worker must not be used now. */
int srv_breaker_acquire(struct srv_breaker *b, const struct srv_breaker_cfg *cfg, uint64_t now_ms,
                        int *probe);

/* Reports the outcome of a request sent after srv_breaker_acquire: ok = 1 success, 0 failure;
 * probe = the value acquire returned. Returns 1 if the state changed. */
int srv_breaker_report(struct srv_breaker *b, const struct srv_breaker_cfg *cfg, int ok, int probe,
                       uint64_t now_ms);

/* Static name: "closed", "half_open", "open". */
const char *srv_breaker_state_name(int state);

enum srv_health_state {
    SRV_HEALTH_HEALTHY = 0,
    SRV_HEALTH_UNHEALTHY = 1,
};

struct srv_health_cfg {
    uint32_t fails;  /* consecutive failed checks that mark a worker unhealthy (>= 1) */
    uint32_t passes; /* consecutive passed checks that mark it healthy again (>= 1) */
};

struct srv_health {
    int state;            /* enum srv_health_state */
    uint32_t consec_fail; /* consecutive failed checks */
    uint32_t consec_ok;   /* consecutive passed checks */
    uint32_t pad_;
    uint64_t checks; /* checks so far */
    uint64_t failed; /* failed checks so far */
};

void srv_health_init(struct srv_health *h);
/* Records one check result; returns 1 if the state changed. */
int srv_health_report(struct srv_health *h, const struct srv_health_cfg *cfg, int ok);
/* Static name: "healthy", "unhealthy". */
const char *srv_health_state_name(int state);

#endif
