/* test_lru.c - the simulated worker cache: eviction order, the events it emits, and an oracle
 * check that the KV index fed those events reproduces every cache exactly.
 * SPDX-License-Identifier: Apache-2.0 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvr/err.h"
#include "kvr/hash.h"
#include "kvr/index.h"
#include "kvr_test.h"
#include "lru.h"

Suite *sim_lru_suite(void);

/* Keeps a copy of every event. */
static void capture(void *ctx, const struct kvr_event *ev)
{
    ck_assert_int_eq(kvr_event_list_push(ctx, ev), KVR_OK);
}

/* Local and sequence hashes of a chain of ids (one block per id, block size 4). */
static size_t chain(const uint32_t *ids, size_t n, uint64_t *local, uint64_t *seq)
{
    for (size_t i = 0; i < n; i++)
        local[i] = kvr_hash_trace_id(ids[i], 4);
    kvr_hash_chain(local, n, seq);
    return n;
}

/* Capacity 4. Store [1,2,3], [1,2,7], [8,9]: recency after each (MRU first)
 *   [1,2,3]        1 2 3                 stored {null: 1 2 3}
 *   [1,2,7]        1 2 7 3               stored {parent 2: 7}
 *   [8,9]          8 9 1 2 7 3 -> evict 3, 7 (oldest first): removed [3, 7]
 * so [1,2,3] then has a 2-block prefix, [8,9] 2, [1,2,7] 2. */
START_TEST(eviction_order)
{
    struct kvr_sim_lru l;
    kvr_sim_lru_init(&l, 5, 4);
    struct kvr_event_list evs;
    kvr_event_list_init(&evs);
    struct kvr_sim_sink sink = {capture, &evs};
    uint64_t la[3], sa[3], lb[3], sb[3], lc[2], sc[2];
    chain((uint32_t[]){1, 2, 3}, 3, la, sa);
    chain((uint32_t[]){1, 2, 7}, 3, lb, sb);
    chain((uint32_t[]){8, 9}, 2, lc, sc);
    size_t ev = 99;
    ck_assert_int_eq(kvr_sim_lru_store(&l, sa, la, 3, &sink, &ev), KVR_OK);
    ck_assert_uint_eq(ev, 0);
    ck_assert_uint_eq(kvr_sim_lru_prefix(&l, sb, 3), 2);
    ck_assert_int_eq(kvr_sim_lru_store(&l, sb, lb, 3, &sink, &ev), KVR_OK);
    ck_assert_uint_eq(l.size, 4);
    ck_assert_int_eq(kvr_sim_lru_store(&l, sc, lc, 2, &sink, &ev), KVR_OK);
    ck_assert_uint_eq(ev, 2);
    ck_assert_uint_eq(l.size, 4);
    uint64_t old[8];
    ck_assert_uint_eq(kvr_sim_lru_oldest(&l, old, 8), 4);
    ck_assert(old[0] == sa[1] && old[1] == sa[0] && old[2] == sc[1] && old[3] == sc[0]);
    ck_assert_uint_eq(kvr_sim_lru_prefix(&l, sa, 3), 2);
    ck_assert_uint_eq(kvr_sim_lru_prefix(&l, sb, 3), 2);
    ck_assert_uint_eq(kvr_sim_lru_prefix(&l, sc, 2), 2);

    ck_assert_uint_eq(evs.n, 4);
    struct kvr_event *e = evs.ev;
    ck_assert_int_eq(e[0].kind, KVR_EVENT_STORED);
    ck_assert_uint_eq(e[0].worker_id, 5);
    ck_assert_uint_eq(e[0].event_id, 0);
    ck_assert_int_eq(e[0].has_parent, 0);
    ck_assert_uint_eq(e[0].n, 3);
    for (int k = 0; k < 3; k++) {
        ck_assert(e[0].blocks[k].block_hash == sa[k]);
        ck_assert(e[0].blocks[k].tokens_hash == la[k]);
    }
    ck_assert_int_eq(e[1].kind, KVR_EVENT_STORED);
    ck_assert_uint_eq(e[1].event_id, 1);
    ck_assert_int_eq(e[1].has_parent, 1);
    ck_assert(e[1].parent_hash == sb[1]);
    ck_assert_uint_eq(e[1].n, 1);
    ck_assert(e[1].blocks[0].block_hash == sb[2] && e[1].blocks[0].tokens_hash == lb[2]);
    ck_assert_int_eq(e[2].kind, KVR_EVENT_STORED);
    ck_assert_int_eq(e[2].has_parent, 0);
    ck_assert_int_eq(e[3].kind, KVR_EVENT_REMOVED);
    ck_assert_uint_eq(e[3].event_id, 3);
    ck_assert_uint_eq(e[3].n, 2);
    ck_assert(e[3].hashes[0] == sa[2] && e[3].hashes[1] == sb[2]); /* oldest first */
    ck_assert_uint_eq(l.stored_blocks, 6);
    ck_assert_uint_eq(l.removed_blocks, 2);

    /* A hit being used is touched: order 8 9 1 2 becomes 1 2 8 9 after touching [1,2]; storing
     * the new root [4] (4 1 2 8 9) then evicts 9, where without the touch it would evict 2. */
    uint64_t ld[1], sd[1];
    chain((uint32_t[]){4}, 1, ld, sd);
    ck_assert_uint_eq(kvr_sim_lru_hit(&l, sa, 3), 2);
    ck_assert_int_eq(kvr_sim_lru_store(&l, sd, ld, 1, &sink, &ev), KVR_OK);
    ck_assert_uint_eq(ev, 1);
    ck_assert(evs.ev[evs.n - 1].hashes[0] == sc[1]);
    ck_assert_uint_eq(kvr_sim_lru_prefix(&l, sc, 2), 1);
    ck_assert_uint_eq(kvr_sim_lru_prefix(&l, sa, 3), 2);
    kvr_event_list_free(&evs);
    kvr_sim_lru_free(&l);
}
END_TEST

/* A request longer than the cache: stored whole, then its own tail is evicted (tail-first
 * touching leaves the tail least recent), oldest first: removed [s3, s2]. Capacity 0 keeps
 * nothing. */
START_TEST(longer_than_cache)
{
    uint64_t lo[4], sq[4];
    chain((uint32_t[]){10, 11, 12, 13}, 4, lo, sq);
    struct kvr_event_list evs;
    kvr_event_list_init(&evs);
    struct kvr_sim_sink sink = {capture, &evs};
    struct kvr_sim_lru l;
    kvr_sim_lru_init(&l, 1, 2);
    ck_assert_int_eq(kvr_sim_lru_store(&l, sq, lo, 4, &sink, NULL), KVR_OK);
    ck_assert_uint_eq(evs.n, 2);
    ck_assert_uint_eq(evs.ev[0].n, 4);
    ck_assert_uint_eq(evs.ev[1].n, 2);
    ck_assert(evs.ev[1].hashes[0] == sq[3] && evs.ev[1].hashes[1] == sq[2]);
    ck_assert_uint_eq(kvr_sim_lru_prefix(&l, sq, 4), 2);
    kvr_sim_lru_free(&l);
    kvr_event_list_reset(&evs);
    kvr_sim_lru_init(&l, 1, 0);
    ck_assert_int_eq(kvr_sim_lru_store(&l, sq, lo, 4, &sink, NULL), KVR_OK);
    ck_assert_uint_eq(kvr_sim_lru_prefix(&l, sq, 4), 0);
    ck_assert_uint_eq(l.size, 0);
    ck_assert_uint_eq(evs.n, 2);
    ck_assert_uint_eq(evs.ev[1].n, 4);
    /* touch skips what is not cached and orders the rest tail first */
    kvr_sim_lru_free(&l);
    kvr_sim_lru_init(&l, 1, 8);
    ck_assert_int_eq(kvr_sim_lru_store(&l, sq, lo, 2, NULL, NULL), KVR_OK); /* 10 11 */
    ck_assert_int_eq(kvr_sim_lru_store(&l, sq + 2, lo + 2, 1, NULL, NULL), KVR_OK);
    kvr_sim_lru_touch(&l, sq, 4); /* 10 11 12 (13 absent) */
    uint64_t old[4];
    ck_assert_uint_eq(kvr_sim_lru_oldest(&l, old, 4), 3);
    ck_assert(old[0] == sq[2] && old[1] == sq[1] && old[2] == sq[0]);
    /* Storing nothing new emits nothing. */
    kvr_event_list_reset(&evs);
    ck_assert_int_eq(kvr_sim_lru_store(&l, sq, lo, 0, &sink, NULL), KVR_OK);
    ck_assert_uint_eq(evs.n, 0);
    kvr_sim_lru_free(&l);
    kvr_event_list_free(&evs);
}
END_TEST

struct feed {
    kvr_index_t *idx;
    int errors;
};

static void apply(void *ctx, const struct kvr_event *ev)
{
    struct feed *f = ctx;
    if (kvr_index_apply(f->idx, ev) != KVR_OK)
        f->errors++;
}

/* Oracle: three caches of random prefixes of a random id tree, their events applied to one KV
 * index; after every store, the index's overlap for each worker equals that worker's cached
 * prefix (so the events never create holes and never miss a block), with zero event errors. */
START_TEST(index_reproduces_caches)
{
    uint64_t seed = kvr_test_seed(7);
    struct kvr_test_rng r = {seed};
    enum { W = 3, IDS = 64, LEN = 12 };
    uint32_t parent[IDS];
    for (uint32_t i = 0; i < IDS; i++)
        parent[i] = i == 0 ? UINT32_MAX : (uint32_t)kvr_test_below(&r, i);
    struct feed f = {NULL, 0};
    ck_assert_int_eq(kvr_index_new(NULL, &f.idx), KVR_OK);
    struct kvr_sim_sink sink = {apply, &f};
    struct kvr_sim_lru l[W];
    for (int w = 0; w < W; w++)
        kvr_sim_lru_init(&l[w], (uint64_t)w, 6 + 5 * (uint64_t)w);
    for (int step = 0; step < 3000; step++) {
        /* a request: the path from the root to a random node, possibly cut */
        uint32_t path[IDS], n = 0;
        for (uint32_t x = (uint32_t)kvr_test_below(&r, IDS); x != UINT32_MAX; x = parent[x])
            path[n++] = x;
        uint32_t ids[IDS];
        for (uint32_t i = 0; i < n; i++)
            ids[i] = path[n - 1 - i];
        if (n > LEN)
            n = LEN;
        uint64_t lo[IDS], sq[IDS];
        chain(ids, n, lo, sq);
        int w = (int)kvr_test_below(&r, W);
        ck_assert_int_eq(kvr_sim_lru_store(&l[w], sq, lo, n, &sink, NULL), KVR_OK);
        for (int probe = 0; probe < 4; probe++) {
            uint32_t m = 0;
            for (uint32_t x = (uint32_t)kvr_test_below(&r, IDS); x != UINT32_MAX; x = parent[x])
                path[m++] = x;
            for (uint32_t i = 0; i < m; i++)
                ids[i] = path[m - 1 - i];
            chain(ids, m, lo, sq);
            struct kvr_match out[W];
            size_t nm = 0;
            ck_assert_int_eq(kvr_index_find_matches(f.idx, lo, m, 0, out, W, &nm), KVR_OK);
            for (int k = 0; k < W; k++) {
                uint32_t got = 0;
                for (size_t j = 0; j < nm; j++)
                    if (out[j].worker_id == (uint64_t)k)
                        got = out[j].blocks;
                ck_assert_msg(got == kvr_sim_lru_prefix(&l[k], sq, m),
                              "seed %llu step %d worker %d: index %u, cache %zu",
                              (unsigned long long)seed, step, k, got,
                              kvr_sim_lru_prefix(&l[k], sq, m));
            }
        }
    }
    ck_assert_int_eq(f.errors, 0);
    for (int w = 0; w < W; w++)
        kvr_sim_lru_free(&l[w]);
    kvr_index_free(f.idx);
}
END_TEST

Suite *sim_lru_suite(void)
{
    Suite *s = suite_create("sim_lru");
    TCase *api = tcase_create("api");
    tcase_add_test(api, eviction_order);
    suite_add_tcase(s, api);
    TCase *edge = tcase_create("edge");
    tcase_add_test(edge, longer_than_cache);
    suite_add_tcase(s, edge);
    TCase *oracle = tcase_create("oracle");
    tcase_set_timeout(oracle, 120);
    tcase_add_test(oracle, index_reproduces_caches);
    suite_add_tcase(s, oracle);
    return s;
}
