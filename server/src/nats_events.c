/* nats_events.c - KV events from NATS subjects (see nats_events.h). */
#include "nats_events.h"

#include <nats/nats.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "clock.h"
#include "kvr/err.h"
#include "kvr/event_json.h"
#include "models.h"
#include "nats_conn.h"
#include "prom.h"
#include "server.h"

struct source {
    struct srv_nats_events *ne;
    struct srv_model *m;
    char *subject, *stream; /* borrowed from the model */
    natsSubscription *sub;
    struct kvr_event_list l; /* delivery-thread scratch */
    struct srv_ratelimit rl;
    _Atomic uint64_t messages, events, rejected, bad_messages, bytes;
};

struct srv_nats_events {
    struct srv *s;
    char *url;
    natsOptions *opts;
    natsConnection *nc;
    jsCtx *js;
    struct source *src;
    size_t n;
    pthread_t thr; /* subscribes once the server is reachable */
    int started;
    _Atomic int stop;
    _Atomic int subscribed; /* every source */
    char last_err[256];
    pthread_mutex_t mu; /* last_err */
};

static void on_msg(natsConnection *nc, natsSubscription *sub, natsMsg *msg, void *closure)
{
    struct source *so = closure;
    (void)nc;
    (void)sub;
    const char *data = natsMsg_GetData(msg);
    size_t len = (size_t)natsMsg_GetDataLength(msg);
    atomic_fetch_add_explicit(&so->messages, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&so->bytes, len, memory_order_relaxed);
    struct kvr_event_json_error errs[1];
    struct kvr_event_json_report rep = {.errors = errs, .cap = 1};
    kvr_event_list_reset(&so->l);
    int rc = kvr_event_json_decode_body(data, len, &so->l, &rep);
    if (rc != KVR_OK || rep.failed > 0) {
        atomic_fetch_add_explicit(&so->bad_messages, 1, memory_order_relaxed);
        atomic_fetch_add_explicit(&so->rejected, rc != KVR_OK ? 1 : rep.failed,
                                  memory_order_relaxed);
        if (srv_log_ratelimit(&so->rl, srv_now_ms(), 10000))
            srv_logf(so->ne->s->log, SRV_LOG_WARN, "nats", "%s: %s", so->subject,
                     rep.n_errors > 0 ? errs[0].msg : kvr_strerror(rc));
    }
    if (so->l.n > 0) {
        srv_model_apply_events(so->m, so->l.ev, so->l.n);
        atomic_fetch_add_explicit(&so->events, so->l.n, memory_order_relaxed);
    }
    natsMsg_Destroy(msg);
}

static int subscribe(struct srv_nats_events *ne, struct source *so, char *err, size_t err_len)
{
    natsStatus st;
    if (so->stream == NULL) {
        st = natsConnection_Subscribe(&so->sub, ne->nc, so->subject, on_msg, so);
    } else {
        jsSubOptions so_opts;
        jsSubOptions_Init(&so_opts);
        so_opts.Stream = so->stream;
        so_opts.Ordered = true; /* in order, from the first message; recreated after a gap */
        so_opts.Config.DeliverPolicy = js_DeliverAll;
        jsErrCode jerr = 0;
        st = js_Subscribe(&so->sub, ne->js, so->subject, on_msg, so, NULL, &so_opts, &jerr);
        if (st != NATS_OK) {
            snprintf(err, err_len, "stream %s, subject %s: %s (JetStream error %d)", so->stream,
                     so->subject, natsStatus_GetText(st), (int)jerr);
            return -1;
        }
    }
    if (st == NATS_OK)
        st = natsSubscription_SetPendingLimits(so->sub, 1 << 20, 512 * 1024 * 1024);
    if (st != NATS_OK) {
        snprintf(err, err_len, "subject %s: %s", so->subject, natsStatus_GetText(st));
        return -1;
    }
    return 0;
}

/* Subscribes every source, retrying every 500 ms while the server is unreachable. */
static void *setup_main(void *arg)
{
    struct srv_nats_events *ne = arg;
    size_t done = 0;
    while (!atomic_load(&ne->stop) && done < ne->n) {
        if (natsConnection_Status(ne->nc) == NATS_CONN_STATUS_CONNECTED) {
            char err[256];
            while (done < ne->n && subscribe(ne, &ne->src[done], err, sizeof(err)) == 0) {
                srv_logf(ne->s->log, SRV_LOG_INFO, "nats", "%s: KV events from %s%s%s",
                         ne->src[done].m->key, ne->src[done].subject,
                         ne->src[done].stream ? ", replayed from stream " : "",
                         ne->src[done].stream ? ne->src[done].stream : "");
                done++;
            }
            if (done < ne->n) {
                pthread_mutex_lock(&ne->mu);
                if (strcmp(ne->last_err, err) != 0)
                    srv_logf(ne->s->log, SRV_LOG_WARN, "nats", "cannot subscribe yet: %s", err);
                snprintf(ne->last_err, sizeof(ne->last_err), "%s", err);
                pthread_mutex_unlock(&ne->mu);
            }
        }
        struct timespec ts = {0, 500 * 1000000L};
        for (int k = 0; k < 10 && !atomic_load(&ne->stop) && done < ne->n; k++) {
            ts.tv_nsec = 50 * 1000000L;
            nanosleep(&ts, NULL);
        }
    }
    if (done == ne->n)
        atomic_store(&ne->subscribed, 1);
    return NULL;
}

int srv_nats_events_new(struct srv *s, const char *nats_url, struct srv_nats_events **out,
                        char *err, size_t err_len)
{
    *out = NULL;
    size_t nm = srv_models_count(&s->models), n = 0;
    for (size_t k = 0; k < nm; k++)
        n += srv_models_at(&s->models, k)->nats_subject != NULL;
    if (n == 0)
        return KVR_OK;
    if (nats_url == NULL) {
        snprintf(err, err_len, "nats_subject needs --nats URL");
        return KVR_EINVAL;
    }
    struct srv_nats_events *ne = calloc(1, sizeof(*ne));
    if (ne == NULL || (ne->src = calloc(n, sizeof(*ne->src))) == NULL ||
        (ne->url = strdup(nats_url)) == NULL) {
        if (ne != NULL)
            free(ne->src);
        free(ne);
        snprintf(err, err_len, "out of memory");
        return KVR_ENOMEM;
    }
    ne->s = s;
    pthread_mutex_init(&ne->mu, NULL);
    for (size_t k = 0; k < nm; k++) {
        struct srv_model *m = srv_models_at(&s->models, k);
        if (m->nats_subject == NULL)
            continue;
        struct source *so = &ne->src[ne->n++];
        so->ne = ne;
        so->m = m;
        so->subject = m->nats_subject;
        so->stream = m->nats_stream;
        kvr_event_list_init(&so->l);
    }
    *out = ne;
    return KVR_OK;
}

int srv_nats_events_start(struct srv_nats_events *ne, char *err, size_t err_len)
{
    if (ne == NULL)
        return KVR_OK;
    natsStatus st = srv_nats_options(&ne->opts, ne->url, "kvrouter-events", NULL, NULL);
    int up = 0;
    if (st == NATS_OK)
        st = srv_nats_connect(&ne->nc, ne->opts, &up); /* not up yet: setup_main waits */
    if (st == NATS_OK)
        st = natsConnection_JetStream(&ne->js, ne->nc, NULL);
    if (st != NATS_OK) {
        snprintf(err, err_len, "--nats %s (KV events): %s", ne->url, natsStatus_GetText(st));
        return KVR_EIO;
    }
    if (pthread_create(&ne->thr, NULL, setup_main, ne) != 0) {
        snprintf(err, err_len, "cannot start the NATS events thread");
        return KVR_EIO;
    }
    ne->started = 1;
    return KVR_OK;
}

void srv_nats_events_free(struct srv_nats_events *ne)
{
    if (ne == NULL)
        return;
    atomic_store(&ne->stop, 1);
    if (ne->started)
        pthread_join(ne->thr, NULL);
    for (size_t k = 0; k < ne->n; k++) {
        if (ne->src[k].sub != NULL) {
            natsSubscription_Unsubscribe(ne->src[k].sub);
            natsSubscription_Destroy(ne->src[k].sub);
        }
    }
    if (ne->nc != NULL) {
        natsConnection_Close(ne->nc);
        natsConnection_Destroy(ne->nc);
    }
    for (size_t k = 0; k < ne->n; k++)
        kvr_event_list_free(&ne->src[k].l);
    if (ne->js != NULL)
        jsCtx_Destroy(ne->js);
    natsOptions_Destroy(ne->opts);
    pthread_mutex_destroy(&ne->mu);
    free(ne->src);
    free(ne->url);
    free(ne);
}

void srv_nats_events_metrics(struct srv_nats_events *ne, struct srv_prom *p)
{
    if (ne == NULL)
        return;
    static const struct {
        const char *name, *help;
        size_t off;
    } fams[] = {
        {"kvrouter_nats_events_messages_total", "NATS messages received on a KV-event subject",
         offsetof(struct source, messages)},
        {"kvrouter_nats_events_bytes_total", "bytes of those messages",
         offsetof(struct source, bytes)},
        {"kvrouter_nats_events_applied_total", "RouterEvents from NATS handed to the index",
         offsetof(struct source, events)},
        {"kvrouter_nats_events_rejected_total", "RouterEvents from NATS that did not decode",
         offsetof(struct source, rejected)},
        {"kvrouter_nats_events_bad_messages_total", "NATS messages with at least one bad event",
         offsetof(struct source, bad_messages)},
    };
    for (size_t f = 0; f < sizeof(fams) / sizeof(fams[0]); f++) {
        srv_prom_header(p, fams[f].name, "counter", fams[f].help);
        for (size_t k = 0; k < ne->n; k++) {
            const struct source *so = &ne->src[k];
            struct srv_prom_label l[2] = {{"model", so->m->key}, {"subject", so->subject}};
            srv_prom_u64(p, fams[f].name, l, 2,
                         atomic_load((const _Atomic uint64_t *)((const char *)so + fams[f].off)));
        }
    }
    srv_prom_gauge(p, "kvrouter_nats_events_subscribed",
                   "1 once every KV-event subject is subscribed", atomic_load(&ne->subscribed));
}
