/* jsonw.h - a minimal JSON text writer over kvr_buf with a sticky error.
 *
 * Handlers build replies by appending pieces; the first allocation failure is remembered and
 * every later call is a no-op, so code writes straight through and checks w->err once at the end
 * (the reply then becomes a 503). No automatic commas: the caller writes separators, which keeps
 * the hot encoders (query scores, dumps) branch-free. Integers are exact (u64 as bare decimals);
 * doubles use the shortest "%.17g" form that round-trips, and non-finite values are written as
 * null (JSON has no NaN).
 *
 * Thread-safety: none; a writer belongs to one thread.
 */
#ifndef KVR_SRV_JSONW_H
#define KVR_SRV_JSONW_H

#include <stddef.h>
#include <stdint.h>

#include "kvr/buf.h"

struct srv_jw {
    struct kvr_buf *b; /* borrowed output */
    int err;           /* KVR_ENOMEM after the first failure, else KVR_OK */
};

static inline void srv_jw_init(struct srv_jw *w, struct kvr_buf *b)
{
    w->b = b;
    w->err = 0;
}

void srv_jw_raw(struct srv_jw *w, const char *s);            /* verbatim (NUL-terminated) */
void srv_jw_rawn(struct srv_jw *w, const char *s, size_t n); /* verbatim n bytes */
void srv_jw_char(struct srv_jw *w, char c);                  /* one byte */
void srv_jw_str(struct srv_jw *w, const char *s, size_t n);  /* quoted and escaped */
void srv_jw_cstr(struct srv_jw *w, const char *s);           /* quoted; NULL writes null */
void srv_jw_key(struct srv_jw *w, const char *key);          /* "key": (key is trusted) */
void srv_jw_u64(struct srv_jw *w, uint64_t v);               /* bare decimal */
void srv_jw_i64(struct srv_jw *w, int64_t v);                /* bare decimal, signed */
void srv_jw_dbl(struct srv_jw *w, double v);                 /* number or null */
void srv_jw_bool(struct srv_jw *w, int v);                   /* true / false */
void srv_jw_u64str(struct srv_jw *w, uint64_t v);            /* "123" (a map key) */

/* Appends the JSON-escaped form of s[0..n) without quotes (for building keys). */
void srv_jw_escaped(struct srv_jw *w, const char *s, size_t n);

#endif
