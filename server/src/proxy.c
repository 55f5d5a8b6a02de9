/* proxy.c - one routed request from parse to last byte: POST /v1/route (decide and book) and the
 * OpenAI-compatible proxy (decide, book, forward, stream back, retry, release).
 *
 *   parse body ─▶ tokens? ──────────────────────────────────┐
 *             └─▶ text ─▶ worker /tokenize (async) ─────────┤ (failure: route without overlap)
 *                      └─▶ bytes tokenizer ──────────────────┤
 *                                                            ▼
 *   hash blocks (local + sequence) ─▶ decide (route.c) ─▶ book load on the pick
 *     /v1/route: reply {worker, url, overlap, request_id}; the booking stays until
 *                /v1/route/{id}/first_token and DELETE /v1/route/{id} (or expiry)
 *     proxy:     forward the client's body unchanged to the pick's URL
 *                  connect error / 5xx / 429 before any byte reached the client
 *                    ─▶ breaker failure (429: neutral), release, next alternative after a
 *                       backoff (a failure on a reused keep-alive connection is first retried
 *                       once on the same worker: the worker may just have closed it);
 *                       nothing left to try and every attempt's connection failed ─▶ 503
 *                       naming the workers (all down); else 502 (504 on a timeout)
 *                  head ─▶ SSE or chunked: start the client reply, pass every chunk through
 *                          as it arrives; with Content-Length: collect, reply in one piece
 *                  first body byte ─▶ prefill done (load tracker first_token)
 *                  end ─▶ release the load, breaker success, finish the reply
 *                  worker fails mid-stream ─▶ release, cut the client connection
 *                  client leaves ─▶ cancel the worker request, release the load
 *
 * The load is booked once per attempt and released exactly once (srv_route_release is
 * idempotent per booking); every exit path goes through flow_free, which releases what is left.
 */
#include <event2/buffer.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>
#include <json-c/json.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "api.h"
#include "clock.h"
#include "fastjson.h"
#include "jsonw.h"
#include "kvr/err.h"
#include "kvr/hash.h"
#include "models.h"
#include "policy.h"
#include "route.h"
#include "server.h"
#include "tokenize.h"
#include "upstream.h"

#define MAX_TOKENS (1u << 22)  /* tokens per request we hash (4 Mi) */
#define PAUSE_BYTES (1u << 20) /* client backlog that pauses reading the worker */

enum flow_kind { FLOW_ROUTE = 0, FLOW_COMPLETIONS = 1, FLOW_CHAT = 2 };

struct flow {
    struct srv_live live;
    struct srv_conn_watch watch;
    struct srv_hreq h;
    struct srv_thread *t;
    struct srv_model *m;
    int kind;
    /* routing input */
    uint64_t *locals; /* owned */
    uint64_t *seqs;   /* owned */
    size_t n_blocks;
    uint32_t isl;
    char *session; /* owned or NULL */
    char *lora;
    char *policy_hdr;
    double overlap_weight;
    double temperature;
    int want_scores;
    int book;
    struct srv_kv *hdrs; /* routing headers for the policy (owned; each name+value one block) */
    size_t n_hdrs;
    /* forwarding */
    char *body; /* the client's body (owned) */
    size_t body_len;
    char ctype[128];
    char *tok_body; /* /tokenize request body (owned) */
    size_t tok_len;
    struct srv_worker *tok_worker; /* referenced while tokenizing */
    /* state */
    struct srv_decision d;
    int decided;
    struct srv_up *up; /* current worker request */
    struct event *timer;
    int acquired; /* a breaker permission is held for the current attempt */
    int probe;
    uint32_t retries;
    int same_retry_done;
    int started; /* the client reply started (stream) */
    int paused;  /* reading from the worker is paused until the client catches up */
    struct evbuffer *buf;
    int resp_status;
    int got_first;
    uint64_t t_attempt_ns;
    uint64_t t_first_ns;
    /* every attempt's connection failed: the answer is 503 naming them (all workers down) */
    uint32_t n_attempts;
    uint32_t n_connect_failed;
    char down[256]; /* "worker 1 (http://...), worker 2 (...)" */
};

static void attempt(struct flow *f);
static void decide_and_go(struct flow *f);
static void report_outcome(struct flow *f, int status, uint64_t t_att, const char *error);

/* ==== lifetime ================================================================================ */

static void free_headers(struct flow *f);

static void flow_free(struct flow *f)
{
    srv_live_del(&f->live);
    if (f->h.req != NULL)
        srv_unwatch(&f->h);
    if (f->up != NULL)
        srv_up_cancel(f->up);
    f->up = NULL;
    if (f->acquired && f->decided)
        srv_worker_report(&f->t->srv->workers, f->d.pick[f->d.cur].w, -1, f->probe, srv_now_ms());
    if (f->timer != NULL)
        event_free(f->timer);
    if (f->decided)
        srv_route_decision_free(&f->d);
    if (f->tok_worker != NULL)
        srv_worker_unref(f->tok_worker);
    if (f->buf != NULL)
        evbuffer_free(f->buf);
    free_headers(f);
    free(f->locals);
    free(f->seqs);
    free(f->session);
    free(f->lora);
    free(f->policy_hdr);
    free(f->body);
    free(f->tok_body);
    free(f->hdrs);
    free(f);
}

/* Adds a routing header (name lower-cased) to f->hdrs. */
static int add_header(struct flow *f, const char *name, const char *value)
{
    size_t nl = strlen(name), vl = strlen(value);
    if (f->n_hdrs >= 64 || nl > 256 || vl > 4096)
        return KVR_OK; /* policies get the first 64; oversized ones are skipped */
    struct srv_kv *v = realloc(f->hdrs, (f->n_hdrs + 1) * sizeof(*v));
    if (v == NULL)
        return KVR_ENOMEM;
    f->hdrs = v;
    char *mem = malloc(nl + vl + 2);
    if (mem == NULL)
        return KVR_ENOMEM;
    for (size_t k = 0; k < nl; k++)
        mem[k] = (char)((name[k] >= 'A' && name[k] <= 'Z') ? name[k] + 32 : name[k]);
    mem[nl] = '\0';
    memcpy(mem + nl + 1, value, vl + 1);
    v[f->n_hdrs].name = mem;
    v[f->n_hdrs].name_len = (uint32_t)nl;
    v[f->n_hdrs].value = mem + nl + 1;
    v[f->n_hdrs].value_len = (uint32_t)vl;
    f->n_hdrs++;
    return KVR_OK;
}

static void free_headers(struct flow *f)
{
    for (size_t k = 0; k < f->n_hdrs; k++)
        free((char *)f->hdrs[k].name);
    f->n_hdrs = 0;
}

static void end_attempt_worker(struct flow *f)
{
    if (f->decided && f->t_attempt_ns != 0) {
        struct srv_worker *w = f->d.pick[f->d.cur].w;
        atomic_fetch_sub_explicit(&w->in_flight, 1, memory_order_relaxed);
        f->t_attempt_ns = 0;
    }
}

static void flow_gone(struct srv_conn_watch *w)
{
    struct flow *f = (struct flow *)((char *)w - offsetof(struct flow, watch));
    srv_stat_add(&f->t->st.proxy_client_gone, 1);
    end_attempt_worker(f);
    srv_hreq_gone(&f->h);
    flow_free(f);
}

static void flow_kill(struct srv_live *l)
{
    struct flow *f = (struct flow *)((char *)l - offsetof(struct flow, live));
    end_attempt_worker(f);
    srv_unwatch(&f->h);
    f->h.req = NULL; /* evhttp_free releases it with its connection */
    flow_free(f);
}

/* ==== replies ================================================================================= */

static void fail(struct flow *f, int status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void fail(struct flow *f, int status, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    srv_reply_error(&f->h, status, "%s", msg);
    flow_free(f);
}

static void reply_route(struct flow *f, struct kvr_buf *scores)
{
    struct srv_thread *t = f->t;
    const struct srv_pick *p = &f->d.pick[f->d.cur];
    struct srv_jw w;
    kvr_buf_reset(&t->out);
    srv_jw_init(&w, &t->out);
    srv_jw_raw(&w, "{\"worker_id\":");
    srv_jw_u64(&w, p->w->id);
    srv_jw_raw(&w, ",\"dp_rank\":");
    srv_jw_u64(&w, p->dp_rank);
    srv_jw_raw(&w, ",\"url\":");
    srv_jw_cstr(&w, p->w->url);
    srv_jw_raw(&w, ",\"overlap_blocks\":");
    srv_jw_u64(&w, p->overlap);
    srv_jw_raw(&w, ",\"required_blocks\":");
    srv_jw_u64(&w, f->n_blocks);
    srv_jw_raw(&w, ",\"isl_tokens\":");
    srv_jw_u64(&w, f->isl);
    srv_jw_raw(&w, ",\"request_id\":");
    srv_jw_u64(&w, f->d.request_id);
    srv_jw_raw(&w, ",\"booked\":");
    srv_jw_bool(&w, f->d.booked);
    srv_jw_raw(&w, ",\"model\":");
    srv_jw_cstr(&w, f->m->key);
    srv_jw_raw(&w, ",\"policy\":");
    srv_jw_cstr(&w, f->d.policy);
    srv_jw_raw(&w, ",\"fallback\":");
    srv_jw_bool(&w, f->d.fallback);
    if (scores != NULL && scores->len > 0) {
        srv_jw_char(&w, ',');
        srv_jw_rawn(&w, scores->data, scores->len);
    }
    srv_jw_char(&w, '}');
    srv_reply_out(&f->h, 200, w.err);
}

/* ==== deciding ================================================================================ */

static int hash_tokens(struct flow *f, const uint32_t *tokens, size_t n)
{
    uint32_t bs = f->m->block_size;
    size_t nb = kvr_hash_block_count(n, bs, 0);
    f->isl = n > UINT32_MAX ? UINT32_MAX : (uint32_t)n;
    free(f->locals);
    free(f->seqs);
    f->locals = f->seqs = NULL;
    f->n_blocks = 0;
    if (nb == 0)
        return KVR_OK;
    f->locals = malloc(nb * sizeof(uint64_t));
    f->seqs = malloc(nb * sizeof(uint64_t));
    if (f->locals == NULL || f->seqs == NULL)
        return KVR_ENOMEM;
    struct kvr_hash_opts o = {0};
    if (f->lora != NULL)
        o.seed = kvr_hash_salt(NULL, 0, f->lora, strlen(f->lora));
    size_t got;
    int rc = kvr_hash_blocks(tokens, n, bs, &o, f->locals, nb, &got);
    if (rc != KVR_OK)
        return rc;
    kvr_hash_chain(f->locals, got, f->seqs);
    f->n_blocks = got;
    return KVR_OK;
}

static void decide_and_go(struct flow *f)
{
    struct srv_thread *t = f->t;
    char err[256];
    struct kvr_buf scores;
    struct srv_jw sw;
    kvr_buf_init(&scores, NULL);
    srv_jw_init(&sw, &scores);
    struct srv_route_in in = {.m = f->m,
                              .locals = f->locals,
                              .seqs = f->seqs,
                              .n_blocks = f->n_blocks,
                              .isl = f->isl,
                              .session = f->session,
                              .session_len = f->session ? strlen(f->session) : 0,
                              .lora = f->lora,
                              .lora_len = f->lora ? strlen(f->lora) : 0,
                              .policy = f->policy_hdr,
                              .policy_len = f->policy_hdr ? strlen(f->policy_hdr) : 0,
                              .headers = f->hdrs,
                              .n_headers = f->n_hdrs,
                              .overlap_weight = f->overlap_weight,
                              .temperature = f->temperature,
                              .need_url = f->kind != FLOW_ROUTE,
                              .scores = f->want_scores ? &sw : NULL};
    uint64_t t0 = srv_now_ns();
    int rc = srv_route_decide(t, &in, &f->d, err, sizeof(err));
    srv_hist_observe(&t->st.decision, srv_hist_latency(), (srv_now_ns() - t0) / 1000);
    if (rc != KVR_OK) {
        kvr_buf_free(&scores);
        if (rc == KVR_ENOTFOUND || rc == KVR_EBUSY)
            fail(f, 503, "%s", err);
        else
            fail(f, srv_status_of(rc), "routing failed: %s", err[0] ? err : kvr_strerror(rc));
        return;
    }
    f->decided = 1;
    if (f->book || f->kind != FLOW_ROUTE) {
        rc = srv_route_book(t, &f->d, f->locals, f->seqs, f->n_blocks);
        if (rc != KVR_OK) {
            kvr_buf_free(&scores);
            fail(f, srv_status_of(rc), "cannot book the request's load: %s", kvr_strerror(rc));
            return;
        }
    }
    if (f->kind == FLOW_ROUTE) {
        reply_route(f, sw.err == KVR_OK ? &scores : NULL);
        kvr_buf_free(&scores);
        f->d.booked = 0; /* the booking lives on until /v1/route/{id}/... or expiry */
        flow_free(f);
        return;
    }
    kvr_buf_free(&scores);
    attempt(f);
}

/* ==== the worker call ========================================================================= */

static int can_retry(const struct flow *f)
{
    return f->retries < f->t->srv->cfg->retry_max && f->d.cur + 1 < f->d.n_pick;
}

static int fwd_head(void *ctx, struct evhttp_request *resp)
{
    struct flow *f = ctx;
    int status = evhttp_request_get_response_code(resp);
    f->resp_status = status;
    if ((status >= 500 || status == 429) && can_retry(f))
        return -1; /* abandon before any byte reaches the client; on_done retries */
    if (f->h.req == NULL)
        return -1;
    struct evkeyvalq *oh = evhttp_request_get_output_headers(f->h.req);
    srv_up_copy_response_headers(resp, oh);
    char v[64];
    snprintf(v, sizeof(v), "%llu:%u", (unsigned long long)f->d.pick[f->d.cur].w->id,
             f->d.pick[f->d.cur].dp_rank);
    evhttp_add_header(oh, "x-kvrouter-worker", v);
    snprintf(v, sizeof(v), "%llu", (unsigned long long)f->d.request_id);
    evhttp_add_header(oh, "x-kvrouter-request-id", v);
    struct evkeyvalq *ih = evhttp_request_get_input_headers(resp);
    const char *ct = evhttp_find_header(ih, "Content-Type");
    const char *cl = evhttp_find_header(ih, "Content-Length");
    int sse = ct != NULL && strncasecmp(ct, "text/event-stream", 17) == 0;
    if (cl != NULL && !sse) {
        f->buf = evbuffer_new();
        if (f->buf == NULL)
            return -1;
    } else {
        srv_reply_start(&f->h, status, evhttp_request_get_response_code_line(resp));
        f->started = 1;
        srv_stat_add(&f->t->st.proxy_streams, 1);
    }
    return 0;
}

static void fwd_data(void *ctx, struct evbuffer *data)
{
    struct flow *f = ctx;
    if (!f->got_first && evbuffer_get_length(data) > 0) {
        f->got_first = 1;
        f->t_first_ns = srv_now_ns();
        srv_route_first_token(&f->d);
        srv_hist_observe(&f->t->st.ttft, srv_hist_latency(),
                         (f->t_first_ns - f->t_attempt_ns) / 1000);
    }
    if (f->started) {
        srv_reply_chunk(&f->h, data);
        if (!f->paused && f->up != NULL && srv_reply_pending(&f->h) > PAUSE_BYTES) {
            /* backpressure: the client reads slower than the worker writes; stop reading the
             * worker until the queued bytes have reached the client (flow_drained) */
            srv_up_pause(f->up, 1);
            f->paused = 1;
            srv_stat_add(&f->t->st.proxy_pauses, 1);
        }
    } else if (f->buf != NULL) {
        evbuffer_add_buffer(f->buf, data);
    }
}

static void flow_drained(struct srv_conn_watch *w)
{
    struct flow *f = (struct flow *)((char *)w - offsetof(struct flow, watch));
    if (f->paused && f->up != NULL) {
        f->paused = 0;
        srv_up_pause(f->up, 0);
    }
}

static void on_backoff(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    attempt(arg);
}

/* Schedules the next attempt (next alternative, or the same worker when same = 1). Returns 0,
 * or -1 when there is nothing left to try. */
static int retry(struct flow *f, int same)
{
    struct srv_thread *t = f->t;
    const struct srv_config *cfg = t->srv->cfg;
    uint64_t delay = 0;
    if (same) {
        srv_route_release(&f->d);
        f->same_retry_done = 1;
    } else {
        if (!can_retry(f))
            return -1;
        srv_stat_add_shared(&f->d.pick[f->d.cur].w->retried, 1);
        if (!srv_route_next(&f->d))
            return -1;
        f->retries++;
        f->same_retry_done = 0;
        delay = cfg->retry_backoff_ms;
        for (uint32_t k = 1; k < f->retries && delay < cfg->retry_backoff_max_ms; k++)
            delay *= 2;
        if (delay > cfg->retry_backoff_max_ms)
            delay = cfg->retry_backoff_max_ms;
        delay = (uint64_t)((double)delay * (0.8 + 0.4 * srv_thread_uniform(t)));
    }
    srv_stat_add(&t->st.proxy_retries, 1);
    if (srv_route_book(t, &f->d, f->locals, f->seqs, f->n_blocks) != KVR_OK)
        return -1;
    if (delay == 0) {
        attempt(f);
        return 0;
    }
    if (f->timer == NULL && (f->timer = evtimer_new(t->base, on_backoff, f)) == NULL)
        return -1;
    struct timeval tv = {(time_t)(delay / 1000), (suseconds_t)(delay % 1000) * 1000};
    evtimer_add(f->timer, &tv);
    return 0;
}

static void fwd_done(void *ctx, int ok, int kind, int status, int reused)
{
    struct flow *f = ctx;
    struct srv_thread *t = f->t;
    struct srv_workers *ws = &t->srv->workers;
    struct srv_worker *w = f->d.pick[f->d.cur].w;
    uint64_t now = srv_now_ms();
    f->up = NULL;
    uint64_t t_att = f->t_attempt_ns;
    end_attempt_worker(f);
    if (ok) {
        int verdict = status >= 500 ? 0 : status == 429 ? -1 : 1;
        srv_worker_report(ws, w, verdict, f->probe, now);
        f->acquired = 0;
        srv_stat_add_shared(verdict > 0 ? &w->ok : &w->failed, 1);
        if (status >= 500)
            srv_stat_add(&t->st.upstream_errors[SRV_UPERR_STATUS_5XX], 1);
        else if (status == 429)
            srv_stat_add(&t->st.upstream_errors[SRV_UPERR_STATUS_429], 1);
        srv_hist_observe(&t->st.upstream, srv_hist_latency(), (srv_now_ns() - t_att) / 1000);
        report_outcome(f, status, t_att, NULL);
        srv_route_release(&f->d);
        if (f->started)
            srv_reply_end(&f->h);
        else
            srv_reply_evbuf(&f->h, status, NULL, f->buf);
        flow_free(f);
        return;
    }
    /* failed */
    int retry_status = kind < 0 ? f->resp_status : 0;
    int verdict = retry_status == 429 ? -1 : 0;
    srv_worker_report(ws, w, verdict, f->probe, now);
    f->acquired = 0;
    if (verdict == 0)
        srv_stat_add_shared(&w->failed, 1);
    int ek = kind >= 0 ? kind : (retry_status == 429 ? SRV_UPERR_STATUS_429 : SRV_UPERR_STATUS_5XX);
    srv_stat_add(&t->st.upstream_errors[f->started ? SRV_UPERR_MIDSTREAM : ek], 1);
    srv_route_release(&f->d);
    if (f->started) { /* bytes already reached the client: nothing to retry */
        report_outcome(f, f->resp_status, t_att, "the worker failed mid-stream");
        srv_logf(t->srv->log, SRV_LOG_WARN, t->name,
                 "worker %llu (%s) failed mid-stream; cutting the client stream",
                 (unsigned long long)w->id, w->url);
        srv_reply_abort(&f->h);
        flow_free(f);
        return;
    }
    if (f->buf != NULL) {
        evbuffer_free(f->buf);
        f->buf = NULL;
    }
    f->got_first = 0;
    if (kind == SRV_UPERR_CONNECT) {
        f->n_connect_failed++;
        char who[160];
        snprintf(who, sizeof(who), "worker %llu (%s)", (unsigned long long)w->id,
                 w->url ? w->url : "no url");
        if (strstr(f->down, who) == NULL) {
            size_t dl = strlen(f->down);
            snprintf(f->down + dl, sizeof(f->down) - dl, "%s%s", dl ? ", " : "", who);
        }
    }
    int same = kind == SRV_UPERR_CONNECT && reused && !f->same_retry_done;
    report_outcome(f, retry_status, t_att,
                   kind == SRV_UPERR_TIMEOUT   ? "timeout"
                   : kind == SRV_UPERR_CONNECT ? "connection failed"
                   : retry_status              ? "retryable status"
                                               : "the response broke off");
    if (retry(f, same) == 0)
        return;
    if (f->n_connect_failed == f->n_attempts)
        fail(f, 503, "no worker of %s can be reached: connection failed to %s (%u attempt(s))",
             f->m->key, f->down, f->n_attempts);
    else if (kind == SRV_UPERR_TIMEOUT)
        fail(f, 504, "worker %llu timed out", (unsigned long long)w->id);
    else
        fail(f, 502, "worker %llu: %s after %u attempt(s)", (unsigned long long)w->id,
             kind == SRV_UPERR_CONNECT ? "connection failed" : "the response broke off",
             f->retries + 1);
}

static const struct srv_up_ops fwd_ops = {fwd_head, fwd_data, fwd_done};

/* Tells the policy how the request ended (its on_response hook, if it has one). */
static void report_outcome(struct flow *f, int status, uint64_t t_att, const char *error)
{
    const struct srv_pick *p = &f->d.pick[f->d.cur];
    struct srv_policy_req rq = {.model = f->m->key,
                                .session = f->session,
                                .session_len = f->session ? strlen(f->session) : 0,
                                .lora = f->lora,
                                .lora_len = f->lora ? strlen(f->lora) : 0,
                                .policy = f->policy_hdr,
                                .policy_len = f->policy_hdr ? strlen(f->policy_hdr) : 0,
                                .headers = f->hdrs,
                                .n_headers = f->n_hdrs,
                                .locals = f->locals,
                                .seqs = f->seqs,
                                .request_id = f->d.request_id,
                                .overlap_weight = f->overlap_weight,
                                .temperature = f->temperature,
                                .isl = f->isl,
                                .blocks = (uint32_t)f->n_blocks,
                                .block_size = f->m->block_size};
    struct srv_policy_cand c;
    memset(&c, 0, sizeof(c));
    c.worker_id = p->w->id;
    c.dp_rank = p->dp_rank;
    c.url = p->w->url;
    c.labels = p->w->labels;
    c.healthy = 1;
    c.overlap = p->overlap;
    uint64_t now = srv_now_ns();
    struct srv_policy_outcome o = {
        .status = status,
        .ttft_ms = f->got_first && t_att ? (double)(f->t_first_ns - t_att) / 1e6 : -1,
        .latency_ms = t_att ? (double)(now - t_att) / 1e6 : -1,
        .error = error};
    srv_policy_on_response(f->t, f->m, &rq, &c, &o);
}

static void attempt(struct flow *f)
{
    struct srv_thread *t = f->t;
    struct srv_workers *ws = &t->srv->workers;
    for (;;) {
        struct srv_pick *p = &f->d.pick[f->d.cur];
        if (srv_worker_acquire(ws, p->w, srv_now_ms(), &f->probe))
            break;
        /* its breaker opened since the decision: try the next one */
        if (!srv_route_next(&f->d) ||
            srv_route_book(t, &f->d, f->locals, f->seqs, f->n_blocks) != KVR_OK) {
            fail(f, 503, "no worker of %s is available (circuit breakers open)", f->m->key);
            return;
        }
    }
    struct srv_pick *p = &f->d.pick[f->d.cur];
    f->acquired = 1;
    f->resp_status = 0;
    f->n_attempts++;
    f->t_attempt_ns = srv_now_ns();
    atomic_fetch_add_explicit(&p->w->in_flight, 1, memory_order_relaxed);
    srv_stat_add(&t->st.proxy_attempts, 1);
    const char *path = f->kind == FLOW_CHAT ? "/v1/chat/completions" : "/v1/completions";
    const struct evkeyvalq *hdrs = f->h.req ? evhttp_request_get_input_headers(f->h.req) : NULL;
    /* may call fwd_done before returning (immediate connect failure): nothing after it */
    int rc = srv_up_request(t, p->w, EVHTTP_REQ_POST, path, hdrs, f->ctype, f->body, f->body_len, 0,
                            &fwd_ops, f, &f->up);
    if (rc != KVR_OK)
        fwd_done(f, 0, SRV_UPERR_CONNECT, 0, 0);
}

/* ==== tokenizing through a worker ============================================================= */

static int tok_head(void *ctx, struct evhttp_request *resp)
{
    (void)ctx;
    return evhttp_request_get_response_code(resp) == 200 ? 0 : -1;
}

static void tok_data(void *ctx, struct evbuffer *data)
{
    struct flow *f = ctx;
    if (f->buf != NULL)
        evbuffer_add_buffer(f->buf, data);
}

static void tok_done(void *ctx, int ok, int kind, int status, int reused)
{
    struct flow *f = ctx;
    struct srv_thread *t = f->t;
    (void)kind;
    (void)reused;
    f->up = NULL;
    int good = 0;
    if (ok && status == 200 && f->buf != NULL) {
        size_t len = evbuffer_get_length(f->buf);
        const char *text = len ? (const char *)evbuffer_pullup(f->buf, -1) : "";
        size_t n = 0;
        if (srv_scratch_tokens(t, MAX_TOKENS < 65536 ? MAX_TOKENS : 65536) == KVR_OK) {
            int rc = srv_tok_parse_answer(text, len, t->tokens, t->cap_tokens, &n);
            if (rc == KVR_ERANGE && srv_scratch_tokens(t, MAX_TOKENS) == KVR_OK)
                rc = srv_tok_parse_answer(text, len, t->tokens, t->cap_tokens, &n);
            good = rc == KVR_OK && hash_tokens(f, t->tokens, n) == KVR_OK;
        }
    }
    if (f->buf != NULL) {
        evbuffer_free(f->buf);
        f->buf = NULL;
    }
    if (f->tok_worker != NULL) {
        srv_worker_unref(f->tok_worker);
        f->tok_worker = NULL;
    }
    if (good) {
        srv_stat_add(&t->st.tokenize_worker_ok, 1);
    } else {
        srv_stat_add(&t->st.tokenize_worker_failed, 1);
        if (srv_log_ratelimit(&t->rl_warn, srv_now_ms(), 10000))
            srv_logf(t->srv->log, SRV_LOG_WARN, t->name,
                     "%s: worker /tokenize failed; routing without overlap", f->m->key);
        f->n_blocks = 0; /* route on load alone */
    }
    decide_and_go(f);
}

static const struct srv_up_ops tok_ops = {tok_head, tok_data, tok_done};

/* Starts the /tokenize call; on any failure routes without overlap. */
static void tokenize_async(struct flow *f)
{
    struct srv_thread *t = f->t;
    struct srv_cand cs[64];
    size_t n = srv_workers_candidates(&t->srv->workers, f->m, srv_now_ms(), cs, 64);
    if (n > 64)
        n = 64;
    size_t eligible = 0;
    for (size_t k = 0; k < n; k++)
        if (cs[k].eligible && cs[k].w->url != NULL)
            cs[eligible++] = cs[k];
    if (eligible == 0 || (f->buf = evbuffer_new()) == NULL) {
        f->n_blocks = 0;
        decide_and_go(f);
        return;
    }
    struct srv_worker *w = cs[(size_t)(srv_thread_uniform(t) * (double)eligible) % eligible].w;
    srv_worker_ref(w);
    f->tok_worker = w;
    int rc =
        srv_up_request(t, w, EVHTTP_REQ_POST, "/tokenize", NULL, "application/json", f->tok_body,
                       f->tok_len, t->srv->cfg->tokenize_timeout_ms, &tok_ops, f, &f->up);
    if (rc != KVR_OK)
        tok_done(f, 0, SRV_UPERR_CONNECT, 0, 0);
}

/* ==== parsing ================================================================================= */

static char *dup_n(const char *s, size_t n)
{
    char *d = malloc(n + 1);
    if (d != NULL) {
        memcpy(d, s, n);
        d[n] = '\0';
    }
    return d;
}

static char *dup_hdr(struct srv_hreq *h, const char *const *names)
{
    for (int k = 0; names[k] != NULL; k++) {
        const char *v = srv_header(h, names[k]);
        if (v != NULL && *v != '\0')
            return strdup(v);
    }
    return NULL;
}

/* Reads a prompt that is a token list ([1,2,3] or [[1,2,3]]): 1 with tokens in t->tokens,
 * 0 if it is not one, -1 on error (err set). */
static int read_token_prompt(struct srv_thread *t, struct json_object *v,
                             const struct kvr_json_path *p, size_t *n, char *err, size_t err_len)
{
    if (v == NULL || !json_object_is_type(v, json_type_array))
        return 0;
    size_t len = json_object_array_length(v);
    struct kvr_json_path e0 = {p, NULL, 0};
    if (len > 0) {
        struct json_object *first = json_object_array_get_idx(v, 0);
        if (first != NULL && json_object_is_type(first, json_type_array)) {
            v = first; /* a batch: route on its first prompt */
            p = &e0;
            len = json_object_array_length(v);
        } else if (first != NULL && json_object_is_type(first, json_type_string)) {
            return 0;
        }
    }
    if (len > MAX_TOKENS) {
        snprintf(err, err_len, "prompt: more than %u tokens", MAX_TOKENS);
        return -1;
    }
    if (srv_scratch_tokens(t, len) != KVR_OK) {
        snprintf(err, err_len, "out of memory");
        return -1;
    }
    if (srv_jread_tokens(&t->jdoc, v, p, t->tokens, t->cap_tokens, n, err, err_len) != KVR_OK)
        return -1;
    return 1;
}

static struct json_object *text_prompt(struct json_object *v)
{
    if (v == NULL)
        return NULL;
    if (json_object_is_type(v, json_type_string))
        return v;
    if (json_object_is_type(v, json_type_array) && json_object_array_length(v) > 0) {
        struct json_object *first = json_object_array_get_idx(v, 0);
        if (first != NULL && json_object_is_type(first, json_type_string))
            return first;
    }
    return NULL;
}

/* Builds the routing input of f from its text (bytes tokenizer, none) or starts the worker
 * tokenizer. Returns 1 if the flow continues asynchronously, 0 if blocks are ready, -1 on error
 * (err set). */
static int prepare_text(struct flow *f, const char *text, size_t len, struct json_object *messages,
                        const char *model_name, char *err, size_t err_len)
{
    struct srv_thread *t = f->t;
    struct kvr_buf flat;
    kvr_buf_init(&flat, NULL);
    if (messages != NULL && f->m->tokenizer != SRV_TOK_WORKER) {
        if (srv_tok_flatten_messages(messages, &flat) != KVR_OK) {
            snprintf(err, err_len,
                     "messages: expected an array of {\"role\", \"content\"} objects");
            kvr_buf_free(&flat);
            return -1;
        }
        text = kvr_buf_cstr(&flat);
        len = flat.len;
    }
    int rc = 0;
    switch (f->m->tokenizer) {
    case SRV_TOK_BYTES: {
        size_t n = srv_tok_bytes_count(len, f->m->byte_chunk);
        if (n > MAX_TOKENS || srv_scratch_tokens(t, n) != KVR_OK) {
            snprintf(err, err_len, "prompt too long");
            rc = -1;
            break;
        }
        n = srv_tok_bytes(text, len, f->m->byte_chunk, t->tokens);
        srv_stat_add(&t->st.tokenize_bytes, 1);
        if (hash_tokens(f, t->tokens, n) != KVR_OK) {
            snprintf(err, err_len, "out of memory");
            rc = -1;
        }
        break;
    }
    case SRV_TOK_WORKER: {
        struct kvr_buf b;
        struct srv_jw w;
        kvr_buf_init(&b, NULL);
        srv_jw_init(&w, &b);
        srv_jw_char(&w, '{');
        if (model_name != NULL) {
            srv_jw_raw(&w, "\"model\":");
            srv_jw_cstr(&w, model_name);
            srv_jw_char(&w, ',');
        }
        if (messages != NULL) {
            srv_jw_raw(&w, "\"messages\":");
            srv_jw_raw(&w, json_object_to_json_string_ext(messages, JSON_C_TO_STRING_PLAIN));
        } else {
            srv_jw_raw(&w, "\"prompt\":");
            srv_jw_str(&w, text, len);
        }
        srv_jw_char(&w, '}');
        if (w.err != KVR_OK) {
            kvr_buf_free(&b);
            snprintf(err, err_len, "out of memory");
            rc = -1;
            break;
        }
        f->tok_body = b.data; /* ownership moves to the flow */
        f->tok_len = b.len;
        f->isl = (uint32_t)(len / 4); /* an estimate, used if tokenizing fails */
        rc = 1;
        break;
    }
    default: /* SRV_TOK_NONE: no overlap, load only */
        f->isl = (uint32_t)(len / 4);
        f->n_blocks = 0;
        break;
    }
    kvr_buf_free(&flat);
    return rc;
}

static struct flow *flow_new(struct srv_hreq *h, int kind)
{
    struct flow *f = calloc(1, sizeof(*f));
    if (f == NULL)
        return NULL;
    f->h = *h;
    f->t = h->t;
    f->kind = kind;
    f->overlap_weight = -1;
    f->temperature = -1;
    f->book = 1;
    f->live.kill = flow_kill;
    f->watch.gone = flow_gone;
    f->watch.drained = flow_drained;
    return f;
}

/* Takes the flow from the (synchronous) handler to its next step. */
static void launch(struct srv_hreq *h, struct flow *f, int async)
{
    srv_live_add(f->t, &f->live);
    srv_watch(&f->h, &f->watch);
    h->req = NULL; /* the flow answers */
    if (async)
        tokenize_async(f);
    else
        decide_and_go(f);
}

/* ==== POST /v1/completions, /v1/chat/completions ============================================== */

/* The routing inputs the request's own HTTP headers carry (proxy and /v1/route alike): the
 * session key (x-kvrouter-session, x-session-id, x-dynamo-session-id), the LoRA
 * (x-kvrouter-lora) and, when allowed, the policy (x-kvrouter-policy), each only where f has
 * none yet; and every x-* header for the policy's req.headers. KVR_OK or KVR_ENOMEM. */
static const char *const session_hdrs[] = {"x-kvrouter-session", "x-session-id",
                                           "x-dynamo-session-id", NULL};
static const char *const lora_hdrs[] = {"x-kvrouter-lora", NULL};
static const char *const pol_hdrs[] = {"x-kvrouter-policy", NULL};

/* 1 if name is one of list (NULL-terminated), case-insensitively. */
static int name_in(const char *const *list, const char *name)
{
    for (; *list != NULL; list++)
        if (strcasecmp(*list, name) == 0)
            return 1;
    return 0;
}

static int read_request_headers(struct flow *f, struct srv_hreq *h)
{
    if (f->session == NULL)
        f->session = dup_hdr(h, session_hdrs);
    if (f->lora == NULL)
        f->lora = dup_hdr(h, lora_hdrs);
    if (f->policy_hdr == NULL && f->t->srv->cfg->allow_policy_header)
        f->policy_hdr = dup_hdr(h, pol_hdrs);
    struct evkeyvalq *ih = evhttp_request_get_input_headers(h->req);
    for (struct evkeyval *kv = ih->tqh_first; kv != NULL; kv = kv->next.tqe_next)
        if ((kv->key[0] == 'x' || kv->key[0] == 'X') && kv->key[1] == '-' &&
            add_header(f, kv->key, kv->value) != KVR_OK)
            return KVR_ENOMEM;
    return KVR_OK;
}

/* Model lookup and the flow's common parts (body copy, content type, session, LoRA, policy
 * header, routing headers). Returns the flow, or NULL after replying. */
static struct flow *proxy_setup(struct srv_hreq *h, int chat, const char *model, size_t model_len,
                                const char *body, size_t len)
{
    struct srv_thread *t = h->t;
    struct srv_model *m = srv_models_for_openai(&t->srv->models, model, model_len);
    if (m == NULL) {
        srv_reply_error(h, 404, "model '%.*s' is not served here (see GET /v1/models)",
                        (int)model_len, model ? model : "");
        return NULL;
    }
    struct flow *f = flow_new(h, chat ? FLOW_CHAT : FLOW_COMPLETIONS);
    if (f == NULL || (f->body = dup_n(body, len)) == NULL)
        goto oom;
    f->m = m;
    f->body_len = len;
    const char *ct = srv_header(h, "Content-Type");
    snprintf(f->ctype, sizeof(f->ctype), "%s", ct != NULL ? ct : "application/json");
    if (read_request_headers(f, h) != KVR_OK)
        goto oom;
    return f;
oom:
    srv_reply_error(h, 503, "out of memory");
    if (f != NULL) {
        f->h.req = NULL;
        flow_free(f);
    }
    return NULL;
}

/* The fast path's view of a completions body: its model and prompt, other members only
 * validated. */
struct cfast {
    const char *model;
    size_t model_len;
    struct srv_fast_value prompt;
    int has_model, has_prompt;
};

static int cfast_member(void *ctx, const char *key, size_t kl, const struct srv_fast_value *v)
{
    struct cfast *c = ctx;
    if (kl == 5 && memcmp(key, "model", 5) == 0) {
        if (c->has_model || (v->type != '"' && v->type != 'n') ||
            memchr(v->p, '\\', v->len) != NULL)
            return 1; /* escapes, duplicates, odd types: the strict path decides */
        c->has_model = 1;
        if (v->type == '"') {
            c->model = v->p + 1;
            c->model_len = v->len - 2;
        }
    } else if (kl == 6 && memcmp(key, "prompt", 6) == 0) {
        if (c->has_prompt)
            return 1;
        c->has_prompt = 1;
        c->prompt = *v;
    }
    return 0;
}

/* A completions body with a token-array prompt, parsed in one pass (no tree). 1 if handled
 * (a reply was sent or the flow launched), 0 to use the strict path. */
static int proxy_fast(struct srv_hreq *h, const char *body, size_t len)
{
    struct srv_thread *t = h->t;
    struct cfast c;
    memset(&c, 0, sizeof(c));
    if (!srv_fast_object(body, len, cfast_member, &c) || !c.has_prompt || c.prompt.type != '[')
        return 0;
    size_t cap = c.prompt.len / 2 + 1; /* at most this many elements */
    if (cap > MAX_TOKENS || srv_scratch_tokens(t, cap) != KVR_OK)
        return 0;
    long n = srv_fast_u32_array(&c.prompt, t->tokens, t->cap_tokens);
    if (n < 0)
        return 0;
    struct flow *f = proxy_setup(h, 0, c.model, c.model_len, body, len);
    if (f == NULL)
        return 1;
    if (hash_tokens(f, t->tokens, (size_t)n) != KVR_OK) {
        srv_reply_error(h, 503, "out of memory");
        f->h.req = NULL;
        flow_free(f);
        return 1;
    }
    launch(h, f, 0);
    return 1;
}

static void proxy(struct srv_hreq *h, int chat)
{
    struct srv_thread *t = h->t;
    struct srv_jdoc *d = &t->jdoc;
    char err[SRV_JERR];
    size_t len;
    const char *body = srv_body(h, &len);
    if (!chat && proxy_fast(h, body, len))
        return;
    if (srv_jdoc_parse(d, body, len, err, sizeof(err)) != KVR_OK) {
        srv_reply_error(h, 400, "%s", err);
        return;
    }
    struct json_object *root = d->root;
    struct flow *f = NULL;
    if (root == NULL || !json_object_is_type(root, json_type_object)) {
        srv_reply_error(h, 400, "the body must be a JSON object");
        goto out;
    }
    const char *model = NULL;
    size_t model_len = 0;
    if (srv_jget_str(d, root, NULL, "model", 0, &model, &model_len, NULL, err, sizeof(err)) !=
        KVR_OK) {
        srv_reply_error(h, 400, "%s", err);
        goto out;
    }
    if ((f = proxy_setup(h, chat, model, model_len, body, len)) == NULL)
        goto out;
    int async = 0;
    if (chat) {
        struct json_object *msgs = NULL;
        if (!srv_jmember(root, "messages", &msgs) || msgs == NULL ||
            !json_object_is_type(msgs, json_type_array)) {
            srv_reply_error(h, 400, "messages: expected an array");
            goto out;
        }
        async = prepare_text(f, NULL, 0, msgs, model, err, sizeof(err));
    } else {
        struct json_object *prompt = NULL;
        if (!srv_jmember(root, "prompt", &prompt) || prompt == NULL) {
            srv_reply_error(h, 400, "prompt: missing");
            goto out;
        }
        struct kvr_json_path pp = {NULL, "prompt", 0};
        size_t n = 0;
        int tk = read_token_prompt(t, prompt, &pp, &n, err, sizeof(err));
        if (tk > 0) {
            if (hash_tokens(f, t->tokens, n) != KVR_OK) {
                srv_reply_error(h, 503, "out of memory");
                goto out;
            }
        } else if (tk == 0) {
            struct json_object *tp = text_prompt(prompt);
            if (tp == NULL) {
                srv_reply_error(h, 400,
                                "prompt: expected a string, a list of token ids, or a list of "
                                "either");
                goto out;
            }
            async =
                prepare_text(f, json_object_get_string(tp), (size_t)json_object_get_string_len(tp),
                             NULL, model, err, sizeof(err));
        } else {
            async = -1;
        }
    }
    if (async < 0) {
        srv_reply_error(h, 400, "%s", err);
        goto out;
    }
    srv_jdoc_release(d);
    launch(h, f, async);
    return;
out:
    srv_jdoc_release(d);
    if (f != NULL) {
        f->h.req = NULL;
        flow_free(f);
    }
}

void srv_api_completions(struct srv_hreq *h)
{
    proxy(h, 0);
}

void srv_api_chat(struct srv_hreq *h)
{
    proxy(h, 1);
}

/* ==== POST /v1/route ========================================================================== */

/* The fast path's view of a /v1/route body: only these members, else the strict path. */
struct rfast {
    struct srv_fast_value v[8];
    int has[8];
};

enum { RF_MODEL, RF_TENANT, RF_TOKENS, RF_HASHES, RF_ISL, RF_BOOK, RF_SCORES, RF_N_ };

static int rfast_member(void *ctx, const char *key, size_t kl, const struct srv_fast_value *v)
{
    static const char *const names[RF_N_] = {"model", "tenant_id", "token_ids", "block_hashes",
                                             "isl",   "book",      "scores"};
    struct rfast *r = ctx;
    for (int k = 0; k < RF_N_; k++)
        if (strlen(names[k]) == kl && memcmp(names[k], key, kl) == 0) {
            if (r->has[k])
                return 1;
            if ((k == RF_MODEL || k == RF_TENANT) &&
                (v->type != '"' || memchr(v->p, '\\', v->len) != NULL))
                return 1;
            if ((k == RF_BOOK || k == RF_SCORES) && v->type != 't' && v->type != 'f')
                return 1;
            r->has[k] = 1;
            r->v[k] = *v;
            return 0;
        }
    return 1; /* any other member: the strict path */
}

/* 1 if handled (replied or launched), 0 to use the strict path. */
static int route_fast(struct srv_hreq *h, const char *body, size_t len)
{
    struct srv_thread *t = h->t;
    struct rfast r;
    memset(&r, 0, sizeof(r));
    if (!srv_fast_object(body, len, rfast_member, &r) || r.has[RF_TOKENS] == r.has[RF_HASHES])
        return 0;
    const char *model = "default", *tenant = NULL;
    size_t model_len = 7, tenant_len = 0;
    if (r.has[RF_MODEL]) {
        model = r.v[RF_MODEL].p + 1;
        model_len = r.v[RF_MODEL].len - 2;
    }
    if (r.has[RF_TENANT]) {
        tenant = r.v[RF_TENANT].p + 1;
        tenant_len = r.v[RF_TENANT].len - 2;
    }
    uint64_t isl = 0;
    if (r.has[RF_ISL] && !srv_fast_uint(&r.v[RF_ISL], UINT32_MAX, &isl))
        return 0;
    struct srv_model *m =
        tenant != NULL ? srv_models_find(&t->srv->models, model, model_len, tenant, tenant_len)
                       : srv_models_find_spec(&t->srv->models, model, model_len);
    if (m == NULL)
        return 0; /* the strict path words the 404 */
    const struct srv_fast_value *arr = &r.v[r.has[RF_TOKENS] ? RF_TOKENS : RF_HASHES];
    size_t cap = arr->len / 2 + 1;
    struct flow *f = NULL;
    if (cap > MAX_TOKENS)
        return 0;
    if (r.has[RF_TOKENS]) {
        if (srv_scratch_tokens(t, cap) != KVR_OK)
            return 0;
        long n = srv_fast_u32_array(arr, t->tokens, t->cap_tokens);
        if (n < 0 || (f = flow_new(h, FLOW_ROUTE)) == NULL)
            return 0;
        f->m = m;
        if (read_request_headers(f, h) != KVR_OK || hash_tokens(f, t->tokens, (size_t)n) != KVR_OK)
            goto oom;
    } else {
        if ((f = flow_new(h, FLOW_ROUTE)) == NULL)
            return 0;
        f->m = m;
        if (read_request_headers(f, h) != KVR_OK)
            goto oom;
        f->locals = malloc(cap * sizeof(uint64_t));
        f->seqs = malloc(cap * sizeof(uint64_t));
        if (f->locals == NULL || f->seqs == NULL)
            goto oom;
        long n = srv_fast_u64_array(arr, f->locals, cap);
        if (n < 0) {
            f->h.req = NULL;
            flow_free(f);
            return 0;
        }
        kvr_hash_chain(f->locals, (size_t)n, f->seqs);
        f->n_blocks = (size_t)n;
        uint64_t full = (uint64_t)n * m->block_size;
        f->isl = (uint32_t)(r.has[RF_ISL] ? isl : full > UINT32_MAX ? UINT32_MAX : full);
    }
    f->book = !r.has[RF_BOOK] || r.v[RF_BOOK].type == 't';
    f->want_scores = r.has[RF_SCORES] && r.v[RF_SCORES].type == 't';
    launch(h, f, 0);
    return 1;
oom:
    srv_reply_error(h, 503, "out of memory");
    f->h.req = NULL;
    flow_free(f);
    return 1;
}

void srv_api_route(struct srv_hreq *h)
{
    struct srv_thread *t = h->t;
    struct srv_jdoc *d = &t->jdoc;
    char err[SRV_JERR];
    size_t len;
    const char *body = srv_body(h, &len);
    if (route_fast(h, body, len))
        return;
    if (srv_jdoc_parse(d, body, len, err, sizeof(err)) != KVR_OK) {
        srv_reply_error(h, 400, "%s", err);
        return;
    }
    struct json_object *root = d->root, *v;
    struct flow *f = NULL;
    if (root == NULL || !json_object_is_type(root, json_type_object)) {
        srv_reply_error(h, 400, "the body must be a JSON object");
        goto out;
    }
    const char *model = "default", *tenant = NULL, *s;
    size_t model_len = 7, tenant_len = 0, sl;
    int present = 0, rc;
    if ((rc = srv_jget_str(d, root, NULL, "model", 0, &model, &model_len, &present, err,
                           sizeof(err))) != KVR_OK ||
        (rc = srv_jget_str(d, root, NULL, "tenant_id", 0, &tenant, &tenant_len, NULL, err,
                           sizeof(err))) != KVR_OK) {
        srv_reply_error(h, 400, "%s", err);
        goto out;
    }
    if (!present)
        model = "default", model_len = 7;
    struct srv_model *m =
        tenant != NULL ? srv_models_find(&t->srv->models, model, model_len, tenant, tenant_len)
                       : srv_models_find_spec(&t->srv->models, model, model_len);
    if (m == NULL) {
        srv_reply_error(h, 404, "no model '%.*s'%s%.*s", (int)model_len, model,
                        tenant ? " tenant " : "", (int)tenant_len, tenant ? tenant : "");
        goto out;
    }
    f = flow_new(h, FLOW_ROUTE);
    if (f == NULL) {
        srv_reply_error(h, 503, "out of memory");
        goto out;
    }
    f->m = m;
    int scores = 0, book = 1;
    double ow = -1, temp = -1;
    if ((rc = srv_jget_bool(d, root, NULL, "scores", &scores, NULL, err, sizeof(err))) != KVR_OK ||
        (rc = srv_jget_bool(d, root, NULL, "book", &book, NULL, err, sizeof(err))) != KVR_OK ||
        (rc = srv_jget_double(d, root, NULL, "overlap_weight", &ow, NULL, err, sizeof(err))) !=
            KVR_OK ||
        (rc = srv_jget_double(d, root, NULL, "temperature", &temp, NULL, err, sizeof(err))) !=
            KVR_OK) {
        srv_reply_error(h, 400, "%s", err);
        goto out;
    }
    f->want_scores = scores;
    f->book = book;
    f->overlap_weight = ow;
    f->temperature = temp;
    static const char *const keys[] = {"session_id", "session", "lora_name", NULL};
    for (int k = 0; keys[k] != NULL; k++) {
        present = 0;
        if (srv_jget_str(d, root, NULL, keys[k], 0, &s, &sl, &present, err, sizeof(err)) !=
            KVR_OK) {
            srv_reply_error(h, 400, "%s", err);
            goto out;
        }
        if (!present)
            continue;
        char **dst = k < 2 ? &f->session : &f->lora;
        if (*dst == NULL && (*dst = dup_n(s, sl)) == NULL) {
            srv_reply_error(h, 503, "out of memory");
            goto out;
        }
    }
    struct json_object *hdrs = NULL;
    if (srv_jmember(root, "headers", &hdrs) && hdrs != NULL) {
        if (!json_object_is_type(hdrs, json_type_object)) {
            srv_reply_error(h, 400, "headers: expected an object of strings");
            goto out;
        }
        json_object_object_foreach(hdrs, hk, hv)
        {
            if (hv == NULL || !json_object_is_type(hv, json_type_string))
                continue;
            const char *val = json_object_get_string(hv);
            if (add_header(f, hk, val) != KVR_OK) {
                srv_reply_error(h, 503, "out of memory");
                goto out;
            }
            if (f->session == NULL && name_in(session_hdrs, hk))
                f->session = strdup(val);
            if (f->policy_hdr == NULL && t->srv->cfg->allow_policy_header && name_in(pol_hdrs, hk))
                f->policy_hdr = strdup(val);
        }
    }
    /* then the request's own HTTP headers: what the body did not give */
    if (read_request_headers(f, h) != KVR_OK) {
        srv_reply_error(h, 503, "out of memory");
        goto out;
    }
    int async = 0;
    size_t n = 0;
    if (srv_jmember(root, "token_ids", &v) && v != NULL) {
        struct kvr_json_path p = {NULL, "token_ids", 0};
        size_t alen = json_object_is_type(v, json_type_array) ? json_object_array_length(v) : 0;
        if (alen > MAX_TOKENS || srv_scratch_tokens(t, alen) != KVR_OK) {
            srv_reply_error(h, 400, "token_ids: too many tokens");
            goto out;
        }
        if (srv_jread_tokens(d, v, &p, t->tokens, t->cap_tokens, &n, err, sizeof(err)) != KVR_OK) {
            srv_reply_error(h, 400, "%s", err);
            goto out;
        }
        if (hash_tokens(f, t->tokens, n) != KVR_OK) {
            srv_reply_error(h, 503, "out of memory");
            goto out;
        }
    } else if (srv_jmember(root, "block_hashes", &v) && v != NULL) {
        struct kvr_json_path p = {NULL, "block_hashes", 0};
        size_t alen = json_object_is_type(v, json_type_array) ? json_object_array_length(v) : 0;
        f->locals = malloc((alen ? alen : 1) * sizeof(uint64_t));
        f->seqs = malloc((alen ? alen : 1) * sizeof(uint64_t));
        if (f->locals == NULL || f->seqs == NULL) {
            srv_reply_error(h, 503, "out of memory");
            goto out;
        }
        if (srv_jread_hashes(d, v, &p, f->locals, alen, &n, err, sizeof(err)) != KVR_OK) {
            srv_reply_error(h, 400, "%s", err);
            goto out;
        }
        kvr_hash_chain(f->locals, n, f->seqs);
        f->n_blocks = n;
        uint64_t isl = (uint64_t)n * m->block_size, given;
        present = 0;
        if (srv_jget_uint(d, root, NULL, "isl", 0, UINT32_MAX, &given, &present, err,
                          sizeof(err)) != KVR_OK) {
            srv_reply_error(h, 400, "%s", err);
            goto out;
        }
        f->isl = (uint32_t)(present ? given : (isl > UINT32_MAX ? UINT32_MAX : isl));
    } else {
        struct json_object *msgs = NULL, *prompt = NULL, *text = NULL;
        srv_jmember(root, "messages", &msgs);
        srv_jmember(root, "prompt", &prompt);
        srv_jmember(root, "text", &text);
        if (msgs != NULL) {
            if (!json_object_is_type(msgs, json_type_array)) {
                srv_reply_error(h, 400, "messages: expected an array");
                goto out;
            }
            async = prepare_text(f, NULL, 0, msgs, NULL, err, sizeof(err));
        } else if (prompt != NULL || text != NULL) {
            struct json_object *pv = prompt != NULL ? prompt : text;
            struct kvr_json_path pp = {NULL, prompt != NULL ? "prompt" : "text", 0};
            int tk = read_token_prompt(t, pv, &pp, &n, err, sizeof(err));
            if (tk > 0) {
                if (hash_tokens(f, t->tokens, n) != KVR_OK) {
                    srv_reply_error(h, 503, "out of memory");
                    goto out;
                }
            } else if (tk == 0) {
                struct json_object *tp = text_prompt(pv);
                if (tp == NULL) {
                    srv_reply_error(h, 400, "%s: expected a string or a list of token ids", pp.key);
                    goto out;
                }
                async = prepare_text(f, json_object_get_string(tp),
                                     (size_t)json_object_get_string_len(tp), NULL, NULL, err,
                                     sizeof(err));
            } else {
                async = -1;
            }
        } else {
            srv_reply_error(h, 400,
                            "give one of token_ids, block_hashes, text, prompt or messages");
            goto out;
        }
    }
    if (async < 0) {
        srv_reply_error(h, 400, "%s", err);
        goto out;
    }
    srv_jdoc_release(d);
    launch(h, f, async);
    return;
out:
    srv_jdoc_release(d);
    if (f != NULL) {
        f->h.req = NULL;
        flow_free(f);
    }
}
