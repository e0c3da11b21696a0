// fill.c: the avx512bf16 target's rows (AVX-512 with VDPBF16PS): the bf16 products.
#include "kernels/fill.h"
#include "kernels/avx512bf16/bf16k.h"

void dt_kfill_avx512bf16(dt_ktab *t) {
    t->gemm_bf16             = dt_k16_gemm;
    t->c16_pack_pairs        = dt_k16_pack_pairs;
    t->c16_pack_plain        = dt_k16_pack_plain;
    t->c16_rows_to_pairs     = dt_k16_rows_to_pairs;
    t->c16_rows_to_pair_cols = dt_k16_rows_to_pair_cols;
    t->c16_rows_to_both      = dt_k16_rows_to_both;
    t->c16_shifted           = dt_k16_shifted;
    t->c16_shifted_tn        = dt_k16_shifted_tn;
    t->attn16_fwd            = dt_k16_attn_forward;
    t->attn16_bwd            = dt_k16_attn_backward;
}
