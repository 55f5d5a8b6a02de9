/* log.h - the router's log: one line per event on stderr, with time, level and thread.
 *
 * Design: a logger is a small struct owned by the server (no global state); every module that
 * logs receives it. Lines are formatted into a stack buffer and written with one write(2) so
 * lines from different threads never interleave. Levels below the configured one cost one
 * comparison. Rate limiting for hot paths is the caller's business (srv_log_ratelimit).
 *
 *   2025-01-31T12:00:00.123Z WARN  [w1] upstream 7 (http://10.0.0.5:8000): connection refused
 *
 * Thread-safety: srv_logf may be called from any thread; the level is read atomically.
 */
#ifndef KVR_SRV_LOG_H
#define KVR_SRV_LOG_H

#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>

enum srv_log_level {
    SRV_LOG_ERROR = 0,
    SRV_LOG_WARN = 1,
    SRV_LOG_INFO = 2,
    SRV_LOG_DEBUG = 3,
};

struct srv_logger {
    _Atomic int level; /* enum srv_log_level: lines above it are dropped */
    int fd;            /* destination (2 = stderr) */
};

/* Initialises a logger writing to fd at `level`. Never fails. */
void srv_log_init(struct srv_logger *lg, int fd, int level);

/* Parses "error", "warn", "info" or "debug"; returns the level or -1. */
int srv_log_level_parse(const char *s);

/* Writes one line (no trailing newline in fmt). `who` (may be NULL) names the thread ("w0",
 * "ctl", "main"). Lines are cut at 2 KiB. */
#if defined(__GNUC__)
__attribute__((format(printf, 4, 5)))
#endif
__attribute__((format(printf, 4, 5))) void
srv_logf(struct srv_logger *lg, int level, const char *who, const char *fmt, ...);

__attribute__((format(printf, 4, 0))) void srv_vlogf(struct srv_logger *lg, int level,
                                                     const char *who, const char *fmt, va_list ap);

/* Token-bucket style limiter for repeated messages: returns 1 at most once per period_ms
 * (per limiter), and counts the suppressed calls in *suppressed (reset when it returns 1).
 * Not thread-safe: one limiter per thread. */
struct srv_ratelimit {
    uint64_t next_ms;
    uint64_t suppressed;
};
int srv_log_ratelimit(struct srv_ratelimit *rl, uint64_t now_ms, uint64_t period_ms);

#endif
