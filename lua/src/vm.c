/* vm.c - the per-thread VM: its Lua state, generation swaps between requests, decisions with
 * the C fallback, response and KV-event hooks (see kvr/lua.h).
 * SPDX-License-Identifier: Apache-2.0 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "kvr/err.h"

#define RETRY_NS 1000000000u
#define DUP_CHECK_MAX 64u

static void inc(atomic_ullong *c, uint64_t n)
{
    /* Single writer (the VM's thread): a relaxed load + store, no locked instruction. */
    atomic_store_explicit(c, atomic_load_explicit(c, memory_order_relaxed) + n,
                          memory_order_relaxed);
}

/* ==== lifecycle ============================================================================== */

int kvr_lua_vm_new(kvr_lua_runtime_t *rt, const struct kvr_lua_vm_config *vcfg, kvr_lua_vm_t **out)
{
    struct kvr_lua_vm *vm = calloc(1, sizeof(*vm));
    if (vm == NULL)
        return KVR_ENOMEM;
    vm->rt = rt;
    if (vcfg != NULL)
        vm->vcfg = *vcfg;
    pthread_mutex_lock(&rt->mu);
    vm->id = rt->next_vm_id++;
    pthread_mutex_unlock(&rt->mu);
    vm->watch = watch_claim(rt, vm->id);
    if (vm->watch == NULL) {
        free(vm);
        return KVR_ENOMEM;
    }
    pthread_mutex_lock(&rt->mu);
    struct policy_set *set = rt->set;
    set_ref(set);
    pthread_mutex_unlock(&rt->mu);
    uint64_t seed = rt->cfg.seed + vm->id;
    vm->rng.state = seed ^ 0x5bd1e9955bd1e995ull;
    char err[ERR_CAP];
    int st = lstate_build(rt, vm, set, seed, &vm->st, err, sizeof(err));
    if (st != KVR_LUA_OK) {
        rt_log(rt, KVR_LUA_LOG_ERROR, "kvr_lua: VM %llu cannot build generation %llu: %s",
               (unsigned long long)vm->id, (unsigned long long)set->generation, err);
        set_unref(set);
        watch_release(rt, vm->watch);
        free(vm);
        return st == KVR_LUA_ERRMEM ? KVR_ENOMEM : KVR_ECORRUPT;
    }
    vm->set = set;
    atomic_init(&vm->live_gen, set->generation);
    pthread_mutex_lock(&rt->mu);
    struct kvr_lua_vm **tail = &rt->vms;
    while (*tail != NULL)
        tail = &(*tail)->next;
    *tail = vm;
    rt->n_vms++;
    pthread_cond_broadcast(&rt->cond);
    pthread_mutex_unlock(&rt->mu);
    /* An install published while the state was being built woke the VMs registered then, not
     * this one: catch up now (every later install finds it registered and wakes it). */
    kvr_lua_vm_poll(vm);
    *out = vm;
    return KVR_OK;
}

static void retire(atomic_ullong *dst, const atomic_ullong *src)
{
    atomic_fetch_add_explicit(dst, atomic_load_explicit(src, memory_order_relaxed),
                              memory_order_relaxed);
}

void kvr_lua_vm_free(kvr_lua_vm_t *vm)
{
    if (vm == NULL)
        return;
    kvr_lua_runtime_t *rt = vm->rt;
    pthread_mutex_lock(&rt->mu);
    for (struct kvr_lua_vm **p = &rt->vms; *p != NULL; p = &(*p)->next)
        if (*p == vm) {
            *p = vm->next;
            break;
        }
    rt->n_vms--;
    for (size_t i = 0; i < KVR_LUA_MAX_POLICIES; i++) {
        struct vm_pcounters *r = &rt->retired[i], *c = &vm->pc[i];
        retire(&r->decisions, &c->decisions);
        retire(&r->ok, &c->ok);
        retire(&r->errors, &c->errors);
        retire(&r->timeouts, &c->timeouts);
        retire(&r->oom, &c->oom);
        retire(&r->invalid, &c->invalid);
        retire(&r->fallbacks, &c->fallbacks);
        retire(&r->hook_errors, &c->hook_errors);
        retire(&r->lua_ns, &c->lua_ns);
    }
    for (size_t i = 0; i < KVR_LUA_MAX_COUNTERS; i++)
        rt->retired_user[i] += atomic_load_explicit(&vm->user[i], memory_order_relaxed);
    pthread_cond_broadcast(&rt->cond);
    pthread_mutex_unlock(&rt->mu);
    watch_release(rt, vm->watch);
    lstate_free(vm->st);
    set_unref(vm->set);
    free(vm);
}

int kvr_lua_vm_poll(kvr_lua_vm_t *vm)
{
    kvr_lua_runtime_t *rt = vm->rt;
    uint64_t g = atomic_load_explicit(&rt->generation, memory_order_acquire);
    if (g == atomic_load_explicit(&vm->live_gen, memory_order_relaxed))
        return 0;
    uint64_t now = kvr_lua_now_ns();
    if (now < vm->retry_after_ns)
        return 0;
    pthread_mutex_lock(&rt->mu);
    struct policy_set *set = rt->set;
    set_ref(set);
    pthread_mutex_unlock(&rt->mu);
    if (set->generation == atomic_load_explicit(&vm->live_gen, memory_order_relaxed)) {
        set_unref(set);
        return 0;
    }
    struct lstate *s = NULL;
    char err[ERR_CAP];
    int st = lstate_build(rt, vm, set, rt->cfg.seed + vm->id, &s, err, sizeof(err));
    if (st != KVR_LUA_OK) {
        vm->retry_after_ns = now + RETRY_NS;
        pthread_mutex_lock(&rt->mu);
        snprintf(vm->build_err, sizeof(vm->build_err), "%.200s", err);
        pthread_mutex_unlock(&rt->mu);
        rt_log(rt, KVR_LUA_LOG_ERROR,
               "kvr_lua: VM %llu keeps generation %llu, cannot build %llu: %s",
               (unsigned long long)vm->id, (unsigned long long)atomic_load(&vm->live_gen),
               (unsigned long long)set->generation, err);
        set_unref(set);
        return st == KVR_LUA_ERRMEM ? KVR_ENOMEM : KVR_ECORRUPT;
    }
    struct lstate *old = vm->st;
    struct policy_set *old_set = vm->set;
    vm->st = s;
    vm->set = set;
    vm->retry_after_ns = 0;
    lstate_free(old);
    set_unref(old_set);
    if (vm->vcfg.swapped != NULL)
        vm->vcfg.swapped(vm->vcfg.wake_ctx, vm);
    pthread_mutex_lock(&rt->mu);
    vm->build_err[0] = '\0';
    atomic_store_explicit(&vm->live_gen, set->generation, memory_order_release);
    pthread_cond_broadcast(&rt->cond);
    pthread_mutex_unlock(&rt->mu);
    return 1;
}

uint64_t kvr_lua_vm_generation(kvr_lua_vm_t *vm)
{
    return atomic_load_explicit(&vm->live_gen, memory_order_acquire);
}

size_t kvr_lua_vm_memory(kvr_lua_vm_t *vm)
{
    return vm->st != NULL ? vm->st->used : 0;
}

uint64_t kvr_lua_vm_allocated(kvr_lua_vm_t *vm)
{
    return vm->st != NULL ? vm->st->allocated : 0;
}

/* The live state, rebuilding a discarded one when its retry time has come; NULL if none. A
 * failed rebuild's message goes to err (when not NULL). */
static struct lstate *live_state(struct kvr_lua_vm *vm, char *err, size_t err_len)
{
    if (vm->st == NULL && kvr_lua_now_ns() >= vm->retry_after_ns) {
        struct lstate *s = NULL;
        char buf[ERR_CAP];
        if (err == NULL) {
            err = buf;
            err_len = sizeof(buf);
        }
        if (lstate_build(vm->rt, vm, vm->set, vm->rt->cfg.seed + vm->id, &s, err, err_len) ==
            KVR_LUA_OK) {
            vm->st = s;
            if (vm->vcfg.swapped != NULL)
                vm->vcfg.swapped(vm->vcfg.wake_ctx, vm);
        } else {
            vm->retry_after_ns = kvr_lua_now_ns() + RETRY_NS;
        }
    }
    return vm->st;
}

/* After the watchdog interrupted a call: the state is unusable (its C stack frames are gone);
 * close it and build a fresh one from the same set (vm->st NULL until that succeeds). The swap
 * callback sees either outcome (no state: no hooks). */
static void recover(struct kvr_lua_vm *vm)
{
    kvr_lua_runtime_t *rt = vm->rt;
    lstate_free(vm->st); /* lua_close copes with the abandoned call (tests: ASan) */
    vm->st = NULL;
    vm->retry_after_ns = 0;
    char err[ERR_CAP];
    if (live_state(vm, err, sizeof(err)) == NULL) {
        if (vm->vcfg.swapped != NULL)
            vm->vcfg.swapped(vm->vcfg.wake_ctx, vm);
        rt_log(rt, KVR_LUA_LOG_ERROR,
               "kvr_lua: VM %llu cannot rebuild its Lua state after an interrupted call: %s "
               "(the built-in policy decides until it can)",
               (unsigned long long)vm->id, err);
        return;
    }
    rt_log(rt, KVR_LUA_LOG_WARN, "kvr_lua: VM %llu rebuilt its Lua state after an interrupted call",
           (unsigned long long)vm->id);
}

/* ==== decisions ============================================================================== */

static int resolve(const struct policy_set *set, const struct kvr_ffi_request *req, int allow_hdr)
{
    if (allow_hdr && req->policy != NULL && req->policy_len > 0) {
        int slot = set_find(set, req->policy, req->policy_len);
        if (slot >= 0)
            return slot;
    }
    if (req->model != NULL)
        for (size_t i = 0; i < set->n_bind; i++)
            if (set->bind[i].model_len == req->model_len &&
                memcmp(set->bind[i].model, req->model, req->model_len) == 0)
                return set->bind[i].slot;
    return set->default_slot;
}

/* Logs a policy failure, at most once a second per VM and policy. */
static void log_failure(struct kvr_lua_vm *vm, uint32_t pid, const char *pname, const char *what,
                        int status)
{
    kvr_lua_runtime_t *rt = vm->rt;
    if (rt->cfg.log == NULL)
        return;
    uint64_t now = kvr_lua_now_ns();
    if (vm->last_log_ns[pid] != 0 && now - vm->last_log_ns[pid] < 1000000000u) {
        vm->suppressed[pid]++;
        return;
    }
    vm->last_log_ns[pid] = now;
    uint32_t sup = vm->suppressed[pid];
    vm->suppressed[pid] = 0;
    rt_log(rt, KVR_LUA_LOG_ERROR, "policy %s: %s %s on VM %llu%s: %s", pname, what,
           kvr_lua_status_name(status), (unsigned long long)vm->id,
           sup ? " (earlier failures suppressed)" : "", vm->err);
}

static void reset_call(struct lstate *s)
{
    s->call.req = NULL;
    s->call.cands = NULL;
    s->call.outcome = NULL;
    s->call.event = NULL;
    s->call.n = 0;
    s->call.out_cap = 0;
}

/* Checks what the glue wrote (defense in depth: it validates the choice already). */
static int indices_ok(const uint32_t *r, size_t k, size_t n)
{
    for (size_t i = 0; i < k; i++) {
        if (r[i] >= n)
            return 0;
        if (k <= DUP_CHECK_MAX)
            for (size_t j = 0; j < i; j++)
                if (r[j] == r[i])
                    return 0;
    }
    return 1;
}

int kvr_lua_vm_select(kvr_lua_vm_t *vm, const struct kvr_ffi_request *req,
                      const struct kvr_ffi_candidate *cands, size_t n, struct kvr_lua_decision *d)
{
    if (vm == NULL || req == NULL || cands == NULL || d == NULL || d->ranked == NULL ||
        d->cap == 0 || n == 0 || n > UINT32_MAX || req->block_size == 0)
        return KVR_EINVAL;
    kvr_lua_vm_poll(vm);
    kvr_lua_runtime_t *rt = vm->rt;
    struct lstate *s = live_state(vm, NULL, 0);
    const struct policy_set *set = vm->set;
    vm->err[0] = '\0';
    d->n_ranked = 0;
    d->fallback = 0;
    d->error = vm->err;
    d->generation = set->generation;
    d->elapsed_ns = 0;
    int slot = resolve(set, req, rt->cfg.allow_header_policy);
    int status;
    struct vm_pcounters *pc = NULL;
    if (slot < 0 || s == NULL) {
        d->policy = slot < 0 ? "" : set->p[slot].name;
        status = KVR_LUA_NOPOLICY;
        if (s == NULL)
            snprintf(vm->err, sizeof(vm->err), "this thread has no Lua state (rebuilding)");
        goto fallback;
    }
    const struct policy_def *p = &set->p[slot];
    d->policy = p->name;
    pc = &vm->pc[p->id];
    inc(&pc->decisions, 1);
    lstate_set_request(s, req, cands, n, d->cap);
    s->call.slot = (uint32_t)slot;
    s->fv.policy_id = p->id;
    s->stoppable = rt->cfg.stop_signal != 0 && (p->flags & KVR_LUA_TRUSTED) != 0;
    uint64_t elapsed;
    size_t k = 0;
    status = lstate_decide(s, rt->cfg.budget_ns, &k, &elapsed, vm->err, sizeof(vm->err));
    d->elapsed_ns = elapsed;
    inc(&pc->lua_ns, elapsed);
    if (s->stopped) {
        recover(vm); /* s is gone; status is ETIMEDOUT, counted and logged below */
    } else {
        if (status == KVR_LUA_OK) {
            if (!indices_ok(s->call.ranked, k, n)) {
                status = KVR_LUA_INVALID;
                snprintf(vm->err, sizeof(vm->err), "the choice names no valid candidate");
            } else if (lstate_overran(s, elapsed, rt->cfg.budget_ns)) {
                /* Nothing could interrupt it (compiled trusted code, a long C library call). */
                status = KVR_LUA_ETIMEDOUT;
                snprintf(vm->err, sizeof(vm->err),
                         "decision took %llu us, over %u x the budget of %llu us of CPU time "
                         "(result discarded)",
                         (unsigned long long)(elapsed / 1000), HARD_FACTOR,
                         (unsigned long long)(rt->cfg.budget_ns / 1000));
            } else {
                memcpy(d->ranked, s->call.ranked, k * sizeof(*d->ranked));
                d->n_ranked = k;
            }
        }
        reset_call(s);
    }
    d->status = status;
    if (status == KVR_LUA_OK) {
        inc(&pc->ok, 1);
        return KVR_OK;
    }
    switch (status) {
    case KVR_LUA_ERRMEM:
        inc(&pc->oom, 1);
        break;
    case KVR_LUA_ETIMEDOUT:
        inc(&pc->timeouts, 1);
        break;
    case KVR_LUA_INVALID:
        inc(&pc->invalid, 1);
        break;
    default:
        inc(&pc->errors, 1);
        break;
    }
    log_failure(vm, p->id, p->name, "select", status);
fallback:
    if (pc != NULL)
        inc(&pc->fallbacks, 1);
    d->status = status;
    d->fallback = 1;
    if (kvr_fallback_select(&rt->cfg.fallback, req, cands, n, &vm->rng, d->ranked, d->cap,
                            &d->n_ranked) != KVR_OK)
        kvr_fallback_select(&rt->cfg.fallback, req, cands, n, &vm->rng, d->ranked, 1,
                            &d->n_ranked); /* a one-pass choice never allocates */
    return KVR_OK;
}

/* ==== hooks ================================================================================== */

/* Runs one hook of slot on the live state. If the watchdog interrupted it, the state has been
 * replaced when this returns (vm->st changed, possibly NULL): callers re-read vm->st. */
static int run_hook(struct kvr_lua_vm *vm, int slot, int ref, const char *what)
{
    struct lstate *s = vm->st;
    const struct policy_def *p = &vm->set->p[slot];
    s->call.slot = (uint32_t)slot;
    s->fv.policy_id = p->id;
    s->stoppable = vm->rt->cfg.stop_signal != 0 && (p->flags & KVR_LUA_TRUSTED) != 0;
    lua_rawgeti(s->L, LUA_REGISTRYINDEX, s->refs[ref]);
    vm->err[0] = '\0';
    int status = lstate_pcall(s, 0, 1, vm->rt->cfg.budget_ns, vm->err, sizeof(vm->err));
    if (status == KVR_LUA_OK) {
        if (!lua_toboolean(s->L, -1))
            status = KVR_LUA_NOPOLICY;
        lua_settop(s->L, FIX_N);
    } else {
        inc(&vm->pc[p->id].hook_errors, 1);
        log_failure(vm, p->id, p->name, what, status);
    }
    if (s->stopped) /* (never OK) */
        recover(vm);
    return status;
}

int kvr_lua_vm_on_response(kvr_lua_vm_t *vm, const struct kvr_ffi_request *req,
                           const struct kvr_ffi_candidate *worker,
                           const struct kvr_ffi_outcome *outcome)
{
    if (vm == NULL || req == NULL || worker == NULL || outcome == NULL)
        return KVR_LUA_INVALID;
    kvr_lua_vm_poll(vm);
    struct lstate *s = live_state(vm, NULL, 0);
    int slot = resolve(vm->set, req, vm->rt->cfg.allow_header_policy);
    if (s == NULL || slot < 0 || (size_t)slot >= s->n_slots || !(s->hooks[slot] & 1u))
        return KVR_LUA_NOPOLICY;
    lstate_set_request(s, req, worker, 1, 1);
    s->call.outcome = outcome;
    int status = run_hook(vm, slot, REF_RESPOND, "on_response");
    if (vm->st == s)
        reset_call(s);
    return status;
}

void kvr_lua_vm_set_engine(kvr_lua_vm_t *vm, const struct kvr_lua_engine *engine)
{
    if (vm != NULL)
        vm->engine = engine;
}

unsigned kvr_lua_vm_event_hooks(kvr_lua_vm_t *vm)
{
    if (vm == NULL || vm->st == NULL)
        return 0;
    unsigned bits = 0;
    struct lstate *s = vm->st;
    for (size_t slot = 0; slot < s->n_slots && slot < vm->set->n; slot++)
        bits |= s->hooks[slot];
    return bits &
           ((1u << KVR_EVENT_STORED) | (1u << KVR_EVENT_REMOVED) | (1u << KVR_EVENT_CLEARED));
}

int kvr_lua_vm_on_event(kvr_lua_vm_t *vm, const struct kvr_event *ev)
{
    if (vm == NULL || ev == NULL || ev->kind < KVR_EVENT_STORED || ev->kind > KVR_EVENT_CLEARED)
        return KVR_LUA_INVALID;
    kvr_lua_vm_poll(vm);
    struct lstate *s = live_state(vm, NULL, 0);
    if (s == NULL)
        return KVR_LUA_NOPOLICY;
    unsigned bit = 1u << ev->kind; /* stored 2, removed 4, cleared 8 */
    struct kvr_ffi_event fe = {
        .worker_id = ev->worker_id,
        .parent_hash = ev->parent_hash,
        .blocks = (const struct kvr_ffi_block *)ev->blocks,
        .hashes = ev->hashes,
        .dp_rank = ev->dp_rank,
        .kind = ev->kind,
        .tier = ev->tier,
        .has_parent = ev->has_parent,
        .n = ev->n,
    };
    int worst = KVR_LUA_NOPOLICY;
    for (size_t slot = 0; slot < s->n_slots && slot < vm->set->n; slot++) {
        if (!(s->hooks[slot] & bit))
            continue;
        s->call.event = &fe;
        int st = run_hook(vm, (int)slot, REF_EVENT, "KV-event hook");
        if (worst == KVR_LUA_NOPOLICY || (st != KVR_LUA_OK && st != KVR_LUA_NOPOLICY))
            worst = st;
        if (vm->st != s) /* interrupted and replaced: this event is not delivered further */
            return worst;
    }
    reset_call(s);
    return worst;
}
