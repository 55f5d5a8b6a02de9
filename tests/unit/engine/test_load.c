/* test_load.c - Check suite for engine/src/load.c (per-rank active load, scheduling.md §6).
 * SPDX-License-Identifier: Apache-2.0 */
#include <check.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvr/err.h"
#include "kvr/load.h"

Suite *load_suite(void);

static kvr_load_t *ld;

static void setup4(void)
{
    struct kvr_load_config cfg = {.block_size = 4};
    ck_assert_int_eq(kvr_load_new(&cfg, &ld), KVR_OK);
}

static void teardown(void)
{
    kvr_load_free(ld);
    ld = NULL;
}

static int add(uint64_t id, uint64_t w, uint32_t dp, const uint64_t *h, size_t n, uint32_t isl,
               uint32_t overlap, uint64_t now)
{
    struct kvr_load_request rq = {.request_id = id,
                                  .worker_id = w,
                                  .dp_rank = dp,
                                  .isl_tokens = isl,
                                  .overlap_blocks = overlap,
                                  .track_prefill = 1,
                                  .seq_hashes = h,
                                  .n_hashes = n};
    return kvr_load_add(ld, &rq, now);
}

static void expect(uint64_t w, uint32_t dp, uint64_t blocks, uint64_t tokens, uint64_t reqs)
{
    struct kvr_load_rank r;
    kvr_load_rank_get(ld, w, dp, &r);
    ck_assert_uint_eq(r.active_blocks, blocks);
    ck_assert_uint_eq(r.prefill_tokens, tokens);
    ck_assert_uint_eq(r.requests, reqs);
}

/* ==== api ==================================================================================== */

START_TEST(worked_example)
{
    /* scheduling.md §6: block size 4; (active blocks, active prefill tokens) after each step. */
    static const uint64_t r1[] = {1, 2, 3}, r2[] = {4}, r3[] = {1, 2, 3, 4};
    ck_assert_int_eq(add(1, 7, 0, r1, 3, 12, 0, 0), KVR_OK);
    expect(7, 0, 3, 12, 1);
    ck_assert_int_eq(add(2, 7, 0, r2, 1, 4, 0, 0), KVR_OK);
    expect(7, 0, 4, 16, 2);
    ck_assert_int_eq(add(3, 7, 0, r3, 4, 16, 4, 0), KVR_OK);
    expect(7, 0, 4, 16, 3);
    ck_assert_int_eq(kvr_load_release(ld, 2, 1), KVR_OK);
    expect(7, 0, 4, 12, 2);
    ck_assert_int_eq(kvr_load_release(ld, 3, 1), KVR_OK);
    expect(7, 0, 3, 12, 1);
    ck_assert_int_eq(kvr_load_release(ld, 1, 1), KVR_OK);
    expect(7, 0, 0, 0, 0);
}
END_TEST

START_TEST(first_token_once)
{
    static const uint64_t h[] = {10, 11};
    ck_assert_int_eq(add(5, 1, 0, h, 2, 10, 1, 0), KVR_OK); /* 10 - 1*4 = 6 tokens */
    expect(1, 0, 2, 6, 1);
    ck_assert_int_eq(kvr_load_first_token(ld, 5, 1), KVR_OK);
    expect(1, 0, 2, 0, 1);
    ck_assert_int_eq(kvr_load_first_token(ld, 5, 2), KVR_OK); /* no-op */
    expect(1, 0, 2, 0, 1);
    ck_assert_int_eq(kvr_load_release(ld, 5, 3), KVR_OK);
    expect(1, 0, 0, 0, 0);
    ck_assert_int_eq(kvr_load_release(ld, 5, 3), KVR_ENOTFOUND);
    ck_assert_int_eq(kvr_load_first_token(ld, 99, 3), KVR_ENOTFOUND);
    struct kvr_load_stats st;
    kvr_load_stats(ld, &st);
    ck_assert_uint_eq(st.unknown, 2);
    ck_assert_uint_eq(st.first_tokens, 1);
    ck_assert_uint_eq(st.released, 1);
}
END_TEST

START_TEST(duplicates_and_edges)
{
    static const uint64_t h[] = {1, 2};
    ck_assert_int_eq(add(1, 1, 0, h, 2, 100, 0, 0), KVR_OK);
    ck_assert_int_eq(add(1, 2, 0, h, 2, 100, 0, 0), KVR_EEXIST); /* ignored */
    expect(2, 0, 0, 0, 0);
    expect(1, 0, 2, 100, 1);
    /* Overlap beyond the input: no prefill. Untracked prefill: none either. */
    ck_assert_int_eq(add(2, 1, 1, h, 2, 8, 5, 0), KVR_OK);
    expect(1, 1, 2, 0, 1);
    struct kvr_load_request rq = {.request_id = 3, .worker_id = 1, .dp_rank = 2, .isl_tokens = 50};
    ck_assert_int_eq(kvr_load_add(ld, &rq, 0), KVR_OK); /* no hashes, untracked prefill */
    expect(1, 2, 0, 0, 1);
    rq.request_id = 4;
    rq.n_hashes = 1; /* NULL hashes with n > 0 */
    ck_assert_int_eq(kvr_load_add(ld, &rq, 0), KVR_EINVAL);
    /* Request id 0 is a valid id. */
    ck_assert_int_eq(add(0, 3, 0, h, 1, 4, 0, 0), KVR_OK);
    expect(3, 0, 1, 4, 1);
    ck_assert_int_eq(kvr_load_release(ld, 0, 0), KVR_OK);
    struct kvr_load_rank r;
    ck_assert_int_eq(kvr_load_rank_get(ld, 42, 0, &r), 0);
    ck_assert_uint_eq(r.worker_id, 42);
    ck_assert_uint_eq(r.requests, 0);
    struct kvr_load_config bad = {.block_size = 1};
    kvr_load_t *x = NULL;
    ck_assert_int_eq(kvr_load_new(&bad, &x), KVR_EINVAL);
    ck_assert_ptr_null(x);
}
END_TEST

START_TEST(query_new_blocks)
{
    static const uint64_t a[] = {1, 2, 3}, b[] = {1, 2, 9};
    ck_assert_int_eq(add(1, 1, 0, a, 3, 12, 0, 0), KVR_OK);
    ck_assert_int_eq(add(2, 2, 0, b, 3, 12, 1, 0), KVR_OK);
    static const uint64_t want[] = {1, 2, 3, 4};
    struct kvr_load_query q[3] = {{.worker_id = 1}, {.worker_id = 2}, {.worker_id = 3}};
    kvr_load_query(ld, want, 4, q, 3);
    ck_assert_uint_eq(q[0].known, 1);
    ck_assert_uint_eq(q[0].new_blocks, 1);
    ck_assert_uint_eq(q[0].active_blocks, 3);
    ck_assert_uint_eq(q[0].prefill_tokens, 12);
    ck_assert_uint_eq(q[1].new_blocks, 2);
    ck_assert_uint_eq(q[1].prefill_tokens, 8);
    ck_assert_uint_eq(q[2].known, 0);
    ck_assert_uint_eq(q[2].new_blocks, 4);
    struct kvr_load_rank all[2];
    size_t n = 0;
    ck_assert_int_eq(kvr_load_ranks(ld, all, 1, &n), KVR_ERANGE);
    ck_assert_uint_eq(n, 2);
    ck_assert_int_eq(kvr_load_ranks(ld, all, 2, &n), KVR_OK);
    ck_assert_uint_eq(all[0].worker_id, 1);
    ck_assert_uint_eq(all[1].worker_id, 2);
    ck_assert_uint_eq(kvr_load_remove_worker(ld, 1), 1);
    ck_assert_int_eq(kvr_load_ranks(ld, all, 2, &n), KVR_OK);
    ck_assert_uint_eq(n, 1);
    ck_assert_uint_eq(all[0].worker_id, 2);
    ck_assert_int_eq(kvr_load_release(ld, 1, 0), KVR_ENOTFOUND);
    /* The worker comes back: a fresh rank. */
    ck_assert_int_eq(add(3, 1, 0, a, 3, 4, 0, 0), KVR_OK);
    expect(1, 0, 3, 4, 1);
}
END_TEST

/* ==== expiry ================================================================================= */

START_TEST(expiry_lazy)
{
    static const uint64_t h[] = {1};
    ck_assert_int_eq(add(1, 1, 0, h, 1, 4, 0, 0), KVR_OK);
    ck_assert_int_eq(add(2, 1, 0, h, 1, 4, 0, 299999), KVR_OK); /* scan: r1 is 299999 ms old */
    expect(1, 0, 1, 8, 2);
    ck_assert_int_eq(add(3, 1, 0, h, 1, 4, 0, 300000), KVR_OK); /* < 30 s since the scan */
    expect(1, 0, 1, 12, 3);                                     /* r1 (300 s old) still here */
    ck_assert_int_eq(add(4, 1, 0, h, 1, 4, 0, 329999), KVR_OK); /* scan: r1 expires */
    expect(1, 0, 1, 12, 3);
    ck_assert_int_eq(kvr_load_release(ld, 1, 329999), KVR_ENOTFOUND);
    ck_assert_uint_eq(kvr_load_expire(ld, 599999), 1); /* forced: r2 (300000 ms old) */
    ck_assert_uint_eq(kvr_load_expire(ld, 629999), 2); /* r3, r4 */
    expect(1, 0, 0, 0, 0);
    struct kvr_load_stats st;
    kvr_load_stats(ld, &st);
    ck_assert_uint_eq(st.expired, 4);
    ck_assert_uint_eq(st.active, 0);
}
END_TEST

START_TEST(expiry_configured)
{
    kvr_load_free(ld);
    struct kvr_load_config cfg = {.block_size = 16, .expiry_ms = 100, .expiry_check_ms = 10};
    ck_assert_int_eq(kvr_load_new(&cfg, &ld), KVR_OK);
    static const uint64_t h[] = {1};
    ck_assert_int_eq(add(1, 1, 0, h, 1, 32, 0, 1000), KVR_OK);
    ck_assert_int_eq(add(2, 1, 0, h, 1, 32, 0, 1099), KVR_OK);
    expect(1, 0, 1, 64, 2);
    ck_assert_int_eq(add(3, 1, 0, h, 1, 32, 0, 1100), KVR_OK); /* 1 ms since the last scan */
    expect(1, 0, 1, 96, 3);
    ck_assert_int_eq(add(4, 1, 0, h, 1, 32, 0, 1110), KVR_OK); /* scan: r1 (110 ms) expires */
    expect(1, 0, 1, 96, 3);
    ck_assert_int_eq(kvr_load_release(ld, 1, 1110), KVR_ENOTFOUND);
}
END_TEST

/* ==== observer (replica-sync hook) =========================================================== */

struct oplog {
    char text[512];
    size_t len;
};

static void record(void *ctx, const struct kvr_load_op *op)
{
    struct oplog *l = ctx;
    l->len += (size_t)snprintf(l->text + l->len, sizeof(l->text) - l->len, "%d:%llu@%llu/%u",
                               op->kind, (unsigned long long)op->request_id,
                               (unsigned long long)op->worker_id, op->dp_rank);
    if (op->kind == KVR_LOAD_OP_ADD)
        l->len += (size_t)snprintf(l->text + l->len, sizeof(l->text) - l->len, "[%u,%u,%zu]",
                                   op->isl_tokens, op->overlap_blocks, op->n_hashes);
    l->len += (size_t)snprintf(l->text + l->len, sizeof(l->text) - l->len, " ");
}

START_TEST(observer_sees_every_op)
{
    kvr_load_free(ld);
    struct oplog log = {{0}, 0};
    struct kvr_load_config cfg = {
        .block_size = 4, .expiry_ms = 1000, .observer = record, .observer_ctx = &log};
    ck_assert_int_eq(kvr_load_new(&cfg, &ld), KVR_OK);
    static const uint64_t h[] = {1, 2};
    ck_assert_int_eq(add(1, 7, 1, h, 2, 8, 1, 0), KVR_OK);
    ck_assert_int_eq(add(1, 7, 1, h, 2, 8, 1, 0), KVR_EEXIST); /* not reported */
    ck_assert_int_eq(kvr_load_first_token(ld, 1, 1), KVR_OK);
    ck_assert_int_eq(kvr_load_first_token(ld, 1, 2), KVR_OK); /* not reported again */
    ck_assert_int_eq(kvr_load_release(ld, 1, 3), KVR_OK);
    ck_assert_int_eq(add(2, 8, 0, h, 1, 4, 0, 10), KVR_OK);
    ck_assert_uint_eq(kvr_load_expire(ld, 5000), 1);
    ck_assert_str_eq(log.text, "1:1@7/1[8,1,2] 2:1@7/1 3:1@7/1 1:2@8/0[4,0,1] 4:2@8/0 ");
}
END_TEST

/* ==== origins (replica sync) ================================================================= */

struct listing {
    uint64_t ids[8];
    uint64_t prefill[8];
    size_t nh[8];
    uint32_t origin[8];
    size_t n;
};

static void list_one(void *ctx, const struct kvr_load_op *op)
{
    struct listing *l = ctx;
    ck_assert_int_eq(op->kind, KVR_LOAD_OP_ADD);
    ck_assert_uint_eq(op->isl_tokens, op->prefill_tokens);
    ck_assert_uint_eq(op->overlap_blocks, 0);
    if (l->n < 8) {
        l->ids[l->n] = op->request_id;
        l->prefill[l->n] = op->prefill_tokens;
        l->nh[l->n] = op->n_hashes;
        l->origin[l->n] = op->origin;
    }
    l->n++;
}

static int add_from(uint64_t id, uint64_t w, const uint64_t *h, size_t n, uint32_t isl,
                    uint32_t overlap, uint32_t origin)
{
    struct kvr_load_request rq = {.request_id = id,
                                  .worker_id = w,
                                  .isl_tokens = isl,
                                  .overlap_blocks = overlap,
                                  .track_prefill = 1,
                                  .origin = origin,
                                  .seq_hashes = h,
                                  .n_hashes = n};
    return kvr_load_add(ld, &rq, 0);
}

START_TEST(origins_release_and_list)
{
    kvr_load_free(ld);
    struct oplog log = {{0}, 0};
    struct kvr_load_config cfg = {.block_size = 4, .observer = record, .observer_ctx = &log};
    ck_assert_int_eq(kvr_load_new(&cfg, &ld), KVR_OK);
    static const uint64_t h[] = {1, 2, 3};
    ck_assert_int_eq(add_from(1, 7, h, 3, 12, 1, 0), KVR_OK); /* ours: prefill 12 - 4 = 8 */
    ck_assert_int_eq(add_from(2, 7, h, 2, 10, 0, 5), KVR_OK); /* replica 5 */
    ck_assert_int_eq(add_from(3, 8, h, 1, 6, 0, 5), KVR_OK);
    ck_assert_int_eq(add_from(4, 7, h + 2, 1, 4, 0, 6), KVR_OK); /* replica 6 */
    ck_assert_int_eq(kvr_load_first_token(ld, 3, 1), KVR_OK);
    expect(7, 0, 3, 8 + 10 + 4, 3);
    /* listing a replica's state reproduces its load when added elsewhere */
    struct listing l = {0};
    ck_assert_uint_eq(kvr_load_origin_foreach(ld, 5, list_one, &l), 2);
    ck_assert_uint_eq(l.n, 2);
    ck_assert_uint_eq(l.ids[0], 2);
    ck_assert_uint_eq(l.prefill[0], 10);
    ck_assert_uint_eq(l.nh[0], 2);
    ck_assert_uint_eq(l.ids[1], 3);
    ck_assert_uint_eq(l.prefill[1], 0); /* its first token came */
    ck_assert_uint_eq(l.origin[1], 5);
    struct listing mine = {0};
    ck_assert_uint_eq(kvr_load_origin_foreach(ld, 0, list_one, &mine), 1);
    ck_assert_uint_eq(mine.prefill[0], 8);
    /* the observer saw origins */
    log.len = 0;
    log.text[0] = '\0';
    ck_assert_uint_eq(kvr_load_release_origin(ld, 5, 2), 2);
    ck_assert_str_eq(log.text, "3:2@7/0 3:3@8/0 ");
    expect(7, 0, 3, 8 + 4, 2); /* hash 3 still held by requests 1 and 4 */
    expect(8, 0, 0, 0, 0);
    ck_assert_uint_eq(kvr_load_release_origin(ld, 5, 3), 0);
    ck_assert_uint_eq(kvr_load_release_origin(ld, 0, 3), 1);
    expect(7, 0, 1, 4, 1);
    ck_assert_uint_eq(kvr_load_origin_foreach(ld, 9, list_one, &l), 0);
}
END_TEST

static void origin_of(void *ctx, const struct kvr_load_op *op)
{
    uint32_t *seen = ctx;
    *seen |= 1u << op->origin;
}

START_TEST(observer_reports_origin)
{
    kvr_load_free(ld);
    uint32_t seen = 0;
    struct kvr_load_config cfg = {.block_size = 4, .observer = origin_of, .observer_ctx = &seen};
    ck_assert_int_eq(kvr_load_new(&cfg, &ld), KVR_OK);
    ck_assert_int_eq(add_from(1, 1, NULL, 0, 4, 0, 3), KVR_OK);
    ck_assert_uint_eq(seen, 1u << 3);
    ck_assert_int_eq(kvr_load_first_token(ld, 1, 0), KVR_OK);
    ck_assert_int_eq(kvr_load_release(ld, 1, 0), KVR_OK);
    ck_assert_uint_eq(seen, 1u << 3);
    ck_assert_int_eq(add_from(2, 1, NULL, 0, 4, 0, 0), KVR_OK);
    ck_assert_uint_eq(seen, (1u << 3) | 1u);
}
END_TEST

/* ==== oom ==================================================================================== */

START_TEST(oom_leaves_tracker_unchanged)
{
    uint64_t h[64];
    for (int i = 0; i < 64; i++)
        h[i] = (uint64_t)i * 7919u + 1;
    int failures = 0;
    for (uint64_t fail = 1; fail < 64; fail++) {
        kvr_load_free(ld);
        struct kvr_load_config cfg = {.block_size = 4};
        ck_assert_int_eq(kvr_load_new(&cfg, &ld), KVR_OK);
        ck_assert_int_eq(add(1, 1, 0, h, 10, 40, 0, 0), KVR_OK);
        struct kvr_load_rank before, after;
        kvr_load_rank_get(ld, 1, 0, &before);
        kvr_alloc_fail_after(kvr_load_allocator(ld), fail);
        int rc = add(2, (fail % 2) ? 1 : 2, 0, h, 64, 256, 0, 0);
        kvr_alloc_fail_after(kvr_load_allocator(ld), 0);
        if (rc == KVR_ENOMEM) {
            failures++;
            kvr_load_rank_get(ld, 1, 0, &after);
            ck_assert_mem_eq(&before, &after, sizeof(before));
            struct kvr_load_stats st;
            kvr_load_stats(ld, &st);
            ck_assert_uint_eq(st.active, 1);
            ck_assert_uint_eq(st.ranks, 1);
            ck_assert_int_eq(kvr_load_release(ld, 2, 0), KVR_ENOTFOUND);
        } else {
            ck_assert_int_eq(rc, KVR_OK);
            ck_assert_int_eq(kvr_load_release(ld, 2, 0), KVR_OK);
        }
        ck_assert_int_eq(kvr_load_release(ld, 1, 0), KVR_OK);
        expect(1, 0, 0, 0, 0);
    }
    ck_assert_int_gt(failures, 2); /* the loop really injected failures */
}
END_TEST

/* ==== oracle: random operations against a plain model ======================================== */

#define ORQ 64 /* request ids */
#define ORK 4  /* ranks (worker = k, dp 0) */
#define ORH 24 /* hash universe */
#define ORN 6  /* max hashes per request */

struct mreq {
    int live, done, rank;
    uint32_t prefill;
    size_t n;
    uint64_t h[ORN];
};

START_TEST(oracle_random)
{
    const char *env = getenv("KVR_TEST_SEED");
    unsigned seed = env ? (unsigned)strtoul(env, NULL, 10) : 1234u;
    srand(seed);
    struct mreq m[ORQ];
    memset(m, 0, sizeof(m));
    for (int step = 0; step < 20000; step++) {
        int id = rand() % ORQ, op = rand() % 3;
        if (op == 0) {
            uint64_t h[ORN];
            size_t n = (size_t)(rand() % (ORN + 1));
            for (size_t i = 0; i < n; i++)
                h[i] = (uint64_t)(rand() % ORH);
            int rank = rand() % ORK;
            uint32_t isl = (uint32_t)(rand() % 40), ov = (uint32_t)(rand() % 6);
            int rc = add((uint64_t)id, (uint64_t)rank, 0, h, n, isl, ov, (uint64_t)step);
            if (m[id].live) {
                ck_assert_msg(rc == KVR_EEXIST, "seed %u step %d", seed, step);
            } else {
                ck_assert_msg(rc == KVR_OK, "seed %u step %d", seed, step);
                m[id] = (struct mreq){1, 0, rank, isl > ov * 4 ? isl - ov * 4 : 0, n, {0}};
                memcpy(m[id].h, h, n * sizeof(uint64_t));
            }
        } else if (op == 1) {
            int rc = kvr_load_first_token(ld, (uint64_t)id, (uint64_t)step);
            ck_assert_msg(rc == (m[id].live ? KVR_OK : KVR_ENOTFOUND), "seed %u", seed);
            m[id].done = 1;
        } else {
            int rc = kvr_load_release(ld, (uint64_t)id, (uint64_t)step);
            ck_assert_msg(rc == (m[id].live ? KVR_OK : KVR_ENOTFOUND), "seed %u", seed);
            m[id].live = 0;
        }
        for (int k = 0; k < ORK; k++) {
            uint64_t tokens = 0, reqs = 0, blocks = 0;
            int held[ORH] = {0};
            for (int q = 0; q < ORQ; q++) {
                if (!m[q].live || m[q].rank != k)
                    continue;
                reqs++;
                tokens += m[q].done ? 0 : m[q].prefill;
                for (size_t i = 0; i < m[q].n; i++)
                    held[m[q].h[i]] = 1;
            }
            for (int i = 0; i < ORH; i++)
                blocks += (uint64_t)held[i];
            struct kvr_load_rank r;
            kvr_load_rank_get(ld, (uint64_t)k, 0, &r);
            ck_assert_msg(
                r.requests == reqs && r.prefill_tokens == tokens && r.active_blocks == blocks,
                "seed %u step %d rank %d: got (%llu,%llu,%llu) want (%llu,%llu,%llu)", seed, step,
                k, (unsigned long long)r.active_blocks, (unsigned long long)r.prefill_tokens,
                (unsigned long long)r.requests, (unsigned long long)blocks,
                (unsigned long long)tokens, (unsigned long long)reqs);
        }
    }
}
END_TEST

/* ==== concurrency ============================================================================ */

#define CT_THREADS 4
#define CT_OPS 20000

static void *worker_thread(void *arg)
{
    uint64_t base = (uint64_t)(uintptr_t)arg * 1000000u;
    uint64_t h[8];
    for (int i = 0; i < CT_OPS; i++) {
        uint64_t id = base + (uint64_t)i;
        for (int j = 0; j < 8; j++)
            h[j] = (uint64_t)((i + j) % 13);
        struct kvr_load_request rq = {.request_id = id,
                                      .worker_id = (uint64_t)(i % 3),
                                      .isl_tokens = 64,
                                      .track_prefill = 1,
                                      .seq_hashes = h,
                                      .n_hashes = 8};
        if (kvr_load_add(ld, &rq, 0) != KVR_OK)
            return (void *)1;
        if (kvr_load_first_token(ld, id, 0) != KVR_OK)
            return (void *)1;
        if (i >= 3 && kvr_load_release(ld, id - 3, 0) != KVR_OK)
            return (void *)1;
    }
    for (int i = CT_OPS - 3; i < CT_OPS; i++)
        if (kvr_load_release(ld, base + (uint64_t)i, 0) != KVR_OK)
            return (void *)1;
    return NULL;
}

static atomic_int stop_readers;

static void *reader_thread(void *arg)
{
    (void)arg;
    static const uint64_t want[] = {1, 2, 3};
    while (!atomic_load(&stop_readers)) {
        struct kvr_load_query q[3] = {{.worker_id = 0}, {.worker_id = 1}, {.worker_id = 2}};
        kvr_load_query(ld, want, 3, q, 3);
        for (int k = 0; k < 3; k++)
            if (q[k].new_blocks > 3 || q[k].active_blocks > 13)
                return (void *)1;
    }
    return NULL;
}

START_TEST(threads_balance_to_zero)
{
    pthread_t t[CT_THREADS], r;
    atomic_store(&stop_readers, 0);
    ck_assert_int_eq(pthread_create(&r, NULL, reader_thread, NULL), 0);
    for (uintptr_t i = 0; i < CT_THREADS; i++)
        ck_assert_int_eq(pthread_create(&t[i], NULL, worker_thread, (void *)(i + 1)), 0);
    for (int i = 0; i < CT_THREADS; i++) {
        void *res;
        pthread_join(t[i], &res);
        ck_assert_ptr_null(res);
    }
    atomic_store(&stop_readers, 1);
    void *res;
    pthread_join(r, &res);
    ck_assert_ptr_null(res);
    for (uint64_t w = 0; w < 3; w++)
        expect(w, 0, 0, 0, 0);
    struct kvr_load_stats st;
    kvr_load_stats(ld, &st);
    ck_assert_uint_eq(st.added, CT_THREADS * CT_OPS);
    ck_assert_uint_eq(st.released, CT_THREADS * CT_OPS);
    ck_assert_uint_eq(st.active, 0);
}
END_TEST

Suite *load_suite(void)
{
    Suite *s = suite_create("load");
    TCase *api = tcase_create("api");
    tcase_add_checked_fixture(api, setup4, teardown);
    tcase_add_test(api, worked_example);
    tcase_add_test(api, first_token_once);
    tcase_add_test(api, duplicates_and_edges);
    tcase_add_test(api, query_new_blocks);
    tcase_add_test(api, observer_sees_every_op);
    tcase_add_test(api, origins_release_and_list);
    tcase_add_test(api, observer_reports_origin);
    suite_add_tcase(s, api);
    TCase *edge = tcase_create("edge");
    tcase_add_checked_fixture(edge, setup4, teardown);
    tcase_add_test(edge, expiry_lazy);
    tcase_add_test(edge, expiry_configured);
    suite_add_tcase(s, edge);
    TCase *oom = tcase_create("oom");
    tcase_add_checked_fixture(oom, setup4, teardown);
    tcase_add_test(oom, oom_leaves_tracker_unchanged);
    suite_add_tcase(s, oom);
    TCase *oracle = tcase_create("oracle");
    tcase_add_checked_fixture(oracle, setup4, teardown);
    tcase_set_timeout(oracle, 120);
    tcase_add_test(oracle, oracle_random);
    suite_add_tcase(s, oracle);
    TCase *conc = tcase_create("concurrency");
    tcase_add_checked_fixture(conc, setup4, teardown);
    tcase_set_timeout(conc, 120);
    tcase_add_test(conc, threads_balance_to_zero);
    suite_add_tcase(s, conc);
    return s;
}
