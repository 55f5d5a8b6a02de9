/* hash.c - Dynamo-compatible block hashing (see kvr/hash.h and spec/hashing.md).
 *
 * Static helpers borrow every pointer they take and return nothing owned, unless their comment says
 * otherwise.
 *
 * Why two paths: the specification hashes tokens as concatenated le32 words. On a little-endian
 * host the u32 array already is that byte string, so plain blocks are hashed in one XXH3 call on
 * the caller's memory. Every other case (big-endian hosts, multimodal blocks whose bytes continue
 * with le64 mm hashes, trace ids) goes through an XXH3 streaming state fed from a small stack
 * buffer in which each word is encoded explicitly. XXH3's streaming and one-shot forms give the
 * same digest for the same bytes and seed, which the tests check vector by vector.
 */
#define XXH_STATIC_LINKING_ONLY /* XXH3_state_t on the stack: no allocation */
#include <xxhash.h>

#include "kvr/hash.h"

#include <string.h>

#include "kvr/err.h"

/* Maximum mm hashes per block (kvr_hash_blocks sorts a stack copy of them). */
#define MM_MAX 64u

/* Tokens encoded per streaming update. */
#define ENCODE_WORDS 64u

/* ==== Byte order ============================================================================= */

/* Compilers fold this to a constant. */
static int host_is_little_endian(void)
{
    const uint32_t one = 1;
    unsigned char first;
    memcpy(&first, &one, 1);
    return first == 1;
}

static void put_le32(unsigned char *p, uint32_t v)
{
    p[0] = (unsigned char)v;
    p[1] = (unsigned char)(v >> 8);
    p[2] = (unsigned char)(v >> 16);
    p[3] = (unsigned char)(v >> 24);
}

static void put_le64(unsigned char *p, uint64_t v)
{
    put_le32(p, (uint32_t)v);
    put_le32(p + 4, (uint32_t)(v >> 32));
}

/* ==== Primitives ============================================================================= */

uint64_t kvr_hash_xxh3(const void *data, size_t len, uint64_t seed)
{
    return XXH3_64bits_withSeed(data, len, seed);
}

uint64_t kvr_hash_salt(const char *ns, size_t ns_len, const char *lora, size_t lora_len)
{
    uint64_t seed = KVR_HASH_SEED;
    if (lora != NULL && lora_len > 0)
        seed += XXH3_64bits_withSeed(lora, lora_len, 0); /* wrapping */
    if (ns != NULL && ns_len > 0)
        seed += XXH3_64bits_withSeed(ns, ns_len, 1); /* wrapping; note seed 1 */
    return seed;
}

uint64_t kvr_hash_seq_next(uint64_t prev, uint64_t local)
{
    unsigned char bytes[16];
    put_le64(bytes, prev);
    put_le64(bytes + 8, local);
    return XXH3_64bits_withSeed(bytes, sizeof(bytes), KVR_HASH_SEED);
}

void kvr_hash_chain(const uint64_t *local, size_t n, uint64_t *out)
{
    if (n == 0)
        return;
    /* Each local[i] is read before out[i] is written, so out may alias local. */
    uint64_t prev = local[0];
    out[0] = prev;
    for (size_t i = 1; i < n; i++) {
        prev = kvr_hash_seq_next(prev, local[i]);
        out[i] = prev;
    }
}

/* ==== Block hashing ========================================================================== */

size_t kvr_hash_block_count(size_t n_tokens, uint32_t block_size, int eagle)
{
    if (block_size == 0 || n_tokens == 0)
        return 0;
    /* Eagle windows are block_size + 1 tokens at stride block_size: the last window needs one
     * token beyond its block, hence floor((len - 1) / stride). */
    return eagle ? (n_tokens - 1) / block_size : n_tokens / block_size;
}

/* Starts an XXH3-64 stream on a stack state. XXH3_INITSTATE is required: reset_withSeed skips
 * deriving the seeded secret when the state's stale `seed` field already equals the seed, so
 * garbage left on the stack by an earlier call would silently reuse a clobbered secret. */
static void stream_begin(XXH3_state_t *st, uint64_t seed)
{
    XXH3_INITSTATE(st);
    (void)XXH3_64bits_reset_withSeed(st, seed);
}

/* Feeds `n` tokens (borrowed) to the stream as le32 words, whatever the host byte order. */
static void stream_tokens(XXH3_state_t *st, const uint32_t *tokens, size_t n)
{
    unsigned char buf[ENCODE_WORDS * 4];
    while (n > 0) {
        size_t k = n < ENCODE_WORDS ? n : ENCODE_WORDS;
        for (size_t i = 0; i < k; i++)
            put_le32(buf + 4 * i, tokens[i]);
        (void)XXH3_64bits_update(st, buf, 4 * k);
        tokens += k;
        n -= k;
    }
}

/* Sorts n (<= MM_MAX) values ascending, in place (insertion sort: n is tiny). */
static void sort_u64(uint64_t *v, size_t n)
{
    for (size_t i = 1; i < n; i++) {
        uint64_t x = v[i];
        size_t j = i;
        while (j > 0 && v[j - 1] > x) {
            v[j] = v[j - 1];
            j--;
        }
        v[j] = x;
    }
}

/* Hashes one window of `n` tokens (borrowed), followed by the block's sorted mm hashes when mm is
 * non-NULL and non-empty (mm->n_mm <= MM_MAX, checked by the caller). */
static uint64_t hash_window(const uint32_t *tokens, size_t n, const struct kvr_block_mm *mm,
                            uint64_t seed)
{
    int has_mm = mm != NULL && mm->n_mm > 0;
    if (!has_mm && host_is_little_endian())
        return XXH3_64bits_withSeed(tokens, n * sizeof(uint32_t), seed);

    XXH3_state_t st;
    stream_begin(&st, seed);
    stream_tokens(&st, tokens, n);
    if (has_mm) {
        uint64_t sorted[MM_MAX];
        unsigned char bytes[MM_MAX * 8];
        memcpy(sorted, mm->mm_hashes, mm->n_mm * sizeof(uint64_t));
        sort_u64(sorted, mm->n_mm);
        for (size_t i = 0; i < mm->n_mm; i++)
            put_le64(bytes + 8 * i, sorted[i]);
        (void)XXH3_64bits_update(&st, bytes, 8 * mm->n_mm);
    }
    return XXH3_64bits_digest(&st);
}

int kvr_hash_blocks(const uint32_t *tokens, size_t n_tokens, uint32_t block_size,
                    const struct kvr_hash_opts *opts, uint64_t *out, size_t cap, size_t *n_out)
{
    int eagle = opts != NULL && opts->eagle;
    size_t count = kvr_hash_block_count(n_tokens, block_size, eagle);
    *n_out = count;
    if (count == 0)
        return KVR_OK;
    if (tokens == NULL)
        return KVR_EINVAL;
    if (count > cap)
        return KVR_ERANGE;
    if (out == NULL)
        return KVR_EINVAL;

    uint64_t seed = KVR_HASH_SEED;
    const struct kvr_block_mm *mm = NULL;
    size_t n_mm = 0;
    if (opts != NULL) {
        if (opts->seed != 0)
            seed = opts->seed;
        mm = opts->mm;
        n_mm = mm != NULL ? opts->n_mm_blocks : 0;
    }
    if (n_mm > count)
        n_mm = count;
    /* Validate everything before writing anything. */
    for (size_t k = 0; k < n_mm; k++) {
        if (mm[k].n_mm > MM_MAX || (mm[k].n_mm > 0 && mm[k].mm_hashes == NULL))
            return KVR_EINVAL;
    }

    size_t window = (size_t)block_size + (eagle ? 1u : 0u);
    for (size_t k = 0; k < count; k++) {
        const uint32_t *chunk = tokens + k * (size_t)block_size;
        out[k] = hash_window(chunk, window, k < n_mm ? &mm[k] : NULL, seed);
    }
    return KVR_OK;
}

uint64_t kvr_hash_trace_id(uint32_t id, uint32_t block_size)
{
    unsigned char buf[ENCODE_WORDS * 4];
    size_t words = block_size < ENCODE_WORDS ? block_size : ENCODE_WORDS;
    for (size_t i = 0; i < words; i++)
        put_le32(buf + 4 * i, id);
    if (block_size <= ENCODE_WORDS)
        return XXH3_64bits_withSeed(buf, 4 * (size_t)block_size, KVR_HASH_SEED);

    XXH3_state_t st;
    stream_begin(&st, KVR_HASH_SEED);
    size_t left = block_size;
    while (left > 0) {
        size_t k = left < ENCODE_WORDS ? left : ENCODE_WORDS;
        (void)XXH3_64bits_update(&st, buf, 4 * k);
        left -= k;
    }
    return XXH3_64bits_digest(&st);
}

/* ==== Multimodal helpers ===================================================================== */

uint32_t kvr_hash_mm_pad_value(uint64_t mm_hash)
{
    return (uint32_t)(1000000u + (mm_hash & ((UINT64_C(1) << 30) - 1)));
}

/* Returns the value of a hex digit, or -1. */
static int hex_value(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

int kvr_hash_mm_identifier(const char *s, size_t len, uint64_t *out)
{
    if (s == NULL || len == 0)
        return 0;
    if (len == 64) {
        uint64_t v = 0;
        size_t i = 0;
        for (; i < 64; i++) {
            int d = hex_value(s[i]);
            if (d < 0)
                break;
            if (i < 16)
                v = (v << 4) | (uint64_t)d;
        }
        if (i == 64) {
            *out = v;
            return 1;
        }
    }
    *out = XXH3_64bits_withSeed(s, len, 0);
    return 1;
}
