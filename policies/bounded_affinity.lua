-- bounded_affinity.lua - prefix affinity with bounded loads (consistent hashing with bounded
-- loads, Mirrokni, Thorup and Zadimoghaddam 2018, applied to KV prefixes).
-- SPDX-License-Identifier: Apache-2.0
--
-- Inputs   per candidate: overlap (cached blocks), requests (in-flight), prefill_tokens (active
--          prefill tokens); with load = "tokens" the load is prefill_tokens + decode_blocks ×
--          block_size instead of requests.
-- Formula  total = Σ load;  bound = ceil(load_factor × (total + 1) / n)
--          eligible = candidates with load + 1 <= bound (this request included; the least
--                     loaded candidate is always eligible)
--          overlap counts only from min_match × the request's blocks on (shorter: 0), so a
--          prefix every request shares (a system prompt) does not tie new conversations to the
--          first workers that happen to cache it
--          among the eligible: the longest overlap; ties (including no overlap anywhere):
--          the lower load, then the fewer active prefill tokens (the shorter prefill queue),
--          then the earlier candidate.
-- Defaults load_factor 2.0, min_match 0.1, load "requests" (measured with the policy lab,
--          kvrouter sim, and the live demo tools/demo.py:
--          policies/README.md "The default", BENCHMARKS.md "Policy lab").
-- Guarantees always returns one candidate; O(candidates); no candidate is ever sent more than
--          load_factor × the mean load (+1), so one hot prefix cannot pile onto one worker,
--          while every prefix stays on the worker that caches it as long as that worker is not
--          overloaded. kvrouter's default policy (policies/README.md).
local params = {
    load_factor = 2.0,
    load = "requests",
    min_match = 0.1,
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
    -- An overlap shorter than min_match of the request (a shared system prompt, say) does not
    -- attract the request: it would pin every new conversation to the first workers that cached
    -- that prompt while the others stay idle.
    local floor = params.min_match * (req.blocks or 0)
    local best, best_overlap, best_load, best_prefill = nil, -1, math.huge, math.huge
    local least, least_load = nil, math.huge
    for i = 1, n do
        local c = candidates[i]
        local l = by_tokens and c.prefill_tokens + c.decode_blocks * bs or c.requests
        if l + 1 <= bound then
            local o, p = c.overlap, c.prefill_tokens
            if o < floor then
                o = 0
            end
            if o > best_overlap or (o == best_overlap
                    and (l < best_load or (l == best_load and p < best_prefill))) then
                best, best_overlap, best_load, best_prefill = c, o, l, p
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
    local function cand(requests, overlap, prefill)
        return { requests = requests, overlap = overlap, prefill_tokens = prefill or 0,
                 decode_blocks = 0 }
    end
    local hot, a, b, c = cand(0, 10), cand(0, 0), cand(0, 0), cand(0, 0)
    if select(req, { a, b, c, hot }) ~= hot then
        return false, "the cached prefix must win at equal load"
    end
    -- total 10 -> bound ceil(2 × 11 / 4) = 6: hot (10 + 1 > 6) is over it
    hot.requests = 10
    if select(req, { a, b, c, hot }) ~= a then
        return false, "an overloaded worker must be skipped"
    end
    a.prefill_tokens = 500 -- equal overlap and requests: the shorter prefill queue
    if select(req, { a, b, c, hot }) ~= b then
        return false, "ties must go to the fewer active prefill tokens"
    end
    -- a one-block shared prefix of a 40-block request does not attract it (below min_match)
    local long = { block_size = 16, blocks = 40 }
    local shared, idle = cand(1, 1), cand(0, 0)
    if select(long, { shared, idle }) ~= idle then
        return false, "a short shared prefix must not beat an idle worker"
    end
    shared.overlap = 8 -- 20% of the request: affinity again
    if select(long, { shared, idle }) ~= shared then
        return false, "a real match must win"
    end
    return true
end

return { select = select, selftest = selftest, params = params }
