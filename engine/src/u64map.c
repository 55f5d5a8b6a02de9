/* u64map.c - open-addressing u64 -> u64 map with backward-shift deletion (see u64map.h).
 * SPDX-License-Identifier: Apache-2.0 */
#include "u64map.h"

#include <string.h>

#include "kvr/err.h"

#define MIN_CAP 16u

static inline uint64_t mix(uint64_t x)
{
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    x ^= x >> 31;
    return x;
}

void kvr_u64map_init(struct kvr_u64map *m, kvr_alloc_t *a)
{
    memset(m, 0, sizeof(*m));
    m->a = a;
}

void kvr_u64map_destroy(struct kvr_u64map *m)
{
    kvr_free(m->a, m->keys);
    kvr_free(m->a, m->vals);
    kvr_alloc_t *a = m->a;
    kvr_u64map_init(m, a);
}

uint64_t *kvr_u64map_get(const struct kvr_u64map *m, uint64_t key)
{
    if (key == 0)
        return m->has_zero ? (uint64_t *)&m->zero_val : NULL;
    if (m->cap == 0)
        return NULL;
    size_t mask = m->cap - 1;
    for (size_t i = mix(key) & mask;; i = (i + 1) & mask) {
        if (m->keys[i] == key)
            return &m->vals[i];
        if (m->keys[i] == 0)
            return NULL;
    }
}

/* Places key/val into a table known to have room and not to hold key. */
static void place(uint64_t *keys, uint64_t *vals, size_t cap, uint64_t key, uint64_t val)
{
    size_t mask = cap - 1;
    size_t i = mix(key) & mask;
    while (keys[i] != 0)
        i = (i + 1) & mask;
    keys[i] = key;
    vals[i] = val;
}

static int rehash(struct kvr_u64map *m, size_t cap)
{
    uint64_t *keys = kvr_calloc(m->a, cap, sizeof(uint64_t));
    uint64_t *vals = kvr_malloc(m->a, cap * sizeof(uint64_t));
    if (keys == NULL || vals == NULL) {
        kvr_free(m->a, keys);
        kvr_free(m->a, vals);
        return KVR_ENOMEM;
    }
    for (size_t i = 0; i < m->cap; i++)
        if (m->keys[i] != 0)
            place(keys, vals, cap, m->keys[i], m->vals[i]);
    kvr_free(m->a, m->keys);
    kvr_free(m->a, m->vals);
    m->keys = keys;
    m->vals = vals;
    m->cap = cap;
    return KVR_OK;
}

int kvr_u64map_reserve(struct kvr_u64map *m, size_t extra)
{
    size_t need = m->n + extra;
    if (need < m->n)
        return KVR_ENOMEM;
    size_t cap = m->cap ? m->cap : MIN_CAP;
    while (need > cap / 4 * 3) {
        if (cap > SIZE_MAX / 2 / sizeof(uint64_t))
            return KVR_ENOMEM;
        cap *= 2;
    }
    return cap == m->cap ? KVR_OK : rehash(m, cap);
}

int kvr_u64map_put(struct kvr_u64map *m, uint64_t key, uint64_t val)
{
    uint64_t *v = kvr_u64map_get(m, key);
    if (v != NULL) {
        *v = val;
        return KVR_OK;
    }
    if (key == 0) {
        m->has_zero = 1;
        m->zero_val = val;
        return KVR_OK;
    }
    int rc = kvr_u64map_reserve(m, 1);
    if (rc != KVR_OK)
        return rc;
    place(m->keys, m->vals, m->cap, key, val);
    m->n++;
    return KVR_OK;
}

int kvr_u64map_del(struct kvr_u64map *m, uint64_t key)
{
    if (key == 0) {
        int had = m->has_zero;
        m->has_zero = 0;
        return had;
    }
    if (m->cap == 0)
        return 0;
    size_t mask = m->cap - 1;
    size_t i = mix(key) & mask;
    while (m->keys[i] != key) {
        if (m->keys[i] == 0)
            return 0;
        i = (i + 1) & mask;
    }
    /* Backward shift: pull later members of the probe run into the hole when their home slot
     * does not lie cyclically in (hole, j]. */
    size_t hole = i;
    for (size_t j = (i + 1) & mask; m->keys[j] != 0; j = (j + 1) & mask) {
        size_t home = mix(m->keys[j]) & mask;
        int stays = hole <= j ? (hole < home && home <= j) : (hole < home || home <= j);
        if (!stays) {
            m->keys[hole] = m->keys[j];
            m->vals[hole] = m->vals[j];
            hole = j;
        }
    }
    m->keys[hole] = 0;
    m->n--;
    return 1;
}

int kvr_u64map_next(const struct kvr_u64map *m, size_t *pos, uint64_t *key, uint64_t *val)
{
    /* Position 0 is key 0 (out of band); table slot i is position i + 1. */
    if (*pos == 0) {
        *pos = 1;
        if (m->has_zero) {
            *key = 0;
            *val = m->zero_val;
            return 1;
        }
    }
    while (*pos - 1 < m->cap) {
        size_t i = *pos - 1;
        (*pos)++;
        if (m->keys[i] != 0) {
            *key = m->keys[i];
            *val = m->vals[i];
            return 1;
        }
    }
    return 0;
}
