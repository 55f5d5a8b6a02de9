/* trace.c - Mooncake JSONL trace reader (plain or gzip) and the best-achievable prefix.
 * SPDX-License-Identifier: Apache-2.0
 *
 * Why json-c per line rather than a hand-written scanner: traces are small (the conversation
 * trace is 3 MB, parsed in tens of milliseconds) and json-c rejects malformed input for us.
 * Why zlib: the project ships its traces gzip-compressed (data/traces/, .jsonl.gz); gzread also
 * passes plain files through unchanged, so one code path reads both. */
#include <json-c/json.h>
#include <zlib.h>

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvr/err.h"
#include "kvr/hash.h"
#include "kvr/sim.h"
#include "u64tab.h"

void kvr_sim_trace_init(struct kvr_sim_trace *t)
{
    memset(t, 0, sizeof(*t));
}

void kvr_sim_trace_free(struct kvr_sim_trace *t)
{
    free(t->req);
    free(t->ids);
    kvr_sim_trace_init(t);
}

static void fail(char *err, size_t err_len, const char *fmt, ...)
{
    if (err == NULL || err_len == 0)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, err_len, fmt, ap);
    va_end(ap);
}

static int reserve(void **p, size_t *cap, size_t need, size_t size)
{
    if (need <= *cap)
        return KVR_OK;
    size_t ncap = *cap ? *cap : 256;
    while (ncap < need) {
        if (ncap > SIZE_MAX / 2 / size)
            return KVR_ENOMEM;
        ncap *= 2;
    }
    void *np = realloc(*p, ncap * size);
    if (np == NULL)
        return KVR_ENOMEM;
    *p = np;
    *cap = ncap;
    return KVR_OK;
}

/* An integer field in [0, max]; 1 on success. */
static int get_uint(json_object *o, const char *key, uint64_t max, uint64_t *out)
{
    json_object *v;
    if (!json_object_object_get_ex(o, key, &v) || !json_object_is_type(v, json_type_int))
        return 0;
    int64_t x = json_object_get_int64(v);
    if (x < 0 || (uint64_t)x > max)
        return 0;
    *out = (uint64_t)x;
    return 1;
}

/* Parses one line (NUL-terminated, non-blank) into t. */
static int parse_line(struct kvr_sim_trace *t, const char *line, size_t len, size_t lineno,
                      char *err, size_t err_len)
{
    struct json_tokener *tok = json_tokener_new();
    if (tok == NULL)
        return KVR_ENOMEM;
    json_object *o = json_tokener_parse_ex(tok, line, (int)len);
    int jerr = json_tokener_get_error(tok);
    size_t used = (size_t)json_tokener_get_parse_end(tok);
    json_tokener_free(tok);
    int rc = KVR_ECORRUPT;
    if (o == NULL || jerr != json_tokener_success) {
        fail(err, err_len, "line %zu: not a JSON object (%s)", lineno,
             json_tokener_error_desc(jerr));
        goto out;
    }
    for (size_t k = used; k < len; k++)
        if (line[k] != ' ' && line[k] != '\t' && line[k] != '\r') {
            fail(err, err_len, "line %zu: trailing characters after the object", lineno);
            goto out;
        }
    if (!json_object_is_type(o, json_type_object)) {
        fail(err, err_len, "line %zu: not a JSON object", lineno);
        goto out;
    }
    json_object *ts, *ids;
    double ms;
    if (!json_object_object_get_ex(o, "timestamp", &ts) ||
        !(json_object_is_type(ts, json_type_int) || json_object_is_type(ts, json_type_double)) ||
        !isfinite(ms = json_object_get_double(ts)) || ms < 0 || ms > 1e15) {
        fail(err, err_len, "line %zu: timestamp: expected a number of milliseconds >= 0", lineno);
        goto out;
    }
    uint64_t in, outl;
    if (!get_uint(o, "input_length", UINT32_MAX, &in)) {
        fail(err, err_len, "line %zu: input_length: expected an integer in [0, 2^32)", lineno);
        goto out;
    }
    if (!get_uint(o, "output_length", UINT32_MAX, &outl)) {
        fail(err, err_len, "line %zu: output_length: expected an integer in [0, 2^32)", lineno);
        goto out;
    }
    if (!json_object_object_get_ex(o, "hash_ids", &ids) ||
        !json_object_is_type(ids, json_type_array)) {
        fail(err, err_len, "line %zu: hash_ids: expected an array of integers", lineno);
        goto out;
    }
    if (t->n > 0 && ms < t->first_ms + (double)t->req[t->n - 1].arrival_us / 1000.0 - 1e-9) {
        fail(err, err_len, "line %zu: timestamp %.3f goes back in time (requests must be sorted)",
             lineno, ms);
        goto out;
    }
    size_t n_ids = json_object_array_length(ids);
    if (n_ids > UINT32_MAX ||
        reserve((void **)&t->ids, &t->cap_ids_, t->n_ids + n_ids, sizeof(*t->ids)) != KVR_OK ||
        reserve((void **)&t->req, &t->cap_req_, t->n + 1, sizeof(*t->req)) != KVR_OK) {
        rc = KVR_ENOMEM;
        goto out;
    }
    for (size_t k = 0; k < n_ids; k++) {
        json_object *v = json_object_array_get_idx(ids, k);
        int64_t x = json_object_is_type(v, json_type_int) ? json_object_get_int64(v) : -1;
        if (x < 0 || x > (int64_t)UINT32_MAX) {
            fail(err, err_len, "line %zu: hash_ids[%zu]: expected an integer in [0, 2^32)", lineno,
                 k);
            goto out;
        }
        t->ids[t->n_ids + k] = (uint32_t)x;
        if ((uint32_t)x > t->max_id)
            t->max_id = (uint32_t)x;
    }
    if (t->n == 0)
        t->first_ms = ms;
    struct kvr_sim_request *r = &t->req[t->n++];
    memset(r, 0, sizeof(*r));
    r->arrival_us = (uint64_t)llround((ms - t->first_ms) * 1000.0);
    r->input_tokens = (uint32_t)in;
    r->output_tokens = (uint32_t)outl;
    r->ids_off = t->n_ids;
    r->n_ids = (uint32_t)n_ids;
    t->n_ids += n_ids;
    rc = KVR_OK;
out:
    if (o != NULL)
        json_object_put(o);
    return rc;
}

int kvr_sim_trace_parse(const char *buf, size_t len, struct kvr_sim_trace *t, char *err,
                        size_t err_len)
{
    char stack[4096];
    char *line = stack;
    size_t cap = sizeof(stack), lineno = 0;
    int rc = KVR_OK;
    for (size_t pos = 0; pos < len && rc == KVR_OK;) {
        const char *nl = memchr(buf + pos, '\n', len - pos);
        size_t end = nl ? (size_t)(nl - buf) : len;
        size_t n = end - pos;
        lineno++;
        size_t k = 0;
        while (k < n && (buf[pos + k] == ' ' || buf[pos + k] == '\t' || buf[pos + k] == '\r'))
            k++;
        if (k < n) {
            if (n + 1 > cap) {
                char *nb = malloc(n + 1);
                if (nb == NULL) {
                    rc = KVR_ENOMEM;
                    break;
                }
                if (line != stack)
                    free(line);
                line = nb;
                cap = n + 1;
            }
            memcpy(line, buf + pos, n);
            line[n] = '\0';
            if (n > INT32_MAX) {
                fail(err, err_len, "line %zu: too long", lineno);
                rc = KVR_ECORRUPT;
            } else {
                rc = parse_line(t, line, n, lineno, err, err_len);
            }
        }
        pos = end + 1;
    }
    if (line != stack)
        free(line);
    return rc;
}

int kvr_sim_trace_load(const char *path, struct kvr_sim_trace *t, char *err, size_t err_len)
{
    gzFile f = gzopen(path, "rb");
    if (f == NULL) {
        fail(err, err_len, "%s: cannot open", path);
        return KVR_EIO;
    }
    char *buf = NULL;
    size_t len = 0, cap = 0;
    int rc = KVR_OK;
    for (;;) {
        if (reserve((void **)&buf, &cap, len + 65536, 1) != KVR_OK) {
            rc = KVR_ENOMEM;
            break;
        }
        int got = gzread(f, buf + len, 65536);
        if (got < 0) {
            int zerr = 0;
            const char *m = gzerror(f, &zerr);
            fail(err, err_len, "%s: read error (%s)", path, m ? m : "?");
            rc = KVR_EIO;
            break;
        }
        if (got == 0)
            break;
        len += (size_t)got;
    }
    gzclose(f);
    if (rc == KVR_OK) {
        char sub[768];
        rc = kvr_sim_trace_parse(buf, len, t, sub, sizeof(sub));
        if (rc == KVR_ECORRUPT)
            fail(err, err_len, "%s: %s", path, sub);
    }
    free(buf);
    return rc;
}

int kvr_sim_trace_best(const struct kvr_sim_trace *t, uint32_t *best)
{
    /* Each id chain is hashed into a key that names the whole prefix (like sequence hashes),
     * so one set of keys answers "was this prefix seen before" for any trace, not only those
     * whose ids have a single parent. */
    struct kvr_sim_u64tab seen;
    kvr_sim_u64tab_init(&seen);
    int rc = KVR_OK;
    for (size_t i = 0; i < t->n && rc == KVR_OK; i++) {
        const struct kvr_sim_request *r = &t->req[i];
        const uint32_t *ids = t->ids + r->ids_off;
        uint64_t h = KVR_HASH_SEED;
        uint32_t p = 0;
        int prefix = 1;
        for (uint32_t k = 0; k < r->n_ids; k++) {
            h = kvr_hash_seq_next(h, ids[k]);
            if (prefix && kvr_sim_u64tab_get(&seen, h, NULL))
                p = k + 1;
            else
                prefix = 0;
            if (!prefix && kvr_sim_u64tab_put(&seen, h, 0) != KVR_OK) {
                rc = KVR_ENOMEM;
                break;
            }
        }
        best[i] = p;
    }
    kvr_sim_u64tab_free(&seen);
    return rc;
}
