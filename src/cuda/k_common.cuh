// k_common.cuh: what the kernel files share: launch shapes, grid-stride loops, the
// warp and block reductions (fixed orders: a block's partial sums are combined by the
// same tree every time, so results do not depend on timing).
#ifndef DTRAIN_CUDA_K_COMMON_CUH
#define DTRAIN_CUDA_K_COMMON_CUH

#include "cuda/kernels.h"

#include <cuda_runtime.h>
#include <stdint.h>

#define K_THREADS 256

// Blocks for n items at K_THREADS a block, capped (the kernels loop over the rest).
static inline unsigned k_blocks(size_t n) {
    size_t b = (n + K_THREADS - 1) / K_THREADS;
    return (unsigned)(b < 1 ? 1 : b > (1u << 20) ? (1u << 20) : b);
}

#define K_FOR(i, n)                                                                                \
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n);                        \
         i += (size_t)gridDim.x * blockDim.x)

#define K_DONE() return cudaGetLastError()

__device__ __forceinline__ float k_warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ double k_warp_sum_d(double v) {
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ float k_warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1)
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// The sum of v over the block (blockDim.x a multiple of 32, at most 1024), on every
// thread. sh: 32 values of shared memory. Ends with a barrier, so sh can be reused.
template <typename T> __device__ __forceinline__ T k_block_sum(T v, T *sh) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    if (lane == 0)
        sh[warp] = v;
    __syncthreads();
    T t = lane < nw ? sh[lane] : (T)0;
    for (int o = 16; o > 0; o >>= 1)
        t += __shfl_xor_sync(0xffffffffu, t, o);
    __syncthreads();
    return t;
}
__device__ __forceinline__ float k_block_max(float v, float *sh) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = k_warp_max(v);
    if (lane == 0)
        sh[warp] = v;
    __syncthreads();
    float t = lane < nw ? sh[lane] : -INFINITY;
    t       = k_warp_max(t);
    __syncthreads();
    return t;
}

#endif
