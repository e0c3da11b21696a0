// k_pool.cu: max and average pooling (kernels.h's k_pool), as ops_pool.c and the
// graph's max pool compute them. Backward gathers: each input pixel sums the windows
// that hold it, in row-major order of the windows (the order in which the CPU's scatter
// adds them), so no two threads write one value.
#include "cuda/k_common.cuh"

// torch's adaptive bounds: [floor(i in / out), ceil((i + 1) in / out)).
__device__ __forceinline__ int ad_start(int i, int in, int out) {
    return (int)(((long long)i * in) / out);
}
__device__ __forceinline__ int ad_end(int i, int in, int out) {
    return (int)(((long long)(i + 1) * in + out - 1) / out);
}

// The windows (outputs along one axis) holding input position r: [*lo, *hi).
__device__ __forceinline__ void holders(int r, int k, int st, int pad, int out, int *lo, int *hi) {
    int t = r + pad - k + 1; // the first output whose window's end passes r
    *lo   = t <= 0 ? 0 : (t + st - 1) / st;
    int e = (r + pad) / st + 1;
    *hi   = e < out ? e : out;
}

__global__ void maxpool_forward_kernel(k_pool p, const float *x, float *y, int32_t *arg) {
    size_t total = (size_t)p.planes * p.ho * p.wo;
    K_FOR(idx, total) {
        int          j = (int)(idx % p.wo), i = (int)(idx / p.wo % p.ho);
        size_t       pl   = idx / ((size_t)p.wo * p.ho);
        const float *xp   = x + pl * p.h * p.w;
        float        best = -INFINITY;
        int          bi   = -1;
        for (int ki = 0; ki < p.kh; ki++) {
            int r = i * p.sh - p.ph + ki;
            if (r < 0 || r >= p.h)
                continue;
            for (int kj = 0; kj < p.kw; kj++) {
                int c = j * p.sw - p.pw + kj;
                if (c < 0 || c >= p.w)
                    continue;
                float v = xp[r * p.w + c];
                if (bi < 0 || v > best || isnan(v)) {
                    best = v;
                    bi   = r * p.w + c;
                }
            }
        }
        y[idx]   = best;
        arg[idx] = bi;
    }
}

__global__ void maxpool_backward_kernel(k_pool p, const float *dy, const int32_t *arg, float *dx,
                                        bool acc) {
    size_t total = (size_t)p.planes * p.h * p.w;
    K_FOR(idx, total) {
        int    c = (int)(idx % p.w), r = (int)(idx / p.w % p.h);
        size_t pl = idx / ((size_t)p.w * p.h);
        int    i0, i1, j0, j1;
        holders(r, p.kh, p.sh, p.ph, p.ho, &i0, &i1);
        holders(c, p.kw, p.sw, p.pw, p.wo, &j0, &j1);
        float g  = 0.0f;
        int   me = r * p.w + c;
        for (int i = i0; i < i1; i++)
            for (int j = j0; j < j1; j++) {
                size_t o = (pl * p.ho + i) * p.wo + j;
                if (arg[o] == me)
                    g += dy[o];
            }
        dx[idx] = acc ? dx[idx] + g : g;
    }
}

__global__ void avgpool_forward_kernel(k_pool p, bool adaptive, const float *x, float *y) {
    size_t total = (size_t)p.planes * p.ho * p.wo;
    K_FOR(idx, total) {
        int          j = (int)(idx % p.wo), i = (int)(idx / p.wo % p.ho);
        size_t       pl = idx / ((size_t)p.wo * p.ho);
        const float *xp = x + pl * p.h * p.w;
        int          r0, r1, c0, c1;
        if (adaptive) {
            r0 = ad_start(i, p.h, p.ho), r1 = ad_end(i, p.h, p.ho);
            c0 = ad_start(j, p.w, p.wo), c1 = ad_end(j, p.w, p.wo);
        } else {
            int a = i * p.sh - p.ph, b = j * p.sw - p.pw;
            r0 = a < 0 ? 0 : a, r1 = a + p.kh > p.h ? p.h : a + p.kh;
            c0 = b < 0 ? 0 : b, c1 = b + p.kw > p.w ? p.w : b + p.kw;
        }
        float s = 0.0f;
        for (int r = r0; r < r1; r++)
            for (int q = c0; q < c1; q++)
                s += xp[(size_t)r * p.w + q];
        y[idx] = adaptive ? s / (float)((r1 - r0) * (c1 - c0)) : s * (1.0f / (float)(p.kh * p.kw));
    }
}

__global__ void avgpool_backward_kernel(k_pool p, bool adaptive, const float *dy, float *dx,
                                        bool acc) {
    size_t total = (size_t)p.planes * p.h * p.w;
    K_FOR(idx, total) {
        int          c = (int)(idx % p.w), r = (int)(idx / p.w % p.h);
        size_t       pl = idx / ((size_t)p.w * p.h);
        const float *dp = dy + pl * p.ho * p.wo;
        float        g  = 0.0f;
        if (adaptive) {
            for (int i = 0; i < p.ho; i++) {
                int r0 = ad_start(i, p.h, p.ho), r1 = ad_end(i, p.h, p.ho);
                if (r < r0 || r >= r1)
                    continue;
                for (int j = 0; j < p.wo; j++) {
                    int c0 = ad_start(j, p.w, p.wo), c1 = ad_end(j, p.w, p.wo);
                    if (c >= c0 && c < c1)
                        g += dp[i * p.wo + j] / (float)((r1 - r0) * (c1 - c0));
                }
            }
        } else {
            int   i0, i1, j0, j1;
            float inv = 1.0f / (float)(p.kh * p.kw);
            holders(r, p.kh, p.sh, p.ph, p.ho, &i0, &i1);
            holders(c, p.kw, p.sw, p.pw, p.wo, &j0, &j1);
            for (int i = i0; i < i1; i++)
                for (int j = j0; j < j1; j++)
                    g += dp[i * p.wo + j] * inv;
        }
        dx[idx] = acc ? dx[idx] + g : g;
    }
}

extern "C" {

cudaError_t k_maxpool_forward(cudaStream_t s, const k_pool *p, const float *x, float *y,
                              int32_t *arg) {
    size_t n = (size_t)p->planes * p->ho * p->wo;
    if (n)
        maxpool_forward_kernel<<<k_blocks(n), K_THREADS, 0, s>>>(*p, x, y, arg);
    K_DONE();
}

cudaError_t k_maxpool_backward(cudaStream_t s, const k_pool *p, const float *dy, const int32_t *arg,
                               float *dx, bool acc) {
    size_t n = (size_t)p->planes * p->h * p->w;
    if (n)
        maxpool_backward_kernel<<<k_blocks(n), K_THREADS, 0, s>>>(*p, dy, arg, dx, acc);
    K_DONE();
}

cudaError_t k_avgpool_forward(cudaStream_t s, const k_pool *p, bool adaptive, const float *x,
                              float *y) {
    size_t n = (size_t)p->planes * p->ho * p->wo;
    if (n)
        avgpool_forward_kernel<<<k_blocks(n), K_THREADS, 0, s>>>(*p, adaptive, x, y);
    K_DONE();
}

cudaError_t k_avgpool_backward(cudaStream_t s, const k_pool *p, bool adaptive, const float *dy,
                               float *dx, bool acc) {
    size_t n = (size_t)p->planes * p->h * p->w;
    if (n)
        avgpool_backward_kernel<<<k_blocks(n), K_THREADS, 0, s>>>(*p, adaptive, dy, dx, acc);
    K_DONE();
}

} // extern "C"
