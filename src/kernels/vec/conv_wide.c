// conv_wide.c: the fused convolution's data movement in its wide layout
// (src/nn/layers/conv_team.c: output positions indexed over the padded input's width, so
// that each im2col row is a contiguous slice): col2im's adjoint, the wide GEMM output to
// the compact output (+ bias, ReLU), the incoming gradient back into the wide layout
// (the ReLU's mask), and the fused 2x2 max pool both ways. Memory-bound loops (vec.h).
//
// The copies and col2im step the target's vector (vec.h's vf). The pools take eight
// windows at a time on every target (the even and odd lanes of 16 floats), in 8-lane
// vectors of their own: built for AVX2, GCC 12 turned the 16-lane form's stores into
// stack traffic and its masks into one compare and branch per lane (wide_to_pool: 75 us
// a sample of the ConvNet's conv2 on a Zen 3, 15 in eight lanes).
#include "kernels/vec/vec.h"

#include <string.h>

typedef int32_t dt_v8i __attribute__((vector_size(32)));
typedef uint8_t dt_v8u8 __attribute__((vector_size(8)));

// The pools' eight lanes (dt_v8f, vmath.h).
DT_VINLINE dt_v8f load8(const float *p) {
    dt_v8f v;
    __builtin_memcpy(&v, p, sizeof v);
    return v;
}
DT_VINLINE void store8(float *p, dt_v8f v) {
    __builtin_memcpy(p, &v, sizeof v);
}
// a > 0 ? v : 0, lane by lane
DT_VINLINE dt_v8f keep_positive8(dt_v8f a, dt_v8f v) {
    return (dt_v8f)((dt_v8i)v & (a > (dt_v8f){0}));
}
// Lane-wise m ? x : y for masks from vector comparisons.
DT_VINLINE dt_v8i sel_i(dt_v8i m, dt_v8i x, dt_v8i y) {
    return (x & m) | (y & ~m);
}
DT_VINLINE dt_v8f sel_f(dt_v8i m, dt_v8f x, dt_v8f y) {
    return (dt_v8f)sel_i(m, (dt_v8i)x, (dt_v8i)y);
}

// Vector-wide steps over a row of n >= VL floats; the last step is moved back to end at
// n, overlapping the one before (fine for copies, which these are).
#define FOR_ROW(j, n)                                                                              \
    for (int j = 0, j##_end = (n); j < j##_end;                                                    \
         j = (j + 2 * VL > j##_end && j + VL < j##_end) ? j##_end - VL : j + VL)

// The adjoint of wide_im2col: dxp[c][p] = sum over (ki, kj) of
// col[(c, ki, kj)][p - ki*Wp - kj] where that index is inside the row. One pass over
// dxp with k*k input streams, in the fixed (ki, kj) order, instead of k*k passes
// that each read back what the previous one just stored at a one-float offset.
// One position of wide_col2im, for the edges where some rows do not reach.
static inline float col_sum_at(const float *rows, const int *off, int kk, int n, int p) {
    float acc = 0.0f;
    for (int r = 0; r < kk; r++) {
        int q = p - off[r];
        if (q >= 0 && q < n)
            acc += rows[(size_t)r * n + q];
    }
    return acc;
}

static void wide_col2im(const float *col, int c, int k, const dt_kwide *gp, float *restrict dxp) {
    const dt_kwide g  = *gp;
    int            kk = k * k, plane = (int)g.plane;
    int            off[256]; // kernel <= 16 is checked at setup
    for (int ki = 0; ki < k; ki++)
        for (int kj = 0; kj < k; kj++)
            off[ki * k + kj] = ki * g.wp + kj;
    int lo = off[kk - 1], hi = g.n; // p in [lo, hi): every row contributes
    for (int ch = 0; ch < c; ch++) {
        const float *rows = col + (size_t)ch * kk * g.n;
        float       *d    = dxp + (size_t)ch * g.plane;
        int          p    = 0;
        for (; p < plane && !(p >= lo && p + VL <= hi); p++)
            d[p] = col_sum_at(rows, off, kk, g.n, p);
        for (; p + VL <= hi; p += VL) {
            vf acc = vsplat(0.0f);
            for (int r = 0; r < kk; r++)
                acc += vload(rows + (size_t)r * g.n + p - off[r]);
            vstore(d + p, acc);
        }
        for (; p < plane; p++)
            d[p] = col_sum_at(rows, off, kk, g.n, p);
    }
}

// Wide (Cout, n) GEMM output -> compact (Cout, Ho, Wo) output, + bias (b NULL: none, as
// + 0), ReLU if fused. Rows of ext are ext_ld apart.
static void wide_to_out(const float *restrict ext, size_t ext_ld, const float *restrict b, int co,
                        int ho, int wo, const dt_kwide *gp, bool relu, float *restrict y) {
    const dt_kwide g = *gp;
    for (int oc = 0; oc < co; oc++) {
        float bo = b ? b[oc] : 0.0f;
        vf    bv = vsplat(bo);
        for (int oh = 0; oh < ho; oh++) {
            const float *src = ext + (size_t)oc * ext_ld + (size_t)oh * g.wp;
            float       *dst = y + ((size_t)oc * ho + oh) * wo;
            if (wo < VL) {
                for (int ow = 0; ow < wo; ow++) {
                    float v = src[ow] + bo;
                    dst[ow] = relu && !(v > 0.0f) ? 0.0f : v;
                }
                continue;
            }
            FOR_ROW(j, wo) {
                vf v = vload(src + j) + bv;
                vstore(dst + j, relu ? vkeep_positive(v, v) : v);
            }
        }
    }
}

// Compact output gradient -> wide (Cout, n), zero in the dropped columns; the fused
// ReLU's mask (y > 0) applied on the way.
static void grad_to_wide(const float *restrict dy, const float *restrict y, int co, int ho, int wo,
                         const dt_kwide *gp, bool relu, float *restrict ext, size_t ext_ld) {
    const dt_kwide g = *gp;
    for (int oc = 0; oc < co; oc++)
        for (int oh = 0; oh < ho; oh++) {
            const float *src = dy + ((size_t)oc * ho + oh) * wo;
            const float *yy  = y + ((size_t)oc * ho + oh) * wo;
            float       *dst = ext + (size_t)oc * ext_ld + (size_t)oh * g.wp;
            if (wo < VL) {
                for (int ow = 0; ow < wo; ow++)
                    dst[ow] = relu && !(yy[ow] > 0.0f) ? 0.0f : src[ow];
            } else {
                FOR_ROW(j, wo) {
                    vf v = vload(src + j);
                    vstore(dst + j, relu ? vkeep_positive(vload(yy + j), v) : v);
                }
            }
            if (oh + 1 < ho)
                for (int ow = wo; ow < g.wp; ow++)
                    dst[ow] = 0.0f;
        }
}

// The even and the odd lanes of the 16 floats at p: a row's left and right columns of
// eight 2x2 windows.
DT_VINLINE void columns8(const float *p, dt_v8f *left, dt_v8f *right) {
    dt_v8f a = load8(p), b = load8(p + 8);
    *left  = __builtin_shufflevector(a, b, 0, 2, 4, 6, 8, 10, 12, 14);
    *right = __builtin_shufflevector(a, b, 1, 3, 5, 7, 9, 11, 13, 15);
}

// Wide (Cout, n) GEMM output -> the fused ReLU + 2x2/2 max pool: y (Cout, Ho/2, Wo/2)
// and the winner of each window (0..3, row-major; the first maximum on ties, as
// pool2d.c and PyTorch). The bias is added before the comparison, as unfused.
// Eight windows at a time, without branches: each window's four values are lanes of
// four vectors (the two rows' even and odd columns); the last block of a row is moved
// back to end at the row's end (rewriting equal values).
static void wide_to_pool(const float *restrict ext, size_t ext_ld, const float *restrict b, int co,
                         int ho, int wo, const dt_kwide *gp, float *restrict y,
                         uint8_t *restrict arg) {
    const dt_kwide g  = *gp;
    int            ph = ho / 2, pw = wo / 2;
    for (int oc = 0; oc < co; oc++) {
        float  bv  = b[oc];
        dt_v8f bvv = (dt_v8f){0} + bv;
        for (int i = 0; i < ph; i++) {
            const float *r0 = ext + (size_t)oc * ext_ld + (size_t)(2 * i) * g.wp;
            const float *r1 = r0 + g.wp;
            float       *yo = y + ((size_t)oc * ph + i) * pw;
            uint8_t     *ao = arg + ((size_t)oc * ph + i) * pw;
            if (pw < 8) {
                for (int j = 0; j < pw; j++) {
                    float v[4] = {r0[2 * j] + bv, r0[2 * j + 1] + bv, r1[2 * j] + bv,
                                  r1[2 * j + 1] + bv};
                    int   k    = 0;
                    for (int q = 1; q < 4; q++)
                        k = v[q] > v[k] ? q : k;
                    yo[j] = v[k] > 0.0f ? v[k] : 0.0f;
                    ao[j] = (uint8_t)k;
                }
                continue;
            }
            for (int j0 = 0; j0 < pw; j0 += 8) {
                int    j = j0 + 8 > pw ? pw - 8 : j0;
                dt_v8f v[4];
                columns8(r0 + 2 * j, &v[0], &v[1]);
                columns8(r1 + 2 * j, &v[2], &v[3]);
                dt_v8f m = v[0] + bvv;
                dt_v8i k = {0};
                UNROLL(3) for (int q = 1; q < 4; q++) {
                    dt_v8f x = v[q] + bvv;
                    dt_v8i w = x > m;
                    m        = sel_f(w, x, m);
                    k        = sel_i(w, (dt_v8i){0} + q, k);
                }
                dt_v8u8 kb = __builtin_convertvector(k, dt_v8u8);
                store8(yo + j, keep_positive8(m, m));
                __builtin_memcpy(ao + j, &kb, sizeof kb);
            }
        }
    }
}

// The pooled gradient -> wide (Cout, n): each window's gradient goes to its winner,
// masked by the ReLU (y > 0), zeros everywhere else. Eight windows at a time: every
// output is duplicated into two lanes, so lane 2t+q of a row's vectors is window t's
// column q, and each window position takes the gradient where it is the winner.
// The windows cover every position but the k-1 dropped columns, zeroed apart.
static void pool_grad_to_wide(const float *restrict dy, const float *restrict y,
                              const uint8_t *restrict arg, int co, int ho, int wo,
                              const dt_kwide *gp, float *restrict ext, size_t ext_ld) {
    const dt_kwide g      = *gp;
    const dt_v8i   parity = {0, 1, 0, 1, 0, 1, 0, 1};
    int            ph = ho / 2, pw = wo / 2;
    for (int oc = 0; oc < co; oc++) {
        float *row = ext + (size_t)oc * ext_ld;
        for (int r = 0; r + 1 < ho; r++) // the dropped columns after each output row
            for (int x = wo; x < g.wp; x++)
                row[(size_t)r * g.wp + x] = 0.0f;
        for (int i = 0; i < ph; i++) {
            size_t o  = ((size_t)oc * ph + i) * pw;
            float *w0 = row + (size_t)(2 * i) * g.wp, *w1 = w0 + g.wp;
            if (pw < 8) {
                for (int j = 0; j < pw; j++) {
                    int   k       = arg[o + j];
                    float v       = y[o + j] > 0.0f ? dy[o + j] : 0.0f;
                    w0[2 * j]     = k == 0 ? v : 0.0f;
                    w0[2 * j + 1] = k == 1 ? v : 0.0f;
                    w1[2 * j]     = k == 2 ? v : 0.0f;
                    w1[2 * j + 1] = k == 3 ? v : 0.0f;
                }
                continue;
            }
            for (int j0 = 0; j0 < pw; j0 += 8) {
                int     j = j0 + 8 > pw ? pw - 8 : j0;
                dt_v8u8 kb;
                __builtin_memcpy(&kb, arg + o + j, sizeof kb);
                dt_v8f g8 = keep_positive8(load8(y + o + j), load8(dy + o + j));
                dt_v8i k8 = __builtin_convertvector(kb, dt_v8i);
                dt_v8f lo = __builtin_shufflevector(g8, g8, 0, 0, 1, 1, 2, 2, 3, 3),
                       hi = __builtin_shufflevector(g8, g8, 4, 4, 5, 5, 6, 6, 7, 7);
                dt_v8i kl = __builtin_shufflevector(k8, k8, 0, 0, 1, 1, 2, 2, 3, 3),
                       kh = __builtin_shufflevector(k8, k8, 4, 4, 5, 5, 6, 6, 7, 7);
                store8(w0 + 2 * j, (dt_v8f)((dt_v8i)lo & (kl == parity)));
                store8(w0 + 2 * j + 8, (dt_v8f)((dt_v8i)hi & (kh == parity)));
                store8(w1 + 2 * j, (dt_v8f)((dt_v8i)lo & (kl == parity + 2)));
                store8(w1 + 2 * j + 8, (dt_v8f)((dt_v8i)hi & (kh == parity + 2)));
            }
        }
    }
}

void DT_KV(fill_conv_wide)(dt_ktab *t) {
    t->wide_col2im       = wide_col2im;
    t->wide_to_out       = wide_to_out;
    t->grad_to_wide      = grad_to_wide;
    t->wide_to_pool      = wide_to_pool;
    t->pool_grad_to_wide = pool_grad_to_wide;
}
