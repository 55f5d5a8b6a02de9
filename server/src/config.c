/* config.c - flags, the sandboxed Lua config file, validation (see config.h). */
#include "config.h"

#include <ctype.h>
#include <errno.h>
#include <getopt.h>
#include <lauxlib.h>
#include <lua.h>
#include <luajit.h>
#include <lualib.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "log.h"

#define KVR_VERSION_STRING "kvrouter 0.1.0"

/* ==== the settings table ====================================================================== */

enum opt_type { T_STR, T_U32, T_U64, T_SIZE, T_MS, T_BOOL, T_LISTEN, T_LEVEL, T_TOK, T_DBL };

struct opt {
    const char *flag; /* long option, without "--" */
    const char *key;  /* key path in the Lua file */
    int type;         /* enum opt_type */
    size_t off;       /* field in struct srv_config */
    uint64_t min;     /* integers: inclusive range */
    uint64_t max;
    const char *arg;  /* metavariable in --help */
    const char *help; /* one line */
    const char *def;  /* default, as shown in --help */
};

#define OFF(f) offsetof(struct srv_config, f)

static const struct opt opts[] = {
    {"listen", "listen", T_LISTEN, OFF(listen_host), 0, 0, "HOST:PORT",
     "address to listen on (port 0 picks a free port, printed at start)", "127.0.0.1:8080"},
    {"threads", "threads", T_U32, OFF(threads), 1, SRV_MAX_THREADS, "N",
     "HTTP threads, each with its own event loop on the shared port", "2"},
    {"admin-token", "admin_token", T_STR, OFF(admin_token), 0, 0, "TOKEN",
     "bearer token for the protected routes (/admin/*, POST/DELETE /v1/workers, /register, "
     "/unregister, /dump); without it they answer loopback clients only",
     "none"},
    {"open-indexer-api", "open_indexer_api", T_BOOL, OFF(open_indexer_api), 0, 1, NULL,
     "leave the Dynamo-compatible indexer writes (/register, /unregister) and /dump open to "
     "every client",
     "off"},
    {"test-loopback-is-remote", "test_loopback_is_remote", T_BOOL, OFF(test_loopback_is_remote), 0,
     1, NULL, "testing only: the protected routes treat loopback clients as remote (403)", "off"},
    {"max-body", "limits.max_body", T_SIZE, OFF(max_body), 64, UINT32_MAX, "SIZE",
     "largest request body (bigger: 413)", "8M"},
    {"max-headers", "limits.max_headers", T_SIZE, OFF(max_headers), 256, 16u << 20, "SIZE",
     "largest request header block (bigger: 400, connection closed)", "64K"},
    {"max-connections", "limits.max_connections", T_U32, OFF(max_connections), 1, 1000000, "N",
     "open client connections (spread over threads); new ones wait in the backlog", "10000"},
    {"timeout", "limits.timeout", T_MS, OFF(timeout_ms), 1, 86400000, "DUR",
     "client connection read/write idle timeout", "60s"},
    {"header-timeout", "limits.header_timeout", T_MS, OFF(header_timeout_ms), 1, 86400000, "DUR",
     "a request's line and headers must arrive within DUR of its first byte (then 408, closed)",
     "10s"},
    {"body-timeout", "limits.body_timeout", T_MS, OFF(body_timeout_ms), 1, 86400000, "DUR",
     "a request's body must arrive within DUR of the end of its headers (then 408, closed)", "60s"},
    {"upstream-timeout", "limits.upstream_timeout", T_MS, OFF(upstream_timeout_ms), 1, 86400000,
     "DUR", "worker connect and read idle timeout", "300s"},
    {"upstream-pool", "limits.upstream_pool", T_U32, OFF(upstream_pool), 1, 100000, "N",
     "connections per worker per thread (more requests queue)", "64"},
    {"snapshot", "snapshot.path", T_STR, OFF(snapshot_path), 0, 0, "FILE",
     "restore the index from FILE at start; write it on shutdown, periodically and on "
     "POST /admin/snapshot",
     "none"},
    {"snapshot-period", "snapshot.period", T_MS, OFF(snapshot_period_ms), 0, 86400000ull * 365,
     "DUR", "periodic snapshot interval (0 = off)", "0"},
    {"policy", "policy", T_STR, OFF(policy), 0, 0, "FILE|NAME",
     "default routing policy: a Lua file or a shipped policy name",
     "bounded_affinity (without the Lua runtime: the built-in kv cost)"},
    {"allow-policy-header", "allow_policy_header", T_BOOL, OFF(allow_policy_header), 0, 1, NULL,
     "let clients pick an installed policy with the x-kvrouter-policy header", "off"},
    {"policy-budget", "policy_budget", T_MS, OFF(policy_budget_ms), 1, 60000, "DUR",
     "time budget per policy decision (then the built-in policy decides)", "10ms"},
    {"policy-trusted", "policy_trusted", T_BOOL, OFF(policy_trusted), 0, 1, NULL,
     "trust the configured policy files (--policy FILE, models' policy files): they run "
     "JIT-compiled, several times faster, but a compiled loop cannot be interrupted by the time "
     "budget (only by the watchdog, see --policy-stuck-after); admin-installed policies stay "
     "sandboxed",
     "off"},
    {"policy-stuck-after", "policy_stuck_after", T_MS, OFF(policy_stuck_after_ms), 0, 3600000,
     "DUR",
     "the watchdog: a thread in one policy call this long is stuck (logged, counted, /readyz "
     "503) and a trusted policy's call is interrupted once it runs compiled code (0 = off)",
     "1s"},
    {"policy-dev", "policy_dev", T_BOOL, OFF(policy_dev), 0, 1, NULL,
     "development: re-install a policy file whenever its modification time changes (checked "
     "from the control thread's tick)",
     "off"},
    {"script-budget", "script_budget", T_MS, OFF(script_budget_ms), 1, 600000, "DUR",
     "time budget of an operator script (POST /admin/script, run on the control thread)", "5s"},
    {"health-interval", "health.interval", T_MS, OFF(health_interval_ms), 0, 86400000, "DUR",
     "active health check period per worker (0 = off)", "10s"},
    {"health-timeout", "health.timeout", T_MS, OFF(health_timeout_ms), 1, 600000, "DUR",
     "health check timeout", "2s"},
    {"health-path", "health.path", T_STR, OFF(health_path), 0, 0, "PATH",
     "health check path on the worker's URL", "/health"},
    {"health-fails", "health.fails", T_U32, OFF(health_fails), 1, 1000, "N",
     "consecutive failed checks that mark a worker unhealthy", "3"},
    {"health-passes", "health.passes", T_U32, OFF(health_passes), 1, 1000, "N",
     "consecutive passed checks that mark it healthy again", "2"},
    {"breaker-failures", "breaker.failures", T_U32, OFF(breaker_failures), 0, 100000, "N",
     "consecutive request failures that open a worker's circuit breaker (0 = off)", "5"},
    {"breaker-successes", "breaker.successes", T_U32, OFF(breaker_successes), 1, 100000, "N",
     "successful probes that close it again", "2"},
    {"breaker-open", "breaker.open", T_MS, OFF(breaker_open_ms), 1, 86400000, "DUR",
     "time a breaker stays open before probing", "10s"},
    {"retries", "retry.max", T_U32, OFF(retry_max), 0, 16, "N",
     "extra attempts on another worker when a connection fails or 5xx/429 comes before the "
     "first byte",
     "2"},
    {"retry-backoff", "retry.backoff", T_MS, OFF(retry_backoff_ms), 0, 600000, "DUR",
     "first retry delay, doubled per attempt (+-20% jitter)", "20ms"},
    {"retry-backoff-max", "retry.backoff_max", T_MS, OFF(retry_backoff_max_ms), 0, 600000, "DUR",
     "retry delay cap", "1s"},
    {"tokenize-timeout", "tokenize_timeout", T_MS, OFF(tokenize_timeout_ms), 1, 600000, "DUR",
     "timeout of a worker /tokenize call (then the request is routed without overlap)", "2s"},
    {"shutdown-grace", "shutdown_grace", T_MS, OFF(shutdown_grace_ms), 0, 3600000, "DUR",
     "on SIGTERM, time in-flight requests get to finish", "30s"},
    {"block-size", "block_size", T_U32, OFF(block_size), 2, 65536, "N",
     "block size of the default model (used when no model is configured)", "16"},
    {"tokenizer", "tokenizer", T_TOK, OFF(tokenizer), 0, 0, "MODE",
     "text prompts: auto | worker (/tokenize) | bytes (approximate) | none", "auto"},
    {"log-level", "log_level", T_LEVEL, OFF(log_level), 0, 0, "LEVEL",
     "error | warn | info | debug", "info"},
    {"seed", "seed", T_U64, OFF(seed), 0, UINT64_MAX, "N", "seed for policy sampling and jitter",
     "1"},
    {"nats", "replicas.nats", T_STR, OFF(nats_url), 0, 0, "URL",
     "share booked load with the other replicas over NATS (e.g. nats://127.0.0.1:4222)", "off"},
    {"replica-id", "replicas.id", T_U64, OFF(replica_id), 1, UINT64_MAX, "N",
     "this replica's id on the sync subject (unique per replica)", "random"},
    {"replica-subject", "replicas.subject", T_STR, OFF(replica_subject), 0, 0, "SUBJECT",
     "NATS subject the replicas share", "kvrouter.replicas"},
    {"replica-timeout", "replicas.timeout", T_MS, OFF(replica_timeout_ms), 100, 3600000, "DUR",
     "a replica silent this long is presumed dead: its bookings are released", "5s"},
    {"replica-heartbeat", "replicas.heartbeat", T_MS, OFF(replica_heartbeat_ms), 10, 600000, "DUR",
     "heartbeat period of a quiet replica (keep it well under the timeout)", "1s"},
    {"replica-flush", "replicas.flush", T_MS, OFF(replica_flush_ms), 0, 1000, "DUR",
     "longest a booking waits before it is published (batches of up to 256 ops)", "1ms"},
    {"peers", "replicas.peers", T_STR, OFF(peers), 0, 0, "URL,URL",
     "bootstrap: fetch workers and the index from the first peer that answers (GET /v1/workers, "
     "GET /dump) after connecting to the event streams",
     "none"},
    {"peer-token", "replicas.peer_token", T_STR, OFF(peer_token), 0, 0, "TOKEN",
     "bearer token sent to the peers", "the admin token"},
    {"bootstrap-wait", "replicas.bootstrap_wait", T_MS, OFF(bootstrap_wait_ms), 0, 60000, "DUR",
     "wait after subscribing before fetching a peer's dump (ZMQ slow joiner)", "1s"},
};
#define N_OPTS (sizeof(opts) / sizeof(opts[0]))

/* Options outside the table. */
enum { O_HELP = 1000, O_VERSION, O_CONFIG, O_MODEL, O_WORKER, O_CHECK, O_TABLE };

__attribute__((format(printf, 3, 4))) static void errf(char *err, size_t err_len, const char *fmt,
                                                       ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, err_len, fmt, ap);
    va_end(ap);
}

/* ==== value parsers =========================================================================== */

static int parse_u64_str(const char *s, uint64_t *out)
{
    if (s == NULL || !isdigit((unsigned char)*s))
        return -1;
    errno = 0;
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno != 0 || *end != '\0')
        return -1;
    *out = v;
    return 0;
}

int srv_parse_size(const char *s, uint64_t *out)
{
    if (s == NULL || !isdigit((unsigned char)*s))
        return -1;
    errno = 0;
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno != 0)
        return -1;
    uint64_t mul = 1;
    if (*end != '\0') {
        switch (toupper((unsigned char)*end)) {
        case 'K':
            mul = 1024;
            break;
        case 'M':
            mul = 1024 * 1024;
            break;
        case 'G':
            mul = 1024ull * 1024 * 1024;
            break;
        default:
            return -1;
        }
        end++;
        if (*end == 'i' || *end == 'I')
            end++;
        if (*end == 'b' || *end == 'B')
            end++;
        if (*end != '\0')
            return -1;
    }
    if (v > UINT64_MAX / mul)
        return -1;
    *out = v * mul;
    return 0;
}

int srv_parse_duration_ms(const char *s, uint64_t *out)
{
    if (s == NULL || !(isdigit((unsigned char)*s) || *s == '.'))
        return -1;
    errno = 0;
    char *end;
    double v = strtod(s, &end);
    if (errno != 0 || end == s || !isfinite(v) || v < 0)
        return -1;
    double ms;
    if (*end == '\0' || strcmp(end, "s") == 0)
        ms = v * 1000.0;
    else if (strcmp(end, "ms") == 0)
        ms = v;
    else if (strcmp(end, "m") == 0)
        ms = v * 60000.0;
    else if (strcmp(end, "h") == 0)
        ms = v * 3600000.0;
    else
        return -1;
    if (ms > 1e15)
        return -1;
    *out = (uint64_t)llround(ms);
    return 0;
}

int srv_parse_listen(const char *s, char *host, size_t host_cap, uint16_t *port)
{
    const char *colon;
    size_t hl;
    if (s == NULL || *s == '\0')
        return -1;
    if (*s == '[') { /* [v6]:port */
        const char *rb = strchr(s, ']');
        if (rb == NULL || rb[1] != ':')
            return -1;
        hl = (size_t)(rb - s - 1);
        s++;
        colon = rb + 1;
    } else {
        colon = strrchr(s, ':');
        if (colon == NULL) { /* a bare port */
            uint64_t p;
            if (parse_u64_str(s, &p) != 0 || p > 65535)
                return -1;
            snprintf(host, host_cap, "127.0.0.1");
            *port = (uint16_t)p;
            return 0;
        }
        hl = (size_t)(colon - s);
    }
    uint64_t p;
    if (parse_u64_str(colon + 1, &p) != 0 || p > 65535 || hl == 0 || hl >= host_cap)
        return -1;
    memcpy(host, s, hl);
    host[hl] = '\0';
    *port = (uint16_t)p;
    return 0;
}

static const char *const kind_names[] = {"events", "approx"};
static const char *const tok_names[] = {"auto", "worker", "bytes", "none"};

int srv_kind_parse(const char *s)
{
    for (int k = 0; k < 2; k++)
        if (strcmp(s, kind_names[k]) == 0)
            return k;
    return -1;
}

int srv_tokenizer_parse(const char *s)
{
    for (int k = 0; k < 4; k++)
        if (strcmp(s, tok_names[k]) == 0)
            return k;
    return -1;
}

int srv_index_kind_parse(const char *s)
{
    static const char *const names[] = {"radix", "ckf", "both"};
    for (int k = 0; k < 3; k++)
        if (strcmp(s, names[k]) == 0)
            return k + 1; /* KVR_INDEX_RADIX = 1, CKF = 2, BOTH = 3 */
    return -1;
}

const char *srv_index_kind_name(int kind)
{
    static const char *const names[] = {"radix", "ckf", "both"};
    return kind >= 1 && kind <= 3 ? names[kind - 1] : "radix";
}

const char *srv_kind_name(int kind)
{
    return kind >= 0 && kind < 2 ? kind_names[kind] : "?";
}

const char *srv_tokenizer_name(int tok)
{
    return tok >= 0 && tok < 4 ? tok_names[tok] : "?";
}

static int set_str(char **dst, const char *v)
{
    char *d = strdup(v);
    if (d == NULL)
        return -1;
    free(*dst);
    *dst = d;
    return 0;
}

/* Applies one table setting from its text form. `who` names it in errors ("--threads",
 * "kvrouter.lua: threads"). */
static int apply_opt(struct srv_config *cfg, const struct opt *o, const char *v, const char *who,
                     char *err, size_t err_len)
{
    char *base = (char *)cfg;
    uint64_t u;
    switch (o->type) {
    case T_STR:
        if (v == NULL || *v == '\0') {
            errf(err, err_len, "%s: expected a non-empty string", who);
            return -1;
        }
        if (set_str((char **)(base + o->off), v) != 0)
            goto oom;
        return 0;
    case T_U32:
    case T_U64:
        if (parse_u64_str(v, &u) != 0 || u < o->min || u > o->max) {
            errf(err, err_len, "%s: expected an integer in %llu..%llu, got '%s'", who,
                 (unsigned long long)o->min, (unsigned long long)o->max, v ? v : "");
            return -1;
        }
        if (o->type == T_U32)
            *(uint32_t *)(base + o->off) = (uint32_t)u;
        else
            *(uint64_t *)(base + o->off) = u;
        return 0;
    case T_SIZE:
        if (srv_parse_size(v, &u) != 0 || u < o->min || u > o->max) {
            errf(err, err_len,
                 "%s: expected a size in bytes (e.g. 65536, 64K, 8M) from %llu to %llu, got '%s'",
                 who, (unsigned long long)o->min, (unsigned long long)o->max, v ? v : "");
            return -1;
        }
        *(uint64_t *)(base + o->off) = u;
        return 0;
    case T_MS:
        if (srv_parse_duration_ms(v, &u) != 0 || u < o->min || u > o->max) {
            errf(err, err_len,
                 "%s: expected a duration (seconds, or with ms/s/m/h) from %llums to %llums, got "
                 "'%s'",
                 who, (unsigned long long)o->min, (unsigned long long)o->max, v ? v : "");
            return -1;
        }
        *(uint64_t *)(base + o->off) = u;
        return 0;
    case T_BOOL:
        if (v == NULL || strcmp(v, "true") == 0 || strcmp(v, "1") == 0)
            *(int *)(base + o->off) = 1;
        else if (strcmp(v, "false") == 0 || strcmp(v, "0") == 0)
            *(int *)(base + o->off) = 0;
        else {
            errf(err, err_len, "%s: expected true or false, got '%s'", who, v);
            return -1;
        }
        return 0;
    case T_LISTEN: {
        char host[256];
        uint16_t port;
        if (srv_parse_listen(v, host, sizeof(host), &port) != 0) {
            errf(err, err_len, "%s: expected HOST:PORT (e.g. 127.0.0.1:8080, [::1]:8080), got '%s'",
                 who, v ? v : "");
            return -1;
        }
        if (set_str(&cfg->listen_host, host) != 0)
            goto oom;
        cfg->listen_port = port;
        return 0;
    }
    case T_LEVEL: {
        int lv = v != NULL ? srv_log_level_parse(v) : -1;
        if (lv < 0) {
            errf(err, err_len, "%s: expected error, warn, info or debug, got '%s'", who,
                 v ? v : "");
            return -1;
        }
        *(int *)(base + o->off) = lv;
        return 0;
    }
    case T_TOK: {
        int t = v != NULL ? srv_tokenizer_parse(v) : -1;
        if (t < 0) {
            errf(err, err_len, "%s: expected auto, worker, bytes or none, got '%s'", who,
                 v ? v : "");
            return -1;
        }
        *(int *)(base + o->off) = t;
        return 0;
    }
    default:
        break;
    }
    errf(err, err_len, "%s: unsupported setting type", who);
    return -1;
oom:
    errf(err, err_len, "%s: out of memory", who);
    return -1;
}

/* ==== defaults, free ========================================================================== */

void srv_config_init(struct srv_config *cfg)
{
    memset(cfg, 0, sizeof(*cfg));
    cfg->listen_host = strdup("127.0.0.1");
    cfg->listen_port = 8080;
    cfg->threads = 2;
    cfg->max_body = 8u << 20;
    cfg->max_headers = 64u << 10;
    cfg->max_connections = 10000;
    cfg->upstream_pool = 64;
    cfg->timeout_ms = 60000;
    cfg->header_timeout_ms = 10000;
    cfg->body_timeout_ms = 60000;
    cfg->upstream_timeout_ms = 300000;
    cfg->policy_budget_ms = 10;
    cfg->policy_stuck_after_ms = 1000;
    cfg->script_budget_ms = 5000;
    cfg->health_interval_ms = 10000;
    cfg->health_timeout_ms = 2000;
    cfg->health_path = strdup("/health");
    cfg->health_fails = 3;
    cfg->health_passes = 2;
    cfg->breaker_failures = 5;
    cfg->breaker_successes = 2;
    cfg->breaker_open_ms = 10000;
    cfg->retry_max = 2;
    cfg->retry_backoff_ms = 20;
    cfg->retry_backoff_max_ms = 1000;
    cfg->tokenize_timeout_ms = 2000;
    cfg->shutdown_grace_ms = 30000;
    cfg->log_level = SRV_LOG_INFO;
    cfg->block_size = 16;
    cfg->tokenizer = SRV_TOK_AUTO;
    cfg->seed = 1;
    cfg->replica_subject = strdup("kvrouter.replicas");
    cfg->replica_timeout_ms = 5000;
    cfg->replica_heartbeat_ms = 1000;
    cfg->replica_flush_ms = 1;
    cfg->bootstrap_wait_ms = 1000;
}

static void model_cfg_free(struct srv_model_cfg *m)
{
    free(m->name);
    free(m->tenant);
    free(m->policy);
    free(m->kv_topic);
    free(m->nats_subject);
    free(m->nats_stream);
}

static void worker_cfg_free(struct srv_worker_cfg *w)
{
    free(w->model);
    free(w->url);
    free(w->zmq);
    free(w->replay);
    free(w->topic);
    free(w->lora);
    free(w->labels);
}

void srv_config_free(struct srv_config *cfg)
{
    free(cfg->config_file);
    free(cfg->listen_host);
    free(cfg->admin_token);
    free(cfg->snapshot_path);
    free(cfg->policy);
    free(cfg->health_path);
    free(cfg->nats_url);
    free(cfg->replica_subject);
    free(cfg->peers);
    free(cfg->peer_token);
    for (size_t k = 0; k < cfg->n_models; k++)
        model_cfg_free(&cfg->models[k]);
    free(cfg->models);
    for (size_t k = 0; k < cfg->n_workers; k++)
        worker_cfg_free(&cfg->workers[k]);
    free(cfg->workers);
    memset(cfg, 0, sizeof(*cfg));
}

/* ==== models and workers ====================================================================== */

static struct srv_model_cfg *model_new(struct srv_config *cfg)
{
    if (cfg->n_models >= SRV_MAX_MODELS)
        return NULL;
    struct srv_model_cfg *v = realloc(cfg->models, (cfg->n_models + 1) * sizeof(*v));
    if (v == NULL)
        return NULL;
    cfg->models = v;
    struct srv_model_cfg *m = &v[cfg->n_models++];
    memset(m, 0, sizeof(*m));
    m->block_size = 0; /* 0 = the global default, resolved in finish */
    m->kind = SRV_KIND_EVENTS;
    m->index_kind = 1; /* KVR_INDEX_RADIX */
    m->tokenizer = -1; /* unset: the global default */
    m->byte_chunk = 4;
    m->approx_ttl_ms = 120000;
    m->approx_max_blocks = 1u << 20;
    m->approx_prune_ratio = 0.8;
    m->overlap_weight = 1.0;
    m->temperature = 0.0;
    return m;
}

static int parse_dbl(const char *s, double lo, double hi, double *out)
{
    if (s == NULL || *s == '\0')
        return -1;
    errno = 0;
    char *end;
    double v = strtod(s, &end);
    if (errno != 0 || *end != '\0' || !isfinite(v) || v < lo || v > hi)
        return -1;
    *out = v;
    return 0;
}

/* Sets one model key from text; `who` prefixes errors. */
static int model_set(struct srv_model_cfg *m, const char *key, const char *v, const char *who,
                     char *err, size_t err_len)
{
    uint64_t u;
    double d;
    if (strcmp(key, "name") == 0) {
        if (v == NULL || *v == '\0' || strlen(v) > 127)
            goto bad_name;
        return set_str(&m->name, v) == 0 ? 0 : (errf(err, err_len, "%s: out of memory", who), -1);
    }
    if (strcmp(key, "tenant") == 0 || strcmp(key, "tenant_id") == 0) {
        if (v == NULL || *v == '\0' || strlen(v) > 63 || strchr(v, ':') != NULL) {
            errf(err, err_len, "%s.tenant: expected 1..63 characters without ':'", who);
            return -1;
        }
        return set_str(&m->tenant, v) == 0 ? 0 : (errf(err, err_len, "%s: out of memory", who), -1);
    }
    if (strcmp(key, "block_size") == 0) {
        if (parse_u64_str(v, &u) != 0 || u < 2 || u > 65536) {
            errf(err, err_len, "%s.block_size: expected an integer in 2..65536, got '%s'", who,
                 v ? v : "");
            return -1;
        }
        m->block_size = (uint32_t)u;
        return 0;
    }
    if (strcmp(key, "index") == 0) {
        int k = v ? srv_index_kind_parse(v) : -1;
        if (k < 0) {
            errf(err, err_len, "%s.index: expected radix, ckf or both, got '%s'", who, v ? v : "");
            return -1;
        }
        m->index_kind = k;
        return 0;
    }
    if (strcmp(key, "ckf_keys") == 0) {
        if (v != NULL && strcmp(v, "translate") == 0) {
            m->ckf_keys = SRV_CKF_KEYS_TRANSLATE;
        } else if (v != NULL && strcmp(v, "engine") == 0) {
            m->ckf_keys = SRV_CKF_KEYS_ENGINE;
        } else {
            errf(err, err_len, "%s.ckf_keys: expected translate or engine, got '%s'", who,
                 v ? v : "");
            return -1;
        }
        return 0;
    }
    if (strcmp(key, "ckf_expected") == 0) {
        if (parse_u64_str(v, &u) != 0 || u < 1 || u > (1ull << 40)) {
            errf(err, err_len,
                 "%s.ckf_expected: expected blocks per rank, an integer in 1..2^40, got '%s'", who,
                 v ? v : "");
            return -1;
        }
        m->ckf_expected = u;
        return 0;
    }
    if (strcmp(key, "kind") == 0) {
        int k = v ? srv_kind_parse(v) : -1;
        if (k < 0) {
            errf(err, err_len, "%s.kind: expected events or approx, got '%s'", who, v ? v : "");
            return -1;
        }
        m->kind = k;
        return 0;
    }
    if (strcmp(key, "tokenizer") == 0) {
        int t = v ? srv_tokenizer_parse(v) : -1;
        if (t < 0) {
            errf(err, err_len, "%s.tokenizer: expected auto, worker, bytes or none, got '%s'", who,
                 v ? v : "");
            return -1;
        }
        m->tokenizer = t;
        return 0;
    }
    if (strcmp(key, "byte_chunk") == 0) {
        if (parse_u64_str(v, &u) != 0 || u < 1 || u > 4) {
            errf(err, err_len, "%s.byte_chunk: expected an integer in 1..4, got '%s'", who,
                 v ? v : "");
            return -1;
        }
        m->byte_chunk = (uint32_t)u;
        return 0;
    }
    if (strcmp(key, "policy") == 0) {
        if (v == NULL || *v == '\0') {
            errf(err, err_len, "%s.policy: expected a policy name or file", who);
            return -1;
        }
        return set_str(&m->policy, v) == 0 ? 0 : (errf(err, err_len, "%s: out of memory", who), -1);
    }
    if (strcmp(key, "nats_subject") == 0 || strcmp(key, "nats_stream") == 0) {
        /* KV events as RouterEvent JSON on a NATS subject (nats_events.h), optionally replayed
         * from the JetStream stream that stores it */
        if (v == NULL || *v == '\0' || strpbrk(v, " \t\r\n") != NULL) {
            errf(err, err_len, "%s.%s: expected a NATS %s name", who, key,
                 key[5] == 's' && key[6] == 'u' ? "subject" : "stream");
            return -1;
        }
        char **dst = strcmp(key, "nats_subject") == 0 ? &m->nats_subject : &m->nats_stream;
        return set_str(dst, v) == 0 ? 0 : (errf(err, err_len, "%s: out of memory", who), -1);
    }
    if (strcmp(key, "topic") == 0) {
        /* An empty topic means every message (the engines' default topic is ""). */
        return set_str(&m->kv_topic, v ? v : "") == 0
                   ? 0
                   : (errf(err, err_len, "%s: out of memory", who), -1);
    }
    if (strcmp(key, "ttl") == 0 || strcmp(key, "approx.ttl") == 0) {
        if (srv_parse_duration_ms(v, &u) != 0 || u == 0) {
            errf(err, err_len, "%s.ttl: expected a positive duration, got '%s'", who, v ? v : "");
            return -1;
        }
        m->approx_ttl_ms = u;
        return 0;
    }
    if (strcmp(key, "max_blocks") == 0 || strcmp(key, "approx.max_blocks") == 0) {
        if (parse_u64_str(v, &u) != 0 || u < 1 || u > (1ull << 40)) {
            errf(err, err_len, "%s.max_blocks: expected an integer in 1..2^40, got '%s'", who,
                 v ? v : "");
            return -1;
        }
        m->approx_max_blocks = u;
        return 0;
    }
    if (strcmp(key, "prune_ratio") == 0 || strcmp(key, "approx.prune_ratio") == 0) {
        if (parse_dbl(v, 0.01, 1.0, &d) != 0) {
            errf(err, err_len, "%s.prune_ratio: expected a number in 0.01..1, got '%s'", who,
                 v ? v : "");
            return -1;
        }
        m->approx_prune_ratio = d;
        return 0;
    }
    if (strcmp(key, "overlap_weight") == 0) {
        if (parse_dbl(v, 0, 1e6, &d) != 0) {
            errf(err, err_len, "%s.overlap_weight: expected a number >= 0, got '%s'", who,
                 v ? v : "");
            return -1;
        }
        m->overlap_weight = d;
        return 0;
    }
    if (strcmp(key, "temperature") == 0) {
        if (parse_dbl(v, 0, 1e6, &d) != 0) {
            errf(err, err_len, "%s.temperature: expected a number >= 0, got '%s'", who, v ? v : "");
            return -1;
        }
        m->temperature = d;
        return 0;
    }
    errf(err, err_len,
         "%s: unknown key '%s' (known: name, tenant, block_size, kind, index, ckf_keys, "
         "ckf_expected, tokenizer, byte_chunk, policy, topic, nats_subject, nats_stream, ttl, "
         "max_blocks, prune_ratio, overlap_weight, temperature)",
         who, key);
    return -1;
bad_name:
    errf(err, err_len, "%s.name: expected 1..127 characters", who);
    return -1;
}

static struct srv_worker_cfg *worker_new(struct srv_config *cfg)
{
    struct srv_worker_cfg *v = realloc(cfg->workers, (cfg->n_workers + 1) * sizeof(*v));
    if (v == NULL)
        return NULL;
    cfg->workers = v;
    struct srv_worker_cfg *w = &v[cfg->n_workers++];
    memset(w, 0, sizeof(*w));
    w->dp_size = 1;
    return w;
}

static int label_ok(const char *s, int is_key)
{
    if (s == NULL || *s == '\0' || strlen(s) > 128)
        return 0;
    for (; *s; s++)
        if (*s == ',' || (is_key && *s == '=') || (unsigned char)*s < 0x20)
            return 0;
    return 1;
}

static int worker_add_label(struct srv_worker_cfg *w, const char *k, const char *v, const char *who,
                            char *err, size_t err_len)
{
    if (!label_ok(k, 1) || !label_ok(v, 0)) {
        errf(err, err_len,
             "%s.labels: label keys and values are 1..128 characters without ',' "
             "(and keys without '=')",
             who);
        return -1;
    }
    size_t old = w->labels ? strlen(w->labels) : 0;
    size_t need = old + (old ? 1 : 0) + strlen(k) + 1 + strlen(v) + 1;
    char *n = realloc(w->labels, need);
    if (n == NULL) {
        errf(err, err_len, "%s: out of memory", who);
        return -1;
    }
    if (old == 0)
        n[0] = '\0';
    snprintf(n + old, need - old, "%s%s=%s", old ? "," : "", k, v);
    w->labels = n;
    return 0;
}

static int worker_set(struct srv_worker_cfg *w, const char *key, const char *v, const char *who,
                      char *err, size_t err_len)
{
    uint64_t u;
    char **dst = NULL;
    if (strcmp(key, "id") == 0 || strcmp(key, "instance_id") == 0) {
        if (parse_u64_str(v, &u) != 0) {
            errf(err, err_len, "%s.id: expected an unsigned 64-bit integer, got '%s'", who,
                 v ? v : "");
            return -1;
        }
        w->id = u;
        w->has_id = 1;
        return 0;
    }
    if (strcmp(key, "dp_size") == 0 || strcmp(key, "dp") == 0) {
        if (parse_u64_str(v, &u) != 0 || u < 1 || u > 1024) {
            errf(err, err_len, "%s.dp_size: expected an integer in 1..1024, got '%s'", who,
                 v ? v : "");
            return -1;
        }
        w->dp_size = (uint32_t)u;
        return 0;
    }
    if (strncmp(key, "label.", 6) == 0)
        return worker_add_label(w, key + 6, v, who, err, err_len);
    if (strcmp(key, "topic") == 0) {
        /* may be empty: every message, whatever the model's topic */
        if (set_str(&w->topic, v ? v : "") != 0) {
            errf(err, err_len, "%s: out of memory", who);
            return -1;
        }
        return 0;
    }
    if (strcmp(key, "model") == 0)
        dst = &w->model;
    else if (strcmp(key, "url") == 0)
        dst = &w->url;
    else if (strcmp(key, "zmq") == 0 || strcmp(key, "endpoint") == 0)
        dst = &w->zmq;
    else if (strcmp(key, "replay") == 0 || strcmp(key, "replay_endpoint") == 0)
        dst = &w->replay;
    else if (strcmp(key, "lora_name") == 0)
        dst = &w->lora;
    if (dst == NULL) {
        errf(err, err_len,
             "%s: unknown key '%s' (known: id, model, url, zmq, replay, topic, lora_name, "
             "dp_size, labels)",
             who, key);
        return -1;
    }
    if (v == NULL || *v == '\0') {
        errf(err, err_len, "%s.%s: expected a non-empty string", who, key);
        return -1;
    }
    if (set_str(dst, v) != 0) {
        errf(err, err_len, "%s: out of memory", who);
        return -1;
    }
    return 0;
}

/* Splits "a=1,b=2" specs; calls set(key, value) for each pair. The first item may be a bare
 * value (set with key `bare_key`). */
static int parse_spec(const char *spec, const char *bare_key,
                      int (*set)(void *obj, const char *k, const char *v, const char *who,
                                 char *err, size_t err_len),
                      void *obj, const char *who, char *err, size_t err_len)
{
    char *dup = strdup(spec), *save = NULL;
    if (dup == NULL) {
        errf(err, err_len, "%s: out of memory", who);
        return -1;
    }
    int first = 1, rc = 0;
    for (char *item = strtok_r(dup, ",", &save); item != NULL && rc == 0;
         item = strtok_r(NULL, ",", &save), first = 0) {
        char *eq = strchr(item, '=');
        if (eq == NULL) {
            if (first && bare_key != NULL) {
                rc = set(obj, bare_key, item, who, err, err_len);
                continue;
            }
            errf(err, err_len, "%s: expected key=value, got '%s'", who, item);
            rc = -1;
            break;
        }
        *eq = '\0';
        rc = set(obj, item, eq + 1, who, err, err_len);
    }
    free(dup);
    return rc;
}

static int model_set_v(void *obj, const char *k, const char *v, const char *who, char *err,
                       size_t err_len)
{
    struct srv_model_cfg *m = obj;
    if (strcmp(k, "name") == 0) { /* "name[:tenant]" */
        const char *colon = strrchr(v, ':');
        if (colon != NULL) {
            char name[128];
            size_t n = (size_t)(colon - v);
            if (n == 0 || n >= sizeof(name)) {
                errf(err, err_len, "%s.name: expected 1..127 characters", who);
                return -1;
            }
            memcpy(name, v, n);
            name[n] = '\0';
            if (model_set(m, "name", name, who, err, err_len) != 0)
                return -1;
            return model_set(m, "tenant", colon + 1, who, err, err_len);
        }
    }
    return model_set(m, k, v, who, err, err_len);
}

static int worker_set_v(void *obj, const char *k, const char *v, const char *who, char *err,
                        size_t err_len)
{
    return worker_set(obj, k, v, who, err, err_len);
}

int srv_config_add_model_spec(struct srv_config *cfg, const char *spec, char *err, size_t err_len)
{
    struct srv_model_cfg *m = model_new(cfg);
    if (m == NULL) {
        errf(err, err_len, "--model: too many models (at most %d)", SRV_MAX_MODELS);
        return -1;
    }
    return parse_spec(spec, "name", model_set_v, m, "--model", err, err_len);
}

int srv_config_add_worker_spec(struct srv_config *cfg, const char *spec, char *err, size_t err_len)
{
    struct srv_worker_cfg *w = worker_new(cfg);
    if (w == NULL) {
        errf(err, err_len, "--worker: out of memory");
        return -1;
    }
    return parse_spec(spec, NULL, worker_set_v, w, "--worker", err, err_len);
}

/* ==== the Lua file ============================================================================ */

#if defined(KVR_FUZZING)
/* fuzzing builds (fuzz/fuzz_config.c): small budgets, so a looping input costs milliseconds */
#define LUA_MEM_CAP (16u << 20)
#define LUA_INSN_BUDGET 200000u
#define LUA_HOOK_EVERY 1000
#define LUA_TIME_BUDGET_S 0.05
#else
#define LUA_MEM_CAP (64u << 20)
#define LUA_INSN_BUDGET 50000000u /* instructions for the whole chunk */
#define LUA_HOOK_EVERY 1000
#define LUA_TIME_BUDGET_S 2.0 /* wall time for the whole chunk (C functions included) */
#endif

struct lua_alloc {
    size_t used;
};

static void *capped_alloc(void *ud, void *ptr, size_t osize, size_t nsize)
{
    struct lua_alloc *a = ud;
    if (nsize == 0) {
        a->used -= ptr ? osize : 0;
        free(ptr);
        return NULL;
    }
    size_t old = ptr ? osize : 0;
    if (nsize > old && a->used + (nsize - old) > LUA_MEM_CAP)
        return NULL;
    void *p = realloc(ptr, nsize);
    if (p != NULL)
        a->used = a->used - old + nsize;
    return p;
}

static double mono_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void budget_hook(lua_State *L, lua_Debug *ar)
{
    (void)ar;
    lua_getfield(L, LUA_REGISTRYINDEX, "kvr.cfg.insns");
    lua_Number n = lua_tonumber(L, -1) + LUA_HOOK_EVERY;
    lua_pop(L, 1);
    lua_pushnumber(L, n);
    lua_setfield(L, LUA_REGISTRYINDEX, "kvr.cfg.insns");
    lua_getfield(L, LUA_REGISTRYINDEX, "kvr.cfg.t0");
    double t0 = lua_tonumber(L, -1);
    lua_pop(L, 1);
    if (n > LUA_INSN_BUDGET || mono_s() - t0 > LUA_TIME_BUDGET_S) {
        /* From now on the hook fires on every instruction: a pcall in the file may swallow one
         * error, but the instructions around it raise again, outside it (Redis's
         * luaMaskCountHook), so `while true do pcall(f) end` ends too. */
        lua_sethook(L, budget_hook, LUA_MASKCOUNT, 1);
        luaL_error(L, "config file exceeds its instruction budget (a loop that never ends?)");
    }
}

static int l_env(lua_State *L)
{
    const char *name = luaL_checkstring(L, 1);
    const char *v = getenv(name);
    if (v == NULL)
        lua_pushnil(L);
    else
        lua_pushstring(L, v);
    return 1;
}

static int open_libs(lua_State *L)
{
    static const lua_CFunction libs[] = {luaopen_base, luaopen_table, luaopen_string, luaopen_math,
                                         luaopen_bit};
    static const char *const names[] = {"", LUA_TABLIBNAME, LUA_STRLIBNAME, LUA_MATHLIBNAME,
                                        LUA_BITLIBNAME};
    for (size_t k = 0; k < sizeof(libs) / sizeof(libs[0]); k++) {
        lua_pushcfunction(L, libs[k]);
        lua_pushstring(L, names[k]);
        lua_call(L, 1, 0);
    }
    /* This state is the config file's alone, so its string library itself is made safe (method
     * calls such as s:match(p) reach it through the string metatable): Lua patterns run inside
     * one C call, where the instruction hook never fires, and a pathological pattern can run
     * for minutes; string.dump is of no use to a config. */
    static const char patch[] =
        "local find, type, error, ipairs = string.find, type, error, ipairs\n"
        "local MAGIC = '[%^%$%*%+%?%.%(%)%[%]%%%-]'\n"
        "string.find = function(s, p, init, plain)\n"
        "  if not plain and type(p) == 'string' and find(p, MAGIC) then\n"
        "    error('string.find: Lua patterns are not available in the config file"
        " (pass plain = true)', 2)\n"
        "  end\n"
        "  return find(s, p, init, true)\n"
        "end\n"
        "for _, k in ipairs({'match', 'gmatch', 'gsub'}) do\n"
        "  string[k] = function()\n"
        "    error('string.' .. k .. ': Lua patterns are not available in the config file', 2)\n"
        "  end\n"
        "end\n"
        "string.dump = nil\n";
    if (luaL_loadbuffer(L, patch, sizeof(patch) - 1, "=config-sandbox") != 0)
        lua_error(L);
    lua_call(L, 0, 0);
    return 0;
}

/* Builds the sandbox environment table on the stack. */
static void push_env(lua_State *L)
{
    static const char *const globals[] = {
        "assert",   "error", "ipairs", "next",     "pairs",  "pcall",  "select", "tonumber",
        "tostring", "type",  "unpack", "rawequal", "rawget", "rawlen", "xpcall", NULL};
    static const char *const libs[] = {"string", "table", "math", "bit", NULL};
    /* xpcall's handler runs after the unwind (see lua/lib/kvr/policy.lua): LuaJIT runs it at
     * the error, which for the budget error is inside the hook, where no hook fires. */
    static const char safe_xpcall[] =
        "local pcall = pcall\n"
        "local function finish(h, ok, ...)\n"
        "  if ok then return true, ... end\n"
        "  local _, v = pcall(h, (...))\n"
        "  return false, v\n"
        "end\n"
        "return function(f, h, ...) return finish(h, pcall(f, ...)) end\n";
    lua_newtable(L);
    for (int k = 0; globals[k] != NULL; k++) {
        lua_getglobal(L, globals[k]);
        lua_setfield(L, -2, globals[k]);
    }
    if (luaL_loadbuffer(L, safe_xpcall, sizeof(safe_xpcall) - 1, "=xpcall") == 0 &&
        lua_pcall(L, 0, 1, 0) == 0) {
        lua_setfield(L, -2, "xpcall");
    } else {
        lua_pop(L, 1);
        lua_pushnil(L); /* no xpcall rather than an unsafe one */
        lua_setfield(L, -2, "xpcall");
    }
    for (int k = 0; libs[k] != NULL; k++) {
        lua_getglobal(L, libs[k]);
        if (!lua_istable(L, -1)) {
            lua_pop(L, 1);
            continue;
        }
        /* a shallow copy, so the config cannot patch the shared library tables */
        lua_newtable(L);
        lua_pushnil(L);
        while (lua_next(L, -3) != 0) {
            lua_pushvalue(L, -2);
            lua_insert(L, -2);
            lua_settable(L, -4);
        }
        lua_remove(L, -2);
        lua_setfield(L, -2, libs[k]);
    }
    /* string.rep could still be used to exhaust memory: the allocator cap covers it */
    lua_pushcfunction(L, l_env);
    lua_setfield(L, -2, "env");
}

/* The text form of the value at the top of the stack for a setting, or NULL with *kind set. */
static const char *lua_scalar(lua_State *L, char *buf, size_t cap, const char **kind)
{
    int t = lua_type(L, -1);
    *kind = lua_typename(L, t);
    if (t == LUA_TSTRING)
        return lua_tostring(L, -1);
    if (t == LUA_TNUMBER) {
        lua_Number n = lua_tonumber(L, -1);
        if (n >= 0 && n < 1e19 && floor(n) == n)
            snprintf(buf, cap, "%.0f", n);
        else
            snprintf(buf, cap, "%.17g", n);
        return buf;
    }
    if (t == LUA_TBOOLEAN) {
        snprintf(buf, cap, "%s", lua_toboolean(L, -1) ? "true" : "false");
        return buf;
    }
    return NULL;
}

static const struct opt *opt_by_key(const char *key)
{
    for (size_t k = 0; k < N_OPTS; k++)
        if (strcmp(opts[k].key, key) == 0)
            return &opts[k];
    return NULL;
}

static int is_group(const char *key)
{
    static const char *const groups[] = {"limits", "snapshot", "health", "breaker",
                                         "retry",  "replicas", NULL};
    for (int k = 0; groups[k] != NULL; k++)
        if (strcmp(groups[k], key) == 0)
            return 1;
    return 0;
}

struct lua_read {
    struct srv_config *cfg;
    const char *chunk;
    char *err;
    size_t err_len;
};

/* Reads the table at the top of the stack into a model or worker; `who` = "models[2]". */
static int read_entry(struct lua_read *r, lua_State *L, int is_model, void *obj, const char *who)
{
    lua_pushnil(L);
    while (lua_next(L, -2) != 0) {
        if (lua_type(L, -2) != LUA_TSTRING) {
            errf(r->err, r->err_len, "%s: %s: keys must be strings", r->chunk, who);
            lua_pop(L, 2);
            return -1;
        }
        const char *key = lua_tostring(L, -2);
        char whob[192], buf[64];
        snprintf(whob, sizeof(whob), "%s: %s", r->chunk, who);
        if (lua_istable(L, -1)) {
            /* models[i].approx = {ttl, max_blocks, prune_ratio}; workers[i].labels = {k = v} */
            int approx = is_model && strcmp(key, "approx") == 0;
            int labels = !is_model && strcmp(key, "labels") == 0;
            if (!approx && !labels) {
                errf(r->err, r->err_len, "%s.%s: expected a scalar, got a table", whob, key);
                lua_pop(L, 2);
                return -1;
            }
            lua_pushnil(L);
            while (lua_next(L, -2) != 0) {
                const char *kind, *v;
                if (lua_type(L, -2) != LUA_TSTRING ||
                    (v = lua_scalar(L, buf, sizeof(buf), &kind)) == NULL) {
                    errf(r->err, r->err_len, "%s.%s: expected string keys and scalar values", whob,
                         key);
                    lua_pop(L, 4);
                    return -1;
                }
                int rc;
                if (approx) {
                    char k2[96];
                    snprintf(k2, sizeof(k2), "approx.%s", lua_tostring(L, -2));
                    rc = model_set(obj, k2, v, whob, r->err, r->err_len);
                } else {
                    rc = worker_add_label(obj, lua_tostring(L, -2), v, whob, r->err, r->err_len);
                }
                if (rc != 0) {
                    lua_pop(L, 4);
                    return -1;
                }
                lua_pop(L, 1);
            }
            lua_pop(L, 1);
            continue;
        }
        const char *kind;
        const char *v = lua_scalar(L, buf, sizeof(buf), &kind);
        if (v == NULL) {
            errf(r->err, r->err_len, "%s.%s: expected a string or number, got a %s", whob, key,
                 kind);
            lua_pop(L, 2);
            return -1;
        }
        int rc = is_model ? model_set(obj, key, v, whob, r->err, r->err_len)
                          : worker_set(obj, key, v, whob, r->err, r->err_len);
        if (rc != 0) {
            lua_pop(L, 2);
            return -1;
        }
        lua_pop(L, 1);
    }
    return 0;
}

static int read_list(struct lua_read *r, lua_State *L, int is_model)
{
    const char *name = is_model ? "models" : "workers";
    if (!lua_istable(L, -1)) {
        errf(r->err, r->err_len, "%s: %s: expected a list of tables", r->chunk, name);
        return -1;
    }
    size_t n = lua_objlen(L, -1);
    for (size_t i = 1; i <= n; i++) {
        char who[64];
        snprintf(who, sizeof(who), "%s[%zu]", name, i);
        lua_rawgeti(L, -1, (int)i);
        if (!lua_istable(L, -1)) {
            errf(r->err, r->err_len, "%s: %s: expected a table", r->chunk, who);
            lua_pop(L, 1);
            return -1;
        }
        void *obj = is_model ? (void *)model_new(r->cfg) : (void *)worker_new(r->cfg);
        if (obj == NULL) {
            errf(r->err, r->err_len, "%s: %s: too many entries or out of memory", r->chunk, who);
            lua_pop(L, 1);
            return -1;
        }
        int rc = read_entry(r, L, is_model, obj, who);
        lua_pop(L, 1);
        if (rc != 0)
            return -1;
    }
    return 0;
}

/* Reads settings from the table at the top; prefix "" or "health." etc. */
static int read_settings(struct lua_read *r, lua_State *L, const char *prefix)
{
    lua_pushnil(L);
    while (lua_next(L, -2) != 0) {
        if (lua_type(L, -2) != LUA_TSTRING) {
            errf(r->err, r->err_len, "%s: %skeys must be strings", r->chunk, prefix);
            lua_pop(L, 2);
            return -1;
        }
        char key[128], buf[64], who[192];
        snprintf(key, sizeof(key), "%s%s", prefix, lua_tostring(L, -2));
        snprintf(who, sizeof(who), "%s: %s", r->chunk, key);
        int rc = 0;
        if (*prefix == '\0' && (strcmp(key, "models") == 0 || strcmp(key, "workers") == 0)) {
            rc = read_list(r, L, strcmp(key, "models") == 0);
        } else if (*prefix == '\0' && is_group(key)) {
            if (!lua_istable(L, -1)) {
                errf(r->err, r->err_len, "%s: expected a table", who);
                rc = -1;
            } else {
                char sub[160];
                snprintf(sub, sizeof(sub), "%s.", key);
                rc = read_settings(r, L, sub);
            }
        } else {
            const struct opt *o = opt_by_key(key);
            const char *kind, *v;
            if (o == NULL) {
                errf(r->err, r->err_len, "%s: unknown key", who);
                rc = -1;
            } else if ((v = lua_scalar(L, buf, sizeof(buf), &kind)) == NULL) {
                errf(r->err, r->err_len, "%s: expected a string or number, got a %s", who, kind);
                rc = -1;
            } else if (o->type == T_BOOL && lua_type(L, -1) != LUA_TBOOLEAN) {
                errf(r->err, r->err_len, "%s: expected true or false, got a %s", who, kind);
                rc = -1;
            } else {
                rc = apply_opt(r->cfg, o, v, who, r->err, r->err_len);
            }
        }
        if (rc != 0) {
            lua_pop(L, 2);
            return -1;
        }
        lua_pop(L, 1);
    }
    return 0;
}

int srv_config_load_text(struct srv_config *cfg, const char *text, size_t len, const char *chunk,
                         char *err, size_t err_len)
{
    struct lua_alloc al = {0};
    int rc = -1;
    if (len > 0 && text[0] == 0x1b) { /* precompiled bytecode is never accepted */
        errf(err, err_len, "%s: binary chunks are not accepted", chunk);
        return -1;
    }
    lua_State *L = lua_newstate(capped_alloc, &al);
    if (L == NULL) {
        errf(err, err_len, "%s: cannot create a Lua state", chunk);
        return -1;
    }
    luaJIT_setmode(L, 0, LUAJIT_MODE_ENGINE | LUAJIT_MODE_OFF); /* so the hook always fires */
    if (lua_cpcall(L, open_libs, NULL) != 0) {
        errf(err, err_len, "%s: cannot open the Lua libraries", chunk);
        goto out;
    }
    char name[300];
    snprintf(name, sizeof(name), "@%s", chunk);
    if (luaL_loadbuffer(L, text, len, name) != 0) {
        errf(err, err_len, "%s", lua_tostring(L, -1));
        goto out;
    }
    push_env(L);
    lua_setfenv(L, -2);
    lua_pushnumber(L, 0);
    lua_setfield(L, LUA_REGISTRYINDEX, "kvr.cfg.insns");
    lua_pushnumber(L, mono_s());
    lua_setfield(L, LUA_REGISTRYINDEX, "kvr.cfg.t0");
    lua_sethook(L, budget_hook, LUA_MASKCOUNT, LUA_HOOK_EVERY);
    if (lua_pcall(L, 0, 1, 0) != 0) {
        const char *m = lua_tostring(L, -1);
        errf(err, err_len, "%s", m != NULL ? m : "error while running the config file");
        goto out;
    }
    lua_sethook(L, NULL, 0, 0);
    if (!lua_istable(L, -1)) {
        errf(err, err_len, "%s: the file must return a table (return { listen = ..., ... })",
             chunk);
        goto out;
    }
    struct lua_read r = {cfg, chunk, err, err_len};
    rc = read_settings(&r, L, "");
out:
    lua_close(L);
    return rc;
}

int srv_config_load_file(struct srv_config *cfg, const char *path, char *err, size_t err_len)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        errf(err, err_len, "--config %s: %s", path, strerror(errno));
        return -1;
    }
    size_t cap = 1u << 20, n;
    char *buf = malloc(cap + 1);
    if (buf == NULL) {
        fclose(f);
        errf(err, err_len, "--config %s: out of memory", path);
        return -1;
    }
    n = fread(buf, 1, cap + 1, f);
    int rd_err = ferror(f);
    fclose(f);
    if (rd_err || n > cap) {
        free(buf);
        errf(err, err_len, "--config %s: %s", path, rd_err ? "read error" : "larger than 1 MiB");
        return -1;
    }
    const char *base = strrchr(path, '/');
    int rc = srv_config_load_text(cfg, buf, n, base ? base + 1 : path, err, err_len);
    free(buf);
    return rc;
}

/* ==== validation ============================================================================== */

static int url_ok(const char *u)
{
    if (strncmp(u, "http://", 7) != 0)
        return 0;
    const char *h = u + 7;
    return *h != '\0' && *h != '/' && *h != ':';
}

int srv_config_finish(struct srv_config *cfg, char *err, size_t err_len)
{
    if (cfg->n_models == 0) {
        struct srv_model_cfg *m = model_new(cfg);
        if (m == NULL || set_str(&m->name, "default") != 0) {
            errf(err, err_len, "out of memory");
            return -1;
        }
    }
    for (size_t k = 0; k < cfg->n_models; k++) {
        struct srv_model_cfg *m = &cfg->models[k];
        if (m->name == NULL) {
            errf(err, err_len, "models[%zu]: name is required", k + 1);
            return -1;
        }
        if (m->tenant == NULL && set_str(&m->tenant, "default") != 0) {
            errf(err, err_len, "out of memory");
            return -1;
        }
        if (m->block_size == 0)
            m->block_size = cfg->block_size;
        if (m->tokenizer < 0)
            m->tokenizer = cfg->tokenizer;
        for (size_t j = 0; j < k; j++)
            if (strcmp(cfg->models[j].name, m->name) == 0 &&
                strcmp(cfg->models[j].tenant, m->tenant) == 0) {
                errf(err, err_len, "models: '%s:%s' is configured twice", m->name, m->tenant);
                return -1;
            }
    }
    for (size_t k = 0; k < cfg->n_workers; k++) {
        struct srv_worker_cfg *w = &cfg->workers[k];
        if (!w->has_id) {
            errf(err, err_len, "workers[%zu]: id is required", k + 1);
            return -1;
        }
        if (w->url == NULL && w->zmq == NULL) {
            errf(err, err_len, "workers[%zu] (id %llu): needs a url, a zmq endpoint or both", k + 1,
                 (unsigned long long)w->id);
            return -1;
        }
        if (w->url != NULL && !url_ok(w->url)) {
            errf(err, err_len, "workers[%zu].url: expected http://HOST[:PORT][/PREFIX], got '%s'",
                 k + 1, w->url);
            return -1;
        }
        if (w->model == NULL && cfg->n_models == 1 &&
            set_str(&w->model, cfg->models[0].name) != 0) {
            errf(err, err_len, "out of memory");
            return -1;
        }
        if (w->model == NULL) {
            errf(err, err_len, "workers[%zu] (id %llu): model is required with several models",
                 k + 1, (unsigned long long)w->id);
            return -1;
        }
        int found = 0;
        for (size_t j = 0; j < cfg->n_models && !found; j++) {
            const struct srv_model_cfg *m = &cfg->models[j];
            char key[200];
            snprintf(key, sizeof(key), "%s:%s", m->name, m->tenant);
            found = strcmp(w->model, m->name) == 0 || strcmp(w->model, key) == 0;
        }
        if (!found) {
            errf(err, err_len, "workers[%zu].model: no model '%s' is configured", k + 1, w->model);
            return -1;
        }
        for (size_t j = 0; j < k; j++)
            if (cfg->workers[j].id == w->id && strcmp(cfg->workers[j].model, w->model) == 0) {
                errf(err, err_len, "workers: id %llu is configured twice for model '%s'",
                     (unsigned long long)w->id, w->model);
                return -1;
            }
    }
    if (cfg->snapshot_period_ms > 0 && cfg->snapshot_path == NULL) {
        errf(err, err_len, "--snapshot-period needs --snapshot FILE");
        return -1;
    }
    if (cfg->health_path == NULL || cfg->health_path[0] != '/') {
        errf(err, err_len, "--health-path: expected a path starting with '/'");
        return -1;
    }
    if (cfg->retry_backoff_max_ms < cfg->retry_backoff_ms)
        cfg->retry_backoff_max_ms = cfg->retry_backoff_ms;
    for (size_t k = 0; k < cfg->n_models; k++) {
        const struct srv_model_cfg *m = &cfg->models[k];
        if ((m->nats_subject != NULL || m->nats_stream != NULL) && cfg->nats_url == NULL) {
            errf(err, err_len, "models[%zu] (%s): nats_subject/nats_stream need --nats URL", k + 1,
                 m->name);
            return -1;
        }
        if (m->nats_stream != NULL && m->nats_subject == NULL) {
            errf(err, err_len, "models[%zu] (%s): nats_stream needs nats_subject", k + 1, m->name);
            return -1;
        }
    }
    if (cfg->nats_url != NULL && strncmp(cfg->nats_url, "nats://", 7) != 0 &&
        strncmp(cfg->nats_url, "tls://", 6) != 0) {
        errf(err, err_len, "--nats: expected nats://HOST:PORT[,nats://...], got '%s'",
             cfg->nats_url);
        return -1;
    }
    if (cfg->replica_subject == NULL || cfg->replica_subject[0] == '\0' ||
        strpbrk(cfg->replica_subject, " \t\r\n*>") != NULL) {
        errf(err, err_len, "--replica-subject: expected a NATS subject without wildcards");
        return -1;
    }
    if (cfg->replica_heartbeat_ms * 2 > cfg->replica_timeout_ms) {
        errf(err, err_len,
             "--replica-heartbeat (%llu ms) must be at most half of --replica-timeout (%llu ms)",
             (unsigned long long)cfg->replica_heartbeat_ms,
             (unsigned long long)cfg->replica_timeout_ms);
        return -1;
    }
    if (cfg->peers != NULL) {
        const char *p = cfg->peers;
        size_t k = 0;
        while (*p != '\0') {
            const char *e = strchr(p, ',');
            size_t n = e ? (size_t)(e - p) : strlen(p);
            char one[512];
            if (n == 0 || n >= sizeof(one)) {
                errf(err, err_len, "--peers: empty or overlong URL at position %zu", k + 1);
                return -1;
            }
            memcpy(one, p, n);
            one[n] = '\0';
            if (!url_ok(one)) {
                errf(err, err_len, "--peers: expected http://HOST[:PORT], got '%s'", one);
                return -1;
            }
            p += n + (e != NULL);
            k++;
        }
    }
    return 0;
}

/* ==== flags =================================================================================== */

void srv_config_usage(FILE *out)
{
    fprintf(out,
            "usage: kvrouter [options]\n"
            "       kvrouter sim [options]  the policy lab (kvrouter sim --help)\n"
            "\n"
            "A KV-cache-aware LLM request router: standalone-indexer API, routing API,\n"
            "OpenAI-compatible streaming proxy, worker health, snapshots, metrics.\n"
            "\n"
            "Every setting can also come from a Lua config file (--config); flags override it.\n"
            "Durations are seconds or take a unit (500ms, 2s, 5m, 1h); sizes take K/M/G.\n"
            "\n"
            "  --config FILE          Lua config file returning a table (see docs/SERVER.md)\n"
            "  --model SPEC           add a model (repeatable; Lua: models = {...}):\n"
            "                         NAME[:TENANT][,block_size=N][,kind=events|approx]\n"
            "                         [,index=radix|ckf|both][,ckf_keys=translate|engine]\n"
            "                         [,ckf_expected=BLOCKS_PER_RANK]\n"
            "                         [,tokenizer=auto|worker|bytes|none][,policy=FILE|NAME]\n"
            "                         "
            "[,byte_chunk=N][,topic=T][,ttl=DUR][,max_blocks=N][,prune_ratio=R]\n"
            "                         [,overlap_weight=W][,temperature=T]\n"
            "                         [,nats_subject=SUBJECT][,nats_stream=STREAM] (KV events\n"
            "                         as RouterEvent JSON over --nats, replayed from JetStream)\n"
            "                         (default: one model 'default' with --block-size)\n"
            "  --worker SPEC          add a worker (repeatable; Lua: workers = {...}):\n"
            "                         id=N[,model=NAME[:TENANT]][,url=http://HOST:PORT]\n"
            "                         [,zmq=tcp://HOST:PORT][,replay=tcp://HOST:PORT][,dp=N]\n"
            "                         [,topic=T][,lora_name=NAME][,label.KEY=VALUE...]\n");
    for (size_t k = 0; k < N_OPTS; k++) {
        const struct opt *o = &opts[k];
        char left[64];
        snprintf(left, sizeof(left), "--%s%s%s", o->flag, o->arg ? " " : "", o->arg ? o->arg : "");
        fprintf(out, "  %-22s %s\n  %-22s [Lua: %s; default: %s]\n", left, o->help, "", o->key,
                o->def);
    }
    fprintf(out, "  --check-config         validate the configuration and exit\n"
                 "  --help                 this text\n"
                 "  --version              print the version\n"
                 "\n"
                 "Signals: SIGTERM/SIGINT shut down gracefully (stop accepting, finish in-flight\n"
                 "requests, write a final snapshot); SIGHUP reloads policy files.\n");
}

int srv_config_parse_args(struct srv_config *cfg, int argc, char **argv, FILE *out, char *err,
                          size_t err_len)
{
    struct option lo[N_OPTS + 8];
    size_t n = 0;
    for (size_t k = 0; k < N_OPTS; k++) {
        lo[n].name = opts[k].flag;
        lo[n].has_arg = opts[k].type == T_BOOL ? no_argument : required_argument;
        lo[n].flag = NULL;
        lo[n].val = O_TABLE + (int)k;
        n++;
    }
    const struct option extra[] = {{"help", no_argument, NULL, O_HELP},
                                   {"version", no_argument, NULL, O_VERSION},
                                   {"config", required_argument, NULL, O_CONFIG},
                                   {"model", required_argument, NULL, O_MODEL},
                                   {"worker", required_argument, NULL, O_WORKER},
                                   {"check-config", no_argument, NULL, O_CHECK},
                                   {NULL, 0, NULL, 0}};
    memcpy(&lo[n], extra, sizeof(extra));

    /* pass 1: --help, --version, --config (the file is applied before every flag) */
    int check = 0;
    opterr = 0;
    optind = 1;
    int c, idx;
    while ((c = getopt_long(argc, argv, "h", lo, &idx)) != -1) {
        if (c == O_HELP || c == 'h') {
            srv_config_usage(out);
            return 1;
        }
        if (c == O_VERSION) {
            fprintf(out, "%s\n", KVR_VERSION_STRING);
            return 1;
        }
        if (c == O_CONFIG && set_str(&cfg->config_file, optarg) != 0) {
            errf(err, err_len, "out of memory");
            return -1;
        }
        if (c == '?') {
            if (optopt != 0)
                errf(err, err_len, "option -%c: unknown or missing its argument (see --help)",
                     optopt);
            else
                errf(err, err_len, "%s: unknown option or missing argument (see --help)",
                     argv[optind - 1]);
            return -1;
        }
    }
    if (optind < argc) {
        errf(err, err_len, "unexpected argument '%s' (see --help)", argv[optind]);
        return -1;
    }
    if (cfg->config_file != NULL && srv_config_load_file(cfg, cfg->config_file, err, err_len) != 0)
        return -1;

    /* pass 2: every flag, in order */
    optind = 1;
    while ((c = getopt_long(argc, argv, "h", lo, &idx)) != -1) {
        char who[64];
        if (c >= O_TABLE) {
            const struct opt *o = &opts[c - O_TABLE];
            snprintf(who, sizeof(who), "--%s", o->flag);
            if (apply_opt(cfg, o, optarg, who, err, err_len) != 0)
                return -1;
        } else if (c == O_MODEL) {
            if (srv_config_add_model_spec(cfg, optarg, err, err_len) != 0)
                return -1;
        } else if (c == O_WORKER) {
            if (srv_config_add_worker_spec(cfg, optarg, err, err_len) != 0)
                return -1;
        } else if (c == O_CHECK) {
            check = 1;
        }
    }
    if (srv_config_finish(cfg, err, err_len) != 0)
        return -1;
    return check ? 2 : 0;
}
