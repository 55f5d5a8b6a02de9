return {
  listen = "0.0.0.0:8080", threads = 4, admin_token = env("KVROUTER_ADMIN_TOKEN"),
  limits = { max_body = "16M", max_connections = 8192, timeout = 60, header_timeout = "5s",
             body_timeout = 30 },
  snapshot = { path = "/var/lib/kvrouter/index.snap", period = 300 },
  models = { { name = "llama", block_size = 16, kind = "events", policy = "kv" },
             { name = "mistral", tenant = "acme", block_size = 32, kind = "approx",
               tokenizer = "bytes", approx = { ttl = 120, max_blocks = 1048576,
               prune_ratio = 0.8 } } },
  workers = { { id = 1, model = "llama", url = "http://10.0.0.5:8000",
                zmq = "tcp://10.0.0.5:5557", dp_size = 2, labels = { zone = "a" } } },
}
