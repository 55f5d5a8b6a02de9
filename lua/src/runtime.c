/* runtime.c - the process-wide policy runtime: configuration, lifecycle, waiting for VMs, names
 * and counters (see kvr/lua.h). Policy sets: set.c; installs and bindings: registry.c.
 * SPDX-License-Identifier: Apache-2.0 */
#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "internal.h"
#include "kvr/err.h"

#define DEFAULT_MEM ((size_t)64 << 20)
#define DEFAULT_BUDGET_NS 10000000u
#define DEFAULT_LOAD_BUDGET_NS 1000000000u
#define DEFAULT_SCRIPT_BUDGET_NS 60000000000u
#define DEFAULT_HOOK 1000u
#define DEFAULT_SYNTHETIC 24u
#define MIN_MEM ((size_t)1 << 20)

const char *kvr_lua_status_name(int status)
{
    static const char *const names[] = {"ok",      "errrun",    "errmem",  "etimedout",
                                        "invalid", "errsyntax", "nopolicy"};
    if (status < 0 || status >= (int)(sizeof(names) / sizeof(names[0])))
        return "unknown";
    return names[status];
}

void kvr_lua_config_init(struct kvr_lua_config *cfg)
{
    memset(cfg, 0, sizeof(*cfg));
    cfg->mem_limit = DEFAULT_MEM;
    cfg->budget_ns = DEFAULT_BUDGET_NS;
    cfg->load_budget_ns = DEFAULT_LOAD_BUDGET_NS;
    cfg->script_budget_ns = DEFAULT_SCRIPT_BUDGET_NS;
    cfg->hook_instructions = DEFAULT_HOOK;
    cfg->synthetic_decisions = DEFAULT_SYNTHETIC;
    cfg->seed = 0x6b7672u;
    kvr_fallback_params_init(&cfg->fallback);
}

void rt_log(kvr_lua_runtime_t *rt, int level, const char *fmt, ...)
{
    if (rt->cfg.log == NULL)
        return;
    char buf[ERR_CAP + 256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof(buf), fmt, ap);
    va_end(ap);
    rt->cfg.log(rt->cfg.log_ctx, level, buf);
}

const struct kvr_lua_embedded *embedded_find(const char *name)
{
    for (size_t i = 0; i < kvr_lua_embedded_count; i++)
        if (strcmp(kvr_lua_embedded[i].name, name) == 0)
            return &kvr_lua_embedded[i];
    return NULL;
}

/* ==== runtime ================================================================================ */

int kvr_lua_runtime_new(const struct kvr_lua_config *cfg, kvr_lua_runtime_t **out)
{
    struct kvr_lua_config def;
    if (cfg == NULL) {
        kvr_lua_config_init(&def);
        cfg = &def;
    }
    if (cfg->mem_limit < MIN_MEM || cfg->budget_ns == 0 || cfg->load_budget_ns == 0 ||
        cfg->hook_instructions == 0 || cfg->hook_instructions > 1000000 ||
        !(cfg->fallback.overlap_weight >= 0) || !(cfg->fallback.temperature >= 0))
        return KVR_EINVAL;
    if (cfg->stop_signal < 0) /* an invalid positive one: sigaction refuses it below */
        return KVR_EINVAL;
    struct kvr_lua_runtime *rt = calloc(1, sizeof(*rt));
    if (rt == NULL)
        return KVR_ENOMEM;
    rt->cfg = *cfg;
    if (rt->cfg.engine.block_size == 0)
        rt->cfg.engine.block_size = 16;
    if (rt->cfg.script_budget_ns == 0)
        rt->cfg.script_budget_ns = DEFAULT_SCRIPT_BUDGET_NS;
    struct timespec res;
    rt->coarse_res_ns = clock_getres(CLOCK_MONOTONIC_COARSE, &res) == 0
                            ? (uint64_t)res.tv_sec * 1000000000u + (uint64_t)res.tv_nsec
                            : 10000000u;
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    if (pthread_mutex_init(&rt->mu, NULL) != 0 || pthread_cond_init(&rt->cond, &ca) != 0 ||
        pthread_mutex_init(&rt->install_mu, NULL) != 0) {
        pthread_condattr_destroy(&ca);
        free(rt);
        return KVR_ENOMEM;
    }
    pthread_condattr_destroy(&ca);
    atomic_init(&rt->generation, 0);
    atomic_init(&rt->stopped_total, 0);
    if (cfg->stop_signal != 0 && watch_install_handler(cfg->stop_signal) != KVR_OK) {
        kvr_lua_runtime_free(rt);
        return KVR_EINVAL;
    }
    rt->set = set_new();
    if (rt->set == NULL) {
        kvr_lua_runtime_free(rt);
        return KVR_ENOMEM;
    }
    /* Compile the library once, then prove it loads (a broken build fails here, not on the
     * first VM). */
    struct lstate *s = NULL;
    char err[ERR_CAP];
    int st = lstate_compile_library(rt, err, sizeof(err));
    if (st == KVR_LUA_OK)
        st = lstate_new(rt, NULL, 0, cfg->seed, &s, err, sizeof(err));
    if (st != KVR_LUA_OK) {
        rt_log(rt, KVR_LUA_LOG_ERROR, "kvr_lua: cannot load the kvr library: %s", err);
        kvr_lua_runtime_free(rt);
        return st == KVR_LUA_ERRMEM ? KVR_ENOMEM : KVR_ECORRUPT;
    }
    lstate_free(s);
    *out = rt;
    return KVR_OK;
}

void kvr_lua_runtime_free(kvr_lua_runtime_t *rt)
{
    if (rt == NULL)
        return;
    KVR_ASSERT(rt->vms == NULL); /* every VM must be freed first */
    set_unref(rt->set);
    for (size_t i = 0; i < rt->n_dir_cache; i++)
        free(rt->dir_cache[i].src);
    for (int i = 0; i < 2; i++)
        free(rt->lib_bc[i].p);
    for (struct vm_watch *w = rt->watches, *next; w != NULL; w = next) {
        next = w->next;
        free(w);
    }
    free(rt->dir_cache);
    pthread_mutex_destroy(&rt->install_mu);
    pthread_cond_destroy(&rt->cond);
    pthread_mutex_destroy(&rt->mu);
    free(rt);
}

uint64_t kvr_lua_runtime_generation(kvr_lua_runtime_t *rt)
{
    return atomic_load_explicit(&rt->generation, memory_order_acquire);
}

int kvr_lua_runtime_wait(kvr_lua_runtime_t *rt, uint64_t gen, uint64_t timeout_ms, char *err,
                         size_t err_len)
{
    struct timespec dl;
    clock_gettime(CLOCK_MONOTONIC, &dl);
    dl.tv_sec += (time_t)(timeout_ms / 1000);
    dl.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
    if (dl.tv_nsec >= 1000000000L) {
        dl.tv_sec++;
        dl.tv_nsec -= 1000000000L;
    }
    int rc = KVR_OK;
    pthread_mutex_lock(&rt->mu);
    for (;;) {
        struct kvr_lua_vm *lag = NULL;
        for (struct kvr_lua_vm *vm = rt->vms; vm != NULL; vm = vm->next)
            if (atomic_load(&vm->live_gen) < gen) {
                lag = vm;
                break;
            }
        if (lag == NULL)
            break;
        if (pthread_cond_timedwait(&rt->cond, &rt->mu, &dl) == ETIMEDOUT) {
            if (err != NULL && err_len > 0)
                snprintf(err, err_len, "VM %llu still runs generation %llu (< %llu)%s%s",
                         (unsigned long long)lag->id,
                         (unsigned long long)atomic_load(&lag->live_gen), (unsigned long long)gen,
                         lag->build_err[0] ? ": " : "", lag->build_err);
            rc = KVR_ETIMEDOUT;
            break;
        }
    }
    pthread_mutex_unlock(&rt->mu);
    return rc;
}

int kvr_lua_runtime_vm_generations(kvr_lua_runtime_t *rt, uint64_t *out, size_t cap, size_t *n_out)
{
    size_t n = 0;
    pthread_mutex_lock(&rt->mu);
    for (struct kvr_lua_vm *vm = rt->vms; vm != NULL; vm = vm->next) {
        if (n < cap)
            out[n] = atomic_load(&vm->live_gen);
        n++;
    }
    pthread_mutex_unlock(&rt->mu);
    *n_out = n;
    return n <= cap ? KVR_OK : KVR_ERANGE;
}

/* ==== names and counters ===================================================================== */

int rt_valid_name(const char *name, size_t len)
{
    if (len == 0 || len > KVR_LUA_NAME_MAX)
        return 0;
    for (size_t i = 0; i < len; i++) {
        char c = name[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '_' || c == '.' || c == '-'))
            return 0;
    }
    return 1;
}

int rt_name_id(kvr_lua_runtime_t *rt, const char *name)
{
    for (size_t i = 0; i < rt->n_names; i++)
        if (strcmp(rt->names[i].name, name) == 0)
            return (int)i;
    if (rt->n_names == KVR_LUA_MAX_POLICIES)
        return -1;
    struct pname *p = &rt->names[rt->n_names];
    memset(p, 0, sizeof(*p));
    snprintf(p->name, sizeof(p->name), "%s", name);
    return (int)rt->n_names++;
}

int rt_counter_id(kvr_lua_runtime_t *rt, uint32_t policy_id, const char *name, size_t len)
{
    int id = -1;
    pthread_mutex_lock(&rt->mu);
    for (size_t i = 0; i < rt->n_counters; i++)
        if (rt->counters[i].policy_id == policy_id && strlen(rt->counters[i].name) == len &&
            memcmp(rt->counters[i].name, name, len) == 0) {
            id = (int)i;
            break;
        }
    if (id < 0 && rt->n_counters < KVR_LUA_MAX_COUNTERS) {
        struct ucounter *c = &rt->counters[rt->n_counters];
        c->policy_id = policy_id;
        memcpy(c->name, name, len);
        c->name[len] = '\0';
        id = (int)rt->n_counters++;
    }
    pthread_mutex_unlock(&rt->mu);
    return id;
}

static uint64_t ld(const atomic_ullong *a)
{
    return atomic_load_explicit(a, memory_order_relaxed);
}

static void sum_stats(kvr_lua_runtime_t *rt, size_t id, struct kvr_lua_policy_stats *out)
{
    memset(out, 0, sizeof(*out));
    const struct vm_pcounters *r = &rt->retired[id];
    out->decisions = ld(&r->decisions);
    out->ok = ld(&r->ok);
    out->errors = ld(&r->errors);
    out->timeouts = ld(&r->timeouts);
    out->oom = ld(&r->oom);
    out->invalid = ld(&r->invalid);
    out->fallbacks = ld(&r->fallbacks);
    out->hook_errors = ld(&r->hook_errors);
    out->lua_ns = ld(&r->lua_ns);
    for (struct kvr_lua_vm *vm = rt->vms; vm != NULL; vm = vm->next) {
        const struct vm_pcounters *c = &vm->pc[id];
        out->decisions += ld(&c->decisions);
        out->ok += ld(&c->ok);
        out->errors += ld(&c->errors);
        out->timeouts += ld(&c->timeouts);
        out->oom += ld(&c->oom);
        out->invalid += ld(&c->invalid);
        out->fallbacks += ld(&c->fallbacks);
        out->hook_errors += ld(&c->hook_errors);
        out->lua_ns += ld(&c->lua_ns);
    }
    const struct pname *p = &rt->names[id];
    out->reloads = p->reloads;
    out->rejected = p->rejected;
    out->generation = p->generation;
    out->trusted = p->trusted;
    out->live = p->live;
}

int kvr_lua_policy_stats(kvr_lua_runtime_t *rt, const char *name, struct kvr_lua_policy_stats *out)
{
    int rc = KVR_ENOTFOUND;
    pthread_mutex_lock(&rt->mu);
    for (size_t i = 0; i < rt->n_names; i++)
        if (strcmp(rt->names[i].name, name) == 0) {
            sum_stats(rt, i, out);
            rc = KVR_OK;
            break;
        }
    pthread_mutex_unlock(&rt->mu);
    return rc;
}

void kvr_lua_policy_foreach(kvr_lua_runtime_t *rt,
                            void (*cb)(void *ctx, const char *name,
                                       const struct kvr_lua_policy_stats *st),
                            void *ctx)
{
    pthread_mutex_lock(&rt->mu);
    size_t n = rt->n_names;
    pthread_mutex_unlock(&rt->mu);
    for (size_t i = 0; i < n; i++) {
        struct kvr_lua_policy_stats st;
        char name[NAME_CAP];
        pthread_mutex_lock(&rt->mu);
        sum_stats(rt, i, &st);
        memcpy(name, rt->names[i].name, sizeof(name));
        pthread_mutex_unlock(&rt->mu);
        cb(ctx, name, &st);
    }
}

void kvr_lua_counters_foreach(kvr_lua_runtime_t *rt,
                              void (*cb)(void *ctx, const char *policy, const char *name,
                                         uint64_t value),
                              void *ctx)
{
    pthread_mutex_lock(&rt->mu);
    size_t n = rt->n_counters;
    pthread_mutex_unlock(&rt->mu);
    for (size_t i = 0; i < n; i++) {
        char pol[NAME_CAP], name[NAME_CAP];
        pthread_mutex_lock(&rt->mu);
        uint64_t v = rt->retired_user[i];
        for (struct kvr_lua_vm *vm = rt->vms; vm != NULL; vm = vm->next)
            v += ld(&vm->user[i]);
        memcpy(pol, rt->names[rt->counters[i].policy_id].name, sizeof(pol));
        memcpy(name, rt->counters[i].name, sizeof(name));
        pthread_mutex_unlock(&rt->mu);
        cb(ctx, pol, name, v);
    }
}
