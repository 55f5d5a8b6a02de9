/* test_json.c - the streaming JSON writer: exact layout, escaping, numbers, errors.
 * SPDX-License-Identifier: Apache-2.0 */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "json.h"

Suite *sim_json_suite(void);

/* Runs fn on a memory stream and returns the text (owned). */
static char *render(void (*fn)(struct kvr_sim_jw *), int *rc)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    ck_assert_ptr_nonnull(f);
    struct kvr_sim_jw w;
    kvr_sim_jw_init(&w, f);
    fn(&w);
    *rc = kvr_sim_jw_finish(&w);
    fclose(f);
    return buf;
}

static void doc(struct kvr_sim_jw *w)
{
    kvr_sim_jw_obj(w);
    kvr_sim_jw_ku64(w, "n", 18446744073709551615ull);
    kvr_sim_jw_kdbl(w, "ratio", 0.36641247833);
    kvr_sim_jw_kdbl(w, "nan", NAN);
    kvr_sim_jw_kdbl(w, "neg0", -0.0);
    kvr_sim_jw_kdbl(w, "big", 1234567.0);
    kvr_sim_jw_kstr(w, "s", "a\"b\\c\nd\x01");
    kvr_sim_jw_key(w, "list");
    kvr_sim_jw_arr(w, 1);
    kvr_sim_jw_u64(w, 1);
    kvr_sim_jw_u64(w, 2);
    kvr_sim_jw_end(w);
    kvr_sim_jw_key(w, "empty");
    kvr_sim_jw_obj(w);
    kvr_sim_jw_end(w);
    kvr_sim_jw_key(w, "rows");
    kvr_sim_jw_arr(w, 0);
    kvr_sim_jw_obj(w);
    kvr_sim_jw_key(w, "ok");
    kvr_sim_jw_bool(w, 1);
    kvr_sim_jw_end(w);
    kvr_sim_jw_end(w);
    kvr_sim_jw_end(w);
}

START_TEST(layout_and_escaping)
{
    int rc;
    char *s = render(doc, &rc);
    ck_assert_int_eq(rc, 0);
    ck_assert_str_eq(s, "{\n"
                        "  \"n\": 18446744073709551615,\n"
                        "  \"ratio\": 0.366412,\n"
                        "  \"nan\": null,\n"
                        "  \"neg0\": 0,\n"
                        "  \"big\": 1.23457e+06,\n"
                        "  \"s\": \"a\\\"b\\\\c\\nd\\u0001\",\n"
                        "  \"list\": [1, 2],\n"
                        "  \"empty\": {},\n"
                        "  \"rows\": [\n"
                        "    {\n"
                        "      \"ok\": true\n"
                        "    }\n"
                        "  ]\n"
                        "}\n");
    free(s);
}
END_TEST

static void unbalanced(struct kvr_sim_jw *w)
{
    kvr_sim_jw_obj(w);
    kvr_sim_jw_end(w);
    kvr_sim_jw_end(w);
}

static void unclosed(struct kvr_sim_jw *w)
{
    kvr_sim_jw_arr(w, 0);
}

START_TEST(misuse_is_reported)
{
    int rc;
    free(render(unbalanced, &rc));
    ck_assert_int_eq(rc, -1);
    free(render(unclosed, &rc));
    ck_assert_int_eq(rc, -1);
}
END_TEST

Suite *sim_json_suite(void)
{
    Suite *s = suite_create("sim_json");
    TCase *api = tcase_create("api");
    tcase_add_test(api, layout_and_escaping);
    tcase_add_test(api, misuse_is_reported);
    suite_add_tcase(s, api);
    return s;
}
