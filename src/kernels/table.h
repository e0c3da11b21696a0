// table.h: the kernel table. Every hot operation of dtrain is a row: a function pointer
// of a fixed signature. Each row has a portable C kernel (target ref) and optional
// kernels per target (x86: avx2, avx512, avx512bf16, amx; arm64: neon), living in one
// folder per target under src/kernels. A table is built once per (device, cap): from ref
// upwards, each target the CPU has and the cap allows overrides the rows it fills, and
// each row remembers which target filled it (dt_krow_describe: "conv2d fwd:
// avx512/channels-in-lanes"). dt_k() is the host CPU's table under DT_ISA (cpu.h); layers
// reach it through their usual entry points (dt_nn_relu_forward, dt_sgemm, ...), which
// are one-line calls into it.
//
// A few rows are variants that only some targets have (the channels-in-lanes
// convolutions, the bf16 kernels, oneDNN's convolutions where it is built): their ref row
// is NULL and the caller takes the operation's portable row instead; the comment beside
// each says so. Every other row is never NULL.
//
// Devices: tables are looked up per (operation, device, target). Only the host CPU
// (DT_KDEV_HOST) has kernels today; another device's plugin registers a fill function
// with dt_kdev_add and gets its own table (its rows take that device's buffers).
//
// docs/kernels.md says how to add a row and how to add a target.
#ifndef DTRAIN_KERNELS_TABLE_H
#define DTRAIN_KERNELS_TABLE_H

#include "dtrain/comm.h"
#include "kernels/cpu.h"

#include <stddef.h>
#include <stdint.h>

// ----------------------------------------------------------------- argument types

// A 2-D convolution's geometry (torch.nn.Conv2d, dilation 1, zero padding); nn/ops.h
// calls it dt_nn_conv2d.
typedef struct dt_kconv {
    int  cin, cout, kh, kw, sh, sw, ph, pw, groups;
    bool bias;
} dt_kconv;

// A bf16 GEMM operand: float (rounded to bf16 as it is packed) or uint16_t bf16 bits,
// row stride ld elements.
typedef struct dt_gemm_opnd {
    const void *p;
    size_t      ld;
    bool        f32;
} dt_gemm_opnd;

// A ReLU after a BatchNorm (nn/ops.h's dt_nn_bn_relu): its mask from the forward's output
// y, or with y NULL from x * scale + shift with gamma and beta.
typedef struct dt_kbn_relu {
    const float *y;
    const float *gamma, *beta;
} dt_kbn_relu;

// The optimizers' per-step constants (src/optim computes them, the rows apply them).
typedef struct dt_ksgd {
    float lr, wd, mu, one_minus_damp;
} dt_ksgd;
enum { DT_KSGD_DECAY = 1, DT_KSGD_MOMENTUM = 2, DT_KSGD_NESTEROV = 4, DT_KSGD_FIRST = 8 };
typedef struct dt_kadam {
    float b1, b2;
    float c1, c2;    // 1 - beta1, 1 - beta2
    float wd;        // Adam: g += wd·p; AdamW: 0
    float decay;     // AdamW: p ·= 1 - lr·wd; Adam: 1 (exact no-op)
    float step_size; // lr / (1 - beta1^t)
    float bc2_sqrt;  // sqrt(1 - beta2^t)
    float eps;
} dt_kadam;
enum { DT_KADAM_L2 = 1, DT_KADAM_AMSGRAD = 2 };
typedef struct dt_kadadelta {
    float lr, rho, c, eps, wd; // c = 1 - rho
} dt_kadadelta;

// The gradient shards' tiles of a Linear weight gradient (shifted_gemm_shards): rows x
// columns per shard, one vector block of the shifted GEMMs (nn_impl.h's NN_SHARD_*).
#define DT_KSHARD_ROWS 8
#define DT_KSHARD_COLS 48
// The attention rows' tile: query and key rows per block.
#define DT_KATTN_BLOCK 64

// ----------------------------------------------------------------- row signatures
// (What each computes is said where the entry point is declared: nn/ops.h, nn/nn_impl.h,
// nn/prec.h, nn/conv16.h, kernels/gemm.h; and below for the rows that have none.)

typedef void      dt_k_sgemm_fn(bool trans_a, bool trans_b, int m, int n, int k, float alpha,
                                const float *a, int lda, const float *b, int ldb, float beta, float *c,
                                int ldc);
typedef void      dt_k_shifted_fn(const float *src, const int *off, int R, const float *w, int rows,
                                  int n, float *out, size_t out_ld, bool add);
typedef void      dt_k_shifted_nt_fn(const float *a, size_t a_ld, int rows, const float *src,
                                     const int *off, int R, int n, float *dw);
typedef void      dt_k_shifted_shards_fn(const float *src, const int *off, const int *start,
                                         const int *len, int S, const float *w, int rows, int n,
                                         float *tile, float *out, size_t out_ld);
typedef dt_status dt_k_gemm16_fn(bool trans_a, bool trans_b, int m, int n, int k, dt_gemm_opnd a,
                                 dt_gemm_opnd b, const float *bias, float *c, int ldc,
                                 bool accumulate);

typedef void   dt_k_im2col_fn(const dt_kconv *p, const float *x, int h, int w, int ho, int wo,
                              float *col, size_t ldc);
typedef void   dt_k_col2im_fn(const dt_kconv *p, const float *col, size_t ldc, int h, int w, int ho,
                              int wo, float *dx);
typedef bool   dt_k_conv_ok_fn(const dt_kconv *p);
typedef bool   dt_k_conv_bwd_ok_fn(const dt_kconv *p, int w, bool input_grad);
typedef size_t dt_k_conv_scratch_fn(const dt_kconv *p, int h, int w);
typedef void   dt_k_conv_fwd_fn(const dt_kconv *p, int n, int h, int w, const float *x,
                                const float *wt, const float *b, float *y, float *scratch);
typedef void   dt_k_conv_bwd_fn(const dt_kconv *p, int n, int h, int w, const float *x,
                                const float *wt, const float *dy, float *dx, float *dw, float *db,
                                float *scratch);
typedef void   dt_k_pack_pairs_fn(const float *x, int c, int h, int w, int pad, uint32_t *x2);
typedef void   dt_k_pack_plain_fn(const float *x, int c, int h, int w, int pad, uint16_t *xb);
typedef void   dt_k_rows_to_pairs_fn(const float *g, size_t g_ld, int rows, int n, int margin,
                                     size_t ld2, uint32_t *g2);
typedef void   dt_k_rows_to_pair_cols_fn(const float *g, size_t g_ld, int rows, int n, uint32_t *gt,
                                         int ldt);
typedef void   dt_k_rows_to_both_fn(const float *g, size_t g_ld, int rows, int n, uint32_t *gt,
                                    int ldt, int margin, size_t ld2, uint32_t *g2);
typedef void   dt_k_c16_shifted_fn(const uint32_t *src, const int *off, int R, const uint32_t *w2,
                                   int rows, int n, float *out, size_t out_ld);
typedef void   dt_k_c16_shifted_tn_fn(const uint16_t *src, const int *off, int R, int n,
                                      const uint32_t *gt, int ldt, float *dwt);

// A provider's convolution (kernels/dnnl: oneDNN, where it is built): whether it takes
// this shape (w the input's width) in this direction, chosen by measurement; then
// dt_nn_conv2d_forward's and _backward's contract (nn/ops.h: y written; dx written when
// not NULL, dw and db added to). false: it did nothing (the caller runs its own path).
typedef bool dt_k_conv_ext_ok_fn(const dt_kconv *p, int w, bool backward);
typedef bool dt_k_conv_ext_fwd_fn(const dt_kconv *p, int n, int h, int w, const float *x,
                                  const float *wt, const float *b, float *y);
typedef bool dt_k_conv_ext_bwd_fn(const dt_kconv *p, int n, int h, int w, const float *x,
                                  const float *wt, const float *dy, float *dx, float *dw,
                                  float *db);

typedef void dt_k_map_fn(size_t n, const float *x, float *y);
typedef void dt_k_map2_fn(size_t n, const float *a, const float *b, float *y);
typedef void dt_k_gelu_fn(size_t n, bool tanh_approx, const float *x, float *y);
typedef void dt_k_gelu_bwd_fn(size_t n, bool tanh_approx, const float *x, const float *dy,
                              float *dx);
typedef void dt_k_rows_fn(int rows, int d, const float *x, float *y);
typedef void dt_k_rows2_fn(int rows, int d, const float *y, const float *dy, float *dx);
typedef void dt_k_embed_bwd_fn(int count, int d, const int32_t *idx, const float *dy, float *dw);
typedef void dt_k_row_bias_fn(float *y, const float *b, int rows, int cols);
typedef void dt_k_row_sums_fn(const float *y, int rows, int cols, float *s);
typedef void dt_k_shard_tree_fn(float *buf, size_t ld, int shards, size_t n);
// acc[o] += dy[r * ld + o] for r = 0 .. rows-1 in that order, o < w: column sums in double
typedef void dt_k_col_sums_fn(const float *dy, size_t ld, int rows, int w, double *acc);
typedef void dt_k_planes_fn(size_t planes, size_t hw, const float *x, float *y);
typedef void dt_k_mask_scale_fn(float *v, const uint8_t *mask, size_t units, size_t per_unit,
                                float scale);

typedef void dt_k_bn_stats_fn(int n, int c, int c0, int c1, int l, const float *x, double *sum,
                              double *m2);
typedef void dt_k_bn_apply_fn(int n, int c, int l, int r0, int r1, const float *x,
                              const float *mean, const float *invstd, const float *gamma,
                              const float *beta, const float *res, bool relu, float *y);
typedef void dt_k_bn_bwd_stats_fn(int n, int c, int c0, int c1, int l, const float *x,
                                  const float *dy, const dt_kbn_relu *relu, const float *mean,
                                  const float *invstd, float *sum_dy, float *sum_dyx, float *dres);
typedef void dt_k_bn_bwd_apply_fn(int n, int c, int l, int r0, int r1, const float *x,
                                  const float *dy, const dt_kbn_relu *relu, const float *mean,
                                  const float *invstd, const float *gamma, const float *sum_dy,
                                  const float *sum_dyx, double count, float *dx);
typedef void dt_k_ln_fwd_fn(int rows, int d, float eps, const float *x, const float *gamma,
                            const float *beta, float *y, float *mean, float *rstd);
typedef void dt_k_ln_bwd_fn(int rows, int d, const float *x, const float *gamma, const float *mean,
                            const float *rstd, const float *dy, float *dx, float *dgamma,
                            float *dbeta);
typedef void dt_k_attn_fwd_fn(int B, int T, int C, int H, int ld, const float *q, const float *k,
                              const float *v, float *y, float *lse, float *scratch);
typedef void dt_k_attn_bwd_fn(int B, int T, int C, int H, int ld, const float *q, const float *k,
                              const float *v, const float *y, const float *lse, const float *dy,
                              float *dq, float *dk, float *dv, float *scratch);
// log sum_i e^x[i] of a row of k logits (cross-entropy), as max + log sum e^(x - max)
typedef double dt_k_row_lse_fn(const float *x, int k);
// d = (e^(x - lse) - smooth) * inv, then d[t] -= hot (the cross-entropy gradient of a row)
typedef void dt_k_row_grad_fn(const float *x, int k, float lse, float smooth, float inv, float *d,
                              int t, float hot);

// The optimizers' element loops (src/optim): the flags are the DT_KSGD_* / DT_KADAM_* bits.
typedef void dt_k_sgd_fn(float *p, const float *g, float *b, size_t n, dt_ksgd k, unsigned flags);
// m, v updated; d = v̂ (the max of v and vmax when amsgrad), for the square root
typedef void dt_k_adam_moments_fn(const float *p, const float *g, float *m, float *v, float *vmax,
                                  float *d, size_t n, dt_kadam k, unsigned flags);
// p = p·decay − step_size · m / (s / bc2_sqrt + eps)
typedef void dt_k_adam_apply_fn(float *p, const float *m, const float *s, size_t n, dt_kadam k);
// sq updated; sv = sq + eps, su = acc + eps (for the square roots)
typedef void dt_k_adadelta_sq_fn(const float *p, const float *g, float *sq, const float *acc,
                                 float *sv, float *su, size_t n, dt_kadadelta k);
// delta = su / sv · g; acc updated; p -= lr · delta
typedef void dt_k_adadelta_delta_fn(float *p, const float *g, float *acc, const float *sv,
                                    const float *su, size_t n, dt_kadadelta k);
// sum of g[i]^2 in double, in four lanes added (s0 + s1) + (s2 + s3)
typedef double dt_k_sumsq_fn(const float *g, size_t n);
// g[i] *= c
typedef void dt_k_scale_fn(float *g, size_t n, float c);
// g[i] *= inv; whether any g[i] was inf or NaN before
typedef bool dt_k_unscale_fn(float *g, size_t n, float inv);
// x[i] = sqrtf(x[i]) (correctly rounded on every target)
typedef void dt_k_sqrt_fn(float *x, size_t n);

typedef void dt_k_to16_fn(const float *src, uint16_t *dst, size_t n);
typedef void dt_k_from16_fn(const uint16_t *src, float *dst, size_t n);
typedef void dt_k_round16_fn(const float *src, float *dst, size_t n);
// Rows of dy (row length out) rounded to bf16 into dy16 and, with acc, added to its
// column sums in double (Linear's bias gradient riding along; linear16.c)
typedef void dt_k_round_sum_fn(const float *dy, int rows, int out, uint16_t *dy16, double *acc);

// comm's reductions: dst[i] = a[i] op b[i] (dst may be a or b; op SUM (AVG), PROD, MAX,
// MIN; integers wrap; float MAX/MIN let NaN through: comm/reduce.h's dt_reduce)
typedef void dt_k_reduce_fn(dt_dtype dtype, dt_reduce_op op, void *dst, const void *a,
                            const void *b, size_t n);
// o1[i] = a[i] + b[i], and o2[i] too when o2 is not NULL (the outputs may be the inputs)
typedef void dt_k_reduce_sum2_fn(dt_dtype dtype, void *o1, void *o2, const void *a, const void *b,
                                 size_t n);
// buf[i] /= d (a power of two as a multiply by 1/d: bitwise the same)
typedef void dt_k_reduce_div_fn(float *buf, size_t n, int d);

// The wide layout of a stride-1 convolution (src/nn/layers/conv_team.c): output
// positions indexed over the padded input's width.
typedef struct dt_kwide {
    int    hp, wp; // padded input height and width
    int    n;      // wide output positions: Ho * Wp - (k - 1)
    size_t plane;  // hp * wp
    int    margin; // direct path: zeros before and after each gradient row, (k-1)(Wp+1)
    size_t ld;     // direct path: gradient row stride, margin + plane
} dt_kwide;
// dxp (c, hp, wp) = the wide columns (c k k, n) added back onto the padded image
typedef void dt_k_wide_col2im_fn(const float *col, int c, int k, const dt_kwide *g, float *dxp);
// wide GEMM output (co rows ext_ld apart) -> y (co, ho, wo) + bias (NULL: none), ReLU when relu
typedef void dt_k_wide_out_fn(const float *ext, size_t ext_ld, const float *b, int co, int ho,
                              int wo, const dt_kwide *g, bool relu, float *y);
// compact gradient -> wide rows (zeros in the dropped columns), the ReLU's mask from y
typedef void dt_k_wide_grad_fn(const float *dy, const float *y, int co, int ho, int wo,
                               const dt_kwide *g, bool relu, float *ext, size_t ext_ld);
// wide output -> ReLU + 2x2/2 max pool: y (co, ho/2, wo/2) and each window's winner
typedef void dt_k_wide_pool_fn(const float *ext, size_t ext_ld, const float *b, int co, int ho,
                               int wo, const dt_kwide *g, float *y, uint8_t *arg);
// the pooled gradient -> wide rows, to each window's winner, masked by the ReLU
typedef void dt_k_wide_pool_grad_fn(const float *dy, const float *y, const uint8_t *arg, int co,
                                    int ho, int wo, const dt_kwide *g, float *ext, size_t ext_ld);

// ----------------------------------------------------------------- the rows
// X(field, signature, operation, variant): variant is what a target's kernel of the row
// is ("" when the target's name says it all); a row's label is "operation: target" or
// "operation: target/variant".
// clang-format off
#define DT_KROWS(X)                                                                            \
    X(sgemm,              dt_k_sgemm_fn,             "sgemm",                 "dtrain")        \
    X(shifted_gemm,       dt_k_shifted_fn,           "shifted gemm",          "")              \
    X(shifted_gemm_nt,    dt_k_shifted_nt_fn,        "shifted gemm nt",       "")              \
    X(shifted_gemm_shards,dt_k_shifted_shards_fn,    "shifted gemm shards",   "")              \
    X(gemm_bf16,          dt_k_gemm16_fn,            "bf16 gemm",             "vdpbf16ps")     \
    X(gemm_amx,           dt_k_gemm16_fn,            "bf16 gemm",             "tiles")         \
    X(im2col,             dt_k_im2col_fn,            "im2col",                "")              \
    X(wide_col2im,        dt_k_wide_col2im_fn,       "conv2d wide col2im",    "")              \
    X(wide_to_out,        dt_k_wide_out_fn,          "conv2d wide out",       "")              \
    X(grad_to_wide,       dt_k_wide_grad_fn,         "conv2d wide grad",      "")              \
    X(wide_to_pool,       dt_k_wide_pool_fn,         "conv2d wide pool",      "")              \
    X(pool_grad_to_wide,  dt_k_wide_pool_grad_fn,    "conv2d wide pool grad", "")              \
    X(col2im,             dt_k_col2im_fn,            "col2im",                "")              \
    X(conv_cl_fwd_ok,     dt_k_conv_ok_fn,           "conv2d fwd ok",         "")              \
    X(conv_cl_bwd_ok,     dt_k_conv_bwd_ok_fn,       "conv2d bwd ok",         "")              \
    X(conv_cl_scratch,    dt_k_conv_scratch_fn,      "conv2d scratch",        "")              \
    X(conv_cl_fwd,        dt_k_conv_fwd_fn,          "conv2d fwd",            "channels-in-lanes") \
    X(conv_cl_bwd,        dt_k_conv_bwd_fn,          "conv2d bwd",            "channels-in-lanes") \
    X(conv_ext_ok,        dt_k_conv_ext_ok_fn,       "conv2d provider ok",    "")              \
    X(conv_ext_fwd,       dt_k_conv_ext_fwd_fn,      "conv2d fwd",            "onednn")        \
    X(conv_ext_bwd,       dt_k_conv_ext_bwd_fn,      "conv2d bwd",            "onednn")        \
    X(c16_pack_pairs,     dt_k_pack_pairs_fn,        "conv2d bf16 pack",      "")              \
    X(c16_pack_plain,     dt_k_pack_plain_fn,        "conv2d bf16 pack",      "")              \
    X(c16_rows_to_pairs,  dt_k_rows_to_pairs_fn,     "conv2d bf16 pack",      "")              \
    X(c16_rows_to_pair_cols, dt_k_rows_to_pair_cols_fn, "conv2d bf16 pack",   "")              \
    X(c16_rows_to_both,   dt_k_rows_to_both_fn,      "conv2d bf16 pack",      "")              \
    X(c16_shifted,        dt_k_c16_shifted_fn,       "conv2d bf16",           "vdpbf16ps")     \
    X(c16_shifted_tn,     dt_k_c16_shifted_tn_fn,    "conv2d bf16 dw",        "vdpbf16ps")     \
    X(relu_fwd,           dt_k_map_fn,               "relu fwd",              "")              \
    X(relu_grad,          dt_k_map2_fn,              "relu bwd",              "")              \
    X(gelu_fwd,           dt_k_gelu_fn,              "gelu fwd",              "")              \
    X(gelu_bwd,           dt_k_gelu_bwd_fn,          "gelu bwd",              "")              \
    X(tanh_fwd,           dt_k_map_fn,               "tanh fwd",              "")              \
    X(tanh_bwd,           dt_k_map2_fn,              "tanh bwd",              "")              \
    X(sigmoid_fwd,        dt_k_map_fn,               "sigmoid fwd",           "")              \
    X(sigmoid_bwd,        dt_k_map2_fn,              "sigmoid bwd",           "")              \
    X(silu_fwd,           dt_k_map_fn,               "silu fwd",              "")              \
    X(silu_bwd,           dt_k_map2_fn,              "silu bwd",              "")              \
    X(softmax_fwd,        dt_k_rows_fn,              "softmax fwd",           "")              \
    X(softmax_bwd,        dt_k_rows2_fn,             "softmax bwd",           "")              \
    X(add,                dt_k_map2_fn,              "add",                   "")              \
    X(accumulate,         dt_k_map_fn,               "accumulate",            "")              \
    X(embedding_bwd,      dt_k_embed_bwd_fn,         "embedding bwd",         "")              \
    X(add_row_bias,       dt_k_row_bias_fn,          "bias add",              "")              \
    X(row_sums_add,       dt_k_row_sums_fn,          "bias grad rows",        "")              \
    X(col_sums_f64,       dt_k_col_sums_fn,          "bias grad columns",     "")              \
    X(shard_tree,         dt_k_shard_tree_fn,        "shard tree",            "")              \
    X(mask_scale,         dt_k_mask_scale_fn,        "dropout mask",          "")              \
    X(global_avg,         dt_k_planes_fn,            "global avgpool fwd",    "")              \
    X(global_avg_bwd,     dt_k_planes_fn,            "global avgpool bwd",    "")              \
    X(bn_stats,           dt_k_bn_stats_fn,          "batchnorm stats",       "")              \
    X(bn_apply,           dt_k_bn_apply_fn,          "batchnorm apply",       "")              \
    X(bn_bwd_stats,       dt_k_bn_bwd_stats_fn,      "batchnorm bwd stats",   "")              \
    X(bn_bwd_apply,       dt_k_bn_bwd_apply_fn,      "batchnorm bwd apply",   "")              \
    X(ln_fwd,             dt_k_ln_fwd_fn,            "layernorm fwd",         "")              \
    X(ln_bwd,             dt_k_ln_bwd_fn,            "layernorm bwd",         "")              \
    X(attn_fwd,           dt_k_attn_fwd_fn,          "attention fwd",         "flash")         \
    X(attn_bwd,           dt_k_attn_bwd_fn,          "attention bwd",         "flash")         \
    X(attn16_fwd,         dt_k_attn_fwd_fn,          "attention bf16 fwd",    "vdpbf16ps")     \
    X(attn16_bwd,         dt_k_attn_bwd_fn,          "attention bf16 bwd",    "vdpbf16ps")     \
    X(ce_row_lse,         dt_k_row_lse_fn,           "cross-entropy lse",     "")              \
    X(ce_row_grad,        dt_k_row_grad_fn,          "cross-entropy grad",    "")              \
    X(sgd,                dt_k_sgd_fn,               "sgd",                   "")              \
    X(adam_moments,       dt_k_adam_moments_fn,      "adam moments",          "")              \
    X(adam_apply,         dt_k_adam_apply_fn,        "adam apply",            "")              \
    X(adadelta_sq,        dt_k_adadelta_sq_fn,       "adadelta square",       "")              \
    X(adadelta_delta,     dt_k_adadelta_delta_fn,    "adadelta delta",        "")              \
    X(sum_squares,        dt_k_sumsq_fn,             "grad norm",             "")              \
    X(scale,              dt_k_scale_fn,             "grad scale",            "")              \
    X(unscale_check,      dt_k_unscale_fn,           "grad unscale",          "")              \
    X(vsqrt,              dt_k_sqrt_fn,              "sqrt",                  "")              \
    X(f32_to_bf16,        dt_k_to16_fn,              "fp32 to bf16",          "")              \
    X(bf16_to_f32,        dt_k_from16_fn,            "bf16 to fp32",          "")              \
    X(f32_round_bf16,     dt_k_round16_fn,           "fp32 round bf16",       "")              \
    X(bf16_round_sum,     dt_k_round_sum_fn,         "fp32 to bf16 + sums",   "")              \
    X(f32_to_f16,         dt_k_to16_fn,              "fp32 to fp16",          "")              \
    X(f16_to_f32,         dt_k_from16_fn,            "fp16 to fp32",          "")              \
    X(reduce,             dt_k_reduce_fn,            "reduce",                "")              \
    X(reduce_sum2,        dt_k_reduce_sum2_fn,       "reduce sum2",           "")              \
    X(reduce_div,         dt_k_reduce_div_fn,        "reduce div",            "")
// clang-format on

#define DT_KROW_ENUM_(name, type, op, variant) DT_KROW_##name,
typedef enum dt_krow { DT_KROWS(DT_KROW_ENUM_) DT_KROW_COUNT_ } dt_krow;
#undef DT_KROW_ENUM_

// One device's table for one cap. `from` names the target that filled each row ("avx2";
// a device's name for another device's table) and `how` what its kernel is there (NULL:
// the row's variant above).
#define DT_KROW_FIELD_(name, type, op, variant) type *name;
typedef struct dt_ktab {
    DT_KROWS(DT_KROW_FIELD_)
    const char *from[DT_KROW_COUNT_];
    const char *how[DT_KROW_COUNT_];
} dt_ktab;
#undef DT_KROW_FIELD_

// ----------------------------------------------------------------- lookup

typedef enum dt_kdev {
    DT_KDEV_HOST   = 0, // the CPU this process runs on
    DT_KDEV_COUNT_ = 4
} dt_kdev;

// The host CPU's table under DT_ISA (dt_isa_top()): built on first use, thread-safe,
// never NULL.
const dt_ktab *dt_k(void);
// Device dev's table with the targets from ref up to cap that the CPU has (the host's
// rows of a target the CPU lacks stay those below it). NULL when dev has no kernels.
const dt_ktab *dt_ktab_get(dt_kdev dev, dt_isa cap);
// Only the rows target t itself fills (every other row NULL), whatever DT_ISA says, or
// NULL when the CPU lacks t: for tests that compare each target's kernels with ref.
const dt_ktab *dt_ktab_only(dt_isa t);

// Another device's kernels: `fill` sets the rows it has (the rest stay NULL) in a table
// built once on first lookup; its targets are recorded as `name` (e.g. "cuda").
// DT_ERR_STATE when dev is the host or already has kernels.
dt_status dt_kdev_add(dt_kdev dev, const char *name, void (*fill)(dt_ktab *t));

// ----------------------------------------------------------------- naming

// "conv2d fwd", the row's operation.
const char *dt_krow_op(dt_krow r);
// "conv2d fwd: avx512/channels-in-lanes" for row r of table t (or "...: none" when the
// row is NULL there); into buf, which it returns.
const char *dt_krow_describe(const dt_ktab *t, dt_krow r, char *buf, size_t n);
// The kernel set of dt_k(): "kernels avx2 (ref 9, avx2 61 rows)"; into buf.
const char *dt_ktab_summary(char *buf, size_t n);
// The start-up line: the CPU (dt_cpu_describe) and the kernel set, e.g. "AMD EPYC 7B13
// (L1d 32 KiB, ...): kernels avx2 (DT_ISA unset; has avx2); rows: ref 9, avx2 61".
// The trainer prints it at start (rank 0) and in --stats.
const char *dt_kernels_describe(char *buf, size_t n);

#endif // DTRAIN_KERNELS_TABLE_H
