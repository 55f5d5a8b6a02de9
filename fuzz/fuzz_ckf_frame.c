/* fuzz_ckf_frame.c - CKF1 snapshot and delta frames (docs/CKF_FORMAT.md). The input is a
 * sequence of frames, each prefixed by a 2-byte little-endian length; every frame is decoded on
 * its own and fed to lane 0 of a consumer (1024 buckets, default seed, producer 7). Whatever the
 * bytes, decoding and feeding must not crash, a retired lane must explain why, and searches on the
 * consumer must keep working. Each frame is fed twice: as it is, and with its body checksum
 * (header bytes 44..47) set right, so mutations reach the body parser behind the checksum. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "kvr/ckf.h"
#include "kvr/ckf_frame.h"
#include "kvr/err.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Decodes one frame and feeds it to lane 0. */
static void feed(kvr_ckf_consumer_t *c, const uint8_t *p, size_t len)
{
    struct kvr_ckf_frame f;
    const char *why = NULL;
    if (kvr_ckf_frame_decode(p, len, &f, &why) != KVR_OK && why == NULL)
        abort(); /* a refusal must say why */
    int outcome = 0;
    int rc = kvr_ckf_consumer_feed(c, 0, p, len, &outcome);
    if (rc != KVR_OK && rc != KVR_ECORRUPT && rc != KVR_ESTATE)
        abort();
    if (rc != KVR_OK)
        (void)kvr_ckf_consumer_bind(c, 0, 7); /* a new lease, as an operator would */
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    kvr_ckf_consumer_t *c;
    if (kvr_ckf_consumer_new(2, 1024, KVR_CKF_DEFAULT_SEED, &c) != KVR_OK)
        return 0;
    (void)kvr_ckf_consumer_bind(c, 0, 7);
    size_t off = 0;
    while (off + 2 <= size) {
        size_t len = (size_t)data[off] | ((size_t)data[off + 1] << 8);
        off += 2;
        if (len > size - off)
            len = size - off;
        feed(c, data + off, len);
        if (len >= KVR_CKF_FRAME_HEADER_LEN) {
            uint8_t *fixed = malloc(len); /* exactly sized: an over-read is an ASan report */
            if (fixed != NULL) {
                memcpy(fixed, data + off, len);
                uint32_t sum = (uint32_t)XXH3_64bits_withSeed(fixed + KVR_CKF_FRAME_HEADER_LEN,
                                                              len - KVR_CKF_FRAME_HEADER_LEN, 0);
                for (int k = 0; k < 4; k++)
                    fixed[44 + k] = (uint8_t)(sum >> (8 * k));
                feed(c, fixed, len);
                free(fixed);
            }
        }
        off += len;
    }
    uint64_t locals[4] = {1, 2, 3, 4};
    uint32_t depths[16];
    (void)kvr_ckf_consumer_search_locals(c, locals, 4, 8, depths);
    kvr_ckf_consumer_free(c);
    return 0;
}
