/* api_events.c - POST /v1/events?model=M: RouterEvents over HTTP.
 *
 * The body is a JSON array of RouterEvents, one RouterEvent, or newline-delimited JSON, in any
 * shape kvr/event_json.h accepts. Every event is decoded and applied on its own (bounded write
 * holds): a bad event never stops the others. Answer:
 *   200 {"applied": n, "rejected": [{"index": i, "error": "..."}, ...]}
 * where index is the event's position in the body; decode errors name the field path, apply
 * errors use Dynamo's names (ParentBlockNotFound, BlockNotFound, ...). A body that is not JSON
 * at all is a 400. The model is "M" or "M:tenant" (default: the model "default").
 *
 * Where the work runs: a body below EVENTS_INLINE_BYTES is decoded and applied on the HTTP
 * thread that received it (microseconds to a millisecond). A larger one (up to --max-body, 8 MiB
 * by default: a second or so of decoding) would stall every other connection of that thread, so
 * it is moved out of the request (one copy) into a job for the control thread (thread.h), which
 * answers through the thread's queue; the thread's own counters are updated when the answer
 * comes back. Both paths share events_run, so they answer byte for byte the same.
 */
#include <event2/buffer.h>
#include <event2/http.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api.h"
#include "jsonw.h"
#include "kvr/err.h"
#include "kvr/event_json.h"
#include "server.h"
#include "thread.h"

#define EVENTS_INLINE_BYTES (128u << 10)

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

/* Writes {"error": msg} into out; returns status. */
static int error_body(struct kvr_buf *out, int status, const char *msg)
{
    return srv_jw_error_body(out, msg) == KVR_OK ? status : 503;
}

/* Decodes body[0..len) and applies it to m; writes the JSON answer (or {"error"}) into out
 * (reset first) and the counts into *applied / *rejected. Returns the HTTP status (503 when
 * out of memory, out then possibly empty). Any thread. */
static int events_run(struct srv_model *m, const char *body, size_t len, struct kvr_buf *out,
                      uint64_t *applied, uint64_t *rejected)
{
    *applied = *rejected = 0;
    struct kvr_event_list l;
    kvr_event_list_init(&l);
    size_t cap = 256;
    struct kvr_event_json_error *errs = NULL;
    struct kvr_event_json_report rep;
    int rc, status;
    for (;;) { /* decode; again with room for every error if there were more than cap */
        free(errs);
        errs = malloc(cap * sizeof(*errs));
        if (errs == NULL) {
            kvr_event_list_free(&l);
            return error_body(out, 503, "out of memory");
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
        status = error_body(out, 400, rep.n_errors ? errs[0].msg : "the body is not JSON");
        goto out;
    }
    if (rc != KVR_OK) {
        char msg[160];
        snprintf(msg, sizeof(msg), "cannot decode the events: %s", kvr_strerror(rc));
        status = error_body(out, srv_status_of(rc), msg);
        goto out;
    }
    int *results = l.n ? malloc(l.n * sizeof(*results)) : NULL;
    struct rejected *rej = malloc((rep.n_errors + l.n + 1) * sizeof(*rej));
    if ((l.n && results == NULL) || rej == NULL) {
        free(results);
        free(rej);
        status = error_body(out, 503, "out of memory");
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
    *applied = l.n - failed_apply;
    *rejected = rep.failed + failed_apply;
    srv_stat_add_shared(&m->http_events, l.n - failed_apply);

    struct srv_jw w;
    kvr_buf_reset(out);
    srv_jw_init(&w, out);
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
    status = w.err == KVR_OK ? 200 : error_body(out, 503, "out of memory");
out:
    free(errs);
    kvr_event_list_free(&l);
    return status;
}

/* ==== the control-thread job ================================================================== */

static void events_job_run(struct srv_control *c, struct srv_job *j)
{
    (void)c;
    j->status = events_run(j->ctx, j->arg, j->arg_len, &j->body, &j->counts[0], &j->counts[1]);
}

static void count_events(struct srv_thread *t, uint64_t applied, uint64_t rejected)
{
    srv_stat_add(&t->st.events_applied, applied);
    srv_stat_add(&t->st.events_rejected, rejected);
}

static void events_job_done(struct srv_thread *t, struct srv_job *j)
{
    count_events(t, j->counts[0], j->counts[1]);
}

/* Hands the body to the control thread (moved out of the request into the job). */
static void events_submit(struct srv_hreq *h, struct srv_model *m, size_t len)
{
    struct srv_job *j = srv_job_new(NULL, len);
    struct evbuffer *in = evhttp_request_get_input_buffer(h->req);
    if (j == NULL || evbuffer_remove(in, j->arg, len) != (int)len) {
        if (j != NULL)
            srv_job_free(j);
        srv_reply_error(h, 503, "out of memory");
        return;
    }
    j->ctx = m;
    j->run = events_job_run;
    j->done = events_job_done;
    srv_stat_add(&h->t->st.jobs_events, 1);
    srv_job_submit(h, j);
}

/* ==== POST /v1/events ========================================================================= */

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
    size_t len = evbuffer_get_length(evhttp_request_get_input_buffer(h->req));
    if (len >= EVENTS_INLINE_BYTES && len <= INT32_MAX) {
        events_submit(h, m, len);
        return;
    }
    const char *body = srv_body(h, &len);
    uint64_t applied, rejected;
    int status = events_run(m, body, len, &t->out, &applied, &rejected);
    count_events(t, applied, rejected);
    srv_reply_out(h, status, KVR_OK);
}
