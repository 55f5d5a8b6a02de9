/* test_ckf.c - CKF addressing, SWAR buckets, insert/kick/rollback/remove (engine/src/ckf.c).
 * SPDX-License-Identifier: Apache-2.0 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvr/ckf.h"
#include "kvr/err.h"
#include "kvr_test.h"

static kvr_ckf_t *make_filter(uint64_t buckets, uint32_t lane)
{
    struct kvr_ckf_config cfg;
    kvr_ckf_config_init(&cfg);
    cfg.num_buckets = buckets;
    cfg.lane = lane;
    kvr_ckf_t *f = NULL;
    ck_assert_int_eq(kvr_ckf_new(&cfg, &f), KVR_OK);
    return f;
}

static void copy_words(const kvr_ckf_t *f, uint64_t *out)
{
    struct kvr_ckf_view v;
    kvr_ckf_view(f, &v);
    for (uint64_t b = 0; b <= v.mask; b++)
        out[b] = kvr_ckf_view_get(&v, b);
}

/* ==== api: vectors ============================================================================ */

START_TEST(test_address_vector)
{
    /* ckf.md §3 / hashing.md §9.8 */
    struct kvr_ckf_key k;
    kvr_ckf_key_make(9510318385840434533ULL, KVR_CKF_DEFAULT_SEED, &k);
    ck_assert_uint_eq(k.mixed, 0x36decfedf675bfadULL);
    ck_assert_uint_eq(k.fp, 0xbfad);
    struct kvr_ckf_addr ad;
    kvr_ckf_address(9510318385840434533ULL, KVR_CKF_DEFAULT_SEED, 1023, &ad);
    ck_assert_uint_eq(ad.fp, 0xbfad);
    ck_assert_uint_eq(ad.a, 629);
    ck_assert_uint_eq(kvr_ckf_delta(0xbfad, KVR_CKF_DEFAULT_SEED, 1023), 916);
    ck_assert_uint_eq(ad.b, 481);
    /* involution: the alternate of b is a */
    ck_assert_uint_eq(ad.b ^ kvr_ckf_delta(ad.fp, KVR_CKF_DEFAULT_SEED, 1023), ad.a);
}
END_TEST

/* ckf.md §6 gen B derived vector: seed 0x5DEECE66D1B54A33, mask 1023,
 * h = 9510318385840434533 -> fp 0xe18e, i1 929, i2 374 (the §10 frame example's bucket). */
START_TEST(test_genb_address_vector)
{
    struct kvr_ckf_addr ad;
    kvr_ckf_genb_address(9510318385840434533ULL, KVR_CKF_DEFAULT_SEED, 1023, &ad);
    ck_assert_uint_eq(ad.fp, 0xe18e);
    ck_assert_uint_eq(ad.a, 929);
    ck_assert_uint_eq(ad.b, 374);
    /* the mixer itself: mix(0, 0) = 0; fp = top 16 bits of mix(h, seed) */
    ck_assert_uint_eq(kvr_ckf_genb_mix(0, 0), 0);
    ck_assert_uint_eq(kvr_ckf_genb_mix(9510318385840434533ULL, KVR_CKF_DEFAULT_SEED) >> 48, 0xe18e);
    /* alt is an involution and never maps a bucket to itself, at several table sizes */
    struct kvr_test_rng r = {kvr_test_seed(66)};
    for (int i = 0; i < 10000; i++) {
        uint64_t mask = ((uint64_t)1 << (1 + kvr_test_below(&r, 20))) - 1;
        kvr_ckf_genb_address(kvr_test_next(&r), KVR_CKF_DEFAULT_SEED, mask, &ad);
        ck_assert_uint_ne(ad.fp, 0);
        ck_assert_uint_le(ad.a, mask);
        ck_assert_uint_le(ad.b, mask);
        ck_assert_uint_ne(ad.a, ad.b);
        ck_assert_uint_eq(ad.b ^ ((kvr_ckf_genb_mix(ad.fp, KVR_CKF_DEFAULT_SEED) & mask) | 1),
                          ad.a);
    }
}
END_TEST

START_TEST(test_splitmix_vector)
{
    struct kvr_ckf_rng r = {0};
    ck_assert_uint_eq(kvr_ckf_rng_next(&r), 0xe220a8397b1dcdafULL);
    /* per-lane seed = one next() on seed ^ ((lane + 1) * golden) */
    struct kvr_ckf_rng lane, ref = {KVR_CKF_DEFAULT_SEED ^ (3 * 0x9E3779B97F4A7C15ULL)};
    kvr_ckf_rng_seed_lane(&lane, KVR_CKF_DEFAULT_SEED, 2);
    ck_assert_uint_eq(lane.state, kvr_ckf_rng_next(&ref));
}
END_TEST

START_TEST(test_sizing)
{
    ck_assert_uint_eq(kvr_ckf_buckets_for(0), 2);
    ck_assert_uint_eq(kvr_ckf_buckets_for(1), 2);
    ck_assert_uint_eq(kvr_ckf_buckets_for(7), 4);  /* floor(50/16) = 3 -> 4 */
    ck_assert_uint_eq(kvr_ckf_buckets_for(16), 8); /* 5 -> 8 */
    ck_assert_uint_eq(kvr_ckf_buckets_for(1000000), 524288);
    ck_assert_uint_eq(kvr_ckf_buckets_for(16384), 8192);
    ck_assert_uint_eq(kvr_ckf_buckets_for(UINT64_MAX), (uint64_t)1 << 62);
    ck_assert(kvr_ckf_buckets_valid(2) && kvr_ckf_buckets_valid(1024));
    ck_assert(!kvr_ckf_buckets_valid(0) && !kvr_ckf_buckets_valid(1) && !kvr_ckf_buckets_valid(6));
}
END_TEST

START_TEST(test_swar_lowest_lane)
{
    /* slot0 = 1 (true match for fp 1), slot1 = 0: x1 = 1 and the borrow from slot 0 flags
     * slot 1 as well; first() must answer the lowest flagged slot. */
    uint64_t w = 0x0000000000000001ULL;
    ck_assert_uint_ne(kvr_ckf_swar_flags(w, 1) & 0x80000000ULL, 0); /* the borrow artefact */
    ck_assert_int_eq(kvr_ckf_word_first(w, 1), 0);
    ck_assert_int_eq(kvr_ckf_word_first(w, 0), 1); /* first empty */
    ck_assert_int_eq(kvr_ckf_word_first(0xFFFF0000FFFF0001ULL, 0), 2);
    ck_assert_int_eq(kvr_ckf_word_first(0x1111222233334444ULL, 0x2222), 2);
    ck_assert_int_eq(kvr_ckf_word_first(0x1111222233334444ULL, 0x5555), -1);

    uint64_t seed = kvr_test_seed(11);
    struct kvr_test_rng r = {seed};
    for (int it = 0; it < 200000; it++) {
        uint16_t sl[4];
        uint64_t word = 0;
        for (unsigned s = 0; s < 4; s++) {
            /* small alphabet so that matches, zeros and borrows are frequent */
            sl[s] = (uint16_t)kvr_test_below(&r, 4);
            if (kvr_test_below(&r, 2))
                sl[s] = (uint16_t)(sl[s] * 0x4001);
            word |= (uint64_t)sl[s] << (16 * s);
        }
        uint16_t fp = (uint16_t)kvr_test_below(&r, 4);
        int want = -1;
        for (unsigned s = 0; s < 4 && want < 0; s++)
            if (sl[s] == fp)
                want = (int)s;
        ck_assert_msg(kvr_ckf_word_first(word, fp) == want, "seed %llu word %016llx fp %u",
                      (unsigned long long)seed, (unsigned long long)word, fp);
        ck_assert_int_eq(kvr_ckf_word_has(word, fp), want >= 0);
    }
}
END_TEST

START_TEST(test_config_rejects)
{
    struct kvr_ckf_config cfg;
    kvr_ckf_t *f = NULL;
    kvr_ckf_config_init(&cfg);
    cfg.num_buckets = 1000;
    ck_assert_int_eq(kvr_ckf_new(&cfg, &f), KVR_EINVAL);
    cfg.num_buckets = 1;
    ck_assert_int_eq(kvr_ckf_new(&cfg, &f), KVR_EINVAL);
    cfg.num_buckets = 0;
    cfg.expected = 0;
    ck_assert_int_eq(kvr_ckf_new(&cfg, &f), KVR_EINVAL);
    kvr_ckf_config_init(&cfg);
    cfg.max_kicks = 0;
    ck_assert_int_eq(kvr_ckf_new(&cfg, &f), KVR_EINVAL);
    cfg.max_kicks = KVR_CKF_MAX_KICKS_LIMIT + 1;
    ck_assert_int_eq(kvr_ckf_new(&cfg, &f), KVR_EINVAL);
    kvr_ckf_config_init(&cfg);
    cfg.expected = 1000000;
    ck_assert_int_eq(kvr_ckf_new(&cfg, &f), KVR_OK);
    ck_assert_uint_eq(kvr_ckf_buckets(f), 524288);
    ck_assert_uint_eq(kvr_ckf_table_bytes(f), 4u << 20);
    kvr_ckf_free(f);
}
END_TEST

START_TEST(test_insert_remove)
{
    kvr_ckf_t *f = make_filter(1024, 0);
    uint64_t dirty[KVR_CKF_MAX_KICKS + 1];
    size_t nd = 99;
    ck_assert_int_eq(kvr_ckf_contains(f, 9510318385840434533ULL), 0);
    ck_assert_int_eq(kvr_ckf_insert(f, 9510318385840434533ULL, dirty, &nd), KVR_OK);
    ck_assert_uint_eq(nd, 1);
    ck_assert_uint_eq(dirty[0], 629); /* first empty slot of bucket a */
    ck_assert_int_eq(kvr_ckf_contains(f, 9510318385840434533ULL), 1);
    struct kvr_ckf_view v;
    kvr_ckf_view(f, &v);
    ck_assert_uint_eq(kvr_ckf_view_get(&v, 629), 0xbfad);
    /* a second copy of the same hash takes the next slot: copies are counted, not merged */
    ck_assert_int_eq(kvr_ckf_insert(f, 9510318385840434533ULL, NULL, NULL), KVR_OK);
    ck_assert_uint_eq(kvr_ckf_view_get(&v, 629), 0xbfadbfadULL);
    ck_assert_uint_eq(kvr_ckf_count(f), 2);
    uint64_t bucket = 0;
    ck_assert_int_eq(kvr_ckf_remove(f, 9510318385840434533ULL, &bucket), 1);
    ck_assert_uint_eq(bucket, 629);
    ck_assert_uint_eq(kvr_ckf_view_get(&v, 629), 0xbfad0000ULL); /* first equal slot zeroed */
    ck_assert_int_eq(kvr_ckf_contains(f, 9510318385840434533ULL), 1);
    ck_assert_int_eq(kvr_ckf_remove(f, 9510318385840434533ULL, NULL), 1);
    ck_assert_int_eq(kvr_ckf_contains(f, 9510318385840434533ULL), 0);
    ck_assert_int_eq(kvr_ckf_remove(f, 9510318385840434533ULL, NULL), 0);
    ck_assert_uint_eq(kvr_ckf_count(f), 0);
    ck_assert_uint_eq(kvr_ckf_view_count(&v), 0);
    kvr_ckf_free(f);
}
END_TEST

/* Fill bucket a and b of one hash by hand, forcing the next insert of it to kick. */
START_TEST(test_kick_dirty_sorted)
{
    kvr_ckf_t *f = make_filter(1024, 0);
    struct kvr_ckf_view v;
    kvr_ckf_view(f, &v);
    const uint64_t h = 9510318385840434533ULL;
    for (int i = 0; i < 8; i++)
        ck_assert_int_eq(kvr_ckf_insert(f, h, NULL, NULL), KVR_OK);
    ck_assert_uint_eq(kvr_ckf_view_get(&v, 629), 0xbfadbfadbfadbfadULL);
    ck_assert_uint_eq(kvr_ckf_view_get(&v, 481), 0xbfadbfadbfadbfadULL);
    /* a ninth copy: every kick evicts an identical fp that bounces between 629 and 481 */
    uint64_t before[1024], after[1024];
    copy_words(f, before);
    ck_assert_int_eq(kvr_ckf_insert(f, h, NULL, NULL), KVR_ECAPACITY);
    copy_words(f, after);
    ck_assert(memcmp(before, after, sizeof(before)) == 0);
    ck_assert_uint_eq(kvr_ckf_count(f), 8);
    /* a different hash whose buckets are not full still goes in */
    uint64_t dirty[KVR_CKF_MAX_KICKS + 1];
    size_t nd = 0;
    ck_assert_int_eq(kvr_ckf_insert(f, 1, dirty, &nd), KVR_OK);
    ck_assert_uint_eq(nd, 1);
    kvr_ckf_free(f);
}
END_TEST

/* ==== oracle: against an exact set ============================================================ */

/* No false negatives at any load up to the failure point; every failed insertion leaves the
 * table byte-identical; the failure point lies near the known 4-way cuckoo limit. */
START_TEST(test_no_false_negatives_and_rollback)
{
    const uint64_t nb = 4096;
    uint64_t seed = kvr_test_seed(20240601);
    struct kvr_test_rng r = {seed};
    kvr_ckf_t *f = make_filter(nb, 3);
    uint64_t *held = malloc(nb * 4 * sizeof(*held));
    uint64_t *before = malloc(nb * sizeof(*before));
    uint64_t *after = malloc(nb * sizeof(*after));
    ck_assert(held && before && after);
    size_t n = 0, failures = 0, first_fail = 0;
    uint64_t dirty[KVR_CKF_MAX_KICKS + 1];
    while (n < nb * 4 && failures < 20) {
        uint64_t h = kvr_test_next(&r);
        copy_words(f, before);
        size_t nd = 0;
        int rc = kvr_ckf_insert(f, h, dirty, &nd);
        if (rc == KVR_ECAPACITY) {
            copy_words(f, after);
            ck_assert_msg(memcmp(before, after, nb * sizeof(*before)) == 0,
                          "seed %llu: failed insert #%zu changed the table",
                          (unsigned long long)seed, failures);
            if (failures++ == 0)
                first_fail = n;
            continue;
        }
        ck_assert_int_eq(rc, KVR_OK);
        /* dirty = exactly the buckets whose words changed, sorted and unique */
        copy_words(f, after);
        size_t j = 0;
        for (uint64_t b = 0; b < nb; b++) {
            if (before[b] == after[b])
                continue;
            while (j < nd && dirty[j] < b)
                j++;
            ck_assert_msg(j < nd && dirty[j] == b, "seed %llu: bucket %llu changed, not dirty",
                          (unsigned long long)seed, (unsigned long long)b);
        }
        ck_assert_uint_ge(nd, 1);
        for (size_t i = 1; i < nd; i++)
            ck_assert_uint_lt(dirty[i - 1], dirty[i]);
        held[n++] = h;
        if (n % (nb * 4 / 100) == 0 || failures > 0) {
            for (size_t i = 0; i < n; i++)
                ck_assert_msg(kvr_ckf_contains(f, held[i]),
                              "seed %llu: false negative at load %.3f", (unsigned long long)seed,
                              (double)n / (double)(nb * 4));
        }
    }
    ck_assert_uint_eq(kvr_ckf_count(f), n);
    struct kvr_ckf_view v;
    kvr_ckf_view(f, &v);
    ck_assert_uint_eq(kvr_ckf_view_count(&v), n);
    double load = (double)first_fail / (double)(nb * 4);
    fprintf(stderr, "ckf: first capacity failure at load %.4f (seed %llu)\n", load,
            (unsigned long long)seed);
    ck_assert_msg(load > 0.90, "seed %llu: failure point %.4f too early", (unsigned long long)seed,
                  load);
    /* removing everything restores an empty table */
    for (size_t i = 0; i < n; i++)
        ck_assert_int_eq(kvr_ckf_remove(f, held[i], NULL), 1);
    ck_assert_uint_eq(kvr_ckf_view_count(&v), 0);
    free(held);
    free(before);
    free(after);
    kvr_ckf_free(f);
}
END_TEST

/* FPR at 50%, 80% and 95% load within 15% of 8 × load / 65536. */
START_TEST(test_false_positive_rate)
{
    const uint64_t nb = 65536, slots = nb * 4;
    uint64_t seed = kvr_test_seed(77);
    struct kvr_test_rng ins = {seed}, probe = {seed ^ 0xABCDEF0123456789ULL};
    kvr_ckf_t *f = make_filter(nb, 0);
    const double loads[3] = {0.50, 0.80, 0.95};
    uint64_t n = 0;
    for (int li = 0; li < 3; li++) {
        uint64_t target = (uint64_t)(loads[li] * (double)slots);
        while (n < target) {
            ck_assert_msg(kvr_ckf_insert(f, kvr_test_next(&ins), NULL, NULL) == KVR_OK,
                          "seed %llu: capacity failure at load %.4f", (unsigned long long)seed,
                          (double)n / (double)slots);
            n++;
        }
        const uint64_t probes = 6000000;
        uint64_t hits = 0;
        for (uint64_t i = 0; i < probes; i++)
            hits += (uint64_t)kvr_ckf_contains(f, kvr_test_next(&probe));
        double load = (double)n / (double)slots;
        double fpr = (double)hits / (double)probes, model = 8.0 * load / 65536.0;
        fprintf(stderr, "ckf: load %.2f FPR %.3e model %.3e ratio %.3f (seed %llu)\n", load, fpr,
                model, fpr / model, (unsigned long long)seed);
        ck_assert_msg(fpr > model * 0.85 && fpr < model * 1.15,
                      "seed %llu: FPR %.3e at load %.2f outside 15%% of %.3e",
                      (unsigned long long)seed, fpr, load, model);
    }
    kvr_ckf_free(f);
}
END_TEST

Suite *ckf_suite(void);
Suite *ckf_suite(void)
{
    Suite *s = suite_create("ckf");
    TCase *api = tcase_create("api");
    tcase_add_test(api, test_address_vector);
    tcase_add_test(api, test_genb_address_vector);
    tcase_add_test(api, test_splitmix_vector);
    tcase_add_test(api, test_sizing);
    tcase_add_test(api, test_swar_lowest_lane);
    tcase_add_test(api, test_config_rejects);
    tcase_add_test(api, test_insert_remove);
    suite_add_tcase(s, api);
    TCase *edge = tcase_create("edge");
    tcase_add_test(edge, test_kick_dirty_sorted);
    suite_add_tcase(s, edge);
    TCase *oracle = tcase_create("oracle");
    tcase_set_timeout(oracle, 300);
    tcase_add_test(oracle, test_no_false_negatives_and_rollback);
    tcase_add_test(oracle, test_false_positive_rate);
    suite_add_tcase(s, oracle);
    return s;
}
