/* jsonr.c - strict body parsing and field readers (see jsonr.h). */
#include "jsonr.h"

#include <json-c/json.h>
#include <stdio.h>
#include <string.h>

#include "kvr/err.h"

int srv_jdoc_init(struct srv_jdoc *d)
{
    kvr_json_scan_init(&d->scan, NULL);
    d->root = NULL;
    d->tok = json_tokener_new_ex(KVR_JSON_MAX_DEPTH + 1);
    return d->tok != NULL ? KVR_OK : KVR_ENOMEM;
}

void srv_jdoc_release(struct srv_jdoc *d)
{
    if (d->root != NULL)
        json_object_put(d->root);
    d->root = NULL;
}

void srv_jdoc_free(struct srv_jdoc *d)
{
    srv_jdoc_release(d);
    kvr_json_scan_free(&d->scan);
    if (d->tok != NULL)
        json_tokener_free(d->tok);
    d->tok = NULL;
}

int srv_jdoc_parse(struct srv_jdoc *d, const char *text, size_t len, char *err, size_t err_len)
{
    srv_jdoc_release(d);
    if (len == 0) {
        snprintf(err, err_len, "empty body: expected a JSON document");
        return KVR_ECORRUPT;
    }
    if (len > (size_t)INT32_MAX) {
        snprintf(err, err_len, "body too large");
        return KVR_ECORRUPT;
    }
    int rc = kvr_json_scan(&d->scan, text, len, 0);
    if (rc == KVR_ECORRUPT) {
        snprintf(err, err_len, "invalid JSON at byte %zu: %s", d->scan.err_off,
                 d->scan.err != NULL ? d->scan.err : "syntax error");
        return KVR_ECORRUPT;
    }
    if (rc != KVR_OK)
        return rc;
    json_tokener_reset(d->tok);
    d->root =
        json_tokener_parse_ex(d->tok, text + d->scan.start, (int)(d->scan.end - d->scan.start));
    if (d->root == NULL) {
        enum json_tokener_error je = json_tokener_get_error(d->tok);
        if (je == json_tokener_success) /* the document is JSON null */
            return KVR_OK;
        snprintf(err, err_len, "invalid JSON: %s", json_tokener_error_desc(je));
        return KVR_ECORRUPT;
    }
    return KVR_OK;
}

int srv_jmember(struct json_object *obj, const char *key, struct json_object **v)
{
    if (obj == NULL || !json_object_is_type(obj, json_type_object))
        return 0;
    return json_object_object_get_ex(obj, key, v) ? 1 : 0;
}

/* Looks the member up; returns 1 with *v set when present and not null. */
static int member(struct json_object *obj, const struct kvr_json_path *p, int required,
                  struct json_object **v, int *present, int *rc, char *err, size_t err_len)
{
    *rc = KVR_OK;
    if (present != NULL)
        *present = 0;
    if (!srv_jmember(obj, p->key, v) || *v == NULL) {
        if (required)
            *rc = kvr_json_missing(err, err_len, p);
        return 0;
    }
    return 1;
}

int srv_jget_uint(const struct srv_jdoc *d, struct json_object *obj, const struct kvr_json_path *up,
                  const char *key, int required, uint64_t max, uint64_t *out, int *present,
                  char *err, size_t err_len)
{
    struct kvr_json_path p = {up, key, 0};
    struct json_object *v;
    int rc;
    if (!member(obj, &p, required, &v, present, &rc, err, err_len))
        return rc;
    rc = kvr_json_read_uint(v, max, &d->scan, &p, out, err, err_len);
    if (rc == KVR_OK && present != NULL)
        *present = 1;
    return rc;
}

int srv_jget_str(const struct srv_jdoc *d, struct json_object *obj, const struct kvr_json_path *up,
                 const char *key, int required, const char **out, size_t *len, int *present,
                 char *err, size_t err_len)
{
    struct kvr_json_path p = {up, key, 0};
    struct json_object *v;
    int rc;
    if (!member(obj, &p, required, &v, present, &rc, err, err_len))
        return rc;
    if (!json_object_is_type(v, json_type_string))
        return kvr_json_type_error(err, err_len, &d->scan, &p, "a string", v);
    *out = json_object_get_string(v);
    if (len != NULL)
        *len = (size_t)json_object_get_string_len(v);
    if (present != NULL)
        *present = 1;
    return KVR_OK;
}

int srv_jget_bool(const struct srv_jdoc *d, struct json_object *obj, const struct kvr_json_path *up,
                  const char *key, int *out, int *present, char *err, size_t err_len)
{
    struct kvr_json_path p = {up, key, 0};
    struct json_object *v;
    int rc;
    if (!member(obj, &p, 0, &v, present, &rc, err, err_len))
        return rc;
    if (!json_object_is_type(v, json_type_boolean))
        return kvr_json_type_error(err, err_len, &d->scan, &p, "a boolean", v);
    *out = json_object_get_boolean(v) ? 1 : 0;
    if (present != NULL)
        *present = 1;
    return KVR_OK;
}

int srv_jget_double(const struct srv_jdoc *d, struct json_object *obj,
                    const struct kvr_json_path *up, const char *key, double *out, int *present,
                    char *err, size_t err_len)
{
    struct kvr_json_path p = {up, key, 0};
    struct json_object *v;
    int rc;
    if (!member(obj, &p, 0, &v, present, &rc, err, err_len))
        return rc;
    if (!json_object_is_type(v, json_type_double) && !json_object_is_type(v, json_type_int))
        return kvr_json_type_error(err, err_len, &d->scan, &p, "a number", v);
    *out = json_object_get_double(v);
    if (present != NULL)
        *present = 1;
    return KVR_OK;
}

int srv_jread_hashes(const struct srv_jdoc *d, struct json_object *v, const struct kvr_json_path *p,
                     uint64_t *out, size_t cap, size_t *n, char *err, size_t err_len)
{
    *n = 0;
    if (v == NULL || !json_object_is_type(v, json_type_array))
        return kvr_json_type_error(err, err_len, &d->scan, p, "an array", v);
    size_t len = json_object_array_length(v);
    if (len > cap) {
        char path[128];
        kvr_json_path_format(p, path, sizeof(path));
        snprintf(err, err_len, "%s: more than %zu elements", path, cap);
        return KVR_ERANGE;
    }
    for (size_t k = 0; k < len; k++) {
        struct kvr_json_path e = {p, NULL, k};
        int rc = kvr_json_read_hash(json_object_array_get_idx(v, k), &d->scan, &e, &out[k], err,
                                    err_len);
        if (rc != KVR_OK)
            return rc;
    }
    *n = len;
    return KVR_OK;
}

int srv_jread_tokens(const struct srv_jdoc *d, struct json_object *v, const struct kvr_json_path *p,
                     uint32_t *out, size_t cap, size_t *n, char *err, size_t err_len)
{
    *n = 0;
    if (v == NULL || !json_object_is_type(v, json_type_array))
        return kvr_json_type_error(err, err_len, &d->scan, p, "an array", v);
    size_t len = json_object_array_length(v);
    if (len > cap) {
        char path[128];
        kvr_json_path_format(p, path, sizeof(path));
        snprintf(err, err_len, "%s: more than %zu elements", path, cap);
        return KVR_ERANGE;
    }
    for (size_t k = 0; k < len; k++) {
        struct kvr_json_path e = {p, NULL, k};
        uint64_t t;
        int rc = kvr_json_read_uint(json_object_array_get_idx(v, k), UINT32_MAX, &d->scan, &e, &t,
                                    err, err_len);
        if (rc != KVR_OK)
            return rc;
        out[k] = (uint32_t)t;
    }
    *n = len;
    return KVR_OK;
}
