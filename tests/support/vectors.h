/* vectors.h - test-data helpers: load files from $KVR_TEST_DATA (set by kvr_add_check_suite).
 *
 * Data lives in tests/data/ so that suites run without /work/shared. No globals. */
#ifndef KVR_TEST_VECTORS_H
#define KVR_TEST_VECTORS_H

#include <stddef.h>
#include <stdint.h>

/* Reads $KVR_TEST_DATA/<rel> (falls back to ./tests/data). Returns owned memory (free with free())
 * holding exactly the file's bytes (a non-empty file is never padded, so ASan sees any read past
 * its end), and sets *len; NULL on any error. */
uint8_t *kvr_test_read_data(const char *rel, size_t *len);

/* Returns a malloc'd copy of `len` bytes of `p` (exact size; free with free()). */
uint8_t *kvr_test_dup(const void *p, size_t len);

/* The seed for randomised tests: $KVR_TEST_SEED if set, else `dflt`. */
uint64_t kvr_test_seed(uint64_t dflt);

#endif
