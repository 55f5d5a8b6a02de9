-- wrk script: POST /v1/route that books load, then frees it with DELETE /v1/route/{id}: the
-- routing-service lifecycle as an external proxy would drive it (two requests per route), with
-- the 32 block hashes of query_by_hash.lua.
-- Run with one connection per wrk thread: script state is per thread, not per connection.
wrk.headers["Content-Type"] = "application/json"
local hashes = {
  "10451216379200822465", "10905525725756348110", "2092789425003139053", "7958955049054603978",
  "7134611160154358618", "13647215125184110592", "7191089600892374487", "11409396526365357622",
  "12587370737594032228", "614480483733483466", "5833679380957638813", "10682531704454680323",
  "14180207640020093695", "7685909621375755838", "9753551079159975941", "6764836397866521095",
  "9260656408219841379", "1234184003990712370", "13564971763896621636", "3900778703475868044",
  "489215147674969543", "14415425345905102346", "16778118630780010966", "12306297088033431108",
  "11675794432720353033", "14103010035660836314", "10902710238276814474", "10402319577963762796",
  "13509472508297990000", "12172763028394216910", "15517599431202433770", "16927763432924390401",
}
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
