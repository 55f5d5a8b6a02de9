/* api_events.c - POST /v1/events?model=M: RouterEvents over HTTP.
 *
 * The body is a JSON array of RouterEvents, one RouterEvent, or newline-delimited JSON, in any
 * shape kvr/event_json.h accepts. Every event is decoded and applied on its own (bounded write
 * holds): a bad event never stops the others. Answer:
 *   200 {"applied": n, "rejected": [{"index": i, "error": "..."}, ...]}
 * where index is the event's position in the body; decode errors name the field path, apply
 * errors use Dynamo's names (ParentBlockNotFound, BlockNotFound, ...). A body that is not JSON
 * at all is a 400. The model is "M" or "M:tenant" (default: the model "default").
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api.h"
#include "jsonw.h"
#include "kvr/err.h"
#include "kvr/event_json.h"
#include "server.h"

struct rejected {
    size_t index;
    int code;        /* decode (KVR_ECORRUPT/EDOMAIN) or apply error */
    const char *msg; /* decode message (borrowed from the report), or NULL for apply errors */
};

static int by_index(const void *a, const void *b)
{
    const struct rejected *x = a, *y = b;
    return x->index < y->index ? -1 : x->index > y->index;
}

void srv_api_events(struct srv_hreq *h)
{
    struct srv *s = h->t->srv;
    struct srv_thread *t = h->t;
    char model[256] = "default";
    srv_query_param(h, "model", model, sizeof(model));
    struct srv_model *m = srv_models_find_spec(&s->models, model, strlen(model));
    if (m == NULL) {
        srv_reply_error(h, 404, "no model '%s' (query parameter model=NAME[:TENANT])", model);
        return;
    }
    size_t len;
    const char *body = srv_body(h, &len);
    struct kvr_event_list l;
    kvr_event_list_init(&l);
    size_t cap = 256;
    struct kvr_event_json_error *errs = NULL;
    struct kvr_event_json_report rep;
    int rc;
    for (;;) { /* decode; again with room for every error if there were more than cap */
        free(errs);
        errs = malloc(cap * sizeof(*errs));
        if (errs == NULL) {
            srv_reply_error(h, 503, "out of memory");
            kvr_event_list_free(&l);
            return;
        }
        memset(&rep, 0, sizeof(rep));
        rep.errors = errs;
        rep.cap = cap;
        kvr_event_list_reset(&l);
        rc = kvr_event_json_decode_body(body, len, &l, &rep);
        if (rc != KVR_OK || rep.failed <= rep.n_errors)
            break;
        cap = rep.failed;
    }
    if (rc == KVR_ECORRUPT) {
        srv_reply_error(h, 400, "%s", rep.n_errors ? errs[0].msg : "the body is not JSON");
        goto out;
    }
    if (rc != KVR_OK) {
        srv_reply_kvr(h, rc, "cannot decode the events: %s", kvr_strerror(rc));
        goto out;
    }
    int *results = l.n ? malloc(l.n * sizeof(*results)) : NULL;
    struct rejected *rej = malloc((rep.n_errors + l.n + 1) * sizeof(*rej));
    if ((l.n && results == NULL) || rej == NULL) {
        free(results);
        free(rej);
        srv_reply_error(h, 503, "out of memory");
        goto out;
    }
    size_t failed_apply = l.n ? kvr_index_apply_batch(m->index, l.ev, l.n, results) : 0;
    if (l.n && m->on_events != NULL)
        m->on_events(m->on_events_ctx, m, l.ev, l.n);
    size_t nrej = 0;
    for (size_t k = 0; k < rep.n_errors; k++)
        rej[nrej++] = (struct rejected){errs[k].index, errs[k].code, errs[k].msg};
    /* body index of each decoded event: walk the body indices, skipping decode failures
     * (errs are in body order) */
    size_t e = 0, bi = 0;
    for (size_t k = 0; k < l.n; k++, bi++) {
        while (e < rep.n_errors && errs[e].index == bi) {
            e++;
            bi++;
        }
        if (results[k] != KVR_OK) /* BlockNotFound too: the other hashes were removed */
            rej[nrej++] = (struct rejected){bi, results[k], NULL};
    }
    qsort(rej, nrej, sizeof(*rej), by_index);
    srv_stat_add(&t->st.events_applied, l.n - failed_apply);
    srv_stat_add(&t->st.events_rejected, rep.failed + failed_apply);
    srv_stat_add_shared(&m->http_events, l.n - failed_apply);

    struct srv_jw w;
    kvr_buf_reset(&t->out);
    srv_jw_init(&w, &t->out);
    srv_jw_raw(&w, "{\"applied\":");
    srv_jw_u64(&w, l.n - failed_apply);
    srv_jw_raw(&w, ",\"rejected\":[");
    for (size_t k = 0; k < nrej; k++) {
        if (k > 0)
            srv_jw_char(&w, ',');
        srv_jw_raw(&w, "{\"index\":");
        srv_jw_u64(&w, rej[k].index);
        srv_jw_raw(&w, ",\"error\":");
        srv_jw_cstr(&w, rej[k].msg != NULL ? rej[k].msg : kvr_strerror(rej[k].code));
        srv_jw_char(&w, '}');
    }
    srv_jw_raw(&w, "]}");
    free(results);
    free(rej);
    srv_reply_out(h, 200, w.err);
out:
    free(errs);
    kvr_event_list_free(&l);
}
