/* config.c - simulator defaults and policy resolution (kvr/sim.h).
 * SPDX-License-Identifier: Apache-2.0 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvr/err.h"
#include "kvr/sim.h"

void kvr_sim_config_init(struct kvr_sim_config *cfg)
{
    memset(cfg, 0, sizeof(*cfg));
    cfg->workers = 8;
    cfg->block_size = 512;
    cfg->trace_block_tokens = 512;
    cfg->slots = 16;
    cfg->prefill_lanes = 1;
    cfg->buckets = 60;
    cfg->inflight = 32;
    cfg->cache_blocks = 4096;
    cfg->seed = 1;
    cfg->time_scale = 1.0;
    cfg->prefill_us_per_token = 100.0;
    cfg->prefill_overhead_us = 10000.0;
    cfg->decode_us_per_token = 30000.0;
    cfg->budget_ns = 10000000u;
}

uint32_t kvr_sim_expand(const struct kvr_sim_config *cfg)
{
    if (cfg->block_size == 0 || cfg->trace_block_tokens == 0 ||
        cfg->trace_block_tokens % cfg->block_size != 0)
        return 0;
    return cfg->trace_block_tokens / cfg->block_size;
}

/* Reads a whole file into *out (NUL-terminated; owned). */
static int read_file(const char *path, char **out, size_t *len, char *err, size_t err_len)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        snprintf(err, err_len, "%s: %s", path, strerror(errno));
        return errno == ENOENT ? KVR_ENOTFOUND : KVR_EIO;
    }
    char *buf = NULL;
    size_t n = 0, cap = 0;
    int rc = KVR_OK;
    for (;;) {
        if (cap - n < 4096) {
            size_t ncap = cap ? cap * 2 : 8192;
            char *nb = realloc(buf, ncap);
            if (nb == NULL) {
                rc = KVR_ENOMEM;
                break;
            }
            buf = nb;
            cap = ncap;
        }
        size_t got = fread(buf + n, 1, cap - n - 1, f);
        n += got;
        if (got == 0) {
            if (ferror(f)) {
                snprintf(err, err_len, "%s: read error", path);
                rc = KVR_EIO;
            }
            break;
        }
    }
    fclose(f);
    if (rc != KVR_OK) {
        free(buf);
        return rc;
    }
    buf[n] = '\0';
    *out = buf;
    *len = n;
    return KVR_OK;
}

static int shipped(const char *name)
{
    for (const char *const *p = kvr_lua_builtin_names(); *p != NULL; p++)
        if (strcmp(*p, name) == 0)
            return 1;
    return 0;
}

/* The base name of path without ".lua", made a valid policy name. */
static void name_from_path(const char *path, char *name, size_t cap)
{
    const char *b = strrchr(path, '/');
    b = b ? b + 1 : path;
    size_t n = strlen(b);
    if (n > 4 && strcmp(b + n - 4, ".lua") == 0)
        n -= 4;
    if (n >= cap)
        n = cap - 1;
    for (size_t i = 0; i < n; i++) {
        char c = b[i];
        int ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                 c == '_' || c == '.' || c == '-';
        name[i] = ok ? c : '_';
    }
    name[n] = '\0';
    if (n == 0)
        snprintf(name, cap, "policy");
}

int kvr_sim_policy_resolve(const char *arg, struct kvr_sim_policy *out, char **owned, char *err,
                           size_t err_len)
{
    memset(out, 0, sizeof(*out));
    *owned = NULL;
    if (strcmp(arg, "builtin") == 0) {
        snprintf(out->name, sizeof(out->name), "builtin");
        out->kind = KVR_SIM_POLICY_BUILTIN;
        out->origin = "builtin";
        return KVR_OK;
    }
    if (shipped(arg)) {
        const char *src;
        size_t len;
        if (kvr_lua_builtin_source(NULL, arg, &src, &len) != KVR_OK) {
            snprintf(err, err_len, "%s: shipped policy not embedded", arg);
            return KVR_ENOTFOUND;
        }
        snprintf(out->name, sizeof(out->name), "%s", arg);
        out->kind = KVR_SIM_POLICY_LUA;
        out->shipped = 1;
        out->src = src;
        out->len = len;
        out->origin = "shipped";
        return KVR_OK;
    }
    const char *path = arg;
    const char *eq = strchr(arg, '=');
    const char *slash = strchr(arg, '/');
    if (eq != NULL && eq > arg && (slash == NULL || eq < slash)) {
        size_t n = (size_t)(eq - arg);
        char tmp[KVR_SIM_NAME_MAX + 1];
        snprintf(tmp, sizeof(tmp), "%.*s", (int)(n < sizeof(tmp) - 1 ? n : sizeof(tmp) - 1), arg);
        name_from_path(tmp, out->name, sizeof(out->name));
        path = eq + 1;
    } else {
        name_from_path(path, out->name, sizeof(out->name));
    }
    size_t len = 0;
    int rc = read_file(path, owned, &len, err, err_len);
    if (rc == KVR_ENOTFOUND) {
        char names[512] = "";
        size_t used = 0;
        for (const char *const *p = kvr_lua_builtin_names(); *p != NULL; p++) {
            int k = snprintf(names + used, sizeof(names) - used, "%s ", *p);
            if (k < 0 || (size_t)k >= sizeof(names) - used)
                break;
            used += (size_t)k;
        }
        snprintf(err, err_len, "%s: neither a file nor a shipped policy (shipped: %sbuiltin)", arg,
                 names);
    }
    if (rc != KVR_OK)
        return rc;
    out->kind = KVR_SIM_POLICY_LUA;
    out->src = *owned;
    out->len = len;
    out->origin = path;
    return KVR_OK;
}
