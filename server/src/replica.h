/* replica.h - several kvrouter replicas that agree on booked load, through NATS.
 *
 * What replicas share (docs/DEPLOYMENT.md):
 *   prefix state  nothing to sync: every replica subscribes to every worker's KV events (ZMQ
 *                 fan-out; optionally a NATS subject, models.h), so each index converges alone
 *   booked load   requests routed and not finished, and approximate-mode recordings: shared here
 *
 *            observer (load tracker / approx recorder, under their mutex)
 *   HTTP ──▶ kvr_load_add ──▶ queue ──flush thread──▶ NATS subject ──▶ other replicas
 *   threads                     (≤ 256 events or ≤ 1 ms per message)      │
 *                                                                         ▼
 *            kvr_load_add(origin = that replica) ◀── NATS delivery thread ◀┘
 *
 * - Each replica has a router id (--replica-id, random by default) and ignores its own echo.
 *   Remote requests enter the same per-model trackers with origin = a small id per remote
 *   replica and request ids mapped to the upper half of the u64 space (local ids stay < 2^53),
 *   so policies see fleet-wide load with no code change.
 * - Liveness: every replica publishes a heartbeat when it has been quiet for --replica-heartbeat
 *   (1 s); a replica silent for --replica-timeout (5 s) is presumed dead and what it booked is
 *   released in every tracker; a clean shutdown says "bye" and is released at once.
 * - Repair: messages carry a per-publisher sequence; a gap (lost messages), a restarted
 *   publisher, a newly seen replica, or our own (re)connection to NATS triggers a full-state
 *   exchange ("sync" request -> each asked replica publishes a state section per model, which
 *   replaces what the receiver holds from it). So after NATS comes back every view converges.
 * - NATS down or partitioned: routing never waits for it; each replica keeps routing on its
 *   local view (remote bookings time out), counts the degraded state (metrics, /readyz detail)
 *   and resyncs on reconnection. Publishing while disconnected goes to libnats's reconnect
 *   buffer; past the queue bound (SRV_REPLICA_MAX_QUEUE ops) ops are dropped, counted, and
 *   repaired by the next full state.
 *
 * Threads: the flush thread (encode + publish, heartbeats, timeouts, state publication) and
 * libnats's own threads (connection I/O, one delivery thread for the subscription, which
 * applies remote ops). The HTTP threads only append to the queue from the observers.
 * Thread-safety: every function may be called from any thread after srv_replica_new.
 */
#ifndef KVR_SRV_REPLICA_H
#define KVR_SRV_REPLICA_H

#include <stddef.h>
#include <stdint.h>

#include "kvr/load.h"

struct srv;
struct srv_model;
struct srv_prom;
struct srv_jw;
struct srv_replica;

#define SRV_REPLICA_MAX_QUEUE 65536u /* queued ops before dropping (then a full state) */
#define SRV_REPLICA_MAX_PEERS 256u   /* remote replicas tracked at once */

struct srv_replica_cfg {
    const char *nats_url;  /* e.g. "nats://127.0.0.1:4222" (borrowed) */
    const char *subject;   /* subject shared by the replicas (borrowed) */
    uint64_t router_id;    /* this replica (non-zero) */
    uint64_t flush_us;     /* max delay of a queued op (1000) */
    uint32_t max_batch;    /* ops per message (256) */
    uint32_t pad_;         /* zero */
    uint64_t heartbeat_ms; /* heartbeat when quiet this long (1000) */
    uint64_t timeout_ms;   /* a replica silent this long is released (5000) */
};

/* Creates the replica link (nothing connects yet). s is borrowed and must outlive it. *out
 * owned; free with srv_replica_free. KVR_OK, KVR_EINVAL (err says why) or KVR_ENOMEM. */
int srv_replica_new(struct srv *s, const struct srv_replica_cfg *cfg, struct srv_replica **out,
                    char *err, size_t err_len);

/* Connects to NATS (asynchronously: a NATS server that is down is retried for ever) and starts
 * the flush thread. KVR_OK, or KVR_EIO with err (bad URL, thread creation). */
int srv_replica_start(struct srv_replica *r, char *err, size_t err_len);

/* Publishes "bye" (after what is queued), closes the connection and joins the thread.
 * Idempotent. */
void srv_replica_stop(struct srv_replica *r);
void srv_replica_free(struct srv_replica *r);

/* Observers the models install (models.h): a local load op or approx recording of model m. Only
 * origin-0 ops are forwarded. Called under the tracker's / recorder's mutex: they only append
 * to the queue. */
void srv_replica_on_load(void *r, struct srv_model *m, const struct kvr_load_op *op);
void srv_replica_on_approx(void *r, struct srv_model *m, uint64_t worker_id, uint32_t dp_rank,
                           const uint64_t *locals, size_t n);

/* Prometheus families (kvrouter_replica_*) and the /readyz detail object
 * {"nats":"connected"|"disconnected"|"connecting","peers":N,"degraded":bool}. r may be NULL
 * (replica sync off: nothing is written). */
void srv_replica_metrics(struct srv_replica *r, struct srv_prom *p);
void srv_replica_ready_detail(struct srv_replica *r, struct srv_jw *w);

/* For tests and the bench: 1 when connected to NATS. */
int srv_replica_connected(struct srv_replica *r);

/* The request id a remote replica's request gets in the local trackers (bit 63 set). */
uint64_t srv_replica_map_id(uint64_t router_id, uint64_t request_id);

#endif
