/* mq.c - cross-thread message queue with eventfd wake-up (see mq.h). */
#include "mq.h"

#include <errno.h>
#include <event2/event.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "kvr/err.h"

static void on_notify(evutil_socket_t fd, short what, void *arg)
{
    struct srv_mq *q = arg;
    uint64_t v;
    (void)what;
    ssize_t r = read(fd, &v, sizeof(v)); /* resets the counter; EAGAIN if already drained */
    (void)r;
    srv_mq_drain(q);
}

int srv_mq_init(struct srv_mq *q, struct event_base *base, void *ctx)
{
    q->head = q->tail = NULL;
    q->ctx = ctx;
    q->closing = 0;
    q->ev = NULL;
    q->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (q->efd == -1)
        return KVR_EIO;
    if (pthread_mutex_init(&q->mu, NULL) != 0) {
        close(q->efd);
        return KVR_EIO;
    }
    q->ev = event_new(base, q->efd, EV_READ | EV_PERSIST, on_notify, q);
    if (q->ev == NULL || event_add(q->ev, NULL) != 0) {
        if (q->ev != NULL)
            event_free(q->ev);
        pthread_mutex_destroy(&q->mu);
        close(q->efd);
        q->ev = NULL;
        q->efd = -1;
        return KVR_ENOMEM;
    }
    return KVR_OK;
}

int srv_mq_post(struct srv_mq *q, srv_mq_fn fn, void *arg)
{
    struct srv_mq_msg *m = malloc(sizeof(*m));
    if (m == NULL)
        return KVR_ENOMEM;
    m->next = NULL;
    m->fn = fn;
    m->arg = arg;
    pthread_mutex_lock(&q->mu);
    int was_empty = q->head == NULL;
    if (q->tail != NULL)
        q->tail->next = m;
    else
        q->head = m;
    q->tail = m;
    pthread_mutex_unlock(&q->mu);
    if (was_empty) {
        uint64_t one = 1;
        ssize_t w;
        do
            w = write(q->efd, &one, sizeof(one));
        while (w == -1 && errno == EINTR);
        /* EAGAIN means the counter is saturated: the loop is already due to wake */
    }
    return KVR_OK;
}

void srv_mq_drain(struct srv_mq *q)
{
    for (;;) {
        pthread_mutex_lock(&q->mu);
        struct srv_mq_msg *m = q->head;
        q->head = q->tail = NULL;
        pthread_mutex_unlock(&q->mu);
        if (m == NULL)
            return;
        while (m != NULL) {
            struct srv_mq_msg *next = m->next;
            m->fn(q->ctx, m->arg);
            free(m);
            m = next;
        }
    }
}

void srv_mq_close(struct srv_mq *q)
{
    if (q->efd == -1)
        return;
    q->closing = 1;
    srv_mq_drain(q);
    if (q->ev != NULL)
        event_free(q->ev);
    q->ev = NULL;
    close(q->efd);
    q->efd = -1;
    pthread_mutex_destroy(&q->mu);
}
