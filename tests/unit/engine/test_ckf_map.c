/* test_ckf_map.c - the CKF's internal u64 map (engine/src/ckf_map.c) against a direct model.
 * SPDX-License-Identifier: Apache-2.0 */
#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "ckf_map.h" /* internal header: engine/src is on this suite's include path */
#include "kvr/err.h"
#include "kvr_test.h"

Suite *ckf_map_suite(void);

enum { UNIVERSE = 2000 };

/* keys are i * 100 (structured, like Dynamo's fixtures) plus a few extremes */
static uint64_t key_of(uint64_t i)
{
    if (i == 0)
        return 0;
    if (i == 1)
        return UINT64_MAX;
    return i * 100;
}

static void check_model(const struct ckf_map *m, const uint64_t *val, const unsigned char *has,
                        uint64_t seed)
{
    size_t n = 0;
    for (uint64_t i = 0; i < UNIVERSE; i++) {
        uint64_t v = 0;
        int got = ckf_map_get(m, key_of(i), &v);
        ck_assert_msg(got == has[i], "seed %llu key %llu presence", (unsigned long long)seed,
                      (unsigned long long)key_of(i));
        if (got)
            ck_assert_uint_eq(v, val[i]);
        n += has[i];
    }
    ck_assert_uint_eq(m->n, n);
    size_t pos = 0, seen = 0;
    uint64_t k, v;
    while (ckf_map_next(m, &pos, &k, &v))
        seen++;
    ck_assert_uint_eq(seen, n);
}

START_TEST(test_random_vs_model)
{
    uint64_t seed = kvr_test_seed(123);
    struct kvr_test_rng r = {seed};
    kvr_alloc_t a;
    kvr_alloc_init(&a);
    struct ckf_map m;
    ckf_map_init(&m, &a);
    static uint64_t val[UNIVERSE];
    static unsigned char has[UNIVERSE];
    memset(has, 0, sizeof(has));
    for (int op = 0; op < 200000; op++) {
        uint64_t i = kvr_test_below(&r, UNIVERSE);
        if (kvr_test_below(&r, 5) < 3) {
            uint64_t v = kvr_test_next(&r);
            ck_assert_int_eq(ckf_map_put(&m, key_of(i), v), KVR_OK);
            val[i] = v;
            has[i] = 1;
        } else {
            uint64_t v = 0;
            ck_assert_int_eq(ckf_map_del(&m, key_of(i), &v), has[i]);
            if (has[i])
                ck_assert_uint_eq(v, val[i]);
            has[i] = 0;
        }
        if (op % 10000 == 0)
            check_model(&m, val, has, seed);
    }
    check_model(&m, val, has, seed);
    ck_assert_uint_gt(ckf_map_bytes(&m), 0);
    ckf_map_clear(&m);
    memset(has, 0, sizeof(has));
    check_model(&m, val, has, seed);
    ckf_map_free(&m);
    ck_assert_uint_eq(a.live_bytes, 0);
}
END_TEST

START_TEST(test_oom)
{
    kvr_alloc_t a;
    kvr_alloc_init(&a);
    struct ckf_map m;
    ckf_map_init(&m, &a);
    for (uint64_t i = 0; i < 100; i++)
        ck_assert_int_eq(ckf_map_put(&m, i, i + 1), KVR_OK);
    kvr_alloc_fail_after(&a, 1);
    int failed = 0;
    for (uint64_t i = 100; i < 1000 && !failed; i++) {
        int rc = ckf_map_put(&m, i, i + 1);
        if (rc == KVR_ENOMEM) {
            failed = 1;
            ck_assert_int_eq(ckf_map_get(&m, i, NULL), 0); /* unchanged */
            ck_assert_uint_eq(m.n, i);
        }
    }
    ck_assert(failed);
    for (uint64_t i = 0; i < 100; i++) {
        uint64_t v;
        ck_assert(ckf_map_get(&m, i, &v) && v == i + 1);
    }
    ckf_map_free(&m);
    ck_assert_uint_eq(a.live_bytes, 0);
}
END_TEST

Suite *ckf_map_suite(void)
{
    Suite *s = suite_create("ckf_map");
    TCase *oracle = tcase_create("oracle");
    tcase_add_test(oracle, test_random_vs_model);
    suite_add_tcase(s, oracle);
    TCase *oom = tcase_create("oom");
    tcase_add_test(oom, test_oom);
    suite_add_tcase(s, oom);
    return s;
}
