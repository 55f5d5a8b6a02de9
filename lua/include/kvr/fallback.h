/* fallback.h - the built-in C routing policy: Dynamo's classic KV cost (scheduling.md §3, §5).
 * SPDX-License-Identifier: Apache-2.0
 *
 * It runs whenever a Lua policy cannot decide (error, time budget, memory cap, invalid choice,
 * no policy bound), so the router always answers. Per candidate w (all block counts in blocks):
 *
 *   prefill_tokens_w = max(0, isl - overlap_w × block_size) + active_prefill_tokens_w
 *   cost_w           = overlap_weight × prefill_tokens_w / block_size
 *                      + (new_blocks_w + active_decode_blocks_w)            lower wins
 *
 *   T == 0: argmin; ties -> fewer tree_blocks (Dynamo's old tie-break), then the lower index
 *           (deterministic, so Lua kv_cost and this agree exactly on the same inputs)
 *   T  > 0: softmax over min-max normalised costs, exactly §5:
 *           w_i = exp(-(c_i - c_min) / ((c_max - c_min) × T)), p_i = w_i / Σw,
 *           u ~ U[0,1) from a seeded SplitMix64; the first i with cumsum(p)_i >= u (else the last);
 *           all costs equal -> uniform.
 *
 * Worked example (§3): ISL 100, block size 16, weight 1: A with 3 cached blocks costs
 * (100 - 48)/16 = 3.25 + its decode blocks, B with none 6.25 + its decode blocks.
 *
 * The ranked output (for retries) is the chosen candidate first, then the others by increasing
 * cost with the same tie-break. Costs are computed in double precision in this exact operation
 * order; the file is compiled with -ffp-contract=off so no fused multiply-add changes a bit.
 * Thread-safety: pure functions except for the RNG the caller owns (one per thread).
 */
#ifndef KVR_FALLBACK_H
#define KVR_FALLBACK_H

#include <stddef.h>
#include <stdint.h>

#include "kvr/ffi.h"

struct kvr_fallback_params {
    double overlap_weight; /* prefill weight (>= 0); Dynamo default 1.0 */
    double temperature;    /* softmax temperature (>= 0); 0 = argmin */
};

/* SplitMix64 state (seed it with any value; one per thread). */
struct kvr_fallback_rng {
    uint64_t state;
};

/* The defaults above (weight 1, temperature 0). */
void kvr_fallback_params_init(struct kvr_fallback_params *p);

/* Next uniform double in [0, 1) (53 random bits). */
double kvr_fallback_rng_uniform(struct kvr_fallback_rng *rng);

/* Cost of one candidate for a request (borrowed), as above. */
double kvr_fallback_cost(const struct kvr_fallback_params *p, const struct kvr_ffi_request *req,
                         const struct kvr_ffi_candidate *c);

/* Softmax selection over n costs (§5 exactly) with a given u in [0,1). Returns the index. n > 0;
 * temperature > 0. Exposed for tests (the §5 example) and for the Lua helper's cross-check. */
size_t kvr_fallback_softmax_pick(const double *costs, size_t n, double temperature, double u);

/* Chooses among n candidates (borrowed) for req (borrowed). The request's overlap_weight and
 * temperature override params when >= 0. Writes up to cap indices (best first) to ranked and
 * their number to *n_out. rng (borrowed) is used only when the temperature is > 0.
 * Returns KVR_OK, or KVR_EINVAL (n == 0, cap == 0, NULL arrays, block_size 0). O(n) for cap == 1,
 * O(n log n) otherwise. Never allocates for n <= 1024 (a larger ranking uses the heap and may
 * return KVR_ENOMEM). */
int kvr_fallback_select(const struct kvr_fallback_params *p, const struct kvr_ffi_request *req,
                        const struct kvr_ffi_candidate *c, size_t n, struct kvr_fallback_rng *rng,
                        uint32_t *ranked, size_t cap, size_t *n_out);

#endif
