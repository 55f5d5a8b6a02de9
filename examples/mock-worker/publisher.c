/* publisher.c - the mock worker's KV-event publisher: vLLM's wire protocol (see mock.h;
 * spec/engine-events.md §2, §3).
 *
 * Live: [topic, be64(seq), payload] on an XPUB (a PUB that also hands us subscription messages,
 * which /metrics counts, so tests know when a subscriber is attached). seq starts at 0.
 * Replay: a ROUTER; a request [identity, "", be64(start)] gets every kept batch with
 * seq >= start as [identity, "", topic, seq, payload] (vLLM >= 0.26) or, with --replay-two-frame,
 * [identity, "", seq, payload] (older vLLM, SGLang), then the end marker with seq ff x 8 and an
 * empty payload. ZMQ_FD is edge-triggered, so after every socket operation the handlers drain
 * until ZMQ_EVENTS says there is nothing left, and a 50 ms tick is a backstop. */
#include <event2/event.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include "kvr/alloc.h"
#include "kvr/err.h"
#include "kvr/event_msgpack.h"
#include "mock.h"

static void be64(uint8_t *p, uint64_t v)
{
    for (int i = 7; i >= 0; i--, v >>= 8)
        p[i] = (uint8_t)v;
}

static int readable(void *sock)
{
    int ev = 0;
    size_t len = sizeof(ev);
    if (zmq_getsockopt(sock, ZMQ_EVENTS, &ev, &len) == -1)
        return 0;
    return (ev & ZMQ_POLLIN) != 0;
}

/* ==== subscriptions ========================================================================== */

static void drain_pub(struct mock_pub *p)
{
    while (readable(p->pub)) {
        uint8_t buf[256];
        int n = zmq_recv(p->pub, buf, sizeof(buf), ZMQ_DONTWAIT);
        if (n == -1)
            break;
        if (n >= 1 && buf[0] == 1)
            p->subscriptions++;
    }
}

/* ==== replay ================================================================================= */

static int send_parts(void *sock, const void *const *d, const size_t *l, int n)
{
    for (int k = 0; k < n; k++)
        if (zmq_send(sock, d[k], l[k], (k + 1 < n ? ZMQ_SNDMORE : 0) | ZMQ_DONTWAIT) == -1)
            return -1;
    return 0;
}

static void reply(struct mock_pub *p, const uint8_t *id, size_t id_len, uint64_t seq,
                  const uint8_t *payload, size_t len, int end)
{
    uint8_t s[8];
    be64(s, end ? UINT64_MAX : seq);
    const void *d[5];
    size_t l[5];
    int n = 0;
    d[n] = id;
    l[n++] = id_len;
    d[n] = "";
    l[n++] = 0;
    if (!p->two_frame) {
        d[n] = end ? "" : p->topic;
        l[n++] = end ? 0 : strlen(p->topic);
    }
    d[n] = s;
    l[n++] = 8;
    d[n] = end ? (const void *)"" : payload;
    l[n++] = end ? 0 : len;
    send_parts(p->router, d, l, n);
}

static void drain_router(struct mock_pub *p)
{
    while (p->router != NULL && readable(p->router)) {
        uint8_t f[3][256];
        size_t len[3];
        int n = 0, more = 1;
        while (more) {
            int r = zmq_recv(p->router, n < 3 ? f[n] : f[2], 256, ZMQ_DONTWAIT);
            if (r == -1)
                return;
            if (n < 3)
                len[n] = (size_t)r;
            n++;
            size_t ms = sizeof(more);
            zmq_getsockopt(p->router, ZMQ_RCVMORE, &more, &ms);
        }
        /* [identity, "", be64(start)] exactly */
        if (n != 3 || len[0] > 255 || len[1] != 0 || len[2] != 8) {
            p->replay_malformed++;
            continue;
        }
        uint64_t start = 0;
        for (int i = 0; i < 8; i++)
            start = start << 8 | f[2][i];
        p->replay_requests++;
        for (uint32_t k = 0; k < p->ring_len; k++) {
            const struct mock_ring_entry *e = &p->ring[(p->ring_head + k) % p->ring_cap];
            if (e->seq >= start)
                reply(p, f[0], len[0], e->seq, e->payload, e->len, 0);
        }
        reply(p, f[0], len[0], 0, NULL, 0, 1);
    }
}

static void on_socket(evutil_socket_t fd, short what, void *arg)
{
    struct mock_pub *p = arg;
    (void)fd;
    (void)what;
    drain_pub(p);
    drain_router(p);
}

/* ==== setup ================================================================================== */

static void *open_socket(struct mock_pub *p, int type, const char *ep, int connect, char *actual,
                         size_t cap)
{
    void *s = zmq_socket(p->ctx, type);
    if (s == NULL)
        return NULL;
    int linger = 0, hwm = 100000, verbose = 1;
    zmq_setsockopt(s, ZMQ_LINGER, &linger, sizeof(linger));
    zmq_setsockopt(s, ZMQ_SNDHWM, &hwm, sizeof(hwm));
    if (type == ZMQ_XPUB)
        zmq_setsockopt(s, ZMQ_XPUB_VERBOSE, &verbose, sizeof(verbose));
    int rc = connect ? zmq_connect(s, ep) : zmq_bind(s, ep);
    if (rc == -1) {
        fprintf(stderr, "kvr-mock-worker: cannot %s %s: %s\n", connect ? "connect" : "bind", ep,
                zmq_strerror(zmq_errno()));
        zmq_close(s);
        return NULL;
    }
    size_t len = cap;
    if (connect || zmq_getsockopt(s, ZMQ_LAST_ENDPOINT, actual, &len) == -1)
        snprintf(actual, cap, "%s", ep);
    return s;
}

static struct event *watch(struct event_base *base, void *sock, struct mock_pub *p)
{
    int fd;
    size_t len = sizeof(fd);
    if (zmq_getsockopt(sock, ZMQ_FD, &fd, &len) == -1)
        return NULL;
    struct event *ev = event_new(base, fd, EV_READ | EV_PERSIST, on_socket, p);
    if (ev != NULL && event_add(ev, NULL) == -1) {
        event_free(ev);
        return NULL;
    }
    return ev;
}

int mock_pub_open(struct mock_pub *p, struct event_base *base, const struct mock_cfg *cfg)
{
    memset(p, 0, sizeof(*p));
    p->topic = cfg->topic;
    p->era = cfg->legacy ? KVR_EMP_ERA_A : KVR_EMP_ERA_B;
    p->two_frame = cfg->replay_two_frame;
    p->drop_seq = cfg->drop_seq;
    p->n_drop_seq = cfg->n_drop_seq;
    p->corrupt_seq = cfg->corrupt_seq;
    p->n_corrupt_seq = cfg->n_corrupt_seq;
    p->ring_cap = cfg->replay_buffer ? cfg->replay_buffer : 1;
    p->ring = calloc(p->ring_cap, sizeof(*p->ring));
    p->ctx = zmq_ctx_new();
    if (p->ring == NULL || p->ctx == NULL)
        goto fail;
    p->pub = open_socket(p, ZMQ_XPUB, cfg->zmq, cfg->zmq_connect, p->endpoint, sizeof(p->endpoint));
    if (p->pub == NULL)
        goto fail;
    if (cfg->replay != NULL) {
        p->router = open_socket(p, ZMQ_ROUTER, cfg->replay, 0, p->replay_endpoint,
                                sizeof(p->replay_endpoint));
        if (p->router == NULL)
            goto fail;
    }
    struct timeval tick = {0, 50 * 1000};
    p->ev_pub = watch(base, p->pub, p);
    p->ev_router = p->router ? watch(base, p->router, p) : NULL;
    p->ev_tick = event_new(base, -1, EV_PERSIST, on_socket, p);
    if (p->ev_pub == NULL || (p->router != NULL && p->ev_router == NULL) || p->ev_tick == NULL ||
        event_add(p->ev_tick, &tick) == -1)
        goto fail;
    return 0;
fail:
    mock_pub_close(p);
    return -1;
}

void mock_pub_close(struct mock_pub *p)
{
    if (p->ev_pub)
        event_free(p->ev_pub);
    if (p->ev_router)
        event_free(p->ev_router);
    if (p->ev_tick)
        event_free(p->ev_tick);
    if (p->pub)
        zmq_close(p->pub);
    if (p->router)
        zmq_close(p->router);
    if (p->ctx)
        zmq_ctx_term(p->ctx);
    for (uint32_t k = 0; p->ring != NULL && k < p->ring_cap; k++)
        free(p->ring[k].payload);
    free(p->ring);
    memset(p, 0, sizeof(*p));
}

/* ==== publishing ============================================================================= */

int mock_pub_send(struct mock_pub *p, const struct kvr_emp_batch *b, uint32_t n_events)
{
    kvr_alloc_t a;
    uint8_t *buf = NULL;
    size_t len = 0;
    kvr_alloc_init(&a);
    if (kvr_emp_encode(b, p->era, &a, &buf, &len) != KVR_OK)
        return -1;
    /* keep a plain-malloc copy in the ring (the encoder's buffer belongs to its allocator) */
    uint8_t *keep = malloc(len);
    if (keep == NULL) {
        kvr_free(&a, buf);
        return -1;
    }
    memcpy(keep, buf, len);
    kvr_free(&a, buf);

    uint64_t seq = p->next_seq++;
    for (uint32_t i = 0; i < p->n_corrupt_seq; i++) {
        if (p->corrupt_seq[i] == seq && len > 1) {
            len--; /* a truncated msgpack payload: subscribers must count it and go on */
            p->corrupted++;
            break;
        }
    }
    uint8_t s[8];
    be64(s, seq);
    const void *d[3] = {p->topic, s, keep};
    size_t l[3] = {strlen(p->topic), 8, len};
    int drop = 0;
    for (uint32_t i = 0; i < p->n_drop_seq; i++)
        drop |= p->drop_seq[i] == seq;
    if (drop)
        p->dropped++; /* a lost batch: only the replay socket will have it */
    else
        send_parts(p->pub, d, l, 3); /* a PUB never blocks: at the HWM it drops, like the engine */

    struct mock_ring_entry *e;
    if (p->ring_len < p->ring_cap) {
        e = &p->ring[(p->ring_head + p->ring_len) % p->ring_cap];
        p->ring_len++;
    } else {
        e = &p->ring[p->ring_head];
        free(e->payload);
        p->ring_head = (p->ring_head + 1) % p->ring_cap;
    }
    e->seq = seq;
    e->payload = keep;
    e->len = len;
    p->batches++;
    p->events += n_events;
    on_socket(-1, 0, p); /* a send may have consumed the FD's edge */
    return 0;
}
