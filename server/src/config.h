/* config.h - kvrouter's configuration: command-line flags and an optional Lua file, validated
 * into one struct before anything starts.
 *
 * Sources, in order (later wins): built-in defaults, the Lua file given by --config FILE, then
 * the flags. Every scalar setting has one entry in a table (config.c) that gives its flag, its
 * key in the Lua file and its type, so `kvrouter --help` and the file reader cannot drift:
 *
 *   flag                   Lua key                 type
 *   --listen HOST:PORT     listen                  address
 *   --max-body SIZE        limits.max_body         size ("8M", 1048576)
 *   --health-interval DUR  health.interval         duration (seconds, or "500ms", "2s", "1m")
 *   ...
 *
 * The Lua file is a chunk returning a table, run in a fresh LuaJIT state with the JIT off, an
 * instruction budget and a memory cap, and an environment holding only pure functions (no io,
 * os, require, load*, debug, ffi); `env("NAME")` reads an environment variable (for secrets):
 *
 *   return {
 *     listen = "0.0.0.0:8080", threads = 4, admin_token = env("KVROUTER_ADMIN_TOKEN"),
 *     limits = { max_body = "16M", max_connections = 8192, timeout = 60 },
 *     snapshot = { path = "/var/lib/kvrouter/index.snap", period = 300 },
 *     models = { { name = "llama", block_size = 16, kind = "events", policy = "kv" },
 *                { name = "mistral", block_size = 32, kind = "approx", tokenizer = "bytes" } },
 *     workers = { { id = 1, model = "llama", url = "http://10.0.0.5:8000",
 *                   zmq = "tcp://10.0.0.5:5557", dp_size = 2, labels = { zone = "a" } } },
 *   }
 *
 * Every error names the option or key: "--threads: expected an integer in 1..64, got 'x'",
 * "kvrouter.lua: models[2].block_size: expected an integer in 2..65536, got 1".
 * Models are keyed "name:tenant" (tenant "default" unless given), like the standalone indexer.
 * With no model configured, one model "default" (block size --block-size, 16) is created, so
 * `kvrouter --listen 127.0.0.1:PORT` alone serves.
 *
 * Thread-safety: none; the config is built on the main thread and read-only afterwards.
 */
#ifndef KVR_SRV_CONFIG_H
#define KVR_SRV_CONFIG_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define SRV_CFG_ERR 512 /* error buffer size for the parse functions */
#define SRV_MAX_THREADS 64
#define SRV_MAX_MODELS 256

enum srv_model_kind {
    SRV_KIND_EVENTS = 0, /* exact index fed by KV events (ZMQ subscriber, POST /v1/events) */
    SRV_KIND_APPROX = 1, /* approximate: the router records its own decisions with a TTL */
};

/* What the CKF index (index=ckf|both) keys on (docs/SERVER.md, docs/CKF.md):
 *   TRANSLATE: the router recomputes each stored block's Dynamo sequence hash from its parent and
 *              tokens (engine hash -> canonical map per rank); works with any engine's hashes;
 *   ENGINE:    the event's block_hash IS the Dynamo sequence hash (Dynamo-hashing engines, the
 *              mock worker); half the exact-side memory, but vLLM/SGLang hashes then match
 *              nothing. */
enum srv_ckf_keys {
    SRV_CKF_KEYS_TRANSLATE = 0,
    SRV_CKF_KEYS_ENGINE = 1,
};

enum srv_tokenizer {
    SRV_TOK_AUTO = 0,   /* events models: the worker's /tokenize; approx models: bytes */
    SRV_TOK_WORKER = 1, /* POST {worker url}/tokenize */
    SRV_TOK_BYTES = 2,  /* approximate byte chunks (no tokenizer needed) */
    SRV_TOK_NONE = 3,   /* text prompts are routed without overlap */
};

struct srv_model_cfg {
    char *name;             /* model name (owned) */
    char *tenant;           /* tenant (owned), "default" */
    uint32_t block_size;    /* tokens per block, 2..65536 */
    int kind;               /* enum srv_model_kind */
    int index_kind;         /* enum kvr_index_kind: radix (default), ckf, both */
    int ckf_keys;           /* CKF/both: SRV_CKF_KEYS_TRANSLATE (default) or _ENGINE */
    uint64_t ckf_expected;  /* CKF/both: blocks per rank sizing the filter (0 = 16384) */
    int tokenizer;          /* enum srv_tokenizer */
    uint32_t byte_chunk;    /* bytes tokenizer: bytes per pseudo-token (1..4; default 4) */
    char *policy;           /* policy name or file for this model (owned), or NULL = default */
    char *kv_topic;         /* ZMQ topic prefix filter of its workers' events (owned) or NULL */
    char *nats_subject;     /* RouterEvent JSON on this NATS subject (owned) or NULL */
    char *nats_stream;      /* JetStream stream holding nats_subject, replayed (owned) or NULL */
    uint64_t approx_ttl_ms; /* approx: block TTL (120 s) */
    uint64_t approx_max_blocks; /* approx: prune above this many (2^20) */
    double approx_prune_ratio;  /* approx: prune down to max * ratio (0.8) */
    double overlap_weight;      /* built-in policy weight (1.0) */
    double temperature;         /* built-in policy temperature (0) */
};

struct srv_worker_cfg {
    uint64_t id;      /* instance id */
    char *model;      /* model key or name (owned) */
    char *url;        /* HTTP base URL (owned) or NULL */
    char *zmq;        /* KV-event PUB endpoint of rank 0 (owned) or NULL */
    char *replay;     /* replay ROUTER endpoint of rank 0 (owned) or NULL */
    char *topic;      /* ZMQ topic prefix (owned; "" = every message) or NULL = the model's */
    char *lora;       /* LoRA of stored blocks whose events name none (owned) or NULL */
    uint32_t dp_size; /* data-parallel ranks (1) */
    int has_id;       /* id was given */
    char *labels;     /* "k=v,k=v" (owned) or NULL */
};

struct srv_config {
    char *config_file; /* --config (owned) or NULL */
    char *listen_host; /* (owned) "127.0.0.1" */
    uint16_t listen_port;
    uint16_t pad0_;
    uint32_t threads;
    char *admin_token;           /* (owned) or NULL */
    int open_indexer_api;        /* /register, /unregister, /dump open to everyone (auth.h) */
    int test_loopback_is_remote; /* tests only: the admin gate treats loopback peers as remote */

    uint64_t max_body;            /* bytes (8 MiB) */
    uint64_t max_headers;         /* bytes (64 KiB) */
    uint32_t max_connections;     /* open client connections (10000) */
    uint32_t upstream_pool;       /* connections per worker per thread (64) */
    uint64_t timeout_ms;          /* client read/write idle timeout (60 s) */
    uint64_t header_timeout_ms;   /* a request's header block, from its first byte (10 s) */
    uint64_t body_timeout_ms;     /* its body, from the end of the headers (60 s) */
    uint64_t upstream_timeout_ms; /* worker connect/read idle timeout (300 s) */

    char *snapshot_path;         /* (owned) or NULL */
    uint64_t snapshot_period_ms; /* 0 = only on shutdown and on demand */

    char *policy;                   /* default policy file or name (owned) or NULL = built-in */
    int allow_policy_header;        /* honour x-kvrouter-policy */
    int policy_trusted;             /* configured policy files run trusted (JIT on) */
    uint64_t policy_budget_ms;      /* per decision time budget (10 ms) */
    uint64_t policy_stuck_after_ms; /* watchdog hard limit per call (1 s; 0 = no watchdog) */
    uint64_t script_budget_ms;      /* operator scripts (5 s) */
    int policy_dev;                 /* re-install policy files when their mtime changes */
    uint32_t pad1_;

    uint64_t health_interval_ms; /* 10 s; 0 disables active checks */
    uint64_t health_timeout_ms;  /* 2 s */
    char *health_path;           /* (owned) "/health" */
    uint32_t health_fails;       /* 3 */
    uint32_t health_passes;      /* 2 */

    uint32_t breaker_failures;  /* 5; 0 disables */
    uint32_t breaker_successes; /* 2 */
    uint64_t breaker_open_ms;   /* 10 s */

    uint32_t retry_max; /* extra attempts on another worker (2) */
    uint32_t pad2_;
    uint64_t retry_backoff_ms;     /* first backoff (20 ms), doubled per attempt */
    uint64_t retry_backoff_max_ms; /* cap (1 s) */

    uint64_t tokenize_timeout_ms; /* 2 s */
    uint64_t shutdown_grace_ms;   /* 30 s */
    int log_level;                /* enum srv_log_level */
    uint32_t block_size;          /* default model's block size (16) */
    int tokenizer;                /* default tokenizer for models that set none */
    uint32_t pad3_;
    uint64_t seed; /* RNG seed for policies and jitter */

    /* replicas (replica.h, docs/DEPLOYMENT.md) */
    char *nats_url;                /* booked-load sync over NATS (owned) or NULL = off */
    char *replica_subject;         /* (owned) "kvrouter.replicas" */
    uint64_t replica_id;           /* 0 = random at start */
    uint64_t replica_timeout_ms;   /* a silent replica is released after this (5 s) */
    uint64_t replica_heartbeat_ms; /* heartbeat when quiet (1 s) */
    uint64_t replica_flush_ms;     /* max delay of a queued op (1 ms; 0 = at once) */
    char *peers;                   /* bootstrap: comma-separated peer base URLs (owned) or NULL */
    char *peer_token;              /* bearer token for the peers (owned) or NULL = admin token */
    uint64_t bootstrap_wait_ms;    /* ZMQ slow-joiner wait before fetching a dump (1 s) */

    struct srv_model_cfg *models; /* models[0..n_models) (owned) */
    size_t n_models;
    struct srv_worker_cfg *workers; /* workers[0..n_workers) (owned) */
    size_t n_workers;
};

/* Defaults (no models yet; srv_config_finish adds "default" when none is configured). */
void srv_config_init(struct srv_config *cfg);
void srv_config_free(struct srv_config *cfg);

/* Parses argv (borrowed): loads --config FILE first, then applies every flag. Returns 0 on
 * success, 1 when --help or --version was printed to out (the caller exits 0), 2 for
 * --check-config (valid: the caller prints "ok" and exits 0), or -1 with a message in err. The
 * result is validated (srv_config_finish is called). */
int srv_config_parse_args(struct srv_config *cfg, int argc, char **argv, FILE *out, char *err,
                          size_t err_len);

/* Loads a Lua config file into cfg (values override). 0 or -1 with err naming file and key. */
int srv_config_load_file(struct srv_config *cfg, const char *path, char *err, size_t err_len);

/* Loads Lua config text (chunk name used in messages). Same contract. */
int srv_config_load_text(struct srv_config *cfg, const char *text, size_t len, const char *chunk,
                         char *err, size_t err_len);

/* Adds the default model if none, checks cross-field rules. 0 or -1 with err. */
int srv_config_finish(struct srv_config *cfg, char *err, size_t err_len);

/* Parses a --model spec "name[:tenant][,key=value...]" (keys: block_size, kind, tokenizer,
 * policy, byte_chunk, ttl, max_blocks, prune_ratio, overlap_weight, temperature) and appends it.
 * 0 or -1 with err. */
int srv_config_add_model_spec(struct srv_config *cfg, const char *spec, char *err, size_t err_len);

/* Parses a --worker spec "id=N,model=M,url=URL,zmq=EP,replay=EP,dp=N,label.K=V..." and appends
 * it. 0 or -1 with err. */
int srv_config_add_worker_spec(struct srv_config *cfg, const char *spec, char *err, size_t err_len);

/* Writes the --help text (every option, its Lua key and default). */
void srv_config_usage(FILE *out);

/* Parsers shared with the HTTP APIs. Each returns 0 or -1. */
int srv_parse_size(const char *s, uint64_t *out);        /* "4096", "8K", "16M", "1G" */
int srv_parse_duration_ms(const char *s, uint64_t *out); /* "30" (s), "1.5", "500ms", "2m" */
int srv_parse_listen(const char *s, char *host, size_t host_cap, uint16_t *port);
int srv_kind_parse(const char *s);       /* "events" | "approx" -> enum, or -1 */
int srv_tokenizer_parse(const char *s);  /* "auto" | "worker" | "bytes" | "none" -> enum, or -1 */
int srv_index_kind_parse(const char *s); /* "radix" | "ckf" | "both" -> kvr_index_kind, or -1 */
const char *srv_index_kind_name(int kind);
const char *srv_kind_name(int kind);
const char *srv_tokenizer_name(int tok);

#endif
