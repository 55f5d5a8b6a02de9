/* fuzz_event_msgpack.c - engine KV-event payloads (all msgpack dialects): decode any bytes,
 * convert what decoded to index events, apply them to a tree (invariants must hold). */
#include <stdint.h>
#include <stdlib.h>

#include "fuzz_check.h"
#include "kvr/event_convert.h"
#include "kvr/event_msgpack.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct kvr_emp_batch b;
    struct kvr_emp_counters c = {0};
    char err[256];
    int kind = 0;
    kvr_alloc_t a;
    kvr_alloc_init(&a);
    kvr_emp_batch_init(&b, &a);
    if (kvr_emp_decode(&b, data, size, NULL, &c, &kind, err, sizeof(err)) == KVR_OK) {
        struct kvr_event_list l;
        struct kvr_convert_counters cc = {0};
        struct kvr_convert_opts o = {.worker_id = 7, .dp_rank = 0, .block_size = 4};
        kvr_event_list_init(&l);
        (void)kvr_convert_batch(&b, 1, &o, &l, &cc);
        fuzz_apply_and_check(&l);
        o.block_size = 1;
        kvr_event_list_reset(&l);
        (void)kvr_convert_batch(&b, 2, &o, &l, &cc);
        fuzz_apply_and_check(&l);
        kvr_event_list_free(&l);
    } else if (kind == 0) {
        abort(); /* a failure must say what kind it was */
    }
    kvr_emp_batch_free(&b);
    if (a.live_allocs != 0)
        abort(); /* the batch leaked */
    return 0;
}
