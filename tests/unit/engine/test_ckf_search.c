/* test_ckf_search.c - transposed table, probes, prefix search vs linear reference
 * (engine/src/ckf_search.c). SPDX-License-Identifier: Apache-2.0 */
#include <check.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvr/ckf.h"
#include "kvr/ckf_search.h"
#include "kvr/err.h"
#include "kvr_test.h"

Suite *ckf_search_suite(void);

/* A synthetic exact probe: held[l][pos] for up to 16 lanes and 256 positions. */
struct exact {
    unsigned char held[KVR_CKF_LANES_MAX][256];
    unsigned probes;
};

static uint16_t exact_probe(void *ctx, size_t pos)
{
    struct exact *e = ctx;
    uint16_t m = 0;
    e->probes++;
    for (unsigned l = 0; l < KVR_CKF_LANES_MAX; l++)
        if (e->held[l][pos])
            m |= (uint16_t)(1u << l);
    return m;
}

/* ==== api ===================================================================================== */

START_TEST(test_verification_example)
{
    /* ckf.md §8: n = 24, W = 8; lane 0 holds every position except 3, lane 1 holds 0..4. */
    static struct exact e;
    memset(&e, 0, sizeof(e));
    for (int p = 0; p < 24; p++)
        e.held[0][p] = p != 3;
    for (int p = 0; p <= 4; p++)
        e.held[1][p] = 1;
    uint32_t d[KVR_CKF_LANES_MAX];
    kvr_ckf_prefix_search(24, 0x3, 8, exact_probe, &e, d);
    ck_assert_uint_eq(d[0], 24);
    ck_assert_uint_eq(d[1], 5);
    for (unsigned l = 2; l < KVR_CKF_LANES_MAX; l++)
        ck_assert_uint_eq(d[l], 0);
    kvr_ckf_prefix_linear(24, 0x3, exact_probe, &e, d);
    ck_assert_uint_eq(d[0], 3);
    ck_assert_uint_eq(d[1], 5);
    /* a hole inside lane 0's own window is caught */
    e.held[0][20] = 0;
    kvr_ckf_prefix_search(24, 0x3, 8, exact_probe, &e, d);
    ck_assert_uint_eq(d[0], 20);
    ck_assert_uint_eq(d[1], 5);
}
END_TEST

START_TEST(test_search_edges)
{
    static struct exact e;
    memset(&e, 0, sizeof(e));
    uint32_t d[KVR_CKF_LANES_MAX];
    kvr_ckf_prefix_search(0, 0xFFFF, 8, exact_probe, &e, d);
    for (unsigned l = 0; l < KVR_CKF_LANES_MAX; l++)
        ck_assert_uint_eq(d[l], 0);
    ck_assert_uint_eq(e.probes, 0);
    e.held[5][0] = 1;
    e.held[6][0] = 1;
    kvr_ckf_prefix_search(1, 0xFFFF, 8, exact_probe, &e, d);
    ck_assert_uint_eq(d[5], 1);
    ck_assert_uint_eq(d[6], 1);
    kvr_ckf_prefix_search(1, 0x0020, 8, exact_probe, &e, d); /* initial mask filters lane 6 */
    ck_assert_uint_eq(d[5], 1);
    ck_assert_uint_eq(d[6], 0);
    for (int p = 0; p < 256; p++)
        e.held[15][p] = 1;
    kvr_ckf_prefix_search(256, 0xFFFF, 0, exact_probe, &e, d);
    ck_assert_uint_eq(d[15], 256);
    ck_assert_uint_eq(d[5], 1);
}
END_TEST

START_TEST(test_table_probe)
{
    kvr_ckf_table_t *t = NULL;
    ck_assert_int_eq(kvr_ckf_table_new(0, 1024, 1, &t), KVR_EINVAL);
    ck_assert_int_eq(kvr_ckf_table_new(17, 1024, 1, &t), KVR_EINVAL);
    ck_assert_int_eq(kvr_ckf_table_new(4, 1000, 1, &t), KVR_EINVAL);
    ck_assert_int_eq(kvr_ckf_table_new(16, 1024, KVR_CKF_DEFAULT_SEED, &t), KVR_OK);
    ck_assert_uint_eq(kvr_ckf_table_words_bytes(t), 16 * 1024 * 8);
    struct kvr_ckf_rng rng;
    struct kvr_ckf_kick log[KVR_CKF_MAX_KICKS];
    kvr_ckf_rng_seed_lane(&rng, KVR_CKF_DEFAULT_SEED, 0);
    struct kvr_ckf_kicker k = {&rng, log, KVR_CKF_MAX_KICKS};
    struct kvr_ckf_key key;
    kvr_ckf_key_make(9510318385840434533ULL, KVR_CKF_DEFAULT_SEED, &key);
    for (uint32_t l = 0; l < 16; l += 3) {
        struct kvr_ckf_view v;
        kvr_ckf_table_view(t, l, &v);
        ck_assert_int_eq(kvr_ckf_view_insert(&v, &k, &key, NULL, NULL), KVR_OK);
    }
    ck_assert_uint_eq(kvr_ckf_table_probe_key(t, &key), 0x9249); /* lanes 0,3,6,9,12,15 */
    ck_assert_uint_eq(kvr_ckf_table_probe(t, 629, 481, 0xbfad), 0x9249);
    struct kvr_ckf_view v;
    kvr_ckf_table_view(t, 3, &v);
    ck_assert_int_eq(kvr_ckf_view_remove(&v, &key, NULL), 1);
    ck_assert_uint_eq(kvr_ckf_table_probe_key(t, &key), 0x9241);
    kvr_ckf_view_clear(&v);
    kvr_ckf_table_view(t, 0, &v);
    kvr_ckf_view_clear(&v);
    ck_assert_uint_eq(kvr_ckf_table_probe_key(t, &key), 0x9240);
    kvr_ckf_table_free(t);
}
END_TEST

/* ==== oracle ================================================================================== */

/* Synthetic exact lanes: without holes the search equals the linear scan; with holes it is
 * never below it and stays at a true miss or n. */
START_TEST(test_search_vs_linear_exact)
{
    uint64_t seed = kvr_test_seed(4242);
    struct kvr_test_rng r = {seed};
    static struct exact e;
    for (int it = 0; it < 20000; it++) {
        memset(&e, 0, sizeof(e));
        size_t n = (size_t)kvr_test_below(&r, 200) + 1;
        int holes = it % 2;
        size_t depth[KVR_CKF_LANES_MAX];
        for (unsigned l = 0; l < KVR_CKF_LANES_MAX; l++) {
            depth[l] = (size_t)kvr_test_below(&r, n + 1);
            for (size_t p = 0; p < depth[l]; p++)
                e.held[l][p] = 1;
            if (holes) /* scattered extra blocks past the prefix and holes inside it */
                for (size_t p = 0; p < n; p++)
                    if (kvr_test_below(&r, 8) == 0)
                        e.held[l][p] ^= 1;
        }
        uint16_t init = (uint16_t)kvr_test_next(&r) | (uint16_t)(it % 3 == 0 ? 0xFFFF : 0);
        unsigned w = (unsigned)kvr_test_below(&r, 8) + 1;
        uint32_t ds[KVR_CKF_LANES_MAX], dl[KVR_CKF_LANES_MAX];
        kvr_ckf_prefix_search(n, init, w, exact_probe, &e, ds);
        kvr_ckf_prefix_linear(n, init, exact_probe, &e, dl);
        for (unsigned l = 0; l < KVR_CKF_LANES_MAX; l++) {
            if (!holes)
                ck_assert_msg(ds[l] == dl[l], "seed %llu it %d lane %u: search %u linear %u",
                              (unsigned long long)seed, it, l, ds[l], dl[l]);
            ck_assert_msg(ds[l] >= dl[l], "seed %llu it %d lane %u: search below linear",
                          (unsigned long long)seed, it, l);
            ck_assert(ds[l] == n || ds[l] == 0 || !e.held[l][ds[l]]);
        }
    }
}
END_TEST

/* Real table, random chains per lane: search vs linear on the same table. Differences must be
 * explained by a false positive; count them. Neither search ever reports less than the truth. */
START_TEST(test_table_search_vs_linear)
{
    uint64_t seed = kvr_test_seed(99);
    struct kvr_test_rng r = {seed};
    const uint64_t nb = 128; /* small: high load, some false positives */
    kvr_ckf_table_t *t = NULL;
    ck_assert_int_eq(kvr_ckf_table_new(16, nb, KVR_CKF_DEFAULT_SEED, &t), KVR_OK);
    enum { CHAINS = 2000, LEN = 256 };
    static uint64_t chains[CHAINS][LEN];
    static unsigned char held[16][CHAINS]; /* lane l holds chain c up to depth held[l][c] */
    for (int c = 0; c < CHAINS; c++)
        for (int i = 0; i < LEN; i++)
            chains[c][i] = kvr_test_next(&r);
    struct kvr_ckf_rng rng;
    static struct kvr_ckf_kick log[KVR_CKF_MAX_KICKS];
    kvr_ckf_rng_seed_lane(&rng, 1, 1);
    struct kvr_ckf_kicker k = {&rng, log, KVR_CKF_MAX_KICKS};
    size_t stored = 0;
    for (uint32_t l = 0; l < 16; l++) {
        struct kvr_ckf_view v;
        kvr_ckf_table_view(t, l, &v);
        for (int c = 0; c < CHAINS; c++) {
            unsigned d = (unsigned)kvr_test_below(&r, 60) * (kvr_test_below(&r, 120) == 0);
            for (unsigned i = 0; i < d; i++) {
                struct kvr_ckf_key key;
                kvr_ckf_key_make(chains[c][i], KVR_CKF_DEFAULT_SEED, &key);
                if (kvr_ckf_view_insert(&v, &k, &key, NULL, NULL) != KVR_OK) {
                    d = i;
                    break;
                }
                stored++;
            }
            held[l][c] = (unsigned char)d;
        }
    }
    size_t queries = 0, diffs = 0, fp_explained = 0, over_truth = 0;
    for (int q = 0; q < 40000; q++) {
        int c = (int)kvr_test_below(&r, CHAINS);
        size_t n = (size_t)kvr_test_below(&r, LEN) + 1;
        uint32_t ds[16], dl[16];
        kvr_ckf_table_search(t, chains[c], n, 0xFFFF, 8, ds);
        kvr_ckf_table_search_linear(t, chains[c], n, 0xFFFF, dl);
        queries++;
        for (unsigned l = 0; l < 16; l++) {
            size_t truth = held[l][c] < n ? held[l][c] : n;
            ck_assert_msg(ds[l] >= truth && dl[l] >= truth, "seed %llu: false negative",
                          (unsigned long long)seed);
            over_truth += ds[l] > truth;
            if (ds[l] == dl[l])
                continue;
            diffs++;
            /* explained iff the table answers a hit at some position the lane does not hold
             * (a false positive) between the linear answer and the search answer */
            int explained = 0;
            for (size_t p = truth; p < ds[l] && !explained; p++) {
                struct kvr_ckf_key key;
                kvr_ckf_key_make(chains[c][p], KVR_CKF_DEFAULT_SEED, &key);
                explained = (kvr_ckf_table_probe_key(t, &key) >> l) & 1;
            }
            ck_assert_msg(explained, "seed %llu q %d lane %u: unexplained %u vs %u",
                          (unsigned long long)seed, q, l, ds[l], dl[l]);
            fp_explained++;
        }
    }
    fprintf(stderr,
            "ckf_search: %zu queries x 16 lanes, load %.2f: %zu search!=linear (all explained by "
            "false positives: %zu), %zu lane answers above the truth (seed %llu)\n",
            queries, (double)stored / (double)(nb * 4 * 16), diffs, fp_explained, over_truth,
            (unsigned long long)seed);
    kvr_ckf_table_free(t);
}
END_TEST

/* ==== concurrency ============================================================================= */

struct conc {
    kvr_ckf_table_t *t;
    uint64_t stable[32]; /* chain held by lane 0 throughout */
    _Atomic int stop;
    uint64_t seed;
};

static void *writer(void *arg)
{
    struct conc *c = arg;
    struct kvr_ckf_rng rng;
    struct kvr_ckf_kick *log = malloc(KVR_CKF_MAX_KICKS * sizeof(*log));
    kvr_ckf_rng_seed_lane(&rng, c->seed, 1);
    struct kvr_ckf_kicker k = {&rng, log, KVR_CKF_MAX_KICKS};
    struct kvr_test_rng r = {c->seed};
    struct kvr_ckf_view v;
    kvr_ckf_table_view(c->t, 1, &v);
    uint64_t ring[64];
    for (int i = 0; i < 20000; i++) {
        struct kvr_ckf_key key;
        if (i >= 64) {
            kvr_ckf_key_make(ring[i % 64], c->seed, &key);
            kvr_ckf_view_remove(&v, &key, NULL);
        }
        ring[i % 64] = kvr_test_next(&r);
        kvr_ckf_key_make(ring[i % 64], c->seed, &key);
        (void)kvr_ckf_view_insert(&v, &k, &key, NULL, NULL);
    }
    atomic_store(&c->stop, 1);
    free(log);
    return NULL;
}

static void *reader(void *arg)
{
    struct conc *c = arg;
    long rounds = 0;
    while (!atomic_load(&c->stop) || rounds < 100) {
        uint32_t d[16];
        kvr_ckf_table_search(c->t, c->stable, 32, 0xFFFF, 8, d);
        ck_assert_uint_eq(d[0], 32); /* lane 0 is never written: never a false negative */
        rounds++;
    }
    return NULL;
}

START_TEST(test_concurrent_readers)
{
    static struct conc c;
    c.seed = kvr_test_seed(5);
    atomic_store(&c.stop, 0);
    ck_assert_int_eq(kvr_ckf_table_new(4, 64, c.seed, &c.t), KVR_OK);
    struct kvr_test_rng r = {c.seed ^ 1};
    struct kvr_ckf_rng rng;
    struct kvr_ckf_kick log[KVR_CKF_MAX_KICKS];
    kvr_ckf_rng_seed_lane(&rng, c.seed, 0);
    struct kvr_ckf_kicker k = {&rng, log, KVR_CKF_MAX_KICKS};
    struct kvr_ckf_view v;
    kvr_ckf_table_view(c.t, 0, &v);
    for (int i = 0; i < 32; i++) {
        struct kvr_ckf_key key;
        c.stable[i] = kvr_test_next(&r);
        kvr_ckf_key_make(c.stable[i], c.seed, &key);
        ck_assert_int_eq(kvr_ckf_view_insert(&v, &k, &key, NULL, NULL), KVR_OK);
    }
    pthread_t w, rd[2];
    ck_assert_int_eq(pthread_create(&rd[0], NULL, reader, &c), 0);
    ck_assert_int_eq(pthread_create(&rd[1], NULL, reader, &c), 0);
    ck_assert_int_eq(pthread_create(&w, NULL, writer, &c), 0);
    pthread_join(w, NULL);
    pthread_join(rd[0], NULL);
    pthread_join(rd[1], NULL);
    kvr_ckf_table_free(c.t);
}
END_TEST

Suite *ckf_search_suite(void)
{
    Suite *s = suite_create("ckf_search");
    TCase *api = tcase_create("api");
    tcase_add_test(api, test_verification_example);
    tcase_add_test(api, test_search_edges);
    tcase_add_test(api, test_table_probe);
    suite_add_tcase(s, api);
    TCase *oracle = tcase_create("oracle");
    tcase_set_timeout(oracle, 300);
    tcase_add_test(oracle, test_search_vs_linear_exact);
    tcase_add_test(oracle, test_table_search_vs_linear);
    suite_add_tcase(s, oracle);
    TCase *conc = tcase_create("concurrency");
    tcase_set_timeout(conc, 300);
    tcase_add_test(conc, test_concurrent_readers);
    suite_add_tcase(s, conc);
    return s;
}
