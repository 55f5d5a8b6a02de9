/* svg.c - line charts as SVG text (see svg.h).
 * SPDX-License-Identifier: Apache-2.0 */
#include "svg.h"

#include <math.h>

#define ML 64.0 /* left margin: y tick labels */
#define MR 30.0
#define MT 28.0  /* title */
#define MB 44.0  /* x tick labels and x label */
#define LEG 18.0 /* one legend row */

void kvr_sim_svg_text(FILE *f, const char *s)
{
    for (; s != NULL && *s; s++) {
        switch (*s) {
        case '&':
            fputs("&amp;", f);
            break;
        case '<':
            fputs("&lt;", f);
            break;
        case '>':
            fputs("&gt;", f);
            break;
        case '"':
            fputs("&quot;", f);
            break;
        default:
            fputc(*s, f);
        }
    }
}

/* A 1-2-5 tick step giving about `want` intervals over range. */
static double nice_step(double range, int want)
{
    if (!(range > 0))
        return 1;
    double raw = range / want, p = pow(10, floor(log10(raw))), m = raw / p;
    return (m < 1.5 ? 1 : m < 3.5 ? 2 : m < 7.5 ? 5 : 10) * p;
}

/* Tick label: integers without decimals, else up to 3 significant decimals. */
static void tick_label(char *buf, size_t cap, double v)
{
    if (fabs(v) < 1e-12)
        v = 0;
    if (fabs(v - round(v)) < 1e-9 && fabs(v) < 1e15)
        snprintf(buf, cap, "%.0f", v);
    else
        snprintf(buf, cap, "%.3g", v);
}

struct frame {
    const struct kvr_sim_svg_chart *c;
    double x0, y0, w, h; /* plot area */
};

static double px(const struct frame *fr, double x)
{
    const struct kvr_sim_svg_chart *c = fr->c;
    double t;
    if (c->logx)
        t = (log10(x) - log10(c->xmin)) / (log10(c->xmax) - log10(c->xmin));
    else
        t = (x - c->xmin) / (c->xmax - c->xmin);
    if (!(t >= 0))
        t = 0;
    if (t > 1)
        t = 1;
    return fr->x0 + t * fr->w;
}

static double py(const struct frame *fr, double y)
{
    const struct kvr_sim_svg_chart *c = fr->c;
    double t = (y - c->ymin) / (c->ymax - c->ymin);
    if (!(t >= 0))
        t = 0;
    if (t > 1)
        t = 1;
    return fr->y0 + fr->h - t * fr->h;
}

static void axes(FILE *f, const struct frame *fr)
{
    const struct kvr_sim_svg_chart *c = fr->c;
    char lab[32];
    /* y ticks */
    double ys = nice_step(c->ymax - c->ymin, 5);
    for (double v = ceil(c->ymin / ys) * ys; v <= c->ymax + ys * 1e-9; v += ys) {
        double y = py(fr, v);
        tick_label(lab, sizeof(lab), v);
        fprintf(f,
                "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#e5e5e5\"/>"
                "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">%s</text>\n",
                fr->x0, y, fr->x0 + fr->w, y, fr->x0 - 6, y + 4, lab);
    }
    /* x ticks */
    if (c->logx) {
        for (double d = pow(10, floor(log10(c->xmin))); d <= c->xmax * (1 + 1e-9); d *= 10) {
            if (d < c->xmin * (1 - 1e-9))
                continue;
            double x = px(fr, d);
            tick_label(lab, sizeof(lab), d);
            fprintf(f,
                    "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#e5e5e5\"/>"
                    "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%s</text>\n",
                    x, fr->y0, x, fr->y0 + fr->h, x, fr->y0 + fr->h + 16, lab);
        }
    } else {
        double xs = nice_step(c->xmax - c->xmin, 6);
        for (double v = ceil(c->xmin / xs) * xs; v <= c->xmax + xs * 1e-9; v += xs) {
            double x = px(fr, v);
            tick_label(lab, sizeof(lab), v);
            fprintf(f,
                    "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#e5e5e5\"/>"
                    "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%s</text>\n",
                    x, fr->y0, x, fr->y0 + fr->h, x, fr->y0 + fr->h + 16, lab);
        }
    }
    fprintf(f,
            "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"none\" "
            "stroke=\"#888\"/>\n",
            fr->x0, fr->y0, fr->w, fr->h);
    fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">", fr->x0 + fr->w / 2,
            fr->y0 + fr->h + 34);
    kvr_sim_svg_text(f, c->xlabel);
    fprintf(f,
            "</text>\n<text transform=\"translate(14,%.1f) rotate(-90)\" "
            "text-anchor=\"middle\">",
            fr->y0 + fr->h / 2);
    kvr_sim_svg_text(f, c->ylabel);
    fputs("</text>\n", f);
}

/* Legend entries per row, given the chart width. */
static size_t per_row(const struct kvr_sim_svg_chart *c)
{
    size_t k = (size_t)((c->width - ML) / 150);
    return k ? k : 1;
}

void kvr_sim_svg_chart(FILE *f, const struct kvr_sim_svg_chart *c,
                       const struct kvr_sim_svg_series *s, size_t n)
{
    size_t rows = (n + per_row(c) - 1) / per_row(c);
    double total_h = c->height + rows * LEG;
    struct frame fr = {c, ML, MT, c->width - ML - MR, c->height - MT - MB};
    fprintf(f,
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%.0f\" "
            "viewBox=\"0 0 %d %.0f\" font-family=\"sans-serif\" font-size=\"11\">\n"
            "<rect width=\"100%%\" height=\"100%%\" fill=\"#fff\"/>\n"
            "<text x=\"%.1f\" y=\"18\" font-size=\"13\" font-weight=\"bold\">",
            c->width, total_h, c->width, total_h, ML);
    kvr_sim_svg_text(f, c->title);
    fputs("</text>\n", f);
    axes(f, &fr);
    for (size_t k = 0; k < n; k++) {
        fprintf(f, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"1.6\"%s points=\"",
                s[k].color, s[k].dashed ? " stroke-dasharray=\"5,3\"" : "");
        int first = 1;
        for (size_t i = 0; i < s[k].n; i++) {
            double x = s[k].x[i], y = s[k].y[i];
            if (!isfinite(x) || !isfinite(y) || (c->logx && !(x > 0)))
                continue;
            fprintf(f, "%s%.1f,%.1f", first ? "" : " ", px(&fr, x), py(&fr, y));
            first = 0;
        }
        fputs("\"/>\n", f);
    }
    for (size_t k = 0; k < n; k++) {
        double lx = ML + (double)(k % per_row(c)) * 150;
        double ly = c->height + (double)(k / per_row(c)) * LEG + 4;
        fprintf(f,
                "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"%s\" "
                "stroke-width=\"3\"%s/><text x=\"%.1f\" y=\"%.1f\">",
                lx, ly, lx + 18, ly, s[k].color, s[k].dashed ? " stroke-dasharray=\"5,3\"" : "",
                lx + 24, ly + 4);
        kvr_sim_svg_text(f, s[k].label);
        fputs("</text>\n", f);
    }
    fputs("</svg>\n", f);
}
