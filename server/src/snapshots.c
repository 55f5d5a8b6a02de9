/* snapshots.c - write and restore index snapshots (see snapshots.h). */
#define _DEFAULT_SOURCE 1 /* realpath */
#include "snapshots.h"

#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

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

/* Splits path into its directory (into dir[0..cap); "." when there is none) and returns its last
 * component (borrowed from path). */
static const char *split_path(const char *path, char *dir, size_t cap)
{
    const char *slash = strrchr(path, '/');
    if (slash == NULL) {
        snprintf(dir, cap, ".");
        return path;
    }
    size_t n = slash == path ? 1 : (size_t)(slash - path);
    snprintf(dir, cap, "%.*s", (int)n, path);
    return slash + 1;
}

/* Deletes <path>.tmp.<pid> files whose process is gone (a write killed half-way). The caller is
 * the starting router: it has written nothing yet, so its own pid's file is stale too. */
static void remove_stale_temps(struct srv *s, const char *path)
{
    char dir[PATH_MAX];
    const char *base = split_path(path, dir, sizeof(dir));
    size_t bl = strlen(base);
    DIR *d = opendir(dir);
    if (d == NULL)
        return;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        const char *n = e->d_name;
        if (strncmp(n, base, bl) != 0 ||
            strncmp(n + bl, KVR_SNAPSHOT_TMP_INFIX, strlen(KVR_SNAPSHOT_TMP_INFIX)) != 0)
            continue;
        const char *digits = n + bl + 5;
        char *end;
        errno = 0;
        long pid = strtol(digits, &end, 10);
        if (*digits == '\0' || *end != '\0' || errno != 0 || pid <= 0)
            continue;
        if ((pid_t)pid != getpid() && (kill((pid_t)pid, 0) == 0 || errno == EPERM))
            continue; /* another live process may be writing it */
        char full[PATH_MAX + 256];
        snprintf(full, sizeof(full), "%s/%s", dir, n);
        if (unlink(full) == 0)
            srv_logf(s->log, SRV_LOG_WARN, "snapshot",
                     "deleted %s: a partial snapshot left by process %ld, which is gone", full,
                     pid);
    }
    closedir(d);
}

int srv_snapshot_restore(struct srv *s, const char *path, uint64_t *events, char *err,
                         size_t err_len)
{
    struct restore_ctx c = {s, 0, 0};
    uint64_t created = 0;
    *events = 0;
    remove_stale_temps(s, path);
    int rc = kvr_snapshot_read_file(path, 0, restore_index, &c, &created, err, err_len);
    if (rc == KVR_ENOTFOUND) {
        srv_logf(s->log, SRV_LOG_INFO, "snapshot", "no snapshot at %s yet: starting empty", path);
        return KVR_OK;
    }
    if (rc != KVR_OK) {
        srv_logf(s->log, SRV_LOG_ERROR, "snapshot",
                 "snapshot %s refused (%s): %s; starting with an EMPTY index", path,
                 kvr_strerror(rc), err);
        if (rc == KVR_ECORRUPT) { /* keep the evidence: the next snapshot would replace it */
            char kept[PATH_MAX + 64];
            snprintf(kept, sizeof(kept), "%s.refused.%llu", path,
                     (unsigned long long)srv_wall_ms());
            if (rename(path, kept) == 0)
                srv_logf(s->log, SRV_LOG_WARN, "snapshot", "the refused file is kept as %s", kept);
            else
                srv_logf(s->log, SRV_LOG_WARN, "snapshot", "cannot rename %s to %s: %s", path, kept,
                         strerror(errno));
        }
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

/* A file name an on-demand snapshot may use: 1..255 of [A-Za-z0-9._-], not hidden, and not one
 * of the names the snapshot machinery itself writes (temp files, kept refused files). */
static int name_ok(const char *n)
{
    size_t len = strlen(n);
    if (len == 0 || len > 255 || n[0] == '.')
        return 0;
    for (size_t k = 0; k < len; k++) {
        char ch = n[k];
        if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
              ch == '.' || ch == '_' || ch == '-'))
            return 0;
    }
    return strstr(n, KVR_SNAPSHOT_TMP_INFIX) == NULL && strstr(n, ".refused.") == NULL;
}

int srv_snapshot_resolve(const struct srv *s, const char *requested, char *out, size_t cap,
                         char *err, size_t err_len)
{
    const char *cfg = s->cfg->snapshot_path;
    if (requested == NULL || requested[0] == '\0') {
        if (cfg == NULL) {
            snprintf(err, err_len, "no snapshot path: start with --snapshot FILE");
            return KVR_EINVAL;
        }
        snprintf(out, cap, "%s", cfg);
        return KVR_OK;
    }
    if (cfg == NULL) {
        snprintf(err, err_len,
                 "?path= is refused without --snapshot FILE (snapshots may only be written in "
                 "the directory of the configured file)");
        return KVR_EINVAL;
    }
    char cdir[PATH_MAX], rdir[PATH_MAX], creal[PATH_MAX], rreal[PATH_MAX];
    split_path(cfg, cdir, sizeof(cdir));
    const char *name = requested;
    if (strchr(requested, '/') != NULL) {
        name = split_path(requested, rdir, sizeof(rdir));
        if (realpath(cdir, creal) == NULL || realpath(rdir, rreal) == NULL ||
            strcmp(creal, rreal) != 0) {
            snprintf(err, err_len, "?path=%s: snapshots may only be written in %s", requested,
                     cdir);
            return KVR_EINVAL;
        }
    }
    if (!name_ok(name)) {
        snprintf(err, err_len,
                 "?path=%s: expected a file name of letters, digits, '.', '_' and '-' (not "
                 "hidden, no '.tmp.' or '.refused.') in %s",
                 requested, cdir);
        return KVR_EINVAL;
    }
    if ((size_t)snprintf(out, cap, "%s/%s", cdir, name) >= cap) {
        snprintf(err, err_len, "?path=%s: path too long", requested);
        return KVR_EINVAL;
    }
    return KVR_OK;
}
