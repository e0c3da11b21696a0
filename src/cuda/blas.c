// blas.c: the executor's matrix products through cuBLAS, row-major as the CPU's
// dt_sgemm (row-major C = A B is column-major C^T = B^T A^T: the operands swap).
// fp32 products keep cuBLAS's default math, which never uses TF32 (so results compare
// with the CPU's); bf16 operands multiply with fp32 accumulation (cublasGemmEx,
// CUBLAS_COMPUTE_32F), as torch.autocast's matmul.
#include "cuda/exec_impl.h"

#define BLAS_WORKSPACE (32u << 20) // bytes: cuBLAS's own scratch, fixed for graph capture

static const char *blas_error(cublasStatus_t st) {
    return cublasGetStatusString(st);
}

#define CU_BLAS(call)                                                                              \
    do {                                                                                           \
        cublasStatus_t cu_b_ = (call);                                                             \
        if (cu_b_ != CUBLAS_STATUS_SUCCESS)                                                        \
            return cu_fail(cu_b_ == CUBLAS_STATUS_ALLOC_FAILED ? DT_ERR_NOMEM : DT_ERR_IO,         \
                           "%s: %s", #call, blas_error(cu_b_));                                    \
    } while (0)

dt_status cx_blas_open(cx *x) {
    CU_BLAS(cublasCreate(&x->blas));
    CU_BLAS(cublasSetStream(x->blas, x->s));
    CU_BLAS(cublasSetMathMode(x->blas, CUBLAS_DEFAULT_MATH));
    DT_TRY(cu_mem_alloc(x->dev, BLAS_WORKSPACE, &x->blas_ws));
    CU_BLAS(cublasSetWorkspace(x->blas, x->blas_ws, BLAS_WORKSPACE));
    return DT_OK;
}

void cx_blas_close(cx *x) {
    if (x->blas)
        cublasDestroy(x->blas);
    cu_mem_free(x->dev, x->blas_ws);
    x->blas    = NULL;
    x->blas_ws = NULL;
}

dt_status cx_gemm(cx *x, bool ta, bool tb, int m, int n, int k, const float *a, int lda,
                  const float *b, int ldb, float beta, float *c, int ldc) {
    if (m <= 0 || n <= 0)
        return DT_OK;
    float alpha = 1.0f;
    CU_BLAS(cublasSgemm(x->blas, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N, n,
                        m, k, &alpha, b, ldb, a, lda, &beta, c, ldc));
    return DT_OK;
}

dt_status cx_gemm16(cx *x, bool ta, bool tb, int m, int n, int k, const uint16_t *a, int lda,
                    const uint16_t *b, int ldb, float beta, float *c, int ldc) {
    if (m <= 0 || n <= 0)
        return DT_OK;
    float alpha = 1.0f;
    CU_BLAS(cublasGemmEx(x->blas, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N, n,
                         m, k, &alpha, b, CUDA_R_16BF, ldb, a, CUDA_R_16BF, lda, &beta, c,
                         CUDA_R_32F, ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    return DT_OK;
}
