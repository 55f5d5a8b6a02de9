/* test_event_json.c - RouterEvent JSON decoding (shapes, field rules, u64 edges, error
 * messages, body forms) and encoding (exact text, round trips, OOM). */
#include <check.h>
#include <inttypes.h>
#include <json-c/json.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvr/buf.h"
#include "kvr/err.h"
#include "kvr/event.h"
#include "kvr/event_json.h"

static uint64_t test_seed(void)
{
    const char *s = getenv("KVR_TEST_SEED");
    return s != NULL ? strtoull(s, NULL, 0) : UINT64_C(20260529);
}

static uint64_t rng_next(uint64_t *s)
{
    uint64_t z = (*s += UINT64_C(0x9E3779B97F4A7C15));
    z = (z ^ (z >> 30)) * UINT64_C(0xBF58476D1CE4E5B9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94D049BB133111EB);
    return z ^ (z >> 31);
}

/* ==== fixture: one list, one report ========================================================== */

static struct kvr_event_list list;
static struct kvr_event_json_error errs[16];
static struct kvr_event_json_report rep;

static void setup(void)
{
    kvr_event_list_init(&list);
    memset(&rep, 0, sizeof(rep));
    rep.errors = errs;
    rep.cap = sizeof(errs) / sizeof(errs[0]);
}

static void teardown(void)
{
    kvr_event_list_free(&list);
}

static int body(const char *text)
{
    kvr_event_list_reset(&list);
    return kvr_event_json_decode_body(text, strlen(text), &list, &rep);
}

/* Decodes a body that must hold exactly one good event; returns it. */
static const struct kvr_event *one(const char *text)
{
    int rc = body(text);
    ck_assert_msg(rc == KVR_OK && rep.decoded == 1 && rep.failed == 0,
                  "<%s>: rc %d decoded %zu failed %zu: %s", text, rc, rep.decoded, rep.failed,
                  rep.n_errors ? errs[0].msg : "");
    ck_assert_uint_eq(list.n, 1);
    return &list.ev[0];
}

/* Decodes a body holding exactly one event, which must be rejected with this code and message. */
static void rejected(const char *text, int code, const char *msg)
{
    int rc = body(text);
    ck_assert_msg(rc == KVR_OK, "<%s>: rc %d", text, rc);
    ck_assert_msg(rep.failed == 1 && rep.decoded == 0 && rep.n_errors == 1,
                  "<%s>: decoded %zu failed %zu", text, rep.decoded, rep.failed);
    ck_assert_uint_eq(list.n, 0);
    ck_assert_int_eq(errs[0].code, code);
    ck_assert_uint_eq(errs[0].index, 0);
    ck_assert_str_eq(errs[0].msg, msg);
}

/* A stored event with one block, fields substituted by printf. */
#define STORED1(bh, th)                                                                            \
    "{\"worker_id\":1,\"event\":{\"event_id\":2,\"data\":{\"stored\":{\"parent_hash\":null,"       \
    "\"blocks\":[{\"block_hash\":" bh ",\"tokens_hash\":" th "}]}}}}"

/* ==== spec examples ========================================================================== */

static const char ex_stored[] =
    "{\"worker_id\": 7, \"storage_tier\": \"device\", \"residency_domain\": \"worker\",\n"
    " \"event\": {\"event_id\": 42, \"dp_rank\": 0,\n"
    "   \"data\": {\"stored\": {\"parent_hash\": 9143094415614847814, \"start_position\": null,\n"
    "     \"blocks\": [{\"block_hash\": 9510318385840434533, \"tokens_hash\": "
    "12124091508212882195,\n"
    "                 \"mm_extra_info\": null}]}}}}";
static const char ex_removed[] = "{\"worker_id\": 7, \"event\": {\"event_id\": 43, \"dp_rank\": 0, "
                                 "\"data\": {\"removed\": {\"block_hashes\": "
                                 "[9510318385840434533]}}}}";
static const char ex_cleared[] =
    "{\"worker_id\": 7, \"event\": {\"event_id\": 44, \"dp_rank\": 0, \"data\": \"cleared\"}}";

static void check_ex_stored(const struct kvr_event *e)
{
    ck_assert_int_eq(e->kind, KVR_EVENT_STORED);
    ck_assert_uint_eq(e->worker_id, 7);
    ck_assert_uint_eq(e->event_id, 42);
    ck_assert_uint_eq(e->dp_rank, 0);
    ck_assert_int_eq(e->tier, KVR_TIER_DEVICE);
    ck_assert_int_eq(e->domain, KVR_DOMAIN_WORKER);
    ck_assert_int_eq(e->has_parent, 1);
    ck_assert_uint_eq(e->parent_hash, UINT64_C(9143094415614847814));
    ck_assert_int_eq(e->has_start_position, 0);
    ck_assert_uint_eq(e->n, 1);
    ck_assert_uint_eq(e->blocks[0].block_hash, UINT64_C(9510318385840434533));
    ck_assert_uint_eq(e->blocks[0].tokens_hash, UINT64_C(12124091508212882195));
}

static void check_ex_removed(const struct kvr_event *e)
{
    ck_assert_int_eq(e->kind, KVR_EVENT_REMOVED);
    ck_assert_uint_eq(e->worker_id, 7);
    ck_assert_uint_eq(e->event_id, 43);
    ck_assert_uint_eq(e->n, 1);
    ck_assert_uint_eq(e->hashes[0], UINT64_C(9510318385840434533));
}

static void check_ex_cleared(const struct kvr_event *e)
{
    ck_assert_int_eq(e->kind, KVR_EVENT_CLEARED);
    ck_assert_uint_eq(e->worker_id, 7);
    ck_assert_uint_eq(e->event_id, 44);
    ck_assert_uint_eq(e->n, 0);
}

START_TEST(spec_examples_single)
{
    check_ex_stored(one(ex_stored)); /* a single object spanning several lines */
    check_ex_removed(one(ex_removed));
    check_ex_cleared(one(ex_cleared));
}
END_TEST

START_TEST(spec_examples_bodies)
{
    char text[2048];
    /* newline-delimited (the spec example has the stored event on one line) */
    char flat[1024];
    size_t o = 0;
    for (const char *c = ex_stored; *c; c++)
        if (*c != '\n')
            flat[o++] = *c;
    flat[o] = '\0';
    snprintf(text, sizeof(text), "%s\n%s\r\n\n  \n%s\n", flat, ex_removed, ex_cleared);
    ck_assert_int_eq(body(text), KVR_OK);
    ck_assert_uint_eq(rep.events, 3);
    ck_assert_uint_eq(rep.decoded, 3);
    ck_assert_uint_eq(list.n, 3);
    check_ex_stored(&list.ev[0]);
    check_ex_removed(&list.ev[1]);
    check_ex_cleared(&list.ev[2]);
    /* array */
    snprintf(text, sizeof(text), " [ %s ,\n%s,%s ] ", ex_stored, ex_removed, ex_cleared);
    ck_assert_int_eq(body(text), KVR_OK);
    ck_assert_uint_eq(rep.decoded, 3);
    check_ex_stored(&list.ev[0]);
    check_ex_removed(&list.ev[1]);
    check_ex_cleared(&list.ev[2]);
    /* empty array */
    ck_assert_int_eq(body("[]"), KVR_OK);
    ck_assert_uint_eq(rep.events, 0);
    ck_assert_uint_eq(list.n, 0);
}
END_TEST

/* ==== u64 rules ============================================================================== */

START_TEST(u64_boundaries)
{
    const struct kvr_event *e;
    e = one(STORED1("9223372036854775808", "18446744073709551615"));
    ck_assert_uint_eq(e->blocks[0].block_hash, UINT64_C(1) << 63);
    ck_assert_uint_eq(e->blocks[0].tokens_hash, UINT64_MAX);
    e = one(STORED1("16045690984503111693", "-2"));
    ck_assert_uint_eq(e->blocks[0].block_hash, UINT64_C(0xDEADBEEFCAFEF00D));
    ck_assert_uint_eq(e->blocks[0].tokens_hash, UINT64_C(18446744073709551614));
    e = one(STORED1("-9223372036854775808", "0"));
    ck_assert_uint_eq(e->blocks[0].block_hash, UINT64_C(1) << 63);
    ck_assert_uint_eq(e->blocks[0].tokens_hash, 0);
    e = one("{\"worker_id\":18446744073709551615,\"event\":{\"event_id\":18446744073709551615,"
            "\"dp_rank\":4294967295,\"data\":{\"removed\":{\"block_hashes\":[-1,"
            "18446744073709551615,-3488128144981237669]}}}}");
    ck_assert_uint_eq(e->worker_id, UINT64_MAX);
    ck_assert_uint_eq(e->event_id, UINT64_MAX);
    ck_assert_uint_eq(e->dp_rank, UINT32_MAX);
    ck_assert_uint_eq(e->hashes[0], UINT64_MAX);
    ck_assert_uint_eq(e->hashes[1], UINT64_MAX);
    ck_assert_uint_eq(e->hashes[2], UINT64_C(14958615928728313947));
    e = one("{\"worker_id\":0,\"event\":{\"event_id\":0,\"data\":{\"stored\":{\"parent_hash\":"
            "-9223372036854775807,\"blocks\":[]}}}}");
    ck_assert_uint_eq(e->parent_hash, (UINT64_C(1) << 63) + 1);
    ck_assert_uint_eq(e->n, 0);
}
END_TEST

START_TEST(u64_rejects)
{
    rejected(STORED1("18446744073709551616", "1"), KVR_ECORRUPT,
             "event 0: event.data.stored.blocks[0].block_hash: expected an unsigned 64-bit "
             "integer, got 18446744073709551616 (out of range)");
    rejected(STORED1("1", "-9223372036854775809"), KVR_ECORRUPT,
             "event 0: event.data.stored.blocks[0].tokens_hash: expected an unsigned 64-bit "
             "integer, got -9223372036854775809 (out of range)");
    rejected(STORED1("1.0", "1"), KVR_ECORRUPT,
             "event 0: event.data.stored.blocks[0].block_hash: expected an unsigned 64-bit "
             "integer, got 1.0");
    rejected(STORED1("1", "1e5"), KVR_ECORRUPT,
             "event 0: event.data.stored.blocks[0].tokens_hash: expected an unsigned 64-bit "
             "integer, got 1e5");
    rejected(STORED1("\"1\"", "1"), KVR_ECORRUPT,
             "event 0: event.data.stored.blocks[0].block_hash: expected an unsigned 64-bit "
             "integer, got the string \"1\"");
    rejected("{\"worker_id\":1,\"event\":{\"event_id\":2,\"data\":{\"removed\":{\"block_hashes\":"
             "[1,2,18446744073709551616]}}}}",
             KVR_ECORRUPT,
             "event 0: event.data.removed.block_hashes[2]: expected an unsigned 64-bit integer, "
             "got 18446744073709551616 (out of range)");
    rejected("{\"worker_id\":1,\"event\":{\"event_id\":2,\"data\":{\"stored\":{\"parent_hash\":"
             "1e5,\"blocks\":[]}}}}",
             KVR_ECORRUPT,
             "event 0: event.data.stored.parent_hash: expected an unsigned 64-bit integer, got "
             "1e5");
}
END_TEST

START_TEST(non_hash_integers)
{
    rejected("{\"worker_id\":-1,\"event\":{\"event_id\":2,\"data\":\"cleared\"}}", KVR_ECORRUPT,
             "event 0: worker_id: expected an unsigned 64-bit integer, got -1");
    rejected("{\"worker_id\":1,\"event\":{\"event_id\":-5,\"data\":\"cleared\"}}", KVR_ECORRUPT,
             "event 0: event.event_id: expected an unsigned 64-bit integer, got -5");
    rejected("{\"worker_id\":1,\"event\":{\"event_id\":5,\"dp_rank\":-1,\"data\":\"cleared\"}}",
             KVR_ECORRUPT, "event 0: event.dp_rank: expected an unsigned 32-bit integer, got -1");
    rejected("{\"worker_id\":1,\"event\":{\"event_id\":5,\"dp_rank\":4294967296,\"data\":"
             "\"cleared\"}}",
             KVR_ECORRUPT,
             "event 0: event.dp_rank: expected an unsigned 32-bit integer, got 4294967296");
    rejected("{\"worker_id\":1,\"event\":{\"event_id\":5,\"dp_rank\":null,\"data\":\"cleared\"}}",
             KVR_ECORRUPT, "event 0: event.dp_rank: expected an unsigned 32-bit integer, got null");
    rejected("{\"worker_id\":1.5,\"event\":{\"event_id\":5,\"data\":\"cleared\"}}", KVR_ECORRUPT,
             "event 0: worker_id: expected an unsigned 64-bit integer, got 1.5");
    rejected("{\"worker_id\":18446744073709551616,\"event\":{\"event_id\":5,\"data\":"
             "\"cleared\"}}",
             KVR_ECORRUPT,
             "event 0: worker_id: expected an unsigned 64-bit integer, got "
             "18446744073709551616 (out of range)");
    rejected("{\"event\":{\"event_id\":5,\"data\":\"cleared\"}}", KVR_ECORRUPT,
             "event 0: worker_id: missing");
    rejected("{\"worker_id\":1}", KVR_ECORRUPT, "event 0: event: missing");
    rejected("{\"worker_id\":1,\"event\":{\"data\":\"cleared\"}}", KVR_ECORRUPT,
             "event 0: event.event_id: missing");
    rejected("{\"worker_id\":1,\"event\":{\"event_id\":1}}", KVR_ECORRUPT,
             "event 0: event.data: missing");
    rejected("{\"worker_id\":1,\"event\":[]}", KVR_ECORRUPT,
             "event 0: event: expected an object, got an array");
}
END_TEST

/* ==== shapes and field rules ================================================================= */

START_TEST(three_shapes)
{
    const struct kvr_event *e;
    /* 1: oldest */
    e = one("{\"worker_id\":3,\"event\":{\"event_id\":1,\"dp_rank\":2,\"data\":\"cleared\"}}");
    ck_assert_int_eq(e->tier, KVR_TIER_DEVICE);
    ck_assert_int_eq(e->domain, KVR_DOMAIN_WORKER);
    ck_assert_uint_eq(e->dp_rank, 2);
    /* 2: with storage_tier */
    e = one("{\"worker_id\":3,\"storage_tier\":\"host_pinned\",\"event\":{\"event_id\":1,"
            "\"data\":\"cleared\"}}");
    ck_assert_int_eq(e->tier, KVR_TIER_HOST_PINNED);
    ck_assert_uint_eq(e->dp_rank, 0); /* default */
    /* 3: residency_domain and state_source (ignored, whatever it holds, even an overflow) */
    e = one("{\"worker_id\":3,\"storage_tier\":\"disk\",\"residency_domain\":\"cache_owner\","
            "\"event\":{\"event_id\":1,\"data\":\"cleared\"},\"state_source\":{\"x\":"
            "[99999999999999999999999,1.5,\"s\"]}}");
    ck_assert_int_eq(e->tier, KVR_TIER_DISK);
    ck_assert_int_eq(e->domain, KVR_DOMAIN_CACHE_OWNER);
    e = one("{\"event\":{\"data\":\"cleared\",\"event_id\":9},\"storage_tier\":\"external\","
            "\"worker_id\":3}"); /* member order does not matter */
    ck_assert_int_eq(e->tier, KVR_TIER_EXTERNAL);
    ck_assert_uint_eq(e->event_id, 9);
}
END_TEST

START_TEST(storage_tier_rules)
{
    rejected("{\"worker_id\":3,\"storage_tier\":\"gpu\",\"event\":{\"event_id\":1,\"data\":"
             "\"cleared\"}}",
             KVR_ECORRUPT,
             "event 0: storage_tier: expected \"device\", \"host_pinned\", \"disk\" or "
             "\"external\", got the string \"gpu\"");
    rejected("{\"worker_id\":3,\"storage_tier\":null,\"event\":{\"event_id\":1,\"data\":"
             "\"cleared\"}}",
             KVR_ECORRUPT,
             "event 0: storage_tier: expected \"device\", \"host_pinned\", \"disk\" or "
             "\"external\", got null");
    rejected("{\"worker_id\":3,\"storage_tier\":\"Device\",\"event\":{\"event_id\":1,\"data\":"
             "\"cleared\"}}",
             KVR_ECORRUPT,
             "event 0: storage_tier: expected \"device\", \"host_pinned\", \"disk\" or "
             "\"external\", got the string \"Device\"");
}
END_TEST

START_TEST(residency_domain_rules)
{
    rejected("{\"worker_id\":3,\"residency_domain\":null,\"event\":{\"event_id\":1,\"data\":"
             "\"cleared\"}}",
             KVR_EDOMAIN,
             "event 0: residency_domain: expected \"worker\" or \"cache_owner\", got null");
    rejected("{\"worker_id\":3,\"residency_domain\":\"tenant\",\"event\":{\"event_id\":1,"
             "\"data\":\"cleared\"}}",
             KVR_EDOMAIN,
             "event 0: residency_domain: expected \"worker\" or \"cache_owner\", got the string "
             "\"tenant\"");
    rejected("{\"worker_id\":3,\"residency_domain\":1,\"event\":{\"event_id\":1,\"data\":"
             "\"cleared\"}}",
             KVR_EDOMAIN,
             "event 0: residency_domain: expected \"worker\" or \"cache_owner\", got 1");
    ck_assert_int_eq(one("{\"worker_id\":3,\"residency_domain\":\"worker\",\"event\":{"
                         "\"event_id\":1,\"data\":\"cleared\"}}")
                         ->domain,
                     KVR_DOMAIN_WORKER);
}
END_TEST

START_TEST(cleared_forms)
{
    ck_assert_int_eq(
        one("{\"worker_id\":3,\"event\":{\"event_id\":1,\"data\":{\"cleared\":null}}}")->kind,
        KVR_EVENT_CLEARED);
    rejected("{\"worker_id\":3,\"event\":{\"event_id\":1,\"data\":{\"cleared\":1}}}", KVR_ECORRUPT,
             "event 0: event.data.cleared: expected null, got 1");
    rejected("{\"worker_id\":3,\"event\":{\"event_id\":1,\"data\":\"Cleared\"}}", KVR_ECORRUPT,
             "event 0: event.data: expected \"cleared\", {\"stored\": {...}} or {\"removed\": "
             "{...}}, got the string \"Cleared\"");
    rejected("{\"worker_id\":3,\"event\":{\"event_id\":1,\"data\":\"stored\"}}", KVR_ECORRUPT,
             "event 0: event.data: expected \"cleared\", {\"stored\": {...}} or {\"removed\": "
             "{...}}, got the string \"stored\"");
    rejected("{\"worker_id\":3,\"event\":{\"event_id\":1,\"data\":{}}}", KVR_ECORRUPT,
             "event 0: event.data: expected \"cleared\", {\"stored\": {...}} or {\"removed\": "
             "{...}}, got an object");
    rejected("{\"worker_id\":3,\"event\":{\"event_id\":1,\"data\":{\"stored\":{\"blocks\":[]},"
             "\"removed\":{\"block_hashes\":[]}}}}",
             KVR_ECORRUPT,
             "event 0: event.data: expected \"cleared\", {\"stored\": {...}} or {\"removed\": "
             "{...}}, got an object");
    rejected("{\"worker_id\":3,\"event\":{\"event_id\":1,\"data\":{\"evicted\":{}}}}", KVR_ECORRUPT,
             "event 0: event.data: expected \"cleared\", {\"stored\": {...}} or {\"removed\": "
             "{...}}, got an object");
    rejected("{\"worker_id\":3,\"event\":{\"event_id\":1,\"data\":null}}", KVR_ECORRUPT,
             "event 0: event.data: expected \"cleared\", {\"stored\": {...}} or {\"removed\": "
             "{...}}, got null");
}
END_TEST

#define STORED_WITH(inner)                                                                         \
    "{\"worker_id\":1,\"event\":{\"event_id\":2,\"data\":{\"stored\":{" inner "}}}}"

START_TEST(stored_optional_fields)
{
    const struct kvr_event *e;
    e = one(STORED_WITH("\"blocks\":[{\"block_hash\":5,\"tokens_hash\":6}]"));
    ck_assert_int_eq(e->has_parent, 0);
    ck_assert_int_eq(e->has_start_position, 0);
    e = one(STORED_WITH("\"parent_hash\":null,\"start_position\":null,\"blocks\":[]"));
    ck_assert_int_eq(e->has_parent, 0);
    ck_assert_int_eq(e->has_start_position, 0);
    e = one(STORED_WITH("\"parent_hash\":0,\"start_position\":4294967295,\"blocks\":[]"));
    ck_assert_int_eq(e->has_parent, 1);
    ck_assert_uint_eq(e->parent_hash, 0);
    ck_assert_int_eq(e->has_start_position, 1);
    ck_assert_uint_eq(e->start_position, UINT32_MAX);
    rejected(STORED_WITH("\"start_position\":-1,\"blocks\":[]"), KVR_ECORRUPT,
             "event 0: event.data.stored.start_position: expected an unsigned 32-bit integer, "
             "got -1");
    rejected(STORED_WITH("\"start_position\":4294967296,\"blocks\":[]"), KVR_ECORRUPT,
             "event 0: event.data.stored.start_position: expected an unsigned 32-bit integer, "
             "got 4294967296");
    rejected(STORED_WITH("\"parent_hash\":null"), KVR_ECORRUPT,
             "event 0: event.data.stored.blocks: missing");
    rejected(STORED_WITH("\"blocks\":{}"), KVR_ECORRUPT,
             "event 0: event.data.stored.blocks: expected an array, got an object");
    rejected(STORED_WITH("\"blocks\":[{\"block_hash\":5,\"tokens_hash\":6},7]"), KVR_ECORRUPT,
             "event 0: event.data.stored.blocks[1]: expected a block object, got 7");
    rejected(STORED_WITH("\"blocks\":[{\"block_hash\":5}]"), KVR_ECORRUPT,
             "event 0: event.data.stored.blocks[0].tokens_hash: missing");
    rejected("{\"worker_id\":1,\"event\":{\"event_id\":2,\"data\":{\"removed\":{}}}}", KVR_ECORRUPT,
             "event 0: event.data.removed.block_hashes: missing");
    rejected("{\"worker_id\":1,\"event\":{\"event_id\":2,\"data\":{\"removed\":[1]}}}",
             KVR_ECORRUPT, "event 0: event.data.removed: expected an object, got an array");
}
END_TEST

START_TEST(mm_extra_info_rules)
{
    const struct kvr_event *e;
    e = one(STORED_WITH("\"blocks\":[{\"block_hash\":5,\"tokens_hash\":6,\"mm_extra_info\":"
                        "null},{\"block_hash\":7,\"tokens_hash\":8,\"mm_extra_info\":{"
                        "\"mm_objects\":[{\"mm_hash\":18446744073709551615,\"offsets\":[[0,3],"
                        "[10,12]]},{\"mm_hash\":-4,\"offsets\":[],\"extra\":1}]}}]"));
    ck_assert_uint_eq(e->n, 2);
    ck_assert_uint_eq(e->blocks[1].block_hash, 7);
    ck_assert_uint_eq(e->blocks[1].tokens_hash, 8);
    e = one(STORED_WITH("\"blocks\":[{\"block_hash\":5,\"tokens_hash\":6,\"mm_extra_info\":{"
                        "\"mm_objects\":[]}}]"));
    ck_assert_uint_eq(e->n, 1);

    static const struct {
        const char *mm;
        const char *msg;
    } bad[] = {
        {"5", "blocks[0].mm_extra_info: expected null or an object, got 5"},
        {"{}", "blocks[0].mm_extra_info.mm_objects: missing"},
        {"{\"mm_objects\":5}", "blocks[0].mm_extra_info.mm_objects: expected an array, got 5"},
        {"{\"mm_objects\":[1]}",
         "blocks[0].mm_extra_info.mm_objects[0]: expected an object, got 1"},
        {"{\"mm_objects\":[{\"offsets\":[]}]}",
         "blocks[0].mm_extra_info.mm_objects[0].mm_hash: missing"},
        {"{\"mm_objects\":[{\"mm_hash\":1.5,\"offsets\":[]}]}",
         "blocks[0].mm_extra_info.mm_objects[0].mm_hash: expected an unsigned 64-bit integer, "
         "got 1.5"},
        {"{\"mm_objects\":[{\"mm_hash\":1}]}",
         "blocks[0].mm_extra_info.mm_objects[0].offsets: missing"},
        {"{\"mm_objects\":[{\"mm_hash\":1,\"offsets\":[[1]]}]}",
         "blocks[0].mm_extra_info.mm_objects[0].offsets[0]: expected a [start, end] pair, got "
         "an array"},
        {"{\"mm_objects\":[{\"mm_hash\":1,\"offsets\":[[1,2],[1,2,3]]}]}",
         "blocks[0].mm_extra_info.mm_objects[0].offsets[1]: expected a [start, end] pair, got "
         "an array"},
        {"{\"mm_objects\":[{\"mm_hash\":1,\"offsets\":[[1,-2]]}]}",
         "blocks[0].mm_extra_info.mm_objects[0].offsets[0][1]: expected an unsigned 64-bit "
         "integer, got -2"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        char text[512], msg[512];
        snprintf(text, sizeof(text),
                 STORED_WITH("\"blocks\":[{\"block_hash\":5,\"tokens_hash\":6,"
                             "\"mm_extra_info\":%s}]"),
                 bad[i].mm);
        snprintf(msg, sizeof(msg), "event 0: event.data.stored.%s", bad[i].msg);
        rejected(text, KVR_ECORRUPT, msg);
    }
}
END_TEST

START_TEST(unknown_members_ignored)
{
    const struct kvr_event *e =
        one("{\"x\":1,\"worker_id\":4,\"event\":{\"y\":[1,2],\"event_id\":5,\"dp_rank\":1,"
            "\"data\":{\"stored\":{\"z\":null,\"parent_hash\":7,\"blocks\":[{\"block_hash\":8,"
            "\"w\":{\"q\":1e400},\"tokens_hash\":9}]}}},\"v\":\"s\"}");
    ck_assert_uint_eq(e->worker_id, 4);
    ck_assert_uint_eq(e->event_id, 5);
    ck_assert_uint_eq(e->dp_rank, 1);
    ck_assert_uint_eq(e->parent_hash, 7);
    ck_assert_uint_eq(e->blocks[0].block_hash, 8);
    ck_assert_uint_eq(e->blocks[0].tokens_hash, 9);
    e = one("{\"worker_id\":4,\"event\":{\"event_id\":5,\"data\":{\"removed\":{\"u\":1,"
            "\"block_hashes\":[3]}}}}");
    ck_assert_uint_eq(e->hashes[0], 3);
}
END_TEST

/* ==== bodies and error reporting ============================================================= */

START_TEST(bad_event_does_not_stop_others)
{
    const char *text =
        "["
        "{\"worker_id\":1,\"event\":{\"event_id\":0,\"data\":\"cleared\"}},"
        "{\"worker_id\":1,\"event\":{\"event_id\":1,\"data\":{\"removed\":{\"block_hashes\":[1]}}}}"
        ","
        "{\"worker_id\":-1,\"event\":{\"event_id\":2,\"data\":\"cleared\"}},"
        "{\"worker_id\":1,\"event\":{\"event_id\":3,\"data\":{\"stored\":{\"parent_hash\":null,"
        "\"blocks\":[{\"block_hash\":1,\"tokens_hash\":2},{\"block_hash\":3,\"tokens_hash\":4},"
        "{\"block_hash\":-1.5,\"tokens_hash\":6}]}}}},"
        "{\"worker_id\":1,\"event\":{\"event_id\":4,\"data\":{\"stored\":{\"parent_hash\":3,"
        "\"blocks\":[{\"block_hash\":5,\"tokens_hash\":6}]}}}},"
        "7"
        "]";
    ck_assert_int_eq(body(text), KVR_OK);
    ck_assert_uint_eq(rep.events, 6);
    ck_assert_uint_eq(rep.decoded, 3);
    ck_assert_uint_eq(rep.failed, 3);
    ck_assert_uint_eq(rep.n_errors, 3);
    ck_assert_uint_eq(list.n, 3);
    ck_assert_uint_eq(list.ev[0].event_id, 0);
    ck_assert_uint_eq(list.ev[1].event_id, 1);
    ck_assert_uint_eq(list.ev[2].event_id, 4);
    ck_assert_uint_eq(list.ev[2].blocks[0].block_hash, 5); /* the popped event left no trace */
    ck_assert_uint_eq(errs[0].index, 2);
    ck_assert_str_eq(errs[0].msg,
                     "event 2: worker_id: expected an unsigned 64-bit integer, got -1");
    ck_assert_uint_eq(errs[1].index, 3);
    ck_assert_str_eq(errs[1].msg, "event 3: event.data.stored.blocks[2].block_hash: expected an "
                                  "unsigned 64-bit integer, got -1.5");
    ck_assert_uint_eq(errs[1].offset, (size_t)(strstr(text, "{\"worker_id\":1,\"event\":{\"event_"
                                                            "id\":3") -
                                               text));
    ck_assert_uint_eq(errs[2].index, 5);
    ck_assert_str_eq(errs[2].msg, "event 5: expected a RouterEvent object, got a number");
}
END_TEST

START_TEST(line_delimited_broken_line)
{
    const char *text = "{\"worker_id\":1,\"event\":{\"event_id\":0,\"data\":\"cleared\"}}\n"
                       "{\"worker_id\":1,\"event\":{\"event_id\":1,\"data\":\"cleared\"}\n"
                       "\n"
                       "{\"worker_id\":1,\"event\":{\"event_id\":2,\"data\":\"cleared\"}} x\n"
                       "{\"worker_id\":1,\"event\":{\"event_id\":3,\"data\":\"cleared\"}}";
    ck_assert_int_eq(body(text), KVR_OK);
    ck_assert_uint_eq(rep.events, 4);
    ck_assert_uint_eq(rep.decoded, 2);
    ck_assert_uint_eq(list.ev[0].event_id, 0);
    ck_assert_uint_eq(list.ev[1].event_id, 3);
    ck_assert_uint_eq(rep.n_errors, 2);
    size_t line1 = (size_t)(strchr(text, '\n') - text) + 1;
    size_t line1_end = (size_t)(strchr(text + line1, '\n') - text);
    ck_assert_uint_eq(errs[0].index, 1);
    ck_assert_uint_eq(errs[0].offset, line1_end); /* the end of the line: '}' missing */
    char want[128];
    snprintf(want, sizeof(want), "event 1: not valid JSON at byte %zu: unexpected end of input",
             line1_end);
    ck_assert_str_eq(errs[0].msg, want);
    ck_assert_uint_eq(errs[1].index, 2);
    ck_assert(strstr(errs[1].msg, "unexpected data after the JSON value") != NULL);

    /* the FIRST line broken: still read line by line */
    const char *first_bad = "{\"worker_id\":1,\n"
                            "{\"worker_id\":1,\"event\":{\"event_id\":3,\"data\":\"cleared\"}}\n";
    ck_assert_int_eq(body(first_bad), KVR_OK);
    ck_assert_uint_eq(rep.events, 2);
    ck_assert_uint_eq(rep.decoded, 1);
    ck_assert_uint_eq(errs[0].index, 0);
}
END_TEST

START_TEST(body_not_json)
{
    ck_assert_int_eq(body("hello"), KVR_ECORRUPT);
    ck_assert_uint_eq(rep.n_errors, 1);
    ck_assert_uint_eq(errs[0].index, KVR_EVENT_JSON_BODY);
    ck_assert_uint_eq(errs[0].offset, 0);
    ck_assert_str_eq(errs[0].msg, "body: not valid JSON at byte 0: unexpected character");
    ck_assert_uint_eq(list.n, 0);

    ck_assert_int_eq(body(""), KVR_ECORRUPT);
    ck_assert_str_eq(errs[0].msg, "body: empty");
    ck_assert_int_eq(body(" \n "), KVR_ECORRUPT);

    /* a broken array: one error at the byte, nothing decoded, even the good first element */
    const char *arr =
        "[{\"worker_id\":1,\"event\":{\"event_id\":0,\"data\":\"cleared\"}}, {\"a\":}]";
    ck_assert_int_eq(body(arr), KVR_ECORRUPT);
    ck_assert_uint_eq(rep.n_errors, 1);
    ck_assert_uint_eq(errs[0].index, KVR_EVENT_JSON_BODY);
    ck_assert_uint_eq(errs[0].offset, strlen(arr) - 2);
    ck_assert_uint_eq(list.n, 0);
    ck_assert_uint_eq(rep.decoded, 0);

    /* a pretty-printed object with a syntax error: one body error, not one per line */
    const char *pretty = "{\n  \"worker_id\": 1,\n  \"event\": {\"event_id\": 0,,}\n}\n";
    ck_assert_int_eq(body(pretty), KVR_ECORRUPT);
    ck_assert_uint_eq(rep.n_errors, 1);
    ck_assert_uint_eq(errs[0].index, KVR_EVENT_JSON_BODY);
    ck_assert_uint_eq(errs[0].offset, (size_t)(strstr(pretty, ",,") - pretty) + 1);

    /* valid JSON of the wrong kind */
    ck_assert_int_eq(body("5"), KVR_ECORRUPT);
    ck_assert_str_eq(errs[0].msg, "body: expected a RouterEvent object, an array of them or one "
                                  "per line, got a number");
    ck_assert_int_eq(body("\"cleared\""), KVR_ECORRUPT);
    /* json-c leniencies refused by the scan */
    ck_assert_int_eq(body("[{'worker_id':1}]"), KVR_ECORRUPT);
    ck_assert_int_eq(body("[{\"worker_id\":01}]"), KVR_ECORRUPT);
}
END_TEST

START_TEST(errors_beyond_capacity_counted)
{
    char text[8192];
    size_t o = 0;
    o += (size_t)snprintf(text + o, sizeof(text) - o, "[");
    for (int i = 0; i < 40; i++)
        o += (size_t)snprintf(text + o, sizeof(text) - o, "%s{\"worker_id\":%d}", i ? "," : "", i);
    snprintf(text + o, sizeof(text) - o, "]");
    ck_assert_int_eq(body(text), KVR_OK);
    ck_assert_uint_eq(rep.events, 40);
    ck_assert_uint_eq(rep.failed, 40);
    ck_assert_uint_eq(rep.n_errors, rep.cap);
    ck_assert_str_eq(errs[15].msg, "event 15: event: missing");
    /* no error array at all */
    struct kvr_event_json_report r = {NULL, 0, 0, 0, 0, 0};
    ck_assert_int_eq(kvr_event_json_decode_body(text, strlen(text), &list, &r), KVR_OK);
    ck_assert_uint_eq(r.failed, 40);
    ck_assert_uint_eq(r.n_errors, 0);
}
END_TEST

START_TEST(deep_nesting_in_ignored_member)
{
    /* the event object + "x" array nesting = KVR_JSON_MAX_DEPTH levels: accepted */
    char text[512];
    size_t o = 0;
    int levels = KVR_JSON_MAX_DEPTH - 1;
    o += (size_t)snprintf(text + o, sizeof(text) - o, "{\"worker_id\":1,\"x\":");
    for (int i = 0; i < levels; i++)
        text[o++] = '[';
    for (int i = 0; i < levels; i++)
        text[o++] = ']';
    snprintf(text + o, sizeof(text) - o, ",\"event\":{\"event_id\":0,\"data\":\"cleared\"}}");
    ck_assert_int_eq(one(text)->kind, KVR_EVENT_CLEARED);
}
END_TEST

/* kvr_event_json_decode with a base path, as the op-stream loader uses it. */
START_TEST(decode_at_path)
{
    const char *text =
        "{\"event\":{\"worker_id\":1,\"event\":{\"event_id\":2,\"data\":{\"removed\":"
        "{\"block_hashes\":[18446744073709551616]}}}}}";
    struct kvr_json_scan s;
    kvr_json_scan_init(&s, NULL);
    ck_assert_int_eq(kvr_json_scan(&s, text, strlen(text), 0), KVR_OK);
    struct json_object *o = json_tokener_parse(text), *ev = NULL;
    ck_assert(json_object_object_get_ex(o, "event", &ev));
    struct kvr_json_path at = {NULL, "event", 0};
    char err[KVR_EVENT_JSON_MSG];
    ck_assert_int_eq(kvr_event_json_decode(ev, &s, &at, &list, err, sizeof(err)), KVR_ECORRUPT);
    ck_assert_str_eq(err, "event.event.data.removed.block_hashes[0]: expected an unsigned 64-bit "
                          "integer, got 18446744073709551616 (out of range)");
    ck_assert_uint_eq(list.n, 0);
    /* without the scan the clamp cannot be seen: that is why callers must pass it */
    ck_assert_int_eq(kvr_event_json_decode(ev, NULL, &at, &list, err, sizeof(err)), KVR_OK);
    ck_assert_uint_eq(list.ev[0].hashes[0], UINT64_MAX);
    json_object_put(o);
    kvr_json_scan_free(&s);
}
END_TEST

/* ==== encoding =============================================================================== */

START_TEST(encode_exact_text)
{
    ck_assert_int_eq(body(ex_stored), KVR_OK);
    struct kvr_buf b;
    kvr_buf_init(&b, NULL);
    ck_assert_int_eq(kvr_event_json_encode(&list.ev[0], &b), KVR_OK);
    ck_assert_str_eq(kvr_buf_cstr(&b),
                     "{\"worker_id\":7,\"storage_tier\":\"device\",\"event\":{\"event_id\":42,"
                     "\"dp_rank\":0,\"data\":{\"stored\":{\"parent_hash\":9143094415614847814,"
                     "\"start_position\":null,\"blocks\":[{\"block_hash\":9510318385840434533,"
                     "\"tokens_hash\":12124091508212882195,\"mm_extra_info\":null}]}}}}");
    kvr_buf_reset(&b);
    ck_assert_int_eq(body("{\"worker_id\":18446744073709551615,\"storage_tier\":\"disk\","
                          "\"residency_domain\":\"cache_owner\",\"event\":{\"event_id\":1,"
                          "\"dp_rank\":4294967295,\"data\":{\"removed\":{\"block_hashes\":[-2,0]}}}"
                          "}"),
                     KVR_OK);
    ck_assert_int_eq(kvr_event_json_encode(&list.ev[0], &b), KVR_OK);
    ck_assert_str_eq(kvr_buf_cstr(&b),
                     "{\"worker_id\":18446744073709551615,\"storage_tier\":\"disk\","
                     "\"residency_domain\":\"cache_owner\",\"event\":{\"event_id\":1,\"dp_rank\":"
                     "4294967295,\"data\":{\"removed\":{\"block_hashes\":[18446744073709551614,0]}"
                     "}}}");
    kvr_buf_reset(&b);
    ck_assert_int_eq(body(ex_cleared), KVR_OK);
    ck_assert_int_eq(kvr_event_json_encode_array(list.ev, list.n, &b), KVR_OK);
    ck_assert_str_eq(kvr_buf_cstr(&b), "[{\"worker_id\":7,\"storage_tier\":\"device\",\"event\":{"
                                       "\"event_id\":44,\"dp_rank\":0,\"data\":\"cleared\"}}]");
    kvr_buf_reset(&b);
    ck_assert_int_eq(kvr_event_json_encode_array(list.ev, 0, &b), KVR_OK);
    ck_assert_str_eq(kvr_buf_cstr(&b), "[]");
    /* stored with start_position, no parent, no blocks */
    kvr_buf_reset(&b);
    ck_assert_int_eq(body(STORED_WITH("\"start_position\":16,\"blocks\":[]")), KVR_OK);
    ck_assert_int_eq(kvr_event_json_encode(&list.ev[0], &b), KVR_OK);
    ck_assert_str_eq(kvr_buf_cstr(&b), "{\"worker_id\":1,\"storage_tier\":\"device\",\"event\":{"
                                       "\"event_id\":2,\"dp_rank\":0,\"data\":{\"stored\":{"
                                       "\"parent_hash\":null,\"start_position\":16,\"blocks\":[]}}}"
                                       "}");
    kvr_buf_free(&b);
}
END_TEST

START_TEST(encode_invalid)
{
    struct kvr_event ev;
    memset(&ev, 0, sizeof(ev));
    struct kvr_buf b;
    kvr_buf_init(&b, NULL);
    ck_assert_int_eq(kvr_buf_append_str(&b, "keep"), KVR_OK);
    ev.kind = 0;
    ck_assert_int_eq(kvr_event_json_encode(&ev, &b), KVR_EINVAL);
    ev.kind = KVR_EVENT_CLEARED;
    ev.tier = 9;
    ck_assert_int_eq(kvr_event_json_encode(&ev, &b), KVR_EINVAL);
    ev.tier = 0;
    ev.domain = 5;
    ck_assert_int_eq(kvr_event_json_encode(&ev, &b), KVR_EINVAL);
    ev.domain = 0;
    ev.kind = KVR_EVENT_STORED;
    ev.n = 3; /* blocks NULL */
    ck_assert_int_eq(kvr_event_json_encode(&ev, &b), KVR_EINVAL);
    struct kvr_event two[2] = {ev, ev};
    two[0].kind = KVR_EVENT_CLEARED;
    ck_assert_int_eq(kvr_event_json_encode_array(two, 2, &b), KVR_EINVAL);
    ck_assert_str_eq(kvr_buf_cstr(&b), "keep"); /* rolled back, the first event too */
    kvr_buf_free(&b);
}
END_TEST

/* Fills the list with n random events. */
static void random_events(struct kvr_event_list *l, uint64_t *s, size_t n)
{
    static const uint64_t edges[] = {0,
                                     1,
                                     UINT64_C(9007199254740993),
                                     UINT64_C(1) << 63,
                                     UINT64_C(0xDEADBEEFCAFEF00D),
                                     UINT64_MAX - 1,
                                     UINT64_MAX};
    for (size_t i = 0; i < n; i++) {
        int kind = 1 + (int)(rng_next(s) % 3);
        uint32_t cnt = kind == KVR_EVENT_CLEARED ? 0 : (uint32_t)(rng_next(s) % 40);
        struct kvr_event *ev;
        ck_assert_int_eq(kvr_event_list_emplace(l, kind, cnt, &ev), KVR_OK);
#define RAND_U64() ((rng_next(s) & 3) == 0 ? edges[rng_next(s) % 7] : rng_next(s))
        ev->worker_id = RAND_U64();
        ev->event_id = RAND_U64();
        ev->dp_rank = (uint32_t)RAND_U64();
        ev->tier = (uint8_t)(rng_next(s) % KVR_TIER_COUNT_);
        ev->domain = (uint8_t)(rng_next(s) % 2);
        if (kind == KVR_EVENT_STORED) {
            ev->has_parent = (uint8_t)(rng_next(s) & 1);
            ev->parent_hash = ev->has_parent ? RAND_U64() : 0;
            ev->has_start_position = (uint8_t)(rng_next(s) & 1);
            ev->start_position = ev->has_start_position ? (uint32_t)RAND_U64() : 0;
            for (uint32_t k = 0; k < cnt; k++) {
                ev->blocks[k].block_hash = RAND_U64();
                ev->blocks[k].tokens_hash = RAND_U64();
            }
        } else if (kind == KVR_EVENT_REMOVED) {
            for (uint32_t k = 0; k < cnt; k++)
                ev->hashes[k] = RAND_U64();
        }
#undef RAND_U64
    }
}

static void assert_event_eq(const struct kvr_event *a, const struct kvr_event *b, size_t i)
{
    ck_assert_msg(a->kind == b->kind && a->worker_id == b->worker_id &&
                      a->event_id == b->event_id && a->dp_rank == b->dp_rank &&
                      a->tier == b->tier && a->domain == b->domain && a->n == b->n,
                  "event %zu header differs", i);
    if (a->kind == KVR_EVENT_STORED) {
        ck_assert_msg(a->has_parent == b->has_parent && a->parent_hash == b->parent_hash &&
                          a->has_start_position == b->has_start_position &&
                          a->start_position == b->start_position,
                      "event %zu stored header differs", i);
        for (uint32_t k = 0; k < a->n; k++)
            ck_assert_msg(a->blocks[k].block_hash == b->blocks[k].block_hash &&
                              a->blocks[k].tokens_hash == b->blocks[k].tokens_hash,
                          "event %zu block %u differs", i, k);
    } else if (a->kind == KVR_EVENT_REMOVED) {
        for (uint32_t k = 0; k < a->n; k++)
            ck_assert_msg(a->hashes[k] == b->hashes[k], "event %zu hash %u differs", i, k);
    }
}

START_TEST(round_trip_random)
{
    uint64_t seed = test_seed(), s = seed;
    struct kvr_event_list src;
    kvr_event_list_init(&src);
    random_events(&src, &s, 2000);
    struct kvr_buf b;
    kvr_buf_init(&b, NULL);
    for (int form = 0; form < 2; form++) {
        kvr_buf_reset(&b);
        int rc = form == 0 ? kvr_event_json_encode_array(src.ev, src.n, &b)
                           : kvr_event_json_encode_lines(src.ev, src.n, &b);
        ck_assert_int_eq(rc, KVR_OK);
        ck_assert_msg(body(kvr_buf_cstr(&b)) == KVR_OK, "seed %" PRIu64, seed);
        ck_assert_msg(rep.decoded == src.n && rep.failed == 0, "seed %" PRIu64 ": %s", seed,
                      rep.n_errors ? errs[0].msg : "");
        for (size_t i = 0; i < src.n; i++)
            assert_event_eq(&src.ev[i], &list.ev[i], i);
    }
    kvr_buf_free(&b);
    kvr_event_list_free(&src);
}
END_TEST

START_TEST(round_trip_big_event)
{
    /* one stored event of 200k blocks, with every edge value */
    struct kvr_event_list src;
    kvr_event_list_init(&src);
    struct kvr_event *ev;
    uint32_t n = 200000;
    ck_assert_int_eq(kvr_event_list_emplace(&src, KVR_EVENT_STORED, n, &ev), KVR_OK);
    uint64_t s = test_seed();
    ev->worker_id = 3;
    for (uint32_t k = 0; k < n; k++) {
        ev->blocks[k].block_hash = rng_next(&s);
        ev->blocks[k].tokens_hash = k < 64 ? UINT64_MAX >> k : rng_next(&s);
    }
    struct kvr_buf b;
    kvr_buf_init(&b, NULL);
    ck_assert_int_eq(kvr_event_json_encode(ev, &b), KVR_OK);
    ck_assert_int_eq(body(kvr_buf_cstr(&b)), KVR_OK);
    ck_assert_uint_eq(rep.decoded, 1);
    assert_event_eq(ev, &list.ev[0], 0);
    kvr_buf_free(&b);
    kvr_event_list_free(&src);
}
END_TEST

START_TEST(encode_oom)
{
    uint64_t s = test_seed();
    struct kvr_event_list src;
    kvr_event_list_init(&src);
    random_events(&src, &s, 50);
    /* count the allocation calls of a clean run, then fail each in turn */
    kvr_alloc_t a;
    kvr_alloc_init(&a);
    struct kvr_buf b;
    kvr_buf_init(&b, &a);
    ck_assert_int_eq(kvr_event_json_encode_array(src.ev, src.n, &b), KVR_OK);
    char *want = strdup(kvr_buf_cstr(&b));
    uint64_t calls = a.calls;
    kvr_buf_free(&b);
    for (uint64_t fail = 1; fail <= calls; fail++) {
        kvr_alloc_init(&a);
        kvr_buf_init(&b, &a);
        ck_assert_int_eq(kvr_buf_append_str(&b, "x"), KVR_OK);
        kvr_alloc_fail_after(&a, fail);
        int rc = kvr_event_json_encode_array(src.ev, src.n, &b);
        if (a.failures > 0) {
            ck_assert_int_eq(rc, KVR_ENOMEM);
            ck_assert_str_eq(kvr_buf_cstr(&b), "x");
        } else {
            ck_assert_int_eq(rc, KVR_OK);
            ck_assert_str_eq(kvr_buf_cstr(&b) + 1, want);
        }
        kvr_buf_free(&b);
        ck_assert_uint_eq(a.live_bytes, 0);
    }
    free(want);
    kvr_event_list_free(&src);
}
END_TEST

Suite *event_json_suite(void); /* called by check_main.c */

Suite *event_json_suite(void)
{
    Suite *s = suite_create("event_json");
    TCase *api = tcase_create("api");
    tcase_add_checked_fixture(api, setup, teardown);
    tcase_add_test(api, spec_examples_single);
    tcase_add_test(api, spec_examples_bodies);
    tcase_add_test(api, three_shapes);
    tcase_add_test(api, cleared_forms);
    tcase_add_test(api, stored_optional_fields);
    tcase_add_test(api, unknown_members_ignored);
    tcase_add_test(api, bad_event_does_not_stop_others);
    tcase_add_test(api, line_delimited_broken_line);
    tcase_add_test(api, decode_at_path);
    tcase_add_test(api, encode_exact_text);
    suite_add_tcase(s, api);

    TCase *edge = tcase_create("edge");
    tcase_add_checked_fixture(edge, setup, teardown);
    tcase_add_test(edge, u64_boundaries);
    tcase_add_test(edge, u64_rejects);
    tcase_add_test(edge, non_hash_integers);
    tcase_add_test(edge, storage_tier_rules);
    tcase_add_test(edge, residency_domain_rules);
    tcase_add_test(edge, mm_extra_info_rules);
    tcase_add_test(edge, body_not_json);
    tcase_add_test(edge, errors_beyond_capacity_counted);
    tcase_add_test(edge, deep_nesting_in_ignored_member);
    tcase_add_test(edge, encode_invalid);
    suite_add_tcase(s, edge);

    TCase *oracle = tcase_create("oracle");
    tcase_add_checked_fixture(oracle, setup, teardown);
    tcase_set_timeout(oracle, 120);
    tcase_add_test(oracle, round_trip_random);
    tcase_add_test(oracle, round_trip_big_event);
    suite_add_tcase(s, oracle);

    TCase *oom = tcase_create("oom");
    tcase_add_checked_fixture(oom, setup, teardown);
    tcase_add_test(oom, encode_oom);
    suite_add_tcase(s, oom);
    return s;
}
