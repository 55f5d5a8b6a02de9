/* test_mp_read.c - the bounded msgpack reader (engine/src/mp_read.c). */
#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "kvr/err.h"
#include "mp_read.h"

/* Reads exactly one item from a heap copy of exactly `len` bytes (ASan catches over-reads). */
static int read_one(const uint8_t *bytes, size_t len, struct kvr_mp_obj *o, size_t *consumed)
{
    uint8_t *buf = malloc(len ? len : 1);
    memcpy(buf, bytes, len);
    struct kvr_mp r;
    kvr_mp_init(&r, buf, len);
    int rc = kvr_mp_next(&r, o);
    *consumed = (size_t)(r.p - buf);
    if (o->type == KVR_MP_STR || o->type == KVR_MP_BIN || o->type == KVR_MP_EXT)
        o->v.s.p = NULL; /* the buffer dies here */
    free(buf);
    return rc;
}

/* ==== api ==================================================================================== */

START_TEST(test_integers_every_width)
{
    static const struct {
        uint8_t bytes[9];
        size_t len;
        int type;
        uint64_t u;
        int64_t i;
    } cases[] = {
        {{0x00}, 1, KVR_MP_UINT, 0, 0},
        {{0x7f}, 1, KVR_MP_UINT, 127, 0},
        {{0xff}, 1, KVR_MP_INT, 0, -1},
        {{0xe0}, 1, KVR_MP_INT, 0, -32},
        {{0xfe}, 1, KVR_MP_INT, 0, -2},
        {{0xcc, 0xc8}, 2, KVR_MP_UINT, 200, 0},
        {{0xcd, 0x01, 0x2c}, 3, KVR_MP_UINT, 300, 0},
        {{0xce, 0x00, 0x01, 0x00, 0x00}, 5, KVR_MP_UINT, 65536, 0},
        {{0xcf, 0xde, 0xad, 0xbe, 0xef, 0xca, 0xfe, 0xf0, 0x0d},
         9,
         KVR_MP_UINT,
         0xDEADBEEFCAFEF00DULL,
         0},
        {{0xd0, 0x80}, 2, KVR_MP_INT, 0, -128},
        {{0xd0, 0x05}, 2, KVR_MP_UINT, 5, 0},
        {{0xd1, 0xff, 0x00}, 3, KVR_MP_INT, 0, -256},
        {{0xd2, 0x80, 0x00, 0x00, 0x00}, 5, KVR_MP_INT, 0, INT32_MIN},
        {{0xd3, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xfe}, 9, KVR_MP_INT, 0, -2},
        {{0xd3, 0x80, 0, 0, 0, 0, 0, 0, 0}, 9, KVR_MP_INT, 0, INT64_MIN},
        {{0xd3, 0, 0, 0, 0, 0, 0, 0, 7}, 9, KVR_MP_UINT, 7, 0},
        {{0xcf, 0, 0, 0, 0, 0, 0, 0, 4}, 9, KVR_MP_UINT, 4, 0},
    };
    for (size_t k = 0; k < sizeof(cases) / sizeof(cases[0]); k++) {
        struct kvr_mp_obj o;
        size_t used;
        ck_assert_int_eq(read_one(cases[k].bytes, cases[k].len, &o, &used), KVR_OK);
        ck_assert_uint_eq(used, cases[k].len);
        ck_assert_int_eq(o.type, cases[k].type);
        if (o.type == KVR_MP_UINT)
            ck_assert_uint_eq(o.v.u, cases[k].u);
        else
            ck_assert_int_eq(o.v.i, cases[k].i);
        /* peek agrees with next */
        struct kvr_mp r;
        kvr_mp_init(&r, cases[k].bytes, cases[k].len);
        ck_assert_int_eq(kvr_mp_peek(&r), cases[k].type);
    }
}
END_TEST

START_TEST(test_scalars)
{
    struct kvr_mp_obj o;
    size_t used;
    const uint8_t f64[] = {0xcb, 0x3f, 0xf8, 0, 0, 0, 0, 0, 0};
    ck_assert_int_eq(read_one(f64, sizeof(f64), &o, &used), KVR_OK);
    ck_assert_int_eq(o.type, KVR_MP_FLOAT);
    ck_assert(o.v.f == 1.5);
    const uint8_t f32[] = {0xca, 0x3e, 0x80, 0, 0}; /* 0.25f */
    ck_assert_int_eq(read_one(f32, sizeof(f32), &o, &used), KVR_OK);
    ck_assert(o.v.f == 0.25);
    const uint8_t nil[] = {0xc0}, t[] = {0xc3}, f[] = {0xc2};
    ck_assert_int_eq(read_one(nil, 1, &o, &used), KVR_OK);
    ck_assert_int_eq(o.type, KVR_MP_NIL);
    ck_assert_int_eq(read_one(t, 1, &o, &used), KVR_OK);
    ck_assert(o.type == KVR_MP_BOOL && o.v.b == 1);
    ck_assert_int_eq(read_one(f, 1, &o, &used), KVR_OK);
    ck_assert(o.type == KVR_MP_BOOL && o.v.b == 0);
}
END_TEST

START_TEST(test_strings_bins_exts)
{
    uint8_t buf[300];
    struct kvr_mp r;
    struct kvr_mp_obj o;
    /* fixstr "GPU" */
    const uint8_t gpu[] = {0xa3, 'G', 'P', 'U'};
    kvr_mp_init(&r, gpu, sizeof(gpu));
    ck_assert_int_eq(kvr_mp_next(&r, &o), KVR_OK);
    ck_assert(o.type == KVR_MP_STR && o.v.s.len == 3 && memcmp(o.v.s.p, "GPU", 3) == 0);
    /* str8 of 40, str16 of 256 */
    buf[0] = 0xd9;
    buf[1] = 40;
    memset(buf + 2, 'x', 40);
    kvr_mp_init(&r, buf, 42);
    ck_assert_int_eq(kvr_mp_next(&r, &o), KVR_OK);
    ck_assert_uint_eq(o.v.s.len, 40);
    buf[0] = 0xda;
    buf[1] = 1;
    buf[2] = 0;
    memset(buf + 3, 'y', 256);
    kvr_mp_init(&r, buf, 259);
    ck_assert_int_eq(kvr_mp_next(&r, &o), KVR_OK);
    ck_assert(o.type == KVR_MP_STR && o.v.s.len == 256);
    /* bin8 of 32 */
    buf[0] = 0xc4;
    buf[1] = 32;
    kvr_mp_init(&r, buf, 34);
    ck_assert_int_eq(kvr_mp_next(&r, &o), KVR_OK);
    ck_assert(o.type == KVR_MP_BIN && o.v.s.len == 32 && o.v.s.p == buf + 2);
    /* fixext4 type 5, ext8 of 3 */
    const uint8_t fx[] = {0xd6, 0x05, 1, 2, 3, 4};
    kvr_mp_init(&r, fx, sizeof(fx));
    ck_assert_int_eq(kvr_mp_next(&r, &o), KVR_OK);
    ck_assert(o.type == KVR_MP_EXT && o.ext_type == 5 && o.v.s.len == 4);
    const uint8_t e8[] = {0xc7, 0x03, 0xff, 9, 9, 9};
    kvr_mp_init(&r, e8, sizeof(e8));
    ck_assert_int_eq(kvr_mp_next(&r, &o), KVR_OK);
    ck_assert(o.type == KVR_MP_EXT && o.ext_type == -1 && o.v.s.len == 3);
    ck_assert_uint_eq(kvr_mp_remaining(&r), 0);
}
END_TEST

START_TEST(test_containers_and_skip)
{
    /* [1, {"a": [nil, "x"]}, -2] then 0x07 */
    const uint8_t b[] = {0x93, 0x01, 0x81, 0xa1, 'a', 0x92, 0xc0, 0xa1, 'x', 0xfe, 0x07};
    struct kvr_mp r;
    struct kvr_mp_obj o;
    kvr_mp_init(&r, b, sizeof(b));
    ck_assert_int_eq(kvr_mp_peek(&r), KVR_MP_ARRAY);
    ck_assert_int_eq(kvr_mp_skip(&r), KVR_OK);
    ck_assert_uint_eq(kvr_mp_remaining(&r), 1);
    ck_assert_int_eq(kvr_mp_next(&r, &o), KVR_OK);
    ck_assert_uint_eq(o.v.u, 7);
    ck_assert_int_eq(kvr_mp_peek(&r), 0);
    /* header only */
    kvr_mp_init(&r, b, sizeof(b));
    ck_assert_int_eq(kvr_mp_next(&r, &o), KVR_OK);
    ck_assert(o.type == KVR_MP_ARRAY && o.v.n == 3);
    ck_assert_int_eq(kvr_mp_next(&r, &o), KVR_OK);
    ck_assert_int_eq(kvr_mp_peek(&r), KVR_MP_MAP);
    ck_assert_int_eq(kvr_mp_skip_n(&r, 2), KVR_OK);
    ck_assert_uint_eq(kvr_mp_remaining(&r), 1);
    /* array16 / map16 headers */
    const uint8_t a16[] = {0xdc, 0x00, 0x02, 0x01, 0x02};
    kvr_mp_init(&r, a16, sizeof(a16));
    ck_assert_int_eq(kvr_mp_next(&r, &o), KVR_OK);
    ck_assert(o.type == KVR_MP_ARRAY && o.v.n == 2);
    const uint8_t m16[] = {0xde, 0x00, 0x01, 0x01, 0x02};
    kvr_mp_init(&r, m16, sizeof(m16));
    ck_assert_int_eq(kvr_mp_skip(&r), KVR_OK);
    ck_assert_uint_eq(kvr_mp_remaining(&r), 0);
}
END_TEST

/* ==== edge =================================================================================== */

START_TEST(test_every_truncation_fails_cleanly)
{
    /* a value using every family; each strict prefix must fail without reading past the end */
    const uint8_t full[] = {0x9a, 0xcf, 1,    2,    3,    4,    5,    6,    7,    8,    0xd3, 0xff,
                            0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xfe, 0xcb, 0x3f, 0xf0, 0,    0,
                            0,    0,    0,    0,    0xca, 0x3f, 0x80, 0,    0,    0xa2, 'h',  'i',
                            0xc4, 0x02, 0xaa, 0xbb, 0x81, 0xa1, 'k',  0x91, 0xc0, 0xd9, 0x01, 'z',
                            0xd6, 0x01, 1,    2,    3,    4,    0xdc, 0x00, 0x01, 0x05};
    for (size_t len = 0; len < sizeof(full); len++) {
        uint8_t *buf = malloc(len ? len : 1);
        memcpy(buf, full, len);
        struct kvr_mp r;
        kvr_mp_init(&r, buf, len);
        ck_assert_int_eq(kvr_mp_skip(&r), KVR_ECORRUPT);
        ck_assert_int_eq(r.err, KVR_MP_TRUNCATED);
        free(buf);
    }
    struct kvr_mp r;
    kvr_mp_init(&r, full, sizeof(full));
    ck_assert_int_eq(kvr_mp_skip(&r), KVR_OK);
    ck_assert_uint_eq(kvr_mp_remaining(&r), 0);
}
END_TEST

START_TEST(test_hostile_sizes)
{
    struct kvr_mp r;
    struct kvr_mp_obj o;
    /* array32 / map32 / str32 / bin32 declaring 4 Gi items or bytes, 5 bytes in total */
    const uint8_t a32[] = {0xdd, 0xff, 0xff, 0xff, 0xff, 0x00};
    const uint8_t m32[] = {0xdf, 0xff, 0xff, 0xff, 0xff, 0x00};
    const uint8_t s32[] = {0xdb, 0xff, 0xff, 0xff, 0xff, 0x00};
    const uint8_t b32[] = {0xc6, 0xff, 0xff, 0xff, 0xff, 0x00};
    const uint8_t e32[] = {0xc9, 0xff, 0xff, 0xff, 0xff, 0x01, 0x00};
    const uint8_t *all[] = {a32, m32, s32, b32};
    for (int k = 0; k < 4; k++) {
        kvr_mp_init(&r, all[k], 6);
        ck_assert_int_eq(kvr_mp_next(&r, &o), KVR_ECORRUPT);
        ck_assert_int_eq(r.err, KVR_MP_TRUNCATED);
        ck_assert_ptr_eq(r.p, all[k]); /* the cursor does not move */
    }
    kvr_mp_init(&r, e32, sizeof(e32));
    ck_assert_int_eq(kvr_mp_next(&r, &o), KVR_ECORRUPT);
    /* a map needs 2 bytes per pair: {1 pair} with one byte left is truncated */
    const uint8_t m1[] = {0x81, 0x01};
    kvr_mp_init(&r, m1, sizeof(m1));
    ck_assert_int_eq(kvr_mp_next(&r, &o), KVR_ECORRUPT);
    /* nested arrays declaring more than the bytes left are caught while skipping */
    uint8_t deep[4096];
    for (size_t k = 0; k < sizeof(deep); k++)
        deep[k] = 0x91; /* [[[[... */
    kvr_mp_init(&r, deep, sizeof(deep));
    ck_assert_int_eq(kvr_mp_skip(&r), KVR_ECORRUPT);
    deep[sizeof(deep) - 1] = 0xc0; /* ...nil]]]] is fine and needs no recursion */
    kvr_mp_init(&r, deep, sizeof(deep));
    ck_assert_int_eq(kvr_mp_skip(&r), KVR_OK);
}
END_TEST

START_TEST(test_reserved_byte)
{
    const uint8_t b[] = {0x92, 0x01, 0xc1};
    struct kvr_mp r;
    struct kvr_mp_obj o;
    kvr_mp_init(&r, b + 2, 1);
    ck_assert_int_eq(kvr_mp_peek(&r), 0);
    ck_assert_int_eq(kvr_mp_next(&r, &o), KVR_ECORRUPT);
    ck_assert_int_eq(r.err, KVR_MP_RESERVED);
    kvr_mp_init(&r, b, sizeof(b));
    ck_assert_int_eq(kvr_mp_skip(&r), KVR_ECORRUPT);
    ck_assert_int_eq(r.err, KVR_MP_RESERVED);
    ck_assert_str_eq(kvr_mp_type_name(KVR_MP_BIN), "bytes");
    ck_assert_str_eq(kvr_mp_type_name(KVR_MP_INT), "int");
    ck_assert_str_eq(kvr_mp_type_name(99), "?");
}
END_TEST

Suite *mp_read_suite(void);
Suite *mp_read_suite(void)
{
    Suite *s = suite_create("mp_read");
    TCase *api = tcase_create("api");
    tcase_add_test(api, test_integers_every_width);
    tcase_add_test(api, test_scalars);
    tcase_add_test(api, test_strings_bins_exts);
    tcase_add_test(api, test_containers_and_skip);
    suite_add_tcase(s, api);
    TCase *edge = tcase_create("edge");
    tcase_add_test(edge, test_every_truncation_fails_cleanly);
    tcase_add_test(edge, test_hostile_sizes);
    tcase_add_test(edge, test_reserved_byte);
    suite_add_tcase(s, edge);
    return s;
}
