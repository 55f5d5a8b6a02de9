/* workers.c - worker registry, breaker/health gates, graveyard (see workers.h). */
#include "workers.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "kvr/err.h"
#include "models.h"

int srv_workers_init(struct srv_workers *ws, const struct srv_breaker_cfg *brk,
                     const struct srv_health_cfg *hcfg)
{
    memset(ws, 0, sizeof(*ws));
    ws->brk = *brk;
    ws->hcfg = *hcfg;
    ws->next_gen = 1;
    atomic_init(&ws->version, 1);
    return pthread_rwlock_init(&ws->lock, NULL) == 0 ? KVR_OK : KVR_EIO;
}

static void worker_free(struct srv_worker *w)
{
    for (size_t k = 0; k < w->n_ranks; k++) {
        free(w->ranks[k].zmq);
        free(w->ranks[k].replay);
    }
    free(w->ranks);
    free(w->url);
    free(w->labels);
    pthread_mutex_destroy(&w->mu);
    free(w);
}

void srv_workers_free(struct srv_workers *ws)
{
    for (size_t k = 0; k < ws->n; k++)
        worker_free(ws->v[k]);
    for (size_t k = 0; k < ws->n_grave; k++)
        worker_free(ws->grave[k]);
    free(ws->v);
    free(ws->grave);
    pthread_rwlock_destroy(&ws->lock);
    memset(ws, 0, sizeof(*ws));
}

void srv_worker_ref(struct srv_worker *w)
{
    atomic_fetch_add_explicit(&w->refs, 1, memory_order_relaxed);
}

void srv_worker_unref(struct srv_worker *w)
{
    /* the last reference of a removed worker is dropped here; the sweep frees it later (it
     * needs the graveyard lock), so unref never frees */
    atomic_fetch_sub_explicit(&w->refs, 1, memory_order_release);
}

int srv_worker_parse_url(const char *url, char *host, size_t host_cap, uint16_t *port, char *prefix,
                         size_t prefix_cap)
{
    if (url == NULL || strncmp(url, "http://", 7) != 0)
        return -1;
    const char *h = url + 7, *end = h;
    while (*end && *end != '/')
        end++;
    const char *colon = NULL;
    if (*h == '[') { /* [v6]:port */
        const char *rb = memchr(h, ']', (size_t)(end - h));
        if (rb == NULL)
            return -1;
        if (rb + 1 < end) {
            if (rb[1] != ':')
                return -1;
            colon = rb + 1;
        }
        size_t hl = (size_t)(rb - h - 1);
        if (hl == 0 || hl >= host_cap)
            return -1;
        memcpy(host, h + 1, hl);
        host[hl] = '\0';
    } else {
        colon = memchr(h, ':', (size_t)(end - h));
        size_t hl = (size_t)((colon ? colon : end) - h);
        if (hl == 0 || hl >= host_cap)
            return -1;
        memcpy(host, h, hl);
        host[hl] = '\0';
    }
    unsigned long p = 80;
    if (colon != NULL) {
        char *pe;
        p = strtoul(colon + 1, &pe, 10);
        if (pe != end || p == 0 || p > 65535)
            return -1;
    }
    *port = (uint16_t)p;
    size_t pl = strlen(end);
    while (pl > 0 && end[pl - 1] == '/')
        pl--;
    if (pl >= prefix_cap)
        return -1;
    memcpy(prefix, end, pl);
    prefix[pl] = '\0';
    return 0;
}

static struct srv_wrank *find_rank(struct srv_worker *w, uint32_t rank)
{
    for (size_t k = 0; k < w->n_ranks; k++)
        if (w->ranks[k].rank == rank)
            return &w->ranks[k];
    return NULL;
}

static struct srv_worker *find_locked(struct srv_workers *ws, struct srv_model *m, uint64_t id)
{
    for (size_t k = 0; k < ws->n; k++)
        if (ws->v[k]->id == id && (m == NULL || ws->v[k]->model == m))
            return ws->v[k];
    return NULL;
}

static char *dup_or_null(const char *s, int *oom)
{
    if (s == NULL)
        return NULL;
    char *d = strdup(s);
    if (d == NULL)
        *oom = 1;
    return d;
}

/* Appends the spec's ranks to w (write lock held). */
static int add_ranks(struct srv_worker *w, const struct srv_worker_spec *s)
{
    struct srv_wrank *r = realloc(w->ranks, (w->n_ranks + s->n_ranks) * sizeof(*r));
    if (r == NULL && w->n_ranks + s->n_ranks > 0)
        return KVR_ENOMEM;
    w->ranks = r;
    for (uint32_t k = 0; k < s->n_ranks; k++) {
        struct srv_wrank *x = &w->ranks[w->n_ranks + k];
        int oom = 0;
        memset(x, 0, sizeof(*x));
        x->rank = s->ranks[k];
        x->zmq = dup_or_null(s->zmq ? s->zmq[k] : NULL, &oom);
        x->replay = dup_or_null(s->replay ? s->replay[k] : NULL, &oom);
        x->subscribed = s->subscribed ? s->subscribed[k] : 0;
        x->sub_id = x->subscribed ? s->sub_ids[k] : 0;
        if (oom) {
            for (uint32_t j = 0; j <= k; j++) {
                free(w->ranks[w->n_ranks + j].zmq);
                free(w->ranks[w->n_ranks + j].replay);
            }
            return KVR_ENOMEM;
        }
    }
    w->n_ranks += s->n_ranks;
    return KVR_OK;
}

int srv_workers_register(struct srv_workers *ws, struct srv_model *m,
                         const struct srv_worker_spec *spec, struct srv_worker **out, char *err,
                         size_t err_len)
{
    for (uint32_t k = 0; k < spec->n_ranks; k++)
        for (uint32_t j = 0; j < k; j++)
            if (spec->ranks[j] == spec->ranks[k]) {
                snprintf(err, err_len, "dp_rank %u given twice", spec->ranks[k]);
                return KVR_EINVAL;
            }
    struct srv_worker *nw = NULL;
    if (spec->url != NULL || !spec->merge) {
        /* prepare a new worker outside the lock (also used to validate the URL) */
        nw = calloc(1, sizeof(*nw));
        if (nw == NULL)
            return KVR_ENOMEM;
        int oom = 0;
        nw->url = dup_or_null(spec->url, &oom);
        nw->labels = dup_or_null(spec->labels, &oom);
        if (oom || pthread_mutex_init(&nw->mu, NULL) != 0) {
            free(nw->url);
            free(nw->labels);
            free(nw);
            return KVR_ENOMEM;
        }
        if (spec->url != NULL &&
            srv_worker_parse_url(spec->url, nw->host, sizeof(nw->host), &nw->port, nw->prefix,
                                 sizeof(nw->prefix)) != 0) {
            snprintf(err, err_len, "url: expected http://HOST[:PORT][/PREFIX], got '%s'",
                     spec->url);
            worker_free(nw);
            return KVR_EINVAL;
        }
        if (spec->url != NULL) {
            if (strchr(nw->host, ':') != NULL)
                snprintf(nw->hostport, sizeof(nw->hostport), "[%s]:%u", nw->host, nw->port);
            else
                snprintf(nw->hostport, sizeof(nw->hostport), "%s:%u", nw->host, nw->port);
        }
        nw->model = m;
        nw->id = spec->id;
        nw->dp_size = spec->dp_size ? spec->dp_size : 1;
        nw->created_ms = srv_now_ms();
        srv_health_init(&nw->health);
        srv_breaker_init(&nw->breaker);
        atomic_init(&nw->refs, 1);
    }
    int rc = KVR_OK;
    pthread_rwlock_wrlock(&ws->lock);
    struct srv_worker *w = find_locked(ws, m, spec->id);
    if (w != NULL && !spec->merge) {
        snprintf(err, err_len, "worker %llu is already registered for model %s",
                 (unsigned long long)spec->id, m->key);
        rc = KVR_EEXIST;
        goto out;
    }
    if (w != NULL) {
        for (uint32_t k = 0; k < spec->n_ranks; k++)
            if (find_rank(w, spec->ranks[k]) != NULL) {
                snprintf(err, err_len, "worker %llu dp_rank %u is already registered for model %s",
                         (unsigned long long)spec->id, spec->ranks[k], m->key);
                rc = KVR_EEXIST;
                goto out;
            }
        if ((rc = add_ranks(w, spec)) != KVR_OK)
            goto out;
        uint32_t top = 0;
        for (size_t k = 0; k < w->n_ranks; k++)
            top = w->ranks[k].rank + 1 > top ? w->ranks[k].rank + 1 : top;
        if (top > w->dp_size)
            w->dp_size = top;
    } else {
        if (nw == NULL) { /* merge without a url: build a bare worker under the lock */
            pthread_rwlock_unlock(&ws->lock);
            struct srv_worker_spec s2 = *spec;
            s2.merge = 0;
            return srv_workers_register(ws, m, &s2, out, err, err_len);
        }
        if (ws->n == ws->cap) {
            size_t cap = ws->cap ? ws->cap * 2 : 16;
            struct srv_worker **v = realloc(ws->v, cap * sizeof(*v));
            if (v == NULL) {
                rc = KVR_ENOMEM;
                goto out;
            }
            ws->v = v;
            ws->cap = cap;
        }
        if ((rc = add_ranks(nw, spec)) != KVR_OK)
            goto out;
        uint32_t top = 0;
        for (size_t k = 0; k < nw->n_ranks; k++)
            top = nw->ranks[k].rank + 1 > top ? nw->ranks[k].rank + 1 : top;
        if (top > nw->dp_size)
            nw->dp_size = top;
        nw->gen = ws->next_gen++;
        ws->v[ws->n++] = nw;
        w = nw;
        nw = NULL;
    }
    atomic_fetch_add(&ws->version, 1);
    if (out != NULL) {
        srv_worker_ref(w);
        *out = w;
    }
out:
    pthread_rwlock_unlock(&ws->lock);
    if (nw != NULL)
        worker_free(nw);
    return rc;
}

int srv_workers_remove(struct srv_workers *ws, struct srv_model *m, uint64_t id, int64_t dp_rank,
                       struct srv_removed *out)
{
    out->model = m;
    out->id = id;
    out->whole = 0;
    out->n = 0;
    int rc = KVR_OK;
    pthread_rwlock_wrlock(&ws->lock);
    struct srv_worker *w = find_locked(ws, m, id);
    if (w == NULL) {
        rc = KVR_ENOTFOUND;
        goto out;
    }
    if (dp_rank >= 0) {
        struct srv_wrank *r = find_rank(w, (uint32_t)dp_rank);
        if (r == NULL) {
            rc = KVR_ENOTFOUND;
            goto out;
        }
        if (r->subscribed)
            out->sub_ids[out->n++] = r->sub_id;
        free(r->zmq);
        free(r->replay);
        *r = w->ranks[--w->n_ranks];
    } else {
        for (size_t k = 0; k < w->n_ranks; k++) {
            if (w->ranks[k].subscribed && out->n < SRV_MAX_RANKS)
                out->sub_ids[out->n++] = w->ranks[k].sub_id;
            free(w->ranks[k].zmq);
            free(w->ranks[k].replay);
            w->ranks[k].zmq = w->ranks[k].replay = NULL;
        }
        w->n_ranks = 0;
    }
    if (w->n_ranks == 0) {
        if (ws->n_grave == ws->cap_grave) {
            size_t cap = ws->cap_grave ? ws->cap_grave * 2 : 16;
            struct srv_worker **g = realloc(ws->grave, cap * sizeof(*g));
            if (g == NULL) { /* keep it registered with no ranks rather than lose track */
                rc = KVR_OK;
                goto out;
            }
            ws->grave = g;
            ws->cap_grave = cap;
        }
        for (size_t k = 0; k < ws->n; k++)
            if (ws->v[k] == w) {
                ws->v[k] = ws->v[--ws->n];
                break;
            }
        w->removed_ms = srv_now_ms();
        atomic_store(&w->removed, 1);
        srv_worker_unref(w); /* the registry's reference */
        ws->grave[ws->n_grave++] = w;
        out->whole = 1;
    }
    atomic_fetch_add(&ws->version, 1);
out:
    pthread_rwlock_unlock(&ws->lock);
    return rc;
}

struct srv_worker *srv_workers_get(struct srv_workers *ws, struct srv_model *m, uint64_t id)
{
    pthread_rwlock_rdlock(&ws->lock);
    struct srv_worker *w = find_locked(ws, m, id);
    if (w != NULL)
        srv_worker_ref(w);
    pthread_rwlock_unlock(&ws->lock);
    return w;
}

static int eligible(const struct srv_worker *w, uint64_t now_ms)
{
    if (atomic_load_explicit(&w->health_state, memory_order_relaxed) != SRV_HEALTH_HEALTHY)
        return 0;
    int b = atomic_load_explicit(&w->breaker_state, memory_order_relaxed);
    if (b == SRV_BRK_OPEN)
        return now_ms >= atomic_load_explicit(&w->open_until_ms, memory_order_relaxed);
    return 1;
}

size_t srv_workers_candidates(struct srv_workers *ws, struct srv_model *m, uint64_t now_ms,
                              struct srv_cand *out, size_t cap)
{
    size_t n = 0;
    pthread_rwlock_rdlock(&ws->lock);
    for (size_t k = 0; k < ws->n; k++) {
        struct srv_worker *w = ws->v[k];
        if (w->model != m)
            continue;
        int el = eligible(w, now_ms);
        for (size_t r = 0; r < w->n_ranks; r++, n++)
            if (n < cap) {
                out[n].w = w;
                out[n].dp_rank = w->ranks[r].rank;
                out[n].eligible = el;
            }
    }
    pthread_rwlock_unlock(&ws->lock);
    return n;
}

static void publish_breaker(struct srv_workers *ws, struct srv_worker *w)
{
    atomic_store_explicit(&w->breaker_state, w->breaker.state, memory_order_relaxed);
    atomic_store_explicit(&w->open_until_ms, w->breaker.opened_ms + ws->brk.open_ms,
                          memory_order_relaxed);
}

int srv_worker_acquire(struct srv_workers *ws, struct srv_worker *w, uint64_t now_ms, int *probe)
{
    pthread_mutex_lock(&w->mu);
    int ok = srv_breaker_acquire(&w->breaker, &ws->brk, now_ms, probe);
    publish_breaker(ws, w);
    pthread_mutex_unlock(&w->mu);
    return ok;
}

void srv_worker_report(struct srv_workers *ws, struct srv_worker *w, int ok, int probe,
                       uint64_t now_ms)
{
    pthread_mutex_lock(&w->mu);
    if (ok < 0) {
        if (probe && w->breaker.probes_out > 0)
            w->breaker.probes_out--;
    } else {
        srv_breaker_report(&w->breaker, &ws->brk, ok, probe, now_ms);
    }
    publish_breaker(ws, w);
    pthread_mutex_unlock(&w->mu);
}

int srv_worker_health_report(struct srv_workers *ws, struct srv_worker *w, int ok)
{
    pthread_mutex_lock(&w->mu);
    int changed = srv_health_report(&w->health, &ws->hcfg, ok);
    atomic_store_explicit(&w->health_state, w->health.state, memory_order_relaxed);
    pthread_mutex_unlock(&w->mu);
    atomic_fetch_add_explicit(ok ? &w->hc_ok : &w->hc_failed, 1, memory_order_relaxed);
    return changed;
}

void srv_workers_foreach(struct srv_workers *ws, void (*fn)(void *ctx, struct srv_worker *w),
                         void *ctx)
{
    pthread_rwlock_rdlock(&ws->lock);
    for (size_t k = 0; k < ws->n; k++)
        fn(ctx, ws->v[k]);
    pthread_rwlock_unlock(&ws->lock);
}

size_t srv_workers_sweep(struct srv_workers *ws, uint64_t now_ms)
{
    size_t freed = 0;
    pthread_rwlock_wrlock(&ws->lock);
    for (size_t k = 0; k < ws->n_grave;) {
        struct srv_worker *w = ws->grave[k];
        if (atomic_load_explicit(&w->refs, memory_order_acquire) == 0 &&
            now_ms >= w->removed_ms + SRV_GRAVE_MS) {
            ws->grave[k] = ws->grave[--ws->n_grave];
            worker_free(w);
            freed++;
        } else {
            k++;
        }
    }
    pthread_rwlock_unlock(&ws->lock);
    return freed;
}
