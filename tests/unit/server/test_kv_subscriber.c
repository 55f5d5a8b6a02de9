/* test_kv_subscriber.c - the ZMQ KV-event subscriber (server/src/kv_subscriber.c) against an
 * in-test engine stand-in: an XPUB (a PUB that also reports subscriptions, so tests start
 * publishing only once the SUB is attached) and a ROUTER replay socket, on tcp://127.0.0.1 with
 * ephemeral ports or on inproc://. Spec: engine-events.md §2, §3, §10.5, §10.6, §10.14. */
#include <arpa/inet.h>
#include <check.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include "kvr/err.h"
#include "kvr/event_msgpack.h"
#include "kvr/kv_subscriber.h"
#include "vectors.h"

#define TOPIC "kv-events"
#define WAIT_MS 5000

/* ==== the sink and the log =================================================================== */

struct got {
    uint8_t kind;
    uint64_t event_id;
    uint64_t worker_id;
    uint32_t dp_rank;
    uint32_t n;
    uint64_t first; /* first block hash (stored) or removed hash */
};

struct collector {
    pthread_mutex_t mu;
    struct got ev[512];
    size_t n;
    size_t calls;
    int fail; /* sink returns -1 */
    char logs[32][256];
    size_t n_logs;
};

static int sink(void *ctx, const struct kvr_event *ev, size_t n)
{
    struct collector *c = ctx;
    pthread_mutex_lock(&c->mu);
    c->calls++;
    for (size_t k = 0; k < n && c->n < 512; k++) {
        struct got *g = &c->ev[c->n++];
        g->kind = ev[k].kind;
        g->event_id = ev[k].event_id;
        g->worker_id = ev[k].worker_id;
        g->dp_rank = ev[k].dp_rank;
        g->n = ev[k].n;
        g->first = ev[k].kind == KVR_EVENT_STORED && ev[k].n    ? ev[k].blocks[0].block_hash
                   : ev[k].kind == KVR_EVENT_REMOVED && ev[k].n ? ev[k].hashes[0]
                                                                : 0;
    }
    int fail = c->fail;
    pthread_mutex_unlock(&c->mu);
    return fail ? -1 : 0;
}

static void logger(void *ctx, int level, const char *msg)
{
    struct collector *c = ctx;
    (void)level;
    pthread_mutex_lock(&c->mu);
    if (c->n_logs < 32)
        snprintf(c->logs[c->n_logs++], 256, "%s", msg);
    pthread_mutex_unlock(&c->mu);
}

static size_t logs_containing(struct collector *c, const char *needle)
{
    size_t k = 0;
    pthread_mutex_lock(&c->mu);
    for (size_t i = 0; i < c->n_logs; i++)
        k += strstr(c->logs[i], needle) != NULL;
    pthread_mutex_unlock(&c->mu);
    return k;
}

static size_t n_events(struct collector *c)
{
    pthread_mutex_lock(&c->mu);
    size_t n = c->n;
    pthread_mutex_unlock(&c->mu);
    return n;
}

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static int wait_events(struct collector *c, size_t want)
{
    for (int t = 0; t < WAIT_MS / 5; t++) {
        if (n_events(c) >= want)
            return 1;
        sleep_ms(5);
    }
    return 0;
}

/* Waits until the source's `batches + decode_errors` reaches `want` (messages fully handled). */
static struct kvr_kvsub_stats wait_handled(kvr_kvsub_t *s, uint32_t id, uint64_t want)
{
    struct kvr_kvsub_stats st;
    for (int t = 0; t < WAIT_MS / 5; t++) {
        ck_assert_int_eq(kvr_kvsub_stats(s, id, &st), KVR_OK);
        if (st.batches + st.decode_errors >= want)
            return st;
        sleep_ms(5);
    }
    ck_abort_msg("timed out waiting for %llu handled batches", (unsigned long long)want);
    return st;
}

/* ==== the engine stand-in ===================================================================== */

struct engine {
    void *ctx;
    void *pub;    /* XPUB */
    void *router; /* replay ROUTER; NULL if none */
    char ep[256];
    char rep[256];
    kvr_alloc_t a;
};

static void bind_ephemeral(void *sock, const char *where, char *ep, size_t cap)
{
    ck_assert_int_eq(zmq_bind(sock, where), 0);
    size_t len = cap;
    ck_assert_int_eq(zmq_getsockopt(sock, ZMQ_LAST_ENDPOINT, ep, &len), 0);
}

static void engine_open(struct engine *e, void *ctx, const char *pub_ep, int with_router)
{
    memset(e, 0, sizeof(*e));
    kvr_alloc_init(&e->a);
    e->ctx = ctx;
    e->pub = zmq_socket(ctx, ZMQ_XPUB);
    int linger = 0;
    zmq_setsockopt(e->pub, ZMQ_LINGER, &linger, sizeof(linger));
    bind_ephemeral(e->pub, pub_ep ? pub_ep : "tcp://127.0.0.1:*", e->ep, sizeof(e->ep));
    if (with_router) {
        e->router = zmq_socket(ctx, ZMQ_ROUTER);
        zmq_setsockopt(e->router, ZMQ_LINGER, &linger, sizeof(linger));
        bind_ephemeral(e->router, "tcp://127.0.0.1:*", e->rep, sizeof(e->rep));
    }
}

static void engine_close(struct engine *e)
{
    zmq_close(e->pub);
    if (e->router)
        zmq_close(e->router);
}

/* Waits for the subscriber's subscription message on the XPUB. */
static void engine_wait_subscribed(struct engine *e)
{
    zmq_pollitem_t it = {e->pub, 0, ZMQ_POLLIN, 0};
    ck_assert_msg(zmq_poll(&it, 1, WAIT_MS) == 1, "no subscription within %d ms", WAIT_MS);
    uint8_t buf[256];
    int n = zmq_recv(e->pub, buf, sizeof(buf), 0);
    ck_assert_int_ge(n, 1);
    ck_assert_uint_eq(buf[0], 1); /* subscribe */
}

static void be64(uint8_t *p, uint64_t v)
{
    for (int i = 7; i >= 0; i--, v >>= 8)
        p[i] = (uint8_t)v;
}

static void send_frames(void *sock, const void *const *data, const size_t *len, int n)
{
    for (int k = 0; k < n; k++)
        ck_assert_int_ge(zmq_send(sock, data[k], len[k], k + 1 < n ? ZMQ_SNDMORE : 0), 0);
}

/* A one-event batch of publisher life `life`: BlockStored of hash `1000 + 100 * life + seq`,
 * tokens 4 * seq + 1 .. + 4, bs 4. */
static uint8_t *payload_life(struct engine *e, uint64_t seq, unsigned life, size_t *len)
{
    uint64_t h = 1000 + 100 * (uint64_t)life + seq;
    uint32_t tok[4];
    for (uint32_t t = 0; t < 4; t++)
        tok[t] = (uint32_t)(4 * seq + 1 + t);
    struct kvr_emp_event ev;
    memset(&ev, 0, sizeof(ev));
    ev.kind = KVR_EVENT_STORED;
    ev.token_width = 1;
    ev.event_version = 1;
    ev.block_size = 4;
    ev.n_hashes = 1;
    ev.hashes = &h;
    ev.n_tokens = 4;
    ev.token_ids = tok;
    ev.medium.p = "GPU";
    ev.medium.len = 3;
    struct kvr_emp_batch b;
    memset(&b, 0, sizeof(b));
    b.ts = (double)seq + 0.5 * life;
    b.n = 1;
    b.ev = &ev;
    uint8_t *out = NULL;
    ck_assert_int_eq(kvr_emp_encode(&b, KVR_EMP_ERA_B, &e->a, &out, len), KVR_OK);
    return out;
}

/* The first life's batch (the one most tests use). */
static uint8_t *payload_for(struct engine *e, uint64_t seq, size_t *len)
{
    return payload_life(e, seq, 0, len);
}

static void publish_raw(struct engine *e, const char *topic, uint64_t seq, const uint8_t *p,
                        size_t len)
{
    uint8_t s[8];
    be64(s, seq);
    const void *d[3] = {topic, s, p};
    size_t l[3] = {strlen(topic), 8, len};
    send_frames(e->pub, d, l, 3);
}

static void publish_life(struct engine *e, uint64_t seq, unsigned life)
{
    size_t len;
    uint8_t *p = payload_life(e, seq, life, &len);
    publish_raw(e, TOPIC, seq, p, len);
    kvr_free(&e->a, p);
}

static void publish(struct engine *e, uint64_t seq)
{
    publish_life(e, seq, 0);
}

/* Binds a fresh socket of `type` at `ep` (retrying while the closed one still holds the port). */
static void *rebind(void *ctx, int type, const char *ep)
{
    void *sock = zmq_socket(ctx, type);
    int linger = 0;
    zmq_setsockopt(sock, ZMQ_LINGER, &linger, sizeof(linger));
    int rc = -1;
    for (int t = 0; t < 200 && (rc = zmq_bind(sock, ep)) != 0; t++)
        sleep_ms(5);
    ck_assert_msg(rc == 0, "cannot re-bind %s: %s", ep, zmq_strerror(zmq_errno()));
    return sock;
}

/* The publisher goes away and comes back on the same endpoints: with new_router a new process
 * (its replay ring starts empty), otherwise the same process whose PUB connection broke. */
static void engine_rebind(struct engine *e, int new_router)
{
    zmq_close(e->pub);
    e->pub = rebind(e->ctx, ZMQ_XPUB, e->ep);
    if (new_router && e->router != NULL) {
        zmq_close(e->router);
        e->router = rebind(e->ctx, ZMQ_ROUTER, e->rep);
    }
}

/* Receives one replay request on the ROUTER: returns its start seq, and the identity
 * (UINT64_MAX if none came within timeout_ms). */
static uint64_t router_request(struct engine *e, uint8_t *id, size_t *id_len, int timeout_ms)
{
    zmq_pollitem_t it = {e->router, 0, ZMQ_POLLIN, 0};
    if (zmq_poll(&it, 1, timeout_ms) != 1)
        return UINT64_MAX;
    uint8_t f[3][256];
    int len[3], n = 0, more = 1;
    while (more) {
        ck_assert_int_lt(n, 3);
        len[n] = zmq_recv(e->router, f[n], 256, 0);
        ck_assert_int_ge(len[n], 0);
        size_t msz = sizeof(more);
        zmq_getsockopt(e->router, ZMQ_RCVMORE, &more, &msz);
        n++;
    }
    ck_assert_int_eq(n, 3);
    ck_assert_int_eq(len[1], 0);
    ck_assert_int_eq(len[2], 8);
    memcpy(id, f[0], (size_t)len[0]);
    *id_len = (size_t)len[0];
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v = v << 8 | f[2][i];
    return v;
}

/* Sends one reply batch (three_frame: with topic) or the end marker (p == NULL). */
static void router_reply(struct engine *e, const uint8_t *id, size_t id_len, int three_frame,
                         uint64_t seq, const uint8_t *p, size_t len)
{
    uint8_t s[8];
    be64(s, p == NULL ? UINT64_MAX : seq);
    const void *d[5];
    size_t l[5];
    int n = 0;
    d[n] = id, l[n++] = id_len;
    d[n] = "", l[n++] = 0;
    if (three_frame) {
        d[n] = p ? TOPIC : "";
        l[n++] = p ? strlen(TOPIC) : 0;
    }
    d[n] = s, l[n++] = 8;
    d[n] = p ? (const void *)p : "", l[n++] = p ? len : 0;
    send_frames(e->router, d, l, n);
}

/* Replies with batches [from, to] of publisher life `life`, then the end marker. */
static void router_reply_range(struct engine *e, const uint8_t *id, size_t id_len, uint64_t from,
                               uint64_t to, unsigned life)
{
    for (uint64_t seq = from; seq <= to; seq++) {
        size_t len;
        uint8_t *p = payload_life(e, seq, life, &len);
        router_reply(e, id, id_len, 1, seq, p, len);
        kvr_free(&e->a, p);
    }
    router_reply(e, id, id_len, 1, 0, NULL, 0);
}

/* ==== fixture ================================================================================ */

struct fx {
    void *ctx;
    struct collector c;
    kvr_kvsub_t *s;
    struct engine e;
    uint32_t id;
};

static void fx_start(struct fx *f, int with_router, uint32_t replay_timeout_ms)
{
    memset(f, 0, sizeof(*f));
    pthread_mutex_init(&f->c.mu, NULL);
    f->ctx = zmq_ctx_new();
    struct kvr_kvsub_config cfg = {0};
    cfg.zmq_ctx = f->ctx;
    cfg.sink = sink;
    cfg.sink_ctx = &f->c;
    cfg.log = logger;
    cfg.log_ctx = &f->c;
    cfg.replay_timeout_ms = replay_timeout_ms;
    ck_assert_int_eq(kvr_kvsub_new(&cfg, &f->s), KVR_OK);
    engine_open(&f->e, f->ctx, NULL, with_router);
    struct kvr_kvsub_source_config sc = {0};
    sc.worker_id = 7;
    sc.dp_rank = 0;
    sc.block_size = 4;
    sc.endpoint = f->e.ep;
    sc.replay_endpoint = with_router ? f->e.rep : NULL;
    sc.topic = TOPIC;
    sc.topic_len = strlen(TOPIC);
    ck_assert_int_eq(kvr_kvsub_add(f->s, &sc, &f->id), KVR_OK);
    engine_wait_subscribed(&f->e);
}

static void fx_stop(struct fx *f)
{
    kvr_kvsub_free(f->s);
    engine_close(&f->e);
    zmq_ctx_term(f->ctx);
    pthread_mutex_destroy(&f->c.mu);
}

static void assert_event_ids(struct collector *c, const uint64_t *want, size_t n)
{
    pthread_mutex_lock(&c->mu);
    ck_assert_uint_eq(c->n, n);
    for (size_t k = 0; k < n; k++) {
        ck_assert_uint_eq(c->ev[k].event_id, want[k]);
        if (c->ev[k].kind == KVR_EVENT_STORED)
            ck_assert_uint_eq(c->ev[k].first, 1000 + want[k]);
    }
    pthread_mutex_unlock(&c->mu);
}

/* ==== api ==================================================================================== */

START_TEST(test_live_batches)
{
    struct fx f;
    fx_start(&f, 0, 0);
    for (uint64_t seq = 0; seq < 3; seq++)
        publish(&f.e, seq);
    /* the spec's V1 vector on the wire, as seq 3 */
    size_t len;
    uint8_t *v1 = kvr_test_read_data("kv-events-vectors/vllm_map_v1_blockstored.msgpack", &len);
    ck_assert_ptr_nonnull(v1);
    publish_raw(&f.e, TOPIC, 3, v1, len);
    free(v1);
    ck_assert(wait_events(&f.c, 4));
    struct kvr_kvsub_stats st = wait_handled(f.s, f.id, 4);
    const uint64_t want[] = {0, 1, 2};
    pthread_mutex_lock(&f.c.mu);
    for (size_t k = 0; k < 3; k++) {
        ck_assert_int_eq(f.c.ev[k].kind, KVR_EVENT_STORED);
        ck_assert_uint_eq(f.c.ev[k].event_id, want[k]);
        ck_assert_uint_eq(f.c.ev[k].worker_id, 7);
        ck_assert_uint_eq(f.c.ev[k].first, 1000 + k);
    }
    ck_assert_uint_eq(f.c.ev[3].first, 0xDEADBEEFCAFEF00DULL);
    ck_assert_uint_eq(f.c.ev[3].event_id, 3);
    pthread_mutex_unlock(&f.c.mu);
    ck_assert_uint_eq(st.batches, 4);
    ck_assert_uint_eq(st.messages, 4);
    ck_assert_uint_eq(st.events[KVR_EVENT_STORED], 4);
    ck_assert(st.has_seq && st.last_seq == 3);
    ck_assert_uint_eq(st.dialects, KVR_EMP_DIALECT_B);
    ck_assert_uint_eq(st.gaps + st.lost_batches + st.decode_errors + st.restarts, 0);
    ck_assert_uint_eq(st.conv.blocks, 4);
    ck_assert_uint_eq(f.c.n_logs, 0);
    fx_stop(&f);
}
END_TEST

/* §10.14: gap (0, 1, 3) with a replay endpoint: exactly one request, from 2; the replayed batch
 * and the queued live one are delivered in order, the duplicate dropped. */
static void gap_replay(int three_frame)
{
    struct fx f;
    fx_start(&f, 1, 0);
    publish(&f.e, 0);
    publish(&f.e, 1);
    publish(&f.e, 3);
    uint8_t id[256];
    size_t id_len;
    ck_assert_uint_eq(router_request(&f.e, id, &id_len, WAIT_MS), 2);
    /* the engine replays everything it has from 2 on: 2 and 3 */
    for (uint64_t seq = 2; seq <= 3; seq++) {
        size_t len;
        uint8_t *p = payload_for(&f.e, seq, &len);
        router_reply(&f.e, id, id_len, three_frame, seq, p, len);
        kvr_free(&f.e.a, p);
    }
    router_reply(&f.e, id, id_len, three_frame, 0, NULL, 0);
    ck_assert(wait_events(&f.c, 4));
    publish(&f.e, 4);
    ck_assert(wait_events(&f.c, 5));
    struct kvr_kvsub_stats st = wait_handled(f.s, f.id, 5);
    const uint64_t want[] = {0, 1, 2, 3, 4};
    assert_event_ids(&f.c, want, 5);
    ck_assert_uint_eq(st.gaps, 1);
    ck_assert_uint_eq(st.replay_requests, 1);
    ck_assert_uint_eq(st.replayed_batches, 2);
    ck_assert_uint_eq(st.replay_duplicates, 1);
    ck_assert_uint_eq(st.lost_batches, 0);
    ck_assert_uint_eq(st.replay_failures, 0);
    ck_assert_uint_eq(st.last_seq, 4);
    /* no second request */
    ck_assert_uint_eq(router_request(&f.e, id, &id_len, 200), UINT64_MAX);
    fx_stop(&f);
}

START_TEST(test_gap_replay_three_frame)
{
    gap_replay(1);
}
END_TEST

START_TEST(test_gap_replay_two_frame)
{
    gap_replay(0);
}
END_TEST

/* The replay buffer no longer reaches back: what it lacks is counted lost, no second request. */
START_TEST(test_replay_partial)
{
    struct fx f;
    fx_start(&f, 1, 0);
    publish(&f.e, 0);
    publish(&f.e, 5);
    uint8_t id[256];
    size_t id_len;
    ck_assert_uint_eq(router_request(&f.e, id, &id_len, WAIT_MS), 1);
    size_t len;
    uint8_t *p = payload_for(&f.e, 3, &len); /* the ring starts at 3 */
    router_reply(&f.e, id, id_len, 1, 3, p, len);
    kvr_free(&f.e.a, p);
    router_reply(&f.e, id, id_len, 1, 0, NULL, 0);
    ck_assert(wait_events(&f.c, 3));
    struct kvr_kvsub_stats st = wait_handled(f.s, f.id, 3);
    const uint64_t want[] = {0, 3, 5};
    assert_event_ids(&f.c, want, 3);
    ck_assert_uint_eq(st.lost_batches, 3); /* 1, 2 and 4 */
    ck_assert_uint_eq(st.replay_requests, 1);
    ck_assert_uint_eq(router_request(&f.e, id, &id_len, 200), UINT64_MAX);
    fx_stop(&f);
}
END_TEST

/* Without a replay endpoint the missing batches are counted lost. */
START_TEST(test_gap_without_replay)
{
    struct fx f;
    fx_start(&f, 0, 0);
    publish(&f.e, 0);
    publish(&f.e, 1);
    publish(&f.e, 3);
    ck_assert(wait_events(&f.c, 3));
    struct kvr_kvsub_stats st = wait_handled(f.s, f.id, 3);
    const uint64_t want[] = {0, 1, 3};
    assert_event_ids(&f.c, want, 3);
    ck_assert_uint_eq(st.gaps, 1);
    ck_assert_uint_eq(st.lost_batches, 1);
    ck_assert_uint_eq(st.replay_requests, 0);
    ck_assert_uint_eq(logs_containing(&f.c, "lost"), 1);
    fx_stop(&f);
}
END_TEST

/* A replay endpoint that never answers: after the timeout the queue applies, the gap is lost. */
START_TEST(test_replay_timeout)
{
    struct fx f;
    fx_start(&f, 1, 300);
    publish(&f.e, 0);
    publish(&f.e, 2);
    uint8_t id[256];
    size_t id_len;
    ck_assert_uint_eq(router_request(&f.e, id, &id_len, WAIT_MS), 1);
    publish(&f.e, 3); /* queued behind the replay */
    sleep_ms(100);
    ck_assert_uint_eq(n_events(&f.c), 1);
    ck_assert(wait_events(&f.c, 3));
    struct kvr_kvsub_stats st = wait_handled(f.s, f.id, 3);
    const uint64_t want[] = {0, 2, 3};
    assert_event_ids(&f.c, want, 3);
    ck_assert_uint_eq(st.replay_failures, 1);
    ck_assert_uint_eq(st.lost_batches, 1);
    ck_assert_uint_eq(logs_containing(&f.c, "timed out"), 1);
    fx_stop(&f);
}
END_TEST

/* §10.5: 2- and 4-frame messages, 7- and 9-byte seq frames, a truncated payload: counted, logged
 * once per kind, and the stream goes on. */
START_TEST(test_malformed_messages)
{
    struct fx f;
    fx_start(&f, 0, 0);
    publish(&f.e, 0);
    size_t len;
    uint8_t *p = payload_for(&f.e, 1, &len);
    uint8_t s9[9] = {0}, s7[7] = {0};
    const void *two[2] = {TOPIC, p};
    size_t two_l[2] = {strlen(TOPIC), len};
    send_frames(f.e.pub, two, two_l, 2);
    uint8_t s8[8];
    be64(s8, 1);
    const void *four[4] = {TOPIC, s8, p, p};
    size_t four_l[4] = {strlen(TOPIC), 8, len, len};
    send_frames(f.e.pub, four, four_l, 4);
    send_frames(f.e.pub, four, four_l, 4);
    const void *bad7[3] = {TOPIC, s7, p};
    size_t bad7_l[3] = {strlen(TOPIC), 7, len};
    send_frames(f.e.pub, bad7, bad7_l, 3);
    const void *bad9[3] = {TOPIC, s9, p};
    size_t bad9_l[3] = {strlen(TOPIC), 9, len};
    send_frames(f.e.pub, bad9, bad9_l, 3);
    publish_raw(&f.e, TOPIC, 1, p, len - 1); /* truncated: seq 1 is seen but not applied */
    kvr_free(&f.e.a, p);
    publish(&f.e, 2);
    ck_assert(wait_events(&f.c, 2));
    struct kvr_kvsub_stats st = wait_handled(f.s, f.id, 3);
    const uint64_t want[] = {0, 2};
    assert_event_ids(&f.c, want, 2);
    ck_assert_uint_eq(st.messages, 8);
    ck_assert_uint_eq(st.bad_frames, 3);
    ck_assert_uint_eq(st.bad_seq, 2);
    ck_assert_uint_eq(st.decode_errors, 1);
    ck_assert_uint_eq(st.dec.errors[KVR_EMP_E_TRUNCATED], 1);
    ck_assert_uint_eq(st.dec.failed_by_dialect[2], 1);
    ck_assert_uint_eq(st.batches, 2);
    ck_assert_uint_eq(st.gaps, 0); /* the malformed seq 1 still counts as seen */
    ck_assert_uint_eq(logs_containing(&f.c, "frames (expected 3)"), 1);
    ck_assert_uint_eq(logs_containing(&f.c, "seq frame of"), 1);
    ck_assert_uint_eq(logs_containing(&f.c, "malformed batch (truncated)"), 1);
    fx_stop(&f);
}
END_TEST

/* seq back to 0: the publisher restarted; the rank is cleared before the new batch applies. */
START_TEST(test_restart)
{
    struct fx f;
    fx_start(&f, 0, 0);
    publish(&f.e, 0);
    publish(&f.e, 1);
    publish(&f.e, 2);
    publish(&f.e, 0);
    publish(&f.e, 1);
    ck_assert(wait_events(&f.c, 6));
    struct kvr_kvsub_stats st = wait_handled(f.s, f.id, 5);
    pthread_mutex_lock(&f.c.mu);
    ck_assert_uint_eq(f.c.n, 6);
    ck_assert_int_eq(f.c.ev[3].kind, KVR_EVENT_CLEARED);
    ck_assert_uint_eq(f.c.ev[3].worker_id, 7);
    ck_assert_uint_eq(f.c.ev[3].dp_rank, 0);
    ck_assert_int_eq(f.c.ev[4].kind, KVR_EVENT_STORED);
    ck_assert_uint_eq(f.c.ev[4].event_id, 0);
    ck_assert_uint_eq(f.c.ev[5].event_id, 1);
    pthread_mutex_unlock(&f.c.mu);
    ck_assert_uint_eq(st.restarts, 1);
    ck_assert_uint_eq(st.clears, 1);
    ck_assert_uint_eq(st.gaps, 0);
    ck_assert_uint_eq(st.last_seq, 1);
    fx_stop(&f);
}
END_TEST

/* Only the topic prefix configured is received; sink errors are counted, not fatal. */
START_TEST(test_topic_filter_and_sink_errors)
{
    struct fx f;
    fx_start(&f, 0, 0);
    size_t len;
    uint8_t *p = payload_for(&f.e, 0, &len);
    publish_raw(&f.e, "other-topic", 0, p, len);
    publish_raw(&f.e, TOPIC "@pod-1", 0, p, len); /* prefix match */
    kvr_free(&f.e.a, p);
    ck_assert(wait_events(&f.c, 1));
    pthread_mutex_lock(&f.c.mu);
    f.c.fail = 1;
    pthread_mutex_unlock(&f.c.mu);
    publish(&f.e, 1);
    publish(&f.e, 2);
    ck_assert(wait_events(&f.c, 3));
    struct kvr_kvsub_stats st = wait_handled(f.s, f.id, 3);
    ck_assert_uint_eq(st.messages, 3);
    ck_assert_uint_eq(st.sink_errors, 2);
    ck_assert_uint_eq(logs_containing(&f.c, "sink rejected"), 1);
    fx_stop(&f);
}
END_TEST

/* inproc endpoints with the dp-rank offset (§1): rank 1 listens on "<base>_dp1"; a nil batch rank
 * means the registered rank. */
START_TEST(test_inproc_rank_offset)
{
    struct collector c;
    memset(&c, 0, sizeof(c));
    pthread_mutex_init(&c.mu, NULL);
    void *ctx = zmq_ctx_new();
    kvr_kvsub_t *s;
    struct kvr_kvsub_config cfg = {0};
    cfg.zmq_ctx = ctx;
    cfg.sink = sink;
    cfg.sink_ctx = &c;
    cfg.log = logger;
    cfg.log_ctx = &c;
    ck_assert_int_eq(kvr_kvsub_new(&cfg, &s), KVR_OK);
    struct engine e;
    engine_open(&e, ctx, "inproc://kv-worker-9_dp1", 0);
    struct kvr_kvsub_source_config sc = {0};
    sc.worker_id = 9;
    sc.dp_rank = 1;
    sc.block_size = 1;
    sc.endpoint = "inproc://kv-worker-9";
    sc.offset_by_rank = 1;
    uint32_t id;
    ck_assert_int_eq(kvr_kvsub_add(s, &sc, &id), KVR_OK);
    engine_wait_subscribed(&e);
    size_t len;
    uint8_t *v3 =
        kvr_test_read_data("kv-events-vectors/legacy_array_v3_signed_hashes.msgpack", &len);
    ck_assert_ptr_nonnull(v3);
    publish_raw(&e, "", 0, v3, len);
    free(v3);
    ck_assert(wait_events(&c, 3));
    struct kvr_kvsub_stats st = wait_handled(s, id, 1);
    ck_assert_uint_eq(st.dialects, KVR_EMP_DIALECT_A);
    pthread_mutex_lock(&c.mu);
    for (size_t k = 0; k < 3; k++) {
        ck_assert_uint_eq(c.ev[k].worker_id, 9);
        ck_assert_uint_eq(c.ev[k].dp_rank, 1);
    }
    ck_assert_int_eq(c.ev[0].kind, KVR_EVENT_STORED);
    ck_assert_uint_eq(c.ev[0].n, 2);
    ck_assert_uint_eq(c.ev[0].first, 18446744073709551614ULL);
    ck_assert_int_eq(c.ev[1].kind, KVR_EVENT_REMOVED);
    ck_assert_int_eq(c.ev[2].kind, KVR_EVENT_CLEARED);
    pthread_mutex_unlock(&c.mu);
    kvr_kvsub_free(s);
    engine_close(&e);
    zmq_ctx_term(ctx);
    pthread_mutex_destroy(&c.mu);
}
END_TEST

START_TEST(test_rank_endpoint)
{
    char out[64];
    ck_assert_int_eq(kvr_kvsub_rank_endpoint("tcp://*:5557", 1, out, sizeof(out)), KVR_OK);
    ck_assert_str_eq(out, "tcp://*:5558");
    ck_assert_int_eq(kvr_kvsub_rank_endpoint("tcp://10.0.0.5:5557", 0, out, sizeof(out)), KVR_OK);
    ck_assert_str_eq(out, "tcp://10.0.0.5:5557");
    ck_assert_int_eq(kvr_kvsub_rank_endpoint("tcp://[::1]:5557", 3, out, sizeof(out)), KVR_OK);
    ck_assert_str_eq(out, "tcp://[::1]:5560");
    ck_assert_int_eq(kvr_kvsub_rank_endpoint("inproc://x", 1, out, sizeof(out)), KVR_OK);
    ck_assert_str_eq(out, "inproc://x_dp1");
    ck_assert_int_eq(kvr_kvsub_rank_endpoint("inproc://x", 0, out, sizeof(out)), KVR_OK);
    ck_assert_str_eq(out, "inproc://x");
    ck_assert_int_eq(kvr_kvsub_rank_endpoint("ipc:///tmp/kv", 2, out, sizeof(out)), KVR_OK);
    ck_assert_str_eq(out, "ipc:///tmp/kv_dp2");
    ck_assert_int_eq(kvr_kvsub_rank_endpoint("tcp://h:*", 1, out, sizeof(out)), KVR_EINVAL);
    ck_assert_int_eq(kvr_kvsub_rank_endpoint("tcp://h:65535", 1, out, sizeof(out)), KVR_EINVAL);
    ck_assert_int_eq(kvr_kvsub_rank_endpoint("tcp://h", 1, out, sizeof(out)), KVR_EINVAL);
    ck_assert_int_eq(kvr_kvsub_rank_endpoint("udp://h:1", 1, out, sizeof(out)), KVR_EINVAL);
    ck_assert_int_eq(kvr_kvsub_rank_endpoint("tcp://host:5557", 1, out, 10), KVR_ERANGE);
}
END_TEST

START_TEST(test_api_errors)
{
    struct collector c;
    memset(&c, 0, sizeof(c));
    pthread_mutex_init(&c.mu, NULL);
    kvr_kvsub_t *s;
    struct kvr_kvsub_config cfg = {0};
    ck_assert_int_eq(kvr_kvsub_new(&cfg, &s), KVR_EINVAL); /* no sink */
    cfg.sink = sink;
    cfg.sink_ctx = &c;
    ck_assert_int_eq(kvr_kvsub_new(&cfg, &s), KVR_OK); /* own context */
    struct kvr_kvsub_source_config sc = {0};
    sc.worker_id = 1;
    sc.block_size = 16;
    uint32_t id, id2, found;
    ck_assert_int_eq(kvr_kvsub_add(s, &sc, &id), KVR_EINVAL); /* no endpoint */
    sc.endpoint = "bogus://x";
    ck_assert_int_eq(kvr_kvsub_add(s, &sc, &id), KVR_EINVAL);
    sc.endpoint = "tcp://127.0.0.1:1"; /* nothing there: connect still succeeds (async) */
    sc.block_size = 0;
    ck_assert_int_eq(kvr_kvsub_add(s, &sc, &id), KVR_EINVAL);
    sc.block_size = 16;
    ck_assert_int_eq(kvr_kvsub_add(s, &sc, &id), KVR_OK);
    ck_assert_int_eq(kvr_kvsub_add(s, &sc, &id2), KVR_EEXIST);
    sc.dp_rank = 1;
    sc.offset_by_rank = 1;
    sc.replay_endpoint = "tcp://127.0.0.1:*"; /* cannot be offset */
    ck_assert_int_eq(kvr_kvsub_add(s, &sc, &id2), KVR_EINVAL);
    sc.replay_endpoint = "tcp://127.0.0.1:3";
    ck_assert_int_eq(kvr_kvsub_add(s, &sc, &id2), KVR_OK);
    ck_assert_uint_ne(id, id2);
    ck_assert_int_eq(kvr_kvsub_find(s, 1, 1, &found), 1);
    ck_assert_uint_eq(found, id2);
    ck_assert_int_eq(kvr_kvsub_find(s, 1, 2, &found), 0);
    struct kvr_kvsub_stats st;
    ck_assert_int_eq(kvr_kvsub_stats(s, id2, &st), KVR_OK);
    ck_assert_uint_eq(st.worker_id, 1);
    ck_assert_uint_eq(st.dp_rank, 1);
    ck_assert(!st.has_seq);
    ck_assert_int_eq(kvr_kvsub_remove(s, id2), KVR_OK);
    ck_assert_int_eq(kvr_kvsub_remove(s, id2), KVR_ENOTFOUND);
    ck_assert_int_eq(kvr_kvsub_stats(s, id2, &st), KVR_ENOTFOUND);
    ck_assert_int_eq(kvr_kvsub_find(s, 1, 0, &found), 1);
    /* many sources: the array grows while stats readers may look */
    for (uint32_t k = 0; k < 40; k++) {
        sc.worker_id = 100 + k;
        sc.dp_rank = 0;
        sc.offset_by_rank = 0;
        sc.replay_endpoint = NULL;
        ck_assert_int_eq(kvr_kvsub_add(s, &sc, &id2), KVR_OK);
    }
    ck_assert_int_eq(kvr_kvsub_find(s, 139, 0, &found), 1);
    kvr_kvsub_free(s);
    kvr_kvsub_free(NULL);
    pthread_mutex_destroy(&c.mu);
}
END_TEST

/* ==== restarts behind a reconnect ============================================================= */

/* Waits until pred(stats) holds. */
static struct kvr_kvsub_stats wait_stats(kvr_kvsub_t *s, uint32_t id,
                                         int (*pred)(const struct kvr_kvsub_stats *),
                                         const char *what)
{
    struct kvr_kvsub_stats st;
    for (int t = 0; t < WAIT_MS / 5; t++) {
        ck_assert_int_eq(kvr_kvsub_stats(s, id, &st), KVR_OK);
        if (pred(&st))
            return st;
        sleep_ms(5);
    }
    ck_abort_msg("timed out waiting for %s", what);
    return st;
}

static int disconnected(const struct kvr_kvsub_stats *st)
{
    return st->disconnects >= 1;
}

/* Checks event k: kind, first block hash (stored) and event id. */
static void assert_event(struct collector *c, size_t k, int kind, uint64_t first, uint64_t id)
{
    pthread_mutex_lock(&c->mu);
    ck_assert_uint_gt(c->n, k);
    struct got g = c->ev[k];
    pthread_mutex_unlock(&c->mu);
    ck_assert_int_eq(g.kind, kind);
    ck_assert_uint_eq(g.worker_id, 7);
    ck_assert_uint_eq(g.dp_rank, 0);
    if (kind == KVR_EVENT_STORED) {
        ck_assert_uint_eq(g.first, first);
        ck_assert_uint_eq(g.event_id, id);
    }
}

/* The bug this guards against: a publisher restarted while the SUB was away publishes before the
 * SUB is back, so the first batch seen is not seq 0 and "seq went back" never fires; its seq 3
 * was taken for a gap in the old stream and the old blocks stayed. Now: the disconnect is seen,
 * the first batch after it is not `next` (2), so the rank is cleared and the new life's 0..2
 * are counted lost (no replay endpoint). */
START_TEST(test_reconnect_restart_without_replay)
{
    struct fx f;
    fx_start(&f, 0, 0);
    publish(&f.e, 0);
    publish(&f.e, 1);
    ck_assert(wait_events(&f.c, 2));
    engine_rebind(&f.e, 1);
    for (uint64_t seq = 0; seq < 3; seq++)
        publish_life(&f.e, seq, 1); /* nobody subscribed yet: never seen */
    engine_wait_subscribed(&f.e);
    publish_life(&f.e, 3, 1);
    ck_assert(wait_events(&f.c, 4));
    struct kvr_kvsub_stats st = wait_handled(f.s, f.id, 3);
    assert_event(&f.c, 0, KVR_EVENT_STORED, 1000, 0);
    assert_event(&f.c, 1, KVR_EVENT_STORED, 1001, 1);
    assert_event(&f.c, 2, KVR_EVENT_CLEARED, 0, 0);
    assert_event(&f.c, 3, KVR_EVENT_STORED, 1103, 3);
    ck_assert_uint_eq(n_events(&f.c), 4);
    ck_assert_uint_eq(st.disconnects, 1);
    ck_assert_uint_eq(st.restarts, 1);
    ck_assert_uint_eq(st.clears, 1);
    ck_assert_uint_eq(st.lost_batches, 3); /* the new life's 0, 1 and 2 */
    ck_assert_uint_eq(st.restart_probes, 0);
    ck_assert_uint_eq(st.last_seq, 3);
    ck_assert_uint_eq(logs_containing(&f.c, "seq jumped ahead after a reconnect"), 1);
    fx_stop(&f);
}
END_TEST

/* After a disconnect the batch `next` continues the stream: no clear. */
START_TEST(test_reconnect_continuation)
{
    struct fx f;
    fx_start(&f, 0, 0);
    publish(&f.e, 0);
    publish(&f.e, 1);
    ck_assert(wait_events(&f.c, 2));
    engine_rebind(&f.e, 0);
    engine_wait_subscribed(&f.e);
    wait_stats(f.s, f.id, disconnected, "the disconnect");
    publish(&f.e, 2);
    ck_assert(wait_events(&f.c, 3));
    struct kvr_kvsub_stats st = wait_handled(f.s, f.id, 3);
    const uint64_t want[] = {0, 1, 2};
    assert_event_ids(&f.c, want, 3);
    ck_assert_uint_eq(st.disconnects, 1);
    ck_assert_uint_eq(st.restarts + st.clears + st.lost_batches + st.gaps, 0);
    fx_stop(&f);
}
END_TEST

/* With a replay endpoint the reconnect itself is probed: a request from the last applied seq
 * (1). A new process answers with another batch 1: the rank is cleared at once and the new
 * life is replayed from 0, so nothing it published before the SUB came back is lost. */
START_TEST(test_reconnect_probe_detects_restart)
{
    struct fx f;
    fx_start(&f, 1, 0);
    publish(&f.e, 0);
    publish(&f.e, 1);
    ck_assert(wait_events(&f.c, 2));
    engine_rebind(&f.e, 1);
    for (uint64_t seq = 0; seq < 3; seq++)
        publish_life(&f.e, seq, 1); /* never seen live */
    uint8_t id[256];
    size_t id_len;
    ck_assert_uint_eq(router_request(&f.e, id, &id_len, WAIT_MS), 1); /* the probe */
    router_reply_range(&f.e, id, id_len, 1, 2, 1);
    ck_assert_uint_eq(router_request(&f.e, id, &id_len, WAIT_MS), 0); /* the new life, whole */
    router_reply_range(&f.e, id, id_len, 0, 2, 1);
    ck_assert(wait_events(&f.c, 6));
    engine_wait_subscribed(&f.e);
    publish_life(&f.e, 3, 1);
    ck_assert(wait_events(&f.c, 7));
    struct kvr_kvsub_stats st = wait_handled(f.s, f.id, 6);
    assert_event(&f.c, 0, KVR_EVENT_STORED, 1000, 0);
    assert_event(&f.c, 1, KVR_EVENT_STORED, 1001, 1);
    assert_event(&f.c, 2, KVR_EVENT_CLEARED, 0, 0);
    for (uint64_t k = 0; k < 4; k++)
        assert_event(&f.c, 3 + k, KVR_EVENT_STORED, 1100 + k, k);
    ck_assert_uint_eq(n_events(&f.c), 7);
    ck_assert_uint_eq(st.restarts, 1);
    ck_assert_uint_eq(st.restart_probes, 1);
    ck_assert_uint_eq(st.replay_requests, 2);
    ck_assert_uint_eq(st.replayed_batches, 3);
    ck_assert_uint_eq(st.lost_batches, 0);
    ck_assert_uint_eq(st.clears, 1);
    ck_assert_uint_eq(st.last_seq, 3);
    ck_assert_uint_eq(logs_containing(&f.c, "reconnect probe: batch 1 differs"), 1);
    ck_assert_uint_eq(router_request(&f.e, id, &id_len, 200), UINT64_MAX);
    fx_stop(&f);
}
END_TEST

/* The probe finds the same publisher (its batch 1 is the one applied): nothing is cleared and
 * the replay fills what the outage lost (batch 2, published while nobody was subscribed). */
START_TEST(test_reconnect_probe_same_publisher)
{
    struct fx f;
    fx_start(&f, 1, 0);
    publish(&f.e, 0);
    publish(&f.e, 1);
    ck_assert(wait_events(&f.c, 2));
    engine_rebind(&f.e, 0);
    publish(&f.e, 2); /* lost live */
    uint8_t id[256];
    size_t id_len;
    ck_assert_uint_eq(router_request(&f.e, id, &id_len, WAIT_MS), 1);
    router_reply_range(&f.e, id, id_len, 1, 2, 0);
    ck_assert(wait_events(&f.c, 3));
    engine_wait_subscribed(&f.e);
    publish(&f.e, 3);
    ck_assert(wait_events(&f.c, 4));
    struct kvr_kvsub_stats st = wait_handled(f.s, f.id, 4);
    const uint64_t want[] = {0, 1, 2, 3};
    assert_event_ids(&f.c, want, 4);
    ck_assert_uint_eq(st.disconnects, 1);
    ck_assert_uint_eq(st.restart_probes, 1);
    ck_assert_uint_eq(st.restarts + st.clears + st.lost_batches, 0);
    ck_assert_uint_eq(st.replayed_batches, 1);
    ck_assert_uint_eq(st.replay_duplicates, 1);
    ck_assert_uint_eq(logs_containing(&f.c, "same publisher"), 1);
    fx_stop(&f);
}
END_TEST

/* A restart seen at seq > 0 (here on the same connection) is a gap from 0: replayed. */
START_TEST(test_restart_above_zero_replays_from_zero)
{
    struct fx f;
    fx_start(&f, 1, 0);
    for (uint64_t seq = 0; seq < 3; seq++)
        publish(&f.e, seq);
    ck_assert(wait_events(&f.c, 3));
    publish_life(&f.e, 1, 1);
    uint8_t id[256];
    size_t id_len;
    ck_assert_uint_eq(router_request(&f.e, id, &id_len, WAIT_MS), 0);
    router_reply_range(&f.e, id, id_len, 0, 1, 1);
    ck_assert(wait_events(&f.c, 6));
    struct kvr_kvsub_stats st = wait_handled(f.s, f.id, 5);
    assert_event(&f.c, 3, KVR_EVENT_CLEARED, 0, 0);
    assert_event(&f.c, 4, KVR_EVENT_STORED, 1100, 0);
    assert_event(&f.c, 5, KVR_EVENT_STORED, 1101, 1);
    ck_assert_uint_eq(st.restarts, 1);
    ck_assert_uint_eq(st.replayed_batches, 2);
    ck_assert_uint_eq(st.replay_duplicates, 1); /* the live 1, queued behind the replay */
    ck_assert_uint_eq(st.lost_batches, 0);
    ck_assert_uint_eq(st.last_seq, 1);
    fx_stop(&f);
}
END_TEST

/* ==== heartbeats ============================================================================== */

/* A PUB peer at the byte level: completes the ZMTP 3.1 NULL handshake, then stays silent with
 * the TCP connection up (a frozen process or a vanished host). */
static int fake_listen(uint16_t *port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    ck_assert_int_ge(fd, 0);
    struct sockaddr_in a;
    memset(&a, 0, sizeof(a));
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ck_assert_int_eq(bind(fd, (struct sockaddr *)&a, sizeof(a)), 0);
    ck_assert_int_eq(listen(fd, 8), 0);
    socklen_t len = sizeof(a);
    ck_assert_int_eq(getsockname(fd, (struct sockaddr *)&a, &len), 0);
    *port = ntohs(a.sin_port);
    return fd;
}

static int fake_accept(int lfd)
{
    struct pollfd p = {lfd, POLLIN, 0};
    ck_assert_msg(poll(&p, 1, WAIT_MS) == 1, "the SUB did not connect");
    int fd = accept(lfd, NULL, NULL);
    ck_assert_int_ge(fd, 0);
    uint8_t g[64 + 27];
    memset(g, 0, sizeof(g));
    g[0] = 0xFF; /* signature: ff, 8 bytes of padding, 7f */
    g[9] = 0x7F;
    g[10] = 3; /* version 3.1 */
    g[11] = 1;
    memcpy(g + 12, "NULL", 4); /* mechanism (20 bytes), as-server 0, filler (31 bytes) */
    /* READY command: flags 0x04, size 25, "READY", property Socket-Type = "PUB" */
    static const uint8_t ready[27] = {0x04, 25,  5,   'R', 'E', 'A', 'D', 'Y', 11,
                                      'S',  'o', 'c', 'k', 'e', 't', '-', 'T', 'y',
                                      'p',  'e', 0,   0,   0,   3,   'P', 'U', 'B'};
    memcpy(g + 64, ready, sizeof(ready));
    ck_assert_int_eq(write(fd, g, sizeof(g)), (ssize_t)sizeof(g));
    return fd;
}

/* Reads (and ignores: no PONG) whatever the SUB sends for up to ms; 1 if it closed. */
static int fake_closed_within(int fd, int ms)
{
    for (int t = 0; t < ms / 10; t++) {
        struct pollfd p = {fd, POLLIN, 0};
        if (poll(&p, 1, 10) == 1) {
            uint8_t buf[512];
            ssize_t n = read(fd, buf, sizeof(buf));
            if (n <= 0)
                return 1;
        }
    }
    return 0;
}

static void silent_peer(int heartbeat_ms, int expect_drop)
{
    struct collector c;
    memset(&c, 0, sizeof(c));
    pthread_mutex_init(&c.mu, NULL);
    kvr_kvsub_t *s;
    struct kvr_kvsub_config cfg = {0};
    cfg.sink = sink;
    cfg.sink_ctx = &c;
    cfg.log = logger;
    cfg.log_ctx = &c;
    cfg.heartbeat_ms = heartbeat_ms;
    ck_assert_int_eq(kvr_kvsub_new(&cfg, &s), KVR_OK);
    uint16_t port;
    int lfd = fake_listen(&port);
    char ep[64];
    snprintf(ep, sizeof(ep), "tcp://127.0.0.1:%u", port);
    struct kvr_kvsub_source_config sc = {0};
    sc.worker_id = 7;
    sc.block_size = 4;
    sc.endpoint = ep;
    uint32_t id;
    ck_assert_int_eq(kvr_kvsub_add(s, &sc, &id), KVR_OK);
    int fd = fake_accept(lfd);
    ck_assert_int_eq(fake_closed_within(fd, expect_drop ? WAIT_MS : 1000), expect_drop);
    if (expect_drop)
        wait_stats(s, id, disconnected, "the heartbeat disconnect");
    struct kvr_kvsub_stats st;
    ck_assert_int_eq(kvr_kvsub_stats(s, id, &st), KVR_OK);
    ck_assert_uint_eq(st.disconnects >= 1, expect_drop);
    kvr_kvsub_free(s);
    close(fd);
    close(lfd);
    pthread_mutex_destroy(&c.mu);
}

/* 100 ms heartbeats: a peer that never answers a PING is dropped (then reconnected). */
START_TEST(test_heartbeat_drops_silent_peer)
{
    silent_peer(100, 1);
}
END_TEST

/* The control: without heartbeats the same peer keeps its connection (so the handshake above is
 * valid and the drop is the heartbeat's doing). */
START_TEST(test_no_heartbeat_keeps_silent_peer)
{
    silent_peer(-1, 0);
}
END_TEST

Suite *kv_subscriber_suite(void);
Suite *kv_subscriber_suite(void)
{
    Suite *s = suite_create("kv_subscriber");
    TCase *api = tcase_create("api");
    tcase_set_timeout(api, 60);
    tcase_add_test(api, test_live_batches);
    tcase_add_test(api, test_gap_replay_three_frame);
    tcase_add_test(api, test_gap_replay_two_frame);
    tcase_add_test(api, test_replay_partial);
    tcase_add_test(api, test_gap_without_replay);
    tcase_add_test(api, test_replay_timeout);
    tcase_add_test(api, test_restart);
    tcase_add_test(api, test_topic_filter_and_sink_errors);
    tcase_add_test(api, test_inproc_rank_offset);
    tcase_add_test(api, test_rank_endpoint);
    tcase_add_test(api, test_api_errors);
    suite_add_tcase(s, api);
    TCase *edge = tcase_create("edge");
    tcase_set_timeout(edge, 60);
    tcase_add_test(edge, test_malformed_messages);
    suite_add_tcase(s, edge);
    TCase *rc = tcase_create("reconnect");
    tcase_set_timeout(rc, 60);
    tcase_add_test(rc, test_reconnect_restart_without_replay);
    tcase_add_test(rc, test_reconnect_continuation);
    tcase_add_test(rc, test_reconnect_probe_detects_restart);
    tcase_add_test(rc, test_reconnect_probe_same_publisher);
    tcase_add_test(rc, test_restart_above_zero_replays_from_zero);
    tcase_add_test(rc, test_heartbeat_drops_silent_peer);
    tcase_add_test(rc, test_no_heartbeat_keeps_silent_peer);
    suite_add_tcase(s, rc);
    return s;
}
