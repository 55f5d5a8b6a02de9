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
--          Compose: edit params.weights, or add a function to `scorers` (it receives
--          (c, ctx) where ctx holds req and the min/max of requests and queue) and give it a
--          weight.
-- Defaults weights prefix 2, load 1, queue 1, kv 1; prefix_length_weight 0; max_model_len 8192.
-- Guarantees always returns one candidate; O(candidates × scorers).
local params = {
    weights = { prefix = 2.0, load = 1.0, queue = 1.0, kv = 1.0 },
    prefix_length_weight = 0.0,
    max_model_len = 8192,
}

local function spread(lo, hi, v)
    if hi == lo then
        return 1
    end
    return (hi - v) / (hi - lo)
end

local scorers = {
    prefix = function(c, ctx)
        local blocks = ctx.req.blocks
        local ratio = blocks > 0 and c.overlap / blocks or 0
        local plw = params.prefix_length_weight
        if plw == 0 then
            return ratio
        end
        local len = math.min(1, c.overlap * ctx.req.block_size / params.max_model_len)
        return (1 - plw) * ratio + plw * len * len
    end,
    load = function(c, ctx)
        return spread(ctx.min_requests, ctx.max_requests, c.requests)
    end,
    queue = function(c, ctx)
        return spread(ctx.min_queue, ctx.max_queue, c.queue)
    end,
    kv = function(c)
        local u = c.kv_usage
        return u and 1 - u or 0
    end,
}

local ctx = {}

local function select(req, candidates)
    local rlo, rhi, qlo, qhi = math.huge, -math.huge, math.huge, -math.huge
    for i = 1, #candidates do
        local c = candidates[i]
        rlo, rhi = math.min(rlo, c.requests), math.max(rhi, c.requests)
        qlo, qhi = math.min(qlo, c.queue), math.max(qhi, c.queue)
    end
    ctx.req, ctx.min_requests, ctx.max_requests, ctx.min_queue, ctx.max_queue =
        req, rlo, rhi, qlo, qhi
    local best, best_score, best_req = nil, -math.huge, math.huge
    for i = 1, #candidates do
        local c = candidates[i]
        local score = 0
        for name, w in pairs(params.weights) do
            if w ~= 0 then
                score = score + w * scorers[name](c, ctx)
            end
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

return { select = select, selftest = selftest, params = params, scorers = scorers }
