/* test_prom.c - Prometheus text formatting and histograms (server/src/prom.c), and the JSON
 * writer (server/src/jsonw.c). */
#include <check.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "jsonw.h"
#include "kvr/err.h"
#include "prom.h"
#include "stats.h"

Suite *prom_suite(void);

START_TEST(family_and_samples)
{
    struct kvr_buf b;
    struct srv_prom p;
    kvr_buf_init(&b, NULL);
    srv_prom_init(&p, &b);
    srv_prom_header(&p, "kvrouter_x_total", "counter", "Things.");
    struct srv_prom_label l[2] = {{"route", "/v1/route"}, {"code", "200"}};
    srv_prom_u64(&p, "kvrouter_x_total", l, 2, 18446744073709551615ull);
    srv_prom_u64(&p, "kvrouter_x_total", NULL, 0, 0);
    srv_prom_dbl(&p, "kvrouter_g", NULL, 0, 0.5);
    srv_prom_dbl(&p, "kvrouter_g", NULL, 0, INFINITY);
    ck_assert_int_eq(p.err, KVR_OK);
    ck_assert_str_eq(kvr_buf_cstr(&b),
                     "# HELP kvrouter_x_total Things.\n"
                     "# TYPE kvrouter_x_total counter\n"
                     "kvrouter_x_total{route=\"/v1/route\",code=\"200\"} 18446744073709551615\n"
                     "kvrouter_x_total 0\n"
                     "kvrouter_g 0.5\n"
                     "kvrouter_g +Inf\n");
    kvr_buf_free(&b);
}
END_TEST

START_TEST(label_values_are_escaped)
{
    char out[64];
    ck_assert_str_eq(srv_prom_escape("a\"b\\c\nd", out, sizeof(out)), "a\\\"b\\\\c\\nd");
    ck_assert_str_eq(srv_prom_escape("0123456789", out, 6), "0123");
    struct kvr_buf b;
    struct srv_prom p;
    kvr_buf_init(&b, NULL);
    srv_prom_init(&p, &b);
    struct srv_prom_label l[1] = {{"model", "we\"ird\nname"}};
    srv_prom_u64(&p, "m", l, 1, 1);
    ck_assert_str_eq(kvr_buf_cstr(&b), "m{model=\"we\\\"ird\\nname\"} 1\n");
    kvr_buf_free(&b);
}
END_TEST

START_TEST(histograms_are_cumulative)
{
    static const struct srv_hist_spec spec = {3, {10, 100, 1000}, 1e-3};
    struct srv_hist h;
    memset(&h, 0, sizeof(h));
    uint64_t vals[] = {0, 10, 11, 100, 500, 1000, 1001, 99999};
    for (size_t k = 0; k < sizeof(vals) / sizeof(vals[0]); k++)
        srv_hist_observe(&h, &spec, vals[k]);
    struct srv_hist_snap s;
    memset(&s, 0, sizeof(s));
    srv_hist_read(&h, &s);
    srv_hist_read(&h, &s); /* two threads' worth */
    struct kvr_buf b;
    struct srv_prom p;
    kvr_buf_init(&b, NULL);
    srv_prom_init(&p, &b);
    struct srv_prom_label l[1] = {{"route", "/q"}};
    srv_prom_hist(&p, "lat_seconds", l, 1, &spec, &s);
    ck_assert_str_eq(kvr_buf_cstr(&b), "lat_seconds_bucket{route=\"/q\",le=\"0.01\"} 4\n"
                                       "lat_seconds_bucket{route=\"/q\",le=\"0.1\"} 8\n"
                                       "lat_seconds_bucket{route=\"/q\",le=\"1\"} 12\n"
                                       "lat_seconds_bucket{route=\"/q\",le=\"+Inf\"} 16\n"
                                       "lat_seconds_sum{route=\"/q\"} 205.242\n"
                                       "lat_seconds_count{route=\"/q\"} 16\n");
    kvr_buf_free(&b);
}
END_TEST

START_TEST(route_and_status_names)
{
    ck_assert_str_eq(srv_code_name(srv_code_index(200)), "200");
    ck_assert_str_eq(srv_code_name(srv_code_index(499)), "499");
    ck_assert_str_eq(srv_code_name(srv_code_index(418)), "other");
    ck_assert_str_eq(srv_route_name(SRV_R_QUERY_BY_HASH), "/query_by_hash");
    ck_assert_str_eq(srv_route_name(SRV_R_OTHER), "other");
    const struct srv_hist_spec *lat = srv_hist_latency();
    for (size_t k = 1; k < lat->n; k++)
        ck_assert_uint_gt(lat->bound[k], lat->bound[k - 1]);
}
END_TEST

START_TEST(json_writer)
{
    struct kvr_buf b;
    struct srv_jw w;
    kvr_buf_init(&b, NULL);
    srv_jw_init(&w, &b);
    srv_jw_char(&w, '[');
    srv_jw_u64(&w, 18446744073709551615ull);
    srv_jw_char(&w, ',');
    srv_jw_i64(&w, INT64_MIN);
    srv_jw_char(&w, ',');
    srv_jw_str(&w, "a\"\\\n\x01\xc3\xa9", 7);
    srv_jw_char(&w, ',');
    srv_jw_dbl(&w, 0.1);
    srv_jw_char(&w, ',');
    srv_jw_dbl(&w, NAN);
    srv_jw_char(&w, ',');
    srv_jw_cstr(&w, NULL);
    srv_jw_char(&w, ',');
    srv_jw_u64str(&w, 7);
    srv_jw_char(&w, ',');
    srv_jw_bool(&w, 1);
    srv_jw_char(&w, ']');
    ck_assert_int_eq(w.err, KVR_OK);
    ck_assert_str_eq(kvr_buf_cstr(&b), "[18446744073709551615,-9223372036854775808,"
                                       "\"a\\\"\\\\\\n\\u0001\xc3\xa9\",0.1,null,null,\"7\",true]");
    /* a failed allocation sticks */
    kvr_alloc_t a;
    kvr_alloc_init(&a);
    struct kvr_buf b2;
    kvr_buf_init(&b2, &a);
    srv_jw_init(&w, &b2);
    kvr_alloc_fail_after(&a, 1);
    srv_jw_raw(&w, "hello");
    srv_jw_raw(&w, "world");
    ck_assert_int_eq(w.err, KVR_ENOMEM);
    kvr_buf_free(&b2);
    kvr_buf_free(&b);
}
END_TEST

Suite *prom_suite(void)
{
    Suite *s = suite_create("prom");
    TCase *tc = tcase_create("api");
    tcase_add_test(tc, family_and_samples);
    tcase_add_test(tc, label_values_are_escaped);
    tcase_add_test(tc, histograms_are_cumulative);
    tcase_add_test(tc, route_and_status_names);
    tcase_add_test(tc, json_writer);
    suite_add_tcase(s, tc);
    return s;
}
