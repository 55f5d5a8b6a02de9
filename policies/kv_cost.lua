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
-- Speed    the O(candidates) loop is kvr.classic_argmin / kvr.classic_costs (the formula above,
--          in the runtime's JIT-compiled code), so the policy costs about the same sandboxed as
--          trusted; selftest checks that both helpers agree with kvr.classic_cost, candidate by
--          candidate.
local params = {
    overlap_weight = 1.0,
    temperature = 0.0,
}

local costs, trees = {}, {} -- scratch, reused from request to request (this thread's)

local function select(req, candidates)
    local w = req.overlap_weight or params.overlap_weight
    local temperature = req.temperature or params.temperature
    if temperature > 0 then
        kvr.classic_costs(req, candidates, w, costs)
        return candidates[kvr.softmax_pick(costs, temperature)]
    end
    -- the lowest cost; ties: fewer tree_blocks, then the earlier candidate
    return candidates[kvr.classic_argmin(req, candidates, w)]
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
    local list = {}
    for i = 1, 37 do
        list[i] = { overlap = i % 7, prefill_tokens = (i * 37) % 101, decode_blocks = i % 5,
            new_blocks = (i * 3) % 11, tree_blocks = i }
    end
    local rq = { tokens = 130, block_size = 16 }
    for _, w in ipairs({ 1.0, 0.5, 2.75 }) do
        kvr.classic_costs(rq, list, w, costs, trees)
        for i = 1, #list do
            if costs[i] ~= kvr.classic_cost(rq, list[i], w) or trees[i] ~= i then
                return false, "kvr.classic_costs differs from the formula at " .. i
            end
        end
    end
    kvr.classic_costs(rq, { a }, 1.0, costs, trees)
    if #costs ~= 1 or #trees ~= 1 then
        return false, "stale costs beyond the candidates"
    end
    local best = 1 -- the plain-Lua argmin with the tie-break, against kvr.classic_argmin
    for i = 2, #list do
        local ci, cb = kvr.classic_cost(rq, list[i], 1.0), kvr.classic_cost(rq, list[best], 1.0)
        if ci < cb or (ci == cb and list[i].tree_blocks < list[best].tree_blocks) then
            best = i
        end
    end
    if kvr.classic_argmin(rq, list, 1.0) ~= best then
        return false, "kvr.classic_argmin differs from the formula"
    end
    return true
end

return {
    select = select,
    selftest = selftest,
    params = params,
}
