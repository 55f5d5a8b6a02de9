/* peer.c - bootstrap from a peer replica (see peer.h). */
#include "peer.h"

#include <event2/buffer.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>
#include <json-c/json.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "clock.h"
#include "jsonr.h"
#include "kvr/err.h"
#include "kvr/event_json.h"
#include "registry.h"
#include "server.h"
#include "snapshots.h"

#define PEER_TIMEOUT_S 10                 /* each GET (spec/http-api.md §4) */
#define PEER_MAX_BODY (1024ull << 20)     /* a dump is at most 1 GiB */
#define PEER_MAX_DUMP_EVENTS (1ull << 26) /* events in one dump */

/* ==== a blocking GET on a private event base ================================================= */

struct get_ctx {
    struct event_base *base;
    struct kvr_buf *body;
    int status;
    int failed;
};

static void get_done(struct evhttp_request *req, void *arg)
{
    struct get_ctx *c = arg;
    if (req == NULL || evhttp_request_get_response_code(req) == 0) {
        c->failed = 1;
    } else {
        c->status = evhttp_request_get_response_code(req);
        struct evbuffer *in = evhttp_request_get_input_buffer(req);
        size_t n = evbuffer_get_length(in);
        if (kvr_buf_reserve(c->body, n + 1) != KVR_OK) {
            c->failed = 1;
        } else {
            evbuffer_remove(in, kvr_buf_tail(c->body), n);
            kvr_buf_commit(c->body, n);
        }
    }
    event_base_loopexit(c->base, NULL);
}

/* GET base_url + path into body (reset first). Returns the HTTP status, or -1 with err. */
static int http_get(const char *base_url, const char *path, const char *token, struct kvr_buf *body,
                    char *err, size_t err_len)
{
    kvr_buf_reset(body);
    struct evhttp_uri *uri = evhttp_uri_parse(base_url);
    struct event_base *base = NULL;
    struct evhttp_connection *conn = NULL;
    int status = -1;
    if (uri == NULL || evhttp_uri_get_host(uri) == NULL) {
        snprintf(err, err_len, "%s: not a URL", base_url);
        goto out;
    }
    int port = evhttp_uri_get_port(uri);
    const char *host = evhttp_uri_get_host(uri);
    base = event_base_new();
    conn = base ? evhttp_connection_base_new(base, NULL, host, (ev_uint16_t)(port > 0 ? port : 80))
                : NULL;
    if (conn == NULL) {
        snprintf(err, err_len, "%s: cannot create a connection", base_url);
        goto out;
    }
    evhttp_connection_set_timeout(conn, PEER_TIMEOUT_S);
    evhttp_connection_set_max_body_size(conn, (ev_ssize_t)PEER_MAX_BODY);
    struct get_ctx c = {base, body, 0, 0};
    struct evhttp_request *req = evhttp_request_new(get_done, &c);
    if (req == NULL) {
        snprintf(err, err_len, "out of memory");
        goto out;
    }
    struct evkeyvalq *hd = evhttp_request_get_output_headers(req);
    char hostport[300], auth[600];
    snprintf(hostport, sizeof(hostport), "%s:%d", host, port > 0 ? port : 80);
    evhttp_add_header(hd, "Host", hostport);
    evhttp_add_header(hd, "Connection", "close");
    if (token != NULL) {
        snprintf(auth, sizeof(auth), "Bearer %s", token);
        evhttp_add_header(hd, "Authorization", auth);
    }
    char full[512];
    const char *prefix = evhttp_uri_get_path(uri);
    snprintf(full, sizeof(full), "%s%s", prefix != NULL && strcmp(prefix, "/") != 0 ? prefix : "",
             path);
    if (evhttp_make_request(conn, req, EVHTTP_REQ_GET, full) != 0) {
        snprintf(err, err_len, "%s%s: cannot send the request", base_url, path);
        goto out;
    }
    event_base_dispatch(base);
    if (c.failed)
        snprintf(err, err_len, "%s%s: no answer (connection failed or timed out)", base_url, path);
    else
        status = c.status;
out:
    if (conn != NULL)
        evhttp_connection_free(conn);
    if (base != NULL)
        event_base_free(base);
    if (uri != NULL)
        evhttp_uri_free(uri);
    return status;
}

/* ==== applying a dump ========================================================================= */

int srv_peer_apply_dump(struct srv *s, const char *text, size_t len, struct srv_peer_dump_stats *st,
                        char *err, size_t err_len)
{
    memset(st, 0, sizeof(*st));
    struct srv_jdoc d;
    if (srv_jdoc_init(&d) != KVR_OK)
        return KVR_ENOMEM;
    int rc = srv_jdoc_parse(&d, text, len, err, err_len);
    struct kvr_event_list l;
    kvr_event_list_init(&l);
    if (rc != KVR_OK)
        goto out;
    if (!json_object_is_type(d.root, json_type_object)) {
        rc = kvr_json_type_error(err, err_len, &d.scan, NULL, "an object keyed \"model:tenant\"",
                                 d.root);
        goto out;
    }
    json_object_object_foreach(d.root, key, val)
    {
        struct kvr_json_path pk = {NULL, key, 0};
        struct json_object *events = NULL;
        struct kvr_json_path pe = {&pk, "events", 0};
        const struct kvr_json_path *at = &pk;
        uint64_t bs = 0;
        char e[256];
        if (val != NULL && json_object_is_type(val, json_type_array)) {
            events = val; /* the older shape */
        } else if (val != NULL && json_object_is_type(val, json_type_object)) {
            if (srv_jmember(val, "error", NULL)) {
                st->skipped++;
                continue;
            }
            if (srv_jget_uint(&d, val, &pk, "block_size", 0, 65536, &bs, NULL, e, sizeof(e)) !=
                    KVR_OK ||
                !srv_jmember(val, "events", &events) || events == NULL ||
                !json_object_is_type(events, json_type_array)) {
                st->skipped++;
                srv_logf(s->log, SRV_LOG_WARN, "peer", "dump section %s skipped: no events array",
                         key);
                continue;
            }
            at = &pe;
        } else {
            st->skipped++;
            continue;
        }
        struct srv_model *m = NULL;
        if (srv_models_get_or_create_key(&s->models, key, strlen(key), (uint32_t)bs,
                                         s->cfg->block_size, s->cfg->tokenizer, &m, e,
                                         sizeof(e)) != KVR_OK)
            m = NULL;
        if (m == NULL || m->kind != SRV_KIND_EVENTS) {
            st->skipped++;
            srv_logf(s->log, SRV_LOG_WARN, "peer", "dump section %s skipped: %s", key,
                     m == NULL ? e : "approximate model (refills from routing)");
            continue;
        }
        size_t n = json_object_array_length(events);
        if (n > PEER_MAX_DUMP_EVENTS) {
            st->skipped++;
            continue;
        }
        kvr_event_list_reset(&l);
        for (size_t k = 0; k < n; k++) {
            struct kvr_json_path pi = {at, NULL, k};
            if (kvr_event_json_decode(json_object_array_get_idx(events, k), &d.scan, &pi, &l, e,
                                      sizeof(e)) != KVR_OK)
                st->rejected++;
        }
        size_t failed = kvr_index_apply_batch(m->index, l.ev, l.n, NULL);
        st->rejected += failed;
        st->events += l.n - failed;
        st->models++;
    }
    rc = KVR_OK;
out:
    kvr_event_list_free(&l);
    srv_jdoc_free(&d);
    return rc;
}

/* ==== the bootstrap thread ==================================================================== */

struct boot {
    struct srv *s;
    pthread_t thr;
    _Atomic int stop;
};

/* Sleeps up to ms, waking early when asked to stop; 1 if stopping. */
static int nap(struct boot *b, uint64_t ms)
{
    uint64_t end = srv_now_ms() + ms;
    while (!atomic_load(&b->stop)) {
        uint64_t now = srv_now_ms();
        if (now >= end)
            return 0;
        uint64_t step = end - now < 20 ? end - now : 20;
        struct timespec ts = {0, (long)(step * 1000000u)};
        nanosleep(&ts, NULL);
    }
    return 1;
}

/* Models of the peer (GET /v1/models): created here with their block size and kind. */
static int fetch_models(struct srv *s, const char *peer, const char *token, struct kvr_buf *b,
                        char *err, size_t err_len)
{
    int st = http_get(peer, "/v1/models", token, b, err, err_len);
    if (st != 200) {
        if (st > 0)
            snprintf(err, err_len, "%s/v1/models: HTTP %d", peer, st);
        return -1;
    }
    struct srv_jdoc d;
    if (srv_jdoc_init(&d) != KVR_OK)
        return -1;
    int rc = -1;
    struct json_object *data = NULL;
    if (srv_jdoc_parse(&d, b->data, b->len, err, err_len) != KVR_OK ||
        !json_object_is_type(d.root, json_type_object) || !srv_jmember(d.root, "data", &data) ||
        data == NULL || !json_object_is_type(data, json_type_array)) {
        snprintf(err, err_len, "%s/v1/models: not a model list", peer);
        goto out;
    }
    for (size_t k = 0; k < json_object_array_length(data); k++) {
        struct json_object *o = json_object_array_get_idx(data, k);
        struct kvr_json_path p = {NULL, NULL, k};
        const char *name = NULL, *tenant = "default", *kind = NULL;
        uint64_t bs = 0;
        if (!json_object_is_type(o, json_type_object) ||
            srv_jget_str(&d, o, &p, "id", 1, &name, NULL, NULL, err, err_len) != KVR_OK ||
            srv_jget_str(&d, o, &p, "tenant", 0, &tenant, NULL, NULL, err, err_len) != KVR_OK ||
            srv_jget_str(&d, o, &p, "kind", 0, &kind, NULL, NULL, err, err_len) != KVR_OK ||
            srv_jget_uint(&d, o, &p, "block_size", 1, 65536, &bs, NULL, err, err_len) != KVR_OK)
            continue;
        char nb[128], tb[64];
        snprintf(nb, sizeof(nb), "%s", name);
        snprintf(tb, sizeof(tb), "%s", tenant);
        struct srv_model_cfg mc;
        srv_model_cfg_defaults(&mc, nb, tb, (uint32_t)bs);
        mc.tokenizer = s->cfg->tokenizer;
        if (kind != NULL && srv_kind_parse(kind) >= 0)
            mc.kind = srv_kind_parse(kind);
        struct srv_model *m;
        char e[256];
        if (srv_models_get_or_create(&s->models, &mc, &m, NULL, e, sizeof(e)) != KVR_OK)
            srv_logf(s->log, SRV_LOG_WARN, "peer", "model %s:%s from %s not created: %s", nb, tb,
                     peer, e);
    }
    rc = 0;
out:
    srv_jdoc_free(&d);
    return rc;
}

/* Workers of the peer (GET /v1/workers): registered here, rank by rank. */
static int fetch_workers(struct srv *s, const char *peer, const char *token, struct kvr_buf *b,
                         size_t *added, char *err, size_t err_len)
{
    *added = 0;
    int st = http_get(peer, "/v1/workers", token, b, err, err_len);
    if (st != 200) {
        if (st > 0)
            snprintf(err, err_len, "%s/v1/workers: HTTP %d", peer, st);
        return -1;
    }
    struct srv_jdoc d;
    if (srv_jdoc_init(&d) != KVR_OK)
        return -1;
    int rc = -1;
    struct json_object *ws = NULL;
    if (srv_jdoc_parse(&d, b->data, b->len, err, err_len) != KVR_OK ||
        !json_object_is_type(d.root, json_type_object) || !srv_jmember(d.root, "workers", &ws) ||
        ws == NULL || !json_object_is_type(ws, json_type_array)) {
        snprintf(err, err_len, "%s/v1/workers: not a worker list", peer);
        goto out;
    }
    for (size_t k = 0; k < json_object_array_length(ws); k++) {
        struct json_object *o = json_object_array_get_idx(ws, k), *ranks = NULL, *labels = NULL;
        struct kvr_json_path p = {NULL, NULL, k};
        uint64_t id = 0;
        const char *model = NULL, *url = NULL;
        char e[256];
        if (!json_object_is_type(o, json_type_object) ||
            srv_jget_uint(&d, o, &p, "id", 1, UINT64_MAX, &id, NULL, e, sizeof(e)) != KVR_OK ||
            srv_jget_str(&d, o, &p, "model", 1, &model, NULL, NULL, e, sizeof(e)) != KVR_OK ||
            srv_jget_str(&d, o, &p, "url", 0, &url, NULL, NULL, e, sizeof(e)) != KVR_OK)
            continue;
        struct srv_model *m = srv_models_find_spec(&s->models, model, strlen(model));
        if (m == NULL)
            continue;
        struct srv_worker *known = srv_workers_get(&s->workers, m, id);
        if (known != NULL) {
            srv_worker_unref(known);
            continue; /* configured here already */
        }
        struct kvr_buf lab;
        kvr_buf_init(&lab, NULL);
        if (srv_jmember(o, "labels", &labels) &&
            srv_reg_labels_from_json(labels, &lab, e, sizeof(e)) != KVR_OK) {
            srv_logf(s->log, SRV_LOG_WARN, "peer", "worker %llu from %s: labels ignored: %s",
                     (unsigned long long)id, peer, e);
            kvr_buf_reset(&lab);
        }
        int nr = 0;
        if (srv_jmember(o, "ranks", &ranks) && ranks != NULL &&
            json_object_is_type(ranks, json_type_array))
            nr = (int)json_object_array_length(ranks);
        for (int r = 0; r < (nr > 0 ? nr : 1); r++) {
            struct json_object *ro = nr > 0 ? json_object_array_get_idx(ranks, (size_t)r) : NULL;
            struct kvr_json_path pr = {&p, "ranks", 0}, pri = {&pr, NULL, (size_t)r};
            uint64_t rank = 0;
            const char *zmq = NULL, *replay = NULL;
            if (ro != NULL && json_object_is_type(ro, json_type_object)) {
                srv_jget_uint(&d, ro, &pri, "dp_rank", 0, UINT32_MAX, &rank, NULL, e, sizeof(e));
                srv_jget_str(&d, ro, &pri, "zmq", 0, &zmq, NULL, NULL, e, sizeof(e));
                srv_jget_str(&d, ro, &pri, "replay", 0, &replay, NULL, NULL, e, sizeof(e));
            }
            if (url == NULL && zmq == NULL)
                continue;
            struct srv_reg_spec spec = {.id = id,
                                        .url = url,
                                        .labels = lab.len ? kvr_buf_cstr(&lab) : NULL,
                                        .zmq = zmq,
                                        .replay = replay,
                                        .first_rank = (uint32_t)rank,
                                        .n_ranks = 1,
                                        .merge = 1};
            int status = srv_reg_add(s, m, &spec, e, sizeof(e));
            if (status == 201)
                (*added)++;
            else
                srv_logf(s->log, SRV_LOG_WARN, "peer", "worker %llu rank %llu from %s: %s",
                         (unsigned long long)id, (unsigned long long)rank, peer, e);
        }
        kvr_buf_free(&lab);
    }
    rc = 0;
out:
    srv_jdoc_free(&d);
    return rc;
}

static void *boot_main(void *arg)
{
    struct boot *b = arg;
    struct srv *s = b->s;
    const struct srv_config *cfg = s->cfg;
    const char *token = cfg->peer_token != NULL ? cfg->peer_token : cfg->admin_token;
    struct kvr_buf body;
    kvr_buf_init(&body, NULL);
    char err[512];
    uint64_t t0 = srv_now_ms();
    int done = 0;
    /* The peers in order; the first that serves its workers and its dump wins. */
    char *list = strdup(cfg->peers);
    for (char *save = NULL, *peer = list ? strtok_r(list, ",", &save) : NULL;
         peer != NULL && !done && !atomic_load(&b->stop); peer = strtok_r(NULL, ",", &save)) {
        size_t added = 0;
        if (fetch_models(s, peer, token, &body, err, sizeof(err)) != 0 ||
            fetch_workers(s, peer, token, &body, &added, err, sizeof(err)) != 0) {
            srv_logf(s->log, SRV_LOG_WARN, "peer", "bootstrap: %s", err);
            continue;
        }
        if (nap(b, cfg->bootstrap_wait_ms)) /* the SUB sockets' slow-joiner window */
            break;
        int st = http_get(peer, "/dump", token, &body, err, sizeof(err));
        if (st != 200) {
            if (st > 0)
                snprintf(err, sizeof(err), "%s/dump: HTTP %d", peer, st);
            srv_logf(s->log, SRV_LOG_WARN, "peer", "bootstrap: %s", err);
            continue;
        }
        struct srv_peer_dump_stats ds;
        if (srv_peer_apply_dump(s, body.data, body.len, &ds, err, sizeof(err)) != KVR_OK) {
            srv_logf(s->log, SRV_LOG_WARN, "peer", "bootstrap: %s/dump: %s", peer, err);
            continue;
        }
        size_t live = srv_models_release_all(&s->models);
        atomic_store(&s->boot_events, ds.events);
        srv_logf(s->log, SRV_LOG_INFO, "peer",
                 "bootstrapped from %s in %llu ms: %zu worker rank(s), %zu model(s), %zu dump "
                 "event(s) (%zu rejected), then %zu buffered live event(s)",
                 peer, (unsigned long long)(srv_now_ms() - t0), added, ds.models, ds.events,
                 ds.rejected, live);
        done = 1;
    }
    free(list);
    if (!done && !atomic_load(&b->stop)) {
        /* no peer answered: our own snapshot, if any, then live */
        if (cfg->snapshot_path != NULL) {
            uint64_t events = 0;
            srv_snapshot_restore(s, cfg->snapshot_path, &events, err, sizeof(err));
        }
        size_t live = srv_models_release_all(&s->models);
        srv_logf(s->log, SRV_LOG_WARN, "peer",
                 "bootstrap: no peer answered; starting from %s (%zu buffered live event(s))",
                 cfg->snapshot_path != NULL ? "the snapshot" : "empty", live);
    }
    kvr_buf_free(&body);
    if (!atomic_load(&b->stop)) {
        atomic_store(&s->bootstrapping, 0);
        atomic_store(&s->ready, 1);
    }
    return NULL;
}

int srv_peer_bootstrap_start(struct srv *s, char *err, size_t err_len)
{
    struct boot *b = calloc(1, sizeof(*b));
    if (b == NULL) {
        snprintf(err, err_len, "out of memory");
        return KVR_ENOMEM;
    }
    b->s = s;
    atomic_init(&b->stop, 0);
    if (pthread_create(&b->thr, NULL, boot_main, b) != 0) {
        free(b);
        snprintf(err, err_len, "cannot start the bootstrap thread");
        return KVR_EIO;
    }
    s->boot = b;
    return KVR_OK;
}

void srv_peer_bootstrap_join(struct srv *s)
{
    struct boot *b = s->boot;
    if (b == NULL)
        return;
    atomic_store(&b->stop, 1);
    pthread_join(b->thr, NULL);
    free(b);
    s->boot = NULL;
}
