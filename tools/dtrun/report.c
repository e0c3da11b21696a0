// report.c: what dtrun says when a job fails. A node's report (its failed workers,
// or the reason the job stops) travels through the store as text, so every node can
// print the same summary, with the root cause - the earliest failure, as torchrun's
// "Root Cause (first observed failure)" - and that worker's last lines.
#include "dtrun.h"

#include <inttypes.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

void dtrun_say(const char *fmt, ...) {
    char    buf[2048];
    va_list ap;
    va_start(ap, fmt);
    int n = snprintf(buf, sizeof buf, "dtrun: ");
    n += vsnprintf(buf + n, sizeof buf - (size_t)n - 1, fmt, ap);
    va_end(ap);
    if (n > (int)sizeof buf - 2)
        n = (int)sizeof buf - 2;
    buf[n++]  = '\n';
    ssize_t w = write(2, buf, (size_t)n);
    (void)w;
}

void dtrun_format_time(int64_t wall_ms, char *buf, size_t n) {
    time_t    t = (time_t)(wall_ms / 1000);
    struct tm tm;
    localtime_r(&t, &tm);
    char base[40];
    strftime(base, sizeof base, "%Y-%m-%d %H:%M:%S", &tm);
    snprintf(buf, n, "%s.%03d", base, (int)(wall_ms % 1000));
}

// ------------------------------------------------------------------ text form
//
//   node <k> <nfail>
//   reason <text>                                  (only when there is one)
//   fail <rank> <local> <node> <pid> <code> <signal> <wall_ms> <nlines> <host>
//   <line>                                         (nlines of them)

char *dtrun_report_encode(const dtrun_report *r) {
    size_t cap = 1024 + (size_t)r->nfail * (200 + DTRUN_TAIL_LINES * (DTRUN_LINE_MAX + 1));
    char  *s   = dt_alloc(cap);
    if (!s)
        return NULL;
    size_t k = 0;
    k += (size_t)snprintf(s + k, cap - k, "node %d %d\n", r->node, r->nfail);
    if (r->reason[0])
        k += (size_t)snprintf(s + k, cap - k, "reason %s\n", r->reason);
    for (int i = 0; i < r->nfail; i++) {
        const dtrun_failure *f = &r->fail[i];
        k += (size_t)snprintf(s + k, cap - k, "fail %d %d %d %d %d %d %" PRId64 " %d %s\n", f->rank,
                              f->local_rank, f->node, f->pid, f->exit_code, f->signal, f->wall_ms,
                              f->nlines, f->host[0] ? f->host : "?");
        for (int j = 0; j < f->nlines; j++)
            k += (size_t)snprintf(s + k, cap - k, "%s\n", f->lines[j]);
    }
    return s;
}

// Next line of text into buf (without the newline); false at the end.
static bool next_line(const char **p, char *buf, size_t n) {
    if (!**p)
        return false;
    const char *e   = strchr(*p, '\n');
    size_t      len = e ? (size_t)(e - *p) : strlen(*p);
    snprintf(buf, n, "%.*s", (int)(len < n ? len : n - 1), *p);
    *p += len + (e ? 1 : 0);
    return true;
}

dt_status dtrun_report_decode(const char *text, dtrun_report *r) {
    memset(r, 0, sizeof *r);
    const char *p = text;
    char        line[1024];
    if (!next_line(&p, line, sizeof line) || sscanf(line, "node %d %d", &r->node, &r->nfail) != 2 ||
        r->nfail < 0 || r->nfail > 65536)
        return dt_fail(DT_ERR_FORMAT, "node report: expected \"node K N\", found \"%.60s\"", text);
    if (r->nfail && !(r->fail = dt_alloc_zero((size_t)r->nfail * sizeof *r->fail)))
        return dt_last_status();
    const char *save = p;
    if (next_line(&p, line, sizeof line) && strncmp(line, "reason ", 7) == 0)
        snprintf(r->reason, sizeof r->reason, "%.600s", line + 7);
    else
        p = save;
    for (int i = 0; i < r->nfail; i++) {
        dtrun_failure *f = &r->fail[i];
        long long      wall;
        if (!next_line(&p, line, sizeof line) ||
            sscanf(line, "fail %d %d %d %d %d %d %lld %d %63s", &f->rank, &f->local_rank, &f->node,
                   &f->pid, &f->exit_code, &f->signal, &wall, &f->nlines, f->host) != 9 ||
            f->nlines < 0 || f->nlines > DTRUN_TAIL_LINES) {
            dtrun_report_clear(r);
            return dt_fail(DT_ERR_FORMAT, "node report: record %d is malformed", i);
        }
        f->wall_ms = wall;
        for (int j = 0; j < f->nlines; j++)
            if (!next_line(&p, f->lines[j], DTRUN_LINE_MAX)) {
                dtrun_report_clear(r);
                return dt_fail(DT_ERR_FORMAT, "node report: record %d lacks its lines", i);
            }
    }
    return DT_OK;
}

void dtrun_report_clear(dtrun_report *r) {
    dt_free(r->fail);
    r->fail  = NULL;
    r->nfail = 0;
}

// ------------------------------------------------------------------ summary

const dtrun_failure *dtrun_root_cause(const dtrun_report *reports, int nreports) {
    const dtrun_failure *best = NULL;
    for (int i = 0; i < nreports; i++)
        for (int j = 0; j < reports[i].nfail; j++) {
            const dtrun_failure *f = &reports[i].fail[j];
            if (!best || f->wall_ms < best->wall_ms ||
                (f->wall_ms == best->wall_ms && f->signal && !best->signal))
                best = f;
        }
    return best;
}

static void print_failure(const char *label, const dtrun_failure *f) {
    char how[80], when[48];
    dt_procs_describe_end(f->exit_code, f->signal, how, sizeof how);
    dtrun_format_time(f->wall_ms, when, sizeof when);
    dtrun_say("%s: rank %d (local rank %d on node %d, host %s, pid %d) %s at %s", label, f->rank,
              f->local_rank, f->node, f->host, f->pid, how, when);
}

void dtrun_print_summary(const dtrun_report *reports, int nreports, int attempt, int max_restarts,
                         bool restarting, const char *log_dir) {
    const dtrun_failure *root = dtrun_root_cause(reports, nreports);
    const char          *bar  = "==========================================================";
    dtrun_say("%s", bar);
    char next[96];
    if (restarting)
        snprintf(next, sizeof next, "restarting the group (restart %d of %d)", attempt + 1,
                 max_restarts);
    else if (attempt >= max_restarts && max_restarts > 0)
        snprintf(next, sizeof next, "no restarts left (--max-restarts %d)", max_restarts);
    else
        snprintf(next, sizeof next, "the job stops");
    dtrun_say("job %s in attempt %d (restart count %d); %s", root ? "failed" : "stopped",
              attempt + 1, attempt, next);
    for (int i = 0; i < nreports; i++) {
        const dtrun_report *rp   = &reports[i];
        const char         *what = rp->reason[0] ? rp->reason : NULL;
        if (!what && rp->missing)
            what = "sent no report (lost, or it cannot reach the store)";
        if (what && rp->where[0])
            dtrun_say("node %d (%s): %s", rp->node, rp->where, what);
        else if (what)
            dtrun_say("node %d: %s", rp->node, what);
    }
    if (root) {
        print_failure("root cause", root);
        if (root->nlines) {
            dtrun_say("last lines of rank %d:", root->rank);
            for (int i = 0; i < root->nlines; i++)
                dtrun_say("  | %s", root->lines[i]);
        } else {
            dtrun_say("rank %d wrote nothing", root->rank);
        }
        if (log_dir)
            dtrun_say("its whole output: %s/attempt_%d/rank_%d.log (on node %d)", log_dir, attempt,
                      root->rank, root->node);
        for (int i = 0; i < nreports; i++)
            for (int j = 0; j < reports[i].nfail; j++) {
                const dtrun_failure *f = &reports[i].fail[j];
                if (f == root)
                    continue;
                print_failure("also failed", f);
                if (f->nlines)
                    dtrun_say("  | %s", f->lines[f->nlines - 1]);
            }
    }
    dtrun_say("%s", bar);
}
