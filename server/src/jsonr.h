/* jsonr.h - reading request bodies: strict, u64-exact JSON with errors that name the field.
 *
 * A body goes through the engine's two-pass reader (kvr/json_u64.h): kvr_json_scan checks the
 * syntax strictly and records integers json-c would clamp, then json-c builds the tree. The field
 * readers below wrap kvr_json_read_uint / kvr_json_read_hash so every handler reports errors the
 * same way: "instance_id: expected an unsigned 64-bit integer, got -1", "model_name: missing".
 *
 * A srv_jdoc is reusable (one per thread): parse, read fields, srv_jdoc_release, parse again.
 * Thread-safety: none; one document per thread.
 */
#ifndef KVR_SRV_JSONR_H
#define KVR_SRV_JSONR_H

#include <stddef.h>
#include <stdint.h>

#include "kvr/json_u64.h"

struct json_object;
struct json_tokener;

#define SRV_JERR 256 /* error message buffer size used by handlers */

struct srv_jdoc {
    struct kvr_json_scan scan; /* strict pre-scan (flaws, error offset) */
    struct json_tokener *tok;  /* reusable json-c tokener */
    struct json_object *root;  /* parsed tree (owned) or NULL */
};

/* Initialises an empty document. Returns KVR_OK or KVR_ENOMEM. */
int srv_jdoc_init(struct srv_jdoc *d);
/* Releases everything. */
void srv_jdoc_free(struct srv_jdoc *d);
/* Drops the tree of the last parse (keeps the reusable parts). */
void srv_jdoc_release(struct srv_jdoc *d);

/* Parses text[0..len) (borrowed; must stay valid while fields are read). On success d->root is
 * the tree. Returns KVR_OK, KVR_ECORRUPT ("invalid JSON at byte N: reason" in err; also for an
 * empty body), or KVR_ENOMEM. */
int srv_jdoc_parse(struct srv_jdoc *d, const char *text, size_t len, char *err, size_t err_len);

/* Member `key` of obj (an object): returns 1 and sets *v (NULL for JSON null) if present,
 * else 0. */
int srv_jmember(struct json_object *obj, const char *key, struct json_object **v);

/* Field readers. `up` is obj's own path (NULL = the root). When the member is absent they return
 * KVR_OK with *present = 0 (present may be NULL) unless `required`, in which case KVR_ECORRUPT
 * with "<path>: missing". JSON null counts as absent. Errors: KVR_ECORRUPT with a message. */
int srv_jget_uint(const struct srv_jdoc *d, struct json_object *obj, const struct kvr_json_path *up,
                  const char *key, int required, uint64_t max, uint64_t *out, int *present,
                  char *err, size_t err_len);
int srv_jget_str(const struct srv_jdoc *d, struct json_object *obj, const struct kvr_json_path *up,
                 const char *key, int required, const char **out, size_t *len, int *present,
                 char *err, size_t err_len);
int srv_jget_bool(const struct srv_jdoc *d, struct json_object *obj, const struct kvr_json_path *up,
                  const char *key, int *out, int *present, char *err, size_t err_len);
int srv_jget_double(const struct srv_jdoc *d, struct json_object *obj,
                    const struct kvr_json_path *up, const char *key, double *out, int *present,
                    char *err, size_t err_len);

/* Reads an array of hashes (u64 or negative i64, index.md §2.3) into out[0..cap); *n receives
 * the count. KVR_ERANGE ("<path>: more than cap elements") when it does not fit, KVR_ECORRUPT
 * when v is not an array or an element is not a hash. */
int srv_jread_hashes(const struct srv_jdoc *d, struct json_object *v, const struct kvr_json_path *p,
                     uint64_t *out, size_t cap, size_t *n, char *err, size_t err_len);
/* The same for token ids (u32). */
int srv_jread_tokens(const struct srv_jdoc *d, struct json_object *v, const struct kvr_json_path *p,
                     uint32_t *out, size_t cap, size_t *n, char *err, size_t err_len);

#endif
