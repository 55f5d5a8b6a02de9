/* test_vm.c - Check suite for lua/src/vm.c and state.c: decisions, status mapping, budgets,
 * fallback, bindings, fields, hooks, counters.
 * SPDX-License-Identifier: Apache-2.0 */
#include <check.h>
#include <stdio.h>
#include <time.h>
#include <stdlib.h>
#include <string.h>

#include "kvr/err.h"
#include "kvr/lua.h"
#include "luafix.h"

Suite *vm_suite(void);

static struct logcap lc;
static kvr_lua_runtime_t *rt;
static kvr_lua_vm_t *vm;
static struct kvr_ffi_request req;
static struct kvr_ffi_candidate cands[8];
static struct kvr_lua_decision d;
static uint32_t ranked[8];
static char err[4096];

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

struct seen_counters {
    uint64_t picks, live;
};

static void counter_cb(void *ctx, const char *policy, const char *name, uint64_t v)
{
    struct seen_counters *seen = ctx;
    if (strcmp(policy, "rr") != 0)
        return;
    if (strcmp(name, "picks") == 0)
        seen->picks = v;
    if (strcmp(name, "live.picks") == 0)
        seen->live = v;
}

static void setup_cfg(struct kvr_lua_config *cfg)
{
    logcap_init(&lc);
    rt = luafix_runtime(cfg, &lc);
    ck_assert_int_eq(kvr_lua_vm_new(rt, NULL, &vm), KVR_OK);
    luafix_request(&req, 100, 16);
    luafix_cands(cands, 8);
}

static void setup(void)
{
    setup_cfg(NULL);
}

static void teardown(void)
{
    kvr_lua_vm_free(vm);
    kvr_lua_runtime_free(rt);
    vm = NULL;
    rt = NULL;
}

/* Installs src as `name` and binds it as the default policy. */
static void use(const char *name, const char *src, unsigned flags)
{
    int st = luafix_install(rt, name, src, flags, err, sizeof(err));
    ck_assert_msg(st == KVR_LUA_OK, "install %s: %s", name, err);
    ck_assert_int_eq(kvr_lua_policy_bind(rt, NULL, name, NULL), KVR_OK);
}

static int pick(size_t n)
{
    memset(&d, 0, sizeof(d));
    d.ranked = ranked;
    d.cap = 8;
    ck_assert_int_eq(kvr_lua_vm_select(vm, &req, cands, n, &d), KVR_OK);
    ck_assert_uint_ge(d.n_ranked, 1);
    return (int)ranked[0];
}

static struct kvr_lua_policy_stats stats(const char *name)
{
    struct kvr_lua_policy_stats st;
    ck_assert_int_eq(kvr_lua_policy_stats(rt, name, &st), KVR_OK);
    return st;
}

/* Policies that behave during validation (model "synthetic-model") and misbehave on "live". */
#define LIVE(body)                                                                                 \
    "local function select(req, c)\n"                                                              \
    "  if req.model == 'live' then\n" body "\n  end\n"                                             \
    "  return c[1]\nend\nreturn { select = select }\n"

/* ==== api ==================================================================================== */

START_TEST(kv_cost_decides)
{
    const char *src;
    size_t len;
    ck_assert_int_eq(kvr_lua_builtin_source(rt, "kv_cost", &src, &len), KVR_OK);
    uint64_t gen = 0;
    int st;
    ck_assert_int_eq(kvr_lua_policy_install(rt, "kv_cost", src, len, 0, &gen, &st, err, 4096),
                     KVR_OK);
    ck_assert_uint_eq(gen, 1);
    ck_assert_int_eq(kvr_lua_policy_bind(rt, NULL, "kv_cost", &gen), KVR_OK);
    ck_assert_uint_eq(gen, 2);
    cands[2].overlap = 3;
    ck_assert_int_eq(pick(4), 2);
    ck_assert_int_eq(d.status, KVR_LUA_OK);
    ck_assert_int_eq(d.fallback, 0);
    ck_assert_str_eq(d.policy, "kv_cost");
    ck_assert_str_eq(d.error, "");
    ck_assert_uint_eq(d.generation, 2);
    /* d.elapsed_ns is read from the coarse clock (0 for a sub-tick decision): it is checked on
     * a slow decision in trusted_overrun_is_discarded. */
    ck_assert_uint_lt(d.elapsed_ns, 1000000000u);
    cands[2].decode_blocks = 4; /* 3.25 + 4 > 6.25: candidate 0 */
    ck_assert_int_eq(pick(4), 0);
    struct kvr_lua_policy_stats s = stats("kv_cost");
    ck_assert_uint_eq(s.decisions, 2);
    ck_assert_uint_eq(s.ok, 2);
    ck_assert_uint_eq(s.fallbacks, 0);
    ck_assert_uint_eq(s.reloads, 1);
    ck_assert_int_eq(s.live, 1);
    ck_assert_uint_gt(kvr_lua_vm_memory(vm), 0);
}
END_TEST

START_TEST(ranked_lists)
{
    use("ranked",
        "return { select = function(req, c)\n"
        "  if #c < 3 then return c end\n"
        "  return { c[3], c[1], c[2] } end }",
        0);
    ck_assert_int_eq(pick(3), 2);
    ck_assert_uint_eq(d.n_ranked, 3);
    ck_assert_uint_eq(ranked[1], 0);
    ck_assert_uint_eq(ranked[2], 1);
    memset(&d, 0, sizeof(d));
    d.ranked = ranked;
    d.cap = 2; /* truncated to the caller's capacity */
    ck_assert_int_eq(kvr_lua_vm_select(vm, &req, cands, 3, &d), KVR_OK);
    ck_assert_uint_eq(d.n_ranked, 2);
    ck_assert_uint_eq(ranked[0], 2);
    ck_assert_uint_eq(ranked[1], 0);
    d.cap = 0;
    ck_assert_int_eq(kvr_lua_vm_select(vm, &req, cands, 3, &d), KVR_EINVAL);
    d.cap = 2;
    ck_assert_int_eq(kvr_lua_vm_select(vm, &req, cands, 0, &d), KVR_EINVAL);
    req.block_size = 0;
    ck_assert_int_eq(kvr_lua_vm_select(vm, &req, cands, 3, &d), KVR_EINVAL);
}
END_TEST

START_TEST(no_policy_falls_back)
{
    cands[1].overlap = 5;
    ck_assert_int_eq(pick(3), 1);
    ck_assert_int_eq(d.status, KVR_LUA_NOPOLICY);
    ck_assert_int_eq(d.fallback, 1);
    ck_assert_str_eq(d.policy, "");
    ck_assert_uint_eq(d.n_ranked, 3); /* the fallback ranks for retries */
}
END_TEST

START_TEST(bindings_and_header)
{
    ck_assert_int_eq(luafix_install(rt, "first", "return {select=function(r,c) return c[1] end}", 0,
                                    err, sizeof(err)),
                     KVR_LUA_OK);
    ck_assert_int_eq(luafix_install(rt, "last", "return {select=function(r,c) return c[#c] end}", 0,
                                    err, sizeof(err)),
                     KVR_LUA_OK);
    ck_assert_int_eq(kvr_lua_policy_bind(rt, "a", "first", NULL), KVR_OK);
    ck_assert_int_eq(kvr_lua_policy_bind(rt, NULL, "last", NULL), KVR_OK);
    ck_assert_int_eq(kvr_lua_policy_bind(rt, "b", "nope", NULL), KVR_ENOTFOUND);
    req.model = "a";
    ck_assert_int_eq(pick(4), 0);
    ck_assert_str_eq(d.policy, "first");
    req.model = "other";
    ck_assert_int_eq(pick(4), 3);
    req.policy = "first"; /* header not allowed by this runtime's config: ignored */
    req.policy_len = 5;
    ck_assert_int_eq(pick(4), 3);
    ck_assert_int_eq(kvr_lua_policy_bind(rt, "a", NULL, NULL), KVR_OK); /* unbind */
    req.model = "a";
    req.policy = NULL;
    req.policy_len = 0;
    ck_assert_int_eq(pick(4), 3);
}
END_TEST

START_TEST(header_policy_allowed)
{
    teardown();
    struct kvr_lua_config cfg;
    kvr_lua_config_init(&cfg);
    cfg.allow_header_policy = 1;
    setup_cfg(&cfg);
    ck_assert_int_eq(luafix_install(rt, "first", "return {select=function(r,c) return c[1] end}", 0,
                                    err, sizeof(err)),
                     KVR_LUA_OK);
    ck_assert_int_eq(luafix_install(rt, "last", "return {select=function(r,c) return c[#c] end}", 0,
                                    err, sizeof(err)),
                     KVR_LUA_OK);
    ck_assert_int_eq(kvr_lua_policy_bind(rt, NULL, "last", NULL), KVR_OK);
    req.policy = "first";
    req.policy_len = 5;
    ck_assert_int_eq(pick(4), 0);
    req.policy = "unknown"; /* an unknown name falls back to the binding */
    req.policy_len = 7;
    ck_assert_int_eq(pick(4), 3);
}
END_TEST

START_TEST(fields_reach_lua)
{
    static const char *src =
        "local function check(req, c)\n"
        "  local bad = {}\n"
        "  local function eq(what, got, want)\n"
        "    if got ~= want then bad[#bad+1] = what .. '=' .. tostring(got) end\n"
        "  end\n"
        "  eq('model', req.model, 'live-model') eq('session', req.session, 'sess')\n"
        "  eq('lora', req.lora, 'ad') eq('hdr', req.headers['x-a'], 'b')\n"
        "  eq('id', req.id, '18446744073709551615') eq('tokens', req.tokens, 100)\n"
        "  eq('blocks', req.blocks, 6) eq('bs', req.block_size, 16) eq('prio', req.priority, -2)\n"
        "  eq('w', req.overlap_weight, 0.5) eq('t', req.temperature, nil)\n"
        "  eq('n', #c, 3) eq('index', c[2].index, 2)\n"
        "  eq('key', c[2].key, '17293822569102704641:1') eq('rank', c[2].dp_rank, 1)\n"
        "  eq('idnum', c[2].id, 17293822569102704641) eq('url', c[2].url, 'http://w2')\n"
        "  eq('labels', c[2].labels, 'zone=a,gpu=h100') eq('label', kvr.label(c[2], 'gpu'), "
        "'h100')\n"
        "  eq('nolabels', c[1].labels, '') eq('nourl', c[1].url, nil)\n"
        "  eq('healthy', c[2].healthy, false) eq('h1', c[1].healthy, true)\n"
        "  eq('kv', c[1].kv_usage, nil) eq('kv2', c[2].kv_usage, 0.25)\n"
        "  eq('ov', c[2].overlap, 4) eq('host', c[2].overlap_host, 5) eq('disk', "
        "c[2].overlap_disk, 6)\n"
        "  eq('tree', c[2].tree_blocks, 7) eq('pt', c[2].prefill_tokens, 8)\n"
        "  eq('db', c[2].decode_blocks, 9) eq('nb', c[2].new_blocks, 10)\n"
        "  eq('rq', c[2].requests, 11) eq('q', c[2].queue, 12) eq('wt', c[2].weight, 2.5)\n"
        "  if #bad > 0 then error('mismatch: ' .. table.concat(bad, ' ')) end\n"
        "  return c[2]\n"
        "end\n"
        "return { select = function(req, c)\n"
        "  if req.model == 'live-model' then return check(req, c) end\n"
        "  return c[1]\n"
        "end }\n";
    use("fields", src, 0);
    static const struct kvr_ffi_header h[] = {{"x-a", "b", 3, 1}};
    req.model = "live-model";
    req.model_len = 10;
    req.session = "sess";
    req.session_len = 4;
    req.lora = "ad";
    req.lora_len = 2;
    req.headers = h;
    req.n_headers = 1;
    req.request_id = UINT64_MAX;
    req.priority = -2;
    req.overlap_weight = 0.5;
    struct kvr_ffi_candidate *c = &cands[1];
    c->worker_id = 0xF000000000000001ull;
    c->dp_rank = 1;
    c->url = "http://w2";
    c->url_len = 9;
    c->labels = "zone=a,gpu=h100";
    c->labels_len = 15;
    c->healthy = 0;
    c->kv_usage = 0.25;
    c->overlap = 4;
    c->overlap_host = 5;
    c->overlap_disk = 6;
    c->tree_blocks = 7;
    c->prefill_tokens = 8;
    c->decode_blocks = 9;
    c->new_blocks = 10;
    c->requests = 11;
    c->queue = 12;
    c->weight = 2.5;
    int r = pick(3);
    ck_assert_msg(d.status == KVR_LUA_OK, "%s", d.error);
    ck_assert_int_eq(r, 1);
    /* Lazily read strings are re-read for the next request, never stale. */
    c->url = "http://w9";
    req.session = "other";
    req.session_len = 5;
    pick(3);
    ck_assert_int_eq(d.status, KVR_LUA_ERRRUN);
    ck_assert_ptr_nonnull(strstr(d.error, "session=other"));
    ck_assert_ptr_nonnull(strstr(d.error, "url=http://w9"));
}
END_TEST

START_TEST(computed_field_names_read_lazily)
{
    /* The glue copies only the fields a policy names as constants; a field read by a computed
     * name comes lazily from the C struct, fresh for every request. */
    use("dyn",
        "local f = { 'over' .. 'lap', 'que' .. 'ue' }\n"
        "return { select = function(req, c)\n"
        "  local best, bv = c[1], -1\n"
        "  for i = 1, #c do local v = c[i][f[1]] * 100 + c[i][f[2]]\n"
        "    if v > bv then best, bv = c[i], v end end\n"
        "  return best end }\n",
        0);
    /* A second policy in the same state that names other fields: both keep working. */
    ck_assert_int_eq(luafix_install(rt, "named",
                                    "return { select = function(r, c) local b = c[1]\n"
                                    "for i = 2, #c do if c[i].requests < b.requests then b = c[i] "
                                    "end end return b end }",
                                    0, err, sizeof(err)),
                     KVR_LUA_OK);
    ck_assert_int_eq(kvr_lua_policy_bind(rt, "named", "named", NULL), KVR_OK);
    cands[2].overlap = 1;
    ck_assert_int_eq(pick(4), 2);
    cands[2].overlap = 0;
    cands[1].queue = 7;
    ck_assert_int_eq(pick(4), 1);
    cands[3].overlap = 2;
    ck_assert_int_eq(pick(4), 3);
    for (int i = 0; i < 4; i++)
        cands[i].requests = (uint32_t)(10 - i);
    req.model = "named";
    req.model_len = 5;
    ck_assert_int_eq(pick(4), 3);
    cands[0].requests = 0;
    ck_assert_int_eq(pick(4), 0);
}
END_TEST

START_TEST(writes_never_reach_the_next_request)
{
    /* One state serves every policy (per-tenant policies by header or model): whatever one
     * policy writes into the request and candidate tables must not be what the next request of
     * another policy reads. Writes of new fields raise; overwrites of fields already there
     * (allowed: Lua cannot see them) last only until the next fill. */
    use("victim",
        "local function check(r, c)\n"
        "  local bad = {}\n"
        "  local function eq(what, got, want)\n"
        "    if got ~= want then bad[#bad+1] = what .. '=' .. tostring(got) end\n"
        "  end\n"
        "  eq('model', r.model, 'victim') eq('session', r.session, 'sess')\n"
        "  eq('tokens', r.tokens, 100) eq('extra', r.extra, nil) eq('w', r.overlap_weight, nil)\n"
        "  eq('n', #c, 3) eq('c4', c[4], nil) eq('c99', c[99], nil) eq('x', c.x, nil)\n"
        "  local k = 0 for _ in pairs(c) do k = k + 1 end eq('keys', k, 3)\n"
        "  for i = 1, #c do\n"
        "    eq('index' .. i, c[i].index, i) eq('id' .. i, c[i].id, 99 + i)\n"
        "    eq('overlap' .. i, c[i].overlap, i == 2 and 5 or 0)\n"
        "    eq('requests' .. i, c[i].requests, 0) eq('foo' .. i, c[i].foo, nil)\n"
        "    eq('raw1' .. i, rawget(c[i], 1), nil)\n"
        "  end\n"
        "  eq('labels', c[2].labels, 'zone=a') eq('url', c[1].url, nil)\n"
        "  if #bad > 0 then error('poisoned: ' .. table.concat(bad, ' ')) end\n"
        "end\n"
        "return { select = function(r, c)\n"
        "  if r.model == 'victim' then check(r, c) end\n"
        "  return c[1]\n"
        "end }\n",
        0);
    ck_assert_int_eq(
        luafix_install(rt, "evil",
                       "return { select = function(r, c)\n"
                       "  if r.model ~= 'evil' then return c[1] end\n"
                       "  local raised, ok = 0, 0\n"
                       "  local function try(f) if pcall(f) then ok = ok + 1 else raised = raised "
                       "+ 1 end end\n"
                       "  local _ = r.session, r.model, c[2].labels, c[1].url\n"
                       "  try(function() r.model = 'evil' end)\n"
                       "  try(function() r.session = 'stolen' end)\n"
                       "  try(function() r.tokens = 1 end)\n"
                       "  try(function() r.overlap_weight = 9 end)\n"
                       "  try(function() r.extra = 1 end)\n"
                       "  try(function() c[2].labels = 'zone=evil' end)\n"
                       "  try(function() c[1].url = 'http://evil' end)\n"
                       "  try(function() c[2].overlap = 999 end)\n"
                       "  try(function() c[1].requests = nil end)\n"
                       "  try(function() c[3].foo = 1 end)\n"
                       "  try(function() c[4] = c[1] end)\n"
                       "  try(function() c.x = 1 end)\n"
                       "  try(function() table.insert(c, c[1]) end)\n"
                       "  try(function() table.insert(c[1], 7) end)\n"
                       "  try(function() table.remove(c) end)\n"
                       "  c[1], c[3] = c[3], c[1]\n"
                       "  table.sort(c, function(a, b) return a.id > b.id end)\n"
                       "  if raised < 7 then error('writes not refused: ' "
                       ".. raised) end\n"
                       "  return c[1]\n"
                       "end }\n",
                       0, err, sizeof(err)),
        KVR_LUA_OK);
    ck_assert_int_eq(kvr_lua_policy_bind(rt, "evil", "evil", NULL), KVR_OK);
    ck_assert_int_eq(kvr_lua_policy_bind(rt, "victim", "victim", NULL), KVR_OK);
    req.session = "sess";
    req.session_len = 4;
    cands[1].labels = "zone=a";
    cands[1].labels_len = 6;
    cands[1].overlap = 5;
    for (int round = 0; round < 3; round++) {
        req.model = "evil";
        req.model_len = 4;
        pick(3);
        ck_assert_msg(d.status == KVR_LUA_OK, "evil: %s", d.error);
        req.model = "victim";
        req.model_len = 6;
        pick(3);
        ck_assert_msg(d.status == KVR_LUA_OK, "round %d: %s", round, d.error);
    }
    /* A smaller request after a larger one sees only its own candidates. */
    req.model = "evil";
    req.model_len = 4;
    pick(4);
    req.model = "victim";
    req.model_len = 6;
    pick(3);
    ck_assert_msg(d.status == KVR_LUA_OK, "after 4: %s", d.error);
}
END_TEST

START_TEST(decisions_allocate_nothing)
{
    /* The runtime's path of a decision allocates nothing once warm (a boxed cdata pointer per
     * call used to leave 24 to 72 bytes of garbage per decision): a policy that allocates
     * nothing itself leaves the state's allocation counter flat. */
    static const char *const srcs[] = {
        "return { select = function(r, c) return c[1] end }",
        "return { select = function(r, c) local b = c[1]\n"
        "  for i = 2, #c do if c[i].overlap > b.overlap then b = c[i] end end return b end }",
    };
    static struct kvr_ffi_candidate big[64];
    luafix_cands(big, 64);
    for (int i = 0; i < 64; i++)
        big[i].overlap = (uint32_t)((i * 7) % 13);
    for (int k = 0; k < 2; k++)
        for (unsigned trusted = 0; trusted <= 1; trusted++) {
            char name[16];
            snprintf(name, sizeof(name), "flat%d%u", k, trusted);
            use(name, srcs[k], trusted ? KVR_LUA_TRUSTED : 0);
            static const size_t ns[] = {1, 8, 64};
            for (size_t j = 0; j < 3; j++) {
                /* LuaJIT aborts a trace recording the count hook interrupts and, after a
                 * (randomised) number of retries, blacklists it; a blacklisted glue trace can
                 * leave 48 bytes per decision in about one state in ten. The runtime's path is
                 * allocation-free when compiled: one of three fresh states must show it. */
                uint64_t least = UINT64_MAX;
                for (int attempt = 0; attempt < 3 && least != 0; attempt++) {
                    if (attempt > 0) {
                        kvr_lua_vm_free(vm);
                        ck_assert_int_eq(kvr_lua_vm_new(rt, NULL, &vm), KVR_OK);
                    }
                    memset(&d, 0, sizeof(d));
                    d.ranked = ranked;
                    d.cap = 1;
                    for (int i = 0; i < 2000; i++)
                        ck_assert_int_eq(kvr_lua_vm_select(vm, &req, big, ns[j], &d), KVR_OK);
                    /* The JIT compiler allocates while it records and compiles traces: the
                     * quietest of 8 windows of 500 decisions must allocate nothing. Garbage
                     * per decision would show in all of them. */
                    for (int w = 0; w < 8; w++) {
                        uint64_t a0 = kvr_lua_vm_allocated(vm);
                        for (int i = 0; i < 500; i++)
                            ck_assert_int_eq(kvr_lua_vm_select(vm, &req, big, ns[j], &d), KVR_OK);
                        uint64_t a = kvr_lua_vm_allocated(vm) - a0;
                        least = a < least ? a : least;
                    }
                    ck_assert_msg(d.status == KVR_LUA_OK, "%s: %s", name, d.error);
                }
                ck_assert_msg(least == 0, "%s, %zu candidates: %llu bytes per 500 decisions", name,
                              ns[j], (unsigned long long)least);
            }
        }
}
END_TEST

START_TEST(state_counters_and_print)
{
    use("rr",
        "local s = kvr.state\n"
        "return { select = function(req, c)\n"
        "  s.k = (s.k or 0) + 1\n"
        "  kvr.count('picks')\n"
        "  if req.model == 'live' then kvr.count('live.picks', 2) print('hello', s.k) end\n"
        "  return c[(s.k - 1) % #c + 1]\n"
        "end }\n",
        0);
    req.model = "live";
    req.model_len = 4;
    ck_assert_int_eq(pick(3), 0);
    ck_assert_int_eq(pick(3), 1);
    ck_assert_int_eq(pick(3), 2);
    ck_assert_int_eq(pick(3), 0);
    ck_assert(logcap_has(&lc, "policy rr: hello 1"));
    struct seen_counters seen = {0, 0};
    kvr_lua_counters_foreach(rt, counter_cb, &seen);
    ck_assert_uint_eq(seen.picks, 4); /* validation's synthetic decisions count nothing */
    ck_assert_uint_eq(seen.live, 8);
}
END_TEST

START_TEST(bad_counter_name)
{
    use("cn", LIVE("kvr.count('no spaces allowed')"), 0);
    req.model = "live";
    req.model_len = 4;
    pick(2);
    ck_assert_int_eq(d.status, KVR_LUA_ERRRUN);
    ck_assert_ptr_nonnull(strstr(d.error, "counter names use"));
}
END_TEST

/* ==== failures: every one is counted, logged with a traceback and served by the fallback ==== */

START_TEST(error_every_call)
{
    use("boom", LIVE("    local x = nil\n    return x.field"), 0);
    req.model = "live";
    req.model_len = 4;
    cands[3].overlap = 6;
    for (int i = 0; i < 50; i++) {
        ck_assert_int_eq(pick(4), 3); /* the fallback's choice */
        ck_assert_int_eq(d.status, KVR_LUA_ERRRUN);
        ck_assert_int_eq(d.fallback, 1);
        ck_assert_str_eq(d.policy, "boom");
    }
    ck_assert_ptr_nonnull(strstr(d.error, "boom.lua:4:"));
    ck_assert_ptr_nonnull(strstr(d.error, "attempt to index local 'x'"));
    ck_assert_ptr_nonnull(strstr(d.error, "stack traceback"));
    struct kvr_lua_policy_stats s = stats("boom");
    ck_assert_uint_eq(s.decisions, 50);
    ck_assert_uint_eq(s.errors, 50);
    ck_assert_uint_eq(s.fallbacks, 50);
    ck_assert_uint_eq(s.ok, 0);
    ck_assert(logcap_has(&lc, "policy boom: select errrun"));
    ck_assert(logcap_has(&lc, "stack traceback"));
    ck_assert_int_lt(lc.lines, 10); /* rate-limited: not 50 lines */
}
END_TEST

START_TEST(infinite_loop_times_out)
{
    use("spin", LIVE("    while true do end"), 0);
    req.model = "live";
    req.model_len = 4;
    uint64_t t0 = now_ns();
    pick(3);
    uint64_t ms = (now_ns() - t0) / 1000000u;
    ck_assert_int_eq(d.status, KVR_LUA_ETIMEDOUT);
    ck_assert_int_eq(d.fallback, 1);
    ck_assert_ptr_nonnull(strstr(d.error, "time budget exceeded"));
    ck_assert_ptr_nonnull(strstr(d.error, "spin.lua:3:"));
    ck_assert_uint_ge(ms, 9);
    ck_assert_uint_lt(ms, 500);
    req.model = "m"; /* the state is still usable */
    req.model_len = 1;
    ck_assert_int_eq(pick(3), 0);
    ck_assert_int_eq(d.status, KVR_LUA_OK);
    ck_assert_uint_eq(stats("spin").timeouts, 1);
}
END_TEST

START_TEST(pcall_cannot_swallow_timeout)
{
    use("swallow",
        LIVE("    while true do pcall(function() while true do end end) end\n"
             "    return c[2]"),
        0);
    req.model = "live";
    req.model_len = 4;
    pick(3);
    ck_assert_int_eq(d.status, KVR_LUA_ETIMEDOUT);
    use("swallow2",
        LIVE("    for i = 1, 1e15 do pcall(error, 'x') xpcall(function() end, print) end"), 0);
    pick(3);
    ck_assert_int_eq(d.status, KVR_LUA_ETIMEDOUT);
    /* The error handler of xpcall loops too. */
    use("swallow3",
        LIVE("    xpcall(function() error('e') end, function() while true do end end)\n"
             "    while true do end"),
        0);
    pick(3);
    ck_assert_int_eq(d.status, KVR_LUA_ETIMEDOUT);
    /* An xpcall handler for the budget error itself: it must not run inside the hook (where
     * LuaJIT runs no hooks), or its loop would never end. */
    use("swallow5",
        LIVE("    while true do xpcall(function() while true do end end,\n"
             "                         function() while true do end end) end"),
        0);
    pick(3);
    ck_assert_int_eq(d.status, KVR_LUA_ETIMEDOUT);
    /* __tostring run from C (tostring) is interpreted and hooked as well. */
    use("swallow4",
        LIVE("    return tostring(setmetatable({}, {__tostring = function() while true do end "
             "end}))"),
        0);
    pick(3);
    ck_assert_int_eq(d.status, KVR_LUA_ETIMEDOUT);
    req.model = "m";
    req.model_len = 1;
    ck_assert_int_eq(pick(3), 0);
    ck_assert_int_eq(d.status, KVR_LUA_OK);
}
END_TEST

START_TEST(timeouts_inside_the_glue_leave_it_consistent)
{
    /* Once over budget, every instruction raises, also inside the runtime's own Lua (lazy
     * fields, their clearing list). Whatever point it stops at, later requests see fresh data. */
    use("glue",
        "local function select(req, c)\n"
        "  if req.model == 'live' then\n"
        /* the lazy strings materialise once per request; fields read by computed names go
         * through the runtime's __index every time */
        "    local f = { 'u' .. 'rl', 'ke' .. 'y', 'que' .. 'ue', 'ind' .. 'ex', 'lab' .. 'els' }\n"
        "    while true do for i = 1, #c do for j = 1, #f do\n"
        "      local v = c[i][f[j]] end end end\n"
        "  elseif req.model == 'chek' then\n"
        "    for i = 1, #c do if c[i].url ~= req.session or c[i].key ~= i + 99 .. ':0' then\n"
        "      error('stale: ' .. tostring(c[i].url) .. ' ' .. tostring(c[i].key)) end end\n"
        "  end\n"
        "  return c[1]\n"
        "end\n"
        "return { select = select }\n",
        0);
    char url[32];
    for (int round = 0; round < 40; round++) {
        snprintf(url, sizeof(url), "http://w/%d", round);
        for (int i = 0; i < 4; i++) {
            cands[i].url = url;
            cands[i].url_len = (uint32_t)strlen(url);
        }
        req.model = "live";
        req.model_len = 4;
        pick(4);
        ck_assert_int_eq(d.status, KVR_LUA_ETIMEDOUT);
        snprintf(url, sizeof(url), "http://x/%d", round); /* new strings, same length */
        req.model = "chek";
        req.session = url;
        req.session_len = (uint32_t)strlen(url);
        pick(4);
        ck_assert_msg(d.status == KVR_LUA_OK, "round %d: %s", round, d.error);
    }
}
END_TEST

START_TEST(memory_bomb)
{
    teardown();
    struct kvr_lua_config cfg;
    kvr_lua_config_init(&cfg);
    cfg.mem_limit = (size_t)16 << 20;
    cfg.budget_ns = 200000000u; /* filling 16 MiB takes ~11 ms: keep time out of this test */
    setup_cfg(&cfg);
    use("bomb",
        LIVE("    local t = {}\n"
             "    for i = 1, 1e9 do t[i] = ('x'):rep(100000 + i) end"),
        0);
    req.model = "live";
    req.model_len = 4;
    pick(3);
    ck_assert_int_eq(d.status, KVR_LUA_ERRMEM);
    ck_assert_int_eq(d.fallback, 1);
    ck_assert_ptr_nonnull(strstr(d.error, "not enough memory"));
    ck_assert_uint_lt(kvr_lua_vm_memory(vm), (size_t)4 << 20); /* collected afterwards */
    /* A bomb that the policy catches with pcall still ends: the time budget stops it. */
    use("bomb2",
        LIVE("    while true do pcall(function() local t = {} for i = 1, 1e9 do "
             "t[i] = {} end end) end"),
        0);
    pick(3);
    ck_assert(d.status == KVR_LUA_ETIMEDOUT || d.status == KVR_LUA_ERRMEM);
    /* String bombs. */
    use("bomb3", LIVE("    return ('x'):rep(1e9)"), 0);
    pick(3);
    ck_assert_msg(d.status == KVR_LUA_ERRMEM, "status %d: %s", d.status, d.error);
    req.model = "m";
    req.model_len = 1;
    ck_assert_int_eq(pick(3), 0);
    ck_assert_int_eq(d.status, KVR_LUA_OK);
    ck_assert_uint_eq(stats("bomb").oom, 1);
}
END_TEST

START_TEST(invalid_choices)
{
    static const char *bodies[] = {
        "    return nil",
        "    return 1",
        "    return 'c1'",
        "    return {}",
        "    return { id = 100, dp_rank = 0, overlap = 0 }", /* a look-alike, not a candidate */
        "    return { c[1], c[1] }",                         /* duplicate */
        "    return { c[2], { index = 1 } }",
        "    return setmetatable({}, { __index = c[1] })",
        "    kvr.state.old = kvr.state.old or c[3]\n    return kvr.state.old", /* stale */
    };
    char src[1024];
    for (size_t i = 0; i < sizeof(bodies) / sizeof(bodies[0]); i++) {
        char name[16];
        snprintf(name, sizeof(name), "inv%zu", i);
        snprintf(src, sizeof(src), LIVE("%s"), bodies[i]);
        use(name, src, 0);
        req.model = "live";
        req.model_len = 4;
        size_t n = i == 8 ? 3 : 2;
        pick(n);
        if (i == 8) { /* first call: valid (3 candidates); next, with 2, it is stale */
            ck_assert_int_eq(d.status, KVR_LUA_OK);
            pick(2);
        }
        ck_assert_msg(d.status == KVR_LUA_INVALID, "case %zu: status %d (%s)", i, d.status,
                      d.error);
        ck_assert_int_eq(d.fallback, 1);
        ck_assert_str_ne(d.error, "");
        ck_assert_uint_ge(stats(name).invalid, 1);
    }
}
END_TEST

/* ==== trusted (JIT) mode ===================================================================== */

START_TEST(trusted_same_choice)
{
    const char *src;
    size_t len;
    ck_assert_int_eq(kvr_lua_builtin_source(rt, "kv_cost", &src, &len), KVR_OK);
    ck_assert_int_eq(
        kvr_lua_policy_install(rt, "kvj", src, len, KVR_LUA_TRUSTED, NULL, NULL, err, 4096),
        KVR_OK);
    ck_assert_int_eq(kvr_lua_policy_bind(rt, NULL, "kvj", NULL), KVR_OK);
    for (int round = 0; round < 300; round++) { /* long enough for traces to compile */
        for (int i = 0; i < 8; i++) {
            cands[i].overlap = (uint32_t)((round * 7 + i * 3) % 7);
            cands[i].decode_blocks = (uint32_t)((round + i * 5) % 11);
        }
        struct kvr_fallback_params p;
        kvr_fallback_params_init(&p);
        uint32_t want[1];
        size_t nw;
        kvr_fallback_select(&p, &req, cands, 8, NULL, want, 1, &nw);
        ck_assert_int_eq(pick(8), (int)want[0]);
        ck_assert_int_eq(d.status, KVR_LUA_OK);
    }
    ck_assert_int_eq(stats("kvj").trusted, 1);
}
END_TEST

START_TEST(trusted_overrun_is_discarded)
{
    /* ~0.3 s of compiled looping (CPU, whatever the machine's load): past 5 x 10 ms of CPU
     * even though no hook fires inside the compiled loop. */
    use("slow",
        LIVE("    local x = 0\n    for i = 1, 3e8 do x = x + i % 7 end\n"
             "    if x < 0 then return nil end"),
        KVR_LUA_TRUSTED);
    req.model = "live";
    req.model_len = 4;
    pick(3);
    ck_assert_int_eq(d.status, KVR_LUA_ETIMEDOUT);
    ck_assert_int_eq(d.fallback, 1);
    ck_assert_uint_ge(d.elapsed_ns, 10000000u);
}
END_TEST

START_TEST(trusted_engine_calls_stop_at_deadline)
{
    use("spinffi", LIVE("    while true do kvr.overlap(req) end"), KVR_LUA_TRUSTED);
    req.model = "live";
    req.model_len = 4;
    pick(3);
    ck_assert_int_eq(d.status, KVR_LUA_ETIMEDOUT);
    ck_assert_ptr_nonnull(strstr(d.error, "time budget exceeded"));
    /* Even when the policy catches the error, the decision is discarded. */
    use("spinffi2", LIVE("    while true do pcall(kvr.overlap, req) end"), KVR_LUA_TRUSTED);
    pick(3);
    ck_assert_int_eq(d.status, KVR_LUA_ETIMEDOUT);
}
END_TEST

/* ==== hooks ================================================================================== */

START_TEST(on_response_hook)
{
    use("resp",
        "local s = kvr.state\n"
        "return {\n"
        "  select = function(req, c) return c[s.next or 1] end,\n"
        "  on_response = function(req, w, o)\n"
        "    if o.status == 503 and o.error == 'busy' and o.ttft_ms == nil and o.latency_ms == "
        "12.5\n"
        "       and not o.ok and w.key == '101:0' and req.model == 'm' then s.next = 2 end\n"
        "  end }\n",
        0);
    ck_assert_int_eq(pick(3), 0);
    struct kvr_ffi_outcome o = {.error = "busy",
                                .ttft_ms = -1,
                                .latency_ms = 12.5,
                                .error_len = 4,
                                .status = 503,
                                .output_tokens = 0};
    ck_assert_int_eq(kvr_lua_vm_on_response(vm, &req, &cands[1], &o), KVR_LUA_OK);
    ck_assert_int_eq(pick(3), 1);
    use("plain", "return { select = function(r, c) return c[1] end }", 0);
    ck_assert_int_eq(kvr_lua_vm_on_response(vm, &req, &cands[1], &o), KVR_LUA_NOPOLICY);
}
END_TEST

START_TEST(kv_event_hooks)
{
    use("own",
        "local held = kvr.state\n"
        "return {\n"
        "  select = function(req, c)\n"
        "    local best, bn = c[1], -1\n"
        "    for i = 1, #c do local n = held[c[i].key] or 0 if n > bn then best, bn = c[i], n end "
        "end\n"
        "    return best end,\n"
        "  on_stored = function(ev)\n"
        "    assert(ev.kind == 'stored' and ev.tier == 'device' and ev.n == 2)\n"
        "    assert(ev.block_hashes[2] == '18446744073709551615', ev.block_hashes[2])\n"
        "    assert(ev.tokens_hashes[1] == '7' and ev.parent_hash == '9007199254740993')\n"
        "    held[ev.key] = (held[ev.key] or 0) + ev.n end,\n"
        "  on_cleared = function(ev) held[ev.key] = nil end,\n"
        "}\n",
        0);
    ck_assert_int_eq(pick(3), 0);
    struct kvr_block b[2] = {{1, 7}, {UINT64_MAX, 8}};
    struct kvr_event ev = {.worker_id = 102,
                           .parent_hash = 9007199254740993ull,
                           .kind = KVR_EVENT_STORED,
                           .has_parent = 1,
                           .n = 2,
                           .blocks = b};
    ck_assert_int_eq(kvr_lua_vm_on_event(vm, &ev), KVR_LUA_OK);
    ck_assert_int_eq(pick(3), 2);
    struct kvr_event rm = {.worker_id = 102, .kind = KVR_EVENT_REMOVED};
    ck_assert_int_eq(kvr_lua_vm_on_event(vm, &rm), KVR_LUA_NOPOLICY); /* no on_removed */
    struct kvr_event cl = {.worker_id = 102, .kind = KVR_EVENT_CLEARED};
    ck_assert_int_eq(kvr_lua_vm_on_event(vm, &cl), KVR_LUA_OK);
    ck_assert_int_eq(pick(3), 0);
    b[1].block_hash = 5; /* the hook's assertion fails: counted, logged */
    ck_assert_int_eq(kvr_lua_vm_on_event(vm, &ev), KVR_LUA_ERRRUN);
    ck_assert_uint_eq(stats("own").hook_errors, 1);
}
END_TEST

/* ==== operator scripts ======================================================================= */

static char dumped[256];

static int fake_dump(void *ctx, const char *path, char *e, size_t elen)
{
    (void)ctx;
    if (strcmp(path, "/nope") == 0) {
        snprintf(e, elen, "cannot write %s", path);
        return KVR_EIO;
    }
    snprintf(dumped, sizeof(dumped), "%s", path);
    return KVR_OK;
}

START_TEST(operator_script)
{
    teardown();
    struct kvr_lua_config cfg;
    kvr_lua_config_init(&cfg);
    cfg.engine.dump = fake_dump;
    cfg.script_budget_ns = 50000000u;
    setup_cfg(&cfg);
    char out[256];
    int st = kvr_lua_script_run(
        rt,
        "assert(kvr.admin.dump('/tmp/kvr.dump'))\n"
        "local ok, e = kvr.admin.dump('/nope')\n"
        "local ok2, e2 = kvr.admin.snapshot('/tmp/x')\n"
        "return tostring(ok) .. ' ' .. e .. ' | ' .. tostring(ok2) .. ' ' .. e2",
        strlen("assert(kvr.admin.dump('/tmp/kvr.dump'))\n"
               "local ok, e = kvr.admin.dump('/nope')\n"
               "local ok2, e2 = kvr.admin.snapshot('/tmp/x')\n"
               "return tostring(ok) .. ' ' .. e .. ' | ' .. tostring(ok2) .. ' ' .. e2"),
        out, sizeof(out), err, sizeof(err));
    ck_assert_msg(st == KVR_LUA_OK, "%s", err);
    ck_assert_str_eq(dumped, "/tmp/kvr.dump");
    ck_assert_str_eq(out, "nil cannot write /nope | nil the host bound no handler");
    st = kvr_lua_script_run(rt, "while true do end", 17, out, sizeof(out), err, sizeof(err));
    ck_assert_int_eq(st, KVR_LUA_ETIMEDOUT);
    st = kvr_lua_script_run(rt, "return (", 8, out, sizeof(out), err, sizeof(err));
    ck_assert_int_eq(st, KVR_LUA_ERRSYNTAX);
    ck_assert_ptr_nonnull(strstr(err, "script.lua:1:"));
}
END_TEST

START_TEST(policies_have_no_admin)
{
    teardown();
    struct kvr_lua_config cfg;
    kvr_lua_config_init(&cfg);
    cfg.engine.dump = fake_dump;
    setup_cfg(&cfg);
    dumped[0] = '\0';
    use("adm", LIVE("    kvr.admin.dump('/tmp/evil')"), 0);
    req.model = "live";
    req.model_len = 4;
    pick(2);
    ck_assert_int_eq(d.status, KVR_LUA_ERRRUN);
    ck_assert_str_eq(dumped, "");
}
END_TEST

Suite *vm_suite(void)
{
    Suite *s = suite_create("vm");
    TCase *api = tcase_create("api");
    tcase_add_checked_fixture(api, setup, teardown);
    tcase_set_timeout(api, 120);
    tcase_add_test(api, kv_cost_decides);
    tcase_add_test(api, ranked_lists);
    tcase_add_test(api, no_policy_falls_back);
    tcase_add_test(api, bindings_and_header);
    tcase_add_test(api, header_policy_allowed);
    tcase_add_test(api, fields_reach_lua);
    tcase_add_test(api, computed_field_names_read_lazily);
    tcase_add_test(api, writes_never_reach_the_next_request);
    tcase_add_test(api, decisions_allocate_nothing);
    tcase_add_test(api, state_counters_and_print);
    tcase_add_test(api, bad_counter_name);
    tcase_add_test(api, on_response_hook);
    tcase_add_test(api, kv_event_hooks);
    tcase_add_test(api, policies_have_no_admin);
    tcase_add_test(api, operator_script);
    suite_add_tcase(s, api);
    TCase *edge = tcase_create("edge");
    tcase_add_checked_fixture(edge, setup, teardown);
    tcase_set_timeout(edge, 120);
    tcase_add_test(edge, error_every_call);
    tcase_add_test(edge, infinite_loop_times_out);
    tcase_add_test(edge, pcall_cannot_swallow_timeout);
    tcase_add_test(edge, timeouts_inside_the_glue_leave_it_consistent);
    tcase_add_test(edge, memory_bomb);
    tcase_add_test(edge, invalid_choices);
    tcase_add_test(edge, trusted_same_choice);
    tcase_add_test(edge, trusted_overrun_is_discarded);
    tcase_add_test(edge, trusted_engine_calls_stop_at_deadline);
    suite_add_tcase(s, edge);
    return s;
}
