// ops_act.c: element-wise activations, softmax over the last dimension, the residual
// add and Embedding (ops.h). The loops are rows of the kernel table (kernels/vec/act.c);
// these are their entry points.
#include "kernels/table.h"
#include "nn/ops.h"

#include <string.h>

void dt_nn_gelu_forward(size_t n, bool tanh_approx, const float *x, float *y) {
    dt_k()->gelu_fwd(n, tanh_approx, x, y);
}
void dt_nn_gelu_backward(size_t n, bool tanh_approx, const float *x, const float *dy, float *dx) {
    dt_k()->gelu_bwd(n, tanh_approx, x, dy, dx);
}
void dt_nn_relu_forward(size_t n, const float *x, float *y) {
    dt_k()->relu_fwd(n, x, y);
}
void dt_nn_relu_grad(size_t n, const float *y, const float *dy, float *dx) {
    dt_k()->relu_grad(n, y, dy, dx);
}
void dt_nn_tanh_forward(size_t n, const float *x, float *y) {
    dt_k()->tanh_fwd(n, x, y);
}
void dt_nn_tanh_backward(size_t n, const float *y, const float *dy, float *dx) {
    dt_k()->tanh_bwd(n, y, dy, dx);
}
void dt_nn_sigmoid_forward(size_t n, const float *x, float *y) {
    dt_k()->sigmoid_fwd(n, x, y);
}
void dt_nn_sigmoid_backward(size_t n, const float *y, const float *dy, float *dx) {
    dt_k()->sigmoid_bwd(n, y, dy, dx);
}
void dt_nn_silu_forward(size_t n, const float *x, float *y) {
    dt_k()->silu_fwd(n, x, y);
}
void dt_nn_silu_backward(size_t n, const float *x, const float *dy, float *dx) {
    dt_k()->silu_bwd(n, x, dy, dx);
}
void dt_nn_softmax_forward(int rows, int d, const float *x, float *y) {
    dt_k()->softmax_fwd(rows, d, x, y);
}
void dt_nn_softmax_backward(int rows, int d, const float *y, const float *dy, float *dx) {
    dt_k()->softmax_bwd(rows, d, y, dy, dx);
}
void dt_nn_add_forward(size_t n, const float *a, const float *b, float *y) {
    dt_k()->add(n, a, b, y);
}
void dt_nn_accumulate(size_t n, const float *src, float *dst) {
    dt_k()->accumulate(n, src, dst);
}

// --------------------------------------------------------------------------- Embedding

void dt_nn_embedding_init(int num, int d, dt_rng *rng, float *w) {
    for (size_t i = 0; i < (size_t)num * d; i++)
        w[i] = dt_rng_normal(rng);
}

dt_status dt_nn_embedding_forward(int count, int num, int d, const int32_t *idx, const float *w,
                                  float *y) {
    for (int i = 0; i < count; i++) {
        if (idx[i] < 0 || idx[i] >= num)
            return dt_fail(DT_ERR_ARG, "embedding: index %d at position %d, expected 0 to %d",
                           (int)idx[i], i, num - 1);
        memcpy(y + (size_t)i * d, w + (size_t)idx[i] * d, sizeof(float) * (size_t)d);
    }
    return DT_OK;
}

void dt_nn_embedding_backward(int count, int d, const int32_t *idx, const float *dy, float *dw) {
    dt_k()->embedding_bwd(count, d, idx, dy, dw);
}
