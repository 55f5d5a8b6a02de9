/* peer.h - bootstrap from a peer replica: the workers and the index of a running kvrouter.
 *
 * A replica started with --peers URL[,URL...] must end up with exactly the index the others
 * have, without losing an event between the peer's dump and its own live streams. The order
 * (Dynamo's standalone indexer, spec/http-api.md §1 and §4):
 *
 *   srv_new         models start HELD (srv_models.hold_new): their ZMQ batches are kept, in order
 *   bootstrap thread
 *     1. GET {peer}/v1/models, GET {peer}/v1/workers: create the models and register the
 *        workers (their ZMQ subscriptions connect now, into the hold)
 *     2. wait --bootstrap-wait (1 s: the SUB sockets' slow-joiner window)
 *     3. GET {peer}/dump and apply it (the first peer that answers; else our own --snapshot)
 *     4. release every model: the kept batches apply after the dump, then live ones
 *     5. ready (/readyz 200)
 *
 * Re-applying an event the dump already reflects is harmless (stores of held blocks and
 * removals of absent ones are no-ops), which is why the kept batches converge on the live state.
 * Booked load comes separately, as the full states the other replicas publish when a new
 * replica appears on NATS (replica.h).
 *
 * The dump reader accepts both /dump shapes (spec/http-api.md §2): {"key": {"block_size": N,
 * "events": [...]}} and the older {"key": [...] | {"error": ...}}.
 *
 * Thread-safety: srv_peer_* run on the bootstrap thread; srv_peer_apply_dump is reentrant.
 */
#ifndef KVR_SRV_PEER_H
#define KVR_SRV_PEER_H

#include <stddef.h>
#include <stdint.h>

struct srv;

/* What a dump application did. */
struct srv_peer_dump_stats {
    size_t models;   /* sections applied */
    size_t events;   /* events applied */
    size_t rejected; /* events that did not decode, or the index refused */
    size_t skipped;  /* sections skipped (block size conflict, error entries) */
};

/* Applies a /dump body text[0..len) (borrowed) to s's models (created when missing; approx
 * models are not touched by dumps, events models only). KVR_OK (see st; individual bad events
 * are counted, not fatal), KVR_ECORRUPT (not a dump: err says why; nothing applied), or
 * KVR_ENOMEM. */
int srv_peer_apply_dump(struct srv *s, const char *text, size_t len, struct srv_peer_dump_stats *st,
                        char *err, size_t err_len);

/* Starts the bootstrap thread (s->cfg->peers set). The thread sets s->ready when done. */
int srv_peer_bootstrap_start(struct srv *s, char *err, size_t err_len);
/* Asks it to stop and joins it (idempotent; safe when never started). */
void srv_peer_bootstrap_join(struct srv *s);

#endif
