// conv_team.c: the fused convolution's kernels (conv_fused.h): 2-D convolution as
// im2col + one GEMM per sample.
//
// Per sample the column matrix stays in L2 (for the ConvNet's second convolution,
// 144 x 576 floats = 324 KiB), where one whole-batch GEMM would stream a 42 MB column
// matrix from memory; measured here, the per-sample GEMM runs at ~100 GFLOP/s on one
// core against ~86 for the whole-batch one. Backward recomputes the columns instead
// of keeping them from forward for the same reason.
//
// Stride 1 uses "wide rows": output positions are indexed over the padded input's
// full width Wp instead of the output width Wo, so that row (c, ki, kj) of the column
// matrix is the contiguous slice xp[c][ki*Wp + kj ...] of the (padded) input, copied
// in one memcpy, and col2im is one contiguous add per row. The k-1 extra positions per
// output row cost 8% more GEMM work for the seed's 26-wide input and save most of the
// im2col/col2im time (12 + 27 us per sample measured here with the strided layout).
// Columns of the wide output whose window wraps past the row end are dropped on the
// way out; their gradient is zero on the way back.
//
// On CPUs with AVX2 or AVX-512, stride-1 convolutions skip the column matrix altogether: in the
// wide layout each of its rows is a shifted slice of the input, so forward, weight
// gradient and input gradient are "shifted GEMMs" (shifted.c) that read the input in
// place. The input gradient is the forward kernel again, over the output gradient with
// transposed weights and negative shifts; the gradient rows get k-1 rows' worth of
// zero margin on each side so that every shifted read stays inside them. DT_CONV=gemm
// or DT_CONV=direct overrides the choice (tests run both).
//
// A ReLU right after the convolution is fused in: applied while the output is copied
// out, and its mask applied while the incoming gradient is copied in. With stride 1, a
// 2x2 stride-2 max pool after that ReLU is fused too (graph_pass.c decides): the pooled
// output and the winners' indices are computed straight from the wide GEMM result in
// cache, and backward scatters the pooled gradient straight into the wide layout, so
// the full-size output (9.4 MB a batch for the seed's second convolution) is never
// written to memory or read back.
// Matches torch.nn.Conv2d (weight (Cout, Cin, k, k), bias (Cout)).
#include "core/simd.h"
#include "kernels/table.h"
#include "nn/blas.h"
#include "nn/conv16.h"
#include "nn/nn_impl.h"
#include "nn/prec.h"

#include <stdlib.h>
#include <string.h>

typedef dt_kwide wide;

static wide wide_geom(const nn_layer *l) {
    wide g;
    g.hp     = l->in.h + 2 * l->pad;
    g.wp     = l->in.w + 2 * l->pad;
    g.n      = l->out.h * g.wp - (l->k - 1);
    g.plane  = (size_t)g.hp * g.wp;
    g.margin = (l->k - 1) * (g.wp + 1);
    g.ld     = (size_t)g.margin + g.plane;
    return g;
}

dt_status dt_team_conv_setup(nn_layer *l) {
    if (l->k < 1 || l->k > 16 || l->stride < 1 || l->pad < 0 || l->out_c < 1)
        return dt_fail(
            DT_ERR_ARG,
            "layer %d conv2d: expected out_channels >= 1, kernel in [1, 16], stride >= 1 "
            "and padding >= 0, found %d, %d, %d, %d",
            l->index, l->out_c, l->k, l->stride, l->pad);
    int hp = l->in.h + 2 * l->pad, wp = l->in.w + 2 * l->pad;
    if (hp < l->k || wp < l->k)
        return dt_fail(DT_ERR_ARG,
                       "layer %d conv2d: kernel %d does not fit the padded input (%d, %d, %d) "
                       "with padding %d",
                       l->index, l->k, l->in.c, l->in.h, l->in.w, l->pad);
    l->out.c     = l->out_c;
    l->out.h     = (hp - l->k) / l->stride + 1;
    l->out.w     = (wp - l->k) / l->stride + 1;
    l->nparams   = 2;
    l->wndim     = 4;
    l->wshape[0] = l->out_c;
    l->wshape[1] = l->in.c;
    l->wshape[2] = l->k;
    l->wshape[3] = l->k;
    l->fan_in    = (size_t)l->in.c * l->k * l->k;
    l->wcount    = (size_t)l->out_c * l->fan_in;
    l->bcount    = l->out_c;
    size_t hw    = (size_t)l->out.h * l->out.w;
    // 16-bit products (dt_model_set_precision) run on the GEMM paths below, bf16 ones
    // with stride 1 on conv16.c's kernels (direct16) when the GEMM path is avx512bf16;
    // a bf16 layer with a reduction too small to gain (DT_C16_MIN_K) stays fp32.
    bool lowp   = l->prec != DT_PREC_FP32 && !(l->prec == DT_PREC_BF16 && l->stride == 1 &&
                                             l->fan_in < DT_C16_MIN_K && dt_nn_want_direct());
    l->direct   = l->stride == 1 && !lowp && dt_nn_want_direct();
    l->direct16 = l->stride == 1 && l->prec == DT_PREC_BF16 && lowp;
    if (l->direct16) {
        wide   g  = wide_geom(l);
        int    kk = l->k * l->k, c2 = (l->in.c + 1) / 2, o2 = (l->out_c + 1) / 2;
        size_t fwd = (size_t)c2 * g.plane + (size_t)l->out_c * c2 * kk + (size_t)l->out_c * g.n;
        size_t ldt = (size_t)(l->out_c + 15) / 16 * 16;
        size_t bwd = ((size_t)l->in.c * g.plane + 1) / 2 + (size_t)l->out_c * g.n +
                     (size_t)(g.n + 1) / 2 * ldt + (size_t)o2 * g.ld + (size_t)l->in.c * o2 * kk +
                     l->fan_in * ldt + (l->pad ? (size_t)l->in.c * g.plane : 0);
        // or the wide im2col path, when the GEMM path is not avx512bf16 at the call
        size_t im = (l->pad ? (size_t)l->in.c * g.plane : 0) + l->fan_in * (size_t)g.n +
                    (size_t)l->out_c * (size_t)g.n;
        // or the bf16 values on the fp32 shifted GEMMs (direct_r16), where the GEMM path
        // is fp32 and the CPU runs those: the rounded input, the wide gradient, weights, a
        // rounded gradient row
        size_t r16 =
            (size_t)l->in.c * g.plane + (size_t)l->out_c * g.ld + l->wcount + (size_t)(g.n + 1) / 2;
        l->scratch_floats = fwd > bwd ? fwd : bwd;
        if (im > l->scratch_floats)
            l->scratch_floats = im;
        if (r16 > l->scratch_floats)
            l->scratch_floats = r16;
        // offsets: forward (channel pair, ki, kj), input gradient (output channel pair,
        // ki, kj), weight gradient and direct_r16's forward (channel, ki, kj), direct_r16's
        // input gradient (output channel, ki, kj)
        dt_free(l->offsets);
        size_t nf = (size_t)c2 * kk, nb = (size_t)o2 * kk, rb = (size_t)l->out_c * kk;
        if (!(l->offsets = dt_alloc(sizeof(int) * (nf + nb + l->fan_in + rb))))
            return DT_ERR_NOMEM;
        for (int o = 0; o < l->out_c; o++)
            for (int t = 0; t < kk; t++)
                l->offsets[nf + nb + l->fan_in + (size_t)o * kk + t] =
                    (int)((size_t)o * g.ld) + g.margin - (t / l->k * g.wp + t % l->k);
        for (int ch = 0; ch < l->in.c; ch++)
            for (int t = 0; t < kk; t++) {
                int sh = t / l->k * g.wp + t % l->k;
                if (ch % 2 == 0)
                    l->offsets[(size_t)(ch / 2) * kk + t] = (int)((size_t)(ch / 2) * g.plane) + sh;
                l->offsets[nf + nb + (size_t)ch * kk + t] = (int)((size_t)ch * g.plane) + sh;
            }
        for (int op = 0; op < o2; op++)
            for (int t = 0; t < kk; t++)
                l->offsets[nf + (size_t)op * kk + t] =
                    (int)((size_t)op * g.ld) + g.margin - (t / l->k * g.wp + t % l->k);
    } else if (l->direct) {
        wide   g  = wide_geom(l);
        size_t rf = l->fan_in, rb = (size_t)l->out_c * l->k * l->k;
        // padded input (also its gradient), wide output/gradient with margins,
        // transposed weights
        l->scratch_floats = (l->pad ? (size_t)l->in.c * g.plane : 0) + (size_t)l->out_c * g.ld +
                            (size_t)l->in.c * rb;
        // forward offsets: input channel plane + kernel shift; backward: gradient row
        // + margin - kernel shift
        dt_free(l->offsets);
        if (!(l->offsets = dt_alloc(sizeof(int) * (rf + rb))))
            return DT_ERR_NOMEM;
        for (int c = 0; c < l->in.c; c++)
            for (int ki = 0; ki < l->k; ki++)
                for (int kj = 0; kj < l->k; kj++)
                    l->offsets[(c * l->k + ki) * l->k + kj] =
                        (int)((size_t)c * g.plane) + ki * g.wp + kj;
        for (int o = 0; o < l->out_c; o++)
            for (int ki = 0; ki < l->k; ki++)
                for (int kj = 0; kj < l->k; kj++)
                    l->offsets[rf + (size_t)(o * l->k + ki) * l->k + kj] =
                        (int)((size_t)o * g.ld) + g.margin - ki * g.wp - kj;
    } else if (l->stride == 1) {
        wide g = wide_geom(l);
        // padded input (also its gradient), wide columns, wide output/gradient
        l->scratch_floats = (l->pad ? (size_t)l->in.c * g.plane : 0) + l->fan_in * (size_t)g.n +
                            (size_t)l->out_c * (size_t)g.n;
    } else {
        l->scratch_floats = l->fan_in * hw; // one sample's columns (reused for dcol)
    }
    l->flops = 2.0 * (double)l->wcount * (double)hw;
    return DT_OK;
}

// The GEMM of the im2col paths: dt_sgemm in fp32, else the layer's 16-bit mode (prec.h;
// a16: the weight's shadow when A is the weight). A failure (fp16 temporaries) is
// reported by dt_model_forward / _backward.
static void lowp_gemm(nn_layer *l, bool ta, bool tb, int m, int n, int k, const float *a,
                      const void *a16, int lda, const float *b, int ldb, float *c, int ldc,
                      bool accumulate) {
    if (l->prec == DT_PREC_FP32)
        dt_sgemm(ta, tb, m, n, k, 1.0f, a, lda, b, ldb, accumulate ? 1.0f : 0.0f, c, ldc);
    else if (dt_ac_gemm(l->prec, ta, tb, m, n, k, a, a16, lda, b, NULL, ldb, c, ldc, accumulate))
        __atomic_store_n(&l->lowp_failed, true, __ATOMIC_RELAXED); // any thread
}

// ------------------------------------------------------------ stride 1: wide rows

// Copies x (C, H, W) into the middle of a zeroed (C, H+2p, W+2p) buffer.
static void pad_input(const float *x, int c, int h, int w, int p, float *xp) {
    int wp = w + 2 * p;
    memset(xp, 0, sizeof(float) * (size_t)c * (h + 2 * p) * wp);
    for (int ch = 0; ch < c; ch++)
        for (int i = 0; i < h; i++)
            memcpy(xp + ((size_t)ch * (h + 2 * p) + i + p) * wp + p, x + ((size_t)ch * h + i) * w,
                   sizeof(float) * (size_t)w);
}

// The inverse: the middle (C, H, W) of a (C, H+2p, W+2p) buffer, copied out.
static void crop_padded(const float *xp, int c, int h, int w, int p, float *x) {
    int wp = w + 2 * p;
    for (int ch = 0; ch < c; ch++)
        for (int i = 0; i < h; i++)
            memcpy(x + ((size_t)ch * h + i) * w, xp + ((size_t)ch * (h + 2 * p) + i + p) * wp + p,
                   sizeof(float) * (size_t)w);
}

static void wide_im2col(const float *xp, int c, int k, wide g, float *col) {
    for (int ch = 0; ch < c; ch++)
        for (int ki = 0; ki < k; ki++)
            for (int kj = 0; kj < k; kj++)
                memcpy(col + ((size_t)(ch * k + ki) * k + kj) * g.n,
                       xp + ch * g.plane + (size_t)ki * g.wp + kj, sizeof(float) * (size_t)g.n);
}

// Forward's last step for one sample: compact output, or the fused pool's.
static void emit_output(nn_layer *l, const float *ext, size_t ld, wide g, float *out, int s) {
    if (l->pool) {
        size_t psz = nn_shape_size(l->pool->out);
        dt_k()->wide_to_pool(ext, ld, l->b, l->out_c, l->out.h, l->out.w, &g, out + (size_t)s * psz,
                             l->pool->aux + (size_t)s * l->pool->aux_per_sample);
    } else {
        dt_k()->wide_to_out(ext, ld, l->b, l->out_c, l->out.h, l->out.w, &g, l->fuse_relu,
                            out + (size_t)s * nn_shape_size(l->out));
    }
}

// Backward's first step for one sample: the incoming gradient in the wide layout.
static void gather_grad(nn_layer *l, const float *dout, const float *out, wide g, float *ext,
                        size_t ld, int s) {
    if (l->pool) {
        size_t psz = nn_shape_size(l->pool->out);
        dt_k()->pool_grad_to_wide(dout + (size_t)s * psz, out + (size_t)s * psz,
                                  l->pool->aux + (size_t)s * l->pool->aux_per_sample, l->out_c,
                                  l->out.h, l->out.w, &g, ext, ld);
    } else {
        size_t osz = nn_shape_size(l->out);
        dt_k()->grad_to_wide(dout + (size_t)s * osz, out + (size_t)s * osz, l->out_c, l->out.h,
                             l->out.w, &g, l->fuse_relu, ext, ld);
    }
}

static void wide_forward(nn_layer *l, const nn_ctx *c, const float *in, float *out) {
    wide   g    = wide_geom(l);
    size_t insz = nn_shape_size(l->in);
    int    kk   = (int)l->fan_in;
    float *xp = c->scratch, *col = xp + (l->pad ? (size_t)l->in.c * g.plane : 0);
    float *ext = col + l->fan_in * (size_t)g.n;
    for (int s = c->s0; s < c->s1; s += c->sstep) {
        const float *x = in + (size_t)s * insz;
        if (l->pad)
            pad_input(x, l->in.c, l->in.h, l->in.w, l->pad, xp);
        wide_im2col(l->pad ? xp : x, l->in.c, l->k, g, col);
        lowp_gemm(l, false, false, l->out_c, g.n, kk, l->w, l->w16, kk, col, g.n, ext, g.n, false);
        emit_output(l, ext, (size_t)g.n, g, out, s);
    }
}

static void wide_backward(nn_layer *l, const nn_ctx *c, const float *in, const float *out,
                          float *dout, float *din, float *dparams) {
    wide   g    = wide_geom(l);
    size_t insz = nn_shape_size(l->in);
    int    kk   = (int)l->fan_in;
    float *xp = c->scratch, *col = xp + (l->pad ? (size_t)l->in.c * g.plane : 0);
    float *ext = col + l->fan_in * (size_t)g.n;
    float *dw = dparams, *db = dparams + l->wcount;
    for (int s = c->s0; s < c->s1; s += c->sstep) {
        const float *x = in + (size_t)s * insz;
        if (l->pad)
            pad_input(x, l->in.c, l->in.h, l->in.w, l->pad, xp);
        wide_im2col(l->pad ? xp : x, l->in.c, l->k, g, col);
        gather_grad(l, dout, out, g, ext, (size_t)g.n, s);
        // dW (Cout, Cin*k*k) += dy (Cout, n) x col^T (n, Cin*k*k)
        lowp_gemm(l, false, true, l->out_c, kk, g.n, ext, NULL, g.n, col, g.n, dw, kk, true);
        dt_nn_row_sums_add(ext, l->out_c, g.n, db); // dropped columns hold zeros
        if (!din)
            continue;
        // dcol (Cin*k*k, n) = W^T x dy, added back onto the (padded) input gradient
        lowp_gemm(l, true, false, kk, g.n, l->out_c, l->w, l->w16, kk, ext, g.n, col, g.n, false);
        float *dx  = din + (size_t)s * insz;
        float *dxp = l->pad ? xp : dx;
        dt_k()->wide_col2im(col, l->in.c, l->k, &g, dxp);
        if (l->pad)
            crop_padded(xp, l->in.c, l->in.h, l->in.w, l->pad, dx);
    }
}

// ------------------------------------------ stride 1, AVX2 / AVX-512: shifted GEMMs

static void direct_forward(nn_layer *l, const nn_ctx *c, const float *in, float *out) {
    wide   g    = wide_geom(l);
    size_t insz = nn_shape_size(l->in);
    float *xp = c->scratch, *ext = xp + (l->pad ? (size_t)l->in.c * g.plane : 0);
    for (int s = c->s0; s < c->s1; s += c->sstep) {
        const float *x = in + (size_t)s * insz;
        if (l->pad)
            pad_input(x, l->in.c, l->in.h, l->in.w, l->pad, xp);
        dt_nn_shifted_gemm(l->pad ? xp : x, l->offsets, (int)l->fan_in, l->w, l->out_c, g.n,
                           ext + g.margin, g.ld, false);
        emit_output(l, ext + g.margin, g.ld, g, out, s);
    }
}

static void direct_backward(nn_layer *l, const nn_ctx *c, const float *in, const float *out,
                            float *dout, float *din, float *dparams) {
    wide   g    = wide_geom(l);
    size_t insz = nn_shape_size(l->in);
    int    kk2 = l->k * l->k, rb = l->out_c * kk2;
    float *xp = c->scratch, *ext = xp + (l->pad ? (size_t)l->in.c * g.plane : 0);
    float *wt = ext + (size_t)l->out_c * g.ld;
    float *dw = dparams, *db = dparams + l->wcount;
    // Zero margins around each gradient row (never written below), and the weights
    // transposed for the input gradient: wt[ic][(oc, ki, kj)] = w[oc][ic][ki][kj].
    for (int oc = 0; oc < l->out_c; oc++) {
        float *row = ext + (size_t)oc * g.ld;
        memset(row, 0, sizeof(float) * (size_t)g.margin);
        memset(row + g.margin + g.n, 0, sizeof(float) * (g.plane - (size_t)g.n));
    }
    if (din)
        for (int oc = 0; oc < l->out_c; oc++)
            for (int ic = 0; ic < l->in.c; ic++)
                memcpy(wt + (size_t)ic * rb + (size_t)oc * kk2,
                       l->w + ((size_t)oc * l->in.c + ic) * kk2, sizeof(float) * (size_t)kk2);
    for (int s = c->s0; s < c->s1; s += c->sstep) {
        const float *x = in + (size_t)s * insz;
        if (l->pad)
            pad_input(x, l->in.c, l->in.h, l->in.w, l->pad, xp);
        gather_grad(l, dout, out, g, ext + g.margin, g.ld, s);
        for (int oc = 0; oc < l->out_c; oc++) // dropped columns hold zeros
            dt_nn_row_sums_add(ext + (size_t)oc * g.ld + g.margin, 1, g.n, db + oc);
        dt_nn_shifted_gemm_nt(ext + g.margin, g.ld, l->out_c, l->pad ? xp : x, l->offsets,
                              (int)l->fan_in, g.n, dw);
        if (!din)
            continue;
        float *dx  = din + (size_t)s * insz;
        float *dxp = l->pad ? xp : dx; // the padded input is no longer needed
        dt_nn_shifted_gemm(ext, l->offsets + l->fan_in, rb, wt, l->in.c, (int)g.plane, dxp, g.plane,
                           false);
        if (l->pad)
            crop_padded(xp, l->in.c, l->in.h, l->in.w, l->pad, dx);
    }
}

// ------------------------------------------- stride 1, bf16: conv16.c's kernels
// The forward reads the input's pair words (channel pairs) at the shifts of (pair, ki,
// kj); the input gradient reads the output gradient's pair words (output channel pairs,
// zero margins) at negative shifts with the weights transposed; the weight gradient
// reads both in plain bf16 rows. Weights come from the layer's bf16 shadow; every
// activation and gradient is rounded as it is repacked; sums and the outputs are fp32.

static void direct16_forward(nn_layer *l, const nn_ctx *c, const float *in, float *out) {
    wide      g  = wide_geom(l);
    int       kk = l->k * l->k, c2 = (l->in.c + 1) / 2, r2 = c2 * kk;
    size_t    insz = nn_shape_size(l->in);
    uint32_t *x2   = (uint32_t *)(void *)c->scratch;
    uint32_t *w2   = x2 + (size_t)c2 * g.plane;
    float    *ext  = (float *)(void *)(w2 + (size_t)l->out_c * r2);
    dt_c16_weight_pairs(l->w16, l->out_c, l->in.c, kk, w2);
    for (int s = c->s0; s < c->s1; s += c->sstep) {
        dt_c16_pack_pairs(in + (size_t)s * insz, l->in.c, l->in.h, l->in.w, l->pad, x2);
        dt_c16_shifted(x2, l->offsets, r2, w2, l->out_c, g.n, ext, (size_t)g.n);
        emit_output(l, ext, (size_t)g.n, g, out, s);
    }
}

static void direct16_backward(nn_layer *l, const nn_ctx *c, const float *in, const float *out,
                              float *dout, float *din, float *dparams) {
    wide      g  = wide_geom(l);
    int       kk = l->k * l->k, ci = l->in.c, co = l->out_c, o2 = (co + 1) / 2;
    int       ldt = (co + 15) / 16 * 16, R = (int)l->fan_in;
    size_t    insz = nn_shape_size(l->in), nf = (size_t)(ci + 1) / 2 * kk, nb = (size_t)o2 * kk;
    uint16_t *xb  = (uint16_t *)(void *)c->scratch;
    float    *ext = c->scratch + ((size_t)ci * g.plane + 1) / 2;
    uint32_t *gt  = (uint32_t *)(void *)(ext + (size_t)co * g.n);
    uint32_t *g2  = gt + (size_t)(g.n + 1) / 2 * ldt;
    uint32_t *wt2 = g2 + (size_t)o2 * g.ld;
    float    *dwt = (float *)(void *)(wt2 + (size_t)ci * nb);
    float    *dxp = dwt + (size_t)R * ldt;
    float    *dw = dparams, *db = dparams + l->wcount;
    if (din)
        dt_c16_weight_pairs_t(l->w16, co, ci, kk, wt2);
    memset(dwt, 0, sizeof(float) * (size_t)R * ldt);
    for (int s = c->s0; s < c->s1; s += c->sstep) {
        gather_grad(l, dout, out, g, ext, (size_t)g.n, s);
        dt_nn_row_sums_add(ext, co, g.n, db); // dropped columns hold zeros
        dt_c16_pack_plain(in + (size_t)s * insz, ci, l->in.h, l->in.w, l->pad, xb);
        if (din) // the operands of both products from one pass over the gradient
            dt_c16_rows_to_both(ext, (size_t)g.n, co, g.n, gt, ldt, g.margin, g.ld, g2);
        else
            dt_c16_rows_to_pair_cols(ext, (size_t)g.n, co, g.n, gt, ldt);
        dt_c16_shifted_tn(xb, l->offsets + nf + nb, R, g.n, gt, ldt, dwt);
        if (!din)
            continue;
        float *dx = din + (size_t)s * insz;
        dt_c16_shifted(g2, l->offsets + nf, (int)nb, wt2, ci, (int)g.plane, l->pad ? dxp : dx,
                       g.plane);
        if (l->pad)
            crop_padded(dxp, ci, l->in.h, l->in.w, l->pad, dx);
    }
    for (int o = 0; o < co; o++) // the transposed sums, once per call
        for (int r = 0; r < R; r++)
            dw[(size_t)o * R + r] += dwt[(size_t)r * ldt + o];
}

// ------------------------- stride 1, bf16 without bf16 arithmetic: rounded operands
// Where the GEMM path is fp32 (no VDPBF16PS, or DT_PRECISION_PATH=fp32) and the CPU runs
// the shifted GEMMs (dt_nn_want_direct): the operands conv16.c's kernels would read are
// rounded to bf16 values held in floats (the input once per sample, the output gradient
// once per sample for both products, the weights from the layer's bf16 shadow) and
// multiplied by the fp32 shifted GEMMs. A product of two bf16 values is exact in fp32,
// so this is a bf16 product with fp32 sums, within prec.h's bound like conv16.c's, at the
// fp32 kernels' speed (im2col + the bf16 GEMM's fp32 fallback ran at half of it).
// Offsets: the fp32 forward's at nf + nb (conv16.c's weight gradient's), the input
// gradient's after them (setup).

// x (c, h, w) rounded to bf16 values into the middle of a zeroed (c, h+2p, w+2p) buffer.
static void pad_round(const float *x, int c, int h, int w, int p, float *xp) {
    int wp = w + 2 * p;
    if (!p) {
        dt_f32_round_bf16(x, xp, (size_t)c * h * w);
        return;
    }
    memset(xp, 0, sizeof(float) * (size_t)c * (h + 2 * p) * wp);
    for (int ch = 0; ch < c; ch++)
        for (int i = 0; i < h; i++)
            dt_f32_round_bf16(x + ((size_t)ch * h + i) * w,
                              xp + ((size_t)ch * (h + 2 * p) + i + p) * wp + p, (size_t)w);
}

static size_t r16_offsets(const nn_layer *l) { // where the fp32 forward's offsets start
    return (size_t)((l->in.c + 1) / 2 + (l->out_c + 1) / 2) * l->k * l->k;
}

static void direct_r16_forward(nn_layer *l, const nn_ctx *c, const float *in, float *out) {
    wide   g    = wide_geom(l);
    size_t insz = nn_shape_size(l->in);
    float *xr = c->scratch, *ext = xr + (size_t)l->in.c * g.plane;
    float *wf = ext + (size_t)l->out_c * g.ld;
    dt_bf16_to_f32(l->w16, wf, l->wcount);
    for (int s = c->s0; s < c->s1; s += c->sstep) {
        pad_round(in + (size_t)s * insz, l->in.c, l->in.h, l->in.w, l->pad, xr);
        dt_nn_shifted_gemm(xr, l->offsets + r16_offsets(l), (int)l->fan_in, wf, l->out_c, g.n,
                           ext + g.margin, g.ld, false);
        emit_output(l, ext + g.margin, g.ld, g, out, s);
    }
}

static void direct_r16_backward(nn_layer *l, const nn_ctx *c, const float *in, const float *out,
                                float *dout, float *din, float *dparams) {
    wide            g    = wide_geom(l);
    size_t          insz = nn_shape_size(l->in), off = r16_offsets(l);
    int             kk2 = l->k * l->k, rb = l->out_c * kk2;
    float          *xr = c->scratch, *ext = xr + (size_t)l->in.c * g.plane;
    float          *wt = ext + (size_t)l->out_c * g.ld;
    float          *dw = dparams, *db = dparams + l->wcount;
    const uint16_t *w16 = l->w16;
    for (int oc = 0; oc < l->out_c; oc++) { // zero margins, as direct_backward's
        float *row = ext + (size_t)oc * g.ld;
        memset(row, 0, sizeof(float) * (size_t)g.margin);
        memset(row + g.margin + g.n, 0, sizeof(float) * (g.plane - (size_t)g.n));
    }
    if (din) // transposed bf16 weights: wt[ic][(oc, ki, kj)] = w16[oc][ic][ki][kj]
        for (int oc = 0; oc < l->out_c; oc++)
            for (int ic = 0; ic < l->in.c; ic++)
                dt_bf16_to_f32(w16 + ((size_t)oc * l->in.c + ic) * kk2,
                               wt + (size_t)ic * rb + (size_t)oc * kk2, (size_t)kk2);
    uint16_t *row16 = (uint16_t *)(void *)(wt + (din ? l->wcount : 0)); // one rounded row
    for (int s = c->s0; s < c->s1; s += c->sstep) {
        pad_round(in + (size_t)s * insz, l->in.c, l->in.h, l->in.w, l->pad, xr);
        gather_grad(l, dout, out, g, ext + g.margin, g.ld, s);
        for (int oc = 0; oc < l->out_c; oc++) { // the bias gradient from the fp32 gradient
            float *row = ext + (size_t)oc * g.ld + g.margin;
            dt_nn_row_sums_add(row, 1, g.n, db + oc);
            dt_f32_to_bf16(row, row16, (size_t)g.n);
            dt_bf16_to_f32(row16, row, (size_t)g.n);
        }
        dt_nn_shifted_gemm_nt(ext + g.margin, g.ld, l->out_c, xr, l->offsets + off, (int)l->fan_in,
                              g.n, dw);
        if (!din)
            continue;
        float *dx  = din + (size_t)s * insz;
        float *dxp = l->pad ? xr : dx; // the rounded input is no longer needed
        dt_nn_shifted_gemm(ext, l->offsets + off + l->fan_in, rb, wt, l->in.c, (int)g.plane, dxp,
                           g.plane, false);
        if (l->pad)
            crop_padded(xr, l->in.c, l->in.h, l->in.w, l->pad, dx);
    }
}

// ------------------------------------------------------------- any stride: im2col

static void strided_forward(nn_layer *l, const nn_ctx *c, const float *in, float *out) {
    size_t insz = nn_shape_size(l->in), outsz = nn_shape_size(l->out);
    int    hw = l->out.h * l->out.w, kk = (int)l->fan_in;
    for (int s = c->s0; s < c->s1; s += c->sstep) {
        const float *x = in + (size_t)s * insz;
        float       *y = out + (size_t)s * outsz;
        dt_nn_im2col(x, l->in.c, l->in.h, l->in.w, l->k, l->stride, l->pad, l->out.h, l->out.w,
                     c->scratch);
        // y (Cout, HW) = W (Cout, Cin*k*k) x col (Cin*k*k, HW), then + bias per channel
        lowp_gemm(l, false, false, l->out_c, hw, kk, l->w, l->w16, kk, c->scratch, hw, y, hw,
                  false);
        dt_nn_add_row_bias(y, l->b, l->out_c, hw);
        if (l->fuse_relu)
            dt_nn_relu_inplace(y, outsz);
    }
}

static void strided_backward(nn_layer *l, const nn_ctx *c, const float *in, const float *out,
                             float *dout, float *din, float *dparams) {
    size_t insz = nn_shape_size(l->in), outsz = nn_shape_size(l->out);
    int    hw = l->out.h * l->out.w, kk = (int)l->fan_in;
    float *dw = dparams, *db = dparams + l->wcount;
    for (int s = c->s0; s < c->s1; s += c->sstep) {
        const float *x  = in + (size_t)s * insz;
        float       *dy = dout + (size_t)s * outsz;
        if (l->fuse_relu)
            dt_nn_relu_backward(out + (size_t)s * outsz, dy, outsz);
        dt_nn_im2col(x, l->in.c, l->in.h, l->in.w, l->k, l->stride, l->pad, l->out.h, l->out.w,
                     c->scratch);
        // dW (Cout, Cin*k*k) += dy (Cout, HW) x col^T (HW, Cin*k*k)
        lowp_gemm(l, false, true, l->out_c, kk, hw, dy, NULL, hw, c->scratch, hw, dw, kk, true);
        dt_nn_row_sums_add(dy, l->out_c, hw, db);
        if (!din)
            continue;
        float *dx = din + (size_t)s * insz;
        // dcol (Cin*k*k, HW) = W^T x dy, then scattered back onto the image
        lowp_gemm(l, true, false, kk, hw, l->out_c, l->w, l->w16, kk, dy, hw, c->scratch, hw,
                  false);
        memset(dx, 0, sizeof(float) * insz);
        dt_nn_col2im(c->scratch, l->in.c, l->in.h, l->in.w, l->k, l->stride, l->pad, l->out.h,
                     l->out.w, dx);
    }
}

void dt_team_conv_forward(nn_layer *l, const nn_ctx *c, const float *in, float *out) {
    if (l->direct16 && dt_c16_usable())
        direct16_forward(l, c, in, out);
    else if (l->direct16 && dt_nn_want_direct())
        direct_r16_forward(l, c, in, out);
    else if (l->direct)
        direct_forward(l, c, in, out);
    else if (l->stride == 1)
        wide_forward(l, c, in, out);
    else
        strided_forward(l, c, in, out);
}

void dt_team_conv_backward(nn_layer *l, const nn_ctx *c, const float *in, const float *out,
                           float *dout, float *din, float *dparams) {
    if (l->direct16 && dt_c16_usable())
        direct16_backward(l, c, in, out, dout, din, dparams);
    else if (l->direct16 && dt_nn_want_direct())
        direct_r16_backward(l, c, in, out, dout, din, dparams);
    else if (l->direct)
        direct_backward(l, c, in, out, dout, din, dparams);
    else if (l->stride == 1)
        wide_backward(l, c, in, out, dout, din, dparams);
    else
        strided_backward(l, c, in, out, dout, din, dparams);
}
