/* radix_dump.c - the tree as events (index.md §8) and its canonical shape text.
 *
 * Dump: breadth-first from the root. A chain of clean pass-through nodes (no cutoffs, one live
 * child with no cutoffs and the same non-empty full set) becomes one event per rank. Ranks are
 * credited below a chain only if they are full on it AND were credited on its parent chain
 * (parent_ranks filter), and each rank's event carries its OWN external hashes, so a replay
 * keeps the rank's later removals working.
 *
 * Incremental dumps (kvr_radix_dump_begin/step/end) run this same breadth-first walk in steps
 * under the caller's read lock and keep only the queue between steps: node pointers (checked
 * before use: still live and still attached under the root; node structs are not reused while a
 * dump is registered in t->dumps_active, see radix.c "node arena") and, per queued child, the
 * parent chain's credited ranks by (slot, worker, dp_rank) with their external hash of the
 * parent block, so a slot reused by another rank meanwhile is not credited.
 *
 * Everything here is read-only on the tree (except the dumps_active counter) and allocates with
 * plain malloc (never through the tree's allocator, which belongs to the writer).
 */
#include "radix_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvr/err.h"

/* ==== dump ================================================================================== */

struct parent_ext {
    uint32_t slot;
    uint32_t dp_rank; /* the rank's identity when the parent was emitted */
    uint64_t worker_id;
    uint64_t ext;
};

struct qitem {
    struct rnode *start;
    struct parent_ext *ph; /* sorted by slot; NULL with all_ranks = root (null parents) */
    uint32_t nph;
    int all_ranks;
};

struct queue {
    struct qitem *q;
    size_t head, tail, cap;
};

static int queue_push(struct queue *q, struct qitem it)
{
    if (q->tail == q->cap) {
        if (q->head > 0) {
            memmove(q->q, q->q + q->head, (q->tail - q->head) * sizeof(*q->q));
            q->tail -= q->head;
            q->head = 0;
        }
        if (q->tail == q->cap) {
            size_t cap = q->cap ? q->cap * 2 : 64;
            struct qitem *n = realloc(q->q, cap * sizeof(*n));
            if (n == NULL)
                return KVR_ENOMEM;
            q->q = n;
            q->cap = cap;
        }
    }
    q->q[q->tail++] = it;
    return KVR_OK;
}

static int live_node(const struct rnode *n)
{
    return n->nkids > 0 || full_any(n) || n->ncut > 0;
}

static int cmp_first_local(const void *a, const void *b)
{
    const struct rnode *x = *(struct rnode *const *)a, *y = *(struct rnode *const *)b;
    return x->loc[0] < y->loc[0] ? -1 : x->loc[0] > y->loc[0];
}

/* Live children of n sorted by first local, into a malloc'd array (*out, owned by the caller);
 * returns the count or (size_t)-1 on allocation failure. */
static size_t live_children(const struct rnode *n, struct rnode ***out)
{
    *out = NULL;
    if (n->nkids == 0)
        return 0;
    struct rnode **all = malloc(n->nkids * sizeof(*all));
    if (all == NULL)
        return (size_t)-1;
    kvr_radix_kids_list(n, all);
    size_t k = 0;
    for (uint32_t i = 0; i < n->nkids; i++)
        if (live_node(all[i]))
            all[k++] = all[i];
    qsort(all, k, sizeof(*all), cmp_first_local);
    *out = all;
    return k;
}

static int same_full(const struct rnode *a, const struct rnode *b)
{
    uint32_t words = 1u + (a->nfullx > b->nfullx ? a->nfullx : b->nfullx);
    for (uint32_t w = 0; w < words; w++)
        if (full_word(a, w) != full_word(b, w))
            return 0;
    return 1;
}

/* Whether n and its single live child form a clean pass-through (index.md §8 can_merge). */
static struct rnode *merge_next(const struct rnode *n)
{
    if (n->ncut != 0 || !full_any(n))
        return NULL;
    struct rnode **kids;
    size_t k = live_children(n, &kids);
    struct rnode *next = NULL;
    if (k == 1 && kids[0]->ncut == 0 && same_full(n, kids[0]))
        next = kids[0];
    free(kids);
    return next;
}

/* The parent entry of slot, if the parent chain credited the rank that holds the slot now. */
static const struct parent_ext *ph_find(const struct kvr_radix *t, const struct qitem *it,
                                        uint32_t slot)
{
    uint32_t lo = 0, hi = it->nph;
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (it->ph[mid].slot < slot)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo == it->nph || it->ph[lo].slot != slot)
        return NULL;
    const struct rank *r = &t->ranks[slot];
    if (r->worker_id != it->ph[lo].worker_id || r->dp_rank != it->ph[lo].dp_rank)
        return NULL;
    return &it->ph[lo];
}

/* Emits one stored event for slot over the first `count` positions of the chain. */
static int emit_event(const struct kvr_radix *t, struct kvr_event_list *out, uint64_t *event_id,
                      uint32_t slot, const struct qitem *it, struct rnode *const *chain,
                      size_t nchain, uint32_t count, size_t *emitted)
{
    struct kvr_event *ev;
    if (kvr_event_list_emplace(out, KVR_EVENT_STORED, count, &ev) != KVR_OK)
        return KVR_ENOMEM;
    *emitted += count;
    const struct rank *r = &t->ranks[slot];
    ev->worker_id = r->worker_id;
    ev->dp_rank = r->dp_rank;
    ev->event_id = (*event_id)++;
    ev->tier = KVR_TIER_DEVICE;
    if (!it->all_ranks) {
        const struct parent_ext *p = ph_find(t, it, slot);
        ev->has_parent = 1;
        ev->parent_hash = p ? p->ext : 0;
    }
    uint32_t k = 0;
    for (size_t c = 0; c < nchain && k < count; c++) {
        const struct rnode *n = chain[c];
        for (uint32_t pos = 0; pos < n->len && k < count; pos++, k++) {
            ev->blocks[k].tokens_hash = n->loc[pos];
            ev->blocks[k].block_hash = kvr_radix_ext_of(n, slot, pos);
        }
    }
    return KVR_OK;
}

static int in_parent_ranks(const struct kvr_radix *t, const struct qitem *it, uint32_t slot)
{
    return it->all_ranks || ph_find(t, it, slot) != NULL;
}

static int cmp_cut_slot(const void *a, const void *b)
{
    const struct cut *x = a, *y = b;
    return x->slot < y->slot ? -1 : x->slot > y->slot;
}

/* Processes one queue item: emits its chain and queues the children. */
static int dump_item(const struct kvr_radix *t, struct kvr_event_list *out, uint64_t *event_id,
                     struct queue *q, const struct qitem *it, struct rnode ***chain_buf,
                     size_t *chain_cap, size_t *emitted)
{
    size_t nchain = 0;
    uint32_t total = 0;
    struct rnode *cur = it->start;
    for (;;) {
        if (!live_node(cur))
            break;
        if (nchain == *chain_cap) {
            size_t cap = *chain_cap ? *chain_cap * 2 : 16;
            struct rnode **c = realloc(*chain_buf, cap * sizeof(*c));
            if (c == NULL)
                return KVR_ENOMEM;
            *chain_buf = c;
            *chain_cap = cap;
        }
        (*chain_buf)[nchain++] = cur;
        total += cur->len;
        struct rnode *next = merge_next(cur);
        if (next == NULL)
            break;
        cur = next;
    }
    if (nchain == 0)
        return KVR_OK;
    struct rnode *last = (*chain_buf)[nchain - 1];
    /* Full ranks (filtered by the parent chain's ranks), in slot order. */
    uint32_t words = 1u + last->nfullx;
    struct parent_ext *sent = NULL;
    uint32_t nsent = 0;
    for (uint32_t w = 0; w < words; w++) {
        uint64_t bits = full_word(last, w);
        while (bits) {
            uint32_t slot = w * 64u + (uint32_t)__builtin_ctzll(bits);
            bits &= bits - 1u;
            if (!t->ranks[slot].in_use || !in_parent_ranks(t, it, slot))
                continue;
            if (emit_event(t, out, event_id, slot, it, *chain_buf, nchain, total, emitted) !=
                KVR_OK)
                goto nomem;
            struct parent_ext *s = realloc(sent, (nsent + 1u) * sizeof(*s));
            if (s == NULL)
                goto nomem;
            sent = s;
            sent[nsent].slot = slot;
            sent[nsent].dp_rank = t->ranks[slot].dp_rank;
            sent[nsent].worker_id = t->ranks[slot].worker_id;
            sent[nsent].ext = kvr_radix_ext_of(last, slot, last->len - 1u);
            nsent++;
        }
    }
    /* Cut-off ranks (only a single-node chain can have them). */
    if (last->ncut > 0) {
        struct cut *cuts = malloc(last->ncut * sizeof(*cuts));
        if (cuts == NULL)
            goto nomem;
        memcpy(cuts, last->cut, last->ncut * sizeof(*cuts));
        qsort(cuts, last->ncut, sizeof(*cuts), cmp_cut_slot);
        for (uint32_t i = 0; i < last->ncut; i++) {
            if (!t->ranks[cuts[i].slot].in_use || !in_parent_ranks(t, it, cuts[i].slot))
                continue;
            if (emit_event(t, out, event_id, cuts[i].slot, it, *chain_buf, nchain, cuts[i].k,
                           emitted) != KVR_OK) {
                free(cuts);
                goto nomem;
            }
        }
        free(cuts);
    }
    if (nsent == 0) {
        free(sent);
        return KVR_OK;
    }
    struct rnode **kids;
    size_t k = live_children(last, &kids);
    if (k == (size_t)-1)
        goto nomem;
    for (size_t i = 0; i < k; i++) {
        struct parent_ext *ph = malloc(nsent * sizeof(*ph));
        if (ph == NULL) {
            free(kids);
            goto nomem;
        }
        memcpy(ph, sent, nsent * sizeof(*ph));
        struct qitem child = {.start = kids[i], .ph = ph, .nph = nsent, .all_ranks = 0};
        if (queue_push(q, child) != KVR_OK) {
            free(ph);
            free(kids);
            goto nomem;
        }
    }
    free(kids);
    free(sent);
    return KVR_OK;
nomem:
    free(sent);
    return KVR_ENOMEM;
}

struct kvr_radix_dump {
    struct queue q;
    struct rnode **chain; /* scratch for one chain */
    size_t chain_cap;
    uint64_t event_id;
};

/* Whether a queued node can still be used: live and attached under the root (a subtree
 * unlinked since keeps LIVE nodes below its DETACHED or FREE top until it is drained). */
static int usable(const struct kvr_radix *t, const struct rnode *n)
{
    for (const struct rnode *x = n; x != t->root; x = x->parent)
        if (x->live != RNODE_LIVE)
            return 0;
    return 1;
}

static int dump_open(const struct kvr_radix *t, struct kvr_radix_dump *d)
{
    struct rnode **roots;
    size_t k = live_children(t->root, &roots);
    int rc = KVR_OK;
    if (k == (size_t)-1)
        return KVR_ENOMEM;
    for (size_t i = 0; i < k && rc == KVR_OK; i++)
        rc = queue_push(&d->q, (struct qitem){.start = roots[i], .all_ranks = 1});
    free(roots);
    return rc;
}

static int dump_run(const struct kvr_radix *t, struct kvr_radix_dump *d, struct kvr_event_list *out,
                    size_t budget, int *done)
{
    size_t emitted = 0;
    int rc = KVR_OK;
    while (rc == KVR_OK && d->q.head < d->q.tail && emitted < budget) {
        struct qitem it = d->q.q[d->q.head++];
        if (usable(t, it.start))
            rc = dump_item(t, out, &d->event_id, &d->q, &it, &d->chain, &d->chain_cap, &emitted);
        free(it.ph);
    }
    *done = d->q.head == d->q.tail;
    return rc;
}

static void dump_close(struct kvr_radix_dump *d)
{
    while (d->q.head < d->q.tail)
        free(d->q.q[d->q.head++].ph);
    free(d->q.q);
    free(d->chain);
}

int kvr_radix_dump_begin(kvr_radix_t *t, kvr_radix_dump_t **out)
{
    struct kvr_radix_dump *d = calloc(1, sizeof(*d));
    *out = NULL;
    if (d == NULL)
        return KVR_ENOMEM;
    atomic_fetch_add_explicit(&t->dumps_active, 1u, memory_order_acq_rel);
    *out = d;
    return dump_open(t, d);
}

int kvr_radix_dump_step(const kvr_radix_t *t, kvr_radix_dump_t *d, struct kvr_event_list *out,
                        size_t budget, int *done)
{
    return dump_run(t, d, out, budget, done);
}

void kvr_radix_dump_end(kvr_radix_t *t, kvr_radix_dump_t *d)
{
    if (d == NULL)
        return;
    dump_close(d);
    /* every dump kvr_radix_dump_begin created is counted in t->dumps_active */
    atomic_fetch_sub_explicit(&t->dumps_active, 1u, memory_order_acq_rel);
    free(d);
}

int kvr_radix_dump(const kvr_radix_t *t, struct kvr_event_list *out)
{
    /* One go under one lock hold: nothing can change in between, so no registration. */
    struct kvr_radix_dump d;
    int done = 0;
    memset(&d, 0, sizeof(d));
    int rc = dump_open(t, &d);
    if (rc == KVR_OK)
        rc = dump_run(t, &d, out, SIZE_MAX, &done);
    dump_close(&d);
    return rc;
}

/* ==== shape ================================================================================= */

struct sbuf {
    char *buf;
    size_t len;
    size_t need;
};

static void sb_put(struct sbuf *b, const char *s, size_t n)
{
    if (b->need < b->len) {
        size_t room = b->len - b->need - 1u;
        memcpy(b->buf + b->need, s, n < room ? n : room);
        b->buf[b->need + (n < room ? n : room)] = '\0';
    }
    b->need += n;
}

static void sb_fmt_u64(struct sbuf *b, uint64_t v)
{
    char tmp[24];
    int n = snprintf(tmp, sizeof(tmp), "%llu", (unsigned long long)v);
    sb_put(b, tmp, (size_t)n);
}

struct rank_key {
    uint64_t worker;
    uint32_t dp;
    uint32_t k;
};

static int cmp_rank_key(const void *a, const void *b)
{
    const struct rank_key *x = a, *y = b;
    if (x->worker != y->worker)
        return x->worker < y->worker ? -1 : 1;
    return x->dp < y->dp ? -1 : x->dp > y->dp;
}

static void shape_ranks(const struct kvr_radix *t, const struct rnode *n, struct sbuf *b)
{
    size_t cap = 64u * (1u + n->nfullx) + n->ncut;
    struct rank_key *keys = malloc(cap * sizeof(*keys));
    size_t nf = 0, nc = 0;
    if (keys == NULL)
        return;
    for (uint32_t w = 0; w <= n->nfullx; w++) {
        uint64_t bits = full_word(n, w);
        while (bits) {
            uint32_t slot = w * 64u + (uint32_t)__builtin_ctzll(bits);
            bits &= bits - 1u;
            keys[nf++] = (struct rank_key){t->ranks[slot].worker_id, t->ranks[slot].dp_rank, 0};
        }
    }
    for (uint32_t i = 0; i < n->ncut; i++) {
        const struct rank *r = &t->ranks[n->cut[i].slot];
        keys[nf + nc++] = (struct rank_key){r->worker_id, r->dp_rank, n->cut[i].k};
    }
    qsort(keys, nf, sizeof(*keys), cmp_rank_key);
    qsort(keys + nf, nc, sizeof(*keys), cmp_rank_key);
    sb_put(b, "{", 1);
    for (size_t i = 0; i < nf + nc; i++) {
        if (i == nf)
            sb_put(b, "|", 1);
        else if (i > 0)
            sb_put(b, ",", 1);
        sb_fmt_u64(b, keys[i].worker);
        sb_put(b, ":", 1);
        sb_fmt_u64(b, keys[i].dp);
        if (i >= nf) {
            sb_put(b, "=", 1);
            sb_fmt_u64(b, keys[i].k);
        }
    }
    if (nc == 0 && nf == 0)
        sb_put(b, "", 0);
    sb_put(b, "}", 1);
    free(keys);
}

static void shape_node(const struct kvr_radix *t, const struct rnode *n, struct sbuf *b);

static void shape_kids(const struct kvr_radix *t, const struct rnode *n, struct sbuf *b)
{
    struct rnode **kids = malloc((n->nkids ? n->nkids : 1u) * sizeof(*kids));
    if (kids == NULL)
        return;
    kvr_radix_kids_list(n, kids);
    qsort(kids, n->nkids, sizeof(*kids), cmp_first_local);
    for (uint32_t i = 0; i < n->nkids; i++) {
        if (i > 0)
            sb_put(b, ",", 1);
        shape_node(t, kids[i], b);
    }
    free(kids);
}

static void shape_node(const struct kvr_radix *t, const struct rnode *n, struct sbuf *b)
{
    sb_put(b, "[", 1);
    for (uint32_t i = 0; i < n->len; i++) {
        if (i > 0)
            sb_put(b, ",", 1);
        sb_fmt_u64(b, n->loc[i]);
    }
    sb_put(b, "]", 1);
    shape_ranks(t, n, b);
    if (n->nkids > 0) {
        sb_put(b, "->(", 3);
        shape_kids(t, n, b);
        sb_put(b, ")", 1);
    }
}

size_t kvr_radix_shape(const kvr_radix_t *t, char *buf, size_t len)
{
    struct sbuf b = {.buf = buf, .len = len, .need = 0};
    if (buf != NULL && len > 0)
        buf[0] = '\0';
    shape_kids(t, t->root, &b);
    return b.need;
}
