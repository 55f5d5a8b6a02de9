/* test_fastjson.c - the single-pass query_by_hash parser (server/src/fastjson.c): accepted bodies,
 * bodies it must hand to the general parser, and a differential test against the general strict
 * reader (whatever the fast path accepts, the general path accepts with the same values). */
#include <check.h>
#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fastjson.h"
#include "jsonr.h"
#include "kvr/err.h"

Suite *fastjson_suite(void);

START_TEST(accepts_the_common_shape)
{
    uint64_t h[8];
    struct srv_fast_query q;
    const char *b = " {\"block_hashes\" : [9143094415614847814, -6322652565496669421, 0,"
                    "18446744073709551615, -9223372036854775808], \"model_name\":\"llama\","
                    "\"tenant_id\":\"t1\"}\n";
    ck_assert_int_eq(srv_fast_query_by_hash(b, strlen(b), h, 8, &q), 1);
    ck_assert_uint_eq(q.n, 5);
    ck_assert_uint_eq(h[0], 9143094415614847814ull);
    ck_assert_uint_eq(h[1], 12124091508212882195ull);
    ck_assert_uint_eq(h[2], 0);
    ck_assert_uint_eq(h[3], UINT64_MAX);
    ck_assert_uint_eq(h[4], 1ull << 63);
    ck_assert_uint_eq(q.model_len, 5);
    ck_assert(memcmp(q.model, "llama", 5) == 0);
    ck_assert(memcmp(q.tenant, "t1", 2) == 0);
    const char *e = "{\"block_hashes\":[]}";
    ck_assert_int_eq(srv_fast_query_by_hash(e, strlen(e), h, 8, &q), 1);
    ck_assert_uint_eq(q.n, 0);
    ck_assert_ptr_null(q.model);
}
END_TEST

START_TEST(hands_everything_else_over)
{
    const char *bad[] = {
        "",
        "[]",
        "{}",
        "{\"model_name\":\"m\"}",                           /* no hashes */
        "{\"block_hashes\":[1],\"lora_name\":\"x\"}",       /* another key */
        "{\"block_hashes\":[1.0]}",                         /* fraction */
        "{\"block_hashes\":[1e3]}",                         /* exponent */
        "{\"block_hashes\":[01]}",                          /* leading zero */
        "{\"block_hashes\":[18446744073709551616]}",        /* > u64 */
        "{\"block_hashes\":[-9223372036854775809]}",        /* < i64 */
        "{\"block_hashes\":[99999999999999999999]}",        /* 20 digits > u64 */
        "{\"block_hashes\":[100000000000000000000]}",       /* 21 digits */
        "{\"block_hashes\":[184467440737095516150]}",       /* 21 digits */
        "{\"block_hashes\":[-18446744073709551615]}",       /* < i64 */
        "{\"block_hashes\":[1,]}",                          /* trailing comma */
        "{\"block_hashes\":[1] \"model_name\":\"m\"}",      /* missing comma */
        "{\"block_hashes\":[1],\"model_name\":\"a\\\"b\"}", /* escape */
        "{\"block_hashes\":[1],\"model_name\":null}",       /* not a string */
        "{\"block_hashes\":[1]} x",                         /* trailing garbage */
        "{\"block_hashes\":[1],\"block_hashes\":[2]}",      /* duplicate */
        "{\"block_hashes\":[1,2,3,4,5,6,7,8,9]}",           /* over cap */
        "{\"block_hashes\":[\"1\"]}",                       /* string */
        "{\"block_hashes\":[1]",                            /* truncated */
        "{\"block_hashes\":[-]}",
    };
    for (size_t k = 0; k < sizeof(bad) / sizeof(bad[0]); k++) {
        uint64_t h[8];
        struct srv_fast_query q;
        ck_assert_msg(srv_fast_query_by_hash(bad[k], strlen(bad[k]), h, 8, &q) == 0, "%s", bad[k]);
    }
}
END_TEST

/* Random bodies assembled from valid and invalid pieces. */
static size_t random_body(char *out, size_t cap, unsigned *seed)
{
    static const char *const nums[] = {"0",
                                       "7",
                                       "-1",
                                       "18446744073709551615",
                                       "18446744073709551616",
                                       "-9223372036854775808",
                                       "-9223372036854775807",
                                       "9999999999999999999",
                                       "10000000000000000000",
                                       "18446744073709551614",
                                       "99999999999999999999",
                                       "1234567890123456789012",
                                       "12345678",
                                       "123456789012345678",
                                       "1234567.5",
                                       "123456789012345678e5",
                                       "1234567890123456789.",
                                       "-1234567890123456789",
                                       "9223372036854775808",
                                       "1.5",
                                       "01",
                                       "1e2",
                                       "42 ",
                                       " 3"};
    static const char *const extra[] = {"",
                                        ",\"model_name\":\"default\"",
                                        ",\"tenant_id\":\"x\"",
                                        ",\"model_name\":\"a\\nb\"",
                                        ",\"x\":1",
                                        " ",
                                        ","};
    size_t n = 0;
    n += (size_t)snprintf(out + n, cap - n, "{\"block_hashes\":[");
    int count = rand_r(seed) % 5;
    for (int k = 0; k < count; k++)
        n += (size_t)snprintf(out + n, cap - n, "%s%s", k ? "," : "",
                              nums[rand_r(seed) % (sizeof(nums) / sizeof(nums[0]))]);
    n += (size_t)snprintf(out + n, cap - n, "]%s}", extra[rand_r(seed) % 7]);
    return n;
}

START_TEST(differential_against_the_general_reader)
{
    unsigned seed = 1234;
    struct srv_jdoc d;
    ck_assert_int_eq(srv_jdoc_init(&d), KVR_OK);
    int accepted = 0;
    for (int it = 0; it < 20000; it++) {
        char body[512];
        size_t len = random_body(body, sizeof(body), &seed);
        uint64_t fast[8], slow[8];
        struct srv_fast_query q;
        if (!srv_fast_query_by_hash(body, len, fast, 8, &q))
            continue;
        accepted++;
        char err[256];
        ck_assert_msg(srv_jdoc_parse(&d, body, len, err, sizeof(err)) == KVR_OK, "%s: %s", body,
                      err);
        struct json_object *arr;
        ck_assert(srv_jmember(d.root, "block_hashes", &arr));
        struct kvr_json_path p = {NULL, "block_hashes", 0};
        size_t n;
        ck_assert_msg(srv_jread_hashes(&d, arr, &p, slow, 8, &n, err, sizeof(err)) == KVR_OK,
                      "%s: %s", body, err);
        ck_assert_uint_eq(n, q.n);
        for (size_t k = 0; k < n; k++)
            ck_assert_uint_eq(fast[k], slow[k]);
        srv_jdoc_release(&d);
    }
    ck_assert_int_gt(accepted, 1000);
    srv_jdoc_free(&d);
}
END_TEST

static int count_member(void *ctx, const char *key, size_t kl, const struct srv_fast_value *v)
{
    (void)key;
    (void)kl;
    (void)v;
    (*(int *)ctx)++;
    return 0;
}

START_TEST(object_walk_and_arrays)
{
    const char *ok = "{\"model\": \"m\", \"prompt\": [1, 2, 4294967295], \"max_tokens\": 8, "
                     "\"stream\": false, \"stop\": [\"\\n\\u00e9\", null], \"x\": {\"a\": [{}]},"
                     " \"t\": -1.5e-3}";
    int n = 0;
    ck_assert_int_eq(srv_fast_object(ok, strlen(ok), count_member, &n), 1);
    ck_assert_int_eq(n, 7);
    const char *bad[] = {"{\"a\": 01}",       "{\"a\": 1.}",        "{\"a\": .5}",
                         "{\"a\": \"\\x\"}",  "{\"a\": tru}",       "{\"a\": [1,]}",
                         "{\"a\": {\"b\"}}",  "{\"a\": 1} {}",      "[1]",
                         "{\"a\": \"\x01\"}", "{\"a\": \"\\u12\"}", "{\"a\" 1}",
                         "{\"a\": -}",        "{\"k\\n\": 1}",      ""};
    for (size_t k = 0; k < sizeof(bad) / sizeof(bad[0]); k++) {
        n = 0;
        ck_assert_msg(srv_fast_object(bad[k], strlen(bad[k]), count_member, &n) == 0, "%s", bad[k]);
    }
    /* deep nesting is refused, not recursed without bound */
    char deep[400];
    size_t d = 0;
    d += (size_t)snprintf(deep + d, sizeof(deep) - d, "{\"a\":");
    for (int k = 0; k < 100; k++)
        deep[d++] = '[';
    for (int k = 0; k < 100; k++)
        deep[d++] = ']';
    deep[d++] = '}';
    ck_assert_int_eq(srv_fast_object(deep, d, count_member, &n), 0);
    struct srv_fast_value v = {"[1, 2 ,3]", 9, '['};
    uint32_t t[4];
    uint64_t h[4];
    ck_assert_int_eq(srv_fast_u32_array(&v, t, 4), 3);
    ck_assert_uint_eq(t[2], 3);
    ck_assert_int_eq(srv_fast_u32_array(&v, t, 2), -1);
    struct srv_fast_value neg = {"[-1]", 4, '['};
    ck_assert_int_eq(srv_fast_u32_array(&neg, t, 4), -1);
    ck_assert_int_eq(srv_fast_u64_array(&neg, h, 4), 1);
    ck_assert_uint_eq(h[0], UINT64_MAX);
    struct srv_fast_value big = {"[4294967296]", 12, '['};
    ck_assert_int_eq(srv_fast_u32_array(&big, t, 4), -1);
    uint64_t u;
    struct srv_fast_value num = {"42", 2, '0'};
    ck_assert_int_eq(srv_fast_uint(&num, 100, &u), 1);
    ck_assert_uint_eq(u, 42);
    ck_assert_int_eq(srv_fast_uint(&num, 10, &u), 0);
}
END_TEST

/* Random texts: whatever the walk accepts, the strict scanner accepts as an object. */
START_TEST(object_walk_never_accepts_invalid_json)
{
    static const char *const atoms[] = {
        "1", "-0", "01", "1.5", "1e", "\"s\"", "\"\\q\"", "true", "nul", "null", "[",          "]",
        "{", "}",  ",",  ":",   " ",  "\"k\"", "[]",      "{}",   "-",   "2E+3", "\"\\u0041\""};
    unsigned seed = 99;
    struct kvr_json_scan scan;
    kvr_json_scan_init(&scan, NULL);
    int accepted = 0;
    for (int it = 0; it < 50000; it++) {
        char text[256];
        size_t n = (size_t)snprintf(text, sizeof(text), "{\"k\":");
        int parts = 1 + rand_r(&seed) % 8;
        for (int k = 0; k < parts && n < 200; k++)
            n += (size_t)snprintf(text + n, sizeof(text) - n, "%s",
                                  atoms[rand_r(&seed) % (sizeof(atoms) / sizeof(atoms[0]))]);
        if (rand_r(&seed) % 2)
            text[n++] = '}';
        int c = 0;
        if (!srv_fast_object(text, n, count_member, &c))
            continue;
        accepted++;
        ck_assert_msg(kvr_json_scan(&scan, text, n, 0) == KVR_OK && scan.root == '{',
                      "accepted invalid JSON: %.*s", (int)n, text);
    }
    ck_assert_int_gt(accepted, 100);
    kvr_json_scan_free(&scan);
}
END_TEST

Suite *fastjson_suite(void)
{
    Suite *s = suite_create("fastjson");
    TCase *tc = tcase_create("oracle");
    tcase_add_test(tc, accepts_the_common_shape);
    tcase_add_test(tc, hands_everything_else_over);
    tcase_add_test(tc, differential_against_the_general_reader);
    tcase_add_test(tc, object_walk_and_arrays);
    tcase_add_test(tc, object_walk_never_accepts_invalid_json);
    suite_add_tcase(s, tc);
    return s;
}
