/* blocks.c - trace ids to local and sequence hashes (see blocks.h).
 * SPDX-License-Identifier: Apache-2.0 */
#include "blocks.h"

#include <stdlib.h>
#include <string.h>

#include "kvr/err.h"
#include "kvr/hash.h"

#define MEMO_MAX ((size_t)1 << 26)

int kvr_sim_hasher_init(struct kvr_sim_hasher *h, const struct kvr_sim_trace *t,
                        uint32_t block_size, uint32_t expand)
{
    memset(h, 0, sizeof(*h));
    if (block_size == 0 || expand == 0)
        return KVR_EINVAL;
    h->block_size = block_size;
    h->expand = expand;
    size_t n = t->n_ids > 0 ? (size_t)t->max_id + 1 : 0;
    if (n > 0 && n <= MEMO_MAX) {
        h->memo = calloc(n, sizeof(*h->memo));
        if (h->memo == NULL)
            return KVR_ENOMEM;
        h->n_memo = n;
    }
    return KVR_OK;
}

void kvr_sim_hasher_free(struct kvr_sim_hasher *h)
{
    free(h->memo);
    memset(h, 0, sizeof(*h));
}

uint64_t kvr_sim_hasher_local(struct kvr_sim_hasher *h, uint32_t id)
{
    if (id < h->n_memo) {
        if (h->memo[id] == 0)
            h->memo[id] = kvr_hash_trace_id(id, h->block_size);
        return h->memo[id];
    }
    return kvr_hash_trace_id(id, h->block_size);
}

void kvr_sim_hasher_blocks(struct kvr_sim_hasher *h, const uint32_t *ids, size_t n_ids,
                           uint64_t *local, uint64_t *seq)
{
    size_t k = 0;
    for (size_t i = 0; i < n_ids; i++) {
        uint64_t l = kvr_sim_hasher_local(h, ids[i]);
        for (uint32_t e = 0; e < h->expand; e++, k++) {
            local[k] = l;
            seq[k] = k == 0 ? l : kvr_hash_seq_next(seq[k - 1], l);
        }
    }
}
