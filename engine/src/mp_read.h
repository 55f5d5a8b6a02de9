/* mp_read.h - a bounded, allocation-free msgpack pull reader (internal to kvr_engine).
 *
 * Design: a cursor over one borrowed byte range. kvr_mp_next() decodes exactly one msgpack item:
 * a scalar completely, or only the HEADER of an array or map (the caller then reads the declared
 * number of items). Nothing is ever allocated, and nothing is read past `end`:
 *
 *     [p ............................................ end)
 *      ^ cursor            one item = head byte + payload, checked against end before any read
 *
 * Hostile input: every declared length is checked against the bytes that remain before it is
 * used. A container declaring n items needs at least n bytes (n * 2 for a map) after its header,
 * so a 5-byte "array of 4 billion" fails as truncated here, and callers never size an allocation
 * from a count this reader did not check. kvr_mp_skip() skips a whole value iteratively (no
 * recursion, so nesting depth cannot exhaust the stack).
 *
 * Integers of every width (fixint, cc-cf, d0-d3, negative fixint) come out as one of two kinds:
 * KVR_MP_UINT (value >= 0, in u) or KVR_MP_INT (value < 0, in i). float32 and float64 both come
 * out as a double. Ext types are decoded as opaque byte ranges (kvr_mp_obj.v.s, ext_type).
 *
 * Thread-safety: a reader is used by one thread; distinct readers are independent.
 */
#ifndef KVR_MP_READ_H
#define KVR_MP_READ_H

#include <stddef.h>
#include <stdint.h>

enum kvr_mp_type {
    KVR_MP_NIL = 1,
    KVR_MP_BOOL = 2,
    KVR_MP_UINT = 3,  /* non-negative integer (any encoding) */
    KVR_MP_INT = 4,   /* negative integer (any encoding) */
    KVR_MP_FLOAT = 5, /* float32 or float64 */
    KVR_MP_STR = 6,
    KVR_MP_BIN = 7,
    KVR_MP_ARRAY = 8, /* header only: v.n items follow */
    KVR_MP_MAP = 9,   /* header only: v.n key/value pairs follow */
    KVR_MP_EXT = 10,
};

/* Why a read failed (kvr_mp.err after a KVR_ECORRUPT return). */
enum kvr_mp_fail {
    KVR_MP_OK = 0,
    KVR_MP_TRUNCATED = 1, /* the item (or its declared contents) runs past the end */
    KVR_MP_RESERVED = 2,  /* head byte 0xc1 (never used by msgpack) */
};

struct kvr_mp {
    const uint8_t *p;   /* next unread byte */
    const uint8_t *end; /* one past the last readable byte */
    int err;            /* enum kvr_mp_fail of the last failure */
};

struct kvr_mp_obj {
    uint8_t type;    /* enum kvr_mp_type */
    int8_t ext_type; /* KVR_MP_EXT only */
    uint8_t head;    /* the first byte of the item (for diagnostics) */
    uint8_t pad_;
    union {
        uint64_t u; /* UINT */
        int64_t i;  /* INT (always < 0) */
        double f;   /* FLOAT */
        int b;      /* BOOL */
        uint32_t n; /* ARRAY (items) / MAP (pairs) */
        struct {
            const uint8_t *p; /* borrowed from the reader's buffer; not NUL-terminated */
            uint32_t len;
        } s; /* STR / BIN / EXT */
    } v;
};

/* Starts reading `len` bytes at `buf` (borrowed; must outlive the reader). */
void kvr_mp_init(struct kvr_mp *r, const void *buf, size_t len);

/* Bytes not yet consumed. */
static inline size_t kvr_mp_remaining(const struct kvr_mp *r)
{
    return (size_t)(r->end - r->p);
}

/* Reads one item (a scalar, or a container header) into *o and advances past it.
 * Returns KVR_OK, or KVR_ECORRUPT with r->err set (the cursor does not move on failure). */
int kvr_mp_next(struct kvr_mp *r, struct kvr_mp_obj *o);

/* Returns the type of the next item without consuming it, or 0 at the end of input. A reserved
 * byte (0xc1) reports 0 as well; kvr_mp_next() then reports the failure. */
int kvr_mp_peek(const struct kvr_mp *r);

/* Skips one complete value (containers with everything inside them).
 * Returns KVR_OK or KVR_ECORRUPT (r->err set; the cursor is left somewhere inside the value). */
int kvr_mp_skip(struct kvr_mp *r);

/* Skips the remaining `n` values of a container the caller has started. */
int kvr_mp_skip_n(struct kvr_mp *r, uint64_t n);

/* A printable name for an enum kvr_mp_type ("int", "str", ...); "?" for anything else. */
const char *kvr_mp_type_name(int type);

#endif
