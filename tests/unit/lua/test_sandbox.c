/* test_sandbox.c - Check suite for lua/src/sandbox.c and the environment of kvr/policy.lua:
 * every escape attempt fails closed, at install time and at request time.
 * SPDX-License-Identifier: Apache-2.0 */
#include <check.h>
#include <stdio.h>
#include <string.h>

#include "kvr/err.h"
#include "kvr/lua.h"
#include "luafix.h"

Suite *sandbox_suite(void);

static struct logcap lc;
static kvr_lua_runtime_t *rt;

static void setup(void)
{
    logcap_init(&lc);
    struct kvr_lua_config cfg;
    kvr_lua_config_init(&cfg);
    cfg.load_budget_ns = 300000000u; /* runaway chunks stop sooner */
    rt = luafix_runtime(&cfg, &lc);
}

static void teardown(void)
{
    kvr_lua_runtime_free(rt);
    rt = NULL;
}

/* An escape attempt, the error the refusal must mention. */
struct escape {
    const char *code;
    const char *expect;
};

static const struct escape escapes[] = {
    {"io.open('/etc/passwd')", "global 'io'"},
    {"os.execute('true')", "global 'os'"},
    {"os.exit(1)", "global 'os'"},
    {"debug.getinfo(1)", "global 'debug'"},
    {"debug.sethook()", "global 'debug'"},
    {"ffi.C.abort()", "global 'ffi'"},
    {"jit.on()", "global 'jit'"},
    {"jit.off()", "global 'jit'"},
    {"package.loaded.os.exit()", "global 'package'"},
    {"require('ffi')", "module 'ffi' is not available"},
    {"require('os')", "module 'os' is not available"},
    {"require('io')", "module 'io' is not available"},
    {"require('debug')", "module 'debug' is not available"},
    {"require('jit.util')", "module 'jit.util' is not available"},
    {"require('string.buffer')", "module 'string.buffer' is not available"},
    {"load('return 1')()", "global 'load'"},
    {"loadstring('return 1')()", "global 'loadstring'"},
    {"loadfile('/etc/passwd')", "global 'loadfile'"},
    {"dofile('/etc/passwd')", "global 'dofile'"},
    {"module('x')", "global 'module'"},
    {"getfenv(1).io = 1", "global 'getfenv'"},
    {"setfenv(1, {})", "global 'setfenv'"},
    {"rawset(_G, 'x', 1)", "global 'rawset'"},
    {"_G.x = 1", "policies may not write globals"},
    {"x = 1", "policies may not write globals"},
    {"_G._G.io.open('/etc/passwd')", "field 'io'"},
    {"rawget(_G, 'io').open('x')", "a nil value"},
    {"setmetatable(_G, {})", "cannot change a protected metatable"},
    {"getmetatable(_G).__index.io = 1", "a boolean value"},
    {"collectgarbage('stop')", "global 'collectgarbage'"},
    {"gcinfo()", "global 'gcinfo'"},
    {"newproxy(true)", "global 'newproxy'"},
    {"coroutine.create(print)", "global 'coroutine'"},
    {"coroutine.wrap(function() end)()", "global 'coroutine'"},
    /* The string metatable: ("").x resolves in the safe string table only. */
    {"getmetatable('').__index.dump = 1", "a boolean value"},
    {"local mt = getmetatable('') mt.__index = {}", "a boolean value"},
    {"(''):dump()", "method 'dump'"},
    {"('').x.y = 1", "field 'x'"},
    {"local gsub = ('').gsub gsub('a', 'a', 'b')", "patterns are not available"},
    {"string.dump(print)", "field 'dump'"},
    {"(''):gsub('x', 'y')", "patterns are not available"},
    {"('aaa'):match('(a*)*b')", "patterns are not available"},
    {"for w in ('a b'):gmatch('%a+') do end", "patterns are not available"},
    {"string.find('aaa', 'a*b')", "patterns are not available"},
    {"('x'):find('.')", "patterns are not available"},
    /* Read-only libraries. */
    {"string.rep = nil", "read-only table 'string'"},
    {"math.floor = print", "read-only table 'math'"},
    {"table.insert = nil", "read-only table 'table'"},
    {"kvr.now = nil", "read-only table 'kvr'"},
    {"rawset(kvr, 'now', nil)", "global 'rawset'"},
    {"setmetatable(kvr, nil)", "cannot change a protected metatable"},
    {"bit.band = nil", "read-only table 'bit'"},
    /* The runtime's own tables. */
    {"setmetatable(c[1], {})", "cannot change a protected metatable"},
    {"setmetatable(req, {})", "cannot change a protected metatable"},
    {"getmetatable(c[1]).__index(c[1], 'x')", "a nil value"},
    /* The runtime's request and candidate tables are read-only: a write could reach the next
     * request, or (the position of a candidate) make the glue read outside the C array. */
    {"c[1].index = -1e8 local _ = c[1].labels", "read-only"},
    {"c[1].index = 0 local _ = c[1].url", "read-only"},
    {"c[1].x = 1", "read-only"},
    {"req.lora = 'evil'", "read-only"},
    {"req.extra = {}", "read-only"},
    {"c[#c + 1] = c[1]", "read-only"},
    {"c.n = 1", "read-only"},
    {"table.insert(c, c[1])", "read-only"},
    {"table.insert(c[1], 1)", "read-only"},
    {"table.remove(c)", "read-only"},
    {"table.remove(req)", "read-only"},
    /* Operator-only API. */
    {"kvr.admin.dump('/tmp/x')", "field 'admin'"},
    /* Trying to reach a cdata through the API: everything returned is plain Lua. */
    {"assert(type(kvr.hash('x')) == 'number') assert(type(c[1].id) == 'number') "
     "assert(type(kvr.now()) == 'number') error('plain values only')",
     "plain values only"},
    /* xpcall keeps its meaning (handler result, extra arguments) though its handler runs after
     * the unwind */
    {"local ok, e = xpcall(function(a) error('boom' .. a, 0) end, function(m) return 'h:' .. m "
     "end, 7) assert(not ok and e == 'h:boom7') "
     "local t = { xpcall(function() return 1, 2, 3 end, print) } assert(#t == 4 and t[4] == 3) "
     "error('xpcall works')",
     "xpcall works"},
};

START_TEST(escapes_refused_at_install)
{
    char src[2048], err[4096], name[32];
    for (size_t i = 0; i < sizeof(escapes) / sizeof(escapes[0]); i++) {
        if (i > 0 && i % 48 == 0) { /* a runtime holds at most 64 policy names */
            ck_assert_uint_eq(kvr_lua_runtime_generation(rt), 0); /* nothing ever installed */
            teardown();
            setup();
        }
        snprintf(name, sizeof(name), "esc%zu", i);
        snprintf(src, sizeof(src),
                 "local function select(req, c)\n  %s\n  return c[1]\nend\n"
                 "return { select = select }\n",
                 escapes[i].code);
        int st = luafix_install(rt, name, src, 0, err, sizeof(err));
        ck_assert_msg(st == KVR_LUA_ERRRUN, "escape %zu (%s) not refused: status %d (%s)", i,
                      escapes[i].code, st, err);
        ck_assert_msg(strstr(err, escapes[i].expect) != NULL,
                      "escape %zu (%s): expected '%s' in: %s", i, escapes[i].code,
                      escapes[i].expect, err);
        ck_assert_msg(strstr(err, name) != NULL, "escape %zu: no chunk name/line in %s", i, err);
        struct kvr_lua_policy_stats st2;
        ck_assert_int_eq(kvr_lua_policy_stats(rt, name, &st2), KVR_OK);
        ck_assert_int_eq(st2.live, 0);
        ck_assert_uint_eq(st2.rejected, 1);
    }
    ck_assert_uint_eq(kvr_lua_runtime_generation(rt), 0); /* nothing was ever installed */
}
END_TEST

START_TEST(escapes_fail_closed_at_request_time)
{
    /* Policies that pass validation, then try the escape on a live request: the request is
     * routed by the fallback, the state keeps serving. */
    char src[2048], err[4096], name[32];
    kvr_lua_vm_t *vm;
    ck_assert_int_eq(kvr_lua_vm_new(rt, NULL, &vm), KVR_OK);
    struct kvr_ffi_request req;
    struct kvr_ffi_candidate c[3];
    luafix_request(&req, 64, 16);
    luafix_cands(c, 3);
    c[2].overlap = 4;
    for (size_t i = 0; i < sizeof(escapes) / sizeof(escapes[0]); i++) {
        if (i > 0 && i % 48 == 0) { /* a runtime holds at most 64 policy names */
            kvr_lua_vm_free(vm);
            teardown();
            setup();
            ck_assert_int_eq(kvr_lua_vm_new(rt, NULL, &vm), KVR_OK);
        }
        snprintf(name, sizeof(name), "live%zu", i);
        snprintf(src, sizeof(src),
                 "local function select(req, c)\n"
                 "  if req.model == 'live' then\n  %s\n  end\n  return c[1]\nend\n"
                 "return { select = select }\n",
                 escapes[i].code);
        ck_assert_int_eq(luafix_install(rt, name, src, 0, err, sizeof(err)), KVR_LUA_OK);
        ck_assert_int_eq(kvr_lua_policy_bind(rt, "live", name, NULL), KVR_OK);
        req.model = "live";
        req.model_len = 4;
        struct kvr_lua_decision d;
        uint32_t ranked[3];
        uint32_t first = luafix_select(vm, &req, c, 3, &d, ranked, 3);
        ck_assert_msg(d.status == KVR_LUA_ERRRUN && d.fallback == 1 && first == 2,
                      "escape %zu (%s): status %d, chose %u", i, escapes[i].code, d.status, first);
        ck_assert_msg(strstr(d.error, escapes[i].expect) != NULL, "escape %zu: %s", i, d.error);
        req.model = "calm";
        req.model_len = 4;
        kvr_lua_policy_bind(rt, "calm", name, NULL);
        ck_assert_uint_eq(luafix_select(vm, &req, c, 3, &d, ranked, 3), 0);
        ck_assert_int_eq(d.status, KVR_LUA_OK);
    }
    kvr_lua_vm_free(vm);
}
END_TEST

START_TEST(allowed_library_works)
{
    /* The allow-list is usable: what policies legitimately need. */
    static const char *src =
        "local s = ('abc'):upper() .. string.rep('x', 2, ',') .. string.format('%05.1f', 2.25)\n"
        "assert(s == 'ABCx,x002.2' or s == 'ABCx,x002.3', s)\n"
        "assert(('a.b.c'):find('.', 1, true) == 2 and ('abc'):find('c') == 3)\n"
        "assert(#kvr.split('a,b,,c', ',') == 4 and kvr.split('', ',')[1] == nil)\n"
        "assert(math.max(1, 2) == 2 and math.floor(2.5) == 2 and bit.band(6, 3) == 2)\n"
        "local t = {3, 1, 2} table.sort(t) assert(table.concat(t, ' ') == '1 2 3')\n"
        "table.insert(t, 4) assert(select('#', unpack(t)) == 4 and next({}) == nil)\n"
        "assert(pcall(error, 'e') == false and type(tostring(1)) == 'string')\n"
        "local mt = setmetatable({}, {__index = function() return 7 end}) assert(mt.x == 7)\n"
        "assert(getmetatable('') == false and rawequal(t, t) and rawget(t, 1) == 1)\n"
        "assert(kvr.hash('a') ~= kvr.hash('b') and kvr.hash('a') == kvr.hash('a'))\n"
        "assert(#kvr.hash64('x') >= 1 and kvr.random() < 1 and kvr.random(3) <= 3)\n"
        "assert(require('kvr') == kvr and require('kvr.core') == kvr and _G.kvr == kvr)\n"
        "assert(kvr.softmax_pick({3.25, 6.25, 4.0}, 0.5, 0.6) == 2)\n"
        "assert(kvr.argmin({3, 1, 1}, {0, 5, 2}) == 3 and kvr.argmin({}) == nil)\n"
        "assert(kvr.name == 'ok' and type(kvr.state) == 'table' and kvr.version:find('kvrouter', "
        "1, true))\n"
        "return { select = function(req, c) return c[1] end }\n";
    char err[4096];
    int st = luafix_install(rt, "ok", src, 0, err, sizeof(err));
    ck_assert_msg(st == KVR_LUA_OK, "%s", err);
}
END_TEST

START_TEST(chunk_errors_name_the_line)
{
    char err[4096];
    ck_assert_int_eq(luafix_install(rt, "syn", "local x = \nreturn {", 0, err, sizeof(err)),
                     KVR_LUA_ERRSYNTAX);
    ck_assert_ptr_nonnull(strstr(err, "syn.lua:2:"));
    ck_assert_int_eq(
        luafix_install(rt, "run", "local t = nil\nlocal y = t.x\n", 0, err, sizeof(err)),
        KVR_LUA_ERRRUN);
    ck_assert_ptr_nonnull(strstr(err, "run.lua:2:"));
    ck_assert_int_eq(
        luafix_install(rt, "nosel", "return { pick = function() end }", 0, err, sizeof(err)),
        KVR_LUA_ERRRUN);
    ck_assert_ptr_nonnull(strstr(err, "no select(req, candidates) function"));
    ck_assert_int_eq(luafix_install(rt, "notab", "return 42", 0, err, sizeof(err)), KVR_LUA_ERRRUN);
    ck_assert_ptr_nonnull(strstr(err, "must return a table"));
    ck_assert_int_eq(luafix_install(rt, "badhook",
                                    "return { select = function() end, on_response = 3 }", 0, err,
                                    sizeof(err)),
                     KVR_LUA_ERRRUN);
    ck_assert_ptr_nonnull(strstr(err, "on_response must be a function"));
    /* Bytecode is not accepted as source (it would bypass the compiler's checks). */
    ck_assert_int_eq(luafix_install(rt, "bc", "\x1bLJ\x02", 0, err, sizeof(err)),
                     KVR_LUA_ERRSYNTAX);
    ck_assert_int_eq(luafix_install(rt, "bad name", "return {}", 0, err, sizeof(err)),
                     KVR_LUA_INVALID);
    ck_assert_int_eq(luafix_install(rt, "", "return {}", 0, err, sizeof(err)), KVR_LUA_INVALID);
}
END_TEST

START_TEST(chunk_budget_and_memory)
{
    char err[4096];
    ck_assert_int_eq(luafix_install(rt, "loop", "while true do end", 0, err, sizeof(err)),
                     KVR_LUA_ETIMEDOUT);
    ck_assert_int_eq(luafix_install(rt, "bomb",
                                    "local t = {} for i = 1, 1e9 do t[i] = ('x'):rep(1e6 + i) end",
                                    0, err, sizeof(err)),
                     KVR_LUA_ERRMEM);
    /* Trusted code is validated interpreted too: a runaway is refused before it is trusted. */
    ck_assert_int_eq(luafix_install(rt, "tloop",
                                    "return { select = function(r, c) while true do end end }",
                                    KVR_LUA_TRUSTED, err, sizeof(err)),
                     KVR_LUA_ETIMEDOUT);
    ck_assert_ptr_nonnull(strstr(err, "synthetic decision 0"));
    ck_assert_int_eq(luafix_install(rt, "self",
                                    "return { select = function(r, c) return c[1] "
                                    "end, selftest = function() return false, 'nope' "
                                    "end }",
                                    0, err, sizeof(err)),
                     KVR_LUA_ERRRUN);
    ck_assert_ptr_nonnull(strstr(err, "selftest failed: nope"));
    ck_assert_int_eq(luafix_install(rt, "self2",
                                    "return { select = function(r, c) return c[1] end, "
                                    "selftest = function() error('broken') end }",
                                    0, err, sizeof(err)),
                     KVR_LUA_ERRRUN);
    ck_assert_ptr_nonnull(strstr(err, "selftest: self2.lua:1: broken"));
    /* An empty separator is refused at once (it used to loop, compiled, until the memory cap). */
    ck_assert_int_eq(luafix_install(rt, "split",
                                    "local t = kvr.split('a,b', '')\n"
                                    "return { select = function(r, c) return c[1] end }",
                                    0, err, sizeof(err)),
                     KVR_LUA_ERRRUN);
    ck_assert_msg(strstr(err, "split.lua:1: kvr.split: the separator must be a non-empty string"),
                  "%s", err);
    ck_assert_int_eq(luafix_install(rt, "split2",
                                    "assert(#kvr.split('a,b', ',') == 2)\n"
                                    "assert(not pcall(kvr.split, 'a', nil))\n"
                                    "return { select = function(r, c) return c[1] end }",
                                    0, err, sizeof(err)),
                     KVR_LUA_OK);
}
END_TEST

Suite *sandbox_suite(void)
{
    Suite *s = suite_create("sandbox");
    TCase *tc = tcase_create("api");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, escapes_refused_at_install);
    tcase_add_test(tc, escapes_fail_closed_at_request_time);
    tcase_add_test(tc, allowed_library_works);
    tcase_add_test(tc, chunk_errors_name_the_line);
    tcase_add_test(tc, chunk_budget_and_memory);
    suite_add_tcase(s, tc);
    return s;
}
