/* api.h - the HTTP handlers, one file per API (api_*.c, proxy.c, admin.c, metrics.c).
 *
 * Every handler receives a request wrapper (server.h) and ends it with exactly one reply. Route
 * table (http.c):
 *
 *   standalone indexer (api_indexer.c)   POST /register  POST /unregister  GET /workers
 *                                        POST /query  POST /query_by_hash  GET /dump
 *   events (api_events.c)                POST /v1/events?model=M
 *   routing service (api_route.c)        POST /v1/route
 *                                        POST /v1/route/{id}/first_token
 *                                        DELETE /v1/route/{id}  (= POST /v1/route/{id}/free)
 *   OpenAI proxy (proxy.c)               POST /v1/completions  POST /v1/chat/completions
 *                                        GET /v1/models
 *   workers (api_workers.c)              GET|POST /v1/workers  GET|DELETE /v1/workers/{id}
 *   admin (admin.c)                      GET /admin/status  POST /admin/policy?model=M
 *                                        POST /admin/reload  POST /admin/snapshot
 *   ops (metrics.c)                      GET /metrics  GET /healthz  GET /readyz
 */
#ifndef KVR_SRV_API_H
#define KVR_SRV_API_H

struct kvr_buf;
struct srv;
struct srv_hreq;

void srv_api_register(struct srv_hreq *h);
void srv_api_unregister(struct srv_hreq *h);
void srv_api_workers_indexer(struct srv_hreq *h);
void srv_api_query(struct srv_hreq *h);
void srv_api_query_by_hash(struct srv_hreq *h);
void srv_api_dump(struct srv_hreq *h);
/* GET /dump's JSON (every model's index as the events that rebuild it) appended to out, on the
 * calling thread. KVR_OK, or KVR_ENOMEM (out then holds a partial text: the caller frees it).
 * Also kvr.admin.dump (policy.c). */
int srv_dump_json(struct srv *s, struct kvr_buf *out);

void srv_api_events(struct srv_hreq *h);

void srv_api_route(struct srv_hreq *h);
void srv_api_route_id(struct srv_hreq *h); /* /v1/route/{id}[/first_token|/free] */

void srv_api_completions(struct srv_hreq *h);
void srv_api_chat(struct srv_hreq *h);
void srv_api_models(struct srv_hreq *h);

void srv_api_v1_workers(struct srv_hreq *h); /* /v1/workers and /v1/workers/{id} */

void srv_api_admin(struct srv_hreq *h); /* /admin/... */

void srv_api_metrics(struct srv_hreq *h);
void srv_api_healthz(struct srv_hreq *h);
void srv_api_readyz(struct srv_hreq *h);

#endif
