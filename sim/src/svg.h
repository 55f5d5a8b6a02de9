/* svg.h - minimal line charts as inline SVG (no script, no external resources).
 * SPDX-License-Identifier: Apache-2.0
 *
 * Design: one function draws a whole chart: frame, "nice" ticks (1-2-5 steps, or decades on a
 * logarithmic x axis), grid, axis labels, the series as polylines (clipped to the plot area),
 * and a legend below the plot. Coordinates are printed with one decimal, so the same data
 * always gives the same bytes.
 *
 *   ┌ title ─────────────────────────────┐
 *   │ 1.0 ┤ ╭─╮      ╭──                  │   width × height pixels; margins fixed
 *   │ 0.5 ┤─╯  ╰────╯   (series)          │
 *   │ 0.0 ┼────┬────┬────┬                │
 *   │      0   10   20   30  x label      │
 *   │  ■ policy a   ■ policy b   ┄ best   │
 *   └────────────────────────────────────┘
 * Not thread-safe (writes to one FILE).
 */
#ifndef KVR_SIM_SVG_H
#define KVR_SIM_SVG_H

#include <stddef.h>
#include <stdio.h>

struct kvr_sim_svg_series {
    const char *label; /* legend text (escaped on output) */
    const char *color; /* CSS colour, e.g. "#4e79a7" */
    const double *x;   /* n points (borrowed) */
    const double *y;
    size_t n;
    int dashed; /* draw dashed */
};

struct kvr_sim_svg_chart {
    const char *title;
    const char *xlabel;
    const char *ylabel;
    double xmin, xmax, ymin, ymax; /* axis ranges (xmin > 0 with logx) */
    int logx;                      /* logarithmic x axis */
    int width, height;             /* pixels */
};

/* Writes one <svg> element (standalone-capable: it carries the xmlns). Points outside the ranges
 * are clamped to the frame; non-finite points are skipped. */
void kvr_sim_svg_chart(FILE *f, const struct kvr_sim_svg_chart *c,
                       const struct kvr_sim_svg_series *s, size_t n);

/* Writes s with &, <, >, " escaped (for SVG and HTML text and attributes). */
void kvr_sim_svg_text(FILE *f, const char *s);

#endif
