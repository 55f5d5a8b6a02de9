/* metrics.c - percentiles, imbalance, in-flight load series (see metrics.h).
 * SPDX-License-Identifier: Apache-2.0 */
#include "metrics.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kvr/err.h"

int kvr_sim_load_init(struct kvr_sim_load_series *s, uint32_t n_workers, uint32_t n_buckets,
                      uint64_t window)
{
    memset(s, 0, sizeof(*s));
    if (n_buckets == 0)
        n_buckets = 1;
    if (window == 0)
        window = 1;
    s->n_workers = n_workers;
    s->n_buckets = n_buckets;
    s->window = window;
    s->width = (window + n_buckets - 1) / n_buckets;
    size_t nw = n_workers ? n_workers : 1;
    s->area = calloc(nw * n_buckets, sizeof(*s->area));
    s->last = calloc(nw, sizeof(*s->last));
    s->count = calloc(nw, sizeof(*s->count));
    s->max = calloc(nw, sizeof(*s->max));
    s->total = calloc(nw, sizeof(*s->total));
    if (s->area == NULL || s->last == NULL || s->count == NULL || s->max == NULL ||
        s->total == NULL) {
        kvr_sim_load_free(s);
        return KVR_ENOMEM;
    }
    return KVR_OK;
}

void kvr_sim_load_free(struct kvr_sim_load_series *s)
{
    free(s->area);
    free(s->last);
    free(s->count);
    free(s->max);
    free(s->total);
    memset(s, 0, sizeof(*s));
}

uint32_t kvr_sim_bucket_of(uint64_t t, uint64_t width, uint32_t n_buckets)
{
    uint64_t b = width ? t / width : 0;
    return b >= n_buckets ? n_buckets - 1 : (uint32_t)b;
}

/* Adds count × (overlap of [from, to) with each bucket) to worker w's areas. */
static void integrate(struct kvr_sim_load_series *s, uint32_t w, uint64_t from, uint64_t to)
{
    uint64_t c = s->count[w];
    if (to > s->window)
        to = s->window;
    if (c == 0 || from >= to)
        return;
    double *a = s->area + (size_t)w * s->n_buckets;
    s->total[w] += (double)c * (double)(to - from);
    while (from < to) {
        uint32_t b = kvr_sim_bucket_of(from, s->width, s->n_buckets);
        uint64_t end = (uint64_t)(b + 1) * s->width;
        if (end > to || b == s->n_buckets - 1)
            end = to;
        a[b] += (double)c * (double)(end - from);
        from = end;
    }
}

void kvr_sim_load_change(struct kvr_sim_load_series *s, uint32_t w, uint64_t now, int delta)
{
    integrate(s, w, s->last[w], now);
    s->last[w] = now;
    if (delta < 0 && s->count[w] < (uint64_t)-delta)
        s->count[w] = 0;
    else
        s->count[w] = (uint64_t)((int64_t)s->count[w] + delta);
    if (s->count[w] > s->max[w])
        s->max[w] = s->count[w];
}

void kvr_sim_load_finish(struct kvr_sim_load_series *s, uint64_t end)
{
    for (uint32_t w = 0; w < s->n_workers; w++) {
        integrate(s, w, s->last[w], end);
        s->last[w] = end;
    }
}

double kvr_sim_load_mean(const struct kvr_sim_load_series *s, uint32_t w, uint32_t b)
{
    uint64_t start = (uint64_t)b * s->width;
    if (start >= s->window)
        return 0;
    uint64_t end = b == s->n_buckets - 1 ? s->window : start + s->width;
    if (end > s->window)
        end = s->window;
    return s->area[(size_t)w * s->n_buckets + b] / (double)(end - start);
}

uint64_t kvr_sim_percentile(const uint64_t *sorted, size_t n, double p)
{
    if (n == 0)
        return 0;
    double r = ceil(p * (double)n);
    size_t k = r < 1 ? 0 : (size_t)r - 1;
    return sorted[k < n ? k : n - 1];
}

void kvr_sim_dist_ms(const uint64_t *sorted_us, size_t n, struct kvr_sim_dist *out)
{
    memset(out, 0, sizeof(*out));
    if (n == 0)
        return;
    double sum = 0;
    for (size_t i = 0; i < n; i++)
        sum += (double)sorted_us[i];
    out->mean = sum / (double)n / 1000.0;
    out->p50 = (double)kvr_sim_percentile(sorted_us, n, 0.50) / 1000.0;
    out->p90 = (double)kvr_sim_percentile(sorted_us, n, 0.90) / 1000.0;
    out->p99 = (double)kvr_sim_percentile(sorted_us, n, 0.99) / 1000.0;
    out->max = (double)sorted_us[n - 1] / 1000.0;
}

double kvr_sim_imbalance(const uint64_t *v, size_t n, size_t stride)
{
    if (n == 0)
        return 0;
    uint64_t mx = 0;
    double sum = 0;
    for (size_t i = 0; i < n; i++) {
        uint64_t x = *(const uint64_t *)((const char *)v + i * stride);
        sum += (double)x;
        if (x > mx)
            mx = x;
    }
    return sum > 0 ? (double)mx * (double)n / sum : 0;
}

double kvr_sim_imbalance_series(const double *v, uint32_t n_workers, uint32_t n_buckets)
{
    double num = 0, den = 0;
    for (uint32_t b = 0; b < n_buckets; b++) {
        double mx = 0, sum = 0;
        for (uint32_t w = 0; w < n_workers; w++) {
            double x = v[(size_t)w * n_buckets + b];
            sum += x;
            mx = x > mx ? x : mx;
        }
        if (sum > 0) {
            num += mx;
            den += sum / n_workers;
        }
    }
    return den > 0 ? num / den : 0;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

void kvr_sim_sort_u64(uint64_t *v, size_t n)
{
    if (n > 1)
        qsort(v, n, sizeof(*v), cmp_u64);
}
