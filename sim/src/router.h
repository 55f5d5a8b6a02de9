/* router.h - the routing side of a simulation: the real policy runtime (or the C fallback) on
 * the simulator's thread, bound to the run's index and load tracker.
 * SPDX-License-Identifier: Apache-2.0
 *
 * Design. One kvr_lua_runtime_t and one VM per run, set up exactly as the server sets up a
 * worker thread (kvr/lua.h "Notes for the server"): the engine handles are the run's index and
 * ActiveSequences tracker, the policy is installed (shipped ones trusted unless the config asks
 * for the sandbox, files sandboxed) and bound as the default. Per request: kvr_lua_prepare fills
 * overlap, tree_blocks and the load terms, kvr_lua_vm_select decides; every Lua failure is routed
 * by the C fallback inside the runtime and counted here by status (never fatal). The "builtin"
 * policy is the same runtime with no policy bound, so the C fallback decides every request
 * through the same call (status NOPOLICY, not counted as a failure).
 * Not thread-safe: a router belongs to the thread that created it (the VM's rule).
 */
#ifndef KVR_SIM_ROUTER_H
#define KVR_SIM_ROUTER_H

#include <stddef.h>
#include <stdint.h>

#include "kvr/sim.h"

struct kvr_sim_router;

/* Creates a router for policy p (borrowed; its source must outlive the router) over idx and
 * load (borrowed). *out owned (kvr_sim_router_free). KVR_OK; KVR_EINVAL when the policy is
 * refused at install (err has the runtime's message, e.g. "name.lua:3: ..."); KVR_ENOMEM;
 * KVR_ECORRUPT (the runtime could not start; err says why). */
int kvr_sim_router_new(const struct kvr_sim_config *cfg, const struct kvr_sim_policy *p,
                       kvr_index_t *idx, kvr_load_t *load, struct kvr_sim_router **out, char *err,
                       size_t err_len);
void kvr_sim_router_free(struct kvr_sim_router *r);

/* Fills the engine fields of cands[0..n) (worker ids set by the caller) and chooses one:
 * *pick = its index. KVR_OK (always a decision) or KVR_ENOMEM / KVR_EINVAL from the runtime. */
int kvr_sim_router_select(struct kvr_sim_router *r, const struct kvr_ffi_request *req,
                          struct kvr_ffi_candidate *cands, size_t n, uint32_t *pick);

/* Delivers a KV event (borrowed) to the policy's hooks, if it has any. */
void kvr_sim_router_on_event(struct kvr_sim_router *r, const struct kvr_event *ev);

/* Reports a finished request to the policy's on_response, if it has one. */
void kvr_sim_router_on_response(struct kvr_sim_router *r, const struct kvr_ffi_request *req,
                                const struct kvr_ffi_candidate *worker,
                                const struct kvr_ffi_outcome *outcome);

/* Decision counters so far (copied). */
void kvr_sim_router_counts(const struct kvr_sim_router *r, struct kvr_sim_policy_counts *out);

#endif
