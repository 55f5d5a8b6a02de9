/* test_run.c - whole simulations on hand-computed traces: hit ratio, loads, TTFT, KV events,
 * policy failures (reported, never fatal) and reproducibility.
 * SPDX-License-Identifier: Apache-2.0 */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvr/err.h"
#include "kvr/sim.h"

Suite *sim_run_suite(void);

/* Longest overlap; ties: fewer in-flight requests, then the first candidate. */
static const char affinity_src[] =
    "local function select(req, c)\n"
    "  local best = c[1]\n"
    "  for i = 2, #c do\n"
    "    local x = c[i]\n"
    "    if x.overlap > best.overlap or (x.overlap == best.overlap and x.requests < "
    "best.requests) then best = x end\n"
    "  end\n"
    "  return best\n"
    "end\n"
    "return { select = select }\n";

static void lua_policy(struct kvr_sim_policy *p, const char *name, const char *src)
{
    memset(p, 0, sizeof(*p));
    snprintf(p->name, sizeof(p->name), "%s", name);
    p->kind = KVR_SIM_POLICY_LUA;
    p->src = src;
    p->len = strlen(src);
    p->origin = "test";
}

static void load_trace(struct kvr_sim_trace *t, const char *text)
{
    char err[256] = "";
    kvr_sim_trace_init(t);
    ck_assert_msg(kvr_sim_trace_parse(text, strlen(text), t, err, sizeof(err)) == KVR_OK, "%s",
                  err);
}

/* 2 workers, block size 4 = trace block (one block per id), cache 4 blocks, 1 slot, prefill
 * 1 ms per uncached token, no overhead, decode 1 ms per output token after the first.
 *
 *   req  t(ms)  in  out  ids      routed (policy above)                 hit  first  done  TTFT
 *   r0    0      8   1   [1,2]    w0 (nothing cached, tie)              0     8      8     8
 *   r1    1     12   1   [1,2,3]  w1 (w0 has 1 in flight)               0    13     13    12
 *   r2    2      8   1   [4,5]    w0 (1 vs 1 in flight: first); waits   0    16     16    14
 *                                 for w0's slot until 8
 *   r3   20     12   2   [1,2,6]  w0 (overlap 2 on both, tie)           2    24     25     4
 *                                 uncached 12 - 8 = 4 tokens
 *   r4   21      8   1   [4,5]    w0 (overlap 2); waits until 25        1    29     29     8
 *
 * w0's cache (MRU first): after r0 [1 2]; after r2 [4 5 1 2]; r3 starts at 20 and touches [1 2]
 * -> [1 2 4 5]; r3 stores [1 2 6] at 24 -> [1 2 6 4 5], 5 > 4 evicts 5 (a leaf): so r4, routed
 * at 21 with an overlap of 2, finds only [4] when it starts at 25 (hit 1, 4 tokens to compute)
 * and then stores [5] -> [4 5 1 2 6], evicting 6.
 * Totals: blocks 2+3+2+3+2 = 12, hits 0+0+0+2+1 = 3 -> hit ratio 0.25; routed overlap
 * 0+0+0+2+2 = 4; best (any earlier request): 0, 2 ([1,2] of r0), 0, 2, 2 = 6 -> 0.5.
 * Loads: w0 4 requests / 9 blocks, w1 1 / 3 -> imbalance 4 / 2.5 = 1.6.
 * TTFT sorted 4 8 8 12 14: p50 = 3rd = 8, p99 = 5th = 14; queue waits 0 0 6 0 4.
 * Events: w0 stored [1,2], [4,5], [6], removed [5], stored [5], removed [6]; w1 stored
 * [1,2,3]: 5 stored events / 9 blocks, 2 removed events / 2 blocks, no index error.
 * Makespan 29 ms: 5 / 0.029 requests per second. */
static const char tiny_trace[] =
    "{\"timestamp\": 0, \"input_length\": 8, \"output_length\": 1, \"hash_ids\": [1, 2]}\n"
    "{\"timestamp\": 1, \"input_length\": 12, \"output_length\": 1, \"hash_ids\": [1, 2, 3]}\n"
    "{\"timestamp\": 2, \"input_length\": 8, \"output_length\": 1, \"hash_ids\": [4, 5]}\n"
    "{\"timestamp\": 20, \"input_length\": 12, \"output_length\": 2, \"hash_ids\": [1, 2, 6]}\n"
    "{\"timestamp\": 21, \"input_length\": 8, \"output_length\": 1, \"hash_ids\": [4, 5]}\n";

static void tiny_config(struct kvr_sim_config *cfg)
{
    kvr_sim_config_init(cfg);
    cfg->workers = 2;
    cfg->block_size = 4;
    cfg->trace_block_tokens = 4;
    cfg->cache_blocks = 4;
    cfg->slots = 1;
    cfg->prefill_us_per_token = 1000;
    cfg->prefill_overhead_us = 0;
    cfg->decode_us_per_token = 1000;
    cfg->buckets = 3;
}

START_TEST(tiny_trace_by_hand)
{
    struct kvr_sim_config cfg;
    tiny_config(&cfg);
    struct kvr_sim_trace t;
    load_trace(&t, tiny_trace);
    struct kvr_sim_policy p;
    lua_policy(&p, "affinity", affinity_src);
    struct kvr_sim_result r;
    ck_assert_int_eq(kvr_sim_run(&cfg, &t, &p, &r), KVR_OK);
    ck_assert_msg(r.ok, "%s", r.error);
    ck_assert_uint_eq(r.requests, 5);
    ck_assert_uint_eq(r.completed, 5);
    ck_assert_uint_eq(r.blocks, 12);
    ck_assert_uint_eq(r.cached_blocks, 3);
    ck_assert(r.hit_ratio == 0.25);
    ck_assert_uint_eq(r.routed_overlap, 4);
    ck_assert_uint_eq(r.best_blocks, 6);
    ck_assert(r.best_hit_ratio == 0.5);
    ck_assert_uint_eq(r.workers[0].worker_id, 0);
    ck_assert_uint_eq(r.workers[0].requests, 4);
    ck_assert_uint_eq(r.workers[0].blocks, 9);
    ck_assert_uint_eq(r.workers[0].cached_blocks, 3);
    ck_assert_uint_eq(r.workers[0].prefill_tokens, 8 + 8 + 4 + 4);
    ck_assert_uint_eq(r.workers[1].requests, 1);
    ck_assert_uint_eq(r.workers[1].blocks, 3);
    ck_assert_uint_eq(r.workers[1].prefill_tokens, 12);
    ck_assert(fabs(r.imbalance - 1.6) < 1e-12);
    ck_assert_uint_eq(r.n_ttft, 5);
    uint64_t want_ttft[5] = {4000, 8000, 8000, 12000, 14000};
    for (int i = 0; i < 5; i++)
        ck_assert_uint_eq(r.ttft_us[i], want_ttft[i]);
    ck_assert(r.ttft_ms.p50 == 8.0 && r.ttft_ms.p99 == 14.0 && r.ttft_ms.max == 14.0);
    ck_assert(fabs(r.ttft_ms.mean - 9.2) < 1e-12);
    ck_assert(r.queue_ms.p99 == 6.0 && fabs(r.queue_ms.mean - 2.0) < 1e-12);
    ck_assert(r.e2e_ms.max == 14.0 && r.e2e_ms.p50 == 8.0); /* 8 12 14 5 8 */
    ck_assert(fabs(r.makespan_s - 0.029) < 1e-12);
    ck_assert(fabs(r.throughput_rps - 5 / 0.029) < 1e-9);
    ck_assert_uint_eq(r.index_stored_events, 5);
    ck_assert_uint_eq(r.index_stored_blocks, 9);
    ck_assert_uint_eq(r.index_removed_events, 2);
    ck_assert_uint_eq(r.index_removed_blocks, 2);
    ck_assert_uint_eq(r.index_errors, 0);
    ck_assert_uint_eq(r.policy.decisions, 5);
    ck_assert_uint_eq(r.policy.ok, 5);
    ck_assert_uint_eq(r.policy.fallbacks, 0);
    /* Buckets over [0, 21 ms] (window 21001 us, width 7001 us): r0-r2 in bucket 0, r3 and r4
     * in bucket 2. */
    ck_assert_uint_eq(r.bucket_blocks[0], 7);
    ck_assert_uint_eq(r.bucket_blocks[1], 0);
    ck_assert_uint_eq(r.bucket_blocks[2], 5);
    ck_assert_uint_eq(r.bucket_cached[2], 3);
    ck_assert_uint_eq(r.bucket_best[0], 2);
    ck_assert_uint_eq(r.bucket_best[2], 4);
    ck_assert_uint_eq(r.workers[0].max_inflight, 2);
    kvr_sim_result_free(&r);
    kvr_sim_trace_free(&t);
}
END_TEST

/* One worker, two requests at t = 0 of 10 tokens each (prefill 1 ms per token), outputs 5 and 1
 * (decode 1 ms per token after the first):
 *   2 slots, 1 prefill lane:  r0 prefills 0-10 (TTFT 10), r1 waits for the lane: 10-20 (20)
 *   2 slots, no lane limit:   both prefill 0-10 (10, 10)
 *   1 slot:                   r1 waits for r0's slot: r0 decodes 10-14, r1 prefills 14-24 (24)
 * With time scale 2 and r1 at 4 ms: arrival 8; one slot: r1 starts at 14 -> TTFT 16. */
START_TEST(scheduler_ttft_by_hand)
{
    static const char text[] =
        "{\"timestamp\": 0, \"input_length\": 10, \"output_length\": 5, \"hash_ids\": [1]}\n"
        "{\"timestamp\": 0, \"input_length\": 10, \"output_length\": 1, \"hash_ids\": [2]}\n";
    static const char later[] =
        "{\"timestamp\": 0, \"input_length\": 10, \"output_length\": 5, \"hash_ids\": [1]}\n"
        "{\"timestamp\": 4, \"input_length\": 10, \"output_length\": 1, \"hash_ids\": [2]}\n";
    static const struct {
        const char *trace;
        uint32_t slots, lanes;
        double scale;
        uint64_t ttft0, ttft1;
    } cases[] = {
        {text, 2, 1, 1, 10000, 20000},
        {text, 2, 0, 1, 10000, 10000},
        {text, 1, 1, 1, 10000, 24000},
        {later, 1, 1, 2, 10000, 16000},
    };
    struct kvr_sim_policy p;
    ck_assert_int_eq(kvr_sim_policy_resolve("round_robin", &p, &(char *){NULL}, NULL, 0), KVR_OK);
    for (size_t k = 0; k < sizeof(cases) / sizeof(cases[0]); k++) {
        struct kvr_sim_config cfg;
        kvr_sim_config_init(&cfg);
        cfg.workers = 1;
        cfg.block_size = 10;
        cfg.trace_block_tokens = 10;
        cfg.slots = cases[k].slots;
        cfg.prefill_lanes = cases[k].lanes;
        cfg.time_scale = cases[k].scale;
        cfg.prefill_us_per_token = 1000;
        cfg.prefill_overhead_us = 0;
        cfg.decode_us_per_token = 1000;
        struct kvr_sim_trace t;
        load_trace(&t, cases[k].trace);
        struct kvr_sim_result r;
        ck_assert_int_eq(kvr_sim_run(&cfg, &t, &p, &r), KVR_OK);
        ck_assert_msg(r.ok, "%s", r.error);
        uint64_t lo = cases[k].ttft0 < cases[k].ttft1 ? cases[k].ttft0 : cases[k].ttft1;
        uint64_t hi = cases[k].ttft0 < cases[k].ttft1 ? cases[k].ttft1 : cases[k].ttft0;
        ck_assert_msg(r.ttft_us[0] == lo && r.ttft_us[1] == hi, "case %zu: %llu %llu", k,
                      (unsigned long long)r.ttft_us[0], (unsigned long long)r.ttft_us[1]);
        kvr_sim_result_free(&r);
        kvr_sim_trace_free(&t);
    }
}
END_TEST

/* A hit is touched when its prefill starts, so a store by another request on the same worker
 * during that prefill cannot evict it. One worker, cache 3 blocks, 4 slots, no lane limit, block
 * size 4 = trace block, prefill 1 ms per uncached token:
 *   r0 t=0  [1]    4 tokens   prefill 0-4,   stores [1]            cache 1
 *   rA t=1  [7,8]  8 tokens   prefill 1-9,   stores [7,8]          cache 7 8 1
 *   r1 t=10 [1,2]  8 tokens   hit 1 (touched: 1 7 8), prefill 10-14
 *   rB t=11 [9]    1 token    prefill 11-12, stores [9]            9 1 7 8 -> evicts 8
 *   r1 at 14 stores [2] only (parent 1)                            1 2 9 7 -> evicts 7
 * 5 blocks stored in all (without the touch, rB would evict 1 and r1 would store 2 blocks). */
START_TEST(hits_are_touched_at_prefill_start)
{
    static const char text[] =
        "{\"timestamp\": 0, \"input_length\": 4, \"output_length\": 1, \"hash_ids\": [1]}\n"
        "{\"timestamp\": 1, \"input_length\": 8, \"output_length\": 1, \"hash_ids\": [7, 8]}\n"
        "{\"timestamp\": 10, \"input_length\": 8, \"output_length\": 1, \"hash_ids\": [1, 2]}\n"
        "{\"timestamp\": 11, \"input_length\": 1, \"output_length\": 1, \"hash_ids\": [9]}\n";
    struct kvr_sim_config cfg;
    tiny_config(&cfg);
    cfg.workers = 1;
    cfg.cache_blocks = 3;
    cfg.slots = 4;
    cfg.prefill_lanes = 0;
    struct kvr_sim_trace t;
    load_trace(&t, text);
    struct kvr_sim_policy p;
    lua_policy(&p, "affinity", affinity_src);
    struct kvr_sim_result r;
    ck_assert_int_eq(kvr_sim_run(&cfg, &t, &p, &r), KVR_OK);
    ck_assert_msg(r.ok, "%s", r.error);
    ck_assert_uint_eq(r.cached_blocks, 1);
    ck_assert_uint_eq(r.index_stored_blocks, 5);
    ck_assert_uint_eq(r.index_removed_blocks, 2);
    ck_assert_uint_eq(r.index_errors, 0);
    uint64_t want[4] = {1000, 4000, 4000, 8000}; /* rB 1, r0 4, r1 4, rA 8 */
    for (int i = 0; i < 4; i++)
        ck_assert_uint_eq(r.ttft_us[i], want[i]);
    kvr_sim_result_free(&r);
    kvr_sim_trace_free(&t);
}
END_TEST

/* A policy that raises on every even request of the simulation (it passes the install-time
 * checks: those run with another model name) and one that never installs: both reported, the
 * simulation still completes, the failing decisions are routed by the C fallback. */
START_TEST(policy_errors_are_reported)
{
    static const char flaky[] =
        "local function select(req, c)\n"
        "  if req.model == 'sim' and tonumber(req.id) % 2 == 0 then error('boom on ' .. req.id) "
        "end\n"
        "  return c[1]\n"
        "end\n"
        "return { select = select }\n";
    struct kvr_sim_config cfg;
    tiny_config(&cfg);
    struct kvr_sim_trace t;
    load_trace(&t, tiny_trace);
    struct kvr_sim_policy p;
    lua_policy(&p, "flaky", flaky);
    struct kvr_sim_result r;
    ck_assert_int_eq(kvr_sim_run(&cfg, &t, &p, &r), KVR_OK);
    ck_assert_msg(r.ok, "%s", r.error);
    ck_assert_uint_eq(r.completed, 5);
    ck_assert_uint_eq(r.policy.decisions, 5);
    ck_assert_uint_eq(r.policy.errors, 2); /* request ids 2 and 4 */
    ck_assert_uint_eq(r.policy.fallbacks, 2);
    ck_assert_uint_eq(r.policy.ok, 3);
    ck_assert_ptr_nonnull(strstr(r.policy.first_error, "request 2: errrun"));
    ck_assert_ptr_nonnull(strstr(r.policy.first_error, "boom on 2"));
    kvr_sim_result_free(&r);

    lua_policy(&p, "broken", "return { select = 42 }");
    ck_assert_int_eq(kvr_sim_run(&cfg, &t, &p, &r), KVR_OK);
    ck_assert_int_eq(r.ok, 0);
    ck_assert_str_ne(r.error, "");
    kvr_sim_result_free(&r);

    lua_policy(&p, "syntax", "local function (");
    ck_assert_int_eq(kvr_sim_run(&cfg, &t, &p, &r), KVR_OK);
    ck_assert_int_eq(r.ok, 0);
    ck_assert_ptr_nonnull(strstr(r.error, "syntax.lua:1:"));
    kvr_sim_result_free(&r);

    /* A runaway loop at decision time is stopped by the time budget and falls back. */
    static const char runaway[] = "local function select(req, c)\n"
                                  "  if req.model == 'sim' then while true do end end\n"
                                  "  return c[1]\n"
                                  "end\n"
                                  "return { select = select }\n";
    lua_policy(&p, "runaway", runaway);
    cfg.budget_ns = 2000000; /* 2 ms */
    ck_assert_int_eq(kvr_sim_run(&cfg, &t, &p, &r), KVR_OK);
    ck_assert_msg(r.ok, "%s", r.error);
    ck_assert_uint_eq(r.policy.timeouts, 5);
    ck_assert_uint_eq(r.policy.fallbacks, 5);
    ck_assert_uint_eq(r.completed, 5);
    kvr_sim_result_free(&r);
    kvr_sim_trace_free(&t);
}
END_TEST

/* The C fallback ("builtin") and the shipped kv_cost make the same decisions (kv_cost at T = 0
 * is bit-identical to the fallback), so their figures are equal; a bad configuration is
 * refused with a message. */
START_TEST(builtin_equals_kv_cost)
{
    struct kvr_sim_config cfg;
    kvr_sim_config_init(&cfg);
    cfg.limit = 300;
    cfg.cache_blocks = 256;
    struct kvr_sim_trace t;
    kvr_sim_trace_init(&t);
    char err[256];
    ck_assert_int_eq(kvr_sim_trace_load(KVR_SOURCE_DIR
                                        "/data/traces/mooncake_fast25_conversation_trace.jsonl.gz",
                                        &t, err, sizeof(err)),
                     KVR_OK);
    struct kvr_sim_policy a, b;
    char *owned = NULL;
    ck_assert_int_eq(kvr_sim_policy_resolve("builtin", &a, &owned, err, sizeof(err)), KVR_OK);
    ck_assert_int_eq(kvr_sim_policy_resolve("kv_cost", &b, &owned, err, sizeof(err)), KVR_OK);
    struct kvr_sim_result ra, rb;
    ck_assert_int_eq(kvr_sim_run(&cfg, &t, &a, &ra), KVR_OK);
    ck_assert_int_eq(kvr_sim_run(&cfg, &t, &b, &rb), KVR_OK);
    ck_assert(ra.ok && rb.ok);
    ck_assert_uint_eq(ra.requests, 300);
    ck_assert_uint_eq(ra.cached_blocks, rb.cached_blocks);
    ck_assert_uint_eq(ra.policy.fallbacks, 0);
    ck_assert_uint_eq(rb.policy.ok, 300);
    for (uint32_t w = 0; w < cfg.workers; w++)
        ck_assert_uint_eq(ra.workers[w].requests, rb.workers[w].requests);
    ck_assert_int_eq(memcmp(ra.ttft_us, rb.ttft_us, ra.n_ttft * sizeof(uint64_t)), 0);
    kvr_sim_result_free(&ra);
    kvr_sim_result_free(&rb);
    cfg.block_size = 300; /* does not divide 512 */
    ck_assert_int_eq(kvr_sim_run(&cfg, &t, &a, &ra), KVR_EINVAL);
    ck_assert_ptr_nonnull(strstr(ra.error, "block size 300"));
    kvr_sim_result_free(&ra);
    kvr_sim_trace_free(&t);
}
END_TEST

/* Expanding 512-token ids into 32 blocks of 16 keeps the decisions of a prefix-affinity policy
 * and multiplies every block count by 32 when the cache is scaled alike (the cache then holds
 * exactly the same ids), so the hit ratio is unchanged. */
START_TEST(expansion_scales_blocks)
{
    struct kvr_sim_config cfg;
    kvr_sim_config_init(&cfg);
    cfg.limit = 400;
    cfg.cache_blocks = 128;
    struct kvr_sim_trace t;
    kvr_sim_trace_init(&t);
    char err[256];
    ck_assert_int_eq(kvr_sim_trace_load(KVR_SOURCE_DIR
                                        "/data/traces/mooncake_fast25_conversation_trace.jsonl.gz",
                                        &t, err, sizeof(err)),
                     KVR_OK);
    struct kvr_sim_policy p;
    lua_policy(&p, "affinity", affinity_src);
    struct kvr_sim_result a, b;
    ck_assert_int_eq(kvr_sim_run(&cfg, &t, &p, &a), KVR_OK);
    cfg.block_size = 16;
    cfg.cache_blocks = 128 * 32;
    ck_assert_int_eq(kvr_sim_run(&cfg, &t, &p, &b), KVR_OK);
    ck_assert(a.ok && b.ok);
    ck_assert_uint_eq(b.blocks, 32 * a.blocks);
    ck_assert_uint_eq(b.cached_blocks, 32 * a.cached_blocks);
    ck_assert_uint_eq(b.best_blocks, 32 * a.best_blocks);
    ck_assert(a.hit_ratio == b.hit_ratio);
    ck_assert_uint_eq(b.index_errors, 0);
    kvr_sim_result_free(&a);
    kvr_sim_result_free(&b);
    kvr_sim_trace_free(&t);
}
END_TEST

Suite *sim_run_suite(void)
{
    Suite *s = suite_create("sim_run");
    TCase *api = tcase_create("api");
    tcase_set_timeout(api, 120);
    tcase_add_test(api, tiny_trace_by_hand);
    tcase_add_test(api, scheduler_ttft_by_hand);
    tcase_add_test(api, hits_are_touched_at_prefill_start);
    tcase_add_test(api, builtin_equals_kv_cost);
    tcase_add_test(api, expansion_scales_blocks);
    suite_add_tcase(s, api);
    TCase *edge = tcase_create("edge");
    tcase_set_timeout(edge, 120);
    tcase_add_test(edge, policy_errors_are_reported);
    suite_add_tcase(s, edge);
    return s;
}
