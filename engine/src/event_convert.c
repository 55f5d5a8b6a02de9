/* event_convert.c - engine batches -> index events (see kvr/event_convert.h;
 * spec/engine-events.md §7). */
#include "kvr/event_convert.h"

#include <stdlib.h>
#include <string.h>

#include "kvr/err.h"
#include "kvr/hash.h"

/* ==== helpers ================================================================================ */

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

/* 1 if any value repeats among parent (when present) + hashes. Small events compare pairwise;
 * large ones sort a scratch copy. Returns a negative KVR_E* on allocation failure. */
static int has_repeat(kvr_alloc_t *a, const struct kvr_emp_event *ev)
{
    size_t n = ev->n_hashes + (ev->has_parent ? 1u : 0u);
    if (n < 2)
        return 0;
    if (n <= 32) {
        for (uint32_t i = 0; i < ev->n_hashes; i++) {
            if (ev->has_parent && ev->hashes[i] == ev->parent_hash)
                return 1;
            for (uint32_t j = i + 1; j < ev->n_hashes; j++)
                if (ev->hashes[i] == ev->hashes[j])
                    return 1;
        }
        return 0;
    }
    uint64_t *v = kvr_malloc(a, n * sizeof(uint64_t));
    if (v == NULL)
        return KVR_ENOMEM;
    memcpy(v, ev->hashes, (size_t)ev->n_hashes * sizeof(uint64_t));
    if (ev->has_parent)
        v[n - 1] = ev->parent_hash;
    qsort(v, n, sizeof(uint64_t), cmp_u64);
    int rep = 0;
    for (size_t i = 1; i < n && !rep; i++)
        rep = v[i] == v[i - 1];
    kvr_free(a, v);
    return rep;
}

/* The token sequence of a store, in a scratch copy when it must be rewritten (bigram pairs,
 * image-token runs). *owned tells the caller to free it. */
static int event_tokens(kvr_alloc_t *a, const struct kvr_emp_event *ev,
                        const struct kvr_convert_opts *o, const uint32_t **tokens, size_t *n,
                        uint32_t **owned)
{
    int rewrite_image = o->has_image_token_id && ev->n_mm_blocks > 0;
    *owned = NULL;
    *tokens = ev->token_ids;
    *n = ev->n_tokens;
    if (ev->token_width == 1 && !rewrite_image)
        return KVR_OK;
    /* bigrams [t_i, t_i+1] -> t_0 .. t_n: n + 1 tokens */
    size_t cnt = ev->token_width == 2 ? (size_t)ev->n_tokens + (ev->n_tokens > 0) : ev->n_tokens;
    if (cnt == 0)
        return KVR_OK;
    uint32_t *t = kvr_malloc(a, cnt * sizeof(uint32_t));
    if (t == NULL)
        return KVR_ENOMEM;
    if (ev->token_width == 2) {
        for (uint32_t i = 0; i < ev->n_tokens; i++)
            t[i] = ev->token_ids[2 * i];
        t[ev->n_tokens] = ev->token_ids[2 * (size_t)ev->n_tokens - 1];
    } else {
        memcpy(t, ev->token_ids, cnt * sizeof(uint32_t));
    }
    if (rewrite_image) {
        /* run k of image tokens -> pad_value(k-th mm hash of the event) (hashing.md §4) */
        uint32_t total = ev->mm_off[ev->n_mm_blocks];
        uint32_t k = 0;
        size_t i = 0;
        while (i < cnt) {
            if (t[i] != o->image_token_id) {
                i++;
                continue;
            }
            size_t j = i;
            while (j < cnt && t[j] == o->image_token_id)
                j++;
            if (k < total) {
                uint32_t pad = kvr_hash_mm_pad_value(ev->mm_hashes[k]);
                for (size_t x = i; x < j; x++)
                    t[x] = pad;
            }
            k++;
            i = j;
        }
    }
    *tokens = t;
    *n = cnt;
    *owned = t;
    return KVR_OK;
}

static void set_common(struct kvr_event *e, const struct kvr_convert_opts *o, uint32_t rank,
                       uint64_t seq, uint8_t tier)
{
    e->worker_id = o->worker_id;
    e->dp_rank = rank;
    e->event_id = seq;
    e->tier = tier;
    e->domain = KVR_DOMAIN_WORKER;
}

/* ==== one store ============================================================================== */

static int convert_stored(const struct kvr_emp_batch *b, const struct kvr_emp_event *ev,
                          const struct kvr_convert_opts *o, uint32_t rank, uint64_t seq,
                          struct kvr_event_list *out, struct kvr_convert_counters *c)
{
    kvr_alloc_t *a = b->alloc;
    struct kvr_event *e;
    int rep = has_repeat(a, ev);
    if (rep < 0)
        return rep;
    if (rep) {
        /* a chain that names itself: an empty removal (no-op), never a clear */
        if (kvr_event_list_emplace(out, KVR_EVENT_REMOVED, 0, &e) != KVR_OK)
            return KVR_ENOMEM;
        set_common(e, o, rank, seq, ev->tier);
        c->self_ref++;
        c->events[KVR_EVENT_REMOVED]++;
        c->tier[ev->tier]++;
        return KVR_OK;
    }
    if (ev->n_hashes == 0) {
        c->empty_stores++;
        return KVR_OK;
    }
    if (ev->block_size != o->block_size) {
        c->block_size_mismatch++;
        c->blocks_dropped += ev->n_hashes;
        c->empty_stores++;
        return KVR_OK;
    }
    const uint32_t *tokens;
    size_t n_tokens;
    uint32_t *owned;
    if (event_tokens(a, ev, o, &tokens, &n_tokens, &owned) != KVR_OK)
        return KVR_ENOMEM;
    uint32_t bs = o->block_size;
    size_t window = (size_t)bs + (o->eagle ? 1u : 0u);
    /* blocks with all their tokens; stop at the first short one */
    uint32_t nblocks = 0;
    while (nblocks < ev->n_hashes && (size_t)nblocks * bs + window <= n_tokens)
        nblocks++;
    if (nblocks < ev->n_hashes)
        c->short_tokens++;
    else if (ev->n_tokens > (size_t)ev->n_hashes * bs + (o->eagle && ev->token_width == 1))
        c->extra_tokens++; /* (bigram pairs count as one token each here) */

    uint64_t seed = KVR_HASH_SEED;
    const struct kvr_emp_str *ns = o->no_namespace ? NULL : &ev->cache_salt;
    /* the event's own LoRA wins; the registered default covers engines that send none */
    const char *lora = ev->lora_name.p;
    size_t lora_len = lora != NULL ? ev->lora_name.len : 0;
    if (lora_len == 0) {
        lora = o->default_lora;
        lora_len = lora != NULL ? o->default_lora_len : 0;
    }
    seed = kvr_hash_salt(ns ? ns->p : NULL, ns ? ns->len : 0, lora, lora_len);
    int use_mm = ev->n_mm_blocks > 0 && !o->has_image_token_id;

    int rc = KVR_OK;
    uint32_t emitted = 0;
    if (nblocks > 0) {
        rc = kvr_event_list_emplace(out, KVR_EVENT_STORED, nblocks, &e);
        if (rc != KVR_OK)
            goto done;
        set_common(e, o, rank, seq, ev->tier);
        e->has_parent = ev->has_parent;
        e->parent_hash = ev->parent_hash;
        for (uint32_t i = 0; i < nblocks; i++) {
            struct kvr_block_mm mm = {NULL, 0};
            struct kvr_hash_opts ho = {seed, o->eagle, NULL, 0};
            if (use_mm && i < ev->n_mm_blocks) {
                mm.mm_hashes = ev->mm_hashes + ev->mm_off[i];
                mm.n_mm = ev->mm_off[i + 1] - ev->mm_off[i];
                ho.mm = &mm;
                ho.n_mm_blocks = 1;
            }
            uint64_t h;
            size_t got;
            if (kvr_hash_blocks(tokens + (size_t)i * bs, window, bs, &ho, &h, 1, &got) != KVR_OK ||
                got != 1) {
                c->mm_invalid++;
                break;
            }
            e->blocks[i].block_hash = ev->hashes[i];
            e->blocks[i].tokens_hash = h;
            emitted++;
        }
        if (emitted == 0) {
            kvr_event_list_pop(out);
        } else {
            e->n = emitted;
            c->events[KVR_EVENT_STORED]++;
            c->tier[ev->tier]++;
            c->blocks += emitted;
        }
    }
    if (emitted == 0)
        c->empty_stores++;
    c->blocks_dropped += ev->n_hashes - emitted;
done:
    kvr_free(a, owned);
    return rc;
}

static void add_counters(struct kvr_convert_counters *d, const struct kvr_convert_counters *s)
{
    for (int k = 0; k < 4; k++)
        d->events[k] += s->events[k];
    for (int t = 0; t < KVR_TIER_COUNT_; t++)
        d->tier[t] += s->tier[t];
    d->blocks += s->blocks;
    d->self_ref += s->self_ref;
    d->block_size_mismatch += s->block_size_mismatch;
    d->short_tokens += s->short_tokens;
    d->extra_tokens += s->extra_tokens;
    d->mm_invalid += s->mm_invalid;
    d->blocks_dropped += s->blocks_dropped;
    d->empty_stores += s->empty_stores;
    d->group_filtered += s->group_filtered;
}

/* ==== the batch ============================================================================== */

int kvr_convert_batch(const struct kvr_emp_batch *b, uint64_t seq, const struct kvr_convert_opts *o,
                      struct kvr_event_list *out, struct kvr_convert_counters *counters)
{
    struct kvr_convert_counters local;
    memset(&local, 0, sizeof(local));
    if (o->block_size == 0)
        return KVR_EINVAL;
    uint32_t rank = b->has_dp_rank ? b->dp_rank : o->dp_rank;
    size_t n0 = out->n;
    int rc = KVR_OK;
    for (uint32_t k = 0; k < b->n && rc == KVR_OK; k++) {
        const struct kvr_emp_event *ev = &b->ev[k];
        struct kvr_event *e;
        if (o->has_group_filter && ev->has_group_idx && ev->group_idx != o->group_idx) {
            local.group_filtered++;
            continue;
        }
        switch (ev->kind) {
        case KVR_EVENT_STORED:
            rc = convert_stored(b, ev, o, rank, seq, out, &local);
            break;
        case KVR_EVENT_REMOVED:
            rc = kvr_event_list_emplace(out, KVR_EVENT_REMOVED, ev->n_hashes, &e);
            if (rc != KVR_OK)
                break;
            set_common(e, o, rank, seq, ev->tier);
            if (ev->n_hashes > 0)
                memcpy(e->hashes, ev->hashes, (size_t)ev->n_hashes * sizeof(uint64_t));
            local.events[KVR_EVENT_REMOVED]++;
            local.tier[ev->tier]++;
            break;
        case KVR_EVENT_CLEARED:
            rc = kvr_event_list_emplace(out, KVR_EVENT_CLEARED, 0, &e);
            if (rc != KVR_OK)
                break;
            set_common(e, o, rank, seq, KVR_TIER_DEVICE);
            local.events[KVR_EVENT_CLEARED]++;
            break;
        default:
            break;
        }
    }
    if (rc != KVR_OK) {
        while (out->n > n0)
            kvr_event_list_pop(out);
        return rc;
    }
    if (counters != NULL)
        add_counters(counters, &local);
    return KVR_OK;
}
