// bf16k.h: the avx512bf16 target's kernels (VDPBF16PS), shared between its files and put
// in the table by fill.c: the bf16 shifted GEMMs of a convolution and their packing
// (conv16.c; nn/conv16.h says what each computes), the bf16 GEMM (gemm16.c; nn/prec.h's
// dt_gemm_bf16) and the bf16 attention (attn16.c; nn/ops.h's dt_nn_attn16_*). Internal to
// src/kernels/avx512bf16.
#ifndef DTRAIN_KERNELS_AVX512BF16_BF16K_H
#define DTRAIN_KERNELS_AVX512BF16_BF16K_H

#include "kernels/table.h"

dt_k_pack_pairs_fn        dt_k16_pack_pairs;
dt_k_pack_plain_fn        dt_k16_pack_plain;
dt_k_rows_to_pairs_fn     dt_k16_rows_to_pairs;
dt_k_rows_to_pair_cols_fn dt_k16_rows_to_pair_cols;
dt_k_rows_to_both_fn      dt_k16_rows_to_both;
dt_k_c16_shifted_fn       dt_k16_shifted;
dt_k_c16_shifted_tn_fn    dt_k16_shifted_tn;
dt_k_gemm16_fn            dt_k16_gemm;
dt_k_attn_fwd_fn          dt_k16_attn_forward;
dt_k_attn_bwd_fn          dt_k16_attn_backward;

#endif // DTRAIN_KERNELS_AVX512BF16_BF16K_H
