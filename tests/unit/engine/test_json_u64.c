/* test_json_u64.c - the JSON pre-scan (syntax, flaws, element spans, paths) and the exact
 * integer readers, against json-c's clamping. */
#include <check.h>
#include <inttypes.h>
#include <json-c/json.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvr/err.h"
#include "kvr/json_u64.h"

static uint64_t test_seed(void)
{
    const char *s = getenv("KVR_TEST_SEED");
    return s != NULL ? strtoull(s, NULL, 0) : UINT64_C(20260529);
}

static uint64_t rng_next(uint64_t *s)
{
    uint64_t z = (*s += UINT64_C(0x9E3779B97F4A7C15));
    z = (z ^ (z >> 30)) * UINT64_C(0xBF58476D1CE4E5B9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94D049BB133111EB);
    return z ^ (z >> 31);
}

/* Scans text (whole value) and asserts the result code. */
static void scan_rc(struct kvr_json_scan *s, const char *text, unsigned flags, int want)
{
    int rc = kvr_json_scan(s, text, strlen(text), flags);
    ck_assert_msg(rc == want, "scan of <%s>: rc %d (%s at %zu), want %d", text, rc,
                  s->err ? s->err : "-", s->err_off, want);
}

/* ==== syntax ================================================================================= */

START_TEST(scan_valid)
{
    static const char *const ok[] = {
        "{}",
        "[]",
        " \t\r\n{ } \n",
        "{\"a\":1,\"b\":[true,false,null],\"c\":{\"d\":\"x\"}}",
        "[0,-0,1,-1,0.5,-0.5e-3,1E+9,1e5,123456789012345678901234567890.0]",
        "[\"\",\"\\\"\\\\\\/\\b\\f\\n\\r\\t\",\"\\u00e9\\uD83D\\uDE00\",\"caf\xc3\xa9\"]",
        "[[[[]]],{\"\":{}}]",
        "\"just a string\"",
        "42",
        "-7.25",
        "true",
        "null",
        "{\"k\" : [ 1 , 2 ] }",
    };
    struct kvr_json_scan s;
    kvr_json_scan_init(&s, NULL);
    for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++) {
        scan_rc(&s, ok[i], 0, KVR_OK);
        ck_assert_ptr_null(s.err);
        ck_assert_uint_eq(s.n_flaws, 0);
    }
    scan_rc(&s, "  {\"a\":1}  ", 0, KVR_OK);
    ck_assert_uint_eq(s.start, 2);
    ck_assert_uint_eq(s.end, 9);
    ck_assert_int_eq(s.root, '{');
    kvr_json_scan_free(&s);
    ck_assert_uint_eq(s.own_.live_bytes, 0);
}
END_TEST

struct bad_case {
    const char *text;
    size_t off;       /* expected error offset */
    const char *what; /* expected substring of the message */
};

START_TEST(scan_invalid)
{
    static const struct bad_case bad[] = {
        {"", 0, "empty"},
        {"   ", 3, "whitespace"},
        {"{", 1, "end of input"},
        {"[1,]", 3, "unexpected character"},
        {"{\"a\":1,}", 7, "member name expected"},
        {"{'a':1}", 1, "member name or '}'"},
        {"[01]", 2, "leading zero"},
        {"[-01]", 3, "leading zero"},
        {"[1.]", 3, "after '.'"},
        {"[.5]", 1, "unexpected character"},
        {"[+1]", 1, "unexpected character"},
        {"[1e]", 3, "exponent"},
        {"[1e+]", 4, "exponent"},
        {"[-]", 2, "invalid number"},
        {"[--1]", 2, "invalid number"},
        {"[tru]", 1, "invalid literal"},
        {"[nul]", 1, "invalid literal"},
        {"[NaN]", 1, "unexpected character"},
        {"[Infinity]", 1, "unexpected character"},
        {"[\"a\tb\"]", 3, "control character"},
        {"[\"\\x\"]", 3, "invalid escape"},
        {"[\"\\u12G4\"]", 6, "\\u escape"},
        {"[\"abc", 5, "unterminated"},
        {"[1 2]", 3, "',' or ']'"},
        {"{\"a\" 1}", 5, "':'"},
        {"{1:2}", 1, "member name or '}'"},
        {"{\"a\":1 \"b\":2}", 7, "',' or '}'"},
        {"[1] x", 4, "after the JSON value"},
        {"[1]/*c*/", 3, "after the JSON value"},
        {"{\"a\":1}{\"b\":2}", 7, "after the JSON value"},
        {"[1,2", 4, "end of input"},
        {"x", 0, "unexpected character"},
    };
    struct kvr_json_scan s;
    kvr_json_scan_init(&s, NULL);
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        scan_rc(&s, bad[i].text, 0, KVR_ECORRUPT);
        ck_assert_ptr_nonnull(s.err);
        ck_assert_msg(s.err_off == bad[i].off, "<%s>: error at %zu (%s), want %zu", bad[i].text,
                      s.err_off, s.err, bad[i].off);
        ck_assert_msg(strstr(s.err, bad[i].what) != NULL, "<%s>: '%s' lacks '%s'", bad[i].text,
                      s.err, bad[i].what);
    }
    /* json-c itself accepts several of these: the scan is what keeps us strict */
    struct json_object *o = json_tokener_parse("{'a':1}");
    ck_assert_ptr_nonnull(o);
    json_object_put(o);
    kvr_json_scan_free(&s);
}
END_TEST

START_TEST(scan_depth)
{
    char text[2 * (KVR_JSON_MAX_DEPTH + 1) + 1];
    struct kvr_json_scan s;
    kvr_json_scan_init(&s, NULL);
    for (int depth = KVR_JSON_MAX_DEPTH; depth <= KVR_JSON_MAX_DEPTH + 1; depth++) {
        memset(text, '[', (size_t)depth);
        memset(text + depth, ']', (size_t)depth);
        text[2 * depth] = '\0';
        int rc = kvr_json_scan(&s, text, strlen(text), 0);
        if (depth <= KVR_JSON_MAX_DEPTH) {
            ck_assert_int_eq(rc, KVR_OK);
        } else {
            ck_assert_int_eq(rc, KVR_ECORRUPT);
            ck_assert_str_eq(s.err, "nesting too deep");
            ck_assert_uint_eq(s.err_off, KVR_JSON_MAX_DEPTH);
        }
    }
    kvr_json_scan_free(&s);
}
END_TEST

START_TEST(scan_prefix_and_elements)
{
    struct kvr_json_scan s;
    kvr_json_scan_init(&s, NULL);
    const char *two = "{\"a\":1}\n{\"b\":2}\n";
    scan_rc(&s, two, KVR_JSON_SCAN_PREFIX, KVR_OK);
    ck_assert_uint_eq(s.end, 7);
    scan_rc(&s, two, 0, KVR_ECORRUPT);
    ck_assert_uint_eq(s.err_off, 8);

    const char *arr = " [ {\"a\":[1,2]} , 2 ,\"x,]\",[3,[4]] , null ] ";
    scan_rc(&s, arr, KVR_JSON_SCAN_ELEMENTS, KVR_OK);
    static const char *const want[] = {"{\"a\":[1,2]}", "2", "\"x,]\"", "[3,[4]]", "null"};
    ck_assert_uint_eq(s.n_elems, 5);
    for (size_t i = 0; i < 5; i++) {
        ck_assert_uint_eq(s.elems[i].len, strlen(want[i]));
        ck_assert_int_eq(memcmp(arr + s.elems[i].off, want[i], s.elems[i].len), 0);
    }
    scan_rc(&s, "[]", KVR_JSON_SCAN_ELEMENTS, KVR_OK);
    ck_assert_uint_eq(s.n_elems, 0);
    /* without the flag nothing is recorded; an object root records nothing */
    scan_rc(&s, "[1,2]", 0, KVR_OK);
    ck_assert_uint_eq(s.n_elems, 0);
    scan_rc(&s, "{\"a\":[1,2]}", KVR_JSON_SCAN_ELEMENTS, KVR_OK);
    ck_assert_uint_eq(s.n_elems, 0);
    kvr_json_scan_free(&s);
    ck_assert_uint_eq(s.own_.live_bytes, 0);
}
END_TEST

/* ==== flaws ================================================================================== */

START_TEST(flaw_boundaries)
{
    static const struct {
        const char *tok;
        int overflow;
    } cases[] = {
        {"0", 0},
        {"-0", 0},
        {"18446744073709551615", 0},
        {"18446744073709551616", 1},
        {"18446744073709551620", 1},
        {"28446744073709551615", 1},
        {"99999999999999999999", 1},
        {"100000000000000000000", 1},
        {"9223372036854775808", 0},
        {"-9223372036854775808", 0},
        {"-9223372036854775809", 1},
        {"-9300000000000000000", 1},
        {"-10000000000000000000", 1},
        {"-999999999999999999", 0},
        {"1e400", 0}, /* not an integer: typed double by json-c, refused by the readers */
        {"184467440737095516150", 1},
    };
    struct kvr_json_scan s;
    kvr_json_scan_init(&s, NULL);
    char text[64];
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        snprintf(text, sizeof(text), "[%s]", cases[i].tok);
        scan_rc(&s, text, 0, KVR_OK);
        ck_assert_msg(s.n_flaws == (size_t)cases[i].overflow, "%s: %zu flaws", cases[i].tok,
                      s.n_flaws);
        if (cases[i].overflow) {
            ck_assert_uint_eq(s.flaws[0].off, 1);
            ck_assert_uint_eq(s.flaws[0].len, strlen(cases[i].tok));
            ck_assert_str_eq(s.flaws[0].path, "[0]");
        }
    }
    kvr_json_scan_free(&s);
}
END_TEST

START_TEST(flaw_paths)
{
    const char *text = "{\"a\":18446744073709551616,"
                       "\"b\":[1,-9223372036854775809,{\"c\\u002ed\":99999999999999999999}],"
                       "\"e\":18446744073709551615,\"f\":-9223372036854775808,"
                       "\"s\":\"18446744073709551616\",\"g\":[[0,[123456789012345678901]]]}";
    struct kvr_json_scan s;
    kvr_json_scan_init(&s, NULL);
    scan_rc(&s, text, 0, KVR_OK);
    ck_assert_uint_eq(s.n_flaws, 4);
    ck_assert_str_eq(s.flaws[0].path, "a");
    ck_assert_str_eq(s.flaws[1].path, "b[1]");
    ck_assert_str_eq(s.flaws[2].path, "b[2].c.d"); /* the escaped name, decoded */
    ck_assert_str_eq(s.flaws[3].path, "g[0][1][0]");
    ck_assert_int_eq(memcmp(text + s.flaws[1].off, "-9223372036854775809", s.flaws[1].len), 0);

    struct kvr_json_path a = {NULL, "a", 0}, b = {NULL, "b", 0}, b1 = {&b, NULL, 1},
                         b0 = {&b, NULL, 0}, e = {NULL, "e", 0}, g = {NULL, "g", 0},
                         g0 = {&g, NULL, 0}, g01 = {&g0, NULL, 1}, g010 = {&g01, NULL, 0};
    ck_assert_ptr_eq(kvr_json_scan_find(&s, &a), &s.flaws[0]);
    ck_assert_ptr_eq(kvr_json_scan_find(&s, &b1), &s.flaws[1]);
    ck_assert_ptr_eq(kvr_json_scan_find(&s, &g010), &s.flaws[3]);
    ck_assert_ptr_null(kvr_json_scan_find(&s, &b0));
    ck_assert_ptr_null(kvr_json_scan_find(&s, &b));
    ck_assert_ptr_null(kvr_json_scan_find(&s, &e));
    ck_assert_ptr_null(kvr_json_scan_find(NULL, &a));

    /* a rescan replaces the flaws */
    scan_rc(&s, "[1]", 0, KVR_OK);
    ck_assert_uint_eq(s.n_flaws, 0);
    ck_assert_ptr_null(kvr_json_scan_find(&s, &a));
    kvr_json_scan_free(&s);
    ck_assert_uint_eq(s.own_.live_bytes, 0);
}
END_TEST

START_TEST(path_format)
{
    struct kvr_json_path ev = {NULL, "event", 0}, data = {&ev, "data", 0},
                         st = {&data, "stored", 0}, bl = {&st, "blocks", 0}, b2 = {&bl, NULL, 2},
                         bh = {&b2, "block_hash", 0};
    char buf[128];
    size_t n = kvr_json_path_format(&bh, buf, sizeof(buf));
    ck_assert_str_eq(buf, "event.data.stored.blocks[2].block_hash");
    ck_assert_uint_eq(n, strlen(buf));
    /* truncation reports the full length */
    ck_assert_uint_eq(kvr_json_path_format(&bh, buf, 6), n);
    ck_assert_str_eq(buf, "event");
    ck_assert_uint_eq(kvr_json_path_format(&bh, NULL, 0), n);
    ck_assert_uint_eq(kvr_json_path_format(NULL, buf, sizeof(buf)), 0);
    ck_assert_str_eq(buf, "");
    struct kvr_json_path i3 = {NULL, NULL, 3}, k = {&i3, "event", 0};
    kvr_json_path_format(&k, buf, sizeof(buf));
    ck_assert_str_eq(buf, "[3].event");
}
END_TEST

/* ==== readers ================================================================================ */

/* Parses text with json-c after scanning it; returns the tree (owned by the caller). */
static struct json_object *parse(struct kvr_json_scan *s, const char *text)
{
    ck_assert_int_eq(kvr_json_scan(s, text, strlen(text), 0), KVR_OK);
    struct json_object *o = json_tokener_parse(text);
    ck_assert_ptr_nonnull(o);
    return o;
}

/* Reads member `key` of {"key": <tok>} as a hash. */
static int hash_of(const char *tok, uint64_t *out, char *err, size_t err_len)
{
    char text[256];
    snprintf(text, sizeof(text), "{\"h\":%s}", tok);
    struct kvr_json_scan s;
    kvr_json_scan_init(&s, NULL);
    struct json_object *o = parse(&s, text), *v = NULL;
    json_object_object_get_ex(o, "h", &v);
    struct kvr_json_path p = {NULL, "h", 0};
    int rc = kvr_json_read_hash(v, &s, &p, out, err, err_len);
    json_object_put(o);
    kvr_json_scan_free(&s);
    return rc;
}

START_TEST(read_hash_values)
{
    static const struct {
        const char *tok;
        uint64_t want;
    } ok[] = {
        {"0", 0},
        {"-0", 0},
        {"1", 1},
        {"9007199254740993", UINT64_C(9007199254740993)}, /* 2^53 + 1: not a double */
        {"9223372036854775807", UINT64_C(9223372036854775807)},
        {"9223372036854775808", UINT64_C(9223372036854775808)}, /* 2^63 */
        {"16045690984503111693", UINT64_C(0xDEADBEEFCAFEF00D)},
        {"18446744073709551615", UINT64_MAX},
        {"-1", UINT64_MAX},
        {"-2", UINT64_C(18446744073709551614)},
        {"-3488128144981237669", UINT64_C(14958615928728313947)}, /* SGLang, hashing.md 9.7 */
        {"-9223372036854775808", UINT64_C(9223372036854775808)},
    };
    for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++) {
        uint64_t v = 12345;
        char err[128] = "";
        ck_assert_msg(hash_of(ok[i].tok, &v, err, sizeof(err)) == KVR_OK, "%s: %s", ok[i].tok, err);
        ck_assert_msg(v == ok[i].want, "%s read as %" PRIu64, ok[i].tok, v);
    }
}
END_TEST

START_TEST(read_hash_rejects)
{
    static const struct {
        const char *tok;
        const char *msg;
    } bad[] = {
        {"18446744073709551616",
         "h: expected an unsigned 64-bit integer, got 18446744073709551616 (out of range)"},
        {"-9223372036854775809",
         "h: expected an unsigned 64-bit integer, got -9223372036854775809 (out of range)"},
        {"99999999999999999999999999",
         "h: expected an unsigned 64-bit integer, got 99999999999999999999999999 (out of range)"},
        {"1.0", "h: expected an unsigned 64-bit integer, got 1.0"},
        {"1e5", "h: expected an unsigned 64-bit integer, got 1e5"},
        {"-1.5", "h: expected an unsigned 64-bit integer, got -1.5"},
        {"1E400", "h: expected an unsigned 64-bit integer, got 1E400"},
        {"\"123\"", "h: expected an unsigned 64-bit integer, got the string \"123\""},
        {"null", "h: expected an unsigned 64-bit integer, got null"},
        {"true", "h: expected an unsigned 64-bit integer, got true"},
        {"[1]", "h: expected an unsigned 64-bit integer, got an array"},
        {"{}", "h: expected an unsigned 64-bit integer, got an object"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        uint64_t v = 777;
        char err[160] = "";
        ck_assert_int_eq(hash_of(bad[i].tok, &v, err, sizeof(err)), KVR_ECORRUPT);
        ck_assert_str_eq(err, bad[i].msg);
        ck_assert_uint_eq(v, 777); /* untouched */
    }
    /* NULL is json-c's null; no error buffer */
    struct kvr_json_path p = {NULL, "x", 0};
    uint64_t v = 5;
    char err[64];
    ck_assert_int_eq(kvr_json_read_hash(NULL, NULL, &p, &v, err, sizeof(err)), KVR_ECORRUPT);
    ck_assert_str_eq(err, "x: expected an unsigned 64-bit integer, got null");
    ck_assert_int_eq(kvr_json_read_hash(NULL, NULL, &p, &v, NULL, 0), KVR_ECORRUPT);
    ck_assert_int_eq(kvr_json_missing(err, sizeof(err), &p), KVR_ECORRUPT);
    ck_assert_str_eq(err, "x: missing");
    ck_assert_int_eq(kvr_json_missing(NULL, 0, &p), KVR_ECORRUPT);
    /* a short buffer truncates safely */
    ck_assert_int_eq(hash_of("1.5", &v, err, 8), KVR_ECORRUPT);
    ck_assert_str_eq(err, "h: expe");
}
END_TEST

/* A genuine 2^64 - 1 beside an overflowing sibling: only the sibling is refused. */
START_TEST(read_clamp_is_per_path)
{
    const char *text = "{\"a\":18446744073709551615,\"b\":18446744073709551616,"
                       "\"c\":-9223372036854775808,\"d\":-9223372036854775809}";
    struct kvr_json_scan s;
    kvr_json_scan_init(&s, NULL);
    struct json_object *o = parse(&s, text), *v;
    const char *keys[] = {"a", "b", "c", "d"};
    const int ok[] = {1, 0, 1, 0};
    for (int i = 0; i < 4; i++) {
        ck_assert(json_object_object_get_ex(o, keys[i], &v));
        struct kvr_json_path p = {NULL, keys[i], 0};
        uint64_t x = 0;
        int rc = kvr_json_read_hash(v, &s, &p, &x, NULL, 0);
        ck_assert_int_eq(rc, ok[i] ? KVR_OK : KVR_ECORRUPT);
        /* json-c alone cannot tell: b reads exactly like a, d like c */
        if (i == 1)
            ck_assert_uint_eq(json_object_get_uint64(v), UINT64_MAX);
        if (i == 3)
            ck_assert_int_eq(json_object_get_int64(v), INT64_MIN);
    }
    json_object_put(o);
    kvr_json_scan_free(&s);
}
END_TEST

/* Reads member `key` of o as a non-negative integer <= max; err has room for 160 bytes. */
static int read_member_uint(struct json_object *o, const struct kvr_json_scan *s, const char *key,
                            uint64_t max, uint64_t *x, char *err)
{
    struct json_object *v = NULL;
    json_object_object_get_ex(o, key, &v);
    struct kvr_json_path p = {NULL, key, 0};
    return kvr_json_read_uint(v, max, s, &p, x, err, 160);
}

START_TEST(read_uint_bounds)
{
    const char *text = "{\"u32max\":4294967295,\"u32over\":4294967296,\"neg\":-1,\"zero\":0,"
                       "\"u64max\":18446744073709551615,\"over\":18446744073709551616,"
                       "\"frac\":2.5,\"s\":\"7\",\"negzero\":-0}";
    struct kvr_json_scan s;
    kvr_json_scan_init(&s, NULL);
    struct json_object *o = parse(&s, text);
    char err[160];
    uint64_t x;
    ck_assert_int_eq(read_member_uint(o, &s, "u32max", UINT32_MAX, &x, err), KVR_OK);
    ck_assert_uint_eq(x, UINT32_MAX);
    ck_assert_int_eq(read_member_uint(o, &s, "u32over", UINT32_MAX, &x, err), KVR_ECORRUPT);
    ck_assert_str_eq(err, "u32over: expected an unsigned 32-bit integer, got 4294967296");
    ck_assert_int_eq(read_member_uint(o, &s, "u32over", UINT64_MAX, &x, err), KVR_OK);
    ck_assert_uint_eq(x, UINT64_C(4294967296));
    ck_assert_int_eq(read_member_uint(o, &s, "neg", UINT64_MAX, &x, err), KVR_ECORRUPT);
    ck_assert_str_eq(err, "neg: expected an unsigned 64-bit integer, got -1");
    ck_assert_int_eq(read_member_uint(o, &s, "zero", 0, &x, err), KVR_OK);
    ck_assert_uint_eq(x, 0);
    ck_assert_int_eq(read_member_uint(o, &s, "negzero", 10, &x, err), KVR_OK);
    ck_assert_uint_eq(x, 0);
    ck_assert_int_eq(read_member_uint(o, &s, "u64max", UINT64_MAX, &x, err), KVR_OK);
    ck_assert_uint_eq(x, UINT64_MAX);
    ck_assert_int_eq(read_member_uint(o, &s, "over", UINT64_MAX, &x, err), KVR_ECORRUPT);
    ck_assert_str_eq(err, "over: expected an unsigned 64-bit integer, got 18446744073709551616 "
                          "(out of range)");
    ck_assert_int_eq(read_member_uint(o, &s, "frac", 100, &x, err), KVR_ECORRUPT);
    ck_assert_str_eq(err, "frac: expected an integer in [0, 100], got 2.5");
    ck_assert_int_eq(read_member_uint(o, &s, "s", 100, &x, err), KVR_ECORRUPT);
    ck_assert_str_eq(err, "s: expected an integer in [0, 100], got the string \"7\"");
    ck_assert_int_eq(read_member_uint(o, &s, "absent", 100, &x, err), KVR_ECORRUPT);
    ck_assert_str_eq(err, "absent: expected an integer in [0, 100], got null");
    json_object_put(o);
    kvr_json_scan_free(&s);
}
END_TEST

START_TEST(type_error_messages)
{
    char err[128];
    struct kvr_json_path r = {NULL, NULL, 3}, k = {&r, "event", 0};
    struct json_object *arr = json_object_new_array();
    ck_assert_int_eq(kvr_json_type_error(err, sizeof(err), NULL, &k, "an object", arr),
                     KVR_ECORRUPT);
    ck_assert_str_eq(err, "[3].event: expected an object, got an array");
    ck_assert_int_eq(kvr_json_type_error(err, sizeof(err), NULL, NULL, "an object", arr),
                     KVR_ECORRUPT);
    ck_assert_str_eq(err, "expected an object, got an array");
    ck_assert_int_eq(kvr_json_type_error(err, sizeof(err), NULL, &k, "an object", NULL),
                     KVR_ECORRUPT);
    ck_assert_str_eq(err, "[3].event: expected an object, got null");
    json_object_put(arr);
    /* long and non-printable strings are cut and masked */
    struct json_object *str = json_object_new_string("a\"b\nccccccccccccccccccccccccccccccccccc");
    kvr_json_describe(str, err, sizeof(err));
    ck_assert_str_eq(err, "the string \"a\\\"b?cccccccccccccccccccccccccccc\"...");
    json_object_put(str);
}
END_TEST

/* ==== oracle: random integers against exact arithmetic ======================================= */

/* Renders the decimal of a 128-bit value with an optional sign. */
static void u128_dec(unsigned __int128 v, int neg, char *out)
{
    char tmp[64];
    int n = 0;
    do {
        tmp[n++] = (char)('0' + (int)(v % 10));
        v /= 10;
    } while (v != 0);
    int o = 0;
    if (neg)
        out[o++] = '-';
    while (n > 0)
        out[o++] = tmp[--n];
    out[o] = '\0';
}

START_TEST(oracle_random_integers)
{
    uint64_t seed = test_seed(), s = seed;
    for (int i = 0; i < 20000; i++) {
        /* magnitudes up to ~2^66, biased towards the edges */
        unsigned __int128 mag = rng_next(&s);
        switch (rng_next(&s) % 4) {
        case 0:
            mag += (unsigned __int128)(rng_next(&s) % 4) << 64;
            break;
        case 1:
            mag = ((unsigned __int128)1 << 64) - 2 + (rng_next(&s) % 4);
            break;
        case 2:
            mag = ((unsigned __int128)1 << 63) - 2 + (rng_next(&s) % 4);
            break;
        default:
            mag >>= rng_next(&s) % 64;
        }
        int neg = (int)(rng_next(&s) & 1) && mag != 0;
        char tok[64];
        u128_dec(mag, neg, tok);
        int fits = neg ? mag <= ((unsigned __int128)1 << 63) : mag <= (unsigned __int128)UINT64_MAX;
        uint64_t want = neg ? (uint64_t)(0 - (uint64_t)mag) : (uint64_t)mag;
        uint64_t got = 0;
        int rc = hash_of(tok, &got, NULL, 0);
        ck_assert_msg(rc == (fits ? KVR_OK : KVR_ECORRUPT), "seed %" PRIu64 ": %s rc %d", seed, tok,
                      rc);
        if (fits)
            ck_assert_msg(got == want, "seed %" PRIu64 ": %s read as %" PRIu64, seed, tok, got);
    }
}
END_TEST

/* ==== OOM ==================================================================================== */

START_TEST(oom_flaws)
{
    const char *text = "[18446744073709551616,[1,18446744073709551617],18446744073709551618]";
    for (uint64_t fail = 1; fail <= 8; fail++) {
        kvr_alloc_t a;
        kvr_alloc_init(&a);
        struct kvr_json_scan s;
        kvr_json_scan_init(&s, &a);
        kvr_alloc_fail_after(&a, fail);
        int rc = kvr_json_scan(&s, text, strlen(text), KVR_JSON_SCAN_ELEMENTS);
        if (a.failures > 0)
            ck_assert_int_eq(rc, KVR_ENOMEM);
        else
            ck_assert_int_eq(rc, KVR_OK);
        /* a retry after the failure succeeds and finds all three */
        kvr_alloc_fail_after(&a, 0);
        ck_assert_int_eq(kvr_json_scan(&s, text, strlen(text), KVR_JSON_SCAN_ELEMENTS), KVR_OK);
        ck_assert_uint_eq(s.n_flaws, 3);
        ck_assert_str_eq(s.flaws[1].path, "[1][1]");
        ck_assert_uint_eq(s.n_elems, 3);
        kvr_json_scan_free(&s);
        ck_assert_uint_eq(a.live_bytes, 0);
    }
}
END_TEST

Suite *json_u64_suite(void); /* called by check_main.c */

Suite *json_u64_suite(void)
{
    Suite *s = suite_create("json_u64");
    TCase *api = tcase_create("api");
    tcase_add_test(api, scan_valid);
    tcase_add_test(api, scan_prefix_and_elements);
    tcase_add_test(api, flaw_paths);
    tcase_add_test(api, path_format);
    tcase_add_test(api, read_hash_values);
    tcase_add_test(api, read_clamp_is_per_path);
    tcase_add_test(api, read_uint_bounds);
    tcase_add_test(api, type_error_messages);
    suite_add_tcase(s, api);
    TCase *edge = tcase_create("edge");
    tcase_add_test(edge, scan_invalid);
    tcase_add_test(edge, scan_depth);
    tcase_add_test(edge, flaw_boundaries);
    tcase_add_test(edge, read_hash_rejects);
    suite_add_tcase(s, edge);
    TCase *oracle = tcase_create("oracle");
    tcase_add_test(oracle, oracle_random_integers);
    suite_add_tcase(s, oracle);
    TCase *oom = tcase_create("oom");
    tcase_add_test(oom, oom_flaws);
    suite_add_tcase(s, oom);
    return s;
}
