// gemm16.c: C (fp32) (+)= op(A) op(B) with A, B in bf16 (prec.h), on the path chosen at
// run time.
//
// avx512bf16 path: the bf16 gemm row of that target (kernels/avx512bf16/gemm16.c says how
// VDPBF16PS runs it).
//
// fp32 path: the operands are widened to fp32 (exact: bf16 is a truncated fp32) and
// multiplied by the fp32 GEMM (dt_sgemm). It runs on any CPU and is the reference the
// avx512bf16 path is tested against.
//
// AMX (TDPBF16PS) is the amx target's row (kernels/amx/amx.c): selected only when asked
// for (DT_PRECISION_PATH=amx), since it has not run on an AMX machine yet.
#include "kernels/table.h"
#include "nn/blas.h"
#include "nn/prec.h"

#include <string.h>

typedef dt_gemm_opnd opnd;

// ------------------------------------------------------------------ fp32 path
// Row i of an operand (rows x cols, stride ld) as fp32 values of bf16 numbers.
static void widen_rows(opnd x, int rows, int cols, float *dst) {
    for (int i = 0; i < rows; i++) {
        float *d = dst + (size_t)i * cols;
        if (x.f32)
            dt_f32_round_bf16((const float *)x.p + (size_t)i * x.ld, d, (size_t)cols);
        else
            dt_bf16_to_f32((const uint16_t *)x.p + (size_t)i * x.ld, d, (size_t)cols);
    }
}

static dt_status gemm_fp32(bool ta, bool tb, int m, int n, int k, opnd a, opnd b, float *c, int ldc,
                           bool accumulate) {
    int    ar = ta ? k : m, ac = ta ? m : k, br = tb ? n : k, bc = tb ? k : n;
    float *fa = dt_alloc(sizeof(float) * ((size_t)ar * ac + (size_t)br * bc));
    if (!fa)
        return dt_fail(DT_ERR_NOMEM, "bf16 GEMM (fp32 path): expected room for %zu floats",
                       (size_t)ar * ac + (size_t)br * bc);
    float *fb = fa + (size_t)ar * ac;
    widen_rows(a, ar, ac, fa);
    widen_rows(b, br, bc, fb);
    dt_blas_init();
    dt_sgemm(ta, tb, m, n, k, 1.0f, fa, ac, fb, bc, accumulate ? 1.0f : 0.0f, c, ldc);
    dt_free(fa);
    return DT_OK;
}

static dt_status gemm_any(dt_prec_path path, bool trans_a, bool trans_b, int m, int n, int k,
                          opnd a, opnd b, const float *bias, float *c, int ldc, bool accumulate) {
    if (m <= 0 || n <= 0)
        return DT_OK;
    if (bias && !accumulate &&
        (k <= 0 || path != DT_PATH_AVX512BF16 || !dt_prec_path_supported(DT_PATH_AVX512BF16))) {
        for (int i = 0; i < m; i++) // the other paths add the product to C = bias
            memcpy(c + (size_t)i * ldc, bias, sizeof(float) * (size_t)n);
        accumulate = true;
        bias       = NULL;
    }
    if (k <= 0) {
        if (!accumulate)
            for (int i = 0; i < m; i++)
                memset(c + (size_t)i * ldc, 0, sizeof(float) * (size_t)n);
        return DT_OK;
    }
    if (path == DT_PATH_AVX512BF16 && dt_prec_path_supported(DT_PATH_AVX512BF16))
        return dt_k()->gemm_bf16(trans_a, trans_b, m, n, k, a, b, bias, c, ldc, accumulate);
    if (path == DT_PATH_AMX && dt_amx_usable()) // opt-in only (kernels/amx/amx.c)
        return dt_k()->gemm_amx(trans_a, trans_b, m, n, k, a, b, NULL, c, ldc, accumulate);
    (void)path;
    return gemm_fp32(trans_a, trans_b, m, n, k, a, b, c, ldc, accumulate);
}

dt_status dt_gemm_bf16_path(dt_prec_path path, bool trans_a, bool trans_b, int m, int n, int k,
                            const uint16_t *a, int lda, const uint16_t *b, int ldb, float *c,
                            int ldc, bool accumulate) {
    return gemm_any(path, trans_a, trans_b, m, n, k, (opnd){a, (size_t)lda, false},
                    (opnd){b, (size_t)ldb, false}, NULL, c, ldc, accumulate);
}

dt_status dt_gemm_bf16(bool trans_a, bool trans_b, int m, int n, int k, const uint16_t *a, int lda,
                       const uint16_t *b, int ldb, float *c, int ldc, bool accumulate) {
    return dt_gemm_bf16_path(dt_prec_path_get(), trans_a, trans_b, m, n, k, a, lda, b, ldb, c, ldc,
                             accumulate);
}

dt_status dt_gemm_bf16_mixed(dt_prec_path path, bool trans_a, bool trans_b, int m, int n, int k,
                             const void *a, int lda, bool a_f32, const void *b, int ldb, bool b_f32,
                             float *c, int ldc, bool accumulate) {
    return gemm_any(path, trans_a, trans_b, m, n, k, (opnd){a, (size_t)lda, a_f32},
                    (opnd){b, (size_t)ldb, b_f32}, NULL, c, ldc, accumulate);
}

dt_status dt_gemm_bf16_bias(bool trans_a, bool trans_b, int m, int n, int k, const uint16_t *a,
                            int lda, const uint16_t *b, int ldb, const float *bias, float *c,
                            int ldc) {
    return gemm_any(dt_prec_path_get(), trans_a, trans_b, m, n, k, (opnd){a, (size_t)lda, false},
                    (opnd){b, (size_t)ldb, false}, bias, c, ldc, false);
}

dt_status dt_gemm_f32_as_bf16(bool trans_a, bool trans_b, int m, int n, int k, const float *a,
                              int lda, const float *b, int ldb, float *c, int ldc,
                              bool accumulate) {
    return dt_gemm_bf16_mixed(dt_prec_path_get(), trans_a, trans_b, m, n, k, a, lda, true, b, ldb,
                              true, c, ldc, accumulate);
}
