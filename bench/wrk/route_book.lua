-- wrk script: POST /v1/route that books load, then frees it with DELETE /v1/route/{id}: the
-- routing-service lifecycle as an external proxy would drive it (two requests per route).
-- Run with one connection per wrk thread: script state is per thread, not per connection.
wrk.headers["Content-Type"] = "application/json"
local hashes = {}
for i = 1, 32 do hashes[i] = tostring(1000 + i) end
local route_body = '{"block_hashes":[' .. table.concat(hashes, ",") .. ']}'
local pending = nil

request = function()
  if pending then
    local path = "/v1/route/" .. pending
    pending = nil
    return wrk.format("DELETE", path, nil, nil)
  end
  return wrk.format("POST", "/v1/route", nil, route_body)
end

response = function(status, headers, body)
  -- only a routing answer books (the DELETE answer echoes the id too)
  if body:find('"worker_id"', 1, true) then
    pending = body:match('"request_id":(%d+)')
  end
end
