/* test_index.c - the thread-safe index: API, counters, bounded holds (measured by the
 * max_hold_work counter for stores, removals, clears and rank/worker removals), chunked dumps,
 * and readers and dumps running concurrently with the writer (run under TSan in CI). */
#include <check.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kvr/err.h"
#include "kvr/index.h"

static uint64_t mixh(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    return x;
}

/* Document d: `len` locals; ext of position i = chain hash. */
#define NDOCS 16
#define DOCLEN 256
#define NRANKS 6

struct corpus {
    uint64_t loc[NDOCS][DOCLEN];
    uint64_t ext[NDOCS][DOCLEN];
};

static void corpus_init(struct corpus *c)
{
    for (int d = 0; d < NDOCS; d++) {
        uint64_t h = 7;
        for (int i = 0; i < DOCLEN; i++) {
            /* docs share prefixes pairwise: doc d and d^1 agree on the first 64 blocks */
            uint64_t l = i < 64 ? mixh((uint64_t)(d / 2) * 1000 + (uint64_t)i)
                                : mixh((uint64_t)d * 100000 + (uint64_t)i);
            c->loc[d][i] = l;
            h = mixh(h ^ l) + 1;
            c->ext[d][i] = h;
        }
    }
}

static int store_range(kvr_index_t *idx, const struct corpus *c, uint64_t w, int d, int s, int e)
{
    struct kvr_block b[DOCLEN];
    for (int i = s; i < e; i++) {
        b[i - s].tokens_hash = c->loc[d][i];
        b[i - s].block_hash = c->ext[d][i];
    }
    struct kvr_event ev = {.worker_id = w,
                           .kind = KVR_EVENT_STORED,
                           .n = (uint32_t)(e - s),
                           .blocks = b,
                           .has_parent = s > 0,
                           .parent_hash = s > 0 ? c->ext[d][s - 1] : 0};
    return kvr_index_apply(idx, &ev);
}

static uint32_t score_of(kvr_index_t *idx, const uint64_t *q, size_t n, uint64_t w)
{
    struct kvr_match m[16];
    size_t nm;
    ck_assert_int_eq(kvr_index_find_matches(idx, q, n, 0, m, 16, &nm), KVR_OK);
    for (size_t i = 0; i < nm; i++)
        if (m[i].worker_id == w)
            return m[i].blocks;
    return 0;
}

START_TEST(api_counters_and_tiers)
{
    kvr_index_t *idx;
    struct corpus *c = malloc(sizeof(*c));
    corpus_init(c);
    ck_assert_int_eq(kvr_index_new(NULL, &idx), KVR_OK);
    ck_assert_int_eq(store_range(idx, c, 1, 0, 0, 10), KVR_OK);
    ck_assert_int_eq(store_range(idx, c, 1, 0, 20, 30), KVR_EPARENT);
    ck_assert_uint_eq(score_of(idx, c->loc[0], 10, 1), 10);
    /* A host-tier event does not touch the device index. */
    struct kvr_block b = {.block_hash = 5, .tokens_hash = 6};
    struct kvr_event host = {.worker_id = 2,
                             .kind = KVR_EVENT_STORED,
                             .tier = KVR_TIER_HOST_PINNED,
                             .n = 1,
                             .blocks = &b};
    ck_assert_int_eq(kvr_index_apply(idx, &host), KVR_OK);
    uint64_t rmh[2] = {c->ext[0][9], 12345};
    struct kvr_event rm = {.worker_id = 1, .kind = KVR_EVENT_REMOVED, .n = 2, .hashes = rmh};
    ck_assert_int_eq(kvr_index_apply(idx, &rm), KVR_ENOBLOCK);
    struct kvr_event clr = {.worker_id = 1, .kind = KVR_EVENT_CLEARED};
    int res[2];
    struct kvr_event batch[2] = {clr, rm};
    ck_assert_uint_eq(kvr_index_apply_batch(idx, batch, 2, res), 1);
    ck_assert_int_eq(res[0], KVR_OK);
    ck_assert_int_eq(res[1], KVR_ENOBLOCK);
    struct kvr_index_stats st;
    kvr_index_stats(idx, &st);
    ck_assert_uint_eq(st.counters.events[KVR_EVENT_STORED], 3);
    ck_assert_uint_eq(st.counters.events[KVR_EVENT_REMOVED], 2);
    ck_assert_uint_eq(st.counters.events[KVR_EVENT_CLEARED], 1);
    ck_assert_uint_eq(st.counters.err_parent, 1);
    ck_assert_uint_eq(st.counters.err_block, 3);
    ck_assert_uint_eq(st.counters.non_device, 1);
    ck_assert_uint_eq(st.counters.queries, 1);
    ck_assert_uint_eq(st.radix.block_ranks, 0);
    ck_assert_int_eq(kvr_index_remove_worker(idx, 1), KVR_OK);
    ck_assert_int_eq(kvr_index_remove_worker(idx, 1), KVR_ENOTFOUND);
    kvr_index_free(idx);
    free(c);
}
END_TEST

START_TEST(large_events_are_chunked)
{
    /* With a tiny hold bound, a 256-block store and removal apply in chunks, same result. */
    struct kvr_index_config cfg = {.kind = KVR_INDEX_RADIX, .max_hold_blocks = 7};
    kvr_index_t *idx, *ref;
    struct corpus *c = malloc(sizeof(*c));
    corpus_init(c);
    ck_assert_int_eq(kvr_index_new(&cfg, &idx), KVR_OK);
    ck_assert_int_eq(kvr_index_new(NULL, &ref), KVR_OK);
    for (int d = 0; d < 4; d++) {
        ck_assert_int_eq(store_range(idx, c, 1 + (uint64_t)d % 2, d, 0, DOCLEN), KVR_OK);
        ck_assert_int_eq(store_range(ref, c, 1 + (uint64_t)d % 2, d, 0, DOCLEN), KVR_OK);
    }
    uint64_t rmh[100];
    for (int i = 0; i < 100; i++)
        rmh[i] = c->ext[0][DOCLEN - 1 - i];
    struct kvr_event rm = {.worker_id = 1, .kind = KVR_EVENT_REMOVED, .n = 100, .hashes = rmh};
    ck_assert_int_eq(kvr_index_apply(idx, &rm), KVR_OK);
    ck_assert_int_eq(kvr_index_apply(ref, &rm), KVR_OK);
    for (int d = 0; d < 4; d++)
        for (uint64_t w = 1; w <= 2; w++)
            ck_assert_uint_eq(score_of(idx, c->loc[d], DOCLEN, w),
                              score_of(ref, c->loc[d], DOCLEN, w));
    ck_assert_uint_eq(score_of(idx, c->loc[0], DOCLEN, 1), DOCLEN - 100);
    struct kvr_event_list a, b;
    kvr_event_list_init(&a);
    kvr_event_list_init(&b);
    ck_assert_int_eq(kvr_index_dump(idx, &a), KVR_OK);
    ck_assert_int_eq(kvr_index_dump(ref, &b), KVR_OK);
    ck_assert_uint_eq(a.n, b.n);
    kvr_event_list_free(&a);
    kvr_event_list_free(&b);
    kvr_index_free(idx);
    kvr_index_free(ref);
    free(c);
}
END_TEST

START_TEST(ckf_and_both_kinds)
{
    struct corpus *c = malloc(sizeof(*c));
    corpus_init(c);
    /* The corpus' external hashes are not Dynamo sequence hashes: the CKF translates them. */
    struct kvr_ckf_index_config ckf;
    kvr_ckf_index_config_init(&ckf);
    ckf.translate = 1;
    for (int kind = KVR_INDEX_CKF; kind <= KVR_INDEX_BOTH; kind++) {
        struct kvr_index_config cfg = {.kind = kind, .ckf = &ckf};
        kvr_index_t *idx;
        ck_assert_int_eq(kvr_index_new(&cfg, &idx), KVR_OK);
        ck_assert_int_eq(kvr_index_kind(idx), kind);
        for (int d = 0; d < 6; d++)
            ck_assert_int_eq(store_range(idx, c, 1 + (uint64_t)d % 3, d, 0, 100 + d), KVR_OK);
        for (int d = 0; d < 6; d++) {
            struct kvr_match m[8];
            size_t n;
            ck_assert_int_eq(kvr_index_find_matches_ckf(idx, c->loc[d], DOCLEN, m, 8, &n), KVR_OK);
            uint32_t got = 0;
            for (size_t i = 0; i < n; i++)
                if (m[i].worker_id == 1 + (uint64_t)d % 3)
                    got = m[i].blocks;
            ck_assert_uint_ge(got, (uint32_t)(100 + d)); /* never below what it tracks */
            /* find_matches: exact from the tree (BOTH) or from the CKF (CKF) */
            uint32_t s = score_of(idx, c->loc[d], DOCLEN, 1 + (uint64_t)d % 3);
            if (kind == KVR_INDEX_BOTH)
                ck_assert_uint_eq(s, (uint32_t)(100 + d));
            else
                ck_assert_uint_ge(s, (uint32_t)(100 + d));
        }
        struct kvr_index_stats st;
        kvr_index_stats(idx, &st);
        ck_assert_uint_eq(st.ckf.blocks,
                          100 + 101 + 102 + 103 + 104 + 105); /* no rank shares a pair */
        ck_assert_uint_gt(st.ckf.filter_bytes, 0);
        struct kvr_event_list l;
        kvr_event_list_init(&l);
        ck_assert_int_eq(kvr_index_dump(idx, &l), kind == KVR_INDEX_CKF ? KVR_ESTATE : KVR_OK);
        kvr_event_list_free(&l);
        ck_assert_int_eq(kvr_index_remove_worker(idx, 1), KVR_OK);
        ck_assert_uint_eq(score_of(idx, c->loc[0], DOCLEN, 1), 0);
        kvr_index_free(idx);
    }
    struct kvr_index_config bad = {.kind = 9};
    kvr_index_t *idx;
    ck_assert_int_eq(kvr_index_new(&bad, &idx), KVR_EINVAL);
    free(c);
}
END_TEST

/* A wide tree for worker w: doc d's first 64 blocks are shared with doc d^1 (corpus_init), so
 * 16 documents of 256 blocks make 8 trunks with 2 branches each; plus `twigs` short branches
 * under block 100 of every document. */
static void wide_store(kvr_index_t *idx, const struct corpus *c, uint64_t w, int twigs)
{
    for (int d = 0; d < NDOCS; d++) {
        ck_assert_int_eq(store_range(idx, c, w, d, 0, DOCLEN), KVR_OK);
        for (int k = 0; k < twigs; k++) {
            struct kvr_block b[4];
            for (int i = 0; i < 4; i++) {
                b[i].tokens_hash = mixh((uint64_t)(d * 1000 + k * 10 + i) + 77);
                b[i].block_hash = mixh((uint64_t)(d * 1000 + k * 10 + i) + w * 99991);
            }
            struct kvr_event ev = {.worker_id = w,
                                   .kind = KVR_EVENT_STORED,
                                   .n = 4,
                                   .blocks = b,
                                   .has_parent = 1,
                                   .parent_hash = c->ext[d][100]};
            ck_assert_int_eq(kvr_index_apply(idx, &ev), KVR_OK);
        }
    }
}

START_TEST(bounded_holds_measured)
{
    /* Every write hold stays within max_hold work units (plus a node's fan-out pushed on the
     * drain at once), whatever the operation; the results equal an index with one big hold. */
    enum { HOLD = 64, SLACK = 40 };
    struct corpus *c = malloc(sizeof(*c));
    corpus_init(c);
    for (int op = 0; op < 4; op++) {
        struct kvr_index_config small = {.kind = KVR_INDEX_RADIX, .max_hold_blocks = HOLD};
        struct kvr_index_config big = {.kind = KVR_INDEX_RADIX, .max_hold_blocks = 1u << 30};
        kvr_index_t *idx, *ref;
        ck_assert_int_eq(kvr_index_new(&small, &idx), KVR_OK);
        ck_assert_int_eq(kvr_index_new(&big, &ref), KVR_OK);
        for (uint64_t w = 1; w <= 3; w++) {
            wide_store(idx, c, w, 20);
            wide_store(ref, c, w, 20);
        }
        struct kvr_event clr = {.worker_id = 1, .kind = KVR_EVENT_CLEARED};
        uint64_t heads[NDOCS / 2]; /* docs d and d^1 share their first 64 blocks */
        for (int d = 0; d < NDOCS; d += 2)
            heads[d / 2] = c->ext[d][0];
        struct kvr_event rm = {
            .worker_id = 1, .kind = KVR_EVENT_REMOVED, .n = NDOCS / 2, .hashes = heads};
        struct kvr_index_stats before;
        kvr_index_stats(idx, &before);
        for (int k = 0; k < 2; k++) {
            kvr_index_t *x = k ? ref : idx;
            switch (op) {
            case 0:
                ck_assert_int_eq(kvr_index_apply(x, &clr), KVR_OK);
                break;
            case 1: /* head removals unlink whole trunks once ranks 2 and 3 are gone */
                ck_assert_int_eq(kvr_index_remove_worker(x, 2), KVR_OK);
                ck_assert_int_eq(kvr_index_remove_rank(x, 3, 0), KVR_OK);
                ck_assert_int_eq(kvr_index_apply(x, &rm), KVR_OK);
                break;
            case 2:
                ck_assert_int_eq(kvr_index_remove_worker(x, 1), KVR_OK);
                break;
            default:
                ck_assert_int_eq(kvr_index_remove_rank(x, 1, 0), KVR_OK);
                break;
            }
        }
        struct kvr_index_stats st, rst;
        kvr_index_stats(idx, &st);
        kvr_index_stats(ref, &rst);
        ck_assert_msg(st.counters.max_hold_work <= HOLD + SLACK,
                      "op %d: a hold did %llu work units (bound %d)", op,
                      (unsigned long long)st.counters.max_hold_work, HOLD);
        /* The removal took many holds, not one. */
        ck_assert_uint_gt(st.counters.write_holds - before.counters.write_holds, 20);
        ck_assert_uint_gt(rst.counters.max_hold_work, 10 * HOLD); /* the reference did not split */
        ck_assert_uint_eq(st.radix.block_ranks, rst.radix.block_ranks);
        ck_assert_uint_eq(st.radix.nodes, rst.radix.nodes);
        for (int d = 0; d < NDOCS; d++)
            for (uint64_t w = 1; w <= 3; w++)
                ck_assert_uint_eq(score_of(idx, c->loc[d], DOCLEN, w),
                                  score_of(ref, c->loc[d], DOCLEN, w));
        char msg[256];
        ck_assert_msg(kvr_radix_check(kvr_index_radix(idx), msg, sizeof(msg)) == KVR_OK, "%s", msg);
        kvr_index_free(idx);
        kvr_index_free(ref);
    }
    free(c);
}
END_TEST

START_TEST(dump_in_chunks)
{
    /* Without writes a chunked dump is an exact cut, identical to the tree's one-shot dump. */
    struct kvr_index_config cfg = {.kind = KVR_INDEX_RADIX, .dump_chunk_blocks = 50};
    struct corpus *c = malloc(sizeof(*c));
    corpus_init(c);
    kvr_index_t *idx;
    ck_assert_int_eq(kvr_index_new(&cfg, &idx), KVR_OK);
    for (uint64_t w = 1; w <= 3; w++)
        wide_store(idx, c, w, 3);
    struct kvr_event_list a, b;
    kvr_event_list_init(&a);
    kvr_event_list_init(&b);
    struct kvr_index_dump_info info;
    ck_assert_int_eq(kvr_index_dump_ex(idx, &a, &info), KVR_OK);
    ck_assert_int_eq(info.exact, 1);
    ck_assert_uint_gt(info.chunks, 20);
    ck_assert_int_eq(kvr_radix_dump(kvr_index_radix(idx), &b), KVR_OK);
    ck_assert_uint_eq(a.n, b.n);
    for (size_t i = 0; i < a.n; i++) {
        ck_assert_uint_eq(a.ev[i].event_id, b.ev[i].event_id);
        ck_assert_uint_eq(a.ev[i].worker_id, b.ev[i].worker_id);
        ck_assert_uint_eq(a.ev[i].parent_hash, b.ev[i].parent_hash);
        ck_assert_uint_eq(a.ev[i].n, b.ev[i].n);
        ck_assert(memcmp(a.ev[i].blocks, b.ev[i].blocks, a.ev[i].n * sizeof(struct kvr_block)) ==
                  0);
    }
    kvr_event_list_free(&a);
    kvr_event_list_free(&b);
    struct kvr_index_config bad = {.dump_chunk_blocks = UINT64_MAX};
    kvr_index_t *x = NULL;
    if (sizeof(size_t) < sizeof(uint64_t))
        ck_assert_int_eq(kvr_index_new(&bad, &x), KVR_EINVAL);
    kvr_index_free(x);
    kvr_index_free(idx);
    free(c);
}
END_TEST

/* ==== concurrency =========================================================================== */

struct shared {
    kvr_index_t *idx;
    const struct corpus *c;
    atomic_int phase; /* 0 running stores, 1 running removals, 2 done */
    atomic_int failures;
    atomic_ullong progress; /* queries answered, all readers */
};

/* Makes the writer wait (yielding, at most 2 s) until the readers answered a few more queries,
 * so reads really interleave with every writer step even on an oversubscribed machine. */
static void await_readers(struct shared *sh, int nreaders)
{
    unsigned long long want = atomic_load(&sh->progress) + (unsigned long long)nreaders;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    while (atomic_load(&sh->progress) < want) {
        sched_yield();
        clock_gettime(CLOCK_MONOTONIC, &t1);
        if (t1.tv_sec - t0.tv_sec > 2)
            break;
    }
}

struct reader {
    struct shared *sh;
    uint64_t seed;
    uint32_t last[2][NDOCS][NRANKS]; /* last score seen in each phase */
    uint32_t lo[NDOCS][NRANKS];      /* minimum seen in the removal phase */
    uint64_t queries;
};

static void *reader_main(void *arg)
{
    struct reader *r = arg;
    uint64_t s = r->seed;
    memset(r->lo, 0xff, sizeof(r->lo));
    for (;;) {
        int phase = atomic_load(&r->sh->phase);
        if (phase == 2)
            break;
        s = mixh(s + 1);
        int d = (int)(s % NDOCS);
        struct kvr_match m[16];
        size_t nm;
        if (kvr_index_find_matches(r->sh->idx, r->sh->c->loc[d], DOCLEN, 0, m, 16, &nm) != KVR_OK) {
            atomic_fetch_add(&r->sh->failures, 1);
            continue;
        }
        r->queries++;
        atomic_fetch_add(&r->sh->progress, 1);
        uint32_t got[NRANKS] = {0};
        for (size_t i = 0; i < nm; i++) {
            if (m[i].worker_id == 0 || m[i].worker_id > NRANKS || m[i].blocks > DOCLEN) {
                atomic_fetch_add(&r->sh->failures, 1);
                continue;
            }
            got[m[i].worker_id - 1] = m[i].blocks;
        }
        /* The phase may have moved on during the query: re-read it and only judge queries
         * that started and ended in the same phase. */
        if (atomic_load(&r->sh->phase) != phase)
            continue;
        for (int w = 0; w < NRANKS; w++) {
            if (phase == 0) {
                if (got[w] < r->last[0][d][w]) /* stores only: never decreases */
                    atomic_fetch_add(&r->sh->failures, 1);
                r->last[0][d][w] = got[w];
            } else {
                if (r->lo[d][w] != UINT32_MAX && got[w] > r->lo[d][w]) /* removals: never grows */
                    atomic_fetch_add(&r->sh->failures, 1);
                if (got[w] < r->lo[d][w])
                    r->lo[d][w] = got[w];
                r->last[1][d][w] = got[w];
            }
        }
    }
    return NULL;
}

START_TEST(readers_concurrent_with_writer)
{
    struct kvr_index_config cfg = {.kind = KVR_INDEX_RADIX, .max_hold_blocks = 32};
    struct corpus *c = malloc(sizeof(*c));
    corpus_init(c);
    struct shared sh = {.c = c};
    ck_assert_int_eq(kvr_index_new(&cfg, &sh.idx), KVR_OK);
    atomic_init(&sh.phase, 0);
    atomic_init(&sh.failures, 0);
    atomic_init(&sh.progress, 0);
    enum { NREADERS = 3 };
    struct reader *rd = calloc(NREADERS, sizeof(*rd));
    pthread_t th[NREADERS];
    for (int i = 0; i < NREADERS; i++) {
        rd[i].sh = &sh;
        rd[i].seed = (uint64_t)i * 77 + 1;
        ck_assert_int_eq(pthread_create(&th[i], NULL, reader_main, &rd[i]), 0);
    }
    /* Phase 0: every rank stores every doc in increments of 16 blocks. */
    for (int step = 0; step < DOCLEN / 16; step++) {
        await_readers(&sh, NREADERS);
        for (int d = 0; d < NDOCS; d++)
            for (uint64_t w = 1; w <= NRANKS; w++)
                if ((d + (int)w) % 3 != 0)
                    ck_assert_int_eq(store_range(sh.idx, c, w, d, step * 16, step * 16 + 16),
                                     KVR_OK);
    }
    uint32_t full[NDOCS][NRANKS];
    for (int d = 0; d < NDOCS; d++)
        for (uint64_t w = 1; w <= NRANKS; w++)
            full[d][w - 1] = score_of(sh.idx, c->loc[d], DOCLEN, w);
    atomic_store(&sh.phase, 1);
    /* Phase 1: tail removals in runs of 8 blocks, children first. */
    for (int step = DOCLEN / 8 - 1; step >= 8; step--) {
        if (step % 2 == 0)
            await_readers(&sh, NREADERS);
        for (int d = 0; d < NDOCS; d++) {
            for (uint64_t w = 1; w <= NRANKS; w++) {
                if ((d + (int)w) % 3 == 0)
                    continue;
                uint64_t h[8];
                for (int i = 0; i < 8; i++)
                    h[i] = c->ext[d][step * 8 + 7 - i];
                struct kvr_event rm = {
                    .worker_id = w, .kind = KVR_EVENT_REMOVED, .n = 8, .hashes = h};
                (void)kvr_index_apply(sh.idx, &rm);
            }
        }
    }
    uint32_t after[NDOCS][NRANKS];
    for (int d = 0; d < NDOCS; d++)
        for (uint64_t w = 1; w <= NRANKS; w++)
            after[d][w - 1] = score_of(sh.idx, c->loc[d], DOCLEN, w);
    atomic_store(&sh.phase, 2);
    uint64_t queries = 0;
    for (int i = 0; i < NREADERS; i++) {
        pthread_join(th[i], NULL);
        queries += rd[i].queries;
        for (int d = 0; d < NDOCS; d++)
            for (int w = 0; w < NRANKS; w++) {
                ck_assert_uint_le(rd[i].last[0][d][w], full[d][w]);
                if (rd[i].lo[d][w] != UINT32_MAX)
                    ck_assert_uint_ge(rd[i].lo[d][w], after[d][w]);
            }
    }
    ck_assert_int_eq(atomic_load(&sh.failures), 0);
    ck_assert_uint_gt(queries, 0);
    for (int d = 0; d < NDOCS; d++)
        for (int w = 0; w < NRANKS; w++) {
            /* rank w+1 stores doc d unless (d + w + 1) % 3 == 0; docs d and d^1 share 64. */
            int own = (d + w + 1) % 3 != 0, sib = ((d ^ 1) + w + 1) % 3 != 0;
            ck_assert_uint_eq(full[d][w], own ? DOCLEN : (sib ? 64 : 0));
            ck_assert_uint_eq(after[d][w], own || sib ? 64 : 0);
        }
    fprintf(stderr, "index concurrency: %llu reader queries during writes\n",
            (unsigned long long)queries);
    kvr_index_free(sh.idx);
    free(rd);
    free(c);
}
END_TEST

/* Readers while ranks are dropped in bounded holds: the dropped ranks' scores only fall, the
 * untouched rank's never change. */
struct drop_shared {
    kvr_index_t *idx;
    const struct corpus *c;
    uint32_t full4[NDOCS]; /* rank 4's scores, constant */
    atomic_int done;
    atomic_int failures;
    atomic_ullong queries;
    atomic_ullong progress;
};

/* Waits (yielding, at most 2 s) until the readers answered `n` more queries. */
static void await_progress(atomic_ullong *progress, unsigned long long n)
{
    unsigned long long want = atomic_load(progress) + n;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    while (atomic_load(progress) < want) {
        sched_yield();
        clock_gettime(CLOCK_MONOTONIC, &t1);
        if (t1.tv_sec - t0.tv_sec > 2)
            break;
    }
}

static void *drop_reader(void *arg)
{
    struct drop_shared *sh = arg;
    uint32_t last[NDOCS][4];
    memset(last, 0xff, sizeof(last));
    uint64_t s = 12345, q = 0;
    while (!atomic_load(&sh->done)) {
        s = mixh(s + 1);
        int d = (int)(s % NDOCS);
        struct kvr_match m[16];
        size_t nm;
        if (kvr_index_find_matches(sh->idx, sh->c->loc[d], DOCLEN, 0, m, 16, &nm) != KVR_OK) {
            atomic_fetch_add(&sh->failures, 1);
            continue;
        }
        q++;
        atomic_fetch_add(&sh->progress, 1);
        uint32_t got[4] = {0};
        for (size_t i = 0; i < nm; i++)
            if (m[i].worker_id >= 1 && m[i].worker_id <= 4)
                got[m[i].worker_id - 1] = m[i].blocks;
        for (int w = 0; w < 3; w++) {
            if (got[w] > last[d][w]) /* removals only: never grows */
                atomic_fetch_add(&sh->failures, 1);
            last[d][w] = got[w];
        }
        if (got[3] != sh->full4[d])
            atomic_fetch_add(&sh->failures, 1);
    }
    atomic_fetch_add(&sh->queries, q);
    return NULL;
}

START_TEST(readers_during_bounded_drops)
{
    struct kvr_index_config cfg = {.kind = KVR_INDEX_RADIX, .max_hold_blocks = 16};
    struct corpus *c = malloc(sizeof(*c));
    corpus_init(c);
    struct drop_shared sh = {.c = c};
    ck_assert_int_eq(kvr_index_new(&cfg, &sh.idx), KVR_OK);
    for (uint64_t w = 1; w <= 4; w++)
        wide_store(sh.idx, c, w, w == 4 ? 0 : 10);
    for (int d = 0; d < NDOCS; d++)
        sh.full4[d] = score_of(sh.idx, c->loc[d], DOCLEN, 4);
    atomic_init(&sh.done, 0);
    atomic_init(&sh.failures, 0);
    atomic_init(&sh.queries, 0);
    atomic_init(&sh.progress, 0);
    enum { NREADERS = 2 };
    pthread_t th[NREADERS];
    for (int i = 0; i < NREADERS; i++)
        ck_assert_int_eq(pthread_create(&th[i], NULL, drop_reader, &sh), 0);
    await_progress(&sh.progress, NREADERS); /* the readers are running */
    struct kvr_event clr = {.worker_id = 1, .kind = KVR_EVENT_CLEARED};
    ck_assert_int_eq(kvr_index_apply(sh.idx, &clr), KVR_OK);
    await_progress(&sh.progress, NREADERS);
    ck_assert_int_eq(kvr_index_remove_rank(sh.idx, 2, 0), KVR_OK);
    await_progress(&sh.progress, NREADERS);
    ck_assert_int_eq(kvr_index_remove_worker(sh.idx, 3), KVR_OK);
    atomic_store(&sh.done, 1);
    for (int i = 0; i < NREADERS; i++)
        pthread_join(th[i], NULL);
    ck_assert_int_eq(atomic_load(&sh.failures), 0);
    ck_assert_uint_gt(atomic_load(&sh.queries), 0);
    for (int d = 0; d < NDOCS; d++) {
        for (uint64_t w = 1; w <= 3; w++)
            ck_assert_uint_eq(score_of(sh.idx, c->loc[d], DOCLEN, w), 0);
        ck_assert_uint_eq(score_of(sh.idx, c->loc[d], DOCLEN, 4), sh.full4[d]);
    }
    struct kvr_index_stats st;
    kvr_index_stats(sh.idx, &st);
    ck_assert_uint_le(st.counters.max_hold_work, 16 + 40);
    fprintf(stderr, "index drops: %llu reader queries, %llu write holds\n",
            (unsigned long long)atomic_load(&sh.queries),
            (unsigned long long)st.counters.write_holds);
    kvr_index_free(sh.idx);
    free(c);
}
END_TEST

/* Dumps while a writer stores and removes: every dumped block is one its rank stored (the
 * corpus' own external hash of that position), every dump replays without overcounting that
 * rank's corpus, and once the writer stops a dump is exact again. */
struct dump_shared {
    kvr_index_t *idx;
    const struct corpus *c;
    atomic_int done;
    atomic_int failures;
    atomic_int dumps;
};

static int corpus_block_of(const struct corpus *c, const struct kvr_block *b)
{
    for (int d = 0; d < NDOCS; d++)
        for (int i = 0; i < DOCLEN; i++)
            if (c->loc[d][i] == b->tokens_hash && c->ext[d][i] == b->block_hash)
                return 1;
    return 0;
}

static void *dumper_main(void *arg)
{
    struct dump_shared *sh = arg;
    while (!atomic_load(&sh->done)) {
        struct kvr_event_list l;
        struct kvr_index_dump_info info;
        kvr_event_list_init(&l);
        if (kvr_index_dump_ex(sh->idx, &l, &info) != KVR_OK)
            atomic_fetch_add(&sh->failures, 1);
        for (size_t i = 0; i < l.n; i++) {
            if (l.ev[i].event_id != i || l.ev[i].kind != KVR_EVENT_STORED)
                atomic_fetch_add(&sh->failures, 1);
            for (uint32_t j = 0; j < l.ev[i].n; j++)
                if (!corpus_block_of(sh->c, &l.ev[i].blocks[j]))
                    atomic_fetch_add(&sh->failures, 1);
        }
        kvr_index_t *r;
        if (kvr_index_new(NULL, &r) == KVR_OK) {
            for (size_t i = 0; i < l.n; i++)
                (void)kvr_index_apply(r, &l.ev[i]);
            for (int d = 0; d < NDOCS; d++) {
                struct kvr_match m[16];
                size_t nm;
                if (kvr_index_find_matches(r, sh->c->loc[d], DOCLEN, 0, m, 16, &nm) != KVR_OK)
                    atomic_fetch_add(&sh->failures, 1);
                for (size_t i = 0; i < nm; i++)
                    if (m[i].blocks > DOCLEN || m[i].worker_id == 0 || m[i].worker_id > NRANKS)
                        atomic_fetch_add(&sh->failures, 1);
            }
            kvr_index_free(r);
        }
        kvr_event_list_free(&l);
        atomic_fetch_add(&sh->dumps, 1);
    }
    return NULL;
}

START_TEST(dumps_during_writes)
{
    struct kvr_index_config cfg = {
        .kind = KVR_INDEX_RADIX, .max_hold_blocks = 32, .dump_chunk_blocks = 64};
    struct corpus *c = malloc(sizeof(*c));
    corpus_init(c);
    struct dump_shared sh = {.c = c};
    ck_assert_int_eq(kvr_index_new(&cfg, &sh.idx), KVR_OK);
    atomic_init(&sh.done, 0);
    atomic_init(&sh.failures, 0);
    atomic_init(&sh.dumps, 0);
    pthread_t th;
    ck_assert_int_eq(pthread_create(&th, NULL, dumper_main, &sh), 0);
    for (int round = 0; round < 6; round++) {
        for (int d = 0; d < NDOCS; d++)
            for (uint64_t w = 1; w <= NRANKS; w++)
                if ((d + (int)w + round) % 3 != 0)
                    ck_assert_int_eq(store_range(sh.idx, c, w, d, 0, DOCLEN), KVR_OK);
        for (int d = 0; d < NDOCS; d++) {
            uint64_t w = 1 + (uint64_t)(d + round) % NRANKS;
            uint64_t h[3] = {c->ext[d][200], c->ext[d][30], c->ext[d][0]};
            struct kvr_event rm = {.worker_id = w, .kind = KVR_EVENT_REMOVED, .n = 3, .hashes = h};
            (void)kvr_index_apply(sh.idx, &rm);
        }
        ck_assert_int_eq(kvr_index_remove_worker(sh.idx, 1 + (uint64_t)round % NRANKS), KVR_OK);
    }
    while (atomic_load(&sh.dumps) < 3)
        sched_yield();
    atomic_store(&sh.done, 1);
    pthread_join(th, NULL);
    ck_assert_int_eq(atomic_load(&sh.failures), 0);
    /* Quiet now: an exact cut that replays to identical scores. */
    struct kvr_event_list l;
    struct kvr_index_dump_info info;
    kvr_event_list_init(&l);
    ck_assert_int_eq(kvr_index_dump_ex(sh.idx, &l, &info), KVR_OK);
    ck_assert_int_eq(info.exact, 1);
    kvr_index_t *r;
    ck_assert_int_eq(kvr_index_new(NULL, &r), KVR_OK);
    for (size_t i = 0; i < l.n; i++)
        ck_assert_int_eq(kvr_index_apply(r, &l.ev[i]), KVR_OK);
    for (int d = 0; d < NDOCS; d++)
        for (uint64_t w = 1; w <= NRANKS; w++)
            ck_assert_uint_eq(score_of(r, c->loc[d], DOCLEN, w),
                              score_of(sh.idx, c->loc[d], DOCLEN, w));
    fprintf(stderr, "index dumps during writes: %d dumps\n", atomic_load(&sh.dumps));
    kvr_event_list_free(&l);
    kvr_index_free(r);
    kvr_index_free(sh.idx);
    free(c);
}
END_TEST

/* CKF error accounting: BlockNotFound counts each unknown hash of a removal (CKF-only: it was 1
 * per event); in BOTH mode the counters are the tree's and the CKF's own are in stats.ckf. */
START_TEST(ckf_error_counters)
{
    for (int kind = KVR_INDEX_CKF; kind <= KVR_INDEX_BOTH; kind++) {
        struct kvr_index_config cfg = {.kind = kind};
        kvr_index_t *idx;
        ck_assert_int_eq(kvr_index_new(&cfg, &idx), KVR_OK);
        struct kvr_block b = {77, 77};
        struct kvr_event st_ev = {.kind = KVR_EVENT_STORED, .worker_id = 1, .n = 1, .blocks = &b};
        ck_assert_int_eq(kvr_index_apply(idx, &st_ev), KVR_OK);
        uint64_t gone[3] = {77, 5, 6};
        struct kvr_event rm = {.kind = KVR_EVENT_REMOVED, .worker_id = 1, .n = 3, .hashes = gone};
        ck_assert_int_eq(kvr_index_apply(idx, &rm), KVR_ENOBLOCK);
        struct kvr_index_stats st;
        kvr_index_stats(idx, &st);
        ck_assert_uint_eq(st.counters.err_block, 2);
        ck_assert_uint_eq(st.ckf.err_block, 2);
        ck_assert_uint_eq(st.counters.err_other, 0);
        ck_assert_uint_eq(st.counters.err_capacity, 0);
        kvr_index_free(idx);
    }
}
END_TEST

Suite *index_suite(void);

Suite *index_suite(void)
{
    Suite *s = suite_create("index");
    TCase *tc = tcase_create("api");
    tcase_add_test(tc, api_counters_and_tiers);
    tcase_add_test(tc, large_events_are_chunked);
    tcase_add_test(tc, ckf_and_both_kinds);
    tcase_add_test(tc, ckf_error_counters);
    tcase_add_test(tc, bounded_holds_measured);
    tcase_add_test(tc, dump_in_chunks);
    suite_add_tcase(s, tc);
    tc = tcase_create("concurrency");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, readers_concurrent_with_writer);
    tcase_add_test(tc, readers_during_bounded_drops);
    tcase_add_test(tc, dumps_during_writes);
    suite_add_tcase(s, tc);
    return s;
}
