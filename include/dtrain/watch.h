// watch.h: training you can watch. A progress bar on a terminal (plain log lines
// elsewhere) and loss curves as an SVG chart. The Chrome trace is in trace.h.
//
//     dt_progress *bar;
//     dt_progress_new(&bar, NULL);                 // stdout; a bar on a terminal (lines under
//     mpirun/srun) for (epoch...) {
//         dt_progress_begin_epoch(bar, epoch, nbatches);
//         for (batch...) { ...; dt_progress_step(bar, b.index, b.size, loss); }
//         dt_progress_end_epoch(bar);
//     }
//     dt_progress_free(bar);
//
//     dt_plot *plot;
//     dt_plot_new(&plot, NULL);
//     dt_plot_add(plot, DT_PLOT_TRAIN, step, loss);  // per logged step
//     dt_plot_add(plot, DT_PLOT_VAL, step, val_loss); // per evaluation
//     dt_plot_write_svg(plot, "loss.svg");
//     dt_plot_free(plot);
#ifndef DTRAIN_WATCH_H
#define DTRAIN_WATCH_H

#include "dtrain/core.h"

#ifdef __cplusplus
extern "C" {
#endif

// ------------------------------------------------------------------------- progress

typedef struct dt_progress dt_progress;

typedef struct dt_progress_opts {
    FILE       *out;          // where it prints; NULL = stdout
    int         bar;          // -1 = a bar when out is a terminal (default), 0 = lines, 1 = bar
    double      min_redraw_s; // a bar redraws at most this often (default 0.1 s: 10 Hz)
    long        log_every;    // lines: one every this many batches (default 10)
    const char *unit;         // what a step's count counts: "samples" (default), "tokens"
    int         width;        // bar cells (default 30)
} dt_progress_opts;

DT_API dt_progress_opts dt_progress_opts_default(void);

DT_API dt_status dt_progress_new(dt_progress **out, const dt_progress_opts *opts);
DT_API void      dt_progress_free(dt_progress *p);
// The calls below do nothing on a NULL progress (what ranks other than 0 hold).
// True when it draws a bar (rather than lines).
DT_API bool dt_progress_is_bar(const dt_progress *p);

// An epoch of `total` batches begins (resets the rate and the ETA).
DT_API void dt_progress_begin_epoch(dt_progress *p, long epoch, size_t total);
// Batch `index` (0-based within the epoch, as dt_batch.index) of `items` samples or
// tokens finished with training loss `loss`. Lines: on every log_every-th index,
//   "epoch: E [i/N (P%)]\t training loss: L" (the seed's format, which tests parse).
// Bar: "\r" and the bar redrawn at most every min_redraw_s, and at the last batch:
//   "epoch E [######....]  i/N  P%  R samples/s  ETA m:ss  loss L".
DT_API void dt_progress_step(dt_progress *p, size_t index, size_t items, double loss);
// Ends the epoch's bar with a newline (nothing for lines).
DT_API void dt_progress_end_epoch(dt_progress *p);

// ---------------------------------------------------------------------- loss curves

typedef struct dt_plot dt_plot;

typedef enum dt_plot_series { DT_PLOT_TRAIN, DT_PLOT_VAL, DT_PLOT_SERIES_COUNT_ } dt_plot_series;

typedef struct dt_plot_opts {
    int         width, height; // pixels (default 720 x 420)
    const char *title;         // default "Loss"
    const char *x_label;       // default "step"
    const char *y_label;       // default "loss"
} dt_plot_opts;

DT_API dt_plot_opts dt_plot_opts_default(void);

DT_API dt_status dt_plot_new(dt_plot **out, const dt_plot_opts *opts);
DT_API void      dt_plot_free(dt_plot *p);
// Adds a point (x: step or epoch; y: loss). Non-finite values: DT_ERR_ARG.
DT_API dt_status dt_plot_add(dt_plot *p, dt_plot_series s, double x, double y);
// Writes the chart: axes with ticks at nice numbers and their labels, the axis labels,
// the title, the training curve as a line, validation as marked points, and a legend.
// Written to a temporary file and renamed.
DT_API dt_status dt_plot_write_svg(const dt_plot *p, const char *path);

// The nice tick step for a range of `span` cut into about `target` intervals:
// 1, 2, 2.5 or 5 times a power of ten (exposed for tests).
DT_API double dt_plot_nice_step(double span, int target);

#ifdef __cplusplus
}
#endif

#endif // DTRAIN_WATCH_H
