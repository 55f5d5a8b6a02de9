/* policy.c - the policy boundary (see policy.h): the Lua runtime when the build has it (else the
 * built-in classic KV cost), the configured policy sources, hot reload (admin, SIGHUP,
 * --policy-dev), the stuck-call watchdog, operator scripts, status and metrics. */
#include "policy.h"

#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvr/err.h"
#include "models.h"
#include "server.h"

#define BUILTIN_NAME "builtin:kv_cost"

#ifdef KVR_HAVE_LUA
#include <errno.h>
#include <signal.h>
#include <sys/stat.h>

#include "api.h"
#include "jsonw.h"
#include "kvr/lua.h"
#include "kvr/snapshot.h"
#include "snapshots.h"

#define DEFAULT_POLICY "bounded_affinity" /* policies/README.md "The default" (policy lab) */
#define MAX_FILES 64

/* The signal the watchdog interrupts a stuck trusted call with (kvr/lua.h "Stuck calls"); no
 * thread of the server blocks it. */
#define STOP_SIGNAL (SIGRTMIN + 4)

/* A configured policy source: a file (re-read on reload) or a shipped name. */
struct pfile {
    char model[200];       /* model key, "" = the default binding */
    char name[64];         /* installed policy name */
    char path[512];        /* file path, "" for a shipped policy */
    struct timespec mtime; /* the file's at its last install attempt (--policy-dev) */
};
#endif

struct srv_policy_rt {
    struct srv *s;
    _Atomic uint64_t generation;
    _Atomic uint64_t installs_refused;
#ifdef KVR_HAVE_LUA
    kvr_lua_runtime_t *lua;
    struct pfile files[MAX_FILES];
    size_t n_files;
    /* KV-event hooks: the threads whose VMs may receive events (registered on their thread) */
    pthread_mutex_t th_mu;
    struct srv_thread *th[SRV_MAX_THREADS]; /* under th_mu */
    _Atomic unsigned any_hooks;             /* OR of the registered threads' kv_hooks */
    _Atomic uint64_t hook_batches;          /* event batches delivered to a thread */
    _Atomic uint64_t hook_dropped;          /* batches dropped: that thread was too far behind */
    _Atomic uint64_t dev_reloads;           /* --policy-dev re-installs (accepted) */
    _Atomic uint64_t scripts;               /* operator scripts run (POST /admin/script) */
#endif
};

static int builtin_name(const char *p)
{
    return strcmp(p, "builtin") == 0 || strcmp(p, BUILTIN_NAME) == 0 ||
#ifndef KVR_HAVE_LUA
           strcmp(p, "kv") == 0 || strcmp(p, "kv_cost") == 0 ||
#endif
           0;
}

#ifndef KVR_HAVE_LUA

/* ==== without the Lua runtime: the built-in policy only ====================================== */

int srv_policy_rt_new(struct srv *s, struct srv_policy_rt **out, char *err, size_t err_len)
{
    const struct srv_config *cfg = s->cfg;
    if (cfg->policy != NULL && !builtin_name(cfg->policy)) {
        snprintf(err, err_len,
                 "--policy %s: Lua policies need the policy runtime, which is not in this build "
                 "(only the built-in 'kv' policy is available)",
                 cfg->policy);
        return KVR_EINVAL;
    }
    for (size_t k = 0; k < cfg->n_models; k++)
        if (cfg->models[k].policy != NULL && !builtin_name(cfg->models[k].policy)) {
            snprintf(err, err_len,
                     "models[%zu].policy %s: Lua policies need the policy runtime, which is not "
                     "in this build (only the built-in 'kv' policy is available)",
                     k + 1, cfg->models[k].policy);
            return KVR_EINVAL;
        }
    struct srv_policy_rt *rt = calloc(1, sizeof(*rt));
    if (rt == NULL)
        return KVR_ENOMEM;
    rt->s = s;
    *out = rt;
    return KVR_OK;
}

void srv_policy_rt_free(struct srv_policy_rt *rt)
{
    free(rt);
}

void srv_policy_thread_init(struct srv_thread *t)
{
    t->policy_vm = NULL;
}

void srv_policy_thread_poll(struct srv_thread *t)
{
    (void)t;
}

void srv_policy_thread_free(struct srv_thread *t)
{
    t->policy_vm = NULL;
}

void srv_policy_events(void *ctx, struct srv_model *m, const struct kvr_event *ev, size_t n)
{
    (void)ctx;
    (void)m;
    (void)ev;
    (void)n;
}

void srv_policy_tick(struct srv_policy_rt *rt)
{
    (void)rt;
}

int srv_policy_ready(struct srv_policy_rt *rt)
{
    (void)rt;
    return 1;
}

int srv_policy_script(struct srv_policy_rt *rt, const char *src, size_t len, struct kvr_buf *out)
{
    (void)rt;
    (void)src;
    (void)len;
    kvr_buf_append_str(out, "{\"error\":\"operator scripts need the Lua policy runtime, which is "
                            "not in this build\"}");
    return 501;
}

#endif

double srv_policy_builtin_cost(double overlap_weight, const struct srv_policy_req *rq,
                               const struct srv_policy_cand *c)
{
    double bs = rq->block_size > 0 ? (double)rq->block_size : 1.0;
    double cached = (double)c->overlap * bs;
    double fresh = (double)rq->isl > cached ? (double)rq->isl - cached : 0.0;
    double prefill_tokens = fresh + (double)c->prefill_tokens;
    double prefill_blocks = prefill_tokens / bs;
    double decode_blocks = (double)c->new_blocks + (double)c->decode_blocks;
    return overlap_weight * prefill_blocks + decode_blocks;
}

/* a before b in the ranking? */
static int before(const struct srv_policy_cand *c, uint32_t a, uint32_t b)
{
    if (c[a].cost != c[b].cost)
        return c[a].cost < c[b].cost;
    if (c[a].tree_blocks != c[b].tree_blocks)
        return c[a].tree_blocks < c[b].tree_blocks;
    return a < b;
}

static void sort_ranked(const struct srv_policy_cand *c, uint32_t *v, size_t n)
{
    for (size_t i = 1; i < n; i++) {
        uint32_t x = v[i];
        size_t j = i;
        while (j > 0 && before(c, x, v[j - 1])) {
            v[j] = v[j - 1];
            j--;
        }
        v[j] = x;
    }
}

void srv_policy_builtin_rank(double overlap_weight, double temperature,
                             const struct srv_policy_req *rq, struct srv_policy_cand *c, size_t n,
                             double u, struct srv_policy_out *out)
{
    uint32_t local[64] = {0};
    uint32_t *all = n <= 64 ? local : malloc(n * sizeof(*all));
    double cmin = INFINITY, cmax = -INFINITY;
    for (size_t k = 0; k < n; k++) {
        c[k].cost = srv_policy_builtin_cost(overlap_weight, rq, &c[k]);
        cmin = c[k].cost < cmin ? c[k].cost : cmin;
        cmax = c[k].cost > cmax ? c[k].cost : cmax;
    }
    out->n = 0;
    if (all == NULL) { /* OOM on a huge candidate list: argmin only */
        uint32_t best = 0;
        for (uint32_t k = 1; k < n; k++)
            if (before(c, k, best))
                best = k;
        out->ranked[out->n++] = best;
        return;
    }
    for (size_t k = 0; k < n; k++)
        all[k] = (uint32_t)k;
    sort_ranked(c, all, n);
    size_t first = 0; /* position in `all` of the pick */
    if (temperature > 0 && n > 1) {
        if (cmax == cmin) {
            first = (size_t)(u * (double)n);
            if (first >= n)
                first = n - 1;
            /* uniform among all: map the draw onto candidate order, not rank order */
            for (size_t k = 0; k < n; k++)
                if (all[k] == first) {
                    first = k;
                    break;
                }
        } else {
            double scale = 1.0;
            if (!isfinite(cmax - cmin)) {
                double m = fabs(cmin) > fabs(cmax) ? fabs(cmin) : fabs(cmax);
                scale = m > 0 ? m : 1.0;
            }
            double lo = cmin / scale, span = (cmax - cmin) / scale, sum = 0, cum = 0;
            for (size_t k = 0; k < n; k++)
                sum += exp(-((c[k].cost / scale) - lo) / (span * temperature));
            size_t pick = n - 1;
            for (size_t k = 0; k < n; k++) {
                cum += exp(-((c[k].cost / scale) - lo) / (span * temperature)) / sum;
                if (cum >= u) {
                    pick = k;
                    break;
                }
            }
            for (size_t k = 0; k < n; k++)
                if (all[k] == pick) {
                    first = k;
                    break;
                }
        }
    }
    out->ranked[out->n++] = all[first];
    for (size_t k = 0; k < n && out->n < out->cap; k++)
        if (k != first)
            out->ranked[out->n++] = all[k];
    if (all != local)
        free(all);
}

#ifndef KVR_HAVE_LUA

int srv_policy_select(struct srv_thread *t, struct srv_model *m, const struct srv_policy_req *rq,
                      struct srv_policy_cand *c, size_t n, struct srv_policy_out *out)
{
    if (n == 0 || out->cap == 0)
        return KVR_EINVAL;
    double w = rq->overlap_weight >= 0 ? rq->overlap_weight : m->overlap_weight;
    double temp = rq->temperature >= 0 ? rq->temperature : m->temperature;
    double u = temp > 0 ? srv_thread_uniform(t) : 0.0;
    srv_policy_builtin_rank(w, temp, rq, c, n, u, out);
    out->fallback = 0;
    out->status = 0;
    out->policy = BUILTIN_NAME;
    out->generation = atomic_load_explicit(&t->srv->policy->generation, memory_order_relaxed);
    srv_stat_add(&t->st.policy_calls, 1);
    return KVR_OK;
}

void srv_policy_on_response(struct srv_thread *t, struct srv_model *m,
                            const struct srv_policy_req *rq, const struct srv_policy_cand *worker,
                            const struct srv_policy_outcome *out)
{
    (void)t;
    (void)m;
    (void)rq;
    (void)worker;
    (void)out;
}

int srv_policy_install(struct srv_policy_rt *rt, const char *model, const char *src, size_t len,
                       uint64_t *generation, char *err, size_t err_len)
{
    (void)model;
    (void)src;
    (void)len;
    (void)generation;
    atomic_fetch_add(&rt->installs_refused, 1);
    snprintf(err, err_len,
             "the Lua policy runtime is not in this build yet: only the built-in kv cost policy "
             "is available");
    return 501;
}

int srv_policy_reload(struct srv_policy_rt *rt, uint64_t *generation, char *err, size_t err_len)
{
    (void)err;
    (void)err_len;
    *generation = atomic_load(&rt->generation);
    return 200;
}

void srv_policy_status(struct srv_policy_rt *rt, struct srv_jw *w)
{
    srv_jw_key(w, "runtime");
    srv_jw_cstr(w, "builtin");
    srv_jw_raw(w, ",");
    srv_jw_key(w, "generation");
    srv_jw_u64(w, atomic_load(&rt->generation));
    srv_jw_raw(w, ",");
    srv_jw_key(w, "policies");
    srv_jw_raw(w, "[{\"name\":\"" BUILTIN_NAME "\",\"models\":\"*\"}]");
}

void srv_policy_metrics(struct srv_policy_rt *rt, struct srv_prom *p)
{
    srv_prom_header(p, "kvrouter_policy_generation", "gauge",
                    "Generation of the installed policy set.");
    srv_prom_u64(p, "kvrouter_policy_generation", NULL, 0, atomic_load(&rt->generation));
    srv_prom_header(p, "kvrouter_policy_installs_refused_total", "counter",
                    "Policy installs refused (syntax, runtime or validation errors).");
    srv_prom_u64(p, "kvrouter_policy_installs_refused_total", NULL, 0,
                 atomic_load(&rt->installs_refused));
}

#else /* KVR_HAVE_LUA */

/* ==== with the Lua runtime (lua/include/kvr/lua.h) ============================================ */

static void lua_log(void *ctx, int level, const char *msg)
{
    struct srv *s = ctx;
    int lv = level <= KVR_LUA_LOG_ERROR  ? SRV_LOG_ERROR
             : level == KVR_LUA_LOG_WARN ? SRV_LOG_WARN
             : level == KVR_LUA_LOG_INFO ? SRV_LOG_INFO
                                         : SRV_LOG_DEBUG;
    srv_logf(s->log, lv, "lua", "%s", msg);
}

static int shipped(const char *name)
{
    const char *const *names = kvr_lua_builtin_names();
    for (size_t k = 0; names != NULL && names[k] != NULL; k++)
        if (strcmp(names[k], name) == 0)
            return 1;
    return 0;
}

/* A policy name from a file name or model key: [A-Za-z0-9_.-], at most 63 bytes. */
static void policy_name(const char *from, char *out, size_t cap)
{
    const char *base = strrchr(from, '/');
    base = base != NULL ? base + 1 : from;
    size_t n = 0;
    for (const char *p = base; *p && n + 1 < cap && n < KVR_LUA_NAME_MAX; p++) {
        if (strcmp(p, ".lua") == 0)
            break;
        char c = *p;
        int ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                 c == '_' || c == '.' || c == '-';
        out[n++] = ok ? c : '.';
    }
    if (n == 0)
        out[n++] = 'p';
    out[n] = '\0';
}

static char *read_file(const char *path, size_t *len, char *err, size_t err_len)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        snprintf(err, err_len, "%s: %s", path, strerror(errno));
        return NULL;
    }
    size_t cap = 4u << 20;
    char *buf = malloc(cap + 1);
    if (buf == NULL) {
        fclose(f);
        snprintf(err, err_len, "%s: out of memory", path);
        return NULL;
    }
    *len = fread(buf, 1, cap + 1, f);
    int bad = ferror(f) || *len > cap;
    fclose(f);
    if (bad) {
        free(buf);
        snprintf(err, err_len, "%s: %s", path, *len > cap ? "larger than 4 MiB" : "read error");
        return NULL;
    }
    buf[*len] = '\0';
    return buf;
}

/* Installs one configured source and binds it. Returns an HTTP-style status. */
static int install_pfile(struct srv_policy_rt *rt, struct pfile *pf, uint64_t *gen, char *err,
                         size_t err_len)
{
    const char *src;
    size_t len = 0;
    char *owned = NULL;
    unsigned flags = 0;
    if (pf->path[0] != '\0') {
        struct stat st;
        if (stat(pf->path, &st) == 0)
            pf->mtime = st.st_mtim; /* before reading: a write during the read is seen next */
        if ((owned = read_file(pf->path, &len, err, err_len)) == NULL)
            return 400;
        src = owned;
        if (rt->s->cfg->policy_trusted)
            flags = KVR_LUA_TRUSTED; /* the operator's opt-in (--policy-trusted) */
    } else {
        if (kvr_lua_builtin_source(rt->lua, pf->name, &src, &len) != KVR_OK) {
            snprintf(err, err_len, "no shipped policy '%s'", pf->name);
            return 400;
        }
        flags = KVR_LUA_TRUSTED; /* reviewed and tested for bounded work (policies/README.md) */
    }
    int status = 0;
    char e[1024];
    int rc = kvr_lua_policy_install(rt->lua, pf->name, src, len, flags, gen, &status, e, sizeof(e));
    free(owned);
    if (rc != KVR_OK) {
        snprintf(err, err_len, "policy %s%s%s: %s", pf->name, pf->path[0] ? " from " : "", pf->path,
                 e);
        return rc == KVR_ENOMEM ? 503 : rc == KVR_ECAPACITY ? 507 : 400;
    }
    rc = kvr_lua_policy_bind(rt->lua, pf->model[0] ? pf->model : NULL, pf->name, gen);
    if (rc != KVR_OK) {
        snprintf(err, err_len, "cannot bind policy %s: %s", pf->name, kvr_strerror(rc));
        return 500;
    }
    return 200;
}

static int add_source(struct srv_policy_rt *rt, const char *model, const char *spec, char *err,
                      size_t err_len)
{
    if (builtin_name(spec))
        return KVR_OK; /* the C policy: nothing to install (an unbound model falls back to it) */
    if (rt->n_files >= MAX_FILES) {
        snprintf(err, err_len, "too many policy sources");
        return KVR_ECAPACITY;
    }
    struct pfile *pf = &rt->files[rt->n_files];
    memset(pf, 0, sizeof(*pf));
    snprintf(pf->model, sizeof(pf->model), "%s", model ? model : "");
    struct stat st;
    if (strchr(spec, '/') != NULL || strstr(spec, ".lua") != NULL || stat(spec, &st) == 0) {
        snprintf(pf->path, sizeof(pf->path), "%s", spec);
        policy_name(spec, pf->name, sizeof(pf->name));
    } else if (shipped(spec)) {
        snprintf(pf->name, sizeof(pf->name), "%s", spec);
    } else {
        snprintf(err, err_len, "policy '%s' is neither a file nor a shipped policy (%s)", spec,
                 "bounded_affinity, kv_cost, cache_aware, weighted, least_loaded, ...");
        return KVR_EINVAL;
    }
    rt->n_files++;
    return KVR_OK;
}

/* ==== operator scripts: kvr.admin.dump(path) / kvr.admin.snapshot(path) =====================
 *
 * Both write only where POST /admin/snapshot?path= may (srv_snapshot_resolve: a file in the
 * directory of --snapshot FILE), so a script cannot write anywhere else. They run on the control
 * thread (kvr_lua_script_run's caller). */

static int admin_snapshot(void *ctx, const char *path, char *err, size_t err_len)
{
    struct srv *s = ctx;
    char file[4096];
    int rc = srv_snapshot_resolve(s, path, file, sizeof(file), err, err_len);
    if (rc != KVR_OK)
        return rc;
    return srv_snapshot_write(s, file, NULL, NULL, err, err_len);
}

/* Every model's index as the events that rebuild it, GET /dump's JSON, written atomically
 * (kvr_snapshot_write_atomic: temp file, fsync, rename). */
static int admin_dump(void *ctx, const char *path, char *err, size_t err_len)
{
    struct srv *s = ctx;
    char file[4096];
    int rc = srv_snapshot_resolve(s, path, file, sizeof(file), err, err_len);
    if (rc != KVR_OK)
        return rc;
    struct kvr_buf b;
    kvr_buf_init(&b, NULL);
    if (srv_dump_json(s, &b) != KVR_OK) {
        snprintf(err, err_len, "out of memory while building the dump");
        rc = KVR_ENOMEM;
    } else {
        rc = kvr_snapshot_write_atomic(file, b.data, b.len, err, err_len);
    }
    kvr_buf_free(&b);
    return rc;
}

int srv_policy_script(struct srv_policy_rt *rt, const char *src, size_t len, struct kvr_buf *out)
{
    char *res = malloc(65536), *err = malloc(8192);
    struct srv_jw w;
    srv_jw_init(&w, out);
    if (res == NULL || err == NULL) {
        free(res);
        free(err);
        srv_jw_raw(&w, "{\"error\":\"out of memory\"}");
        return 503;
    }
    atomic_fetch_add(&rt->scripts, 1);
    int st = kvr_lua_script_run(rt->lua, src, len, res, 65536, err, 8192);
    int status = 200;
    if (st == KVR_LUA_OK) {
        srv_jw_raw(&w, "{\"result\":");
        srv_jw_cstr(&w, res);
        srv_jw_char(&w, '}');
    } else {
        status = st == KVR_LUA_ERRMEM ? 413 : st == KVR_LUA_ETIMEDOUT ? 408 : 400;
        srv_jw_raw(&w, "{\"error\":");
        srv_jw_cstr(&w, err);
        srv_jw_raw(&w, ",\"status\":");
        srv_jw_cstr(&w, kvr_lua_status_name(st));
        srv_jw_char(&w, '}'); /* the caller logs the outcome, with this body */
    }
    free(res);
    free(err);
    return w.err == KVR_OK ? status : 503;
}

/* ==== the control thread's tick: the watchdog and --policy-dev ============================== */

static void dev_check(struct srv_policy_rt *rt)
{
    for (size_t k = 0; k < rt->n_files; k++) {
        struct pfile *pf = &rt->files[k];
        struct stat st;
        if (pf->path[0] == '\0' || stat(pf->path, &st) != 0)
            continue;
        if (st.st_mtim.tv_sec == pf->mtime.tv_sec && st.st_mtim.tv_nsec == pf->mtime.tv_nsec)
            continue;
        uint64_t gen = 0;
        char err[1024];
        int status = install_pfile(rt, pf, &gen, err, sizeof(err)); /* records the new mtime */
        if (status == 200) {
            atomic_fetch_add(&rt->dev_reloads, 1);
            atomic_store(&rt->generation, kvr_lua_runtime_generation(rt->lua));
            srv_logf(rt->s->log, SRV_LOG_INFO, "lua",
                     "--policy-dev: %s changed: policy %s re-installed (generation %llu)", pf->path,
                     pf->name, (unsigned long long)gen);
        } else {
            atomic_fetch_add(&rt->installs_refused, 1);
            srv_logf(rt->s->log, SRV_LOG_WARN, "lua",
                     "--policy-dev: %s changed but was refused (the previous version stays): %s",
                     pf->path, err);
        }
    }
}

void srv_policy_tick(struct srv_policy_rt *rt)
{
    if (rt == NULL)
        return;
    const struct srv_config *cfg = rt->s->cfg;
    if (cfg->policy_stuck_after_ms > 0)
        kvr_lua_runtime_watchdog(rt->lua, cfg->policy_stuck_after_ms * 1000000u, NULL);
    if (cfg->policy_dev)
        dev_check(rt);
}

int srv_policy_ready(struct srv_policy_rt *rt)
{
    if (rt == NULL)
        return 1;
    struct kvr_lua_runtime_stats rs;
    kvr_lua_runtime_stats(rt->lua, &rs);
    return rs.stuck_now == 0;
}

int srv_policy_rt_new(struct srv *s, struct srv_policy_rt **out, char *err, size_t err_len)
{
    const struct srv_config *cfg = s->cfg;
    struct srv_policy_rt *rt = calloc(1, sizeof(*rt));
    if (rt == NULL)
        return KVR_ENOMEM;
    rt->s = s;
    if (pthread_mutex_init(&rt->th_mu, NULL) != 0) {
        free(rt);
        return KVR_ENOMEM;
    }
    struct kvr_lua_config lc;
    kvr_lua_config_init(&lc);
    lc.budget_ns = cfg->policy_budget_ms * 1000000u;
    lc.seed = cfg->seed;
    lc.allow_header_policy = cfg->allow_policy_header;
    lc.log = lua_log;
    lc.log_ctx = s;
    lc.script_budget_ns = cfg->script_budget_ms * 1000000u;
    if (cfg->policy_stuck_after_ms > 0)
        lc.stop_signal = STOP_SIGNAL;
    lc.engine.dump = admin_dump; /* operator scripts: kvr.admin.dump / kvr.admin.snapshot */
    lc.engine.snapshot = admin_snapshot;
    lc.engine.admin_ctx = s;
    /* engine handles for kvr.overlap / kvr.load: the runtime binds one index; with a single
     * configured model it is that model's (candidates always carry overlap and load anyway) */
    if (srv_models_count(&s->models) == 1) {
        struct srv_model *m = srv_models_at(&s->models, 0);
        lc.engine.index = m->index;
        lc.engine.load = m->load;
        lc.engine.block_size = m->block_size;
    }
    int rc = kvr_lua_runtime_new(&lc, &rt->lua);
    if (rc != KVR_OK) {
        snprintf(err, err_len, "cannot start the Lua policy runtime: %s", kvr_strerror(rc));
        pthread_mutex_destroy(&rt->th_mu);
        free(rt);
        return rc;
    }
    rc = add_source(rt, NULL, cfg->policy != NULL ? cfg->policy : DEFAULT_POLICY, err, err_len);
    /* clients may name a policy per request: offer every shipped one (installed, not bound) */
    const char *const *names = kvr_lua_builtin_names();
    for (size_t k = 0; rc == KVR_OK && cfg->allow_policy_header && names && names[k]; k++) {
        const char *src;
        size_t len;
        uint64_t gen;
        int st;
        char e[512];
        if (kvr_lua_builtin_source(rt->lua, names[k], &src, &len) == KVR_OK &&
            kvr_lua_policy_install(rt->lua, names[k], src, len, KVR_LUA_TRUSTED, &gen, &st, e,
                                   sizeof(e)) != KVR_OK)
            srv_logf(s->log, SRV_LOG_WARN, "lua", "shipped policy %s not installed: %s", names[k],
                     e);
    }
    for (size_t k = 0; rc == KVR_OK && k < srv_models_count(&s->models); k++) {
        struct srv_model *m = srv_models_at(&s->models, k);
        if (m->policy != NULL)
            rc = add_source(rt, m->key, m->policy, err, err_len);
    }
    for (size_t k = 0; rc == KVR_OK && k < rt->n_files; k++) {
        uint64_t gen;
        if (install_pfile(rt, &rt->files[k], &gen, err, err_len) != 200)
            rc = KVR_EINVAL;
    }
    if (rc != KVR_OK) {
        kvr_lua_runtime_free(rt->lua);
        free(rt);
        return rc;
    }
    atomic_store(&rt->generation, kvr_lua_runtime_generation(rt->lua));
    *out = rt;
    return KVR_OK;
}

void srv_policy_rt_free(struct srv_policy_rt *rt)
{
    if (rt == NULL)
        return;
    kvr_lua_runtime_free(rt->lua);
    pthread_mutex_destroy(&rt->th_mu);
    free(rt);
}

/* ==== KV-event hooks (on_stored / on_removed / on_cleared) ==================================
 *
 * Events are applied on the subscriber thread (ZMQ) or an HTTP thread (/v1/events); policies
 * live in one VM per HTTP thread. A batch is copied once into a refcounted list and posted to
 * every thread whose VM defines a matching hook (its kv_hooks bits, refreshed whenever the VM
 * swaps to a new generation); nothing is copied when no policy has a hook. A thread with more
 * than KV_HOOK_MAX_PENDING batches queued gets no more until it catches up (counted as
 * dropped): hooks serve policies that keep their own state, best effort, never at the cost of
 * routing. */

#define KV_HOOK_MAX_PENDING 256u

struct evbatch {
    _Atomic uint32_t refs;
    struct srv_model *m; /* models live as long as the server */
    struct kvr_event_list l;
};

static void evbatch_unref(struct evbatch *b)
{
    if (atomic_fetch_sub_explicit(&b->refs, 1, memory_order_acq_rel) == 1) {
        kvr_event_list_free(&b->l);
        free(b);
    }
}

/* Recomputes any_hooks; th_mu held. */
static void hooks_refresh_locked(struct srv_policy_rt *rt)
{
    unsigned any = 0;
    for (size_t k = 0; k < SRV_MAX_THREADS; k++)
        if (rt->th[k] != NULL)
            any |= atomic_load_explicit(&rt->th[k]->kv_hooks, memory_order_relaxed);
    atomic_store_explicit(&rt->any_hooks, any, memory_order_release);
}

/* On the thread: vm (its VM, possibly not yet in t->policy_vm) may have swapped policies;
 * publish its hook bits. */
static void hooks_update_vm(struct srv_thread *t, kvr_lua_vm_t *vm)
{
    struct srv_policy_rt *rt = t->srv->policy;
    unsigned bits = vm != NULL ? kvr_lua_vm_event_hooks(vm) : 0;
    if (bits == atomic_load_explicit(&t->kv_hooks, memory_order_relaxed))
        return;
    pthread_mutex_lock(&rt->th_mu);
    atomic_store_explicit(&t->kv_hooks, bits, memory_order_relaxed);
    hooks_refresh_locked(rt);
    pthread_mutex_unlock(&rt->th_mu);
}

/* The VM's swap callback: runs before the new generation is published, so an install answered
 * 200 already has every thread's hook bits current (events posted right after reach them). */
static void vm_swapped(void *ctx, kvr_lua_vm_t *vm)
{
    hooks_update_vm(ctx, vm);
}

static void events_msg(void *ctx, void *arg)
{
    struct srv_thread *t = ctx;
    struct evbatch *b = arg;
    atomic_fetch_sub_explicit(&t->kv_pending, 1, memory_order_relaxed);
    if (!srv_mq_closing(&t->mq) && t->policy_vm != NULL) {
        struct kvr_lua_engine eng = {
            .index = b->m->index, .load = b->m->load, .block_size = b->m->block_size};
        kvr_lua_vm_set_engine(t->policy_vm, &eng);
        for (size_t i = 0; i < b->l.n; i++)
            (void)kvr_lua_vm_on_event(t->policy_vm, &b->l.ev[i]); /* failures are counted */
        kvr_lua_vm_set_engine(t->policy_vm, NULL);
    }
    evbatch_unref(b);
}

void srv_policy_events(void *ctx, struct srv_model *m, const struct kvr_event *ev, size_t n)
{
    struct srv *s = ctx;
    struct srv_policy_rt *rt = s->policy;
    if (rt == NULL || n == 0 || atomic_load_explicit(&rt->any_hooks, memory_order_acquire) == 0)
        return;
    unsigned kinds = 0;
    for (size_t i = 0; i < n; i++)
        if (ev[i].kind >= KVR_EVENT_STORED && ev[i].kind <= KVR_EVENT_CLEARED)
            kinds |= 1u << ev[i].kind;
    struct evbatch *b = NULL;
    pthread_mutex_lock(&rt->th_mu);
    for (size_t k = 0; k < SRV_MAX_THREADS; k++) {
        struct srv_thread *t = rt->th[k];
        if (t == NULL || !(atomic_load_explicit(&t->kv_hooks, memory_order_relaxed) & kinds))
            continue;
        if (atomic_load_explicit(&t->kv_pending, memory_order_relaxed) >= KV_HOOK_MAX_PENDING) {
            atomic_fetch_add_explicit(&rt->hook_dropped, 1, memory_order_relaxed);
            continue;
        }
        if (b == NULL) {
            b = calloc(1, sizeof(*b));
            if (b == NULL)
                break;
            kvr_event_list_init(&b->l);
            b->m = m;
            atomic_init(&b->refs, 1); /* ours, dropped below */
            for (size_t i = 0; i < n; i++) {
                if (kvr_event_list_push(&b->l, &ev[i]) != KVR_OK) {
                    kvr_event_list_free(&b->l);
                    free(b);
                    b = NULL;
                    break;
                }
            }
            if (b == NULL)
                break;
        }
        atomic_fetch_add_explicit(&b->refs, 1, memory_order_relaxed);
        atomic_fetch_add_explicit(&t->kv_pending, 1, memory_order_relaxed);
        if (srv_mq_post(&t->mq, events_msg, b) != KVR_OK) {
            atomic_fetch_sub_explicit(&t->kv_pending, 1, memory_order_relaxed);
            atomic_fetch_sub_explicit(&b->refs, 1, memory_order_relaxed);
            atomic_fetch_add_explicit(&rt->hook_dropped, 1, memory_order_relaxed);
            continue;
        }
        atomic_fetch_add_explicit(&rt->hook_batches, 1, memory_order_relaxed);
    }
    pthread_mutex_unlock(&rt->th_mu);
    if (b != NULL)
        evbatch_unref(b);
}

static void poll_msg(void *ctx, void *arg)
{
    struct srv_thread *t = ctx;
    (void)arg;
    if (!srv_mq_closing(&t->mq) && t->policy_vm != NULL)
        kvr_lua_vm_poll(t->policy_vm); /* a swap publishes the hook bits (vm_swapped) */
}

static void wake(void *ctx)
{
    struct srv_thread *t = ctx;
    srv_mq_post(&t->mq, poll_msg, NULL); /* on OOM the 1 s tick polls anyway */
}

void srv_policy_thread_init(struct srv_thread *t)
{
    /* Registered first, so the hook bits the VM publishes while it is built (vm_swapped) count
     * in any_hooks; events posted before t->policy_vm is set are dropped by events_msg. */
    struct srv_policy_rt *rt = t->srv->policy;
    pthread_mutex_lock(&rt->th_mu);
    if (t->idx < SRV_MAX_THREADS)
        rt->th[t->idx] = t;
    pthread_mutex_unlock(&rt->th_mu);
    struct kvr_lua_vm_config vc = {.wake = wake, .wake_ctx = t, .swapped = vm_swapped};
    kvr_lua_vm_t *vm = NULL;
    int rc = kvr_lua_vm_new(rt->lua, &vc, &vm);
    if (rc != KVR_OK) {
        srv_logf(t->srv->log, SRV_LOG_ERROR, t->name,
                 "cannot create this thread's Lua VM (%s): the built-in policy decides",
                 kvr_strerror(rc));
        vm = NULL;
    }
    t->policy_vm = vm;
    hooks_update_vm(t, vm);
}

void srv_policy_thread_poll(struct srv_thread *t)
{
    if (t->policy_vm != NULL)
        kvr_lua_vm_poll(t->policy_vm); /* a swap publishes the hook bits (vm_swapped) */
}

void srv_policy_thread_free(struct srv_thread *t)
{
    struct srv_policy_rt *rt = t->srv->policy;
    pthread_mutex_lock(&rt->th_mu);
    if (t->idx < SRV_MAX_THREADS && rt->th[t->idx] == t)
        rt->th[t->idx] = NULL;
    atomic_store_explicit(&t->kv_hooks, 0, memory_order_relaxed);
    hooks_refresh_locked(rt);
    pthread_mutex_unlock(&rt->th_mu);
    if (t->policy_vm != NULL)
        kvr_lua_vm_free(t->policy_vm);
    t->policy_vm = NULL;
}

static uint32_t clamp32(uint64_t v)
{
    return v > UINT32_MAX ? UINT32_MAX : (uint32_t)v;
}

/* The runtime's view of a request (headers copied into hs[64]). */
static void fill_request(struct kvr_ffi_request *req, struct kvr_ffi_header *hs,
                         const struct srv_policy_req *rq, const struct srv_model *m)
{
    size_t nh = rq->n_headers < 64 ? rq->n_headers : 64;
    for (size_t k = 0; k < nh; k++) {
        hs[k].name = rq->headers[k].name;
        hs[k].value = rq->headers[k].value;
        hs[k].name_len = rq->headers[k].name_len;
        hs[k].value_len = rq->headers[k].value_len;
    }
    memset(req, 0, sizeof(*req));
    req->model = rq->model;
    req->model_len = (uint32_t)strlen(rq->model);
    req->session = rq->session;
    req->session_len = (uint32_t)rq->session_len;
    req->lora = rq->lora;
    req->lora_len = (uint32_t)rq->lora_len;
    req->policy = rq->policy;
    req->policy_len = (uint32_t)rq->policy_len;
    req->headers = nh ? hs : NULL;
    req->n_headers = (uint32_t)nh;
    req->local_hashes = rq->locals;
    req->seq_hashes = rq->seqs;
    req->request_id = rq->request_id;
    req->overlap_weight = rq->overlap_weight >= 0 ? rq->overlap_weight : m->overlap_weight;
    req->temperature = rq->temperature >= 0 ? rq->temperature : m->temperature;
    req->tokens = rq->isl;
    req->blocks = rq->blocks;
    req->block_size = rq->block_size;
    req->priority = rq->priority;
}

/* What the server knows of a candidate. It has no source for some of the runtime's fields, which
 * policies then see inert (docs/LUA_API.md "What the server fills"): kv_usage unknown (nil: no
 * worker metrics are scraped), queue 0 (the worker's own queue is not reported; requests the
 * router sends are in `requests`), overlap_host / overlap_disk 0 (the index holds device-tier
 * blocks only), weight 1 (no per-worker weight option). */
static void fill_candidate(struct kvr_ffi_candidate *fc, const struct srv_policy_cand *c)
{
    memset(fc, 0, sizeof(*fc));
    fc->worker_id = c->worker_id;
    fc->url = c->url;
    fc->url_len = c->url ? (uint32_t)strlen(c->url) : 0;
    fc->labels = c->labels;
    fc->labels_len = c->labels ? (uint32_t)strlen(c->labels) : 0;
    fc->kv_usage = -1;
    fc->weight = 1;
    fc->dp_rank = c->dp_rank;
    fc->healthy = c->healthy;
    fc->overlap = c->overlap;
    fc->tree_blocks = c->tree_blocks;
    fc->prefill_tokens = clamp32(c->prefill_tokens);
    fc->decode_blocks = clamp32(c->decode_blocks);
    fc->new_blocks = clamp32(c->new_blocks);
    fc->requests = clamp32(c->requests);
}

void srv_policy_on_response(struct srv_thread *t, struct srv_model *m,
                            const struct srv_policy_req *rq, const struct srv_policy_cand *worker,
                            const struct srv_policy_outcome *out)
{
    if (t->policy_vm == NULL)
        return;
    struct kvr_ffi_header hs[64];
    struct kvr_ffi_request req;
    struct kvr_ffi_candidate fc;
    fill_request(&req, hs, rq, m);
    fill_candidate(&fc, worker);
    struct kvr_ffi_outcome o;
    memset(&o, 0, sizeof(o));
    o.status = out->status;
    o.ttft_ms = out->ttft_ms;
    o.latency_ms = out->latency_ms;
    o.error = out->error;
    o.error_len = out->error ? (uint32_t)strlen(out->error) : 0;
    struct kvr_lua_engine eng = {.index = m->index, .load = m->load, .block_size = m->block_size};
    kvr_lua_vm_set_engine(t->policy_vm, &eng); /* kvr.overlap & co. answer for this model */
    kvr_lua_vm_on_response(t->policy_vm, &req, &fc, &o); /* failures are counted and logged */
    kvr_lua_vm_set_engine(t->policy_vm, NULL);
}

int srv_policy_select(struct srv_thread *t, struct srv_model *m, const struct srv_policy_req *rq,
                      struct srv_policy_cand *c, size_t n, struct srv_policy_out *out)
{
    if (n == 0 || out->cap == 0)
        return KVR_EINVAL;
    double w = rq->overlap_weight >= 0 ? rq->overlap_weight : m->overlap_weight;
    double temp = rq->temperature >= 0 ? rq->temperature : m->temperature;
    for (size_t k = 0; k < n; k++) /* the classic cost, for "scores" */
        c[k].cost = srv_policy_builtin_cost(w, rq, &c[k]);
    srv_stat_add(&t->st.policy_calls, 1);
    if (t->policy_vm == NULL) {
        double u = temp > 0 ? srv_thread_uniform(t) : 0.0;
        srv_policy_builtin_rank(w, temp, rq, c, n, u, out);
        out->fallback = 1;
        out->status = KVR_LUA_NOPOLICY;
        out->policy = BUILTIN_NAME;
        srv_stat_add(&t->st.policy_fallbacks, 1);
        return KVR_OK;
    }
    struct kvr_ffi_header hs[64];
    struct kvr_ffi_request req;
    fill_request(&req, hs, rq, m);
    struct kvr_ffi_candidate local[64], *fc = n <= 64 ? local : calloc(n, sizeof(*fc));
    if (fc == NULL) {
        srv_policy_builtin_rank(w, temp, rq, c, n, srv_thread_uniform(t), out);
        out->fallback = 1;
        out->policy = BUILTIN_NAME;
        return KVR_OK;
    }
    for (size_t k = 0; k < n; k++)
        fill_candidate(&fc[k], &c[k]);
    struct kvr_lua_decision d;
    memset(&d, 0, sizeof(d));
    d.ranked = out->ranked;
    d.cap = out->cap;
    struct kvr_lua_engine eng = {.index = m->index, .load = m->load, .block_size = m->block_size};
    kvr_lua_vm_set_engine(t->policy_vm, &eng); /* kvr.overlap & co. answer for this model */
    int rc = kvr_lua_vm_select(t->policy_vm, &req, fc, n, &d);
    kvr_lua_vm_set_engine(t->policy_vm, NULL);
    if (fc != local)
        free(fc);
    if (rc != KVR_OK || d.n_ranked == 0) {
        srv_policy_builtin_rank(w, temp, rq, c, n, srv_thread_uniform(t), out);
        out->fallback = 1;
        out->policy = BUILTIN_NAME;
        srv_stat_add(&t->st.policy_fallbacks, 1);
        return KVR_OK;
    }
    out->n = d.n_ranked;
    out->fallback = d.fallback;
    out->status = d.status;
    out->policy = d.policy != NULL && d.policy[0] ? d.policy : BUILTIN_NAME;
    out->generation = d.generation;
    if (d.fallback)
        srv_stat_add(&t->st.policy_fallbacks, 1);
    if (d.status == KVR_LUA_ERRRUN || d.status == KVR_LUA_ERRMEM || d.status == KVR_LUA_INVALID)
        srv_stat_add(&t->st.policy_errors, 1);
    else if (d.status == KVR_LUA_ETIMEDOUT)
        srv_stat_add(&t->st.policy_timeouts, 1);
    return KVR_OK;
}

int srv_policy_install(struct srv_policy_rt *rt, const char *model, const char *src, size_t len,
                       uint64_t *generation, char *err, size_t err_len)
{
    char name[64];
    policy_name(model != NULL ? model : "default", name, sizeof(name));
    int status = 0;
    char e[1024];
    int rc = kvr_lua_policy_install(rt->lua, name, src, len, 0, generation, &status, e, sizeof(e));
    if (rc != KVR_OK) {
        atomic_fetch_add(&rt->installs_refused, 1);
        snprintf(err, err_len, "%s", e[0] ? e : kvr_strerror(rc));
        return rc == KVR_ENOMEM ? 503 : rc == KVR_ECAPACITY ? 507 : 400;
    }
    rc = kvr_lua_policy_bind(rt->lua, model, name, generation);
    if (rc != KVR_OK) {
        snprintf(err, err_len, "installed but cannot bind: %s", kvr_strerror(rc));
        return 500;
    }
    rc = kvr_lua_runtime_wait(rt->lua, *generation, 10000, err, err_len);
    atomic_store(&rt->generation, kvr_lua_runtime_generation(rt->lua));
    return rc == KVR_OK ? 200 : 503;
}

int srv_policy_reload(struct srv_policy_rt *rt, uint64_t *generation, char *err, size_t err_len)
{
    *generation = kvr_lua_runtime_generation(rt->lua);
    for (size_t k = 0; k < rt->n_files; k++) {
        if (rt->files[k].path[0] == '\0')
            continue;
        int status = install_pfile(rt, &rt->files[k], generation, err, err_len);
        if (status != 200) {
            atomic_fetch_add(&rt->installs_refused, 1);
            return status;
        }
    }
    int rc = kvr_lua_runtime_wait(rt->lua, *generation, 10000, err, err_len);
    atomic_store(&rt->generation, kvr_lua_runtime_generation(rt->lua));
    return rc == KVR_OK ? 200 : 503;
}

struct pctx {
    struct srv_jw *w;
    struct srv_prom *p;
    int first;
    int field;
};

static void status_one(void *ctx, const char *name, const struct kvr_lua_policy_stats *st)
{
    struct pctx *c = ctx;
    if (!c->first)
        srv_jw_char(c->w, ',');
    c->first = 0;
    srv_jw_raw(c->w, "{\"name\":");
    srv_jw_cstr(c->w, name);
    srv_jw_raw(c->w, ",\"live\":");
    srv_jw_bool(c->w, st->live);
    srv_jw_raw(c->w, ",\"trusted\":");
    srv_jw_bool(c->w, st->trusted);
    srv_jw_raw(c->w, ",\"generation\":");
    srv_jw_u64(c->w, st->generation);
    srv_jw_raw(c->w, ",\"decisions\":");
    srv_jw_u64(c->w, st->decisions);
    srv_jw_raw(c->w, ",\"fallbacks\":");
    srv_jw_u64(c->w, st->fallbacks);
    srv_jw_raw(c->w, ",\"errors\":");
    srv_jw_u64(c->w, st->errors);
    srv_jw_raw(c->w, ",\"timeouts\":");
    srv_jw_u64(c->w, st->timeouts);
    srv_jw_raw(c->w, ",\"reloads\":");
    srv_jw_u64(c->w, st->reloads);
    srv_jw_raw(c->w, ",\"rejected\":");
    srv_jw_u64(c->w, st->rejected);
    srv_jw_char(c->w, '}');
}

void srv_policy_status(struct srv_policy_rt *rt, struct srv_jw *w)
{
    srv_jw_key(w, "runtime");
    srv_jw_cstr(w, "lua");
    srv_jw_raw(w, ",");
    srv_jw_key(w, "generation");
    srv_jw_u64(w, kvr_lua_runtime_generation(rt->lua));
    srv_jw_raw(w, ",\"thread_generations\":[");
    uint64_t g[SRV_MAX_THREADS];
    size_t n = 0;
    kvr_lua_runtime_vm_generations(rt->lua, g, SRV_MAX_THREADS, &n);
    for (size_t k = 0; k < n && k < SRV_MAX_THREADS; k++) {
        if (k > 0)
            srv_jw_char(w, ',');
        srv_jw_u64(w, g[k]);
    }
    srv_jw_raw(w, "],\"sources\":[");
    for (size_t k = 0; k < rt->n_files; k++) {
        if (k > 0)
            srv_jw_char(w, ',');
        srv_jw_raw(w, "{\"model\":");
        srv_jw_cstr(w, rt->files[k].model[0] ? rt->files[k].model : NULL);
        srv_jw_raw(w, ",\"policy\":");
        srv_jw_cstr(w, rt->files[k].name);
        srv_jw_raw(w, ",\"file\":");
        srv_jw_cstr(w, rt->files[k].path[0] ? rt->files[k].path : NULL);
        srv_jw_char(w, '}');
    }
    srv_jw_raw(w, "],");
    srv_jw_key(w, "policies");
    srv_jw_char(w, '[');
    struct pctx c = {w, NULL, 1, 0};
    kvr_lua_policy_foreach(rt->lua, status_one, &c);
    srv_jw_char(w, ']');
}

static void metric_one(void *ctx, const char *name, const struct kvr_lua_policy_stats *st)
{
    struct pctx *c = ctx;
    static const char *const fams[] = {
        "kvrouter_policy_calls_total",      "kvrouter_policy_fallback_decisions_total",
        "kvrouter_policy_lua_errors_total", "kvrouter_policy_lua_timeouts_total",
        "kvrouter_policy_lua_oom_total",    "kvrouter_policy_invalid_total",
        "kvrouter_policy_reloads_total",    "kvrouter_policy_rejected_total"};
    uint64_t v[] = {st->decisions, st->fallbacks, st->errors,  st->timeouts,
                    st->oom,       st->invalid,   st->reloads, st->rejected};
    struct srv_prom_label l[1] = {{"policy", name}};
    srv_prom_u64(c->p, fams[c->field], l, 1, v[c->field]);
}

static void counter_one(void *ctx, const char *policy, const char *name, uint64_t value)
{
    struct pctx *c = ctx;
    struct srv_prom_label l[2] = {{"policy", policy}, {"name", name}};
    srv_prom_u64(c->p, "kvrouter_policy_user_counter_total", l, 2, value);
}

void srv_policy_metrics(struct srv_policy_rt *rt, struct srv_prom *p)
{
    static const char *const fams[] = {
        "kvrouter_policy_calls_total",      "kvrouter_policy_fallback_decisions_total",
        "kvrouter_policy_lua_errors_total", "kvrouter_policy_lua_timeouts_total",
        "kvrouter_policy_lua_oom_total",    "kvrouter_policy_invalid_total",
        "kvrouter_policy_reloads_total",    "kvrouter_policy_rejected_total"};
    static const char *const helps[] = {
        "Decisions asked of a Lua policy.",
        "Decisions the built-in policy made instead (error, timeout, memory, invalid choice).",
        "Lua policy calls that raised an error.",
        "Lua policy calls over their time budget.",
        "Lua policy calls over their memory cap.",
        "Lua policy calls that returned no valid candidate.",
        "Accepted policy installs (hot reloads).",
        "Refused policy installs."};
    for (int f = 0; f < 8; f++) {
        struct pctx c = {NULL, p, 1, f};
        srv_prom_header(p, fams[f], "counter", helps[f]);
        kvr_lua_policy_foreach(rt->lua, metric_one, &c);
    }
    srv_prom_header(p, "kvrouter_policy_user_counter_total", "counter",
                    "Counters policies keep with kvr.count().");
    struct pctx c = {NULL, p, 1, 0};
    kvr_lua_counters_foreach(rt->lua, counter_one, &c);
    srv_prom_header(p, "kvrouter_policy_generation", "gauge",
                    "Generation of the installed policy set.");
    srv_prom_u64(p, "kvrouter_policy_generation", NULL, 0, kvr_lua_runtime_generation(rt->lua));
    srv_prom_header(p, "kvrouter_policy_kv_hook_batches_total", "counter",
                    "KV-event batches delivered to a thread's policies' on_stored/on_removed/"
                    "on_cleared hooks.");
    srv_prom_u64(p, "kvrouter_policy_kv_hook_batches_total", NULL, 0,
                 atomic_load(&rt->hook_batches));
    srv_prom_header(p, "kvrouter_policy_kv_hook_dropped_total", "counter",
                    "KV-event batches not delivered to a thread's hooks (it was too far behind).");
    srv_prom_u64(p, "kvrouter_policy_kv_hook_dropped_total", NULL, 0,
                 atomic_load(&rt->hook_dropped));
    srv_prom_header(p, "kvrouter_policy_installs_refused_total", "counter",
                    "Policy installs refused over the admin API (syntax, runtime, validation).");
    srv_prom_u64(p, "kvrouter_policy_installs_refused_total", NULL, 0,
                 atomic_load(&rt->installs_refused));
    struct kvr_lua_runtime_stats rs;
    kvr_lua_runtime_stats(rt->lua, &rs);
    srv_prom_header(p, "kvrouter_policy_stuck_threads", "gauge",
                    "HTTP threads in one policy call for longer than --policy-stuck-after (the "
                    "router answers /readyz 503 meanwhile).");
    srv_prom_u64(p, "kvrouter_policy_stuck_threads", NULL, 0, rs.stuck_now);
    srv_prom_header(p, "kvrouter_policy_stuck_calls_total", "counter",
                    "Policy calls the watchdog found running past --policy-stuck-after.");
    srv_prom_u64(p, "kvrouter_policy_stuck_calls_total", NULL, 0, rs.stuck_total);
    srv_prom_header(p, "kvrouter_policy_interrupted_total", "counter",
                    "Stuck trusted policy calls interrupted in compiled code (the thread's Lua "
                    "state was discarded and rebuilt).");
    srv_prom_u64(p, "kvrouter_policy_interrupted_total", NULL, 0, rs.stopped);
    srv_prom_header(p, "kvrouter_policy_dev_reloads_total", "counter",
                    "Policy files re-installed by --policy-dev after a change.");
    srv_prom_u64(p, "kvrouter_policy_dev_reloads_total", NULL, 0, atomic_load(&rt->dev_reloads));
    srv_prom_header(p, "kvrouter_policy_scripts_total", "counter",
                    "Operator scripts run (POST /admin/script).");
    srv_prom_u64(p, "kvrouter_policy_scripts_total", NULL, 0, atomic_load(&rt->scripts));
}

#endif /* KVR_HAVE_LUA */
