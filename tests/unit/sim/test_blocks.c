/* test_blocks.c - trace ids to block hashes: the documented mapping and its expansion.
 * SPDX-License-Identifier: Apache-2.0 */
#include <check.h>
#include <stdio.h>
#include <string.h>

#include "blocks.h"
#include "kvr/err.h"
#include "kvr/hash.h"

Suite *sim_blocks_suite(void);

/* The first query of tests/data/opstream/arxiv20_w4.jsonl (tools/kvtrace.py, block size 16):
 * the first request of the arXiv trace, ids 0..13. */
static const uint64_t arxiv_first[14] = {
    5523182284766269584ull,  13518392937921988335ull, 4954898952464910565ull,
    18442881532971542694ull, 18402572742196698181ull, 9340675565616011363ull,
    3792968866483310430ull,  8771127959296939342ull,  4852085626999092119ull,
    14400716039954729789ull, 10801376579804618770ull, 5880977008681700920ull,
    10665988935885563776ull, 10936755180099183546ull};

START_TEST(same_hashes_as_kvtrace)
{
    struct kvr_sim_trace t;
    kvr_sim_trace_init(&t);
    t.max_id = 13;
    t.n_ids = 14;
    struct kvr_sim_hasher h;
    ck_assert_int_eq(kvr_sim_hasher_init(&h, &t, 16, 1), KVR_OK);
    uint32_t ids[14];
    for (uint32_t i = 0; i < 14; i++)
        ids[i] = i;
    uint64_t lo[14], sq[14], want_sq[14];
    kvr_sim_hasher_blocks(&h, ids, 14, lo, sq);
    kvr_hash_chain(arxiv_first, 14, want_sq);
    for (int i = 0; i < 14; i++) {
        ck_assert(lo[i] == arxiv_first[i]);
        ck_assert(sq[i] == want_sq[i]);
    }
    ck_assert(lo[0] == 5523182284766269584ull); /* spec/opstream.md: id 0 at block size 16 */
    kvr_sim_hasher_free(&h);
}
END_TEST

/* E = 2: every id gives two blocks with the same local hash; the sequence chain continues
 * through them, so all four sequence hashes differ. Ids beyond the memo are hashed directly. */
START_TEST(expansion)
{
    struct kvr_sim_trace t;
    kvr_sim_trace_init(&t);
    t.max_id = 5;
    t.n_ids = 1;
    struct kvr_sim_hasher h;
    ck_assert_int_eq(kvr_sim_hasher_init(&h, &t, 8, 2), KVR_OK);
    uint64_t lo[4], sq[4];
    kvr_sim_hasher_blocks(&h, (uint32_t[]){3, 70000}, 2, lo, sq);
    ck_assert(lo[0] == kvr_hash_trace_id(3, 8) && lo[1] == lo[0]);
    ck_assert(lo[2] == kvr_hash_trace_id(70000, 8) && lo[3] == lo[2]);
    ck_assert(sq[0] == lo[0]);
    ck_assert(sq[1] == kvr_hash_seq_next(sq[0], lo[1]));
    ck_assert(sq[3] == kvr_hash_seq_next(sq[2], lo[3]));
    ck_assert(sq[0] != sq[1] && sq[1] != sq[2] && sq[2] != sq[3]);
    kvr_sim_hasher_free(&h);
    ck_assert_int_eq(kvr_sim_hasher_init(&h, &t, 0, 1), KVR_EINVAL);
    ck_assert_int_eq(kvr_sim_hasher_init(&h, &t, 16, 0), KVR_EINVAL);
}
END_TEST

Suite *sim_blocks_suite(void)
{
    Suite *s = suite_create("sim_blocks");
    TCase *api = tcase_create("api");
    tcase_add_test(api, same_hashes_as_kvtrace);
    tcase_add_test(api, expansion);
    suite_add_tcase(s, api);
    return s;
}
