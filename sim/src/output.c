/* output.c - the JSON document of a simulation (kvr_sim_write_json; keys in docs/SIM.md).
 * SPDX-License-Identifier: Apache-2.0
 *
 * Layout: {"kvrouter_sim": 1, "mode", "input", "config": {...}, "trace": {...},
 *          "policies": {"<name>": {figures..., "workers": [...], "series": {...}}},
 *          "timing": {...} (only when asked: wall-clock, so never part of a determinism check)}.
 * Every number is a function of the inputs and the seed, so two runs print the same bytes. */
#include <math.h>
#include <stdio.h>

#include "json.h"
#include "kvr/err.h"
#include "kvr/sim.h"
#include "metrics.h"
#include "report.h"

static void dist(struct kvr_sim_jw *w, const char *k, const struct kvr_sim_dist *d)
{
    kvr_sim_jw_key(w, k);
    kvr_sim_jw_obj(w);
    kvr_sim_jw_kdbl(w, "mean", d->mean);
    kvr_sim_jw_kdbl(w, "p50", d->p50);
    kvr_sim_jw_kdbl(w, "p90", d->p90);
    kvr_sim_jw_kdbl(w, "p99", d->p99);
    kvr_sim_jw_kdbl(w, "max", d->max);
    kvr_sim_jw_end(w);
}

static double ratio(uint64_t a, uint64_t b)
{
    return b ? (double)a / (double)b : 0;
}

static void config(struct kvr_sim_jw *w, const struct kvr_sim_report *rep)
{
    const struct kvr_sim_config *c = rep->cfg;
    kvr_sim_jw_key(w, "config");
    kvr_sim_jw_obj(w);
    kvr_sim_jw_ku64(w, "workers", c->workers);
    kvr_sim_jw_ku64(w, "worker_base", c->worker_base);
    kvr_sim_jw_ku64(w, "seed", c->seed);
    kvr_sim_jw_ku64(w, "limit", c->limit);
    kvr_sim_jw_ku64(w, "buckets", c->buckets);
    kvr_sim_jw_kdbl(w, "policy_budget_ms", (double)c->budget_ns / 1e6);
    kvr_sim_jw_kstr(w, "shipped_policies", c->sandbox_shipped ? "sandboxed" : "trusted");
    if (rep->mode == KVR_SIM_MODE_EVENTS) {
        kvr_sim_jw_ku64(w, "inflight", c->inflight);
    } else {
        kvr_sim_jw_ku64(w, "cache_blocks", c->cache_blocks);
        kvr_sim_jw_ku64(w, "block_size", c->block_size);
        kvr_sim_jw_ku64(w, "trace_block_tokens", c->trace_block_tokens);
        kvr_sim_jw_ku64(w, "blocks_per_id", kvr_sim_expand(c));
        kvr_sim_jw_kdbl(w, "time_scale", c->time_scale);
        kvr_sim_jw_ku64(w, "slots", c->slots);
        kvr_sim_jw_ku64(w, "prefill_lanes", c->prefill_lanes);
        kvr_sim_jw_kdbl(w, "prefill_us_per_token", c->prefill_us_per_token);
        kvr_sim_jw_kdbl(w, "prefill_overhead_ms", c->prefill_overhead_us / 1000.0);
        kvr_sim_jw_kdbl(w, "decode_ms_per_token", c->decode_us_per_token / 1000.0);
        kvr_sim_jw_kdbl(w, "jitter", c->jitter);
    }
    kvr_sim_jw_end(w);
}

static void counts(struct kvr_sim_jw *w, const struct kvr_sim_policy_counts *p)
{
    kvr_sim_jw_key(w, "policy_errors");
    kvr_sim_jw_obj(w);
    kvr_sim_jw_ku64(w, "decisions", p->decisions);
    kvr_sim_jw_ku64(w, "ok", p->ok);
    kvr_sim_jw_ku64(w, "errors", p->errors);
    kvr_sim_jw_ku64(w, "timeouts", p->timeouts);
    kvr_sim_jw_ku64(w, "oom", p->oom);
    kvr_sim_jw_ku64(w, "invalid", p->invalid);
    kvr_sim_jw_ku64(w, "fallbacks", p->fallbacks);
    if (p->first_error[0])
        kvr_sim_jw_kstr(w, "first_error", p->first_error);
    kvr_sim_jw_end(w);
}

static void workers(struct kvr_sim_jw *w, const struct kvr_sim_result *r)
{
    kvr_sim_jw_key(w, "workers");
    kvr_sim_jw_arr(w, 0);
    for (uint32_t k = 0; k < r->n_workers; k++) {
        const struct kvr_sim_worker_stats *s = &r->workers[k];
        kvr_sim_jw_obj(w);
        kvr_sim_jw_ku64(w, "id", s->worker_id);
        kvr_sim_jw_ku64(w, "requests", s->requests);
        kvr_sim_jw_kdbl(w, "request_share", ratio(s->requests, r->requests));
        kvr_sim_jw_ku64(w, "blocks", s->blocks);
        kvr_sim_jw_kdbl(w, "block_share", ratio(s->blocks, r->blocks));
        kvr_sim_jw_ku64(w, "cached_blocks", s->cached_blocks);
        kvr_sim_jw_kdbl(w, "hit_ratio", ratio(s->cached_blocks, s->blocks));
        if (r->mode == KVR_SIM_MODE_TRACE)
            kvr_sim_jw_ku64(w, "prefill_tokens", s->prefill_tokens);
        kvr_sim_jw_kdbl(w, "mean_inflight", s->mean_inflight);
        kvr_sim_jw_ku64(w, "max_inflight", s->max_inflight);
        kvr_sim_jw_end(w);
    }
    kvr_sim_jw_end(w);
}

static void series(struct kvr_sim_jw *w, const struct kvr_sim_result *r)
{
    kvr_sim_jw_key(w, "series");
    kvr_sim_jw_obj(w);
    if (r->mode == KVR_SIM_MODE_TRACE)
        kvr_sim_jw_kdbl(w, "bucket_s", (double)r->bucket_us / 1e6);
    else
        kvr_sim_jw_ku64(w, "bucket_queries", r->bucket_us);
    kvr_sim_jw_key(w, "hit_ratio");
    kvr_sim_jw_arr(w, 1);
    for (uint32_t b = 0; b < r->n_buckets; b++)
        kvr_sim_jw_dbl(w, ratio(r->bucket_cached[b], r->bucket_blocks[b]));
    kvr_sim_jw_end(w);
    kvr_sim_jw_key(w, "best_hit_ratio");
    kvr_sim_jw_arr(w, 1);
    for (uint32_t b = 0; b < r->n_buckets; b++)
        kvr_sim_jw_dbl(w, ratio(r->bucket_best[b], r->bucket_blocks[b]));
    kvr_sim_jw_end(w);
    kvr_sim_jw_key(w, "inflight");
    kvr_sim_jw_arr(w, 0);
    for (uint32_t k = 0; k < r->n_workers; k++) {
        kvr_sim_jw_arr(w, 1);
        for (uint32_t b = 0; b < r->n_buckets; b++)
            kvr_sim_jw_dbl(w, r->inflight[(size_t)k * r->n_buckets + b]);
        kvr_sim_jw_end(w);
    }
    kvr_sim_jw_end(w);
    if (r->mode == KVR_SIM_MODE_TRACE) {
        kvr_sim_jw_key(w, "ttft_percentiles_ms");
        kvr_sim_jw_arr(w, 1);
        for (int p = 0; p <= 100; p++)
            kvr_sim_jw_dbl(w, kvr_sim_report_ttft_pct(r, p));
        kvr_sim_jw_end(w);
    }
    kvr_sim_jw_end(w);
}

static void policy(struct kvr_sim_jw *w, const struct kvr_sim_result *r)
{
    kvr_sim_jw_key(w, r->name);
    kvr_sim_jw_obj(w);
    kvr_sim_jw_kstr(w, "origin", r->origin);
    kvr_sim_jw_key(w, "ok");
    kvr_sim_jw_bool(w, r->ok);
    if (!r->ok) {
        kvr_sim_jw_kstr(w, "error", r->error);
        kvr_sim_jw_end(w);
        return;
    }
    int trace = r->mode == KVR_SIM_MODE_TRACE;
    kvr_sim_jw_ku64(w, "requests", r->requests);
    kvr_sim_jw_kdbl(w, "hit_ratio", r->hit_ratio);
    kvr_sim_jw_kdbl(w, "best_hit_ratio", r->best_hit_ratio);
    kvr_sim_jw_kdbl(w, "share_of_best",
                    r->best_hit_ratio > 0 ? r->hit_ratio / r->best_hit_ratio : 0);
    kvr_sim_jw_kdbl(w, "imbalance", r->imbalance);
    kvr_sim_jw_kdbl(w, "ttft_p50_ms", trace ? r->ttft_ms.p50 : NAN);
    kvr_sim_jw_kdbl(w, "ttft_p99_ms", trace ? r->ttft_ms.p99 : NAN);
    kvr_sim_jw_kdbl(w, "throughput_rps", trace ? r->throughput_rps : NAN);
    kvr_sim_jw_ku64(w, "blocks", r->blocks);
    kvr_sim_jw_ku64(w, "cached_blocks", r->cached_blocks);
    kvr_sim_jw_ku64(w, "best_blocks", r->best_blocks);
    kvr_sim_jw_kdbl(w, "routed_overlap_ratio", ratio(r->routed_overlap, r->blocks));
    if (!trace) {
        kvr_sim_jw_kdbl(w, "oracle_hit_ratio", ratio(r->oracle_blocks, r->blocks));
        kvr_sim_jw_ku64(w, "expect_mismatches", r->expect_mismatches);
    }
    kvr_sim_jw_kdbl(w, "imbalance_inflight", r->imbalance_inflight);
    kvr_sim_jw_kdbl(w, "imbalance_blocks", r->imbalance_blocks);
    if (trace) {
        kvr_sim_jw_kdbl(w, "imbalance_prefill", r->imbalance_prefill);
        kvr_sim_jw_ku64(w, "completed", r->completed);
        dist(w, "ttft_ms", &r->ttft_ms);
        dist(w, "queue_ms", &r->queue_ms);
        dist(w, "e2e_ms", &r->e2e_ms);
        kvr_sim_jw_kdbl(w, "makespan_s", r->makespan_s);
        kvr_sim_jw_kdbl(w, "output_tokens_per_s", r->output_tps);
    }
    counts(w, &r->policy);
    kvr_sim_jw_key(w, "index");
    kvr_sim_jw_obj(w);
    kvr_sim_jw_ku64(w, "stored_events", r->index_stored_events);
    kvr_sim_jw_ku64(w, "stored_blocks", r->index_stored_blocks);
    kvr_sim_jw_ku64(w, "removed_events", r->index_removed_events);
    kvr_sim_jw_ku64(w, "removed_blocks", r->index_removed_blocks);
    kvr_sim_jw_ku64(w, "errors", r->index_errors);
    kvr_sim_jw_end(w);
    kvr_sim_jw_ku64(w, "load_expired", r->load_expired);
    workers(w, r);
    series(w, r);
    kvr_sim_jw_end(w);
}

int kvr_sim_write_json(FILE *f, const struct kvr_sim_report *rep)
{
    struct kvr_sim_jw w;
    kvr_sim_jw_init(&w, f);
    kvr_sim_jw_obj(&w);
    kvr_sim_jw_ku64(&w, "kvrouter_sim", 1);
    kvr_sim_jw_kstr(&w, "mode", rep->mode == KVR_SIM_MODE_EVENTS ? "events" : "trace");
    kvr_sim_jw_kstr(&w, "input", rep->input);
    config(&w, rep);
    kvr_sim_jw_key(&w, "trace");
    kvr_sim_jw_obj(&w);
    kvr_sim_jw_ku64(&w, "requests", rep->trace_requests);
    if (rep->mode == KVR_SIM_MODE_TRACE) {
        kvr_sim_jw_kdbl(&w, "duration_s", rep->trace_duration_s);
        kvr_sim_jw_kdbl(&w, "pooled_hit_ratio", rep->pooled_hit_ratio);
    }
    for (size_t i = 0; i < rep->n; i++)
        if (rep->res[i].ok) {
            kvr_sim_jw_ku64(&w, "blocks", rep->res[i].blocks);
            kvr_sim_jw_kdbl(&w, "best_hit_ratio", rep->res[i].best_hit_ratio);
            break;
        }
    kvr_sim_jw_end(&w);
    kvr_sim_jw_key(&w, "policies");
    kvr_sim_jw_obj(&w);
    for (size_t i = 0; i < rep->n; i++)
        policy(&w, &rep->res[i]);
    kvr_sim_jw_end(&w);
    if (rep->timing) {
        kvr_sim_jw_key(&w, "timing");
        kvr_sim_jw_obj(&w);
        for (size_t i = 0; i < rep->n; i++) {
            kvr_sim_jw_key(&w, rep->res[i].name);
            kvr_sim_jw_obj(&w);
            kvr_sim_jw_kdbl(&w, "wall_s", rep->res[i].wall_s);
            kvr_sim_jw_kdbl(&w, "decisions_per_s", rep->res[i].decisions_per_s);
            kvr_sim_jw_end(&w);
        }
        kvr_sim_jw_end(&w);
    }
    kvr_sim_jw_end(&w);
    return kvr_sim_jw_finish(&w) == 0 ? KVR_OK : KVR_EIO;
}
