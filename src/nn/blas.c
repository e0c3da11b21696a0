// blas.c: the library's fp32 GEMM entry point, the kernel table's sgemm row (dtrain's own
// GEMM on every target: kernels/gemm.h says why), and the choice of the direct
// convolution kernels.
#include "nn/blas.h"
#include "dtrain/nn.h"

#include "kernels/table.h"
#include "nn/nn_impl.h"

#include <pthread.h>

static pthread_once_t once = PTHREAD_ONCE_INIT;
static char           info[96];

static void init_once(void) {
    dt_krow_describe(dt_k(), DT_KROW_sgemm, info, sizeof info);
}

dt_status dt_blas_init(void) {
    pthread_once(&once, init_once);
    return dt_cpu_check(); // a DT_ISA that names no target stops the model being built
}

const char *dt_blas_info(void) {
    pthread_once(&once, init_once);
    return info;
}

void dt_sgemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float *a, int lda,
              const float *b, int ldb, float beta, float *c, int ldc) {
    dt_k()->sgemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

bool dt_nn_want_direct(void) {
    int choice = 0; // auto|direct|gemm
    if (dt_setting_choice("DT_CONV", &choice) != DT_OK) {
        DT_WARN("nn", "%s; choosing by the CPU", dt_last_error());
        dt_clear_error();
    }
    if (choice == 1)
        return true;
    if (choice == 2)
        return false;
    // the shifted GEMMs' tiles are shaped for AVX2 (kernels/avx2/shifted_avx2.c) and
    // AVX-512 (kernels/vec/shifted.c); ref's are plain loops
    return dt_isa_on(DT_ISA_AVX2);
}
