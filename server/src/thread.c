/* thread.c - HTTP threads: event base, evhttp, listener, housekeeping (see thread.h). */
#include "thread.h"

#include <event2/buffer.h>
#include <event2/dns.h>
#include <event2/event.h>
#include <event2/http.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "clock.h"

#if defined(__SANITIZE_THREAD__)
#define KVR_UNDER_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define KVR_UNDER_TSAN 1
#endif
#endif
#ifndef KVR_UNDER_TSAN
#define KVR_UNDER_TSAN 0
#endif
#include "kvr/err.h"
#include "policy.h"
#include "upstream.h"

static void on_fresh(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    srv_http_register_fresh(arg);
}

static void on_abort(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    srv_http_run_aborts(arg);
}

static void on_tick(evutil_socket_t fd, short what, void *arg)
{
    struct srv_thread *t = arg;
    (void)fd;
    (void)what;
    srv_pools_sweep(t);
    srv_policy_thread_poll(t);
}

static void on_grace(evutil_socket_t fd, short what, void *arg)
{
    struct srv_thread *t = arg;
    (void)fd;
    (void)what;
    srv_logf(t->srv->log, SRV_LOG_WARN, t->name,
             "shutdown grace period over with %llu request(s) in flight",
             (unsigned long long)atomic_load(&t->inflight));
    event_base_loopexit(t->base, NULL);
}

int srv_thread_init(struct srv *s, struct srv_thread *t, uint32_t idx, int listen_fd, char *err,
                    size_t err_len)
{
    const struct srv_config *cfg = s->cfg;
    memset(t, 0, sizeof(*t));
    t->srv = s;
    t->idx = idx;
    t->listen_fd = listen_fd;
    snprintf(t->name, sizeof(t->name), "w%u", idx);
    t->live.next = t->live.prev = &t->live;
    t->rng = (cfg->seed ^ 0x9E3779B97F4A7C15ull) * (idx + 1) | 1;
    kvr_buf_init(&t->out, NULL);
    atomic_init(&t->inflight, 0);
    atomic_init(&t->n_conns, 0);
    uint64_t per = (cfg->max_connections + s->n_threads - 1) / s->n_threads;
    t->max_conns = per > 0 ? per : 1;

    struct event_config *ec = event_config_new();
    if (ec == NULL)
        goto oom;
    event_config_set_flag(ec, EVENT_BASE_FLAG_NOLOCK);
#if !KVR_UNDER_TSAN
    /* coalesce the per-request enable/disable of read and write interest into one epoll_ctl
     * per fd and loop turn (evhttp flips them several times per request). Safe here (no fd is
     * dup'ed). A deferred EPOLL_CTL_DEL may reach the kernel after the fd was closed and its
     * number reused by another thread (the kernel answers ENOENT, libevent ignores it): harmless,
     * but ThreadSanitizer reports it as a race on the fd, so TSan builds go without. */
    event_config_set_flag(ec, EVENT_BASE_FLAG_EPOLL_USE_CHANGELIST);
#endif
    t->base = event_base_new_with_config(ec);
    event_config_free(ec);
    if (t->base == NULL)
        goto oom;
    t->http = evhttp_new(t->base);
    t->evout = evbuffer_new();
    if (t->http == NULL || t->evout == NULL || srv_jdoc_init(&t->jdoc) != KVR_OK)
        goto oom;
    evhttp_set_max_body_size(t->http, (ev_ssize_t)cfg->max_body);
    evhttp_set_max_headers_size(t->http, (ev_ssize_t)cfg->max_headers);
    struct timeval tv = {(time_t)(cfg->timeout_ms / 1000),
                         (suseconds_t)(cfg->timeout_ms % 1000) * 1000};
    evhttp_set_timeout_tv(t->http, &tv);
    evhttp_set_allowed_methods(t->http, EVHTTP_REQ_GET | EVHTTP_REQ_POST | EVHTTP_REQ_HEAD |
                                            EVHTTP_REQ_PUT | EVHTTP_REQ_DELETE | EVHTTP_REQ_PATCH |
                                            EVHTTP_REQ_OPTIONS);
    evhttp_set_default_content_type(t->http, "application/json");
    evhttp_set_flags(t->http, EVHTTP_SERVER_LINGERING_CLOSE);
    evhttp_set_gencb(t->http, srv_http_dispatch, t);
    evhttp_set_bevcb(t->http, srv_http_bevcb, t);
    t->bound = evhttp_accept_socket_with_handle(t->http, listen_fd);
    if (t->bound == NULL) {
        snprintf(err, err_len, "thread %u: cannot accept on the listening socket", idx);
        return KVR_EIO;
    }
    t->listen_fd = -1; /* evhttp owns (and closes) it now */
    t->dns = evdns_base_new(t->base, EVDNS_BASE_INITIALIZE_NAMESERVERS);
    if (t->dns == NULL) /* no resolv.conf: numeric hosts still work */
        t->dns = evdns_base_new(t->base, 0);
    if (srv_mq_init(&t->mq, t->base, t) != KVR_OK)
        goto oom;
    t->ev_fresh = event_new(t->base, -1, 0, on_fresh, t);
    t->ev_tick = event_new(t->base, -1, EV_PERSIST, on_tick, t);
    t->ev_grace = evtimer_new(t->base, on_grace, t);
    t->ev_abort = event_new(t->base, -1, 0, on_abort, t);
    if (t->ev_fresh == NULL || t->ev_tick == NULL || t->ev_grace == NULL || t->ev_abort == NULL)
        goto oom;
    struct timeval one = {1, 0};
    event_add(t->ev_tick, &one);
    return KVR_OK;
oom:
    snprintf(err, err_len, "thread %u: out of memory", idx);
    return KVR_ENOMEM;
}

static void *thread_main(void *arg)
{
    struct srv_thread *t = arg;
    srv_policy_thread_init(t);
    event_base_dispatch(t->base);

    /* the loop is over: release every long-lived context, then the pools, then the server side
     * (evhttp_free closes the remaining client connections) */
    while (t->live.next != &t->live) {
        struct srv_live *l = t->live.next;
        srv_live_del(l);
        l->kill(l);
    }
    srv_pools_free(t);
    if (t->bound != NULL)
        evhttp_del_accept_socket(t->http, t->bound);
    t->bound = NULL;
    evhttp_free(t->http);
    t->http = NULL;
    srv_policy_thread_free(t);
    return NULL;
}

int srv_thread_start(struct srv_thread *t)
{
    if (pthread_create(&t->tid, NULL, thread_main, t) != 0)
        return KVR_EIO;
    t->started = 1;
    return KVR_OK;
}

static void drain_msg(void *ctx, void *arg)
{
    struct srv_thread *t = ctx;
    (void)arg;
    if (srv_mq_closing(&t->mq) || t->draining)
        return;
    if (t->bound != NULL)
        evhttp_del_accept_socket(t->http, t->bound); /* closes the listening socket */
    t->bound = NULL;
    t->draining = 1;
    uint64_t grace = t->srv->cfg->shutdown_grace_ms;
    struct timeval tv = {(time_t)(grace / 1000), (suseconds_t)(grace % 1000) * 1000};
    evtimer_add(t->ev_grace, &tv);
    if (atomic_load_explicit(&t->inflight, memory_order_relaxed) == 0)
        srv_http_exit_when_flushed(t);
}

void srv_thread_drain(struct srv_thread *t)
{
    if (srv_mq_post(&t->mq, drain_msg, NULL) != KVR_OK)
        event_base_loopbreak(t->base); /* NOLOCK base: last resort at OOM */
}

void srv_thread_join(struct srv_thread *t)
{
    if (t->started)
        pthread_join(t->tid, NULL);
    t->started = 0;
}

void srv_thread_free(struct srv_thread *t)
{
    if (t->base == NULL)
        return;
    srv_mq_close(&t->mq);
    if (t->ev_fresh)
        event_free(t->ev_fresh);
    if (t->ev_tick)
        event_free(t->ev_tick);
    if (t->ev_grace)
        event_free(t->ev_grace);
    if (t->ev_abort)
        event_free(t->ev_abort);
    if (t->http != NULL) /* never started */
        evhttp_free(t->http);
    if (t->dns != NULL)
        evdns_base_free(t->dns, 0);
    srv_http_conn_table_free(t);
    if (t->evout != NULL)
        evbuffer_free(t->evout);
    srv_jdoc_free(&t->jdoc);
    kvr_buf_free(&t->out);
    free(t->locals);
    free(t->seqs);
    free(t->tokens);
    free(t->matches);
    free(t->pools);
    event_base_free(t->base);
    t->base = NULL;
    if (t->listen_fd != -1)
        close(t->listen_fd);
    t->listen_fd = -1;
}
