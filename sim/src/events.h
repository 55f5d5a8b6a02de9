/* events.h - the --events mode: a recorded op stream (spec/opstream.md) through one policy.
 * SPDX-License-Identifier: Apache-2.0
 *
 * Design. An op stream records what a router saw: KV events from the workers and routing
 * queries (local hashes), in order. Replaying it through a policy answers "where would this
 * policy have sent each query, given the caches as they really were":
 *
 *   {"event": ...}  ─▶ kvr_index_apply (+ the policy's KV hooks)             in stream order
 *   {"match": [...], "expect": {...}}
 *                   ─▶ check the index against expect (counts mismatches: a conformance check
 *                      for free), kvr_lua_prepare + select over the workers, book the load;
 *                      the query is released `inflight` queries later (a stream carries no
 *                      durations: a sliding window stands in for requests in flight)
 *
 * The events are the recorded ones whatever the policy decides, so the replay is counterfactual
 * one decision deep: hit_ratio = Σ overlap of the chosen worker / Σ query blocks; oracle =
 * Σ max overlap over workers (the best routing could do on these caches); best = the infinite
 * shared cache of kvr/sim.h. No latency model: TTFT and throughput are absent. The "time" of
 * the load series is the query index. Tokens per query = blocks × block_size.
 * Not thread-safe.
 */
#ifndef KVR_SIM_EVENTS_H
#define KVR_SIM_EVENTS_H

#include <stddef.h>
#include <stdint.h>

#include "kvr/sim.h"
#include "opstream.h"

/* The distinct worker ids of a stream (events and expectations), ascending, into *ids (owned;
 * free()). KVR_OK or KVR_ENOMEM. */
int kvr_sim_events_workers(const struct kvr_opstream *ops, uint64_t **ids, size_t *n);

/* Replays ops (borrowed) through policy p with the candidates worker_ids[0..n_workers)
 * (dp_rank 0) into *out, as kvr_sim_run (ok = 0 and error for a refused policy). */
int kvr_sim_events_run(const struct kvr_sim_config *cfg, const struct kvr_opstream *ops,
                       const struct kvr_sim_policy *p, const uint64_t *worker_ids, size_t n_workers,
                       struct kvr_sim_result *out);

#endif
