/* prepare.c - fills candidates' overlap and load fields from the bound engine (kvr_lua_prepare).
 * SPDX-License-Identifier: Apache-2.0 */
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "kvr/err.h"

#define STACK_N 256u

struct keyed {
    uint64_t worker_id;
    uint32_t dp_rank;
    uint32_t value;
};

static int cmp_keyed(const void *pa, const void *pb)
{
    const struct keyed *a = pa, *b = pb;
    if (a->worker_id != b->worker_id)
        return a->worker_id < b->worker_id ? -1 : 1;
    return a->dp_rank < b->dp_rank ? -1 : a->dp_rank > b->dp_rank;
}

static uint32_t lookup(const struct keyed *k, size_t n, uint64_t worker_id, uint32_t dp_rank)
{
    struct keyed key = {worker_id, dp_rank, 0};
    const struct keyed *f = bsearch(&key, k, n, sizeof(*k), cmp_keyed);
    return f ? f->value : 0;
}

static uint32_t clamp32(uint64_t v)
{
    return v > UINT32_MAX ? UINT32_MAX : (uint32_t)v;
}

/* Overlap of the request per candidate from the index (sorted matches + binary search). */
static int fill_overlap(kvr_index_t *idx, const struct kvr_ffi_request *req,
                        struct kvr_ffi_candidate *c, size_t n)
{
    struct kvr_match stack[STACK_N];
    struct kvr_match *m = stack;
    size_t cap = STACK_N, nm = 0;
    int rc = KVR_OK;
    if (req->local_hashes != NULL && req->blocks > 0) {
        rc = kvr_index_find_matches(idx, req->local_hashes, req->blocks, 0, m, cap, &nm);
        if (rc == KVR_ERANGE) {
            cap = nm + 64;
            m = malloc(cap * sizeof(*m));
            if (m == NULL)
                return KVR_ENOMEM;
            rc = kvr_index_find_matches(idx, req->local_hashes, req->blocks, 0, m, cap, &nm);
        }
        if (rc != KVR_OK)
            goto out;
    }
    struct keyed kstack[STACK_N];
    struct keyed *k = nm <= STACK_N ? kstack : malloc(nm * sizeof(*k));
    if (k == NULL) {
        rc = KVR_ENOMEM;
        goto out;
    }
    for (size_t i = 0; i < nm; i++)
        k[i] = (struct keyed){m[i].worker_id, m[i].dp_rank, m[i].blocks};
    qsort(k, nm, sizeof(*k), cmp_keyed);
    for (size_t i = 0; i < n; i++)
        c[i].overlap = nm ? lookup(k, nm, c[i].worker_id, c[i].dp_rank) : 0;
    if (k != kstack)
        free(k);
out:
    if (m != stack)
        free(m);
    return rc;
}

static int fill_tree_blocks(kvr_index_t *idx, struct kvr_ffi_candidate *c, size_t n)
{
    struct kvr_rank_blocks stack[STACK_N];
    struct kvr_rank_blocks *rb = stack;
    size_t nr = 0;
    int rc = kvr_index_rank_blocks(idx, rb, STACK_N, &nr);
    if (rc == KVR_ERANGE) {
        size_t cap = nr + 64;
        rb = malloc(cap * sizeof(*rb));
        if (rb == NULL)
            return KVR_ENOMEM;
        rc = kvr_index_rank_blocks(idx, rb, cap, &nr);
    }
    struct keyed kstack[STACK_N];
    struct keyed *k = rc == KVR_OK && nr <= STACK_N ? kstack : malloc((nr ? nr : 1) * sizeof(*k));
    if (rc == KVR_OK && k != NULL) {
        for (size_t i = 0; i < nr; i++)
            k[i] = (struct keyed){rb[i].worker_id, rb[i].dp_rank, clamp32(rb[i].blocks)};
        qsort(k, nr, sizeof(*k), cmp_keyed);
        for (size_t i = 0; i < n; i++)
            c[i].tree_blocks = lookup(k, nr, c[i].worker_id, c[i].dp_rank);
    } else if (rc == KVR_OK) {
        rc = KVR_ENOMEM;
    }
    if (k != kstack)
        free(k);
    if (rb != stack)
        free(rb);
    return rc;
}

static int fill_load(kvr_load_t *ld, const struct kvr_ffi_request *req, struct kvr_ffi_candidate *c,
                     size_t n)
{
    struct kvr_load_query stack[STACK_N];
    struct kvr_load_query *q = n <= STACK_N ? stack : malloc(n * sizeof(*q));
    if (q == NULL)
        return KVR_ENOMEM;
    for (size_t i = 0; i < n; i++) {
        memset(&q[i], 0, sizeof(q[i]));
        q[i].worker_id = c[i].worker_id;
        q[i].dp_rank = c[i].dp_rank;
    }
    size_t n_seq = req->seq_hashes ? req->blocks : 0;
    kvr_load_query(ld, req->seq_hashes, n_seq, q, n);
    for (size_t i = 0; i < n; i++) {
        c[i].prefill_tokens = clamp32(q[i].prefill_tokens);
        c[i].decode_blocks = clamp32(q[i].active_blocks);
        c[i].requests = clamp32(q[i].requests);
        /* Without sequence hashes no reuse is assumed: every block is new. */
        c[i].new_blocks = req->seq_hashes ? clamp32(q[i].new_blocks) : req->blocks;
    }
    if (q != stack)
        free(q);
    return KVR_OK;
}

int kvr_lua_prepare(kvr_lua_runtime_t *rt, const struct kvr_ffi_request *req,
                    struct kvr_ffi_candidate *cands, size_t n)
{
    if (rt == NULL || req == NULL || (cands == NULL && n > 0))
        return KVR_EINVAL;
    const struct kvr_lua_engine *e = &rt->cfg.engine;
    int rc = KVR_OK;
    if (e->index != NULL && n > 0) {
        rc = fill_overlap(e->index, req, cands, n);
        if (rc == KVR_OK)
            rc = fill_tree_blocks(e->index, cands, n);
    }
    if (rc == KVR_OK && e->load != NULL && n > 0)
        rc = fill_load(e->load, req, cands, n);
    return rc;
}
