/* fastjson.c - single-pass parser for query_by_hash bodies (see fastjson.h). */
#include "fastjson.h"

#include <string.h>

static const char *ws(const char *p, const char *end)
{
    while (p < end && (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r'))
        p++;
    return p;
}

/* A string without escapes or control bytes: sets s and n, returns the position after it. */
static const char *str(const char *p, const char *end, const char **s, size_t *n)
{
    if (p >= end || *p != '"')
        return NULL;
    const char *b = ++p;
    while (p < end && *p != '"') {
        if (*p == '\\' || (unsigned char)*p < 0x20)
            return NULL;
        p++;
    }
    if (p >= end)
        return NULL;
    *s = b;
    *n = (size_t)(p - b);
    return p + 1;
}

/* 8 ASCII digits at a time (SWAR): a hash is 18-20 digits. Little-endian loads; elsewhere the
 * byte loop alone. */
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
#define FAST_SWAR 1
static inline uint64_t load8(const char *p)
{
    uint64_t x;
    memcpy(&x, p, 8);
    return x;
}

/* 1 if the 8 bytes are all '0'..'9': every high nibble is 3, and adding 6 carries none of the
 * low nibbles past 9 (no byte can carry into the next once all high nibbles are 3). */
static inline int all_digits8(uint64_t x)
{
    return ((x & 0xF0F0F0F0F0F0F0F0ull) |
            (((x + 0x0606060606060606ull) & 0xF0F0F0F0F0F0F0F0ull) >> 4)) == 0x3333333333333333ull;
}

/* The value of 8 digits, the first (lowest address) most significant: pairs, then quads, then
 * the two halves, each step one multiply. */
static inline uint64_t value8(uint64_t x)
{
    x -= 0x3030303030303030ull;
    x = (x * 10 + (x >> 8)) & 0x00FF00FF00FF00FFull;
    x = (x * 100 + (x >> 16)) & 0x0000FFFF0000FFFFull;
    return (x * 10000 + (x >> 32)) & 0xFFFFFFFFull;
}
#else
#define FAST_SWAR 0
#endif

/* An integer hash (index.md §2.3): u64, or negative i64 taken as two's complement. Up to 19
 * digits cannot overflow, so only a 20th digit is checked. */
static const char *hash(const char *p, const char *end, uint64_t *out)
{
    int neg = 0;
    if (p < end && *p == '-') {
        neg = 1;
        p++;
    }
    if (p >= end || (unsigned)(*p - '0') > 9)
        return NULL;
    if (*p == '0' && p + 1 < end && (unsigned)(p[1] - '0') <= 9)
        return NULL; /* leading zero */
    const char *b = p;
    uint64_t v = 0;
    unsigned d;
#if FAST_SWAR
    for (int k = 0; k < 2 && end - p >= 8; k++) { /* 16 digits at most: no overflow */
        uint64_t x = load8(p);
        if (!all_digits8(x))
            break;
        v = v * 100000000u + value8(x);
        p += 8;
    }
#endif
    const char *stop = end - b > 19 ? b + 19 : end;
    while (p < stop && (d = (unsigned)(*p - '0')) <= 9) {
        v = v * 10 + d;
        p++;
    }
    if (p - b == 19 && p < end && (d = (unsigned)(*p - '0')) <= 9) { /* a 20th digit */
        if (v > (UINT64_MAX - d) / 10)
            return NULL; /* overflow */
        v = v * 10 + d;
        p++;
        if (p < end && (unsigned)(*p - '0') <= 9)
            return NULL; /* 21 digits */
    }
    if (p < end && (*p == '.' || *p == 'e' || *p == 'E'))
        return NULL;
    if (neg) {
        if (v > (uint64_t)1 << 63)
            return NULL;
        v = (uint64_t)0 - v;
    }
    *out = v;
    return p;
}

int srv_fast_query_by_hash(const char *text, size_t len, uint64_t *hashes, size_t cap,
                           struct srv_fast_query *q)
{
    const char *p = text, *end = text + len;
    int seen_hashes = 0;
    memset(q, 0, sizeof(*q));
    p = ws(p, end);
    if (p >= end || *p != '{')
        return 0;
    p = ws(p + 1, end);
    if (p < end && *p == '}')
        return 0;
    for (;;) {
        const char *key;
        size_t kl;
        if ((p = str(p, end, &key, &kl)) == NULL)
            return 0;
        p = ws(p, end);
        if (p >= end || *p != ':')
            return 0;
        p = ws(p + 1, end);
        if (kl == 12 && memcmp(key, "block_hashes", 12) == 0) {
            if (seen_hashes || p >= end || *p != '[')
                return 0;
            seen_hashes = 1;
            p = ws(p + 1, end);
            if (p < end && *p == ']') {
                p++;
            } else {
                for (;;) {
                    if (q->n >= cap || (p = hash(p, end, &hashes[q->n])) == NULL)
                        return 0;
                    q->n++;
                    p = ws(p, end);
                    if (p < end && *p == ',') {
                        p = ws(p + 1, end);
                        continue;
                    }
                    if (p < end && *p == ']') {
                        p++;
                        break;
                    }
                    return 0;
                }
            }
        } else if (kl == 10 && memcmp(key, "model_name", 10) == 0 && q->model == NULL) {
            if ((p = str(p, end, &q->model, &q->model_len)) == NULL)
                return 0;
        } else if (kl == 9 && memcmp(key, "tenant_id", 9) == 0 && q->tenant == NULL) {
            if ((p = str(p, end, &q->tenant, &q->tenant_len)) == NULL)
                return 0;
        } else {
            return 0;
        }
        p = ws(p, end);
        if (p < end && *p == ',') {
            p = ws(p + 1, end);
            continue;
        }
        if (p < end && *p == '}') {
            p = ws(p + 1, end);
            return p == end && seen_hashes;
        }
        return 0;
    }
}

/* ==== generic object walk ===================================================================== */

#define MAX_DEPTH 64

static const char *skip_string(const char *p, const char *end)
{
    /* p at the opening quote */
    for (p++; p < end; p++) {
        unsigned char c = (unsigned char)*p;
        if (c == '"')
            return p + 1;
        if (c < 0x20)
            return NULL;
        if (c == '\\') {
            if (++p >= end)
                return NULL;
            switch (*p) {
            case '"':
            case '\\':
            case '/':
            case 'b':
            case 'f':
            case 'n':
            case 'r':
            case 't':
                break;
            case 'u':
                for (int k = 0; k < 4; k++) {
                    if (++p >= end)
                        return NULL;
                    char h = *p;
                    if (!((h >= '0' && h <= '9') || (h >= 'a' && h <= 'f') ||
                          (h >= 'A' && h <= 'F')))
                        return NULL;
                }
                break;
            default:
                return NULL;
            }
        }
    }
    return NULL;
}

static const char *skip_number(const char *p, const char *end)
{
    if (p < end && *p == '-')
        p++;
    if (p >= end)
        return NULL;
    if (*p == '0') {
        p++;
    } else if (*p >= '1' && *p <= '9') {
#if FAST_SWAR
        while (end - p >= 8 && all_digits8(load8(p)))
            p += 8;
#endif
        while (p < end && *p >= '0' && *p <= '9')
            p++;
    } else {
        return NULL;
    }
    if (p < end && *p == '.') {
        const char *d = ++p;
        while (p < end && *p >= '0' && *p <= '9')
            p++;
        if (p == d)
            return NULL;
    }
    if (p < end && (*p == 'e' || *p == 'E')) {
        p++;
        if (p < end && (*p == '+' || *p == '-'))
            p++;
        const char *d = p;
        while (p < end && *p >= '0' && *p <= '9')
            p++;
        if (p == d)
            return NULL;
    }
    return p;
}

static const char *skip_value(const char *p, const char *end, int depth);

static const char *skip_container(const char *p, const char *end, int depth)
{
    char close = *p == '[' ? ']' : '}';
    int obj = *p == '{';
    if (depth >= MAX_DEPTH)
        return NULL;
    p = ws(p + 1, end);
    if (p < end && *p == close)
        return p + 1;
    for (;;) {
        if (obj) {
            if (p >= end || *p != '"' || (p = skip_string(p, end)) == NULL)
                return NULL;
            p = ws(p, end);
            if (p >= end || *p != ':')
                return NULL;
            p = ws(p + 1, end);
        }
        if ((p = skip_value(p, end, depth + 1)) == NULL)
            return NULL;
        p = ws(p, end);
        if (p < end && *p == ',') {
            p = ws(p + 1, end);
            continue;
        }
        if (p < end && *p == close)
            return p + 1;
        return NULL;
    }
}

static const char *skip_lit(const char *p, const char *end, const char *lit, size_t n)
{
    return (size_t)(end - p) >= n && memcmp(p, lit, n) == 0 ? p + n : NULL;
}

static const char *skip_value(const char *p, const char *end, int depth)
{
    if (p >= end)
        return NULL;
    switch (*p) {
    case '"':
        return skip_string(p, end);
    case '[':
    case '{':
        return skip_container(p, end, depth);
    case 't':
        return skip_lit(p, end, "true", 4);
    case 'f':
        return skip_lit(p, end, "false", 5);
    case 'n':
        return skip_lit(p, end, "null", 4);
    default:
        return skip_number(p, end);
    }
}

int srv_fast_object(const char *text, size_t len, srv_fast_member_fn fn, void *ctx)
{
    const char *p = text, *end = text + len;
    p = ws(p, end);
    if (p >= end || *p != '{')
        return 0;
    p = ws(p + 1, end);
    if (p < end && *p == '}')
        return ws(p + 1, end) == end;
    for (;;) {
        const char *key;
        size_t kl;
        if ((p = str(p, end, &key, &kl)) == NULL)
            return 0;
        p = ws(p, end);
        if (p >= end || *p != ':')
            return 0;
        p = ws(p + 1, end);
        if (p >= end) /* no value after the ':' (never read past the body) */
            return 0;
        struct srv_fast_value v;
        v.p = p;
        v.type =
            *p == '"' || *p == '[' || *p == '{' || *p == 't' || *p == 'f' || *p == 'n' ? *p : '0';
        const char *after = skip_value(p, end, 1);
        if (after == NULL)
            return 0;
        v.len = (size_t)(after - p);
        if (fn(ctx, key, kl, &v) != 0)
            return 0;
        p = ws(after, end);
        if (p < end && *p == ',') {
            p = ws(p + 1, end);
            continue;
        }
        if (p < end && *p == '}')
            return ws(p + 1, end) == end;
        return 0;
    }
}

long srv_fast_u64_array(const struct srv_fast_value *v, uint64_t *out, size_t cap)
{
    if (v->type != '[')
        return -1;
    const char *p = ws(v->p + 1, v->p + v->len), *end = v->p + v->len;
    size_t n = 0;
    if (p < end && *p == ']')
        return 0;
    for (;;) {
        if (n >= cap || (p = hash(p, end, &out[n])) == NULL)
            return -1;
        n++;
        p = ws(p, end);
        if (p < end && *p == ',') {
            p = ws(p + 1, end);
            continue;
        }
        return p < end && *p == ']' ? (long)n : -1;
    }
}

long srv_fast_u32_array(const struct srv_fast_value *v, uint32_t *out, size_t cap)
{
    if (v->type != '[')
        return -1;
    const char *p = ws(v->p + 1, v->p + v->len), *end = v->p + v->len;
    size_t n = 0;
    if (p < end && *p == ']')
        return 0;
    for (;;) {
        uint64_t x;
        if (n >= cap || p >= end || *p == '-' || (p = hash(p, end, &x)) == NULL || x > UINT32_MAX)
            return -1;
        out[n++] = (uint32_t)x;
        p = ws(p, end);
        if (p < end && *p == ',') {
            p = ws(p + 1, end);
            continue;
        }
        return p < end && *p == ']' ? (long)n : -1;
    }
}

int srv_fast_uint(const struct srv_fast_value *v, uint64_t max, uint64_t *out)
{
    if (v->type != '0' || v->p[0] == '-')
        return 0;
    const char *end = hash(v->p, v->p + v->len, out);
    return end == v->p + v->len && *out <= max;
}
