// k_embed.cu: Embedding (ops.h's dt_nn_embedding_*). Backward is deterministic without
// atomics: a block per row of the table scans the indices in order and adds the rows
// of dy that look it up, so each row's gradient is summed in the order of the
// positions, as the CPU's loop adds them. It reads every index once per table row:
// O(num x count) comparisons, fine for a byte-level GPT's 256 rows (a large vocabulary
// would want the positions sorted by row first).
#include "cuda/k_common.cuh"

#define EMB_STAGE 1024

__global__ void embed_forward_kernel(size_t count, int d, const int32_t *idx, const float *w,
                                     float *y) {
    K_FOR(i, count * (size_t)d) {
        size_t r = i / d;
        y[i]     = w[(size_t)idx[r] * d + i % d];
    }
}

__global__ void embed_backward_kernel(size_t count, int d, const int32_t *idx, const float *dy,
                                      float *dw) {
    __shared__ int32_t stage[EMB_STAGE];
    int                row = blockIdx.x;
    for (int c0 = 0; c0 < d; c0 += blockDim.x) {
        int   c = c0 + threadIdx.x;
        float g = 0.0f;
        for (size_t i0 = 0; i0 < count; i0 += EMB_STAGE) {
            size_t len = count - i0 < EMB_STAGE ? count - i0 : EMB_STAGE;
            __syncthreads();
            for (size_t k = threadIdx.x; k < len; k += blockDim.x)
                stage[k] = idx[i0 + k];
            __syncthreads();
            if (c < d)
                for (size_t k = 0; k < len; k++)
                    if (stage[k] == row)
                        g += dy[(i0 + k) * d + c];
        }
        if (c < d)
            dw[(size_t)row * d + c] += g;
    }
}

extern "C" {

cudaError_t k_embed_forward(cudaStream_t s, size_t count, int d, const int32_t *idx, const float *w,
                            float *y) {
    size_t n = count * (size_t)d;
    if (n)
        embed_forward_kernel<<<k_blocks(n), K_THREADS, 0, s>>>(count, d, idx, w, y);
    K_DONE();
}

cudaError_t k_embed_backward(cudaStream_t s, size_t count, int num, int d, const int32_t *idx,
                             const float *dy, float *dw) {
    int threads = d < K_THREADS ? ((d + 31) / 32) * 32 : K_THREADS;
    if (count && num > 0)
        embed_backward_kernel<<<(unsigned)num, threads, 0, s>>>(count, d, idx, dy, dw);
    K_DONE();
}

} // extern "C"
