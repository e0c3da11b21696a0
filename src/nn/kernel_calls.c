// kernel_calls.c: the entry points of nn_impl.h's shared kernels (im2col, the shifted
// GEMMs, the bias and gradient-shard loops), one line each into the kernel table
// (kernels/table.h), whose rows say which target's kernel runs.
#include "kernels/table.h"
#include "nn/nn_impl.h"

_Static_assert(NN_SHARD_ROWS == DT_KSHARD_ROWS && NN_SHARD_COLS == DT_KSHARD_COLS,
               "a shard tile is one block of the shifted GEMMs");

// The square-kernel form of the general im2col (ops.h's Conv2d geometry): the same rows
// and columns.
static dt_kconv square(int c, int k, int stride, int pad) {
    return (dt_kconv){.cin    = c,
                      .cout   = 1,
                      .kh     = k,
                      .kw     = k,
                      .sh     = stride,
                      .sw     = stride,
                      .ph     = pad,
                      .pw     = pad,
                      .groups = 1};
}

void dt_nn_im2col(const float *img, int c, int h, int w, int k, int stride, int pad, int ho, int wo,
                  float *col) {
    dt_kconv p = square(c, k, stride, pad);
    dt_k()->im2col(&p, img, h, w, ho, wo, col, (size_t)ho * wo);
}

void dt_nn_col2im(const float *col, int c, int h, int w, int k, int stride, int pad, int ho, int wo,
                  float *img) {
    dt_kconv p = square(c, k, stride, pad);
    dt_k()->col2im(&p, col, (size_t)ho * wo, h, w, ho, wo, img);
}

void dt_nn_shifted_gemm(const float *src, const int *off, int R, const float *w, int rows, int n,
                        float *out, size_t out_ld, bool add) {
    dt_k()->shifted_gemm(src, off, R, w, rows, n, out, out_ld, add);
}

void dt_nn_shifted_gemm_shards(const float *src, const int *off, const int *start, const int *len,
                               int S, const float *w, int rows, int n, float *tile, float *out,
                               size_t out_ld) {
    dt_k()->shifted_gemm_shards(src, off, start, len, S, w, rows, n, tile, out, out_ld);
}

void dt_nn_shifted_gemm_nt(const float *a, size_t a_ld, int rows, const float *src, const int *off,
                           int R, int n, float *dw) {
    dt_k()->shifted_gemm_nt(a, a_ld, rows, src, off, R, n, dw);
}

void dt_nn_shard_tree(float *buf, size_t ld, int shards, size_t n) {
    dt_k()->shard_tree(buf, ld, shards, n);
}

void dt_nn_relu_inplace(float *y, size_t n) {
    dt_k()->relu_fwd(n, y, y);
}

void dt_nn_relu_backward(const float *y, float *d, size_t n) {
    dt_k()->relu_grad(n, y, d, d);
}

void dt_nn_add_row_bias(float *y, const float *b, int rows, int cols) {
    dt_k()->add_row_bias(y, b, rows, cols);
}

void dt_nn_row_sums_add(const float *y, int rows, int cols, float *s) {
    dt_k()->row_sums_add(y, rows, cols, s);
}
