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

/* An integer hash (index.md §2.3). */
static const char *hash(const char *p, const char *end, uint64_t *out)
{
    int neg = 0;
    if (p < end && *p == '-') {
        neg = 1;
        p++;
    }
    if (p >= end || *p < '0' || *p > '9')
        return NULL;
    if (*p == '0' && p + 1 < end && p[1] >= '0' && p[1] <= '9')
        return NULL; /* leading zero */
    uint64_t v = 0;
    const char *b = p;
    while (p < end && *p >= '0' && *p <= '9') {
        unsigned d = (unsigned)(*p - '0');
        if (v > (UINT64_MAX - d) / 10)
            return NULL; /* overflow */
        v = v * 10 + d;
        p++;
    }
    if (p - b > 20 || (p < end && (*p == '.' || *p == 'e' || *p == 'E')))
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
