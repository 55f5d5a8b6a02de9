/* u64tab.c - open-addressing u64 -> u32 table (see u64tab.h).
 * SPDX-License-Identifier: Apache-2.0 */
#include "u64tab.h"

#include <stdlib.h>
#include <string.h>

#include "kvr/err.h"

static uint64_t mix(uint64_t x)
{
    x ^= x >> 30;
    x *= 0xBF58476D1CE4E5B9ULL;
    x ^= x >> 27;
    x *= 0x94D049BB133111EBULL;
    return x ^ (x >> 31);
}

void kvr_sim_u64tab_init(struct kvr_sim_u64tab *t)
{
    memset(t, 0, sizeof(*t));
}

void kvr_sim_u64tab_free(struct kvr_sim_u64tab *t)
{
    free(t->slots);
    kvr_sim_u64tab_init(t);
}

void kvr_sim_u64tab_clear(struct kvr_sim_u64tab *t)
{
    if (t->slots != NULL)
        memset(t->slots, 0, t->cap * sizeof(*t->slots));
    t->n = 0;
}

/* Slot of key, or of the empty slot that ends its probe run. cap > 0. */
static size_t find(const struct kvr_sim_u64tab *t, uint64_t key)
{
    size_t mask = t->cap - 1, i = (size_t)mix(key) & mask;
    while (t->slots[i].val1 != 0 && t->slots[i].key != key)
        i = (i + 1) & mask;
    return i;
}

int kvr_sim_u64tab_get(const struct kvr_sim_u64tab *t, uint64_t key, uint32_t *val)
{
    if (t->n == 0)
        return 0;
    size_t i = find(t, key);
    if (t->slots[i].val1 == 0)
        return 0;
    if (val != NULL)
        *val = t->slots[i].val1 - 1;
    return 1;
}

static int grow(struct kvr_sim_u64tab *t)
{
    size_t ncap = t->cap ? t->cap * 2 : 64;
    if (ncap > SIZE_MAX / sizeof(struct kvr_sim_u64slot))
        return KVR_ENOMEM;
    struct kvr_sim_u64slot *ns = calloc(ncap, sizeof(*ns));
    if (ns == NULL)
        return KVR_ENOMEM;
    struct kvr_sim_u64tab nt = {ns, ncap, 0};
    for (size_t i = 0; i < t->cap; i++)
        if (t->slots[i].val1 != 0) {
            size_t j = find(&nt, t->slots[i].key);
            nt.slots[j] = t->slots[i];
            nt.n++;
        }
    free(t->slots);
    *t = nt;
    return KVR_OK;
}

int kvr_sim_u64tab_put(struct kvr_sim_u64tab *t, uint64_t key, uint32_t val)
{
    if (val == UINT32_MAX)
        return KVR_EINVAL;
    if (t->cap == 0 || (t->n + 1) * 4 > t->cap * 3) {
        int rc = grow(t);
        if (rc != KVR_OK)
            return rc;
    }
    size_t i = find(t, key);
    if (t->slots[i].val1 == 0) {
        t->slots[i].key = key;
        t->n++;
    }
    t->slots[i].val1 = val + 1;
    return KVR_OK;
}

int kvr_sim_u64tab_del(struct kvr_sim_u64tab *t, uint64_t key)
{
    if (t->n == 0)
        return 0;
    size_t mask = t->cap - 1, i = find(t, key);
    if (t->slots[i].val1 == 0)
        return 0;
    /* Backward shift: move later members of the run into the hole when their home allows. */
    size_t j = i;
    for (;;) {
        j = (j + 1) & mask;
        if (t->slots[j].val1 == 0)
            break;
        size_t home = (size_t)mix(t->slots[j].key) & mask;
        /* j may move to i iff home is not cyclically in (i, j]. */
        int stays = i <= j ? (home > i && home <= j) : (home > i || home <= j);
        if (!stays) {
            t->slots[i] = t->slots[j];
            i = j;
        }
    }
    t->slots[i].val1 = 0;
    t->slots[i].key = 0;
    t->n--;
    return 1;
}
