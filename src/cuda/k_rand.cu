// k_rand.cu: dropout masks drawn from the CPU's streams (rng.h): the same Philox4x32-10,
// the same splitting of keys, the same counter walk, so a GPU step and a CPU step drop
// the same units. Word i of a stream is word i % 4 of the block at counter i / 4 (the
// CPU refills four words at a time from a counter starting at 0).
#include "cuda/k_common.cuh"

__device__ __forceinline__ uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

// dt_rng_split(parent, id) as a 64-bit key (key[0] | key[1] << 32).
__device__ __forceinline__ uint64_t split_key(uint64_t parent, uint64_t id) {
    uint64_t c = mix64(parent + 0x9E3779B97F4A7C15ull) ^ mix64(id ^ 0xD1B54A32D192ED03ull);
    return mix64(c);
}

// Word `i` of the stream with key `key` (dt_rng_u32 called i + 1 times).
__device__ __forceinline__ uint32_t philox_word(uint64_t key, uint64_t i) {
    uint64_t blk = i >> 2;
    uint32_t c0 = (uint32_t)blk, c1 = (uint32_t)(blk >> 32), c2 = 0, c3 = 0;
    uint32_t k0 = (uint32_t)key, k1 = (uint32_t)(key >> 32);
    for (int round = 0; round < 10; round++) {
        uint32_t lo0 = 0xD2511F53u * c0, hi0 = __umulhi(0xD2511F53u, c0);
        uint32_t lo1 = 0xCD9E8D57u * c2, hi1 = __umulhi(0xCD9E8D57u, c2);
        uint32_t n0 = hi1 ^ c1 ^ k0, n2 = hi0 ^ c3 ^ k1;
        c0 = n0, c1 = lo1, c2 = n2, c3 = lo0;
        k0 += 0x9E3779B9u;
        k1 += 0xBB67AE85u;
    }
    switch (i & 3) {
    case 0:
        return c0;
    case 1:
        return c1;
    case 2:
        return c2;
    default:
        return c3;
    }
}

// One thread per (sample, unit): the unit's factor, then its `per` values.
__global__ void dropout_forward_kernel(const uint64_t *node_key, const uint64_t *keys, int n,
                                       size_t units, size_t per, float p, const float *x, float *y,
                                       float *mask) {
    float scale = 1.0f / (1.0f - p);
    K_FOR(idx, (size_t)n * units) {
        size_t   s = idx / units, u = idx % units;
        uint64_t key = split_key(*node_key, keys ? keys[s] : (uint64_t)s);
        float    uni = (float)(philox_word(key, u) >> 8) * 0x1.0p-24f;
        float    m   = uni >= p ? scale : 0.0f;
        mask[idx]    = m;
        for (size_t e = 0; e < per; e++)
            y[idx * per + e] = x[idx * per + e] * m;
    }
}

__global__ void dropout_backward_kernel(size_t total, size_t per, const float *mask,
                                        const float *dy, float *dx, bool acc) {
    K_FOR(i, total) {
        float g = dy[i] * mask[i / per];
        dx[i]   = acc ? dx[i] + g : g;
    }
}

__global__ void split_keys_kernel(const uint64_t *node_key, const uint64_t *keys, int n,
                                  uint64_t *out) {
    K_FOR(s, (size_t)n) out[s] = split_key(*node_key, keys ? keys[s] : (uint64_t)s);
}

extern "C" {

cudaError_t k_dropout_forward(cudaStream_t s, const uint64_t *node_key, const uint64_t *keys, int n,
                              size_t units, size_t per, float p, const float *x, float *y,
                              float *mask) {
    size_t t = (size_t)n * units;
    if (t)
        dropout_forward_kernel<<<k_blocks(t), K_THREADS, 0, s>>>(node_key, keys, n, units, per, p,
                                                                 x, y, mask);
    K_DONE();
}

cudaError_t k_dropout_backward(cudaStream_t s, int n, size_t units, size_t per, const float *mask,
                               const float *dy, float *dx, bool acc) {
    size_t t = (size_t)n * units * per;
    if (t)
        dropout_backward_kernel<<<k_blocks(t), K_THREADS, 0, s>>>(t, per, mask, dy, dx, acc);
    K_DONE();
}

cudaError_t k_split_keys(cudaStream_t s, const uint64_t *node_key, const uint64_t *keys, int n,
                         uint64_t *out) {
    if (n > 0)
        split_keys_kernel<<<k_blocks((size_t)n), K_THREADS, 0, s>>>(node_key, keys, n, out);
    K_DONE();
}

} // extern "C"
