/* luafix.c - shared fixtures for the Lua runtime suites (see luafix.h).
 * SPDX-License-Identifier: Apache-2.0 */
#include "luafix.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvr/err.h"

void logcap_init(struct logcap *lc)
{
    memset(lc, 0, sizeof(*lc));
    pthread_mutex_init(&lc->mu, NULL);
}

void logcap_fn(void *ctx, int level, const char *msg)
{
    struct logcap *lc = ctx;
    pthread_mutex_lock(&lc->mu);
    int n = snprintf(lc->text + lc->len, sizeof(lc->text) - lc->len, "[%d] %s\n", level, msg);
    if (n > 0 && lc->len + (size_t)n < sizeof(lc->text))
        lc->len += (size_t)n;
    lc->lines++;
    if (getenv("KVR_TEST_VERBOSE"))
        fprintf(stderr, "[%d] %s\n", level, msg);
    pthread_mutex_unlock(&lc->mu);
}

int logcap_has(struct logcap *lc, const char *s)
{
    pthread_mutex_lock(&lc->mu);
    int r = strstr(lc->text, s) != NULL;
    pthread_mutex_unlock(&lc->mu);
    return r;
}

kvr_lua_runtime_t *luafix_runtime(struct kvr_lua_config *cfg, struct logcap *lc)
{
    struct kvr_lua_config def;
    if (cfg == NULL) {
        kvr_lua_config_init(&def);
        cfg = &def;
    }
    if (lc != NULL) {
        cfg->log = logcap_fn;
        cfg->log_ctx = lc;
    }
    kvr_lua_runtime_t *rt = NULL;
    if (kvr_lua_runtime_new(cfg, &rt) != KVR_OK) {
        fprintf(stderr, "luafix: runtime creation failed\n");
        abort();
    }
    return rt;
}

int luafix_install(kvr_lua_runtime_t *rt, const char *name, const char *src, unsigned flags,
                   char *err, size_t err_len)
{
    int st = -1;
    char dummy[16];
    if (err == NULL) {
        err = dummy;
        err_len = sizeof(dummy);
    }
    kvr_lua_policy_install(rt, name, src, strlen(src), flags, NULL, &st, err, err_len);
    return st;
}

void luafix_request(struct kvr_ffi_request *r, uint32_t tokens, uint32_t bs)
{
    memset(r, 0, sizeof(*r));
    r->model = "m";
    r->model_len = 1;
    r->tokens = tokens;
    r->block_size = bs;
    r->blocks = tokens / bs;
    r->overlap_weight = -1;
    r->temperature = -1;
}

void luafix_cands(struct kvr_ffi_candidate *c, size_t n)
{
    memset(c, 0, n * sizeof(*c));
    for (size_t i = 0; i < n; i++) {
        c[i].worker_id = 100 + i;
        c[i].healthy = 1;
        c[i].weight = 1.0;
        c[i].kv_usage = -1;
    }
}

uint32_t luafix_select(kvr_lua_vm_t *vm, const struct kvr_ffi_request *r,
                       const struct kvr_ffi_candidate *c, size_t n, struct kvr_lua_decision *d,
                       uint32_t *ranked, size_t cap)
{
    memset(d, 0, sizeof(*d));
    d->ranked = ranked;
    d->cap = cap;
    if (kvr_lua_vm_select(vm, r, c, n, d) != KVR_OK || d->n_ranked == 0) {
        fprintf(stderr, "luafix: select failed\n");
        abort();
    }
    return ranked[0];
}
