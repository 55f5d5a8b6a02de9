/* test_ckf_index.c - the CKF index mode (engine/src/ckf_index.c): canonical and translated
 * hashes, per-rank clear, groups, growth, oracle against exact per-rank sets, OOM.
 * SPDX-License-Identifier: Apache-2.0 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvr/ckf_index.h"
#include "kvr/err.h"
#include "kvr/hash.h"
#include "kvr/radix.h"
#include "kvr_test.h"
#include "refmodel.h"

Suite *ckf_index_suite(void);

static kvr_ckf_index_t *make_index(uint64_t expected, int translate)
{
    struct kvr_ckf_index_config cfg;
    kvr_ckf_index_config_init(&cfg);
    cfg.expected_blocks_per_rank = expected;
    cfg.translate = translate;
    kvr_ckf_index_t *idx = NULL;
    ck_assert_int_eq(kvr_ckf_index_new(&cfg, &idx), KVR_OK);
    return idx;
}

/* Score of one rank in a match list (0 when absent). */
static uint32_t score(const struct kvr_match *m, size_t n, uint64_t w, uint32_t dp)
{
    for (size_t i = 0; i < n; i++)
        if (m[i].worker_id == w && m[i].dp_rank == dp)
            return m[i].blocks;
    return 0;
}

/* local hashes of a chain: locals[i] = i + base (arbitrary u64 values work as local hashes) */
static void chain_of(uint64_t base, size_t n, uint64_t *locals, uint64_t *seq)
{
    for (size_t i = 0; i < n; i++)
        locals[i] = kvr_hash_xxh3(&base, sizeof(base), i);
    kvr_hash_chain(locals, n, seq);
}

/* ==== api ===================================================================================== */

START_TEST(test_config)
{
    struct kvr_ckf_index_config cfg;
    kvr_ckf_index_t *idx = NULL;
    kvr_ckf_index_config_init(&cfg);
    cfg.window = 9;
    ck_assert_int_eq(kvr_ckf_index_new(&cfg, &idx), KVR_EINVAL);
    kvr_ckf_index_config_init(&cfg);
    cfg.lanes_per_table = 17;
    ck_assert_int_eq(kvr_ckf_index_new(&cfg, &idx), KVR_EINVAL);
    kvr_ckf_index_config_init(&cfg);
    cfg.expected_blocks_per_rank = 0;
    ck_assert_int_eq(kvr_ckf_index_new(&cfg, &idx), KVR_EINVAL);
    kvr_ckf_index_config_init(&cfg);
    cfg.sizing = 7;
    ck_assert_int_eq(kvr_ckf_index_new(&cfg, &idx), KVR_EINVAL);
    /* gen A sizing: ceil(5 × 1024 / 16) = 320 -> 512 buckets */
    kvr_ckf_index_config_init(&cfg);
    cfg.sizing = KVR_CKF_SIZING_GEN_A;
    cfg.expected_blocks_per_rank = 1024;
    ck_assert_int_eq(kvr_ckf_index_new(&cfg, &idx), KVR_OK);
    struct kvr_block b = {1, 1};
    ck_assert_int_eq(kvr_ckf_index_store(idx, 1, 0, NULL, &b, 1), KVR_OK);
    struct kvr_ckf_index_stats st;
    kvr_ckf_index_stats(idx, &st);
    ck_assert_uint_eq(st.filter_bytes, 1 * 512 * 8); /* a group starts with one lane */
    kvr_ckf_index_free(idx);
    ck_assert_int_eq(kvr_ckf_index_new(NULL, &idx), KVR_OK);
    kvr_ckf_index_free(idx);
}
END_TEST

/* Canonical hashes (hashing.md §9.2): tokens 0..7, block size 4. */
START_TEST(test_canonical_vector)
{
    kvr_ckf_index_t *idx = make_index(1024, 0);
    const uint64_t local0 = 9143094415614847814ULL, local1 = 12124091508212882195ULL;
    const uint64_t seq1 = 9510318385840434533ULL;
    struct kvr_block b0 = {local0, local0}, b1 = {seq1, local1};
    ck_assert_int_eq(kvr_ckf_index_store(idx, 7, 0, NULL, &b0, 1), KVR_OK);
    ck_assert_int_eq(kvr_ckf_index_store(idx, 7, 0, &local0, &b1, 1), KVR_OK);
    ck_assert_int_eq(kvr_ckf_index_store(idx, 8, 0, NULL, &b0, 1), KVR_OK);
    uint64_t q[2] = {local0, local1};
    struct kvr_match m[4];
    size_t n = 0;
    ck_assert_int_eq(kvr_ckf_index_find_matches(idx, q, 2, 0, m, 4, &n), KVR_OK);
    ck_assert_uint_eq(n, 2);
    ck_assert_uint_eq(score(m, n, 7, 0), 2);
    ck_assert_uint_eq(score(m, n, 8, 0), 1);
    ck_assert_int_eq(kvr_ckf_index_find_matches(idx, q, 2, 0, m, 1, &n), KVR_ERANGE);
    ck_assert_uint_eq(n, 2);
    ck_assert_int_eq(kvr_ckf_index_find_matches(idx, q, 0, 0, m, 4, &n), KVR_OK);
    ck_assert_uint_eq(n, 0);
    ck_assert_int_eq(kvr_ckf_index_owns(idx, 7, 0, seq1), 1);
    /* removal by canonical hash; unknown ones are counted no-ops */
    uint64_t rm[2] = {seq1, 12345};
    size_t nf = 0;
    ck_assert_int_eq(kvr_ckf_index_remove(idx, 7, 0, rm, 2, &nf), KVR_ENOBLOCK);
    ck_assert_uint_eq(nf, 1);
    ck_assert_int_eq(kvr_ckf_index_find_matches(idx, q, 2, 0, m, 4, &n), KVR_OK);
    ck_assert_uint_eq(score(m, n, 7, 0), 1);
    /* duplicate store: no second fingerprint */
    ck_assert_int_eq(kvr_ckf_index_store(idx, 8, 0, NULL, &b0, 1), KVR_OK);
    struct kvr_ckf_index_stats st;
    kvr_ckf_index_stats(idx, &st);
    ck_assert_uint_eq(st.duplicates, 1);
    ck_assert_uint_eq(st.blocks, 2);
    ck_assert_uint_eq(st.fingerprints, 2);
    ck_assert_uint_eq(st.err_block, 1);
    ck_assert_uint_eq(st.groups, 1);
    ck_assert_uint_eq(st.levels, 1);
    /* compact sizing: largest B with 4 × B × 0.9 <= 1024 -> 256 buckets per lane; two ranks
     * widened the group to two lanes */
    ck_assert_uint_eq(st.filter_bytes, 2 * 256 * 8);
    ck_assert_uint_gt(st.exact_bytes, 0);
    kvr_ckf_index_free(idx);
}
END_TEST

/* Translate mode: engine hashes are opaque (e.g. vLLM, SGLang); the same content stored under
 * different external hashes by two ranks matches identically. */
START_TEST(test_translate)
{
    kvr_ckf_index_t *idx = make_index(1024, 1);
    uint64_t locals[6], seq[6];
    chain_of(1, 6, locals, seq);
    struct kvr_block a[6], b[3];
    for (int i = 0; i < 6; i++) {
        a[i].block_hash = 1000 + (uint64_t)i; /* rank A's ext ids */
        a[i].tokens_hash = locals[i];
    }
    for (int i = 0; i < 3; i++) {
        b[i].block_hash = (uint64_t)-1 - (uint64_t)i; /* rank B: negative i64 style */
        b[i].tokens_hash = locals[i];
    }
    /* A stores [0,1,2] then [3,4,5] under 1002; B stores [0,1,2] */
    ck_assert_int_eq(kvr_ckf_index_store(idx, 1, 0, NULL, a, 3), KVR_OK);
    uint64_t parent = 1002;
    ck_assert_int_eq(kvr_ckf_index_store(idx, 1, 0, &parent, a + 3, 3), KVR_OK);
    ck_assert_int_eq(kvr_ckf_index_store(idx, 2, 0, NULL, b, 3), KVR_OK);
    ck_assert_int_eq(kvr_ckf_index_owns(idx, 1, 0, seq[5]), 1); /* canonical seq computed */
    ck_assert_int_eq(kvr_ckf_index_owns(idx, 2, 0, seq[2]), 1);
    struct kvr_match m[4];
    size_t n;
    ck_assert_int_eq(kvr_ckf_index_find_matches(idx, locals, 6, 0, m, 4, &n), KVR_OK);
    ck_assert_uint_eq(score(m, n, 1, 0), 6);
    ck_assert_uint_eq(score(m, n, 2, 0), 3);
    /* unknown parent: whole event skipped, nothing registered */
    uint64_t bogus = 77;
    ck_assert_int_eq(kvr_ckf_index_store(idx, 3, 0, &bogus, a, 1), KVR_EPARENT);
    ck_assert_int_eq(kvr_ckf_index_store(idx, 1, 0, &bogus, a, 1), KVR_EPARENT);
    struct kvr_ckf_index_stats st;
    kvr_ckf_index_stats(idx, &st);
    ck_assert_uint_eq(st.ranks, 2);
    ck_assert_uint_eq(st.err_parent, 2);
    /* removal through the translation: A removes ext 1003 (position 3) -> depth 3 */
    uint64_t rm = 1003;
    ck_assert_int_eq(kvr_ckf_index_remove(idx, 1, 0, &rm, 1, NULL), KVR_OK);
    ck_assert_int_eq(kvr_ckf_index_remove(idx, 1, 0, &rm, 1, NULL), KVR_ENOBLOCK);
    ck_assert_int_eq(kvr_ckf_index_find_matches(idx, locals, 6, 0, m, 4, &n), KVR_OK);
    ck_assert_uint_eq(score(m, n, 1, 0), 3);
    /* A re-stores the same content under a second ext id for position 0: refcount 2 */
    struct kvr_block dup = {5555, locals[0]};
    ck_assert_int_eq(kvr_ckf_index_store(idx, 1, 0, NULL, &dup, 1), KVR_OK);
    rm = 1000;
    ck_assert_int_eq(kvr_ckf_index_remove(idx, 1, 0, &rm, 1, NULL), KVR_OK);
    ck_assert_int_eq(kvr_ckf_index_owns(idx, 1, 0, seq[0]), 1); /* still held via 5555 */
    ck_assert_int_eq(kvr_ckf_index_find_matches(idx, locals, 6, 0, m, 4, &n), KVR_OK);
    ck_assert_uint_eq(score(m, n, 1, 0), 3);
    rm = 5555;
    ck_assert_int_eq(kvr_ckf_index_remove(idx, 1, 0, &rm, 1, NULL), KVR_OK);
    ck_assert_int_eq(kvr_ckf_index_owns(idx, 1, 0, seq[0]), 0);
    kvr_ckf_index_free(idx);
}
END_TEST

/* index.md §2.1: cleared removes exactly the emitting (worker_id, dp_rank). */
START_TEST(test_cleared_per_rank)
{
    kvr_ckf_index_t *idx = make_index(256, 0);
    uint64_t locals[2], seq[2];
    chain_of(9, 2, locals, seq);
    struct kvr_block bl[2] = {{seq[0], locals[0]}, {seq[1], locals[1]}};
    ck_assert_int_eq(kvr_ckf_index_store(idx, 7, 0, NULL, bl, 2), KVR_OK);
    ck_assert_int_eq(kvr_ckf_index_store(idx, 7, 1, NULL, bl, 2), KVR_OK);
    ck_assert_int_eq(kvr_ckf_index_store(idx, 8, 0, NULL, bl, 2), KVR_OK);
    struct kvr_event ev;
    memset(&ev, 0, sizeof(ev));
    ev.kind = KVR_EVENT_CLEARED;
    ev.worker_id = 7;
    ev.dp_rank = 1;
    ck_assert_int_eq(kvr_ckf_index_apply(idx, &ev), KVR_OK);
    struct kvr_match m[4];
    size_t n;
    ck_assert_int_eq(kvr_ckf_index_find_matches(idx, locals, 2, 0, m, 4, &n), KVR_OK);
    ck_assert_uint_eq(n, 2);
    ck_assert_uint_eq(score(m, n, 7, 0), 2);
    ck_assert_uint_eq(score(m, n, 8, 0), 2);
    /* remove_worker drops (7,0) and the cleared (7,1); remove_rank (8,0) */
    ck_assert_int_eq(kvr_ckf_index_remove_worker(idx, 7), KVR_OK);
    ck_assert_int_eq(kvr_ckf_index_remove_worker(idx, 7), KVR_ENOTFOUND);
    ck_assert_int_eq(kvr_ckf_index_find_matches(idx, locals, 2, 0, m, 4, &n), KVR_OK);
    ck_assert_uint_eq(n, 1);
    ck_assert_int_eq(kvr_ckf_index_remove_rank(idx, 8, 0), KVR_OK);
    ck_assert_int_eq(kvr_ckf_index_remove_rank(idx, 8, 0), KVR_ENOTFOUND);
    ck_assert_int_eq(kvr_ckf_index_find_matches(idx, locals, 2, 0, m, 4, &n), KVR_OK);
    ck_assert_uint_eq(n, 0);
    /* a freed lane is clean when reused */
    ck_assert_int_eq(kvr_ckf_index_store(idx, 9, 0, NULL, bl, 1), KVR_OK);
    ck_assert_int_eq(kvr_ckf_index_find_matches(idx, locals, 2, 0, m, 4, &n), KVR_OK);
    ck_assert_uint_eq(n, 1);
    ck_assert_uint_eq(score(m, n, 9, 0), 1);
    kvr_ckf_index_free(idx);
}
END_TEST

/* More than 16 ranks use several groups; every rank answers its own depth. */
START_TEST(test_many_ranks)
{
    kvr_ckf_index_t *idx = make_index(64, 0);
    enum { RANKS = 40 };
    uint64_t locals[RANKS + 1], seq[RANKS + 1];
    chain_of(3, RANKS + 1, locals, seq);
    for (uint32_t r = 0; r < RANKS; r++) {
        struct kvr_block bl[RANKS + 1];
        for (uint32_t i = 0; i <= r; i++) {
            bl[i].block_hash = seq[i];
            bl[i].tokens_hash = locals[i];
        }
        ck_assert_int_eq(kvr_ckf_index_store(idx, 100 + r / 2, r % 2, NULL, bl, r + 1), KVR_OK);
    }
    struct kvr_match m[RANKS];
    size_t n;
    ck_assert_int_eq(kvr_ckf_index_find_matches(idx, locals, RANKS + 1, 0, m, RANKS, &n), KVR_OK);
    ck_assert_uint_eq(n, RANKS);
    for (uint32_t r = 0; r < RANKS; r++)
        ck_assert_uint_ge(score(m, n, 100 + r / 2, r % 2), r + 1);
    struct kvr_ckf_index_stats st;
    kvr_ckf_index_stats(idx, &st);
    ck_assert_uint_eq(st.groups, 3);
    ck_assert_uint_eq(st.ranks, RANKS);
    kvr_ckf_index_free(idx);
}
END_TEST

/* An undersized index grows levels instead of omitting, and finds every block. */
START_TEST(test_growth)
{
    kvr_ckf_index_t *idx = make_index(16, 0); /* 8 buckets = 32 slots per lane at first */
    enum { N = 3000 };
    static uint64_t locals[N], seq[N];
    chain_of(5, N, locals, seq);
    for (size_t i = 0; i < N; i++) {
        struct kvr_block b = {seq[i], locals[i]};
        ck_assert_int_eq(kvr_ckf_index_store(idx, 1, 0, NULL, &b, 1), KVR_OK);
    }
    struct kvr_ckf_index_stats st;
    kvr_ckf_index_stats(idx, &st);
    ck_assert_uint_eq(st.omissions, 0);
    ck_assert_uint_gt(st.growths, 0);
    ck_assert_uint_gt(st.rebuilds, 0);
    ck_assert_uint_le(st.levels, 2);
    ck_assert_uint_eq(st.fingerprints, N);
    /* one rank: a one-lane group, so every slot is this lane's; the growth does not overshoot */
    ck_assert_uint_eq(st.groups, 1);
    ck_assert_uint_le(st.filter_bytes, 3 * N);
    fprintf(stderr,
            "ckf_index growth: %llu levels, %llu slots in the rank's one lane for %d blocks "
            "(%.2f bytes per block, %llu growths, %llu fingerprints moved)\n",
            (unsigned long long)st.levels, (unsigned long long)st.slots, N,
            (double)st.filter_bytes / N, (unsigned long long)st.growths,
            (unsigned long long)st.moved);
    struct kvr_match m[1];
    size_t n;
    ck_assert_int_eq(kvr_ckf_index_find_matches(idx, locals, N, 0, m, 1, &n), KVR_OK);
    ck_assert_uint_eq(n, 1);
    ck_assert_uint_eq(m[0].blocks, N);
    kvr_ckf_index_free(idx);
}
END_TEST

/* Sizing: 16 ranks (one full group) each hold N blocks, for an expected_blocks_per_rank far
 * below, somewhat below, near and far above N. Up to E ~ N the layout ends within one
 * power-of-two rounding of the top-up remainder (<= 3 filter bytes per block; E = 12000 gave
 * 6.25 with the old "double the total after 4 levels" rule); level 0 is never shrunk, so an
 * overestimate costs what it asked for and nothing more. At most 2 tables, no omission, every
 * block found; removing everything afterwards finds every fingerprint at its recorded level
 * (the rebuilds kept the own-map levels right). */
START_TEST(test_sizing_no_overshoot)
{
    enum { RANKS = 16, N = 17000 };
    static uint64_t h[RANKS][N];
    const uint64_t es[] = {100, 4096, 12000, 16384, 20000, 65536};
    struct kvr_test_rng r = {kvr_test_seed(1212)};
    for (size_t e = 0; e < sizeof(es) / sizeof(es[0]); e++) {
        kvr_ckf_index_t *idx = make_index(es[e], 0);
        for (uint32_t k = 0; k < RANKS; k++)
            for (size_t i = 0; i < N; i++) {
                h[k][i] = kvr_test_next(&r);
                struct kvr_block b = {h[k][i], 0};
                ck_assert_int_eq(kvr_ckf_index_store(idx, k + 1, 0, NULL, &b, 1), KVR_OK);
            }
        struct kvr_ckf_index_stats st;
        kvr_ckf_index_stats(idx, &st);
        double bpb = (double)st.filter_bytes / (double)st.blocks;
        fprintf(stderr,
                "ckf_index sizing: E %llu, %d blocks per rank: %.3f bytes per block, %llu "
                "levels, %llu growths (%llu rebuilds, %llu fingerprints moved)\n",
                (unsigned long long)es[e], N, bpb, (unsigned long long)st.levels,
                (unsigned long long)st.growths, (unsigned long long)st.rebuilds,
                (unsigned long long)st.moved);
        ck_assert_uint_eq(st.blocks, (uint64_t)RANKS * N);
        ck_assert_uint_eq(st.omissions, 0);
        ck_assert_uint_le(st.levels, 2);
        if (es[e] <= 20000) {
            ck_assert_msg(bpb <= 3.0, "E %llu: %.3f bytes per block", (unsigned long long)es[e],
                          bpb);
        } else {
            /* level 0 (16384 buckets: at most E at 90%) holds everything: nothing added */
            ck_assert_uint_eq(st.growths, 0);
            ck_assert_uint_eq(st.filter_bytes, (size_t)RANKS * 16384 * 8);
        }
        /* every block found: a one-block search of each scores its rank */
        for (uint32_t k = 0; k < RANKS; k += 5)
            for (size_t i = 0; i < N; i += 7) {
                struct kvr_match out[RANKS];
                size_t n;
                ck_assert_int_eq(kvr_ckf_index_find_matches_seq(idx, &h[k][i], 1, out, RANKS, &n),
                                 KVR_OK);
                ck_assert_uint_eq(score(out, n, k + 1, 0), 1);
            }
        for (uint32_t k = 0; k < RANKS; k++)
            ck_assert_int_eq(kvr_ckf_index_remove(idx, k + 1, 0, h[k], N, NULL), KVR_OK);
        kvr_ckf_index_stats(idx, &st);
        ck_assert_uint_eq(st.fingerprints, 0);
        ck_assert_uint_eq(st.invariant, 0);
        kvr_ckf_index_free(idx);
    }
}
END_TEST

/* apply_counted reports BlockNotFound per hash; rank_fpr is the model sum over levels of
 * 2 × fingerprints / buckets / 65535, and matches the measured false-hit rate. */
START_TEST(test_counted_and_fpr)
{
    kvr_ckf_index_t *idx = make_index(4096, 0); /* compact: level 0 = 1024 buckets (cap 3687) */
    enum { N = 3000 };
    struct kvr_test_rng r = {kvr_test_seed(3131)};
    static uint64_t held[N];
    for (size_t i = 0; i < N; i++) {
        held[i] = kvr_test_next(&r);
        struct kvr_block b = {held[i], 0};
        ck_assert_int_eq(kvr_ckf_index_store(idx, 9, 1, NULL, &b, 1), KVR_OK);
    }
    uint64_t gone[3] = {held[0], 17, 18};
    struct kvr_event ev = {.kind = KVR_EVENT_REMOVED, .worker_id = 9, .dp_rank = 1, .n = 3};
    ev.hashes = gone;
    size_t nf = 99;
    ck_assert_int_eq(kvr_ckf_index_apply_counted(idx, &ev, &nf), KVR_ENOBLOCK);
    ck_assert_uint_eq(nf, 2);
    struct kvr_ckf_index_stats st;
    kvr_ckf_index_stats(idx, &st);
    ck_assert_uint_eq(st.err_block, 2);
    ck_assert_uint_eq(st.levels, 1);
    double fpr = 0;
    ck_assert_int_eq(kvr_ckf_index_rank_fpr(idx, 9, 1, &fpr), KVR_OK);
    ck_assert_double_eq_tol(fpr, 2.0 * (N - 1) / 1024.0 / 65535.0, 1e-12);
    ck_assert_int_eq(kvr_ckf_index_rank_fpr(idx, 9, 2, &fpr), KVR_ENOTFOUND);
    /* measured: one-block searches of hashes the rank does not hold */
    ck_assert_int_eq(kvr_ckf_index_rank_fpr(idx, 9, 1, &fpr), KVR_OK);
    uint64_t hits = 0;
    const uint64_t probes = 2000000; /* ~180 false hits expected */
    for (uint64_t i = 0; i < probes; i++) {
        uint64_t h = kvr_test_next(&r);
        struct kvr_match out[1];
        size_t n;
        ck_assert_int_eq(kvr_ckf_index_find_matches_seq(idx, &h, 1, out, 1, &n), KVR_OK);
        hits += n;
    }
    double measured = (double)hits / (double)probes;
    fprintf(stderr, "ckf_index rank_fpr: model %.3e, measured %.3e (%llu probes)\n", fpr, measured,
            (unsigned long long)probes);
    ck_assert_msg(measured > fpr * 0.75 && measured < fpr * 1.25, "model %.3e measured %.3e", fpr,
                  measured);
    kvr_ckf_index_free(idx);
}
END_TEST

/* ==== oracle ================================================================================== */

enum { DOCS = 24, DOC_LEN = 40, ORACLE_RANKS = 6 };

struct model {
    uint64_t locals[DOCS][DOC_LEN];
    uint64_t seq[DOCS][DOC_LEN];
    unsigned char held[ORACLE_RANKS][DOCS][DOC_LEN];
};

static uint64_t ext_of(int translate, uint32_t rank, int d, int i, const struct model *m)
{
    /* translate mode: per-rank opaque ids; canonical: the sequence hash itself */
    return translate ? ((uint64_t)rank << 40) ^ ((uint64_t)d << 20) ^ (uint64_t)(i + 1) * 7919
                     : m->seq[d][i];
}

/* Random stores (prefix extensions), removals (tails, heads, middles) and clears; after every op
 * each rank's CKF depth is >= its exact held prefix (no false negatives); overcounts counted. */
static void run_oracle(int translate, uint64_t seed)
{
    static struct model m;
    memset(&m, 0, sizeof(m));
    struct kvr_test_rng r = {seed};
    for (int d = 0; d < DOCS; d++) {
        for (int i = 0; i < DOC_LEN; i++)
            m.locals[d][i] = kvr_test_next(&r);
        kvr_hash_chain(m.locals[d], DOC_LEN, m.seq[d]);
    }
    kvr_ckf_index_t *idx = make_index(64, translate);
    size_t checks = 0, over = 0;
    for (int op = 0; op < 3000; op++) {
        uint32_t rk = (uint32_t)kvr_test_below(&r, ORACLE_RANKS);
        int d = (int)kvr_test_below(&r, DOCS);
        unsigned what = (unsigned)kvr_test_below(&r, 100);
        if (what < 60) {
            /* store a run [s, e) whose parent s-1 the rank holds (or s == 0) */
            int s = 0;
            while (s < DOC_LEN && m.held[rk][d][s])
                s++;
            if (s == DOC_LEN)
                continue;
            if (s > 0 && kvr_test_below(&r, 4) == 0)
                s = (int)kvr_test_below(&r, (uint64_t)s); /* duplicate re-store */
            int e = s + 1 + (int)kvr_test_below(&r, 8);
            if (e > DOC_LEN)
                e = DOC_LEN;
            struct kvr_block bl[DOC_LEN];
            for (int i = s; i < e; i++) {
                bl[i - s].block_hash = ext_of(translate, rk, d, i, &m);
                bl[i - s].tokens_hash = m.locals[d][i];
            }
            uint64_t parent = s > 0 ? ext_of(translate, rk, d, s - 1, &m) : 0;
            int rc = kvr_ckf_index_store(idx, rk, 0, s > 0 ? &parent : NULL, bl, (size_t)(e - s));
            if (translate && s > 0 && !m.held[rk][d][s - 1]) {
                ck_assert_int_eq(rc, KVR_EPARENT);
                continue;
            }
            ck_assert_msg(rc == KVR_OK, "seed %llu op %d: store rc %d", (unsigned long long)seed,
                          op, rc);
            for (int i = s; i < e; i++)
                m.held[rk][d][i] = 1;
        } else if (what < 95) {
            /* remove 1-4 blocks anywhere (holes allowed) */
            int k = 1 + (int)kvr_test_below(&r, 4);
            for (int j = 0; j < k; j++) {
                int i = (int)kvr_test_below(&r, DOC_LEN);
                uint64_t h = ext_of(translate, rk, d, i, &m);
                size_t nf = 0;
                kvr_ckf_index_remove(idx, rk, 0, &h, 1, &nf);
                ck_assert_uint_eq(nf, m.held[rk][d][i] ? 0 : 1);
                m.held[rk][d][i] = 0;
            }
        } else {
            ck_assert_int_eq(kvr_ckf_index_clear_rank(idx, rk, 0), KVR_OK);
            memset(m.held[rk], 0, sizeof(m.held[rk]));
        }
        /* check a few documents */
        for (int c = 0; c < 3; c++) {
            int qd = (int)kvr_test_below(&r, DOCS);
            size_t qn = (size_t)kvr_test_below(&r, DOC_LEN) + 1;
            struct kvr_match out[ORACLE_RANKS];
            size_t n;
            ck_assert_int_eq(
                kvr_ckf_index_find_matches(idx, m.locals[qd], qn, 0, out, ORACLE_RANKS, &n),
                KVR_OK);
            for (uint32_t q = 0; q < ORACLE_RANKS; q++) {
                uint32_t truth = 0;
                while (truth < qn && m.held[q][qd][truth])
                    truth++;
                uint32_t got = score(out, n, q, 0);
                ck_assert_msg(got >= truth,
                              "seed %llu op %d rank %u doc %d: CKF %u below exact prefix %u",
                              (unsigned long long)seed, op, q, qd, got, truth);
                over += got > truth;
                checks++;
            }
        }
    }
    struct kvr_ckf_index_stats st;
    kvr_ckf_index_stats(idx, &st);
    ck_assert_uint_eq(st.omissions, 0);
    ck_assert_uint_eq(st.invariant, 0);
    ck_assert_uint_eq(st.fingerprints, translate ? st.fingerprints : st.blocks);
    fprintf(stderr,
            "ckf_index oracle (%s): %zu rank checks, %zu above the exact prefix (holes deeper "
            "than the window or false positives) (seed %llu)\n",
            translate ? "translate" : "canonical", checks, over, (unsigned long long)seed);
    kvr_ckf_index_free(idx);
}

START_TEST(test_oracle_canonical)
{
    run_oracle(0, kvr_test_seed(777));
}
END_TEST

START_TEST(test_oracle_translate)
{
    run_oracle(1, kvr_test_seed(778));
}
END_TEST

/* ==== differential: CKF index vs radix index on the same event streams ======================= */

static int apply_both(kvr_radix_t *t, kvr_ckf_index_t *idx, const struct gen_op *op)
{
    switch (op->kind) {
    case GEN_EVENT:
        (void)kvr_radix_apply(t, &op->ev);
        return kvr_ckf_index_apply(idx, &op->ev);
    case GEN_REMOVE_WORKER:
        (void)kvr_radix_remove_worker(t, op->worker_id);
        return kvr_ckf_index_remove_worker(idx, op->worker_id);
    default:
        (void)kvr_radix_remove_rank(t, op->worker_id, op->dp_rank);
        return kvr_ckf_index_remove_rank(idx, op->worker_id, op->dp_rank);
    }
}

/* held_len / reach_len of the reference model for one CKF answer of document d. */
static void held_bounds(struct gen *g, size_t d, size_t n, const struct kvr_match *m, size_t *held,
                        size_t *reach)
{
    size_t nr;
    const struct gen_rank *ranks = gen_ranks(g, &nr);
    *held = *reach = 0;
    for (size_t k = 0; k < nr; k++) {
        if (ranks[k].worker_id != m->worker_id || ranks[k].dp_rank != m->dp_rank)
            continue;
        uint64_t exts[256];
        ck_assert_uint_le(n, 256);
        gen_exts(g, &ranks[k], d, exts);
        ref_bounds(gen_model(g), m->worker_id, m->dp_rank, exts, n, held, reach);
        return;
    }
}

/* Random streams in the mix of Dynamo's differential harness (refmodel.h generator: shared
 * prefixes, repeated locals, holes, per-rank external hashes, clears, rank and worker removal).
 * The CKF index runs in translate mode (engine hashes are opaque here). For every document and
 * rank: CKF score >= radix score; the share of (query, rank) answers above is reported. */
START_TEST(test_differential_vs_radix)
{
    uint64_t base = kvr_test_seed(0x636b66);
    uint64_t answers = 0, above = 0, queries = 0, queries_above = 0, above_held = 0;
    for (int si = 0; si < 24; si++) {
        uint64_t seed = base + (uint64_t)si;
        struct gen *g = gen_new(seed, si % 2 == 0);
        kvr_radix_t *t = NULL;
        ck_assert_int_eq(kvr_radix_new(&t), KVR_OK);
        kvr_ckf_index_t *idx = make_index(64, 1);
        for (int step = 0; step < 1500; step++) {
            struct gen_op op;
            gen_next(g, &op);
            (void)apply_both(t, idx, &op);
            if (step % 5 != 0)
                continue;
            for (size_t d = 0; d < gen_ndocs(g); d++) {
                size_t n;
                const uint64_t *loc = gen_doc(g, d, &n);
                struct kvr_match rm[64], cm[64];
                size_t rn = 0, cn = 0;
                ck_assert_int_eq(kvr_radix_find_matches(t, loc, n, 0, rm, 64, &rn), KVR_OK);
                ck_assert_int_eq(kvr_ckf_index_find_matches(idx, loc, n, 0, cm, 64, &cn), KVR_OK);
                int any_above = 0;
                for (size_t i = 0; i < cn; i++) {
                    size_t held, reach;
                    held_bounds(g, d, n, &cm[i], &held, &reach);
                    above_held += cm[i].blocks > held;
                }
                for (size_t i = 0; i < rn; i++) {
                    uint32_t c = score(cm, cn, rm[i].worker_id, rm[i].dp_rank);
                    ck_assert_msg(c >= rm[i].blocks,
                                  "seed %llu step %d doc %zu rank (%llu,%u): CKF %u < radix %u",
                                  (unsigned long long)seed, step, d,
                                  (unsigned long long)rm[i].worker_id, rm[i].dp_rank, c,
                                  rm[i].blocks);
                    answers++;
                    if (c > rm[i].blocks) {
                        above++;
                        any_above = 1;
                    }
                }
                for (size_t i = 0; i < cn; i++) {
                    if (score(rm, rn, cm[i].worker_id, cm[i].dp_rank) == 0) {
                        answers++;
                        above++;
                        any_above = 1;
                    }
                }
                queries++;
                queries_above += (uint64_t)any_above;
            }
        }
        struct kvr_ckf_index_stats st;
        kvr_ckf_index_stats(idx, &st);
        ck_assert_uint_eq(st.omissions, 0);
        ck_assert_uint_eq(st.invariant, 0);
        kvr_ckf_index_free(idx);
        kvr_radix_free(t);
        gen_free(g);
    }
    fprintf(stderr,
            "ckf_index vs radix: %llu queries, %llu (%.2f%%) with some rank above radix; "
            "%llu rank answers, %llu (%.2f%%) above; of all CKF answers %llu exceed the held "
            "prefix (false positives, holes deeper than the window), the rest are held blocks "
            "the tree unlinked; never below (base seed %llu)\n",
            (unsigned long long)queries, (unsigned long long)queries_above,
            queries ? 100.0 * (double)queries_above / (double)queries : 0.0,
            (unsigned long long)answers, (unsigned long long)above,
            answers ? 100.0 * (double)above / (double)answers : 0.0, (unsigned long long)above_held,
            (unsigned long long)base);
}
END_TEST

/* ==== oom ===================================================================================== */

/* After any allocation failure the index stays consistent: every hash the exact side owns is
 * found by the filter (a length-1 search of it scores the rank). */
START_TEST(test_oom)
{
    uint64_t seed = kvr_test_seed(4040);
    for (uint64_t fail = 1; fail < 200; fail++) {
        struct kvr_test_rng r = {seed};
        kvr_ckf_index_t *idx = make_index(32, (int)(fail & 1));
        kvr_alloc_fail_after(kvr_ckf_index_allocator(idx), fail);
        int saw = 0;
        for (int op = 0; op < 200; op++) {
            uint64_t w = kvr_test_below(&r, 20);
            struct kvr_block b[2];
            uint64_t h = kvr_test_below(&r, 1000) + 1;
            b[0].block_hash = h;
            b[0].tokens_hash = h;
            b[1].block_hash = h + 100000;
            b[1].tokens_hash = h + 7;
            int rc = kvr_ckf_index_store(idx, w, 0, NULL, b, 2);
            saw |= rc == KVR_ENOMEM;
            if (kvr_test_below(&r, 4) == 0)
                kvr_ckf_index_remove(idx, w, 0, &h, 1, NULL);
        }
        for (uint64_t w = 0; w < 20; w++) {
            for (uint64_t h = 1; h <= 1000; h++) {
                if (!kvr_ckf_index_owns(idx, w, 0, h))
                    continue;
                struct kvr_match out[32];
                size_t n;
                ck_assert_int_eq(kvr_ckf_index_find_matches_seq(idx, &h, 1, out, 32, &n), KVR_OK);
                ck_assert_msg(score(out, n, w, 0) == 1, "seed %llu fail %llu: lost %llu",
                              (unsigned long long)seed, (unsigned long long)fail,
                              (unsigned long long)h);
            }
        }
        /* removing every hash finds each fingerprint at the level the exact side recorded,
         * also after growths (rebuilds) that an allocation failure interrupted */
        kvr_alloc_fail_after(kvr_ckf_index_allocator(idx), 0);
        for (uint64_t w = 0; w < 20; w++)
            for (uint64_t h = 1; h <= 1000; h++) {
                uint64_t ext[2] = {h, h + 100000};
                kvr_ckf_index_remove(idx, w, 0, ext, 2, NULL);
            }
        struct kvr_ckf_index_stats st;
        kvr_ckf_index_stats(idx, &st);
        ck_assert_uint_eq(st.invariant, 0);
        ck_assert_uint_eq(st.fingerprints, 0);
        kvr_ckf_index_free(idx);
        if (!saw && fail > 20)
            break;
    }
}
END_TEST

Suite *ckf_index_suite(void)
{
    Suite *s = suite_create("ckf_index");
    TCase *api = tcase_create("api");
    tcase_add_test(api, test_config);
    tcase_add_test(api, test_canonical_vector);
    tcase_add_test(api, test_translate);
    tcase_add_test(api, test_cleared_per_rank);
    tcase_add_test(api, test_many_ranks);
    tcase_add_test(api, test_growth);
    suite_add_tcase(s, api);
    TCase *sizing = tcase_create("sizing");
    tcase_set_timeout(sizing, 300);
    tcase_add_test(sizing, test_sizing_no_overshoot);
    tcase_add_test(sizing, test_counted_and_fpr);
    suite_add_tcase(s, sizing);
    TCase *oracle = tcase_create("oracle");
    tcase_set_timeout(oracle, 300);
    tcase_add_test(oracle, test_oracle_canonical);
    tcase_add_test(oracle, test_oracle_translate);
    tcase_add_test(oracle, test_differential_vs_radix);
    suite_add_tcase(s, oracle);
    TCase *oom = tcase_create("oom");
    tcase_set_timeout(oom, 300);
    tcase_add_test(oom, test_oom);
    suite_add_tcase(s, oom);
    return s;
}
