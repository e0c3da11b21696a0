// test_dnnl.c: oneDNN's convolution rows (kernels/dnnl, conv_ext_*), where dtrain is built
// with oneDNN and the CPU has AVX2: forward, input gradient and weight and bias gradients
// against a direct convolution in double, within L u M (L the reduction's length, M the
// sum of its terms' magnitudes; u = 2^-24); the split promise (a sample's output and
// input gradient in a call of its own give the bits of the whole call); the shapes the
// rows take and decline; and the entry points (nn/ops.h) routing to them. Elsewhere it
// has nothing to test and says so.
#include "targets.h"

#include "nn/ops.h"

#include <math.h>

typedef struct conv_case {
    dt_kconv p;
    int      n, h, w, ho, wo;
} conv_case;

static size_t xs(const conv_case *c) {
    return (size_t)c->p.cin * c->h * c->w;
}
static size_t ys(const conv_case *c) {
    return (size_t)c->p.cout * c->ho * c->wo;
}
static size_t ws(const conv_case *c) {
    return (size_t)c->p.cout * c->p.cin * 9;
}

// x's value at (s, ci, i, j) with zero padding, and whether it is inside
static bool at(const conv_case *c, const float *x, int s, int ci, int i, int j, double *v) {
    if (i < 0 || j < 0 || i >= c->h || j >= c->w)
        return false;
    *v = x[(((size_t)s * c->p.cin + ci) * c->h + i) * c->w + j];
    return true;
}

// The direct convolution in double: y (and |terms| sums ym), dx (dxm), dw (dwm), db.
static void direct(const conv_case *c, const float *x, const float *wt, const float *b,
                   const float *dy, double *y, double *ym, double *dx, double *dxm, double *dw,
                   double *dwm, double *db) {
    const dt_kconv *p = &c->p;
    memset(dx, 0, sizeof(double) * xs(c) * c->n), memset(dxm, 0, sizeof(double) * xs(c) * c->n);
    memset(dw, 0, sizeof(double) * ws(c)), memset(dwm, 0, sizeof(double) * ws(c));
    memset(db, 0, sizeof(double) * p->cout);
    for (int s = 0; s < c->n; s++)
        for (int o = 0; o < p->cout; o++)
            for (int i = 0; i < c->ho; i++)
                for (int j = 0; j < c->wo; j++) {
                    size_t yi  = (((size_t)s * p->cout + o) * c->ho + i) * c->wo + j;
                    double acc = p->bias ? b[o] : 0, mag = p->bias ? fabs(b[o]) : 0, g = dy[yi];
                    db[o] += g;
                    for (int ci = 0; ci < p->cin; ci++)
                        for (int ki = 0; ki < 3; ki++)
                            for (int kj = 0; kj < 3; kj++) {
                                int    r = i * p->sh - p->ph + ki, q = j * p->sw - p->pw + kj;
                                size_t wi = (((size_t)o * p->cin + ci) * 3 + ki) * 3 + kj;
                                double v;
                                if (!at(c, x, s, ci, r, q, &v))
                                    continue;
                                acc += v * wt[wi], mag += fabs(v * wt[wi]);
                                dw[wi] += g * v, dwm[wi] += fabs(g * v);
                                size_t xi = (((size_t)s * p->cin + ci) * c->h + r) * c->w + q;
                                dx[xi] += g * wt[wi], dxm[xi] += fabs(g * wt[wi]);
                            }
                    y[yi] = acc, ym[yi] = mag;
                }
}

// |a - ref| <= 4 L u mag + 1e-30, element by element
static bool close_to(const char *what, const float *a, const double *ref, const double *mag,
                     size_t n, double L) {
    for (size_t i = 0; i < n; i++)
        if (!(fabs(a[i] - ref[i]) <= 4 * L * U * mag[i] + 1e-30)) {
            fprintf(stderr, "     %s[%zu]: %.9g, expected %.9g (bound %.3g)\n", what, i, a[i],
                    ref[i], 4 * L * U * mag[i]);
            return CHECK(false);
        }
    return CHECK(true);
}

static void one_case(const dt_ktab *t, dt_kconv p, int n, int h, int w) {
    conv_case c  = {p, n, h, w, (h + 2 * p.ph - 3) / p.sh + 1, (w + 2 * p.pw - 3) / p.sw + 1};
    size_t    nx = xs(&c) * n, ny = ys(&c) * n, nw = ws(&c);
    float    *x = kt_floats(nx, -1, 1), *wt = kt_floats(nw, -1, 1), *b = kt_floats(p.cout, -1, 1);
    float    *dy = kt_floats(ny, -1, 1), *y = kt_floats(ny, 0, 0), *dx = kt_floats(nx, 0, 0);
    float    *dw = kt_floats(nw, 0, 0), *db = kt_floats(p.cout, 0, 0);
    double   *ry = malloc(sizeof(double) * ny), *rym = malloc(sizeof(double) * ny);
    double   *rdx = malloc(sizeof(double) * nx), *rdxm = malloc(sizeof(double) * nx);
    double   *rdw = malloc(sizeof(double) * nw), *rdwm = malloc(sizeof(double) * nw);
    double   *rdb = malloc(sizeof(double) * p.cout), *rdbm = malloc(sizeof(double) * p.cout);
    direct(&c, x, wt, b, dy, ry, rym, rdx, rdxm, rdw, rdwm, rdb);
    for (int o = 0; o < p.cout; o++) { // the bias gradient's magnitudes
        rdbm[o] = 0;
        for (int s = 0; s < n; s++)
            for (int q = 0; q < c.ho * c.wo; q++)
                rdbm[o] += fabs(dy[((size_t)s * p.cout + o) * c.ho * c.wo + q]);
    }
    CHECK(t->conv_ext_fwd(&p, n, h, w, x, wt, b, y));
    close_to("y", y, ry, rym, ny, p.cin * 9 + 1);
    // dx written, dw and db added to: start them at 1 and take the 1 off
    for (size_t i = 0; i < nw; i++)
        dw[i] = 1;
    for (int o = 0; o < p.cout; o++)
        db[o] = 1;
    CHECK(t->conv_ext_bwd(&p, n, h, w, x, wt, dy, dx, dw, db));
    for (size_t i = 0; i < nw; i++)
        dw[i] -= 1, rdwm[i] += 1;
    for (int o = 0; o < p.cout; o++)
        db[o] -= 1, rdbm[o] += 1;
    close_to("dx", dx, rdx, rdxm, nx, p.cout * 9);
    close_to("dw", dw, rdw, rdwm, nw, n * c.ho * c.wo + 2);
    if (p.bias)
        close_to("db", db, rdb, rdbm, p.cout, n * c.ho * c.wo + 2);
    // the split promise: each sample alone gives the whole call's bits
    float *y1 = kt_floats(ys(&c), 0, 0), *dx1 = kt_floats(xs(&c), 0, 0);
    float *dw1 = kt_floats(nw, 0, 0), *db1 = kt_floats(p.cout, 0, 0);
    bool   same_y = true, same_dx = true;
    for (int s = 0; s < n; s++) {
        CHECK(t->conv_ext_fwd(&p, 1, h, w, x + s * xs(&c), wt, b, y1));
        same_y = same_y && !memcmp(y1, y + s * ys(&c), sizeof(float) * ys(&c));
        CHECK(t->conv_ext_bwd(&p, 1, h, w, x + s * xs(&c), wt, dy + s * ys(&c), dx1, dw1, db1));
        same_dx = same_dx && !memcmp(dx1, dx + s * xs(&c), sizeof(float) * xs(&c));
    }
    CHECK(same_y);
    CHECK(same_dx);
    close_to("dw per sample", dw1, rdw, rdwm, nw, n * c.ho * c.wo + 2);
    // the entry points take the rows where dt_k() has them (DT_ISA unset or avx2 up)
    if (dt_k()->conv_ext_fwd == t->conv_ext_fwd && t->conv_ext_ok(&p, w, false)) {
        char name[96];
        CHECK(strstr(dt_nn_conv2d_kernel(&p, w, false, false, name, sizeof name), "onednn"));
        float *y2 = kt_floats(ny, 0, 0), *s = kt_floats(dt_nn_conv2d_scratch(&p, h, w), 0, 0);
        dt_nn_conv2d_forward(&p, n, h, w, x, wt, b, y2, s);
        kt_same("dt_nn_conv2d_forward", y2, y, sizeof(float) * ny);
        free(y2), free(s);
    }
    float *all[] = {x, wt, b, dy, y, dx, dw, db, y1, dx1, dw1, db1};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        free(all[i]);
    double *alld[] = {ry, rym, rdx, rdxm, rdw, rdwm, rdb, rdbm};
    for (size_t i = 0; i < sizeof alld / sizeof alld[0]; i++)
        free(alld[i]);
}

static const dt_ktab *T; // the avx2 target's rows

static void test_rows(void) {
    const dt_ktab *t = T;
    one_case(t, (dt_kconv){16, 32, 3, 3, 1, 1, 0, 0, 1, true}, 3, 10, 9);
    one_case(t, (dt_kconv){32, 16, 3, 3, 2, 2, 1, 1, 1, false}, 2, 9, 9);
    one_case(t, (dt_kconv){16, 16, 3, 3, 1, 1, 1, 1, 1, false}, 4, 7, 7);
    // more samples than a chunk (16) and a remainder: chunks and single samples in one call
    one_case(t, (dt_kconv){16, 32, 3, 3, 2, 2, 1, 1, 1, true}, 19, 6, 6);
}

static void test_declined(void) {
    const dt_ktab *t = T;
    dt_kconv stem = {1, 16, 3, 3, 1, 1, 1, 1, 1, false}, one = {16, 32, 1, 1, 2, 2, 0, 0, 1, false};
    dt_kconv grouped = {16, 16, 3, 3, 1, 1, 1, 1, 2, false};
    CHECK(!t->conv_ext_ok(&stem, 28, false) && !t->conv_ext_ok(&stem, 28, true));
    CHECK(!t->conv_ext_ok(&one, 28, false) && !t->conv_ext_ok(&one, 28, true));
    CHECK(!t->conv_ext_ok(&grouped, 28, false));
    // taken: stride 2 both ways; stride 1 backward from 32 input channels
    dt_kconv s2 = {16, 32, 3, 3, 2, 2, 1, 1, 1, false}, s1 = {16, 16, 3, 3, 1, 1, 1, 1, 1, false};
    dt_kconv s1w = {32, 32, 3, 3, 1, 1, 1, 1, 1, false};
    CHECK(t->conv_ext_ok(&s2, 28, false) && t->conv_ext_ok(&s2, 28, true));
    CHECK(!t->conv_ext_ok(&s1, 28, false) && !t->conv_ext_ok(&s1, 28, true));
    CHECK(!t->conv_ext_ok(&s1w, 14, false) && t->conv_ext_ok(&s1w, 14, true));
}

// DT_CONV_DNNL: unset means on, 0 turns the rows off, 1 on
static void test_setting(void) {
    const dt_ktab *t  = T;
    dt_kconv       s2 = {16, 32, 3, 3, 2, 2, 1, 1, 1, false};
    unsetenv("DT_CONV_DNNL");
    CHECK(t->conv_ext_ok(&s2, 28, false) && t->conv_ext_ok(&s2, 28, true));
    setenv("DT_CONV_DNNL", "0", 1);
    CHECK(!t->conv_ext_ok(&s2, 28, false) && !t->conv_ext_ok(&s2, 28, true));
    setenv("DT_CONV_DNNL", "1", 1);
    CHECK(t->conv_ext_ok(&s2, 28, false) && t->conv_ext_ok(&s2, 28, true));
}

int main(void) {
    setenv("DT_CONV_DNNL", "1", 1); // the rows' own choice of shapes, whatever the caller's
    const dt_ktab *t = dt_ktab_only(DT_ISA_AVX2);
    if (!t || !t->conv_ext_fwd) {
        printf("# no oneDNN rows here (built without oneDNN, or no AVX2): nothing to test\n");
        return check_summary();
    }
    char line[96];
    printf("# %s\n", dt_krow_describe(t, DT_KROW_conv_ext_fwd, line, sizeof line));
    const dt_ktab *top = dt_ktab_get(DT_KDEV_HOST, (dt_isa)(DT_ISA_COUNT_ - 1));
    if (dt_cpu_get()->has[DT_ISA_AVX512]) // taken out where not measured
        CHECK(top->conv_ext_fwd == NULL);
    T = t;
    RUN(test_rows);
    RUN(test_declined);
    RUN(test_setting);
    return check_summary();
}
