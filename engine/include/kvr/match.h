/* match.h - the result type of every prefix-overlap query (radix tree, CKF, combined index).
 *
 * One entry per rank with a non-zero score; scores are in BLOCKS (the HTTP /query API converts to
 * tokens). Ranks with score 0 are absent. Order: unspecified (callers sort when they need to).
 */
#ifndef KVR_MATCH_H
#define KVR_MATCH_H

#include <stdint.h>

struct kvr_match {
    uint64_t worker_id;
    uint32_t dp_rank;
    uint32_t blocks; /* matched prefix length in blocks (> 0) */
};

/* Query flags. */
#define KVR_MATCH_EARLY_EXIT                                                                       \
    1u /* stop once one rank remains (may undercount; not replay-stable)                           \
        */

#endif
