/* lua_bench.c - kvr-lua-bench: decision overhead of every shipped Lua policy (sandboxed and
 * trusted) and of the built-in C fallback, for 8, 64 and 256 candidates.
 * SPDX-License-Identifier: Apache-2.0
 *
 *   kvr-lua-bench [--runs R] [--batch B] [--sizes 8,64,256] [--policy NAME|c]
 *                 [--mode sandboxed|trusted] [--markdown]
 *   kvr-lua-bench --build N     time N VM builds (what a reload costs each thread)
 *
 * --build: every shipped policy installed (trusted, as the server does with
 * --allow-policy-header), then N x (kvr_lua_vm_new + kvr_lua_vm_free) on this thread; prints
 * the median wall and CPU time of one build. A VM build is what each thread does between two
 * requests after a reload (a new lua_State from the library and the policies' bytecode).
 *
 * Method: one runtime and one VM per (policy, mode), all built first, on the calling thread; 64
 * pre-generated random requests (candidate loads, overlaps, trees vary; fixed seed) are cycled
 * so branches do not settle on one input. After a warm-up of 5 x B decisions per configuration
 * (the JIT compiles the glue, and trusted policies), R rounds are run; each round times one batch
 * of B decisions of EVERY configuration in turn (interleaved: a burst of load from other
 * processes hits all configurations alike, not one), reading both CLOCK_MONOTONIC (wall) and
 * CLOCK_THREAD_CPUTIME_ID (this thread's CPU time: preemption by other processes does not
 * count). Per configuration the table shows the fastest and the median batch in wall time, and
 * the median in CPU time, in us per decision, and the median CPU time relative to the C
 * fallback's. On a shared machine CPU time is the figure to compare (cache interference still
 * shows); for exact comparisons count instructions instead (BENCHMARKS.md: callgrind).
 * "decision" = kvr_lua_vm_select end to end: policy resolution, filling the Lua request and
 * candidate tables from the C structs, the policy's select, validating the choice, writing the
 * ranked index. "C fallback" = kvr_fallback_select (the classic cost, argmin, cap 1) alone;
 * "C fallback via VM" = kvr_lua_vm_select with no policy bound (resolution + fallback).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kvr/err.h"
#include "kvr/fallback.h"
#include "kvr/lua.h"

#define SETS 64
#define MAX_N 1024
#define MAX_CONFIGS 40

struct input {
    struct kvr_ffi_request req;
    struct kvr_ffi_candidate c[MAX_N];
};

static struct input inputs[SETS];

static uint64_t clock_ns(clockid_t id)
{
    struct timespec ts;
    clock_gettime(id, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void generate(size_t n, unsigned seed)
{
    for (int s = 0; s < SETS; s++) {
        struct input *in = &inputs[s];
        memset(&in->req, 0, sizeof(in->req));
        in->req.model = "bench";
        in->req.model_len = 5;
        in->req.tokens = 512 + (uint32_t)(rand_r(&seed) % 8192);
        in->req.block_size = 16;
        in->req.blocks = in->req.tokens / 16;
        in->req.overlap_weight = -1;
        in->req.temperature = -1;
        in->req.session = (s % 2) ? "session-a" : "session-b";
        in->req.session_len = 9;
        for (size_t i = 0; i < n; i++) {
            struct kvr_ffi_candidate *c = &in->c[i];
            memset(c, 0, sizeof(*c));
            c->worker_id = 1000 + i;
            c->dp_rank = (uint32_t)(i % 2);
            c->healthy = 1;
            c->weight = 1;
            c->kv_usage = (double)(rand_r(&seed) % 100) / 100.0;
            c->overlap = (uint32_t)(rand_r(&seed) % (in->req.blocks + 1));
            c->tree_blocks = (uint32_t)(rand_r(&seed) % 100000);
            c->prefill_tokens = (uint32_t)(rand_r(&seed) % 20000);
            c->decode_blocks = (uint32_t)(rand_r(&seed) % 4000);
            c->new_blocks = in->req.blocks - c->overlap;
            c->requests = (uint32_t)(rand_r(&seed) % 64);
            c->queue = (uint32_t)(rand_r(&seed) % 8);
        }
    }
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* fn returns 1 when a fallback decided. */
typedef int (*decide_fn)(void *ctx, const struct input *in, size_t n);

struct config {
    const char *name, *mode;
    decide_fn fn;
    void *ctx;
    kvr_lua_runtime_t *rt;
    kvr_lua_vm_t *vm;
    int expect_fallback;    /* the C configurations */
    uint64_t *wall, *cpu;   /* per round: ns per batch */
    int fallbacks;          /* decisions the policy did not make (must stay 0) */
    double min, p50, cpu50; /* ns per decision */
};

static int via_vm(void *ctx, const struct input *in, size_t n)
{
    uint32_t ranked[1];
    struct kvr_lua_decision d = {.ranked = ranked, .cap = 1};
    if (kvr_lua_vm_select(ctx, &in->req, in->c, n, &d) != KVR_OK) {
        fprintf(stderr, "select failed\n");
        exit(1);
    }
    return d.fallback;
}

static int direct_c(void *ctx, const struct input *in, size_t n)
{
    uint32_t ranked[1];
    size_t got;
    kvr_fallback_select(ctx, &in->req, in->c, n, NULL, ranked, 1, &got);
    return 0;
}

/* A runtime + VM with the shipped policy `name` (NULL: none) bound as the default. */
static int open_vm(struct config *cf, const char *name, unsigned flags)
{
    struct kvr_lua_config cfg;
    kvr_lua_config_init(&cfg);
    if (kvr_lua_runtime_new(&cfg, &cf->rt) != KVR_OK)
        return -1;
    if (name != NULL) {
        const char *src;
        size_t len;
        char err[4096] = "";
        if (kvr_lua_builtin_source(cf->rt, name, &src, &len) != KVR_OK ||
            kvr_lua_policy_install(cf->rt, name, src, len, flags, NULL, NULL, err, sizeof(err)) !=
                KVR_OK ||
            kvr_lua_policy_bind(cf->rt, NULL, name, NULL) != KVR_OK) {
            fprintf(stderr, "%s: %s\n", name, err);
            return -1;
        }
    }
    if (kvr_lua_vm_new(cf->rt, NULL, &cf->vm) != KVR_OK)
        return -1;
    cf->fn = via_vm;
    cf->ctx = cf->vm;
    return 0;
}

static void close_vm(struct config *cf)
{
    kvr_lua_vm_free(cf->vm);
    kvr_lua_runtime_free(cf->rt);
    cf->vm = NULL;
    cf->rt = NULL;
}

static void row(int md, const struct config *cf, size_t n, double c_cpu)
{
    const char *warn = cf->fallbacks ? " (fallbacks!)" : "";
    double ratio = c_cpu > 0 ? cf->cpu50 / c_cpu : 0;
    if (md)
        printf("| %s | %s | %zu | %.2f | %.2f | %.2f | %.1f× |%s\n", cf->name, cf->mode, n,
               cf->min / 1000.0, cf->p50 / 1000.0, cf->cpu50 / 1000.0, ratio, warn);
    else
        printf("%-18s %-10s %5zu %10.2f %10.2f %10.2f %7.1fx%s\n", cf->name, cf->mode, n,
               cf->min / 1000.0, cf->p50 / 1000.0, cf->cpu50 / 1000.0, ratio, warn);
}

static void summarize(struct config *cf, int runs, int batch)
{
    qsort(cf->wall, (size_t)runs, sizeof(*cf->wall), cmp_u64);
    qsort(cf->cpu, (size_t)runs, sizeof(*cf->cpu), cmp_u64);
    cf->min = (double)cf->wall[0] / batch;
    cf->p50 = (double)cf->wall[runs / 2] / batch;
    cf->cpu50 = (double)cf->cpu[runs / 2] / batch;
}

static int bench_build(int n)
{
    struct kvr_lua_config cfg;
    kvr_lua_config_init(&cfg);
    kvr_lua_runtime_t *rt = NULL;
    if (kvr_lua_runtime_new(&cfg, &rt) != KVR_OK)
        return 1;
    size_t k = 0;
    for (const char *const *name = kvr_lua_builtin_names(); *name; name++, k++) {
        const char *src;
        size_t len;
        char err[4096] = "";
        if (kvr_lua_builtin_source(rt, *name, &src, &len) != KVR_OK ||
            kvr_lua_policy_install(rt, *name, src, len, KVR_LUA_TRUSTED, NULL, NULL, err,
                                   sizeof(err)) != KVR_OK) {
            fprintf(stderr, "%s: %s\n", *name, err);
            return 1;
        }
    }
    struct config cf = {.wall = calloc((size_t)n, sizeof(uint64_t)),
                        .cpu = calloc((size_t)n, sizeof(uint64_t))};
    if (cf.wall == NULL || cf.cpu == NULL)
        return 1;
    for (int i = 0; i < n; i++) {
        kvr_lua_vm_t *vm = NULL;
        uint64_t w0 = clock_ns(CLOCK_MONOTONIC), c0 = clock_ns(CLOCK_THREAD_CPUTIME_ID);
        if (kvr_lua_vm_new(rt, NULL, &vm) != KVR_OK)
            return 1;
        kvr_lua_vm_free(vm);
        cf.cpu[i] = clock_ns(CLOCK_THREAD_CPUTIME_ID) - c0;
        cf.wall[i] = clock_ns(CLOCK_MONOTONIC) - w0;
    }
    summarize(&cf, n, 1); /* one build per sample: ns per build */
    printf("VM build with %zu policies: median %.3f ms wall, %.3f ms CPU (best %.3f ms wall; "
           "%d builds)\n",
           k, cf.p50 / 1e6, cf.cpu50 / 1e6, cf.min / 1e6, n);
    free(cf.wall);
    free(cf.cpu);
    kvr_lua_runtime_free(rt);
    return 0;
}

int main(int argc, char **argv)
{
    int runs = 31, batch = 2000, md = 0;
    const char *only = NULL, *mode = NULL;
    size_t sizes[8] = {8, 64, 256};
    size_t n_sizes = 3;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--runs") == 0 && i + 1 < argc)
            runs = atoi(argv[++i]);
        else if (strcmp(argv[i], "--batch") == 0 && i + 1 < argc)
            batch = atoi(argv[++i]);
        else if (strcmp(argv[i], "--policy") == 0 && i + 1 < argc)
            only = argv[++i];
        else if (strcmp(argv[i], "--mode") == 0 && i + 1 < argc)
            mode = argv[++i];
        else if (strcmp(argv[i], "--markdown") == 0)
            md = 1;
        else if (strcmp(argv[i], "--build") == 0 && i + 1 < argc)
            return bench_build(atoi(argv[++i]) > 0 ? atoi(argv[i]) : 1);
        else if (strcmp(argv[i], "--sizes") == 0 && i + 1 < argc) {
            n_sizes = 0;
            for (char *tok = strtok(argv[++i], ","); tok && n_sizes < 8; tok = strtok(NULL, ","))
                sizes[n_sizes++] = (size_t)atoi(tok);
        } else {
            fprintf(stderr,
                    "usage: %s [--runs R] [--batch B] [--sizes 8,64,256] [--policy NAME|c] "
                    "[--mode sandboxed|trusted] [--markdown] | --build N\n",
                    argv[0]);
            return 2;
        }
    }
    if (runs < 1 || batch < 1) {
        fprintf(stderr, "runs and batch must be positive\n");
        return 2;
    }
    if (mode != NULL && strcmp(mode, "sandboxed") != 0 && strcmp(mode, "trusted") != 0) {
        fprintf(stderr, "--mode: sandboxed or trusted\n");
        return 2;
    }
    for (size_t k = 0; k < n_sizes; k++)
        if (sizes[k] < 1 || sizes[k] > MAX_N) {
            fprintf(stderr, "sizes must be in 1..%d\n", MAX_N);
            return 2;
        }
    if (md) {
        printf("| policy | mode | candidates | best µs | median µs | median CPU µs | CPU vs C |\n");
        printf("|---|---|---:|---:|---:|---:|---:|\n");
    } else {
        printf("%-18s %-10s %5s %10s %10s %10s %8s   (us per decision; %d rounds x %d, "
               "interleaved)\n",
               "policy", "mode", "n", "best", "median", "cpu-med", "cpu/C", runs, batch);
    }
    struct kvr_fallback_params p;
    kvr_fallback_params_init(&p);
    int rc = 0;
    for (size_t k = 0; k < n_sizes && rc == 0; k++) {
        size_t n = sizes[k];
        generate(n, 12345u + (unsigned)n);
        struct config cfs[MAX_CONFIGS];
        size_t nc = 0;
        memset(cfs, 0, sizeof(cfs));
        /* the C fallback always runs: it is the reference of the ratio column */
        cfs[nc++] = (struct config){.name = "C fallback",
                                    .mode = "direct",
                                    .fn = direct_c,
                                    .ctx = &p,
                                    .expect_fallback = 1};
        if (only == NULL || strcmp(only, "c") == 0) {
            cfs[nc] = (struct config){.name = "C fallback", .mode = "via VM", .expect_fallback = 1};
            if (open_vm(&cfs[nc], NULL, 0) != 0)
                return 1;
            nc++;
        }
        for (const char *const *name = kvr_lua_builtin_names(); *name && nc + 2 <= MAX_CONFIGS;
             name++) {
            if (only != NULL && strcmp(only, *name) != 0)
                continue;
            for (int trusted = 0; trusted <= 1; trusted++) {
                const char *m = trusted ? "trusted" : "sandboxed";
                if (mode != NULL && strcmp(mode, m) != 0)
                    continue;
                cfs[nc] = (struct config){.name = *name, .mode = m};
                if (open_vm(&cfs[nc], *name, trusted ? KVR_LUA_TRUSTED : 0) != 0)
                    return 1;
                nc++;
            }
        }
        for (size_t c = 0; c < nc; c++) {
            cfs[c].wall = calloc((size_t)runs, sizeof(uint64_t));
            cfs[c].cpu = calloc((size_t)runs, sizeof(uint64_t));
            if (cfs[c].wall == NULL || cfs[c].cpu == NULL)
                return 1;
            for (int i = 0; i < 5 * batch; i++)
                cfs[c].fn(cfs[c].ctx, &inputs[i % SETS], n);
        }
        for (int r = 0; r < runs; r++)
            for (size_t c = 0; c < nc; c++) {
                struct config *cf = &cfs[c];
                int fb = 0;
                uint64_t w0 = clock_ns(CLOCK_MONOTONIC), c0 = clock_ns(CLOCK_THREAD_CPUTIME_ID);
                for (int i = 0; i < batch; i++)
                    fb += cf->fn(cf->ctx, &inputs[(i + r) % SETS], n);
                cf->cpu[r] = clock_ns(CLOCK_THREAD_CPUTIME_ID) - c0;
                cf->wall[r] = clock_ns(CLOCK_MONOTONIC) - w0;
                if (!cf->expect_fallback)
                    cf->fallbacks += fb;
            }
        for (size_t c = 0; c < nc; c++)
            summarize(&cfs[c], runs, batch);
        for (size_t c = 0; c < nc; c++) {
            row(md, &cfs[c], n, cfs[0].cpu50);
            if (cfs[c].fallbacks)
                rc = 1; /* a decision made by the fallback: the policy failed */
            if (cfs[c].vm != NULL)
                close_vm(&cfs[c]);
            free(cfs[c].wall);
            free(cfs[c].cpu);
        }
        fflush(stdout);
    }
    return rc;
}
