-- cache_aware.lua - SGLang's cache-aware policy (sgl-router cache_aware.rs; scheduling.md §8).
-- SPDX-License-Identifier: Apache-2.0
--
-- Inputs   per candidate: requests (in-flight load), overlap (cached blocks), tree_blocks;
--          request: blocks.
-- Formula  imbalanced = (max_load - min_load) > balance_abs_threshold
--                       and max_load > min_load * balance_rel_threshold
--          imbalanced             -> the least-loaded candidate            (branch "balance")
--          else best = longest overlap; match_rate = best.overlap / req.blocks
--            match_rate > cache_threshold -> best                          (branch "cache")
--            else                         -> the smallest tree_blocks      (branch "tree")
--          Ties: fewer requests, then the earlier candidate.
--          SGLang matches characters in its own approximate tree; kvrouter uses the exact KV
--          index, so match_rate is in blocks.
-- Defaults cache_threshold 0.3, balance_abs_threshold 64, balance_rel_threshold 1.5 (SMG docs).
-- Guarantees always returns one candidate; O(candidates); counts its branch in the metrics
--          (kvr.count "branch.balance" / "branch.cache" / "branch.tree").
local params = {
    cache_threshold = 0.3,
    balance_abs_threshold = 64,
    balance_rel_threshold = 1.5,
}

-- Index of the candidate minimising key(c); ties: fewer requests, then the earlier one.
local function pick_min(candidates, key)
    local best, bk, br = nil, math.huge, math.huge
    for i = 1, #candidates do
        local c = candidates[i]
        local k = key(c)
        if k < bk or (k == bk and c.requests < br) then
            best, bk, br = c, k, c.requests
        end
    end
    return best
end

local function by_load(c)
    return c.requests
end

local function by_overlap(c)
    return -c.overlap
end

local function by_tree(c)
    return c.tree_blocks
end

local function select(req, candidates)
    local lo, hi = math.huge, -math.huge
    for i = 1, #candidates do
        local l = candidates[i].requests
        if l < lo then
            lo = l
        end
        if l > hi then
            hi = l
        end
    end
    if hi - lo > params.balance_abs_threshold and hi > lo * params.balance_rel_threshold then
        kvr.count("branch.balance")
        return pick_min(candidates, by_load)
    end
    local best = pick_min(candidates, by_overlap)
    local rate = req.blocks > 0 and best.overlap / req.blocks or 0
    if rate > params.cache_threshold then
        kvr.count("branch.cache")
        return best
    end
    kvr.count("branch.tree")
    return pick_min(candidates, by_tree)
end

local function selftest()
    local req = { blocks = 10 }
    local function cand(requests, overlap, tree)
        return { requests = requests, overlap = overlap, tree_blocks = tree }
    end
    local a, b = cand(0, 0, 5), cand(100, 9, 50)
    if select(req, { a, b }) ~= a then
        return false, "imbalance must pick the least loaded"
    end
    a, b = cand(3, 1, 5), cand(4, 9, 50)
    if select(req, { a, b }) ~= b then
        return false, "a 90% match must win"
    end
    b.overlap = 2
    if select(req, { a, b }) ~= a then
        return false, "below the threshold the smaller tree wins"
    end
    return true
end

return { select = select, selftest = selftest, params = params }
