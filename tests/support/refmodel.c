/* refmodel.c - held/reachable reference model and random stream generator (see refmodel.h).
 * Deliberately simple: small sizes, linear scans where they are clearer. */
#include "refmodel.h"

#include <stdlib.h>
#include <string.h>

/* ==== a tiny u64 -> u64 map (open addressing; key 0 is reserved as "empty") =============== */

struct umap {
    uint64_t *k;
    uint64_t *v;
    size_t cap, n;
};

static uint64_t hmix(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    return x;
}

/* Keys are stored +1 so that 0 can be a real key; UINT64_MAX is not used by the generator. */
static size_t umap_slot(const struct umap *m, uint64_t key)
{
    size_t i = hmix(key) & (m->cap - 1);
    while (m->k[i] != 0 && m->k[i] != key + 1)
        i = (i + 1) & (m->cap - 1);
    return i;
}

static void umap_put(struct umap *m, uint64_t key, uint64_t val);

static void umap_grow(struct umap *m)
{
    struct umap n = {.cap = m->cap ? m->cap * 2 : 64};
    n.k = calloc(n.cap, sizeof(uint64_t));
    n.v = calloc(n.cap, sizeof(uint64_t));
    if (n.k == NULL || n.v == NULL)
        abort();
    for (size_t i = 0; i < m->cap; i++)
        if (m->k[i] != 0)
            umap_put(&n, m->k[i] - 1, m->v[i]);
    free(m->k);
    free(m->v);
    *m = n;
}

static void umap_put(struct umap *m, uint64_t key, uint64_t val)
{
    if ((m->n + 1) * 2 > m->cap)
        umap_grow(m);
    size_t i = umap_slot(m, key);
    if (m->k[i] == 0) {
        m->k[i] = key + 1;
        m->n++;
    }
    m->v[i] = val;
}

static int umap_get(const struct umap *m, uint64_t key, uint64_t *val)
{
    if (m->cap == 0)
        return 0;
    size_t i = umap_slot(m, key);
    if (m->k[i] == 0)
        return 0;
    if (val != NULL)
        *val = m->v[i];
    return 1;
}

static void umap_del(struct umap *m, uint64_t key)
{
    if (m->cap == 0)
        return;
    size_t i = umap_slot(m, key);
    if (m->k[i] == 0)
        return;
    m->k[i] = 0;
    m->n--;
    /* Re-insert the rest of the cluster. */
    size_t j = (i + 1) & (m->cap - 1);
    while (m->k[j] != 0) {
        uint64_t k = m->k[j] - 1, v = m->v[j];
        m->k[j] = 0;
        m->n--;
        umap_put(m, k, v);
        j = (j + 1) & (m->cap - 1);
    }
}

static void umap_clear(struct umap *m)
{
    free(m->k);
    free(m->v);
    memset(m, 0, sizeof(*m));
}

/* ==== model ================================================================================= */

#define ROOT_PARENT UINT64_MAX

struct ref_rank {
    uint64_t w;
    uint32_t dp;
    struct umap held;  /* ext -> parent ext (ROOT_PARENT for root chains) */
    struct umap reach; /* ext -> 1 */
};

struct ref_model {
    struct ref_rank *r;
    size_t n, cap;
};

struct ref_model *ref_new(void)
{
    struct ref_model *m = calloc(1, sizeof(*m));
    if (m == NULL)
        abort();
    return m;
}

void ref_free(struct ref_model *m)
{
    for (size_t i = 0; i < m->n; i++) {
        umap_clear(&m->r[i].held);
        umap_clear(&m->r[i].reach);
    }
    free(m->r);
    free(m);
}

static struct ref_rank *rank_of(struct ref_model *m, uint64_t w, uint32_t dp, int create)
{
    for (size_t i = 0; i < m->n; i++)
        if (m->r[i].w == w && m->r[i].dp == dp)
            return &m->r[i];
    if (!create)
        return NULL;
    if (m->n == m->cap) {
        m->cap = m->cap ? m->cap * 2 : 8;
        m->r = realloc(m->r, m->cap * sizeof(*m->r));
        if (m->r == NULL)
            abort();
    }
    struct ref_rank *r = &m->r[m->n++];
    memset(r, 0, sizeof(*r));
    r->w = w;
    r->dp = dp;
    return r;
}

int ref_store(struct ref_model *m, uint64_t w, uint32_t dp, const uint64_t *parent,
              const uint64_t *exts, size_t n)
{
    struct ref_rank *r = rank_of(m, w, dp, 1);
    int verdict = REF_MUST_ACCEPT;
    int reach = 1;
    uint64_t prev = ROOT_PARENT;
    if (parent != NULL) {
        if (!umap_get(&r->held, *parent, NULL))
            return REF_MUST_REJECT;
        if (!umap_get(&r->reach, *parent, NULL)) {
            verdict = REF_MAY_REJECT;
            reach = 0;
        }
        prev = *parent;
    }
    for (size_t i = 0; i < n; i++) {
        umap_put(&r->held, exts[i], prev);
        if (reach)
            umap_put(&r->reach, exts[i], 1);
        prev = exts[i];
    }
    return verdict;
}

/* Drops from reach every block whose chain to the root is not entirely reachable (one pass with
 * memoised walks up the parent links). */
static void prune_reach(struct ref_rank *r)
{
    struct umap memo = {0}; /* ext -> 1 valid, 2 invalid */
    size_t nkeys = 0, path_n = 0, path_cap = 64;
    uint64_t *keys = malloc((r->reach.n + 1) * sizeof(uint64_t));
    uint64_t *path = malloc(path_cap * sizeof(uint64_t));
    if (keys == NULL || path == NULL)
        abort();
    for (size_t i = 0; i < r->reach.cap; i++)
        if (r->reach.k[i] != 0)
            keys[nkeys++] = r->reach.k[i] - 1;
    for (size_t i = 0; i < nkeys; i++) {
        uint64_t x = keys[i], res = 0, parent;
        path_n = 0;
        for (;;) {
            if (umap_get(&memo, x, &res))
                break;
            if (!umap_get(&r->reach, x, NULL) || !umap_get(&r->held, x, &parent)) {
                res = 2;
                break;
            }
            if (path_n == path_cap) {
                path_cap *= 2;
                path = realloc(path, path_cap * sizeof(uint64_t));
                if (path == NULL)
                    abort();
            }
            path[path_n++] = x;
            if (parent == ROOT_PARENT) {
                res = 1;
                break;
            }
            x = parent;
        }
        for (size_t j = 0; j < path_n; j++)
            umap_put(&memo, path[j], res);
    }
    for (size_t i = 0; i < nkeys; i++) {
        uint64_t res = 0;
        if (umap_get(&memo, keys[i], &res) && res == 2)
            umap_del(&r->reach, keys[i]);
    }
    umap_clear(&memo);
    free(keys);
    free(path);
}

void ref_remove(struct ref_model *m, uint64_t w, uint32_t dp, const uint64_t *exts, size_t n)
{
    struct ref_rank *r = rank_of(m, w, dp, 0);
    if (r == NULL)
        return;
    for (size_t i = 0; i < n; i++) {
        umap_del(&r->held, exts[i]);
        umap_del(&r->reach, exts[i]);
    }
    prune_reach(r);
}

void ref_clear(struct ref_model *m, uint64_t w, uint32_t dp)
{
    struct ref_rank *r = rank_of(m, w, dp, 0);
    if (r == NULL)
        return;
    umap_clear(&r->held);
    umap_clear(&r->reach);
}

void ref_remove_worker(struct ref_model *m, uint64_t w)
{
    for (size_t i = 0; i < m->n; i++)
        if (m->r[i].w == w)
            ref_clear(m, w, m->r[i].dp);
}

void ref_forget_reach(struct ref_model *m, uint64_t w, uint32_t dp)
{
    struct ref_rank *r = rank_of(m, w, dp, 0);
    if (r != NULL)
        umap_clear(&r->reach);
}

void ref_bounds(const struct ref_model *m, uint64_t w, uint32_t dp, const uint64_t *exts, size_t n,
                size_t *held_len, size_t *reach_len)
{
    *held_len = *reach_len = 0;
    struct ref_rank *r = rank_of((struct ref_model *)m, w, dp, 0);
    if (r == NULL)
        return;
    size_t i = 0;
    while (i < n && umap_get(&r->held, exts[i], NULL))
        i++;
    *held_len = i;
    i = 0;
    while (i < n && umap_get(&r->reach, exts[i], NULL))
        i++;
    *reach_len = i;
}

/* ==== generator ============================================================================= */

#define MAX_DOCS 48
#define ALPHABET 12
/* GEN_MAX_DOC_LEN (refmodel.h) caps every document, so fixed per-document buffers suffice. */

struct doc {
    uint64_t *loc;
    size_t n, cap;
};

struct gen {
    uint64_t rng;
    int uniform;
    struct ref_model *m;
    struct doc docs[MAX_DOCS];
    size_t ndocs;
    struct gen_rank ranks[64];
    size_t nranks;
    int active[64];
    uint64_t next_worker;
    uint64_t event_id;
    /* buffers for the current op */
    struct kvr_block *blk;
    uint64_t *hashes;
    size_t buf_cap;
};

uint64_t gen_rand(struct gen *g)
{
    uint64_t z = (g->rng += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static size_t rnd(struct gen *g, size_t n)
{
    return (size_t)(gen_rand(g) % n);
}

uint64_t test_seed(uint64_t def)
{
    const char *s = getenv("KVR_TEST_SEED");
    return s ? strtoull(s, NULL, 0) : def;
}

static void doc_push(struct doc *d, uint64_t l)
{
    if (d->n == d->cap) {
        d->cap = d->cap ? d->cap * 2 : 16;
        d->loc = realloc(d->loc, d->cap * sizeof(uint64_t));
        if (d->loc == NULL)
            abort();
    }
    d->loc[d->n++] = l;
}

static void new_doc(struct gen *g)
{
    struct doc *d = &g->docs[g->ndocs];
    memset(d, 0, sizeof(*d));
    /* Share a prefix of an existing doc half of the time. */
    if (g->ndocs > 0 && rnd(g, 2) == 0) {
        const struct doc *src = &g->docs[rnd(g, g->ndocs)];
        size_t k = 1 + rnd(g, src->n);
        for (size_t i = 0; i < k; i++)
            doc_push(d, src->loc[i]);
    }
    size_t len = 2 + rnd(g, 6);
    if (g->ndocs % 4 == 3)
        len *= 4;
    if (len > GEN_MAX_DOC_LEN - d->n)
        len = GEN_MAX_DOC_LEN - d->n; /* a copied prefix may already be near the cap */
    for (size_t i = 0; i < len; i++)
        doc_push(d, 1 + rnd(g, ALPHABET));
    g->ndocs++;
}

static uint64_t chain_step(uint64_t prev, uint64_t local)
{
    return hmix(prev * 0x100000001B3ull ^ hmix(local + 0x51ED27));
}

void gen_exts_of(const struct gen *g, const struct gen_rank *r, const uint64_t *loc, size_t n,
                 uint64_t *out)
{
    uint64_t h = 0x1337;
    for (size_t i = 0; i < n; i++) {
        h = chain_step(h, loc[i]);
        uint64_t e = g->uniform ? h : hmix(h ^ r->salt);
        if (e == UINT64_MAX)
            e = 1;
        out[i] = e;
    }
}

void gen_exts(const struct gen *g, const struct gen_rank *r, size_t d, uint64_t *out)
{
    gen_exts_of(g, r, g->docs[d].loc, g->docs[d].n, out);
}

uint64_t gen_alphabet(void)
{
    return ALPHABET;
}

static void add_rank(struct gen *g, uint64_t w, uint32_t dp)
{
    if (g->nranks == 64)
        return;
    struct gen_rank *r = &g->ranks[g->nranks];
    r->worker_id = w;
    r->dp_rank = dp;
    r->salt = gen_rand(g);
    g->active[g->nranks] = 1;
    g->nranks++;
}

static void add_worker(struct gen *g, uint64_t w)
{
    uint32_t ndp = 1 + (uint32_t)rnd(g, 2);
    for (uint32_t dp = 0; dp < ndp; dp++)
        add_rank(g, w, dp);
}

struct gen *gen_new(uint64_t seed, int uniform_ext)
{
    struct gen *g = calloc(1, sizeof(*g));
    if (g == NULL)
        abort();
    g->rng = seed;
    g->uniform = uniform_ext;
    g->m = ref_new();
    size_t nw = 2 + rnd(g, 3);
    for (size_t w = 0; w < nw; w++)
        add_worker(g, ++g->next_worker);
    for (int i = 0; i < 12; i++)
        new_doc(g);
    return g;
}

void gen_free(struct gen *g)
{
    for (size_t i = 0; i < g->ndocs; i++)
        free(g->docs[i].loc);
    free(g->blk);
    free(g->hashes);
    ref_free(g->m);
    free(g);
}

struct ref_model *gen_model(struct gen *g)
{
    return g->m;
}

size_t gen_ndocs(const struct gen *g)
{
    return g->ndocs;
}

const uint64_t *gen_doc(const struct gen *g, size_t d, size_t *n)
{
    *n = g->docs[d].n;
    return g->docs[d].loc;
}

const struct gen_rank *gen_ranks(const struct gen *g, size_t *n)
{
    *n = g->nranks;
    return g->ranks;
}

static void ensure_buf(struct gen *g, size_t n)
{
    if (n <= g->buf_cap)
        return;
    g->buf_cap = n * 2;
    g->blk = realloc(g->blk, g->buf_cap * sizeof(*g->blk));
    g->hashes = realloc(g->hashes, g->buf_cap * sizeof(*g->hashes));
    if (g->blk == NULL || g->hashes == NULL)
        abort();
}

static size_t pick_active(struct gen *g)
{
    for (;;) {
        size_t i = rnd(g, g->nranks);
        if (g->active[i])
            return i;
    }
}

/* A store of doc d positions [s, e) by rank ri. */
static void make_store(struct gen *g, struct gen_op *op, size_t ri, size_t d, size_t s, size_t e)
{
    const struct gen_rank *r = &g->ranks[ri];
    uint64_t exts[GEN_MAX_DOC_LEN];
    gen_exts(g, r, d, exts);
    ensure_buf(g, e - s);
    for (size_t i = s; i < e; i++) {
        g->blk[i - s].tokens_hash = g->docs[d].loc[i];
        g->blk[i - s].block_hash = exts[i];
    }
    memset(op, 0, sizeof(*op));
    op->kind = GEN_EVENT;
    op->ev.kind = KVR_EVENT_STORED;
    op->ev.worker_id = r->worker_id;
    op->ev.dp_rank = r->dp_rank;
    op->ev.event_id = g->event_id++;
    op->ev.n = (uint32_t)(e - s);
    op->ev.blocks = g->blk;
    if (s > 0) {
        op->ev.has_parent = 1;
        op->ev.parent_hash = exts[s - 1];
    }
    op->expect = ref_store(g->m, r->worker_id, r->dp_rank, s > 0 ? &op->ev.parent_hash : NULL,
                           &exts[s], e - s);
}

static void make_remove(struct gen *g, struct gen_op *op, size_t ri)
{
    const struct gen_rank *r = &g->ranks[ri];
    uint64_t exts[GEN_MAX_DOC_LEN], exts2[GEN_MAX_DOC_LEN];
    size_t d = rnd(g, g->ndocs), n = g->docs[d].n, k = 0;
    gen_exts(g, r, d, exts);
    ensure_buf(g, 2 * GEN_MAX_DOC_LEN);
    size_t style = rnd(g, 4);
    if (style == 0) { /* tail run */
        size_t from = rnd(g, n);
        for (size_t i = from; i < n; i++)
            g->hashes[k++] = exts[i];
    } else if (style == 1) { /* head run */
        size_t to = 1 + rnd(g, n);
        for (size_t i = 0; i < to; i++)
            g->hashes[k++] = exts[i];
    } else if (style == 2) { /* single mid-chain block */
        g->hashes[k++] = exts[rnd(g, n)];
    } else { /* random subset */
        for (size_t i = 0; i < n; i++)
            if (rnd(g, 3) == 0)
                g->hashes[k++] = exts[i];
    }
    if (rnd(g, 100) < 15) { /* spanning two sequences */
        size_t d2 = rnd(g, g->ndocs), n2 = g->docs[d2].n;
        gen_exts(g, r, d2, exts2);
        size_t from = rnd(g, n2);
        for (size_t i = from; i < n2; i++)
            g->hashes[k++] = exts2[i];
    }
    size_t order = rnd(g, 3);
    if (order == 0) { /* reversed */
        for (size_t i = 0; i < k / 2; i++) {
            uint64_t x = g->hashes[i];
            g->hashes[i] = g->hashes[k - 1 - i];
            g->hashes[k - 1 - i] = x;
        }
    } else if (order == 1) { /* shuffled */
        for (size_t i = k; i > 1; i--) {
            size_t j = rnd(g, i);
            uint64_t x = g->hashes[i - 1];
            g->hashes[i - 1] = g->hashes[j];
            g->hashes[j] = x;
        }
    }
    memset(op, 0, sizeof(*op));
    op->kind = GEN_EVENT;
    op->ev.kind = KVR_EVENT_REMOVED;
    op->ev.worker_id = r->worker_id;
    op->ev.dp_rank = r->dp_rank;
    op->ev.event_id = g->event_id++;
    op->ev.n = (uint32_t)k;
    op->ev.hashes = g->hashes;
    ref_remove(g->m, r->worker_id, r->dp_rank, g->hashes, k);
}

/* Length of the rank's held prefix of doc d (per the model). */
static size_t held_prefix(struct gen *g, size_t ri, size_t d, size_t *reach)
{
    uint64_t exts[GEN_MAX_DOC_LEN];
    size_t held;
    gen_exts(g, &g->ranks[ri], d, exts);
    ref_bounds(g->m, g->ranks[ri].worker_id, g->ranks[ri].dp_rank, exts, g->docs[d].n, &held,
               reach);
    return held;
}

void gen_next(struct gen *g, struct gen_op *op)
{
    size_t x = rnd(g, 100);
    size_t ri = pick_active(g);
    const struct gen_rank *r = &g->ranks[ri];
    if (x < 40) {
        /* Store from the held prefix: extend from the reachable end, re-store a hole, or
         * duplicate; sometimes only the first part (a split store). */
        size_t d = rnd(g, g->ndocs), n = g->docs[d].n, reach;
        size_t held = held_prefix(g, ri, d, &reach);
        size_t s;
        size_t kind = rnd(g, 3);
        if (kind == 0)
            s = reach;
        else if (kind == 1)
            s = held < n ? held : rnd(g, n);
        else
            s = rnd(g, n);
        if (s >= n)
            s = rnd(g, n);
        size_t e = n;
        if (rnd(g, 100) < 30 && n - s > 1)
            e = s + 1 + rnd(g, n - s - 1);
        make_store(g, op, ri, d, s, e);
    } else if (x < 52) {
        /* Decode extension: a document grows by 1-2 blocks and the rank stores the tail. */
        size_t d = rnd(g, g->ndocs);
        if (g->docs[d].n < 400) { /* stays under GEN_MAX_DOC_LEN */
            size_t add = 1 + rnd(g, 2);
            for (size_t i = 0; i < add; i++)
                doc_push(&g->docs[d], 1 + rnd(g, ALPHABET));
        }
        size_t n = g->docs[d].n, reach;
        (void)held_prefix(g, ri, d, &reach);
        size_t s = reach < n ? reach : n - 1;
        make_store(g, op, ri, d, s, n);
        if (g->ndocs < MAX_DOCS && rnd(g, 10) == 0)
            new_doc(g);
    } else if (x < 94) {
        make_remove(g, op, ri);
    } else if (x < 97) {
        memset(op, 0, sizeof(*op));
        op->kind = GEN_EVENT;
        op->ev.kind = KVR_EVENT_CLEARED;
        op->ev.worker_id = r->worker_id;
        op->ev.dp_rank = r->dp_rank;
        op->ev.event_id = g->event_id++;
        ref_clear(g->m, r->worker_id, r->dp_rank);
    } else if (x < 99) {
        memset(op, 0, sizeof(*op));
        op->kind = GEN_REMOVE_RANK;
        op->worker_id = r->worker_id;
        op->dp_rank = r->dp_rank;
        ref_clear(g->m, r->worker_id, r->dp_rank);
    } else {
        memset(op, 0, sizeof(*op));
        op->kind = GEN_REMOVE_WORKER;
        op->worker_id = r->worker_id;
        ref_remove_worker(g->m, r->worker_id);
        /* The worker returns under the same id (its ranks stay active) or a fresh one. */
        if (rnd(g, 2) == 0) {
            for (size_t i = 0; i < g->nranks; i++)
                if (g->ranks[i].worker_id == op->worker_id)
                    g->active[i] = 0;
            add_worker(g, ++g->next_worker);
        }
    }
}
