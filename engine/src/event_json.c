/* event_json.c - RouterEvent JSON codec (see kvr/event_json.h, spec/index.md §2).
 *
 * Static helpers borrow every pointer they take and return nothing owned, unless their comment says
 * otherwise. */
#include "kvr/event_json.h"

#include <json-c/json.h>

#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "kvr/err.h"

/* ==== Decoding one event ===================================================================== */

/* Borrowed context of one event decode. */
struct dec {
    const struct kvr_json_scan *scan; /* flaws of the text (may be NULL) */
    char *err;                        /* message buffer (may be NULL) */
    size_t err_len;
};

static int is_object(const struct json_object *v)
{
    return v != NULL && json_object_get_type(v) == json_type_object;
}

static int is_array(const struct json_object *v)
{
    return v != NULL && json_object_get_type(v) == json_type_array;
}

/* Whether v is the JSON string s. */
static int string_is(const struct json_object *v, const char *s)
{
    if (v == NULL || json_object_get_type(v) != json_type_string)
        return 0;
    size_t n = strlen(s);
    return (size_t)json_object_get_string_len(v) == n &&
           memcmp(json_object_get_string((struct json_object *)v), s, n) == 0;
}

static int type_error(const struct dec *d, const struct kvr_json_path *p, const char *expected,
                      const struct json_object *v)
{
    return kvr_json_type_error(d->err, d->err_len, d->scan, p, expected, v);
}

/* Fetches the required member `p->key` of o into *v; KVR_ECORRUPT ("missing") if absent. */
static int need(const struct dec *d, const struct json_object *o, const struct kvr_json_path *p,
                struct json_object **v)
{
    if (!json_object_object_get_ex(o, p->key, v))
        return kvr_json_missing(d->err, d->err_len, p);
    return KVR_OK;
}

/* Reads the required unsigned member p->key of o, <= max. */
static int need_uint(const struct dec *d, const struct json_object *o,
                     const struct kvr_json_path *p, uint64_t max, uint64_t *out)
{
    struct json_object *v;
    int rc = need(d, o, p, &v);
    if (rc != KVR_OK)
        return rc;
    return kvr_json_read_uint(v, max, d->scan, p, out, d->err, d->err_len);
}

/* Reads the required hash member p->key of o. */
static int need_hash(const struct dec *d, const struct json_object *o,
                     const struct kvr_json_path *p, uint64_t *out)
{
    struct json_object *v;
    int rc = need(d, o, p, &v);
    if (rc != KVR_OK)
        return rc;
    return kvr_json_read_hash(v, d->scan, p, out, d->err, d->err_len);
}

/* Fetches the required array member p->key of o; checks the length fits a u32. */
static int need_array(const struct dec *d, const struct json_object *o,
                      const struct kvr_json_path *p, struct json_object **arr, uint32_t *n)
{
    int rc = need(d, o, p, arr);
    if (rc != KVR_OK)
        return rc;
    if (!is_array(*arr))
        return type_error(d, p, "an array", *arr);
    size_t len = json_object_array_length(*arr);
    if (len > UINT32_MAX)
        return type_error(d, p, "at most 4294967295 entries", *arr);
    *n = (uint32_t)len;
    return KVR_OK;
}

/* mm_extra_info: null | {"mm_objects": [{"mm_hash": hash, "offsets": [[s, e], ...]}, ...]}.
 * Validated only: kvrouter does not hash multimodal blocks from events (spec/hashing.md §4). */
static int check_mm_extra_info(const struct dec *d, const struct json_object *v,
                               const struct kvr_json_path *p)
{
    if (v == NULL)
        return KVR_OK;
    if (!is_object(v))
        return type_error(d, p, "null or an object", v);
    struct kvr_json_path p_objs = {p, "mm_objects", 0};
    struct json_object *objs;
    uint32_t n;
    int rc = need_array(d, v, &p_objs, &objs, &n);
    if (rc != KVR_OK)
        return rc;
    for (uint32_t i = 0; i < n; i++) {
        struct kvr_json_path p_obj = {&p_objs, NULL, i};
        struct json_object *obj = json_object_array_get_idx(objs, i);
        if (!is_object(obj))
            return type_error(d, &p_obj, "an object", obj);
        struct kvr_json_path p_hash = {&p_obj, "mm_hash", 0};
        uint64_t h;
        if ((rc = need_hash(d, obj, &p_hash, &h)) != KVR_OK)
            return rc;
        struct kvr_json_path p_offs = {&p_obj, "offsets", 0};
        struct json_object *offs;
        uint32_t n_offs;
        if ((rc = need_array(d, obj, &p_offs, &offs, &n_offs)) != KVR_OK)
            return rc;
        for (uint32_t k = 0; k < n_offs; k++) {
            struct kvr_json_path p_pair = {&p_offs, NULL, k};
            struct json_object *pair = json_object_array_get_idx(offs, k);
            if (!is_array(pair) || json_object_array_length(pair) != 2)
                return type_error(d, &p_pair, "a [start, end] pair", pair);
            for (size_t j = 0; j < 2; j++) {
                struct kvr_json_path p_end = {&p_pair, NULL, j};
                uint64_t x;
                rc = kvr_json_read_uint(json_object_array_get_idx(pair, j), UINT64_MAX, d->scan,
                                        &p_end, &x, d->err, d->err_len);
                if (rc != KVR_OK)
                    return rc;
            }
        }
    }
    return KVR_OK;
}

/* Header fields shared by every kind, filled once the payload decoded. */
struct head {
    uint64_t worker_id;
    uint64_t event_id;
    uint64_t dp_rank;
    int tier;
    int domain;
};

static void fill_head(struct kvr_event *ev, const struct head *h)
{
    ev->worker_id = h->worker_id;
    ev->event_id = h->event_id;
    ev->dp_rank = (uint32_t)h->dp_rank;
    ev->tier = (uint8_t)h->tier;
    ev->domain = (uint8_t)h->domain;
}

/* {"parent_hash": hash|null, "start_position": u32|null, "blocks": [...]} */
static int decode_stored(const struct dec *d, const struct json_object *v,
                         const struct kvr_json_path *p, const struct head *h,
                         struct kvr_event_list *out)
{
    if (!is_object(v))
        return type_error(d, p, "an object", v);
    struct json_object *x;
    int rc;
    uint64_t parent = 0, start = 0;
    int has_parent = 0, has_start = 0;

    struct kvr_json_path p_parent = {p, "parent_hash", 0};
    if (json_object_object_get_ex(v, "parent_hash", &x) && x != NULL) {
        if ((rc = kvr_json_read_hash(x, d->scan, &p_parent, &parent, d->err, d->err_len)) != KVR_OK)
            return rc;
        has_parent = 1;
    }
    struct kvr_json_path p_start = {p, "start_position", 0};
    if (json_object_object_get_ex(v, "start_position", &x) && x != NULL) {
        rc = kvr_json_read_uint(x, UINT32_MAX, d->scan, &p_start, &start, d->err, d->err_len);
        if (rc != KVR_OK)
            return rc;
        has_start = 1;
    }
    struct kvr_json_path p_blocks = {p, "blocks", 0};
    struct json_object *blocks;
    uint32_t n;
    if ((rc = need_array(d, v, &p_blocks, &blocks, &n)) != KVR_OK)
        return rc;

    struct kvr_event *ev;
    if (kvr_event_list_emplace(out, KVR_EVENT_STORED, n, &ev) != KVR_OK)
        return KVR_ENOMEM;
    for (uint32_t i = 0; i < n; i++) {
        struct kvr_json_path p_b = {&p_blocks, NULL, i};
        struct json_object *b = json_object_array_get_idx(blocks, i);
        if (!is_object(b)) {
            rc = type_error(d, &p_b, "a block object", b);
            goto fail;
        }
        struct kvr_json_path p_bh = {&p_b, "block_hash", 0};
        struct kvr_json_path p_th = {&p_b, "tokens_hash", 0};
        struct kvr_json_path p_mm = {&p_b, "mm_extra_info", 0};
        if ((rc = need_hash(d, b, &p_bh, &ev->blocks[i].block_hash)) != KVR_OK ||
            (rc = need_hash(d, b, &p_th, &ev->blocks[i].tokens_hash)) != KVR_OK)
            goto fail;
        if (json_object_object_get_ex(b, "mm_extra_info", &x) &&
            (rc = check_mm_extra_info(d, x, &p_mm)) != KVR_OK)
            goto fail;
    }
    fill_head(ev, h);
    ev->parent_hash = parent;
    ev->has_parent = (uint8_t)has_parent;
    ev->start_position = (uint32_t)start;
    ev->has_start_position = (uint8_t)has_start;
    return KVR_OK;

fail:
    kvr_event_list_pop(out);
    return rc;
}

/* {"block_hashes": [hash, ...]} */
static int decode_removed(const struct dec *d, const struct json_object *v,
                          const struct kvr_json_path *p, const struct head *h,
                          struct kvr_event_list *out)
{
    if (!is_object(v))
        return type_error(d, p, "an object", v);
    struct kvr_json_path p_hashes = {p, "block_hashes", 0};
    struct json_object *hashes;
    uint32_t n;
    int rc = need_array(d, v, &p_hashes, &hashes, &n);
    if (rc != KVR_OK)
        return rc;
    struct kvr_event *ev;
    if (kvr_event_list_emplace(out, KVR_EVENT_REMOVED, n, &ev) != KVR_OK)
        return KVR_ENOMEM;
    for (uint32_t i = 0; i < n; i++) {
        struct kvr_json_path p_h = {&p_hashes, NULL, i};
        rc = kvr_json_read_hash(json_object_array_get_idx(hashes, i), d->scan, &p_h, &ev->hashes[i],
                                d->err, d->err_len);
        if (rc != KVR_OK) {
            kvr_event_list_pop(out);
            return rc;
        }
    }
    fill_head(ev, h);
    return KVR_OK;
}

static int decode_cleared(const struct head *h, struct kvr_event_list *out)
{
    struct kvr_event *ev;
    if (kvr_event_list_emplace(out, KVR_EVENT_CLEARED, 0, &ev) != KVR_OK)
        return KVR_ENOMEM;
    fill_head(ev, h);
    return KVR_OK;
}

static const char data_expected[] = "\"cleared\", {\"stored\": {...}} or {\"removed\": {...}}";

/* KvCacheEventData, externally tagged: {"stored": ...} | {"removed": ...} | "cleared". */
static int decode_data(const struct dec *d, struct json_object *v, const struct kvr_json_path *p,
                       const struct head *h, struct kvr_event_list *out)
{
    if (string_is(v, "cleared"))
        return decode_cleared(h, out);
    if (!is_object(v) || json_object_object_length(v) != 1)
        return type_error(d, p, data_expected, v);
    json_object_object_foreach(v, key, val)
    {
        struct kvr_json_path p_kind = {p, key, 0};
        if (strcmp(key, "stored") == 0)
            return decode_stored(d, val, &p_kind, h, out);
        if (strcmp(key, "removed") == 0)
            return decode_removed(d, val, &p_kind, h, out);
        if (strcmp(key, "cleared") == 0) { /* serde's map form of a unit variant */
            if (val != NULL)
                return type_error(d, &p_kind, "null", val);
            return decode_cleared(h, out);
        }
    }
    return type_error(d, p, data_expected, v);
}

int kvr_event_json_decode(const struct json_object *o, const struct kvr_json_scan *scan,
                          const struct kvr_json_path *at, struct kvr_event_list *out, char *err,
                          size_t err_len)
{
    struct dec d = {scan, err, err_len};
    struct head h = {0, 0, 0, KVR_TIER_DEVICE, KVR_DOMAIN_WORKER};
    struct json_object *v, *ev;
    int rc;

    if (err != NULL && err_len > 0)
        err[0] = '\0';
    if (!is_object(o))
        return type_error(&d, at, "a RouterEvent object", o);

    struct kvr_json_path p_worker = {at, "worker_id", 0};
    if ((rc = need_uint(&d, o, &p_worker, UINT64_MAX, &h.worker_id)) != KVR_OK)
        return rc;

    struct kvr_json_path p_tier = {at, "storage_tier", 0};
    if (json_object_object_get_ex(o, "storage_tier", &v)) {
        if (v == NULL || json_object_get_type(v) != json_type_string ||
            !kvr_tier_parse(json_object_get_string(v), (size_t)json_object_get_string_len(v),
                            &h.tier))
            return type_error(&d, &p_tier, "\"device\", \"host_pinned\", \"disk\" or \"external\"",
                              v);
    }

    struct kvr_json_path p_domain = {at, "residency_domain", 0};
    if (json_object_object_get_ex(o, "residency_domain", &v)) {
        if (string_is(v, "worker")) {
            h.domain = KVR_DOMAIN_WORKER;
        } else if (string_is(v, "cache_owner")) {
            h.domain = KVR_DOMAIN_CACHE_OWNER;
        } else {
            type_error(&d, &p_domain, "\"worker\" or \"cache_owner\"", v);
            return KVR_EDOMAIN; /* UnsupportedResidencyDomain: the event is dropped */
        }
    }

    struct kvr_json_path p_event = {at, "event", 0};
    if ((rc = need(&d, o, &p_event, &ev)) != KVR_OK)
        return rc;
    if (!is_object(ev))
        return type_error(&d, &p_event, "an object", ev);
    struct kvr_json_path p_id = {&p_event, "event_id", 0};
    if ((rc = need_uint(&d, ev, &p_id, UINT64_MAX, &h.event_id)) != KVR_OK)
        return rc;
    struct kvr_json_path p_rank = {&p_event, "dp_rank", 0};
    if (json_object_object_get_ex(ev, "dp_rank", &v)) {
        rc = kvr_json_read_uint(v, UINT32_MAX, scan, &p_rank, &h.dp_rank, err, err_len);
        if (rc != KVR_OK)
            return rc;
    }
    struct kvr_json_path p_data = {&p_event, "data", 0};
    if ((rc = need(&d, ev, &p_data, &v)) != KVR_OK)
        return rc;
    return decode_data(&d, v, &p_data, &h, out);
}

/* ==== Decoding a body ======================================================================== */

/* Borrowed state of one body decode. */
struct body {
    const char *text;
    size_t len;
    struct kvr_event_list *out;
    struct kvr_event_json_report *rep;
    struct kvr_json_scan scan; /* per event (owned) */
    struct json_tokener *tok;  /* owned */
};

#if defined(__GNUC__)
#define PRINTF_LIKE(f, a) __attribute__((format(printf, f, a)))
#else
#define PRINTF_LIKE(f, a)
#endif

/* Records an error for event `index` (or the body); counts it even when there is no room. */
PRINTF_LIKE(5, 6)
static void report(struct body *b, size_t index, size_t offset, int code, const char *fmt, ...)
{
    struct kvr_event_json_report *r = b->rep;
    r->failed += index != KVR_EVENT_JSON_BODY;
    if (r->errors == NULL || r->n_errors >= r->cap)
        return;
    struct kvr_event_json_error *e = &r->errors[r->n_errors++];
    e->index = index;
    e->offset = offset;
    e->code = code;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->msg, sizeof(e->msg), fmt, ap);
    va_end(ap);
}

/* Describes a JSON value from its first byte (for roots json-c is not asked to parse). */
static const char *describe_root(char c)
{
    switch (c) {
    case '[':
        return "an array";
    case '"':
        return "a string";
    case 't':
    case 'f':
        return "a boolean";
    case 'n':
        return "null";
    default:
        return "a number";
    }
}

/* Decodes the event in text[off, off + n) as event `index`. Returns KVR_OK (decoded or
 * reported) or KVR_ENOMEM. */
static int decode_span(struct body *b, size_t index, size_t off, size_t n)
{
    const char *t = b->text + off;
    b->rep->events++;
    int rc = kvr_json_scan(&b->scan, t, n, 0);
    if (rc == KVR_ENOMEM) {
        report(b, index, off, KVR_ENOMEM, "event %zu: out of memory", index);
        return KVR_ENOMEM;
    }
    if (rc != KVR_OK) {
        report(b, index, off + b->scan.err_off, KVR_ECORRUPT,
               "event %zu: not valid JSON at byte %zu: %s", index, off + b->scan.err_off,
               b->scan.err);
        return KVR_OK;
    }
    if (b->scan.root != '{') {
        report(b, index, off, KVR_ECORRUPT, "event %zu: expected a RouterEvent object, got %s",
               index, describe_root(b->scan.root));
        return KVR_OK;
    }
    if (n > INT_MAX) {
        report(b, index, off, KVR_ECORRUPT, "event %zu: larger than %d bytes", index, INT_MAX);
        return KVR_OK;
    }
    json_tokener_reset(b->tok);
    struct json_object *o =
        json_tokener_parse_ex(b->tok, t + b->scan.start, (int)(b->scan.end - b->scan.start));
    if (o == NULL) {
        /* The scan accepted the text, so this is json-c running out of memory (0.16 has no
         * distinct error code for it) or disagreeing with the scan. */
        report(b, index, off, KVR_ECORRUPT, "event %zu: json-c could not parse it: %s", index,
               json_tokener_error_desc(json_tokener_get_error(b->tok)));
        return KVR_OK;
    }
    char msg[KVR_EVENT_JSON_MSG];
    rc = kvr_event_json_decode(o, &b->scan, NULL, b->out, msg, sizeof(msg));
    json_object_put(o);
    if (rc == KVR_OK) {
        b->rep->decoded++;
        return KVR_OK;
    }
    if (rc == KVR_ENOMEM) {
        report(b, index, off, KVR_ENOMEM, "event %zu: out of memory", index);
        return KVR_ENOMEM;
    }
    report(b, index, off, rc, "event %zu: %s", index, msg);
    return KVR_OK;
}

static int is_ws(char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

/* Offset of the first non-whitespace byte of text[from, to), or `to`. */
static size_t skip_ws(const char *text, size_t from, size_t to)
{
    while (from < to && is_ws(text[from]))
        from++;
    return from;
}

/* Offset of the next '\n' at or after `from`, or len. */
static size_t line_end(const char *text, size_t from, size_t len)
{
    const char *nl = memchr(text + from, '\n', len - from);
    return nl != NULL ? (size_t)(nl - text) : len;
}

/* Whether a body whose first value is broken reads as newline-delimited: at least two non-blank
 * lines, each starting with '{'. (A pretty-printed object has lines starting otherwise.) */
static int looks_line_delimited(const char *text, size_t len)
{
    size_t lines = 0;
    for (size_t p = 0; p < len;) {
        size_t e = line_end(text, p, len);
        size_t q = skip_ws(text, p, e);
        if (q < e) {
            if (text[q] != '{')
                return 0;
            lines++;
        }
        p = e + 1;
    }
    return lines >= 2;
}

static int decode_lines(struct body *b)
{
    size_t index = 0;
    for (size_t p = 0; p < b->len;) {
        size_t e = line_end(b->text, p, b->len);
        if (skip_ws(b->text, p, e) < e) {
            int rc = decode_span(b, index++, p, e - p);
            if (rc != KVR_OK)
                return rc;
        }
        p = e + 1;
    }
    return KVR_OK;
}

static int decode_array(struct body *b)
{
    /* A separate scan validates the whole array and lists its elements; each element is then
     * scanned on its own, so its flaws carry paths relative to the event. */
    struct kvr_json_scan whole;
    kvr_json_scan_init(&whole, NULL);
    int rc = kvr_json_scan(&whole, b->text, b->len, KVR_JSON_SCAN_ELEMENTS);
    if (rc == KVR_ECORRUPT) {
        report(b, KVR_EVENT_JSON_BODY, whole.err_off, KVR_ECORRUPT,
               "body: not valid JSON at byte %zu: %s", whole.err_off, whole.err);
        /* rc stays KVR_ECORRUPT: nothing is decoded from a broken array */
    } else if (rc == KVR_OK) {
        for (size_t i = 0; i < whole.n_elems && rc == KVR_OK; i++)
            rc = decode_span(b, i, whole.elems[i].off, whole.elems[i].len);
    }
    kvr_json_scan_free(&whole);
    return rc;
}

int kvr_event_json_decode_body(const char *text, size_t len, struct kvr_event_list *out,
                               struct kvr_event_json_report *rep)
{
    struct body b = {text, len, out, rep, {0}, NULL};
    int rc = KVR_OK;
    rep->n_errors = rep->events = rep->decoded = rep->failed = 0;
    kvr_json_scan_init(&b.scan, NULL);

    size_t p = skip_ws(text, 0, len);
    if (p == len) {
        report(&b, KVR_EVENT_JSON_BODY, p, KVR_ECORRUPT, "body: empty");
        return KVR_ECORRUPT;
    }
    b.tok = json_tokener_new_ex(KVR_JSON_MAX_DEPTH + 1);
    if (b.tok == NULL)
        return KVR_ENOMEM;

    if (text[p] == '[') {
        rc = decode_array(&b);
    } else if (text[p] == '{') {
        rc = kvr_json_scan(&b.scan, text, len, KVR_JSON_SCAN_PREFIX);
        if (rc == KVR_OK) {
            size_t end = b.scan.end;
            if (skip_ws(text, end, len) == len)
                rc = decode_span(&b, 0, p, end - p);
            else
                rc = decode_lines(&b);
        } else if (rc == KVR_ECORRUPT) {
            if (looks_line_delimited(text, len)) {
                rc = decode_lines(&b);
            } else {
                report(&b, KVR_EVENT_JSON_BODY, b.scan.err_off, KVR_ECORRUPT,
                       "body: not valid JSON at byte %zu: %s", b.scan.err_off, b.scan.err);
                rc = KVR_ECORRUPT;
            }
        }
    } else {
        rc = kvr_json_scan(&b.scan, text, len, 0);
        if (rc == KVR_OK)
            report(&b, KVR_EVENT_JSON_BODY, p, KVR_ECORRUPT,
                   "body: expected a RouterEvent object, an array of them or one per line, "
                   "got %s",
                   describe_root(b.scan.root));
        else if (rc == KVR_ECORRUPT)
            report(&b, KVR_EVENT_JSON_BODY, b.scan.err_off, KVR_ECORRUPT,
                   "body: not valid JSON at byte %zu: %s", b.scan.err_off, b.scan.err);
        if (rc == KVR_OK)
            rc = KVR_ECORRUPT;
    }
    json_tokener_free(b.tok);
    kvr_json_scan_free(&b.scan);
    return rc;
}

/* ==== Encoding =============================================================================== */

#define LIT(p, s) (memcpy((p), (s), sizeof(s) - 1), (p) += sizeof(s) - 1)

static const char block_open[] = "{\"block_hash\":";
static const char block_mid[] = ",\"tokens_hash\":";
static const char block_close[] = ",\"mm_extra_info\":null}";

/* Upper bounds of the text: the fixed part of an event, and each block / removed hash. */
#define EVENT_MAX 400u
#define BLOCK_MAX                                                                                  \
    (sizeof(block_open) + sizeof(block_mid) + sizeof(block_close) + 2 * KVR_U64_DEC_MAX + 1)
#define HASH_MAX (KVR_U64_DEC_MAX + 1)

static char *put_u64(char *p, uint64_t v)
{
    return p + kvr_buf_fmt_u64(p, v);
}

/* Encodes one event at the buffer's tail; the caller restores the length on failure. */
static int encode_one(const struct kvr_event *ev, struct kvr_buf *out)
{
    const char *tier = kvr_tier_name(ev->tier);
    if (tier == NULL || ev->domain > KVR_DOMAIN_CACHE_OWNER)
        return KVR_EINVAL;
    size_t per;
    switch (ev->kind) {
    case KVR_EVENT_STORED:
        if (ev->n > 0 && ev->blocks == NULL)
            return KVR_EINVAL;
        per = BLOCK_MAX;
        break;
    case KVR_EVENT_REMOVED:
        if (ev->n > 0 && ev->hashes == NULL)
            return KVR_EINVAL;
        per = HASH_MAX;
        break;
    case KVR_EVENT_CLEARED:
        per = 0;
        break;
    default:
        return KVR_EINVAL;
    }
    /* n <= 2^32 - 1 and per < 128: no overflow on 64-bit size_t; guard 32-bit hosts. */
    if (per != 0 && ev->n > (SIZE_MAX - EVENT_MAX) / per)
        return KVR_ENOMEM;
    if (kvr_buf_reserve(out, EVENT_MAX + (size_t)ev->n * per) != KVR_OK)
        return KVR_ENOMEM;

    char *start = kvr_buf_tail(out), *p = start;
    LIT(p, "{\"worker_id\":");
    p = put_u64(p, ev->worker_id);
    LIT(p, ",\"storage_tier\":\"");
    size_t tl = strlen(tier);
    memcpy(p, tier, tl);
    p += tl;
    *p++ = '"';
    if (ev->domain == KVR_DOMAIN_CACHE_OWNER)
        LIT(p, ",\"residency_domain\":\"cache_owner\"");
    LIT(p, ",\"event\":{\"event_id\":");
    p = put_u64(p, ev->event_id);
    LIT(p, ",\"dp_rank\":");
    p = put_u64(p, ev->dp_rank);
    LIT(p, ",\"data\":");
    if (ev->kind == KVR_EVENT_STORED) {
        LIT(p, "{\"stored\":{\"parent_hash\":");
        if (ev->has_parent)
            p = put_u64(p, ev->parent_hash);
        else
            LIT(p, "null");
        LIT(p, ",\"start_position\":");
        if (ev->has_start_position)
            p = put_u64(p, ev->start_position);
        else
            LIT(p, "null");
        LIT(p, ",\"blocks\":[");
        for (uint32_t i = 0; i < ev->n; i++) {
            if (i > 0)
                *p++ = ',';
            LIT(p, block_open);
            p = put_u64(p, ev->blocks[i].block_hash);
            LIT(p, block_mid);
            p = put_u64(p, ev->blocks[i].tokens_hash);
            LIT(p, block_close);
        }
        LIT(p, "]}}");
    } else if (ev->kind == KVR_EVENT_REMOVED) {
        LIT(p, "{\"removed\":{\"block_hashes\":[");
        for (uint32_t i = 0; i < ev->n; i++) {
            if (i > 0)
                *p++ = ',';
            p = put_u64(p, ev->hashes[i]);
        }
        LIT(p, "]}}");
    } else {
        LIT(p, "\"cleared\"");
    }
    LIT(p, "}}");
    kvr_buf_commit(out, (size_t)(p - start));
    return KVR_OK;
}

int kvr_event_json_encode(const struct kvr_event *ev, struct kvr_buf *out)
{
    size_t len0 = out->len;
    int rc = encode_one(ev, out);
    if (rc != KVR_OK)
        kvr_buf_truncate(out, len0);
    return rc;
}

/* Appends events with an opening text, a separator after each event (or between them) and a
 * closing text; restores the buffer on failure. */
static int encode_many(const struct kvr_event *ev, size_t n, struct kvr_buf *out, const char *open,
                       char sep, int sep_after_last, const char *close)
{
    size_t len0 = out->len;
    int rc = kvr_buf_append_str(out, open);
    for (size_t i = 0; i < n && rc == KVR_OK; i++) {
        if (i > 0 && !sep_after_last)
            rc = kvr_buf_append_char(out, sep);
        if (rc == KVR_OK)
            rc = encode_one(&ev[i], out);
        if (rc == KVR_OK && sep_after_last)
            rc = kvr_buf_append_char(out, sep);
    }
    if (rc == KVR_OK)
        rc = kvr_buf_append_str(out, close);
    if (rc != KVR_OK)
        kvr_buf_truncate(out, len0);
    return rc;
}

int kvr_event_json_encode_array(const struct kvr_event *ev, size_t n, struct kvr_buf *out)
{
    return encode_many(ev, n, out, "[", ',', 0, "]");
}

int kvr_event_json_encode_lines(const struct kvr_event *ev, size_t n, struct kvr_buf *out)
{
    return encode_many(ev, n, out, "", '\n', 1, "");
}
