// test_autocast.c: Linear and Conv2d in bf16 and fp16 (dt_graph_set_precision,
// dt_model_set_precision) against fp32, forward and backward, on odd shapes, on every
// GEMM path this CPU has (avx512bf16 where present) and on the forced fp32 fallback.
//
// The tolerance is the error bound of a product of rounded operands. Each output,
// input-gradient and weight-gradient element is a sum of K products a_i b_i. Rounding
// both operands to a format of unit roundoff u (bf16: 2^-8, fp16: 2^-11) changes each
// product by at most (2u + u^2) |a_i b_i|; summing in fp32 (in any order, in both the
// 16-bit run and the fp32 reference) adds at most 2 K 2^-24 sum |a_i b_i|. So
//     |out16 - out32| <= (2u + u^2 + 2 K 2^-24) * A,   A = sum_i |a_i| |b_i|,
// and A is computed exactly as that layer's fp32 output, input and weight gradients on
// |x|, |w|, |dy| with zero bias (a third copy of the layer). fp16 also rounds each
// product result to fp16: + u |out16|. The check is per element, with 1% slack for the
// fp32 rounding of A itself. Operands here are O(1), far from fp16's range limits and
// from bf16 denormals (which VDPBF16PS flushes). Each 16-bit run must also differ from
// fp32 somewhere, so a path that silently stayed fp32 would fail, and the bias gradients
// (fp32 sums in every mode) must match fp32 to 1e-5.
#include "../check.h"
#include "dtrain/graph.h"
#include "dtrain/nn.h"
#include "nn/nn_impl.h"
#include "nn/prec.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static float urand(uint64_t *s) {
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((*s >> 40) & 0xffffff) / 8388608.0f - 1.0f; // [-1, 1)
}

static double unit_roundoff(dt_precision p) {
    return p == DT_PREC_BF16 ? 1.0 / 256 : 1.0 / 2048;
}

// Compares n elements of a 16-bit result against fp32 with the bound above; returns
// the largest |difference| seen.
static double compare(const char *what, dt_precision p, int k, const float *lo, const float *ref,
                      const float *abs_sum, size_t n) {
    double u = unit_roundoff(p), rel = 2 * u + u * u + 2.0 * k * 0x1p-24, worst = 0;
    int    bad = 0;
    for (size_t i = 0; i < n; i++) {
        double tol = rel * abs_sum[i] * 1.01 + (p == DT_PREC_FP16 ? u * fabs(lo[i]) : 0) + 1e-30;
        double d   = fabs((double)lo[i] - (double)ref[i]);
        if (d > worst)
            worst = d;
        if (!(d <= tol) && bad++ < 3)
            fprintf(stderr, "  %s %s [%zu]: %.9g vs fp32 %.9g, bound %.3g\n", what,
                    dt_precision_name(p), i, lo[i], ref[i], tol);
    }
    CHECK(bad == 0);
    return worst;
}

// ------------------------------------------------------------------ graph layers

typedef struct layer_case {
    const char    *name;
    int            kind; // 0 linear, 1 conv
    dt_shape       in;
    int            cin, cout, kh, kw;
    dt_conv2d_opts co;
    int            k_fwd, k_dx, k_dw_per_sample; // the K of each product
} layer_case;

static dt_graph *graph_of(const layer_case *c) {
    dt_graph *g = NULL;
    dt_layer *l = NULL;
    CHECK_OK(dt_graph_new(&g, NULL));
    CHECK_OK(dt_graph_input(g, "x", &c->in));
    if (c->kind == 0)
        CHECK_OK(dt_layer_linear_new(&l, c->cin, c->cout, NULL));
    else
        CHECK_OK(dt_layer_conv2d_new(&l, c->cin, c->cout, c->kh, c->kw, &c->co));
    CHECK_OK(dt_graph_add(g, "l", l, "x"));
    CHECK_OK(dt_graph_finalize(g, 7));
    dt_graph_set_input_grad(g, true);
    return g;
}

static void graph_case(const layer_case *c, dt_precision p, int threads) {
    enum { B = 5 };
    dt_graph *g16 = graph_of(c), *g32 = graph_of(c), *ga = graph_of(c);
    CHECK_OK(dt_graph_set_precision(g16, p));
    CHECK(dt_graph_precision(g16) == p);
    CHECK_OK(dt_graph_set_threads(g16, threads));
    dt_params *pa = dt_graph_params(ga);
    float     *wa = dt_params_data(pa);
    size_t     np = dt_params_numel(pa);
    size_t     nw = dt_params_info(pa, 0)->count; // the weight; the bias after it
    for (size_t i = 0; i < np; i++)
        wa[i] = i < nw ? fabsf(wa[i]) : 0.0f;
    size_t   nx = B * dt_shape_numel(&c->in), ny = B * dt_shape_numel(dt_graph_node_shape(g32, -1));
    float   *x = malloc(sizeof(float) * nx), *xa = malloc(sizeof(float) * nx);
    float   *dy = malloc(sizeof(float) * ny), *dya = malloc(sizeof(float) * ny);
    uint64_t s = 42;
    for (size_t i = 0; i < nx; i++)
        xa[i] = fabsf(x[i] = urand(&s));
    for (size_t i = 0; i < ny; i++)
        dya[i] = fabsf(dy[i] = urand(&s));
    dt_graph *gs[3] = {g16, g32, ga};
    for (int i = 0; i < 3; i++) {
        CHECK_OK(dt_graph_forward(gs[i], (const void *[]){i == 2 ? xa : x}, B));
        dt_params_zero_grad(dt_graph_params(gs[i]));
        CHECK_OK(dt_graph_backward(gs[i], i == 2 ? dya : dy));
    }
    check_current = c->name;
    double w1     = compare("y", p, c->k_fwd, dt_graph_output(g16), dt_graph_output(g32),
                            dt_graph_output(ga), ny);
    double w2 = compare("dx", p, c->k_dx, dt_graph_input_grad(g16, 0), dt_graph_input_grad(g32, 0),
                        dt_graph_input_grad(ga, 0), nx);
    const float *d16 = dt_params_grads(dt_graph_params(g16)),
                *d32 = dt_params_grads(dt_graph_params(g32)), *dab = dt_params_grads(pa);
    double w3 = compare("dW", p, c->k_dw_per_sample * B, d16, d32, dab, nw);
    CHECK(w1 > 0 && w2 > 0 && w3 > 0); // the products really ran in 16 bits
    for (size_t i = nw; i < np; i++)   // bias: fp32 sums of dy in every mode
        CHECK_NEAR(d16[i], d32[i], 1e-5 * (1 + fabs(d32[i])));
    free(x), free(xa), free(dy), free(dya);
    for (int i = 0; i < 3; i++)
        dt_graph_free(gs[i]);
}

static const layer_case graph_cases[] = {
    // Linear over the last dimension of (3, 37): 15 rows of 37 -> 29
    {"linear (3,37)->29", 0, {2, {3, 37}, DT_ELEM_F32}, 37, 29, 0, 0, {0}, 37, 29, 3},
    // Conv 3->5, 3x2 kernel, stride (2,1), padding (1,0) on 11x9
    {"conv 3->5 k3x2 s2x1 p1x0",
     1,
     {3, {3, 11, 9}, DT_ELEM_F32},
     3,
     5,
     3,
     2,
     {.sh = 2, .sw = 1, .ph = 1, .pw = 0, .groups = 1, .bias = true},
     18,
     30,
     6 * 8},
    // Grouped conv 4->6 in 2 groups, 3x3, stride 1, padding 1 on 7x8
    {"conv 4->6 g2 k3 p1",
     1,
     {3, {4, 7, 8}, DT_ELEM_F32},
     4,
     6,
     3,
     3,
     {.sh = 1, .sw = 1, .ph = 1, .pw = 1, .groups = 2, .bias = true},
     18,
     27,
     56},
};

// ------------------------------------------------------------------ Sequential model

typedef struct model_case {
    const char *name;
    int         c, h, w;
    int         kind; // 0 linear, 1 conv
    int         out, k, stride, pad;
    int         k_fwd, k_dx, k_dw_per_sample;
} model_case;

static dt_model *model_of(const model_case *c) {
    dt_model *m = NULL;
    CHECK_OK(dt_model_new(&m, c->c, c->h, c->w));
    if (c->kind == 0)
        CHECK_OK(dt_model_add_linear(m, c->out));
    else
        CHECK_OK(dt_model_add_conv2d(m, c->out, c->k, c->stride, c->pad));
    CHECK_OK(dt_model_finalize(m, 3));
    dt_model_set_input_grad(m, true);
    return m;
}

static void model_case_run(const model_case *c, dt_precision p, int threads, int shards) {
    enum { B = 6 };
    dt_model *m16 = model_of(c), *m32 = model_of(c), *ma = model_of(c);
    CHECK_OK(dt_model_set_threads(m16, threads));
    CHECK_OK(dt_model_set_grad_shards(m16, shards));
    CHECK_OK(dt_model_set_precision(m16, p));
    CHECK(dt_model_precision(m16) == p);
    float *wa = dt_model_params(ma);
    size_t np = dt_model_num_params(ma), nw = dt_model_param_info(ma, 0)->count;
    for (size_t i = 0; i < np; i++)
        wa[i] = i < nw ? fabsf(wa[i]) : 0.0f;
    size_t   nx = B * dt_model_input_size(m32), ny = B * dt_model_output_size(m32);
    float   *x = malloc(sizeof(float) * nx), *xa = malloc(sizeof(float) * nx);
    float   *dy = malloc(sizeof(float) * ny), *dya = malloc(sizeof(float) * ny);
    uint64_t s = 9;
    for (size_t i = 0; i < nx; i++)
        xa[i] = fabsf(x[i] = urand(&s));
    for (size_t i = 0; i < ny; i++)
        dya[i] = fabsf(dy[i] = urand(&s));
    dt_model *ms[3] = {m16, m32, ma};
    for (int i = 0; i < 3; i++) {
        CHECK_OK(dt_model_forward(ms[i], i == 2 ? xa : x, B));
        dt_model_zero_grad(ms[i]);
        CHECK_OK(dt_model_backward(ms[i], i == 2 ? dya : dy));
    }
    check_current    = c->name;
    double       w1  = compare("y", p, c->k_fwd, dt_model_output(m16), dt_model_output(m32),
                               dt_model_output(ma), ny);
    double       w2  = compare("dx", p, c->k_dx, dt_model_input_grad(m16), dt_model_input_grad(m32),
                               dt_model_input_grad(ma), nx);
    const float *d16 = dt_model_grads(m16), *d32 = dt_model_grads(m32), *dab = dt_model_grads(ma);
    // With shards the linear weight gradient stays fp32 (nn.h): the bound still holds.
    double w3 = compare("dW", p, c->k_dw_per_sample * B, d16, d32, dab, nw);
    CHECK(w1 > 0 && w2 > 0);
    CHECK(w3 > 0 || (c->kind == 0 && shards));
    for (size_t i = nw; i < np; i++)
        CHECK_NEAR(d16[i], d32[i], 1e-5 * (1 + fabs(d32[i])));
    // Back to fp32: the same kernels as a model never switched, bitwise.
    CHECK_OK(dt_model_set_precision(m16, DT_PREC_FP32));
    CHECK_OK(dt_model_set_threads(m16, 1));
    CHECK_OK(dt_model_set_grad_shards(m16, 0));
    CHECK_OK(dt_model_forward(m16, x, B));
    CHECK_OK(dt_model_forward(m32, x, B));
    CHECK(memcmp(dt_model_output(m16), dt_model_output(m32), sizeof(float) * ny) == 0);
    free(x), free(xa), free(dy), free(dya);
    for (int i = 0; i < 3; i++)
        dt_model_free(ms[i]);
}

static const model_case model_cases[] = {
    {"model linear 37->29", 37, 1, 1, 0, 29, 0, 0, 0, 37, 29, 1},
    // stride 1 in bf16: conv16.c's kernels on the avx512bf16 path, im2col on the fp32 one
    {"model conv 3->7 k3 s1 p1 (bf16 kernels / wide path)", 3, 9, 11, 1, 7, 3, 1, 1, 27, 63, 99},
    {"model conv 5->17 k3 s1 p0 (8-row blocks, odd channels)", 5, 12, 13, 1, 17, 3, 1, 0, 45, 153,
     110},
    {"model conv 2->5 k3 s2 (strided path)", 2, 10, 9, 1, 5, 3, 2, 0, 18, 45, 16},
};

static void errors(void) {
    check_current = "errors";
    dt_graph *g   = NULL;
    CHECK_OK(dt_graph_new(&g, NULL));
    CHECK_ERR(dt_graph_set_precision(g, (dt_precision)7), DT_ERR_ARG, "fp32, bf16 or fp16");
    dt_graph_free(g);
    dt_model *m = NULL;
    CHECK_OK(dt_model_new(&m, 4, 1, 1));
    CHECK_ERR(dt_model_set_precision(m, DT_PREC_BF16), DT_ERR_ARG, "finalized");
    dt_model_free(m);
    dt_precision p;
    CHECK_OK(dt_precision_parse("bf16", &p));
    CHECK(p == DT_PREC_BF16);
    CHECK_ERR(dt_precision_parse("half", &p), DT_ERR_ARG, "\"half\"");
    CHECK(strcmp(dt_precision_name(DT_PREC_FP16), "fp16") == 0);
}

// The 16-bit saved state (Linear's bf16 copy of its input) exists only in 16-bit modes:
// a graph that ran in fp32 first reserves again when set to bf16, and then trains
// bitwise as one in bf16 from the start; back in fp32 it is bitwise fp32 again.
static void precision_switch(void) {
    check_current = "precision switch";
    layer_case c  = graph_cases[0];
    dt_graph  *g1 = graph_of(&c), *g2 = graph_of(&c), *g3 = graph_of(&c);
    enum { B = 4 };
    size_t   nx = B * dt_shape_numel(&c.in), ny = B * 3 * 29;
    float   *x = malloc(sizeof(float) * nx), *dy = malloc(sizeof(float) * ny);
    uint64_t s = 11;
    for (size_t i = 0; i < nx; i++)
        x[i] = urand(&s);
    for (size_t i = 0; i < ny; i++)
        dy[i] = urand(&s);
    CHECK_OK(dt_graph_forward(g1, (const void *[]){x}, B)); // fp32 buffers
    CHECK_OK(dt_graph_set_precision(g1, DT_PREC_BF16));
    CHECK_OK(dt_graph_set_precision(g2, DT_PREC_BF16));
    dt_graph *gs[2] = {g1, g2};
    for (int i = 0; i < 2; i++) {
        CHECK_OK(dt_graph_forward(gs[i], (const void *[]){x}, B));
        dt_params_zero_grad(dt_graph_params(gs[i]));
        CHECK_OK(dt_graph_backward(gs[i], dy));
    }
    size_t np = dt_params_numel(dt_graph_params(g1));
    CHECK(!memcmp(dt_graph_output(g1), dt_graph_output(g2), sizeof(float) * ny));
    CHECK(!memcmp(dt_params_grads(dt_graph_params(g1)), dt_params_grads(dt_graph_params(g2)),
                  sizeof(float) * np));
    CHECK(!memcmp(dt_graph_input_grad(g1, 0), dt_graph_input_grad(g2, 0), sizeof(float) * nx));
    CHECK_OK(dt_graph_set_precision(g1, DT_PREC_FP32));
    CHECK_OK(dt_graph_forward(g1, (const void *[]){x}, B));
    CHECK_OK(dt_graph_forward(g3, (const void *[]){x}, B));
    CHECK(!memcmp(dt_graph_output(g1), dt_graph_output(g3), sizeof(float) * ny));
    free(x), free(dy);
    dt_graph_free(g1), dt_graph_free(g2), dt_graph_free(g3);
}

// A bf16 convolution whose reduction is below DT_C16_MIN_K (the seed's first, K = 9)
// stays fp32 where the fp32 shifted kernels run: bitwise the fp32 model, forward and
// backward, whatever the GEMM path.
static void small_k_stays_fp32(void) {
    check_current  = "small K stays fp32";
    model_case c   = {"conv 1->6 k3", 1, 10, 12, 1, 6, 3, 1, 0, 9, 54, 80};
    dt_model  *m16 = model_of(&c), *m32 = model_of(&c);
    bool       fp32k = dt_nn_want_direct();
    CHECK_OK(dt_model_set_precision(m16, DT_PREC_BF16));
    enum { B = 3 };
    size_t   nx = B * dt_model_input_size(m32), ny = B * dt_model_output_size(m32);
    float   *x = malloc(sizeof(float) * nx), *dy = malloc(sizeof(float) * ny);
    uint64_t s = 5;
    for (size_t i = 0; i < nx; i++)
        x[i] = urand(&s);
    for (size_t i = 0; i < ny; i++)
        dy[i] = urand(&s);
    dt_model *ms[2] = {m16, m32};
    for (int i = 0; i < 2; i++) {
        CHECK_OK(dt_model_forward(ms[i], x, B));
        dt_model_zero_grad(ms[i]);
        CHECK_OK(dt_model_backward(ms[i], dy));
    }
    bool same =
        !memcmp(dt_model_output(m16), dt_model_output(m32), sizeof(float) * ny) &&
        !memcmp(dt_model_grads(m16), dt_model_grads(m32), sizeof(float) * dt_model_num_params(m32));
    CHECK(same == fp32k); // without the fp32 kernels it runs in bf16 on the GEMM path
    free(x), free(dy);
    dt_model_free(m16);
    dt_model_free(m32);
}

// The fused convolution (conv2d + relu (+ maxpool2d)) in bf16 on the fp32 GEMM path where
// the shifted GEMMs run (conv_team.c's direct_r16): its operands rounded to bf16 values,
// products on the fp32 kernels. Given an input, an output gradient and parameters that
// are bf16 values already, every rounding it does is the identity, so it must equal the
// fp32 model bit for bit (output, input gradient, parameter gradients); a path that
// rounded something else, or summed in another order, would not.
static void fused_bf16_operands(void) {
    check_current = "fused conv, bf16 operands on fp32";
    if (!dt_nn_want_direct() || dt_prec_path_get() != DT_PATH_FP32) {
        printf("fused conv, bf16 operands: the shifted GEMMs do not run here, skipped\n");
        return;
    }
    static const int shapes[][6] = {{3, 10, 12, 16, 1, 1},
                                    {5, 9, 11, 8, 0, 0}}; // c h w out pad pool
    for (int i = 0; i < 2; i++)
        for (int threads = 1; threads <= 2; threads++) {
            const int *sh = shapes[i];
            dt_model  *ms[2];
            for (int k = 0; k < 2; k++) {
                CHECK_OK(dt_model_new(&ms[k], sh[0], sh[1], sh[2]));
                CHECK_OK(dt_model_add_conv2d(ms[k], sh[3], 3, 1, sh[4]));
                CHECK_OK(dt_model_add_relu(ms[k]));
                if (sh[5])
                    CHECK_OK(dt_model_add_maxpool2d(ms[k], 2, 2));
                CHECK_OK(dt_model_finalize(ms[k], 3));
                dt_model_set_input_grad(ms[k], true);
                CHECK_OK(dt_model_set_threads(ms[k], threads));
                float *w = dt_model_params(ms[k]);
                dt_f32_round_bf16(w, w, dt_model_num_params(ms[k]));
            }
            CHECK_OK(dt_model_set_precision(ms[0], DT_PREC_BF16));
            enum { B = 4 };
            size_t   nx = B * dt_model_input_size(ms[1]), ny = B * dt_model_output_size(ms[1]);
            float   *x = malloc(sizeof(float) * nx), *dy = malloc(sizeof(float) * ny);
            uint64_t s = 11;
            for (size_t j = 0; j < nx; j++)
                x[j] = urand(&s);
            for (size_t j = 0; j < ny; j++)
                dy[j] = urand(&s);
            dt_f32_round_bf16(x, x, nx);
            dt_f32_round_bf16(dy, dy, ny);
            for (int k = 0; k < 2; k++) {
                CHECK_OK(dt_model_forward(ms[k], x, B));
                dt_model_zero_grad(ms[k]);
                CHECK_OK(dt_model_backward(ms[k], dy));
            }
            CHECK(!memcmp(dt_model_output(ms[0]), dt_model_output(ms[1]), sizeof(float) * ny));
            CHECK(!memcmp(dt_model_input_grad(ms[0]), dt_model_input_grad(ms[1]),
                          sizeof(float) * nx));
            CHECK(!memcmp(dt_model_grads(ms[0]), dt_model_grads(ms[1]),
                          sizeof(float) * dt_model_num_params(ms[1])));
            // and an input and gradient that are not bf16 values are rounded: then the
            // output and the weight gradient differ from fp32's
            for (size_t j = 0; j < nx; j++)
                x[j] = urand(&s);
            for (size_t j = 0; j < ny; j++)
                dy[j] = urand(&s);
            for (int k = 0; k < 2; k++) {
                CHECK_OK(dt_model_forward(ms[k], x, B));
                dt_model_zero_grad(ms[k]);
                CHECK_OK(dt_model_backward(ms[k], dy));
            }
            CHECK(memcmp(dt_model_output(ms[0]), dt_model_output(ms[1]), sizeof(float) * ny));
            CHECK(memcmp(dt_model_grads(ms[0]), dt_model_grads(ms[1]),
                         sizeof(float) * dt_model_param_info(ms[1], 0)->count));
            free(x), free(dy);
            dt_model_free(ms[0]), dt_model_free(ms[1]);
        }
}

// fp16's range, which the loss scaler exists for: a product past 65504 is inf (bf16's
// range is fp32's: finite), and gradients below fp16's smallest denormal (2^-24) vanish.
static void fp16_range(void) {
    check_current = "fp16 range";
    layer_case c  = graph_cases[0];
    for (int p = DT_PREC_BF16; p <= DT_PREC_FP16; p++) {
        dt_graph *g = graph_of(&c);
        CHECK_OK(dt_graph_set_precision(g, (dt_precision)p));
        dt_params *ps = dt_graph_params(g);
        float     *w  = dt_params_data(ps);
        for (size_t i = 0; i < dt_params_numel(ps); i++)
            w[i] = 100.0f; // sum of 37 products of 100 x 100: 370,000
        float x[3 * 37], dy[3 * 29];
        for (int i = 0; i < 3 * 37; i++)
            x[i] = 100.0f;
        for (int i = 0; i < 3 * 29; i++)
            dy[i] = 1e-10f; // times w = 100: 1e-8 per product, below 2^-24
        CHECK_OK(dt_graph_forward(g, (const void *[]){x}, 1));
        CHECK(p == DT_PREC_FP16 ? isinf(dt_graph_output(g)[0]) : isfinite(dt_graph_output(g)[0]));
        dt_params_zero_grad(ps);
        CHECK_OK(dt_graph_backward(g, dy));
        const float *dx = dt_graph_input_grad(g, 0);
        CHECK(p == DT_PREC_FP16 ? dx[0] == 0.0f : dx[0] > 0.0f);
        dt_graph_free(g);
    }
}

int main(void) {
    errors();
    fp16_range();
    dt_prec_path paths[] = {DT_PATH_AVX512BF16, DT_PATH_FP32};
    for (int pi = 0; pi < 2; pi++) {
        if (!dt_prec_path_supported(paths[pi])) {
            printf("path %s: not on this CPU, skipped\n", dt_prec_path_name(paths[pi]));
            continue;
        }
        CHECK_OK(dt_prec_path_set(paths[pi]));
        printf("path %s\n", dt_prec_path_name(paths[pi]));
        for (int prec = DT_PREC_BF16; prec <= DT_PREC_FP16; prec++) {
            if (prec == DT_PREC_FP16 && pi > 0)
                continue; // fp16 does not use the bf16 GEMM paths
            for (size_t i = 0; i < sizeof graph_cases / sizeof *graph_cases; i++)
                for (int t = 1; t <= 2; t++)
                    graph_case(&graph_cases[i], (dt_precision)prec, t);
            if (prec == DT_PREC_BF16) {
                small_k_stays_fp32();
                precision_switch();
                fused_bf16_operands();
            }
            for (size_t i = 0; i < sizeof model_cases / sizeof *model_cases; i++) {
                model_case_run(&model_cases[i], (dt_precision)prec, 1, 0);
                model_case_run(&model_cases[i], (dt_precision)prec, 2, 4);
            }
        }
    }
    return check_summary();
}
