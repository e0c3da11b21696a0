// fill.h: the functions that put each target's kernels in the table (table.c calls them
// from ref upwards, each only when dt_isa_on-style checks allow its target), and the
// kernels that one file of src/kernels defines and another registers. Internal to
// src/kernels.
#ifndef DTRAIN_KERNELS_FILL_H
#define DTRAIN_KERNELS_FILL_H

#include "kernels/table.h"

// The vector kernels of src/kernels/vec, one object per target (vec/vec.h).
void dt_kvec_fill_ref(dt_ktab *t);
void dt_kvec_fill_avx2(dt_ktab *t);
void dt_kvec_fill_avx512(dt_ktab *t);
void dt_kvec_fill_neon(dt_ktab *t);

// The hand-written kernels of each target's folder (<target>/fill.c), and ref's.
void dt_kfill_ref(dt_ktab *t);
void dt_kfill_avx2(dt_ktab *t);
void dt_kfill_avx512(dt_ktab *t);
void dt_kfill_avx512bf16(dt_ktab *t);
void dt_kfill_amx(dt_ktab *t);
void dt_kfill_neon(dt_ktab *t);

// dnnl/conv_dnnl.c (built where oneDNN is found): its convolution rows on AVX2 CPUs, and
// the step that takes them out again from AVX-512 up, where they were not measured.
void dt_kfill_dnnl(dt_ktab *t);
void dt_kfill_dnnl_off(dt_ktab *t);

// ref/half_ref.c: the fp16 conversions one value at a time.
void dt_kfill_half_ref(dt_ktab *t);

// gemm.c: dtrain's GEMM on each target's tile (dt_k_sgemm with that target).
dt_k_sgemm_fn dt_k_sgemm_ref;
dt_k_sgemm_fn dt_k_sgemm_avx2;
dt_k_sgemm_fn dt_k_sgemm_avx512;
dt_k_sgemm_fn dt_k_sgemm_neon;

// avx2/shifted_avx2.c: the shifted GEMMs on AVX2's register tiles.
dt_k_shifted_fn        dt_k_shifted_gemm_avx2;
dt_k_shifted_nt_fn     dt_k_shifted_gemm_nt_avx2;
dt_k_shifted_shards_fn dt_k_shifted_gemm_shards_avx2;

// avx2/half_avx2.c, avx512/half_avx512.c: the fp16 conversions in hardware.
dt_k_to16_fn   dt_k_f32_to_f16_avx2;
dt_k_from16_fn dt_k_f16_to_f32_avx2;
dt_k_to16_fn   dt_k_f32_to_f16_avx512;
dt_k_from16_fn dt_k_f16_to_f32_avx512;
// neon/half_neon.c: the same with FCVTN / FCVTL.
dt_k_to16_fn   dt_k_f32_to_f16_neon;
dt_k_from16_fn dt_k_f16_to_f32_neon;

#endif // DTRAIN_KERNELS_FILL_H
