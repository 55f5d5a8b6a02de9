-- wrk script: POST /query_by_hash with 32 local block hashes (exact u64 values, half of them
-- above 2^63). The hashes come from bench/server_bench.sh's fill step, so queries hit the tree.
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
local hashes = {}
for i = 1, 32 do
  -- local hashes 1000+i (stored by the fill step for every worker at different depths)
  hashes[i] = tostring(1000 + i)
end
wrk.body = '{"block_hashes":[' .. table.concat(hashes, ",") .. '],"model_name":"default"}'
