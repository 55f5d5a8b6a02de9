/* watchdog.c - stuck calls: watch records, the watchdog pass, the stop signal's handler (design:
 * kvr/lua.h "Stuck calls", internal.h "the watchdog").
 * SPDX-License-Identifier: Apache-2.0 */
#define _GNU_SOURCE /* pthread_sigqueue, REG_RIP */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <ucontext.h>

#include "internal.h"
#include "kvr/err.h"

/* ==== watch records ========================================================================== */

struct vm_watch *watch_claim(kvr_lua_runtime_t *rt, uint64_t vm_id)
{
    pthread_mutex_lock(&rt->mu);
    struct vm_watch *w = rt->watches;
    while (w != NULL && w->in_use)
        w = w->next;
    if (w == NULL) {
        w = calloc(1, sizeof(*w));
        if (w == NULL) {
            pthread_mutex_unlock(&rt->mu);
            return NULL;
        }
        atomic_init(&w->seq, 0);
        atomic_init(&w->policy_id, 0);
        atomic_init(&w->st, NULL);
        atomic_init(&w->kill_seq, 0);
        w->next = rt->watches;
        rt->watches = w;
    }
    /* A recycled record keeps counting from its old seq (always even here): a signal queued for
     * the previous owner's call can never match a call of the new one. */
    w->in_use = 1;
    w->thread = pthread_self();
    w->vm_id = vm_id;
    w->seen_seq = atomic_load(&w->seq);
    w->seen_ns = 0;
    w->reported = 0;
    atomic_store(&w->st, NULL);
    pthread_mutex_unlock(&rt->mu);
    return w;
}

void watch_release(kvr_lua_runtime_t *rt, struct vm_watch *w)
{
    if (w == NULL)
        return;
    pthread_mutex_lock(&rt->mu);
    atomic_store(&w->st, NULL);
    w->in_use = 0;
    pthread_mutex_unlock(&rt->mu);
}

/* ==== the handler ============================================================================ */

int lstate_in_mcode(const struct lstate *s, uintptr_t pc)
{
    int n = s->n_mc;
    for (int i = 0; i < n; i++)
        if (pc >= s->mc_lo[i] && pc < s->mc_hi[i])
            return 1;
    return 0;
}

/* The interrupted instruction's address, 0 where unknown. */
static uintptr_t context_pc(const void *uctx)
{
    const ucontext_t *uc = uctx;
#if defined(__x86_64__)
    return (uintptr_t)uc->uc_mcontext.gregs[REG_RIP];
#elif defined(__aarch64__)
    return (uintptr_t)uc->uc_mcontext.pc;
#else
    (void)uc;
    return 0; /* unsupported: stuck calls are reported, never interrupted */
#endif
}

/* Runs on the VM's thread. Only reads the record (never freed before the runtime) and, when the
 * stop applies, the state of the call in progress (alive: this thread is inside it). */
static void stop_handler(int sig, siginfo_t *si, void *uctx)
{
    (void)sig;
    if (si == NULL || si->si_code != SI_QUEUE)
        return;
    struct vm_watch *w = si->si_value.sival_ptr;
    if (w == NULL || !pthread_equal(w->thread, pthread_self()))
        return;
    uint64_t seq = atomic_load_explicit(&w->seq, memory_order_relaxed);
    if (!(seq & 1u) || seq != atomic_load_explicit(&w->kill_seq, memory_order_relaxed))
        return; /* that call has ended */
    struct lstate *s = atomic_load_explicit(&w->st, memory_order_relaxed);
    if (s == NULL || !s->jb_armed)
        return;
    uintptr_t pc = context_pc(uctx);
    if (pc == 0 || !lstate_in_mcode(s, pc))
        return; /* interpreter or C code: the next pass tries again */
    s->jb_armed = 0;
    s->stopped = 1;
    siglongjmp(s->jb, 1);
}

int watch_install_handler(int sig)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_sigaction = stop_handler;
    sa.sa_flags = SA_SIGINFO | SA_RESTART;
    sigemptyset(&sa.sa_mask);
    return sigaction(sig, &sa, NULL) == -1 ? KVR_EINVAL : KVR_OK;
}

void watch_unblock(int sig)
{
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, sig);
    pthread_sigmask(SIG_UNBLOCK, &set, NULL);
}

/* ==== the pass =============================================================================== */

int kvr_lua_runtime_watchdog(kvr_lua_runtime_t *rt, uint64_t hard_ns,
                             struct kvr_lua_watchdog_report *out)
{
    struct kvr_lua_watchdog_report r = {0, 0, 0, 0};
    uint64_t now = kvr_lua_now_ns();
    struct {
        uint64_t vm_id, ms;
        uint32_t policy_id;
    } logs[8];
    size_t n_logs = 0;
    pthread_mutex_lock(&rt->mu);
    for (struct vm_watch *w = rt->watches; w != NULL; w = w->next) {
        if (!w->in_use)
            continue;
        r.vms++;
        uint64_t seq = atomic_load_explicit(&w->seq, memory_order_relaxed);
        if (!(seq & 1u) || seq != w->seen_seq) { /* idle, or a new call since the last pass */
            w->seen_seq = seq;
            w->seen_ns = now;
            w->reported = 0;
            continue;
        }
        uint64_t open_ns = now - w->seen_ns; /* at least; at most one pass more */
        if (open_ns > r.longest_ns)
            r.longest_ns = open_ns;
        if (open_ns < hard_ns)
            continue;
        r.stuck++;
        if (!w->reported) {
            w->reported = 1;
            rt->stuck_total++;
            if (n_logs < sizeof(logs) / sizeof(logs[0])) {
                logs[n_logs].vm_id = w->vm_id;
                logs[n_logs].ms = open_ns / 1000000u;
                logs[n_logs].policy_id = atomic_load(&w->policy_id);
                n_logs++;
            }
        }
        if (rt->cfg.stop_signal != 0) {
            atomic_store_explicit(&w->kill_seq, seq, memory_order_relaxed);
            union sigval v = {.sival_ptr = w};
            if (pthread_sigqueue(w->thread, rt->cfg.stop_signal, v) == 0) {
                r.signals++;
                rt->stop_signals++;
            }
        }
    }
    rt->stuck_now = r.stuck;
    char names[8][NAME_CAP];
    for (size_t i = 0; i < n_logs; i++)
        snprintf(names[i], NAME_CAP, "%s",
                 logs[i].policy_id < rt->n_names ? rt->names[logs[i].policy_id].name : "?");
    pthread_mutex_unlock(&rt->mu);
    for (size_t i = 0; i < n_logs; i++)
        rt_log(rt, KVR_LUA_LOG_ERROR,
               "kvr_lua: VM %llu has been in one call of policy %s for %llu ms (hard limit %llu "
               "ms)%s",
               (unsigned long long)logs[i].vm_id, names[i], (unsigned long long)logs[i].ms,
               (unsigned long long)(hard_ns / 1000000u),
               rt->cfg.stop_signal ? ": interrupting it once it runs compiled code"
                                   : ": it cannot be interrupted (no stop signal configured)");
    if (out != NULL)
        *out = r;
    return KVR_OK;
}

void kvr_lua_runtime_stats(kvr_lua_runtime_t *rt, struct kvr_lua_runtime_stats *out)
{
    pthread_mutex_lock(&rt->mu);
    out->vms = rt->n_vms;
    out->stuck_now = rt->stuck_now;
    out->stuck_total = rt->stuck_total;
    out->stop_signals = rt->stop_signals;
    pthread_mutex_unlock(&rt->mu);
    out->stopped = atomic_load(&rt->stopped_total);
}
