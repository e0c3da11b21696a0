// conv16.c: bf16 shifted GEMMs for stride-1 convolutions (conv16.h).
//
// dt_c16_shifted is shifted.c's forward kernel with VDPBF16PS: 8 output rows x 48
// columns are 24 accumulators in AVX-512 registers; each pair-row r loads 3 vectors of 16
// pair words and broadcasts 8 weight words for 24 VDPBF16PS, i.e. 2 x 24 x 16 products.
// A convolution's forward reads the input's pair words at the shifts of (channel pair,
// ki, kj); its input gradient is the same kernel over the output gradient's pair words
// (with zero margins) at negative shifts, with the weights transposed (conv2d.c).
//
// dt_c16_shifted_nt (weight gradient) sums over positions: a 4 x 6 block of dw keeps 24
// accumulators, each VDPBF16PS takes 32 consecutive positions of a gradient row and of a
// shifted input row (both plain bf16: neighbouring positions are the pair), the last
// partial step through masked loads; at the end each block's 24 vectors are reduced in a
// fixed tree (reduce8) and added to dw.
#include "nn/conv16.h"
#include "nn/prec.h"

#include <string.h>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define C16_X86 1
#define TARGET  __attribute__((target("avx512f,avx512bw,avx512bf16")))
#else
#define C16_X86 0
#define TARGET
#endif

bool dt_c16_usable(void) {
    return C16_X86 && dt_prec_path_get() == DT_PATH_AVX512BF16;
}

static inline uint32_t pair(uint16_t lo, uint16_t hi) {
    return (uint32_t)lo | (uint32_t)hi << 16;
}

static inline float lo_f(uint32_t w) {
    return dt_bf16_to_f32_1((uint16_t)(w & 0xffffu));
}
static inline float hi_f(uint32_t w) {
    return dt_bf16_to_f32_1((uint16_t)(w >> 16));
}

// ---------------------------------------------------------------------- packing

// n floats of a and b (b NULL: zeros) -> n pair words (a low, b high), rounded to bf16.
TARGET static void pair_row(const float *a, const float *b, int n, uint32_t *out) {
    int j = 0;
    for (; j + 16 <= n; j += 16) {
        dt_v16u ua, ub = {0};
        __builtin_memcpy(&ua, a + j, sizeof ua);
        if (b)
            __builtin_memcpy(&ub, b + j, sizeof ub);
        dt_v16u w = dt_round_bf16_v16(ua) >> 16;
        if (b)
            w |= dt_round_bf16_v16(ub);
        __builtin_memcpy(out + j, &w, sizeof w);
    }
    for (; j < n; j++)
        out[j] = pair(dt_f32_to_bf16_1(a[j]), b ? dt_f32_to_bf16_1(b[j]) : 0);
}

TARGET static void bf16_row(const float *a, int n, uint16_t *out) {
    int j = 0;
    for (; j + 16 <= n; j += 16)
        dt_f32_to_bf16_16(a + j, out + j);
    for (; j < n; j++)
        out[j] = dt_f32_to_bf16_1(a[j]);
}

TARGET void dt_c16_pack_pairs(const float *x, int c, int h, int w, int pad, uint32_t *x2) {
    int    hp = h + 2 * pad, wp = w + 2 * pad;
    size_t plane = (size_t)hp * wp, hw = (size_t)h * w;
    for (int cp = 0; cp < (c + 1) / 2; cp++) {
        uint32_t    *o = x2 + (size_t)cp * plane;
        const float *a = x + (size_t)(2 * cp) * hw, *b = 2 * cp + 1 < c ? a + hw : NULL;
        if (!pad) {
            pair_row(a, b, (int)hw, o);
            continue;
        }
        memset(o, 0, sizeof(uint32_t) * (size_t)pad * wp);
        for (int i = 0; i < h; i++) {
            uint32_t *r = o + (size_t)(i + pad) * wp;
            memset(r, 0, sizeof(uint32_t) * (size_t)pad);
            pair_row(a + (size_t)i * w, b ? b + (size_t)i * w : NULL, w, r + pad);
            memset(r + pad + w, 0, sizeof(uint32_t) * (size_t)pad);
        }
        memset(o + (size_t)(h + pad) * wp, 0, sizeof(uint32_t) * (size_t)pad * wp);
    }
}

TARGET void dt_c16_pack_plain(const float *x, int c, int h, int w, int pad, uint16_t *xb) {
    int    hp = h + 2 * pad, wp = w + 2 * pad;
    size_t plane = (size_t)hp * wp, hw = (size_t)h * w;
    if (!pad) {
        bf16_row(x, (int)(hw * (size_t)c), xb);
        return;
    }
    for (int ch = 0; ch < c; ch++) {
        uint16_t *o = xb + (size_t)ch * plane;
        memset(o, 0, sizeof(uint16_t) * plane);
        for (int i = 0; i < h; i++)
            bf16_row(x + (size_t)ch * hw + (size_t)i * w, w, o + (size_t)(i + pad) * wp + pad);
    }
}

TARGET void dt_c16_rows_to_pairs(const float *g, size_t g_ld, int rows, int n, int margin,
                                 size_t ld2, uint32_t *g2) {
    for (int rp = 0; rp < (rows + 1) / 2; rp++) {
        uint32_t    *o = g2 + (size_t)rp * ld2;
        const float *a = g + (size_t)(2 * rp) * g_ld, *b = 2 * rp + 1 < rows ? a + g_ld : NULL;
        memset(o, 0, sizeof(uint32_t) * (size_t)margin);
        pair_row(a, b, n, o + margin);
        memset(o + margin + n, 0, sizeof(uint32_t) * (ld2 - (size_t)margin - (size_t)n));
    }
}

TARGET void dt_c16_rows_to_bf16(const float *g, size_t g_ld, int rows, int n, uint16_t *gb,
                                size_t ldb) {
    for (int r = 0; r < rows; r++)
        bf16_row(g + (size_t)r * g_ld, n, gb + (size_t)r * ldb);
}

void dt_c16_weight_pairs(const uint16_t *w16, int o, int c, int kk, uint32_t *w2) {
    int r2 = (c + 1) / 2 * kk;
    for (int oc = 0; oc < o; oc++)
        for (int cp = 0; cp < (c + 1) / 2; cp++)
            for (int t = 0; t < kk; t++) {
                const uint16_t *wa = w16 + ((size_t)oc * c + 2 * cp) * kk + t;
                w2[(size_t)oc * r2 + (size_t)cp * kk + t] = pair(*wa, 2 * cp + 1 < c ? wa[kk] : 0);
            }
}

void dt_c16_weight_pairs_t(const uint16_t *w16, int o, int c, int kk, uint32_t *wt2) {
    int rb = (o + 1) / 2 * kk;
    for (int ic = 0; ic < c; ic++)
        for (int op = 0; op < (o + 1) / 2; op++)
            for (int t = 0; t < kk; t++) {
                const uint16_t *wa = w16 + ((size_t)(2 * op) * c + ic) * kk + t;
                uint16_t        hi = 2 * op + 1 < o ? wa[(size_t)c * kk] : 0;
                wt2[(size_t)ic * rb + (size_t)op * kk + t] = pair(*wa, hi);
            }
}

// ---------------------------------------------------------------------- kernels

// The columns [j, j + width) of rows [o0, o0 + nrows), width < 16, in scalar code (the
// same products and fp32 sums; no denormal flush).
static void narrow_columns(const uint32_t *src, const int *off, int R, const uint32_t *w2, int o0,
                           int nrows, int j, int width, float *out, size_t out_ld) {
    for (int o = o0; o < o0 + nrows; o++)
        for (int x = j; x < j + width; x++) {
            float acc = 0.0f;
            for (int r = 0; r < R; r++) {
                uint32_t a = w2[(size_t)o * R + r], b = src[off[r] + x];
                acc += lo_f(a) * lo_f(b) + hi_f(a) * hi_f(b);
            }
            out[(size_t)o * out_ld + x] = acc;
        }
}

#if C16_X86
#define PRAGMA_(x) _Pragma(#x)
#define UNROLL(n)  PRAGMA_(GCC unroll n)

// Rows [o0, o0 + NO) x columns [j, j + 16 NV) of dt_c16_shifted; NO, NV constants.
// clang-format off
#define DEFINE_FWD(name, NO, NV)                                                              \
    TARGET static inline __attribute__((always_inline)) void name(                           \
        const uint32_t *restrict src, const int *restrict off, int R,                        \
        const uint32_t *restrict w2, int o0, int j, float *restrict out, size_t out_ld) {    \
        __m512 acc[NO][NV];                                                                  \
        UNROLL(8) for (int o = 0; o < NO; o++) UNROLL(3) for (int v = 0; v < NV; v++)       \
            acc[o][v] = _mm512_setzero_ps();                                                 \
        const uint32_t *wr = w2 + (size_t)o0 * R;                                            \
        for (int r = 0; r < R; r++) {                                                        \
            const uint32_t *xr = src + off[r] + j;                                           \
            __m512i         x[NV];                                                           \
            UNROLL(3) for (int v = 0; v < NV; v++) x[v] = _mm512_loadu_si512(xr + 16 * v);   \
            UNROLL(8) for (int o = 0; o < NO; o++) {                                         \
                __m512i wv = _mm512_set1_epi32((int)wr[(size_t)o * R + r]);                  \
                UNROLL(3) for (int v = 0; v < NV; v++)                                       \
                    acc[o][v] = _mm512_dpbf16_ps(acc[o][v], (__m512bh)wv, (__m512bh)x[v]);   \
            }                                                                                \
        }                                                                                    \
        UNROLL(8) for (int o = 0; o < NO; o++) UNROLL(3) for (int v = 0; v < NV; v++)       \
            _mm512_storeu_ps(out + (size_t)(o0 + o) * out_ld + j + 16 * v, acc[o][v]);       \
    }
// clang-format on
DEFINE_FWD(fwd_8x3, 8, 3)
DEFINE_FWD(fwd_8x1, 8, 1)
DEFINE_FWD(fwd_1x3, 1, 3)
DEFINE_FWD(fwd_1x1, 1, 1)

TARGET void dt_c16_shifted(const uint32_t *src, const int *off, int R, const uint32_t *w2, int rows,
                           int n, float *out, size_t out_ld) {
    for (int o0 = 0; o0 < rows;) {
        bool full = rows - o0 >= 8;
        int  nr = full ? 8 : 1, j = 0;
        if (n < 16) {
            narrow_columns(src, off, R, w2, o0, nr, 0, n, out, out_ld);
            o0 += nr;
            continue;
        }
        for (; j + 48 <= n; j += 48)
            if (full)
                fwd_8x3(src, off, R, w2, o0, j, out, out_ld);
            else
                fwd_1x3(src, off, R, w2, o0, j, out, out_ld);
        for (; j < n; j += 16) { // the last block moved back to end at n (equal values)
            int jj = j + 16 <= n ? j : n - 16;
            if (full)
                fwd_8x1(src, off, R, w2, o0, jj, out, out_ld);
            else
                fwd_1x1(src, off, R, w2, o0, jj, out, out_ld);
        }
        o0 += nr;
    }
}

// The sums of v[0..7], in a fixed tree: 512 -> 256 -> 128 bits per vector across pairs
// of vectors, then within 128-bit lanes. Sum k lands in lane 4k (k < 4) or 4(k-4) + 1.
TARGET static inline __attribute__((always_inline)) __m512 reduce8(const __m512 *v) {
    __m512 s[4], u[2];
    for (int p = 0; p < 4; p++)
        s[p] = _mm512_add_ps(_mm512_shuffle_f32x4(v[2 * p], v[2 * p + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                             _mm512_shuffle_f32x4(v[2 * p], v[2 * p + 1], _MM_SHUFFLE(3, 2, 3, 2)));
    for (int q = 0; q < 2; q++)
        u[q] = _mm512_add_ps(_mm512_shuffle_f32x4(s[2 * q], s[2 * q + 1], _MM_SHUFFLE(2, 0, 2, 0)),
                             _mm512_shuffle_f32x4(s[2 * q], s[2 * q + 1], _MM_SHUFFLE(3, 1, 3, 1)));
    __m512 w = _mm512_add_ps(_mm512_shuffle_ps(u[0], u[1], _MM_SHUFFLE(1, 0, 1, 0)),
                             _mm512_shuffle_ps(u[0], u[1], _MM_SHUFFLE(3, 2, 3, 2)));
    return _mm512_add_ps(_mm512_shuffle_ps(w, w, _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm512_shuffle_ps(w, w, _MM_SHUFFLE(3, 1, 3, 1)));
}

// dw rows [o0, o0 + NO) x columns [r0, r0 + NR) of dt_c16_shifted_nt; NO * NR a
// multiple of 8 or less than 8.
// clang-format off
#define DEFINE_NT(name, NO, NR)                                                               \
    TARGET static inline __attribute__((always_inline)) void name(                           \
        const uint16_t *restrict a, size_t a_ld, int o0, const uint16_t *restrict src,       \
        const int *restrict off, int r0, int n, float *restrict dw, int R) {                 \
        __m512          acc[NO * NR];                                                        \
        const uint16_t *ar[NO], *xr[NR];                                                     \
        UNROLL(4) for (int o = 0; o < NO; o++) ar[o] = a + (size_t)(o0 + o) * a_ld;          \
        UNROLL(6) for (int q = 0; q < NR; q++) xr[q] = src + off[r0 + q];                    \
        UNROLL(24) for (int i = 0; i < NO * NR; i++) acc[i] = _mm512_setzero_ps();           \
        int j = 0;                                                                           \
        for (; j + 32 <= n; j += 32) {                                                       \
            __m512i av[NO], xv[NR];                                                          \
            UNROLL(4) for (int o = 0; o < NO; o++) av[o] = _mm512_loadu_si512(ar[o] + j);    \
            UNROLL(6) for (int q = 0; q < NR; q++) xv[q] = _mm512_loadu_si512(xr[q] + j);    \
            UNROLL(4) for (int o = 0; o < NO; o++) UNROLL(6) for (int q = 0; q < NR; q++)   \
                acc[o * NR + q] = _mm512_dpbf16_ps(acc[o * NR + q], (__m512bh)av[o],         \
                                                   (__m512bh)xv[q]);                         \
        }                                                                                    \
        if (j < n) {                                                                         \
            __mmask32 m = (__mmask32)((1ull << (n - j)) - 1);                                \
            __m512i   av[NO], xv[NR];                                                        \
            UNROLL(4) for (int o = 0; o < NO; o++) av[o] = _mm512_maskz_loadu_epi16(m, ar[o] + j); \
            UNROLL(6) for (int q = 0; q < NR; q++) xv[q] = _mm512_maskz_loadu_epi16(m, xr[q] + j); \
            UNROLL(4) for (int o = 0; o < NO; o++) UNROLL(6) for (int q = 0; q < NR; q++)   \
                acc[o * NR + q] = _mm512_dpbf16_ps(acc[o * NR + q], (__m512bh)av[o],         \
                                                   (__m512bh)xv[q]);                         \
        }                                                                                    \
        nt_store(acc, NO, NR, o0, r0, dw, R);                                                \
    }
// clang-format on

// Adds the sums of the block's accumulators (index o * nr + q) into dw[o0 + o][r0 + q].
TARGET static inline __attribute__((always_inline)) void
nt_store(const __m512 *acc, int no, int nr, int o0, int r0, float *dw, int R) {
    int   n = no * nr, i = 0;
    float s[16];
    for (; i + 8 <= n; i += 8) {
        _mm512_storeu_ps(s, reduce8(acc + i));
        for (int k = 0; k < 8; k++) {
            int e = i + k;
            dw[(size_t)(o0 + e / nr) * R + r0 + e % nr] += s[k < 4 ? 4 * k : 4 * (k - 4) + 1];
        }
    }
    for (; i < n; i++)
        dw[(size_t)(o0 + i / nr) * R + r0 + i % nr] += _mm512_reduce_add_ps(acc[i]);
}

DEFINE_NT(nt_4x6, 4, 6)
DEFINE_NT(nt_4x1, 4, 1)
DEFINE_NT(nt_1x6, 1, 6)
DEFINE_NT(nt_1x1, 1, 1)

TARGET void dt_c16_shifted_nt(const uint16_t *a, size_t a_ld, int rows, const uint16_t *src,
                              const int *off, int R, int n, float *dw) {
    int o0 = 0;
    for (; o0 + 4 <= rows; o0 += 4) {
        int r0 = 0;
        for (; r0 + 6 <= R; r0 += 6)
            nt_4x6(a, a_ld, o0, src, off, r0, n, dw, R);
        for (; r0 < R; r0++)
            nt_4x1(a, a_ld, o0, src, off, r0, n, dw, R);
    }
    for (; o0 < rows; o0++) {
        int r0 = 0;
        for (; r0 + 6 <= R; r0 += 6)
            nt_1x6(a, a_ld, o0, src, off, r0, n, dw, R);
        for (; r0 < R; r0++)
            nt_1x1(a, a_ld, o0, src, off, r0, n, dw, R);
    }
}

#else // no AVX-512 kernels in this build: the same sums in scalar code (never chosen by
      // conv2d.c, since dt_c16_usable() is false; kept so the file links everywhere)

void dt_c16_shifted(const uint32_t *src, const int *off, int R, const uint32_t *w2, int rows, int n,
                    float *out, size_t out_ld) {
    narrow_columns(src, off, R, w2, 0, rows, 0, n, out, out_ld);
}

void dt_c16_shifted_nt(const uint16_t *a, size_t a_ld, int rows, const uint16_t *src,
                       const int *off, int R, int n, float *dw) {
    for (int o = 0; o < rows; o++)
        for (int r = 0; r < R; r++) {
            float acc = 0.0f;
            for (int j = 0; j < n; j++)
                acc +=
                    dt_bf16_to_f32_1(a[(size_t)o * a_ld + j]) * dt_bf16_to_f32_1(src[off[r] + j]);
            dw[(size_t)o * R + r] += acc;
        }
}
#endif
