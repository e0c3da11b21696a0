// k_optim.cu: the optimizers' element-wise updates in the order of operations of
// src/optim (sgd.c, adam.c, adadelta.c: PyTorch's), one thread per parameter, and the
// sum of squares for gradient norms (blocks' partial sums in double, added in order).
#include "cuda/k_common.cuh"

#define SUMSQ_BLOCKS 512

__global__ void sgd_kernel(float *p, const float *g, float *buf, size_t n, float lr, float wd,
                           float mu, float one_minus_damp, bool nesterov, bool first) {
    K_FOR(i, n) {
        float gi = wd != 0.0f ? g[i] + wd * p[i] : g[i];
        if (buf) { // momentum; PyTorch's buffer starts as the first gradient
            float bi = first ? gi : mu * buf[i] + one_minus_damp * gi;
            buf[i]   = bi;
            gi       = nesterov ? gi + mu * bi : bi;
        }
        p[i] = p[i] - lr * gi;
    }
}

__global__ void adam_kernel(float *p, const float *g, float *m, float *v, float *vmax, size_t n,
                            float wd, float b1, float b2, float eps, float step_size,
                            float bc2_sqrt, float decay) {
    float c1 = 1.0f - b1, c2 = 1.0f - b2;
    K_FOR(i, n) {
        float gi = wd != 0.0f ? g[i] + wd * p[i] : g[i];
        float mi = b1 * m[i] + c1 * gi;
        float vi = b2 * v[i] + c2 * gi * gi;
        m[i]     = mi;
        v[i]     = vi;
        if (vmax) {
            vi      = vmax[i] > vi ? vmax[i] : vi;
            vmax[i] = vi;
        }
        float denom = sqrtf(vi) / bc2_sqrt + eps;
        p[i]        = p[i] * decay - step_size * (mi / denom);
    }
}

__global__ void adadelta_kernel(float *p, const float *g, float *sq, float *acc, size_t n, float lr,
                                float wd, float rho, float eps) {
    float c = 1.0f - rho;
    K_FOR(i, n) {
        float gi    = wd != 0.0f ? g[i] + wd * p[i] : g[i];
        float si    = rho * sq[i] + c * gi * gi;
        sq[i]       = si;
        float delta = sqrtf(acc[i] + eps) / sqrtf(si + eps) * gi;
        acc[i]      = rho * acc[i] + c * delta * delta;
        p[i]        = p[i] - lr * delta;
    }
}

__global__ void sumsq_kernel(const float *x, size_t n, double *work) {
    __shared__ double sh[32];
    double            s = 0.0;
    K_FOR(i, n) s += (double)x[i] * x[i];
    s = k_block_sum(s, sh);
    if (threadIdx.x == 0)
        work[blockIdx.x] = s;
}

__global__ void sumsq_finish_kernel(const double *work, double *sum) {
    __shared__ double sh[32];
    double            s = 0.0;
    for (int i = threadIdx.x; i < SUMSQ_BLOCKS; i += blockDim.x)
        s += work[i];
    s = k_block_sum(s, sh);
    if (threadIdx.x == 0)
        *sum += s;
}

extern "C" {

cudaError_t k_sgd(cudaStream_t s, float *p, const float *g, float *buf, size_t n, float lr,
                  float wd, float momentum, float dampening, bool nesterov, bool first) {
    if (n)
        sgd_kernel<<<k_blocks(n), K_THREADS, 0, s>>>(p, g, buf, n, lr, wd, momentum,
                                                     1.0f - dampening, nesterov, first);
    K_DONE();
}

cudaError_t k_adam(cudaStream_t s, float *p, const float *g, float *m, float *v, float *vmax,
                   size_t n, float wd, float b1, float b2, float eps, float step_size,
                   float bc2_sqrt, float decay) {
    if (n)
        adam_kernel<<<k_blocks(n), K_THREADS, 0, s>>>(p, g, m, v, vmax, n, wd, b1, b2, eps,
                                                      step_size, bc2_sqrt, decay);
    K_DONE();
}

cudaError_t k_adadelta(cudaStream_t s, float *p, const float *g, float *sq, float *acc, size_t n,
                       float lr, float wd, float rho, float eps) {
    if (n)
        adadelta_kernel<<<k_blocks(n), K_THREADS, 0, s>>>(p, g, sq, acc, n, lr, wd, rho, eps);
    K_DONE();
}

size_t k_sumsq_work(void) {
    return SUMSQ_BLOCKS;
}

cudaError_t k_sumsq(cudaStream_t s, const float *x, size_t n, double *sum, double *work) {
    if (!n)
        K_DONE();
    sumsq_kernel<<<SUMSQ_BLOCKS, K_THREADS, 0, s>>>(x, n, work);
    sumsq_finish_kernel<<<1, K_THREADS, 0, s>>>(work, sum);
    K_DONE();
}

} // extern "C"
