/* lru.c - LRU prefix cache of one simulated worker (see lru.h).
 * SPDX-License-Identifier: Apache-2.0 */
#include "lru.h"

#include <stdlib.h>
#include <string.h>

#include "kvr/err.h"

#define NIL KVR_SIM_LRU_NIL

void kvr_sim_lru_init(struct kvr_sim_lru *l, uint64_t worker_id, uint64_t capacity)
{
    memset(l, 0, sizeof(*l));
    l->worker_id = worker_id;
    l->capacity = capacity;
    l->free_head = NIL;
    l->mru = l->lru = NIL;
    kvr_sim_u64tab_init(&l->tab);
}

void kvr_sim_lru_free(struct kvr_sim_lru *l)
{
    free(l->nodes);
    free(l->blocks);
    free(l->hashes);
    free(l->slots);
    kvr_sim_u64tab_free(&l->tab);
    kvr_sim_lru_init(l, l->worker_id, l->capacity);
}

size_t kvr_sim_lru_prefix(const struct kvr_sim_lru *l, const uint64_t *seq, size_t n)
{
    size_t q = 0;
    while (q < n && kvr_sim_u64tab_get(&l->tab, seq[q], NULL))
        q++;
    return q;
}

/* ==== list primitives ======================================================================== */

static void unlink_node(struct kvr_sim_lru *l, uint32_t i)
{
    struct kvr_sim_lru_node *x = &l->nodes[i];
    if (x->prev != NIL)
        l->nodes[x->prev].next = x->next;
    else
        l->mru = x->next;
    if (x->next != NIL)
        l->nodes[x->next].prev = x->prev;
    else
        l->lru = x->prev;
}

static void push_front(struct kvr_sim_lru *l, uint32_t i)
{
    struct kvr_sim_lru_node *x = &l->nodes[i];
    x->prev = NIL;
    x->next = l->mru;
    if (l->mru != NIL)
        l->nodes[l->mru].prev = i;
    else
        l->lru = i;
    l->mru = i;
}

/* A free node slot, growing the pool when needed; NIL on allocation failure. */
static uint32_t alloc_node(struct kvr_sim_lru *l)
{
    if (l->free_head != NIL) {
        uint32_t i = l->free_head;
        l->free_head = l->nodes[i].next;
        return i;
    }
    if (l->used_nodes == l->cap_nodes) {
        uint32_t ncap = l->cap_nodes ? l->cap_nodes * 2 : 256;
        if (ncap <= l->cap_nodes || ncap == NIL)
            return NIL;
        struct kvr_sim_lru_node *nn = realloc(l->nodes, (size_t)ncap * sizeof(*nn));
        if (nn == NULL)
            return NIL;
        l->nodes = nn;
        l->cap_nodes = ncap;
    }
    return l->used_nodes++;
}

static void free_node(struct kvr_sim_lru *l, uint32_t i)
{
    l->nodes[i].next = l->free_head;
    l->free_head = i;
}

static int reserve(void **p, size_t *cap, size_t need, size_t size)
{
    if (need <= *cap)
        return KVR_OK;
    size_t ncap = *cap ? *cap : 64;
    while (ncap < need)
        ncap *= 2;
    void *np = realloc(*p, ncap * size);
    if (np == NULL)
        return KVR_ENOMEM;
    *p = np;
    *cap = ncap;
    return KVR_OK;
}

/* ==== operations ============================================================================= */

void kvr_sim_lru_touch(struct kvr_sim_lru *l, const uint64_t *seq, size_t n)
{
    for (size_t k = n; k-- > 0;) {
        uint32_t i;
        if (kvr_sim_u64tab_get(&l->tab, seq[k], &i)) {
            unlink_node(l, i);
            push_front(l, i);
        }
    }
}

static void emit(const struct kvr_sim_sink *sink, const struct kvr_event *ev)
{
    if (sink != NULL && sink->fn != NULL)
        sink->fn(sink->ctx, ev);
}

/* Looks up the cached prefix of seq[0..n), recording each block's node in l->slots[0..q);
 * returns q, or SIZE_MAX when the scratch cannot grow. */
static size_t find_prefix(struct kvr_sim_lru *l, const uint64_t *seq, size_t n)
{
    if (reserve((void **)&l->slots, &l->cap_slots, n ? n : 1, sizeof(*l->slots)) != KVR_OK)
        return SIZE_MAX;
    size_t q = 0;
    while (q < n && kvr_sim_u64tab_get(&l->tab, seq[q], &l->slots[q]))
        q++;
    return q;
}

/* Moves the nodes l->slots[0..n) to the MRU end, the last one first. */
static void touch_slots(struct kvr_sim_lru *l, size_t n)
{
    for (size_t k = n; k-- > 0;) {
        unlink_node(l, l->slots[k]);
        push_front(l, l->slots[k]);
    }
}

size_t kvr_sim_lru_hit(struct kvr_sim_lru *l, const uint64_t *seq, size_t n)
{
    size_t q = find_prefix(l, seq, n);
    if (q == SIZE_MAX) { /* no scratch: the slower two-pass form */
        q = kvr_sim_lru_prefix(l, seq, n);
        kvr_sim_lru_touch(l, seq, q);
        return q;
    }
    touch_slots(l, q);
    return q;
}

int kvr_sim_lru_store(struct kvr_sim_lru *l, const uint64_t *seq, const uint64_t *local, size_t n,
                      const struct kvr_sim_sink *sink, size_t *evicted)
{
    if (evicted != NULL)
        *evicted = 0;
    size_t q = find_prefix(l, seq, n);
    if (q == SIZE_MAX || n - q > UINT32_MAX ||
        reserve((void **)&l->blocks, &l->cap_blocks, n - q ? n - q : 1, sizeof(*l->blocks)) !=
            KVR_OK)
        return KVR_ENOMEM;
    int rc = KVR_OK;
    size_t end = q;
    for (; end < n; end++) {
        uint32_t i = alloc_node(l);
        if (i == NIL || kvr_sim_u64tab_put(&l->tab, seq[end], i) != KVR_OK) {
            if (i != NIL)
                free_node(l, i);
            rc = KVR_ENOMEM; /* blocks q..end-1 went in: report and keep those */
            break;
        }
        l->nodes[i].key = seq[end];
        push_front(l, i);
        l->slots[end] = i;
        l->size++;
    }
    if (end > q) {
        for (size_t k = q; k < end; k++)
            l->blocks[k - q] = (struct kvr_block){seq[k], local[k]};
        struct kvr_event ev = {.worker_id = l->worker_id,
                               .event_id = l->next_event_id++,
                               .parent_hash = q > 0 ? seq[q - 1] : 0,
                               .kind = KVR_EVENT_STORED,
                               .tier = KVR_TIER_DEVICE,
                               .has_parent = q > 0,
                               .n = (uint32_t)(end - q),
                               .blocks = l->blocks};
        l->stored_events++;
        l->stored_blocks += end - q;
        emit(sink, &ev);
    }
    touch_slots(l, end); /* tail first: every parent ends more recent than its children */
    size_t n_ev = l->size > l->capacity ? (size_t)(l->size - l->capacity) : 0;
    if (n_ev > 0) {
        if (n_ev > UINT32_MAX ||
            reserve((void **)&l->hashes, &l->cap_hashes, n_ev, sizeof(*l->hashes)) != KVR_OK)
            return KVR_ENOMEM;
        for (size_t k = 0; k < n_ev; k++) {
            uint32_t i = l->lru;
            l->hashes[k] = l->nodes[i].key;
            unlink_node(l, i);
            kvr_sim_u64tab_del(&l->tab, l->nodes[i].key);
            free_node(l, i);
            l->size--;
        }
        struct kvr_event ev = {.worker_id = l->worker_id,
                               .event_id = l->next_event_id++,
                               .kind = KVR_EVENT_REMOVED,
                               .tier = KVR_TIER_DEVICE,
                               .n = (uint32_t)n_ev,
                               .hashes = l->hashes};
        l->removed_events++;
        l->removed_blocks += n_ev;
        emit(sink, &ev);
        if (evicted != NULL)
            *evicted = n_ev;
    }
    return rc;
}

size_t kvr_sim_lru_oldest(const struct kvr_sim_lru *l, uint64_t *out, size_t cap)
{
    size_t k = 0;
    for (uint32_t i = l->lru; i != NIL && k < cap; i = l->nodes[i].prev)
        out[k++] = l->nodes[i].key;
    return k;
}
