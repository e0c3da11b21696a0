// conv16.c: bf16 shifted GEMMs for stride-1 convolutions (nn/conv16.h says what each
// computes; these are the avx512bf16 target's rows behind its dt_c16_* entry points).
//
// dt_k16_shifted is shifted.c's forward kernel with VDPBF16PS: 8 output rows x 48
// columns are 24 accumulators in AVX-512 registers; each pair-row r loads 3 vectors of 16
// pair words and broadcasts 8 weight words for 24 VDPBF16PS, i.e. 2 x 24 x 16 products.
// A convolution's forward reads the input's pair words at the shifts of (channel pair,
// ki, kj); its input gradient is the same kernel over the output gradient's pair words
// (with zero margins) at negative shifts, with the weights transposed (conv2d.c).
//
// dt_k16_shifted_tn (weight gradient) sums over positions, so it pairs neighbouring
// positions: the transposed gradient dwt[r][o] keeps 12 rows r x 32 output channels in
// 24 accumulators; each position pair m broadcasts the 32-bit word of two neighbouring
// input values at each of the 12 shifts and loads 2 vectors of the output gradient's
// position-pair words (channels across the lanes, dt_k16_rows_to_pair_cols: rounded,
// paired and transposed 16 x 16 words at a time) for 24 VDPBF16PS; no reduction across
// lanes is needed, and every input load is a broadcast, whatever its alignment.
#include "kernels/avx512bf16/bf16k.h"
#include "kernels/avx512bf16/simd16.h"
#include "kernels/half.h"

#include <immintrin.h>
#include <string.h>

#define TARGET __attribute__((target("avx512f,avx512bw,avx512bf16")))

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
        __m512i w = _mm512_srli_epi32(dt_round_bf16_hi(_mm512_loadu_ps(a + j)), 16);
        if (b)
            w = _mm512_or_si512(w, dt_round_bf16_hi(_mm512_loadu_ps(b + j)));
        _mm512_storeu_si512(out + j, w);
    }
    for (; j < n; j++)
        out[j] = pair(dt_f32_to_bf16_1(a[j]), b ? dt_f32_to_bf16_1(b[j]) : 0);
}

TARGET static void bf16_row(const float *a, int n, uint16_t *out) {
    int j = 0;
    for (; j + 16 <= n; j += 16) {
        __m512i r = _mm512_srli_epi32(dt_round_bf16_hi(_mm512_loadu_ps(a + j)), 16);
        _mm256_storeu_si256((__m256i *)(void *)(out + j), _mm512_cvtepi32_epi16(r));
    }
    for (; j < n; j++)
        out[j] = dt_f32_to_bf16_1(a[j]);
}
TARGET void dt_k16_pack_pairs(const float *x, int c, int h, int w, int pad, uint32_t *x2) {
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

TARGET void dt_k16_pack_plain(const float *x, int c, int h, int w, int pad, uint16_t *xb) {
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

TARGET void dt_k16_rows_to_pairs(const float *g, size_t g_ld, int rows, int n, int margin,
                                 size_t ld2, uint32_t *g2) {
    for (int rp = 0; rp < (rows + 1) / 2; rp++) {
        uint32_t    *o = g2 + (size_t)rp * ld2;
        const float *a = g + (size_t)(2 * rp) * g_ld, *b = 2 * rp + 1 < rows ? a + g_ld : NULL;
        memset(o, 0, sizeof(uint32_t) * (size_t)margin);
        pair_row(a, b, n, o + margin);
        memset(o + margin + n, 0, sizeof(uint32_t) * (ld2 - (size_t)margin - (size_t)n));
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

#define PRAGMA_(x) _Pragma(#x)
#define UNROLL(n)  PRAGMA_(GCC unroll n)

// Rows [o0, o0 + NO) x columns [j, j + 16 NV) of dt_k16_shifted; NO, NV constants.
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

TARGET void dt_k16_shifted(const uint32_t *src, const int *off, int R, const uint32_t *w2, int rows,
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

// dt_k16_rows_to_pair_cols, and with g2 also dt_k16_rows_to_pairs' words from the same
// loads and roundings: the words of row pair (2i, 2i+1) are the first row's bf16 in the
// low halves and the second's in the high halves.
TARGET static void pair_cols_and_pairs(const float *g, size_t g_ld, int rows, int n, uint32_t *gt,
                                       int ldt, uint32_t *g2, int margin, size_t ld2) {
    // 16-bit lanes of (lo, hi), 32 floats' bf16 halves: word i = (lane 4i+1, lane 4i+3)
    __m512i pick;
    {
        uint16_t ix[32];
        for (int i = 0; i < 16; i++) {
            ix[2 * i]     = (uint16_t)(4 * i + 1);
            ix[2 * i + 1] = (uint16_t)(4 * i + 3);
        }
        memcpy(&pick, ix, sizeof pick);
    }
    int mp = (n + 1) / 2;
    for (int o0 = 0; o0 < ldt; o0 += 16)
        for (int m0 = 0; m0 < mp; m0 += 16) {
            int       p0 = 2 * m0, left = n - p0;
            __mmask16 k0 = left >= 16 ? 0xffff : (__mmask16)((1u << left) - 1);
            __mmask16 k1 = left >= 32   ? 0xffff
                           : left <= 16 ? 0
                                        : (__mmask16)((1u << (left - 16)) - 1);
            __m512i   r[16], rlo = _mm512_setzero_si512(), rhi = rlo;
            for (int i = 0; i < 16; i++) {
                if (o0 + i >= rows) {
                    r[i] = _mm512_setzero_si512();
                    continue;
                }
                const float *row = g + (size_t)(o0 + i) * g_ld + p0;
                __m512i      lo  = dt_round_bf16_hi(_mm512_maskz_loadu_ps(k0, row));
                __m512i      hi  = dt_round_bf16_hi(_mm512_maskz_loadu_ps(k1, row + 16));
                if (g2 && i % 2 == 0) {
                    rlo = lo, rhi = hi;
                } else if (g2) { // rows o0 + i - 1 and o0 + i: pair row (o0 + i) / 2
                    uint32_t *o  = g2 + (size_t)((o0 + i) / 2) * ld2 + margin + p0;
                    __m512i   hm = _mm512_set1_epi32((int)0xffff0000u);
                    _mm512_mask_storeu_epi32(
                        o, k0,
                        _mm512_or_si512(_mm512_srli_epi32(rlo, 16), _mm512_and_si512(lo, hm)));
                    _mm512_mask_storeu_epi32(
                        o + 16, k1,
                        _mm512_or_si512(_mm512_srli_epi32(rhi, 16), _mm512_and_si512(hi, hm)));
                }
                r[i] = _mm512_permutex2var_epi16(lo, pick, hi);
            }
            if (g2 && rows - o0 > 0 && rows - o0 < 16 && (rows - o0) % 2) { // a lone last row
                uint32_t *o = g2 + (size_t)((rows - 1) / 2) * ld2 + margin + p0;
                _mm512_mask_storeu_epi32(o, k0, _mm512_srli_epi32(rlo, 16));
                _mm512_mask_storeu_epi32(o + 16, k1, _mm512_srli_epi32(rhi, 16));
            }
            dt_transpose16_epi32(r);
            int nm = mp - m0 < 16 ? mp - m0 : 16;
            for (int i = 0; i < nm; i++)
                _mm512_storeu_si512(gt + (size_t)(m0 + i) * ldt + o0, r[i]);
        }
    for (int rp = 0; g2 && rp < (rows + 1) / 2; rp++) { // the margins
        uint32_t *o = g2 + (size_t)rp * ld2;
        memset(o, 0, sizeof(uint32_t) * (size_t)margin);
        memset(o + margin + n, 0, sizeof(uint32_t) * (ld2 - (size_t)margin - (size_t)n));
    }
}

TARGET void dt_k16_rows_to_pair_cols(const float *g, size_t g_ld, int rows, int n, uint32_t *gt,
                                     int ldt) {
    pair_cols_and_pairs(g, g_ld, rows, n, gt, ldt, NULL, 0, 0);
}

TARGET void dt_k16_rows_to_both(const float *g, size_t g_ld, int rows, int n, uint32_t *gt, int ldt,
                                int margin, size_t ld2, uint32_t *g2) {
    pair_cols_and_pairs(g, g_ld, rows, n, gt, ldt, g2, margin, ld2);
}

// dwt rows [r0, r0 + RB) x columns [o0, o0 + 16 NV) of dt_k16_shifted_tn.
// clang-format off
#define DEFINE_TN(name, NV, RB)                                                               \
    TARGET static inline __attribute__((always_inline)) void name(                           \
        const uint16_t *restrict src, const int *restrict off, int r0, int n,                \
        const uint32_t *restrict gt, int ldt, int o0, float *restrict dwt) {                 \
        __m512          acc[RB][NV];                                                         \
        const uint16_t *xr[RB];                                                              \
        UNROLL(12) for (int q = 0; q < RB; q++) xr[q] = src + off[r0 + q];                   \
        UNROLL(12) for (int q = 0; q < RB; q++) UNROLL(2) for (int v = 0; v < NV; v++)      \
            acc[q][v] = _mm512_setzero_ps();                                                 \
        int m = 0;                                                                           \
        for (; 2 * m + 1 < n; m++) {                                                         \
            const uint32_t *gr = gt + (size_t)m * ldt + o0;                                  \
            __m512i         gv[NV];                                                          \
            UNROLL(2) for (int v = 0; v < NV; v++) gv[v] = _mm512_loadu_si512(gr + 16 * v);  \
            UNROLL(12) for (int q = 0; q < RB; q++) {                                        \
                uint32_t wd;                                                                 \
                memcpy(&wd, xr[q] + 2 * m, sizeof wd);                                       \
                __m512i xv = _mm512_set1_epi32((int)wd);                                     \
                UNROLL(2) for (int v = 0; v < NV; v++)                                       \
                    acc[q][v] = _mm512_dpbf16_ps(acc[q][v], (__m512bh)xv, (__m512bh)gv[v]);  \
            }                                                                                \
        }                                                                                    \
        if (n & 1) { /* the last position alone: the high halves are zero */                \
            const uint32_t *gr = gt + (size_t)m * ldt + o0;                                  \
            __m512i         gv[NV];                                                          \
            UNROLL(2) for (int v = 0; v < NV; v++) gv[v] = _mm512_loadu_si512(gr + 16 * v);  \
            UNROLL(12) for (int q = 0; q < RB; q++) {                                        \
                __m512i xv = _mm512_set1_epi32((int)xr[q][2 * m]);                           \
                UNROLL(2) for (int v = 0; v < NV; v++)                                       \
                    acc[q][v] = _mm512_dpbf16_ps(acc[q][v], (__m512bh)xv, (__m512bh)gv[v]);  \
            }                                                                                \
        }                                                                                    \
        UNROLL(12) for (int q = 0; q < RB; q++) UNROLL(2) for (int v = 0; v < NV; v++) {    \
            float *d = dwt + (size_t)(r0 + q) * ldt + o0 + 16 * v;                            \
            _mm512_storeu_ps(d, _mm512_add_ps(_mm512_loadu_ps(d), acc[q][v]));               \
        }                                                                                    \
    }
// clang-format on
DEFINE_TN(tn_2x12, 2, 12)
DEFINE_TN(tn_2x1, 2, 1)
DEFINE_TN(tn_1x12, 1, 12)
DEFINE_TN(tn_1x1, 1, 1)

TARGET void dt_k16_shifted_tn(const uint16_t *src, const int *off, int R, int n, const uint32_t *gt,
                              int ldt, float *dwt) {
    for (int o0 = 0; o0 < ldt;) {
        bool two = ldt - o0 >= 32;
        int  r0  = 0;
        for (; r0 + 12 <= R; r0 += 12)
            if (two)
                tn_2x12(src, off, r0, n, gt, ldt, o0, dwt);
            else
                tn_1x12(src, off, r0, n, gt, ldt, o0, dwt);
        for (; r0 < R; r0++)
            if (two)
                tn_2x1(src, off, r0, n, gt, ldt, o0, dwt);
            else
                tn_1x1(src, off, r0, n, gt, ldt, o0, dwt);
        o0 += two ? 32 : 16;
    }
}
