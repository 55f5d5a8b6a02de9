/* route.h - the routing core shared by /v1/route and the OpenAI proxy.
 *
 *   request blocks (local + sequence hashes)
 *     │
 *     ├─ candidates: every rank of every worker of the model (workers.h); ineligible ones
 *     │  (unhealthy, breaker open) are kept out of the policy's sight
 *     ├─ overlap: kvr_index_find_matches on the model's index (blocks per rank)
 *     ├─ load: kvr_load_query (active prefill tokens, decode blocks, new blocks, requests)
 *     ├─ policy: srv_policy_select -> ranked candidates (best first)
 *     └─ decision: the pick plus, when proxying (need_url), up to SRV_MAX_ALT alternatives
 *        for retries (referenced); /v1/route answers with the pick alone
 *
 * Booking: srv_route_book adds the request to the model's load tracker for the current pick
 * (and, on an approximate model, records its blocks for that rank with a TTL); first token and
 * release follow (srv_route_first_token, srv_route_release), each at most once per booking.
 * A retry releases the booking and books the next alternative.
 *
 * Thread-safety: one decision belongs to one thread; the engine calls are thread-safe.
 */
#ifndef KVR_SRV_ROUTE_H
#define KVR_SRV_ROUTE_H

#include <stddef.h>
#include <stdint.h>

#include "jsonw.h"
#include "policy.h"
#include "server.h"

#define SRV_MAX_ALT 8

/* Request ids share one space per model (models.h: slot << SRV_REQ_ID_SHIFT | sequence). The
 * ids of requests the proxy forwards itself carry this bit, so the lifecycle routes meant for
 * external proxies (/v1/route/{id}/first_token, DELETE /v1/route/{id}) can refuse them (409):
 * only the proxy that owns such a booking may mark or free it. */
#define SRV_REQ_ID_PROXY (1ull << (SRV_REQ_ID_SHIFT - 1))

struct srv_route_in {
    struct srv_model *m;
    const uint64_t *locals; /* [n_blocks] (borrowed) */
    const uint64_t *seqs;   /* [n_blocks] (borrowed) */
    size_t n_blocks;
    uint32_t isl; /* input tokens */
    const char *session;
    size_t session_len;
    const char *lora;
    size_t lora_len;
    const char *policy; /* policy header value or NULL */
    size_t policy_len;
    const struct srv_kv *headers; /* routing headers for the policy (borrowed) */
    size_t n_headers;
    double overlap_weight; /* < 0 unset */
    double temperature;    /* < 0 unset */
    int need_url;          /* proxying: only candidates with an HTTP URL, and the request id
                            * is marked proxy-owned (SRV_REQ_ID_PROXY) */
    struct srv_jw *scores; /* if set: "candidates":[...] is written here */
};

struct srv_pick {
    struct srv_worker *w; /* referenced */
    uint32_t dp_rank;
    uint32_t overlap; /* blocks */
};

struct srv_decision {
    struct srv_model *m;
    uint64_t request_id;
    struct srv_pick pick[SRV_MAX_ALT + 1]; /* pick[0] best */
    size_t n_pick;
    size_t cur;        /* pick in use */
    uint32_t n_blocks; /* request blocks */
    uint32_t isl;
    int fallback;       /* the built-in policy decided after a policy failure */
    const char *policy; /* name of the deciding policy (static/borrowed) */
    int booked;         /* pick[cur] holds a booking */
    int first_token;    /* its first token was marked */
};

/* Decides. KVR_OK; KVR_ENOTFOUND (no worker registered for the model; err set); KVR_EBUSY (no
 * candidate is eligible; err set); KVR_ENOMEM. On success d holds references (free with
 * srv_route_decision_free). */
int srv_route_decide(struct srv_thread *t, const struct srv_route_in *in, struct srv_decision *d,
                     char *err, size_t err_len);

/* Books pick[cur] (seqs/locals borrowed: the request's blocks). KVR_OK or the tracker's error. */
int srv_route_book(struct srv_thread *t, struct srv_decision *d, const uint64_t *locals,
                   const uint64_t *seqs, size_t n_blocks);
void srv_route_first_token(struct srv_decision *d);
void srv_route_release(struct srv_decision *d);

/* Moves to the next alternative (releasing the booking first). Returns 1 if there is one. */
int srv_route_next(struct srv_decision *d);

/* Drops the references (and a booking still held). */
void srv_route_decision_free(struct srv_decision *d);

#endif
