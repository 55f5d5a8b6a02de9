/* test_ckf_frame.c - CKF1 frames, rejection rules and the consumer lane state machine
 * (engine/src/ckf_frame.c). SPDX-License-Identifier: Apache-2.0 */
#include <check.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "kvr/ckf.h"
#include "kvr/ckf_frame.h"
#include "kvr/ckf_producer.h"
#include "kvr/ckf_search.h"
#include "kvr/err.h"
#include "kvr/hash.h"
#include "kvr_test.h"

Suite *ckf_frame_suite(void);

static size_t from_hex(const char *hex, uint8_t *out)
{
    size_t n = 0;
    for (const char *p = hex; *p != '\0';) {
        if (*p == ' ' || *p == '\n') {
            p++;
            continue;
        }
        unsigned v;
        ck_assert_int_eq(sscanf(p, "%2x", &v), 1);
        out[n++] = (uint8_t)v;
        p += 2;
    }
    return n;
}

/* Recomputes the body checksum after a test edits the body. */
static void reseal(uint8_t *buf, size_t len)
{
    uint32_t c = (uint32_t)XXH3_64bits_withSeed(buf + 48, len - 48, 0);
    for (int i = 0; i < 4; i++)
        buf[44 + i] = (uint8_t)(c >> (8 * i));
}

static const char *const example_hex =
    "434b4631 0100 0100 10 04 0000 334ab5d166ceee5d 0004000000000000 0700000000000000 "
    "0800000000000000 5e036590"
    "0700000000000000 01000000 a1030000 8ee1 0000 0000 0000";

/* ==== api ===================================================================================== */

START_TEST(test_constructed_example)
{
    /* ckf.md §10: delta, seed 0x5DEECE66D1B54A33, 1024 buckets, dc_worker_id 7, epoch 8,
     * base_epoch 7, bucket 929 = [0xe18e, 0, 0, 0]. */
    static _Atomic uint64_t words[1024];
    for (int i = 0; i < 1024; i++)
        atomic_store(&words[i], 0);
    atomic_store(&words[929], 0xe18e);
    struct kvr_ckf_view v = {words, 1023, KVR_CKF_DEFAULT_SEED, 1, 0};
    uint8_t want[128], got[128];
    size_t want_len = from_hex(example_hex, want), len = 0;
    ck_assert_uint_eq(want_len, 72);
    uint64_t buckets[1] = {929};
    ck_assert_int_eq(kvr_ckf_frame_encode_delta(&v, 7, 7, buckets, 1, got, sizeof(got), &len),
                     KVR_OK);
    ck_assert_uint_eq(len, 72);
    ck_assert(memcmp(got, want, len) == 0);
    struct kvr_ckf_frame f;
    const char *why = NULL;
    ck_assert_int_eq(kvr_ckf_frame_decode(want, want_len, &f, &why), KVR_OK);
    ck_assert_uint_eq(f.flags, KVR_CKF_FRAME_DELTA);
    ck_assert_uint_eq(f.seed, KVR_CKF_DEFAULT_SEED);
    ck_assert_uint_eq(f.num_buckets, 1024);
    ck_assert_uint_eq(f.dc_worker_id, 7);
    ck_assert_uint_eq(f.epoch, 8);
    ck_assert_uint_eq(f.base_epoch, 7);
    ck_assert_uint_eq(f.checksum, 0x9065035e);
    ck_assert_uint_eq(f.count, 1);
    uint32_t b;
    uint64_t w;
    kvr_ckf_frame_delta_entry(&f, 0, &b, &w);
    ck_assert_uint_eq(b, 929);
    ck_assert_uint_eq(w, 0xe18e);
    /* encoder argument checks */
    uint64_t unsorted[2] = {5, 5};
    ck_assert_int_eq(kvr_ckf_frame_encode_delta(&v, 7, 7, unsorted, 2, got, sizeof(got), &len),
                     KVR_EINVAL);
    uint64_t out_of_range[1] = {1024};
    ck_assert_int_eq(kvr_ckf_frame_encode_delta(&v, 7, 7, out_of_range, 1, got, sizeof(got), &len),
                     KVR_EINVAL);
    ck_assert_int_eq(kvr_ckf_frame_encode_delta(&v, 7, UINT64_MAX, NULL, 0, got, sizeof(got), &len),
                     KVR_EINVAL);
    ck_assert_int_eq(kvr_ckf_frame_encode_delta(&v, 7, 7, buckets, 1, got, 71, &len), KVR_ERANGE);
}
END_TEST

START_TEST(test_snapshot_chunks)
{
    const uint64_t nb = (uint64_t)KVR_CKF_CHUNK_BUCKETS * 2; /* two chunks */
    kvr_ckf_table_t *t = NULL;
    ck_assert_int_eq(kvr_ckf_table_new(1, nb, 99, &t), KVR_OK);
    struct kvr_ckf_view v;
    kvr_ckf_table_view(t, 0, &v);
    kvr_ckf_view_put(&v, 0, 0x1111);
    kvr_ckf_view_put(&v, nb - 1, 0x2222000000000000ULL);
    ck_assert_uint_eq(kvr_ckf_frame_chunk_count(nb), 2);
    ck_assert_uint_eq(kvr_ckf_frame_chunk_count(4), 1);
    ck_assert_uint_eq(kvr_ckf_frame_snapshot_len(nb, 2), 0);
    size_t cap = kvr_ckf_frame_snapshot_len(nb, 0), len;
    ck_assert_uint_eq(cap, 48 + 16 + 8 * (size_t)KVR_CKF_CHUNK_BUCKETS);
    uint8_t *buf = malloc(cap);
    ck_assert_int_eq(kvr_ckf_frame_encode_snapshot(&v, 3, 17, 2, buf, cap, &len), KVR_EINVAL);
    for (uint32_t c = 0; c < 2; c++) {
        ck_assert_int_eq(kvr_ckf_frame_encode_snapshot(&v, 3, 17, c, buf, cap, &len), KVR_OK);
        struct kvr_ckf_frame f;
        ck_assert_int_eq(kvr_ckf_frame_decode(buf, len, &f, NULL), KVR_OK);
        ck_assert_uint_eq(f.flags, KVR_CKF_FRAME_SNAPSHOT);
        ck_assert_uint_eq(f.chunk_index, c);
        ck_assert_uint_eq(f.chunk_count, 2);
        ck_assert_uint_eq(f.bucket_offset, (uint64_t)c * KVR_CKF_CHUNK_BUCKETS);
        ck_assert_uint_eq(f.epoch, 17);
        ck_assert_uint_eq(f.seed, 99);
        if (c == 0)
            ck_assert_uint_eq(kvr_ckf_frame_chunk_word(&f, 0), 0x1111);
        else
            ck_assert_uint_eq(kvr_ckf_frame_chunk_word(&f, KVR_CKF_CHUNK_BUCKETS - 1),
                              0x2222000000000000ULL);
    }
    /* slots are 4 × le16 in slot order */
    ck_assert_uint_eq(buf[len - 2], 0x22);
    ck_assert_uint_eq(buf[len - 1], 0x22);
    free(buf);
    kvr_ckf_table_free(t);
}
END_TEST

/* Every rejection rule of ckf.md §10, with the reason. */
START_TEST(test_decode_rejections)
{
    uint8_t base[128], b[160];
    size_t n = from_hex(example_hex, base);
    struct kvr_ckf_frame f;
    const char *why;
    struct {
        int off;
        uint8_t val;
        int reseal;
        const char *reason;
    } cases[] = {
        {0, 'X', 0, "bad magic"},
        {4, 2, 0, "unsupported version"},
        {6, 3, 0, "unknown frame flags"},
        {8, 8, 0, "fingerprint bits"},
        {9, 2, 0, "slots per bucket"},
        {10, 1, 0, "reserved"},
        {21, 0x05, 0, "power of two"},      /* 1024 -> 1029 */
        {48 + 20, 0x8f, 0, "checksum"},     /* body edit without reseal */
        {44, 0x00, 0, "checksum"},          /* checksum edit */
        {36, 9, 0, "epoch"},                /* header epoch 9 != base 7 + 1 */
        {48 + 13, 0x04, 1, "out of range"}, /* bucket 929 -> 1185 */
        {48 + 8, 2, 1, "length"},           /* count 2, one entry */
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        memcpy(b, base, n);
        b[cases[i].off] = cases[i].val;
        if (cases[i].reseal)
            reseal(b, n);
        why = "";
        ck_assert_int_eq(kvr_ckf_frame_decode(b, n, &f, &why), KVR_ECORRUPT);
        ck_assert_msg(strstr(why, cases[i].reason) != NULL, "case %zu: '%s' lacks '%s'", i, why,
                      cases[i].reason);
    }
    /* truncation and trailing bytes */
    ck_assert_int_eq(kvr_ckf_frame_decode(base, 47, &f, &why), KVR_ECORRUPT);
    for (size_t cut = 48; cut < n; cut++)
        ck_assert_int_eq(kvr_ckf_frame_decode(base, cut, &f, &why), KVR_ECORRUPT);
    memcpy(b, base, n);
    b[n] = 0;
    reseal(b, n + 1);
    ck_assert_int_eq(kvr_ckf_frame_decode(b, n + 1, &f, &why), KVR_ECORRUPT);
    /* non-increasing buckets: two entries with the same bucket */
    memcpy(b, base, n);
    memcpy(b + n, b + 60, 12);
    b[56] = 2;
    reseal(b, n + 12);
    ck_assert_int_eq(kvr_ckf_frame_decode(b, n + 12, &f, &why), KVR_ECORRUPT);
    ck_assert_ptr_nonnull(strstr(why, "increasing"));
    /* every single-bit flip is rejected or decodes to a different frame: never silently equal */
    for (size_t bit = 0; bit < n * 8; bit++) {
        memcpy(b, base, n);
        b[bit / 8] ^= (uint8_t)(1u << (bit % 8));
        struct kvr_ckf_frame g;
        if (kvr_ckf_frame_decode(b, n, &g, &why) == KVR_OK)
            ck_assert(bit / 8 >= 12 && bit / 8 < 36); /* seed, num_buckets or dc_worker_id */
    }
}
END_TEST

/* ==== consumer ================================================================================ */

struct pipe {
    kvr_ckf_producer_t *p;
    uint8_t *buf;
    size_t cap;
};

static void pipe_init(struct pipe *pp, uint64_t buckets, uint64_t dc)
{
    struct kvr_ckf_producer_config cfg;
    kvr_ckf_producer_config_init(&cfg);
    cfg.filter.num_buckets = buckets;
    cfg.dc_worker_id = dc;
    ck_assert_int_eq(kvr_ckf_producer_new(&cfg, &pp->p), KVR_OK);
    pp->cap = kvr_ckf_frame_snapshot_len(buckets, 0) + 1024 * 1024;
    pp->buf = malloc(pp->cap);
}

static void pipe_free(struct pipe *pp)
{
    kvr_ckf_producer_free(pp->p);
    free(pp->buf);
}

static int feed_snapshot(kvr_ckf_consumer_t *c, uint32_t lane, struct pipe *pp)
{
    int last = KVR_OK;
    for (uint32_t i = 0; i < kvr_ckf_producer_snapshot_chunks(pp->p); i++) {
        size_t len;
        ck_assert_int_eq(kvr_ckf_producer_snapshot(pp->p, i, pp->buf, pp->cap, &len), KVR_OK);
        last = kvr_ckf_consumer_feed(c, lane, pp->buf, len, NULL);
    }
    return last;
}

static size_t cut_delta(struct pipe *pp)
{
    size_t len;
    ck_assert_int_eq(kvr_ckf_producer_delta(pp->p, pp->buf, pp->cap, &len), KVR_OK);
    return len;
}

static void assert_lane_equals(const kvr_ckf_consumer_t *c, uint32_t lane, struct pipe *pp,
                               uint64_t seed)
{
    struct kvr_ckf_view pv, cv;
    kvr_ckf_view(kvr_ckf_producer_filter(pp->p), &pv);
    kvr_ckf_table_view(kvr_ckf_consumer_table(c), lane, &cv);
    for (uint64_t b = 0; b <= pv.mask; b++)
        ck_assert_msg(kvr_ckf_view_get(&pv, b) == kvr_ckf_view_get(&cv, b),
                      "seed %llu lane %u bucket %llu differs", (unsigned long long)seed, lane,
                      (unsigned long long)b);
}

/* producer -> snapshot -> deltas -> consumer converges to the producer's table exactly, on
 * every one of `LANES` lanes (one producer per lane, deltas interleaved at random). */
static void run_convergence(uint32_t LANES, uint64_t seed)
{
    struct kvr_test_rng r = {seed};
    const uint64_t nb = 512;
    kvr_ckf_consumer_t *c = NULL;
    ck_assert_int_eq(kvr_ckf_consumer_new(LANES, nb, KVR_CKF_DEFAULT_SEED, &c), KVR_OK);
    struct pipe pp[KVR_CKF_LANES_MAX];
    for (uint32_t l = 0; l < LANES; l++) {
        pipe_init(&pp[l], nb, 100 + l);
        ck_assert_int_eq(kvr_ckf_consumer_bind(c, l, 100 + l), KVR_OK);
        /* some state before the snapshot */
        for (int i = 0; i < 50; i++) {
            uint64_t h = kvr_test_below(&r, 3000);
            kvr_ckf_producer_store(pp[l].p, kvr_test_below(&r, 3), 0, &h, 1, NULL);
        }
        size_t len = cut_delta(&pp[l]); /* drain before the barrier; the consumer misses it */
        (void)len;
        ck_assert_int_eq(feed_snapshot(c, l, &pp[l]), KVR_OK);
        assert_lane_equals(c, l, &pp[l], seed);
    }
    ck_assert_uint_eq(kvr_ckf_consumer_ready(c), (uint16_t)((1u << LANES) - 1));
    for (int batch = 0; batch < 75 * (int)LANES; batch++) {
        uint32_t l = (uint32_t)kvr_test_below(&r, LANES);
        int ops = (int)kvr_test_below(&r, 20);
        for (int i = 0; i < ops; i++) {
            uint64_t h = kvr_test_below(&r, 3000), w = kvr_test_below(&r, 3);
            if (kvr_test_below(&r, 3) == 0)
                kvr_ckf_producer_remove(pp[l].p, w, 0, &h, 1, NULL);
            else
                kvr_ckf_producer_store(pp[l].p, w, 0, &h, 1, NULL);
            if (kvr_test_below(&r, 50) == 0)
                kvr_ckf_producer_clear_member(pp[l].p, w, 0, NULL);
        }
        size_t len = cut_delta(&pp[l]);
        int outcome = -1;
        ck_assert_int_eq(kvr_ckf_consumer_feed(c, l, pp[l].buf, len, &outcome), KVR_OK);
        ck_assert_int_eq(outcome, KVR_CKF_FEED_APPLIED);
        assert_lane_equals(c, l, &pp[l], seed);
    }
    for (uint32_t l = 0; l < LANES; l++) {
        struct kvr_ckf_lane_info info;
        struct kvr_ckf_producer_stats st;
        kvr_ckf_consumer_lane_info(c, l, &info);
        kvr_ckf_producer_stats(pp[l].p, &st);
        ck_assert_int_eq(info.state, KVR_CKF_LANE_READY);
        ck_assert_uint_eq(info.epoch, st.epoch);
        ck_assert_uint_eq(info.retirements, 0);
        pipe_free(&pp[l]);
    }
    kvr_ckf_consumer_free(c);
}

START_TEST(test_convergence)
{
    run_convergence(4, kvr_test_seed(2718));
}
END_TEST

/* The consumer at its full width: 16 lanes, 16 producers. Each lane converges to its producer;
 * then each producer holds a different prefix of one request (lane l: 3l + 1 blocks) and a
 * search over the request's local hashes answers every lane at once (>= its prefix: no false
 * negative; the exact depth unless a false positive). Retiring one lane (a gap) zeroes only
 * that lane's answer. */
START_TEST(test_sixteen_lanes)
{
    uint64_t seed = kvr_test_seed(1616);
    run_convergence(KVR_CKF_LANES_MAX, seed);
    enum { LANES = KVR_CKF_LANES_MAX, N = 3 * LANES + 4 };
    const uint64_t nb = 256;
    kvr_ckf_consumer_t *c = NULL;
    ck_assert_int_eq(kvr_ckf_consumer_new(LANES, nb, KVR_CKF_DEFAULT_SEED, &c), KVR_OK);
    uint64_t locals[N], seq[N];
    for (int i = 0; i < N; i++)
        locals[i] = kvr_hash_xxh3(&seed, sizeof(seed), (uint64_t)i);
    kvr_hash_chain(locals, N, seq);
    struct pipe pp[LANES];
    for (uint32_t l = 0; l < LANES; l++) {
        pipe_init(&pp[l], nb, 500 + l);
        ck_assert_int_eq(kvr_ckf_consumer_bind(c, l, 500 + l), KVR_OK);
        ck_assert_int_eq(feed_snapshot(c, l, &pp[l]), KVR_OK);
        ck_assert_int_eq(kvr_ckf_producer_store(pp[l].p, 1, 0, seq, 3 * l + 1, NULL), KVR_OK);
        size_t len = cut_delta(&pp[l]);
        ck_assert_int_eq(kvr_ckf_consumer_feed(c, l, pp[l].buf, len, NULL), KVR_OK);
    }
    ck_assert_uint_eq(kvr_ckf_consumer_ready(c), 0xFFFF);
    uint32_t d[KVR_CKF_LANES_MAX];
    ck_assert_int_eq(kvr_ckf_consumer_search_locals(c, locals, N, 8, d), KVR_OK);
    int exact = 0;
    for (uint32_t l = 0; l < LANES; l++) {
        ck_assert_uint_ge(d[l], 3 * l + 1);
        exact += d[l] == 3 * l + 1;
    }
    ck_assert_int_ge(exact, LANES - 1); /* FPR ~ 1e-4 per probe: at most one lucky lane */
    /* lane 9 loses a delta: only lane 9 stops answering */
    uint64_t extra = 12345;
    kvr_ckf_producer_store(pp[9].p, 1, 0, &extra, 1, NULL);
    cut_delta(&pp[9]);
    kvr_ckf_producer_store(pp[9].p, 1, 0, &extra, 1, NULL);
    extra++;
    kvr_ckf_producer_store(pp[9].p, 1, 0, &extra, 1, NULL);
    size_t len = cut_delta(&pp[9]);
    ck_assert_int_eq(kvr_ckf_consumer_feed(c, 9, pp[9].buf, len, NULL), KVR_ESTATE);
    ck_assert_uint_eq(kvr_ckf_consumer_ready(c), (uint16_t)(0xFFFF & ~(1u << 9)));
    uint32_t d2[KVR_CKF_LANES_MAX];
    ck_assert_int_eq(kvr_ckf_consumer_search_locals(c, locals, N, 8, d2), KVR_OK);
    for (uint32_t l = 0; l < LANES; l++)
        ck_assert_uint_eq(d2[l], l == 9 ? 0 : d[l]);
    for (uint32_t l = 0; l < LANES; l++)
        pipe_free(&pp[l]);
    kvr_ckf_consumer_free(c);
}
END_TEST

/* A producer restart: epochs start again from 0. Its deltas are never mixed into the old
 * table (the first one retires the lane: "producer restarted?"), and its snapshot, although
 * its epoch is behind the installed one, is accepted: the lane reloads and serves the new
 * producer's table. Also when the restart's snapshot arrives first, on a READY lane. A
 * re-delivered recent delta stays a harmless duplicate. */
START_TEST(test_producer_restart)
{
    const uint64_t nb = 64;
    kvr_ckf_consumer_t *c = NULL;
    ck_assert_int_eq(kvr_ckf_consumer_new(2, nb, KVR_CKF_DEFAULT_SEED, &c), KVR_OK);
    struct pipe old, neu;
    pipe_init(&old, nb, 5);
    kvr_ckf_consumer_bind(c, 0, 5);
    ck_assert_int_eq(feed_snapshot(c, 0, &old), KVR_OK);
    int outcome;
    uint8_t last[256], first[256];
    size_t last_len = 0, first_len = 0;
    for (uint64_t h = 1; h <= 10; h++) {
        kvr_ckf_producer_store(old.p, 1, 0, &h, 1, NULL);
        last_len = cut_delta(&old);
        memcpy(last, old.buf, last_len);
        if (h == 1)
            memcpy(first, old.buf, first_len = last_len);
        ck_assert_int_eq(kvr_ckf_consumer_feed(c, 0, old.buf, last_len, &outcome), KVR_OK);
        ck_assert_int_eq(outcome, KVR_CKF_FEED_APPLIED);
    }
    struct kvr_ckf_lane_info info;
    kvr_ckf_consumer_lane_info(c, 0, &info);
    ck_assert_uint_eq(info.epoch, 10);
    /* a re-delivery of the last delta: duplicate, ignored */
    ck_assert_int_eq(kvr_ckf_consumer_feed(c, 0, last, last_len, &outcome), KVR_OK);
    ck_assert_int_eq(outcome, KVR_CKF_FEED_IGNORED);

    /* the producer restarts (same identity, epoch 0) and holds other blocks */
    pipe_init(&neu, nb, 5);
    uint64_t h = 1000;
    kvr_ckf_producer_store(neu.p, 1, 0, &h, 1, NULL);
    size_t len = cut_delta(&neu); /* delta 0 -> 1 */
    ck_assert_int_eq(kvr_ckf_consumer_feed(c, 0, neu.buf, len, &outcome), KVR_ESTATE);
    ck_assert_int_eq(outcome, KVR_CKF_FEED_RETIRED);
    kvr_ckf_consumer_lane_info(c, 0, &info);
    ck_assert_msg(strstr(info.error, "producer restarted?") != NULL, "'%s'", info.error);
    ck_assert_int_eq(info.state, KVR_CKF_LANE_AWAITING);
    ck_assert_uint_eq(kvr_ckf_consumer_ready(c), 0);
    ck_assert_uint_eq(info.retirements, 1);
    /* its snapshot (epoch 1 < 10) is accepted: the restart is counted, the lane reloads */
    size_t slen;
    ck_assert_int_eq(kvr_ckf_producer_snapshot(neu.p, 0, neu.buf, neu.cap, &slen), KVR_OK);
    ck_assert_int_eq(kvr_ckf_consumer_feed(c, 0, neu.buf, slen, &outcome), KVR_OK);
    ck_assert_int_eq(outcome, KVR_CKF_FEED_RESTARTED);
    kvr_ckf_consumer_lane_info(c, 0, &info);
    ck_assert_int_eq(info.state, KVR_CKF_LANE_READY);
    ck_assert_uint_eq(info.epoch, 1);
    ck_assert_uint_eq(info.restarts, 1);
    ck_assert_uint_eq(info.retirements, 1); /* it was retired already */
    ck_assert_msg(strstr(info.error, "producer restarted?") != NULL, "'%s'", info.error);
    assert_lane_equals(c, 0, &neu, 0);
    uint32_t d[16];
    uint64_t one = 1;
    kvr_ckf_consumer_search(c, &h, 1, 8, d);
    ck_assert_uint_eq(d[0], 1);
    kvr_ckf_consumer_search(c, &one, 1, 8, d); /* the old producer's block is gone */
    ck_assert_uint_eq(d[0], 0);
    /* the new producer's deltas apply from its own epochs */
    h++;
    kvr_ckf_producer_store(neu.p, 1, 0, &h, 1, NULL);
    len = cut_delta(&neu);
    ck_assert_int_eq(kvr_ckf_consumer_feed(c, 0, neu.buf, len, &outcome), KVR_OK);
    ck_assert_int_eq(outcome, KVR_CKF_FEED_APPLIED);
    assert_lane_equals(c, 0, &neu, 0);
    /* a stale delta of the OLD producer (base 0, behind epoch 2, not one the lane applied since
     * the restart): retires */
    ck_assert_int_eq(kvr_ckf_consumer_feed(c, 0, first, first_len, &outcome), KVR_ESTATE);
    kvr_ckf_consumer_lane_info(c, 0, &info);
    ck_assert_ptr_nonnull(strstr(info.error, "producer restarted?"));
    ck_assert_int_eq(feed_snapshot(c, 0, &neu), KVR_OK); /* epoch 2: no restart */
    kvr_ckf_consumer_lane_info(c, 0, &info);
    ck_assert_uint_eq(info.restarts, 1);
    ck_assert_int_eq(info.state, KVR_CKF_LANE_READY);

    /* lane 1: the restart's snapshot arrives first, on a READY lane */
    struct pipe a, b;
    pipe_init(&a, nb, 8);
    pipe_init(&b, nb, 8);
    kvr_ckf_consumer_bind(c, 1, 8);
    ck_assert_int_eq(feed_snapshot(c, 1, &a), KVR_OK);
    for (uint64_t k = 1; k <= 3; k++) {
        kvr_ckf_producer_store(a.p, 1, 0, &k, 1, NULL);
        len = cut_delta(&a);
        ck_assert_int_eq(kvr_ckf_consumer_feed(c, 1, a.buf, len, NULL), KVR_OK);
    }
    ck_assert_uint_eq(kvr_ckf_consumer_ready(c), 3);
    uint64_t k = 77;
    kvr_ckf_producer_store(b.p, 1, 0, &k, 1, NULL);
    cut_delta(&b); /* lost in the restart */
    ck_assert_int_eq(kvr_ckf_producer_snapshot(b.p, 0, b.buf, b.cap, &slen), KVR_OK);
    ck_assert_int_eq(kvr_ckf_consumer_feed(c, 1, b.buf, slen, &outcome), KVR_OK);
    ck_assert_int_eq(outcome, KVR_CKF_FEED_RESTARTED);
    kvr_ckf_consumer_lane_info(c, 1, &info);
    ck_assert_uint_eq(info.retirements, 1);
    ck_assert_uint_eq(info.restarts, 1);
    ck_assert_uint_eq(info.epoch, 1);
    ck_assert_int_eq(info.state, KVR_CKF_LANE_READY);
    assert_lane_equals(c, 1, &b, 0);
    ck_assert_uint_eq(kvr_ckf_consumer_ready(c), 3);
    pipe_free(&a);
    pipe_free(&b);
    pipe_free(&old);
    pipe_free(&neu);
    kvr_ckf_consumer_free(c);
}
END_TEST

/* A dropped delta and a reordered pair are detected; the lane retires with a clear error and
 * recovers with a new snapshot. Stale duplicates and foreign frames are ignored. */
START_TEST(test_gap_and_reorder)
{
    kvr_ckf_consumer_t *c = NULL;
    ck_assert_int_eq(kvr_ckf_consumer_new(2, 64, KVR_CKF_DEFAULT_SEED, &c), KVR_OK);
    struct pipe pp;
    pipe_init(&pp, 64, 5);
    int outcome;
    uint8_t d1[256], d2[256], d3[256];
    size_t l1, l2, l3;
    uint64_t h = 1;
    /* unbound lane ignores everything */
    size_t len = cut_delta(&pp);
    ck_assert_int_eq(kvr_ckf_consumer_feed(c, 0, pp.buf, len, &outcome), KVR_OK);
    ck_assert_int_eq(outcome, KVR_CKF_FEED_IGNORED);
    ck_assert_int_eq(kvr_ckf_consumer_bind(c, 0, 5), KVR_OK);
    ck_assert_int_eq(kvr_ckf_consumer_bind(c, 2, 5), KVR_EINVAL);
    /* a delta before any snapshot is ignored (the lane awaits a snapshot) */
    ck_assert_int_eq(kvr_ckf_consumer_feed(c, 0, pp.buf, len, &outcome), KVR_OK);
    ck_assert_int_eq(outcome, KVR_CKF_FEED_IGNORED);
    ck_assert_int_eq(feed_snapshot(c, 0, &pp), KVR_OK);
    ck_assert_uint_eq(kvr_ckf_consumer_ready(c), 1);
    kvr_ckf_producer_store(pp.p, 1, 0, &h, 1, NULL), h++;
    l1 = cut_delta(&pp), memcpy(d1, pp.buf, l1);
    kvr_ckf_producer_store(pp.p, 1, 0, &h, 1, NULL), h++;
    l2 = cut_delta(&pp), memcpy(d2, pp.buf, l2);
    kvr_ckf_producer_store(pp.p, 1, 0, &h, 1, NULL), h++;
    l3 = cut_delta(&pp), memcpy(d3, pp.buf, l3);
    ck_assert_int_eq(kvr_ckf_consumer_feed(c, 0, d1, l1, &outcome), KVR_OK);
    ck_assert_int_eq(outcome, KVR_CKF_FEED_APPLIED);
    ck_assert_int_eq(kvr_ckf_consumer_feed(c, 0, d1, l1, &outcome), KVR_OK); /* duplicate */
    ck_assert_int_eq(outcome, KVR_CKF_FEED_IGNORED);
    /* reordered: d3 before d2 -> gap */
    ck_assert_int_eq(kvr_ckf_consumer_feed(c, 0, d3, l3, &outcome), KVR_ESTATE);
    ck_assert_int_eq(outcome, KVR_CKF_FEED_RETIRED);
    struct kvr_ckf_lane_info info;
    kvr_ckf_consumer_lane_info(c, 0, &info);
    ck_assert_int_eq(info.state, KVR_CKF_LANE_AWAITING);
    ck_assert_ptr_nonnull(strstr(info.error, "sequence gap"));
    ck_assert_uint_eq(kvr_ckf_consumer_ready(c), 0);
    /* the late d2 no longer applies */
    ck_assert_int_eq(kvr_ckf_consumer_feed(c, 0, d2, l2, &outcome), KVR_OK);
    ck_assert_int_eq(outcome, KVR_CKF_FEED_IGNORED);
    /* recover */
    ck_assert_int_eq(feed_snapshot(c, 0, &pp), KVR_OK);
    assert_lane_equals(c, 0, &pp, 0);
    kvr_ckf_consumer_lane_info(c, 0, &info);
    ck_assert_uint_eq(info.epoch, 4);
    /* dropped: d(4->5) lost, d(5->6) arrives */
    kvr_ckf_producer_store(pp.p, 1, 0, &h, 1, NULL), h++;
    cut_delta(&pp);
    kvr_ckf_producer_store(pp.p, 1, 0, &h, 1, NULL), h++;
    len = cut_delta(&pp);
    ck_assert_int_eq(kvr_ckf_consumer_feed(c, 0, pp.buf, len, &outcome), KVR_ESTATE);
    kvr_ckf_consumer_lane_info(c, 0, &info);
    ck_assert_uint_eq(info.retirements, 2);
    /* foreign producer id: ignored, lane untouched */
    ck_assert_int_eq(feed_snapshot(c, 0, &pp), KVR_OK);
    struct pipe other;
    pipe_init(&other, 64, 6);
    len = cut_delta(&other);
    ck_assert_int_eq(kvr_ckf_consumer_feed(c, 0, other.buf, len, &outcome), KVR_OK);
    ck_assert_int_eq(outcome, KVR_CKF_FEED_IGNORED);
    ck_assert_uint_eq(kvr_ckf_consumer_ready(c), 1);
    pipe_free(&other);
    pipe_free(&pp);
    kvr_ckf_consumer_free(c);
}
END_TEST

START_TEST(test_retire_on_bad_frames)
{
    kvr_ckf_consumer_t *c = NULL;
    ck_assert_int_eq(kvr_ckf_consumer_new(1, 64, KVR_CKF_DEFAULT_SEED, &c), KVR_OK);
    struct pipe pp, wrong_seed, wrong_shape;
    pipe_init(&pp, 64, 5);
    struct kvr_ckf_producer_config cfg;
    kvr_ckf_producer_config_init(&cfg);
    cfg.filter.num_buckets = 64;
    cfg.filter.seed = 1;
    cfg.dc_worker_id = 5;
    ck_assert_int_eq(kvr_ckf_producer_new(&cfg, &wrong_seed.p), KVR_OK);
    wrong_seed.cap = 4096;
    wrong_seed.buf = malloc(4096);
    pipe_init(&wrong_shape, 128, 5);
    kvr_ckf_consumer_bind(c, 0, 5);
    struct kvr_ckf_lane_info info;
    int outcome;
    struct {
        struct pipe *src;
        int flip;
        int code;
        const char *reason;
    } cases[] = {
        {&pp, 1, KVR_ECORRUPT, "checksum"},
        {&wrong_seed, 0, KVR_ESTATE, "seed mismatch"},
        {&wrong_shape, 0, KVR_ESTATE, "shape mismatch"},
    };
    for (size_t i = 0; i < 3; i++) {
        ck_assert_int_eq(feed_snapshot(c, 0, &pp), KVR_OK);
        ck_assert_uint_eq(kvr_ckf_consumer_ready(c), 1);
        uint64_t h = 77 + i;
        kvr_ckf_producer_store(cases[i].src->p, 1, 0, &h, 1, NULL);
        size_t len = cut_delta(cases[i].src);
        if (cases[i].flip)
            cases[i].src->buf[len - 1] ^= 0x40;
        ck_assert_int_eq(kvr_ckf_consumer_feed(c, 0, cases[i].src->buf, len, &outcome),
                         cases[i].code);
        ck_assert_int_eq(outcome, KVR_CKF_FEED_RETIRED);
        kvr_ckf_consumer_lane_info(c, 0, &info);
        ck_assert_msg(strstr(info.error, cases[i].reason) != NULL, "'%s'", info.error);
        ck_assert_int_eq(info.state, KVR_CKF_LANE_AWAITING);
        ck_assert_uint_eq(kvr_ckf_consumer_ready(c), 0);
        /* a retired lane answers nothing */
        uint32_t d[16];
        kvr_ckf_consumer_search(c, &h, 1, 8, d);
        ck_assert_uint_eq(d[0], 0);
        /* keep pp in step with what the consumer expects next time */
        if (cases[i].src == &pp)
            continue;
    }
    kvr_ckf_consumer_lane_info(c, 0, &info);
    ck_assert_uint_eq(info.retirements, 3);
    pipe_free(&pp);
    pipe_free(&wrong_seed);
    pipe_free(&wrong_shape);
    kvr_ckf_consumer_free(c);
}
END_TEST

START_TEST(test_chunk_order)
{
    const uint64_t nb = (uint64_t)KVR_CKF_CHUNK_BUCKETS * 4;
    kvr_ckf_consumer_t *c = NULL;
    ck_assert_int_eq(kvr_ckf_consumer_new(1, nb, KVR_CKF_DEFAULT_SEED, &c), KVR_OK);
    struct pipe pp;
    pipe_init(&pp, nb, 9);
    kvr_ckf_consumer_bind(c, 0, 9);
    uint64_t h = 3;
    kvr_ckf_producer_store(pp.p, 1, 0, &h, 1, NULL);
    cut_delta(&pp);
    size_t len;
    int outcome;
    ck_assert_int_eq(kvr_ckf_producer_snapshot(pp.p, 1, pp.buf, pp.cap, &len), KVR_OK);
    ck_assert_int_eq(kvr_ckf_consumer_feed(c, 0, pp.buf, len, &outcome), KVR_OK);
    ck_assert_int_eq(outcome, KVR_CKF_FEED_IGNORED); /* middle of a snapshot we did not start */
    ck_assert_int_eq(kvr_ckf_producer_snapshot(pp.p, 0, pp.buf, pp.cap, &len), KVR_OK);
    ck_assert_int_eq(kvr_ckf_consumer_feed(c, 0, pp.buf, len, &outcome), KVR_OK);
    struct kvr_ckf_lane_info info;
    kvr_ckf_consumer_lane_info(c, 0, &info);
    ck_assert_int_eq(info.state, KVR_CKF_LANE_LOADING);
    ck_assert_uint_eq(kvr_ckf_consumer_ready(c), 0);
    ck_assert_int_eq(kvr_ckf_producer_snapshot(pp.p, 2, pp.buf, pp.cap, &len), KVR_OK);
    ck_assert_int_eq(kvr_ckf_consumer_feed(c, 0, pp.buf, len, &outcome), KVR_ESTATE);
    kvr_ckf_consumer_lane_info(c, 0, &info);
    ck_assert_ptr_nonnull(strstr(info.error, "out of order"));
    ck_assert_int_eq(feed_snapshot(c, 0, &pp), KVR_OK);
    ck_assert_uint_eq(kvr_ckf_consumer_ready(c), 1);
    uint32_t d[16];
    kvr_ckf_consumer_search(c, &h, 1, 8, d);
    ck_assert_uint_eq(d[0], 1);
    /* a request's local hashes, chained by the consumer (short and long queries) */
    static uint64_t locals[1000], seq[1000];
    for (int i = 0; i < 1000; i++)
        locals[i] = (uint64_t)i * 0x9E3779B97F4A7C15ULL + 1;
    kvr_hash_chain(locals, 1000, seq);
    ck_assert_int_eq(kvr_ckf_producer_store(pp.p, 2, 0, seq, 700, NULL), KVR_OK);
    size_t len2 = cut_delta(&pp);
    ck_assert_int_eq(kvr_ckf_consumer_feed(c, 0, pp.buf, len2, NULL), KVR_OK);
    ck_assert_int_eq(kvr_ckf_consumer_search_locals(c, locals, 1000, 8, d), KVR_OK);
    ck_assert_uint_ge(d[0], 700);
    ck_assert_int_eq(kvr_ckf_consumer_search_locals(c, locals, 10, 8, d), KVR_OK);
    ck_assert_uint_eq(d[0], 10);
    pipe_free(&pp);
    kvr_ckf_consumer_free(c);
}
END_TEST

/* ==== concurrency ============================================================================= */

struct feed_ctx {
    kvr_ckf_consumer_t *c;
    uint64_t stable[24]; /* held by lane 0's producer throughout */
    _Atomic int stop;
};

static void *searcher(void *arg)
{
    struct feed_ctx *fc = arg;
    long rounds = 0;
    while (!atomic_load(&fc->stop) || rounds < 50) {
        uint32_t d[16];
        kvr_ckf_consumer_search(fc->c, fc->stable, 24, 8, d);
        /* lane 0 is ready from the start and its stable chain is never removed */
        ck_assert_uint_ge(d[0], 24);
        rounds++;
    }
    return NULL;
}

/* One writer feeds deltas (lane 0) and repeated snapshots/retirements (lane 1) while readers
 * search: no data race (run under TSan), no false negative on a READY lane. */
START_TEST(test_concurrent_feed_and_search)
{
    static struct feed_ctx fc;
    uint64_t seed = kvr_test_seed(8080);
    struct kvr_test_rng r = {seed};
    ck_assert_int_eq(kvr_ckf_consumer_new(2, 256, KVR_CKF_DEFAULT_SEED, &fc.c), KVR_OK);
    atomic_store(&fc.stop, 0);
    struct pipe p0, p1;
    pipe_init(&p0, 256, 1);
    pipe_init(&p1, 256, 2);
    kvr_ckf_consumer_bind(fc.c, 0, 1);
    kvr_ckf_consumer_bind(fc.c, 1, 2);
    for (int i = 0; i < 24; i++)
        fc.stable[i] = kvr_test_next(&r);
    ck_assert_int_eq(kvr_ckf_producer_store(p0.p, 9, 0, fc.stable, 24, NULL), KVR_OK);
    cut_delta(&p0);
    ck_assert_int_eq(feed_snapshot(fc.c, 0, &p0), KVR_OK);
    pthread_t th[2];
    for (int i = 0; i < 2; i++)
        ck_assert_int_eq(pthread_create(&th[i], NULL, searcher, &fc), 0);
    uint64_t ring[128];
    for (int i = 0; i < 4000; i++) {
        uint64_t h;
        if (i >= 128) {
            h = ring[i % 128];
            kvr_ckf_producer_remove(p0.p, 1, 0, &h, 1, NULL);
        }
        h = ring[i % 128] = kvr_test_next(&r);
        kvr_ckf_producer_store(p0.p, 1, 0, &h, 1, NULL);
        size_t len = cut_delta(&p0);
        ck_assert_int_eq(kvr_ckf_consumer_feed(fc.c, 0, p0.buf, len, NULL), KVR_OK);
        kvr_ckf_producer_store(p1.p, 1, 0, &h, 1, NULL);
        len = cut_delta(&p1);
        if (i % 50 == 0) /* lane 1: resnapshot, and every other time lose a delta */
            feed_snapshot(fc.c, 1, &p1);
        else if (i % 100 != 25)
            kvr_ckf_consumer_feed(fc.c, 1, p1.buf, len, NULL);
    }
    atomic_store(&fc.stop, 1);
    for (int i = 0; i < 2; i++)
        pthread_join(th[i], NULL);
    assert_lane_equals(fc.c, 0, &p0, seed);
    pipe_free(&p0);
    pipe_free(&p1);
    kvr_ckf_consumer_free(fc.c);
}
END_TEST

Suite *ckf_frame_suite(void)
{
    Suite *s = suite_create("ckf_frame");
    TCase *api = tcase_create("api");
    tcase_add_test(api, test_constructed_example);
    tcase_add_test(api, test_snapshot_chunks);
    suite_add_tcase(s, api);
    TCase *edge = tcase_create("edge");
    tcase_add_test(edge, test_decode_rejections);
    tcase_add_test(edge, test_gap_and_reorder);
    tcase_add_test(edge, test_retire_on_bad_frames);
    tcase_add_test(edge, test_chunk_order);
    tcase_add_test(edge, test_producer_restart);
    suite_add_tcase(s, edge);
    TCase *oracle = tcase_create("oracle");
    tcase_set_timeout(oracle, 300);
    tcase_add_test(oracle, test_convergence);
    tcase_add_test(oracle, test_sixteen_lanes);
    suite_add_tcase(s, oracle);
    TCase *conc = tcase_create("concurrency");
    tcase_set_timeout(conc, 300);
    tcase_add_test(conc, test_concurrent_feed_and_search);
    suite_add_tcase(s, conc);
    return s;
}
