/* test_workers.c - the worker registry (server/src/workers.c): registration rules, ranks,
 * removal, the graveyard, breaker gating of candidates; and concurrent registration, removal,
 * candidate reads, breaker reports and sweeps (TSan target). */
#include <check.h>
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>

#include "kvr/err.h"
#include "models.h"
#include "workers.h"

Suite *workers_suite(void);

static const struct srv_breaker_cfg brk = {
    .failures = 2, .successes = 1, .probes = 1, .open_ms = 100};
static const struct srv_health_cfg hc = {.fails = 1, .passes = 1};

static struct srv_model *model(struct srv_models *ms, struct srv_logger *lg, const char *name)
{
    struct srv_model_cfg mc;
    struct srv_model *m = NULL;
    char err[256];
    srv_log_init(lg, 2, SRV_LOG_ERROR);
    srv_models_init(ms, lg);
    srv_model_cfg_defaults(&mc, (char *)name, "default", 16);
    ck_assert_int_eq(srv_models_get_or_create(ms, &mc, &m, NULL, err, sizeof(err)), KVR_OK);
    return m;
}

static int reg(struct srv_workers *ws, struct srv_model *m, uint64_t id, const char *url,
               uint32_t first, uint32_t n, int merge)
{
    uint32_t ranks[8];
    for (uint32_t k = 0; k < n; k++)
        ranks[k] = first + k;
    struct srv_worker_spec s = {
        .id = id, .url = url, .dp_size = first + n, .n_ranks = n, .ranks = ranks, .merge = merge};
    char err[256];
    return srv_workers_register(ws, m, &s, NULL, err, sizeof(err));
}

START_TEST(register_rules)
{
    struct srv_logger lg;
    struct srv_models ms;
    struct srv_model *m = model(&ms, &lg, "m");
    struct srv_workers ws;
    ck_assert_int_eq(srv_workers_init(&ws, &brk, &hc), KVR_OK);
    ck_assert_int_eq(reg(&ws, m, 7, "http://127.0.0.1:8000/v1x/", 0, 2, 0), KVR_OK);
    ck_assert_int_eq(reg(&ws, m, 7, "http://h:1", 0, 1, 0), KVR_EEXIST);  /* exists */
    ck_assert_int_eq(reg(&ws, m, 7, NULL, 1, 1, 1), KVR_EEXIST);          /* rank exists */
    ck_assert_int_eq(reg(&ws, m, 7, NULL, 2, 1, 1), KVR_OK);              /* merge a rank */
    ck_assert_int_eq(reg(&ws, m, 8, "https://h:1", 0, 1, 0), KVR_EINVAL); /* no TLS */
    ck_assert_int_eq(reg(&ws, m, 9, NULL, 3, 1, 1), KVR_OK); /* /register without url */
    struct srv_worker *w = srv_workers_get(&ws, m, 7);
    ck_assert_ptr_nonnull(w);
    ck_assert_str_eq(w->host, "127.0.0.1");
    ck_assert_uint_eq(w->port, 8000);
    ck_assert_str_eq(w->prefix, "/v1x");
    ck_assert_str_eq(w->hostport, "127.0.0.1:8000");
    ck_assert_uint_eq(w->n_ranks, 3);
    ck_assert_uint_eq(w->dp_size, 3);
    srv_worker_unref(w);
    struct srv_cand c[16];
    ck_assert_uint_eq(srv_workers_candidates(&ws, m, 0, c, 16), 4);
    ck_assert_uint_eq(srv_workers_candidates(&ws, m, 0, c, 2), 4); /* count beyond cap */
    struct srv_removed rm;
    ck_assert_int_eq(srv_workers_remove(&ws, m, 7, 1, &rm), KVR_OK);
    ck_assert_int_eq(rm.whole, 0);
    ck_assert_int_eq(srv_workers_remove(&ws, m, 7, 1, &rm), KVR_ENOTFOUND);
    ck_assert_int_eq(srv_workers_remove(&ws, m, 7, -1, &rm), KVR_OK);
    ck_assert_int_eq(rm.whole, 1);
    ck_assert_ptr_null(srv_workers_get(&ws, m, 7));
    ck_assert_uint_eq(srv_workers_candidates(&ws, m, 0, c, 16), 1);
    /* the graveyard keeps it until the grace time passed */
    ck_assert_uint_eq(srv_workers_sweep(&ws, 0), 0);
    ck_assert_uint_eq(srv_workers_sweep(&ws, UINT64_MAX / 2), 1);
    srv_workers_free(&ws);
    srv_models_free(&ms);
}
END_TEST

START_TEST(breaker_gates_candidates)
{
    struct srv_logger lg;
    struct srv_models ms;
    struct srv_model *m = model(&ms, &lg, "m");
    struct srv_workers ws;
    srv_workers_init(&ws, &brk, &hc);
    ck_assert_int_eq(reg(&ws, m, 1, "http://h:1", 0, 1, 0), KVR_OK);
    struct srv_worker *w = srv_workers_get(&ws, m, 1);
    struct srv_cand c[4];
    int probe;
    for (int k = 0; k < 2; k++) {
        ck_assert_int_eq(srv_worker_acquire(&ws, w, 1000, &probe), 1);
        srv_worker_report(&ws, w, 0, probe, 1000);
    }
    srv_workers_candidates(&ws, m, 1050, c, 4);
    ck_assert_int_eq(c[0].eligible, 0);
    srv_workers_candidates(&ws, m, 1100, c, 4); /* open_ms passed: probing allowed */
    ck_assert_int_eq(c[0].eligible, 1);
    ck_assert_int_eq(srv_worker_acquire(&ws, w, 1100, &probe), 1);
    ck_assert_int_eq(probe, 1);
    srv_worker_report(&ws, w, 1, probe, 1101);
    ck_assert_int_eq(atomic_load(&w->breaker_state), SRV_BRK_CLOSED);
    /* health */
    ck_assert_int_eq(srv_worker_health_report(&ws, w, 0), 1);
    srv_workers_candidates(&ws, m, 2000, c, 4);
    ck_assert_int_eq(c[0].eligible, 0);
    ck_assert_int_eq(srv_worker_health_report(&ws, w, 1), 1);
    srv_workers_candidates(&ws, m, 2000, c, 4);
    ck_assert_int_eq(c[0].eligible, 1);
    srv_worker_unref(w);
    srv_workers_free(&ws);
    srv_models_free(&ms);
}
END_TEST

struct race {
    struct srv_workers *ws;
    struct srv_model *m;
    atomic_int stop;
    int id;
};

static void *churn(void *arg)
{
    struct race *r = arg;
    for (uint64_t k = 0; k < 3000; k++) {
        uint64_t id = (uint64_t)r->id * 100000 + k % 16;
        reg(r->ws, r->m, id, "http://127.0.0.1:9", 0, 2, 0);
        struct srv_removed rm;
        if (k % 3 == 0)
            srv_workers_remove(r->ws, r->m, id, -1, &rm);
        if (k % 100 == 0)
            srv_workers_sweep(r->ws, UINT64_MAX / 2);
    }
    return NULL;
}

static void *reader(void *arg)
{
    struct race *r = arg;
    struct srv_cand c[128];
    uint64_t t = 0;
    while (!atomic_load(&r->stop)) {
        /* the churn threads sweep with a time far in the future, so candidates must not be
         * dereferenced here (the server relies on the graveyard grace time instead) */
        srv_workers_candidates(r->ws, r->m, t++, c, 128);
        struct srv_worker *w = srv_workers_get(r->ws, r->m, 100000);
        if (w != NULL) {
            int probe;
            if (srv_worker_acquire(r->ws, w, t, &probe))
                srv_worker_report(r->ws, w, (int)(t & 1), probe, t);
            srv_worker_health_report(r->ws, w, (int)(t & 2));
            srv_worker_unref(w);
        }
    }
    return NULL;
}

START_TEST(concurrent_churn_and_reads)
{
    struct srv_logger lg;
    struct srv_models ms;
    struct srv_model *m = model(&ms, &lg, "m");
    struct srv_workers ws;
    srv_workers_init(&ws, &brk, &hc);
    struct race w1 = {&ws, m, 0, 1}, w2 = {&ws, m, 0, 2}, rd = {&ws, m, 0, 0};
    pthread_t a, b, c, d;
    pthread_create(&c, NULL, reader, &rd);
    pthread_create(&d, NULL, reader, &rd);
    pthread_create(&a, NULL, churn, &w1);
    pthread_create(&b, NULL, churn, &w2);
    pthread_join(a, NULL);
    pthread_join(b, NULL);
    atomic_store(&rd.stop, 1);
    pthread_join(c, NULL);
    pthread_join(d, NULL);
    struct srv_cand cs[64];
    ck_assert_uint_le(srv_workers_candidates(&ws, m, 0, cs, 64), 64);
    srv_workers_free(&ws);
    srv_models_free(&ms);
}
END_TEST

Suite *workers_suite(void)
{
    Suite *s = suite_create("workers");
    TCase *tc = tcase_create("api");
    tcase_add_test(tc, register_rules);
    tcase_add_test(tc, breaker_gates_candidates);
    suite_add_tcase(s, tc);
    TCase *tr = tcase_create("concurrency");
    tcase_add_test(tr, concurrent_churn_and_reads);
    tcase_set_timeout(tr, 300);
    suite_add_tcase(s, tr);
    return s;
}
