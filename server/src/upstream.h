/* upstream.h - HTTP client requests to workers over per-thread keep-alive pools.
 *
 *   thread ─┬─ pool(worker 7, gen 3) ─ [evcon busy] [evcon idle] [evcon idle] ...  (<= cap)
 *           └─ pool(worker 9, gen 5) ─ [evcon busy]
 *
 * Each HTTP thread keeps, per worker, up to cfg.upstream_pool evhttp client connections on its
 * own event base; a request takes an idle one (most recently used first), else opens a new one
 * while under the cap, else queues on the least loaded (evhttp sends queued requests in order
 * on the same connection). A pool holds a reference on its worker; once the worker is removed
 * the thread's 1 s sweep closes the idle connections and drops the pool when nothing is busy.
 *
 * A request reports, through its ops, the response head (status, headers) as soon as it is
 * parsed, every piece of body as it arrives (no buffering: SSE flows through chunk by chunk),
 * and the end: complete, or failed with a kind (connect, timeout, midstream). An optional
 * deadline cancels it (kind timeout). srv_up_cancel stops it silently (no more callbacks);
 * it may be called from inside its own callbacks.
 *
 * Thread-safety: the owning HTTP thread only.
 */
#ifndef KVR_SRV_UPSTREAM_H
#define KVR_SRV_UPSTREAM_H

#include <stddef.h>
#include <stdint.h>

#include "server.h"

struct evkeyvalq;
struct srv_up;

struct srv_up_ops {
    /* The response head arrived (status and headers in resp). Return 0 to read the body, or -1
     * to abandon the request (on_done follows with ok = 0, kind = -1). */
    int (*on_head)(void *ctx, struct evhttp_request *resp);
    /* A piece of body (the callee takes what it wants; the rest is dropped). */
    void (*on_data)(void *ctx, struct evbuffer *data);
    /* The end. ok: 1 = the whole response arrived (status is its code); 0 = failed, kind is an
     * enum srv_uperr (CONNECT before any response, TIMEOUT, MIDSTREAM after the head) or -1 when
     * on_head abandoned it. `reused` says whether the connection had served a request before
     * (a failure there may just be a stale keep-alive). The request is freed after this. */
    void (*on_done)(void *ctx, int ok, int kind, int status, int reused);
};

/* Sends method path (prefixed with the worker's URL prefix) with body[0..len) (borrowed,
 * copied). Headers: hop-by-hop and Host/Content-Length are dropped from `hdrs` (the client's,
 * may be NULL), Host and Content-Type are set. deadline_ms (0 = none) bounds the whole request.
 * *out (may be NULL) receives the handle, valid until on_done or srv_up_cancel. Returns KVR_OK,
 * KVR_EINVAL (the worker has no URL) or KVR_ENOMEM; nothing is called back on failure. */
int srv_up_request(struct srv_thread *t, struct srv_worker *w, int method, const char *path,
                   const struct evkeyvalq *hdrs, const char *ctype, const void *body, size_t len,
                   uint64_t deadline_ms, const struct srv_up_ops *ops, void *ctx,
                   struct srv_up **out);

/* Stops a request: no further callbacks, the connection is reset if it was in use. */
void srv_up_cancel(struct srv_up *u);

/* Pauses / resumes reading the response (backpressure when the client is slower). */
void srv_up_pause(struct srv_up *u, int paused);

/* Thread housekeeping: drop pools of removed workers, trim idle connections. */
void srv_pools_sweep(struct srv_thread *t);
/* Thread exit: close every pool (no request may be pending). */
void srv_pools_free(struct srv_thread *t);

/* Copies the response headers of resp (borrowed) into dst, minus hop-by-hop ones. */
void srv_up_copy_response_headers(struct evhttp_request *resp, struct evkeyvalq *dst);

#endif
