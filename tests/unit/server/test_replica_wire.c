/* test_replica_wire.c - the replica-sync messages (server/src/replica_wire.c): every event kind
 * round-trips exactly, and malformed messages are refused whole with a message naming the field. */
#include <check.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jsonr.h"
#include "jsonw.h"
#include "kvr/err.h"
#include "replica_wire.h"

Suite *replica_wire_suite(void);

static struct srv_jdoc doc;
static struct srv_rw_decoded dec;
static struct kvr_buf buf;

static void setup(void)
{
    ck_assert_int_eq(srv_jdoc_init(&doc), KVR_OK);
    memset(&dec, 0, sizeof(dec));
    kvr_buf_init(&buf, NULL);
}

static void teardown(void)
{
    srv_jdoc_free(&doc);
    srv_rw_decoded_free(&dec);
    kvr_buf_free(&buf);
}

static int decode(const char *text, char *err, size_t err_len)
{
    srv_jdoc_release(&doc);
    return srv_rw_decode(&doc, text, strlen(text), &dec, err, err_len);
}

START_TEST(every_kind_round_trips)
{
    static const uint64_t seq[] = {1, 18446744073709551615ull, 9143094415614847814ull};
    static const uint64_t loc[] = {42, 43};
    const char *model = "llama:acme";
    struct srv_rw_event evs[] = {
        {.kind = SRV_RW_ADD,
         .dp_rank = 3,
         .model = model,
         .model_len = strlen(model),
         .request_id = (1ull << 53) - 1,
         .worker_id = 18446744073709551615ull,
         .prefill_tokens = 96,
         .t_us = 1733054400123456ull,
         .hashes = seq,
         .n_hashes = 3},
        {.kind = SRV_RW_ADD,
         .model = model,
         .model_len = strlen(model),
         .request_id = 8,
         .worker_id = 1}, /* no blocks */
        {.kind = SRV_RW_FIRST,
         .model = model,
         .model_len = strlen(model),
         .request_id = 7,
         .worker_id = 2,
         .t_us = 5},
        {.kind = SRV_RW_FREE,
         .model = model,
         .model_len = strlen(model),
         .request_id = 7,
         .worker_id = 2,
         .dp_rank = 1},
        {.kind = SRV_RW_APPROX,
         .model = model,
         .model_len = strlen(model),
         .worker_id = 9,
         .dp_rank = 0,
         .hashes = loc,
         .n_hashes = 2},
        {.kind = SRV_RW_STATE_BEGIN, .model = model, .model_len = strlen(model)},
        {.kind = SRV_RW_STATE_END, .model = model, .model_len = strlen(model)},
    };
    size_t n = sizeof(evs) / sizeof(evs[0]);
    struct srv_rw_header h = {
        .type = SRV_RW_OPS, .router_id = 4711, .seq = 12, .ts_us = 1733054400999999ull};
    struct srv_jw w;
    srv_jw_init(&w, &buf);
    srv_rw_begin(&w, &h);
    for (size_t k = 0; k < n; k++)
        srv_rw_event(&w, &evs[k], k == 0);
    ck_assert_int_eq(srv_rw_end(&w, &h), KVR_OK);
    char err[256] = "";
    ck_assert_msg(decode(kvr_buf_cstr(&buf), err, sizeof(err)) == KVR_OK, "%s\n%s", err,
                  kvr_buf_cstr(&buf));
    ck_assert_int_eq(dec.h.type, SRV_RW_OPS);
    ck_assert_uint_eq(dec.h.router_id, 4711);
    ck_assert_uint_eq(dec.h.seq, 12);
    ck_assert_uint_eq(dec.h.ts_us, 1733054400999999ull);
    ck_assert_uint_eq(dec.n_ev, n);
    for (size_t k = 0; k < n; k++) {
        const struct srv_rw_event *a = &evs[k], *b = &dec.ev[k];
        ck_assert_int_eq(b->kind, a->kind);
        ck_assert_uint_eq(b->model_len, a->model_len);
        ck_assert(memcmp(b->model, a->model, a->model_len) == 0);
        if (a->kind == SRV_RW_STATE_BEGIN || a->kind == SRV_RW_STATE_END)
            continue;
        if (a->kind != SRV_RW_APPROX)
            ck_assert_uint_eq(b->request_id, a->request_id);
        ck_assert_uint_eq(b->worker_id, a->worker_id);
        ck_assert_uint_eq(b->dp_rank, a->dp_rank);
        ck_assert_uint_eq(b->t_us, a->t_us);
        ck_assert_uint_eq(b->prefill_tokens, a->prefill_tokens);
        ck_assert_uint_eq(b->n_hashes, a->n_hashes);
        for (size_t j = 0; j < a->n_hashes; j++)
            ck_assert_uint_eq(b->hashes[j], a->hashes[j]);
    }
}
END_TEST

START_TEST(control_messages)
{
    static const int types[] = {SRV_RW_SYNC, SRV_RW_HELLO, SRV_RW_BYE};
    for (size_t k = 0; k < 3; k++) {
        kvr_buf_reset(&buf);
        struct srv_rw_header h = {.type = types[k], .router_id = 9, .seq = k + 1, .target = 77};
        struct srv_jw w;
        srv_jw_init(&w, &buf);
        srv_rw_begin(&w, &h);
        ck_assert_int_eq(srv_rw_end(&w, &h), KVR_OK);
        char err[256] = "";
        ck_assert_msg(decode(kvr_buf_cstr(&buf), err, sizeof(err)) == KVR_OK, "%s", err);
        ck_assert_int_eq(dec.h.type, types[k]);
        ck_assert_uint_eq(dec.h.seq, k + 1);
        ck_assert_uint_eq(dec.h.target, types[k] == SRV_RW_SYNC ? 77 : 0);
        ck_assert_uint_eq(dec.n_ev, 0);
        ck_assert_str_eq(srv_rw_type_name(types[k]), k == 0 ? "sync" : k == 1 ? "hello" : "bye");
    }
    ck_assert_ptr_null(srv_rw_type_name(0));
    ck_assert_ptr_null(srv_rw_type_name(99));
}
END_TEST

START_TEST(hand_written_and_forward_compatible)
{
    /* Dynamo-style field names, negative i64 hashes, and members we do not know are ignored. */
    const char *text =
        "{\"v\":1,\"type\":\"ops\",\"router_id\":18446744073709551615,\"seq\":1,\"extra\":[1,2],"
        "\"events\":[{\"model\":\"m\",\"request_id\":5,\"lora_name\":null,"
        "\"worker\":{\"worker_id\":7,\"dp_rank\":0,\"x\":1},"
        "\"data\":{\"add_request\":{\"prefill_tokens\":0,\"seq_hashes\":[-1,2],"
        "\"expected_output_tokens\":9}}}]}";
    char err[256] = "";
    ck_assert_msg(decode(text, err, sizeof(err)) == KVR_OK, "%s", err);
    ck_assert_uint_eq(dec.h.router_id, 18446744073709551615ull);
    ck_assert_uint_eq(dec.h.ts_us, 0);
    ck_assert_uint_eq(dec.n_ev, 1);
    ck_assert_uint_eq(dec.ev[0].hashes[0], 18446744073709551615ull);
    ck_assert_uint_eq(dec.ev[0].hashes[1], 2);
    ck_assert_uint_eq(dec.ev[0].t_us, 0);
}
END_TEST

START_TEST(malformed_messages_are_refused_whole)
{
    struct {
        const char *text, *needle;
    } cases[] = {
        {"", "JSON"},
        {"[1]", "expected an object"},
        {"{\"v\":2,\"type\":\"ops\",\"router_id\":1,\"seq\":1,\"events\":[]}",
         "unsupported version 2"},
        {"{\"type\":\"ops\",\"router_id\":1,\"seq\":1,\"events\":[]}", "v: missing"},
        {"{\"v\":1,\"type\":\"gossip\",\"router_id\":1,\"seq\":1}", "unknown message type"},
        {"{\"v\":1,\"type\":\"hello\",\"router_id\":0,\"seq\":1}", "router_id: must not be 0"},
        {"{\"v\":1,\"type\":\"hello\",\"router_id\":-1,\"seq\":1}", "router_id"},
        {"{\"v\":1,\"type\":\"hello\",\"router_id\":1}", "seq: missing"},
        {"{\"v\":1,\"type\":\"hello\",\"router_id\":18446744073709551616,\"seq\":1}", "router_id"},
        {"{\"v\":1,\"type\":\"ops\",\"router_id\":1,\"seq\":1}", "events: missing"},
        {"{\"v\":1,\"type\":\"ops\",\"router_id\":1,\"seq\":1,\"events\":{}}", "an array"},
        {"{\"v\":1,\"type\":\"ops\",\"router_id\":1,\"seq\":1,\"events\":[{\"data\":\"free\"}]}",
         "events[0].model: missing"},
        {"{\"v\":1,\"type\":\"ops\",\"router_id\":1,\"seq\":1,\"events\":[{\"model\":\"m\","
         "\"request_id\":1,\"worker\":{\"worker_id\":1},\"data\":\"explode\"}]}",
         "unknown event kind"},
        {"{\"v\":1,\"type\":\"ops\",\"router_id\":1,\"seq\":1,\"events\":[{\"model\":\"m\","
         "\"worker\":{\"worker_id\":1},\"data\":\"free\"}]}",
         "events[0].request_id: missing"},
        {"{\"v\":1,\"type\":\"ops\",\"router_id\":1,\"seq\":1,\"events\":[{\"model\":\"m\","
         "\"request_id\":1,\"data\":\"free\"}]}",
         "events[0].worker: missing"},
        {"{\"v\":1,\"type\":\"ops\",\"router_id\":1,\"seq\":1,\"events\":[{\"model\":\"m\","
         "\"request_id\":1,\"worker\":{\"worker_id\":1,\"dp_rank\":4294967296},\"data\":\"free\"}]"
         "}",
         "dp_rank"},
        {"{\"v\":1,\"type\":\"ops\",\"router_id\":1,\"seq\":1,\"events\":[{\"model\":\"m\","
         "\"request_id\":1,\"worker\":{\"worker_id\":1},\"data\":{\"add_request\":{"
         "\"seq_hashes\":[1]}}}]}",
         "prefill_tokens: missing"},
        {"{\"v\":1,\"type\":\"ops\",\"router_id\":1,\"seq\":1,\"events\":[{\"model\":\"m\","
         "\"request_id\":1,\"worker\":{\"worker_id\":1},\"data\":{\"add_request\":{"
         "\"prefill_tokens\":1,\"seq_hashes\":[1.5]}}}]}",
         "seq_hashes[0]"},
        {"{\"v\":1,\"type\":\"ops\",\"router_id\":1,\"seq\":1,\"events\":[{\"model\":\"m\","
         "\"worker\":{\"worker_id\":1},\"data\":{\"approx\":{}}}]}",
         "local_hashes: missing"},
        /* a good event before a bad one: nothing is returned */
        {"{\"v\":1,\"type\":\"ops\",\"router_id\":1,\"seq\":1,\"events\":[{\"model\":\"m\","
         "\"request_id\":1,\"worker\":{\"worker_id\":1},\"data\":\"free\"},{\"model\":7}]}",
         "events[1].model"},
    };
    for (size_t k = 0; k < sizeof(cases) / sizeof(cases[0]); k++) {
        char err[256] = "";
        int rc = decode(cases[k].text, err, sizeof(err));
        ck_assert_msg(rc == KVR_ECORRUPT, "case %zu (%s): rc %d", k, cases[k].text, rc);
        ck_assert_msg(strstr(err, cases[k].needle) != NULL, "case %zu: '%s' not in '%s'", k,
                      cases[k].needle, err);
        ck_assert_uint_eq(dec.n_ev, 0);
    }
}
END_TEST

START_TEST(event_limit)
{
    /* SRV_RW_MAX_EVENTS + 1 events are refused; exactly the limit is fine. */
    for (int over = 0; over < 2; over++) {
        kvr_buf_reset(&buf);
        struct srv_rw_header h = {.type = SRV_RW_OPS, .router_id = 1, .seq = 1};
        struct srv_jw w;
        srv_jw_init(&w, &buf);
        srv_rw_begin(&w, &h);
        size_t n = SRV_RW_MAX_EVENTS + (size_t)over;
        for (size_t k = 0; k < n; k++) {
            struct srv_rw_event ev = {
                .kind = SRV_RW_FREE, .model = "m", .model_len = 1, .request_id = k, .worker_id = 1};
            srv_rw_event(&w, &ev, k == 0);
        }
        ck_assert_int_eq(srv_rw_end(&w, &h), KVR_OK);
        char err[256] = "";
        int rc = decode(kvr_buf_cstr(&buf), err, sizeof(err));
        if (over) {
            ck_assert_int_eq(rc, KVR_ECORRUPT);
            ck_assert_ptr_nonnull(strstr(err, "more than"));
        } else {
            ck_assert_msg(rc == KVR_OK, "%s", err);
            ck_assert_uint_eq(dec.n_ev, n);
            ck_assert_uint_eq(dec.ev[n - 1].request_id, n - 1);
        }
    }
}
END_TEST

Suite *replica_wire_suite(void)
{
    Suite *s = suite_create("replica_wire");
    TCase *api = tcase_create("api");
    tcase_add_checked_fixture(api, setup, teardown);
    tcase_add_test(api, every_kind_round_trips);
    tcase_add_test(api, control_messages);
    tcase_add_test(api, hand_written_and_forward_compatible);
    suite_add_tcase(s, api);
    TCase *edge = tcase_create("edge");
    tcase_add_checked_fixture(edge, setup, teardown);
    tcase_add_test(edge, malformed_messages_are_refused_whole);
    tcase_add_test(edge, event_limit);
    suite_add_tcase(s, edge);
    return s;
}
