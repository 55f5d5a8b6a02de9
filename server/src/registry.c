/* registry.c - worker registration with subscriptions and index/load cleanup (registry.h). */
#include "registry.h"

#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvr/err.h"
#include "clock.h"
#include "kvr/kv_subscriber.h"

int srv_reg_add(struct srv *s, struct srv_model *m, const struct srv_reg_spec *spec, char *err,
                size_t err_len)
{
    uint32_t n = spec->n_ranks ? spec->n_ranks : 1;
    if (n > SRV_MAX_RANKS) {
        snprintf(err, err_len, "at most %d ranks per worker", SRV_MAX_RANKS);
        return 400;
    }
    uint32_t *ranks = calloc(n, sizeof(*ranks));
    uint32_t *subs = calloc(n, sizeof(*subs));
    int *subscribed = calloc(n, sizeof(*subscribed));
    char **zmq = calloc(n, sizeof(*zmq)), **replay = calloc(n, sizeof(*replay));
    int status = 503;
    if (ranks == NULL || subs == NULL || subscribed == NULL || zmq == NULL || replay == NULL) {
        snprintf(err, err_len, "out of memory");
        goto out;
    }
    status = 201;
    for (uint32_t k = 0; k < n && status == 201; k++) {
        uint32_t rank = spec->first_rank + k;
        ranks[k] = rank;
        if (spec->zmq == NULL)
            continue;
        char ep[512], rp[512];
        int rc = KVR_OK;
        if (spec->offset_by_rank) {
            rc = kvr_kvsub_rank_endpoint(spec->zmq, rank, ep, sizeof(ep));
            if (rc == KVR_OK && spec->replay != NULL)
                rc = kvr_kvsub_rank_endpoint(spec->replay, rank, rp, sizeof(rp));
        } else {
            snprintf(ep, sizeof(ep), "%s", spec->zmq);
            if (spec->replay != NULL)
                snprintf(rp, sizeof(rp), "%s", spec->replay);
        }
        if (rc != KVR_OK) {
            snprintf(err, err_len, "cannot derive the endpoint of dp_rank %u from '%s'", rank,
                     spec->zmq);
            status = 400;
            break;
        }
        zmq[k] = strdup(ep);
        replay[k] = spec->replay != NULL ? strdup(rp) : NULL;
        if (zmq[k] == NULL || (spec->replay != NULL && replay[k] == NULL)) {
            snprintf(err, err_len, "out of memory");
            status = 503;
            break;
        }
        const char *rep = spec->replay != NULL ? rp : NULL;
        rc = srv_model_subscribe(&s->models, m, spec->id, rank, ep, rep, spec->topic, spec->lora,
                                 &subs[k], err, err_len);
        if (rc != KVR_OK) {
            status = rc == KVR_EEXIST ? 409 : rc == KVR_EINVAL ? 400 : 503;
            break;
        }
        subscribed[k] = 1;
    }
    if (status == 201) {
        struct srv_worker_spec ws = {.id = spec->id,
                                     .url = spec->url,
                                     .labels = spec->labels,
                                     .dp_size = spec->first_rank + n,
                                     .n_ranks = n,
                                     .ranks = ranks,
                                     .zmq = (const char *const *)zmq,
                                     .replay = (const char *const *)replay,
                                     .sub_ids = subs,
                                     .subscribed = subscribed,
                                     .merge = spec->merge};
        int rc = srv_workers_register(&s->workers, m, &ws, NULL, err, err_len);
        if (rc != KVR_OK)
            status = rc == KVR_EEXIST ? 409 : rc == KVR_EINVAL ? 400 : 503;
        else
            srv_logf(s->log, SRV_LOG_INFO, "registry",
                     "%s: worker %llu rank(s) %u..%u registered%s%s%s%s", m->key,
                     (unsigned long long)spec->id, spec->first_rank, spec->first_rank + n - 1,
                     spec->url ? " url " : "", spec->url ? spec->url : "", spec->zmq ? " zmq " : "",
                     spec->zmq ? spec->zmq : "");
    }
    if (status != 201)
        for (uint32_t k = 0; k < n; k++)
            if (subscribed[k])
                srv_model_unsubscribe(m, subs[k]);
out:
    if (zmq != NULL)
        for (uint32_t k = 0; k < n; k++)
            free(zmq[k]);
    if (replay != NULL)
        for (uint32_t k = 0; k < n; k++)
            free(replay[k]);
    free(zmq);
    free(replay);
    free(ranks);
    free(subs);
    free(subscribed);
    return status;
}

int srv_reg_remove(struct srv *s, struct srv_model *m, uint64_t id, int64_t dp_rank, char *err,
                   size_t err_len)
{
    struct srv_removed *rm = malloc(sizeof(*rm));
    if (rm == NULL) {
        snprintf(err, err_len, "out of memory");
        return 503;
    }
    int rc = srv_workers_remove(&s->workers, m, id, dp_rank, rm);
    if (rc != KVR_OK) {
        if (dp_rank >= 0)
            snprintf(err, err_len, "worker %llu dp_rank %lld is not registered for model %s",
                     (unsigned long long)id, (long long)dp_rank, m->key);
        else
            snprintf(err, err_len, "worker %llu is not registered for model %s",
                     (unsigned long long)id, m->key);
        free(rm);
        return 404;
    }
    for (size_t k = 0; k < rm->n; k++)
        srv_model_unsubscribe(m, rm->sub_ids[k]);
    if (dp_rank >= 0 && !rm->whole)
        kvr_index_remove_rank(m->index, id, (uint32_t)dp_rank);
    else
        kvr_index_remove_worker(m->index, id);
    if (rm->whole) {
        kvr_load_remove_worker(m->load, id);
        if (m->approx != NULL)
            kvr_approx_forget_worker(m->approx, id);
    }
    srv_logf(s->log, SRV_LOG_INFO, "registry", "%s: worker %llu %s removed", m->key,
             (unsigned long long)id, rm->whole ? "(all ranks)" : "rank");
    free(rm);
    return 200;
}

void srv_worker_json(struct srv *s, struct srv_worker *w, struct srv_jw *jw)
{
    uint64_t now = srv_now_ms();
    int brk;
    pthread_mutex_lock(&w->mu);
    brk = srv_breaker_state(&w->breaker, &s->workers.brk, now);
    pthread_mutex_unlock(&w->mu);
    srv_jw_raw(jw, "{\"id\":");
    srv_jw_u64(jw, w->id);
    srv_jw_raw(jw, ",\"model\":");
    srv_jw_cstr(jw, w->model->key);
    srv_jw_raw(jw, ",\"url\":");
    srv_jw_cstr(jw, w->url);
    srv_jw_raw(jw, ",\"dp_size\":");
    srv_jw_u64(jw, w->dp_size);
    srv_jw_raw(jw, ",\"ranks\":[");
    for (size_t k = 0; k < w->n_ranks; k++) {
        if (k > 0)
            srv_jw_char(jw, ',');
        srv_jw_raw(jw, "{\"dp_rank\":");
        srv_jw_u64(jw, w->ranks[k].rank);
        srv_jw_raw(jw, ",\"zmq\":");
        srv_jw_cstr(jw, w->ranks[k].zmq);
        srv_jw_raw(jw, ",\"replay\":");
        srv_jw_cstr(jw, w->ranks[k].replay);
        srv_jw_char(jw, '}');
    }
    srv_jw_raw(jw, "],\"labels\":{");
    if (w->labels != NULL) {
        const char *p = w->labels;
        int first = 1;
        while (*p) {
            const char *eq = strchr(p, '='), *comma = strchr(p, ',');
            if (comma == NULL)
                comma = p + strlen(p);
            if (eq == NULL || eq > comma)
                break;
            if (!first)
                srv_jw_char(jw, ',');
            first = 0;
            srv_jw_str(jw, p, (size_t)(eq - p));
            srv_jw_char(jw, ':');
            srv_jw_str(jw, eq + 1, (size_t)(comma - eq - 1));
            p = *comma ? comma + 1 : comma;
        }
    }
    srv_jw_raw(jw, "},\"health\":");
    srv_jw_cstr(jw, srv_health_state_name(atomic_load(&w->health_state)));
    srv_jw_raw(jw, ",\"breaker\":");
    srv_jw_cstr(jw, srv_breaker_state_name(brk));
    srv_jw_raw(jw, ",\"in_flight\":");
    srv_jw_u64(jw, atomic_load(&w->in_flight));
    srv_jw_raw(jw, ",\"decisions\":");
    srv_jw_u64(jw, atomic_load(&w->decisions));
    srv_jw_raw(jw, ",\"ok\":");
    srv_jw_u64(jw, atomic_load(&w->ok));
    srv_jw_raw(jw, ",\"failed\":");
    srv_jw_u64(jw, atomic_load(&w->failed));
    srv_jw_char(jw, '}');
}

int srv_reg_labels_from_json(struct json_object *labels, struct kvr_buf *out, char *err,
                             size_t err_len)
{
    if (labels == NULL)
        return KVR_OK;
    if (!json_object_is_type(labels, json_type_object)) {
        snprintf(err, err_len, "labels: expected an object of strings");
        return KVR_ECORRUPT;
    }
    json_object_object_foreach(labels, k, v)
    {
        const char *val = v != NULL ? json_object_get_string(v) : NULL;
        if (val == NULL || !json_object_is_type(v, json_type_string) || *k == '\0' ||
            strpbrk(k, ",=") != NULL || strchr(val, ',') != NULL || *val == '\0') {
            snprintf(err, err_len,
                     "labels.%s: expected a non-empty string; keys and values may not contain "
                     "',' (keys not '=')",
                     k);
            return KVR_ECORRUPT;
        }
        if ((out->len > 0 && kvr_buf_append_char(out, ',') != KVR_OK) ||
            kvr_buf_append_str(out, k) != KVR_OK || kvr_buf_append_char(out, '=') != KVR_OK ||
            kvr_buf_append_str(out, val) != KVR_OK)
            return KVR_ENOMEM;
    }
    return KVR_OK;
}
