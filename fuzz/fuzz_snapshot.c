/* fuzz_snapshot.c - snapshot files: the loader must refuse bad input cleanly and load good input
 * into indexes whose invariants hold. Each input is decoded twice: as it is (the checksum
 * refuses nearly every mutation), and with its trailer replaced by the right XXH3-64, so the
 * fuzzer reaches the structure behind the checksum (headers, sections, counts, events). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

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
    if (size < 8)
        return 0;
    uint8_t *fixed = malloc(size); /* exactly sized: an over-read is an ASan report */
    if (fixed == NULL)
        return 0;
    memcpy(fixed, data, size);
    uint64_t sum = XXH3_64bits(fixed, size - 8);
    for (int k = 0; k < 8; k++)
        fixed[size - 8 + (size_t)k] = (uint8_t)(sum >> (8 * k));
    rc = kvr_snapshot_decode(fixed, size, apply, NULL, NULL, err, sizeof(err));
    if (rc != KVR_OK && rc != KVR_ECORRUPT && rc != KVR_ENOMEM)
        abort();
    if (rc == KVR_ECORRUPT && strstr(err, "checksum") != NULL)
        abort(); /* the trailer is right now: another reason must be given */
    free(fixed);
    return 0;
}
