/* sandbox.c - the libraries a policy state opens (and the ones it never does).
 * SPDX-License-Identifier: Apache-2.0
 *
 * A policy state opens only: base, table, string, math, bit, jit (the JIT engine is switched on
 * by luaopen_jit; the `jit` global is removed again once the trusted modules are loaded) and
 * ffi (kept in the registry for kvr/core.lua, never a global). Not opened at all: io, os, debug,
 * package. The per-policy environment (the allow-list) is built in Lua by kvr/policy.lua; the
 * trusted globals policies could misuse (load*, dofile, require, module, getfenv, setfenv,
 * collectgarbage, newproxy, gcinfo) are removed from the state's globals after setup (state.c).
 */
#include <lualib.h>

#include "internal.h"

static void open_lib(lua_State *L, const char *name, lua_CFunction fn)
{
    lua_pushcfunction(L, fn);
    lua_pushstring(L, name);
    lua_call(L, 1, 1);
}

int sandbox_open_libs(lua_State *L)
{
    open_lib(L, "", luaopen_base);
    open_lib(L, LUA_TABLIBNAME, luaopen_table);
    open_lib(L, LUA_STRLIBNAME, luaopen_string);
    open_lib(L, LUA_MATHLIBNAME, luaopen_math);
    open_lib(L, LUA_BITLIBNAME, luaopen_bit);
    open_lib(L, LUA_JITLIBNAME, luaopen_jit);
    open_lib(L, LUA_FFILIBNAME, luaopen_ffi);
    lua_setfield(L, LUA_REGISTRYINDEX, "kvr.ffi"); /* the ffi module, for kvr/core.lua only */
    lua_pushnil(L);
    lua_setfield(L, LUA_GLOBALSINDEX, LUA_FFILIBNAME);
    lua_settop(L, 0);
    return 0;
}
