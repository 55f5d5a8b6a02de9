/* test_event_msgpack.c - engine KV-event batch decoding and encoding (engine/src/event_msgpack.c,
 * event_msgpack_enc.c; spec/engine-events.md §4-§6, §9, §10). Hand-made payloads are built with
 * msgpack-c's packer, independently of the encoder under test. */
#include <check.h>
#include <msgpack.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvr/err.h"
#include "kvr/event_msgpack.h"
#include "vectors.h"

#define DEADBEEF 0xDEADBEEFCAFEF00DULL

/* ==== helpers ================================================================================ */

struct pk {
    msgpack_sbuffer sb;
    msgpack_packer p;
};

static void pk_init(struct pk *k)
{
    msgpack_sbuffer_init(&k->sb);
    msgpack_packer_init(&k->p, &k->sb, msgpack_sbuffer_write);
}

static void pk_done(struct pk *k)
{
    msgpack_sbuffer_destroy(&k->sb);
}

static void S(msgpack_packer *p, const char *s)
{
    msgpack_pack_str_with_body(p, s, strlen(s));
}

struct fx {
    kvr_alloc_t a;
    struct kvr_emp_batch b;
    struct kvr_emp_counters c;
    int kind;
    char err[256];
};

static void fx_init(struct fx *f)
{
    memset(f, 0, sizeof(*f));
    kvr_alloc_init(&f->a);
    kvr_emp_batch_init(&f->b, &f->a);
}

static void fx_free(struct fx *f)
{
    kvr_emp_batch_free(&f->b);
    ck_assert_uint_eq(f->a.live_allocs, 0);
    ck_assert_uint_eq(f->a.live_bytes, 0);
}

/* Decodes from an exact-size heap copy (ASan sees any read past the frame). */
static int dec_lim(struct fx *f, const void *p, size_t len, const struct kvr_emp_limits *lim)
{
    uint8_t *copy = kvr_test_dup(p, len);
    int rc = kvr_emp_decode(&f->b, copy, len, lim, &f->c, &f->kind, f->err, sizeof(f->err));
    free(copy);
    return rc;
}

static int dec(struct fx *f, const void *p, size_t len)
{
    return dec_lim(f, p, len, NULL);
}

static int dec_pk(struct fx *f, struct pk *k)
{
    return dec(f, k->sb.data, k->sb.size);
}

static uint8_t *vector(const char *name, size_t *len)
{
    char rel[256];
    snprintf(rel, sizeof(rel), "kv-events-vectors/%s", name);
    uint8_t *p = kvr_test_read_data(rel, len);
    ck_assert_msg(p != NULL, "cannot read test vector %s (KVR_TEST_DATA)", rel);
    return p;
}

static int str_is(const struct kvr_emp_str *s, const char *want)
{
    return s->p != NULL && s->len == strlen(want) && memcmp(s->p, want, s->len) == 0;
}

/* A minimal BlockStored map: hashes [h0], tokens 1..4, block size 4, medium GPU, + `extra`
 * additional key/value pairs that the caller packs right after this call. */
static void stored_map(msgpack_packer *p, uint64_t h0, uint32_t extra)
{
    msgpack_pack_map(p, 8 + extra);
    S(p, "type");
    S(p, "BlockStored");
    S(p, "block_hashes");
    msgpack_pack_array(p, 1);
    msgpack_pack_uint64(p, h0);
    S(p, "parent_block_hash");
    msgpack_pack_nil(p);
    S(p, "token_ids");
    msgpack_pack_array(p, 4);
    for (int t = 1; t <= 4; t++)
        msgpack_pack_uint32(p, (uint32_t)t);
    S(p, "block_size");
    msgpack_pack_uint32(p, 4);
    S(p, "lora_id");
    msgpack_pack_nil(p);
    S(p, "medium");
    S(p, "GPU");
    S(p, "lora_name");
    msgpack_pack_nil(p);
}

/* [1.0, [ <n events follow> ], 0] : packs the header and the array header for n events. */
static void batch_head(msgpack_packer *p, uint32_t n)
{
    msgpack_pack_array(p, 3);
    msgpack_pack_double(p, 1.0);
    msgpack_pack_array(p, n);
}

static uint64_t lcg(uint64_t *x)
{
    *x = *x * 6364136223846793005ULL + 1442695040888963407ULL;
    return *x >> 33;
}

/* ==== §9 vectors ============================================================================== */

START_TEST(test_vector_v1)
{
    struct fx f;
    size_t len;
    fx_init(&f);
    uint8_t *v = vector("vllm_map_v1_blockstored.msgpack", &len);
    ck_assert_uint_eq(len, 130);
    ck_assert_int_eq(dec(&f, v, len), KVR_OK);
    ck_assert(f.b.ts == 1.5);
    ck_assert(f.b.has_dp_rank && f.b.dp_rank == 0);
    ck_assert_uint_eq(f.b.dialect, KVR_EMP_DIALECT_B);
    ck_assert_uint_eq(f.b.n, 1);
    const struct kvr_emp_event *e = &f.b.ev[0];
    ck_assert_int_eq(e->kind, KVR_EVENT_STORED);
    ck_assert_uint_eq(e->n_hashes, 1);
    ck_assert_uint_eq(e->hashes[0], DEADBEEF);
    ck_assert_uint_eq(e->hashes[0], 16045690984503111693ULL);
    ck_assert(!e->has_parent);
    ck_assert_uint_eq(e->n_tokens, 4);
    ck_assert_uint_eq(e->token_width, 1);
    for (uint32_t t = 0; t < 4; t++)
        ck_assert_uint_eq(e->token_ids[t], t + 1);
    ck_assert_uint_eq(e->block_size, 4);
    ck_assert(!e->has_lora_id);
    ck_assert(str_is(&e->medium, "GPU"));
    ck_assert_int_eq(e->tier, KVR_TIER_DEVICE);
    ck_assert_ptr_null(e->lora_name.p);
    ck_assert_ptr_null(e->cache_salt.p);
    ck_assert(!e->has_group_idx);
    ck_assert_uint_eq(e->n_mm_blocks, 0);
    ck_assert_uint_eq(f.c.batches, 1);
    ck_assert_uint_eq(f.c.events[KVR_EVENT_STORED], 1);
    ck_assert_uint_eq(f.c.dialect[2], 1);
    free(v);
    fx_free(&f);
}
END_TEST

START_TEST(test_vector_v2)
{
    struct fx f;
    size_t len;
    fx_init(&f);
    uint8_t *v = vector("vllm_map_v2_stored_removed_cleared.msgpack", &len);
    ck_assert_uint_eq(len, 224);
    ck_assert_int_eq(dec(&f, v, len), KVR_OK);
    ck_assert(f.b.ts == 2.0);
    ck_assert(f.b.has_dp_rank && f.b.dp_rank == 1);
    ck_assert_uint_eq(f.b.n, 3);
    const struct kvr_emp_event *s = &f.b.ev[0], *r = &f.b.ev[1], *c = &f.b.ev[2];
    ck_assert_int_eq(s->kind, KVR_EVENT_STORED);
    ck_assert_uint_eq(s->n_hashes, 2);
    ck_assert_uint_eq(s->hashes[0], 7);
    ck_assert_uint_eq(s->hashes[1], 300);
    ck_assert(s->has_parent && s->parent_hash == DEADBEEF);
    ck_assert_uint_eq(s->n_tokens, 8);
    for (uint32_t t = 0; t < 8; t++)
        ck_assert_uint_eq(s->token_ids[t], t + 5);
    ck_assert_uint_eq(s->block_size, 4);
    ck_assert(s->has_group_idx && s->group_idx == 0);
    ck_assert_int_eq(s->tier, KVR_TIER_DEVICE);
    ck_assert_int_eq(r->kind, KVR_EVENT_REMOVED);
    ck_assert_uint_eq(r->n_hashes, 1);
    ck_assert_uint_eq(r->hashes[0], DEADBEEF);
    ck_assert(str_is(&r->medium, "GPU"));
    ck_assert_int_eq(c->kind, KVR_EVENT_CLEARED);
    ck_assert_uint_eq(f.c.events[KVR_EVENT_STORED], 1);
    ck_assert_uint_eq(f.c.events[KVR_EVENT_REMOVED], 1);
    ck_assert_uint_eq(f.c.events[KVR_EVENT_CLEARED], 1);
    ck_assert_uint_eq(f.c.tier[KVR_TIER_DEVICE], 2);
    free(v);
    fx_free(&f);
}
END_TEST

START_TEST(test_vector_v3)
{
    struct fx f;
    size_t len;
    fx_init(&f);
    uint8_t *v = vector("legacy_array_v3_signed_hashes.msgpack", &len);
    ck_assert_uint_eq(len, 78);
    ck_assert_int_eq(dec(&f, v, len), KVR_OK);
    ck_assert(f.b.ts == 0.25);
    ck_assert(!f.b.has_dp_rank);
    ck_assert_uint_eq(f.b.dialect, KVR_EMP_DIALECT_A);
    ck_assert_uint_eq(f.b.n, 3);
    const struct kvr_emp_event *s = &f.b.ev[0], *r = &f.b.ev[1];
    ck_assert_int_eq(s->kind, KVR_EVENT_STORED);
    ck_assert_uint_eq(s->n_hashes, 2);
    ck_assert_uint_eq(s->hashes[0], 18446744073709551614ULL);
    ck_assert_uint_eq(s->hashes[1], 65536);
    ck_assert(!s->has_parent);
    ck_assert_uint_eq(s->n_tokens, 2);
    ck_assert_uint_eq(s->token_ids[0], 100);
    ck_assert_uint_eq(s->token_ids[1], 200);
    ck_assert_uint_eq(s->block_size, 1);
    ck_assert(str_is(&s->medium, "GPU"));
    ck_assert_ptr_null(s->lora_name.p);
    ck_assert_int_eq(r->kind, KVR_EVENT_REMOVED);
    ck_assert_uint_eq(r->n_hashes, 1);
    ck_assert_uint_eq(r->hashes[0], 18446744073709551614ULL);
    ck_assert_ptr_null(r->medium.p);
    ck_assert_int_eq(r->tier, KVR_TIER_DEVICE);
    ck_assert_int_eq(f.b.ev[2].kind, KVR_EVENT_CLEARED);
    ck_assert_uint_eq(f.c.dialect[1], 1);
    free(v);
    fx_free(&f);
}
END_TEST

/* ==== §10 negative and robustness ============================================================= */

/* §10.1: V1 minus its last byte (and every other strict prefix) fails cleanly. */
START_TEST(test_truncated_prefixes)
{
    struct fx f;
    size_t len;
    fx_init(&f);
    uint8_t *v = vector("vllm_map_v1_blockstored.msgpack", &len);
    ck_assert_int_eq(dec(&f, v, len - 1), KVR_ECORRUPT);
    ck_assert_int_eq(f.kind, KVR_EMP_E_TRUNCATED);
    ck_assert_uint_eq(f.b.n, 0);
    for (size_t cut = 0; cut < len; cut++) {
        ck_assert_int_eq(dec(&f, v, cut), KVR_ECORRUPT);
        ck_assert_uint_eq(f.b.n, 0);
        ck_assert(f.err[0] != '\0');
    }
    ck_assert_uint_eq(f.c.failed, len + 1);
    ck_assert_uint_eq(f.c.batches, 0);
    free(v);
    fx_free(&f);
}
END_TEST

/* §10.2: one trailing byte: rejected. */
START_TEST(test_trailing_byte)
{
    struct fx f;
    size_t len;
    fx_init(&f);
    uint8_t *v = vector("vllm_map_v1_blockstored.msgpack", &len);
    uint8_t *w = malloc(len + 1);
    memcpy(w, v, len);
    w[len] = 0x00;
    ck_assert_int_eq(dec(&f, w, len + 1), KVR_ECORRUPT);
    ck_assert_int_eq(f.kind, KVR_EMP_E_TRAILING);
    ck_assert_uint_eq(f.b.n, 0);
    ck_assert_uint_eq(f.c.errors[KVR_EMP_E_TRAILING], 1);
    ck_assert_uint_eq(f.c.failed_by_dialect[2], 1);
    free(w);
    free(v);
    fx_free(&f);
}
END_TEST

/* §10.3: an unknown tag between two valid events is skipped; both others are kept. */
START_TEST(test_unknown_tag_skipped)
{
    struct fx f;
    struct pk k;
    fx_init(&f);
    pk_init(&k);
    batch_head(&k.p, 4);
    stored_map(&k.p, 11, 0);
    msgpack_pack_map(&k.p, 2);
    S(&k.p, "type");
    S(&k.p, "BlockFoo");
    S(&k.p, "payload");
    msgpack_pack_array(&k.p, 2);
    msgpack_pack_uint32(&k.p, 1);
    msgpack_pack_map(&k.p, 0);
    msgpack_pack_array(&k.p, 3); /* a positional unknown tag as well */
    S(&k.p, "BlockBar");
    msgpack_pack_nil(&k.p);
    msgpack_pack_uint32(&k.p, 5);
    stored_map(&k.p, 22, 0);
    msgpack_pack_uint32(&k.p, 0);
    ck_assert_int_eq(dec_pk(&f, &k), KVR_OK);
    ck_assert_uint_eq(f.b.n, 2);
    ck_assert_uint_eq(f.b.ev[0].hashes[0], 11);
    ck_assert_uint_eq(f.b.ev[1].hashes[0], 22);
    ck_assert_uint_eq(f.b.skipped, 2);
    ck_assert_uint_eq(f.c.unknown_tag, 2);
    ck_assert_uint_eq(f.b.dialect, KVR_EMP_DIALECT_A | KVR_EMP_DIALECT_B);
    pk_done(&k);
    fx_free(&f);
}
END_TEST

/* §10.4: unknown extra map keys (any value shape, anywhere) are ignored, as is key order. */
START_TEST(test_unknown_keys_ignored)
{
    struct fx f;
    struct pk k;
    fx_init(&f);
    pk_init(&k);
    batch_head(&k.p, 1);
    msgpack_pack_map(&k.p, 7);
    S(&k.p, "foo");
    msgpack_pack_uint32(&k.p, 1);
    S(&k.p, "token_ids");
    msgpack_pack_array(&k.p, 2);
    msgpack_pack_uint32(&k.p, 9);
    msgpack_pack_uint32(&k.p, 8);
    msgpack_pack_uint32(&k.p, 77); /* a non-string key: ignored with its value */
    msgpack_pack_array(&k.p, 1);
    msgpack_pack_nil(&k.p);
    S(&k.p, "block_size");
    msgpack_pack_uint32(&k.p, 2);
    S(&k.p, "nested");
    msgpack_pack_map(&k.p, 1);
    S(&k.p, "x");
    msgpack_pack_array(&k.p, 0);
    S(&k.p, "block_hashes");
    msgpack_pack_array(&k.p, 1);
    msgpack_pack_uint32(&k.p, 5);
    S(&k.p, "type"); /* the tag last: still found */
    S(&k.p, "BlockStored");
    msgpack_pack_nil(&k.p);
    ck_assert_int_eq(dec_pk(&f, &k), KVR_OK);
    ck_assert_uint_eq(f.b.n, 1);
    ck_assert_uint_eq(f.b.ev[0].hashes[0], 5);
    ck_assert_uint_eq(f.b.ev[0].n_tokens, 2);
    ck_assert_uint_eq(f.b.ev[0].block_size, 2);
    ck_assert(!f.b.ev[0].has_parent); /* absent parent = root */
    ck_assert_ptr_null(f.b.ev[0].medium.p);
    ck_assert(!f.b.has_dp_rank);
    pk_done(&k);
    fx_free(&f);
}
END_TEST

/* §10.7: the outer batch as a map (era C) and as a 2-element array (no rank). */
START_TEST(test_outer_map_and_short_array)
{
    struct fx f;
    struct pk k;
    fx_init(&f);
    pk_init(&k);
    msgpack_pack_map(&k.p, 4);
    S(&k.p, "data_parallel_rank");
    msgpack_pack_uint32(&k.p, 3);
    S(&k.p, "unknown");
    msgpack_pack_true(&k.p);
    S(&k.p, "events");
    msgpack_pack_array(&k.p, 1);
    stored_map(&k.p, 42, 0);
    S(&k.p, "ts");
    msgpack_pack_double(&k.p, 7.5);
    ck_assert_int_eq(dec_pk(&f, &k), KVR_OK);
    ck_assert_uint_eq(f.b.dialect, KVR_EMP_DIALECT_C);
    ck_assert(f.b.ts == 7.5);
    ck_assert(f.b.has_dp_rank && f.b.dp_rank == 3);
    ck_assert_uint_eq(f.b.n, 1);
    ck_assert_uint_eq(f.b.ev[0].hashes[0], 42);
    ck_assert_uint_eq(f.c.dialect[3], 1);
    pk_done(&k);

    pk_init(&k);
    msgpack_pack_array(&k.p, 2);
    msgpack_pack_double(&k.p, 1.25);
    msgpack_pack_array(&k.p, 1);
    msgpack_pack_array(&k.p, 1);
    S(&k.p, "AllBlocksCleared");
    ck_assert_int_eq(dec_pk(&f, &k), KVR_OK);
    ck_assert(!f.b.has_dp_rank);
    ck_assert_uint_eq(f.b.n, 1);
    ck_assert_int_eq(f.b.ev[0].kind, KVR_EVENT_CLEARED);
    pk_done(&k);

    /* extra trailing elements of the outer array are ignored; a nil rank is "none" */
    pk_init(&k);
    msgpack_pack_array(&k.p, 5);
    msgpack_pack_float(&k.p, 0.5f);
    msgpack_pack_array(&k.p, 0);
    msgpack_pack_nil(&k.p);
    S(&k.p, "future");
    msgpack_pack_array(&k.p, 1);
    msgpack_pack_nil(&k.p);
    ck_assert_int_eq(dec_pk(&f, &k), KVR_OK);
    ck_assert(f.b.ts == 0.5);
    ck_assert(!f.b.has_dp_rank);
    ck_assert_uint_eq(f.b.n, 0);
    pk_done(&k);
    fx_free(&f);
}
END_TEST

/* §10.8 and §5: hashes as bin8 of 32 bytes (last 8 bytes big-endian), negative ints, bytes < 8. */
START_TEST(test_hash_forms)
{
    struct fx f;
    struct pk k;
    uint8_t digest[32];
    for (int i = 0; i < 32; i++)
        digest[i] = (uint8_t)(0xa0 + i);
    fx_init(&f);
    pk_init(&k);
    batch_head(&k.p, 2);
    msgpack_pack_array(&k.p, 7);
    S(&k.p, "BlockStored");
    msgpack_pack_array(&k.p, 4);
    msgpack_pack_bin_with_body(&k.p, digest, 32);
    msgpack_pack_int64(&k.p, -3488128144981237669LL);
    msgpack_pack_int8(&k.p, -2);
    msgpack_pack_bin_with_body(&k.p, "\x01\x02", 2);
    msgpack_pack_bin_with_body(&k.p, digest + 1, 32 - 1); /* parent as 31 bytes */
    msgpack_pack_array(&k.p, 4);
    for (int t = 0; t < 4; t++)
        msgpack_pack_uint32(&k.p, 1);
    msgpack_pack_uint32(&k.p, 1);
    msgpack_pack_nil(&k.p);
    S(&k.p, "GPU");
    msgpack_pack_array(&k.p, 2);
    S(&k.p, "BlockRemoved");
    msgpack_pack_array(&k.p, 1);
    msgpack_pack_bin_with_body(&k.p, digest, 32);
    msgpack_pack_nil(&k.p);
    ck_assert_int_eq(dec_pk(&f, &k), KVR_OK);
    const struct kvr_emp_event *e = &f.b.ev[0];
    ck_assert_uint_eq(e->hashes[0], 0xb8b9babbbcbdbebfULL);
    ck_assert_uint_eq(e->hashes[1], 14958615928728313947ULL); /* hashing.md §9.7 */
    ck_assert_uint_eq(e->hashes[2], 0xFFFFFFFFFFFFFFFEULL);
    ck_assert_uint_eq(e->hashes[3], 0x0102);
    ck_assert(e->has_parent && e->parent_hash == 0xb8b9babbbcbdbebfULL);
    ck_assert_uint_eq(f.b.ev[1].hashes[0], 0xb8b9babbbcbdbebfULL);
    ck_assert_uint_eq(kvr_emp_hash_from_bytes(digest, 32), 0xb8b9babbbcbdbebfULL);
    pk_done(&k);

    /* empty or > 64-byte hashes, floats and strings are not hashes */
    const char *bad[] = {"empty", "long", "float", "str"};
    for (int i = 0; i < 4; i++) {
        uint8_t big[65] = {0};
        pk_init(&k);
        batch_head(&k.p, 1);
        msgpack_pack_array(&k.p, 2);
        S(&k.p, "BlockRemoved");
        msgpack_pack_array(&k.p, 2);
        msgpack_pack_uint32(&k.p, 1);
        if (i == 0)
            msgpack_pack_bin_with_body(&k.p, big, 0);
        else if (i == 1)
            msgpack_pack_bin_with_body(&k.p, big, 65);
        else if (i == 2)
            msgpack_pack_double(&k.p, 1.0);
        else
            S(&k.p, "abc");
        msgpack_pack_nil(&k.p);
        ck_assert_msg(dec_pk(&f, &k) == KVR_ECORRUPT, "%s accepted", bad[i]);
        ck_assert_int_eq(f.kind, i < 2 ? KVR_EMP_E_VALUE : KVR_EMP_E_TYPE);
        if (i == 3)
            ck_assert_str_eq(f.err, "events[0].block_hashes[1]: expected int or bytes, got str");
        pk_done(&k);
    }
    fx_free(&f);
}
END_TEST

/* §10.12: legacy index 7 holding SGLang's metadata map instead of lora_name. */
START_TEST(test_legacy_index7_map)
{
    struct fx f;
    struct pk k;
    fx_init(&f);
    pk_init(&k);
    batch_head(&k.p, 2);
    for (int variant = 0; variant < 2; variant++) {
        msgpack_pack_array(&k.p, 8);
        S(&k.p, "BlockStored");
        msgpack_pack_array(&k.p, 1);
        msgpack_pack_int64(&k.p, -7);
        msgpack_pack_nil(&k.p);
        msgpack_pack_array(&k.p, 2);
        msgpack_pack_uint32(&k.p, 1);
        msgpack_pack_uint32(&k.p, 2);
        msgpack_pack_uint32(&k.p, 2);
        msgpack_pack_nil(&k.p);
        S(&k.p, "CPU_PINNED");
        if (variant == 0) {
            msgpack_pack_map(&k.p, 2);
            S(&k.p, "other");
            msgpack_pack_uint32(&k.p, 5);
            S(&k.p, "cache_salt");
            S(&k.p, "tenant-a");
        } else {
            S(&k.p, "adapter-a");
        }
    }
    msgpack_pack_nil(&k.p);
    ck_assert_int_eq(dec_pk(&f, &k), KVR_OK);
    ck_assert_uint_eq(f.b.n, 2);
    ck_assert(str_is(&f.b.ev[0].cache_salt, "tenant-a"));
    ck_assert_ptr_null(f.b.ev[0].lora_name.p);
    ck_assert_int_eq(f.b.ev[0].tier, KVR_TIER_HOST_PINNED);
    ck_assert(str_is(&f.b.ev[1].lora_name, "adapter-a"));
    ck_assert_ptr_null(f.b.ev[1].cache_salt.p);
    ck_assert_str_eq(f.b.ev[1].lora_name.p, "adapter-a"); /* NUL-terminated copy */
    pk_done(&k);
    fx_free(&f);
}
END_TEST

/* Legacy index 9: int/nil = group_idx; array = Dynamo's block_mm_infos. */
START_TEST(test_legacy_index9_and_mm)
{
    struct fx f;
    struct pk k;
    char hex[65];
    snprintf(hex, sizeof(hex), "%016llx%048d", 0x0123456789abcdefULL, 7);
    fx_init(&f);
    pk_init(&k);
    batch_head(&k.p, 2);
    /* [tag, hashes, parent, tokens, bs, lora_id, medium, lora_name, extra_keys, group_idx] */
    msgpack_pack_array(&k.p, 10);
    S(&k.p, "BlockStored");
    msgpack_pack_array(&k.p, 2);
    msgpack_pack_uint32(&k.p, 1);
    msgpack_pack_uint32(&k.p, 2);
    msgpack_pack_nil(&k.p);
    msgpack_pack_array(&k.p, 4);
    for (int t = 0; t < 4; t++)
        msgpack_pack_uint32(&k.p, 3);
    msgpack_pack_uint32(&k.p, 2);
    msgpack_pack_int32(&k.p, 5);
    S(&k.p, "GPU");
    msgpack_pack_nil(&k.p);
    msgpack_pack_array(&k.p, 2); /* extra_keys: [None, (hex, "adapter", 17)] */
    msgpack_pack_nil(&k.p);
    msgpack_pack_array(&k.p, 3);
    S(&k.p, hex);
    S(&k.p, "adapter");
    msgpack_pack_uint32(&k.p, 17);
    msgpack_pack_uint32(&k.p, 3); /* group_idx */
    /* block_mm_infos at index 9: [nil, {"mm_objects": [{"mm_hash": 5, "offsets": [[0, 1]]},
     * [3, []]]}] */
    msgpack_pack_array(&k.p, 10);
    S(&k.p, "BlockStored");
    msgpack_pack_array(&k.p, 2);
    msgpack_pack_uint32(&k.p, 1);
    msgpack_pack_uint32(&k.p, 2);
    msgpack_pack_nil(&k.p);
    msgpack_pack_array(&k.p, 4);
    for (int t = 0; t < 4; t++)
        msgpack_pack_uint32(&k.p, 3);
    msgpack_pack_uint32(&k.p, 2);
    msgpack_pack_nil(&k.p);
    msgpack_pack_nil(&k.p);
    msgpack_pack_nil(&k.p);
    msgpack_pack_nil(&k.p);
    msgpack_pack_array(&k.p, 2);
    msgpack_pack_nil(&k.p);
    msgpack_pack_map(&k.p, 1);
    S(&k.p, "mm_objects");
    msgpack_pack_array(&k.p, 2);
    msgpack_pack_map(&k.p, 2);
    S(&k.p, "mm_hash");
    msgpack_pack_uint32(&k.p, 5);
    S(&k.p, "offsets");
    msgpack_pack_array(&k.p, 1);
    msgpack_pack_array(&k.p, 2);
    msgpack_pack_uint32(&k.p, 0);
    msgpack_pack_uint32(&k.p, 1);
    msgpack_pack_array(&k.p, 2);
    msgpack_pack_uint32(&k.p, 3);
    msgpack_pack_array(&k.p, 0);
    msgpack_pack_nil(&k.p);
    ck_assert_int_eq(dec_pk(&f, &k), KVR_OK);
    const struct kvr_emp_event *a = &f.b.ev[0], *b = &f.b.ev[1];
    ck_assert(a->has_lora_id && a->lora_id == 5);
    ck_assert(a->has_group_idx && a->group_idx == 3);
    ck_assert_int_eq(a->mm_source, KVR_EMP_MM_EXTRA_KEYS);
    ck_assert_uint_eq(a->n_mm_blocks, 2);
    ck_assert_uint_eq(a->mm_off[0], 0);
    ck_assert_uint_eq(a->mm_off[1], 0);
    ck_assert_uint_eq(a->mm_off[2], 1);
    ck_assert_uint_eq(a->mm_hashes[0], 0x0123456789abcdefULL);
    ck_assert(!b->has_group_idx);
    ck_assert_int_eq(b->mm_source, KVR_EMP_MM_BLOCK_INFOS);
    ck_assert_uint_eq(b->n_mm_blocks, 2);
    ck_assert_uint_eq(b->mm_off[1], 0);
    ck_assert_uint_eq(b->mm_off[2], 2);
    ck_assert_uint_eq(b->mm_hashes[0], 5);
    ck_assert_uint_eq(b->mm_hashes[1], 3);
    pk_done(&k);
    fx_free(&f);
}
END_TEST

/* Typed extra keys (vLLM RFC #55487): mm, cache_salt, lora. */
START_TEST(test_typed_extra_keys)
{
    struct fx f;
    struct pk k;
    char hex[65];
    snprintf(hex, sizeof(hex), "%016llx%048d", 0xfeedULL, 0);
    fx_init(&f);
    pk_init(&k);
    batch_head(&k.p, 1);
    stored_map(&k.p, 1, 1);
    S(&k.p, "extra_keys");
    msgpack_pack_array(&k.p, 1);
    msgpack_pack_array(&k.p, 3);
    msgpack_pack_map(&k.p, 2);
    S(&k.p, "mm_hash");
    S(&k.p, hex);
    S(&k.p, "type");
    S(&k.p, "mm");
    msgpack_pack_map(&k.p, 2);
    S(&k.p, "type");
    S(&k.p, "cache_salt");
    S(&k.p, "value");
    S(&k.p, "tenant-b");
    msgpack_pack_map(&k.p, 2);
    S(&k.p, "type");
    S(&k.p, "prompt_embeds");
    S(&k.p, "value");
    msgpack_pack_uint32(&k.p, 9);
    msgpack_pack_nil(&k.p);
    ck_assert_int_eq(dec_pk(&f, &k), KVR_OK);
    const struct kvr_emp_event *e = &f.b.ev[0];
    ck_assert_int_eq(e->mm_source, KVR_EMP_MM_EXTRA_KEYS);
    ck_assert_uint_eq(e->n_mm_blocks, 1);
    ck_assert_uint_eq(e->mm_off[1], 1);
    ck_assert_uint_eq(e->mm_hashes[0], 0xfeed);
    ck_assert(str_is(&e->cache_salt, "tenant-b"));
    pk_done(&k);

    /* [None] (what vLLM emits for a plain block) carries nothing */
    pk_init(&k);
    batch_head(&k.p, 1);
    stored_map(&k.p, 1, 1);
    S(&k.p, "extra_keys");
    msgpack_pack_array(&k.p, 1);
    msgpack_pack_nil(&k.p);
    msgpack_pack_nil(&k.p);
    ck_assert_int_eq(dec_pk(&f, &k), KVR_OK);
    ck_assert_int_eq(f.b.ev[0].mm_source, KVR_EMP_MM_NONE);
    ck_assert_uint_eq(f.b.ev[0].n_mm_blocks, 0);
    pk_done(&k);
    fx_free(&f);
}
END_TEST

/* §10.13: every integer in 9-byte cf/d3 form (and ts as float32) decodes identically to V2. */
START_TEST(test_non_minimal_integers)
{
    struct fx f;
    struct pk k;
    size_t len;
    fx_init(&f);
    uint8_t *v = vector("vllm_map_v2_stored_removed_cleared.msgpack", &len);
    pk_init(&k);
    msgpack_pack_array(&k.p, 3);
    msgpack_pack_float(&k.p, 2.0f);
    msgpack_pack_array(&k.p, 3);
    msgpack_pack_map(&k.p, 9);
    S(&k.p, "type");
    S(&k.p, "BlockStored");
    S(&k.p, "block_hashes");
    msgpack_pack_array(&k.p, 2);
    msgpack_pack_fix_int64(&k.p, 7);
    msgpack_pack_fix_uint64(&k.p, 300);
    S(&k.p, "parent_block_hash");
    msgpack_pack_fix_uint64(&k.p, DEADBEEF);
    S(&k.p, "token_ids");
    msgpack_pack_array(&k.p, 8);
    for (uint64_t t = 5; t <= 12; t++)
        msgpack_pack_fix_uint64(&k.p, t);
    S(&k.p, "block_size");
    msgpack_pack_fix_int64(&k.p, 4);
    S(&k.p, "lora_id");
    msgpack_pack_nil(&k.p);
    S(&k.p, "medium");
    S(&k.p, "GPU");
    S(&k.p, "lora_name");
    msgpack_pack_nil(&k.p);
    S(&k.p, "group_idx");
    msgpack_pack_fix_int64(&k.p, 0);
    msgpack_pack_map(&k.p, 3);
    S(&k.p, "type");
    S(&k.p, "BlockRemoved");
    S(&k.p, "block_hashes");
    msgpack_pack_array(&k.p, 1);
    msgpack_pack_fix_uint64(&k.p, DEADBEEF);
    S(&k.p, "medium");
    S(&k.p, "GPU");
    msgpack_pack_map(&k.p, 1);
    S(&k.p, "type");
    S(&k.p, "AllBlocksCleared");
    msgpack_pack_fix_uint64(&k.p, 1);
    ck_assert_uint_gt(k.sb.size, len);

    struct fx g;
    fx_init(&g);
    ck_assert_int_eq(dec_pk(&f, &k), KVR_OK);
    ck_assert_int_eq(dec(&g, v, len), KVR_OK);
    ck_assert(f.b.ts == g.b.ts);
    ck_assert_uint_eq(f.b.dp_rank, g.b.dp_rank);
    ck_assert_uint_eq(f.b.n, g.b.n);
    for (uint32_t e = 0; e < f.b.n; e++) {
        const struct kvr_emp_event *x = &f.b.ev[e], *y = &g.b.ev[e];
        ck_assert_int_eq(x->kind, y->kind);
        ck_assert_uint_eq(x->n_hashes, y->n_hashes);
        for (uint32_t h = 0; h < x->n_hashes; h++)
            ck_assert_uint_eq(x->hashes[h], y->hashes[h]);
        ck_assert_uint_eq(x->has_parent, y->has_parent);
        ck_assert_uint_eq(x->parent_hash, y->parent_hash);
        ck_assert_uint_eq(x->n_tokens, y->n_tokens);
        for (uint32_t t = 0; t < x->n_tokens; t++)
            ck_assert_uint_eq(x->token_ids[t], y->token_ids[t]);
        ck_assert_uint_eq(x->block_size, y->block_size);
        ck_assert_uint_eq(x->has_group_idx, y->has_group_idx);
        ck_assert_int_eq(x->group_idx, y->group_idx);
    }
    pk_done(&k);
    free(v);
    fx_free(&g);
    fx_free(&f);
}
END_TEST

/* A BlockStored whose token count does not match its block count still decodes (the converter
 * decides: see test_event_convert.c); the counts are preserved exactly. */
START_TEST(test_token_count_mismatch_preserved)
{
    struct fx f;
    struct pk k;
    fx_init(&f);
    pk_init(&k);
    batch_head(&k.p, 1);
    msgpack_pack_array(&k.p, 7);
    S(&k.p, "BlockStored");
    msgpack_pack_array(&k.p, 3);
    for (int h = 0; h < 3; h++)
        msgpack_pack_uint32(&k.p, (uint32_t)(h + 1));
    msgpack_pack_nil(&k.p);
    msgpack_pack_array(&k.p, 5); /* 3 blocks x 4 would be 12 */
    for (int t = 0; t < 5; t++)
        msgpack_pack_uint32(&k.p, (uint32_t)t);
    msgpack_pack_uint32(&k.p, 4);
    msgpack_pack_nil(&k.p);
    S(&k.p, "GPU");
    msgpack_pack_nil(&k.p);
    ck_assert_int_eq(dec_pk(&f, &k), KVR_OK);
    ck_assert_uint_eq(f.b.ev[0].n_hashes, 3);
    ck_assert_uint_eq(f.b.ev[0].n_tokens, 5);
    pk_done(&k);
    fx_free(&f);
}
END_TEST

/* Wrong types, each with the path of the offending item. */
START_TEST(test_wrong_types)
{
    struct fx f;
    struct pk k;
    fx_init(&f);

    pk_init(&k); /* batch is a string */
    S(&k.p, "hello");
    ck_assert_int_eq(dec_pk(&f, &k), KVR_ECORRUPT);
    ck_assert_int_eq(f.kind, KVR_EMP_E_TYPE);
    ck_assert_str_eq(f.err, "batch: expected array or map (batch), got str");
    pk_done(&k);

    pk_init(&k); /* events is a map */
    msgpack_pack_array(&k.p, 3);
    msgpack_pack_double(&k.p, 1);
    msgpack_pack_map(&k.p, 0);
    msgpack_pack_nil(&k.p);
    ck_assert_int_eq(dec_pk(&f, &k), KVR_ECORRUPT);
    ck_assert_str_eq(f.err, "events: expected array, got map");
    pk_done(&k);

    pk_init(&k); /* ts is a string */
    msgpack_pack_array(&k.p, 2);
    S(&k.p, "now");
    msgpack_pack_array(&k.p, 0);
    ck_assert_int_eq(dec_pk(&f, &k), KVR_ECORRUPT);
    ck_assert_str_eq(f.err, "ts: expected float, got str");
    pk_done(&k);

    pk_init(&k); /* an event that is an int */
    batch_head(&k.p, 2);
    stored_map(&k.p, 1, 0);
    msgpack_pack_uint32(&k.p, 5);
    msgpack_pack_nil(&k.p);
    ck_assert_int_eq(dec_pk(&f, &k), KVR_ECORRUPT);
    ck_assert_str_eq(f.err, "events[1]: expected map or array (event), got int");
    ck_assert_uint_eq(f.b.n, 0); /* all or nothing */
    pk_done(&k);

    pk_init(&k); /* a token id that is a string */
    batch_head(&k.p, 1);
    stored_map(&k.p, 1, 0);
    msgpack_pack_nil(&k.p);
    /* patch: rebuild by hand with a bad token */
    pk_done(&k);
    pk_init(&k);
    batch_head(&k.p, 1);
    msgpack_pack_map(&k.p, 4);
    S(&k.p, "type");
    S(&k.p, "BlockStored");
    S(&k.p, "block_hashes");
    msgpack_pack_array(&k.p, 1);
    msgpack_pack_uint32(&k.p, 1);
    S(&k.p, "token_ids");
    msgpack_pack_array(&k.p, 2);
    msgpack_pack_uint32(&k.p, 1);
    S(&k.p, "x");
    S(&k.p, "block_size");
    msgpack_pack_uint32(&k.p, 2);
    msgpack_pack_nil(&k.p);
    ck_assert_int_eq(dec_pk(&f, &k), KVR_ECORRUPT);
    ck_assert_str_eq(f.err, "events[0].token_ids[1]: expected int, got str");
    pk_done(&k);

    pk_init(&k); /* block_size as a string, medium as an int, tag as an int */
    for (int which = 0; which < 4; which++) {
        msgpack_sbuffer_clear(&k.sb);
        batch_head(&k.p, 1);
        msgpack_pack_array(&k.p, 7);
        if (which == 2)
            msgpack_pack_uint32(&k.p, 1);
        else
            S(&k.p, "BlockStored");
        msgpack_pack_array(&k.p, 1);
        msgpack_pack_uint32(&k.p, 1);
        if (which == 3)
            S(&k.p, "parent");
        else
            msgpack_pack_nil(&k.p);
        msgpack_pack_array(&k.p, 0);
        if (which == 0)
            S(&k.p, "16");
        else
            msgpack_pack_uint32(&k.p, 16);
        msgpack_pack_nil(&k.p);
        if (which == 1)
            msgpack_pack_uint32(&k.p, 1);
        else
            S(&k.p, "GPU");
        msgpack_pack_nil(&k.p);
        ck_assert_int_eq(dec_pk(&f, &k), KVR_ECORRUPT);
        ck_assert_int_eq(f.kind, KVR_EMP_E_TYPE);
        static const char *const want[] = {
            "events[0].block_size: expected int, got str",
            "events[0].medium: expected str or nil, got int",
            "events[0].type: expected str tag, got int",
            "events[0].parent_block_hash: expected int or bytes, got str",
        };
        ck_assert_str_eq(f.err, want[which]);
    }
    pk_done(&k);
    ck_assert_uint_eq(f.c.errors[KVR_EMP_E_TYPE], 9);
    ck_assert_uint_eq(f.c.batches, 0);
    fx_free(&f);
}
END_TEST

/* Bad values, missing fields, duplicates, reserved bytes. */
START_TEST(test_bad_values_and_missing)
{
    struct fx f;
    struct pk k;
    fx_init(&f);
    pk_init(&k);

    /* block_size 0; negative token; token > u32; negative rank; missing token_ids; duplicate key;
     * map without "type"; empty positional event; short positional BlockStored */
    static const char *const want[] = {
        "events[0].block_size: must be positive",
        "events[0].token_ids[0]: negative token id -1",
        "events[0].token_ids[0]: token id 4294967296 exceeds u32",
        "data_parallel_rank: negative value -1",
        "events[0].token_ids: missing",
        "events[0].block_hashes: duplicate key",
        "events[0].type: missing",
        "events[0].type: empty event (no tag)",
        "events[0].token_ids: missing",
    };
    static const int kinds[] = {KVR_EMP_E_VALUE,   KVR_EMP_E_VALUE,   KVR_EMP_E_VALUE,
                                KVR_EMP_E_VALUE,   KVR_EMP_E_MISSING, KVR_EMP_E_VALUE,
                                KVR_EMP_E_MISSING, KVR_EMP_E_MISSING, KVR_EMP_E_MISSING};
    for (int c = 0; c < 9; c++) {
        msgpack_sbuffer_clear(&k.sb);
        batch_head(&k.p, 1);
        msgpack_packer *p = &k.p;
        if (c <= 3) {
            msgpack_pack_map(p, 4);
            S(p, "type");
            S(p, "BlockStored");
            S(p, "block_hashes");
            msgpack_pack_array(p, 0);
            S(p, "token_ids");
            msgpack_pack_array(p, 1);
            if (c == 1)
                msgpack_pack_int32(p, -1);
            else if (c == 2)
                msgpack_pack_uint64(p, 1ULL << 32);
            else
                msgpack_pack_uint32(p, 1);
            S(p, "block_size");
            msgpack_pack_uint32(p, c == 0 ? 0 : 1);
        } else if (c == 4) {
            msgpack_pack_map(p, 3);
            S(p, "type");
            S(p, "BlockStored");
            S(p, "block_hashes");
            msgpack_pack_array(p, 0);
            S(p, "block_size");
            msgpack_pack_uint32(p, 1);
        } else if (c == 5) {
            msgpack_pack_map(p, 3);
            S(p, "type");
            S(p, "BlockRemoved");
            S(p, "block_hashes");
            msgpack_pack_array(p, 0);
            S(p, "block_hashes");
            msgpack_pack_array(p, 0);
        } else if (c == 6) {
            msgpack_pack_map(p, 1);
            S(p, "block_hashes");
            msgpack_pack_array(p, 0);
        } else if (c == 7) {
            msgpack_pack_array(p, 0);
        } else {
            msgpack_pack_array(p, 3);
            S(p, "BlockStored");
            msgpack_pack_array(p, 0);
            msgpack_pack_nil(p);
        }
        if (c == 3)
            msgpack_pack_int32(p, -1);
        else
            msgpack_pack_nil(p);
        ck_assert_int_eq(dec_pk(&f, &k), KVR_ECORRUPT);
        ck_assert_str_eq(f.err, want[c]);
        ck_assert_int_eq(f.kind, kinds[c]);
    }

    /* a 0xc1 byte where a value should be */
    const uint8_t reserved[] = {0x92, 0xcb, 0, 0, 0, 0, 0, 0, 0, 0, 0xc1};
    ck_assert_int_eq(dec(&f, reserved, sizeof(reserved)), KVR_ECORRUPT);
    ck_assert_int_eq(f.kind, KVR_EMP_E_VALUE);
    ck_assert_str_eq(f.err, "events: reserved byte 0xc1");
    /* empty input */
    ck_assert_int_eq(dec(&f, "", 0), KVR_ECORRUPT);
    ck_assert_int_eq(f.kind, KVR_EMP_E_TRUNCATED);
    ck_assert_int_eq(kvr_emp_decode(&f.b, NULL, 0, NULL, NULL, NULL, NULL, 0), KVR_ECORRUPT);
    ck_assert_uint_eq(f.c.failed, 11);
    pk_done(&k);
    fx_free(&f);
}
END_TEST

/* Oversized arrays and strings: errors, never allocations. */
START_TEST(test_limits)
{
    struct fx f;
    struct pk k;
    struct kvr_emp_limits lim = {4, 3, 8, 5};
    fx_init(&f);
    pk_init(&k);

    batch_head(&k.p, 5); /* 5 events > 4 */
    for (int e = 0; e < 5; e++) {
        msgpack_pack_array(&k.p, 1);
        S(&k.p, "AllBlocksCleared");
    }
    msgpack_pack_nil(&k.p);
    ck_assert_int_eq(dec_lim(&f, k.sb.data, k.sb.size, &lim), KVR_ECORRUPT);
    ck_assert_int_eq(f.kind, KVR_EMP_E_LIMIT);
    ck_assert_str_eq(f.err, "events: 5 events exceed the limit 4");
    lim.max_events = 5;
    ck_assert_int_eq(dec_lim(&f, k.sb.data, k.sb.size, &lim), KVR_OK);

    msgpack_sbuffer_clear(&k.sb); /* 4 hashes > 3; 9 tokens > 8; 6-byte medium > 5 */
    for (int which = 0; which < 3; which++) {
        msgpack_sbuffer_clear(&k.sb);
        batch_head(&k.p, 1);
        msgpack_pack_array(&k.p, 7);
        S(&k.p, "BlockStored");
        msgpack_pack_array(&k.p, which == 0 ? 4 : 1);
        for (int h = 0; h < (which == 0 ? 4 : 1); h++)
            msgpack_pack_uint32(&k.p, 1);
        msgpack_pack_nil(&k.p);
        msgpack_pack_array(&k.p, which == 1 ? 9 : 1);
        for (int t = 0; t < (which == 1 ? 9 : 1); t++)
            msgpack_pack_uint32(&k.p, 1);
        msgpack_pack_uint32(&k.p, 1);
        msgpack_pack_nil(&k.p);
        S(&k.p, which == 2 ? "STORAG" : "GPU");
        msgpack_pack_nil(&k.p);
        ck_assert_int_eq(dec_lim(&f, k.sb.data, k.sb.size, &lim), KVR_ECORRUPT);
        ck_assert_int_eq(f.kind, KVR_EMP_E_LIMIT);
    }
    ck_assert_str_eq(f.err, "events[0].medium: string of 6 bytes exceeds the limit 5");

    /* hostile headers: array32 of 4 Gi events / hashes / tokens in a few bytes */
    const uint8_t h1[] = {0x92, 0x00, 0xdd, 0xff, 0xff, 0xff, 0xff};
    ck_assert_int_eq(dec(&f, h1, sizeof(h1)), KVR_ECORRUPT);
    ck_assert_int_eq(f.kind, KVR_EMP_E_TRUNCATED);
    const uint8_t h2[] = {0x92, 0x00, 0x91, 0x92, 0xac, 'B',  'l',  'o',  'c',  'k',  'R', 'e',
                          'm',  'o',  'v',  'e',  'd',  0xdd, 0x7f, 0xff, 0xff, 0xff, 0x01};
    size_t before = f.a.peak_bytes;
    ck_assert_int_eq(dec(&f, h2, sizeof(h2)), KVR_ECORRUPT);
    ck_assert_int_eq(f.kind, KVR_EMP_E_TRUNCATED);
    ck_assert_uint_le(f.a.peak_bytes, before + 65536); /* nothing sized from the header */
    /* within the bytes but above the default limit */
    size_t n = KVR_EMP_DEFAULT_MAX_HASHES + 1;
    msgpack_sbuffer_clear(&k.sb);
    batch_head(&k.p, 1);
    msgpack_pack_array(&k.p, 2);
    S(&k.p, "BlockRemoved");
    msgpack_pack_array(&k.p, (uint32_t)n);
    for (size_t h = 0; h < n; h++)
        msgpack_pack_uint32(&k.p, 1);
    msgpack_pack_nil(&k.p);
    ck_assert_int_eq(dec(&f, k.sb.data, k.sb.size), KVR_ECORRUPT);
    ck_assert_int_eq(f.kind, KVR_EMP_E_LIMIT);
    pk_done(&k);
    fx_free(&f);
}
END_TEST

/* §6 medium -> tier; locality REMOTE/unknown -> dropped and counted. */
START_TEST(test_medium_and_locality)
{
    struct fx f;
    struct pk k;
    static const struct {
        const char *medium;
        int tier;
        int known;
    } media[] = {
        {"GPU", KVR_TIER_DEVICE, 1},        {"device", KVR_TIER_DEVICE, 1},
        {"CPU", KVR_TIER_HOST_PINNED, 1},   {"CPU_TIER1", KVR_TIER_HOST_PINNED, 1},
        {"CPU_TIER2", KVR_TIER_DISK, 1},    {"DISK", KVR_TIER_DISK, 1},
        {"NVME", KVR_TIER_DISK, 1},         {"STORAGE", KVR_TIER_DISK, 1},
        {"EXTERNAL", KVR_TIER_EXTERNAL, 1}, {"NETWORK", KVR_TIER_EXTERNAL, 1},
        {"REMOTE", KVR_TIER_EXTERNAL, 1},   {"SHARED", KVR_TIER_EXTERNAL, 1},
        {"TAPE", KVR_TIER_DEVICE, 0},
    };
    for (size_t m = 0; m < sizeof(media) / sizeof(media[0]); m++) {
        int tier = -1;
        ck_assert_int_eq(kvr_emp_medium_tier(media[m].medium, strlen(media[m].medium), &tier),
                         media[m].known);
        ck_assert_int_eq(tier, media[m].tier);
    }
    int tier = -1;
    ck_assert_int_eq(kvr_emp_medium_tier(NULL, 0, &tier), 1);
    ck_assert_int_eq(tier, KVR_TIER_DEVICE);

    fx_init(&f);
    pk_init(&k);
    batch_head(&k.p, 5);
    const char *loc[] = {NULL, "LOCAL", "REMOTE", "SOMEWHERE", NULL};
    const char *med[] = {"DISK", "GPU", "GPU", "GPU", "TAPE"};
    for (int e = 0; e < 5; e++) {
        msgpack_pack_map(&k.p, loc[e] ? 4 : 3);
        S(&k.p, "type");
        S(&k.p, "BlockRemoved");
        S(&k.p, "block_hashes");
        msgpack_pack_array(&k.p, 1);
        msgpack_pack_uint32(&k.p, (uint32_t)e);
        S(&k.p, "medium");
        S(&k.p, med[e]);
        if (loc[e]) {
            S(&k.p, "locality");
            S(&k.p, loc[e]);
        }
    }
    msgpack_pack_nil(&k.p);
    ck_assert_int_eq(dec_pk(&f, &k), KVR_OK);
    ck_assert_uint_eq(f.b.n, 3);
    ck_assert_int_eq(f.b.ev[0].tier, KVR_TIER_DISK);
    ck_assert_uint_eq(f.b.ev[1].hashes[0], 1);
    ck_assert_uint_eq(f.b.ev[2].hashes[0], 4);
    ck_assert_int_eq(f.b.ev[2].tier, KVR_TIER_DEVICE);
    ck_assert_uint_eq(f.c.locality_dropped, 2);
    ck_assert_uint_eq(f.c.unknown_medium, 1);
    ck_assert_uint_eq(f.c.tier[KVR_TIER_DISK], 1);
    ck_assert_uint_eq(f.c.tier[KVR_TIER_DEVICE], 2);
    pk_done(&k);
    fx_free(&f);
}
END_TEST

/* SGLang EAGLE bigram token_ids: 2-element arrays per token. */
START_TEST(test_bigram_tokens)
{
    struct fx f;
    struct pk k;
    fx_init(&f);
    pk_init(&k);
    batch_head(&k.p, 1);
    msgpack_pack_array(&k.p, 5);
    S(&k.p, "BlockStored");
    msgpack_pack_array(&k.p, 1);
    msgpack_pack_int64(&k.p, -5);
    msgpack_pack_nil(&k.p);
    msgpack_pack_array(&k.p, 2);
    for (uint32_t t = 0; t < 2; t++) {
        msgpack_pack_array(&k.p, 2);
        msgpack_pack_uint32(&k.p, 10 + t);
        msgpack_pack_uint32(&k.p, 11 + t);
    }
    msgpack_pack_uint32(&k.p, 2);
    msgpack_pack_nil(&k.p);
    ck_assert_int_eq(dec_pk(&f, &k), KVR_OK);
    const struct kvr_emp_event *e = &f.b.ev[0];
    ck_assert_uint_eq(e->token_width, 2);
    ck_assert_uint_eq(e->n_tokens, 2);
    ck_assert_uint_eq(e->token_ids[0], 10);
    ck_assert_uint_eq(e->token_ids[1], 11);
    ck_assert_uint_eq(e->token_ids[2], 11);
    ck_assert_uint_eq(e->token_ids[3], 12);
    pk_done(&k);

    pk_init(&k); /* mixing forms is an error */
    batch_head(&k.p, 1);
    msgpack_pack_array(&k.p, 5);
    S(&k.p, "BlockStored");
    msgpack_pack_array(&k.p, 0);
    msgpack_pack_nil(&k.p);
    msgpack_pack_array(&k.p, 2);
    msgpack_pack_array(&k.p, 2);
    msgpack_pack_uint32(&k.p, 1);
    msgpack_pack_uint32(&k.p, 2);
    msgpack_pack_uint32(&k.p, 3);
    msgpack_pack_uint32(&k.p, 2);
    msgpack_pack_nil(&k.p);
    ck_assert_int_eq(dec_pk(&f, &k), KVR_ECORRUPT);
    ck_assert_str_eq(f.err, "events[0].token_ids[1]: expected 2-element array (bigram token), "
                            "got int");
    pk_done(&k);
    fx_free(&f);
}
END_TEST

/* Seeded byte mutations of the three vectors: every result is KVR_OK or KVR_ECORRUPT with an
 * error kind and message, never a crash or a read past the frame (ASan builds). */
START_TEST(test_random_mutations)
{
    static const char *const names[] = {"vllm_map_v1_blockstored.msgpack",
                                        "vllm_map_v2_stored_removed_cleared.msgpack",
                                        "legacy_array_v3_signed_hashes.msgpack"};
    uint64_t seed = kvr_test_seed(0x4d55), x = seed;
    struct fx f;
    fx_init(&f);
    size_t ok = 0, bad = 0;
    for (int v = 0; v < 3; v++) {
        size_t len;
        uint8_t *orig = vector(names[v], &len);
        for (int round = 0; round < 3000; round++) {
            uint8_t *m = kvr_test_dup(orig, len);
            int flips = 1 + (int)(lcg(&x) % 4);
            for (int k = 0; k < flips; k++) {
                size_t at = lcg(&x) % len;
                switch (lcg(&x) % 3) {
                case 0:
                    m[at] = (uint8_t)lcg(&x);
                    break;
                case 1:
                    m[at] ^= (uint8_t)(1u << (lcg(&x) % 8));
                    break;
                default: /* a container/str header byte with a big length */
                    m[at] =
                        (uint8_t[]){0xdc, 0xdd, 0xde, 0xdf, 0xda, 0xdb, 0xc6, 0xc1}[lcg(&x) % 8];
                }
            }
            size_t cut = (lcg(&x) % 4 == 0) ? lcg(&x) % (len + 1) : len;
            int rc = dec(&f, m, cut);
            ck_assert_msg(rc == KVR_OK || rc == KVR_ECORRUPT, "seed %llu: rc %d",
                          (unsigned long long)seed, rc);
            if (rc == KVR_OK) {
                ok++;
            } else {
                bad++;
                ck_assert_int_ne(f.kind, KVR_EMP_E_NONE);
                ck_assert(f.err[0] != '\0');
                ck_assert_uint_eq(f.b.n, 0);
            }
            free(m);
        }
        free(orig);
    }
    ck_assert_uint_gt(ok, 0);
    ck_assert_uint_gt(bad, 0);
    ck_assert_uint_eq(f.c.batches, ok);
    ck_assert_uint_eq(f.c.failed, bad);
    fx_free(&f);
}
END_TEST

/* ==== oom ==================================================================================== */

START_TEST(test_oom_every_allocation)
{
    size_t len;
    uint8_t *v = vector("vllm_map_v2_stored_removed_cleared.msgpack", &len);
    int saw_nomem = 0;
    for (uint64_t n = 1; n < 64; n++) {
        struct fx f;
        fx_init(&f);
        kvr_alloc_fail_after(&f.a, n);
        int rc = dec(&f, v, len);
        if (rc == KVR_ENOMEM) {
            saw_nomem = 1;
            ck_assert_int_eq(f.kind, KVR_EMP_E_NOMEM);
            ck_assert_uint_eq(f.b.n, 0);
            /* the batch stays usable */
            kvr_alloc_fail_after(&f.a, 0);
            ck_assert_int_eq(dec(&f, v, len), KVR_OK);
            ck_assert_uint_eq(f.b.n, 3);
        } else {
            ck_assert_int_eq(rc, KVR_OK);
        }
        fx_free(&f);
    }
    ck_assert(saw_nomem);
    free(v);
}
END_TEST

/* ==== encoder (oracle: the decoder and the msgspec-produced vectors) ========================== */

static uint8_t *encode(struct fx *f, int era, size_t *len)
{
    uint8_t *out = NULL;
    ck_assert_int_eq(kvr_emp_encode(&f->b, era, &f->a, &out, len), KVR_OK);
    return out;
}

/* V1 and V2 re-encode byte for byte (the encoder follows msgspec's rules). */
START_TEST(test_encode_matches_msgspec)
{
    const char *names[] = {"vllm_map_v1_blockstored.msgpack",
                           "vllm_map_v2_stored_removed_cleared.msgpack"};
    for (int i = 0; i < 2; i++) {
        struct fx f;
        size_t len, out_len;
        fx_init(&f);
        uint8_t *v = vector(names[i], &len);
        ck_assert_int_eq(dec(&f, v, len), KVR_OK);
        uint8_t *out = encode(&f, KVR_EMP_ERA_B, &out_len);
        ck_assert_uint_eq(out_len, len);
        ck_assert_mem_eq(out, v, len);
        kvr_free(&f.a, out);
        free(v);
        fx_free(&f);
    }
}
END_TEST

static void assert_same_batch(const struct kvr_emp_batch *x, const struct kvr_emp_batch *y)
{
    ck_assert(x->ts == y->ts);
    ck_assert_uint_eq(x->has_dp_rank, y->has_dp_rank);
    ck_assert_uint_eq(x->dp_rank, y->dp_rank);
    ck_assert_uint_eq(x->n, y->n);
    for (uint32_t e = 0; e < x->n; e++) {
        const struct kvr_emp_event *a = &x->ev[e], *b = &y->ev[e];
        ck_assert_int_eq(a->kind, b->kind);
        ck_assert_int_eq(a->tier, b->tier);
        ck_assert_uint_eq(a->n_hashes, b->n_hashes);
        if (a->n_hashes)
            ck_assert_mem_eq(a->hashes, b->hashes, a->n_hashes * sizeof(uint64_t));
        ck_assert_uint_eq(a->has_parent, b->has_parent);
        ck_assert_uint_eq(a->parent_hash, b->parent_hash);
        ck_assert_uint_eq(a->token_width, b->token_width);
        ck_assert_uint_eq(a->n_tokens, b->n_tokens);
        if (a->n_tokens)
            ck_assert_mem_eq(a->token_ids, b->token_ids,
                             (size_t)a->n_tokens * a->token_width * sizeof(uint32_t));
        ck_assert_uint_eq(a->block_size, b->block_size);
        ck_assert_uint_eq(a->has_lora_id, b->has_lora_id);
        ck_assert_int_eq(a->lora_id, b->lora_id);
        ck_assert_uint_eq(a->has_group_idx, b->has_group_idx);
        ck_assert_int_eq(a->group_idx, b->group_idx);
        ck_assert_uint_eq(a->has_sliding_window, b->has_sliding_window);
        ck_assert_int_eq(a->sliding_window, b->sliding_window);
        ck_assert_uint_eq(a->event_version, b->event_version);
        const struct kvr_emp_str *sa[] = {&a->medium, &a->lora_name, &a->cache_salt, &a->spec_kind,
                                          &a->locality};
        const struct kvr_emp_str *sb[] = {&b->medium, &b->lora_name, &b->cache_salt, &b->spec_kind,
                                          &b->locality};
        for (int s = 0; s < 5; s++) {
            ck_assert_int_eq(sa[s]->p == NULL, sb[s]->p == NULL);
            if (sa[s]->p)
                ck_assert_str_eq(sa[s]->p, sb[s]->p);
        }
        ck_assert_uint_eq(a->n_mm_blocks, b->n_mm_blocks);
        if (a->n_mm_blocks) {
            ck_assert_mem_eq(a->mm_off, b->mm_off, (a->n_mm_blocks + 1) * sizeof(uint32_t));
            ck_assert_mem_eq(a->mm_hashes, b->mm_hashes,
                             a->mm_off[a->n_mm_blocks] * sizeof(uint64_t));
        }
    }
}

/* A seeded pseudo-random batch using every optional field, through all three eras. */
START_TEST(test_encode_roundtrip_all_eras)
{
    uint64_t seed = kvr_test_seed(0x5eed), x = seed;
#define RND() lcg(&x)
    for (int round = 0; round < 50; round++) {
        struct kvr_emp_event ev[6];
        uint64_t hashes[6][5];
        uint32_t tokens[6][40];
        uint32_t off[6][6];
        uint64_t mm[6][8];
        memset(ev, 0, sizeof(ev));
        struct kvr_emp_batch in;
        memset(&in, 0, sizeof(in));
        in.ts = (double)RND() / 1024.0;
        in.has_dp_rank = RND() & 1;
        in.dp_rank = in.has_dp_rank ? (uint32_t)(RND() % 9) : 0;
        in.n = (uint32_t)(RND() % 7);
        in.ev = ev;
        for (uint32_t e = 0; e < in.n; e++) {
            struct kvr_emp_event *v = &ev[e];
            v->kind = (uint8_t)(1 + RND() % 3);
            v->event_version = 1;
            v->token_width = 1;
            if (v->kind == KVR_EVENT_CLEARED)
                continue;
            v->n_hashes = (uint32_t)(RND() % 6);
            for (uint32_t h = 0; h < v->n_hashes; h++) {
                uint64_t hi = RND();
                hashes[e][h] = hi << 31 ^ RND();
            }
            v->hashes = hashes[e];
            if (RND() & 1) {
                v->medium.p = (RND() & 1) ? "GPU" : "CPU";
                v->medium.len = 3;
                v->tier = v->medium.p[0] == 'G' ? KVR_TIER_DEVICE : KVR_TIER_HOST_PINNED;
            }
            if (RND() % 3 == 0) {
                v->has_group_idx = 1;
                v->group_idx = (int64_t)(RND() % 3);
            }
            if (RND() % 4 == 0) {
                v->spec_kind.p = "full_attention";
                v->spec_kind.len = 14;
            }
            if (RND() % 4 == 0) {
                v->has_sliding_window = 1;
                v->sliding_window = 4096;
            }
            if (v->kind == KVR_EVENT_REMOVED) {
                if (RND() % 4 == 0) {
                    v->locality.p = "LOCAL";
                    v->locality.len = 5;
                }
                continue;
            }
            v->block_size = (uint32_t)(1 + RND() % 4);
            v->token_width = (RND() % 5 == 0) ? 2 : 1;
            v->n_tokens = v->n_hashes * v->block_size;
            if (v->n_tokens == 0)
                v->token_width = 1; /* an empty list has no form */
            for (uint32_t t = 0; t < v->n_tokens * v->token_width; t++)
                tokens[e][t] = (uint32_t)RND();
            v->token_ids = tokens[e];
            v->has_parent = RND() & 1;
            v->parent_hash = v->has_parent ? RND() : 0;
            if (RND() & 1) {
                v->has_lora_id = 1;
                v->lora_id = (int64_t)(RND() % 5);
            }
            if (RND() % 3 == 0) {
                v->lora_name.p = "adapter-a";
                v->lora_name.len = 9;
            }
            if (v->lora_name.p == NULL && RND() % 3 == 0) { /* era A has one slot for both */
                v->cache_salt.p = "tenant-a";
                v->cache_salt.len = 8;
            }
            if (v->n_hashes > 0 && RND() % 3 == 0) {
                uint32_t m = 0;
                for (uint32_t b = 0; b < v->n_hashes; b++) {
                    off[e][b] = m;
                    if (RND() & 1)
                        mm[e][m++] = RND() << 20 | 1;
                }
                off[e][v->n_hashes] = m;
                if (m > 0) {
                    v->n_mm_blocks = v->n_hashes;
                    v->mm_off = off[e];
                    v->mm_hashes = mm[e];
                    v->mm_source = KVR_EMP_MM_EXTRA_KEYS;
                }
            }
        }
        for (int era = KVR_EMP_ERA_B; era <= KVR_EMP_ERA_C; era++) {
            struct fx f;
            size_t len;
            uint8_t *out = NULL;
            fx_init(&f);
            ck_assert_int_eq(kvr_emp_encode(&in, era, &f.a, &out, &len), KVR_OK);
            ck_assert_msg(dec(&f, out, len) == KVR_OK, "seed %llu era %d: %s",
                          (unsigned long long)seed, era, f.err);
            unsigned want = era == KVR_EMP_ERA_A   ? KVR_EMP_DIALECT_A
                            : era == KVR_EMP_ERA_C ? KVR_EMP_DIALECT_C
                                                   : KVR_EMP_DIALECT_B;
            int any_event = in.n > 0;
            if (any_event || era == KVR_EMP_ERA_C)
                ck_assert_uint_eq(f.b.dialect, want);
            assert_same_batch(&in, &f.b);
            kvr_free(&f.a, out);
            fx_free(&f);
        }
    }
#undef RND
}
END_TEST

START_TEST(test_encode_v3_legacy_roundtrip)
{
    struct fx f, g;
    size_t len, out_len;
    fx_init(&f);
    fx_init(&g);
    uint8_t *v = vector("legacy_array_v3_signed_hashes.msgpack", &len);
    ck_assert_int_eq(dec(&f, v, len), KVR_OK);
    uint8_t *out = encode(&f, KVR_EMP_ERA_A, &out_len);
    ck_assert_int_eq(dec(&g, out, out_len), KVR_OK);
    assert_same_batch(&f.b, &g.b);
    ck_assert_uint_eq(g.b.dialect, KVR_EMP_DIALECT_A);
    /* the legacy encoding keeps the positional layout: 7-element BlockStored, nil rank */
    ck_assert_uint_eq(out[0], 0x93);
    ck_assert_uint_eq(out[out_len - 1], 0xc0);
    kvr_free(&f.a, out);
    /* invalid input is refused */
    f.b.ev[0].kind = 9;
    ck_assert_int_eq(kvr_emp_encode(&f.b, KVR_EMP_ERA_B, &f.a, &out, &out_len), KVR_EINVAL);
    ck_assert_int_eq(kvr_emp_encode(&g.b, 7, &g.a, &out, &out_len), KVR_EINVAL);
    free(v);
    fx_free(&f);
    fx_free(&g);
}
END_TEST

START_TEST(test_encode_oom)
{
    struct fx f;
    size_t len, out_len;
    fx_init(&f);
    uint8_t *v = vector("vllm_map_v2_stored_removed_cleared.msgpack", &len);
    ck_assert_int_eq(dec(&f, v, len), KVR_OK);
    size_t live = f.a.live_allocs;
    kvr_alloc_fail_after(&f.a, 1);
    uint8_t *out = NULL;
    ck_assert_int_eq(kvr_emp_encode(&f.b, KVR_EMP_ERA_B, &f.a, &out, &out_len), KVR_ENOMEM);
    ck_assert_uint_eq(f.a.live_allocs, live);
    free(v);
    fx_free(&f);
}
END_TEST

/* ==== hashing.md §9.7: engine-side hash vectors (SGLang chained SHA-256) =======================
 */

/* A small SHA-256 (FIPS 180-4), only to derive the §9.7 digests from their exact inputs. */
static uint32_t ror32(uint32_t x, unsigned n)
{
    return (x >> n) | (x << (32u - n));
}

static void sha256(const uint8_t *msg, size_t len, uint8_t out[32])
{
    static const uint32_t k[64] = {
        0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4,
        0xab1c5ed5, 0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe,
        0x9bdc06a7, 0xc19bf174, 0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f,
        0x4a7484aa, 0x5cb0a9dc, 0x76f988da, 0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7,
        0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967, 0x27b70a85, 0x2e1b2138, 0x4d2c6dfc,
        0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85, 0xa2bfe8a1, 0xa81a664b,
        0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070, 0x19a4c116,
        0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
        0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7,
        0xc67178f2};
    uint32_t h[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                     0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
    size_t total = ((len + 9 + 63) / 64) * 64;
    uint8_t *m = calloc(1, total);
    ck_assert_ptr_nonnull(m);
    memcpy(m, msg, len);
    m[len] = 0x80;
    for (int i = 0; i < 8; i++)
        m[total - 1 - (size_t)i] = (uint8_t)(((uint64_t)len * 8u) >> (8 * i));
    for (size_t off = 0; off < total; off += 64) {
        uint32_t w[64];
        for (int i = 0; i < 16; i++)
            w[i] = (uint32_t)m[off + 4 * i] << 24 | (uint32_t)m[off + 4 * i + 1] << 16 |
                   (uint32_t)m[off + 4 * i + 2] << 8 | m[off + 4 * i + 3];
        for (int i = 16; i < 64; i++) {
            uint32_t s0 = ror32(w[i - 15], 7) ^ ror32(w[i - 15], 18) ^ (w[i - 15] >> 3);
            uint32_t s1 = ror32(w[i - 2], 17) ^ ror32(w[i - 2], 19) ^ (w[i - 2] >> 10);
            w[i] = w[i - 16] + s0 + w[i - 7] + s1;
        }
        uint32_t a = h[0], b = h[1], c = h[2], d = h[3], e = h[4], f = h[5], g = h[6], hh = h[7];
        for (int i = 0; i < 64; i++) {
            uint32_t t1 = hh + (ror32(e, 6) ^ ror32(e, 11) ^ ror32(e, 25)) + ((e & f) ^ (~e & g)) +
                          k[i] + w[i];
            uint32_t t2 =
                (ror32(a, 2) ^ ror32(a, 13) ^ ror32(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
            hh = g;
            g = f;
            f = e;
            e = d + t1;
            d = c;
            c = b;
            b = a;
            a = t1 + t2;
        }
        h[0] += a;
        h[1] += b;
        h[2] += c;
        h[3] += d;
        h[4] += e;
        h[5] += f;
        h[6] += g;
        h[7] += hh;
    }
    free(m);
    for (int i = 0; i < 8; i++)
        for (int j = 0; j < 4; j++)
            out[4 * i + j] = (uint8_t)(h[i] >> (24 - 8 * j));
}

static void hex32(const char *hex, uint8_t out[32])
{
    for (int i = 0; i < 32; i++) {
        unsigned v;
        ck_assert_int_eq(sscanf(hex + 2 * i, "%2x", &v), 1);
        out[i] = (uint8_t)v;
    }
}

/* SGLang's published form: the signed int64 of the FIRST 8 digest bytes (big-endian). */
static int64_t first8_signed(const uint8_t d[32])
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v = v << 8 | d[i];
    return (int64_t)v;
}

START_TEST(test_hashing_9_7_vectors)
{
    /* The digests from their exact inputs: page [1,2,3,4] as le32, then the previous digest ++
     * page [5,6,7,8] as le32. */
    uint8_t in1[16], in2[48], d1[32], d2[32], want[32];
    for (int t = 0; t < 4; t++) {
        for (int j = 0; j < 4; j++) {
            in1[4 * t + j] = (uint8_t)((uint32_t)(t + 1) >> (8 * j));
            in2[32 + 4 * t + j] = (uint8_t)((uint32_t)(t + 5) >> (8 * j));
        }
    }
    sha256(in1, sizeof(in1), d1);
    hex32("cf97adeedb59e05bfd73a2b4c2a8885708c4f4f70c84c64b27120e72ab733b72", want);
    ck_assert(memcmp(d1, want, 32) == 0);
    memcpy(in2, d1, 32);
    sha256(in2, sizeof(in2), d2);
    hex32("4ebfa8a1f3c341517621838c6e1b9aa350307e3f00b3cbd1a07ef740f54396d6", want);
    ck_assert(memcmp(d2, want, 32) == 0);

    /* SGLang publishes the signed first 8 bytes; vLLM-style bytes map to the last 8 bytes
     * big-endian (the key kvrouter derives from a bytes hash): different ends of one digest. */
    ck_assert(first8_signed(d1) == -3488128144981237669LL);
    ck_assert(first8_signed(d2) == 5674439469042975057LL);
    ck_assert_uint_eq(kvr_emp_hash_from_bytes(d1, 32), 2815328602725497714ULL);
    ck_assert_uint_eq(kvr_emp_hash_from_bytes(d2, 32), 11564952751498827478ULL);

    /* Through the decoder: the chain published as SGLang ints (the second under the first), and
     * the same digests as raw bytes. */
    struct fx f;
    struct pk k;
    fx_init(&f);
    pk_init(&k);
    batch_head(&k.p, 2);
    for (int form = 0; form < 2; form++) {
        msgpack_pack_array(&k.p, 7);
        S(&k.p, "BlockStored");
        msgpack_pack_array(&k.p, 1);
        if (form == 0)
            msgpack_pack_int64(&k.p, first8_signed(d2));
        else
            msgpack_pack_bin_with_body(&k.p, d2, 32);
        if (form == 0)
            msgpack_pack_int64(&k.p, first8_signed(d1));
        else
            msgpack_pack_bin_with_body(&k.p, d1, 32);
        msgpack_pack_array(&k.p, 4);
        for (uint32_t t = 5; t <= 8; t++)
            msgpack_pack_uint32(&k.p, t);
        msgpack_pack_uint32(&k.p, 4);
        msgpack_pack_nil(&k.p);
        S(&k.p, "GPU");
    }
    msgpack_pack_nil(&k.p); /* data_parallel_rank */
    ck_assert_msg(dec_pk(&f, &k) == KVR_OK, "%s", f.err);
    ck_assert_uint_eq(f.b.n, 2);
    const struct kvr_emp_event *e = &f.b.ev[0];
    ck_assert_uint_eq(e->hashes[0], 5674439469042975057ULL);
    ck_assert(e->has_parent);
    ck_assert_uint_eq(e->parent_hash, 14958615928728313947ULL); /* -3488128144981237669 as u64 */
    e = &f.b.ev[1];
    ck_assert_uint_eq(e->hashes[0], 11564952751498827478ULL);
    ck_assert(e->has_parent);
    ck_assert_uint_eq(e->parent_hash, 2815328602725497714ULL);
    pk_done(&k);
    fx_free(&f);
}
END_TEST

Suite *event_msgpack_suite(void);
Suite *event_msgpack_suite(void)
{
    Suite *s = suite_create("event_msgpack");
    TCase *api = tcase_create("api");
    tcase_add_test(api, test_vector_v1);
    tcase_add_test(api, test_vector_v2);
    tcase_add_test(api, test_vector_v3);
    tcase_add_test(api, test_outer_map_and_short_array);
    tcase_add_test(api, test_hash_forms);
    tcase_add_test(api, test_legacy_index7_map);
    tcase_add_test(api, test_legacy_index9_and_mm);
    tcase_add_test(api, test_typed_extra_keys);
    tcase_add_test(api, test_medium_and_locality);
    tcase_add_test(api, test_bigram_tokens);
    tcase_add_test(api, test_hashing_9_7_vectors);
    suite_add_tcase(s, api);
    TCase *edge = tcase_create("edge");
    tcase_add_test(edge, test_truncated_prefixes);
    tcase_add_test(edge, test_trailing_byte);
    tcase_add_test(edge, test_unknown_tag_skipped);
    tcase_add_test(edge, test_unknown_keys_ignored);
    tcase_add_test(edge, test_non_minimal_integers);
    tcase_add_test(edge, test_token_count_mismatch_preserved);
    tcase_add_test(edge, test_wrong_types);
    tcase_add_test(edge, test_bad_values_and_missing);
    tcase_add_test(edge, test_limits);
    tcase_add_test(edge, test_random_mutations);
    suite_add_tcase(s, edge);
    TCase *oom = tcase_create("oom");
    tcase_add_test(oom, test_oom_every_allocation);
    tcase_add_test(oom, test_encode_oom);
    suite_add_tcase(s, oom);
    TCase *oracle = tcase_create("oracle");
    tcase_add_test(oracle, test_encode_matches_msgspec);
    tcase_add_test(oracle, test_encode_roundtrip_all_eras);
    tcase_add_test(oracle, test_encode_v3_legacy_roundtrip);
    suite_add_tcase(s, oracle);
    return s;
}
