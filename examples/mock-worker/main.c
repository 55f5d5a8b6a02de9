/* main.c - kvr-mock-worker: flags, wiring and the event loop (see mock.h and README.md). */
#include <event2/event.h>
#include <event2/http.h>
#include <getopt.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "mock.h"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: kvr-mock-worker [options]\n"
            "  --host H               HTTP address (127.0.0.1)\n"
            "  --port P               HTTP port; 0 = ephemeral, printed (8000)\n"
            "  --model NAME           model name (mock-model)\n"
            "  --block-size N         tokens per KV block (16)\n"
            "  --cache-blocks N       prefix-cache capacity in blocks (1024)\n"
            "  --vocab N              tokenizer id space (32000)\n"
            "  --max-model-len N      prompt + max_tokens limit (32768)\n"
            "  --max-tokens N         default max_tokens (16)\n"
            "  --prefill-us N         prefill time per uncached prompt token, us (10)\n"
            "  --decode-us N          time per output token, us (1000)\n"
            "  --max-concurrent N     requests in flight; others queue (8; 0 = unlimited)\n"
            "  --max-queue N          queued requests before 503 (0 = unlimited)\n"
            "  --zmq EP               publish KV events on EP, e.g. tcp://127.0.0.1:5557\n"
            "                         (bound; 'tcp://127.0.0.1:*' picks a port, printed)\n"
            "  --zmq-connect          connect the KV-event socket instead of binding it\n"
            "  --topic T              topic frame of every KV-event message (\"\")\n"
            "  --replay EP            replay ROUTER endpoint (bound)\n"
            "  --replay-buffer N      batches kept for replay (10000)\n"
            "  --replay-two-frame     replay replies without the topic frame (old vLLM, SGLang)\n"
            "  --legacy-events        positional (array_like) events instead of maps\n"
            "  --dp-rank N            data_parallel_rank in every batch (0)\n"
            "  --no-dp-rank           publish data_parallel_rank as nil\n"
            "  --fail-rate F          fraction of requests failed with --status-code (0)\n"
            "  --status-code N        status of injected failures (500)\n"
            "  --die-after-chunks N   close streaming connections after N chunks (off)\n"
            "  --seed N               seed for --fail-rate draws (1)\n"
            "  --drop-seq N[,N...]    never publish these batches live (they stay replayable)\n"
            "  --corrupt-seq N[,N...] publish these batches one byte short (a malformed msgpack\n"
            "                         payload, live and in the replay buffer)\n"
            "  --medium M             medium of every KV event: GPU, CPU, DISK, ... (GPU)\n");
}

static int parse_u64(const char *s, uint64_t max, uint64_t *out)
{
    char *end;
    if (s == NULL || *s == '\0' || *s == '-')
        return -1;
    unsigned long long v = strtoull(s, &end, 10);
    if (*end != '\0' || v > max)
        return -1;
    *out = v;
    return 0;
}

enum {
    O_HOST = 1000,
    O_PORT,
    O_MODEL,
    O_BLOCK,
    O_CACHE,
    O_VOCAB,
    O_MAXLEN,
    O_MAXTOK,
    O_PREFILL,
    O_DECODE,
    O_CONC,
    O_QUEUE,
    O_ZMQ,
    O_ZMQ_CONNECT,
    O_TOPIC,
    O_REPLAY,
    O_REPLAY_BUF,
    O_TWO_FRAME,
    O_LEGACY,
    O_DP,
    O_NO_DP,
    O_FAIL,
    O_STATUS,
    O_DIE,
    O_SEED,
    O_DROP_SEQ,
    O_CORRUPT_SEQ,
    O_MEDIUM,
    O_HELP,
};

/* Comma-separated sequence numbers, at most 16, appended to list[*n]. 0 or -1. */
static int parse_seq_list(const char *arg, uint64_t *list, uint32_t *n)
{
    char buf[256];
    int bad = strlen(arg) >= sizeof(buf);
    snprintf(buf, sizeof(buf), "%s", arg);
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok != NULL && !bad;
         tok = strtok_r(NULL, ",", &save)) {
        uint64_t v = 0;
        bad = *n == 16 || parse_u64(tok, UINT64_MAX, &v);
        if (!bad)
            list[(*n)++] = v;
    }
    return bad ? -1 : 0;
}

static int parse_args(int argc, char **argv, struct mock_cfg *c)
{
    static const struct option opts[] = {
        {"host", required_argument, NULL, O_HOST},
        {"port", required_argument, NULL, O_PORT},
        {"model", required_argument, NULL, O_MODEL},
        {"block-size", required_argument, NULL, O_BLOCK},
        {"cache-blocks", required_argument, NULL, O_CACHE},
        {"vocab", required_argument, NULL, O_VOCAB},
        {"max-model-len", required_argument, NULL, O_MAXLEN},
        {"max-tokens", required_argument, NULL, O_MAXTOK},
        {"prefill-us", required_argument, NULL, O_PREFILL},
        {"decode-us", required_argument, NULL, O_DECODE},
        {"max-concurrent", required_argument, NULL, O_CONC},
        {"max-queue", required_argument, NULL, O_QUEUE},
        {"zmq", required_argument, NULL, O_ZMQ},
        {"zmq-connect", no_argument, NULL, O_ZMQ_CONNECT},
        {"topic", required_argument, NULL, O_TOPIC},
        {"replay", required_argument, NULL, O_REPLAY},
        {"replay-buffer", required_argument, NULL, O_REPLAY_BUF},
        {"replay-two-frame", no_argument, NULL, O_TWO_FRAME},
        {"legacy-events", no_argument, NULL, O_LEGACY},
        {"dp-rank", required_argument, NULL, O_DP},
        {"no-dp-rank", no_argument, NULL, O_NO_DP},
        {"fail-rate", required_argument, NULL, O_FAIL},
        {"status-code", required_argument, NULL, O_STATUS},
        {"die-after-chunks", required_argument, NULL, O_DIE},
        {"seed", required_argument, NULL, O_SEED},
        {"drop-seq", required_argument, NULL, O_DROP_SEQ},
        {"corrupt-seq", required_argument, NULL, O_CORRUPT_SEQ},
        {"medium", required_argument, NULL, O_MEDIUM},
        {"help", no_argument, NULL, O_HELP},
        {NULL, 0, NULL, 0},
    };
    int o;
    uint64_t v = 0;
    while ((o = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        int bad = 0;
        switch (o) {
        case O_HOST:
            c->host = optarg;
            break;
        case O_PORT:
            bad = parse_u64(optarg, 65535, &v);
            c->port = (int)v;
            break;
        case O_MODEL:
            c->model = optarg;
            break;
        case O_BLOCK:
            bad = parse_u64(optarg, 1u << 20, &v) || v == 0;
            c->block_size = (uint32_t)v;
            break;
        case O_CACHE:
            bad = parse_u64(optarg, 1u << 30, &v) || v == 0;
            c->cache_blocks = (uint32_t)v;
            break;
        case O_VOCAB:
            bad = parse_u64(optarg, UINT32_MAX, &v) || v <= 100;
            c->vocab = (uint32_t)v;
            break;
        case O_MAXLEN:
            bad = parse_u64(optarg, UINT32_MAX, &v) || v == 0;
            c->max_model_len = (uint32_t)v;
            break;
        case O_MAXTOK:
            bad = parse_u64(optarg, UINT32_MAX, &v) || v == 0;
            c->default_max_tokens = (uint32_t)v;
            break;
        case O_PREFILL:
            bad = parse_u64(optarg, 60000000, &c->prefill_us);
            break;
        case O_DECODE:
            bad = parse_u64(optarg, 60000000, &c->decode_us);
            break;
        case O_CONC:
            bad = parse_u64(optarg, UINT32_MAX, &v);
            c->max_concurrent = (uint32_t)v;
            break;
        case O_QUEUE:
            bad = parse_u64(optarg, UINT32_MAX, &v);
            c->max_queue = (uint32_t)v;
            break;
        case O_ZMQ:
            c->zmq = optarg;
            break;
        case O_ZMQ_CONNECT:
            c->zmq_connect = 1;
            break;
        case O_TOPIC:
            c->topic = optarg;
            break;
        case O_REPLAY:
            c->replay = optarg;
            break;
        case O_REPLAY_BUF:
            bad = parse_u64(optarg, 1u << 24, &v) || v == 0;
            c->replay_buffer = (uint32_t)v;
            break;
        case O_TWO_FRAME:
            c->replay_two_frame = 1;
            break;
        case O_LEGACY:
            c->legacy = 1;
            break;
        case O_DP:
            bad = parse_u64(optarg, UINT32_MAX, &v);
            c->dp_rank = (uint32_t)v;
            c->has_dp_rank = 1;
            break;
        case O_NO_DP:
            c->has_dp_rank = 0;
            break;
        case O_FAIL: {
            char *end;
            c->fail_rate = strtod(optarg, &end);
            bad = *end != '\0' || !(c->fail_rate >= 0 && c->fail_rate <= 1);
            break;
        }
        case O_STATUS:
            bad = parse_u64(optarg, 599, &v) || v < 100;
            c->status_code = (int)v;
            break;
        case O_DIE:
            bad = parse_u64(optarg, UINT32_MAX, &v);
            c->die_after_chunks = (uint32_t)v;
            break;
        case O_SEED:
            bad = parse_u64(optarg, UINT64_MAX, &c->seed);
            break;
        case O_DROP_SEQ:
            bad = parse_seq_list(optarg, c->drop_seq, &c->n_drop_seq);
            break;
        case O_CORRUPT_SEQ:
            bad = parse_seq_list(optarg, c->corrupt_seq, &c->n_corrupt_seq);
            break;
        case O_MEDIUM:
            bad = *optarg == '\0' || strlen(optarg) > 64;
            c->medium = optarg;
            break;
        case O_HELP:
            usage(stdout);
            exit(0);
        default:
            usage(stderr);
            return -1;
        }
        if (bad) {
            fprintf(stderr, "kvr-mock-worker: bad value for --%s: %s\n", opts[o - O_HOST].name,
                    optarg);
            return -1;
        }
    }
    if (optind < argc) {
        usage(stderr);
        return -1;
    }
    if (c->replay != NULL && c->zmq == NULL) {
        fprintf(stderr, "kvr-mock-worker: --replay needs --zmq\n");
        return -1;
    }
    return 0;
}

static void on_signal(evutil_socket_t sig, short what, void *arg)
{
    (void)sig;
    (void)what;
    event_base_loopexit(arg, NULL);
}

int main(int argc, char **argv)
{
    struct mock m;
    struct event *sigint = NULL, *sigterm = NULL;
    struct evhttp_bound_socket *bound;
    int rc = 1;
    memset(&m, 0, sizeof(m));
    m.cfg.host = "127.0.0.1";
    m.cfg.port = 8000;
    m.cfg.model = "mock-model";
    m.cfg.block_size = 16;
    m.cfg.cache_blocks = 1024;
    m.cfg.vocab = 32000;
    m.cfg.max_model_len = 32768;
    m.cfg.default_max_tokens = 16;
    m.cfg.prefill_us = 10;
    m.cfg.decode_us = 1000;
    m.cfg.max_concurrent = 8;
    m.cfg.topic = "";
    m.cfg.medium = "GPU";
    m.cfg.replay_buffer = 10000;
    m.cfg.has_dp_rank = 1;
    m.cfg.status_code = 500;
    m.cfg.seed = 1;
    int bad_args = parse_args(argc, argv, &m.cfg);
    m.cfg.medium_len = (uint32_t)strlen(m.cfg.medium);
    if (bad_args != 0)
        return 2;
    signal(SIGPIPE, SIG_IGN);

    m.base = event_base_new();
    if (m.base == NULL)
        goto out;
    m.http = evhttp_new(m.base);
    if (m.http == NULL || mock_cache_init(&m.cache, m.cfg.cache_blocks) != 0)
        goto out;
    evhttp_set_max_body_size(m.http, 64 << 20);
    bound = evhttp_bind_socket_with_handle(m.http, m.cfg.host, (ev_uint16_t)m.cfg.port);
    if (bound == NULL) {
        fprintf(stderr, "kvr-mock-worker: cannot listen on %s:%d\n", m.cfg.host, m.cfg.port);
        goto out;
    }
    struct sockaddr_storage ss;
    socklen_t sl = sizeof(ss);
    int port = m.cfg.port;
    if (getsockname(evhttp_bound_socket_get_fd(bound), (struct sockaddr *)&ss, &sl) == 0) {
        if (ss.ss_family == AF_INET)
            port = ntohs(((struct sockaddr_in *)&ss)->sin_port);
        else if (ss.ss_family == AF_INET6)
            port = ntohs(((struct sockaddr_in6 *)&ss)->sin6_port);
    }
    if (m.cfg.zmq != NULL) {
        if (mock_pub_open(&m.pub, m.base, &m.cfg) != 0)
            goto out;
        m.has_pub = 1;
    }
    if (mock_http_setup(&m) != 0)
        goto out;
    sigint = evsignal_new(m.base, SIGINT, on_signal, m.base);
    sigterm = evsignal_new(m.base, SIGTERM, on_signal, m.base);
    if (sigint == NULL || sigterm == NULL || event_add(sigint, NULL) == -1 ||
        event_add(sigterm, NULL) == -1)
        goto out;

    printf("kvr-mock-worker: http http://%s:%d model %s block-size %u cache-blocks %u\n",
           m.cfg.host, port, m.cfg.model, m.cfg.block_size, m.cfg.cache_blocks);
    if (m.has_pub) {
        printf("kvr-mock-worker: zmq %s topic \"%s\" events %s\n", m.pub.endpoint, m.cfg.topic,
               m.cfg.legacy ? "legacy-array" : "map");
        if (m.pub.router != NULL)
            printf("kvr-mock-worker: replay %s form %s\n", m.pub.replay_endpoint,
                   m.cfg.replay_two_frame ? "2-frame" : "3-frame");
    }
    printf("kvr-mock-worker: ready\n");
    fflush(stdout);
    event_base_dispatch(m.base);
    rc = 0;
out:
    mock_http_shutdown(&m);
    if (sigint)
        event_free(sigint);
    if (sigterm)
        event_free(sigterm);
    if (m.http)
        evhttp_free(m.http);
    if (m.has_pub)
        mock_pub_close(&m.pub);
    mock_cache_free(&m.cache);
    if (m.base)
        event_base_free(m.base);
    return rc;
}
