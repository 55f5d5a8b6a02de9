/* radix.c - the compressed radix tree: node arena, maps, store, remove, clear, match.
 *
 * See kvr/radix.h for the model and radix_int.h for the layout. Every mutating step first
 * reserves all the memory it needs ("reserve"), then commits without any possible failure
 * ("commit"), so an allocation failure leaves the tree exactly as before that step.
 */
#include "radix_int.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kvr/err.h"

#define GOLDEN 0x9E3779B97F4A7C15ull

/* ==== hashing =============================================================================== */

static inline uint64_t mix(uint64_t x, uint64_t seed)
{
    x ^= seed;
    x ^= x >> 32;
    x *= GOLDEN;
    return x;
}

static inline uint32_t log2_u32(uint32_t v)
{
    return 31u - (uint32_t)__builtin_clz(v);
}

/* ==== node arena ============================================================================
 *
 * FREE nodes are linked through `mark` (id + 1). A node freed while an incremental dump is in
 * progress goes to the limbo list instead: a dump keeps node pointers across lock releases and
 * checks `live` before using them, which is only sound if the struct is not reused meanwhile.
 * Limbo joins the free list once no dump is active. */

static inline struct rnode *link_next(const struct kvr_radix *t, const struct rnode *n)
{
    return n->mark ? rnode_get(t, n->mark - 1u) : NULL;
}

static inline void link_push(struct rnode **head, struct rnode *n)
{
    n->mark = *head ? (*head)->id + 1u : 0u;
    *head = n;
}

static struct rnode *node_alloc(struct kvr_radix *t)
{
    if (t->free_list == NULL && t->limbo != NULL &&
        atomic_load_explicit(&t->dumps_active, memory_order_acquire) == 0) {
        t->free_list = t->limbo;
        t->limbo = NULL;
    }
    struct rnode *n = t->free_list;
    uint32_t id;
    if (n != NULL) {
        t->free_list = link_next(t, n);
        id = n->id;
    } else {
        if (t->next_fresh == UINT32_MAX)
            return NULL;
        if (t->next_fresh >= t->nchunks * RNODE_CHUNK) {
            struct rnode **chunks =
                kvr_realloc(&t->alloc, t->chunks, (t->nchunks + 1u) * sizeof(*chunks));
            if (chunks == NULL)
                return NULL;
            t->chunks = chunks;
            struct rnode *c = kvr_malloc(&t->alloc, RNODE_CHUNK * sizeof(struct rnode));
            if (c == NULL)
                return NULL;
            t->chunks[t->nchunks++] = c;
        }
        id = t->next_fresh++;
        n = rnode_get(t, id);
    }
    memset(n, 0, sizeof(*n));
    n->id = id;
    n->live = RNODE_LIVE;
    return n;
}

/* Releases a node's storage; the struct goes to the free list (or limbo). len, parent and
 * split_next stay readable: entries resolved while a subtree is drained may pass through. */
static void node_release(struct kvr_radix *t, struct rnode *n)
{
    kvr_free(&t->alloc, n->loc);
    kvr_free(&t->alloc, n->fullx);
    kvr_free(&t->alloc, n->cut);
    kvr_free(&t->alloc, n->ovr);
    kvr_free(&t->alloc, n->kids);
    n->loc = NULL;
    n->fullx = NULL;
    n->cut = NULL;
    n->ovr = NULL;
    n->kids = NULL;
    n->full0 = 0;
    n->nfullx = 0;
    n->ncut = n->cut_cap = 0;
    n->novr = n->ovr_cap = 0;
    n->nkids = n->kids_cap = 0;
    n->live = RNODE_FREE;
    if (atomic_load_explicit(&t->dumps_active, memory_order_acquire) != 0)
        link_push(&t->limbo, n);
    else
        link_push(&t->free_list, n);
}

/* Returns a node obtained from node_alloc that was never linked (no accounting). */
static void node_unalloc(struct kvr_radix *t, struct rnode *n)
{
    n->len = 0;
    n->split_next = NULL;
    node_release(t, n);
}

/* Frees a linked (or detached) node's storage and accounting. */
static void node_free(struct kvr_radix *t, struct rnode *n)
{
    t->live_nodes--;
    t->live_blocks -= n->len;
    t->work++;
    node_release(t, n);
}

/* ==== per-rank external-hash tables =========================================================
 *
 * Robin Hood linear probing over 12-byte entries {fp, node, pos}: fp is the high half of a
 * seeded 64-bit mix of the external hash; an entry's home slot is fastrange(fp, cap), so tables
 * have any capacity (grown by 1.5x at 7/8 load) and rehash without the hash itself. A candidate
 * whose fp matches is confirmed by reading the rank's own hash of the position it names (the
 * full 64-bit hash lives in the tree, not in the table). Lookups stop early at the first resident
 * closer to its home than the probe; deletion shifts the following entries back. */

#define TAB_MIN_CAP 8u

static inline uint32_t tab_fp(const struct kvr_radix *t, uint64_t ext)
{
    uint64_t x = ext ^ t->seed;
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    x ^= x >> 33;
    return (uint32_t)(x >> 32);
}

static inline uint32_t tab_home(uint32_t fp, uint32_t cap)
{
    return (uint32_t)(((uint64_t)fp * cap) >> 32);
}

static inline uint32_t tab_dist(uint32_t i, uint32_t home, uint32_t cap)
{
    return i >= home ? i - home : i + cap - home;
}

static inline uint32_t tab_next(uint32_t i, uint32_t cap)
{
    return i + 1u == cap ? 0u : i + 1u;
}

/* Prefetches the home slot of ext in slot's table (a hint; no effect on results). */
static inline void tab_prefetch(const struct kvr_radix *t, uint32_t slot, uint64_t ext)
{
    const struct extab *tab = &t->ranks[slot].tab;
    if (tab->cap != 0)
        __builtin_prefetch(&tab->e[tab_home(tab_fp(t, ext), tab->cap)]);
}

struct tent *kvr_radix_tab_find(const struct kvr_radix *t, uint32_t slot, uint64_t ext)
{
    const struct extab *tab = &t->ranks[slot].tab;
    if (tab->count == 0)
        return NULL;
    uint32_t fp = tab_fp(t, ext), cap = tab->cap;
    uint32_t i = tab_home(fp, cap);
    for (uint32_t d = 0;; d++, i = tab_next(i, cap)) {
        struct tent *e = &tab->e[i];
        if (e->node == 0 || tab_dist(i, tab_home(e->fp, cap), cap) < d)
            return NULL;
        if (e->fp == fp) {
            uint32_t pos;
            const struct rnode *n = kvr_radix_resolve_ro(t, e, &pos);
            if (pos < n->len && kvr_radix_ext_of(n, slot, pos) == ext)
                return e;
        }
    }
}

/* Places an entry (room guaranteed). */
static void tab_insert_raw(struct extab *tab, struct tent x)
{
    uint32_t cap = tab->cap;
    uint32_t i = tab_home(x.fp, cap);
    for (uint32_t d = 0;; d++, i = tab_next(i, cap)) {
        struct tent *e = &tab->e[i];
        if (e->node == 0) {
            *e = x;
            return;
        }
        uint32_t rd = tab_dist(i, tab_home(e->fp, cap), cap);
        if (rd < d) {
            struct tent y = *e;
            *e = x;
            x = y;
            d = rd;
        }
    }
}

static int tab_rehash(struct kvr_radix *t, struct extab *tab, uint32_t cap)
{
    struct tent *e = kvr_calloc(&t->alloc, cap, sizeof(*e));
    if (e == NULL)
        return KVR_ENOMEM;
    struct extab n = {.e = e, .cap = cap, .count = tab->count};
    for (uint32_t i = 0; i < tab->cap; i++)
        if (tab->e[i].node != 0)
            tab_insert_raw(&n, tab->e[i]);
    kvr_free(&t->alloc, tab->e);
    *tab = n;
    return KVR_OK;
}

static inline size_t tab_limit(uint32_t cap)
{
    return (size_t)cap - cap / 8u;
}

/* Makes room for `extra` more entries at a load of at most 7/8. */
static int tab_reserve(struct kvr_radix *t, struct extab *tab, size_t extra)
{
    size_t need = (size_t)tab->count + extra;
    if (tab->cap != 0 && need <= tab_limit(tab->cap))
        return KVR_OK;
    if (need > (size_t)UINT32_MAX / 2u)
        return KVR_ENOMEM;
    size_t cap = tab->cap ? tab->cap : TAB_MIN_CAP;
    while (need > tab_limit((uint32_t)cap))
        cap += cap / 2u;
    return tab_rehash(t, tab, (uint32_t)cap);
}

/* Inserts ext -> (node, pos); the caller reserved room and ext is absent. */
static void tab_put(struct kvr_radix *t, struct extab *tab, uint64_t ext, uint32_t node,
                    uint32_t pos)
{
    struct tent e = {.fp = tab_fp(t, ext), .node = node, .pos = pos};
    tab_insert_raw(tab, e);
    tab->count++;
    t->block_ranks++;
}

/* Deletes an entry (backward shift keeps every probe sequence intact). Entry pointers into this
 * table are invalid afterwards. */
static void tab_del(struct kvr_radix *t, struct extab *tab, struct tent *e)
{
    uint32_t cap = tab->cap;
    uint32_t i = (uint32_t)(e - tab->e);
    for (;;) {
        uint32_t j = tab_next(i, cap);
        struct tent *n = &tab->e[j];
        if (n->node == 0 || tab_dist(j, tab_home(n->fp, cap), cap) == 0)
            break;
        tab->e[i] = *n;
        i = j;
    }
    tab->e[i].node = 0;
    tab->count--;
    t->block_ranks--;
}

/* Shrinks a sparse table (best effort: failure keeps the larger table). */
static void tab_maybe_shrink(struct kvr_radix *t, struct extab *tab)
{
    if (tab->cap <= 64u || (size_t)tab->count * 4u >= tab->cap)
        return;
    uint32_t cap = tab->cap / 2u;
    if (cap < TAB_MIN_CAP)
        cap = TAB_MIN_CAP;
    (void)tab_rehash(t, tab, cap);
}

static void tab_clear(struct kvr_radix *t, struct extab *tab)
{
    t->block_ranks -= tab->count;
    kvr_free(&t->alloc, tab->e);
    memset(tab, 0, sizeof(*tab));
}

/* ==== entry resolution ====================================================================== */

struct rnode *kvr_radix_resolve_ro(const struct kvr_radix *t, const struct tent *e, uint32_t *pos)
{
    struct rnode *n = rnode_get(t, e->node);
    uint32_t p = e->pos;
    while (p >= n->len && n->split_next != NULL) {
        p -= n->len;
        n = n->split_next;
    }
    *pos = p;
    return n;
}

/* Resolves and re-points the entry at the node that holds its position now. */
static struct rnode *resolve(const struct kvr_radix *t, struct tent *e, uint32_t *pos)
{
    struct rnode *n = kvr_radix_resolve_ro(t, e, pos);
    if (n->id != e->node) {
        e->node = n->id;
        e->pos = *pos;
    }
    return n;
}

/* ==== children ============================================================================== */

static inline uint32_t kids_home(const struct kvr_radix *t, uint32_t cap, uint64_t local)
{
    return (uint32_t)(mix(local, t->seed) >> (64u - log2_u32(cap)));
}

struct rnode *kvr_radix_kid_find(const struct kvr_radix *t, const struct rnode *n, uint64_t local)
{
    const struct kid *k = n->kids;
    if (n->kids_cap <= KIDS_LINEAR) {
        for (uint32_t i = 0; i < n->nkids; i++)
            if (k[i].local == local)
                return k[i].n;
        return NULL;
    }
    uint32_t mask = n->kids_cap - 1u;
    for (uint32_t i = kids_home(t, n->kids_cap, local);; i = (i + 1u) & mask) {
        if (k[i].n == NULL)
            return NULL;
        if (k[i].local == local)
            return k[i].n;
    }
}

void kvr_radix_kids_each(const struct rnode *n, void (*fn)(struct rnode *, void *), void *arg)
{
    if (n->kids_cap <= KIDS_LINEAR) {
        for (uint32_t i = 0; i < n->nkids; i++)
            fn(n->kids[i].n, arg);
        return;
    }
    for (uint32_t i = 0; i < n->kids_cap; i++)
        if (n->kids[i].n != NULL)
            fn(n->kids[i].n, arg);
}

static void list_push(struct rnode *c, void *arg)
{
    struct rnode ***out = arg;
    *(*out)++ = c;
}

void kvr_radix_kids_list(const struct rnode *n, struct rnode **out)
{
    kvr_radix_kids_each(n, list_push, &out);
}

static void kids_table_put(const struct kvr_radix *t, struct kid *k, uint32_t cap, uint64_t local,
                           struct rnode *c)
{
    uint32_t mask = cap - 1u;
    uint32_t i = kids_home(t, cap, local);
    while (k[i].n != NULL)
        i = (i + 1u) & mask;
    k[i].local = local;
    k[i].n = c;
}

/* Makes room for one more child. */
static int kids_reserve(struct kvr_radix *t, struct rnode *n)
{
    uint32_t need = n->nkids + 1u;
    if (n->kids_cap <= KIDS_LINEAR) {
        if (need <= n->kids_cap)
            return KVR_OK;
        if (need <= KIDS_LINEAR) {
            uint32_t cap = n->kids_cap ? n->kids_cap * 2u : 2u;
            struct kid *k = kvr_realloc(&t->alloc, n->kids, cap * sizeof(*k));
            if (k == NULL)
                return KVR_ENOMEM;
            n->kids = k;
            n->kids_cap = cap;
            return KVR_OK;
        }
    } else if (need <= n->kids_cap - n->kids_cap / 4u) {
        return KVR_OK;
    }
    uint32_t cap = n->kids_cap > KIDS_LINEAR ? n->kids_cap * 2u : 16u;
    struct kid *k = kvr_calloc(&t->alloc, cap, sizeof(*k));
    if (k == NULL)
        return KVR_ENOMEM;
    if (n->kids_cap <= KIDS_LINEAR) {
        for (uint32_t i = 0; i < n->nkids; i++)
            kids_table_put(t, k, cap, n->kids[i].local, n->kids[i].n);
    } else {
        for (uint32_t i = 0; i < n->kids_cap; i++)
            if (n->kids[i].n != NULL)
                kids_table_put(t, k, cap, n->kids[i].local, n->kids[i].n);
    }
    kvr_free(&t->alloc, n->kids);
    n->kids = k;
    n->kids_cap = cap;
    return KVR_OK;
}

/* Adds a child (room reserved). */
static void kids_put(struct kvr_radix *t, struct rnode *n, struct rnode *c)
{
    if (n->kids_cap <= KIDS_LINEAR) {
        n->kids[n->nkids].local = c->loc[0];
        n->kids[n->nkids].n = c;
    } else {
        kids_table_put(t, n->kids, n->kids_cap, c->loc[0], c);
    }
    n->nkids++;
}

static struct kid *kids_slot(const struct kvr_radix *t, struct rnode *n, uint64_t local)
{
    if (n->kids_cap <= KIDS_LINEAR) {
        for (uint32_t i = 0; i < n->nkids; i++)
            if (n->kids[i].local == local)
                return &n->kids[i];
        return NULL;
    }
    uint32_t mask = n->kids_cap - 1u;
    for (uint32_t i = kids_home(t, n->kids_cap, local);; i = (i + 1u) & mask) {
        if (n->kids[i].n == NULL)
            return NULL;
        if (n->kids[i].local == local)
            return &n->kids[i];
    }
}

static void kids_del(struct kvr_radix *t, struct rnode *n, uint64_t local)
{
    struct kid *s = kids_slot(t, n, local);
    if (s == NULL)
        return;
    n->nkids--;
    if (n->kids_cap <= KIDS_LINEAR) {
        *s = n->kids[n->nkids];
        return;
    }
    uint32_t mask = n->kids_cap - 1u;
    uint32_t i = (uint32_t)(s - n->kids);
    uint32_t j = i;
    for (;;) {
        j = (j + 1u) & mask;
        if (n->kids[j].n == NULL)
            break;
        uint32_t home = kids_home(t, n->kids_cap, n->kids[j].local);
        int stays = (i <= j) ? (home > i && home <= j) : (home > i || home <= j);
        if (!stays) {
            n->kids[i] = n->kids[j];
            i = j;
        }
    }
    n->kids[i].n = NULL;
}

/* ==== rank sets: full bits, cutoffs, overrides ============================================== */

static int full_reserve(struct kvr_radix *t, struct rnode *n, uint32_t slot)
{
    uint32_t w = slot / 64u;
    if (w <= n->nfullx)
        return KVR_OK;
    if (w > UINT16_MAX)
        return KVR_ENOMEM;
    uint64_t *x = kvr_realloc(&t->alloc, n->fullx, w * sizeof(uint64_t));
    if (x == NULL)
        return KVR_ENOMEM;
    memset(x + n->nfullx, 0, (w - n->nfullx) * sizeof(uint64_t));
    n->fullx = x;
    n->nfullx = (uint16_t)w;
    return KVR_OK;
}

static void full_set(struct rnode *n, uint32_t slot)
{
    if (slot < 64)
        n->full0 |= 1ull << slot;
    else
        n->fullx[slot / 64u - 1u] |= 1ull << (slot % 64u);
}

static void full_clear(struct rnode *n, uint32_t slot)
{
    if (slot < 64)
        n->full0 &= ~(1ull << slot);
    else if (slot / 64u <= n->nfullx)
        n->fullx[slot / 64u - 1u] &= ~(1ull << (slot % 64u));
}

static int cut_reserve(struct kvr_radix *t, struct rnode *n, uint32_t extra)
{
    if (n->ncut + extra <= n->cut_cap)
        return KVR_OK;
    uint32_t cap = n->cut_cap ? n->cut_cap : 1u;
    while (cap < n->ncut + extra)
        cap *= 2u;
    struct cut *c = kvr_realloc(&t->alloc, n->cut, cap * sizeof(*c));
    if (c == NULL)
        return KVR_ENOMEM;
    n->cut = c;
    n->cut_cap = cap;
    return KVR_OK;
}

/* Sets the cutoff of slot to k (room reserved when the slot has none yet). */
static void cut_put(struct rnode *n, uint32_t slot, uint32_t k)
{
    for (uint32_t i = 0; i < n->ncut; i++) {
        if (n->cut[i].slot == slot) {
            n->cut[i].k = k;
            return;
        }
    }
    n->cut[n->ncut].slot = slot;
    n->cut[n->ncut].k = k;
    n->ncut++;
}

static void cut_del(struct rnode *n, uint32_t slot)
{
    for (uint32_t i = 0; i < n->ncut; i++) {
        if (n->cut[i].slot == slot) {
            n->cut[i] = n->cut[--n->ncut];
            return;
        }
    }
}

static int ovr_cmp_key(const struct ovr *o, uint32_t pos, uint32_t slot)
{
    if (o->pos != pos)
        return o->pos < pos ? -1 : 1;
    if (o->slot != slot)
        return o->slot < slot ? -1 : 1;
    return 0;
}

/* Index of the first override >= (pos, slot). */
static uint32_t ovr_lower(const struct rnode *n, uint32_t pos, uint32_t slot)
{
    uint32_t lo = 0, hi = n->novr;
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2u;
        if (ovr_cmp_key(&n->ovr[mid], pos, slot) < 0)
            lo = mid + 1u;
        else
            hi = mid;
    }
    return lo;
}

uint64_t kvr_radix_ext_of(const struct rnode *n, uint32_t slot, uint32_t pos)
{
    if (n->novr != 0) {
        uint32_t i = ovr_lower(n, pos, slot);
        if (i < n->novr && n->ovr[i].pos == pos && n->ovr[i].slot == slot)
            return n->ovr[i].ext;
    }
    return rnode_ext(n)[pos];
}

static int ovr_reserve(struct kvr_radix *t, struct rnode *n, uint32_t extra)
{
    if (n->novr + extra <= n->ovr_cap)
        return KVR_OK;
    uint32_t cap = n->ovr_cap ? n->ovr_cap : 2u;
    while (cap < n->novr + extra)
        cap *= 2u;
    struct ovr *o = kvr_realloc(&t->alloc, n->ovr, cap * sizeof(*o));
    if (o == NULL)
        return KVR_ENOMEM;
    n->ovr = o;
    n->ovr_cap = cap;
    return KVR_OK;
}

/* Records (pos, slot) -> ext, replacing any previous one (room reserved). */
static void ovr_set(struct rnode *n, uint32_t pos, uint32_t slot, uint64_t ext)
{
    uint32_t i = ovr_lower(n, pos, slot);
    if (i < n->novr && n->ovr[i].pos == pos && n->ovr[i].slot == slot) {
        n->ovr[i].ext = ext;
        return;
    }
    memmove(&n->ovr[i + 1u], &n->ovr[i], (n->novr - i) * sizeof(*n->ovr));
    n->ovr[i].pos = pos;
    n->ovr[i].slot = slot;
    n->ovr[i].ext = ext;
    n->novr++;
}

/* Drops the overrides of slot at positions [from, to). */
static void ovr_del_range(struct rnode *n, uint32_t slot, uint32_t from, uint32_t to)
{
    if (n->novr == 0)
        return;
    uint32_t w = ovr_lower(n, from, 0);
    for (uint32_t r = w; r < n->novr; r++) {
        const struct ovr *o = &n->ovr[r];
        if (o->pos < to && o->slot == slot)
            continue;
        n->ovr[w++] = *o;
    }
    n->novr = w;
}

/* ==== rank registry ========================================================================= */

static inline uint32_t rmap_home(const struct kvr_radix *t, uint64_t worker, uint32_t dp)
{
    return (uint32_t)(mix(worker * 0x100000001B3ull + dp, t->seed) >>
                      (64u - log2_u32(t->rmap_cap)));
}

static int rank_find(const struct kvr_radix *t, uint64_t worker, uint32_t dp, uint32_t *slot)
{
    if (t->rmap_cap == 0)
        return 0;
    uint32_t mask = t->rmap_cap - 1u;
    for (uint32_t i = rmap_home(t, worker, dp);; i = (i + 1u) & mask) {
        uint32_t v = t->rmap[i];
        if (v == 0)
            return 0;
        const struct rank *r = &t->ranks[v - 1u];
        if (r->worker_id == worker && r->dp_rank == dp) {
            *slot = v - 1u;
            return 1;
        }
    }
}

static void rmap_insert(struct kvr_radix *t, uint32_t slot)
{
    uint32_t mask = t->rmap_cap - 1u;
    const struct rank *r = &t->ranks[slot];
    uint32_t i = rmap_home(t, r->worker_id, r->dp_rank);
    while (t->rmap[i] != 0)
        i = (i + 1u) & mask;
    t->rmap[i] = slot + 1u;
}

static int rmap_reserve(struct kvr_radix *t)
{
    uint32_t need = t->nranks + 1u;
    if (t->rmap_cap != 0 && need <= t->rmap_cap / 2u)
        return KVR_OK;
    uint32_t cap = t->rmap_cap ? t->rmap_cap * 2u : 16u;
    uint32_t *m = kvr_calloc(&t->alloc, cap, sizeof(*m));
    if (m == NULL)
        return KVR_ENOMEM;
    kvr_free(&t->alloc, t->rmap);
    t->rmap = m;
    t->rmap_cap = cap;
    for (uint32_t s = 0; s < t->nslots; s++)
        if (t->ranks[s].in_use)
            rmap_insert(t, s);
    return KVR_OK;
}

static void rmap_delete(struct kvr_radix *t, uint32_t slot)
{
    uint32_t mask = t->rmap_cap - 1u;
    const struct rank *r = &t->ranks[slot];
    uint32_t i = rmap_home(t, r->worker_id, r->dp_rank);
    while (t->rmap[i] != slot + 1u)
        i = (i + 1u) & mask;
    uint32_t j = i;
    for (;;) {
        j = (j + 1u) & mask;
        if (t->rmap[j] == 0)
            break;
        const struct rank *o = &t->ranks[t->rmap[j] - 1u];
        uint32_t home = rmap_home(t, o->worker_id, o->dp_rank);
        int stays = (i <= j) ? (home > i && home <= j) : (home > i || home <= j);
        if (!stays) {
            t->rmap[i] = t->rmap[j];
            i = j;
        }
    }
    t->rmap[i] = 0;
}

/* Finds or registers a rank; a new rank takes the lowest free slot. */
static int rank_get(struct kvr_radix *t, uint64_t worker, uint32_t dp, uint32_t *slot)
{
    if (rank_find(t, worker, dp, slot))
        return KVR_OK;
    if (rmap_reserve(t) != KVR_OK)
        return KVR_ENOMEM;
    uint32_t s = 0;
    while (s < t->nslots && t->ranks[s].in_use)
        s++;
    if (s == t->nslots) {
        if (t->nslots == t->slots_cap) {
            uint32_t cap = t->slots_cap ? t->slots_cap * 2u : 16u;
            struct rank *r = kvr_realloc(&t->alloc, t->ranks, cap * sizeof(*r));
            if (r == NULL)
                return KVR_ENOMEM;
            t->ranks = r;
            t->slots_cap = cap;
        }
        t->nslots++;
    }
    struct rank *r = &t->ranks[s];
    memset(r, 0, sizeof(*r));
    r->worker_id = worker;
    r->dp_rank = dp;
    r->in_use = 1;
    t->nranks++;
    rmap_insert(t, s);
    *slot = s;
    return KVR_OK;
}

static void rank_release(struct kvr_radix *t, uint32_t slot)
{
    struct rank *r = &t->ranks[slot];
    rmap_delete(t, slot);
    tab_clear(t, &r->tab);
    r->in_use = 0;
    t->nranks--;
    while (t->nslots > 0 && !t->ranks[t->nslots - 1u].in_use)
        t->nslots--;
}

/* ==== unlinking and deferred frees ==========================================================
 *
 * A node left without a full rank unlinks its whole subtree (index.md §5.6 step 5). Unlinking
 * only pushes the node's children on the drain stack (marked DETACHED, O(children), no memory)
 * and frees its children array; the node keeps its split_next until the drain frees that child,
 * so table entries naming the node past its end still resolve. From then on no reader can reach
 * the subtree. Its table entries are deleted and its memory freed later, a bounded number of
 * work units per kvr_radix_step (drain_step), in post-order:
 *
 *   top of the stack x: while x has children, push one (DETACHED) and work on it first;
 *   then delete each rank's entries on x, position by position (cursor drain.pos); then free x.
 *
 * Split chains must stay intact while entries may resolve through them: an entry naming a node
 * past its end follows split_next into the node's split child, and so on down. So a node is
 * freed only when it has no children, no ranks and no split child left (split_next NULL); freeing
 * a node clears its parent's split_next if it pointed at it, and frees that parent too if it was
 * only WAITING for this. Structs of freed nodes keep len, parent and split_next, and none is
 * reused before the drain ends (nothing allocates nodes in between).
 *
 * The drain runs only after the job that unlinked (a removal, a rank drop) has finished, and
 * every entry point that looks anything up first finishes both, so lookups never meet a
 * half-drained node. A job may still resolve entries into a subtree it unlinked itself and not
 * yet drained: cutting coverage there is harmless (the nodes are doomed; settle leaves DETACHED
 * nodes alone, and a LIVE node freed inside the subtree is removed from its parent's children
 * like anywhere else). */

/* Deletes every table entry for positions [from, to) that `slot` covers on n (one work unit per
 * position); records the hashes of positions other than `keep` in ds (may be NULL). `known`
 * (may be NULL) is slot's entry of position `from`, already looked up by the caller: it is
 * deleted without a second probe (before any other deletion moves entries). */
static inline __attribute__((always_inline)) void
entries_drop_known(struct kvr_radix *t, struct rnode *n, uint32_t slot, uint32_t from, uint32_t to,
                   uint32_t keep, struct dropset *ds, struct tent *known)
{
    struct extab *tab = &t->ranks[slot].tab;
    if (to <= from)
        return;
    t->work += to - from;
    uint32_t pos = from;
    if (known != NULL) {
        if (ds != NULL && pos != keep && ds->n < 64)
            ds->h[ds->n++] = kvr_radix_ext_of(n, slot, pos);
        tab_del(t, tab, known);
        pos++;
    }
    for (; pos < to; pos++) {
        uint64_t ext = kvr_radix_ext_of(n, slot, pos);
        struct tent *e = kvr_radix_tab_find(t, slot, ext);
        if (e == NULL)
            continue;
        uint32_t p;
        if (kvr_radix_resolve_ro(t, e, &p) == n && p == pos) {
            tab_del(t, tab, e);
            if (ds != NULL && pos != keep && ds->n < 64)
                ds->h[ds->n++] = ext;
        }
    }
}

static void entries_drop(struct kvr_radix *t, struct rnode *n, uint32_t slot, uint32_t from,
                         uint32_t to, uint32_t keep, struct dropset *ds)
{
    entries_drop_known(t, n, slot, from, to, keep, ds, NULL);
}

static int drain_idle(const struct kvr_radix *t)
{
    return t->drain.top == NULL;
}

static void drain_push(struct kvr_radix *t, struct rnode *c)
{
    c->live = RNODE_DETACHED;
    link_push(&t->drain.top, c);
    t->work++;
}

static void drain_push_kid(struct rnode *c, void *t)
{
    drain_push(t, c);
}

/* Moves n's children to the drain (n stays, childless). Never fails. */
static void detach_children(struct kvr_radix *t, struct rnode *n)
{
    if (n->nkids == 0)
        return;
    kvr_radix_kids_each(n, drain_push_kid, t);
    kvr_free(&t->alloc, n->kids);
    n->kids = NULL;
    n->nkids = 0;
    n->kids_cap = 0;
}

/* Frees n (no children, no ranks, no split child), then each ancestor that only waited for it. */
static void free_node_chain(struct kvr_radix *t, struct rnode *n)
{
    for (;;) {
        struct rnode *p = n->parent;
        node_free(t, n);
        if (p == NULL || p->split_next != n)
            return;
        p->split_next = NULL;
        if (p->live != RNODE_WAITING)
            return;
        n = p;
    }
}

/* Takes one child off a DETACHED node (its children array is compacted on first use). */
static struct rnode *drain_take_child(struct kvr_radix *t, struct rnode *x)
{
    if (x->kids_cap > KIDS_LINEAR) {
        uint32_t k = 0;
        for (uint32_t i = 0; i < x->kids_cap; i++)
            if (x->kids[i].n != NULL)
                x->kids[k++] = x->kids[i];
        t->work += x->kids_cap / 8u;
        x->kids_cap = KIDS_LINEAR; /* array mode from now on (only the drain reads it) */
    }
    return x->kids[--x->nkids].n;
}

/* Advances the drain until t->work reaches `end`. Returns 1 while work remains. */
static int drain_step(struct kvr_radix *t, uint64_t end)
{
    struct drain *d = &t->drain;
    while (t->work < end) {
        struct rnode *x = d->top;
        if (x == NULL)
            return 0;
        if (x->nkids > 0) {
            drain_push(t, drain_take_child(t, x));
            continue;
        }
        /* The next rank still on x: a full one, else the last cutoff. */
        uint32_t slot = UINT32_MAX, to = 0;
        int full = 0;
        for (uint32_t w = 0; w <= x->nfullx; w++) {
            uint64_t bits = full_word(x, w);
            if (bits) {
                slot = w * 64u + (uint32_t)__builtin_ctzll(bits);
                to = x->len;
                full = 1;
                break;
            }
        }
        if (!full && x->ncut > 0) {
            slot = x->cut[x->ncut - 1u].slot;
            to = x->cut[x->ncut - 1u].k;
        }
        if (slot != UINT32_MAX) {
            uint32_t stop = to;
            if ((uint64_t)(stop - d->pos) > end - t->work)
                stop = d->pos + (uint32_t)(end - t->work);
            entries_drop(t, x, slot, d->pos, stop, UINT32_MAX, NULL);
            d->pos = stop;
            if (d->pos == to) {
                if (full)
                    full_clear(x, slot);
                else
                    x->ncut--;
                d->pos = 0;
            }
            continue;
        }
        /* Nothing left on x: free it, unless its split child is still pending. */
        d->top = link_next(t, x);
        if (x->split_next != NULL)
            x->live = RNODE_WAITING;
        else
            free_node_chain(t, x);
    }
    return !drain_idle(t);
}

/* Restores the structural invariants of n after ranks left it: a node without a full rank loses
 * its subtree (to the drain); one with no rank at all leaves the tree (freed now if it is a plain
 * leaf, else by the drain after its subtree). */
static void settle(struct kvr_radix *t, struct rnode *n)
{
    if (n->live != RNODE_LIVE || n == t->root || full_any(n))
        return;
    if (n->ncut == 0) {
        kids_del(t, n->parent, n->loc[0]);
        if (n->nkids == 0 && n->split_next == NULL) {
            free_node_chain(t, n);
            return;
        }
        drain_push(t, n); /* below its children: freed after them */
    }
    detach_children(t, n);
}

/* ==== coverage writes ======================================================================= */

/* Reserves what entries_write needs for `cnt` blocks at [from, from+cnt). */
static int entries_reserve(struct kvr_radix *t, struct rnode *n, uint32_t slot, uint32_t from,
                           const struct kvr_block *b, uint32_t cnt)
{
    if (tab_reserve(t, &t->ranks[slot].tab, cnt) != KVR_OK)
        return KVR_ENOMEM;
    const uint64_t *ext = rnode_ext(n);
    uint32_t need = 0;
    for (uint32_t j = 0; j < cnt; j++)
        need += b[j].block_hash != ext[from + j];
    return need ? ovr_reserve(t, n, need) : KVR_OK;
}

/* Records the rank's own external hashes for positions [from, from+cnt) (room reserved; the
 * caller then sets the coverage bits). Positions already covered with the same hash are kept;
 * with another hash, the old entry is replaced. */
static void entries_write(struct kvr_radix *t, struct rnode *n, uint32_t slot, uint32_t from,
                          const struct kvr_block *b, uint32_t cnt)
{
    struct extab *tab = &t->ranks[slot].tab;
    uint32_t covered = cover_of(n, slot);
    const uint64_t *edge_ext = rnode_ext(n);
    for (uint32_t j = 0; j < cnt; j++) {
        uint32_t pos = from + j;
        uint64_t ext = b[j].block_hash;
        if (pos < covered) {
            uint64_t old = kvr_radix_ext_of(n, slot, pos);
            if (old == ext)
                continue;
            struct tent *oe = kvr_radix_tab_find(t, slot, old);
            if (oe != NULL)
                tab_del(t, tab, oe);
        }
        if (kvr_radix_tab_find(t, slot, ext) == NULL)
            tab_put(t, tab, ext, n->id, pos);
        if (ext != edge_ext[pos])
            ovr_set(n, pos, slot, ext);
        else if (pos < covered)
            ovr_del_range(n, slot, pos, pos + 1u);
    }
}

/* Covers [from, from+cnt) for slot and raises its coverage to `target` (n->len = full).
 * Returns KVR_OK or KVR_ENOMEM (nothing changed). */
static int cover_step(struct kvr_radix *t, struct rnode *n, uint32_t slot, uint32_t from,
                      const struct kvr_block *b, uint32_t cnt, uint32_t target)
{
    int full = full_has(n, slot);
    if (entries_reserve(t, n, slot, from, b, cnt) != KVR_OK)
        return KVR_ENOMEM;
    if (target >= n->len && !full && full_reserve(t, n, slot) != KVR_OK)
        return KVR_ENOMEM;
    if (target < n->len && !full && cut_get(n, slot) == 0 && cut_reserve(t, n, 1) != KVR_OK)
        return KVR_ENOMEM;
    entries_write(t, n, slot, from, b, cnt);
    if (full)
        return KVR_OK;
    if (target >= n->len) {
        cut_del(n, slot);
        full_set(n, slot);
    } else if (target > cut_get(n, slot)) {
        cut_put(n, slot, target);
    }
    return KVR_OK;
}

/* ==== structural operations ================================================================= */

static uint64_t *edge_alloc(struct kvr_radix *t, uint32_t cap)
{
    return kvr_malloc(&t->alloc, (size_t)cap * 2u * sizeof(uint64_t));
}

/* Creates a child of p holding blocks b[0..cnt) with slot full. */
static int new_child(struct kvr_radix *t, struct rnode *p, uint32_t slot, const struct kvr_block *b,
                     uint32_t cnt)
{
    if (kids_reserve(t, p) != KVR_OK || tab_reserve(t, &t->ranks[slot].tab, cnt) != KVR_OK)
        return KVR_ENOMEM;
    struct rnode *c = node_alloc(t);
    if (c == NULL)
        return KVR_ENOMEM;
    c->loc = edge_alloc(t, cnt);
    if (c->loc == NULL || full_reserve(t, c, slot) != KVR_OK) {
        node_unalloc(t, c);
        return KVR_ENOMEM;
    }
    c->len = cnt;
    c->cap = cnt;
    uint64_t *ext = rnode_ext(c);
    for (uint32_t j = 0; j < cnt; j++) {
        c->loc[j] = b[j].tokens_hash;
        ext[j] = b[j].block_hash;
    }
    c->depth = p->depth + p->len;
    c->parent = p;
    full_set(c, slot);
    kids_put(t, p, c);
    p->internal = 1;
    t->live_nodes++;
    t->live_blocks += cnt;
    struct extab *tab = &t->ranks[slot].tab;
    for (uint32_t j = 0; j < cnt; j++)
        tab_put(t, tab, b[j].block_hash, c->id, j);
    return KVR_OK;
}

/* Appends blocks to leaf p (slot full on p): other full ranks are downgraded to a cutoff. */
static int leaf_append(struct kvr_radix *t, struct rnode *p, uint32_t slot,
                       const struct kvr_block *b, uint32_t cnt)
{
    uint32_t others = 0;
    for (uint32_t w = 0; w <= p->nfullx; w++)
        others += (uint32_t)__builtin_popcountll(full_word(p, w));
    others -= 1u;
    if (tab_reserve(t, &t->ranks[slot].tab, cnt) != KVR_OK || cut_reserve(t, p, others) != KVR_OK)
        return KVR_ENOMEM;
    uint32_t len = p->len;
    if ((uint64_t)len + cnt > UINT32_MAX / 4u)
        return KVR_ENOMEM;
    if (len + cnt > p->cap) {
        uint32_t cap = p->cap + p->cap / 4u;
        if (cap < len + cnt)
            cap = len + cnt;
        uint64_t *loc = kvr_realloc(&t->alloc, p->loc, (size_t)cap * 2u * sizeof(uint64_t));
        if (loc == NULL)
            return KVR_ENOMEM;
        memmove(loc + cap, loc + p->cap, (size_t)len * sizeof(uint64_t));
        p->loc = loc;
        p->cap = cap;
    }
    for (uint32_t w = 0; w <= p->nfullx; w++) {
        uint64_t bits = full_word(p, w);
        while (bits) {
            uint32_t s = w * 64u + (uint32_t)__builtin_ctzll(bits);
            bits &= bits - 1u;
            if (s == slot)
                continue;
            full_clear(p, s);
            cut_put(p, s, len);
        }
    }
    uint64_t *ext = rnode_ext(p);
    for (uint32_t j = 0; j < cnt; j++) {
        p->loc[len + j] = b[j].tokens_hash;
        ext[len + j] = b[j].block_hash;
    }
    p->len = len + cnt;
    t->live_blocks += cnt;
    struct extab *tab = &t->ranks[slot].tab;
    for (uint32_t j = 0; j < cnt; j++)
        tab_put(t, tab, b[j].block_hash, p->id, len + j);
    return KVR_OK;
}

/* Splits n at q (0 < q < len): n keeps edge[0..q); a new suffix node takes edge[q..] and all of
 * n's children and becomes n's only child. Returns KVR_OK or KVR_ENOMEM (no change). */
static int split(struct kvr_radix *t, struct rnode *n, uint32_t q, struct rnode **suffix)
{
    uint32_t slen = n->len - q;
    uint32_t scuts = 0, sovr = 0;
    for (uint32_t i = 0; i < n->ncut; i++) {
        if (n->cut[i].k > q)
            scuts++;
        if (n->cut[i].k >= q && full_reserve(t, n, n->cut[i].slot) != KVR_OK)
            return KVR_ENOMEM;
    }
    for (uint32_t i = 0; i < n->novr; i++)
        sovr += n->ovr[i].pos >= q;
    struct rnode *s = node_alloc(t);
    if (s == NULL)
        return KVR_ENOMEM;
    struct kid *nk = kvr_malloc(&t->alloc, 2u * sizeof(*nk));
    s->loc = edge_alloc(t, slen);
    s->fullx = n->nfullx ? kvr_malloc(&t->alloc, n->nfullx * sizeof(uint64_t)) : NULL;
    s->cut = scuts ? kvr_malloc(&t->alloc, scuts * sizeof(struct cut)) : NULL;
    s->ovr = sovr ? kvr_malloc(&t->alloc, sovr * sizeof(struct ovr)) : NULL;
    if (nk == NULL || s->loc == NULL || (n->nfullx && s->fullx == NULL) ||
        (scuts && s->cut == NULL) || (sovr && s->ovr == NULL)) {
        kvr_free(&t->alloc, nk);
        node_unalloc(t, s);
        return KVR_ENOMEM;
    }
    /* Edge. */
    s->len = slen;
    s->cap = slen;
    memcpy(s->loc, n->loc + q, slen * sizeof(uint64_t));
    memcpy(rnode_ext(s), rnode_ext(n) + q, slen * sizeof(uint64_t));
    s->depth = n->depth + q;
    s->parent = n;
    s->split_next = n->split_next;
    /* Children move to the suffix. */
    s->kids = n->kids;
    s->nkids = n->nkids;
    s->kids_cap = n->kids_cap;
    if (s->kids_cap <= KIDS_LINEAR) {
        for (uint32_t i = 0; i < s->nkids; i++)
            s->kids[i].n->parent = s;
    } else {
        for (uint32_t i = 0; i < s->kids_cap; i++)
            if (s->kids[i].n != NULL)
                s->kids[i].n->parent = s;
    }
    s->internal = s->nkids > 0;
    /* Ranks. */
    s->full0 = n->full0;
    s->nfullx = n->nfullx;
    if (n->nfullx)
        memcpy(s->fullx, n->fullx, n->nfullx * sizeof(uint64_t));
    s->cut_cap = scuts;
    uint32_t keep = 0;
    for (uint32_t i = 0; i < n->ncut; i++) {
        struct cut c = n->cut[i];
        if (c.k > q)
            s->cut[s->ncut++] = (struct cut){.slot = c.slot, .k = c.k - q};
        if (c.k >= q)
            full_set(n, c.slot);
        else
            n->cut[keep++] = c;
    }
    n->ncut = keep;
    s->ovr_cap = sovr;
    keep = 0;
    for (uint32_t i = 0; i < n->novr; i++) {
        struct ovr o = n->ovr[i];
        if (o.pos >= q) {
            o.pos -= q;
            s->ovr[s->novr++] = o;
        } else {
            n->ovr[keep++] = o;
        }
    }
    n->novr = keep;
    /* The prefix. */
    memmove(n->loc + q, rnode_ext(n), q * sizeof(uint64_t));
    n->cap = q;
    uint64_t *shrunk = kvr_realloc(&t->alloc, n->loc, (size_t)q * 2u * sizeof(uint64_t));
    if (shrunk != NULL)
        n->loc = shrunk;
    n->len = q;
    n->kids = nk;
    n->kids_cap = 2;
    n->nkids = 0;
    kids_put(t, n, s);
    n->split_next = s;
    n->internal = 1;
    t->live_nodes++;
    *suffix = s;
    return KVR_OK;
}

/* ==== store ================================================================================= */

static void finish_pending(struct kvr_radix *t);

/* The chain's position walk (read-only): returns the index of the first block whose external
 * hash the rank already uses at another position (or that repeats within the chain, or equals
 * the parent); n if none. */
static size_t first_conflict(const struct kvr_radix *t, uint32_t slot, struct rnode *at,
                             uint32_t at_pos, const uint64_t *parent, const struct kvr_block *b,
                             size_t n)
{
    int diverged = 0;
    enum { AHEAD = 8 };
    for (size_t i = 0; i < n && i < AHEAD; i++)
        tab_prefetch(t, slot, b[i].block_hash);
    for (size_t i = 0; i < n; i++) {
        if (i + AHEAD < n)
            tab_prefetch(t, slot, b[i + AHEAD].block_hash);
        if (!diverged) {
            if (at == t->root || at_pos + 1u == at->len) {
                struct rnode *c = kvr_radix_kid_find(t, at, b[i].tokens_hash);
                if (c != NULL) {
                    at = c;
                    at_pos = 0;
                } else {
                    diverged = 1;
                }
            } else if (at->loc[at_pos + 1u] == b[i].tokens_hash) {
                at_pos++;
            } else {
                diverged = 1;
            }
        }
        const struct tent *e = kvr_radix_tab_find(t, slot, b[i].block_hash);
        if (e != NULL) {
            uint32_t p;
            struct rnode *where = kvr_radix_resolve_ro(t, e, &p);
            if (diverged || where != at || p != at_pos)
                return i;
        }
        if (parent != NULL && b[i].block_hash == *parent)
            return i;
        if (n <= 64) {
            for (size_t j = 0; j < i; j++)
                if (b[j].block_hash == b[i].block_hash)
                    return i;
        }
    }
    return n;
}

/* The index of the first block whose external hash repeats an earlier one of the chain (n if
 * none), for chains longer than first_conflict's quadratic check covers. One pass over an
 * open-addressed set: on the stack up to 1024 blocks, above that from the tree's allocator
 * (freed before returning). Returns KVR_OK or KVR_ENOMEM (nothing changed). */
static int first_repeat(struct kvr_radix *t, const struct kvr_block *b, size_t n, size_t *first)
{
    enum { STACK_SET = 2048 };
    uint64_t stack_set[STACK_SET];
    *first = n;
    if (n <= 64)
        return KVR_OK;
    size_t cap = 2;
    while (cap < 2 * n)
        cap *= 2;
    uint64_t *set = cap <= STACK_SET ? stack_set : kvr_malloc(&t->alloc, cap * sizeof(uint64_t));
    if (set == NULL)
        return KVR_ENOMEM;
    /* 0 marks an empty slot; the value 0 itself is tracked apart. */
    memset(set, 0, cap * sizeof(uint64_t));
    int seen_zero = 0;
    uint32_t shift = 64u - log2_u32((uint32_t)cap);
    for (size_t i = 0; i < n; i++) {
        uint64_t e = b[i].block_hash;
        if (e == 0) {
            if (seen_zero) {
                *first = i;
                break;
            }
            seen_zero = 1;
            continue;
        }
        size_t j = (size_t)(mix(e, t->seed) >> shift);
        while (set[j] != 0 && set[j] != e)
            j = (j + 1) & (cap - 1);
        if (set[j] == e) {
            *first = i;
            break;
        }
        set[j] = e;
    }
    if (set != stack_set)
        kvr_free(&t->alloc, set);
    return KVR_OK;
}

/* Child insertion from p (index.md §5.3). prev_ext: the event's external hash of the block just
 * before b[0] (valid iff has_prev). */
static int insert_children(struct kvr_radix *t, uint32_t slot, struct rnode *p,
                           const struct kvr_block *b, uint32_t n, int has_prev, uint64_t prev_ext)
{
    uint32_t i = 0;
    while (i < n) {
        struct rnode *c = kvr_radix_kid_find(t, p, b[i].tokens_hash);
        uint32_t rest = n - i;
        if (c == NULL) {
            if (p != t->root && !p->internal && has_prev && rnode_ext(p)[p->len - 1u] == prev_ext &&
                full_has(p, slot))
                return leaf_append(t, p, slot, b + i, rest);
            return new_child(t, p, slot, b + i, rest);
        }
        uint32_t lim = c->len < rest ? c->len : rest;
        uint32_t m = 1;
        while (m < lim && c->loc[m] == b[i + m].tokens_hash)
            m++;
        if (m < c->len && m == rest)
            return cover_step(t, c, slot, 0, b + i, m, m);
        if (m < c->len) {
            struct rnode *s;
            if (split(t, c, m, &s) != KVR_OK)
                return KVR_ENOMEM;
            int rc = cover_step(t, c, slot, 0, b + i, m, c->len);
            if (rc == KVR_OK)
                rc = new_child(t, c, slot, b + i + m, rest - m);
            settle(t, s);
            return rc;
        }
        if (cover_step(t, c, slot, 0, b + i, m, c->len) != KVR_OK)
            return KVR_ENOMEM;
        prev_ext = b[i + m - 1u].block_hash;
        has_prev = 1;
        i += m;
        p = c;
    }
    return KVR_OK;
}

int kvr_radix_store(kvr_radix_t *t, uint64_t worker_id, uint32_t dp_rank, const uint64_t *parent,
                    const struct kvr_block *blocks, size_t n)
{
    if (t == NULL || blocks == NULL || n == 0 || n > UINT32_MAX / 4u)
        return KVR_EINVAL;
    finish_pending(t);
    t->work += n;
    uint32_t slot;
    if (parent != NULL) {
        if (!rank_find(t, worker_id, dp_rank, &slot))
            return KVR_EPARENT;
    } else if (rank_get(t, worker_id, dp_rank, &slot) != KVR_OK) {
        return KVR_ENOMEM;
    }
    struct rnode *p = t->root;
    uint32_t pp = 0;
    if (parent != NULL) {
        struct extab *tab = &t->ranks[slot].tab;
        struct tent *e = kvr_radix_tab_find(t, slot, *parent);
        if (e == NULL)
            return KVR_EPARENT;
        p = resolve(t, e, &pp);
        if (pp >= cover_of(p, slot)) {
            tab_del(t, tab, e); /* stale entry (cannot happen while the tables are exact) */
            return KVR_EPARENT;
        }
    }
    size_t ok, rep;
    if (first_repeat(t, blocks, n, &rep) != KVR_OK)
        return KVR_ENOMEM;
    ok = first_conflict(t, slot, p, pp, parent, blocks, rep);
    uint32_t cnt = (uint32_t)ok;
    int rc = KVR_OK;
    if (cnt > 0 && parent != NULL && pp + 1u < p->len) {
        /* The parent is inside p's edge: Reuse, ReuseSuffixAndExtendLeaf, or Split. */
        uint32_t avail = p->len - pp - 1u;
        uint32_t lim = avail < cnt ? avail : cnt;
        const uint64_t *ext = rnode_ext(p);
        uint32_t m = 0;
        while (m < lim && p->loc[pp + 1u + m] == blocks[m].tokens_hash &&
               ext[pp + 1u + m] == blocks[m].block_hash)
            m++;
        if (m == cnt) {
            rc = cover_step(t, p, slot, pp + 1u, blocks, cnt, pp + 1u + cnt);
            goto out;
        }
        if (!p->internal && m == avail) {
            rc = cover_step(t, p, slot, pp + 1u, blocks, m, p->len);
            if (rc == KVR_OK)
                rc = leaf_append(t, p, slot, blocks + m, cnt - m);
            goto out;
        }
        struct rnode *s;
        if (split(t, p, pp + 1u, &s) != KVR_OK) {
            rc = KVR_ENOMEM;
            goto out;
        }
        rc = insert_children(t, slot, p, blocks, cnt, 1, *parent);
        settle(t, s);
        goto out;
    }
    if (cnt > 0)
        rc = insert_children(t, slot, p, blocks, cnt, parent != NULL, parent ? *parent : 0);
out:
    if (rc == KVR_OK && ok < n)
        rc = KVR_EINVALSEQ;
    return rc;
}

/* ==== remove ================================================================================ */

/* Cuts slot's coverage of n from c (its current cover) down to `i` positions, deleting its
 * entries from i on, then restores the structural invariants. `keep` is the position whose hash
 * the caller names (not recorded in ds); `known` (may be NULL) is slot's entry of position i when
 * i == keep. Never fails: if a cutoff cannot be recorded for lack of memory, the rank leaves the
 * node entirely (an undercount) and *degraded is set. */
static void cut_at(struct kvr_radix *t, struct rnode *n, uint32_t slot, uint32_t i, uint32_t c,
                   uint32_t keep, struct tent *known, int *degraded, struct dropset *ds)
{
    if (i >= c)
        return;
    int full = full_has(n, slot);
    if (i > 0 && full && cut_reserve(t, n, 1) != KVR_OK) {
        *degraded = 1;
        entries_drop(t, n, slot, 0, i, keep, ds);
        known = NULL; /* deletions may have moved it */
        i = 0;
    }
    entries_drop_known(t, n, slot, i, c, keep, ds, known);
    ovr_del_range(n, slot, i, c);
    full_clear(n, slot);
    if (i == 0)
        cut_del(n, slot);
    else
        cut_put(n, slot, i);
    settle(t, n);
}

static int dropped_here(const struct dropset *ds, uint64_t h)
{
    for (uint32_t i = 0; i < ds->n; i++)
        if (ds->h[i] == h)
            return 1;
    return 0;
}

enum { REMOVE_AHEAD = 4 };

/* Advances a removal job until t->work reaches `end`; returns 1 while hashes remain. A hash
 * whose cut is longer than the budget left is cut from the tail in pieces (the rank's coverage
 * shrinks monotonically, so a reader in between sees part of the removal: fewer blocks than
 * before, never more); the next step looks the hash up again and goes on. */
static int remove_step(struct kvr_radix *t, uint64_t end)
{
    struct job *j = &t->job;
    const uint32_t slot = j->slot;
    const uint64_t *hashes = j->hashes;
    const size_t n = j->n;
    size_t i = j->i;
    int more = 0;
    while (i < n) {
        if (t->work >= end) {
            more = 1;
            break;
        }
        if (i + REMOVE_AHEAD < n)
            tab_prefetch(t, slot, hashes[i + REMOVE_AHEAD]);
        uint64_t h = hashes[i];
        t->work++;
        struct tent *e = kvr_radix_tab_find(t, slot, h);
        if (e == NULL) {
            /* Not there: unless an earlier hash of this event cut it away (a parent removed
             * before its child), the rank did not hold it. */
            j->missing += !dropped_here(&j->ds, h);
            i++;
            continue;
        }
        uint32_t pos;
        struct rnode *node = resolve(t, e, &pos);
        uint32_t c = cover_of(node, slot), target = pos;
        uint64_t room = end > t->work ? end - t->work : 1u;
        if (c > pos && (uint64_t)(c - pos) > room)
            target = c - (uint32_t)room;
        int deg = 0;
        cut_at(t, node, slot, target, c, pos, target == pos ? e : NULL, &deg, &j->ds);
        j->degraded |= deg;
        if (target == pos || deg)
            i++;
    }
    j->i = i;
    if (more)
        return 1;
    tab_maybe_shrink(t, &t->ranks[slot].tab);
    return 0;
}

/* ==== clear / remove rank / remove worker =================================================== */

/* Points j at the worker's first registered slot >= from; returns 0 if there is none. */
static int next_worker_slot(const struct kvr_radix *t, struct job *j, uint32_t from)
{
    for (uint32_t s = from; s < t->nslots; s++) {
        if (t->ranks[s].in_use && t->ranks[s].worker_id == j->worker_id) {
            j->slot = s;
            j->cursor = 0;
            return 1;
        }
    }
    return 0;
}

/* Advances a rank-drop job until t->work reaches `end` (one unit per table slot visited, plus
 * what settling costs): for each of the rank's entries, drops the rank from that node and
 * settles it. The rank's table is not modified until the end (settling unlinks subtrees lazily
 * and never deletes entries), so the cursor stays valid. A reader in between sees the rank
 * partly dropped: some of its blocks gone, never more than before. Returns 1 while work remains. */
static int drop_step(struct kvr_radix *t, uint64_t end)
{
    struct job *j = &t->job;
    for (;;) {
        struct extab *tab = &t->ranks[j->slot].tab;
        while (j->cursor < tab->cap) {
            if (t->work >= end)
                return 1;
            const struct tent *e = &tab->e[j->cursor++];
            t->work++;
            if (e->node == 0)
                continue;
            uint32_t pos;
            struct rnode *n = kvr_radix_resolve_ro(t, e, &pos);
            if (n->live == RNODE_FREE)
                continue;
            if (full_has(n, j->slot) || cut_get(n, j->slot) != 0) {
                full_clear(n, j->slot);
                cut_del(n, j->slot);
                ovr_del_range(n, j->slot, 0, n->len);
            }
            settle(t, n);
        }
        tab_clear(t, tab);
        uint32_t done = j->slot;
        if (j->release)
            rank_release(t, done);
        if (!j->whole_worker || !next_worker_slot(t, j, done + 1u))
            return 0;
    }
}

/* ==== bounded jobs =========================================================================== */

int kvr_radix_busy(const kvr_radix_t *t)
{
    return t->job.kind != JOB_NONE || !drain_idle(t);
}

int kvr_radix_step(kvr_radix_t *t, uint64_t budget)
{
    uint64_t end = budget == 0 ? 1u : budget;
    end = end > UINT64_MAX - t->work ? UINT64_MAX : t->work + end;
    struct job *j = &t->job;
    if (j->kind == JOB_REMOVE) {
        if (remove_step(t, end))
            return 1;
        j->kind = JOB_NONE;
        j->rc = j->degraded ? KVR_ENOMEM : (j->missing ? KVR_ENOBLOCK : KVR_OK);
    } else if (j->kind == JOB_DROP) {
        if (drop_step(t, end))
            return 1;
        j->kind = JOB_NONE;
    }
    return drain_step(t, end);
}

int kvr_radix_job_result(const kvr_radix_t *t, size_t *not_found)
{
    if (not_found != NULL)
        *not_found = t->job.missing;
    return t->job.rc;
}

uint64_t kvr_radix_work(const kvr_radix_t *t)
{
    return t->work;
}

/* Finishes any job and drain in progress (unbounded). */
static void finish_pending(struct kvr_radix *t)
{
    if (kvr_radix_busy(t))
        while (kvr_radix_step(t, UINT64_MAX))
            ;
}

/* Starts a fresh job record (the previous job finished). */
static struct job *job_reset(struct kvr_radix *t)
{
    finish_pending(t);
    struct job *j = &t->job;
    j->kind = JOB_NONE;
    j->rc = KVR_OK;
    j->hashes = NULL;
    j->n = j->i = j->missing = 0;
    j->degraded = 0;
    j->ds.n = 0;
    j->release = j->whole_worker = 0;
    j->cursor = 0;
    return j;
}

int kvr_radix_remove_begin(kvr_radix_t *t, uint64_t worker_id, uint32_t dp_rank,
                           const uint64_t *hashes, size_t n)
{
    if (t == NULL || (hashes == NULL && n > 0))
        return KVR_EINVAL;
    struct job *j = job_reset(t);
    uint32_t slot;
    if (!rank_find(t, worker_id, dp_rank, &slot)) {
        j->missing = n;
        j->rc = n ? KVR_ENOBLOCK : KVR_OK;
        return KVR_OK;
    }
    j->kind = JOB_REMOVE;
    j->slot = slot;
    j->hashes = hashes;
    j->n = n;
    for (size_t i = 0; i < n && i < REMOVE_AHEAD; i++)
        tab_prefetch(t, slot, hashes[i]);
    return KVR_OK;
}

int kvr_radix_clear_begin(kvr_radix_t *t, uint64_t worker_id, uint32_t dp_rank)
{
    if (t == NULL)
        return KVR_EINVAL;
    struct job *j = job_reset(t);
    uint32_t slot;
    if (!rank_find(t, worker_id, dp_rank, &slot)) {
        /* A clear of an unknown rank registers it (it exists, with nothing). */
        j->rc = rank_get(t, worker_id, dp_rank, &slot);
        return KVR_OK;
    }
    j->kind = JOB_DROP;
    j->slot = slot;
    return KVR_OK;
}

int kvr_radix_remove_rank_begin(kvr_radix_t *t, uint64_t worker_id, uint32_t dp_rank)
{
    if (t == NULL)
        return KVR_EINVAL;
    struct job *j = job_reset(t);
    uint32_t slot;
    if (!rank_find(t, worker_id, dp_rank, &slot)) {
        j->rc = KVR_ENOTFOUND;
        return KVR_OK;
    }
    j->kind = JOB_DROP;
    j->slot = slot;
    j->release = 1;
    return KVR_OK;
}

int kvr_radix_remove_worker_begin(kvr_radix_t *t, uint64_t worker_id)
{
    if (t == NULL)
        return KVR_EINVAL;
    struct job *j = job_reset(t);
    j->worker_id = worker_id;
    if (!next_worker_slot(t, j, 0)) {
        j->rc = KVR_ENOTFOUND;
        return KVR_OK;
    }
    j->kind = JOB_DROP;
    j->release = 1;
    j->whole_worker = 1;
    return KVR_OK;
}

/* Runs a started job to completion; returns its result. */
static int job_run(struct kvr_radix *t, int begin_rc, size_t *not_found)
{
    if (begin_rc != KVR_OK)
        return begin_rc;
    finish_pending(t);
    return kvr_radix_job_result(t, not_found);
}

int kvr_radix_remove(kvr_radix_t *t, uint64_t worker_id, uint32_t dp_rank, const uint64_t *hashes,
                     size_t n, size_t *not_found)
{
    return job_run(t, kvr_radix_remove_begin(t, worker_id, dp_rank, hashes, n), not_found);
}

int kvr_radix_clear_rank(kvr_radix_t *t, uint64_t worker_id, uint32_t dp_rank)
{
    return job_run(t, kvr_radix_clear_begin(t, worker_id, dp_rank), NULL);
}

int kvr_radix_remove_rank(kvr_radix_t *t, uint64_t worker_id, uint32_t dp_rank)
{
    return job_run(t, kvr_radix_remove_rank_begin(t, worker_id, dp_rank), NULL);
}

int kvr_radix_remove_worker(kvr_radix_t *t, uint64_t worker_id)
{
    return job_run(t, kvr_radix_remove_worker_begin(t, worker_id), NULL);
}

int kvr_radix_apply(kvr_radix_t *t, const struct kvr_event *ev)
{
    if (t == NULL || ev == NULL)
        return KVR_EINVAL;
    switch (ev->kind) {
    case KVR_EVENT_STORED:
        return kvr_radix_store(t, ev->worker_id, ev->dp_rank,
                               ev->has_parent ? &ev->parent_hash : NULL, ev->blocks, ev->n);
    case KVR_EVENT_REMOVED:
        return kvr_radix_remove(t, ev->worker_id, ev->dp_rank, ev->hashes, ev->n, NULL);
    case KVR_EVENT_CLEARED:
        return kvr_radix_clear_rank(t, ev->worker_id, ev->dp_rank);
    default:
        return KVR_EINVAL;
    }
}

/* ==== find_matches ========================================================================== */

#define STACK_WORDS 64u /* active-set words on the stack: 4096 rank slots */

struct emit {
    const struct kvr_radix *t;
    struct kvr_match *out;
    size_t cap;
    size_t n;
};

static inline void emit(struct emit *em, uint32_t slot, uint32_t blocks)
{
    const struct rank *r = &em->t->ranks[slot];
    if (!r->in_use || blocks == 0)
        return;
    if (em->n < em->cap) {
        em->out[em->n].worker_id = r->worker_id;
        em->out[em->n].dp_rank = r->dp_rank;
        em->out[em->n].blocks = blocks;
    }
    em->n++;
}

/* One walk of the query (index.md §5.7) from c, the root's child for q[0], for the rank slots of
 * full-set words [w0, w0+words): active[] holds those words. Emits every scored rank of the
 * window. */
static inline __attribute__((always_inline)) void
walk_window(const struct kvr_radix *t, const struct rnode *c, const uint64_t *q, size_t n,
            int early, uint32_t w0, uint32_t words, uint64_t *active, struct emit *em)
{
    size_t pos = 0;
    uint32_t depth = 0;
    int first = 1;
    int any = 1;
    while (c != NULL) {
        const uint64_t *e = c->loc;
        size_t rest = n - pos;
        uint32_t lim = c->len < rest ? c->len : (uint32_t)rest;
        uint32_t m = 1;
        while (m < lim && e[m] == q[pos + m])
            m++;
        any = 0;
        if (first) {
            for (uint32_t w = 0; w < words; w++) {
                active[w] = full_word(c, w0 + w);
                any |= active[w] != 0;
            }
            for (uint32_t i = 0; i < c->ncut; i++) {
                uint32_t cw = c->cut[i].slot / 64u;
                if (cw >= w0 && cw < w0 + words)
                    emit(em, c->cut[i].slot, c->cut[i].k < m ? c->cut[i].k : m);
            }
            first = 0;
        } else {
            for (uint32_t w = 0; w < words; w++) {
                uint64_t f = full_word(c, w0 + w);
                uint64_t drop = active[w] & ~f;
                while (drop) {
                    uint32_t slot = (w0 + w) * 64u + (uint32_t)__builtin_ctzll(drop);
                    drop &= drop - 1u;
                    uint32_t k = c->ncut ? cut_get(c, slot) : 0;
                    emit(em, slot, depth + (k < m ? k : m));
                }
                active[w] &= f;
                any |= active[w] != 0;
            }
        }
        if (!any)
            break;
        depth += m;
        if (m < c->len)
            break;
        pos += m;
        if (early) {
            uint32_t pop = 0;
            for (uint32_t w = 0; w < words && pop < 2; w++)
                pop += (uint32_t)__builtin_popcountll(active[w]);
            if (pop == 1)
                break;
        }
        c = pos < n ? kvr_radix_kid_find(t, c, q[pos]) : NULL;
    }
    if (any) {
        for (uint32_t w = 0; w < words; w++) {
            uint64_t bits = active[w];
            while (bits) {
                uint32_t slot = (w0 + w) * 64u + (uint32_t)__builtin_ctzll(bits);
                bits &= bits - 1u;
                emit(em, slot, depth);
            }
        }
    }
}

int kvr_radix_find_matches(const kvr_radix_t *t, const uint64_t *q, size_t n, unsigned flags,
                           struct kvr_match *out, size_t cap, size_t *n_out)
{
    struct emit em = {.t = t, .out = out, .cap = cap, .n = 0};
    uint64_t active[STACK_WORDS];
    *n_out = 0;
    if (t == NULL || (q == NULL && n > 0))
        return KVR_EINVAL;
    if (n == 0)
        return KVR_OK;
    const struct rnode *c = kvr_radix_kid_find(t, t->root, q[0]);
    if (c == NULL)
        return KVR_OK;
    uint32_t words = (t->nslots + 63u) / 64u;
    if (words == 0)
        words = 1;
    if (words <= STACK_WORDS) {
        walk_window(t, c, q, n, (flags & KVR_MATCH_EARLY_EXIT) != 0, 0, words, active, &em);
    } else {
        /* More than 4096 rank slots: one walk per window of 4096 slots, never allocating.
         * early_exit needs the whole active set, so it is ignored here (exact scores). */
        for (uint32_t w0 = 0; w0 < words; w0 += STACK_WORDS) {
            uint32_t nw = words - w0 < STACK_WORDS ? words - w0 : STACK_WORDS;
            walk_window(t, c, q, n, 0, w0, nw, active, &em);
        }
    }
    *n_out = em.n;
    return em.n > cap ? KVR_ERANGE : KVR_OK;
}

/* ==== lifecycle and stats =================================================================== */

int kvr_radix_new(kvr_radix_t **out)
{
    struct kvr_radix *t = calloc(1, sizeof(*t));
    if (t == NULL)
        return KVR_ENOMEM;
    kvr_alloc_init(&t->alloc);
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    t->seed = mix((uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 32), (uint64_t)(uintptr_t)t) | 1u;
    atomic_init(&t->dumps_active, 0u);
    t->root = node_alloc(t);
    if (t->root == NULL) {
        kvr_free(&t->alloc, t->chunks ? t->chunks[0] : NULL);
        kvr_free(&t->alloc, t->chunks);
        free(t);
        return KVR_ENOMEM;
    }
    *out = t;
    return KVR_OK;
}

void kvr_radix_free(kvr_radix_t *t)
{
    if (t == NULL)
        return;
    for (uint32_t id = 0; id < t->next_fresh; id++) {
        struct rnode *n = rnode_get(t, id);
        if (n->live) {
            kvr_free(&t->alloc, n->loc);
            kvr_free(&t->alloc, n->fullx);
            kvr_free(&t->alloc, n->cut);
            kvr_free(&t->alloc, n->ovr);
            kvr_free(&t->alloc, n->kids);
        }
    }
    for (uint32_t i = 0; i < t->nchunks; i++)
        kvr_free(&t->alloc, t->chunks[i]);
    kvr_free(&t->alloc, t->chunks);
    for (uint32_t s = 0; s < t->nslots; s++)
        kvr_free(&t->alloc, t->ranks[s].tab.e);
    kvr_free(&t->alloc, t->ranks);
    kvr_free(&t->alloc, t->rmap);
    free(t);
}

kvr_alloc_t *kvr_radix_allocator(kvr_radix_t *t)
{
    return &t->alloc;
}

void kvr_radix_stats(const kvr_radix_t *t, struct kvr_radix_stats *out)
{
    memset(out, 0, sizeof(*out));
    out->nodes = t->live_nodes;
    out->blocks = t->live_blocks;
    out->block_ranks = t->block_ranks;
    out->ranks = t->nranks;
    out->bytes = t->alloc.live_bytes + sizeof(*t);
    out->peak_bytes = t->alloc.peak_bytes + sizeof(*t);
}

int kvr_radix_rank_blocks(const kvr_radix_t *t, struct kvr_rank_blocks *out, size_t cap,
                          size_t *n_out)
{
    size_t k = 0;
    for (uint32_t s = 0; s < t->nslots; s++) {
        const struct rank *r = &t->ranks[s];
        if (!r->in_use)
            continue;
        if (k < cap) {
            out[k].worker_id = r->worker_id;
            out[k].dp_rank = r->dp_rank;
            out[k].pad_ = 0;
            out[k].blocks = r->tab.count;
        }
        k++;
    }
    *n_out = k;
    return k > cap ? KVR_ERANGE : KVR_OK;
}
