// prec.h: 16-bit floating-point formats and the bf16 matrix product, for mixed precision
// (issue 14: "precision is a policy"). fp32 master weights stay in fp32; these kernels
// move data into bf16 / fp16 and multiply bf16 matrices with fp32 accumulation.
//
// Formats are stored as uint16_t bit patterns:
//   bf16: the upper half of an IEEE fp32 (8 exponent bits, 7 mantissa bits);
//   fp16: IEEE binary16 (5 exponent bits, 10 mantissa bits).
// Every fp32 -> 16-bit conversion rounds to nearest, ties to even; NaN stays NaN (quiet,
// sign kept), infinities stay infinities, overflow gives infinity, fp32 denormals are
// rounded like any other number (no flush to zero). Every path (vector or scalar) gives
// the same bits, so results do not depend on the CPU.
//
// Paths of the GEMM, chosen once at run time (dt_prec_path) or forced with the
// environment variable DT_PRECISION_PATH=auto|avx512bf16|amx|fp32:
//   avx512bf16: VDPBF16PS on packed panels (needs AVX512F + AVX512BW + AVX512-BF16);
//   amx:        TDPBF16PS tiles (kernels/amx/amx.c). Never chosen by auto: it has run on
//               one AMX machine, unmeasured, so only DT_PRECISION_PATH=amx selects it (an
//               error where the CPU, DT_ISA or the kernel does not allow AMX);
//   fp32:       widen bf16 to fp32 (exact) and multiply with dt_sgemm; runs anywhere.
#ifndef DTRAIN_NN_PREC_H
#define DTRAIN_NN_PREC_H

#include "dtrain/core.h"
#include "kernels/amx/amx.h" // dt_amx_usable, dt_gemm_amx
#include "kernels/half.h"    // dt_f32_to_bf16_1 and friends: one value at a time
#include "kernels/table.h"   // dt_gemm_opnd

#include <stddef.h>
#include <stdint.h>

// ------------------------------------------------------------------ conversions
// Over n elements, on the kernel table's rows (vector code on every target; the fp16
// ones with F16C from avx2 and AVX-512F from avx512): the same bits as the one-value
// functions of kernels/half.h on every target. src and dst may not overlap.
void dt_f32_to_bf16(const float *src, uint16_t *dst, size_t n);
void dt_bf16_to_f32(const uint16_t *src, float *dst, size_t n);
void dt_f32_to_f16(const float *src, uint16_t *dst, size_t n);
void dt_f16_to_f32(const uint16_t *src, float *dst, size_t n);
// dst = src rounded to bf16 and widened back (the value a bf16 operand would have).
void dt_f32_round_bf16(const float *src, float *dst, size_t n);

// ------------------------------------------------------------------ bf16 GEMM
typedef enum dt_prec_path {
    DT_PATH_FP32 = 0,   // widen to fp32, dt_sgemm
    DT_PATH_AVX512BF16, // VDPBF16PS
    DT_PATH_AMX,        // TDPBF16PS, opt-in only (see above)
    DT_PATH_COUNT_
} dt_prec_path;

const char *dt_prec_path_name(dt_prec_path p);
// Whether this CPU (and this build) can run path p.
bool dt_prec_path_supported(dt_prec_path p);
// The path in use: DT_PRECISION_PATH if set (read once), else the best supported one.
// A forced path the CPU lacks, or an unknown name, is an error reported by
// dt_prec_path_init; dt_prec_path then falls back to fp32 (never to an unsupported path).
dt_prec_path dt_prec_path_get(void);
// Reads DT_PRECISION_PATH now and fixes the path; DT_ERR_ARG naming the value and the
// accepted ones if it is unknown or unsupported here.
dt_status dt_prec_path_init(void);
// Forces a path for this process (tests, benchmarks); DT_ERR_ARG if unsupported here.
dt_status dt_prec_path_set(dt_prec_path p);
// One line for the start-up banner and --profile: how the products of precision p run
// on this CPU ("bf16: avx512bf16 dot products", "bf16: no bf16 hardware: operands rounded
// to bf16, products on the fp32 kernels", ...). Empty for fp32.
const char *dt_prec_describe(dt_precision p, char *buf, size_t n);

// Row-major C (M, N) (+)= op(A) (M, K) * op(B) (K, N), A and B bf16, C fp32, products
// summed in fp32. op(A) = A, or A^T when trans_a (A stored (K, M)); likewise B. The
// layers need NN (forward: x W^T is NT), NT and TN (weight gradient). accumulate=false
// overwrites C. lda/ldb/ldc are row strides in elements. Runs on the current path.
// DT_ERR_NOMEM if its buffers cannot be had (nothing else fails; shapes are trusted).
dt_status dt_gemm_bf16(bool trans_a, bool trans_b, int m, int n, int k, const uint16_t *a, int lda,
                       const uint16_t *b, int ldb, float *c, int ldc, bool accumulate);
// The same on an explicit path (must be supported; tests and benchmarks).
dt_status dt_gemm_bf16_path(dt_prec_path path, bool trans_a, bool trans_b, int m, int n, int k,
                            const uint16_t *a, int lda, const uint16_t *b, int ldb, float *c,
                            int ldc, bool accumulate);

// C = op(A) op(B) + bias (a row of n floats added to every row; NULL: none), on the
// current path; the avx512bf16 path starts its sums from the bias instead of zero.
dt_status dt_gemm_bf16_bias(bool trans_a, bool trans_b, int m, int n, int k, const uint16_t *a,
                            int lda, const uint16_t *b, int ldb, const float *bias, float *c,
                            int ldc);

// Either operand in bf16 (x_f32 false: uint16_t) or fp32 (x_f32 true: float, rounded
// to bf16 to nearest even as it is packed, so no converted copy is needed): the result
// is the same as converting the fp32 operand with dt_f32_to_bf16 first. On the given
// path (dt_prec_path_get() for the current one).
dt_status dt_gemm_bf16_mixed(dt_prec_path path, bool trans_a, bool trans_b, int m, int n, int k,
                             const void *a, int lda, bool a_f32, const void *b, int ldb, bool b_f32,
                             float *c, int ldc, bool accumulate);
// Both operands fp32, multiplied as bf16 on the current path (autocast's matmul).
dt_status dt_gemm_f32_as_bf16(bool trans_a, bool trans_b, int m, int n, int k, const float *a,
                              int lda, const float *b, int ldb, float *c, int ldc, bool accumulate);

// ------------------------------------------------------------------ AMX
// dt_amx_usable and dt_gemm_amx (the tiles, or their software model): kernels/amx/amx.h.

// ------------------------------------------------------------------ autocast (autocast.c)
// What Linear and Conv2d (graph layers and the Sequential model) use in a 16-bit
// precision mode (core.h's dt_precision), as torch.autocast does for mm/conv:
//   bf16: operands rounded to bf16 (the weights once per step into a shadow copy, the
//         activations as they are packed), products summed in fp32 on the current GEMM
//         path (avx512bf16, amx or the fp32 fallback); the result stays fp32.
//   fp16: operands rounded to fp16 (no fp16 GEMM here: the rounded values are exact in
//         fp32 and their products too, so the fp32 GEMM sums them as an fp16 GEMM
//         with fp32 accumulation would), and the product rounded to fp16, so that
//         overflow gives inf and tiny gradients flush as they would in fp16: what the
//         GradScaler is for.
//   fp32: dt_sgemm, bitwise what the layers did before.

// Bytes of the shadow of n weights (0 for fp32).
size_t dt_ac_shadow_bytes(dt_precision p, size_t n);
// Fills the shadow: bf16 bits (uint16_t) for bf16, fp16-rounded floats for fp16.
void dt_ac_shadow_fill(dt_precision p, const float *w, size_t n, void *shadow);
// C (m, n) (+)= op(A) op(B), A and B fp32 row-major with strides lda/ldb (op: transpose
// when trans_*); a16 / b16: the operand's shadow (same layout and stride) or NULL to
// round A / B on the fly. DT_ERR_NOMEM if a temporary cannot be had.
dt_status dt_ac_gemm(dt_precision p, bool trans_a, bool trans_b, int m, int n, int k,
                     const float *a, const void *a16, int lda, const float *b, const void *b16,
                     int ldb, float *c, int ldc, bool accumulate);
// x rounded to fp16 and back, in place (overflow: inf).
void dt_f32_round_f16_inplace(float *x, size_t n);

#endif // DTRAIN_NN_PREC_H
