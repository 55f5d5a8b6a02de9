-- kvr/policy.lua - the policy runtime glue: sandbox, request/candidate tables, decisions, hooks.
-- SPDX-License-Identifier: Apache-2.0
--
-- Trusted and JIT-compiled; loaded once per Lua state after kvr/core.lua, with (core, opts).
-- Returns the table R whose functions the C side calls (references resolved once, never by
-- name per request):
--   R.add_policy(slot, name, chunk, trusted)  run a compiled policy chunk in a fresh sandbox
--   R.decide()            select for call.slot over call.req / call.cands; writes call.out;
--                         returns n (>= 1) or 0, reason
--   R.respond()           on_response(req, worker, outcome) of call.slot
--   R.event()             the KV-event hook of call.slot for call.event; false if it has none
--   R.selftest(slot)      the policy's selftest(), if any
--   R.hooks(slot)         bit set: 1 on_response, 2 on_stored, 4 on_removed, 8 on_cleared, 16 selftest
--
-- Sandbox (style.md §7): each policy chunk runs under setfenv with its own environment proxy:
-- reads come from an allow-list (below), every write raises, and the libraries it sees are
-- read-only proxies of private copies. The string metatable's __index is replaced by the safe
-- string table and its __metatable hidden, so ("").x cannot reach the real string library.
-- Not available: io, os, debug, ffi, jit, package, load, loadstring, loadfile, dofile, module,
-- getfenv, setfenv, rawset, collectgarbage, coroutine, newproxy, gcinfo, string.dump and the
-- Lua pattern functions (string.match/gmatch/gsub, string.find without plain = true).
local core, opts = ...

local ffi = core.ffi
local call = core.call
local type, pairs, ipairs, tonumber, tostring, error = type, pairs, ipairs, tonumber, tostring,
    error
local rawget, rawset, setmetatable, getmetatable, setfenv = rawget, rawset, setmetatable,
    getmetatable, setfenv
local loadstring, concat = loadstring, table.concat
local jit_util = opts.jit_util
local ffi_string = ffi.string
local string_find = string.find

local R = {}

-- The watchdog (kvr/lua.h "Stuck calls") interrupts only machine code it knows: report every
-- compiled trace's code range to C (opts.note_trace is set only when a stop signal is
-- configured). jit.attach callbacks run when a trace is compiled or flushed, never per request.
if opts.note_trace ~= nil and jit ~= nil and jit_util ~= nil and jit_util.tracemc ~= nil then
    local note, tracemc = opts.note_trace, jit_util.tracemc
    jit.attach(function(what, tr)
        if what == "stop" then
            local mc, addr = tracemc(tr)
            if mc ~= nil and addr ~= nil then
                note(addr, #mc)
            end
        elseif what == "flush" then
            note(0, 0)
        end
    end, "trace")
end

-- ==== the sandbox ===========================================================================

math.randomseed(opts.seed or 1)
local random = math.random

local function copy(t, keys)
    local c = {}
    for _, k in ipairs(keys) do
        c[k] = t[k]
    end
    return c
end

local function readonly(t, name)
    return setmetatable({}, {
        __index = t,
        __newindex = function(_, k)
            error("attempt to modify read-only table '" .. name .. "' (field '" .. tostring(k)
                .. "')", 2)
        end,
        __metatable = false,
    })
end

-- __newindex of the runtime's request, candidate and outcome tables: a policy reads them, never
-- writes them (they are reused between requests, possibly of other policies: a write that
-- persisted would leak into the next request's inputs).
local function refuse_write(what)
    return function(_, k)
        error("attempt to modify the " .. what .. " (field '" .. tostring(k) .. "'): the runtime's"
            .. " request and candidate tables are read-only; keep per-request data in locals", 2)
    end
end

local MAGIC = "[%^%$%*%+%?%.%(%)%[%]%%%-]"
local safe_string = copy(string, { "byte", "char", "format", "len", "lower", "upper", "rep",
    "reverse", "sub" })
safe_string.find = function(s, pattern, init, plain)
    if not plain and type(pattern) == "string" and string_find(pattern, MAGIC) then
        error("string.find: Lua patterns are not available to policies (pass plain = true)", 2)
    end
    return string_find(s, pattern, init, true)
end
for _, k in ipairs({ "match", "gmatch", "gsub" }) do
    safe_string[k] = function()
        error("string." .. k .. ": Lua patterns are not available to policies", 2)
    end
end

local safe_math = copy(math, { "abs", "ceil", "cos", "deg", "exp", "floor", "fmod", "huge",
    "log", "log10", "max", "min", "modf", "pi", "pow", "rad", "random", "randomseed", "sin",
    "sqrt", "tan", "acos", "asin", "atan", "atan2", "cosh", "sinh", "tanh", "frexp", "ldexp" })
local safe_table = copy(table, { "concat", "insert", "remove", "sort", "maxn" })
-- table.insert / table.remove write raw (no __newindex): refuse them on the runtime's tables
-- (getmetatable answers their __metatable, a "kvr ..." string). table.sort only permutes the
-- candidates array, which the next request refills.
local RUNTIME_TABLES = { ["kvr request"] = true, ["kvr candidate"] = true,
    ["kvr candidates"] = true, ["kvr outcome"] = true }
for _, k in ipairs({ "insert", "remove" }) do
    local f = table[k]
    safe_table[k] = function(t, ...)
        if RUNTIME_TABLES[getmetatable(t)] then
            error("table." .. k .. ": the runtime's request and candidate tables are read-only"
                .. " (copy the candidates into a table of your own)", 2)
        end
        return f(t, ...)
    end
end
local safe_bit = copy(bit, { "tobit", "tohex", "bnot", "band", "bor", "bxor",
    "lshift", "rshift", "arshift", "rol", "ror", "bswap" })

local ro_string = readonly(safe_string, "string")
local ro_math = readonly(safe_math, "math")
local ro_table = readonly(safe_table, "table")
local ro_bit = readonly(safe_bit, "bit")

-- Strings: method calls ("x"):upper() resolve through the string metatable; point it at the safe
-- table and hide the metatable from getmetatable.
do
    local smt = getmetatable("")
    smt.__index = safe_string
    smt.__metatable = false
end

-- The base functions a policy may call.
local BASE = { "assert", "error", "ipairs", "next", "pairs", "pcall", "xpcall", "select",
    "tonumber", "tostring", "type", "unpack", "rawequal", "rawget", "setmetatable",
    "getmetatable", "_VERSION" }

-- xpcall whose handler runs after the error has unwound, like pcall followed by a call: LuaJIT
-- runs a handler at the point of the error, and for the time-budget error that point is inside
-- the count hook, where no hook fires; a handler that loops would then never be stopped.
local raw_pcall = pcall
local function xpcall_finish(h, ok, ...)
    if ok then
        return true, ...
    end
    local _, v = raw_pcall(h, (...))
    return false, v
end
local function safe_xpcall(f, h, ...)
    return xpcall_finish(h, raw_pcall(f, ...))
end

local function new_env(name, K)
    local kvr = readonly(K, "kvr")
    local allowed = copy(_G, BASE)
    allowed.xpcall = safe_xpcall
    allowed.string, allowed.math, allowed.table, allowed.bit = ro_string, ro_math, ro_table,
        ro_bit
    allowed.kvr = kvr
    allowed.print = function(...)
        core.log_line(2, ...)
    end
    allowed.require = function(mod)
        if mod == "kvr" or mod == "kvr.core" then
            return kvr
        end
        error("module '" .. tostring(mod) .. "' is not available to policies", 2)
    end
    local env = setmetatable({}, {
        __index = allowed,
        __newindex = function(_, k)
            error("assignment to global '" .. tostring(k) .. "' (policies may not write globals;"
                .. " use local)", 2)
        end,
        __metatable = false,
    })
    allowed._G = env
    return env
end

-- ==== request and candidate tables (reused between requests; no allocation per request) ====
--
-- One `req` table, a pool of candidate tables and the `cands` array, per state, reused for every
-- request of every policy of the state. They are read-only to policies (__newindex raises, and
-- table.insert/remove refuse them): a write could otherwise survive into the next request, which
-- may be another tenant's. The fields the glue stores are rewritten by every fill; the lazily
-- materialised string fields are put on the `lazy` list before they are stored and cleared before
-- the next request; a candidate's position lives in `pos`, which no policy can reach. The glue
-- writes keys that may be absent with rawset (an ordinary store would hit __newindex).
--
-- Allocation: none per decision once warm. The C side copies the request's scalars into `call`
-- (numbers, no cdata), the ranked output goes to a buffer inside `call` addressed through a
-- reference taken once (`ranked`), and candidate structs are read only inside the compiled fill
-- loop (a cdata pointer held in a Lua slot across a trace exit, or read by the interpreter, is
-- boxed: 24 bytes of garbage each time).

local req = {}
local pool = {}  -- pool[i]: the i-th candidate table, forever
local pos = {}   -- pos[candidate table] = i (runtime-private: policies never see this table)
local cands = {} -- the array handed to select (cands[i] = pool[i], rewritten every request)
local last_n = 0
local lazy = {} -- tables whose lazy string fields were materialised
local n_lazy = 0
local ranked = call.ranked -- uint32_t[KVR_FFI_RANKED_MAX]: chosen indices, best first

-- The glue must stay consistent if an error (the time-budget hook fires between any two
-- instructions once a call is over budget) interrupts it anywhere: every multi-step update below
-- is ordered so that a half-done one is harmless or redone by the next call.
local function remember(t)
    lazy[n_lazy + 1] = t
    n_lazy = n_lazy + 1
end

local req_mt = {
    __index = function(t, k)
        local r = call.req
        if r == nil then -- outside a call (a table kept in kvr.state): nothing to read
            return nil
        end
        local v
        if k == "model" then
            v = r.model ~= nil and ffi_string(r.model, r.model_len) or ""
        elseif k == "session" then
            v = r.session ~= nil and ffi_string(r.session, r.session_len) or nil
        elseif k == "lora" then
            v = r.lora ~= nil and ffi_string(r.lora, r.lora_len) or nil
        elseif k == "headers" then
            v = {}
            for i = 0, r.n_headers - 1 do
                local h = r.headers[i]
                v[ffi_string(h.name, h.name_len)] = ffi_string(h.value, h.value_len)
            end
        elseif k == "id" then
            v = core.u64_string(r.request_id)
        else
            return nil
        end
        remember(t) -- before the store: a materialised field is always on the clearing list
        rawset(t, k, v)
        return v
    end,
    __newindex = refuse_write("request table"),
    __metatable = "kvr request",
}
setmetatable(req, req_mt)
setmetatable(cands, { __newindex = refuse_write("candidates array"),
    __metatable = "kvr candidates" })

-- Candidate fields. The glue copies into each candidate table only the fields some policy of
-- this state names as a constant in its bytecode (the "fill set", found with jit.util.funck),
-- with straight-line code generated once per state: a policy reading 5 fields pays for 5
-- stores per candidate, not 14. Any other field is read lazily from the C struct by the
-- metatable (never stored, so never stale): a policy reading fields by computed names stays
-- correct, only slower.
local FIELDS = { "id", "dp_rank", "healthy", "overlap", "overlap_host", "overlap_disk",
    "tree_blocks", "prefill_tokens", "decode_blocks", "new_blocks", "requests", "queue",
    "kv_usage", "weight" }
-- Every store is a rawset: a policy may have set a field to nil (an existing key: no
-- __newindex), and the next fill must still be able to write it.
local FILL = {
    id = "rawset(t, 'id', tonumber(c.worker_id))",
    healthy = "rawset(t, 'healthy', c.healthy ~= 0)",
    kv_usage = "local kv = c.kv_usage rawset(t, 'kv_usage', kv >= 0 and kv or nil)",
}
local LAZY = {
    id = function(c) return tonumber(c.worker_id) end,
    healthy = function(c) return c.healthy ~= 0 end,
    kv_usage = function(c)
        local kv = c.kv_usage
        return kv >= 0 and kv or nil
    end,
}
for _, f in ipairs(FIELDS) do
    FILL[f] = FILL[f] or ("rawset(t, '" .. f .. "', c." .. f .. ")")
    LAZY[f] = LAZY[f] or function(c) return c[f] end
end
-- Fields the kvr helpers read on the candidates a policy hands them.
local HELPER_FIELDS = {
    classic_cost = { "overlap", "prefill_tokens", "new_blocks", "decode_blocks" },
    classic_costs = { "overlap", "prefill_tokens", "new_blocks", "decode_blocks", "tree_blocks" },
    classic_argmin = { "overlap", "prefill_tokens", "new_blocks", "decode_blocks", "tree_blocks" },
    rendezvous = { "healthy", "id", "dp_rank" },
    load = { "id", "dp_rank" },
}

local fill_set = {} -- field -> true
local fill_fn       -- generated by make_fill

local cand_mt = {
    __index = function(t, k)
        local i = pos[t]
        if i == nil or i < 1 or i > call.n or call.cands == nil then
            return nil -- not a pooled table of this request (kept from an earlier one)
        end
        if k == "index" then
            return i
        end
        local c = call.cands[i - 1]
        local lazy_field = LAZY[k]
        if lazy_field ~= nil then
            return lazy_field(c)
        end
        local v
        if k == "url" then
            v = c.url ~= nil and ffi_string(c.url, c.url_len) or nil
        elseif k == "labels" then
            v = c.labels ~= nil and ffi_string(c.labels, c.labels_len) or ""
        elseif k == "key" then
            v = core.rank_key(c.worker_id, c.dp_rank)
        else
            return nil
        end
        remember(t)
        rawset(t, k, v)
        return v
    end,
    __newindex = refuse_write("candidate table"),
    __metatable = "kvr candidate",
}

local function pool_grow(n)
    for i = #pool + 1, n do
        local t = {}
        for f in pairs(fill_set) do
            t[f] = 0 -- a value of the type the fill stores: the compiled fill's guards hold
        end
        if fill_set.healthy then
            t.healthy = true
        end
        t = setmetatable(t, cand_mt)
        pos[t] = i -- before pool[i]: every pooled table is always known to pos
        pool[i] = t
    end
end

-- The fill loop reads the candidate structs inside the loop (call.cands is loop-invariant: the
-- compiled trace loads it once) so no cdata pointer lives in a Lua slot across trace exits.
local function make_fill()
    local src = { "local pool, cands, call, rawset, tonumber = ...", "return function(n)",
        "  for i = 0, n - 1 do", "    local c, t = call.cands[i], pool[i + 1]" }
    for _, f in ipairs(FIELDS) do
        if fill_set[f] then
            src[#src + 1] = "    " .. FILL[f]
        end
    end
    src[#src + 1] = "    rawset(cands, i + 1, t)"
    src[#src + 1] = "  end"
    src[#src + 1] = "end"
    fill_fn = assert(loadstring(concat(src, "\n"), "=kvr/fill"))(pool, cands, call, rawset,
        tonumber)
end

-- Adds to the fill set the candidate fields a policy chunk names (every string constant of
-- every function of the chunk, recursively).
local function scan_fields(f)
    if jit_util == nil then -- cannot inspect: fill everything
        for _, name in ipairs(FIELDS) do
            fill_set[name] = true
        end
        return
    end
    local i = -1
    while true do
        local k = jit_util.funck(f, i)
        if k == nil then
            break
        end
        local tk = type(k)
        if tk == "string" then
            if LAZY[k] ~= nil then
                fill_set[k] = true
            end
            local extra = HELPER_FIELDS[k]
            if extra ~= nil then
                for _, name in ipairs(extra) do
                    fill_set[name] = true
                end
            end
        elseif tk == "proto" or tk == "function" then
            scan_fields(k)
        end
        i = i - 1
    end
end

local function clear_lazy()
    for i = 1, n_lazy do -- idempotent: an interrupted pass is simply redone
        local t = lazy[i]
        if t == req then
            rawset(t, "model", nil)
            rawset(t, "session", nil)
            rawset(t, "lora", nil)
            rawset(t, "headers", nil)
            rawset(t, "id", nil)
        elseif t ~= nil then
            rawset(t, "url", nil)
            rawset(t, "labels", nil)
            rawset(t, "key", nil)
        end
    end
    for i = n_lazy, 1, -1 do
        lazy[i] = nil
    end
    n_lazy = 0
end

-- The request's numbers, from the copies C made in `call` (no cdata pointer is touched).
local function fill_req()
    local c = call
    rawset(req, "tokens", c.tokens)
    rawset(req, "blocks", c.blocks)
    rawset(req, "block_size", c.block_size)
    rawset(req, "priority", c.priority)
    local w, t = c.overlap_weight, c.temperature
    rawset(req, "overlap_weight", w >= 0 and w or nil)
    rawset(req, "temperature", t >= 0 and t or nil)
end

-- cands[1..n] = pool[1..n] with the fill-set fields of the current structs; cands[n+1..] = nil.
local function fill_cands(n)
    if n > #pool then
        pool_grow(n)
    end
    if fill_fn == nil then -- once per state, after its policies are loaded
        make_fill()
    end
    fill_fn(n)
    if last_n > n or rawget(cands, n + 1) ~= nil then
        local i = n + 1
        while rawget(cands, i) ~= nil do
            rawset(cands, i, nil)
            i = i + 1
        end
    end
    last_n = n
end

-- ==== helpers that need the candidate machinery ==============================================

local api = core.api
local hbuf = ffi.new("uint64_t[3]")

-- Rendezvous (highest-random-weight) hashing: the candidate of `list` with the largest
-- xxh3(xxh3(key), worker_id, dp_rank); with healthy_only, unhealthy ones are skipped (nil if
-- none is left). Exact for any u64 worker id; O(#list).
local function rendezvous(key, list, healthy_only)
    if type(key) ~= "string" then
        error("kvr.rendezvous: the key must be a string", 2)
    end
    if type(list) ~= "table" then
        error("kvr.rendezvous: expected an array of candidates", 2)
    end
    hbuf[0] = api.hash(key, #key, 0)
    local cs, n = call.cands, call.n
    local best, best_h = nil, nil
    for i = 1, #list do
        local c = list[i]
        if not healthy_only or c.healthy then
            local j = pos[c]
            if j ~= nil and cs ~= nil and j <= n then
                local r = cs[j - 1]
                hbuf[1], hbuf[2] = r.worker_id, r.dp_rank
            else -- a plain table (e.g. in a selftest)
                hbuf[1], hbuf[2] = c.id or 0, c.dp_rank or 0
            end
            local h = api.hash(hbuf, 24, 0x6b7672)
            if best_h == nil or h > best_h then
                best, best_h = c, h
            end
        end
    end
    return best
end

-- ==== policies ===============================================================================

local policies = {} -- slot -> { name, select, hooks..., K }

local HOOKS = { on_response = 1, on_stored = 2, on_removed = 4, on_cleared = 8, selftest = 16 }

function R.add_policy(slot, name, chunk, trusted)
    local K = core.new_api(name, random)
    K.rendezvous = rendezvous
    scan_fields(chunk)
    for i = #pool, 1, -1 do -- tables made for an older fill set: start afresh
        pos[pool[i]] = nil
        pool[i] = nil
    end
    for i = last_n, 1, -1 do
        rawset(cands, i, nil)
    end
    last_n = 0
    fill_fn = nil -- regenerated for the new fill set by the next fill
    setfenv(chunk, new_env(name, K))
    local p = chunk(name)
    if type(p) ~= "table" then
        error(name .. ": the policy chunk must return a table with a select function (got "
            .. type(p) .. ")", 0)
    end
    if type(rawget(p, "select")) ~= "function" then
        error(name .. ": the returned table has no select(req, candidates) function", 0)
    end
    local entry = { name = name, select = rawget(p, "select"), trusted = trusted, hooks = 0 }
    for hook, bitv in pairs(HOOKS) do
        local f = rawget(p, hook)
        if f ~= nil then
            if type(f) ~= "function" then
                error(name .. ": " .. hook .. " must be a function (got " .. type(f) .. ")", 0)
            end
            entry[hook] = f
            entry.hooks = entry.hooks + bitv
        end
    end
    policies[slot] = entry
    return entry.hooks
end

function R.hooks(slot)
    local p = policies[slot]
    return p and p.hooks or 0
end

local seen = {}
local stamp = 0

-- Validates select's result and writes the chosen indices (0-based) to `ranked`; returns their
-- count, or 0 and the reason.
local function write_choice(choice, n)
    if type(choice) ~= "table" then
        return 0, "select returned " .. (choice == nil and "nothing" or "a " .. type(choice))
            .. " (expected a candidate or an array of candidates)"
    end
    local i = pos[choice]
    if i ~= nil then
        if i > n then
            return 0, "select returned a candidate of an earlier request"
        end
        ranked[0] = i - 1
        return 1
    end
    local m = #choice
    if m == 0 then
        return 0, "select returned a table that is neither a candidate nor a non-empty array"
    end
    local cap = call.out_cap
    if m > cap then
        m = cap
    end
    stamp = stamp + 1
    for k = 1, m do
        local e = rawget(choice, k)
        local j = e ~= nil and pos[e] or nil
        if j == nil or j > n then
            return 0, "element " .. k .. " of the returned list is not a candidate"
        end
        if seen[j] == stamp then
            return 0, "element " .. k .. " of the returned list repeats a candidate"
        end
        seen[j] = stamp
        ranked[k - 1] = j - 1
    end
    return m
end

function R.decide()
    local n = call.n
    if n_lazy > 0 then
        clear_lazy()
    end
    fill_req()
    fill_cands(n)
    return write_choice(policies[call.slot].select(req, cands), n)
end

local outcome = setmetatable({}, { __newindex = refuse_write("outcome table"),
    __metatable = "kvr outcome" })

function R.respond()
    local p = policies[call.slot]
    local f = p and p.on_response
    if f == nil then
        return false
    end
    if n_lazy > 0 then
        clear_lazy()
    end
    fill_req()
    fill_cands(1)
    local o = call.outcome
    rawset(outcome, "status", o.status)
    rawset(outcome, "ok", o.status >= 200 and o.status < 300)
    rawset(outcome, "ttft_ms", o.ttft_ms >= 0 and o.ttft_ms or nil)
    rawset(outcome, "latency_ms", o.latency_ms >= 0 and o.latency_ms or nil)
    rawset(outcome, "output_tokens", o.output_tokens)
    rawset(outcome, "error", o.error ~= nil and ffi_string(o.error, o.error_len) or nil)
    f(req, pool[1], outcome)
    return true
end

local TIERS = { [0] = "device", "host_pinned", "disk", "external" }
local KINDS = { "stored", "removed", "cleared" }

local event_mt = {
    __index = function(t, k)
        local e = call.event
        if e == nil then
            return nil
        end
        local v
        if k == "block_hashes" or k == "tokens_hashes" then
            v = {}
            if e.kind == 1 then
                local field = k == "block_hashes" and "block_hash" or "tokens_hash"
                for i = 0, e.n - 1 do
                    v[i + 1] = core.u64_string(e.blocks[i][field])
                end
            elseif e.kind == 2 and k == "block_hashes" then
                for i = 0, e.n - 1 do
                    v[i + 1] = core.u64_string(e.hashes[i])
                end
            end
        elseif k == "parent_hash" then
            v = (e.kind == 1 and e.has_parent ~= 0) and core.u64_string(e.parent_hash) or nil
        elseif k == "key" then
            v = core.rank_key(e.worker_id, e.dp_rank)
        else
            return nil
        end
        rawset(t, k, v)
        return v
    end,
    __metatable = "kvr event",
}

function R.event()
    local e = call.event
    local kind = KINDS[e.kind]
    local p = policies[call.slot]
    local f = kind and p and p["on_" .. kind]
    if f == nil then
        return false
    end
    f(setmetatable({ kind = kind, id = tonumber(e.worker_id), dp_rank = e.dp_rank,
        tier = TIERS[e.tier] or "device", n = e.n }, event_mt))
    return true
end

-- Operator scripts (kvr_lua_script_run): the chunk runs in the same sandbox, with kvr.admin.
function R.script(chunk)
    local K = core.new_api("script", random)
    K.rendezvous = rendezvous
    setfenv(chunk, new_env("script", K))
    local r = chunk()
    if r == nil then
        return ""
    end
    return tostring(r)
end

function R.selftest(slot)
    local p = policies[slot]
    local f = p and p.selftest
    if f == nil then
        return true
    end
    local ok, msg = f()
    if ok == false then
        error("selftest failed" .. (msg ~= nil and ": " .. tostring(msg) or ""), 0)
    end
    return true
end

return R
