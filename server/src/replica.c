/* replica.c - booked-load sync between router replicas over NATS (see replica.h). */
#include "replica.h"

#include <errno.h>
#include <nats/nats.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "clock.h"
#include "jsonw.h"
#include "kvr/err.h"
#include "models.h"
#include "nats_conn.h"
#include "prom.h"
#include "replica_wire.h"
#include "server.h"

/* ==== state =================================================================================== */

/* One queued op (hashes in the queue's hash vector). */
struct qrec {
    uint8_t kind; /* enum srv_rw_kind */
    uint8_t pad_[3];
    uint32_t dp_rank;
    uint32_t slot; /* model slot */
    uint32_t pad2_;
    uint64_t request_id;
    uint64_t worker_id;
    uint64_t prefill;
    uint64_t t_us;
    size_t hoff, n; /* hashes[hoff .. hoff + n) */
};

struct queue {
    struct qrec *v;
    size_t n, cap;
    uint64_t *h;
    size_t nh, caph;
};

struct peer {
    uint64_t router_id;
    uint64_t last_seen_ms; /* monotonic */
    uint64_t last_seq;
    uint32_t origin; /* index + 1 */
    int alive;
};

enum conn_state { CONN_CONNECTING = 0, CONN_UP = 1, CONN_DOWN = 2 };

struct srv_replica {
    struct srv *s;
    struct srv_replica_cfg cfg;
    char *url, *subject;
    natsOptions *opts;
    natsConnection *nc;
    natsSubscription *sub;

    pthread_t thr;
    int started;
    pthread_mutex_t mu; /* queue, flags */
    pthread_cond_t cond;
    int stop;
    struct queue q, spare;
    uint64_t first_us;  /* when the oldest queued op was queued (monotonic µs) */
    int need_state;     /* publish a full state */
    int need_sync_all;  /* ask everyone for theirs */
    uint64_t *sync_for; /* ask these replicas for theirs */
    size_t n_sync_for, cap_sync_for;

    pthread_mutex_t pmu; /* peers */
    struct peer peers[SRV_REPLICA_MAX_PEERS];
    size_t n_peers;

    /* delivery-thread scratch */
    struct srv_jdoc doc;
    struct srv_rw_decoded dec;
    struct srv_ratelimit rl_decode;

    /* flush-thread scratch */
    struct kvr_buf out;
    uint64_t seq;
    uint64_t last_pub_ms;
    uint64_t last_ops_us; /* when ops were last published (monotonic µs) */

    _Atomic int conn;
    _Atomic int closing; /* srv_replica_stop is closing the connection (no "lost NATS" log) */
    _Atomic uint64_t pub_msgs, pub_bytes, pub_ops, pub_errors, dropped, recv_msgs, recv_bytes,
        recv_ops, decode_errors, echo, gaps, restarts, timeouts, byes, states_sent, states_received,
        unknown_model, syncs_sent, disconnects, reconnects, unknown_request, peer_overflow;
    struct srv_hist delay; /* µs from the op to its application here (delivery thread) */
};

/* 50-100 µs wide up to 1.1 ms (the flush interval is 1 ms), then coarser */
static const struct srv_hist_spec delay_spec = {
    23,
    {50,   100,  150,  200,  300,  400,  500,   600,   700,   800,    900,    1000,
     1100, 1250, 1500, 2000, 3000, 5000, 10000, 20000, 50000, 100000, 1000000},
    1e-6};

static uint64_t mix64(uint64_t x)
{
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    x ^= x >> 31;
    return x;
}

uint64_t srv_replica_map_id(uint64_t router_id, uint64_t request_id)
{
    return mix64(mix64(router_id) ^ request_id) | (1ull << 63);
}

/* ==== the queue (observers append under the tracker's mutex; keep it short) =================== */

static int q_reserve(struct queue *q, size_t hashes)
{
    if (q->n == q->cap) {
        size_t cap = q->cap ? q->cap * 2 : 256;
        struct qrec *v = realloc(q->v, cap * sizeof(*v));
        if (v == NULL)
            return KVR_ENOMEM;
        q->v = v;
        q->cap = cap;
    }
    if (q->nh + hashes > q->caph) {
        size_t cap = q->caph ? q->caph : 4096;
        while (cap < q->nh + hashes)
            cap *= 2;
        uint64_t *h = realloc(q->h, cap * sizeof(*h));
        if (h == NULL)
            return KVR_ENOMEM;
        q->h = h;
        q->caph = cap;
    }
    return KVR_OK;
}

/* Appends one op; r->mu held. Returns 0 when dropped (full or out of memory). State entries
 * (`force`) ignore the bound: they are bounded by the trackers themselves, and dropping them
 * would only ask for another state. */
static int q_push_locked(struct srv_replica *r, const struct qrec *rec, const uint64_t *hashes,
                         int force)
{
    struct queue *q = &r->q;
    if ((!force && q->n >= SRV_REPLICA_MAX_QUEUE) || q_reserve(q, rec->n) != KVR_OK) {
        atomic_fetch_add_explicit(&r->dropped, 1, memory_order_relaxed);
        r->need_state = 1; /* the next full state repairs what the others missed */
        return 0;
    }
    struct qrec *d = &q->v[q->n++];
    *d = *rec;
    d->hoff = q->nh;
    if (rec->n > 0)
        memcpy(q->h + q->nh, hashes, rec->n * sizeof(uint64_t));
    q->nh += rec->n;
    if (q->n == 1) {
        r->first_us = srv_now_us();
        pthread_cond_signal(&r->cond);
    } else if (q->n == r->cfg.max_batch) {
        pthread_cond_signal(&r->cond);
    }
    return 1;
}

static void q_push(struct srv_replica *r, const struct qrec *rec, const uint64_t *hashes, int force)
{
    pthread_mutex_lock(&r->mu);
    q_push_locked(r, rec, hashes, force);
    pthread_mutex_unlock(&r->mu);
}

void srv_replica_on_load(void *ctx, struct srv_model *m, const struct kvr_load_op *op)
{
    struct srv_replica *r = ctx;
    if (r == NULL || op->origin != 0)
        return;
    struct qrec rec = {.dp_rank = op->dp_rank,
                       .slot = m->slot,
                       .request_id = op->request_id,
                       .worker_id = op->worker_id,
                       .t_us = srv_wall_us()};
    switch (op->kind) {
    case KVR_LOAD_OP_ADD:
        rec.kind = SRV_RW_ADD;
        rec.prefill = op->prefill_tokens;
        rec.n = op->n_hashes;
        break;
    case KVR_LOAD_OP_FIRST_TOKEN:
        rec.kind = SRV_RW_FIRST;
        break;
    default: /* release, expiry */
        rec.kind = SRV_RW_FREE;
        break;
    }
    q_push(r, &rec, op->seq_hashes, 0);
}

void srv_replica_on_approx(void *ctx, struct srv_model *m, uint64_t worker_id, uint32_t dp_rank,
                           const uint64_t *locals, size_t n)
{
    struct srv_replica *r = ctx;
    if (r == NULL || n == 0)
        return;
    struct qrec rec = {.kind = SRV_RW_APPROX,
                       .dp_rank = dp_rank,
                       .slot = m->slot,
                       .worker_id = worker_id,
                       .t_us = srv_wall_us(),
                       .n = n};
    q_push(r, &rec, locals, 0);
}

/* ==== full state ============================================================================== */

struct state_ctx {
    struct srv_replica *r;
    uint32_t slot;
};

static void state_one(void *ctx, const struct kvr_load_op *op)
{
    struct state_ctx *c = ctx;
    struct qrec rec = {.kind = SRV_RW_ADD,
                       .dp_rank = op->dp_rank,
                       .slot = c->slot,
                       .request_id = op->request_id,
                       .worker_id = op->worker_id,
                       .prefill = op->prefill_tokens,
                       .t_us = 0, /* not a fresh op: no delay sample */
                       .n = op->n_hashes};
    q_push(c->r, &rec, op->seq_hashes, 1);
}

/* Queues a state section per model. Lock order: tracker, then r->mu (as the observers). A
 * booking that lands between the begin marker and the listing is both queued as an op and
 * listed; applying it twice is harmless (a duplicate add is ignored), and no op can fall
 * between the listing and its place in the queue, because both happen under the tracker's
 * mutex. */
static void queue_state(struct srv_replica *r)
{
    size_t n = srv_models_count(&r->s->models);
    for (size_t k = 0; k < n; k++) {
        struct srv_model *m = srv_models_at(&r->s->models, k);
        struct qrec b = {.kind = SRV_RW_STATE_BEGIN, .slot = m->slot};
        q_push(r, &b, NULL, 1);
        struct state_ctx c = {r, m->slot};
        kvr_load_origin_foreach(m->load, 0, state_one, &c);
        struct qrec e = {.kind = SRV_RW_STATE_END, .slot = m->slot};
        q_push(r, &e, NULL, 1);
    }
    atomic_fetch_add_explicit(&r->states_sent, 1, memory_order_relaxed);
}

/* ==== publishing (flush thread) =============================================================== */

static void publish(struct srv_replica *r)
{
    natsStatus st = natsConnection_Publish(r->nc, r->subject, r->out.data, (int)r->out.len);
    if (st == NATS_OK) {
        atomic_fetch_add_explicit(&r->pub_msgs, 1, memory_order_relaxed);
        atomic_fetch_add_explicit(&r->pub_bytes, r->out.len, memory_order_relaxed);
    } else {
        atomic_fetch_add_explicit(&r->pub_errors, 1, memory_order_relaxed);
        pthread_mutex_lock(&r->mu);
        r->need_state = 1;
        pthread_mutex_unlock(&r->mu);
    }
    r->last_pub_ms = srv_now_ms();
}

static void header(struct srv_replica *r, struct srv_rw_header *h, int type)
{
    memset(h, 0, sizeof(*h));
    h->type = type;
    h->router_id = r->cfg.router_id;
    h->seq = ++r->seq;
    h->ts_us = srv_wall_us();
}

static void publish_control(struct srv_replica *r, int type, uint64_t target)
{
    struct srv_rw_header h;
    header(r, &h, type);
    h.target = target;
    struct srv_jw w;
    kvr_buf_reset(&r->out);
    srv_jw_init(&w, &r->out);
    srv_rw_begin(&w, &h);
    if (srv_rw_end(&w, &h) == KVR_OK)
        publish(r);
    if (type == SRV_RW_SYNC)
        atomic_fetch_add_explicit(&r->syncs_sent, 1, memory_order_relaxed);
}

/* Publishes q's ops in messages of at most max_batch ops. */
static void publish_queue(struct srv_replica *r, const struct queue *q)
{
    size_t i = 0;
    while (i < q->n) {
        struct srv_rw_header h;
        header(r, &h, SRV_RW_OPS);
        struct srv_jw w;
        kvr_buf_reset(&r->out);
        srv_jw_init(&w, &r->out);
        srv_rw_begin(&w, &h);
        size_t end = i + r->cfg.max_batch < q->n ? i + r->cfg.max_batch : q->n;
        for (size_t k = i; k < end; k++) {
            const struct qrec *rec = &q->v[k];
            struct srv_model *m = srv_models_at(&r->s->models, rec->slot);
            struct srv_rw_event ev = {.kind = rec->kind,
                                      .dp_rank = rec->dp_rank,
                                      .model = m->key,
                                      .model_len = strlen(m->key),
                                      .request_id = rec->request_id,
                                      .worker_id = rec->worker_id,
                                      .prefill_tokens = rec->prefill,
                                      .t_us = rec->t_us,
                                      .hashes = rec->n ? q->h + rec->hoff : NULL,
                                      .n_hashes = rec->n};
            srv_rw_event(&w, &ev, k == i);
        }
        if (srv_rw_end(&w, &h) == KVR_OK) {
            publish(r);
            atomic_fetch_add_explicit(&r->pub_ops, end - i, memory_order_relaxed);
        } else {
            atomic_fetch_add_explicit(&r->dropped, end - i, memory_order_relaxed);
        }
        i = end;
    }
}

/* ==== peers =================================================================================== */

static void release_origin(struct srv_replica *r, uint32_t origin)
{
    size_t n = srv_models_count(&r->s->models);
    uint64_t now = srv_now_ms();
    for (size_t k = 0; k < n; k++)
        kvr_load_release_origin(srv_models_at(&r->s->models, k)->load, origin, now);
}

/* Asks for a replica's full state (flush thread publishes it). */
static void want_sync(struct srv_replica *r, uint64_t router_id)
{
    pthread_mutex_lock(&r->mu);
    int have = 0;
    for (size_t k = 0; k < r->n_sync_for; k++)
        have |= r->sync_for[k] == router_id;
    if (!have) {
        if (r->n_sync_for == r->cap_sync_for) {
            size_t cap = r->cap_sync_for ? r->cap_sync_for * 2 : 8;
            uint64_t *v = realloc(r->sync_for, cap * sizeof(*v));
            if (v != NULL) {
                r->sync_for = v;
                r->cap_sync_for = cap;
            }
        }
        if (r->n_sync_for < r->cap_sync_for)
            r->sync_for[r->n_sync_for++] = router_id;
        else
            r->need_sync_all = 1;
    }
    pthread_cond_signal(&r->cond);
    pthread_mutex_unlock(&r->mu);
}

/* Finds or creates the peer of router_id (pmu held); NULL when the table is full. *fresh tells
 * whether it was unknown or presumed dead. */
static struct peer *peer_get_locked(struct srv_replica *r, uint64_t router_id, int *fresh)
{
    struct peer *free_slot = NULL;
    *fresh = 0;
    for (size_t k = 0; k < r->n_peers; k++) {
        struct peer *p = &r->peers[k];
        if (p->router_id == router_id) {
            if (!p->alive) {
                *fresh = 1;
                p->alive = 1;
                p->last_seq = 0;
            }
            return p;
        }
        if (!p->alive && free_slot == NULL)
            free_slot = p;
    }
    struct peer *p = free_slot;
    if (p == NULL) {
        if (r->n_peers == SRV_REPLICA_MAX_PEERS)
            return NULL;
        p = &r->peers[r->n_peers];
        p->origin = (uint32_t)r->n_peers + 1;
        r->n_peers++;
    }
    p->router_id = router_id;
    p->alive = 1;
    p->last_seq = 0;
    *fresh = 1;
    return p;
}

/* Flush thread: replicas silent for timeout_ms are released. */
static void check_timeouts(struct srv_replica *r)
{
    uint64_t now = srv_now_ms();
    uint32_t dead[SRV_REPLICA_MAX_PEERS];
    uint64_t ids[SRV_REPLICA_MAX_PEERS];
    size_t n = 0;
    pthread_mutex_lock(&r->pmu);
    for (size_t k = 0; k < r->n_peers; k++) {
        struct peer *p = &r->peers[k];
        if (p->alive && now - p->last_seen_ms > r->cfg.timeout_ms) {
            p->alive = 0;
            dead[n] = p->origin;
            ids[n++] = p->router_id;
        }
    }
    pthread_mutex_unlock(&r->pmu);
    for (size_t k = 0; k < n; k++) {
        release_origin(r, dead[k]);
        atomic_fetch_add_explicit(&r->timeouts, 1, memory_order_relaxed);
        srv_logf(r->s->log, SRV_LOG_WARN, "replica",
                 "replica %llu silent for more than %llu ms: its bookings are released",
                 (unsigned long long)ids[k], (unsigned long long)r->cfg.timeout_ms);
    }
}

/* ==== receiving (libnats delivery thread) ===================================================== */

static void apply_event(struct srv_replica *r, const struct peer *p, const struct srv_rw_event *ev,
                        uint64_t now_us)
{
    struct srv_model *m = srv_models_find_spec(&r->s->models, ev->model, ev->model_len);
    if (m == NULL) {
        atomic_fetch_add_explicit(&r->unknown_model, 1, memory_order_relaxed);
        return;
    }
    uint64_t now = srv_now_ms();
    uint64_t id = srv_replica_map_id(p->router_id, ev->request_id);
    int rc = KVR_OK;
    switch (ev->kind) {
    case SRV_RW_ADD: {
        struct kvr_load_request rq = {.request_id = id,
                                      .worker_id = ev->worker_id,
                                      .dp_rank = ev->dp_rank,
                                      .isl_tokens = ev->prefill_tokens > UINT32_MAX
                                                        ? UINT32_MAX
                                                        : (uint32_t)ev->prefill_tokens,
                                      .overlap_blocks = 0,
                                      .track_prefill = 1,
                                      .origin = p->origin,
                                      .seq_hashes = ev->n_hashes ? ev->hashes : NULL,
                                      .n_hashes = ev->n_hashes};
        rc = kvr_load_add(m->load, &rq, now);
        if (ev->t_us != 0 && now_us >= ev->t_us)
            srv_hist_observe(&r->delay, &delay_spec, now_us - ev->t_us);
        break;
    }
    case SRV_RW_FIRST:
        rc = kvr_load_first_token(m->load, id, now);
        break;
    case SRV_RW_FREE:
        rc = kvr_load_release(m->load, id, now);
        break;
    case SRV_RW_APPROX:
        if (m->approx != NULL)
            kvr_approx_record_quiet(m->approx, ev->worker_id, ev->dp_rank, ev->hashes, ev->n_hashes,
                                    now);
        break;
    case SRV_RW_STATE_BEGIN:
        kvr_load_release_origin(m->load, p->origin, now);
        break;
    default: /* SRV_RW_STATE_END */
        atomic_fetch_add_explicit(&r->states_received, 1, memory_order_relaxed);
        break;
    }
    if (rc == KVR_ENOTFOUND)
        atomic_fetch_add_explicit(&r->unknown_request, 1, memory_order_relaxed);
}

static void on_msg(natsConnection *nc, natsSubscription *sub, natsMsg *msg, void *closure)
{
    struct srv_replica *r = closure;
    (void)nc;
    (void)sub;
    const char *data = natsMsg_GetData(msg);
    size_t len = (size_t)natsMsg_GetDataLength(msg);
    atomic_fetch_add_explicit(&r->recv_msgs, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&r->recv_bytes, len, memory_order_relaxed);
    char err[256];
    int rc = srv_rw_decode(&r->doc, data, len, &r->dec, err, sizeof(err));
    if (rc != KVR_OK) {
        atomic_fetch_add_explicit(&r->decode_errors, 1, memory_order_relaxed);
        if (srv_log_ratelimit(&r->rl_decode, srv_now_ms(), 10000))
            srv_logf(r->s->log, SRV_LOG_WARN, "replica", "undecodable sync message (%zu bytes): %s",
                     len, err);
        goto out;
    }
    const struct srv_rw_header *h = &r->dec.h;
    if (h->router_id == r->cfg.router_id) {
        atomic_fetch_add_explicit(&r->echo, 1, memory_order_relaxed);
        goto out;
    }
    int fresh = 0, gap = 0, restarted = 0;
    pthread_mutex_lock(&r->pmu);
    struct peer *p = peer_get_locked(r, h->router_id, &fresh);
    struct peer pc = {0};
    if (p != NULL) {
        if (!fresh && p->last_seq != 0 && h->seq != p->last_seq + 1) {
            if (h->seq <= p->last_seq)
                restarted = 1;
            else
                gap = 1;
        }
        p->last_seq = h->seq;
        p->last_seen_ms = srv_now_ms();
        if (h->type == SRV_RW_BYE)
            p->alive = 0;
        pc = *p;
    }
    pthread_mutex_unlock(&r->pmu);
    if (p == NULL) { /* more replicas than SRV_REPLICA_MAX_PEERS */
        atomic_fetch_add_explicit(&r->peer_overflow, 1, memory_order_relaxed);
        goto out;
    }
    if (restarted) {
        /* the same id speaking from 1 again: a restarted process; what it held is gone */
        atomic_fetch_add_explicit(&r->restarts, 1, memory_order_relaxed);
        release_origin(r, pc.origin);
    }
    if (fresh || gap || restarted) {
        if (gap)
            atomic_fetch_add_explicit(&r->gaps, 1, memory_order_relaxed);
        if (fresh)
            srv_logf(r->s->log, SRV_LOG_INFO, "replica", "replica %llu joined",
                     (unsigned long long)h->router_id);
        want_sync(r, h->router_id);
    }
    switch (h->type) {
    case SRV_RW_OPS: {
        uint64_t now_us = srv_wall_us();
        for (size_t k = 0; k < r->dec.n_ev; k++)
            apply_event(r, &pc, &r->dec.ev[k], now_us);
        atomic_fetch_add_explicit(&r->recv_ops, r->dec.n_ev, memory_order_relaxed);
        break;
    }
    case SRV_RW_SYNC:
        if (h->target == 0 || h->target == r->cfg.router_id) {
            pthread_mutex_lock(&r->mu);
            r->need_state = 1;
            pthread_cond_signal(&r->cond);
            pthread_mutex_unlock(&r->mu);
        }
        break;
    case SRV_RW_BYE:
        atomic_fetch_add_explicit(&r->byes, 1, memory_order_relaxed);
        release_origin(r, pc.origin);
        srv_logf(r->s->log, SRV_LOG_INFO, "replica", "replica %llu left",
                 (unsigned long long)h->router_id);
        break;
    default: /* hello */
        break;
    }
out:
    srv_jdoc_release(&r->doc);
    natsMsg_Destroy(msg);
}

/* ==== connection events (libnats threads) ===================================================== */

static void on_up(struct srv_replica *r)
{
    atomic_store(&r->conn, CONN_UP);
    pthread_mutex_lock(&r->mu);
    r->need_state = 1;
    r->need_sync_all = 1;
    pthread_cond_signal(&r->cond);
    pthread_mutex_unlock(&r->mu);
}

static void on_connected(natsConnection *nc, void *closure)
{
    struct srv_replica *r = closure;
    (void)nc;
    srv_logf(r->s->log, SRV_LOG_INFO, "replica", "connected to NATS %s", r->url);
    on_up(r);
}

static void on_reconnected(natsConnection *nc, void *closure)
{
    struct srv_replica *r = closure;
    (void)nc;
    atomic_fetch_add_explicit(&r->reconnects, 1, memory_order_relaxed);
    srv_logf(r->s->log, SRV_LOG_INFO, "replica",
             "reconnected to NATS: exchanging full states with the other replicas");
    on_up(r);
}

static void on_disconnected(natsConnection *nc, void *closure)
{
    struct srv_replica *r = closure;
    (void)nc;
    if (atomic_exchange(&r->conn, CONN_DOWN) == CONN_UP && !atomic_load(&r->closing)) {
        atomic_fetch_add_explicit(&r->disconnects, 1, memory_order_relaxed);
        srv_logf(r->s->log, SRV_LOG_WARN, "replica",
                 "lost NATS: routing on the local view (remote bookings time out after %llu ms)",
                 (unsigned long long)r->cfg.timeout_ms);
    }
}

/* ==== the flush thread ======================================================================== */

static void *flush_main(void *arg)
{
    struct srv_replica *r = arg;
    uint64_t last_check = 0;
    pthread_mutex_lock(&r->mu);
    while (!r->stop) {
        uint64_t now = srv_now_us();
        int up = atomic_load(&r->conn) == CONN_UP;
        if (up && r->need_state) {
            r->need_state = 0;
            pthread_mutex_unlock(&r->mu);
            queue_state(r); /* takes r->mu per op */
            pthread_mutex_lock(&r->mu);
            continue;
        }
        if (up && (r->need_sync_all || r->n_sync_for > 0)) {
            int all = r->need_sync_all;
            uint64_t targets[16];
            size_t nt = 0;
            while (!all && r->n_sync_for > 0 && nt < 16)
                targets[nt++] = r->sync_for[--r->n_sync_for];
            r->need_sync_all = 0;
            pthread_mutex_unlock(&r->mu);
            if (all)
                publish_control(r, SRV_RW_SYNC, 0);
            for (size_t k = 0; k < nt; k++)
                publish_control(r, SRV_RW_SYNC, targets[k]);
            pthread_mutex_lock(&r->mu);
            continue;
        }
        /* Nagle-like: after a quiet flush interval the first op leaves at once; ops that
         * follow within the interval wait for it (≤ flush_us) and share a message. */
        if (r->q.n > 0 && (r->q.n >= r->cfg.max_batch || now >= r->first_us + r->cfg.flush_us ||
                           now >= r->last_ops_us + r->cfg.flush_us)) {
            r->last_ops_us = now;
            struct queue q = r->q;
            r->q = r->spare;
            r->q.n = r->q.nh = 0;
            pthread_mutex_unlock(&r->mu);
            publish_queue(r, &q);
            pthread_mutex_lock(&r->mu);
            r->spare = q;
            continue;
        }
        pthread_mutex_unlock(&r->mu);
        uint64_t now_ms = srv_now_ms();
        if (now_ms - r->last_pub_ms >= r->cfg.heartbeat_ms)
            publish_control(r, SRV_RW_HELLO, 0);
        if (now_ms - last_check >= 100) {
            check_timeouts(r);
            last_check = now_ms;
        }
        pthread_mutex_lock(&r->mu);
        /* sleep until the oldest op is due, or 50 ms (heartbeats, timeouts) */
        uint64_t wait_us = 50000;
        if (r->q.n > 0) {
            uint64_t from = r->first_us < r->last_ops_us ? r->first_us : r->last_ops_us;
            uint64_t due = from + r->cfg.flush_us;
            now = srv_now_us();
            wait_us = due > now ? due - now : 0;
        }
        if (wait_us > 0 && !r->stop && !r->need_state && !r->need_sync_all && r->n_sync_for == 0 &&
            r->q.n < r->cfg.max_batch) {
            uint64_t at = srv_now_ns() + wait_us * 1000u; /* the cond waits on CLOCK_MONOTONIC */
            struct timespec ts = {(time_t)(at / 1000000000u), (long)(at % 1000000000u)};
            pthread_cond_timedwait(&r->cond, &r->mu, &ts);
        }
    }
    /* stopping: what is queued, then "bye" */
    struct queue q = r->q;
    r->q = r->spare;
    r->q.n = r->q.nh = 0;
    pthread_mutex_unlock(&r->mu);
    if (atomic_load(&r->conn) == CONN_UP) {
        publish_queue(r, &q);
        publish_control(r, SRV_RW_BYE, 0);
        natsConnection_FlushTimeout(r->nc, 1000);
    }
    pthread_mutex_lock(&r->mu);
    r->spare = q;
    pthread_mutex_unlock(&r->mu);
    return NULL;
}

/* ==== lifecycle =============================================================================== */

int srv_replica_new(struct srv *s, const struct srv_replica_cfg *cfg, struct srv_replica **out,
                    char *err, size_t err_len)
{
    if (cfg->nats_url == NULL || cfg->subject == NULL || *cfg->subject == '\0' ||
        cfg->router_id == 0) {
        snprintf(err, err_len, "replica sync needs a NATS URL, a subject and a non-zero id");
        return KVR_EINVAL;
    }
    if (strpbrk(cfg->subject, " \t\r\n*>") != NULL) {
        snprintf(err, err_len, "--replica-subject '%s': no spaces or wildcards", cfg->subject);
        return KVR_EINVAL;
    }
    struct srv_replica *r = calloc(1, sizeof(*r));
    if (r == NULL)
        return KVR_ENOMEM;
    r->s = s;
    r->cfg = *cfg;
    if (r->cfg.flush_us == 0)
        r->cfg.flush_us = 1;
    if (r->cfg.max_batch == 0)
        r->cfg.max_batch = 256;
    if (r->cfg.heartbeat_ms == 0)
        r->cfg.heartbeat_ms = 1000;
    if (r->cfg.timeout_ms == 0)
        r->cfg.timeout_ms = 5000;
    r->url = strdup(cfg->nats_url);
    r->subject = strdup(cfg->subject);
    kvr_buf_init(&r->out, NULL);
    atomic_init(&r->conn, CONN_CONNECTING);
    if (r->url == NULL || r->subject == NULL || srv_jdoc_init(&r->doc) != KVR_OK) {
        free(r->url);
        free(r->subject);
        free(r);
        return KVR_ENOMEM;
    }
    pthread_mutex_init(&r->mu, NULL);
    pthread_mutex_init(&r->pmu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&r->cond, &ca);
    pthread_condattr_destroy(&ca);
    *out = r;
    return KVR_OK;
}

int srv_replica_start(struct srv_replica *r, char *err, size_t err_len)
{
    char name[64];
    snprintf(name, sizeof(name), "kvrouter-%llu", (unsigned long long)r->cfg.router_id);
    natsStatus st = srv_nats_options(&r->opts, r->url, name, on_connected, r);
    if (st == NATS_OK)
        st = natsOptions_SetReconnectBufSize(r->opts, 8 * 1024 * 1024);
    if (st == NATS_OK)
        st = natsOptions_SetDisconnectedCB(r->opts, on_disconnected, r);
    if (st == NATS_OK)
        st = natsOptions_SetReconnectedCB(r->opts, on_reconnected, r);
    if (st == NATS_OK)
        st = natsOptions_SetNoEcho(r->opts, true); /* our own messages are of no use to us */
    if (st == NATS_OK)
        st = natsOptions_SetPingInterval(r->opts, 2000);
    if (st == NATS_OK)
        st = natsOptions_SetMaxPingsOut(r->opts, 2);
    int up = 0;
    if (st == NATS_OK)
        st = srv_nats_connect(&r->nc, r->opts, &up);
    if (st != NATS_OK) {
        snprintf(err, err_len, "--nats %s: %s", r->url, natsStatus_GetText(st));
        return KVR_EIO;
    }
    if (up) {
        srv_logf(r->s->log, SRV_LOG_INFO, "replica", "connected to NATS %s (replica id %llu)",
                 r->url, (unsigned long long)r->cfg.router_id);
        on_up(r);
    } else {
        srv_logf(r->s->log, SRV_LOG_WARN, "replica",
                 "NATS %s not reachable yet: routing on the local view, retrying", r->url);
        atomic_store(&r->conn, CONN_DOWN);
    }
    st = natsConnection_Subscribe(&r->sub, r->nc, r->subject, on_msg, r);
    if (st == NATS_OK)
        st = natsSubscription_SetPendingLimits(r->sub, 1 << 20, 512 * 1024 * 1024);
    if (st != NATS_OK) {
        snprintf(err, err_len, "cannot subscribe to '%s': %s", r->subject, natsStatus_GetText(st));
        return KVR_EIO;
    }
    if (pthread_create(&r->thr, NULL, flush_main, r) != 0) {
        snprintf(err, err_len, "cannot start the replica thread");
        return KVR_EIO;
    }
    r->started = 1;
    return KVR_OK;
}

void srv_replica_stop(struct srv_replica *r)
{
    if (r == NULL)
        return;
    if (r->started) {
        pthread_mutex_lock(&r->mu);
        r->stop = 1;
        pthread_cond_signal(&r->cond);
        pthread_mutex_unlock(&r->mu);
        pthread_join(r->thr, NULL);
        r->started = 0;
    }
    if (r->sub != NULL) {
        natsSubscription_Unsubscribe(r->sub);
        natsSubscription_Destroy(r->sub);
        r->sub = NULL;
    }
    if (r->nc != NULL) {
        atomic_store(&r->closing, 1);
        natsConnection_Close(r->nc);
        natsConnection_Destroy(r->nc);
        r->nc = NULL;
    }
    if (r->opts != NULL) {
        natsOptions_Destroy(r->opts);
        r->opts = NULL;
    }
}

static void q_free(struct queue *q)
{
    free(q->v);
    free(q->h);
}

void srv_replica_free(struct srv_replica *r)
{
    if (r == NULL)
        return;
    srv_replica_stop(r);
    q_free(&r->q);
    q_free(&r->spare);
    free(r->sync_for);
    srv_rw_decoded_free(&r->dec);
    srv_jdoc_free(&r->doc);
    kvr_buf_free(&r->out);
    pthread_cond_destroy(&r->cond);
    pthread_mutex_destroy(&r->mu);
    pthread_mutex_destroy(&r->pmu);
    free(r->url);
    free(r->subject);
    free(r);
}

int srv_replica_connected(struct srv_replica *r)
{
    return r != NULL && atomic_load(&r->conn) == CONN_UP;
}

/* ==== metrics ================================================================================= */

static size_t alive_peers(struct srv_replica *r)
{
    size_t n = 0;
    pthread_mutex_lock(&r->pmu);
    for (size_t k = 0; k < r->n_peers; k++)
        n += r->peers[k].alive != 0;
    pthread_mutex_unlock(&r->pmu);
    return n;
}

static const char *conn_name(int c)
{
    return c == CONN_UP ? "connected" : c == CONN_DOWN ? "disconnected" : "connecting";
}

void srv_replica_ready_detail(struct srv_replica *r, struct srv_jw *w)
{
    if (r == NULL)
        return;
    int c = atomic_load(&r->conn);
    srv_jw_raw(w, "{\"nats\":");
    srv_jw_cstr(w, conn_name(c));
    srv_jw_raw(w, ",\"replica_id\":");
    srv_jw_u64(w, r->cfg.router_id);
    srv_jw_raw(w, ",\"peers\":");
    srv_jw_u64(w, alive_peers(r));
    srv_jw_raw(w, ",\"degraded\":");
    srv_jw_bool(w, c != CONN_UP);
    srv_jw_char(w, '}');
}

void srv_replica_metrics(struct srv_replica *r, struct srv_prom *p)
{
    if (r == NULL)
        return;
    srv_prom_gauge(p, "kvrouter_replica_nats_connected",
                   "1 when the replica-sync NATS connection is up (0: routing on the local view)",
                   atomic_load(&r->conn) == CONN_UP);
    srv_prom_gauge(p, "kvrouter_replica_peers", "other replicas heard from within the timeout",
                   alive_peers(r));
    srv_prom_counter(p, "kvrouter_replica_published_messages_total", "sync messages published",
                     atomic_load(&r->pub_msgs));
    srv_prom_counter(p, "kvrouter_replica_published_bytes_total",
                     "bytes of sync messages published", atomic_load(&r->pub_bytes));
    srv_prom_counter(p, "kvrouter_replica_published_ops_total",
                     "load ops (add, first token, free, approx, state entries) published",
                     atomic_load(&r->pub_ops));
    srv_prom_counter(p, "kvrouter_replica_publish_errors_total",
                     "publications libnats refused (repaired by a full state)",
                     atomic_load(&r->pub_errors));
    srv_prom_counter(p, "kvrouter_replica_dropped_ops_total",
                     "ops dropped because the queue was full (repaired by a full state)",
                     atomic_load(&r->dropped));
    srv_prom_counter(p, "kvrouter_replica_received_messages_total", "sync messages received",
                     atomic_load(&r->recv_msgs));
    srv_prom_counter(p, "kvrouter_replica_received_bytes_total", "bytes of sync messages received",
                     atomic_load(&r->recv_bytes));
    srv_prom_counter(p, "kvrouter_replica_received_ops_total", "remote ops applied",
                     atomic_load(&r->recv_ops));
    srv_prom_counter(p, "kvrouter_replica_decode_errors_total",
                     "sync messages that could not be decoded", atomic_load(&r->decode_errors));
    srv_prom_counter(p, "kvrouter_replica_echo_total", "own messages received back (ignored)",
                     atomic_load(&r->echo));
    srv_prom_counter(p, "kvrouter_replica_gaps_total",
                     "sequence gaps detected (answered with a state request)",
                     atomic_load(&r->gaps));
    srv_prom_counter(p, "kvrouter_replica_restarts_total", "replicas seen restarting",
                     atomic_load(&r->restarts));
    srv_prom_counter(p, "kvrouter_replica_timeouts_total",
                     "replicas presumed dead after the timeout (their bookings released)",
                     atomic_load(&r->timeouts));
    srv_prom_counter(p, "kvrouter_replica_byes_total", "replicas that announced a clean shutdown",
                     atomic_load(&r->byes));
    srv_prom_counter(p, "kvrouter_replica_states_sent_total", "full states published",
                     atomic_load(&r->states_sent));
    srv_prom_counter(p, "kvrouter_replica_state_sections_received_total",
                     "full-state sections (one per model) received",
                     atomic_load(&r->states_received));
    srv_prom_counter(p, "kvrouter_replica_sync_requests_sent_total", "state requests published",
                     atomic_load(&r->syncs_sent));
    srv_prom_counter(p, "kvrouter_replica_unknown_model_total",
                     "remote ops for a model this replica does not have",
                     atomic_load(&r->unknown_model));
    srv_prom_counter(p, "kvrouter_replica_unknown_request_total",
                     "remote first-token/free ops for requests not held here",
                     atomic_load(&r->unknown_request));
    srv_prom_counter(p, "kvrouter_replica_peer_overflow_total",
                     "messages ignored because more than 256 replicas are alive",
                     atomic_load(&r->peer_overflow));
    srv_prom_counter(p, "kvrouter_replica_nats_disconnects_total", "NATS connection losses",
                     atomic_load(&r->disconnects));
    srv_prom_counter(p, "kvrouter_replica_nats_reconnects_total", "NATS reconnections",
                     atomic_load(&r->reconnects));
    srv_prom_header(p, "kvrouter_replica_sync_delay_seconds", "histogram",
                    "from a booking on another replica to its application here (wall clocks)");
    struct srv_hist_snap snap = {{0}, 0};
    srv_hist_read(&r->delay, &snap);
    srv_prom_hist(p, "kvrouter_replica_sync_delay_seconds", NULL, 0, &delay_spec, &snap);
}
