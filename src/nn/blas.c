// blas.c: OpenBLAS's cblas_sgemm behind one function, and one OpenBLAS thread.
// dtrain splits batches over threads of its own (nn/pool.c); OpenBLAS threads inside
// each call would compete with them for the same cores. OpenBLAS chooses its kernels
// when it is loaded, from the CPU or from OPENBLAS_CORETYPE; dt_blas_info reports the
// choice.
#include "nn/blas.h"
#include "dtrain/nn.h"

#include "kernels/gemm.h"
#include "nn/nn_impl.h"

#ifndef DT_NO_OPENBLAS
#include <cblas.h>
#endif
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static pthread_once_t once = PTHREAD_ONCE_INIT;
static char           info[192];

static void init_once(void) {
#ifdef DT_NO_OPENBLAS // make BLAS=0: dtrain's own GEMM on every CPU (kernels/gemm.h)
    snprintf(info, sizeof info, "dtrain's GEMM (built without OpenBLAS), kernels %s",
             dt_isa_name(dt_isa_top() == DT_ISA_NEON  ? DT_ISA_REF
                         : dt_isa_top() > DT_ISA_AVX2 ? DT_ISA_AVX2
                                                      : dt_isa_top()));
#else
    openblas_set_num_threads(1);
    snprintf(info, sizeof info, "%s, kernels %s", openblas_get_config(), openblas_get_corename());
#endif
    DT_INFO("nn", "GEMM: %s", info);
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
    // Below AVX-512, dtrain's own GEMM: OpenBLAS's AVX2 kernels round a row differently
    // by where it falls in their last block, which breaks the promise that a sample's
    // numbers do not depend on how the batch is split (kernels/gemm.h)
    dt_isa top = dt_isa_top();
#ifdef DT_NO_OPENBLAS // AVX-512 machines too, on the AVX2 kernels; Arm on the portable ones
    top = top == DT_ISA_NEON ? DT_ISA_REF : top > DT_ISA_AVX2 ? DT_ISA_AVX2 : top;
#endif
    if (top == DT_ISA_AVX2 || top == DT_ISA_REF) {
        dt_k_sgemm(top, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
        return;
    }
#ifndef DT_NO_OPENBLAS
    cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
                trans_b ? CblasTrans : CblasNoTrans, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
#endif
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
#if defined(__x86_64__) && defined(__GNUC__)
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f");
#else
    return false;
#endif
}
