/* policy.c - the policy boundary (see policy.h). Until the Lua runtime (issue 4) is merged this
 * file decides with the built-in classic KV cost; srv_policy_select is where kvr_lua_vm_select
 * plugs in (candidates copied into kvr_ffi_candidate, the ranked list copied back). */
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

struct srv_policy_rt {
    struct srv *s;
    _Atomic uint64_t generation;
    _Atomic uint64_t installs_refused;
};

static int builtin_name(const char *p)
{
    return strcmp(p, "kv") == 0 || strcmp(p, "kv_cost") == 0 || strcmp(p, "builtin") == 0 ||
           strcmp(p, BUILTIN_NAME) == 0;
}

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
