/* models.c - model registry, per-model engine objects and ZMQ subscribers (see models.h). */
#include "models.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <zmq.h>

#include "kvr/err.h"
#include "kvr/kv_subscriber.h"

int srv_models_init(struct srv_models *ms, struct srv_logger *log)
{
    memset(ms->v, 0, sizeof(ms->v));
    atomic_init(&ms->n, 0);
    ms->log = log;
    ms->zmq_ctx = NULL;
    return pthread_mutex_init(&ms->mu, NULL) == 0 ? KVR_OK : KVR_EIO;
}

static void model_free(struct srv_model *m)
{
    if (m == NULL)
        return;
    if (m->sub != NULL)
        kvr_kvsub_free(m->sub); /* stops its thread before the index goes */
    kvr_approx_free(m->approx);
    kvr_load_free(m->load);
    kvr_index_free(m->index);
    kvr_event_list_free(&m->held_ev);
    pthread_mutex_destroy(&m->hold_mu);
    free(m->policy);
    free(m->kv_topic);
    free(m->nats_subject);
    free(m->nats_stream);
    pthread_mutex_destroy(&m->sub_mu);
    free(m);
}

void srv_models_free(struct srv_models *ms)
{
    size_t n = srv_models_count(ms);
    for (size_t k = 0; k < n; k++)
        model_free(ms->v[k]);
    atomic_store(&ms->n, 0);
    if (ms->zmq_ctx != NULL)
        zmq_ctx_term(ms->zmq_ctx);
    ms->zmq_ctx = NULL;
    pthread_mutex_destroy(&ms->mu);
}

struct srv_model *srv_models_find(struct srv_models *ms, const char *name, size_t name_len,
                                  const char *tenant, size_t tenant_len)
{
    if (tenant == NULL) {
        tenant = "default";
        tenant_len = 7;
    }
    size_t n = srv_models_count(ms);
    for (size_t k = 0; k < n; k++) {
        struct srv_model *m = ms->v[k];
        if (strlen(m->name) == name_len && memcmp(m->name, name, name_len) == 0 &&
            strlen(m->tenant) == tenant_len && memcmp(m->tenant, tenant, tenant_len) == 0)
            return m;
    }
    return NULL;
}

struct srv_model *srv_models_find_spec(struct srv_models *ms, const char *spec, size_t len)
{
    struct srv_model *m = srv_models_find(ms, spec, len, NULL, 0);
    if (m != NULL)
        return m;
    for (size_t k = len; k > 0; k--)
        if (spec[k - 1] == ':')
            return srv_models_find(ms, spec, k - 1, spec + k, len - k);
    return NULL;
}

struct srv_model *srv_models_for_openai(struct srv_models *ms, const char *name, size_t len)
{
    struct srv_model *m = name != NULL ? srv_models_find_spec(ms, name, len) : NULL;
    if (m == NULL)
        m = srv_models_find(ms, "default", 7, NULL, 0);
    if (m == NULL && srv_models_count(ms) == 1)
        m = ms->v[0];
    return m;
}

void srv_model_cfg_defaults(struct srv_model_cfg *mc, char *name, char *tenant, uint32_t block_size)
{
    memset(mc, 0, sizeof(*mc));
    mc->name = name;
    mc->tenant = tenant;
    mc->block_size = block_size;
    mc->kind = SRV_KIND_EVENTS;
    mc->index_kind = KVR_INDEX_RADIX;
    mc->tokenizer = SRV_TOK_AUTO;
    mc->byte_chunk = 4;
    mc->approx_ttl_ms = 120000;
    mc->approx_max_blocks = 1u << 20;
    mc->approx_prune_ratio = 0.8;
    mc->overlap_weight = 1.0;
}

static void load_obs(void *ctx, const struct kvr_load_op *op)
{
    struct srv_model *m = ctx;
    if (m->on_load != NULL)
        m->on_load(m->sync_ctx, m, op);
}

static void approx_obs(void *ctx, uint64_t worker_id, uint32_t dp_rank, const uint64_t *locals,
                       size_t n, uint64_t now_ms)
{
    struct srv_model *m = ctx;
    (void)now_ms;
    if (m->on_approx != NULL)
        m->on_approx(m->sync_ctx, m, worker_id, dp_rank, locals, n);
}

static int model_new(struct srv_models *ms, uint32_t slot, const struct srv_model_cfg *mc,
                     struct srv_model **out)
{
    struct srv_model *m = calloc(1, sizeof(*m));
    if (m == NULL)
        return KVR_ENOMEM;
    if (pthread_mutex_init(&m->sub_mu, NULL) != 0) {
        free(m);
        return KVR_ENOMEM;
    }
    pthread_mutex_init(&m->hold_mu, NULL);
    kvr_event_list_init(&m->held_ev);
    atomic_init(&m->held, ms->hold_new);
    m->on_load = ms->on_load;
    m->on_approx = ms->on_approx;
    m->sync_ctx = ms->sync_ctx;
    m->slot = slot;
    m->block_size = mc->block_size;
    snprintf(m->name, sizeof(m->name), "%s", mc->name);
    snprintf(m->tenant, sizeof(m->tenant), "%s", mc->tenant ? mc->tenant : "default");
    snprintf(m->key, sizeof(m->key), "%s:%s", m->name, m->tenant);
    m->kind = mc->kind;
    m->index_kind = mc->index_kind ? mc->index_kind : KVR_INDEX_RADIX;
    m->tokenizer = mc->tokenizer;
    if (m->tokenizer == SRV_TOK_AUTO)
        m->tokenizer = m->kind == SRV_KIND_APPROX ? SRV_TOK_BYTES : SRV_TOK_WORKER;
    m->byte_chunk = mc->byte_chunk ? mc->byte_chunk : 4;
    m->overlap_weight = mc->overlap_weight;
    m->temperature = mc->temperature;
    m->log = ms->log;
    m->on_events = ms->on_events;
    m->on_events_ctx = ms->on_events_ctx;
    m->created_unix = (uint64_t)time(NULL);
    atomic_init(&m->req_seq, 0);
    int rc = KVR_ENOMEM;
    if (mc->policy != NULL && (m->policy = strdup(mc->policy)) == NULL)
        goto fail;
    if (mc->kv_topic != NULL && (m->kv_topic = strdup(mc->kv_topic)) == NULL)
        goto fail;
    if (mc->nats_subject != NULL && (m->nats_subject = strdup(mc->nats_subject)) == NULL)
        goto fail;
    if (mc->nats_stream != NULL && (m->nats_stream = strdup(mc->nats_stream)) == NULL)
        goto fail;
    /* The CKF keys on Dynamo sequence hashes. Events carry the engine's own block hashes
     * (vLLM/SGLang: opaque), so by default the CKF translates: each stored block's sequence
     * hash is recomputed from its parent's and its tokens' local hash, which is what queries
     * chain (ckf_keys=engine trusts block_hash to be that hash already). */
    struct kvr_ckf_index_config cc;
    kvr_ckf_index_config_init(&cc);
    cc.translate = mc->ckf_keys != SRV_CKF_KEYS_ENGINE;
    if (mc->ckf_expected != 0)
        cc.expected_blocks_per_rank = mc->ckf_expected;
    m->ckf_keys = mc->ckf_keys;
    m->ckf_expected = cc.expected_blocks_per_rank;
    struct kvr_index_config ic = {.kind = m->index_kind, .ckf = &cc};
    if ((rc = kvr_index_new(&ic, &m->index)) != KVR_OK)
        goto fail;
    struct kvr_load_config lc = {
        .block_size = m->block_size, .observer = load_obs, .observer_ctx = m};
    if ((rc = kvr_load_new(&lc, &m->load)) != KVR_OK)
        goto fail;
    if (m->kind == SRV_KIND_APPROX) {
        struct kvr_approx_config ac = {.ttl_ms = mc->approx_ttl_ms,
                                       .max_blocks = (size_t)mc->approx_max_blocks,
                                       .prune_ratio = mc->approx_prune_ratio,
                                       .observer = approx_obs,
                                       .observer_ctx = m};
        if ((rc = kvr_approx_new(m->index, &ac, &m->approx)) != KVR_OK)
            goto fail;
    }
    *out = m;
    return KVR_OK;
fail:
    model_free(m);
    return rc;
}

int srv_models_get_or_create(struct srv_models *ms, const struct srv_model_cfg *mc,
                             struct srv_model **out, int *created, char *err, size_t err_len)
{
    if (created != NULL)
        *created = 0;
    if (mc->name == NULL || *mc->name == '\0' || strlen(mc->name) >= 128 ||
        (mc->tenant != NULL && (strlen(mc->tenant) >= 64 || *mc->tenant == '\0'))) {
        snprintf(err, err_len, "model name must be 1..127 and tenant 1..63 characters");
        return KVR_EINVAL;
    }
    if (mc->block_size < 2 || mc->block_size > 65536) {
        snprintf(err, err_len, "block_size must be in 2..65536, got %u", mc->block_size);
        return KVR_EINVAL;
    }
    const char *tenant = mc->tenant ? mc->tenant : "default";
    pthread_mutex_lock(&ms->mu);
    struct srv_model *m = srv_models_find(ms, mc->name, strlen(mc->name), tenant, strlen(tenant));
    int rc = KVR_OK;
    if (m != NULL) {
        if (m->block_size != mc->block_size) {
            snprintf(err, err_len, "model '%s' exists with block_size %u (asked for %u)", m->key,
                     m->block_size, mc->block_size);
            rc = KVR_EEXIST;
        }
    } else {
        size_t n = srv_models_count(ms);
        if (n >= SRV_MAX_MODELS) {
            snprintf(err, err_len, "too many models (at most %d)", SRV_MAX_MODELS);
            rc = KVR_ECAPACITY;
        } else if ((rc = model_new(ms, (uint32_t)n, mc, &m)) == KVR_OK) {
            ms->v[n] = m;
            atomic_store_explicit(&ms->n, n + 1, memory_order_release);
            if (created != NULL)
                *created = 1;
            char ckf[96] = "";
            if (m->index_kind != KVR_INDEX_RADIX)
                snprintf(ckf, sizeof(ckf), " (CKF: %s keys, %llu blocks per rank expected)",
                         m->ckf_keys == SRV_CKF_KEYS_ENGINE ? "engine" : "translated",
                         (unsigned long long)m->ckf_expected);
            srv_logf(ms->log, SRV_LOG_INFO, "models", "model %s: block size %u, %s %s index%s",
                     m->key, m->block_size, srv_kind_name(m->kind),
                     srv_index_kind_name(m->index_kind), ckf);
        } else {
            snprintf(err, err_len, "cannot create model: %s", kvr_strerror(rc));
        }
    }
    pthread_mutex_unlock(&ms->mu);
    if (rc == KVR_OK)
        *out = m;
    return rc;
}

int srv_models_get_or_create_key(struct srv_models *ms, const char *key, size_t len,
                                 uint32_t block_size, uint32_t default_block_size, int tokenizer,
                                 struct srv_model **out, char *err, size_t err_len)
{
    struct srv_model *m = srv_models_find_spec(ms, key, len);
    if (m != NULL && (block_size == 0 || m->block_size == block_size)) {
        *out = m;
        return KVR_OK;
    }
    char name[128], tenant[64] = "default";
    const char *colon = NULL;
    for (size_t k = len; k > 0 && colon == NULL; k--)
        if (key[k - 1] == ':')
            colon = key + k - 1;
    size_t nl = colon ? (size_t)(colon - key) : len;
    snprintf(name, sizeof(name), "%.*s", (int)nl, key);
    if (colon != NULL)
        snprintf(tenant, sizeof(tenant), "%.*s", (int)(len - nl - 1), colon + 1);
    struct srv_model_cfg mc;
    srv_model_cfg_defaults(&mc, name, tenant, block_size ? block_size : default_block_size);
    mc.tokenizer = tokenizer;
    return srv_models_get_or_create(ms, &mc, out, NULL, err, err_len);
}

struct srv_model *srv_models_of_request(struct srv_models *ms, uint64_t request_id)
{
    uint64_t slot1 = request_id >> SRV_REQ_ID_SHIFT;
    if (slot1 == 0 || slot1 > srv_models_count(ms))
        return NULL;
    return ms->v[slot1 - 1];
}

uint64_t srv_model_next_request_id(struct srv_model *m)
{
    uint64_t seq = atomic_fetch_add_explicit(&m->req_seq, 1, memory_order_relaxed) + 1;
    return ((uint64_t)(m->slot + 1) << SRV_REQ_ID_SHIFT) | (seq & ((1ull << SRV_REQ_ID_SHIFT) - 1));
}

/* ==== ZMQ subscriber ========================================================================== */

/* Keeps a batch while the model is held; 1 if kept (or dropped over the bound). */
static int hold_batch(struct srv_model *m, const struct kvr_event *ev, size_t n)
{
    if (!atomic_load_explicit(&m->held, memory_order_acquire))
        return 0;
    pthread_mutex_lock(&m->hold_mu);
    int kept = atomic_load(&m->held);
    if (kept) {
        for (size_t k = 0; k < n; k++) {
            if (m->held_ev.n >= SRV_HOLD_MAX_EVENTS ||
                kvr_event_list_push(&m->held_ev, &ev[k]) != KVR_OK)
                atomic_fetch_add_explicit(&m->held_overflow, 1, memory_order_relaxed);
            else
                atomic_fetch_add_explicit(&m->held_events, 1, memory_order_relaxed);
        }
    }
    pthread_mutex_unlock(&m->hold_mu);
    return kept;
}

static void apply_live(struct srv_model *m, const struct kvr_event *ev, size_t n)
{
    kvr_index_apply_batch(m->index, ev, n, NULL); /* errors are counted by the index */
    if (m->on_events != NULL)
        m->on_events(m->on_events_ctx, m, ev, n);
}

void srv_model_hold(struct srv_model *m)
{
    pthread_mutex_lock(&m->hold_mu);
    atomic_store(&m->held, 1);
    pthread_mutex_unlock(&m->hold_mu);
}

size_t srv_model_release(struct srv_model *m)
{
    size_t applied = 0;
    pthread_mutex_lock(&m->hold_mu);
    while (m->held_ev.n > 0) {
        struct kvr_event_list l = m->held_ev; /* take what is kept; new batches go to a fresh */
        kvr_event_list_init(&m->held_ev);     /* list and keep their order behind these */
        pthread_mutex_unlock(&m->hold_mu);
        apply_live(m, l.ev, l.n);
        applied += l.n;
        kvr_event_list_free(&l);
        pthread_mutex_lock(&m->hold_mu);
    }
    atomic_store_explicit(&m->held, 0, memory_order_release);
    pthread_mutex_unlock(&m->hold_mu);
    return applied;
}

size_t srv_models_release_all(struct srv_models *ms)
{
    pthread_mutex_lock(&ms->mu);
    ms->hold_new = 0;
    pthread_mutex_unlock(&ms->mu);
    size_t n = srv_models_count(ms), applied = 0;
    for (size_t k = 0; k < n; k++)
        applied += srv_model_release(ms->v[k]);
    return applied;
}

void srv_model_apply_events(struct srv_model *m, const struct kvr_event *ev, size_t n)
{
    if (!hold_batch(m, ev, n))
        apply_live(m, ev, n);
}

static int sink(void *ctx, const struct kvr_event *ev, size_t n)
{
    struct srv_model *m = ctx;
    srv_model_apply_events(m, ev, n);
    atomic_fetch_add_explicit(&m->sink_batches, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&m->sink_events, n, memory_order_relaxed);
    return 0;
}

static void sub_log(void *ctx, int level, const char *msg)
{
    struct srv_model *m = ctx;
    int lv = level == KVR_KVSUB_ERROR  ? SRV_LOG_ERROR
             : level == KVR_KVSUB_WARN ? SRV_LOG_WARN
                                       : SRV_LOG_INFO;
    srv_logf(m->log, lv, "zmq", "%s: %s", m->key, msg);
}

int srv_model_subscribe(struct srv_models *ms, struct srv_model *m, uint64_t worker_id,
                        uint32_t dp_rank, const char *endpoint, const char *replay,
                        const char *topic, const char *lora, uint32_t *sub_id, char *err,
                        size_t err_len)
{
    if (topic == NULL)
        topic = m->kv_topic;
    int rc = KVR_OK;
    pthread_mutex_lock(&ms->mu);
    if (ms->zmq_ctx == NULL && (ms->zmq_ctx = zmq_ctx_new()) == NULL)
        rc = KVR_EIO;
    void *zctx = ms->zmq_ctx;
    pthread_mutex_unlock(&ms->mu);
    if (rc != KVR_OK) {
        snprintf(err, err_len, "cannot create a ZMQ context");
        return rc;
    }
    pthread_mutex_lock(&m->sub_mu);
    if (m->sub == NULL) {
        struct kvr_kvsub_config sc = {
            .zmq_ctx = zctx, .sink = sink, .sink_ctx = m, .log = sub_log, .log_ctx = m};
        rc = kvr_kvsub_new(&sc, &m->sub);
        if (rc != KVR_OK) {
            m->sub = NULL;
            snprintf(err, err_len, "cannot start the KV-event subscriber: %s", kvr_strerror(rc));
        }
    }
    if (rc == KVR_OK) {
        struct kvr_kvsub_source_config src = {.worker_id = worker_id,
                                              .dp_rank = dp_rank,
                                              .block_size = m->block_size,
                                              .endpoint = endpoint,
                                              .replay_endpoint = replay,
                                              .topic = topic,
                                              .topic_len = topic ? strlen(topic) : 0,
                                              .clear_on_loss = 1,
                                              .lora_name = lora};
        rc = kvr_kvsub_add(m->sub, &src, sub_id);
        if (rc == KVR_EEXIST)
            snprintf(err, err_len, "worker %llu dp_rank %u is already subscribed in %s",
                     (unsigned long long)worker_id, dp_rank, m->key);
        else if (rc == KVR_EINVAL)
            snprintf(err, err_len, "invalid ZMQ endpoint '%s'%s%s", endpoint,
                     replay ? " or replay endpoint " : "", replay ? replay : "");
        else if (rc != KVR_OK)
            snprintf(err, err_len, "cannot subscribe to '%s': %s", endpoint, kvr_strerror(rc));
    }
    pthread_mutex_unlock(&m->sub_mu);
    return rc;
}

int srv_model_unsubscribe(struct srv_model *m, uint32_t sub_id)
{
    pthread_mutex_lock(&m->sub_mu);
    int rc = m->sub != NULL ? kvr_kvsub_remove(m->sub, sub_id) : KVR_ENOTFOUND;
    pthread_mutex_unlock(&m->sub_mu);
    return rc;
}
