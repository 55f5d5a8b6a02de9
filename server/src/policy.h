/* policy.h - the routing policy boundary: the one interface the routing core calls.
 *
 *   route.c ──srv_policy_select(req, candidates)──▶ policy.c ──▶ [Lua VM of this thread]
 *                                                            └─▶ built-in classic KV cost
 *
 * The routing core fills one srv_policy_req and one srv_policy_cand per eligible candidate
 * (overlap from the index, load terms from the load tracker) and gets back a ranked list of
 * candidate indices (best first; the rest are retry alternatives). This header is deliberately
 * shaped like the Lua runtime's C API (lua/include/kvr/lua.h: kvr_ffi_request,
 * kvr_ffi_candidate, kvr_lua_vm_select), so plugging it in is a field-for-field copy in
 * policy.c; until the runtime is merged, policy.c decides with the built-in classic cost
 * (spec/scheduling.md §3, §5):
 *
 *   prefill_tokens_w = max(0, isl - overlap_w * block_size) + active_prefill_tokens_w
 *   cost_w           = overlap_weight * prefill_tokens_w / block_size + new_blocks_w
 *                      + active_decode_blocks_w                                   lower wins
 *   T = 0: argmin, ties -> fewer tree blocks, then lower index; T > 0: softmax (§5 exactly).
 *
 * Admin side (control thread): install a policy for a model (POST /admin/policy), reload the
 * configured policy files (SIGHUP, POST /admin/reload), status and metrics.
 *
 * Thread-safety: srv_policy_select and srv_policy_thread_* on their HTTP thread; the rest on
 * the control thread (or at start/stop).
 */
#ifndef KVR_SRV_POLICY_H
#define KVR_SRV_POLICY_H

#include <stddef.h>
#include <stdint.h>

#include "jsonw.h"
#include "prom.h"

struct srv;
struct srv_thread;
struct srv_model;
struct srv_policy_rt;

/* A routing header (lower-case name). */
struct srv_kv {
    const char *name;
    const char *value;
    uint32_t name_len;
    uint32_t value_len;
};

struct srv_policy_req {
    const char *model;   /* model key */
    const char *session; /* session key or NULL */
    size_t session_len;
    const char *lora; /* LoRA name or NULL */
    size_t lora_len;
    const char *policy; /* policy asked for by header, or NULL */
    size_t policy_len;
    const struct srv_kv *headers; /* routing headers (may be NULL) */
    size_t n_headers;
    const uint64_t *locals; /* local block hashes [blocks] */
    const uint64_t *seqs;   /* sequence hashes [blocks] */
    uint64_t request_id;
    double overlap_weight; /* per-request override, < 0 unset */
    double temperature;    /* per-request override, < 0 unset */
    uint32_t isl;          /* input tokens */
    uint32_t blocks;       /* complete blocks */
    uint32_t block_size;
    int32_t priority;
};

struct srv_policy_cand {
    uint64_t worker_id;
    const char *url;    /* or NULL */
    const char *labels; /* "k=v,k=v" or NULL */
    uint32_t dp_rank;
    uint32_t healthy;
    uint32_t overlap;        /* device blocks already cached */
    uint32_t tree_blocks;    /* blocks the index holds for the rank */
    uint64_t prefill_tokens; /* active prefill tokens */
    uint64_t decode_blocks;  /* active decode blocks */
    uint64_t new_blocks;     /* request blocks not already active on the rank */
    uint64_t requests;       /* active requests */
    double cost;             /* out: the built-in cost (for "scores"), NaN when not computed */
};

struct srv_policy_out {
    uint32_t *ranked;    /* in: buffer; out: candidate indices, best first */
    size_t cap;          /* in */
    size_t n;            /* out: >= 1 */
    int fallback;        /* out: decided by the built-in policy after a Lua failure */
    int status;          /* out: 0 ok, else the Lua runtime's failure status */
    const char *policy;  /* out: policy name that decided ("builtin:kv_cost", ...) */
    uint64_t generation; /* out: policy generation */
};

/* Creates the runtime and installs the configured policies (cfg.policy, per-model policy).
 * KVR_OK, or an error with err naming the policy (bad config fails the start). */
int srv_policy_rt_new(struct srv *s, struct srv_policy_rt **out, char *err, size_t err_len);
void srv_policy_rt_free(struct srv_policy_rt *rt);

/* Per-thread state (created and freed on the thread itself). */
void srv_policy_thread_init(struct srv_thread *t);
void srv_policy_thread_poll(struct srv_thread *t);
void srv_policy_thread_free(struct srv_thread *t);

/* Feeds a batch of applied KV events (borrowed) to the policies' KV-event hooks on every HTTP
 * thread whose policies define one (srv_events_fn; ctx = struct srv *). Any thread. */
struct kvr_event;
struct srv_model;
void srv_policy_events(void *ctx, struct srv_model *m, const struct kvr_event *ev, size_t n);

/* Chooses among n >= 1 candidates. Always decides (KVR_OK) unless arguments are invalid. */
int srv_policy_select(struct srv_thread *t, struct srv_model *m, const struct srv_policy_req *rq,
                      struct srv_policy_cand *c, size_t n, struct srv_policy_out *out);

/* The outcome of a proxied request, for policies with an on_response hook (no-op without the
 * Lua runtime). status: the worker's HTTP status, 0 when none; times < 0 when unknown; error may
 * be NULL. The candidate is the worker that served (or failed) the last attempt. */
struct srv_policy_outcome {
    int status;
    double ttft_ms;
    double latency_ms;
    const char *error;
};
void srv_policy_on_response(struct srv_thread *t, struct srv_model *m,
                            const struct srv_policy_req *rq, const struct srv_policy_cand *worker,
                            const struct srv_policy_outcome *out);

/* The control thread's tick (every 200 ms): the stuck-call watchdog (--policy-stuck-after) and
 * the --policy-dev file watch (re-installs a policy file whose modification time changed; a
 * refused version leaves the previous one live and is logged). */
void srv_policy_tick(struct srv_policy_rt *rt);

/* 0 while an HTTP thread is stuck in one policy call (last watchdog pass), else 1: /readyz. */
int srv_policy_ready(struct srv_policy_rt *rt);

/* Runs an operator script (Lua source, borrowed) on the calling (control) thread with the
 * script budget: kvr.admin.dump(path) / kvr.admin.snapshot(path) write into the --snapshot
 * directory only. Appends the JSON answer to out: {"result": "<tostring of the first return>"},
 * or {"error": "... with traceback", "status": "errrun"}. Returns the HTTP status: 200, 400
 * (syntax or runtime error), 408 (budget), 413 (memory cap), 501 (no Lua runtime), 503. */
struct kvr_buf;
int srv_policy_script(struct srv_policy_rt *rt, const char *src, size_t len, struct kvr_buf *out);

/* Installs `src` as the policy of model key (NULL = the default). On success *generation is the
 * generation live on every thread. Returns an HTTP status (200, 4xx with err, 5xx with err). */
int srv_policy_install(struct srv_policy_rt *rt, const char *model, const char *src, size_t len,
                       uint64_t *generation, char *err, size_t err_len);

/* Re-reads and re-installs every policy file from the configuration. HTTP status as above. */
int srv_policy_reload(struct srv_policy_rt *rt, uint64_t *generation, char *err, size_t err_len);

/* {"runtime": ..., "generation": n, "policies": [...]} members (no braces). */
void srv_policy_status(struct srv_policy_rt *rt, struct srv_jw *w);

/* Policy metric families. */
void srv_policy_metrics(struct srv_policy_rt *rt, struct srv_prom *p);

/* The built-in cost of one candidate (exposed for tests). */
double srv_policy_builtin_cost(double overlap_weight, const struct srv_policy_req *rq,
                               const struct srv_policy_cand *c);

/* The built-in selection: ranks all n candidates into out (exposed for tests). u in [0, 1) is
 * the softmax draw (ignored when temperature == 0). */
void srv_policy_builtin_rank(double overlap_weight, double temperature,
                             const struct srv_policy_req *rq, struct srv_policy_cand *c, size_t n,
                             double u, struct srv_policy_out *out);

#endif
