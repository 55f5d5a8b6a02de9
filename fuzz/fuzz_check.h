/* fuzz_check.h - shared helper for fuzz targets: apply events to a fresh radix tree and abort if
 * any invariant breaks (a fuzzer finding), whatever the input. */
#ifndef KVR_FUZZ_CHECK_H
#define KVR_FUZZ_CHECK_H

#include <stdio.h>
#include <stdlib.h>

#include "kvr/err.h"
#include "kvr/radix.h"

static inline void fuzz_apply_and_check(const struct kvr_event_list *l)
{
    kvr_radix_t *t;
    if (kvr_radix_new(&t) != KVR_OK)
        return;
    for (size_t i = 0; i < l->n; i++)
        (void)kvr_radix_apply(t, &l->ev[i]);
    char msg[256];
    if (kvr_radix_check(t, msg, sizeof(msg)) != KVR_OK) {
        fprintf(stderr, "fuzz: radix invariant broken: %s\n", msg);
        abort();
    }
    struct kvr_event_list d;
    kvr_event_list_init(&d);
    (void)kvr_radix_dump(t, &d);
    kvr_event_list_free(&d);
    kvr_radix_free(t);
}

#endif
