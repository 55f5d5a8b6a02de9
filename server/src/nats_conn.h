/* nats_conn.h - the NATS connection settings every kvrouter client shares (replica sync,
 * NATS-fed KV events): reconnect for ever every 200 ms, and a first connection that may fail
 * (the server is retried in the background; routing never waits for NATS).
 *
 * Thread-safety: pure setup, called before the connection exists.
 */
#ifndef KVR_SRV_NATS_CONN_H
#define KVR_SRV_NATS_CONN_H

#include <nats/nats.h>

/* Creates *out (owned; natsOptions_Destroy) for url (borrowed, may list several servers) with
 * the client name `name`; `connected` (may be NULL) runs when a first connection that could not
 * be made at once succeeds later. NATS_OK or the failing call's status (*out then NULL). */
natsStatus srv_nats_options(natsOptions **out, const char *url, const char *name,
                            natsConnectionHandler connected, void *closure);

/* Connects with opts; a server that is not up yet is not an error (*up = 0, libnats retries).
 * *nc owned (natsConnection_Destroy). */
natsStatus srv_nats_connect(natsConnection **nc, natsOptions *opts, int *up);

#endif
