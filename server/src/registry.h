/* registry.h - registering and removing workers with everything that hangs off them: KV-event
 * subscriptions, index state, booked load, approximate-mode timers. Shared by the indexer API
 * (/register, /unregister), /v1/workers and the configured workers at start.
 *
 * Add: subscribe each rank that has a ZMQ endpoint (the subscriber refuses a rank that is
 * already subscribed: 409), then register the worker/ranks; a failed registration undoes the
 * subscriptions. Remove: unregister, unsubscribe the released sources, remove the rank (or the
 * worker) from the model's index, drop the worker's booked load (whole-worker removal; a single
 * rank's load drains as its requests finish or expire) and its approximate-mode timers.
 *
 * Thread-safety: thread-safe (blocking only for the subscriber's command round trip).
 */
#ifndef KVR_SRV_REGISTRY_H
#define KVR_SRV_REGISTRY_H

#include <stdint.h>

#include "jsonw.h"
#include "server.h"

struct srv_reg_spec {
    uint64_t id;
    const char *url;     /* or NULL */
    const char *labels;  /* or NULL */
    const char *zmq;     /* rank `first_rank`'s endpoint (or rank 0's with offset), or NULL */
    const char *replay;  /* or NULL */
    const char *topic;   /* ZMQ topic prefix; NULL = the model's; "" = every message */
    const char *lora;    /* LoRA of stored blocks whose events name none, or NULL */
    uint32_t first_rank; /* /register: the rank */
    uint32_t n_ranks;    /* ranks first_rank .. first_rank + n_ranks - 1 */
    int offset_by_rank;  /* /v1/workers: rank k's endpoints are rank 0's shifted by k */
    int merge;           /* /register semantics (add ranks to an existing worker) */
};

/* Returns an HTTP status: 201 created, 400/409/503 with err. */
int srv_reg_add(struct srv *s, struct srv_model *m, const struct srv_reg_spec *spec, char *err,
                size_t err_len);

/* Removes rank dp_rank (or all when < 0) of worker id. Returns 200, or 404 with err. */
int srv_reg_remove(struct srv *s, struct srv_model *m, uint64_t id, int64_t dp_rank, char *err,
                   size_t err_len);

/* Labels given as a JSON object of strings (borrowed; NULL = none) appended to out as the
 * registry's "k=v,k=v" form. KVR_OK, KVR_ECORRUPT (err names the label: not a string, empty, or
 * holding ',' or, in a key, '=') or KVR_ENOMEM. */
struct json_object;
int srv_reg_labels_from_json(struct json_object *labels, struct kvr_buf *out, char *err,
                             size_t err_len);

/* Writes one worker as a JSON object (GET /v1/workers). Takes
 * the worker's mutex briefly; call under the registry read lock (srv_workers_foreach). */
void srv_worker_json(struct srv *s, struct srv_worker *w, struct srv_jw *jw);

#endif
