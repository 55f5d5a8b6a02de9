/* test_peer.c - bootstrap from a peer (server/src/peer.c): applying /dump bodies of both shapes
 * into a server's models, and the bootstrap gate of server/src/models.c that keeps live events
 * until the dump is in (the order that loses nothing). */
#include <check.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "config.h"
#include "kvr/err.h"
#include "kvr/index.h"
#include "log.h"
#include "models.h"
#include "peer.h"
#include "server.h"

Suite *peer_suite(void);

static struct srv_config cfg;
static struct srv_logger lg;
static struct srv *s;

static void setup(void)
{
    char err[SRV_CFG_ERR] = "";
    srv_config_init(&cfg);
    cfg.health_interval_ms = 0;
    ck_assert_int_eq(srv_config_add_model_spec(&cfg, "default", err, sizeof(err)), 0);
    ck_assert_msg(srv_config_finish(&cfg, err, sizeof(err)) == 0, "%s", err);
    srv_log_init(&lg, 2, SRV_LOG_ERROR);
    ck_assert_msg(srv_new(&cfg, &lg, &s, err, sizeof(err)) == KVR_OK, "%s", err);
}

static void teardown(void)
{
    srv_free(s);
    s = NULL;
    srv_config_free(&cfg);
}

/* Matched blocks of worker w (rank 0) for the local hashes q. */
static uint32_t score(const char *key, const uint64_t *q, size_t n, uint64_t w)
{
    struct srv_model *m = srv_models_find_spec(&s->models, key, strlen(key));
    ck_assert_ptr_nonnull(m);
    struct kvr_match mt[16];
    size_t nm = 0;
    ck_assert_int_eq(kvr_index_find_matches(m->index, q, n, 0, mt, 16, &nm), KVR_OK);
    for (size_t k = 0; k < nm; k++)
        if (mt[k].worker_id == w && mt[k].dp_rank == 0)
            return mt[k].blocks;
    return 0;
}

#define STORED(w, id, parent, blocks)                                                              \
    "{\"worker_id\":" #w ",\"event\":{\"event_id\":" #id ",\"data\":{\"stored\":{"                 \
    "\"parent_hash\":" parent ",\"blocks\":[" blocks "]}}}}"

START_TEST(both_dump_shapes)
{
    const char *dump = "{\"default:default\":{\"block_size\":16,\"events\":[" STORED(
        1, 0, "null",
        "{\"block_hash\":101,\"tokens_hash\":11},"
        "{\"block_hash\":102,\"tokens_hash\":12}") "," STORED(2, 1, "null",
                                                              "{\"block_hash\":201,\"tokens_hash\":"
                                                              "11}") "]},"
                                                                     "\"other:acme\":[" STORED(
                                                                         3, 0, "null",
                                                                         "{\"block_hash\":-1,"
                                                                         "\"tokens_hash\":21}") "],"
                                                                                                "\""
                                                                                                "br"
                                                                                                "ok"
                                                                                                "en"
                                                                                                ":d"
                                                                                                "ef"
                                                                                                "au"
                                                                                                "lt"
                                                                                                "\""
                                                                                                ":{"
                                                                                                "\""
                                                                                                "er"
                                                                                                "ro"
                                                                                                "r"
                                                                                                "\""
                                                                                                ":"
                                                                                                "\""
                                                                                                "in"
                                                                                                "de"
                                                                                                "x "
                                                                                                "un"
                                                                                                "av"
                                                                                                "ai"
                                                                                                "la"
                                                                                                "bl"
                                                                                                "e"
                                                                                                "\""
                                                                                                "}"
                                                                                                "}";
    struct srv_peer_dump_stats st;
    char err[256] = "";
    ck_assert_msg(srv_peer_apply_dump(s, dump, strlen(dump), &st, err, sizeof(err)) == KVR_OK, "%s",
                  err);
    ck_assert_uint_eq(st.models, 2);
    ck_assert_uint_eq(st.events, 3);
    ck_assert_uint_eq(st.rejected, 0);
    ck_assert_uint_eq(st.skipped, 1);
    static const uint64_t q[] = {11, 12, 13};
    ck_assert_uint_eq(score("default:default", q, 3, 1), 2);
    ck_assert_uint_eq(score("default:default", q, 3, 2), 1);
    static const uint64_t q2[] = {21};
    ck_assert_uint_eq(score("other:acme", q2, 1, 3), 1); /* created by the dump */
    struct srv_model *o = srv_models_find_spec(&s->models, "other:acme", 10);
    ck_assert_uint_eq(o->block_size, cfg.block_size);
}
END_TEST

START_TEST(bad_sections_and_events_are_counted)
{
    /* block size conflict: skipped whole; a bad event among good ones: counted, the rest
     * applied; an unknown parent: refused by the index and counted. */
    const char *dump = "{\"default:default\":{\"block_size\":32,\"events\":[" STORED(
        1, 0, "null",
        "{\"block_hash\":1,\"tokens_hash\":1}") "]},"
                                                "\"fresh:default\":{\"block_size\":8,"
                                                "\"events\":[" STORED(
                                                    1, 0, "null",
                                                    "{\"block_hash\":1,\"tokens_hash\":"
                                                    "31}") ","
                                                           "{\"worker_id\":\"x\"}"
                                                           "," STORED(1, 2, "999",
                                                                      "{\"block_hash\":"
                                                                      "2,\"tokens_"
                                                                      "hash\":32}") "]}"
                                                                                    "}";
    struct srv_peer_dump_stats st;
    char err[256] = "";
    ck_assert_msg(srv_peer_apply_dump(s, dump, strlen(dump), &st, err, sizeof(err)) == KVR_OK, "%s",
                  err);
    ck_assert_uint_eq(st.skipped, 1);
    ck_assert_uint_eq(st.models, 1);
    ck_assert_uint_eq(st.events, 1);
    ck_assert_uint_eq(st.rejected, 2);
    static const uint64_t q[] = {31, 32};
    ck_assert_uint_eq(score("fresh:default", q, 2, 1), 1);
    ck_assert_uint_eq(srv_models_find_spec(&s->models, "fresh:default", 13)->block_size, 8);
    static const uint64_t q1[] = {1};
    ck_assert_uint_eq(score("default:default", q1, 1, 1), 0);
    /* not a dump at all */
    ck_assert_int_eq(srv_peer_apply_dump(s, "[1,2]", 5, &st, err, sizeof(err)), KVR_ECORRUPT);
    ck_assert_ptr_nonnull(strstr(err, "model:tenant"));
    ck_assert_int_eq(srv_peer_apply_dump(s, "{\"a\":", 5, &st, err, sizeof(err)), KVR_ECORRUPT);
}
END_TEST

static struct kvr_event stored(uint64_t w, struct kvr_block *b, uint32_t n)
{
    struct kvr_event ev = {.worker_id = w, .kind = KVR_EVENT_STORED, .n = n, .blocks = b};
    return ev;
}

START_TEST(hold_keeps_live_events_behind_the_dump)
{
    /* The bootstrap order: live events arrive while the model is held; the dump (older state)
     * is applied; release replays the kept events after it. A block the dump still has but a
     * live event removed must end up removed (applying live events first would resurrect it). */
    struct srv_model *m = srv_models_find_spec(&s->models, "default", 7);
    srv_model_hold(m);
    uint64_t gone = 102;
    struct kvr_block nb[1] = {{301, 41}};
    struct kvr_event live[2] = {
        {.worker_id = 1, .kind = KVR_EVENT_REMOVED, .n = 1, .hashes = &gone},
        stored(3, nb, 1),
    };
    srv_model_apply_events(m, live, 2);
    static const uint64_t q41[] = {41};
    ck_assert_uint_eq(score("default:default", q41, 1, 3), 0); /* kept, not applied */
    ck_assert_uint_eq(atomic_load(&m->held_events), 2);
    const char *dump = "{\"default:default\":{\"block_size\":16,\"events\":[" STORED(
        1, 0, "null",
        "{\"block_hash\":101,\"tokens_hash\":11},{\"block_hash\":102,\"tokens_hash\":12}") "]}}";
    struct srv_peer_dump_stats st;
    char err[256] = "";
    ck_assert_int_eq(srv_peer_apply_dump(s, dump, strlen(dump), &st, err, sizeof(err)), KVR_OK);
    static const uint64_t q[] = {11, 12};
    ck_assert_uint_eq(score("default:default", q, 2, 1), 2); /* the dump alone */
    ck_assert_uint_eq(srv_models_release_all(&s->models), 2);
    ck_assert_uint_eq(score("default:default", q, 2, 1), 1); /* the live removal won */
    ck_assert_uint_eq(score("default:default", q41, 1, 3), 1);
    /* live again: applied directly */
    uint64_t g2 = 101;
    struct kvr_event rm = {.worker_id = 1, .kind = KVR_EVENT_REMOVED, .n = 1, .hashes = &g2};
    srv_model_apply_events(m, &rm, 1);
    ck_assert_uint_eq(score("default:default", q, 2, 1), 0);
    ck_assert_uint_eq(atomic_load(&m->held_events), 2);
}
END_TEST

START_TEST(models_created_while_holding_start_held)
{
    s->models.hold_new = 1;
    struct srv_model_cfg mc;
    char name[] = "late", tenant[] = "default", err[256];
    srv_model_cfg_defaults(&mc, name, tenant, 16);
    struct srv_model *m;
    ck_assert_int_eq(srv_models_get_or_create(&s->models, &mc, &m, NULL, err, sizeof(err)), KVR_OK);
    ck_assert_int_eq(atomic_load(&m->held), 1);
    struct kvr_block b[1] = {{7, 51}};
    struct kvr_event ev = stored(1, b, 1);
    srv_model_apply_events(m, &ev, 1);
    static const uint64_t q[] = {51};
    ck_assert_uint_eq(score("late:default", q, 1, 1), 0);
    ck_assert_uint_eq(srv_models_release_all(&s->models), 1);
    ck_assert_uint_eq(score("late:default", q, 1, 1), 1);
    ck_assert_int_eq(s->models.hold_new, 0);
    ck_assert_int_eq(atomic_load(&m->held), 0);
}
END_TEST

Suite *peer_suite(void)
{
    Suite *su = suite_create("peer");
    TCase *api = tcase_create("api");
    tcase_add_checked_fixture(api, setup, teardown);
    tcase_add_test(api, both_dump_shapes);
    tcase_add_test(api, hold_keeps_live_events_behind_the_dump);
    tcase_add_test(api, models_created_while_holding_start_held);
    suite_add_tcase(su, api);
    TCase *edge = tcase_create("edge");
    tcase_add_checked_fixture(edge, setup, teardown);
    tcase_add_test(edge, bad_sections_and_events_are_counted);
    suite_add_tcase(su, edge);
    return su;
}
