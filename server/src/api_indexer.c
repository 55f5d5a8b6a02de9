/* api_indexer.c - the standalone-indexer API, wire-compatible with Dynamo's kv_indexer
 * (spec/http-api.md §2): POST /register, POST /unregister, GET /workers, POST /query,
 * POST /query_by_hash, GET /dump. Scores are TOKENS (blocks x block size), keyed
 * {"<worker_id>": {"<dp_rank>": n}}; u64 values are exact bare numbers. */
#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api.h"
#include "fastjson.h"
#include "jsonw.h"
#include "kvr/err.h"
#include "kvr/event_json.h"
#include "kvr/hash.h"
#include "registry.h"
#include "server.h"
#include "thread.h"

#define MAX_QUERY_BLOCKS (1u << 20)

/* Parses the body into t->jdoc; replies 400 and returns NULL on failure. */
static struct json_object *parse_object(struct srv_hreq *h)
{
    char err[SRV_JERR];
    size_t len;
    const char *body = srv_body(h, &len);
    struct srv_jdoc *d = &h->t->jdoc;
    if (srv_jdoc_parse(d, body, len, err, sizeof(err)) != KVR_OK) {
        srv_reply_error(h, 400, "%s", err);
        return NULL;
    }
    if (d->root == NULL || !json_object_is_type(d->root, json_type_object)) {
        srv_jdoc_release(d);
        srv_reply_error(h, 400, "the body must be a JSON object");
        return NULL;
    }
    return d->root;
}

/* model_name (default "default") + tenant_id (default "default"). */
static int read_model(struct srv_hreq *h, struct json_object *o, const char **name,
                      size_t *name_len, const char **tenant, size_t *tenant_len, char *err,
                      size_t err_len)
{
    struct srv_jdoc *d = &h->t->jdoc;
    int present = 0;
    int rc = srv_jget_str(d, o, NULL, "model_name", 0, name, name_len, &present, err, err_len);
    if (rc == KVR_OK && !present)
        rc = srv_jget_str(d, o, NULL, "model", 0, name, name_len, &present, err, err_len);
    if (rc != KVR_OK)
        return rc;
    if (!present) {
        *name = "default";
        *name_len = 7;
    }
    present = 0;
    rc = srv_jget_str(d, o, NULL, "tenant_id", 0, tenant, tenant_len, &present, err, err_len);
    if (rc == KVR_OK && !present) {
        *tenant = "default";
        *tenant_len = 7;
    }
    if (rc == KVR_OK && (*name_len == 0 || *name_len > 127 || *tenant_len == 0 ||
                         *tenant_len > 63 || memchr(*tenant, ':', *tenant_len) != NULL)) {
        snprintf(err, err_len,
                 "model_name must be 1..127 characters and tenant_id 1..63 without ':'");
        rc = KVR_EINVAL;
    }
    return rc;
}

/* ==== POST /register ========================================================================== */

void srv_api_register(struct srv_hreq *h)
{
    struct srv *s = h->t->srv;
    struct srv_jdoc *d = &h->t->jdoc;
    struct json_object *o = parse_object(h);
    if (o == NULL)
        return;
    char err[SRV_JERR];
    const char *name, *tenant, *endpoint = NULL, *url = NULL, *replay = NULL, *lora = NULL;
    const char *topic = NULL;
    size_t nl, tl;
    uint64_t id = 0, rank = 0, bs = 0;
    int has_bs = 0;
    int rc = read_model(h, o, &name, &nl, &tenant, &tl, err, sizeof(err));
    if (rc == KVR_OK)
        rc = srv_jget_uint(d, o, NULL, "instance_id", 1, UINT64_MAX, &id, NULL, err, sizeof(err));
    if (rc == KVR_OK)
        rc = srv_jget_uint(d, o, NULL, "dp_rank", 0, SRV_MAX_RANKS - 1, &rank, NULL, err,
                           sizeof(err));
    if (rc == KVR_OK)
        rc = srv_jget_uint(d, o, NULL, "block_size", 0, 65536, &bs, &has_bs, err, sizeof(err));
    if (rc == KVR_OK)
        rc = srv_jget_str(d, o, NULL, "endpoint", 0, &endpoint, NULL, NULL, err, sizeof(err));
    if (rc == KVR_OK)
        rc = srv_jget_str(d, o, NULL, "replay_endpoint", 0, &replay, NULL, NULL, err, sizeof(err));
    if (rc == KVR_OK)
        rc = srv_jget_str(d, o, NULL, "url", 0, &url, NULL, NULL, err, sizeof(err));
    if (rc == KVR_OK)
        rc = srv_jget_str(d, o, NULL, "lora_name", 0, &lora, NULL, NULL, err, sizeof(err));
    if (rc == KVR_OK)
        rc = srv_jget_str(d, o, NULL, "topic", 0, &topic, NULL, NULL, err, sizeof(err));
    if (rc != KVR_OK) {
        srv_reply_error(h, 400, "%s", err);
        goto out;
    }
    if (endpoint == NULL && url == NULL) {
        srv_reply_error(h, 400, "give an endpoint (ZMQ KV events), a url (HTTP) or both");
        goto out;
    }
    char nbuf[128], tbuf[64];
    snprintf(nbuf, sizeof(nbuf), "%.*s", (int)nl, name);
    snprintf(tbuf, sizeof(tbuf), "%.*s", (int)tl, tenant);
    struct srv_model *m = srv_models_find(&s->models, name, nl, tenant, tl);
    if (m == NULL || has_bs) {
        struct srv_model_cfg mc;
        srv_model_cfg_defaults(&mc, nbuf, tbuf,
                               has_bs ? (uint32_t)bs : (m ? m->block_size : s->cfg->block_size));
        mc.tokenizer = s->cfg->tokenizer;
        rc = srv_models_get_or_create(&s->models, &mc, &m, NULL, err, sizeof(err));
        if (rc != KVR_OK) {
            srv_reply_error(h, rc == KVR_EEXIST ? 409 : srv_status_of(rc), "%s", err);
            goto out;
        }
    }
    struct srv_reg_spec spec = {.id = id,
                                .url = url,
                                .zmq = endpoint,
                                .replay = replay,
                                .topic = topic,
                                .lora = lora,
                                .first_rank = (uint32_t)rank,
                                .n_ranks = 1,
                                .merge = 1};
    int status = srv_reg_add(s, m, &spec, err, sizeof(err));
    if (status == 201)
        srv_reply(h, 201, NULL, "{\"status\":\"ok\"}", 15);
    else
        srv_reply_error(h, status, "%s", err);
out:
    srv_jdoc_release(d);
}

/* ==== POST /unregister ======================================================================== */

void srv_api_unregister(struct srv_hreq *h)
{
    struct srv *s = h->t->srv;
    struct srv_jdoc *d = &h->t->jdoc;
    struct json_object *o = parse_object(h);
    if (o == NULL)
        return;
    char err[SRV_JERR];
    const char *name, *tenant;
    size_t nl, tl;
    uint64_t id = 0, rank = 0;
    int has_rank = 0;
    int rc = read_model(h, o, &name, &nl, &tenant, &tl, err, sizeof(err));
    if (rc == KVR_OK)
        rc = srv_jget_uint(d, o, NULL, "instance_id", 1, UINT64_MAX, &id, NULL, err, sizeof(err));
    if (rc == KVR_OK)
        rc = srv_jget_uint(d, o, NULL, "dp_rank", 0, SRV_MAX_RANKS - 1, &rank, &has_rank, err,
                           sizeof(err));
    if (rc != KVR_OK) {
        srv_reply_error(h, 400, "%s", err);
        goto out;
    }
    struct srv_model *m = srv_models_find(&s->models, name, nl, tenant, tl);
    if (m == NULL) {
        srv_reply_error(h, 404, "no index for model %.*s tenant %.*s", (int)nl, name, (int)tl,
                        tenant);
        goto out;
    }
    int status = srv_reg_remove(s, m, id, has_rank ? (int64_t)rank : -1, err, sizeof(err));
    if (status == 200)
        srv_reply(h, 200, NULL, "{\"status\":\"ok\"}", 15);
    else
        srv_reply_error(h, status, "%s", err);
out:
    srv_jdoc_release(d);
}

/* ==== GET /workers ============================================================================ */

struct list_ctx {
    struct srv_jw *w;
    int first;
};

static void list_one(void *ctx, struct srv_worker *w)
{
    struct list_ctx *c = ctx;
    if (!c->first)
        srv_jw_char(c->w, ',');
    c->first = 0;
    srv_jw_raw(c->w, "{\"instance_id\":");
    srv_jw_u64(c->w, w->id);
    srv_jw_raw(c->w, ",\"model_name\":");
    srv_jw_cstr(c->w, w->model->name);
    srv_jw_raw(c->w, ",\"tenant_id\":");
    srv_jw_cstr(c->w, w->model->tenant);
    srv_jw_raw(c->w, ",\"endpoints\":{");
    int f = 1;
    for (size_t k = 0; k < w->n_ranks; k++) {
        if (w->ranks[k].zmq == NULL)
            continue;
        if (!f)
            srv_jw_char(c->w, ',');
        f = 0;
        srv_jw_u64str(c->w, w->ranks[k].rank);
        srv_jw_char(c->w, ':');
        srv_jw_cstr(c->w, w->ranks[k].zmq);
    }
    srv_jw_raw(c->w, "}}");
}

void srv_api_workers_indexer(struct srv_hreq *h)
{
    struct srv_jw w;
    kvr_buf_reset(&h->t->out);
    srv_jw_init(&w, &h->t->out);
    srv_jw_char(&w, '[');
    struct list_ctx c = {&w, 1};
    srv_workers_foreach(&h->t->srv->workers, list_one, &c);
    srv_jw_char(&w, ']');
    srv_reply_out(h, 200, w.err);
}

/* ==== POST /query, POST /query_by_hash ======================================================== */

/* (worker, rank) order: matches and tree sizes are sorted by it and merged. */
static inline int key_before(uint64_t wa, uint32_t ra, uint64_t wb, uint32_t rb)
{
    return wa != wb ? wa < wb : ra < rb;
}

/* Longest text one match adds to the answer: in each of the two maps, `},"<u64>":{"<u64>":<u64>`
 * (new worker) or `,"<u64>":<u64>` (next rank). */
#define MATCH_TEXT_MAX (2u * (4 + 3 * SRV_JP_U64_MAX + 8))
#define QUERY_TEXT_FIXED 64u

/* Writes {"scores": ..., "frequencies": [], "tree_sizes": ...} for n local hashes.
 *
 * The hot path of /query_by_hash: the matches are grouped by worker (insertion sort: a few
 * dozen ranks), the tree sizes joined to them by a merge of the two sorted lists, and the text
 * written with the inline pointer writer (jsonw.h) into the thread's reusable text buffer, one
 * reservation of its worst-case size; each match's key fragment (`"<worker>":{"<rank>":` or
 * `,"<rank>":`) is formatted once and copied into the second map. srv_reply then copies the few
 * hundred bytes into the connection's output (measured cheaper than reserving the worst case in
 * an evbuffer chain: a large malloc and free per reply). No allocation unless the index has more
 * than 64 ranks. */
static void answer_query(struct srv_hreq *h, struct srv_model *m, const uint64_t *locals, size_t n)
{
    struct srv_thread *t = h->t;
    size_t nm = 0;
    int rc = KVR_OK;
    if (n > 0 && (rc = srv_scratch_matches(t, 64)) == KVR_OK) {
        rc = kvr_index_find_matches(m->index, locals, n, 0, t->matches, t->cap_matches, &nm);
        if (rc == KVR_ERANGE && (rc = srv_scratch_matches(t, nm)) == KVR_OK)
            rc = kvr_index_find_matches(m->index, locals, n, 0, t->matches, t->cap_matches, &nm);
    }
    if (rc != KVR_OK) {
        srv_reply_kvr(h, rc, "query failed: %s", kvr_strerror(rc));
        return;
    }
    struct kvr_match *mt = t->matches;
    for (size_t i = 1; i < nm; i++) { /* group by worker: sort (small n) */
        struct kvr_match x = mt[i];
        size_t j = i;
        while (j > 0 &&
               key_before(x.worker_id, x.dp_rank, mt[j - 1].worker_id, mt[j - 1].dp_rank)) {
            mt[j] = mt[j - 1];
            j--;
        }
        mt[j] = x;
    }
    struct kvr_rank_blocks rbs[64], *rb = rbs;
    size_t nrb = 0;
    if (nm > 0 && kvr_index_rank_blocks(m->index, rbs, 64, &nrb) == KVR_ERANGE) {
        rb = malloc(nrb * sizeof(*rb));
        if (rb == NULL || kvr_index_rank_blocks(m->index, rb, nrb, &nrb) != KVR_OK)
            nrb = 0;
    }
    for (size_t i = 1; i < nrb; i++) { /* the same order, for the merge below */
        struct kvr_rank_blocks x = rb[i];
        size_t j = i;
        while (j > 0 &&
               key_before(x.worker_id, x.dp_rank, rb[j - 1].worker_id, rb[j - 1].dp_rank)) {
            rb[j] = rb[j - 1];
            j--;
        }
        rb[j] = x;
    }
    struct kvr_buf *out = &t->out;
    size_t bound = QUERY_TEXT_FIXED + nm * MATCH_TEXT_MAX;
    kvr_buf_reset(out);
    if (kvr_buf_reserve(out, bound) != KVR_OK) {
        if (rb != rbs)
            free(rb);
        srv_reply_error(h, 503, "out of memory while building the reply");
        return;
    }
    /* pass 1: the scores, remembering where each key fragment is; pass 2: the tree sizes,
     * copying the fragments (formatted again only past KEY_CACHE matches) */
    enum { KEY_CACHE = 64 };
    uint32_t koff[KEY_CACHE];
    uint8_t klen[KEY_CACHE];
    char *start = kvr_buf_tail(out), *p = start;
    p = srv_jp_lit(p, "{\"scores\":{");
    for (int pass = 0; pass < 2; pass++) {
        size_t r = 0;
        for (size_t k = 0; k < nm; k++) {
            int first = k == 0 || mt[k].worker_id != mt[k - 1].worker_id;
            if (first && k > 0)
                p = srv_jp_lit(p, "},");
            if (pass == 1 && k < KEY_CACHE) {
                p = srv_jp_raw(p, start + koff[k], klen[k]);
            } else {
                char *kb = p;
                if (first) {
                    p = srv_jp_u64str(p, mt[k].worker_id);
                    p = srv_jp_lit(p, ":{");
                } else {
                    p = srv_jp_char(p, ',');
                }
                p = srv_jp_u64str(p, mt[k].dp_rank);
                p = srv_jp_char(p, ':');
                if (k < KEY_CACHE) {
                    koff[k] = (uint32_t)(kb - start);
                    klen[k] = (uint8_t)(p - kb);
                }
            }
            if (pass == 0) {
                p = srv_jp_u64(p, (uint64_t)mt[k].blocks * m->block_size);
                continue;
            }
            /* both lists sorted by (worker, rank): advance the ranks to this match */
            while (r < nrb &&
                   key_before(rb[r].worker_id, rb[r].dp_rank, mt[k].worker_id, mt[k].dp_rank))
                r++;
            int hit =
                r < nrb && rb[r].worker_id == mt[k].worker_id && rb[r].dp_rank == mt[k].dp_rank;
            p = srv_jp_u64(p, hit ? rb[r].blocks : 0);
        }
        if (nm > 0)
            p = srv_jp_char(p, '}');
        if (pass == 0)
            p = srv_jp_lit(p, "},\"frequencies\":[],\"tree_sizes\":{");
    }
    p = srv_jp_lit(p, "}}");
    if (rb != rbs)
        free(rb);
    kvr_buf_commit(out, (size_t)(p - start));
    srv_reply_out(h, 200, KVR_OK);
}

static void query(struct srv_hreq *h, int by_hash)
{
    struct srv *s = h->t->srv;
    struct srv_thread *t = h->t;
    struct srv_jdoc *d = &t->jdoc;
    if (by_hash && srv_scratch_blocks(t, 256) == KVR_OK) {
        /* fast path: the common body shape, parsed without building a tree */
        size_t len;
        const char *body = srv_body(h, &len);
        struct srv_fast_query fq;
        if (srv_fast_query_by_hash(body, len, t->locals, t->cap_blocks, &fq)) {
            struct srv_model *m =
                srv_models_find(&s->models, fq.model ? fq.model : "default",
                                fq.model ? fq.model_len : 7, fq.tenant, fq.tenant_len);
            if (m != NULL && (fq.model == NULL || (fq.model_len > 0 && fq.model_len < 128)) &&
                (fq.tenant == NULL || (fq.tenant_len > 0 && fq.tenant_len < 64))) {
                answer_query(h, m, t->locals, fq.n);
                return;
            }
        }
    }
    struct json_object *o = parse_object(h);
    if (o == NULL)
        return;
    char err[SRV_JERR];
    const char *name, *tenant, *lora = NULL;
    size_t nl, tl, lora_len = 0, n = 0;
    int rc = read_model(h, o, &name, &nl, &tenant, &tl, err, sizeof(err));
    struct json_object *arr = NULL;
    const char *field = by_hash ? "block_hashes" : "token_ids";
    if (rc == KVR_OK && !by_hash)
        rc = srv_jget_str(d, o, NULL, "lora_name", 0, &lora, &lora_len, NULL, err, sizeof(err));
    if (rc == KVR_OK && (!srv_jmember(o, field, &arr) || arr == NULL)) {
        struct kvr_json_path p = {NULL, field, 0};
        rc = kvr_json_missing(err, sizeof(err), &p);
    }
    if (rc != KVR_OK) {
        srv_reply_error(h, 400, "%s", err);
        goto out;
    }
    struct srv_model *m = srv_models_find(&s->models, name, nl, tenant, tl);
    if (m == NULL) {
        srv_reply_error(h, 404, "no index for model %.*s tenant %.*s", (int)nl, name, (int)tl,
                        tenant);
        goto out;
    }
    struct kvr_json_path p = {NULL, field, 0};
    size_t alen = json_object_is_type(arr, json_type_array) ? json_object_array_length(arr) : 0;
    if (alen > (by_hash ? MAX_QUERY_BLOCKS : MAX_QUERY_BLOCKS * 16)) {
        srv_reply_error(h, 400, "%s: too many elements", field);
        goto out;
    }
    if (by_hash) {
        if (srv_scratch_blocks(t, alen) != KVR_OK) {
            srv_reply_error(h, 503, "out of memory");
            goto out;
        }
        rc = srv_jread_hashes(d, arr, &p, t->locals, t->cap_blocks, &n, err, sizeof(err));
    } else {
        if (srv_scratch_tokens(t, alen) != KVR_OK) {
            srv_reply_error(h, 503, "out of memory");
            goto out;
        }
        rc = srv_jread_tokens(d, arr, &p, t->tokens, t->cap_tokens, &n, err, sizeof(err));
        if (rc == KVR_OK) {
            size_t nb = kvr_hash_block_count(n, m->block_size, 0);
            struct kvr_hash_opts ho = {0};
            if (lora != NULL && lora_len > 0)
                ho.seed = kvr_hash_salt(NULL, 0, lora, lora_len);
            if (srv_scratch_blocks(t, nb) != KVR_OK) {
                srv_reply_error(h, 503, "out of memory");
                goto out;
            }
            rc = kvr_hash_blocks(t->tokens, n, m->block_size, &ho, t->locals, t->cap_blocks, &n);
            if (rc != KVR_OK)
                snprintf(err, sizeof(err), "cannot hash the tokens: %s", kvr_strerror(rc));
        }
    }
    if (rc != KVR_OK) {
        srv_reply_error(h, 400, "%s", err);
        goto out;
    }
    answer_query(h, m, t->locals, n);
out:
    srv_jdoc_release(d);
}

void srv_api_query(struct srv_hreq *h)
{
    query(h, 0);
}

void srv_api_query_by_hash(struct srv_hreq *h)
{
    query(h, 1);
}

/* ==== GET /dump ===============================================================================
 *
 * {"<model key>": {"block_size": n, "events": [RouterEvent, ...]}, ...}: every model's index as
 * the events that rebuild it. A large index takes long to dump and its text is large, so the
 * dump is built on the control thread (a job, thread.h) while this thread keeps serving its
 * other connections; the text goes out without a copy. */

int srv_dump_json(struct srv *s, struct kvr_buf *o)
{
    struct srv_jw w;
    srv_jw_init(&w, o);
    srv_jw_char(&w, '{');
    size_t nmodels = srv_models_count(&s->models);
    for (size_t k = 0; k < nmodels; k++) {
        struct srv_model *m = srv_models_at(&s->models, k);
        struct kvr_event_list l;
        kvr_event_list_init(&l);
        int rc = kvr_index_dump(m->index, &l);
        if (k > 0)
            srv_jw_char(&w, ',');
        srv_jw_cstr(&w, m->key);
        if (rc != KVR_OK) {
            srv_jw_raw(&w, ":{\"error\":");
            srv_jw_cstr(&w, kvr_strerror(rc));
            srv_jw_char(&w, '}');
        } else {
            srv_jw_raw(&w, ":{\"block_size\":");
            srv_jw_u64(&w, m->block_size);
            srv_jw_raw(&w, ",\"events\":");
            if (w.err == KVR_OK && kvr_event_json_encode_array(l.ev, l.n, o) != KVR_OK)
                w.err = KVR_ENOMEM;
            srv_jw_char(&w, '}');
        }
        kvr_event_list_free(&l);
    }
    srv_jw_char(&w, '}');
    return w.err;
}

static void dump_run(struct srv_control *c, struct srv_job *j)
{
    struct kvr_buf *o = &j->body;
    if (srv_dump_json(srv_control_server(c), o) != KVR_OK) {
        kvr_buf_free(o);
        srv_jw_error_body(o, "out of memory while building the dump");
        j->status = 503;
        return;
    }
    j->status = 200;
}

void srv_api_dump(struct srv_hreq *h)
{
    struct srv_job *j = srv_job_new(NULL, 0);
    if (j == NULL) {
        srv_reply_error(h, 503, "out of memory");
        return;
    }
    j->run = dump_run;
    srv_stat_add(&h->t->st.jobs_dump, 1);
    srv_job_submit(h, j);
}
