-- random.lua - a uniformly random candidate (SMG random, AIBrix random).
-- SPDX-License-Identifier: Apache-2.0
--
-- Inputs   the candidate list, healthy.
-- Formula  uniform among the healthy candidates (all of them when none is healthy), with
--          kvr.random (seeded per thread, so runs are reproducible).
-- Defaults none.
-- Guarantees always returns one candidate; O(candidates).
local function select(req, candidates)
    local healthy, m = {}, 0
    for i = 1, #candidates do
        if candidates[i].healthy then
            m = m + 1
            healthy[m] = candidates[i]
        end
    end
    if m == 0 then
        return candidates[kvr.random(#candidates)]
    end
    return healthy[kvr.random(m)]
end

return { select = select }
