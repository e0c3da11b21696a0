// conv_cl.h: Conv2d kernels with channels in the vector lanes (conv_cl.c), for the small
// images of the ResNet workload, and what they share with their Winograd forms
// (conv_wino.c): the AVX-512 register blocks, the in-register transposes and row copies,
// and the Winograd entry points. The avx512 target's conv2d rows (fill.c); internal to
// src/kernels/avx512.
#ifndef DTRAIN_KERNELS_AVX512_CONV_CL_H
#define DTRAIN_KERNELS_AVX512_CONV_CL_H

#include "core/simd.h"
#include "kernels/table.h"

#include <stdbool.h>
#include <stddef.h>

#include <stdlib.h>
#include <string.h>

// Which parts the kernels take: forward needs groups 1 and cout a multiple of 16; the
// input gradient needs cin a multiple of 16 too; the weight gradient cout a multiple
// of 16 and cin a multiple of 8, or a 1-channel 3x3 stride-1 stem of rows up to 32
// wide (w the input's width) without the input gradient.
bool dt_kcl_forward_ok(const dt_kconv *p);
bool dt_kcl_backward_ok(const dt_kconv *p, int w, bool input_grad);
// Scratch in floats for either direction.
size_t dt_kcl_scratch(const dt_kconv *p, int h, int w);
// As the conv2d rows (nn/ops.h's dt_nn_conv2d_forward / _backward).
void dt_kcl_forward(const dt_kconv *p, int n, int h, int w, const float *x, const float *wt,
                    const float *b, float *y, float *scratch);
void dt_kcl_backward(const dt_kconv *p, int n, int h, int w, const float *x, const float *wt,
                     const float *dy, float *dx, float *dw, float *db, float *scratch);

// The kernels are AVX-512 code: a broadcast must be one load (vbroadcastss from memory
// or an FMA's embedded broadcast), since a broadcast from a register takes a slot of
// the vector pipes the FMAs need, and GCC's generic vectors give the register form.
// Elsewhere (other compilers, other CPUs) the _ok functions say no.
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(DT_NO_CONV_CL)
#include <immintrin.h>
#define CL_KERNELS 1
#define CL_TARGET  __attribute__((target("avx512f,avx512vl,avx512dq,avx512bw,avx2,fma")))
#define BCAST(ptr) ((dt_v16f)_mm512_set1_ps(*(ptr)))
// (intrinsics rather than simd.h's helpers, which clang will not inline into AVX-512
// functions: they return 64-byte vectors without the target's ABI)
#define LOAD16(ptr)     ((dt_v16f)_mm512_loadu_ps(ptr))
#define STORE16(ptr, v) _mm512_storeu_ps((ptr), (__m512)(v))
#define ZERO16()        ((dt_v16f)_mm512_setzero_ps())
#else
#define LOAD16(ptr)     dt_load16(ptr)
#define STORE16(ptr, v) dt_store16((ptr), (v))
#define ZERO16()        dt_splat16(0.0f)
#define CL_KERNELS      0
#define CL_TARGET
#define BCAST(ptr) dt_splat16(*(ptr))
#endif

// True when choice setting `name` (auto|0|1) holds `value` ("0" or "1"); a bad value
// warns once per call site's setting and counts as auto.
static inline bool getenv_is(const char *name, const char *value) {
    int c = 0;
    if (dt_setting_choice(name, &c) != DT_OK) {
        DT_WARN("nn", "%s; using auto", dt_last_error());
        dt_clear_error();
        return false;
    }
    return (c == 1 && strcmp(value, "0") == 0) || (c == 2 && strcmp(value, "1") == 0);
}

#define PRAGMA_(x) _Pragma(#x)
#define UNROLL(n)  PRAGMA_(GCC unroll n)

// The input gradient of a stride-1 convolution is the stride-1 convolution of the
// output gradient with the weights flipped and transposed (cout <-> cin) and padding
// k - 1 - p: Winograd takes it when that convolution fits.
static inline dt_kconv transposed_conv(const dt_kconv *p) {
    dt_kconv t = *p;
    t.cin      = p->cout;
    t.cout     = p->cin;
    t.ph       = p->kh - 1 - p->ph;
    t.pw       = p->kw - 1 - p->pw;
    t.bias     = false;
    return t;
}

// One register block: tile[p][16*V] = sum over taps t and channels c < K of
// src[toff[t] + c*cst + p] * wk[(tw[t]*K + c)*N + lane]. P and V are constants in
// every instance, so the P*V accumulators stay in registers.
// clang-format off
#define DEFINE_CORE(name, P, V)                                                               \
    CL_TARGET static inline __attribute__((always_inline)) void name(                                \
        const float *restrict src, const int *restrict toff, const int *restrict tw, int nt, \
        int K, size_t cst, const float *restrict wk, int N, float *restrict tile) {          \
        dt_v16f acc[P][V];                                                                   \
        UNROLL(28) for (int q = 0; q < P; q++) UNROLL(4) for (int v = 0; v < V; v++)         \
            acc[q][v] = ZERO16();                                                    \
        for (int t = 0; t < nt; t++) {                                                       \
            const float *s  = src + toff[t];                                                 \
            const float *wr = wk + (size_t)tw[t] * K * N;                                    \
            for (int c = 0; c < K; c++, s += cst, wr += N) {                                 \
                dt_v16f wv[V];                                                               \
                UNROLL(4) for (int v = 0; v < V; v++) wv[v] = LOAD16(wr + 16 * v);        \
                UNROLL(28) for (int q = 0; q < P; q++) {                                     \
                    dt_v16f xb = BCAST(s + q);                                           \
                    UNROLL(4) for (int v = 0; v < V; v++) acc[q][v] += xb * wv[v];           \
                }                                                                            \
            }                                                                                \
        }                                                                                    \
        UNROLL(28) for (int q = 0; q < P; q++) UNROLL(4) for (int v = 0; v < V; v++)         \
            STORE16(tile + (q * V + v) * 16, acc[q][v]);                                  \
    }

// clang-format on
DEFINE_CORE(core_28x1, 28, 1)
DEFINE_CORE(core_16x1, 16, 1)
DEFINE_CORE(core_14x1, 14, 1)
DEFINE_CORE(core_7x1, 7, 1)
DEFINE_CORE(core_4x1, 4, 1)
DEFINE_CORE(core_2x1, 2, 1)
DEFINE_CORE(core_1x1, 1, 1)
DEFINE_CORE(core_14x2, 14, 2)
DEFINE_CORE(core_8x2, 8, 2)
DEFINE_CORE(core_7x2, 7, 2)
DEFINE_CORE(core_4x2, 4, 2)
DEFINE_CORE(core_2x2, 2, 2)
DEFINE_CORE(core_1x2, 1, 2)

// Two output rows of 7 pixels at once (the 7x7 images): the same weights feed two
// sources d2 floats apart, so each weight vector loaded serves 14 pixels; tile rows
// 0-6 are the first row's pixels, 16-22 the second's (so each row stores as a tile).
// clang-format off
#define DEFINE_CORE_2ROWS(name, P, V)                                                         \
    CL_TARGET static inline __attribute__((always_inline)) void name(                        \
        const float *restrict src, size_t d2, const int *restrict toff, int nt, int K,       \
        size_t cst, const float *restrict wk, int N, float *restrict tile) {                 \
        dt_v16f acc[2][P][V];                                                                \
        UNROLL(2) for (int r = 0; r < 2; r++) UNROLL(7) for (int q = 0; q < P; q++)          \
            UNROLL(2) for (int v = 0; v < V; v++) acc[r][q][v] = ZERO16();           \
        for (int t = 0; t < nt; t++) {                                                       \
            const float *s  = src + toff[t], *s2 = s + d2;                                   \
            const float *wr = wk + (size_t)t * K * N;                                        \
            for (int c = 0; c < K; c++, s += cst, s2 += cst, wr += N) {                      \
                dt_v16f wv[V];                                                               \
                UNROLL(2) for (int v = 0; v < V; v++) wv[v] = LOAD16(wr + 16 * v);        \
                UNROLL(7) for (int q = 0; q < P; q++) {                                      \
                    dt_v16f xb = BCAST(s + q), xb2 = BCAST(s2 + q);                          \
                    UNROLL(2) for (int v = 0; v < V; v++) {                                  \
                        acc[0][q][v] += xb * wv[v];                                          \
                        acc[1][q][v] += xb2 * wv[v];                                         \
                    }                                                                        \
                }                                                                            \
            }                                                                                \
        }                                                                                    \
        UNROLL(2) for (int r = 0; r < 2; r++) UNROLL(7) for (int q = 0; q < P; q++)          \
            UNROLL(2) for (int v = 0; v < V; v++)                                            \
                STORE16(tile + ((16 * r + q) * V + v) * 16, acc[r][q][v]);                \
    }

// clang-format on
DEFINE_CORE_2ROWS(core2_7x2, 7, 2)

#define TILE_MAX (32 * 32) // 28 x 16 or 14 x 32 used; the stores read 16-row blocks

// The block for up to `np` pixels with V vectors: runs the largest instance that fits
// and returns how many pixels it covered.
CL_TARGET static inline __attribute__((always_inline)) int
core_run(int V, int np, const float *src, const int *toff, const int *tw, int nt, int K, size_t cst,
         const float *wk, int N, float *tile) {
#define CASE(P, fn)                                                                                \
    if (np >= P) {                                                                                 \
        fn(src, toff, tw, nt, K, cst, wk, N, tile);                                                \
        return P;                                                                                  \
    }
    if (V == 1) {
        CASE(28, core_28x1)
        CASE(16, core_16x1)
        CASE(14, core_14x1)
        CASE(7, core_7x1)
        CASE(4, core_4x1)
        CASE(2, core_2x1)
        CASE(1, core_1x1)
    } else {
        if (np == 15 || np == 16) { // 8 + 8 rather than 14 + a thin block
            core_8x2(src, toff, tw, nt, K, cst, wk, N, tile);
            return 8;
        }
        CASE(14, core_14x2)
        CASE(8, core_8x2)
        CASE(7, core_7x2)
        CASE(4, core_4x2)
        CASE(2, core_2x2)
        CASE(1, core_1x2)
    }
#undef CASE
    return np;
}

// ------------------------------------------------------------------- tile stores

#if CL_KERNELS
// rows 16 x 16 of `in` (rows in_ld floats apart) transposed: out row c (out_ld apart)
// = column c of the block, plus bias[c] (NULL: none); only the first `len` floats of each
// out row are stored. Unpacks within 128-bit lanes, then lane shuffles: 64 shuffles for
// 256 floats where a scalar loop takes a strided load and a store per float.
CL_TARGET static inline __attribute__((always_inline)) void
transpose16(const float *in, size_t in_ld, float *out, size_t out_ld, const float *bias, int len) {
    __m512 r[16], t[16], u[16];
    UNROLL(16) for (int k = 0; k < 16; k++) r[k] = _mm512_loadu_ps(in + (size_t)k * in_ld);
    UNROLL(8) for (int k = 0; k < 8; k++) {
        t[2 * k]     = _mm512_unpacklo_ps(r[2 * k], r[2 * k + 1]);
        t[2 * k + 1] = _mm512_unpackhi_ps(r[2 * k], r[2 * k + 1]);
    }
    UNROLL(4) for (int k = 0; k < 4; k++) {
        __m512d a = _mm512_castps_pd(t[4 * k]), b = _mm512_castps_pd(t[4 * k + 1]),
                c = _mm512_castps_pd(t[4 * k + 2]), d = _mm512_castps_pd(t[4 * k + 3]);
        u[4 * k]     = _mm512_castpd_ps(_mm512_unpacklo_pd(a, c)); // column 4L of lane L
        u[4 * k + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, c)); // 4L + 1
        u[4 * k + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(b, d)); // 4L + 2
        u[4 * k + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(b, d)); // 4L + 3
    }
    __mmask16 m = len >= 16 ? 0xFFFF : (__mmask16)((1u << len) - 1);
    UNROLL(4) for (int c = 0; c < 4; c++) {
        __m512 lo01 = _mm512_shuffle_f32x4(u[c], u[4 + c], 0x44),
               lo23 = _mm512_shuffle_f32x4(u[8 + c], u[12 + c], 0x44),
               hi01 = _mm512_shuffle_f32x4(u[c], u[4 + c], 0xEE),
               hi23 = _mm512_shuffle_f32x4(u[8 + c], u[12 + c], 0xEE);
        __m512 o[4] = {
            _mm512_shuffle_f32x4(lo01, lo23, 0x88), _mm512_shuffle_f32x4(lo01, lo23, 0xDD),
            _mm512_shuffle_f32x4(hi01, hi23, 0x88), _mm512_shuffle_f32x4(hi01, hi23, 0xDD)};
        UNROLL(4) for (int l = 0; l < 4; l++) {
            int    col = 4 * l + c;
            __m512 v   = bias ? _mm512_add_ps(o[l], _mm512_set1_ps(bias[col])) : o[l];
            _mm512_mask_storeu_ps(out + (size_t)col * out_ld, m, v);
        }
    }
}

// n floats from src to dst: rows of 7 to 28 floats, where a memcpy call costs more
// than the copy.
CL_TARGET static inline __attribute__((always_inline)) void copy_row(float *dst, const float *src,
                                                                     int n) {
    int j = 0;
    for (; j + 16 <= n; j += 16)
        _mm512_storeu_ps(dst + j, _mm512_loadu_ps(src + j));
    if (j < n) {
        __mmask16 m = (__mmask16)((1u << (n - j)) - 1);
        _mm512_mask_storeu_ps(dst + j, m, _mm512_maskz_loadu_ps(m, src + j));
    }
}

// A tile of np pixels x `lanes` channels (tile[q*lanes + c]) into rows: channel c's
// pixels go to out + c*out_ld, np of them, plus bias.
CL_TARGET static inline __attribute__((always_inline)) void
store_tile(const float *tile, int np, int lanes, float *out, size_t out_ld, const float *bias) {
    for (int c0 = 0; c0 < lanes; c0 += 16)
        for (int q0 = 0; q0 < np; q0 += 16)
            transpose16(tile + (size_t)q0 * lanes + c0, (size_t)lanes,
                        out + (size_t)c0 * out_ld + q0, out_ld, bias ? bias + c0 : NULL, np - q0);
}

// One input row of w floats, padded by pw zeros each side (wp = w + 2*pw), split into
// sw = 2 phases: padded column X even to ev[X/2], odd to od[X/2]. Masked loads read
// the row in place, zeros where the padding is (a copy into a padded buffer first made
// every load wait on the stores just before it, which the CPU cannot forward).
CL_TARGET static inline __attribute__((always_inline)) void split2(const float *src, int w, int pw,
                                                                   float *ev, float *od) {
    const __m512i ie = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
    const __m512i io = _mm512_set_epi32(31, 29, 27, 25, 23, 21, 19, 17, 15, 13, 11, 9, 7, 5, 3, 1);
    int           wp = w + 2 * pw;
    for (int X0 = 0; X0 < wp; X0 += 32) {
        int nv = wp - X0 < 32 ? wp - X0 : 32, ne = (nv + 1) / 2, no = nv / 2;
        // window lanes l with 0 <= X0 + l - pw < w hold data
        int lo = pw - X0, hi = pw - X0 + w;
        lo         = lo < 0 ? 0 : lo > 32 ? 32 : lo;
        hi         = hi < 0 ? 0 : hi > 32 ? 32 : hi;
        uint64_t m = ((hi >= 32 ? ~0ull : (1ull << hi) - 1) & ~((1ull << lo) - 1)) & 0xFFFFFFFFull;
        const float *p = src + X0 - pw;
        __m512       a = _mm512_maskz_loadu_ps((__mmask16)(m & 0xFFFF), p),
               b       = _mm512_maskz_loadu_ps((__mmask16)(m >> 16), p + 16);
        _mm512_mask_storeu_ps(ev + X0 / 2, (__mmask16)((1u << ne) - 1),
                              _mm512_permutex2var_ps(a, ie, b));
        _mm512_mask_storeu_ps(od + X0 / 2, (__mmask16)((1u << no) - 1),
                              _mm512_permutex2var_ps(a, io, b));
    }
}
#endif

// ---------------------------------------------------------------- Winograd (conv_wino.c)

// Whether Winograd F(2x2, 3x3) fits a convolution (stride-1 3x3, groups 1, cout a
// multiple of 16) and whether it is taken for this image size (DT_CONV_WINO).
bool dt_kwino_fits(const dt_kconv *p);
bool dt_kwino_ok(const dt_kconv *p, int h, int w);
// Whether the input gradient of p (stride 1) runs as a Winograd convolution of dy.
bool dt_kwino_dx(const dt_kconv *p, int h, int w);
// Scratch floats of dt_kwino_forward.
size_t dt_kwino_scratch(const dt_kconv *p, int h, int w);
// As the conv2d forward, for a convolution dt_kwino_fits takes.
void dt_kwino_forward(const dt_kconv *p, int n, int h, int w, const float *x, const float *wt,
                      const float *b, float *y, float *scratch);

// The weight gradient of a convolution dt_kwino_fits takes, through the same
// transforms (and db += the sums of dy when p->bias and db): whether it is taken
// (cin a multiple of 8; DT_CONV_WINO_DW), its scratch floats, the call (dw ADDED to).
bool   dt_kwino_dw_ok(const dt_kconv *p, int h, int w);
size_t dt_kwino_dw_scratch(const dt_kconv *p, int h, int w);
void dt_kwino_dw(const dt_kconv *p, int n, int h, int w, const float *x, const float *dy, float *dw,
                 float *db, float *scratch);

// Both gradients of a stride-1 3x3 convolution for which dt_kwino_dx and
// dt_kwino_dw_ok hold, in one pass over the samples (dx written, dw and db added).
size_t dt_kwino_backward_scratch(const dt_kconv *p, int h, int w);
void   dt_kwino_backward(const dt_kconv *p, int n, int h, int w, const float *x, const float *wt,
                         const float *dy, float *dx, float *dw, float *db, float *scratch);

#endif // DTRAIN_KERNELS_AVX512_CONV_CL_H
