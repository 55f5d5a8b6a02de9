/* ckf_index.c - CKF-backed index mode: lanes bound to ranks, levels, translation
 * (kvr/ckf_index.h). SPDX-License-Identifier: Apache-2.0 */
#include "kvr/ckf_index.h"

#include <string.h>

#include "ckf_map.h"
#include "kvr/ckf.h"
#include "kvr/ckf_search.h"
#include "kvr/err.h"
#include "kvr/hash.h"

/* own-map values: refcount in the high bits, level in the low 8 */
#define VAL(rc, level) (((uint64_t)(rc) << 8) | (uint64_t)(level))
#define VAL_RC(v) ((v) >> 8)
#define VAL_LEVEL(v) ((uint32_t)((v)&0xFF))

struct rank {
    uint64_t worker_id;
    uint32_t dp_rank;
    uint32_t group;                         /* group index */
    uint32_t lane;                          /* lane within the group */
    struct ckf_map own;                     /* seq -> VAL(refcount, level) */
    struct ckf_map ext;                     /* translate mode: ext -> seq */
    uint64_t fps[KVR_CKF_INDEX_LEVELS_MAX]; /* fingerprints per level */
    struct kvr_ckf_rng rng;                 /* kick choices */
};

struct group {
    kvr_ckf_table_t *levels[KVR_CKF_INDEX_LEVELS_MAX]; /* each with its own allocator */
    uint32_t nlevels;
    uint32_t lanes;                      /* lanes of every level (1..lanes_per_table) */
    uint16_t used;                       /* bound lanes */
    uint32_t rank_of[KVR_CKF_LANES_MAX]; /* rank index of each bound lane */
};

struct kvr_ckf_index {
    kvr_alloc_t alloc; /* this struct, ranks, groups, maps, kick log */
    struct kvr_ckf_index_config cfg;
    uint64_t level0_buckets;
    struct rank *ranks;
    size_t n_ranks, cap_ranks;
    struct group *groups;
    size_t n_groups, cap_groups;
    struct kvr_ckf_kick *log; /* max_kicks entries */
    /* counters; sizes are computed in kvr_ckf_index_stats, except st.blocks, kept up to date
     * (kvr_ckf_index_blocks): the entries of every rank's ext map (translate) or own map */
    struct kvr_ckf_index_stats st;
};

void kvr_ckf_index_config_init(struct kvr_ckf_index_config *cfg)
{
    memset(cfg, 0, sizeof(*cfg));
    cfg->expected_blocks_per_rank = 16384;
    cfg->seed = KVR_CKF_DEFAULT_SEED;
    cfg->max_kicks = KVR_CKF_MAX_KICKS;
    cfg->window = KVR_CKF_WINDOW;
    cfg->lanes_per_table = KVR_CKF_LANES_MAX;
    cfg->max_load_pct = 90;
    cfg->max_levels = 2;
}

/* Lane fingerprints a level of nb buckets accepts before insertions move on (the fill rule of
 * place: a level takes a fingerprint while fps < level_cap, i.e. fps * 100 < slots * pct). */
static uint64_t level_cap(uint64_t nb, uint32_t pct)
{
    return (nb * KVR_CKF_SLOTS * pct + 99) / 100;
}

/* Largest power of two B >= 2 whose level holds at most n fingerprints: level_cap(B) <= n. */
static uint64_t pow2_cap_at_most(uint64_t n, uint32_t pct)
{
    uint64_t b = 2;
    while (b < ((uint64_t)1 << 61) && level_cap(b * 2, pct) <= n)
        b *= 2;
    return b;
}

/* Smallest power of two B >= 2 whose level holds at least n fingerprints. */
static uint64_t pow2_cap_at_least(uint64_t n, uint32_t pct)
{
    uint64_t b = 2;
    while (b < ((uint64_t)1 << 61) && level_cap(b, pct) < n)
        b *= 2;
    return b;
}

/* A group's table sizes ("layout") for n blocks per lane: at most two levels.
 *   COMPACT, max_levels >= 2: level 0 = the largest power of two that n fills (pow2_cap_at_most),
 *     level 1 = the smallest power of two that holds the rest (none if nothing is left): the
 *     total stays within a power-of-two rounding of the REMAINDER, never of n;
 *   COMPACT, max_levels == 1: one level, the smallest power of two that holds n;
 *   GEN_A: one level of kvr_ckf_buckets_for(n) (ckf.md §5: <= 80% load). */
struct layout {
    uint32_t n;
    uint64_t nb[2];
};

static struct layout layout_for(const struct kvr_ckf_index_config *c, uint64_t n)
{
    struct layout L = {1, {0, 0}};
    if (c->sizing == KVR_CKF_SIZING_GEN_A) {
        L.nb[0] = kvr_ckf_buckets_for(n);
        return L;
    }
    if (c->max_levels == 1) {
        L.nb[0] = pow2_cap_at_least(n, c->max_load_pct);
        return L;
    }
    L.nb[0] = pow2_cap_at_most(n, c->max_load_pct);
    uint64_t cap0 = level_cap(L.nb[0], c->max_load_pct);
    if (cap0 < n) {
        L.nb[1] = pow2_cap_at_least(n - cap0, c->max_load_pct);
        L.n = 2;
    }
    return L;
}

static uint64_t layout_cap(const struct layout *L, uint32_t pct)
{
    uint64_t cap = 0;
    for (uint32_t l = 0; l < L->n; l++)
        cap += level_cap(L->nb[l], pct);
    return cap;
}

int kvr_ckf_index_new(const struct kvr_ckf_index_config *cfg, kvr_ckf_index_t **out)
{
    struct kvr_ckf_index_config c;
    if (cfg == NULL)
        kvr_ckf_index_config_init(&c);
    else
        c = *cfg;
    if (c.expected_blocks_per_rank == 0 || c.max_kicks == 0 ||
        c.max_kicks > KVR_CKF_MAX_KICKS_LIMIT || c.window == 0 || c.window > KVR_CKF_WINDOW ||
        c.lanes_per_table == 0 || c.lanes_per_table > KVR_CKF_LANES_MAX || c.max_load_pct < 50 ||
        c.max_load_pct > 100 || c.max_levels == 0 || c.max_levels > KVR_CKF_INDEX_LEVELS_MAX ||
        (c.sizing != KVR_CKF_SIZING_COMPACT && c.sizing != KVR_CKF_SIZING_GEN_A))
        return KVR_EINVAL;
    kvr_alloc_t a;
    kvr_alloc_init(&a);
    kvr_ckf_index_t *idx = kvr_calloc(&a, 1, sizeof(*idx));
    if (idx == NULL)
        return KVR_ENOMEM;
    idx->log = kvr_malloc(&a, c.max_kicks * sizeof(*idx->log));
    if (idx->log == NULL) {
        kvr_free(&a, idx);
        return KVR_ENOMEM;
    }
    idx->cfg = c;
    struct layout L = layout_for(&c, c.expected_blocks_per_rank);
    idx->level0_buckets = L.nb[0]; /* level 1 is added once level 0 is full */
    idx->alloc = a;
    *out = idx;
    return KVR_OK;
}

void kvr_ckf_index_free(kvr_ckf_index_t *idx)
{
    if (idx == NULL)
        return;
    for (size_t i = 0; i < idx->n_ranks; i++) {
        ckf_map_free(&idx->ranks[i].own);
        ckf_map_free(&idx->ranks[i].ext);
    }
    for (size_t g = 0; g < idx->n_groups; g++)
        for (uint32_t l = 0; l < idx->groups[g].nlevels; l++)
            kvr_ckf_table_free(idx->groups[g].levels[l]);
    kvr_alloc_t a = idx->alloc;
    kvr_free(&a, idx->ranks);
    kvr_free(&a, idx->groups);
    kvr_free(&a, idx->log);
    kvr_free(&a, idx);
}

kvr_alloc_t *kvr_ckf_index_allocator(kvr_ckf_index_t *idx)
{
    return &idx->alloc;
}

/* ==== ranks and groups ======================================================================== */

static struct rank *find_rank(const kvr_ckf_index_t *idx, uint64_t worker_id, uint32_t dp_rank)
{
    for (size_t i = 0; i < idx->n_ranks; i++)
        if (idx->ranks[i].worker_id == worker_id && idx->ranks[i].dp_rank == dp_rank)
            return &idx->ranks[i];
    return NULL;
}

/* Creates a group's level 0. KVR_OK or KVR_ENOMEM. */
static int first_level(kvr_ckf_index_t *idx, struct group *g)
{
    int rc = kvr_ckf_table_new(g->lanes, idx->level0_buckets, idx->cfg.seed, &g->levels[0]);
    if (rc != KVR_OK)
        return KVR_ENOMEM;
    g->nlevels = 1;
    return KVR_OK;
}

static uint64_t rank_fps(const struct rank *r)
{
    uint64_t n = 0;
    for (uint32_t l = 0; l < KVR_CKF_INDEX_LEVELS_MAX; l++)
        n += r->fps[l];
    return n;
}

/* Tries the levels of `tables` in order (skipping those the lane fills to max_load_pct) for one
 * key; *level receives the level that took it. KVR_OK or KVR_ECAPACITY (nothing changed). */
static int place(kvr_ckf_index_t *idx, kvr_ckf_table_t *const *tables, uint32_t n, uint64_t *fps,
                 struct rank *r, const struct kvr_ckf_key *key, uint32_t *level)
{
    struct kvr_ckf_kicker k = {&r->rng, idx->log, idx->cfg.max_kicks};
    for (uint32_t l = 0; l < n; l++) {
        if (fps[l] >= level_cap(kvr_ckf_table_buckets(tables[l]), idx->cfg.max_load_pct))
            continue;
        struct kvr_ckf_view v;
        kvr_ckf_table_view(tables[l], r->lane, &v);
        if (kvr_ckf_view_insert(&v, &k, key, NULL, NULL) == KVR_OK) {
            fps[l]++;
            *level = l;
            return KVR_OK;
        }
    }
    return KVR_ECAPACITY;
}

/* Re-lays a group out as L: a level whose size is unchanged is kept as it is; every other level
 * is a new table, and the fingerprints of the levels that go are re-inserted from the exact
 * side (each rank's own map holds every canonical hash and its level), then the own-map levels
 * are updated. All or nothing: on KVR_ENOMEM or KVR_ECAPACITY (a re-insertion found no room)
 * the group, its tables and the maps are exactly as before. Cost O(fingerprints moved), under
 * the caller's write lock. */
static int relayout(kvr_ckf_index_t *idx, struct group *g, const struct layout *L)
{
    kvr_ckf_table_t *nt[KVR_CKF_INDEX_LEVELS_MAX] = {0};
    int keep[KVR_CKF_INDEX_LEVELS_MAX] = {0};
    uint64_t fps[KVR_CKF_LANES_MAX][KVR_CKF_INDEX_LEVELS_MAX];
    uint8_t *lvl = NULL;
    int rc = KVR_OK;
    for (uint32_t l = 0; l < L->n; l++) {
        keep[l] = l < g->nlevels && kvr_ckf_table_buckets(g->levels[l]) == L->nb[l];
        if (keep[l]) {
            nt[l] = g->levels[l];
        } else if (kvr_ckf_table_new(g->lanes, L->nb[l], idx->cfg.seed, &nt[l]) != KVR_OK) {
            rc = KVR_ENOMEM;
            goto fail;
        }
    }
    /* fingerprints to move: those of every level that is not kept */
    size_t moving = 0;
    for (uint32_t m = g->used; m != 0; m &= m - 1) {
        const struct rank *r = &idx->ranks[g->rank_of[__builtin_ctz(m)]];
        for (uint32_t l = 0; l < g->nlevels; l++)
            if (!(l < L->n && keep[l]))
                moving += r->fps[l];
    }
    if (moving > 0 && (lvl = kvr_malloc(&idx->alloc, moving)) == NULL) {
        rc = KVR_ENOMEM;
        goto fail;
    }
    /* pass 1: insert into the new tables (the old ones and the maps untouched) */
    size_t k = 0;
    for (uint32_t m = g->used; m != 0; m &= m - 1) {
        uint32_t lane = (uint32_t)__builtin_ctz(m);
        struct rank *r = &idx->ranks[g->rank_of[lane]];
        for (uint32_t l = 0; l < KVR_CKF_INDEX_LEVELS_MAX; l++)
            fps[lane][l] = l < L->n && keep[l] ? r->fps[l] : 0;
        uint64_t seq, v;
        for (size_t pos = 0; ckf_map_next(&r->own, &pos, &seq, &v);) {
            uint32_t old = VAL_LEVEL(v), to;
            if (old < L->n && keep[old])
                continue;
            struct kvr_ckf_key key;
            kvr_ckf_key_make(seq, idx->cfg.seed, &key);
            if (place(idx, nt, L->n, fps[lane], r, &key, &to) != KVR_OK) {
                rc = KVR_ECAPACITY;
                goto fail;
            }
            lvl[k++] = (uint8_t)to;
        }
    }
    /* pass 2 (cannot fail): the same iteration order, record the new levels */
    k = 0;
    for (uint32_t m = g->used; m != 0; m &= m - 1) {
        uint32_t lane = (uint32_t)__builtin_ctz(m);
        struct rank *r = &idx->ranks[g->rank_of[lane]];
        uint64_t seq, v;
        for (size_t pos = 0; ckf_map_next(&r->own, &pos, &seq, &v);) {
            uint32_t old = VAL_LEVEL(v);
            if (old < L->n && keep[old])
                continue;
            *ckf_map_next_val(&r->own, pos) = VAL(VAL_RC(v), lvl[k++]);
        }
        memcpy(r->fps, fps[lane], sizeof(r->fps));
    }
    for (uint32_t l = 0; l < g->nlevels; l++)
        if (!(l < L->n && keep[l]))
            kvr_ckf_table_free(g->levels[l]);
    for (uint32_t l = 0; l < L->n; l++)
        g->levels[l] = nt[l];
    g->nlevels = L->n;
    idx->st.growths++;
    idx->st.moved += k;
    if (k > 0)
        idx->st.rebuilds++;
    kvr_free(&idx->alloc, lvl);
    return KVR_OK;
fail:
    for (uint32_t l = 0; l < L->n; l++)
        if (!keep[l])
            kvr_ckf_table_free(nt[l]);
    kvr_free(&idx->alloc, lvl);
    return rc;
}

/* Grows a group that could not take a fingerprint: the layout for the group's largest lane
 * plus one block, enlarged until it holds more than the current one. A layout change that keeps
 * level 0 only adds or rebuilds level 1 (O(level-1 contents)); a level-0 change rebuilds the group
 * (O(group)); both at least double what they rebuild, so the work is amortised O(1) per block, and
 * the total stays within one power-of-two rounding of the top-up remainder (no doubling of the
 * whole table). A rebuild that finds no room tries the next larger layout; past that the block is a
 * capacity omission. KVR_OK, KVR_ECAPACITY or KVR_ENOMEM. */
static int grow(kvr_ckf_index_t *idx, struct group *g)
{
    uint64_t need = 0, cur = 0;
    for (uint32_t m = g->used; m != 0; m &= m - 1) {
        uint64_t n = rank_fps(&idx->ranks[g->rank_of[__builtin_ctz(m)]]);
        need = n > need ? n : need;
    }
    for (uint32_t l = 0; l < g->nlevels; l++)
        cur += level_cap(kvr_ckf_table_buckets(g->levels[l]), idx->cfg.max_load_pct);
    uint64_t target = need + 1;
    for (int attempt = 0; attempt < 8; attempt++) {
        struct layout L = layout_for(&idx->cfg, target);
        while (layout_cap(&L, idx->cfg.max_load_pct) <= cur && target < ((uint64_t)1 << 58)) {
            target += target / 4 + 1;
            L = layout_for(&idx->cfg, target);
        }
        if (layout_cap(&L, idx->cfg.max_load_pct) <= cur)
            return KVR_ECAPACITY;
        int rc = relayout(idx, g, &L);
        if (rc != KVR_ECAPACITY)
            return rc;
        cur = layout_cap(&L, idx->cfg.max_load_pct); /* that one was too tight: go larger */
    }
    return KVR_ECAPACITY;
}

/* Doubles the lanes of every level of a group (up to lanes_per_table), copying each lane's
 * column: groups start with one lane so that a model with few ranks pays only for its ranks.
 * All or nothing: KVR_OK or KVR_ENOMEM (group unchanged). Writers only (under the write lock). */
static int widen(kvr_ckf_index_t *idx, struct group *g)
{
    uint32_t lanes =
        g->lanes * 2 < idx->cfg.lanes_per_table ? g->lanes * 2 : idx->cfg.lanes_per_table;
    kvr_ckf_table_t *wide[KVR_CKF_INDEX_LEVELS_MAX];
    for (uint32_t l = 0; l < g->nlevels; l++) {
        uint64_t nb = kvr_ckf_table_buckets(g->levels[l]);
        if (kvr_ckf_table_new(lanes, nb, idx->cfg.seed, &wide[l]) != KVR_OK) {
            while (l > 0)
                kvr_ckf_table_free(wide[--l]);
            return KVR_ENOMEM;
        }
        for (uint32_t lane = 0; lane < g->lanes; lane++) {
            struct kvr_ckf_view from, to;
            kvr_ckf_table_view(g->levels[l], lane, &from);
            kvr_ckf_table_view(wide[l], lane, &to);
            for (uint64_t b = 0; b < nb; b++)
                kvr_ckf_view_put(&to, b, kvr_ckf_view_get(&from, b));
        }
    }
    for (uint32_t l = 0; l < g->nlevels; l++) {
        kvr_ckf_table_free(g->levels[l]);
        g->levels[l] = wide[l];
    }
    g->lanes = lanes;
    return KVR_OK;
}

static uint16_t lane_mask(uint32_t lanes)
{
    return (uint16_t)((1u << lanes) - 1);
}

/* Finds or registers a rank; binds a free lane (creating a group if needed). The pointer is
 * valid until the next registration or removal. */
static int get_rank(kvr_ckf_index_t *idx, uint64_t worker_id, uint32_t dp_rank, struct rank **out)
{
    struct rank *r = find_rank(idx, worker_id, dp_rank);
    if (r != NULL) {
        *out = r;
        return KVR_OK;
    }
    /* reserve arrays before changing anything */
    if (idx->n_ranks == idx->cap_ranks) {
        size_t cap = idx->cap_ranks ? idx->cap_ranks * 2 : 16;
        struct rank *rs = kvr_realloc(&idx->alloc, idx->ranks, cap * sizeof(*rs));
        if (rs == NULL)
            return KVR_ENOMEM;
        idx->ranks = rs;
        idx->cap_ranks = cap;
    }
    /* a free lane; else a group that can widen; else a new one-lane group */
    size_t gi = 0;
    while (gi < idx->n_groups && idx->groups[gi].used == lane_mask(idx->groups[gi].lanes))
        gi++;
    if (gi == idx->n_groups) {
        gi = 0;
        while (gi < idx->n_groups && idx->groups[gi].lanes == idx->cfg.lanes_per_table)
            gi++;
        if (gi < idx->n_groups) {
            int rc = widen(idx, &idx->groups[gi]);
            if (rc != KVR_OK)
                return rc;
        }
    }
    if (gi == idx->n_groups) {
        if (idx->n_groups == idx->cap_groups) {
            size_t cap = idx->cap_groups ? idx->cap_groups * 2 : 4;
            struct group *gs = kvr_realloc(&idx->alloc, idx->groups, cap * sizeof(*gs));
            if (gs == NULL)
                return KVR_ENOMEM;
            idx->groups = gs;
            idx->cap_groups = cap;
        }
        struct group *g = &idx->groups[gi];
        memset(g, 0, sizeof(*g));
        g->lanes = 1;
        int rc = first_level(idx, g);
        if (rc != KVR_OK)
            return rc;
        idx->n_groups++;
    }
    struct group *g = &idx->groups[gi];
    uint32_t lane = (uint32_t)__builtin_ctz((unsigned)(uint16_t)~g->used);
    r = &idx->ranks[idx->n_ranks];
    memset(r, 0, sizeof(*r));
    r->worker_id = worker_id;
    r->dp_rank = dp_rank;
    r->group = (uint32_t)gi;
    r->lane = lane;
    ckf_map_init(&r->own, &idx->alloc);
    ckf_map_init(&r->ext, &idx->alloc);
    kvr_ckf_rng_seed_lane(&r->rng, idx->cfg.seed, (uint32_t)(gi * KVR_CKF_LANES_MAX + lane));
    g->used |= (uint16_t)(1u << lane);
    g->rank_of[lane] = (uint32_t)idx->n_ranks;
    idx->n_ranks++;
    *out = r;
    return KVR_OK;
}

/* Zeroes a rank's lane in every level and drops its exact side (the rank stays). */
static void clear_rank(kvr_ckf_index_t *idx, struct rank *r)
{
    struct group *g = &idx->groups[r->group];
    for (uint32_t l = 0; l < g->nlevels; l++) {
        struct kvr_ckf_view v;
        kvr_ckf_table_view(g->levels[l], r->lane, &v);
        kvr_ckf_view_clear(&v);
        r->fps[l] = 0;
    }
    idx->st.blocks -= idx->cfg.translate ? r->ext.n : r->own.n;
    ckf_map_clear(&r->own);
    ckf_map_clear(&r->ext);
}

static void drop_rank(kvr_ckf_index_t *idx, size_t i)
{
    struct rank *r = &idx->ranks[i];
    clear_rank(idx, r);
    ckf_map_free(&r->own);
    ckf_map_free(&r->ext);
    struct group *g = &idx->groups[r->group];
    g->used &= (uint16_t) ~(1u << r->lane);
    size_t last = --idx->n_ranks;
    if (i != last) {
        idx->ranks[i] = idx->ranks[last];
        idx->groups[idx->ranks[i].group].rank_of[idx->ranks[i].lane] = (uint32_t)i;
    }
}

/* ==== fingerprints ============================================================================ */

/* Inserts seq's fingerprint into the first level that accepts it; grows the group when none
 * does. *level receives the level. KVR_OK, KVR_ECAPACITY (omission) or KVR_ENOMEM. */
static int insert_fp(kvr_ckf_index_t *idx, struct rank *r, uint64_t seq, uint32_t *level)
{
    struct group *g = &idx->groups[r->group];
    struct kvr_ckf_key key;
    kvr_ckf_key_make(seq, idx->cfg.seed, &key);
    for (;;) {
        if (place(idx, g->levels, g->nlevels, r->fps, r, &key, level) == KVR_OK)
            return KVR_OK;
        int rc = grow(idx, g);
        if (rc != KVR_OK)
            return rc;
    }
}

static int remove_fp(kvr_ckf_index_t *idx, struct rank *r, uint64_t seq, uint32_t level)
{
    struct group *g = &idx->groups[r->group];
    struct kvr_ckf_key key;
    struct kvr_ckf_view v;
    kvr_ckf_key_make(seq, idx->cfg.seed, &key);
    kvr_ckf_table_view(g->levels[level], r->lane, &v);
    if (!kvr_ckf_view_remove(&v, &key, NULL)) {
        idx->st.invariant++;
        return KVR_ECORRUPT;
    }
    r->fps[level]--;
    return KVR_OK;
}

/* One more reference to seq. *added = 1 when a new ownership entry was created. */
static int ref_seq(kvr_ckf_index_t *idx, struct rank *r, uint64_t seq)
{
    uint64_t *v = ckf_map_ref(&r->own, seq);
    if (v != NULL) {
        if (!idx->cfg.translate) {
            idx->st.duplicates++;
            return KVR_OK;
        }
        *v = VAL(VAL_RC(*v) + 1, VAL_LEVEL(*v));
        return KVR_OK;
    }
    if (ckf_map_reserve(&r->own, 1) != KVR_OK)
        return KVR_ENOMEM;
    uint32_t level;
    int rc = insert_fp(idx, r, seq, &level);
    if (rc == KVR_ECAPACITY)
        idx->st.omissions++;
    if (rc != KVR_OK)
        return rc;
    KVR_ASSERT(ckf_map_put(&r->own, seq, VAL(1, level)) == KVR_OK);
    if (!idx->cfg.translate)
        idx->st.blocks++;
    return KVR_OK;
}

static int unref_seq(kvr_ckf_index_t *idx, struct rank *r, uint64_t seq)
{
    uint64_t *v = ckf_map_ref(&r->own, seq);
    if (v == NULL)
        return KVR_ENOBLOCK;
    if (VAL_RC(*v) > 1) {
        *v = VAL(VAL_RC(*v) - 1, VAL_LEVEL(*v));
        return KVR_OK;
    }
    uint32_t level = VAL_LEVEL(*v);
    ckf_map_del(&r->own, seq, NULL);
    if (!idx->cfg.translate)
        idx->st.blocks--;
    return remove_fp(idx, r, seq, level);
}

/* ==== events ================================================================================== */

static int keep_first(int first, int rc)
{
    return first != KVR_OK ? first : rc;
}

static int store_translated(kvr_ckf_index_t *idx, struct rank *r, const uint64_t *parent,
                            const struct kvr_block *blocks, size_t n)
{
    uint64_t prev = 0;
    int has_prev = 0;
    if (parent != NULL) {
        if (!ckf_map_get(&r->ext, *parent, &prev)) {
            idx->st.err_parent++;
            return KVR_EPARENT;
        }
        has_prev = 1;
    }
    int first = KVR_OK;
    for (size_t i = 0; i < n; i++) {
        uint64_t seq =
            has_prev ? kvr_hash_seq_next(prev, blocks[i].tokens_hash) : blocks[i].tokens_hash;
        uint64_t old;
        if (ckf_map_get(&r->ext, blocks[i].block_hash, &old)) {
            if (old == seq) {
                idx->st.duplicates++;
                prev = seq;
                has_prev = 1;
                continue;
            }
            /* the engine re-used an external hash for other content: move it */
            ckf_map_del(&r->ext, blocks[i].block_hash, NULL);
            idx->st.blocks--; /* translate mode */
            first = keep_first(first, unref_seq(idx, r, old));
        }
        if (ckf_map_reserve(&r->ext, 1) != KVR_OK)
            return keep_first(first, KVR_ENOMEM); /* the chain cannot continue */
        int rc = ref_seq(idx, r, seq);
        if (rc == KVR_ENOMEM)
            return keep_first(first, rc);
        if (rc == KVR_OK) {
            KVR_ASSERT(ckf_map_put(&r->ext, blocks[i].block_hash, seq) == KVR_OK);
            idx->st.blocks++;
        }
        first = keep_first(first, rc);
        prev = seq;
        has_prev = 1;
    }
    return first;
}

int kvr_ckf_index_store(kvr_ckf_index_t *idx, uint64_t worker_id, uint32_t dp_rank,
                        const uint64_t *parent, const struct kvr_block *blocks, size_t n)
{
    if (n == 0)
        return KVR_EINVAL;
    struct rank *r;
    if (idx->cfg.translate && parent != NULL) {
        /* resolve the parent before registering anything */
        r = find_rank(idx, worker_id, dp_rank);
        if (r == NULL || !ckf_map_get(&r->ext, *parent, NULL)) {
            idx->st.err_parent++;
            return KVR_EPARENT;
        }
    }
    int rc = get_rank(idx, worker_id, dp_rank, &r);
    if (rc != KVR_OK)
        return rc;
    if (idx->cfg.translate)
        return store_translated(idx, r, parent, blocks, n);
    int first = KVR_OK;
    for (size_t i = 0; i < n; i++)
        first = keep_first(first, ref_seq(idx, r, blocks[i].block_hash));
    return first;
}

int kvr_ckf_index_remove(kvr_ckf_index_t *idx, uint64_t worker_id, uint32_t dp_rank,
                         const uint64_t *hashes, size_t n, size_t *not_found)
{
    struct rank *r = find_rank(idx, worker_id, dp_rank);
    size_t missing = 0;
    int first = KVR_OK;
    for (size_t i = 0; i < n; i++) {
        uint64_t seq = hashes[i];
        if (r != NULL && idx->cfg.translate) {
            if (!ckf_map_del(&r->ext, hashes[i], &seq)) {
                missing++;
                continue;
            }
            idx->st.blocks--; /* translate mode */
        }
        int rc = r != NULL ? unref_seq(idx, r, seq) : KVR_ENOBLOCK;
        if (rc == KVR_ENOBLOCK)
            missing++;
        else
            first = keep_first(first, rc);
    }
    idx->st.err_block += missing;
    if (not_found != NULL)
        *not_found = missing;
    return first != KVR_OK ? first : (missing > 0 ? KVR_ENOBLOCK : KVR_OK);
}

int kvr_ckf_index_clear_rank(kvr_ckf_index_t *idx, uint64_t worker_id, uint32_t dp_rank)
{
    struct rank *r = find_rank(idx, worker_id, dp_rank);
    if (r != NULL)
        clear_rank(idx, r);
    return KVR_OK;
}

int kvr_ckf_index_remove_rank(kvr_ckf_index_t *idx, uint64_t worker_id, uint32_t dp_rank)
{
    struct rank *r = find_rank(idx, worker_id, dp_rank);
    if (r == NULL)
        return KVR_ENOTFOUND;
    drop_rank(idx, (size_t)(r - idx->ranks));
    return KVR_OK;
}

int kvr_ckf_index_remove_worker(kvr_ckf_index_t *idx, uint64_t worker_id)
{
    int found = 0;
    for (size_t i = 0; i < idx->n_ranks;) {
        if (idx->ranks[i].worker_id == worker_id) {
            drop_rank(idx, i);
            found = 1;
        } else {
            i++;
        }
    }
    return found ? KVR_OK : KVR_ENOTFOUND;
}

int kvr_ckf_index_apply_counted(kvr_ckf_index_t *idx, const struct kvr_event *ev, size_t *not_found)
{
    int rc;
    if (not_found != NULL)
        *not_found = 0;
    switch (ev->kind) {
    case KVR_EVENT_STORED:
        rc = kvr_ckf_index_store(idx, ev->worker_id, ev->dp_rank,
                                 ev->has_parent ? &ev->parent_hash : NULL, ev->blocks, ev->n);
        break;
    case KVR_EVENT_REMOVED:
        rc = kvr_ckf_index_remove(idx, ev->worker_id, ev->dp_rank, ev->hashes, ev->n, not_found);
        break;
    case KVR_EVENT_CLEARED:
        rc = kvr_ckf_index_clear_rank(idx, ev->worker_id, ev->dp_rank);
        break;
    default:
        rc = KVR_EINVAL;
        break;
    }
    if (rc == KVR_ENOMEM)
        idx->st.err_nomem++;
    return rc;
}

int kvr_ckf_index_apply(kvr_ckf_index_t *idx, const struct kvr_event *ev)
{
    return kvr_ckf_index_apply_counted(idx, ev, NULL);
}

int kvr_ckf_index_owns(const kvr_ckf_index_t *idx, uint64_t worker_id, uint32_t dp_rank,
                       uint64_t seq)
{
    const struct rank *r = find_rank(idx, worker_id, dp_rank);
    return r != NULL && ckf_map_get(&r->own, seq, NULL);
}

/* ==== queries ================================================================================= */

#define STACK_BLOCKS 512u

/* Per-query probe context: keys computed lazily once per position and shared by all groups. */
struct query {
    const kvr_ckf_index_t *idx;
    const uint64_t *seq;
    struct kvr_ckf_key *keys;
    uint8_t *have;
    const struct group *g;
};

static uint16_t group_probe(void *vctx, size_t pos)
{
    struct query *q = vctx;
    if (!q->have[pos]) {
        kvr_ckf_key_make(q->seq[pos], q->idx->cfg.seed, &q->keys[pos]);
        q->have[pos] = 1;
    }
    uint16_t m = 0;
    for (uint32_t l = 0; l < q->g->nlevels; l++)
        m |= kvr_ckf_table_probe_key(q->g->levels[l], &q->keys[pos]);
    return m;
}

static int search(const kvr_ckf_index_t *idx, const uint64_t *seq, size_t n,
                  struct kvr_ckf_key *keys, uint8_t *have, struct kvr_match *out, size_t cap,
                  size_t *n_out)
{
    struct query q = {idx, seq, keys, have, NULL};
    memset(have, 0, n);
    size_t found = 0;
    for (size_t gi = 0; gi < idx->n_groups; gi++) {
        const struct group *g = &idx->groups[gi];
        uint16_t lanes = 0;
        for (uint32_t m = g->used; m != 0; m &= m - 1) {
            uint32_t l = (uint32_t)__builtin_ctz(m);
            if (idx->ranks[g->rank_of[l]].own.n > 0)
                lanes |= (uint16_t)(1u << l);
        }
        if (lanes == 0)
            continue;
        q.g = g;
        uint32_t depths[KVR_CKF_LANES_MAX];
        kvr_ckf_prefix_search(n, lanes, idx->cfg.window, group_probe, &q, depths);
        for (uint32_t m = lanes; m != 0; m &= m - 1) {
            uint32_t l = (uint32_t)__builtin_ctz(m);
            if (depths[l] == 0)
                continue;
            if (found < cap) {
                const struct rank *r = &idx->ranks[g->rank_of[l]];
                out[found].worker_id = r->worker_id;
                out[found].dp_rank = r->dp_rank;
                out[found].blocks = depths[l];
            }
            found++;
        }
    }
    *n_out = found;
    return found > cap ? KVR_ERANGE : KVR_OK;
}

/* Scratch for n positions: on the stack up to STACK_BLOCKS, else from a call-local allocator
 * (find_matches runs under a read lock, concurrently with other readers: it must never touch
 * the index allocator). */
struct scratch {
    uint64_t seq[STACK_BLOCKS];
    struct kvr_ckf_key keys[STACK_BLOCKS];
    uint8_t have[STACK_BLOCKS];
    kvr_alloc_t alloc;
    void *heap;
};

static int scratch_get(struct scratch *s, size_t n, uint64_t **seq, struct kvr_ckf_key **keys,
                       uint8_t **have)
{
    s->heap = NULL;
    if (n <= STACK_BLOCKS) {
        *seq = s->seq;
        *keys = s->keys;
        *have = s->have;
        return KVR_OK;
    }
    kvr_alloc_init(&s->alloc);
    size_t per = sizeof(uint64_t) + sizeof(struct kvr_ckf_key) + 1;
    if (n > SIZE_MAX / per)
        return KVR_ENOMEM;
    unsigned char *p = kvr_malloc(&s->alloc, n * per);
    if (p == NULL)
        return KVR_ENOMEM;
    s->heap = p;
    *keys = (struct kvr_ckf_key *)p;
    *seq = (uint64_t *)(p + n * sizeof(struct kvr_ckf_key));
    *have = p + n * (sizeof(struct kvr_ckf_key) + sizeof(uint64_t));
    return KVR_OK;
}

static void scratch_put(struct scratch *s)
{
    if (s->heap != NULL)
        kvr_free(&s->alloc, s->heap);
}

int kvr_ckf_index_find_matches_seq(const kvr_ckf_index_t *idx, const uint64_t *seq, size_t n,
                                   struct kvr_match *out, size_t cap, size_t *n_out)
{
    struct scratch s;
    uint64_t *unused;
    struct kvr_ckf_key *keys;
    uint8_t *have;
    *n_out = 0;
    if (n == 0)
        return KVR_OK;
    int rc = scratch_get(&s, n, &unused, &keys, &have);
    if (rc == KVR_OK)
        rc = search(idx, seq, n, keys, have, out, cap, n_out);
    scratch_put(&s);
    return rc;
}

int kvr_ckf_index_find_matches(const kvr_ckf_index_t *idx, const uint64_t *locals, size_t n,
                               unsigned flags, struct kvr_match *out, size_t cap, size_t *n_out)
{
    (void)flags; /* early_exit: every lane is computed at once anyway */
    struct scratch s;
    uint64_t *seq;
    struct kvr_ckf_key *keys;
    uint8_t *have;
    *n_out = 0;
    if (n == 0)
        return KVR_OK;
    int rc = scratch_get(&s, n, &seq, &keys, &have);
    if (rc == KVR_OK) {
        kvr_hash_chain(locals, n, seq);
        rc = search(idx, seq, n, keys, have, out, cap, n_out);
    }
    scratch_put(&s);
    return rc;
}

int kvr_ckf_index_rank_fpr(const kvr_ckf_index_t *idx, uint64_t worker_id, uint32_t dp_rank,
                           double *fpr)
{
    const struct rank *r = find_rank(idx, worker_id, dp_rank);
    if (r == NULL)
        return KVR_ENOTFOUND;
    const struct group *g = &idx->groups[r->group];
    double f = 0;
    for (uint32_t l = 0; l < g->nlevels; l++)
        f += 2.0 * (double)r->fps[l] / (double)kvr_ckf_table_buckets(g->levels[l]) / 65535.0;
    *fpr = f;
    return KVR_OK;
}

uint64_t kvr_ckf_index_blocks(const kvr_ckf_index_t *idx)
{
    return idx->st.blocks;
}

void kvr_ckf_index_stats(const kvr_ckf_index_t *idx, struct kvr_ckf_index_stats *out)
{
    *out = idx->st;
    out->ranks = idx->n_ranks;
    out->groups = idx->n_groups;
    out->levels = 0;
    out->blocks = 0;
    out->fingerprints = 0;
    out->slots = 0;
    out->filter_bytes = 0;
    for (size_t g = 0; g < idx->n_groups; g++) {
        out->levels += idx->groups[g].nlevels;
        for (uint32_t l = 0; l < idx->groups[g].nlevels; l++) {
            const kvr_ckf_table_t *t = idx->groups[g].levels[l];
            out->filter_bytes += kvr_ckf_table_words_bytes(t);
            out->slots += kvr_ckf_table_buckets(t) * KVR_CKF_SLOTS * kvr_ckf_table_lanes(t);
        }
    }
    for (size_t i = 0; i < idx->n_ranks; i++) {
        const struct rank *r = &idx->ranks[i];
        out->blocks += idx->cfg.translate ? r->ext.n : r->own.n;
        for (uint32_t l = 0; l < KVR_CKF_INDEX_LEVELS_MAX; l++)
            out->fingerprints += r->fps[l];
    }
    KVR_DEBUG_ASSERT(out->blocks == kvr_ckf_index_blocks(idx)); /* the maintained count */
    out->exact_bytes = idx->alloc.live_bytes;
}
