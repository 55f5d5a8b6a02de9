/* log.c - line logger (see log.h). */
#include "log.h"

#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

void srv_log_init(struct srv_logger *lg, int fd, int level)
{
    atomic_init(&lg->level, level);
    lg->fd = fd;
}

int srv_log_level_parse(const char *s)
{
    static const char *const names[] = {"error", "warn", "info", "debug"};
    for (int k = 0; k < 4; k++)
        if (strcasecmp(s, names[k]) == 0)
            return k;
    return -1;
}

void srv_vlogf(struct srv_logger *lg, int level, const char *who, const char *fmt, va_list ap)
{
    static const char *const tags[] = {"ERROR", "WARN ", "INFO ", "DEBUG"};
    if (lg == NULL || level > atomic_load_explicit(&lg->level, memory_order_relaxed))
        return;
    char line[2048];
    struct timespec ts;
    struct tm tm;
    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    int n = snprintf(line, sizeof(line), "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ %s [%s] ",
                     tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
                     ts.tv_nsec / 1000000,
                     tags[level < 0   ? 0
                          : level > 3 ? 3
                                      : level],
                     who != NULL ? who : "-");
    if (n < 0)
        return;
    size_t len = (size_t)n;
    if (len < sizeof(line) - 1) {
        int m = vsnprintf(line + len, sizeof(line) - 1 - len, fmt, ap);
        if (m > 0)
            len += (size_t)m < sizeof(line) - 1 - len ? (size_t)m : sizeof(line) - 2 - len;
    }
    line[len++] = '\n';
    ssize_t w = write(lg->fd, line, len);
    (void)w; /* nowhere to report a failed log write */
}

void srv_logf(struct srv_logger *lg, int level, const char *who, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    srv_vlogf(lg, level, who, fmt, ap);
    va_end(ap);
}

int srv_log_ratelimit(struct srv_ratelimit *rl, uint64_t now_ms, uint64_t period_ms)
{
    if (now_ms < rl->next_ms) {
        rl->suppressed++;
        return 0;
    }
    rl->next_ms = now_ms + period_ms;
    return 1;
}
