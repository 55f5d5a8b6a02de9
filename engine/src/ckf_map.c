/* ckf_map.c - internal u64 -> u64 open-addressing map (see ckf_map.h).
 * SPDX-License-Identifier: Apache-2.0 */
#include "ckf_map.h"

#include <string.h>

#include "kvr/err.h"

static size_t slot_of(uint64_t key, size_t cap)
{
    /* murmur3 fmix64: engine hashes may be structured, spread them */
    key ^= key >> 33;
    key *= 0xff51afd7ed558ccdULL;
    key ^= key >> 33;
    key *= 0xc4ceb9fe1a85ec53ULL;
    key ^= key >> 33;
    return (size_t)key & (cap - 1);
}

void ckf_map_init(struct ckf_map *m, kvr_alloc_t *alloc)
{
    memset(m, 0, sizeof(*m));
    m->alloc = alloc;
}

void ckf_map_free(struct ckf_map *m)
{
    kvr_free(m->alloc, m->keys);
    kvr_free(m->alloc, m->vals);
    kvr_free(m->alloc, m->used);
    ckf_map_init(m, m->alloc);
}

void ckf_map_clear(struct ckf_map *m)
{
    if (m->cap > 0)
        memset(m->used, 0, m->cap);
    m->n = 0;
}

static size_t find(const struct ckf_map *m, uint64_t key, int *found)
{
    size_t i = slot_of(key, m->cap);
    while (m->used[i]) {
        if (m->keys[i] == key) {
            *found = 1;
            return i;
        }
        i = (i + 1) & (m->cap - 1);
    }
    *found = 0;
    return i;
}

int ckf_map_get(const struct ckf_map *m, uint64_t key, uint64_t *val)
{
    uint64_t *p = ckf_map_ref(m, key);
    if (p == NULL)
        return 0;
    if (val != NULL)
        *val = *p;
    return 1;
}

uint64_t *ckf_map_ref(const struct ckf_map *m, uint64_t key)
{
    if (m->n == 0)
        return NULL;
    int found;
    size_t i = find(m, key, &found);
    return found ? &m->vals[i] : NULL;
}

static int rehash(struct ckf_map *m, size_t cap)
{
    uint64_t *keys = kvr_malloc(m->alloc, cap * sizeof(*keys));
    uint64_t *vals = kvr_malloc(m->alloc, cap * sizeof(*vals));
    uint8_t *used = kvr_calloc(m->alloc, cap, 1);
    if (keys == NULL || vals == NULL || used == NULL) {
        kvr_free(m->alloc, keys);
        kvr_free(m->alloc, vals);
        kvr_free(m->alloc, used);
        return KVR_ENOMEM;
    }
    for (size_t j = 0; j < m->cap; j++) {
        if (!m->used[j])
            continue;
        size_t i = slot_of(m->keys[j], cap);
        while (used[i])
            i = (i + 1) & (cap - 1);
        used[i] = 1;
        keys[i] = m->keys[j];
        vals[i] = m->vals[j];
    }
    kvr_free(m->alloc, m->keys);
    kvr_free(m->alloc, m->vals);
    kvr_free(m->alloc, m->used);
    m->keys = keys;
    m->vals = vals;
    m->used = used;
    m->cap = cap;
    return KVR_OK;
}

int ckf_map_reserve(struct ckf_map *m, size_t extra)
{
    size_t need = m->n + extra;
    if (need < m->n)
        return KVR_ENOMEM;
    size_t cap = m->cap ? m->cap : 16;
    while (need > cap / 4 * 3) {
        if (cap > SIZE_MAX / 2 / sizeof(uint64_t))
            return KVR_ENOMEM;
        cap *= 2;
    }
    return cap == m->cap ? KVR_OK : rehash(m, cap);
}

int ckf_map_put(struct ckf_map *m, uint64_t key, uint64_t val)
{
    int found = 0;
    size_t i;
    if (m->cap > 0) {
        i = find(m, key, &found);
        if (found) {
            m->vals[i] = val;
            return KVR_OK;
        }
    }
    int rc = ckf_map_reserve(m, 1);
    if (rc != KVR_OK)
        return rc;
    i = find(m, key, &found);
    m->used[i] = 1;
    m->keys[i] = key;
    m->vals[i] = val;
    m->n++;
    return KVR_OK;
}

int ckf_map_del(struct ckf_map *m, uint64_t key, uint64_t *val)
{
    if (m->n == 0)
        return 0;
    int found;
    size_t i = find(m, key, &found);
    if (!found)
        return 0;
    if (val != NULL)
        *val = m->vals[i];
    /* backward-shift: pull later members of the probe run into the hole */
    size_t mask = m->cap - 1, j = i;
    for (;;) {
        j = (j + 1) & mask;
        if (!m->used[j])
            break;
        size_t home = slot_of(m->keys[j], m->cap);
        /* j may move to i iff home is not cyclically in (i, j] */
        if (((j - home) & mask) >= ((j - i) & mask)) {
            m->keys[i] = m->keys[j];
            m->vals[i] = m->vals[j];
            i = j;
        }
    }
    m->used[i] = 0;
    m->n--;
    return 1;
}

int ckf_map_next(const struct ckf_map *m, size_t *pos, uint64_t *key, uint64_t *val)
{
    for (size_t i = *pos; i < m->cap; i++) {
        if (m->used[i]) {
            *key = m->keys[i];
            *val = m->vals[i];
            *pos = i + 1;
            return 1;
        }
    }
    *pos = m->cap;
    return 0;
}

size_t ckf_map_bytes(const struct ckf_map *m)
{
    return m->cap * (2 * sizeof(uint64_t) + 1);
}
