/* kvr_bench.c - kvr-bench: op-stream replay through the index API, verified and timed.
 *
 *   kvr-bench index OPS_FILE [--index radix|ckf] [--readers N] [--repeat R] [--dump-every N]
 *   kvr-bench stats OPS_FILE
 *
 * `index` loads the stream (spec/opstream.md), then replays it on one thread through
 * kvr/index.h: events with kvr_index_apply, match lines with kvr_index_find_matches
 * (early_exit off), each result checked EXACTLY against `expect` (dp_rank 0, zeros omitted).
 * The whole replay is timed with CLOCK_MONOTONIC (load excluded), every find_matches call too;
 * the replay thread's CPU time (CLOCK_THREAD_CPUTIME_ID) is reported beside it.
 *   --repeat R      R replays into fresh indexes; the run with the median time is reported
 *   --dump-every N  every N lines: dump the index, replay the dump into a fresh index and go on
 *                   with it (spec/opstream.md §4.5; dump time is excluded from the replay time)
 *   --readers N     afterwards, the concurrent phase: (1) one writer applies every event with
 *                   kvr_index_apply_batch into a fresh index, alone (writer_alone_seconds);
 *                   (2) one thread runs the stream's queries in a loop on that final index, no
 *                   writer, for as long (the single-thread baseline); (3) a fresh index, one
 *                   writer applying the events again while N reader threads loop over the
 *                   queries (unchecked: the state moves) until it ends. Readers and baseline
 *                   time every find_matches call (lock waits included) into a histogram and
 *                   count the blocks each query matched (its deepest score), not its length
 * Output: human-readable lines, then one JSON object as the LAST line. Units (§5): ops = match
 * lines + event lines; block ops = hashes in matches + blocks in stores + hashes in removals.
 * Exit: 0 verified; 1 a mismatch, an event error of kind ParentBlockNotFound / BlockNotFound /
 * InvalidBlockSequence, or a failed dump replay; 2 usage (or an index kind not available);
 * 3 load or runtime failure.
 *
 * `stats` prints the stream's totals exactly like `kvtrace.py stats` (loader check, no index).
 *
 * Static helpers borrow every pointer they take and return nothing owned, unless their comment says
 * otherwise.
 */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "kvr/err.h"
#include "kvr/index.h"
#include "opstream.h"

#define EXIT_VERIFY 1
#define EXIT_USAGE 2
#define EXIT_RUNTIME 3
#define MAX_SHOWN 10 /* mismatches printed */

struct options {
    const char *file;
    int kind;            /* enum kvr_index_kind */
    unsigned readers;    /* 0 = no concurrent phase */
    unsigned repeat;     /* >= 1 */
    uint64_t dump_every; /* 0 = off */
};

/* Figures of one single-thread replay. */
struct run {
    double seconds;     /* replay time, dumps excluded */
    double cpu_seconds; /* the replay thread's CPU time over the same span */
    double *find_us;    /* one sample per match line (owned) */
    size_t n_find;
    uint64_t mismatches;
    uint64_t overcount_queries;  /* a rank scored above expect (CKF false positives) */
    uint64_t undercount_queries; /* a rank scored below expect */
    size_t exact_bytes;          /* CKF: ownership/translation maps, not the compact index */
    uint64_t event_errors;       /* apply results other than KVR_OK */
    uint64_t err_parent;         /* ParentBlockNotFound */
    uint64_t err_block;          /* BlockNotFound */
    uint64_t err_invalid_seq;    /* InvalidBlockSequence */
    uint64_t query_errors;       /* find_matches failures (counted as mismatches too) */
    uint64_t dumps;
    uint64_t dump_events;
    uint64_t dump_replay_errors;
    double dump_seconds;
    size_t index_bytes;
    size_t live_block_ranks;
};

/* Latency histogram in nanoseconds: exact below 32 ns, then 32 sub-buckets per power of two
 * (values reported as their bucket's upper bound: at most ~3% high). */
#define HIST_BUCKETS 1920u

struct hist {
    uint64_t b[HIST_BUCKETS];
    uint64_t n;
    uint64_t max_ns;
};

/* Figures of the concurrent phase. */
struct concurrent {
    double seconds;       /* writer's wall time with the readers */
    double alone_seconds; /* writer's wall time alone */
    uint64_t reader_queries;
    uint64_t reader_blocks; /* blocks matched (deepest score of each query) */
    uint64_t reader_errors;
    uint64_t event_errors;
    struct hist reader_lat;
    double base_seconds; /* single-thread baseline, no writer */
    uint64_t base_queries;
    uint64_t base_blocks;
    struct hist base_lat;
    uint64_t write_holds;   /* of the index written with readers */
    uint64_t max_hold_work; /* work units of its longest write hold */
};

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* CPU time of the calling thread: unlike wall time, not inflated while the thread is descheduled
 * on a loaded machine (cache pollution by other processes still shows). */
static double thread_cpu_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static uint64_t now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

static unsigned hist_bucket(uint64_t v)
{
    if (v < 32)
        return (unsigned)v;
    unsigned e = 63u - (unsigned)__builtin_clzll(v); /* >= 5 */
    return (e - 4u) * 32u + (unsigned)((v >> (e - 5u)) & 31u);
}

/* Upper bound of bucket i, in ns. */
static uint64_t hist_upper(unsigned i)
{
    if (i < 32)
        return i;
    unsigned e = i / 32u + 4u, sub = i % 32u;
    return ((32u + (uint64_t)sub + 1u) << (e - 5u)) - 1u;
}

static void hist_add(struct hist *h, uint64_t ns)
{
    h->b[hist_bucket(ns)]++;
    h->n++;
    if (ns > h->max_ns)
        h->max_ns = ns;
}

static void hist_merge(struct hist *into, const struct hist *h)
{
    for (unsigned i = 0; i < HIST_BUCKETS; i++)
        into->b[i] += h->b[i];
    into->n += h->n;
    if (h->max_ns > into->max_ns)
        into->max_ns = h->max_ns;
}

/* Nearest-rank percentile in microseconds. */
static double hist_pct_us(const struct hist *h, double p)
{
    if (h->n == 0)
        return 0;
    uint64_t k = (uint64_t)(p * (double)h->n + 0.999999);
    if (k == 0)
        k = 1;
    uint64_t seen = 0;
    for (unsigned i = 0; i < HIST_BUCKETS; i++) {
        seen += h->b[i];
        if (seen >= k)
            return (double)hist_upper(i) / 1000.0;
    }
    return (double)h->max_ns / 1000.0;
}

/* ==== Checking one query ===================================================================== */

/* Result scratch of one thread: grows on KVR_ERANGE. */
struct scratch {
    struct kvr_match *out;
    size_t cap;
};

/* Runs one query into sc; returns the kvr_index_find_matches code (after growth retries). */
static int find(kvr_index_t *idx, const uint64_t *h, size_t n, struct scratch *sc, size_t *n_out)
{
    for (;;) {
        int rc = kvr_index_find_matches(idx, h, n, 0, sc->out, sc->cap, n_out);
        if (rc != KVR_ERANGE)
            return rc;
        size_t cap = *n_out > sc->cap * 2 ? *n_out : sc->cap * 2;
        struct kvr_match *p = realloc(sc->out, cap * sizeof(*p));
        if (p == NULL)
            return KVR_ENOMEM;
        sc->out = p;
        sc->cap = cap;
    }
}

static int cmp_match(const void *a, const void *b)
{
    const struct kvr_match *x = a, *y = b;
    if (x->worker_id != y->worker_id)
        return x->worker_id < y->worker_id ? -1 : 1;
    return x->dp_rank < y->dp_rank ? -1 : x->dp_rank > y->dp_rank;
}

/* Whether got[0..n) (sorted here) equals the expectation exactly. */
static int same(struct kvr_match *got, size_t n, const struct kvr_opstream_expect *e, size_t ne)
{
    qsort(got, n, sizeof(*got), cmp_match);
    if (n != ne)
        return 0;
    for (size_t i = 0; i < n; i++) {
        if (got[i].dp_rank != 0 || got[i].worker_id != e[i].worker_id ||
            got[i].blocks != e[i].blocks)
            return 0;
    }
    return 1;
}

/* For a mismatching answer: whether some rank scored above / below its expectation. */
static void classify(const struct kvr_match *got, size_t n, const struct kvr_opstream_expect *e,
                     size_t ne, int *over, int *under)
{
    *over = *under = 0;
    for (size_t i = 0; i < n; i++) {
        uint64_t want = 0;
        for (size_t j = 0; j < ne; j++)
            if (e[j].worker_id == got[i].worker_id && got[i].dp_rank == 0)
                want = e[j].blocks;
        if (got[i].blocks > want)
            *over = 1;
        else if (got[i].blocks < want)
            *under = 1;
    }
    for (size_t j = 0; j < ne; j++) {
        int found = 0;
        for (size_t i = 0; i < n; i++)
            found |= got[i].worker_id == e[j].worker_id && got[i].dp_rank == 0;
        if (!found && e[j].blocks > 0)
            *under = 1;
    }
}

static void print_mismatch(const struct kvr_opstream_op *op, const struct kvr_opstream_query *q,
                           const struct kvr_match *got, size_t n,
                           const struct kvr_opstream_expect *e, int rc)
{
    printf("mismatch at line %u (query of %u blocks): got {", op->line, q->n);
    for (size_t i = 0; i < n; i++) {
        if (got[i].dp_rank == 0)
            printf("%s\"%llu\": %u", i ? ", " : "", (unsigned long long)got[i].worker_id,
                   got[i].blocks);
        else
            printf("%s\"%llu/dp%u\": %u", i ? ", " : "", (unsigned long long)got[i].worker_id,
                   got[i].dp_rank, got[i].blocks);
    }
    printf("}%s%s, expected {", rc != KVR_OK ? " error " : "",
           rc != KVR_OK ? kvr_strerror(rc) : "");
    for (size_t i = 0; i < q->n_expect; i++)
        printf("%s\"%llu\": %u", i ? ", " : "", (unsigned long long)e[i].worker_id, e[i].blocks);
    printf("}\n");
}

/* ==== Single-thread replay =================================================================== */

static void count_event_result(struct run *r, int rc)
{
    if (rc == KVR_OK)
        return;
    r->event_errors++;
    if (rc == KVR_EPARENT)
        r->err_parent++;
    else if (rc == KVR_ENOBLOCK)
        r->err_block++;
    else if (rc == KVR_EINVALSEQ)
        r->err_invalid_seq++;
}

/* Dumps *idx, replays the dump into a fresh index and swaps it in. */
static int dump_and_replace(const struct options *o, kvr_index_t **idx, struct run *r)
{
    struct kvr_index_config cfg = {.kind = o->kind};
    struct kvr_event_list dump;
    kvr_index_t *fresh = NULL;
    double t0 = now_s();
    kvr_event_list_init(&dump);
    int rc = kvr_index_dump(*idx, &dump);
    if (rc == KVR_OK)
        rc = kvr_index_new(&cfg, &fresh);
    if (rc == KVR_OK) {
        for (size_t i = 0; i < dump.n; i++) {
            if (kvr_index_apply(fresh, &dump.ev[i]) != KVR_OK)
                r->dump_replay_errors++;
        }
        kvr_index_free(*idx);
        *idx = fresh;
        r->dumps++;
        r->dump_events += dump.n;
    }
    kvr_event_list_free(&dump);
    r->dump_seconds += now_s() - t0;
    return rc;
}

/* Replays the stream once into a fresh index; fills r (r->find_us owned by the caller). */
static int replay(const struct options *o, const struct kvr_opstream *s, struct run *r, int verbose)
{
    struct kvr_index_config cfg = {.kind = o->kind};
    struct scratch sc = {NULL, 0};
    kvr_index_t *idx = NULL;
    int rc = KVR_OK;

    memset(r, 0, sizeof(*r));
    r->find_us = malloc((s->n_queries ? s->n_queries : 1) * sizeof(double));
    sc.cap = 64;
    sc.out = malloc(sc.cap * sizeof(*sc.out));
    if (r->find_us == NULL || sc.out == NULL) {
        rc = KVR_ENOMEM;
        goto out;
    }
    if ((rc = kvr_index_new(&cfg, &idx)) != KVR_OK)
        goto out;

    double start = now_s(), paused = 0, cpu_start = thread_cpu_s(), cpu_paused = 0;
    for (size_t i = 0; i < s->n_ops; i++) {
        const struct kvr_opstream_op *op = &s->ops[i];
        if (op->kind == KVR_OPSTREAM_EVENT) {
            count_event_result(r, kvr_index_apply(idx, &s->events.ev[op->index]));
        } else {
            const struct kvr_opstream_query *q = &s->queries[op->index];
            const struct kvr_opstream_expect *e = kvr_opstream_query_expects(s, q);
            size_t n_out = 0;
            double t0 = now_s();
            int qrc = find(idx, kvr_opstream_query_hashes(s, q), q->n, &sc, &n_out);
            r->find_us[r->n_find++] = (now_s() - t0) * 1e6;
            if (qrc != KVR_OK) {
                r->query_errors++;
                n_out = 0;
            }
            if (qrc != KVR_OK || !same(sc.out, n_out, e, q->n_expect)) {
                int over, under;
                classify(sc.out, n_out, e, q->n_expect, &over, &under);
                r->overcount_queries += (uint64_t)over;
                r->undercount_queries += (uint64_t)under;
                if (verbose && r->mismatches < MAX_SHOWN && o->kind != KVR_INDEX_CKF)
                    print_mismatch(op, q, sc.out, n_out, e, qrc);
                r->mismatches++;
            }
        }
        if (o->dump_every != 0 && (i + 1) % o->dump_every == 0 && i + 1 < s->n_ops) {
            double t0 = now_s(), c0 = thread_cpu_s();
            if ((rc = dump_and_replace(o, &idx, r)) != KVR_OK)
                goto out;
            paused += now_s() - t0;
            cpu_paused += thread_cpu_s() - c0;
        }
    }
    r->seconds = now_s() - start - paused;
    r->cpu_seconds = thread_cpu_s() - cpu_start - cpu_paused;

    struct kvr_index_stats st;
    kvr_index_stats(idx, &st);
    if (o->kind == KVR_INDEX_CKF) {
        r->index_bytes = st.ckf.filter_bytes;
        r->live_block_ranks = (size_t)st.ckf.blocks;
        r->exact_bytes = st.ckf.exact_bytes;
    } else {
        r->index_bytes = st.radix.bytes;
        r->live_block_ranks = st.radix.block_ranks;
    }
out:
    kvr_index_free(idx);
    free(sc.out);
    return rc;
}

/* ==== Concurrent phase ======================================================================= */

struct shared {
    const struct kvr_opstream *s;
    kvr_index_t *idx;
    atomic_int go;          /* readers spin until the writer starts */
    atomic_int writer_done; /* readers stop once the writer has applied every event */
    uint64_t deadline_ns;   /* baseline: stop at this time instead (0 = writer_done) */
};

struct reader {
    struct shared *sh;
    unsigned id;
    uint64_t queries, blocks, errors;
    struct hist lat;
    pthread_t thread;
};

/* The blocks a query matched: its deepest score. */
static uint32_t deepest(const struct kvr_match *m, size_t n)
{
    uint32_t best = 0;
    for (size_t i = 0; i < n; i++)
        if (m[i].blocks > best)
            best = m[i].blocks;
    return best;
}

static void *reader_main(void *arg)
{
    struct reader *rd = arg;
    const struct kvr_opstream *s = rd->sh->s;
    struct scratch sc = {malloc(64 * sizeof(struct kvr_match)), 64};
    size_t q = s->n_queries ? (rd->id * 7919u) % s->n_queries : 0;
    while (!atomic_load_explicit(&rd->sh->go, memory_order_acquire))
        sched_yield();
    while (sc.out != NULL && s->n_queries > 0 &&
           !atomic_load_explicit(&rd->sh->writer_done, memory_order_acquire)) {
        const struct kvr_opstream_query *qq = &s->queries[q];
        size_t n_out;
        uint64_t t0 = now_ns();
        int rc = find(rd->sh->idx, kvr_opstream_query_hashes(s, qq), qq->n, &sc, &n_out);
        uint64_t t1 = now_ns();
        hist_add(&rd->lat, t1 - t0);
        if (rc != KVR_OK)
            rd->errors++;
        else
            rd->blocks += deepest(sc.out, n_out);
        rd->queries++;
        if (++q == s->n_queries)
            q = 0;
        if (rd->sh->deadline_ns != 0 && t1 >= rd->sh->deadline_ns)
            break;
    }
    if (sc.out == NULL)
        rd->errors++;
    free(sc.out);
    return NULL;
}

/* Applies every event of the stream into idx with kvr_index_apply_batch; returns the seconds. */
static double write_all(kvr_index_t *idx, const struct kvr_opstream *s, uint64_t *errors)
{
    double t0 = now_s();
    *errors += kvr_index_apply_batch(idx, s->events.ev, s->events.n, NULL);
    return now_s() - t0;
}

static int run_concurrent(const struct options *o, const struct kvr_opstream *s,
                          struct concurrent *c)
{
    struct kvr_index_config cfg = {.kind = o->kind};
    struct shared sh;
    struct reader *rd = calloc(o->readers + 1u, sizeof(*rd));
    unsigned started = 0;
    int rc = KVR_OK;
    uint64_t alone_errors = 0;

    memset(c, 0, sizeof(*c));
    memset(&sh, 0, sizeof(sh));
    sh.s = s;
    atomic_init(&sh.go, 1);
    atomic_init(&sh.writer_done, 0);
    if (rd == NULL)
        return KVR_ENOMEM;
    /* (1) the writer alone, then (2) the single-thread query baseline on its final index. */
    if ((rc = kvr_index_new(&cfg, &sh.idx)) != KVR_OK) {
        free(rd);
        return rc;
    }
    c->alone_seconds = write_all(sh.idx, s, &alone_errors);
    double span = c->alone_seconds > 0.25 ? c->alone_seconds : 0.25;
    struct reader *base = &rd[o->readers];
    base->sh = &sh;
    base->id = 0;
    double b0 = now_s();
    sh.deadline_ns = now_ns() + (uint64_t)(span * 1e9);
    (void)reader_main(base);
    c->base_seconds = now_s() - b0;
    c->base_queries = base->queries;
    c->base_blocks = base->blocks;
    c->base_lat = base->lat;
    c->reader_errors += base->errors;
    kvr_index_free(sh.idx);
    sh.idx = NULL;
    sh.deadline_ns = 0;
    atomic_store(&sh.go, 0);

    /* (3) writer and readers together, on a fresh index. */
    if ((rc = kvr_index_new(&cfg, &sh.idx)) != KVR_OK) {
        free(rd);
        return rc;
    }
    for (unsigned i = 0; i < o->readers; i++) {
        rd[i].sh = &sh;
        rd[i].id = i;
        if (pthread_create(&rd[i].thread, NULL, reader_main, &rd[i]) != 0)
            break;
        started++;
    }
    if (started < o->readers) {
        /* cannot run as asked: let the started readers out at once */
        atomic_store_explicit(&sh.writer_done, 1, memory_order_release);
        atomic_store_explicit(&sh.go, 1, memory_order_release);
        rc = KVR_ENOMEM;
    }
    if (rc == KVR_OK) {
        /* this thread is the writer */
        atomic_store_explicit(&sh.go, 1, memory_order_release);
        c->seconds = write_all(sh.idx, s, &c->event_errors);
        atomic_store_explicit(&sh.writer_done, 1, memory_order_release);
        struct kvr_index_stats st;
        kvr_index_stats(sh.idx, &st);
        c->write_holds = st.counters.write_holds;
        c->max_hold_work = st.counters.max_hold_work;
    }
    for (unsigned i = 0; i < started; i++) {
        pthread_join(rd[i].thread, NULL);
        c->reader_queries += rd[i].queries;
        c->reader_blocks += rd[i].blocks;
        c->reader_errors += rd[i].errors;
        hist_merge(&c->reader_lat, &rd[i].lat);
    }
    kvr_index_free(sh.idx);
    free(rd);
    return rc;
}

/* ==== Reporting ============================================================================== */

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Nearest-rank percentile of sorted v[0..n). */
static double percentile(const double *v, size_t n, double p)
{
    if (n == 0)
        return 0;
    size_t k = (size_t)(p * (double)n + 0.999999);
    if (k == 0)
        k = 1;
    if (k > n)
        k = n;
    return v[k - 1];
}

static long peak_rss_kb(void)
{
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) == -1)
        return -1;
    return ru.ru_maxrss; /* kilobytes on Linux */
}

static int cmp_run_seconds(const void *a, const void *b)
{
    const struct run *x = a, *y = b;
    return x->seconds < y->seconds ? -1 : x->seconds > y->seconds;
}

static void usage(FILE *f)
{
    fprintf(f, "usage: kvr-bench index OPS_FILE [--index radix|ckf] [--readers N] [--repeat R] "
               "[--dump-every N]\n"
               "       kvr-bench stats OPS_FILE\n");
}

/* Parses a positive integer option value; returns 0 on error. */
static int parse_count(const char *s, uint64_t max, uint64_t *out)
{
    char *end;
    if (s == NULL || *s < '0' || *s > '9')
        return 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (*end != '\0' || v > max)
        return 0;
    *out = v;
    return 1;
}

static int parse_args(int argc, char **argv, struct options *o)
{
    memset(o, 0, sizeof(*o));
    o->kind = KVR_INDEX_RADIX;
    o->repeat = 1;
    if (argc < 3)
        return 0;
    o->file = argv[2];
    for (int i = 3; i < argc; i += 2) { /* every option takes a value */
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        uint64_t x;
        if (strcmp(a, "--index") == 0 && v != NULL) {
            if (strcmp(v, "radix") == 0)
                o->kind = KVR_INDEX_RADIX;
            else if (strcmp(v, "ckf") == 0)
                o->kind = KVR_INDEX_CKF;
            else
                return 0;
        } else if (strcmp(a, "--readers") == 0 && parse_count(v, 1024, &x)) {
            o->readers = (unsigned)x;
        } else if (strcmp(a, "--repeat") == 0 && parse_count(v, 1000, &x) && x > 0) {
            o->repeat = (unsigned)x;
        } else if (strcmp(a, "--dump-every") == 0 && parse_count(v, UINT64_MAX, &x)) {
            o->dump_every = x;
        } else {
            return 0;
        }
    }
    return 1;
}

/* Prints the stream's totals like `kvtrace.py stats` (sorted keys, Python's separators). */
static void print_stats(const struct kvr_opstream *s)
{
    const char *sep = "";
    printf("{");
    if (s->n_queries > 0) {
        printf("\"expected_hits\": %llu, \"match\": %zu, \"match_blocks\": %llu",
               (unsigned long long)s->expected_hits, s->n_queries,
               (unsigned long long)s->match_blocks);
        sep = ", ";
    }
    if (s->removed > 0) {
        printf("%s\"removed\": %llu, \"removed_blocks\": %llu", sep, (unsigned long long)s->removed,
               (unsigned long long)s->removed_blocks);
        sep = ", ";
    }
    if (s->stored > 0)
        printf("%s\"stored\": %llu, \"stored_blocks\": %llu", sep, (unsigned long long)s->stored,
               (unsigned long long)s->stored_blocks);
    printf("}\n");
}

int main(int argc, char **argv)
{
    struct options o;
    struct kvr_opstream s;
    struct run *runs = NULL;
    struct concurrent conc;
    char err[512];
    int status = EXIT_RUNTIME;

    memset(&o, 0, sizeof(o));
    memset(&conc, 0, sizeof(conc));

    if (argc >= 2 && (strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0)) {
        usage(stdout);
        return 0;
    }
    int is_stats = argc == 3 && strcmp(argv[1], "stats") == 0;
    if (!is_stats && (argc < 3 || strcmp(argv[1], "index") != 0 || !parse_args(argc, argv, &o))) {
        usage(stderr);
        return EXIT_USAGE;
    }
    if (!is_stats && o.kind == KVR_INDEX_CKF && o.dump_every != 0) {
        fprintf(stderr, "kvr-bench: --dump-every needs the radix index (a CKF has no dump)\n");
        return EXIT_USAGE;
    }

    kvr_opstream_init(&s);
    double t0 = now_s();
    int rc = kvr_opstream_load(is_stats ? argv[2] : o.file, &s, err, sizeof(err));
    double load_s = now_s() - t0;
    if (rc != KVR_OK) {
        fprintf(stderr, "kvr-bench: %s (%s)\n", err, kvr_strerror(rc));
        goto out;
    }
    if (is_stats) {
        print_stats(&s);
        status = 0;
        goto out;
    }
    uint64_t block_ops = s.match_blocks + s.stored_blocks + s.removed_blocks;
    printf("loaded %s in %.2f s: %zu lines (%zu match, %zu event: %llu stored, %llu removed, "
           "%llu cleared), %llu block ops\n",
           o.file, load_s, s.n_ops, s.n_queries, s.events.n, (unsigned long long)s.stored,
           (unsigned long long)s.removed, (unsigned long long)s.cleared,
           (unsigned long long)block_ops);

    runs = calloc(o.repeat, sizeof(*runs));
    if (runs == NULL)
        goto out;
    uint64_t mismatches = 0, fatal = 0, dump_errors = 0, undercounts = 0;
    for (unsigned i = 0; i < o.repeat; i++) {
        rc = replay(&o, &s, &runs[i], i == 0);
        if (rc != KVR_OK) {
            fprintf(stderr, "kvr-bench: replay %u failed: %s\n", i + 1, kvr_strerror(rc));
            goto out;
        }
        mismatches += runs[i].mismatches;
        undercounts += runs[i].undercount_queries;
        fatal += runs[i].err_parent + runs[i].err_block + runs[i].err_invalid_seq;
        dump_errors += runs[i].dump_replay_errors;
        printf("run %u: %.3f s, %llu mismatches, %llu event errors\n", i + 1, runs[i].seconds,
               (unsigned long long)runs[i].mismatches, (unsigned long long)runs[i].event_errors);
    }
    qsort(runs, o.repeat, sizeof(*runs), cmp_run_seconds);
    struct run *m = &runs[o.repeat / 2]; /* the median run (upper median for even R) */
    qsort(m->find_us, m->n_find, sizeof(double), cmp_double);
    double p50 = percentile(m->find_us, m->n_find, 0.50);
    double p99 = percentile(m->find_us, m->n_find, 0.99);
    double secs = m->seconds > 0 ? m->seconds : 1e-9;
    double bpbr = m->live_block_ranks ? (double)m->index_bytes / (double)m->live_block_ranks : 0;

    if (o.readers > 0) {
        rc = run_concurrent(&o, &s, &conc);
        if (rc != KVR_OK) {
            fprintf(stderr, "kvr-bench: concurrent phase failed: %s\n", kvr_strerror(rc));
            goto out;
        }
    }
    long rss = peak_rss_kb();

    double csecs = m->cpu_seconds > 0 ? m->cpu_seconds : 1e-9;
    printf("replay (median of %u): %.3f s, %.0f ops/s, %.0f block ops/s (thread CPU %.3f s: %.0f "
           "block ops per CPU second)\n",
           o.repeat, secs, (double)s.n_ops / secs, (double)block_ops / secs, m->cpu_seconds,
           (double)block_ops / csecs);
    printf("find_matches: p50 %.2f us, p99 %.2f us over %zu queries\n", p50, p99, m->n_find);
    printf("index: %zu bytes for %zu live block-ranks (%.1f bytes each)\n", m->index_bytes,
           m->live_block_ranks, bpbr);
    printf("event errors: %llu (ParentBlockNotFound %llu, BlockNotFound %llu, "
           "InvalidBlockSequence %llu); query errors %llu\n",
           (unsigned long long)m->event_errors, (unsigned long long)m->err_parent,
           (unsigned long long)m->err_block, (unsigned long long)m->err_invalid_seq,
           (unsigned long long)m->query_errors);
    if (o.dump_every)
        printf("dumps: %llu, %llu events replayed in %.3f s, %llu replay errors\n",
               (unsigned long long)m->dumps, (unsigned long long)m->dump_events, m->dump_seconds,
               (unsigned long long)m->dump_replay_errors);
    double cs = conc.seconds > 0 ? conc.seconds : 1e-9;
    double bs = conc.base_seconds > 0 ? conc.base_seconds : 1e-9;
    double slowdown = conc.alone_seconds > 0 ? conc.seconds / conc.alone_seconds : 0;
    if (o.readers > 0) {
        printf("concurrent: 1 writer (kvr_index_apply_batch) + %u readers: writer %.3f s, alone "
               "%.3f s (%.2fx); %llu write holds, longest %llu work units\n",
               o.readers, conc.seconds, conc.alone_seconds, slowdown,
               (unsigned long long)conc.write_holds, (unsigned long long)conc.max_hold_work);
        printf("  readers during writes: %.0f queries/s, %.0f matched blocks/s, find_matches p50 "
               "%.2f us, p99 %.2f us, max %.1f us (%llu queries, %llu errors)\n",
               (double)conc.reader_queries / cs, (double)conc.reader_blocks / cs,
               hist_pct_us(&conc.reader_lat, 0.50), hist_pct_us(&conc.reader_lat, 0.99),
               (double)conc.reader_lat.max_ns / 1000.0, (unsigned long long)conc.reader_queries,
               (unsigned long long)conc.reader_errors);
        printf("  single thread, no writer (final index): %.0f queries/s, %.0f matched blocks/s, "
               "p50 %.2f us, p99 %.2f us\n",
               (double)conc.base_queries / bs, (double)conc.base_blocks / bs,
               hist_pct_us(&conc.base_lat, 0.50), hist_pct_us(&conc.base_lat, 0.99));
    }
    printf("peak RSS %ld kB\n", rss);
    /* A CKF may overcount (false positives): its mismatches are reported, not a failure. */
    if (o.kind == KVR_INDEX_CKF)
        printf("ckf: %llu queries overcount (%.4f%%), %llu undercount; %.3f filter bytes per "
               "block, %zu exact-side bytes\n",
               (unsigned long long)m->overcount_queries,
               m->n_find ? 100.0 * (double)m->overcount_queries / (double)m->n_find : 0.0,
               (unsigned long long)m->undercount_queries, bpbr, m->exact_bytes);

    printf("{\"mismatches\":%llu,\"ops\":%zu,\"block_ops\":%llu,\"ops_per_s\":%.1f,"
           "\"block_ops_per_s\":%.1f,\"find_p50_us\":%.3f,\"find_p99_us\":%.3f,"
           "\"live_block_ranks\":%zu,\"index_bytes\":%zu,\"bytes_per_block_rank\":%.2f,"
           "\"peak_rss_kb\":%ld,\"event_errors\":%llu,\"seconds\":%.6f,\"runs\":%u,"
           "\"match_lines\":%zu,\"event_lines\":%zu,\"load_seconds\":%.3f,"
           "\"parent_not_found\":%llu,\"block_not_found\":%llu,\"invalid_block_sequence\":%llu,"
           "\"query_errors\":%llu,\"dump_every\":%llu,\"dumps\":%llu,"
           "\"dump_replay_errors\":%llu,\"readers\":%u,\"cpu_seconds\":%.6f,"
           "\"block_ops_per_cpu_s\":%.1f",
           (unsigned long long)mismatches, s.n_ops, (unsigned long long)block_ops,
           (double)s.n_ops / secs, (double)block_ops / secs, p50, p99, m->live_block_ranks,
           m->index_bytes, bpbr, rss, (unsigned long long)m->event_errors, m->seconds, o.repeat,
           s.n_queries, s.events.n, load_s, (unsigned long long)m->err_parent,
           (unsigned long long)m->err_block, (unsigned long long)m->err_invalid_seq,
           (unsigned long long)m->query_errors, (unsigned long long)o.dump_every,
           (unsigned long long)m->dumps, (unsigned long long)dump_errors, o.readers, m->cpu_seconds,
           (double)block_ops / csecs);
    if (o.kind == KVR_INDEX_CKF)
        printf(",\"index\":\"ckf\",\"queries\":%llu,\"overcount_queries\":%llu,"
               "\"undercount_queries\":%llu,\"overcount_share\":%.6f,\"bytes_per_block\":%.3f,"
               "\"exact_bytes\":%zu",
               (unsigned long long)m->n_find, (unsigned long long)m->overcount_queries,
               (unsigned long long)m->undercount_queries,
               m->n_find ? (double)m->overcount_queries / (double)m->n_find : 0.0, bpbr,
               m->exact_bytes);
    if (o.readers > 0)
        printf(",\"reader_queries_per_s\":%.1f,\"reader_block_ops_per_s\":%.1f,"
               "\"reader_find_p50_us\":%.3f,\"reader_find_p99_us\":%.3f,"
               "\"reader_find_max_us\":%.1f,\"baseline_queries_per_s\":%.1f,"
               "\"baseline_block_ops_per_s\":%.1f,\"baseline_find_p50_us\":%.3f,"
               "\"baseline_find_p99_us\":%.3f,\"writer_block_ops_per_s\":%.1f,"
               "\"writer_seconds\":%.6f,\"writer_alone_seconds\":%.6f,\"writer_slowdown\":%.3f,"
               "\"write_holds\":%llu,\"max_hold_work\":%llu,\"reader_errors\":%llu",
               (double)conc.reader_queries / cs, (double)conc.reader_blocks / cs,
               hist_pct_us(&conc.reader_lat, 0.50), hist_pct_us(&conc.reader_lat, 0.99),
               (double)conc.reader_lat.max_ns / 1000.0, (double)conc.base_queries / bs,
               (double)conc.base_blocks / bs, hist_pct_us(&conc.base_lat, 0.50),
               hist_pct_us(&conc.base_lat, 0.99), (double)(s.stored_blocks + s.removed_blocks) / cs,
               conc.seconds, conc.alone_seconds, slowdown, (unsigned long long)conc.write_holds,
               (unsigned long long)conc.max_hold_work, (unsigned long long)conc.reader_errors);
    printf("}\n");
    status = ((o.kind != KVR_INDEX_CKF && mismatches) || fatal || dump_errors) ? EXIT_VERIFY : 0;
    (void)undercounts;

out:
    if (runs != NULL) {
        for (unsigned i = 0; i < o.repeat; i++)
            free(runs[i].find_us);
        free(runs);
    }
    kvr_opstream_free(&s);
    return status;
}
