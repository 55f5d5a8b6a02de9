/* ckf_frame.c - CKF1 frame codec and the frame-fed consumer (kvr/ckf_frame.h).
 * SPDX-License-Identifier: Apache-2.0 */
#include "kvr/ckf_frame.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <xxhash.h>

#include "kvr/err.h"
#include "kvr/hash.h"

/* ==== little-endian helpers =================================================================== */

static void put16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}

static void put32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static void put64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static uint16_t get16(const uint8_t *p)
{
    return (uint16_t)(p[0] | (p[1] << 8));
}

static uint32_t get32(const uint8_t *p)
{
    uint32_t v = 0;
    for (int i = 3; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

static uint64_t get64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

/* ==== codec =================================================================================== */

uint32_t kvr_ckf_frame_chunk_count(uint64_t num_buckets)
{
    uint64_t n = (num_buckets + KVR_CKF_CHUNK_BUCKETS - 1) / KVR_CKF_CHUNK_BUCKETS;
    return n > UINT32_MAX ? 0 : (uint32_t)n;
}

static uint64_t chunk_buckets(uint64_t num_buckets, uint32_t chunk_index)
{
    uint64_t off = (uint64_t)chunk_index * KVR_CKF_CHUNK_BUCKETS;
    if (off >= num_buckets)
        return 0;
    uint64_t left = num_buckets - off;
    return left < KVR_CKF_CHUNK_BUCKETS ? left : KVR_CKF_CHUNK_BUCKETS;
}

size_t kvr_ckf_frame_snapshot_len(uint64_t num_buckets, uint32_t chunk_index)
{
    uint64_t nb = chunk_buckets(num_buckets, chunk_index);
    if (nb == 0)
        return 0;
    return KVR_CKF_FRAME_HEADER_LEN + KVR_CKF_SNAPSHOT_BODY_FIXED + (size_t)nb * 8;
}

size_t kvr_ckf_frame_delta_len(size_t count)
{
    return KVR_CKF_FRAME_HEADER_LEN + KVR_CKF_DELTA_BODY_FIXED + count * KVR_CKF_DELTA_ENTRY_LEN;
}

static void write_header(uint8_t *out, uint16_t flags, const struct kvr_ckf_view *v,
                         uint64_t dc_worker_id, uint64_t epoch, size_t body_len)
{
    memcpy(out, "CKF1", 4);
    put16(out + 4, KVR_CKF_FRAME_VERSION);
    put16(out + 6, flags);
    out[8] = KVR_CKF_FP_BITS;
    out[9] = KVR_CKF_SLOTS;
    put16(out + 10, 0);
    put64(out + 12, v->seed);
    put64(out + 20, v->mask + 1);
    put64(out + 28, dc_worker_id);
    put64(out + 36, epoch);
    const uint8_t *body = out + KVR_CKF_FRAME_HEADER_LEN;
    put32(out + 44, (uint32_t)XXH3_64bits_withSeed(body, body_len, 0));
}

int kvr_ckf_frame_encode_snapshot(const struct kvr_ckf_view *v, uint64_t dc_worker_id,
                                  uint64_t epoch, uint32_t chunk_index, uint8_t *out, size_t cap,
                                  size_t *len)
{
    uint64_t num_buckets = v->mask + 1;
    size_t need = kvr_ckf_frame_snapshot_len(num_buckets, chunk_index);
    if (need == 0)
        return KVR_EINVAL;
    if (cap < need)
        return KVR_ERANGE;
    uint64_t nb = chunk_buckets(num_buckets, chunk_index);
    uint64_t off = (uint64_t)chunk_index * KVR_CKF_CHUNK_BUCKETS;
    uint8_t *body = out + KVR_CKF_FRAME_HEADER_LEN;
    put32(body, chunk_index);
    put32(body + 4, kvr_ckf_frame_chunk_count(num_buckets));
    put64(body + 8, off);
    uint8_t *p = body + KVR_CKF_SNAPSHOT_BODY_FIXED;
    for (uint64_t i = 0; i < nb; i++, p += 8)
        put64(p, kvr_ckf_view_get(v, off + i)); /* le64(word) == 4 × le16(slot 0..3) */
    write_header(out, KVR_CKF_FRAME_SNAPSHOT, v, dc_worker_id, epoch,
                 need - KVR_CKF_FRAME_HEADER_LEN);
    *len = need;
    return KVR_OK;
}

int kvr_ckf_frame_encode_delta(const struct kvr_ckf_view *v, uint64_t dc_worker_id,
                               uint64_t base_epoch, const uint64_t *buckets, size_t n, uint8_t *out,
                               size_t cap, size_t *len)
{
    uint64_t num_buckets = v->mask + 1;
    if (base_epoch == UINT64_MAX || num_buckets > ((uint64_t)1 << 32) || n > UINT32_MAX)
        return KVR_EINVAL;
    for (size_t i = 0; i < n; i++)
        if (buckets[i] >= num_buckets || (i > 0 && buckets[i] <= buckets[i - 1]))
            return KVR_EINVAL;
    size_t need = kvr_ckf_frame_delta_len(n);
    if (cap < need)
        return KVR_ERANGE;
    uint8_t *body = out + KVR_CKF_FRAME_HEADER_LEN;
    put64(body, base_epoch);
    uint8_t *p = body + KVR_CKF_DELTA_BODY_FIXED;
    for (size_t i = 0; i < n; i++, p += KVR_CKF_DELTA_ENTRY_LEN) {
        put32(p, (uint32_t)buckets[i]);
        put64(p + 4, kvr_ckf_view_get(v, buckets[i]));
    }
    put32(body + 8, (uint32_t)n); /* the count, "backfilled" once the entries are written */
    write_header(out, KVR_CKF_FRAME_DELTA, v, dc_worker_id, base_epoch + 1,
                 need - KVR_CKF_FRAME_HEADER_LEN);
    *len = need;
    return KVR_OK;
}

#define REJECT(reason)                                                                             \
    do {                                                                                           \
        if (why != NULL)                                                                           \
            *why = (reason);                                                                       \
        return KVR_ECORRUPT;                                                                       \
    } while (0)

int kvr_ckf_frame_decode(const uint8_t *buf, size_t len, struct kvr_ckf_frame *out,
                         const char **why)
{
    memset(out, 0, sizeof(*out));
    if (len < KVR_CKF_FRAME_HEADER_LEN)
        REJECT("truncated header");
    if (memcmp(buf, "CKF1", 4) != 0)
        REJECT("bad magic");
    if (get16(buf + 4) != KVR_CKF_FRAME_VERSION)
        REJECT("unsupported version");
    out->flags = get16(buf + 6);
    if (buf[8] != KVR_CKF_FP_BITS)
        REJECT("fingerprint bits != 16");
    if (buf[9] != KVR_CKF_SLOTS)
        REJECT("slots per bucket != 4");
    if (get16(buf + 10) != 0)
        REJECT("reserved field not zero");
    out->seed = get64(buf + 12);
    out->num_buckets = get64(buf + 20);
    out->dc_worker_id = get64(buf + 28);
    out->epoch = get64(buf + 36);
    out->checksum = get32(buf + 44);
    if (!kvr_ckf_buckets_valid(out->num_buckets))
        REJECT("bucket count not a power of two >= 2");
    const uint8_t *body = buf + KVR_CKF_FRAME_HEADER_LEN;
    size_t body_len = len - KVR_CKF_FRAME_HEADER_LEN;
    if ((uint32_t)XXH3_64bits_withSeed(body, body_len, 0) != out->checksum)
        REJECT("body checksum mismatch");
    if (out->flags == KVR_CKF_FRAME_SNAPSHOT) {
        if (body_len < KVR_CKF_SNAPSHOT_BODY_FIXED)
            REJECT("truncated snapshot body");
        out->chunk_index = get32(body);
        out->chunk_count = get32(body + 4);
        out->bucket_offset = get64(body + 8);
        if (out->chunk_count != kvr_ckf_frame_chunk_count(out->num_buckets))
            REJECT("chunk count does not cover num_buckets");
        if (out->chunk_index >= out->chunk_count)
            REJECT("chunk index out of range");
        if (out->bucket_offset != (uint64_t)out->chunk_index * KVR_CKF_CHUNK_BUCKETS)
            REJECT("chunk bucket offset inconsistent");
        out->chunk_buckets = chunk_buckets(out->num_buckets, out->chunk_index);
        if ((body_len - KVR_CKF_SNAPSHOT_BODY_FIXED) / 8 != out->chunk_buckets ||
            (body_len - KVR_CKF_SNAPSHOT_BODY_FIXED) % 8 != 0)
            REJECT("snapshot body length != declared buckets");
        out->payload = body + KVR_CKF_SNAPSHOT_BODY_FIXED;
        return KVR_OK;
    }
    if (out->flags != KVR_CKF_FRAME_DELTA)
        REJECT("unknown frame flags");
    if (body_len < KVR_CKF_DELTA_BODY_FIXED)
        REJECT("truncated delta body");
    out->base_epoch = get64(body);
    out->count = get32(body + 8);
    if (body_len - KVR_CKF_DELTA_BODY_FIXED != (size_t)out->count * KVR_CKF_DELTA_ENTRY_LEN)
        REJECT("delta body length != declared entries");
    if (out->base_epoch == UINT64_MAX || out->epoch != out->base_epoch + 1)
        REJECT("delta epoch != base_epoch + 1");
    out->payload = body + KVR_CKF_DELTA_BODY_FIXED;
    for (uint32_t i = 0; i < out->count; i++) {
        uint32_t b = get32(out->payload + (size_t)i * KVR_CKF_DELTA_ENTRY_LEN);
        if (b >= out->num_buckets)
            REJECT("delta bucket out of range");
        if (i > 0 && b <= get32(out->payload + (size_t)(i - 1) * KVR_CKF_DELTA_ENTRY_LEN))
            REJECT("delta buckets not strictly increasing");
    }
    return KVR_OK;
}

uint64_t kvr_ckf_frame_chunk_word(const struct kvr_ckf_frame *f, uint64_t i)
{
    return get64(f->payload + i * 8);
}

void kvr_ckf_frame_delta_entry(const struct kvr_ckf_frame *f, uint32_t i, uint32_t *bucket,
                               uint64_t *word)
{
    const uint8_t *p = f->payload + (size_t)i * KVR_CKF_DELTA_ENTRY_LEN;
    *bucket = get32(p);
    *word = get64(p + 4);
}

/* ==== consumer ================================================================================ */

/* The last DUP_WINDOW applied deltas of a lane, as (base_epoch, body checksum): a delta whose
 * base is behind the installed epoch is a harmless duplicate only if it is one of these. */
#define DUP_WINDOW 16u

struct lane {
    int state;             /* enum kvr_ckf_lane_state */
    uint64_t dc_worker_id; /* bound producer */
    uint64_t epoch;        /* installed sequence (READY) or snapshot epoch (LOADING) */
    uint64_t high;         /* highest epoch installed from this producer (0 if none) */
    uint32_t next_chunk;   /* LOADING: expected chunk index */
    uint64_t retirements;
    uint64_t restarts;
    uint64_t applied;
    uint64_t ignored;
    uint64_t dup_base[DUP_WINDOW]; /* ring of recently applied deltas */
    uint32_t dup_sum[DUP_WINDOW];
    uint32_t dup_n, dup_next;
    char error[200]; /* last retirement reason */
};

struct kvr_ckf_consumer {
    kvr_alloc_t alloc;      /* owns this struct */
    kvr_ckf_table_t *table; /* the lanes' buckets (own allocator) */
    _Atomic uint16_t ready; /* READY lanes; release store, acquire load */
    uint32_t lanes;
    struct lane lane[KVR_CKF_LANES_MAX];
};

int kvr_ckf_consumer_new(uint32_t lanes, uint64_t num_buckets, uint64_t seed,
                         kvr_ckf_consumer_t **out)
{
    kvr_alloc_t a;
    kvr_alloc_init(&a);
    kvr_ckf_consumer_t *c = kvr_calloc(&a, 1, sizeof(*c));
    if (c == NULL)
        return KVR_ENOMEM;
    int rc = kvr_ckf_table_new(lanes, num_buckets, seed, &c->table);
    if (rc != KVR_OK) {
        kvr_free(&a, c);
        return rc;
    }
    c->lanes = lanes;
    atomic_init(&c->ready, 0);
    c->alloc = a;
    *out = c;
    return KVR_OK;
}

void kvr_ckf_consumer_free(kvr_ckf_consumer_t *c)
{
    if (c == NULL)
        return;
    kvr_ckf_table_free(c->table);
    kvr_alloc_t a = c->alloc;
    kvr_free(&a, c);
}

static void set_ready(kvr_ckf_consumer_t *c, uint32_t lane, int on)
{
    uint16_t m = atomic_load_explicit(&c->ready, memory_order_relaxed);
    m = on ? (uint16_t)(m | (1u << lane)) : (uint16_t)(m & ~(1u << lane));
    atomic_store_explicit(&c->ready, m, memory_order_release);
}

/* Forgets what the lane installed from its producer: the highest epoch and recent deltas. */
static void lane_forget_history(struct lane *l)
{
    l->high = 0;
    l->dup_n = l->dup_next = 0;
}

int kvr_ckf_consumer_bind(kvr_ckf_consumer_t *c, uint32_t lane, uint64_t dc_worker_id)
{
    if (lane >= c->lanes)
        return KVR_EINVAL;
    set_ready(c, lane, 0);
    struct lane *l = &c->lane[lane];
    l->state = KVR_CKF_LANE_AWAITING;
    l->dc_worker_id = dc_worker_id;
    l->epoch = 0;
    l->next_chunk = 0;
    lane_forget_history(l);
    l->error[0] = '\0';
    return KVR_OK;
}

__attribute__((format(printf, 2, 0))) static void set_error(struct lane *l, const char *fmt,
                                                            va_list ap)
{
    vsnprintf(l->error, sizeof(l->error), fmt, ap);
}

/* Retires a lane: invisible to queries until a new snapshot; keeps the reason. */
__attribute__((format(printf, 5, 6))) static int
retire(kvr_ckf_consumer_t *c, uint32_t lane, int code, int *outcome, const char *fmt, ...)
{
    struct lane *l = &c->lane[lane];
    set_ready(c, lane, 0);
    l->state = KVR_CKF_LANE_AWAITING;
    l->retirements++;
    va_list ap;
    va_start(ap, fmt);
    set_error(l, fmt, ap);
    va_end(ap);
    if (outcome != NULL)
        *outcome = KVR_CKF_FEED_RETIRED;
    return code;
}

/* Records a producer restart seen by a snapshot: the lane retires (counted only if it was
 * READY or LOADING: an AWAITING lane is retired already), its history is forgotten. The caller
 * (feed_snapshot) then clears the ready bit and sets the lane LOADING. */
__attribute__((format(printf, 3, 4))) static void note_restart(kvr_ckf_consumer_t *c, uint32_t lane,
                                                               const char *fmt, ...)
{
    struct lane *l = &c->lane[lane];
    if (l->state == KVR_CKF_LANE_READY || l->state == KVR_CKF_LANE_LOADING)
        l->retirements++;
    l->restarts++;
    lane_forget_history(l);
    va_list ap;
    va_start(ap, fmt);
    set_error(l, fmt, ap);
    va_end(ap);
}

static int ignore(struct lane *l, int *outcome)
{
    l->ignored++;
    if (outcome != NULL)
        *outcome = KVR_CKF_FEED_IGNORED;
    return KVR_OK;
}

static int applied(struct lane *l, int *outcome)
{
    l->applied++;
    if (outcome != NULL)
        *outcome = KVR_CKF_FEED_APPLIED;
    return KVR_OK;
}

static void note_installed(struct lane *l)
{
    if (l->epoch > l->high)
        l->high = l->epoch;
}

static int feed_snapshot(kvr_ckf_consumer_t *c, uint32_t lane, const struct kvr_ckf_frame *f,
                         int *outcome)
{
    struct lane *l = &c->lane[lane];
    struct kvr_ckf_view v;
    int restarted = 0;
    if (f->chunk_index == 0) {
        /* A snapshot older than what this producer already installed: its epoch went
         * backwards, so the producer restarted (epochs start again at 0) or this is very late
         * traffic. Either way the installed table cannot be trusted to continue from it: retire
         * the lane (with the reason) and reload from this snapshot. */
        if (f->epoch < l->high) {
            note_restart(c, lane,
                         "producer restarted? snapshot epoch %llu is behind installed epoch "
                         "%llu: lane retired, reloading from the new snapshot",
                         (unsigned long long)f->epoch, (unsigned long long)l->high);
            restarted = 1;
        }
        set_ready(c, lane, 0);
        l->state = KVR_CKF_LANE_LOADING;
        l->epoch = f->epoch;
        l->next_chunk = 0;
    } else if (l->state != KVR_CKF_LANE_LOADING) {
        return ignore(l, outcome); /* the middle of a snapshot we did not start */
    } else if (f->chunk_index != l->next_chunk || f->epoch != l->epoch) {
        return retire(c, lane, KVR_ESTATE, outcome,
                      "snapshot chunk out of order (got chunk %llu, expected %llu)",
                      (unsigned long long)f->chunk_index, (unsigned long long)l->next_chunk);
    }
    kvr_ckf_table_view(c->table, lane, &v);
    for (uint64_t i = 0; i < f->chunk_buckets; i++)
        kvr_ckf_view_put(&v, f->bucket_offset + i, kvr_ckf_frame_chunk_word(f, i));
    l->next_chunk = f->chunk_index + 1;
    if (l->next_chunk == f->chunk_count) {
        l->state = KVR_CKF_LANE_READY;
        note_installed(l);
        set_ready(c, lane, 1);
    }
    applied(l, outcome);
    if (restarted && outcome != NULL)
        *outcome = KVR_CKF_FEED_RESTARTED;
    return KVR_OK;
}

static int is_duplicate(const struct lane *l, const struct kvr_ckf_frame *f)
{
    for (uint32_t i = 0; i < l->dup_n; i++)
        if (l->dup_base[i] == f->base_epoch && l->dup_sum[i] == f->checksum)
            return 1;
    return 0;
}

static int feed_delta(kvr_ckf_consumer_t *c, uint32_t lane, const struct kvr_ckf_frame *f,
                      int *outcome)
{
    struct lane *l = &c->lane[lane];
    if (l->state != KVR_CKF_LANE_READY)
        return ignore(l, outcome); /* needs a snapshot first */
    if (f->base_epoch < l->epoch) {
        if (is_duplicate(l, f))
            return ignore(l, outcome); /* a re-delivered delta: already applied */
        /* Behind the installed epoch and not one we applied: a restarted producer counting
         * from 0 again (its deltas must never be mixed into the old table), or a delta from
         * before the snapshot delivered after it. Both need a snapshot. */
        return retire(c, lane, KVR_ESTATE, outcome,
                      "producer restarted? delta base epoch %llu is behind installed epoch %llu "
                      "and is not a recently applied delta; snapshot required",
                      (unsigned long long)f->base_epoch, (unsigned long long)l->epoch);
    }
    if (f->base_epoch > l->epoch)
        return retire(c, lane, KVR_ESTATE, outcome,
                      "sequence gap: delta base epoch %llu, installed epoch %llu "
                      "(a delta was lost or reordered); snapshot required",
                      (unsigned long long)f->base_epoch, (unsigned long long)l->epoch);
    struct kvr_ckf_view v;
    kvr_ckf_table_view(c->table, lane, &v);
    for (uint32_t i = 0; i < f->count; i++) {
        uint32_t b;
        uint64_t w;
        kvr_ckf_frame_delta_entry(f, i, &b, &w);
        kvr_ckf_view_put(&v, b, w); /* one atomic store per bucket */
    }
    l->epoch = f->epoch;
    note_installed(l);
    l->dup_base[l->dup_next] = f->base_epoch;
    l->dup_sum[l->dup_next] = f->checksum;
    l->dup_next = (l->dup_next + 1) % DUP_WINDOW;
    if (l->dup_n < DUP_WINDOW)
        l->dup_n++;
    return applied(l, outcome);
}

int kvr_ckf_consumer_feed(kvr_ckf_consumer_t *c, uint32_t lane, const uint8_t *buf, size_t len,
                          int *outcome)
{
    if (lane >= c->lanes)
        return KVR_EINVAL;
    struct lane *l = &c->lane[lane];
    if (l->state == KVR_CKF_LANE_UNBOUND)
        return ignore(l, outcome);
    struct kvr_ckf_frame f;
    const char *why = "";
    if (kvr_ckf_frame_decode(buf, len, &f, &why) != KVR_OK) {
        /* an undecodable frame cannot prove it is foreign: the lane's stream is broken */
        return retire(c, lane, KVR_ECORRUPT, outcome, "malformed frame: %s; snapshot required",
                      why);
    }
    if (f.dc_worker_id != l->dc_worker_id)
        return ignore(l, outcome);
    uint64_t want_nb = kvr_ckf_table_buckets(c->table);
    if (f.seed != kvr_ckf_table_seed(c->table))
        return retire(c, lane, KVR_ESTATE, outcome,
                      "seed mismatch: frame seed %#llx, consumer seed %#llx; snapshot required",
                      (unsigned long long)f.seed, (unsigned long long)kvr_ckf_table_seed(c->table));
    if (f.num_buckets != want_nb)
        return retire(c, lane, KVR_ESTATE, outcome,
                      "shape mismatch: frame has %llu buckets, consumer lanes have %llu",
                      (unsigned long long)f.num_buckets, (unsigned long long)want_nb);
    if (f.flags == KVR_CKF_FRAME_SNAPSHOT)
        return feed_snapshot(c, lane, &f, outcome);
    return feed_delta(c, lane, &f, outcome);
}

int kvr_ckf_consumer_lane_info(const kvr_ckf_consumer_t *c, uint32_t lane,
                               struct kvr_ckf_lane_info *out)
{
    if (lane >= c->lanes)
        return KVR_EINVAL;
    const struct lane *l = &c->lane[lane];
    out->state = l->state;
    out->dc_worker_id = l->dc_worker_id;
    out->epoch = l->epoch;
    out->retirements = l->retirements;
    out->restarts = l->restarts;
    out->applied = l->applied;
    out->ignored = l->ignored;
    out->error = l->error;
    return KVR_OK;
}

uint16_t kvr_ckf_consumer_ready(const kvr_ckf_consumer_t *c)
{
    return atomic_load_explicit(&c->ready, memory_order_acquire);
}

void kvr_ckf_consumer_search(const kvr_ckf_consumer_t *c, const uint64_t *seq, size_t n,
                             unsigned window, uint32_t depths[KVR_CKF_LANES_MAX])
{
    kvr_ckf_table_search(c->table, seq, n, kvr_ckf_consumer_ready(c), window, depths);
}

int kvr_ckf_consumer_search_locals(const kvr_ckf_consumer_t *c, const uint64_t *locals, size_t n,
                                   unsigned window, uint32_t depths[KVR_CKF_LANES_MAX])
{
    uint64_t stack[512], *seq = stack;
    kvr_alloc_t scratch; /* call-local: searches run on any thread */
    kvr_alloc_init(&scratch);
    if (n > sizeof(stack) / sizeof(stack[0])) {
        seq = n <= SIZE_MAX / sizeof(*seq) ? kvr_malloc(&scratch, n * sizeof(*seq)) : NULL;
        if (seq == NULL) {
            memset(depths, 0, KVR_CKF_LANES_MAX * sizeof(*depths));
            return KVR_ENOMEM;
        }
    }
    kvr_hash_chain(locals, n, seq);
    kvr_ckf_consumer_search(c, seq, n, window, depths);
    if (seq != stack)
        kvr_free(&scratch, seq);
    return KVR_OK;
}

const kvr_ckf_table_t *kvr_ckf_consumer_table(const kvr_ckf_consumer_t *c)
{
    return c->table;
}
