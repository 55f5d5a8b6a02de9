/* event_msgpack_enc.c - encode engine KV-event batches in vLLM's msgpack format (see
 * kvr/event_msgpack.h; spec/engine-events.md §4). Used by the mock worker and by tests that
 * round-trip through the decoder.
 *
 * msgpack-c's packer already picks the smallest integer form and writes doubles as float64, which
 * is what msgspec does; the output buffer is ours (kvr_alloc accounting, no msgpack_sbuffer). */
#include "kvr/event_msgpack.h"

#include <msgpack.h>
#include <stdio.h>
#include <string.h>

#include "kvr/err.h"

/* ==== output buffer =========================================================================== */

struct out {
    kvr_alloc_t *a;
    uint8_t *p;
    size_t len;
    size_t cap;
};

static int out_write(void *data, const char *buf, size_t len)
{
    struct out *o = data;
    if (len > o->cap - o->len) {
        size_t cap = o->cap ? o->cap : 256;
        while (len > cap - o->len) {
            if (cap > SIZE_MAX / 2)
                return -1;
            cap *= 2;
        }
        uint8_t *p = kvr_realloc(o->a, o->p, cap);
        if (p == NULL)
            return -1;
        o->p = p;
        o->cap = cap;
    }
    memcpy(o->p + o->len, buf, len);
    o->len += len;
    return 0;
}

/* ==== field writers =========================================================================== */

static int pack_cstr(msgpack_packer *pk, const char *s)
{
    return msgpack_pack_str_with_body(pk, s, strlen(s));
}

static int pack_str(msgpack_packer *pk, const struct kvr_emp_str *s)
{
    if (s->p == NULL)
        return msgpack_pack_nil(pk);
    return msgpack_pack_str_with_body(pk, s->p, s->len);
}

static int pack_key(msgpack_packer *pk, const char *key)
{
    return pack_cstr(pk, key);
}

static int pack_hashes(msgpack_packer *pk, const uint64_t *h, uint32_t n)
{
    int rc = msgpack_pack_array(pk, n);
    for (uint32_t k = 0; rc == 0 && k < n; k++)
        rc = msgpack_pack_uint64(pk, h[k]);
    return rc;
}

static int pack_tokens(msgpack_packer *pk, const struct kvr_emp_event *ev)
{
    int rc = msgpack_pack_array(pk, ev->n_tokens);
    for (uint32_t k = 0; rc == 0 && k < ev->n_tokens; k++) {
        if (ev->token_width == 2) {
            rc = msgpack_pack_array(pk, 2);
            if (rc == 0)
                rc = msgpack_pack_uint32(pk, ev->token_ids[2 * k]);
            if (rc == 0)
                rc = msgpack_pack_uint32(pk, ev->token_ids[2 * k + 1]);
        } else {
            rc = msgpack_pack_uint32(pk, ev->token_ids[k]);
        }
    }
    return rc;
}

static int pack_opt_int(msgpack_packer *pk, int has, int64_t v)
{
    return has ? msgpack_pack_int64(pk, v) : msgpack_pack_nil(pk);
}

/* extra_keys: per block nil, or a tuple of 64-hex-char identifiers (first 16 digits = the hash). */
static int pack_extra_keys(msgpack_packer *pk, const struct kvr_emp_event *ev)
{
    int rc = msgpack_pack_array(pk, ev->n_mm_blocks);
    for (uint32_t k = 0; rc == 0 && k < ev->n_mm_blocks; k++) {
        uint32_t a = ev->mm_off[k], b = ev->mm_off[k + 1];
        if (a == b) {
            rc = msgpack_pack_nil(pk);
            continue;
        }
        rc = msgpack_pack_array(pk, b - a);
        for (uint32_t m = a; rc == 0 && m < b; m++) {
            char hex[65];
            snprintf(hex, sizeof(hex), "%016llx%048d", (unsigned long long)ev->mm_hashes[m], 0);
            rc = msgpack_pack_str_with_body(pk, hex, 64);
        }
    }
    return rc;
}

static int pack_meta_map(msgpack_packer *pk, const struct kvr_emp_event *ev)
{
    int rc = msgpack_pack_map(pk, 1);
    if (rc == 0)
        rc = pack_key(pk, "cache_salt");
    if (rc == 0)
        rc = pack_str(pk, &ev->cache_salt);
    return rc;
}

static const char *tag_name(int kind)
{
    switch (kind) {
    case KVR_EVENT_STORED:
        return "BlockStored";
    case KVR_EVENT_REMOVED:
        return "BlockRemoved";
    default:
        return "AllBlocksCleared";
    }
}

/* ==== events ================================================================================== */

static int map_stored(msgpack_packer *pk, const struct kvr_emp_event *ev)
{
    int has_mm = ev->n_mm_blocks > 0;
    uint32_t n = 8 + (ev->event_version != 1) + has_mm + ev->has_group_idx +
                 (ev->spec_kind.p != NULL) + ev->has_sliding_window + (ev->locality.p != NULL) +
                 (ev->cache_salt.p != NULL);
    int rc = msgpack_pack_map(pk, n);
    rc = rc ? rc : pack_key(pk, "type");
    rc = rc ? rc : pack_cstr(pk, "BlockStored");
    rc = rc ? rc : pack_key(pk, "block_hashes");
    rc = rc ? rc : pack_hashes(pk, ev->hashes, ev->n_hashes);
    rc = rc ? rc : pack_key(pk, "parent_block_hash");
    rc = rc ? rc
            : (ev->has_parent ? msgpack_pack_uint64(pk, ev->parent_hash) : msgpack_pack_nil(pk));
    rc = rc ? rc : pack_key(pk, "token_ids");
    rc = rc ? rc : pack_tokens(pk, ev);
    rc = rc ? rc : pack_key(pk, "block_size");
    rc = rc ? rc : msgpack_pack_uint32(pk, ev->block_size);
    rc = rc ? rc : pack_key(pk, "lora_id");
    rc = rc ? rc : pack_opt_int(pk, ev->has_lora_id, ev->lora_id);
    rc = rc ? rc : pack_key(pk, "medium");
    rc = rc ? rc : pack_str(pk, &ev->medium);
    rc = rc ? rc : pack_key(pk, "lora_name");
    rc = rc ? rc : pack_str(pk, &ev->lora_name);
    if (rc == 0 && ev->event_version != 1) {
        rc = pack_key(pk, "event_version");
        rc = rc ? rc : msgpack_pack_uint32(pk, ev->event_version);
    }
    if (rc == 0 && has_mm) {
        rc = pack_key(pk, "extra_keys");
        rc = rc ? rc : pack_extra_keys(pk, ev);
    }
    if (rc == 0 && ev->has_group_idx) {
        rc = pack_key(pk, "group_idx");
        rc = rc ? rc : msgpack_pack_int64(pk, ev->group_idx);
    }
    if (rc == 0 && ev->spec_kind.p != NULL) {
        rc = pack_key(pk, "kv_cache_spec_kind");
        rc = rc ? rc : pack_str(pk, &ev->spec_kind);
    }
    if (rc == 0 && ev->has_sliding_window) {
        rc = pack_key(pk, "kv_cache_spec_sliding_window");
        rc = rc ? rc : msgpack_pack_int64(pk, ev->sliding_window);
    }
    if (rc == 0 && ev->locality.p != NULL) {
        rc = pack_key(pk, "locality");
        rc = rc ? rc : pack_str(pk, &ev->locality);
    }
    if (rc == 0 && ev->cache_salt.p != NULL) {
        rc = pack_key(pk, "cache_salt");
        rc = rc ? rc : pack_str(pk, &ev->cache_salt);
    }
    return rc;
}

static int map_removed(msgpack_packer *pk, const struct kvr_emp_event *ev)
{
    uint32_t n = 3 + ev->has_group_idx + (ev->spec_kind.p != NULL) + ev->has_sliding_window +
                 (ev->locality.p != NULL);
    int rc = msgpack_pack_map(pk, n);
    rc = rc ? rc : pack_key(pk, "type");
    rc = rc ? rc : pack_cstr(pk, "BlockRemoved");
    rc = rc ? rc : pack_key(pk, "block_hashes");
    rc = rc ? rc : pack_hashes(pk, ev->hashes, ev->n_hashes);
    rc = rc ? rc : pack_key(pk, "medium");
    rc = rc ? rc : pack_str(pk, &ev->medium);
    if (rc == 0 && ev->has_group_idx) {
        rc = pack_key(pk, "group_idx");
        rc = rc ? rc : msgpack_pack_int64(pk, ev->group_idx);
    }
    if (rc == 0 && ev->spec_kind.p != NULL) {
        rc = pack_key(pk, "kv_cache_spec_kind");
        rc = rc ? rc : pack_str(pk, &ev->spec_kind);
    }
    if (rc == 0 && ev->has_sliding_window) {
        rc = pack_key(pk, "kv_cache_spec_sliding_window");
        rc = rc ? rc : msgpack_pack_int64(pk, ev->sliding_window);
    }
    if (rc == 0 && ev->locality.p != NULL) {
        rc = pack_key(pk, "locality");
        rc = rc ? rc : pack_str(pk, &ev->locality);
    }
    return rc;
}

/* Legacy positional: every field up to the last one that is set (placeholders before it). */
static int array_stored(msgpack_packer *pk, const struct kvr_emp_event *ev)
{
    uint32_t n = 7;
    if (ev->lora_name.p != NULL || ev->cache_salt.p != NULL)
        n = 8;
    if (ev->n_mm_blocks > 0)
        n = 9;
    if (ev->has_group_idx)
        n = 10;
    if (ev->spec_kind.p != NULL)
        n = 11;
    if (ev->has_sliding_window)
        n = 12;
    int rc = msgpack_pack_array(pk, n);
    rc = rc ? rc : pack_cstr(pk, "BlockStored");
    rc = rc ? rc : pack_hashes(pk, ev->hashes, ev->n_hashes);
    rc = rc ? rc
            : (ev->has_parent ? msgpack_pack_uint64(pk, ev->parent_hash) : msgpack_pack_nil(pk));
    rc = rc ? rc : pack_tokens(pk, ev);
    rc = rc ? rc : msgpack_pack_uint32(pk, ev->block_size);
    rc = rc ? rc : pack_opt_int(pk, ev->has_lora_id, ev->lora_id);
    rc = rc ? rc : pack_str(pk, &ev->medium);
    if (rc == 0 && n > 7) /* index 7: lora_name, or SGLang's metadata map when only a salt */
        rc = (ev->lora_name.p == NULL && ev->cache_salt.p != NULL) ? pack_meta_map(pk, ev)
                                                                   : pack_str(pk, &ev->lora_name);
    if (rc == 0 && n > 8)
        rc = ev->n_mm_blocks > 0 ? pack_extra_keys(pk, ev) : msgpack_pack_nil(pk);
    if (rc == 0 && n > 9)
        rc = pack_opt_int(pk, ev->has_group_idx, ev->group_idx);
    if (rc == 0 && n > 10)
        rc = pack_str(pk, &ev->spec_kind);
    if (rc == 0 && n > 11)
        rc = pack_opt_int(pk, ev->has_sliding_window, ev->sliding_window);
    return rc;
}

static int array_removed(msgpack_packer *pk, const struct kvr_emp_event *ev)
{
    uint32_t n = 3;
    if (ev->has_group_idx)
        n = 4;
    if (ev->spec_kind.p != NULL)
        n = 5;
    if (ev->has_sliding_window)
        n = 6;
    if (ev->locality.p != NULL)
        n = 7;
    int rc = msgpack_pack_array(pk, n);
    rc = rc ? rc : pack_cstr(pk, "BlockRemoved");
    rc = rc ? rc : pack_hashes(pk, ev->hashes, ev->n_hashes);
    rc = rc ? rc : pack_str(pk, &ev->medium);
    if (rc == 0 && n > 3)
        rc = pack_opt_int(pk, ev->has_group_idx, ev->group_idx);
    if (rc == 0 && n > 4)
        rc = pack_str(pk, &ev->spec_kind);
    if (rc == 0 && n > 5)
        rc = pack_opt_int(pk, ev->has_sliding_window, ev->sliding_window);
    if (rc == 0 && n > 6)
        rc = pack_str(pk, &ev->locality);
    return rc;
}

static int pack_event(msgpack_packer *pk, const struct kvr_emp_event *ev, int positional)
{
    if (ev->kind == KVR_EVENT_STORED)
        return positional ? array_stored(pk, ev) : map_stored(pk, ev);
    if (ev->kind == KVR_EVENT_REMOVED)
        return positional ? array_removed(pk, ev) : map_removed(pk, ev);
    if (positional) {
        int rc = msgpack_pack_array(pk, 1);
        return rc ? rc : pack_cstr(pk, tag_name(ev->kind));
    }
    int rc = msgpack_pack_map(pk, 1);
    rc = rc ? rc : pack_key(pk, "type");
    return rc ? rc : pack_cstr(pk, tag_name(ev->kind));
}

static int valid_event(const struct kvr_emp_event *ev, int era)
{
    if (ev->kind < KVR_EVENT_STORED || ev->kind > KVR_EVENT_CLEARED)
        return 0;
    if (ev->kind == KVR_EVENT_CLEARED)
        return 1;
    if (ev->n_hashes > 0 && ev->hashes == NULL)
        return 0;
    if (ev->kind == KVR_EVENT_STORED) {
        if (ev->token_width != 1 && ev->token_width != 2)
            return 0;
        if (ev->n_tokens > 0 && ev->token_ids == NULL)
            return 0;
        if (ev->n_mm_blocks > 0 && (ev->mm_off == NULL || ev->mm_hashes == NULL))
            return 0;
        /* positional index 7 holds either lora_name or the salt map, never both */
        if (era == KVR_EMP_ERA_A && ev->lora_name.p != NULL && ev->cache_salt.p != NULL)
            return 0;
    }
    return 1;
}

/* ==== the batch =============================================================================== */

int kvr_emp_encode(const struct kvr_emp_batch *b, int era, kvr_alloc_t *alloc, uint8_t **out,
                   size_t *out_len)
{
    if (era != KVR_EMP_ERA_A && era != KVR_EMP_ERA_B && era != KVR_EMP_ERA_C)
        return KVR_EINVAL;
    if (b->n > 0 && b->ev == NULL)
        return KVR_EINVAL;
    for (uint32_t k = 0; k < b->n; k++)
        if (!valid_event(&b->ev[k], era))
            return KVR_EINVAL;
    struct out o = {alloc, NULL, 0, 0};
    msgpack_packer pk;
    msgpack_packer_init(&pk, &o, out_write);
    int rc;
    if (era == KVR_EMP_ERA_C) {
        rc = msgpack_pack_map(&pk, 3);
        rc = rc ? rc : pack_key(&pk, "ts");
    } else {
        rc = msgpack_pack_array(&pk, 3);
    }
    rc = rc ? rc : msgpack_pack_double(&pk, b->ts);
    if (rc == 0 && era == KVR_EMP_ERA_C)
        rc = pack_key(&pk, "events");
    rc = rc ? rc : msgpack_pack_array(&pk, b->n);
    for (uint32_t k = 0; rc == 0 && k < b->n; k++)
        rc = pack_event(&pk, &b->ev[k], era == KVR_EMP_ERA_A);
    if (rc == 0 && era == KVR_EMP_ERA_C)
        rc = pack_key(&pk, "data_parallel_rank");
    if (rc == 0)
        rc = b->has_dp_rank ? msgpack_pack_uint32(&pk, b->dp_rank) : msgpack_pack_nil(&pk);
    if (rc != 0) {
        kvr_free(alloc, o.p);
        return KVR_ENOMEM;
    }
    *out = o.p;
    *out_len = o.len;
    return KVR_OK;
}
