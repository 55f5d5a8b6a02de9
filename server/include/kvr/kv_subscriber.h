/* kv_subscriber.h - consume engine KV events (vLLM / SGLang ZMQ PUB + msgpack) directly.
 *
 * Design: one thread owns every ZMQ socket and polls them all (zmq_poll), off the request
 * threads. Callers add and remove sources at runtime through a command queue (mutex + pipe the
 * thread polls); each call waits for the thread's answer, so errors come back synchronously.
 *
 *                   ┌──────────── subscriber thread (zmq_poll) ─────────────────────────┐
 *   engine PUB ───▶ │ SUB ─ [topic, seq, payload] ─ seq check ─ decode ─ convert ─ sink() │
 *   engine ROUTER ◀▶│ DEALER (only after a gap): ["", be64(start)] → replies → end marker │
 *   kvr_kvsub_add ─▶│ command queue (pipe wake-up)                                       │
 *                   └────────────────────────────────────────────────────────────────────┘
 *
 * A source is one (worker_id, dp_rank) publisher: one SUB socket (spec/engine-events.md §1; with
 * offset_by_rank the endpoint's TCP port is shifted by dp_rank, inproc/ipc names get "_dp<rank>",
 * and so is the replay endpoint). Per message (§2): exactly 3 frames and an 8-byte big-endian seq,
 * else counted and skipped. Sequence rules:
 *
 *   seq == next (or the first message)      apply (next = the seq after the last applied one)
 *   seq >  next (gap)                       replay endpoint: DEALER request from next, live
 *                                           messages queue until the end marker (both reply forms,
 *                                           2- and 3-frame; end = seq ff*8 or empty payload) or a
 *                                           timeout; then they apply in order, duplicates dropped.
 *                                           No replay endpoint (or replay could not fill it):
 *                                           the missing batches are counted as lost.
 *   seq <  next (publisher restart)         a `cleared` event for the rank, then next = 0 (engines
 *                                           number batches from 0 per process), so a restart seen
 *                                           at seq > 0 is a gap from 0: replayed or counted lost.
 *
 * Restarts behind a reconnect. A restarted publisher may publish before the SUB reconnects (libzmq
 * backs off up to 5 s); those batches never reach the SUB, so "seq went back" would miss it and
 * the new process's seq would pass for a gap in the old stream. So every SUB has a socket monitor
 * (ZMQ_EVENT_DISCONNECTED / CONNECTED / ACCEPTED, read before each live message) and ZMTP
 * heartbeats (a silent peer, e.g. a crashed host, is dropped after 3 intervals). After a
 * disconnect the stream is "broken":
 *   - on reconnect, with a replay endpoint and a batch applied, a probe: a replay request from
 *     the last applied seq. The same publisher still holds that batch: its reply must carry the
 *     same payload (an XXH3 fingerprint is kept of the last applied batch); then the replay just
 *     goes on and fills whatever the outage lost. Anything else (another payload at that seq, no
 *     such batch, a later first batch) means a new publisher: clear the rank and replay from 0.
 *     This catches a restart before the new process publishes anything. A probe that times out
 *     decides nothing (the rule below applies);
 *   - the first live batch after the break: seq == next is a continuation; anything else is a
 *     restart (clear, next = 0, then the gap rule). Without a replay endpoint, a restarted
 *     publisher whose first batch seen happens to be exactly `next` cannot be told apart.
 * Batches published between a probe's request and the subscription taking effect are counted
 * lost (one replay per gap episode).
 *
 * A batch is decoded (kvr/event_msgpack.h), converted (kvr/event_convert.h; event_id = seq, the
 * batch's dp rank overriding the registered one) and handed to the sink in one call. A malformed
 * batch is counted by kind and dialect and skipped; its seq still counts as seen. Each problem
 * kind is logged once per source; conversion warnings at most 3 times per source.
 * Reconnects: libzmq reconnects with exponential backoff (100 ms doubling to 5 s); a socket whose
 * receive fails is re-created after min(10 ms x 2^min(n, 8), 5 s) for the n-th consecutive error
 * (the stream counts as broken then too).
 *
 * Thread-safety: every kvr_kvsub_* function may be called from any thread EXCEPT from inside the
 * sink or log callbacks (they run on the subscriber thread, which would wait for itself).
 */
#ifndef KVR_KV_SUBSCRIBER_H
#define KVR_KV_SUBSCRIBER_H

#include <stddef.h>
#include <stdint.h>

#include "kvr/event.h"
#include "kvr/event_convert.h"
#include "kvr/event_msgpack.h"

typedef struct kvr_kvsub kvr_kvsub_t;

/* Receives the index events of one batch (borrowed; valid during the call only), on the
 * subscriber thread. A non-zero return is counted as a sink error; the stream goes on. */
typedef int (*kvr_kvsub_sink_fn)(void *ctx, const struct kvr_event *ev, size_t n);

enum kvr_kvsub_log_level { KVR_KVSUB_INFO = 0, KVR_KVSUB_WARN = 1, KVR_KVSUB_ERROR = 2 };

/* Receives one log line (borrowed, NUL-terminated, no newline) on the subscriber thread. */
typedef void (*kvr_kvsub_log_fn)(void *ctx, int level, const char *msg);

struct kvr_kvsub_config {
    void *zmq_ctx;          /* borrowed ZMQ context (needed for inproc://); NULL: own one */
    kvr_kvsub_sink_fn sink; /* required */
    void *sink_ctx;
    kvr_kvsub_log_fn log; /* NULL: lines go to stderr */
    void *log_ctx;
    struct kvr_emp_limits limits; /* decoder limits (zeros: defaults) */
    uint32_t replay_timeout_ms;   /* silence that abandons a replay; 0 = 2000 */
    uint32_t max_pending;         /* live batches queued during a replay; 0 = 10000 */
    int64_t max_msg_size;         /* ZMQ_MAXMSGSIZE per frame; 0 = 64 MiB; -1 = unlimited */
    int rcvhwm;                   /* ZMQ_RCVHWM; 0 = 100000 */
    int heartbeat_ms; /* ZMTP heartbeat interval of SUB sockets; a peer silent for 3 intervals
                       * is dropped (and reconnected). 0 = 5000; negative = off */
};

struct kvr_kvsub_source_config {
    uint64_t worker_id;          /* registered worker */
    uint32_t dp_rank;            /* registered rank (a non-nil batch rank overrides it) */
    uint32_t block_size;         /* the model's index block size (> 0) */
    const char *endpoint;        /* engine PUB endpoint, e.g. "tcp://10.0.0.5:5557" (copied) */
    const char *replay_endpoint; /* engine ROUTER endpoint, or NULL (copied) */
    const void *topic;           /* prefix filter on frame 0; NULL/empty = everything (copied) */
    size_t topic_len;
    int offset_by_rank;    /* endpoints are rank 0's: shift them by dp_rank (§1) */
    int bind;              /* bind the SUB (publishers that connect); implied by '*' in endpoint */
    int clear_on_loss;     /* after an unrecoverable gap, clear the rank before going on */
    const char *lora_name; /* LoRA of stored blocks whose event names none (copied; NULL or ""
                            * = none): salts the router's re-hashing (hashing.md §2) */
    struct kvr_convert_opts conv; /* eagle, no_namespace, image token, group filter;
                                   * its worker_id, dp_rank and block_size are ignored */
};

/* Per-source metrics (a consistent snapshot, refreshed after every poll round). */
struct kvr_kvsub_stats {
    uint64_t worker_id;
    uint32_t dp_rank;
    uint32_t has_seq;                 /* a sequence number has been seen */
    uint64_t last_seq;                /* valid iff has_seq */
    uint64_t messages;                /* live messages received (well-formed or not) */
    uint64_t batches;                 /* batches decoded and delivered (live + replayed) */
    uint64_t bad_frames;              /* live messages with a frame count other than 3 */
    uint64_t bad_seq;                 /* live messages whose seq frame is not 8 bytes */
    uint64_t decode_errors;           /* batches the decoder rejected (by kind: dec.errors) */
    uint64_t gaps;                    /* sequence gaps detected */
    uint64_t lost_batches;            /* batches never received (gap without successful replay) */
    uint64_t replay_requests;         /* replay requests sent */
    uint64_t replayed_batches;        /* batches applied from replay replies */
    uint64_t replay_duplicates;       /* replayed or queued batches already applied */
    uint64_t replay_failures;         /* replays abandoned (timeout, queue overflow) */
    uint64_t replay_malformed;        /* replay replies of an unexpected shape */
    uint64_t restarts;                /* publisher restarts (seq went back, a seq other than the
                                       * next after a reconnect, or a failed reconnect probe) */
    uint64_t disconnects;             /* connections the SUB lost (socket monitor) */
    uint64_t restart_probes;          /* reconnect probes sent to the replay endpoint */
    uint64_t clears;                  /* rank clears issued by the subscriber (restart, loss) */
    uint64_t sink_errors;             /* sink calls that returned non-zero */
    uint64_t recv_errors;             /* failed receives */
    uint64_t reconnects;              /* sockets re-created after receive errors */
    uint64_t events[4];               /* index events delivered, by enum kvr_event_kind */
    unsigned dialects;                /* KVR_EMP_DIALECT_* bits seen */
    struct kvr_emp_counters dec;      /* decoder: errors by kind and dialect, tiers, skips */
    struct kvr_convert_counters conv; /* converter: warnings, blocks, tiers */
};

/* Starts a subscriber thread. *out owned (free with kvr_kvsub_free).
 * Returns KVR_OK, KVR_EINVAL (no sink), KVR_ENOMEM or KVR_EIO (thread, pipe or ZMQ failure). */
int kvr_kvsub_new(const struct kvr_kvsub_config *cfg, kvr_kvsub_t **out);

/* Stops the thread, closes every socket and frees everything (NULL is fine). */
void kvr_kvsub_free(kvr_kvsub_t *s);

/* Adds a source (cfg borrowed; strings copied) and connects (or binds) it. *id (optional)
 * receives its id. Returns KVR_OK, KVR_EINVAL (bad endpoint or config), KVR_EEXIST (the
 * (worker_id, dp_rank) is already subscribed), KVR_ENOMEM or KVR_EIO. */
int kvr_kvsub_add(kvr_kvsub_t *s, const struct kvr_kvsub_source_config *cfg, uint32_t *id);

/* Removes a source, closing its sockets (queued batches are dropped).
 * Returns KVR_OK or KVR_ENOTFOUND. */
int kvr_kvsub_remove(kvr_kvsub_t *s, uint32_t id);

/* Looks up the source of (worker_id, dp_rank): returns 1 and sets *id, or 0. */
int kvr_kvsub_find(kvr_kvsub_t *s, uint64_t worker_id, uint32_t dp_rank, uint32_t *id);

/* Copies the metrics of source `id` into *out. Returns KVR_OK or KVR_ENOTFOUND. */
int kvr_kvsub_stats(kvr_kvsub_t *s, uint32_t id, struct kvr_kvsub_stats *out);

/* The endpoint of data-parallel rank `dp_rank` given rank 0's (spec §1): TCP port + rank,
 * "inproc://x" / "ipc://x" -> "..._dp<rank>" (rank 0 unchanged). Writes a NUL-terminated string
 * into out[cap]. Returns KVR_OK, KVR_EINVAL (unsupported form, or a TCP port that is not a
 * number or overflows) or KVR_ERANGE (cap too small). */
int kvr_kvsub_rank_endpoint(const char *base, uint32_t dp_rank, char *out, size_t cap);

#endif
