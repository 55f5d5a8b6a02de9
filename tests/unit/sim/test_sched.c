/* test_sched.c - the event queue: (time, push order) ordering against a sorted model.
 * SPDX-License-Identifier: Apache-2.0 */
#include <check.h>
#include <stdlib.h>

#include "kvr/err.h"
#include "kvr_test.h"
#include "sched.h"

Suite *sim_sched_suite(void);

START_TEST(ties_keep_push_order)
{
    struct kvr_sim_sched s;
    kvr_sim_sched_init(&s);
    struct kvr_sim_ev e;
    ck_assert_int_eq(kvr_sim_sched_peek(&s, &e), 0);
    ck_assert_int_eq(kvr_sim_sched_pop(&s, &e), 0);
    ck_assert_int_eq(kvr_sim_sched_push(&s, 10, 1, 100), KVR_OK);
    ck_assert_int_eq(kvr_sim_sched_push(&s, 5, 2, 200), KVR_OK);
    ck_assert_int_eq(kvr_sim_sched_push(&s, 10, 3, 300), KVR_OK);
    ck_assert_int_eq(kvr_sim_sched_push(&s, 5, 4, 400), KVR_OK);
    uint32_t want[] = {200, 400, 100, 300};
    for (int i = 0; i < 4; i++) {
        ck_assert_int_eq(kvr_sim_sched_pop(&s, &e), 1);
        ck_assert_uint_eq(e.arg, want[i]);
    }
    ck_assert_int_eq(kvr_sim_sched_pop(&s, &e), 0);
    kvr_sim_sched_free(&s);
}
END_TEST

START_TEST(oracle_random)
{
    uint64_t seed = kvr_test_seed(3);
    struct kvr_test_rng r = {seed};
    struct kvr_sim_sched s;
    kvr_sim_sched_init(&s);
    uint64_t last_t = 0, last_seq = 0, now = 0;
    int popped = 0, first = 1;
    for (int step = 0; step < 100000; step++) {
        if (kvr_test_below(&r, 3) != 0 || s.n == 0) {
            /* only future events, like the simulator */
            if (kvr_sim_sched_push(&s, now + kvr_test_below(&r, 50), 0, (uint32_t)step) != KVR_OK)
                ck_abort_msg("push failed");
        } else {
            struct kvr_sim_ev e;
            ck_assert_int_eq(kvr_sim_sched_pop(&s, &e), 1);
            ck_assert_msg(first || e.time_us > last_t || (e.time_us == last_t && e.seq > last_seq),
                          "seed %llu step %d", (unsigned long long)seed, step);
            first = 0;
            last_t = now = e.time_us;
            last_seq = e.seq;
            popped++;
        }
    }
    ck_assert_int_gt(popped, 1000);
    kvr_sim_sched_free(&s);
}
END_TEST

Suite *sim_sched_suite(void)
{
    Suite *s = suite_create("sim_sched");
    TCase *api = tcase_create("api");
    tcase_add_test(api, ties_keep_push_order);
    suite_add_tcase(s, api);
    TCase *oracle = tcase_create("oracle");
    tcase_set_timeout(oracle, 60);
    tcase_add_test(oracle, oracle_random);
    suite_add_tcase(s, oracle);
    return s;
}
