// k_loss.cu: softmax and log-softmax over rows, and the losses (kernels.h), with the
// formulas of ops_act.c, activation.c, loss.c and ops_loss.c. A warp takes a row; the
// loss's mean is a per-row value summed in double by one block in a fixed order.
#include "cuda/k_common.cuh"

#define ROWS_PER_BLOCK (K_THREADS / 32)

static unsigned row_blocks(int rows) {
    return (unsigned)((rows + ROWS_PER_BLOCK - 1) / ROWS_PER_BLOCK);
}

__global__ void softmax_forward_kernel(bool log, int rows, int d, const float *x, float *y) {
    int r    = blockIdx.x * ROWS_PER_BLOCK + (threadIdx.x >> 5);
    int lane = threadIdx.x & 31;
    if (r >= rows)
        return;
    const float *xr = x + (size_t)r * d;
    float       *yr = y + (size_t)r * d;
    float        m  = -INFINITY;
    for (int i = lane; i < d; i += 32)
        m = fmaxf(m, xr[i]);
    m        = k_warp_max(m);
    double z = 0.0;
    for (int i = lane; i < d; i += 32)
        z += (double)expf(xr[i] - m);
    z = k_warp_sum_d(z);
    if (log) {
        float lse = m + (float)::log(z);
        for (int i = lane; i < d; i += 32)
            yr[i] = xr[i] - lse;
    } else {
        float inv = (float)(1.0 / z);
        for (int i = lane; i < d; i += 32)
            yr[i] = expf(xr[i] - m) * inv;
    }
}

__global__ void softmax_backward_kernel(bool log, int rows, int d, const float *y, const float *dy,
                                        float *dx, bool acc) {
    int r    = blockIdx.x * ROWS_PER_BLOCK + (threadIdx.x >> 5);
    int lane = threadIdx.x & 31;
    if (r >= rows)
        return;
    const float *yr = y + (size_t)r * d, *gr = dy + (size_t)r * d;
    float       *xr = dx + (size_t)r * d;
    float        s  = 0.0f;
    for (int i = lane; i < d; i += 32)
        s += log ? gr[i] : gr[i] * yr[i];
    s = k_warp_sum(s);
    for (int i = lane; i < d; i += 32) {
        float g = log ? gr[i] - expf(yr[i]) * s : yr[i] * (gr[i] - s);
        xr[i]   = acc ? xr[i] + g : g;
    }
}

// *loss = (sum of work[0..n)) * (mul ? *mul : 1) / div, in one block's fixed order.
__global__ void finish_kernel(const double *work, size_t n, const double *mul, double div,
                              float *loss) {
    __shared__ double sh[32];
    double            s = 0.0;
    for (size_t i = threadIdx.x; i < n; i += blockDim.x)
        s += work[i];
    s = k_block_sum(s, sh);
    if (threadIdx.x == 0)
        *loss = (float)(s * (mul ? *mul : 1.0) / div);
}

// NLL: row r's loss -logp[t], its gradient -scale / rows at the target.
__global__ void nll_kernel(int rows, int k, const float *logp, const int32_t *t, float scale,
                           float *dx, double *work) {
    K_FOR(r, (size_t)rows) {
        float *d = dx + r * k;
        for (int j = 0; j < k; j++)
            d[j] = 0.0f;
        d[t[r]] = -scale / (float)rows;
        work[r] = -(double)logp[r * k + t[r]];
    }
}

// Cross-entropy, first the rows that count (1 / their number into *inv; 0 when none).
__global__ void ce_count_kernel(int rows, const int32_t *t, int ignore, double *inv) {
    __shared__ double sh[32];
    double            c = 0.0;
    for (int r = threadIdx.x; r < rows; r += blockDim.x)
        c += t[r] != ignore ? 1.0 : 0.0;
    c = k_block_sum(c, sh);
    if (threadIdx.x == 0)
        *inv = c > 0.0 ? 1.0 / c : 0.0;
}

// Then a warp per row: (1 - ls) (lse - x[t]) + ls/k (k lse - sum x) into work[r], and
// the gradient (softmax - ls/k) inv scale, minus (1 - ls) inv scale at the target.
__global__ void ce_rows_kernel(int rows, int k, const float *x, const int32_t *t, int ignore,
                               float ls, float scale, const double *inv_p, float *dx,
                               double *work) {
    int r    = blockIdx.x * ROWS_PER_BLOCK + (threadIdx.x >> 5);
    int lane = threadIdx.x & 31;
    if (r >= rows)
        return;
    const float *xr = x + (size_t)r * k;
    float       *dr = dx + (size_t)r * k;
    if (t[r] == ignore) {
        for (int i = lane; i < k; i += 32)
            dr[i] = 0.0f;
        if (lane == 0)
            work[r] = 0.0;
        return;
    }
    float m = -INFINITY;
    for (int i = lane; i < k; i += 32)
        m = fmaxf(m, xr[i]);
    m        = k_warp_max(m);
    double z = 0.0, sx = 0.0;
    for (int i = lane; i < k; i += 32) {
        z += (double)expf(xr[i] - m);
        sx += xr[i];
    }
    z          = k_warp_sum_d(z);
    sx         = k_warp_sum_d(sx);
    double lse = (double)m + ::log(z), inv = *inv_p, lsd = ls;
    if (lane == 0)
        work[r] = (1.0 - lsd) * (lse - xr[t[r]]) + (ls > 0.0f ? lsd / k * (k * lse - sx) : 0.0);
    float flse = (float)lse, smooth = (float)(lsd / k), finv = (float)inv;
    float hot = (float)((1.0 - lsd) * inv);
    for (int i = lane; i < k; i += 32) {
        float g = (expf(xr[i] - flse) - smooth) * finv;
        if (i == t[r])
            g -= hot;
        dr[i] = g * scale;
    }
}

// MSE: per-block partial sums of (x - t)^2 into work[block]; gradient 2 (x - t) / n.
#define MSE_BLOCKS 256
__global__ void mse_kernel(size_t n, const float *x, const float *t, float scale, float *dx,
                           double *work) {
    __shared__ double sh[32];
    double            s = 0.0;
    K_FOR(i, n) {
        double d = (double)x[i] - t[i];
        s += d * d;
        dx[i] = (float)(2.0 * d / (double)n) * scale;
    }
    s = k_block_sum(s, sh);
    if (threadIdx.x == 0)
        work[blockIdx.x] = s;
}

extern "C" {

size_t k_loss_work(size_t rows) {
    return (rows > MSE_BLOCKS ? rows : MSE_BLOCKS) + 1;
}

cudaError_t k_softmax_forward(cudaStream_t s, bool log, int rows, int d, const float *x, float *y) {
    if (rows > 0)
        softmax_forward_kernel<<<row_blocks(rows), K_THREADS, 0, s>>>(log, rows, d, x, y);
    K_DONE();
}

cudaError_t k_softmax_backward(cudaStream_t s, bool log, int rows, int d, const float *y,
                               const float *dy, float *dx, bool acc) {
    if (rows > 0)
        softmax_backward_kernel<<<row_blocks(rows), K_THREADS, 0, s>>>(log, rows, d, y, dy, dx,
                                                                       acc);
    K_DONE();
}

cudaError_t k_nll_loss(cudaStream_t s, int rows, int k, const float *logp, const int32_t *t,
                       float scale, float *dx, float *loss, double *work) {
    if (rows < 1)
        return cudaErrorInvalidValue;
    nll_kernel<<<k_blocks((size_t)rows), K_THREADS, 0, s>>>(rows, k, logp, t, scale, dx, work);
    finish_kernel<<<1, 1024, 0, s>>>(work, (size_t)rows, NULL, (double)rows, loss);
    K_DONE();
}

cudaError_t k_cross_entropy(cudaStream_t s, int rows, int k, const float *x, const int32_t *t,
                            int ignore, float smoothing, float scale, float *dx, float *loss,
                            double *work) {
    if (rows < 1)
        return cudaErrorInvalidValue;
    double *inv = work + rows;
    ce_count_kernel<<<1, 1024, 0, s>>>(rows, t, ignore, inv);
    ce_rows_kernel<<<row_blocks(rows), K_THREADS, 0, s>>>(rows, k, x, t, ignore, smoothing, scale,
                                                          inv, dx, work);
    finish_kernel<<<1, 1024, 0, s>>>(work, (size_t)rows, inv, 1.0, loss);
    K_DONE();
}

cudaError_t k_mse_loss(cudaStream_t s, size_t n, const float *x, const float *t, float scale,
                       float *dx, float *loss, double *work) {
    if (n < 1)
        return cudaErrorInvalidValue;
    mse_kernel<<<MSE_BLOCKS, K_THREADS, 0, s>>>(n, x, t, scale, dx, work);
    finish_kernel<<<1, 1024, 0, s>>>(work, MSE_BLOCKS, NULL, (double)n, loss);
    K_DONE();
}

} // extern "C"
