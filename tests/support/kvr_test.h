/* kvr_test.h - small helpers shared by the Check suites: seeds and a test RNG.
 * SPDX-License-Identifier: Apache-2.0
 *
 * Every randomized test starts from a fixed default seed; the KVR_TEST_SEED environment variable
 * overrides it (decimal or 0x-hex). Tests put the seed in every failure message, so a failure can
 * be replayed with KVR_TEST_SEED=<seed>. No globals: everything is static inline. */
#ifndef KVR_TEST_H
#define KVR_TEST_H

#include <stdint.h>
#include <stdlib.h>

/* Returns KVR_TEST_SEED when set, else def. */
static inline uint64_t kvr_test_seed(uint64_t def)
{
    const char *s = getenv("KVR_TEST_SEED");
    if (s == NULL || *s == '\0')
        return def;
    return (uint64_t)strtoull(s, NULL, 0);
}

/* SplitMix64: a tiny, good-enough generator for test workloads. */
struct kvr_test_rng {
    uint64_t s;
};

static inline uint64_t kvr_test_next(struct kvr_test_rng *r)
{
    uint64_t z = (r->s += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

/* Uniform in [0, n) (n > 0; slight modulo bias is fine for tests). */
static inline uint64_t kvr_test_below(struct kvr_test_rng *r, uint64_t n)
{
    return kvr_test_next(r) % n;
}

#endif
