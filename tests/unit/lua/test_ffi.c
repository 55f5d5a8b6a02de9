/* test_ffi.c - Check suite for lua/src/ffi.c and prepare.c: the cdef drift test (ffi.sizeof /
 * ffi.offsetof against C for every shared struct and field), the engine queries policies make
 * (index, tokens, hashes, lanes, load, stats), kvr_lua_prepare, the u64 helpers.
 * SPDX-License-Identifier: Apache-2.0 */
#include <check.h>
#include <lauxlib.h>
#include <lualib.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "kvr/err.h"
#include "kvr/hash.h"
#include "kvr/lua.h"
#include "luafix.h"

Suite *ffi_suite(void);

/* ==== drift ================================================================================== */

struct field {
    const char *st, *field;
    size_t off;
};
struct size {
    const char *st;
    size_t size;
};

#define F(S, f)                                                                                    \
    {                                                                                              \
#S, #f, offsetof(struct S, f)                                                              \
    }
#define Z(S)                                                                                       \
    {                                                                                              \
#S, sizeof(struct S)                                                                       \
    }

static const struct field fields[] = {
    F(kvr_ffi_header, name),
    F(kvr_ffi_header, value),
    F(kvr_ffi_header, name_len),
    F(kvr_ffi_header, value_len),
    F(kvr_ffi_request, model),
    F(kvr_ffi_request, session),
    F(kvr_ffi_request, lora),
    F(kvr_ffi_request, policy),
    F(kvr_ffi_request, headers),
    F(kvr_ffi_request, local_hashes),
    F(kvr_ffi_request, seq_hashes),
    F(kvr_ffi_request, request_id),
    F(kvr_ffi_request, overlap_weight),
    F(kvr_ffi_request, temperature),
    F(kvr_ffi_request, model_len),
    F(kvr_ffi_request, session_len),
    F(kvr_ffi_request, lora_len),
    F(kvr_ffi_request, policy_len),
    F(kvr_ffi_request, n_headers),
    F(kvr_ffi_request, tokens),
    F(kvr_ffi_request, blocks),
    F(kvr_ffi_request, block_size),
    F(kvr_ffi_request, priority),
    F(kvr_ffi_request, pad_),
    F(kvr_ffi_candidate, worker_id),
    F(kvr_ffi_candidate, url),
    F(kvr_ffi_candidate, labels),
    F(kvr_ffi_candidate, kv_usage),
    F(kvr_ffi_candidate, weight),
    F(kvr_ffi_candidate, dp_rank),
    F(kvr_ffi_candidate, url_len),
    F(kvr_ffi_candidate, labels_len),
    F(kvr_ffi_candidate, healthy),
    F(kvr_ffi_candidate, overlap),
    F(kvr_ffi_candidate, overlap_host),
    F(kvr_ffi_candidate, overlap_disk),
    F(kvr_ffi_candidate, tree_blocks),
    F(kvr_ffi_candidate, prefill_tokens),
    F(kvr_ffi_candidate, decode_blocks),
    F(kvr_ffi_candidate, new_blocks),
    F(kvr_ffi_candidate, requests),
    F(kvr_ffi_candidate, queue),
    F(kvr_ffi_candidate, pad_),
    F(kvr_ffi_outcome, error),
    F(kvr_ffi_outcome, ttft_ms),
    F(kvr_ffi_outcome, latency_ms),
    F(kvr_ffi_outcome, error_len),
    F(kvr_ffi_outcome, status),
    F(kvr_ffi_outcome, output_tokens),
    F(kvr_ffi_outcome, pad_),
    F(kvr_ffi_block, block_hash),
    F(kvr_ffi_block, tokens_hash),
    F(kvr_ffi_event, worker_id),
    F(kvr_ffi_event, parent_hash),
    F(kvr_ffi_event, blocks),
    F(kvr_ffi_event, hashes),
    F(kvr_ffi_event, dp_rank),
    F(kvr_ffi_event, kind),
    F(kvr_ffi_event, tier),
    F(kvr_ffi_event, has_parent),
    F(kvr_ffi_event, n),
    F(kvr_ffi_event, pad_),
    F(kvr_ffi_match, worker_id),
    F(kvr_ffi_match, dp_rank),
    F(kvr_ffi_match, blocks),
    F(kvr_ffi_index_stats, nodes),
    F(kvr_ffi_index_stats, blocks),
    F(kvr_ffi_index_stats, block_ranks),
    F(kvr_ffi_index_stats, ranks),
    F(kvr_ffi_index_stats, bytes),
    F(kvr_ffi_index_stats, events_stored),
    F(kvr_ffi_index_stats, events_removed),
    F(kvr_ffi_index_stats, events_cleared),
    F(kvr_ffi_index_stats, queries),
    F(kvr_ffi_load, prefill_tokens),
    F(kvr_ffi_load, active_blocks),
    F(kvr_ffi_load, requests),
    F(kvr_ffi_call, req),
    F(kvr_ffi_call, cands),
    F(kvr_ffi_call, outcome),
    F(kvr_ffi_call, event),
    F(kvr_ffi_call, vm),
    F(kvr_ffi_call, overlap_weight),
    F(kvr_ffi_call, temperature),
    F(kvr_ffi_call, tokens),
    F(kvr_ffi_call, blocks),
    F(kvr_ffi_call, block_size),
    F(kvr_ffi_call, priority),
    F(kvr_ffi_call, n),
    F(kvr_ffi_call, out_cap),
    F(kvr_ffi_call, slot),
    F(kvr_ffi_call, pad_),
    F(kvr_ffi_call, ranked),
    F(kvr_ffi_api, abi),
    F(kvr_ffi_api, size),
    F(kvr_ffi_api, index_match),
    F(kvr_ffi_api, index_match_tokens),
    F(kvr_ffi_api, lanes_match),
    F(kvr_ffi_api, index_stats),
    F(kvr_ffi_api, load_get),
    F(kvr_ffi_api, hash),
    F(kvr_ffi_api, now),
    F(kvr_ffi_api, counter_id),
    F(kvr_ffi_api, counter_add),
    F(kvr_ffi_api, log),
    F(kvr_ffi_api, u64_format),
    F(kvr_ffi_api, u64_parse),
    F(kvr_ffi_api, admin_dump),
    F(kvr_ffi_api, admin_snapshot),
};

static const struct size sizes[] = {
    Z(kvr_ffi_header), Z(kvr_ffi_request), Z(kvr_ffi_candidate), Z(kvr_ffi_outcome),
    Z(kvr_ffi_block),  Z(kvr_ffi_event),   Z(kvr_ffi_match),     Z(kvr_ffi_index_stats),
    Z(kvr_ffi_load),   Z(kvr_ffi_call),    Z(kvr_ffi_api),
};

static const char *probe_src = "local ffi, cdef = ...\n"
                               "ffi.cdef(cdef)\n"
                               "return function(s, f)\n"
                               "  if f then return ffi.offsetof('struct ' .. s, f) end\n"
                               "  return ffi.sizeof('struct ' .. s)\n"
                               "end\n";

static long lua_layout(lua_State *L, const char *st, const char *field)
{
    lua_pushvalue(L, -1);
    lua_pushstring(L, st);
    if (field)
        lua_pushstring(L, field);
    else
        lua_pushnil(L);
    ck_assert_msg(lua_pcall(L, 2, 1, 0) == 0, "%s", lua_tostring(L, -1));
    long v = lua_isnumber(L, -1) ? (long)lua_tointeger(L, -1) : -1;
    lua_pop(L, 1);
    return v;
}

START_TEST(cdef_matches_c_layout)
{
    const struct kvr_lua_embedded *cdef = embedded_find("kvr.cdef");
    ck_assert_ptr_nonnull(cdef);
    lua_State *L = luaL_newstate();
    luaL_openlibs(L);
    ck_assert_int_eq(luaL_loadstring(L, probe_src), 0);
    lua_getglobal(L, "require");
    lua_pushstring(L, "ffi");
    lua_call(L, 1, 1);
    lua_pushlstring(L, cdef->data, cdef->len);
    ck_assert_msg(lua_pcall(L, 2, 1, 0) == 0, "%s", lua_tostring(L, -1));
    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++)
        ck_assert_msg(lua_layout(L, sizes[i].st, NULL) == (long)sizes[i].size,
                      "sizeof(struct %s): ffi %ld, C %zu", sizes[i].st,
                      lua_layout(L, sizes[i].st, NULL), sizes[i].size);
    for (size_t i = 0; i < sizeof(fields) / sizeof(fields[0]); i++)
        ck_assert_msg(lua_layout(L, fields[i].st, fields[i].field) == (long)fields[i].off,
                      "offsetof(struct %s, %s): ffi %ld, C %zu", fields[i].st, fields[i].field,
                      lua_layout(L, fields[i].st, fields[i].field), fields[i].off);
    lua_close(L);
}
END_TEST

START_TEST(embedded_cdef_is_the_header_block)
{
    /* The build copied the current header (a stale copy would be a silent drift). */
    FILE *f = fopen(KVR_SOURCE_DIR "/lua/include/kvr/ffi.h", "rb");
    ck_assert_ptr_nonnull(f);
    static char buf[1 << 16];
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = '\0';
    const char *b = strstr(buf, "/* KVR_FFI_CDEF_BEGIN */");
    const char *e = strstr(buf, "/* KVR_FFI_CDEF_END */");
    ck_assert(b && e && e > b);
    b += strlen("/* KVR_FFI_CDEF_BEGIN */");
    const struct kvr_lua_embedded *cdef = embedded_find("kvr.cdef");
    ck_assert_uint_eq(cdef->len, (size_t)(e - b));
    ck_assert(memcmp(cdef->data, b, cdef->len) == 0);
    ck_assert_uint_eq(kvr_ffi_api()->abi, KVR_FFI_ABI);
    ck_assert_uint_eq(kvr_ffi_api()->size, sizeof(struct kvr_ffi_api));
}
END_TEST

START_TEST(u64_helpers)
{
    char buf[24];
    ck_assert_uint_eq(kvr_ffi_u64_format(0, buf), 1);
    ck_assert_str_eq(buf, "0");
    ck_assert_uint_eq(kvr_ffi_u64_format(UINT64_MAX, buf), 20);
    ck_assert_str_eq(buf, "18446744073709551615");
    uint64_t v;
    ck_assert_int_eq(kvr_ffi_u64_parse("18446744073709551615", 20, &v), KVR_OK);
    ck_assert_uint_eq(v, UINT64_MAX);
    ck_assert_int_eq(kvr_ffi_u64_parse("18446744073709551616", 20, &v), KVR_EINVAL);
    ck_assert_int_eq(kvr_ffi_u64_parse("0xDEADBEEFCAFEF00D", 18, &v), KVR_OK);
    ck_assert_uint_eq(v, 16045690984503111693ull);
    ck_assert_int_eq(kvr_ffi_u64_parse("0x", 2, &v), KVR_EINVAL);
    ck_assert_int_eq(kvr_ffi_u64_parse("", 0, &v), KVR_EINVAL);
    ck_assert_int_eq(kvr_ffi_u64_parse("-1", 2, &v), KVR_EINVAL);
    ck_assert_int_eq(kvr_ffi_u64_parse("12a", 3, &v), KVR_EINVAL);
    ck_assert_uint_eq(kvr_ffi_hash("test data", 9, 1337), 13226331709069118873ull);
}
END_TEST

/* ==== engine queries from policies =========================================================== */

static struct logcap lc;
static kvr_lua_runtime_t *rt;
static kvr_lua_vm_t *vm;
static kvr_index_t *idx;
static kvr_load_t *ld;
static char err[4096];

static int fake_lanes(void *ctx, const uint64_t *locals, size_t n, struct kvr_match *out,
                      size_t cap, size_t *n_out)
{
    (void)ctx;
    (void)locals;
    *n_out = 2;
    if (cap < 2)
        return KVR_ERANGE;
    out[0] = (struct kvr_match){5, 0, (uint32_t)n};
    out[1] = (struct kvr_match){6, 0, 1};
    return KVR_OK;
}

static void store(uint64_t worker, uint32_t rank, const uint64_t *locals, size_t n)
{
    struct kvr_block b[16];
    for (size_t i = 0; i < n; i++)
        b[i] = (struct kvr_block){worker * 1000 + rank * 100 + i + 1, locals[i]};
    struct kvr_event ev = {.worker_id = worker,
                           .dp_rank = rank,
                           .kind = KVR_EVENT_STORED,
                           .n = (uint32_t)n,
                           .blocks = b};
    ck_assert_int_eq(kvr_index_apply(idx, &ev), KVR_OK);
}

static void setup_engine(void)
{
    logcap_init(&lc);
    ck_assert_int_eq(kvr_index_new(NULL, &idx), KVR_OK);
    struct kvr_load_config lcfg = {.block_size = 16};
    ck_assert_int_eq(kvr_load_new(&lcfg, &ld), KVR_OK);
    struct kvr_lua_config cfg;
    kvr_lua_config_init(&cfg);
    cfg.engine.index = idx;
    cfg.engine.load = ld;
    cfg.engine.lanes = fake_lanes;
    rt = luafix_runtime(&cfg, &lc);
    ck_assert_int_eq(kvr_lua_vm_new(rt, NULL, &vm), KVR_OK);
}

static void teardown_engine(void)
{
    kvr_lua_vm_free(vm);
    kvr_lua_runtime_free(rt);
    kvr_load_free(ld);
    kvr_index_free(idx);
}

/* Runs `body` (Lua, with req and c in scope) on a live request; the test fails with the policy's
 * error if it raises. Returns the chosen index. */
static uint32_t run_live(const char *body, struct kvr_ffi_request *req, struct kvr_ffi_candidate *c,
                         size_t n)
{
    char src[8192];
    snprintf(src, sizeof(src),
             "local function select(req, c)\n  if req.model ~= 'live' then return c[1] end\n"
             "%s\nend\nreturn { select = select }\n",
             body);
    int st = luafix_install(rt, "q", src, 0, err, sizeof(err));
    ck_assert_msg(st == KVR_LUA_OK, "%s", err);
    ck_assert_int_eq(kvr_lua_policy_bind(rt, NULL, "q", NULL), KVR_OK);
    req->model = "live";
    req->model_len = 4;
    struct kvr_lua_decision d;
    uint32_t ranked[8];
    uint32_t r = luafix_select(vm, req, c, n, &d, ranked, 8);
    ck_assert_msg(d.status == KVR_LUA_OK, "%s", d.error);
    return r;
}

START_TEST(overlap_queries)
{
    static const uint64_t q[] = {10, 11, 12, 13};
    store(1, 0, q, 3);
    store(2, 0, q, 2);
    store(0xF000000000000001ull, 1, q, 1);
    struct kvr_ffi_request req;
    luafix_request(&req, 64, 16);
    req.local_hashes = q;
    struct kvr_ffi_candidate c[3];
    luafix_cands(c, 3);
    c[0].worker_id = 2;
    c[1].worker_id = 1;
    c[2].worker_id = 0xF000000000000001ull;
    c[2].dp_rank = 1;
    uint32_t r = run_live(
        "  local ov = kvr.overlap(req)\n"
        "  assert(ov['1:0'] == 3 and ov['2:0'] == 2 and ov['17293822569102704641:1'] == 1)\n"
        "  local one = kvr.overlap(req, 1)\n"
        "  assert(one['1:0'] == 1 and one['2:0'] == 1)\n"
        "  assert(next(kvr.overlap(req, 0)) == nil)\n"
        "  local h = kvr.overlap_hashes({'10', 11, '0xc'})\n"
        "  assert(h['1:0'] == 3 and h['2:0'] == 2, 'hashes')\n"
        "  assert(not pcall(kvr.overlap_hashes, {-1}))\n"
        "  assert(not pcall(kvr.overlap_hashes, {'x'}))\n"
        "  local st = kvr.index_stats()\n"
        "  assert(st.ranks == 3 and st.events_stored == 3 and st.blocks >= 3, 'stats')\n"
        "  local lanes = kvr.lanes(req)\n"
        "  assert(lanes['5:0'] == 4 and lanes['6:0'] == 1, 'lanes')\n"
        "  local best, bo = nil, -1\n"
        "  for i = 1, #c do local o = ov[c[i].key] or 0 if o > bo then best, bo = c[i], o end end\n"
        "  return best",
        &req, c, 3);
    ck_assert_uint_eq(r, 1);
}
END_TEST

START_TEST(overlap_by_tokens)
{
    uint32_t tokens[64];
    for (int i = 0; i < 64; i++)
        tokens[i] = (uint32_t)(i * 7 + 1);
    uint64_t locals[4];
    size_t n = 0;
    struct kvr_hash_opts o = {.seed = kvr_hash_salt(NULL, 0, "lo", 2)};
    ck_assert_int_eq(kvr_hash_blocks(tokens, 64, 16, &o, locals, 4, &n), KVR_OK);
    store(9, 0, locals, 4);
    ck_assert_int_eq(kvr_hash_blocks(tokens, 64, 16, NULL, locals, 4, &n), KVR_OK);
    store(8, 0, locals, 2); /* no LoRA salt */
    struct kvr_ffi_request req;
    luafix_request(&req, 64, 16);
    struct kvr_ffi_candidate c[2];
    luafix_cands(c, 2);
    run_live("  local t = {}\n"
             "  for i = 0, 63 do t[i + 1] = i * 7 + 1 end\n"
             "  local a = kvr.overlap_tokens(t, 'lo')\n"
             "  assert(a['9:0'] == 4 and a['8:0'] == nil, 'lora')\n"
             "  local b = kvr.overlap_tokens(t)\n"
             "  assert(b['8:0'] == 2 and b['9:0'] == nil, 'plain')\n"
             "  local p = kvr.overlap_tokens({1, 2, 3})\n"
             "  assert(next(p) == nil, 'partial block')\n"
             "  assert(not pcall(kvr.overlap_tokens, {1.5}))\n"
             "  return c[1]",
             &req, c, 2);
}
END_TEST

START_TEST(many_ranks_grow_the_scratch)
{
    static const uint64_t q[] = {77};
    for (uint64_t w = 0; w < 150; w++)
        store(w, 0, q, 1);
    struct kvr_ffi_request req;
    luafix_request(&req, 16, 16);
    req.local_hashes = q;
    struct kvr_ffi_candidate c[1];
    luafix_cands(c, 1);
    run_live("  local n = 0\n"
             "  for k, v in pairs(kvr.overlap(req)) do n = n + 1 assert(v == 1) end\n"
             "  assert(n == 150, n)\n"
             "  return c[1]",
             &req, c, 1);
}
END_TEST

START_TEST(live_load_and_prepare)
{
    static const uint64_t q[] = {10, 11, 12};
    store(1, 0, q, 3);
    store(2, 0, q, 1);
    uint64_t seq[3];
    kvr_hash_chain(q, 3, seq);
    struct kvr_load_request lr = {.request_id = 1,
                                  .worker_id = 2,
                                  .isl_tokens = 48,
                                  .overlap_blocks = 1,
                                  .track_prefill = 1,
                                  .seq_hashes = seq,
                                  .n_hashes = 2};
    ck_assert_int_eq(kvr_load_add(ld, &lr, 0), KVR_OK);
    struct kvr_ffi_request req;
    luafix_request(&req, 48, 16);
    req.local_hashes = q;
    req.seq_hashes = seq;
    struct kvr_ffi_candidate c[3];
    luafix_cands(c, 3);
    c[0].worker_id = 1;
    c[1].worker_id = 2;
    c[2].worker_id = 3;
    ck_assert_int_eq(kvr_lua_prepare(rt, &req, c, 3), KVR_OK);
    ck_assert_uint_eq(c[0].overlap, 3);
    ck_assert_uint_eq(c[1].overlap, 1);
    ck_assert_uint_eq(c[2].overlap, 0);
    ck_assert_uint_eq(c[0].tree_blocks, 3);
    ck_assert_uint_eq(c[1].tree_blocks, 1);
    ck_assert_uint_eq(c[1].prefill_tokens, 32);
    ck_assert_uint_eq(c[1].decode_blocks, 2);
    ck_assert_uint_eq(c[1].requests, 1);
    ck_assert_uint_eq(c[1].new_blocks, 1);
    ck_assert_uint_eq(c[0].new_blocks, 3);
    req.seq_hashes = NULL; /* no reuse assumed: every block is new */
    ck_assert_int_eq(kvr_lua_prepare(rt, &req, c, 3), KVR_OK);
    ck_assert_uint_eq(c[1].new_blocks, 3);
    run_live("  local l = kvr.load(c[2])\n"
             "  assert(l.prefill_tokens == 32 and l.decode_blocks == 2 and l.requests == 1)\n"
             "  local z = kvr.load('18446744073709551615', 3)\n"
             "  assert(z.requests == 0)\n"
             "  assert(not pcall(kvr.load, -5))\n"
             "  return c[2]",
             &req, c, 3);
}
END_TEST

START_TEST(lanes_from_the_index_ckf)
{
    /* No lanes callback: kvr.lanes asks the CKF of an index of kind BOTH. */
    teardown_engine();
    logcap_init(&lc);
    struct kvr_index_config icfg = {.kind = KVR_INDEX_BOTH};
    ck_assert_int_eq(kvr_index_new(&icfg, &idx), KVR_OK);
    ld = NULL;
    struct kvr_lua_config cfg;
    kvr_lua_config_init(&cfg);
    cfg.engine.index = idx;
    rt = luafix_runtime(&cfg, &lc);
    ck_assert_int_eq(kvr_lua_vm_new(rt, NULL, &vm), KVR_OK);
    static const uint64_t q[] = {10, 11, 12};
    uint64_t seq[3];
    kvr_hash_chain(q, 3, seq);
    struct kvr_block b[3];
    for (int i = 0; i < 3; i++)
        b[i] = (struct kvr_block){seq[i], q[i]}; /* canonical block hashes */
    struct kvr_event ev = {.worker_id = 4, .kind = KVR_EVENT_STORED, .n = 3, .blocks = b};
    ck_assert_int_eq(kvr_index_apply(idx, &ev), KVR_OK);
    struct kvr_ffi_request req;
    luafix_request(&req, 48, 16);
    req.local_hashes = q;
    struct kvr_ffi_candidate c[1];
    luafix_cands(c, 1);
    run_live("  local l = kvr.lanes(req)\n"
             "  assert(l['4:0'] == 3, tostring(l['4:0']))\n"
             "  assert(kvr.overlap(req)['4:0'] == 3)\n"
             "  return c[1]",
             &req, c, 1);
}
END_TEST

START_TEST(unbound_engine_reports_not_available)
{
    teardown_engine();
    logcap_init(&lc);
    rt = luafix_runtime(NULL, &lc);
    ck_assert_int_eq(kvr_lua_vm_new(rt, NULL, &vm), KVR_OK);
    idx = NULL;
    ld = NULL;
    struct kvr_ffi_request req;
    luafix_request(&req, 64, 16);
    struct kvr_ffi_candidate c[2];
    luafix_cands(c, 2);
    ck_assert_int_eq(kvr_lua_prepare(rt, &req, c, 2), KVR_OK); /* nothing bound: untouched */
    run_live("  local ov, e = kvr.overlap(req)\n"
             "  assert(ov == nil and e == 'no index bound', e)\n"
             "  local l, e2 = kvr.load(c[1])\n"
             "  assert(l == nil and e2 == 'no load tracker bound', e2)\n"
             "  local s, e3 = kvr.index_stats()\n"
             "  assert(s == nil and e3 == 'no index bound')\n"
             "  local la, e4 = kvr.lanes(req)\n"
             "  assert(la == nil and e4:find('no lane index', 1, true))\n"
             "  return c[2]",
             &req, c, 2);
}
END_TEST

Suite *ffi_suite(void)
{
    Suite *s = suite_create("ffi");
    TCase *api = tcase_create("api");
    tcase_add_test(api, cdef_matches_c_layout);
    tcase_add_test(api, embedded_cdef_is_the_header_block);
    tcase_add_test(api, u64_helpers);
    suite_add_tcase(s, api);
    TCase *eng = tcase_create("engine");
    tcase_add_checked_fixture(eng, setup_engine, teardown_engine);
    tcase_set_timeout(eng, 60);
    tcase_add_test(eng, overlap_queries);
    tcase_add_test(eng, overlap_by_tokens);
    tcase_add_test(eng, many_ranks_grow_the_scratch);
    tcase_add_test(eng, live_load_and_prepare);
    tcase_add_test(eng, lanes_from_the_index_ckf);
    tcase_add_test(eng, unbound_engine_reports_not_available);
    suite_add_tcase(s, eng);
    return s;
}
