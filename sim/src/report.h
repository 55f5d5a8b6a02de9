/* report.h - helpers shared by the JSON and HTML writers (output.c, report.c).
 * SPDX-License-Identifier: Apache-2.0 */
#ifndef KVR_SIM_REPORT_H
#define KVR_SIM_REPORT_H

#include <stddef.h>
#include <stdio.h>

#include "kvr/sim.h"

/* TTFT in ms at percentile p of a trace-mode result: p = 0 the minimum, else nearest-rank
 * (p = 100 the maximum). 0 without samples. */
double kvr_sim_report_ttft_pct(const struct kvr_sim_result *r, int p);

/* The i-th colour of the report palette (cycles). Static string. */
const char *kvr_sim_report_color(size_t i);

/* The three kinds of chart, as standalone <svg> elements. */
void kvr_sim_report_hit_chart(FILE *f, const struct kvr_sim_report *rep);
void kvr_sim_report_ttft_chart(FILE *f, const struct kvr_sim_report *rep);
void kvr_sim_report_load_chart(FILE *f, const struct kvr_sim_report *rep, size_t i);

#endif
