/* test_report.c - the HTML report and the SVG charts on hand-made results: self-contained,
 * escaped, one line per policy, failed policies listed, standalone SVG files.
 * SPDX-License-Identifier: Apache-2.0 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kvr/err.h"
#include "kvr/sim.h"
#include "report.h"

Suite *sim_report_suite(void);

static size_t count(const char *s, const char *needle)
{
    size_t n = 0;
    for (const char *p = strstr(s, needle); p != NULL; p = strstr(p + 1, needle))
        n++;
    return n;
}

/* Two results: "a<b" (ok, 2 workers, 2 buckets, 3 TTFTs) and "bad" (failed install). */
static void fake(struct kvr_sim_result *r, struct kvr_sim_config *cfg, struct kvr_sim_report *rep)
{
    kvr_sim_config_init(cfg);
    cfg->workers = 2;
    cfg->buckets = 2;
    memset(r, 0, 2 * sizeof(*r));
    snprintf(r[0].name, sizeof(r[0].name), "a<b");
    r[0].origin = "test";
    r[0].mode = KVR_SIM_MODE_TRACE;
    r[0].ok = 1;
    r[0].requests = 3;
    r[0].blocks = 10;
    r[0].cached_blocks = 4;
    r[0].best_blocks = 5;
    r[0].hit_ratio = 0.4;
    r[0].best_hit_ratio = 0.5;
    r[0].imbalance = 1.25;
    r[0].n_workers = 2;
    r[0].n_buckets = 2;
    r[0].bucket_us = 60000000;
    static struct kvr_sim_worker_stats ws[2] = {{0, 2, 6, 3, 100, 2, 1.5},
                                                {1, 1, 4, 1, 50, 1, 0.5}};
    static uint64_t bb[2] = {6, 4}, bc[2] = {3, 1}, bbest[2] = {3, 2},
                    ttft[3] = {5000, 20000, 900000};
    static double inflight[4] = {1, 2, 0.5, 0.5};
    r[0].workers = ws;
    r[0].bucket_blocks = bb;
    r[0].bucket_cached = bc;
    r[0].bucket_best = bbest;
    r[0].inflight = inflight;
    r[0].ttft_us = ttft;
    r[0].n_ttft = 3;
    snprintf(r[1].name, sizeof(r[1].name), "bad");
    r[1].origin = "/tmp/bad.lua";
    r[1].mode = KVR_SIM_MODE_TRACE;
    snprintf(r[1].error, sizeof(r[1].error), "bad.lua:1: '<eof>' expected & more");
    memset(rep, 0, sizeof(*rep));
    rep->cfg = cfg;
    rep->input = "trace.jsonl";
    rep->mode = KVR_SIM_MODE_TRACE;
    rep->res = r;
    rep->n = 2;
    rep->trace_requests = 3;
    rep->trace_duration_s = 120;
}

START_TEST(html_is_self_contained)
{
    struct kvr_sim_result r[2];
    struct kvr_sim_config cfg;
    struct kvr_sim_report rep;
    fake(r, &cfg, &rep);
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    ck_assert_int_eq(kvr_sim_write_html(f, &rep), KVR_OK);
    fclose(f);
    ck_assert_ptr_nonnull(strstr(buf, "<!DOCTYPE html>"));
    ck_assert_ptr_nonnull(strstr(buf, "</html>\n"));
    ck_assert_ptr_null(strstr(buf, "<script"));
    ck_assert_ptr_null(strstr(buf, "a<b"));
    ck_assert_ptr_nonnull(strstr(buf, "a&lt;b"));
    ck_assert_ptr_nonnull(strstr(buf, "bad.lua:1: '&lt;eof&gt;' expected &amp; more"));
    /* three charts for one ok policy: hit ratio (policy + best), TTFT CDF, its load (2 workers) */
    ck_assert_uint_eq(count(buf, "<svg "), 3);
    ck_assert_uint_eq(count(buf, "<polyline"), 2 + 1 + 2);
    ck_assert_ptr_nonnull(strstr(buf, "best achievable"));
    ck_assert_ptr_nonnull(strstr(buf, "<td>0.4000</td><td>0.5000</td><td>80.0%</td>"));
    free(buf);
    ck_assert(kvr_sim_report_ttft_pct(&r[0], 0) == 5.0);
    ck_assert(kvr_sim_report_ttft_pct(&r[0], 50) == 20.0);
    ck_assert(kvr_sim_report_ttft_pct(&r[0], 100) == 900.0);
}
END_TEST

START_TEST(svg_files)
{
    struct kvr_sim_result r[2];
    struct kvr_sim_config cfg;
    struct kvr_sim_report rep;
    fake(r, &cfg, &rep);
    char dir[] = "/tmp/kvr-sim-svg-XXXXXX";
    ck_assert_ptr_nonnull(mkdtemp(dir));
    char err[256] = "", p[512];
    ck_assert_int_eq(kvr_sim_write_svgs(dir, &rep, err, sizeof(err)), KVR_OK);
    static const char *const files[] = {"hit_ratio.svg", "ttft_cdf.svg", "load_a<b.svg"};
    for (size_t k = 0; k < 3; k++) {
        snprintf(p, sizeof(p), "%s/%s", dir, files[k]);
        FILE *f = fopen(p, "r");
        ck_assert_msg(f != NULL, "%s", p);
        char head[64] = "";
        ck_assert_ptr_nonnull(fgets(head, sizeof(head), f));
        ck_assert_str_eq(head, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
        fclose(f);
        unlink(p);
    }
    snprintf(p, sizeof(p), "%s/load_bad.svg", dir);
    ck_assert_int_ne(access(p, F_OK), 0); /* no chart for a failed policy */
    ck_assert_int_eq(rmdir(dir), 0);
    ck_assert_int_eq(kvr_sim_write_svgs("/nonexistent/dir", &rep, err, sizeof(err)), KVR_EIO);
    ck_assert_ptr_nonnull(strstr(err, "/nonexistent/dir/hit_ratio.svg"));
}
END_TEST

Suite *sim_report_suite(void)
{
    Suite *s = suite_create("sim_report");
    TCase *api = tcase_create("api");
    tcase_add_test(api, html_is_self_contained);
    tcase_add_test(api, svg_files);
    suite_add_tcase(s, api);
    return s;
}
