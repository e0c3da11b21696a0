// Loss curves as an SVG chart (include/dtrain/watch.h): a linear x axis (steps) and y
// axis (loss) with ticks at nice numbers, light grid lines, tick labels, axis labels,
// a title, the training curve as a line, validation losses as marked points joined by
// a dashed line, and a legend in the plot's top-right corner. Plain SVG 1.1: any
// browser, Inkscape or rsvg-convert shows it.
#include "dtrain/watch.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MARGIN_L 78
#define MARGIN_R 24
#define MARGIN_T 44
#define MARGIN_B 58

static const char *const series_color[DT_PLOT_SERIES_COUNT_] = {"#1f77b4", "#ff7f0e"};
static const char *const series_name[DT_PLOT_SERIES_COUNT_]  = {"train", "validation"};

typedef struct series {
    double *x, *y;
    size_t  n, cap;
} series;

struct dt_plot {
    dt_plot_opts o;
    char        *title, *x_label, *y_label;
    series       s[DT_PLOT_SERIES_COUNT_];
};

dt_plot_opts dt_plot_opts_default(void) {
    dt_plot_opts o = {
        .width = 720, .height = 420, .title = "Loss", .x_label = "step", .y_label = "loss"};
    return o;
}

void dt_plot_free(dt_plot *p) {
    if (!p)
        return;
    for (int i = 0; i < DT_PLOT_SERIES_COUNT_; i++) {
        dt_free(p->s[i].x);
        dt_free(p->s[i].y);
    }
    dt_free(p->title);
    dt_free(p->x_label);
    dt_free(p->y_label);
    dt_free(p);
}

dt_status dt_plot_new(dt_plot **out, const dt_plot_opts *opts) {
    *out           = NULL;
    dt_plot_opts o = opts ? *opts : dt_plot_opts_default();
    if (o.width < 200 || o.width > 10000 || o.height < 150 || o.height > 10000)
        return dt_fail(DT_ERR_ARG,
                       "plot: expected a size within 200..10000 x 150..10000 pixels, found %d x %d",
                       o.width, o.height);
    dt_plot *p = dt_alloc_zero(sizeof *p);
    if (!p)
        return dt_fail_context("plot");
    p->o       = o;
    p->title   = dt_strdup(o.title ? o.title : "");
    p->x_label = dt_strdup(o.x_label ? o.x_label : "");
    p->y_label = dt_strdup(o.y_label ? o.y_label : "");
    if (!p->title || !p->x_label || !p->y_label) {
        dt_plot_free(p);
        return dt_fail_context("plot");
    }
    *out = p;
    return DT_OK;
}

dt_status dt_plot_add(dt_plot *p, dt_plot_series s, double x, double y) {
    if ((unsigned)s >= DT_PLOT_SERIES_COUNT_)
        return dt_fail(DT_ERR_ARG, "plot: expected DT_PLOT_TRAIN or DT_PLOT_VAL, found %d", (int)s);
    if (!isfinite(x) || !isfinite(y))
        return dt_fail(DT_ERR_ARG, "plot: expected finite coordinates, found (%g, %g) for %s", x, y,
                       series_name[s]);
    series *se = &p->s[s];
    if (se->n == se->cap) {
        size_t  cap = se->cap ? se->cap * 2 : 256;
        double *nx = dt_alloc(sizeof(double) * cap), *ny = dt_alloc(sizeof(double) * cap);
        if (!nx || !ny) {
            dt_free(nx);
            dt_free(ny);
            return dt_fail_context("plot: %zu points", cap);
        }
        if (se->n) {
            memcpy(nx, se->x, sizeof(double) * se->n);
            memcpy(ny, se->y, sizeof(double) * se->n);
        }
        dt_free(se->x);
        dt_free(se->y);
        se->x   = nx;
        se->y   = ny;
        se->cap = cap;
    }
    se->x[se->n] = x;
    se->y[se->n] = y;
    se->n++;
    return DT_OK;
}

double dt_plot_nice_step(double span, int target) {
    if (!(span > 0) || !isfinite(span) || target < 1)
        return 1.0;
    double raw = span / target;
    double mag = pow(10.0, floor(log10(raw)));
    double f   = raw / mag;
    double n   = f <= 1.0 ? 1.0 : f <= 2.0 ? 2.0 : f <= 2.5 ? 2.5 : f <= 5.0 ? 5.0 : 10.0;
    return n * mag;
}

typedef struct axis {
    double lo, hi, step;
    int    decimals;
} axis;

// A range [lo, hi] widened to multiples of a nice step, about `target` intervals.
static axis make_axis(double mn, double mx, int target) {
    if (mn > mx) { // no data
        mn = 0;
        mx = 1;
    }
    if (mx - mn < 1e-12 * (fabs(mx) + 1)) { // one value: a unit-wide window around it
        double pad = fabs(mx) > 0 ? fabs(mx) * 0.1 : 0.5;
        mn -= pad;
        mx += pad;
    }
    axis a;
    a.step = dt_plot_nice_step(mx - mn, target);
    a.lo   = floor(mn / a.step + 1e-9) * a.step;
    a.hi   = ceil(mx / a.step - 1e-9) * a.step;
    // Digits after the point that show the step exactly (0.25 needs one more than 0.2).
    double e   = floor(log10(a.step) + 1e-9);
    double d   = -e + (fabs(a.step / pow(10.0, e) - 2.5) < 1e-9 ? 1 : 0);
    a.decimals = d > 0 ? (int)d : 0;
    if (a.decimals > 12)
        a.decimals = 12;
    return a;
}

static void xml_text(FILE *f, const char *s) {
    for (; *s; s++) {
        switch (*s) {
        case '<':
            fputs("&lt;", f);
            break;
        case '>':
            fputs("&gt;", f);
            break;
        case '&':
            fputs("&amp;", f);
            break;
        case '"':
            fputs("&quot;", f);
            break;
        default:
            if ((unsigned char)*s >= 0x20 || *s == '\t')
                fputc(*s, f);
        }
    }
}

static void tick_label(char *buf, size_t n, double v, int decimals) {
    if (fabs(v) < 1e-12)
        v = 0; // no "-0"
    if (fabs(v) >= 1e6 || (v != 0 && fabs(v) < 1e-4))
        snprintf(buf, n, "%.3g", v);
    else
        snprintf(buf, n, "%.*f", decimals, v);
}

static void write_chart(const dt_plot *p, FILE *f) {
    int    W = p->o.width, H = p->o.height;
    double x0 = MARGIN_L, x1 = W - MARGIN_R, y0 = MARGIN_T, y1 = H - MARGIN_B; // plot box
    double xmn = INFINITY, xmx = -INFINITY, ymn = INFINITY, ymx = -INFINITY;
    for (int s = 0; s < DT_PLOT_SERIES_COUNT_; s++)
        for (size_t i = 0; i < p->s[s].n; i++) {
            xmn = fmin(xmn, p->s[s].x[i]);
            xmx = fmax(xmx, p->s[s].x[i]);
            ymn = fmin(ymn, p->s[s].y[i]);
            ymx = fmax(ymx, p->s[s].y[i]);
        }
    axis ax = make_axis(xmn, xmx, 8), ay = make_axis(ymn, ymx, 6);
#define PX(v) (x0 + ((v)-ax.lo) / (ax.hi - ax.lo) * (x1 - x0))
#define PY(v) (y1 - ((v)-ay.lo) / (ay.hi - ay.lo) * (y1 - y0))
    fprintf(f,
            "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" "
            "viewBox=\"0 0 %d %d\" font-family=\"sans-serif\" font-size=\"12\">\n"
            "<rect width=\"100%%\" height=\"100%%\" fill=\"#ffffff\"/>\n",
            W, H, W, H);
    // Grid and ticks.
    char lab[64];
    fprintf(f, "<g stroke=\"#e4e4e4\" stroke-width=\"1\">\n");
    int nx = (int)floor((ax.hi - ax.lo) / ax.step + 0.5),
        ny = (int)floor((ay.hi - ay.lo) / ay.step + 0.5);
    for (int i = 0; i <= nx; i++)
        fprintf(f, "<line x1=\"%.2f\" y1=\"%.2f\" x2=\"%.2f\" y2=\"%.2f\"/>\n",
                PX(ax.lo + i * ax.step), y0, PX(ax.lo + i * ax.step), y1);
    for (int i = 0; i <= ny; i++)
        fprintf(f, "<line x1=\"%.2f\" y1=\"%.2f\" x2=\"%.2f\" y2=\"%.2f\"/>\n", x0,
                PY(ay.lo + i * ay.step), x1, PY(ay.lo + i * ay.step));
    fprintf(f, "</g>\n<g stroke=\"#000000\" stroke-width=\"1\">\n");
    for (int i = 0; i <= nx; i++)
        fprintf(f, "<line x1=\"%.2f\" y1=\"%.2f\" x2=\"%.2f\" y2=\"%.2f\"/>\n",
                PX(ax.lo + i * ax.step), y1, PX(ax.lo + i * ax.step), y1 + 5);
    for (int i = 0; i <= ny; i++)
        fprintf(f, "<line x1=\"%.2f\" y1=\"%.2f\" x2=\"%.2f\" y2=\"%.2f\"/>\n", x0 - 5,
                PY(ay.lo + i * ay.step), x0, PY(ay.lo + i * ay.step));
    fprintf(f, "</g>\n<g fill=\"#000000\">\n");
    for (int i = 0; i <= nx; i++) {
        tick_label(lab, sizeof lab, ax.lo + i * ax.step, ax.decimals);
        fprintf(f, "<text x=\"%.2f\" y=\"%.2f\" text-anchor=\"middle\">%s</text>\n",
                PX(ax.lo + i * ax.step), y1 + 19, lab);
    }
    for (int i = 0; i <= ny; i++) {
        tick_label(lab, sizeof lab, ay.lo + i * ay.step, ay.decimals);
        fprintf(f, "<text x=\"%.2f\" y=\"%.2f\" text-anchor=\"end\">%s</text>\n", x0 - 8,
                PY(ay.lo + i * ay.step) + 4, lab);
    }
    // Axis labels and title.
    fprintf(f, "<text x=\"%.2f\" y=\"%d\" text-anchor=\"middle\" font-size=\"13\">", (x0 + x1) / 2,
            H - 14);
    xml_text(f, p->x_label);
    fprintf(f,
            "</text>\n<text transform=\"translate(18 %.2f) rotate(-90)\" text-anchor=\"middle\" "
            "font-size=\"13\">",
            (y0 + y1) / 2);
    xml_text(f, p->y_label);
    fprintf(f,
            "</text>\n<text x=\"%.2f\" y=\"26\" text-anchor=\"middle\" font-size=\"15\" "
            "font-weight=\"bold\">",
            (x0 + x1) / 2);
    xml_text(f, p->title);
    fprintf(f, "</text>\n</g>\n");
    // The plot box.
    fprintf(f,
            "<rect x=\"%.2f\" y=\"%.2f\" width=\"%.2f\" height=\"%.2f\" fill=\"none\" "
            "stroke=\"#000000\" stroke-width=\"1\"/>\n",
            x0, y0, x1 - x0, y1 - y0);
    // The curves, clipped to the box.
    fprintf(f,
            "<clipPath id=\"box\"><rect x=\"%.2f\" y=\"%.2f\" width=\"%.2f\" height=\"%.2f\"/>"
            "</clipPath>\n<g clip-path=\"url(#box)\">\n",
            x0, y0, x1 - x0, y1 - y0);
    for (int s = 0; s < DT_PLOT_SERIES_COUNT_; s++) {
        const series *se = &p->s[s];
        if (se->n == 0)
            continue;
        fprintf(f,
                "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"%s\" "
                "stroke-linejoin=\"round\"%s points=\"",
                series_color[s], s == DT_PLOT_TRAIN ? "1.5" : "1.2",
                s == DT_PLOT_VAL ? " stroke-dasharray=\"5 4\"" : "");
        for (size_t i = 0; i < se->n; i++)
            fprintf(f, "%s%.2f,%.2f", i ? " " : "", PX(se->x[i]), PY(se->y[i]));
        fprintf(f, "\"/>\n");
        if (s == DT_PLOT_VAL || se->n == 1)
            for (size_t i = 0; i < se->n; i++)
                fprintf(f, "<circle cx=\"%.2f\" cy=\"%.2f\" r=\"4\" fill=\"%s\"/>\n", PX(se->x[i]),
                        PY(se->y[i]), series_color[s]);
    }
    fprintf(f, "</g>\n");
    // Legend: top-right corner of the box.
    double lx = x1 - 130, ly = y0 + 10;
    fprintf(f,
            "<g><rect x=\"%.2f\" y=\"%.2f\" width=\"120\" height=\"46\" fill=\"#ffffff\" "
            "stroke=\"#999999\" stroke-width=\"1\"/>\n",
            lx, ly);
    for (int s = 0; s < DT_PLOT_SERIES_COUNT_; s++) {
        double yy = ly + 15 + 17 * s;
        fprintf(f,
                "<line x1=\"%.2f\" y1=\"%.2f\" x2=\"%.2f\" y2=\"%.2f\" stroke=\"%s\" "
                "stroke-width=\"2\"%s/>\n",
                lx + 8, yy, lx + 36, yy, series_color[s],
                s == DT_PLOT_VAL ? " stroke-dasharray=\"5 4\"" : "");
        if (s == DT_PLOT_VAL)
            fprintf(f, "<circle cx=\"%.2f\" cy=\"%.2f\" r=\"4\" fill=\"%s\"/>\n", lx + 22, yy,
                    series_color[s]);
        fprintf(f, "<text x=\"%.2f\" y=\"%.2f\">%s</text>\n", lx + 44, yy + 4, series_name[s]);
    }
    fprintf(f, "</g>\n</svg>\n");
#undef PX
#undef PY
}

dt_status dt_plot_write_svg(const dt_plot *p, const char *path) {
    char tmp[4096];
    int  k = snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid());
    if (k < 0 || (size_t)k >= sizeof tmp)
        return dt_fail(DT_ERR_ARG, "plot: expected a path under %zu bytes, found %zu bytes",
                       sizeof tmp - 16, strlen(path));
    FILE *f = fopen(tmp, "w");
    if (!f)
        return dt_fail_errno(DT_ERR_IO, "plot: cannot create %s", tmp);
    write_chart(p, f);
    bool bad = ferror(f) != 0;
    if (fclose(f) != 0 || bad) {
        unlink(tmp);
        return dt_fail_errno(DT_ERR_IO, "plot: writing %s", tmp);
    }
    if (rename(tmp, path) != 0) {
        unlink(tmp);
        return dt_fail_errno(DT_ERR_IO, "plot: renaming %s to %s", tmp, path);
    }
    return DT_OK;
}
