/* test_radix_oracle.c - randomized differential test of the compressed radix tree against the
 * held/reachable reference model (index.md §7), plus allocation-failure injection on random
 * workloads and a self-test proving the harness catches a broken backend.
 *
 * For every operation: stores whose parent the model calls reachable must be accepted, stores
 * under a parent the rank does not hold must be rejected (ParentBlockNotFound); after it, every
 * (query, rank) must satisfy reach_len <= got <= held_len, for each document at full length and
 * three variants of it: a random prefix, the document with one block changed at a random
 * position (a perturbed tail), and the document extended by random blocks. The stepped variant
 * applies removals, clears and rank/worker removals as bounded jobs in steps of a few work units
 * and checks, between steps, that no rank scores above what it held before the operation and
 * that no step exceeds its budget by more than a node's fan-out. Seeds: KVR_TEST_SEED overrides
 * the base seed; a failure prints the seed and the operation number. */
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
    int stepped;   /* apply removals and drops as bounded jobs, checking between steps */
    uint64_t qrng; /* query variants (separate from the generator's stream) */
    /* results */
    char err[512];
    uint64_t queries;
    uint64_t undercounts; /* reach <= got < held: allowed hole undercounts */
    uint64_t nomem;
    uint64_t job_steps;   /* stepped: steps taken */
    uint64_t max_overrun; /* stepped: most work units a step did beyond its budget */
};

#define MAXQ (GEN_MAX_DOC_LEN + 8)
#define MAXR 64

static uint64_t qrand(struct run *r)
{
    uint64_t z = (r->qrng += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

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

/* Scores of query q for every generator rank (got[k], 0 if absent); 0 on a failed call. */
static int scores(kvr_radix_t *t, struct gen *g, const uint64_t *q, size_t n, size_t *got,
                  struct run *r, int step, const char *what)
{
    size_t nranks, nm;
    const struct gen_rank *ranks = gen_ranks(g, &nranks);
    struct kvr_match m[128];
    if (kvr_radix_find_matches(t, q, n, 0, m, 128, &nm) != KVR_OK) {
        snprintf(r->err, sizeof(r->err), "step %d %s: find_matches failed", step, what);
        return 0;
    }
    r->queries++;
    for (size_t k = 0; k < nranks; k++)
        got[k] = 0;
    for (size_t i = 0; i < nm; i++) {
        int known = 0;
        for (size_t k = 0; k < nranks; k++) {
            if (ranks[k].worker_id == m[i].worker_id && ranks[k].dp_rank == m[i].dp_rank) {
                got[k] = m[i].blocks;
                known = 1;
            }
        }
        if (!known) {
            snprintf(r->err, sizeof(r->err), "step %d %s: unknown rank %" PRIu64 ":%u", step, what,
                     m[i].worker_id, m[i].dp_rank);
            return 0;
        }
    }
    return 1;
}

/* Checks one query against the model for every rank; returns 0 and fills r->err on a violation.
 */
static int check_query(kvr_radix_t *t, struct gen *g, struct run *r, int step, const uint64_t *q,
                       size_t n, const char *what, size_t d)
{
    size_t nranks, got[MAXR];
    const struct gen_rank *ranks = gen_ranks(g, &nranks);
    uint64_t exts[MAXQ];
    if (!scores(t, g, q, n, got, r, step, what))
        return 0;
    for (size_t k = 0; k < nranks; k++) {
        size_t held, reach;
        gen_exts_of(g, &ranks[k], q, n, exts);
        ref_bounds(gen_model(g), ranks[k].worker_id, ranks[k].dp_rank, exts, n, &held, &reach);
        if (got[k] > held) {
            snprintf(r->err, sizeof(r->err),
                     "step %d doc %zu %s (len %zu) rank %" PRIu64
                     ":%u: OVERCOUNT got %zu > held %zu",
                     step, d, what, n, ranks[k].worker_id, ranks[k].dp_rank, got[k], held);
            return 0;
        }
        if (got[k] < reach) {
            snprintf(r->err, sizeof(r->err),
                     "step %d doc %zu %s (len %zu) rank %" PRIu64
                     ":%u: unexplained undercount got %zu < reachable %zu",
                     step, d, what, n, ranks[k].worker_id, ranks[k].dp_rank, got[k], reach);
            return 0;
        }
        r->undercounts += got[k] < held;
    }
    return 1;
}

/* Checks every document, and a prefix, a perturbed and an extended variant of it, for every
 * rank; returns 0 and fills r->err on a violation. */
static int check_bounds(kvr_radix_t *t, struct gen *g, struct run *r, int step)
{
    uint64_t v[MAXQ];
    uint64_t alpha = gen_alphabet();
    for (size_t d = 0; d < gen_ndocs(g); d++) {
        size_t n;
        const uint64_t *q = gen_doc(g, d, &n);
        if (!check_query(t, g, r, step, q, n, "full", d))
            return 0;
        if (n > 1 && !check_query(t, g, r, step, q, 1 + (size_t)(qrand(r) % (n - 1)), "prefix", d))
            return 0;
        memcpy(v, q, n * sizeof(uint64_t));
        size_t j = (size_t)(qrand(r) % n);
        v[j] = v[j] % alpha + 1; /* another local of the alphabet */
        if (!check_query(t, g, r, step, v, n, "perturbed", d))
            return 0;
        v[j] = q[j];
        size_t extra = 1 + (size_t)(qrand(r) % 4);
        for (size_t i = 0; i < extra; i++)
            v[n + i] = 1 + qrand(r) % alpha;
        if (!check_query(t, g, r, step, v, n + extra, "extended", d))
            return 0;
    }
    return 1;
}

/* Held prefix of every (document, rank) under the model now, into held[d * MAXR + k]. */
static void held_table(struct gen *g, size_t *held)
{
    size_t nranks;
    const struct gen_rank *ranks = gen_ranks(g, &nranks);
    uint64_t exts[MAXQ];
    for (size_t d = 0; d < gen_ndocs(g); d++) {
        size_t n, reach;
        (void)gen_doc(g, d, &n);
        for (size_t k = 0; k < nranks; k++) {
            gen_exts(g, &ranks[k], d, exts);
            ref_bounds(gen_model(g), ranks[k].worker_id, ranks[k].dp_rank, exts, n,
                       &held[d * MAXR + k], &reach);
        }
    }
}

/* Applies a removal / clear / rank or worker removal as a bounded job in steps of 1..8 units;
 * between steps no rank may score above held_before. Returns the job's result, or INT32_MIN
 * after filling r->err on a violation. */
static int apply_stepped(kvr_radix_t *t, struct gen *g, const struct gen_op *op,
                         const size_t *held_before, size_t ndocs_before, struct run *r, int step)
{
    int rc;
    if (op->kind == GEN_REMOVE_WORKER)
        rc = kvr_radix_remove_worker_begin(t, op->worker_id);
    else if (op->kind == GEN_REMOVE_RANK)
        rc = kvr_radix_remove_rank_begin(t, op->worker_id, op->dp_rank);
    else if (op->ev.kind == KVR_EVENT_REMOVED)
        rc = kvr_radix_remove_begin(t, op->ev.worker_id, op->ev.dp_rank, op->ev.hashes, op->ev.n);
    else
        rc = kvr_radix_clear_begin(t, op->ev.worker_id, op->ev.dp_rank);
    if (rc != KVR_OK)
        return rc;
    for (;;) {
        uint64_t budget = 1 + qrand(r) % 8, w0 = kvr_radix_work(t);
        int more = kvr_radix_step(t, budget);
        uint64_t did = kvr_radix_work(t) - w0;
        r->job_steps++;
        if (did > budget && did - budget > r->max_overrun)
            r->max_overrun = did - budget;
        if (!more)
            break;
        size_t nranks, got[MAXR];
        (void)gen_ranks(g, &nranks);
        for (size_t d = 0; d < ndocs_before; d++) {
            size_t n;
            const uint64_t *q = gen_doc(g, d, &n);
            if (!scores(t, g, q, n, got, r, step, "mid-job"))
                return INT32_MIN;
            for (size_t k = 0; k < nranks; k++) {
                if (got[k] > held_before[d * MAXR + k]) {
                    snprintf(r->err, sizeof(r->err),
                             "step %d doc %zu rank %zu: mid-job score %zu > %zu held before", step,
                             d, k, got[k], held_before[d * MAXR + k]);
                    return INT32_MIN;
                }
            }
        }
    }
    return kvr_radix_job_result(t, NULL);
}

/* Runs one seed; returns 1 if every check passed. */
static int run_seed(struct run *r)
{
    kvr_radix_t *t;
    struct gen *g = gen_new(r->seed, r->uniform);
    size_t *held_before = r->stepped ? malloc(64 * MAXR * sizeof(size_t)) : NULL;
    int ok = 1;
    r->qrng = r->seed * 31u + 7u;
    ck_assert_int_eq(kvr_radix_new(&t), KVR_OK);
    if (r->fail_alloc)
        kvr_alloc_fail_after(kvr_radix_allocator(t), r->fail_alloc);
    for (int step = 0; step < r->steps && ok; step++) {
        struct gen_op op;
        size_t ndocs_before = gen_ndocs(g);
        if (held_before != NULL)
            held_table(g, held_before);
        gen_next(g, &op);
        int jobby = op.kind != GEN_EVENT || op.ev.kind != KVR_EVENT_STORED;
        int rc = held_before != NULL && jobby
                     ? apply_stepped(t, g, &op, held_before, ndocs_before, r, step)
                     : apply_op(t, &op, r->fault);
        if (rc == INT32_MIN) {
            ok = 0;
            break;
        }
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
    free(held_before);
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

START_TEST(differential_stepped_jobs)
{
    uint64_t base = test_seed(0x57e9);
    uint64_t steps = 0, overrun = 0;
    for (int i = 0; i < 16; i++) {
        struct run r = {
            .seed = base + (uint64_t)i, .uniform = i % 2 == 0, .steps = 800, .stepped = 1};
        int ok = run_seed(&r);
        ck_assert_msg(ok, "seed %" PRIu64 " (%s ext, stepped): %s", r.seed,
                      r.uniform ? "uniform" : "per-rank", r.err);
        steps += r.job_steps;
        if (r.max_overrun > overrun)
            overrun = r.max_overrun;
    }
    /* A step may finish its last unit of work (a cut of one position, a settle that pushes a
     * node's children, at most the alphabet's 12, on the drain), never much more. */
    ck_assert_uint_le(overrun, 16);
    ck_assert_uint_gt(steps, 10000);
    fprintf(stderr, "radix oracle, stepped jobs: %" PRIu64 " steps, max overrun %" PRIu64 "\n",
            steps, overrun);
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
    tcase_add_test(tc, differential_stepped_jobs);
    tcase_add_test(tc, harness_catches_dropped_removals);
    suite_add_tcase(s, tc);
    tc = tcase_create("oom");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, oom_every_allocation_random);
    suite_add_tcase(s, tc);
    return s;
}
