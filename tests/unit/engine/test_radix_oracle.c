/* test_radix_oracle.c - randomized differential test of the compressed radix tree against the
 * held/reachable reference model (index.md §7), plus allocation-failure injection on random
 * workloads and a self-test proving the harness catches a broken backend.
 *
 * For every operation: stores whose parent the model calls reachable must be accepted, stores
 * under a parent the rank does not hold must be rejected (ParentBlockNotFound); after it, every
 * (document, rank) query must satisfy reach_len <= got <= held_len. Seeds: KVR_TEST_SEED
 * overrides the base seed; a failure prints the seed and the operation number. */
#include <check.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvr/err.h"
#include "kvr/radix.h"
#include "refmodel.h"

#define SEEDS 64
#define STEPS 2000

enum backend_fault { FAULT_NONE = 0, FAULT_DROP_REMOVALS = 1 };

struct run {
    uint64_t seed;
    int uniform;
    enum backend_fault fault;
    uint64_t fail_alloc; /* 0 = no injection */
    int steps;
    /* results */
    char err[512];
    uint64_t queries;
    uint64_t undercounts; /* reach <= got < held: allowed hole undercounts */
    uint64_t nomem;
};

static int apply_op(kvr_radix_t *t, const struct gen_op *op, enum backend_fault fault)
{
    switch (op->kind) {
    case GEN_EVENT:
        if (fault == FAULT_DROP_REMOVALS && op->ev.kind == KVR_EVENT_REMOVED)
            return KVR_OK;
        return kvr_radix_apply(t, &op->ev);
    case GEN_REMOVE_WORKER:
        return kvr_radix_remove_worker(t, op->worker_id);
    case GEN_REMOVE_RANK:
        return kvr_radix_remove_rank(t, op->worker_id, op->dp_rank);
    default:
        return KVR_EINVAL;
    }
}

/* Checks every document for every rank; returns 0 and fills r->err on a violation. */
static int check_bounds(kvr_radix_t *t, struct gen *g, struct run *r, int step)
{
    size_t nranks;
    const struct gen_rank *ranks = gen_ranks(g, &nranks);
    uint64_t exts[1024];
    struct kvr_match m[128];
    for (size_t d = 0; d < gen_ndocs(g); d++) {
        size_t n, nm;
        const uint64_t *q = gen_doc(g, d, &n);
        if (kvr_radix_find_matches(t, q, n, 0, m, 128, &nm) != KVR_OK) {
            snprintf(r->err, sizeof(r->err), "find_matches failed");
            return 0;
        }
        r->queries++;
        for (size_t i = 0; i < nm; i++) {
            int known = 0;
            for (size_t k = 0; k < nranks; k++)
                known |= ranks[k].worker_id == m[i].worker_id && ranks[k].dp_rank == m[i].dp_rank;
            if (!known) {
                snprintf(r->err, sizeof(r->err), "step %d doc %zu: unknown rank %" PRIu64 ":%u",
                         step, d, m[i].worker_id, m[i].dp_rank);
                return 0;
            }
        }
        for (size_t k = 0; k < nranks; k++) {
            size_t held, reach, got = 0;
            for (size_t i = 0; i < nm; i++)
                if (m[i].worker_id == ranks[k].worker_id && m[i].dp_rank == ranks[k].dp_rank)
                    got = m[i].blocks;
            gen_exts(g, &ranks[k], d, exts);
            ref_bounds(gen_model(g), ranks[k].worker_id, ranks[k].dp_rank, exts, n, &held, &reach);
            if (got > held) {
                snprintf(r->err, sizeof(r->err),
                         "step %d doc %zu (len %zu) rank %" PRIu64
                         ":%u: OVERCOUNT got %zu > held %zu",
                         step, d, n, ranks[k].worker_id, ranks[k].dp_rank, got, held);
                return 0;
            }
            if (got < reach) {
                snprintf(r->err, sizeof(r->err),
                         "step %d doc %zu (len %zu) rank %" PRIu64
                         ":%u: unexplained undercount got %zu < reachable %zu",
                         step, d, n, ranks[k].worker_id, ranks[k].dp_rank, got, reach);
                return 0;
            }
            r->undercounts += got < held;
        }
    }
    return 1;
}

/* Runs one seed; returns 1 if every check passed. */
static int run_seed(struct run *r)
{
    kvr_radix_t *t;
    struct gen *g = gen_new(r->seed, r->uniform);
    int ok = 1;
    ck_assert_int_eq(kvr_radix_new(&t), KVR_OK);
    if (r->fail_alloc)
        kvr_alloc_fail_after(kvr_radix_allocator(t), r->fail_alloc);
    for (int step = 0; step < r->steps && ok; step++) {
        struct gen_op op;
        gen_next(g, &op);
        int rc = apply_op(t, &op, r->fault);
        if (rc == KVR_ENOMEM) {
            r->nomem++;
            uint64_t w = op.kind == GEN_EVENT ? op.ev.worker_id : op.worker_id;
            uint32_t dp = op.kind == GEN_EVENT ? op.ev.dp_rank : op.dp_rank;
            ref_forget_reach(gen_model(g), w, dp);
        } else if (op.kind == GEN_EVENT && op.ev.kind == KVR_EVENT_STORED) {
            if (op.expect == REF_MUST_ACCEPT && rc != KVR_OK) {
                snprintf(r->err, sizeof(r->err), "step %d: store under a reachable parent: %s",
                         step, kvr_strerror(rc));
                ok = 0;
            } else if (op.expect == REF_MUST_REJECT && rc != KVR_EPARENT) {
                snprintf(r->err, sizeof(r->err), "step %d: store under an unheld parent: %s", step,
                         kvr_strerror(rc));
                ok = 0;
            }
        }
        if (ok)
            ok = check_bounds(t, g, r, step);
        if (ok && (step % 97 == 0 || step == r->steps - 1)) {
            char msg[256];
            if (kvr_radix_check(t, msg, sizeof(msg)) != KVR_OK) {
                snprintf(r->err, sizeof(r->err), "step %d: invariant: %s", step, msg);
                ok = 0;
            }
        }
    }
    kvr_radix_free(t);
    gen_free(g);
    return ok;
}

START_TEST(differential_random_streams)
{
    uint64_t base = test_seed(0x6b7672);
    uint64_t queries = 0, under = 0;
    for (int i = 0; i < SEEDS; i++) {
        struct run r = {.seed = base + (uint64_t)i, .uniform = i % 2 == 0, .steps = STEPS};
        int ok = run_seed(&r);
        ck_assert_msg(ok, "seed %" PRIu64 " (%s ext): %s", r.seed,
                      r.uniform ? "uniform" : "per-rank", r.err);
        queries += r.queries;
        under += r.undercounts;
    }
    fprintf(stderr,
            "radix oracle: %d seeds x %d ops, %" PRIu64 " query checks, %" PRIu64
            " allowed hole undercounts\n",
            SEEDS, STEPS, queries, under);
}
END_TEST

START_TEST(harness_catches_dropped_removals)
{
    /* A backend that ignores removals must be caught (overcount) on most seeds. */
    int caught = 0;
    for (int i = 0; i < 8; i++) {
        struct run r = {
            .seed = 1000 + (uint64_t)i, .uniform = 1, .steps = 300, .fault = FAULT_DROP_REMOVALS};
        if (!run_seed(&r)) {
            caught++;
            ck_assert_msg(strstr(r.err, "OVERCOUNT") != NULL, "unexpected failure: %s", r.err);
        }
    }
    ck_assert_int_ge(caught, 7);
}
END_TEST

START_TEST(oom_every_allocation_random)
{
    /* Count the allocations of a clean small run, then fail each one in turn. */
    const int steps = 120;
    for (int mode = 0; mode < 2; mode++) {
        uint64_t seed = test_seed(77) + (uint64_t)mode;
        kvr_radix_t *t;
        struct gen *g = gen_new(seed, mode == 0);
        ck_assert_int_eq(kvr_radix_new(&t), KVR_OK);
        uint64_t before = kvr_radix_allocator(t)->calls;
        for (int s = 0; s < steps; s++) {
            struct gen_op op;
            gen_next(g, &op);
            (void)apply_op(t, &op, FAULT_NONE);
        }
        uint64_t total = kvr_radix_allocator(t)->calls - before;
        kvr_radix_free(t);
        gen_free(g);
        ck_assert_uint_gt(total, 20);
        uint64_t nomem = 0;
        for (uint64_t nth = 1; nth <= total; nth++) {
            struct run r = {.seed = seed, .uniform = mode == 0, .steps = steps, .fail_alloc = nth};
            int ok = run_seed(&r);
            ck_assert_msg(ok, "seed %" PRIu64 " failing allocation %" PRIu64 ": %s", seed, nth,
                          r.err);
            nomem += r.nomem;
        }
        /* Most injected failures surface as KVR_ENOMEM (some hit optional shrinks). */
        ck_assert_uint_gt(nomem, total / 2);
    }
}
END_TEST

Suite *radix_oracle_suite(void);

Suite *radix_oracle_suite(void)
{
    Suite *s = suite_create("radix_oracle");
    TCase *tc = tcase_create("oracle");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, differential_random_streams);
    tcase_add_test(tc, harness_catches_dropped_removals);
    suite_add_tcase(s, tc);
    tc = tcase_create("oom");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, oom_every_allocation_random);
    suite_add_tcase(s, tc);
    return s;
}
