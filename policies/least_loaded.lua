-- least_loaded.lua - the candidate with the fewest in-flight requests (AIBrix least-request,
-- SMG least_load, Dynamo least-loaded; scheduling.md §8).
-- SPDX-License-Identifier: Apache-2.0
--
-- Inputs   per candidate: requests; ties use prefill_tokens + decode_blocks.
-- Formula  argmin requests; ties: fewer prefill_tokens + decode_blocks, then the earlier one.
-- Defaults none.
-- Guarantees always returns one candidate; O(candidates); ignores the KV cache entirely.
local function select(req, candidates)
    local best, br, bw = nil, math.huge, math.huge
    for i = 1, #candidates do
        local c = candidates[i]
        local r, w = c.requests, c.prefill_tokens + c.decode_blocks
        if r < br or (r == br and w < bw) then
            best, br, bw = c, r, w
        end
    end
    return best
end

return { select = select }
