/* alloc.c - accounted allocation with failure injection (see kvr/alloc.h). */
#define _GNU_SOURCE /* malloc_usable_size */
#include "kvr/alloc.h"

#include <malloc.h>
#include <stdlib.h>
#include <string.h>

/* glibc keeps one size_t header in front of each chunk. */
#define CHUNK_HEADER sizeof(size_t)

static size_t chunk_bytes(void *p)
{
    return malloc_usable_size(p) + CHUNK_HEADER;
}

static int injected_failure(kvr_alloc_t *a)
{
    a->calls++;
    if (a->fail_at != 0 && a->calls == a->fail_at) {
        a->failures++;
        return 1;
    }
    return 0;
}

static void account_add(kvr_alloc_t *a, size_t n)
{
    a->live_bytes += n;
    if (a->live_bytes > a->peak_bytes)
        a->peak_bytes = a->live_bytes;
}

void kvr_alloc_init(kvr_alloc_t *a)
{
    memset(a, 0, sizeof(*a));
}

void kvr_alloc_fail_after(kvr_alloc_t *a, uint64_t n)
{
    a->fail_at = n ? a->calls + n : 0;
}

void *kvr_malloc(kvr_alloc_t *a, size_t size)
{
    if (size == 0 || injected_failure(a))
        return NULL;
    void *p = malloc(size);
    if (p == NULL)
        return NULL;
    a->live_allocs++;
    account_add(a, chunk_bytes(p));
    return p;
}

void *kvr_calloc(kvr_alloc_t *a, size_t n, size_t size)
{
    if (n != 0 && size > SIZE_MAX / n)
        return NULL;
    void *p = kvr_malloc(a, n * size);
    if (p != NULL)
        memset(p, 0, n * size);
    return p;
}

void *kvr_realloc(kvr_alloc_t *a, void *p, size_t size)
{
    if (p == NULL)
        return kvr_malloc(a, size);
    if (size == 0) {
        kvr_free(a, p);
        return NULL;
    }
    size_t old = chunk_bytes(p);
    if (size > old - CHUNK_HEADER && injected_failure(a))
        return NULL;
    void *q = realloc(p, size);
    if (q == NULL)
        return NULL;
    a->live_bytes -= old;
    account_add(a, chunk_bytes(q));
    return q;
}

void kvr_free(kvr_alloc_t *a, void *p)
{
    if (p == NULL)
        return;
    a->live_bytes -= chunk_bytes(p);
    a->live_allocs--;
    free(p);
}
