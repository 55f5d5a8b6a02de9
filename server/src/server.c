/* server.c - server lifecycle: models, workers, snapshot restore, listeners, threads, graceful
 * stop (see server.h). */
#define _DEFAULT_SOURCE 1 /* SO_REUSEPORT */
#include "server.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "clock.h"
#include "kvr/err.h"
#include "nats_events.h"
#include "peer.h"
#include "policy.h"
#include "registry.h"
#include "replica.h"
#include "snapshots.h"
#include "thread.h"

/* A random non-zero replica id (/dev/urandom; time and pid if it cannot be read). */
static uint64_t random_replica_id(void)
{
    uint64_t v = 0;
    FILE *f = fopen("/dev/urandom", "rb");
    if (f != NULL) {
        if (fread(&v, sizeof(v), 1, f) != 1)
            v = 0;
        fclose(f);
    }
    if (v == 0)
        v = (srv_now_ns() ^ ((uint64_t)getpid() << 32)) * 0x9E3779B97F4A7C15ull;
    v &= (1ull << 53) - 1; /* exact in any JSON reader */
    return v ? v : 1;
}

static int setup_models(struct srv *s, char *err, size_t err_len)
{
    const struct srv_config *cfg = s->cfg;
    for (size_t k = 0; k < cfg->n_models; k++) {
        struct srv_model *m;
        char e[256];
        int rc = srv_models_get_or_create(&s->models, &cfg->models[k], &m, NULL, e, sizeof(e));
        if (rc != KVR_OK) {
            snprintf(err, err_len, "models[%zu]: %s", k + 1, e);
            return rc;
        }
    }
    return KVR_OK;
}

static int setup_workers(struct srv *s, char *err, size_t err_len)
{
    const struct srv_config *cfg = s->cfg;
    for (size_t k = 0; k < cfg->n_workers; k++) {
        const struct srv_worker_cfg *wc = &cfg->workers[k];
        struct srv_model *m = srv_models_find_spec(&s->models, wc->model, strlen(wc->model));
        if (m == NULL) {
            snprintf(err, err_len, "workers[%zu]: no model '%s'", k + 1, wc->model);
            return KVR_EINVAL;
        }
        struct srv_reg_spec spec = {.id = wc->id,
                                    .url = wc->url,
                                    .labels = wc->labels,
                                    .zmq = wc->zmq,
                                    .replay = wc->replay,
                                    .topic = wc->topic,
                                    .lora = wc->lora,
                                    .first_rank = 0,
                                    .n_ranks = wc->dp_size,
                                    .offset_by_rank = 1,
                                    .merge = 0};
        char e[256];
        int status = srv_reg_add(s, m, &spec, e, sizeof(e));
        if (status != 201) {
            snprintf(err, err_len, "workers[%zu] (id %llu): %s", k + 1, (unsigned long long)wc->id,
                     e);
            return KVR_EINVAL;
        }
    }
    return KVR_OK;
}

int srv_new(const struct srv_config *cfg, struct srv_logger *log, struct srv **out, char *err,
            size_t err_len)
{
    struct srv *s = calloc(1, sizeof(*s));
    if (s == NULL) {
        snprintf(err, err_len, "out of memory");
        return KVR_ENOMEM;
    }
    s->cfg = cfg;
    s->log = log;
    s->start_ms = srv_now_ms();
    atomic_init(&s->ready, 0);
    atomic_init(&s->draining, 0);
    atomic_init(&s->bootstrapping, cfg->peers != NULL);
    pthread_mutex_init(&s->snap.mu, NULL);
    int rc = srv_models_init(&s->models, log);
    s->models.on_events = srv_policy_events; /* policies' KV-event hooks */
    s->models.on_events_ctx = s;
    struct srv_breaker_cfg brk = {.failures = cfg->breaker_failures,
                                  .successes = cfg->breaker_successes,
                                  .probes = 1,
                                  .open_ms = cfg->breaker_open_ms};
    struct srv_health_cfg hc = {.fails = cfg->health_fails, .passes = cfg->health_passes};
    if (rc == KVR_OK)
        rc = srv_workers_init(&s->workers, &brk, &hc);
    if (rc != KVR_OK) {
        snprintf(err, err_len, "cannot initialise the registries");
        free(s);
        return rc;
    }
    if (cfg->nats_url != NULL) {
        struct srv_replica_cfg rc_ = {.nats_url = cfg->nats_url,
                                      .subject = cfg->replica_subject,
                                      .router_id =
                                          cfg->replica_id ? cfg->replica_id : random_replica_id(),
                                      .flush_us = cfg->replica_flush_ms * 1000u,
                                      .max_batch = 256,
                                      .heartbeat_ms = cfg->replica_heartbeat_ms,
                                      .timeout_ms = cfg->replica_timeout_ms};
        if ((rc = srv_replica_new(s, &rc_, &s->replica, err, err_len)) != KVR_OK)
            goto fail;
        s->models.on_load = srv_replica_on_load; /* before any model exists */
        s->models.on_approx = srv_replica_on_approx;
        s->models.sync_ctx = s->replica;
    }
    /* Bootstrapping from a peer: every model keeps its live events until the dump is in. */
    s->models.hold_new = cfg->peers != NULL;
    if ((rc = setup_models(s, err, err_len)) != KVR_OK)
        goto fail;
    if ((rc = srv_nats_events_new(s, cfg->nats_url, &s->nats_events, err, err_len)) != KVR_OK)
        goto fail;
    if (cfg->admin_token != NULL && strlen(cfg->admin_token) < 16)
        srv_logf(log, SRV_LOG_WARN, "main",
                 "the admin token is short (%zu characters): use 16 or more random characters",
                 strlen(cfg->admin_token));
    if (cfg->snapshot_path != NULL && cfg->peers == NULL) { /* with peers: peer.c decides */
        uint64_t events = 0;
        char e[512];
        /* a refused snapshot is logged and the router starts empty: never fatal */
        srv_snapshot_restore(s, cfg->snapshot_path, &events, e, sizeof(e));
    }
    if ((rc = srv_policy_rt_new(s, &s->policy, err, err_len)) != KVR_OK)
        goto fail;
    if ((rc = setup_workers(s, err, err_len)) != KVR_OK)
        goto fail;
    s->n_threads = cfg->threads;
    s->threads = calloc(s->n_threads, sizeof(*s->threads));
    if (s->threads == NULL) {
        snprintf(err, err_len, "out of memory");
        rc = KVR_ENOMEM;
        goto fail;
    }
    *out = s;
    return KVR_OK;
fail:
    srv_free(s);
    return rc;
}

/* One listening socket on host:port with SO_REUSEPORT (set before bind). */
static int listen_socket(const char *host, uint16_t port, uint16_t *bound, char *err,
                         size_t err_len)
{
    struct addrinfo hints, *ai = NULL;
    memset(&hints, 0, sizeof(hints));
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
    char ps[8];
    snprintf(ps, sizeof(ps), "%u", port);
    int gai = getaddrinfo(host, ps, &hints, &ai);
    if (gai != 0) {
        snprintf(err, err_len, "--listen %s:%u: %s", host, port, gai_strerror(gai));
        return -1;
    }
    int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    int one = 1;
    if (fd == -1 || setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) == -1 ||
        setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &one, sizeof(one)) == -1 ||
        bind(fd, ai->ai_addr, ai->ai_addrlen) == -1 || listen(fd, 1024) == -1) {
        snprintf(err, err_len, "--listen %s:%u: %s", host, port, strerror(errno));
        if (fd != -1)
            close(fd);
        freeaddrinfo(ai);
        return -1;
    }
    freeaddrinfo(ai);
    struct sockaddr_storage ss;
    socklen_t sl = sizeof(ss);
    if (getsockname(fd, (struct sockaddr *)&ss, &sl) == 0)
        *bound = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                                : ((struct sockaddr_in *)&ss)->sin_port);
    return fd;
}

int srv_start(struct srv *s, char *err, size_t err_len)
{
    const struct srv_config *cfg = s->cfg;
    uint16_t port = cfg->listen_port;
    for (uint32_t k = 0; k < s->n_threads; k++) {
        uint16_t got = 0;
        int fd = listen_socket(cfg->listen_host, port, &got, err, err_len);
        if (fd == -1)
            return KVR_EIO;
        if (k == 0)
            port = s->port = got; /* port 0: the others join the port the first one got */
        int rc = srv_thread_init(s, &s->threads[k], k, fd, err, err_len);
        if (rc != KVR_OK) {
            if (s->threads[k].listen_fd == -1 && s->threads[k].bound == NULL)
                close(fd);
            return rc;
        }
    }
    if (srv_control_new(s, &s->ctl) != KVR_OK || srv_control_start(s->ctl) != KVR_OK) {
        snprintf(err, err_len, "cannot start the control thread");
        return KVR_EIO;
    }
    for (uint32_t k = 0; k < s->n_threads; k++)
        if (srv_thread_start(&s->threads[k]) != KVR_OK) {
            snprintf(err, err_len, "cannot start HTTP thread %u", k);
            return KVR_EIO;
        }
    if (s->replica != NULL && srv_replica_start(s->replica, err, err_len) != KVR_OK)
        return KVR_EIO;
    if (srv_nats_events_start(s->nats_events, err, err_len) != KVR_OK)
        return KVR_EIO;
    if (cfg->peers != NULL) {
        if (srv_peer_bootstrap_start(s, err, err_len) != KVR_OK) /* it sets ready when done */
            return KVR_EIO;
    } else {
        atomic_store(&s->ready, 1);
    }
    srv_logf(s->log, SRV_LOG_INFO, "main", "listening on %s:%u with %u thread(s), %zu model(s)",
             cfg->listen_host, s->port, s->n_threads, srv_models_count(&s->models));
    return KVR_OK;
}

void srv_stop(struct srv *s)
{
    if (s == NULL || atomic_exchange(&s->draining, 1))
        return;
    srv_logf(s->log, SRV_LOG_INFO, "main",
             "shutting down: no new connections, finishing in-flight requests");
    for (uint32_t k = 0; k < s->n_threads; k++)
        if (s->threads[k].started)
            srv_thread_drain(&s->threads[k]);
    srv_peer_bootstrap_join(s);
    for (uint32_t k = 0; k < s->n_threads; k++)
        srv_thread_join(&s->threads[k]);
    srv_replica_stop(s->replica); /* after the last frees were queued: then "bye" */
    srv_control_stop(s->ctl);
    if (s->cfg->snapshot_path != NULL) {
        char err[512];
        srv_snapshot_write(s, s->cfg->snapshot_path, NULL, NULL, err, sizeof(err));
    }
    srv_logf(s->log, SRV_LOG_INFO, "main", "stopped");
}

static void reload_job(void *ctl, void *arg)
{
    struct srv *s = arg;
    char err[1024];
    uint64_t gen = 0;
    (void)ctl;
    int status = srv_policy_reload(s->policy, &gen, err, sizeof(err));
    if (status == 200)
        srv_logf(s->log, SRV_LOG_INFO, "main", "SIGHUP: policies reloaded (generation %llu)",
                 (unsigned long long)gen);
    else
        srv_logf(s->log, SRV_LOG_ERROR, "main", "SIGHUP: policy reload refused: %s", err);
}

void srv_reload_policies(struct srv *s)
{
    if (s->ctl != NULL)
        srv_control_post(s->ctl, reload_job, s);
}

void srv_free(struct srv *s)
{
    if (s == NULL)
        return;
    for (uint32_t k = 0; s->threads != NULL && k < s->n_threads; k++)
        srv_thread_free(&s->threads[k]);
    free(s->threads);
    srv_control_free(s->ctl);
    srv_peer_bootstrap_join(s);
    srv_nats_events_free(s->nats_events); /* no more events into the indexes */
    s->nats_events = NULL;
    srv_replica_stop(s->replica); /* no more remote ops into the trackers */
    srv_models_free(&s->models);  /* stops the subscribers before the indexes go */
    srv_replica_free(s->replica);
    srv_workers_free(&s->workers);
    srv_policy_rt_free(s->policy);
    pthread_mutex_destroy(&s->snap.mu);
    free(s);
}
