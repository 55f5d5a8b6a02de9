/* runtime.c - the process-wide policy runtime: registry of named policies, generations,
 * bindings, counters, waiting for VMs (see kvr/lua.h).
 * SPDX-License-Identifier: Apache-2.0 */
#include <errno.h>
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

/* ==== policy sets ============================================================================ */

struct policy_set *set_new(void)
{
    struct policy_set *s = calloc(1, sizeof(*s));
    if (s == NULL)
        return NULL;
    atomic_init(&s->refs, 1);
    s->default_slot = -1;
    return s;
}

static void def_clear(struct policy_def *p)
{
    free(p->source);
    free(p->bytecode);
    p->source = p->bytecode = NULL;
}

static int def_copy(struct policy_def *dst, const struct policy_def *src)
{
    *dst = *src;
    dst->source = malloc(src->source_len + 1);
    dst->bytecode = malloc(src->bytecode_len ? src->bytecode_len : 1);
    if (dst->source == NULL || dst->bytecode == NULL) {
        def_clear(dst);
        return KVR_ENOMEM;
    }
    memcpy(dst->source, src->source, src->source_len);
    dst->source[src->source_len] = '\0';
    memcpy(dst->bytecode, src->bytecode, src->bytecode_len);
    return KVR_OK;
}

static void set_destroy(struct policy_set *s)
{
    for (size_t i = 0; i < s->n; i++)
        def_clear(&s->p[i]);
    free(s->p);
    free(s->bind);
    free(s);
}

struct policy_set *set_copy(const struct policy_set *s)
{
    struct policy_set *c = set_new();
    if (c == NULL)
        return NULL;
    c->generation = s->generation;
    c->default_slot = s->default_slot;
    if (s->n > 0) {
        c->p = calloc(s->n, sizeof(*c->p));
        if (c->p == NULL)
            goto fail;
        for (size_t i = 0; i < s->n; i++) {
            if (def_copy(&c->p[i], &s->p[i]) != KVR_OK)
                goto fail;
            c->n = i + 1;
        }
    }
    if (s->n_bind > 0) {
        c->bind = malloc(s->n_bind * sizeof(*c->bind));
        if (c->bind == NULL)
            goto fail;
        memcpy(c->bind, s->bind, s->n_bind * sizeof(*c->bind));
        c->n_bind = s->n_bind;
    }
    return c;
fail:
    set_destroy(c);
    return NULL;
}

void set_ref(struct policy_set *s)
{
    atomic_fetch_add_explicit(&s->refs, 1, memory_order_relaxed);
}

void set_unref(struct policy_set *s)
{
    if (s != NULL && atomic_fetch_sub_explicit(&s->refs, 1, memory_order_acq_rel) == 1)
        set_destroy(s);
}

int set_find(const struct policy_set *s, const char *name, size_t len)
{
    for (size_t i = 0; i < s->n; i++)
        if (strlen(s->p[i].name) == len && memcmp(s->p[i].name, name, len) == 0)
            return (int)i;
    return -1;
}

/* Publishes s as the new current set (caller holds rt->mu); returns the new generation. */
static uint64_t publish(kvr_lua_runtime_t *rt, struct policy_set *s)
{
    s->generation = atomic_load(&rt->generation) + 1;
    struct policy_set *old = rt->set;
    rt->set = s;
    atomic_store_explicit(&rt->generation, s->generation, memory_order_release);
    set_unref(old);
    return s->generation;
}

/* Calls every VM's wake callback (outside rt->mu: wake may take the owner's locks). */
static void wake_all(kvr_lua_runtime_t *rt)
{
    struct {
        void (*fn)(void *);
        void *ctx;
    } w[256];
    size_t n = 0;
    pthread_mutex_lock(&rt->mu);
    for (struct kvr_lua_vm *vm = rt->vms; vm != NULL && n < 256; vm = vm->next)
        if (vm->vcfg.wake != NULL) {
            w[n].fn = vm->vcfg.wake;
            w[n].ctx = vm->vcfg.wake_ctx;
            n++;
        }
    pthread_mutex_unlock(&rt->mu);
    for (size_t i = 0; i < n; i++)
        w[i].fn(w[i].ctx);
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
    struct kvr_lua_runtime *rt = calloc(1, sizeof(*rt));
    if (rt == NULL)
        return KVR_ENOMEM;
    rt->cfg = *cfg;
    if (rt->cfg.engine.block_size == 0)
        rt->cfg.engine.block_size = 16;
    if (rt->cfg.script_budget_ns == 0)
        rt->cfg.script_budget_ns = DEFAULT_SCRIPT_BUDGET_NS;
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
    rt->set = set_new();
    if (rt->set == NULL) {
        kvr_lua_runtime_free(rt);
        return KVR_ENOMEM;
    }
    /* Prove the embedded library loads (a broken build fails here, not on the first VM). */
    struct lstate *s = NULL;
    char err[ERR_CAP];
    int st = lstate_new(rt, NULL, 0, cfg->seed, &s, err, sizeof(err));
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

static int valid_name(const char *name, size_t len)
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

/* ==== registry =============================================================================== */

int kvr_lua_policy_install(kvr_lua_runtime_t *rt, const char *name, const char *src, size_t len,
                           unsigned flags, uint64_t *generation, int *status, char *err,
                           size_t err_len)
{
    char dummy[8];
    if (err == NULL || err_len == 0) {
        err = dummy;
        err_len = sizeof(dummy);
    }
    err[0] = '\0';
    int st_dummy;
    if (status == NULL)
        status = &st_dummy;
    *status = KVR_LUA_OK;
    if (name == NULL || !valid_name(name, strlen(name))) {
        snprintf(err, err_len, "invalid policy name (1 to 63 bytes of [A-Za-z0-9_.-])");
        *status = KVR_LUA_INVALID;
        return KVR_EINVAL;
    }
    if (src == NULL || (flags & ~KVR_LUA_TRUSTED) != 0) {
        snprintf(err, err_len, "invalid arguments");
        *status = KVR_LUA_INVALID;
        return KVR_EINVAL;
    }
    pthread_mutex_lock(&rt->install_mu);
    pthread_mutex_lock(&rt->mu);
    int id = rt_name_id(rt, name);
    pthread_mutex_unlock(&rt->mu);
    if (id < 0) {
        pthread_mutex_unlock(&rt->install_mu);
        snprintf(err, err_len, "too many policy names (%d)", KVR_LUA_MAX_POLICIES);
        *status = KVR_LUA_INVALID;
        return KVR_ECAPACITY;
    }
    struct policy_def p;
    memset(&p, 0, sizeof(p));
    snprintf(p.name, sizeof(p.name), "%s", name);
    p.id = (uint32_t)id;
    p.flags = flags;
    p.source = malloc(len + 1);
    if (p.source == NULL) {
        pthread_mutex_unlock(&rt->install_mu);
        snprintf(err, err_len, "out of memory");
        *status = KVR_LUA_ERRMEM;
        return KVR_ENOMEM;
    }
    memcpy(p.source, src, len);
    p.source[len] = '\0';
    p.source_len = len;
    int st = reload_validate(rt, &p, err, err_len); /* no lock held: may take milliseconds */
    *status = st;
    int rc = KVR_OK;
    pthread_mutex_lock(&rt->mu);
    if (st != KVR_LUA_OK) {
        rt->names[id].rejected++;
        rc = st == KVR_LUA_ERRMEM ? KVR_ENOMEM : KVR_EINVAL;
    } else {
        struct policy_set *s = set_copy(rt->set);
        int slot = s ? set_find(s, name, strlen(name)) : -1;
        if (s != NULL && slot < 0) {
            struct policy_def *np = realloc(s->p, (s->n + 1) * sizeof(*np));
            if (np == NULL) {
                set_unref(s);
                s = NULL;
            } else {
                s->p = np;
                slot = (int)s->n++;
                memset(&s->p[slot], 0, sizeof(s->p[slot]));
            }
        }
        if (s == NULL) {
            rc = KVR_ENOMEM;
            *status = KVR_LUA_ERRMEM;
            snprintf(err, err_len, "out of memory");
        } else {
            def_clear(&s->p[slot]);
            s->p[slot] = p; /* takes ownership of source and bytecode */
            p.source = p.bytecode = NULL;
            uint64_t g = publish(rt, s);
            rt->names[id].reloads++;
            rt->names[id].generation = g;
            rt->names[id].trusted = (flags & KVR_LUA_TRUSTED) != 0;
            rt->names[id].live = 1;
            if (generation)
                *generation = g;
        }
    }
    pthread_mutex_unlock(&rt->mu);
    def_clear(&p);
    pthread_mutex_unlock(&rt->install_mu);
    if (rc == KVR_OK) {
        rt_log(rt, KVR_LUA_LOG_INFO, "policy %s installed (generation %llu%s)", name,
               (unsigned long long)kvr_lua_runtime_generation(rt),
               (flags & KVR_LUA_TRUSTED) ? ", trusted: JIT on" : "");
        wake_all(rt);
    } else {
        rt_log(rt, KVR_LUA_LOG_WARN, "policy %s refused: %s", name, err);
    }
    return rc;
}

int kvr_lua_policy_remove(kvr_lua_runtime_t *rt, const char *name, uint64_t *generation)
{
    int rc = KVR_OK;
    pthread_mutex_lock(&rt->install_mu);
    pthread_mutex_lock(&rt->mu);
    int slot = set_find(rt->set, name, strlen(name));
    if (slot < 0) {
        rc = KVR_ENOTFOUND;
    } else {
        struct policy_set *s = set_copy(rt->set);
        if (s == NULL) {
            rc = KVR_ENOMEM;
        } else {
            def_clear(&s->p[slot]);
            memmove(&s->p[slot], &s->p[slot + 1], (s->n - (size_t)slot - 1) * sizeof(*s->p));
            s->n--;
            size_t k = 0;
            for (size_t i = 0; i < s->n_bind; i++) {
                if (s->bind[i].slot == slot)
                    continue;
                s->bind[k] = s->bind[i];
                if (s->bind[k].slot > slot)
                    s->bind[k].slot--;
                k++;
            }
            s->n_bind = k;
            if (s->default_slot == slot)
                s->default_slot = -1;
            else if (s->default_slot > slot)
                s->default_slot--;
            int id = rt_name_id(rt, name);
            rt->names[id].live = 0;
            uint64_t g = publish(rt, s);
            if (generation)
                *generation = g;
        }
    }
    pthread_mutex_unlock(&rt->mu);
    pthread_mutex_unlock(&rt->install_mu);
    if (rc == KVR_OK)
        wake_all(rt);
    return rc;
}

int kvr_lua_policy_bind(kvr_lua_runtime_t *rt, const char *model, const char *policy,
                        uint64_t *generation)
{
    size_t mlen = model ? strlen(model) : 0;
    if (mlen > KVR_LUA_NAME_MAX)
        return KVR_EINVAL;
    int rc = KVR_OK;
    pthread_mutex_lock(&rt->install_mu);
    pthread_mutex_lock(&rt->mu);
    int slot = -1;
    if (policy != NULL && (slot = set_find(rt->set, policy, strlen(policy))) < 0) {
        rc = KVR_ENOTFOUND;
        goto out;
    }
    struct policy_set *s = set_copy(rt->set);
    if (s == NULL) {
        rc = KVR_ENOMEM;
        goto out;
    }
    if (mlen == 0) {
        s->default_slot = slot;
    } else {
        size_t i = 0;
        while (i < s->n_bind &&
               !(s->bind[i].model_len == mlen && memcmp(s->bind[i].model, model, mlen) == 0))
            i++;
        if (slot < 0) { /* unbind */
            if (i < s->n_bind)
                s->bind[i] = s->bind[--s->n_bind];
        } else if (i < s->n_bind) {
            s->bind[i].slot = slot;
        } else if (s->n_bind == KVR_LUA_MAX_BINDINGS) {
            set_unref(s);
            rc = KVR_ECAPACITY;
            goto out;
        } else {
            struct binding *nb = realloc(s->bind, (s->n_bind + 1) * sizeof(*nb));
            if (nb == NULL) {
                set_unref(s);
                rc = KVR_ENOMEM;
                goto out;
            }
            s->bind = nb;
            memset(&nb[s->n_bind], 0, sizeof(*nb));
            memcpy(nb[s->n_bind].model, model, mlen);
            nb[s->n_bind].model_len = mlen;
            nb[s->n_bind].slot = slot;
            s->n_bind++;
        }
    }
    uint64_t g = publish(rt, s);
    if (generation)
        *generation = g;
out:
    pthread_mutex_unlock(&rt->mu);
    pthread_mutex_unlock(&rt->install_mu);
    if (rc == KVR_OK)
        wake_all(rt);
    return rc;
}

/* ==== shipped policies ======================================================================= */

static const char *builtin_names[KVR_LUA_MAX_POLICIES + 1];
static pthread_once_t builtin_once = PTHREAD_ONCE_INIT;

static void builtin_init(void)
{
    size_t n = 0;
    for (size_t i = 0; i < kvr_lua_embedded_count && n < KVR_LUA_MAX_POLICIES; i++)
        if (strncmp(kvr_lua_embedded[i].name, "policies/", 9) == 0)
            builtin_names[n++] = kvr_lua_embedded[i].name + 9;
    builtin_names[n] = NULL;
}

const char *const *kvr_lua_builtin_names(void)
{
    pthread_once(&builtin_once, builtin_init);
    return builtin_names;
}

int kvr_lua_builtin_source(kvr_lua_runtime_t *rt, const char *name, const char **src, size_t *len)
{
    if (name == NULL || !valid_name(name, strlen(name)))
        return KVR_ENOTFOUND;
    if (rt != NULL && rt->cfg.policy_dir != NULL) {
        int rc = KVR_ENOTFOUND;
        pthread_mutex_lock(&rt->mu);
        for (size_t i = 0; i < rt->n_dir_cache; i++)
            if (strcmp(rt->dir_cache[i].name, name) == 0) {
                *src = rt->dir_cache[i].src;
                *len = rt->dir_cache[i].len;
                rc = KVR_OK;
            }
        if (rc != KVR_OK) {
            char path[1024];
            snprintf(path, sizeof(path), "%s/%s.lua", rt->cfg.policy_dir, name);
            FILE *f = fopen(path, "rb");
            if (f != NULL) {
                char *buf = NULL;
                size_t n = 0, cap = 0;
                int ok = 1;
                for (;;) {
                    if (n == cap) {
                        char *b = realloc(buf, cap ? cap * 2 : 16384);
                        if (b == NULL) {
                            ok = 0;
                            break;
                        }
                        buf = b;
                        cap = cap ? cap * 2 : 16384;
                    }
                    size_t r = fread(buf + n, 1, cap - n, f);
                    n += r;
                    if (r == 0)
                        break;
                }
                fclose(f);
                struct dir_src *dc =
                    ok ? realloc(rt->dir_cache, (rt->n_dir_cache + 1) * sizeof(*dc)) : NULL;
                if (dc != NULL) {
                    rt->dir_cache = dc;
                    snprintf(dc[rt->n_dir_cache].name, NAME_CAP, "%s", name);
                    dc[rt->n_dir_cache].src = buf;
                    dc[rt->n_dir_cache].len = n;
                    rt->n_dir_cache++;
                    *src = buf;
                    *len = n;
                    rc = KVR_OK;
                } else {
                    free(buf);
                }
            }
        }
        pthread_mutex_unlock(&rt->mu);
        if (rc == KVR_OK)
            return KVR_OK;
    }
    char key[NAME_CAP + 16];
    snprintf(key, sizeof(key), "policies/%s", name);
    const struct kvr_lua_embedded *e = embedded_find(key);
    if (e == NULL)
        return KVR_ENOTFOUND;
    *src = e->data;
    *len = e->len;
    return KVR_OK;
}
