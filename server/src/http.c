/* http.c - request dispatch, replies, connection tracking, request-read deadlines, the gate of
 * the protected routes (see server.h, auth.h). */
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>
#include <event2/listener.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/queue.h>
#include <sys/socket.h>

#include "api.h"
#include "auth.h"
#include "clock.h"
#include "jsonw.h"
#include "kvr/err.h"
#include "server.h"

/* ==== status table ============================================================================ */

const char *srv_status_text(int status)
{
    switch (status) {
    case 200:
        return "OK";
    case 201:
        return "Created";
    case 204:
        return "No Content";
    case 400:
        return "Bad Request";
    case 401:
        return "Unauthorized";
    case 403:
        return "Forbidden";
    case 404:
        return "Not Found";
    case 405:
        return "Method Not Allowed";
    case 409:
        return "Conflict";
    case 413:
        return "Payload Too Large";
    case 415:
        return "Unsupported Media Type";
    case 429:
        return "Too Many Requests";
    case 500:
        return "Internal Server Error";
    case 501:
        return "Not Implemented";
    case 502:
        return "Bad Gateway";
    case 503:
        return "Service Unavailable";
    case 504:
        return "Gateway Timeout";
    case 507:
        return "Insufficient Storage";
    default:
        return "Status";
    }
}

int srv_status_of(int kvr_err)
{
    switch (kvr_err) {
    case KVR_OK:
        return 200;
    case KVR_EINVAL:
    case KVR_ECORRUPT:
    case KVR_ERANGE:
    case KVR_EDOMAIN:
        return 400;
    case KVR_ENOTFOUND:
        return 404;
    case KVR_EEXIST:
    case KVR_ESTATE:
        return 409;
    case KVR_ETIMEDOUT:
        return 504;
    case KVR_ENOMEM:
    case KVR_EBUSY:
        return 503;
    case KVR_ECAPACITY:
        return 507;
    case KVR_EIO:
    default:
        return 500;
    }
}

/* ==== finishing requests ====================================================================== */

static void request_done(struct srv_conn *c);
static void finish_req(struct srv_hreq *h, int status, int next);

static void finish(struct srv_hreq *h, int status)
{
    finish_req(h, status, 1);
}

/* Ends h: metrics, in-flight count. `next`: the connection stays open for another request, whose
 * first byte arms the read deadline again (0 when the client left or the connection is being
 * cut: h->req may be freed already then). */
static void finish_req(struct srv_hreq *h, int status, int next)
{
    struct srv_thread *t = h->t;
    if (h->conn != NULL && h->conn->watch != NULL)
        h->conn->watch = NULL;
    /* only while h's request still belongs to the record's connection (a record is reused) */
    if (next && h->conn != NULL && h->req != NULL && h->conn->evcon != NULL &&
        evhttp_request_get_connection(h->req) == h->conn->evcon)
        request_done(h->conn);
    h->req = NULL;
    h->conn = NULL;
    srv_stat_add(&t->st.req[h->route][srv_code_index(status)], 1);
    srv_hist_observe(&t->st.lat[h->route], srv_hist_latency(), (srv_now_ns() - h->t0_ns) / 1000);
    uint64_t inflight = atomic_load_explicit(&t->inflight, memory_order_relaxed) - 1;
    atomic_store_explicit(&t->inflight, inflight, memory_order_relaxed);
    if (t->draining && inflight == 0)
        srv_http_exit_when_flushed(t);
}

void srv_reply_header(struct srv_hreq *h, const char *name, const char *value)
{
    if (h->req != NULL)
        evhttp_add_header(evhttp_request_get_output_headers(h->req), name, value);
}

static void common_headers(struct srv_hreq *h, const char *ctype)
{
    struct evkeyvalq *oh = evhttp_request_get_output_headers(h->req);
    if (ctype != NULL && evhttp_find_header(oh, "Content-Type") == NULL)
        evhttp_add_header(oh, "Content-Type", ctype);
    if (h->t->draining && evhttp_find_header(oh, "Connection") == NULL)
        evhttp_add_header(oh, "Connection", "close");
}

void srv_reply(struct srv_hreq *h, int status, const char *ctype, const void *body, size_t len)
{
    if (h->req == NULL)
        return;
    struct evbuffer *b = h->t->evout;
    common_headers(h, ctype != NULL ? ctype : "application/json");
    if (len > 0 && evbuffer_add(b, body, len) != 0) {
        status = 503;
        evbuffer_drain(b, evbuffer_get_length(b));
    }
    h->status = status;
    evhttp_send_reply(h->req, status, srv_status_text(status), b);
    evbuffer_drain(b, evbuffer_get_length(b)); /* a detached request leaves it untouched */
    finish(h, status);
}

void srv_reply_evbuf(struct srv_hreq *h, int status, const char *reason, struct evbuffer *body)
{
    if (h->req == NULL)
        return;
    common_headers(h, NULL);
    h->status = status;
    evhttp_send_reply(h->req, status, reason != NULL ? reason : srv_status_text(status), body);
    finish(h, status);
}

void srv_reply_out(struct srv_hreq *h, int status, int jw_err)
{
    struct kvr_buf *o = &h->t->out;
    if (jw_err != KVR_OK) {
        kvr_buf_reset(o);
        srv_reply_error(h, 503, "out of memory while building the reply");
        return;
    }
    srv_reply(h, status, NULL, o->data, o->len);
    kvr_buf_reset(o);
}

__attribute__((format(printf, 3, 0))) static void vreply_error(struct srv_hreq *h, int status,
                                                               const char *fmt, va_list ap)
{
    char msg[1024];
    vsnprintf(msg, sizeof(msg), fmt, ap);
    struct kvr_buf *o = &h->t->out;
    if (srv_jw_error_body(o, msg) != KVR_OK)
        srv_reply(h, status, NULL, "{\"error\":\"out of memory\"}", 25);
    else
        srv_reply(h, status, NULL, o->data, o->len);
    kvr_buf_reset(o);
}

void srv_reply_error(struct srv_hreq *h, int status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vreply_error(h, status, fmt, ap);
    va_end(ap);
}

void srv_reply_kvr(struct srv_hreq *h, int kvr_err, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vreply_error(h, srv_status_of(kvr_err), fmt, ap);
    va_end(ap);
}

void srv_reply_start(struct srv_hreq *h, int status, const char *reason)
{
    if (h->req == NULL || h->started)
        return;
    common_headers(h, NULL);
    h->status = status;
    h->started = 1;
    evhttp_send_reply_start(h->req, status, reason != NULL ? reason : srv_status_text(status));
}

static void abort_now(struct srv_conn *c)
{
    struct srv_thread *t = c->t;
    for (size_t k = 0; k < t->n_aborts; k++)
        if (t->aborts[k] == c)
            return;
    if (t->n_aborts == t->cap_aborts) {
        size_t cap = t->cap_aborts ? t->cap_aborts * 2 : 8;
        struct srv_conn **v = realloc(t->aborts, cap * sizeof(*v));
        if (v == NULL)
            return; /* the write timeout closes it eventually */
        t->aborts = v;
        t->cap_aborts = cap;
    }
    t->aborts[t->n_aborts++] = c;
    event_active(t->ev_abort, EV_READ, 0);
}

static void on_chunk_flushed(struct evhttp_connection *evcon, void *arg)
{
    struct srv_conn *c = arg;
    (void)evcon;
    if (c->abort_req != NULL)
        abort_now(c); /* not from inside evhttp's write callback: on the next event */
    else if (c->watch != NULL && c->watch->drained != NULL)
        c->watch->drained(c->watch);
}

size_t srv_reply_pending(struct srv_hreq *h)
{
    struct evhttp_connection *evcon = h->req ? evhttp_request_get_connection(h->req) : NULL;
    struct bufferevent *bev = evcon ? evhttp_connection_get_bufferevent(evcon) : NULL;
    return bev != NULL ? evbuffer_get_length(bufferevent_get_output(bev)) : 0;
}

void srv_http_run_aborts(struct srv_thread *t)
{
    while (t->n_aborts > 0) {
        struct srv_conn *c = t->aborts[--t->n_aborts];
        c->abort_req = NULL;
        evhttp_connection_free(c->evcon); /* frees the cut request with it; closes */
    }
}

void srv_reply_chunk(struct srv_hreq *h, struct evbuffer *buf)
{
    if (h->req != NULL && h->started) {
        if (h->conn != NULL)
            evhttp_send_reply_chunk_with_cb(h->req, buf, on_chunk_flushed, h->conn);
        else
            evhttp_send_reply_chunk(h->req, buf);
    }
    evbuffer_drain(buf, evbuffer_get_length(buf));
}

void srv_reply_end(struct srv_hreq *h)
{
    if (h->req == NULL)
        return;
    evhttp_send_reply_end(h->req);
    finish(h, h->status);
}

void srv_reply_abort(struct srv_hreq *h)
{
    if (h->req == NULL)
        return;
    struct evhttp_request *req = h->req;
    struct srv_conn *c = h->conn;
    struct evhttp_connection *evcon = evhttp_request_get_connection(req);
    int status = h->status ? h->status : 502;
    finish_req(h, status, 0); /* clears the watch: the close callback will not call the owner */
    if (evcon == NULL)
        return;
    struct bufferevent *bev = evhttp_connection_get_bufferevent(evcon);
    if (c != NULL && bev != NULL && evbuffer_get_length(bufferevent_get_output(bev)) > 0) {
        /* let what the client has not received yet go out first (its flush callback then
         * closes), so it gets every byte the worker sent before failing */
        c->abort_req = req;
        return;
    }
    if (c != NULL) {
        c->abort_req = req;
        abort_now(c);
        return;
    }
    evhttp_connection_free(evcon); /* frees the request with it */
}

void srv_hreq_gone(struct srv_hreq *h)
{
    if (h->req == NULL)
        return;
    /* detached by libevent (EOF/timeout on the client): ours to free; still attached (the
     * connection is being freed with it, e.g. at exit): libevent frees it */
    struct evhttp_request *req = h->req;
    int detached = evhttp_request_get_connection(req) == NULL;
    finish_req(h, 499, 0);
    if (detached)
        evhttp_send_reply_end(req);
}

/* ==== request accessors ======================================================================= */

const char *srv_body(struct srv_hreq *h, size_t *len)
{
    struct evbuffer *in = evhttp_request_get_input_buffer(h->req);
    *len = evbuffer_get_length(in);
    if (*len == 0)
        return "";
    return (const char *)evbuffer_pullup(in, -1);
}

const char *srv_header(struct srv_hreq *h, const char *name)
{
    return evhttp_find_header(evhttp_request_get_input_headers(h->req), name);
}

int srv_query_param(struct srv_hreq *h, const char *name, char *out, size_t cap)
{
    if (h->query == NULL)
        return 0;
    struct evkeyvalq q;
    TAILQ_INIT(&q);
    if (evhttp_parse_query_str(h->query, &q) != 0) {
        evhttp_clear_headers(&q);
        return 0;
    }
    const char *v = evhttp_find_header(&q, name);
    int found = v != NULL;
    if (found)
        snprintf(out, cap, "%s", v);
    evhttp_clear_headers(&q);
    return found;
}

int srv_admin_allowed(struct srv_hreq *h)
{
    const struct srv_config *cfg = h->t->srv->cfg;
    if (cfg->admin_token != NULL) {
        if (srv_auth_bearer_ok(srv_header(h, "Authorization"), cfg->admin_token))
            return 1;
        srv_reply_header(h, "WWW-Authenticate", "Bearer realm=\"kvrouter\"");
        srv_reply_error(h, 401, "%s needs 'Authorization: Bearer <admin token>'", h->path);
        return 0;
    }
    char *addr = NULL;
    ev_uint16_t port = 0;
    struct evhttp_connection *evcon = evhttp_request_get_connection(h->req);
    if (evcon != NULL)
        evhttp_connection_get_peer(evcon, &addr, &port);
    if (!cfg->test_loopback_is_remote && srv_auth_is_loopback(addr))
        return 1;
    srv_reply_error(h, 403,
                    "%s is refused to non-loopback clients when no admin token is configured "
                    "(--admin-token)",
                    h->path);
    return 0;
}

/* ==== long-lived contexts and watches ========================================================= */

void srv_live_add(struct srv_thread *t, struct srv_live *l)
{
    l->next = t->live.next;
    l->prev = &t->live;
    t->live.next->prev = l;
    t->live.next = l;
}

void srv_live_del(struct srv_live *l)
{
    if (l->next == NULL)
        return;
    l->prev->next = l->next;
    l->next->prev = l->prev;
    l->next = l->prev = NULL;
}

void srv_watch(struct srv_hreq *h, struct srv_conn_watch *w)
{
    if (h->conn != NULL)
        h->conn->watch = w;
}

void srv_unwatch(struct srv_hreq *h)
{
    if (h->conn != NULL)
        h->conn->watch = NULL;
}

/* ==== scratch ================================================================================= */

int srv_scratch_blocks(struct srv_thread *t, size_t n)
{
    if (n <= t->cap_blocks)
        return KVR_OK;
    size_t cap = t->cap_blocks ? t->cap_blocks : 256;
    while (cap < n)
        cap *= 2;
    uint64_t *a = realloc(t->locals, cap * sizeof(*a));
    if (a == NULL)
        return KVR_ENOMEM;
    t->locals = a;
    uint64_t *b = realloc(t->seqs, cap * sizeof(*b));
    if (b == NULL)
        return KVR_ENOMEM;
    t->seqs = b;
    t->cap_blocks = cap;
    return KVR_OK;
}

int srv_scratch_tokens(struct srv_thread *t, size_t n)
{
    if (n <= t->cap_tokens)
        return KVR_OK;
    size_t cap = t->cap_tokens ? t->cap_tokens : 4096;
    while (cap < n)
        cap *= 2;
    uint32_t *a = realloc(t->tokens, cap * sizeof(*a));
    if (a == NULL)
        return KVR_ENOMEM;
    t->tokens = a;
    t->cap_tokens = cap;
    return KVR_OK;
}

int srv_scratch_matches(struct srv_thread *t, size_t n)
{
    if (n <= t->cap_matches)
        return KVR_OK;
    size_t cap = t->cap_matches ? t->cap_matches : 64;
    while (cap < n)
        cap *= 2;
    struct kvr_match *a = realloc(t->matches, cap * sizeof(*a));
    if (a == NULL)
        return KVR_ENOMEM;
    t->matches = a;
    t->cap_matches = cap;
    return KVR_OK;
}

double srv_thread_uniform(struct srv_thread *t)
{
    uint64_t x = t->rng;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    t->rng = x;
    return (double)(x >> 11) * (1.0 / 9007199254740992.0);
}

/* ==== connection tracking ===================================================================== */

static size_t chash(const struct srv_thread *t, const struct evhttp_connection *evcon)
{
    uint64_t x = (uint64_t)(uintptr_t)evcon;
    x ^= x >> 17;
    x *= 0x9E3779B97F4A7C15ull;
    return (size_t)(x >> 32) & t->ctab_mask;
}

static struct srv_conn *conn_find(struct srv_thread *t, const struct evhttp_connection *evcon)
{
    if (t->ctab == NULL || evcon == NULL)
        return NULL;
    for (struct srv_conn *c = t->ctab[chash(t, evcon)]; c != NULL; c = c->hnext)
        if (c->evcon == evcon)
            return c;
    return NULL;
}

static void ctab_grow(struct srv_thread *t)
{
    size_t ncap = t->ctab ? (t->ctab_mask + 1) * 2 : 1024;
    struct srv_conn **nt = calloc(ncap, sizeof(*nt));
    if (nt == NULL)
        return; /* chains just get longer */
    size_t old = t->ctab ? t->ctab_mask + 1 : 0;
    struct srv_conn **ot = t->ctab;
    t->ctab = nt;
    t->ctab_mask = ncap - 1;
    for (size_t k = 0; k < old; k++)
        for (struct srv_conn *c = ot[k], *next; c != NULL; c = next) {
            next = c->hnext;
            size_t b = chash(t, c->evcon);
            c->hnext = nt[b];
            nt[b] = c;
        }
    free(ot);
}

/* ==== request-read deadlines ================================================================== */

/* A connection's read state. A slow-loris client sends a request one byte at a time, each byte
 * resetting libevent's idle timeout (--timeout); these deadlines bound the whole request instead:
 *
 *   IDLE ──first byte──▶ HEADERS ──blank line──▶ BODY ──evhttp dispatches──▶ DISPATCHED
 *    ▲   (arm --header-timeout)    (arm --body-timeout)       (disarm)            │
 *    └────────────────────────── reply handed over (finish) ◀─────────────────────┘
 *
 * An idle keep-alive connection arms nothing (--timeout closes it). Bytes are watched through an
 * evbuffer callback on the connection's input, which runs as they are read, before evhttp parses
 * them; only HEADERS scans them (for the blank line), so bodies cost nothing. When a deadline
 * passes, the client gets a best-effort 408 and the connection is closed; other connections are
 * not affected (kvrouter_http_slow_clients_total counts them). */
enum { RS_IDLE = 0, RS_HEADERS, RS_BODY, RS_DISPATCHED };

static void deadline_arm(struct srv_conn *c, uint64_t ms)
{
    if (c->ev_deadline == NULL)
        return;
    struct timeval tv = {(time_t)(ms / 1000), (suseconds_t)(ms % 1000) * 1000};
    evtimer_add(c->ev_deadline, &tv);
}

/* Feeds request bytes to the header-end scanner; 1 once the blank line has been seen. */
static int scan_header_end(struct srv_conn *c, const unsigned char *p, size_t n)
{
    for (size_t k = 0; k < n; k++) {
        if (p[k] == '\n') {
            if (c->eol)
                return 1;
            c->eol = 1;
        } else if (p[k] != '\r') {
            c->eol = 0;
        }
    }
    return 0;
}

/* Scans the input from byte `from` on, in HEADERS; moves to BODY at the blank line. */
static void scan_input(struct srv_conn *c, struct evbuffer *in, size_t from)
{
    const struct srv_config *cfg = c->t->srv->cfg;
    struct evbuffer_ptr pos;
    if (evbuffer_ptr_set(in, &pos, from, EVBUFFER_PTR_SET) != 0)
        return;
    for (;;) {
        struct evbuffer_iovec v[8];
        int nv = evbuffer_peek(in, -1, &pos, v, 8);
        size_t seen = 0;
        for (int k = 0; k < nv && k < 8; k++) {
            if (scan_header_end(c, v[k].iov_base, v[k].iov_len)) {
                c->rstate = RS_BODY;
                deadline_arm(c, cfg->body_timeout_ms);
                return;
            }
            seen += v[k].iov_len;
        }
        if (nv <= 8 || evbuffer_ptr_set(in, &pos, seen, EVBUFFER_PTR_ADD) != 0)
            return;
    }
}

static void begin_request(struct srv_conn *c, struct evbuffer *in, size_t from)
{
    if (c->rstate == RS_IDLE) {
        c->rstate = RS_HEADERS;
        c->eol = 0;
        deadline_arm(c, c->t->srv->cfg->header_timeout_ms);
    }
    if (c->rstate == RS_HEADERS)
        scan_input(c, in, from);
}

static void on_input(struct evbuffer *in, const struct evbuffer_cb_info *info, void *arg)
{
    struct srv_conn *c = arg;
    if (info->n_added == 0 || c->evcon == NULL || c->rstate == RS_BODY ||
        c->rstate == RS_DISPATCHED)
        return;
    size_t len = evbuffer_get_length(in);
    begin_request(c, in, info->n_added < len ? len - info->n_added : 0);
}

/* The reply of c's request was handed over: wait for the next one (maybe already buffered). */
static void request_done(struct srv_conn *c)
{
    c->rstate = RS_IDLE;
    if (c->ev_deadline != NULL)
        evtimer_del(c->ev_deadline);
    struct bufferevent *bev = evhttp_connection_get_bufferevent(c->evcon);
    struct evbuffer *in = bev != NULL ? bufferevent_get_input(bev) : NULL;
    if (in != NULL && evbuffer_get_length(in) > 0)
        begin_request(c, in, 0); /* pipelined */
}

static void on_deadline(evutil_socket_t fd, short what, void *arg)
{
    struct srv_conn *c = arg;
    struct srv_thread *t = c->t;
    (void)fd;
    (void)what;
    if (c->evcon == NULL || c->rstate == RS_IDLE || c->rstate == RS_DISPATCHED)
        return;
    struct bufferevent *bev = evhttp_connection_get_bufferevent(c->evcon);
    if (bev != NULL && evbuffer_get_length(bufferevent_get_output(bev)) > 0) {
        /* the previous reply is still going out (a slow reader, bounded by --timeout): the
         * pipelined request behind it has not really started */
        deadline_arm(c, t->srv->cfg->header_timeout_ms);
        return;
    }
    srv_stat_add(&t->st.slow_clients, 1);
    char *addr = NULL;
    ev_uint16_t port = 0;
    evhttp_connection_get_peer(c->evcon, &addr, &port);
    if (srv_log_ratelimit(&t->rl_warn, srv_now_ms(), 10000))
        srv_logf(t->srv->log, SRV_LOG_WARN, t->name,
                 "%s:%u: request %s not complete within %llu ms: closed (408; "
                 "kvrouter_http_slow_clients_total counts them)",
                 addr ? addr : "?", (unsigned)port, c->rstate == RS_HEADERS ? "headers" : "body",
                 (unsigned long long)(c->rstate == RS_HEADERS ? t->srv->cfg->header_timeout_ms
                                                              : t->srv->cfg->body_timeout_ms));
    evutil_socket_t sfd = bev != NULL ? bufferevent_getfd(bev) : -1;
    if (sfd != -1) {
        /* best effort, straight to the socket (the connection is freed right after): then
         * drain what the client sent, so closing does not turn into a reset that would
         * destroy the answer before the client reads it */
        static const char body[] = "{\"error\":\"request not received in time\"}";
        char msg[256];
        int n = snprintf(msg, sizeof(msg),
                         "HTTP/1.1 408 Request Timeout\r\nContent-Type: application/json\r\n"
                         "Content-Length: %zu\r\nConnection: close\r\n\r\n%s",
                         sizeof(body) - 1, body);
        (void)send(sfd, msg, (size_t)n, MSG_DONTWAIT | MSG_NOSIGNAL);
        (void)shutdown(sfd, SHUT_WR);
        char sink[4096];
        for (int k = 0; k < 16 && recv(sfd, sink, sizeof(sink), MSG_DONTWAIT) > 0; k++)
            ;
    }
    evhttp_connection_free(c->evcon); /* on_conn_close releases the record */
}

static void conn_remove(struct srv_thread *t, struct srv_conn *c)
{
    if (c->ev_deadline != NULL)
        evtimer_del(c->ev_deadline);
    struct bufferevent *bev = evhttp_connection_get_bufferevent(c->evcon);
    if (c->in_cb != NULL && bev != NULL)
        evbuffer_remove_cb_entry(bufferevent_get_input(bev), c->in_cb);
    c->in_cb = NULL;
    c->rstate = RS_IDLE;
    struct srv_conn **pp = &t->ctab[chash(t, c->evcon)];
    while (*pp != NULL && *pp != c)
        pp = &(*pp)->hnext;
    if (*pp == c)
        *pp = c->hnext;
    c->hnext = t->cfree;
    c->evcon = NULL;
    c->watch = NULL;
    t->cfree = c;
}

static void set_accepting(struct srv_thread *t, int on)
{
    if (t->bound == NULL || t->draining)
        return;
    struct evconnlistener *l = evhttp_bound_socket_get_listener(t->bound);
    if (l == NULL)
        return;
    if (on && t->accept_paused) {
        evconnlistener_enable(l);
        t->accept_paused = 0;
    } else if (!on && !t->accept_paused) {
        evconnlistener_disable(l);
        t->accept_paused = 1;
        srv_stat_add(&t->st.accept_pauses, 1);
    }
}

static void on_conn_close(struct evhttp_connection *evcon, void *arg)
{
    struct srv_conn *c = arg;
    struct srv_thread *t = c->t;
    evhttp_connection_set_closecb(evcon, NULL, NULL);
    struct srv_conn_watch *w = c->watch;
    c->watch = NULL;
    if (w != NULL)
        w->gone(w);
    if (c->abort_req != NULL) { /* a cut stream whose client left first */
        if (evhttp_request_get_connection(c->abort_req) == NULL)
            evhttp_send_reply_end(c->abort_req); /* detached: ours to free */
        c->abort_req = NULL;
        for (size_t k = 0; k < t->n_aborts; k++)
            if (t->aborts[k] == c) {
                t->aborts[k] = t->aborts[--t->n_aborts];
                break;
            }
    }
    conn_remove(t, c);
    uint64_t n = atomic_load_explicit(&t->n_conns, memory_order_relaxed);
    atomic_store_explicit(&t->n_conns, n > 0 ? n - 1 : 0, memory_order_relaxed);
    srv_stat_add(&t->st.conns_closed, 1);
    if (n - 1 < t->max_conns)
        set_accepting(t, 1);
}

/* Creates the record of a connection and hooks its close callback. `counted`: the bufferevent
 * hook already counted it. */
static struct srv_conn *conn_add(struct srv_thread *t, struct evhttp_connection *evcon, int counted)
{
    uint64_t n = atomic_load_explicit(&t->n_conns, memory_order_relaxed);
    if (!counted) {
        atomic_store_explicit(&t->n_conns, ++n, memory_order_relaxed);
        srv_stat_add(&t->st.conns_accepted, 1);
    }
    if (t->ctab == NULL || n > (t->ctab_mask + 1) * 2)
        ctab_grow(t);
    struct srv_conn *c = t->cfree;
    if (t->ctab == NULL)
        c = NULL;
    else if (c != NULL)
        t->cfree = c->hnext;
    else if ((c = malloc(sizeof(*c))) != NULL)
        c->ev_deadline = evtimer_new(t->base, on_deadline, c); /* NULL: no deadline (OOM) */
    if (c == NULL) {                                           /* untracked: uncount it */
        atomic_store_explicit(&t->n_conns, n - 1, memory_order_relaxed);
        return NULL;
    }
    c->evcon = evcon;
    c->t = t;
    c->watch = NULL;
    c->abort_req = NULL;
    c->rstate = RS_IDLE;
    c->eol = 0;
    c->in_cb = NULL;
    struct bufferevent *bev = evhttp_connection_get_bufferevent(evcon);
    if (bev != NULL) {
        struct evbuffer *in = bufferevent_get_input(bev);
        c->in_cb = evbuffer_add_cb(in, on_input, c);
        if (evbuffer_get_length(in) > 0)
            begin_request(c, in, 0);
    }
    size_t b = chash(t, evcon);
    c->hnext = t->ctab[b];
    t->ctab[b] = c;
    evhttp_connection_set_closecb(evcon, on_conn_close, c);
    if (n >= t->max_conns)
        set_accepting(t, 0);
    return c;
}

struct bufferevent *srv_http_bevcb(struct event_base *base, void *arg)
{
    struct srv_thread *t = arg;
    struct bufferevent *bev = bufferevent_socket_new(base, -1, BEV_OPT_CLOSE_ON_FREE);
    if (bev == NULL)
        return NULL;
    if (t->n_fresh == t->cap_fresh) {
        size_t cap = t->cap_fresh ? t->cap_fresh * 2 : 64;
        struct bufferevent **f = realloc(t->fresh, cap * sizeof(*f));
        if (f == NULL)
            return bev; /* untracked: served, but not counted */
        t->fresh = f;
        t->cap_fresh = cap;
    }
    t->fresh[t->n_fresh++] = bev;
    /* evhttp finishes setting the connection up after this returns; registering it from an
     * event activated now runs in this same loop turn, before any of its bytes are read */
    event_active(t->ev_fresh, EV_READ, 0);
    /* counted here, so the cap holds within one accept batch (the listener checks whether
     * the callback disabled it after every accepted connection) */
    uint64_t n = atomic_load_explicit(&t->n_conns, memory_order_relaxed) + 1;
    atomic_store_explicit(&t->n_conns, n, memory_order_relaxed);
    srv_stat_add(&t->st.conns_accepted, 1);
    if (n >= t->max_conns)
        set_accepting(t, 0);
    return bev;
}

void srv_http_register_fresh(struct srv_thread *t)
{
    for (size_t k = 0; k < t->n_fresh; k++) {
        struct bufferevent *bev = t->fresh[k];
        void *cbarg = NULL;
        bufferevent_getcb(bev, NULL, NULL, NULL, &cbarg);
        struct evhttp_connection *evcon = cbarg;
        /* evhttp sets the connection as its bufferevent's callback argument; check before use */
        if (evcon == NULL || evhttp_connection_get_bufferevent(evcon) != bev ||
            conn_find(t, evcon) != NULL) {
            uint64_t n = atomic_load_explicit(&t->n_conns, memory_order_relaxed);
            atomic_store_explicit(&t->n_conns, n > 0 ? n - 1 : 0, memory_order_relaxed);
            continue;
        }
        conn_add(t, evcon, 1);
    }
    t->n_fresh = 0;
}

/* 1 if some client connection still has bytes to send. */
static int output_pending(struct srv_thread *t)
{
    if (t->n_aborts > 0)
        return 1;
    for (size_t k = 0; t->ctab != NULL && k <= t->ctab_mask; k++)
        for (struct srv_conn *c = t->ctab[k]; c != NULL; c = c->hnext) {
            struct bufferevent *bev = evhttp_connection_get_bufferevent(c->evcon);
            if (bev != NULL && evbuffer_get_length(bufferevent_get_output(bev)) > 0)
                return 1;
        }
    return 0;
}

static void on_flush_check(evutil_socket_t fd, short what, void *arg)
{
    struct srv_thread *t = arg;
    (void)fd;
    (void)what;
    srv_http_exit_when_flushed(t);
}

void srv_http_exit_when_flushed(struct srv_thread *t)
{
    if (!output_pending(t)) {
        event_base_loopexit(t->base, NULL);
        return;
    }
    /* the last replies are still in the socket buffers' queue: look again shortly (the grace
     * timer bounds the wait) */
    struct timeval tv = {0, 5000};
    event_base_once(t->base, -1, EV_TIMEOUT, on_flush_check, t, &tv);
}

/* Frees a chain of records linked by hnext. */
static void conn_chain_free(struct srv_conn *c)
{
    for (struct srv_conn *next; c != NULL; c = next) {
        next = c->hnext;
        if (c->ev_deadline != NULL)
            event_free(c->ev_deadline);
        free(c);
    }
}

void srv_http_conn_table_free(struct srv_thread *t)
{
    if (t->ctab != NULL)
        for (size_t k = 0; k <= t->ctab_mask; k++)
            conn_chain_free(t->ctab[k]);
    free(t->ctab);
    t->ctab = NULL;
    conn_chain_free(t->cfree);
    t->cfree = NULL;
    free(t->fresh);
    t->fresh = NULL;
    t->n_fresh = t->cap_fresh = 0;
    free(t->aborts);
    t->aborts = NULL;
    t->n_aborts = t->cap_aborts = 0;
}

/* ==== dispatch ================================================================================ */

#define M_GET EVHTTP_REQ_GET
#define M_POST EVHTTP_REQ_POST
#define M_DELETE EVHTTP_REQ_DELETE

/* The protected routes (auth.h): `gated` lists the methods that pass srv_admin_allowed first;
 * `indexer` marks the Dynamo-compatible ones --open-indexer-api leaves open. */
enum { GATE_ALWAYS = 0, GATE_INDEXER = 1 };

struct route {
    const char *path;
    int prefix; /* 1: matches path and anything below "path/" */
    int route;  /* enum srv_route */
    unsigned methods;
    unsigned gated; /* methods that need the admin gate */
    int indexer;    /* GATE_INDEXER: --open-indexer-api opens them */
    void (*fn)(struct srv_hreq *h);
};

static const struct route routes[] = {
    {"/query_by_hash", 0, SRV_R_QUERY_BY_HASH, M_POST, 0, 0, srv_api_query_by_hash},
    {"/query", 0, SRV_R_QUERY, M_POST, 0, 0, srv_api_query},
    {"/v1/route", 0, SRV_R_ROUTE, M_POST, 0, 0, srv_api_route},
    {"/v1/route", 1, SRV_R_ROUTE_ID, M_POST | M_DELETE, 0, 0, srv_api_route_id},
    {"/v1/completions", 0, SRV_R_COMPLETIONS, M_POST, 0, 0, srv_api_completions},
    {"/v1/chat/completions", 0, SRV_R_CHAT, M_POST, 0, 0, srv_api_chat},
    {"/v1/events", 0, SRV_R_EVENTS, M_POST, 0, 0, srv_api_events},
    {"/register", 0, SRV_R_REGISTER, M_POST, M_POST, GATE_INDEXER, srv_api_register},
    {"/unregister", 0, SRV_R_UNREGISTER, M_POST, M_POST, GATE_INDEXER, srv_api_unregister},
    {"/workers", 0, SRV_R_WORKERS, M_GET, 0, 0, srv_api_workers_indexer},
    {"/dump", 0, SRV_R_DUMP, M_GET, M_GET, GATE_INDEXER, srv_api_dump},
    {"/v1/models", 0, SRV_R_MODELS, M_GET, 0, 0, srv_api_models},
    {"/v1/workers", 0, SRV_R_V1_WORKERS, M_GET | M_POST | M_DELETE, M_POST | M_DELETE, GATE_ALWAYS,
     srv_api_v1_workers},
    {"/v1/workers", 1, SRV_R_V1_WORKERS, M_GET | M_DELETE, M_DELETE, GATE_ALWAYS,
     srv_api_v1_workers},
    {"/admin", 1, SRV_R_ADMIN, M_GET | M_POST, M_GET | M_POST, GATE_ALWAYS, srv_api_admin},
    {"/metrics", 0, SRV_R_METRICS, M_GET, 0, 0, srv_api_metrics},
    {"/healthz", 0, SRV_R_HEALTHZ, M_GET, 0, 0, srv_api_healthz},
    {"/health", 0, SRV_R_HEALTHZ, M_GET, 0, 0, srv_api_healthz},
    {"/readyz", 0, SRV_R_READYZ, M_GET, 0, 0, srv_api_readyz},
};

static void allow_header(struct srv_hreq *h, unsigned methods)
{
    char allow[32] = "";
    if (methods & M_GET)
        strcat(allow, "GET, HEAD");
    if (methods & M_POST)
        strcat(allow, allow[0] ? ", POST" : "POST");
    if (methods & M_DELETE)
        strcat(allow, allow[0] ? ", DELETE" : "DELETE");
    srv_reply_header(h, "Allow", allow);
}

void srv_http_dispatch(struct evhttp_request *req, void *arg)
{
    struct srv_thread *t = arg;
    struct srv_hreq h;
    memset(&h, 0, sizeof(h));
    h.t = t;
    h.req = req;
    h.t0_ns = srv_now_ns();
    h.route = SRV_R_OTHER;
    h.method = (int)evhttp_request_get_command(req);
    atomic_store_explicit(&t->inflight,
                          atomic_load_explicit(&t->inflight, memory_order_relaxed) + 1,
                          memory_order_relaxed);
    struct evhttp_connection *evcon = evhttp_request_get_connection(req);
    h.conn = conn_find(t, evcon);
    if (h.conn == NULL && evcon != NULL) /* not seen at accept (should not happen): track now */
        h.conn = conn_add(t, evcon, 0);
    if (h.conn != NULL) { /* the request is complete: its read deadline is over */
        h.conn->rstate = RS_DISPATCHED;
        if (h.conn->ev_deadline != NULL)
            evtimer_del(h.conn->ev_deadline);
    }
    const struct evhttp_uri *uri = evhttp_request_get_evhttp_uri(req);
    h.path = uri != NULL ? evhttp_uri_get_path(uri) : NULL;
    h.query = uri != NULL ? evhttp_uri_get_query(uri) : NULL;
    if (h.path == NULL || h.path[0] == '\0')
        h.path = "/";
    unsigned method = h.method == EVHTTP_REQ_HEAD ? M_GET : (unsigned)h.method;
    size_t plen = strlen(h.path);
    for (size_t k = 0; k < sizeof(routes) / sizeof(routes[0]); k++) {
        const struct route *r = &routes[k];
        size_t rl = strlen(r->path);
        if (r->prefix ? !(plen > rl + 1 && memcmp(h.path, r->path, rl) == 0 && h.path[rl] == '/')
                      : !(plen == rl && memcmp(h.path, r->path, rl) == 0))
            continue;
        h.route = r->route;
        if (!(r->methods & method)) {
            allow_header(&h, r->methods);
            srv_reply_error(&h, 405, "method not allowed on %s", h.path);
            return;
        }
        if ((r->gated & method) && !(r->indexer == GATE_INDEXER && t->srv->cfg->open_indexer_api) &&
            !srv_admin_allowed(&h))
            return;
        r->fn(&h);
        return;
    }
    srv_reply_error(&h, 404, "no route for %s", h.path);
}
