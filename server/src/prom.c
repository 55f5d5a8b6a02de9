/* prom.c - Prometheus text format writer and histograms (see prom.h). */
#include "prom.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvr/err.h"

void srv_hist_observe(struct srv_hist *h, const struct srv_hist_spec *spec, uint64_t v)
{
    size_t k = 0;
    while (k < spec->n && v > spec->bound[k])
        k++;
    srv_stat_add(&h->count[k], 1);
    srv_stat_add(&h->sum, v);
}

void srv_hist_read(const struct srv_hist *h, struct srv_hist_snap *s)
{
    for (size_t k = 0; k <= SRV_HIST_MAX; k++)
        s->count[k] += srv_stat_get(&h->count[k]);
    s->sum += srv_stat_get(&h->sum);
}

void srv_prom_init(struct srv_prom *p, struct kvr_buf *b)
{
    p->b = b;
    p->err = KVR_OK;
}

static void put(struct srv_prom *p, const char *s, size_t n)
{
    if (p->err == KVR_OK && kvr_buf_append(p->b, s, n) != KVR_OK)
        p->err = KVR_ENOMEM;
}

static void puts_(struct srv_prom *p, const char *s)
{
    put(p, s, strlen(s));
}

const char *srv_prom_escape(const char *s, char *out, size_t cap)
{
    size_t o = 0;
    if (cap == 0)
        return out;
    for (; s != NULL && *s != '\0' && o + 2 < cap; s++) {
        if (*s == '\\' || *s == '"') {
            out[o++] = '\\';
            out[o++] = *s;
        } else if (*s == '\n') {
            out[o++] = '\\';
            out[o++] = 'n';
        } else {
            out[o++] = *s;
        }
    }
    out[o] = '\0';
    return out;
}

void srv_prom_header(struct srv_prom *p, const char *name, const char *type, const char *help)
{
    puts_(p, "# HELP ");
    puts_(p, name);
    put(p, " ", 1);
    puts_(p, help);
    puts_(p, "\n# TYPE ");
    puts_(p, name);
    put(p, " ", 1);
    puts_(p, type);
    put(p, "\n", 1);
}

static void labels(struct srv_prom *p, const struct srv_prom_label *l, size_t nl, const char *le)
{
    if (nl == 0 && le == NULL)
        return;
    put(p, "{", 1);
    char esc[512];
    for (size_t k = 0; k < nl; k++) {
        if (k > 0)
            put(p, ",", 1);
        puts_(p, l[k].name);
        put(p, "=\"", 2);
        puts_(p, srv_prom_escape(l[k].value, esc, sizeof(esc)));
        put(p, "\"", 1);
    }
    if (le != NULL) {
        if (nl > 0)
            put(p, ",", 1);
        put(p, "le=\"", 4);
        puts_(p, le);
        put(p, "\"", 1);
    }
    put(p, "}", 1);
}

static void fmt_dbl(char *d, size_t cap, double v)
{
    if (isnan(v))
        snprintf(d, cap, "NaN");
    else if (isinf(v))
        snprintf(d, cap, v > 0 ? "+Inf" : "-Inf");
    else
        for (int prec = 15; prec <= 17; prec++) { /* the shortest form that reads back */
            snprintf(d, cap, "%.*g", prec, v);
            if (strtod(d, NULL) == v)
                break;
        }
}

void srv_prom_u64(struct srv_prom *p, const char *name, const struct srv_prom_label *l, size_t nl,
                  uint64_t v)
{
    char d[KVR_U64_DEC_MAX + 2];
    puts_(p, name);
    labels(p, l, nl, NULL);
    put(p, " ", 1);
    put(p, d, kvr_buf_fmt_u64(d, v));
    put(p, "\n", 1);
}

void srv_prom_dbl(struct srv_prom *p, const char *name, const struct srv_prom_label *l, size_t nl,
                  double v)
{
    char d[48];
    fmt_dbl(d, sizeof(d), v);
    puts_(p, name);
    labels(p, l, nl, NULL);
    put(p, " ", 1);
    puts_(p, d);
    put(p, "\n", 1);
}

void srv_prom_hist(struct srv_prom *p, const char *name, const struct srv_prom_label *l, size_t nl,
                   const struct srv_hist_spec *spec, const struct srv_hist_snap *s)
{
    char n[160], le[48], d[KVR_U64_DEC_MAX + 2];
    uint64_t cum = 0;
    snprintf(n, sizeof(n), "%s_bucket", name);
    for (size_t k = 0; k <= spec->n; k++) {
        cum += s->count[k];
        if (k < spec->n)
            snprintf(le, sizeof(le), "%.10g", (double)spec->bound[k] * spec->scale);
        else
            snprintf(le, sizeof(le), "+Inf");
        puts_(p, n);
        labels(p, l, nl, le);
        put(p, " ", 1);
        put(p, d, kvr_buf_fmt_u64(d, cum));
        put(p, "\n", 1);
    }
    snprintf(n, sizeof(n), "%s_sum", name);
    srv_prom_dbl(p, n, l, nl, (double)s->sum * spec->scale);
    snprintf(n, sizeof(n), "%s_count", name);
    srv_prom_u64(p, n, l, nl, cum);
}

void srv_prom_counter(struct srv_prom *p, const char *name, const char *help, uint64_t v)
{
    srv_prom_header(p, name, "counter", help);
    srv_prom_u64(p, name, NULL, 0, v);
}

void srv_prom_gauge(struct srv_prom *p, const char *name, const char *help, uint64_t v)
{
    srv_prom_header(p, name, "gauge", help);
    srv_prom_u64(p, name, NULL, 0, v);
}
