/* sim.h - the policy lab: replay a request trace through routing policies against simulated
 * workers, with the router's own engine (index, load tracker) and Lua runtime.
 * SPDX-License-Identifier: Apache-2.0
 *
 * Design (docs/SIM.md has the long form, with the measured figures).
 *
 *   trace (Mooncake JSONL[.gz])        one run per policy, each from a clean state
 *   ─────────────────────────          ─────────────────────────────────────────────────────────
 *   request i: arrival a_i,            arrival ─▶ hashes ─▶ kvr_lua_prepare (index overlap, tree
 *   input/output tokens, hash ids                 blocks, ActiveSequences load) ─▶ policy select
 *                                                 (kvr_lua_vm_select, or the C fallback) ─▶
 *                                                 kvr_load_add on the pick ─▶ worker FIFO queue
 *   worker w:  slots, prefill lanes,   start   ─▶ hit = LRU prefix; prefill time
 *              LRU cache of C blocks             P = overhead + uncached tokens × per-token
 *   KV events ─▶ kvr_index_apply       first token (a_i + wait + P) ─▶ LRU store: stored/removed
 *              (+ policy KV hooks)               events into the index; kvr_load_first_token
 *                                       done    (+ (output - 1) × per-token decode) ─▶
 *                                                 kvr_load_release, policy on_response
 *
 * Blocks. A trace hash id covers trace_block_tokens tokens (512 in Mooncake traces). With block
 * size B (B divides trace_block_tokens), id h becomes E = trace_block_tokens / B consecutive
 * blocks, each B copies of the u32 token h: local hash = kvr_hash_trace_id(h, B) repeated E times
 * (like tools/kvtrace.py --expand; hashing.md §9.3), sequence hashes by the chain rule. The
 * default B = 512 gives one block per id. Every id is a full block (the last id of a request is
 * usually partial in tokens; it is still cached and matched as a block, as in the op streams).
 * A request's `tokens` is its input_length, its `blocks` is n_ids × E.
 *
 * Virtual time is integer microseconds; the event queue orders by (time, push order); at equal
 * times completions run before arrivals. A worker starts the head of its FIFO queue when fewer
 * than `slots` requests are running (prefill or decode) and fewer than `prefill_lanes` are in
 * prefill (prefill is compute-bound: with one lane, prefills on a worker run one after the
 * other). The hit of a request is the worker's cached prefix at prefill START (those blocks are
 * touched); its blocks enter the cache, and the index, at prefill END (first token).
 *
 * Figures (per policy): hit_ratio = Σ hit blocks / Σ request blocks; best_hit_ratio = Σ best /
 * Σ blocks where best_i is request i's longest prefix (in ids, × E) seen in ANY earlier request
 * of the trace (arrival order; one infinite shared cache, no evictions; policy-independent);
 * imbalance = max over workers of requests routed / mean requests routed (imbalance_inflight
 * measures the same over time: bucket by bucket, max / mean requests in flight); TTFT = first token
 * - arrival; throughput = completed / (last completion - first arrival).
 *
 * Determinism: a run depends only on (trace, config, policy source). The Lua runtime is seeded
 * with cfg.seed (policies' kvr.random / math.random), the C fallback likewise, the simulator's
 * own RNG (service-time jitter) with cfg.seed too. Wall-clock figures (wall_s, decisions_per_s)
 * are kept apart and written only on request (kvr_sim_report.timing).
 *
 * Ownership: every struct below is caller-allocated; arrays inside a result or a trace are owned
 * by it and freed by its _free function. Nothing here is thread-safe; separate runs may proceed
 * on separate threads (each run owns its index, tracker and Lua runtime).
 */
#ifndef KVR_SIM_H
#define KVR_SIM_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "kvr/lua.h"

#define KVR_SIM_NAME_MAX 63

/* ==== configuration ========================================================================== */

struct kvr_sim_config {
    uint32_t workers;            /* simulated workers; 8 */
    uint32_t block_size;         /* tokens per KV block (index, load tracker, policy); 512 */
    uint32_t trace_block_tokens; /* tokens per trace hash id; 512 (Mooncake) */
    uint32_t slots;              /* concurrency limit per worker (prefill + decode); 16 */
    uint32_t prefill_lanes;      /* prefills at once per worker; 1 (0 = slots only) */
    uint32_t buckets;            /* time-series buckets over the arrival window; 60 */
    uint32_t inflight;           /* --events mode: a routed query is released after this many
                                    later queries (its "duration"); 32 */
    uint32_t pad_;               /* zero */
    uint64_t worker_base;        /* worker ids worker_base .. worker_base + workers - 1; 0 */
    uint64_t cache_blocks;       /* LRU capacity per worker, in blocks of block_size; 4096 */
    uint64_t seed;               /* seeds the policy runtime, the fallback and the simulator; 1 */
    uint64_t limit;              /* replay only the first `limit` requests; 0 = all */
    double time_scale;           /* arrival time = (timestamp - first) × time_scale; 1 */
    double prefill_us_per_token; /* prefill time per uncached input token; 100 (10k tokens/s) */
    double prefill_overhead_us;  /* fixed prefill time per request; 10000 */
    double decode_us_per_token;  /* time per output token after the first; 30000 */
    double jitter;               /* service times × U[1 - jitter, 1 + jitter]; 0 */
    uint64_t budget_ns;          /* Lua time budget per decision; 10 ms */
    int sandbox_shipped;         /* run shipped policies sandboxed (default: trusted, as the
                                    server installs them) */
    int pad2_;                   /* zero */
    kvr_lua_log_fn log;          /* policy runtime log; NULL = silent */
    void *log_ctx;               /* passed to log */
};

/* Fills the defaults above. */
void kvr_sim_config_init(struct kvr_sim_config *cfg);

/* Blocks per trace hash id (trace_block_tokens / block_size), or 0 when block_size does not
 * divide trace_block_tokens (an invalid configuration). */
uint32_t kvr_sim_expand(const struct kvr_sim_config *cfg);

/* ==== traces ================================================================================= */

struct kvr_sim_request {
    uint64_t arrival_us;    /* trace timestamp - the first one, in microseconds (unscaled) */
    uint32_t input_tokens;  /* input_length */
    uint32_t output_tokens; /* output_length */
    size_t ids_off;         /* first hash id in kvr_sim_trace.ids */
    uint32_t n_ids;         /* hash ids */
    uint32_t pad_;          /* zero */
};

struct kvr_sim_trace {
    struct kvr_sim_request *req; /* req[0..n) in arrival order (owned) */
    size_t n;
    uint32_t *ids; /* every request's hash ids, concatenated (owned) */
    size_t n_ids;
    uint32_t max_id;           /* largest hash id */
    uint32_t pad_;             /* zero */
    double first_ms;           /* timestamp of the first request (ms; valid when n > 0) */
    size_t cap_req_, cap_ids_; /* internal */
};

void kvr_sim_trace_init(struct kvr_sim_trace *t);
void kvr_sim_trace_free(struct kvr_sim_trace *t);

/* Parses Mooncake JSONL text (borrowed, len bytes): one object per non-blank line with
 * "timestamp" (ms, integer or decimal, >= 0, non-decreasing), "input_length", "output_length"
 * (integers >= 0) and "hash_ids" (integers 0 .. 2^32 - 1); other keys are ignored. Appends to t.
 * KVR_OK, KVR_ECORRUPT (err names the line and the field; t keeps the lines before) or
 * KVR_ENOMEM. */
int kvr_sim_trace_parse(const char *buf, size_t len, struct kvr_sim_trace *t, char *err,
                        size_t err_len);

/* Loads a trace file (borrowed path), plain or gzip-compressed (detected by content).
 * KVR_OK, KVR_EIO (cannot open/read), KVR_ECORRUPT, KVR_ENOMEM; err as above. */
int kvr_sim_trace_load(const char *path, struct kvr_sim_trace *t, char *err, size_t err_len);

/* Best achievable prefix of every request, in hash ids: best[i] = the longest prefix of request
 * i's ids that is a prefix of some earlier request (an infinite cache shared by all workers).
 * best (caller array of t->n) is written. KVR_OK or KVR_ENOMEM. */
int kvr_sim_trace_best(const struct kvr_sim_trace *t, uint32_t *best);

/* The pooled-cache reference: the hit ratio of ONE LRU cache of workers × cache_blocks blocks
 * fed every request (of the first `limit`) in arrival order, each stored as soon as it arrives.
 * Policy-independent; a reference for how much of best_hit_ratio the total capacity allows, not
 * a bound (LRU is not optimal). KVR_OK, KVR_EINVAL (bad block size) or KVR_ENOMEM. */
int kvr_sim_pooled_hit_ratio(const struct kvr_sim_config *cfg, const struct kvr_sim_trace *t,
                             double *ratio);

/* ==== policies =============================================================================== */

enum kvr_sim_policy_kind {
    KVR_SIM_POLICY_LUA = 1,     /* a Lua policy run by the real runtime (one VM in-process) */
    KVR_SIM_POLICY_BUILTIN = 2, /* the C fallback (classic KV cost, kvr/fallback.h) directly */
};

struct kvr_sim_policy {
    char name[KVR_SIM_NAME_MAX + 1]; /* the name in the report ([A-Za-z0-9_.-]) */
    int kind;                        /* enum kvr_sim_policy_kind */
    int shipped;                     /* 1: a shipped policy (policies/NAME.lua) */
    const char *src;                 /* Lua source (borrowed; LUA only) */
    size_t len;                      /* bytes in src */
    const char *origin;              /* "shipped", "builtin" or the file path (borrowed) */
};

/* Resolves a command-line policy argument: "builtin" (the C fallback), a shipped policy name
 * (kvr_lua_builtin_names), "NAME=FILE" or a file path (name = the file's base name without
 * ".lua", characters outside [A-Za-z0-9_.-] replaced by '_'). A file's text is read into *owned
 * (free it after the runs; NULL for the others); out borrows it and arg. KVR_OK, KVR_ENOTFOUND
 * (no such policy or file: err says which), KVR_EIO, KVR_ENOMEM. */
int kvr_sim_policy_resolve(const char *arg, struct kvr_sim_policy *out, char **owned, char *err,
                           size_t err_len);

/* ==== results ================================================================================ */

enum kvr_sim_mode {
    KVR_SIM_MODE_TRACE = 1,  /* trace replay with simulated workers */
    KVR_SIM_MODE_EVENTS = 2, /* op-stream replay (--events) */
};

struct kvr_sim_worker_stats {
    uint64_t worker_id;
    uint64_t requests;       /* requests routed here */
    uint64_t blocks;         /* their blocks */
    uint64_t cached_blocks;  /* their hit blocks */
    uint64_t prefill_tokens; /* input tokens computed (not cached) */
    uint64_t max_inflight;   /* most requests in flight (queued or running) at once */
    double mean_inflight;    /* time-averaged in-flight requests over the arrival window */
};

/* A latency distribution in milliseconds (nearest-rank percentiles). */
struct kvr_sim_dist {
    double mean, p50, p90, p99, max;
};

struct kvr_sim_policy_counts {
    uint64_t decisions; /* select calls */
    uint64_t ok;        /* decided by the policy */
    uint64_t errors;    /* ERRRUN */
    uint64_t timeouts;  /* ETIMEDOUT */
    uint64_t oom;       /* ERRMEM */
    uint64_t invalid;   /* INVALID */
    uint64_t fallbacks; /* decided by the C fallback instead */
    char first_error[512];
};

struct kvr_sim_result {
    char name[KVR_SIM_NAME_MAX + 1]; /* policy name */
    const char *origin;              /* borrowed from the policy */
    int mode;                        /* enum kvr_sim_mode */
    int ok;                          /* 0: the policy could not be installed; see error */
    char error[1024];                /* why, when !ok (or a simulation failure) */

    uint64_t requests;          /* requests routed */
    uint64_t completed;         /* requests finished (trace mode) */
    uint64_t blocks;            /* Σ request blocks */
    uint64_t cached_blocks;     /* Σ hit blocks */
    uint64_t best_blocks;       /* Σ best achievable blocks */
    uint64_t routed_overlap;    /* Σ overlap the index reported for the chosen worker */
    uint64_t oracle_blocks;     /* --events: Σ max overlap over workers at routing time */
    uint64_t expect_mismatches; /* --events: queries whose index answer differed from expect */
    double hit_ratio, best_hit_ratio;
    double imbalance;          /* max / mean of requests routed per worker */
    double imbalance_blocks;   /* max / mean of request blocks per worker */
    double imbalance_prefill;  /* max / mean of prefill tokens computed per worker */
    double imbalance_inflight; /* Σ_b max_w L(w,b) / Σ_b mean_w L(w,b): L = mean in flight of
                                  worker w in bucket b (hot spots in time; 1 = even) */
    struct kvr_sim_dist ttft_ms, e2e_ms, queue_ms;
    double makespan_s;     /* last completion - first arrival */
    double throughput_rps; /* completed / makespan */
    double output_tps;     /* output tokens / makespan */

    struct kvr_sim_policy_counts policy;
    uint64_t index_stored_events, index_stored_blocks, index_removed_events, index_removed_blocks,
        index_errors;
    uint64_t load_expired; /* requests the load tracker force-freed (300 s expiry) */

    uint32_t n_workers;
    uint32_t n_buckets;
    struct kvr_sim_worker_stats *workers; /* n_workers (owned) */
    uint64_t bucket_us;                   /* bucket width (trace) or queries per bucket (events) */
    uint64_t *bucket_blocks;              /* n_buckets: blocks of requests arriving in bucket */
    uint64_t *bucket_cached;              /* n_buckets: their hit blocks */
    uint64_t *bucket_best;                /* n_buckets: their best achievable blocks */
    double *inflight;                     /* n_workers × n_buckets, worker-major: mean in flight */
    uint64_t *ttft_us;                    /* n_ttft TTFTs, sorted ascending (owned) */
    size_t n_ttft;

    double wall_s;          /* wall-clock seconds of the run (not deterministic) */
    double decisions_per_s; /* requests routed / wall_s (not deterministic) */
};

/* Frees the arrays a result owns; the struct is zeroed. */
void kvr_sim_result_free(struct kvr_sim_result *r);

/* Simulates the trace (borrowed) with one policy (borrowed) into *out (zeroed, then owned by the
 * caller: kvr_sim_result_free). A policy that cannot be installed gives KVR_OK with out->ok = 0
 * and out->error set (reported, never fatal); policy failures at decision time are counted in
 * out->policy and routed by the C fallback. KVR_OK, KVR_EINVAL (bad configuration: out->error)
 * or KVR_ENOMEM. */
int kvr_sim_run(const struct kvr_sim_config *cfg, const struct kvr_sim_trace *t,
                const struct kvr_sim_policy *p, struct kvr_sim_result *out);

/* ==== reports ================================================================================ */

struct kvr_sim_report {
    const struct kvr_sim_config *cfg;
    const char *input;                /* trace or op-stream path, as given */
    int mode;                         /* enum kvr_sim_mode */
    int timing;                       /* 1: add the wall-clock "timing" object to the JSON */
    const struct kvr_sim_result *res; /* n results, in command-line order */
    size_t n;
    uint64_t trace_requests; /* requests (or queries) replayed */
    double trace_duration_s; /* arrival window, scaled (trace mode) */
    double pooled_hit_ratio; /* kvr_sim_pooled_hit_ratio (trace mode) */
};

/* Writes the JSON document (all figures; docs/SIM.md lists every key) to f. KVR_OK or KVR_EIO. */
int kvr_sim_write_json(FILE *f, const struct kvr_sim_report *rep);

/* Writes the self-contained HTML report (inline SVG, no script, no network) to f. KVR_OK or
 * KVR_EIO. */
int kvr_sim_write_html(FILE *f, const struct kvr_sim_report *rep);

/* Writes each chart as a standalone SVG file into dir (hit_ratio.svg, ttft_cdf.svg,
 * load_<policy>.svg). KVR_OK or KVR_EIO (err names the file). */
int kvr_sim_write_svgs(const char *dir, const struct kvr_sim_report *rep, char *err,
                       size_t err_len);

/* ==== command line =========================================================================== */

/* `kvrouter sim ...` / `kvr-sim ...`: argv[0] is the program or sub-command name. Prints usage
 * with --help. Returns the process exit status: 0 done (policy errors are reported in the
 * outputs, not fatal), 1 a run or an output failed (or, with --strict, a policy failed), 2 bad
 * usage or unreadable input. */
int kvr_sim_main(int argc, char **argv);

#endif
