/* replica_wire.h - the messages router replicas exchange over NATS to share booked load.
 *
 * Every replica publishes on one subject (--replica-subject, default "kvrouter.replicas") and
 * subscribes to it, so the messages of one publisher reach every other replica in publication
 * order (NATS keeps per-publisher order on a subject). A message is one JSON object:
 *
 *   {"v": 1, "type": "ops", "router_id": 4711, "seq": 12, "ts_us": 1733054400123456,
 *    "events": [
 *      {"model": "llama:default", "request_id": 17592186044417, "t_us": 1733054400123000,
 *       "worker": {"worker_id": 3, "dp_rank": 0},
 *       "data": {"add_request": {"prefill_tokens": 96, "seq_hashes": [123, 456]}}},
 *      {"model": "llama:default", "request_id": 17592186044417, "t_us": ...,
 *       "worker": {"worker_id": 3, "dp_rank": 0}, "data": "mark_prefill_completed"},
 *      {"model": ..., "request_id": ..., "worker": ..., "data": "free"},
 *      {"model": "m:t", "worker": {...}, "t_us": ..., "data": {"approx": {"local_hashes": [..]}}},
 *      {"model": "llama:default", "data": "state_begin"},  ... add_request ...,
 *      {"model": "llama:default", "data": "state_end"}]}
 *   {"v": 1, "type": "sync", "router_id": 4711, "seq": 13, "ts_us": ..., "target": 0}
 *   {"v": 1, "type": "hello", ...}      heartbeat (also implied by any other message)
 *   {"v": 1, "type": "bye", ...}        clean shutdown: drop what that replica booked now
 *
 * The event shape follows Dynamo's ActiveSequenceEventBatch (spec/scheduling.md, replica sync:
 * request_id, worker, data = AddRequest | MarkPrefillCompleted | Free, router_id); we add the
 * model key (one tracker per model), `t_us` (wall clock when the op happened, for the sync-delay
 * figure), approximate-mode recordings and full-state sections. `add_request` carries the
 * prefill tokens the booking counts (the publisher already applied its overlap) and the
 * request's sequence hashes (its decode blocks). `seq` counts a publisher's messages from 1: a
 * gap means lost messages, answered by asking that publisher for its full state. A state section
 * (`state_begin`, the publisher's active requests of that model as add_request events,
 * `state_end`) replaces everything the receiver holds from that publisher for that model.
 * `sync` asks `target` (0 = everyone) to publish a full state. Integers are exact u64; hashes
 * may also be negative i64 (two's complement), as everywhere in kvrouter.
 *
 * Thread-safety: none (pure functions over caller buffers).
 */
#ifndef KVR_SRV_REPLICA_WIRE_H
#define KVR_SRV_REPLICA_WIRE_H

#include <stddef.h>
#include <stdint.h>

#include "jsonr.h"
#include "jsonw.h"

#define SRV_RW_VERSION 1
#define SRV_RW_MAX_EVENTS 4096       /* events in one message (decoder limit) */
#define SRV_RW_MAX_HASHES (1u << 20) /* hashes in one message, all events together */

enum srv_rw_type {
    SRV_RW_OPS = 1,
    SRV_RW_SYNC = 2,
    SRV_RW_HELLO = 3,
    SRV_RW_BYE = 4,
};

enum srv_rw_kind {
    SRV_RW_ADD = 1,         /* data.add_request */
    SRV_RW_FIRST = 2,       /* "mark_prefill_completed" */
    SRV_RW_FREE = 3,        /* "free" */
    SRV_RW_APPROX = 4,      /* data.approx */
    SRV_RW_STATE_BEGIN = 5, /* "state_begin" */
    SRV_RW_STATE_END = 6,   /* "state_end" */
};

struct srv_rw_header {
    int type;           /* enum srv_rw_type */
    uint32_t pad_;      /* zero */
    uint64_t router_id; /* publisher (never 0) */
    uint64_t seq;       /* publisher's message sequence, from 1 */
    uint64_t ts_us;     /* publisher's wall clock at publication (µs since the epoch) */
    uint64_t target;    /* sync: the replica asked (0 = all) */
};

struct srv_rw_event {
    int kind;          /* enum srv_rw_kind */
    uint32_t dp_rank;  /* ADD/FIRST/FREE/APPROX */
    const char *model; /* model key "name:tenant" (borrowed) */
    size_t model_len;
    uint64_t request_id;     /* ADD/FIRST/FREE: the publisher's own request id */
    uint64_t worker_id;      /* ADD/FIRST/FREE/APPROX */
    uint64_t prefill_tokens; /* ADD */
    uint64_t t_us;           /* when it happened (publisher's wall clock), 0 if unknown */
    const uint64_t *hashes;  /* ADD: sequence hashes; APPROX: local hashes (borrowed) */
    size_t n_hashes;
};

/* Writing: begin, any number of events (ops messages only; `first` for the first one), end.
 * Appends through w (borrowed; its sticky error makes every call after a failed allocation a
 * no-op); srv_rw_end returns KVR_OK or KVR_ENOMEM. */
void srv_rw_begin(struct srv_jw *w, const struct srv_rw_header *h);
void srv_rw_event(struct srv_jw *w, const struct srv_rw_event *ev, int first);
int srv_rw_end(struct srv_jw *w, const struct srv_rw_header *h);

/* A decoded message: events point into the document and into `hashes` (caller scratch, grown
 * as needed and owned by the caller: free(dec->hashes) when done). */
struct srv_rw_decoded {
    struct srv_rw_header h;
    struct srv_rw_event *ev; /* ev[0..n_ev) (owned by dec; freed by srv_rw_decoded_free) */
    size_t n_ev, cap_ev;
    uint64_t *hashes; /* arena for every event's hashes (owned by dec) */
    size_t n_hashes, cap_hashes;
};

void srv_rw_decoded_free(struct srv_rw_decoded *dec);

/* Decodes text[0..len) (borrowed; it and doc must outlive dec's strings) with doc (reused per
 * thread). Validates the whole message before returning anything: KVR_OK, KVR_ECORRUPT with a
 * message naming the field in err (unknown type, version, missing or mistyped field, too many
 * events or hashes), or KVR_ENOMEM. Unknown extra members are ignored (forward compatibility);
 * an unknown event kind is an error. */
int srv_rw_decode(struct srv_jdoc *doc, const char *text, size_t len, struct srv_rw_decoded *dec,
                  char *err, size_t err_len);

/* Name of a message type ("ops", ...) or NULL. */
const char *srv_rw_type_name(int type);

#endif
