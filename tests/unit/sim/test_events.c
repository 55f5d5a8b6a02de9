/* test_events.c - the --events mode on the committed op streams (tests/data/opstream/).
 * SPDX-License-Identifier: Apache-2.0 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "events.h"
#include "kvr/err.h"

Suite *sim_events_suite(void);

/* The longest overlap, ties to the first candidate: on a stream it takes exactly the oracle. */
static const char longest_src[] = "local function select(req, c)\n"
                                  "  local best = c[1]\n"
                                  "  for i = 2, #c do if c[i].overlap > best.overlap then best "
                                  "= c[i] end end\n"
                                  "  return best\n"
                                  "end\n"
                                  "return { select = select }\n";

static void load(const char *file, struct kvr_opstream *ops)
{
    char path[1024], err[512] = "";
    const char *dir = getenv("KVR_TEST_DATA");
    snprintf(path, sizeof(path), "%s/opstream/%s", dir ? dir : "tests/data", file);
    kvr_opstream_init(ops);
    ck_assert_msg(kvr_opstream_load(path, ops, err, sizeof(err)) == KVR_OK, "%s", err);
}

static void run(const char *file, const char *policy_src, const char *shipped,
                struct kvr_sim_result *r)
{
    struct kvr_opstream ops;
    load(file, &ops);
    uint64_t *wids = NULL;
    size_t nw = 0;
    ck_assert_int_eq(kvr_sim_events_workers(&ops, &wids, &nw), KVR_OK);
    ck_assert_uint_eq(nw, 4);
    for (size_t k = 0; k < nw; k++)
        ck_assert_uint_eq(wids[k], k);
    struct kvr_sim_config cfg;
    kvr_sim_config_init(&cfg);
    cfg.block_size = 16;
    cfg.inflight = 4;
    cfg.buckets = 4;
    struct kvr_sim_policy p;
    char *owned = NULL;
    if (shipped != NULL) {
        ck_assert_int_eq(kvr_sim_policy_resolve(shipped, &p, &owned, NULL, 0), KVR_OK);
    } else {
        memset(&p, 0, sizeof(p));
        snprintf(p.name, sizeof(p.name), "longest");
        p.kind = KVR_SIM_POLICY_LUA;
        p.src = policy_src;
        p.len = strlen(policy_src);
        p.origin = "test";
    }
    ck_assert_int_eq(kvr_sim_events_run(&cfg, &ops, &p, wids, nw, r), KVR_OK);
    ck_assert_msg(r->ok, "%s", r->error);
    free(wids);
    kvr_opstream_free(&ops);
}

/* Query totals and oracles computed from the files (Python over the "match"/"expect" lines):
 * arxiv20_w4: 20 queries, 514 blocks, Σ max expect 65; conv16_w4_cap24: 16, 477, 15. The
 * longest-overlap policy reaches the oracle exactly; the index agrees with every expectation. */
START_TEST(oracle_policy_takes_the_oracle)
{
    struct kvr_sim_result r;
    run("arxiv20_w4.jsonl", longest_src, NULL, &r);
    ck_assert_uint_eq(r.requests, 20);
    ck_assert_uint_eq(r.blocks, 514);
    ck_assert_uint_eq(r.oracle_blocks, 65);
    ck_assert_uint_eq(r.cached_blocks, 65);
    ck_assert_uint_eq(r.expect_mismatches, 0);
    ck_assert_uint_eq(r.index_errors, 0);
    ck_assert_uint_eq(r.best_blocks, 65); /* equal to the infinite-cache prefix here */
    ck_assert_uint_eq(r.index_stored_events, 20);
    ck_assert_uint_eq(r.index_stored_blocks, 464);
    uint64_t sum = 0;
    for (uint32_t w = 0; w < r.n_workers; w++)
        sum += r.workers[w].requests;
    ck_assert_uint_eq(sum, 20);
    kvr_sim_result_free(&r);

    run("conv16_w4_cap24.jsonl", longest_src, NULL, &r);
    ck_assert_uint_eq(r.requests, 16);
    ck_assert_uint_eq(r.blocks, 477);
    ck_assert_uint_eq(r.oracle_blocks, 15);
    ck_assert_uint_eq(r.cached_blocks, 15);
    ck_assert_uint_eq(r.expect_mismatches, 0);
    ck_assert_uint_eq(r.index_removed_events, 11);
    ck_assert_uint_eq(r.index_removed_blocks, 381);
    ck_assert_uint_eq(r.index_errors, 0);
    kvr_sim_result_free(&r);
}
END_TEST

/* round_robin spreads the 20 queries 5/5/5/5 (imbalance 1) and cannot beat the oracle;
 * a wrong expectation is counted, not fatal. */
START_TEST(shipped_policy_and_mismatch)
{
    struct kvr_sim_result r;
    run("arxiv20_w4.jsonl", NULL, "round_robin", &r);
    for (uint32_t w = 0; w < 4; w++)
        ck_assert_uint_eq(r.workers[w].requests, 5);
    ck_assert(r.imbalance == 1.0);
    ck_assert_uint_le(r.cached_blocks, r.oracle_blocks);
    ck_assert_uint_eq(r.policy.ok, 20);
    kvr_sim_result_free(&r);

    struct kvr_opstream ops;
    load("wrong_expect.jsonl", &ops);
    uint64_t wid[2] = {0, 1};
    struct kvr_sim_config cfg;
    kvr_sim_config_init(&cfg);
    cfg.block_size = 16;
    struct kvr_sim_policy p;
    char *owned = NULL;
    ck_assert_int_eq(kvr_sim_policy_resolve("kv_cost", &p, &owned, NULL, 0), KVR_OK);
    ck_assert_int_eq(kvr_sim_events_run(&cfg, &ops, &p, wid, 2, &r), KVR_OK);
    ck_assert(r.ok);
    ck_assert_uint_eq(r.expect_mismatches, 1);
    kvr_sim_result_free(&r);
    kvr_opstream_free(&ops);
}
END_TEST

Suite *sim_events_suite(void)
{
    Suite *s = suite_create("sim_events");
    TCase *api = tcase_create("api");
    tcase_set_timeout(api, 120);
    tcase_add_test(api, oracle_policy_takes_the_oracle);
    tcase_add_test(api, shipped_policy_and_mismatch);
    suite_add_tcase(s, api);
    return s;
}
