/* test_metrics.c - percentiles, imbalance and the in-flight load series, by hand.
 * SPDX-License-Identifier: Apache-2.0 */
#include <check.h>
#include <math.h>

#include "kvr/err.h"
#include "metrics.h"

Suite *sim_metrics_suite(void);

START_TEST(percentiles_and_imbalance)
{
    uint64_t v[10] = {10, 9, 8, 7, 6, 5, 4, 3, 2, 1};
    kvr_sim_sort_u64(v, 10);
    ck_assert_uint_eq(v[0], 1);
    ck_assert_uint_eq(kvr_sim_percentile(v, 10, 0.5), 5);   /* ceil(5) = 5th */
    ck_assert_uint_eq(kvr_sim_percentile(v, 10, 0.9), 9);   /* ceil(9) = 9th */
    ck_assert_uint_eq(kvr_sim_percentile(v, 10, 0.99), 10); /* ceil(9.9) = 10th */
    ck_assert_uint_eq(kvr_sim_percentile(v, 10, 0.01), 1);
    ck_assert_uint_eq(kvr_sim_percentile(v, 0, 0.5), 0);
    uint64_t us[4] = {1000, 2000, 3000, 10000};
    struct kvr_sim_dist d;
    kvr_sim_dist_ms(us, 4, &d);
    ck_assert(fabs(d.mean - 4.0) < 1e-12);
    ck_assert(d.p50 == 2.0 && d.p90 == 10.0 && d.p99 == 10.0 && d.max == 10.0);
    uint64_t load[2] = {4, 1};
    ck_assert(fabs(kvr_sim_imbalance(load, 2, sizeof(uint64_t)) - 1.6) < 1e-12);
    uint64_t zero[3] = {0, 0, 0};
    ck_assert(kvr_sim_imbalance(zero, 3, sizeof(uint64_t)) == 0);
}
END_TEST

/* Two workers, window 100 in 4 buckets of 25.
 *   w0: +1 at 10, +1 at 30, -1 at 60, -1 at 110 (past the window: clipped)
 *   w1: +1 at 0, -1 at 100
 * w0 areas: b0 [10,25) x1 = 15; b1 [25,30) x1 + [30,50) x2 = 45; b2 [50,60) x2 + [60,75) x1 = 35;
 * b3 [75,100) x1 = 25 -> means 0.6 1.8 1.4 1.0, total 120 (mean 1.2), max 2. w1: 1.0 each.
 * imbalance over time: (1 + 1.8 + 1.4 + 1) / (0.8 + 1.4 + 1.2 + 1.0) = 5.2 / 4.4. */
START_TEST(load_series_by_hand)
{
    struct kvr_sim_load_series s;
    ck_assert_int_eq(kvr_sim_load_init(&s, 2, 4, 100), KVR_OK);
    ck_assert_uint_eq(s.width, 25);
    kvr_sim_load_change(&s, 1, 0, +1);
    kvr_sim_load_change(&s, 0, 10, +1);
    kvr_sim_load_change(&s, 0, 30, +1);
    kvr_sim_load_change(&s, 0, 60, -1);
    kvr_sim_load_change(&s, 1, 100, -1);
    kvr_sim_load_change(&s, 0, 110, -1);
    kvr_sim_load_finish(&s, 120);
    double want0[4] = {0.6, 1.8, 1.4, 1.0};
    double v[8];
    for (uint32_t b = 0; b < 4; b++) {
        ck_assert(fabs(kvr_sim_load_mean(&s, 0, b) - want0[b]) < 1e-12);
        ck_assert(fabs(kvr_sim_load_mean(&s, 1, b) - 1.0) < 1e-12);
        v[b] = kvr_sim_load_mean(&s, 0, b);
        v[4 + b] = kvr_sim_load_mean(&s, 1, b);
    }
    ck_assert(fabs(s.total[0] - 120.0) < 1e-9);
    ck_assert_uint_eq(s.max[0], 2);
    ck_assert_uint_eq(s.max[1], 1);
    ck_assert(fabs(kvr_sim_imbalance_series(v, 2, 4) - 5.2 / 4.4) < 1e-12);
    ck_assert_uint_eq(kvr_sim_bucket_of(99, s.width, 4), 3);
    ck_assert_uint_eq(kvr_sim_bucket_of(5000, s.width, 4), 3); /* clamped */
    kvr_sim_load_free(&s);
}
END_TEST

Suite *sim_metrics_suite(void)
{
    Suite *s = suite_create("sim_metrics");
    TCase *api = tcase_create("api");
    tcase_add_test(api, percentiles_and_imbalance);
    tcase_add_test(api, load_series_by_hand);
    suite_add_tcase(s, api);
    return s;
}
