/* fallback.c - the built-in classic KV-cost policy (see kvr/fallback.h).
 * SPDX-License-Identifier: Apache-2.0 */
#include "kvr/fallback.h"

#include <math.h>
#include <stdlib.h>

#include "kvr/err.h"

#define STACK_RANK 1024u

struct scored {
    double cost;
    uint32_t tree;
    uint32_t idx;
};

void kvr_fallback_params_init(struct kvr_fallback_params *p)
{
    p->overlap_weight = 1.0;
    p->temperature = 0.0;
}

double kvr_fallback_rng_uniform(struct kvr_fallback_rng *rng)
{
    uint64_t z = (rng->state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return (double)(z >> 11) * (1.0 / 9007199254740992.0);
}

static double cost_w(double w, double isl, double bs, const struct kvr_ffi_candidate *c)
{
    /* Same operations, same order as policies/kv_cost.lua: the two must agree bit for bit. */
    double prefill = isl - (double)c->overlap * bs;
    if (prefill < 0)
        prefill = 0;
    prefill = prefill + (double)c->prefill_tokens;
    return w * (prefill / bs) + ((double)c->new_blocks + (double)c->decode_blocks);
}

double kvr_fallback_cost(const struct kvr_fallback_params *p, const struct kvr_ffi_request *req,
                         const struct kvr_ffi_candidate *c)
{
    double w = req->overlap_weight >= 0 ? req->overlap_weight : p->overlap_weight;
    return cost_w(w, (double)req->tokens, (double)req->block_size, c);
}

/* Strict "a before b": lower cost, then fewer tree blocks, then lower index. */
static int before(const struct scored *a, const struct scored *b)
{
    if (a->cost != b->cost)
        return a->cost < b->cost;
    if (a->tree != b->tree)
        return a->tree < b->tree;
    return a->idx < b->idx;
}

static int cmp_scored(const void *pa, const void *pb)
{
    const struct scored *a = pa, *b = pb;
    return before(a, b) ? -1 : before(b, a) ? 1 : 0;
}

size_t kvr_fallback_softmax_pick(const double *costs, size_t n, double temperature, double u)
{
    double lo = costs[0], hi = costs[0];
    for (size_t i = 1; i < n; i++) {
        if (costs[i] < lo)
            lo = costs[i];
        if (costs[i] > hi)
            hi = costs[i];
    }
    if (hi == lo) { /* uniform */
        size_t i = (size_t)(u * (double)n);
        return i < n ? i : n - 1;
    }
    double scale = 1.0;
    if (isinf(hi - lo)) {
        scale = fabs(lo) > fabs(hi) ? fabs(lo) : fabs(hi);
        lo /= scale;
        hi /= scale;
    }
    double range = (hi - lo) * temperature, sum = 0;
    for (size_t i = 0; i < n; i++)
        sum += exp(-(costs[i] / scale - lo) / range);
    double cum = 0;
    for (size_t i = 0; i < n; i++) {
        cum += exp(-(costs[i] / scale - lo) / range) / sum;
        if (cum >= u)
            return i;
    }
    return n - 1;
}

int kvr_fallback_select(const struct kvr_fallback_params *p, const struct kvr_ffi_request *req,
                        const struct kvr_ffi_candidate *c, size_t n, struct kvr_fallback_rng *rng,
                        uint32_t *ranked, size_t cap, size_t *n_out)
{
    if (n == 0 || cap == 0 || c == NULL || ranked == NULL || req == NULL || req->block_size == 0 ||
        n > UINT32_MAX)
        return KVR_EINVAL;
    double w = req->overlap_weight >= 0 ? req->overlap_weight : p->overlap_weight;
    double t = req->temperature >= 0 ? req->temperature : p->temperature;
    double isl = (double)req->tokens, bs = (double)req->block_size;
    if (cap == 1 && t <= 0) { /* the hot case: one pass */
        struct scored best = {cost_w(w, isl, bs, &c[0]), c[0].tree_blocks, 0};
        for (size_t i = 1; i < n; i++) {
            struct scored s = {cost_w(w, isl, bs, &c[i]), c[i].tree_blocks, (uint32_t)i};
            if (before(&s, &best))
                best = s;
        }
        ranked[0] = best.idx;
        *n_out = 1;
        return KVR_OK;
    }
    struct scored stack[STACK_RANK];
    struct scored *s = n <= STACK_RANK ? stack : malloc(n * sizeof(*s));
    double cstack[STACK_RANK];
    double *costs = n <= STACK_RANK ? cstack : malloc(n * sizeof(*costs));
    if (s == NULL || costs == NULL) {
        if (s != stack)
            free(s);
        if (costs != cstack)
            free(costs);
        return KVR_ENOMEM;
    }
    for (size_t i = 0; i < n; i++) {
        costs[i] = cost_w(w, isl, bs, &c[i]);
        s[i] = (struct scored){costs[i], c[i].tree_blocks, (uint32_t)i};
    }
    size_t first = SIZE_MAX;
    if (t > 0)
        first = kvr_fallback_softmax_pick(costs, n, t, kvr_fallback_rng_uniform(rng));
    size_t k = 0;
    if (cap > 1)
        qsort(s, n, sizeof(*s), cmp_scored);
    if (first != SIZE_MAX)
        ranked[k++] = (uint32_t)first;
    for (size_t i = 0; i < n && k < cap; i++)
        if (s[i].idx != first)
            ranked[k++] = s[i].idx;
    *n_out = k;
    if (s != stack)
        free(s);
    if (costs != cstack)
        free(costs);
    return KVR_OK;
}
