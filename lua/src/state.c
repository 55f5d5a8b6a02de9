/* state.c - one Lua state: counting allocator, time-budget hook, protected calls, loading the
 * kvr library and the policies into it. (Design: kvr/lua.h "Time budget".)
 * SPDX-License-Identifier: Apache-2.0 */
#include <errno.h>
#include <lualib.h>
#include <luajit.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "internal.h"
#include "kvr/err.h"

/* ==== allocator: per-state byte count with a cap (HAProxy hlua_alloc idea) ================== */

static void *lalloc(void *ud, void *ptr, size_t osize, size_t nsize)
{
    struct lstate *s = ud;
    if (nsize == 0) {
        if (ptr != NULL) {
            free(ptr);
            s->used -= osize;
        }
        return NULL;
    }
    if (ptr == NULL)
        osize = 0;
    if (nsize > osize && s->used + (nsize - osize) > s->cap) {
        s->oom_refusals++;
        return NULL;
    }
    void *q = realloc(ptr, nsize);
    if (q == NULL)
        return nsize <= osize ? ptr : NULL; /* Lua assumes a shrink never fails */
    s->used = s->used - osize + nsize;
    if (nsize > osize)
        s->allocated += nsize - osize;
    if (s->used > s->peak)
        s->peak = s->used;
    return q;
}

/* ==== the hook: the per-call deadline ======================================================== */

uint64_t kvr_lua_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static uint64_t thread_cpu_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

int lstate_over_budget(struct lstate *s)
{
    if (s->deadline_ns == 0)
        return 0;
    if (s->timed_out)
        return 1;
    uint64_t now = kvr_lua_now_ns(); /* vDSO: ~25 ns */
    if (now < s->deadline_ns)
        return 0;
    /* Past the wall-clock budget: maybe the thread was only preempted. Allow a grace of the
     * thread's own CPU time (a syscall, ~0.6 us, paid only from here on); a runaway burns it. */
    uint64_t cpu = thread_cpu_ns();
    if (s->cpu_limit_ns == 0) {
        s->cpu_limit_ns = cpu + s->grace_ns;
        return 0;
    }
    if (cpu < s->cpu_limit_ns)
        return 0;
    s->timed_out = 1;
    return 1;
}

int lstate_overran(struct lstate *s, uint64_t elapsed_ns, uint64_t budget_ns)
{
    if (elapsed_ns <= budget_ns * HARD_FACTOR)
        return 0;
    /* The CPU sample is at most one budget older than the call's start, so the call itself used
     * at least (cpu now - sample) - budget of CPU: blame it only beyond HARD_FACTOR budgets. */
    return thread_cpu_ns() - s->cpu_sample_ns > (uint64_t)(HARD_FACTOR + 1) * budget_ns;
}

static void budget_hook(lua_State *L, lua_Debug *ar)
{
    (void)ar;
    void *ud;
    lua_getallocf(L, &ud);
    struct lstate *s = ud;
    if (lstate_over_budget(s)) {
        /* From now on every instruction raises, so a pcall inside the policy cannot swallow it. */
        lua_sethook(L, budget_hook, LUA_MASKCOUNT, 1);
        luaL_error(L, "time budget exceeded");
    }
}

static int panic(lua_State *L)
{
    const char *msg = lua_tostring(L, -1);
    fprintf(stderr, "kvrouter: unprotected Lua error (bug): %s\n", msg ? msg : "?");
    abort();
}

/* Message handler: the error text plus a traceback. Never runs policy code (no __tostring). */
static int traceback(lua_State *L)
{
    const char *msg = lua_tostring(L, 1);
    if (msg == NULL)
        msg = lua_pushfstring(L, "(error object is a %s value)", luaL_typename(L, 1));
    luaL_traceback(L, L, msg, 1);
    return 1;
}

static void copy_err(char *err, size_t len, const char *msg)
{
    if (err == NULL || len == 0)
        return;
    snprintf(err, len, "%s", msg ? msg : "unknown error");
}

static int map_rc(struct lstate *s, int rc)
{
    if (s->timed_out)
        return KVR_LUA_ETIMEDOUT;
    switch (rc) {
    case 0:
        return KVR_LUA_OK;
    case LUA_ERRMEM:
        return KVR_LUA_ERRMEM;
    case LUA_ERRSYNTAX:
        return KVR_LUA_ERRSYNTAX;
    default:
        return KVR_LUA_ERRRUN;
    }
}

static void disarm(struct lstate *s)
{
    s->deadline_ns = 0;
    if (s->timed_out)
        lua_sethook(s->L, budget_hook, LUA_MASKCOUNT, (int)s->hook_count);
}

/* Coarse monotonic time (the value the kernel updates every tick: ~4 ns to read, against ~20 ns
 * for CLOCK_MONOTONIC). Calls are armed and timed with it; the hook compares the precise clock
 * with a deadline one coarse resolution later than the budget asks, so a call always gets at
 * least its budget (and at most one tick more). */
static uint64_t coarse_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Arms the budget for one call; returns its (coarse) start time. */
static uint64_t arm(struct lstate *s, uint64_t budget_ns)
{
    s->timed_out = 0;
    s->cpu_limit_ns = 0;
    s->grace_ns = budget_ns / GRACE_DIV;
    uint64_t now = coarse_ns();
    s->deadline_ns = budget_ns ? now + budget_ns + s->fv.rt->coarse_res_ns : 0;
    if (budget_ns != 0 && now - s->cpu_sample_wall_ns > budget_ns) {
        s->cpu_sample_ns = thread_cpu_ns(); /* ~0.4 us, at most once per budget of wall time */
        s->cpu_sample_wall_ns = now;
    }
    return now;
}

/* The error text of a failed call (on the stack top) or of a swallowed timeout. */
static void call_error(struct lstate *s, int rc, int status, char *err, size_t err_len)
{
    if (rc != 0) {
        const char *msg = lua_tostring(s->L, -1);
        if (status == KVR_LUA_ETIMEDOUT && (msg == NULL || strstr(msg, "time budget") == NULL))
            copy_err(err, err_len, "time budget exceeded");
        else
            copy_err(err, err_len, msg);
    } else { /* timed out, yet the policy swallowed every error */
        copy_err(err, err_len, "time budget exceeded (the policy caught the timeout error)");
    }
}

/* lua_pcall for the call in progress, marked in the VM's watch record (the watchdog sees it
 * open) and, when s->stoppable, armed so the stop signal's handler can interrupt compiled code
 * (watchdog.c). Returns lua_pcall's code, or RC_STOPPED after an interrupt (the state is then
 * unusable: s->stopped). */
#define RC_STOPPED (-1)
static int guarded_pcall(struct lstate *s, int nargs, int nres, int errfunc)
{
    struct vm_watch *w = s->watch;
    if (w == NULL)
        return lua_pcall(s->L, nargs, nres, errfunc);
    uint64_t seq = atomic_load_explicit(&w->seq, memory_order_relaxed);
    atomic_store_explicit(&w->st, s, memory_order_relaxed);
    atomic_store_explicit(&w->policy_id, s->fv.policy_id, memory_order_relaxed);
    atomic_store_explicit(&w->seq, seq + 1, memory_order_relaxed); /* odd: in a call */
    atomic_signal_fence(memory_order_seq_cst);
    if (s->stoppable) {
        if (sigsetjmp(s->jb, 0) != 0) {
            /* Interrupted in compiled code by the watchdog's signal (its handler jumped here
             * with the signal blocked). Nothing of this state may run again. */
            watch_unblock(s->fv.rt->cfg.stop_signal);
            atomic_store_explicit(&w->seq, seq + 2, memory_order_relaxed);
            return RC_STOPPED;
        }
        s->jb_armed = 1;
        atomic_signal_fence(memory_order_seq_cst);
    }
    int rc = lua_pcall(s->L, nargs, nres, errfunc);
    s->jb_armed = 0;
    atomic_signal_fence(memory_order_seq_cst);
    atomic_store_explicit(&w->seq, seq + 2, memory_order_relaxed); /* even: idle */
    return rc;
}

/* The outcome of an interrupted call. */
static int stopped_call(struct lstate *s, char *err, size_t err_len)
{
    s->deadline_ns = 0;
    atomic_fetch_add(&s->fv.rt->stopped_total, 1);
    copy_err(err, err_len,
             "time budget exceeded: the call ran past the watchdog's hard limit in compiled code "
             "and was interrupted (this thread's Lua state is discarded and rebuilt)");
    return KVR_LUA_ETIMEDOUT;
}

int lstate_pcall(struct lstate *s, int nargs, int nres, uint64_t budget_ns, char *err,
                 size_t err_len)
{
    uint64_t elapsed;
    return lstate_pcall_timed(s, nargs, nres, budget_ns, err, err_len, &elapsed);
}

/* One protected call of the function below its nargs arguments, errfunc the traceback handler:
 * armed, timed (*elapsed_ns), disarmed. On failure the message goes to err and the stack is cut
 * to err_top (a full GC after a memory error); an interrupted call returns at once (the state is
 * unusable). On KVR_LUA_OK the nres results are on the stack. */
static int timed_call(struct lstate *s, int nargs, int nres, int errfunc, int err_top,
                      uint64_t budget_ns, uint64_t *elapsed_ns, char *err, size_t err_len)
{
    lua_State *L = s->L;
    uint64_t t0 = arm(s, budget_ns);
    int rc = guarded_pcall(s, nargs, nres, errfunc);
    *elapsed_ns = coarse_ns() - t0;
    if (rc == RC_STOPPED)
        return stopped_call(s, err, err_len);
    int status = map_rc(s, rc);
    disarm(s);
    if (status != KVR_LUA_OK) {
        call_error(s, rc, status, err, err_len);
        lua_settop(L, err_top);
        if (status == KVR_LUA_ERRMEM)
            lua_gc(L, LUA_GCCOLLECT, 0);
    }
    return status;
}

int lstate_pcall_timed(struct lstate *s, int nargs, int nres, uint64_t budget_ns, char *err,
                       size_t err_len, uint64_t *elapsed_ns)
{
    lua_State *L = s->L;
    int base = lua_gettop(L) - nargs; /* the function */
    lua_rawgeti(L, LUA_REGISTRYINDEX, s->refs[REF_TRACEBACK]);
    lua_insert(L, base);
    int status = timed_call(s, nargs, nres, base, base - 1, budget_ns, elapsed_ns, err, err_len);
    if (status == KVR_LUA_OK)
        lua_remove(L, base);
    return status;
}

int lstate_decide(struct lstate *s, uint64_t budget_ns, size_t *n_ranked, uint64_t *elapsed_ns,
                  char *err, size_t err_len)
{
    lua_State *L = s->L;
    *n_ranked = 0;
    lua_pushvalue(L, FIX_DECIDE); /* the stack holds FIX_TRACEBACK, FIX_DECIDE (lstate_new) */
    int status = timed_call(s, 0, 2, FIX_TRACEBACK, FIX_N, budget_ns, elapsed_ns, err, err_len);
    if (status == KVR_LUA_OK) {
        lua_Integer k = lua_tointeger(L, -2);
        if (k > 0 && (uint64_t)k <= s->call.out_cap) {
            *n_ranked = (size_t)k;
        } else {
            const char *why = k > 0 ? "the choice names no valid candidate" : lua_tostring(L, -1);
            status = KVR_LUA_INVALID;
            copy_err(err, err_len, why ? why : "invalid choice");
        }
        lua_settop(L, FIX_N);
    }
    return status;
}

/* ==== library modules ======================================================================== */

/* Source of a kvr library module: lib_dir/kvr/NAME.lua when configured, else embedded. The
 * returned buffer is owned by the caller when *owned. */
static const char *module_source(kvr_lua_runtime_t *rt, const char *mod, size_t *len, int *owned,
                                 char *err, size_t err_len)
{
    *owned = 0;
    if (rt->cfg.lib_dir != NULL && strcmp(mod, "kvr.cdef") != 0) {
        char path[1024];
        snprintf(path, sizeof(path), "%s/kvr/%s.lua", rt->cfg.lib_dir, mod + 4);
        FILE *f = fopen(path, "rb");
        if (f == NULL) {
            snprintf(err, err_len, "cannot open %s: %s", path, strerror(errno));
            return NULL;
        }
        char *buf = NULL;
        size_t n = 0, cap = 0;
        for (;;) {
            if (n == cap) {
                char *b = realloc(buf, cap ? cap * 2 : 65536);
                if (b == NULL) {
                    free(buf);
                    fclose(f);
                    snprintf(err, err_len, "out of memory reading %s", path);
                    return NULL;
                }
                buf = b;
                cap = cap ? cap * 2 : 65536;
            }
            size_t r = fread(buf + n, 1, cap - n, f);
            n += r;
            if (r == 0)
                break;
        }
        fclose(f);
        *len = n;
        *owned = 1;
        return buf;
    }
    const struct kvr_lua_embedded *e = embedded_find(mod);
    if (e == NULL) {
        snprintf(err, err_len, "embedded module %s missing", mod);
        return NULL;
    }
    *len = e->len;
    return e->data;
}

struct setup_ctx {
    struct lstate *s;
    kvr_lua_runtime_t *rt;
    uint64_t seed;
    int admin;
    char *err;
    size_t err_len;
    int failed;
};

static int load_module(lua_State *L, struct setup_ctx *c, int lib, const char *mod,
                       const char *chunkname)
{
    const struct lib_bc *bc = &c->rt->lib_bc[lib];
    if (bc->p != NULL) { /* compiled once per runtime */
        if (luaL_loadbufferx(L, bc->p, bc->len, chunkname, "b") != 0) {
            copy_err(c->err, c->err_len, lua_tostring(L, -1));
            return -1;
        }
        return 0;
    }
    size_t len;
    int owned;
    const char *src = module_source(c->rt, mod, &len, &owned, c->err, c->err_len);
    if (src == NULL)
        return -1;
    int rc = luaL_loadbuffer(L, src, len, chunkname);
    if (owned)
        free((char *)src);
    if (rc != 0) {
        copy_err(c->err, c->err_len, lua_tostring(L, -1));
        return -1;
    }
    return 0;
}

int lstate_compile_library(kvr_lua_runtime_t *rt, char *err, size_t err_len)
{
    if (rt->cfg.lib_dir != NULL)
        return KVR_LUA_OK; /* development: re-read the files for every state */
    static const struct {
        const char *mod, *name;
    } libs[] = {{"kvr.core", "kvr/core"}, {"kvr.policy", "kvr/policy"}};
    for (int i = 0; i < 2; i++) {
        size_t len;
        int owned; /* never: without lib_dir the source is the embedded copy */
        const char *src = module_source(rt, libs[i].mod, &len, &owned, err, err_len);
        if (src == NULL)
            return KVR_LUA_ERRRUN;
        int st =
            lua_compile(libs[i].name, src, len, &rt->lib_bc[i].p, &rt->lib_bc[i].len, err, err_len);
        if (owned)
            free((char *)src);
        if (st != KVR_LUA_OK)
            return st;
    }
    return KVR_LUA_OK;
}

/* note_trace(addr, size): kvr/policy.lua reports each compiled trace's machine code (jit.attach
 * "trace" events; (0, 0) after a flush). The stop signal's handler only interrupts code in these
 * ranges. Touching ranges are merged; beyond MC_RANGES, traces are not recorded (they cannot be
 * interrupted; never guessed). */
static int note_trace(lua_State *L)
{
    void *ud;
    lua_getallocf(L, &ud);
    struct lstate *s = ud;
    lua_Number a = lua_tonumber(L, 1), n = lua_tonumber(L, 2);
    if (n <= 0) {
        s->n_mc = 0;
        return 0;
    }
    uintptr_t lo = (uintptr_t)a, hi = lo + (uintptr_t)n;
    int k = s->n_mc;
    for (int i = 0; i < k; i++)
        if (lo <= s->mc_hi[i] && hi >= s->mc_lo[i]) { /* overlaps or touches: widen (lo first,
                                                          so the range only ever grows) */
            if (lo < s->mc_lo[i])
                s->mc_lo[i] = lo;
            if (hi > s->mc_hi[i])
                s->mc_hi[i] = hi;
            return 0;
        }
    if (k < MC_RANGES) {
        s->mc_lo[k] = lo;
        s->mc_hi[k] = hi;
        atomic_signal_fence(memory_order_seq_cst);
        s->n_mc = k + 1; /* published after the entry (the handler may read at any point) */
    }
    return 0;
}

/* Runs inside lua_cpcall: everything here may raise (allocation) without reaching the panic. */
static int setup(lua_State *L)
{
    struct setup_ctx *c = lua_touserdata(L, 1);
    struct lstate *s = c->s;
    sandbox_open_libs(L);
    lua_pushcfunction(L, traceback);
    s->refs[REF_TRACEBACK] = luaL_ref(L, LUA_REGISTRYINDEX);
    int tb = lua_gettop(L) + 1;
    lua_rawgeti(L, LUA_REGISTRYINDEX, s->refs[REF_TRACEBACK]);

    /* opts = {admin, seed, version}, shared by both modules */
    lua_createtable(L, 0, 4);
    lua_pushboolean(L, c->admin);
    lua_setfield(L, -2, "admin");
    lua_pushnumber(L, (lua_Number)(c->seed & 0x1fffffffffffffull));
    lua_setfield(L, -2, "seed");
    lua_pushstring(L, "kvrouter " KVR_VERSION);
    lua_setfield(L, -2, "version");
    int opts = lua_gettop(L);
    /* jit.util (bytecode constants: which candidate fields a policy reads), for trusted code. */
    lua_getfield(L, LUA_REGISTRYINDEX, "_PRELOAD");
    if (lua_istable(L, -1)) {
        lua_getfield(L, -1, "jit.util");
        if (lua_isfunction(L, -1)) {
            lua_pushstring(L, "jit.util");
            lua_call(L, 1, 1);
            lua_setfield(L, opts, "jit_util");
            if (c->rt->cfg.stop_signal != 0) { /* record compiled code for the watchdog */
                lua_pushcfunction(L, note_trace);
                lua_setfield(L, opts, "note_trace");
            }
        } else {
            lua_pop(L, 1);
        }
    }
    lua_pop(L, 1);

    /* kvr.core (ffi, api, vm, call, cdef, opts) */
    if (load_module(L, c, LIB_CORE, "kvr.core", "@kvr/core.lua") != 0)
        goto fail;
    lua_getfield(L, LUA_REGISTRYINDEX, "kvr.ffi");
    lua_pushlightuserdata(L, (void *)kvr_ffi_api());
    lua_pushlightuserdata(L, &s->fv);
    lua_pushlightuserdata(L, &s->call);
    const struct kvr_lua_embedded *cdef = embedded_find("kvr.cdef");
    lua_pushlstring(L, cdef->data, cdef->len);
    lua_pushvalue(L, opts);
    if (lua_pcall(L, 6, 1, tb) != 0) {
        copy_err(c->err, c->err_len, lua_tostring(L, -1));
        goto fail;
    }
    int core = lua_gettop(L);

    /* kvr.policy (core, opts) */
    if (load_module(L, c, LIB_POLICY, "kvr.policy", "@kvr/policy.lua") != 0)
        goto fail;
    lua_pushvalue(L, core);
    lua_pushvalue(L, opts);
    if (lua_pcall(L, 2, 1, tb) != 0) {
        copy_err(c->err, c->err_len, lua_tostring(L, -1));
        goto fail;
    }
    static const struct {
        int ref;
        const char *name;
    } fns[] = {{REF_ADD, "add_policy"},
               {REF_DECIDE, "decide"},
               {REF_RESPOND, "respond"},
               {REF_EVENT, "event"},
               {REF_SELFTEST, "selftest"}};
    lua_pushvalue(L, -1);
    lua_setfield(L, LUA_REGISTRYINDEX, "kvr.R"); /* for operator scripts (R.script) */
    for (size_t i = 0; i < sizeof(fns) / sizeof(fns[0]); i++) {
        lua_getfield(L, -1, fns[i].name);
        if (!lua_isfunction(L, -1)) {
            snprintf(c->err, c->err_len, "kvr.policy lacks %s", fns[i].name);
            goto fail;
        }
        s->refs[fns[i].ref] = luaL_ref(L, LUA_REGISTRYINDEX);
    }
    /* The trusted code has captured what it needs; drop what no code should reach any more. */
    static const char *const drop[] = {"load",    "loadstring", "loadfile", "dofile",
                                       "require", "module",     "getfenv",  "setfenv",
                                       "jit",     "newproxy",   "gcinfo",   "collectgarbage"};
    for (size_t i = 0; i < sizeof(drop) / sizeof(drop[0]); i++) {
        lua_pushnil(L);
        lua_setfield(L, LUA_GLOBALSINDEX, drop[i]);
    }
    lua_settop(L, 0);
    return 0;
fail:
    c->failed = 1;
    lua_settop(L, 0);
    return 0;
}

int lstate_new(kvr_lua_runtime_t *rt, struct kvr_lua_vm *vm, int admin, uint64_t seed,
               struct lstate **out, char *err, size_t err_len)
{
    struct lstate *s = calloc(1, sizeof(*s));
    if (s == NULL) {
        copy_err(err, err_len, "out of memory");
        return KVR_LUA_ERRMEM;
    }
    s->cap = rt->cfg.mem_limit;
    s->hook_count = rt->cfg.hook_instructions;
    for (int i = 0; i < REF_N; i++)
        s->refs[i] = LUA_NOREF;
    s->fv = (struct kvr_ffi_vm){.rt = rt, .vm = vm, .st = s, .policy_id = 0, .admin = admin};
    s->watch = vm != NULL ? vm->watch : NULL;
    s->call.vm = &s->fv;
    s->call.out_cap = 1;
    s->L = lua_newstate(lalloc, s);
    if (s->L == NULL) {
        free(s);
        copy_err(err, err_len, "cannot create a Lua state (memory cap too small?)");
        return KVR_LUA_ERRMEM;
    }
    lua_atpanic(s->L, panic);
    char msg[ERR_CAP] = "";
    struct setup_ctx c = {s, rt, seed, admin, msg, sizeof(msg), 0};
    int rc = lua_cpcall(s->L, setup, &c);
    if (rc != 0 || c.failed) {
        int status = rc == LUA_ERRMEM ? KVR_LUA_ERRMEM : KVR_LUA_ERRRUN;
        if (rc != 0)
            copy_err(msg, sizeof(msg), lua_tostring(s->L, -1));
        copy_err(err, err_len, msg);
        lstate_free(s);
        return status;
    }
    lua_sethook(s->L, budget_hook, LUA_MASKCOUNT, (int)s->hook_count);
    /* The fixed bottom of the stack, for the hot path (lstate_decide): no registry lookups and
     * no stack shuffling per decision. LUA_MINSTACK free slots are guaranteed: cannot raise. */
    lua_settop(s->L, 0);
    lua_rawgeti(s->L, LUA_REGISTRYINDEX, s->refs[REF_TRACEBACK]);
    lua_rawgeti(s->L, LUA_REGISTRYINDEX, s->refs[REF_DECIDE]);
    *out = s;
    return KVR_LUA_OK;
}

void lstate_free(struct lstate *s)
{
    if (s == NULL)
        return;
    if (s->L != NULL)
        lua_close(s->L);
    free(s->hooks);
    free(s);
}

/* ==== policies =============================================================================== */

struct add_ctx {
    struct lstate *s;
    const struct policy_def *p;
    size_t slot;
    int from_source, jit_on;
    uint64_t budget_ns;
    char *err;
    size_t err_len;
    int status;
    unsigned hooks;
};

static int add_policy_cp(lua_State *L)
{
    struct add_ctx *c = lua_touserdata(L, 1);
    struct lstate *s = c->s;
    const struct policy_def *p = c->p;
    lua_settop(L, 0);
    lua_rawgeti(L, LUA_REGISTRYINDEX, s->refs[REF_ADD]);
    lua_pushinteger(L, (lua_Integer)c->slot);
    lua_pushstring(L, p->name);
    char chunkname[NAME_CAP + 8];
    snprintf(chunkname, sizeof(chunkname), "@%s.lua", p->name);
    int rc = c->from_source ? luaL_loadbufferx(L, p->source, p->source_len, chunkname, "t")
                            : luaL_loadbufferx(L, p->bytecode, p->bytecode_len, chunkname, "b");
    if (rc != 0) {
        c->status = rc == LUA_ERRMEM ? KVR_LUA_ERRMEM : KVR_LUA_ERRSYNTAX;
        copy_err(c->err, c->err_len, lua_tostring(L, -1));
        lua_settop(L, 0);
        return 0;
    }
    luaJIT_setmode(L, -1, LUAJIT_MODE_ALLFUNC | (c->jit_on ? LUAJIT_MODE_ON : LUAJIT_MODE_OFF));
    lua_pushboolean(L, (p->flags & KVR_LUA_TRUSTED) != 0);
    c->status = lstate_pcall(s, 4, 1, c->budget_ns, c->err, c->err_len);
    if (c->status == KVR_LUA_OK)
        c->hooks = (unsigned)lua_tointeger(L, -1);
    lua_settop(L, 0);
    return 0;
}

int lstate_add_policy(struct lstate *s, const struct policy_def *p, size_t slot, int from_source,
                      int jit_on, uint64_t budget_ns, char *err, size_t err_len)
{
    if (slot >= s->n_slots) {
        unsigned *h = realloc(s->hooks, (slot + 1) * sizeof(*h));
        if (h == NULL) {
            copy_err(err, err_len, "out of memory");
            return KVR_LUA_ERRMEM;
        }
        for (size_t i = s->n_slots; i <= slot; i++)
            h[i] = 0;
        s->hooks = h;
        s->n_slots = slot + 1;
    }
    struct add_ctx c = {s, p, slot, from_source, jit_on, budget_ns, err, err_len, KVR_LUA_OK, 0};
    s->fv.policy_id = p->id;
    int rc = lua_cpcall(s->L, add_policy_cp, &c);
    if (rc != 0) {
        copy_err(err, err_len, rc == LUA_ERRMEM ? "not enough memory" : lua_tostring(s->L, -1));
        lua_settop(s->L, FIX_N);
        disarm(s);
        return rc == LUA_ERRMEM ? KVR_LUA_ERRMEM : KVR_LUA_ERRRUN;
    }
    if (c.status == KVR_LUA_OK)
        s->hooks[slot] = c.hooks;
    return c.status;
}

int lstate_build(kvr_lua_runtime_t *rt, struct kvr_lua_vm *vm, const struct policy_set *set,
                 uint64_t seed, struct lstate **out, char *err, size_t err_len)
{
    struct lstate *s = NULL;
    int st = lstate_new(rt, vm, 0, seed, &s, err, err_len);
    if (st != KVR_LUA_OK)
        return st;
    for (size_t i = 0; i < set->n; i++) {
        const struct policy_def *p = &set->p[i];
        char msg[ERR_CAP];
        st = lstate_add_policy(s, p, i, 0, (p->flags & KVR_LUA_TRUSTED) != 0,
                               rt->cfg.load_budget_ns, msg, sizeof(msg));
        if (st != KVR_LUA_OK) {
            snprintf(err, err_len, "policy %s: %s", p->name, msg);
            lstate_free(s);
            return st;
        }
    }
    lua_gc(s->L, LUA_GCCOLLECT, 0);
    *out = s;
    return KVR_LUA_OK;
}

/* ==== compile to bytecode ==================================================================== */

struct growbuf {
    char *p;
    size_t n, cap;
    int oom;
};

static int writer(lua_State *L, const void *data, size_t len, void *ud)
{
    (void)L;
    struct growbuf *b = ud;
    if (b->n + len > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap < b->n + len)
            cap *= 2;
        char *q = realloc(b->p, cap);
        if (q == NULL) {
            b->oom = 1;
            return 1;
        }
        b->p = q;
        b->cap = cap;
    }
    memcpy(b->p + b->n, data, len);
    b->n += len;
    return 0;
}

int lua_compile(const char *name, const char *src, size_t len, char **bc, size_t *bc_len, char *err,
                size_t err_len)
{
    struct lstate tmp;
    memset(&tmp, 0, sizeof(tmp));
    tmp.cap = (size_t)64 << 20;
    lua_State *L = lua_newstate(lalloc, &tmp);
    if (L == NULL) {
        copy_err(err, err_len, "out of memory");
        return KVR_LUA_ERRMEM;
    }
    lua_atpanic(L, panic);
    char chunkname[NAME_CAP + 8];
    snprintf(chunkname, sizeof(chunkname), "@%s.lua", name);
    int rc = luaL_loadbufferx(L, src, len, chunkname, "t");
    if (rc != 0) {
        copy_err(err, err_len, lua_tostring(L, -1));
        lua_close(L);
        return rc == LUA_ERRMEM ? KVR_LUA_ERRMEM : KVR_LUA_ERRSYNTAX;
    }
    struct growbuf b = {NULL, 0, 0, 0};
    rc = lua_dump(L, writer, &b);
    lua_close(L);
    if (rc != 0 || b.oom) {
        free(b.p);
        copy_err(err, err_len, "cannot dump bytecode (out of memory)");
        return KVR_LUA_ERRMEM;
    }
    *bc = b.p;
    *bc_len = b.n;
    return KVR_LUA_OK;
}
