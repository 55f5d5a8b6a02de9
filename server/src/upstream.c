/* upstream.c - worker connection pools and client requests (see upstream.h). */
#include "upstream.h"

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "clock.h"
#include "kvr/err.h"

#define IDLE_KEEP_MS 60000 /* idle connections beyond a few are closed after this */
#define IDLE_MIN 4         /* idle connections always kept per pool */

struct srv_pconn {
    struct evhttp_connection *evcon;
    uint32_t queued;     /* requests sent or queued on it */
    uint32_t served;     /* requests completed on it */
    uint64_t idle_since; /* ms, when queued dropped to 0 */
};

struct srv_pool {
    struct srv_worker *w; /* referenced */
    uint64_t gen;
    struct srv_pconn **c;
    size_t n, cap;
};

struct srv_up {
    struct srv_thread *t;
    struct srv_pool *pool;
    struct srv_pconn *pc;
    struct evhttp_request *req;
    const struct srv_up_ops *ops;
    void *ctx;
    struct event *deadline;
    int err;       /* enum evhttp_request_error from the error callback, or -1 */
    int got_head;  /* the response head arrived */
    int abandoned; /* on_head returned -1 */
    int in_cb;     /* inside on_data */
    int cancel_pending;
    int reused; /* the connection served a request before this one */
};

/* ==== pools =================================================================================== */

static struct srv_pool *pool_get(struct srv_thread *t, struct srv_worker *w)
{
    for (size_t k = 0; k < t->n_pools; k++)
        if (t->pools[k]->w == w && t->pools[k]->gen == w->gen)
            return t->pools[k];
    if (t->n_pools == t->cap_pools) {
        size_t cap = t->cap_pools ? t->cap_pools * 2 : 8;
        struct srv_pool **v = realloc(t->pools, cap * sizeof(*v));
        if (v == NULL)
            return NULL;
        t->pools = v;
        t->cap_pools = cap;
    }
    struct srv_pool *p = calloc(1, sizeof(*p));
    if (p == NULL)
        return NULL;
    srv_worker_ref(w);
    p->w = w;
    p->gen = w->gen;
    t->pools[t->n_pools++] = p;
    return p;
}

static struct srv_pconn *pconn_new(struct srv_thread *t, struct srv_pool *p)
{
    if (p->n == p->cap) {
        size_t cap = p->cap ? p->cap * 2 : 4;
        struct srv_pconn **v = realloc(p->c, cap * sizeof(*v));
        if (v == NULL)
            return NULL;
        p->c = v;
        p->cap = cap;
    }
    struct srv_pconn *c = calloc(1, sizeof(*c));
    if (c == NULL)
        return NULL;
    c->evcon = evhttp_connection_base_new(t->base, t->dns, p->w->host, p->w->port);
    if (c->evcon == NULL) {
        free(c);
        return NULL;
    }
    uint64_t to = t->srv->cfg->upstream_timeout_ms;
    struct timeval tv = {(time_t)(to / 1000), (suseconds_t)(to % 1000) * 1000};
    evhttp_connection_set_timeout_tv(c->evcon, &tv);
    evhttp_connection_set_retries(c->evcon, 0);
    p->c[p->n++] = c;
    return c;
}

static struct srv_pconn *pconn_pick(struct srv_thread *t, struct srv_pool *p)
{
    struct srv_pconn *best = NULL;
    for (size_t k = p->n; k > 0; k--) { /* newest first: the warmest idle connection */
        struct srv_pconn *c = p->c[k - 1];
        if (c->queued == 0)
            return c;
        if (best == NULL || c->queued < best->queued)
            best = c;
    }
    if (p->n < t->srv->cfg->upstream_pool) {
        struct srv_pconn *c = pconn_new(t, p);
        if (c != NULL)
            return c;
    }
    return best;
}

static void pool_free(struct srv_pool *p)
{
    for (size_t k = 0; k < p->n; k++) {
        evhttp_connection_free(p->c[k]->evcon);
        free(p->c[k]);
    }
    free(p->c);
    srv_worker_unref(p->w);
    free(p);
}

void srv_pools_sweep(struct srv_thread *t)
{
    uint64_t now = srv_now_ms();
    for (size_t k = 0; k < t->n_pools;) {
        struct srv_pool *p = t->pools[k];
        int removed = atomic_load_explicit(&p->w->removed, memory_order_relaxed);
        size_t idle = 0;
        for (size_t j = 0; j < p->n;) {
            struct srv_pconn *c = p->c[j];
            int drop = c->queued == 0 &&
                       (removed || (++idle > IDLE_MIN && now - c->idle_since > IDLE_KEEP_MS));
            if (drop) {
                evhttp_connection_free(c->evcon);
                free(c);
                p->c[j] = p->c[--p->n];
            } else {
                j++;
            }
        }
        if (removed && p->n == 0) {
            pool_free(p);
            t->pools[k] = t->pools[--t->n_pools];
        } else {
            k++;
        }
    }
}

void srv_pools_free(struct srv_thread *t)
{
    for (size_t k = 0; k < t->n_pools; k++)
        pool_free(t->pools[k]);
    t->n_pools = 0;
}

/* ==== requests ================================================================================ */

static void up_release(struct srv_up *u)
{
    if (u->pc != NULL) {
        if (u->pc->queued > 0)
            u->pc->queued--;
        if (u->pc->queued == 0)
            u->pc->idle_since = srv_now_ms();
    }
    if (u->deadline != NULL)
        event_free(u->deadline);
    free(u);
}

static void finish(struct srv_up *u, int ok, int kind, int status)
{
    const struct srv_up_ops *ops = u->ops;
    void *ctx = u->ctx;
    int reused = u->reused;
    if (ok && u->pc != NULL)
        u->pc->served++;
    u->req = NULL;
    up_release(u);
    ops->on_done(ctx, ok, kind, status, reused);
}

static void on_error(enum evhttp_request_error err, void *arg)
{
    struct srv_up *u = arg;
    u->err = (int)err;
}

static void on_req_done(struct evhttp_request *req, void *arg)
{
    struct srv_up *u = arg;
    int status = req != NULL ? evhttp_request_get_response_code(req) : 0;
    if (req != NULL && status != 0) {
        finish(u, 1, 0, status);
        return;
    }
    int kind;
    if (u->abandoned)
        kind = -1;
    else if (u->err == EVREQ_HTTP_TIMEOUT)
        kind = SRV_UPERR_TIMEOUT;
    else if (u->got_head)
        kind = SRV_UPERR_MIDSTREAM;
    else
        kind = SRV_UPERR_CONNECT;
    finish(u, 0, kind, 0);
}

static int on_header(struct evhttp_request *req, void *arg)
{
    struct srv_up *u = arg;
    u->got_head = 1;
    if (u->ops->on_head(u->ctx, req) != 0) {
        u->abandoned = 1;
        return -1;
    }
    return 0;
}

static void on_chunk(struct evhttp_request *req, void *arg)
{
    struct srv_up *u = arg;
    u->in_cb = 1;
    u->ops->on_data(u->ctx, evhttp_request_get_input_buffer(req));
    u->in_cb = 0;
    if (u->cancel_pending) {
        struct evhttp_request *r = u->req;
        u->req = NULL;
        up_release(u);
        evhttp_request_set_error_cb(r, NULL); /* cancelling reports an error otherwise */
        evhttp_cancel_request(r);             /* deferred free inside the chunk callback */
    }
}

static void on_deadline(evutil_socket_t fd, short what, void *arg)
{
    struct srv_up *u = arg;
    (void)fd;
    (void)what;
    struct evhttp_request *r = u->req;
    u->req = NULL;
    if (r != NULL) {
        evhttp_request_set_error_cb(r, NULL);
        evhttp_cancel_request(r);
    }
    finish(u, 0, SRV_UPERR_TIMEOUT, 0);
}

static int hop_by_hop(const char *k)
{
    static const char *const names[] = {"connection",
                                        "keep-alive",
                                        "proxy-connection",
                                        "proxy-authenticate",
                                        "proxy-authorization",
                                        "te",
                                        "trailer",
                                        "transfer-encoding",
                                        "upgrade",
                                        "host",
                                        "content-length",
                                        "expect",
                                        NULL};
    for (int i = 0; names[i] != NULL; i++)
        if (strcasecmp(k, names[i]) == 0)
            return 1;
    return 0;
}

void srv_up_copy_response_headers(struct evhttp_request *resp, struct evkeyvalq *dst)
{
    struct evkeyvalq *src = evhttp_request_get_input_headers(resp);
    for (struct evkeyval *h = src->tqh_first; h != NULL; h = h->next.tqe_next)
        if (!hop_by_hop(h->key) && strcasecmp(h->key, "date") != 0)
            evhttp_add_header(dst, h->key, h->value);
}

int srv_up_request(struct srv_thread *t, struct srv_worker *w, int method, const char *path,
                   const struct evkeyvalq *hdrs, const char *ctype, const void *body, size_t len,
                   uint64_t deadline_ms, const struct srv_up_ops *ops, void *ctx,
                   struct srv_up **out)
{
    if (w->url == NULL || w->port == 0)
        return KVR_EINVAL;
    struct srv_pool *p = pool_get(t, w);
    if (p == NULL)
        return KVR_ENOMEM;
    struct srv_pconn *c = pconn_pick(t, p);
    if (c == NULL)
        return KVR_ENOMEM;
    struct srv_up *u = calloc(1, sizeof(*u));
    if (u == NULL)
        return KVR_ENOMEM;
    u->t = t;
    u->pool = p;
    u->ops = ops;
    u->ctx = ctx;
    u->err = -1;
    u->reused = c->served > 0;
    struct evhttp_request *req = evhttp_request_new(on_req_done, u);
    if (req == NULL) {
        free(u);
        return KVR_ENOMEM;
    }
    evhttp_request_set_header_cb(req, on_header);
    evhttp_request_set_chunked_cb(req, on_chunk);
    evhttp_request_set_error_cb(req, on_error);
    struct evkeyvalq *oh = evhttp_request_get_output_headers(req);
    if (hdrs != NULL)
        for (struct evkeyval *h = hdrs->tqh_first; h != NULL; h = h->next.tqe_next)
            if (!hop_by_hop(h->key) && strcasecmp(h->key, "content-type") != 0 &&
                strncasecmp(h->key, "x-kvrouter-", 11) != 0)
                evhttp_add_header(oh, h->key, h->value);
    evhttp_add_header(oh, "Host", w->hostport);
    if (len > 0 || method == EVHTTP_REQ_POST)
        evhttp_add_header(oh, "Content-Type", ctype != NULL ? ctype : "application/json");
    if (len > 0 && evbuffer_add(evhttp_request_get_output_buffer(req), body, len) != 0) {
        evhttp_request_free(req);
        free(u);
        return KVR_ENOMEM;
    }
    if (deadline_ms > 0) {
        u->deadline = evtimer_new(t->base, on_deadline, u);
        if (u->deadline == NULL) {
            evhttp_request_free(req);
            free(u);
            return KVR_ENOMEM;
        }
        struct timeval tv = {(time_t)(deadline_ms / 1000),
                             (suseconds_t)(deadline_ms % 1000) * 1000};
        evtimer_add(u->deadline, &tv);
    }
    char uri[2048];
    snprintf(uri, sizeof(uri), "%s%s", w->prefix, path);
    u->req = req;
    u->pc = c;
    c->queued++;
    if (out != NULL)
        *out = u;
    /* evhttp_make_request reports an immediate failure through the callbacks (or frees the
     * request and returns -1 when it could not even queue it) */
    if (evhttp_make_request(c->evcon, req, (enum evhttp_cmd_type)method, uri) != 0) {
        if (out != NULL)
            *out = NULL;
        u->req = NULL;
        up_release(u);
        return KVR_ENOMEM;
    }
    return KVR_OK;
}

void srv_up_cancel(struct srv_up *u)
{
    if (u == NULL)
        return;
    if (u->in_cb) {
        u->cancel_pending = 1;
        return;
    }
    struct evhttp_request *r = u->req;
    u->req = NULL;
    up_release(u);
    if (r != NULL) {
        evhttp_request_set_error_cb(r, NULL);
        evhttp_cancel_request(r);
    }
}

void srv_up_pause(struct srv_up *u, int paused)
{
    if (u == NULL || u->pc == NULL)
        return;
    struct bufferevent *bev = evhttp_connection_get_bufferevent(u->pc->evcon);
    if (bev == NULL)
        return;
    if (paused)
        bufferevent_disable(bev, EV_READ);
    else
        bufferevent_enable(bev, EV_READ);
}
