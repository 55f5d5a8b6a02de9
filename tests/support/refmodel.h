/* refmodel.h - the held/reachable reference model of index.md §7, and a random event-stream
 * generator in the mix of Dynamo's differential harness (index.md §7), for differential tests.
 *
 * Model, per rank (worker_id, dp_rank):
 *   held      ext -> parent ext, for every block stored and not since removed/cleared;
 *   reachable a prefix-closed subset: blocks stored under a reachable parent (or the root) whose
 *             ancestors are all still held; a removal prunes it, a re-store does not revive.
 * For a query, with the rank's external hashes of the query's chain, held_len / reach_len are the
 * longest prefixes in each set; an index must answer reach_len <= got <= held_len.
 *
 * Generator: documents are chains of local hashes drawn from a small alphabet (so that paths
 * share prefixes and repeat locals); a rank's external hash of position i of a document is a
 * chain hash of the document's locals 0..i, optionally salted per rank (engines that publish
 * different hashes for the same content). Each generated operation is applied to the model by
 * the generator; the caller applies it to the index under test and checks bounds.
 */
#ifndef KVR_TEST_REFMODEL_H
#define KVR_TEST_REFMODEL_H

#include <stddef.h>
#include <stdint.h>

#include "kvr/event.h"

struct ref_model;

struct ref_model *ref_new(void);
void ref_free(struct ref_model *m);

/* What the model says of a store's parent: REF_MUST_ACCEPT (root or reachable parent),
 * REF_MAY_REJECT (held but not reachable), REF_MUST_REJECT (not held). */
enum { REF_MUST_REJECT = -1, REF_MAY_REJECT = 0, REF_MUST_ACCEPT = 1 };

int ref_store(struct ref_model *m, uint64_t w, uint32_t dp, const uint64_t *parent,
              const uint64_t *exts, size_t n);
void ref_remove(struct ref_model *m, uint64_t w, uint32_t dp, const uint64_t *exts, size_t n);
void ref_clear(struct ref_model *m, uint64_t w, uint32_t dp);
void ref_remove_worker(struct ref_model *m, uint64_t w);
/* After an allocation failure: the rank's reachable set is forgotten (lower bound 0). */
void ref_forget_reach(struct ref_model *m, uint64_t w, uint32_t dp);
void ref_bounds(const struct ref_model *m, uint64_t w, uint32_t dp, const uint64_t *exts, size_t n,
                size_t *held_len, size_t *reach_len);

/* ---- generator -------------------------------------------------------------------------- */

enum gen_op_kind { GEN_EVENT = 1, GEN_REMOVE_WORKER = 2, GEN_REMOVE_RANK = 3 };

struct gen_op {
    int kind;
    int expect;          /* for stores: REF_MUST_ACCEPT / MAY_REJECT / MUST_REJECT */
    struct kvr_event ev; /* GEN_EVENT (arrays owned by the generator until the next op) */
    uint64_t worker_id;  /* GEN_REMOVE_WORKER / GEN_REMOVE_RANK */
    uint32_t dp_rank;
};

struct gen_rank {
    uint64_t worker_id;
    uint32_t dp_rank;
    uint64_t salt;
};

struct gen;

/* uniform_ext: all ranks publish the same external hash for the same content. */
struct gen *gen_new(uint64_t seed, int uniform_ext);
void gen_free(struct gen *g);
struct ref_model *gen_model(struct gen *g);

/* Produces the next operation, already applied to the model. */
void gen_next(struct gen *g, struct gen_op *op);

/* Documents never exceed this many blocks (size fixed buffers with it). */
#define GEN_MAX_DOC_LEN 512

/* Documents (queries): count, and doc d's locals (borrowed, valid until the next gen_next). */
size_t gen_ndocs(const struct gen *g);
const uint64_t *gen_doc(const struct gen *g, size_t d, size_t *n);
/* The ranks the generator has used so far (including removed ones); borrowed. */
const struct gen_rank *gen_ranks(const struct gen *g, size_t *n);
/* A rank's external hashes of doc d's chain, into out[0..n). */
void gen_exts(const struct gen *g, const struct gen_rank *r, size_t d, uint64_t *out);
/* A rank's external hashes of any chain of n locals (a query that is no document). */
void gen_exts_of(const struct gen *g, const struct gen_rank *r, const uint64_t *loc, size_t n,
                 uint64_t *out);
/* Locals are drawn from 1..gen_alphabet(). */
uint64_t gen_alphabet(void);

uint64_t gen_rand(struct gen *g);

/* Seed for randomized tests: KVR_TEST_SEED if set, else `def`. */
uint64_t test_seed(uint64_t def);

#endif
