// The progress display (include/dtrain/watch.h): a bar redrawn in place on a terminal,
// the seed's periodic log lines elsewhere (pipes, files, CI logs).
#include "dtrain/comm.h"
#include "dtrain/watch.h"

#include <math.h>
#include <string.h>
#include <unistd.h>

struct dt_progress {
    dt_progress_opts o;
    bool             bar;
    long             epoch;
    size_t           total;
    double           start, last_draw;
    size_t           steps, items; // since the epoch began
    bool             drawn;        // a bar line is open (needs a newline)
};

dt_progress_opts dt_progress_opts_default(void) {
    dt_progress_opts o = {.out          = NULL,
                          .bar          = -1,
                          .min_redraw_s = 0.1,
                          .log_every    = 10,
                          .unit         = "samples",
                          .width        = 30};
    return o;
}

// Auto mode draws a bar only on a terminal, and not under mpirun or srun: their
// output forwarding gives each rank a pseudo-terminal even when the job's output goes
// to a file or a pipe, where the seed's plain lines are what readers (and log
// scrapers) expect.
static bool auto_bar(FILE *out) {
    if (isatty(fileno(out)) != 1)
        return false;
    dt_launch_env env;
    if (dt_launch_env_read(&env) != DT_OK) {
        dt_clear_error();
        return false;
    }
    return !env.is_mpi;
}

dt_status dt_progress_new(dt_progress **out, const dt_progress_opts *opts) {
    *out               = NULL;
    dt_progress_opts o = opts ? *opts : dt_progress_opts_default();
    if (o.log_every < 1)
        return dt_fail(DT_ERR_ARG, "progress: expected log_every >= 1, found %ld", o.log_every);
    if (o.width < 1 || o.width > 200)
        return dt_fail(DT_ERR_ARG, "progress: expected a bar width in [1, 200], found %d", o.width);
    if (!(o.min_redraw_s >= 0))
        return dt_fail(DT_ERR_ARG, "progress: expected min_redraw_s >= 0, found %g",
                       o.min_redraw_s);
    if (o.bar < -1 || o.bar > 1)
        return dt_fail(DT_ERR_ARG, "progress: expected bar -1 (auto), 0 or 1, found %d", o.bar);
    if (!o.out)
        o.out = stdout;
    if (!o.unit || !o.unit[0])
        o.unit = "samples";
    dt_progress *p = dt_alloc_zero(sizeof *p);
    if (!p)
        return dt_fail_context("progress");
    p->o   = o;
    p->bar = o.bar == -1 ? auto_bar(o.out) : o.bar == 1;
    *out   = p;
    return DT_OK;
}

void dt_progress_free(dt_progress *p) {
    if (!p)
        return;
    dt_progress_end_epoch(p);
    dt_free(p);
}

bool dt_progress_is_bar(const dt_progress *p) {
    return p->bar;
}

void dt_progress_begin_epoch(dt_progress *p, long epoch, size_t total) {
    if (!p)
        return;
    dt_progress_end_epoch(p);
    p->epoch     = epoch;
    p->total     = total;
    p->start     = dt_now();
    p->last_draw = -1e30;
    p->steps     = 0;
    p->items     = 0;
}

static void fmt_duration(char *buf, size_t n, double s) {
    if (!isfinite(s) || s < 0) {
        snprintf(buf, n, "?");
        return;
    }
    long t = (long)(s + 0.5);
    if (t >= 3600)
        snprintf(buf, n, "%ld:%02ld:%02ld", t / 3600, t / 60 % 60, t % 60);
    else
        snprintf(buf, n, "%ld:%02ld", t / 60, t % 60);
}

static void draw(dt_progress *p, size_t index, double loss, double now) {
    size_t done = index + 1 < p->total ? index + 1 : p->total;
    double frac = p->total ? (double)done / (double)p->total : 1.0;
    int    fill = (int)(frac * p->o.width + 1e-9);
    char   cells[204];
    for (int i = 0; i < p->o.width; i++)
        cells[i] = i < fill ? '#' : '.';
    cells[p->o.width] = 0;
    double el         = now - p->start;
    double rate       = el > 0 ? (double)p->items / el : 0.0;
    double eta =
        p->steps && p->total > done ? el / (double)p->steps * (double)(p->total - done) : 0.0;
    char eta_s[32];
    fmt_duration(eta_s, sizeof eta_s, eta);
    // \r back to the line's start, \033[K clears what a longer earlier line left.
    fprintf(p->o.out, "\repoch %ld [%s] %zu/%zu %3.0f%%  %.0f %s/s  ETA %s  loss %.4f\033[K",
            p->epoch, cells, done, p->total, 100.0 * frac, rate, p->o.unit, eta_s, loss);
    fflush(p->o.out);
    p->drawn     = true;
    p->last_draw = now;
}

void dt_progress_step(dt_progress *p, size_t index, size_t items, double loss) {
    if (!p)
        return;
    p->steps++;
    p->items += items;
    if (!p->bar) {
        if (index % (size_t)p->o.log_every == 0) {
            fprintf(p->o.out, "epoch: %ld [%zu/%zu (%.0f%%)]\t training loss: %.6f\n", p->epoch,
                    index, p->total, p->total ? 100.0 * (double)index / (double)p->total : 0.0,
                    loss);
            fflush(p->o.out);
        }
        return;
    }
    double now = dt_now();
    if (now - p->last_draw >= p->o.min_redraw_s || index + 1 >= p->total)
        draw(p, index, loss, now);
}

void dt_progress_end_epoch(dt_progress *p) {
    if (!p)
        return;
    if (p->bar && p->drawn) {
        fputc('\n', p->o.out);
        fflush(p->o.out);
    }
    p->drawn = false;
}
