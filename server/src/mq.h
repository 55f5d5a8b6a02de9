/* mq.h - a cross-thread message queue that wakes an event loop (memcached's cq + notify idea).
 *
 *   any thread: srv_mq_post(q, fn, arg) ──▶ [mutex] append ──▶ eventfd write (only if the
 *                                                              queue was empty)
 *   loop thread: eventfd readable ──▶ take the whole list under the mutex ──▶ run fn(ctx, arg)
 *                                     for each message, in order, without the mutex
 *
 * A message is a closure (function + argument); its argument is owned by the function once it
 * runs. Messages still queued at srv_mq_close are run with `closing` set, so every argument is
 * released exactly once (functions check srv_mq_closing when they must not touch the loop).
 *
 * Thread-safety: srv_mq_post from any thread; everything else on the loop's thread.
 */
#ifndef KVR_SRV_MQ_H
#define KVR_SRV_MQ_H

#include <pthread.h>

struct event_base;
struct event;

/* Runs on the loop thread: ctx is the queue's context, arg the posted argument (owned). */
typedef void (*srv_mq_fn)(void *ctx, void *arg);

struct srv_mq_msg {
    struct srv_mq_msg *next;
    srv_mq_fn fn;
    void *arg;
};

struct srv_mq {
    pthread_mutex_t mu;
    struct srv_mq_msg *head; /* under mu */
    struct srv_mq_msg *tail; /* under mu */
    int efd;                 /* eventfd (non-blocking) */
    struct event *ev;        /* read event on efd, in the owner's base */
    void *ctx;               /* passed to every fn */
    int closing;             /* set while srv_mq_close runs the leftovers */
};

/* Creates the eventfd and its event in `base` (not yet added: srv_mq_init adds it).
 * Returns KVR_OK, KVR_EIO (eventfd/event failure) or KVR_ENOMEM. */
int srv_mq_init(struct srv_mq *q, struct event_base *base, void *ctx);

/* Queues fn(ctx, arg). Returns KVR_OK or KVR_ENOMEM (arg stays the caller's). */
int srv_mq_post(struct srv_mq *q, srv_mq_fn fn, void *arg);

/* Runs everything queued now (also called by the event). Loop thread only. */
void srv_mq_drain(struct srv_mq *q);

/* Runs the leftovers with q->closing = 1, then frees the event and the eventfd. Loop thread
 * (or any thread once the loop has stopped). */
void srv_mq_close(struct srv_mq *q);

static inline int srv_mq_closing(const struct srv_mq *q)
{
    return q->closing;
}

#endif
