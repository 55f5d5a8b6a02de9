/* radix.h - the compressed radix tree of KV blocks (spec/index.md §4-§8).
 *
 * What it stores: which rank (worker_id, dp_rank) holds which KV block, as a prefix tree over
 * LOCAL block hashes. Each node carries an edge: a run of blocks that every full holder holds as
 * a whole.
 *
 *   root
 *    └─[L1 L2 L3]  full{A,B} cut{C:1}         edge = local hashes (+ the first storer's external
 *        ├─[L4 L5] full{A}                    hashes); a full rank holds the whole edge, a cut
 *        └─[L9]    full{B}                    rank C:k holds edge[0..k)
 *
 * Rules (index.md §5): a store under parent P splits P's edge at P's position + 1 unless the new
 * blocks repeat the edge (Reuse) or extend a leaf (leaf append, downgrading other full ranks to a
 * cutoff); a node that has ever had a child is `internal` (sticky) and never leaf-extends; a node
 * left with no full rank unlinks its subtree; nodes never merge. Matching walks from the root,
 * intersects the set of surviving ranks at every node (always, whatever the set sizes) and scores
 * cut-off ranks min(cutoff, matched).
 *
 * Ownership by external hash: each rank has its own table  ext -> (node, position). Engines may
 * publish different external hashes for identical content, so a rank's own hashes are kept
 * (positions where it differs from the edge's are recorded per node) and dumped as they came.
 * Invariant: a rank has a table entry for (node, pos) iff it covers pos on that node; so removals,
 * clears and worker removal find every bit they must clear, and rank slots are reusable at once.
 *
 *   node layout (struct kvr_radix_node, radix_node.h): edge locals[len] + exts[len] in one block;
 *   full-rank bitmap (64 inline bits + extension words); cutoffs[(slot,k)]; children keyed by the
 *   first local hash (inline array up to 8, open-addressed table above); parent id; split_next
 *   (the node holding the positions this edge had before its last split, so table entries written
 *   before a split stay valid and are re-pointed lazily on their next use).
 *
 * Thread-safety: none. A kvr_radix_t is used by one thread at a time, or under the rwlock of a
 * kvr_index_t (reads: find_matches/stats/dump; writes: everything else).
 * Allocation failure: every mutating call returns KVR_ENOMEM and leaves the tree consistent
 * (some blocks of the failing event may be applied, never half a block).
 */
#ifndef KVR_RADIX_H
#define KVR_RADIX_H

#include <stddef.h>
#include <stdint.h>

#include "kvr/alloc.h"
#include "kvr/event.h"
#include "kvr/match.h"

typedef struct kvr_radix kvr_radix_t;

struct kvr_radix_stats {
    size_t nodes;       /* live nodes, root excluded */
    size_t blocks;      /* blocks in live edges (tree positions) */
    size_t block_ranks; /* (block, rank) ownership entries = sum of per-rank blocks */
    size_t ranks;       /* registered ranks */
    size_t bytes;       /* bytes held by the tree (kvr_alloc accounting) */
    size_t peak_bytes;
};

struct kvr_rank_blocks {
    uint64_t worker_id;
    uint32_t dp_rank;
    uint32_t pad_;
    uint64_t blocks; /* blocks the rank currently covers */
};

/* Creates an empty tree. *out is owned (free with kvr_radix_free). Returns KVR_OK or KVR_ENOMEM. */
int kvr_radix_new(kvr_radix_t **out);
void kvr_radix_free(kvr_radix_t *t);

/* The tree's allocator (for failure injection in tests and byte counts). Borrowed. */
kvr_alloc_t *kvr_radix_allocator(kvr_radix_t *t);

/* Stores a chain of n blocks (borrowed) for a rank under `parent` (NULL = from the root).
 * Returns KVR_OK; KVR_EPARENT if the rank does not hold/cover the parent (nothing applied);
 * KVR_EINVALSEQ if the chain re-uses one of the rank's live external hashes at another position
 * (blocks before it stay applied); KVR_ENOMEM (tree consistent, a prefix may be applied);
 * KVR_EINVAL if n == 0. A repeated store of held blocks is not an error. */
int kvr_radix_store(kvr_radix_t *t, uint64_t worker_id, uint32_t dp_rank, const uint64_t *parent,
                    const struct kvr_block *blocks, size_t n);

/* Removes n blocks (external hashes, borrowed, any order) of a rank. Blocks the rank does not
 * hold are skipped and counted in *not_found (may be NULL). Returns KVR_OK, or KVR_ENOBLOCK when
 * at least one was not found (the others are still removed), or KVR_ENOMEM. */
int kvr_radix_remove(kvr_radix_t *t, uint64_t worker_id, uint32_t dp_rank, const uint64_t *hashes,
                     size_t n, size_t *not_found);

/* `cleared` for one rank: drops every block it holds; the rank stays registered. */
int kvr_radix_clear_rank(kvr_radix_t *t, uint64_t worker_id, uint32_t dp_rank);
/* Drops one rank and unregisters it. KVR_ENOTFOUND if unknown. */
int kvr_radix_remove_rank(kvr_radix_t *t, uint64_t worker_id, uint32_t dp_rank);
/* Drops every rank of a worker. KVR_ENOTFOUND if it has none. */
int kvr_radix_remove_worker(kvr_radix_t *t, uint64_t worker_id);

/* Applies one event (stored / removed / cleared) for its rank; the tier is not checked here.
 * Returns the code of the operation above. */
int kvr_radix_apply(kvr_radix_t *t, const struct kvr_event *ev);

/* Prefix overlap of a query of n local hashes (borrowed). Writes up to cap results to out and
 * the number of scored ranks to *n_out. Returns KVR_OK, or KVR_ERANGE if cap was too small
 * (*n_out then holds the number needed; out holds the first cap). Never allocates for up to 4096
 * rank slots; above that returns KVR_ENOMEM if its scratch allocation fails. Read-only. */
int kvr_radix_find_matches(const kvr_radix_t *t, const uint64_t *locals, size_t n, unsigned flags,
                           struct kvr_match *out, size_t cap, size_t *n_out);

void kvr_radix_stats(const kvr_radix_t *t, struct kvr_radix_stats *out);

/* Per-rank block counts, written to out[0..cap); *n_out = number of ranks. KVR_ERANGE if cap is
 * too small. */
int kvr_radix_rank_blocks(const kvr_radix_t *t, struct kvr_rank_blocks *out, size_t cap,
                          size_t *n_out);

/* Dumps the tree as stored events (index.md §8): breadth-first, clean pass-through chains merged,
 * one event per (chain, rank) with the rank's own external hashes, parent-rank filtered,
 * event_id from 0. Appends to *out (owned by the caller). Returns KVR_OK or KVR_ENOMEM (events
 * already appended stay). Read-only on the tree. */
int kvr_radix_dump(const kvr_radix_t *t, struct kvr_event_list *out);

/* Writes a canonical text of the tree's shape, for tests and debugging:
 *   [1,2]{1:0,2:0|3:0=1}->([3]{1:0},[4]{2:0})
 * (locals in decimal; full ranks as worker:dp; '|' then cutoffs rank=k; children sorted by first
 * local). Returns the length it needed (like snprintf); buf may be NULL with len 0. */
size_t kvr_radix_shape(const kvr_radix_t *t, char *buf, size_t len);

/* Verifies every internal invariant (edges, rank sets, tables, parents, counts). Returns KVR_OK
 * or KVR_ECORRUPT with a description in msg. For tests; O(size). */
int kvr_radix_check(const kvr_radix_t *t, char *msg, size_t msg_len);

#endif
