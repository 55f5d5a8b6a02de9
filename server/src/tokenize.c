/* tokenize.c - bytes tokenizer, chat flattening, /tokenize answers (see tokenize.h). */
#include "tokenize.h"

#include <json-c/json.h>
#include <string.h>

#include "kvr/err.h"

size_t srv_tok_bytes(const char *text, size_t len, uint32_t chunk, uint32_t *out)
{
    size_t n = 0;
    const unsigned char *p = (const unsigned char *)text;
    for (size_t off = 0; off < len; off += chunk) {
        uint32_t v = 0;
        for (uint32_t k = 0; k < chunk && off + k < len; k++)
            v |= (uint32_t)p[off + k] << (8 * k);
        out[n++] = v;
    }
    return n;
}

static int append_content(struct json_object *content, struct kvr_buf *out)
{
    if (content == NULL)
        return KVR_OK;
    if (json_object_is_type(content, json_type_string))
        return kvr_buf_append(out, json_object_get_string(content),
                              (size_t)json_object_get_string_len(content));
    if (!json_object_is_type(content, json_type_array))
        return KVR_ECORRUPT;
    size_t n = json_object_array_length(content);
    for (size_t k = 0; k < n; k++) {
        struct json_object *part = json_object_array_get_idx(content, k), *text;
        if (part != NULL && json_object_is_type(part, json_type_object) &&
            json_object_object_get_ex(part, "text", &text) && text != NULL &&
            json_object_is_type(text, json_type_string)) {
            int rc = kvr_buf_append(out, json_object_get_string(text),
                                    (size_t)json_object_get_string_len(text));
            if (rc != KVR_OK)
                return rc;
        }
    }
    return KVR_OK;
}

int srv_tok_flatten_messages(struct json_object *messages, struct kvr_buf *out)
{
    if (messages == NULL || !json_object_is_type(messages, json_type_array))
        return KVR_ECORRUPT;
    size_t n = json_object_array_length(messages);
    for (size_t k = 0; k < n; k++) {
        struct json_object *msg = json_object_array_get_idx(messages, k), *role, *content;
        if (msg == NULL || !json_object_is_type(msg, json_type_object))
            return KVR_ECORRUPT;
        if (json_object_object_get_ex(msg, "role", &role) && role != NULL &&
            json_object_is_type(role, json_type_string)) {
            int rc = kvr_buf_append(out, json_object_get_string(role),
                                    (size_t)json_object_get_string_len(role));
            if (rc != KVR_OK)
                return rc;
        }
        if (kvr_buf_append_char(out, '\n') != KVR_OK)
            return KVR_ENOMEM;
        if (!json_object_object_get_ex(msg, "content", &content))
            content = NULL;
        int rc = append_content(content, out);
        if (rc != KVR_OK)
            return rc;
        if (kvr_buf_append_char(out, '\n') != KVR_OK)
            return KVR_ENOMEM;
    }
    return KVR_OK;
}

int srv_tok_parse_answer(const char *text, size_t len, uint32_t *out, size_t cap, size_t *n)
{
    *n = 0;
    struct json_tokener *tok = json_tokener_new();
    if (tok == NULL)
        return KVR_ENOMEM;
    struct json_object *root = json_tokener_parse_ex(tok, text, (int)len), *tokens;
    json_tokener_free(tok);
    int rc = KVR_ECORRUPT;
    if (root == NULL || !json_object_object_get_ex(root, "tokens", &tokens) || tokens == NULL ||
        !json_object_is_type(tokens, json_type_array))
        goto out;
    size_t m = json_object_array_length(tokens);
    if (m > cap) {
        rc = KVR_ERANGE;
        goto out;
    }
    for (size_t k = 0; k < m; k++) {
        struct json_object *v = json_object_array_get_idx(tokens, k);
        if (v == NULL || !json_object_is_type(v, json_type_int))
            goto out;
        int64_t x = json_object_get_int64(v);
        if (x < 0 || x > (int64_t)UINT32_MAX)
            goto out;
        out[k] = (uint32_t)x;
    }
    *n = m;
    rc = KVR_OK;
out:
    if (root != NULL)
        json_object_put(root);
    return rc;
}
