// blas.h: the one fp32 GEMM entry point of the library: the kernel table's sgemm row
// (dtrain's own GEMM, kernels/gemm.h).
#ifndef DTRAIN_NN_BLAS_H
#define DTRAIN_NN_BLAS_H

#include "dtrain/core.h"

// Checks DT_ISA (DT_ERR_ARG naming a value that is no target here); thread-safe. Call
// before the first dt_sgemm.
dt_status dt_blas_init(void);

// Row-major C (M, N) = alpha * op(A) (M, K) * op(B) (K, N) + beta * C.
void dt_sgemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float *a, int lda,
              const float *b, int ldb, float beta, float *c, int ldc);

#endif // DTRAIN_NN_BLAS_H
