/* test_event_convert.c - engine batches -> index events (engine/src/event_convert.c;
 * spec/engine-events.md §7, §9, §10.9-§10.11; expected local hashes from spec/hashing.md §9). */
#include <check.h>
#include <msgpack.h>
#include <stdlib.h>
#include <string.h>

#include "kvr/err.h"
#include "kvr/event_convert.h"
#include "kvr/event_msgpack.h"
#include "kvr/hash.h"
#include "kvr/index.h"
#include "vectors.h"

#define DEADBEEF 0xDEADBEEFCAFEF00DULL
#define W 7u /* the registered worker */

/* hashing.md §9 */
#define L_1_4 14643705804678351452ULL /* tokens 1..4, bs 4 */
#define L_5_8 16777012769546811212ULL /* tokens 5..8 */
#define L_9_12 483935686894639516ULL  /* tokens 9..12 */
#define L_0_3 9143094415614847814ULL  /* tokens 0..3 */
#define L_4_7 12124091508212882195ULL /* tokens 4..7 */
#define L_100 12915512876420934230ULL /* bs 1, [100] */
#define L_200 16583448329610922042ULL /* bs 1, [200] */

struct fx {
    kvr_alloc_t a;
    struct kvr_emp_batch b;
    struct kvr_event_list out;
    struct kvr_convert_counters c;
    struct kvr_convert_opts o;
};

static void fx_init(struct fx *f, uint32_t block_size, uint32_t dp_rank)
{
    memset(f, 0, sizeof(*f));
    kvr_alloc_init(&f->a);
    kvr_emp_batch_init(&f->b, &f->a);
    kvr_event_list_init(&f->out);
    f->o.worker_id = W;
    f->o.dp_rank = dp_rank;
    f->o.block_size = block_size;
}

static void fx_free(struct fx *f)
{
    kvr_emp_batch_free(&f->b);
    kvr_event_list_free(&f->out);
    ck_assert_uint_eq(f->a.live_allocs, 0);
}

static void decode_vector(struct fx *f, const char *name)
{
    char rel[256];
    size_t len;
    char err[256];
    snprintf(rel, sizeof(rel), "kv-events-vectors/%s", name);
    uint8_t *p = kvr_test_read_data(rel, &len);
    ck_assert_msg(p != NULL, "cannot read %s", rel);
    ck_assert_int_eq(kvr_emp_decode(&f->b, p, len, NULL, NULL, NULL, err, sizeof(err)), KVR_OK);
    free(p);
}

static void decode_pk(struct fx *f, const msgpack_sbuffer *sb)
{
    char err[256];
    int rc = kvr_emp_decode(&f->b, sb->data, sb->size, NULL, NULL, NULL, err, sizeof(err));
    ck_assert_msg(rc == KVR_OK, "%s", err);
}

static int convert(struct fx *f, uint64_t seq)
{
    return kvr_convert_batch(&f->b, seq, &f->o, &f->out, &f->c);
}

static void S(msgpack_packer *p, const char *s)
{
    msgpack_pack_str_with_body(p, s, strlen(s));
}

/* One-event batch: a BlockStored map with the given fields. */
struct stored_spec {
    const uint64_t *hashes;
    uint32_t n_hashes;
    int has_parent;
    uint64_t parent;
    const uint32_t *tokens;
    uint32_t n_tokens;
    uint32_t block_size;
    const char *medium;
    const char *lora_name;
    const char *cache_salt;
};

static void pack_stored_batch(msgpack_sbuffer *sb, const struct stored_spec *s)
{
    msgpack_packer p;
    msgpack_packer_init(&p, sb, msgpack_sbuffer_write);
    msgpack_pack_array(&p, 3);
    msgpack_pack_double(&p, 1.0);
    msgpack_pack_array(&p, 1);
    msgpack_pack_map(&p, 8 + (s->cache_salt != NULL));
    S(&p, "type");
    S(&p, "BlockStored");
    S(&p, "block_hashes");
    msgpack_pack_array(&p, s->n_hashes);
    for (uint32_t i = 0; i < s->n_hashes; i++)
        msgpack_pack_uint64(&p, s->hashes[i]);
    S(&p, "parent_block_hash");
    if (s->has_parent)
        msgpack_pack_uint64(&p, s->parent);
    else
        msgpack_pack_nil(&p);
    S(&p, "token_ids");
    msgpack_pack_array(&p, s->n_tokens);
    for (uint32_t i = 0; i < s->n_tokens; i++)
        msgpack_pack_uint32(&p, s->tokens[i]);
    S(&p, "block_size");
    msgpack_pack_uint32(&p, s->block_size);
    S(&p, "lora_id");
    msgpack_pack_nil(&p);
    S(&p, "medium");
    if (s->medium)
        S(&p, s->medium);
    else
        msgpack_pack_nil(&p);
    S(&p, "lora_name");
    if (s->lora_name)
        S(&p, s->lora_name);
    else
        msgpack_pack_nil(&p);
    if (s->cache_salt) {
        S(&p, "cache_salt");
        S(&p, s->cache_salt);
    }
    msgpack_pack_nil(&p);
}

static void stored_batch(struct fx *f, const struct stored_spec *s)
{
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    pack_stored_batch(&sb, s);
    decode_pk(f, &sb);
    msgpack_sbuffer_destroy(&sb);
}

static const uint32_t T0_11[] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11};

/* ==== §9 vectors ============================================================================= */

START_TEST(test_v1)
{
    struct fx f;
    fx_init(&f, 4, 0);
    decode_vector(&f, "vllm_map_v1_blockstored.msgpack");
    ck_assert_int_eq(convert(&f, 0), KVR_OK);
    ck_assert_uint_eq(f.out.n, 1);
    const struct kvr_event *e = &f.out.ev[0];
    ck_assert_int_eq(e->kind, KVR_EVENT_STORED);
    ck_assert_uint_eq(e->worker_id, W);
    ck_assert_uint_eq(e->dp_rank, 0);
    ck_assert_uint_eq(e->event_id, 0);
    ck_assert_int_eq(e->tier, KVR_TIER_DEVICE);
    ck_assert(!e->has_parent);
    ck_assert_uint_eq(e->n, 1);
    ck_assert_uint_eq(e->blocks[0].block_hash, 16045690984503111693ULL);
    ck_assert_uint_eq(e->blocks[0].tokens_hash, 14643705804678351452ULL);
    ck_assert_uint_eq(f.c.events[KVR_EVENT_STORED], 1);
    ck_assert_uint_eq(f.c.blocks, 1);
    fx_free(&f);
}
END_TEST

/* V2's batch rank 1 overrides the registered rank 0 (Dynamo rule). */
START_TEST(test_v2_rank_override)
{
    struct fx f;
    fx_init(&f, 4, 0);
    decode_vector(&f, "vllm_map_v2_stored_removed_cleared.msgpack");
    ck_assert_int_eq(convert(&f, 1), KVR_OK);
    ck_assert_uint_eq(f.out.n, 3);
    for (size_t k = 0; k < 3; k++) {
        ck_assert_uint_eq(f.out.ev[k].worker_id, W);
        ck_assert_uint_eq(f.out.ev[k].dp_rank, 1);
        ck_assert_uint_eq(f.out.ev[k].event_id, 1);
    }
    const struct kvr_event *s = &f.out.ev[0], *r = &f.out.ev[1];
    ck_assert_int_eq(s->kind, KVR_EVENT_STORED);
    ck_assert(s->has_parent && s->parent_hash == DEADBEEF);
    ck_assert_uint_eq(s->n, 2);
    ck_assert_uint_eq(s->blocks[0].block_hash, 7);
    ck_assert_uint_eq(s->blocks[0].tokens_hash, 16777012769546811212ULL);
    ck_assert_uint_eq(s->blocks[1].block_hash, 300);
    ck_assert_uint_eq(s->blocks[1].tokens_hash, 483935686894639516ULL);
    ck_assert_int_eq(r->kind, KVR_EVENT_REMOVED);
    ck_assert_uint_eq(r->n, 1);
    ck_assert_uint_eq(r->hashes[0], DEADBEEF);
    ck_assert_int_eq(f.out.ev[2].kind, KVR_EVENT_CLEARED);
    fx_free(&f);
}
END_TEST

/* V3: nil batch rank -> the registered rank; signed hashes; bs 1. */
START_TEST(test_v3_registered_rank)
{
    struct fx f;
    fx_init(&f, 1, 5);
    decode_vector(&f, "legacy_array_v3_signed_hashes.msgpack");
    ck_assert_int_eq(convert(&f, 2), KVR_OK);
    ck_assert_uint_eq(f.out.n, 3);
    const struct kvr_event *s = &f.out.ev[0], *r = &f.out.ev[1];
    ck_assert_uint_eq(s->dp_rank, 5);
    ck_assert_uint_eq(s->event_id, 2);
    ck_assert(!s->has_parent);
    ck_assert_uint_eq(s->n, 2);
    ck_assert_uint_eq(s->blocks[0].block_hash, 18446744073709551614ULL);
    ck_assert_uint_eq(s->blocks[0].tokens_hash, L_100);
    ck_assert_uint_eq(s->blocks[1].block_hash, 65536);
    ck_assert_uint_eq(s->blocks[1].tokens_hash, L_200);
    ck_assert_uint_eq(r->n, 1);
    ck_assert_uint_eq(r->hashes[0], 18446744073709551614ULL);
    ck_assert_int_eq(f.out.ev[2].kind, KVR_EVENT_CLEARED);
    ck_assert_uint_eq(f.out.ev[2].dp_rank, 5);
    fx_free(&f);
}
END_TEST

/* §10.10 / V3 registered with block size 4: the store converts to nothing (warning counted). */
START_TEST(test_block_size_mismatch)
{
    struct fx f;
    fx_init(&f, 4, 0);
    decode_vector(&f, "legacy_array_v3_signed_hashes.msgpack");
    ck_assert_int_eq(convert(&f, 0), KVR_OK);
    ck_assert_uint_eq(f.out.n, 2);
    ck_assert_int_eq(f.out.ev[0].kind, KVR_EVENT_REMOVED);
    ck_assert_int_eq(f.out.ev[1].kind, KVR_EVENT_CLEARED);
    ck_assert_uint_eq(f.c.block_size_mismatch, 1);
    ck_assert_uint_eq(f.c.blocks_dropped, 2);
    ck_assert_uint_eq(kvr_convert_warnings(&f.c), 1);
    fx_free(&f);

    /* event block size 8 vs index 4 */
    fx_init(&f, 4, 0);
    uint64_t h[] = {1};
    struct stored_spec s = {h, 1, 0, 0, T0_11, 8, 8, "GPU", NULL, NULL};
    stored_batch(&f, &s);
    ck_assert_int_eq(convert(&f, 0), KVR_OK);
    ck_assert_uint_eq(f.out.n, 0);
    ck_assert_uint_eq(f.c.block_size_mismatch, 1);
    fx_free(&f);
}
END_TEST

/* §10.9: a parent equal to one of the block hashes (or a repeat inside them) -> empty removal. */
START_TEST(test_self_reference)
{
    struct fx f;
    fx_init(&f, 4, 0);
    uint64_t h[] = {5, 6};
    struct stored_spec s = {h, 2, 1, 6, T0_11, 8, 4, "GPU", NULL, NULL};
    stored_batch(&f, &s);
    ck_assert_int_eq(convert(&f, 9), KVR_OK);
    ck_assert_uint_eq(f.out.n, 1);
    ck_assert_int_eq(f.out.ev[0].kind, KVR_EVENT_REMOVED);
    ck_assert_uint_eq(f.out.ev[0].n, 0);
    ck_assert_uint_eq(f.out.ev[0].event_id, 9);
    ck_assert_uint_eq(f.c.self_ref, 1);
    ck_assert_uint_eq(f.c.events[KVR_EVENT_CLEARED], 0);
    fx_free(&f);

    /* a repeat among many hashes (the sorting path) */
    fx_init(&f, 1, 0);
    uint64_t many[40];
    uint32_t toks[40];
    for (uint32_t i = 0; i < 40; i++) {
        many[i] = 1000 + i;
        toks[i] = i;
    }
    many[39] = 1003;
    struct stored_spec m = {many, 40, 0, 0, toks, 40, 1, "GPU", NULL, NULL};
    stored_batch(&f, &m);
    ck_assert_int_eq(convert(&f, 0), KVR_OK);
    ck_assert_uint_eq(f.out.n, 1);
    ck_assert_uint_eq(f.out.ev[0].n, 0);
    ck_assert_int_eq(f.out.ev[0].kind, KVR_EVENT_REMOVED);
    /* no repeat: a 40-block store */
    many[39] = 2000;
    kvr_event_list_reset(&f.out);
    stored_batch(&f, &m);
    ck_assert_int_eq(convert(&f, 0), KVR_OK);
    ck_assert_int_eq(f.out.ev[0].kind, KVR_EVENT_STORED);
    ck_assert_uint_eq(f.out.ev[0].n, 40);
    fx_free(&f);
}
END_TEST

/* §10.11: token_ids shorter than blocks x block_size: the blocks before the short one are kept. */
START_TEST(test_short_and_extra_tokens)
{
    struct fx f;
    fx_init(&f, 4, 0);
    uint64_t h[] = {10, 11, 12};
    struct stored_spec s = {h, 3, 0, 0, T0_11, 9, 4, "GPU", NULL, NULL};
    stored_batch(&f, &s);
    ck_assert_int_eq(convert(&f, 0), KVR_OK);
    ck_assert_uint_eq(f.out.n, 1);
    ck_assert_uint_eq(f.out.ev[0].n, 2);
    ck_assert_uint_eq(f.out.ev[0].blocks[0].tokens_hash, L_0_3);
    ck_assert_uint_eq(f.out.ev[0].blocks[1].tokens_hash, L_4_7);
    ck_assert_uint_eq(f.out.ev[0].blocks[1].block_hash, 11);
    ck_assert_uint_eq(f.c.short_tokens, 1);
    ck_assert_uint_eq(f.c.blocks_dropped, 1);
    /* too short for even one block: nothing emitted */
    s.n_tokens = 3;
    stored_batch(&f, &s);
    ck_assert_int_eq(convert(&f, 0), KVR_OK);
    ck_assert_uint_eq(f.out.n, 1);
    ck_assert_uint_eq(f.c.short_tokens, 2);
    ck_assert_uint_eq(f.c.empty_stores, 1);
    /* more tokens than blocks: every block converted, counted */
    uint64_t h1[] = {10};
    struct stored_spec x = {h1, 1, 0, 0, T0_11, 12, 4, "GPU", NULL, NULL};
    stored_batch(&f, &x);
    ck_assert_int_eq(convert(&f, 0), KVR_OK);
    ck_assert_uint_eq(f.out.n, 2);
    ck_assert_uint_eq(f.out.ev[1].n, 1);
    ck_assert_uint_eq(f.c.extra_tokens, 1);
    fx_free(&f);
}
END_TEST

/* LoRA and namespace salts (hashing.md §9.4, §9.6). */
START_TEST(test_salts)
{
    struct fx f;
    uint64_t h[] = {1, 2};
    fx_init(&f, 4, 0);
    struct stored_spec s = {h, 2, 0, 0, T0_11, 8, 4, "GPU", "adapter-a", NULL};
    stored_batch(&f, &s);
    ck_assert_int_eq(convert(&f, 0), KVR_OK);
    ck_assert_uint_eq(f.out.ev[0].blocks[0].tokens_hash, 6665157333201000639ULL);
    ck_assert_uint_eq(f.out.ev[0].blocks[1].tokens_hash, 11721812545976571723ULL);
    kvr_event_list_reset(&f.out);

    struct stored_spec n = {h, 1, 0, 0, T0_11, 4, 4, "GPU", NULL, "tenant-a"};
    stored_batch(&f, &n);
    ck_assert_int_eq(convert(&f, 0), KVR_OK);
    ck_assert_uint_eq(f.out.ev[0].blocks[0].tokens_hash, 17009624042690211646ULL);
    kvr_event_list_reset(&f.out);

    struct stored_spec both = {h, 1, 0, 0, T0_11, 4, 4, "GPU", "adapter-a", "tenant-a"};
    stored_batch(&f, &both);
    ck_assert_int_eq(convert(&f, 0), KVR_OK);
    ck_assert_uint_eq(f.out.ev[0].blocks[0].tokens_hash, 8269515957840517240ULL);
    kvr_event_list_reset(&f.out);

    f.o.no_namespace = 1; /* the namespace ignored on both paths */
    stored_batch(&f, &n);
    ck_assert_int_eq(convert(&f, 0), KVR_OK);
    ck_assert_uint_eq(f.out.ev[0].blocks[0].tokens_hash, L_0_3);
    fx_free(&f);
}
END_TEST

/* The registered LoRA (kvr_convert_opts.default_lora) salts stores whose event names none, and
 * only those: an event's own lora_name wins, an empty one counts as none (hashing.md §2). */
START_TEST(test_default_lora)
{
    struct fx f;
    uint64_t h[] = {1, 2};
    fx_init(&f, 4, 0);
    f.o.default_lora = "adapter-a";
    f.o.default_lora_len = 9;
    struct stored_spec none = {h, 2, 0, 0, T0_11, 8, 4, "GPU", NULL, NULL};
    stored_batch(&f, &none);
    ck_assert_int_eq(convert(&f, 0), KVR_OK);
    ck_assert_uint_eq(f.out.ev[0].blocks[0].tokens_hash, 6665157333201000639ULL); /* §9 adapter-a */
    ck_assert_uint_eq(f.out.ev[0].blocks[1].tokens_hash, 11721812545976571723ULL);
    kvr_event_list_reset(&f.out);

    struct stored_spec empty = {h, 1, 0, 0, T0_11, 4, 4, "GPU", "", NULL};
    stored_batch(&f, &empty);
    ck_assert_int_eq(convert(&f, 0), KVR_OK);
    ck_assert_uint_eq(f.out.ev[0].blocks[0].tokens_hash, 6665157333201000639ULL);
    kvr_event_list_reset(&f.out);

    struct stored_spec own = {h, 1, 0, 0, T0_11, 4, 4, "GPU", "adapter-b", NULL};
    stored_batch(&f, &own);
    ck_assert_int_eq(convert(&f, 0), KVR_OK);
    uint64_t want_b = kvr_hash_xxh3(T0_11, 16, kvr_hash_salt(NULL, 0, "adapter-b", 9));
    ck_assert_uint_eq(f.out.ev[0].blocks[0].tokens_hash, want_b);
    kvr_event_list_reset(&f.out);

    struct stored_spec ns = {h, 1, 0, 0, T0_11, 4, 4, "GPU", NULL, "tenant-a"};
    stored_batch(&f, &ns); /* with a namespace: both salts, as for an event naming both */
    ck_assert_int_eq(convert(&f, 0), KVR_OK);
    ck_assert_uint_eq(f.out.ev[0].blocks[0].tokens_hash, 8269515957840517240ULL);
    kvr_event_list_reset(&f.out);

    f.o.default_lora = NULL; /* no default: unsalted */
    f.o.default_lora_len = 0;
    stored_batch(&f, &none);
    ck_assert_int_eq(convert(&f, 0), KVR_OK);
    ck_assert_uint_eq(f.out.ev[0].blocks[0].tokens_hash, L_0_3);
    fx_free(&f);
}
END_TEST

/* Eagle windows (hashing.md §5, §9.6). */
START_TEST(test_eagle)
{
    struct fx f;
    uint64_t h[] = {1, 2};
    fx_init(&f, 4, 0);
    f.o.eagle = 1;
    struct stored_spec s = {h, 2, 0, 0, T0_11, 9, 4, "GPU", NULL, NULL};
    stored_batch(&f, &s);
    ck_assert_int_eq(convert(&f, 0), KVR_OK);
    ck_assert_uint_eq(f.out.ev[0].n, 2);
    ck_assert_uint_eq(f.out.ev[0].blocks[0].tokens_hash, 14562210786876287112ULL);
    ck_assert_uint_eq(f.out.ev[0].blocks[1].tokens_hash, 15916330181359808192ULL);
    ck_assert_uint_eq(f.c.short_tokens, 0);
    ck_assert_uint_eq(f.c.extra_tokens, 0);
    kvr_event_list_reset(&f.out);
    /* exactly n x bs tokens (what vLLM sends): the last window lacks its extra token */
    s.n_tokens = 8;
    stored_batch(&f, &s);
    ck_assert_int_eq(convert(&f, 0), KVR_OK);
    ck_assert_uint_eq(f.out.ev[0].n, 1);
    ck_assert_uint_eq(f.c.short_tokens, 1);
    fx_free(&f);
}
END_TEST

/* SGLang bigram pairs [t_i, t_i+1] read as t_0 .. t_n. */
START_TEST(test_bigram)
{
    struct fx f;
    msgpack_sbuffer sb;
    msgpack_packer p;
    for (int eagle = 0; eagle < 2; eagle++) {
        fx_init(&f, 4, 0);
        f.o.eagle = eagle;
        msgpack_sbuffer_init(&sb);
        msgpack_packer_init(&p, &sb, msgpack_sbuffer_write);
        msgpack_pack_array(&p, 2);
        msgpack_pack_double(&p, 0);
        msgpack_pack_array(&p, 1);
        msgpack_pack_array(&p, 5);
        S(&p, "BlockStored");
        msgpack_pack_array(&p, 1);
        msgpack_pack_int64(&p, -9);
        msgpack_pack_nil(&p);
        msgpack_pack_array(&p, 4);
        for (uint32_t t = 0; t < 4; t++) {
            msgpack_pack_array(&p, 2);
            msgpack_pack_uint32(&p, t);
            msgpack_pack_uint32(&p, t + 1);
        }
        msgpack_pack_uint32(&p, 4);
        decode_pk(&f, &sb);
        msgpack_sbuffer_destroy(&sb);
        ck_assert_int_eq(convert(&f, 0), KVR_OK);
        ck_assert_uint_eq(f.out.n, 1);
        ck_assert_uint_eq(f.out.ev[0].blocks[0].block_hash, (uint64_t)-9);
        ck_assert_uint_eq(f.out.ev[0].blocks[0].tokens_hash,
                          eagle ? 14562210786876287112ULL : L_0_3);
        ck_assert_uint_eq(f.c.short_tokens + f.c.extra_tokens, 0);
        fx_free(&f);
    }
}
END_TEST

/* Multimodal: per-block mm hashes appended (hashing.md §9.6: {5, 3} -> 2427125067600827532);
 * with image_token_id, image runs become pad values and the block is hashed without mm. */
START_TEST(test_multimodal)
{
    struct fx f;
    msgpack_sbuffer sb;
    msgpack_packer p;
    char hex[65];
    fx_init(&f, 4, 0);
    msgpack_sbuffer_init(&sb);
    msgpack_packer_init(&p, &sb, msgpack_sbuffer_write);
    msgpack_pack_array(&p, 3);
    msgpack_pack_double(&p, 0);
    msgpack_pack_array(&p, 1);
    msgpack_pack_map(&p, 6);
    S(&p, "type");
    S(&p, "BlockStored");
    S(&p, "block_hashes");
    msgpack_pack_array(&p, 1);
    msgpack_pack_uint32(&p, 77);
    S(&p, "token_ids");
    msgpack_pack_array(&p, 4);
    for (uint32_t t = 0; t < 4; t++)
        msgpack_pack_uint32(&p, t);
    S(&p, "block_size");
    msgpack_pack_uint32(&p, 4);
    S(&p, "parent_block_hash");
    msgpack_pack_nil(&p);
    S(&p, "block_mm_infos");
    msgpack_pack_array(&p, 1);
    msgpack_pack_map(&p, 1);
    S(&p, "mm_objects");
    msgpack_pack_array(&p, 2);
    msgpack_pack_array(&p, 2);
    msgpack_pack_uint32(&p, 5);
    msgpack_pack_array(&p, 0);
    msgpack_pack_array(&p, 2);
    msgpack_pack_uint32(&p, 3);
    msgpack_pack_array(&p, 0);
    msgpack_pack_nil(&p);
    decode_pk(&f, &sb);
    msgpack_sbuffer_destroy(&sb);
    ck_assert_int_eq(convert(&f, 0), KVR_OK);
    ck_assert_uint_eq(f.out.ev[0].blocks[0].tokens_hash, 2427125067600827532ULL);
    fx_free(&f);

    /* image token 9: tokens [1, 9, 9, 2 | 9, 3, 4, 5] with mm hashes DEADBEEF, 42 in extra_keys */
    fx_init(&f, 4, 0);
    f.o.has_image_token_id = 1;
    f.o.image_token_id = 9;
    msgpack_sbuffer_init(&sb);
    msgpack_packer_init(&p, &sb, msgpack_sbuffer_write);
    msgpack_pack_array(&p, 3);
    msgpack_pack_double(&p, 0);
    msgpack_pack_array(&p, 1);
    msgpack_pack_map(&p, 5);
    S(&p, "type");
    S(&p, "BlockStored");
    S(&p, "block_hashes");
    msgpack_pack_array(&p, 2);
    msgpack_pack_uint32(&p, 1);
    msgpack_pack_uint32(&p, 2);
    S(&p, "token_ids");
    const uint32_t toks[8] = {1, 9, 9, 2, 9, 3, 4, 5};
    msgpack_pack_array(&p, 8);
    for (int t = 0; t < 8; t++)
        msgpack_pack_uint32(&p, toks[t]);
    S(&p, "block_size");
    msgpack_pack_uint32(&p, 4);
    S(&p, "extra_keys");
    msgpack_pack_array(&p, 2);
    msgpack_pack_array(&p, 1);
    snprintf(hex, sizeof(hex), "%016llx%048d", (unsigned long long)DEADBEEF, 0);
    S(&p, hex);
    msgpack_pack_array(&p, 1);
    snprintf(hex, sizeof(hex), "%016llx%048d", 42ULL, 0);
    S(&p, hex);
    msgpack_pack_nil(&p);
    decode_pk(&f, &sb);
    msgpack_sbuffer_destroy(&sb);
    ck_assert_int_eq(convert(&f, 0), KVR_OK);
    uint32_t pad0 = kvr_hash_mm_pad_value(DEADBEEF), pad1 = kvr_hash_mm_pad_value(42);
    ck_assert_uint_eq(pad0, 185479757u); /* hashing.md §9.6 */
    uint32_t want_tokens[8] = {1, pad0, pad0, 2, pad1, 3, 4, 5};
    uint64_t want[2];
    size_t n;
    ck_assert_int_eq(kvr_hash_blocks(want_tokens, 8, 4, NULL, want, 2, &n), KVR_OK);
    ck_assert_uint_eq(f.out.ev[0].n, 2);
    ck_assert_uint_eq(f.out.ev[0].blocks[0].tokens_hash, want[0]);
    ck_assert_uint_eq(f.out.ev[0].blocks[1].tokens_hash, want[1]);
    /* the event's own tokens are untouched (the rewrite works on a scratch copy) */
    ck_assert_uint_eq(f.b.ev[0].token_ids[1], 9);
    fx_free(&f);
}
END_TEST

/* Tiers pass through; group filter; the rank rule for every kind. */
START_TEST(test_tiers_and_groups)
{
    struct fx f;
    msgpack_sbuffer sb;
    msgpack_packer p;
    fx_init(&f, 1, 3);
    msgpack_sbuffer_init(&sb);
    msgpack_packer_init(&p, &sb, msgpack_sbuffer_write);
    msgpack_pack_array(&p, 3);
    msgpack_pack_double(&p, 0);
    msgpack_pack_array(&p, 3);
    msgpack_pack_array(&p, 7);
    S(&p, "BlockStored");
    msgpack_pack_array(&p, 1);
    msgpack_pack_uint32(&p, 1);
    msgpack_pack_nil(&p);
    msgpack_pack_array(&p, 1);
    msgpack_pack_uint32(&p, 100);
    msgpack_pack_uint32(&p, 1);
    msgpack_pack_nil(&p);
    S(&p, "CPU");
    msgpack_pack_array(&p, 4);
    S(&p, "BlockRemoved");
    msgpack_pack_array(&p, 1);
    msgpack_pack_uint32(&p, 1);
    S(&p, "DISK");
    msgpack_pack_uint32(&p, 1); /* group_idx 1 */
    msgpack_pack_array(&p, 1);
    S(&p, "AllBlocksCleared");
    msgpack_pack_nil(&p);
    decode_pk(&f, &sb);
    msgpack_sbuffer_destroy(&sb);
    ck_assert_int_eq(convert(&f, 4), KVR_OK);
    ck_assert_uint_eq(f.out.n, 3);
    ck_assert_int_eq(f.out.ev[0].tier, KVR_TIER_HOST_PINNED);
    ck_assert_uint_eq(f.out.ev[0].blocks[0].tokens_hash, L_100);
    ck_assert_int_eq(f.out.ev[1].tier, KVR_TIER_DISK);
    ck_assert_uint_eq(f.c.tier[KVR_TIER_HOST_PINNED], 1);
    ck_assert_uint_eq(f.c.tier[KVR_TIER_DISK], 1);
    for (int k = 0; k < 3; k++)
        ck_assert_uint_eq(f.out.ev[k].dp_rank, 3);
    kvr_event_list_reset(&f.out);
    f.o.has_group_filter = 1;
    f.o.group_idx = 0;
    ck_assert_int_eq(convert(&f, 4), KVR_OK);
    ck_assert_uint_eq(f.out.n, 2);
    ck_assert_uint_eq(f.c.group_filtered, 1);
    f.o.block_size = 0;
    ck_assert_int_eq(convert(&f, 4), KVR_EINVAL);
    fx_free(&f);
}
END_TEST

/* Encoder -> decoder -> converter agree in every era (mock worker path). */
START_TEST(test_roundtrip_eras)
{
    uint64_t hashes[3] = {111, 222, 333};
    uint32_t tokens[12];
    for (uint32_t t = 0; t < 12; t++)
        tokens[t] = t + 1;
    struct kvr_emp_event ev[2];
    memset(ev, 0, sizeof(ev));
    ev[0].kind = KVR_EVENT_STORED;
    ev[0].token_width = 1;
    ev[0].event_version = 1;
    ev[0].block_size = 4;
    ev[0].n_hashes = 3;
    ev[0].hashes = hashes;
    ev[0].n_tokens = 12;
    ev[0].token_ids = tokens;
    ev[0].medium.p = "GPU";
    ev[0].medium.len = 3;
    ev[1].kind = KVR_EVENT_REMOVED;
    ev[1].n_hashes = 1;
    ev[1].hashes = hashes + 2;
    struct kvr_emp_batch in;
    memset(&in, 0, sizeof(in));
    in.n = 2;
    in.ev = ev;
    for (int era = KVR_EMP_ERA_B; era <= KVR_EMP_ERA_C; era++) {
        struct fx f;
        uint8_t *buf;
        size_t len;
        char err[128];
        fx_init(&f, 4, 2);
        ck_assert_int_eq(kvr_emp_encode(&in, era, &f.a, &buf, &len), KVR_OK);
        ck_assert_int_eq(kvr_emp_decode(&f.b, buf, len, NULL, NULL, NULL, err, sizeof(err)),
                         KVR_OK);
        kvr_free(&f.a, buf);
        ck_assert_int_eq(convert(&f, 8), KVR_OK);
        ck_assert_uint_eq(f.out.n, 2);
        const struct kvr_event *s = &f.out.ev[0];
        ck_assert_uint_eq(s->n, 3);
        ck_assert_uint_eq(s->dp_rank, 2);
        ck_assert_uint_eq(s->blocks[0].tokens_hash, L_1_4);
        ck_assert_uint_eq(s->blocks[1].tokens_hash, L_5_8);
        ck_assert_uint_eq(s->blocks[2].tokens_hash, L_9_12);
        ck_assert_uint_eq(s->blocks[2].block_hash, 333);
        ck_assert_uint_eq(f.out.ev[1].hashes[0], 333);
        fx_free(&f);
    }
}
END_TEST

/* ==== oracle: the documented effects of the §9 vectors on the index ========================= */

/* Score of (W, rank) for `tokens` at block size bs (0 when absent). */
static uint32_t score(kvr_index_t *idx, const uint32_t *tokens, size_t n, uint32_t bs,
                      uint32_t rank)
{
    uint64_t local[16];
    size_t nb;
    struct kvr_match m[8];
    size_t nm;
    ck_assert_int_eq(kvr_hash_blocks(tokens, n, bs, NULL, local, 16, &nb), KVR_OK);
    ck_assert_int_eq(kvr_index_find_matches(idx, local, nb, 0, m, 8, &nm), KVR_OK);
    for (size_t k = 0; k < nm; k++)
        if (m[k].worker_id == W && m[k].dp_rank == rank)
            return m[k].blocks;
    return 0;
}

static void apply_all(kvr_index_t *idx, struct fx *f, int *results)
{
    kvr_index_apply_batch(idx, f->out.ev, f->out.n, results);
    kvr_event_list_reset(&f->out);
}

/* V1 then V2 under the Dynamo rank rule: V2 targets (W,1), which never stored the parent. */
START_TEST(test_effects_v1_v2_dynamo_rank)
{
    const uint32_t t1_12[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
    kvr_index_t *idx;
    struct fx f;
    int res[3];
    ck_assert_int_eq(kvr_index_new(NULL, &idx), KVR_OK);
    fx_init(&f, 4, 0);
    decode_vector(&f, "vllm_map_v1_blockstored.msgpack");
    ck_assert_int_eq(convert(&f, 0), KVR_OK);
    apply_all(idx, &f, res);
    ck_assert_int_eq(res[0], KVR_OK);
    ck_assert_uint_eq(score(idx, t1_12, 4, 4, 0), 1);
    decode_vector(&f, "vllm_map_v2_stored_removed_cleared.msgpack");
    ck_assert_int_eq(convert(&f, 1), KVR_OK);
    apply_all(idx, &f, res);
    ck_assert_int_eq(res[0], KVR_EPARENT);            /* the store is rejected whole */
    ck_assert_int_eq(res[1], KVR_ENOBLOCK);           /* the removal is unknown */
    ck_assert_int_eq(res[2], KVR_OK);                 /* the clear empties (W,1) only */
    ck_assert_uint_eq(score(idx, t1_12, 4, 4, 0), 1); /* (W,0) still holds it */
    ck_assert_uint_eq(score(idx, t1_12, 12, 4, 0), 1);
    fx_free(&f);
    kvr_index_free(idx);
}
END_TEST

/* V2 re-encoded with rank 0 (same rank as V1): blocks chain under the parent; removing the
 * parent leaves holes (score 0); the clear empties the rank. */
START_TEST(test_effects_v2_same_rank)
{
    const uint32_t t1_12[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
    kvr_index_t *idx;
    struct fx f;
    int res[3];
    ck_assert_int_eq(kvr_index_new(NULL, &idx), KVR_OK);
    fx_init(&f, 4, 0);
    decode_vector(&f, "vllm_map_v1_blockstored.msgpack");
    ck_assert_int_eq(convert(&f, 0), KVR_OK);
    apply_all(idx, &f, res);
    decode_vector(&f, "vllm_map_v2_stored_removed_cleared.msgpack");
    f.b.dp_rank = 0; /* the re-encoding: only the batch rank differs */
    ck_assert_int_eq(convert(&f, 1), KVR_OK);
    ck_assert_uint_eq(f.out.n, 3);
    kvr_index_apply_batch(idx, f.out.ev, 1, res); /* the store alone */
    ck_assert_int_eq(res[0], KVR_OK);
    ck_assert_uint_eq(score(idx, t1_12, 12, 4, 0), 3);
    kvr_index_apply_batch(idx, f.out.ev + 1, 1, res); /* remove the parent */
    ck_assert_int_eq(res[0], KVR_OK);
    ck_assert_uint_eq(score(idx, t1_12, 12, 4, 0), 0);
    kvr_index_apply_batch(idx, f.out.ev + 2, 1, res); /* clear */
    ck_assert_int_eq(res[0], KVR_OK);
    struct kvr_index_stats st;
    kvr_index_stats(idx, &st);
    ck_assert_uint_eq(st.counters.events[KVR_EVENT_CLEARED], 1);
    kvr_event_list_reset(&f.out);
    fx_free(&f);
    kvr_index_free(idx);
}
END_TEST

/* V3 at block size 1: a root chain of two blocks; removing the first leaves a hole; the clear
 * empties the rank. */
START_TEST(test_effects_v3)
{
    const uint32_t t[] = {100, 200};
    kvr_index_t *idx;
    struct fx f;
    int res[3];
    ck_assert_int_eq(kvr_index_new(NULL, &idx), KVR_OK);
    fx_init(&f, 1, 0);
    decode_vector(&f, "legacy_array_v3_signed_hashes.msgpack");
    ck_assert_int_eq(convert(&f, 0), KVR_OK);
    kvr_index_apply_batch(idx, f.out.ev, 1, res);
    ck_assert_int_eq(res[0], KVR_OK);
    ck_assert_uint_eq(score(idx, t, 2, 1, 0), 2);
    kvr_index_apply_batch(idx, f.out.ev + 1, 1, res);
    ck_assert_int_eq(res[0], KVR_OK);
    ck_assert_uint_eq(score(idx, t, 2, 1, 0), 0);
    kvr_index_apply_batch(idx, f.out.ev + 2, 1, res);
    ck_assert_int_eq(res[0], KVR_OK);
    ck_assert_uint_eq(score(idx, t, 2, 1, 0), 0);
    kvr_event_list_reset(&f.out);
    fx_free(&f);
    kvr_index_free(idx);
}
END_TEST

/* Scratch allocation failure: KVR_ENOMEM, the output list as before. */
START_TEST(test_oom_scratch)
{
    struct fx f;
    fx_init(&f, 1, 0);
    uint64_t many[40];
    uint32_t toks[40];
    for (uint32_t i = 0; i < 40; i++) {
        many[i] = 1000 + i;
        toks[i] = i;
    }
    struct stored_spec m = {many, 40, 0, 0, toks, 40, 1, "GPU", NULL, NULL};
    stored_batch(&f, &m);
    struct kvr_event *e;
    ck_assert_int_eq(kvr_event_list_emplace(&f.out, KVR_EVENT_CLEARED, 0, &e), KVR_OK);
    size_t live = f.a.live_allocs;
    kvr_alloc_fail_after(&f.a, 1);
    ck_assert_int_eq(convert(&f, 0), KVR_ENOMEM);
    ck_assert_uint_eq(f.out.n, 1);
    ck_assert_uint_eq(f.a.live_allocs, live);
    ck_assert_uint_eq(f.c.events[KVR_EVENT_STORED], 0);
    kvr_alloc_fail_after(&f.a, 0);
    ck_assert_int_eq(convert(&f, 0), KVR_OK);
    ck_assert_uint_eq(f.out.n, 2);
    fx_free(&f);
}
END_TEST

Suite *event_convert_suite(void);
Suite *event_convert_suite(void)
{
    Suite *s = suite_create("event_convert");
    TCase *api = tcase_create("api");
    tcase_add_test(api, test_v1);
    tcase_add_test(api, test_v2_rank_override);
    tcase_add_test(api, test_v3_registered_rank);
    tcase_add_test(api, test_salts);
    tcase_add_test(api, test_default_lora);
    tcase_add_test(api, test_eagle);
    tcase_add_test(api, test_bigram);
    tcase_add_test(api, test_multimodal);
    tcase_add_test(api, test_tiers_and_groups);
    suite_add_tcase(s, api);
    TCase *edge = tcase_create("edge");
    tcase_add_test(edge, test_block_size_mismatch);
    tcase_add_test(edge, test_self_reference);
    tcase_add_test(edge, test_short_and_extra_tokens);
    suite_add_tcase(s, edge);
    TCase *oracle = tcase_create("oracle");
    tcase_add_test(oracle, test_roundtrip_eras);
    tcase_add_test(oracle, test_effects_v1_v2_dynamo_rank);
    tcase_add_test(oracle, test_effects_v2_same_rank);
    tcase_add_test(oracle, test_effects_v3);
    suite_add_tcase(s, oracle);
    TCase *oom = tcase_create("oom");
    tcase_add_test(oom, test_oom_scratch);
    suite_add_tcase(s, oom);
    return s;
}
