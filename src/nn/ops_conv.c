// ops_conv.c: Conv2d of any kernel, stride, padding and groups, and Linear, as im2col
// plus the sgemm row (ops.h). The generic, correct path: the shifted-GEMM kernels of
// conv2d.c serve the seed's square stride-1 shapes inside dt_model, and the graph may
// route such shapes to them later.
//
// A column matrix (cin*kh*kw, S*ho*wo) is built for S samples at a time, S such that
// about 1024 columns make one GEMM per group (S = 1 from 32x32 images up; it stays in L2
// for the shapes of the ResNet workload: 144 x 1024 floats at most). Backward rebuilds
// the columns rather than keeping them from forward.
//
// Stride 1 without groups, on CPUs with AVX2 or AVX-512 (dt_nn_want_direct: DT_CONV=gemm|direct
// overrides), skips the column matrix: in the "wide" layout of conv2d.c (output
// positions indexed over the padded input's width wp) each im2col row is the slice
// xp + c*plane + ki*wp + kj of the padded input, so forward, weight gradient and input
// gradient are dtrain's shifted GEMMs (kernels/vec/shifted.c) reading the input in place.
//
// Before both, on AVX-512 CPUs, the channels-in-lanes rows (kernels/avx512/conv_cl.c)
// take convolutions without groups whose output channels are a multiple of 16 (the
// ResNet's, except its 1x1 shortcuts): 3x3 stride 1 forward and input gradient as
// Winograd F(2x2, 3x3), the 1-channel stem with its own kernel, the rest (stride 2,
// weight gradients) with channels in the vector lanes. DT_CONV_CL=0 declines them;
// DT_CONV_WINO=0 keeps Winograd out.
//
// Where a provider is built (kernels/dnnl: oneDNN), its rows take the shapes it was
// measured faster on (conv_ext_ok), after the channels-in-lanes rows.
#include "nn/blas.h"
#include "nn/conv16.h"
#include "nn/nn_impl.h"
#include "nn/ops.h"
#include "nn/prec.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int out_len(int in, int pad, int k, int stride) {
    return (in + 2 * pad - k) / stride + 1;
}

dt_status dt_nn_conv2d_check(const dt_nn_conv2d *p, int h, int w, int *ho, int *wo) {
    if (p->cin < 1 || p->cout < 1 || p->kh < 1 || p->kw < 1 || p->sh < 1 || p->sw < 1 ||
        p->ph < 0 || p->pw < 0 || p->groups < 1 || h < 1 || w < 1)
        return dt_fail(DT_ERR_ARG,
                       "conv2d: expected positive channels (%d, %d), kernel (%d, %d), stride "
                       "(%d, %d), groups %d and input (%d, %d), and padding (%d, %d) >= 0",
                       p->cin, p->cout, p->kh, p->kw, p->sh, p->sw, p->groups, h, w, p->ph, p->pw);
    if (p->cin % p->groups || p->cout % p->groups)
        return dt_fail(DT_ERR_ARG,
                       "conv2d: groups %d must divide in_channels %d and out_channels %d",
                       p->groups, p->cin, p->cout);
    if (h + 2 * p->ph < p->kh || w + 2 * p->pw < p->kw)
        return dt_fail(DT_ERR_ARG,
                       "conv2d: kernel (%d, %d) does not fit the padded input (%d, %d) + (%d, %d)",
                       p->kh, p->kw, h, w, 2 * p->ph, 2 * p->pw);
    *ho = out_len(h, p->ph, p->kh, p->sh);
    *wo = out_len(w, p->pw, p->kw, p->sw);
    return DT_OK;
}

size_t dt_nn_conv2d_weight_count(const dt_nn_conv2d *p) {
    return (size_t)p->cout * (size_t)(p->cin / p->groups) * (size_t)p->kh * (size_t)p->kw;
}

// The wide layout of one sample (kernels/table.h): padded input planes of hp x wp, n
// wide output positions, gradient rows with `margin` zeros in front so that every
// shifted read of the input gradient stays inside its row of ld floats.
typedef dt_kwide wide;

static wide wide_geom(const dt_nn_conv2d *p, int h, int w) {
    wide g;
    g.hp     = h + 2 * p->ph;
    g.wp     = w + 2 * p->pw;
    g.plane  = (size_t)g.hp * g.wp;
    g.n      = (g.hp - p->kh + 1) * g.wp - (p->kw - 1);
    g.margin = (p->kh - 1) * g.wp + (p->kw - 1);
    g.ld     = (size_t)g.margin + g.plane;
    return g;
}

// Which path, measured on the ResNet's shapes (Zen 4, thread CPU time): forward is faster
// on the shifted GEMMs everywhere (0.75x the im2col time on the 1-channel stem and the
// 7x7 stage, 0.45-0.6x at 14x14 and 28x28); backward only with reductions of 32+ terms
// over rows of 16+ (2x faster at 28x28 16->16, but 2.5x slower on the stem and 1.5x on
// 64->64 at 7x7, where im2col + the GEMM stays). DT_CONV=direct forces the kernels,
// DT_CONV=gemm declines them.
static bool want_kernels(void) {
    return dt_nn_want_direct(); // DT_CONV=direct forces them, gemm declines them
}

// DT_CONV_CL: 0 auto, 1 never, 2 also 28 wide (src/core/settings.c).
static int conv_cl_setting(void) {
    int c = 0;
    if (dt_setting_choice("DT_CONV_CL", &c) != DT_OK) {
        DT_WARN("nn", "%s; using auto", dt_last_error());
        dt_clear_error();
    }
    return c;
}

static bool use_cl(const dt_nn_conv2d *p, int w, bool backward, bool input_grad) {
    int cl = conv_cl_setting(); // "0": never these kernels; "1": also 28 wide
    if (cl == 1)
        return false;
    const dt_ktab *t = dt_k(); // the channels-in-lanes rows: only the avx512 target's
    if (!t->conv_cl_fwd || !(backward ? t->conv_cl_bwd_ok(p, w, input_grad) : t->conv_cl_fwd_ok(p)))
        return false;
    if (p->kh * p->kw == 1)
        return false; // 1x1: one GEMM over the strided pixels is faster
    int wo = out_len(w, p->pw, p->kw, p->sw);
    // Rows wider than 14 at stride 1 take the channels-in-lanes kernels only for 3x3
    // (Winograd forward and input gradient; 16->16 at 28x28: 4.4 ms forward, 10 ms
    // backward, against 5.2 and 12.2 on the shifted GEMMs); other kernel sizes there
    // were not measured and keep the shifted GEMMs.
    if (p->sh == 1 && p->sw == 1 && wo > 14 && p->cin > 1 && (p->kh != 3 || p->kw != 3) && cl != 2)
        return false;
    return want_kernels();
}

// An optional provider's row (kernels/dnnl: oneDNN, where it is built) for this shape.
static bool use_ext(const dt_nn_conv2d *p, int w, bool backward) {
    const dt_ktab *t = dt_k();
    return t->conv_ext_ok && t->conv_ext_ok(p, w, backward);
}

static bool use_direct(const dt_nn_conv2d *p, int w, bool backward) {
    if (p->sh != 1 || p->sw != 1 || p->groups != 1)
        return false;
    int conv = 0; // auto|direct|gemm; a bad value is reported by dt_nn_want_direct
    if (dt_setting_choice("DT_CONV", &conv) == DT_OK && conv == 1)
        return true;
    if (!dt_nn_want_direct())
        return false;
    return !backward || (p->cin * p->kh * p->kw >= 32 && w + 2 * p->pw >= 16);
}

const char *dt_nn_conv2d_kernel(const dt_nn_conv2d *p, int w, bool backward, bool input_grad,
                                char *buf, size_t n) {
    const dt_ktab *t  = dt_k();
    const char    *op = backward ? "conv2d bwd" : "conv2d fwd";
    if (use_cl(p, w, backward, input_grad))
        return dt_krow_describe(t, backward ? DT_KROW_conv_cl_bwd : DT_KROW_conv_cl_fwd, buf, n);
    if (use_ext(p, w, backward))
        return dt_krow_describe(t, backward ? DT_KROW_conv_ext_bwd : DT_KROW_conv_ext_fwd, buf, n);
    if (use_direct(p, w, backward))
        snprintf(buf, n, "%s: %s/direct", op, t->from[DT_KROW_shifted_gemm]);
    else
        snprintf(buf, n, "%s: %s/im2col", op, t->from[DT_KROW_sgemm]);
    return buf;
}

// padded input, wide output/gradient rows, transposed weights, then the two offset
// tables (ints, stored in float slots)
static size_t direct_scratch(const dt_nn_conv2d *p, int h, int w) {
    wide   g  = wide_geom(p, h, w);
    size_t kk = (size_t)p->kh * p->kw;
    return (size_t)p->cin * g.plane + (size_t)p->cout * g.ld + (size_t)p->cin * p->cout * kk +
           (size_t)p->cin * kk + (size_t)p->cout * kk;
}

// Samples per GEMM on the im2col path: small images (the ResNet's 14x14 and 7x7 stages)
// make thin GEMMs (49 columns per sample at 7x7), so several samples' columns sit side by
// side, about 1024 columns in all, and one GEMM covers them.
static int chunk_samples(int hw) {
    int s = (1024 + hw - 1) / hw;
    return s < 1 ? 1 : s > 64 ? 64 : s;
}

// columns (kg*groups, S*hw), and with S > 1 the staged output or gradient (cout, S*hw)
static size_t batched_scratch(const dt_nn_conv2d *p, int hw) {
    size_t cols = (size_t)chunk_samples(hw) * hw;
    return (size_t)p->cin * p->kh * p->kw * cols +
           (chunk_samples(hw) > 1 ? (size_t)p->cout * cols : 0);
}

size_t dt_nn_conv2d_scratch(const dt_nn_conv2d *p, int h, int w) {
    size_t ho   = (size_t)out_len(h, p->ph, p->kh, p->sh),
           wo   = (size_t)out_len(w, p->pw, p->kw, p->sw);
    size_t cols = batched_scratch(p, (int)(ho * wo));
    if (p->sh == 1 && p->sw == 1 && p->groups == 1) { // either path, whatever DT_CONV says
        size_t d = direct_scratch(p, h, w);
        cols     = d > cols ? d : cols;
    }
    const dt_ktab *t = dt_k();
    if (t->conv_cl_fwd && t->conv_cl_fwd_ok(p)) {
        size_t c = t->conv_cl_scratch(p, h, w);
        cols     = c > cols ? c : cols;
    }
    return cols;
}

static void uniform_fill(dt_rng *rng, float *x, size_t n, float bound) {
    for (size_t i = 0; i < n; i++)
        x[i] = dt_rng_uniform_range(rng, -bound, bound);
}

void dt_nn_conv2d_init(const dt_nn_conv2d *p, dt_rng *rng, float *w, float *b) {
    float bound = 1.0f / sqrtf((float)(p->cin / p->groups * p->kh * p->kw));
    uniform_fill(rng, w, dt_nn_conv2d_weight_count(p), bound);
    if (p->bias && b)
        uniform_fill(rng, b, (size_t)p->cout, bound);
}

// ------------------------------------------ stride 1, AVX2 / AVX-512: shifted GEMMs

typedef struct direct {
    wide   g;
    float *xp, *ext, *wt;
    int   *off_f, *off_b; // forward: input slices; backward: gradient-row slices
} direct;

static direct direct_layout(const dt_nn_conv2d *p, int h, int w, float *scratch) {
    direct d;
    int    kk = p->kh * p->kw;
    d.g       = wide_geom(p, h, w);
    d.xp      = scratch;
    d.ext     = d.xp + (size_t)p->cin * d.g.plane;
    d.wt      = d.ext + (size_t)p->cout * d.g.ld;
    d.off_f   = (int *)(void *)(d.wt + (size_t)p->cin * p->cout * kk);
    d.off_b   = d.off_f + (size_t)p->cin * kk;
    for (int c = 0; c < p->cin; c++)
        for (int ki = 0; ki < p->kh; ki++)
            for (int kj = 0; kj < p->kw; kj++)
                d.off_f[(c * p->kh + ki) * p->kw + kj] =
                    (int)((size_t)c * d.g.plane) + ki * d.g.wp + kj;
    for (int o = 0; o < p->cout; o++)
        for (int ki = 0; ki < p->kh; ki++)
            for (int kj = 0; kj < p->kw; kj++)
                d.off_b[(o * p->kh + ki) * p->kw + kj] =
                    (int)((size_t)o * d.g.ld) + d.g.margin - ki * d.g.wp - kj;
    return d;
}

// x (C, H, W) into the middle of the zeroed padded planes
static void pad_planes(const float *x, int c, int h, int w, int ph, int pw, wide g, float *xp) {
    memset(xp, 0, sizeof(float) * (size_t)c * g.plane);
    for (int ch = 0; ch < c; ch++)
        for (int i = 0; i < h; i++)
            memcpy(xp + (size_t)ch * g.plane + (size_t)(i + ph) * g.wp + pw,
                   x + ((size_t)ch * h + i) * w, sizeof(float) * (size_t)w);
}

static void direct_forward(const dt_nn_conv2d *p, int n, int h, int w, const float *x,
                           const float *wt, const float *b, float *y, float *scratch) {
    direct d  = direct_layout(p, h, w, scratch);
    int    ho = d.g.hp - p->kh + 1, wo = d.g.wp - p->kw + 1;
    for (int s = 0; s < n; s++) {
        pad_planes(x + (size_t)s * p->cin * h * w, p->cin, h, w, p->ph, p->pw, d.g, d.xp);
        // ext[o][q] = sum over (c, ki, kj) of w[o][c][ki][kj] * xp[c][q + ki*wp + kj]
        dt_nn_shifted_gemm(d.xp, d.off_f, p->cin * p->kh * p->kw, wt, p->cout, d.g.n, d.ext, d.g.ld,
                           false);
        dt_k()->wide_to_out(d.ext, d.g.ld, p->bias ? b : NULL, p->cout, ho, wo, &d.g, false,
                            y + (size_t)s * p->cout * ho * wo);
    }
}

static void direct_backward(const dt_nn_conv2d *p, int n, int h, int w, const float *x,
                            const float *wt, const float *dy, float *dx, float *dw, float *db,
                            float *scratch) {
    direct d  = direct_layout(p, h, w, scratch);
    int    ho = d.g.hp - p->kh + 1, wo = d.g.wp - p->kw + 1, kk = p->kh * p->kw;
    // zero gradient rows: margins, dropped columns and the tail stay zero throughout
    memset(d.ext, 0, sizeof(float) * (size_t)p->cout * d.g.ld);
    if (dx) // wt[c][(o, ki, kj)] = w[o][c][ki][kj]
        for (int o = 0; o < p->cout; o++)
            for (int c = 0; c < p->cin; c++)
                memcpy(d.wt + (size_t)c * p->cout * kk + (size_t)o * kk,
                       wt + ((size_t)o * p->cin + c) * kk, sizeof(float) * (size_t)kk);
    for (int s = 0; s < n; s++) {
        const float *dys = dy + (size_t)s * p->cout * ho * wo;
        for (int o = 0; o < p->cout; o++) {
            float       *row = d.ext + (size_t)o * d.g.ld + d.g.margin;
            const float *dyo = dys + (size_t)o * ho * wo;
            for (int i = 0; i < ho; i++)
                memcpy(row + (size_t)i * d.g.wp, dyo + (size_t)i * wo, sizeof(float) * (size_t)wo);
            if (p->bias && db) { // a convolution before a BatchNorm has none: no sum
                double acc = 0.0;
                for (size_t q = 0; q < (size_t)ho * wo; q++)
                    acc += dyo[q];
                db[o] += (float)acc;
            }
        }
        pad_planes(x + (size_t)s * p->cin * h * w, p->cin, h, w, p->ph, p->pw, d.g, d.xp);
        // dw[o][(c, ki, kj)] += sum_q ext[o][q] * xp[c][q + ki*wp + kj]
        dt_nn_shifted_gemm_nt(d.ext + d.g.margin, d.g.ld, p->cout, d.xp, d.off_f, p->cin * kk,
                              d.g.n, dw);
        if (!dx)
            continue;
        // dxp[c][q] = sum over (o, ki, kj) of w[o][c][ki][kj] * ext[o][q - ki*wp - kj]; the
        // padded input is no longer needed, so its planes take the result
        dt_nn_shifted_gemm(d.ext, d.off_b, p->cout * kk, d.wt, p->cin, (int)d.g.plane, d.xp,
                           d.g.plane, false);
        float *dxs = dx + (size_t)s * p->cin * h * w;
        for (int c = 0; c < p->cin; c++)
            for (int i = 0; i < h; i++)
                memcpy(dxs + ((size_t)c * h + i) * w,
                       d.xp + (size_t)c * d.g.plane + (size_t)(i + p->ph) * d.g.wp + p->pw,
                       sizeof(float) * (size_t)w);
    }
}

// ------------------------------------------------------------------ any shape: im2col

// The im2col path in precision `prec` (prec.h's autocast; wt16 the weights' shadow,
// NULL in fp32): every product through dt_ac_gemm, which is dt_sgemm in fp32.
static dt_status im2col_forward(const dt_nn_conv2d *p, dt_precision prec, const void *wt16, int n,
                                int h, int w, const float *x, const float *wt, const float *b,
                                float *y, float *scratch) {
    const dt_ktab *kt  = dt_k();
    size_t         esz = prec == DT_PREC_BF16 ? sizeof(uint16_t) : sizeof(float);
    int            ho = out_len(h, p->ph, p->kh, p->sh), wo = out_len(w, p->pw, p->kw, p->sw);
    int            hw = ho * wo, g = p->groups, cog = p->cout / g, kg = p->cin / g * p->kh * p->kw;
    int            S = chunk_samples(hw);
    for (int s0 = 0; s0 < n; s0 += S) {
        int    ns  = n - s0 < S ? n - s0 : S;
        size_t ldc = (size_t)ns * hw; // this chunk's columns
        float *col = scratch, *stage = col + (size_t)p->cin * p->kh * p->kw * S * hw;
        for (int j = 0; j < ns; j++)
            kt->im2col(p, x + (size_t)(s0 + j) * p->cin * h * w, h, w, ho, wo, col + (size_t)j * hw,
                       ldc);
        // per group: out (cog, ns*hw) = W_g (cog, kg) x col_g (kg, ns*hw); one sample
        // writes y directly
        float *out = ns == 1 ? y + (size_t)s0 * p->cout * hw : stage;
        for (int gi = 0; gi < g; gi++)
            DT_TRY(dt_ac_gemm(prec, false, false, cog, (int)ldc, kg, wt + (size_t)gi * cog * kg,
                              wt16 ? (const char *)wt16 + (size_t)gi * cog * kg * esz : NULL, kg,
                              col + (size_t)gi * kg * ldc, NULL, (int)ldc,
                              out + (size_t)gi * cog * ldc, (int)ldc, false));
        for (int j = 0; j < ns; j++)
            for (int o = 0; o < p->cout; o++) {
                float       *yr = y + ((size_t)(s0 + j) * p->cout + o) * hw;
                const float *sr = out + (size_t)o * ldc + (size_t)j * hw;
                float        bo = p->bias ? b[o] : 0.0f;
                for (int q = 0; q < hw; q++)
                    yr[q] = sr[q] + bo;
            }
    }
    return DT_OK;
}

void dt_nn_conv2d_forward(const dt_nn_conv2d *p, int n, int h, int w, const float *x,
                          const float *wt, const float *b, float *y, float *scratch) {
    if (use_cl(p, w, false, false)) {
        dt_k()->conv_cl_fwd(p, n, h, w, x, wt, b, y, scratch);
        return;
    }
    if (use_ext(p, w, false) && dt_k()->conv_ext_fwd(p, n, h, w, x, wt, b, y))
        return;
    if (use_direct(p, w, false)) {
        direct_forward(p, n, h, w, x, wt, b, y, scratch);
        return;
    }
    (void)im2col_forward(p, DT_PREC_FP32, NULL, n, h, w, x, wt, b, y, scratch); // cannot fail
}

// A bf16 convolution whose reduction is below DT_C16_MIN_K stays fp32 where the shifted
// GEMMs run (as the fused convolution's, conv_team.c): in bf16 it would be mostly packing.
static bool stays_fp32(const dt_nn_conv2d *p, dt_precision prec) {
    return prec == DT_PREC_BF16 && p->cin / p->groups * p->kh * p->kw < DT_C16_MIN_K &&
           dt_nn_want_direct();
}

dt_status dt_nn_conv2d_forward_prec(const dt_nn_conv2d *p, dt_precision prec, const void *wt16,
                                    int n, int h, int w, const float *x, const float *wt,
                                    const float *b, float *y, float *scratch) {
    if (prec == DT_PREC_FP32 || stays_fp32(p, prec)) {
        dt_nn_conv2d_forward(p, n, h, w, x, wt, b, y, scratch);
        return DT_OK;
    }
    return im2col_forward(p, prec, wt16, n, h, w, x, wt, b, y, scratch);
}

static dt_status im2col_backward(const dt_nn_conv2d *p, dt_precision prec, const void *wt16, int n,
                                 int h, int w, const float *x, const float *wt, const float *dy,
                                 float *dx, float *dw, float *db, float *scratch) {
    const dt_ktab *kt  = dt_k();
    size_t         esz = prec == DT_PREC_BF16 ? sizeof(uint16_t) : sizeof(float);
    int            ho = out_len(h, p->ph, p->kh, p->sh), wo = out_len(w, p->pw, p->kw, p->sw);
    int            hw = ho * wo, g = p->groups, cog = p->cout / g, kg = p->cin / g * p->kh * p->kw;
    int            S = chunk_samples(hw);
    for (int s0 = 0; s0 < n; s0 += S) {
        int    ns  = n - s0 < S ? n - s0 : S;
        size_t ldc = (size_t)ns * hw;
        float *col = scratch, *stage = col + (size_t)p->cin * p->kh * p->kw * S * hw;
        // the chunk's output gradient as (cout, ns*hw): staged unless one sample
        const float *dyc = dy + (size_t)s0 * p->cout * hw;
        if (ns > 1) {
            for (int j = 0; j < ns; j++)
                for (int o = 0; o < p->cout; o++)
                    memcpy(stage + (size_t)o * ldc + (size_t)j * hw,
                           dy + ((size_t)(s0 + j) * p->cout + o) * hw, sizeof(float) * (size_t)hw);
            dyc = stage;
        }
        if (p->bias && db)
            for (int o = 0; o < p->cout; o++) {
                double acc = 0.0;
                for (size_t q = 0; q < ldc; q++)
                    acc += dyc[(size_t)o * ldc + q];
                db[o] += (float)acc;
            }
        for (int j = 0; j < ns; j++)
            kt->im2col(p, x + (size_t)(s0 + j) * p->cin * h * w, h, w, ho, wo, col + (size_t)j * hw,
                       ldc);
        // dW_g (cog, kg) += dy_g (cog, ns*hw) x col_g^T (ns*hw, kg)
        for (int gi = 0; gi < g; gi++)
            DT_TRY(dt_ac_gemm(prec, false, true, cog, kg, (int)ldc, dyc + (size_t)gi * cog * ldc,
                              NULL, (int)ldc, col + (size_t)gi * kg * ldc, NULL, (int)ldc,
                              dw + (size_t)gi * cog * kg, kg, true));
        if (!dx)
            continue;
        // dcol_g (kg, ns*hw) = W_g^T (kg, cog) x dy_g (cog, ns*hw), scattered back
        for (int gi = 0; gi < g; gi++)
            DT_TRY(dt_ac_gemm(prec, true, false, kg, (int)ldc, cog, wt + (size_t)gi * cog * kg,
                              wt16 ? (const char *)wt16 + (size_t)gi * cog * kg * esz : NULL, kg,
                              dyc + (size_t)gi * cog * ldc, NULL, (int)ldc,
                              col + (size_t)gi * kg * ldc, (int)ldc, false));
        for (int j = 0; j < ns; j++) {
            float *dxs = dx + (size_t)(s0 + j) * p->cin * h * w;
            memset(dxs, 0, sizeof(float) * (size_t)p->cin * h * w);
            kt->col2im(p, col + (size_t)j * hw, ldc, h, w, ho, wo, dxs);
        }
    }
    return DT_OK;
}

void dt_nn_conv2d_backward(const dt_nn_conv2d *p, int n, int h, int w, const float *x,
                           const float *wt, const float *dy, float *dx, float *dw, float *db,
                           float *scratch) {
    if (use_cl(p, w, true, dx != NULL)) {
        dt_k()->conv_cl_bwd(p, n, h, w, x, wt, dy, dx, dw, db, scratch);
        return;
    }
    if (use_ext(p, w, true) && dt_k()->conv_ext_bwd(p, n, h, w, x, wt, dy, dx, dw, db))
        return;
    if (use_direct(p, w, true)) {
        direct_backward(p, n, h, w, x, wt, dy, dx, dw, db, scratch);
        return;
    }
    (void)im2col_backward(p, DT_PREC_FP32, NULL, n, h, w, x, wt, dy, dx, dw, db, scratch);
}

dt_status dt_nn_conv2d_backward_prec(const dt_nn_conv2d *p, dt_precision prec, const void *wt16,
                                     int n, int h, int w, const float *x, const float *wt,
                                     const float *dy, float *dx, float *dw, float *db,
                                     float *scratch) {
    if (prec == DT_PREC_FP32 || stays_fp32(p, prec)) {
        dt_nn_conv2d_backward(p, n, h, w, x, wt, dy, dx, dw, db, scratch);
        return DT_OK;
    }
    return im2col_backward(p, prec, wt16, n, h, w, x, wt, dy, dx, dw, db, scratch);
}

// ------------------------------------------------------------------------------ Linear

void dt_nn_linear_init(int in, int out, dt_rng *rng, float *w, float *b) {
    float bound = 1.0f / sqrtf((float)in);
    uniform_fill(rng, w, (size_t)in * out, bound);
    if (b)
        uniform_fill(rng, b, (size_t)out, bound);
}

void dt_nn_linear_forward(int n, int in, int out, const float *x, const float *w, const float *b,
                          float *y) {
    if (n < 1)
        return;
    if (b)
        for (int s = 0; s < n; s++)
            memcpy(y + (size_t)s * out, b, sizeof(float) * (size_t)out);
    // y (n, out) = x (n, in) x W^T (in, out) (+ y)
    dt_sgemm(false, true, n, out, in, 1.0f, x, in, w, in, b ? 1.0f : 0.0f, y, out);
}

void dt_nn_linear_backward(int n, int in, int out, const float *x, const float *w, const float *dy,
                           float *dx, float *dw, float *db) {
    if (n < 1)
        return;
    // dW (out, in) += dy^T (out, n) x x (n, in)
    dt_sgemm(true, false, out, in, n, 1.0f, dy, out, x, in, 1.0f, dw, in);
    if (db)
        dt_nn_linear_bias_grad(n, out, dy, db);
    if (dx) // dx (n, in) = dy (n, out) x W (out, in)
        dt_sgemm(false, false, n, in, out, 1.0f, dy, out, w, in, 0.0f, dx, in);
}

// db += column sums of dy, row by row, 256 columns at a time in double.
void dt_nn_linear_bias_grad(int n, int out, const float *dy, float *db) {
    for (int o0 = 0; o0 < out; o0 += 256) {
        int    no       = out - o0 < 256 ? out - o0 : 256;
        double acc[256] = {0};
        dt_k()->col_sums_f64(dy + o0, (size_t)out, n, no, acc);
        for (int o = 0; o < no; o++)
            db[o0 + o] += (float)acc[o];
    }
}

dt_status dt_nn_linear_forward_prec(dt_precision prec, const void *w16, int n, int in, int out,
                                    const float *x, const float *w, const float *b, float *y) {
    if (prec == DT_PREC_FP32 || n < 1) {
        dt_nn_linear_forward(n, in, out, x, w, b, y);
        return DT_OK;
    }
    if (b)
        for (int s = 0; s < n; s++)
            memcpy(y + (size_t)s * out, b, sizeof(float) * (size_t)out);
    return dt_ac_gemm(prec, false, true, n, out, in, x, NULL, in, w, w16, in, y, out, b != NULL);
}

dt_status dt_nn_linear_backward_prec(dt_precision prec, const void *w16, int n, int in, int out,
                                     const float *x, const float *w, const float *dy, float *dx,
                                     float *dw, float *db) {
    if (prec == DT_PREC_FP32 || n < 1) {
        dt_nn_linear_backward(n, in, out, x, w, dy, dx, dw, db);
        return DT_OK;
    }
    DT_TRY(dt_ac_gemm(prec, true, false, out, in, n, dy, NULL, out, x, NULL, in, dw, in, true));
    if (db)
        dt_nn_linear_bias_grad(n, out, dy, db);
    if (dx)
        DT_TRY(
            dt_ac_gemm(prec, false, false, n, in, out, dy, NULL, out, w, w16, in, dx, in, false));
    return DT_OK;
}
