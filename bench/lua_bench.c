/* lua_bench.c - kvr-lua-bench: decision overhead of every shipped Lua policy (sandboxed and
 * trusted) and of the built-in C fallback, for 8, 64 and 256 candidates.
 * SPDX-License-Identifier: Apache-2.0
 *
 *   kvr-lua-bench [--runs R] [--batch B] [--sizes 8,64,256] [--policy NAME] [--markdown]
 *
 * Method: one runtime and one VM per (policy, mode) on the calling thread; 64 pre-generated
 * random requests (candidate loads, overlaps, trees vary; fixed seed) are cycled so branches do
 * not settle on one input. After a warm-up of 5 x B decisions (the JIT compiles the glue, and
 * trusted policies), R runs of B decisions are timed with CLOCK_MONOTONIC; the per-decision time
 * of each run is run_time / B; the table shows the fastest run (the best estimate of the cost on
 * a shared machine: other load only ever adds), the median run and the p90 run.
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

struct input {
    struct kvr_ffi_request req;
    struct kvr_ffi_candidate c[MAX_N];
};

static struct input inputs[SETS];

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
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

struct result {
    double min, p50, p90; /* ns per decision */
    int fallbacks;        /* decisions the policy did not make (should be 0) */
};

/* Times `runs` batches of `batch` decisions of fn; fn returns 1 when a fallback decided. */
typedef int (*decide_fn)(void *ctx, const struct input *in, size_t n);

static struct result measure(decide_fn fn, void *ctx, size_t n, int runs, int batch)
{
    struct result r = {0, 0, 0, 0};
    if (runs < 1)
        runs = 1;
    uint64_t *t = calloc((size_t)runs, sizeof(*t));
    for (int i = 0; i < 5 * batch; i++)
        r.fallbacks += fn(ctx, &inputs[i % SETS], n);
    r.fallbacks = 0;
    for (int k = 0; k < runs; k++) {
        uint64_t t0 = now_ns();
        for (int i = 0; i < batch; i++)
            r.fallbacks += fn(ctx, &inputs[i % SETS], n);
        t[k] = now_ns() - t0;
    }
    qsort(t, (size_t)runs, sizeof(*t), cmp_u64);
    r.min = (double)t[0] / batch;
    r.p50 = (double)t[runs / 2] / batch;
    r.p90 = (double)t[(runs * 9) / 10 < runs ? (runs * 9) / 10 : runs - 1] / batch;
    free(t);
    return r;
}

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

static void row(int md, const char *name, const char *mode, size_t n, struct result r)
{
    if (md)
        printf("| %s | %s | %zu | %.2f | %.2f | %.2f |%s\n", name, mode, n, r.min / 1000.0,
               r.p50 / 1000.0, r.p90 / 1000.0, r.fallbacks ? " (fallbacks!)" : "");
    else
        printf("%-18s %-10s %5zu %10.2f %10.2f %10.2f%s\n", name, mode, n, r.min / 1000.0,
               r.p50 / 1000.0, r.p90 / 1000.0, r.fallbacks ? "  (fallbacks!)" : "");
    fflush(stdout);
}

static int bench_policy(const char *name, unsigned flags, size_t n, int runs, int batch,
                        struct result *out)
{
    struct kvr_lua_config cfg;
    kvr_lua_config_init(&cfg);
    kvr_lua_runtime_t *rt = NULL;
    kvr_lua_vm_t *vm = NULL;
    if (kvr_lua_runtime_new(&cfg, &rt) != KVR_OK)
        return -1;
    int rc = -1;
    if (name != NULL) {
        const char *src;
        size_t len;
        char err[4096];
        if (kvr_lua_builtin_source(rt, name, &src, &len) != KVR_OK ||
            kvr_lua_policy_install(rt, name, src, len, flags, NULL, NULL, err, sizeof(err)) !=
                KVR_OK ||
            kvr_lua_policy_bind(rt, NULL, name, NULL) != KVR_OK) {
            fprintf(stderr, "%s: %s\n", name, err);
            goto out;
        }
    }
    if (kvr_lua_vm_new(rt, NULL, &vm) != KVR_OK)
        goto out;
    *out = measure(via_vm, vm, n, runs, batch);
    rc = 0;
out:
    kvr_lua_vm_free(vm);
    kvr_lua_runtime_free(rt);
    return rc;
}

int main(int argc, char **argv)
{
    int runs = 31, batch = 2000, md = 0;
    const char *only = NULL;
    size_t sizes[8] = {8, 64, 256};
    size_t n_sizes = 3;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--runs") == 0 && i + 1 < argc)
            runs = atoi(argv[++i]);
        else if (strcmp(argv[i], "--batch") == 0 && i + 1 < argc)
            batch = atoi(argv[++i]);
        else if (strcmp(argv[i], "--policy") == 0 && i + 1 < argc)
            only = argv[++i];
        else if (strcmp(argv[i], "--markdown") == 0)
            md = 1;
        else if (strcmp(argv[i], "--sizes") == 0 && i + 1 < argc) {
            n_sizes = 0;
            for (char *tok = strtok(argv[++i], ","); tok && n_sizes < 8; tok = strtok(NULL, ","))
                sizes[n_sizes++] = (size_t)atoi(tok);
        } else {
            fprintf(stderr,
                    "usage: %s [--runs R] [--batch B] [--sizes 8,64,256] [--policy NAME] "
                    "[--markdown]\n",
                    argv[0]);
            return 2;
        }
    }
    if (runs < 1 || batch < 1) {
        fprintf(stderr, "runs and batch must be positive\n");
        return 2;
    }
    for (size_t k = 0; k < n_sizes; k++)
        if (sizes[k] < 1 || sizes[k] > MAX_N) {
            fprintf(stderr, "sizes must be in 1..%d\n", MAX_N);
            return 2;
        }
    if (md) {
        printf("| policy | mode | candidates | best µs | median µs | p90 µs |\n");
        printf("|---|---|---:|---:|---:|---:|\n");
    } else {
        printf("%-18s %-10s %5s %10s %10s %10s   (us per decision; %d runs x %d)\n", "policy",
               "mode", "n", "best", "median", "p90", runs, batch);
    }
    for (size_t k = 0; k < n_sizes; k++) {
        size_t n = sizes[k];
        generate(n, 12345u + (unsigned)n);
        struct kvr_fallback_params p;
        kvr_fallback_params_init(&p);
        if (only == NULL || strcmp(only, "c") == 0) {
            row(md, "C fallback", "direct", n, measure(direct_c, &p, n, runs, batch));
            struct result r;
            if (bench_policy(NULL, 0, n, runs, batch, &r) == 0) {
                r.fallbacks = 0; /* by design here */
                row(md, "C fallback", "via VM", n, r);
            }
        }
        for (const char *const *name = kvr_lua_builtin_names(); *name; name++) {
            if (only != NULL && strcmp(only, *name) != 0)
                continue;
            for (int trusted = 0; trusted <= 1; trusted++) {
                struct result r;
                if (bench_policy(*name, trusted ? KVR_LUA_TRUSTED : 0, n, runs, batch, &r) != 0)
                    return 1;
                row(md, *name, trusted ? "trusted" : "sandboxed", n, r);
            }
        }
    }
    return 0;
}
