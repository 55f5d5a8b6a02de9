/* fuzz_snapshot.c - snapshot files: the loader must refuse bad input cleanly and load good input
 * into indexes whose invariants hold. */
#include <stdint.h>
#include <stdlib.h>

#include "kvr/err.h"
#include "kvr/radix.h"
#include "kvr/snapshot.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int apply(void *ctx, const char *name, size_t name_len, uint32_t block_size,
                 const struct kvr_event_list *events)
{
    (void)ctx;
    (void)name;
    (void)block_size;
    if (name_len == 0 || events == NULL)
        abort();
    kvr_radix_t *t;
    if (kvr_radix_new(&t) != KVR_OK)
        return KVR_OK;
    for (size_t i = 0; i < events->n; i++)
        (void)kvr_radix_apply(t, &events->ev[i]);
    char msg[256];
    if (kvr_radix_check(t, msg, sizeof(msg)) != KVR_OK)
        abort();
    kvr_radix_free(t);
    return KVR_OK;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char err[256];
    int rc = kvr_snapshot_decode(data, size, apply, NULL, NULL, err, sizeof(err));
    if (rc != KVR_OK && rc != KVR_ECORRUPT && rc != KVR_ENOMEM)
        abort();
    return 0;
}
