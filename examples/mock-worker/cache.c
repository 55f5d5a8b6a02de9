/* cache.c - the mock worker's LRU of KV blocks keyed by Dynamo sequence hash (see mock.h).
 *
 * A doubly-linked recency list over a fixed slot array, plus an open-addressing table (linear
 * probing, backward-shift deletion) from key to slot. Callers touch a request's blocks from the
 * last to the first, so a parent is always more recent than its children and eviction takes
 * leaves first (as an engine's prefix cache does). */
#include <stdlib.h>
#include <string.h>

#include "mock.h"

static uint32_t bucket(const struct mock_cache *c, uint64_t key)
{
    return (uint32_t)((key * 0x9E3779B97F4A7C15ULL) >> 32) & c->tmask;
}

int mock_cache_init(struct mock_cache *c, uint32_t cap)
{
    memset(c, 0, sizeof(*c));
    if (cap == 0 || cap > (1u << 30))
        return -1;
    uint32_t tcap = 16;
    while (tcap < 2 * cap)
        tcap *= 2;
    c->cap = cap;
    c->key = calloc(cap, sizeof(*c->key));
    c->prev = calloc(cap, sizeof(*c->prev));
    c->next = calloc(cap, sizeof(*c->next));
    c->table = calloc(tcap, sizeof(*c->table));
    if (c->key == NULL || c->prev == NULL || c->next == NULL || c->table == NULL) {
        mock_cache_free(c);
        return -1;
    }
    c->tmask = tcap - 1;
    c->head = c->tail = -1;
    for (uint32_t i = 0; i < cap; i++)
        c->next[i] = i + 1 < cap ? (int32_t)(i + 1) : -1;
    c->free_ = 0;
    return 0;
}

void mock_cache_free(struct mock_cache *c)
{
    free(c->key);
    free(c->prev);
    free(c->next);
    free(c->table);
    memset(c, 0, sizeof(*c));
}

/* Returns the table position holding `key`, or -1. */
static int64_t find_pos(const struct mock_cache *c, uint64_t key)
{
    for (uint32_t p = bucket(c, key);; p = (p + 1) & c->tmask) {
        int32_t v = c->table[p];
        if (v == 0)
            return -1;
        if (c->key[v - 1] == key)
            return p;
    }
}

int mock_cache_contains(const struct mock_cache *c, uint64_t key)
{
    return c->cap > 0 && find_pos(c, key) >= 0;
}

static void unlink_slot(struct mock_cache *c, int32_t s)
{
    if (c->prev[s] >= 0)
        c->next[c->prev[s]] = c->next[s];
    else
        c->head = c->next[s];
    if (c->next[s] >= 0)
        c->prev[c->next[s]] = c->prev[s];
    else
        c->tail = c->prev[s];
}

static void push_front(struct mock_cache *c, int32_t s)
{
    c->prev[s] = -1;
    c->next[s] = c->head;
    if (c->head >= 0)
        c->prev[c->head] = s;
    c->head = s;
    if (c->tail < 0)
        c->tail = s;
}

void mock_cache_touch(struct mock_cache *c, uint64_t key)
{
    int64_t p = find_pos(c, key);
    if (p < 0)
        return;
    int32_t s = c->table[p] - 1;
    if (c->head == s)
        return;
    unlink_slot(c, s);
    push_front(c, s);
}

/* Backward-shift deletion: later entries of the probe run move into the hole. */
static void table_delete(struct mock_cache *c, uint32_t hole)
{
    uint32_t p = hole;
    for (;;) {
        p = (p + 1) & c->tmask;
        int32_t v = c->table[p];
        if (v == 0)
            break;
        uint32_t home = bucket(c, c->key[v - 1]);
        /* v may move into the hole if its home is not in (hole, p] cyclically */
        int movable = hole <= p ? (home <= hole || home > p) : (home <= hole && home > p);
        if (movable) {
            c->table[hole] = v;
            hole = p;
        }
    }
    c->table[hole] = 0;
}

int mock_cache_evict(struct mock_cache *c, uint64_t *key)
{
    int32_t s = c->tail;
    if (s < 0)
        return 0;
    int64_t p = find_pos(c, c->key[s]);
    if (p >= 0)
        table_delete(c, (uint32_t)p);
    unlink_slot(c, s);
    *key = c->key[s];
    c->next[s] = c->free_;
    c->free_ = s;
    c->size--;
    return 1;
}

void mock_cache_insert(struct mock_cache *c, uint64_t key)
{
    int32_t s = c->free_;
    if (s < 0 || mock_cache_contains(c, key))
        return;
    c->free_ = c->next[s];
    c->key[s] = key;
    push_front(c, s);
    uint32_t p = bucket(c, key);
    while (c->table[p] != 0)
        p = (p + 1) & c->tmask;
    c->table[p] = s + 1;
    c->size++;
}
