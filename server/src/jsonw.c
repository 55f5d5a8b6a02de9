/* jsonw.c - JSON text writer (see jsonw.h). */
#include "jsonw.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvr/err.h"

static void put(struct srv_jw *w, const char *s, size_t n)
{
    if (w->err == 0 && kvr_buf_append(w->b, s, n) != KVR_OK)
        w->err = KVR_ENOMEM;
}

void srv_jw_raw(struct srv_jw *w, const char *s)
{
    put(w, s, strlen(s));
}

void srv_jw_rawn(struct srv_jw *w, const char *s, size_t n)
{
    put(w, s, n);
}

void srv_jw_char(struct srv_jw *w, char c)
{
    put(w, &c, 1);
}

void srv_jw_escaped(struct srv_jw *w, const char *s, size_t n)
{
    static const char hex[] = "0123456789abcdef";
    size_t run = 0; /* start of the pending run of plain bytes */
    for (size_t k = 0; k < n; k++) {
        unsigned char c = (unsigned char)s[k];
        if (c >= 0x20 && c != '"' && c != '\\')
            continue;
        put(w, s + run, k - run);
        run = k + 1;
        char esc[6] = {'\\', 0, 0, 0, 0, 0};
        size_t len = 2;
        switch (c) {
        case '"':
            esc[1] = '"';
            break;
        case '\\':
            esc[1] = '\\';
            break;
        case '\n':
            esc[1] = 'n';
            break;
        case '\r':
            esc[1] = 'r';
            break;
        case '\t':
            esc[1] = 't';
            break;
        default:
            esc[1] = 'u';
            esc[2] = '0';
            esc[3] = '0';
            esc[4] = hex[c >> 4];
            esc[5] = hex[c & 15];
            len = 6;
        }
        put(w, esc, len);
    }
    put(w, s + run, n - run);
}

void srv_jw_str(struct srv_jw *w, const char *s, size_t n)
{
    put(w, "\"", 1);
    srv_jw_escaped(w, s, n);
    put(w, "\"", 1);
}

void srv_jw_cstr(struct srv_jw *w, const char *s)
{
    if (s == NULL)
        put(w, "null", 4);
    else
        srv_jw_str(w, s, strlen(s));
}

void srv_jw_key(struct srv_jw *w, const char *key)
{
    put(w, "\"", 1);
    put(w, key, strlen(key));
    put(w, "\":", 2);
}

void srv_jw_u64(struct srv_jw *w, uint64_t v)
{
    char d[KVR_U64_DEC_MAX];
    put(w, d, kvr_buf_fmt_u64(d, v));
}

void srv_jw_i64(struct srv_jw *w, int64_t v)
{
    if (v < 0) {
        put(w, "-", 1);
        srv_jw_u64(w, (uint64_t)0 - (uint64_t)v);
    } else {
        srv_jw_u64(w, (uint64_t)v);
    }
}

void srv_jw_dbl(struct srv_jw *w, double v)
{
    if (!isfinite(v)) {
        put(w, "null", 4);
        return;
    }
    char d[40];
    int n = 0;
    /* the shortest of %.15g / %.17g that reads back as the same double */
    for (int prec = 15; prec <= 17; prec++) {
        n = snprintf(d, sizeof(d), "%.*g", prec, v);
        if (strtod(d, NULL) == v)
            break;
    }
    put(w, d, (size_t)n);
}

void srv_jw_bool(struct srv_jw *w, int v)
{
    if (v)
        put(w, "true", 4);
    else
        put(w, "false", 5);
}

void srv_jw_u64str(struct srv_jw *w, uint64_t v)
{
    put(w, "\"", 1);
    srv_jw_u64(w, v);
    put(w, "\"", 1);
}

int srv_jw_error_body(struct kvr_buf *b, const char *msg)
{
    struct srv_jw w;
    kvr_buf_reset(b);
    srv_jw_init(&w, b);
    srv_jw_raw(&w, "{\"error\":");
    srv_jw_cstr(&w, msg);
    srv_jw_char(&w, '}');
    return w.err;
}
