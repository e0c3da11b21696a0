// test_grad_ops.c: the backward of every op of src/nn/ops.h against central finite
// differences of its own forward, and gradients summed over fan-out.
//
// Each case is a small network around one op: forward gives y, the objective is
// L = sum(y * r) for a fixed random r (for a loss, L is the loss), and backward with
// dy = r must give dL/dv for every input and parameter v. The finite differences
// (L(v + eps) - L(v - eps)) / 2 eps run on the float32 forward with eps = 1e-2 and L
// summed in double: an op's rounding (~6e-8 of each output) becomes ~3e-6 / output in the
// difference, and the truncation error eps^2 f'''/6 stays below ~2e-5 for these smooth
// functions at inputs of order 1. The normalised error ||g - fd|| / ||fd|| must stay
// under 1e-3, and every element within 1e-2 of max(1, max|fd|): a wrong term of a
// gradient (a missing 1/n, a sign, an off-by-one window) is off by far more.
#include "../check.h"
#include "nn/ops.h"

#include <stdlib.h>

#define EPS      1e-2
#define NERR_MAX 1e-3
#define ELEM_MAX 1e-2
#define MAX_VARS 4

typedef struct gcase gcase;
struct gcase {
    // what is differentiated: inputs and parameters, with their analytic gradients
    int         nvars;
    const char *names[MAX_VARS];
    float      *v[MAX_VARS], *g[MAX_VARS];
    size_t      n[MAX_VARS];
    // the output and its weights (dy)
    float *y, *r;
    size_t ny;
    // the op: forward into y; backward from dy = r into g (g zeroed before)
    void (*forward)(gcase *c);
    void (*backward)(gcase *c);
    int      a[16]; // sizes and hyper-parameters
    float   *t[8];  // op-specific buffers (targets, saved state, scratch)
    int32_t *idx;   // class targets or indices
};

static float *fresh(size_t n) {
    return calloc(n ? n : 1, sizeof(float));
}

static float *random_fill(dt_rng *rng, size_t n, float scale, float shift) {
    float *x = fresh(n);
    for (size_t i = 0; i < n; i++)
        x[i] = dt_rng_normal(rng) * scale + shift;
    return x;
}

static void add_var(gcase *c, const char *name, float *v, size_t n) {
    DT_ASSERT(c->nvars < MAX_VARS);
    c->names[c->nvars] = name;
    c->v[c->nvars]     = v;
    c->g[c->nvars]     = fresh(n);
    c->n[c->nvars]     = n;
    c->nvars++;
}

static void set_output(gcase *c, size_t ny, dt_rng *rng) {
    c->ny = ny;
    c->y  = fresh(ny);
    c->r  = random_fill(rng, ny, 1.0f, 0.0f);
}

static double objective(gcase *c) {
    c->forward(c);
    double s = 0.0;
    for (size_t i = 0; i < c->ny; i++)
        s += (double)c->y[i] * c->r[i];
    return s;
}

static void run_case(const char *name, gcase *c) {
    check_current = name;
    for (int k = 0; k < c->nvars; k++)
        memset(c->g[k], 0, sizeof(float) * c->n[k]);
    c->forward(c);
    c->backward(c);
    for (int k = 0; k < c->nvars; k++) {
        double  num = 0.0, den = 0.0, maxfd = 0.0, maxerr = 0.0;
        size_t  worst = 0;
        double *fd    = calloc(c->n[k], sizeof(double));
        for (size_t i = 0; i < c->n[k]; i++) {
            float v    = c->v[k][i];
            c->v[k][i] = v + (float)EPS;
            double lp  = objective(c);
            c->v[k][i] = v - (float)EPS;
            double lm  = objective(c);
            c->v[k][i] = v;
            // the step actually taken in float
            fd[i] = (lp - lm) / ((double)(v + (float)EPS) - (double)(v - (float)EPS));
            maxfd = fmax(maxfd, fabs(fd[i]));
        }
        for (size_t i = 0; i < c->n[k]; i++) {
            double e = fabs(c->g[k][i] - fd[i]);
            num += e * e;
            den += fd[i] * fd[i];
            if (e > maxerr || isnan(c->g[k][i])) {
                maxerr = isnan(c->g[k][i]) ? INFINITY : e;
                worst  = i;
            }
        }
        double nerr = den > 0 ? sqrt(num / den) : sqrt(num);
        bool   ok   = nerr < NERR_MAX && maxerr <= ELEM_MAX * fmax(1.0, maxfd);
        if (!check_report(ok, c->names[k], __FILE__, __LINE__))
            fprintf(stderr,
                    "     %s d/d%s: normalised error %.3g, max error %.3g (element %zu: %.6g, "
                    "finite difference %.6g)\n",
                    name, c->names[k], nerr, maxerr, worst, (double)c->g[k][worst], fd[worst]);
        free(fd);
    }
    c->forward(c); // the op must not depend on state left by a previous call
    double again = 0.0, first = objective(c);
    c->forward(c);
    for (size_t i = 0; i < c->ny; i++)
        again += (double)c->y[i] * c->r[i];
    CHECK(again == first);
}

static void free_case(gcase *c) {
    for (int k = 0; k < c->nvars; k++) {
        free(c->v[k]);
        free(c->g[k]);
    }
    for (int i = 0; i < 8; i++)
        free(c->t[i]);
    free(c->y);
    free(c->r);
    free(c->idx);
    memset(c, 0, sizeof *c);
}

// ------------------------------------------------------------------------------ Conv2d

static dt_nn_conv2d conv_params(const gcase *c) {
    return (dt_nn_conv2d){c->a[0], c->a[1], c->a[2], c->a[3], c->a[4],
                          c->a[5], c->a[6], c->a[7], c->a[8], c->a[9]};
}

static void conv_fwd(gcase *c) {
    dt_nn_conv2d p = conv_params(c);
    dt_nn_conv2d_forward(&p, c->a[10], c->a[11], c->a[12], c->v[0], c->v[1],
                         p.bias ? c->v[2] : NULL, c->y, c->t[0]);
}

static void conv_bwd(gcase *c) {
    dt_nn_conv2d p = conv_params(c);
    dt_nn_conv2d_backward(&p, c->a[10], c->a[11], c->a[12], c->v[0], c->v[1], c->r, c->g[0],
                          c->g[1], p.bias ? c->g[2] : NULL, c->t[0]);
}

static void conv_case(const char *name, dt_nn_conv2d p, int n, int h, int w) {
    gcase  c   = {.forward = conv_fwd, .backward = conv_bwd};
    dt_rng rng = dt_rng_init(11);
    int    ho, wo;
    CHECK_OK(dt_nn_conv2d_check(&p, h, w, &ho, &wo));
    int v[13] = {p.cin, p.cout, p.kh, p.kw, p.sh, p.sw, p.ph, p.pw, p.groups, p.bias, n, h, w};
    memcpy(c.a, v, sizeof v);
    add_var(&c, "x", random_fill(&rng, (size_t)n * p.cin * h * w, 1.0f, 0.0f),
            (size_t)n * p.cin * h * w);
    size_t nw = dt_nn_conv2d_weight_count(&p);
    add_var(&c, "w", fresh(nw), nw);
    add_var(&c, "b", fresh((size_t)p.cout), (size_t)p.cout);
    dt_nn_conv2d_init(&p, &rng, c.v[1], c.v[2]);
    c.t[0] = fresh(dt_nn_conv2d_scratch(&p, h, w));
    set_output(&c, (size_t)n * p.cout * ho * wo, &rng);
    if (!p.bias)
        c.nvars = 2;
    run_case(name, &c);
    if (!p.bias)
        c.nvars = 3;
    free_case(&c);
}

static void test_conv2d(void) {
    conv_case("conv2d rect stride (2,1) pad (1,0)", (dt_nn_conv2d){3, 4, 3, 2, 2, 1, 1, 0, 1, true},
              2, 6, 5);
    conv_case("conv2d groups 2", (dt_nn_conv2d){4, 6, 3, 3, 1, 1, 1, 1, 2, false}, 2, 5, 4);
    conv_case("conv2d depthwise 1x3", (dt_nn_conv2d){3, 3, 1, 3, 1, 2, 0, 1, 3, true}, 1, 4, 7);
    // stride 1 without groups, on both paths (im2col, and shifted GEMMs)
    for (int path = 0; path < 2; path++) {
        setenv("DT_CONV", path ? "direct" : "gemm", 1);
        conv_case(path ? "conv2d 3x2 stride 1, direct" : "conv2d 3x2 stride 1, gemm",
                  (dt_nn_conv2d){3, 9, 3, 2, 1, 1, 1, 1, 1, true}, 2, 5, 6);
    }
    unsetenv("DT_CONV");
}

// ------------------------------------------------------------------------------ Linear

static void linear_fwd(gcase *c) {
    dt_nn_linear_forward(c->a[0], c->a[1], c->a[2], c->v[0], c->v[1], c->v[2], c->y);
}

static void linear_bwd(gcase *c) {
    dt_nn_linear_backward(c->a[0], c->a[1], c->a[2], c->v[0], c->v[1], c->r, c->g[0], c->g[1],
                          c->g[2]);
}

static void test_linear(void) {
    gcase  c   = {.forward = linear_fwd, .backward = linear_bwd, .a = {5, 7, 3}};
    dt_rng rng = dt_rng_init(12);
    add_var(&c, "x", random_fill(&rng, 35, 1.0f, 0.0f), 35);
    add_var(&c, "w", fresh(21), 21);
    add_var(&c, "b", fresh(3), 3);
    dt_nn_linear_init(7, 3, &rng, c.v[1], c.v[2]);
    set_output(&c, 15, &rng);
    run_case("linear", &c);
    free_case(&c);
}

// --------------------------------------------------------------------------- BatchNorm

// a: n, c, l, training; t[0..1]: running stats (restored every call, so each forward
// sees the same), t[2..3]: mean, invstd, t[4]: scratch
static void bn_fwd(gcase *c) {
    dt_nn_bn p = dt_nn_bn_default(c->a[1]);
    dt_nn_bn_init(&p, NULL, NULL, c->t[0], c->t[1]);
    for (int i = 0; i < c->a[1]; i++) { // eval mode: running stats away from (0, 1)
        c->t[0][i] = 0.1f * (float)i;
        c->t[1][i] = 0.5f + 0.25f * (float)i;
    }
    dt_nn_bn_forward(&p, c->a[0], c->a[2], c->a[3], c->v[0], c->v[1], c->v[2], c->t[0], c->t[1],
                     c->t[2], c->t[3], c->y);
}

static void bn_bwd(gcase *c) {
    dt_nn_bn p = dt_nn_bn_default(c->a[1]);
    dt_nn_bn_backward(&p, c->a[0], c->a[2], c->a[3], c->v[0], c->r, c->t[2], c->t[3], c->v[1],
                      c->g[0], c->g[1], c->g[2], c->t[4]);
}

static void bn_case(const char *name, int n, int ch, int l, bool training) {
    gcase  c     = {.forward = bn_fwd, .backward = bn_bwd, .a = {n, ch, l, training}};
    dt_rng rng   = dt_rng_init(13);
    size_t total = (size_t)n * ch * l;
    add_var(&c, "x", random_fill(&rng, total, 1.5f, 0.3f), total);
    add_var(&c, "gamma", random_fill(&rng, (size_t)ch, 0.3f, 1.0f), (size_t)ch);
    add_var(&c, "beta", random_fill(&rng, (size_t)ch, 0.3f, 0.0f), (size_t)ch);
    for (int i = 0; i < 4; i++)
        c.t[i] = fresh((size_t)ch);
    c.t[4] = fresh(2 * (size_t)ch);
    set_output(&c, total, &rng);
    run_case(name, &c);
    free_case(&c);
}

static void test_batchnorm(void) {
    bn_case("batchnorm2d train", 3, 2, 6, true);
    bn_case("batchnorm1d train", 7, 3, 1, true);
    bn_case("batchnorm2d eval", 2, 3, 4, false);
}

// --------------------------------------------------------------------------- LayerNorm

static void ln_fwd(gcase *c) {
    dt_nn_layernorm_forward(c->a[0], c->a[1], 1e-5f, c->v[0], c->v[1], c->v[2], c->y, c->t[0],
                            c->t[1]);
}

static void ln_bwd(gcase *c) {
    dt_nn_layernorm_backward(c->a[0], c->a[1], c->v[0], c->v[1], c->t[0], c->t[1], c->r, c->g[0],
                             c->g[1], c->g[2]);
}

static void test_layernorm(void) {
    // rows of 21: one vector of 16 and a tail
    gcase  c   = {.forward = ln_fwd, .backward = ln_bwd, .a = {4, 21}};
    dt_rng rng = dt_rng_init(14);
    add_var(&c, "x", random_fill(&rng, 84, 1.0f, 0.5f), 84);
    add_var(&c, "gamma", random_fill(&rng, 21, 0.3f, 1.0f), 21);
    add_var(&c, "beta", random_fill(&rng, 21, 0.3f, 0.0f), 21);
    c.t[0] = fresh(4);
    c.t[1] = fresh(4);
    set_output(&c, 84, &rng);
    run_case("layernorm", &c);
    free_case(&c);
}

// --------------------------------------------------------------------------- Embedding

static void emb_fwd(gcase *c) {
    CHECK_OK(dt_nn_embedding_forward(c->a[0], c->a[1], c->a[2], c->idx, c->v[0], c->y));
}

static void emb_bwd(gcase *c) {
    dt_nn_embedding_backward(c->a[0], c->a[2], c->idx, c->r, c->g[0]);
}

static void test_embedding(void) {
    gcase  c   = {.forward = emb_fwd, .backward = emb_bwd, .a = {6, 5, 3}};
    dt_rng rng = dt_rng_init(15);
    add_var(&c, "w", fresh(15), 15);
    dt_nn_embedding_init(5, 3, &rng, c.v[0]);
    c.idx        = calloc(6, sizeof(int32_t));
    int32_t v[6] = {4, 0, 4, 2, 4, 1}; // 4 three times, 3 never
    memcpy(c.idx, v, sizeof v);
    set_output(&c, 18, &rng);
    run_case("embedding", &c);
    free_case(&c);
}

// ------------------------------------------------------------- element-wise, softmax

static void act_fwd(gcase *c) {
    size_t n = (size_t)c->a[1];
    switch (c->a[0]) {
    case 0:
    case 1:
        dt_nn_gelu_forward(n, c->a[0] == 1, c->v[0], c->y);
        break;
    case 2:
        dt_nn_tanh_forward(n, c->v[0], c->y);
        break;
    case 3:
        dt_nn_sigmoid_forward(n, c->v[0], c->y);
        break;
    case 4:
        dt_nn_silu_forward(n, c->v[0], c->y);
        break;
    default:
        dt_nn_softmax_forward(c->a[2], c->a[3], c->v[0], c->y);
    }
}

static void act_bwd(gcase *c) {
    size_t n = (size_t)c->a[1];
    switch (c->a[0]) {
    case 0:
    case 1:
        dt_nn_gelu_backward(n, c->a[0] == 1, c->v[0], c->r, c->g[0]);
        break;
    case 2:
        dt_nn_tanh_backward(n, c->y, c->r, c->g[0]);
        break;
    case 3:
        dt_nn_sigmoid_backward(n, c->y, c->r, c->g[0]);
        break;
    case 4:
        dt_nn_silu_backward(n, c->v[0], c->r, c->g[0]);
        break;
    default:
        dt_nn_softmax_backward(c->a[2], c->a[3], c->y, c->r, c->g[0]);
    }
}

static void test_activations(void) {
    const char *names[] = {"gelu", "gelu tanh", "tanh", "sigmoid", "silu", "softmax"};
    for (int kind = 0; kind < 6; kind++) {
        gcase  c   = {.forward = act_fwd, .backward = act_bwd, .a = {kind, 48, 6, 8}};
        dt_rng rng = dt_rng_init(16 + (uint64_t)kind);
        add_var(&c, "x", random_fill(&rng, 48, 2.0f, 0.0f), 48);
        set_output(&c, 48, &rng);
        run_case(names[kind], &c);
        free_case(&c);
    }
}

// ----------------------------------------------------------------------------- Pooling

static void pool_fwd(gcase *c) {
    if (c->a[0]) {
        dt_nn_avgpool2d p = {c->a[5], c->a[6], c->a[7], c->a[8], c->a[9], c->a[10]};
        dt_nn_avgpool2d_forward(&p, 2, c->a[1], c->a[2], c->a[3], c->v[0], c->y);
    } else {
        dt_nn_adaptive_avgpool2d_forward(2, c->a[1], c->a[2], c->a[3], c->a[4], c->a[5], c->v[0],
                                         c->y);
    }
}

static void pool_bwd(gcase *c) {
    if (c->a[0]) {
        dt_nn_avgpool2d p = {c->a[5], c->a[6], c->a[7], c->a[8], c->a[9], c->a[10]};
        dt_nn_avgpool2d_backward(&p, 2, c->a[1], c->a[2], c->a[3], c->r, c->g[0]);
    } else {
        dt_nn_adaptive_avgpool2d_backward(2, c->a[1], c->a[2], c->a[3], c->a[4], c->a[5], c->r,
                                          c->g[0]);
    }
}

static void test_pooling(void) {
    for (int avg = 0; avg < 2; avg++) {
        // avg: 3x2 stride (2, 1) padding (1, 1) on 7x5; adaptive: 7x5 -> 3x4
        gcase c = {
            .forward = pool_fwd, .backward = pool_bwd, .a = {avg, 2, 7, 5, 0, 3, 2, 2, 1, 1, 1}};
        dt_rng rng = dt_rng_init(22);
        int    ho = 3, wo = 4;
        if (avg) {
            dt_nn_avgpool2d p = {3, 2, 2, 1, 1, 1};
            CHECK_OK(dt_nn_avgpool2d_check(&p, 7, 5, &ho, &wo));
        } else {
            c.a[4] = ho;
            c.a[5] = wo;
        }
        add_var(&c, "x", random_fill(&rng, 2 * 2 * 35, 1.0f, 0.0f), 2 * 2 * 35);
        set_output(&c, (size_t)2 * 2 * ho * wo, &rng);
        run_case(avg ? "avgpool2d" : "adaptive avgpool2d", &c);
        free_case(&c);
    }
}

// --------------------------------------------------------------------------- Attention

// a: B, T, C, H, shared; v[0]: packed qkv (B, T, 3C), or with `shared` one (B, T, C)
// tensor used as q, k and v at once (fan-out: its gradient is the sum of three);
// t[0]: lse, t[1]: scratch, t[2]: packed gradient for the shared case.
static void attn_fwd(gcase *c) {
    int B = c->a[0], T = c->a[1], C = c->a[2], H = c->a[3];
    if (c->a[4])
        dt_nn_attn_forward(B, T, C, H, C, c->v[0], c->v[0], c->v[0], c->y, c->t[0], c->t[1]);
    else
        dt_nn_attn_forward(B, T, C, H, 3 * C, c->v[0], c->v[0] + C, c->v[0] + 2 * C, c->y, c->t[0],
                           c->t[1]);
}

static void attn_bwd(gcase *c) {
    int B = c->a[0], T = c->a[1], C = c->a[2], H = c->a[3];
    if (!c->a[4]) {
        dt_nn_attn_backward(B, T, C, H, 3 * C, c->v[0], c->v[0] + C, c->v[0] + 2 * C, c->y, c->t[0],
                            c->r, c->g[0], c->g[0] + C, c->g[0] + 2 * C, c->t[1]);
        return;
    }
    size_t n  = (size_t)B * T * C;
    float *dq = c->t[2], *dk = dq + n, *dv = dk + n;
    dt_nn_attn_backward(B, T, C, H, C, c->v[0], c->v[0], c->v[0], c->y, c->t[0], c->r, dq, dk, dv,
                        c->t[1]);
    memcpy(c->g[0], dq, sizeof(float) * n);
    dt_nn_accumulate(n, dk, c->g[0]);
    dt_nn_accumulate(n, dv, c->g[0]);
}

static void attn_case(const char *name, int B, int T, int C, int H, bool shared) {
    gcase  c   = {.forward = attn_fwd, .backward = attn_bwd, .a = {B, T, C, H, shared}};
    dt_rng rng = dt_rng_init(23);
    size_t nin = (size_t)B * T * C * (shared ? 1 : 3);
    add_var(&c, "qkv", random_fill(&rng, nin, 1.0f, 0.0f), nin);
    c.t[0] = fresh((size_t)B * H * T);
    c.t[1] = fresh(dt_nn_attn_scratch(C / H));
    c.t[2] = fresh(3 * (size_t)B * T * C);
    set_output(&c, (size_t)B * T * C, &rng);
    run_case(name, &c);
    free_case(&c);
}

static void test_attention(void) {
    attn_case("attention packed, T over two blocks", 1, 67, 4, 2, false);
    attn_case("attention q = k = v (fan-out)", 2, 9, 6, 3, true);
}

// ------------------------------------------------------------------------------ Losses

// a: kind, n (rows), k (classes); t[0]: targets; y: the loss; r = 1
static void loss_fwd(gcase *c) {
    size_t n = (size_t)c->a[1];
    switch (c->a[0]) {
    case 0:
        c->y[0] = dt_nn_mse_loss(n, c->v[0], c->t[0], NULL);
        break;
    case 1:
        c->y[0] = dt_nn_l1_loss(n, c->v[0], c->t[0], NULL);
        break;
    case 2:
        c->y[0] = dt_nn_bce_logits_loss(n, c->v[0], c->t[0], NULL);
        break;
    default:
        CHECK_OK(dt_nn_cross_entropy(c->a[1], c->a[2], c->v[0], c->idx, -100, 0.15f, c->y, NULL));
    }
}

static void loss_bwd(gcase *c) {
    size_t n = (size_t)c->a[1];
    float  loss;
    switch (c->a[0]) {
    case 0:
        dt_nn_mse_loss(n, c->v[0], c->t[0], c->g[0]);
        break;
    case 1:
        dt_nn_l1_loss(n, c->v[0], c->t[0], c->g[0]);
        break;
    case 2:
        dt_nn_bce_logits_loss(n, c->v[0], c->t[0], c->g[0]);
        break;
    default:
        CHECK_OK(
            dt_nn_cross_entropy(c->a[1], c->a[2], c->v[0], c->idx, -100, 0.15f, &loss, c->g[0]));
    }
}

static void test_losses(void) {
    const char *names[] = {"mse", "l1", "bce with logits", "cross-entropy ignore + smoothing"};
    for (int kind = 0; kind < 4; kind++) {
        int    n = kind == 3 ? 6 : 20, k = 5;
        size_t nx  = kind == 3 ? (size_t)n * k : (size_t)n;
        gcase  c   = {.forward = loss_fwd, .backward = loss_bwd, .a = {kind, n, k}};
        dt_rng rng = dt_rng_init(30 + (uint64_t)kind);
        add_var(&c, "x", random_fill(&rng, nx, 1.5f, 0.0f), nx);
        c.t[0] = fresh(nx);
        for (size_t i = 0; i < nx; i++) // targets; for L1 at least 0.1 from x (no kink)
            c.t[0][i] = kind == 2
                            ? dt_rng_uniform(&rng)
                            : c.v[0][i] + (i % 2 ? 1.0f : -1.0f) * (0.1f + dt_rng_uniform(&rng));
        c.idx        = calloc(6, sizeof(int32_t));
        int32_t t[6] = {3, -100, 0, 4, -100, 1};
        memcpy(c.idx, t, sizeof t);
        c.ny   = 1;
        c.y    = fresh(1);
        c.r    = fresh(1);
        c.r[0] = 1.0f;
        run_case(names[kind], &c);
        free_case(&c);
    }
}

// ------------------------------------------------------------------ fan-out in a block

// x -> a = Linear(x) -> y = a + tanh(LayerNorm(a)): a feeds both branches of the
// residual add, so da = dy + (the LayerNorm branch's gradient), summed with
// dt_nn_accumulate; then Linear's backward. t[0]: a, t[1]: ln out, t[2]: tanh out,
// t[3..4]: mean, rstd, t[5..7]: gradients.
static void block_fwd(gcase *c) {
    int n = c->a[0], in = c->a[1], d = c->a[2];
    dt_nn_linear_forward(n, in, d, c->v[0], c->v[1], c->v[2], c->t[0]);
    dt_nn_layernorm_forward(n, d, 1e-5f, c->t[0], NULL, NULL, c->t[1], c->t[3], c->t[4]);
    dt_nn_tanh_forward((size_t)n * d, c->t[1], c->t[2]);
    dt_nn_add_forward((size_t)n * d, c->t[0], c->t[2], c->y);
}

static void block_bwd(gcase *c) {
    int    n = c->a[0], in = c->a[1], d = c->a[2];
    size_t nd = (size_t)n * d;
    float *da = c->t[5], *dt = c->t[6], *dln = c->t[7];
    memcpy(da, c->r, sizeof(float) * nd); // the add's identity branch
    dt_nn_tanh_backward(nd, c->t[2], c->r, dt);
    dt_nn_layernorm_backward(n, d, c->t[0], NULL, c->t[3], c->t[4], dt, dln, NULL, NULL);
    dt_nn_accumulate(nd, dln, da);
    dt_nn_linear_backward(n, in, d, c->v[0], c->v[1], da, c->g[0], c->g[1], c->g[2]);
}

static void test_fanout(void) {
    gcase  c   = {.forward = block_fwd, .backward = block_bwd, .a = {3, 5, 6}};
    dt_rng rng = dt_rng_init(40);
    add_var(&c, "x", random_fill(&rng, 15, 1.0f, 0.0f), 15);
    add_var(&c, "w", fresh(30), 30);
    add_var(&c, "b", fresh(6), 6);
    dt_nn_linear_init(5, 6, &rng, c.v[1], c.v[2]);
    for (int i = 0; i < 8; i++)
        c.t[i] = fresh(18);
    set_output(&c, 18, &rng);
    run_case("residual block, fan-out of a", &c);
    free_case(&c);
}

int main(void) {
    RUN(test_conv2d);
    RUN(test_linear);
    RUN(test_batchnorm);
    RUN(test_layernorm);
    RUN(test_embedding);
    RUN(test_activations);
    RUN(test_pooling);
    RUN(test_attention);
    RUN(test_losses);
    RUN(test_fanout);
    return check_summary();
}
