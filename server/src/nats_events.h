/* nats_events.h - KV events from NATS subjects: RouterEvent JSON, Dynamo's event plane.
 *
 * Besides the engines' ZMQ streams (kv_subscriber.h), a model may take its KV events from a NATS
 * subject (model option nats_subject=SUBJECT), as Dynamo's routers do: each message is a
 * RouterEvent, a JSON array of them or newline-delimited RouterEvents (the shapes of
 * POST /v1/events, kvr/event_json.h). With nats_stream=STREAM, the subject is read through an
 * ordered JetStream consumer of that stream, from its first message: a replica that (re)starts
 * replays what it missed, in order, so it catches up without gaps (a re-applied store is a
 * no-op, and the order makes a replay converge on the live state); libnats's ordered consumer
 * recreates itself after a gap or a reconnection, resuming after the last message delivered.
 *
 *   NATS ──▶ libnats delivery thread ──▶ decode ──▶ srv_model_apply_events (bootstrap hold,
 *                                                   index in bounded holds, policy hooks)
 *
 * Bad messages are counted (kvrouter_nats_events_*) and logged at most every 10 s per subject;
 * the good events of a message with some bad ones are applied.
 *
 * Thread-safety: new/start/stop/free from the main thread; metrics from any thread.
 */
#ifndef KVR_SRV_NATS_EVENTS_H
#define KVR_SRV_NATS_EVENTS_H

#include <stddef.h>

struct srv;
struct srv_prom;
struct srv_nats_events;

/* Creates the subscriber for every model of s with a nats_subject (none: *out = NULL, KVR_OK).
 * s borrowed. KVR_OK, KVR_EINVAL or KVR_ENOMEM (err says why). */
int srv_nats_events_new(struct srv *s, const char *nats_url, struct srv_nats_events **out,
                        char *err, size_t err_len);

/* Connects (retrying for ever in the background) and subscribes. KVR_OK or KVR_EIO with err
 * (for instance a nats_stream that the server does not have). */
int srv_nats_events_start(struct srv_nats_events *ne, char *err, size_t err_len);

void srv_nats_events_free(struct srv_nats_events *ne); /* NULL is fine */

/* kvrouter_nats_events_* families, per subject. ne may be NULL. */
void srv_nats_events_metrics(struct srv_nats_events *ne, struct srv_prom *p);

#endif
