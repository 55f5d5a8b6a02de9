/* test_mq.c - the cross-thread message queue (server/src/mq.c): many producers, one event loop,
 * nothing lost, per-producer order kept, leftovers released at close. TSan target. */
#include <check.h>
#include <event2/event.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "kvr/err.h"
#include "mq.h"

Suite *mq_suite(void);

#define PRODUCERS 4
#define PER 20000

struct sink {
    struct event_base *base;
    uint64_t got;
    uint32_t last[PRODUCERS]; /* next sequence expected per producer */
    int order_ok;
    int closing_seen;
};

struct msg {
    uint32_t producer;
    uint32_t seq;
};

static void on_msg(void *ctx, void *arg)
{
    struct sink *s = ctx;
    struct msg *m = arg;
    if (m->seq != s->last[m->producer]) /* producers' messages arrive in order */
        s->order_ok = 0;
    s->last[m->producer] = m->seq + 1;
    if (++s->got == (uint64_t)PRODUCERS * PER)
        event_base_loopexit(s->base, NULL);
    free(m);
}

struct producer {
    struct srv_mq *q;
    uint32_t id;
};

static void *produce(void *arg)
{
    struct producer *p = arg;
    for (uint32_t k = 0; k < PER; k++) {
        struct msg *m = malloc(sizeof(*m));
        m->producer = p->id;
        m->seq = k;
        while (srv_mq_post(p->q, on_msg, m) != KVR_OK)
            ;
    }
    return NULL;
}

START_TEST(many_producers_one_loop)
{
    struct sink s = {0};
    s.order_ok = 1;
    s.base = event_base_new();
    struct srv_mq q;
    ck_assert_int_eq(srv_mq_init(&q, s.base, &s), KVR_OK);
    pthread_t th[PRODUCERS];
    struct producer p[PRODUCERS];
    for (uint32_t k = 0; k < PRODUCERS; k++) {
        p[k].q = &q;
        p[k].id = k;
        pthread_create(&th[k], NULL, produce, &p[k]);
    }
    struct timeval tv = {30, 0};
    event_base_loopexit(s.base, &tv); /* safety net */
    event_base_dispatch(s.base);
    for (uint32_t k = 0; k < PRODUCERS; k++)
        pthread_join(th[k], NULL);
    srv_mq_drain(&q);
    ck_assert_uint_eq(s.got, (uint64_t)PRODUCERS * PER);
    ck_assert_int_eq(s.order_ok, 1);
    srv_mq_close(&q);
    event_base_free(s.base);
}
END_TEST

static void on_close_msg(void *ctx, void *arg)
{
    struct sink *s = ctx;
    (void)arg;
    s->closing_seen += 1;
}

START_TEST(close_runs_leftovers)
{
    struct sink s = {0};
    s.base = event_base_new();
    struct srv_mq q;
    ck_assert_int_eq(srv_mq_init(&q, s.base, &s), KVR_OK);
    for (int k = 0; k < 5; k++)
        ck_assert_int_eq(srv_mq_post(&q, on_close_msg, NULL), KVR_OK);
    srv_mq_close(&q); /* the loop never ran: close delivers them */
    ck_assert_int_eq(s.closing_seen, 5);
    event_base_free(s.base);
}
END_TEST

Suite *mq_suite(void)
{
    Suite *s = suite_create("mq");
    TCase *tc = tcase_create("concurrency");
    tcase_add_test(tc, many_producers_one_loop);
    tcase_add_test(tc, close_runs_leftovers);
    tcase_set_timeout(tc, 120);
    suite_add_tcase(s, tc);
    return s;
}
