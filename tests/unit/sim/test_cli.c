/* test_cli.c - `kvr-sim` end to end through kvr_sim_main: the documented interface, byte-identical
 * outputs for a seed, policy failures reported (not fatal), usage errors, --events.
 * SPDX-License-Identifier: Apache-2.0 */
#include <check.h>
#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kvr/sim.h"

Suite *sim_cli_suite(void);

#define CONV KVR_SOURCE_DIR "/data/traces/mooncake_fast25_conversation_trace.jsonl.gz"

static char dir[64];

static void setup(void)
{
    snprintf(dir, sizeof(dir), "/tmp/kvr-sim-test-XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(dir));
}

static void teardown(void)
{
    char cmd[128];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    ck_assert_int_eq(system(cmd), 0);
}

static int run(int argc, const char *const *argv)
{
    fflush(stdout);
    return kvr_sim_main(argc, (char **)argv);
}

#define RUN(...)                                                                                   \
    run((int)(sizeof((const char *[]){__VA_ARGS__}) / sizeof(const char *)),                       \
        (const char *[]){__VA_ARGS__})

static char *path(const char *name)
{
    static char p[8][256];
    static int k;
    k = (k + 1) % 8;
    snprintf(p[k], sizeof(p[k]), "%s/%s", dir, name);
    return p[k];
}

static char *slurp(const char *file, size_t *len)
{
    FILE *f = fopen(file, "rb");
    ck_assert_msg(f != NULL, "%s", file);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    ck_assert_uint_eq(fread(buf, 1, (size_t)n, f), (size_t)n);
    buf[n] = '\0';
    fclose(f);
    if (len != NULL)
        *len = (size_t)n;
    return buf;
}

static int same_file(const char *a, const char *b)
{
    size_t la, lb;
    char *x = slurp(a, &la), *y = slurp(b, &lb);
    int same = la == lb && memcmp(x, y, la) == 0;
    free(x);
    free(y);
    return same;
}

static json_object *policy_of(json_object *doc, const char *name)
{
    json_object *ps, *p;
    ck_assert(json_object_object_get_ex(doc, "policies", &ps));
    ck_assert_msg(json_object_object_get_ex(ps, name, &p), "no policy %s", name);
    return p;
}

static double num(json_object *o, const char *key)
{
    json_object *v;
    ck_assert_msg(json_object_object_get_ex(o, key, &v), "no key %s", key);
    return json_object_get_double(v);
}

/* Same seed: byte-identical JSON and HTML (policies that draw random numbers included); another
 * seed changes the random policy's figures. The documented keys are present. */
START_TEST(same_seed_same_bytes)
{
    const char *j1 = path("a.json"), *h1 = path("a.html"), *j2 = path("b.json"),
               *h2 = path("b.html"), *j3 = path("c.json");
    ck_assert_int_eq(RUN("kvr-sim", "--trace", CONV, "--limit", "800", "--workers", "4",
                         "--cache-blocks", "512", "--policy", "bounded_affinity", "--policy",
                         "random", "--policy", "power_of_two", "--seed", "7", "--json", j1,
                         "--html", h1, "--quiet"),
                     0);
    ck_assert_int_eq(RUN("kvr-sim", "--trace", CONV, "--limit", "800", "--workers", "4",
                         "--cache-blocks", "512", "--policy", "bounded_affinity", "--policy",
                         "random", "--policy", "power_of_two", "--seed", "7", "--json", j2,
                         "--html", h2, "--quiet"),
                     0);
    ck_assert(same_file(j1, j2));
    ck_assert(same_file(h1, h2));
    ck_assert_int_eq(RUN("kvr-sim", "--trace", CONV, "--limit", "800", "--workers", "4",
                         "--cache-blocks", "512", "--policy", "bounded_affinity", "--policy",
                         "random", "--policy", "power_of_two", "--seed", "8", "--json", j3,
                         "--quiet"),
                     0);
    ck_assert(!same_file(j1, j3));
    json_object *a = json_object_from_file(j1), *c = json_object_from_file(j3);
    ck_assert_ptr_nonnull(a);
    static const char *const keys[] = {"hit_ratio",   "best_hit_ratio", "imbalance",
                                       "ttft_p50_ms", "ttft_p99_ms",    "requests"};
    for (size_t k = 0; k < sizeof(keys) / sizeof(keys[0]); k++)
        (void)num(policy_of(a, "bounded_affinity"), keys[k]);
    ck_assert(num(policy_of(a, "bounded_affinity"), "requests") == 800);
    /* the deterministic policy does not depend on the seed; the random one does */
    ck_assert(num(policy_of(a, "bounded_affinity"), "hit_ratio") ==
              num(policy_of(c, "bounded_affinity"), "hit_ratio"));
    ck_assert(num(policy_of(a, "random"), "ttft_p50_ms") !=
                  num(policy_of(c, "random"), "ttft_p50_ms") ||
              num(policy_of(a, "random"), "hit_ratio") != num(policy_of(c, "random"), "hit_ratio"));
    json_object *t;
    ck_assert(!json_object_object_get_ex(a, "timing", &t)); /* wall clock only on request */
    json_object_put(a);
    json_object_put(c);
    char *html = slurp(h1, NULL);
    ck_assert_ptr_nonnull(strstr(html, "<svg"));
    ck_assert_ptr_null(strstr(html, "<script"));
    ck_assert_ptr_null(strstr(html, "href="));
    ck_assert_ptr_null(strstr(html, "src="));
    ck_assert_ptr_null(strstr(html, "https:"));
    free(html);
}
END_TEST

/* A policy file that raises, one that does not compile: both reported in the JSON and the
 * table, the other policies run, exit 0 (1 with --strict). --timing adds the wall clock. */
START_TEST(policy_failures_reported)
{
    const char *bad = path("boom.lua"), *syn = path("syntax.lua"), *j = path("e.json");
    FILE *f = fopen(bad, "w");
    fputs("return { select = function(req, c)\n"
          "  if req.model == 'sim' then error('boom') end\n"
          "  return c[1]\n"
          "end }\n",
          f);
    fclose(f);
    f = fopen(syn, "w");
    fputs("return {\n", f);
    fclose(f);
    ck_assert_int_eq(RUN("kvr-sim", "--trace", CONV, "--limit", "200", "--policy", bad, "--policy",
                         syn, "--policy", "kv_cost", "--json", j, "--timing", "--quiet"),
                     0);
    json_object *d = json_object_from_file(j);
    ck_assert_ptr_nonnull(d);
    json_object *p = policy_of(d, "boom"), *v, *e;
    ck_assert(json_object_object_get_ex(p, "ok", &v) && json_object_get_boolean(v));
    ck_assert(json_object_object_get_ex(p, "policy_errors", &e));
    ck_assert(num(e, "errors") == 200);
    ck_assert(num(e, "fallbacks") == 200);
    ck_assert(json_object_object_get_ex(e, "first_error", &v));
    ck_assert_ptr_nonnull(strstr(json_object_get_string(v), "boom"));
    p = policy_of(d, "syntax");
    ck_assert(json_object_object_get_ex(p, "ok", &v) && !json_object_get_boolean(v));
    ck_assert(json_object_object_get_ex(p, "error", &v));
    ck_assert_ptr_nonnull(strstr(json_object_get_string(v), "syntax.lua:"));
    ck_assert(num(policy_of(d, "kv_cost"), "requests") == 200);
    ck_assert(json_object_object_get_ex(d, "timing", &v));
    ck_assert(json_object_object_get_ex(v, "kv_cost", &v));
    ck_assert(num(v, "decisions_per_s") > 0);
    json_object_put(d);
    ck_assert_int_eq(
        RUN("kvr-sim", "--trace", CONV, "--limit", "50", "--policy", bad, "--strict", "--quiet"),
        1);
    ck_assert_int_eq(
        RUN("kvr-sim", "--trace", CONV, "--limit", "50", "--policy", syn, "--strict", "--quiet"),
        1);
    ck_assert_int_eq(RUN("kvr-sim", "--trace", CONV, "--limit", "50", "--policy", "kv_cost",
                         "--strict", "--quiet"),
                     0);
}
END_TEST

START_TEST(usage_errors)
{
    ck_assert_int_eq(RUN("kvr-sim"), 2);
    ck_assert_int_eq(RUN("kvr-sim", "--help"), 0);
    ck_assert_int_eq(RUN("kvr-sim", "--trace", CONV), 2); /* no policy */
    ck_assert_int_eq(RUN("kvr-sim", "--trace", CONV, "--policy", "no_such_policy"), 2);
    ck_assert_int_eq(RUN("kvr-sim", "--trace", CONV, "--policy", "kv_cost", "--workers", "x"), 2);
    ck_assert_int_eq(RUN("kvr-sim", "--trace", CONV, "--policy", "kv_cost", "--bogus"), 2);
    ck_assert_int_eq(RUN("kvr-sim", "--trace", CONV, "--events", CONV, "--policy", "kv_cost"), 2);
    ck_assert_int_eq(RUN("kvr-sim", "--trace", "/nonexistent", "--policy", "kv_cost"), 2);
    ck_assert_int_eq(
        RUN("kvr-sim", "--trace", CONV, "--policy", "kv_cost", "--block-size", "100", "--quiet"),
        2);
    ck_assert_int_eq(RUN("kvr-sim", "--trace", CONV, "--limit", "10", "--policy", "kv_cost",
                         "--json", "/nonexistent/dir/x.json", "--quiet"),
                     1);
}
END_TEST

/* --events on a committed op stream, with the SVG files; a repeated policy gets a new name. */
START_TEST(events_mode_and_svgs)
{
    char ops[512];
    const char *td = getenv("KVR_TEST_DATA");
    snprintf(ops, sizeof(ops), "%s/opstream/conv16_w4_cap24.jsonl", td ? td : "tests/data");
    const char *j = path("ev.json");
    ck_assert_int_eq(RUN("kvr-sim", "--events", ops, "--policy", "bounded_affinity", "--policy",
                         "bounded_affinity", "--json", j, "--svg-dir", dir, "--quiet"),
                     0);
    json_object *d = json_object_from_file(j), *v;
    ck_assert_ptr_nonnull(d);
    ck_assert(json_object_object_get_ex(d, "mode", &v));
    ck_assert_str_eq(json_object_get_string(v), "events");
    json_object *p = policy_of(d, "bounded_affinity-2");
    ck_assert(num(p, "requests") == 16);
    ck_assert(num(p, "expect_mismatches") == 0);
    ck_assert(num(p, "hit_ratio") <= num(p, "oracle_hit_ratio"));
    json_object_put(d);
    ck_assert_int_eq(access(path("hit_ratio.svg"), R_OK), 0);
    ck_assert_int_eq(access(path("load_bounded_affinity.svg"), R_OK), 0);
    ck_assert_int_eq(access(path("load_bounded_affinity-2.svg"), R_OK), 0);
    ck_assert_int_ne(access(path("ttft_cdf.svg"), R_OK), 0); /* no latency in --events mode */
}
END_TEST

Suite *sim_cli_suite(void)
{
    Suite *s = suite_create("sim_cli");
    TCase *api = tcase_create("api");
    tcase_add_checked_fixture(api, setup, teardown);
    tcase_set_timeout(api, 300);
    tcase_add_test(api, same_seed_same_bytes);
    tcase_add_test(api, policy_failures_reported);
    tcase_add_test(api, events_mode_and_svgs);
    suite_add_tcase(s, api);
    TCase *edge = tcase_create("edge");
    tcase_add_checked_fixture(edge, setup, teardown);
    tcase_set_timeout(edge, 120);
    tcase_add_test(edge, usage_errors);
    suite_add_tcase(s, edge);
    return s;
}
