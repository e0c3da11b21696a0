// blas.c: the library's fp32 GEMM entry point (the kernel table's sgemm row: dtrain's own
// GEMM below AVX-512, OpenBLAS's from it; kernels/gemm.h says why), and the choice of
// the direct convolution kernels.
#include "nn/blas.h"
#include "dtrain/nn.h"

#include "kernels/openblas.h"
#include "kernels/table.h"
#include "nn/nn_impl.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>

static pthread_once_t once = PTHREAD_ONCE_INIT;
static char           info[320];

static void init_once(void) {
    dt_k_openblas_init(); // one OpenBLAS thread, whoever calls it
    const dt_ktab *t = dt_k();
    char           row[96];
    dt_krow_describe(t, DT_KROW_sgemm, row, sizeof row);
    bool blas = t->how[DT_KROW_sgemm] && strcmp(t->how[DT_KROW_sgemm], "openblas") == 0;
    snprintf(info, sizeof info, "%s%s%s%s", row, blas ? " (" : "", blas ? dt_k_openblas_info() : "",
             blas ? ")" : "");
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
    return dt_isa_on(DT_ISA_AVX512); // the shifted GEMMs' tiles are shaped for AVX-512
}
