/* breaker.c - circuit breaker and health thresholds (see breaker.h). */
#include "breaker.h"

#include <string.h>

void srv_breaker_init(struct srv_breaker *b)
{
    memset(b, 0, sizeof(*b));
    b->state = SRV_BRK_CLOSED;
}

int srv_breaker_state(struct srv_breaker *b, const struct srv_breaker_cfg *cfg, uint64_t now_ms)
{
    if (cfg->failures == 0)
        return SRV_BRK_CLOSED;
    if (b->state == SRV_BRK_OPEN && now_ms >= b->opened_ms + cfg->open_ms) {
        b->state = SRV_BRK_HALF_OPEN;
        b->half_ok = 0;
        b->probes_out = 0;
    }
    return b->state;
}

static uint32_t max_probes(const struct srv_breaker_cfg *cfg)
{
    return cfg->probes > 0 ? cfg->probes : 1;
}

int srv_breaker_available(struct srv_breaker *b, const struct srv_breaker_cfg *cfg, uint64_t now_ms)
{
    switch (srv_breaker_state(b, cfg, now_ms)) {
    case SRV_BRK_CLOSED:
        return 1;
    case SRV_BRK_HALF_OPEN:
        return b->probes_out < max_probes(cfg);
    default:
        return 0;
    }
}

int srv_breaker_acquire(struct srv_breaker *b, const struct srv_breaker_cfg *cfg, uint64_t now_ms,
                        int *probe)
{
    *probe = 0;
    switch (srv_breaker_state(b, cfg, now_ms)) {
    case SRV_BRK_CLOSED:
        return 1;
    case SRV_BRK_HALF_OPEN:
        if (b->probes_out >= max_probes(cfg))
            return 0;
        b->probes_out++;
        *probe = 1;
        return 1;
    default:
        return 0;
    }
}

static void trip(struct srv_breaker *b, uint64_t now_ms)
{
    b->state = SRV_BRK_OPEN;
    b->opened_ms = now_ms;
    b->consec_fail = 0;
    b->half_ok = 0;
    b->probes_out = 0;
    b->opens++;
}

int srv_breaker_report(struct srv_breaker *b, const struct srv_breaker_cfg *cfg, int ok, int probe,
                       uint64_t now_ms)
{
    if (cfg->failures == 0)
        return 0;
    int before = srv_breaker_state(b, cfg, now_ms);
    switch (before) {
    case SRV_BRK_CLOSED:
        if (ok) {
            b->consec_fail = 0;
        } else if (++b->consec_fail >= cfg->failures) {
            trip(b, now_ms);
        }
        break;
    case SRV_BRK_HALF_OPEN:
        if (probe && b->probes_out > 0)
            b->probes_out--;
        if (!ok) {
            trip(b, now_ms);
        } else if (++b->half_ok >= (cfg->successes > 0 ? cfg->successes : 1)) {
            b->state = SRV_BRK_CLOSED;
            b->consec_fail = 0;
            b->half_ok = 0;
            b->probes_out = 0;
        }
        break;
    default: /* OPEN: a late result from before it opened */
        break;
    }
    return b->state != before;
}

const char *srv_breaker_state_name(int state)
{
    switch (state) {
    case SRV_BRK_CLOSED:
        return "closed";
    case SRV_BRK_HALF_OPEN:
        return "half_open";
    case SRV_BRK_OPEN:
        return "open";
    default:
        return "unknown";
    }
}

void srv_health_init(struct srv_health *h)
{
    memset(h, 0, sizeof(*h));
    h->state = SRV_HEALTH_HEALTHY;
}

int srv_health_report(struct srv_health *h, const struct srv_health_cfg *cfg, int ok)
{
    int before = h->state;
    h->checks++;
    if (ok) {
        h->consec_ok++;
        h->consec_fail = 0;
        if (h->state == SRV_HEALTH_UNHEALTHY && h->consec_ok >= (cfg->passes ? cfg->passes : 1))
            h->state = SRV_HEALTH_HEALTHY;
    } else {
        h->failed++;
        h->consec_fail++;
        h->consec_ok = 0;
        if (h->state == SRV_HEALTH_HEALTHY && h->consec_fail >= (cfg->fails ? cfg->fails : 1))
            h->state = SRV_HEALTH_UNHEALTHY;
    }
    return h->state != before;
}

const char *srv_health_state_name(int state)
{
    return state == SRV_HEALTH_HEALTHY ? "healthy" : "unhealthy";
}
