/* test_approx.c - approximate mode: TTL expiry, refresh on re-recording, leaf-first pruning. */
#include <check.h>
#include <stdlib.h>

#include "kvr/approx.h"
#include "kvr/err.h"

static uint32_t overlap(kvr_index_t *idx, const uint64_t *q, size_t n, uint64_t w)
{
    struct kvr_match m[16];
    size_t nm;
    ck_assert_int_eq(kvr_index_find_matches(idx, q, n, 0, m, 16, &nm), KVR_OK);
    for (size_t i = 0; i < nm; i++)
        if (m[i].worker_id == w)
            return m[i].blocks;
    return 0;
}

START_TEST(ttl_and_refresh)
{
    kvr_index_t *idx;
    kvr_approx_t *a;
    struct kvr_approx_config cfg = {.ttl_ms = 1000};
    ck_assert_int_eq(kvr_index_new(NULL, &idx), KVR_OK);
    ck_assert_int_eq(kvr_approx_new(idx, &cfg, &a), KVR_OK);
    uint64_t q[4] = {11, 12, 13, 14};
    ck_assert_int_eq(kvr_approx_record(a, 1, 0, q, 4, 0), KVR_OK);
    ck_assert_int_eq(kvr_approx_record(a, 2, 0, q, 2, 500), KVR_OK);
    ck_assert_uint_eq(overlap(idx, q, 4, 1), 4);
    ck_assert_uint_eq(overlap(idx, q, 4, 2), 2);
    /* Worker 1 refreshes its first two blocks at 800. */
    ck_assert_int_eq(kvr_approx_record(a, 1, 0, q, 2, 800), KVR_OK);
    ck_assert_uint_eq(kvr_approx_expire(a, 999), 0);
    ck_assert_uint_eq(kvr_approx_expire(a, 1000), 2); /* blocks 13, 14 of worker 1 */
    ck_assert_uint_eq(overlap(idx, q, 4, 1), 2);
    ck_assert_uint_eq(kvr_approx_expire(a, 1500), 2); /* worker 2 */
    ck_assert_uint_eq(overlap(idx, q, 4, 2), 0);
    ck_assert_uint_eq(overlap(idx, q, 4, 1), 2);
    ck_assert_uint_eq(kvr_approx_expire(a, 1800), 2);
    ck_assert_uint_eq(overlap(idx, q, 4, 1), 0);
    struct kvr_approx_stats st;
    kvr_approx_stats(a, &st);
    ck_assert_uint_eq(st.recorded_blocks, 8);
    ck_assert_uint_eq(st.expired_blocks, 6);
    ck_assert_uint_eq(st.tracked, 0);
    /* The sequence hashes are Dynamo's chain: the root block's hash is its local hash. */
    struct kvr_event_list l;
    kvr_event_list_init(&l);
    ck_assert_int_eq(kvr_approx_record(a, 3, 0, q, 2, 2000), KVR_OK);
    ck_assert_int_eq(kvr_index_dump(idx, &l), KVR_OK);
    ck_assert_uint_eq(l.n, 1);
    ck_assert_uint_eq(l.ev[0].blocks[0].block_hash, 11);
    kvr_event_list_free(&l);
    kvr_approx_free(a);
    kvr_index_free(idx);
}
END_TEST

START_TEST(prune_earliest_then_deepest)
{
    kvr_index_t *idx;
    kvr_approx_t *a;
    struct kvr_approx_config cfg = {.ttl_ms = 100000, .max_blocks = 10, .prune_ratio = 0.8};
    ck_assert_int_eq(kvr_index_new(NULL, &idx), KVR_OK);
    ck_assert_int_eq(kvr_approx_new(idx, &cfg, &a), KVR_OK);
    uint64_t c1[5] = {1, 2, 3, 4, 5}, c2[5] = {6, 7, 8, 9, 10}, c3[3] = {11, 12, 13};
    ck_assert_int_eq(kvr_approx_record(a, 1, 0, c1, 5, 0), KVR_OK);
    ck_assert_int_eq(kvr_approx_record(a, 1, 0, c2, 5, 10), KVR_OK);
    ck_assert_uint_eq(overlap(idx, c1, 5, 1), 5);
    /* 13 > 10: prune to 8, oldest chain first, leaves first. */
    ck_assert_int_eq(kvr_approx_record(a, 1, 0, c3, 3, 20), KVR_OK);
    struct kvr_index_stats st;
    kvr_index_stats(idx, &st);
    ck_assert_uint_eq(st.radix.block_ranks, 8);
    ck_assert_uint_eq(overlap(idx, c1, 5, 1), 0);
    ck_assert_uint_eq(overlap(idx, c2, 5, 1), 5);
    ck_assert_uint_eq(overlap(idx, c3, 3, 1), 3);
    struct kvr_approx_stats as;
    kvr_approx_stats(a, &as);
    ck_assert_uint_eq(as.pruned_blocks, 5);
    kvr_approx_forget_worker(a, 1);
    kvr_approx_stats(a, &as);
    ck_assert_uint_eq(as.tracked, 0);
    kvr_approx_free(a);
    kvr_index_free(idx);
}
END_TEST

START_TEST(prune_keeps_prefixes)
{
    /* With one long chain beyond the limit, pruning removes its tail: a prefix remains. */
    kvr_index_t *idx;
    kvr_approx_t *a;
    struct kvr_approx_config cfg = {.ttl_ms = 1000, .max_blocks = 100, .prune_ratio = 0.5};
    ck_assert_int_eq(kvr_index_new(NULL, &idx), KVR_OK);
    ck_assert_int_eq(kvr_approx_new(idx, &cfg, &a), KVR_OK);
    uint64_t c[150];
    for (int i = 0; i < 150; i++)
        c[i] = 1000 + (uint64_t)i;
    ck_assert_int_eq(kvr_approx_record(a, 4, 1, c, 150, 0), KVR_OK);
    ck_assert_uint_eq(overlap(idx, c, 150, 4), 50);
    kvr_approx_free(a);
    kvr_index_free(idx);
}
END_TEST

struct seen {
    uint64_t worker[4];
    size_t n[4];
    uint64_t first[4];
    size_t calls;
};

static void watch(void *ctx, uint64_t worker_id, uint32_t dp_rank, const uint64_t *locals, size_t n,
                  uint64_t now_ms)
{
    struct seen *s = ctx;
    (void)dp_rank;
    (void)now_ms;
    if (s->calls < 4) {
        s->worker[s->calls] = worker_id;
        s->n[s->calls] = n;
        s->first[s->calls] = locals[0];
    }
    s->calls++;
}

START_TEST(observer_and_quiet_records)
{
    /* Replica sync: a recording is reported to the observer; a replayed (quiet) one is applied
     * the same way but not reported, so replicas do not echo each other. */
    kvr_index_t *idx;
    kvr_approx_t *a;
    struct seen seen = {0};
    struct kvr_approx_config cfg = {.ttl_ms = 1000, .observer = watch, .observer_ctx = &seen};
    ck_assert_int_eq(kvr_index_new(NULL, &idx), KVR_OK);
    ck_assert_int_eq(kvr_approx_new(idx, &cfg, &a), KVR_OK);
    uint64_t q[3] = {21, 22, 23};
    ck_assert_int_eq(kvr_approx_record(a, 1, 0, q, 3, 0), KVR_OK);
    ck_assert_int_eq(kvr_approx_record_quiet(a, 2, 0, q, 2, 0), KVR_OK);
    ck_assert_int_eq(kvr_approx_record(a, 3, 0, q, 0, 0), KVR_OK); /* nothing recorded */
    ck_assert_uint_eq(seen.calls, 1);
    ck_assert_uint_eq(seen.worker[0], 1);
    ck_assert_uint_eq(seen.n[0], 3);
    ck_assert_uint_eq(seen.first[0], 21);
    ck_assert_uint_eq(overlap(idx, q, 3, 2), 2);          /* the quiet one is in the index */
    ck_assert_uint_eq(kvr_approx_expire(a, 1000), 3 + 2); /* and expires like the others */
    kvr_approx_free(a);
    kvr_index_free(idx);
}
END_TEST

START_TEST(prune_over_a_ckf_index)
{
    /* The size limit counts (block, rank) entries of whatever index backs the recorder: a
     * CKF-only index has no tree, its ownership entries are the measure. */
    kvr_index_t *idx;
    kvr_approx_t *a;
    struct kvr_index_config ic = {.kind = KVR_INDEX_CKF};
    struct kvr_approx_config cfg = {.ttl_ms = 100000, .max_blocks = 8, .prune_ratio = 0.5};
    ck_assert_int_eq(kvr_index_new(&ic, &idx), KVR_OK);
    ck_assert_int_eq(kvr_approx_new(idx, &cfg, &a), KVR_OK);
    for (uint64_t w = 1; w <= 3; w++) {
        uint64_t q[4] = {w * 100 + 1, w * 100 + 2, w * 100 + 3, w * 100 + 4};
        ck_assert_int_eq(kvr_approx_record(a, w, 0, q, 4, w), KVR_OK);
    }
    struct kvr_approx_stats st;
    kvr_approx_stats(a, &st);
    struct kvr_index_stats is;
    kvr_index_stats(idx, &is);
    ck_assert_uint_gt(st.pruned_blocks, 0);
    ck_assert_uint_le(is.ckf.blocks, 8);
    ck_assert_uint_eq(st.tracked, is.ckf.blocks);
    kvr_approx_free(a);
    kvr_index_free(idx);
}
END_TEST

Suite *approx_suite(void);

Suite *approx_suite(void)
{
    Suite *s = suite_create("approx");
    TCase *tc = tcase_create("api");
    tcase_add_test(tc, ttl_and_refresh);
    tcase_add_test(tc, prune_earliest_then_deepest);
    tcase_add_test(tc, prune_keeps_prefixes);
    tcase_add_test(tc, observer_and_quiet_records);
    tcase_add_test(tc, prune_over_a_ckf_index);
    suite_add_tcase(s, tc);
    return s;
}
