/* vectors.c - test-data helpers (see vectors.h). */
#include "vectors.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

uint8_t *kvr_test_read_data(const char *rel, size_t *len)
{
    const char *dir = getenv("KVR_TEST_DATA");
    char path[4096];
    snprintf(path, sizeof(path), "%s/%s", dir != NULL ? dir : "tests/data", rel);
    FILE *f = fopen(path, "rb");
    uint8_t *buf = NULL;
    if (f == NULL)
        return NULL;
    if (fseek(f, 0, SEEK_END) != 0)
        goto out;
    long size = ftell(f);
    if (size <= 0 || fseek(f, 0, SEEK_SET) != 0)
        goto out;
    buf = malloc((size_t)size);
    if (buf == NULL)
        goto out;
    if (fread(buf, 1, (size_t)size, f) != (size_t)size) {
        free(buf);
        buf = NULL;
        goto out;
    }
    *len = (size_t)size;
out:
    fclose(f);
    return buf;
}

uint8_t *kvr_test_dup(const void *p, size_t len)
{
    uint8_t *q = malloc(len ? len : 1);
    if (q != NULL && len > 0)
        memcpy(q, p, len);
    return q;
}

uint64_t kvr_test_seed(uint64_t dflt)
{
    const char *s = getenv("KVR_TEST_SEED");
    if (s == NULL || *s == '\0')
        return dflt;
    return strtoull(s, NULL, 0);
}
