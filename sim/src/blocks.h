/* blocks.h - trace hash ids to KV blocks: local and sequence hashes of a simulated request.
 * SPDX-License-Identifier: Apache-2.0
 *
 * Mapping (kvr/sim.h "Blocks"; the same as tools/kvtrace.py --expand E, hashing.md §9.3):
 *
 *   ids     [ h0        | h1        | ... ]              one id = trace_block_tokens tokens
 *   blocks  [ h0 h0 .. h0 | h1 h1 .. h1 | ... ]          E = trace_block_tokens / B per id
 *   local   L(h) = xxh3(B copies of le32(h), seed 1337)  (kvr_hash_trace_id; the same for all E)
 *   seq     s0 = local0; s_k = xxh3(le64(s_{k-1}) ++ le64(local_k), 1337)
 *
 * L(h) costs a hash of 4 B bytes, so it is memoised per id (ids are dense in Mooncake traces; a
 * trace whose largest id is 2^26 or more is hashed without the memo).
 * Not thread-safe (the memo is filled lazily).
 */
#ifndef KVR_SIM_BLOCKS_H
#define KVR_SIM_BLOCKS_H

#include <stddef.h>
#include <stdint.h>

#include "kvr/sim.h"

struct kvr_sim_hasher {
    uint32_t block_size; /* tokens per block */
    uint32_t expand;     /* blocks per id */
    uint64_t *memo;      /* memo[id], 0 = not computed yet (owned; NULL = no memo) */
    size_t n_memo;       /* entries in memo */
};

/* Prepares a hasher for trace t (borrowed: only its max_id is read). KVR_OK, KVR_EINVAL
 * (block_size or expand 0) or KVR_ENOMEM. */
int kvr_sim_hasher_init(struct kvr_sim_hasher *h, const struct kvr_sim_trace *t,
                        uint32_t block_size, uint32_t expand);
void kvr_sim_hasher_free(struct kvr_sim_hasher *h);

/* Local hash of one id. */
uint64_t kvr_sim_hasher_local(struct kvr_sim_hasher *h, uint32_t id);

/* Writes the n_ids × expand local and sequence hashes of ids[0..n_ids) to local[] and seq[]
 * (caller arrays of that size). */
void kvr_sim_hasher_blocks(struct kvr_sim_hasher *h, const uint32_t *ids, size_t n_ids,
                           uint64_t *local, uint64_t *seq);

#endif
