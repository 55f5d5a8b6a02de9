/* admin.c - /admin/...: bearer token when configured, else loopback clients only.
 *
 *   GET  /admin/status              threads, models, workers, policy generation, snapshot status
 *   POST /admin/policy?model=M      body = Lua source: install (hot reload) the policy for M
 *                                   (no model: the default). 200 {"generation": n} once live on
 *                                   every thread; 4xx {"error": "..."} (with line numbers) when
 *                                   refused. Runs on the control thread.
 *   POST /admin/reload              re-read the configured policy files (as SIGHUP)
 *   POST /admin/script              body = Lua source: an operator script (kvr.admin.dump /
 *                                   kvr.admin.snapshot into the --snapshot directory), run on
 *                                   the control thread under --script-budget; 200 {"result"},
 *                                   4xx {"error", "status"}
 *   POST /admin/snapshot[?path=P]   write a snapshot now (atomic: temp file, fsync, rename);
 *                                   200 {"path", "bytes", "models", "ms"}; P only names a file
 *                                   in the directory of --snapshot FILE (snapshots.h), else 400
 */
#include <event2/http.h>
#include <stdio.h>
#include <string.h>

#include "api.h"
#include "clock.h"
#include "jsonw.h"
#include "kvr/err.h"
#include "policy.h"
#include "snapshots.h"
#include "thread.h"

/* ==== jobs (control thread) =================================================================== */

static void set_error(struct srv_job *j, int status, const char *msg)
{
    srv_jw_error_body(&j->body, msg);
    j->status = status;
}

static void run_snapshot(struct srv_control *c, struct srv_job *j)
{
    struct srv *s = srv_control_server(c);
    char err[512], path[4096];
    /* ?path= only within the configured file's directory (snapshots.h) */
    if (srv_snapshot_resolve(s, j->param, path, sizeof(path), err, sizeof(err)) != KVR_OK) {
        set_error(j, 400, err);
        return;
    }
    uint64_t t0 = srv_now_ms(), bytes = 0;
    size_t models = 0;
    int rc = srv_snapshot_write(s, path, &bytes, &models, err, sizeof(err));
    if (rc != KVR_OK) {
        set_error(j, 500, err);
        return;
    }
    struct srv_jw w;
    srv_jw_init(&w, &j->body);
    srv_jw_raw(&w, "{\"path\":");
    srv_jw_cstr(&w, path);
    srv_jw_raw(&w, ",\"bytes\":");
    srv_jw_u64(&w, bytes);
    srv_jw_raw(&w, ",\"models\":");
    srv_jw_u64(&w, models);
    srv_jw_raw(&w, ",\"ms\":");
    srv_jw_u64(&w, srv_now_ms() - t0);
    srv_jw_char(&w, '}');
    j->status = w.err == KVR_OK ? 200 : 503;
}

static void run_policy(struct srv_control *c, struct srv_job *j)
{
    struct srv *s = srv_control_server(c);
    char err[1024];
    uint64_t gen = 0;
    int status = srv_policy_install(s->policy, j->param[0] ? j->param : NULL, j->arg, j->arg_len,
                                    &gen, err, sizeof(err));
    if (status != 200) {
        set_error(j, status, err);
        srv_logf(s->log, SRV_LOG_WARN, "admin", "policy install for %s refused: %s",
                 j->param[0] ? j->param : "(default)", err);
        return;
    }
    char body[96];
    int n = snprintf(body, sizeof(body), "{\"generation\":%llu}", (unsigned long long)gen);
    kvr_buf_append(&j->body, body, (size_t)n);
    j->status = 200;
    srv_logf(s->log, SRV_LOG_INFO, "admin", "policy for %s installed: generation %llu",
             j->param[0] ? j->param : "(default)", (unsigned long long)gen);
}

static void run_reload(struct srv_control *c, struct srv_job *j)
{
    struct srv *s = srv_control_server(c);
    char err[1024];
    uint64_t gen = 0;
    int status = srv_policy_reload(s->policy, &gen, err, sizeof(err));
    if (status != 200) {
        set_error(j, status, err);
        return;
    }
    char body[96];
    int n = snprintf(body, sizeof(body), "{\"generation\":%llu}", (unsigned long long)gen);
    kvr_buf_append(&j->body, body, (size_t)n);
    j->status = 200;
}

/* POST /admin/script: an operator script (docs/LUA_API.md "Operator scripts") on the control
 * thread, with the script budget. */
static void run_script(struct srv_control *c, struct srv_job *j)
{
    struct srv *s = srv_control_server(c);
    j->status = srv_policy_script(s->policy, j->arg, j->arg_len, &j->body);
    int ok = j->status == 200;
    size_t n = ok || j->body.data == NULL ? 0 : j->body.len < 400 ? j->body.len : 400;
    srv_logf(s->log, ok ? SRV_LOG_INFO : SRV_LOG_WARN, "admin",
             "operator script (%zu bytes): %d%s%.*s", j->arg_len, j->status, n ? " " : "", (int)n,
             n ? j->body.data : ""); /* a failure with its error body (JSON) */
}

/* ==== status (on the HTTP thread: reads only) ================================================= */

static void status(struct srv_hreq *h)
{
    struct srv *s = h->t->srv;
    struct srv_jw w;
    kvr_buf_reset(&h->t->out);
    srv_jw_init(&w, &h->t->out);
    srv_jw_raw(&w, "{\"version\":\"0.1.0\",\"uptime_s\":");
    srv_jw_u64(&w, (srv_now_ms() - s->start_ms) / 1000);
    srv_jw_raw(&w, ",\"ready\":");
    srv_jw_bool(&w, atomic_load(&s->ready));
    srv_jw_raw(&w, ",\"draining\":");
    srv_jw_bool(&w, atomic_load(&s->draining));
    srv_jw_raw(&w, ",\"listen\":");
    char lis[300];
    snprintf(lis, sizeof(lis), "%s:%u", s->cfg->listen_host, s->port);
    srv_jw_cstr(&w, lis);
    srv_jw_raw(&w, ",\"threads\":[");
    for (uint32_t k = 0; k < s->n_threads; k++) {
        struct srv_thread *t = &s->threads[k];
        if (k > 0)
            srv_jw_char(&w, ',');
        srv_jw_raw(&w, "{\"name\":");
        srv_jw_cstr(&w, t->name);
        srv_jw_raw(&w, ",\"connections\":");
        srv_jw_u64(&w, atomic_load(&t->n_conns));
        srv_jw_raw(&w, ",\"in_flight\":");
        srv_jw_u64(&w, atomic_load(&t->inflight));
        srv_jw_char(&w, '}');
    }
    srv_jw_raw(&w, "],\"models\":[");
    size_t n = srv_models_count(&s->models);
    for (size_t k = 0; k < n; k++) {
        struct srv_model *m = srv_models_at(&s->models, k);
        struct kvr_index_stats st;
        kvr_index_stats(m->index, &st);
        struct kvr_load_stats ls;
        kvr_load_stats(m->load, &ls);
        if (k > 0)
            srv_jw_char(&w, ',');
        srv_jw_raw(&w, "{\"key\":");
        srv_jw_cstr(&w, m->key);
        srv_jw_raw(&w, ",\"block_size\":");
        srv_jw_u64(&w, m->block_size);
        srv_jw_raw(&w, ",\"kind\":");
        srv_jw_cstr(&w, srv_kind_name(m->kind));
        srv_jw_raw(&w, ",\"index_kind\":");
        srv_jw_cstr(&w, srv_index_kind_name(m->index_kind));
        srv_jw_raw(&w, ",\"tokenizer\":");
        srv_jw_cstr(&w, srv_tokenizer_name(m->tokenizer));
        srv_jw_raw(&w, ",\"policy\":");
        srv_jw_cstr(&w, m->policy);
        srv_jw_raw(&w, ",\"index\":{\"blocks\":");
        srv_jw_u64(&w, st.radix.blocks);
        srv_jw_raw(&w, ",\"block_ranks\":");
        srv_jw_u64(&w, st.radix.block_ranks);
        srv_jw_raw(&w, ",\"ranks\":");
        srv_jw_u64(&w, st.radix.ranks);
        srv_jw_raw(&w, ",\"bytes\":");
        srv_jw_u64(&w, st.radix.bytes);
        srv_jw_raw(&w, "},\"load\":{\"active\":");
        srv_jw_u64(&w, ls.active);
        srv_jw_raw(&w, ",\"expired\":");
        srv_jw_u64(&w, ls.expired);
        srv_jw_raw(&w, "}}");
    }
    srv_jw_raw(&w, "],\"policy\":{");
    srv_policy_status(s->policy, &w);
    srv_jw_raw(&w, "},\"snapshot\":{\"path\":");
    srv_jw_cstr(&w, s->cfg->snapshot_path);
    pthread_mutex_lock(&s->snap.mu);
    srv_jw_raw(&w, ",\"writes\":");
    srv_jw_u64(&w, s->snap.count);
    srv_jw_raw(&w, ",\"failures\":");
    srv_jw_u64(&w, s->snap.failures);
    srv_jw_raw(&w, ",\"last_unix_ms\":");
    srv_jw_u64(&w, s->snap.last_unix_ms);
    srv_jw_raw(&w, ",\"restored_events\":");
    srv_jw_u64(&w, s->snap.restored_events);
    srv_jw_raw(&w, ",\"last_error\":");
    srv_jw_cstr(&w, s->snap.last_error[0] ? s->snap.last_error : NULL);
    pthread_mutex_unlock(&s->snap.mu);
    srv_jw_raw(&w, "}}");
    srv_reply_out(h, 200, w.err);
}

/* ==== dispatch ================================================================================ */

/* Reached only through the route table, which gates every /admin route (srv_admin_allowed). */
void srv_api_admin(struct srv_hreq *h)
{
    const char *what = h->path + strlen("/admin/");
    int post = h->method == EVHTTP_REQ_POST;
    if (strcmp(what, "status") == 0 && !post) {
        status(h);
        return;
    }
    void (*run)(struct srv_control *, struct srv_job *) = NULL;
    const char *pname = NULL;
    if (strcmp(what, "snapshot") == 0 && post) {
        run = run_snapshot;
        pname = "path";
    } else if (strcmp(what, "policy") == 0 && post) {
        run = run_policy;
        pname = "model";
    } else if (strcmp(what, "reload") == 0 && post) {
        run = run_reload;
    } else if (strcmp(what, "script") == 0 && post) {
        run = run_script;
    } else if (strcmp(what, "policy") == 0 && !post) {
        status(h);
        return;
    }
    if (run == NULL) {
        int known = strcmp(what, "status") == 0 || strcmp(what, "snapshot") == 0 ||
                    strcmp(what, "reload") == 0 || strcmp(what, "script") == 0;
        if (known)
            srv_reply_header(h, "Allow", strcmp(what, "status") == 0 ? "GET" : "POST");
        srv_reply_error(h, known ? 405 : 404, "unknown admin route %s", h->path);
        return;
    }
    size_t len = 0;
    int lua_body = run == run_policy || run == run_script;
    const char *body = lua_body ? srv_body(h, &len) : NULL;
    if (lua_body && len == 0) {
        srv_reply_error(h, 400,
                        run == run_policy ? "the body must be the policy's Lua source"
                                          : "the body must be the script's Lua source");
        return;
    }
    struct srv_job *j = srv_job_new(body, len);
    if (j == NULL) {
        srv_reply_error(h, 503, "out of memory");
        return;
    }
    if (pname != NULL)
        srv_query_param(h, pname, j->param, sizeof(j->param));
    if (run == run_policy && j->param[0]) {
        struct srv_model *m = srv_models_find_spec(&h->t->srv->models, j->param, strlen(j->param));
        if (m == NULL) {
            srv_reply_error(h, 404, "no model '%s'", j->param);
            srv_job_free(j);
            return;
        }
        /* Bind by the model's key ("name:tenant"): what requests carry as req.model. */
        snprintf(j->param, sizeof(j->param), "%s", m->key);
    }
    j->run = run;
    srv_job_submit(h, j);
}
