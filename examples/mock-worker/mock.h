/* mock.h - kvr-mock-worker: an engine stand-in with prefix caching and vLLM-format KV events.
 *
 * Design: one libevent loop runs everything (HTTP, latency timers, ZMQ); nothing blocks it.
 *
 *   HTTP request ─▶ parse (json-c) ─▶ tokenize ─▶ admission (max concurrent; FIFO queue)
 *        ─▶ start: block hashes (kvr/hash.h) ─▶ LRU cache: cached prefix, evictions, inserts
 *                  └─▶ one KV event batch [BlockRemoved?, BlockStored?] ─▶ ZMQ XPUB (+ replay ring)
 *        ─▶ prefill timer (uncached tokens x prefill_us) ─▶ one token every decode_us
 *        ─▶ JSON reply, or SSE chunks + "data: [DONE]"
 *
 * All state lives in one struct mock created by main() and passed to every callback (no globals).
 * Files: main.c (flags, wiring), http.c (endpoints, request lifecycle), cache.c (LRU of blocks),
 * publisher.c (ZMQ PUB + ROUTER replay), tokenizer.c (deterministic tokenizer and text).
 */
#ifndef KVR_MOCK_H
#define KVR_MOCK_H

#include <stddef.h>
#include <stdint.h>

struct event_base;
struct evhttp;
struct event;
struct evhttp_request;
struct evhttp_connection;

/* ==== configuration (command-line flags) ===================================================== */

struct mock_cfg {
    const char *host;            /* --host, default 127.0.0.1 */
    int port;                    /* --port, 0 = ephemeral (printed) */
    const char *model;           /* --model */
    uint32_t block_size;         /* --block-size (tokens per KV block) */
    uint32_t cache_blocks;       /* --cache-blocks (LRU capacity) */
    uint32_t vocab;              /* --vocab (tokenizer id space) */
    uint32_t max_model_len;      /* --max-model-len (longer prompts: 400) */
    uint32_t default_max_tokens; /* when the request has none */
    uint64_t prefill_us;         /* --prefill-us: per uncached prompt token */
    uint64_t decode_us;          /* --decode-us: per output token */
    uint32_t max_concurrent;     /* --max-concurrent (0 = unlimited); extra requests queue */
    uint32_t max_queue;          /* --max-queue (0 = unlimited); beyond: 503 */
    const char *zmq;             /* --zmq endpoint for KV events (NULL = no events) */
    int zmq_connect;             /* --zmq-connect: connect instead of bind */
    const char *topic;           /* --topic */
    const char *replay;          /* --replay ROUTER endpoint (NULL = none) */
    uint32_t replay_buffer;      /* --replay-buffer (batches kept) */
    int replay_two_frame;        /* --replay-two-frame: old vLLM / SGLang reply form */
    int legacy;                  /* --legacy-events: era A positional arrays */
    int has_dp_rank;             /* --dp-rank N (default 0); --no-dp-rank publishes nil */
    uint32_t dp_rank;
    double fail_rate;          /* --fail-rate: fraction of requests answered with status_code */
    int status_code;           /* --status-code (default 500) */
    uint32_t die_after_chunks; /* --die-after-chunks N: close streams after N chunks (0 = off) */
    uint64_t seed;             /* --seed for fail-rate draws */
    uint64_t drop_seq[16];     /* --drop-seq: batches kept for replay but never published live */
    uint32_t n_drop_seq;
    uint64_t corrupt_seq[16]; /* --corrupt-seq: batches published (and kept) one byte short */
    uint32_t n_corrupt_seq;
    const char *medium;  /* --medium: the medium of every event ("GPU") */
    uint32_t medium_len; /* strlen(medium), measured once */
};

/* ==== tokenizer.c ============================================================================ */

/* Tokenizes `len` bytes of text (documented in README.md). Appends ids to *tokens (realloc'd,
 * owned by the caller, free with free()), *n tokens so far, *cap capacity. Returns 0, -1 on OOM. */
int mock_tokenize(const char *text, size_t len, uint32_t vocab, uint32_t **tokens, size_t *n,
                  size_t *cap);

/* The word for output token i of a request whose prompt hashes to `seed`. Static string. */
const char *mock_output_word(uint64_t seed, uint32_t i);

/* ==== cache.c: LRU of KV blocks keyed by sequence hash ======================================= */

struct mock_cache {
    uint32_t cap;   /* blocks */
    uint32_t size;  /* blocks in use */
    uint64_t *key;  /* [cap] */
    int32_t *prev;  /* [cap] towards MRU */
    int32_t *next;  /* [cap] towards LRU */
    int32_t head;   /* MRU (-1 if empty) */
    int32_t tail;   /* LRU (-1 if empty) */
    int32_t free_;  /* free slot list through next[] */
    int32_t *table; /* open addressing, slot + 1 (0 = empty), [tcap] */
    uint32_t tmask; /* tcap - 1 */
};

/* Returns 0 or -1 (OOM or cap == 0). */
int mock_cache_init(struct mock_cache *c, uint32_t cap);
void mock_cache_free(struct mock_cache *c);
/* 1 if the key is cached. */
int mock_cache_contains(const struct mock_cache *c, uint64_t key);
/* Makes a cached key the most recently used; no-op when absent. */
void mock_cache_touch(struct mock_cache *c, uint64_t key);
/* Removes the least recently used key into *key; returns 1, or 0 when empty. */
int mock_cache_evict(struct mock_cache *c, uint64_t *key);
/* Inserts an absent key as the most recently used; the cache must not be full. */
void mock_cache_insert(struct mock_cache *c, uint64_t key);

/* ==== publisher.c: ZMQ XPUB + ROUTER replay ================================================== */

struct mock_ring_entry {
    uint64_t seq;
    uint8_t *payload;
    size_t len;
};

struct mock_pub {
    void *ctx;
    void *pub;    /* XPUB: a PUB that also reports subscriptions */
    void *router; /* replay ROUTER or NULL */
    const char *topic;
    int era;       /* enum kvr_emp_era */
    int two_frame; /* replay replies without the topic frame */
    uint64_t next_seq;
    struct mock_ring_entry *ring;
    uint32_t ring_cap;
    uint32_t ring_len;
    uint32_t ring_head; /* oldest entry */
    struct event *ev_pub;
    struct event *ev_router;
    struct event *ev_tick; /* backstop poll (ZMQ_FD is edge-triggered) */
    char endpoint[256];    /* actual bound endpoints */
    char replay_endpoint[256];
    /* counters */
    uint64_t batches;
    uint64_t events;
    uint64_t subscriptions;
    uint64_t replay_requests;
    uint64_t replay_malformed;
    uint64_t dropped;   /* batches not published live (--drop-seq) */
    uint64_t corrupted; /* batches published truncated (--corrupt-seq) */
    const uint64_t *drop_seq;
    uint32_t n_drop_seq;
    const uint64_t *corrupt_seq;
    uint32_t n_corrupt_seq;
};

struct kvr_emp_batch;

/* Opens the sockets and hooks them into `base`. Returns 0, or -1 with a message on stderr. */
int mock_pub_open(struct mock_pub *p, struct event_base *base, const struct mock_cfg *cfg);
void mock_pub_close(struct mock_pub *p);
/* Encodes *b (borrowed) as one batch with the next seq, publishes it and keeps it for replay.
 * Returns 0 or -1. */
int mock_pub_send(struct mock_pub *p, const struct kvr_emp_batch *b, uint32_t n_events);

/* ==== http.c ================================================================================= */

struct mock_req; /* one request in flight (http.c) */

struct mock_stats {
    uint64_t requests;          /* accepted generation requests */
    uint64_t requests_failed;   /* answered with an injected failure */
    uint64_t requests_rejected; /* 4xx / queue full */
    uint64_t prompt_cached;     /* prompt tokens served from the cache */
    uint64_t prompt_uncached;   /* prompt tokens computed */
    uint64_t completion_tokens;
    uint64_t evictions;      /* blocks evicted */
    uint64_t streams_killed; /* --die-after-chunks */
};

struct mock {
    struct mock_cfg cfg;
    struct event_base *base;
    struct evhttp *http;
    struct mock_cache cache;
    struct mock_pub pub;
    int has_pub;
    struct mock_stats st;
    uint32_t running;
    uint32_t waiting;
    struct mock_req *q_head, *q_tail; /* FIFO of waiting requests */
    struct mock_req *live;            /* every request in flight (queued or running) */
    uint64_t next_id;
    uint64_t rng; /* xorshift state for --fail-rate */
};

/* Registers the endpoints on m->http. Returns 0 or -1. */
int mock_http_setup(struct mock *m);
/* Frees requests still queued or running (at shutdown). */
void mock_http_shutdown(struct mock *m);

#endif
