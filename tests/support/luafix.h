/* luafix.h - shared fixtures for the Lua runtime suites (tests/unit/lua/).
 * SPDX-License-Identifier: Apache-2.0 */
#ifndef KVR_TEST_LUAFIX_H
#define KVR_TEST_LUAFIX_H

#include <pthread.h>
#include <stddef.h>

#include "kvr/lua.h"

/* Captured log lines (thread-safe). */
struct logcap {
    pthread_mutex_t mu;
    char text[65536];
    size_t len;
    int lines;
};

void logcap_init(struct logcap *lc);
/* kvr_lua_log_fn writing into a struct logcap. */
void logcap_fn(void *ctx, int level, const char *msg);
/* 1 if the captured text contains s. */
int logcap_has(struct logcap *lc, const char *s);

/* A runtime with cfg (NULL: defaults) and log capture (lc may be NULL). Aborts on failure. */
kvr_lua_runtime_t *luafix_runtime(struct kvr_lua_config *cfg, struct logcap *lc);

/* Installs a policy from a NUL-terminated source; returns the kvr_lua_status; err gets the
 * message (err_len bytes). */
int luafix_install(kvr_lua_runtime_t *rt, const char *name, const char *src, unsigned flags,
                   char *err, size_t err_len);

/* A request of `tokens` tokens (blocks = tokens / bs, no hashes, no overrides, model "m"). */
void luafix_request(struct kvr_ffi_request *r, uint32_t tokens, uint32_t bs);

/* n healthy candidates: worker 100 + i, rank 0, weight 1, kv unknown, everything else 0. */
void luafix_cands(struct kvr_ffi_candidate *c, size_t n);

/* Selects with a ranked buffer of cap; returns the first index or aborts on an API error. */
uint32_t luafix_select(kvr_lua_vm_t *vm, const struct kvr_ffi_request *r,
                       const struct kvr_ffi_candidate *c, size_t n, struct kvr_lua_decision *d,
                       uint32_t *ranked, size_t cap);

#endif
