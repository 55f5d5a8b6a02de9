/* script.c - operator scripts: a Lua chunk with kvr.admin, run once in a scratch state.
 * SPDX-License-Identifier: Apache-2.0 */
#include <luajit.h>
#include <stdio.h>
#include <string.h>

#include "internal.h"
#include "kvr/err.h"

struct script_ctx {
    struct lstate *s;
    const char *src;
    size_t len;
    uint64_t budget_ns;
    char *out;
    size_t out_len;
    char *err;
    size_t err_len;
    int status;
};

static int script_cp(lua_State *L)
{
    struct script_ctx *c = lua_touserdata(L, 1);
    lua_settop(L, 0);
    lua_getfield(L, LUA_REGISTRYINDEX, "kvr.script");
    int rc = luaL_loadbufferx(L, c->src, c->len, "@script.lua", "t");
    if (rc != 0) {
        c->status = rc == LUA_ERRMEM ? KVR_LUA_ERRMEM : KVR_LUA_ERRSYNTAX;
        snprintf(c->err, c->err_len, "%s", lua_tostring(L, -1));
        lua_settop(L, 0);
        return 0;
    }
    luaJIT_setmode(L, -1, LUAJIT_MODE_ALLFUNC | LUAJIT_MODE_OFF);
    c->status = lstate_pcall(c->s, 1, 1, c->budget_ns, c->err, c->err_len);
    if (c->status == KVR_LUA_OK && c->out != NULL && c->out_len > 0) {
        const char *r = lua_tostring(L, -1);
        snprintf(c->out, c->out_len, "%s", r ? r : "");
    }
    lua_settop(L, 0);
    return 0;
}

static int register_script_fn(lua_State *L)
{
    /* state.c keeps kvr/policy.lua's table R in the registry as kvr.R. */
    lua_getfield(L, LUA_REGISTRYINDEX, "kvr.R");
    lua_getfield(L, -1, "script");
    lua_setfield(L, LUA_REGISTRYINDEX, "kvr.script");
    lua_settop(L, 0);
    return 0;
}

int kvr_lua_script_run(kvr_lua_runtime_t *rt, const char *src, size_t len, char *out,
                       size_t out_len, char *err, size_t err_len)
{
    char dummy[8];
    if (err == NULL || err_len == 0) {
        err = dummy;
        err_len = sizeof(dummy);
    }
    err[0] = '\0';
    if (out != NULL && out_len > 0)
        out[0] = '\0';
    if (src == NULL) {
        snprintf(err, err_len, "no script");
        return KVR_LUA_INVALID;
    }
    struct lstate *s = NULL;
    int st = lstate_new(rt, NULL, 1, rt->cfg.seed, &s, err, err_len);
    if (st != KVR_LUA_OK)
        return st;
    if (lua_cpcall(s->L, register_script_fn, NULL) != 0) {
        snprintf(err, err_len, "not enough memory");
        lstate_free(s);
        return KVR_LUA_ERRMEM;
    }
    struct script_ctx c = {s,   src,     len,       rt->cfg.script_budget_ns, out, out_len,
                           err, err_len, KVR_LUA_OK};
    if (lua_cpcall(s->L, script_cp, &c) != 0) {
        snprintf(err, err_len, "not enough memory");
        c.status = KVR_LUA_ERRMEM;
    }
    lstate_free(s);
    return c.status;
}
