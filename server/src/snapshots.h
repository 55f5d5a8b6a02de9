/* snapshots.h - the index snapshot of every events-fed model, written atomically (temp file,
 * fsync, rename, directory fsync: engine/include/kvr/snapshot.h) and restored at start.
 *
 * Which models: those of kind "events" with a radix tree (index radix or both; a CKF-only index
 * cannot be dumped as events, it refills from live events). Approximate
 * models are not written: their blocks live only as long as their TTL, and a snapshot cannot
 * carry the timers (after a restart they refill within one TTL).
 *
 * Restore (--snapshot FILE at start): the whole file is validated before anything is applied, so
 * a truncated, bit-flipped or wrong-version file is refused with a clear log line and the
 * router starts EMPTY rather than wrong. A section whose model exists with another block size is
 * skipped (logged); a model that does not exist yet is created (events kind).
 *
 * Where (srv_snapshot_resolve): POST /admin/snapshot?path=P may only name a file in the directory
 * of the configured --snapshot FILE (a bare name, or a path whose directory is that one; no
 * hidden names, no "..", no symlinked directory tricks: the directory is compared after
 * realpath); without --snapshot, ?path is refused. So the admin API cannot write anywhere else.
 *
 * Start-up hygiene (srv_snapshot_restore): temp files "<FILE>.tmp.<pid>" left by a process that
 * died mid-write are deleted (only when that pid is gone); a refused file is renamed to
 * "<FILE>.refused.<unix_ms>", so the next snapshot does not destroy the evidence.
 *
 * Thread-safety: the control thread writes (and the main thread at shutdown, after the control
 * thread stopped); the status in struct srv_snapstat is guarded by its mutex.
 */
#ifndef KVR_SRV_SNAPSHOTS_H
#define KVR_SRV_SNAPSHOTS_H

#include <stddef.h>
#include <stdint.h>

struct srv;

/* Writes every events model's index to path. *bytes (may be NULL) receives the file size,
 * *models the number of indexes written. KVR_OK or an error with err set. */
int srv_snapshot_write(struct srv *s, const char *path, uint64_t *bytes, size_t *models, char *err,
                       size_t err_len);

/* Restores from path. A missing file is not an error (KVR_OK, *events = 0); a corrupt one is
 * refused (KVR_ECORRUPT, err set, nothing applied) and renamed to <path>.refused.<unix_ms>.
 * Stale <path>.tmp.<pid> files of dead processes are deleted first. */
int srv_snapshot_restore(struct srv *s, const char *path, uint64_t *events, char *err,
                         size_t err_len);

/* The file an on-demand snapshot may write: `requested` NULL or "" = the configured path; else
 * it must name a file in the configured path's directory (see above). Writes the path into
 * out[0..cap). KVR_OK, or KVR_EINVAL with err set (no --snapshot, a name outside the
 * directory, a hidden or malformed name). */
int srv_snapshot_resolve(const struct srv *s, const char *requested, char *out, size_t cap,
                         char *err, size_t err_len);

#endif
