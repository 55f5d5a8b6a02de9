/* router.c - policy runtime glue for the simulator (see router.h).
 * SPDX-License-Identifier: Apache-2.0 */
#include "router.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvr/err.h"

struct kvr_sim_router {
    kvr_lua_runtime_t *rt;
    kvr_lua_vm_t *vm;
    int lua; /* a Lua policy is bound (else the C fallback decides by design) */
    struct kvr_sim_policy_counts counts;
};

int kvr_sim_router_new(const struct kvr_sim_config *cfg, const struct kvr_sim_policy *p,
                       kvr_index_t *idx, kvr_load_t *load, struct kvr_sim_router **out, char *err,
                       size_t err_len)
{
    *out = NULL;
    struct kvr_sim_router *r = calloc(1, sizeof(*r));
    if (r == NULL)
        return KVR_ENOMEM;
    struct kvr_lua_config lc;
    kvr_lua_config_init(&lc);
    lc.seed = cfg->seed;
    if (cfg->budget_ns > 0)
        lc.budget_ns = cfg->budget_ns;
    lc.log = cfg->log;
    lc.log_ctx = cfg->log_ctx;
    lc.engine.index = idx;
    lc.engine.load = load;
    lc.engine.block_size = cfg->block_size;
    int rc = kvr_lua_runtime_new(&lc, &r->rt);
    if (rc != KVR_OK) {
        snprintf(err, err_len, "the policy runtime could not start: %s", kvr_strerror(rc));
        goto fail;
    }
    if (p->kind == KVR_SIM_POLICY_LUA) {
        unsigned flags = p->shipped && !cfg->sandbox_shipped ? KVR_LUA_TRUSTED : 0u;
        int status = 0;
        rc = kvr_lua_policy_install(r->rt, p->name, p->src, p->len, flags, NULL, &status, err,
                                    err_len);
        if (rc == KVR_OK)
            rc = kvr_lua_policy_bind(r->rt, NULL, p->name, NULL);
        if (rc != KVR_OK) {
            if (rc != KVR_EINVAL && rc != KVR_ENOMEM)
                snprintf(err, err_len, "cannot install the policy: %s", kvr_strerror(rc));
            if (rc != KVR_ENOMEM)
                rc = KVR_EINVAL;
            goto fail;
        }
        r->lua = 1;
    } else if (p->kind != KVR_SIM_POLICY_BUILTIN) {
        snprintf(err, err_len, "unknown policy kind %d", p->kind);
        rc = KVR_EINVAL;
        goto fail;
    }
    rc = kvr_lua_vm_new(r->rt, NULL, &r->vm);
    if (rc != KVR_OK) {
        snprintf(err, err_len, "the policy VM could not start: %s", kvr_strerror(rc));
        goto fail;
    }
    *out = r;
    return KVR_OK;
fail:
    kvr_sim_router_free(r);
    return rc;
}

void kvr_sim_router_free(struct kvr_sim_router *r)
{
    if (r == NULL)
        return;
    kvr_lua_vm_free(r->vm);
    kvr_lua_runtime_free(r->rt);
    free(r);
}

int kvr_sim_router_select(struct kvr_sim_router *r, const struct kvr_ffi_request *req,
                          struct kvr_ffi_candidate *cands, size_t n, uint32_t *pick)
{
    int rc = kvr_lua_prepare(r->rt, req, cands, n);
    if (rc != KVR_OK)
        return rc;
    uint32_t ranked[1];
    struct kvr_lua_decision d;
    memset(&d, 0, sizeof(d));
    d.ranked = ranked;
    d.cap = 1;
    rc = kvr_lua_vm_select(r->vm, req, cands, n, &d);
    if (rc != KVR_OK)
        return rc;
    struct kvr_sim_policy_counts *c = &r->counts;
    c->decisions++;
    switch (d.status) {
    case KVR_LUA_OK:
        c->ok++;
        break;
    case KVR_LUA_ERRRUN:
        c->errors++;
        break;
    case KVR_LUA_ERRMEM:
        c->oom++;
        break;
    case KVR_LUA_ETIMEDOUT:
        c->timeouts++;
        break;
    case KVR_LUA_INVALID:
        c->invalid++;
        break;
    default: /* NOPOLICY: the builtin policy, decided by the fallback by design */
        break;
    }
    if (r->lua && d.fallback) {
        c->fallbacks++;
        if (c->first_error[0] == '\0')
            snprintf(c->first_error, sizeof(c->first_error), "request %llu: %s: %s",
                     (unsigned long long)req->request_id, kvr_lua_status_name(d.status),
                     d.error != NULL && d.error[0] ? d.error : "(no message)");
    }
    *pick = ranked[0];
    return KVR_OK;
}

void kvr_sim_router_on_event(struct kvr_sim_router *r, const struct kvr_event *ev)
{
    if (r->lua)
        kvr_lua_vm_on_event(r->vm, ev);
}

void kvr_sim_router_on_response(struct kvr_sim_router *r, const struct kvr_ffi_request *req,
                                const struct kvr_ffi_candidate *worker,
                                const struct kvr_ffi_outcome *outcome)
{
    if (r->lua)
        kvr_lua_vm_on_response(r->vm, req, worker, outcome);
}

void kvr_sim_router_counts(const struct kvr_sim_router *r, struct kvr_sim_policy_counts *out)
{
    *out = r->counts;
}
