/* event_msgpack.c - decode engine KV-event batches (vLLM / SGLang msgpack; see
 * kvr/event_msgpack.h and spec/engine-events.md §4-§6).
 *
 * Why a hand-written reader instead of msgpack_unpack_next(): msgpack-c allocates
 * n * sizeof(msgpack_object) for an array header before it has seen a single element, so a
 * 5-byte hostile frame asks for ~100 GB. mp_read.c checks every declared size against the bytes
 * that remain, and this file checks it against kvr_emp_limits, before anything is allocated. */
#include "kvr/event_msgpack.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "kvr/err.h"
#include "mp_read.h"

/* ==== arena =================================================================================== */

struct kvr_emp_chunk {
    struct kvr_emp_chunk *next;
    size_t used;
    size_t cap;
    _Alignas(16) unsigned char data[];
};

#define ARENA_CHUNK (16u * 1024u)

/* Returns 8-byte aligned memory owned by the batch, or NULL. */
static void *arena_alloc(struct kvr_emp_batch *b, size_t size)
{
    if (size > SIZE_MAX - 16 - sizeof(struct kvr_emp_chunk))
        return NULL;
    size = (size + 7u) & ~(size_t)7u;
    struct kvr_emp_chunk *c = b->arena;
    if (c == NULL || c->cap - c->used < size) {
        size_t cap = size > ARENA_CHUNK ? size : ARENA_CHUNK;
        struct kvr_emp_chunk *n = kvr_malloc(b->alloc, sizeof(*n) + cap);
        if (n == NULL)
            return NULL;
        n->used = 0;
        n->cap = cap;
        if (c != NULL && size > ARENA_CHUNK) {
            /* a big dedicated chunk goes behind the current one, which keeps filling up */
            n->next = c->next;
            c->next = n;
        } else {
            n->next = c;
            b->arena = n;
        }
        c = n;
    }
    void *p = c->data + c->used;
    c->used += size;
    return p;
}

/* Releases every chunk but one standard chunk, kept for the next decode. */
static void arena_reset(struct kvr_emp_batch *b)
{
    struct kvr_emp_chunk *keep = NULL;
    struct kvr_emp_chunk *c = b->arena;
    while (c != NULL) {
        struct kvr_emp_chunk *next = c->next;
        if (keep == NULL && c->cap == ARENA_CHUNK) {
            keep = c;
            keep->used = 0;
            keep->next = NULL;
        } else {
            kvr_free(b->alloc, c);
        }
        c = next;
    }
    b->arena = keep;
}

void kvr_emp_batch_init(struct kvr_emp_batch *b, kvr_alloc_t *alloc)
{
    memset(b, 0, sizeof(*b));
    b->alloc = alloc;
}

void kvr_emp_batch_free(struct kvr_emp_batch *b)
{
    kvr_alloc_t *alloc = b->alloc;
    arena_reset(b);
    kvr_free(alloc, b->arena);
    kvr_free(alloc, b->ev);
    kvr_emp_batch_init(b, alloc);
}

/* ==== names and small helpers ================================================================= */

static const char *const error_names[KVR_EMP_E_COUNT_] = {
    "none", "truncated", "trailing", "type", "limit", "missing", "value", "nomem",
};

const char *kvr_emp_error_name(int kind)
{
    return (kind >= 0 && kind < KVR_EMP_E_COUNT_) ? error_names[kind] : "?";
}

static int ascii_ieq(const char *a, size_t alen, const char *b)
{
    size_t blen = strlen(b);
    if (alen != blen)
        return 0;
    for (size_t i = 0; i < alen; i++) {
        char x = a[i], y = b[i];
        if (x >= 'a' && x <= 'z')
            x = (char)(x - 'a' + 'A');
        if (y >= 'a' && y <= 'z')
            y = (char)(y - 'a' + 'A');
        if (x != y)
            return 0;
    }
    return 1;
}

int kvr_emp_medium_tier(const char *s, size_t len, int *tier)
{
    static const struct {
        const char *name;
        int tier;
    } media[] = {
        {"GPU", KVR_TIER_DEVICE},
        {"DEVICE", KVR_TIER_DEVICE},
        {"CPU", KVR_TIER_HOST_PINNED},
        {"CPU_PINNED", KVR_TIER_HOST_PINNED},
        {"CPU_TIER1", KVR_TIER_HOST_PINNED},
        {"CPU_TIER2", KVR_TIER_DISK},
        {"DISK", KVR_TIER_DISK},
        {"NVME", KVR_TIER_DISK},
        {"STORAGE", KVR_TIER_DISK},
        {"EXTERNAL", KVR_TIER_EXTERNAL},
        {"NETWORK", KVR_TIER_EXTERNAL},
        {"REMOTE", KVR_TIER_EXTERNAL},
        {"SHARED", KVR_TIER_EXTERNAL},
    };
    *tier = KVR_TIER_DEVICE;
    if (s == NULL || len == 0)
        return 1;
    for (size_t i = 0; i < sizeof(media) / sizeof(media[0]); i++) {
        if (ascii_ieq(s, len, media[i].name)) {
            *tier = media[i].tier;
            return 1;
        }
    }
    return 0;
}

uint64_t kvr_emp_hash_from_bytes(const uint8_t *p, size_t len)
{
    size_t from = len > 8 ? len - 8 : 0;
    uint64_t v = 0;
    for (size_t i = from; i < len; i++)
        v = (v << 8) | p[i];
    return v;
}

static int hexval(uint8_t c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

/* A 64-hex-character identifier -> its first 16 hex digits as a u64 (hashing.md §4). */
static int mm_hex_identifier(const uint8_t *p, uint32_t len, uint64_t *out)
{
    if (len != 64)
        return 0;
    uint64_t v = 0;
    for (uint32_t i = 0; i < 64; i++) {
        int h = hexval(p[i]);
        if (h < 0)
            return 0;
        if (i < 16)
            v = (v << 4) | (uint64_t)h;
    }
    *out = v;
    return 1;
}

/* ==== decoder state and errors ================================================================ */

struct dec {
    struct kvr_mp r;
    struct kvr_emp_batch *b;
    struct kvr_emp_limits lim;
    int kind; /* enum kvr_emp_error of the failure */
    char *err;
    size_t err_cap;
    /* path of the item being decoded: [events[ev]].[field][[i]][[j]] */
    long ev;           /* -1: not inside an event */
    const char *field; /* NULL: no field */
    long i, j;         /* -1: no index */
    unsigned dialect;  /* KVR_EMP_DIALECT_* bits seen so far */
};

static int fail(struct dec *d, int kind, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

static int fail(struct dec *d, int kind, const char *fmt, ...)
{
    d->kind = kind;
    if (d->err == NULL || d->err_cap == 0)
        return kind == KVR_EMP_E_NOMEM ? KVR_ENOMEM : KVR_ECORRUPT;
    char path[160];
    size_t n = 0;
    path[0] = '\0';
    if (d->ev >= 0)
        n += (size_t)snprintf(path + n, sizeof(path) - n, "events[%ld]", d->ev);
    if (d->field != NULL && n < sizeof(path))
        n += (size_t)snprintf(path + n, sizeof(path) - n, "%s%s", n ? "." : "", d->field);
    if (d->i >= 0 && n < sizeof(path))
        n += (size_t)snprintf(path + n, sizeof(path) - n, "[%ld]", d->i);
    if (d->j >= 0 && n < sizeof(path))
        n += (size_t)snprintf(path + n, sizeof(path) - n, "[%ld]", d->j);
    if (n == 0)
        snprintf(path, sizeof(path), "batch");
    char msg[160];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    snprintf(d->err, d->err_cap, "%s: %s", path, msg);
    return kind == KVR_EMP_E_NOMEM ? KVR_ENOMEM : KVR_ECORRUPT;
}

static int nomem(struct dec *d)
{
    return fail(d, KVR_EMP_E_NOMEM, "out of memory");
}

/* Reads one item; maps reader failures to decode errors. */
static int next(struct dec *d, struct kvr_mp_obj *o)
{
    if (kvr_mp_next(&d->r, o) == KVR_OK)
        return KVR_OK;
    if (d->r.err == KVR_MP_RESERVED)
        return fail(d, KVR_EMP_E_VALUE, "reserved byte 0xc1");
    return fail(d, KVR_EMP_E_TRUNCATED, "truncated");
}

static int skip(struct dec *d)
{
    if (kvr_mp_skip(&d->r) == KVR_OK)
        return KVR_OK;
    if (d->r.err == KVR_MP_RESERVED)
        return fail(d, KVR_EMP_E_VALUE, "reserved byte 0xc1");
    return fail(d, KVR_EMP_E_TRUNCATED, "truncated");
}

static int skip_n(struct dec *d, uint64_t n)
{
    if (kvr_mp_skip_n(&d->r, n) == KVR_OK)
        return KVR_OK;
    if (d->r.err == KVR_MP_RESERVED)
        return fail(d, KVR_EMP_E_VALUE, "reserved byte 0xc1");
    return fail(d, KVR_EMP_E_TRUNCATED, "truncated");
}

static int wrong(struct dec *d, const struct kvr_mp_obj *o, const char *expected)
{
    return fail(d, KVR_EMP_E_TYPE, "expected %s, got %s", expected, kvr_mp_type_name(o->type));
}

/* ==== typed field readers ===================================================================== */

static int read_hash_obj(struct dec *d, const struct kvr_mp_obj *o, uint64_t *out)
{
    switch (o->type) {
    case KVR_MP_UINT:
        *out = o->v.u;
        return KVR_OK;
    case KVR_MP_INT:
        *out = (uint64_t)o->v.i; /* two's-complement bits (spec §5) */
        return KVR_OK;
    case KVR_MP_BIN:
        if (o->v.s.len == 0 || o->v.s.len > 64)
            return fail(d, KVR_EMP_E_VALUE, "hash of %u bytes (expected 1..64)", o->v.s.len);
        *out = kvr_emp_hash_from_bytes(o->v.s.p, o->v.s.len);
        return KVR_OK;
    default:
        return wrong(d, o, "int or bytes");
    }
}

static int read_opt_hash(struct dec *d, uint8_t *has, uint64_t *out)
{
    struct kvr_mp_obj o;
    if (next(d, &o) != KVR_OK)
        return KVR_ECORRUPT;
    if (o.type == KVR_MP_NIL) {
        *has = 0;
        *out = 0;
        return KVR_OK;
    }
    *has = 1;
    return read_hash_obj(d, &o, out);
}

static int read_u32(struct dec *d, uint32_t *out, int allow_zero)
{
    struct kvr_mp_obj o;
    if (next(d, &o) != KVR_OK)
        return KVR_ECORRUPT;
    if (o.type == KVR_MP_INT)
        return fail(d, KVR_EMP_E_VALUE, "negative value %lld", (long long)o.v.i);
    if (o.type != KVR_MP_UINT)
        return wrong(d, &o, "int");
    if (o.v.u > UINT32_MAX)
        return fail(d, KVR_EMP_E_VALUE, "value %llu out of range", (unsigned long long)o.v.u);
    if (!allow_zero && o.v.u == 0)
        return fail(d, KVR_EMP_E_VALUE, "must be positive");
    *out = (uint32_t)o.v.u;
    return KVR_OK;
}

static int read_opt_int(struct dec *d, uint8_t *has, int64_t *out)
{
    struct kvr_mp_obj o;
    if (next(d, &o) != KVR_OK)
        return KVR_ECORRUPT;
    *has = 0;
    *out = 0;
    if (o.type == KVR_MP_NIL)
        return KVR_OK;
    if (o.type == KVR_MP_INT) {
        *out = o.v.i;
    } else if (o.type == KVR_MP_UINT) {
        if (o.v.u > INT64_MAX)
            return fail(d, KVR_EMP_E_VALUE, "value out of range");
        *out = (int64_t)o.v.u;
    } else {
        return wrong(d, &o, "int or nil");
    }
    *has = 1;
    return KVR_OK;
}

/* Copies a str item into the arena (NUL-terminated). */
static int keep_str(struct dec *d, const struct kvr_mp_obj *o, struct kvr_emp_str *out)
{
    if (o->v.s.len > d->lim.max_str)
        return fail(d, KVR_EMP_E_LIMIT, "string of %u bytes exceeds the limit %u", o->v.s.len,
                    d->lim.max_str);
    char *p = arena_alloc(d->b, (size_t)o->v.s.len + 1);
    if (p == NULL)
        return nomem(d);
    memcpy(p, o->v.s.p, o->v.s.len);
    p[o->v.s.len] = '\0';
    out->p = p;
    out->len = o->v.s.len;
    return KVR_OK;
}

static int read_opt_str(struct dec *d, struct kvr_emp_str *out)
{
    struct kvr_mp_obj o;
    if (next(d, &o) != KVR_OK)
        return KVR_ECORRUPT;
    out->p = NULL;
    out->len = 0;
    if (o.type == KVR_MP_NIL)
        return KVR_OK;
    if (o.type != KVR_MP_STR)
        return wrong(d, &o, "str or nil");
    return keep_str(d, &o, out);
}

/* An array header of at most `limit` items. */
static int read_array(struct dec *d, uint32_t limit, const char *what, uint32_t *n)
{
    struct kvr_mp_obj o;
    if (next(d, &o) != KVR_OK)
        return KVR_ECORRUPT;
    if (o.type != KVR_MP_ARRAY)
        return wrong(d, &o, "array");
    if (o.v.n > limit)
        return fail(d, KVR_EMP_E_LIMIT, "%u %s exceed the limit %u", o.v.n, what, limit);
    *n = o.v.n;
    return KVR_OK;
}

static int read_hashes(struct dec *d, struct kvr_emp_event *ev)
{
    uint32_t n = 0;
    if (read_array(d, d->lim.max_hashes, "hashes", &n) != KVR_OK)
        return KVR_ECORRUPT;
    ev->n_hashes = n;
    ev->hashes = NULL;
    if (n == 0)
        return KVR_OK;
    ev->hashes = arena_alloc(d->b, (size_t)n * sizeof(uint64_t));
    if (ev->hashes == NULL)
        return nomem(d);
    for (uint32_t k = 0; k < n; k++) {
        struct kvr_mp_obj o;
        d->i = k;
        if (next(d, &o) != KVR_OK || read_hash_obj(d, &o, &ev->hashes[k]) != KVR_OK)
            return KVR_ECORRUPT;
    }
    d->i = -1;
    return KVR_OK;
}

static int token_value(struct dec *d, const struct kvr_mp_obj *o, uint32_t *out)
{
    if (o->type == KVR_MP_INT)
        return fail(d, KVR_EMP_E_VALUE, "negative token id %lld", (long long)o->v.i);
    if (o->type != KVR_MP_UINT)
        return wrong(d, o, "int");
    if (o->v.u > UINT32_MAX)
        return fail(d, KVR_EMP_E_VALUE, "token id %llu exceeds u32", (unsigned long long)o->v.u);
    *out = (uint32_t)o->v.u;
    return KVR_OK;
}

/* token_ids: ints, or (SGLang EAGLE bigram) 2-element int arrays; one form per event. */
static int read_tokens(struct dec *d, struct kvr_emp_event *ev)
{
    uint32_t n = 0;
    if (read_array(d, d->lim.max_tokens, "tokens", &n) != KVR_OK)
        return KVR_ECORRUPT;
    ev->n_tokens = n;
    ev->token_width = 1;
    ev->token_ids = NULL;
    if (n == 0)
        return KVR_OK;
    if (kvr_mp_peek(&d->r) == KVR_MP_ARRAY)
        ev->token_width = 2;
    ev->token_ids = arena_alloc(d->b, (size_t)n * ev->token_width * sizeof(uint32_t));
    if (ev->token_ids == NULL)
        return nomem(d);
    for (uint32_t k = 0; k < n; k++) {
        struct kvr_mp_obj o;
        d->i = k;
        if (next(d, &o) != KVR_OK)
            return KVR_ECORRUPT;
        if (ev->token_width == 1) {
            if (token_value(d, &o, &ev->token_ids[k]) != KVR_OK)
                return KVR_ECORRUPT;
            continue;
        }
        if (o.type != KVR_MP_ARRAY)
            return wrong(d, &o, "2-element array (bigram token)");
        if (o.v.n != 2)
            return fail(d, KVR_EMP_E_VALUE, "bigram token of %u elements", o.v.n);
        for (int t = 0; t < 2; t++) {
            d->j = t;
            if (next(d, &o) != KVR_OK || token_value(d, &o, &ev->token_ids[2 * k + t]) != KVR_OK)
                return KVR_ECORRUPT;
        }
        d->j = -1;
    }
    d->i = -1;
    return KVR_OK;
}

static int read_medium(struct dec *d, struct kvr_emp_event *ev, uint32_t *unknown_medium)
{
    if (read_opt_str(d, &ev->medium) != KVR_OK)
        return KVR_ECORRUPT;
    int tier;
    if (!kvr_emp_medium_tier(ev->medium.p, ev->medium.len, &tier))
        (*unknown_medium)++;
    ev->tier = (uint8_t)tier;
    return KVR_OK;
}

/* ==== multimodal info: extra_keys and block_mm_infos ========================================== */

/* Both are parsed twice: once to count (fill == 0), then to fill. Salts and LoRA names found in
 * typed extra keys are kept only in the fill pass; hashes are stored only when out != NULL. */
struct mm_sink {
    uint64_t *out; /* where hashes go in the fill pass; NULL = count/discard */
    uint32_t n;    /* hashes so far */
    uint32_t cap;  /* room in out */
    int fill;      /* 0: counting pass */
};

static int mm_add(struct dec *d, struct mm_sink *s, uint64_t h)
{
    if (s->n >= d->lim.max_hashes)
        return fail(d, KVR_EMP_E_LIMIT, "more than %u mm hashes", d->lim.max_hashes);
    if (s->out != NULL) {
        KVR_ASSERT(s->n < s->cap);
        s->out[s->n] = h;
    }
    s->n++;
    return KVR_OK;
}

/* Finds the value of `key` in a map of `npairs` whose pairs start at the cursor; leaves the cursor
 * after the map. *found = 1 and *val = a reader positioned at the value. */
static int map_lookup(struct dec *d, uint32_t npairs, const char *key, int *found,
                      struct kvr_mp *val)
{
    size_t klen = strlen(key);
    *found = 0;
    for (uint32_t k = 0; k < npairs; k++) {
        struct kvr_mp_obj o;
        if (kvr_mp_peek(&d->r) != KVR_MP_STR) {
            if (skip_n(d, 2) != KVR_OK)
                return KVR_ECORRUPT;
            continue;
        }
        if (next(d, &o) != KVR_OK)
            return KVR_ECORRUPT;
        if (!*found && o.v.s.len == klen && memcmp(o.v.s.p, key, klen) == 0) {
            *found = 1;
            *val = d->r;
        }
        if (skip(d) != KVR_OK)
            return KVR_ECORRUPT;
    }
    return KVR_OK;
}

/* A typed extra key {"type":"mm"|"cache_salt"|"lora", ...} (RFC vllm#55487; inner field names
 * unconfirmed, so several spellings are accepted). The cursor is after the map header. */
static int typed_extra_key(struct dec *d, struct kvr_emp_event *ev, struct mm_sink *s,
                           uint32_t npairs)
{
    static const char *const value_keys[] = {"mm_hash", "hash",      "identifier", "cache_salt",
                                             "salt",    "lora_name", "name",       "value"};
    struct kvr_mp start = d->r;
    int found;
    struct kvr_mp tr;
    if (map_lookup(d, npairs, "type", &found, &tr) != KVR_OK)
        return KVR_ECORRUPT;
    struct kvr_mp end = d->r;
    if (!found)
        return KVR_OK;
    struct kvr_mp_obj t;
    if (kvr_mp_next(&tr, &t) != KVR_OK || t.type != KVR_MP_STR)
        return KVR_OK; /* an untyped or oddly typed map: not ours, ignored */
    int is_mm = t.v.s.len == 2 && memcmp(t.v.s.p, "mm", 2) == 0;
    int is_salt = t.v.s.len == 10 && memcmp(t.v.s.p, "cache_salt", 10) == 0;
    int is_lora = t.v.s.len == 4 && memcmp(t.v.s.p, "lora", 4) == 0;
    if (!is_mm && !is_salt && !is_lora)
        return KVR_OK;
    for (size_t k = 0; k < sizeof(value_keys) / sizeof(value_keys[0]); k++) {
        struct kvr_mp vr;
        d->r = start;
        if (map_lookup(d, npairs, value_keys[k], &found, &vr) != KVR_OK)
            return KVR_ECORRUPT;
        if (!found)
            continue;
        struct kvr_mp_obj v;
        if (kvr_mp_next(&vr, &v) != KVR_OK)
            break;
        uint64_t h;
        if (is_mm && v.type == KVR_MP_UINT) {
            if (mm_add(d, s, v.v.u) != KVR_OK)
                return KVR_ECORRUPT;
        } else if (is_mm && v.type == KVR_MP_STR && mm_hex_identifier(v.v.s.p, v.v.s.len, &h)) {
            if (mm_add(d, s, h) != KVR_OK)
                return KVR_ECORRUPT;
        } else if (is_salt && v.type == KVR_MP_STR && s->fill && ev->cache_salt.p == NULL) {
            if (keep_str(d, &v, &ev->cache_salt) != KVR_OK)
                return KVR_ECORRUPT;
        } else if (is_lora && v.type == KVR_MP_STR && s->fill && ev->lora_name.p == NULL) {
            if (keep_str(d, &v, &ev->lora_name) != KVR_OK)
                return KVR_ECORRUPT;
        }
        break;
    }
    d->r = end;
    return KVR_OK;
}

/* One element of a block's extra-keys tuple: a 64-hex identifier, a typed map, or anything else
 * (LoRA name, salt, prompt-embeds hash ...: ignored). */
static int extra_key_item(struct dec *d, struct kvr_emp_event *ev, struct mm_sink *s)
{
    struct kvr_mp_obj o;
    int t = kvr_mp_peek(&d->r);
    if (t == KVR_MP_STR) {
        uint64_t h;
        if (next(d, &o) != KVR_OK)
            return KVR_ECORRUPT;
        if (mm_hex_identifier(o.v.s.p, o.v.s.len, &h))
            return mm_add(d, s, h);
        return KVR_OK;
    }
    if (t == KVR_MP_MAP) {
        if (next(d, &o) != KVR_OK)
            return KVR_ECORRUPT;
        return typed_extra_key(d, ev, s, o.v.n);
    }
    return skip(d);
}

static int extra_keys_pass(struct dec *d, struct kvr_emp_event *ev, struct mm_sink *s,
                           uint32_t nblocks, uint32_t *off)
{
    for (uint32_t k = 0; k < nblocks; k++) {
        struct kvr_mp_obj o;
        d->i = k;
        if (off != NULL)
            off[k] = s->n;
        int t = kvr_mp_peek(&d->r);
        if (t == KVR_MP_ARRAY) {
            if (next(d, &o) != KVR_OK)
                return KVR_ECORRUPT;
            for (uint32_t e = 0; e < o.v.n; e++) {
                d->j = e;
                if (extra_key_item(d, ev, s) != KVR_OK)
                    return KVR_ECORRUPT;
            }
            d->j = -1;
        } else if (t == KVR_MP_MAP || t == KVR_MP_STR) {
            if (extra_key_item(d, ev, s) != KVR_OK)
                return KVR_ECORRUPT;
        } else {
            if (next(d, &o) != KVR_OK)
                return KVR_ECORRUPT;
            if (o.type != KVR_MP_NIL)
                return wrong(d, &o, "nil, array or map");
        }
    }
    if (off != NULL)
        off[nblocks] = s->n;
    d->i = -1;
    return KVR_OK;
}

/* One mm object: {"mm_hash": u64, "offsets": ...} or [mm_hash, offsets]. */
static int mm_object(struct dec *d, struct mm_sink *s)
{
    struct kvr_mp_obj o, h;
    if (next(d, &o) != KVR_OK)
        return KVR_ECORRUPT;
    if (o.type == KVR_MP_ARRAY) {
        if (o.v.n == 0)
            return fail(d, KVR_EMP_E_MISSING, "mm object without mm_hash");
        if (next(d, &h) != KVR_OK)
            return KVR_ECORRUPT;
        if (h.type != KVR_MP_UINT)
            return wrong(d, &h, "int mm_hash");
        if (mm_add(d, s, h.v.u) != KVR_OK)
            return KVR_ECORRUPT;
        return skip_n(d, o.v.n - 1);
    }
    if (o.type != KVR_MP_MAP)
        return wrong(d, &o, "map or array (mm object)");
    int found;
    struct kvr_mp vr;
    if (map_lookup(d, o.v.n, "mm_hash", &found, &vr) != KVR_OK)
        return KVR_ECORRUPT;
    if (!found)
        return fail(d, KVR_EMP_E_MISSING, "mm object without mm_hash");
    if (kvr_mp_next(&vr, &h) != KVR_OK || h.type != KVR_MP_UINT)
        return fail(d, KVR_EMP_E_TYPE, "mm_hash: expected int");
    return mm_add(d, s, h.v.u);
}

/* block_mm_infos: per block nil, {"mm_objects": [...]} or [[mm object ...]]. */
static int mm_infos_pass(struct dec *d, struct mm_sink *s, uint32_t nblocks, uint32_t *off)
{
    for (uint32_t k = 0; k < nblocks; k++) {
        struct kvr_mp_obj o;
        d->i = k;
        if (off != NULL)
            off[k] = s->n;
        if (next(d, &o) != KVR_OK)
            return KVR_ECORRUPT;
        uint32_t nobj = 0;
        struct kvr_mp after;
        if (o.type == KVR_MP_NIL)
            continue;
        if (o.type == KVR_MP_MAP) {
            int found;
            struct kvr_mp vr;
            if (map_lookup(d, o.v.n, "mm_objects", &found, &vr) != KVR_OK)
                return KVR_ECORRUPT;
            after = d->r;
            if (!found)
                continue;
            d->r = vr;
        } else if (o.type == KVR_MP_ARRAY) {
            if (o.v.n == 0)
                continue;
            struct kvr_mp first = d->r;
            if (skip_n(d, o.v.n) != KVR_OK)
                return KVR_ECORRUPT;
            after = d->r;
            d->r = first; /* [mm_objects, ...]: only the first element counts */
        } else {
            return wrong(d, &o, "nil, map or array (mm info)");
        }
        if (next(d, &o) != KVR_OK)
            return KVR_ECORRUPT;
        if (o.type == KVR_MP_NIL) {
            d->r = after;
            continue;
        }
        if (o.type != KVR_MP_ARRAY)
            return wrong(d, &o, "array (mm_objects)");
        nobj = o.v.n;
        for (uint32_t m = 0; m < nobj; m++) {
            d->j = m;
            if (mm_object(d, s) != KVR_OK)
                return KVR_ECORRUPT;
        }
        d->j = -1;
        d->r = after;
    }
    if (off != NULL)
        off[nblocks] = s->n;
    d->i = -1;
    return KVR_OK;
}

/* Parses extra_keys (which = 0) or block_mm_infos (which = 1) at the cursor into ev. When both
 * carry mm hashes, block_mm_infos wins (it is the richer form). */
static int read_mm(struct dec *d, struct kvr_emp_event *ev, int which)
{
    if (kvr_mp_peek(&d->r) == KVR_MP_NIL)
        return skip(d);
    uint32_t nblocks = 0;
    if (read_array(d, d->lim.max_hashes, "blocks", &nblocks) != KVR_OK)
        return KVR_ECORRUPT;
    struct kvr_mp start = d->r;
    struct mm_sink s = {NULL, 0, 0, 0};
    int rc =
        which ? mm_infos_pass(d, &s, nblocks, NULL) : extra_keys_pass(d, ev, &s, nblocks, NULL);
    if (rc != KVR_OK)
        return rc;
    struct kvr_mp end = d->r;
    int keep = s.n > 0 && !(which == 0 && ev->mm_source == KVR_EMP_MM_BLOCK_INFOS);
    if (which == 1 && !keep)
        return KVR_OK;
    uint32_t *off = NULL;
    uint64_t *hashes = NULL;
    if (keep) {
        off = arena_alloc(d->b, ((size_t)nblocks + 1) * sizeof(uint32_t));
        hashes = arena_alloc(d->b, (size_t)s.n * sizeof(uint64_t));
        if (off == NULL || hashes == NULL)
            return nomem(d);
    }
    struct mm_sink fill = {hashes, 0, keep ? s.n : 0, 1};
    d->r = start;
    rc =
        which ? mm_infos_pass(d, &fill, nblocks, off) : extra_keys_pass(d, ev, &fill, nblocks, off);
    if (rc != KVR_OK)
        return rc;
    KVR_ASSERT(fill.n == s.n && d->r.p == end.p);
    if (keep) {
        ev->n_mm_blocks = nblocks;
        ev->mm_off = off;
        ev->mm_hashes = hashes;
        ev->mm_source = which ? KVR_EMP_MM_BLOCK_INFOS : KVR_EMP_MM_EXTRA_KEYS;
    }
    return KVR_OK;
}

/* ==== events ================================================================================== */

enum field {
    F_NONE = 0,
    F_HASHES,
    F_PARENT,
    F_TOKENS,
    F_BLOCK_SIZE,
    F_LORA_ID,
    F_MEDIUM,
    F_LORA_NAME,
    F_EVENT_VERSION,
    F_EXTRA_KEYS,
    F_GROUP_IDX,
    F_SPEC_KIND,
    F_SLIDING,
    F_LOCALITY,
    F_OWNERSHIP,
    F_CACHE_SALT,
    F_MM_INFOS,
    F_LEGACY7, /* positional index 7: lora_name (str/nil) or SGLang metadata map */
    F_LEGACY9, /* positional index 9: group_idx (int/nil) or block_mm_infos (array) */
    F_COUNT_
};

static const char *const field_names[F_COUNT_] = {
    NULL,
    "block_hashes",
    "parent_block_hash",
    "token_ids",
    "block_size",
    "lora_id",
    "medium",
    "lora_name",
    "event_version",
    "extra_keys",
    "group_idx",
    "kv_cache_spec_kind",
    "kv_cache_spec_sliding_window",
    "locality",
    "ownership",
    "cache_salt",
    "block_mm_infos",
    "lora_name",
    "group_idx",
};

/* Positional layouts (legacy array_like): index -> field. */
static const uint8_t stored_pos[] = {F_NONE,       F_HASHES,  F_PARENT,    F_TOKENS,
                                     F_BLOCK_SIZE, F_LORA_ID, F_MEDIUM,    F_LEGACY7,
                                     F_EXTRA_KEYS, F_LEGACY9, F_SPEC_KIND, F_SLIDING};
static const uint8_t removed_pos[] = {F_NONE,      F_HASHES,  F_MEDIUM,   F_GROUP_IDX,
                                      F_SPEC_KIND, F_SLIDING, F_LOCALITY, F_OWNERSHIP};

/* Map keys accepted per kind (others ignored). */
static const uint8_t stored_keys[] = {F_HASHES,     F_PARENT,    F_TOKENS,     F_BLOCK_SIZE,
                                      F_LORA_ID,    F_MEDIUM,    F_LORA_NAME,  F_EVENT_VERSION,
                                      F_EXTRA_KEYS, F_GROUP_IDX, F_SPEC_KIND,  F_SLIDING,
                                      F_LOCALITY,   F_OWNERSHIP, F_CACHE_SALT, F_MM_INFOS};
static const uint8_t removed_keys[] = {F_HASHES,  F_MEDIUM,   F_GROUP_IDX, F_SPEC_KIND,
                                       F_SLIDING, F_LOCALITY, F_OWNERSHIP};

struct ev_state {
    uint32_t seen;           /* bit per enum field */
    uint32_t unknown_medium; /* 0/1 */
};

static int tag_kind(const uint8_t *p, uint32_t len)
{
    if (len == 11 && memcmp(p, "BlockStored", 11) == 0)
        return KVR_EVENT_STORED;
    if (len == 12 && memcmp(p, "BlockRemoved", 12) == 0)
        return KVR_EVENT_REMOVED;
    if (len == 16 && memcmp(p, "AllBlocksCleared", 16) == 0)
        return KVR_EVENT_CLEARED;
    return 0;
}

/* SGLang BlockStoredWithMetadata puts {"cache_salt": ...} at positional index 7. */
static int read_meta_map(struct dec *d, struct kvr_emp_event *ev)
{
    struct kvr_mp_obj o;
    if (next(d, &o) != KVR_OK)
        return KVR_ECORRUPT;
    for (uint32_t k = 0; k < o.v.n; k++) {
        struct kvr_mp_obj key;
        if (kvr_mp_peek(&d->r) != KVR_MP_STR) {
            if (skip_n(d, 2) != KVR_OK)
                return KVR_ECORRUPT;
            continue;
        }
        if (next(d, &key) != KVR_OK)
            return KVR_ECORRUPT;
        if (key.v.s.len == 10 && memcmp(key.v.s.p, "cache_salt", 10) == 0) {
            d->field = "cache_salt";
            if (read_opt_str(d, &ev->cache_salt) != KVR_OK)
                return KVR_ECORRUPT;
        } else if (skip(d) != KVR_OK) {
            return KVR_ECORRUPT;
        }
    }
    return KVR_OK;
}

static int read_field(struct dec *d, struct kvr_emp_event *ev, struct ev_state *st, int f)
{
    struct kvr_emp_str ignored;
    int t;
    d->field = field_names[f];
    if (f != F_LEGACY7 && f != F_LEGACY9 && (st->seen & (1u << f)))
        return fail(d, KVR_EMP_E_VALUE, "duplicate key");
    st->seen |= 1u << f;
    switch (f) {
    case F_HASHES:
        return read_hashes(d, ev);
    case F_PARENT:
        return read_opt_hash(d, &ev->has_parent, &ev->parent_hash);
    case F_TOKENS:
        return read_tokens(d, ev);
    case F_BLOCK_SIZE:
        return read_u32(d, &ev->block_size, 0);
    case F_LORA_ID:
        return read_opt_int(d, &ev->has_lora_id, &ev->lora_id);
    case F_MEDIUM:
        return read_medium(d, ev, &st->unknown_medium);
    case F_LORA_NAME:
        return read_opt_str(d, &ev->lora_name);
    case F_EVENT_VERSION:
        return read_u32(d, &ev->event_version, 1);
    case F_EXTRA_KEYS:
        return read_mm(d, ev, 0);
    case F_GROUP_IDX:
        return read_opt_int(d, &ev->has_group_idx, &ev->group_idx);
    case F_SPEC_KIND:
        return read_opt_str(d, &ev->spec_kind);
    case F_SLIDING:
        return read_opt_int(d, &ev->has_sliding_window, &ev->sliding_window);
    case F_LOCALITY:
        return read_opt_str(d, &ev->locality);
    case F_OWNERSHIP:
        return read_opt_str(d, &ignored);
    case F_CACHE_SALT:
        return read_opt_str(d, &ev->cache_salt);
    case F_MM_INFOS:
        return read_mm(d, ev, 1);
    case F_LEGACY7:
        t = kvr_mp_peek(&d->r);
        if (t == KVR_MP_MAP)
            return read_meta_map(d, ev);
        st->seen |= 1u << F_LORA_NAME;
        return read_opt_str(d, &ev->lora_name);
    case F_LEGACY9:
        t = kvr_mp_peek(&d->r);
        if (t == KVR_MP_ARRAY) {
            d->field = field_names[F_MM_INFOS];
            return read_mm(d, ev, 1);
        }
        return read_opt_int(d, &ev->has_group_idx, &ev->group_idx);
    default:
        return skip(d);
    }
}

static int check_required(struct dec *d, const struct kvr_emp_event *ev, const struct ev_state *st)
{
    static const uint8_t stored_req[] = {F_HASHES, F_TOKENS, F_BLOCK_SIZE};
    const uint8_t *req = NULL;
    size_t nreq = 0;
    if (ev->kind == KVR_EVENT_STORED) {
        req = stored_req;
        nreq = sizeof(stored_req);
    } else if (ev->kind == KVR_EVENT_REMOVED) {
        req = stored_req; /* block_hashes only */
        nreq = 1;
    }
    for (size_t k = 0; k < nreq; k++) {
        if (!(st->seen & (1u << req[k]))) {
            d->field = field_names[req[k]];
            return fail(d, KVR_EMP_E_MISSING, "missing");
        }
    }
    d->field = NULL;
    return KVR_OK;
}

static int field_by_name(const uint8_t *p, uint32_t len, int kind)
{
    const uint8_t *keys = kind == KVR_EVENT_STORED ? stored_keys : removed_keys;
    size_t n = kind == KVR_EVENT_STORED ? sizeof(stored_keys) : sizeof(removed_keys);
    if (kind == KVR_EVENT_CLEARED)
        return F_NONE;
    for (size_t k = 0; k < n; k++) {
        const char *name = field_names[keys[k]];
        if (strlen(name) == len && memcmp(name, p, len) == 0)
            return keys[k];
    }
    return F_NONE;
}

/* Returns KVR_OK with *keep = 0 for a skipped event (unknown tag), 1 for a decoded one. */
static int map_event(struct dec *d, struct kvr_emp_event *ev, struct ev_state *st, uint32_t npairs,
                     int *keep)
{
    /* pass 1: the tag may be anywhere (msgspec writes it first; others may not) */
    struct kvr_mp start = d->r;
    int found;
    struct kvr_mp tr;
    d->field = "type";
    if (map_lookup(d, npairs, "type", &found, &tr) != KVR_OK)
        return KVR_ECORRUPT;
    if (!found)
        return fail(d, KVR_EMP_E_MISSING, "missing");
    struct kvr_mp_obj t;
    struct kvr_mp end = d->r;
    d->r = tr;
    if (next(d, &t) != KVR_OK)
        return KVR_ECORRUPT;
    if (t.type != KVR_MP_STR)
        return wrong(d, &t, "str");
    ev->kind = (uint8_t)tag_kind(t.v.s.p, t.v.s.len);
    if (ev->kind == 0) {
        d->r = end;
        *keep = 0;
        return KVR_OK;
    }
    /* pass 2: the fields */
    d->r = start;
    for (uint32_t k = 0; k < npairs; k++) {
        struct kvr_mp_obj key;
        d->field = NULL;
        if (kvr_mp_peek(&d->r) != KVR_MP_STR) {
            if (skip_n(d, 2) != KVR_OK)
                return KVR_ECORRUPT;
            continue;
        }
        if (next(d, &key) != KVR_OK)
            return KVR_ECORRUPT;
        int f = field_by_name(key.v.s.p, key.v.s.len, ev->kind);
        int rc = f == F_NONE ? skip(d) : read_field(d, ev, st, f);
        if (rc != KVR_OK)
            return rc;
    }
    d->field = NULL;
    *keep = 1;
    return check_required(d, ev, st);
}

static int array_event(struct dec *d, struct kvr_emp_event *ev, struct ev_state *st, uint32_t n,
                       int *keep)
{
    struct kvr_mp_obj t;
    d->field = "type";
    if (n == 0)
        return fail(d, KVR_EMP_E_MISSING, "empty event (no tag)");
    if (next(d, &t) != KVR_OK)
        return KVR_ECORRUPT;
    if (t.type != KVR_MP_STR)
        return wrong(d, &t, "str tag");
    ev->kind = (uint8_t)tag_kind(t.v.s.p, t.v.s.len);
    if (ev->kind == 0) {
        *keep = 0;
        return skip_n(d, n - 1);
    }
    const uint8_t *layout = NULL;
    size_t nlayout = 0;
    if (ev->kind == KVR_EVENT_STORED) {
        layout = stored_pos;
        nlayout = sizeof(stored_pos);
    } else if (ev->kind == KVR_EVENT_REMOVED) {
        layout = removed_pos;
        nlayout = sizeof(removed_pos);
    }
    for (uint32_t k = 1; k < n; k++) {
        int rc = k < nlayout ? read_field(d, ev, st, layout[k]) : skip(d);
        if (rc != KVR_OK)
            return rc;
    }
    d->field = NULL;
    *keep = 1;
    return check_required(d, ev, st);
}

static int locality_ok(const struct kvr_emp_str *s)
{
    return s->p == NULL || ascii_ieq(s->p, s->len, "LOCAL");
}

static int grow_events(struct dec *d)
{
    struct kvr_emp_batch *b = d->b;
    if (b->n < b->ev_cap)
        return KVR_OK;
    size_t cap = b->ev_cap ? b->ev_cap * 2 : 16;
    struct kvr_emp_event *ev = kvr_realloc(b->alloc, b->ev, cap * sizeof(*ev));
    if (ev == NULL)
        return nomem(d);
    b->ev = ev;
    b->ev_cap = cap;
    return KVR_OK;
}

struct batch_tally {
    uint64_t unknown_tag, dropped, unknown_medium;
};

static int read_events(struct dec *d, struct batch_tally *tally)
{
    uint32_t n = 0;
    d->field = "events";
    if (read_array(d, d->lim.max_events, "events", &n) != KVR_OK)
        return KVR_ECORRUPT;
    d->field = NULL;
    for (uint32_t k = 0; k < n; k++) {
        struct kvr_mp_obj o;
        struct ev_state st = {0, 0};
        int keep = 0;
        d->ev = k;
        if (grow_events(d) != KVR_OK)
            return KVR_ENOMEM;
        struct kvr_emp_event *ev = &d->b->ev[d->b->n];
        memset(ev, 0, sizeof(*ev));
        ev->token_width = 1;
        ev->event_version = 1;
        if (next(d, &o) != KVR_OK)
            return KVR_ECORRUPT;
        int rc;
        if (o.type == KVR_MP_MAP) {
            d->dialect |= (d->dialect & KVR_EMP_DIALECT_C) ? 0 : KVR_EMP_DIALECT_B;
            rc = map_event(d, ev, &st, o.v.n, &keep);
        } else if (o.type == KVR_MP_ARRAY) {
            d->dialect |= KVR_EMP_DIALECT_A;
            rc = array_event(d, ev, &st, o.v.n, &keep);
        } else {
            return wrong(d, &o, "map or array (event)");
        }
        if (rc != KVR_OK)
            return rc;
        if (!keep) {
            tally->unknown_tag++;
            d->b->skipped++;
            continue;
        }
        if (!locality_ok(&ev->locality)) {
            tally->dropped++;
            d->b->skipped++;
            continue;
        }
        tally->unknown_medium += st.unknown_medium;
        d->b->n++;
    }
    d->ev = -1;
    return KVR_OK;
}

/* ==== the batch =============================================================================== */

static int read_ts(struct dec *d)
{
    struct kvr_mp_obj o;
    d->field = "ts";
    if (next(d, &o) != KVR_OK)
        return KVR_ECORRUPT;
    if (o.type == KVR_MP_FLOAT)
        d->b->ts = o.v.f;
    else if (o.type == KVR_MP_UINT)
        d->b->ts = (double)o.v.u;
    else if (o.type == KVR_MP_INT)
        d->b->ts = (double)o.v.i;
    else
        return wrong(d, &o, "float");
    d->field = NULL;
    return KVR_OK;
}

static int read_rank(struct dec *d)
{
    d->field = "data_parallel_rank";
    if (kvr_mp_peek(&d->r) == KVR_MP_NIL) {
        d->field = NULL;
        return skip(d);
    }
    if (read_u32(d, &d->b->dp_rank, 1) != KVR_OK)
        return KVR_ECORRUPT;
    d->b->has_dp_rank = 1;
    d->field = NULL;
    return KVR_OK;
}

static int array_batch(struct dec *d, uint32_t n, struct batch_tally *tally)
{
    if (n < 2) {
        d->field = "events";
        return fail(d, KVR_EMP_E_MISSING, "missing (batch array of %u elements)", n);
    }
    if (read_ts(d) != KVR_OK || read_events(d, tally) != KVR_OK)
        return KVR_ECORRUPT;
    if (n >= 3 && read_rank(d) != KVR_OK)
        return KVR_ECORRUPT;
    return n > 3 ? skip_n(d, n - 3) : KVR_OK;
}

static int map_batch(struct dec *d, uint32_t npairs, struct batch_tally *tally)
{
    int seen_ts = 0, seen_events = 0, seen_rank = 0;
    for (uint32_t k = 0; k < npairs; k++) {
        struct kvr_mp_obj key;
        d->field = NULL;
        if (kvr_mp_peek(&d->r) != KVR_MP_STR) {
            if (skip_n(d, 2) != KVR_OK)
                return KVR_ECORRUPT;
            continue;
        }
        if (next(d, &key) != KVR_OK)
            return KVR_ECORRUPT;
        const uint8_t *p = key.v.s.p;
        uint32_t len = key.v.s.len;
        int *seen = NULL;
        if (len == 2 && memcmp(p, "ts", 2) == 0)
            seen = &seen_ts;
        else if (len == 6 && memcmp(p, "events", 6) == 0)
            seen = &seen_events;
        else if (len == 18 && memcmp(p, "data_parallel_rank", 18) == 0)
            seen = &seen_rank;
        if (seen == NULL) {
            if (skip(d) != KVR_OK)
                return KVR_ECORRUPT;
            continue;
        }
        if (*seen) {
            d->field = seen == &seen_ts       ? "ts"
                       : seen == &seen_events ? "events"
                                              : "data_parallel_rank";
            return fail(d, KVR_EMP_E_VALUE, "duplicate key");
        }
        *seen = 1;
        int rc = seen == &seen_ts       ? read_ts(d)
                 : seen == &seen_events ? read_events(d, tally)
                                        : read_rank(d);
        if (rc != KVR_OK)
            return rc;
    }
    if (!seen_events) {
        d->field = "events";
        return fail(d, KVR_EMP_E_MISSING, "missing");
    }
    return KVR_OK;
}

static void reset_batch(struct kvr_emp_batch *b)
{
    arena_reset(b);
    b->ts = 0;
    b->has_dp_rank = 0;
    b->dp_rank = 0;
    b->dialect = 0;
    b->n = 0;
    b->skipped = 0;
}

static int dialect_slot(unsigned bits)
{
    if (bits & KVR_EMP_DIALECT_C)
        return 3;
    if (bits & KVR_EMP_DIALECT_A)
        return 1;
    if (bits & KVR_EMP_DIALECT_B)
        return 2;
    return 0;
}

int kvr_emp_decode(struct kvr_emp_batch *b, const void *payload, size_t len,
                   const struct kvr_emp_limits *limits, struct kvr_emp_counters *counters,
                   int *kind, char *err, size_t err_cap)
{
    struct dec d;
    struct batch_tally tally = {0, 0, 0};
    memset(&d, 0, sizeof(d));
    reset_batch(b);
    kvr_mp_init(&d.r, payload, payload ? len : 0);
    d.b = b;
    d.err = err;
    d.err_cap = err_cap;
    d.ev = d.i = d.j = -1;
    if (limits != NULL)
        d.lim = *limits;
    if (d.lim.max_events == 0)
        d.lim.max_events = KVR_EMP_DEFAULT_MAX_EVENTS;
    if (d.lim.max_hashes == 0)
        d.lim.max_hashes = KVR_EMP_DEFAULT_MAX_HASHES;
    if (d.lim.max_tokens == 0)
        d.lim.max_tokens = KVR_EMP_DEFAULT_MAX_TOKENS;
    if (d.lim.max_str == 0)
        d.lim.max_str = KVR_EMP_DEFAULT_MAX_STR;
    if (err != NULL && err_cap > 0)
        err[0] = '\0';

    struct kvr_mp_obj o;
    int rc = next(&d, &o);
    if (rc == KVR_OK) {
        if (o.type == KVR_MP_ARRAY) {
            rc = array_batch(&d, o.v.n, &tally);
        } else if (o.type == KVR_MP_MAP) {
            d.dialect |= KVR_EMP_DIALECT_C;
            rc = map_batch(&d, o.v.n, &tally);
        } else {
            rc = wrong(&d, &o, "array or map (batch)");
        }
    }
    if (rc == KVR_OK && kvr_mp_remaining(&d.r) != 0) {
        d.ev = d.i = d.j = -1;
        d.field = NULL;
        rc = fail(&d, KVR_EMP_E_TRAILING, "%zu trailing bytes", kvr_mp_remaining(&d.r));
    }
    if (kind != NULL)
        *kind = rc == KVR_OK ? KVR_EMP_E_NONE : d.kind;
    if (rc != KVR_OK) {
        /* inner calls propagate "failed"; the kind recorded at the failure decides the code */
        rc = d.kind == KVR_EMP_E_NOMEM ? KVR_ENOMEM : KVR_ECORRUPT;
        reset_batch(b);
        if (counters != NULL) {
            counters->failed++;
            counters->errors[d.kind]++;
            counters->failed_by_dialect[dialect_slot(d.dialect)]++;
        }
        return rc;
    }
    b->dialect = d.dialect;
    if (counters != NULL) {
        counters->batches++;
        for (int bit = 0; bit < 3; bit++)
            if (d.dialect & (1u << bit))
                counters->dialect[bit + 1]++;
        counters->unknown_tag += tally.unknown_tag;
        counters->locality_dropped += tally.dropped;
        counters->unknown_medium += tally.unknown_medium;
        for (uint32_t k = 0; k < b->n; k++) {
            counters->events[b->ev[k].kind]++;
            if (b->ev[k].kind != KVR_EVENT_CLEARED)
                counters->tier[b->ev[k].tier]++;
        }
    }
    return KVR_OK;
}
