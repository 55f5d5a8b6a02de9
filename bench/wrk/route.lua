-- wrk script: POST /v1/route with 32 blocks of block hashes, no booking (book=false keeps the
-- load tracker from growing during the run; the decision path is otherwise the full one:
-- candidates, index query, load query, policy).
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
local hashes = {}
for i = 1, 32 do hashes[i] = tostring(1000 + i) end
wrk.body = '{"block_hashes":[' .. table.concat(hashes, ",") .. '],"book":false}'
