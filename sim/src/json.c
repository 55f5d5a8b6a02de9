/* json.c - streaming JSON writer (see json.h).
 * SPDX-License-Identifier: Apache-2.0 */
#include "json.h"

#include <inttypes.h>
#include <math.h>
#include <string.h>

void kvr_sim_jw_init(struct kvr_sim_jw *w, FILE *f)
{
    memset(w, 0, sizeof(*w));
    w->f = f;
}

static void put(struct kvr_sim_jw *w, const char *s)
{
    if (fputs(s, w->f) == EOF)
        w->err = 1;
}

static void indent(struct kvr_sim_jw *w)
{
    put(w, "\n");
    for (int i = 0; i < w->depth; i++)
        put(w, "  ");
}

/* Separator and layout before a value or a key. */
static void before(struct kvr_sim_jw *w)
{
    if (w->key) {
        w->key = 0;
        return;
    }
    if (w->depth == 0)
        return;
    int d = w->depth - 1;
    if (w->count[d]++ > 0)
        put(w, w->inl[d] ? ", " : ",");
    if (!w->inl[d])
        indent(w);
}

static void open_c(struct kvr_sim_jw *w, int is_obj, int one_line)
{
    before(w);
    put(w, is_obj ? "{" : "[");
    if (w->depth >= KVR_SIM_JW_DEPTH) {
        w->err = 1;
        return;
    }
    w->count[w->depth] = 0;
    w->inl[w->depth] = (unsigned char)(one_line != 0);
    w->obj[w->depth] = (unsigned char)(is_obj != 0);
    w->depth++;
}

void kvr_sim_jw_obj(struct kvr_sim_jw *w)
{
    open_c(w, 1, 0);
}

void kvr_sim_jw_arr(struct kvr_sim_jw *w, int one_line)
{
    open_c(w, 0, one_line);
}

void kvr_sim_jw_end(struct kvr_sim_jw *w)
{
    if (w->depth == 0) {
        w->err = 1;
        return;
    }
    int d = --w->depth;
    if (w->count[d] > 0 && !w->inl[d])
        indent(w);
    put(w, w->obj[d] ? "}" : "]");
}

static void escape(struct kvr_sim_jw *w, const char *s)
{
    char buf[8];
    put(w, "\"");
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        switch (*p) {
        case '"':
            put(w, "\\\"");
            break;
        case '\\':
            put(w, "\\\\");
            break;
        case '\n':
            put(w, "\\n");
            break;
        case '\t':
            put(w, "\\t");
            break;
        case '\r':
            put(w, "\\r");
            break;
        default:
            if (*p < 0x20) {
                snprintf(buf, sizeof(buf), "\\u%04x", *p);
                put(w, buf);
            } else {
                buf[0] = (char)*p;
                buf[1] = '\0';
                put(w, buf);
            }
        }
    }
    put(w, "\"");
}

void kvr_sim_jw_key(struct kvr_sim_jw *w, const char *k)
{
    before(w);
    escape(w, k);
    put(w, ": ");
    w->key = 1;
}

void kvr_sim_jw_str(struct kvr_sim_jw *w, const char *s)
{
    before(w);
    escape(w, s != NULL ? s : "");
}

void kvr_sim_jw_u64(struct kvr_sim_jw *w, uint64_t v)
{
    char buf[32];
    before(w);
    snprintf(buf, sizeof(buf), "%" PRIu64, v);
    put(w, buf);
}

void kvr_sim_jw_dbl(struct kvr_sim_jw *w, double v)
{
    char buf[64];
    before(w);
    if (!isfinite(v)) {
        put(w, "null");
        return;
    }
    if (v == 0)
        v = 0; /* no "-0" */
    snprintf(buf, sizeof(buf), "%.6g", v);
    put(w, buf);
}

void kvr_sim_jw_bool(struct kvr_sim_jw *w, int v)
{
    before(w);
    put(w, v ? "true" : "false");
}

void kvr_sim_jw_kstr(struct kvr_sim_jw *w, const char *k, const char *s)
{
    kvr_sim_jw_key(w, k);
    kvr_sim_jw_str(w, s);
}

void kvr_sim_jw_ku64(struct kvr_sim_jw *w, const char *k, uint64_t v)
{
    kvr_sim_jw_key(w, k);
    kvr_sim_jw_u64(w, v);
}

void kvr_sim_jw_kdbl(struct kvr_sim_jw *w, const char *k, double v)
{
    kvr_sim_jw_key(w, k);
    kvr_sim_jw_dbl(w, v);
}

int kvr_sim_jw_finish(struct kvr_sim_jw *w)
{
    put(w, "\n");
    if (fflush(w->f) == EOF || ferror(w->f))
        w->err = 1;
    return w->err || w->depth != 0 ? -1 : 0;
}
