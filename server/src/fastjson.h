/* fastjson.h - a fast path for the hottest request body, /query_by_hash:
 *
 *     {"block_hashes": [int, ...], "model_name": "m", "tenant_id": "t"}
 *
 * parsed in one pass straight from the text (no json-c tree, no allocation), with the same exact
 * integer rules as the general reader (u64, or negative i64 taken as two's complement; no
 * fractions, exponents, leading zeros or out-of-range values). Anything else - another key, a
 * string escape, a malformed value - makes it answer "not mine" (0), and the caller falls back
 * to the general strict parser, which produces the proper error message. So this path can only
 * accept bodies the general path would accept with the same meaning.
 *
 * Thread-safety: pure.
 */
#ifndef KVR_SRV_FASTJSON_H
#define KVR_SRV_FASTJSON_H

#include <stddef.h>
#include <stdint.h>

struct srv_fast_query {
    const char *model; /* borrowed from the text; NULL if absent */
    size_t model_len;
    const char *tenant; /* borrowed; NULL if absent */
    size_t tenant_len;
    size_t n; /* hashes written to the caller's array */
};

/* Parses text[0..len) into hashes[0..cap). Returns 1 if the body was fully understood (q set),
 * 0 if the general parser must handle it (including bodies with more than cap hashes). */
int srv_fast_query_by_hash(const char *text, size_t len, uint64_t *hashes, size_t cap,
                           struct srv_fast_query *q);

/* ==== generic: the members of one top-level object ============================================ */

/* A member value as found in the text (borrowed). */
struct srv_fast_value {
    const char *p; /* first byte of the value */
    size_t len;    /* its length */
    char type;     /* '"' string, '[' array, '{' object, '0' number, 't'/'f' boolean, 'n' null */
};

/* Called for every member of the object; returns 0 to go on, non-zero to stop (the walk then
 * returns 0). Keys contain no escapes (else the walk returns 0). */
typedef int (*srv_fast_member_fn)(void *ctx, const char *key, size_t key_len,
                                  const struct srv_fast_value *v);

/* Walks text[0..len): exactly one JSON object (whitespace around it allowed), every value's
 * syntax checked strictly (RFC 8259; nesting at most 64). Returns 1 if the whole text is valid
 * and every callback returned 0, else 0. */
int srv_fast_object(const char *text, size_t len, srv_fast_member_fn fn, void *ctx);

/* Reads an array value of integers into out[0..cap) as u64 hashes (negative i64 taken as two's
 * complement) when hash = 1, or as u32 token ids when hash = 0 (stored widened in out32).
 * Returns the count, or -1 if the value is not such an array or holds more than cap. */
long srv_fast_u64_array(const struct srv_fast_value *v, uint64_t *out, size_t cap);
long srv_fast_u32_array(const struct srv_fast_value *v, uint32_t *out, size_t cap);

/* The value as an unsigned integer <= max (no sign, fraction, exponent). 1 ok, 0 not. */
int srv_fast_uint(const struct srv_fast_value *v, uint64_t max, uint64_t *out);

#endif
