/* main.c - kvrouter: parse the configuration, start the server, wait for signals.
 *
 *   SIGTERM / SIGINT  graceful stop: stop accepting, finish in-flight requests (bounded by
 *                     --shutdown-grace), write the final snapshot, exit 0
 *   SIGHUP            reload the policy files
 * Every thread is started with these signals blocked (after the configuration is loaded);
 * main() waits for them with sigwait.
 * Exit status: 0 clean stop (and --help, --version, --check-config), 2 bad configuration,
 * 1 startup failure.
 *
 * `kvrouter sim ...` runs the policy lab instead (kvr/sim.h, docs/SIM.md): the same engine and
 * Lua runtime driven by a recorded trace; no server is started. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <nats/nats.h>

#include "config.h"
#include "kvr/sim.h"
#include "log.h"
#include "server.h"

int main(int argc, char **argv)
{
    if (argc > 1 && strcmp(argv[1], "sim") == 0) {
        char name[] = "kvrouter sim";
        argv[1] = name;
        return kvr_sim_main(argc - 1, argv + 1);
    }
    signal(SIGPIPE, SIG_IGN);

    struct srv_config cfg;
    char err[SRV_CFG_ERR];
    srv_config_init(&cfg);
    int rc = srv_config_parse_args(&cfg, argc, argv, stdout, err, sizeof(err));
    if (rc == 1) {
        srv_config_free(&cfg);
        return 0;
    }
    if (rc < 0) {
        fprintf(stderr, "kvrouter: %s\n", err);
        srv_config_free(&cfg);
        return 2;
    }
    if (rc == 2) {
        printf("kvrouter: configuration ok (%zu model(s), %zu worker(s))\n", cfg.n_models,
               cfg.n_workers);
        srv_config_free(&cfg);
        return 0;
    }
    /* Blocked only now: loading the configuration starts no thread, and until here SIGTERM or
     * ^C interrupts it as usual. */
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGHUP);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    struct srv_logger log;
    srv_log_init(&log, STDERR_FILENO, cfg.log_level);
    struct srv *s = NULL;
    if (srv_new(&cfg, &log, &s, err, sizeof(err)) != 0) {
        fprintf(stderr, "kvrouter: %s\n", err);
        srv_config_free(&cfg);
        return 2;
    }
    if (srv_start(s, err, sizeof(err)) != 0) {
        fprintf(stderr, "kvrouter: %s\n", err);
        srv_stop(s);
        srv_free(s);
        srv_config_free(&cfg);
        return 1;
    }
    printf("kvrouter: listening on http://%s:%u\n", cfg.listen_host, s->port);
    fflush(stdout);
    for (;;) {
        int sig = 0;
        if (sigwait(&set, &sig) != 0)
            continue;
        if (sig == SIGHUP) {
            srv_reload_policies(s);
            continue;
        }
        break;
    }
    srv_stop(s);
    srv_free(s);
    if (cfg.nats_url != NULL)
        nats_Close(); /* libnats's own threads and caches (replica sync) */
    srv_config_free(&cfg);
    return 0;
}
