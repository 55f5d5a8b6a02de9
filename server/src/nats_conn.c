/* nats_conn.c - shared NATS connection settings (see nats_conn.h). */
#include "nats_conn.h"

#include <stddef.h>

natsStatus srv_nats_options(natsOptions **out, const char *url, const char *name,
                            natsConnectionHandler connected, void *closure)
{
    natsOptions *o = NULL;
    natsStatus st = natsOptions_Create(&o);
    if (st == NATS_OK)
        st = natsOptions_SetURL(o, url);
    if (st == NATS_OK)
        st = natsOptions_SetName(o, name);
    if (st == NATS_OK)
        st = natsOptions_SetMaxReconnect(o, -1);
    if (st == NATS_OK)
        st = natsOptions_SetReconnectWait(o, 200);
    if (st == NATS_OK)
        st = natsOptions_SetRetryOnFailedConnect(o, true, connected, closure);
    if (st != NATS_OK) {
        natsOptions_Destroy(o);
        o = NULL;
    }
    *out = o;
    return st;
}

natsStatus srv_nats_connect(natsConnection **nc, natsOptions *opts, int *up)
{
    natsStatus st = natsConnection_Connect(nc, opts);
    *up = st == NATS_OK;
    return st == NATS_NOT_YET_CONNECTED ? NATS_OK : st;
}
