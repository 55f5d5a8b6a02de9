/* hash.h - Dynamo-compatible block hashing (spec/hashing.md).
 *
 * Three kinds of hash, never to be confused:
 *   local block hash  = xxh3(le32 tokens of ONE block, seed)        navigates the prefix tree
 *   sequence hash     = chain of local hashes (seed 1337 always)    CKF keys, load tracking
 *   external hash     = engine's own id of a block                  opaque (never computed here)
 *
 *   seed     = 1337 + xxh3(lora, 0) + xxh3(namespace, 1)            (wrapping; empty = absent)
 *   local[k] = xxh3(le32(tokens[k*bs .. k*bs+w)) [++ le64(sorted mm_hash...)], seed)
 *              w = bs, or bs+1 with Eagle; trailing partial block dropped
 *   seq[0]   = local[0];  seq[i] = xxh3(le64(seq[i-1]) ++ le64(local[i]), 1337)
 *
 * All functions are pure and thread-safe; none allocates.
 */
#ifndef KVR_HASH_H
#define KVR_HASH_H

#include <stddef.h>
#include <stdint.h>

#define KVR_HASH_SEED 1337u
#define KVR_DEFAULT_BLOCK_SIZE 16u

/* XXH3-64 of `len` bytes with `seed` (seed 0 = plain XXH3-64). */
uint64_t kvr_hash_xxh3(const void *data, size_t len, uint64_t seed);

/* The local-hash seed for a cache namespace and a LoRA name (either may be NULL or empty, which
 * means absent): 1337 + xxh3(lora, 0) + xxh3(ns, 1), wrapping. */
uint64_t kvr_hash_salt(const char *ns, size_t ns_len, const char *lora, size_t lora_len);

/* Per-block multimodal info: the mm_hash values of the block's objects (any order; hashing sorts a
 * copy). A block with n_mm == 0 hashes like a plain block. */
struct kvr_block_mm {
    const uint64_t *mm_hashes;
    size_t n_mm;
};

struct kvr_hash_opts {
    uint64_t seed;                 /* 0 means KVR_HASH_SEED; use kvr_hash_salt for salts */
    int eagle;                     /* non-zero: windows of block_size + 1 tokens */
    const struct kvr_block_mm *mm; /* per-block info, indexed by block; may be NULL */
    size_t n_mm_blocks;            /* entries in mm (blocks beyond have none) */
};

/* Number of complete blocks `n_tokens` tokens make at this block size (0 if block_size == 0). */
size_t kvr_hash_block_count(size_t n_tokens, uint32_t block_size, int eagle);

/* Computes the local block hashes of `tokens` (borrowed) into out[0..cap) (borrowed, written).
 * Sets *n_out to the block count in every case. Returns KVR_OK, KVR_ERANGE if cap is smaller than
 * the block count, or KVR_EINVAL if a block's mm info holds more than 64 hashes (or a NULL array
 * with n_mm > 0) or tokens/out is NULL while blocks are due; on any error nothing is written.
 * opts (borrowed) may be NULL (seed 1337, no Eagle, no mm). */
int kvr_hash_blocks(const uint32_t *tokens, size_t n_tokens, uint32_t block_size,
                    const struct kvr_hash_opts *opts, uint64_t *out, size_t cap, size_t *n_out);

/* One step of the sequence-hash chain: xxh3(le64(prev) ++ le64(local), 1337). */
uint64_t kvr_hash_seq_next(uint64_t prev, uint64_t local);

/* Chains n local hashes into sequence hashes (out may alias local). */
void kvr_hash_chain(const uint64_t *local, size_t n, uint64_t *out);

/* local_block_hash_from_id(id, bs): xxh3 of `bs` copies of le32(id), seed 1337 (trace replay). */
uint64_t kvr_hash_trace_id(uint32_t id, uint32_t block_size);

/* SGLang's multimodal pad value: (u32)(1000000 + (h & (2^30 - 1))). */
uint32_t kvr_hash_mm_pad_value(uint64_t mm_hash);

/* hash_mm_identifier: empty -> returns 0 (absent); 64 hex chars -> first 16 parsed as u64;
 * otherwise xxh3(s, 0). Returns 1 and sets *out, or 0 when s is empty. */
int kvr_hash_mm_identifier(const char *s, size_t len, uint64_t *out);

#endif
