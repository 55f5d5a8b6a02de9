-- kv_cost.lua - Dynamo's classic KV cost (scheduling.md §3, §5).
-- SPDX-License-Identifier: Apache-2.0
--
-- Inputs   per candidate: overlap (device blocks cached), prefill_tokens (active prefill tokens),
--          decode_blocks (active decode blocks), new_blocks (request blocks not yet active on
--          the rank), tree_blocks (tie-break); request: tokens (isl), block_size, and the
--          per-request overrides overlap_weight and temperature.
-- Formula  prefill = max(0, tokens - overlap * block_size) + prefill_tokens
--          cost    = overlap_weight * prefill / block_size + new_blocks + decode_blocks
--          T == 0: the lowest cost; ties -> fewer tree_blocks, then the earlier candidate.
--          T  > 0: softmax over min-max normalised costs (kvr.softmax_pick, §5 exactly).
-- Defaults overlap_weight 1.0, temperature 0 (Dynamo's defaults).
-- Guarantees always returns one candidate; O(candidates); at T == 0 it makes exactly the
--          choice of the built-in C fallback (test_policies.c checks this on random inputs).
local params = {
    overlap_weight = 1.0,
    temperature = 0.0,
}

local function select(req, candidates)
    local w = req.overlap_weight or params.overlap_weight
    local temperature = req.temperature or params.temperature
    local bs, isl = req.block_size, req.tokens
    if temperature > 0 then
        local costs = {}
        for i = 1, #candidates do
            local c = candidates[i]
            local prefill = isl - c.overlap * bs
            if prefill < 0 then
                prefill = 0
            end
            prefill = prefill + c.prefill_tokens
            costs[i] = w * (prefill / bs) + (c.new_blocks + c.decode_blocks)
        end
        return candidates[kvr.softmax_pick(costs, temperature)]
    end
    local best, best_cost, best_tree = nil, math.huge, math.huge
    for i = 1, #candidates do
        local c = candidates[i]
        local prefill = isl - c.overlap * bs
        if prefill < 0 then
            prefill = 0
        end
        prefill = prefill + c.prefill_tokens
        local cost = w * (prefill / bs) + (c.new_blocks + c.decode_blocks)
        if cost < best_cost or (cost == best_cost and c.tree_blocks < best_tree) then
            best, best_cost, best_tree = c, cost, c.tree_blocks
        end
    end
    return best
end

local function selftest()
    -- scheduling.md §3: ISL 100, block size 16: A (3 blocks cached) 3.25, B (none) 6.25.
    local req = { tokens = 100, block_size = 16 }
    local a = { overlap = 3, prefill_tokens = 0, decode_blocks = 0, new_blocks = 0, tree_blocks = 0 }
    local b = { overlap = 0, prefill_tokens = 0, decode_blocks = 0, new_blocks = 0, tree_blocks = 0 }
    if select(req, { a, b }) ~= a then
        return false, "A should win on overlap"
    end
    a.decode_blocks = 3 -- exactly 3 more decode blocks: a tie, broken by the earlier candidate
    if select(req, { a, b }) ~= a or select(req, { b, a }) ~= b then
        return false, "tie-break"
    end
    a.decode_blocks = 4
    if select(req, { a, b }) ~= b then
        return false, "B should win once A carries 4 more decode blocks"
    end
    return true
end

return {
    select = select,
    selftest = selftest,
    params = params,
}
