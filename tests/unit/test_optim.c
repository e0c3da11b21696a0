// test_optim.c: SGD, Adam, AdamW and Adadelta against scalar reference loops written
// here in double precision from the documented formulas (not calling the library), for
// every option combination that changes the arithmetic, several steps, sizes that hit
// the vector main loops, their tails and the block boundaries; against numbers produced
// by PyTorch; state layout, checkpoint restore (bitwise), learning-rate changes, no
// allocation in step, and the option checks.
#include "../check.h"
#include "dtrain/optim.h"
#include "dtrain/rng.h"

#include <stdlib.h>

#define STEPS 7

// ------------------------------------------------------------- reference (double)

typedef struct ref {
    int     kind; // 0 sgd, 1 adam, 2 adamw, 3 adadelta
    double  lr, momentum, dampening, wd, beta1, beta2, eps, rho;
    bool    nesterov, amsgrad;
    size_t  n;
    double *p, *s1, *s2, *s3; // params and up to three state arrays
    long    t;
} ref;

// The optimizers over raw buffers: a one-tensor dt_params ("params", shape (n)) bound
// to them, which the optimizer borrows; the tables are freed at the end of main.
static dt_params **g_bound;
static int         g_nbound;

static dt_params *bound(float *p, float *g, size_t n) {
    dt_params  *t     = NULL;
    int64_t     shape = (int64_t)n;
    dt_params **grown = realloc(g_bound, (size_t)(g_nbound + 1) * sizeof *g_bound);
    if (!grown || dt_params_new(&t, NULL) != DT_OK)
        return NULL;
    g_bound             = grown;
    g_bound[g_nbound++] = t;
    if ((n && dt_params_add(t, "params", 1, &shape, 0) != DT_OK) ||
        dt_params_bind(t, p, g, NULL) != DT_OK)
        return NULL;
    return t;
}

#define RAW_NEW(fn, type)                                                                          \
    static dt_optim *fn##_raw(float *p, float *g, size_t n, const type *o) {                       \
        dt_optim  *r = NULL;                                                                       \
        dt_params *t = bound(p, g, n);                                                             \
        if (t)                                                                                     \
            dt_##fn##_new(&r, t, o);                                                               \
        return r;                                                                                  \
    }
RAW_NEW(sgd, dt_sgd_opts)
RAW_NEW(adam, dt_adam_opts)
RAW_NEW(adamw, dt_adam_opts)
RAW_NEW(adadelta, dt_adadelta_opts)

static void free_bound(void) {
    for (int i = 0; i < g_nbound; i++)
        dt_params_free(g_bound[i]);
    free(g_bound);
}

static void ref_init(ref *r, const float *p, size_t n) {
    r->n  = n;
    r->p  = calloc(n + 1, sizeof(double));
    r->s1 = calloc(n + 1, sizeof(double));
    r->s2 = calloc(n + 1, sizeof(double));
    r->s3 = calloc(n + 1, sizeof(double));
    for (size_t i = 0; i < n; i++)
        r->p[i] = p[i];
    r->t = 0;
}

static void ref_free(ref *r) {
    free(r->p);
    free(r->s1);
    free(r->s2);
    free(r->s3);
}

static void ref_step(ref *r, const float *grad) {
    r->t++;
    for (size_t i = 0; i < r->n; i++) {
        double g = grad[i], *p = &r->p[i];
        if (r->kind == 0) { // torch.optim.SGD
            if (r->wd != 0)
                g += r->wd * *p;
            if (r->momentum != 0) {
                double *b = &r->s1[i];
                *b        = r->t == 1 ? g : r->momentum * *b + (1 - r->dampening) * g;
                g         = r->nesterov ? g + r->momentum * *b : *b;
            }
            *p -= r->lr * g;
        } else if (r->kind == 1 || r->kind == 2) { // torch.optim.Adam / AdamW
            if (r->kind == 2)
                *p *= 1 - r->lr * r->wd;
            else if (r->wd != 0)
                g += r->wd * *p;
            double *m = &r->s1[i], *v = &r->s2[i], *vmax = &r->s3[i];
            *m          = r->beta1 * *m + (1 - r->beta1) * g;
            *v          = r->beta2 * *v + (1 - r->beta2) * g * g;
            double mhat = *m / (1 - pow(r->beta1, (double)r->t));
            double vv   = *v;
            if (r->amsgrad) {
                *vmax = fmax(*vmax, *v);
                vv    = *vmax;
            }
            double vhat = vv / (1 - pow(r->beta2, (double)r->t));
            *p -= r->lr * mhat / (sqrt(vhat) + r->eps);
        } else { // torch.optim.Adadelta
            if (r->wd != 0)
                g += r->wd * *p;
            double *v = &r->s1[i], *u = &r->s2[i];
            *v       = r->rho * *v + (1 - r->rho) * g * g;
            double d = sqrt(*u + r->eps) / sqrt(*v + r->eps) * g;
            *u       = r->rho * *u + (1 - r->rho) * d * d;
            *p -= r->lr * d;
        }
    }
}

// ------------------------------------------------------------------------ helpers

static float *random_buf(dt_rng *rng, size_t n, float scale) {
    float *b = dt_alloc((n + 1) * sizeof *b);
    for (size_t i = 0; i < n; i++)
        b[i] = scale * dt_rng_normal(rng);
    return b;
}

// Largest |a - b| / max(1, |b|).
static double rel_err(const float *a, const double *b, size_t n) {
    double worst = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]) / fmax(1.0, fabs(b[i]));
        if (!(d <= worst))
            worst = d; // NaN sticks
    }
    return worst;
}

static dt_optim *make(const ref *r, float *p, float *g, size_t n) {
    switch (r->kind) {
    case 0: {
        dt_sgd_opts o  = dt_sgd_opts_default();
        o.lr           = (float)r->lr;
        o.momentum     = (float)r->momentum;
        o.dampening    = (float)r->dampening;
        o.weight_decay = (float)r->wd;
        o.nesterov     = r->nesterov;
        return sgd_raw(p, g, n, &o);
    }
    case 1:
    case 2: {
        dt_adam_opts o = dt_adam_opts_default();
        o.lr           = (float)r->lr;
        o.beta1        = (float)r->beta1;
        o.beta2        = (float)r->beta2;
        o.eps          = (float)r->eps;
        o.weight_decay = (float)r->wd;
        o.amsgrad      = r->amsgrad;
        return r->kind == 1 ? adam_raw(p, g, n, &o) : adamw_raw(p, g, n, &o);
    }
    default: {
        dt_adadelta_opts o = dt_adadelta_opts_default();
        o.lr               = (float)r->lr;
        o.rho              = (float)r->rho;
        o.eps              = (float)r->eps;
        o.weight_decay     = (float)r->wd;
        return adadelta_raw(p, g, n, &o);
    }
    }
}

// The scalar parameters as the library sees them (float), so the reference starts
// from the same numbers.
static void round_to_float(ref *r) {
    r->lr        = (float)r->lr;
    r->momentum  = (float)r->momentum;
    r->dampening = (float)r->dampening;
    r->wd        = (float)r->wd;
    r->beta1     = (float)r->beta1;
    r->beta2     = (float)r->beta2;
    r->eps       = (float)r->eps;
    r->rho       = (float)r->rho;
}

// Runs STEPS steps of the library and of the reference on the same random gradients
// and compares params and state after each step.
static void compare(ref cfg, size_t n, const char *label) {
    round_to_float(&cfg);
    dt_rng rng = dt_rng_init(n * 31 + (size_t)cfg.kind);
    float *p   = random_buf(&rng, n, 1.0f);
    float *g   = random_buf(&rng, n, 1.0f);
    ref    r   = cfg;
    ref_init(&r, p, n);
    dt_optim *o = make(&cfg, p, g, n);
    CHECK(o != NULL);
    if (!o)
        return;
    double worst_p = 0, worst_s = 0;
    size_t allocs = dt_alloc_total_count();
    for (int t = 0; t < STEPS; t++) {
        for (size_t i = 0; i < n; i++)
            g[i] = dt_rng_normal(&rng) * (t % 3 == 2 ? 0.01f : 1.0f); // some small grads
        if (t == 4) { // a schedule changes the learning rate
            CHECK_OK(dt_optim_set_lr(o, (float)(r.lr * 0.5)));
            r.lr = (float)(r.lr * 0.5);
        }
        dt_optim_step(o);
        ref_step(&r, g);
        double e = rel_err(p, r.p, n);
        worst_p  = e > worst_p || e != e ? e : worst_p;
        size_t ns;
        float *st = dt_optim_state(o, &ns);
        // State layout: SGD [b]; Adam [m, v, (vmax)]; Adadelta [v, u].
        size_t want = cfg.kind == 0   ? (cfg.momentum != 0 ? n : 0)
                      : cfg.kind == 3 ? 2 * n
                                      : (cfg.amsgrad ? 3 : 2) * n;
        CHECK_EQ(ns, want);
        double es = 0;
        if (ns >= n && n)
            es = fmax(es, rel_err(st, r.s1, n));
        if (ns >= 2 * n && n)
            es = fmax(es, rel_err(st + n, r.s2, n));
        if (ns >= 3 * n && n)
            es = fmax(es, rel_err(st + 2 * n, r.s3, n));
        worst_s = es > worst_s || es != es ? es : worst_s;
    }
    CHECK_EQ(dt_alloc_total_count(), allocs); // step allocates nothing
    CHECK_EQ(dt_optim_step_count(o), STEPS);
    // float32 arithmetic against double: a few ulps per step, amplified a little by
    // divisions with small denominators.
    if (!check_report(worst_p < 2e-5 && worst_s < 2e-5, label, __FILE__, __LINE__))
        fprintf(stderr, "     n=%zu: params rel err %.3g, state rel err %.3g\n", n, worst_p,
                worst_s);
    dt_optim_free(o);
    ref_free(&r);
    dt_free(p);
    dt_free(g);
}

static const size_t sizes[] = {0, 1, 15, 16, 17, 100, 511, 512, 513, 1031, 2500};
#define NSIZES (sizeof sizes / sizeof sizes[0])

static void test_sgd(void) {
    for (int c = 0; c < 16; c++) {
        ref r       = {.kind = 0, .lr = 0.05};
        r.momentum  = c & 1 ? 0.9 : 0;
        r.dampening = c & 2 ? 0.25 : 0;
        r.wd        = c & 4 ? 0.01 : 0;
        r.nesterov  = c & 8;
        if (r.nesterov && (r.momentum == 0 || r.dampening != 0))
            continue; // rejected, as by PyTorch (checked in test_bad_options)
        char label[96];
        snprintf(label, sizeof label, "sgd momentum=%g dampening=%g wd=%g nesterov=%d", r.momentum,
                 r.dampening, r.wd, r.nesterov);
        for (size_t i = 0; i < NSIZES; i++)
            compare(r, sizes[i], label);
    }
}

static void test_adam(void) {
    for (int c = 0; c < 8; c++) {
        ref r     = {.kind = c & 1 ? 2 : 1, .lr = 0.01, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8};
        r.wd      = c & 2 ? 0.05 : 0;
        r.amsgrad = c & 4;
        if (c == 6) { // other constants
            r.beta1 = 0.5;
            r.beta2 = 0.9;
            r.eps   = 1e-3;
        }
        char label[96];
        snprintf(label, sizeof label, "%s wd=%g amsgrad=%d beta1=%g",
                 r.kind == 1 ? "adam" : "adamw", r.wd, r.amsgrad, r.beta1);
        for (size_t i = 0; i < NSIZES; i++)
            compare(r, sizes[i], label);
    }
}

static void test_adadelta(void) {
    for (int c = 0; c < 4; c++) {
        ref r = {.kind = 3, .lr = c & 1 ? 0.5 : 1.0, .rho = 0.9, .eps = 1e-6};
        r.wd  = c & 2 ? 0.01 : 0;
        if (c == 3) {
            r.rho = 0.95;
            r.eps = 1e-4;
        }
        char label[96];
        snprintf(label, sizeof label, "adadelta lr=%g wd=%g rho=%g", r.lr, r.wd, r.rho);
        for (size_t i = 0; i < NSIZES; i++)
            compare(r, sizes[i], label);
    }
}

// Values produced with PyTorch 1.13 (Debian's python3-torch) by this script:
//   p0 = [0.5, -1.25, 2.0, 0.0, -0.375, 3.5]; p = torch.tensor(p0, requires_grad=True)
//   opt = <the optimizer below>([p]); for g in GRADS: p.grad = torch.tensor(g); opt.step()
//   print(', '.join('%.9g' % x for x in p.tolist()))
// (float32 tensors, default single-tensor implementation on CPU).
static const float torch_p0[6]       = {0.5f, -1.25f, 2.0f, 0.0f, -0.375f, 3.5f};
static const float torch_grads[4][6] = {{0.1f, -0.2f, 0.3f, -0.4f, 0.5f, -0.6f},
                                        {-0.25f, 0.75f, 0.05f, 1.5f, -2.0f, 0.125f},
                                        {0.6f, 0.0f, -0.9f, 0.2f, 0.33f, -1.1f},
                                        {1.0f, -1.0f, 0.5f, -0.5f, 0.25f, 2.0f}};

static void run_torch_case(dt_optim *(*init)(float *, float *, size_t, const void *),
                           const void *opts, const float want[6], const char *label) {
    float p[6], g[6];
    memcpy(p, torch_p0, sizeof p);
    dt_optim *o = init(p, g, 6, opts);
    CHECK(o != NULL);
    for (int t = 0; t < 4; t++) {
        memcpy(g, torch_grads[t], sizeof g);
        dt_optim_step(o);
    }
    double worst = 0;
    for (int i = 0; i < 6; i++)
        worst = fmax(worst, fabs((double)p[i] - want[i]) / fmax(1e-3, fabs(want[i])));
    // float32 on both sides; PyTorch's kernels may fuse multiply-adds: a few ulps.
    if (!check_report(worst < 2e-6, label, __FILE__, __LINE__))
        fprintf(stderr, "     relative error %.3g against PyTorch\n", worst);
    dt_optim_free(o);
}

static dt_optim *init_sgd(float *p, float *g, size_t n, const void *o) {
    return sgd_raw(p, g, n, o);
}
static dt_optim *init_adam(float *p, float *g, size_t n, const void *o) {
    return adam_raw(p, g, n, o);
}
static dt_optim *init_adamw(float *p, float *g, size_t n, const void *o) {
    return adamw_raw(p, g, n, o);
}
static dt_optim *init_adadelta(float *p, float *g, size_t n, const void *o) {
    return adadelta_raw(p, g, n, o);
}

static void test_against_pytorch(void) {
    // torch.optim.SGD(lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.01)
    dt_sgd_opts        s = {.lr = 0.1f, .momentum = 0.9f, .weight_decay = 0.01f, .nesterov = true};
    static const float sgd_nesterov[6] = {0.186532274f,  -1.22052145f,   1.98497033f,
                                          -0.310445428f, -0.0252637975f, 3.57694268f};
    run_torch_case(init_sgd, &s, sgd_nesterov, "sgd nesterov vs PyTorch");
    // torch.optim.SGD(lr=0.05, momentum=0.8, dampening=0.3)
    s = (dt_sgd_opts){.lr = 0.05f, .momentum = 0.8f, .dampening = 0.3f};
    static const float sgd_damp[6] = {0.433790028f,   -1.24953008f, 1.99065006f,
                                      -0.0641599968f, -0.30753997f, 3.57718492f};
    run_torch_case(init_sgd, &s, sgd_damp, "sgd dampening vs PyTorch");
    // torch.optim.Adam(lr=0.01, betas=(0.8, 0.95), eps=1e-6, weight_decay=0.02, amsgrad=True)
    dt_adam_opts       a           = {.lr           = 0.01f,
                                      .beta1        = 0.8f,
                                      .beta2        = 0.95f,
                                      .eps          = 1e-6f,
                                      .weight_decay = 0.02f,
                                      .amsgrad      = true};
    static const float adam_ams[6] = {0.481756151f,    -1.24571478f,  1.98558986f,
                                      -0.00274589704f, -0.374005198f, 3.5173974f};
    run_torch_case(init_adam, &a, adam_ams, "adam amsgrad vs PyTorch");
    // torch.optim.AdamW(lr=0.01, weight_decay=0.1)
    a                           = dt_adamw_opts_default();
    a.lr                        = 0.01f;
    a.weight_decay              = 0.1f;
    static const float adamw[6] = {0.481171608f,    -1.24223912f,  1.97861123f,
                                   -0.00262091029f, -0.372671336f, 3.50683451f};
    run_torch_case(init_adamw, &a, adamw, "adamw vs PyTorch");
    // torch.optim.Adadelta(lr=0.5, weight_decay=0.01)
    dt_adadelta_opts d             = dt_adadelta_opts_default();
    d.lr                           = 0.5f;
    d.weight_decay                 = 0.01f;
    static const float adadelta[6] = {0.494301707f,     -1.24808168f, 1.99849093f,
                                      -1.77649781e-07f, -0.37530297f, 3.50034738f};
    run_torch_case(init_adadelta, &d, adadelta, "adadelta vs PyTorch");
}

// Restoring state + step count into a fresh optimizer continues bitwise like the
// uninterrupted run.
static void test_checkpoint_restore(void) {
    size_t n = 777;
    for (int kind = 0; kind < 4; kind++) {
        dt_rng rng = dt_rng_init(99);
        float *p0 = random_buf(&rng, n, 1), *pa = dt_alloc(n * 4), *pb = dt_alloc(n * 4);
        float *grads[6];
        for (int t = 0; t < 6; t++)
            grads[t] = random_buf(&rng, n, 1);
        float *g   = dt_alloc(n * 4);
        ref    cfg = {.kind     = kind,
                      .lr       = 0.01,
                      .momentum = 0.9,
                      .beta1    = 0.9,
                      .beta2    = 0.999,
                      .eps      = 1e-8,
                      .rho      = 0.9,
                      .amsgrad  = true,
                      .nesterov = true};
        memcpy(pa, p0, n * 4);
        dt_optim *a = make(&cfg, pa, g, n);
        for (int t = 0; t < 6; t++) {
            memcpy(g, grads[t], n * 4);
            dt_optim_step(a);
        }
        memcpy(pb, p0, n * 4);
        dt_optim *b = make(&cfg, pb, g, n);
        for (int t = 0; t < 3; t++) {
            memcpy(g, grads[t], n * 4);
            dt_optim_step(b);
        }
        size_t       ns;
        const float *st    = dt_optim_state(b, &ns);
        float       *saved = malloc(ns * 4 + 4), *saved_p = malloc(n * 4);
        memcpy(saved, st, ns * 4);
        memcpy(saved_p, pb, n * 4);
        int64_t steps = dt_optim_step_count(b);
        dt_optim_free(b);

        memcpy(pb, saved_p, n * 4);
        b = make(&cfg, pb, g, n);
        size_t ns2;
        float *st2 = dt_optim_state(b, &ns2);
        CHECK_EQ(ns2, ns);
        memcpy(st2, saved, ns * 4);
        CHECK_OK(dt_optim_set_step_count(b, steps));
        for (int t = 3; t < 6; t++) {
            memcpy(g, grads[t], n * 4);
            dt_optim_step(b);
        }
        CHECK(memcmp(pa, pb, n * 4) == 0);
        CHECK(memcmp(dt_optim_state(a, NULL), dt_optim_state(b, NULL), ns * 4) == 0);
        CHECK_EQ(dt_optim_step_count(b), 6);
        CHECK_ERR(dt_optim_set_step_count(b, -1), DT_ERR_ARG,
                  "expected a step count >= 0, found -1");
        dt_optim_free(a);
        dt_optim_free(b);
        for (int t = 0; t < 6; t++)
            dt_free(grads[t]);
        free(saved);
        free(saved_p);
        dt_free(p0);
        dt_free(pa);
        dt_free(pb);
        dt_free(g);
    }
}

static void test_misc(void) {
    float     p[40], g[40];
    dt_optim *o = adadelta_raw(p, g, 40, NULL);
    CHECK(strcmp(dt_optim_name(o), "adadelta") == 0);
    CHECK_EQ(dt_optim_num_params(o), 40);
    CHECK_NEAR(dt_optim_lr(o), 1.0, 0);
    for (int i = 0; i < 40; i++)
        g[i] = (float)i + 1;
    dt_optim_zero_grad(o);
    int nonzero = 0;
    for (int i = 0; i < 40; i++)
        nonzero += g[i] != 0.0f;
    CHECK_EQ(nonzero, 0);
    size_t ns;
    float *st = dt_optim_state(o, &ns);
    CHECK_EQ(ns, 80);
    int zero_state = 1;
    for (size_t i = 0; i < ns; i++)
        zero_state &= st[i] == 0.0f;
    CHECK(zero_state);
    CHECK_ERR(dt_optim_set_lr(o, -0.1f), DT_ERR_ARG,
              "adadelta: expected lr in [0, inf], found -0.1");
    CHECK_ERR(dt_optim_set_lr(o, NAN), DT_ERR_ARG, "found nan");
    CHECK_NEAR(dt_optim_lr(o), 1.0, 0);
    dt_optim_free(o);
    o = sgd_raw(p, g, 40, NULL);
    CHECK(strcmp(dt_optim_name(o), "sgd") == 0);
    CHECK(dt_optim_state(o, &ns) == NULL);
    CHECK_EQ(ns, 0);
    CHECK_NEAR(dt_optim_lr(o), 1e-3, 1e-9);
    dt_optim_free(o);
    o = adamw_raw(p, g, 40, NULL);
    CHECK(strcmp(dt_optim_name(o), "adamw") == 0);
    dt_optim_free(o);
    o = adam_raw(p, g, 40, NULL);
    CHECK(strcmp(dt_optim_name(o), "adam") == 0);
    dt_optim_free(o);
    dt_optim_free(NULL);
    // The defaults are PyTorch's.
    dt_adam_opts a = dt_adamw_opts_default();
    CHECK_NEAR(a.weight_decay, 0.01, 1e-9);
    CHECK_NEAR(a.beta2, 0.999, 1e-7);
    CHECK_NEAR(dt_adam_opts_default().weight_decay, 0, 0);
    CHECK_NEAR(dt_adadelta_opts_default().eps, 1e-6, 1e-12);
}

static void test_bad_options(void) {
    float       p[8], g[8];
    dt_sgd_opts s = dt_sgd_opts_default();
    s.nesterov    = true;
    CHECK(sgd_raw(p, g, 8, &s) == NULL);
    CHECK(strstr(dt_last_error(),
                 "sgd: expected momentum > 0 and dampening 0 with nesterov, found momentum 0") !=
          NULL);
    s.momentum  = 0.9f;
    s.dampening = 0.1f;
    CHECK(sgd_raw(p, g, 8, &s) == NULL);
    CHECK(strstr(dt_last_error(), "dampening 0.1") != NULL);
    s    = dt_sgd_opts_default();
    s.lr = -1;
    CHECK(sgd_raw(p, g, 8, &s) == NULL);
    CHECK(dt_last_status() == DT_ERR_ARG);
    CHECK(strstr(dt_last_error(), "sgd: expected lr in [0, inf], found -1") != NULL);
    dt_adam_opts a = dt_adam_opts_default();
    a.beta1        = 1.0f;
    CHECK(adam_raw(p, g, 8, &a) == NULL);
    CHECK(strstr(dt_last_error(), "adam: expected beta1 in [0, 1), found 1") != NULL);
    a     = dt_adam_opts_default();
    a.eps = -1e-8f;
    CHECK(adamw_raw(p, g, 8, &a) == NULL);
    CHECK(strstr(dt_last_error(), "adamw: expected eps") != NULL);
    dt_adadelta_opts d = dt_adadelta_opts_default();
    d.rho              = 1.5f;
    CHECK(adadelta_raw(p, g, 8, &d) == NULL);
    CHECK(strstr(dt_last_error(), "adadelta: expected rho in [0, 1], found 1.5") != NULL);
    d              = dt_adadelta_opts_default();
    d.weight_decay = -0.1f;
    CHECK(adadelta_raw(p, g, 8, &d) == NULL);
    CHECK(strstr(dt_last_error(), "weight_decay") != NULL);
    // Buffers.
    CHECK(sgd_raw(p, p + 2, 4, NULL) == NULL);
    CHECK(strstr(dt_last_error(), "overlapping") != NULL);
    CHECK(adam_raw(NULL, g, 4, NULL) == NULL);
    CHECK(strstr(dt_last_error(), "found a NULL pointer") != NULL);
    dt_optim *o = sgd_raw(NULL, NULL, 0, NULL); // an empty model is fine
    CHECK(o != NULL);
    dt_optim_step(o);
    dt_optim_zero_grad(o);
    dt_optim_free(o);
}

// Prints (does not assert) one step's time for 300k parameters, the ConvNet's size.
static void report_speed(void) {
    size_t      n   = 300000;
    dt_rng      rng = dt_rng_init(1);
    float      *p = random_buf(&rng, n, 1), *g = random_buf(&rng, n, 1);
    dt_sgd_opts s     = dt_sgd_opts_default();
    s.momentum        = 0.9f;
    s.weight_decay    = 1e-4f;
    dt_optim *opts[4] = {sgd_raw(p, g, n, &s), adam_raw(p, g, n, NULL), adamw_raw(p, g, n, NULL),
                         adadelta_raw(p, g, n, NULL)};
    for (int k = 0; k < 4; k++) {
        double best = 1e9;
        for (int r = 0; r < 5; r++) {
            double t0 = dt_now();
            for (int i = 0; i < 20; i++)
                dt_optim_step(opts[k]);
            best = fmin(best, (dt_now() - t0) / 20);
        }
        fprintf(stderr, "     %-8s step, 300k parameters: %.1f us\n", dt_optim_name(opts[k]),
                best * 1e6);
        dt_optim_free(opts[k]);
    }
    dt_free(p);
    dt_free(g);
}

int main(void) {
    RUN(test_sgd);
    RUN(test_adam);
    RUN(test_adadelta);
    RUN(test_against_pytorch);
    RUN(test_checkpoint_restore);
    RUN(test_misc);
    RUN(test_bad_options);
    report_speed();
    free_bound();
    return check_summary();
}
