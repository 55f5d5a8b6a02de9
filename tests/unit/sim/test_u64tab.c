/* test_u64tab.c - the simulator's u64 -> u32 table against a plain array model.
 * SPDX-License-Identifier: Apache-2.0 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>

#include "kvr/err.h"
#include "kvr_test.h"
#include "u64tab.h"

Suite *sim_u64tab_suite(void);

START_TEST(put_get_del)
{
    struct kvr_sim_u64tab t;
    kvr_sim_u64tab_init(&t);
    uint32_t v = 99;
    ck_assert_int_eq(kvr_sim_u64tab_get(&t, 0, &v), 0);
    ck_assert_int_eq(kvr_sim_u64tab_del(&t, 0), 0);
    ck_assert_int_eq(kvr_sim_u64tab_put(&t, 0, 7), KVR_OK); /* key 0 is an ordinary key */
    ck_assert_int_eq(kvr_sim_u64tab_put(&t, UINT64_MAX, 0), KVR_OK);
    ck_assert_int_eq(kvr_sim_u64tab_put(&t, 5, UINT32_MAX), KVR_EINVAL);
    ck_assert_int_eq(kvr_sim_u64tab_get(&t, 0, &v), 1);
    ck_assert_uint_eq(v, 7);
    ck_assert_int_eq(kvr_sim_u64tab_get(&t, UINT64_MAX, &v), 1);
    ck_assert_uint_eq(v, 0);
    ck_assert_int_eq(kvr_sim_u64tab_put(&t, 0, 8), KVR_OK); /* overwrite */
    ck_assert_int_eq(kvr_sim_u64tab_get(&t, 0, &v), 1);
    ck_assert_uint_eq(v, 8);
    ck_assert_uint_eq(t.n, 2);
    ck_assert_int_eq(kvr_sim_u64tab_del(&t, 0), 1);
    ck_assert_int_eq(kvr_sim_u64tab_get(&t, 0, NULL), 0);
    ck_assert_uint_eq(t.n, 1);
    kvr_sim_u64tab_clear(&t);
    ck_assert_int_eq(kvr_sim_u64tab_get(&t, UINT64_MAX, NULL), 0);
    kvr_sim_u64tab_free(&t);
}
END_TEST

/* Random churn over a small key space (long probe runs, wrap-around, backward shifts) against a
 * direct-mapped model. */
START_TEST(oracle_churn)
{
    uint64_t seed = kvr_test_seed(42);
    struct kvr_test_rng r = {seed};
    enum { KEYS = 3000 };
    static uint32_t model[KEYS]; /* value + 1, 0 = absent */
    for (int i = 0; i < KEYS; i++)
        model[i] = 0;
    struct kvr_sim_u64tab t;
    kvr_sim_u64tab_init(&t);
    size_t n = 0;
    for (int step = 0; step < 200000; step++) {
        uint64_t k = kvr_test_below(&r, KEYS);
        uint64_t key = k * 0x100000001ull; /* spread, includes 0 */
        uint64_t op = kvr_test_below(&r, 3);
        /* Check's assertions are costly (each records a mark point): test, then fail. */
        if (op < 2) {
            uint32_t v = (uint32_t)kvr_test_below(&r, 1000000);
            if (kvr_sim_u64tab_put(&t, key, v) != KVR_OK)
                ck_abort_msg("seed %llu step %d: put failed", (unsigned long long)seed, step);
            n += model[k] == 0;
            model[k] = v + 1;
        } else {
            int had = kvr_sim_u64tab_del(&t, key);
            if (had != (model[k] != 0))
                ck_abort_msg("seed %llu step %d: del answered %d", (unsigned long long)seed, step,
                             had);
            n -= model[k] != 0;
            model[k] = 0;
        }
        if (t.n != n)
            ck_abort_msg("seed %llu step %d: %zu keys, expected %zu", (unsigned long long)seed,
                         step, t.n, n);
        if (step % 997 == 0)
            for (int j = 0; j < KEYS; j++) {
                uint32_t v = 0;
                int got = kvr_sim_u64tab_get(&t, (uint64_t)j * 0x100000001ull, &v);
                if (got != (model[j] != 0) || (got && v + 1 != model[j]))
                    ck_abort_msg("seed %llu step %d key %d: got %d/%u", (unsigned long long)seed,
                                 step, j, got, v);
            }
    }
    kvr_sim_u64tab_free(&t);
}
END_TEST

Suite *sim_u64tab_suite(void)
{
    Suite *s = suite_create("sim_u64tab");
    TCase *api = tcase_create("api");
    tcase_add_test(api, put_get_del);
    suite_add_tcase(s, api);
    TCase *oracle = tcase_create("oracle");
    tcase_set_timeout(oracle, 60);
    tcase_add_test(oracle, oracle_churn);
    suite_add_tcase(s, oracle);
    return s;
}
