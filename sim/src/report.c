/* report.c - the self-contained HTML report and the standalone SVG files (kvr/sim.h).
 * SPDX-License-Identifier: Apache-2.0
 *
 * One HTML page, no script, no external resource: a summary table, the hit ratio over time
 * (every policy and the best achievable), the TTFT CDF, and per policy the in-flight load of
 * every worker over time with a table of shares. Everything printed is a function of the
 * results, so the same inputs give the same bytes (no date, no wall-clock figure). */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "kvr/err.h"
#include "kvr/sim.h"
#include "report.h"
#include "svg.h"

static const char css[] =
    "body{font-family:sans-serif;max-width:980px;margin:24px auto;padding:0 12px;color:#222}"
    "table{border-collapse:collapse;margin:8px 0 16px}"
    "th,td{border:1px solid #ccc;padding:3px 8px;text-align:right;font-size:13px}"
    "th:first-child,td:first-child{text-align:left}th{background:#f3f3f3}"
    "code{background:#f3f3f3;padding:0 3px}.err{color:#b00}.note{color:#555;font-size:13px}"
    "svg{display:block;margin:8px 0}";

static double pct(uint64_t a, uint64_t b)
{
    return b ? 100.0 * (double)a / (double)b : 0;
}

static void swatch(FILE *f, size_t i)
{
    fprintf(f, "<span style=\"color:%s\">&#9632;</span> ", kvr_sim_report_color(i));
}

static void summary(FILE *f, const struct kvr_sim_report *rep)
{
    int trace = rep->mode == KVR_SIM_MODE_TRACE;
    fputs("<h2>Summary</h2>\n<table>\n<tr><th>policy</th><th>hit ratio</th><th>best "
          "achievable</th><th>% of best</th><th>imbalance</th>",
          f);
    if (trace)
        fputs("<th>TTFT p50 (ms)</th><th>TTFT p99 (ms)</th><th>throughput (req/s)</th>", f);
    else
        fputs("<th>oracle hit ratio</th><th>expect mismatches</th>", f);
    fputs("<th>policy failures</th></tr>\n", f);
    for (size_t i = 0; i < rep->n; i++) {
        const struct kvr_sim_result *r = &rep->res[i];
        fputs("<tr><td>", f);
        swatch(f, i);
        kvr_sim_svg_text(f, r->name);
        if (!r->ok) {
            fprintf(f, "</td><td colspan=\"%d\" class=\"err\">", trace ? 8 : 7);
            kvr_sim_svg_text(f, r->error);
            fputs("</td></tr>\n", f);
            continue;
        }
        fprintf(f, "</td><td>%.4f</td><td>%.4f</td><td>%.1f%%</td><td>%.3f</td>", r->hit_ratio,
                r->best_hit_ratio,
                r->best_hit_ratio > 0 ? 100 * r->hit_ratio / r->best_hit_ratio : 0, r->imbalance);
        if (trace)
            fprintf(f, "<td>%.0f</td><td>%.0f</td><td>%.3f</td>", r->ttft_ms.p50, r->ttft_ms.p99,
                    r->throughput_rps);
        else
            fprintf(f, "<td>%.4f</td><td>%llu</td>",
                    r->blocks ? (double)r->oracle_blocks / (double)r->blocks : 0,
                    (unsigned long long)r->expect_mismatches);
        const struct kvr_sim_policy_counts *c = &r->policy;
        fprintf(f, "<td>%llu", (unsigned long long)c->fallbacks);
        if (c->first_error[0]) {
            fputs("<br><span class=\"err\">", f);
            kvr_sim_svg_text(f, c->first_error);
            fputs("</span>", f);
        }
        fputs("</td></tr>\n", f);
    }
    fputs("</table>\n", f);
}

static void config(FILE *f, const struct kvr_sim_report *rep)
{
    const struct kvr_sim_config *c = rep->cfg;
    fputs("<p>Input <code>", f);
    kvr_sim_svg_text(f, rep->input);
    if (rep->mode == KVR_SIM_MODE_TRACE) {
        fprintf(f,
                "</code>: %llu requests over %.1f minutes (time scale %g). %u workers, each an "
                "LRU prefix cache of %llu blocks of %u tokens (%u block(s) per trace id). "
                "Latency model: prefill %g &micro;s per uncached token + %g ms, decode %g ms per "
                "output token, %u slots and %u prefill lane(s) per worker. Seed %llu. One pooled "
                "LRU cache of the same total size would reach a hit ratio of %.4f.</p>\n",
                (unsigned long long)rep->trace_requests, rep->trace_duration_s / 60, c->time_scale,
                c->workers, (unsigned long long)c->cache_blocks, c->block_size, kvr_sim_expand(c),
                c->prefill_us_per_token, c->prefill_overhead_us / 1000,
                c->decode_us_per_token / 1000, c->slots, c->prefill_lanes,
                (unsigned long long)c->seed, rep->pooled_hit_ratio);
    } else {
        fprintf(f,
                "</code> (op stream: recorded KV events and routing queries): %llu queries. "
                "Each routed query stays in flight for the next %u queries. Seed %llu.</p>\n",
                (unsigned long long)rep->trace_requests, c->inflight, (unsigned long long)c->seed);
    }
}

static void worker_table(FILE *f, const struct kvr_sim_result *r)
{
    fputs("<table>\n<tr><th>worker</th><th>requests</th><th>% of requests</th><th>% of "
          "blocks</th><th>hit ratio</th><th>mean in flight</th><th>max in flight</th></tr>\n",
          f);
    for (uint32_t w = 0; w < r->n_workers; w++) {
        const struct kvr_sim_worker_stats *s = &r->workers[w];
        fputs("<tr><td>", f);
        swatch(f, w);
        fprintf(f,
                "%llu</td><td>%llu</td><td>%.1f</td><td>%.1f</td><td>%.4f</td><td>%.2f</td>"
                "<td>%llu</td></tr>\n",
                (unsigned long long)s->worker_id, (unsigned long long)s->requests,
                pct(s->requests, r->requests), pct(s->blocks, r->blocks),
                s->blocks ? (double)s->cached_blocks / (double)s->blocks : 0, s->mean_inflight,
                (unsigned long long)s->max_inflight);
    }
    fputs("</table>\n", f);
}

static const char definitions[] =
    "<h2>Definitions</h2>\n<ul class=\"note\">\n"
    "<li><b>hit ratio</b>: blocks found in the chosen worker's cache when its prefill starts, "
    "over all requested blocks.</li>\n"
    "<li><b>best achievable</b>: each request's longest prefix seen in any earlier request (one "
    "infinite cache shared by every worker), over all requested blocks; no routing can beat "
    "it.</li>\n"
    "<li><b>imbalance</b>: the most requests routed to one worker over the mean per worker "
    "(1 = perfectly even); <b>over time</b>: the same for requests in flight, bucket by bucket "
    "(the sum of each bucket's maximum over the sum of its means).</li>\n"
    "<li><b>pooled LRU cache</b>: one cache holding every worker's capacity, fed every request "
    "on arrival: how much of the best achievable the total capacity allows.</li>\n"
    "<li><b>TTFT</b>: first token minus arrival (queueing + prefill). <b>throughput</b>: "
    "completed requests over the time from the first arrival to the last completion.</li>\n"
    "<li><b>policy failures</b>: decisions the Lua policy could not make (error, timeout, "
    "memory, invalid choice), routed by the built-in classic KV cost instead.</li>\n"
    "<li>In --events mode: the hit ratio is the overlap the index reports for the chosen worker; "
    "<b>oracle</b> is the largest overlap any worker had for that query.</li>\n"
    "</ul>\n";

int kvr_sim_write_html(FILE *f, const struct kvr_sim_report *rep)
{
    fprintf(f,
            "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
            "<title>kvrouter policy lab</title>\n<style>%s</style>\n</head>\n<body>\n"
            "<h1>kvrouter policy lab</h1>\n",
            css);
    config(f, rep);
    summary(f, rep);
    fputs("<h2>Prefix hit ratio over time</h2>\n", f);
    kvr_sim_report_hit_chart(f, rep);
    if (rep->mode == KVR_SIM_MODE_TRACE) {
        fputs("<h2>Time to first token</h2>\n", f);
        kvr_sim_report_ttft_chart(f, rep);
    }
    fputs("<h2>Load per worker</h2>\n", f);
    for (size_t i = 0; i < rep->n; i++) {
        const struct kvr_sim_result *r = &rep->res[i];
        if (!r->ok)
            continue;
        fputs("<h3>", f);
        kvr_sim_svg_text(f, r->name);
        fprintf(f,
                " <span class=\"note\">(imbalance %.3f by requests, %.3f over time, %.3f by "
                "blocks)</span></h3>\n",
                r->imbalance, r->imbalance_inflight, r->imbalance_blocks);
        kvr_sim_report_load_chart(f, rep, i);
        worker_table(f, r);
    }
    fputs(definitions, f);
    fputs("</body>\n</html>\n", f);
    return fflush(f) == EOF || ferror(f) ? KVR_EIO : KVR_OK;
}

/* Opens dir/name for writing. */
static FILE *open_in(const char *dir, const char *name, char *path, size_t cap)
{
    snprintf(path, cap, "%s/%s", dir, name);
    return fopen(path, "w");
}

static int close_checked(FILE *f, const char *path, char *err, size_t err_len)
{
    int bad = ferror(f);
    if (fclose(f) == EOF || bad) {
        snprintf(err, err_len, "%s: write failed", path);
        return KVR_EIO;
    }
    return KVR_OK;
}

int kvr_sim_write_svgs(const char *dir, const struct kvr_sim_report *rep, char *err, size_t err_len)
{
    char path[4096], name[KVR_SIM_NAME_MAX + 16];
    for (size_t k = 0; k < rep->n + 2; k++) {
        if (k == 1 && rep->mode != KVR_SIM_MODE_TRACE)
            continue;
        if (k >= 2 && !rep->res[k - 2].ok)
            continue;
        if (k == 0)
            snprintf(name, sizeof(name), "hit_ratio.svg");
        else if (k == 1)
            snprintf(name, sizeof(name), "ttft_cdf.svg");
        else
            snprintf(name, sizeof(name), "load_%s.svg", rep->res[k - 2].name);
        FILE *f = open_in(dir, name, path, sizeof(path));
        if (f == NULL) {
            snprintf(err, err_len, "%s: %s", path, strerror(errno));
            return KVR_EIO;
        }
        fputs("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n", f);
        if (k == 0)
            kvr_sim_report_hit_chart(f, rep);
        else if (k == 1)
            kvr_sim_report_ttft_chart(f, rep);
        else
            kvr_sim_report_load_chart(f, rep, k - 2);
        int rc = close_checked(f, path, err, err_len);
        if (rc != KVR_OK)
            return rc;
    }
    return KVR_OK;
}
