/* test_buf.c - the growable byte buffer: appends, decimal formatting, growth, OOM. */
#include <check.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvr/buf.h"
#include "kvr/err.h"

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

/* Formats v with kvr_buf_fmt_u64 and compares with printf. */
static void check_u64(uint64_t v)
{
    char want[32], got[KVR_U64_DEC_MAX + 8];
    memset(got, 'x', sizeof(got));
    int wn = snprintf(want, sizeof(want), "%" PRIu64, v);
    size_t n = kvr_buf_fmt_u64(got, v);
    ck_assert_uint_eq(n, (size_t)wn);
    ck_assert_msg(memcmp(got, want, n) == 0, "%s formatted as %.*s", want, (int)n, got);
    ck_assert_int_eq(got[n], 'x'); /* nothing written past the digits */
}

START_TEST(append_basics)
{
    struct kvr_buf b;
    kvr_buf_init(&b, NULL);
    ck_assert_str_eq(kvr_buf_cstr(&b), "");
    ck_assert_uint_eq(b.len, 0);
    ck_assert_int_eq(kvr_buf_append_str(&b, "{\"a\":"), KVR_OK);
    ck_assert_int_eq(kvr_buf_append_u64(&b, UINT64_MAX), KVR_OK);
    ck_assert_int_eq(kvr_buf_append_char(&b, ','), KVR_OK);
    ck_assert_int_eq(kvr_buf_append(&b, "\"b\":0}", 6), KVR_OK);
    ck_assert_str_eq(kvr_buf_cstr(&b), "{\"a\":18446744073709551615,\"b\":0}");
    ck_assert_uint_eq(b.len, strlen("{\"a\":18446744073709551615,\"b\":0}"));
    ck_assert_int_eq(kvr_buf_append(&b, NULL, 0), KVR_OK);
    ck_assert_uint_eq(b.len, 32);
    kvr_buf_reset(&b);
    ck_assert_str_eq(kvr_buf_cstr(&b), "");
    ck_assert_uint_ne(b.cap, 0); /* memory kept */
    kvr_buf_free(&b);
    ck_assert_ptr_null(b.data);
    ck_assert_uint_eq(b.own.live_bytes, 0);
    ck_assert_uint_eq(b.own.live_allocs, 0);
}
END_TEST

START_TEST(u64_boundaries)
{
    uint64_t p = 1;
    for (int i = 0; i < 20; i++) {
        check_u64(p);
        check_u64(p - 1);
        check_u64(p + 1);
        if (i < 19)
            p *= 10;
    }
    check_u64(0);
    check_u64(UINT64_MAX);
    check_u64(UINT64_MAX - 1);
    check_u64(UINT64_C(1) << 63);
    check_u64((UINT64_C(1) << 63) - 1);
    check_u64(UINT64_C(16045690984503111693)); /* 0xDEADBEEFCAFEF00D */
    check_u64(UINT64_C(9007199254740993));     /* 2^53 + 1 */
    uint64_t s = test_seed();
    for (int i = 0; i < 100000; i++) {
        uint64_t v = rng_next(&s);
        check_u64(v >> (v & 63));
    }
}
END_TEST

START_TEST(bulk_reserve_commit)
{
    kvr_alloc_t a;
    kvr_alloc_init(&a);
    struct kvr_buf b;
    kvr_buf_init(&b, &a);
    ck_assert_ptr_null(kvr_buf_tail(&b));
    char want[64 * 21 + 1];
    size_t wn = 0;
    for (int round = 0; round < 50; round++) {
        ck_assert_int_eq(kvr_buf_reserve(&b, 64 * 21), KVR_OK);
        size_t cap = b.cap;
        char *p = kvr_buf_tail(&b);
        size_t n = 0;
        wn = 0;
        for (uint64_t v = 0; v < 64; v++) {
            uint64_t x = v * UINT64_C(0x9E3779B97F4A7C15);
            n += kvr_buf_fmt_u64(p + n, x);
            p[n++] = ',';
            wn += (size_t)snprintf(want + wn, sizeof(want) - wn, "%" PRIu64 ",", x);
        }
        kvr_buf_commit(&b, n);
        ck_assert_uint_eq(b.cap, cap); /* the writes stayed within the reservation */
        ck_assert_int_eq(memcmp(b.data + b.len - n, want, wn), 0);
        ck_assert_int_eq(b.data[b.len], '\0');
    }
    ck_assert_uint_gt(a.live_bytes, b.len); /* charged to the caller's allocator */
    kvr_buf_truncate(&b, 3);
    ck_assert_uint_eq(b.len, 3);
    ck_assert_uint_eq(strlen(kvr_buf_cstr(&b)), 3);
    kvr_buf_truncate(&b, 10); /* longer than the content: no-op */
    ck_assert_uint_eq(b.len, 3);
    kvr_buf_free(&b);
    ck_assert_uint_eq(a.live_bytes, 0);
    ck_assert_uint_eq(b.own.live_bytes, 0);
}
END_TEST

START_TEST(growth_keeps_content)
{
    struct kvr_buf b;
    kvr_buf_init(&b, NULL);
    for (int i = 0; i < 100000; i++)
        ck_assert_int_eq(kvr_buf_append_char(&b, (char)('a' + i % 26)), KVR_OK);
    ck_assert_uint_eq(b.len, 100000);
    for (int i = 0; i < 100000; i++)
        ck_assert_int_eq(b.data[i], 'a' + i % 26);
    ck_assert_uint_ge(b.cap, b.len + 1);
    ck_assert_uint_le(b.cap, 2 * (b.len + 1)); /* doubling, not more */
    kvr_buf_free(&b);
}
END_TEST

START_TEST(edge_overflow)
{
    struct kvr_buf b;
    kvr_buf_init(&b, NULL);
    ck_assert_int_eq(kvr_buf_append_str(&b, "abc"), KVR_OK);
    ck_assert_int_eq(kvr_buf_reserve(&b, SIZE_MAX), KVR_ENOMEM);
    ck_assert_int_eq(kvr_buf_reserve(&b, SIZE_MAX - 3), KVR_ENOMEM);
    ck_assert_str_eq(kvr_buf_cstr(&b), "abc");
    ck_assert_int_eq(kvr_buf_reserve(&b, 0), KVR_OK);
    kvr_buf_free(&b);
    /* free twice and reuse after free */
    kvr_buf_free(&b);
    ck_assert_int_eq(kvr_buf_append_str(&b, "x"), KVR_OK);
    ck_assert_str_eq(kvr_buf_cstr(&b), "x");
    kvr_buf_free(&b);
}
END_TEST

/* Every allocation failure leaves the content intact and is reported. */
/* Appends 200 numbers; returns the allocation calls a clean run makes. */
static uint64_t clean_run_calls(void)
{
    kvr_alloc_t a;
    kvr_alloc_init(&a);
    struct kvr_buf b;
    kvr_buf_init(&b, &a);
    for (int i = 0; i < 200; i++)
        ck_assert_int_eq(kvr_buf_append_u64(&b, (uint64_t)i * 1000003u), KVR_OK);
    kvr_buf_free(&b);
    return a.calls;
}

START_TEST(oom_every_call)
{
    uint64_t calls = clean_run_calls();
    ck_assert_uint_gt(calls, 3);
    for (uint64_t fail = 1; fail <= calls; fail++) {
        kvr_alloc_t a;
        kvr_alloc_init(&a);
        struct kvr_buf b;
        kvr_buf_init(&b, &a);
        kvr_alloc_fail_after(&a, fail);
        size_t failures = 0;
        char want[4096];
        size_t wn = 0;
        for (int i = 0; i < 200; i++) {
            size_t before = b.len;
            int rc = kvr_buf_append_u64(&b, (uint64_t)i * 1000003u);
            if (rc == KVR_ENOMEM) {
                failures++;
                ck_assert_uint_eq(b.len, before);
            } else {
                ck_assert_int_eq(rc, KVR_OK);
                wn += (size_t)snprintf(want + wn, sizeof(want) - wn, "%" PRIu64,
                                       (uint64_t)i * 1000003u);
            }
            ck_assert_int_eq(memcmp(kvr_buf_cstr(&b), want, wn), 0);
            ck_assert_uint_eq(b.len, wn);
        }
        ck_assert_uint_eq(failures, 1);
        ck_assert_uint_eq(a.failures, 1);
        kvr_buf_free(&b);
        ck_assert_uint_eq(a.live_bytes, 0);
    }
}
END_TEST

Suite *buf_suite(void); /* called by check_main.c */

Suite *buf_suite(void)
{
    Suite *s = suite_create("buf");
    TCase *api = tcase_create("api");
    tcase_add_test(api, append_basics);
    tcase_add_test(api, u64_boundaries);
    tcase_add_test(api, bulk_reserve_commit);
    tcase_add_test(api, growth_keeps_content);
    suite_add_tcase(s, api);
    TCase *edge = tcase_create("edge");
    tcase_add_test(edge, edge_overflow);
    suite_add_tcase(s, edge);
    TCase *oom = tcase_create("oom");
    tcase_add_test(oom, oom_every_call);
    suite_add_tcase(s, oom);
    return s;
}
