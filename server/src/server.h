/* server.h - the router process: threads, connections, requests and the server struct.
 *
 *   main ──▶ srv_new ──▶ srv_start ─┬─▶ HTTP thread 0 ─ event_base ─ evhttp ─ listen fd 0 ┐ same
 *      (sigwait)                    ├─▶ HTTP thread 1 ─ event_base ─ evhttp ─ listen fd 1 ┘ port
 *                                   ├─▶ control thread ─ health checks, snapshots, expiry,
 *                                   │                    admin jobs, policy reloads
 *                                   └─▶ ZMQ subscriber threads (one per model with endpoints)
 *
 * HTTP threads (memcached's worker threads): each owns an event_base created with
 * EVENT_BASE_FLAG_NOLOCK, an evhttp on its own SO_REUSEPORT socket (the kernel spreads
 * connections), scratch buffers, upstream connection pools and per-thread stats. A request is
 * served entirely on the thread that accepted it; other threads reach a thread only through its
 * message queue (mq.h: mutex + eventfd). Nothing blocking runs on these loops: file I/O,
 * snapshot writes, health checks and policy validation run on the control thread, whose answer
 * comes back through the requesting thread's queue.
 *
 * Connections: every accepted connection gets a srv_conn record (created from evhttp's
 * bufferevent hook, so it exists before any byte is read) whose close callback keeps the
 * connection count exact (the listener pauses at the cap) and tells an in-flight request that
 * its client left (srv_conn_watch), so a proxied stream can free its worker and its load.
 *
 * Requests: handlers receive a struct srv_hreq and end it with exactly one srv_reply* call (or
 * srv_hreq_gone when the client left). Those calls record the route/status/latency metrics.
 *
 * No globals: everything hangs off struct srv, passed to every callback.
 */
#ifndef KVR_SRV_SERVER_H
#define KVR_SRV_SERVER_H

#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "config.h"
#include "jsonr.h"
#include "kvr/buf.h"
#include "kvr/match.h"
#include "log.h"
#include "models.h"
#include "mq.h"
#include "stats.h"
#include "workers.h"

struct event_base;
struct event;
struct evhttp;
struct evhttp_request;
struct evhttp_connection;
struct evhttp_bound_socket;
struct evdns_base;
struct evbuffer;
struct evbuffer_cb_entry;
struct bufferevent;
struct srv;
struct srv_thread;
struct srv_control;
struct srv_policy_rt;
struct srv_replica;
struct srv_nats_events;
struct boot;
struct srv_pool;

/* ==== connections ============================================================================= */

/* Someone interested in the client of a request going away (set by async handlers). `gone` runs
 * inside libevent's close handling: it must finish the request with srv_hreq_gone and release
 * what it holds, without touching the connection. */
struct srv_conn_watch {
    void (*gone)(struct srv_conn_watch *w);
    /* optional: the stream's queued output reached the client (srv_reply_chunk's flush) */
    void (*drained)(struct srv_conn_watch *w);
};

struct srv_conn {
    struct evhttp_connection *evcon; /* borrowed (libevent owns it) */
    struct srv_thread *t;
    struct srv_conn_watch *watch;     /* the request in flight that wants to know, or NULL */
    struct srv_conn *hnext;           /* hash chain / free list */
    struct evhttp_request *abort_req; /* a cut stream waiting for its output to flush */
    /* request-read deadline (http.c): armed at a request's first byte (--header-timeout), again
     * at the end of its headers (--body-timeout), cleared at dispatch */
    struct event *ev_deadline;       /* owned by the record (reused with it) */
    struct evbuffer_cb_entry *in_cb; /* watches the connection's input buffer */
    int rstate;                      /* idle, headers, body, dispatched (http.c) */
    int eol;                         /* header-end scanner: a line just ended */
};

/* ==== requests ================================================================================ */

struct srv_hreq {
    struct srv_thread *t;
    struct evhttp_request *req; /* NULL once finished or gone */
    struct srv_conn *conn;      /* the client connection's record (may be NULL) */
    uint64_t t0_ns;             /* arrival */
    int route;                  /* enum srv_route */
    int method;                 /* enum evhttp_cmd_type */
    int status;                 /* status sent (streams: at start) */
    int started;                /* a streamed reply has started */
    const char *path;           /* decoded path (borrowed from req) */
    const char *query;          /* raw query string or NULL (borrowed from req) */
};

/* ==== threads ================================================================================= */

/* A context that outlives its handler (proxy, tokenize, admin job): killed at shutdown. */
struct srv_live {
    struct srv_live *prev, *next;
    void (*kill)(struct srv_live *l); /* release everything; the request may be dropped */
};

struct srv_thread {
    struct srv *srv;
    uint32_t idx;
    char name[8]; /* "w0", "w1", ... (logs) */
    pthread_t tid;
    int started;
    struct event_base *base;
    struct evhttp *http;
    struct evhttp_bound_socket *bound;
    int listen_fd;
    struct evdns_base *dns;
    struct srv_mq mq;
    struct event *ev_tick;    /* 1 s housekeeping */
    struct event *ev_fresh;   /* registers connections accepted this loop turn */
    struct event *ev_grace;   /* shutdown deadline */
    struct event *ev_abort;   /* closes connections whose cut stream has flushed */
    struct srv_conn **aborts; /* connections to close on ev_abort */
    size_t n_aborts, cap_aborts;

    /* connections */
    struct srv_conn **ctab; /* hash: evcon -> record */
    size_t ctab_mask;
    struct srv_conn *cfree;     /* free records */
    struct bufferevent **fresh; /* accepted, not yet registered */
    size_t n_fresh, cap_fresh;
    _Atomic uint64_t n_conns; /* open connections (gauge) */
    uint64_t max_conns;       /* this thread's share of the cap */
    int accept_paused;
    int draining;

    _Atomic uint64_t inflight; /* requests not yet answered */
    struct srv_live live;      /* list head of long-lived contexts */

    struct srv_tstats st;

    /* scratch, reused by every request of this thread */
    struct kvr_buf out;
    struct evbuffer *evout;
    struct srv_jdoc jdoc;
    uint64_t *locals;
    uint64_t *seqs;
    uint32_t *tokens;
    size_t cap_blocks; /* capacity of locals/seqs */
    size_t cap_tokens;
    struct kvr_match *matches;
    size_t cap_matches;

    /* upstream connection pools (upstream.c) */
    struct srv_pool **pools;
    size_t n_pools, cap_pools;

    uint64_t rng; /* xorshift state (jitter) */
    struct srv_ratelimit rl_warn;
    void *policy_vm;             /* per-thread policy state (policy.c) */
    _Atomic unsigned kv_hooks;   /* KV-event hooks its policies define (1 << kind bits) */
    _Atomic uint32_t kv_pending; /* event batches queued to it for those hooks */
};

/* ==== snapshot status ========================================================================= */

struct srv_snapstat {
    pthread_mutex_t mu;
    uint64_t count;           /* snapshots written */
    uint64_t failures;        /* failed writes */
    uint64_t last_unix_ms;    /* last success (wall clock) */
    uint64_t last_ms;         /* duration of the last write */
    uint64_t last_bytes;      /* size of the last file */
    uint64_t restored_events; /* events replayed at start */
    char last_error[256];
};

/* ==== the server ============================================================================== */

struct srv {
    const struct srv_config *cfg; /* borrowed, outlives the server */
    struct srv_logger *log;       /* borrowed */
    struct srv_models models;
    struct srv_workers workers;
    struct srv_thread *threads; /* [n_threads] */
    uint32_t n_threads;
    uint16_t port; /* the bound port */
    struct srv_control *ctl;
    struct srv_policy_rt *policy;
    uint64_t start_ms;
    _Atomic int ready;    /* every thread serves */
    _Atomic int draining; /* shutdown in progress */
    struct srv_snapstat snap;
    struct srv_replica *replica;         /* booked-load sync over NATS (replica.h) or NULL */
    struct srv_nats_events *nats_events; /* KV events from NATS subjects (nats_events.h) */
    struct boot *boot;                   /* bootstrap thread (peer.h) or NULL; main thread only */
    _Atomic int bootstrapping;           /* 1 until the bootstrap from peers is done (/readyz) */
    _Atomic uint64_t boot_events;        /* events applied from a peer's dump at start */
};

/* Creates the server: models and workers from cfg, the policy runtime, the snapshot restore.
 * Nothing listens yet. Returns KVR_OK or an error with err set. */
int srv_new(const struct srv_config *cfg, struct srv_logger *log, struct srv **out, char *err,
            size_t err_len);

/* Binds the listening sockets, starts the control and HTTP threads. */
int srv_start(struct srv *s, char *err, size_t err_len);

/* Graceful stop: stop accepting, let in-flight requests finish (up to the grace period), stop
 * the threads, write the final snapshot. Idempotent. */
void srv_stop(struct srv *s);

/* Reloads policy files (SIGHUP). Asynchronous. */
void srv_reload_policies(struct srv *s);

void srv_free(struct srv *s);

/* ==== HTTP helpers (http.c) =================================================================== */

/* Reason phrase for a status. */
const char *srv_status_text(int status);
/* The HTTP status for a kvr_err code (one table for every handler). */
int srv_status_of(int kvr_err);

/* Ends h with a complete reply (body borrowed, copied). ctype NULL = application/json. */
void srv_reply(struct srv_hreq *h, int status, const char *ctype, const void *body, size_t len);
/* Ends h with the content of body (moved out; headers as already set). */
void srv_reply_evbuf(struct srv_hreq *h, int status, const char *reason, struct evbuffer *body);
/* Ends h with the thread's scratch kvr_buf t->out (JSON). A writer error turns into 503. */
void srv_reply_out(struct srv_hreq *h, int status, int jw_err);
/* Ends h with {"error": "..."}. */
#if defined(__GNUC__)
__attribute__((format(printf, 3, 4)))
#endif
__attribute__((format(printf, 3, 4))) void
srv_reply_error(struct srv_hreq *h, int status, const char *fmt, ...);
/* Same, status from a kvr_err code. */
#if defined(__GNUC__)
__attribute__((format(printf, 3, 4)))
#endif
__attribute__((format(printf, 3, 4))) void
srv_reply_kvr(struct srv_hreq *h, int kvr_err, const char *fmt, ...);
/* Adds a response header (before the reply). */
void srv_reply_header(struct srv_hreq *h, const char *name, const char *value);

/* Streaming: start (headers), chunks (data moved out of buf), end. */
void srv_reply_start(struct srv_hreq *h, int status, const char *reason);
void srv_reply_chunk(struct srv_hreq *h, struct evbuffer *buf);
/* Bytes of h's reply still queued for the client (0 when none or gone). */
size_t srv_reply_pending(struct srv_hreq *h);
void srv_reply_end(struct srv_hreq *h);
/* Cuts a started stream: closes the client connection without the final chunk, so the client
 * sees an error rather than a clean end. */
void srv_reply_abort(struct srv_hreq *h);

/* Finishes a request whose client went away (from a srv_conn_watch): frees libevent's detached
 * request if it is ours, counts status 499. */
void srv_hreq_gone(struct srv_hreq *h);

/* Request body (contiguous, borrowed until the reply). */
const char *srv_body(struct srv_hreq *h, size_t *len);
/* Request header or NULL. */
const char *srv_header(struct srv_hreq *h, const char *name);
/* Query parameter copied into out (decoded); 1 if present, 0 if not. */
int srv_query_param(struct srv_hreq *h, const char *name, char *out, size_t cap);

/* Admin gate: 1 if the request may use admin routes; otherwise replies 401/403 and returns 0. */
int srv_admin_allowed(struct srv_hreq *h);

/* Registers a long-lived context on the thread (killed at shutdown) / unregisters it. */
void srv_live_add(struct srv_thread *t, struct srv_live *l);
void srv_live_del(struct srv_live *l);

/* Starts watching h's client connection (w->gone on disconnect) / stops. */
void srv_watch(struct srv_hreq *h, struct srv_conn_watch *w);
void srv_unwatch(struct srv_hreq *h);

/* Grows the thread's block scratch to hold n hashes. KVR_OK or KVR_ENOMEM. */
int srv_scratch_blocks(struct srv_thread *t, size_t n);
int srv_scratch_tokens(struct srv_thread *t, size_t n);
int srv_scratch_matches(struct srv_thread *t, size_t n);

/* Uniform random in [0, 1) from the thread's generator. */
double srv_thread_uniform(struct srv_thread *t);

/* The request dispatcher (http.c), installed as evhttp's generic callback. */
void srv_http_dispatch(struct evhttp_request *req, void *arg);

/* Connection tracking hooks (http.c), installed by thread.c. */
struct bufferevent *srv_http_bevcb(struct event_base *base, void *arg);
void srv_http_register_fresh(struct srv_thread *t);
void srv_http_conn_table_free(struct srv_thread *t);
void srv_http_run_aborts(struct srv_thread *t);
/* Draining with nothing in flight: leaves the loop once every reply has left the buffers. */
void srv_http_exit_when_flushed(struct srv_thread *t);

#endif
