/* test_ckf_producer.c - exact ownership, refcounts, omissions, dirty tracking
 * (engine/src/ckf_producer.c). SPDX-License-Identifier: Apache-2.0 */
#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "kvr/ckf.h"
#include "kvr/ckf_producer.h"
#include "kvr/err.h"
#include "kvr_test.h"

Suite *ckf_producer_suite(void);

static kvr_ckf_producer_t *make_producer(uint64_t buckets)
{
    struct kvr_ckf_producer_config cfg;
    kvr_ckf_producer_config_init(&cfg);
    cfg.filter.num_buckets = buckets;
    cfg.dc_worker_id = 42;
    kvr_ckf_producer_t *p = NULL;
    ck_assert_int_eq(kvr_ckf_producer_new(&cfg, &p), KVR_OK);
    return p;
}

static uint64_t fp_count(const kvr_ckf_producer_t *p)
{
    struct kvr_ckf_view v;
    kvr_ckf_view(kvr_ckf_producer_filter(p), &v);
    return kvr_ckf_view_count(&v);
}

static void words(const kvr_ckf_producer_t *p, uint64_t *out)
{
    struct kvr_ckf_view v;
    kvr_ckf_view(kvr_ckf_producer_filter(p), &v);
    for (uint64_t b = 0; b <= v.mask; b++)
        out[b] = kvr_ckf_view_get(&v, b);
}

START_TEST(test_refcount_transitions)
{
    kvr_ckf_producer_t *p = make_producer(1024);
    const kvr_ckf_t *f = kvr_ckf_producer_filter(p);
    uint64_t h = 9510318385840434533ULL;
    struct kvr_ckf_apply_result r;
    memset(&r, 0, sizeof(r));
    ck_assert_int_eq(kvr_ckf_producer_store(p, 7, 0, &h, 1, &r), KVR_OK);
    ck_assert_uint_eq(r.inserted, 1);
    ck_assert_int_eq(kvr_ckf_producer_store(p, 8, 1, &h, 1, &r), KVR_OK); /* 1 -> 2: nothing */
    ck_assert_uint_eq(r.inserted, 1);
    ck_assert_int_eq(kvr_ckf_producer_store(p, 8, 1, &h, 1, &r), KVR_OK); /* duplicate */
    ck_assert_uint_eq(r.duplicates, 1);
    ck_assert_uint_eq(kvr_ckf_producer_refcount(p, h), 2);
    ck_assert_uint_eq(fp_count(p), 1);
    ck_assert_int_eq(kvr_ckf_producer_remove(p, 9, 0, &h, 1, &r), KVR_OK); /* unknown member */
    ck_assert_int_eq(kvr_ckf_producer_remove(p, 7, 1, &h, 1, &r), KVR_OK); /* unknown rank */
    ck_assert_uint_eq(r.unknown, 2);
    ck_assert_int_eq(kvr_ckf_producer_remove(p, 7, 0, &h, 1, &r), KVR_OK); /* 2 -> 1 */
    ck_assert_int_eq(kvr_ckf_contains(f, h), 1);
    ck_assert_int_eq(kvr_ckf_producer_remove(p, 7, 0, &h, 1, &r), KVR_OK); /* now unknown */
    ck_assert_uint_eq(r.unknown, 3);
    ck_assert_int_eq(kvr_ckf_contains(f, h), 1);
    ck_assert_int_eq(kvr_ckf_producer_remove(p, 8, 1, &h, 1, &r), KVR_OK); /* 1 -> 0 */
    ck_assert_int_eq(kvr_ckf_contains(f, h), 0);
    ck_assert_uint_eq(r.deleted, 1);
    ck_assert_uint_eq(fp_count(p), 0);
    struct kvr_ckf_producer_stats st;
    kvr_ckf_producer_stats(p, &st);
    ck_assert_uint_eq(st.members, 2);
    ck_assert_uint_eq(st.edges, 0);
    ck_assert_uint_eq(st.distinct, 0);
    ck_assert_uint_gt(st.exact_bytes, 0);
    ck_assert_uint_eq(st.filter_bytes, 8192);
    kvr_ckf_producer_free(p);
}
END_TEST

/* Distinct full hashes colliding in (fp, bucket a) keep separate copies. */
START_TEST(test_colliding_hashes_separate_copies)
{
    kvr_ckf_producer_t *p = make_producer(2);
    /* find two hashes with the same fingerprint (buckets coincide in a 2-bucket table or are
     * each other's alternates; either way they share both candidate buckets) */
    static uint64_t seen[65536];
    memset(seen, 0, sizeof(seen));
    uint64_t h1 = 0, h2 = 0;
    for (uint64_t h = 1; h2 == 0; h++) {
        struct kvr_ckf_key k;
        kvr_ckf_key_make(h, KVR_CKF_DEFAULT_SEED, &k);
        if (seen[k.fp] != 0) {
            h1 = seen[k.fp];
            h2 = h;
        }
        seen[k.fp] = h;
    }
    ck_assert_int_eq(kvr_ckf_producer_store(p, 1, 0, &h1, 1, NULL), KVR_OK);
    ck_assert_int_eq(kvr_ckf_producer_store(p, 1, 0, &h2, 1, NULL), KVR_OK);
    ck_assert_uint_eq(fp_count(p), 2);
    ck_assert_int_eq(kvr_ckf_producer_remove(p, 1, 0, &h1, 1, NULL), KVR_OK);
    ck_assert_uint_eq(fp_count(p), 1);
    ck_assert_int_eq(kvr_ckf_contains(kvr_ckf_producer_filter(p), h2), 1);
    kvr_ckf_producer_free(p);
}
END_TEST

START_TEST(test_omission_leaves_table)
{
    kvr_ckf_producer_t *p = make_producer(2); /* 8 slots */
    uint64_t before[2], after[2];
    uint8_t frame[4096];
    size_t len;
    uint64_t stored = 0, h = 1000;
    struct kvr_ckf_apply_result r;
    memset(&r, 0, sizeof(r));
    while (r.omitted == 0) {
        ck_assert_int_eq(kvr_ckf_producer_delta(p, frame, sizeof(frame), &len), KVR_OK);
        words(p, before);
        int rc = kvr_ckf_producer_store(p, 3, 0, &h, 1, &r);
        if (rc == KVR_OK) {
            stored++;
        } else {
            ck_assert_int_eq(rc, KVR_ECAPACITY);
            words(p, after);
            ck_assert(memcmp(before, after, sizeof(before)) == 0);
            ck_assert_int_eq(kvr_ckf_producer_owns(p, 3, 0, h), 0); /* no ownership edge */
            ck_assert_uint_eq(kvr_ckf_producer_refcount(p, h), 0);
            struct kvr_ckf_producer_stats st;
            kvr_ckf_producer_stats(p, &st);
            ck_assert_uint_eq(st.pending, 0); /* no dirty bucket */
            ck_assert_uint_eq(st.omissions, 1);
            /* a later removal of the omitted hash is an unknown no-op */
            ck_assert_int_eq(kvr_ckf_producer_remove(p, 3, 0, &h, 1, &r), KVR_OK);
            ck_assert_uint_eq(r.unknown, 1);
            words(p, after);
            ck_assert(memcmp(before, after, sizeof(before)) == 0);
        }
        h++;
    }
    ck_assert_uint_le(stored, 8);
    ck_assert_uint_eq(fp_count(p), stored);
    /* siblings of a failing block stay applied: free a slot, then store [new, omitted-again] */
    uint64_t first = 1000;
    ck_assert_int_eq(kvr_ckf_producer_remove(p, 3, 0, &first, 1, NULL), KVR_OK);
    uint64_t pair[2] = {h + 1, h + 2};
    memset(&r, 0, sizeof(r));
    int rc = kvr_ckf_producer_store(p, 3, 0, pair, 2, &r);
    ck_assert_uint_eq(r.edges_added + r.omitted, 2);
    ck_assert(rc == KVR_OK || rc == KVR_ECAPACITY);
    kvr_ckf_producer_free(p);
}
END_TEST

START_TEST(test_clear_and_remove_worker)
{
    kvr_ckf_producer_t *p = make_producer(1024);
    uint64_t a[3] = {11, 12, 13}, b[2] = {12, 14};
    ck_assert_int_eq(kvr_ckf_producer_store(p, 7, 0, a, 3, NULL), KVR_OK);
    ck_assert_int_eq(kvr_ckf_producer_store(p, 7, 1, b, 2, NULL), KVR_OK);
    ck_assert_int_eq(kvr_ckf_producer_store(p, 8, 0, b, 2, NULL), KVR_OK);
    ck_assert_uint_eq(fp_count(p), 4);
    ck_assert_int_eq(kvr_ckf_producer_clear_member(p, 7, 0, NULL), KVR_OK);
    ck_assert_uint_eq(fp_count(p), 2); /* 11, 13 gone; 12, 14 still owned */
    ck_assert_int_eq(kvr_ckf_producer_clear_member(p, 9, 0, NULL), KVR_ENOTFOUND);
    ck_assert_int_eq(kvr_ckf_producer_remove_worker(p, 7, NULL), KVR_OK);
    ck_assert_uint_eq(fp_count(p), 2); /* 8 still owns 12, 14 */
    ck_assert_int_eq(kvr_ckf_producer_remove_worker(p, 7, NULL), KVR_ENOTFOUND);
    struct kvr_event ev;
    memset(&ev, 0, sizeof(ev));
    ev.worker_id = 8;
    ev.kind = KVR_EVENT_CLEARED;
    ck_assert_int_eq(kvr_ckf_producer_apply(p, &ev, NULL), KVR_OK);
    ck_assert_uint_eq(fp_count(p), 0);
    ev.worker_id = 99; /* cleared of an unknown member is fine */
    ck_assert_int_eq(kvr_ckf_producer_apply(p, &ev, NULL), KVR_OK);
    struct kvr_block blocks[2] = {{5, 1}, {6, 2}};
    ev.kind = KVR_EVENT_STORED;
    ev.blocks = blocks;
    ev.n = 2;
    ck_assert_int_eq(kvr_ckf_producer_apply(p, &ev, NULL), KVR_OK);
    ck_assert_int_eq(kvr_ckf_producer_owns(p, 99, 0, 6), 1);
    uint64_t rm[2] = {6, 77};
    ev.kind = KVR_EVENT_REMOVED;
    ev.blocks = NULL;
    ev.hashes = rm;
    struct kvr_ckf_apply_result r;
    memset(&r, 0, sizeof(r));
    ck_assert_int_eq(kvr_ckf_producer_apply(p, &ev, &r), KVR_OK);
    ck_assert_uint_eq(r.unknown, 1);
    ck_assert_uint_eq(fp_count(p), 1);
    kvr_ckf_producer_free(p);
}
END_TEST

START_TEST(test_snapshot_barrier)
{
    kvr_ckf_producer_t *p = make_producer(64);
    uint8_t buf[4096];
    size_t len = 0;
    ck_assert_uint_eq(kvr_ckf_producer_snapshot_chunks(p), 1);
    ck_assert_int_eq(kvr_ckf_producer_snapshot(p, 0, buf, sizeof(buf), &len), KVR_OK);
    ck_assert_uint_eq(len, kvr_ckf_producer_snapshot_len(p, 0));
    uint64_t h = 5;
    ck_assert_int_eq(kvr_ckf_producer_store(p, 1, 0, &h, 1, NULL), KVR_OK);
    ck_assert_int_eq(kvr_ckf_producer_snapshot(p, 0, buf, sizeof(buf), &len), KVR_EBUSY);
    ck_assert_int_eq(kvr_ckf_producer_delta(p, buf, 10, &len), KVR_ERANGE);
    ck_assert_int_eq(kvr_ckf_producer_delta(p, buf, sizeof(buf), &len), KVR_OK);
    ck_assert_uint_eq(len, 48 + 12 + 12);
    struct kvr_ckf_producer_stats st;
    kvr_ckf_producer_stats(p, &st);
    ck_assert_uint_eq(st.epoch, 1);
    ck_assert_uint_eq(st.pending, 0);
    ck_assert_int_eq(kvr_ckf_producer_snapshot(p, 0, buf, sizeof(buf), &len), KVR_OK);
    ck_assert_int_eq(kvr_ckf_producer_snapshot(p, 1, buf, sizeof(buf), &len), KVR_EINVAL);
    kvr_ckf_producer_free(p);
}
END_TEST

/* The exact side is consistent after any allocation failure: refcount = owners, one fingerprint
 * per distinct hash, every owned hash found. */
START_TEST(test_oom_consistency)
{
    uint64_t seed = kvr_test_seed(31337);
    for (uint64_t fail = 1; fail < 400; fail++) {
        struct kvr_test_rng r = {seed};
        kvr_ckf_producer_t *p = make_producer(4096);
        kvr_alloc_fail_after(kvr_ckf_producer_allocator(p), fail);
        int saw_nomem = 0;
        for (int op = 0; op < 600; op++) {
            uint64_t w = kvr_test_below(&r, 6), h = kvr_test_below(&r, 300) + 1;
            int rc;
            if (kvr_test_below(&r, 3) == 0)
                rc = kvr_ckf_producer_remove(p, w, 0, &h, 1, NULL);
            else
                rc = kvr_ckf_producer_store(p, w, 0, &h, 1, NULL);
            saw_nomem |= rc == KVR_ENOMEM;
            ck_assert(rc == KVR_OK || rc == KVR_ENOMEM);
        }
        uint64_t distinct = 0;
        for (uint64_t h = 1; h <= 300; h++) {
            uint64_t owners = 0;
            for (uint64_t w = 0; w < 6; w++)
                owners += (uint64_t)kvr_ckf_producer_owns(p, w, 0, h);
            ck_assert_msg(kvr_ckf_producer_refcount(p, h) == owners,
                          "seed %llu fail %llu: refcount", (unsigned long long)seed,
                          (unsigned long long)fail);
            if (owners > 0) {
                distinct++;
                ck_assert(kvr_ckf_contains(kvr_ckf_producer_filter(p), h));
            }
        }
        ck_assert_uint_eq(fp_count(p), distinct);
        kvr_ckf_producer_free(p);
        if (!saw_nomem)
            break; /* the failure index is past every allocation of the workload */
    }
}
END_TEST

Suite *ckf_producer_suite(void)
{
    Suite *s = suite_create("ckf_producer");
    TCase *api = tcase_create("api");
    tcase_add_test(api, test_refcount_transitions);
    tcase_add_test(api, test_clear_and_remove_worker);
    tcase_add_test(api, test_snapshot_barrier);
    suite_add_tcase(s, api);
    TCase *edge = tcase_create("edge");
    tcase_add_test(edge, test_colliding_hashes_separate_copies);
    tcase_add_test(edge, test_omission_leaves_table);
    suite_add_tcase(s, edge);
    TCase *oom = tcase_create("oom");
    tcase_add_test(oom, test_oom_consistency);
    suite_add_tcase(s, oom);
    return s;
}
