/* json_u64.c - validating pre-scan of JSON text and exact integer field readers
 * (see kvr/json_u64.h).
 *
 * Static helpers borrow every pointer they take and return nothing owned, unless their comment says
 * otherwise. */
#include "kvr/json_u64.h"

#include <json-c/json.h>

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "kvr/err.h"

/* ==== Paths ================================================================================== */

/* Collects the segments of p root-first into seg[]; returns their count, or SIZE_MAX if the
 * chain is deeper than the array (a caller bug: paths mirror JSON nesting). */
static size_t path_segments(const struct kvr_json_path *p, const struct kvr_json_path **seg,
                            size_t max)
{
    size_t n = 0;
    for (const struct kvr_json_path *q = p; q != NULL; q = q->up) {
        if (n == max)
            return SIZE_MAX;
        seg[n++] = q;
    }
    for (size_t i = 0; i < n / 2; i++) {
        const struct kvr_json_path *t = seg[i];
        seg[i] = seg[n - 1 - i];
        seg[n - 1 - i] = t;
    }
    return n;
}

/* Appends text to buf[0..len) at *pos (like snprintf: *pos counts what would be written). */
static void put_text(char *buf, size_t len, size_t *pos, const char *s, size_t n)
{
    if (*pos < len) {
        size_t room = len - *pos;
        memcpy(buf + *pos, s, n < room ? n : room);
    }
    *pos += n;
}

size_t kvr_json_path_format(const struct kvr_json_path *p, char *buf, size_t len)
{
    const struct kvr_json_path *seg[KVR_JSON_MAX_DEPTH + 8];
    size_t n = path_segments(p, seg, sizeof(seg) / sizeof(seg[0]));
    size_t pos = 0;
    if (n == SIZE_MAX) {
        put_text(buf, len, &pos, "(too deep)", 10);
        n = 0;
    }
    for (size_t i = 0; i < n; i++) {
        if (seg[i]->key != NULL) {
            if (i > 0)
                put_text(buf, len, &pos, ".", 1);
            put_text(buf, len, &pos, seg[i]->key, strlen(seg[i]->key));
        } else {
            char tmp[32];
            int k = snprintf(tmp, sizeof(tmp), "[%zu]", seg[i]->index);
            put_text(buf, len, &pos, tmp, (size_t)k);
        }
    }
    if (len > 0)
        buf[pos < len ? pos : len - 1] = '\0';
    return pos;
}

/* Whether path p renders exactly as the text s, compared segment by segment. */
static int path_equals(const struct kvr_json_path *p, const char *s)
{
    const struct kvr_json_path *seg[KVR_JSON_MAX_DEPTH + 8];
    size_t n = path_segments(p, seg, sizeof(seg) / sizeof(seg[0]));
    if (n == SIZE_MAX)
        return 0;
    for (size_t i = 0; i < n; i++) {
        if (seg[i]->key != NULL) {
            if (i > 0 && *s++ != '.')
                return 0;
            size_t k = strlen(seg[i]->key);
            if (strncmp(s, seg[i]->key, k) != 0)
                return 0;
            s += k;
        } else {
            char tmp[32];
            int k = snprintf(tmp, sizeof(tmp), "[%zu]", seg[i]->index);
            if (strncmp(s, tmp, (size_t)k) != 0)
                return 0;
            s += k;
        }
    }
    return *s == '\0';
}

/* ==== Pre-scan =============================================================================== */

/* One open container during a scan. */
struct frame {
    char kind;        /* '{' or '[' */
    char key_escaped; /* the current member name holds escapes */
    size_t index;     /* '[': index of the current element */
    size_t key_off;   /* '{': the current member name, raw (between the quotes) */
    size_t key_len;
};

/* Scanner states: what the next non-whitespace byte must be. */
enum state {
    ST_VALUE,          /* a value */
    ST_VALUE_OR_CLOSE, /* a value or ']' (just after '[') */
    ST_KEY_OR_CLOSE,   /* a member name or '}' (just after '{') */
    ST_KEY,            /* a member name (after ',') */
    ST_COLON,          /* ':' */
    ST_AFTER,          /* a value just ended: ',' / closer, or the end of the root */
};

static kvr_alloc_t *scan_alloc(struct kvr_json_scan *s)
{
    return s->a != NULL ? s->a : &s->own_;
}

void kvr_json_scan_init(struct kvr_json_scan *s, kvr_alloc_t *a)
{
    memset(s, 0, sizeof(*s));
    s->a = a;
    kvr_alloc_init(&s->own_);
}

static void clear_flaws(struct kvr_json_scan *s)
{
    for (size_t i = 0; i < s->n_flaws; i++)
        kvr_free(scan_alloc(s), s->flaws[i].path);
    s->n_flaws = 0;
}

void kvr_json_scan_free(struct kvr_json_scan *s)
{
    clear_flaws(s);
    kvr_free(scan_alloc(s), s->flaws);
    kvr_free(scan_alloc(s), s->elems);
    s->flaws = NULL;
    s->elems = NULL;
    s->cap_flaws_ = 0;
    s->cap_elems_ = 0;
    s->n_elems = 0;
}

/* Grows an array of `size`-byte items to hold one more; returns KVR_OK or KVR_ENOMEM. */
static int grow_array(kvr_alloc_t *a, void **arr, size_t *cap, size_t n, size_t size)
{
    if (n < *cap)
        return KVR_OK;
    size_t ncap = *cap ? *cap * 2 : 16;
    void *p = kvr_realloc(a, *arr, ncap * size);
    if (p == NULL)
        return KVR_ENOMEM;
    *arr = p;
    *cap = ncap;
    return KVR_OK;
}

static int hex_digit(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

/* Reads the 4 hex digits at s (validated by the scan). */
static unsigned hex4(const char *s)
{
    return (unsigned)(hex_digit(s[0]) << 12 | hex_digit(s[1]) << 8 | hex_digit(s[2]) << 4 |
                      hex_digit(s[3]));
}

/* Encodes code point cp as UTF-8 at out; returns the byte count (1..4). */
static size_t utf8_put(char *out, unsigned cp)
{
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | (cp >> 12));
        out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | (cp >> 18));
    out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    out[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

/* Decodes a validated member name (raw, escapes included) into out (room for len bytes: the
 * decoded form is never longer); returns its length. Lone surrogates become U+FFFD. */
static size_t unescape_key(const char *raw, size_t len, char *out)
{
    size_t o = 0;
    for (size_t i = 0; i < len;) {
        if (raw[i] != '\\') {
            out[o++] = raw[i++];
            continue;
        }
        char e = raw[i + 1];
        i += 2;
        switch (e) {
        case 'b':
            out[o++] = '\b';
            break;
        case 'f':
            out[o++] = '\f';
            break;
        case 'n':
            out[o++] = '\n';
            break;
        case 'r':
            out[o++] = '\r';
            break;
        case 't':
            out[o++] = '\t';
            break;
        case 'u': {
            unsigned cp = hex4(raw + i);
            i += 4;
            if (cp >= 0xD800 && cp < 0xDC00 && i + 6 <= len && raw[i] == '\\' &&
                raw[i + 1] == 'u') {
                unsigned lo = hex4(raw + i + 2);
                if (lo >= 0xDC00 && lo < 0xE000) {
                    cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                    i += 6;
                }
            }
            if (cp >= 0xD800 && cp < 0xE000)
                cp = 0xFFFD;
            o += utf8_put(out + o, cp);
            break;
        }
        default: /* '"', '\\', '/' */
            out[o++] = e;
            break;
        }
    }
    return o;
}

/* Records the integer token text[off, off+len) as a flaw at the current path. */
static int add_flaw(struct kvr_json_scan *s, const struct frame *fr, size_t depth, size_t off,
                    size_t len)
{
    kvr_alloc_t *a = scan_alloc(s);
    if (grow_array(a, (void **)&s->flaws, &s->cap_flaws_, s->n_flaws, sizeof(*s->flaws)) != KVR_OK)
        return KVR_ENOMEM;
    size_t need = 1;
    for (size_t i = 0; i < depth; i++)
        need += fr[i].kind == '{' ? fr[i].key_len + 1 : 24;
    char *path = kvr_malloc(a, need);
    if (path == NULL)
        return KVR_ENOMEM;
    size_t o = 0;
    for (size_t i = 0; i < depth; i++) {
        if (fr[i].kind == '{') {
            if (i > 0)
                path[o++] = '.';
            const char *raw = s->text + fr[i].key_off;
            if (fr[i].key_escaped) {
                o += unescape_key(raw, fr[i].key_len, path + o);
            } else {
                memcpy(path + o, raw, fr[i].key_len);
                o += fr[i].key_len;
            }
        } else {
            o += (size_t)snprintf(path + o, need - o, "[%zu]", fr[i].index);
        }
    }
    path[o] = '\0';
    s->flaws[s->n_flaws++] = (struct kvr_json_flaw){off, len, path};
    return KVR_OK;
}

static int is_digit(char c)
{
    return c >= '0' && c <= '9';
}

static int is_ws(char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

/* Scans a string starting at the opening quote text[*pos]; on success *pos is past the closing
 * quote and *escaped tells whether it held escapes. Returns NULL or an error description (with
 * *pos at the offending byte). */
static const char *scan_string(const char *t, size_t len, size_t *pos, char *escaped)
{
    size_t p = *pos + 1;
    *escaped = 0;
    while (p < len) {
        unsigned char c = (unsigned char)t[p];
        if (c == '"') {
            *pos = p + 1;
            return NULL;
        }
        if (c == '\\') {
            *escaped = 1;
            if (p + 1 >= len)
                break;
            char e = t[p + 1];
            if (e == 'u') {
                for (size_t k = 2; k < 6; k++) {
                    if (p + k >= len || hex_digit(t[p + k]) < 0) {
                        *pos = p + k < len ? p + k : len;
                        return "invalid \\u escape in a string";
                    }
                }
                p += 6;
            } else if (e == '"' || e == '\\' || e == '/' || e == 'b' || e == 'f' || e == 'n' ||
                       e == 'r' || e == 't') {
                p += 2;
            } else {
                *pos = p + 1;
                return "invalid escape in a string";
            }
            continue;
        }
        if (c < 0x20) {
            *pos = p;
            return "control character in a string";
        }
        p++;
    }
    *pos = len;
    return "unterminated string";
}

/* Whether the integer token (sign included) lies outside [-2^63, 2^64 - 1]. No leading zeros. */
static int integer_overflows(const char *tok, size_t len)
{
    if (tok[0] == '-') {
        static const char min_abs[] = "9223372036854775808";
        size_t d = len - 1;
        return d > sizeof(min_abs) - 1 ||
               (d == sizeof(min_abs) - 1 && memcmp(tok + 1, min_abs, d) > 0);
    }
    static const char max[] = "18446744073709551615";
    return len > sizeof(max) - 1 || (len == sizeof(max) - 1 && memcmp(tok, max, len) > 0);
}

/* Scans a number at text[*pos]; sets *is_int when it has no fraction and no exponent. */
static const char *scan_number(const char *t, size_t len, size_t *pos, int *is_int)
{
    size_t p = *pos;
    if (t[p] == '-')
        p++;
    if (p >= len || !is_digit(t[p])) {
        *pos = p;
        return "invalid number";
    }
    if (t[p] == '0') {
        p++;
        if (p < len && is_digit(t[p])) {
            *pos = p;
            return "leading zero in a number";
        }
    } else {
        while (p < len && is_digit(t[p]))
            p++;
    }
    *is_int = 1;
    if (p < len && t[p] == '.') {
        p++;
        if (p >= len || !is_digit(t[p])) {
            *pos = p;
            return "invalid number: digit expected after '.'";
        }
        while (p < len && is_digit(t[p]))
            p++;
        *is_int = 0;
    }
    if (p < len && (t[p] == 'e' || t[p] == 'E')) {
        p++;
        if (p < len && (t[p] == '+' || t[p] == '-'))
            p++;
        if (p >= len || !is_digit(t[p])) {
            *pos = p;
            return "invalid number: digit expected in the exponent";
        }
        while (p < len && is_digit(t[p]))
            p++;
        *is_int = 0;
    }
    *pos = p;
    return NULL;
}

static const char *scan_literal(const char *t, size_t len, size_t *pos)
{
    static const char *const words[] = {"true", "false", "null"};
    for (size_t i = 0; i < 3; i++) {
        size_t n = strlen(words[i]);
        if (t[*pos] == words[i][0]) {
            if (len - *pos >= n && memcmp(t + *pos, words[i], n) == 0) {
                *pos += n;
                return NULL;
            }
            return "invalid literal";
        }
    }
    return "unexpected character";
}

int kvr_json_scan(struct kvr_json_scan *s, const char *text, size_t len, unsigned flags)
{
    struct frame fr[KVR_JSON_MAX_DEPTH];
    size_t depth = 0;
    enum state st = ST_VALUE;
    size_t p = 0, elem_start = 0;
    const char *err = NULL;
    int record_elems = (flags & KVR_JSON_SCAN_ELEMENTS) != 0;

    clear_flaws(s);
    s->n_elems = 0;
    s->text = text;
    s->len = len;
    s->start = s->end = 0;
    s->root = 0;
    s->err = NULL;
    s->err_off = 0;

    while (p < len && is_ws(text[p]))
        p++;
    s->start = p;
    if (p == len) {
        err = len == 0 ? "empty input" : "no JSON value, only whitespace";
        goto fail;
    }
    s->root = text[p];

    for (;;) {
        while (p < len && is_ws(text[p]))
            p++;
        if (p == len && !(st == ST_AFTER && depth == 0)) {
            err = "unexpected end of input";
            goto fail;
        }
        char c = p < len ? text[p] : 0;
        switch (st) {
        case ST_VALUE_OR_CLOSE:
            if (c == ']') {
                p++;
                depth--;
                st = ST_AFTER;
                break;
            }
            st = ST_VALUE;
            /* fall through */
        case ST_VALUE: {
            if (record_elems && depth == 1 && fr[0].kind == '[')
                elem_start = p;
            if (c == '{' || c == '[') {
                if (depth == KVR_JSON_MAX_DEPTH) {
                    err = "nesting too deep";
                    goto fail;
                }
                fr[depth].kind = c;
                fr[depth].index = 0;
                fr[depth].key_off = fr[depth].key_len = 0;
                fr[depth].key_escaped = 0;
                depth++;
                p++;
                st = c == '{' ? ST_KEY_OR_CLOSE : ST_VALUE_OR_CLOSE;
                continue; /* the value ends when its container closes */
            }
            if (c == '"') {
                char esc;
                err = scan_string(text, len, &p, &esc);
            } else if (c == '-' || is_digit(c)) {
                size_t tok = p;
                int is_int = 0;
                err = scan_number(text, len, &p, &is_int);
                if (err == NULL && is_int && integer_overflows(text + tok, p - tok) &&
                    add_flaw(s, fr, depth, tok, p - tok) != KVR_OK)
                    return KVR_ENOMEM;
            } else {
                err = scan_literal(text, len, &p);
            }
            if (err != NULL)
                goto fail;
            st = ST_AFTER;
            break;
        }
        case ST_KEY_OR_CLOSE:
            if (c == '}') {
                p++;
                depth--;
                st = ST_AFTER;
                break;
            }
            /* fall through */
        case ST_KEY: {
            if (c != '"') {
                err = st == ST_KEY ? "member name expected" : "member name or '}' expected";
                goto fail;
            }
            size_t q = p;
            err = scan_string(text, len, &p, &fr[depth - 1].key_escaped);
            if (err != NULL)
                goto fail;
            fr[depth - 1].key_off = q + 1;
            fr[depth - 1].key_len = p - q - 2;
            st = ST_COLON;
            continue;
        }
        case ST_COLON:
            if (c != ':') {
                err = "':' expected";
                goto fail;
            }
            p++;
            st = ST_VALUE;
            continue;
        case ST_AFTER:
            if (depth == 0)
                goto done;
            if (fr[depth - 1].kind == '{') {
                if (c == ',') {
                    p++;
                    st = ST_KEY;
                } else if (c == '}') {
                    p++;
                    depth--;
                    break; /* a value (the object) ended */
                } else {
                    err = "',' or '}' expected";
                    goto fail;
                }
            } else {
                if (c == ',') {
                    p++;
                    fr[depth - 1].index++;
                    st = ST_VALUE;
                } else if (c == ']') {
                    p++;
                    depth--;
                    break;
                } else {
                    err = "',' or ']' expected";
                    goto fail;
                }
            }
            continue;
        }
        /* A value just ended at p: record a root array element, or finish the root value. */
        if (record_elems && depth == 1 && fr[0].kind == '[') {
            if (grow_array(scan_alloc(s), (void **)&s->elems, &s->cap_elems_, s->n_elems,
                           sizeof(*s->elems)) != KVR_OK)
                return KVR_ENOMEM;
            s->elems[s->n_elems++] = (struct kvr_json_span){elem_start, p - elem_start};
        }
        if (depth == 0)
            goto done;
    }

done:
    s->end = p;
    if (!(flags & KVR_JSON_SCAN_PREFIX)) {
        while (p < len && is_ws(text[p]))
            p++;
        if (p < len) {
            err = "unexpected data after the JSON value";
            goto fail;
        }
    }
    return KVR_OK;

fail:
    s->err = err;
    s->err_off = p;
    return KVR_ECORRUPT;
}

const struct kvr_json_flaw *kvr_json_scan_find(const struct kvr_json_scan *s,
                                               const struct kvr_json_path *p)
{
    if (s == NULL)
        return NULL;
    for (size_t i = 0; i < s->n_flaws; i++) {
        if (path_equals(p, s->flaws[i].path))
            return &s->flaws[i];
    }
    return NULL;
}

/* ==== Messages =============================================================================== */

/* Appends printable text to buf at *pos (bounded by len - 1). */
static void msg_put(char *buf, size_t len, size_t *pos, const char *s, size_t n)
{
    if (len == 0)
        return;
    size_t room = len - 1 - (*pos < len - 1 ? *pos : len - 1);
    if (n > room)
        n = room;
    memcpy(buf + *pos, s, n);
    *pos += n;
    buf[*pos] = '\0';
}

/* Quotes up to 32 bytes of s (non-printable bytes as '?'). */
static void msg_put_quoted(char *buf, size_t len, size_t *pos, const char *s, size_t n)
{
    char q[32 * 2 + 8];
    size_t o = 0;
    q[o++] = '"';
    for (size_t i = 0; i < n && i < 32; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\')
            q[o++] = '\\';
        q[o++] = (c < 0x20 || c == 0x7f) ? '?' : (char)c;
    }
    q[o++] = '"';
    if (n > 32) {
        memcpy(q + o, "...", 3);
        o += 3;
    }
    msg_put(buf, len, pos, q, o);
}

const char *kvr_json_describe(const struct json_object *v, char *buf, size_t len)
{
    size_t pos = 0;
    char tmp[48];
    if (len == 0)
        return buf;
    buf[0] = '\0';
    if (v == NULL) { /* json-c's null */
        msg_put(buf, len, &pos, "null", 4);
        return buf;
    }
    switch (json_object_get_type(v)) {
    case json_type_null:
        msg_put(buf, len, &pos, "null", 4);
        break;
    case json_type_boolean:
        if (json_object_get_boolean(v))
            msg_put(buf, len, &pos, "true", 4);
        else
            msg_put(buf, len, &pos, "false", 5);
        break;
    case json_type_double: {
        /* json-c keeps a parsed double's own text; get_string is not const-qualified. */
        const char *t = json_object_get_string((struct json_object *)v);
        msg_put(buf, len, &pos, t, strlen(t));
        break;
    }
    case json_type_int: {
        int64_t i = json_object_get_int64(v);
        int k = i < 0 ? snprintf(tmp, sizeof(tmp), "%" PRId64, i)
                      : snprintf(tmp, sizeof(tmp), "%" PRIu64, json_object_get_uint64(v));
        msg_put(buf, len, &pos, tmp, (size_t)k);
        break;
    }
    case json_type_string: {
        msg_put(buf, len, &pos, "the string ", 11);
        msg_put_quoted(buf, len, &pos, json_object_get_string((struct json_object *)v),
                       (size_t)json_object_get_string_len(v));
        break;
    }
    case json_type_object:
        msg_put(buf, len, &pos, "an object", 9);
        break;
    case json_type_array:
        msg_put(buf, len, &pos, "an array", 8);
        break;
    }
    return buf;
}

/* Writes "<path>: " (nothing at the root) into err; returns the position after it. */
static size_t msg_path(char *err, size_t err_len, const struct kvr_json_path *p)
{
    size_t pos = 0;
    if (err_len == 0)
        return 0;
    err[0] = '\0';
    if (p == NULL)
        return 0;
    size_t n = kvr_json_path_format(p, err, err_len);
    pos = n < err_len ? n : err_len - 1;
    msg_put(err, err_len, &pos, ": ", 2);
    return pos;
}

/* "<path>: expected <expected>, got <got>"; got may be a token (flaw) or a description. */
static int fail_with(char *err, size_t err_len, const struct kvr_json_path *p, const char *expected,
                     const char *got, size_t got_len)
{
    if (err == NULL || err_len == 0)
        return KVR_ECORRUPT;
    size_t pos = msg_path(err, err_len, p);
    msg_put(err, err_len, &pos, "expected ", 9);
    msg_put(err, err_len, &pos, expected, strlen(expected));
    msg_put(err, err_len, &pos, ", got ", 6);
    msg_put(err, err_len, &pos, got, got_len);
    return KVR_ECORRUPT;
}

/* Fails on v, quoting the original token when the scan flagged v's path (a clamped overflow). */
static int fail_value(char *err, size_t err_len, const struct kvr_json_scan *s,
                      const struct kvr_json_path *p, const char *expected,
                      const struct json_object *v)
{
    if (err == NULL || err_len == 0)
        return KVR_ECORRUPT;
    if (v != NULL && json_object_get_type(v) == json_type_int) {
        const struct kvr_json_flaw *f = kvr_json_scan_find(s, p);
        if (f != NULL) {
            char got[96];
            int k = snprintf(got, sizeof(got), "%.*s%s (out of range)",
                             (int)(f->len > 48 ? 48 : f->len), s->text + f->off,
                             f->len > 48 ? "..." : "");
            return fail_with(err, err_len, p, expected, got, (size_t)k);
        }
    }
    char got[80];
    kvr_json_describe(v, got, sizeof(got));
    return fail_with(err, err_len, p, expected, got, strlen(got));
}

int kvr_json_missing(char *err, size_t err_len, const struct kvr_json_path *p)
{
    if (err == NULL || err_len == 0)
        return KVR_ECORRUPT;
    size_t pos = msg_path(err, err_len, p);
    msg_put(err, err_len, &pos, "missing", 7);
    return KVR_ECORRUPT;
}

int kvr_json_type_error(char *err, size_t err_len, const struct kvr_json_scan *s,
                        const struct kvr_json_path *p, const char *expected,
                        const struct json_object *v)
{
    return fail_value(err, err_len, s, p, expected, v);
}

/* ==== Field readers ========================================================================== */

/* Whether an integer value is a clamped overflow: only the clamp values can be, and only if the
 * scan recorded a flaw at this very path. */
static int is_clamped(const struct kvr_json_scan *s, const struct kvr_json_path *p,
                      const struct json_object *v)
{
    if (s == NULL || s->n_flaws == 0)
        return 0;
    int64_t i = json_object_get_int64(v);
    if (i != INT64_MIN && (i < 0 || json_object_get_uint64(v) != UINT64_MAX))
        return 0;
    return kvr_json_scan_find(s, p) != NULL;
}

int kvr_json_read_hash(const struct json_object *v, const struct kvr_json_scan *s,
                       const struct kvr_json_path *p, uint64_t *out, char *err, size_t err_len)
{
    static const char expected[] = "an unsigned 64-bit integer";
    if (v == NULL || json_object_get_type(v) != json_type_int)
        return fail_value(err, err_len, s, p, expected, v);
    int64_t i = json_object_get_int64(v);
    uint64_t u = i < 0 ? (uint64_t)i : json_object_get_uint64(v);
    if (is_clamped(s, p, v))
        return fail_value(err, err_len, s, p, expected, v);
    *out = u; /* negative: its two's-complement bits */
    return KVR_OK;
}

int kvr_json_read_uint(const struct json_object *v, uint64_t max, const struct kvr_json_scan *s,
                       const struct kvr_json_path *p, uint64_t *out, char *err, size_t err_len)
{
    char expected[64];
    if (max == UINT64_MAX)
        snprintf(expected, sizeof(expected), "an unsigned 64-bit integer");
    else if (max == UINT32_MAX)
        snprintf(expected, sizeof(expected), "an unsigned 32-bit integer");
    else
        snprintf(expected, sizeof(expected), "an integer in [0, %" PRIu64 "]", max);
    if (v == NULL || json_object_get_type(v) != json_type_int)
        return fail_value(err, err_len, s, p, expected, v);
    int64_t i = json_object_get_int64(v);
    if (i < 0)
        return fail_value(err, err_len, s, p, expected, v);
    uint64_t u = json_object_get_uint64(v);
    if (is_clamped(s, p, v) || u > max)
        return fail_value(err, err_len, s, p, expected, v);
    *out = u;
    return KVR_OK;
}
