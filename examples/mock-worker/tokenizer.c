/* tokenizer.c - the mock worker's deterministic tokenizer and output text (see README.md).
 *
 * Pieces: a maximal run of ASCII letters, digits, '_' or non-ASCII bytes (so UTF-8 words stay
 * whole) is one piece; every other printable ASCII character is a piece of its own; whitespace
 * and control bytes only separate pieces. A piece's id is 100 + XXH3-64(piece bytes, seed 0)
 * mod (vocab - 100): ids 0..99 are never produced (room for special tokens). The same text always
 * gives the same ids, on every host. */
#include <stdlib.h>
#include <string.h>

#include "kvr/hash.h"
#include "mock.h"

#define FIRST_ID 100u

static int word_byte(unsigned char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
           c >= 0x80;
}

static int push(uint32_t **tokens, size_t *n, size_t *cap, uint32_t id)
{
    if (*n == *cap) {
        size_t nc = *cap ? *cap * 2 : 64;
        uint32_t *t = realloc(*tokens, nc * sizeof(*t));
        if (t == NULL)
            return -1;
        *tokens = t;
        *cap = nc;
    }
    (*tokens)[(*n)++] = id;
    return 0;
}

int mock_tokenize(const char *text, size_t len, uint32_t vocab, uint32_t **tokens, size_t *n,
                  size_t *cap)
{
    const unsigned char *s = (const unsigned char *)text;
    uint32_t span = vocab > FIRST_ID ? vocab - FIRST_ID : 1;
    size_t i = 0;
    while (i < len) {
        size_t j = i;
        if (word_byte(s[i])) {
            while (j < len && word_byte(s[j]))
                j++;
        } else if (s[i] > ' ' && s[i] < 0x7f) {
            j = i + 1;
        } else {
            i++; /* whitespace / control: a separator */
            continue;
        }
        uint32_t id = FIRST_ID + (uint32_t)(kvr_hash_xxh3(s + i, j - i, 0) % span);
        if (push(tokens, n, cap, id) != 0)
            return -1;
        i = j;
    }
    return 0;
}

static const char *const words[] = {
    "the",   "cache", "block", "router", "token", "prefix", "worker",  "model",
    "event", "hash",  "tree",  "query",  "score", "rank",   "batch",   "queue",
    "fast",  "warm",  "cold",  "hit",    "miss",  "store",  "evict",   "reuse",
    "path",  "node",  "leaf",  "root",   "chain", "radix",  "latency", "throughput",
};

const char *mock_output_word(uint64_t seed, uint32_t i)
{
    uint8_t b[12];
    for (int k = 0; k < 8; k++)
        b[k] = (uint8_t)(seed >> (8 * k));
    for (int k = 0; k < 4; k++)
        b[8 + k] = (uint8_t)(i >> (8 * k));
    return words[kvr_hash_xxh3(b, sizeof(b), 7) % (sizeof(words) / sizeof(words[0]))];
}
