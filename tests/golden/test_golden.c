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
#include "../check.h"
#include "nn/ops.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#define TOL 1e-5

// --------------------------------------------------------------- the fixture reader

typedef struct gtensor {
    char   name[32];
    int    dtype; // 0 float32, 1 int32
    int    ndim;
    int    shape[8];
    size_t count;
    void  *data;
} gtensor;

typedef struct fixture {
    char    name[64];
    int     n;
    gtensor t[24];
} fixture;

static uint32_t rd_u32(const unsigned char *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static void fixture_free(fixture *f) {
    for (int i = 0; i < f->n; i++)
        free(f->t[i].data);
    f->n = 0;
}

// Reads <dir>/<name>.bin; false (with a failed check naming the problem) when absent or
// malformed.
static bool fixture_load(fixture *f, const char *name) {
    memset(f, 0, sizeof *f);
    snprintf(f->name, sizeof f->name, "%s", name);
    const char *env = getenv("DT_GOLDEN_DIR");
    char        dir[512], path[640];
    if (env) {
        snprintf(dir, sizeof dir, "%s", env);
    } else { // the directory of this source file, then data/
        snprintf(dir, sizeof dir, "%s", __FILE__);
        char *slash = strrchr(dir, '/');
        if (slash)
            snprintf(slash, sizeof dir - (size_t)(slash - dir), "/data");
        else
            snprintf(dir, sizeof dir, "data");
    }
    snprintf(path, sizeof path, "%s/%s.bin", dir, name);
    FILE *fp = fopen(path, "rb");
    if (!CHECK(fp != NULL)) {
        fprintf(stderr, "     cannot open %s\n", path);
        return false;
    }
    fseek(fp, 0, SEEK_END);
    long size = ftell(fp);
    fseek(fp, 0, SEEK_SET);
    unsigned char *buf = malloc((size_t)size);
    bool           ok  = buf && fread(buf, 1, (size_t)size, fp) == (size_t)size;
    fclose(fp);
    size_t pos = 12;
    ok         = ok && size >= 12 && memcmp(buf, "DTGF", 4) == 0 && rd_u32(buf + 4) == 1;
    int count  = ok ? (int)rd_u32(buf + 8) : 0;
    ok         = ok && count <= 24;
    for (int i = 0; ok && i < count; i++) {
        gtensor *t  = &f->t[i];
        ok          = pos + 4 <= (size_t)size;
        uint32_t nl = ok ? rd_u32(buf + pos) : 0;
        ok          = ok && nl < sizeof t->name && pos + 12 + nl <= (size_t)size;
        if (!ok)
            break;
        memcpy(t->name, buf + pos + 4, nl);
        pos += 4 + nl;
        t->dtype = (int)rd_u32(buf + pos);
        t->ndim  = (int)rd_u32(buf + pos + 4);
        pos += 8;
        ok       = t->dtype <= 1 && t->ndim <= 8 && pos + 4 * (size_t)t->ndim <= (size_t)size;
        t->count = 1;
        for (int d = 0; ok && d < t->ndim; d++) {
            t->shape[d] = (int)rd_u32(buf + pos + 4 * (size_t)d);
            t->count *= (size_t)t->shape[d];
        }
        pos += 4 * (size_t)t->ndim;
        ok = ok && pos + 4 * t->count <= (size_t)size;
        if (!ok)
            break;
        t->data = malloc(4 * t->count + 4);
        for (size_t j = 0; j < t->count; j++) { // little-endian on disk, host order here
            uint32_t v = rd_u32(buf + pos + 4 * j);
            memcpy((char *)t->data + 4 * j, &v, 4);
        }
        pos += 4 * t->count;
        f->n = i + 1;
    }
    free(buf);
    if (!CHECK(ok && pos == (size_t)size)) {
        fprintf(stderr, "     %s: malformed fixture (at byte %zu of %ld)\n", path, pos, size);
        fixture_free(f);
        return false;
    }
    return true;
}

static gtensor *get(fixture *f, const char *name) {
    for (int i = 0; i < f->n; i++)
        if (strcmp(f->t[i].name, name) == 0)
            return &f->t[i];
    fprintf(stderr, "     %s: no tensor \"%s\"\n", f->name, name);
    abort(); // a fixture/test mismatch is a bug in the test
}

static float *fl(fixture *f, const char *name) {
    return get(f, name)->data;
}
static int32_t *in32(fixture *f, const char *name) {
    return get(f, name)->data;
}
static int cfg(fixture *f, int i) {
    gtensor *t = get(f, "cfg");
    DT_ASSERT((size_t)i < t->count);
    return ((int32_t *)t->data)[i];
}

// max|got - want| <= tol * max|want|, reported with the tensor's name.
static void expect(fixture *f, const char *name, const float *got, double tol) {
    gtensor     *t      = get(f, name);
    double       maxref = 0.0, maxerr = 0.0;
    size_t       worst = 0;
    const float *want  = t->data;
    for (size_t i = 0; i < t->count; i++) {
        double r = fabs(want[i]), e = fabs((double)got[i] - want[i]);
        maxref = r > maxref ? r : maxref;
        if (e > maxerr || isnan(got[i])) {
            maxerr = isnan(got[i]) ? INFINITY : e;
            worst  = i;
        }
    }
    double bound = tol * (maxref > 0 ? maxref : 1.0);
    if (!check_report(maxerr <= bound, name, __FILE__, __LINE__))
        fprintf(stderr, "     %s/%s: max error %.3g > %.3g (element %zu: %.9g, torch %.9g)\n",
                f->name, name, maxerr, bound, worst, (double)got[worst], (double)want[worst]);
}

static float *zeros(size_t n) {
    return calloc(n ? n : 1, sizeof(float));
}

// ------------------------------------------------------------------------ the tests

static void conv_case(const char *name) {
    fixture f;
    if (!fixture_load(&f, name))
        return;
    dt_nn_conv2d p = {.cin    = cfg(&f, 0),
                      .cout   = cfg(&f, 1),
                      .kh     = cfg(&f, 2),
                      .kw     = cfg(&f, 3),
                      .sh     = cfg(&f, 4),
                      .sw     = cfg(&f, 5),
                      .ph     = cfg(&f, 6),
                      .pw     = cfg(&f, 7),
                      .groups = cfg(&f, 8),
                      .bias   = cfg(&f, 9)};
    int          n = cfg(&f, 10), h = cfg(&f, 11), w = cfg(&f, 12), ho, wo;
    CHECK_OK(dt_nn_conv2d_check(&p, h, w, &ho, &wo));
    CHECK_EQ(get(&f, "y")->count, (size_t)n * p.cout * ho * wo);
    CHECK_EQ(get(&f, "w")->count, dt_nn_conv2d_weight_count(&p));
    float       *scratch = zeros(dt_nn_conv2d_scratch(&p, h, w));
    float       *y = zeros(get(&f, "y")->count), *dx = zeros(get(&f, "dx")->count);
    float       *dw = zeros(get(&f, "dw")->count), *db = zeros((size_t)p.cout);
    const float *b = p.bias ? fl(&f, "b") : NULL;
    dt_nn_conv2d_forward(&p, n, h, w, fl(&f, "x"), fl(&f, "w"), b, y, scratch);
    expect(&f, "y", y, TOL);
    dt_nn_conv2d_backward(&p, n, h, w, fl(&f, "x"), fl(&f, "w"), fl(&f, "dy"), dx, dw, db, scratch);
    expect(&f, "dx", dx, TOL);
    expect(&f, "dw", dw, TOL);
    if (p.bias)
        expect(&f, "db", db, TOL);
    free(scratch), free(y), free(dx), free(dw), free(db);
    fixture_free(&f);
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
    if (!fixture_load(&f, name))
        return;
    int          n = cfg(&f, 0), in = cfg(&f, 1), out = cfg(&f, 2);
    bool         bias = cfg(&f, 3);
    float       *y = zeros((size_t)n * out), *dx = zeros((size_t)n * in);
    float       *dw = zeros((size_t)out * in), *db = zeros((size_t)out);
    const float *b = bias ? fl(&f, "b") : NULL;
    dt_nn_linear_forward(n, in, out, fl(&f, "x"), fl(&f, "w"), b, y);
    expect(&f, "y", y, TOL);
    dt_nn_linear_backward(n, in, out, fl(&f, "x"), fl(&f, "w"), fl(&f, "dy"), dx, dw,
                          bias ? db : NULL);
    expect(&f, "dx", dx, TOL);
    expect(&f, "dw", dw, TOL);
    if (bias)
        expect(&f, "db", db, TOL);
    free(y), free(dx), free(dw), free(db);
    fixture_free(&f);
}

static void test_linear(void) {
    linear_case("linear_bias");
    linear_case("linear_nobias");
    linear_case("linear_wide");
}

static void bn_case(const char *name) {
    fixture f;
    if (!fixture_load(&f, name))
        return;
    int      n = cfg(&f, 0), c = cfg(&f, 1), l = cfg(&f, 2);
    bool     training = cfg(&f, 3);
    dt_nn_bn p        = dt_nn_bn_default(c);
    size_t   total    = (size_t)n * c * l;
    float   *rm = zeros((size_t)c), *rv = zeros((size_t)c), *mean = zeros((size_t)c);
    float   *invstd = zeros((size_t)c), *y = zeros(total), *dx = zeros(total);
    float   *dg = zeros((size_t)c), *dbt = zeros((size_t)c), *scratch = zeros(2 * (size_t)c);
    memcpy(rm, fl(&f, "running_mean0"), sizeof(float) * (size_t)c);
    memcpy(rv, fl(&f, "running_var0"), sizeof(float) * (size_t)c);
    dt_nn_bn_forward(&p, n, l, training, fl(&f, "x"), fl(&f, "gamma"), fl(&f, "beta"), rm, rv, mean,
                     invstd, y);
    expect(&f, "y", y, TOL);
    expect(&f, "running_mean", rm, TOL);
    expect(&f, "running_var", rv, TOL);
    dt_nn_bn_backward(&p, n, l, training, fl(&f, "x"), fl(&f, "dy"), mean, invstd, fl(&f, "gamma"),
                      dx, dg, dbt, scratch);
    expect(&f, "dx", dx, TOL);
    expect(&f, "dgamma", dg, TOL);
    expect(&f, "dbeta", dbt, TOL);
    if (training) { // the split path (as SyncBatchNorm calls it) gives the same
        float *s = zeros((size_t)c), *q = zeros((size_t)c), *y2 = zeros(total);
        memcpy(rm, fl(&f, "running_mean0"), sizeof(float) * (size_t)c);
        memcpy(rv, fl(&f, "running_var0"), sizeof(float) * (size_t)c);
        dt_nn_bn_stats(n, c, l, fl(&f, "x"), s, q);
        dt_nn_bn_moments(&p, (double)n * l, s, q, mean, invstd, rm, rv);
        dt_nn_bn_apply(n, c, l, fl(&f, "x"), mean, invstd, fl(&f, "gamma"), fl(&f, "beta"), y2);
        expect(&f, "y", y2, TOL);
        expect(&f, "running_var", rv, TOL);
        free(s), free(q), free(y2);
    }
    free(rm), free(rv), free(mean), free(invstd), free(y), free(dx), free(dg), free(dbt);
    free(scratch);
    fixture_free(&f);
}

static void test_batchnorm(void) {
    bn_case("bn2d_train");
    bn_case("bn2d_eval");
    bn_case("bn1d_train");
    bn_case("bn1d_3d_train");
}

static void layernorm_case(const char *name) {
    fixture f;
    if (!fixture_load(&f, name))
        return;
    int    rows = cfg(&f, 0), d = cfg(&f, 1);
    size_t total = (size_t)rows * d;
    float *y = zeros(total), *dx = zeros(total), *mean = zeros((size_t)rows);
    float *rstd = zeros((size_t)rows), *dg = zeros((size_t)d), *dbt = zeros((size_t)d);
    dt_nn_layernorm_forward(rows, d, 1e-5f, fl(&f, "x"), fl(&f, "gamma"), fl(&f, "beta"), y, mean,
                            rstd);
    expect(&f, "y", y, TOL);
    dt_nn_layernorm_backward(rows, d, fl(&f, "x"), fl(&f, "gamma"), mean, rstd, fl(&f, "dy"), dx,
                             dg, dbt);
    expect(&f, "dx", dx, TOL);
    expect(&f, "dgamma", dg, TOL);
    expect(&f, "dbeta", dbt, TOL);
    free(y), free(dx), free(mean), free(rstd), free(dg), free(dbt);
    fixture_free(&f);
}

static void test_layernorm(void) {
    layernorm_case("layernorm");
    layernorm_case("layernorm_wide");
}

static void test_embedding(void) {
    fixture f;
    if (!fixture_load(&f, "embedding"))
        return;
    int    num = cfg(&f, 0), d = cfg(&f, 1), count = cfg(&f, 2);
    float *y = zeros((size_t)count * d), *dw = zeros((size_t)num * d);
    CHECK_OK(dt_nn_embedding_forward(count, num, d, in32(&f, "idx"), fl(&f, "w"), y));
    expect(&f, "y", y, TOL);
    dt_nn_embedding_backward(count, d, in32(&f, "idx"), fl(&f, "dy"), dw);
    expect(&f, "dw", dw, TOL);
    int32_t bad[2] = {0, num};
    CHECK_ERR(dt_nn_embedding_forward(2, num, d, bad, fl(&f, "w"), y), DT_ERR_ARG, "position 1");
    free(y), free(dw);
    fixture_free(&f);
}

typedef enum { ACT_GELU, ACT_GELU_TANH, ACT_TANH, ACT_SIGMOID, ACT_SILU } act_kind;

static void act_case(const char *name, act_kind kind) {
    fixture f;
    if (!fixture_load(&f, name))
        return;
    size_t       n = (size_t)cfg(&f, 0);
    const float *x = fl(&f, "x"), *dy = fl(&f, "dy");
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
    expect(&f, "y", y, TOL);
    expect(&f, "dx", dx, TOL);
    free(y), free(dx);
    fixture_free(&f);
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
    if (!fixture_load(&f, "softmax"))
        return;
    int    rows = cfg(&f, 0), d = cfg(&f, 1);
    float *y = zeros((size_t)rows * d), *dx = zeros((size_t)rows * d);
    dt_nn_softmax_forward(rows, d, fl(&f, "x"), y);
    expect(&f, "y", y, TOL);
    dt_nn_softmax_backward(rows, d, y, fl(&f, "dy"), dx);
    expect(&f, "dx", dx, TOL);
    free(y), free(dx);
    fixture_free(&f);
}

static void avgpool_case(const char *name) {
    fixture f;
    if (!fixture_load(&f, name))
        return;
    dt_nn_avgpool2d p = {cfg(&f, 0), cfg(&f, 1), cfg(&f, 2), cfg(&f, 3), cfg(&f, 4), cfg(&f, 5)};
    int             n = cfg(&f, 6), c = cfg(&f, 7), h = cfg(&f, 8), w = cfg(&f, 9), ho, wo;
    CHECK_OK(dt_nn_avgpool2d_check(&p, h, w, &ho, &wo));
    CHECK_EQ(get(&f, "y")->count, (size_t)n * c * ho * wo);
    float *y = zeros((size_t)n * c * ho * wo), *dx = zeros((size_t)n * c * h * w);
    dt_nn_avgpool2d_forward(&p, n, c, h, w, fl(&f, "x"), y);
    expect(&f, "y", y, TOL);
    dt_nn_avgpool2d_backward(&p, n, c, h, w, fl(&f, "dy"), dx);
    expect(&f, "dx", dx, TOL);
    free(y), free(dx);
    fixture_free(&f);
}

static void adaptive_case(const char *name) {
    fixture f;
    if (!fixture_load(&f, name))
        return;
    int    n = cfg(&f, 0), c = cfg(&f, 1), h = cfg(&f, 2), w = cfg(&f, 3);
    int    ho = cfg(&f, 4), wo = cfg(&f, 5);
    float *y = zeros((size_t)n * c * ho * wo), *dx = zeros((size_t)n * c * h * w);
    dt_nn_adaptive_avgpool2d_forward(n, c, h, w, ho, wo, fl(&f, "x"), y);
    expect(&f, "y", y, TOL);
    dt_nn_adaptive_avgpool2d_backward(n, c, h, w, ho, wo, fl(&f, "dy"), dx);
    expect(&f, "dx", dx, TOL);
    free(y), free(dx);
    fixture_free(&f);
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
    if (!fixture_load(&f, name))
        return;
    int          B = cfg(&f, 0), T = cfg(&f, 1), C = cfg(&f, 2), H = cfg(&f, 3);
    const float *qkv = fl(&f, "qkv");
    float       *y = zeros((size_t)B * T * C), *lse = zeros((size_t)B * H * T);
    float       *dqkv    = zeros((size_t)B * T * 3 * C);
    float       *scratch = zeros(dt_nn_attn_scratch(C / H));
    dt_nn_attn_forward(B, T, C, H, 3 * C, qkv, qkv + C, qkv + 2 * C, y, lse, scratch);
    expect(&f, "y", y, TOL);
    dt_nn_attn_backward(B, T, C, H, 3 * C, qkv, qkv + C, qkv + 2 * C, y, lse, fl(&f, "dy"), dqkv,
                        dqkv + C, dqkv + 2 * C, scratch);
    expect(&f, "dqkv", dqkv, TOL);
    free(y), free(lse), free(dqkv), free(scratch);
    fixture_free(&f);
}

static void test_attention(void) {
    attn_case("attention");
    attn_case("attention_short");
    CHECK_ERR(dt_nn_attn_check(1, 8, 10, 3, 10), DT_ERR_ARG, "heads 3");
}

typedef float (*pointwise_loss)(size_t, const float *, const float *, float *);

static void loss_case(const char *name, pointwise_loss fn) {
    fixture f;
    if (!fixture_load(&f, name))
        return;
    size_t n    = (size_t)cfg(&f, 0);
    float *dx   = zeros(n);
    float  loss = fn(n, fl(&f, "x"), fl(&f, "t"), dx);
    expect(&f, "loss", &loss, TOL);
    expect(&f, "dx", dx, TOL);
    free(dx);
    fixture_free(&f);
}

static void ce_case(const char *name) {
    fixture f;
    if (!fixture_load(&f, name))
        return;
    int    n = cfg(&f, 0), k = cfg(&f, 1), ignore = cfg(&f, 2);
    float  ls = fl(&f, "ls")[0], loss = 0.0f;
    float *dx = zeros((size_t)n * k);
    CHECK_OK(dt_nn_cross_entropy(n, k, fl(&f, "x"), in32(&f, "target"), ignore, ls, &loss, dx));
    expect(&f, "loss", &loss, TOL);
    expect(&f, "dx", dx, TOL);
    free(dx);
    fixture_free(&f);
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
