-- power_of_two.lua - power of two choices (SMG power_of_two, AIBrix power-of-two).
-- SPDX-License-Identifier: Apache-2.0
--
-- Inputs   per candidate: requests (the load signal).
-- Formula  draw two distinct candidates uniformly (kvr.random, seeded per thread); return the
--          one with fewer requests; ties: the first drawn.
-- Defaults none.
-- Guarantees always returns one candidate; O(1) work (two draws).
local function select(req, candidates)
    local n = #candidates
    if n == 1 then
        return candidates[1]
    end
    local i = kvr.random(n)
    local j = kvr.random(n - 1)
    if j >= i then
        j = j + 1
    end
    local a, b = candidates[i], candidates[j]
    if b.requests < a.requests then
        return b
    end
    return a
end

return { select = select }
