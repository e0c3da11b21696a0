// k_attn.cu: causal multi-head attention on packed q|k|v rows (kernels.h), the
// computation of ops.h's dt_nn_attn_* (flash attention: the T x T scores are never
// stored). A block takes 8 rows of one (sample, head), a warp per row; keys (or
// queries) come through shared memory 32 at a time, lane j taking the tile's j-th, so
// a score is one lane's dot product and the tile's softmax update two warp reductions.
//
// Backward recomputes the probabilities from the saved log-sum-exp and runs twice:
// once over query rows (dq), once over key rows (dk, dv), so that every gradient row
// is summed by one warp in a fixed order (no atomics; deterministic).
#include "cuda/k_common.cuh"

#define ROWS 8  // rows of a block, one per warp
#define TILE 32 // keys (queries) per shared tile
#define MAXC 4  // components of a head a lane holds: d <= 128

struct attn_dims {
    int   B, T, C, H, d;
    float scale;
};

static attn_dims dims_of(int B, int T, int C, int H) {
    attn_dims a = {B, T, C, H, C / H, 0.0f};
    a.scale     = 1.0f / sqrtf((float)a.d);
    return a;
}

// Row t of sample b, head h: q, k or v (which = 0, 1, 2).
__device__ __forceinline__ size_t at(const attn_dims &a, int b, int t, int h, int which) {
    return ((size_t)b * a.T + t) * 3 * a.C + (size_t)which * a.C + (size_t)h * a.d;
}

// Loads rows [r0, r0 + TILE) of q, k or v (zeros past T) into sh (row stride d + 1).
__device__ __forceinline__ void load_tile(const attn_dims &a, const float *qkv, int b, int h,
                                          int which, int r0, float *sh) {
    for (int i = threadIdx.x; i < TILE * a.d; i += blockDim.x) {
        int r = i / a.d, c = i % a.d, t = r0 + r;
        sh[r * (a.d + 1) + c] = t < a.T ? qkv[at(a, b, t, h, which) + c] : 0.0f;
    }
}

__global__ void attn_forward_kernel(attn_dims a, const float *qkv, float *y, float *lse) {
    extern __shared__ float sm[];
    int                     d = a.d, w = threadIdx.x >> 5, lane = threadIdx.x & 31;
    float                  *ks = sm, *vs = ks + TILE * (d + 1), *qs = vs + TILE * (d + 1) + w * d;
    int                     b = blockIdx.y / a.H, h = blockIdx.y % a.H, t = blockIdx.x * ROWS + w;
    int                     tmax = min(a.T - 1, (int)blockIdx.x * ROWS + ROWS - 1);
    if (t < a.T)
        for (int c = lane; c < d; c += 32)
            qs[c] = qkv[at(a, b, t, h, 0) + c];
    float o[MAXC] = {0, 0, 0, 0}, m = -INFINITY, l = 0.0f;
    for (int s0 = 0; s0 <= tmax; s0 += TILE) {
        __syncthreads();
        load_tile(a, qkv, b, h, 1, s0, ks);
        load_tile(a, qkv, b, h, 2, s0, vs);
        __syncthreads();
        if (t >= a.T || s0 > t)
            continue;
        int   s  = s0 + lane;
        float sc = -INFINITY;
        if (s <= t) {
            float dot = 0.0f;
            for (int c = 0; c < d; c++)
                dot += qs[c] * ks[lane * (d + 1) + c];
            sc = dot * a.scale;
        }
        float mn   = fmaxf(m, k_warp_max(sc)); // finite: key s0 <= t is in this tile
        float corr = expf(m - mn);
        float p    = s <= t ? expf(sc - mn) : 0.0f;
        l          = l * corr + k_warp_sum(p);
        for (int k = 0; k < MAXC; k++) {
            int c = lane + 32 * k;
            if (c >= d)
                break;
            float acc = o[k] * corr;
            for (int j = 0; j < TILE; j++)
                acc += __shfl_sync(0xffffffffu, p, j) * vs[j * (d + 1) + c];
            o[k] = acc;
        }
        m = mn;
    }
    if (t >= a.T)
        return;
    for (int k = 0; k < MAXC; k++) {
        int c = lane + 32 * k;
        if (c < d)
            y[((size_t)b * a.T + t) * a.C + (size_t)h * d + c] = o[k] / l;
    }
    if (lane == 0)
        lse[((size_t)b * a.H + h) * a.T + t] = m + logf(l);
}

// D[b, h, t] = dy_t . y_t over the head's components.
__global__ void attn_dot_kernel(attn_dims a, const float *y, const float *dy, float *D) {
    size_t rows = (size_t)a.B * a.H * a.T;
    size_t r    = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    int    lane = threadIdx.x & 31;
    if (r >= rows)
        return;
    int    t = (int)(r % a.T), h = (int)(r / a.T % a.H), b = (int)(r / ((size_t)a.T * a.H));
    size_t o = ((size_t)b * a.T + t) * a.C + (size_t)h * a.d;
    float  s = 0.0f;
    for (int c = lane; c < a.d; c += 32)
        s += dy[o + c] * y[o + c];
    s = k_warp_sum(s);
    if (lane == 0)
        D[r] = s;
}

__device__ __forceinline__ void store_grad(float *dst, float v, bool acc) {
    *dst = acc ? *dst + v : v;
}

// dq_t = scale sum over s <= t of p_ts (dO_t . v_s - D_t) k_s; a warp per query row.
__global__ void attn_dq_kernel(attn_dims a, const float *qkv, const float *dy, const float *lse,
                               const float *D, float *dqkv, bool acc) {
    extern __shared__ float sm[];
    int                     d = a.d, w = threadIdx.x >> 5, lane = threadIdx.x & 31;
    float                  *ks = sm, *vs = ks + TILE * (d + 1);
    float                  *qs = vs + TILE * (d + 1) + w * 2 * d, *gs = qs + d;
    int                     b = blockIdx.y / a.H, h = blockIdx.y % a.H, t = blockIdx.x * ROWS + w;
    int                     tmax = min(a.T - 1, (int)blockIdx.x * ROWS + ROWS - 1);
    size_t                  r    = ((size_t)b * a.H + h) * a.T + t;
    if (t < a.T)
        for (int c = lane; c < d; c += 32) {
            qs[c] = qkv[at(a, b, t, h, 0) + c];
            gs[c] = dy[((size_t)b * a.T + t) * a.C + (size_t)h * d + c];
        }
    float dq[MAXC] = {0, 0, 0, 0};
    float lt = t < a.T ? lse[r] : 0.0f, Dt = t < a.T ? D[r] : 0.0f;
    for (int s0 = 0; s0 <= tmax; s0 += TILE) {
        __syncthreads();
        load_tile(a, qkv, b, h, 1, s0, ks);
        load_tile(a, qkv, b, h, 2, s0, vs);
        __syncthreads();
        if (t >= a.T || s0 > t)
            continue;
        int   s  = s0 + lane;
        float ds = 0.0f;
        if (s <= t) {
            float qk = 0.0f, gv = 0.0f;
            for (int c = 0; c < d; c++) {
                qk += qs[c] * ks[lane * (d + 1) + c];
                gv += gs[c] * vs[lane * (d + 1) + c];
            }
            float p = expf(qk * a.scale - lt);
            ds      = p * (gv - Dt);
        }
        for (int k = 0; k < MAXC; k++) {
            int c = lane + 32 * k;
            if (c >= d)
                break;
            float sum = dq[k];
            for (int j = 0; j < TILE; j++)
                sum += __shfl_sync(0xffffffffu, ds, j) * ks[j * (d + 1) + c];
            dq[k] = sum;
        }
    }
    if (t >= a.T)
        return;
    for (int k = 0; k < MAXC; k++) {
        int c = lane + 32 * k;
        if (c < d)
            store_grad(&dqkv[at(a, b, t, h, 0) + c], dq[k] * a.scale, acc);
    }
}

// dv_s = sum over t >= s of p_ts dO_t; dk_s = scale sum of p_ts (dO_t . v_s - D_t) q_t;
// a warp per key row.
__global__ void attn_dkv_kernel(attn_dims a, const float *qkv, const float *dy, const float *lse,
                                const float *D, float *dqkv, bool acc) {
    extern __shared__ float sm[];
    int                     d = a.d, w = threadIdx.x >> 5, lane = threadIdx.x & 31;
    float *qsh = sm, *gsh = qsh + TILE * (d + 1), *lsh = gsh + TILE * (d + 1), *dsh = lsh + TILE;
    float *kw = dsh + TILE + w * 2 * d, *vw = kw + d;
    int    b = blockIdx.y / a.H, h = blockIdx.y % a.H, s = blockIdx.x * ROWS + w;
    int    smin = blockIdx.x * ROWS;
    if (s < a.T)
        for (int c = lane; c < d; c += 32) {
            kw[c] = qkv[at(a, b, s, h, 1) + c];
            vw[c] = qkv[at(a, b, s, h, 2) + c];
        }
    float dk[MAXC] = {0, 0, 0, 0}, dv[MAXC] = {0, 0, 0, 0};
    for (int t0 = (smin / TILE) * TILE; t0 < a.T; t0 += TILE) {
        __syncthreads();
        load_tile(a, qkv, b, h, 0, t0, qsh);
        for (int i = threadIdx.x; i < TILE * d; i += blockDim.x) {
            int rr = i / d, c = i % d, t = t0 + rr;
            gsh[rr * (d + 1) + c] =
                t < a.T ? dy[((size_t)b * a.T + t) * a.C + (size_t)h * d + c] : 0.0f;
        }
        for (int i = threadIdx.x; i < TILE; i += blockDim.x) {
            int t  = t0 + i;
            lsh[i] = t < a.T ? lse[((size_t)b * a.H + h) * a.T + t] : 0.0f;
            dsh[i] = t < a.T ? D[((size_t)b * a.H + h) * a.T + t] : 0.0f;
        }
        __syncthreads();
        if (s >= a.T)
            continue;
        int   t = t0 + lane;
        float p = 0.0f, ds = 0.0f;
        if (t >= s && t < a.T) {
            float qk = 0.0f, gv = 0.0f;
            for (int c = 0; c < d; c++) {
                qk += qsh[lane * (d + 1) + c] * kw[c];
                gv += gsh[lane * (d + 1) + c] * vw[c];
            }
            p  = expf(qk * a.scale - lsh[lane]);
            ds = p * (gv - dsh[lane]);
        }
        for (int k = 0; k < MAXC; k++) {
            int c = lane + 32 * k;
            if (c >= d)
                break;
            float sk = dk[k], sv = dv[k];
            for (int j = 0; j < TILE; j++) {
                float pj = __shfl_sync(0xffffffffu, p, j), dj = __shfl_sync(0xffffffffu, ds, j);
                sv += pj * gsh[j * (d + 1) + c];
                sk += dj * qsh[j * (d + 1) + c];
            }
            dk[k] = sk, dv[k] = sv;
        }
    }
    if (s >= a.T)
        return;
    for (int k = 0; k < MAXC; k++) {
        int c = lane + 32 * k;
        if (c < d) {
            store_grad(&dqkv[at(a, b, s, h, 1) + c], dk[k] * a.scale, acc);
            store_grad(&dqkv[at(a, b, s, h, 2) + c], dv[k], acc);
        }
    }
}

extern "C" {

size_t k_attn_work(int B, int T, int C, int H) {
    (void)C;
    return (size_t)B * H * T;
}

// Shared memory of each kernel for head size d; above 48 KiB the kernels need the
// opt-in, which d <= 128 never does (36.9, 41 and 41.2 KiB at d = 128).
static size_t fwd_shm(int d) {
    return sizeof(float) * (2 * TILE * (size_t)(d + 1) + ROWS * (size_t)d);
}
static size_t dq_shm(int d) {
    return sizeof(float) * (2 * TILE * (size_t)(d + 1) + 2 * ROWS * (size_t)d);
}
static size_t dkv_shm(int d) {
    return sizeof(float) * (2 * TILE * (size_t)(d + 1) + 2 * TILE + 2 * ROWS * (size_t)d);
}

cudaError_t k_attn_forward(cudaStream_t s, int B, int T, int C, int H, const float *qkv, float *y,
                           float *lse) {
    attn_dims a = dims_of(B, T, C, H);
    if (a.d > 32 * MAXC || C % H)
        return cudaErrorInvalidValue;
    dim3 grid((unsigned)((T + ROWS - 1) / ROWS), (unsigned)(B * H));
    attn_forward_kernel<<<grid, ROWS * 32, fwd_shm(a.d), s>>>(a, qkv, y, lse);
    K_DONE();
}

cudaError_t k_attn_backward(cudaStream_t s, int B, int T, int C, int H, const float *qkv,
                            const float *y, const float *lse, const float *dy, float *dqkv,
                            bool acc, float *work) {
    attn_dims a = dims_of(B, T, C, H);
    if (a.d > 32 * MAXC || C % H)
        return cudaErrorInvalidValue;
    size_t rows = (size_t)B * H * T;
    attn_dot_kernel<<<(unsigned)((rows * 32 + K_THREADS - 1) / K_THREADS), K_THREADS, 0, s>>>(
        a, y, dy, work);
    dim3 grid((unsigned)((T + ROWS - 1) / ROWS), (unsigned)(B * H));
    attn_dq_kernel<<<grid, ROWS * 32, dq_shm(a.d), s>>>(a, qkv, dy, lse, work, dqkv, acc);
    attn_dkv_kernel<<<grid, ROWS * 32, dkv_shm(a.d), s>>>(a, qkv, dy, lse, work, dqkv, acc);
    K_DONE();
}

} // extern "C"
