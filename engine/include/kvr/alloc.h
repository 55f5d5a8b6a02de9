/* alloc.h - accounted allocation for every engine structure.
 *
 * Design: each engine object (an index, a filter, ...) owns one kvr_alloc_t and routes all of its
 * memory through it. The allocator counts live bytes (the usable size the C library really hands
 * out plus its per-chunk header, so figures are honest), tracks the peak, and can be told to fail
 * the Nth call (tests iterate N to prove that every operation survives allocation failure and
 * leaves its structure consistent). There are no globals: two indexes never share counters.
 *
 *     kvr_alloc_t a; kvr_alloc_init(&a);
 *     p = kvr_malloc(&a, n);   ... kvr_free(&a, p);
 *     a.live_bytes, a.peak_bytes, a.live_allocs
 *
 * Thread-safety: none. A kvr_alloc_t is used by one thread at a time (the index's writer, under
 * its write lock). Readers never allocate through it.
 */
#ifndef KVR_ALLOC_H
#define KVR_ALLOC_H

#include <stddef.h>
#include <stdint.h>

typedef struct kvr_alloc {
    size_t live_bytes;  /* bytes currently held, including malloc's chunk header */
    size_t peak_bytes;  /* high-water mark of live_bytes */
    size_t live_allocs; /* number of live blocks */
    uint64_t calls;     /* allocation calls so far (malloc + growing realloc) */
    uint64_t fail_at;   /* if non-zero: the call with this ordinal (1-based) fails */
    uint64_t failures;  /* injected failures so far */
} kvr_alloc_t;

/* Initialises the counters to zero with no failure injection. */
void kvr_alloc_init(kvr_alloc_t *a);

/* Arms failure injection: the nth allocation call from now (1 = the next one) returns NULL.
 * n = 0 disarms. */
void kvr_alloc_fail_after(kvr_alloc_t *a, uint64_t n);

/* Returns owned memory (free with kvr_free on the same allocator) or NULL. size 0 returns NULL. */
void *kvr_malloc(kvr_alloc_t *a, size_t size);

/* Like kvr_malloc, zero-filled; returns NULL on overflow of n * size. */
void *kvr_calloc(kvr_alloc_t *a, size_t n, size_t size);

/* Resizes p (owned, from this allocator, or NULL). On failure returns NULL and p is untouched
 * and still owned by the caller. size 0 frees p and returns NULL. */
void *kvr_realloc(kvr_alloc_t *a, void *p, size_t size);

/* Frees p (NULL is fine). */
void kvr_free(kvr_alloc_t *a, void *p);

#endif
