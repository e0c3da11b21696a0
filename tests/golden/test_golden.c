// test_golden.c: every op of src/nn/ops.h against fixtures written by PyTorch
// (tests/golden/gen.py; format in tests/golden/README.md).
//
// Each fixture holds inputs, parameters, an output gradient dy, and PyTorch's output
// and gradients of sum(y * dy) (computed in float64 from the float32 inputs, then
// rounded). Per tensor the test asks max|dtrain - torch| <= tol * max|torch| with
// tol = 1e-5 for every tensor: float32 sums over at most a few hundred terms stay well
// inside it (the largest error measured is 4e-7 of scale, in attention's input gradient,
// whose blockwise softmax rescales partial sums a few more times than torch's one pass;
// it needs no looser bound at these sizes, T = 70 over two 64-row blocks).
// The fixtures' directory: DT_GOLDEN_DIR, else tests/golden/data beside this source.
#include "fixture.h"
#include "nn/ops.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#define TOL 1e-5

static float *zeros(size_t n) {
    return calloc(n ? n : 1, sizeof(float));
}

// ------------------------------------------------------------------------ the tests

static void conv_case(const char *name) {
    fixture f;
    if (!fx_load(&f, name))
        return;
    dt_nn_conv2d p = {.cin    = fx_cfg(&f, 0),
                      .cout   = fx_cfg(&f, 1),
                      .kh     = fx_cfg(&f, 2),
                      .kw     = fx_cfg(&f, 3),
                      .sh     = fx_cfg(&f, 4),
                      .sw     = fx_cfg(&f, 5),
                      .ph     = fx_cfg(&f, 6),
                      .pw     = fx_cfg(&f, 7),
                      .groups = fx_cfg(&f, 8),
                      .bias   = fx_cfg(&f, 9)};
    int          n = fx_cfg(&f, 10), h = fx_cfg(&f, 11), w = fx_cfg(&f, 12), ho, wo;
    CHECK_OK(dt_nn_conv2d_check(&p, h, w, &ho, &wo));
    CHECK_EQ(fx_get(&f, "y")->count, (size_t)n * p.cout * ho * wo);
    CHECK_EQ(fx_get(&f, "w")->count, dt_nn_conv2d_weight_count(&p));
    float       *scratch = zeros(dt_nn_conv2d_scratch(&p, h, w));
    float       *y = zeros(fx_get(&f, "y")->count), *dx = zeros(fx_get(&f, "dx")->count);
    float       *dw = zeros(fx_get(&f, "dw")->count), *db = zeros((size_t)p.cout);
    const float *b = p.bias ? fx_f32(&f, "b") : NULL;
    dt_nn_conv2d_forward(&p, n, h, w, fx_f32(&f, "x"), fx_f32(&f, "w"), b, y, scratch);
    fx_expect(&f, "y", y, TOL);
    dt_nn_conv2d_backward(&p, n, h, w, fx_f32(&f, "x"), fx_f32(&f, "w"), fx_f32(&f, "dy"), dx, dw,
                          db, scratch);
    fx_expect(&f, "dx", dx, TOL);
    fx_expect(&f, "dw", dw, TOL);
    if (p.bias)
        fx_expect(&f, "db", db, TOL);
    // without the input gradient (a network's first layer): the weight gradient alone
    // takes other kernels (the stem's, Winograd's without its dx pass)
    memset(dw, 0, sizeof(float) * fx_get(&f, "dw")->count);
    memset(db, 0, sizeof(float) * (size_t)p.cout);
    dt_nn_conv2d_backward(&p, n, h, w, fx_f32(&f, "x"), fx_f32(&f, "w"), fx_f32(&f, "dy"), NULL, dw,
                          db, scratch);
    fx_expect(&f, "dw", dw, TOL);
    if (p.bias)
        fx_expect(&f, "db", db, TOL);
    free(scratch), free(y), free(dx), free(dw), free(db);
    fx_free(&f);
}

// Every case on both paths: im2col + OpenBLAS, and (stride 1 without groups) the
// shifted-GEMM kernels that AVX-512 CPUs take by default.
static void test_conv2d(void) {
    const char *cases[] = {"conv2d_rect",         "conv2d_groups",       "conv2d_depthwise",
                           "conv2d_1x1_s2",       "conv2d_s1_rect",      "conv2d_s1_5x5",
                           "conv2d_chunks",       "conv2d_cl_s2",        "conv2d_cl_s1",
                           "conv2d_cl_stem",      "conv2d_cl_rect",      "conv2d_cl_wide",
                           "conv2d_cl_s3",        "conv2d_cl_stem_wide", "conv2d_cl_wino",
                           "conv2d_cl_wino_wide", "conv2d_cl_s2_7"};
    const char *saved = getenv("DT_CONV"), *saved_wino = getenv("DT_CONV_WINO");
    // im2col + OpenBLAS; dtrain's kernels; and those without Winograd (the direct
    // channels-in-lanes kernel then takes the stride-1 3x3 shapes)
    for (int path = 0; path < 3; path++) {
        setenv("DT_CONV", path ? "direct" : "gemm", 1);
        if (path == 2)
            setenv("DT_CONV_WINO", "0", 1);
        for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
            conv_case(cases[i]);
    }
    if (saved)
        setenv("DT_CONV", saved, 1);
    else
        unsetenv("DT_CONV");
    if (saved_wino)
        setenv("DT_CONV_WINO", saved_wino, 1);
    else
        unsetenv("DT_CONV_WINO");
}

static void linear_case(const char *name) {
    fixture f;
    if (!fx_load(&f, name))
        return;
    int          n = fx_cfg(&f, 0), in = fx_cfg(&f, 1), out = fx_cfg(&f, 2);
    bool         bias = fx_cfg(&f, 3);
    float       *y = zeros((size_t)n * out), *dx = zeros((size_t)n * in);
    float       *dw = zeros((size_t)out * in), *db = zeros((size_t)out);
    const float *b = bias ? fx_f32(&f, "b") : NULL;
    dt_nn_linear_forward(n, in, out, fx_f32(&f, "x"), fx_f32(&f, "w"), b, y);
    fx_expect(&f, "y", y, TOL);
    dt_nn_linear_backward(n, in, out, fx_f32(&f, "x"), fx_f32(&f, "w"), fx_f32(&f, "dy"), dx, dw,
                          bias ? db : NULL);
    fx_expect(&f, "dx", dx, TOL);
    fx_expect(&f, "dw", dw, TOL);
    if (bias)
        fx_expect(&f, "db", db, TOL);
    free(y), free(dx), free(dw), free(db);
    fx_free(&f);
}

static void test_linear(void) {
    linear_case("linear_bias");
    linear_case("linear_nobias");
    linear_case("linear_wide");
}

static void bn_case(const char *name) {
    fixture f;
    if (!fx_load(&f, name))
        return;
    int      n = fx_cfg(&f, 0), c = fx_cfg(&f, 1), l = fx_cfg(&f, 2);
    bool     training = fx_cfg(&f, 3);
    dt_nn_bn p        = dt_nn_bn_default(c);
    size_t   total    = (size_t)n * c * l;
    float   *rm = zeros((size_t)c), *rv = zeros((size_t)c), *mean = zeros((size_t)c);
    float   *invstd = zeros((size_t)c), *y = zeros(total), *dx = zeros(total);
    float   *dg = zeros((size_t)c), *dbt = zeros((size_t)c), *scratch = zeros(2 * (size_t)c);
    memcpy(rm, fx_f32(&f, "running_mean0"), sizeof(float) * (size_t)c);
    memcpy(rv, fx_f32(&f, "running_var0"), sizeof(float) * (size_t)c);
    dt_nn_bn_forward(&p, n, l, training, fx_f32(&f, "x"), fx_f32(&f, "gamma"), fx_f32(&f, "beta"),
                     rm, rv, mean, invstd, y);
    fx_expect(&f, "y", y, TOL);
    fx_expect(&f, "running_mean", rm, TOL);
    fx_expect(&f, "running_var", rv, TOL);
    dt_nn_bn_backward(&p, n, l, training, fx_f32(&f, "x"), fx_f32(&f, "dy"), mean, invstd,
                      fx_f32(&f, "gamma"), dx, dg, dbt, scratch);
    fx_expect(&f, "dx", dx, TOL);
    fx_expect(&f, "dgamma", dg, TOL);
    fx_expect(&f, "dbeta", dbt, TOL);
    if (training) { // the split path (as SyncBatchNorm calls it) gives the same
        double *s = calloc((size_t)c, sizeof(double)), *q = calloc((size_t)c, sizeof(double));
        float  *y2 = zeros(total);
        memcpy(rm, fx_f32(&f, "running_mean0"), sizeof(float) * (size_t)c);
        memcpy(rv, fx_f32(&f, "running_var0"), sizeof(float) * (size_t)c);
        dt_nn_bn_stats(n, c, l, fx_f32(&f, "x"), s, q);
        dt_nn_bn_moments(&p, (double)n * l, s, q, mean, invstd, rm, rv);
        dt_nn_bn_apply(n, c, l, fx_f32(&f, "x"), mean, invstd, fx_f32(&f, "gamma"),
                       fx_f32(&f, "beta"), y2);
        fx_expect(&f, "y", y2, TOL);
        fx_expect(&f, "running_var", rv, TOL);
        free(s), free(q), free(y2);
    }
    free(rm), free(rv), free(mean), free(invstd), free(y), free(dx), free(dg), free(dbt);
    free(scratch);
    fx_free(&f);
}

static void test_batchnorm(void) {
    bn_case("bn2d_train");
    bn_case("bn2d_eval");
    bn_case("bn1d_train");
    bn_case("bn1d_3d_train");
}

static void layernorm_case(const char *name) {
    fixture f;
    if (!fx_load(&f, name))
        return;
    int    rows = fx_cfg(&f, 0), d = fx_cfg(&f, 1);
    size_t total = (size_t)rows * d;
    float *y = zeros(total), *dx = zeros(total), *mean = zeros((size_t)rows);
    float *rstd = zeros((size_t)rows), *dg = zeros((size_t)d), *dbt = zeros((size_t)d);
    dt_nn_layernorm_forward(rows, d, 1e-5f, fx_f32(&f, "x"), fx_f32(&f, "gamma"),
                            fx_f32(&f, "beta"), y, mean, rstd);
    fx_expect(&f, "y", y, TOL);
    dt_nn_layernorm_backward(rows, d, fx_f32(&f, "x"), fx_f32(&f, "gamma"), mean, rstd,
                             fx_f32(&f, "dy"), dx, dg, dbt);
    fx_expect(&f, "dx", dx, TOL);
    fx_expect(&f, "dgamma", dg, TOL);
    fx_expect(&f, "dbeta", dbt, TOL);
    free(y), free(dx), free(mean), free(rstd), free(dg), free(dbt);
    fx_free(&f);
}

static void test_layernorm(void) {
    layernorm_case("layernorm");
    layernorm_case("layernorm_wide");
}

static void test_embedding(void) {
    fixture f;
    if (!fx_load(&f, "embedding"))
        return;
    int    num = fx_cfg(&f, 0), d = fx_cfg(&f, 1), count = fx_cfg(&f, 2);
    float *y = zeros((size_t)count * d), *dw = zeros((size_t)num * d);
    CHECK_OK(dt_nn_embedding_forward(count, num, d, fx_i32(&f, "idx"), fx_f32(&f, "w"), y));
    fx_expect(&f, "y", y, TOL);
    dt_nn_embedding_backward(count, d, fx_i32(&f, "idx"), fx_f32(&f, "dy"), dw);
    fx_expect(&f, "dw", dw, TOL);
    int32_t bad[2] = {0, num};
    CHECK_ERR(dt_nn_embedding_forward(2, num, d, bad, fx_f32(&f, "w"), y), DT_ERR_ARG,
              "position 1");
    free(y), free(dw);
    fx_free(&f);
}

typedef enum { ACT_GELU, ACT_GELU_TANH, ACT_TANH, ACT_SIGMOID, ACT_SILU } act_kind;

static void act_case(const char *name, act_kind kind) {
    fixture f;
    if (!fx_load(&f, name))
        return;
    size_t       n = (size_t)fx_cfg(&f, 0);
    const float *x = fx_f32(&f, "x"), *dy = fx_f32(&f, "dy");
    float       *y = zeros(n), *dx = zeros(n);
    switch (kind) {
    case ACT_GELU:
    case ACT_GELU_TANH:
        dt_nn_gelu_forward(n, kind == ACT_GELU_TANH, x, y);
        dt_nn_gelu_backward(n, kind == ACT_GELU_TANH, x, dy, dx);
        break;
    case ACT_TANH:
        dt_nn_tanh_forward(n, x, y);
        dt_nn_tanh_backward(n, y, dy, dx);
        break;
    case ACT_SIGMOID:
        dt_nn_sigmoid_forward(n, x, y);
        dt_nn_sigmoid_backward(n, y, dy, dx);
        break;
    case ACT_SILU:
        dt_nn_silu_forward(n, x, y);
        dt_nn_silu_backward(n, x, dy, dx);
        break;
    }
    fx_expect(&f, "y", y, TOL);
    fx_expect(&f, "dx", dx, TOL);
    free(y), free(dx);
    fx_free(&f);
}

static void test_activations(void) {
    act_case("gelu", ACT_GELU);
    act_case("gelu_tanh", ACT_GELU_TANH);
    act_case("tanh", ACT_TANH);
    act_case("sigmoid", ACT_SIGMOID);
    act_case("silu", ACT_SILU);
}

static void test_softmax(void) {
    fixture f;
    if (!fx_load(&f, "softmax"))
        return;
    int    rows = fx_cfg(&f, 0), d = fx_cfg(&f, 1);
    float *y = zeros((size_t)rows * d), *dx = zeros((size_t)rows * d);
    dt_nn_softmax_forward(rows, d, fx_f32(&f, "x"), y);
    fx_expect(&f, "y", y, TOL);
    dt_nn_softmax_backward(rows, d, y, fx_f32(&f, "dy"), dx);
    fx_expect(&f, "dx", dx, TOL);
    free(y), free(dx);
    fx_free(&f);
}

static void avgpool_case(const char *name) {
    fixture f;
    if (!fx_load(&f, name))
        return;
    dt_nn_avgpool2d p = {fx_cfg(&f, 0), fx_cfg(&f, 1), fx_cfg(&f, 2),
                         fx_cfg(&f, 3), fx_cfg(&f, 4), fx_cfg(&f, 5)};
    int n = fx_cfg(&f, 6), c = fx_cfg(&f, 7), h = fx_cfg(&f, 8), w = fx_cfg(&f, 9), ho, wo;
    CHECK_OK(dt_nn_avgpool2d_check(&p, h, w, &ho, &wo));
    CHECK_EQ(fx_get(&f, "y")->count, (size_t)n * c * ho * wo);
    float *y = zeros((size_t)n * c * ho * wo), *dx = zeros((size_t)n * c * h * w);
    dt_nn_avgpool2d_forward(&p, n, c, h, w, fx_f32(&f, "x"), y);
    fx_expect(&f, "y", y, TOL);
    dt_nn_avgpool2d_backward(&p, n, c, h, w, fx_f32(&f, "dy"), dx);
    fx_expect(&f, "dx", dx, TOL);
    free(y), free(dx);
    fx_free(&f);
}

static void adaptive_case(const char *name) {
    fixture f;
    if (!fx_load(&f, name))
        return;
    int    n = fx_cfg(&f, 0), c = fx_cfg(&f, 1), h = fx_cfg(&f, 2), w = fx_cfg(&f, 3);
    int    ho = fx_cfg(&f, 4), wo = fx_cfg(&f, 5);
    float *y = zeros((size_t)n * c * ho * wo), *dx = zeros((size_t)n * c * h * w);
    dt_nn_adaptive_avgpool2d_forward(n, c, h, w, ho, wo, fx_f32(&f, "x"), y);
    fx_expect(&f, "y", y, TOL);
    dt_nn_adaptive_avgpool2d_backward(n, c, h, w, ho, wo, fx_f32(&f, "dy"), dx);
    fx_expect(&f, "dx", dx, TOL);
    free(y), free(dx);
    fx_free(&f);
}

static void test_pooling(void) {
    avgpool_case("avgpool2d");
    avgpool_case("avgpool2d_plain");
    adaptive_case("adaptive_avgpool2d");
    adaptive_case("adaptive_avgpool2d_1x1");
    dt_nn_avgpool2d bad = {3, 3, 1, 1, 2, 0};
    int             ho, wo;
    CHECK_ERR(dt_nn_avgpool2d_check(&bad, 5, 5, &ho, &wo), DT_ERR_ARG, "half the kernel");
}

static void attn_case(const char *name) {
    fixture f;
    if (!fx_load(&f, name))
        return;
    int          B = fx_cfg(&f, 0), T = fx_cfg(&f, 1), C = fx_cfg(&f, 2), H = fx_cfg(&f, 3);
    const float *qkv = fx_f32(&f, "qkv");
    float       *y = zeros((size_t)B * T * C), *lse = zeros((size_t)B * H * T);
    float       *dqkv    = zeros((size_t)B * T * 3 * C);
    float       *scratch = zeros(dt_nn_attn_scratch(C / H));
    dt_nn_attn_forward(B, T, C, H, 3 * C, qkv, qkv + C, qkv + 2 * C, y, lse, scratch);
    fx_expect(&f, "y", y, TOL);
    dt_nn_attn_backward(B, T, C, H, 3 * C, qkv, qkv + C, qkv + 2 * C, y, lse, fx_f32(&f, "dy"),
                        dqkv, dqkv + C, dqkv + 2 * C, scratch);
    fx_expect(&f, "dqkv", dqkv, TOL);
    free(y), free(lse), free(dqkv), free(scratch);
    fx_free(&f);
}

static void test_attention(void) {
    attn_case("attention");
    attn_case("attention_short");
    CHECK_ERR(dt_nn_attn_check(1, 8, 10, 3, 10), DT_ERR_ARG, "heads 3");
}

typedef float (*pointwise_loss)(size_t, const float *, const float *, float *);

static void loss_case(const char *name, pointwise_loss fn) {
    fixture f;
    if (!fx_load(&f, name))
        return;
    size_t n    = (size_t)fx_cfg(&f, 0);
    float *dx   = zeros(n);
    float  loss = fn(n, fx_f32(&f, "x"), fx_f32(&f, "t"), dx);
    fx_expect(&f, "loss", &loss, TOL);
    fx_expect(&f, "dx", dx, TOL);
    free(dx);
    fx_free(&f);
}

static void ce_case(const char *name) {
    fixture f;
    if (!fx_load(&f, name))
        return;
    int    n = fx_cfg(&f, 0), k = fx_cfg(&f, 1), ignore = fx_cfg(&f, 2);
    float  ls = fx_f32(&f, "ls")[0], loss = 0.0f;
    float *dx = zeros((size_t)n * k);
    CHECK_OK(
        dt_nn_cross_entropy(n, k, fx_f32(&f, "x"), fx_i32(&f, "target"), ignore, ls, &loss, dx));
    fx_expect(&f, "loss", &loss, TOL);
    fx_expect(&f, "dx", dx, TOL);
    free(dx);
    fx_free(&f);
}

static void test_losses(void) {
    loss_case("mse", dt_nn_mse_loss);
    loss_case("l1", dt_nn_l1_loss);
    loss_case("bce_logits", dt_nn_bce_logits_loss);
    ce_case("cross_entropy");
    ce_case("cross_entropy_ignore_smooth");
    ce_case("cross_entropy_ignore_class");
    float   x[4]   = {1, 2, 3, 4}, loss;
    int32_t bad[2] = {0, 4};
    CHECK_ERR(dt_nn_cross_entropy(2, 2, x, bad, -100, 0.0f, &loss, NULL), DT_ERR_ARG, "row 1");
}

// The *_init functions cannot match torch's draws (another generator); they must match
// its distributions: U(-1/sqrt(fan_in), 1/sqrt(fan_in)) for conv and linear weights and
// biases, N(0, 1) for Embedding.
static void test_init(void) {
    dt_nn_conv2d p = {
        .cin = 8, .cout = 64, .kh = 3, .kw = 2, .sh = 1, .sw = 1, .groups = 2, .bias = true};
    size_t nw = dt_nn_conv2d_weight_count(&p);
    CHECK_EQ(nw, 64 * 4 * 3 * 2);
    float *w = zeros(nw), *b = zeros(64);
    dt_rng rng = dt_rng_init(7);
    dt_nn_conv2d_init(&p, &rng, w, b);
    double bound = 1.0 / sqrt(4 * 3 * 2), mx = 0, s2 = 0;
    for (size_t i = 0; i < nw; i++) {
        mx = fmax(mx, fabs(w[i]));
        s2 += (double)w[i] * w[i];
    }
    CHECK(mx <= bound && mx > 0.95 * bound);
    CHECK_NEAR(s2 / (double)nw, bound * bound / 3, 0.1 * bound * bound / 3);
    mx = 0;
    for (int i = 0; i < 64; i++)
        mx = fmax(mx, fabs(b[i]));
    CHECK(mx <= bound && mx > 0.8 * bound);
    float *e = zeros(4000);
    dt_nn_embedding_init(400, 10, &rng, e);
    double m = 0, v = 0;
    for (int i = 0; i < 4000; i++)
        m += e[i];
    m /= 4000;
    for (int i = 0; i < 4000; i++)
        v += (e[i] - m) * (e[i] - m);
    CHECK_NEAR(m, 0.0, 0.06);
    CHECK_NEAR(v / 4000, 1.0, 0.08);
    free(w), free(b), free(e);
}

int main(void) {
    RUN(test_conv2d);
    RUN(test_linear);
    RUN(test_batchnorm);
    RUN(test_layernorm);
    RUN(test_embedding);
    RUN(test_activations);
    RUN(test_softmax);
    RUN(test_pooling);
    RUN(test_attention);
    RUN(test_losses);
    RUN(test_init);
    return check_summary();
}
