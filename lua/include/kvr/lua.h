/* lua.h - the LuaJIT policy runtime: sandboxed routing policies with budgets and hot reload.
 * SPDX-License-Identifier: Apache-2.0
 *
 * Design.
 *
 *   control thread                                 worker threads (one VM each)
 *   ──────────────                                 ────────────────────────────────────────
 *   kvr_lua_runtime_t  (process-wide)              kvr_lua_vm_t  (created ON its thread)
 *    ├ config: memory cap, time budget, seed        ├ lua_State (counting allocator, cap)
 *    ├ engine handles: index, load, lanes, admin    ├ policies of generation g, sandboxed
 *    ├ registry: name -> {source, bytecode, flags}  ├ reusable req/candidate tables
 *    │  bindings: model -> name, default name       ├ counters (atomics, summed on read)
 *    │  generation g (atomic)                       └ C fallback RNG
 *    └ counters per policy name, user counters
 *
 *   install(name, src) ─▶ compile in a SCRATCH state (syntax errors carry line numbers)
 *                        ─▶ run chunk, selftest(), synthetic decisions (JIT off, budgets)
 *                        ─▶ refused: exact error, nothing changes
 *                        ─▶ accepted: new immutable policy set, g + 1, wake every VM
 *   VM, between requests: sees g' > g ─▶ builds a COMPLETE new lua_State from the set's bytecode
 *                        (never re-runs code in the live one) ─▶ swaps it in, closes the old one
 *                        (a failed build keeps the old state; retried at most once a second)
 *   kvr_lua_runtime_wait(g) returns once every registered VM runs generation >= g.
 *
 * A request: the server fills one struct kvr_ffi_request and an array of struct kvr_ffi_candidate
 * (kvr/ffi.h; kvr_lua_prepare fills overlap and load fields from the bound engine) and calls
 * kvr_lua_vm_select. The policy is chosen by the request's policy header (only when
 * allow_header_policy is set and the name exists), else by the model's binding, else the default
 * binding; none -> the C fallback (status NOPOLICY). The decision is a ranked list of candidate
 * indices (best first, for retries). Whenever Lua fails (error, timeout, memory cap, invalid
 * choice), the built-in classic KV cost (kvr/fallback.h) decides instead; the failure is counted
 * per policy and logged with the script's traceback (rate-limited: one line per second per VM
 * and policy, with a count of the suppressed ones). The router never stops serving.
 *
 * Time budget (THE design decision; measurements in BENCHMARKS.md "Lua policy decisions").
 * LuaJIT checks instruction-count hooks only in the interpreter: a JIT-compiled loop never sees
 * one (unless LuaJIT is built with LUAJIT_ENABLE_CHECKHOOK, which the distro build is not).
 *  - Default ("sandboxed") policies run with the JIT OFF for all of their functions
 *    (luaJIT_setmode ALLFUNC|OFF on the chunk, i.e. jit.off(chunk, true)) under a count hook
 *    that checks the call's budget every hook_instructions instructions. Once the budget is
 *    exhausted the hook re-arms itself at a count of 1, so every further instruction raises: a
 *    pcall inside the policy cannot swallow the timeout. The runtime's own glue (kvr.policy:
 *    filling the candidate tables from FFI cdata, validating the choice) stays JIT-compiled; it
 *    does bounded work (O(candidates)).
 *  - The budget is wall-clock time (a vDSO clock read per hook: ~25 ns) with a preemption
 *    guard: once budget_ns of wall time has passed, the call may still use budget_ns / 2 of its
 *    own thread CPU time (CLOCK_THREAD_CPUTIME_ID, read only past the deadline) before it is
 *    stopped. A runaway policy on an idle machine therefore stops after ~1.5 x budget_ns; a
 *    thread that was merely preempted (however long) is not blamed.
 *  - Policies installed with KVR_LUA_TRUSTED run JIT-compiled (several times faster). A compiled
 *    loop cannot be interrupted by the budget, so trust is an operator decision (never the
 *    script's): the install-time checks still run the policy interpreted under the hook (a
 *    runaway loop is refused before it is ever trusted), every kvr_ffi_* engine call fails once
 *    the budget is exhausted, and the hook still fires whenever the code runs interpreted (trace
 *    exits).
 *  - Every decision is also measured at the C boundary: a decision that used more than 5 x
 *    budget_ns of its thread's CPU time (compiled trusted code, or a C library function such
 *    as table.sort on a huge table, which no hook can interrupt) is discarded (status
 *    ETIMEDOUT, fallback used). The CPU time is read only when the wall time already exceeds
 *    5 x budget_ns, against a sample taken at most once per budget (so ~0.4 us per 10 ms).
 *  - A trusted call that never returns (a loop that stays in its compiled trace) is the
 *    watchdog's ("Stuck calls" below): reported after a hard limit and, with cfg.stop_signal,
 *    interrupted while it executes compiled code; its thread's state is then rebuilt. Lua
 *    string patterns (find with patterns, match, gmatch, gsub) are not available to policies:
 *    their backtracking runs in C and cannot be bounded.
 *  - Clocks: calls are armed and timed with CLOCK_MONOTONIC_COARSE (~4 ns a read); the
 *    deadline is one coarse resolution later than the budget, so a call always gets its full
 *    budget and at most one tick more. The hook compares against CLOCK_MONOTONIC.
 * Memory: each lua_State has its own counting allocator with a cap (lua_newstate; works on GC64
 * LuaJIT). A policy that exceeds it gets LUA_ERRMEM (status ERRMEM, fallback used), then a full GC.
 *
 * Notes for the server (how to wire this in):
 *  - Startup: kvr_lua_config_init, set the engine handles, kvr_lua_runtime_new; install the
 *    policies (kvr_lua_policy_install with the text of --policy FILE, or kvr_lua_builtin_source
 *    for a shipped one, which may be installed KVR_LUA_TRUSTED) and kvr_lua_policy_bind(model,
 *    or NULL for the default: policies/README.md names the default).
 *  - Each worker thread, on itself: kvr_lua_vm_new(rt, &vcfg, &vm) with vcfg.wake = a function
 *    that writes the worker's eventfd (it is called from the control thread after each install);
 *    on that wakeup call kvr_lua_vm_poll(vm). Per request: kvr_lua_prepare (or fill the
 *    candidates yourself), kvr_lua_vm_select, use d.ranked[0], on failure retry with d.ranked[1..].
 *    After the response: kvr_lua_vm_on_response (optional). Before the thread exits:
 *    kvr_lua_vm_free(vm) on the same thread.
 *  - Control thread (POST /admin/policy?model=M, SIGHUP, file watch): kvr_lua_policy_install(...,
 *    &gen, err) -> 4xx {"error": err} when refused; else kvr_lua_policy_bind(rt, M, name, &gen),
 *    kvr_lua_runtime_wait(rt, gen, timeout, err) -> 200 {"generation": gen} when live on every
 *    thread, 5xx with err otherwise. In-flight requests finish on the old state (a VM only swaps
 *    between calls), so reloads under load lose no request.
 *  - KV events: kvr_lua_vm_on_event on a VM whose policies keep their own state (optional).
 *  - Metrics: kvr_lua_policy_stats, kvr_lua_counters_foreach, kvr_lua_runtime_vm_generations.
 *
 * Thread-safety: runtime functions are thread-safe. The registry mutex is never held while Lua
 * runs; installs, removals and bindings are serialized by a second mutex, held during an
 * install's validation (milliseconds). A VM is used only by the thread that created it
 * (kvr_lua_vm_*), except where noted.
 */
#ifndef KVR_LUA_H
#define KVR_LUA_H

#include <stddef.h>
#include <stdint.h>

#include "kvr/event.h"
#include "kvr/fallback.h"
#include "kvr/ffi.h"
#include "kvr/index.h"
#include "kvr/load.h"
#include "kvr/match.h"

typedef struct kvr_lua_runtime kvr_lua_runtime_t;
typedef struct kvr_lua_vm kvr_lua_vm_t;

#define KVR_LUA_MAX_POLICIES 64 /* distinct policy names over the runtime's life */
#define KVR_LUA_MAX_BINDINGS 256
#define KVR_LUA_MAX_COUNTERS 256 /* user counters (kvr.count) over all policies */
#define KVR_LUA_NAME_MAX 63      /* policy / counter / model-binding name bytes */

/* Outcome of one policy call (HAProxy's hlua_exec idea). */
enum kvr_lua_status {
    KVR_LUA_OK = 0,        /* the policy decided */
    KVR_LUA_ERRRUN = 1,    /* the policy raised an error */
    KVR_LUA_ERRMEM = 2,    /* the state's memory cap was hit */
    KVR_LUA_ETIMEDOUT = 3, /* the time budget was exceeded */
    KVR_LUA_INVALID = 4,   /* select returned no candidate, a foreign value or a duplicate */
    KVR_LUA_ERRSYNTAX = 5, /* (install) the source does not compile */
    KVR_LUA_NOPOLICY = 6,  /* no policy applies to the request (fallback by design) */
};

/* Static name of a status ("ok", "errrun", ...). */
const char *kvr_lua_status_name(int status);

/* Install flags. */
#define KVR_LUA_TRUSTED 1u /* run the policy JIT-compiled (see "Time budget" above) */

enum kvr_lua_log_level {
    KVR_LUA_LOG_ERROR = 0,
    KVR_LUA_LOG_WARN = 1,
    KVR_LUA_LOG_INFO = 2,
    KVR_LUA_LOG_DEBUG = 3,
};

/* Log sink. Called from any thread (the VM's or the installer's); msg is NUL-terminated and
 * borrowed for the call. Must be thread-safe. */
typedef void (*kvr_lua_log_fn)(void *ctx, int level, const char *msg);

/* Lane index query (the CKF): per-lane prefix depths for n local hashes, like
 * kvr_index_find_matches (KVR_ERANGE with *n_out = needed when cap is too small). */
typedef int (*kvr_lua_lanes_fn)(void *ctx, const uint64_t *locals, size_t n, struct kvr_match *out,
                                size_t cap, size_t *n_out);
/* Operator action (dump / snapshot to path, NUL-terminated). KVR_OK or an error code with a
 * message in err. Runs on the thread of kvr_lua_script_run. */
typedef int (*kvr_lua_admin_fn)(void *ctx, const char *path, char *err, size_t err_len);

/* Engine handles the FFI calls use. All borrowed; each may be NULL (the matching kvr.* call
 * then returns nil, "not available"). They must outlive the runtime. */
struct kvr_lua_engine {
    kvr_index_t *index;        /* radix index: kvr.overlap*, kvr.index_stats, kvr_lua_prepare */
    kvr_load_t *load;          /* load tracker: kvr.load, kvr_lua_prepare */
    uint32_t block_size;       /* tokens per block for token queries; 0 means 16 */
    uint32_t pad_;             /* zero */
    kvr_lua_lanes_fn lanes;    /* lane index for kvr.lanes; NULL: the CKF of `index` if it
                                  has one (kvr_index_find_matches_ckf) */
    void *lanes_ctx;           /* passed to lanes */
    kvr_lua_admin_fn dump;     /* operator scripts: kvr.admin.dump(path) */
    kvr_lua_admin_fn snapshot; /* operator scripts: kvr.admin.snapshot(path) */
    void *admin_ctx;           /* passed to dump / snapshot */
};

struct kvr_lua_config {
    size_t mem_limit;             /* bytes per lua_State (all policies of a VM); 64 MiB */
    uint64_t budget_ns;           /* per decision / hook call; 10 ms */
    uint64_t load_budget_ns;      /* per chunk run, selftest, whole synthetic set; 1 s */
    uint64_t script_budget_ns;    /* operator scripts; 60 s */
    uint32_t hook_instructions;   /* count-hook period (instructions); 1000 */
    uint32_t synthetic_decisions; /* install-time synthetic decisions; 24 */
    uint64_t seed;           /* seeds math.random/kvr.random (VM k: seed + k) and the fallback */
    int allow_header_policy; /* honour kvr_ffi_request.policy; 0 */
    int stop_signal;         /* 0 (default): the watchdog only reports stuck calls; a signal
                                number (e.g. SIGRTMIN + 4): it may also interrupt a trusted call
                                stuck in compiled code (see "Stuck calls"); the runtime installs
                                the handler, the VMs' threads must not block it */
    struct kvr_fallback_params fallback; /* the C policy's weight and temperature (1, 0) */
    const char *lib_dir;          /* if set, load kvr/NAME.lua from this directory instead of the
                                     copies embedded at build time (development); borrowed */
    const char *policy_dir;       /* if set, kvr_lua_builtin_source looks here first; borrowed */
    kvr_lua_log_fn log;           /* may be NULL (silence) */
    void *log_ctx;                /* passed to log */
    struct kvr_lua_engine engine; /* engine handles (all NULL by default) */
};

/* Fills the defaults listed above (engine handles NULL). */
void kvr_lua_config_init(struct kvr_lua_config *cfg);

/* ==== runtime ================================================================================= */

/* Creates a runtime (cfg borrowed; copied, except lib_dir/policy_dir/engine handles which must
 * outlive it). *out owned; free with kvr_lua_runtime_free after every VM is freed.
 * KVR_OK, KVR_EINVAL, KVR_ENOMEM, or KVR_ECORRUPT (an embedded library failed to load: the
 * message goes to the log). */
int kvr_lua_runtime_new(const struct kvr_lua_config *cfg, kvr_lua_runtime_t **out);
void kvr_lua_runtime_free(kvr_lua_runtime_t *rt);

/* Current generation (0 before the first install). Any thread. */
uint64_t kvr_lua_runtime_generation(kvr_lua_runtime_t *rt);

/* Waits until every VM registered now runs generation >= gen, or timeout_ms passes.
 * KVR_OK, or KVR_ETIMEDOUT with err naming a lagging VM and its last build error. */
int kvr_lua_runtime_wait(kvr_lua_runtime_t *rt, uint64_t gen, uint64_t timeout_ms, char *err,
                         size_t err_len);

/* Generation each registered VM runs, in registration order, to out[0..cap); *n_out = VMs.
 * KVR_OK or KVR_ERANGE. */
int kvr_lua_runtime_vm_generations(kvr_lua_runtime_t *rt, uint64_t *out, size_t cap, size_t *n_out);

/* ==== stuck calls: the watchdog ================================================================
 *
 * A call into Lua that never returns (a trusted policy's loop, once JIT-compiled, runs without
 * the count hook) would hang its thread. kvr_lua_runtime_watchdog, called periodically from a
 * thread that runs no Lua (the server's control thread), sees every VM's current call: one that
 * stays open across passes for longer than hard_ns is reported (logged once, counted,
 * kvr_lua_watchdog_report.stuck: a server marks itself not ready). With cfg.stop_signal set, the
 * watchdog also queues that signal to the VM's thread at every pass while the call stays stuck;
 * the handler interrupts the call only when the thread is executing the state's compiled code
 * (machine code of one of its traces: no C function is then running, so no lock or allocation is
 * cut in half), jumping back to the call site with sigsetjmp/siglongjmp. The decision then fails
 * with ETIMEDOUT (the fallback decides), the VM discards that Lua state (lua_close) and builds a
 * fresh one from the policy set; kvr_lua_runtime_stats counts it. What this does NOT stop: a
 * call stuck inside a C function (a long table.sort from compiled code, a C library call: the
 * signal is retried until the thread is back in compiled code), and calls of sandboxed policies
 * are never interrupted this way (their count hook stops them within the budget). Calls of
 * trusted policies are armed for this (a sigsetjmp per call, ~10 ns) only when stop_signal is
 * set. */
struct kvr_lua_watchdog_report {
    size_t vms;          /* VMs seen */
    size_t stuck;        /* VMs in one call for longer than hard_ns now */
    uint64_t longest_ns; /* the longest call open now (0: none) */
    uint64_t signals;    /* stop signals queued by this pass */
};

/* One watchdog pass (any thread that runs no Lua; call it every 100 ms to 1 s). out may be
 * NULL. KVR_OK. */
int kvr_lua_runtime_watchdog(kvr_lua_runtime_t *rt, uint64_t hard_ns,
                             struct kvr_lua_watchdog_report *out);

struct kvr_lua_runtime_stats {
    size_t vms;            /* registered VMs */
    size_t stuck_now;      /* stuck at the last watchdog pass */
    uint64_t stuck_total;  /* calls the watchdog found over its hard limit */
    uint64_t stop_signals; /* stop signals queued */
    uint64_t stopped;      /* calls interrupted (their Lua state discarded and rebuilt) */
};

/* Runtime-wide counters. Any thread. */
void kvr_lua_runtime_stats(kvr_lua_runtime_t *rt, struct kvr_lua_runtime_stats *out);

/* ==== policy registry (any thread; serialized) ================================================ */

/* Validates and installs (or replaces) the policy `name` ([A-Za-z0-9_.-], 1..63 bytes) from Lua
 * source (borrowed, len bytes). Validation, in a scratch state set up like a worker's: compile
 * (KVR_LUA_ERRSYNTAX; the message has "name.lua:LINE:"), run the chunk (must return a table with
 * a select function; hooks, if present, must be functions), selftest() if present (must not
 * raise nor return false), synthetic decisions (must return valid choices) - all interpreted
 * under the time and memory budgets. On success the generation is bumped, *generation (may be
 * NULL) receives it and every VM is woken. On refusal nothing changes; err (may be NULL)
 * receives the reason, NUL-terminated, and *status (may be NULL) the kvr_lua_status.
 * Returns KVR_OK, KVR_EINVAL (bad name or refused policy), KVR_ECAPACITY (too many names) or
 * KVR_ENOMEM. Blocks the caller for the validation (milliseconds). */
int kvr_lua_policy_install(kvr_lua_runtime_t *rt, const char *name, const char *src, size_t len,
                           unsigned flags, uint64_t *generation, int *status, char *err,
                           size_t err_len);

/* Removes a policy (and the bindings naming it). KVR_OK or KVR_ENOTFOUND. Bumps the generation. */
int kvr_lua_policy_remove(kvr_lua_runtime_t *rt, const char *name, uint64_t *generation);

/* Binds model (NULL or "" = the default for unbound models) to an installed policy; policy NULL
 * removes the binding. KVR_OK, KVR_ENOTFOUND (no such policy), KVR_ECAPACITY. Bumps the
 * generation. */
int kvr_lua_policy_bind(kvr_lua_runtime_t *rt, const char *model, const char *policy,
                        uint64_t *generation);

/* Per-policy counters, summed over every VM (live and freed) since the name was first installed. */
struct kvr_lua_policy_stats {
    uint64_t decisions;   /* select calls routed to this policy */
    uint64_t ok;          /* decided by the policy */
    uint64_t errors;      /* ERRRUN */
    uint64_t timeouts;    /* ETIMEDOUT (hook or overrun) */
    uint64_t oom;         /* ERRMEM */
    uint64_t invalid;     /* INVALID */
    uint64_t fallbacks;   /* decisions made by the C policy instead */
    uint64_t hook_errors; /* failures in on_response / KV-event hooks */
    uint64_t reloads;     /* accepted installs */
    uint64_t rejected;    /* refused installs */
    uint64_t generation;  /* generation of the last accepted install */
    uint64_t lua_ns;      /* total time spent in select (coarse clock, see elapsed_ns) */
    int trusted;          /* current install flag */
    int live;             /* installed now */
};

/* KVR_OK or KVR_ENOTFOUND (never installed). */
int kvr_lua_policy_stats(kvr_lua_runtime_t *rt, const char *name, struct kvr_lua_policy_stats *out);

/* Calls cb for every policy name ever installed (in install order), with its stats. */
void kvr_lua_policy_foreach(kvr_lua_runtime_t *rt,
                            void (*cb)(void *ctx, const char *name,
                                       const struct kvr_lua_policy_stats *st),
                            void *ctx);

/* Calls cb for every user counter (kvr.count) with its policy, name and value summed over VMs. */
void kvr_lua_counters_foreach(kvr_lua_runtime_t *rt,
                              void (*cb)(void *ctx, const char *policy, const char *name,
                                         uint64_t value),
                              void *ctx);

/* The shipped policy `name` (policies/NAME.lua): from cfg.policy_dir if set and the file exists
 * (read into an internal cache owned by the runtime), else the copy embedded at build time.
 * *src borrowed (valid for the runtime's life). KVR_OK or KVR_ENOTFOUND. rt may be NULL (embedded
 * only). */
int kvr_lua_builtin_source(kvr_lua_runtime_t *rt, const char *name, const char **src, size_t *len);
/* Names of the embedded policies, NULL-terminated static array. */
const char *const *kvr_lua_builtin_names(void);

/* ==== per-thread VM =========================================================================== */

struct kvr_lua_vm_config {
    void (*wake)(void *ctx); /* called (from the installing thread) after each install; the
                                owner should then call kvr_lua_vm_poll on the VM's thread */
    void *wake_ctx;          /* passed to wake and swapped */
    void (*swapped)(void *ctx, kvr_lua_vm_t *vm); /* optional; called on the VM's thread inside
                                   kvr_lua_vm_poll after the new state is in place and before its
                                   generation is published, so whatever the owner derives from the
                                   VM (e.g. kvr_lua_vm_event_hooks) is current before an installer's
                                   kvr_lua_runtime_wait returns; must not call back into the
                                   runtime's registry */
};

/* Creates a VM on the calling thread with the runtime's current generation and registers it.
 * vcfg may be NULL. *out owned; free with kvr_lua_vm_free on the same thread.
 * KVR_OK, KVR_ENOMEM, or KVR_ECORRUPT (the current policies failed to build: see the log). */
int kvr_lua_vm_new(kvr_lua_runtime_t *rt, const struct kvr_lua_vm_config *vcfg, kvr_lua_vm_t **out);
void kvr_lua_vm_free(kvr_lua_vm_t *vm);

/* Swaps to the newest generation if the VM is behind (between requests only). Returns 1 if it
 * swapped, 0 if already current (or a failed build is waiting for its retry time), negative
 * KVR_E* if the build failed (the old state stays live). select calls this itself. */
int kvr_lua_vm_poll(kvr_lua_vm_t *vm);

/* Generation the VM runs. Any thread. */
uint64_t kvr_lua_vm_generation(kvr_lua_vm_t *vm);

/* Bytes held by the VM's Lua state now. */
size_t kvr_lua_vm_memory(kvr_lua_vm_t *vm);

/* Bytes the VM's current Lua state has allocated (or grown blocks by) since it was built:
 * monotonic, unaffected by the GC. A steady-state decision that allocates shows up here (the
 * runtime's own path allocates nothing per decision; tests/unit/lua/test_vm.c). VM thread. */
uint64_t kvr_lua_vm_allocated(kvr_lua_vm_t *vm);

/* A decision. ranked/cap are inputs; everything else is output. Strings are borrowed, valid
 * until the next call on this VM. */
struct kvr_lua_decision {
    uint32_t *ranked;    /* in: caller buffer for candidate indices, best first */
    size_t cap;          /* in: capacity of ranked (>= 1) */
    size_t n_ranked;     /* out: indices written (>= 1; a policy's ranked list is cut at
                            min(cap, n, KVR_FFI_RANKED_MAX = 256)) */
    int status;          /* out: enum kvr_lua_status of the policy attempt */
    int fallback;        /* out: 1 if ranked came from the C fallback policy */
    const char *policy;  /* out: name of the policy that was asked ("" if none) */
    const char *error;   /* out: error text with traceback ("" if none) */
    uint64_t generation; /* out: generation of the VM state that ran */
    uint64_t elapsed_ns; /* out: time spent in Lua (0 if Lua was not called), from the coarse
                            monotonic clock (tick resolution, e.g. 4 ms: 0 for most decisions;
                            sums over many decisions are unbiased) */
};

/* Routes one request (borrowed) among n candidates (borrowed; n >= 1). Always produces a decision
 * when it returns KVR_OK (the C fallback covers every Lua failure). Returns KVR_OK or KVR_EINVAL
 * (n == 0, NULL arguments, cap == 0, block_size == 0). Polls for a new generation first. */
int kvr_lua_vm_select(kvr_lua_vm_t *vm, const struct kvr_ffi_request *req,
                      const struct kvr_ffi_candidate *cands, size_t n, struct kvr_lua_decision *d);

/* Reports the outcome of a routed request to the policy's on_response(req, worker, outcome), if
 * it has one (same policy choice as select). Returns the kvr_lua_status (failures are counted as
 * hook_errors and logged); KVR_LUA_NOPOLICY when there is no such hook. */
int kvr_lua_vm_on_response(kvr_lua_vm_t *vm, const struct kvr_ffi_request *req,
                           const struct kvr_ffi_candidate *worker,
                           const struct kvr_ffi_outcome *outcome);

/* Delivers a KV event (borrowed) to every policy of the VM with on_stored / on_removed /
 * on_cleared. Returns the worst kvr_lua_status (KVR_LUA_NOPOLICY when no policy has a hook). */
int kvr_lua_vm_on_event(kvr_lua_vm_t *vm, const struct kvr_event *ev);

/* Sets the engine handles (borrowed; must stay valid while set) that the VM's following calls
 * use for kvr.overlap / kvr.lanes / kvr.index_stats / kvr.load: a server with several models
 * sets the request's model's engine before kvr_lua_vm_select. NULL restores the runtime's
 * (kvr_lua_config.engine). Operator-script admin hooks always come from the runtime. VM thread
 * only. */
void kvr_lua_vm_set_engine(kvr_lua_vm_t *vm, const struct kvr_lua_engine *engine);

/* Which KV-event hooks the VM's current policies define: bit (1 << kind) for on_stored (kind
 * KVR_EVENT_STORED), on_removed and on_cleared; 0 when none. Cheap (no Lua call); lets the server
 * skip delivering events to threads whose policies ignore them. VM thread only. */
unsigned kvr_lua_vm_event_hooks(kvr_lua_vm_t *vm);

/* ==== helpers ================================================================================= */

/* Fills, for each candidate (worker_id and dp_rank set by the caller): overlap (device tier,
 * from the bound index and req->local_hashes), tree_blocks, prefill_tokens, decode_blocks,
 * requests and new_blocks (from the bound load tracker and req->seq_hashes). Fields whose engine
 * handle is not bound are left as they are. Any thread. KVR_OK or KVR_ENOMEM. */
int kvr_lua_prepare(kvr_lua_runtime_t *rt, const struct kvr_ffi_request *req,
                    struct kvr_ffi_candidate *cands, size_t n);

/* Runs an operator script (not a policy): a Lua chunk in a fresh scratch state with the same
 * sandbox plus kvr.admin.dump(path) / kvr.admin.snapshot(path), under script_budget_ns. The
 * script's first return value, converted with tostring, goes to out (may be NULL).
 * Returns a kvr_lua_status; err receives the error with traceback. Runs on the caller's thread. */
int kvr_lua_script_run(kvr_lua_runtime_t *rt, const char *src, size_t len, char *out,
                       size_t out_len, char *err, size_t err_len);

#endif
