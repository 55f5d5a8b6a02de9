/* test_fallback.c - Check suite for lua/src/fallback.c (the built-in classic KV cost).
 * SPDX-License-Identifier: Apache-2.0 */
#include <check.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kvr/err.h"
#include "kvr/fallback.h"

Suite *fallback_suite(void);

static struct kvr_ffi_request mkreq(uint32_t tokens, uint32_t bs)
{
    struct kvr_ffi_request r;
    memset(&r, 0, sizeof(r));
    r.tokens = tokens;
    r.block_size = bs;
    r.blocks = tokens / bs;
    r.overlap_weight = -1;
    r.temperature = -1;
    return r;
}

START_TEST(worked_example)
{
    /* scheduling.md §3: ISL 100, block size 16, weight 1: A 3.25, B 6.25 (+ decode blocks). */
    struct kvr_fallback_params p;
    kvr_fallback_params_init(&p);
    struct kvr_ffi_request r = mkreq(100, 16);
    struct kvr_ffi_candidate c[2];
    memset(c, 0, sizeof(c));
    c[0].overlap = 3;
    ck_assert(kvr_fallback_cost(&p, &r, &c[0]) == 3.25);
    ck_assert(kvr_fallback_cost(&p, &r, &c[1]) == 6.25);
    uint32_t ranked[2];
    size_t n = 0;
    ck_assert_int_eq(kvr_fallback_select(&p, &r, c, 2, NULL, ranked, 1, &n), KVR_OK);
    ck_assert_uint_eq(n, 1);
    ck_assert_uint_eq(ranked[0], 0);
    c[0].decode_blocks = 3; /* exactly 3 higher: a tie -> the lower index */
    ck_assert_int_eq(kvr_fallback_select(&p, &r, c, 2, NULL, ranked, 1, &n), KVR_OK);
    ck_assert_uint_eq(ranked[0], 0);
    c[1].tree_blocks = 0;
    c[0].tree_blocks = 5; /* tie broken by the smaller tree */
    ck_assert_int_eq(kvr_fallback_select(&p, &r, c, 2, NULL, ranked, 1, &n), KVR_OK);
    ck_assert_uint_eq(ranked[0], 1);
    c[0].decode_blocks = 4;
    c[0].tree_blocks = 0;
    ck_assert_int_eq(kvr_fallback_select(&p, &r, c, 2, NULL, ranked, 2, &n), KVR_OK);
    ck_assert_uint_eq(n, 2);
    ck_assert_uint_eq(ranked[0], 1);
    ck_assert_uint_eq(ranked[1], 0);
}
END_TEST

START_TEST(prefill_and_new_blocks)
{
    struct kvr_fallback_params p = {.overlap_weight = 2.0, .temperature = 0};
    struct kvr_ffi_request r = mkreq(64, 16);
    struct kvr_ffi_candidate c;
    memset(&c, 0, sizeof(c));
    c.overlap = 10; /* more than the request: prefill clamps at 0 */
    c.prefill_tokens = 32;
    c.new_blocks = 1;
    c.decode_blocks = 7;
    ck_assert(kvr_fallback_cost(&p, &r, &c) == 2.0 * (32.0 / 16.0) + 8.0);
    r.overlap_weight = 0; /* per-request override: pure load */
    ck_assert(kvr_fallback_cost(&p, &r, &c) == 8.0);
}
END_TEST

START_TEST(softmax_example)
{
    /* scheduling.md §5: costs [3.25, 6.25, 4.0], T = 0.5, u = 0.6 picks index 1; cumsum
     * [0.574097, 0.651793, 1.0]. */
    const double costs[] = {3.25, 6.25, 4.0};
    ck_assert_uint_eq(kvr_fallback_softmax_pick(costs, 3, 0.5, 0.6), 1);
    ck_assert_uint_eq(kvr_fallback_softmax_pick(costs, 3, 0.5, 0.574), 0);
    ck_assert_uint_eq(kvr_fallback_softmax_pick(costs, 3, 0.5, 0.5742), 1);
    ck_assert_uint_eq(kvr_fallback_softmax_pick(costs, 3, 0.5, 0.6518), 2);
    ck_assert_uint_eq(kvr_fallback_softmax_pick(costs, 3, 0.5, 0.999999), 2);
    /* T = 0.1 -> [0.9241, 0.0000, 0.0759] */
    ck_assert_uint_eq(kvr_fallback_softmax_pick(costs, 3, 0.1, 0.924), 0);
    ck_assert_uint_eq(kvr_fallback_softmax_pick(costs, 3, 0.1, 0.9242), 2);
    /* Equal costs: uniform by u. */
    const double flat[] = {1, 1, 1, 1};
    ck_assert_uint_eq(kvr_fallback_softmax_pick(flat, 4, 1.0, 0.0), 0);
    ck_assert_uint_eq(kvr_fallback_softmax_pick(flat, 4, 1.0, 0.26), 1);
    ck_assert_uint_eq(kvr_fallback_softmax_pick(flat, 4, 1.0, 0.99), 3);
    /* An infinite range is rescaled first, never NaN. */
    const double wide[] = {-1e308, 1e308};
    size_t i = kvr_fallback_softmax_pick(wide, 2, 1.0, 0.5);
    ck_assert_uint_eq(i, 0);
}
END_TEST

START_TEST(softmax_distribution)
{
    /* T = 1 -> p = [0.4658, 0.1714, 0.3628]: sample and compare frequencies. */
    struct kvr_fallback_params p = {.overlap_weight = 1, .temperature = 1.0};
    struct kvr_ffi_request r = mkreq(100, 16);
    struct kvr_ffi_candidate c[3];
    memset(c, 0, sizeof(c));
    c[0].overlap = 3; /* 3.25 */
    c[2].overlap = 3; /* 3.25 + 0.75 */
    c[2].decode_blocks = 0;
    c[2].prefill_tokens = 12;
    struct kvr_fallback_rng rng = {.state = 42};
    int hits[3] = {0, 0, 0};
    const int N = 200000;
    for (int k = 0; k < N; k++) {
        uint32_t ranked[3];
        size_t n;
        ck_assert_int_eq(kvr_fallback_select(&p, &r, c, 3, &rng, ranked, 3, &n), KVR_OK);
        ck_assert_uint_eq(n, 3);
        hits[ranked[0]]++;
        ck_assert_uint_ne(ranked[1], ranked[0]);
        ck_assert_uint_ne(ranked[2], ranked[0]);
    }
    ck_assert(fabs(hits[0] / (double)N - 0.4658) < 0.01);
    ck_assert(fabs(hits[1] / (double)N - 0.1714) < 0.01);
    ck_assert(fabs(hits[2] / (double)N - 0.3628) < 0.01);
}
END_TEST

START_TEST(ranked_large_and_errors)
{
    struct kvr_fallback_params p;
    kvr_fallback_params_init(&p);
    struct kvr_ffi_request r = mkreq(1000, 16);
    size_t n = 3000; /* above the stack ranking size */
    struct kvr_ffi_candidate *c = calloc(n, sizeof(*c));
    for (size_t i = 0; i < n; i++)
        c[i].decode_blocks = (uint32_t)((i * 7919u) % 1000u);
    uint32_t *ranked = calloc(n, sizeof(*ranked));
    size_t got = 0;
    ck_assert_int_eq(kvr_fallback_select(&p, &r, c, n, NULL, ranked, n, &got), KVR_OK);
    ck_assert_uint_eq(got, n);
    for (size_t i = 1; i < n; i++)
        ck_assert_uint_le(c[ranked[i - 1]].decode_blocks, c[ranked[i]].decode_blocks);
    ck_assert_int_eq(kvr_fallback_select(&p, &r, c, 0, NULL, ranked, 1, &got), KVR_EINVAL);
    ck_assert_int_eq(kvr_fallback_select(&p, &r, c, n, NULL, ranked, 0, &got), KVR_EINVAL);
    r.block_size = 0;
    ck_assert_int_eq(kvr_fallback_select(&p, &r, c, n, NULL, ranked, 1, &got), KVR_EINVAL);
    free(c);
    free(ranked);
}
END_TEST

START_TEST(rng_uniform_range)
{
    struct kvr_fallback_rng rng = {.state = 0};
    double sum = 0;
    for (int i = 0; i < 100000; i++) {
        double u = kvr_fallback_rng_uniform(&rng);
        ck_assert(u >= 0.0 && u < 1.0);
        sum += u;
    }
    ck_assert(fabs(sum / 100000 - 0.5) < 0.01);
}
END_TEST

Suite *fallback_suite(void)
{
    Suite *s = suite_create("fallback");
    TCase *api = tcase_create("api");
    tcase_add_test(api, worked_example);
    tcase_add_test(api, prefill_and_new_blocks);
    tcase_add_test(api, softmax_example);
    tcase_add_test(api, rng_uniform_range);
    suite_add_tcase(s, api);
    TCase *edge = tcase_create("edge");
    tcase_set_timeout(edge, 60);
    tcase_add_test(edge, softmax_distribution);
    tcase_add_test(edge, ranked_large_and_errors);
    suite_add_tcase(s, edge);
    return s;
}
