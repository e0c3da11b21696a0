// k_norm.cu: BatchNorm (with dt_graph_fuse's ReLU and residual forms) and LayerNorm,
// as ops_norm.c computes them: BatchNorm's statistics in double, two passes (the mean,
// then the squared deviations from it); LayerNorm's per row in float, two passes.
// Per-channel and per-column sums run in fixed orders (a block per channel; LayerNorm's
// parameter gradients summed over row chunks, then the chunks in order).
#include "cuda/k_common.cuh"

#define BN_THREADS 256
#define LN_CHUNK   64 // rows per partial sum of LayerNorm's parameter gradients

// The value at (sample i, position j) of channel ch of (n, c, l).
__device__ __forceinline__ size_t bn_at(const k_bn &b, int ch, size_t k) {
    size_t i = k / b.l, j = k % b.l;
    return (i * b.c + ch) * b.l + j;
}

// One block per channel: the statistics (training) or the running ones (evaluation).
__global__ void bn_stats_kernel(k_bn b, const float *x, float *rmean, float *rvar, float *mean,
                                float *invstd) {
    __shared__ double sh[32];
    int               ch = blockIdx.x;
    if (!b.training) {
        if (threadIdx.x == 0) {
            mean[ch]   = rmean[ch];
            invstd[ch] = (float)(1.0 / sqrt((double)rvar[ch] + b.eps));
        }
        return;
    }
    size_t m = (size_t)b.n * b.l;
    double s = 0.0;
    for (size_t k = threadIdx.x; k < m; k += blockDim.x)
        s += x[bn_at(b, ch, k)];
    s          = k_block_sum(s, sh);
    double mu  = s / (double)m;
    double dev = 0.0;
    for (size_t k = threadIdx.x; k < m; k += blockDim.x) {
        double d = (double)x[bn_at(b, ch, k)] - mu;
        dev += d * d;
    }
    dev = k_block_sum(dev, sh);
    if (threadIdx.x == 0) {
        double var = dev / (double)m, count = (double)m;
        mean[ch]   = (float)mu;
        invstd[ch] = (float)(1.0 / sqrt(var + b.eps));
        double unb = count > 1 ? var * count / (count - 1) : var;
        rmean[ch]  = (float)((1.0 - b.momentum) * rmean[ch] + b.momentum * mu);
        rvar[ch]   = (float)((1.0 - b.momentum) * rvar[ch] + b.momentum * unb);
    }
}

// y = x scale + shift (+ res) (ReLU), scale = invstd gamma, shift = beta - mean scale.
__global__ void bn_apply_kernel(k_bn b, const float *x, const float *gamma, const float *beta,
                                const float *res, const float *mean, const float *invstd,
                                float *y) {
    size_t total = (size_t)b.n * b.c * b.l;
    K_FOR(i, total) {
        int   ch    = (int)(i / b.l % b.c);
        float scale = invstd[ch] * (gamma ? gamma[ch] : 1.0f);
        float shift = (beta ? beta[ch] : 0.0f) - mean[ch] * scale;
        float v     = x[i] * scale + shift;
        if (b.residual)
            v += res[i];
        if (b.relu)
            v = v > 0.0f ? v : 0.0f;
        y[i] = v;
    }
}

// The gradient reaching the normalisation: dy, masked by the ReLU (y > 0) if fused.
__device__ __forceinline__ float bn_grad(const k_bn &b, const float *y, const float *dy, size_t i) {
    return b.relu && !(y[i] > 0.0f) ? 0.0f : dy[i];
}

// One block per channel: sum_dy and sum_dy xhat (into work: c, then c floats), and the
// parameter gradients.
__global__ void bn_grad_stats_kernel(k_bn b, const float *x, const float *y, const float *dy,
                                     const float *mean, const float *invstd, float *dgamma,
                                     float *dbeta, float *work) {
    __shared__ double sh[32];
    int               ch = blockIdx.x;
    size_t            m  = (size_t)b.n * b.l;
    double            sd = 0.0, sx = 0.0;
    float             mu = mean[ch], is = invstd[ch];
    for (size_t k = threadIdx.x; k < m; k += blockDim.x) {
        size_t i = bn_at(b, ch, k);
        float  g = bn_grad(b, y, dy, i);
        sd += g;
        sx += (double)g * ((x[i] - mu) * is);
    }
    sd = k_block_sum(sd, sh);
    sx = k_block_sum(sx, sh);
    if (threadIdx.x == 0) {
        work[ch]       = (float)sd;
        work[b.c + ch] = (float)sx;
        if (dgamma) {
            dgamma[ch] += (float)sx;
            dbeta[ch] += (float)sd;
        }
    }
}

// dx = gs (g - a - (x - mean) bb), a = sum_dy / count, bb = sum_dyx / count invstd
// (evaluation: dx = gs g); dres = g.
__global__ void bn_grad_apply_kernel(k_bn b, const float *x, const float *y, const float *dy,
                                     const float *gamma, const float *mean, const float *invstd,
                                     const float *work, float *dx, bool acc, float *dres,
                                     bool res_acc) {
    size_t total = (size_t)b.n * b.c * b.l;
    double count = b.training ? (double)b.n * b.l : 0.0;
    K_FOR(i, total) {
        int   ch = (int)(i / b.l % b.c);
        float g  = bn_grad(b, y, dy, i);
        if (dres)
            dres[i] = res_acc ? dres[i] + g : g;
        if (!dx)
            continue;
        float gs = invstd[ch] * (gamma ? gamma[ch] : 1.0f);
        float a  = count > 0 ? (float)(work[ch] / count) : 0.0f;
        float bb = count > 0 ? (float)(work[b.c + ch] / count) * invstd[ch] : 0.0f;
        float v  = gs * (g - a - (x[i] - mean[ch]) * bb);
        dx[i]    = acc ? dx[i] + v : v;
    }
}

// A warp per row.
__global__ void ln_forward_kernel(int rows, int d, float eps, const float *x, const float *gamma,
                                  const float *beta, float *y, float *mean, float *rstd) {
    int r = blockIdx.x * (K_THREADS / 32) + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (r >= rows)
        return;
    const float *xr = x + (size_t)r * d;
    float       *yr = y + (size_t)r * d;
    float        s  = 0.0f;
    for (int i = lane; i < d; i += 32)
        s += xr[i];
    float m = k_warp_sum(s) / (float)d, q = 0.0f;
    for (int i = lane; i < d; i += 32)
        q += (xr[i] - m) * (xr[i] - m);
    float rs = 1.0f / sqrtf(k_warp_sum(q) / (float)d + eps);
    if (lane == 0)
        mean[r] = m, rstd[r] = rs;
    for (int i = lane; i < d; i += 32) {
        float v = (xr[i] - m) * rs;
        yr[i]   = gamma ? v * gamma[i] + beta[i] : v;
    }
}

// dx = rs (g - mean(g) - xhat mean(g xhat)), g = dy gamma; a warp per row.
__global__ void ln_dx_kernel(int rows, int d, const float *x, const float *gamma, const float *mean,
                             const float *rstd, const float *dy, float *dx, bool acc) {
    int r = blockIdx.x * (K_THREADS / 32) + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (r >= rows)
        return;
    const float *xr = x + (size_t)r * d, *dr = dy + (size_t)r * d;
    float       *gr = dx + (size_t)r * d;
    float        m = mean[r], rs = rstd[r], a = 0.0f, b = 0.0f;
    for (int i = lane; i < d; i += 32) {
        float g = gamma ? dr[i] * gamma[i] : dr[i];
        a += g;
        b += g * ((xr[i] - m) * rs);
    }
    a = k_warp_sum(a) / (float)d;
    b = k_warp_sum(b) / (float)d;
    for (int i = lane; i < d; i += 32) {
        float xh = (xr[i] - m) * rs, g = gamma ? dr[i] * gamma[i] : dr[i];
        float v = rs * (g - a - xh * b);
        gr[i]   = acc ? gr[i] + v : v;
    }
}

// Partial column sums of dy xhat and dy over chunk blockIdx.y of LN_CHUNK rows.
__global__ void ln_dparam_kernel(int rows, int d, const float *x, const float *mean,
                                 const float *rstd, const float *dy, float *work) {
    int col = blockIdx.x * blockDim.x + threadIdx.x;
    if (col >= d)
        return;
    int   r0 = blockIdx.y * LN_CHUNK, r1 = r0 + LN_CHUNK < rows ? r0 + LN_CHUNK : rows;
    float sg = 0.0f, sb = 0.0f;
    for (int r = r0; r < r1; r++) {
        size_t i = (size_t)r * d + col;
        sg += dy[i] * ((x[i] - mean[r]) * rstd[r]);
        sb += dy[i];
    }
    float *w = work + (size_t)blockIdx.y * 2 * d;
    w[col] = sg, w[d + col] = sb;
}

__global__ void ln_dparam_sum_kernel(int d, int chunks, const float *work, float *dgamma,
                                     float *dbeta) {
    int col = blockIdx.x * blockDim.x + threadIdx.x;
    if (col >= d)
        return;
    float sg = 0.0f, sb = 0.0f;
    for (int c = 0; c < chunks; c++) {
        sg += work[(size_t)c * 2 * d + col];
        sb += work[(size_t)c * 2 * d + d + col];
    }
    dgamma[col] += sg;
    dbeta[col] += sb;
}

extern "C" {

cudaError_t k_bn_forward(cudaStream_t s, const k_bn *b, const float *x, const float *gamma,
                         const float *beta, const float *res, float *rmean, float *rvar,
                         float *mean, float *invstd, float *y) {
    bn_stats_kernel<<<(unsigned)b->c, BN_THREADS, 0, s>>>(*b, x, rmean, rvar, mean, invstd);
    size_t n = (size_t)b->n * b->c * b->l;
    bn_apply_kernel<<<k_blocks(n), K_THREADS, 0, s>>>(*b, x, gamma, beta, res, mean, invstd, y);
    K_DONE();
}

cudaError_t k_bn_backward(cudaStream_t s, const k_bn *b, const float *x, const float *y,
                          const float *dy, const float *gamma, const float *mean,
                          const float *invstd, float *dx, bool acc, float *dres, bool res_acc,
                          float *dgamma, float *dbeta, float *work) {
    bn_grad_stats_kernel<<<(unsigned)b->c, BN_THREADS, 0, s>>>(*b, x, y, dy, mean, invstd, dgamma,
                                                               dbeta, work);
    size_t n = (size_t)b->n * b->c * b->l;
    if (dx || dres)
        bn_grad_apply_kernel<<<k_blocks(n), K_THREADS, 0, s>>>(*b, x, y, dy, gamma, mean, invstd,
                                                               work, dx, acc, dres, res_acc);
    K_DONE();
}

size_t k_ln_work(int rows, int d) {
    return (size_t)((rows + LN_CHUNK - 1) / LN_CHUNK) * 2 * (size_t)d;
}

cudaError_t k_ln_forward(cudaStream_t s, int rows, int d, float eps, const float *x,
                         const float *gamma, const float *beta, float *y, float *mean,
                         float *rstd) {
    unsigned blocks = (unsigned)((rows + K_THREADS / 32 - 1) / (K_THREADS / 32));
    if (rows > 0)
        ln_forward_kernel<<<blocks, K_THREADS, 0, s>>>(rows, d, eps, x, gamma, beta, y, mean, rstd);
    K_DONE();
}

cudaError_t k_ln_backward(cudaStream_t s, int rows, int d, const float *x, const float *gamma,
                          const float *mean, const float *rstd, const float *dy, float *dx,
                          bool acc, float *dgamma, float *dbeta, float *work) {
    if (rows < 1)
        K_DONE();
    unsigned blocks = (unsigned)((rows + K_THREADS / 32 - 1) / (K_THREADS / 32));
    if (dx)
        ln_dx_kernel<<<blocks, K_THREADS, 0, s>>>(rows, d, x, gamma, mean, rstd, dy, dx, acc);
    if (dgamma) {
        int  chunks = (rows + LN_CHUNK - 1) / LN_CHUNK;
        dim3 grid((unsigned)((d + K_THREADS - 1) / K_THREADS), (unsigned)chunks);
        ln_dparam_kernel<<<grid, K_THREADS, 0, s>>>(rows, d, x, mean, rstd, dy, work);
        ln_dparam_sum_kernel<<<(unsigned)((d + K_THREADS - 1) / K_THREADS), K_THREADS, 0, s>>>(
            d, chunks, work, dgamma, dbeta);
    }
    K_DONE();
}

} // extern "C"
