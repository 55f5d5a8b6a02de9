/* test_snapshot.c - snapshot files: round trips, atomic replacement, and refusal of truncated,
 * bit-flipped, wrong-version and crafted inputs (no callback ever runs for a bad file). */
#include <check.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "kvr/err.h"
#include "kvr/snapshot.h"
#include "refmodel.h"

struct loaded {
    int calls;
    char names[4][64];
    uint32_t bs[4];
    kvr_index_t *idx[4];
};

static int on_index(void *ctx, const char *name, size_t name_len, uint32_t block_size,
                    const struct kvr_event_list *events)
{
    struct loaded *l = ctx;
    if (l->calls >= 4)
        return KVR_ERANGE;
    int k = l->calls++;
    snprintf(l->names[k], sizeof(l->names[k]), "%.*s", (int)name_len, name);
    l->bs[k] = block_size;
    ck_assert_int_eq(kvr_index_new(NULL, &l->idx[k]), KVR_OK);
    for (size_t i = 0; i < events->n; i++)
        ck_assert_int_eq(kvr_index_apply(l->idx[k], &events->ev[i]), KVR_OK);
    return KVR_OK;
}

static void loaded_free(struct loaded *l)
{
    for (int i = 0; i < l->calls; i++)
        kvr_index_free(l->idx[i]);
    memset(l, 0, sizeof(*l));
}

/* Builds an index from a random stream (seed). */
static kvr_index_t *random_index(uint64_t seed, struct gen **gout)
{
    kvr_index_t *idx;
    struct gen *g = gen_new(seed, (int)(seed % 2));
    ck_assert_int_eq(kvr_index_new(NULL, &idx), KVR_OK);
    for (int i = 0; i < 600; i++) {
        struct gen_op op;
        gen_next(g, &op);
        if (op.kind == GEN_EVENT)
            (void)kvr_index_apply(idx, &op.ev);
        else if (op.kind == GEN_REMOVE_WORKER)
            (void)kvr_index_remove_worker(idx, op.worker_id);
        else
            (void)kvr_index_remove_rank(idx, op.worker_id, op.dp_rank);
    }
    *gout = g;
    return idx;
}

static void same_answers(struct gen *g, kvr_index_t *a, kvr_index_t *b)
{
    for (size_t d = 0; d < gen_ndocs(g); d++) {
        size_t n, na, nb;
        const uint64_t *q = gen_doc(g, d, &n);
        struct kvr_match ma[64], mb[64];
        ck_assert_int_eq(kvr_index_find_matches(a, q, n, 0, ma, 64, &na), KVR_OK);
        ck_assert_int_eq(kvr_index_find_matches(b, q, n, 0, mb, 64, &nb), KVR_OK);
        ck_assert_uint_eq(na, nb);
        for (size_t i = 0; i < na; i++) {
            int found = 0;
            for (size_t j = 0; j < nb; j++)
                found |= ma[i].worker_id == mb[j].worker_id && ma[i].dp_rank == mb[j].dp_rank &&
                         ma[i].blocks == mb[j].blocks;
            ck_assert(found);
        }
    }
}

START_TEST(round_trip_two_indexes)
{
    struct gen *g1, *g2;
    kvr_index_t *a = random_index(11, &g1), *b = random_index(12, &g2);
    struct kvr_snapshot_index ix[2] = {{"llama:default", 16, a}, {"qwen:tenant-a", 64, b}};
    struct kvr_buf buf;
    char err[256];
    kvr_buf_init(&buf, NULL);
    ck_assert_int_eq(kvr_snapshot_encode(ix, 2, 1234, &buf, err, sizeof(err)), KVR_OK);
    struct loaded l = {0};
    uint64_t created = 0;
    ck_assert_int_eq(
        kvr_snapshot_decode(buf.data, buf.len, on_index, &l, &created, err, sizeof(err)), KVR_OK);
    ck_assert_uint_eq(created, 1234);
    ck_assert_int_eq(l.calls, 2);
    ck_assert_str_eq(l.names[0], "llama:default");
    ck_assert_str_eq(l.names[1], "qwen:tenant-a");
    ck_assert_uint_eq(l.bs[0], 16);
    ck_assert_uint_eq(l.bs[1], 64);
    same_answers(g1, a, l.idx[0]);
    same_answers(g2, b, l.idx[1]);
    /* A dump is canonical once replayed: snapshot -> load -> snapshot -> load -> snapshot
     * gives the same bytes the second time (the first replay may merge chains). */
    struct kvr_buf again, again2;
    struct loaded l2 = {0};
    kvr_buf_init(&again, NULL);
    kvr_buf_init(&again2, NULL);
    struct kvr_snapshot_index ix2[2] = {{"llama:default", 16, l.idx[0]},
                                        {"qwen:tenant-a", 64, l.idx[1]}};
    ck_assert_int_eq(kvr_snapshot_encode(ix2, 2, 1234, &again, err, sizeof(err)), KVR_OK);
    ck_assert_int_eq(
        kvr_snapshot_decode(again.data, again.len, on_index, &l2, NULL, err, sizeof(err)), KVR_OK);
    struct kvr_snapshot_index ix3[2] = {{"llama:default", 16, l2.idx[0]},
                                        {"qwen:tenant-a", 64, l2.idx[1]}};
    ck_assert_int_eq(kvr_snapshot_encode(ix3, 2, 1234, &again2, err, sizeof(err)), KVR_OK);
    ck_assert_uint_eq(again.len, again2.len);
    ck_assert(memcmp(again.data, again2.data, again.len) == 0);
    same_answers(g1, a, l2.idx[0]);
    kvr_buf_free(&again);
    kvr_buf_free(&again2);
    loaded_free(&l2);
    loaded_free(&l);
    kvr_buf_free(&buf);
    kvr_index_free(a);
    kvr_index_free(b);
    gen_free(g1);
    gen_free(g2);
}
END_TEST

START_TEST(every_truncation_and_bit_flip_refused)
{
    struct gen *g;
    kvr_index_t *a = random_index(21, &g);
    struct kvr_snapshot_index ix = {"m:t", 16, a};
    struct kvr_buf buf;
    char err[256];
    kvr_buf_init(&buf, NULL);
    ck_assert_int_eq(kvr_snapshot_encode(&ix, 1, 5, &buf, err, sizeof(err)), KVR_OK);
    struct loaded l = {0};
    for (size_t len = 0; len < buf.len; len++) {
        ck_assert_int_eq(kvr_snapshot_decode(buf.data, len, on_index, &l, NULL, err, sizeof(err)),
                         KVR_ECORRUPT);
        ck_assert_int_eq(l.calls, 0);
    }
    unsigned char *copy = malloc(buf.len);
    size_t step = buf.len > 4000 ? buf.len / 4000 : 1;
    for (size_t i = 0; i < buf.len; i += step) {
        memcpy(copy, buf.data, buf.len);
        copy[i] ^= (unsigned char)(1u << (i % 8));
        ck_assert_int_eq(kvr_snapshot_decode(copy, buf.len, on_index, &l, NULL, err, sizeof(err)),
                         KVR_ECORRUPT);
        ck_assert_int_eq(l.calls, 0);
    }
    /* Wrong version with a recomputed checksum: refused by the version check. */
    memcpy(copy, buf.data, buf.len);
    copy[8] = 2;
    uint64_t sum = XXH3_64bits(copy, buf.len - 8);
    for (int k = 0; k < 8; k++)
        copy[buf.len - 8 + k] = (unsigned char)(sum >> (8 * k));
    ck_assert_int_eq(kvr_snapshot_decode(copy, buf.len, on_index, &l, NULL, err, sizeof(err)),
                     KVR_ECORRUPT);
    ck_assert_ptr_nonnull(strstr(err, "version"));
    free(copy);
    kvr_buf_free(&buf);
    kvr_index_free(a);
    gen_free(g);
}
END_TEST

/* Crafted files with a valid checksum but a lying structure. */
static int decode_crafted(unsigned char *d, size_t len, char *err, size_t err_len)
{
    uint64_t sum = XXH3_64bits(d, len - 8);
    for (int k = 0; k < 8; k++)
        d[len - 8 + k] = (unsigned char)(sum >> (8 * k));
    struct loaded l = {0};
    int rc = kvr_snapshot_decode(d, len, on_index, &l, NULL, err, err_len);
    ck_assert_int_eq(l.calls, 0);
    return rc;
}

START_TEST(crafted_structures_refused)
{
    kvr_index_t *a;
    ck_assert_int_eq(kvr_index_new(NULL, &a), KVR_OK);
    struct kvr_block b[2] = {{.block_hash = 7, .tokens_hash = 8},
                             {.block_hash = 9, .tokens_hash = 10}};
    struct kvr_event ev = {.worker_id = 1, .kind = KVR_EVENT_STORED, .n = 2, .blocks = b};
    ck_assert_int_eq(kvr_index_apply(a, &ev), KVR_OK);
    struct kvr_snapshot_index ix = {"m", 16, a};
    struct kvr_buf buf;
    char err[256];
    kvr_buf_init(&buf, NULL);
    ck_assert_int_eq(kvr_snapshot_encode(&ix, 1, 0, &buf, err, sizeof(err)), KVR_OK);
    unsigned char *d = malloc(buf.len);
    /* Offsets: header 32, section header 16, name length 2 + "m" 1 + 2 + block size 4 + 4, then
     * the event count at 32 + 16 + 13 = 61, the first event at 69 (block count at 69 + 24). */
    const size_t sections = 24, plen = 32 + 8, nev = 61, bcount = 69 + 24, bsize = 32 + 16 + 5;
    struct {
        size_t off;
        unsigned char val;
        const char *expect;
    } cases[] = {
        {sections, 2, "section 1"},          /* one more section than present */
        {plen + 7, 0x10, "beyond the file"}, /* huge payload length */
        {nev + 7, 0x01, "cannot fit"},       /* huge event count */
        {bcount, 0xff, "bad block count"},   /* block count beyond the payload */
        {bcount, 0, "bad block count"},      /* empty store */
        {bsize, 0, "block size 0"},          {0, 'X', "magic"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        memcpy(d, buf.data, buf.len);
        if (cases[i].off == bsize)
            memset(d + bsize, 0, 4);
        else
            d[cases[i].off] = cases[i].val;
        ck_assert_int_eq(decode_crafted(d, buf.len, err, sizeof(err)), KVR_ECORRUPT);
        ck_assert_msg(strstr(err, cases[i].expect) != NULL, "case %zu: %s", i, err);
    }
    free(d);
    kvr_buf_free(&buf);
    kvr_index_free(a);
}
END_TEST

static int count_tmp_files(const char *dir)
{
    int n = 0;
    DIR *dd = opendir(dir);
    struct dirent *e;
    while ((e = readdir(dd)) != NULL)
        n += strstr(e->d_name, ".tmp.") != NULL;
    closedir(dd);
    return n;
}

START_TEST(atomic_file_replacement)
{
    char dir[] = "/tmp/kvr_snap_XXXXXX";
    ck_assert_ptr_nonnull(mkdtemp(dir));
    char path[256], err[256];
    snprintf(path, sizeof(path), "%s/state.snap", dir);
    struct gen *g;
    kvr_index_t *a = random_index(31, &g);
    struct kvr_snapshot_index ix = {"m:t", 16, a};
    struct loaded l = {0};
    ck_assert_int_eq(kvr_snapshot_read_file(path, 0, on_index, &l, NULL, err, sizeof(err)),
                     KVR_ENOTFOUND);
    ck_assert_int_eq(kvr_snapshot_write_file(path, &ix, 1, 1, err, sizeof(err)), KVR_OK);
    ck_assert_int_eq(kvr_snapshot_write_file(path, &ix, 1, 2, err, sizeof(err)), KVR_OK);
    ck_assert_int_eq(count_tmp_files(dir), 0);
    uint64_t created;
    ck_assert_int_eq(kvr_snapshot_read_file(path, 0, on_index, &l, &created, err, sizeof(err)),
                     KVR_OK);
    ck_assert_uint_eq(created, 2);
    same_answers(g, a, l.idx[0]);
    loaded_free(&l);
    /* A failing write (target is a directory) leaves the old file and no temporary behind. */
    char sub[300];
    snprintf(sub, sizeof(sub), "%s/sub", dir);
    ck_assert_int_eq(mkdir(sub, 0755), 0);
    ck_assert_int_eq(kvr_snapshot_write_file(sub, &ix, 1, 3, err, sizeof(err)), KVR_EIO);
    ck_assert_int_eq(count_tmp_files(dir), 0);
    ck_assert_int_eq(kvr_snapshot_read_file(path, 0, NULL, NULL, &created, err, sizeof(err)),
                     KVR_OK);
    ck_assert_uint_eq(created, 2);
    /* A size cap below the file is refused. */
    ck_assert_int_eq(kvr_snapshot_read_file(path, 10, NULL, NULL, NULL, err, sizeof(err)), KVR_EIO);
    rmdir(sub);
    unlink(path);
    rmdir(dir);
    kvr_index_free(a);
    gen_free(g);
}
END_TEST

Suite *snapshot_suite(void);

Suite *snapshot_suite(void)
{
    Suite *s = suite_create("snapshot");
    TCase *tc = tcase_create("api");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, round_trip_two_indexes);
    tcase_add_test(tc, atomic_file_replacement);
    suite_add_tcase(s, tc);
    tc = tcase_create("edge");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, every_truncation_and_bit_flip_refused);
    tcase_add_test(tc, crafted_structures_refused);
    suite_add_tcase(s, tc);
    return s;
}
