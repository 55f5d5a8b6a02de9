/* fuzz_http_json.c - the two readers of request bodies against each other (differential): the
 * single-pass fast paths of server/src/fastjson.c, used by the hottest endpoints, and the
 * strict general reader (server/src/jsonr.c: kvr_json_scan + json-c) every endpoint falls back
 * to. The fast path may decline anything, but what it accepts the general path must accept with
 * the same meaning (fastjson.h). The first byte picks the check, the rest is the body:
 *
 *   0  srv_fast_query_by_hash        vs srv_jdoc_parse + srv_jread_hashes / srv_jget_str
 *                                       (POST /query_by_hash)
 *   1  srv_fast_object (member walk) vs srv_jdoc_parse: same members, same value types
 *                                       (POST /v1/route, /v1/completions fast paths)
 *   2  srv_fast_u64_array            vs srv_jread_hashes, on {"a": <rest>}
 *   3  srv_fast_u32_array            vs srv_jread_tokens, on {"a": <rest>}
 *
 * Every buffer handed to a reader is exactly sized (no terminating NUL), so reading one byte
 * past a body is an ASan report. */
#include <json-c/json.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fastjson.h"
#include "jsonr.h"
#include "kvr/err.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define CAP 64

static void fail(const char *what, const char *text, size_t len)
{
    fprintf(stderr, "fuzz_http_json: %s on %zu bytes: %.*s\n", what, len,
            (int)(len > 300 ? 300 : len), text);
    abort();
}

static int same_str(const char *a, size_t al, const char *b, size_t bl)
{
    return al == bl && (al == 0 || memcmp(a, b, al) == 0);
}

static void check_query_by_hash(struct srv_jdoc *d, const char *text, size_t len)
{
    uint64_t fast[CAP], slow[CAP];
    struct srv_fast_query q;
    if (!srv_fast_query_by_hash(text, len, fast, CAP, &q))
        return;
    char err[SRV_JERR];
    if (srv_jdoc_parse(d, text, len, err, sizeof(err)) != KVR_OK || d->root == NULL ||
        !json_object_is_type(d->root, json_type_object))
        fail("fast query_by_hash accepted what the general reader refuses", text, len);
    struct json_object *arr = NULL;
    if (!srv_jmember(d->root, "block_hashes", &arr) || arr == NULL)
        fail("fast query_by_hash found block_hashes the general reader does not", text, len);
    struct kvr_json_path p = {NULL, "block_hashes", 0};
    size_t n = 0;
    if (srv_jread_hashes(d, arr, &p, slow, CAP, &n, err, sizeof(err)) != KVR_OK)
        fail("general reader refuses hashes the fast path read", text, len);
    if (n != q.n || memcmp(fast, slow, n * sizeof(*fast)) != 0)
        fail("the readers disagree on the hashes", text, len);
    static const char *const keys[2] = {"model_name", "tenant_id"};
    const char *fv[2] = {q.model, q.tenant};
    size_t fl[2] = {q.model_len, q.tenant_len};
    for (int k = 0; k < 2; k++) {
        const char *sv = NULL;
        size_t sl = 0;
        int present = 0;
        if (srv_jget_str(d, d->root, NULL, keys[k], 0, &sv, &sl, &present, err, sizeof(err)) !=
            KVR_OK)
            fail("general reader refuses a string the fast path read", text, len);
        if (present != (fv[k] != NULL) || (present && !same_str(fv[k], fl[k], sv, sl)))
            fail("the readers disagree on model_name/tenant_id", text, len);
    }
    srv_jdoc_release(d);
}

struct walk {
    struct json_object *root;
    const char *text;
    size_t len;
    int pass; /* 1: collect the keys; 2: compare with the tree */
    int many; /* more keys than we track: no type comparison */
    char keys[32][64];
    int count[32];
    int n;
};

static int json_type_char(struct json_object *v)
{
    switch (v == NULL ? json_type_null : json_object_get_type(v)) {
    case json_type_null:
        return 'n';
    case json_type_boolean:
        return json_object_get_boolean(v) ? 't' : 'f';
    case json_type_double:
    case json_type_int:
        return '0';
    case json_type_string:
        return '"';
    case json_type_array:
        return '[';
    case json_type_object:
        return '{';
    }
    return '?';
}

static int key_index(struct walk *w, const char *k)
{
    for (int i = 0; i < w->n; i++)
        if (strcmp(w->keys[i], k) == 0)
            return i;
    return -1;
}

static int walk_member(void *ctx, const char *key, size_t kl, const struct srv_fast_value *v)
{
    struct walk *w = ctx;
    char k[64];
    if (v->len == 0 || v->p < w->text || v->p + v->len > w->text + w->len)
        fail("a member value outside the body", w->text, w->len);
    if (kl >= sizeof(k)) {
        w->many = 1;
        return 0;
    }
    memcpy(k, key, kl);
    k[kl] = '\0';
    int i = key_index(w, k);
    if (w->pass == 1) {
        if (i >= 0)
            w->count[i]++;
        else if (w->n < 32) {
            memcpy(w->keys[w->n], k, kl + 1);
            w->count[w->n++] = 1;
        } else
            w->many = 1;
        return 0;
    }
    struct json_object *jv = NULL;
    if (!json_object_object_get_ex(w->root, k, &jv))
        fail("a member the fast walk saw is missing from the general tree", w->text, w->len);
    /* json-c keeps the last of duplicate keys: compare only keys seen once */
    if (!w->many && i >= 0 && w->count[i] == 1 && json_type_char(jv) != v->type)
        fail("the readers disagree on a member's type", w->text, w->len);
    return 0;
}

static int nop_member(void *ctx, const char *key, size_t kl, const struct srv_fast_value *v)
{
    (void)ctx;
    (void)key;
    (void)kl;
    (void)v;
    return 0;
}

static void check_object(struct srv_jdoc *d, const char *text, size_t len)
{
    if (!srv_fast_object(text, len, nop_member, NULL))
        return;
    char err[SRV_JERR];
    if (srv_jdoc_parse(d, text, len, err, sizeof(err)) != KVR_OK || d->root == NULL ||
        !json_object_is_type(d->root, json_type_object))
        fail("fast object walk accepted what the general reader refuses", text, len);
    struct walk w = {.root = d->root, .text = text, .len = len, .pass = 1};
    if (!srv_fast_object(text, len, walk_member, &w))
        fail("the fast walk is not deterministic", text, len);
    w.pass = 2;
    if (!srv_fast_object(text, len, walk_member, &w))
        fail("the fast walk is not deterministic", text, len);
    srv_jdoc_release(d);
}

/* {"a": <value>} in an exactly sized buffer. */
static char *wrap(const char *value, size_t vlen, size_t *len)
{
    *len = vlen + 6;
    char *b = malloc(*len);
    if (b == NULL)
        return NULL;
    memcpy(b, "{\"a\":", 5);
    memcpy(b + 5, value, vlen);
    b[*len - 1] = '}';
    return b;
}

struct grab {
    struct srv_fast_value v;
    int found;
};

static int grab_a(void *ctx, const char *key, size_t kl, const struct srv_fast_value *v)
{
    struct grab *g = ctx;
    if (kl == 1 && key[0] == 'a') {
        g->v = *v;
        g->found = 1;
    }
    return 0;
}

static void check_array(struct srv_jdoc *d, const char *value, size_t vlen, int hashes)
{
    size_t len;
    char *text = wrap(value, vlen, &len);
    if (text == NULL)
        return;
    struct grab g = {.found = 0};
    if (!srv_fast_object(text, len, grab_a, &g) || !g.found)
        goto out;
    uint64_t f64[CAP], s64[CAP];
    uint32_t f32[CAP], s32[CAP];
    long n = hashes ? srv_fast_u64_array(&g.v, f64, CAP) : srv_fast_u32_array(&g.v, f32, CAP);
    if (n < 0)
        goto out;
    char err[SRV_JERR];
    if (srv_jdoc_parse(d, text, len, err, sizeof(err)) != KVR_OK)
        fail("the general reader refuses a body the fast walk accepted", text, len);
    struct json_object *arr = NULL;
    srv_jmember(d->root, "a", &arr);
    struct kvr_json_path p = {NULL, "a", 0};
    size_t sn = 0;
    int rc = hashes ? srv_jread_hashes(d, arr, &p, s64, CAP, &sn, err, sizeof(err))
                    : srv_jread_tokens(d, arr, &p, s32, CAP, &sn, err, sizeof(err));
    if (rc != KVR_OK)
        fail(hashes ? "general reader refuses hashes the fast path read"
                    : "general reader refuses tokens the fast path read",
             text, len);
    if ((size_t)n != sn ||
        (hashes ? memcmp(f64, s64, sn * sizeof(*f64)) : memcmp(f32, s32, sn * sizeof(*f32))) != 0)
        fail("the readers disagree on the array's values", text, len);
    srv_jdoc_release(d);
out:
    free(text);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size == 0)
        return 0;
    struct srv_jdoc d;
    if (srv_jdoc_init(&d) != KVR_OK)
        return 0;
    size_t len = size - 1;
    char *text = malloc(len ? len : 1); /* exactly sized */
    if (text != NULL) {
        memcpy(text, data + 1, len);
        switch (data[0] % 4) {
        case 0:
            check_query_by_hash(&d, text, len);
            break;
        case 1:
            check_object(&d, text, len);
            break;
        case 2:
            check_array(&d, text, len, 1);
            break;
        default:
            check_array(&d, text, len, 0);
            break;
        }
        free(text);
    }
    srv_jdoc_free(&d);
    return 0;
}
