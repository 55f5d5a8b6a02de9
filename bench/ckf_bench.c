/* ckf_bench.c - kvr-ckf-bench: CKF microbenchmarks and op-stream replay with the CKF index.
 * SPDX-License-Identifier: Apache-2.0
 *
 *   kvr-ckf-bench [micro] [--buckets N] [--seed S]
 *       insertion success rate vs load, probes/s (1 and 16 lanes), 16-lane prefix searches/s
 *       (search and linear reference, with probes per search), bytes per block; rates are per
 *       second of this thread's CPU time
 *   kvr-ckf-bench search [--len L] [--docs D] [--searches N] [--linear]
 *       one of the two 16-lane searches alone (for instruction counts under callgrind)
 *   kvr-ckf-bench replay FILE [--expected N] [--translate] [--gen-a] [--max-load PCT]
 *                             [--max-levels 1|2] [--window W] [--check]
 *       replays an op stream (spec/opstream.md) into the CKF index; every match is compared
 *       with its expect: per query, an undercount (some worker below expect) or an overcount
 *       (some worker above) is counted and reported, never a failure. Exit status 0 unless the
 *       file cannot be read or parsed, or --check is given and the acceptance bar (0
 *       undercounting queries, <= 0.1% overcounting queries, <= 3 bytes per block, no omission)
 *       is missed (exit 1). It also prints the first-order model of the overcounting share:
 *       per query, the ranks whose expected depth is below the query length (each probes its
 *       first missing position) and their per-probe false-hit rates (kvr_ckf_index_rank_fpr).
 *
 * The op stream is loaded with the shared loader (bench/opstream.h) before the clock starts.
 *
 * Figures: "filter bytes" are the bucket words of every CKF table (the compact index);
 * "bytes per block" = filter bytes / (rank, block) entries held at the end; the exact side
 * (ownership and translation maps) is reported separately. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kvr/ckf.h"
#include "kvr/ckf_index.h"
#include "kvr/ckf_search.h"
#include "kvr/err.h"
#include "kvr/event.h"
#include "kvr/hash.h"
#include "opstream.h"

static volatile uint64_t sink; /* keeps benchmark results alive */

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* This thread's CPU time: the micro figures use it (a loaded machine stretches wall time, not
 * the CPU time a single-threaded loop consumes). */
static double cpu_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static uint64_t rng_next(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

/* ==== micro =================================================================================== */

static void bench_insert_vs_load(uint64_t nb, uint64_t seed)
{
    struct kvr_ckf_config cfg;
    kvr_ckf_config_init(&cfg);
    cfg.num_buckets = nb;
    kvr_ckf_t *f = NULL;
    if (kvr_ckf_new(&cfg, &f) != KVR_OK)
        exit(1);
    uint64_t slots = nb * 4, s = seed, stored = 0, first_fail = 0;
    printf("insertion success rate vs load (%" PRIu64 " buckets, max_kicks %u):\n", nb,
           KVR_CKF_MAX_KICKS);
    double t0 = now_s(), t90 = 0;
    uint64_t attempts_total = 0, attempts90 = 0;
    for (int step = 0; step < 20; step++) {
        uint64_t target = slots * (uint64_t)(step + 1) / 20, att = 0, ok = 0;
        /* attempts until the load target is reached or 5% of slots attempts failed in a row */
        while (stored < target && att < slots / 20 * 4) {
            att++;
            if (kvr_ckf_insert(f, rng_next(&s), NULL, NULL) == KVR_OK) {
                ok++;
                stored++;
            } else if (first_fail == 0) {
                first_fail = stored;
            }
        }
        attempts_total += att;
        if (step == 17) {
            t90 = now_s() - t0;
            attempts90 = attempts_total;
        }
        printf("  load %.2f-%.2f: %" PRIu64 " attempts, success %.4f\n", step * 0.05,
               (step + 1) * 0.05, att, att ? (double)ok / (double)att : 0.0);
        if (stored < target)
            break;
    }
    double dt = now_s() - t0;
    printf("  first failure at load %.4f; final load %.4f; %.2f M inserts/s up to load 0.90, "
           "%.2f M attempts/s overall\n",
           (double)first_fail / (double)slots, (double)stored / (double)slots,
           t90 > 0 ? (double)attempts90 / t90 / 1e6 : 0.0, (double)attempts_total / dt / 1e6);
    kvr_ckf_free(f);
}

struct fill {
    kvr_ckf_table_t *t;
    uint64_t *held; /* per lane: held hashes */
    uint64_t n_per_lane;
};

static void fill_table(struct fill *fl, uint32_t lanes, uint64_t nb, double load, uint64_t seed)
{
    if (kvr_ckf_table_new(lanes, nb, KVR_CKF_DEFAULT_SEED, &fl->t) != KVR_OK)
        exit(1);
    struct kvr_ckf_rng rng;
    struct kvr_ckf_kick *log = malloc(KVR_CKF_MAX_KICKS * sizeof(*log));
    kvr_ckf_rng_seed_lane(&rng, seed, 0);
    struct kvr_ckf_kicker k = {&rng, log, KVR_CKF_MAX_KICKS};
    fl->n_per_lane = (uint64_t)(load * (double)(nb * 4));
    uint64_t s = seed;
    for (uint32_t l = 0; l < lanes; l++) {
        struct kvr_ckf_view v;
        kvr_ckf_table_view(fl->t, l, &v);
        for (uint64_t i = 0; i < fl->n_per_lane; i++) {
            struct kvr_ckf_key key;
            kvr_ckf_key_make(rng_next(&s), KVR_CKF_DEFAULT_SEED, &key);
            (void)kvr_ckf_view_insert(&v, &k, &key, NULL, NULL);
        }
    }
    free(log);
}

static void bench_probes(uint64_t nb, uint64_t seed)
{
    for (uint32_t lanes = 1; lanes <= 16; lanes += 15) {
        struct fill fl;
        fill_table(&fl, lanes, nb, 0.8, seed);
        const uint64_t n = 4000000;
        uint64_t s = seed ^ 0x55, hits = 0;
        double t0 = cpu_s();
        for (uint64_t i = 0; i < n; i++) {
            struct kvr_ckf_key key;
            kvr_ckf_key_make(rng_next(&s), KVR_CKF_DEFAULT_SEED, &key);
            hits += (uint64_t)__builtin_popcount(kvr_ckf_table_probe_key(fl.t, &key));
        }
        double dt = cpu_s() - t0;
        printf("probes (%2u lanes, %" PRIu64 " buckets, load 0.80, %zu MiB): %.2f M probes/s "
               "(%.1f ns CPU, incl. addressing), %.2f M lane-probes/s; FPR %.3e (model %.3e)\n",
               lanes, nb, kvr_ckf_table_words_bytes(fl.t) >> 20, (double)n / dt / 1e6,
               dt / (double)n * 1e9, (double)n * lanes / dt / 1e6,
               (double)hits / (double)(n * lanes), 8 * 0.8 / 65536);
        printf("bytes per block (%u lanes at load 0.80): %.3f\n", lanes,
               (double)kvr_ckf_table_words_bytes(fl.t) / (double)(fl.n_per_lane * lanes));
        kvr_ckf_table_free(fl.t);
    }
}

/* Counts probes: a probe callback over a table for one request's sequence hashes. */
struct count_ctx {
    const kvr_ckf_table_t *t;
    const uint64_t *seq;
    uint64_t probes;
    uint64_t seen[8]; /* distinct positions probed (n <= 512) */
};

static uint16_t count_probe(void *vctx, size_t pos)
{
    struct count_ctx *c = vctx;
    c->probes++;
    c->seen[pos / 64] |= (uint64_t)1 << (pos % 64);
    struct kvr_ckf_key key;
    kvr_ckf_key_make(c->seq[pos], kvr_ckf_table_seed(c->t), &key);
    return kvr_ckf_table_probe_key(c->t, &key);
}

/* 16 lanes; `docs` documents of `len` blocks; each lane holds a random prefix of each document
 * with probability 1/4 (depth uniform), up to 80% load. which: 0 = both searches, 1 = the
 * search only, 2 = the linear reference only (one at a time for instruction counts: run under
 * valgrind --tool=callgrind with --searches N and with --searches 0, and divide the difference
 * by N). Times are this thread's CPU time. */
static void bench_search(uint64_t nb, uint64_t seed, size_t docs, size_t len, int which,
                         long searches)
{
    const size_t DOCS = docs, LEN = len;
    kvr_ckf_table_t *t = NULL;
    if (kvr_ckf_table_new(16, nb, KVR_CKF_DEFAULT_SEED, &t) != KVR_OK)
        exit(1);
    uint64_t *seq = malloc((size_t)DOCS * LEN * sizeof(*seq)), s = seed;
    for (size_t i = 0; i < (size_t)DOCS * LEN; i++)
        seq[i] = rng_next(&s);
    struct kvr_ckf_rng rng;
    struct kvr_ckf_kick *log = malloc(KVR_CKF_MAX_KICKS * sizeof(*log));
    kvr_ckf_rng_seed_lane(&rng, seed, 0);
    struct kvr_ckf_kicker k = {&rng, log, KVR_CKF_MAX_KICKS};
    uint64_t budget = nb * 4 * 8 / 10, total = 0;
    for (uint32_t l = 0; l < 16; l++) {
        struct kvr_ckf_view v;
        kvr_ckf_table_view(t, l, &v);
        uint64_t used = 0;
        for (size_t d = 0; d < DOCS && used < budget; d++) {
            if (rng_next(&s) % 4 != 0)
                continue;
            uint64_t depth = rng_next(&s) % (LEN + 1);
            for (uint64_t i = 0; i < depth && used < budget; i++, used++) {
                struct kvr_ckf_key key;
                kvr_ckf_key_make(seq[d * LEN + i], KVR_CKF_DEFAULT_SEED, &key);
                (void)kvr_ckf_view_insert(&v, &k, &key, NULL, NULL);
            }
        }
        total += used;
    }
    const long n = searches >= 0 ? searches : (long)(12800000 / LEN);
    uint32_t depths[16];
    uint64_t sum = 0, sum_lin = 0;
    uint64_t so = s;
    double dt = 0, dl = 0;
    if (which != 2) {
        double t0 = cpu_s();
        for (long i = 0; i < n; i++) {
            size_t d = (size_t)(rng_next(&s) % DOCS);
            kvr_ckf_table_search(t, &seq[d * LEN], LEN, 0xFFFF, 8, depths);
            sum += depths[i & 15];
        }
        dt = cpu_s() - t0;
    }
    if (which != 1) {
        s = so;
        double t1 = cpu_s();
        for (long i = 0; i < n; i++) {
            size_t d = (size_t)(rng_next(&s) % DOCS);
            kvr_ckf_table_search_linear(t, &seq[d * LEN], LEN, 0xFFFF, depths);
            sum_lin += depths[i & 15];
        }
        dl = cpu_s() - t1;
    }
    /* probes per search (a separate pass with a counting probe) */
    struct count_ctx cc = {t, NULL, 0, {0}};
    uint64_t probes_s = 0, probes_l = 0, pos_s = 0, pos_l = 0;
    const int nc = 20000;
    s = so;
    for (int i = 0; i < nc && LEN <= 512; i++) {
        size_t d = (size_t)(rng_next(&s) % DOCS);
        cc.seq = &seq[d * LEN];
        memset(cc.seen, 0, sizeof(cc.seen));
        cc.probes = 0;
        kvr_ckf_prefix_search(LEN, 0xFFFF, 8, count_probe, &cc, depths);
        probes_s += cc.probes;
        for (int w = 0; w < 8; w++)
            pos_s += (uint64_t)__builtin_popcountll(cc.seen[w]);
        memset(cc.seen, 0, sizeof(cc.seen));
        cc.probes = 0;
        kvr_ckf_prefix_linear(LEN, 0xFFFF, count_probe, &cc, depths);
        probes_l += cc.probes;
        for (int w = 0; w < 8; w++)
            pos_l += (uint64_t)__builtin_popcountll(cc.seen[w]);
    }
    printf("prefix search (16 lanes, %" PRIu64 " buckets, load %.2f, %zu-block requests, %ld "
           "searches, CPU time):",
           nb, (double)total / (double)(nb * 4 * 16), LEN, n);
    if (which != 2)
        printf(" search %.0f searches/s (%.2f us)", dt > 0 ? (double)n / dt : 0.0,
               n ? dt / (double)n * 1e6 : 0.0);
    if (which != 1)
        printf("%s linear reference %.0f searches/s (%.2f us)", which ? "" : ";",
               dl > 0 ? (double)n / dl : 0.0, n ? dl / (double)n * 1e6 : 0.0);
    printf("\n  probes per search: search %.1f (%.1f distinct positions), linear %.1f\n",
           (double)probes_s / nc, (double)pos_s / nc, (double)probes_l / nc);
    sink = sum + sum_lin;
    free(seq);
    free(log);
    kvr_ckf_table_free(t);
}

/* ==== replay ================================================================================== */

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

#define MAX_WORKERS 1024

/* The overcount model's workers (rank 0 of each worker seen in an event, at most MAX_WORKERS):
 * in order of first appearance (the order the model multiplies in), with each one's per-probe
 * false-hit rate cached (kvr_ckf_index_rank_fpr, re-read after events), and a list of their
 * indices sorted by worker id for lookups. */
struct model {
    uint64_t id[MAX_WORKERS];
    double fpr[MAX_WORKERS];
    int known[MAX_WORKERS];      /* the index has the rank (fpr valid) */
    uint32_t exp[MAX_WORKERS];   /* the current query's expected depth (0 between queries) */
    uint32_t by_id[MAX_WORKERS]; /* indices, ascending id */
    size_t n;
    int stale; /* an event since the rates were read */
};

/* Position in by_id of the first worker whose id is >= id. */
static size_t model_lower(const struct model *m, uint64_t id)
{
    size_t lo = 0, hi = m->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (m->id[m->by_id[mid]] < id)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* The worker's index, or -1 if it is not tracked. */
static long model_find(const struct model *m, uint64_t id)
{
    size_t p = model_lower(m, id);
    return p < m->n && m->id[m->by_id[p]] == id ? (long)m->by_id[p] : -1;
}

static void model_add(struct model *m, uint64_t id)
{
    size_t p = model_lower(m, id);
    if ((p < m->n && m->id[m->by_id[p]] == id) || m->n == MAX_WORKERS)
        return;
    memmove(&m->by_id[p + 1], &m->by_id[p], (m->n - p) * sizeof(m->by_id[0]));
    m->by_id[p] = (uint32_t)m->n;
    m->id[m->n] = id;
    m->exp[m->n] = 0;
    m->n++;
}

static void model_refresh(struct model *m, const kvr_ckf_index_t *idx)
{
    for (size_t w = 0; w < m->n; w++)
        m->known[w] = kvr_ckf_index_rank_fpr(idx, m->id[w], 0, &m->fpr[w]) == KVR_OK;
    m->stale = 0;
}

static int replay(const char *path, uint64_t expected, int translate, int gen_a, uint32_t max_load,
                  uint32_t window, uint32_t max_levels, int check)
{
    struct kvr_opstream s;
    char err[256];
    kvr_opstream_init(&s);
    int rc = kvr_opstream_load(path, &s, err, sizeof(err));
    if (rc != KVR_OK) {
        fprintf(stderr, "kvr-ckf-bench: %s: %s\n", path, err);
        kvr_opstream_free(&s);
        return 2;
    }
    struct kvr_ckf_index_config cfg;
    kvr_ckf_index_config_init(&cfg);
    cfg.expected_blocks_per_rank = expected;
    cfg.translate = translate;
    cfg.sizing = gen_a ? KVR_CKF_SIZING_GEN_A : KVR_CKF_SIZING_COMPACT;
    if (max_load)
        cfg.max_load_pct = max_load;
    if (window)
        cfg.window = window;
    if (max_levels)
        cfg.max_levels = max_levels;
    kvr_ckf_index_t *idx = NULL;
    rc = kvr_ckf_index_new(&cfg, &idx);
    if (rc != KVR_OK) {
        fprintf(stderr, "kvr-ckf-bench: bad index config (%s)\n", kvr_strerror(rc));
        kvr_opstream_free(&s);
        return 2;
    }
    size_t queries = 0, under_q = 0, over_q = 0, under_r = 0, over_r = 0, events = 0;
    size_t event_errors = 0, block_ops = 0, n_lat = 0;
    uint64_t over_blocks = 0;
    /* the first-order model of overcounting (kvr_ckf_index_rank_fpr): per query, every rank
     * whose expected depth is below the query length probes its first missing position; a
     * false hit there is the overcount */
    static struct model model;
    size_t lanes_at_miss = 0;
    double predicted = 0, fpr_sum = 0;
    double *lat = malloc((s.n_queries + 1) * sizeof(*lat)), t_apply = 0, t_query = 0;
    struct kvr_match out[256];
    if (lat == NULL)
        exit(2);
    for (size_t i = 0; i < s.n_ops; i++) {
        const struct kvr_opstream_op *op = &s.ops[i];
        if (op->kind == KVR_OPSTREAM_EVENT) {
            const struct kvr_event *ev = &s.events.ev[op->index];
            model_add(&model, ev->worker_id);
            model.stale = 1;
            double t0 = now_s();
            int erc = kvr_ckf_index_apply(idx, ev);
            t_apply += now_s() - t0;
            events++;
            block_ops += ev->n;
            event_errors += erc != KVR_OK;
            continue;
        }
        const struct kvr_opstream_query *q = &s.queries[op->index];
        const struct kvr_opstream_expect *ex = kvr_opstream_query_expects(&s, q);
        size_t n = 0;
        double t0 = now_s();
        rc = kvr_ckf_index_find_matches(idx, kvr_opstream_query_hashes(&s, q), q->n, 0, out, 256,
                                        &n);
        double dt = now_s() - t0;
        t_query += dt;
        block_ops += q->n;
        lat[n_lat++] = dt;
        queries++;
        int under = 0, over = 0;
        /* every expected worker: CKF score vs expect; every scored worker not expected: over */
        for (uint32_t e = 0; e < q->n_expect; e++) {
            uint32_t got = 0;
            for (size_t k = 0; k < n; k++)
                if (out[k].worker_id == ex[e].worker_id && out[k].dp_rank == 0)
                    got = out[k].blocks;
            if (got < ex[e].blocks) {
                under = 1;
                under_r++;
            } else if (got > ex[e].blocks) {
                over = 1;
                over_r++;
                over_blocks += got - ex[e].blocks;
            }
        }
        for (size_t k = 0; k < n; k++) {
            int known = 0;
            for (uint32_t e = 0; e < q->n_expect; e++)
                known |= out[k].worker_id == ex[e].worker_id;
            if (!known) {
                over = 1;
                over_r++;
                over_blocks += out[k].blocks;
            }
        }
        double miss = 1.0; /* P(no lane probed at a miss has a false hit there) */
        if (model.stale)
            model_refresh(&model, idx);
        for (uint32_t e = 0; e < q->n_expect; e++) {
            long w = model_find(&model, ex[e].worker_id);
            if (w >= 0)
                model.exp[w] = ex[e].blocks; /* the last expect of a worker counts */
        }
        for (size_t w = 0; w < model.n; w++) {
            uint32_t exp = model.exp[w];
            model.exp[w] = 0;
            if (exp >= q->n || !model.known[w])
                continue;
            double f = model.fpr[w];
            lanes_at_miss++;
            fpr_sum += f;
            miss *= 1.0 - f;
        }
        predicted += 1.0 - miss;
        if (under && under_q < 5)
            fprintf(stderr, "undercount at line %u (query of %u blocks)\n", op->line, q->n);
        under_q += (size_t)under;
        over_q += (size_t)over;
    }
    struct kvr_ckf_index_stats st;
    kvr_ckf_index_stats(idx, &st);
    qsort(lat, n_lat, sizeof(*lat), cmp_double);
    double p99 = n_lat ? lat[(size_t)((double)n_lat * 0.99)] : 0;
    printf("replay %s (CKF index, %s hashes, expected_blocks_per_rank %" PRIu64
           ", %s sizing, max_load %u%%, max_levels %u, window %u)\n",
           path, translate ? "translated" : "canonical", expected, gen_a ? "gen A" : "compact",
           cfg.max_load_pct, cfg.max_levels, cfg.window);
    printf("  lines %zu: events %zu (errors %zu: err_block %" PRIu64 ", err_parent %" PRIu64
           "), queries %zu\n",
           s.n_ops, events, event_errors, st.err_block, st.err_parent, queries);
    printf("  undercounting queries: %zu (%zu rank answers)\n", under_q, under_r);
    printf("  overcounting queries:  %zu = %.4f%% (%zu rank answers, %" PRIu64 " extra blocks)\n",
           over_q, queries ? 100.0 * (double)over_q / (double)queries : 0.0, over_r, over_blocks);
    printf("  model: %.2f ranks per query probe a first missing position, at a mean per-probe "
           "false-hit rate %.3e (sum of 8 x level load / 65535 = %.3f level loads); predicted "
           "overcounting queries %.1f = %.4f%% (measured %zu)\n",
           queries ? (double)lanes_at_miss / (double)queries : 0.0,
           lanes_at_miss ? fpr_sum / (double)lanes_at_miss : 0.0,
           lanes_at_miss ? fpr_sum / (double)lanes_at_miss * 65535.0 / 8.0 : 0.0, predicted,
           queries ? 100.0 * predicted / (double)queries : 0.0, over_q);
    printf("  ranks %" PRIu64 ", groups %" PRIu64 ", levels %" PRIu64 " (growths %" PRIu64
           ", rebuilds %" PRIu64 ", %" PRIu64 " fingerprints moved), omissions %" PRIu64
           ", invariant violations %" PRIu64 "\n",
           st.ranks, st.groups, st.levels, st.growths, st.rebuilds, st.moved, st.omissions,
           st.invariant);
    printf("  blocks held %" PRIu64 " (fingerprints %" PRIu64 ", slot load %.3f)\n", st.blocks,
           st.fingerprints, st.slots ? (double)st.fingerprints / (double)st.slots : 0.0);
    printf("  filter bytes %zu = %.3f bytes per stored block (compact index)\n", st.filter_bytes,
           st.blocks ? (double)st.filter_bytes / (double)st.blocks : 0.0);
    printf("  exact side (ownership%s maps) %zu bytes = %.2f bytes per block (not in the "
           "figure above)\n",
           translate ? " + translation" : "", st.exact_bytes,
           st.blocks ? (double)st.exact_bytes / (double)st.blocks : 0.0);
    printf("  apply %.3f s (%.0f events/s); find_matches %.3f s (%.0f queries/s, p99 %.1f us); "
           "%.0f block ops/s overall\n",
           t_apply, (double)events / t_apply, t_query, (double)queries / t_query, p99 * 1e6,
           (double)block_ops / (t_apply + t_query));
    int status = 0;
    if (check) {
        /* the acceptance bar of the CKF index mode on the Mooncake conversation stream */
        double over_pct = queries ? 100.0 * (double)over_q / (double)queries : 0.0;
        double bpb = st.blocks ? (double)st.filter_bytes / (double)st.blocks : 0.0;
        int ok = under_q == 0 && over_pct <= 0.1 && bpb <= 3.0 && st.omissions == 0;
        printf("  check (0 undercounts, <= 0.1%% overcounting queries, <= 3 bytes per block): "
               "%s\n",
               ok ? "PASS" : "FAIL");
        status = ok ? 0 : 1;
    }
    free(lat);
    kvr_ckf_index_free(idx);
    kvr_opstream_free(&s);
    return status;
}

int main(int argc, char **argv)
{
    uint64_t nb = 1u << 16, seed = 1, expected = 16384;
    uint32_t max_load = 0, window = 0, max_levels = 0;
    int translate = 0, gen_a = 0, check = 0, linear = 0;
    long searches = -1;
    size_t len = 64, docs = 0;
    const char *mode = "micro", *file = NULL;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--buckets") == 0 && i + 1 < argc)
            nb = strtoull(argv[++i], NULL, 0);
        else if (strcmp(argv[i], "--seed") == 0 && i + 1 < argc)
            seed = strtoull(argv[++i], NULL, 0);
        else if (strcmp(argv[i], "--expected") == 0 && i + 1 < argc)
            expected = strtoull(argv[++i], NULL, 0);
        else if (strcmp(argv[i], "--max-load") == 0 && i + 1 < argc)
            max_load = (uint32_t)strtoul(argv[++i], NULL, 0);
        else if (strcmp(argv[i], "--max-levels") == 0 && i + 1 < argc)
            max_levels = (uint32_t)strtoul(argv[++i], NULL, 0);
        else if (strcmp(argv[i], "--window") == 0 && i + 1 < argc)
            window = (uint32_t)strtoul(argv[++i], NULL, 0);
        else if (strcmp(argv[i], "--len") == 0 && i + 1 < argc)
            len = (size_t)strtoull(argv[++i], NULL, 0);
        else if (strcmp(argv[i], "--docs") == 0 && i + 1 < argc)
            docs = (size_t)strtoull(argv[++i], NULL, 0);
        else if (strcmp(argv[i], "--searches") == 0 && i + 1 < argc)
            searches = strtol(argv[++i], NULL, 0);
        else if (strcmp(argv[i], "--linear") == 0)
            linear = 1;
        else if (strcmp(argv[i], "--translate") == 0)
            translate = 1;
        else if (strcmp(argv[i], "--gen-a") == 0)
            gen_a = 1;
        else if (strcmp(argv[i], "--check") == 0)
            check = 1;
        else if (strcmp(argv[i], "micro") == 0 || strcmp(argv[i], "replay") == 0 ||
                 strcmp(argv[i], "search") == 0)
            mode = argv[i];
        else if (file == NULL && argv[i][0] != '-')
            file = argv[i];
        else {
            fprintf(stderr, "usage: kvr-ckf-bench [micro] [--buckets N] [--seed S]\n"
                            "       kvr-ckf-bench search [--len L] [--docs D] [--searches N] "
                            "[--linear] [--buckets N] [--seed S]\n"
                            "       kvr-ckf-bench replay FILE [--expected N] [--translate] "
                            "[--gen-a] [--max-load PCT] [--max-levels 1|2] [--window W] "
                            "[--check]\n");
            return 2;
        }
    }
    if (strcmp(mode, "replay") == 0) {
        if (file == NULL) {
            fprintf(stderr, "kvr-ckf-bench: replay needs an op-stream file\n");
            return 2;
        }
        return replay(file, expected, translate, gen_a, max_load, window, max_levels, check);
    }
    if (!kvr_ckf_buckets_valid(nb)) {
        fprintf(stderr, "kvr-ckf-bench: --buckets must be a power of two >= 2\n");
        return 2;
    }
    if (strcmp(mode, "search") == 0) {
        if (len == 0 || len > 512) {
            fprintf(stderr, "kvr-ckf-bench: --len must be in 1..512\n");
            return 2;
        }
        bench_search(nb, seed, docs ? docs : (size_t)2097152 / len, len, linear ? 2 : 1, searches);
        return 0;
    }
    bench_insert_vs_load(nb, seed);
    bench_probes(nb, seed);
    bench_search(nb, seed, 32768, 64, 0, -1);
    bench_search(nb, seed, 4096, 512, 0, -1);
    return 0;
}
