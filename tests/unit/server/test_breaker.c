/* test_breaker.c - the circuit breaker and health-threshold state machines (server/src/breaker.c)
 * with explicit time. */
#include <check.h>

#include "breaker.h"

Suite *breaker_suite(void);

static const struct srv_breaker_cfg cfg = {
    .failures = 3, .successes = 2, .probes = 1, .open_ms = 1000};

START_TEST(opens_after_consecutive_failures)
{
    struct srv_breaker b;
    int probe;
    srv_breaker_init(&b);
    ck_assert_int_eq(srv_breaker_state(&b, &cfg, 0), SRV_BRK_CLOSED);
    srv_breaker_report(&b, &cfg, 0, 0, 10);
    srv_breaker_report(&b, &cfg, 0, 0, 20);
    srv_breaker_report(&b, &cfg, 1, 0, 30); /* a success resets the count */
    srv_breaker_report(&b, &cfg, 0, 0, 40);
    srv_breaker_report(&b, &cfg, 0, 0, 50);
    ck_assert_int_eq(srv_breaker_state(&b, &cfg, 50), SRV_BRK_CLOSED);
    ck_assert_int_eq(srv_breaker_report(&b, &cfg, 0, 0, 60), 1); /* third in a row */
    ck_assert_int_eq(srv_breaker_state(&b, &cfg, 60), SRV_BRK_OPEN);
    ck_assert_int_eq(b.opens, 1);
    ck_assert_int_eq(srv_breaker_available(&b, &cfg, 500), 0);
    ck_assert_int_eq(srv_breaker_acquire(&b, &cfg, 1059, &probe), 0);
    /* late results of requests sent before it opened change nothing */
    ck_assert_int_eq(srv_breaker_report(&b, &cfg, 1, 0, 100), 0);
    ck_assert_int_eq(srv_breaker_state(&b, &cfg, 100), SRV_BRK_OPEN);
}
END_TEST

START_TEST(half_open_probes_then_closes)
{
    struct srv_breaker b;
    int probe = 0, p2 = 0;
    srv_breaker_init(&b);
    for (int k = 0; k < 3; k++)
        srv_breaker_report(&b, &cfg, 0, 0, 0);
    ck_assert_int_eq(srv_breaker_state(&b, &cfg, 999), SRV_BRK_OPEN);
    ck_assert_int_eq(srv_breaker_state(&b, &cfg, 1000), SRV_BRK_HALF_OPEN);
    ck_assert_int_eq(srv_breaker_available(&b, &cfg, 1000), 1);
    ck_assert_int_eq(srv_breaker_acquire(&b, &cfg, 1000, &probe), 1);
    ck_assert_int_eq(probe, 1);
    /* one probe at a time */
    ck_assert_int_eq(srv_breaker_available(&b, &cfg, 1001), 0);
    ck_assert_int_eq(srv_breaker_acquire(&b, &cfg, 1001, &p2), 0);
    srv_breaker_report(&b, &cfg, 1, probe, 1002);
    ck_assert_int_eq(srv_breaker_state(&b, &cfg, 1002), SRV_BRK_HALF_OPEN);
    ck_assert_int_eq(srv_breaker_acquire(&b, &cfg, 1003, &probe), 1);
    ck_assert_int_eq(srv_breaker_report(&b, &cfg, 1, probe, 1004), 1);
    ck_assert_int_eq(srv_breaker_state(&b, &cfg, 1004), SRV_BRK_CLOSED);
    ck_assert_int_eq(srv_breaker_acquire(&b, &cfg, 1005, &probe), 1);
    ck_assert_int_eq(probe, 0);
}
END_TEST

START_TEST(half_open_failure_reopens)
{
    struct srv_breaker b;
    int probe;
    srv_breaker_init(&b);
    for (int k = 0; k < 3; k++)
        srv_breaker_report(&b, &cfg, 0, 0, 0);
    ck_assert_int_eq(srv_breaker_acquire(&b, &cfg, 1500, &probe), 1);
    ck_assert_int_eq(srv_breaker_report(&b, &cfg, 0, probe, 1600), 1);
    ck_assert_int_eq(srv_breaker_state(&b, &cfg, 2599), SRV_BRK_OPEN); /* timer restarted */
    ck_assert_int_eq(srv_breaker_state(&b, &cfg, 2600), SRV_BRK_HALF_OPEN);
    ck_assert_int_eq(b.opens, 2);
}
END_TEST

START_TEST(disabled_breaker_never_opens)
{
    struct srv_breaker_cfg off = cfg;
    struct srv_breaker b;
    int probe;
    off.failures = 0;
    srv_breaker_init(&b);
    for (int k = 0; k < 100; k++)
        srv_breaker_report(&b, &off, 0, 0, (uint64_t)k);
    ck_assert_int_eq(srv_breaker_acquire(&b, &off, 100, &probe), 1);
    ck_assert_str_eq(srv_breaker_state_name(srv_breaker_state(&b, &off, 100)), "closed");
    ck_assert_str_eq(srv_breaker_state_name(SRV_BRK_OPEN), "open");
    ck_assert_str_eq(srv_breaker_state_name(SRV_BRK_HALF_OPEN), "half_open");
}
END_TEST

START_TEST(health_thresholds)
{
    struct srv_health h;
    struct srv_health_cfg hc = {.fails = 3, .passes = 2};
    srv_health_init(&h);
    ck_assert_int_eq(h.state, SRV_HEALTH_HEALTHY);
    ck_assert_int_eq(srv_health_report(&h, &hc, 0), 0);
    ck_assert_int_eq(srv_health_report(&h, &hc, 0), 0);
    ck_assert_int_eq(srv_health_report(&h, &hc, 1), 0); /* not consecutive */
    ck_assert_int_eq(srv_health_report(&h, &hc, 0), 0);
    ck_assert_int_eq(srv_health_report(&h, &hc, 0), 0);
    ck_assert_int_eq(srv_health_report(&h, &hc, 0), 1);
    ck_assert_str_eq(srv_health_state_name(h.state), "unhealthy");
    ck_assert_int_eq(srv_health_report(&h, &hc, 1), 0);
    ck_assert_int_eq(srv_health_report(&h, &hc, 0), 0);
    ck_assert_int_eq(srv_health_report(&h, &hc, 1), 0);
    ck_assert_int_eq(srv_health_report(&h, &hc, 1), 1);
    ck_assert_int_eq(h.state, SRV_HEALTH_HEALTHY);
    ck_assert_uint_eq(h.checks, 10);
    ck_assert_uint_eq(h.failed, 6);
}
END_TEST

Suite *breaker_suite(void)
{
    Suite *s = suite_create("breaker");
    TCase *tc = tcase_create("api");
    tcase_add_test(tc, opens_after_consecutive_failures);
    tcase_add_test(tc, half_open_probes_then_closes);
    tcase_add_test(tc, half_open_failure_reopens);
    tcase_add_test(tc, disabled_breaker_never_opens);
    tcase_add_test(tc, health_thresholds);
    suite_add_tcase(s, tc);
    return s;
}
