/* http.c - the mock worker's OpenAI-compatible endpoints and request lifecycle (see mock.h).
 *
 * Request states and who ends them (each request ends in exactly one reply or one kill):
 *
 *   QUEUED ─admit─▶ PREFILL ─timer─▶ DECODE ─timer x (max_tokens - 1)─▶ complete(): reply
 *                                        └──── after --die-after-chunks chunks ─▶ DYING ─▶ kill()
 *   any state ── client gone (connection close callback) ─▶ finish() frees the detached request
 *
 * libevent contract relied on: when a client disconnects before the reply is complete, evhttp
 * detaches the request (its connection pointer becomes NULL) and calls the connection's close
 * callback; the request then stays ours until a send/end call frees it. The close callback is
 * removed before every reply call, because a reply may free the connection synchronously. */
#include <event2/buffer.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>
#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kvr/err.h"
#include "kvr/event_msgpack.h"
#include "kvr/hash.h"
#include "mock.h"

enum rstate { R_QUEUED = 0, R_PREFILL, R_DECODE, R_DYING };

struct mock_req {
    struct mock *m;
    struct evhttp_request *req;
    struct evhttp_connection *conn; /* NULL once the client is gone */
    struct event *timer;
    struct mock_req *next;                  /* admission queue */
    struct mock_req *live_prev, *live_next; /* mock.live */
    int chat;
    int stream;
    int include_usage;
    int state;         /* enum rstate */
    int gone;          /* the client disconnected */
    int reply_started; /* SSE headers sent */
    char id[48];
    char model[128];
    time_t created;
    uint32_t *tokens;
    size_t n_tokens;
    uint32_t max_tokens;
    uint32_t produced; /* output tokens so far */
    uint32_t chunks;   /* SSE data chunks sent */
    uint32_t cached;   /* prompt tokens served from the cache */
    uint64_t text_seed;
    struct evbuffer *text; /* non-streaming: the completion so far */
};

static void admit_next(struct mock *m);

/* ==== small replies ========================================================================== */

static void send_json(struct evhttp_request *req, int code, const char *reason, json_object *body)
{
    struct evbuffer *buf = evbuffer_new();
    const char *s = json_object_to_json_string_ext(body, JSON_C_TO_STRING_PLAIN |
                                                             JSON_C_TO_STRING_NOSLASHESCAPE);
    evhttp_add_header(evhttp_request_get_output_headers(req), "Content-Type", "application/json");
    if (buf != NULL)
        evbuffer_add(buf, s, strlen(s));
    evhttp_send_reply(req, code, reason, buf);
    if (buf != NULL)
        evbuffer_free(buf);
    json_object_put(body);
}

/* OpenAI-style error body. */
static void send_error(struct evhttp_request *req, int code, const char *type, const char *msg)
{
    json_object *err = json_object_new_object();
    json_object_object_add(err, "message", json_object_new_string(msg));
    json_object_object_add(err, "type", json_object_new_string(type));
    json_object_object_add(err, "code", json_object_new_int(code));
    json_object *body = json_object_new_object();
    json_object_object_add(body, "error", err);
    const char *reason = code == 400   ? "Bad Request"
                         : code == 404 ? "Not Found"
                         : code == 405 ? "Method Not Allowed"
                         : code == 503 ? "Service Unavailable"
                                       : "Error";
    send_json(req, code, reason, body);
}

/* ==== request parsing ======================================================================== */

static json_object *parse_body(struct evhttp_request *req)
{
    struct evbuffer *in = evhttp_request_get_input_buffer(req);
    size_t len = evbuffer_get_length(in);
    const char *p = (const char *)evbuffer_pullup(in, -1);
    if (p == NULL || len == 0)
        return NULL;
    json_tokener *tok = json_tokener_new();
    if (tok == NULL)
        return NULL;
    json_object *o = json_tokener_parse_ex(tok, p, (int)len);
    int ok = json_tokener_get_error(tok) == json_tokener_success &&
             json_tokener_get_parse_end(tok) == len;
    json_tokener_free(tok);
    if (!ok || !json_object_is_type(o, json_type_object)) {
        json_object_put(o);
        return NULL;
    }
    return o;
}

/* Appends token ids from a JSON int array; returns 0 or an error message. */
static const char *token_array(json_object *a, uint32_t **t, size_t *n, size_t *cap)
{
    size_t len = json_object_array_length(a);
    for (size_t i = 0; i < len; i++) {
        json_object *v = json_object_array_get_idx(a, i);
        if (!json_object_is_type(v, json_type_int))
            return "prompt token ids must be integers";
        int64_t x = json_object_get_int64(v);
        if (x < 0 || x > UINT32_MAX)
            return "prompt token id out of range";
        if (*n == *cap) {
            size_t nc = *cap ? *cap * 2 : 64;
            uint32_t *g = realloc(*t, nc * sizeof(*g));
            if (g == NULL)
                return "out of memory";
            *t = g;
            *cap = nc;
        }
        (*t)[(*n)++] = (uint32_t)x;
    }
    return NULL;
}

/* "prompt": "text" | [ids] | ["text"] | [[ids]] (a batch of one). */
static const char *prompt_tokens(struct mock *m, json_object *prompt, uint32_t **t, size_t *n)
{
    size_t cap = 0;
    if (prompt == NULL)
        return "missing prompt";
    if (json_object_is_type(prompt, json_type_array) && json_object_array_length(prompt) == 1) {
        json_object *only = json_object_array_get_idx(prompt, 0);
        if (!json_object_is_type(only, json_type_int))
            prompt = only;
    }
    if (json_object_is_type(prompt, json_type_string)) {
        if (mock_tokenize(json_object_get_string(prompt),
                          (size_t)json_object_get_string_len(prompt), m->cfg.vocab, t, n,
                          &cap) != 0)
            return "out of memory";
        return NULL;
    }
    if (json_object_is_type(prompt, json_type_array)) {
        size_t len = json_object_array_length(prompt);
        if (len > 0 && !json_object_is_type(json_object_array_get_idx(prompt, 0), json_type_int))
            return "batched prompts are not supported";
        return token_array(prompt, t, n, &cap);
    }
    return "prompt must be a string or a list of token ids";
}

/* Chat template: "<role>: <content>\n" per message, then "assistant:"; the text is tokenized. */
static const char *chat_tokens(struct mock *m, json_object *messages, uint32_t **t, size_t *n)
{
    if (messages == NULL || !json_object_is_type(messages, json_type_array))
        return "messages must be a list";
    struct evbuffer *b = evbuffer_new();
    if (b == NULL)
        return "out of memory";
    const char *err = NULL;
    size_t len = json_object_array_length(messages);
    for (size_t i = 0; i < len && err == NULL; i++) {
        json_object *msg = json_object_array_get_idx(messages, i), *role, *content;
        if (!json_object_is_type(msg, json_type_object) ||
            !json_object_object_get_ex(msg, "role", &role) ||
            !json_object_is_type(role, json_type_string)) {
            err = "each message needs a string role";
            break;
        }
        evbuffer_add_printf(b, "%s: ", json_object_get_string(role));
        if (json_object_object_get_ex(msg, "content", &content)) {
            if (json_object_is_type(content, json_type_string)) {
                evbuffer_add(b, json_object_get_string(content),
                             (size_t)json_object_get_string_len(content));
            } else if (json_object_is_type(content, json_type_array)) {
                for (size_t k = 0; k < json_object_array_length(content); k++) {
                    json_object *part = json_object_array_get_idx(content, k), *text;
                    if (json_object_object_get_ex(part, "text", &text) &&
                        json_object_is_type(text, json_type_string))
                        evbuffer_add_printf(b, "%s ", json_object_get_string(text));
                }
            }
        }
        evbuffer_add(b, "\n", 1);
    }
    if (err == NULL) {
        size_t cap = 0;
        evbuffer_add_printf(b, "assistant:");
        size_t blen = evbuffer_get_length(b);
        const char *p = (const char *)evbuffer_pullup(b, -1);
        if (mock_tokenize(p, blen, m->cfg.vocab, t, n, &cap) != 0)
            err = "out of memory";
    }
    evbuffer_free(b);
    return err;
}

static int get_bool(json_object *o, const char *key)
{
    json_object *v;
    return json_object_object_get_ex(o, key, &v) && json_object_get_boolean(v);
}

/* ==== the KV cache and its events ============================================================ */

/* Looks the prompt's full blocks up in the cache, inserts the missing ones (evicting leaves first)
 * and publishes one batch: BlockRemoved for the evictions, BlockStored for the new blocks.
 * Returns the number of cached prompt tokens. */
static uint32_t cache_admit(struct mock *m, const uint32_t *tokens, size_t n_tokens)
{
    struct mock_cache *c = &m->cache;
    uint32_t bs = m->cfg.block_size;
    size_t nb = n_tokens / bs, got = 0;
    if (nb == 0)
        return 0;
    uint64_t *seq = malloc(nb * sizeof(*seq));
    uint64_t *evicted = malloc(nb * sizeof(*evicted));
    if (seq == NULL || evicted == NULL ||
        kvr_hash_blocks(tokens, n_tokens, bs, NULL, seq, nb, &got) != KVR_OK) {
        free(seq);
        free(evicted);
        return 0;
    }
    kvr_hash_chain(seq, nb, seq); /* local hashes -> Dynamo sequence hashes, in place */
    size_t hit = 0;
    while (hit < nb && mock_cache_contains(c, seq[hit]))
        hit++;
    size_t cacheable = nb < c->cap ? nb : c->cap;
    for (size_t i = hit; i-- > 0;) /* tail first: the root ends most recent */
        mock_cache_touch(c, seq[i]);
    size_t fresh = cacheable > hit ? cacheable - hit : 0;
    size_t need = c->size + fresh > c->cap ? c->size + fresh - c->cap : 0, n_ev = 0;
    for (size_t k = 0; k < need; k++)
        if (mock_cache_evict(c, &evicted[n_ev]))
            n_ev++;
    for (size_t i = hit; i < cacheable; i++)
        mock_cache_insert(c, seq[i]);
    for (size_t i = cacheable; i-- > 0;)
        mock_cache_touch(c, seq[i]);
    m->st.evictions += n_ev;

    if (m->has_pub && (n_ev > 0 || fresh > 0)) {
        struct kvr_emp_event ev[2];
        struct kvr_emp_batch b;
        struct timespec now;
        memset(ev, 0, sizeof(ev));
        memset(&b, 0, sizeof(b));
        clock_gettime(CLOCK_REALTIME, &now);
        b.ts = (double)now.tv_sec + (double)now.tv_nsec / 1e9;
        b.has_dp_rank = (uint8_t)m->cfg.has_dp_rank;
        b.dp_rank = m->cfg.dp_rank;
        b.ev = ev;
        if (n_ev > 0) {
            struct kvr_emp_event *e = &ev[b.n++];
            e->kind = KVR_EVENT_REMOVED;
            e->event_version = 1;
            e->token_width = 1;
            e->n_hashes = (uint32_t)n_ev;
            e->hashes = evicted;
            e->medium.p = m->cfg.medium;
            e->medium.len = m->cfg.medium_len;
        }
        if (fresh > 0) {
            struct kvr_emp_event *e = &ev[b.n++];
            e->kind = KVR_EVENT_STORED;
            e->event_version = 1;
            e->token_width = 1;
            e->n_hashes = (uint32_t)fresh;
            e->hashes = seq + hit;
            e->has_parent = hit > 0;
            e->parent_hash = hit > 0 ? seq[hit - 1] : 0;
            e->token_ids = (uint32_t *)tokens + hit * bs;
            e->n_tokens = (uint32_t)(fresh * bs);
            e->block_size = bs;
            e->medium.p = m->cfg.medium;
            e->medium.len = m->cfg.medium_len;
        }
        if (mock_pub_send(&m->pub, &b, b.n) != 0)
            fprintf(stderr, "kvr-mock-worker: cannot publish a KV event batch\n");
    }
    free(seq);
    free(evicted);
    return (uint32_t)(hit * bs);
}

/* ==== responses ============================================================================== */

static json_object *usage_json(const struct mock_req *r)
{
    json_object *u = json_object_new_object();
    json_object_object_add(u, "prompt_tokens", json_object_new_int64((int64_t)r->n_tokens));
    json_object_object_add(u, "completion_tokens", json_object_new_int64(r->produced));
    json_object_object_add(u, "total_tokens",
                           json_object_new_int64((int64_t)r->n_tokens + r->produced));
    json_object *d = json_object_new_object();
    json_object_object_add(d, "cached_tokens", json_object_new_int64(r->cached));
    json_object_object_add(u, "prompt_tokens_details", d);
    return u;
}

static json_object *envelope(const struct mock_req *r, const char *object)
{
    json_object *o = json_object_new_object();
    json_object_object_add(o, "id", json_object_new_string(r->id));
    json_object_object_add(o, "object", json_object_new_string(object));
    json_object_object_add(o, "created", json_object_new_int64((int64_t)r->created));
    json_object_object_add(o, "model", json_object_new_string(r->model));
    return o;
}

/* One streaming choice: text (completions) or delta (chat); finish NULL = in progress. */
static json_object *chunk_json(const struct mock_req *r, const char *text, int role,
                               const char *finish)
{
    json_object *o = envelope(r, r->chat ? "chat.completion.chunk" : "text_completion");
    json_object *choice = json_object_new_object();
    json_object_object_add(choice, "index", json_object_new_int(0));
    if (r->chat) {
        json_object *delta = json_object_new_object();
        if (role)
            json_object_object_add(delta, "role", json_object_new_string("assistant"));
        if (text != NULL)
            json_object_object_add(delta, "content", json_object_new_string(text));
        json_object_object_add(choice, "delta", delta);
    } else {
        json_object_object_add(choice, "text", json_object_new_string(text ? text : ""));
        json_object_object_add(choice, "logprobs", NULL);
    }
    json_object_object_add(choice, "finish_reason", finish ? json_object_new_string(finish) : NULL);
    json_object *choices = json_object_new_array();
    json_object_array_add(choices, choice);
    json_object_object_add(o, "choices", choices);
    return o;
}

static void on_chunk_flushed(struct evhttp_connection *conn, void *arg);

/* Sends "data: <json>\n\n" (takes ownership of o). Returns 1 if the stream must stop here
 * (--die-after-chunks reached). */
static int send_sse(struct mock_req *r, json_object *o)
{
    struct evbuffer *b = evbuffer_new();
    const char *s =
        json_object_to_json_string_ext(o, JSON_C_TO_STRING_PLAIN | JSON_C_TO_STRING_NOSLASHESCAPE);
    evbuffer_add_printf(b, "data: %s\n\n", s);
    json_object_put(o);
    r->chunks++;
    int die = r->m->cfg.die_after_chunks != 0 && r->chunks >= r->m->cfg.die_after_chunks;
    if (die) {
        r->state = R_DYING;
        evhttp_send_reply_chunk_with_cb(r->req, b, on_chunk_flushed, r);
    } else {
        evhttp_send_reply_chunk(r->req, b);
    }
    evbuffer_free(b);
    return die;
}

/* Frees our state of r. If the client is gone, the detached evhttp request is ours to free. */
static void free_req(struct mock_req *r)
{
    struct mock *m = r->m;
    if (r->live_prev != NULL)
        r->live_prev->live_next = r->live_next;
    else
        m->live = r->live_next;
    if (r->live_next != NULL)
        r->live_next->live_prev = r->live_prev;
    if (r->gone && r->req != NULL)
        evhttp_send_reply_end(r->req); /* detached: this frees it */
    event_free(r->timer);
    free(r->tokens);
    if (r->text)
        evbuffer_free(r->text);
    free(r);
}

/* Ends r (queued or running) and admits the next waiting request. */
static void finish(struct mock_req *r)
{
    struct mock *m = r->m;
    if (r->state == R_QUEUED) {
        struct mock_req **pp = &m->q_head, *prev = NULL;
        while (*pp != NULL && *pp != r) {
            prev = *pp;
            pp = &(*pp)->next;
        }
        if (*pp == r) {
            *pp = r->next;
            if (m->q_tail == r)
                m->q_tail = prev;
            m->waiting--;
        }
    } else {
        m->running--;
    }
    free_req(r);
    admit_next(m);
}

static void detach_closecb(struct mock_req *r)
{
    if (r->conn != NULL)
        evhttp_connection_set_closecb(r->conn, NULL, NULL);
}

static void complete(struct mock_req *r)
{
    detach_closecb(r);
    r->m->st.completion_tokens += r->produced;
    if (r->stream) {
        send_sse(r, chunk_json(r, r->chat ? NULL : "", 0, "length"));
        if (r->include_usage) {
            json_object *o = envelope(r, r->chat ? "chat.completion.chunk" : "text_completion");
            json_object_object_add(o, "choices", json_object_new_array());
            json_object_object_add(o, "usage", usage_json(r));
            struct evbuffer *b = evbuffer_new();
            evbuffer_add_printf(b, "data: %s\n\n",
                                json_object_to_json_string_ext(o, JSON_C_TO_STRING_PLAIN));
            json_object_put(o);
            evhttp_send_reply_chunk(r->req, b);
            evbuffer_free(b);
        }
        struct evbuffer *b = evbuffer_new();
        evbuffer_add_printf(b, "data: [DONE]\n\n");
        evhttp_send_reply_chunk(r->req, b);
        evbuffer_free(b);
        evhttp_send_reply_end(r->req);
    } else {
        json_object *o = envelope(r, r->chat ? "chat.completion" : "text_completion");
        json_object *choice = json_object_new_object();
        json_object_object_add(choice, "index", json_object_new_int(0));
        size_t len = evbuffer_get_length(r->text);
        const char *text = len ? (const char *)evbuffer_pullup(r->text, -1) : "";
        if (r->chat) {
            json_object *msg = json_object_new_object();
            json_object_object_add(msg, "role", json_object_new_string("assistant"));
            json_object_object_add(msg, "content", json_object_new_string_len(text, (int)len));
            json_object_object_add(choice, "message", msg);
        } else {
            json_object_object_add(choice, "text", json_object_new_string_len(text, (int)len));
            json_object_object_add(choice, "logprobs", NULL);
        }
        json_object_object_add(choice, "finish_reason", json_object_new_string("length"));
        json_object *choices = json_object_new_array();
        json_object_array_add(choices, choice);
        json_object_object_add(o, "choices", choices);
        json_object_object_add(o, "usage", usage_json(r));
        send_json(r->req, 200, "OK", o);
    }
    r->req = NULL; /* freed by libevent once written */
    finish(r);
}

/* --die-after-chunks: drop the connection without finishing the response. */
static void kill_stream(struct mock_req *r)
{
    struct evhttp_connection *conn = r->conn;
    detach_closecb(r);
    r->m->st.streams_killed++;
    r->req = NULL; /* freed with the connection */
    r->gone = 0;
    finish(r);
    if (conn != NULL)
        evhttp_connection_free(conn);
}

static void on_chunk_flushed(struct evhttp_connection *conn, void *arg)
{
    struct mock_req *r = arg;
    (void)conn;
    event_active(r->timer, EV_TIMEOUT, 1); /* kill on the next loop turn, not inside evhttp */
}

static void schedule(struct mock_req *r, uint64_t us)
{
    struct timeval tv = {(time_t)(us / 1000000), (suseconds_t)(us % 1000000)};
    evtimer_add(r->timer, &tv);
}

/* Produces output token `produced`; returns 1 if the stream died. */
static int produce(struct mock_req *r)
{
    char word[64];
    snprintf(word, sizeof(word), " %s", mock_output_word(r->text_seed, r->produced));
    r->produced++;
    if (r->stream)
        return send_sse(r, chunk_json(r, word, 0, NULL));
    evbuffer_add(r->text, word, strlen(word));
    return 0;
}

/* One decode step: the next token, then completion or the next timer. */
static void decode_step(struct mock_req *r)
{
    if (r->produced < r->max_tokens && produce(r))
        return; /* the stream died */
    if (r->produced >= r->max_tokens)
        complete(r);
    else
        schedule(r, r->m->cfg.decode_us);
}

static void on_timer(evutil_socket_t fd, short what, void *arg)
{
    struct mock_req *r = arg;
    (void)fd;
    (void)what;
    if (r->gone) {
        finish(r);
        return;
    }
    if (r->state == R_PREFILL) {
        if (r->stream) {
            struct evkeyvalq *h = evhttp_request_get_output_headers(r->req);
            evhttp_add_header(h, "Content-Type", "text/event-stream");
            evhttp_add_header(h, "Cache-Control", "no-cache");
            evhttp_send_reply_start(r->req, 200, "OK");
            r->reply_started = 1;
            if (r->chat && send_sse(r, chunk_json(r, "", 1, NULL)))
                return;
        }
        r->state = R_DECODE; /* the first token comes with the end of the prefill */
        decode_step(r);
    } else if (r->state == R_DECODE) {
        decode_step(r);
    } else if (r->state == R_DYING) {
        kill_stream(r);
    }
}

static void on_conn_close(struct evhttp_connection *conn, void *arg)
{
    struct mock_req *r = arg;
    (void)conn;
    r->gone = 1;
    r->conn = NULL;
    event_active(r->timer, EV_TIMEOUT, 1);
}

/* ==== admission ============================================================================== */

static void start(struct mock_req *r)
{
    struct mock *m = r->m;
    m->running++;
    r->state = R_PREFILL;
    r->cached = cache_admit(m, r->tokens, r->n_tokens);
    uint64_t uncached = r->n_tokens - r->cached;
    m->st.prompt_cached += r->cached;
    m->st.prompt_uncached += uncached;
    schedule(r, uncached * m->cfg.prefill_us);
}

static void admit_next(struct mock *m)
{
    while (m->q_head != NULL &&
           (m->cfg.max_concurrent == 0 || m->running < m->cfg.max_concurrent)) {
        struct mock_req *r = m->q_head;
        m->q_head = r->next;
        if (m->q_head == NULL)
            m->q_tail = NULL;
        r->next = NULL;
        m->waiting--;
        start(r);
    }
}

static uint64_t rng_next(uint64_t *s)
{
    uint64_t x = *s;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return *s = x;
}

/* ==== endpoints ============================================================================== */

static void handle_generate(struct mock *m, struct evhttp_request *req, int chat)
{
    if (evhttp_request_get_command(req) != EVHTTP_REQ_POST) {
        send_error(req, 405, "invalid_request_error", "use POST");
        return;
    }
    json_object *body = parse_body(req), *v;
    if (body == NULL) {
        m->st.requests_rejected++;
        send_error(req, 400, "invalid_request_error", "the body must be a JSON object");
        return;
    }
    uint32_t *tokens = NULL;
    size_t n = 0;
    const char *err = chat ? chat_tokens(m, json_object_object_get(body, "messages"), &tokens, &n)
                           : prompt_tokens(m, json_object_object_get(body, "prompt"), &tokens, &n);
    int64_t max_tokens = m->cfg.default_max_tokens;
    if (err == NULL && (json_object_object_get_ex(body, "max_tokens", &v) ||
                        json_object_object_get_ex(body, "max_completion_tokens", &v))) {
        if (!json_object_is_type(v, json_type_int) || json_object_get_int64(v) < 1)
            err = "max_tokens must be a positive integer";
        else
            max_tokens = json_object_get_int64(v);
    }
    if (err == NULL && n == 0)
        err = "the prompt is empty";
    if (err == NULL && (uint64_t)n + (uint64_t)max_tokens > m->cfg.max_model_len)
        err = "prompt + max_tokens exceed max_model_len";
    if (err != NULL) {
        m->st.requests_rejected++;
        send_error(req, 400, "invalid_request_error", err);
        free(tokens);
        json_object_put(body);
        return;
    }
    if (m->cfg.fail_rate > 0 &&
        (double)(rng_next(&m->rng) >> 11) / 9007199254740992.0 < m->cfg.fail_rate) {
        m->st.requests_failed++;
        send_error(req, m->cfg.status_code, "server_error", "injected failure (--fail-rate)");
        free(tokens);
        json_object_put(body);
        return;
    }
    if (m->cfg.max_queue != 0 && m->cfg.max_concurrent != 0 &&
        m->running >= m->cfg.max_concurrent && m->waiting >= m->cfg.max_queue) {
        m->st.requests_rejected++;
        send_error(req, 503, "server_error", "queue full");
        free(tokens);
        json_object_put(body);
        return;
    }
    struct mock_req *r = calloc(1, sizeof(*r));
    if (r == NULL || (r->text = evbuffer_new()) == NULL ||
        (r->timer = evtimer_new(m->base, on_timer, r)) == NULL) {
        if (r != NULL && r->text != NULL)
            evbuffer_free(r->text);
        free(r);
        free(tokens);
        json_object_put(body);
        send_error(req, 503, "server_error", "out of memory");
        return;
    }
    r->m = m;
    r->req = req;
    r->conn = evhttp_request_get_connection(req);
    r->chat = chat;
    r->tokens = tokens;
    r->n_tokens = n;
    r->max_tokens = (uint32_t)max_tokens;
    r->stream = get_bool(body, "stream");
    if (json_object_object_get_ex(body, "stream_options", &v))
        r->include_usage = get_bool(v, "include_usage");
    snprintf(r->model, sizeof(r->model), "%s",
             json_object_object_get_ex(body, "model", &v) &&
                     json_object_is_type(v, json_type_string)
                 ? json_object_get_string(v)
                 : m->cfg.model);
    snprintf(r->id, sizeof(r->id), "%s-%016llx", chat ? "chatcmpl" : "cmpl",
             (unsigned long long)++m->next_id);
    r->created = time(NULL);
    uint64_t seed = KVR_HASH_SEED;
    for (size_t i = 0; i < n; i++)
        seed = kvr_hash_seq_next(seed, tokens[i]);
    r->text_seed = seed;
    json_object_put(body);
    m->st.requests++;
    evhttp_connection_set_closecb(r->conn, on_conn_close, r);
    r->state = R_QUEUED;
    r->live_next = m->live;
    if (m->live != NULL)
        m->live->live_prev = r;
    m->live = r;
    if (m->q_tail != NULL)
        m->q_tail->next = r;
    else
        m->q_head = r;
    m->q_tail = r;
    m->waiting++;
    admit_next(m);
}

static void on_completions(struct evhttp_request *req, void *arg)
{
    handle_generate(arg, req, 0);
}

static void on_chat(struct evhttp_request *req, void *arg)
{
    handle_generate(arg, req, 1);
}

static void on_tokenize(struct evhttp_request *req, void *arg)
{
    struct mock *m = arg;
    if (evhttp_request_get_command(req) != EVHTTP_REQ_POST) {
        send_error(req, 405, "invalid_request_error", "use POST");
        return;
    }
    json_object *body = parse_body(req), *v;
    if (body == NULL) {
        send_error(req, 400, "invalid_request_error", "the body must be a JSON object");
        return;
    }
    uint32_t *tokens = NULL;
    size_t n = 0;
    const char *err = json_object_object_get_ex(body, "messages", &v)
                          ? chat_tokens(m, v, &tokens, &n)
                          : prompt_tokens(m, json_object_object_get(body, "prompt"), &tokens, &n);
    json_object_put(body);
    if (err != NULL) {
        free(tokens);
        send_error(req, 400, "invalid_request_error", err);
        return;
    }
    json_object *o = json_object_new_object(), *arr = json_object_new_array_ext((int)n);
    for (size_t i = 0; i < n; i++)
        json_object_array_add(arr, json_object_new_int64(tokens[i]));
    free(tokens);
    json_object_object_add(o, "count", json_object_new_int64((int64_t)n));
    json_object_object_add(o, "max_model_len", json_object_new_int64(m->cfg.max_model_len));
    json_object_object_add(o, "tokens", arr);
    send_json(req, 200, "OK", o);
}

static void on_health(struct evhttp_request *req, void *arg)
{
    (void)arg;
    evhttp_send_reply(req, 200, "OK", NULL);
}

static void on_models(struct evhttp_request *req, void *arg)
{
    struct mock *m = arg;
    json_object *model = json_object_new_object();
    json_object_object_add(model, "id", json_object_new_string(m->cfg.model));
    json_object_object_add(model, "object", json_object_new_string("model"));
    json_object_object_add(model, "created", json_object_new_int64((int64_t)time(NULL)));
    json_object_object_add(model, "owned_by", json_object_new_string("kvrouter-mock"));
    json_object_object_add(model, "max_model_len", json_object_new_int64(m->cfg.max_model_len));
    json_object *data = json_object_new_array();
    json_object_array_add(data, model);
    json_object *o = json_object_new_object();
    json_object_object_add(o, "object", json_object_new_string("list"));
    json_object_object_add(o, "data", data);
    send_json(req, 200, "OK", o);
}

static void metric(struct evbuffer *b, const char *name, const char *type, const char *help,
                   uint64_t v)
{
    evbuffer_add_printf(b, "# HELP %s %s\n# TYPE %s %s\n%s %llu\n", name, help, name, type, name,
                        (unsigned long long)v);
}

static void on_metrics(struct evhttp_request *req, void *arg)
{
    struct mock *m = arg;
    struct evbuffer *b = evbuffer_new();
    if (b == NULL) {
        evhttp_send_error(req, 503, NULL);
        return;
    }
    const struct mock_pub *p = &m->pub;
    metric(b, "kvr_mock_requests_total", "counter", "Generation requests accepted.",
           m->st.requests);
    metric(b, "kvr_mock_requests_failed_total", "counter", "Requests failed by --fail-rate.",
           m->st.requests_failed);
    metric(b, "kvr_mock_requests_rejected_total", "counter", "Invalid requests or queue full.",
           m->st.requests_rejected);
    metric(b, "kvr_mock_requests_running", "gauge", "Requests in prefill or decode.", m->running);
    metric(b, "kvr_mock_requests_waiting", "gauge", "Requests queued for admission.", m->waiting);
    metric(b, "kvr_mock_prompt_tokens_cached_total", "counter",
           "Prompt tokens served from the prefix cache.", m->st.prompt_cached);
    metric(b, "kvr_mock_prompt_tokens_uncached_total", "counter", "Prompt tokens computed.",
           m->st.prompt_uncached);
    metric(b, "kvr_mock_completion_tokens_total", "counter", "Output tokens generated.",
           m->st.completion_tokens);
    metric(b, "kvr_mock_cache_blocks_in_use", "gauge", "KV blocks held by the prefix cache.",
           m->cache.size);
    metric(b, "kvr_mock_cache_blocks_capacity", "gauge", "KV block capacity (--cache-blocks).",
           m->cache.cap);
    metric(b, "kvr_mock_cache_evictions_total", "counter", "KV blocks evicted.", m->st.evictions);
    metric(b, "kvr_mock_kv_events_published_total", "counter", "KV events published.", p->events);
    metric(b, "kvr_mock_kv_batches_published_total", "counter", "KV event batches published.",
           p->batches);
    metric(b, "kvr_mock_zmq_subscriptions_total", "counter",
           "Subscription messages seen on the KV-event socket.", p->subscriptions);
    metric(b, "kvr_mock_replay_requests_total", "counter", "Replay requests served.",
           p->replay_requests);
    metric(b, "kvr_mock_batches_dropped_total", "counter",
           "Batches never published live (--drop-seq).", p->dropped);
    metric(b, "kvr_mock_batches_corrupted_total", "counter",
           "Batches published one byte short (--corrupt-seq).", p->corrupted);
    metric(b, "kvr_mock_streams_killed_total", "counter", "Streams cut by --die-after-chunks.",
           m->st.streams_killed);
    evhttp_add_header(evhttp_request_get_output_headers(req), "Content-Type",
                      "text/plain; version=0.0.4");
    evhttp_send_reply(req, 200, "OK", b);
    evbuffer_free(b);
}

static void on_other(struct evhttp_request *req, void *arg)
{
    (void)arg;
    send_error(req, 404, "invalid_request_error", "no such endpoint");
}

int mock_http_setup(struct mock *m)
{
    static const struct {
        const char *path;
        void (*cb)(struct evhttp_request *, void *);
    } routes[] = {
        {"/v1/completions", on_completions},
        {"/v1/chat/completions", on_chat},
        {"/tokenize", on_tokenize},
        {"/v1/tokenize", on_tokenize},
        {"/health", on_health},
        {"/metrics", on_metrics},
        {"/v1/models", on_models},
    };
    for (size_t k = 0; k < sizeof(routes) / sizeof(routes[0]); k++)
        if (evhttp_set_cb(m->http, routes[k].path, routes[k].cb, m) != 0)
            return -1;
    evhttp_set_gencb(m->http, on_other, m);
    m->rng = m->cfg.seed ? m->cfg.seed : 0x9E3779B97F4A7C15ULL;
    return 0;
}

void mock_http_shutdown(struct mock *m)
{
    /* before evhttp_free: detach our close callbacks, free our state (and detached requests);
     * requests still attached to a connection are freed by evhttp_free */
    while (m->live != NULL) {
        struct mock_req *r = m->live;
        detach_closecb(r);
        free_req(r);
    }
    m->q_head = m->q_tail = NULL;
    m->waiting = 0;
    m->running = 0;
}
