/* test_auth.c - bearer tokens and the loopback rule (server/src/auth.c): exact matches only
 * (prefixes, extensions, other cases of the token refused), the scheme case-insensitive, and
 * loopback recognised in every form libevent may report (127/8, ::1, ::ffff:127.x) and nothing
 * else (10.x, 128.x, ::ffff:10.x, names, junk). */
#include <check.h>
#include <string.h>

#include "auth.h"

Suite *auth_suite(void);

START_TEST(token_equal_exact_only)
{
    const char *s = "s3cret-token";
    ck_assert_int_eq(srv_auth_token_equal("s3cret-token", 12, s), 1);
    ck_assert_int_eq(srv_auth_token_equal("s3cret-toke", 11, s), 0);   /* prefix */
    ck_assert_int_eq(srv_auth_token_equal("s3cret-tokenX", 13, s), 0); /* extended */
    ck_assert_int_eq(srv_auth_token_equal("S3cret-token", 12, s), 0);  /* case matters */
    ck_assert_int_eq(srv_auth_token_equal("s3cret-tokeN", 12, s), 0);  /* last byte */
    ck_assert_int_eq(srv_auth_token_equal("", 0, s), 0);
    ck_assert_int_eq(srv_auth_token_equal("", 0, ""), 1);
    /* the length given is what counts, not a NUL inside */
    ck_assert_int_eq(srv_auth_token_equal("s3cret-token\0x", 14, s), 0);
    ck_assert_int_eq(srv_auth_token_equal("s3cret-tokenXYZ", 12, s), 1);
    /* a token repeated (what a modulo-indexed comparison could accept) */
    ck_assert_int_eq(srv_auth_token_equal("abab", 4, "ab"), 0);
    ck_assert_int_eq(srv_auth_token_equal("ab", 2, "abab"), 0);
}
END_TEST

START_TEST(bearer_header_forms)
{
    const char *s = "tok";
    ck_assert_int_eq(srv_auth_bearer_ok("Bearer tok", s), 1);
    ck_assert_int_eq(srv_auth_bearer_ok("bearer tok", s), 1); /* scheme is case-insensitive */
    ck_assert_int_eq(srv_auth_bearer_ok("BEARER tok", s), 1);
    ck_assert_int_eq(srv_auth_bearer_ok("Bearer   tok", s), 1);
    ck_assert_int_eq(srv_auth_bearer_ok("Bearer TOK", s), 0); /* the token is not */
    ck_assert_int_eq(srv_auth_bearer_ok("Bearer to", s), 0);
    ck_assert_int_eq(srv_auth_bearer_ok("Bearer tokk", s), 0);
    ck_assert_int_eq(srv_auth_bearer_ok("Bearer tok ", s), 0);
    ck_assert_int_eq(srv_auth_bearer_ok("Bearer", s), 0);
    ck_assert_int_eq(srv_auth_bearer_ok("Bearer ", s), 0);
    ck_assert_int_eq(srv_auth_bearer_ok("Bearertok", s), 0);
    ck_assert_int_eq(srv_auth_bearer_ok("Basic tok", s), 0);
    ck_assert_int_eq(srv_auth_bearer_ok(" Bearer tok", s), 0);
    ck_assert_int_eq(srv_auth_bearer_ok("tok", s), 0);
    ck_assert_int_eq(srv_auth_bearer_ok("", s), 0);
    ck_assert_int_eq(srv_auth_bearer_ok(NULL, s), 0);
    /* an empty secret never authorises anything */
    ck_assert_int_eq(srv_auth_bearer_ok("Bearer ", ""), 0);
    ck_assert_int_eq(srv_auth_bearer_ok("Bearer x", NULL), 0);
}
END_TEST

START_TEST(loopback_addresses)
{
    static const char *const yes[] = {
        "127.0.0.1", "127.0.0.2",       "127.255.255.254",  "127.1.2.3",
        "::1",       "0:0:0:0:0:0:0:1", "::ffff:127.0.0.1", "::FFFF:127.0.0.9"};
    static const char *const no[] = {
        "10.0.0.1",   "10.127.0.1", "128.0.0.1", "126.255.255.255", "0.0.0.0",
        "192.0.2.2",  "::",         "::2",       "::ffff:10.0.0.1", "::127.0.0.1",
        "fe80::1",    "fe80::1%lo", "localhost", "127.0.0.1.evil",  "127.0.0.1 ",
        " 127.0.0.1", "127",        "",          "127.0.0.01x",     "2001:db8::1"};
    for (size_t k = 0; k < sizeof(yes) / sizeof(yes[0]); k++)
        ck_assert_msg(srv_auth_is_loopback(yes[k]) == 1, "%s should be loopback", yes[k]);
    for (size_t k = 0; k < sizeof(no) / sizeof(no[0]); k++)
        ck_assert_msg(srv_auth_is_loopback(no[k]) == 0, "%s should not be loopback", no[k]);
    ck_assert_int_eq(srv_auth_is_loopback(NULL), 0);
}
END_TEST

Suite *auth_suite(void)
{
    Suite *s = suite_create("auth");
    TCase *tc = tcase_create("api");
    tcase_add_test(tc, token_equal_exact_only);
    tcase_add_test(tc, loopback_addresses);
    suite_add_tcase(s, tc);
    TCase *edge = tcase_create("edge");
    tcase_add_test(edge, bearer_header_forms);
    suite_add_tcase(s, edge);
    return s;
}
