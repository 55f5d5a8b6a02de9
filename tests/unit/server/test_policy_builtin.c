/* test_policy_builtin.c - the built-in classic KV cost and softmax selection
 * (server/src/policy.c; spec/scheduling.md §3 worked example, §5 softmax example) and the bytes
 * tokenizer / chat flattening (server/src/tokenize.c). */
#include <check.h>
#include <json-c/json.h>
#include <math.h>
#include <string.h>

#include "kvr/err.h"
#include "policy.h"
#include "tokenize.h"

Suite *policy_builtin_suite(void);

START_TEST(classic_cost_worked_example)
{
    /* ISL 100, block size 16, weight 1: A (3 cached blocks) 3.25, B (none) 6.25 */
    struct srv_policy_req rq = {.isl = 100, .block_size = 16, .blocks = 6};
    struct srv_policy_cand c[2];
    memset(c, 0, sizeof(c));
    c[0].overlap = 3;
    ck_assert(srv_policy_builtin_cost(1.0, &rq, &c[0]) == 3.25);
    ck_assert(srv_policy_builtin_cost(1.0, &rq, &c[1]) == 6.25);
    /* A wins unless its decode load is at least 3 blocks higher (exactly 3 = tie) */
    c[0].decode_blocks = 3;
    ck_assert(srv_policy_builtin_cost(1.0, &rq, &c[0]) == 6.25);
    uint32_t ranked[4];
    struct srv_policy_out out = {.ranked = ranked, .cap = 4};
    c[0].tree_blocks = 10; /* tie: fewer tree blocks first */
    c[1].tree_blocks = 5;
    srv_policy_builtin_rank(1.0, 0, &rq, c, 2, 0, &out);
    ck_assert_uint_eq(out.n, 2);
    ck_assert_uint_eq(ranked[0], 1);
    c[0].decode_blocks = 2;
    srv_policy_builtin_rank(1.0, 0, &rq, c, 2, 0, &out);
    ck_assert_uint_eq(ranked[0], 0);
    ck_assert_uint_eq(ranked[1], 1);
    /* active prefill tokens add to the prefill term; weight 0 = pure load balancing */
    c[0].prefill_tokens = 160;
    ck_assert(srv_policy_builtin_cost(1.0, &rq, &c[0]) == 3.25 + 10 + 2);
    ck_assert(srv_policy_builtin_cost(0.0, &rq, &c[0]) == 2);
    /* overlap beyond the prompt never makes the prefill negative */
    c[1].overlap = 100;
    ck_assert(srv_policy_builtin_cost(1.0, &rq, &c[1]) == 0);
}
END_TEST

START_TEST(softmax_example)
{
    /* costs [3.25, 6.25, 4.0], T = 0.5: cumsum [0.574097, 0.651793, 1.0] */
    struct srv_policy_req rq = {.isl = 0, .block_size = 1};
    struct srv_policy_cand c[3];
    memset(c, 0, sizeof(c));
    c[0].new_blocks = 0; /* cost = new_blocks + decode_blocks with isl 0; use decode blocks */
    double costs[3] = {3.25, 6.25, 4.0};
    uint32_t ranked[3];
    struct srv_policy_out out = {.ranked = ranked, .cap = 3};
    /* encode costs through fractional prefill: isl 0, so set decode_blocks via weights */
    for (int k = 0; k < 3; k++) {
        c[k].decode_blocks = 0;
        c[k].prefill_tokens = (uint64_t)(costs[k] * 4);
    }
    rq.block_size = 4;
    struct {
        double u;
        uint32_t pick;
    } draws[] = {{0.0, 0}, {0.5, 0}, {0.574, 0}, {0.6, 1}, {0.651, 1}, {0.66, 2}, {0.999, 2}};
    for (size_t k = 0; k < sizeof(draws) / sizeof(draws[0]); k++) {
        srv_policy_builtin_rank(1.0, 0.5, &rq, c, 3, draws[k].u, &out);
        ck_assert_msg(ranked[0] == draws[k].pick, "u=%g: got %u", draws[k].u, ranked[0]);
        ck_assert_uint_eq(out.n, 3);
    }
    ck_assert(fabs(c[1].cost - 6.25) < 1e-12);
    /* all equal: uniform over the candidates */
    for (int k = 0; k < 3; k++)
        c[k].prefill_tokens = 8;
    srv_policy_builtin_rank(1.0, 1.0, &rq, c, 3, 0.7, &out);
    ck_assert_uint_eq(ranked[0], 2);
    srv_policy_builtin_rank(1.0, 1.0, &rq, c, 3, 0.1, &out);
    ck_assert_uint_eq(ranked[0], 0);
}
END_TEST

START_TEST(bytes_tokenizer)
{
    uint32_t t[8];
    ck_assert_uint_eq(srv_tok_bytes_count(9, 4), 3);
    ck_assert_uint_eq(srv_tok_bytes("abcdefghi", 9, 4, t), 3);
    ck_assert_uint_eq(t[0], 0x64636261u);
    ck_assert_uint_eq(t[1], 0x68676665u);
    ck_assert_uint_eq(t[2], 0x69u);
    ck_assert_uint_eq(srv_tok_bytes("\xff\x01", 2, 1, t), 2);
    ck_assert_uint_eq(t[0], 0xffu);
    ck_assert_uint_eq(t[1], 1u);
    /* a shared prefix gives shared pseudo-tokens */
    uint32_t a[4], b[4];
    srv_tok_bytes("hello world!", 12, 4, a);
    srv_tok_bytes("hello worms", 11, 4, b);
    ck_assert_uint_eq(a[0], b[0]);
    ck_assert_uint_eq(a[1], b[1]);
    ck_assert_uint_ne(a[2], b[2]);
}
END_TEST

START_TEST(chat_flattening_and_tokenize_answers)
{
    struct json_object *m = json_tokener_parse(
        "[{\"role\":\"system\",\"content\":\"be brief\"},"
        "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"hi \"},"
        "{\"type\":\"image_url\",\"image_url\":{}},{\"type\":\"text\",\"text\":\"there\"}]}]");
    struct kvr_buf b;
    kvr_buf_init(&b, NULL);
    ck_assert_int_eq(srv_tok_flatten_messages(m, &b), KVR_OK);
    ck_assert_str_eq(kvr_buf_cstr(&b), "system\nbe brief\nuser\nhi there\n");
    json_object_put(m);
    m = json_tokener_parse("[1]");
    ck_assert_int_eq(srv_tok_flatten_messages(m, &b), KVR_ECORRUPT);
    json_object_put(m);
    kvr_buf_free(&b);

    uint32_t t[4];
    size_t n;
    const char *ok = "{\"count\":3,\"max_model_len\":10,\"tokens\":[1,4294967295,7]}";
    ck_assert_int_eq(srv_tok_parse_answer(ok, strlen(ok), t, 4, &n), KVR_OK);
    ck_assert_uint_eq(n, 3);
    ck_assert_uint_eq(t[1], 4294967295u);
    ck_assert_int_eq(srv_tok_parse_answer(ok, strlen(ok), t, 2, &n), KVR_ERANGE);
    const char *bad[] = {"{\"tokens\":[-1]}", "{\"tokens\":[1.5]}", "{\"tokens\":[4294967296]}",
                         "{}", "nope"};
    for (size_t k = 0; k < sizeof(bad) / sizeof(bad[0]); k++)
        ck_assert_int_eq(srv_tok_parse_answer(bad[k], strlen(bad[k]), t, 4, &n), KVR_ECORRUPT);
}
END_TEST

Suite *policy_builtin_suite(void)
{
    Suite *s = suite_create("policy_builtin");
    TCase *tc = tcase_create("oracle");
    tcase_add_test(tc, classic_cost_worked_example);
    tcase_add_test(tc, softmax_example);
    tcase_add_test(tc, bytes_tokenizer);
    tcase_add_test(tc, chat_flattening_and_tokenize_answers);
    suite_add_tcase(s, tc);
    return s;
}
