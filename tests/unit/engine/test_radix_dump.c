/* test_radix_dump.c - the tree as events (index.md §8): the spec vectors, round trips of pinned
 * shapes, dump -> replay on random streams giving identical early_exit = false scores, and the
 * incremental dump: in steps without writes it equals the one-shot dump; with writes between
 * steps (a fuzzy snapshot), replaying it and then the operations applied after it began never
 * overcounts against the reference model. */
#include <check.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvr/err.h"
#include "kvr/radix.h"
#include "refmodel.h"

#define NONE UINT64_MAX
#define NARGS(...) (sizeof((uint64_t[]){__VA_ARGS__}) / sizeof(uint64_t))
#define ARR(...) (const uint64_t[]){__VA_ARGS__}, NARGS(__VA_ARGS__)

static int st(kvr_radix_t *t, uint64_t w, uint64_t parent, const uint64_t *l, size_t n)
{
    struct kvr_block b[64];
    for (size_t i = 0; i < n; i++) {
        b[i].tokens_hash = l[i];
        b[i].block_hash = l[i] * 100;
    }
    return kvr_radix_store(t, w, 0, parent == NONE ? NULL : &parent, b, n);
}

/* Text of a dump: "id:w:parent|-:[local/ext,...]" joined by ';'. */
static char *dump_text(kvr_radix_t *t)
{
    static char buf[4096];
    struct kvr_event_list l;
    kvr_event_list_init(&l);
    ck_assert_int_eq(kvr_radix_dump(t, &l), KVR_OK);
    size_t k = 0;
    buf[0] = '\0';
    for (size_t i = 0; i < l.n; i++) {
        const struct kvr_event *e = &l.ev[i];
        ck_assert_int_eq(e->kind, KVR_EVENT_STORED);
        ck_assert_uint_eq(e->event_id, i);
        if (e->has_parent)
            k += (size_t)snprintf(buf + k, sizeof(buf) - k,
                                  "%s%" PRIu64 ":%" PRIu64 ":%" PRIu64 ":[", i ? ";" : "",
                                  e->event_id, e->worker_id, e->parent_hash);
        else
            k += (size_t)snprintf(buf + k, sizeof(buf) - k, "%s%" PRIu64 ":%" PRIu64 ":-:[",
                                  i ? ";" : "", e->event_id, e->worker_id);
        for (uint32_t j = 0; j < e->n; j++)
            k += (size_t)snprintf(buf + k, sizeof(buf) - k, "%s%" PRIu64 "/%" PRIu64, j ? "," : "",
                                  e->blocks[j].tokens_hash, e->blocks[j].block_hash);
        k += (size_t)snprintf(buf + k, sizeof(buf) - k, "]");
    }
    kvr_event_list_free(&l);
    return buf;
}

/* Replays t's dump into a fresh tree; every event must apply cleanly. */
static kvr_radix_t *replay(kvr_radix_t *t)
{
    struct kvr_event_list l;
    kvr_radix_t *r;
    kvr_event_list_init(&l);
    ck_assert_int_eq(kvr_radix_dump(t, &l), KVR_OK);
    ck_assert_int_eq(kvr_radix_new(&r), KVR_OK);
    for (size_t i = 0; i < l.n; i++) {
        int rc = kvr_radix_apply(r, &l.ev[i]);
        ck_assert_msg(rc == KVR_OK, "replaying event %zu: %s", i, kvr_strerror(rc));
    }
    kvr_event_list_free(&l);
    char msg[256];
    ck_assert_msg(kvr_radix_check(r, msg, sizeof(msg)) == KVR_OK, "%s", msg);
    return r;
}

static void shape_of(kvr_radix_t *t, char *buf, size_t len)
{
    ck_assert_uint_lt(kvr_radix_shape(t, buf, len), len);
}

/* Sorted match list of q in t as text. */
static void matches_text(kvr_radix_t *t, const uint64_t *q, size_t n, unsigned flags, char *out,
                         size_t len)
{
    struct kvr_match m[128];
    size_t nm;
    ck_assert_int_eq(kvr_radix_find_matches(t, q, n, flags, m, 128, &nm), KVR_OK);
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
    for (size_t i = 0; i < nm && k < len; i++)
        k += (size_t)snprintf(out + k, len - k, "%" PRIu64 ":%u=%u,", m[i].worker_id, m[i].dp_rank,
                              m[i].blocks);
}

START_TEST(v1_dump)
{
    kvr_radix_t *t;
    ck_assert_int_eq(kvr_radix_new(&t), KVR_OK);
    ck_assert_int_eq(st(t, 1, NONE, ARR(1, 2, 3)), KVR_OK);
    ck_assert_int_eq(st(t, 2, NONE, ARR(1, 2)), KVR_OK);
    ck_assert_int_eq(st(t, 2, 200, ARR(4)), KVR_OK);
    uint64_t h = 100;
    ck_assert_int_eq(kvr_radix_remove(t, 1, 0, &h, 1, NULL), KVR_OK);
    ck_assert_str_eq(dump_text(t), "0:2:-:[1/100,2/200];1:2:200:[4/400]");
    kvr_radix_t *r = replay(t);
    char s[256];
    shape_of(r, s, sizeof(s));
    ck_assert_str_eq(s, "[1,2,4]{2:0}");
    matches_text(r, ARR(1, 2, 3), 0, s, sizeof(s));
    ck_assert_str_eq(s, "2:0=2,");
    matches_text(r, ARR(1, 2, 4), 0, s, sizeof(s));
    ck_assert_str_eq(s, "2:0=3,");
    kvr_radix_free(r);
    kvr_radix_free(t);
}
END_TEST

START_TEST(v2_dump_merges_chain)
{
    kvr_radix_t *t;
    ck_assert_int_eq(kvr_radix_new(&t), KVR_OK);
    ck_assert_int_eq(st(t, 1, NONE, ARR(1, 2)), KVR_OK);
    ck_assert_int_eq(st(t, 2, NONE, ARR(1)), KVR_OK);
    ck_assert_int_eq(st(t, 2, 100, ARR(3)), KVR_OK);
    uint64_t h1 = 100, h3 = 300;
    ck_assert_int_eq(kvr_radix_remove(t, 2, 0, &h1, 1, NULL), KVR_OK);
    ck_assert_int_eq(kvr_radix_remove(t, 2, 0, &h3, 1, NULL), KVR_OK);
    ck_assert_str_eq(dump_text(t), "0:1:-:[1/100,2/200]");
    char s[256];
    matches_text(t, ARR(1, 2), KVR_MATCH_EARLY_EXIT, s, sizeof(s));
    ck_assert_str_eq(s, "1:0=1,");
    kvr_radix_t *r = replay(t);
    shape_of(r, s, sizeof(s));
    ck_assert_str_eq(s, "[1,2]{1:0}");
    matches_text(r, ARR(1, 2), 0, s, sizeof(s));
    ck_assert_str_eq(s, "1:0=2,");
    matches_text(r, ARR(1, 2), KVR_MATCH_EARLY_EXIT, s, sizeof(s));
    ck_assert_str_eq(s, "1:0=2,"); /* early exit is not replay-stable (§12 V2) */
    kvr_radix_free(r);
    kvr_radix_free(t);
}
END_TEST

START_TEST(v3_dump)
{
    kvr_radix_t *t;
    ck_assert_int_eq(kvr_radix_new(&t), KVR_OK);
    ck_assert_int_eq(st(t, 1, NONE, ARR(1, 2)), KVR_OK);
    ck_assert_int_eq(st(t, 2, NONE, ARR(1, 2, 3)), KVR_OK);
    ck_assert_str_eq(dump_text(t), "0:2:-:[1/100,2/200,3/300];1:1:-:[1/100,2/200]");
    kvr_radix_t *r = replay(t);
    char a[256], b[256];
    shape_of(t, a, sizeof(a));
    shape_of(r, b, sizeof(b));
    ck_assert_str_eq(a, b);
    kvr_radix_free(r);
    kvr_radix_free(t);
}
END_TEST

START_TEST(pinned_topologies_round_trip)
{
    /* §5.9: divergent extensions, identical extensions, a re-planned stale tail. */
    kvr_radix_t *t;
    ck_assert_int_eq(kvr_radix_new(&t), KVR_OK);
    ck_assert_int_eq(st(t, 1, NONE, ARR(1, 2, 3, 4)), KVR_OK);
    ck_assert_int_eq(st(t, 2, NONE, ARR(1, 2, 3, 4)), KVR_OK);
    ck_assert_int_eq(st(t, 1, 400, ARR(5, 6)), KVR_OK);
    ck_assert_int_eq(st(t, 2, 400, ARR(7, 8)), KVR_OK);
    ck_assert_int_eq(st(t, 3, NONE, ARR(1, 2)), KVR_OK);
    ck_assert_int_eq(st(t, 3, 200, ARR(10)), KVR_OK);
    ck_assert_int_eq(st(t, 4, NONE, ARR(1, 2, 3, 4, 5, 6)), KVR_OK);
    ck_assert_int_eq(st(t, 4, 600, ARR(9)), KVR_OK);
    char a[512], b[512];
    shape_of(t, a, sizeof(a));
    /* [5,6] is a leaf, so rank 4's [9] under 600 extends it and downgrades rank 1. */
    ck_assert_str_eq(a, "[1,2]{1:0,2:0,3:0,4:0}->([3,4]{1:0,2:0,4:0}->([5,6,9]{4:0|1:0=2},"
                        "[7,8]{2:0}),[10]{3:0})");
    kvr_radix_t *r = replay(t);
    shape_of(r, b, sizeof(b));
    ck_assert_str_eq(a, b);
    /* Dumping twice gives the same events. */
    char d1[4096];
    strcpy(d1, dump_text(t));
    ck_assert_str_eq(d1, dump_text(t));
    ck_assert_str_eq(d1, dump_text(r));
    kvr_radix_free(r);
    kvr_radix_free(t);
}
END_TEST

/* Random streams: at checkpoints, dump -> replay -> identical scores on every document and on
 * random prefixes; then continue the stream on the replayed tree, checking the model bounds. */
START_TEST(random_dump_replay)
{
    uint64_t base = test_seed(0xd0);
    for (int i = 0; i < 24; i++) {
        struct gen *g = gen_new(base + (uint64_t)i, i % 2 == 0);
        kvr_radix_t *t;
        ck_assert_int_eq(kvr_radix_new(&t), KVR_OK);
        for (int step = 1; step <= 1200; step++) {
            struct gen_op op;
            gen_next(g, &op);
            if (op.kind == GEN_EVENT)
                (void)kvr_radix_apply(t, &op.ev);
            else if (op.kind == GEN_REMOVE_WORKER)
                (void)kvr_radix_remove_worker(t, op.worker_id);
            else
                (void)kvr_radix_remove_rank(t, op.worker_id, op.dp_rank);
            if (step % 150 != 0)
                continue;
            kvr_radix_t *r = replay(t);
            for (size_t d = 0; d < gen_ndocs(g); d++) {
                size_t n;
                const uint64_t *q = gen_doc(g, d, &n);
                for (size_t len = n; len > 0; len = len > 3 ? len / 2 : len - 1) {
                    char a[2048], b[2048];
                    matches_text(t, q, len, 0, a, sizeof(a));
                    matches_text(r, q, len, 0, b, sizeof(b));
                    ck_assert_msg(strcmp(a, b) == 0,
                                  "seed %" PRIu64 " step %d doc %zu len %zu: %s vs %s",
                                  base + (uint64_t)i, step, d, len, a, b);
                }
            }
            /* Continue with the replayed tree. */
            kvr_radix_free(t);
            t = r;
            size_t nranks;
            const struct gen_rank *ranks = gen_ranks(g, &nranks);
            uint64_t exts[1024];
            struct kvr_match m[128];
            for (size_t d = 0; d < gen_ndocs(g); d++) {
                size_t n, nm;
                const uint64_t *q = gen_doc(g, d, &n);
                ck_assert_int_eq(kvr_radix_find_matches(t, q, n, 0, m, 128, &nm), KVR_OK);
                for (size_t k = 0; k < nranks; k++) {
                    size_t held, reach, got = 0;
                    for (size_t j = 0; j < nm; j++)
                        if (m[j].worker_id == ranks[k].worker_id &&
                            m[j].dp_rank == ranks[k].dp_rank)
                            got = m[j].blocks;
                    gen_exts(g, &ranks[k], d, exts);
                    ref_bounds(gen_model(g), ranks[k].worker_id, ranks[k].dp_rank, exts, n, &held,
                               &reach);
                    ck_assert_msg(got <= held && got >= reach,
                                  "after replay: %zu not in [%zu, %zu]", got, reach, held);
                }
            }
        }
        kvr_radix_free(t);
        gen_free(g);
    }
}
END_TEST

/* The dump of t in steps of `budget` blocks, as text (same format as dump_text). */
static char *dump_text_steps(kvr_radix_t *t, size_t budget, size_t *steps)
{
    static char buf[1 << 20];
    struct kvr_event_list l;
    kvr_radix_dump_t *d;
    int done = 0;
    kvr_event_list_init(&l);
    ck_assert_int_eq(kvr_radix_dump_begin(t, &d), KVR_OK);
    *steps = 0;
    while (!done) {
        ck_assert_int_eq(kvr_radix_dump_step(t, d, &l, budget, &done), KVR_OK);
        (*steps)++;
    }
    kvr_radix_dump_end(t, d);
    size_t k = 0;
    buf[0] = '\0';
    for (size_t i = 0; i < l.n && k < sizeof(buf) - 64; i++) {
        const struct kvr_event *e = &l.ev[i];
        k += (size_t)snprintf(buf + k, sizeof(buf) - k, "%s%" PRIu64 ":%" PRIu64 ":%u:%" PRIu64 ":",
                              i ? ";" : "", e->event_id, e->worker_id, e->dp_rank,
                              e->has_parent ? e->parent_hash : NONE);
        for (uint32_t j = 0; j < e->n && k < sizeof(buf) - 64; j++)
            k += (size_t)snprintf(buf + k, sizeof(buf) - k, "%" PRIu64 "/%" PRIu64 ",",
                                  e->blocks[j].tokens_hash, e->blocks[j].block_hash);
    }
    kvr_event_list_free(&l);
    return buf;
}

static void apply_gen_op(kvr_radix_t *t, const struct gen_op *op)
{
    if (op->kind == GEN_EVENT)
        (void)kvr_radix_apply(t, &op->ev);
    else if (op->kind == GEN_REMOVE_WORKER)
        (void)kvr_radix_remove_worker(t, op->worker_id);
    else
        (void)kvr_radix_remove_rank(t, op->worker_id, op->dp_rank);
}

START_TEST(incremental_dump_equals_one_shot)
{
    uint64_t base = test_seed(0xd1);
    static char one[1 << 20];
    for (int i = 0; i < 8; i++) {
        struct gen *g = gen_new(base + (uint64_t)i, i % 2 == 0);
        kvr_radix_t *t;
        ck_assert_int_eq(kvr_radix_new(&t), KVR_OK);
        for (int step = 1; step <= 600; step++) {
            struct gen_op op;
            gen_next(g, &op);
            apply_gen_op(t, &op);
            if (step % 200 != 0)
                continue;
            size_t steps1, steps;
            snprintf(one, sizeof(one), "%s", dump_text_steps(t, SIZE_MAX, &steps1));
            ck_assert_uint_eq(steps1, 1);
            const size_t budgets[3] = {1, 7, 64};
            for (int b = 0; b < 3; b++) {
                ck_assert_str_eq(dump_text_steps(t, budgets[b], &steps), one);
                if (b == 0)
                    ck_assert_uint_gt(steps, 2);
            }
        }
        kvr_radix_free(t);
        gen_free(g);
    }
}
END_TEST

START_TEST(incremental_dump_skips_nodes_freed_meanwhile)
{
    /* Nodes queued by a dump and freed before its next step are skipped, and their structs are
     * not reused for new nodes while the dump is registered: the new chain is not emitted. */
    kvr_radix_t *t;
    ck_assert_int_eq(kvr_radix_new(&t), KVR_OK);
    for (uint64_t k = 1; k <= 5; k++)
        ck_assert_int_eq(st(t, 1, NONE, (uint64_t[]){k, k + 10}, 2), KVR_OK);
    struct kvr_event_list l;
    kvr_radix_dump_t *d;
    int done = 0;
    kvr_event_list_init(&l);
    ck_assert_int_eq(kvr_radix_dump_begin(t, &d), KVR_OK);
    ck_assert_int_eq(kvr_radix_dump_step(t, d, &l, 1, &done), KVR_OK); /* one chain */
    ck_assert_uint_eq(l.n, 1);
    ck_assert_int_eq(kvr_radix_clear_rank(t, 1, 0), KVR_OK);
    for (uint64_t k = 1; k <= 5; k++) /* same first locals, new ext: the queue must not see them */
        ck_assert_int_eq(st(t, 2, NONE, (uint64_t[]){k, k + 20}, 2), KVR_OK);
    while (!done)
        ck_assert_int_eq(kvr_radix_dump_step(t, d, &l, 1, &done), KVR_OK);
    kvr_radix_dump_end(t, d);
    ck_assert_uint_eq(l.n, 1);
    ck_assert_uint_eq(l.ev[0].worker_id, 1);
    kvr_event_list_free(&l);
    /* After the dump, freed structs are reused again, and a new dump sees everything. */
    ck_assert_int_eq(kvr_radix_clear_rank(t, 2, 0), KVR_OK);
    ck_assert_int_eq(st(t, 3, NONE, (uint64_t[]){1, 2, 3}, 3), KVR_OK);
    struct kvr_radix_stats stt;
    kvr_radix_stats(t, &stt);
    ck_assert_uint_eq(stt.nodes, 1);
    ck_assert_str_eq(dump_text(t), "0:3:-:[1/100,2/200,3/300]");
    char msg[256];
    ck_assert_msg(kvr_radix_check(t, msg, sizeof(msg)) == KVR_OK, "%s", msg);
    kvr_radix_free(t);
}
END_TEST

/* Fuzzy dumps: a dump runs in steps of a few blocks while random operations are applied in
 * between. A fresh tree replaying the dump and then every operation applied after the dump began
 * must not overcount at the end against the reference model (which saw every operation). */
START_TEST(incremental_dump_under_writes)
{
    uint64_t base = test_seed(0xf2);
    uint64_t checks = 0, replay_errors = 0, events = 0, under = 0;
    for (int i = 0; i < 16; i++) {
        struct gen *g = gen_new(base + (uint64_t)i, i % 2 == 0);
        kvr_radix_t *t;
        ck_assert_int_eq(kvr_radix_new(&t), KVR_OK);
        for (int step = 0; step < 300; step++) {
            struct gen_op op;
            gen_next(g, &op);
            apply_gen_op(t, &op);
        }
        for (int round = 0; round < 4; round++) {
            /* Start a dump; apply 0..3 operations (kept) between steps of 1..16 blocks. */
            struct kvr_event_list dump, after;
            struct gen_op ctl[4096]; /* worker / rank removals, by position in `after` */
            size_t ctl_at[4096], nctl = 0;
            kvr_event_list_init(&dump);
            kvr_event_list_init(&after);
            kvr_radix_dump_t *d;
            int done = 0;
            uint64_t x = base * 977u + (uint64_t)(i * 31 + round);
            ck_assert_int_eq(kvr_radix_dump_begin(t, &d), KVR_OK);
            while (!done) {
                x = x * 6364136223846793005ull + 1442695040888963407ull;
                ck_assert_int_eq(kvr_radix_dump_step(t, d, &dump, 1 + (x >> 60), &done), KVR_OK);
                for (uint64_t k = (x >> 40) % 4; k > 0 && nctl < 4096; k--) {
                    struct gen_op op;
                    gen_next(g, &op);
                    apply_gen_op(t, &op);
                    if (op.kind == GEN_EVENT) {
                        ck_assert_int_eq(kvr_event_list_push(&after, &op.ev), KVR_OK);
                    } else {
                        ctl[nctl] = op;
                        ctl_at[nctl++] = after.n;
                    }
                }
            }
            kvr_radix_dump_end(t, d);
            /* The peer: dump, then every later operation in order. */
            kvr_radix_t *r;
            ck_assert_int_eq(kvr_radix_new(&r), KVR_OK);
            for (size_t e = 0; e < dump.n; e++)
                replay_errors += kvr_radix_apply(r, &dump.ev[e]) != KVR_OK;
            events += dump.n;
            size_t c = 0;
            for (size_t e = 0; e <= after.n; e++) {
                while (c < nctl && ctl_at[c] == e)
                    apply_gen_op(r, &ctl[c++]);
                if (e < after.n)
                    (void)kvr_radix_apply(r, &after.ev[e]);
            }
            char msg[256];
            ck_assert_msg(kvr_radix_check(r, msg, sizeof(msg)) == KVR_OK, "%s", msg);
            ck_assert_msg(kvr_radix_check(t, msg, sizeof(msg)) == KVR_OK, "%s", msg);
            size_t nranks;
            const struct gen_rank *ranks = gen_ranks(g, &nranks);
            uint64_t exts[GEN_MAX_DOC_LEN];
            struct kvr_match m[128];
            for (size_t dd = 0; dd < gen_ndocs(g); dd++) {
                size_t n, nm;
                const uint64_t *q = gen_doc(g, dd, &n);
                ck_assert_int_eq(kvr_radix_find_matches(r, q, n, 0, m, 128, &nm), KVR_OK);
                for (size_t k = 0; k < nranks; k++) {
                    size_t held, reach, got = 0;
                    for (size_t j = 0; j < nm; j++)
                        if (m[j].worker_id == ranks[k].worker_id &&
                            m[j].dp_rank == ranks[k].dp_rank)
                            got = m[j].blocks;
                    gen_exts(g, &ranks[k], dd, exts);
                    ref_bounds(gen_model(g), ranks[k].worker_id, ranks[k].dp_rank, exts, n, &held,
                               &reach);
                    ck_assert_msg(got <= held,
                                  "seed %" PRIu64 " round %d doc %zu rank %zu: OVERCOUNT after "
                                  "fuzzy dump + replay: %zu > held %zu",
                                  base + (uint64_t)i, round, dd, k, got, held);
                    under += got < reach;
                    checks++;
                }
            }
            kvr_radix_free(r);
            kvr_event_list_free(&dump);
            kvr_event_list_free(&after);
        }
        kvr_radix_free(t);
        gen_free(g);
    }
    fprintf(stderr,
            "fuzzy dumps: %" PRIu64 " events, %" PRIu64 " replay errors, %" PRIu64
            " checks, %" PRIu64 " below the reachable bound\n",
            events, replay_errors, checks, under);
    ck_assert_uint_gt(checks, 1000);
}
END_TEST

Suite *radix_dump_suite(void);

Suite *radix_dump_suite(void)
{
    Suite *s = suite_create("radix_dump");
    TCase *tc = tcase_create("api");
    tcase_add_test(tc, v1_dump);
    tcase_add_test(tc, v2_dump_merges_chain);
    tcase_add_test(tc, v3_dump);
    tcase_add_test(tc, pinned_topologies_round_trip);
    tcase_add_test(tc, incremental_dump_skips_nodes_freed_meanwhile);
    suite_add_tcase(s, tc);
    tc = tcase_create("oracle");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, random_dump_replay);
    tcase_add_test(tc, incremental_dump_equals_one_shot);
    tcase_add_test(tc, incremental_dump_under_writes);
    suite_add_tcase(s, tc);
    return s;
}
