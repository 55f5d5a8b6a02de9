/* replica_wire.c - encoding and decoding of the replica-sync messages (see replica_wire.h). */
#include "replica_wire.h"

#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvr/err.h"

static const char *const type_names[] = {NULL, "ops", "sync", "hello", "bye"};

const char *srv_rw_type_name(int type)
{
    return type >= SRV_RW_OPS && type <= SRV_RW_BYE ? type_names[type] : NULL;
}

/* ==== writing ================================================================================ */

void srv_rw_begin(struct srv_jw *w, const struct srv_rw_header *h)
{
    srv_jw_raw(w, "{\"v\":1,\"type\":");
    srv_jw_cstr(w, srv_rw_type_name(h->type));
    srv_jw_raw(w, ",\"router_id\":");
    srv_jw_u64(w, h->router_id);
    srv_jw_raw(w, ",\"seq\":");
    srv_jw_u64(w, h->seq);
    srv_jw_raw(w, ",\"ts_us\":");
    srv_jw_u64(w, h->ts_us);
    if (h->type == SRV_RW_SYNC) {
        srv_jw_raw(w, ",\"target\":");
        srv_jw_u64(w, h->target);
    }
    if (h->type == SRV_RW_OPS)
        srv_jw_raw(w, ",\"events\":[");
}

static void hashes(struct srv_jw *w, const uint64_t *v, size_t n)
{
    srv_jw_char(w, '[');
    for (size_t k = 0; k < n; k++) {
        if (k > 0)
            srv_jw_char(w, ',');
        srv_jw_u64(w, v[k]);
    }
    srv_jw_char(w, ']');
}

void srv_rw_event(struct srv_jw *w, const struct srv_rw_event *ev, int first)
{
    if (!first)
        srv_jw_char(w, ',');
    srv_jw_raw(w, "{\"model\":");
    srv_jw_str(w, ev->model, ev->model_len);
    if (ev->kind == SRV_RW_STATE_BEGIN || ev->kind == SRV_RW_STATE_END) {
        srv_jw_raw(w, ev->kind == SRV_RW_STATE_BEGIN ? ",\"data\":\"state_begin\"}"
                                                     : ",\"data\":\"state_end\"}");
        return;
    }
    if (ev->kind != SRV_RW_APPROX) {
        srv_jw_raw(w, ",\"request_id\":");
        srv_jw_u64(w, ev->request_id);
    }
    srv_jw_raw(w, ",\"t_us\":");
    srv_jw_u64(w, ev->t_us);
    srv_jw_raw(w, ",\"worker\":{\"worker_id\":");
    srv_jw_u64(w, ev->worker_id);
    srv_jw_raw(w, ",\"dp_rank\":");
    srv_jw_u64(w, ev->dp_rank);
    srv_jw_raw(w, "},\"data\":");
    switch (ev->kind) {
    case SRV_RW_ADD:
        srv_jw_raw(w, "{\"add_request\":{\"prefill_tokens\":");
        srv_jw_u64(w, ev->prefill_tokens);
        srv_jw_raw(w, ",\"seq_hashes\":");
        hashes(w, ev->hashes, ev->n_hashes);
        srv_jw_raw(w, "}}}");
        break;
    case SRV_RW_FIRST:
        srv_jw_raw(w, "\"mark_prefill_completed\"}");
        break;
    case SRV_RW_FREE:
        srv_jw_raw(w, "\"free\"}");
        break;
    default: /* SRV_RW_APPROX */
        srv_jw_raw(w, "{\"approx\":{\"local_hashes\":");
        hashes(w, ev->hashes, ev->n_hashes);
        srv_jw_raw(w, "}}}");
        break;
    }
}

int srv_rw_end(struct srv_jw *w, const struct srv_rw_header *h)
{
    srv_jw_raw(w, h->type == SRV_RW_OPS ? "]}" : "}");
    return w->err;
}

/* ==== reading ================================================================================ */

void srv_rw_decoded_free(struct srv_rw_decoded *dec)
{
    free(dec->ev);
    free(dec->hashes);
    memset(dec, 0, sizeof(*dec));
}

static int put_hashes(struct srv_rw_decoded *dec, const struct srv_jdoc *doc, struct json_object *v,
                      const struct kvr_json_path *p, size_t *first, size_t *n, char *err,
                      size_t err_len)
{
    if (v == NULL || !json_object_is_type(v, json_type_array))
        return kvr_json_type_error(err, err_len, &doc->scan, p, "an array of hashes", v);
    size_t len = json_object_array_length(v);
    if (len > SRV_RW_MAX_HASHES - dec->n_hashes) {
        snprintf(err, err_len, "more than %u hashes in one message", SRV_RW_MAX_HASHES);
        return KVR_ECORRUPT;
    }
    if (dec->n_hashes + len > dec->cap_hashes) {
        size_t cap = dec->cap_hashes ? dec->cap_hashes : 256;
        while (cap < dec->n_hashes + len)
            cap *= 2;
        uint64_t *h = realloc(dec->hashes, cap * sizeof(*h));
        if (h == NULL)
            return KVR_ENOMEM;
        dec->hashes = h;
        dec->cap_hashes = cap;
    }
    *first = dec->n_hashes;
    int rc = srv_jread_hashes(doc, v, p, dec->hashes + dec->n_hashes, len, n, err, err_len);
    if (rc != KVR_OK)
        return rc;
    dec->n_hashes += *n;
    return KVR_OK;
}

static int bad(char *err, size_t err_len, const struct kvr_json_path *p, const char *what)
{
    char path[160];
    kvr_json_path_format(p, path, sizeof(path));
    snprintf(err, err_len, "%s: %s", path, what);
    return KVR_ECORRUPT;
}

/* One element of "events". Hash positions are stored as offsets in ev->hashes until the arena
 * stops moving (fixed up by the caller). */
static int read_event(const struct srv_jdoc *doc, struct json_object *o,
                      const struct kvr_json_path *p, struct srv_rw_decoded *dec,
                      struct srv_rw_event *ev, size_t *hash_off, char *err, size_t err_len)
{
    memset(ev, 0, sizeof(*ev));
    *hash_off = 0;
    if (o == NULL || !json_object_is_type(o, json_type_object))
        return kvr_json_type_error(err, err_len, &doc->scan, p, "an object", o);
    int rc = srv_jget_str(doc, o, p, "model", 1, &ev->model, &ev->model_len, NULL, err, err_len);
    if (rc != KVR_OK)
        return rc;
    struct json_object *data = NULL;
    struct kvr_json_path pd = {p, "data", 0};
    if (!srv_jmember(o, "data", &data) || data == NULL)
        return kvr_json_missing(err, err_len, &pd);
    struct json_object *body = NULL;
    struct kvr_json_path pb = {&pd, NULL, 0};
    if (json_object_is_type(data, json_type_string)) {
        const char *s = json_object_get_string(data);
        if (strcmp(s, "mark_prefill_completed") == 0)
            ev->kind = SRV_RW_FIRST;
        else if (strcmp(s, "free") == 0)
            ev->kind = SRV_RW_FREE;
        else if (strcmp(s, "state_begin") == 0)
            ev->kind = SRV_RW_STATE_BEGIN;
        else if (strcmp(s, "state_end") == 0)
            ev->kind = SRV_RW_STATE_END;
        else
            return bad(err, err_len, &pd, "unknown event kind");
    } else if (json_object_is_type(data, json_type_object)) {
        if (srv_jmember(data, "add_request", &body) && body != NULL) {
            ev->kind = SRV_RW_ADD;
            pb.key = "add_request";
        } else if (srv_jmember(data, "approx", &body) && body != NULL) {
            ev->kind = SRV_RW_APPROX;
            pb.key = "approx";
        } else {
            return bad(err, err_len, &pd, "unknown event kind (expected add_request or approx)");
        }
        if (!json_object_is_type(body, json_type_object))
            return kvr_json_type_error(err, err_len, &doc->scan, &pb, "an object", body);
    } else {
        return kvr_json_type_error(err, err_len, &doc->scan, &pd, "a string or an object", data);
    }
    if (ev->kind == SRV_RW_STATE_BEGIN || ev->kind == SRV_RW_STATE_END)
        return KVR_OK;
    if (ev->kind != SRV_RW_APPROX &&
        (rc = srv_jget_uint(doc, o, p, "request_id", 1, UINT64_MAX, &ev->request_id, NULL, err,
                            err_len)) != KVR_OK)
        return rc;
    if ((rc = srv_jget_uint(doc, o, p, "t_us", 0, UINT64_MAX, &ev->t_us, NULL, err, err_len)) !=
        KVR_OK)
        return rc;
    struct json_object *wk = NULL;
    struct kvr_json_path pw = {p, "worker", 0};
    if (!srv_jmember(o, "worker", &wk) || wk == NULL)
        return kvr_json_missing(err, err_len, &pw);
    if (!json_object_is_type(wk, json_type_object))
        return kvr_json_type_error(err, err_len, &doc->scan, &pw, "an object", wk);
    uint64_t dp = 0;
    if ((rc = srv_jget_uint(doc, wk, &pw, "worker_id", 1, UINT64_MAX, &ev->worker_id, NULL, err,
                            err_len)) != KVR_OK ||
        (rc = srv_jget_uint(doc, wk, &pw, "dp_rank", 0, UINT32_MAX, &dp, NULL, err, err_len)) !=
            KVR_OK)
        return rc;
    ev->dp_rank = (uint32_t)dp;
    if (ev->kind == SRV_RW_ADD) {
        if ((rc = srv_jget_uint(doc, body, &pb, "prefill_tokens", 1, UINT64_MAX,
                                &ev->prefill_tokens, NULL, err, err_len)) != KVR_OK)
            return rc;
        struct json_object *hs = NULL;
        struct kvr_json_path ph = {&pb, "seq_hashes", 0};
        if (!srv_jmember(body, "seq_hashes", &hs))
            return KVR_OK; /* no blocks */
        if (hs == NULL)
            return KVR_OK;
        return put_hashes(dec, doc, hs, &ph, hash_off, &ev->n_hashes, err, err_len);
    }
    if (ev->kind != SRV_RW_APPROX)
        return KVR_OK;
    struct json_object *hs = NULL;
    struct kvr_json_path ph = {&pb, "local_hashes", 0};
    if (!srv_jmember(body, "local_hashes", &hs) || hs == NULL)
        return kvr_json_missing(err, err_len, &ph);
    return put_hashes(dec, doc, hs, &ph, hash_off, &ev->n_hashes, err, err_len);
}

int srv_rw_decode(struct srv_jdoc *doc, const char *text, size_t len, struct srv_rw_decoded *dec,
                  char *err, size_t err_len)
{
    dec->n_ev = 0;
    dec->n_hashes = 0;
    memset(&dec->h, 0, sizeof(dec->h));
    int rc = srv_jdoc_parse(doc, text, len, err, err_len);
    if (rc != KVR_OK)
        return rc;
    struct json_object *root = doc->root;
    if (!json_object_is_type(root, json_type_object))
        return kvr_json_type_error(err, err_len, &doc->scan, NULL, "an object", root);
    uint64_t v = 0;
    if ((rc = srv_jget_uint(doc, root, NULL, "v", 1, UINT32_MAX, &v, NULL, err, err_len)) != KVR_OK)
        return rc;
    if (v != SRV_RW_VERSION) {
        snprintf(err, err_len, "v: unsupported version %llu (this router speaks %d)",
                 (unsigned long long)v, SRV_RW_VERSION);
        return KVR_ECORRUPT;
    }
    const char *type = NULL;
    size_t tlen = 0;
    if ((rc = srv_jget_str(doc, root, NULL, "type", 1, &type, &tlen, NULL, err, err_len)) != KVR_OK)
        return rc;
    for (int t = SRV_RW_OPS; t <= SRV_RW_BYE; t++)
        if (strlen(type_names[t]) == tlen && memcmp(type_names[t], type, tlen) == 0)
            dec->h.type = t;
    if (dec->h.type == 0) {
        snprintf(err, err_len, "type: unknown message type '%.*s'", (int)(tlen > 40 ? 40 : tlen),
                 type);
        return KVR_ECORRUPT;
    }
    if ((rc = srv_jget_uint(doc, root, NULL, "router_id", 1, UINT64_MAX, &dec->h.router_id, NULL,
                            err, err_len)) != KVR_OK ||
        (rc = srv_jget_uint(doc, root, NULL, "seq", 1, UINT64_MAX, &dec->h.seq, NULL, err,
                            err_len)) != KVR_OK ||
        (rc = srv_jget_uint(doc, root, NULL, "ts_us", 0, UINT64_MAX, &dec->h.ts_us, NULL, err,
                            err_len)) != KVR_OK)
        return rc;
    if (dec->h.router_id == 0) {
        snprintf(err, err_len, "router_id: must not be 0");
        return KVR_ECORRUPT;
    }
    if (dec->h.type == SRV_RW_SYNC &&
        (rc = srv_jget_uint(doc, root, NULL, "target", 0, UINT64_MAX, &dec->h.target, NULL, err,
                            err_len)) != KVR_OK)
        return rc;
    if (dec->h.type != SRV_RW_OPS)
        return KVR_OK;
    struct json_object *evs = NULL;
    struct kvr_json_path pe = {NULL, "events", 0};
    if (!srv_jmember(root, "events", &evs) || evs == NULL)
        return kvr_json_missing(err, err_len, &pe);
    if (!json_object_is_type(evs, json_type_array))
        return kvr_json_type_error(err, err_len, &doc->scan, &pe, "an array", evs);
    size_t n = json_object_array_length(evs);
    if (n > SRV_RW_MAX_EVENTS) {
        snprintf(err, err_len, "events: more than %d events in one message", SRV_RW_MAX_EVENTS);
        return KVR_ECORRUPT;
    }
    if (n > dec->cap_ev) {
        struct srv_rw_event *e = realloc(dec->ev, n * sizeof(*e));
        if (e == NULL)
            return KVR_ENOMEM;
        dec->ev = e;
        dec->cap_ev = n;
    }
    size_t *offs = n ? malloc(n * sizeof(*offs)) : NULL;
    if (n > 0 && offs == NULL)
        return KVR_ENOMEM;
    for (size_t k = 0; k < n; k++) {
        struct kvr_json_path pk = {&pe, NULL, k};
        rc = read_event(doc, json_object_array_get_idx(evs, k), &pk, dec, &dec->ev[k], &offs[k],
                        err, err_len);
        if (rc != KVR_OK) {
            free(offs);
            dec->n_ev = 0;
            return rc;
        }
    }
    for (size_t k = 0; k < n; k++) /* the arena has stopped moving */
        dec->ev[k].hashes = dec->ev[k].n_hashes ? dec->hashes + offs[k] : NULL;
    free(offs);
    dec->n_ev = n;
    return KVR_OK;
}
