/* test_pooled.c - the pooled-cache reference on a hand-computed trace.
 * SPDX-License-Identifier: Apache-2.0 */
#include <check.h>
#include <string.h>

#include "kvr/err.h"
#include "kvr/sim.h"

Suite *sim_pooled_suite(void);

/* One LRU of 2 workers x 2 blocks = 4 blocks, every request stored on arrival (MRU first):
 *   [1,2]    hit 0   1 2
 *   [1,2,3]  hit 2   1 2 3
 *   [4,5]    hit 0   4 5 1 2 3 -> evict 3
 *   [1,2,6]  hit 2   1 2 6 4 5 -> evict 5
 *   [4,5]    hit 1   (4 only)
 * 5 of 12 blocks. With room for everything: 0 + 2 + 0 + 2 + 2 = 6 (the best achievable). */
START_TEST(pooled_by_hand)
{
    static const char text[] =
        "{\"timestamp\": 0, \"input_length\": 8, \"output_length\": 1, \"hash_ids\": [1, 2]}\n"
        "{\"timestamp\": 1, \"input_length\": 12, \"output_length\": 1, \"hash_ids\": [1, 2, 3]}\n"
        "{\"timestamp\": 2, \"input_length\": 8, \"output_length\": 1, \"hash_ids\": [4, 5]}\n"
        "{\"timestamp\": 20, \"input_length\": 12, \"output_length\": 2, \"hash_ids\": [1, 2, "
        "6]}\n"
        "{\"timestamp\": 21, \"input_length\": 8, \"output_length\": 1, \"hash_ids\": [4, 5]}\n";
    struct kvr_sim_trace t;
    kvr_sim_trace_init(&t);
    ck_assert_int_eq(kvr_sim_trace_parse(text, strlen(text), &t, NULL, 0), KVR_OK);
    struct kvr_sim_config cfg;
    kvr_sim_config_init(&cfg);
    cfg.workers = 2;
    cfg.cache_blocks = 2;
    cfg.block_size = 4;
    cfg.trace_block_tokens = 4;
    double r = -1;
    ck_assert_int_eq(kvr_sim_pooled_hit_ratio(&cfg, &t, &r), KVR_OK);
    ck_assert(r == 5.0 / 12.0);
    cfg.cache_blocks = 100;
    ck_assert_int_eq(kvr_sim_pooled_hit_ratio(&cfg, &t, &r), KVR_OK);
    ck_assert(r == 6.0 / 12.0);
    cfg.limit = 2; /* [1,2] then [1,2,3]: 2 of 5 */
    ck_assert_int_eq(kvr_sim_pooled_hit_ratio(&cfg, &t, &r), KVR_OK);
    ck_assert(r == 2.0 / 5.0);
    cfg.block_size = 3;
    ck_assert_int_eq(kvr_sim_pooled_hit_ratio(&cfg, &t, &r), KVR_EINVAL);
    kvr_sim_trace_free(&t);
}
END_TEST

Suite *sim_pooled_suite(void)
{
    Suite *s = suite_create("sim_pooled");
    TCase *api = tcase_create("api");
    tcase_add_test(api, pooled_by_hand);
    suite_add_tcase(s, api);
    return s;
}
