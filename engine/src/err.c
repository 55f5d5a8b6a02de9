/* err.c - error names and the assertion handler. */
#include "kvr/err.h"

#include <stdio.h>
#include <stdlib.h>

const char *kvr_strerror(int err)
{
    switch (err) {
    case KVR_OK:
        return "ok";
    case KVR_ENOMEM:
        return "out of memory";
    case KVR_EINVAL:
        return "invalid argument";
    case KVR_ENOTFOUND:
        return "not found";
    case KVR_EEXIST:
        return "already exists";
    case KVR_EIO:
        return "I/O error";
    case KVR_ECORRUPT:
        return "corrupt input";
    case KVR_ETIMEDOUT:
        return "timed out";
    case KVR_ERANGE:
        return "out of range";
    case KVR_EPARENT:
        return "ParentBlockNotFound";
    case KVR_ENOBLOCK:
        return "BlockNotFound";
    case KVR_EINVALSEQ:
        return "InvalidBlockSequence";
    case KVR_ECAPACITY:
        return "CapacityExhausted";
    case KVR_EDOMAIN:
        return "UnsupportedResidencyDomain";
    case KVR_EBUSY:
        return "busy";
    case KVR_ESTATE:
        return "invalid state";
    default:
        return "unknown error";
    }
}

void kvr_assert_fail(const char *expr, const char *file, int line)
{
    fprintf(stderr, "kvrouter: assertion failed: %s (%s:%d)\n", expr, file, line);
    fflush(stderr);
    abort();
}
