/* cli.c - `kvrouter sim` / `kvr-sim`: the command line of the policy lab (kvr_sim_main).
 * SPDX-License-Identifier: Apache-2.0
 *
 * Parses the options into a kvr_sim_config, loads the trace (or op stream) once, runs every
 * policy in command-line order from a clean state, prints a summary table, and writes the JSON,
 * HTML and SVG outputs. Policy problems are reported in the outputs and the table; only usage
 * errors, unreadable inputs and failed writes change the exit status (unless --strict). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "events.h"
#include "kvr/err.h"
#include "kvr/sim.h"

#define MAX_POLICIES 32

static const char usage[] =
    "usage: %s (--trace FILE | --events FILE) --policy P [--policy P ...] [options]\n"
    "\n"
    "Replays a Mooncake-format request trace (JSONL, optionally gzip) through routing policies\n"
    "against simulated workers, with the router's own KV index, load tracker and Lua runtime.\n"
    "P is a shipped policy (bounded_affinity, kv_cost, cache_aware, ...), 'builtin' (the C\n"
    "classic KV cost), a Lua file, or NAME=FILE.\n"
    "\n"
    "  --trace FILE            Mooncake JSONL trace (.gz or plain)\n"
    "  --events FILE           op stream (spec/opstream.md) of recorded KV events and queries\n"
    "  --policy P              a policy to evaluate (repeatable; each runs from a clean state)\n"
    "  --workers N             simulated workers (8; --events: the stream's workers)\n"
    "  --worker-base ID        first worker id (0)\n"
    "  --cache-blocks C        LRU prefix cache per worker, in blocks (4096)\n"
    "  --block-size B          tokens per KV block; each 512-token trace id becomes 512/B\n"
    "                          blocks (512; --events: 16)\n"
    "  --trace-block-tokens T  tokens per trace hash id (512)\n"
    "  --seed S                seeds the policies' RNG, the fallback and the simulator (1)\n"
    "  --time-scale X          arrival times x X (1; < 1 compresses the trace: more load)\n"
    "  --limit N               replay only the first N requests of a trace (all)\n"
    "  --slots N               concurrency limit per worker (16)\n"
    "  --prefill-lanes N       prefills at once per worker (1; 0 = only the slot limit)\n"
    "  --prefill-us-per-token  prefill time per uncached input token in microseconds (100)\n"
    "  --prefill-overhead-ms   fixed prefill time per request (10)\n"
    "  --decode-ms-per-token   time per output token after the first (30)\n"
    "  --jitter F              service times x U[1-F, 1+F] (0)\n"
    "  --inflight N            --events: a query stays in flight for N later queries (32)\n"
    "  --buckets N             time-series buckets in the plots (60)\n"
    "  --budget-ms MS          Lua time budget per decision (10)\n"
    "  --sandbox               run shipped policies sandboxed too (default: trusted, JIT)\n"
    "  --json FILE             write every figure as JSON\n"
    "  --html FILE             write the self-contained HTML report (inline SVG)\n"
    "  --svg-dir DIR           write each chart as a standalone SVG file into DIR\n"
    "  --timing                add wall-clock figures (decisions/s) to the JSON under \"timing\"\n"
    "  --strict                exit 1 if any policy failed to install or fell back\n"
    "  --quiet                 no summary table\n"
    "  --verbose               print the policy runtime's log (errors with tracebacks)\n"
    "\n"
    "Output: {\"policies\": {\"<name>\": {\"hit_ratio\", \"best_hit_ratio\", \"imbalance\",\n"
    "\"ttft_p50_ms\", \"ttft_p99_ms\", \"requests\", ...}}}. docs/SIM.md describes the model.\n";

struct opts {
    struct kvr_sim_config cfg;
    const char *trace, *events, *json, *html, *svg_dir;
    const char *policies[MAX_POLICIES];
    size_t n_policies;
    int timing, strict, quiet, verbose, workers_set, block_set;
};

static int parse_u64(const char *s, uint64_t *out)
{
    if (s == NULL || *s == '\0' || *s == '-')
        return 0;
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno != 0 || *end != '\0')
        return 0;
    *out = v;
    return 1;
}

static int parse_u32(const char *s, uint32_t *out)
{
    uint64_t v;
    if (!parse_u64(s, &v) || v > UINT32_MAX)
        return 0;
    *out = (uint32_t)v;
    return 1;
}

static int parse_dbl(const char *s, double *out)
{
    if (s == NULL || *s == '\0')
        return 0;
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno != 0 || *end != '\0' || !(v >= 0) || v > 1e12)
        return 0;
    *out = v;
    return 1;
}

static void log_stderr(void *ctx, int level, const char *msg)
{
    (void)ctx;
    static const char *const names[] = {"error", "warn", "info", "debug"};
    fprintf(stderr, "policy runtime [%s]: %s\n", level >= 0 && level <= 3 ? names[level] : "?",
            msg);
}

/* Returns 0 to run, 1 for --help, -1 on a usage error (message printed). */
static int parse(int argc, char **argv, struct opts *o)
{
    memset(o, 0, sizeof(*o));
    kvr_sim_config_init(&o->cfg);
    struct kvr_sim_config *c = &o->cfg;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        double d = 0;
        int ok = 1, takes = 1;
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0)
            return 1;
        else if (strcmp(a, "--trace") == 0)
            o->trace = v, ok = v != NULL;
        else if (strcmp(a, "--events") == 0)
            o->events = v, ok = v != NULL;
        else if (strcmp(a, "--policy") == 0) {
            ok = v != NULL && o->n_policies < MAX_POLICIES;
            if (ok)
                o->policies[o->n_policies++] = v;
        } else if (strcmp(a, "--workers") == 0)
            ok = parse_u32(v, &c->workers), o->workers_set = 1;
        else if (strcmp(a, "--worker-base") == 0)
            ok = parse_u64(v, &c->worker_base);
        else if (strcmp(a, "--cache-blocks") == 0)
            ok = parse_u64(v, &c->cache_blocks);
        else if (strcmp(a, "--block-size") == 0)
            ok = parse_u32(v, &c->block_size), o->block_set = 1;
        else if (strcmp(a, "--trace-block-tokens") == 0)
            ok = parse_u32(v, &c->trace_block_tokens);
        else if (strcmp(a, "--seed") == 0)
            ok = parse_u64(v, &c->seed);
        else if (strcmp(a, "--time-scale") == 0)
            ok = parse_dbl(v, &c->time_scale);
        else if (strcmp(a, "--limit") == 0)
            ok = parse_u64(v, &c->limit);
        else if (strcmp(a, "--slots") == 0)
            ok = parse_u32(v, &c->slots);
        else if (strcmp(a, "--prefill-lanes") == 0)
            ok = parse_u32(v, &c->prefill_lanes);
        else if (strcmp(a, "--prefill-us-per-token") == 0)
            ok = parse_dbl(v, &c->prefill_us_per_token);
        else if (strcmp(a, "--prefill-overhead-ms") == 0)
            ok = parse_dbl(v, &d), c->prefill_overhead_us = d * 1000;
        else if (strcmp(a, "--decode-ms-per-token") == 0)
            ok = parse_dbl(v, &d), c->decode_us_per_token = d * 1000;
        else if (strcmp(a, "--jitter") == 0)
            ok = parse_dbl(v, &c->jitter);
        else if (strcmp(a, "--inflight") == 0)
            ok = parse_u32(v, &c->inflight);
        else if (strcmp(a, "--buckets") == 0)
            ok = parse_u32(v, &c->buckets) && c->buckets > 0 && c->buckets <= 10000;
        else if (strcmp(a, "--budget-ms") == 0)
            ok = parse_dbl(v, &d) && d > 0, c->budget_ns = (uint64_t)(d * 1e6);
        else if (strcmp(a, "--json") == 0)
            o->json = v, ok = v != NULL;
        else if (strcmp(a, "--html") == 0)
            o->html = v, ok = v != NULL;
        else if (strcmp(a, "--svg-dir") == 0)
            o->svg_dir = v, ok = v != NULL;
        else {
            takes = 0;
            if (strcmp(a, "--sandbox") == 0)
                c->sandbox_shipped = 1;
            else if (strcmp(a, "--timing") == 0)
                o->timing = 1;
            else if (strcmp(a, "--strict") == 0)
                o->strict = 1;
            else if (strcmp(a, "--quiet") == 0)
                o->quiet = 1;
            else if (strcmp(a, "--verbose") == 0)
                o->verbose = 1;
            else {
                fprintf(stderr, "%s: unknown option %s (see --help)\n", argv[0], a);
                return -1;
            }
        }
        if (!ok) {
            fprintf(stderr, "%s: %s: %s\n", argv[0], a,
                    v == NULL                    ? "missing value"
                    : strcmp(a, "--policy") == 0 ? "too many policies"
                                                 : "invalid value");
            return -1;
        }
        i += takes;
    }
    if ((o->trace == NULL) == (o->events == NULL)) {
        fprintf(stderr, "%s: give exactly one of --trace FILE or --events FILE (see --help)\n",
                argv[0]);
        return -1;
    }
    if (o->n_policies == 0) {
        fprintf(stderr, "%s: give at least one --policy (see --help)\n", argv[0]);
        return -1;
    }
    if (o->events != NULL && !o->block_set)
        c->block_size = 16; /* the op streams' block size (tools/kvtrace.py default) */
    if (o->verbose)
        c->log = log_stderr;
    return 0;
}

/* Makes result names unique: a repeated name gets "-2", "-3", ... */
static void unique_names(struct kvr_sim_policy *p, size_t n)
{
    for (size_t i = 1; i < n; i++) {
        int k = 1;
        for (size_t j = 0; j < i; j++)
            if (strcmp(p[i].name, p[j].name) == 0) {
                char base[KVR_SIM_NAME_MAX + 1];
                memcpy(base, p[i].name, sizeof(base));
                k = k < 99999 ? k + 1 : 99999;
                /* "-" and at most 5 digits after at most 52 bytes of the name: fits */
                int w = snprintf(p[i].name, sizeof(p[i].name), "%.52s-%d", base, k);
                (void)w;
                j = (size_t)-1; /* rescan: the new name may clash too */
            }
    }
}

static void table(const struct kvr_sim_report *rep)
{
    int trace = rep->mode == KVR_SIM_MODE_TRACE;
    printf("%-20s %7s %7s %6s %6s %10s %10s %8s %7s %10s\n", "policy", "hit", "best", "%best",
           "imbal", trace ? "ttft_p50" : "oracle", trace ? "ttft_p99" : "mismatch", "req/s",
           "fails", "decisions/s");
    for (size_t i = 0; i < rep->n; i++) {
        const struct kvr_sim_result *r = &rep->res[i];
        if (!r->ok) {
            printf("%-20s FAILED: %.*s\n", r->name, (int)strcspn(r->error, "\n"), r->error);
            continue;
        }
        double a =
            trace ? r->ttft_ms.p50 : (r->blocks ? (double)r->oracle_blocks / (double)r->blocks : 0);
        double b = trace ? r->ttft_ms.p99 : (double)r->expect_mismatches;
        printf("%-20s %7.4f %7.4f %5.1f%% %6.3f ", r->name, r->hit_ratio, r->best_hit_ratio,
               r->best_hit_ratio > 0 ? 100 * r->hit_ratio / r->best_hit_ratio : 0, r->imbalance);
        if (trace)
            printf("%10.1f %10.1f %8.3f", a, b, r->throughput_rps);
        else
            printf("%10.4f %10.0f %8s", a, b, "-");
        printf(" %7llu %10.0f\n", (unsigned long long)r->policy.fallbacks, r->decisions_per_s);
        if (r->policy.first_error[0])
            printf("%-20s   first policy failure: %.*s\n", "",
                   (int)strcspn(r->policy.first_error, "\n"), r->policy.first_error);
    }
    fflush(stdout);
}

static int write_file(const char *path, int html, const struct kvr_sim_report *rep)
{
    FILE *f = fopen(path, "w");
    if (f == NULL) {
        fprintf(stderr, "kvr-sim: %s: %s\n", path, strerror(errno));
        return KVR_EIO;
    }
    int rc = html ? kvr_sim_write_html(f, rep) : kvr_sim_write_json(f, rep);
    if (fclose(f) == EOF)
        rc = KVR_EIO;
    if (rc != KVR_OK)
        fprintf(stderr, "kvr-sim: %s: write failed\n", path);
    return rc;
}

int kvr_sim_main(int argc, char **argv)
{
    struct opts o;
    int pr = parse(argc, argv, &o);
    if (pr != 0) {
        if (pr > 0)
            printf(usage, argv[0]);
        return pr > 0 ? 0 : 2;
    }
    struct kvr_sim_policy pol[MAX_POLICIES];
    char *owned[MAX_POLICIES] = {0};
    struct kvr_sim_result *res = calloc(o.n_policies, sizeof(*res));
    struct kvr_sim_trace tr;
    struct kvr_opstream ops;
    kvr_sim_trace_init(&tr);
    kvr_opstream_init(&ops);
    uint64_t *wids = NULL;
    size_t n_wids = 0;
    int status = 2;
    char err[1024] = "";
    if (res == NULL)
        goto out;
    for (size_t i = 0; i < o.n_policies; i++)
        if (kvr_sim_policy_resolve(o.policies[i], &pol[i], &owned[i], err, sizeof(err)) != KVR_OK) {
            fprintf(stderr, "%s: --policy %s\n", argv[0], err);
            goto out;
        }
    unique_names(pol, o.n_policies);
    struct kvr_sim_report rep = {.cfg = &o.cfg, .res = res, .n = o.n_policies, .timing = o.timing};
    if (o.trace != NULL) {
        if (kvr_sim_trace_load(o.trace, &tr, err, sizeof(err)) != KVR_OK) {
            fprintf(stderr, "%s: %s\n", argv[0], err);
            goto out;
        }
        size_t n = o.cfg.limit > 0 && o.cfg.limit < tr.n ? (size_t)o.cfg.limit : tr.n;
        rep.mode = KVR_SIM_MODE_TRACE;
        rep.input = o.trace;
        rep.trace_requests = n;
        rep.trace_duration_s = n ? (double)tr.req[n - 1].arrival_us * o.cfg.time_scale / 1e6 : 0;
        if (kvr_sim_expand(&o.cfg) != 0 &&
            kvr_sim_pooled_hit_ratio(&o.cfg, &tr, &rep.pooled_hit_ratio) == KVR_ENOMEM) {
            fprintf(stderr, "%s: out of memory\n", argv[0]);
            goto out;
        }
    } else {
        if (kvr_opstream_load(o.events, &ops, err, sizeof(err)) != KVR_OK) {
            fprintf(stderr, "%s: %s: %s\n", argv[0], o.events, err);
            goto out;
        }
        if (o.workers_set) {
            n_wids = o.cfg.workers;
            wids = malloc((n_wids ? n_wids : 1) * sizeof(*wids));
            for (size_t k = 0; wids != NULL && k < n_wids; k++)
                wids[k] = o.cfg.worker_base + k;
        } else if (kvr_sim_events_workers(&ops, &wids, &n_wids) != KVR_OK) {
            wids = NULL;
        }
        if (wids == NULL)
            goto out;
        o.cfg.workers = (uint32_t)n_wids;
        rep.mode = KVR_SIM_MODE_EVENTS;
        rep.input = o.events;
        rep.trace_requests = ops.n_queries;
    }
    status = 0;
    for (size_t i = 0; i < o.n_policies; i++) {
        int rc = o.trace != NULL ? kvr_sim_run(&o.cfg, &tr, &pol[i], &res[i])
                                 : kvr_sim_events_run(&o.cfg, &ops, &pol[i], wids, n_wids, &res[i]);
        if (rc == KVR_EINVAL) {
            fprintf(stderr, "%s: %s\n", argv[0], res[i].error);
            status = 2;
            goto out;
        }
        if (rc != KVR_OK) {
            fprintf(stderr, "%s: %s: %s\n", argv[0], pol[i].name, res[i].error);
            status = 1;
        } else if (!res[i].ok) {
            fprintf(stderr, "%s: policy %s not run: %.*s\n", argv[0], pol[i].name,
                    (int)strcspn(res[i].error, "\n"), res[i].error);
            if (o.strict)
                status = 1;
        } else if (o.strict && res[i].policy.fallbacks > 0) {
            status = 1;
        }
    }
    if (!o.quiet) {
        if (rep.mode == KVR_SIM_MODE_TRACE)
            printf("pooled LRU reference (one cache of %u x %llu blocks): hit ratio %.4f\n",
                   o.cfg.workers, (unsigned long long)o.cfg.cache_blocks, rep.pooled_hit_ratio);
        table(&rep);
    }
    if (o.json != NULL && write_file(o.json, 0, &rep) != KVR_OK)
        status = 1;
    if (o.html != NULL && write_file(o.html, 1, &rep) != KVR_OK)
        status = 1;
    if (o.svg_dir != NULL && kvr_sim_write_svgs(o.svg_dir, &rep, err, sizeof(err)) != KVR_OK) {
        fprintf(stderr, "%s: %s\n", argv[0], err);
        status = 1;
    }
out:
    for (size_t i = 0; res != NULL && i < o.n_policies; i++)
        kvr_sim_result_free(&res[i]);
    free(res);
    for (size_t i = 0; i < o.n_policies; i++)
        free(owned[i]);
    free(wids);
    kvr_sim_trace_free(&tr);
    kvr_opstream_free(&ops);
    return status;
}
