-- weighted.lua - composable scorers with weights (llm-d / GIE style; scheduling.md §8).
-- SPDX-License-Identifier: Apache-2.0
--
-- Inputs   per candidate: overlap, requests, queue, kv_usage (nil = unknown); request: blocks,
--          block_size.
-- Formula  score(c) = Σ weight[s] × scorer_s(c), every scorer in [0, 1], higher is better:
--            prefix  (1 - plw) × overlap / blocks + plw × min(1, overlap × block_size /
--                    max_model_len)^2                      (llm-d prefix-cache-scorer)
--            load    (max_r - r) / (max_r - min_r), 1 when all equal   (min-max, reversed)
--            queue   (max_q - q) / (max_q - min_q), 1 when all equal   (GIE queue scorer)
--            kv      1 - kv_usage, 0 when unknown      (llm-d kv-cache-utilization-scorer)
--          The highest score wins; ties: fewer requests, then the earlier candidate.
--          Compose: change params.weights (0 disables a scorer), or add a scorer to `extra`
--          ({ weight = w, score = function(c, ctx) return 0..1 end }, ctx holds req and the
--          min/max of requests and queue over the candidates).
-- Defaults weights prefix 2, load 1, queue 1, kv 1; prefix_length_weight 0; max_model_len 8192.
-- Guarantees always returns one candidate; O(candidates × (4 + #extra)).
local params = {
    weights = { prefix = 2.0, load = 1.0, queue = 1.0, kv = 1.0 },
    prefix_length_weight = 0.0,
    max_model_len = 8192,
}

local extra = {} -- custom scorers, see the header

-- (hi - v) / (hi - lo), 1 when every candidate has the same value.
local function spread(lo, hi, v)
    if hi == lo then
        return 1
    end
    return (hi - v) / (hi - lo)
end

local ctx = {}

local function select(req, candidates)
    local n = #candidates
    local rlo, rhi, qlo, qhi = math.huge, -math.huge, math.huge, -math.huge
    for i = 1, n do
        local c = candidates[i]
        local r, q = c.requests, c.queue
        if r < rlo then rlo = r end
        if r > rhi then rhi = r end
        if q < qlo then qlo = q end
        if q > qhi then qhi = q end
    end
    local w = params.weights
    local wp, wl, wq, wk = w.prefix or 0, w.load or 0, w.queue or 0, w.kv or 0
    local plw, blocks = params.prefix_length_weight, req.blocks
    local len_scale = req.block_size / params.max_model_len
    ctx.req, ctx.min_requests, ctx.max_requests, ctx.min_queue, ctx.max_queue =
        req, rlo, rhi, qlo, qhi
    local best, best_score, best_req = nil, -math.huge, math.huge
    for i = 1, n do
        local c = candidates[i]
        local prefix = blocks > 0 and c.overlap / blocks or 0
        if plw ~= 0 then
            local len = math.min(1, c.overlap * len_scale)
            prefix = (1 - plw) * prefix + plw * len * len
        end
        local u = c.kv_usage
        local score = wp * prefix + wl * spread(rlo, rhi, c.requests)
            + wq * spread(qlo, qhi, c.queue) + wk * (u and 1 - u or 0)
        for j = 1, #extra do
            score = score + extra[j].weight * extra[j].score(c, ctx)
        end
        if score > best_score or (score == best_score and c.requests < best_req) then
            best, best_score, best_req = c, score, c.requests
        end
    end
    ctx.req = nil
    return best
end

local function selftest()
    local req = { blocks = 10, block_size = 16 }
    local a = { overlap = 8, requests = 5, queue = 0, kv_usage = 0.5 }
    local b = { overlap = 0, requests = 5, queue = 0, kv_usage = 0.5 }
    if select(req, { b, a }) ~= a then
        return false, "prefix must dominate equal loads"
    end
    b.kv_usage, a.kv_usage, a.requests = 0.0, 0.9, 9
    b.overlap = 6
    if select(req, { a, b }) ~= b then
        return false, "load and kv should tip a close prefix race"
    end
    return true
end

return { select = select, selftest = selftest, params = params, extra = extra }
