/* mp_read.c - bounded msgpack pull reader (see mp_read.h). */
#include "mp_read.h"

#include <string.h>

#include "kvr/err.h"

/* ==== big-endian loads (no alignment assumptions) ============================================ */

static uint64_t load_be(const uint8_t *p, unsigned n)
{
    uint64_t v = 0;
    for (unsigned i = 0; i < n; i++)
        v = (v << 8) | p[i];
    return v;
}

void kvr_mp_init(struct kvr_mp *r, const void *buf, size_t len)
{
    r->err = KVR_MP_OK;
    r->p = buf;
    r->end = buf != NULL ? r->p + len : NULL; /* NULL + 0 is undefined in C */
}

static int fail(struct kvr_mp *r, int why)
{
    r->err = why;
    return KVR_ECORRUPT;
}

/* ==== one item =============================================================================== */

/* Fills a STR/BIN/EXT body of `len` bytes starting `hdr` bytes after the head byte. */
static int body(struct kvr_mp *r, struct kvr_mp_obj *o, size_t hdr, uint64_t len)
{
    size_t avail = kvr_mp_remaining(r);
    if (hdr > avail || len > avail - hdr)
        return fail(r, KVR_MP_TRUNCATED);
    o->v.s.p = r->p + hdr;
    o->v.s.len = (uint32_t)len;
    r->p += hdr + (size_t)len;
    return KVR_OK;
}

/* A container header of `hdr` bytes declaring `n` items of at least `min_bytes` bytes each. */
static int container(struct kvr_mp *r, struct kvr_mp_obj *o, size_t hdr, uint64_t n,
                     unsigned min_bytes)
{
    size_t avail = kvr_mp_remaining(r);
    if (hdr > avail || n > (avail - hdr) / min_bytes)
        return fail(r, KVR_MP_TRUNCATED);
    o->v.n = (uint32_t)n;
    r->p += hdr;
    return KVR_OK;
}

/* Fixed-size scalar payload of `n` bytes after the head byte. */
static int fixed(struct kvr_mp *r, size_t n)
{
    if (kvr_mp_remaining(r) < 1 + n)
        return fail(r, KVR_MP_TRUNCATED);
    return KVR_OK;
}

static int read_uint(struct kvr_mp *r, struct kvr_mp_obj *o, unsigned n)
{
    if (fixed(r, n) != KVR_OK)
        return KVR_ECORRUPT;
    o->type = KVR_MP_UINT;
    o->v.u = load_be(r->p + 1, n);
    r->p += 1 + n;
    return KVR_OK;
}

static int read_sint(struct kvr_mp *r, struct kvr_mp_obj *o, unsigned n)
{
    if (fixed(r, n) != KVR_OK)
        return KVR_ECORRUPT;
    uint64_t raw = load_be(r->p + 1, n);
    int64_t v;
    /* sign-extend an n-byte two's-complement value */
    if (n < 8 && (raw >> (8 * n - 1)) & 1u)
        raw |= ~(uint64_t)0 << (8 * n);
    memcpy(&v, &raw, sizeof(v));
    if (v < 0) {
        o->type = KVR_MP_INT;
        o->v.i = v;
    } else {
        o->type = KVR_MP_UINT; /* a non-negative value in a signed encoding */
        o->v.u = (uint64_t)v;
    }
    r->p += 1 + n;
    return KVR_OK;
}

static int read_float(struct kvr_mp *r, struct kvr_mp_obj *o, unsigned n)
{
    if (fixed(r, n) != KVR_OK)
        return KVR_ECORRUPT;
    uint64_t raw = load_be(r->p + 1, n);
    o->type = KVR_MP_FLOAT;
    if (n == 4) {
        uint32_t bits = (uint32_t)raw;
        float f;
        memcpy(&f, &bits, sizeof(f));
        o->v.f = f;
    } else {
        memcpy(&o->v.f, &raw, sizeof(o->v.f));
    }
    r->p += 1 + n;
    return KVR_OK;
}

static int read_ext(struct kvr_mp *r, struct kvr_mp_obj *o, size_t len_bytes, uint64_t fixlen)
{
    /* head, [len], type, data */
    if (kvr_mp_remaining(r) < 1 + len_bytes + 1)
        return fail(r, KVR_MP_TRUNCATED);
    uint64_t len = len_bytes ? load_be(r->p + 1, (unsigned)len_bytes) : fixlen;
    o->type = KVR_MP_EXT;
    o->ext_type = (int8_t)r->p[1 + len_bytes];
    return body(r, o, 1 + len_bytes + 1, len);
}

int kvr_mp_next(struct kvr_mp *r, struct kvr_mp_obj *o)
{
    if (r->p == r->end)
        return fail(r, KVR_MP_TRUNCATED);
    const uint8_t *start = r->p;
    uint8_t h = *r->p;
    int rc;
    memset(o, 0, sizeof(*o));
    o->head = h;
    if (h <= 0x7f) {
        o->type = KVR_MP_UINT;
        o->v.u = h;
        r->p++;
        return KVR_OK;
    }
    if (h >= 0xe0) {
        o->type = KVR_MP_INT;
        o->v.i = (int64_t)(int8_t)h;
        r->p++;
        return KVR_OK;
    }
    if ((h & 0xf0) == 0x80) {
        o->type = KVR_MP_MAP;
        return container(r, o, 1, h & 0x0f, 2);
    }
    if ((h & 0xf0) == 0x90) {
        o->type = KVR_MP_ARRAY;
        return container(r, o, 1, h & 0x0f, 1);
    }
    if ((h & 0xe0) == 0xa0) {
        o->type = KVR_MP_STR;
        return body(r, o, 1, h & 0x1f);
    }
    switch (h) {
    case 0xc0:
        o->type = KVR_MP_NIL;
        r->p++;
        return KVR_OK;
    case 0xc2:
    case 0xc3:
        o->type = KVR_MP_BOOL;
        o->v.b = h == 0xc3;
        r->p++;
        return KVR_OK;
    case 0xc4:
    case 0xc5:
    case 0xc6: {
        unsigned lb = 1u << (h - 0xc4);
        if (fixed(r, lb) != KVR_OK)
            return KVR_ECORRUPT;
        o->type = KVR_MP_BIN;
        rc = body(r, o, 1 + lb, load_be(r->p + 1, lb));
        break;
    }
    case 0xc7:
    case 0xc8:
    case 0xc9:
        rc = read_ext(r, o, 1u << (h - 0xc7), 0);
        break;
    case 0xca:
        return read_float(r, o, 4);
    case 0xcb:
        return read_float(r, o, 8);
    case 0xcc:
    case 0xcd:
    case 0xce:
    case 0xcf:
        return read_uint(r, o, 1u << (h - 0xcc));
    case 0xd0:
    case 0xd1:
    case 0xd2:
    case 0xd3:
        return read_sint(r, o, 1u << (h - 0xd0));
    case 0xd4:
    case 0xd5:
    case 0xd6:
    case 0xd7:
    case 0xd8:
        rc = read_ext(r, o, 0, 1u << (h - 0xd4));
        break;
    case 0xd9:
    case 0xda:
    case 0xdb: {
        unsigned lb = 1u << (h - 0xd9);
        if (fixed(r, lb) != KVR_OK)
            return KVR_ECORRUPT;
        o->type = KVR_MP_STR;
        rc = body(r, o, 1 + lb, load_be(r->p + 1, lb));
        break;
    }
    case 0xdc:
    case 0xdd: {
        unsigned lb = h == 0xdc ? 2 : 4;
        if (fixed(r, lb) != KVR_OK)
            return KVR_ECORRUPT;
        o->type = KVR_MP_ARRAY;
        rc = container(r, o, 1 + lb, load_be(r->p + 1, lb), 1);
        break;
    }
    case 0xde:
    case 0xdf: {
        unsigned lb = h == 0xde ? 2 : 4;
        if (fixed(r, lb) != KVR_OK)
            return KVR_ECORRUPT;
        o->type = KVR_MP_MAP;
        rc = container(r, o, 1 + lb, load_be(r->p + 1, lb), 2);
        break;
    }
    default: /* 0xc1 */
        return fail(r, KVR_MP_RESERVED);
    }
    if (rc != KVR_OK)
        r->p = start;
    return rc;
}

int kvr_mp_peek(const struct kvr_mp *r)
{
    if (r->p == r->end)
        return 0;
    uint8_t h = *r->p;
    if (h <= 0x7f)
        return KVR_MP_UINT;
    if (h >= 0xe0)
        return KVR_MP_INT;
    if ((h & 0xf0) == 0x80 || h == 0xde || h == 0xdf)
        return KVR_MP_MAP;
    if ((h & 0xf0) == 0x90 || h == 0xdc || h == 0xdd)
        return KVR_MP_ARRAY;
    if ((h & 0xe0) == 0xa0 || (h >= 0xd9 && h <= 0xdb))
        return KVR_MP_STR;
    if (h == 0xc0)
        return KVR_MP_NIL;
    if (h == 0xc2 || h == 0xc3)
        return KVR_MP_BOOL;
    if (h >= 0xc4 && h <= 0xc6)
        return KVR_MP_BIN;
    if ((h >= 0xc7 && h <= 0xc9) || (h >= 0xd4 && h <= 0xd8))
        return KVR_MP_EXT;
    if (h == 0xca || h == 0xcb)
        return KVR_MP_FLOAT;
    if (h >= 0xcc && h <= 0xcf)
        return KVR_MP_UINT;
    if (h >= 0xd0 && h <= 0xd3) {
        /* the sign is in the first payload byte; an incomplete item reports INT */
        if (kvr_mp_remaining(r) < 2 || (r->p[1] & 0x80))
            return KVR_MP_INT;
        return KVR_MP_UINT;
    }
    return 0; /* 0xc1 */
}

/* ==== skipping ================================================================================ */

int kvr_mp_skip_n(struct kvr_mp *r, uint64_t n)
{
    /* `pending` counts values still to skip; a container adds its items. Every item occupies at
     * least one byte, so pending never exceeds the bytes left (checked by kvr_mp_next), and a
     * u64 cannot overflow on any real buffer. */
    uint64_t pending = n;
    struct kvr_mp_obj o;
    while (pending > 0) {
        if (kvr_mp_next(r, &o) != KVR_OK)
            return KVR_ECORRUPT;
        pending--;
        if (o.type == KVR_MP_ARRAY)
            pending += o.v.n;
        else if (o.type == KVR_MP_MAP)
            pending += 2 * (uint64_t)o.v.n;
        if (pending > kvr_mp_remaining(r))
            return fail(r, KVR_MP_TRUNCATED);
    }
    return KVR_OK;
}

int kvr_mp_skip(struct kvr_mp *r)
{
    return kvr_mp_skip_n(r, 1);
}

const char *kvr_mp_type_name(int type)
{
    switch (type) {
    case KVR_MP_NIL:
        return "nil";
    case KVR_MP_BOOL:
        return "bool";
    case KVR_MP_UINT:
    case KVR_MP_INT:
        return "int";
    case KVR_MP_FLOAT:
        return "float";
    case KVR_MP_STR:
        return "str";
    case KVR_MP_BIN:
        return "bytes";
    case KVR_MP_ARRAY:
        return "array";
    case KVR_MP_MAP:
        return "map";
    case KVR_MP_EXT:
        return "ext";
    default:
        return "?";
    }
}
