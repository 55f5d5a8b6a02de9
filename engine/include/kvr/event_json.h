/* event_json.h - RouterEvent JSON codec (spec/index.md §2): request bodies in, event text out.
 *
 * Decoding. A body is one of
 *     [ RouterEvent, ... ]            a JSON array
 *     RouterEvent                     a single object (may span lines)
 *     RouterEvent \n RouterEvent ...  newline-delimited JSON, one object per line
 * Each RouterEvent is decoded into a struct kvr_event appended to a kvr_event_list, or reported
 * with its index and the path of the offending field:
 *     event 3: event.data.stored.blocks[2].block_hash: expected an unsigned 64-bit integer, got
 * -1.5 A bad event never stops the others. A body that is not JSON gets one error with the byte
 * offset. Pipeline per event: kvr_json_scan (strict syntax, u64 overflow flaws) → json-c tree →
 * field readers (kvr/json_u64.h).
 *
 * Accepted RouterEvent (Dynamo-compatible):
 *     {"worker_id": u64,
 *      "storage_tier": "device"|"host_pinned"|"disk"|"external"       optional, default device
 *      "residency_domain": "worker"|"cache_owner"                      optional; null or any other
 *                                                                      value: KVR_EDOMAIN
 *      "event": {"event_id": u64, "dp_rank": u32 (optional, default 0),
 *                "data": {"stored": {"parent_hash": hash|null (optional),
 *                                    "start_position": u32|null (optional),
 *                                    "blocks": [{"block_hash": hash, "tokens_hash": hash,
 *                                                "mm_extra_info": null | {"mm_objects":
 *                                                  [{"mm_hash": hash, "offsets": [[s,e],...]}]}
 *                                                (optional; validated, not retained)}, ...]}}
 *                      | {"removed": {"block_hashes": [hash, ...]}}
 *                      | "cleared"            (also {"cleared": null}, serde's map form)},
 *      "state_source": ...}                                            ignored
 * "hash" = u64 or a negative i64 (two's complement); ids and ranks reject negatives; no
 * fractions, exponents or out-of-range values anywhere an integer is read. Unknown members are
 * ignored everywhere.
 *
 * Encoding writes shape 2 with hashes as bare unsigned decimals, straight into a kvr_buf:
 *     {"worker_id":7,"storage_tier":"device","event":{"event_id":42,"dp_rank":0,"data":
 *      {"stored":{"parent_hash":9143094415614847814,"start_position":null,"blocks":
 *      [{"block_hash":9510318385840434533,"tokens_hash":12124091508212882195,
 *        "mm_extra_info":null}]}}}}
 * ("residency_domain":"cache_owner" is added for cache-owner events, so they round-trip.)
 *
 * Thread-safety: none shared; every call works on its arguments only.
 */
#ifndef KVR_EVENT_JSON_H
#define KVR_EVENT_JSON_H

#include <stddef.h>
#include <stdint.h>

#include "kvr/buf.h"
#include "kvr/event.h"
#include "kvr/json_u64.h"

struct json_object; /* json-c */

/* Length of an error message, NUL included; longer messages are cut. */
#define KVR_EVENT_JSON_MSG 256

/* Event index of an error about the body as a whole (not JSON, empty, wrong root type). */
#define KVR_EVENT_JSON_BODY SIZE_MAX

/* One rejected event (or the body). */
struct kvr_event_json_error {
    size_t index;                 /* 0-based event index in the body, or KVR_EVENT_JSON_BODY */
    size_t offset;                /* byte offset: the event's first byte, or the syntax error */
    int code;                     /* KVR_ECORRUPT, KVR_EDOMAIN (residency_domain), KVR_ENOMEM */
    char msg[KVR_EVENT_JSON_MSG]; /* "event 3: event.data...: expected ..., got ..." */
};

/* What a body decode did. The caller provides the error array (borrowed) and its capacity;
 * errors past the capacity are counted in `failed` but not stored. */
struct kvr_event_json_report {
    struct kvr_event_json_error *errors; /* in: caller array (may be NULL with cap 0) */
    size_t cap;                          /* in: its capacity */
    size_t n_errors;                     /* out: errors stored, <= cap */
    size_t events;                       /* out: events found in the body (good and bad) */
    size_t decoded;                      /* out: events appended to the list */
    size_t failed;                       /* out: events rejected (all, stored or not) */
};

/* Decodes one RouterEvent from a json-c value (borrowed) and appends it to `out`.
 * `scan` (borrowed, may be NULL if the text had no flaws) is the kvr_json_scan of the text o was
 * parsed from, `at` (borrowed, NULL = the scan's root) the path of o in that text; messages name
 * fields by their full path from that root. Returns
 *   KVR_OK        appended;
 *   KVR_ECORRUPT  malformed (nothing appended; err holds "<path>: <reason>");
 *   KVR_EDOMAIN   residency_domain null or unsupported (nothing appended; err as above);
 *   KVR_ENOMEM    (nothing appended).
 * err (may be NULL) receives a NUL-terminated message, cut to err_len. */
int kvr_event_json_decode(const struct json_object *o, const struct kvr_json_scan *scan,
                          const struct kvr_json_path *at, struct kvr_event_list *out, char *err,
                          size_t err_len);

/* Decodes a request body text[0..len) (borrowed): a JSON array of RouterEvents, one RouterEvent,
 * or newline-delimited RouterEvents (blank lines skipped). Good events are appended to `out` in
 * body order; each bad one is reported in rep (rep->errors/cap set by the caller; the counters
 * are reset here). Returns
 *   KVR_OK        the body was read (individual events may still have failed: rep->failed);
 *   KVR_ECORRUPT  the body is not JSON, or its root is neither an object nor an array: one
 *                 error with index KVR_EVENT_JSON_BODY and the byte offset; nothing appended;
 *   KVR_ENOMEM    allocation failed; events appended so far stay in `out`.
 * Which form: a body starting with '[' is an array; one starting with '{' is a single event when
 * it holds exactly one JSON value, and newline-delimited otherwise (if the first value is broken,
 * it is taken as newline-delimited only when it has several non-blank lines that all start with
 * '{', so each line is reported on its own). */
int kvr_event_json_decode_body(const char *text, size_t len, struct kvr_event_list *out,
                               struct kvr_event_json_report *rep);

/* Appends one RouterEvent (borrowed) as JSON text to out (borrowed; grows). Returns KVR_OK,
 * KVR_EINVAL (unknown kind, tier or domain; nothing appended) or KVR_ENOMEM (out unchanged). */
int kvr_event_json_encode(const struct kvr_event *ev, struct kvr_buf *out);

/* Appends ev[0..n) (borrowed) as one JSON array ("[]" when n is 0). Same results as
 * kvr_event_json_encode; on error out is restored to its length before the call. */
int kvr_event_json_encode_array(const struct kvr_event *ev, size_t n, struct kvr_buf *out);

/* Appends ev[0..n) (borrowed) as newline-delimited JSON, each event followed by '\n'. Same
 * results as kvr_event_json_encode_array. */
int kvr_event_json_encode_lines(const struct kvr_event *ev, size_t n, struct kvr_buf *out);

#endif
