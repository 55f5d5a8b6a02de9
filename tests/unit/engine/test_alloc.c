/* test_alloc.c - the accounting allocator (engine/src/alloc.c): byte and block accounting with
 * malloc's chunk header, the peak, calloc overflow, realloc growth and shrinking, and the
 * fail-after-N injection the OOM tests of every other module rely on. */
#include <check.h>
#include <malloc.h>
#include <stdint.h>
#include <string.h>

#include "kvr/alloc.h"

START_TEST(init_is_zero)
{
    kvr_alloc_t a;
    memset(&a, 0xa5, sizeof(a));
    kvr_alloc_init(&a);
    ck_assert_uint_eq(a.live_bytes, 0);
    ck_assert_uint_eq(a.peak_bytes, 0);
    ck_assert_uint_eq(a.live_allocs, 0);
    ck_assert_uint_eq(a.calls, 0);
    ck_assert_uint_eq(a.fail_at, 0);
    ck_assert_uint_eq(a.failures, 0);
}
END_TEST

START_TEST(bytes_include_the_chunk)
{
    kvr_alloc_t a;
    kvr_alloc_init(&a);
    char *p = kvr_malloc(&a, 100);
    ck_assert_ptr_nonnull(p);
    memset(p, 1, 100);
    /* The usable size malloc really handed out, plus its one-word header. */
    size_t one = malloc_usable_size(p) + sizeof(size_t);
    ck_assert_uint_ge(one, 100 + sizeof(size_t));
    ck_assert_uint_eq(a.live_bytes, one);
    ck_assert_uint_eq(a.live_allocs, 1);
    ck_assert_uint_eq(a.calls, 1);
    char *q = kvr_malloc(&a, 5000);
    ck_assert_ptr_nonnull(q);
    size_t two = one + malloc_usable_size(q) + sizeof(size_t);
    ck_assert_uint_eq(a.live_bytes, two);
    ck_assert_uint_eq(a.peak_bytes, two);
    ck_assert_uint_eq(a.live_allocs, 2);
    kvr_free(&a, q);
    ck_assert_uint_eq(a.live_bytes, one);
    ck_assert_uint_eq(a.peak_bytes, two); /* the high-water mark stays */
    kvr_free(&a, p);
    kvr_free(&a, NULL); /* no-op */
    ck_assert_uint_eq(a.live_bytes, 0);
    ck_assert_uint_eq(a.live_allocs, 0);
    ck_assert_uint_eq(a.peak_bytes, two);
    /* size 0 allocates nothing and is not a call */
    ck_assert_ptr_null(kvr_malloc(&a, 0));
    ck_assert_uint_eq(a.calls, 2);
}
END_TEST

START_TEST(calloc_zero_and_overflow)
{
    kvr_alloc_t a;
    kvr_alloc_init(&a);
    uint32_t *p = kvr_calloc(&a, 1000, sizeof(uint32_t));
    ck_assert_ptr_nonnull(p);
    for (int i = 0; i < 1000; i++)
        ck_assert_uint_eq(p[i], 0);
    ck_assert_uint_eq(a.live_allocs, 1);
    /* n * size overflowing is refused before any allocation */
    ck_assert_ptr_null(kvr_calloc(&a, SIZE_MAX / 2, 4));
    ck_assert_uint_eq(a.calls, 1);
    ck_assert_uint_eq(a.live_allocs, 1);
    kvr_free(&a, p);
    ck_assert_uint_eq(a.live_bytes, 0);
}
END_TEST

START_TEST(realloc_accounting)
{
    kvr_alloc_t a;
    kvr_alloc_init(&a);
    /* NULL behaves as malloc */
    char *p = kvr_realloc(&a, NULL, 32);
    ck_assert_ptr_nonnull(p);
    ck_assert_uint_eq(a.calls, 1);
    memcpy(p, "0123456789abcdef0123456789abcde", 32);
    /* growing is a call; contents kept; bytes follow the new chunk */
    p = kvr_realloc(&a, p, 4096);
    ck_assert_ptr_nonnull(p);
    ck_assert_uint_eq(a.calls, 2);
    ck_assert(memcmp(p, "0123456789abcdef0123456789abcde", 32) == 0);
    ck_assert_uint_eq(a.live_bytes, malloc_usable_size(p) + sizeof(size_t));
    ck_assert_uint_eq(a.live_allocs, 1);
    /* shrinking within the chunk is not a call and cannot be made to fail */
    kvr_alloc_fail_after(&a, 1);
    char *q = kvr_realloc(&a, p, 16);
    ck_assert_ptr_nonnull(q);
    ck_assert_uint_eq(a.calls, 2);
    ck_assert_uint_eq(a.failures, 0);
    ck_assert_uint_eq(a.live_bytes, malloc_usable_size(q) + sizeof(size_t));
    /* ... but the armed failure hits the next growing call, and p stays valid and owned */
    char *r = kvr_realloc(&a, q, 1 << 20);
    ck_assert_ptr_null(r);
    ck_assert_uint_eq(a.failures, 1);
    ck_assert(memcmp(q, "0123456789abcdef", 16) == 0);
    ck_assert_uint_eq(a.live_allocs, 1);
    /* size 0 frees */
    ck_assert_ptr_null(kvr_realloc(&a, q, 0));
    ck_assert_uint_eq(a.live_allocs, 0);
    ck_assert_uint_eq(a.live_bytes, 0);
}
END_TEST

START_TEST(fail_after_semantics)
{
    kvr_alloc_t a;
    kvr_alloc_init(&a);
    void *keep[8];
    /* n counts from now: the 3rd call from here fails, only that one. */
    keep[0] = kvr_malloc(&a, 8);
    kvr_alloc_fail_after(&a, 3);
    ck_assert_uint_eq(a.fail_at, 4);
    keep[1] = kvr_malloc(&a, 8);
    keep[2] = kvr_calloc(&a, 2, 8);
    ck_assert_ptr_nonnull(keep[1]);
    ck_assert_ptr_nonnull(keep[2]);
    ck_assert_ptr_null(kvr_malloc(&a, 8));
    ck_assert_uint_eq(a.failures, 1);
    ck_assert_uint_eq(a.calls, 4);       /* the failed call is counted */
    ck_assert_uint_eq(a.live_allocs, 3); /* and allocates nothing */
    keep[3] = kvr_malloc(&a, 8);         /* one-shot: the next succeeds */
    ck_assert_ptr_nonnull(keep[3]);
    ck_assert_uint_eq(a.failures, 1);
    /* 1 = the very next call; 0 disarms */
    kvr_alloc_fail_after(&a, 1);
    ck_assert_ptr_null(kvr_realloc(&a, NULL, 8));
    kvr_alloc_fail_after(&a, 1);
    kvr_alloc_fail_after(&a, 0);
    keep[4] = kvr_malloc(&a, 8);
    ck_assert_ptr_nonnull(keep[4]);
    ck_assert_uint_eq(a.failures, 2);
    for (int i = 0; i < 5; i++)
        kvr_free(&a, keep[i]);
    ck_assert_uint_eq(a.live_allocs, 0);
    ck_assert_uint_eq(a.live_bytes, 0);
}
END_TEST

START_TEST(two_allocators_are_independent)
{
    kvr_alloc_t a, b;
    kvr_alloc_init(&a);
    kvr_alloc_init(&b);
    kvr_alloc_fail_after(&a, 1);
    void *p = kvr_malloc(&b, 64);
    ck_assert_ptr_nonnull(p);
    ck_assert_uint_eq(a.calls, 0);
    ck_assert_uint_eq(a.live_bytes, 0);
    ck_assert_ptr_null(kvr_malloc(&a, 64));
    ck_assert_uint_eq(b.failures, 0);
    kvr_free(&b, p);
    ck_assert_uint_eq(b.live_bytes, 0);
}
END_TEST

Suite *alloc_suite(void);

Suite *alloc_suite(void)
{
    Suite *s = suite_create("alloc");
    TCase *tc = tcase_create("api");
    tcase_add_test(tc, init_is_zero);
    tcase_add_test(tc, bytes_include_the_chunk);
    tcase_add_test(tc, calloc_zero_and_overflow);
    tcase_add_test(tc, realloc_accounting);
    tcase_add_test(tc, two_allocators_are_independent);
    suite_add_tcase(s, tc);
    tc = tcase_create("oom");
    tcase_add_test(tc, fail_after_semantics);
    suite_add_tcase(s, tc);
    return s;
}
