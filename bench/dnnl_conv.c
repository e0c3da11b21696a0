// dnnl_conv.c: oneDNN's convolution (forward, backward-data, backward-weights) and inner
// product against dtrain's own kernels (nn/ops.h: dt_nn_conv2d_*, dt_nn_linear_*), one
// thread each, on the shapes of the seed ConvNet and of the ResNet, per call batch: 1 (a
// ResNet convolution's backward under gradient shards runs per sample), 16 (one gradient
// shard of a 128 batch: the ConvNet's fused convolution takes a shard's samples in one
// call) and 128 (the whole batch). It decided where oneDNN earns a place as a provider in
// the kernel table (issue 22: where it wins by 1.2x or more; kernels/dnnl): dtrain's side
// is its own kernels (DT_CONV_DNNL=0, set here).
//
//   make dnnl-bench                      (built only where oneDNN's headers are found)
//   OMP_NUM_THREADS=1 build/bin/dnnl-bench [--reps N] [--filter SUBSTRING]
//   DT_ISA=ref ... for dtrain's portable kernels
//
// Times are the thread's CPU time (the 2 vCPUs are shared): per case the median of --reps
// (5) timings, each a loop of calls lasting >= 20 ms after two warm-up calls. GFLOP/s =
// 2 x multiply-adds (the direct convolution's, whatever the algorithm) / time. oneDNN's
// primitives are created once per shape, with layouts left to oneDNN (format "any");
// dtrain keeps NCHW, so a provider would pay the reorders too: "dnnl" is the primitive
// alone, "dnnl+r" the primitive with the reorders of its inputs and outputs from and to
// NCHW / OIHW. dtrain's backward computes dw alone (dx NULL) or dx and dw together; its
// backward-data figure is the difference. Prints one line per (shape, batch, direction)
// with both times, GFLOP/s, the ratio dtrain / dnnl+r (> 1: oneDNN faster), oneDNN's
// implementation and dtrain's kernel, and the largest difference between the outputs
// relative to the largest output (a check that both computed the same thing).
#include "dtrain/nn.h"
#include "nn/ops.h"

#include <oneapi/dnnl/dnnl.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

void omp_set_num_threads(int n); // libgomp, which oneDNN is built on
int  omp_get_max_threads(void);

#define CHECK(call)                                                                                \
    do {                                                                                           \
        dnnl_status_t st_ = (call);                                                                \
        if (st_ != dnnl_success) {                                                                 \
            fprintf(stderr, "dnnl-bench: %s failed (status %d) at line %d\n", #call, (int)st_,     \
                    __LINE__);                                                                     \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

static dnnl_engine_t eng;
static dnnl_stream_t strm;
static int           reps = 5;

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static float *buf(size_t n, dt_rng *rng) {
    float *p = dt_alloc(sizeof(float) * (n ? n : 1));
    if (!p) {
        fprintf(stderr, "dnnl-bench: out of memory (%zu floats)\n", n);
        exit(1);
    }
    for (size_t i = 0; i < n; i++)
        p[i] = rng ? dt_rng_normal(rng) : 0.0f;
    return p;
}

// ------------------------------------------------------------------ oneDNN, one primitive

// One argument of a primitive: the caller's plain buffer and, when oneDNN wants another
// layout, its own memory and the reorder between them.
typedef struct parg {
    int              id;
    bool             out;
    dnnl_memory_t    user, prim;
    dnnl_primitive_t re;
} parg;

typedef struct prim {
    dnnl_primitive_desc_t pd;
    dnnl_primitive_t      p;
    int                   n;
    parg                  a[5];
    dnnl_exec_arg_t       ex[6];
    const char           *impl;
} prim;

// q, index: the query naming the primitive's layout (a bias is index 1 of the weights')
static void prim_arg(prim *pr, int id, dnnl_query_t q, int index, const dnnl_memory_desc_t *user_md,
                     float *data, bool out) {
    parg                     *a  = &pr->a[pr->n++];
    const dnnl_memory_desc_t *md = dnnl_primitive_desc_query_md(pr->pd, q, index);
    a->id = id, a->out = out, a->re = NULL;
    CHECK(dnnl_memory_create(&a->user, user_md, eng, data));
    if (dnnl_memory_desc_equal(md, user_md)) {
        a->prim = a->user;
        return;
    }
    CHECK(dnnl_memory_create(&a->prim, md, eng, DNNL_MEMORY_ALLOCATE));
    dnnl_primitive_desc_t rpd;
    CHECK(dnnl_reorder_primitive_desc_create(&rpd, out ? md : user_md, eng, out ? user_md : md, eng,
                                             NULL));
    CHECK(dnnl_primitive_create(&a->re, rpd));
    dnnl_primitive_desc_destroy(rpd);
}

static void prim_make(prim *pr, const void *op_desc, const_dnnl_primitive_desc_t hint) {
    memset(pr, 0, sizeof *pr);
    CHECK(dnnl_primitive_desc_create(&pr->pd, op_desc, NULL, eng, hint));
    CHECK(dnnl_primitive_create(&pr->p, pr->pd));
    CHECK(dnnl_primitive_desc_query(pr->pd, dnnl_query_impl_info_str, 0, &pr->impl));
}

static void prim_seal(prim *pr) {
    for (int i = 0; i < pr->n; i++)
        pr->ex[i] = (dnnl_exec_arg_t){pr->a[i].id, pr->a[i].prim};
}

static void reorder(const parg *a) {
    dnnl_exec_arg_t ex[2] = {{DNNL_ARG_FROM, a->out ? a->prim : a->user},
                             {DNNL_ARG_TO, a->out ? a->user : a->prim}};
    CHECK(dnnl_primitive_execute(a->re, strm, 2, ex));
}

static void prim_run(const prim *pr, bool reorders) {
    for (int i = 0; reorders && i < pr->n; i++)
        if (pr->a[i].re && !pr->a[i].out)
            reorder(&pr->a[i]);
    CHECK(dnnl_primitive_execute(pr->p, strm, pr->n, pr->ex));
    for (int i = 0; reorders && i < pr->n; i++)
        if (pr->a[i].re && pr->a[i].out)
            reorder(&pr->a[i]);
    CHECK(dnnl_stream_wait(strm));
}

static void prim_free(prim *pr) {
    for (int i = 0; i < pr->n; i++) {
        if (pr->a[i].re) {
            dnnl_primitive_destroy(pr->a[i].re);
            dnnl_memory_destroy(pr->a[i].prim);
        }
        dnnl_memory_destroy(pr->a[i].user);
    }
    dnnl_primitive_destroy(pr->p);
    dnnl_primitive_desc_destroy(pr->pd);
}

// ------------------------------------------------------------------ the cases

typedef struct shape {
    const char *name;
    int         cin, cout, k, s, p, hw; // convolution; k == 0: Linear cin -> cout
    bool        bias, dx;               // dx: the model wants the input gradient
} shape;

// The data of one (shape, batch) case: dtrain's and oneDNN's outputs are kept apart so
// that they can be compared.
typedef struct bufs {
    float *x, *w, *b, *dy;
    float *y, *dx, *dw, *db;     // dtrain's
    float *y1, *dx1, *dw1, *db1; // oneDNN's
    float *scratch;
} bufs;

typedef struct run_ctx {
    const shape *sh;
    int          n, ho, wo;
    bufs        *d;
    const prim  *pr;
    int          what; // 0 fwd, 1 bwd weights, 2 bwd data + weights (dtrain)
    bool         reorders;
} run_ctx;

static void run_dtrain(const run_ctx *c) {
    const shape *s = c->sh;
    bufs        *d = c->d;
    if (s->k == 0) {
        if (c->what == 0)
            dt_nn_linear_forward(c->n, s->cin, s->cout, d->x, d->w, s->bias ? d->b : NULL, d->y);
        else
            dt_nn_linear_backward(c->n, s->cin, s->cout, d->x, d->w, d->dy,
                                  c->what == 2 ? d->dx : NULL, d->dw, s->bias ? d->db : NULL);
        return;
    }
    dt_nn_conv2d p = {s->cin, s->cout, s->k, s->k, s->s, s->s, s->p, s->p, 1, s->bias};
    if (c->what == 0)
        dt_nn_conv2d_forward(&p, c->n, s->hw, s->hw, d->x, d->w, d->b, d->y, d->scratch);
    else
        dt_nn_conv2d_backward(&p, c->n, s->hw, s->hw, d->x, d->w, d->dy,
                              c->what == 2 ? d->dx : NULL, d->dw, d->db, d->scratch);
}

// median over reps of (time of a loop >= 20 ms) / calls
static double timeit(void (*fn)(const run_ctx *), const run_ctx *c) {
    double t[64];
    fn(c), fn(c);
    int calls = 1;
    for (;;) { // calls per timed loop
        double t0 = now();
        for (int i = 0; i < calls; i++)
            fn(c);
        if (now() - t0 >= 0.02)
            break;
        calls *= 2;
    }
    for (int r = 0; r < reps; r++) {
        double t0 = now();
        for (int i = 0; i < calls; i++)
            fn(c);
        t[r] = (now() - t0) / calls;
    }
    for (int i = 1; i < reps; i++) // insertion sort
        for (int j = i; j > 0 && t[j] < t[j - 1]; j--) {
            double v = t[j];
            t[j] = t[j - 1], t[j - 1] = v;
        }
    return t[reps / 2];
}

static void run_prim(const run_ctx *c) {
    prim_run(c->pr, c->reorders);
}

static void md_plain(dnnl_memory_desc_t *md, int nd, dnnl_dim_t a, dnnl_dim_t b, dnnl_dim_t h,
                     dnnl_dim_t w) {
    dnnl_dims_t dims = {a, b, h, w};
    CHECK(dnnl_memory_desc_init_by_tag(md, nd, dims, dnnl_f32,
                                       nd == 4   ? dnnl_abcd
                                       : nd == 2 ? dnnl_ab
                                                 : dnnl_a));
}
static void md_any(dnnl_memory_desc_t *md, int nd, dnnl_dim_t a, dnnl_dim_t b, dnnl_dim_t h,
                   dnnl_dim_t w) {
    dnnl_dims_t dims = {a, b, h, w};
    CHECK(dnnl_memory_desc_init_by_tag(md, nd, dims, dnnl_f32, dnnl_format_tag_any));
}

static double max_rel(const float *a, const float *b, size_t n) {
    double m = 0, top = 0;
    for (size_t i = 0; i < n; i++) {
        m   = fmax(m, fabs((double)a[i] - b[i]));
        top = fmax(top, fabs((double)a[i]));
    }
    return top > 0 ? m / top : m;
}

static void line(const shape *s, int n, const char *dir, double flop, double td, double tp,
                 double tr, const char *impl, const char *mine, double err) {
    printf("%-34s n=%-3d %-4s dtrain %9.1f us %6.1f GF/s | dnnl %9.1f us %6.1f | dnnl+r %9.1f "
           "us %6.1f GF/s | ratio %5.2f | err %.1e | %s | %s\n",
           s->name, n, dir, td * 1e6, flop / td * 1e-9, tp * 1e6, flop / tp * 1e-9, tr * 1e6,
           flop / tr * 1e-9, td / tr, err, impl, mine);
    fflush(stdout);
}

static void bench_case(const shape *s, int n, dt_rng *rng) {
    bool   conv = s->k > 0;
    int    ho = 1, wo = 1, hw = conv ? s->hw : 1;
    size_t kk = conv ? (size_t)s->k * s->k : 1;
    if (conv) {
        dt_nn_conv2d p = {s->cin, s->cout, s->k, s->k, s->s, s->s, s->p, s->p, 1, s->bias};
        if (dt_nn_conv2d_check(&p, s->hw, s->hw, &ho, &wo)) {
            fprintf(stderr, "dnnl-bench: %s\n", dt_last_error());
            exit(1);
        }
    }
    size_t nx = (size_t)n * s->cin * hw * hw, ny = (size_t)n * s->cout * ho * wo;
    size_t nw = (size_t)s->cout * s->cin * kk;
    bufs   d  = {.x   = buf(nx, rng),
                 .w   = buf(nw, rng),
                 .b   = buf(s->cout, rng),
                 .dy  = buf(ny, rng),
                 .y   = buf(ny, NULL),
                 .dx  = buf(nx, NULL),
                 .dw  = buf(nw, NULL),
                 .db  = buf(s->cout, NULL),
                 .y1  = buf(ny, NULL),
                 .dx1 = buf(nx, NULL),
                 .dw1 = buf(nw, NULL),
                 .db1 = buf(s->cout, NULL)};
    if (conv) {
        dt_nn_conv2d p = {s->cin, s->cout, s->k, s->k, s->s, s->s, s->p, s->p, 1, s->bias};
        d.scratch      = buf(dt_nn_conv2d_scratch(&p, s->hw, s->hw), NULL);
    }
    int                nd = conv ? 4 : 2;
    dnnl_memory_desc_t ux, uw, ub, uy, ax, aw, ab, ay;
    md_plain(&ux, nd, n, s->cin, hw, hw), md_any(&ax, nd, n, s->cin, hw, hw);
    md_plain(&uw, nd, s->cout, s->cin, conv ? s->k : 1, conv ? s->k : 1);
    md_any(&aw, nd, s->cout, s->cin, conv ? s->k : 1, conv ? s->k : 1);
    md_plain(&ub, 1, s->cout, 0, 0, 0), md_any(&ab, 1, s->cout, 0, 0, 0);
    md_plain(&uy, nd, n, s->cout, ho, wo), md_any(&ay, nd, n, s->cout, ho, wo);
    dnnl_dims_t               st = {s->s, s->s}, pad = {s->p, s->p};
    dnnl_convolution_desc_t   cf, cd, cw;
    dnnl_inner_product_desc_t ipf, ipd, ipw;
    const void               *of, *od, *ow;
    if (conv) {
        CHECK(dnnl_convolution_forward_desc_init(&cf, dnnl_forward_training,
                                                 dnnl_convolution_direct, &ax, &aw,
                                                 s->bias ? &ab : NULL, &ay, st, pad, pad));
        CHECK(dnnl_convolution_backward_data_desc_init(&cd, dnnl_convolution_direct, &ax, &aw, &ay,
                                                       st, pad, pad));
        CHECK(dnnl_convolution_backward_weights_desc_init(&cw, dnnl_convolution_direct, &ax, &aw,
                                                          s->bias ? &ab : NULL, &ay, st, pad, pad));
        of = &cf, od = &cd, ow = &cw;
    } else {
        CHECK(dnnl_inner_product_forward_desc_init(&ipf, dnnl_forward_training, &ax, &aw,
                                                   s->bias ? &ab : NULL, &ay));
        CHECK(dnnl_inner_product_backward_data_desc_init(&ipd, &ax, &aw, &ay));
        CHECK(dnnl_inner_product_backward_weights_desc_init(&ipw, &ax, &aw, s->bias ? &ab : NULL,
                                                            &ay));
        of = &ipf, od = &ipd, ow = &ipw;
    }
    prim fwd, bwd_d, bwd_w;
    prim_make(&fwd, of, NULL);
    prim_arg(&fwd, DNNL_ARG_SRC, dnnl_query_src_md, 0, &ux, d.x, false);
    prim_arg(&fwd, DNNL_ARG_WEIGHTS, dnnl_query_weights_md, 0, &uw, d.w, false);
    if (s->bias)
        prim_arg(&fwd, DNNL_ARG_BIAS, dnnl_query_weights_md, 1, &ub, d.b, false);
    prim_arg(&fwd, DNNL_ARG_DST, dnnl_query_dst_md, 0, &uy, d.y1, true);
    prim_seal(&fwd);
    prim_make(&bwd_d, od, fwd.pd);
    prim_arg(&bwd_d, DNNL_ARG_DIFF_DST, dnnl_query_diff_dst_md, 0, &uy, d.dy, false);
    prim_arg(&bwd_d, DNNL_ARG_WEIGHTS, dnnl_query_weights_md, 0, &uw, d.w, false);
    prim_arg(&bwd_d, DNNL_ARG_DIFF_SRC, dnnl_query_diff_src_md, 0, &ux, d.dx1, true);
    prim_seal(&bwd_d);
    prim_make(&bwd_w, ow, fwd.pd);
    prim_arg(&bwd_w, DNNL_ARG_SRC, dnnl_query_src_md, 0, &ux, d.x, false);
    prim_arg(&bwd_w, DNNL_ARG_DIFF_DST, dnnl_query_diff_dst_md, 0, &uy, d.dy, false);
    prim_arg(&bwd_w, DNNL_ARG_DIFF_WEIGHTS, dnnl_query_diff_weights_md, 0, &uw, d.dw1, true);
    if (s->bias)
        prim_arg(&bwd_w, DNNL_ARG_DIFF_BIAS, dnnl_query_diff_weights_md, 1, &ub, d.db1, true);
    prim_seal(&bwd_w);

    double  macs = (double)n * s->cout * ho * wo * s->cin * (double)kk, flop = 2 * macs;
    char    mine[96] = "dtrain/gemm";
    run_ctx c        = {s, n, ho, wo, &d, NULL, 0, false};
    if (conv) {
        dt_nn_conv2d p = {s->cin, s->cout, s->k, s->k, s->s, s->s, s->p, s->p, 1, s->bias};
        dt_nn_conv2d_kernel(&p, s->hw, false, false, mine, sizeof mine);
    }
    // forward
    c.what     = 0;
    double td  = timeit(run_dtrain, &c);
    c.pr       = &fwd;
    double tp  = timeit(run_prim, &c);
    c.reorders = true;
    double tr  = timeit(run_prim, &c);
    line(s, n, "fwd", flop, td, tp, tr, fwd.impl, mine, max_rel(d.y, d.y1, ny));
    // backward weights: dtrain's dw accumulates, so the check runs once on zeroed sums
    memset(d.dw, 0, sizeof(float) * nw), memset(d.db, 0, sizeof(float) * s->cout);
    c.what = 1;
    run_dtrain(&c);
    c.pr = &bwd_w, c.reorders = true;
    run_prim(&c);
    double ew = fmax(max_rel(d.dw, d.dw1, nw), s->bias ? max_rel(d.db, d.db1, s->cout) : 0);
    if (conv) {
        dt_nn_conv2d p = {s->cin, s->cout, s->k, s->k, s->s, s->s, s->p, s->p, 1, s->bias};
        dt_nn_conv2d_kernel(&p, s->hw, true, false, mine, sizeof mine);
    }
    double tdw = timeit(run_dtrain, &c);
    c.reorders = false;
    double tpw = timeit(run_prim, &c);
    c.reorders = true;
    double trw = timeit(run_prim, &c);
    line(s, n, "bww", flop, tdw, tpw, trw, bwd_w.impl, mine, ew);
    if (s->dx) { // backward data, dtrain's as (dx + dw) - dw
        c.what = 2;
        run_dtrain(&c);
        c.pr = &bwd_d;
        run_prim(&c);
        double ed = max_rel(d.dx, d.dx1, nx);
        if (conv) {
            dt_nn_conv2d p = {s->cin, s->cout, s->k, s->k, s->s, s->s, s->p, s->p, 1, s->bias};
            dt_nn_conv2d_kernel(&p, s->hw, true, true, mine, sizeof mine);
        }
        double tdb = timeit(run_dtrain, &c);
        c.reorders = false;
        double tpd = timeit(run_prim, &c);
        c.reorders = true;
        double trd = timeit(run_prim, &c);
        line(s, n, "bwd", flop, fmax(tdb - tdw, 1e-9), tpd, trd, bwd_d.impl, "(dx+dw) - dw", ed);
        line(s, n, "bw", 2 * flop, tdb, tpd + tpw, trd + trw, "data + weights", mine, fmax(ed, ew));
    }
    prim_free(&fwd), prim_free(&bwd_d), prim_free(&bwd_w);
    float *all[] = {d.x,  d.w,  d.b,   d.dy,  d.y,   d.dx,     d.dw,
                    d.db, d.y1, d.dx1, d.dw1, d.db1, d.scratch};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        dt_free(all[i]);
}

// The seed ConvNet (examples/mnist/convnet.c: conv 1->16, 16->32, 3x3 without padding,
// then Linear 4608->64, 64->10) and the ResNet (examples/resnet: a 3x3 stem, BasicBlocks
// 16->16, 16->32 s2, 32->64 s2 with 1x1 s2 shortcuts, Linear 64->10; no conv bias).
static const shape shapes[] = {
    {"convnet conv1 1->16 3x3 28", 1, 16, 3, 1, 0, 28, true, false},
    {"convnet conv2 16->32 3x3 26", 16, 32, 3, 1, 0, 26, true, true},
    {"convnet fc1 4608->64", 4608, 64, 0, 0, 0, 0, true, true},
    {"convnet fc2 64->10", 64, 10, 0, 0, 0, 0, true, true},
    {"resnet stem 1->16 3x3 p1 28", 1, 16, 3, 1, 1, 28, false, false},
    {"resnet 16->16 3x3 p1 28", 16, 16, 3, 1, 1, 28, false, true},
    {"resnet 16->32 3x3 s2 p1 28", 16, 32, 3, 2, 1, 28, false, true},
    {"resnet 16->32 1x1 s2 28", 16, 32, 1, 2, 0, 28, false, true},
    {"resnet 32->32 3x3 p1 14", 32, 32, 3, 1, 1, 14, false, true},
    {"resnet 32->64 3x3 s2 p1 14", 32, 64, 3, 2, 1, 14, false, true},
    {"resnet 32->64 1x1 s2 14", 32, 64, 1, 2, 0, 14, false, true},
    {"resnet 64->64 3x3 p1 7", 64, 64, 3, 1, 1, 7, false, true},
    {"resnet fc 64->10", 64, 10, 0, 0, 0, 0, true, true},
};

int main(int argc, char **argv) {
    const char *filter  = NULL;
    int         batch[] = {1, 16, 128};
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--reps") && i + 1 < argc)
            reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--filter") && i + 1 < argc)
            filter = argv[++i];
        else {
            fprintf(stderr, "usage: %s [--reps N] [--filter SUBSTRING]\n", argv[0]);
            return 2;
        }
    }
    if (reps < 1 || reps > 64)
        reps = 5;
    // dtrain's own kernels: where the library is built with oneDNN, its provider rows
    // (kernels/dnnl) would otherwise take the 3x3 convolutions' entry points
    setenv("DT_CONV_DNNL", "0", 1);
    omp_set_num_threads(1); // one OpenMP thread, as the provider runs per dtrain thread
    CHECK(dnnl_engine_create(&eng, dnnl_cpu, 0));
    CHECK(dnnl_stream_create(&strm, eng, dnnl_stream_default_flags));
    const dnnl_version_t *v = dnnl_version();
    char                  kset[256];
    dt_kernels_describe(kset, sizeof kset);
    printf("oneDNN %d.%d.%d (%s), OpenMP threads %d; dtrain: %s\n", v->major, v->minor, v->patch,
           v->hash, omp_get_max_threads(), kset);
    dt_rng rng = dt_rng_init(1);
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
        for (size_t j = 0; j < sizeof batch / sizeof batch[0]; j++)
            if (!filter || strstr(shapes[i].name, filter))
                bench_case(&shapes[i], batch[j], &rng);
    dnnl_stream_destroy(strm);
    dnnl_engine_destroy(eng);
    return 0;
}
