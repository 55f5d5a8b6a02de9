/* test_u64map.c - Check suite for engine/src/u64map.c (internal u64 -> u64 map).
 * SPDX-License-Identifier: Apache-2.0 */
#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "kvr/err.h"
#include "u64map.h"

Suite *u64map_suite(void);

START_TEST(random_against_array)
{
    const char *env = getenv("KVR_TEST_SEED");
    unsigned seed = env ? (unsigned)strtoul(env, NULL, 10) : 1234u;
    srand(seed);
    enum { U = 600 };
    static uint64_t model[U];
    static int present[U];
    memset(present, 0, sizeof(present));
    kvr_alloc_t a;
    kvr_alloc_init(&a);
    struct kvr_u64map m;
    kvr_u64map_init(&m, &a);
    size_t n = 0;
    for (int step = 0; step < 200000; step++) {
        int k = rand() % U;
        /* Keys collide on purpose: small multiples spread over few home slots; key 0 included. */
        uint64_t key = (uint64_t)k * 1024u;
        if (rand() % 3) {
            uint64_t v = (uint64_t)rand();
            ck_assert_int_eq(kvr_u64map_put(&m, key, v), KVR_OK);
            n += !present[k];
            present[k] = 1;
            model[k] = v;
        } else {
            ck_assert_int_eq(kvr_u64map_del(&m, key), present[k]);
            n -= (size_t)present[k];
            present[k] = 0;
        }
        if (step % 97 == 0)
            for (int j = 0; j < U; j++) {
                uint64_t *v = kvr_u64map_get(&m, (uint64_t)j * 1024u);
                ck_assert_msg((v != NULL) == present[j], "seed %u step %d key %d", seed, step, j);
                if (v)
                    ck_assert_uint_eq(*v, model[j]);
            }
        ck_assert_uint_eq(kvr_u64map_size(&m), n);
    }
    size_t pos = 0, seen = 0;
    uint64_t k, v;
    while (kvr_u64map_next(&m, &pos, &k, &v)) {
        ck_assert_uint_eq(k % 1024u, 0);
        ck_assert_int_eq(present[k / 1024u], 1);
        ck_assert_uint_eq(model[k / 1024u], v);
        seen++;
    }
    ck_assert_uint_eq(seen, n);
    kvr_u64map_destroy(&m);
    ck_assert_uint_eq(a.live_bytes, 0);
}
END_TEST

START_TEST(oom_keeps_map)
{
    kvr_alloc_t a;
    kvr_alloc_init(&a);
    struct kvr_u64map m;
    kvr_u64map_init(&m, &a);
    for (uint64_t i = 1; i <= 12; i++)
        ck_assert_int_eq(kvr_u64map_put(&m, i, i), KVR_OK);
    kvr_alloc_fail_after(&a, 1);
    ck_assert_int_eq(kvr_u64map_put(&m, 13, 13), KVR_ENOMEM); /* growth 16 -> 32 fails */
    kvr_alloc_fail_after(&a, 0);
    ck_assert_uint_eq(kvr_u64map_size(&m), 12);
    for (uint64_t i = 1; i <= 12; i++)
        ck_assert_uint_eq(*kvr_u64map_get(&m, i), i);
    ck_assert_ptr_null(kvr_u64map_get(&m, 13));
    kvr_u64map_destroy(&m);
}
END_TEST

Suite *u64map_suite(void)
{
    Suite *s = suite_create("u64map");
    TCase *tc = tcase_create("oracle");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, random_against_array);
    suite_add_tcase(s, tc);
    TCase *oom = tcase_create("oom");
    tcase_add_test(oom, oom_keeps_map);
    suite_add_tcase(s, oom);
    return s;
}
