/* radix_int.h - internal layout of the compressed radix tree (shared by radix*.c only).
 *
 * Nodes (struct rnode below, field by field) live in fixed chunks of RNODE_CHUNK nodes, so node
 * pointers are stable and a node id (u32) names a node in 4 bytes. A node is in one of three
 * states (`live`):
 *
 *   RNODE_LIVE      linked into the tree (or inside a subtree just unlinked, not yet drained)
 *   RNODE_DETACHED  unlinked and on the drain stack: its table entries are being deleted in
 *                   bounded steps, then it is freed (radix.c "deferred frees")
 *   RNODE_WAITING   unlinked and drained, but its split child is still pending: freed with it
 *   RNODE_FREE      storage released; the struct waits on the free list (or, while a dump is
 *                   in progress, on the limbo list: never reused under a dump's queued pointers)
 *
 * Per-rank table (struct extab): ext -> (node id, pos) in 12-byte entries, Robin Hood linear
 * probing with backward-shift deletion, empty = node id 0 (the root is never a block location).
 * Entries keep a 32-bit fingerprint, not the hash: a match is confirmed against the rank's own
 * external hash of the position, which the tree holds anyway.
 *
 * Invariants checked by kvr_radix_check (radix_check.c), when no job or drain is in progress:
 *   - a rank has a table entry for (node, pos) iff it covers pos on that node (exactness);
 *   - a node with children has at least one full rank; a live node has a rank or a child;
 *   - child.depth == node.depth + node.len; child.parent == node;
 *   - a rank is never both full and cut on one node.
 * While a bounded job (remove / drop) or the drain is in progress the tree is consistent for
 * readers (find_matches, stats, dump) but exactness may not hold for the job's rank.
 */
#ifndef KVR_RADIX_INT_H
#define KVR_RADIX_INT_H

#include <stdatomic.h>
#include <stdint.h>

#include "kvr/alloc.h"
#include "kvr/radix.h"

#define RNODE_CHUNK_SHIFT 10u
#define RNODE_CHUNK (1u << RNODE_CHUNK_SHIFT)
#define KIDS_LINEAR 8u

struct kid {
    uint64_t local;  /* first local hash of the child's edge */
    struct rnode *n; /* NULL = empty table slot */
};

struct cut {
    uint32_t slot;
    uint32_t k;
};

struct ovr {
    uint32_t pos;
    uint32_t slot;
    uint64_t ext;
};

#define RNODE_FREE 0u
#define RNODE_LIVE 1u
#define RNODE_DETACHED 2u
#define RNODE_WAITING 3u

/* One node, 112 bytes:
 *
 *   loc ──▶ [ local[0] … local[len-1] | (cap-len unused) | ext[0] … ext[len-1] | … ]
 *            locals at loc[0..cap), the first storer's external hashes at loc[cap..2cap)
 */
struct rnode {
    uint64_t *loc;            /* edge: locals loc[0..len), first storer's exts loc[cap..cap+len) */
    uint32_t len;             /* edge length in blocks (>= 1; the root's is 0) */
    uint32_t cap;             /* edge capacity in blocks (leaf append grows it by 1.25x) */
    uint32_t id;              /* node id (rnode_get(t, id) == this node); 0 = the root */
    uint32_t depth;           /* absolute position of edge[0] from the root */
    struct rnode *parent;     /* tree parent (the root for top-level nodes); kept when freed */
    struct rnode *split_next; /* suffix made by this node's last split: positions >= len of table
                               * entries naming this node continue there (a child of this node,
                               * or a detached one until the drain frees it); kept when freed */
    uint64_t full0;           /* full ranks, slots 0..63: bit s = slot s holds the whole edge */
    uint64_t *fullx;          /* full ranks, slots 64..: fullx[w-1] = slots 64w..64w+63 */
    struct cut *cut;          /* cut-off ranks (slot, k): slot holds edge[0..k), 0 < k < len;
                               * unsorted, never also full */
    struct ovr *ovr;          /* (pos, slot, ext) where a rank's own external hash differs from
                               * loc[cap+pos], sorted by (pos, slot) */
    struct kid *kids;         /* children keyed by first local: an array of nkids when kids_cap
                               * <= KIDS_LINEAR, else an open-addressed table of kids_cap (power
                               * of two) slots, empty = NULL node */
    uint32_t nkids;           /* children */
    uint32_t kids_cap;        /* capacity of kids */
    uint32_t ncut;            /* entries in cut */
    uint32_t cut_cap;         /* capacity of cut */
    uint32_t novr;            /* entries in ovr */
    uint32_t ovr_cap;         /* capacity of ovr */
    uint16_t nfullx;          /* words in fullx */
    uint8_t internal;         /* sticky: set once the node has had a child (index.md §5.5) */
    uint8_t live;             /* RNODE_LIVE / _DETACHED / _WAITING / _FREE */
    uint32_t mark;            /* list link as (node id + 1), 0 = end: the drain stack while
                               * DETACHED, the free or limbo list while FREE */
};

struct tent {
    uint32_t fp;   /* high half of the seeded mix of the external hash */
    uint32_t node; /* node id; 0 = empty */
    uint32_t pos;
};

struct extab {
    struct tent *e;
    uint32_t cap; /* any size >= 8 (fastrange homes), or 0 */
    uint32_t count;
};

struct rank {
    uint64_t worker_id;
    uint32_t dp_rank;
    uint32_t in_use;
    struct extab tab; /* ext -> location; count = blocks the rank covers */
};

/* External hashes dropped implicitly by one removal event (a block cut because an earlier
 * position of its node was removed), so that naming them later in the same event is not
 * "not found". Bounded; overflow only makes the not-found count conservative. */
struct dropset {
    uint64_t h[64];
    uint32_t n;
};

/* Deferred frees (radix.c): unlinked subtrees are freed in bounded steps. */
struct drain {
    struct rnode *top; /* DETACHED nodes, a stack linked through mark (post-order walk) */
    uint32_t pos;      /* position cursor in the top node's current rank */
};

enum job_kind { JOB_NONE = 0, JOB_REMOVE = 1, JOB_DROP = 2 };

/* The bounded operation in progress (at most one; kvr_radix_step advances it). */
struct job {
    int kind;        /* enum job_kind */
    int rc;          /* result (kvr_radix_job_result) */
    uint32_t slot;   /* the rank worked on */
    uint32_t cursor; /* JOB_DROP: next table index of the rank's table */
    /* JOB_REMOVE */
    const uint64_t *hashes; /* borrowed from the caller until the job ends */
    size_t n, i;            /* hashes, next one */
    size_t missing;         /* hashes not found */
    int degraded;           /* a cutoff could not be recorded (KVR_ENOMEM) */
    struct dropset ds;
    /* JOB_DROP */
    int release;      /* unregister the rank when done (remove_rank / remove_worker) */
    int whole_worker; /* then go on with the worker's next rank */
    uint64_t worker_id;
};

struct kvr_radix {
    kvr_alloc_t alloc;
    uint64_t seed;         /* hash-table key mixing */
    struct rnode **chunks; /* node arena */
    uint32_t nchunks;
    uint32_t next_fresh;     /* first never-used node id */
    struct rnode *free_list; /* FREE nodes ready for reuse, linked through mark */
    struct rnode *limbo;     /* FREE nodes freed while a dump was active (not yet reusable) */
    struct rnode *root;
    size_t live_nodes;  /* nodes not FREE, root excluded (detached ones until drained) */
    size_t live_blocks; /* sum of len over those nodes */
    size_t block_ranks; /* sum of table counts */
    struct rank *ranks; /* slot -> rank */
    uint32_t nslots;    /* slots ever used (high-water) */
    uint32_t slots_cap;
    uint32_t nranks; /* registered ranks */
    uint32_t *rmap;  /* open-addressed (worker, dp) -> slot + 1 */
    uint32_t rmap_cap;
    uint64_t work;            /* work units done so far (kvr_radix_work) */
    struct drain drain;       /* deferred frees */
    struct job job;           /* bounded operation in progress */
    atomic_uint dumps_active; /* incremental dumps in progress (readers; see radix_dump.c) */
};

/* ---- small inline helpers shared by radix*.c -------------------------------------------- */

static inline struct rnode *rnode_get(const struct kvr_radix *t, uint32_t id)
{
    return &t->chunks[id >> RNODE_CHUNK_SHIFT][id & (RNODE_CHUNK - 1u)];
}

static inline uint64_t *rnode_ext(const struct rnode *n)
{
    return n->loc + n->cap;
}

static inline int full_has(const struct rnode *n, uint32_t slot)
{
    if (slot < 64)
        return (int)((n->full0 >> slot) & 1u);
    uint32_t w = slot / 64u;
    return w <= n->nfullx && (int)((n->fullx[w - 1] >> (slot % 64u)) & 1u);
}

static inline uint32_t cut_get(const struct rnode *n, uint32_t slot)
{
    for (uint32_t i = 0; i < n->ncut; i++)
        if (n->cut[i].slot == slot)
            return n->cut[i].k;
    return 0;
}

static inline uint32_t cover_of(const struct rnode *n, uint32_t slot)
{
    return full_has(n, slot) ? n->len : cut_get(n, slot);
}

static inline int full_any(const struct rnode *n)
{
    if (n->full0)
        return 1;
    for (uint32_t i = 0; i < n->nfullx; i++)
        if (n->fullx[i])
            return 1;
    return 0;
}

/* Word w (0-based) of the full set. */
static inline uint64_t full_word(const struct rnode *n, uint32_t w)
{
    return w == 0 ? n->full0 : (w <= n->nfullx ? n->fullx[w - 1] : 0);
}

/* The rank's own external hash of position pos (which it covers). */
uint64_t kvr_radix_ext_of(const struct rnode *n, uint32_t slot, uint32_t pos);

/* Child of n whose edge starts with `local`, or NULL. */
struct rnode *kvr_radix_kid_find(const struct kvr_radix *t, const struct rnode *n, uint64_t local);

/* Calls fn(child, arg) for every child of n (unspecified order). */
void kvr_radix_kids_each(const struct rnode *n, void (*fn)(struct rnode *, void *), void *arg);

/* Collects n's children into out[0..nkids) (caller sizes out with n->nkids). */
void kvr_radix_kids_list(const struct rnode *n, struct rnode **out);

/* Looks up ext in slot's table; returns the entry (valid until the table changes) or NULL. */
struct tent *kvr_radix_tab_find(const struct kvr_radix *t, uint32_t slot, uint64_t ext);

/* Resolves a table entry to its current (node, pos), following split chains. Does not write. */
struct rnode *kvr_radix_resolve_ro(const struct kvr_radix *t, const struct tent *e, uint32_t *pos);

#endif
