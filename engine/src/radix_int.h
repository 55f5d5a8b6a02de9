/* radix_int.h - internal layout of the compressed radix tree (shared by radix*.c only).
 *
 * Node (struct rnode), 128 bytes, allocated from fixed chunks of RNODE_CHUNK nodes so that node
 * pointers are stable and a node id (u32) names a node in 4 bytes:
 *
 *   loc ──▶ [ local[0] … local[len-1] | (cap-len unused) | ext[0] … ext[len-1] | … ]
 *            locals at loc[0..cap), the first storer's external hashes at loc[cap..2cap)
 *   len, cap         edge length / capacity (blocks)
 *   id, depth        node id; absolute position of edge[0] from the root
 *   parent           tree parent (root for top-level nodes)
 *   split_next       the suffix created by this node's last split: positions >= len of table
 *                    entries that still name this node continue there (invariant: split_next,
 *                    when set, is a child of this node)
 *   full0, fullx     full ranks: bit s = slot s (slots 0..63 inline, 64.. in fullx[nfullx])
 *   cut[ncut]        cut-off ranks (slot, k), 0 < k < len, unsorted
 *   ovr[novr]        (pos, slot, ext) where a rank's own external hash differs from loc[cap+pos],
 *                    sorted by (pos, slot)
 *   kids             children keyed by first local: an array when kids_cap <= KIDS_LINEAR, else an
 *                    open-addressed table of kids_cap (power of two) slots, empty = NULL node
 *   internal         sticky: set once the node has had a child
 *
 * Per-rank table (struct extab): ext -> (node id, pos) in 12-byte entries, Robin Hood linear
 * probing with backward-shift deletion, empty = node id 0 (the root is never a block location).
 * Entries keep a 32-bit fingerprint, not the hash: a match is confirmed against the rank's own
 * external hash of the position, which the tree holds anyway.
 *
 * Invariants checked by kvr_radix_check (radix_check.c):
 *   - a rank has a table entry for (node, pos) iff it covers pos on that node (exactness);
 *   - a node with children has at least one full rank; a live node has a rank or a child;
 *   - child.depth == node.depth + node.len; child.parent == node;
 *   - a rank is never both full and cut on one node.
 */
#ifndef KVR_RADIX_INT_H
#define KVR_RADIX_INT_H

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

struct rnode {
    uint64_t *loc;
    uint32_t len;
    uint32_t cap;
    uint32_t id;
    uint32_t depth;
    struct rnode *parent;
    struct rnode *split_next;
    uint64_t full0;
    uint64_t *fullx;
    struct cut *cut;
    struct ovr *ovr;
    struct kid *kids;
    uint32_t nkids;
    uint32_t kids_cap;
    uint32_t ncut;
    uint32_t cut_cap;
    uint32_t novr;
    uint32_t ovr_cap;
    uint16_t nfullx;
    uint8_t internal;
    uint8_t live;
    uint32_t mark; /* scratch stamp for set-like walks */
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

struct kvr_radix {
    kvr_alloc_t alloc;
    uint64_t seed;         /* hash-table key mixing */
    struct rnode **chunks; /* node arena */
    uint32_t nchunks;
    uint32_t next_fresh;     /* first never-used node id */
    struct rnode *free_list; /* freed nodes, linked through parent */
    struct rnode *root;
    size_t live_nodes;
    size_t live_blocks; /* sum of len over live nodes */
    size_t block_ranks; /* sum of table counts */
    struct rank *ranks; /* slot -> rank */
    uint32_t nslots;    /* slots ever used (high-water) */
    uint32_t slots_cap;
    uint32_t nranks; /* registered ranks */
    uint32_t *rmap;  /* open-addressed (worker, dp) -> slot + 1 */
    uint32_t rmap_cap;
    uint32_t mark_epoch;
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
uint64_t radix_ext_of(const struct rnode *n, uint32_t slot, uint32_t pos);

/* Child of n whose edge starts with `local`, or NULL. */
struct rnode *radix_kid_find(const struct kvr_radix *t, const struct rnode *n, uint64_t local);

/* Calls fn(child, arg) for every child of n (unspecified order). */
void radix_kids_each(const struct rnode *n, void (*fn)(struct rnode *, void *), void *arg);

/* Collects n's children into out[0..nkids) (caller sizes out with n->nkids). */
void radix_kids_list(const struct rnode *n, struct rnode **out);

/* Looks up ext in slot's table; returns the entry (valid until the table changes) or NULL. */
struct tent *radix_tab_find(const struct kvr_radix *t, uint32_t slot, uint64_t ext);

/* Resolves a table entry to its current (node, pos), following split chains. Does not write. */
struct rnode *radix_resolve_ro(const struct kvr_radix *t, const struct tent *e, uint32_t *pos);

#endif
