/* test_hash.c - block hashing against spec/hashing.md §9 vectors, plus edge cases and an oracle
 * that rebuilds the le32/le64 byte strings by hand. */
#include <check.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvr/err.h"
#include "kvr/hash.h"

#define SENTINEL UINT64_C(0xA5A5A5A5A5A5A5A5)

/* ==== helpers ================================================================================ */

static void le32_bytes(const uint32_t *t, size_t n, unsigned char *out)
{
    for (size_t i = 0; i < n; i++) {
        out[4 * i + 0] = (unsigned char)(t[i] & 0xff);
        out[4 * i + 1] = (unsigned char)((t[i] >> 8) & 0xff);
        out[4 * i + 2] = (unsigned char)((t[i] >> 16) & 0xff);
        out[4 * i + 3] = (unsigned char)((t[i] >> 24) & 0xff);
    }
}

static void le64_bytes(uint64_t v, unsigned char *out)
{
    for (int i = 0; i < 8; i++)
        out[i] = (unsigned char)((v >> (8 * i)) & 0xff);
}

/* Tokens lo..hi-1 into t; returns the count. */
static size_t iota(uint32_t *t, uint32_t lo, uint32_t hi)
{
    size_t n = 0;
    for (uint32_t v = lo; v < hi; v++)
        t[n++] = v;
    return n;
}

/* Hashes tokens with block size bs and the given options; asserts success and the count. */
static void blocks_ok(const uint32_t *t, size_t n, uint32_t bs, const struct kvr_hash_opts *o,
                      uint64_t *out, size_t cap, size_t want_n)
{
    size_t n_out = 12345;
    int rc = kvr_hash_blocks(t, n, bs, o, out, cap, &n_out);
    ck_assert_int_eq(rc, KVR_OK);
    ck_assert_uint_eq(n_out, want_n);
}

static uint64_t test_seed(void)
{
    const char *s = getenv("KVR_TEST_SEED");
    return s != NULL ? strtoull(s, NULL, 0) : UINT64_C(20260529);
}

static uint64_t rng_next(uint64_t *s)
{
    /* splitmix64 */
    uint64_t z = (*s += UINT64_C(0x9E3779B97F4A7C15));
    z = (z ^ (z >> 30)) * UINT64_C(0xBF58476D1CE4E5B9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94D049BB133111EB);
    return z ^ (z >> 31);
}

/* ==== 9.1 XXH3 primitives ==================================================================== */

START_TEST(v91_primitives)
{
    ck_assert_uint_eq(kvr_hash_xxh3("test data", 9, 1337), UINT64_C(13226331709069118873));
    const uint32_t t[4] = {1, 2, 3, 4};
    unsigned char b[16];
    le32_bytes(t, 4, b);
    ck_assert_uint_eq(kvr_hash_xxh3(b, 16, 1337), UINT64_C(14643705804678351452));
    ck_assert_uint_eq(kvr_hash_xxh3(b, 16, 1337), UINT64_C(0xcb38e4d7fb2dca5c));
    ck_assert_uint_eq(kvr_hash_xxh3("abc", 3, 0), UINT64_C(8696274497037089104));
    ck_assert_uint_eq(kvr_hash_xxh3("", 0, 0), UINT64_C(3244421341483603138));
    ck_assert_uint_eq(kvr_hash_xxh3(NULL, 0, 0), UINT64_C(0x2d06800538d394c2));
    ck_assert_uint_eq(kvr_hash_xxh3("", 0, 1337), UINT64_C(15128690059815094969));
}
END_TEST

/* ==== 9.2 token blocks, no salt ============================================================== */

START_TEST(v92_tokens_0_7)
{
    uint32_t t[8];
    size_t n = iota(t, 0, 8);
    uint64_t local[2], seq[2];
    blocks_ok(t, n, 4, NULL, local, 2, 2);
    ck_assert_uint_eq(local[0], UINT64_C(9143094415614847814));
    ck_assert_uint_eq(local[0], UINT64_C(0x7ee2cbedc694ab46));
    ck_assert_uint_eq(local[1], UINT64_C(12124091508212882195));
    ck_assert_uint_eq(local[1], UINT64_C(0xa8416cfd935bdb13));
    kvr_hash_chain(local, 2, seq);
    ck_assert_uint_eq(seq[0], UINT64_C(9143094415614847814));
    ck_assert_uint_eq(seq[1], UINT64_C(9510318385840434533));
    ck_assert_uint_eq(seq[1], UINT64_C(0x83fb702f20e2ad65));
    ck_assert_uint_eq(kvr_hash_seq_next(local[0], local[1]), UINT64_C(9510318385840434533));
    /* the explicit 16-byte form of the chain step */
    unsigned char b[16];
    le64_bytes(local[0], b);
    le64_bytes(local[1], b + 8);
    ck_assert_uint_eq(kvr_hash_xxh3(b, 16, 1337), seq[1]);
}
END_TEST

START_TEST(v92_tokens_1_12)
{
    uint32_t t[12];
    size_t n = iota(t, 1, 13);
    uint64_t local[3], seq[3];
    blocks_ok(t, n, 4, NULL, local, 3, 3);
    ck_assert_uint_eq(local[0], UINT64_C(14643705804678351452));
    ck_assert_uint_eq(local[1], UINT64_C(16777012769546811212));
    ck_assert_uint_eq(local[2], UINT64_C(483935686894639516));
    kvr_hash_chain(local, 3, seq);
    ck_assert_uint_eq(seq[0], UINT64_C(14643705804678351452));
    ck_assert_uint_eq(seq[1], UINT64_C(4945711292740353085));
    ck_assert_uint_eq(seq[2], UINT64_C(12583592247330656132));
}
END_TEST

/* ==== 9.3 trace-id blocks ==================================================================== */

START_TEST(v93_trace_ids)
{
    ck_assert_uint_eq(kvr_hash_trace_id(46, 512), UINT64_C(6010885096840287250));
    ck_assert_uint_eq(kvr_hash_trace_id(0, 128), UINT64_C(9536694438970776937));
    ck_assert_uint_eq(kvr_hash_trace_id(0, 16), UINT64_C(5523182284766269584));
    ck_assert_uint_eq(kvr_hash_trace_id(1, 16), UINT64_C(13518392937921988335));
    uint64_t local[2] = {kvr_hash_trace_id(0, 16), kvr_hash_trace_id(1, 16)};
    kvr_hash_chain(local, 2, local);
    ck_assert_uint_eq(local[1], UINT64_C(18334666815488455025));
}
END_TEST

/* trace_id(id, bs) equals hashing bs copies of token id as one block, for sizes around the
 * internal buffer size (the one-shot and the streaming paths). */
START_TEST(trace_id_matches_blocks)
{
    static uint32_t t[1024];
    const uint32_t sizes[] = {1, 2, 15, 16, 63, 64, 65, 127, 128, 129, 512, 1000};
    const uint32_t ids[] = {0, 1, 46, 0xFFFFFFFFu, 0x01020304u};
    for (size_t s = 0; s < sizeof(sizes) / sizeof(sizes[0]); s++) {
        for (size_t i = 0; i < sizeof(ids) / sizeof(ids[0]); i++) {
            for (uint32_t k = 0; k < sizes[s]; k++)
                t[k] = ids[i];
            uint64_t h;
            blocks_ok(t, sizes[s], sizes[s], NULL, &h, 1, 1);
            ck_assert_uint_eq(kvr_hash_trace_id(ids[i], sizes[s]), h);
        }
    }
    ck_assert_uint_eq(kvr_hash_trace_id(7, 0), kvr_hash_xxh3("", 0, 1337));
}
END_TEST

/* ==== 9.4 salts ============================================================================== */

START_TEST(v94_salts)
{
    ck_assert_uint_eq(kvr_hash_salt(NULL, 0, "adapter-a", 9), UINT64_C(8842669519798868182));
    ck_assert_uint_eq(kvr_hash_salt("tenant-a", 8, NULL, 0), UINT64_C(1948188790972764086));
    ck_assert_uint_eq(kvr_hash_salt("tenant-a", 8, "adapter-a", 9), UINT64_C(10790858310771630931));
    /* the formula, spelled out with wrapping additions */
    uint64_t want = 1337u + kvr_hash_xxh3("adapter-a", 9, 0) + kvr_hash_xxh3("tenant-a", 8, 1);
    ck_assert_uint_eq(kvr_hash_salt("tenant-a", 8, "adapter-a", 9), want);
}
END_TEST

START_TEST(salt_empty_is_absent)
{
    ck_assert_uint_eq(kvr_hash_salt(NULL, 0, NULL, 0), 1337u);
    ck_assert_uint_eq(kvr_hash_salt("", 0, "", 0), 1337u);
    ck_assert_uint_eq(kvr_hash_salt("", 0, "adapter-a", 9), kvr_hash_salt(NULL, 0, "adapter-a", 9));
    ck_assert_uint_eq(kvr_hash_salt("tenant-a", 8, "", 0), kvr_hash_salt("tenant-a", 8, NULL, 0));
    /* a non-NULL pointer with length 0 is empty too */
    ck_assert_uint_eq(kvr_hash_salt("tenant-a", 0, "adapter-a", 0), 1337u);
    /* the namespace uses seed 1, the LoRA seed 0: swapping the roles changes the value */
    ck_assert_uint_ne(kvr_hash_salt("x", 1, NULL, 0), kvr_hash_salt(NULL, 0, "x", 1));
}
END_TEST

/* ==== 9.5 extra set ========================================================================== */

START_TEST(v95_extra)
{
    uint32_t t[512];
    for (size_t i = 0; i < 512; i++)
        t[i] = 46;
    uint64_t h;
    blocks_ok(t, 512, 512, NULL, &h, 1, 1);
    ck_assert_uint_eq(h, UINT64_C(6010885096840287250));
    const uint32_t q[4] = {1, 2, 3, 4};
    blocks_ok(q, 4, 4, NULL, &h, 1, 1);
    ck_assert_uint_eq(h, UINT64_C(14643705804678351452));
}
END_TEST

/* ==== 9.6 derived ============================================================================ */

START_TEST(v96_lora_and_namespace)
{
    uint32_t t[8];
    size_t n = iota(t, 0, 8);
    struct kvr_hash_opts o = {0};
    uint64_t local[2];

    o.seed = kvr_hash_salt(NULL, 0, "adapter-a", 9);
    blocks_ok(t, n, 4, &o, local, 2, 2);
    ck_assert_uint_eq(local[0], UINT64_C(6665157333201000639));
    ck_assert_uint_eq(local[1], UINT64_C(11721812545976571723));
    /* the chain seed stays 1337 under a salt */
    ck_assert_uint_eq(kvr_hash_seq_next(local[0], local[1]), UINT64_C(13351519314849170528));

    o.seed = kvr_hash_salt("tenant-a", 8, NULL, 0);
    blocks_ok(t, 4, 4, &o, local, 2, 1);
    ck_assert_uint_eq(local[0], UINT64_C(17009624042690211646));

    o.seed = kvr_hash_salt("tenant-a", 8, "adapter-a", 9);
    blocks_ok(t, 4, 4, &o, local, 2, 1);
    ck_assert_uint_eq(local[0], UINT64_C(8269515957840517240));

    /* seed 0 in opts means 1337 */
    o.seed = 0;
    blocks_ok(t, 4, 4, &o, local, 2, 1);
    ck_assert_uint_eq(local[0], UINT64_C(9143094415614847814));
}
END_TEST

START_TEST(v96_eagle)
{
    uint32_t t[9];
    size_t n = iota(t, 0, 9);
    struct kvr_hash_opts o = {0};
    o.eagle = 1;
    uint64_t local[2];
    blocks_ok(t, n, 4, &o, local, 2, 2);
    ck_assert_uint_eq(local[0], UINT64_C(14562210786876287112));
    ck_assert_uint_eq(local[1], UINT64_C(15916330181359808192));
    /* windows of 5 tokens overlapping by one */
    unsigned char b[20];
    le32_bytes(t + 4, 5, b);
    ck_assert_uint_eq(kvr_hash_xxh3(b, 20, 1337), local[1]);
}
END_TEST

START_TEST(v96_mm)
{
    uint32_t t[4];
    iota(t, 0, 4);
    const uint64_t mmh[2] = {5, 3};
    struct kvr_block_mm mm = {mmh, 2};
    struct kvr_hash_opts o = {0};
    o.mm = &mm;
    o.n_mm_blocks = 1;
    uint64_t h;
    blocks_ok(t, 4, 4, &o, &h, 1, 1);
    ck_assert_uint_eq(h, UINT64_C(2427125067600827532));
    /* the byte string of the rule: le32(0..3) ++ le64(3) ++ le64(5) */
    unsigned char b[32];
    le32_bytes(t, 4, b);
    le64_bytes(3, b + 16);
    le64_bytes(5, b + 24);
    ck_assert_uint_eq(kvr_hash_xxh3(b, 32, 1337), h);
}
END_TEST

START_TEST(v96_mm_helpers)
{
    ck_assert_uint_eq(kvr_hash_mm_pad_value(UINT64_C(0xDEADBEEFCAFEF00D)), 185479757u);
    ck_assert_uint_eq(kvr_hash_mm_pad_value(0), 1000000u);
    ck_assert_uint_eq(kvr_hash_mm_pad_value((UINT64_C(1) << 30) - 1), 1000000u + ((1u << 30) - 1u));
    ck_assert_uint_eq(kvr_hash_mm_pad_value(UINT64_C(1) << 30), 1000000u);

    uint64_t v = 0;
    ck_assert_int_eq(kvr_hash_mm_identifier("abc", 3, &v), 1);
    ck_assert_uint_eq(v, UINT64_C(8696274497037089104));
    const char *hex64 = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
    ck_assert_int_eq(kvr_hash_mm_identifier(hex64, 64, &v), 1);
    ck_assert_uint_eq(v, UINT64_C(81985529216486895));
    ck_assert_uint_eq(v, UINT64_C(0x0123456789abcdef));
    /* upper-case hex digits are hex too */
    const char *hex64u = "FEDCBA9876543210ffffffffffffffffffffffffffffffffffffffffffffffff";
    ck_assert_int_eq(kvr_hash_mm_identifier(hex64u, 64, &v), 1);
    ck_assert_uint_eq(v, UINT64_C(0xFEDCBA9876543210));
    /* 64 characters with a non-hex one: hashed as a string */
    char bad[65];
    memcpy(bad, hex64, 65);
    bad[40] = 'g';
    ck_assert_int_eq(kvr_hash_mm_identifier(bad, 64, &v), 1);
    ck_assert_uint_eq(v, kvr_hash_xxh3(bad, 64, 0));
    /* 63 or 65 hex characters: hashed as a string */
    ck_assert_int_eq(kvr_hash_mm_identifier(hex64, 63, &v), 1);
    ck_assert_uint_eq(v, kvr_hash_xxh3(hex64, 63, 0));
    /* empty: none, *out untouched */
    v = SENTINEL;
    ck_assert_int_eq(kvr_hash_mm_identifier("", 0, &v), 0);
    ck_assert_int_eq(kvr_hash_mm_identifier(NULL, 0, &v), 0);
    ck_assert_uint_eq(v, SENTINEL);
}
END_TEST

START_TEST(v96_block_size_1)
{
    const uint32_t t[2] = {100, 200};
    uint64_t h[2];
    blocks_ok(t, 2, 1, NULL, h, 2, 2);
    ck_assert_uint_eq(h[0], UINT64_C(12915512876420934230));
    ck_assert_uint_eq(h[1], UINT64_C(16583448329610922042));
}
END_TEST

/* ==== edge cases ============================================================================= */

START_TEST(edge_block_size_zero)
{
    uint32_t t[8];
    size_t n = iota(t, 0, 8);
    uint64_t out[2] = {SENTINEL, SENTINEL};
    size_t n_out = 99;
    ck_assert_int_eq(kvr_hash_blocks(t, n, 0, NULL, out, 2, &n_out), KVR_OK);
    ck_assert_uint_eq(n_out, 0);
    ck_assert_uint_eq(out[0], SENTINEL);
    ck_assert_uint_eq(kvr_hash_block_count(8, 0, 0), 0);
    ck_assert_uint_eq(kvr_hash_block_count(8, 0, 1), 0);
    /* no tokens: no hashes, no access */
    ck_assert_int_eq(kvr_hash_blocks(NULL, 0, 4, NULL, NULL, 0, &n_out), KVR_OK);
    ck_assert_uint_eq(n_out, 0);
}
END_TEST

START_TEST(edge_partial_block_dropped)
{
    uint32_t t[11];
    uint64_t full[2], part[3] = {SENTINEL, SENTINEL, SENTINEL};
    iota(t, 0, 11);
    blocks_ok(t, 8, 4, NULL, full, 2, 2);
    for (size_t len = 8; len < 12; len++) {
        blocks_ok(t, len, 4, NULL, part, 3, 2);
        ck_assert_uint_eq(part[0], full[0]);
        ck_assert_uint_eq(part[1], full[1]);
        ck_assert_uint_eq(part[2], SENTINEL);
    }
    /* shorter than one block: nothing */
    blocks_ok(t, 3, 4, NULL, part, 3, 0);
    ck_assert_uint_eq(kvr_hash_block_count(7, 4, 0), 1);
    ck_assert_uint_eq(kvr_hash_block_count(8, 4, 0), 2);
}
END_TEST

START_TEST(edge_eagle_counts)
{
    /* floor((len - 1) / bs) for len >= 1 */
    ck_assert_uint_eq(kvr_hash_block_count(0, 4, 1), 0);
    ck_assert_uint_eq(kvr_hash_block_count(1, 4, 1), 0);
    ck_assert_uint_eq(kvr_hash_block_count(4, 4, 1), 0);
    ck_assert_uint_eq(kvr_hash_block_count(5, 4, 1), 1);
    ck_assert_uint_eq(kvr_hash_block_count(8, 4, 1), 1);
    ck_assert_uint_eq(kvr_hash_block_count(9, 4, 1), 2);
    ck_assert_uint_eq(kvr_hash_block_count(1, 1, 1), 0);
    ck_assert_uint_eq(kvr_hash_block_count(2, 1, 1), 1);
    /* an event of exactly n * bs tokens loses its last Eagle block */
    uint32_t t[8];
    iota(t, 0, 8);
    struct kvr_hash_opts o = {0};
    o.eagle = 1;
    uint64_t h[2] = {SENTINEL, SENTINEL};
    blocks_ok(t, 8, 4, &o, h, 2, 1);
    ck_assert_uint_eq(h[0], UINT64_C(14562210786876287112));
    ck_assert_uint_eq(h[1], SENTINEL);
    /* the Eagle block differs from the plain one */
    uint64_t plain;
    blocks_ok(t, 4, 4, NULL, &plain, 1, 1);
    ck_assert_uint_ne(plain, h[0]);
}
END_TEST

START_TEST(edge_mm_order_and_duplicates)
{
    uint32_t t[4];
    iota(t, 0, 4);
    struct kvr_hash_opts o = {0};
    struct kvr_block_mm mm;
    o.mm = &mm;
    o.n_mm_blocks = 1;
    uint64_t a, b, c, d;

    const uint64_t h35[2] = {3, 5}, h53[2] = {5, 3};
    mm = (struct kvr_block_mm){h35, 2};
    blocks_ok(t, 4, 4, &o, &a, 1, 1);
    mm = (struct kvr_block_mm){h53, 2};
    blocks_ok(t, 4, 4, &o, &b, 1, 1);
    ck_assert_uint_eq(a, b);

    /* duplicates are kept: {5,5} hashes two le64(5), unlike {5} */
    const uint64_t h55[2] = {5, 5}, h5[1] = {5};
    mm = (struct kvr_block_mm){h55, 2};
    blocks_ok(t, 4, 4, &o, &c, 1, 1);
    mm = (struct kvr_block_mm){h5, 1};
    blocks_ok(t, 4, 4, &o, &d, 1, 1);
    ck_assert_uint_ne(c, d);
    unsigned char bytes[32];
    le32_bytes(t, 4, bytes);
    le64_bytes(5, bytes + 16);
    le64_bytes(5, bytes + 24);
    ck_assert_uint_eq(kvr_hash_xxh3(bytes, 32, 1337), c);
    ck_assert_uint_eq(kvr_hash_xxh3(bytes, 24, 1337), d);

    /* the sort is unsigned: 2^63 + 1 sorts after 1 */
    const uint64_t big[3] = {(UINT64_C(1) << 63) + 1, 1, UINT64_MAX};
    mm = (struct kvr_block_mm){big, 3};
    blocks_ok(t, 4, 4, &o, &a, 1, 1);
    unsigned char b3[40];
    le32_bytes(t, 4, b3);
    le64_bytes(1, b3 + 16);
    le64_bytes((UINT64_C(1) << 63) + 1, b3 + 24);
    le64_bytes(UINT64_MAX, b3 + 32);
    ck_assert_uint_eq(kvr_hash_xxh3(b3, 40, 1337), a);

    /* the caller's array is not reordered */
    ck_assert_uint_eq(h53[0], 5);
    ck_assert_uint_eq(big[0], (UINT64_C(1) << 63) + 1);

    /* an empty mm info hashes like a plain block */
    mm = (struct kvr_block_mm){NULL, 0};
    blocks_ok(t, 4, 4, &o, &a, 1, 1);
    blocks_ok(t, 4, 4, NULL, &b, 1, 1);
    ck_assert_uint_eq(a, b);
}
END_TEST

START_TEST(edge_mm_per_block)
{
    uint32_t t[12];
    iota(t, 0, 12);
    uint64_t plain[3], with[3];
    blocks_ok(t, 12, 4, NULL, plain, 3, 3);
    const uint64_t h[1] = {42};
    struct kvr_block_mm mm[2] = {{NULL, 0}, {h, 1}};
    struct kvr_hash_opts o = {0};
    o.mm = mm;
    o.n_mm_blocks = 2; /* block 2 has no entry */
    blocks_ok(t, 12, 4, &o, with, 3, 3);
    ck_assert_uint_eq(with[0], plain[0]);
    ck_assert_uint_ne(with[1], plain[1]);
    ck_assert_uint_eq(with[2], plain[2]);
    unsigned char b[24];
    le32_bytes(t + 4, 4, b);
    le64_bytes(42, b + 16);
    ck_assert_uint_eq(kvr_hash_xxh3(b, 24, 1337), with[1]);

    /* mm entries beyond the block count are ignored */
    struct kvr_block_mm many[5] = {{NULL, 0}, {NULL, 0}, {NULL, 0}, {h, 1}, {h, 1}};
    o.mm = many;
    o.n_mm_blocks = 5;
    blocks_ok(t, 12, 4, &o, with, 3, 3);
    ck_assert_uint_eq(with[2], plain[2]);
}
END_TEST

START_TEST(edge_mm_invalid)
{
    uint32_t t[8];
    iota(t, 0, 8);
    uint64_t hs[65];
    for (size_t i = 0; i < 65; i++)
        hs[i] = i;
    struct kvr_block_mm mm[2] = {{hs, 64}, {hs, 65}};
    struct kvr_hash_opts o = {0};
    o.mm = mm;
    o.n_mm_blocks = 2;
    uint64_t out[2] = {SENTINEL, SENTINEL};
    size_t n_out = 0;
    ck_assert_int_eq(kvr_hash_blocks(t, 8, 4, &o, out, 2, &n_out), KVR_EINVAL);
    ck_assert_uint_eq(n_out, 2);
    ck_assert_uint_eq(out[0], SENTINEL); /* nothing written, not even the valid block 0 */
    /* 64 is the limit */
    mm[1].n_mm = 64;
    ck_assert_int_eq(kvr_hash_blocks(t, 8, 4, &o, out, 2, &n_out), KVR_OK);
    /* a NULL array with a count */
    mm[1] = (struct kvr_block_mm){NULL, 1};
    ck_assert_int_eq(kvr_hash_blocks(t, 8, 4, &o, out, 2, &n_out), KVR_EINVAL);
    /* the bad entry is past the last block: ignored */
    ck_assert_int_eq(kvr_hash_blocks(t, 4, 4, &o, out, 2, &n_out), KVR_OK);
    ck_assert_uint_eq(n_out, 1);
}
END_TEST

START_TEST(edge_erange)
{
    uint32_t t[12];
    iota(t, 0, 12);
    uint64_t out[3] = {SENTINEL, SENTINEL, SENTINEL};
    size_t n_out = 0;
    ck_assert_int_eq(kvr_hash_blocks(t, 12, 4, NULL, out, 2, &n_out), KVR_ERANGE);
    ck_assert_uint_eq(n_out, 3);
    ck_assert_uint_eq(out[0], SENTINEL);
    ck_assert_uint_eq(out[1], SENTINEL);
    ck_assert_int_eq(kvr_hash_blocks(t, 12, 4, NULL, NULL, 0, &n_out), KVR_ERANGE);
    ck_assert_uint_eq(n_out, 3);
    /* count-then-fill */
    ck_assert_int_eq(kvr_hash_blocks(t, 12, 4, NULL, out, n_out, &n_out), KVR_OK);
    uint64_t third;
    blocks_ok(t + 8, 4, 4, NULL, &third, 1, 1);
    ck_assert_uint_eq(out[2], third);
    /* NULL tokens with a count */
    ck_assert_int_eq(kvr_hash_blocks(NULL, 12, 4, NULL, out, 3, &n_out), KVR_EINVAL);
}
END_TEST

START_TEST(edge_chain)
{
    uint64_t v[4] = {11, 22, 33, 44}, out[4];
    kvr_hash_chain(v, 4, out);
    ck_assert_uint_eq(out[0], 11);
    ck_assert_uint_eq(out[1], kvr_hash_seq_next(11, 22));
    ck_assert_uint_eq(out[2], kvr_hash_seq_next(out[1], 33));
    ck_assert_uint_eq(out[3], kvr_hash_seq_next(out[2], 44));
    /* in place */
    kvr_hash_chain(v, 4, v);
    for (int i = 0; i < 4; i++)
        ck_assert_uint_eq(v[i], out[i]);
    /* n == 0 touches nothing */
    uint64_t z = SENTINEL;
    kvr_hash_chain(NULL, 0, &z);
    ck_assert_uint_eq(z, SENTINEL);
}
END_TEST

/* ==== oracle: random inputs against hand-built byte strings ================================== */

START_TEST(oracle_random)
{
    uint64_t s = test_seed();
    static uint32_t t[2100];
    static unsigned char bytes[(2100 + 1) * 4 + 64 * 8];
    uint64_t out[2100];
    for (int iter = 0; iter < 300; iter++) {
        uint32_t bs = 1 + (uint32_t)(rng_next(&s) % 70);
        size_t n = (size_t)(rng_next(&s) % 2000);
        int eagle = (int)(rng_next(&s) & 1);
        for (size_t i = 0; i < n; i++)
            t[i] = (uint32_t)rng_next(&s);
        uint64_t mmh[4]; /* filled in order: initializer evaluation order is unspecified */
        for (int i = 0; i < 4; i++)
            mmh[i] = rng_next(&s);
        struct kvr_block_mm mm[3] = {{NULL, 0}, {mmh, 4}, {mmh + 1, 2}};
        struct kvr_hash_opts o = {0};
        o.eagle = eagle;
        o.seed = (rng_next(&s) & 1) ? rng_next(&s) : 0;
        o.mm = mm;
        o.n_mm_blocks = 3;
        size_t n_out = 0;
        int rc = kvr_hash_blocks(t, n, bs, &o, out, 2100, &n_out);
        ck_assert_msg(rc == KVR_OK, "seed %llu iter %d: rc %d", (unsigned long long)test_seed(),
                      iter, rc);
        size_t w = bs + (size_t)(eagle ? 1 : 0);
        size_t want_n = 0;
        while (want_n * bs + w <= n)
            want_n++;
        ck_assert_msg(n_out == want_n, "seed %llu iter %d: %zu blocks, want %zu",
                      (unsigned long long)test_seed(), iter, n_out, want_n);
        uint64_t seed = o.seed ? o.seed : 1337;
        for (size_t k = 0; k < n_out; k++) {
            le32_bytes(t + k * bs, w, bytes);
            size_t len = w * 4;
            if (k == 1) {
                uint64_t srt[4];
                memcpy(srt, mmh, sizeof(srt));
                for (int i = 0; i < 4; i++)
                    for (int j = i + 1; j < 4; j++)
                        if (srt[j] < srt[i]) {
                            uint64_t x = srt[i];
                            srt[i] = srt[j];
                            srt[j] = x;
                        }
                for (int i = 0; i < 4; i++)
                    le64_bytes(srt[i], bytes + len + 8 * i);
                len += 32;
            } else if (k == 2) {
                uint64_t lo = mmh[1] < mmh[2] ? mmh[1] : mmh[2];
                uint64_t hi = mmh[1] < mmh[2] ? mmh[2] : mmh[1];
                le64_bytes(lo, bytes + len);
                le64_bytes(hi, bytes + len + 8);
                len += 16;
            }
            ck_assert_msg(out[k] == kvr_hash_xxh3(bytes, len, seed),
                          "seed %llu iter %d block %zu differs (bs %u, n %zu, eagle %d, len %zu)",
                          (unsigned long long)test_seed(), iter, k, bs, n, eagle, len);
        }
    }
}
END_TEST

Suite *hash_suite(void); /* called by check_main.c */

Suite *hash_suite(void)
{
    Suite *s = suite_create("hash");
    TCase *api = tcase_create("api");
    tcase_add_test(api, v91_primitives);
    tcase_add_test(api, v92_tokens_0_7);
    tcase_add_test(api, v92_tokens_1_12);
    tcase_add_test(api, v93_trace_ids);
    tcase_add_test(api, trace_id_matches_blocks);
    tcase_add_test(api, v94_salts);
    tcase_add_test(api, v95_extra);
    tcase_add_test(api, v96_lora_and_namespace);
    tcase_add_test(api, v96_eagle);
    tcase_add_test(api, v96_mm);
    tcase_add_test(api, v96_mm_helpers);
    tcase_add_test(api, v96_block_size_1);
    suite_add_tcase(s, api);

    TCase *edge = tcase_create("edge");
    tcase_add_test(edge, salt_empty_is_absent);
    tcase_add_test(edge, edge_block_size_zero);
    tcase_add_test(edge, edge_partial_block_dropped);
    tcase_add_test(edge, edge_eagle_counts);
    tcase_add_test(edge, edge_mm_order_and_duplicates);
    tcase_add_test(edge, edge_mm_per_block);
    tcase_add_test(edge, edge_mm_invalid);
    tcase_add_test(edge, edge_erange);
    tcase_add_test(edge, edge_chain);
    suite_add_tcase(s, edge);

    TCase *oracle = tcase_create("oracle");
    tcase_add_test(oracle, oracle_random);
    suite_add_tcase(s, oracle);
    return s;
}
