/* buf.h - a growable byte buffer for building output text (JSON encoders, dumps, reports).
 *
 * Design: one contiguous allocation, grown by doubling, always NUL-terminated once it holds
 * memory, so the content can be printed or handed to a C-string API without copying:
 *
 *     data ─▶ [ content: len bytes ][ '\0' ][ spare ......... ]
 *             └──────────────────── cap bytes ────────────────┘     cap >= len + 1
 *
 * Memory is charged to a kvr_alloc_t: the caller's (borrowed; byte counts and failure
 * injection) or, when none is given, one embedded in the buffer. Growth failure leaves the
 * content untouched and returns KVR_ENOMEM.
 *
 * Two ways to write:
 *   - checked appends (kvr_buf_append*), each of which may grow the buffer;
 *   - bulk writes for hot encoders: kvr_buf_reserve(b, n) once, write up to n bytes at
 *     kvr_buf_tail(b), then kvr_buf_commit(b, written). kvr_buf_fmt_u64 formats a u64 in place.
 *
 * Thread-safety: none; a buffer belongs to one thread at a time.
 */
#ifndef KVR_BUF_H
#define KVR_BUF_H

#include <stddef.h>
#include <stdint.h>

#include "kvr/alloc.h"

/* Longest decimal form of a u64 (18446744073709551615). */
#define KVR_U64_DEC_MAX 20u

struct kvr_buf {
    char *data;      /* content + NUL, or NULL before the first growth (owned) */
    size_t len;      /* content bytes */
    size_t cap;      /* allocated bytes; 0 when data is NULL */
    kvr_alloc_t *a;  /* allocator charged (borrowed), or NULL for `own` */
    kvr_alloc_t own; /* counters used when no allocator was given */
};

/* Initialises an empty buffer. `a` (borrowed, may be NULL) must outlive the buffer; NULL means
 * the buffer's own embedded counters. Never fails, never allocates. */
void kvr_buf_init(struct kvr_buf *b, kvr_alloc_t *a);

/* Releases the memory the buffer owns; the buffer stays initialised (empty, same allocator). */
void kvr_buf_free(struct kvr_buf *b);

/* Empties the buffer and keeps its memory. */
void kvr_buf_reset(struct kvr_buf *b);

/* Makes room for `extra` more content bytes (plus the NUL). Returns KVR_OK or KVR_ENOMEM
 * (content and capacity unchanged; also when len + extra overflows). */
int kvr_buf_reserve(struct kvr_buf *b, size_t extra);

/* Appends n bytes from p (borrowed; may be NULL when n == 0). KVR_OK or KVR_ENOMEM (unchanged). */
int kvr_buf_append(struct kvr_buf *b, const void *p, size_t n);

/* Appends a NUL-terminated string (borrowed). KVR_OK or KVR_ENOMEM (unchanged). */
int kvr_buf_append_str(struct kvr_buf *b, const char *s);

/* Appends one byte. KVR_OK or KVR_ENOMEM (unchanged). */
int kvr_buf_append_char(struct kvr_buf *b, char c);

/* Appends v in decimal (no sign, no padding). KVR_OK or KVR_ENOMEM (unchanged). */
int kvr_buf_append_u64(struct kvr_buf *b, uint64_t v);

/* Writes v in decimal at dst (borrowed; room for KVR_U64_DEC_MAX bytes), without a NUL.
 * Returns the number of digits (1..20). Pure, thread-safe. */
size_t kvr_buf_fmt_u64(char *dst, uint64_t v);

/* Where bulk writes go: the first spare byte (borrowed; valid until the next growth). Only
 * the bytes reserved with kvr_buf_reserve may be written. NULL if the buffer never grew. */
static inline char *kvr_buf_tail(struct kvr_buf *b)
{
    return b->data != NULL ? b->data + b->len : NULL;
}

/* Adds n bytes written at kvr_buf_tail to the content (n <= the reserved room) and restores
 * the NUL terminator. */
static inline void kvr_buf_commit(struct kvr_buf *b, size_t n)
{
    b->len += n;
    b->data[b->len] = '\0';
}

/* Drops the content beyond `len` (len <= current length); used to roll back a failed encode. */
static inline void kvr_buf_truncate(struct kvr_buf *b, size_t len)
{
    if (b->data != NULL && len < b->len) {
        b->len = len;
        b->data[len] = '\0';
    }
}

/* The content as a C string (borrowed; "" when empty). */
static inline const char *kvr_buf_cstr(const struct kvr_buf *b)
{
    return b->data != NULL ? b->data : "";
}

#endif
