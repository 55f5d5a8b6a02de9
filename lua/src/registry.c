/* registry.c - installing, removing and binding named policies; the shipped policy sources.
 * SPDX-License-Identifier: Apache-2.0 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "kvr/err.h"

int kvr_lua_policy_install(kvr_lua_runtime_t *rt, const char *name, const char *src, size_t len,
                           unsigned flags, uint64_t *generation, int *status, char *err,
                           size_t err_len)
{
    char dummy[8];
    if (err == NULL || err_len == 0) {
        err = dummy;
        err_len = sizeof(dummy);
    }
    err[0] = '\0';
    int st_dummy;
    if (status == NULL)
        status = &st_dummy;
    *status = KVR_LUA_OK;
    if (name == NULL || !rt_valid_name(name, strlen(name))) {
        snprintf(err, err_len, "invalid policy name (1 to 63 bytes of [A-Za-z0-9_.-])");
        *status = KVR_LUA_INVALID;
        return KVR_EINVAL;
    }
    if (src == NULL || (flags & ~KVR_LUA_TRUSTED) != 0) {
        snprintf(err, err_len, "invalid arguments");
        *status = KVR_LUA_INVALID;
        return KVR_EINVAL;
    }
    pthread_mutex_lock(&rt->install_mu);
    pthread_mutex_lock(&rt->mu);
    int id = rt_name_id(rt, name);
    pthread_mutex_unlock(&rt->mu);
    if (id < 0) {
        pthread_mutex_unlock(&rt->install_mu);
        snprintf(err, err_len, "too many policy names (%d)", KVR_LUA_MAX_POLICIES);
        *status = KVR_LUA_INVALID;
        return KVR_ECAPACITY;
    }
    struct policy_def p;
    memset(&p, 0, sizeof(p));
    snprintf(p.name, sizeof(p.name), "%s", name);
    p.id = (uint32_t)id;
    p.flags = flags;
    p.source = malloc(len + 1);
    if (p.source == NULL) {
        pthread_mutex_unlock(&rt->install_mu);
        snprintf(err, err_len, "out of memory");
        *status = KVR_LUA_ERRMEM;
        return KVR_ENOMEM;
    }
    memcpy(p.source, src, len);
    p.source[len] = '\0';
    p.source_len = len;
    int st = reload_validate(rt, &p, err, err_len); /* no lock held: may take milliseconds */
    *status = st;
    int rc = KVR_OK;
    pthread_mutex_lock(&rt->mu);
    if (st != KVR_LUA_OK) {
        rt->names[id].rejected++;
        rc = st == KVR_LUA_ERRMEM ? KVR_ENOMEM : KVR_EINVAL;
    } else {
        struct policy_set *s = set_copy(rt->set);
        int slot = s ? set_find(s, name, strlen(name)) : -1;
        if (s != NULL && slot < 0) {
            struct policy_def *np = realloc(s->p, (s->n + 1) * sizeof(*np));
            if (np == NULL) {
                set_unref(s);
                s = NULL;
            } else {
                s->p = np;
                slot = (int)s->n++;
                memset(&s->p[slot], 0, sizeof(s->p[slot]));
            }
        }
        if (s == NULL) {
            rc = KVR_ENOMEM;
            *status = KVR_LUA_ERRMEM;
            snprintf(err, err_len, "out of memory");
        } else {
            def_clear(&s->p[slot]);
            s->p[slot] = p; /* takes ownership of source and bytecode */
            p.source = p.bytecode = NULL;
            uint64_t g = rt_publish(rt, s);
            rt->names[id].reloads++;
            rt->names[id].generation = g;
            rt->names[id].trusted = (flags & KVR_LUA_TRUSTED) != 0;
            rt->names[id].live = 1;
            if (generation)
                *generation = g;
        }
    }
    pthread_mutex_unlock(&rt->mu);
    def_clear(&p);
    pthread_mutex_unlock(&rt->install_mu);
    if (rc == KVR_OK) {
        rt_log(rt, KVR_LUA_LOG_INFO, "policy %s installed (generation %llu%s)", name,
               (unsigned long long)kvr_lua_runtime_generation(rt),
               (flags & KVR_LUA_TRUSTED) ? ", trusted: JIT on" : "");
        rt_wake_all(rt);
    } else {
        rt_log(rt, KVR_LUA_LOG_WARN, "policy %s refused: %s", name, err);
    }
    return rc;
}

int kvr_lua_policy_remove(kvr_lua_runtime_t *rt, const char *name, uint64_t *generation)
{
    int rc = KVR_OK;
    pthread_mutex_lock(&rt->install_mu);
    pthread_mutex_lock(&rt->mu);
    int slot = set_find(rt->set, name, strlen(name));
    if (slot < 0) {
        rc = KVR_ENOTFOUND;
    } else {
        struct policy_set *s = set_copy(rt->set);
        if (s == NULL) {
            rc = KVR_ENOMEM;
        } else {
            def_clear(&s->p[slot]);
            memmove(&s->p[slot], &s->p[slot + 1], (s->n - (size_t)slot - 1) * sizeof(*s->p));
            s->n--;
            size_t k = 0;
            for (size_t i = 0; i < s->n_bind; i++) {
                if (s->bind[i].slot == slot)
                    continue;
                s->bind[k] = s->bind[i];
                if (s->bind[k].slot > slot)
                    s->bind[k].slot--;
                k++;
            }
            s->n_bind = k;
            if (s->default_slot == slot)
                s->default_slot = -1;
            else if (s->default_slot > slot)
                s->default_slot--;
            int id = rt_name_id(rt, name);
            rt->names[id].live = 0;
            uint64_t g = rt_publish(rt, s);
            if (generation)
                *generation = g;
        }
    }
    pthread_mutex_unlock(&rt->mu);
    pthread_mutex_unlock(&rt->install_mu);
    if (rc == KVR_OK)
        rt_wake_all(rt);
    return rc;
}

int kvr_lua_policy_bind(kvr_lua_runtime_t *rt, const char *model, const char *policy,
                        uint64_t *generation)
{
    size_t mlen = model ? strlen(model) : 0;
    if (mlen > KVR_LUA_NAME_MAX)
        return KVR_EINVAL;
    int rc = KVR_OK;
    pthread_mutex_lock(&rt->install_mu);
    pthread_mutex_lock(&rt->mu);
    int slot = -1;
    if (policy != NULL && (slot = set_find(rt->set, policy, strlen(policy))) < 0) {
        rc = KVR_ENOTFOUND;
        goto out;
    }
    struct policy_set *s = set_copy(rt->set);
    if (s == NULL) {
        rc = KVR_ENOMEM;
        goto out;
    }
    if (mlen == 0) {
        s->default_slot = slot;
    } else {
        size_t i = 0;
        while (i < s->n_bind &&
               !(s->bind[i].model_len == mlen && memcmp(s->bind[i].model, model, mlen) == 0))
            i++;
        if (slot < 0) { /* unbind */
            if (i < s->n_bind)
                s->bind[i] = s->bind[--s->n_bind];
        } else if (i < s->n_bind) {
            s->bind[i].slot = slot;
        } else if (s->n_bind == KVR_LUA_MAX_BINDINGS) {
            set_unref(s);
            rc = KVR_ECAPACITY;
            goto out;
        } else {
            struct binding *nb = realloc(s->bind, (s->n_bind + 1) * sizeof(*nb));
            if (nb == NULL) {
                set_unref(s);
                rc = KVR_ENOMEM;
                goto out;
            }
            s->bind = nb;
            memset(&nb[s->n_bind], 0, sizeof(*nb));
            memcpy(nb[s->n_bind].model, model, mlen);
            nb[s->n_bind].model_len = mlen;
            nb[s->n_bind].slot = slot;
            s->n_bind++;
        }
    }
    uint64_t g = rt_publish(rt, s);
    if (generation)
        *generation = g;
out:
    pthread_mutex_unlock(&rt->mu);
    pthread_mutex_unlock(&rt->install_mu);
    if (rc == KVR_OK)
        rt_wake_all(rt);
    return rc;
}

/* ==== shipped policies ======================================================================= */

static const char *builtin_names[KVR_LUA_MAX_POLICIES + 1];
static pthread_once_t builtin_once = PTHREAD_ONCE_INIT;

static void builtin_init(void)
{
    size_t n = 0;
    for (size_t i = 0; i < kvr_lua_embedded_count && n < KVR_LUA_MAX_POLICIES; i++)
        if (strncmp(kvr_lua_embedded[i].name, "policies/", 9) == 0)
            builtin_names[n++] = kvr_lua_embedded[i].name + 9;
    builtin_names[n] = NULL;
}

const char *const *kvr_lua_builtin_names(void)
{
    pthread_once(&builtin_once, builtin_init);
    return builtin_names;
}

int kvr_lua_builtin_source(kvr_lua_runtime_t *rt, const char *name, const char **src, size_t *len)
{
    if (name == NULL || !rt_valid_name(name, strlen(name)))
        return KVR_ENOTFOUND;
    if (rt != NULL && rt->cfg.policy_dir != NULL) {
        int rc = KVR_ENOTFOUND;
        pthread_mutex_lock(&rt->mu);
        for (size_t i = 0; i < rt->n_dir_cache; i++)
            if (strcmp(rt->dir_cache[i].name, name) == 0) {
                *src = rt->dir_cache[i].src;
                *len = rt->dir_cache[i].len;
                rc = KVR_OK;
            }
        if (rc != KVR_OK) {
            char path[1024];
            snprintf(path, sizeof(path), "%s/%s.lua", rt->cfg.policy_dir, name);
            FILE *f = fopen(path, "rb");
            if (f != NULL) {
                char *buf = NULL;
                size_t n = 0, cap = 0;
                int ok = 1;
                for (;;) {
                    if (n == cap) {
                        char *b = realloc(buf, cap ? cap * 2 : 16384);
                        if (b == NULL) {
                            ok = 0;
                            break;
                        }
                        buf = b;
                        cap = cap ? cap * 2 : 16384;
                    }
                    size_t r = fread(buf + n, 1, cap - n, f);
                    n += r;
                    if (r == 0)
                        break;
                }
                fclose(f);
                struct dir_src *dc =
                    ok ? realloc(rt->dir_cache, (rt->n_dir_cache + 1) * sizeof(*dc)) : NULL;
                if (dc != NULL) {
                    rt->dir_cache = dc;
                    snprintf(dc[rt->n_dir_cache].name, NAME_CAP, "%s", name);
                    dc[rt->n_dir_cache].src = buf;
                    dc[rt->n_dir_cache].len = n;
                    rt->n_dir_cache++;
                    *src = buf;
                    *len = n;
                    rc = KVR_OK;
                } else {
                    free(buf);
                }
            }
        }
        pthread_mutex_unlock(&rt->mu);
        if (rc == KVR_OK)
            return KVR_OK;
    }
    char key[NAME_CAP + 16];
    snprintf(key, sizeof(key), "policies/%s", name);
    const struct kvr_lua_embedded *e = embedded_find(key);
    if (e == NULL)
        return KVR_ENOTFOUND;
    *src = e->data;
    *len = e->len;
    return KVR_OK;
}
