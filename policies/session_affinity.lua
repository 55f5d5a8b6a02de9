-- session_affinity.lua - consistent hashing on a session key (prod-stack session, SMG
-- consistent_hashing, Dynamo session affinity; scheduling.md §8).
-- SPDX-License-Identifier: Apache-2.0
--
-- Inputs   request: session (the server's session key), or the header params.header;
--          per candidate: worker id, dp_rank, healthy; without a session key, the kv_cost
--          inputs.
-- Formula  rendezvous (highest-random-weight) hashing (kvr.rendezvous): the healthy candidate
--          with the largest xxh3(xxh3(session), worker_id, dp_rank). Removing or adding a
--          candidate moves only the sessions that hashed to it; an unhealthy candidate's
--          sessions go to their next choice and come back when it recovers. No healthy
--          candidate: hash over all of them.
--          No session key: the classic KV cost (kvr.classic_cost, weight 1, T = 0).
-- Defaults header "x-session-id".
-- Guarantees always returns one candidate; O(candidates) hashes; the same session gets the
--          same worker on every thread and after a reload while the candidate set is stable.
local params = {
    header = "x-session-id",
}

local function by_cost(req, candidates)
    local best, best_cost, best_tree = nil, math.huge, math.huge
    for i = 1, #candidates do
        local c = candidates[i]
        local cost = kvr.classic_cost(req, c, 1.0)
        if cost < best_cost or (cost == best_cost and c.tree_blocks < best_tree) then
            best, best_cost, best_tree = c, cost, c.tree_blocks
        end
    end
    return best
end

local function select(req, candidates)
    local key = req.session
    if key == nil or key == "" then
        key = req.headers[params.header]
    end
    if key == nil or key == "" then
        return by_cost(req, candidates)
    end
    return kvr.rendezvous(key, candidates, true) or kvr.rendezvous(key, candidates, false)
end

return { select = select, params = params }
