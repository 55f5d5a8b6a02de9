/* thread.h - HTTP thread lifecycle (thread.c) and the control thread (control.c).
 *
 * HTTP thread: created on the main thread with its event base, evhttp and listening socket
 * (srv_thread_init), started (srv_thread_start), told to drain (srv_thread_drain, via its
 * queue: stop accepting, finish what is in flight, then leave the loop; a grace timer cuts the
 * wait), joined, freed. Control thread: timers (health checks, approx/load expiry, graveyard
 * sweep, periodic snapshots) and jobs posted by HTTP threads (admin actions), whose answers go
 * back through the posting thread's queue.
 */
#ifndef KVR_SRV_THREAD_H
#define KVR_SRV_THREAD_H

#include "kvr/buf.h"
#include "server.h"

int srv_thread_init(struct srv *s, struct srv_thread *t, uint32_t idx, int listen_fd, char *err,
                    size_t err_len);
int srv_thread_start(struct srv_thread *t);
/* Asks the thread to stop accepting and exit once idle (any thread). */
void srv_thread_drain(struct srv_thread *t);
void srv_thread_join(struct srv_thread *t);
void srv_thread_free(struct srv_thread *t);

/* ==== control thread ========================================================================== */

struct srv_control;

int srv_control_new(struct srv *s, struct srv_control **out);
int srv_control_start(struct srv_control *c);
/* Stops the loop and joins the thread. */
void srv_control_stop(struct srv_control *c);
void srv_control_free(struct srv_control *c);
/* Runs fn(ctl, arg) on the control thread. KVR_OK or KVR_ENOMEM. */
int srv_control_post(struct srv_control *c, void (*fn)(void *ctl, void *arg), void *arg);
struct srv *srv_control_server(struct srv_control *c);

/* A job: work too long or too blocking for an HTTP thread's loop (admin actions, GET /dump,
 * large /v1/events bodies) runs on the control thread and is answered on the requesting thread,
 * whose other connections keep being served meanwhile. */
struct srv_job {
    struct srv_live live;        /* on the requesting thread's list */
    struct srv_conn_watch watch; /* the client may leave meanwhile */
    struct srv_hreq h;           /* the request (copied) */
    int gone;                    /* the client left, or the thread is exiting */
    /* control thread: do the work, set status and body (JSON) */
    void (*run)(struct srv_control *c, struct srv_job *j);
    /* optional, back on the requesting thread before the reply (also when the client left):
     * bookkeeping only that thread may do, e.g. its own counters from `counts` */
    void (*done)(struct srv_thread *t, struct srv_job *j);
    int status;
    struct kvr_buf body; /* large bodies are handed to the reply without a copy */
    char *arg;           /* input text (owned, may be NULL) */
    size_t arg_len;
    void *ctx;          /* borrowed input for run (e.g. the model), may be NULL */
    uint64_t counts[4]; /* results for done */
    char param[256];    /* a query parameter for run (e.g. the model) */
};

/* Allocates a job (arg[0..arg_len) copied, NUL-terminated; arg NULL with arg_len > 0 leaves
 * arg_len bytes uninitialised for the caller to fill). NULL on OOM. */
struct srv_job *srv_job_new(const char *arg, size_t arg_len);
/* Frees a job that was never submitted. */
void srv_job_free(struct srv_job *j);
/* Hands h to the control thread: j->run there, then the reply here. On failure replies 503. */
void srv_job_submit(struct srv_hreq *h, struct srv_job *j);

#endif
