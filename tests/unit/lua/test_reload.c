/* test_reload.c - Check suite for lua/src/reload.c and the generation machinery of runtime.c /
 * vm.c: refused installs change nothing, swaps happen between requests, waits, reloads under
 * load lose no request.
 * SPDX-License-Identifier: Apache-2.0 */
#include <check.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "kvr/err.h"
#include "kvr/lua.h"
#include "luafix.h"

Suite *reload_suite(void);

static struct logcap lc;
static kvr_lua_runtime_t *rt;
static char err[4096];

static const char *PICK1 = "return { select = function(r, c) return c[1] end }";
static const char *PICK2 = "return { select = function(r, c) return c[math.min(2, #c)] end }";

static void setup(void)
{
    logcap_init(&lc);
    rt = luafix_runtime(NULL, &lc);
}

static void teardown(void)
{
    kvr_lua_runtime_free(rt);
    rt = NULL;
}

static uint32_t choose(kvr_lua_vm_t *vm, struct kvr_lua_decision *d)
{
    struct kvr_ffi_request req;
    struct kvr_ffi_candidate c[3];
    static uint32_t ranked[3];
    luafix_request(&req, 64, 16);
    luafix_cands(c, 3);
    return luafix_select(vm, &req, c, 3, d, ranked, 3);
}

START_TEST(refused_install_keeps_the_old_policy)
{
    uint64_t g1 = 0, g2 = 0;
    ck_assert_int_eq(
        kvr_lua_policy_install(rt, "p", PICK1, strlen(PICK1), 0, &g1, NULL, err, sizeof(err)),
        KVR_OK);
    ck_assert_int_eq(kvr_lua_policy_bind(rt, NULL, "p", &g2), KVR_OK);
    ck_assert_uint_eq(g2, g1 + 1);
    kvr_lua_vm_t *vm;
    ck_assert_int_eq(kvr_lua_vm_new(rt, NULL, &vm), KVR_OK);
    struct kvr_lua_decision d;
    ck_assert_uint_eq(choose(vm, &d), 0);
    ck_assert_uint_eq(d.generation, g2);
    /* Broken versions of p: syntax, runtime, selftest, synthetic decisions. */
    static const char *broken[] = {
        "return { select = function(r, c) return c[1] end",
        "local x = nil; x.y = 1",
        ("return { select = function(r, c) return c[1] end, selftest = function() return false "
         "end }"),
        "return { select = function(r, c) return 'c1' end }",
    };
    static const int want[] = {KVR_LUA_ERRSYNTAX, KVR_LUA_ERRRUN, KVR_LUA_ERRRUN, KVR_LUA_INVALID};
    for (size_t i = 0; i < 4; i++) {
        int st = -1;
        uint64_t g = 12345;
        ck_assert_int_eq(kvr_lua_policy_install(rt, "p", broken[i], strlen(broken[i]), 0, &g, &st,
                                                err, sizeof(err)),
                         KVR_EINVAL);
        ck_assert_int_eq(st, want[i]);
        ck_assert_uint_eq(g, 12345); /* untouched */
        ck_assert_str_ne(err, "");
        ck_assert_uint_eq(kvr_lua_runtime_generation(rt), g2);
        ck_assert_uint_eq(choose(vm, &d), 0); /* the old p still serves */
        ck_assert_uint_eq(d.generation, g2);
    }
    ck_assert_ptr_nonnull(strstr(err, "synthetic decision 0"));
    ck_assert(logcap_has(&lc, "policy p refused"));
    struct kvr_lua_policy_stats st;
    ck_assert_int_eq(kvr_lua_policy_stats(rt, "p", &st), KVR_OK);
    ck_assert_uint_eq(st.rejected, 4);
    ck_assert_uint_eq(st.reloads, 1);
    /* A good new version replaces it at the next request. */
    uint64_t g3;
    ck_assert_int_eq(
        kvr_lua_policy_install(rt, "p", PICK2, strlen(PICK2), 0, &g3, NULL, err, sizeof(err)),
        KVR_OK);
    ck_assert_uint_eq(g3, g2 + 1);
    ck_assert_uint_eq(kvr_lua_vm_generation(vm), g2);
    ck_assert_uint_eq(choose(vm, &d), 1);
    ck_assert_uint_eq(d.generation, g3);
    ck_assert_uint_eq(kvr_lua_vm_generation(vm), g3);
    ck_assert_int_eq(kvr_lua_policy_stats(rt, "p", &st), KVR_OK);
    ck_assert_uint_eq(st.reloads, 2);
    ck_assert_uint_eq(st.decisions, 6); /* counters follow the name across generations */
    ck_assert_uint_eq(st.generation, g3);
    kvr_lua_vm_free(vm);
}
END_TEST

static atomic_int woken;

static void wake(void *ctx)
{
    (void)ctx;
    atomic_fetch_add(&woken, 1);
}

START_TEST(poll_wait_and_wake)
{
    kvr_lua_vm_t *a, *b;
    struct kvr_lua_vm_config vc = {.wake = wake, .wake_ctx = NULL};
    atomic_store(&woken, 0);
    ck_assert_int_eq(kvr_lua_vm_new(rt, &vc, &a), KVR_OK);
    ck_assert_int_eq(kvr_lua_vm_new(rt, NULL, &b), KVR_OK);
    uint64_t g;
    ck_assert_int_eq(
        kvr_lua_policy_install(rt, "p", PICK1, strlen(PICK1), 0, &g, NULL, err, sizeof(err)),
        KVR_OK);
    ck_assert_int_eq(atomic_load(&woken), 1);
    ck_assert_int_eq(kvr_lua_runtime_wait(rt, g, 50, err, sizeof(err)), KVR_ETIMEDOUT);
    ck_assert_ptr_nonnull(strstr(err, "still runs generation 0"));
    ck_assert_int_eq(kvr_lua_vm_poll(a), 1);
    ck_assert_int_eq(kvr_lua_vm_poll(a), 0);
    ck_assert_int_eq(kvr_lua_runtime_wait(rt, g, 50, err, sizeof(err)), KVR_ETIMEDOUT);
    uint64_t gens[4];
    size_t n;
    ck_assert_int_eq(kvr_lua_runtime_vm_generations(rt, gens, 4, &n), KVR_OK);
    ck_assert_uint_eq(n, 2);
    ck_assert_uint_eq(gens[0], g);
    ck_assert_uint_eq(gens[1], 0);
    ck_assert_int_eq(kvr_lua_runtime_vm_generations(rt, gens, 1, &n), KVR_ERANGE);
    ck_assert_int_eq(kvr_lua_vm_poll(b), 1);
    ck_assert_int_eq(kvr_lua_runtime_wait(rt, g, 50, err, sizeof(err)), KVR_OK);
    /* A freed VM no longer holds waits back. */
    ck_assert_int_eq(kvr_lua_policy_bind(rt, NULL, "p", &g), KVR_OK);
    ck_assert_int_eq(atomic_load(&woken), 2);
    ck_assert_int_eq(kvr_lua_vm_poll(a), 1);
    kvr_lua_vm_free(b);
    ck_assert_int_eq(kvr_lua_runtime_wait(rt, g, 50, err, sizeof(err)), KVR_OK);
    kvr_lua_vm_free(a);
}
END_TEST

START_TEST(remove_and_unbind)
{
    kvr_lua_vm_t *vm;
    ck_assert_int_eq(kvr_lua_vm_new(rt, NULL, &vm), KVR_OK);
    ck_assert_int_eq(luafix_install(rt, "a", PICK1, 0, err, sizeof(err)), KVR_LUA_OK);
    ck_assert_int_eq(luafix_install(rt, "b", PICK2, 0, err, sizeof(err)), KVR_LUA_OK);
    ck_assert_int_eq(kvr_lua_policy_bind(rt, NULL, "b", NULL), KVR_OK);
    ck_assert_int_eq(kvr_lua_policy_bind(rt, "m", "b", NULL), KVR_OK);
    struct kvr_lua_decision d;
    ck_assert_uint_eq(choose(vm, &d), 1);
    ck_assert_int_eq(kvr_lua_policy_remove(rt, "a", NULL), KVR_OK); /* slots shift */
    ck_assert_uint_eq(choose(vm, &d), 1);
    ck_assert_str_eq(d.policy, "b");
    ck_assert_int_eq(kvr_lua_policy_remove(rt, "b", NULL), KVR_OK);
    ck_assert_int_eq(kvr_lua_policy_remove(rt, "b", NULL), KVR_ENOTFOUND);
    choose(vm, &d);
    ck_assert_int_eq(d.status, KVR_LUA_NOPOLICY);
    ck_assert_int_eq(d.fallback, 1);
    struct kvr_lua_policy_stats st;
    ck_assert_int_eq(kvr_lua_policy_stats(rt, "b", &st), KVR_OK);
    ck_assert_int_eq(st.live, 0);
    ck_assert_int_eq(kvr_lua_policy_stats(rt, "never", &st), KVR_ENOTFOUND);
    kvr_lua_vm_free(vm);
}
END_TEST

START_TEST(builtins_and_overrides)
{
    const char *const *names = kvr_lua_builtin_names();
    static const char *expect[] = {"bounded_affinity", "cache_aware",      "kv_cost",
                                   "least_loaded",     "power_of_two",     "random",
                                   "round_robin",      "session_affinity", "weighted"};
    size_t n = 0;
    while (names[n] != NULL)
        n++;
    ck_assert_uint_eq(n, sizeof(expect) / sizeof(expect[0]));
    for (size_t i = 0; i < n; i++) {
        ck_assert_str_eq(names[i], expect[i]);
        const char *src;
        size_t len;
        ck_assert_int_eq(kvr_lua_builtin_source(NULL, names[i], &src, &len), KVR_OK);
        ck_assert_uint_gt(len, 100);
    }
    const char *src;
    size_t len;
    ck_assert_int_eq(kvr_lua_builtin_source(NULL, "nope", &src, &len), KVR_ENOTFOUND);
    ck_assert_int_eq(kvr_lua_builtin_source(NULL, "../etc/passwd", &src, &len), KVR_ENOTFOUND);
    /* policy_dir override: a file there wins over the embedded copy. */
    char dir[] = "/tmp/kvr_policy_dirXXXXXX";
    ck_assert_ptr_nonnull(mkdtemp(dir));
    char path[256];
    snprintf(path, sizeof(path), "%s/kv_cost.lua", dir);
    FILE *f = fopen(path, "w");
    fputs("-- override\nreturn { select = function(r, c) return c[1] end }\n", f);
    fclose(f);
    teardown();
    struct kvr_lua_config cfg;
    kvr_lua_config_init(&cfg);
    cfg.policy_dir = dir;
    cfg.lib_dir = KVR_SOURCE_DIR "/lua/lib"; /* the library from files, not the embedded copy */
    rt = luafix_runtime(&cfg, &lc);
    ck_assert_int_eq(kvr_lua_builtin_source(rt, "kv_cost", &src, &len), KVR_OK);
    ck_assert(strncmp(src, "-- override", 11) == 0);
    ck_assert_int_eq(kvr_lua_builtin_source(rt, "random", &src, &len), KVR_OK); /* embedded */
    ck_assert(strncmp(src, "-- random.lua", 13) == 0);
    ck_assert_int_eq(luafix_install(rt, "x", PICK2, 0, err, sizeof(err)), KVR_LUA_OK);
    unlink(path);
    rmdir(dir);
    /* A lib_dir without the library: the runtime refuses to start. */
    teardown();
    kvr_lua_config_init(&cfg);
    cfg.lib_dir = "/nonexistent";
    cfg.log = logcap_fn;
    cfg.log_ctx = &lc;
    ck_assert_int_eq(kvr_lua_runtime_new(&cfg, &rt), KVR_ECORRUPT);
    ck_assert(logcap_has(&lc, "cannot open /nonexistent/kvr/core.lua"));
    rt = luafix_runtime(NULL, &lc);
}
END_TEST

START_TEST(bad_config_and_capacity)
{
    struct kvr_lua_config cfg;
    kvr_lua_runtime_t *x = NULL;
    kvr_lua_config_init(&cfg);
    cfg.mem_limit = 1000;
    ck_assert_int_eq(kvr_lua_runtime_new(&cfg, &x), KVR_EINVAL);
    kvr_lua_config_init(&cfg);
    cfg.budget_ns = 0;
    ck_assert_int_eq(kvr_lua_runtime_new(&cfg, &x), KVR_EINVAL);
    kvr_lua_config_init(&cfg);
    cfg.fallback.overlap_weight = -1;
    ck_assert_int_eq(kvr_lua_runtime_new(&cfg, &x), KVR_EINVAL);
    ck_assert_ptr_null(x);
    /* Names are capped: the 65th distinct name is refused, existing ones still install. */
    char name[16];
    int last = KVR_OK;
    for (int i = 0; i < KVR_LUA_MAX_POLICIES + 1; i++) {
        snprintf(name, sizeof(name), "n%d", i);
        last =
            kvr_lua_policy_install(rt, name, PICK1, strlen(PICK1), 0, NULL, NULL, err, sizeof(err));
    }
    ck_assert_int_eq(last, KVR_ECAPACITY);
    ck_assert_int_eq(luafix_install(rt, "n3", PICK2, 0, err, sizeof(err)), KVR_LUA_OK);
    ck_assert_int_eq(kvr_lua_policy_bind(rt,
                                         "a-model-name-that-is-far-too-long-to-be-accepted-"
                                         "by-the-runtime-binding-table",
                                         "n3", NULL),
                     KVR_EINVAL);
}
END_TEST

/* ==== concurrency: reloads under load ======================================================== */

#define THREADS 4

struct worker {
    pthread_t t;
    atomic_int stop;
    atomic_int woken;
    int idle; /* 1: never selects, polls only when woken */
    uint64_t decisions, bad, regress, max_gen;
    char why[256]; /* the last bad decision */
};

static void wake_worker(void *ctx)
{
    struct worker *w = ctx;
    atomic_store(&w->woken, 1);
}

static void *worker_main(void *arg)
{
    struct worker *w = arg;
    struct kvr_lua_vm_config vc = {.wake = wake_worker, .wake_ctx = w};
    kvr_lua_vm_t *vm;
    if (kvr_lua_vm_new(rt, &vc, &vm) != KVR_OK)
        return (void *)1;
    struct kvr_ffi_request req;
    struct kvr_ffi_candidate c[4];
    uint32_t ranked[4];
    luafix_request(&req, 128, 16);
    luafix_cands(c, 4);
    while (!atomic_load(&w->stop)) {
        if (w->idle) {
            if (atomic_exchange(&w->woken, 0))
                kvr_lua_vm_poll(vm);
            nanosleep(&(struct timespec){0, 100000}, NULL);
            continue;
        }
        struct kvr_lua_decision d = {.ranked = ranked, .cap = 4};
        int rc = kvr_lua_vm_select(vm, &req, c, 4, &d);
        w->decisions++;
        /* Every request gets its decision from a policy (never the fallback): 0 or 1. */
        if (rc != KVR_OK || d.status != KVR_LUA_OK || d.fallback || d.n_ranked != 1 ||
            ranked[0] > 1) {
            w->bad++;
            snprintf(w->why, sizeof(w->why), "rc %d status %d fallback %d n %zu first %u: %.150s",
                     rc, d.status, d.fallback, d.n_ranked, ranked[0], d.error);
        }
        if (d.generation < w->max_gen)
            w->regress++;
        if (d.generation > w->max_gen)
            w->max_gen = d.generation;
    }
    kvr_lua_vm_free(vm);
    return NULL;
}

START_TEST(reloads_under_load_lose_no_request)
{
    ck_assert_int_eq(luafix_install(rt, "flip", PICK1, 0, err, sizeof(err)), KVR_LUA_OK);
    ck_assert_int_eq(kvr_lua_policy_bind(rt, NULL, "flip", NULL), KVR_OK);
    struct worker w[THREADS + 1];
    memset(w, 0, sizeof(w));
    w[THREADS].idle = 1;
    for (int i = 0; i <= THREADS; i++)
        ck_assert_int_eq(pthread_create(&w[i].t, NULL, worker_main, &w[i]), 0);
    for (int i = 0; i < 20; i++) {
        const char *src = (i % 2) ? PICK1 : PICK2;
        uint64_t g;
        int st;
        ck_assert_int_eq(kvr_lua_policy_install(rt, "flip", src, strlen(src),
                                                (i % 3 == 0) ? KVR_LUA_TRUSTED : 0, &g, &st, err,
                                                sizeof(err)),
                         KVR_OK);
        /* A broken install in between changes nothing. */
        ck_assert_int_eq(
            kvr_lua_policy_install(rt, "flip", "return {", 8, 0, NULL, &st, err, sizeof(err)),
            KVR_EINVAL);
        ck_assert_msg(kvr_lua_runtime_wait(rt, g, 10000, err, sizeof(err)) == KVR_OK, "%s", err);
    }
    for (int i = 0; i <= THREADS; i++)
        atomic_store(&w[i].stop, 1);
    uint64_t total = 0;
    for (int i = 0; i <= THREADS; i++) {
        void *res;
        pthread_join(w[i].t, &res);
        ck_assert_ptr_null(res);
        ck_assert_msg(w[i].bad == 0, "%llu bad decisions, last: %s", (unsigned long long)w[i].bad,
                      w[i].why);
        ck_assert_uint_eq(w[i].regress, 0);
        total += w[i].decisions;
    }
    ck_assert_uint_gt(total, 100);
    struct kvr_lua_policy_stats st;
    ck_assert_int_eq(kvr_lua_policy_stats(rt, "flip", &st), KVR_OK);
    ck_assert_uint_eq(st.decisions, total); /* freed VMs' counters are kept */
    ck_assert_uint_eq(st.ok, total);
    ck_assert_uint_eq(st.reloads, 21);
    ck_assert_uint_eq(st.rejected, 20);
}
END_TEST

Suite *reload_suite(void)
{
    Suite *s = suite_create("reload");
    TCase *api = tcase_create("api");
    tcase_add_checked_fixture(api, setup, teardown);
    tcase_set_timeout(api, 120);
    tcase_add_test(api, refused_install_keeps_the_old_policy);
    tcase_add_test(api, poll_wait_and_wake);
    tcase_add_test(api, remove_and_unbind);
    tcase_add_test(api, builtins_and_overrides);
    tcase_add_test(api, bad_config_and_capacity);
    suite_add_tcase(s, api);
    TCase *conc = tcase_create("concurrency");
    tcase_add_checked_fixture(conc, setup, teardown);
    tcase_set_timeout(conc, 300);
    tcase_add_test(conc, reloads_under_load_lose_no_request);
    suite_add_tcase(s, conc);
    return s;
}
