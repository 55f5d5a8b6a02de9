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

#endif
