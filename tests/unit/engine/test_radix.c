/* test_radix.c - the compressed radix tree: spec vectors (index.md §5, §7, §12), API and edge
 * cases, per-rank external hashes, bounded jobs (steps, deferred frees), more than 4096 rank
 * slots, allocation-failure injection on hand-made workloads. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvr/err.h"
#include "kvr/radix.h"

#define NONE UINT64_MAX /* "no parent" in the helpers below */
#define A 1, 0
#define B 2, 0
#define C 3, 0
#define W70 7, 0
#define W71 7, 1
#define W80 8, 0
#define W90 9, 0
#define W990 99, 0

static kvr_radix_t *t;

static void setup(void)
{
    ck_assert_int_eq(kvr_radix_new(&t), KVR_OK);
}

static void teardown(void)
{
    char msg[256];
    int rc = kvr_radix_check(t, msg, sizeof(msg));
    ck_assert_msg(rc == KVR_OK, "invariants: %s", msg);
    kvr_radix_free(t);
    t = NULL;
}

static void check_ok(void)
{
    char msg[256];
    int rc = kvr_radix_check(t, msg, sizeof(msg));
    ck_assert_msg(rc == KVR_OK, "invariants: %s", msg);
}

#define NARGS(...) (sizeof((uint64_t[]){__VA_ARGS__}) / sizeof(uint64_t))
#define ARR(...) (const uint64_t[]){__VA_ARGS__}, NARGS(__VA_ARGS__)

/* Stores locals (ext = local * mul) for (w, dp) under parent ext (NONE = root). */
static int store_mul(uint64_t w, uint32_t dp, uint64_t parent, uint64_t mul, const uint64_t *l,
                     size_t n)
{
    struct kvr_block b[256];
    for (size_t i = 0; i < n; i++) {
        b[i].tokens_hash = l[i];
        b[i].block_hash = l[i] * mul;
    }
    return kvr_radix_store(t, w, dp, parent == NONE ? NULL : &parent, b, n);
}

#define ST(rank, parent, ...) store_mul(rank, parent, 100, ARR(__VA_ARGS__))

static int rm(uint64_t w, uint32_t dp, const uint64_t *h, size_t n)
{
    return kvr_radix_remove(t, w, dp, h, n, NULL);
}

#define RM(rank, ...) rm(rank, ARR(__VA_ARGS__))

/* Scores of a query as "w:dp=n,..." sorted by worker then dp. */
static const char *scores(unsigned flags, const uint64_t *q, size_t n)
{
    static char out[4096];
    struct kvr_match m[256];
    size_t nm;
    ck_assert_int_eq(kvr_radix_find_matches(t, q, n, flags, m, 256, &nm), KVR_OK);
    for (size_t i = 0; i < nm; i++)
        for (size_t j = i + 1; j < nm; j++)
            if (m[j].worker_id < m[i].worker_id ||
                (m[j].worker_id == m[i].worker_id && m[j].dp_rank < m[i].dp_rank)) {
                struct kvr_match x = m[i];
                m[i] = m[j];
                m[j] = x;
            }
    size_t k = 0;
    out[0] = '\0';
    for (size_t i = 0; i < nm; i++)
        k += (size_t)snprintf(out + k, sizeof(out) - k, "%s%llu:%u=%u", i ? "," : "",
                              (unsigned long long)m[i].worker_id, m[i].dp_rank, m[i].blocks);
    return out;
}

#define Q(...) scores(0, ARR(__VA_ARGS__))
#define QE(...) scores(KVR_MATCH_EARLY_EXIT, ARR(__VA_ARGS__))

static const char *shape(void)
{
    static char buf[2048];
    size_t need = kvr_radix_shape(t, buf, sizeof(buf));
    ck_assert_uint_lt(need, sizeof(buf));
    return buf;
}

/* ==== spec vectors ========================================================================== */

START_TEST(v1_always_intersect)
{
    ck_assert_int_eq(ST(A, NONE, 1, 2, 3), KVR_OK);
    ck_assert_int_eq(ST(B, NONE, 1, 2), KVR_OK);
    ck_assert_str_eq(shape(), "[1,2,3]{1:0|2:0=2}");
    ck_assert_int_eq(ST(B, 200, 4), KVR_OK);
    ck_assert_str_eq(shape(), "[1,2]{1:0,2:0}->([3]{1:0},[4]{2:0})");
    ck_assert_int_eq(RM(A, 100), KVR_OK);
    ck_assert_str_eq(shape(), "[1,2]{2:0}->([3]{1:0},[4]{2:0})");
    ck_assert_str_eq(Q(1, 2, 3), "2:0=2");
    ck_assert_str_eq(Q(1, 2, 4), "2:0=3");
    ck_assert_str_eq(QE(1, 2, 3), "2:0=2");
}
END_TEST

START_TEST(v2_early_exit)
{
    ck_assert_int_eq(ST(A, NONE, 1, 2), KVR_OK);
    ck_assert_int_eq(ST(B, NONE, 1), KVR_OK);
    ck_assert_str_eq(shape(), "[1,2]{1:0|2:0=1}");
    ck_assert_int_eq(ST(B, 100, 3), KVR_OK);
    ck_assert_str_eq(shape(), "[1]{1:0,2:0}->([2]{1:0},[3]{2:0})");
    ck_assert_int_eq(RM(B, 100), KVR_OK);
    ck_assert_int_eq(RM(B, 300), KVR_OK);
    /* [3] lost its last rank: kvrouter frees dead leaves at once (a sweep, §5.8). */
    ck_assert_str_eq(shape(), "[1]{1:0}->([2]{1:0})");
    ck_assert_str_eq(Q(1, 2), "1:0=2");
    ck_assert_str_eq(QE(1, 2), "1:0=1");
}
END_TEST

START_TEST(v3_leaf_extension_root_store)
{
    ck_assert_int_eq(ST(A, NONE, 1, 2), KVR_OK);
    ck_assert_int_eq(ST(B, NONE, 1, 2, 3), KVR_OK);
    ck_assert_str_eq(shape(), "[1,2,3]{2:0|1:0=2}");
    ck_assert_str_eq(Q(1, 2, 3), "1:0=2,2:0=3");
    ck_assert_str_eq(Q(1, 2), "1:0=2,2:0=2");
}
END_TEST

static void s4_prefix(void)
{
    ck_assert_int_eq(ST(A, NONE, 1, 2, 3, 4), KVR_OK);
    ck_assert_int_eq(ST(A, 200, 9), KVR_OK);
    ck_assert_str_eq(shape(), "[1,2]{1:0}->([3,4]{1:0},[9]{1:0})");
    ck_assert_int_eq(ST(B, NONE, 1), KVR_OK);
    ck_assert_str_eq(shape(), "[1,2]{1:0|2:0=1}->([3,4]{1:0},[9]{1:0})");
    ck_assert_str_eq(Q(1, 2, 3, 4), "1:0=4,2:0=1");
    ck_assert_str_eq(Q(1, 2, 9), "1:0=3,2:0=1");
}

static void s4_expect(void)
{
    ck_assert_str_eq(shape(), "[1,2]{|2:0=1}");
    ck_assert_str_eq(Q(1, 2, 3, 4), "2:0=1");
    ck_assert_str_eq(Q(1, 2, 9), "2:0=1");
}

START_TEST(s4_remove_worker)
{
    s4_prefix();
    ck_assert_int_eq(kvr_radix_remove_worker(t, 1), KVR_OK);
    s4_expect();
}
END_TEST

START_TEST(s4_remove_rank)
{
    s4_prefix();
    ck_assert_int_eq(kvr_radix_remove_rank(t, A), KVR_OK);
    s4_expect();
}
END_TEST

START_TEST(s4_cleared)
{
    s4_prefix();
    struct kvr_event ev = {.worker_id = 1, .dp_rank = 0, .kind = KVR_EVENT_CLEARED};
    ck_assert_int_eq(kvr_radix_apply(t, &ev), KVR_OK);
    s4_expect();
    /* The cleared rank stays registered with nothing. */
    struct kvr_rank_blocks rb[4];
    size_t n;
    ck_assert_int_eq(kvr_radix_rank_blocks(t, rb, 4, &n), KVR_OK);
    ck_assert_uint_eq(n, 2);
}
END_TEST

START_TEST(s5_suffix_not_sticky)
{
    ck_assert_int_eq(ST(A, NONE, 1, 2, 3, 4, 5, 6), KVR_OK);
    ck_assert_int_eq(ST(A, 500, 7), KVR_OK);
    ck_assert_str_eq(shape(), "[1,2,3,4,5]{1:0}->([6]{1:0},[7]{1:0})");
    ck_assert_int_eq(RM(A, 100), KVR_OK);
    ck_assert_str_eq(shape(), "");
    /* (Dynamo keeps the childless internal [1..5]{} until a sweep; we sweep at once, which
     * §12 S5 says gives the same final shape.) */
    ck_assert_int_eq(ST(A, NONE, 1, 2, 3, 4, 5), KVR_OK);
    ck_assert_int_eq(ST(B, NONE, 1, 2, 3, 4, 5), KVR_OK);
    ck_assert_str_eq(shape(), "[1,2,3,4,5]{1:0,2:0}");
    ck_assert_int_eq(ST(C, NONE, 1, 2), KVR_OK);
    ck_assert_str_eq(shape(), "[1,2,3,4,5]{1:0,2:0|3:0=2}");
    ck_assert_int_eq(ST(C, 200, 9), KVR_OK);
    ck_assert_str_eq(shape(), "[1,2]{1:0,2:0,3:0}->([3,4,5]{1:0,2:0},[9]{3:0})");
    ck_assert_int_eq(ST(A, 500, 8), KVR_OK);
    ck_assert_str_eq(shape(), "[1,2]{1:0,2:0,3:0}->([3,4,5,8]{1:0|2:0=3},[9]{3:0})");
    ck_assert_str_eq(Q(1, 2, 3, 4, 5, 8), "1:0=6,2:0=5,3:0=2");
    ck_assert_str_eq(Q(1, 2, 9), "1:0=2,2:0=2,3:0=3");
}
END_TEST

START_TEST(s5_internal_split_of_childless_node)
{
    /* The S5 scenario on a tree that keeps the sticky internal node: A's store of [1..5] above
     * recreated the node; here the internal prefix survives because B holds it. */
    ck_assert_int_eq(ST(A, NONE, 1, 2, 3, 4, 5, 6), KVR_OK);
    ck_assert_int_eq(ST(B, NONE, 1, 2, 3, 4, 5), KVR_OK);
    ck_assert_int_eq(ST(A, 500, 7), KVR_OK);
    ck_assert_str_eq(shape(), "[1,2,3,4,5]{1:0,2:0}->([6]{1:0},[7]{1:0})");
    ck_assert_int_eq(RM(A, 600, 700), KVR_OK);
    ck_assert_str_eq(shape(), "[1,2,3,4,5]{1:0,2:0}");
    /* Internal and childless: no leaf extension, a child is created. */
    ck_assert_int_eq(ST(A, 500, 8), KVR_OK);
    ck_assert_str_eq(shape(), "[1,2,3,4,5]{1:0,2:0}->([8]{1:0})");
    ck_assert_int_eq(RM(A, 800), KVR_OK);
    ck_assert_int_eq(ST(C, NONE, 1, 2), KVR_OK);
    ck_assert_int_eq(ST(C, 200, 9), KVR_OK);
    /* The suffix [3,4,5] got no children: not internal, so it leaf-extends. */
    ck_assert_int_eq(ST(A, 500, 8), KVR_OK);
    ck_assert_str_eq(shape(), "[1,2]{1:0,2:0,3:0}->([3,4,5,8]{1:0|2:0=3},[9]{3:0})");
}
END_TEST

START_TEST(leaf_append_example)
{
    /* §5.4: ranks 1 and 2 store [1,2,3,4]; rank 1 appends [5,6]. */
    ck_assert_int_eq(ST(A, NONE, 1, 2, 3, 4), KVR_OK);
    ck_assert_int_eq(ST(B, NONE, 1, 2, 3, 4), KVR_OK);
    ck_assert_int_eq(ST(A, 400, 5, 6), KVR_OK);
    ck_assert_str_eq(shape(), "[1,2,3,4,5,6]{1:0|2:0=4}");
    ck_assert_int_eq(ST(B, 400, 5, 6), KVR_OK);
    ck_assert_str_eq(shape(), "[1,2,3,4,5,6]{1:0,2:0}");
}
END_TEST

START_TEST(leaf_append_then_split)
{
    ck_assert_int_eq(ST(A, NONE, 1, 2, 3, 4), KVR_OK);
    ck_assert_int_eq(ST(B, NONE, 1, 2, 3, 4), KVR_OK);
    ck_assert_int_eq(ST(A, 400, 5, 6), KVR_OK);
    ck_assert_int_eq(ST(B, 400, 7, 8), KVR_OK);
    ck_assert_str_eq(shape(), "[1,2,3,4]{1:0,2:0}->([5,6]{1:0},[7,8]{2:0})");
    ck_assert_str_eq(Q(1, 2, 3, 4, 5, 6), "1:0=6,2:0=4");
    ck_assert_str_eq(Q(1, 2, 3, 4, 7, 8), "1:0=4,2:0=6");
}
END_TEST

START_TEST(identical_extensions_one_edge)
{
    ck_assert_int_eq(ST(A, NONE, 1, 2, 3, 4), KVR_OK);
    ck_assert_int_eq(ST(B, NONE, 1, 2, 3, 4), KVR_OK);
    ck_assert_int_eq(ST(A, 400, 5, 6), KVR_OK);
    ck_assert_int_eq(ST(B, 400, 5, 6), KVR_OK);
    ck_assert_str_eq(shape(), "[1,2,3,4,5,6]{1:0,2:0}");
}
END_TEST

START_TEST(reference_holes)
{
    /* §7 reference unit test: held/reachable (1,1) -> (4,2) -> (5,4). */
    ck_assert_int_eq(ST(A, NONE, 1, 2, 3, 4), KVR_OK);
    ck_assert_int_eq(RM(A, 200), KVR_OK);
    ck_assert_str_eq(Q(1, 2, 3, 4), "1:0=1");
    ck_assert_int_eq(ST(A, 100, 2), KVR_OK);
    const char *s = Q(1, 2, 3, 4);
    ck_assert_msg(strcmp(s, "1:0=2") == 0 || strcmp(s, "1:0=3") == 0 || strcmp(s, "1:0=4") == 0,
                  "got %s", s);
    /* Store 5 under the orphan 4: rejected or unreachable; never more than held (4). */
    int rc = ST(A, 400, 5);
    ck_assert(rc == KVR_OK || rc == KVR_EPARENT);
    ck_assert_int_eq(ST(A, 200, 3, 4), KVR_OK);
    s = Q(1, 2, 3, 4, 5);
    ck_assert_msg(strcmp(s, "1:0=4") == 0 || strcmp(s, "1:0=5") == 0, "got %s", s);
}
END_TEST

START_TEST(clear_is_per_rank)
{
    /* §2.1: (7,0), (7,1), (8,0) store [1,2]; (7,1) clears. */
    ck_assert_int_eq(ST(W70, NONE, 1, 2), KVR_OK);
    ck_assert_int_eq(ST(W71, NONE, 1, 2), KVR_OK);
    ck_assert_int_eq(ST(W80, NONE, 1, 2), KVR_OK);
    ck_assert_int_eq(kvr_radix_clear_rank(t, 7, 1), KVR_OK);
    ck_assert_str_eq(Q(1, 2), "7:0=2,8:0=2");
    ck_assert_int_eq(kvr_radix_remove_worker(t, 7), KVR_OK);
    ck_assert_str_eq(Q(1, 2), "8:0=2");
    ck_assert_int_eq(kvr_radix_remove_worker(t, 7), KVR_ENOTFOUND);
}
END_TEST

START_TEST(parent_not_found)
{
    ck_assert_int_eq(ST(A, 999, 1), KVR_EPARENT);
    ck_assert_int_eq(ST(A, NONE, 1, 2), KVR_OK);
    ck_assert_int_eq(ST(A, 999, 3), KVR_EPARENT);
    /* Another rank's block is not a parent for this one. */
    ck_assert_int_eq(ST(B, 200, 3), KVR_EPARENT);
    ck_assert_str_eq(shape(), "[1,2]{1:0}");
    /* A removed parent is rejected too. */
    ck_assert_int_eq(RM(A, 200), KVR_OK);
    ck_assert_int_eq(ST(A, 200, 3), KVR_EPARENT);
    ck_assert_str_eq(shape(), "[1,2]{|1:0=1}");
}
END_TEST

START_TEST(remove_not_found_and_grouping)
{
    ck_assert_int_eq(ST(A, NONE, 1, 2, 3), KVR_OK);
    size_t nf = 0;
    uint64_t h[] = {100, 300, 999};
    /* 100 drops 300 implicitly (same node): only 999 is not found. */
    ck_assert_int_eq(kvr_radix_remove(t, A, h, 3, &nf), KVR_ENOBLOCK);
    ck_assert_uint_eq(nf, 1);
    ck_assert_str_eq(shape(), "");
    ck_assert_int_eq(RM(W90, 100), KVR_ENOBLOCK);
}
END_TEST

START_TEST(duplicate_store_is_idempotent)
{
    ck_assert_int_eq(ST(A, NONE, 1, 2, 3), KVR_OK);
    ck_assert_int_eq(ST(A, NONE, 1, 2, 3), KVR_OK);
    ck_assert_int_eq(ST(A, 100, 2, 3), KVR_OK);
    ck_assert_str_eq(shape(), "[1,2,3]{1:0}");
    struct kvr_radix_stats st;
    kvr_radix_stats(t, &st);
    ck_assert_uint_eq(st.block_ranks, 3);
    ck_assert_uint_eq(st.blocks, 3);
    ck_assert_uint_eq(st.nodes, 1);
}
END_TEST

START_TEST(invalid_sequence)
{
    /* A chain repeating an external hash. */
    struct kvr_block b[3] = {{.block_hash = 10, .tokens_hash = 1},
                             {.block_hash = 20, .tokens_hash = 2},
                             {.block_hash = 10, .tokens_hash = 3}};
    ck_assert_int_eq(kvr_radix_store(t, A, NULL, b, 3), KVR_EINVALSEQ);
    ck_assert_str_eq(shape(), "[1,2]{1:0}");
    /* Re-using a live hash at another position. */
    struct kvr_block c[1] = {{.block_hash = 10, .tokens_hash = 7}};
    ck_assert_int_eq(kvr_radix_store(t, A, NULL, c, 1), KVR_EINVALSEQ);
    /* A block naming its own parent. */
    uint64_t p = 20;
    struct kvr_block d[1] = {{.block_hash = 20, .tokens_hash = 3}};
    ck_assert_int_eq(kvr_radix_store(t, A, &p, d, 1), KVR_EINVALSEQ);
    ck_assert_str_eq(shape(), "[1,2]{1:0}");
    ck_assert_int_eq(kvr_radix_store(t, A, NULL, b, 0), KVR_EINVAL);
}
END_TEST

START_TEST(long_chain_repeat_detected)
{
    struct kvr_block b[200];
    for (int i = 0; i < 200; i++) {
        b[i].tokens_hash = (uint64_t)i + 1;
        b[i].block_hash = (uint64_t)i + 1000;
    }
    b[150].block_hash = 1100; /* repeats b[100] */
    ck_assert_int_eq(kvr_radix_store(t, A, NULL, b, 200), KVR_EINVALSEQ);
    struct kvr_radix_stats st;
    kvr_radix_stats(t, &st);
    ck_assert_uint_eq(st.block_ranks, 150);
}
END_TEST

START_TEST(per_rank_external_hashes)
{
    /* Same content, different engine hashes per rank (vLLM random seeds). */
    ck_assert_int_eq(store_mul(A, NONE, 100, ARR(1, 2, 3)), KVR_OK);
    ck_assert_int_eq(store_mul(B, NONE, 7, ARR(1, 2, 3)), KVR_OK);
    ck_assert_str_eq(Q(1, 2, 3), "1:0=3,2:0=3");
    /* Each rank extends and removes with its own hashes. */
    ck_assert_int_eq(store_mul(B, 21, 7, ARR(4)), KVR_OK);
    ck_assert_str_eq(Q(1, 2, 3, 4), "1:0=3,2:0=4");
    ck_assert_int_eq(RM(B, 200), KVR_ENOBLOCK); /* A's hash is not B's */
    ck_assert_int_eq(RM(B, 14), KVR_OK);
    ck_assert_str_eq(Q(1, 2, 3, 4), "1:0=3,2:0=1");
    ck_assert_int_eq(RM(A, 300), KVR_OK);
    ck_assert_str_eq(Q(1, 2, 3, 4), "1:0=2,2:0=1");
    /* The dump carries each rank's own hashes. */
    struct kvr_event_list l;
    kvr_event_list_init(&l);
    ck_assert_int_eq(kvr_radix_dump(t, &l), KVR_OK);
    int seen_b = 0;
    for (size_t i = 0; i < l.n; i++) {
        if (l.ev[i].worker_id == 2) {
            ck_assert_uint_eq(l.ev[i].n, 1);
            ck_assert_uint_eq(l.ev[i].blocks[0].block_hash, 7);
            seen_b = 1;
        }
    }
    ck_assert(seen_b);
    kvr_event_list_free(&l);
}
END_TEST

START_TEST(many_ranks_beyond_64)
{
    /* 200 ranks on one chain; every other one extends it. */
    for (uint64_t w = 0; w < 200; w++)
        ck_assert_int_eq(store_mul(w, 0, NONE, 100, ARR(1, 2)), KVR_OK);
    for (uint64_t w = 0; w < 200; w += 2)
        ck_assert_int_eq(store_mul(w, 0, 200, 100, ARR(3)), KVR_OK);
    struct kvr_match m[256];
    size_t n;
    uint64_t q[3] = {1, 2, 3};
    ck_assert_int_eq(kvr_radix_find_matches(t, q, 3, 0, m, 256, &n), KVR_OK);
    ck_assert_uint_eq(n, 200);
    for (size_t i = 0; i < n; i++)
        ck_assert_uint_eq(m[i].blocks, m[i].worker_id % 2 == 0 ? 3 : 2);
    ck_assert_int_eq(kvr_radix_find_matches(t, q, 3, 0, m, 10, &n), KVR_ERANGE);
    ck_assert_uint_eq(n, 200);
    check_ok();
    for (uint64_t w = 0; w < 200; w += 3)
        ck_assert_int_eq(kvr_radix_remove_worker(t, w), KVR_OK);
    ck_assert_int_eq(kvr_radix_find_matches(t, q, 3, 0, m, 256, &n), KVR_OK);
    ck_assert_uint_eq(n, 200 - 67);
    /* Freed slots are reused by new ranks without inheriting anything. */
    ck_assert_int_eq(store_mul(1000, 0, NONE, 100, ARR(1)), KVR_OK);
    ck_assert_int_eq(kvr_radix_find_matches(t, q, 3, 0, m, 256, &n), KVR_OK);
    for (size_t i = 0; i < n; i++)
        if (m[i].worker_id == 1000)
            ck_assert_uint_eq(m[i].blocks, 1);
}
END_TEST

START_TEST(empty_queries)
{
    struct kvr_match m[4];
    size_t n = 7;
    ck_assert_int_eq(kvr_radix_find_matches(t, NULL, 0, 0, m, 4, &n), KVR_OK);
    ck_assert_uint_eq(n, 0);
    ck_assert_str_eq(Q(5), "");
    ck_assert_int_eq(ST(A, NONE, 1), KVR_OK);
    ck_assert_str_eq(Q(2, 1), "");
    ck_assert_str_eq(Q(1, 2), "1:0=1");
}
END_TEST

START_TEST(repeated_locals_on_one_path)
{
    /* --expand: the same local hash repeats along a path; ext hashes differ. */
    struct kvr_block b[8];
    for (int i = 0; i < 8; i++) {
        b[i].tokens_hash = (uint64_t)(i / 4) + 1;
        b[i].block_hash = (uint64_t)i + 100;
    }
    ck_assert_int_eq(kvr_radix_store(t, A, NULL, b, 8), KVR_OK);
    ck_assert_str_eq(Q(1, 1, 1, 1, 2, 2, 2, 2), "1:0=8");
    ck_assert_str_eq(Q(1, 1, 1, 1, 1), "1:0=4");
    uint64_t parent = 101;
    struct kvr_block c[2] = {{.block_hash = 900, .tokens_hash = 1},
                             {.block_hash = 901, .tokens_hash = 9}};
    ck_assert_int_eq(kvr_radix_store(t, B, NULL, b, 2), KVR_OK);
    ck_assert_int_eq(kvr_radix_store(t, B, &parent, c, 2), KVR_OK);
    ck_assert_str_eq(Q(1, 1, 1, 9), "1:0=3,2:0=4");
}
END_TEST

START_TEST(beyond_4096_slots)
{
    /* 4200 ranks: the walk runs in windows of 4096 slots (no allocation), cutoffs and drop-outs
     * on both sides of the window boundary. */
    enum { N = 4200 };
    for (uint64_t w = 0; w < N; w++)
        ck_assert_int_eq(store_mul(w, 0, NONE, 100, ARR(1, 2)), KVR_OK);
    for (uint64_t w = 0; w < N; w += 2) /* leaf append, then Reuse: [1,2,3] evens, odds cut 2 */
        ck_assert_int_eq(store_mul(w, 0, 200, 100, ARR(3)), KVR_OK);
    for (uint64_t w = 0; w < N; w += 4) /* [1,2,3,4]: w%4==0 full, w%4==2 cut 3 */
        ck_assert_int_eq(store_mul(w, 0, 300, 100, ARR(4)), KVR_OK);
    for (uint64_t w = 0; w < N; w += 8) /* split at 2: [1,2] -> {[3,4], [7]} */
        ck_assert_int_eq(store_mul(w, 0, 200, 100, ARR(7)), KVR_OK);
    check_ok();
    static struct kvr_match m[N + 8];
    size_t n;
    for (int early = 0; early < 2; early++) {
        unsigned flags = early ? KVR_MATCH_EARLY_EXIT : 0; /* ignored above 4096 slots */
        uint64_t q1[4] = {1, 2, 3, 4}, q2[3] = {1, 2, 7};
        ck_assert_int_eq(kvr_radix_find_matches(t, q1, 4, flags, m, N + 8, &n), KVR_OK);
        ck_assert_uint_eq(n, N);
        for (size_t i = 0; i < n; i++) {
            uint64_t w = m[i].worker_id;
            ck_assert_uint_eq(m[i].blocks, w % 4 == 0 ? 4 : (w % 4 == 2 ? 3 : 2));
        }
        ck_assert_int_eq(kvr_radix_find_matches(t, q2, 3, flags, m, N + 8, &n), KVR_OK);
        ck_assert_uint_eq(n, N);
        for (size_t i = 0; i < n; i++)
            ck_assert_uint_eq(m[i].blocks, m[i].worker_id % 8 == 0 ? 3 : 2);
    }
    uint64_t q3[2] = {1, 9};
    ck_assert_int_eq(kvr_radix_find_matches(t, q3, 2, 0, m, 10, &n), KVR_ERANGE);
    ck_assert_uint_eq(n, N);
}
END_TEST

/* A rank with a wide tree: trunk [1..8], `fan` branches of `len` blocks below block 8 (ext =
 * 1000 * branch + i), each with a 3-block twig. B holds the trunk and branch 0. */
static void wide_tree(uint64_t fan, uint64_t len)
{
    ck_assert_int_eq(ST(A, NONE, 1, 2, 3, 4, 5, 6, 7, 8), KVR_OK);
    ck_assert_int_eq(ST(B, NONE, 1, 2, 3, 4, 5, 6, 7, 8), KVR_OK);
    struct kvr_block b[256];
    for (uint64_t br = 0; br < fan; br++) {
        for (uint64_t i = 0; i < len; i++) {
            b[i].tokens_hash = 100000 * (br + 1) + i;
            b[i].block_hash = 1000 * (br + 1) + i;
        }
        uint64_t parent = 800;
        ck_assert_int_eq(kvr_radix_store(t, A, &parent, b, len), KVR_OK);
        if (br == 0)
            ck_assert_int_eq(kvr_radix_store(t, B, &parent, b, len), KVR_OK);
        parent = 1000 * (br + 1) + len / 2;
        for (uint64_t i = 0; i < 3; i++) {
            b[i].tokens_hash = 900000 + 10 * br + i;
            b[i].block_hash = 500000 + 10 * br + i;
        }
        ck_assert_int_eq(kvr_radix_store(t, A, &parent, b, 3), KVR_OK);
    }
    check_ok();
}

/* Steps the current job with `budget`, checking that no step overruns by more than `slack`.
 * Returns the number of steps. */
static int step_all(uint64_t budget, uint64_t slack)
{
    int steps = 0;
    for (;;) {
        uint64_t w0 = kvr_radix_work(t);
        int more = kvr_radix_step(t, budget);
        uint64_t did = kvr_radix_work(t) - w0;
        ck_assert_msg(did <= budget + slack, "step %d did %llu units (budget %llu)", steps,
                      (unsigned long long)did, (unsigned long long)budget);
        steps++;
        if (!more)
            return steps;
        char msg[128];
        ck_assert_int_eq(kvr_radix_check(t, msg, sizeof(msg)), KVR_EBUSY);
        ck_assert(kvr_radix_busy(t));
    }
}

START_TEST(bounded_clear_in_steps)
{
    wide_tree(40, 30);
    kvr_alloc_t *a = kvr_radix_allocator(t);
    size_t bytes = a->live_bytes;
    struct kvr_radix_stats st;
    kvr_radix_stats(t, &st);
    size_t nodes = st.nodes;
    ck_assert_str_eq(Q(1, 2, 3, 4, 5, 6, 7, 8, 100000, 100001), "1:0=10,2:0=10");
    ck_assert_int_eq(kvr_radix_clear_begin(t, A), KVR_OK);
    ck_assert(kvr_radix_busy(t));
    /* Between steps: A only loses blocks; B keeps exactly its own. */
    int steps = 0;
    for (;;) {
        int more = kvr_radix_step(t, 16);
        steps++;
        const char *s0 = Q(1, 2, 3, 4, 5, 6, 7, 8, 100000, 100001);
        ck_assert_msg(strstr(s0, "2:0=10") != NULL, "B lost blocks: %s", s0);
        if (!more)
            break;
    }
    ck_assert_int_gt(steps, 40); /* 1,400 blocks: not in one step of 16 */
    ck_assert_int_eq(kvr_radix_job_result(t, NULL), KVR_OK);
    ck_assert(!kvr_radix_busy(t));
    check_ok();
    ck_assert_str_eq(Q(1, 2, 3, 4, 5, 6, 7, 8, 100000, 100001), "2:0=10");
    ck_assert_str_eq(Q(1, 2, 3, 4, 5, 6, 7, 8, 200000), "2:0=8");
    kvr_radix_stats(t, &st);
    ck_assert_uint_eq(st.nodes, 3); /* trunk [1..8] and B's branch, split where A's twig was */
    ck_assert_uint_lt(st.nodes, nodes);
    ck_assert_uint_lt(a->live_bytes, bytes);
    ck_assert_uint_eq(st.block_ranks, 8 + 30);
}
END_TEST

START_TEST(bounded_head_removal_frees_subtree_in_steps)
{
    /* Removing A's first block leaves the trunk without a full rank once B goes too: the whole
     * wide subtree is unlinked at once and freed over later steps. */
    wide_tree(40, 30);
    ck_assert_int_eq(kvr_radix_remove_rank(t, B), KVR_OK);
    uint64_t h = 100;
    ck_assert_int_eq(kvr_radix_remove_begin(t, A, &h, 1), KVR_OK);
    /* Slack: the cut's last unit, plus pushing the trunk's 40 children on the drain at once. */
    int steps = step_all(8, 48);
    ck_assert_int_gt(steps, 100);
    ck_assert_int_eq(kvr_radix_job_result(t, NULL), KVR_OK);
    check_ok();
    struct kvr_radix_stats st;
    kvr_radix_stats(t, &st);
    ck_assert_uint_eq(st.nodes, 0);
    ck_assert_uint_eq(st.block_ranks, 0);
    ck_assert_str_eq(Q(1, 2, 3), "");
    /* The tree is fully usable again. */
    ck_assert_int_eq(ST(A, NONE, 1, 2, 3), KVR_OK);
    ck_assert_str_eq(Q(1, 2, 3), "1:0=3");
}
END_TEST

START_TEST(bounded_remove_long_cut_in_pieces)
{
    /* One hash whose cut covers 200 positions, with a budget of 10: applied from the tail in
     * pieces; in between, A's score only shrinks, and B (cut at 50) is untouched. */
    struct kvr_block b[256];
    for (int i = 0; i < 200; i++) {
        b[i].tokens_hash = (uint64_t)i + 1;
        b[i].block_hash = (uint64_t)i + 5000;
    }
    ck_assert_int_eq(kvr_radix_store(t, A, NULL, b, 200), KVR_OK);
    ck_assert_int_eq(kvr_radix_store(t, B, NULL, b, 50), KVR_OK);
    uint64_t q[200];
    for (int i = 0; i < 200; i++)
        q[i] = (uint64_t)i + 1;
    uint64_t h[2] = {5010, 4}; /* A's 11th block; an unknown hash */
    ck_assert_int_eq(kvr_radix_remove_begin(t, A, h, 2), KVR_OK);
    uint32_t last = 200;
    int steps = 0;
    for (;;) {
        int more = kvr_radix_step(t, 10);
        steps++;
        struct kvr_match m[4];
        size_t n;
        ck_assert_int_eq(kvr_radix_find_matches(t, q, 200, 0, m, 4, &n), KVR_OK);
        uint32_t a = 0, bb = 0;
        for (size_t i = 0; i < n; i++) {
            if (m[i].worker_id == 1)
                a = m[i].blocks;
            else
                bb = m[i].blocks;
        }
        ck_assert_uint_le(a, last);
        ck_assert_uint_ge(a, 10);
        ck_assert_uint_eq(bb, 50);
        last = a;
        if (!more)
            break;
    }
    ck_assert_int_ge(steps, 18);
    ck_assert_uint_eq(last, 10);
    size_t missing;
    ck_assert_int_eq(kvr_radix_job_result(t, &missing), KVR_ENOBLOCK);
    ck_assert_uint_eq(missing, 1);
    check_ok();
}
END_TEST

START_TEST(bounded_remove_worker_in_steps)
{
    /* remove_worker over two dp ranks, stepped; the one-shot result equals the stepped one. */
    wide_tree(10, 20);
    ck_assert_int_eq(ST(W70, NONE, 1, 2, 3), KVR_OK);
    ck_assert_int_eq(ST(W71, NONE, 1, 2, 3, 4), KVR_OK);
    ck_assert_int_eq(kvr_radix_remove_worker_begin(t, 7), KVR_OK);
    (void)step_all(4, 16);
    ck_assert_int_eq(kvr_radix_job_result(t, NULL), KVR_OK);
    ck_assert_str_eq(Q(1, 2, 3, 4), "1:0=4,2:0=4");
    ck_assert_int_eq(kvr_radix_remove_worker_begin(t, 7), KVR_OK);
    ck_assert_int_eq(kvr_radix_step(t, 1), 0);
    ck_assert_int_eq(kvr_radix_job_result(t, NULL), KVR_ENOTFOUND);
    /* A job left unfinished is finished by the next call. */
    ck_assert_int_eq(kvr_radix_clear_begin(t, A), KVR_OK);
    ck_assert_int_eq(kvr_radix_step(t, 1), 1);
    ck_assert_int_eq(ST(C, NONE, 1, 2), KVR_OK);
    ck_assert(!kvr_radix_busy(t));
    ck_assert_str_eq(Q(1, 2, 3, 4), "2:0=4,3:0=2");
    ck_assert_int_eq(kvr_radix_remove_begin(t, A, NULL, 1), KVR_EINVAL);
}
END_TEST

START_TEST(long_chain_beyond_1024)
{
    /* The repeat check of chains above 1024 blocks allocates its set from the tree's allocator. */
    enum { N = 1500 };
    struct kvr_block *b = malloc(N * sizeof(*b));
    for (int i = 0; i < N; i++) {
        b[i].tokens_hash = (uint64_t)i + 1;
        b[i].block_hash = (uint64_t)i + 100000;
    }
    b[1200].block_hash = 100000 + 700; /* repeats b[700] */
    ck_assert_int_eq(kvr_radix_store(t, A, NULL, b, N), KVR_EINVALSEQ);
    struct kvr_radix_stats st;
    kvr_radix_stats(t, &st);
    ck_assert_uint_eq(st.block_ranks, 1200);
    free(b);
}
END_TEST

/* ==== allocation failure ==================================================================== */

START_TEST(oom_long_chain)
{
    /* Fail each allocation of a 1500-block store in turn: ENOMEM leaves a consistent tree holding
     * a prefix of the chain (nothing when the repeat set's allocation fails, the first one). */
    enum { N = 1500 };
    struct kvr_block *b = malloc(N * sizeof(*b));
    uint64_t *q = malloc(N * sizeof(*q));
    for (int i = 0; i < N; i++) {
        b[i].tokens_hash = (uint64_t)i + 1;
        b[i].block_hash = (uint64_t)i + 100000;
        q[i] = b[i].tokens_hash;
    }
    kvr_alloc_t *a = kvr_radix_allocator(t);
    ck_assert_int_eq(ST(A, NONE, 1), KVR_OK); /* the rank exists: its first allocations are done */
    uint64_t c0 = a->calls;
    ck_assert_int_eq(kvr_radix_store(t, A, NULL, b, N), KVR_OK);
    uint64_t total = a->calls - c0;
    ck_assert_uint_gt(total, 2);
    for (uint64_t nth = 1; nth <= total; nth++) {
        kvr_radix_free(t);
        ck_assert_int_eq(kvr_radix_new(&t), KVR_OK);
        a = kvr_radix_allocator(t);
        ck_assert_int_eq(ST(A, NONE, 1), KVR_OK);
        size_t bytes = a->live_bytes;
        kvr_alloc_fail_after(a, nth);
        int rc = kvr_radix_store(t, A, NULL, b, N);
        ck_assert_uint_eq(a->failures, 1);
        ck_assert_int_eq(rc, KVR_ENOMEM);
        check_ok();
        struct kvr_match m[2];
        size_t n;
        ck_assert_int_eq(kvr_radix_find_matches(t, q, N, 0, m, 2, &n), KVR_OK);
        ck_assert_uint_le(n, 1);
        if (nth == 1) { /* the repeat set: nothing applied, nothing leaked */
            ck_assert_uint_eq(m[0].blocks, 1);
            ck_assert_uint_eq(a->live_bytes, bytes);
        }
        kvr_alloc_fail_after(a, 0);
        ck_assert_int_eq(kvr_radix_store(t, A, NULL, b, N), KVR_OK);
        ck_assert_int_eq(kvr_radix_find_matches(t, q, N, 0, m, 2, &n), KVR_OK);
        ck_assert_uint_eq(m[0].blocks, N);
        check_ok();
    }
    free(b);
    free(q);
}
END_TEST

/* A small scripted workload touching every structural path. Returns the number of failed
 * steps with ENOMEM. */
static int scripted(int check_each)
{
    int nomem = 0;
    int rcs[32], k = 0;
    rcs[k++] = ST(A, NONE, 1, 2, 3, 4);
    rcs[k++] = ST(B, NONE, 1, 2, 3, 4);
    rcs[k++] = ST(A, 400, 5, 6);
    rcs[k++] = ST(B, 400, 7, 8);
    rcs[k++] = ST(C, NONE, 1, 2);
    rcs[k++] = ST(C, 200, 9, 10, 11);
    rcs[k++] = ST(A, 200, 12);
    rcs[k++] = store_mul(70, 0, NONE, 3, ARR(1, 2, 3));
    rcs[k++] = RM(A, 300);
    rcs[k++] = RM(B, 800, 700);
    rcs[k++] = RM(C, 100);
    rcs[k++] = kvr_radix_clear_rank(t, B);
    rcs[k++] = ST(B, NONE, 1, 2, 3, 4, 5, 6);
    for (uint64_t w = 10; w < 80; w++)
        (void)store_mul(w, 1, NONE, 100, ARR(1, 2));
    rcs[k++] = kvr_radix_remove_worker(t, 1);
    for (int i = 0; i < k; i++)
        nomem += rcs[i] == KVR_ENOMEM;
    if (check_each)
        check_ok();
    return nomem;
}

START_TEST(oom_every_allocation)
{
    /* Count allocations of a clean run, then fail each one in turn. */
    kvr_alloc_t *a = kvr_radix_allocator(t);
    uint64_t before = a->calls;
    ck_assert_int_eq(scripted(1), 0);
    uint64_t total = a->calls - before;
    ck_assert_uint_gt(total, 10);
    for (uint64_t nth = 1; nth <= total; nth++) {
        kvr_radix_free(t);
        ck_assert_int_eq(kvr_radix_new(&t), KVR_OK);
        kvr_alloc_fail_after(kvr_radix_allocator(t), nth);
        (void)scripted(1);
        ck_assert_uint_eq(kvr_radix_allocator(t)->failures, 1);
        /* Still usable afterwards. */
        ck_assert_int_eq(ST(W990, NONE, 1, 2), KVR_OK);
        check_ok();
    }
}
END_TEST

Suite *radix_suite(void);

Suite *radix_suite(void)
{
    Suite *s = suite_create("radix");
    TCase *tc = tcase_create("api");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, v1_always_intersect);
    tcase_add_test(tc, v2_early_exit);
    tcase_add_test(tc, v3_leaf_extension_root_store);
    tcase_add_test(tc, s4_remove_worker);
    tcase_add_test(tc, s4_remove_rank);
    tcase_add_test(tc, s4_cleared);
    tcase_add_test(tc, s5_suffix_not_sticky);
    tcase_add_test(tc, s5_internal_split_of_childless_node);
    tcase_add_test(tc, leaf_append_example);
    tcase_add_test(tc, leaf_append_then_split);
    tcase_add_test(tc, identical_extensions_one_edge);
    tcase_add_test(tc, reference_holes);
    tcase_add_test(tc, clear_is_per_rank);
    suite_add_tcase(s, tc);
    tc = tcase_create("edge");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, parent_not_found);
    tcase_add_test(tc, remove_not_found_and_grouping);
    tcase_add_test(tc, duplicate_store_is_idempotent);
    tcase_add_test(tc, invalid_sequence);
    tcase_add_test(tc, long_chain_repeat_detected);
    tcase_add_test(tc, per_rank_external_hashes);
    tcase_add_test(tc, many_ranks_beyond_64);
    tcase_add_test(tc, empty_queries);
    tcase_add_test(tc, repeated_locals_on_one_path);
    tcase_add_test(tc, beyond_4096_slots);
    tcase_add_test(tc, long_chain_beyond_1024);
    tcase_add_test(tc, bounded_clear_in_steps);
    tcase_add_test(tc, bounded_head_removal_frees_subtree_in_steps);
    tcase_add_test(tc, bounded_remove_long_cut_in_pieces);
    tcase_add_test(tc, bounded_remove_worker_in_steps);
    suite_add_tcase(s, tc);
    tc = tcase_create("oom");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, oom_every_allocation);
    tcase_add_test(tc, oom_long_chain);
    suite_add_tcase(s, tc);
    return s;
}
