/* test_watchdog.c - Check suite for lua/src/watchdog.c: stuck calls are reported, trusted calls
 * stuck in compiled code are interrupted (and their thread's Lua state rebuilt), sandboxed ones
 * are left to the count hook, nothing is interrupted without a stop signal.
 * SPDX-License-Identifier: Apache-2.0 */
#include <check.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "kvr/err.h"
#include "kvr/lua.h"
#include "luafix.h"

Suite *watchdog_suite(void);

#define HARD_NS 100000000u /* the watchdog's hard limit in these tests: 100 ms */

static struct logcap lc;
static kvr_lua_runtime_t *rt;
static kvr_lua_vm_t *vm;
static struct kvr_ffi_request req;
static struct kvr_ffi_candidate cands[4];
static struct kvr_lua_decision d;
static uint32_t ranked[4];
static char err[4096];

/* The watchdog thread: a pass every 10 ms until stopped; remembers the most it saw stuck. */
static pthread_t dog;
static atomic_int dog_run;
static atomic_size_t dog_max_stuck;
static atomic_ullong dog_signals;

static void *dog_main(void *arg)
{
    (void)arg;
    while (atomic_load(&dog_run)) {
        struct kvr_lua_watchdog_report r;
        kvr_lua_runtime_watchdog(rt, HARD_NS, &r);
        if (r.stuck > atomic_load(&dog_max_stuck))
            atomic_store(&dog_max_stuck, r.stuck);
        atomic_fetch_add(&dog_signals, r.signals);
        struct timespec ts = {0, 10000000};
        nanosleep(&ts, NULL);
    }
    return NULL;
}

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void start(int stop_signal)
{
    logcap_init(&lc);
    struct kvr_lua_config cfg;
    kvr_lua_config_init(&cfg);
    cfg.stop_signal = stop_signal;
    rt = luafix_runtime(&cfg, &lc);
    ck_assert_int_eq(kvr_lua_vm_new(rt, NULL, &vm), KVR_OK);
    luafix_request(&req, 100, 16);
    luafix_cands(cands, 4);
    atomic_store(&dog_run, 1);
    atomic_store(&dog_max_stuck, 0);
    atomic_store(&dog_signals, 0);
    ck_assert_int_eq(pthread_create(&dog, NULL, dog_main, NULL), 0);
}

static void setup_stop(void)
{
    start(SIGRTMIN + 4);
}

static void setup_report_only(void)
{
    start(0);
}

static void teardown(void)
{
    atomic_store(&dog_run, 0);
    pthread_join(dog, NULL);
    kvr_lua_vm_free(vm);
    kvr_lua_runtime_free(rt);
    vm = NULL;
    rt = NULL;
}

/* Installs src (misbehaving only for model "live") as `name` for model "live" and the default. */
static void use(const char *name, const char *src, unsigned flags)
{
    int st = luafix_install(rt, name, src, flags, err, sizeof(err));
    ck_assert_msg(st == KVR_LUA_OK, "install %s: %s", name, err);
    ck_assert_int_eq(kvr_lua_policy_bind(rt, NULL, name, NULL), KVR_OK);
}

static void pick_model(const char *model)
{
    req.model = model;
    req.model_len = (uint32_t)strlen(model);
    memset(&d, 0, sizeof(d));
    d.ranked = ranked;
    d.cap = 4;
    ck_assert_int_eq(kvr_lua_vm_select(vm, &req, cands, 4, &d), KVR_OK);
    ck_assert_uint_ge(d.n_ranked, 1);
}

#define LIVE(body)                                                                                 \
    "local n = 0\n"                                                                                \
    "return { select = function(req, c)\n"                                                         \
    "  n = n + 1\n"                                                                                \
    "  if req.model == 'live' then\n" body "\n  end\n"                                             \
    "  if req.model == 'count' and n ~= 1 then error('state kept: ' .. n) end\n"                   \
    "  return c[#c]\nend }\n"

/* Loops that never return once compiled; each must be stopped. Pure compiled loops never leave
 * their trace, so only the watchdog can stop them; loops that allocate leave it now and then (the
 * GC forces trace exits), and the count hook may stop them first: either way they stop. */
static const struct {
    const char *code;
    int watchdog_only;
} runaways[] = {
    {"while true do end", 1},
    {"local x = 0 while true do x = x + 1 end", 1},
    {"local s = 0 for i = 1, 1e300 do s = s + math.sin(i) end return c[s]", 1},
    {"local t, i = {}, 0 while true do i = i + 1 t[i % 100 + 1] = { i } end", 0},
    {"local s = '' while true do s = ('x'):rep(10) .. c[1].id end", 0},
};

START_TEST(stuck_trusted_calls_are_interrupted)
{
    uint64_t stopped = 0;
    for (size_t i = 0; i < sizeof(runaways) / sizeof(runaways[0]); i++) {
        char name[16], src[1024];
        snprintf(name, sizeof(name), "run%zu", i);
        snprintf(src, sizeof(src), LIVE("    %s"), runaways[i].code);
        use(name, src, KVR_LUA_TRUSTED);
        pick_model("calm");
        ck_assert_int_eq(d.status, KVR_LUA_OK);
        uint64_t t0 = now_ns();
        pick_model("live"); /* hangs until it is stopped */
        uint64_t took = now_ns() - t0;
        ck_assert_msg(d.status == KVR_LUA_ETIMEDOUT && d.fallback == 1,
                      "runaway %zu (%s): status %d: %s", i, runaways[i].code, d.status, d.error);
        int by_watchdog = strstr(d.error, "interrupted") != NULL;
        ck_assert_msg(by_watchdog || !runaways[i].watchdog_only, "runaway %zu: %s", i, d.error);
        if (by_watchdog) {
            stopped++;
            ck_assert_msg(took >= HARD_NS, "stopped after %llu ms",
                          (unsigned long long)(took / 1000000));
        }
        struct kvr_lua_runtime_stats st;
        kvr_lua_runtime_stats(rt, &st);
        ck_assert_uint_eq(st.stopped, stopped);
        ck_assert_uint_ge(st.stuck_total, stopped);
        ck_assert_uint_ge(st.stop_signals, stopped);
        if (by_watchdog) { /* the thread's state was rebuilt: it serves again, afresh */
            pick_model("count");
            ck_assert_msg(d.status == KVR_LUA_OK, "after the stop: %s", d.error);
            ck_assert_uint_eq(ranked[0], 3);
        }
    }
    ck_assert_uint_ge(stopped, 3);
    ck_assert_uint_ge(atomic_load(&dog_max_stuck), 1);
    ck_assert(logcap_has(&lc, "has been in one call of policy run0"));
    ck_assert(logcap_has(&lc, "rebuilt its Lua state after an interrupted call"));
}
END_TEST

START_TEST(stuck_hook_is_interrupted)
{
    use("resp",
        "return { select = function(req, c) return c[1] end,\n"
        "  on_response = function(req, w, o) if o.status == 599 then while true do end end end }",
        KVR_LUA_TRUSTED);
    struct kvr_ffi_outcome o;
    memset(&o, 0, sizeof(o));
    o.ttft_ms = o.latency_ms = -1;
    o.status = 599;
    int st = kvr_lua_vm_on_response(vm, &req, &cands[0], &o);
    ck_assert_int_eq(st, KVR_LUA_ETIMEDOUT);
    struct kvr_lua_runtime_stats rs;
    kvr_lua_runtime_stats(rt, &rs);
    ck_assert_uint_eq(rs.stopped, 1);
    o.status = 200;
    ck_assert_int_eq(kvr_lua_vm_on_response(vm, &req, &cands[0], &o), KVR_LUA_OK);
    pick_model("m");
    ck_assert_int_eq(d.status, KVR_LUA_OK);
}
END_TEST

START_TEST(sandboxed_calls_are_left_to_the_hook)
{
    /* A sandboxed policy is never interrupted by the signal (not armed): its count hook stops
     * it within the budget, long before the watchdog's hard limit. */
    use("sbox", LIVE("    while true do end"), 0);
    pick_model("live");
    ck_assert_int_eq(d.status, KVR_LUA_ETIMEDOUT);
    ck_assert_ptr_null(strstr(d.error, "interrupted"));
    struct kvr_lua_runtime_stats st;
    kvr_lua_runtime_stats(rt, &st);
    ck_assert_uint_eq(st.stopped, 0);
    ck_assert_uint_eq(st.stuck_total, 0);
}
END_TEST

START_TEST(reports_without_interrupting)
{
    /* No stop signal: a long trusted call is reported while it runs, never interrupted. ~0.4 s of
     * compiled looping (then it returns: the decision is discarded as an overrun). */
    use("slow",
        LIVE("    local x = 0 for i = 1, 4e8 do x = x + i % 7 end if x < 0 then return nil end"),
        KVR_LUA_TRUSTED);
    pick_model("live");
    ck_assert_int_eq(d.status, KVR_LUA_ETIMEDOUT);
    ck_assert_ptr_null(strstr(d.error, "interrupted"));
    ck_assert_uint_ge(atomic_load(&dog_max_stuck), 1);
    ck_assert_uint_eq(atomic_load(&dog_signals), 0);
    struct kvr_lua_runtime_stats st;
    kvr_lua_runtime_stats(rt, &st);
    ck_assert_uint_eq(st.stopped, 0);
    ck_assert_uint_eq(st.stop_signals, 0);
    ck_assert_uint_eq(st.stuck_total, 1);
    ck_assert(logcap_has(&lc, "cannot be interrupted"));
    /* Once it returned, nothing is stuck any more. */
    struct timespec ts = {0, 50000000};
    nanosleep(&ts, NULL);
    kvr_lua_runtime_stats(rt, &st);
    ck_assert_uint_eq(st.stuck_now, 0);
    pick_model("m");
    ck_assert_int_eq(d.status, KVR_LUA_OK);
}
END_TEST

/* ThreadSanitizer holds asynchronous signals back until the thread calls an intercepted
 * function, which a compiled Lua loop never does: under TSan the stop cannot happen (the handler
 * would only run later, outside compiled code, and do nothing), so only reporting is tested. */
#if defined(__SANITIZE_THREAD__)
#define KVR_TEST_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define KVR_TEST_TSAN 1
#endif
#endif

Suite *watchdog_suite(void)
{
    Suite *s = suite_create("watchdog");
#ifndef KVR_TEST_TSAN
    TCase *stop = tcase_create("edge");
    tcase_add_checked_fixture(stop, setup_stop, teardown);
    tcase_set_timeout(stop, 120);
    tcase_add_test(stop, stuck_trusted_calls_are_interrupted);
    tcase_add_test(stop, stuck_hook_is_interrupted);
    tcase_add_test(stop, sandboxed_calls_are_left_to_the_hook);
    suite_add_tcase(s, stop);
#else
    (void)setup_stop;
    (void)stuck_trusted_calls_are_interrupted;
    (void)stuck_hook_is_interrupted;
    (void)sandboxed_calls_are_left_to_the_hook;
#endif
    TCase *report = tcase_create("api");
    tcase_add_checked_fixture(report, setup_report_only, teardown);
    tcase_set_timeout(report, 120);
    tcase_add_test(report, reports_without_interrupting);
    suite_add_tcase(s, report);
    return s;
}
