/* api_workers.c - worker management:
 *
 *   GET    /v1/workers[?model=M]        {"workers": [{id, model, url, dp_size, ranks, labels,
 *                                         health, breaker, in_flight, decisions, ok, failed}]}
 *   GET    /v1/workers/{id}[?model=M]   one worker (404 if unknown)
 *   POST   /v1/workers                  {"id", "model"?, "url"?, "zmq"?, "replay"?, "dp_size"?,
 *                                         "labels"?: {k: v}, "block_size"?, "topic"?,
 *                                         "lora_name"?}
 *                                        -> 201 {"status": "ok", "worker": {...}}; 409 if it exists
 *   DELETE /v1/workers/{id}[?model=M]   (or DELETE /v1/workers with {"id", "model"}) -> 200;
 *                                        removes its index state, booked load and subscriptions
 *
 * With dp_size N the worker gets ranks 0..N-1; rank k's ZMQ endpoints are rank 0's shifted by k
 * (TCP port + k, spec/engine-events.md §1). The model is "M" or "M:tenant"; a model that does
 * not exist yet is created (events kind, block_size or the default). "topic" is the ZMQ topic
 * prefix of this worker's events (default: the model's topic; "" = every message); "lora_name"
 * salts the re-hashing of stored blocks whose events carry no LoRA of their own. */
#include <event2/http.h>
#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api.h"
#include "jsonw.h"
#include "kvr/err.h"
#include "registry.h"
#include "server.h"

struct list_ctx {
    struct srv *s;
    struct srv_jw *w;
    struct srv_model *m; /* filter or NULL */
    uint64_t id;         /* filter when has_id */
    int has_id;
    size_t n;
};

static void list_one(void *ctx, struct srv_worker *w)
{
    struct list_ctx *c = ctx;
    if ((c->m != NULL && w->model != c->m) || (c->has_id && w->id != c->id))
        return;
    if (c->has_id && c->n > 0)
        return;
    if (c->n++ > 0)
        srv_jw_char(c->w, ',');
    srv_worker_json(c->s, w, c->w);
}

static int parse_id(const char *s, uint64_t *out)
{
    char *end;
    if (*s < '0' || *s > '9')
        return -1;
    unsigned long long v = strtoull(s, &end, 10);
    if (*end != '\0')
        return -1;
    *out = v;
    return 0;
}

static void get_workers(struct srv_hreq *h, struct srv_model *m, const char *id_text)
{
    struct srv *s = h->t->srv;
    struct list_ctx c = {s, NULL, m, 0, 0, 0};
    struct srv_jw w;
    if (id_text != NULL) {
        if (parse_id(id_text, &c.id) != 0) {
            srv_reply_error(h, 404, "no worker '%s'", id_text);
            return;
        }
        c.has_id = 1;
    }
    kvr_buf_reset(&h->t->out);
    srv_jw_init(&w, &h->t->out);
    c.w = &w;
    if (!c.has_id)
        srv_jw_raw(&w, "{\"workers\":[");
    srv_workers_foreach(&s->workers, list_one, &c);
    if (!c.has_id)
        srv_jw_raw(&w, "]}");
    if (c.has_id && c.n == 0) {
        kvr_buf_reset(&h->t->out);
        srv_reply_error(h, 404, "no worker %s", id_text);
        return;
    }
    srv_reply_out(h, 200, w.err);
}

static void post_worker(struct srv_hreq *h)
{
    struct srv *s = h->t->srv;
    struct srv_jdoc *d = &h->t->jdoc;
    char err[SRV_JERR];
    size_t len;
    const char *body = srv_body(h, &len);
    if (srv_jdoc_parse(d, body, len, err, sizeof(err)) != KVR_OK) {
        srv_reply_error(h, 400, "%s", err);
        return;
    }
    struct json_object *o = d->root, *labels = NULL;
    struct kvr_buf lb;
    kvr_buf_init(&lb, NULL);
    if (o == NULL || !json_object_is_type(o, json_type_object)) {
        srv_reply_error(h, 400, "the body must be a JSON object");
        goto out;
    }
    uint64_t id = 0, dp = 1, bs = 0;
    int has_bs = 0;
    const char *model = "default", *url = NULL, *zmq = NULL, *replay = NULL, *topic = NULL;
    const char *lora = NULL;
    size_t model_len = 7;
    int present = 0;
    int rc = srv_jget_uint(d, o, NULL, "id", 0, UINT64_MAX, &id, &present, err, sizeof(err));
    if (rc == KVR_OK && !present)
        rc = srv_jget_uint(d, o, NULL, "instance_id", 1, UINT64_MAX, &id, NULL, err, sizeof(err));
    if (rc == KVR_OK)
        rc = srv_jget_uint(d, o, NULL, "dp_size", 0, SRV_MAX_RANKS, &dp, NULL, err, sizeof(err));
    if (rc == KVR_OK)
        rc = srv_jget_uint(d, o, NULL, "block_size", 0, 65536, &bs, &has_bs, err, sizeof(err));
    if (rc == KVR_OK)
        rc = srv_jget_str(d, o, NULL, "model", 0, &model, &model_len, NULL, err, sizeof(err));
    if (rc == KVR_OK)
        rc = srv_jget_str(d, o, NULL, "url", 0, &url, NULL, NULL, err, sizeof(err));
    if (rc == KVR_OK) {
        present = 0;
        rc = srv_jget_str(d, o, NULL, "zmq", 0, &zmq, NULL, &present, err, sizeof(err));
        if (rc == KVR_OK && !present)
            rc = srv_jget_str(d, o, NULL, "endpoint", 0, &zmq, NULL, NULL, err, sizeof(err));
    }
    if (rc == KVR_OK)
        rc = srv_jget_str(d, o, NULL, "replay", 0, &replay, NULL, NULL, err, sizeof(err));
    if (rc == KVR_OK)
        rc = srv_jget_str(d, o, NULL, "topic", 0, &topic, NULL, NULL, err, sizeof(err));
    if (rc == KVR_OK)
        rc = srv_jget_str(d, o, NULL, "lora_name", 0, &lora, NULL, NULL, err, sizeof(err));
    if (rc == KVR_OK && srv_jmember(o, "labels", &labels))
        rc = srv_reg_labels_from_json(labels, &lb, err, sizeof(err));
    if (rc != KVR_OK) {
        srv_reply_error(h, rc == KVR_ENOMEM ? 503 : 400, "%s", err);
        goto out;
    }
    if (dp == 0) {
        srv_reply_error(h, 400, "dp_size: expected at least 1");
        goto out;
    }
    if (url == NULL && zmq == NULL) {
        srv_reply_error(h, 400, "give a url (HTTP), a zmq endpoint (KV events) or both");
        goto out;
    }
    struct srv_model *m = NULL;
    rc = srv_models_get_or_create_key(&s->models, model, model_len, has_bs ? (uint32_t)bs : 0,
                                      s->cfg->block_size, s->cfg->tokenizer, &m, err, sizeof(err));
    if (rc != KVR_OK) {
        srv_reply_error(h, rc == KVR_EEXIST ? 409 : srv_status_of(rc), "%s", err);
        goto out;
    }
    struct srv_reg_spec spec = {.id = id,
                                .url = url,
                                .labels = lb.len ? lb.data : NULL,
                                .zmq = zmq,
                                .replay = replay,
                                .topic = topic,
                                .lora = lora,
                                .first_rank = 0,
                                .n_ranks = (uint32_t)dp,
                                .offset_by_rank = 1,
                                .merge = 0};
    int status = srv_reg_add(s, m, &spec, err, sizeof(err));
    if (status != 201) {
        srv_reply_error(h, status, "%s", err);
        goto out;
    }
    struct srv_worker *w = srv_workers_get(&s->workers, m, id);
    struct srv_jw jw;
    kvr_buf_reset(&h->t->out);
    srv_jw_init(&jw, &h->t->out);
    srv_jw_raw(&jw, "{\"status\":\"ok\",\"worker\":");
    if (w != NULL) {
        pthread_rwlock_rdlock(&s->workers.lock);
        srv_worker_json(s, w, &jw);
        pthread_rwlock_unlock(&s->workers.lock);
        srv_worker_unref(w);
    } else {
        srv_jw_raw(&jw, "null");
    }
    srv_jw_char(&jw, '}');
    srv_reply_out(h, 201, jw.err);
out:
    kvr_buf_free(&lb);
    srv_jdoc_release(d);
}

static void delete_worker(struct srv_hreq *h, struct srv_model *m, const char *id_text)
{
    struct srv *s = h->t->srv;
    struct srv_jdoc *d = &h->t->jdoc;
    char err[SRV_JERR];
    uint64_t id = 0;
    if (id_text != NULL) {
        if (parse_id(id_text, &id) != 0) {
            srv_reply_error(h, 404, "no worker '%s'", id_text);
            return;
        }
    } else { /* DELETE /v1/workers with a body */
        size_t len;
        const char *body = srv_body(h, &len);
        if (srv_jdoc_parse(d, body, len, err, sizeof(err)) != KVR_OK ||
            srv_jget_uint(d, d->root, NULL, "id", 1, UINT64_MAX, &id, NULL, err, sizeof(err)) !=
                KVR_OK) {
            srv_jdoc_release(d);
            srv_reply_error(h, 400, "%s", err);
            return;
        }
        const char *model;
        size_t ml;
        int present = 0;
        if (m == NULL &&
            srv_jget_str(d, d->root, NULL, "model", 0, &model, &ml, &present, err, sizeof(err)) ==
                KVR_OK &&
            present && (m = srv_models_find_spec(&s->models, model, ml)) == NULL) {
            srv_jdoc_release(d);
            srv_reply_error(h, 404, "no model '%.*s'", (int)ml, model);
            return;
        }
        srv_jdoc_release(d);
    }
    /* without a model: every model that has this worker id */
    int removed = 0, status = 404;
    size_t n = srv_models_count(&s->models);
    for (size_t k = 0; k < n; k++) {
        struct srv_model *mk = srv_models_at(&s->models, k);
        if (m != NULL && mk != m)
            continue;
        status = srv_reg_remove(s, mk, id, -1, err, sizeof(err));
        removed += status == 200;
    }
    if (removed == 0) {
        srv_reply_error(h, 404, "worker %llu is not registered%s%s", (unsigned long long)id,
                        m ? " for model " : "", m ? m->key : "");
        return;
    }
    char out[96];
    int len = snprintf(out, sizeof(out), "{\"status\":\"ok\",\"removed\":%d}", removed);
    srv_reply(h, 200, NULL, out, (size_t)len);
}

void srv_api_v1_workers(struct srv_hreq *h)
{
    struct srv *s = h->t->srv;
    const char *id_text = NULL;
    if (strncmp(h->path, "/v1/workers/", 12) == 0)
        id_text = h->path + 12;
    char model[256];
    struct srv_model *m = NULL;
    if (srv_query_param(h, "model", model, sizeof(model))) {
        m = srv_models_find_spec(&s->models, model, strlen(model));
        if (m == NULL) {
            srv_reply_error(h, 404, "no model '%s'", model);
            return;
        }
    }
    switch (h->method) {
    case EVHTTP_REQ_GET:
    case EVHTTP_REQ_HEAD:
        get_workers(h, m, id_text);
        return;
    case EVHTTP_REQ_POST:
        if (id_text != NULL) {
            srv_reply_error(h, 405, "POST /v1/workers (without an id) registers a worker");
            return;
        }
        post_worker(h);
        return;
    case EVHTTP_REQ_DELETE:
        delete_worker(h, m, id_text);
        return;
    default:
        srv_reply_error(h, 405, "method not allowed");
    }
}
