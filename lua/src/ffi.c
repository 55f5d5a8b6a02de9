/* ffi.c - the kvr_ffi_* calls Lua makes through struct kvr_ffi_api (see kvr/ffi.h).
 * SPDX-License-Identifier: Apache-2.0 */
#include "kvr/ffi.h"

#include <stdio.h>
#include <string.h>

#include "internal.h"
#include "kvr/err.h"
#include "kvr/hash.h"

_Static_assert(sizeof(struct kvr_ffi_match) == sizeof(struct kvr_match), "kvr_ffi_match layout");
_Static_assert(offsetof(struct kvr_ffi_match, blocks) == offsetof(struct kvr_match, blocks),
               "kvr_ffi_match layout");
_Static_assert(sizeof(struct kvr_ffi_block) == sizeof(struct kvr_block), "kvr_ffi_block layout");

#define TOKEN_STACK_BLOCKS 1024u

/* The decision's deadline passed: the call fails (and the decision is marked timed out even if
 * the policy catches the error). */
static int expired(kvr_ffi_vm_t *vm, const char **err)
{
    if (lstate_over_budget(vm->st)) {
        if (err)
            *err = "time budget exceeded";
        return 1;
    }
    return 0;
}

/* The engine handles a call on this VM uses: the VM's current one (kvr_lua_vm_set_engine, e.g.
 * the request's model) or the runtime's. Scratch states use the runtime's. */
static const struct kvr_lua_engine *engine_of(const kvr_ffi_vm_t *vm)
{
    if (vm->vm != NULL && vm->vm->engine != NULL)
        return vm->vm->engine;
    return &vm->rt->cfg.engine;
}

int kvr_ffi_index_match(kvr_ffi_vm_t *vm, const uint64_t *locals, size_t n,
                        struct kvr_ffi_match *out, size_t cap, size_t *n_out, const char **err)
{
    *n_out = 0;
    if (expired(vm, err))
        return KVR_ETIMEDOUT;
    kvr_index_t *idx = engine_of(vm)->index;
    if (idx == NULL) {
        *err = "no index bound";
        return KVR_ENOTFOUND;
    }
    if (n == 0)
        return KVR_OK;
    int rc = kvr_index_find_matches(idx, locals, n, 0, (struct kvr_match *)out, cap, n_out);
    if (rc == KVR_ENOMEM)
        *err = "out of memory";
    return rc;
}

int kvr_ffi_index_match_tokens(kvr_ffi_vm_t *vm, const uint32_t *tokens, size_t n,
                               uint32_t block_size, const char *lora, size_t lora_len,
                               struct kvr_ffi_match *out, size_t cap, size_t *n_out,
                               const char **err)
{
    *n_out = 0;
    if (expired(vm, err))
        return KVR_ETIMEDOUT;
    if (block_size == 0)
        block_size = engine_of(vm)->block_size;
    size_t blocks = kvr_hash_block_count(n, block_size, 0);
    if (blocks > TOKEN_STACK_BLOCKS) {
        blocks = TOKEN_STACK_BLOCKS; /* a prefix of 1024 blocks is plenty for routing */
        n = blocks * block_size;
    }
    uint64_t locals[TOKEN_STACK_BLOCKS];
    struct kvr_hash_opts o = {.seed = kvr_hash_salt(NULL, 0, lora, lora ? lora_len : 0)};
    size_t got = 0;
    if (kvr_hash_blocks(tokens, n, block_size, &o, locals, TOKEN_STACK_BLOCKS, &got) != KVR_OK) {
        *err = "cannot hash the tokens";
        return KVR_EINVAL;
    }
    return kvr_ffi_index_match(vm, locals, got, out, cap, n_out, err);
}

int kvr_ffi_lanes_match(kvr_ffi_vm_t *vm, const uint64_t *locals, size_t n,
                        struct kvr_ffi_match *out, size_t cap, size_t *n_out, const char **err)
{
    *n_out = 0;
    if (expired(vm, err))
        return KVR_ETIMEDOUT;
    const struct kvr_lua_engine *e = engine_of(vm);
    if (e->lanes == NULL && (e->index == NULL || kvr_index_ckf(e->index) == NULL)) {
        *err = "no lane index (CKF) bound";
        return KVR_ENOTFOUND;
    }
    if (n == 0)
        return KVR_OK;
    int rc =
        e->lanes != NULL
            ? e->lanes(e->lanes_ctx, locals, n, (struct kvr_match *)out, cap, n_out)
            : kvr_index_find_matches_ckf(e->index, locals, n, (struct kvr_match *)out, cap, n_out);
    if (rc != KVR_OK && rc != KVR_ERANGE)
        *err = kvr_strerror(rc);
    return rc;
}

int kvr_ffi_index_stats(kvr_ffi_vm_t *vm, struct kvr_ffi_index_stats *out, const char **err)
{
    if (expired(vm, err))
        return KVR_ETIMEDOUT;
    kvr_index_t *idx = engine_of(vm)->index;
    if (idx == NULL) {
        *err = "no index bound";
        return KVR_ENOTFOUND;
    }
    struct kvr_index_stats st;
    kvr_index_stats(idx, &st);
    out->nodes = st.radix.nodes;
    out->blocks = st.radix.blocks;
    out->block_ranks = st.radix.block_ranks;
    out->ranks = st.radix.ranks;
    out->bytes = st.radix.bytes;
    out->events_stored = st.counters.events[KVR_EVENT_STORED];
    out->events_removed = st.counters.events[KVR_EVENT_REMOVED];
    out->events_cleared = st.counters.events[KVR_EVENT_CLEARED];
    out->queries = st.counters.queries;
    return KVR_OK;
}

int kvr_ffi_load_get(kvr_ffi_vm_t *vm, uint64_t worker_id, uint32_t dp_rank,
                     struct kvr_ffi_load *out, const char **err)
{
    if (expired(vm, err))
        return KVR_ETIMEDOUT;
    kvr_load_t *ld = engine_of(vm)->load;
    if (ld == NULL) {
        *err = "no load tracker bound";
        return KVR_ENOTFOUND;
    }
    struct kvr_load_rank r;
    kvr_load_rank_get(ld, worker_id, dp_rank, &r);
    out->prefill_tokens = r.prefill_tokens;
    out->active_blocks = r.active_blocks;
    out->requests = r.requests;
    return KVR_OK;
}

uint64_t kvr_ffi_hash(const void *data, size_t len, uint64_t seed)
{
    return kvr_hash_xxh3(data, len, seed);
}

double kvr_ffi_now(void)
{
    return (double)kvr_lua_now_ns() * 1e-9;
}

int kvr_ffi_counter_id(kvr_ffi_vm_t *vm, const char *name, size_t len, const char **err)
{
    if (len == 0 || len > KVR_LUA_NAME_MAX) {
        *err = "counter names have 1 to 63 bytes";
        return KVR_EINVAL;
    }
    for (size_t i = 0; i < len; i++) {
        char ch = name[i];
        if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
              ch == '_' || ch == '.' || ch == '-')) {
            *err = "counter names use [A-Za-z0-9_.-]";
            return KVR_EINVAL;
        }
    }
    int id = rt_counter_id(vm->rt, vm->policy_id, name, len);
    if (id < 0)
        *err = "too many counters";
    return id;
}

void kvr_ffi_counter_add(kvr_ffi_vm_t *vm, int id, uint64_t n)
{
    if (vm->vm == NULL || id < 0 || id >= KVR_LUA_MAX_COUNTERS)
        return; /* scratch states (validation) count nothing */
    atomic_fetch_add_explicit(&vm->vm->user[id], n, memory_order_relaxed);
}

void kvr_ffi_log(kvr_ffi_vm_t *vm, int level, const char *msg, size_t len)
{
    kvr_lua_runtime_t *rt = vm->rt;
    if (rt->cfg.log == NULL)
        return;
    if (level < KVR_LUA_LOG_ERROR)
        level = KVR_LUA_LOG_ERROR;
    if (level > KVR_LUA_LOG_DEBUG)
        level = KVR_LUA_LOG_DEBUG;
    uint32_t pid = vm->policy_id < KVR_LUA_MAX_POLICIES ? vm->policy_id : 0;
    if (vm->vm != NULL) { /* rate limit: one line per second per VM and policy */
        uint64_t now = kvr_lua_now_ns();
        if (now - vm->vm->last_log_ns[pid] < 1000000000u && vm->vm->last_log_ns[pid] != 0) {
            vm->vm->suppressed[pid]++;
            return;
        }
        vm->vm->last_log_ns[pid] = now;
    }
    const char *pname = vm->admin ? "(operator script)" : rt->names[pid].name;
    int shown = len > 2000 ? 2000 : (int)len;
    uint32_t sup = vm->vm ? vm->vm->suppressed[pid] : 0;
    if (sup > 0) {
        rt_log(rt, level, "policy %s: %.*s (%u similar lines suppressed)", pname, shown, msg, sup);
        vm->vm->suppressed[pid] = 0;
    } else {
        rt_log(rt, level, "policy %s: %.*s", pname, shown, msg);
    }
}

size_t kvr_ffi_u64_format(uint64_t v, char *buf)
{
    char tmp[24];
    size_t n = 0;
    do {
        tmp[n++] = (char)('0' + v % 10);
        v /= 10;
    } while (v != 0);
    for (size_t i = 0; i < n; i++)
        buf[i] = tmp[n - 1 - i];
    buf[n] = '\0';
    return n;
}

int kvr_ffi_u64_parse(const char *s, size_t len, uint64_t *out)
{
    uint64_t v = 0;
    if (len == 0)
        return KVR_EINVAL;
    if (len > 2 && s[0] == '0' && (s[1] == 'x' || s[1] == 'X')) {
        if (len > 18)
            return KVR_EINVAL;
        for (size_t i = 2; i < len; i++) {
            char c = s[i];
            int d = c >= '0' && c <= '9'   ? c - '0'
                    : c >= 'a' && c <= 'f' ? c - 'a' + 10
                    : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                           : -1;
            if (d < 0)
                return KVR_EINVAL;
            v = v << 4 | (uint64_t)d;
        }
        *out = v;
        return KVR_OK;
    }
    for (size_t i = 0; i < len; i++) {
        if (s[i] < '0' || s[i] > '9')
            return KVR_EINVAL;
        uint64_t d = (uint64_t)(s[i] - '0');
        if (v > (UINT64_MAX - d) / 10)
            return KVR_EINVAL;
        v = v * 10 + d;
    }
    *out = v;
    return KVR_OK;
}

static int admin_call(kvr_ffi_vm_t *vm, kvr_lua_admin_fn fn, const char *path, size_t len,
                      const char **err)
{
    static _Thread_local char msg[256];
    if (!vm->admin) {
        *err = "only operator scripts may call kvr.admin";
        return KVR_ESTATE;
    }
    if (fn == NULL) {
        *err = "the host bound no handler";
        return KVR_ENOTFOUND;
    }
    char p[1024];
    if (len == 0 || len >= sizeof(p) || memchr(path, '\0', len) != NULL) {
        *err = "invalid path";
        return KVR_EINVAL;
    }
    memcpy(p, path, len);
    p[len] = '\0';
    msg[0] = '\0';
    int rc = fn(vm->rt->cfg.engine.admin_ctx, p, msg, sizeof(msg));
    if (rc != KVR_OK)
        *err = msg[0] ? msg : kvr_strerror(rc);
    return rc;
}

int kvr_ffi_admin_dump(kvr_ffi_vm_t *vm, const char *path, size_t len, const char **err)
{
    return admin_call(vm, vm->rt->cfg.engine.dump, path, len, err);
}

int kvr_ffi_admin_snapshot(kvr_ffi_vm_t *vm, const char *path, size_t len, const char **err)
{
    return admin_call(vm, vm->rt->cfg.engine.snapshot, path, len, err);
}

static const struct kvr_ffi_api api = {
    .abi = KVR_FFI_ABI,
    .size = sizeof(struct kvr_ffi_api),
    .index_match = kvr_ffi_index_match,
    .index_match_tokens = kvr_ffi_index_match_tokens,
    .lanes_match = kvr_ffi_lanes_match,
    .index_stats = kvr_ffi_index_stats,
    .load_get = kvr_ffi_load_get,
    .hash = kvr_ffi_hash,
    .now = kvr_ffi_now,
    .counter_id = kvr_ffi_counter_id,
    .counter_add = kvr_ffi_counter_add,
    .log = kvr_ffi_log,
    .u64_format = kvr_ffi_u64_format,
    .u64_parse = kvr_ffi_u64_parse,
    .admin_dump = kvr_ffi_admin_dump,
    .admin_snapshot = kvr_ffi_admin_snapshot,
};

const struct kvr_ffi_api *kvr_ffi_api(void)
{
    return &api;
}
