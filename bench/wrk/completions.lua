-- wrk script: non-streaming POST /v1/completions with a token-array prompt (no tokenizer call),
-- 64 tokens, one output token. Used against the router and against the worker directly.
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
local t = {}
for i = 1, 64 do t[i] = tostring(100 + i) end
wrk.body = '{"model":"mock-model","prompt":[' .. table.concat(t, ",") .. '],"max_tokens":1}'
