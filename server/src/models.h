/* models.h - the model registry: one index, load tracker (and approximate recorder) per
 * "model:tenant", created from the config, by /register or /v1/workers, or by a snapshot.
 *
 *   srv_models ─┬─ slot 0  "default:default"  block 16  kind events ─ index, load, [kvsub]
 *               ├─ slot 1  "llama:default"    block 16  kind events ─ index, load, kvsub ─▶ ZMQ
 *               └─ slot 2  "mistral:acme"     block 32  kind approx ─ index, load, approx
 *
 * Models are append-only: a model, once created, lives until the server is freed, so a pointer
 * from srv_models_find stays valid without any reference counting. Creation is serialised by a
 * mutex; lookups read an array published with a release store of its length (lock-free).
 * The first creator fixes a model's block size; asking for another size later is a conflict
 * (KVR_EEXIST), as in the standalone indexer.
 *
 * KV events: each model has at most one subscriber thread (kvr_kvsub, created on first use) for
 * the ZMQ endpoints of its workers; its sink applies every batch to the model's index with
 * kvr_index_apply_batch (bounded write-lock holds). Request ids: ((slot + 1) << 44) | sequence,
 * so /v1/route/{id} finds its model without a table (ids stay below 2^53, exact in JSON numbers).
 *
 * Thread-safety: every function is thread-safe.
 */
#ifndef KVR_SRV_MODELS_H
#define KVR_SRV_MODELS_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "config.h"
#include "kvr/approx.h"
#include "kvr/index.h"
#include "kvr/load.h"
#include "log.h"

struct kvr_kvsub;

#define SRV_REQ_ID_SHIFT 44

/* Called with every batch of KV events a model applied (from the subscriber thread or an HTTP
 * thread); events are borrowed for the call. Used to feed the policies' KV-event hooks. */
struct srv_model;
typedef void (*srv_events_fn)(void *ctx, struct srv_model *m, const struct kvr_event *ev, size_t n);

/* Replica sync (replica.h): told of every load op and approximate recording of a model, under
 * the tracker's / recorder's mutex (so they must be short). */
typedef void (*srv_load_fn)(void *ctx, struct srv_model *m, const struct kvr_load_op *op);
typedef void (*srv_approx_fn)(void *ctx, struct srv_model *m, uint64_t worker_id, uint32_t dp_rank,
                              const uint64_t *locals, size_t n);

struct srv_model {
    uint32_t slot;         /* index in the registry */
    uint32_t block_size;   /* tokens per block */
    char name[128];        /* model name */
    char tenant[64];       /* tenant */
    char key[200];         /* "name:tenant" */
    int kind;              /* enum srv_model_kind */
    int index_kind;        /* enum kvr_index_kind */
    int ckf_keys;          /* enum srv_ckf_keys (CKF/both) */
    uint64_t ckf_expected; /* CKF/both: blocks per rank sizing the filter */
    int tokenizer;         /* enum srv_tokenizer (resolved: never AUTO) */
    uint32_t byte_chunk;   /* bytes tokenizer: bytes per pseudo-token */
    uint32_t pad_;
    char *policy;            /* policy name/file (owned) or NULL = server default */
    char *kv_topic;          /* ZMQ topic prefix of its workers' KV events (owned) or NULL = all */
    char *nats_subject;      /* KV events (RouterEvent JSON) on this NATS subject (owned) or NULL */
    char *nats_stream;       /* JetStream stream replayed for it (owned) or NULL */
    srv_events_fn on_events; /* from srv_models */
    void *on_events_ctx;
    double overlap_weight; /* built-in policy */
    double temperature;
    kvr_index_t *index;               /* owned */
    kvr_load_t *load;                 /* owned */
    kvr_approx_t *approx;             /* owned, approx models only */
    uint64_t created_unix;            /* seconds */
    _Atomic uint64_t req_seq;         /* request id sequence */
    pthread_mutex_t sub_mu;           /* guards sub creation */
    struct kvr_kvsub *sub;            /* KV-event subscriber (owned) or NULL */
    struct srv_logger *log;           /* borrowed */
    _Atomic uint64_t sink_batches;    /* batches received from ZMQ (applied, or kept while held) */
    _Atomic uint64_t sink_events;     /* events received from ZMQ (same) */
    _Atomic uint64_t http_events;     /* events applied from POST /v1/events */
    _Atomic uint64_t route_decisions; /* routing decisions */
    srv_load_fn on_load;              /* from srv_models (replica sync) or NULL */
    srv_approx_fn on_approx;
    void *sync_ctx;
    /* Bootstrap gate (replica.h, peer.h): while held, KV-event batches from the subscriber are
     * kept in order instead of applied; srv_model_release applies them, then goes live. */
    pthread_mutex_t hold_mu;
    _Atomic int held;
    struct kvr_event_list held_ev;  /* kept batches (owned) */
    _Atomic uint64_t held_events;   /* events kept while held (total) */
    _Atomic uint64_t held_overflow; /* events dropped: more than SRV_HOLD_MAX_EVENTS kept */
};

#define SRV_HOLD_MAX_EVENTS (1u << 22) /* events a held model keeps (then drops and counts) */

struct srv_models {
    srv_events_fn on_events; /* set before any model is created, or NULL */
    void *on_events_ctx;
    srv_load_fn on_load; /* replica sync: set before any model is created, or NULL */
    srv_approx_fn on_approx;
    void *sync_ctx;
    int hold_new;       /* models created while set start held (bootstrap from peers) */
    pthread_mutex_t mu; /* serialises creation */
    struct srv_model *v[SRV_MAX_MODELS]; /* published slots */
    _Atomic size_t n;                    /* slots published (release/acquire) */
    struct srv_logger *log;              /* borrowed */
    void *zmq_ctx;                       /* shared ZMQ context (owned) or NULL until needed */
};

int srv_models_init(struct srv_models *ms, struct srv_logger *log);
/* Stops every subscriber and frees every model. */
void srv_models_free(struct srv_models *ms);

static inline size_t srv_models_count(struct srv_models *ms)
{
    return atomic_load_explicit(&ms->n, memory_order_acquire);
}
static inline struct srv_model *srv_models_at(struct srv_models *ms, size_t i)
{
    return ms->v[i];
}

/* Exact lookup of (name, tenant); tenant NULL means "default". Returns NULL if absent. */
struct srv_model *srv_models_find(struct srv_models *ms, const char *name, size_t name_len,
                                  const char *tenant, size_t tenant_len);

/* Lookup of "name" (tenant default) or "name:tenant" (text not NUL-terminated). A name that
 * itself contains ':' is tried whole first. */
struct srv_model *srv_models_find_spec(struct srv_models *ms, const char *spec, size_t len);

/* The model a proxied OpenAI request names: exact name match (tenant default), else the model
 * "default", else the only model if there is exactly one; NULL otherwise. */
struct srv_model *srv_models_for_openai(struct srv_models *ms, const char *name, size_t len);

/* Creates a model from a config entry, or returns the existing one when (name, tenant) exists
 * with the same block size (*created = 0). KVR_EEXIST (block size differs; err says so),
 * KVR_ECAPACITY (too many models), KVR_EINVAL, KVR_ENOMEM. created may be NULL. */
int srv_models_get_or_create(struct srv_models *ms, const struct srv_model_cfg *mc,
                             struct srv_model **out, int *created, char *err, size_t err_len);

/* The model a request names by key "name" or "name:tenant" (text key[0..len), borrowed), as
 * srv_models_find_spec finds it; created (events kind, `tokenizer`) when absent, split at the
 * last ':' as srv_models_find_spec reads it, with block_size, or default_block_size when
 * block_size is 0. An existing model with another block size than a non-zero block_size is a
 * conflict (KVR_EEXIST, err says so). Other errors as srv_models_get_or_create. */
int srv_models_get_or_create_key(struct srv_models *ms, const char *key, size_t len,
                                 uint32_t block_size, uint32_t default_block_size, int tokenizer,
                                 struct srv_model **out, char *err, size_t err_len);

/* A config entry with defaults for (name, tenant, block_size): events kind, auto tokenizer. The
 * strings are borrowed (the struct must not be freed with srv_config_free). */
void srv_model_cfg_defaults(struct srv_model_cfg *mc, char *name, char *tenant,
                            uint32_t block_size);

/* Model of a request id, or NULL. */
struct srv_model *srv_models_of_request(struct srv_models *ms, uint64_t request_id);

/* A fresh request id for m. */
uint64_t srv_model_next_request_id(struct srv_model *m);

/* Subscribes the model's index to a worker rank's ZMQ KV events (strings borrowed; replay may be
 * NULL; topic NULL = the model's topic, "" = every message; lora NULL = none: the LoRA of stores
 * whose event names none). *sub_id receives the source id. KVR_OK, KVR_EEXIST (that rank is
 * already subscribed), KVR_EINVAL (bad endpoint; err says why), KVR_EIO, KVR_ENOMEM. */
int srv_model_subscribe(struct srv_models *ms, struct srv_model *m, uint64_t worker_id,
                        uint32_t dp_rank, const char *endpoint, const char *replay,
                        const char *topic, const char *lora, uint32_t *sub_id, char *err,
                        size_t err_len);

/* Removes a source (KVR_OK or KVR_ENOTFOUND). */
int srv_model_unsubscribe(struct srv_model *m, uint32_t sub_id);

/* Bootstrap gate: hold keeps the model's incoming ZMQ batches; release applies what was kept,
 * in arrival order, then applies live batches directly again (batches arriving meanwhile keep
 * their order). srv_models_release_all releases every model and clears hold_new. Returns the
 * number of events applied from the hold. */
void srv_model_hold(struct srv_model *m);
/* The subscriber's path for one batch (borrowed): kept while held, else applied to the index
 * and given to the policies' hooks. */
void srv_model_apply_events(struct srv_model *m, const struct kvr_event *ev, size_t n);
size_t srv_model_release(struct srv_model *m);
size_t srv_models_release_all(struct srv_models *ms);

#endif
