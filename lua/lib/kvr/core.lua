-- kvr/core.lua - the kvr module: FFI declarations and wrappers over the kvr_ffi_* ABI.
-- SPDX-License-Identifier: Apache-2.0
--
-- Trusted runtime code (it sees `ffi`; policies never do). Loaded once per Lua state by the C
-- runtime (lua/src/state.c) with:
--   ffi      the FFI module
--   api_p    lightuserdata: const struct kvr_ffi_api *  (function table, kvr/ffi.h)
--   vm_p     lightuserdata: kvr_ffi_vm_t *              (opaque, passed back to every call)
--   call_p   lightuserdata: struct kvr_ffi_call *       (the current request, written by C)
--   cdef     the macro-free block of kvr/ffi.h (copied by the build)
--   opts     { admin = bool, block_size = n, version = "..." }
-- Returns the core table M; kvr/policy.lua builds each policy's `kvr` table with M.new_api.
-- Conventions (style.md §4): misuse raises error(msg, 2); a runtime failure returns nil, err.
-- No cdata ever reaches a policy: every result is converted to Lua numbers, strings, tables.
local ffi, api_p, vm_p, call_p, cdef, opts = ...

ffi.cdef(cdef)

local C_ABI = 2
local api = ffi.cast("const struct kvr_ffi_api *", api_p)
if api.abi ~= C_ABI or api.size ~= ffi.sizeof("struct kvr_ffi_api") then
    error("kvr.core: FFI ABI mismatch (C " .. tonumber(api.abi) .. ", Lua " .. C_ABI .. ")")
end
local vm = ffi.cast("kvr_ffi_vm_t *", vm_p)
local call = ffi.cast("struct kvr_ffi_call *", call_p)

local bit = bit
local type, tostring, tonumber, error, select = type, tostring, tonumber, error, select
local rawget, rawset = rawget, rawset
local floor, huge, exp, abs = math.floor, math.huge, math.exp, math.abs
local concat = table.concat
local string_sub, string_find, string_format = string.sub, string.find, string.format
local ffi_string, ffi_new, ffi_cast = ffi.string, ffi.new, ffi.cast
local rshift = bit.rshift

local KVR_OK, KVR_ERANGE, KVR_ENOTFOUND, KVR_ETIMEDOUT = 0, -8, -3, -7

local M = {
    ffi = ffi,
    api = api,
    vm = vm,
    call = call,
    version = opts.version or "kvrouter",
    abi = C_ABI,
}

-- ==== scratch buffers (allocated once per state; counted by the state's allocator) ==========

local n_out = ffi_new("size_t[1]")
local errp = ffi_new("const char *[1]")
local u64buf = ffi_new("char[24]")
local u64tmp = ffi_new("uint64_t[1]")
local match_cap = 64
local matches = ffi_new("struct kvr_ffi_match[?]", match_cap)
local tok_cap, toks = 0, nil
local hash_cap, hashes = 0, nil
local stats_buf = ffi_new("struct kvr_ffi_index_stats")
local load_buf = ffi_new("struct kvr_ffi_load")

local function errtext(rc)
    if errp[0] ~= nil then
        return ffi_string(errp[0])
    end
    return "error " .. tostring(rc)
end

-- Decimal text of a uint64 cdata (exact).
local function u64_string(v)
    local n = api.u64_format(v, u64buf)
    return ffi_string(u64buf, n)
end
M.u64_string = u64_string

-- "worker_id:dp_rank", exact for any u64 id: the key policies use in maps.
local function rank_key(worker_id, dp_rank)
    return u64_string(worker_id) .. ":" .. tonumber(dp_rank)
end
M.rank_key = rank_key

-- One engine query into the match scratch (grown once on KVR_ERANGE, then retried with the new
-- buffer) returning a map key -> blocks, or nil, err. kind: "index" (locals, n), "tokens"
-- (tokens, n, block_size, lora), "lanes" (locals, n).
local function query(kind, a, n, bs, lora)
    for _ = 1, 2 do
        errp[0] = nil
        local rc
        if kind == "index" then
            rc = api.index_match(vm, a, n, matches, match_cap, n_out, errp)
        elseif kind == "tokens" then
            rc = api.index_match_tokens(vm, a, n, bs, lora, lora and #lora or 0, matches,
                match_cap, n_out, errp)
        else
            rc = api.lanes_match(vm, a, n, matches, match_cap, n_out, errp)
        end
        if rc == KVR_OK then
            local res = {}
            for i = 0, tonumber(n_out[0]) - 1 do
                local m = matches[i]
                res[rank_key(m.worker_id, m.dp_rank)] = tonumber(m.blocks)
            end
            return res
        elseif rc == KVR_ERANGE then
            -- Buffer first, capacity second: an error (memory, or the time-budget hook, which
            -- may fire between any two instructions) never leaves a capacity above the buffer.
            local cap = tonumber(n_out[0]) + 16
            matches = ffi_new("struct kvr_ffi_match[?]", cap)
            match_cap = cap
        elseif rc == KVR_ETIMEDOUT then
            error("kvr: time budget exceeded", 0)
        else
            return nil, errtext(rc)
        end
    end
    return nil, "result did not fit"
end

local function parse_u64(v, what)
    local tv = type(v)
    if tv == "number" then
        if v < 0 or v ~= floor(v) or v >= 9007199254740992 then
            error(what .. ": numbers must be integers in [0, 2^53) (use decimal strings)", 3)
        end
        return v
    elseif tv == "string" then
        if api.u64_parse(v, #v, u64tmp) ~= KVR_OK then
            error(what .. ": '" .. v .. "' is not an unsigned 64-bit integer", 3)
        end
        return u64tmp[0]
    end
    error(what .. ": expected a number or a decimal string, got " .. tv, 3)
end

-- ==== request-scoped engine queries =========================================================

-- Overlap of the current request's (first n) blocks in the radix index: { ["id:rank"] = blocks }.
function M.overlap_request(nblocks)
    local r = call.req
    if r == nil then
        return nil, "no current request"
    end
    local n = r.blocks
    if nblocks ~= nil then
        if type(nblocks) ~= "number" or nblocks < 0 then
            error("kvr.overlap: block count must be a non-negative number", 3)
        end
        if nblocks < n then
            n = floor(nblocks)
        end
    end
    return query("index", r.local_hashes, n)
end

function M.overlap_hashes(list)
    if type(list) ~= "table" then
        error("kvr.overlap_hashes: expected an array of block hashes", 2)
    end
    local n = #list
    if n > hash_cap then
        hashes = ffi_new("uint64_t[?]", n + 16) -- buffer first, capacity second
        hash_cap = n + 16
    end
    for i = 1, n do
        hashes[i - 1] = parse_u64(list[i], "kvr.overlap_hashes")
    end
    return query("index", hashes, n)
end

function M.overlap_tokens(list, lora, block_size)
    if type(list) ~= "table" then
        error("kvr.overlap_tokens: expected an array of token ids", 2)
    end
    if lora ~= nil and type(lora) ~= "string" then
        error("kvr.overlap_tokens: lora must be a string", 2)
    end
    local n = #list
    if n > tok_cap then
        toks = ffi_new("uint32_t[?]", n + 64) -- buffer first, capacity second
        tok_cap = n + 64
    end
    for i = 1, n do
        local t = list[i]
        if type(t) ~= "number" or t < 0 or t > 4294967295 or t ~= floor(t) then
            error("kvr.overlap_tokens: token " .. i .. " is not a u32", 2)
        end
        toks[i - 1] = t
    end
    return query("tokens", toks, n, block_size or 0, lora)
end

function M.lanes_request()
    local r = call.req
    if r == nil then
        return nil, "no current request"
    end
    return query("lanes", r.local_hashes, r.blocks)
end

function M.index_stats()
    errp[0] = nil
    local rc = api.index_stats(vm, stats_buf, errp)
    if rc == KVR_ETIMEDOUT then
        error("kvr: time budget exceeded", 0)
    elseif rc ~= KVR_OK then
        return nil, errtext(rc)
    end
    local s = stats_buf
    return {
        nodes = tonumber(s.nodes), blocks = tonumber(s.blocks),
        block_ranks = tonumber(s.block_ranks), ranks = tonumber(s.ranks),
        bytes = tonumber(s.bytes), events_stored = tonumber(s.events_stored),
        events_removed = tonumber(s.events_removed), events_cleared = tonumber(s.events_cleared),
        queries = tonumber(s.queries),
    }
end

function M.load(worker_id, dp_rank)
    local id = parse_u64(worker_id, "kvr.load")
    if dp_rank ~= nil and (type(dp_rank) ~= "number" or dp_rank < 0) then
        error("kvr.load: dp_rank must be a non-negative number", 3)
    end
    errp[0] = nil
    local rc = api.load_get(vm, id, dp_rank or 0, load_buf, errp)
    if rc == KVR_ETIMEDOUT then
        error("kvr: time budget exceeded", 0)
    elseif rc ~= KVR_OK then
        return nil, errtext(rc)
    end
    return {
        prefill_tokens = tonumber(load_buf.prefill_tokens),
        decode_blocks = tonumber(load_buf.active_blocks),
        requests = tonumber(load_buf.requests),
    }
end

-- ==== pure helpers ==========================================================================

-- XXH3-64 of a string, reduced to an integer in [0, 2^53) (exact as a Lua number).
function M.hash(s, seed)
    if type(s) ~= "string" then
        s = tostring(s)
    end
    local h = api.hash(s, #s, seed or 0)
    return tonumber(rshift(h, 11))
end

-- The full 64-bit hash as a decimal string.
function M.hash64(s, seed)
    if type(s) ~= "string" then
        s = tostring(s)
    end
    return u64_string(api.hash(s, #s, seed or 0))
end

function M.now()
    return api.now()
end

-- Softmax over costs (lower is better), scheduling.md §5 exactly; returns a 1-based index.
-- temperature <= 0 -> argmin (first minimum). u: optional uniform draw in [0, 1).
function M.softmax_pick(costs, temperature, u, random)
    local n = #costs
    if n == 0 then
        error("kvr.softmax_pick: empty cost list", 2)
    end
    local lo, hi, lo_i = costs[1], costs[1], 1
    for i = 2, n do
        local c = costs[i]
        if c < lo then
            lo, lo_i = c, i
        end
        if c > hi then
            hi = c
        end
    end
    if temperature == nil or temperature <= 0 then
        return lo_i
    end
    u = u or random()
    if hi == lo then
        local i = floor(u * n) + 1
        return i <= n and i or n
    end
    local scale = 1
    if hi - lo == huge then
        scale = abs(lo) > abs(hi) and abs(lo) or abs(hi)
        lo, hi = lo / scale, hi / scale
    end
    local range, sum = (hi - lo) * temperature, 0
    for i = 1, n do
        sum = sum + exp(-(costs[i] / scale - lo) / range)
    end
    local cum = 0
    for i = 1, n do
        cum = cum + exp(-(costs[i] / scale - lo) / range) / sum
        if cum >= u then
            return i
        end
    end
    return n
end

-- Index of the smallest value; ties -> smaller tiebreak[i] (if given), then the lower index.
function M.argmin(values, tiebreak)
    local n = #values
    if n == 0 then
        return nil
    end
    local best, bv = 1, values[1]
    local bt = tiebreak and tiebreak[1] or 0
    for i = 2, n do
        local v = values[i]
        if v < bv then
            best, bv = i, v
            bt = tiebreak and tiebreak[i] or 0
        elseif v == bv and tiebreak and tiebreak[i] < bt then
            best, bt = i, tiebreak[i]
        end
    end
    return best
end

-- The classic KV cost of one candidate (scheduling.md §3), same operation order as the C
-- fallback (lua/src/fallback.c).
local function classic_cost(req, c, weight)
    local bs = req.block_size
    local prefill = req.tokens - c.overlap * bs
    if prefill < 0 then
        prefill = 0
    end
    prefill = prefill + c.prefill_tokens
    return weight * (prefill / bs) + (c.new_blocks + c.decode_blocks)
end
M.classic_cost = classic_cost

-- The classic cost of every candidate of `list` into costs[1..n] and, when `trees` is given, each
-- candidate's tree_blocks into trees[1..n] (n = #list); entries of both beyond n are cleared, so
-- the arrays can be reused from request to request. This is runtime code (JIT-compiled): a
-- sandboxed policy, interpreted, gets the O(n) part at compiled speed. The loop is bounded by
-- #list; the stores are raw (no policy metamethod runs from here). Each cost is classic_cost's
-- (inlined by the JIT).
function M.classic_costs(req, list, weight, costs, trees)
    local n = #list
    local tr = trees or costs -- without trees, the second store below is overwritten at once
    for i = 1, n do
        local c = list[i]
        rawset(tr, i, c.tree_blocks)
        rawset(costs, i, classic_cost(req, c, weight))
    end
    local i = n + 1
    while rawget(costs, i) ~= nil do
        rawset(costs, i, nil)
        i = i + 1
    end
    i = n + 1
    while trees ~= nil and rawget(trees, i) ~= nil do
        rawset(trees, i, nil)
        i = i + 1
    end
    return n
end

-- The index of the candidate of `list` with the lowest classic cost; ties: fewer tree_blocks, then
-- the earlier one (the C fallback's rule). One compiled pass, nothing stored (runtime code, like
-- classic_costs). nil for an empty list.
function M.classic_argmin(req, list, weight)
    local best, best_cost, best_tree = nil, huge, huge
    for i = 1, #list do
        local c = list[i]
        local cost = classic_cost(req, c, weight)
        if cost < best_cost or (cost == best_cost and c.tree_blocks < best_tree) then
            best, best_cost, best_tree = i, cost, c.tree_blocks
        end
    end
    return best
end

-- Splits s on a plain separator (no patterns). The separator must be a non-empty string: an
-- empty one would match everywhere without advancing (this loop runs compiled, where no time
-- budget can stop it).
function M.split(s, sep)
    if type(sep) ~= "string" or sep == "" then
        error("kvr.split: the separator must be a non-empty string", 2)
    end
    local out, i, n = {}, 1, 0
    if s == nil or s == "" then
        return out
    end
    while true do
        local a, b = string_find(s, sep, i, true)
        n = n + 1
        if not a then
            out[n] = string_sub(s, i)
            return out
        end
        out[n] = string_sub(s, i, a - 1)
        i = b + 1
    end
end

-- Value of a "k=v,k=v" label on a candidate, or nil.
function M.label(c, key)
    local labels = c.labels
    if labels == nil or labels == "" then
        return nil
    end
    local items = M.split(labels, ",")
    for i = 1, #items do
        local kv = items[i]
        local eq = string_find(kv, "=", 1, true)
        if eq then
            if string_sub(kv, 1, eq - 1) == key then
                return string_sub(kv, eq + 1)
            end
        elseif kv == key then
            return ""
        end
    end
    return nil
end

-- ==== per-policy API tables =================================================================

local LEVELS = { error = 0, warn = 1, info = 2, debug = 3 }

local function log_line(level, ...)
    local n = select("#", ...)
    local parts = {}
    for i = 1, n do
        parts[i] = tostring((select(i, ...)))
    end
    local msg = concat(parts, " ")
    api.log(vm, level, msg, #msg)
end
M.log_line = log_line

-- Builds the (unfrozen) kvr table of one policy. `random` is the state's math.random.
function M.new_api(name, random)
    local K = {
        version = M.version,
        abi = M.abi,
        name = name,
        state = {},
    }
    local counter_ids = {}
    K.now = M.now
    K.hash = M.hash
    K.hash64 = M.hash64
    K.split = M.split
    K.label = M.label
    K.argmin = M.argmin
    K.classic_cost = function(req, c, weight)
        return M.classic_cost(req, c, weight or 1.0)
    end
    K.classic_argmin = function(req, list, weight)
        if type(req) ~= "table" or type(list) ~= "table" then
            error("kvr.classic_argmin: expected the request and an array of candidates", 2)
        end
        if weight ~= nil and type(weight) ~= "number" then
            error("kvr.classic_argmin: the weight must be a number", 2)
        end
        return M.classic_argmin(req, list, weight or 1.0)
    end
    K.classic_costs = function(req, list, weight, costs, trees)
        if type(req) ~= "table" or type(list) ~= "table" then
            error("kvr.classic_costs: expected the request and an array of candidates", 2)
        end
        if weight ~= nil and type(weight) ~= "number" then
            error("kvr.classic_costs: the weight must be a number", 2)
        end
        if type(costs) ~= "table" or (trees ~= nil and type(trees) ~= "table") then
            error("kvr.classic_costs: costs (and trees, if given) must be tables", 2)
        end
        return M.classic_costs(req, list, weight or 1.0, costs, trees)
    end
    K.random = random
    K.softmax_pick = function(costs, temperature, u)
        if type(costs) ~= "table" then
            error("kvr.softmax_pick: expected an array of costs", 2)
        end
        return M.softmax_pick(costs, temperature, u, random)
    end
    K.log = function(level, ...)
        local l = LEVELS[level]
        if l == nil then
            error("kvr.log: level must be 'error', 'warn', 'info' or 'debug'", 2)
        end
        log_line(l, ...)
    end
    K.error = function(...) log_line(0, ...) end
    K.warn = function(...) log_line(1, ...) end
    K.info = function(...) log_line(2, ...) end
    K.debug = function(...) log_line(3, ...) end
    K.count = function(cname, n)
        if type(cname) ~= "string" then
            error("kvr.count: counter name must be a string", 2)
        end
        if n == nil then
            n = 1
        elseif type(n) ~= "number" or n < 0 or n ~= n then
            error("kvr.count: increment must be a non-negative number", 2)
        end
        local id = counter_ids[cname]
        if id == nil then
            errp[0] = nil
            id = api.counter_id(vm, cname, #cname, errp)
            if id < 0 then
                error("kvr.count: " .. errtext(id), 2)
            end
            counter_ids[cname] = id
        end
        api.counter_add(vm, id, floor(n))
    end
    K.overlap = function(req, nblocks)
        if type(req) ~= "table" then
            error("kvr.overlap: expected the request table", 2)
        end
        return M.overlap_request(nblocks)
    end
    K.overlap_hashes = M.overlap_hashes
    K.overlap_tokens = M.overlap_tokens
    K.lanes = function(req)
        if type(req) ~= "table" then
            error("kvr.lanes: expected the request table", 2)
        end
        return M.lanes_request()
    end
    K.index_stats = M.index_stats
    K.load = function(who, dp_rank)
        if type(who) == "table" then
            return M.load(who.id, who.dp_rank)
        end
        return M.load(who, dp_rank)
    end
    if opts.admin then
        local function admin_call(fn, what, path)
            if type(path) ~= "string" then
                error("kvr.admin." .. what .. ": expected a path string", 3)
            end
            errp[0] = nil
            local rc = fn(vm, path, #path, errp)
            if rc ~= KVR_OK then
                return nil, errtext(rc)
            end
            return true
        end
        K.admin = {
            dump = function(path) return admin_call(api.admin_dump, "dump", path) end,
            snapshot = function(path) return admin_call(api.admin_snapshot, "snapshot", path) end,
        }
    end
    return K
end

M.KVR_ENOTFOUND = KVR_ENOTFOUND
M.string_format = string_format
M.ffi_cast = ffi_cast
return M
