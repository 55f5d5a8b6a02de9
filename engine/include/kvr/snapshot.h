/* snapshot.h - durable snapshots of one or more indexes, and their hostile-input loader.
 *
 * A snapshot is the event dump of each index (kvr_index_dump_ex: stored events that replay to
 * identical scores when the dump is an exact cut, which the writer tries for three times; under a
 * steady stream of events it keeps the last, fuzzy, dump, which holds only blocks held at some
 * point during it) in a checksummed binary file (full layout: docs/SNAPSHOT_FORMAT.md):
 *
 *   +--------------------------------------------------------------+
 *   | header 32 B: "KVRSNAP1" | u32 version 1 | u32 0x01020304       |
 *   |              u64 created_unix_ms | u32 sections | u32 flags 0  |
 *   +--------------------------------------------------------------+
 *   | section: u32 kind (1 = index) | u32 0 | u64 payload length     |  x sections
 *   |   payload: u16 name length | name | u16 0 | u32 block_size     |
 *   |            u32 0 | u64 event count | events                    |
 *   |   event: u64 worker_id | u64 parent_hash | u32 dp_rank         |
 *   |          u8 has_parent | u8 0 | u16 0 | u32 n | u32 0          |
 *   |          n x (u64 block_hash, u64 tokens_hash)                 |
 *   +--------------------------------------------------------------+
 *   | trailer: u64 XXH3-64 (seed 0) of every byte before it         |
 *   +--------------------------------------------------------------+
 *
 * All integers are little-endian. Writing is atomic: the file is written to "<path>.tmp.<pid>",
 * fsync'ed, renamed over <path>, and the directory fsync'ed, so a crash leaves either the old
 * snapshot or the new one, never a partial file.
 *
 * Loading treats the input as hostile: the checksum is verified first, then every length and
 * count is checked against what remains, and the whole file is validated before any callback
 * runs: a corrupt, truncated, bit-flipped or wrong-version file yields KVR_ECORRUPT (or KVR_EIO)
 * with a message and no index is touched.
 */
#ifndef KVR_SNAPSHOT_H
#define KVR_SNAPSHOT_H

/* A write goes to "<path>" KVR_SNAPSHOT_TMP_INFIX "<pid>" first, then is renamed over <path>;
 * a file with this infix is a write in progress (or one a killed process left behind). */
#define KVR_SNAPSHOT_TMP_INFIX ".tmp."

#include <stddef.h>
#include <stdint.h>

#include "kvr/buf.h"
#include "kvr/event.h"
#include "kvr/index.h"

#define KVR_SNAPSHOT_VERSION 1u
#define KVR_SNAPSHOT_MAX_NAME 1024u

struct kvr_snapshot_index {
    const char *name;    /* index name, e.g. "model:tenant" (borrowed) */
    uint32_t block_size; /* tokens per block of this index */
    kvr_index_t *index;  /* borrowed; dumped under its read lock */
};

/* Encodes n indexes into out (appended; owned by the caller). Returns KVR_OK, KVR_EINVAL (a name
 * too long) or KVR_ENOMEM, with a message in err. */
int kvr_snapshot_encode(const struct kvr_snapshot_index *ix, size_t n, uint64_t now_ms,
                        struct kvr_buf *out, char *err, size_t err_len);

/* Writes data[0..len) to path (borrowed) atomically: to the temporary file (O_CLOEXEC), fsync,
 * rename over path, fsync of its directory (best effort). KVR_OK, KVR_EIO or KVR_EINVAL (path
 * too long), with a message in err; a failed write leaves no temporary file. */
int kvr_snapshot_write_atomic(const char *path, const void *data, size_t len, char *err,
                              size_t err_len);

/* Encodes and writes atomically to path (borrowed; kvr_snapshot_write_atomic). KVR_OK, KVR_EIO,
 * KVR_EINVAL, KVR_ENOMEM. */
int kvr_snapshot_write_file(const char *path, const struct kvr_snapshot_index *ix, size_t n,
                            uint64_t now_ms, char *err, size_t err_len);

/* Called once per index section after the whole file validated: name (not NUL-terminated,
 * borrowed), block size, and the section's events (borrowed; valid during the call). A non-zero
 * return stops decoding and is returned by kvr_snapshot_decode. */
typedef int (*kvr_snapshot_index_cb)(void *ctx, const char *name, size_t name_len,
                                     uint32_t block_size, const struct kvr_event_list *events);

/* Validates and decodes a snapshot held in memory (borrowed). *created_ms (may be NULL) receives
 * the creation time. Returns KVR_OK, KVR_ECORRUPT (message in err), KVR_ENOMEM, or the first
 * non-zero callback result. */
int kvr_snapshot_decode(const void *data, size_t len, kvr_snapshot_index_cb cb, void *ctx,
                        uint64_t *created_ms, char *err, size_t err_len);

/* Reads path (at most max_bytes; 0 = 16 GiB) and decodes it as above. KVR_ENOTFOUND if the file
 * does not exist; KVR_EIO on read errors. */
int kvr_snapshot_read_file(const char *path, size_t max_bytes, kvr_snapshot_index_cb cb, void *ctx,
                           uint64_t *created_ms, char *err, size_t err_len);

#endif
