/* test_event.c - event names and the owning event list (engine/src/event.c): emplace and push
 * copy arrays into the list's arena, growth past the first array and arena chunk, pop, reset
 * and free (the list stays reusable), and names for logs and JSON. */
#include <check.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kvr/err.h"
#include "kvr/event.h"

START_TEST(names)
{
    ck_assert_str_eq(kvr_event_kind_name(KVR_EVENT_STORED), "stored");
    ck_assert_str_eq(kvr_event_kind_name(KVR_EVENT_REMOVED), "removed");
    ck_assert_str_eq(kvr_event_kind_name(KVR_EVENT_CLEARED), "cleared");
    ck_assert_ptr_null(kvr_event_kind_name(0));
    ck_assert_ptr_null(kvr_event_kind_name(4));
    const char *tiers[] = {"device", "host_pinned", "disk", "external"};
    for (int i = 0; i < KVR_TIER_COUNT_; i++) {
        ck_assert_str_eq(kvr_tier_name(i), tiers[i]);
        int t = -1;
        ck_assert_int_eq(kvr_tier_parse(tiers[i], strlen(tiers[i]), &t), 1);
        ck_assert_int_eq(t, i);
    }
    ck_assert_ptr_null(kvr_tier_name(-1));
    ck_assert_ptr_null(kvr_tier_name(KVR_TIER_COUNT_));
    int t = 77;
    ck_assert_int_eq(kvr_tier_parse("dis", 3, &t), 0); /* a prefix is not a name */
    ck_assert_int_eq(kvr_tier_parse("disks", 5, &t), 0);
    ck_assert_int_eq(kvr_tier_parse("Device", 6, &t), 0);
    ck_assert_int_eq(t, 77);
    ck_assert_int_eq(kvr_tier_parse("diskjunk", 4, &t), 1); /* length-delimited */
    ck_assert_int_eq(t, KVR_TIER_DISK);
}
END_TEST

START_TEST(emplace_and_push_copy)
{
    struct kvr_event_list l;
    kvr_event_list_init(&l);
    ck_assert_uint_eq(l.n, 0);
    struct kvr_event *e;
    ck_assert_int_eq(kvr_event_list_emplace(&l, KVR_EVENT_STORED, 3, &e), KVR_OK);
    ck_assert_ptr_nonnull(e->blocks);
    ck_assert_ptr_null(e->hashes);
    ck_assert_uint_eq(e->n, 3);
    ck_assert_uint_eq(e->kind, KVR_EVENT_STORED);
    ck_assert_uint_eq(e->worker_id, 0); /* zeroed */
    for (uint32_t i = 0; i < 3; i++)
        e->blocks[i] = (struct kvr_block){.block_hash = 10 + i, .tokens_hash = 20 + i};
    e->worker_id = 5;
    ck_assert_int_eq(kvr_event_list_emplace(&l, KVR_EVENT_REMOVED, 2, &e), KVR_OK);
    ck_assert_ptr_null(e->blocks);
    ck_assert_ptr_nonnull(e->hashes);
    e->hashes[0] = 1;
    e->hashes[1] = UINT64_MAX;
    ck_assert_int_eq(kvr_event_list_emplace(&l, KVR_EVENT_CLEARED, 0, &e), KVR_OK);
    ck_assert_ptr_null(e->blocks);
    ck_assert_ptr_null(e->hashes);
    /* push copies the source's arrays: the source can change or die afterwards */
    struct kvr_block src_blocks[2] = {{.block_hash = 7, .tokens_hash = 8},
                                      {.block_hash = 9, .tokens_hash = 10}};
    struct kvr_event src = {.worker_id = 42,
                            .event_id = 99,
                            .parent_hash = 123,
                            .has_parent = 1,
                            .dp_rank = 3,
                            .kind = KVR_EVENT_STORED,
                            .tier = KVR_TIER_DISK,
                            .n = 2,
                            .blocks = src_blocks};
    ck_assert_int_eq(kvr_event_list_push(&l, &src), KVR_OK);
    src_blocks[0].block_hash = 0;
    ck_assert_uint_eq(l.n, 4);
    const struct kvr_event *c = &l.ev[3];
    ck_assert_ptr_ne(c->blocks, src_blocks);
    ck_assert_uint_eq(c->blocks[0].block_hash, 7);
    ck_assert_uint_eq(c->blocks[1].tokens_hash, 10);
    ck_assert_uint_eq(c->worker_id, 42);
    ck_assert_uint_eq(c->event_id, 99);
    ck_assert_uint_eq(c->parent_hash, 123);
    ck_assert_uint_eq(c->dp_rank, 3);
    ck_assert_uint_eq(c->tier, KVR_TIER_DISK);
    /* a cleared event's stray arrays are not copied */
    struct kvr_event clr = {.kind = KVR_EVENT_CLEARED, .n = 5, .blocks = src_blocks};
    ck_assert_int_eq(kvr_event_list_push(&l, &clr), KVR_OK);
    ck_assert_uint_eq(l.ev[4].n, 0);
    ck_assert_ptr_null(l.ev[4].blocks);
    /* the earlier events are intact */
    ck_assert_uint_eq(l.ev[0].worker_id, 5);
    ck_assert_uint_eq(l.ev[0].blocks[2].tokens_hash, 22);
    ck_assert_uint_eq(l.ev[1].hashes[1], UINT64_MAX);
    kvr_event_list_pop(&l);
    ck_assert_uint_eq(l.n, 4);
    kvr_event_list_free(&l);
    ck_assert_uint_eq(l.n, 0);
    ck_assert_ptr_null(l.ev);
    kvr_event_list_pop(&l); /* empty: no-op */
    ck_assert_uint_eq(l.n, 0);
}
END_TEST

START_TEST(growth_keeps_arrays)
{
    /* Thousands of events and arrays larger than an arena chunk (64 KiB): every array stays
     * where it was written (16-byte aligned) while the event array and the arena grow. */
    struct kvr_event_list l;
    kvr_event_list_init(&l);
    enum { N = 3000 };
    for (uint32_t i = 0; i < N; i++) {
        uint32_t n = i % 97 == 0 ? 5000 : 1 + i % 13; /* 5000 blocks = 80 KB */
        struct kvr_event *e;
        ck_assert_int_eq(kvr_event_list_emplace(&l, KVR_EVENT_STORED, n, &e), KVR_OK);
        ck_assert_uint_eq((uintptr_t)e->blocks % 16, 0);
        e->event_id = i;
        for (uint32_t j = 0; j < n; j++)
            e->blocks[j] = (struct kvr_block){.block_hash = i * 100000u + j, .tokens_hash = j};
    }
    ck_assert_uint_eq(l.n, N);
    ck_assert_uint_ge(l.cap, N);
    for (uint32_t i = 0; i < N; i++) {
        const struct kvr_event *e = &l.ev[i];
        ck_assert_uint_eq(e->event_id, i);
        ck_assert_uint_eq(e->n, i % 97 == 0 ? 5000 : 1 + i % 13);
        ck_assert_uint_eq(e->blocks[0].block_hash, i * 100000u);
        ck_assert_uint_eq(e->blocks[e->n - 1].block_hash, i * 100000u + e->n - 1);
    }
    /* reset keeps the event array's capacity and drops the arena; the list is reusable */
    size_t cap = l.cap;
    kvr_event_list_reset(&l);
    ck_assert_uint_eq(l.n, 0);
    ck_assert_uint_eq(l.cap, cap);
    ck_assert_ptr_null(l.arena);
    struct kvr_event *e;
    ck_assert_int_eq(kvr_event_list_emplace(&l, KVR_EVENT_REMOVED, 4, &e), KVR_OK);
    e->hashes[3] = 77;
    ck_assert_uint_eq(l.ev[0].hashes[3], 77);
    kvr_event_list_free(&l);
    /* free re-initialises: usable again */
    ck_assert_int_eq(kvr_event_list_emplace(&l, KVR_EVENT_CLEARED, 0, &e), KVR_OK);
    ck_assert_uint_eq(l.n, 1);
    kvr_event_list_free(&l);
}
END_TEST

Suite *event_suite(void);

Suite *event_suite(void)
{
    Suite *s = suite_create("event");
    TCase *tc = tcase_create("api");
    tcase_add_test(tc, names);
    tcase_add_test(tc, emplace_and_push_copy);
    tcase_add_test(tc, growth_keeps_arrays);
    suite_add_tcase(s, tc);
    return s;
}
