// fill.c: the avx512 target's hand-written rows (x86-64-v4: AVX-512 F, BW, DQ, VL): the
// GEMM's 12x32 tile, the channels-in-lanes convolutions, fp16 conversions. The vector
// kernels of vec/ built for avx512 fill the rest.
#include "kernels/fill.h"
#include "kernels/avx512/conv_cl.h"

void dt_kfill_avx512(dt_ktab *t) {
    t->sgemm           = dt_k_sgemm_avx512;
    t->f32_to_f16      = dt_k_f32_to_f16_avx512;
    t->f16_to_f32      = dt_k_f16_to_f32_avx512;
    t->conv_cl_fwd_ok  = dt_kcl_forward_ok;
    t->conv_cl_bwd_ok  = dt_kcl_backward_ok;
    t->conv_cl_scratch = dt_kcl_scratch;
    t->conv_cl_fwd     = dt_kcl_forward;
    t->conv_cl_bwd     = dt_kcl_backward;
}
