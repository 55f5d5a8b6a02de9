/* event.c - event names and the owning event list (see kvr/event.h). */
#include "kvr/event.h"

#include <stdlib.h>
#include <string.h>

#include "kvr/err.h"

/* Arena chunks hold the blocks/hashes arrays of the events in a list. */
struct kvr_arena_chunk {
    struct kvr_arena_chunk *next;
    size_t used;
    size_t cap;
    _Alignas(16) unsigned char data[];
};

#define ARENA_MIN_CHUNK (64u * 1024u)

static const char *const kind_names[] = {NULL, "stored", "removed", "cleared"};
static const char *const tier_names[] = {"device", "host_pinned", "disk", "external"};

const char *kvr_event_kind_name(int kind)
{
    return (kind >= KVR_EVENT_STORED && kind <= KVR_EVENT_CLEARED) ? kind_names[kind] : NULL;
}

const char *kvr_tier_name(int tier)
{
    return (tier >= 0 && tier < KVR_TIER_COUNT_) ? tier_names[tier] : NULL;
}

int kvr_tier_parse(const char *s, size_t len, int *out)
{
    for (int i = 0; i < KVR_TIER_COUNT_; i++) {
        if (strlen(tier_names[i]) == len && memcmp(tier_names[i], s, len) == 0) {
            *out = i;
            return 1;
        }
    }
    return 0;
}

void kvr_event_list_init(struct kvr_event_list *l)
{
    memset(l, 0, sizeof(*l));
}

static void arena_release(struct kvr_event_list *l)
{
    struct kvr_arena_chunk *c = l->arena;
    while (c != NULL) {
        struct kvr_arena_chunk *next = c->next;
        free(c);
        c = next;
    }
    l->arena = NULL;
}

void kvr_event_list_free(struct kvr_event_list *l)
{
    arena_release(l);
    free(l->ev);
    kvr_event_list_init(l);
}

void kvr_event_list_reset(struct kvr_event_list *l)
{
    arena_release(l);
    l->n = 0;
}

/* Returns 16-byte aligned arena memory for `size` bytes, or NULL. */
static void *arena_alloc(struct kvr_event_list *l, size_t size)
{
    size = (size + 15u) & ~(size_t)15u;
    struct kvr_arena_chunk *c = l->arena;
    if (c == NULL || c->cap - c->used < size) {
        size_t cap = size > ARENA_MIN_CHUNK ? size : ARENA_MIN_CHUNK;
        if (c != NULL && c->cap * 2 > cap && c->cap < (64u << 20))
            cap = c->cap * 2;
        struct kvr_arena_chunk *n = malloc(sizeof(*n) + cap);
        if (n == NULL)
            return NULL;
        n->next = c;
        n->used = 0;
        n->cap = cap;
        l->arena = n;
        c = n;
    }
    void *p = c->data + c->used;
    c->used += size;
    return p;
}

static int grow(struct kvr_event_list *l)
{
    if (l->n < l->cap)
        return KVR_OK;
    size_t cap = l->cap ? l->cap * 2 : 16;
    struct kvr_event *ev = realloc(l->ev, cap * sizeof(*ev));
    if (ev == NULL)
        return KVR_ENOMEM;
    l->ev = ev;
    l->cap = cap;
    return KVR_OK;
}

int kvr_event_list_emplace(struct kvr_event_list *l, int kind, uint32_t n, struct kvr_event **out)
{
    if (grow(l) != KVR_OK)
        return KVR_ENOMEM;
    struct kvr_event *ev = &l->ev[l->n];
    memset(ev, 0, sizeof(*ev));
    ev->kind = (uint8_t)kind;
    ev->n = n;
    if (n > 0 && kind == KVR_EVENT_STORED) {
        ev->blocks = arena_alloc(l, (size_t)n * sizeof(struct kvr_block));
        if (ev->blocks == NULL)
            return KVR_ENOMEM;
    } else if (n > 0 && kind == KVR_EVENT_REMOVED) {
        ev->hashes = arena_alloc(l, (size_t)n * sizeof(uint64_t));
        if (ev->hashes == NULL)
            return KVR_ENOMEM;
    }
    l->n++;
    *out = ev;
    return KVR_OK;
}

int kvr_event_list_push(struct kvr_event_list *l, const struct kvr_event *src)
{
    struct kvr_event *ev;
    uint32_t n = (src->kind == KVR_EVENT_STORED || src->kind == KVR_EVENT_REMOVED) ? src->n : 0;
    int rc = kvr_event_list_emplace(l, src->kind, n, &ev);
    if (rc != KVR_OK)
        return rc;
    struct kvr_block *blocks = ev->blocks;
    uint64_t *hashes = ev->hashes;
    *ev = *src;
    ev->n = n;
    ev->blocks = blocks;
    ev->hashes = hashes;
    if (blocks != NULL)
        memcpy(blocks, src->blocks, (size_t)n * sizeof(*blocks));
    if (hashes != NULL)
        memcpy(hashes, src->hashes, (size_t)n * sizeof(*hashes));
    return KVR_OK;
}

void kvr_event_list_pop(struct kvr_event_list *l)
{
    if (l->n > 0)
        l->n--;
}
