// notice.c: start-up waits that speak. A rank that waits for others at start-up (for the
// store, for ranks to join, for peers to connect) used to say nothing until its timeout,
// 30 minutes by default: a job with one rank missing looked like a hang. Each such wait
// now says every DT_WAIT_NOTICE_MS (10 s) whom it still waits for and how much longer
// it will wait; the callers name the whom, this file keeps the clock and the wording.
#include "comm/comm_impl.h"

#include <stdio.h>

void dt_wait_notice_start(dt_wait_notice *w, uint64_t deadline_ns) {
    long period = 0;
    // A bad value is reported where the setting is read for the job (--help-env shows
    // it); here the default keeps the wait speaking.
    if (dt_setting_int("DT_WAIT_NOTICE_MS", &period) != DT_OK || period <= 0)
        period = 10000;
    w->period_ns   = (uint64_t)period * 1000000ull;
    w->start_ns    = dt_now_ns();
    w->next_ns     = w->start_ns + w->period_ns;
    w->deadline_ns = deadline_ns;
}

bool dt_wait_notice_due(dt_wait_notice *w) {
    uint64_t now = dt_now_ns();
    if (now < w->next_ns)
        return false;
    while (w->next_ns <= now)
        w->next_ns += w->period_ns;
    return true;
}

int dt_wait_notice_ms(const dt_wait_notice *w) {
    uint64_t now = dt_now_ns();
    return w->next_ns <= now ? 0 : (int)((w->next_ns - now + 999999) / 1000000);
}

// Whole seconds, or tenths below 10 s (short periods, as tests set).
static int prec(double s) {
    return s < 10 ? 1 : 0;
}

void dt_wait_notice_times(const dt_wait_notice *w, char *buf, size_t n) {
    uint64_t now   = dt_now_ns();
    double   sofar = (double)(now - w->start_ns) / 1e9;
    double   more  = w->deadline_ns > now ? (double)(w->deadline_ns - now) / 1e9 : 0.0;
    if (w->deadline_ns == UINT64_MAX)
        snprintf(buf, n, "waited %.*f s, will wait without limit (timeout -1)", prec(sofar), sofar);
    else
        snprintf(buf, n,
                 "waited %.*f s, will wait at most %.*f s more (DT_TIMEOUT_MS or the program's "
                 "timeout)",
                 prec(sofar), sofar, prec(more), more);
}

dt_status dt_store_wait_noted(dt_store *store, const char *key, uint64_t deadline_ns,
                              const char *what, const char *whom) {
    const char    *keys[1] = {key};
    dt_wait_notice notice;
    dt_wait_notice_start(&notice, deadline_ns);
    for (;;) {
        // One wait up to the next notice (or the deadline): the store answers at once
        // when the key is set.
        int64_t   slice = dt_wait_notice_ms(&notice);
        int       left  = deadline_ns == UINT64_MAX ? -1 : dt_ms_left(deadline_ns);
        bool      last  = left >= 0 && left <= slice;
        dt_status st    = dt_store_wait(store, keys, 1, last ? (left > 0 ? left : 1) : slice);
        if (st != DT_ERR_TIMEOUT)
            return st;
        if (last) // (the store's message counts the last slice only)
            return dt_fail(DT_ERR_TIMEOUT, "%s: timed out after %.1f s waiting for %s (key %s)",
                           what, (double)(dt_now_ns() - notice.start_ns) / 1e9, whom, key);
        if (dt_wait_notice_due(&notice)) {
            char t[160];
            dt_wait_notice_times(&notice, t, sizeof t);
            DT_WARN("comm", "%s: waiting for %s; %s", what, whom, t);
        }
    }
}
