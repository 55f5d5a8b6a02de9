/* snapshots.c - write and restore index snapshots (see snapshots.h). */
#include "snapshots.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "clock.h"
#include "kvr/err.h"
#include "kvr/snapshot.h"
#include "server.h"

int srv_snapshot_write(struct srv *s, const char *path, uint64_t *bytes, size_t *models, char *err,
                       size_t err_len)
{
    size_t n = srv_models_count(&s->models), k = 0;
    struct kvr_snapshot_index *ix = calloc(n ? n : 1, sizeof(*ix));
    if (ix == NULL) {
        snprintf(err, err_len, "out of memory");
        return KVR_ENOMEM;
    }
    for (size_t i = 0; i < n; i++) {
        struct srv_model *m = srv_models_at(&s->models, i);
        if (m->kind != SRV_KIND_EVENTS || m->index_kind == KVR_INDEX_CKF)
            continue; /* a CKF-only index cannot be dumped as events */
        ix[k].name = m->key;
        ix[k].block_size = m->block_size;
        ix[k].index = m->index;
        k++;
    }
    uint64_t t0 = srv_now_ms();
    int rc = kvr_snapshot_write_file(path, ix, k, srv_wall_ms(), err, err_len);
    free(ix);
    struct stat st;
    uint64_t size = rc == KVR_OK && stat(path, &st) == 0 ? (uint64_t)st.st_size : 0;
    pthread_mutex_lock(&s->snap.mu);
    if (rc == KVR_OK) {
        s->snap.count++;
        s->snap.last_unix_ms = srv_wall_ms();
        s->snap.last_ms = srv_now_ms() - t0;
        s->snap.last_bytes = size;
        s->snap.last_error[0] = '\0';
    } else {
        s->snap.failures++;
        snprintf(s->snap.last_error, sizeof(s->snap.last_error), "%s", err);
    }
    pthread_mutex_unlock(&s->snap.mu);
    if (rc == KVR_OK)
        srv_logf(s->log, SRV_LOG_INFO, "snapshot", "wrote %s: %zu index(es), %llu bytes, %llu ms",
                 path, k, (unsigned long long)size, (unsigned long long)(srv_now_ms() - t0));
    else
        srv_logf(s->log, SRV_LOG_ERROR, "snapshot", "cannot write %s: %s", path, err);
    if (bytes != NULL)
        *bytes = size;
    if (models != NULL)
        *models = k;
    return rc;
}

struct restore_ctx {
    struct srv *s;
    uint64_t events;
    uint64_t failed;
};

static int restore_index(void *ctx, const char *name, size_t name_len, uint32_t block_size,
                         const struct kvr_event_list *events)
{
    struct restore_ctx *c = ctx;
    struct srv *s = c->s;
    struct srv_model *m = srv_models_find_spec(&s->models, name, name_len);
    if (m == NULL) {
        char key[256], *colon;
        snprintf(key, sizeof(key), "%.*s", (int)name_len, name);
        colon = strrchr(key, ':');
        char *tenant = "default";
        if (colon != NULL) {
            *colon = '\0';
            tenant = colon + 1;
        }
        struct srv_model_cfg mc;
        char err[256];
        srv_model_cfg_defaults(&mc, key, tenant, block_size);
        mc.tokenizer = s->cfg->tokenizer;
        if (srv_models_get_or_create(&s->models, &mc, &m, NULL, err, sizeof(err)) != KVR_OK) {
            srv_logf(s->log, SRV_LOG_WARN, "snapshot", "section %.*s skipped: %s", (int)name_len,
                     name, err);
            return 0;
        }
    }
    if (m->block_size != block_size || m->kind != SRV_KIND_EVENTS) {
        srv_logf(s->log, SRV_LOG_WARN, "snapshot",
                 "section %.*s skipped: the model is configured with block size %u (%s index), "
                 "the snapshot has %u",
                 (int)name_len, name, m->block_size, srv_kind_name(m->kind), block_size);
        return 0;
    }
    size_t failed = kvr_index_apply_batch(m->index, events->ev, events->n, NULL);
    c->events += events->n - failed;
    c->failed += failed;
    return 0;
}

int srv_snapshot_restore(struct srv *s, const char *path, uint64_t *events, char *err,
                         size_t err_len)
{
    struct restore_ctx c = {s, 0, 0};
    uint64_t created = 0;
    *events = 0;
    int rc = kvr_snapshot_read_file(path, 0, restore_index, &c, &created, err, err_len);
    if (rc == KVR_ENOTFOUND) {
        srv_logf(s->log, SRV_LOG_INFO, "snapshot", "no snapshot at %s yet: starting empty", path);
        return KVR_OK;
    }
    if (rc != KVR_OK) {
        srv_logf(s->log, SRV_LOG_ERROR, "snapshot",
                 "snapshot %s refused (%s): %s; starting with an EMPTY index", path,
                 kvr_strerror(rc), err);
        return rc;
    }
    *events = c.events;
    pthread_mutex_lock(&s->snap.mu);
    s->snap.restored_events = c.events;
    pthread_mutex_unlock(&s->snap.mu);
    srv_logf(s->log, SRV_LOG_INFO, "snapshot",
             "restored %s (written %llu ms ago): %llu events applied, %llu rejected", path,
             (unsigned long long)(srv_wall_ms() > created ? srv_wall_ms() - created : 0),
             (unsigned long long)c.events, (unsigned long long)c.failed);
    return KVR_OK;
}
