/* kv_subscriber.c - ZMQ subscriber for engine KV events (see kvr/kv_subscriber.h;
 * spec/engine-events.md §1-§3, spec/http-api.md §3). */
#include "kvr/kv_subscriber.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include "kvr/alloc.h"
#include "kvr/err.h"
#include "kvr/hash.h"

#define END_SEQ UINT64_MAX       /* replay end marker: ff x 8 (END_SEQ = -1 signed) */
#define MAX_BURST 256            /* messages read from one socket per poll round */
#define BACKOFF_BASE_MS 10       /* receive-error backoff: 10 ms x 2^min(n, 8) ... */
#define BACKOFF_MAX_MS 5000      /* ... capped at 5 s */
#define MAX_CONVERT_WARN_LOGS 3u /* conversion warnings logged per source */
#define HEARTBEAT_MS 5000        /* default ZMTP heartbeat interval; timeout = 3 intervals */
#define MON_EVENTS (ZMQ_EVENT_CONNECTED | ZMQ_EVENT_ACCEPTED | ZMQ_EVENT_DISCONNECTED)

/* Log-once kinds (bits of source.logged). Decoder error kinds use LOG_DECODE + kind. */
enum {
    LOG_BAD_FRAMES = 0,
    LOG_BAD_SEQ,
    LOG_GAP,
    LOG_LOST,
    LOG_RESTART,
    LOG_SINK,
    LOG_RECV,
    LOG_REPLAY_MALFORMED,
    LOG_REPLAY_FAILED,
    LOG_UNKNOWN_TAG,
    LOG_LOCALITY,
    LOG_CONVERT,
    LOG_MONITOR,
    LOG_DISCONNECT,
    LOG_PROBE_SAME,
    LOG_DECODE, /* + enum kvr_emp_error */
};

/* A live batch queued while a replay is in flight. */
struct pending {
    struct pending *next;
    uint64_t seq;
    int after_break; /* the first live batch received after a disconnect */
    size_t len;
    uint8_t payload[];
};

struct source {
    uint32_t id;
    uint64_t worker_id;
    uint32_t dp_rank;
    char *endpoint;        /* after rank offset */
    char *replay_endpoint; /* after rank offset; NULL = none */
    uint8_t *topic;
    size_t topic_len;
    int bind;
    int clear_on_loss;
    char *lora; /* default LoRA (owned) or NULL */
    struct kvr_convert_opts conv;

    void *sub;    /* SUB socket; NULL while waiting to re-create it */
    void *mon;    /* PAIR receiving the SUB's monitor events; NULL if monitoring failed */
    void *dealer; /* replay DEALER; created on the first gap */

    /* sequence state (the last applied seq is st.last_seq, valid when st.has_seq) */
    int has_next;    /* next is valid (a batch was applied, or a restart reset it to 0) */
    uint64_t next;   /* the seq expected next */
    int has_fp;      /* fp is valid: the fingerprint of last_seq's payload */
    uint64_t fp;     /* XXH3 of the last applied payload (kept with a replay endpoint) */
    int broken;      /* the SUB lost its connection since the last live batch */
    int fresh_clear; /* the rank was cleared and nothing applied since */
    int probing;     /* the replay in flight is a reconnect probe from probe_seq */
    int probe_valid; /* no disconnect since the probe was sent */
    uint64_t probe_seq;
    uint32_t last_rank;   /* dp rank the last batch applied to */
    int replaying;        /* a replay request is outstanding */
    uint64_t replay_from; /* its start seq */
    int64_t replay_deadline;
    int has_no_retry; /* a replay from no_retry_from already ran: count instead */
    uint64_t no_retry_from;
    struct pending *q_head, *q_tail;
    size_t q_len;

    /* errors and logging */
    unsigned consecutive_errors;
    int64_t retry_at; /* when sub == NULL: re-create at this time */
    uint64_t logged;  /* bit per LOG_* kind */
    unsigned convert_logs;

    struct kvr_kvsub_stats st;  /* owned by the thread */
    struct kvr_kvsub_stats pub; /* snapshot under kvr_kvsub.mu */
    int dirty;
};

enum cmd_type { CMD_ADD = 1, CMD_REMOVE, CMD_STOP };

struct cmd {
    struct cmd *next;
    int type;
    const struct kvr_kvsub_source_config *cfg;
    uint32_t id;
    int rc;
    int done;
};

struct kvr_kvsub {
    struct kvr_kvsub_config cfg;
    void *ctx;
    int own_ctx;
    pthread_t thread;
    int thread_started;
    int wake[2]; /* pipe: callers write, the thread polls [0] */

    pthread_mutex_t mu; /* guards cmds, the sources array and every source's `pub` */
    pthread_cond_t cv;
    struct cmd *cmds;

    struct source **src; /* owned by the thread; array changes under mu */
    size_t n_src;
    size_t cap_src;
    uint32_t next_id;
    uint64_t mon_seq; /* monitor endpoint names */

    /* thread-private scratch */
    kvr_alloc_t alloc;
    struct kvr_emp_batch batch;
    struct kvr_event_list events;
};

/* ==== small helpers ========================================================================== */

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static uint64_t load_be64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v = (v << 8) | p[i];
    return v;
}

static void store_be64(uint8_t *p, uint64_t v)
{
    for (int i = 7; i >= 0; i--) {
        p[i] = (uint8_t)v;
        v >>= 8;
    }
}

static char *dup_str(const char *s)
{
    size_t n = strlen(s) + 1;
    char *d = malloc(n);
    if (d != NULL)
        memcpy(d, s, n);
    return d;
}

static void log_line(struct kvr_kvsub *s, int level, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

static void log_line(struct kvr_kvsub *s, int level, const char *fmt, ...)
{
    char line[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof(line), fmt, ap);
    va_end(ap);
    if (s->cfg.log != NULL) {
        s->cfg.log(s->cfg.log_ctx, level, line);
        return;
    }
    static const char *const names[] = {"info", "warn", "error"};
    fprintf(stderr, "kvrouter kv-subscriber %s: %s\n", names[level < 0 || level > 2 ? 2 : level],
            line);
}

/* Logs once per (source, kind). */
#define LOG_ONCE(s, src, kind, level, ...)                                                         \
    do {                                                                                           \
        if (!((src)->logged & (1ull << (kind)))) {                                                 \
            (src)->logged |= 1ull << (kind);                                                       \
            log_line((s), (level), __VA_ARGS__);                                                   \
        }                                                                                          \
    } while (0)

/* ==== endpoints ============================================================================== */

int kvr_kvsub_rank_endpoint(const char *base, uint32_t dp_rank, char *out, size_t cap)
{
    int n;
    if (base == NULL || out == NULL)
        return KVR_EINVAL;
    if (strncmp(base, "tcp://", 6) == 0) {
        const char *colon = strrchr(base + 6, ':');
        if (colon == NULL || colon[1] == '\0')
            return KVR_EINVAL;
        uint64_t port = 0;
        for (const char *p = colon + 1; *p; p++) {
            if (*p < '0' || *p > '9')
                return KVR_EINVAL; /* "*" (ephemeral) cannot be offset */
            port = port * 10 + (uint64_t)(*p - '0');
            if (port > 65535)
                return KVR_EINVAL;
        }
        port += dp_rank;
        if (port > 65535)
            return KVR_EINVAL;
        n = snprintf(out, cap, "%.*s:%" PRIu64, (int)(colon - base), base, port);
    } else if (strncmp(base, "inproc://", 9) == 0 || strncmp(base, "ipc://", 6) == 0) {
        if (dp_rank == 0)
            n = snprintf(out, cap, "%s", base);
        else
            n = snprintf(out, cap, "%s_dp%" PRIu32, base, dp_rank);
    } else {
        return KVR_EINVAL;
    }
    if (n < 0 || (size_t)n >= cap)
        return KVR_ERANGE;
    return KVR_OK;
}

/* ==== sockets ================================================================================ */

static void set_common_opts(struct kvr_kvsub *s, void *sock)
{
    int linger = 0, ivl = 100, ivl_max = BACKOFF_MAX_MS;
    int64_t maxmsg = s->cfg.max_msg_size;
    zmq_setsockopt(sock, ZMQ_LINGER, &linger, sizeof(linger));
    zmq_setsockopt(sock, ZMQ_RECONNECT_IVL, &ivl, sizeof(ivl));
    zmq_setsockopt(sock, ZMQ_RECONNECT_IVL_MAX, &ivl_max, sizeof(ivl_max));
    zmq_setsockopt(sock, ZMQ_MAXMSGSIZE, &maxmsg, sizeof(maxmsg));
}

static int zmq_err_to_kvr(int e)
{
    switch (e) {
    case EINVAL:
    case EPROTONOSUPPORT:
    case ENOCOMPATPROTO:
    case EADDRNOTAVAIL:
    case ENODEV:
        return KVR_EINVAL;
    case EADDRINUSE:
        return KVR_EEXIST;
    case ENOMEM:
        return KVR_ENOMEM;
    default:
        return KVR_EIO;
    }
}

static void close_socket(void **sock)
{
    if (*sock != NULL) {
        zmq_close(*sock);
        *sock = NULL;
    }
}

/* Closes the SUB and its monitor (stopping the monitor first, so no event is left queued). */
static void close_sub(struct source *src)
{
    if (src->sub != NULL && src->mon != NULL)
        zmq_socket_monitor(src->sub, NULL, 0);
    close_socket(&src->mon);
    close_socket(&src->sub);
}

/* Attaches a monitor to `sub` before it connects, so no connection event is missed: libzmq's
 * PAIR is bound at a private inproc name and ours connects to it (inproc connects at once).
 * Without a monitor the source still works; only reconnect detection is lost (logged once). */
static void open_monitor(struct kvr_kvsub *s, struct source *src, void *sub)
{
    char addr[96];
    void *pair = NULL;
    int monitoring = 0;
    snprintf(addr, sizeof(addr), "inproc://kvr-kvsub-mon-%p-%" PRIu64, (void *)s, ++s->mon_seq);
    if (zmq_socket_monitor(sub, addr, MON_EVENTS) == -1)
        goto fail;
    monitoring = 1;
    int linger = 0;
    if ((pair = zmq_socket(s->ctx, ZMQ_PAIR)) == NULL)
        goto fail;
    zmq_setsockopt(pair, ZMQ_LINGER, &linger, sizeof(linger));
    if (zmq_connect(pair, addr) == -1)
        goto fail;
    src->mon = pair;
    return;
fail:
    LOG_ONCE(s, src, LOG_MONITOR, KVR_KVSUB_WARN,
             "worker %" PRIu64 " rank %" PRIu32 ": no socket monitor (%s): reconnects go "
             "unnoticed",
             src->worker_id, src->dp_rank, zmq_strerror(zmq_errno()));
    if (pair != NULL)
        zmq_close(pair);
    if (monitoring)
        zmq_socket_monitor(sub, NULL, 0);
}

static int open_sub(struct kvr_kvsub *s, struct source *src)
{
    void *sock = zmq_socket(s->ctx, ZMQ_SUB);
    if (sock == NULL)
        return zmq_err_to_kvr(zmq_errno());
    set_common_opts(s, sock);
    int hwm = s->cfg.rcvhwm;
    zmq_setsockopt(sock, ZMQ_RCVHWM, &hwm, sizeof(hwm));
    if (s->cfg.heartbeat_ms > 0) {
        int ivl = s->cfg.heartbeat_ms, timeout = ivl * 3;
        zmq_setsockopt(sock, ZMQ_HEARTBEAT_IVL, &ivl, sizeof(ivl));
        zmq_setsockopt(sock, ZMQ_HEARTBEAT_TIMEOUT, &timeout, sizeof(timeout));
    }
    int rc = zmq_setsockopt(sock, ZMQ_SUBSCRIBE, src->topic, src->topic_len);
    if (rc == 0) {
        src->sub = sock;
        open_monitor(s, src, sock);
        rc = src->bind ? zmq_bind(sock, src->endpoint) : zmq_connect(sock, src->endpoint);
    }
    if (rc == -1) {
        int e = zmq_errno();
        if (src->sub == sock)
            close_sub(src);
        else
            zmq_close(sock);
        return zmq_err_to_kvr(e);
    }
    return KVR_OK;
}

static int open_dealer(struct kvr_kvsub *s, struct source *src)
{
    void *sock = zmq_socket(s->ctx, ZMQ_DEALER);
    if (sock == NULL)
        return zmq_err_to_kvr(zmq_errno());
    set_common_opts(s, sock);
    if (zmq_connect(sock, src->replay_endpoint) == -1) {
        int e = zmq_errno();
        zmq_close(sock);
        return zmq_err_to_kvr(e);
    }
    src->dealer = sock;
    return KVR_OK;
}

/* Reads one multipart message without blocking: up to `max` frames are kept in f[] (each
 * initialised; the caller closes them), the rest are read and dropped. *count = frames in total.
 * Returns 1 for a message, 0 when none is waiting, -1 on a receive error (errno-like code in
 * *err). */
static int recv_multipart(void *sock, zmq_msg_t *f, int max, int *count, int *err)
{
    int n = 0;
    for (;;) {
        zmq_msg_t tmp;
        zmq_msg_t *m = n < max ? &f[n] : &tmp;
        zmq_msg_init(m);
        int rc;
        do
            rc = zmq_msg_recv(m, sock, n == 0 ? ZMQ_DONTWAIT : 0);
        while (rc == -1 && zmq_errno() == EINTR);
        if (rc == -1) {
            int e = zmq_errno();
            zmq_msg_close(m);
            for (int k = 0; k < n && k < max; k++)
                zmq_msg_close(&f[k]);
            if (n == 0 && e == EAGAIN)
                return 0;
            *err = e;
            return -1;
        }
        int more = zmq_msg_more(m);
        if (m == &tmp)
            zmq_msg_close(&tmp);
        n++;
        if (!more)
            break;
    }
    *count = n;
    return 1;
}

static void close_frames(zmq_msg_t *f, int n)
{
    for (int k = 0; k < n; k++)
        zmq_msg_close(&f[k]);
}

/* ==== delivery =============================================================================== */

static void deliver(struct kvr_kvsub *s, struct source *src)
{
    struct kvr_event_list *l = &s->events;
    if (l->n == 0)
        return;
    for (size_t k = 0; k < l->n; k++)
        if (l->ev[k].kind >= 1 && l->ev[k].kind <= 3)
            src->st.events[l->ev[k].kind]++;
    if (s->cfg.sink(s->cfg.sink_ctx, l->ev, l->n) != 0) {
        src->st.sink_errors++;
        LOG_ONCE(s, src, LOG_SINK, KVR_KVSUB_WARN,
                 "worker %" PRIu64 " rank %" PRIu32 ": the sink rejected a batch of %zu events",
                 src->worker_id, src->dp_rank, l->n);
    }
    kvr_event_list_reset(l);
}

/* Clears the rank(s) this source feeds (registered rank, and the last batch rank if another). */
static void clear_rank(struct kvr_kvsub *s, struct source *src, uint64_t seq)
{
    uint32_t ranks[2] = {src->dp_rank, src->last_rank};
    int n = src->last_rank != src->dp_rank ? 2 : 1;
    for (int k = 0; k < n; k++) {
        struct kvr_event *e;
        if (kvr_event_list_emplace(&s->events, KVR_EVENT_CLEARED, 0, &e) != KVR_OK)
            break;
        e->worker_id = src->worker_id;
        e->dp_rank = ranks[k];
        e->event_id = seq;
        e->tier = KVR_TIER_DEVICE;
    }
    src->st.clears++;
    src->fresh_clear = 1;
    deliver(s, src);
}

/* The publisher is a new process: its blocks start empty and its seq starts at 0. Clears the
 * rank and expects seq 0 next, so a restart first seen at seq > 0 becomes a gap from 0. */
static void restart(struct kvr_kvsub *s, struct source *src, uint64_t seq, const char *why)
{
    src->st.restarts++;
    LOG_ONCE(s, src, LOG_RESTART, KVR_KVSUB_WARN,
             "worker %" PRIu64 " rank %" PRIu32 ": publisher restart (%s): clearing the rank",
             src->worker_id, src->dp_rank, why);
    clear_rank(s, src, seq);
    src->has_next = 1;
    src->next = 0;
    src->has_fp = 0;
    src->has_no_retry = 0; /* a new stream: its gaps may be replayed afresh */
    src->broken = 0;
}

/* Decodes, converts and delivers one batch; the seq counts as applied whatever happens. */
static void apply(struct kvr_kvsub *s, struct source *src, uint64_t seq, const uint8_t *p,
                  size_t len)
{
    char err[256];
    int kind = 0;
    uint64_t unknown0 = src->st.dec.unknown_tag, dropped0 = src->st.dec.locality_dropped;
    src->has_next = 1;
    src->next = seq + 1;
    src->fresh_clear = 0;
    src->st.has_seq = 1;
    src->st.last_seq = seq;
    /* the fingerprint a reconnect probe compares against (only a replay endpoint can answer) */
    src->has_fp = src->replay_endpoint != NULL;
    if (src->has_fp)
        src->fp = kvr_hash_xxh3(p, len, 0);
    int rc =
        kvr_emp_decode(&s->batch, p, len, &s->cfg.limits, &src->st.dec, &kind, err, sizeof(err));
    if (rc != KVR_OK) {
        src->st.decode_errors++;
        LOG_ONCE(s, src, LOG_DECODE + (unsigned)kind, KVR_KVSUB_WARN,
                 "worker %" PRIu64 " rank %" PRIu32 ": seq %" PRIu64 " malformed batch (%s): %s",
                 src->worker_id, src->dp_rank, seq, kvr_emp_error_name(kind), err);
        return;
    }
    src->st.dialects |= s->batch.dialect;
    if (src->st.dec.unknown_tag != unknown0)
        LOG_ONCE(s, src, LOG_UNKNOWN_TAG, KVR_KVSUB_INFO,
                 "worker %" PRIu64 " rank %" PRIu32 ": skipping events with unknown tags",
                 src->worker_id, src->dp_rank);
    if (src->st.dec.locality_dropped != dropped0)
        LOG_ONCE(s, src, LOG_LOCALITY, KVR_KVSUB_INFO,
                 "worker %" PRIu64 " rank %" PRIu32 ": dropping REMOTE/unknown-locality events",
                 src->worker_id, src->dp_rank);
    struct kvr_convert_opts o = src->conv;
    o.worker_id = src->worker_id;
    o.dp_rank = src->dp_rank;
    o.default_lora = src->lora;
    o.default_lora_len = src->lora != NULL ? (uint32_t)strlen(src->lora) : 0;
    uint64_t warn0 = kvr_convert_warnings(&src->st.conv);
    rc = kvr_convert_batch(&s->batch, seq, &o, &s->events, &src->st.conv);
    if (rc != KVR_OK) {
        src->st.decode_errors++;
        src->st.dec.errors[KVR_EMP_E_NOMEM]++;
        LOG_ONCE(s, src, LOG_DECODE + KVR_EMP_E_NOMEM, KVR_KVSUB_ERROR,
                 "worker %" PRIu64 " rank %" PRIu32 ": seq %" PRIu64 " conversion failed: %s",
                 src->worker_id, src->dp_rank, seq, kvr_strerror(rc));
        kvr_event_list_reset(&s->events);
        return;
    }
    if (kvr_convert_warnings(&src->st.conv) != warn0 && src->convert_logs < MAX_CONVERT_WARN_LOGS) {
        src->convert_logs++;
        log_line(s, KVR_KVSUB_WARN,
                 "worker %" PRIu64 " rank %" PRIu32 ": seq %" PRIu64
                 " store cut short (block size mismatch %" PRIu64 ", short tokens %" PRIu64
                 ", bad mm %" PRIu64 "; index block size %" PRIu32 ")",
                 src->worker_id, src->dp_rank, seq, src->st.conv.block_size_mismatch,
                 src->st.conv.short_tokens, src->st.conv.mm_invalid, src->conv.block_size);
    }
    src->last_rank = s->batch.has_dp_rank ? s->batch.dp_rank : src->dp_rank;
    src->st.batches++;
    deliver(s, src);
}

/* ==== sequence handling ====================================================================== */

enum mode { LIVE, REPLAY, DRAIN };
enum outcome { APPLIED, SKIPPED, DEFERRED };

/* Appends a copy of the batch to the source's queue. */
static int queue_push(struct source *src, uint64_t seq, const uint8_t *p, size_t len,
                      int after_break)
{
    struct pending *q = malloc(sizeof(*q) + len);
    if (q == NULL)
        return KVR_ENOMEM;
    q->next = NULL;
    q->seq = seq;
    q->after_break = after_break;
    q->len = len;
    if (len > 0)
        memcpy(q->payload, p, len);
    if (src->q_tail != NULL)
        src->q_tail->next = q;
    else
        src->q_head = q;
    src->q_tail = q;
    src->q_len++;
    return KVR_OK;
}

static struct pending *queue_pop(struct source *src)
{
    struct pending *q = src->q_head;
    if (q != NULL) {
        src->q_head = q->next;
        if (src->q_head == NULL)
            src->q_tail = NULL;
        src->q_len--;
    }
    return q;
}

static void queue_free(struct source *src)
{
    struct pending *q;
    while ((q = queue_pop(src)) != NULL)
        free(q);
}

/* Continuity is settled (a probe answered): no queued batch needs the after-break check. */
static void queue_forget_breaks(struct source *src)
{
    for (struct pending *q = src->q_head; q != NULL; q = q->next)
        q->after_break = 0;
}

static int start_replay(struct kvr_kvsub *s, struct source *src, uint64_t from)
{
    if (src->dealer == NULL && open_dealer(s, src) != KVR_OK)
        return KVR_EIO;
    uint8_t be[8];
    store_be64(be, from);
    if (zmq_send(src->dealer, "", 0, ZMQ_SNDMORE | ZMQ_DONTWAIT) == -1 ||
        zmq_send(src->dealer, be, 8, ZMQ_DONTWAIT) == -1) {
        close_socket(&src->dealer);
        return KVR_EIO;
    }
    src->replaying = 1;
    src->replay_from = from;
    src->replay_deadline = now_ms() + (int64_t)s->cfg.replay_timeout_ms;
    src->st.replay_requests++;
    return KVR_OK;
}

static enum outcome process(struct kvr_kvsub *s, struct source *src, uint64_t seq, const uint8_t *p,
                            size_t len, enum mode mode)
{
    if (src->has_next && seq < src->next &&
        (mode == REPLAY || (mode == DRAIN && seq >= src->replay_from))) {
        src->st.replay_duplicates++; /* the replay already delivered it (or vice versa) */
        return SKIPPED;
    }
    if (mode != REPLAY && src->broken) {
        /* the first live batch since the connection dropped: only `next` continues the stream */
        src->broken = 0;
        if (src->has_next && seq != src->next)
            restart(s, src, seq,
                    seq < src->next ? "seq went back after a reconnect"
                                    : "seq jumped ahead after a reconnect");
    }
    if (src->has_next && seq < src->next) {
        /* the publisher restarted (its seq starts at 0 per process): its old blocks are gone */
        restart(s, src, seq, "seq went back");
    }
    if (src->has_next && seq > src->next) {
        uint64_t from = src->next, missing = seq - from;
        int retry_blocked = src->has_no_retry && src->no_retry_from == from;
        if (mode != REPLAY && src->replay_endpoint != NULL && !retry_blocked) {
            src->st.gaps++;
            LOG_ONCE(s, src, LOG_GAP, KVR_KVSUB_INFO,
                     "worker %" PRIu64 " rank %" PRIu32 ": gap before seq %" PRIu64
                     ", replaying from %" PRIu64,
                     src->worker_id, src->dp_rank, seq, from);
            if (start_replay(s, src, from) == KVR_OK)
                return DEFERRED;
            LOG_ONCE(s, src, LOG_REPLAY_FAILED, KVR_KVSUB_WARN,
                     "worker %" PRIu64 " rank %" PRIu32 ": cannot send a replay request to %s",
                     src->worker_id, src->dp_rank, src->replay_endpoint);
        } else if (mode != REPLAY && !retry_blocked) {
            src->st.gaps++;
        }
        src->st.lost_batches += missing;
        LOG_ONCE(s, src, LOG_LOST, KVR_KVSUB_WARN,
                 "worker %" PRIu64 " rank %" PRIu32 ": %" PRIu64
                 " batches lost before seq %" PRIu64,
                 src->worker_id, src->dp_rank, missing, seq);
        if (src->clear_on_loss && !src->fresh_clear)
            clear_rank(s, src, seq);
    }
    apply(s, src, seq, p, len);
    return APPLIED;
}

/* Ends the replay in flight and applies what queued up meanwhile (which may start another). */
static void finish_replay(struct kvr_kvsub *s, struct source *src, int failed)
{
    src->replaying = 0;
    src->probing = 0;
    /* whatever the replay delivered, never re-request the same start: count the rest lost */
    src->has_no_retry = 1;
    src->no_retry_from = src->has_next ? src->next : 0;
    if (failed) {
        src->st.replay_failures++;
        close_socket(&src->dealer); /* late replies must not reach the next request */
    }
    struct pending *q;
    while (!src->replaying && (q = queue_pop(src)) != NULL) {
        if (q->after_break)
            src->broken = 1;
        q->after_break = 0;
        if (process(s, src, q->seq, q->payload, q->len, DRAIN) == DEFERRED) {
            /* a new gap started a new replay: this batch waits at the front */
            q->next = src->q_head;
            src->q_head = q;
            if (src->q_tail == NULL)
                src->q_tail = q;
            src->q_len++;
            return;
        }
        free(q);
    }
}

static void on_live(struct kvr_kvsub *s, struct source *src, uint64_t seq, const uint8_t *p,
                    size_t len)
{
    /* While a replay is in flight, live batches wait in order. If the queue is full, the replay
     * is abandoned; every abandon applies at least the queue head (its gap start is then blocked
     * from replay), so this loop ends. */
    while (src->replaying) {
        if (src->q_len < s->cfg.max_pending &&
            queue_push(src, seq, p, len, src->broken) == KVR_OK) {
            src->broken = 0; /* the queued batch carries the check */
            return;
        }
        LOG_ONCE(s, src, LOG_REPLAY_FAILED, KVR_KVSUB_WARN,
                 "worker %" PRIu64 " rank %" PRIu32 ": replay too slow, %zu batches queued",
                 src->worker_id, src->dp_rank, src->q_len);
        finish_replay(s, src, 1);
    }
    if (process(s, src, seq, p, len, LIVE) == DEFERRED && queue_push(src, seq, p, len, 0) != KVR_OK)
        finish_replay(s, src, 1); /* cannot queue: give up the replay, apply what we have */
}

/* ==== socket handlers ======================================================================== */

static int64_t backoff_ms(unsigned n)
{
    int64_t d = (int64_t)BACKOFF_BASE_MS << (n < 8 ? n : 8);
    return d < BACKOFF_MAX_MS ? d : BACKOFF_MAX_MS;
}

static void recv_error(struct kvr_kvsub *s, struct source *src, int e)
{
    src->st.recv_errors++;
    src->consecutive_errors++;
    LOG_ONCE(s, src, LOG_RECV, KVR_KVSUB_WARN,
             "worker %" PRIu64 " rank %" PRIu32 ": receive failed on %s: %s", src->worker_id,
             src->dp_rank, src->endpoint, zmq_strerror(e));
    close_sub(src);
    src->broken = 1; /* whatever was published until the new socket connects is not seen */
    src->retry_at = now_ms() + backoff_ms(src->consecutive_errors);
}

/* A reconnect probe: a fresh DEALER (the old one may sit in libzmq's reconnect backoff) asks
 * for everything from the last applied seq; on_dealer_readable judges the first reply. */
static void start_probe(struct kvr_kvsub *s, struct source *src)
{
    close_socket(&src->dealer);
    if (start_replay(s, src, src->st.last_seq) != KVR_OK)
        return; /* decided by the first live batch instead */
    src->probing = 1;
    src->probe_valid = 1;
    src->probe_seq = src->st.last_seq;
    src->st.restart_probes++;
}

/* Monitor events of the SUB (frame 0: u16 event, u32 value, native byte order). */
static void on_monitor(struct kvr_kvsub *s, struct source *src)
{
    for (int burst = 0; burst < MAX_BURST && src->mon != NULL; burst++) {
        zmq_msg_t f[2];
        int n = 0, e = 0;
        int rc = recv_multipart(src->mon, f, 2, &n, &e);
        if (rc == 0)
            return;
        if (rc < 0) {
            close_socket(&src->mon);
            return;
        }
        uint16_t ev = 0;
        if (zmq_msg_size(&f[0]) >= 6)
            memcpy(&ev, zmq_msg_data(&f[0]), sizeof(ev));
        close_frames(f, n < 2 ? n : 2);
        if (ev == ZMQ_EVENT_DISCONNECTED) {
            src->st.disconnects++;
            src->dirty = 1;
            src->broken = 1;
            src->probe_valid = 0; /* a probe in flight may have reached the old publisher */
            LOG_ONCE(s, src, LOG_DISCONNECT, KVR_KVSUB_INFO,
                     "worker %" PRIu64 " rank %" PRIu32 ": disconnected from %s; the first "
                     "batch after the reconnect is checked for a publisher restart",
                     src->worker_id, src->dp_rank, src->endpoint);
        } else if ((ev == ZMQ_EVENT_CONNECTED || ev == ZMQ_EVENT_ACCEPTED) && src->broken &&
                   src->has_fp && !src->replaying) {
            start_probe(s, src);
            src->dirty = 1;
        }
    }
}

/* The probe's first reply (seq, payload; end = the end marker came first). Returns 1 when the
 * reply was consumed (a restart: a new replay from 0 is in flight), 0 to handle it as a plain
 * replay reply. */
static int judge_probe(struct kvr_kvsub *s, struct source *src, uint64_t seq, const void *p,
                       size_t len, int end)
{
    src->probing = 0;
    if (!src->probe_valid)
        return 0; /* another disconnect since: inconclusive, the live rule decides */
    if (!end && seq == src->probe_seq && src->has_fp && kvr_hash_xxh3(p, len, 0) == src->fp) {
        /* the same publisher: the replay goes on and fills whatever the outage lost */
        src->broken = 0;
        queue_forget_breaks(src);
        LOG_ONCE(s, src, LOG_PROBE_SAME, KVR_KVSUB_INFO,
                 "worker %" PRIu64 " rank %" PRIu32 ": reconnected to the same publisher",
                 src->worker_id, src->dp_rank);
        return 0;
    }
    char why[96];
    if (end)
        snprintf(why, sizeof(why), "reconnect probe: the publisher has no batch %" PRIu64,
                 src->probe_seq);
    else if (seq != src->probe_seq)
        snprintf(why, sizeof(why), "reconnect probe: batch %" PRIu64 " answered by %" PRIu64,
                 src->probe_seq, seq);
    else
        snprintf(why, sizeof(why), "reconnect probe: batch %" PRIu64 " differs", seq);
    restart(s, src, 0, why);
    queue_forget_breaks(src);
    close_socket(&src->dealer); /* the rest of the probe's replies must not arrive */
    if (start_replay(s, src, 0) != KVR_OK)
        finish_replay(s, src, 1); /* the queued batches apply; the new life's start is lost */
    return 1;
}

static void on_sub_readable(struct kvr_kvsub *s, struct source *src)
{
    for (int burst = 0; burst < MAX_BURST && src->sub != NULL; burst++) {
        /* connection events first: a disconnect must be known before the batch after it */
        if (src->mon != NULL)
            on_monitor(s, src);
        zmq_msg_t f[3];
        int n = 0, e = 0;
        int rc = recv_multipart(src->sub, f, 3, &n, &e);
        if (rc == 0)
            return;
        if (rc < 0) {
            recv_error(s, src, e);
            return;
        }
        src->consecutive_errors = 0;
        src->st.messages++;
        int kept = n < 3 ? n : 3;
        if (n != 3) {
            src->st.bad_frames++;
            LOG_ONCE(s, src, LOG_BAD_FRAMES, KVR_KVSUB_WARN,
                     "worker %" PRIu64 " rank %" PRIu32 ": message of %d frames (expected 3)",
                     src->worker_id, src->dp_rank, n);
        } else if (zmq_msg_size(&f[1]) != 8) {
            src->st.bad_seq++;
            LOG_ONCE(s, src, LOG_BAD_SEQ, KVR_KVSUB_WARN,
                     "worker %" PRIu64 " rank %" PRIu32 ": seq frame of %zu bytes (expected 8)",
                     src->worker_id, src->dp_rank, zmq_msg_size(&f[1]));
        } else {
            on_live(s, src, load_be64(zmq_msg_data(&f[1])), zmq_msg_data(&f[2]),
                    zmq_msg_size(&f[2]));
        }
        close_frames(f, kept);
        src->dirty = 1;
    }
}

/* Replies as the DEALER sees them: ["", topic, seq, payload] or ["", seq, payload]. */
static void on_dealer_readable(struct kvr_kvsub *s, struct source *src)
{
    for (int burst = 0; burst < MAX_BURST && src->dealer != NULL; burst++) {
        zmq_msg_t f[4];
        int n = 0, e = 0;
        int rc = recv_multipart(src->dealer, f, 4, &n, &e);
        if (rc == 0)
            return;
        if (rc < 0) {
            close_socket(&src->dealer);
            if (src->replaying)
                finish_replay(s, src, 1);
            return;
        }
        int kept = n < 4 ? n : 4;
        src->dirty = 1;
        zmq_msg_t *seqf = NULL, *payload = NULL, *topic = NULL;
        if (n == 4 && zmq_msg_size(&f[0]) == 0) {
            topic = &f[1];
            seqf = &f[2];
            payload = &f[3];
        } else if (n == 3 && zmq_msg_size(&f[0]) == 0) {
            seqf = &f[1];
            payload = &f[2];
        }
        if (seqf == NULL || zmq_msg_size(seqf) != 8) {
            src->st.replay_malformed++;
            LOG_ONCE(s, src, LOG_REPLAY_MALFORMED, KVR_KVSUB_WARN,
                     "worker %" PRIu64 " rank %" PRIu32 ": malformed replay reply (%d frames)",
                     src->worker_id, src->dp_rank, n);
            close_frames(f, kept);
            continue;
        }
        uint64_t seq = load_be64(zmq_msg_data(seqf));
        if (!src->replaying) { /* a late reply to an abandoned request */
            close_frames(f, kept);
            continue;
        }
        src->replay_deadline = now_ms() + (int64_t)s->cfg.replay_timeout_ms;
        if (src->probing && judge_probe(s, src, seq, zmq_msg_data(payload), zmq_msg_size(payload),
                                        seq == END_SEQ || zmq_msg_size(payload) == 0)) {
            close_frames(f, kept);
            return; /* the DEALER was replaced */
        }
        if (seq == END_SEQ || zmq_msg_size(payload) == 0) {
            close_frames(f, kept);
            finish_replay(s, src, 0);
            continue;
        }
        int topic_ok = topic == NULL || src->topic_len == 0 ||
                       (zmq_msg_size(topic) >= src->topic_len &&
                        memcmp(zmq_msg_data(topic), src->topic, src->topic_len) == 0);
        if (topic_ok &&
            process(s, src, seq, zmq_msg_data(payload), zmq_msg_size(payload), REPLAY) == APPLIED)
            src->st.replayed_batches++;
        close_frames(f, kept);
    }
}

static void on_timers(struct kvr_kvsub *s, int64_t now)
{
    for (size_t k = 0; k < s->n_src; k++) {
        struct source *src = s->src[k];
        if (src->replaying && now >= src->replay_deadline) {
            LOG_ONCE(s, src, LOG_REPLAY_FAILED, KVR_KVSUB_WARN,
                     "worker %" PRIu64 " rank %" PRIu32 ": replay from %" PRIu64
                     " timed out; going on without it",
                     src->worker_id, src->dp_rank, src->replay_from);
            finish_replay(s, src, 1);
            src->dirty = 1;
        }
        if (src->sub == NULL && now >= src->retry_at) {
            src->st.reconnects++;
            src->dirty = 1;
            src->broken = 1;
            if (open_sub(s, src) != KVR_OK)
                src->retry_at = now + backoff_ms(++src->consecutive_errors);
        }
    }
}

static int poll_timeout(struct kvr_kvsub *s, int64_t now)
{
    int64_t next = now + 1000;
    for (size_t k = 0; k < s->n_src; k++) {
        const struct source *src = s->src[k];
        if (src->replaying && src->replay_deadline < next)
            next = src->replay_deadline;
        if (src->sub == NULL && src->retry_at < next)
            next = src->retry_at;
    }
    return next <= now ? 0 : (int)(next - now);
}

/* ==== sources and commands =================================================================== */

static void source_free(struct source *src)
{
    if (src == NULL)
        return;
    close_sub(src);
    close_socket(&src->dealer);
    queue_free(src);
    free(src->endpoint);
    free(src->replay_endpoint);
    free(src->topic);
    free(src->lora);
    free(src);
}

static int rank_endpoint_dup(const char *base, const struct kvr_kvsub_source_config *cfg,
                             char **out)
{
    char buf[1024];
    if (!cfg->offset_by_rank) {
        *out = dup_str(base);
        return *out != NULL ? KVR_OK : KVR_ENOMEM;
    }
    int rc = kvr_kvsub_rank_endpoint(base, cfg->dp_rank, buf, sizeof(buf));
    if (rc != KVR_OK)
        return KVR_EINVAL;
    *out = dup_str(buf);
    return *out != NULL ? KVR_OK : KVR_ENOMEM;
}

static struct source *find_source(struct kvr_kvsub *s, uint32_t id, size_t *idx)
{
    for (size_t k = 0; k < s->n_src; k++) {
        if (s->src[k]->id == id) {
            if (idx != NULL)
                *idx = k;
            return s->src[k];
        }
    }
    return NULL;
}

static int cmd_add(struct kvr_kvsub *s, const struct kvr_kvsub_source_config *cfg, uint32_t *id)
{
    if (cfg->endpoint == NULL || cfg->block_size == 0 || (cfg->topic == NULL && cfg->topic_len))
        return KVR_EINVAL;
    for (size_t k = 0; k < s->n_src; k++)
        if (s->src[k]->worker_id == cfg->worker_id && s->src[k]->dp_rank == cfg->dp_rank)
            return KVR_EEXIST;
    struct source *src = calloc(1, sizeof(*src));
    if (src == NULL)
        return KVR_ENOMEM;
    int rc = rank_endpoint_dup(cfg->endpoint, cfg, &src->endpoint);
    if (rc == KVR_OK && cfg->replay_endpoint != NULL)
        rc = rank_endpoint_dup(cfg->replay_endpoint, cfg, &src->replay_endpoint);
    if (rc == KVR_OK && cfg->lora_name != NULL && cfg->lora_name[0] != '\0' &&
        (src->lora = dup_str(cfg->lora_name)) == NULL)
        rc = KVR_ENOMEM;
    if (rc == KVR_OK && cfg->topic_len > 0) {
        src->topic = malloc(cfg->topic_len);
        if (src->topic == NULL)
            rc = KVR_ENOMEM;
        else
            memcpy(src->topic, cfg->topic, cfg->topic_len);
    }
    src->topic_len = cfg->topic_len;
    src->worker_id = cfg->worker_id;
    src->dp_rank = cfg->dp_rank;
    src->last_rank = cfg->dp_rank;
    src->bind = cfg->bind || (src->endpoint != NULL && strchr(src->endpoint, '*') != NULL);
    src->clear_on_loss = cfg->clear_on_loss;
    src->conv = cfg->conv;
    src->conv.block_size = cfg->block_size;
    src->st.worker_id = cfg->worker_id;
    src->st.dp_rank = cfg->dp_rank;
    if (rc == KVR_OK)
        rc = open_sub(s, src);
    if (rc == KVR_OK && s->n_src == s->cap_src) {
        /* under the lock: a stats reader may be walking the old array */
        size_t cap = s->cap_src ? s->cap_src * 2 : 8;
        pthread_mutex_lock(&s->mu);
        struct source **a = realloc(s->src, cap * sizeof(*a));
        if (a == NULL) {
            rc = KVR_ENOMEM;
        } else {
            s->src = a;
            s->cap_src = cap;
        }
        pthread_mutex_unlock(&s->mu);
    }
    if (rc != KVR_OK) {
        source_free(src);
        return rc;
    }
    src->id = ++s->next_id;
    src->pub = src->st;
    pthread_mutex_lock(&s->mu);
    s->src[s->n_src++] = src;
    pthread_mutex_unlock(&s->mu);
    *id = src->id;
    return KVR_OK;
}

static int cmd_remove(struct kvr_kvsub *s, uint32_t id)
{
    size_t idx;
    pthread_mutex_lock(&s->mu);
    struct source *src = find_source(s, id, &idx);
    if (src != NULL)
        s->src[idx] = s->src[--s->n_src];
    pthread_mutex_unlock(&s->mu);
    if (src == NULL)
        return KVR_ENOTFOUND;
    source_free(src);
    return KVR_OK;
}

/* Runs the queued commands; returns 1 when asked to stop. */
static int run_commands(struct kvr_kvsub *s)
{
    char buf[64];
    while (read(s->wake[0], buf, sizeof(buf)) > 0) {
    }
    pthread_mutex_lock(&s->mu);
    struct cmd *list = s->cmds;
    s->cmds = NULL;
    pthread_mutex_unlock(&s->mu);
    int stop = 0;
    for (struct cmd *c = list; c != NULL; c = c->next) {
        if (c->type == CMD_ADD)
            c->rc = cmd_add(s, c->cfg, &c->id);
        else if (c->type == CMD_REMOVE)
            c->rc = cmd_remove(s, c->id);
        else {
            stop = 1;
            c->rc = KVR_OK;
        }
    }
    pthread_mutex_lock(&s->mu);
    for (struct cmd *c = list; c != NULL;) {
        struct cmd *next = c->next; /* read before `done` lets the caller's frame go */
        c->done = 1;
        c = next;
    }
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    return stop;
}

static int submit(struct kvr_kvsub *s, struct cmd *c)
{
    pthread_mutex_lock(&s->mu);
    int was_empty = s->cmds == NULL;
    /* append, so commands run in submission order */
    struct cmd **tail = &s->cmds;
    while (*tail != NULL)
        tail = &(*tail)->next;
    c->next = NULL;
    c->done = 0;
    *tail = c;
    if (was_empty) {
        ssize_t w;
        do
            w = write(s->wake[1], "x", 1);
        while (w == -1 && errno == EINTR);
    }
    while (!c->done)
        pthread_cond_wait(&s->cv, &s->mu);
    pthread_mutex_unlock(&s->mu);
    return c->rc;
}

static void publish_stats(struct kvr_kvsub *s)
{
    int any = 0;
    for (size_t k = 0; k < s->n_src && !any; k++)
        any = s->src[k]->dirty;
    if (!any)
        return;
    pthread_mutex_lock(&s->mu);
    for (size_t k = 0; k < s->n_src; k++) {
        if (s->src[k]->dirty) {
            s->src[k]->pub = s->src[k]->st;
            s->src[k]->dirty = 0;
        }
    }
    pthread_mutex_unlock(&s->mu);
}

/* ==== the thread ============================================================================= */

enum { ITEM_SUB = 1, ITEM_DEALER = 2, ITEM_MON = 3 };

static void *thread_main(void *arg)
{
    struct kvr_kvsub *s = arg;
    zmq_pollitem_t *items = NULL;
    struct source **owner = NULL;
    int *what = NULL;
    size_t cap = 0;
    for (;;) {
        size_t need = 1 + 3 * s->n_src;
        if (need > cap) {
            zmq_pollitem_t *i2 = realloc(items, need * sizeof(*i2));
            if (i2 != NULL)
                items = i2;
            struct source **o2 = realloc(owner, need * sizeof(*o2));
            if (o2 != NULL)
                owner = o2;
            int *w2 = realloc(what, need * sizeof(*w2));
            if (w2 != NULL)
                what = w2;
            if (i2 == NULL || o2 == NULL || w2 == NULL) {
                log_line(s, KVR_KVSUB_ERROR, "out of memory for poll items; retrying");
                struct timespec ts = {0, 100 * 1000000};
                nanosleep(&ts, NULL);
                continue;
            }
            cap = need;
        }
        size_t n = 0;
        items[n].socket = NULL;
        items[n].fd = s->wake[0];
        items[n].events = ZMQ_POLLIN;
        items[n].revents = 0;
        n++;
        for (size_t k = 0; k < s->n_src; k++) {
            struct source *src = s->src[k];
            /* the monitor before its SUB: a disconnect is handled before the batch after it */
            void *socks[3] = {src->mon, src->sub, src->dealer};
            static const int kinds[3] = {ITEM_MON, ITEM_SUB, ITEM_DEALER};
            for (int t = 0; t < 3; t++) {
                if (socks[t] == NULL)
                    continue;
                items[n].socket = socks[t];
                items[n].fd = -1;
                items[n].events = ZMQ_POLLIN;
                items[n].revents = 0;
                owner[n] = src;
                what[n] = kinds[t];
                n++;
            }
        }
        int rc = zmq_poll(items, (int)n, poll_timeout(s, now_ms()));
        if (rc == -1 && zmq_errno() == ETERM)
            break;
        for (size_t k = 1; rc > 0 && k < n; k++) {
            if (!(items[k].revents & ZMQ_POLLIN))
                continue;
            /* a handler may close the socket; only act while it is still the one polled */
            if (what[k] == ITEM_SUB && owner[k]->sub == items[k].socket)
                on_sub_readable(s, owner[k]);
            else if (what[k] == ITEM_DEALER && owner[k]->dealer == items[k].socket)
                on_dealer_readable(s, owner[k]);
            else if (what[k] == ITEM_MON && owner[k]->mon == items[k].socket)
                on_monitor(s, owner[k]);
        }
        on_timers(s, now_ms());
        publish_stats(s);
        if (rc > 0 && (items[0].revents & ZMQ_POLLIN) && run_commands(s))
            break;
    }
    free(items);
    free(owner);
    free(what);
    return NULL;
}

/* ==== public API ============================================================================= */

int kvr_kvsub_new(const struct kvr_kvsub_config *cfg, kvr_kvsub_t **out)
{
    if (cfg == NULL || cfg->sink == NULL || out == NULL)
        return KVR_EINVAL;
    struct kvr_kvsub *s = calloc(1, sizeof(*s));
    if (s == NULL)
        return KVR_ENOMEM;
    s->cfg = *cfg;
    if (s->cfg.replay_timeout_ms == 0)
        s->cfg.replay_timeout_ms = 2000;
    if (s->cfg.max_pending == 0)
        s->cfg.max_pending = 10000;
    if (s->cfg.max_msg_size == 0)
        s->cfg.max_msg_size = 64 << 20;
    if (s->cfg.rcvhwm == 0)
        s->cfg.rcvhwm = 100000;
    if (s->cfg.heartbeat_ms == 0)
        s->cfg.heartbeat_ms = HEARTBEAT_MS;
    s->wake[0] = s->wake[1] = -1;
    kvr_alloc_init(&s->alloc);
    kvr_emp_batch_init(&s->batch, &s->alloc);
    kvr_event_list_init(&s->events);
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    int rc = KVR_EIO;
    if (pipe(s->wake) == -1)
        goto fail;
    for (int k = 0; k < 2; k++) {
        int fl = fcntl(s->wake[k], F_GETFL);
        if (fl == -1 || fcntl(s->wake[k], F_SETFL, fl | O_NONBLOCK) == -1 ||
            fcntl(s->wake[k], F_SETFD, FD_CLOEXEC) == -1)
            goto fail;
    }
    s->ctx = cfg->zmq_ctx;
    if (s->ctx == NULL) {
        s->ctx = zmq_ctx_new();
        if (s->ctx == NULL)
            goto fail;
        s->own_ctx = 1;
    }
    if (pthread_create(&s->thread, NULL, thread_main, s) != 0)
        goto fail;
    s->thread_started = 1;
    *out = s;
    return KVR_OK;
fail:
    kvr_kvsub_free(s);
    return rc;
}

void kvr_kvsub_free(kvr_kvsub_t *s)
{
    if (s == NULL)
        return;
    if (s->thread_started) {
        struct cmd c = {.type = CMD_STOP};
        submit(s, &c);
        pthread_join(s->thread, NULL);
    }
    for (size_t k = 0; k < s->n_src; k++)
        source_free(s->src[k]);
    free(s->src);
    if (s->own_ctx)
        zmq_ctx_term(s->ctx);
    for (int k = 0; k < 2; k++)
        if (s->wake[k] != -1)
            close(s->wake[k]);
    kvr_emp_batch_free(&s->batch);
    kvr_event_list_free(&s->events);
    pthread_cond_destroy(&s->cv);
    pthread_mutex_destroy(&s->mu);
    free(s);
}

int kvr_kvsub_add(kvr_kvsub_t *s, const struct kvr_kvsub_source_config *cfg, uint32_t *id)
{
    if (s == NULL || cfg == NULL)
        return KVR_EINVAL;
    struct cmd c = {.type = CMD_ADD, .cfg = cfg};
    int rc = submit(s, &c);
    if (rc == KVR_OK && id != NULL)
        *id = c.id;
    return rc;
}

int kvr_kvsub_remove(kvr_kvsub_t *s, uint32_t id)
{
    struct cmd c = {.type = CMD_REMOVE, .id = id};
    return submit(s, &c);
}

int kvr_kvsub_find(kvr_kvsub_t *s, uint64_t worker_id, uint32_t dp_rank, uint32_t *id)
{
    int found = 0;
    pthread_mutex_lock(&s->mu);
    for (size_t k = 0; k < s->n_src && !found; k++) {
        if (s->src[k]->worker_id == worker_id && s->src[k]->dp_rank == dp_rank) {
            *id = s->src[k]->id;
            found = 1;
        }
    }
    pthread_mutex_unlock(&s->mu);
    return found;
}

int kvr_kvsub_stats(kvr_kvsub_t *s, uint32_t id, struct kvr_kvsub_stats *out)
{
    pthread_mutex_lock(&s->mu);
    struct source *src = find_source(s, id, NULL);
    if (src != NULL)
        *out = src->pub;
    pthread_mutex_unlock(&s->mu);
    return src != NULL ? KVR_OK : KVR_ENOTFOUND;
}
