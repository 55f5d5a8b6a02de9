/* clock.h - monotonic time for timers, latencies, load tracking and breakers.
 *
 * Every engine call that needs time takes it as an argument (load tracker, approximate mode,
 * breaker); these helpers are the only place the server reads the clock. */
#ifndef KVR_SRV_CLOCK_H
#define KVR_SRV_CLOCK_H

#include <stdint.h>
#include <time.h>

static inline uint64_t srv_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static inline uint64_t srv_now_ms(void)
{
    return srv_now_ns() / 1000000u;
}

static inline uint64_t srv_now_us(void)
{
    return srv_now_ns() / 1000u;
}

/* Wall-clock microseconds since the Unix epoch (replica-sync op times: comparable between
 * processes of one machine, or of NTP-synchronised machines). */
static inline uint64_t srv_wall_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

/* Wall-clock milliseconds since the Unix epoch (snapshot headers, /v1/models "created"). */
static inline uint64_t srv_wall_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

#endif
