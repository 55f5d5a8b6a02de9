/* pooled.c - the pooled-cache reference: one LRU holding every worker's capacity (kvr/sim.h).
 * SPDX-License-Identifier: Apache-2.0
 *
 * Why: best_hit_ratio ignores capacity, so with a cache that cannot hold the working set no
 * policy can reach it. A single LRU of workers × cache_blocks blocks, fed every request in
 * arrival order, shows how much of the gap is capacity (what even a perfectly shared cache
 * loses) and how much is routing (what splitting the cache across workers costs). It is a
 * reference, not a bound: LRU is not an optimal replacement policy, so a partitioned cache can
 * occasionally beat it. */
#include <stdlib.h>
#include <string.h>

#include "blocks.h"
#include "kvr/err.h"
#include "kvr/sim.h"
#include "lru.h"

int kvr_sim_pooled_hit_ratio(const struct kvr_sim_config *cfg, const struct kvr_sim_trace *t,
                             double *ratio)
{
    *ratio = 0;
    uint32_t e = kvr_sim_expand(cfg);
    if (e == 0 || cfg->workers == 0)
        return KVR_EINVAL;
    size_t n = cfg->limit > 0 && cfg->limit < t->n ? (size_t)cfg->limit : t->n;
    struct kvr_sim_hasher h;
    struct kvr_sim_lru lru;
    uint64_t cap = cfg->cache_blocks > UINT64_MAX / cfg->workers ? UINT64_MAX
                                                                 : cfg->cache_blocks * cfg->workers;
    kvr_sim_lru_init(&lru, 0, cap);
    uint64_t *buf = NULL;
    size_t cap_buf = 0;
    uint64_t hit = 0, total = 0;
    int rc = kvr_sim_hasher_init(&h, t, cfg->block_size, e);
    for (size_t i = 0; i < n && rc == KVR_OK; i++) {
        const struct kvr_sim_request *r = &t->req[i];
        size_t nb = (size_t)r->n_ids * e;
        if (2 * nb > cap_buf) {
            cap_buf = 2 * nb;
            uint64_t *nbuf = realloc(buf, cap_buf * sizeof(*buf));
            if (nbuf == NULL) {
                rc = KVR_ENOMEM;
                break;
            }
            buf = nbuf;
        }
        kvr_sim_hasher_blocks(&h, t->ids + r->ids_off, r->n_ids, buf, buf + nb);
        hit += kvr_sim_lru_prefix(&lru, buf + nb, nb);
        total += nb;
        rc = kvr_sim_lru_store(&lru, buf + nb, buf, nb, NULL, NULL);
    }
    if (rc == KVR_OK && total > 0)
        *ratio = (double)hit / (double)total;
    free(buf);
    kvr_sim_lru_free(&lru);
    kvr_sim_hasher_free(&h);
    return rc;
}
