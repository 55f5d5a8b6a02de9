-- round_robin.lua - candidates in turn (prod-stack roundrobin, SMG round_robin).
-- SPDX-License-Identifier: Apache-2.0
--
-- Inputs   the candidate list (in the server's stable order), healthy.
-- Formula  next = (counter mod n) + 1, counter + 1 after each decision; an unhealthy candidate
--          is skipped while a healthy one exists.
-- Defaults none.
-- Guarantees always returns one candidate; O(candidates) at worst. The counter lives in
--          kvr.state: it is per server thread and restarts at a reload.
local state = kvr.state

local function select(req, candidates)
    local n = #candidates
    local k = state.counter or 0
    state.counter = k + 1
    for step = 0, n - 1 do
        local c = candidates[(k + step) % n + 1]
        if c.healthy then
            return c
        end
    end
    return candidates[k % n + 1]
end

return { select = select }
