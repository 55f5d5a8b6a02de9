/* metrics.h - figures of a simulation: latency percentiles, load imbalance, and the per-worker
 * in-flight load integrated over time buckets.
 * SPDX-License-Identifier: Apache-2.0
 *
 * In-flight load. Each worker's count of requests in flight (routed, not finished: queued or
 * running) is a step function of time; its integral over each bucket divided by the bucket's
 * width is the bucket's mean load. The window [0, window) is cut into n equal buckets (the last
 * may be shorter); time past the window is not plotted but still counts for max_inflight.
 *
 *   count ─┐   ┌──┐
 *          └───┘  └──     area per bucket ─▶ mean in flight per bucket (the load plot)
 *   bucket |  0  |  1  |  2  | ...
 *
 * Percentiles are nearest-rank: p-th = sorted[ceil(p × n) - 1].
 * Not thread-safe.
 */
#ifndef KVR_SIM_METRICS_H
#define KVR_SIM_METRICS_H

#include <stddef.h>
#include <stdint.h>

#include "kvr/sim.h"

struct kvr_sim_load_series {
    uint32_t n_workers, n_buckets;
    uint64_t window; /* time units plotted (µs, or queries in --events mode) */
    uint64_t width;  /* units per bucket: ceil(window / n_buckets) */
    double *area;    /* n_workers × n_buckets, worker-major (owned) */
    uint64_t *last;  /* per worker: time of the last change (owned) */
    uint64_t *count; /* per worker: in flight now (owned) */
    uint64_t *max;   /* per worker: most in flight at once (owned) */
    double *total;   /* per worker: area over the whole window (owned) */
};

/* Prepares a series for n_workers over [0, window) in n_buckets (window, n_buckets >= 1).
 * KVR_OK or KVR_ENOMEM. */
int kvr_sim_load_init(struct kvr_sim_load_series *s, uint32_t n_workers, uint32_t n_buckets,
                      uint64_t window);
void kvr_sim_load_free(struct kvr_sim_load_series *s);

/* Worker w's in-flight count changes by delta (+1 / -1) at time now (non-decreasing). */
void kvr_sim_load_change(struct kvr_sim_load_series *s, uint32_t w, uint64_t now, int delta);

/* Closes the series at time end (>= every change): integrates every worker up to it. */
void kvr_sim_load_finish(struct kvr_sim_load_series *s, uint64_t end);

/* Mean in flight of worker w in bucket b (after finish). */
double kvr_sim_load_mean(const struct kvr_sim_load_series *s, uint32_t w, uint32_t b);

/* The bucket of time t (clamped to the last one). */
uint32_t kvr_sim_bucket_of(uint64_t t, uint64_t width, uint32_t n_buckets);

/* Distribution in milliseconds of n microsecond values (sorted ascending; n may be 0: zeros). */
void kvr_sim_dist_ms(const uint64_t *sorted_us, size_t n, struct kvr_sim_dist *out);

/* Nearest-rank percentile p in (0, 1] of n sorted values (0 when n == 0). */
uint64_t kvr_sim_percentile(const uint64_t *sorted, size_t n, double p);

/* max(v) / mean(v) over n values; 0 when every value is 0 (or n == 0). */
double kvr_sim_imbalance(const uint64_t *v, size_t n, size_t stride);

/* Σ_b max_w v[w][b] / Σ_b mean_w v[w][b] over a worker-major n_workers × n_buckets array
 * (buckets with no load are skipped); 0 when there is no load. */
double kvr_sim_imbalance_series(const double *v, uint32_t n_workers, uint32_t n_buckets);

/* Sorts n u64 values ascending. */
void kvr_sim_sort_u64(uint64_t *v, size_t n);

#endif
