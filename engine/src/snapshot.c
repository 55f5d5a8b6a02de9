/* snapshot.c - checksummed binary snapshots of indexes (see kvr/snapshot.h). */
#include "kvr/snapshot.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "kvr/err.h"

#define MAGIC "KVRSNAP1"
#define BOM 0x01020304u
#define HEADER_BYTES 32u
#define SECTION_HEADER 16u
#define EVENT_HEADER 32u
#define SECTION_INDEX 1u
#define MAX_EVENT_BLOCKS (1u << 24)

__attribute__((format(printf, 3, 4))) static int fail(char *err, size_t len, const char *fmt, ...)
{
    if (err != NULL && len > 0) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, len, fmt, ap);
        va_end(ap);
    }
    return KVR_ECORRUPT;
}

/* ==== little-endian helpers ================================================================= */

static void put_u16(unsigned char *p, uint16_t v)
{
    p[0] = (unsigned char)v;
    p[1] = (unsigned char)(v >> 8);
}

static void put_u32(unsigned char *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

static void put_u64(unsigned char *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

static uint16_t get_u16(const unsigned char *p)
{
    return (uint16_t)(p[0] | (p[1] << 8));
}

static uint32_t get_u32(const unsigned char *p)
{
    uint32_t v = 0;
    for (int i = 3; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

static uint64_t get_u64(const unsigned char *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

/* Reserves n bytes at the end of out and returns them (NULL on ENOMEM). */
static unsigned char *grab(struct kvr_buf *out, size_t n)
{
    if (kvr_buf_reserve(out, n) != KVR_OK)
        return NULL;
    unsigned char *p = (unsigned char *)kvr_buf_tail(out);
    memset(p, 0, n);
    kvr_buf_commit(out, n);
    return p;
}

/* ==== encode ================================================================================ */

static int encode_index(const struct kvr_snapshot_index *ix, struct kvr_buf *out, char *err,
                        size_t err_len)
{
    size_t name_len = strlen(ix->name);
    if (name_len > KVR_SNAPSHOT_MAX_NAME) {
        snprintf(err, err_len, "index name longer than %u bytes", KVR_SNAPSHOT_MAX_NAME);
        return KVR_EINVAL;
    }
    struct kvr_event_list l;
    kvr_event_list_init(&l);
    /* A dump reads in chunks while writers go on (kvr/index.h): prefer an exact cut, trying a
     * few times; under a steady stream of events the last, fuzzy, dump is written (it holds only
     * blocks held at some point during the dump: as stale as any snapshot, never invented). */
    struct kvr_index_dump_info info = {0, 0};
    int rc = KVR_OK;
    for (int attempt = 0; attempt < 3; attempt++) {
        kvr_event_list_reset(&l);
        rc = kvr_index_dump_ex(ix->index, &l, &info);
        if (rc != KVR_OK || info.exact)
            break;
    }
    if (rc != KVR_OK) {
        kvr_event_list_free(&l);
        snprintf(err, err_len, "dumping index %s: %s", ix->name, kvr_strerror(rc));
        return rc;
    }
    size_t start = out->len;
    unsigned char *sh = grab(out, SECTION_HEADER);
    unsigned char *ph = sh ? grab(out, 2 + name_len + 2 + 4 + 4 + 8) : NULL;
    if (ph == NULL)
        goto nomem;
    sh = (unsigned char *)out->data + start; /* grab may have moved the buffer */
    put_u32(sh, SECTION_INDEX);
    put_u16(ph, (uint16_t)name_len);
    memcpy(ph + 2, ix->name, name_len);
    put_u32(ph + 2 + name_len + 2, ix->block_size);
    put_u64(ph + 2 + name_len + 2 + 4 + 4, l.n);
    for (size_t i = 0; i < l.n; i++) {
        const struct kvr_event *e = &l.ev[i];
        unsigned char *p = grab(out, EVENT_HEADER + (size_t)e->n * 16u);
        if (p == NULL)
            goto nomem;
        put_u64(p, e->worker_id);
        put_u64(p + 8, e->has_parent ? e->parent_hash : 0);
        put_u32(p + 16, e->dp_rank);
        p[20] = e->has_parent ? 1 : 0;
        put_u32(p + 24, e->n);
        for (uint32_t j = 0; j < e->n; j++) {
            put_u64(p + EVENT_HEADER + 16u * j, e->blocks[j].block_hash);
            put_u64(p + EVENT_HEADER + 16u * j + 8, e->blocks[j].tokens_hash);
        }
    }
    put_u64((unsigned char *)out->data + start + 8, out->len - start - SECTION_HEADER);
    kvr_event_list_free(&l);
    return KVR_OK;
nomem:
    kvr_event_list_free(&l);
    snprintf(err, err_len, "out of memory encoding index %s", ix->name);
    return KVR_ENOMEM;
}

int kvr_snapshot_encode(const struct kvr_snapshot_index *ix, size_t n, uint64_t now_ms,
                        struct kvr_buf *out, char *err, size_t err_len)
{
    size_t start = out->len;
    unsigned char *h = grab(out, HEADER_BYTES);
    if (h == NULL || n > UINT32_MAX) {
        snprintf(err, err_len, "out of memory");
        return KVR_ENOMEM;
    }
    memcpy(h, MAGIC, 8);
    put_u32(h + 8, KVR_SNAPSHOT_VERSION);
    put_u32(h + 12, BOM);
    put_u64(h + 16, now_ms);
    put_u32(h + 24, (uint32_t)n);
    for (size_t i = 0; i < n; i++) {
        int rc = encode_index(&ix[i], out, err, err_len);
        if (rc != KVR_OK) {
            kvr_buf_truncate(out, start);
            return rc;
        }
    }
    uint64_t sum = XXH3_64bits(out->data + start, out->len - start);
    unsigned char *t = grab(out, 8);
    if (t == NULL) {
        kvr_buf_truncate(out, start);
        snprintf(err, err_len, "out of memory");
        return KVR_ENOMEM;
    }
    put_u64(t, sum);
    return KVR_OK;
}

static int write_all(int fd, const char *p, size_t n)
{
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w == -1) {
            if (errno == EINTR)
                continue;
            return -1;
        }
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

int kvr_snapshot_write_atomic(const char *path, const void *data, size_t len, char *err,
                              size_t err_len)
{
    char tmp[4096], dir[4096];
    int fd = -1, created = 0, rc;
    if ((size_t)snprintf(tmp, sizeof(tmp), "%s" KVR_SNAPSHOT_TMP_INFIX "%ld", path,
                         (long)getpid()) >= sizeof(tmp)) {
        snprintf(err, err_len, "snapshot path too long");
        return KVR_EINVAL;
    }
    rc = KVR_EIO;
    fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd == -1) {
        snprintf(err, err_len, "creating %s: %s", tmp, strerror(errno));
        goto out;
    }
    created = 1;
    if (write_all(fd, data, len) == -1 || fsync(fd) == -1) {
        snprintf(err, err_len, "writing %s: %s", tmp, strerror(errno));
        goto out;
    }
    int crc = close(fd);
    fd = -1;
    if (crc == -1) {
        snprintf(err, err_len, "closing %s: %s", tmp, strerror(errno));
        goto out;
    }
    if (rename(tmp, path) == -1) {
        snprintf(err, err_len, "renaming %s to %s: %s", tmp, path, strerror(errno));
        goto out;
    }
    created = 0;
    /* Make the rename durable: fsync the directory (best effort). */
    snprintf(dir, sizeof(dir), "%s", path);
    char *slash = strrchr(dir, '/');
    if (slash == NULL)
        snprintf(dir, sizeof(dir), ".");
    else if (slash == dir)
        dir[1] = '\0';
    else
        *slash = '\0';
    int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd != -1) {
        (void)fsync(dfd);
        close(dfd);
    }
    rc = KVR_OK;
out:
    if (fd != -1)
        close(fd);
    if (created)
        unlink(tmp);
    return rc;
}

int kvr_snapshot_write_file(const char *path, const struct kvr_snapshot_index *ix, size_t n,
                            uint64_t now_ms, char *err, size_t err_len)
{
    struct kvr_buf b;
    kvr_buf_init(&b, NULL);
    int rc = kvr_snapshot_encode(ix, n, now_ms, &b, err, err_len);
    if (rc == KVR_OK)
        rc = kvr_snapshot_write_atomic(path, b.data, b.len, err, err_len);
    kvr_buf_free(&b);
    return rc;
}

/* ==== decode ================================================================================ */

struct cursor {
    const unsigned char *p;
    size_t left;
};

/* Walks one index section (payload [p, p+len)). With out == NULL only validates; else decodes
 * the events into out. */
static int walk_index(const unsigned char *p, size_t len, size_t sec, struct kvr_event_list *out,
                      const char **name, size_t *name_len, uint32_t *block_size, char *err,
                      size_t err_len)
{
    if (len < 2)
        return fail(err, err_len, "section %zu: truncated name", sec);
    size_t nl = get_u16(p);
    if (nl == 0 || nl > KVR_SNAPSHOT_MAX_NAME || len < 2 + nl + 2 + 4 + 4 + 8)
        return fail(err, err_len, "section %zu: bad name length %zu", sec, nl);
    *name = (const char *)p + 2;
    *name_len = nl;
    const unsigned char *q = p + 2 + nl;
    if (get_u16(q) != 0 || get_u32(q + 6) != 0)
        return fail(err, err_len, "section %zu: reserved fields not zero", sec);
    *block_size = get_u32(q + 2);
    if (*block_size == 0)
        return fail(err, err_len, "section %zu: block size 0", sec);
    uint64_t nev = get_u64(q + 10);
    struct cursor c = {.p = q + 18, .left = len - (2 + nl + 18)};
    if (nev > c.left / EVENT_HEADER)
        return fail(err, err_len, "section %zu: %llu events cannot fit in %zu bytes", sec,
                    (unsigned long long)nev, c.left);
    for (uint64_t i = 0; i < nev; i++) {
        if (c.left < EVENT_HEADER)
            return fail(err, err_len, "section %zu event %llu: truncated", sec,
                        (unsigned long long)i);
        const unsigned char *e = c.p;
        uint8_t has_parent = e[20];
        uint32_t n = get_u32(e + 24);
        if (has_parent > 1 || e[21] != 0 || get_u16(e + 22) != 0 || get_u32(e + 28) != 0)
            return fail(err, err_len, "section %zu event %llu: bad flags", sec,
                        (unsigned long long)i);
        if (!has_parent && get_u64(e + 8) != 0)
            return fail(err, err_len, "section %zu event %llu: parent hash without parent", sec,
                        (unsigned long long)i);
        if (n == 0 || n > MAX_EVENT_BLOCKS || (size_t)n > (c.left - EVENT_HEADER) / 16u)
            return fail(err, err_len, "section %zu event %llu: bad block count %u", sec,
                        (unsigned long long)i, n);
        if (out != NULL) {
            struct kvr_event *ev;
            if (kvr_event_list_emplace(out, KVR_EVENT_STORED, n, &ev) != KVR_OK)
                return KVR_ENOMEM;
            ev->worker_id = get_u64(e);
            ev->parent_hash = get_u64(e + 8);
            ev->dp_rank = get_u32(e + 16);
            ev->has_parent = has_parent;
            ev->event_id = i;
            ev->tier = KVR_TIER_DEVICE;
            for (uint32_t j = 0; j < n; j++) {
                ev->blocks[j].block_hash = get_u64(e + EVENT_HEADER + 16u * j);
                ev->blocks[j].tokens_hash = get_u64(e + EVENT_HEADER + 16u * j + 8);
            }
        }
        size_t used = EVENT_HEADER + (size_t)n * 16u;
        c.p += used;
        c.left -= used;
    }
    if (c.left != 0)
        return fail(err, err_len, "section %zu: %zu trailing bytes", sec, c.left);
    return KVR_OK;
}

/* Walks every section; with cb == NULL only validates. */
static int walk(const unsigned char *d, size_t len, uint32_t nsec, kvr_snapshot_index_cb cb,
                void *ctx, char *err, size_t err_len)
{
    struct cursor c = {.p = d + HEADER_BYTES, .left = len - HEADER_BYTES - 8};
    for (uint32_t s = 0; s < nsec; s++) {
        if (c.left < SECTION_HEADER)
            return fail(err, err_len, "section %u: truncated header", s);
        uint32_t kind = get_u32(c.p);
        uint64_t plen = get_u64(c.p + 8);
        if (kind != SECTION_INDEX || get_u32(c.p + 4) != 0)
            return fail(err, err_len, "section %u: unknown kind %u", s, kind);
        if (plen > c.left - SECTION_HEADER)
            return fail(err, err_len, "section %u: length %llu beyond the file", s,
                        (unsigned long long)plen);
        const char *name;
        size_t name_len;
        uint32_t bs;
        if (cb == NULL) {
            int rc = walk_index(c.p + SECTION_HEADER, (size_t)plen, s, NULL, &name, &name_len, &bs,
                                err, err_len);
            if (rc != KVR_OK)
                return rc;
        } else {
            struct kvr_event_list l;
            kvr_event_list_init(&l);
            int rc = walk_index(c.p + SECTION_HEADER, (size_t)plen, s, &l, &name, &name_len, &bs,
                                err, err_len);
            if (rc == KVR_OK)
                rc = cb(ctx, name, name_len, bs, &l);
            kvr_event_list_free(&l);
            if (rc != KVR_OK)
                return rc;
        }
        c.p += SECTION_HEADER + plen;
        c.left -= SECTION_HEADER + (size_t)plen;
    }
    if (c.left != 0)
        return fail(err, err_len, "%zu bytes after the last section", c.left);
    return KVR_OK;
}

int kvr_snapshot_decode(const void *data, size_t len, kvr_snapshot_index_cb cb, void *ctx,
                        uint64_t *created_ms, char *err, size_t err_len)
{
    const unsigned char *d = data;
    if (len < HEADER_BYTES + 8)
        return fail(err, err_len, "truncated: %zu bytes is shorter than a header", len);
    if (memcmp(d, MAGIC, 8) != 0)
        return fail(err, err_len, "not a kvrouter snapshot (bad magic)");
    if (get_u32(d + 8) != KVR_SNAPSHOT_VERSION)
        return fail(err, err_len, "unsupported snapshot version %u (this build reads %u)",
                    get_u32(d + 8), KVR_SNAPSHOT_VERSION);
    if (get_u32(d + 12) != BOM)
        return fail(err, err_len, "bad byte-order mark");
    if (XXH3_64bits(d, len - 8) != get_u64(d + len - 8))
        return fail(err, err_len, "checksum mismatch (corrupt or truncated file)");
    if (get_u32(d + 28) != 0)
        return fail(err, err_len, "unknown header flags");
    uint32_t nsec = get_u32(d + 24);
    int rc = walk(d, len, nsec, NULL, NULL, err, err_len);
    if (rc != KVR_OK)
        return rc;
    if (created_ms != NULL)
        *created_ms = get_u64(d + 16);
    return cb != NULL ? walk(d, len, nsec, cb, ctx, err, err_len) : KVR_OK;
}

int kvr_snapshot_read_file(const char *path, size_t max_bytes, kvr_snapshot_index_cb cb, void *ctx,
                           uint64_t *created_ms, char *err, size_t err_len)
{
    struct stat st;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd == -1) {
        int e = errno;
        snprintf(err, err_len, "opening %s: %s", path, strerror(e));
        return e == ENOENT ? KVR_ENOTFOUND : KVR_EIO;
    }
    if (max_bytes == 0)
        max_bytes = (size_t)16 << 30;
    if (fstat(fd, &st) == -1 || st.st_size < 0 || (uint64_t)st.st_size > max_bytes) {
        snprintf(err, err_len, "%s: unreadable or larger than %zu bytes", path, max_bytes);
        close(fd);
        return KVR_EIO;
    }
    size_t len = (size_t)st.st_size;
    unsigned char *d = malloc(len ? len : 1);
    if (d == NULL) {
        close(fd);
        snprintf(err, err_len, "out of memory reading %s", path);
        return KVR_ENOMEM;
    }
    size_t got = 0;
    while (got < len) {
        ssize_t r = read(fd, d + got, len - got);
        if (r == -1 && errno == EINTR)
            continue;
        if (r <= 0)
            break;
        got += (size_t)r;
    }
    close(fd);
    int rc = got == len ? kvr_snapshot_decode(d, len, cb, ctx, created_ms, err, err_len)
                        : fail(err, err_len, "%s: short read", path);
    free(d);
    return rc;
}
