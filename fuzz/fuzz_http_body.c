/* fuzz_http_body.c - request bodies of every JSON endpoint, through the real router: a kvrouter
 * (srv_new + srv_start, one HTTP thread, 127.0.0.1, an ephemeral port) runs inside the fuzzer
 * process; the first input byte picks the endpoint, the rest is sent as its body over a
 * keep-alive connection. Checks beyond "no crash, no sanitizer report":
 *
 *   - an answer within 10 s (no hang), with a status in the endpoint's allowed set (never 500);
 *   - every 4xx/5xx answer is a JSON object with a string "error";
 *   - the router keeps serving (GET /healthz every 256 inputs).
 *
 * Endpoints: /query_by_hash, /query, /v1/route, /v1/completions, /v1/chat/completions,
 * /v1/events (two models), /register, /unregister, POST and DELETE /v1/workers. Two workers are
 * configured with URLs nobody listens on (127.0.0.1:1: connection refused at once), so proxied
 * requests fail fast with 503 and /tokenize falls back. Registration bodies that contain any other
 * "://" are sent to /query instead: they could name real endpoints (ZMQ subscriptions, health
 * checks to arbitrary hosts), which a fuzzer must not open; the one URL they may name is the
 * refusing "http://127.0.0.1:1".
 *
 * The router keeps its state between inputs (indexes, bookings), like a long-running one: a
 * finding may need the inputs before it; libFuzzer's -runs/-seed replays them in order. Leak
 * detection per input does not apply (the state grows): run with -detect_leaks=0. The replay
 * build stops the router at exit (atexit), so valgrind/ASan see a clean shutdown.
 * KVR_FUZZ_VERBOSE=1 prints each input's endpoint and answer (for writing seeds). */
#define _GNU_SOURCE 1 /* SOCK_CLOEXEC */
#include <errno.h>
#include <json-c/json.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>

#include "config.h"
#include "log.h"
#include "server.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Allowed answers per endpoint (besides 200/201). */
#define A_400 (1u << 0)
#define A_404 (1u << 1)
#define A_409 (1u << 2)
#define A_503 (1u << 3)
#define A_504 (1u << 4)
#define A_507 (1u << 5)
#define A_502 (1u << 7)

struct endpoint {
    const char *method;
    const char *path;
    unsigned allowed;
    int registers; /* may create workers: bodies with "://" go elsewhere */
};

static const struct endpoint endpoints[] = {
    {"POST", "/query_by_hash", A_400 | A_404 | A_503, 0},
    {"POST", "/query", A_400 | A_404 | A_503, 0},
    {"POST", "/v1/route", A_400 | A_404 | A_409 | A_503 | A_507, 0},
    {"POST", "/v1/completions", A_400 | A_404 | A_502 | A_503 | A_504, 0},
    {"POST", "/v1/chat/completions", A_400 | A_404 | A_502 | A_503 | A_504, 0},
    {"POST", "/v1/events", A_400 | A_404 | A_409 | A_503 | A_507, 0},
    {"POST", "/v1/events?model=approx", A_400 | A_404 | A_409 | A_503 | A_507, 0},
    /* 507: the model table is full (256; registrations create models) */
    {"POST", "/register", A_400 | A_404 | A_409 | A_503 | A_507, 1},
    {"POST", "/unregister", A_400 | A_404 | A_409 | A_503, 0},
    {"POST", "/v1/workers", A_400 | A_404 | A_409 | A_503 | A_507, 1},
    {"DELETE", "/v1/workers", A_400 | A_404 | A_409 | A_503, 0},
};
#define N_ENDPOINTS (sizeof(endpoints) / sizeof(endpoints[0]))

/* The router under test and the client connection (a fuzz target has no main to own them). */
static struct {
    struct srv_config cfg;
    struct srv_logger log;
    struct srv *s;
    int fd;
    uint64_t inputs;
    char *rbuf;
    size_t rcap;
} fz = {.fd = -1};

static void die(const char *what)
{
    fprintf(stderr, "fuzz_http_body: %s\n", what);
    abort();
}

static void stop_router(void)
{
    if (fz.fd != -1)
        close(fz.fd);
    fz.fd = -1;
    if (fz.s != NULL) {
        srv_stop(fz.s);
        srv_free(fz.s);
        fz.s = NULL;
        srv_config_free(&fz.cfg);
    }
    free(fz.rbuf);
    fz.rbuf = NULL;
}

static void start_router(void)
{
    char *argv[] = {"fuzz_http_body",
                    "--listen",
                    "127.0.0.1:0",
                    "--threads",
                    "1",
                    "--health-interval",
                    "0",
                    "--retries",
                    "1",
                    "--retry-backoff",
                    "0",
                    "--breaker-failures",
                    "0",
                    "--tokenize-timeout",
                    "200ms",
                    "--upstream-timeout",
                    "2s",
                    "--shutdown-grace",
                    "1s",
                    "--log-level",
                    "error",
                    "--model",
                    "default,block_size=4",
                    "--model",
                    "approx,block_size=4,kind=approx,tokenizer=bytes",
                    "--worker",
                    "id=1,model=default,url=http://127.0.0.1:1",
                    "--worker",
                    "id=2,model=approx,url=http://127.0.0.1:1,dp=2",
                    NULL};
    int argc = (int)(sizeof(argv) / sizeof(argv[0])) - 1;
    char err[SRV_CFG_ERR];
    signal(SIGPIPE, SIG_IGN);
    srv_config_init(&fz.cfg);
    if (srv_config_parse_args(&fz.cfg, argc, argv, stdout, err, sizeof(err)) != 0) {
        fprintf(stderr, "fuzz_http_body: config: %s\n", err);
        abort();
    }
    int devnull = open("/dev/null", O_WRONLY | O_CLOEXEC);
    srv_log_init(&fz.log, devnull != -1 ? devnull : STDERR_FILENO, SRV_LOG_ERROR);
    if (srv_new(&fz.cfg, &fz.log, &fz.s, err, sizeof(err)) != 0 ||
        srv_start(fz.s, err, sizeof(err)) != 0) {
        fprintf(stderr, "fuzz_http_body: start: %s\n", err);
        abort();
    }
    atexit(stop_router);
}

static int connect_router(void)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd == -1)
        die("socket");
    struct sockaddr_in a;
    memset(&a, 0, sizeof(a));
    a.sin_family = AF_INET;
    a.sin_port = htons(fz.s->port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&a, sizeof(a)) == -1)
        die("cannot connect to the router: is it still serving?");
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    return fd;
}

static int send_all(int fd, const void *p, size_t n)
{
    const char *c = p;
    while (n > 0) {
        ssize_t k = send(fd, c, n, MSG_NOSIGNAL);
        if (k == -1 && errno == EINTR)
            continue;
        if (k <= 0)
            return -1;
        c += k;
        n -= (size_t)k;
    }
    return 0;
}

/* Reads one response (Content-Length or chunked). Returns the status, the body in *body and *blen
 * (in fz.rbuf), *closes when the server will close. -1 when the connection broke. */
static int read_response(int fd, const char **body, size_t *blen, int *closes)
{
    size_t len = 0, hdr_end = 0;
    long clen = -1;
    int chunked = 0;
    *closes = 0;
    for (;;) {
        if (hdr_end != 0) {
            if (clen >= 0 && len >= hdr_end + (size_t)clen)
                break;
            if (chunked && len >= hdr_end + 5 && memcmp(fz.rbuf + len - 5, "0\r\n\r\n", 5) == 0)
                break;
        }
        if (len + 65536 > fz.rcap) {
            size_t cap = fz.rcap ? fz.rcap * 2 : 1u << 17;
            char *b = realloc(fz.rbuf, cap);
            if (b == NULL)
                die("out of memory");
            fz.rbuf = b;
            fz.rcap = cap;
        }
        struct pollfd p = {fd, POLLIN, 0};
        int pr = poll(&p, 1, 10000);
        if (pr == 0)
            die("no answer within 10 s (the router hangs)");
        ssize_t k = recv(fd, fz.rbuf + len, fz.rcap - len - 1, 0);
        if (k == -1 && errno == EINTR)
            continue;
        if (k <= 0) {
            if (hdr_end != 0 && clen < 0 && !chunked)
                break; /* body until close */
            return -1;
        }
        len += (size_t)k;
        fz.rbuf[len] = '\0';
        if (hdr_end == 0) {
            char *e = strstr(fz.rbuf, "\r\n\r\n");
            if (e == NULL)
                continue;
            hdr_end = (size_t)(e - fz.rbuf) + 4;
            *e = '\0';
            for (char *h = strstr(fz.rbuf, "\r\n"); h != NULL; h = strstr(h + 2, "\r\n")) {
                if (strncasecmp(h + 2, "Content-Length:", 15) == 0)
                    clen = strtol(h + 17, NULL, 10);
                else if (strncasecmp(h + 2, "Transfer-Encoding: chunked", 26) == 0)
                    chunked = 1;
                else if (strncasecmp(h + 2, "Connection: close", 17) == 0)
                    *closes = 1;
            }
            *e = '\r';
        }
    }
    int status = 0;
    if (sscanf(fz.rbuf, "HTTP/1.1 %d", &status) != 1)
        die("not an HTTP/1.1 status line");
    *body = fz.rbuf + hdr_end;
    *blen = len - hdr_end;
    return status;
}

static int exchange(const char *method, const char *path, const uint8_t *body, size_t blen,
                    const char **rbody, size_t *rlen)
{
    char head[512];
    int n = snprintf(head, sizeof(head),
                     "%s %s HTTP/1.1\r\nHost: fuzz\r\nContent-Type: application/json\r\n"
                     "Content-Length: %zu\r\n\r\n",
                     method, path, blen);
    for (int attempt = 0; attempt < 2; attempt++) {
        if (fz.fd == -1)
            fz.fd = connect_router();
        int closes = 0, status = -1;
        if (send_all(fz.fd, head, (size_t)n) == 0 && send_all(fz.fd, body, blen) == 0)
            status = read_response(fz.fd, rbody, rlen, &closes);
        if (status < 0 || closes) {
            close(fz.fd);
            fz.fd = -1;
        }
        if (status >= 0)
            return status;
        /* the server closed an idle keep-alive connection: once more on a new one */
    }
    die("the connection broke twice in a row");
    return -1;
}

static int allowed(const struct endpoint *e, int st)
{
    switch (st) {
    case 200:
    case 201:
        return 1;
    case 400:
        return (e->allowed & A_400) != 0;
    case 404:
        return (e->allowed & A_404) != 0;
    case 409:
        return (e->allowed & A_409) != 0;
    case 413:
        return 1; /* libevent's own answer to a body above --max-body */
    case 502:
        return (e->allowed & A_502) != 0;
    case 503:
        return (e->allowed & A_503) != 0;
    case 504:
        return (e->allowed & A_504) != 0;
    case 507:
        return (e->allowed & A_507) != 0;
    default:
        return 0;
    }
}

/* 1 if every "://" in the body belongs to the exact string "http://127.0.0.1:1" (a port nobody
 * listens on): registrations may then name only that URL, never a real host or a ZMQ endpoint. */
static int safe_endpoints(const uint8_t *body, size_t len)
{
    static const char ok[] = "\"http://127.0.0.1:1\"";
    const size_t ok_len = sizeof(ok) - 1, scheme = 5; /* '"' + "http" before "://" */
    for (size_t k = 0; k + 3 <= len; k++) {
        if (memcmp(body + k, "://", 3) != 0)
            continue;
        if (k < scheme || k - scheme + ok_len > len || memcmp(body + k - scheme, ok, ok_len) != 0)
            return 0;
    }
    return 1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size == 0)
        return 0;
    if (fz.s == NULL)
        start_router();
    const struct endpoint *e = &endpoints[data[0] % N_ENDPOINTS];
    const uint8_t *body = data + 1;
    size_t blen = size - 1;
    if (e->registers && !safe_endpoints(body, blen))
        e = &endpoints[1]; /* never register real endpoints */
    const char *rb;
    size_t rl;
    int st = exchange(e->method, e->path, body, blen, &rb, &rl);
    if (getenv("KVR_FUZZ_VERBOSE") != NULL) /* for writing seeds: what each input got */
        fprintf(stderr, "%s %s -> %d %.*s\n", e->method, e->path, st, (int)(rl > 200 ? 200 : rl),
                rb);
    if (!allowed(e, st)) {
        fprintf(stderr, "fuzz_http_body: %s %s answered %d: %.*s\n", e->method, e->path, st,
                (int)(rl > 400 ? 400 : rl), rb);
        abort();
    }
    if (st >= 400 && st != 413) {
        struct json_tokener *tok = json_tokener_new();
        struct json_object *o = tok ? json_tokener_parse_ex(tok, rb, (int)rl) : NULL;
        struct json_object *msg = NULL;
        if (tok != NULL && (o == NULL || !json_object_is_type(o, json_type_object) ||
                            !json_object_object_get_ex(o, "error", &msg) ||
                            !json_object_is_type(msg, json_type_string))) {
            fprintf(stderr, "fuzz_http_body: %s %s answered %d without a JSON error: %.*s\n",
                    e->method, e->path, st, (int)(rl > 400 ? 400 : rl), rb);
            abort();
        }
        json_object_put(o);
        json_tokener_free(tok);
    }
    if (++fz.inputs % 256 == 0) {
        if (exchange("GET", "/healthz", (const uint8_t *)"", 0, &rb, &rl) != 200)
            die("/healthz does not answer 200 any more");
        /* inputs may have removed the two workers: put them back (201, or 409 when present) */
        static const char *const w[2] = {
            "{\"id\":1,\"model\":\"default\",\"url\":\"http://127.0.0.1:1\"}",
            "{\"id\":2,\"model\":\"approx\",\"url\":\"http://127.0.0.1:1\",\"dp_size\":2}"};
        for (int k = 0; k < 2; k++) {
            st = exchange("POST", "/v1/workers", (const uint8_t *)w[k], strlen(w[k]), &rb, &rl);
            if (st != 201 && st != 409)
                die("cannot put the workers back");
        }
    }
    return 0;
}
