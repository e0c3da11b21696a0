// log.c: leveled log lines with a rank/module/time prefix, one write(2) per line
// so lines from threads and processes sharing a terminal never interleave.
#include "dtrain/core.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

static atomic_int      level_override = -1; // -1: read DT_LOG_LEVEL
static atomic_int      env_level      = -1; // cached parse of DT_LOG_LEVEL
static atomic_int      log_rank       = -1;
static atomic_int      log_world      = -1;
static pthread_mutex_t sink_mu        = PTHREAD_MUTEX_INITIALIZER;
static dt_log_sink     sink_fn;
static void           *sink_user;
static uint64_t        t0_ns;
static pthread_once_t  t0_once = PTHREAD_ONCE_INIT;

static void init_t0(void) {
    t0_ns = dt_now_ns();
}

// The choices of DT_LOG_LEVEL are dt_log_level's values in order; a bad value keeps
// the default (the logger cannot report its own setting's error).
static int parse_env_level(void) {
    int level;
    if (dt_setting_choice("DT_LOG_LEVEL", &level) != DT_OK) {
        dt_clear_error();
        return DT_LOG_WARN;
    }
    return level;
}

dt_log_level dt_log_get_level(void) {
    int o = atomic_load(&level_override);
    if (o >= 0)
        return (dt_log_level)o;
    int e = atomic_load(&env_level);
    if (e < 0) {
        e = parse_env_level();
        atomic_store(&env_level, e);
    }
    return (dt_log_level)e;
}

void dt_log_set_level(dt_log_level level) {
    atomic_store(&level_override, (int)level);
}
bool dt_log_enabled(dt_log_level level) {
    return level >= dt_log_get_level() && level < DT_LOG_OFF;
}

void dt_log_set_rank(int rank, int world) {
    atomic_store(&log_rank, rank);
    atomic_store(&log_world, world);
}

void dt_log_set_sink(dt_log_sink sink, void *user) {
    pthread_mutex_lock(&sink_mu);
    sink_fn   = sink;
    sink_user = user;
    pthread_mutex_unlock(&sink_mu);
}

void dt_log(dt_log_level level, const char *module, const char *fmt, ...) {
    if (!dt_log_enabled(level))
        return;
    pthread_once(&t0_once, init_t0);
    static const char *const tags[] = {"debug", "info", "warn", "error"};
    char                     line[2048];
    double                   t    = (double)(dt_now_ns() - t0_ns) * 1e-9;
    int                      rank = atomic_load(&log_rank), world = atomic_load(&log_world);
    int                      n;
    if (rank >= 0)
        n = snprintf(line, sizeof line, "[dtrain r%d/%d %s %s +%.3fs] ", rank, world,
                     module ? module : "-", tags[level], t);
    else
        n = snprintf(line, sizeof line, "[dtrain %s %s +%.3fs] ", module ? module : "-",
                     tags[level], t);
    if (n < 0 || (size_t)n >= sizeof line)
        n = 0;
    va_list ap;
    va_start(ap, fmt);
    int m = vsnprintf(line + n, sizeof line - (size_t)n - 1, fmt, ap);
    va_end(ap);
    size_t len = (size_t)n + (m < 0 ? 0 : (size_t)m);
    if (len > sizeof line - 2)
        len = sizeof line - 2;
    line[len++] = '\n';
    line[len]   = '\0';

    pthread_mutex_lock(&sink_mu);
    dt_log_sink fn = sink_fn;
    void       *u  = sink_user;
    pthread_mutex_unlock(&sink_mu);
    if (fn) {
        line[len - 1] = '\0';
        fn(level, line, u);
        return;
    }
    ssize_t w = write(STDERR_FILENO, line, len);
    (void)w;
}

uint64_t dt_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

double dt_now(void) {
    return (double)dt_now_ns() * 1e-9;
}

uint64_t dt_deadline_ns(int64_t timeout_ms) {
    if (timeout_ms < 0)
        return UINT64_MAX;
    return dt_now_ns() + (uint64_t)timeout_ms * 1000000ull;
}

int dt_ms_left(uint64_t deadline_ns) {
    if (deadline_ns == UINT64_MAX)
        return INT32_MAX;
    uint64_t now = dt_now_ns();
    if (now >= deadline_ns)
        return 0;
    uint64_t ms = (deadline_ns - now + 999999ull) / 1000000ull;
    return ms > INT32_MAX ? INT32_MAX : (int)ms;
}
