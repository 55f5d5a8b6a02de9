/* fuzz_event_json.c - RouterEvent JSON bodies: decode (any bytes), re-encode what decoded and
 * decode it again (must give the same events), apply to a tree (invariants must hold). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_check.h"
#include "kvr/event_json.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int same_event(const struct kvr_event *a, const struct kvr_event *b)
{
    if (a->kind != b->kind || a->worker_id != b->worker_id || a->dp_rank != b->dp_rank ||
        a->event_id != b->event_id || a->tier != b->tier || a->n != b->n ||
        a->has_parent != b->has_parent || (a->has_parent && a->parent_hash != b->parent_hash))
        return 0;
    if (a->n == 0)
        return 1; /* empty arrays may be NULL */
    if (a->kind == KVR_EVENT_STORED)
        return memcmp(a->blocks, b->blocks, a->n * sizeof(*a->blocks)) == 0;
    if (a->kind == KVR_EVENT_REMOVED)
        return memcmp(a->hashes, b->hashes, a->n * sizeof(*a->hashes)) == 0;
    return 1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct kvr_event_list l, back;
    struct kvr_event_json_error errs[8];
    struct kvr_event_json_report rep = {.errors = errs, .cap = 8};
    kvr_event_list_init(&l);
    kvr_event_list_init(&back);
    (void)kvr_event_json_decode_body((const char *)data, size, &l, &rep);
    if (rep.decoded != l.n)
        abort();
    struct kvr_buf b;
    kvr_buf_init(&b, NULL);
    if (l.n > 0 && kvr_event_json_encode_array(l.ev, l.n, &b) == KVR_OK) {
        struct kvr_event_json_report rep2 = {0};
        (void)kvr_event_json_decode_body(b.data, b.len, &back, &rep2);
        if (back.n != l.n || rep2.failed != 0)
            abort();
        for (size_t i = 0; i < l.n; i++)
            if (!same_event(&l.ev[i], &back.ev[i]))
                abort();
    }
    fuzz_apply_and_check(&l);
    kvr_buf_free(&b);
    kvr_event_list_free(&l);
    kvr_event_list_free(&back);
    return 0;
}
