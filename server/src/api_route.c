/* api_route.c - the lifecycle of a request routed with POST /v1/route when another proxy does
 * the forwarding:
 *
 *   POST   /v1/route/{id}/first_token   prefill done (the first output token came back)
 *   DELETE /v1/route/{id}               the request finished (also POST /v1/route/{id}/free)
 *
 * Both answer 200 {"status":"ok","request_id":id} or 404 when the id is unknown (never booked,
 * already freed, or expired after 300 s). Ids of requests the router proxies itself
 * (SRV_REQ_ID_PROXY, route.h) answer 409: their booking belongs to the proxied flow, which marks
 * the first token and frees it. POST /v1/route itself lives in proxy.c. */
#include <event2/http.h>
#include <stdlib.h>
#include <string.h>

#include "api.h"
#include "clock.h"
#include "jsonw.h"
#include "kvr/err.h"
#include "route.h"
#include "server.h"

void srv_api_route_id(struct srv_hreq *h)
{
    const char *p = h->path + strlen("/v1/route/");
    char *end;
    unsigned long long id = strtoull(p, &end, 10);
    if (end == p || (*end != '\0' && *end != '/')) {
        srv_reply_error(h, 404, "no route for %s (expected /v1/route/{request_id}[/...])", h->path);
        return;
    }
    int first_token = 0;
    if (strcmp(end, "/first_token") == 0 && h->method == EVHTTP_REQ_POST)
        first_token = 1;
    else if (!((*end == '\0' && h->method == EVHTTP_REQ_DELETE) ||
               (strcmp(end, "/free") == 0 && h->method == EVHTTP_REQ_POST))) {
        srv_reply_header(h, "Allow", *end == '\0' ? "DELETE" : "POST");
        srv_reply_error(h, *end == '\0' || strcmp(end, "/free") == 0 ? 405 : 404,
                        "use POST /v1/route/{id}/first_token, DELETE /v1/route/{id} or POST "
                        "/v1/route/{id}/free");
        return;
    }
    struct srv_model *m = srv_models_of_request(&h->t->srv->models, id);
    if (m != NULL && (id & SRV_REQ_ID_PROXY) != 0) {
        srv_reply_error(h, 409,
                        "request %llu is forwarded by this router's proxy, which owns its "
                        "booking (it is marked and freed when the proxied request ends)",
                        id);
        return;
    }
    int rc = KVR_ENOTFOUND;
    if (m != NULL)
        rc = first_token ? kvr_load_first_token(m->load, id, srv_now_ms())
                         : kvr_load_release(m->load, id, srv_now_ms());
    if (rc != KVR_OK) {
        srv_reply_error(h, 404,
                        "request %llu is not active (never routed, already freed or "
                        "expired)",
                        id);
        return;
    }
    struct srv_jw w;
    kvr_buf_reset(&h->t->out);
    srv_jw_init(&w, &h->t->out);
    srv_jw_raw(&w, "{\"status\":\"ok\",\"request_id\":");
    srv_jw_u64(&w, id);
    srv_jw_char(&w, '}');
    srv_reply_out(h, 200, w.err);
}
