/* set.c - immutable, refcounted policy sets (one per generation) and their publication.
 * SPDX-License-Identifier: Apache-2.0 */
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "kvr/err.h"

struct policy_set *set_new(void)
{
    struct policy_set *s = calloc(1, sizeof(*s));
    if (s == NULL)
        return NULL;
    atomic_init(&s->refs, 1);
    s->default_slot = -1;
    return s;
}

void def_clear(struct policy_def *p)
{
    free(p->source);
    free(p->bytecode);
    p->source = p->bytecode = NULL;
}

static int def_copy(struct policy_def *dst, const struct policy_def *src)
{
    *dst = *src;
    dst->source = malloc(src->source_len + 1);
    dst->bytecode = malloc(src->bytecode_len ? src->bytecode_len : 1);
    if (dst->source == NULL || dst->bytecode == NULL) {
        def_clear(dst);
        return KVR_ENOMEM;
    }
    memcpy(dst->source, src->source, src->source_len);
    dst->source[src->source_len] = '\0';
    memcpy(dst->bytecode, src->bytecode, src->bytecode_len);
    return KVR_OK;
}

static void set_destroy(struct policy_set *s)
{
    for (size_t i = 0; i < s->n; i++)
        def_clear(&s->p[i]);
    free(s->p);
    free(s->bind);
    free(s);
}

struct policy_set *set_copy(const struct policy_set *s)
{
    struct policy_set *c = set_new();
    if (c == NULL)
        return NULL;
    c->generation = s->generation;
    c->default_slot = s->default_slot;
    if (s->n > 0) {
        c->p = calloc(s->n, sizeof(*c->p));
        if (c->p == NULL)
            goto fail;
        for (size_t i = 0; i < s->n; i++) {
            if (def_copy(&c->p[i], &s->p[i]) != KVR_OK)
                goto fail;
            c->n = i + 1;
        }
    }
    if (s->n_bind > 0) {
        c->bind = malloc(s->n_bind * sizeof(*c->bind));
        if (c->bind == NULL)
            goto fail;
        memcpy(c->bind, s->bind, s->n_bind * sizeof(*c->bind));
        c->n_bind = s->n_bind;
    }
    return c;
fail:
    set_destroy(c);
    return NULL;
}

void set_ref(struct policy_set *s)
{
    atomic_fetch_add_explicit(&s->refs, 1, memory_order_relaxed);
}

void set_unref(struct policy_set *s)
{
    if (s != NULL && atomic_fetch_sub_explicit(&s->refs, 1, memory_order_acq_rel) == 1)
        set_destroy(s);
}

int set_find(const struct policy_set *s, const char *name, size_t len)
{
    for (size_t i = 0; i < s->n; i++)
        if (strlen(s->p[i].name) == len && memcmp(s->p[i].name, name, len) == 0)
            return (int)i;
    return -1;
}

/* Publishes s as the new current set (caller holds rt->mu); returns the new generation. */
uint64_t rt_publish(kvr_lua_runtime_t *rt, struct policy_set *s)
{
    s->generation = atomic_load(&rt->generation) + 1;
    struct policy_set *old = rt->set;
    rt->set = s;
    atomic_store_explicit(&rt->generation, s->generation, memory_order_release);
    set_unref(old);
    return s->generation;
}

/* Calls every VM's wake callback (outside rt->mu: wake may take the owner's locks). */
void rt_wake_all(kvr_lua_runtime_t *rt)
{
    struct {
        void (*fn)(void *);
        void *ctx;
    } w[256];
    size_t n = 0;
    pthread_mutex_lock(&rt->mu);
    for (struct kvr_lua_vm *vm = rt->vms; vm != NULL && n < 256; vm = vm->next)
        if (vm->vcfg.wake != NULL) {
            w[n].fn = vm->vcfg.wake;
            w[n].ctx = vm->vcfg.wake_ctx;
            n++;
        }
    pthread_mutex_unlock(&rt->mu);
    for (size_t i = 0; i < n; i++)
        w[i].fn(w[i].ctx);
}
