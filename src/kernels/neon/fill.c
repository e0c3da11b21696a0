// fill.c: the neon target's hand-written rows (arm64 Advanced SIMD, every arm64 CPU). The
// vector kernels of vec/ built for neon (with FMA contraction) fill the rest.
#include "kernels/fill.h"

void dt_kfill_neon(dt_ktab *t) {
    t->sgemm      = dt_k_sgemm_neon;
    t->f32_to_f16 = dt_k_f32_to_f16_neon;
    t->f16_to_f32 = dt_k_f16_to_f32_neon;
}
