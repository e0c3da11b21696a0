// error.c: the thread-local "last error" record behind dt_fail and dt_last_error.
#include "dtrain/core.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ERR_LEN 1024

static _Thread_local char      last_msg[ERR_LEN];
static _Thread_local dt_status last_status;

static const char *const status_names[DT_STATUS_COUNT_] = {
    [DT_OK]              = "DT_OK",
    [DT_ERR_ARG]         = "DT_ERR_ARG",
    [DT_ERR_NOMEM]       = "DT_ERR_NOMEM",
    [DT_ERR_IO]          = "DT_ERR_IO",
    [DT_ERR_FORMAT]      = "DT_ERR_FORMAT",
    [DT_ERR_TIMEOUT]     = "DT_ERR_TIMEOUT",
    [DT_ERR_PEER]        = "DT_ERR_PEER",
    [DT_ERR_MISMATCH]    = "DT_ERR_MISMATCH",
    [DT_ERR_UNSUPPORTED] = "DT_ERR_UNSUPPORTED",
    [DT_ERR_STATE]       = "DT_ERR_STATE",
    [DT_ERR_INTERNAL]    = "DT_ERR_INTERNAL",
};

const char *dt_status_str(dt_status s) {
    if ((unsigned)s < DT_STATUS_COUNT_)
        return status_names[s];
    return "DT_ERR_UNKNOWN";
}

const char *dt_last_error(void) {
    return last_msg;
}
dt_status dt_last_status(void) {
    return last_status;
}

void dt_clear_error(void) {
    last_msg[0] = '\0';
    last_status = DT_OK;
}

dt_status dt_failv(dt_status s, const char *fmt, va_list ap) {
    // Format into a scratch buffer first: an argument may point into last_msg.
    char tmp[ERR_LEN];
    vsnprintf(tmp, sizeof tmp, fmt, ap);
    memcpy(last_msg, tmp, sizeof tmp);
    last_status = s;
    return s;
}

dt_status dt_fail(dt_status s, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    dt_failv(s, fmt, ap);
    va_end(ap);
    return s;
}

dt_status dt_fail_errno(dt_status s, const char *fmt, ...) {
    int     e = errno;
    char    tmp[ERR_LEN];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    return dt_fail(s, "%s: %s", tmp, strerror(e));
}

dt_status dt_fail_context(const char *fmt, ...) {
    char    ctx[ERR_LEN];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(ctx, sizeof ctx, fmt, ap);
    va_end(ap);
    dt_status s = last_status != DT_OK ? last_status : DT_ERR_INTERNAL;
    return dt_fail(s, "%s: %s", ctx, last_msg);
}

void dt_assert_fail(const char *file, int line, const char *expr) {
    fprintf(stderr, "dtrain: assertion failed at %s:%d: %s\n", file, line, expr);
    fflush(stderr);
    abort();
}
