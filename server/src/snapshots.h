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
 * refused (KVR_ECORRUPT, err set, nothing applied). */
int srv_snapshot_restore(struct srv *s, const char *path, uint64_t *events, char *err,
                         size_t err_len);

#endif
