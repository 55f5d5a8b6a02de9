-- bounded_affinity.lua - prefix affinity with bounded loads (consistent hashing with bounded
-- loads, Mirrokni, Thorup and Zadimoghaddam 2018, applied to KV prefixes).
-- SPDX-License-Identifier: Apache-2.0
--
-- Inputs   per candidate: overlap (cached blocks), requests (in-flight) or, with
--          load = "tokens", prefill_tokens + decode_blocks × block_size.
-- Formula  total = Σ load;  bound = ceil(load_factor × (total + 1) / n)
--          eligible = candidates with load + 1 <= bound (this request included; the least
--                     loaded candidate is always eligible)
--          among the eligible: the longest overlap; ties (including no overlap anywhere):
--          the lower load, then the earlier candidate.
-- Defaults load_factor 1.25, load "requests".
-- Guarantees always returns one candidate; O(candidates); no candidate is ever sent more than
--          load_factor × the mean load (+1), so one hot prefix cannot pile onto one worker,
--          while every prefix stays on the worker that caches it as long as that worker is not
--          overloaded. kvrouter's provisional default policy (policies/README.md).
local params = {
    load_factor = 1.25,
    load = "requests",
}

local function select(req, candidates)
    local n, bs = #candidates, req.block_size
    local by_tokens = params.load == "tokens"
    local total = 0
    for i = 1, n do
        local c = candidates[i]
        total = total + (by_tokens and c.prefill_tokens + c.decode_blocks * bs or c.requests)
    end
    local bound = math.ceil(params.load_factor * (total + 1) / n)
    local best, best_overlap, best_load = nil, -1, math.huge
    local least, least_load = nil, math.huge
    for i = 1, n do
        local c = candidates[i]
        local l = by_tokens and c.prefill_tokens + c.decode_blocks * bs or c.requests
        if l + 1 <= bound then
            local o = c.overlap
            if o > best_overlap or (o == best_overlap and l < best_load) then
                best, best_overlap, best_load = c, o, l
            end
        end
        if l < least_load then
            least, least_load = c, l
        end
    end
    -- Nobody under the bound only happens with load_factor < 1: take the least loaded.
    return best or least
end

local function selftest()
    local req = { block_size = 16 }
    local function cand(requests, overlap)
        return { requests = requests, overlap = overlap, prefill_tokens = 0, decode_blocks = 0 }
    end
    local hot, cold = cand(0, 10), cand(0, 0)
    if select(req, { cold, hot }) ~= hot then
        return false, "the cached prefix must win at equal load"
    end
    hot.requests = 10 -- total 10 -> bound ceil(1.25 * 11 / 2) = 7: hot is over it
    if select(req, { cold, hot }) ~= cold then
        return false, "an overloaded worker must be skipped"
    end
    return true
end

return { select = select, selftest = selftest, params = params }
