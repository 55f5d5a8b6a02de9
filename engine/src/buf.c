/* buf.c - growable byte buffer (see kvr/buf.h).
 *
 * Static helpers borrow every pointer they take and return nothing owned, unless their comment says
 * otherwise. */
#include "kvr/buf.h"

#include <string.h>

#include "kvr/err.h"

#define MIN_CAP 64u

/* "00" "01" ... "99": two digits per table lookup halves the divisions of the formatter. */
static const char digit_pairs[201] = "00010203040506070809"
                                     "10111213141516171819"
                                     "20212223242526272829"
                                     "30313233343536373839"
                                     "40414243444546474849"
                                     "50515253545556575859"
                                     "60616263646566676869"
                                     "70717273747576777879"
                                     "80818283848586878889"
                                     "90919293949596979899";

static kvr_alloc_t *alloc_of(struct kvr_buf *b)
{
    /* Resolved on each call rather than stored, so a buffer stays valid if moved by value. */
    return b->a != NULL ? b->a : &b->own;
}

void kvr_buf_init(struct kvr_buf *b, kvr_alloc_t *a)
{
    memset(b, 0, sizeof(*b));
    b->a = a;
    kvr_alloc_init(&b->own);
}

void kvr_buf_free(struct kvr_buf *b)
{
    kvr_free(alloc_of(b), b->data);
    b->data = NULL;
    b->len = 0;
    b->cap = 0;
}

void kvr_buf_reset(struct kvr_buf *b)
{
    b->len = 0;
    if (b->data != NULL)
        b->data[0] = '\0';
}

int kvr_buf_reserve(struct kvr_buf *b, size_t extra)
{
    if (extra > SIZE_MAX - 1 - b->len)
        return KVR_ENOMEM;
    size_t need = b->len + extra + 1; /* + NUL */
    if (need <= b->cap)
        return KVR_OK;
    size_t cap = b->cap > MIN_CAP ? b->cap : MIN_CAP;
    while (cap < need)
        cap = cap > SIZE_MAX / 2 ? need : cap * 2;
    char *p = kvr_realloc(alloc_of(b), b->data, cap);
    if (p == NULL)
        return KVR_ENOMEM;
    if (b->data == NULL)
        p[0] = '\0';
    b->data = p;
    b->cap = cap;
    return KVR_OK;
}

int kvr_buf_append(struct kvr_buf *b, const void *p, size_t n)
{
    if (n == 0)
        return b->data != NULL ? KVR_OK : kvr_buf_reserve(b, 0);
    if (kvr_buf_reserve(b, n) != KVR_OK)
        return KVR_ENOMEM;
    memcpy(b->data + b->len, p, n);
    kvr_buf_commit(b, n);
    return KVR_OK;
}

int kvr_buf_append_str(struct kvr_buf *b, const char *s)
{
    return kvr_buf_append(b, s, strlen(s));
}

int kvr_buf_append_char(struct kvr_buf *b, char c)
{
    return kvr_buf_append(b, &c, 1);
}

/* Decimal digits of v (1..20). */
static size_t dec_len(uint64_t v)
{
    size_t n = 1;
    for (;;) {
        if (v < 10)
            return n;
        if (v < 100)
            return n + 1;
        if (v < 1000)
            return n + 2;
        if (v < 10000)
            return n + 3;
        v /= 10000;
        n += 4;
    }
}

size_t kvr_buf_fmt_u64(char *dst, uint64_t v)
{
    /* the length first, then the digits in place from the last one, two at a time */
    size_t n = dec_len(v);
    char *p = dst + n;
    while (v >= 100) {
        unsigned r = (unsigned)(v % 100);
        v /= 100;
        p -= 2;
        memcpy(p, digit_pairs + 2 * r, 2);
    }
    if (v >= 10)
        memcpy(p - 2, digit_pairs + 2 * v, 2);
    else
        p[-1] = (char)('0' + v);
    return n;
}

int kvr_buf_append_u64(struct kvr_buf *b, uint64_t v)
{
    if (kvr_buf_reserve(b, KVR_U64_DEC_MAX) != KVR_OK)
        return KVR_ENOMEM;
    kvr_buf_commit(b, kvr_buf_fmt_u64(b->data + b->len, v));
    return KVR_OK;
}
