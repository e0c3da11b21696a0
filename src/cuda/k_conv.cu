// k_conv.cu: the convolution's kernels around its matrix products (kernels.h's
// k_conv): im2col over the whole batch, its adjoint gathered per input pixel (no
// atomics: each input's gradient is summed over its windows in one fixed order), and
// the output's layout with the bias, ReLU and 2x2 max pool of the fused kinds.
#include "cuda/k_common.cuh"

// col[k][n P + p], k = (c kh + ki) kw + kj, p = i wo + j.
__global__ void im2col_kernel(k_conv c, const float *x, float *col) {
    size_t P = (size_t)c.ho * c.wo, NP = (size_t)c.n * P;
    size_t K = (size_t)c.cin * c.kh * c.kw;
    K_FOR(idx, K * NP) {
        size_t k = idx / NP, q = idx % NP;
        int    n = (int)(q / P), p = (int)(q % P);
        int    i = p / c.wo, j = p % c.wo;
        int    kj = (int)(k % c.kw), ki = (int)(k / c.kw % c.kh), ch = (int)(k / c.kw / c.kh);
        int    r = i * c.sh - c.ph + ki, s = j * c.sw - c.pw + kj;
        float  v = 0.0f;
        if (r >= 0 && r < c.h && s >= 0 && s < c.w)
            v = x[(((size_t)n * c.cin + ch) * c.h + r) * c.w + s];
        col[idx] = v;
    }
}

// dx[n][ch][r][s] = sum over (ki, kj) whose window puts (r, s) at an output pixel.
__global__ void col2im_kernel(k_conv c, const float *dcol, float *dx, bool acc) {
    size_t P = (size_t)c.ho * c.wo, NP = (size_t)c.n * P;
    size_t total = (size_t)c.n * c.cin * c.h * c.w;
    K_FOR(idx, total) {
        int   s = (int)(idx % c.w), r = (int)(idx / c.w % c.h);
        int   ch = (int)(idx / ((size_t)c.w * c.h) % c.cin);
        int   n  = (int)(idx / ((size_t)c.w * c.h * c.cin));
        float g  = 0.0f;
        for (int ki = 0; ki < c.kh; ki++) {
            int t = r + c.ph - ki;
            if (t < 0 || t % c.sh)
                continue;
            int i = t / c.sh;
            if (i >= c.ho)
                continue;
            for (int kj = 0; kj < c.kw; kj++) {
                int u = s + c.pw - kj;
                if (u < 0 || u % c.sw)
                    continue;
                int j = u / c.sw;
                if (j >= c.wo)
                    continue;
                size_t k = ((size_t)ch * c.kh + ki) * c.kw + kj;
                g += dcol[k * NP + (size_t)n * P + (size_t)i * c.wo + j];
            }
        }
        dx[idx] = acc ? dx[idx] + g : g;
    }
}

// The convolution's value with its bias (before the ReLU: the pool compares these, as
// conv2d.c does, and the ReLU of the winner is the output).
__device__ __forceinline__ float conv_value(const k_conv &c, const float *yt, const float *bias,
                                            int o, size_t col) {
    size_t NP = (size_t)c.n * c.ho * c.wo;
    return yt[(size_t)o * NP + col] + (c.bias ? bias[o] : 0.0f);
}
__device__ __forceinline__ float relu_if(const k_conv &c, float v) {
    return c.relu ? (v > 0.0f ? v : 0.0f) : v;
}

// One thread per output value (pooled or not).
__global__ void conv_out_kernel(k_conv c, const float *yt, const float *bias, float *y,
                                uint8_t *arg) {
    int    ho = c.pool2 ? c.ho / 2 : c.ho, wo = c.pool2 ? c.wo / 2 : c.wo;
    size_t P     = (size_t)c.ho * c.wo;
    size_t total = (size_t)c.n * c.cout * ho * wo;
    K_FOR(idx, total) {
        int    j = (int)(idx % wo), i = (int)(idx / wo % ho);
        int    o    = (int)(idx / ((size_t)wo * ho) % c.cout);
        int    n    = (int)(idx / ((size_t)wo * ho * c.cout));
        size_t base = (size_t)n * P;
        if (!c.pool2) {
            y[idx] = relu_if(c, conv_value(c, yt, bias, o, base + (size_t)i * c.wo + j));
            continue;
        }
        // The window's values in row-major order; the first maximum wins ties.
        float   m  = conv_value(c, yt, bias, o, base + (size_t)(2 * i) * c.wo + 2 * j);
        uint8_t at = 0;
        for (int q = 1; q < 4; q++) {
            float v =
                conv_value(c, yt, bias, o, base + (size_t)(2 * i + q / 2) * c.wo + 2 * j + q % 2);
            if (v > m) {
                m  = v;
                at = (uint8_t)q;
            }
        }
        y[idx]   = relu_if(c, m);
        arg[idx] = at;
    }
}

// One thread per element of dYt (cout, N P).
__global__ void conv_dout_kernel(k_conv c, const float *dy, const float *y, const uint8_t *arg,
                                 float *dyt) {
    size_t P = (size_t)c.ho * c.wo, NP = (size_t)c.n * P;
    int    ho2 = c.ho / 2, wo2 = c.wo / 2;
    K_FOR(idx, (size_t)c.cout * NP) {
        int    o = (int)(idx / NP);
        size_t q = idx % NP;
        int    n = (int)(q / P), p = (int)(q % P);
        int    i = p / c.wo, j = p % c.wo;
        float  g = 0.0f;
        if (!c.pool2) {
            size_t at = ((size_t)n * c.cout + o) * P + p;
            g         = dy[at];
            if (c.relu && !(y[at] > 0.0f))
                g = 0.0f;
        } else if (i / 2 < ho2 && j / 2 < wo2) {
            size_t at = (((size_t)n * c.cout + o) * ho2 + i / 2) * wo2 + j / 2;
            if (arg[at] == (uint8_t)((i % 2) * 2 + j % 2) && (!c.relu || y[at] > 0.0f))
                g = dy[at];
        }
        dyt[idx] = g;
    }
}

extern "C" {

cudaError_t k_im2col(cudaStream_t s, const k_conv *c, const float *x, float *col) {
    size_t n = (size_t)c->cin * c->kh * c->kw * c->n * c->ho * c->wo;
    if (n)
        im2col_kernel<<<k_blocks(n), K_THREADS, 0, s>>>(*c, x, col);
    K_DONE();
}

cudaError_t k_col2im(cudaStream_t s, const k_conv *c, const float *dcol, float *dx, bool acc) {
    size_t n = (size_t)c->n * c->cin * c->h * c->w;
    if (n)
        col2im_kernel<<<k_blocks(n), K_THREADS, 0, s>>>(*c, dcol, dx, acc);
    K_DONE();
}

cudaError_t k_conv_out(cudaStream_t s, const k_conv *c, const float *yt, const float *bias,
                       float *y, uint8_t *arg) {
    size_t n = (size_t)c->n * c->cout * (c->pool2 ? (c->ho / 2) * (c->wo / 2) : c->ho * c->wo);
    if (n)
        conv_out_kernel<<<k_blocks(n), K_THREADS, 0, s>>>(*c, yt, bias, y, arg);
    K_DONE();
}

cudaError_t k_conv_dout(cudaStream_t s, const k_conv *c, const float *dy, const float *y,
                        const uint8_t *arg, float *dyt) {
    size_t n = (size_t)c->cout * c->n * c->ho * c->wo;
    if (n)
        conv_dout_kernel<<<k_blocks(n), K_THREADS, 0, s>>>(*c, dy, y, arg, dyt);
    K_DONE();
}

} // extern "C"
