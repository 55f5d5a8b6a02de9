/* charts.c - the report's charts: hit ratio over time, TTFT CDF, load per worker (report.h).
 * SPDX-License-Identifier: Apache-2.0 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "metrics.h"
#include "report.h"
#include "svg.h"

#define W 760
#define H 300

static const char *const palette[] = {"#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f",
                                      "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#17becf"};

const char *kvr_sim_report_color(size_t i)
{
    return palette[i % (sizeof(palette) / sizeof(palette[0]))];
}

double kvr_sim_report_ttft_pct(const struct kvr_sim_result *r, int p)
{
    if (r->n_ttft == 0)
        return 0;
    uint64_t v = p <= 0 ? r->ttft_us[0] : kvr_sim_percentile(r->ttft_us, r->n_ttft, p / 100.0);
    return (double)v / 1000.0;
}

/* x of bucket b's middle: minutes (trace) or queries (events). */
static double bucket_x(const struct kvr_sim_report *rep, const struct kvr_sim_result *r, uint32_t b)
{
    double mid = ((double)b + 0.5) * (double)r->bucket_us;
    return rep->mode == KVR_SIM_MODE_TRACE ? mid / 60e6 : mid;
}

static double x_max(const struct kvr_sim_report *rep, const struct kvr_sim_result *r)
{
    double end = (double)r->n_buckets * (double)r->bucket_us;
    return rep->mode == KVR_SIM_MODE_TRACE ? end / 60e6 : end;
}

static const char *x_label(const struct kvr_sim_report *rep)
{
    return rep->mode == KVR_SIM_MODE_TRACE ? "arrival time (minutes)" : "query (stream order)";
}

static const struct kvr_sim_result *first_ok(const struct kvr_sim_report *rep)
{
    for (size_t i = 0; i < rep->n; i++)
        if (rep->res[i].ok)
            return &rep->res[i];
    return NULL;
}

void kvr_sim_report_hit_chart(FILE *f, const struct kvr_sim_report *rep)
{
    const struct kvr_sim_result *r0 = first_ok(rep);
    size_t nb = r0 ? r0->n_buckets : 0;
    double *xs = calloc(nb ? nb : 1, sizeof(double));
    double *ys = calloc((rep->n + 1) * (nb ? nb : 1), sizeof(double));
    struct kvr_sim_svg_series *s = calloc(rep->n + 1, sizeof(*s));
    size_t ns = 0;
    double top = 0; /* the y axis ends at the next tenth above the highest point */
    if (r0 != NULL && xs != NULL && ys != NULL && s != NULL) {
        for (uint32_t b = 0; b < nb; b++)
            xs[b] = bucket_x(rep, r0, b);
        for (size_t i = 0; i <= rep->n; i++) {
            const struct kvr_sim_result *r = i < rep->n ? &rep->res[i] : r0;
            if (!r->ok)
                continue;
            double *y = ys + ns * nb;
            for (uint32_t b = 0; b < nb; b++) {
                uint64_t num = i < rep->n ? r->bucket_cached[b] : r->bucket_best[b];
                y[b] = r->bucket_blocks[b] ? (double)num / (double)r->bucket_blocks[b] : NAN;
                top = y[b] > top ? y[b] : top;
            }
            s[ns] = (struct kvr_sim_svg_series){i < rep->n ? r->name : "best achievable",
                                                i < rep->n ? kvr_sim_report_color(i) : "#777",
                                                xs,
                                                y,
                                                nb,
                                                i == rep->n};
            ns++;
        }
    }
    struct kvr_sim_svg_chart c = {"Prefix hit ratio per time bucket (cached / requested blocks)",
                                  x_label(rep),
                                  "hit ratio",
                                  0,
                                  r0 ? x_max(rep, r0) : 1,
                                  0,
                                  top < 0.9 ? ceil(top * 10 + 1e-9) / 10 : 1,
                                  0,
                                  W,
                                  H};
    kvr_sim_svg_chart(f, &c, s, ns);
    free(xs);
    free(ys);
    free(s);
}

void kvr_sim_report_ttft_chart(FILE *f, const struct kvr_sim_report *rep)
{
    double lo = INFINITY, hi = 0;
    for (size_t i = 0; i < rep->n; i++)
        if (rep->res[i].ok && rep->res[i].n_ttft > 0) {
            double a = kvr_sim_report_ttft_pct(&rep->res[i], 0);
            double b = kvr_sim_report_ttft_pct(&rep->res[i], 100);
            lo = a < lo ? a : lo;
            hi = b > hi ? b : hi;
        }
    if (!(lo < INFINITY))
        lo = 1, hi = 10;
    double xmin = pow(10, floor(log10(lo > 0.1 ? lo : 0.1)));
    double xmax = pow(10, ceil(log10(hi > xmin * 10 ? hi : xmin * 10)));
    double *xs = calloc(rep->n * 101 + 1, sizeof(double));
    double *ys = calloc(101, sizeof(double));
    struct kvr_sim_svg_series *s = calloc(rep->n + 1, sizeof(*s));
    size_t ns = 0;
    if (xs != NULL && ys != NULL && s != NULL) {
        for (int p = 0; p <= 100; p++)
            ys[p] = p / 100.0;
        for (size_t i = 0; i < rep->n; i++) {
            const struct kvr_sim_result *r = &rep->res[i];
            if (!r->ok || r->n_ttft == 0)
                continue;
            double *x = xs + ns * 101;
            for (int p = 0; p <= 100; p++) {
                double v = kvr_sim_report_ttft_pct(r, p);
                x[p] = v < xmin ? xmin : v;
            }
            s[ns++] = (struct kvr_sim_svg_series){r->name, kvr_sim_report_color(i), x, ys, 101, 0};
        }
    }
    struct kvr_sim_svg_chart c = {"Time to first token (CDF)",
                                  "TTFT (ms, log scale)",
                                  "fraction of requests",
                                  xmin,
                                  xmax,
                                  0,
                                  1,
                                  1,
                                  W,
                                  H};
    kvr_sim_svg_chart(f, &c, s, ns);
    free(xs);
    free(ys);
    free(s);
}

void kvr_sim_report_load_chart(FILE *f, const struct kvr_sim_report *rep, size_t i)
{
    const struct kvr_sim_result *r = &rep->res[i];
    /* One y scale for every policy, so the charts compare at a glance. */
    double ymax = 1;
    for (size_t k = 0; k < rep->n; k++) {
        const struct kvr_sim_result *o = &rep->res[k];
        for (size_t j = 0; o->ok && j < (size_t)o->n_workers * o->n_buckets; j++)
            ymax = o->inflight[j] > ymax ? o->inflight[j] : ymax;
    }
    size_t nw = r->ok ? r->n_workers : 0, nb = r->n_buckets;
    double *xs = calloc(nb ? nb : 1, sizeof(double));
    struct kvr_sim_svg_series *s = calloc(nw ? nw : 1, sizeof(*s));
    char(*labels)[32] = calloc(nw ? nw : 1, sizeof(*labels));
    size_t ns = 0;
    if (xs != NULL && s != NULL && labels != NULL) {
        for (uint32_t b = 0; b < nb; b++)
            xs[b] = bucket_x(rep, r, b);
        for (size_t w = 0; w < nw; w++) {
            snprintf(labels[w], sizeof(labels[w]), "worker %llu",
                     (unsigned long long)r->workers[w].worker_id);
            s[ns++] = (struct kvr_sim_svg_series){
                labels[w], kvr_sim_report_color(w), xs, r->inflight + w * nb, nb, 0};
        }
    }
    char title[160];
    snprintf(title, sizeof(title), "%s: requests in flight per worker (mean per bucket)", r->name);
    struct kvr_sim_svg_chart c = {
        title, x_label(rep),      "in flight", 0, r->ok ? x_max(rep, r) : 1,
        0,     ceil(ymax * 1.05), 0,           W, H};
    kvr_sim_svg_chart(f, &c, s, ns);
    free(xs);
    free(s);
    free(labels);
}
