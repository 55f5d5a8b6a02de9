/* test_config.c - flags, specs, the sandboxed Lua config file and validation
 * (server/src/config.c). */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "log.h"

Suite *config_suite(void);

static int parse(struct srv_config *cfg, char *err, int argc, char **argv)
{
    FILE *devnull = fopen("/dev/null", "w");
    srv_config_init(cfg);
    int rc = srv_config_parse_args(cfg, argc, argv, devnull, err, SRV_CFG_ERR);
    fclose(devnull);
    return rc;
}

START_TEST(defaults_give_one_model)
{
    struct srv_config c;
    char err[SRV_CFG_ERR];
    char *argv[] = {"kvrouter", "--listen", "127.0.0.1:0", NULL};
    ck_assert_int_eq(parse(&c, err, 3, argv), 0);
    ck_assert_str_eq(c.listen_host, "127.0.0.1");
    ck_assert_uint_eq(c.listen_port, 0);
    ck_assert_uint_eq(c.threads, 2);
    ck_assert_uint_eq(c.n_models, 1);
    ck_assert_str_eq(c.models[0].name, "default");
    ck_assert_str_eq(c.models[0].tenant, "default");
    ck_assert_uint_eq(c.models[0].block_size, 16);
    ck_assert_int_eq(c.models[0].kind, SRV_KIND_EVENTS);
    ck_assert_uint_eq(c.max_body, 8u << 20);
    ck_assert_ptr_null(c.admin_token);
    srv_config_free(&c);
}
END_TEST

START_TEST(flags_parse_units)
{
    struct srv_config c;
    char err[SRV_CFG_ERR];
    char *argv[] = {"kvrouter",
                    "--max-body",
                    "16M",
                    "--timeout",
                    "1.5",
                    "--retry-backoff",
                    "50ms",
                    "--health-interval",
                    "2m",
                    "--threads",
                    "4",
                    "--allow-policy-header",
                    "--block-size",
                    "32",
                    "--listen",
                    "[::1]:9000",
                    "--log-level",
                    "debug",
                    NULL};
    ck_assert_int_eq(parse(&c, err, 18, argv), 0);
    ck_assert_uint_eq(c.max_body, 16u << 20);
    ck_assert_uint_eq(c.timeout_ms, 1500);
    ck_assert_uint_eq(c.retry_backoff_ms, 50);
    ck_assert_uint_eq(c.health_interval_ms, 120000);
    ck_assert_uint_eq(c.threads, 4);
    ck_assert_int_eq(c.allow_policy_header, 1);
    ck_assert_uint_eq(c.models[0].block_size, 32);
    ck_assert_str_eq(c.listen_host, "::1");
    ck_assert_uint_eq(c.listen_port, 9000);
    ck_assert_int_eq(c.log_level, SRV_LOG_DEBUG);
    srv_config_free(&c);
}
END_TEST

START_TEST(bad_flags_name_the_option)
{
    struct {
        char *flag, *value, *needle;
    } cases[] = {{"--threads", "0", "--threads"},       {"--threads", "99", "--threads"},
                 {"--max-body", "12X", "--max-body"},   {"--timeout", "soon", "--timeout"},
                 {"--listen", "host", "--listen"},      {"--tokenizer", "gpt", "--tokenizer"},
                 {"--admin-token", "", "--admin-token"}};
    for (size_t k = 0; k < sizeof(cases) / sizeof(cases[0]); k++) {
        struct srv_config c;
        char err[SRV_CFG_ERR] = "";
        char *argv[] = {"kvrouter", cases[k].flag, cases[k].value, NULL};
        ck_assert_int_eq(parse(&c, err, 3, argv), -1);
        ck_assert_msg(strstr(err, cases[k].needle) != NULL, "%s: %s", cases[k].flag, err);
        srv_config_free(&c);
    }
}
END_TEST

START_TEST(model_and_worker_specs)
{
    struct srv_config c;
    char err[SRV_CFG_ERR];
    srv_config_init(&c);
    ck_assert_int_eq(srv_config_add_model_spec(&c,
                                               "llama:acme,block_size=32,kind=approx,"
                                               "tokenizer=bytes,ttl=30s,max_blocks=100,"
                                               "index=both,temperature=0.5",
                                               err, sizeof(err)),
                     0);
    ck_assert_str_eq(c.models[0].name, "llama");
    ck_assert_str_eq(c.models[0].tenant, "acme");
    ck_assert_uint_eq(c.models[0].block_size, 32);
    ck_assert_int_eq(c.models[0].kind, SRV_KIND_APPROX);
    ck_assert_int_eq(c.models[0].tokenizer, SRV_TOK_BYTES);
    ck_assert_uint_eq(c.models[0].approx_ttl_ms, 30000);
    ck_assert_uint_eq(c.models[0].approx_max_blocks, 100);
    ck_assert_int_eq(c.models[0].index_kind, 3);
    ck_assert(c.models[0].temperature == 0.5);
    ck_assert_int_eq(srv_config_add_worker_spec(
                         &c,
                         "id=18446744073709551615,model=llama:acme,url=http://10.0.0.1:8000,"
                         "zmq=tcp://10.0.0.1:5557,dp=2,label.zone=a,label.gpu=h100",
                         err, sizeof(err)),
                     0);
    ck_assert_uint_eq(c.workers[0].id, UINT64_MAX);
    ck_assert_uint_eq(c.workers[0].dp_size, 2);
    ck_assert_str_eq(c.workers[0].labels, "zone=a,gpu=h100");
    ck_assert_int_eq(srv_config_finish(&c, err, sizeof(err)), 0);
    /* errors */
    ck_assert_int_eq(srv_config_add_model_spec(&c, "m,block_size=1", err, sizeof(err)), -1);
    ck_assert_ptr_nonnull(strstr(err, "block_size"));
    ck_assert_int_eq(srv_config_add_model_spec(&c, "m,flavour=x", err, sizeof(err)), -1);
    ck_assert_ptr_nonnull(strstr(err, "unknown key 'flavour'"));
    ck_assert_int_eq(srv_config_add_worker_spec(&c, "id=1,label.a,b=c", err, sizeof(err)), -1);
    srv_config_free(&c);
}
END_TEST

START_TEST(cross_field_validation)
{
    struct srv_config c;
    char err[SRV_CFG_ERR];
    srv_config_init(&c);
    ck_assert_int_eq(srv_config_add_model_spec(&c, "a", err, sizeof(err)), 0);
    ck_assert_int_eq(srv_config_add_model_spec(&c, "b", err, sizeof(err)), 0);
    ck_assert_int_eq(srv_config_add_worker_spec(&c, "id=1,url=http://x:1", err, sizeof(err)), 0);
    ck_assert_int_eq(srv_config_finish(&c, err, sizeof(err)), -1);
    ck_assert_ptr_nonnull(strstr(err, "model is required"));
    srv_config_free(&c);

    srv_config_init(&c);
    ck_assert_int_eq(srv_config_add_model_spec(&c, "a", err, sizeof(err)), 0);
    ck_assert_int_eq(srv_config_add_model_spec(&c, "a:default", err, sizeof(err)), 0);
    ck_assert_int_eq(srv_config_finish(&c, err, sizeof(err)), -1);
    ck_assert_ptr_nonnull(strstr(err, "twice"));
    srv_config_free(&c);
}
END_TEST

/* Replica sync and NATS events: flags, the config file's replicas table, the model options,
 * and the cross-field rules. */
START_TEST(replica_options)
{
    struct srv_config c;
    char err[SRV_CFG_ERR];
    char *argv[] = {"kvrouter",
                    "--nats",
                    "nats://127.0.0.1:4222",
                    "--replica-id",
                    "7",
                    "--replica-timeout",
                    "3s",
                    "--replica-heartbeat",
                    "500ms",
                    "--replica-flush",
                    "0",
                    "--peers",
                    "http://a:1,http://b:2/x",
                    "--model",
                    "m,nats_subject=kv.m,nats_stream=KV",
                    NULL};
    ck_assert_msg(parse(&c, err, 15, argv) == 0, "%s", err);
    ck_assert_str_eq(c.nats_url, "nats://127.0.0.1:4222");
    ck_assert_uint_eq(c.replica_id, 7);
    ck_assert_uint_eq(c.replica_timeout_ms, 3000);
    ck_assert_uint_eq(c.replica_heartbeat_ms, 500);
    ck_assert_uint_eq(c.replica_flush_ms, 0);
    ck_assert_str_eq(c.replica_subject, "kvrouter.replicas");
    ck_assert_uint_eq(c.bootstrap_wait_ms, 1000);
    ck_assert_str_eq(c.peers, "http://a:1,http://b:2/x");
    ck_assert_str_eq(c.models[0].nats_subject, "kv.m");
    ck_assert_str_eq(c.models[0].nats_stream, "KV");
    srv_config_free(&c);

    char *d[] = {"kvrouter", NULL};
    ck_assert_int_eq(parse(&c, err, 1, d), 0);
    ck_assert_ptr_null(c.nats_url); /* off by default */
    ck_assert_uint_eq(c.replica_timeout_ms, 5000);
    ck_assert_uint_eq(c.replica_heartbeat_ms, 1000);
    ck_assert_uint_eq(c.replica_flush_ms, 1);
    srv_config_free(&c);

    srv_config_init(&c);
    const char *lua = "return { replicas = { nats = 'nats://n:1', id = 9, subject = 'x.y',"
                      " timeout = 10, peers = 'http://p:1', peer_token = 'tok',"
                      " bootstrap_wait = '250ms' } }";
    ck_assert_int_eq(srv_config_load_text(&c, lua, strlen(lua), "k.lua", err, sizeof(err)), 0);
    ck_assert_int_eq(srv_config_finish(&c, err, sizeof(err)), 0);
    ck_assert_str_eq(c.replica_subject, "x.y");
    ck_assert_uint_eq(c.replica_id, 9);
    ck_assert_uint_eq(c.replica_timeout_ms, 10000);
    ck_assert_str_eq(c.peer_token, "tok");
    ck_assert_uint_eq(c.bootstrap_wait_ms, 250);
    srv_config_free(&c);

    struct {
        const char *flag, *value, *needle;
    } bad[] = {
        {"--nats", "http://x:1", "expected nats://"},
        {"--replica-id", "0", "--replica-id"},
        {"--replica-subject", "a.*", "wildcards"},
        {"--replica-heartbeat", "4s", "at most half"},
        {"--peers", "http://a:1,,http://b", "empty"},
        {"--peers", "ftp://a", "expected http://"},
        {"--model", "m,nats_subject=kv", "need --nats"},
        {"--model", "m,nats_stream=S", "need --nats"},
        {"--model", "m,nats_subject=", "expected a NATS subject"},
    };
    for (size_t k = 0; k < sizeof(bad) / sizeof(bad[0]); k++) {
        char *av[] = {"kvrouter", (char *)bad[k].flag, (char *)bad[k].value, NULL};
        ck_assert_msg(parse(&c, err, 3, av) == -1, "%s %s accepted", bad[k].flag, bad[k].value);
        ck_assert_msg(strstr(err, bad[k].needle) != NULL, "%s %s: '%s'", bad[k].flag, bad[k].value,
                      err);
        srv_config_free(&c);
    }
    char *sn[] = {"kvrouter", "--nats", "nats://n:1", "--model", "m,nats_stream=S", NULL};
    ck_assert_int_eq(parse(&c, err, 5, sn), -1);
    ck_assert_ptr_nonnull(strstr(err, "nats_stream needs nats_subject"));
    srv_config_free(&c);
}
END_TEST

static int load(struct srv_config *c, const char *text, char *err)
{
    srv_config_init(c);
    int rc = srv_config_load_text(c, text, strlen(text), "kvrouter.lua", err, SRV_CFG_ERR);
    if (rc == 0)
        rc = srv_config_finish(c, err, SRV_CFG_ERR);
    return rc;
}

START_TEST(lua_file)
{
    struct srv_config c;
    char err[SRV_CFG_ERR];
    ck_assert_int_eq(load(&c,
                          "local models = {}\n"
                          "for _, n in ipairs({'a', 'b'}) do\n"
                          "  models[#models + 1] = { name = n, block_size = 8 * #models + 8 }\n"
                          "end\n"
                          "return { threads = 3, limits = { max_body = '1M', timeout = 2.5 },\n"
                          "  snapshot = { path = '/tmp/s', period = '10m' },\n"
                          "  health = { path = '/ping' }, breaker = { failures = 0 },\n"
                          "  retry = { max = 4, backoff = '5ms' }, allow_policy_header = true,\n"
                          "  models = models,\n"
                          "  workers = { { id = 3, model = 'b', url = 'http://h:1',\n"
                          "                labels = { rack = 7 } } } }\n",
                          err),
                     0);
    ck_assert_uint_eq(c.threads, 3);
    ck_assert_uint_eq(c.max_body, 1u << 20);
    ck_assert_uint_eq(c.timeout_ms, 2500);
    ck_assert_str_eq(c.snapshot_path, "/tmp/s");
    ck_assert_uint_eq(c.snapshot_period_ms, 600000);
    ck_assert_str_eq(c.health_path, "/ping");
    ck_assert_uint_eq(c.breaker_failures, 0);
    ck_assert_uint_eq(c.retry_max, 4);
    ck_assert_uint_eq(c.retry_backoff_ms, 5);
    ck_assert_int_eq(c.allow_policy_header, 1);
    ck_assert_uint_eq(c.n_models, 2);
    ck_assert_uint_eq(c.models[1].block_size, 16);
    ck_assert_str_eq(c.workers[0].labels, "rack=7");
    srv_config_free(&c);
}
END_TEST

/* The CKF model options: ckf_keys (translate by default) and ckf_expected, in --model specs and
 * in the config file's model table; bad values are refused with the key's name. */
START_TEST(ckf_model_options)
{
    struct srv_config c;
    char err[SRV_CFG_ERR];
    srv_config_init(&c);
    ck_assert_int_eq(srv_config_add_model_spec(&c, "a,index=ckf", err, sizeof(err)), 0);
    ck_assert_int_eq(c.models[0].ckf_keys, SRV_CKF_KEYS_TRANSLATE);
    ck_assert_uint_eq(c.models[0].ckf_expected, 0); /* the engine default (16384) */
    ck_assert_int_eq(srv_config_add_model_spec(
                         &c, "b,index=both,ckf_keys=engine,ckf_expected=12000", err, sizeof(err)),
                     0);
    ck_assert_int_eq(c.models[1].ckf_keys, SRV_CKF_KEYS_ENGINE);
    ck_assert_uint_eq(c.models[1].ckf_expected, 12000);
    ck_assert_int_eq(srv_config_add_model_spec(&c, "c,ckf_keys=translate", err, sizeof(err)), 0);
    ck_assert_int_eq(c.models[2].ckf_keys, SRV_CKF_KEYS_TRANSLATE);
    const char *bad[][2] = {{"d,ckf_keys=canonical", "ckf_keys"},
                            {"d,ckf_expected=0", "ckf_expected"},
                            {"d,ckf_expected=12k", "ckf_expected"},
                            {"d,ckf_expected=", "ckf_expected"}};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        ck_assert_int_eq(srv_config_add_model_spec(&c, bad[i][0], err, sizeof(err)), -1);
        ck_assert_msg(strstr(err, bad[i][1]) != NULL, "%s: '%s'", bad[i][0], err);
    }
    srv_config_free(&c);
    ck_assert_int_eq(load(&c,
                          "return { models = { { name = 'm', index = 'ckf', ckf_expected = 50000,"
                          " ckf_keys = 'engine' } } }\n",
                          err),
                     0);
    ck_assert_int_eq(c.models[0].index_kind, 2);
    ck_assert_int_eq(c.models[0].ckf_keys, SRV_CKF_KEYS_ENGINE);
    ck_assert_uint_eq(c.models[0].ckf_expected, 50000);
    srv_config_free(&c);
    ck_assert_int_eq(load(&c, "return { models = { { name = 'm', ckf_keys = 'x' } } }\n", err), -1);
    ck_assert_ptr_nonnull(strstr(err, "ckf_keys"));
    srv_config_free(&c);
}
END_TEST

START_TEST(lua_sandbox_and_errors)
{
    struct {
        const char *text, *needle;
    } cases[] = {
        {"return { nope = 1 }", "kvrouter.lua: nope: unknown key"},
        {"return { health = { intervall = 1 } }", "health.intervall: unknown key"},
        {"return { threads = true }", "threads"},
        {"return { allow_policy_header = 1 }", "true or false"},
        {"return { models = { { block_size = 16 } } }", "name is required"},
        {"return { models = { { name = 'x', approx = { ttl = 0 } } } }", "ttl"},
        {"return io.open('/etc/passwd')", "io"},
        {"return os.getenv('HOME')", "os"},
        {"return require('jit')", "require"},
        {"return loadstring('return 1')()", "loadstring"},
        {"return dofile('/etc/passwd')", "dofile"},
        {"string.rep = nil return {}", ""}, /* its own copy: allowed, harmless */
        {"while true do end", "instruction budget"},
        /* a pcall must not swallow the budget: the loop around it raises again */
        {"while true do pcall(function() while true do end end) end", "instruction budget"},
        {"while true do pcall(error, 'x') end", "instruction budget"},
        {"while true do xpcall(function() while true do end end, "
         "function() while true do end end) end",
         "instruction budget"},
        /* patterns run in one C call the hook cannot interrupt: not available */
        {"local s = string.rep('a', 100000) return { x = s:find(string.rep('a.-', 8) .. 'b') }",
         "patterns are not available"},
        {"return { x = ('abc'):match('b') }", "patterns are not available"},
        {"return { x = string.gsub('abc', 'b', 'c') }", "patterns are not available"},
        {"return { listen = string.find('a.b', '.', 1, true) and '127.0.0.1:1' }", ""},
        {"return { x = string.dump }", ""}, /* nil: the key is absent, fine */
        {"local ok, e = xpcall(function(a) error('boom' .. a, 0) end, function(m) return 'h:' .. m "
         "end, 7) if ok or e ~= 'h:boom7' then error('xpcall: ' .. tostring(e)) end return {}",
         ""},
        {"\x1bLJ", "binary chunks"},
        {"return { 'a', 'b' }", "keys must be strings"},
        {"error('custom failure')", "custom failure"},
    };
    for (size_t k = 0; k < sizeof(cases) / sizeof(cases[0]); k++) {
        struct srv_config c;
        char err[SRV_CFG_ERR] = "";
        int rc = load(&c, cases[k].text, err);
        if (cases[k].needle[0] == '\0') {
            ck_assert_msg(rc == 0, "%s: %s", cases[k].text, err);
        } else {
            ck_assert_msg(rc == -1, "%s should fail", cases[k].text);
            ck_assert_msg(strstr(err, cases[k].needle) != NULL, "%s: got '%s'", cases[k].text, err);
        }
        srv_config_free(&c);
    }
}
END_TEST

START_TEST(value_parsers)
{
    uint64_t v;
    ck_assert_int_eq(srv_parse_size("64K", &v), 0);
    ck_assert_uint_eq(v, 65536);
    ck_assert_int_eq(srv_parse_size("2GiB", &v), 0);
    ck_assert_uint_eq(v, 2ull << 30);
    ck_assert_int_eq(srv_parse_size("-1", &v), -1);
    ck_assert_int_eq(srv_parse_size("1.5M", &v), -1);
    ck_assert_int_eq(srv_parse_size("99999999999999999999", &v), -1);
    ck_assert_int_eq(srv_parse_duration_ms("250ms", &v), 0);
    ck_assert_uint_eq(v, 250);
    ck_assert_int_eq(srv_parse_duration_ms("0.25", &v), 0);
    ck_assert_uint_eq(v, 250);
    ck_assert_int_eq(srv_parse_duration_ms("1h", &v), 0);
    ck_assert_uint_eq(v, 3600000);
    ck_assert_int_eq(srv_parse_duration_ms("5 s", &v), -1);
    ck_assert_int_eq(srv_parse_duration_ms("nan", &v), -1);
    char host[64];
    uint16_t port;
    ck_assert_int_eq(srv_parse_listen("8080", host, sizeof(host), &port), 0);
    ck_assert_str_eq(host, "127.0.0.1");
    ck_assert_int_eq(srv_parse_listen("0.0.0.0:80", host, sizeof(host), &port), 0);
    ck_assert_uint_eq(port, 80);
    ck_assert_int_eq(srv_parse_listen("h:70000", host, sizeof(host), &port), -1);
    ck_assert_int_eq(srv_parse_listen(":80", host, sizeof(host), &port), -1);
    ck_assert_int_eq(srv_kind_parse("approx"), SRV_KIND_APPROX);
    ck_assert_int_eq(srv_tokenizer_parse("none"), SRV_TOK_NONE);
    ck_assert_int_eq(srv_index_kind_parse("ckf"), 2);
    ck_assert_int_eq(srv_index_kind_parse("tree"), -1);
}
END_TEST

START_TEST(help_lists_every_flag)
{
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    srv_config_usage(f);
    fclose(f);
    const char *flags[] = {"--listen",
                           "--threads",
                           "--admin-token",
                           "--max-body",
                           "--max-headers",
                           "--max-connections",
                           "--timeout",
                           "--upstream-timeout",
                           "--upstream-pool",
                           "--snapshot",
                           "--snapshot-period",
                           "--policy",
                           "--allow-policy-header",
                           "--policy-budget",
                           "--health-interval",
                           "--health-timeout",
                           "--health-path",
                           "--health-fails",
                           "--health-passes",
                           "--breaker-failures",
                           "--breaker-successes",
                           "--breaker-open",
                           "--retries",
                           "--retry-backoff",
                           "--retry-backoff-max",
                           "--tokenize-timeout",
                           "--shutdown-grace",
                           "--block-size",
                           "--tokenizer",
                           "--log-level",
                           "--seed",
                           "--config",
                           "--model",
                           "--worker",
                           "--check-config",
                           "--help",
                           "--version"};
    for (size_t k = 0; k < sizeof(flags) / sizeof(flags[0]); k++)
        ck_assert_msg(strstr(text, flags[k]) != NULL, "%s missing from --help", flags[k]);
    free(text);
}
END_TEST

Suite *config_suite(void)
{
    Suite *s = suite_create("config");
    TCase *tc = tcase_create("api");
    tcase_add_test(tc, defaults_give_one_model);
    tcase_add_test(tc, flags_parse_units);
    tcase_add_test(tc, model_and_worker_specs);
    tcase_add_test(tc, value_parsers);
    tcase_add_test(tc, help_lists_every_flag);
    suite_add_tcase(s, tc);
    TCase *te = tcase_create("edge");
    tcase_add_test(te, bad_flags_name_the_option);
    tcase_add_test(te, cross_field_validation);
    tcase_add_test(te, lua_file);
    tcase_add_test(te, lua_sandbox_and_errors);
    tcase_add_test(te, ckf_model_options);
    tcase_add_test(te, replica_options);
    tcase_set_timeout(te, 30);
    suite_add_tcase(s, te);
    return s;
}
