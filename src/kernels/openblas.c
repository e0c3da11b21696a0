// openblas.c: OpenBLAS's cblas_sgemm as the avx512 targets' sgemm row (openblas.h).
#include "kernels/openblas.h"
#include "kernels/fill.h"

#include <cblas.h>
#include <pthread.h>
#include <stdio.h>

static pthread_once_t once = PTHREAD_ONCE_INIT;
static char           info[192];

static void init_once(void) {
    openblas_set_num_threads(1);
    snprintf(info, sizeof info, "%s, kernels %s", openblas_get_config(), openblas_get_corename());
    DT_INFO("nn", "GEMM: %s", info);
}

void dt_k_openblas_init(void) {
    pthread_once(&once, init_once);
}

const char *dt_k_openblas_info(void) {
    pthread_once(&once, init_once);
    return info;
}

void dt_k_sgemm_openblas(bool trans_a, bool trans_b, int m, int n, int k, float alpha,
                         const float *a, int lda, const float *b, int ldb, float beta, float *c,
                         int ldc) {
    cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
                trans_b ? CblasTrans : CblasNoTrans, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}
