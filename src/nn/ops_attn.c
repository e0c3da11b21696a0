// ops_attn.c: fused causal multi-head self-attention, flash-attention style (ops.h): its
// checks and scratch here, its kernels as rows of the kernel table (kernels/vec/attn.c
// says how they work).
#include "nn/conv16.h"
#include "nn/ops.h"

enum { BLOCK = DT_KATTN_BLOCK };

int dt_nn_attn_block(void) {
    return BLOCK;
}

dt_status dt_nn_attn_check(int B, int T, int C, int H, int ld) {
    if (B < 1 || T < 1 || C < 1 || H < 1 || C % H || ld < C)
        return dt_fail(DT_ERR_ARG,
                       "attention: expected B, T, C, heads >= 1, heads dividing C and a row "
                       "stride >= C, found B %d, T %d, C %d, heads %d, stride %d",
                       B, T, C, H, ld);
    return DT_OK;
}

size_t dt_nn_attn_scratch(int d) {
    return 2 * (size_t)BLOCK * BLOCK + (size_t)BLOCK * d + 2 * BLOCK;
}

void dt_nn_attn_forward(int B, int T, int C, int H, int ld, const float *q, const float *k,
                        const float *v, float *y, float *lse, float *scratch) {
    dt_k()->attn_fwd(B, T, C, H, ld, q, k, v, y, lse, scratch);
}

void dt_nn_attn_backward(int B, int T, int C, int H, int ld, const float *q, const float *k,
                         const float *v, const float *y, const float *lse, const float *dy,
                         float *dq, float *dk, float *dv, float *scratch) {
    dt_k()->attn_bwd(B, T, C, H, ld, q, k, v, y, lse, dy, dq, dk, dv, scratch);
}

// ------------------------------------------------------------------------- bf16

static size_t tiles_of(int T) {
    return (size_t)(T + BLOCK - 1) / BLOCK * BLOCK;
}

bool dt_nn_attn16_ok(int C, int H) {
    return dt_c16_usable() && dt_k()->attn16_fwd && (C / H) % 16 == 0;
}

size_t dt_nn_attn16_scratch(int T, int d) {
    size_t tp = tiles_of(T), lay = tp * (size_t)d / 2; // one operand layout, floats
    return 9 * lay + 2 * BLOCK * BLOCK + 4 * (BLOCK * BLOCK / 2) + (size_t)BLOCK * d + 3 * BLOCK;
}

// The avx512bf16 target's rows (kernels/avx512bf16/attn16.c); elsewhere (never asked
// for: dt_nn_attn16_ok is false) the fp32 attention.
void dt_nn_attn16_forward(int B, int T, int C, int H, int ld, const float *q, const float *k,
                          const float *v, float *y, float *lse, float *scratch) {
    dt_k_attn_fwd_fn *f = dt_k()->attn16_fwd ? dt_k()->attn16_fwd : dt_k()->attn_fwd;
    f(B, T, C, H, ld, q, k, v, y, lse, scratch);
}

void dt_nn_attn16_backward(int B, int T, int C, int H, int ld, const float *q, const float *k,
                           const float *v, const float *y, const float *lse, const float *dy,
                           float *dq, float *dk, float *dv, float *scratch) {
    dt_k_attn_bwd_fn *f = dt_k()->attn16_bwd ? dt_k()->attn16_bwd : dt_k()->attn_bwd;
    f(B, T, C, H, ld, q, k, v, y, lse, dy, dq, dk, dv, scratch);
}
