/* err.h - kvrouter error codes.
 *
 * Design: every fallible kvrouter function returns an int: KVR_OK (0) or a negative KVR_E* code.
 * Results travel in out-parameters. Lookups that may legitimately find nothing return 1/0 plus an
 * out-parameter; "not found" is not an error there. There is no errno side channel.
 *
 * The index-event codes mirror NVIDIA Dynamo's KvCacheEventError kinds (spec/index.md §2.2) so that
 * counters and logs use the same vocabulary:
 *
 *   KVR_EPARENT      ParentBlockNotFound   store under an unknown or no-longer-covered parent
 *   KVR_ENOBLOCK     BlockNotFound         removal of a block the rank does not hold
 *   KVR_EINVALSEQ    InvalidBlockSequence  a chain that loops or re-uses a live external hash
 *   KVR_ECAPACITY    CapacityExhausted     a bounded omission (CKF, rank slots)
 *   KVR_ENOMEM       AllocationFailed
 *   KVR_EDOMAIN      UnsupportedResidencyDomain
 */
#ifndef KVR_ERR_H
#define KVR_ERR_H

enum kvr_err {
    KVR_OK = 0,
    KVR_ENOMEM = -1,     /* allocation failed; the structure is unchanged */
    KVR_EINVAL = -2,     /* invalid argument */
    KVR_ENOTFOUND = -3,  /* named object does not exist */
    KVR_EEXIST = -4,     /* object already exists */
    KVR_EIO = -5,        /* I/O error */
    KVR_ECORRUPT = -6,   /* malformed or corrupt input (checksum, truncation, bad field) */
    KVR_ETIMEDOUT = -7,  /* deadline passed */
    KVR_ERANGE = -8,     /* output buffer too small, or value out of range */
    KVR_EPARENT = -9,    /* ParentBlockNotFound */
    KVR_ENOBLOCK = -10,  /* BlockNotFound */
    KVR_EINVALSEQ = -11, /* InvalidBlockSequence */
    KVR_ECAPACITY = -12, /* CapacityExhausted */
    KVR_EDOMAIN = -13,   /* UnsupportedResidencyDomain */
    KVR_EBUSY = -14,     /* resource busy / retry later */
    KVR_ESTATE = -15,    /* operation not valid in the current state (e.g. retired lane) */
    KVR_ERR_MIN_ = -16
};

/* Returns a static, human-readable name for an error code (never NULL). Thread-safe. */
const char *kvr_strerror(int err);

/* Always-on assertion with file and line; aborts. Use for invariants that indicate a bug, never
 * for bad input or allocation failure. */
#define KVR_ASSERT(x)                                                                              \
    do {                                                                                           \
        if (!(x))                                                                                  \
            kvr_assert_fail(#x, __FILE__, __LINE__);                                               \
    } while (0)

#ifdef KVR_DEBUG_CHECKS
#define KVR_DEBUG_ASSERT(x) KVR_ASSERT(x)
#else
#define KVR_DEBUG_ASSERT(x) ((void)0)
#endif

_Noreturn void kvr_assert_fail(const char *expr, const char *file, int line);

#endif
