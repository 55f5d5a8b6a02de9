/* opstream.c - op-stream loader (see opstream.h, spec/opstream.md).
 *
 * Static helpers borrow every pointer they take and return nothing owned, unless their comment says
 * otherwise. */
#include "opstream.h"

#include <json-c/json.h>

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvr/err.h"
#include "kvr/event_json.h"
#include "kvr/json_u64.h"

void kvr_opstream_init(struct kvr_opstream *s)
{
    memset(s, 0, sizeof(*s));
    kvr_event_list_init(&s->events);
}

void kvr_opstream_free(struct kvr_opstream *s)
{
    kvr_event_list_free(&s->events);
    free(s->ops);
    free(s->queries);
    free(s->hashes);
    free(s->expects);
    kvr_opstream_init(s);
}

/* Makes room for `more` items in a malloc'd array of `size`-byte items; the array always exists
 * afterwards (so `arr + n` is valid pointer arithmetic even when more is 0). */
static int reserve(void **arr, size_t *cap, size_t n, size_t more, size_t size)
{
    if (*arr != NULL && more <= *cap - n)
        return KVR_OK;
    size_t ncap = *cap ? *cap : 64;
    while (ncap - n < more) {
        if (ncap > SIZE_MAX / 2 / size)
            return KVR_ENOMEM;
        ncap *= 2;
    }
    void *p = realloc(*arr, ncap * size);
    if (p == NULL)
        return KVR_ENOMEM;
    *arr = p;
    *cap = ncap;
    return KVR_OK;
}

/* Parses a decimal worker id key: digits only, no leading zero, <= 2^64 - 1. */
static int parse_worker_key(const char *k, uint64_t *out)
{
    size_t n = strlen(k);
    if (n == 0 || n > 20 || (n > 1 && k[0] == '0'))
        return 0;
    uint64_t v = 0;
    for (size_t i = 0; i < n; i++) {
        if (k[i] < '0' || k[i] > '9')
            return 0;
        uint64_t d = (uint64_t)(k[i] - '0');
        if (v > (UINT64_MAX - d) / 10)
            return 0;
        v = v * 10 + d;
    }
    *out = v;
    return 1;
}

static int cmp_expect(const void *a, const void *b)
{
    const struct kvr_opstream_expect *x = a, *y = b;
    return x->worker_id < y->worker_id ? -1 : x->worker_id > y->worker_id;
}

/* Loader state for one file (borrowed pieces plus the per-line scan). */
struct loader {
    struct kvr_opstream *s;
    struct kvr_json_scan scan;
    char *msg; /* field-level message ("<path>: <reason>") */
    size_t msg_len;
};

/* {"match": [...], "expect": {...}} -> one query. */
static int load_match(struct loader *L, struct json_object *o, struct json_object *match)
{
    struct kvr_opstream *s = L->s;
    struct kvr_json_path p_match = {NULL, "match", 0}, p_expect = {NULL, "expect", 0};
    struct json_object *expect;
    int rc;
    if (json_object_get_type(match) != json_type_array)
        return kvr_json_type_error(L->msg, L->msg_len, &L->scan, &p_match, "an array", match);
    if (!json_object_object_get_ex(o, "expect", &expect))
        return kvr_json_missing(L->msg, L->msg_len, &p_expect);
    if (expect == NULL || json_object_get_type(expect) != json_type_object)
        return kvr_json_type_error(L->msg, L->msg_len, &L->scan, &p_expect, "an object", expect);
    size_t n = json_object_array_length(match);
    size_t ne = (size_t)json_object_object_length(expect);
    if (n > UINT32_MAX)
        return kvr_json_type_error(L->msg, L->msg_len, &L->scan, &p_match,
                                   "at most 4294967295 hashes", match);
    if (reserve((void **)&s->hashes, &s->cap_hashes_, s->n_hashes, n, sizeof(uint64_t)) ||
        reserve((void **)&s->expects, &s->cap_expects_, s->n_expects, ne,
                sizeof(struct kvr_opstream_expect)) ||
        reserve((void **)&s->queries, &s->cap_queries_, s->n_queries, 1,
                sizeof(struct kvr_opstream_query)))
        return KVR_ENOMEM;

    uint64_t *h = s->hashes + s->n_hashes;
    for (size_t i = 0; i < n; i++) {
        struct kvr_json_path p_i = {&p_match, NULL, i};
        rc = kvr_json_read_hash(json_object_array_get_idx(match, i), &L->scan, &p_i, &h[i], L->msg,
                                L->msg_len);
        if (rc != KVR_OK)
            return rc;
    }
    struct kvr_opstream_expect *e = s->expects + s->n_expects;
    size_t k = 0;
    uint64_t hits = 0;
    json_object_object_foreach(expect, key, val)
    {
        struct kvr_json_path p_k = {&p_expect, key, 0};
        uint64_t w, blocks;
        if (!parse_worker_key(key, &w)) {
            snprintf(L->msg, L->msg_len, "expect: key \"%.40s\" is not a decimal worker id", key);
            return KVR_ECORRUPT;
        }
        rc = kvr_json_read_uint(val, UINT32_MAX, &L->scan, &p_k, &blocks, L->msg, L->msg_len);
        if (rc != KVR_OK)
            return rc;
        if (blocks == 0)
            continue; /* zeros are omitted by the format; tolerate them */
        e[k++] = (struct kvr_opstream_expect){w, (uint32_t)blocks, 0};
        hits += blocks;
    }
    qsort(e, k, sizeof(*e), cmp_expect);
    s->queries[s->n_queries] =
        (struct kvr_opstream_query){s->n_hashes, s->n_expects, (uint32_t)n, (uint32_t)k};
    s->n_hashes += n;
    s->n_expects += k;
    s->match_blocks += n;
    s->expected_hits += hits;
    return KVR_OK;
}

/* One non-blank line: scan, parse, dispatch. Returns KVR_OK, KVR_ECORRUPT (message in err) or
 * KVR_ENOMEM. */
static int load_line(struct loader *L, struct json_tokener *tok, const char *text, size_t len,
                     uint32_t line, char *err, size_t err_len)
{
    struct kvr_opstream *s = L->s;
    int rc = kvr_json_scan(&L->scan, text, len, 0);
    if (rc == KVR_ENOMEM)
        return rc;
    if (rc != KVR_OK) {
        snprintf(err, err_len, "line %u: not valid JSON at column %zu: %s", line,
                 L->scan.err_off + 1, L->scan.err);
        return KVR_ECORRUPT;
    }
    if (L->scan.root != '{' || len > INT_MAX) {
        snprintf(err, err_len, "line %u: expected an object {\"event\": ...} or {\"match\": ...}",
                 line);
        return KVR_ECORRUPT;
    }
    json_tokener_reset(tok);
    struct json_object *o =
        json_tokener_parse_ex(tok, text + L->scan.start, (int)(L->scan.end - L->scan.start));
    if (o == NULL) {
        snprintf(err, err_len, "line %u: json-c could not parse it: %s", line,
                 json_tokener_error_desc(json_tokener_get_error(tok)));
        return KVR_ECORRUPT;
    }
    if (reserve((void **)&s->ops, &s->cap_ops_, s->n_ops, 1, sizeof(*s->ops)) != KVR_OK) {
        json_object_put(o);
        return KVR_ENOMEM;
    }
    struct json_object *ev, *match;
    int has_ev = json_object_object_get_ex(o, "event", &ev);
    int has_match = json_object_object_get_ex(o, "match", &match);
    L->msg[0] = '\0';
    if (has_ev == has_match) {
        snprintf(L->msg, L->msg_len, "expected exactly one of \"event\" and \"match\"");
        rc = KVR_ECORRUPT;
    } else if (has_ev) {
        struct kvr_json_path at = {NULL, "event", 0};
        size_t before = s->events.n;
        rc = kvr_event_json_decode(ev, &L->scan, &at, &s->events, L->msg, L->msg_len);
        if (rc == KVR_OK) {
            const struct kvr_event *e = &s->events.ev[before];
            if (e->kind == KVR_EVENT_STORED) {
                s->stored++;
                s->stored_blocks += e->n;
            } else if (e->kind == KVR_EVENT_REMOVED) {
                s->removed++;
                s->removed_blocks += e->n;
            } else {
                s->cleared++;
            }
            s->ops[s->n_ops++] =
                (struct kvr_opstream_op){KVR_OPSTREAM_EVENT, line, (uint32_t)before};
        }
    } else {
        rc = load_match(L, o, match);
        if (rc == KVR_OK)
            s->ops[s->n_ops++] =
                (struct kvr_opstream_op){KVR_OPSTREAM_MATCH, line, (uint32_t)(s->n_queries++)};
    }
    json_object_put(o);
    if (rc == KVR_ENOMEM)
        return rc;
    if (rc != KVR_OK)
        snprintf(err, err_len, "line %u: %s", line, L->msg);
    return rc;
}

int kvr_opstream_load(const char *path, struct kvr_opstream *s, char *err, size_t err_len)
{
    char scratch[8];
    char msg[KVR_EVENT_JSON_MSG];
    struct loader L = {s, {0}, msg, sizeof(msg)};
    FILE *f = NULL;
    struct json_tokener *tok = NULL;
    char *line = NULL;
    size_t line_cap = 0;
    uint32_t lineno = 0;
    int rc = KVR_OK;

    if (err == NULL || err_len == 0) {
        err = scratch;
        err_len = sizeof(scratch);
    }
    err[0] = '\0';
    kvr_json_scan_init(&L.scan, NULL);
    f = fopen(path, "r");
    if (f == NULL) {
        snprintf(err, err_len, "%s: %s", path, strerror(errno));
        rc = KVR_EIO;
        goto out;
    }
    tok = json_tokener_new_ex(KVR_JSON_MAX_DEPTH + 1);
    if (tok == NULL) {
        rc = KVR_ENOMEM;
        goto out;
    }
    for (;;) {
        errno = 0;
        ssize_t n = getline(&line, &line_cap, f);
        if (n == -1) {
            if (errno == ENOMEM) {
                rc = KVR_ENOMEM;
            } else if (ferror(f)) {
                snprintf(err, err_len, "%s: read error after line %u", path, lineno);
                rc = KVR_EIO;
            }
            break;
        }
        if (lineno == UINT32_MAX) {
            snprintf(err, err_len, "%s: more than %u lines", path, UINT32_MAX);
            rc = KVR_ECORRUPT;
            break;
        }
        lineno++;
        size_t len = (size_t)n;
        while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r' || line[len - 1] == ' ' ||
                           line[len - 1] == '\t'))
            len--;
        size_t lead = 0;
        while (lead < len && (line[lead] == ' ' || line[lead] == '\t'))
            lead++;
        if (lead == len)
            continue; /* blank line */
        rc = load_line(&L, tok, line, len, lineno, err, err_len);
        if (rc != KVR_OK)
            break;
    }
out:
    if (rc == KVR_ENOMEM && err[0] == '\0')
        snprintf(err, err_len, "%s: out of memory at line %u", path, lineno);
    free(line);
    if (tok != NULL)
        json_tokener_free(tok);
    if (f != NULL)
        fclose(f);
    kvr_json_scan_free(&L.scan);
    return rc;
}
