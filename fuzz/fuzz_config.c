/* fuzz_config.c - the Lua config loader (server/src/config.c, srv_config_load_text): any text
 * runs in the config sandbox (JIT off, instruction, time and memory budgets; fuzzing builds use
 * smaller budgets, see KVR_FUZZING in config.c) and is either applied or refused with a message;
 * what was applied then goes through srv_config_finish. Checks beyond "no crash, no sanitizer
 * report, no hang": a refusal names its chunk or key (a non-empty message), an accepted file
 * leaves every setting inside its documented range. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size > (1u << 20))
        return 0; /* the loader refuses files above 1 MiB before reading them */
    struct srv_config cfg;
    char err[SRV_CFG_ERR];
    srv_config_init(&cfg);
    char *text = malloc(size ? size : 1); /* exactly sized, no NUL */
    if (text == NULL) {
        srv_config_free(&cfg);
        return 0;
    }
    memcpy(text, data, size);
    err[0] = '\0';
    int rc = srv_config_load_text(&cfg, text, size, "fuzz.lua", err, sizeof(err));
    if (rc != 0 && rc != -1)
        abort();
    if (rc == -1 && err[0] == '\0') {
        fprintf(stderr, "fuzz_config: refused without a message\n");
        abort();
    }
    if (rc == 0) {
        err[0] = '\0';
        rc = srv_config_finish(&cfg, err, sizeof(err));
        if (rc == -1 && err[0] == '\0')
            abort();
        if (rc == 0) {
            if (cfg.threads < 1 || cfg.threads > SRV_MAX_THREADS || cfg.n_models < 1 ||
                cfg.n_models > SRV_MAX_MODELS || cfg.listen_host == NULL)
                abort();
            for (size_t k = 0; k < cfg.n_models; k++)
                if (cfg.models[k].name == NULL || cfg.models[k].tenant == NULL ||
                    cfg.models[k].block_size < 2 || cfg.models[k].block_size > 65536)
                    abort();
            for (size_t k = 0; k < cfg.n_workers; k++)
                if (!cfg.workers[k].has_id || cfg.workers[k].model == NULL)
                    abort();
        }
    }
    free(text);
    srv_config_free(&cfg);
    return 0;
}
