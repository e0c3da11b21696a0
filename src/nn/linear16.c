// linear16.c: torch.nn.Linear with bf16 operands (autocast), keeping bf16 copies of the
// activations that the products share, so that each is rounded once (ops.h).
//
// Forward rounds x into x16 (the layer's 16-bit saved state, dt_layer_args.saved16) in
// one vectorised pass, and y = x16 W16^T + b reads it; backward reuses x16 for the
// weight gradient instead of rounding x again. The output gradient is rounded once per
// chunk of rows into dy16 (scratch) and read by both products of that chunk,
// dW += dy16^T x16 and dx = dy16 W16. Where the fp32 operands were rounded as the GEMM
// packed them, every product rounded its own operands again (in the GPT, x twice and
// dy twice per layer and step); the numbers are the same (round to nearest even either
// way). Products run on the current bf16 GEMM path (gemm16.c), the fp32 fallback
// included; bias and its gradient stay fp32.
#include "nn/ops.h"
#include "nn/prec.h"

#include <string.h>

dt_status dt_nn_linear16_forward(const uint16_t *w16, int n, int in, int out, const float *x,
                                 uint16_t *x16, const float *b, float *y) {
    if (n < 1)
        return DT_OK;
    dt_f32_to_bf16(x, x16, (size_t)n * (size_t)in);
    // y (n, out) = x16 (n, in) W16^T (in, out) + b, the sums starting from the bias
    return dt_gemm_bf16_bias(false, true, n, out, in, x16, in, w16, in, b, y, out);
}

dt_status dt_nn_linear16_backward(const uint16_t *w16, int n, int in, int out, const uint16_t *x16,
                                  const float *dy, uint16_t *dy16, int chunk, float *dx, float *dw,
                                  float *db) {
    if (n < 1)
        return DT_OK;
    // the bias gradient's sums ride along with the rounding of dy (one pass over it)
    // when they fit here, else they take a pass of their own
    double acc[1024], *sums = db && out <= 1024 ? acc : NULL;
    if (sums)
        memset(acc, 0, sizeof(double) * (size_t)out);
    else if (db)
        dt_nn_linear_bias_grad(n, out, dy, db);
    for (int r0 = 0; r0 < n; r0 += chunk) {
        int rows = n - r0 < chunk ? n - r0 : chunk;
        dt_k()->bf16_round_sum(dy + (size_t)r0 * out, rows, out, dy16, sums);
        // dW (out, in) += dy16^T (out, rows) x16 (rows, in)
        DT_TRY(dt_gemm_bf16(true, false, out, in, rows, dy16, out, x16 + (size_t)r0 * in, in, dw,
                            in, true));
        if (dx) // dx (rows, in) = dy16 (rows, out) W16 (out, in)
            DT_TRY(dt_gemm_bf16(false, false, rows, in, out, dy16, out, w16, in,
                                dx + (size_t)r0 * in, in, false));
    }
    for (int o = 0; sums && o < out; o++)
        db[o] += (float)acc[o];
    return DT_OK;
}
