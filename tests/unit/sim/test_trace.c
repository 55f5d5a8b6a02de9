/* test_trace.c - Mooncake trace reading (plain and gzip), errors, and the best-achievable prefix.
 * SPDX-License-Identifier: Apache-2.0 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvr/err.h"
#include "kvr/sim.h"

Suite *sim_trace_suite(void);

static int parse(const char *text, struct kvr_sim_trace *t, char *err)
{
    kvr_sim_trace_init(t);
    return kvr_sim_trace_parse(text, strlen(text), t, err, 256);
}

START_TEST(parses_lines)
{
    struct kvr_sim_trace t;
    char err[256] = "";
    const char *text =
        "{\"timestamp\": 1000, \"input_length\": 700, \"output_length\": 5, \"hash_ids\": [0, 1]}\n"
        "\n"
        "  {\"hash_ids\":[0,2,3],\"output_length\":1,\"input_length\":1100,\"timestamp\":1500.25,"
        "\"extra\":{\"x\":[1]}}\r\n"
        "{\"timestamp\": 1500.25, \"input_length\": 0, \"output_length\": 0, \"hash_ids\": []}";
    ck_assert_int_eq(parse(text, &t, err), KVR_OK);
    ck_assert_uint_eq(t.n, 3);
    ck_assert_uint_eq(t.n_ids, 5);
    ck_assert_uint_eq(t.max_id, 3);
    ck_assert_uint_eq(t.req[0].arrival_us, 0);
    ck_assert_uint_eq(t.req[1].arrival_us, 500250);
    ck_assert_uint_eq(t.req[1].input_tokens, 1100);
    ck_assert_uint_eq(t.req[1].output_tokens, 1);
    ck_assert_uint_eq(t.req[1].n_ids, 3);
    ck_assert_uint_eq(t.ids[t.req[1].ids_off + 2], 3);
    ck_assert_uint_eq(t.req[2].n_ids, 0);
    /* best: r0 nothing before; r1 shares id 0 with r0; r2 is empty */
    uint32_t best[3];
    ck_assert_int_eq(kvr_sim_trace_best(&t, best), KVR_OK);
    ck_assert_uint_eq(best[0], 0);
    ck_assert_uint_eq(best[1], 1);
    ck_assert_uint_eq(best[2], 0);
    kvr_sim_trace_free(&t);
}
END_TEST

START_TEST(errors_name_line_and_field)
{
    struct kvr_sim_trace t;
    char err[256];
    static const struct {
        const char *text, *msg;
    } cases[] = {
        {"{\"timestamp\": 1, \"input_length\": 1, \"output_length\": 1, \"hash_ids\": [1]}\n"
         "{\"timestamp\": 2, \"input_length\": -1, \"output_length\": 1, \"hash_ids\": []}",
         "line 2: input_length"},
        {"{\"timestamp\": 1, \"input_length\": 1, \"output_length\": 1, \"hash_ids\": [1, 2.5]}",
         "line 1: hash_ids[1]"},
        {"{\"timestamp\": 1, \"input_length\": 1, \"output_length\": 1, \"hash_ids\": "
         "[4294967296]}",
         "line 1: hash_ids[0]"},
        {"{\"timestamp\": \"x\", \"input_length\": 1, \"output_length\": 1, \"hash_ids\": []}",
         "line 1: timestamp"},
        {"{\"timestamp\": 5, \"input_length\": 1, \"output_length\": 1, \"hash_ids\": []}\n\n"
         "{\"timestamp\": 4, \"input_length\": 1, \"output_length\": 1, \"hash_ids\": []}",
         "line 3: timestamp 4.000 goes back in time"},
        {"{\"timestamp\": 1, \"input_length\": 1, \"hash_ids\": []}", "line 1: output_length"},
        {"{\"timestamp\": 1, \"input_length\": 1, \"output_length\": 1}", "line 1: hash_ids"},
        {"[1, 2]", "line 1: not a JSON object"},
        {"{\"timestamp\": 1, \"input_length\": 1, \"output_length\": 1, \"hash_ids\": []} x",
         "line 1: trailing characters"},
        {"{\"timestamp\": 1,", "line 1: not a JSON object"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        err[0] = '\0';
        ck_assert_int_eq(parse(cases[i].text, &t, err), KVR_ECORRUPT);
        ck_assert_msg(strstr(err, cases[i].msg) != NULL, "case %zu: got \"%s\", want \"%s\"", i,
                      err, cases[i].msg);
        kvr_sim_trace_free(&t);
    }
}
END_TEST

/* The bundled traces: plain and gzip, with the counts of data/traces/README.md and the best
 * achievable prefix computed independently (Python over the raw ids: 105,710 of 288,500 blocks
 * for the conversation trace, 65 of 514 for the arXiv sample). */
START_TEST(bundled_traces)
{
    struct kvr_sim_trace t;
    char err[512] = "";
    kvr_sim_trace_init(&t);
    ck_assert_int_eq(kvr_sim_trace_load(KVR_SOURCE_DIR
                                        "/data/traces/mooncake_fast25_conversation_trace.jsonl.gz",
                                        &t, err, sizeof(err)),
                     KVR_OK);
    ck_assert_uint_eq(t.n, 12031);
    ck_assert_uint_eq(t.n_ids, 288500);
    ck_assert_uint_eq(t.req[t.n - 1].arrival_us, 3536999000ull);
    uint32_t *best = calloc(t.n, sizeof(*best));
    ck_assert_int_eq(kvr_sim_trace_best(&t, best), KVR_OK);
    uint64_t sum = 0;
    for (size_t i = 0; i < t.n; i++)
        sum += best[i];
    ck_assert_uint_eq(sum, 105710);
    free(best);
    kvr_sim_trace_free(&t);
    ck_assert_int_eq(kvr_sim_trace_load(KVR_SOURCE_DIR "/data/traces/mooncake_arxiv_first20.jsonl",
                                        &t, err, sizeof(err)),
                     KVR_OK);
    ck_assert_uint_eq(t.n, 20);
    ck_assert_uint_eq(t.n_ids, 514);
    uint32_t b20[20];
    ck_assert_int_eq(kvr_sim_trace_best(&t, b20), KVR_OK);
    sum = 0;
    for (int i = 0; i < 20; i++)
        sum += b20[i];
    ck_assert_uint_eq(sum, 65);
    kvr_sim_trace_free(&t);
    ck_assert_int_eq(kvr_sim_trace_load("/nonexistent/trace.jsonl", &t, err, sizeof(err)), KVR_EIO);
    ck_assert_ptr_nonnull(strstr(err, "/nonexistent/trace.jsonl: cannot open"));
    kvr_sim_trace_free(&t);
}
END_TEST

Suite *sim_trace_suite(void)
{
    Suite *s = suite_create("sim_trace");
    TCase *api = tcase_create("api");
    tcase_set_timeout(api, 60);
    tcase_add_test(api, parses_lines);
    tcase_add_test(api, bundled_traces);
    suite_add_tcase(s, api);
    TCase *edge = tcase_create("edge");
    tcase_add_test(edge, errors_name_line_and_field);
    suite_add_tcase(s, edge);
    return s;
}
