-- random.lua - a uniformly random candidate (SMG random, AIBrix random).
-- SPDX-License-Identifier: Apache-2.0
--
-- Inputs   the candidate list, healthy.
-- Formula  uniform among the healthy candidates (all of them when none is healthy), with
--          kvr.random (seeded per thread, so runs are reproducible).
-- Defaults none.
-- Guarantees always returns one candidate; O(candidates).
local function select(req, candidates)
    local n, m = #candidates, 0
    for i = 1, n do
        if candidates[i].healthy then
            m = m + 1
        end
    end
    if m == 0 then
        return candidates[kvr.random(n)]
    end
    local k = kvr.random(m) -- the k-th healthy candidate (no table built per request)
    for i = 1, n do
        local c = candidates[i]
        if c.healthy then
            k = k - 1
            if k == 0 then
                return c
            end
        end
    end
end

return { select = select }
