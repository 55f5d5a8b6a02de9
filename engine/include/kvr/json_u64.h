/* json_u64.h - exact integers in JSON: a validating pre-scan of the raw text, and field readers.
 *
 * Why: hashes are u64 and often >= 2^63 (spec/index.md §2.3). json-c parses integers with
 * strtoll/strtoull and silently CLAMPS out-of-range values ("18446744073709551616" becomes
 * UINT64_MAX, "-9223372036854775809" becomes INT64_MIN); it is also lenient on syntax (single
 * quotes, trailing commas, comments, leading zeros, raw control characters in strings). So text
 * takes two passes:
 *
 *     raw text ──kvr_json_scan──▶ strict RFC 8259 syntax check (error offset on failure)
 *         │                      + flaws: integer tokens outside [-2^63, 2^64 - 1], each with
 *         │                        its path and position  (usually none)
 *         └──────json-c─────────▶ json_object tree
 *
 *     kvr_json_read_hash / kvr_json_read_uint (value from the tree, path, scan)
 *         json double           → rejected ("1.0", "1e5", "-1.5" are not integers)
 *         UINT64_MAX / INT64_MIN → looked up in the scan's flaws by path: a clamped overflow
 *                                  is rejected, a genuine 18446744073709551615 accepted
 *
 * so an overflowing number is rejected exactly where an integer is expected and ignored in
 * fields nobody reads. Error texts quote the original token.
 *
 * Paths name a value from the root of the scanned text: member names joined by '.', array
 * indices in brackets, e.g. "event.data.stored.blocks[2].block_hash" ("[3].event" when the
 * root is an array). Readers receive a path as a chain of stack-allocated segments
 * (struct kvr_json_path) and only render it when they fail or meet a clamped value.
 *
 * Limits: nesting depth KVR_JSON_MAX_DEPTH; strings are not checked for valid UTF-8 (json-c
 * does not either). Duplicate member names: json-c keeps the last value; a flaw in an earlier
 * duplicate still rejects a clamped later one.
 *
 * Thread-safety: a scan belongs to one thread; readers are pure given their arguments.
 */
#ifndef KVR_JSON_U64_H
#define KVR_JSON_U64_H

#include <stddef.h>
#include <stdint.h>

#include "kvr/alloc.h"

struct json_object; /* json-c; its headers stay out of ours */

/* Deepest nesting of arrays and objects kvr_json_scan accepts (and json-c is configured for). */
#define KVR_JSON_MAX_DEPTH 64

/* ==== Paths ================================================================================== */

/* One segment of a path; chains point towards the root. Build them on the stack:
 *     struct kvr_json_path ev = {NULL, "event", 0}, bl = {&ev, "blocks", 0}, el = {&bl, NULL, i};
 */
struct kvr_json_path {
    const struct kvr_json_path *up; /* enclosing segment; NULL for a child of the root */
    const char *key;                /* member name (borrowed), or NULL for an array element */
    size_t index;                   /* element index when key is NULL */
};

/* Writes the path (NULL = the root, written as "") into buf[0..len) with a NUL, truncating;
 * returns the length the full text needs (like snprintf). buf may be NULL when len is 0. */
size_t kvr_json_path_format(const struct kvr_json_path *p, char *buf, size_t len);

/* ==== Pre-scan =============================================================================== */

/* An integer token json-c cannot represent: outside [-2^63, 2^64 - 1]. */
struct kvr_json_flaw {
    size_t off; /* offset of the token in the scanned text */
    size_t len; /* token length in bytes */
    char *path; /* its path, NUL-terminated (owned by the scan) */
};

/* A direct element of a root array: bytes [off, off + len) of the text. */
struct kvr_json_span {
    size_t off;
    size_t len;
};

enum kvr_json_scan_flags {
    KVR_JSON_SCAN_PREFIX = 1u,   /* stop after the first value; anything may follow it */
    KVR_JSON_SCAN_ELEMENTS = 2u, /* record the span of each element of a root array */
};

struct kvr_json_scan {
    const char *text;            /* the text of the last scan (borrowed) */
    size_t len;                  /* its length */
    size_t start;                /* offset of the value's first byte (after whitespace) */
    size_t end;                  /* offset just past the value */
    char root;                   /* first byte of the value: '{', '[', '"', '-', '0'..'9', ... */
    struct kvr_json_flaw *flaws; /* flaws[0..n_flaws), in text order (owned) */
    size_t n_flaws;
    struct kvr_json_span *elems; /* with KVR_JSON_SCAN_ELEMENTS: elems[0..n_elems) (owned) */
    size_t n_elems;
    size_t err_off;    /* after KVR_ECORRUPT: offset of the offending byte */
    const char *err;   /* after KVR_ECORRUPT: static description, else NULL */
    size_t cap_flaws_; /* internal */
    size_t cap_elems_; /* internal */
    kvr_alloc_t *a;    /* allocator charged (borrowed), or NULL for own_ */
    kvr_alloc_t own_;  /* internal */
};

/* Initialises an empty scan; `a` (borrowed, may be NULL = the scan's own counters) must outlive
 * it. Never fails. */
void kvr_json_scan_init(struct kvr_json_scan *s, kvr_alloc_t *a);

/* Releases everything the scan owns; it stays initialised and reusable. */
void kvr_json_scan_free(struct kvr_json_scan *s);

/* Scans one JSON value in text[0..len) (borrowed; kept in s->text until the next scan): leading
 * whitespace, the value, then (unless KVR_JSON_SCAN_PREFIX) only whitespace up to len. Replaces
 * the results of any earlier scan (memory is reused). Returns
 *   KVR_OK        valid; s->start, s->end, s->root, s->flaws (and s->elems) set;
 *   KVR_ECORRUPT  not valid JSON: s->err and s->err_off describe the first error;
 *   KVR_ENOMEM    recording a flaw or an element failed (results incomplete). */
int kvr_json_scan(struct kvr_json_scan *s, const char *text, size_t len, unsigned flags);

/* The flaw at path p (borrowed) in the last successful scan, or NULL. s may be NULL (no flaws).
 * The result is borrowed from the scan. */
const struct kvr_json_flaw *kvr_json_scan_find(const struct kvr_json_scan *s,
                                               const struct kvr_json_path *p);

/* ==== Field readers ========================================================================== */

/* Reads a hash field (spec/index.md §2.3): an exact u64, or a negative integer >= -2^63 taken
 * as its two's-complement bits (-2 -> 18446744073709551614). v (borrowed) is the value json-c
 * parsed from the text scanned into s (s may be NULL if that text had no flaws), p its path;
 * json-c represents JSON null as NULL, so v == NULL reads as null (callers report absent members
 * with kvr_json_missing). Returns KVR_OK and sets *out, or KVR_ECORRUPT with
 * "<path>: expected ..., got ..." in err (NUL-terminated, truncated to err_len; err may be NULL)
 * when v is not an integer or overflows. */
int kvr_json_read_hash(const struct json_object *v, const struct kvr_json_scan *s,
                       const struct kvr_json_path *p, uint64_t *out, char *err, size_t err_len);

/* Reads a non-negative integer <= max (ids, ranks, positions); negatives, fractions,
 * exponents and values above max are refused. Same contract as kvr_json_read_hash. */
int kvr_json_read_uint(const struct json_object *v, uint64_t max, const struct kvr_json_scan *s,
                       const struct kvr_json_path *p, uint64_t *out, char *err, size_t err_len);

/* Writes "<path>: expected <expected>, got <description of v>" (no "<path>: " at the root; v
 * NULL is null) into err and returns KVR_ECORRUPT. For callers that check
 * shapes (objects, arrays, strings). s (may be NULL) lets an out-of-range integer be quoted as
 * written. v, s, p and expected are borrowed. */
int kvr_json_type_error(char *err, size_t err_len, const struct kvr_json_scan *s,
                        const struct kvr_json_path *p, const char *expected,
                        const struct json_object *v);

/* Writes "<path>: missing" into err (err may be NULL) and returns KVR_ECORRUPT. */
int kvr_json_missing(char *err, size_t err_len, const struct kvr_json_path *p);

/* Describes a value for messages: "null" (also for NULL), "true", "-1.5" (a number's own text),
 * "an object", "an array", "the string \"abc\"" (long strings cut, control bytes as '?'). Writes
 * into buf with a NUL (truncating) and returns buf. v is borrowed. */
const char *kvr_json_describe(const struct json_object *v, char *buf, size_t len);

#endif
