// fill.c: the avx2 target's hand-written rows (x86-64-v3: AVX2, FMA, F16C). The vector
// kernels of vec/ built for avx2 fill the rest.
#include "kernels/fill.h"

void dt_kfill_avx2(dt_ktab *t) {
    t->sgemm               = dt_k_sgemm_avx2;
    t->shifted_gemm        = dt_k_shifted_gemm_avx2;
    t->shifted_gemm_nt     = dt_k_shifted_gemm_nt_avx2;
    t->shifted_gemm_shards = dt_k_shifted_gemm_shards_avx2;
    t->f32_to_f16          = dt_k_f32_to_f16_avx2;
    t->f16_to_f32          = dt_k_f16_to_f32_avx2;
}
