// k_elem.cu: element-wise kernels (kernels.h): fills, copies, the activations and
// their gradients (the formulas of ops_act.c), bias rows and their sums, bf16.
#include "cuda/k_common.cuh"

#define SQRT_2_OVER_PI 0.7978845608028654f
#define INV_SQRT_2     0.7071067811865476f
#define INV_SQRT_2PI   0.3989422804014327f
#define GELU_CUBIC     0.044715f

__global__ void fill_kernel(float *y, float v, size_t n) {
    K_FOR(i, n) y[i] = v;
}

__global__ void copy_kernel(float *y, const float *x, size_t n, bool acc) {
    K_FOR(i, n) y[i] = acc ? y[i] + x[i] : x[i];
}

__global__ void add_kernel(float *y, const float *a, const float *b, size_t n) {
    K_FOR(i, n) y[i] = a[i] + b[i];
}

__global__ void scale_kernel(float *x, float f, size_t n) {
    K_FOR(i, n) x[i] *= f;
}

__device__ __forceinline__ float sigmoidf_(float x) {
    return 1.0f / (1.0f + expf(-x));
}

__global__ void act_forward_kernel(int act, const float *x, float *y, size_t n) {
    K_FOR(i, n) {
        float v = x[i], r;
        switch (act) {
        case K_RELU:
            r = v > 0.0f ? v : 0.0f;
            break;
        case K_GELU:
            r = 0.5f * v * (1.0f + erff(v * INV_SQRT_2));
            break;
        case K_GELU_TANH:
            r = 0.5f * v * (1.0f + tanhf(SQRT_2_OVER_PI * (v + GELU_CUBIC * v * v * v)));
            break;
        case K_TANH:
            r = tanhf(v);
            break;
        case K_SIGMOID:
            r = sigmoidf_(v);
            break;
        default: // K_SILU
            r = v * sigmoidf_(v);
            break;
        }
        y[i] = r;
    }
}

__global__ void act_backward_kernel(int act, const float *x, const float *y, const float *dy,
                                    float *dx, size_t n, bool acc) {
    K_FOR(i, n) {
        float g;
        switch (act) {
        case K_RELU:
            g = y[i] > 0.0f ? dy[i] : 0.0f;
            break;
        case K_GELU: {
            float v = x[i];
            float c = 0.5f * (1.0f + erff(v * INV_SQRT_2));
            g       = dy[i] * (c + v * INV_SQRT_2PI * expf(-0.5f * v * v));
            break;
        }
        case K_GELU_TANH: {
            float v = x[i], v2 = v * v;
            float t = tanhf(SQRT_2_OVER_PI * (v + GELU_CUBIC * v2 * v));
            g       = dy[i] * (0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * SQRT_2_OVER_PI *
                                                 (1.0f + 3.0f * GELU_CUBIC * v2));
            break;
        }
        case K_TANH:
            g = dy[i] * (1.0f - y[i] * y[i]);
            break;
        case K_SIGMOID:
            g = dy[i] * y[i] * (1.0f - y[i]);
            break;
        default: { // K_SILU
            float v = x[i], s = sigmoidf_(v);
            g = dy[i] * s * (1.0f + v * (1.0f - s));
            break;
        }
        }
        dx[i] = acc ? dx[i] + g : g;
    }
}

__global__ void bias_rows_kernel(float *y, const float *b, size_t rows, int cols) {
    K_FOR(i, rows * (size_t)cols) y[i] += b[i % (size_t)cols];
}

// Column sums: a block of 32 x 8 threads takes 32 columns; thread (c, r) sums rows
// r, r + 8, ... of its column, then the 8 partial sums are added in order of r.
__global__ void col_sums_kernel(const float *y, size_t rows, int cols, float *db) {
    __shared__ float part[8][33];
    int              c = blockIdx.x * 32 + threadIdx.x;
    float            s = 0.0f;
    if (c < cols)
        for (size_t r = threadIdx.y; r < rows; r += 8)
            s += y[r * (size_t)cols + c];
    part[threadIdx.y][threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.y == 0 && c < cols) {
        float t = 0.0f;
        for (int k = 0; k < 8; k++)
            t += part[k][threadIdx.x];
        db[c] += t;
    }
}

__global__ void row_sums_kernel(const float *y, size_t cols, float *db) {
    __shared__ float sh[32];
    const float     *row = y + (size_t)blockIdx.x * cols;
    float            s   = 0.0f;
    for (size_t i = threadIdx.x; i < cols; i += blockDim.x)
        s += row[i];
    s = k_block_sum(s, sh);
    if (threadIdx.x == 0)
        db[blockIdx.x] += s;
}

// Round to nearest even on the bits (NaN kept quiet), as dt_f32_to_bf16_1.
__global__ void to_bf16_kernel(const float *x, uint16_t *y, size_t n) {
    K_FOR(i, n) {
        uint32_t u = __float_as_uint(x[i]);
        if ((u & 0x7fffffffu) > 0x7f800000u)
            y[i] = (uint16_t)((u >> 16) | 0x40u);
        else
            y[i] = (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
    }
}

extern "C" {

cudaError_t k_fill(cudaStream_t s, float *y, float v, size_t n) {
    if (n)
        fill_kernel<<<k_blocks(n), K_THREADS, 0, s>>>(y, v, n);
    K_DONE();
}

cudaError_t k_copy(cudaStream_t s, float *y, const float *x, size_t n, bool acc) {
    if (n)
        copy_kernel<<<k_blocks(n), K_THREADS, 0, s>>>(y, x, n, acc);
    K_DONE();
}

cudaError_t k_add(cudaStream_t s, float *y, const float *a, const float *b, size_t n) {
    if (n)
        add_kernel<<<k_blocks(n), K_THREADS, 0, s>>>(y, a, b, n);
    K_DONE();
}

cudaError_t k_scale(cudaStream_t s, float *x, float f, size_t n) {
    if (n)
        scale_kernel<<<k_blocks(n), K_THREADS, 0, s>>>(x, f, n);
    K_DONE();
}

cudaError_t k_act_forward(cudaStream_t s, int act, const float *x, float *y, size_t n) {
    if (n)
        act_forward_kernel<<<k_blocks(n), K_THREADS, 0, s>>>(act, x, y, n);
    K_DONE();
}

cudaError_t k_act_backward(cudaStream_t s, int act, const float *x, const float *y, const float *dy,
                           float *dx, size_t n, bool acc) {
    if (n)
        act_backward_kernel<<<k_blocks(n), K_THREADS, 0, s>>>(act, x, y, dy, dx, n, acc);
    K_DONE();
}

cudaError_t k_bias_rows(cudaStream_t s, float *y, const float *b, size_t rows, int cols) {
    size_t n = rows * (size_t)cols;
    if (n)
        bias_rows_kernel<<<k_blocks(n), K_THREADS, 0, s>>>(y, b, rows, cols);
    K_DONE();
}

cudaError_t k_col_sums(cudaStream_t s, const float *y, size_t rows, int cols, float *db) {
    if (rows && cols)
        col_sums_kernel<<<(unsigned)((cols + 31) / 32), dim3(32, 8), 0, s>>>(y, rows, cols, db);
    K_DONE();
}

cudaError_t k_row_sums(cudaStream_t s, const float *y, int rows, size_t cols, float *db) {
    if (rows && cols)
        row_sums_kernel<<<(unsigned)rows, K_THREADS, 0, s>>>(y, cols, db);
    K_DONE();
}

cudaError_t k_to_bf16(cudaStream_t s, const float *x, uint16_t *y, size_t n) {
    if (n)
        to_bf16_kernel<<<k_blocks(n), K_THREADS, 0, s>>>(x, y, n);
    K_DONE();
}

} // extern "C"
