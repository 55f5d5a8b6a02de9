/* stats.c - route and status names, histogram layouts (see stats.h). */
#include "stats.h"

static const int codes[SRV_NCODES - 1] = {200, 201, 204, 400, 401, 403, 404, 405, 409, 413,
                                          415, 429, 431, 499, 500, 501, 502, 503, 504, 507};

int srv_code_index(int status)
{
    for (int k = 0; k < SRV_NCODES - 1; k++)
        if (codes[k] == status)
            return k;
    return SRV_NCODES - 1;
}

const char *srv_code_name(int idx)
{
    static const char *const names[SRV_NCODES] = {
        "200", "201", "204", "400", "401", "403", "404", "405", "409", "413",  "415",
        "429", "431", "499", "500", "501", "502", "503", "504", "507", "other"};
    return idx >= 0 && idx < SRV_NCODES ? names[idx] : "other";
}

const char *srv_route_name(int route)
{
    static const char *const names[SRV_R_COUNT_] = {"/register",
                                                    "/unregister",
                                                    "/workers",
                                                    "/query",
                                                    "/query_by_hash",
                                                    "/dump",
                                                    "/v1/events",
                                                    "/v1/route",
                                                    "/v1/route/{id}",
                                                    "/v1/completions",
                                                    "/v1/chat/completions",
                                                    "/v1/models",
                                                    "/v1/workers",
                                                    "/admin",
                                                    "/metrics",
                                                    "/healthz",
                                                    "/readyz",
                                                    "other"};
    return route >= 0 && route < SRV_R_COUNT_ ? names[route] : "other";
}

const char *srv_uperr_name(int kind)
{
    static const char *const names[SRV_UPERR_COUNT_] = {"connect", "timeout", "status_5xx",
                                                        "status_429", "midstream"};
    return kind >= 0 && kind < SRV_UPERR_COUNT_ ? names[kind] : "other";
}

static const struct srv_hist_spec latency = {
    22,
    {25,      50,       100,      250,      500,      1000,    2500,    5000,
     10000,   25000,    50000,    100000,   250000,   500000,  1000000, 2500000,
     5000000, 10000000, 20000000, 30000000, 45000000, 60000000},
    1e-6};

static const struct srv_hist_spec blocks = {
    15, {0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192}, 1.0};

static const struct srv_hist_spec ratio = {
    11, {0, 100, 200, 300, 400, 500, 600, 700, 800, 900, 1000}, 1e-3};

const struct srv_hist_spec *srv_hist_latency(void)
{
    return &latency;
}

const struct srv_hist_spec *srv_hist_blocks(void)
{
    return &blocks;
}

const struct srv_hist_spec *srv_hist_ratio(void)
{
    return &ratio;
}
