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
 *   node layout (struct rnode, engine/src/radix_int.h, every field commented there): edge
 *   locals[len] + exts[len] in one block; full-rank bitmap (64 inline bits + extension words);
 *   cutoffs[(slot,k)]; per-rank external-hash overrides; children keyed by the first local hash
 *   (inline array up to 8, open-addressed table above); parent; split_next (the node holding the
 *   positions this edge had before its last split, so table entries written before a split stay
 *   valid and are re-pointed lazily on their next use).
 *
 * Bounded work: a removal, a clear or a rank/worker removal can touch any number of blocks, and
 * a node left without a full rank unlinks a subtree of any size. Besides the one-shot calls, the
 * tree offers them as jobs advanced in steps of about `budget` work units (one unit ~ one table
 * entry, table slot or node touched), so that kvr_index_t can release its lock between steps:
 * unlinked subtrees are cut off at once (O(1)) and freed by later steps. Between steps the tree
 * is consistent for readers; an operation in progress shows partly applied (see the job API).
 *
 * Thread-safety: none. A kvr_radix_t is used by one thread at a time, or under the rwlock of a
 * kvr_index_t (reads: find_matches, stats, rank_blocks, dump steps; writes: everything else).
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

/* ---- bounded jobs -------------------------------------------------------------------------
 *
 *     kvr_radix_remove_begin(t, w, dp, hashes, n);   (or clear / remove_rank / remove_worker)
 *     while (kvr_radix_step(t, budget))
 *         release the lock, let readers in, take it back;
 *     rc = kvr_radix_job_result(t, &not_found);
 *
 * A step does about `budget` work units (at least one; a removal's cut longer than the budget
 * left is applied from the tail in pieces), then returns 1 if work remains, 0 when the job and
 * the freeing of everything it unlinked are done. Between steps readers see the operation partly
 * applied: some of the rank's named (or, for a drop, all) blocks already gone, the rest not yet:
 * never a block the rank did not hold before the operation, so an undercount relative to the
 * state before it and never an overcount. One job at a time: a begin call or any other mutating
 * call first finishes the job and drain in progress (unbounded). The begin calls return
 * KVR_EINVAL for bad arguments (no job), else KVR_OK; the operation's own code (as the one-shot
 * call's) is kvr_radix_job_result's once kvr_radix_step has returned 0. A remove job borrows
 * `hashes` until then. */
int kvr_radix_remove_begin(kvr_radix_t *t, uint64_t worker_id, uint32_t dp_rank,
                           const uint64_t *hashes, size_t n);
int kvr_radix_clear_begin(kvr_radix_t *t, uint64_t worker_id, uint32_t dp_rank);
int kvr_radix_remove_rank_begin(kvr_radix_t *t, uint64_t worker_id, uint32_t dp_rank);
int kvr_radix_remove_worker_begin(kvr_radix_t *t, uint64_t worker_id);
/* Advances the job, then the deferred frees, by about `budget` work units. 1 = more to do. */
int kvr_radix_step(kvr_radix_t *t, uint64_t budget);
/* The last finished job's result code; *not_found (may be NULL) = hashes a removal missed. */
int kvr_radix_job_result(const kvr_radix_t *t, size_t *not_found);
/* Whether a job or deferred frees are in progress. */
int kvr_radix_busy(const kvr_radix_t *t);
/* Work units done since the tree was created (a store counts one per block): budget accounting
 * and the bound tests. */
uint64_t kvr_radix_work(const kvr_radix_t *t);

/* Applies one event (stored / removed / cleared) for its rank; the tier is not checked here.
 * Returns the code of the operation above. */
int kvr_radix_apply(kvr_radix_t *t, const struct kvr_event *ev);

/* Prefix overlap of a query of n local hashes (borrowed). Writes up to cap results to out and
 * the number of scored ranks to *n_out (unordered). Returns KVR_OK, or KVR_ERANGE if cap was too
 * small (*n_out then holds the number needed; out holds the first cap). Read-only; never
 * allocates: the active rank set lives on the stack (4096 slots); with more rank slots the walk
 * runs once per 4096-slot window and KVR_MATCH_EARLY_EXIT is ignored (exact scores). */
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

/* ---- incremental dump -----------------------------------------------------------------------
 *
 * kvr_radix_dump in pieces, for a caller that releases its read lock between pieces
 * (kvr_index_dump): begin and every step under the read lock, end with or without it.
 *
 *     kvr_radix_dump_begin(t, &d);  do kvr_radix_dump_step(t, d, out, budget, &done); while
 *     (!done);  kvr_radix_dump_end(t, d);
 *
 * A step emits whole chains (with all their ranks' events) until at least `budget` blocks were
 * emitted, or the dump is complete (*done = 1). Without writes between the steps, the events
 * are exactly kvr_radix_dump's. With writes between steps the dump is a fuzzy snapshot: each
 * chain is read at one moment, under the lock; nodes freed meanwhile are skipped (their structs
 * are not reused while a dump is registered); a rank's slot reused by another rank is not
 * confused with it (parents are matched by worker and dp_rank). So every event states blocks its
 * rank held, under a parent it held and that the dump emitted before, at the moment of that
 * step; a block held and reachable for the whole dump is emitted. Replaying the dump and then
 * every event applied after the dump began converges to the live index (kvr/index.h).
 * Returns KVR_OK or KVR_ENOMEM (events already appended stay; end still required). d is owned
 * by the caller from begin until end (which frees it). Allocates with plain malloc. */
typedef struct kvr_radix_dump kvr_radix_dump_t;
int kvr_radix_dump_begin(kvr_radix_t *t, kvr_radix_dump_t **out);
int kvr_radix_dump_step(const kvr_radix_t *t, kvr_radix_dump_t *d, struct kvr_event_list *out,
                        size_t budget, int *done);
void kvr_radix_dump_end(kvr_radix_t *t, kvr_radix_dump_t *d);

/* Writes a canonical text of the tree's shape, for tests and debugging:
 *   [1,2]{1:0,2:0|3:0=1}->([3]{1:0},[4]{2:0})
 * (locals in decimal; full ranks as worker:dp; '|' then cutoffs rank=k; children sorted by first
 * local). Returns the length it needed (like snprintf); buf may be NULL with len 0. */
size_t kvr_radix_shape(const kvr_radix_t *t, char *buf, size_t len);

/* Verifies every internal invariant (edges, rank sets, tables, parents, counts). Returns KVR_OK,
 * KVR_ECORRUPT with a description in msg, or KVR_EBUSY while a job or deferred frees are in
 * progress (the invariants hold only between operations). For tests; O(size). */
int kvr_radix_check(const kvr_radix_t *t, char *msg, size_t msg_len);

#endif
