/* internal.h - shared internals of kvr_lua (not installed; lua/src only).
 * SPDX-License-Identifier: Apache-2.0
 *
 *   kvr_lua_runtime ── set ──▶ policy_set (immutable, refcounted; one per generation)
 *        │                       p[slot] = policy_def {name, id, flags, source, bytecode}
 *        │                       bind[] = model -> slot, default_slot
 *        ├── names[id]  (stable per policy name: counters survive reloads)
 *        └── vms ──▶ kvr_lua_vm ── st ──▶ lstate {lua_State, allocator, deadline, refs,
 *                                                 kvr_ffi_vm (handed to Lua), kvr_ffi_call}
 */
#ifndef KVR_LUA_INTERNAL_H
#define KVR_LUA_INTERNAL_H

#include <lauxlib.h>
#include <lua.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "kvr/lua.h"

#define NAME_CAP (KVR_LUA_NAME_MAX + 1)
#define ERR_CAP 4096
/* Budget rules (kvr/lua.h "Time budget"): past the wall-clock budget a call gets a grace of
 * budget / GRACE_DIV of its OWN thread CPU time (so a preempted thread is not blamed); a call
 * that returns having used more than HARD_FACTOR x budget of thread CPU time (compiled code, a
 * long C call: nothing could interrupt it) is discarded at the boundary. */
#define GRACE_DIV 2u
#define HARD_FACTOR 5u

/* ==== policy sets ============================================================================ */

struct policy_def {
    char name[NAME_CAP];
    uint32_t id;    /* stable id of the name (runtime names[]) */
    unsigned flags; /* KVR_LUA_TRUSTED */
    char *source;   /* owned copy */
    size_t source_len;
    char *bytecode; /* owned: lua_dump of the validated chunk */
    size_t bytecode_len;
};

struct binding {
    char model[NAME_CAP]; /* "" never stored: the default lives in default_slot */
    size_t model_len;
    int slot;
};

struct policy_set {
    atomic_uint refs;
    uint64_t generation;
    size_t n; /* policies: p[0..n) (slot = index) */
    struct policy_def *p;
    size_t n_bind;
    struct binding *bind;
    int default_slot; /* -1: none */
};

/* A new empty set (refs 1) or NULL. */
struct policy_set *set_new(void);
/* A deep copy of s with refs 1, or NULL. */
struct policy_set *set_copy(const struct policy_set *s);
void set_ref(struct policy_set *s);
void set_unref(struct policy_set *s);
/* Slot of a policy by name (pointer + length), or -1. */
int set_find(const struct policy_set *s, const char *name, size_t len);
/* Frees a definition's source and bytecode. */
void def_clear(struct policy_def *p);

/* ==== Lua states ============================================================================= */

struct lstate;

/* ==== the watchdog (watchdog.c) ===============================================================
 *
 * A VM's watch record: the VM's thread marks every Lua call it makes (seq odd while inside one);
 * the control thread's kvr_lua_runtime_watchdog sees a call that stays open across passes for
 * longer than the hard limit, reports it and, with a stop signal configured, queues the signal
 * to the thread (pthread_sigqueue, the record as the value). The handler runs on that thread;
 * if the call is still the one reported, may be interrupted (a trusted policy's call, armed with
 * sigsetjmp) and the interrupted instruction is in the state's compiled code (an address inside
 * one of its traces: no C function is running, so no lock or allocator is held), it jumps back
 * to the call site; the state is then discarded and rebuilt. Anywhere else (interpreter, C) it
 * returns and the next pass tries again; interpreted code is stopped by the count hook anyway.
 * Records are never freed before the runtime (recycled), so a late signal never reads freed
 * memory. */
struct vm_watch {
    struct vm_watch *next;       /* runtime list (under rt->mu) */
    int in_use;                  /* a VM owns it (under rt->mu) */
    pthread_t thread;            /* that VM's thread */
    uint64_t vm_id;              /* for the log */
    atomic_ullong seq;           /* odd: inside a Lua call (written by the VM's thread only) */
    atomic_uint policy_id;       /* name id of the policy of the current call */
    _Atomic(struct lstate *) st; /* the state of the current call */
    atomic_ullong kill_seq;      /* the call the watchdog asked to stop */
    uint64_t seen_seq, seen_ns;  /* watchdog only (under rt->mu): call seen open since seen_ns */
    int reported;                /* watchdog only: this call was logged and counted */
};

#define MC_RANGES 256 /* compiled-code ranges (traces) remembered per state */

/* What Lua's kvr_ffi_vm_t points at (opaque to Lua). */
struct kvr_ffi_vm {
    kvr_lua_runtime_t *rt;
    struct kvr_lua_vm *vm; /* NULL for scratch states */
    struct lstate *st;
    uint32_t policy_id; /* name id of the policy running now (counters, logs) */
    int admin;          /* operator script: kvr.admin allowed */
};

enum lstate_ref { REF_TRACEBACK, REF_ADD, REF_DECIDE, REF_RESPOND, REF_EVENT, REF_SELFTEST, REF_N };

/* The bottom of every state's stack between calls (pushed by lstate_new): whoever runs Lua at
 * the state's base level leaves the stack at FIX_N. */
enum lstate_fixed { FIX_TRACEBACK = 1, FIX_DECIDE = 2, FIX_N = 2 };

struct lstate {
    lua_State *L;
    size_t used, cap, peak; /* allocator accounting (bytes) */
    uint64_t oom_refusals;  /* allocations refused by the cap */
    uint64_t allocated;     /* bytes ever allocated or grown into (monotonic) */
    uint64_t deadline_ns;   /* wall-clock budget end; 0: no deadline armed */
    uint64_t grace_ns;      /* thread CPU time allowed past deadline_ns */
    uint64_t cpu_limit_ns;  /* thread CPU time limit once in grace; 0: not yet */
    uint64_t cpu_sample_ns; /* thread CPU time at cpu_sample_wall_ns (refreshed per budget) */
    uint64_t cpu_sample_wall_ns;
    int timed_out;       /* the budget was exceeded during the current call */
    uint32_t hook_count; /* count-hook period */
    int refs[REF_N];     /* registry references (luaL_ref) */
    unsigned *hooks;     /* per slot: the hook bits R.add_policy returned */
    size_t n_slots;
    struct kvr_ffi_vm fv;
    struct kvr_ffi_call call;
    struct vm_watch *watch;         /* the VM's watch record (NULL: scratch state) */
    int stoppable;                  /* the next call may be interrupted (set per call) */
    volatile sig_atomic_t jb_armed; /* jb is live: the call is inside guarded_pcall */
    volatile sig_atomic_t stopped;  /* the watchdog interrupted it: discard this state */
    sigjmp_buf jb;                  /* where an interrupted call lands */
    volatile sig_atomic_t n_mc;     /* mc_lo/mc_hi entries in use */
    uintptr_t mc_lo[MC_RANGES];     /* [lo, hi): machine code of this state's traces */
    uintptr_t mc_hi[MC_RANGES];
};

/* Creates a state with the libraries, kvr.core and kvr.policy loaded and the hook installed.
 * vm may be NULL (scratch). Returns a kvr_lua_status; err receives the message. */
int lstate_new(kvr_lua_runtime_t *rt, struct kvr_lua_vm *vm, int admin, uint64_t seed,
               struct lstate **out, char *err, size_t err_len);
void lstate_free(struct lstate *s);

/* Loads policy p into slot from its bytecode (or, when from_source, compiles its source),
 * with the JIT off for all of its functions unless jit_on, and runs the chunk in a fresh sandbox
 * under budget_ns. Returns a kvr_lua_status; err receives the message. */
int lstate_add_policy(struct lstate *s, const struct policy_def *p, size_t slot, int from_source,
                      int jit_on, uint64_t budget_ns, char *err, size_t err_len);

/* Calls the function below its nargs arguments on the stack through the traceback handler with
 * a deadline of budget_ns (0: none). On KVR_LUA_OK leaves nres results on the stack; otherwise
 * leaves nothing and copies the message to err. Maps the outcome to a kvr_lua_status. */
int lstate_pcall(struct lstate *s, int nargs, int nres, uint64_t budget_ns, char *err,
                 size_t err_len);
/* As lstate_pcall; *elapsed_ns receives the wall time the call took (coarse clock: its tick
 * resolution, e.g. 4 ms; sums over many calls are unbiased). */
int lstate_pcall_timed(struct lstate *s, int nargs, int nres, uint64_t budget_ns, char *err,
                       size_t err_len, uint64_t *elapsed_ns);

/* Points s->call at a request: its numbers copied, n candidates, up to out_cap ranked entries
 * (clamped to 1..KVR_FFI_RANKED_MAX). The slot and the other pointers are the caller's. */
static inline void lstate_set_request(struct lstate *s, const struct kvr_ffi_request *req,
                                      const struct kvr_ffi_candidate *cands, size_t n,
                                      size_t out_cap)
{
    struct kvr_ffi_call *c = &s->call;
    c->req = req;
    c->cands = cands;
    c->n = (uint32_t)n;
    if (out_cap > n)
        out_cap = n;
    if (out_cap > KVR_FFI_RANKED_MAX)
        out_cap = KVR_FFI_RANKED_MAX;
    c->out_cap = out_cap ? (uint32_t)out_cap : 1;
    c->overlap_weight = req->overlap_weight;
    c->temperature = req->temperature;
    c->tokens = req->tokens;
    c->blocks = req->blocks;
    c->block_size = req->block_size;
    c->priority = req->priority;
}

/* One decision through the state's fixed stack slots (the hot path): runs R.decide for
 * s->call (set with lstate_set_request, slot set) under budget_ns. KVR_LUA_OK with *n_ranked
 * (1..out_cap) entries in s->call.ranked; else the status (INVALID when the choice was refused)
 * with the message in err. *elapsed_ns as lstate_pcall_timed. Base level only. */
int lstate_decide(struct lstate *s, uint64_t budget_ns, size_t *n_ranked, uint64_t *elapsed_ns,
                  char *err, size_t err_len);

/* 1 if the current call has exhausted its budget (then it stays exhausted until disarmed):
 * wall-clock deadline passed, then its grace of thread CPU time used up, or the hard stop.
 * Used by the count hook and by every kvr_ffi_* engine call. */
int lstate_over_budget(struct lstate *s);

/* 1 if a call that returned normally after elapsed_ns (wall) must still be discarded as an
 * overrun: it used more than HARD_FACTOR x budget_ns of its thread's CPU time (measured against
 * a CPU sample refreshed at most once per budget, so preemption is never blamed). Call right
 * after the call. */
int lstate_overran(struct lstate *s, uint64_t elapsed_ns, uint64_t budget_ns);

/* Builds a complete state for a set (every policy loaded from bytecode). */
int lstate_build(kvr_lua_runtime_t *rt, struct kvr_lua_vm *vm, const struct policy_set *set,
                 uint64_t seed, struct lstate **out, char *err, size_t err_len);

/* Compiles source into bytecode (owned, free()) in a throwaway plain state. Returns a
 * kvr_lua_status (ERRSYNTAX with "name.lua:LINE: ..." in err). */
int lua_compile(const char *name, const char *src, size_t len, char **bc, size_t *bc_len, char *err,
                size_t err_len);

/* Opens the libraries the runtime needs and nothing else (sandbox.c). Runs in protected mode. */
int sandbox_open_libs(lua_State *L);

/* ==== runtime and VMs ======================================================================== */

struct pname {
    char name[NAME_CAP];
    uint64_t reloads, rejected, generation;
    int trusted, live;
};

struct ucounter {
    uint32_t policy_id;
    char name[NAME_CAP];
};

/* Counters one VM keeps per policy name id (single writer: the VM's thread). */
struct vm_pcounters {
    atomic_ullong decisions, ok, errors, timeouts, oom, invalid, fallbacks, hook_errors, lua_ns;
};

struct kvr_lua_vm {
    kvr_lua_runtime_t *rt;
    struct kvr_lua_vm *next; /* runtime list (under rt->mu) */
    uint64_t id;
    struct vm_watch *watch;  /* its watch record (runtime-owned) */
    struct lstate *st;       /* live state; NULL after a discarded one could not be rebuilt */
    struct policy_set *set;  /* its set (a reference) */
    atomic_ullong live_gen;  /* generation of st */
    uint64_t retry_after_ns; /* failed build: no retry before */
    char build_err[256];     /* last build failure (under rt->mu) */
    struct kvr_lua_vm_config vcfg;
    struct kvr_fallback_rng rng;
    const struct kvr_lua_engine *engine; /* per-call engine (kvr_lua_vm_set_engine) or NULL */
    struct vm_pcounters pc[KVR_LUA_MAX_POLICIES];
    atomic_ullong user[KVR_LUA_MAX_COUNTERS];
    uint64_t last_log_ns[KVR_LUA_MAX_POLICIES];
    uint32_t suppressed[KVR_LUA_MAX_POLICIES];
    char err[ERR_CAP]; /* last error text (decision.error) */
};

struct kvr_lua_runtime {
    struct kvr_lua_config cfg;
    pthread_mutex_t mu;
    pthread_cond_t cond;
    pthread_mutex_t install_mu; /* serializes installs (validation runs outside mu) */
    struct policy_set *set;     /* current (under mu) */
    atomic_ullong generation;
    struct pname names[KVR_LUA_MAX_POLICIES];
    size_t n_names;
    struct ucounter counters[KVR_LUA_MAX_COUNTERS];
    size_t n_counters;
    uint64_t retired_user[KVR_LUA_MAX_COUNTERS];
    struct vm_pcounters retired[KVR_LUA_MAX_POLICIES]; /* sums of freed VMs */
    struct kvr_lua_vm *vms;
    size_t n_vms;
    uint64_t next_vm_id;
    struct dir_src {
        char name[NAME_CAP];
        char *src;
        size_t len;
    } * dir_cache;
    size_t n_dir_cache;
    /* kvr.core and kvr.policy compiled once (lua_dump) when the embedded copies are used:
     * every state loads bytecode instead of parsing ~1,100 lines (style.md §7). */
    struct lib_bc {
        char *p; /* owned; NULL: compile from source (lib_dir set) */
        size_t len;
    } lib_bc[2];
    struct vm_watch *watches;    /* every watch record ever made (under mu; freed with rt) */
    uint64_t stuck_total;        /* calls the watchdog found over the hard limit (under mu) */
    uint64_t stop_signals;       /* stop signals queued (under mu) */
    size_t stuck_now;            /* VMs over the limit at the last pass (under mu) */
    atomic_ullong stopped_total; /* calls interrupted, their state discarded */
    uint64_t coarse_res_ns;      /* resolution of CLOCK_MONOTONIC_COARSE (read once) */
};

/* Index of a library module in kvr_lua_runtime.lib_bc. */
enum { LIB_CORE = 0, LIB_POLICY = 1 };

/* Compiles the embedded kvr.core and kvr.policy into rt->lib_bc (no-op with cfg.lib_dir).
 * Returns a kvr_lua_status; err receives the message. */
int lstate_compile_library(kvr_lua_runtime_t *rt, char *err, size_t err_len);

/* Monotonic nanoseconds. */
uint64_t kvr_lua_now_ns(void);

/* Watch records (watchdog.c). Claims one for a VM on the calling thread (NULL: out of memory);
 * releases it. Both take rt->mu. */
struct vm_watch *watch_claim(kvr_lua_runtime_t *rt, uint64_t vm_id);
void watch_release(kvr_lua_runtime_t *rt, struct vm_watch *w);
/* Installs the stop signal's handler (cfg.stop_signal != 0). KVR_OK or KVR_EINVAL. */
int watch_install_handler(int sig);
/* Unblocks the stop signal on this thread (after an interrupted call: the handler jumped out
 * with it blocked). */
void watch_unblock(int sig);
/* 1 if pc lies in machine code of s's traces. Async-signal-safe. */
int lstate_in_mcode(const struct lstate *s, uintptr_t pc);

/* Formats and sends a log line (never NULL fmt). Thread-safe. */
void rt_log(kvr_lua_runtime_t *rt, int level, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Name id for a policy name (registering it). -1 when the table is full. Caller holds rt->mu. */
int rt_name_id(kvr_lua_runtime_t *rt, const char *name);

/* 1 if name is a valid policy name (1..63 bytes of [A-Za-z0-9_.-]). */
int rt_valid_name(const char *name, size_t len);

/* Publishes s as the current set (caller holds rt->mu; takes ownership of s); returns the new
 * generation. */
uint64_t rt_publish(kvr_lua_runtime_t *rt, struct policy_set *s);

/* Calls every registered VM's wake callback (caller holds no lock). */
void rt_wake_all(kvr_lua_runtime_t *rt);

/* Counter id for (policy_id, name), registering it. Thread-safe. */
int rt_counter_id(kvr_lua_runtime_t *rt, uint32_t policy_id, const char *name, size_t len);

/* Validates a policy in a scratch state; on success fills p->bytecode. (reload.c) */
int reload_validate(kvr_lua_runtime_t *rt, struct policy_def *p, char *err, size_t err_len);

/* Embedded Lua sources (generated at build time from lua/lib and policies/). */
struct kvr_lua_embedded {
    const char *name; /* "kvr.core", "kvr.policy", "kvr.cdef", "policies/kv_cost", ... */
    const char *data;
    size_t len;
};
extern const struct kvr_lua_embedded kvr_lua_embedded[];
extern const size_t kvr_lua_embedded_count;
/* Looks up an embedded source; NULL if absent. */
const struct kvr_lua_embedded *embedded_find(const char *name);

#endif
