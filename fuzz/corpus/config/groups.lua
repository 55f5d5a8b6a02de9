local base = 1000
local t = { health = { interval = "500ms", timeout = 1, path = "/health", fails = 2,
                       passes = 1 },
            breaker = { failures = 3, successes = 1, open = "2s" },
            retry = { max = 1, backoff = "10ms", backoff_max = "100ms" },
            log_level = "warn", seed = base * 7, tokenizer = "none",
            open_indexer_api = true, allow_policy_header = false }
for i = 1, 3 do t["block_size"] = 8 * i end
return t
