/* test_mock_worker.c - kvr-mock-worker end to end: the binary is started on 127.0.0.1 with
 * ephemeral ports (HTTP and ZMQ; it prints them), driven over HTTP, and its KV events are
 * consumed with the kvr_srv subscriber and checked against the router's own block hashing. */
#include <arpa/inet.h>
#include <check.h>
#include <errno.h>
#include <json-c/json.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include "kvr/err.h"
#include "kvr/event_msgpack.h"
#include "kvr/hash.h"
#include "kvr/kv_subscriber.h"

#ifndef KVR_MOCK_WORKER_BIN
#error "KVR_MOCK_WORKER_BIN must name the kvr-mock-worker binary"
#endif

#define WAIT_MS 10000

/* ==== the worker process ====================================================================== */

struct worker {
    pid_t pid;
    int out; /* its stdout */
    int port;
    char zmq[256];
    char replay[256];
};

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Starts the worker with `args` (NULL-terminated) and reads its endpoints up to "ready". */
static void worker_start(struct worker *w, const char *const *args)
{
    const char *argv[64];
    int pfd[2], n = 0;
    memset(w, 0, sizeof(*w));
    argv[n++] = KVR_MOCK_WORKER_BIN;
    argv[n++] = "--port";
    argv[n++] = "0";
    for (int k = 0; args[k] != NULL && n < 62; k++)
        argv[n++] = args[k];
    argv[n] = NULL;
    ck_assert_int_eq(pipe(pfd), 0);
    w->pid = fork();
    ck_assert_int_ge(w->pid, 0);
    if (w->pid == 0) {
        dup2(pfd[1], 1);
        close(pfd[0]);
        close(pfd[1]);
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }
    close(pfd[1]);
    w->out = pfd[0];
    char buf[4096];
    size_t len = 0;
    buf[0] = '\0';
    int64_t deadline = now_ms() + WAIT_MS;
    while (strstr(buf, "kvr-mock-worker: ready") == NULL) {
        struct pollfd p = {w->out, POLLIN, 0};
        int left = (int)(deadline - now_ms());
        ck_assert_msg(left > 0 && poll(&p, 1, left) == 1, "worker did not start");
        ssize_t r = read(w->out, buf + len, sizeof(buf) - 1 - len);
        ck_assert_msg(r > 0, "worker exited early");
        len += (size_t)r;
        buf[len] = '\0';
    }
    const char *h = strstr(buf, "http://127.0.0.1:");
    ck_assert_ptr_nonnull(h);
    w->port = atoi(h + strlen("http://127.0.0.1:"));
    const char *z = strstr(buf, "kvr-mock-worker: zmq ");
    if (z != NULL)
        sscanf(z, "kvr-mock-worker: zmq %255s", w->zmq);
    const char *r = strstr(buf, "kvr-mock-worker: replay ");
    if (r != NULL)
        sscanf(r, "kvr-mock-worker: replay %255s", w->replay);
}

/* SIGTERM, then expect a clean exit (sanitizer builds fail the exit status on leaks). */
static void worker_stop(struct worker *w)
{
    int status = 0;
    kill(w->pid, SIGTERM);
    ck_assert_int_eq(waitpid(w->pid, &status, 0), w->pid);
    close(w->out);
    ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0, "worker exit status %d", status);
}

/* ==== a minimal HTTP/1.1 client (Connection: close; chunked bodies decoded) ================== */

struct resp {
    int status;
    char *body; /* NUL-terminated, malloc'd */
    size_t len;
    int complete; /* chunked: the terminating chunk arrived */
};

static void resp_free(struct resp *r)
{
    free(r->body);
    memset(r, 0, sizeof(*r));
}

static void http(int port, const char *method, const char *path, const char *body, struct resp *out)
{
    memset(out, 0, sizeof(*out));
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    ck_assert_int_ge(fd, 0);
    struct timeval tv = {20, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    struct sockaddr_in a;
    memset(&a, 0, sizeof(a));
    a.sin_family = AF_INET;
    a.sin_port = htons((uint16_t)port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ck_assert_int_eq(connect(fd, (struct sockaddr *)&a, sizeof(a)), 0);
    char head[512];
    size_t blen = body ? strlen(body) : 0;
    int hl = snprintf(head, sizeof(head),
                      "%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
                      "Content-Type: application/json\r\nContent-Length: %zu\r\n\r\n",
                      method, path, blen);
    ck_assert_int_eq(write(fd, head, (size_t)hl), hl);
    if (blen)
        ck_assert_int_eq(write(fd, body, blen), (ssize_t)blen);
    size_t cap = 1 << 16, len = 0;
    char *raw = malloc(cap);
    for (;;) {
        if (cap - len < 4096)
            raw = realloc(raw, cap *= 2);
        ssize_t r = read(fd, raw + len, cap - len - 1);
        if (r <= 0)
            break;
        len += (size_t)r;
    }
    close(fd);
    raw[len] = '\0';
    ck_assert_msg(sscanf(raw, "HTTP/1.%*d %d", &out->status) == 1, "bad response: %s", raw);
    char *hdr_end = strstr(raw, "\r\n\r\n");
    ck_assert_ptr_nonnull(hdr_end);
    *hdr_end = '\0';
    char *p = hdr_end + 4;
    size_t left = len - (size_t)(p - raw);
    int chunked = strstr(raw, "Transfer-Encoding: chunked") != NULL;
    out->body = malloc(left + 1);
    if (!chunked) {
        memcpy(out->body, p, left);
        out->len = left;
        out->complete = 1;
    } else {
        while (left > 0) {
            char *eol = strstr(p, "\r\n");
            if (eol == NULL)
                break;
            size_t n = strtoul(p, NULL, 16);
            size_t hdr = (size_t)(eol + 2 - p);
            if (n == 0) {
                out->complete = 1;
                break;
            }
            if (hdr + n + 2 > left)
                break;
            memcpy(out->body + out->len, eol + 2, n);
            out->len += n;
            p += hdr + n + 2;
            left -= hdr + n + 2;
        }
    }
    out->body[out->len] = '\0';
    free(raw);
}

static json_object *http_json(int port, const char *path, const char *body, int want_status)
{
    struct resp r;
    http(port, "POST", path, body, &r);
    ck_assert_msg(r.status == want_status, "%s: status %d: %s", path, r.status, r.body);
    json_object *o = json_tokener_parse(r.body);
    ck_assert_msg(o != NULL, "not JSON: %s", r.body);
    resp_free(&r);
    return o;
}

static int64_t jint(json_object *o, const char *path)
{
    /* "a.b.c" */
    char buf[128];
    snprintf(buf, sizeof(buf), "%s", path);
    json_object *cur = o;
    for (char *tok = strtok(buf, "."); tok != NULL; tok = strtok(NULL, ".")) {
        json_object *next;
        ck_assert_msg(json_object_object_get_ex(cur, tok, &next), "missing %s", path);
        cur = next;
    }
    return json_object_get_int64(cur);
}

static uint64_t metric(int port, const char *name)
{
    struct resp r;
    http(port, "GET", "/metrics", NULL, &r);
    ck_assert_int_eq(r.status, 200);
    char needle[128];
    snprintf(needle, sizeof(needle), "\n%s ", name);
    const char *p = strstr(r.body, needle);
    ck_assert_msg(p != NULL, "metric %s missing", name);
    uint64_t v = strtoull(p + strlen(needle), NULL, 10);
    resp_free(&r);
    return v;
}

/* Tokenizes through the worker. */
static size_t tokenize(int port, const char *prompt, uint32_t *out, size_t cap)
{
    char body[2048];
    snprintf(body, sizeof(body), "{\"prompt\": \"%s\"}", prompt);
    json_object *o = http_json(port, "/tokenize", body, 200), *arr;
    ck_assert(json_object_object_get_ex(o, "tokens", &arr));
    size_t n = json_object_array_length(arr);
    ck_assert_uint_le(n, cap);
    ck_assert_int_eq(jint(o, "count"), (int64_t)n);
    for (size_t k = 0; k < n; k++)
        out[k] = (uint32_t)json_object_get_int64(json_object_array_get_idx(arr, k));
    json_object_put(o);
    return n;
}

/* ==== the subscriber side ===================================================================== */

struct got {
    uint8_t kind;
    uint8_t tier;
    uint64_t event_id;
    uint32_t dp_rank;
    uint8_t has_parent;
    uint64_t parent;
    uint32_t n;
    struct kvr_block blocks[64];
    uint64_t hashes[64];
};

struct collector {
    pthread_mutex_t mu;
    struct got ev[64];
    size_t n;
};

static int sink(void *ctx, const struct kvr_event *ev, size_t n)
{
    struct collector *c = ctx;
    pthread_mutex_lock(&c->mu);
    for (size_t k = 0; k < n && c->n < 64; k++) {
        struct got *g = &c->ev[c->n++];
        g->kind = ev[k].kind;
        g->tier = ev[k].tier;
        g->event_id = ev[k].event_id;
        g->dp_rank = ev[k].dp_rank;
        g->has_parent = ev[k].has_parent;
        g->parent = ev[k].parent_hash;
        g->n = ev[k].n < 64 ? ev[k].n : 64;
        for (uint32_t i = 0; i < g->n; i++) {
            if (ev[k].kind == KVR_EVENT_STORED)
                g->blocks[i] = ev[k].blocks[i];
            else if (ev[k].kind == KVR_EVENT_REMOVED)
                g->hashes[i] = ev[k].hashes[i];
        }
    }
    pthread_mutex_unlock(&c->mu);
    return 0;
}

static size_t n_events(struct collector *c)
{
    pthread_mutex_lock(&c->mu);
    size_t n = c->n;
    pthread_mutex_unlock(&c->mu);
    return n;
}

static void wait_events(struct collector *c, size_t want)
{
    int64_t deadline = now_ms() + WAIT_MS;
    while (n_events(c) < want) {
        ck_assert_msg(now_ms() < deadline, "only %zu of %zu events", n_events(c), want);
        sleep_ms(5);
    }
}

struct sub {
    struct collector c;
    kvr_kvsub_t *s;
    uint32_t id;
};

/* Subscribes to the worker's KV events and waits until the worker has seen the subscription. */
static void sub_start(struct sub *s, const struct worker *w, uint32_t block_size, const char *topic)
{
    memset(s, 0, sizeof(*s));
    pthread_mutex_init(&s->c.mu, NULL);
    struct kvr_kvsub_config cfg = {0};
    cfg.sink = sink;
    cfg.sink_ctx = &s->c;
    ck_assert_int_eq(kvr_kvsub_new(&cfg, &s->s), KVR_OK);
    struct kvr_kvsub_source_config sc = {0};
    sc.worker_id = 42;
    sc.block_size = block_size;
    sc.endpoint = w->zmq;
    sc.replay_endpoint = w->replay[0] ? w->replay : NULL;
    sc.topic = topic;
    sc.topic_len = topic ? strlen(topic) : 0;
    ck_assert_int_eq(kvr_kvsub_add(s->s, &sc, &s->id), KVR_OK);
    int64_t deadline = now_ms() + WAIT_MS;
    while (metric(w->port, "kvr_mock_zmq_subscriptions_total") < 1) {
        ck_assert_msg(now_ms() < deadline, "the worker never saw the subscription");
        sleep_ms(10);
    }
}

/* Stats are a snapshot refreshed after each poll round: wait until `batches` is reached. */
static struct kvr_kvsub_stats sub_stats(struct sub *s, uint64_t batches)
{
    struct kvr_kvsub_stats st;
    int64_t deadline = now_ms() + WAIT_MS;
    for (;;) {
        ck_assert_int_eq(kvr_kvsub_stats(s->s, s->id, &st), KVR_OK);
        if (st.batches >= batches || now_ms() > deadline)
            return st;
        sleep_ms(5);
    }
}

static void sub_stop(struct sub *s)
{
    kvr_kvsub_free(s->s);
    pthread_mutex_destroy(&s->c.mu);
}

/* The router-side hashes of `tokens`: local and sequence hashes of the full blocks. */
static size_t block_hashes(const uint32_t *tokens, size_t n, uint32_t bs, uint64_t *local,
                           uint64_t *seq)
{
    size_t nb = 0;
    ck_assert_int_eq(kvr_hash_blocks(tokens, n, bs, NULL, local, 64, &nb), KVR_OK);
    kvr_hash_chain(local, nb, seq);
    return nb;
}

#define PROMPT "The quick brown fox jumps over the lazy dog near the river bank"
#define PROMPT2 PROMPT " and then it runs far away into the deep green forest"

/* ==== tests =================================================================================== */

/* A prompt twice: cached_tokens > 0 the second time; the published stores decode to the blocks
 * the router computes itself (tokens_hash = local hash, block_hash = Dynamo sequence hash). */
START_TEST(test_prefix_cache_and_events)
{
    struct worker w;
    const char *args[] = {"--zmq",
                          "tcp://127.0.0.1:*",
                          "--replay",
                          "tcp://127.0.0.1:*",
                          "--block-size",
                          "4",
                          "--topic",
                          "kv@mock@m",
                          "--prefill-us",
                          "0",
                          "--decode-us",
                          "0",
                          "--cache-blocks",
                          "64",
                          NULL};
    worker_start(&w, args);
    ck_assert(w.zmq[0] != '\0' && w.replay[0] != '\0');
    struct sub s;
    sub_start(&s, &w, 4, "kv@");

    uint32_t tok[128];
    uint64_t local[64], seq[64];
    size_t n = tokenize(w.port, PROMPT, tok, 128);
    ck_assert_uint_eq(n, 13);
    size_t nb = block_hashes(tok, n, 4, local, seq);
    ck_assert_uint_eq(nb, 3);

    const char *req = "{\"prompt\": \"" PROMPT "\", \"max_tokens\": 3}";
    json_object *o = http_json(w.port, "/v1/completions", req, 200);
    ck_assert_int_eq(jint(o, "usage.prompt_tokens"), 13);
    ck_assert_int_eq(jint(o, "usage.completion_tokens"), 3);
    ck_assert_int_eq(jint(o, "usage.total_tokens"), 16);
    ck_assert_int_eq(jint(o, "usage.prompt_tokens_details.cached_tokens"), 0);
    json_object *choices, *obj;
    ck_assert(json_object_object_get_ex(o, "choices", &choices));
    ck_assert(json_object_object_get_ex(o, "object", &obj));
    ck_assert_str_eq(json_object_get_string(obj), "text_completion");
    const char *text1 = json_object_get_string(
        json_object_object_get(json_object_array_get_idx(choices, 0), "text"));
    char first_text[256];
    snprintf(first_text, sizeof(first_text), "%s", text1);
    json_object_put(o);

    wait_events(&s.c, 1);
    pthread_mutex_lock(&s.c.mu);
    struct got *g = &s.c.ev[0];
    ck_assert_int_eq(g->kind, KVR_EVENT_STORED);
    ck_assert_uint_eq(g->event_id, 0);
    ck_assert_uint_eq(g->dp_rank, 0);
    ck_assert(!g->has_parent);
    ck_assert_uint_eq(g->n, 3);
    for (size_t i = 0; i < 3; i++) {
        ck_assert_uint_eq(g->blocks[i].tokens_hash, local[i]);
        ck_assert_uint_eq(g->blocks[i].block_hash, seq[i]);
    }
    pthread_mutex_unlock(&s.c.mu);

    /* the same prompt again: every full block cached, nothing new published, same text */
    o = http_json(w.port, "/v1/completions", req, 200);
    ck_assert_int_eq(jint(o, "usage.prompt_tokens_details.cached_tokens"), 12);
    ck_assert(json_object_object_get_ex(o, "choices", &choices));
    ck_assert_str_eq(json_object_get_string(
                         json_object_object_get(json_object_array_get_idx(choices, 0), "text")),
                     first_text);
    json_object_put(o);

    /* an extension of the prompt: a store chained under the last cached block */
    uint32_t tok2[128];
    uint64_t local2[64], seq2[64];
    size_t n2 = tokenize(w.port, PROMPT2, tok2, 128);
    size_t nb2 = block_hashes(tok2, n2, 4, local2, seq2);
    ck_assert_uint_gt(nb2, nb);
    o = http_json(w.port, "/v1/chat/completions",
                  "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}]}", 200);
    json_object_put(o);
    o = http_json(w.port, "/v1/completions", "{\"prompt\": \"" PROMPT2 "\", \"max_tokens\": 1}",
                  200);
    ck_assert_int_eq(jint(o, "usage.prompt_tokens_details.cached_tokens"), 12);
    json_object_put(o);
    /* chat: 1 block ("user: x\nassistant:" is 5 tokens); extension: nb2 - 3 blocks */
    wait_events(&s.c, 3);
    pthread_mutex_lock(&s.c.mu);
    g = &s.c.ev[2];
    ck_assert_int_eq(g->kind, KVR_EVENT_STORED);
    ck_assert_uint_eq(g->event_id, 2);
    ck_assert(g->has_parent && g->parent == seq2[nb - 1]);
    ck_assert_uint_eq(g->n, nb2 - nb);
    for (size_t i = 0; i < g->n; i++) {
        ck_assert_uint_eq(g->blocks[i].tokens_hash, local2[nb + i]);
        ck_assert_uint_eq(g->blocks[i].block_hash, seq2[nb + i]);
    }
    pthread_mutex_unlock(&s.c.mu);

    struct kvr_kvsub_stats st = sub_stats(&s, 3);
    ck_assert_uint_eq(st.batches, 3);
    ck_assert_uint_eq(st.dialects, KVR_EMP_DIALECT_B);
    ck_assert_uint_eq(st.gaps + st.lost_batches + st.decode_errors, 0);
    ck_assert_uint_eq(metric(w.port, "kvr_mock_prompt_tokens_cached_total"), 24);
    ck_assert_uint_eq(metric(w.port, "kvr_mock_kv_batches_published_total"), 3);
    ck_assert_uint_eq(metric(w.port, "kvr_mock_cache_blocks_in_use"), nb2 + 1);
    sub_stop(&s);
    worker_stop(&w);
}
END_TEST

/* A full cache evicts leaves first and publishes BlockRemoved before the new BlockStored. */
START_TEST(test_eviction_events)
{
    struct worker w;
    const char *args[] = {"--zmq",           "tcp://127.0.0.1:*",
                          "--block-size",    "4",
                          "--cache-blocks",  "2",
                          "--decode-us",     "0",
                          "--legacy-events", NULL};
    worker_start(&w, args);
    struct sub s;
    sub_start(&s, &w, 4, NULL);
    uint32_t ta[64], tb[64];
    uint64_t la[64], sa[64], lb[64], sb[64];
    const char *a = "alpha beta gamma delta epsilon zeta eta theta";
    const char *b = "one two three four five six seven eight";
    ck_assert_uint_eq(block_hashes(ta, tokenize(w.port, a, ta, 64), 4, la, sa), 2);
    ck_assert_uint_eq(block_hashes(tb, tokenize(w.port, b, tb, 64), 4, lb, sb), 2);
    char body[256];
    snprintf(body, sizeof(body), "{\"prompt\": \"%s\", \"max_tokens\": 1}", a);
    json_object_put(http_json(w.port, "/v1/completions", body, 200));
    snprintf(body, sizeof(body), "{\"prompt\": \"%s\", \"max_tokens\": 1}", b);
    json_object *o = http_json(w.port, "/v1/completions", body, 200);
    ck_assert_int_eq(jint(o, "usage.prompt_tokens_details.cached_tokens"), 0);
    json_object_put(o);
    wait_events(&s.c, 3);
    pthread_mutex_lock(&s.c.mu);
    ck_assert_int_eq(s.c.ev[1].kind, KVR_EVENT_REMOVED);
    ck_assert_uint_eq(s.c.ev[1].event_id, 1);
    ck_assert_uint_eq(s.c.ev[1].n, 2);
    ck_assert_uint_eq(s.c.ev[1].hashes[0], sa[1]); /* the leaf goes first */
    ck_assert_uint_eq(s.c.ev[1].hashes[1], sa[0]);
    ck_assert_int_eq(s.c.ev[2].kind, KVR_EVENT_STORED);
    ck_assert_uint_eq(s.c.ev[2].blocks[0].block_hash, sb[0]);
    ck_assert_uint_eq(s.c.ev[2].blocks[1].tokens_hash, lb[1]);
    pthread_mutex_unlock(&s.c.mu);
    struct kvr_kvsub_stats st = sub_stats(&s, 2);
    ck_assert_uint_eq(st.batches, 2);
    ck_assert_uint_eq(st.dialects, KVR_EMP_DIALECT_A); /* --legacy-events */
    ck_assert_uint_eq(metric(w.port, "kvr_mock_cache_evictions_total"), 2);
    ck_assert_uint_eq(metric(w.port, "kvr_mock_cache_blocks_in_use"), 2);
    sub_stop(&s);
    worker_stop(&w);
}
END_TEST

/* --corrupt-seq publishes a batch one byte short (the subscriber counts a truncated payload and
 * goes on); --medium sets every event's medium (CPU -> the host_pinned tier). */
START_TEST(test_corrupt_seq_and_medium)
{
    struct worker w;
    const char *args[] = {
        "--zmq", "tcp://127.0.0.1:*", "--block-size", "4", "--decode-us", "0", "--corrupt-seq",
        "1",     "--medium",          "CPU",          NULL};
    worker_start(&w, args);
    struct sub s;
    sub_start(&s, &w, 4, NULL);
    const char *bodies[] = {"{\"prompt\": [1, 2, 3, 4, 5, 6, 7, 8], \"max_tokens\": 1}",
                            "{\"prompt\": [11, 12, 13, 14], \"max_tokens\": 1}",
                            "{\"prompt\": [21, 22, 23, 24], \"max_tokens\": 1}"};
    for (int k = 0; k < 3; k++)
        json_object_put(http_json(w.port, "/v1/completions", bodies[k], 200));
    wait_events(&s.c, 2);
    struct kvr_kvsub_stats st = sub_stats(&s, 2);
    int64_t deadline = now_ms() + WAIT_MS;
    while (st.batches + st.decode_errors < 3 && now_ms() < deadline) {
        sleep_ms(5);
        ck_assert_int_eq(kvr_kvsub_stats(s.s, s.id, &st), KVR_OK);
    }
    ck_assert_uint_eq(st.batches, 2);
    ck_assert_uint_eq(st.decode_errors, 1);
    ck_assert_uint_eq(st.dec.errors[KVR_EMP_E_TRUNCATED], 1);
    ck_assert_uint_eq(st.gaps + st.lost_batches, 0); /* the bad batch's seq still counts */
    ck_assert_uint_eq(st.conv.tier[KVR_TIER_HOST_PINNED], 2);
    ck_assert_uint_eq(st.conv.tier[KVR_TIER_DEVICE], 0);
    pthread_mutex_lock(&s.c.mu);
    ck_assert_uint_eq(s.c.n, 2);
    ck_assert_uint_eq(s.c.ev[0].event_id, 0);
    ck_assert_uint_eq(s.c.ev[1].event_id, 2);
    for (int k = 0; k < 2; k++) {
        ck_assert_int_eq(s.c.ev[k].kind, KVR_EVENT_STORED);
        ck_assert_int_eq(s.c.ev[k].tier, KVR_TIER_HOST_PINNED);
    }
    pthread_mutex_unlock(&s.c.mu);
    ck_assert_uint_eq(metric(w.port, "kvr_mock_batches_corrupted_total"), 1);
    ck_assert_uint_eq(metric(w.port, "kvr_mock_kv_batches_published_total"), 3);
    sub_stop(&s);
    worker_stop(&w);
}
END_TEST

/* SSE: one chunk per token, a final chunk, the usage chunk on request, then [DONE]. */
START_TEST(test_streaming)
{
    struct worker w;
    const char *args[] = {"--decode-us", "1000", NULL};
    worker_start(&w, args);
    struct resp r;
    http(w.port, "POST", "/v1/completions",
         "{\"prompt\": [1, 2, 3, 4, 5], \"max_tokens\": 4, \"stream\": true, "
         "\"stream_options\": {\"include_usage\": true}}",
         &r);
    ck_assert_int_eq(r.status, 200);
    ck_assert(r.complete);
    size_t chunks = 0;
    for (const char *p = r.body; (p = strstr(p, "data: ")) != NULL; p += 6)
        chunks++;
    ck_assert_uint_eq(chunks, 4 + 1 + 1 + 1); /* tokens, finish, usage, [DONE] */
    ck_assert_ptr_nonnull(strstr(r.body, "\"finish_reason\":\"length\""));
    ck_assert_ptr_nonnull(strstr(r.body, "\"prompt_tokens\":5"));
    const char *done = strstr(r.body, "data: [DONE]\n\n");
    ck_assert_ptr_nonnull(done);
    ck_assert_uint_eq((size_t)(done - r.body) + strlen("data: [DONE]\n\n"), r.len);
    resp_free(&r);

    http(
        w.port, "POST", "/v1/chat/completions",
        "{\"messages\": [{\"role\": \"system\", \"content\": \"be brief\"}, {\"role\": \"user\", "
        "\"content\": [{\"type\": \"text\", \"text\": \"hello\"}]}], \"max_completion_tokens\": 2, "
        "\"stream\": true}",
        &r);
    ck_assert_int_eq(r.status, 200);
    ck_assert(r.complete);
    ck_assert_ptr_nonnull(strstr(r.body, "\"object\":\"chat.completion.chunk\""));
    ck_assert_ptr_nonnull(strstr(r.body, "\"delta\":{\"role\":\"assistant\",\"content\":\"\"}"));
    ck_assert_ptr_nonnull(strstr(r.body, "data: [DONE]"));
    ck_assert_ptr_null(strstr(r.body, "usage"));
    resp_free(&r);

    /* other endpoints */
    http(w.port, "GET", "/health", NULL, &r);
    ck_assert_int_eq(r.status, 200);
    resp_free(&r);
    http(w.port, "GET", "/nope", NULL, &r);
    ck_assert_int_eq(r.status, 404);
    resp_free(&r);
    http(w.port, "POST", "/v1/completions", "{\"prompt\": 5}", &r);
    ck_assert_int_eq(r.status, 400);
    ck_assert_ptr_nonnull(strstr(r.body, "\"error\""));
    resp_free(&r);
    http(w.port, "POST", "/v1/completions", "not json", &r);
    ck_assert_int_eq(r.status, 400);
    resp_free(&r);
    json_object *o = http_json(w.port, "/tokenize",
                               "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]}", 200);
    ck_assert_int_eq(jint(o, "count"), 5); /* "user: hi\nassistant:" -> user : hi assistant : */
    json_object_put(o);
    worker_stop(&w);
}
END_TEST

/* Fault flags: injected status codes; streams cut after N chunks. */
START_TEST(test_faults)
{
    struct worker w;
    const char *fail[] = {"--fail-rate", "1", "--status-code", "503", NULL};
    worker_start(&w, fail);
    struct resp r;
    http(w.port, "POST", "/v1/completions", "{\"prompt\": \"hi\"}", &r);
    ck_assert_int_eq(r.status, 503);
    resp_free(&r);
    ck_assert_uint_eq(metric(w.port, "kvr_mock_requests_failed_total"), 1);
    worker_stop(&w);

    const char *die[] = {"--die-after-chunks", "2", "--decode-us", "2000", NULL};
    worker_start(&w, die);
    http(w.port, "POST", "/v1/completions",
         "{\"prompt\": \"hi there\", \"max_tokens\": 8, \"stream\": true}", &r);
    ck_assert_int_eq(r.status, 200);
    ck_assert(!r.complete); /* the connection closed without the last chunk */
    ck_assert_ptr_null(strstr(r.body, "[DONE]"));
    size_t chunks = 0;
    for (const char *p = r.body; (p = strstr(p, "data: ")) != NULL; p += 6)
        chunks++;
    ck_assert_uint_eq(chunks, 2);
    resp_free(&r);
    ck_assert_uint_eq(metric(w.port, "kvr_mock_streams_killed_total"), 1);
    /* the worker goes on serving */
    json_object_put(http_json(w.port, "/v1/completions", "{\"prompt\": \"ok\"}", 200));
    worker_stop(&w);
}
END_TEST

/* Latency model: prefill time scales with uncached tokens; extra requests queue. */
struct par {
    int port;
    int64_t ms;
};

static void *one_request(void *arg)
{
    struct par *p = arg;
    int64_t t0 = now_ms();
    struct resp r;
    http(p->port, "POST", "/v1/completions", "{\"prompt\": \"q\", \"max_tokens\": 5}", &r);
    resp_free(&r);
    p->ms = now_ms() - t0;
    return NULL;
}

START_TEST(test_latency_and_concurrency)
{
    struct worker w;
    const char *args[] = {"--prefill-us", "2000", "--decode-us", "20000", "--max-concurrent", "1",
                          "--block-size", "4",    NULL};
    worker_start(&w, args);
    /* 60 uncached tokens x 2 ms, then the same prompt fully cached */
    char body[1024];
    size_t off = (size_t)snprintf(body, sizeof(body), "{\"max_tokens\": 1, \"prompt\": [");
    for (int t = 0; t < 60; t++)
        off += (size_t)snprintf(body + off, sizeof(body) - off, "%s%d", t ? "," : "", 1000 + t);
    snprintf(body + off, sizeof(body) - off, "]}");
    int64_t t0 = now_ms();
    json_object_put(http_json(w.port, "/v1/completions", body, 200));
    int64_t cold = now_ms() - t0;
    t0 = now_ms();
    json_object *o = http_json(w.port, "/v1/completions", body, 200);
    int64_t warm = now_ms() - t0;
    ck_assert_int_eq(jint(o, "usage.prompt_tokens_details.cached_tokens"), 60);
    json_object_put(o);
    ck_assert_msg(cold >= 120, "cold request took %lld ms", (long long)cold);
    ck_assert_msg(warm < cold, "warm %lld ms vs cold %lld ms", (long long)warm, (long long)cold);

    /* two requests of 5 tokens x 20 ms with one slot: the second waits for the first */
    struct par p[2] = {{w.port, 0}, {w.port, 0}};
    pthread_t th[2];
    t0 = now_ms();
    for (int k = 0; k < 2; k++)
        pthread_create(&th[k], NULL, one_request, &p[k]);
    for (int k = 0; k < 2; k++)
        pthread_join(th[k], NULL);
    int64_t total = now_ms() - t0;
    /* each takes ~82 ms alone; queued behind the other, the later one needs ~164 ms */
    ck_assert_msg(total >= 150, "two queued requests took %lld ms", (long long)total);
    ck_assert_msg((p[0].ms > p[1].ms ? p[0].ms : p[1].ms) >= 150, "no queueing seen");
    worker_stop(&w);
}
END_TEST

/* The replay ROUTER answers [identity, "", be64(start)] with the kept batches and an end marker,
 * in the 3-frame form by default and in the 2-frame form with --replay-two-frame. */
static void replay_form(int two_frame)
{
    struct worker w;
    const char *args3[] = {"--zmq",        "tcp://127.0.0.1:*",
                           "--replay",     "tcp://127.0.0.1:*",
                           "--topic",      "kv",
                           "--block-size", "2",
                           "--decode-us",  "0",
                           NULL,           NULL};
    if (two_frame)
        args3[10] = "--replay-two-frame";
    worker_start(&w, args3);
    json_object_put(http_json(w.port, "/v1/completions", "{\"prompt\": \"a b c d\"}", 200));
    json_object_put(http_json(w.port, "/v1/completions", "{\"prompt\": \"e f g h\"}", 200));
    void *ctx = zmq_ctx_new();
    void *d = zmq_socket(ctx, ZMQ_DEALER);
    int linger = 0, tmo = WAIT_MS;
    zmq_setsockopt(d, ZMQ_LINGER, &linger, sizeof(linger));
    zmq_setsockopt(d, ZMQ_RCVTIMEO, &tmo, sizeof(tmo));
    ck_assert_int_eq(zmq_connect(d, w.replay), 0);
    uint8_t start[8] = {0, 0, 0, 0, 0, 0, 0, 1};
    zmq_send(d, "", 0, ZMQ_SNDMORE);
    zmq_send(d, start, 8, 0);
    uint64_t seqs[8];
    int n_batches = 0, ended = 0;
    while (!ended) {
        uint8_t f[5][4096];
        int len[5], n = 0, more = 1;
        while (more) {
            ck_assert_int_lt(n, 5);
            len[n] = zmq_recv(d, f[n], sizeof(f[n]), 0);
            ck_assert_int_ge(len[n], 0);
            size_t ms = sizeof(more);
            zmq_getsockopt(d, ZMQ_RCVMORE, &more, &ms);
            n++;
        }
        ck_assert_int_eq(n, two_frame ? 3 : 4);
        ck_assert_int_eq(len[0], 0);
        int s = two_frame ? 1 : 2;
        ck_assert_int_eq(len[s], 8);
        uint64_t seq = 0;
        for (int i = 0; i < 8; i++)
            seq = seq << 8 | f[s][i];
        if (seq == UINT64_MAX) {
            ck_assert_int_eq(len[s + 1], 0);
            ended = 1;
            continue;
        }
        if (!two_frame) {
            ck_assert_int_eq(len[1], 2);
            ck_assert(memcmp(f[1], "kv", 2) == 0);
        }
        kvr_alloc_t a;
        struct kvr_emp_batch b;
        kvr_alloc_init(&a);
        kvr_emp_batch_init(&b, &a);
        ck_assert_int_eq(
            kvr_emp_decode(&b, f[s + 1], (size_t)len[s + 1], NULL, NULL, NULL, NULL, 0), KVR_OK);
        ck_assert_uint_eq(b.n, 1);
        ck_assert_int_eq(b.ev[0].kind, KVR_EVENT_STORED);
        ck_assert_uint_eq(b.ev[0].n_hashes, 2);
        kvr_emp_batch_free(&b);
        seqs[n_batches++] = seq;
    }
    ck_assert_int_eq(n_batches, 1); /* batches 0 and 1 were published; replay from 1 */
    ck_assert_uint_eq(seqs[0], 1);
    ck_assert_uint_eq(metric(w.port, "kvr_mock_replay_requests_total"), 1);
    zmq_close(d);
    zmq_ctx_term(ctx);
    worker_stop(&w);
}

START_TEST(test_replay_three_frame)
{
    replay_form(0);
}
END_TEST

START_TEST(test_replay_two_frame)
{
    replay_form(1);
}
END_TEST

Suite *mock_worker_suite(void);
Suite *mock_worker_suite(void)
{
    Suite *s = suite_create("mock_worker");
    TCase *api = tcase_create("api");
    tcase_set_timeout(api, 120);
    tcase_add_test(api, test_prefix_cache_and_events);
    tcase_add_test(api, test_eviction_events);
    tcase_add_test(api, test_corrupt_seq_and_medium);
    tcase_add_test(api, test_streaming);
    tcase_add_test(api, test_replay_three_frame);
    tcase_add_test(api, test_replay_two_frame);
    tcase_add_test(api, test_latency_and_concurrency);
    suite_add_tcase(s, api);
    TCase *edge = tcase_create("edge");
    tcase_set_timeout(edge, 120);
    tcase_add_test(edge, test_faults);
    suite_add_tcase(s, edge);
    return s;
}
