// conv_cl.c: Conv2d with the channels in the vector lanes, for small images and any
// stride (conv_cl.h). The shifted GEMMs of shifted.c put output positions in the lanes;
// on the ResNet's 14x14 and 7x7 images and on stride 2 that wastes lanes (rows of 7 or
// 14 in 16-wide vectors, the wide layout's padding columns) or needs im2col. Here a
// register block is P output pixels x 16*V channels (P*V vectors, up to 28), every
// step loads V weight vectors and broadcasts P input values, so no lane is ever idle
// when the channel count is a multiple of 16.
//
// Forward: the padded input is split into stride phases (sh*sw planes per channel:
// padded pixel (Y, X) goes to plane (Y % sh, X % sw) at (Y / sh, X / sw)), so the
// inputs of consecutive output pixels are consecutive floats for every tap and every
// stride, and a broadcast is one load at a constant offset. Input gradient: the
// transposed convolution, one pass per phase of the input pixels (those with equal
// (Y % sh, X % sw) take the same taps and read consecutive output-gradient pixels),
// from the output gradient padded with zeros. Weight gradient: for each tap and block
// of input channels, a reduction over the output pixels with the output channels in
// the lanes, reading channels-last copies of the input and of the output gradient.
//
// Stride-1 3x3 convolutions (forward, and the input gradient as a convolution of dy)
// go through Winograd F(2x2, 3x3) instead, on the same register blocks (see below); a
// 1-channel 3x3 stem has its own kernel with pixels in the lanes.
//
// Sums run in a fixed order (taps, then channels, then pixels row by row; per sample,
// then over samples), so results do not vary from run to run.
#include "nn/conv_cl.h"
#include "core/simd.h"

#include <stdlib.h>
#include <string.h>

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
static bool getenv_is(const char *name, const char *value) {
    int c = 0;
    if (dt_setting_choice(name, &c) != DT_OK) {
        DT_WARN("nn", "%s; using auto", dt_last_error());
        dt_clear_error();
        return false;
    }
    return (c == 1 && strcmp(value, "0") == 0) || (c == 2 && strcmp(value, "1") == 0);
}

static bool cpu_ok(void) {
#if CL_KERNELS
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
           __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512bw");
#else
    return false;
#endif
}

#define PRAGMA_(x) _Pragma(#x)
#define UNROLL(n)  PRAGMA_(GCC unroll n)

bool dt_nn_conv_cl_forward_ok(const dt_nn_conv2d *p) {
    return p->groups == 1 && p->cout % 16 == 0 && cpu_ok();
}

bool dt_nn_conv_cl_backward_ok(const dt_nn_conv2d *p, bool input_grad) {
    return p->groups == 1 && p->cout % 16 == 0 && p->cin % 8 == 0 &&
           (!input_grad || p->cin % 16 == 0) && cpu_ok();
}

#define STEM_LD 48 // the stem's padded rows: 32 lanes + the kernel's 2 extra columns, rounded up

static int out_len(int in, int pad, int k, int stride) {
    return (in + 2 * pad - k) / stride + 1;
}

// The geometry of one call: padded input (hp, wp), its phase planes (hq, wq) and the
// zero-margined output gradient (hg, wg, margin mg).
typedef struct geom {
    int    ho, wo, hp, wp, hq, wq, kk, mg, hg, wg;
    size_t cst; // floats between one channel's phase planes and the next's
    size_t gst; // floats between output-gradient planes
} geom;

static geom geom_of(const dt_nn_conv2d *p, int h, int w) {
    geom g;
    g.ho  = out_len(h, p->ph, p->kh, p->sh);
    g.wo  = out_len(w, p->pw, p->kw, p->sw);
    g.hp  = h + 2 * p->ph;
    g.wp  = w + 2 * p->pw;
    g.hq  = (g.hp + p->sh - 1) / p->sh;
    g.wq  = (g.wp + p->sw - 1) / p->sw;
    g.kk  = p->kh * p->kw;
    g.cst = (size_t)p->sh * p->sw * g.hq * g.wq;
    g.mg  = (p->kh > p->kw ? p->kh : p->kw) + 1;
    g.hg  = g.ho + 2 * g.mg;
    g.wg  = g.wo + 2 * g.mg;
    g.gst = (size_t)g.hg * g.wg;
    return g;
}

static size_t ints_in_floats(size_t n) {
    return (n * sizeof(int) + sizeof(float) - 1) / sizeof(float);
}

static bool wino_fits(const dt_nn_conv2d *p);

// The input gradient of a stride-1 convolution is the stride-1 convolution of the
// output gradient with the weights flipped and transposed (cout <-> cin) and padding
// k - 1 - p: Winograd takes it when that convolution fits.
static dt_nn_conv2d transposed_conv(const dt_nn_conv2d *p) {
    dt_nn_conv2d t = *p;
    t.cin          = p->cout;
    t.cout         = p->cin;
    t.ph           = p->kh - 1 - p->ph;
    t.pw           = p->kw - 1 - p->pw;
    t.bias         = false;
    return t;
}

static bool   wino_dx(const dt_nn_conv2d *p, int h, int w);
static size_t wino_scratch(const dt_nn_conv2d *p, int h, int w);

size_t dt_nn_conv_cl_scratch(const dt_nn_conv2d *p, int h, int w) {
    geom   g     = geom_of(p, h, w);
    size_t wsize = (size_t)g.kk * p->cin * p->cout;
    size_t fwd   = wsize + (size_t)p->cin * g.cst + ints_in_floats(2 * (size_t)g.kk) + g.wp + 64;
    size_t bwd   = 2 * wsize + (size_t)p->cout * g.gst + (size_t)g.ho * g.wo * p->cout +
                 (size_t)g.hp * g.wp * p->cin +
                 ints_in_floats(2 * (size_t)g.kk + (size_t)p->sh * p->sw + 1) +
                 ((size_t)h * w + 16) * p->cin;
    if (p->sh == 1 && p->sw == 1) {
        dt_nn_conv2d t = transposed_conv(p);
        if (t.ph >= 0 && t.pw >= 0 && wino_fits(&t)) {
            size_t d = 3 * wsize + (size_t)p->cout * g.gst + (size_t)g.ho * g.wo * p->cout +
                       (size_t)g.hp * g.wp * p->cin + wino_scratch(&t, g.ho, g.wo);
            bwd = bwd > d ? bwd : d;
        }
    }
    size_t stem = (size_t)g.hp * STEM_LD;
    if (wino_fits(p)) {
        size_t z = wino_scratch(p, h, w);
        stem     = stem > z ? stem : z;
    }
    fwd = fwd > stem ? fwd : stem;
    return fwd > bwd ? fwd : bwd;
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

// ------------------------------------------------------- forward, Winograd F(2x2, 3x3)

// Stride-1 3x3 convolutions as Winograd's F(2x2, 3x3): each 2x2 block of outputs is
// A^T [ (G g G^T) .* (B^T d B) ] A over the 4x4 input patch d, so the channel sums are
// 16 products per 4 outputs instead of 36: 16 GEMMs (one per transformed position xi)
// of the transformed weights U[xi] (cin x cout) and the transformed patches V[xi]
// (tiles x cin), which the register blocks above run with the tiles as "pixels". The
// transforms only add and subtract (B, A) or halve (G, done once per call in double),
// so rounding stays within a few ulps of the direct sum's.
typedef struct wino {
    int    th, tw, T, hx, lx; // tiles down, across, in all; padded input rows, row floats
    size_t u, xp, v, m, ycl;
} wino;

// Where it pays, measured on the ResNet's shapes (Zen 4): everywhere from 16 input
// channels (16->16 at 28x28: 0.83x the direct kernel's time, 32->32 at 14x14: 0.75x,
// 64->64 at 7x7, where 8x8 tiles cover the 7x7 outputs: 0.9x).
// (DT_CONV_WINO=1 takes it for every shape it fits, =0 never.)
static bool wino_fits(const dt_nn_conv2d *p) {
    return CL_KERNELS && p->kh == 3 && p->kw == 3 && p->sh == 1 && p->sw == 1 && p->groups == 1 &&
           p->cout % 16 == 0;
}

static bool wino_ok(const dt_nn_conv2d *p, int h, int w) {
    int tiles = ((h + 2 * p->ph - 1) / 2) * ((w + 2 * p->pw - 1) / 2);
    if (!wino_fits(p) || getenv_is("DT_CONV_WINO", "0"))
        return false;
    return getenv_is("DT_CONV_WINO", "1") || (p->cin >= 16 && tiles >= 16);
}

// Floats between the 16 planes of V and of M: 64 bytes more than their size, so that
// the 16 loads or stores of one tile's transform do not all fall in one cache set (at
// 7x7, 16 tiles x 64 channels is exactly 4 KiB).
static size_t wino_vst(const dt_nn_conv2d *p, int T) {
    return (size_t)p->cin * T + 16;
}
static size_t wino_mst(const dt_nn_conv2d *p, int T) {
    return (size_t)T * p->cout + 16;
}

static wino wino_of(const dt_nn_conv2d *p, int h, int w) {
    wino z;
    int  ho = h + 2 * p->ph - 2, wo = w + 2 * p->pw - 2;
    z.th  = (ho + 1) / 2;
    z.tw  = (wo + 1) / 2;
    z.T   = z.th * z.tw;
    z.hx  = 2 * z.th + 2;
    z.lx  = 2 * z.tw + 2 + 32; // a 32-float window may start at the last tile's column
    z.u   = 0;
    z.xp  = z.u + (size_t)16 * p->cin * p->cout;
    z.v   = z.xp + (size_t)p->cin * z.hx * z.lx + 32;
    z.m   = z.v + 16 * wino_vst(p, z.T);
    z.ycl = z.m + 16 * wino_mst(p, z.T);
    return z;
}

static size_t wino_scratch(const dt_nn_conv2d *p, int h, int w) {
    wino z = wino_of(p, h, w);
    return z.ycl + ((size_t)4 * z.T + 16) * p->cout;
}

static bool wino_dx(const dt_nn_conv2d *p, int h, int w) {
    if (p->sh != 1 || p->sw != 1)
        return false;
    dt_nn_conv2d t  = transposed_conv(p);
    int          ho = h + 2 * p->ph - p->kh + 1, wo = w + 2 * p->pw - p->kw + 1;
    return t.ph >= 0 && t.pw >= 0 && wino_ok(&t, ho, wo);
}

#if CL_KERNELS
CL_TARGET static void wino_forward(const dt_nn_conv2d *p, int n, int h, int w, const float *x,
                                   const float *wt, const float *b, float *y, float *scratch) {
    wino   z   = wino_of(p, h, w);
    int    cin = p->cin, cout = p->cout, ho = h + 2 * p->ph - 2, wo = w + 2 * p->pw - 2;
    int    T = z.T, W2 = 2 * z.tw;
    size_t vst = wino_vst(p, T), mst = wino_mst(p, T);
    float *U = scratch + z.u, *xp = scratch + z.xp, *Vt = scratch + z.v, *M = scratch + z.m,
          *ycl                  = scratch + z.ycl;
    static const double G[4][3] = {{1, 0, 0}, {0.5, 0.5, 0.5}, {0.5, -0.5, 0.5}, {0, 0, 1}};
    for (int o = 0; o < cout; o++) // U[xi][c][o] = (G g G^T)[xi]
        for (int c = 0; c < cin; c++) {
            const float *g = wt + ((size_t)o * cin + c) * 9;
            double       t[4][3];
            for (int a = 0; a < 4; a++)
                for (int j = 0; j < 3; j++)
                    t[a][j] = G[a][0] * g[j] + G[a][1] * g[3 + j] + G[a][2] * g[6 + j];
            for (int a = 0; a < 4; a++)
                for (int bb = 0; bb < 4; bb++)
                    U[((size_t)(a * 4 + bb) * cin + c) * cout + o] =
                        (float)(t[a][0] * G[bb][0] + t[a][1] * G[bb][1] + t[a][2] * G[bb][2]);
        }
    memset(xp, 0, sizeof(float) * ((size_t)cin * z.hx * z.lx + 32));
    int           V = cout % 32 == 0 ? 2 : 1, lanes = 16 * V;
    const int     zero[1] = {0};
    const __m512i i0 = _mm512_set_epi32(0, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0),
                  i1 = _mm512_add_epi32(i0, _mm512_set1_epi32(1)),
                  i2 = _mm512_add_epi32(i0, _mm512_set1_epi32(2)),
                  i3 = _mm512_add_epi32(i0, _mm512_set1_epi32(3));
    for (int s = 0; s < n; s++) {
        const float *xs = x + (size_t)s * cin * h * w;
        for (int c = 0; c < cin; c++)
            for (int i = 0; i < h; i++)
                copy_row(xp + ((size_t)c * z.hx + i + p->ph) * z.lx + p->pw,
                         xs + ((size_t)c * h + i) * w, w);
        // V[xi][c][tile] = (B^T d B)[xi], 16 tiles of a tile row at a time
        for (int c = 0; c < cin; c++)
            for (int ti = 0; ti < z.th; ti++) {
                // columns 2tj..2tj+3 of the patch rows as vectors over 15 tiles (their 32
                // floats are one window; lane 15 is never stored), permuted in registers
                for (int tj0 = 0; tj0 < z.tw; tj0 += 15) {
                    int       len = z.tw - tj0 < 15 ? z.tw - tj0 : 15;
                    __mmask16 m   = (__mmask16)((1u << len) - 1);
                    __m512    cr[4][4];
                    UNROLL(4) for (int r = 0; r < 4; r++) {
                        const float *row = xp + ((size_t)c * z.hx + 2 * ti + r) * z.lx + 2 * tj0;
                        __m512       lo = _mm512_loadu_ps(row), hi = _mm512_loadu_ps(row + 16);
                        __m512       d0 = _mm512_permutex2var_ps(lo, i0, hi),
                               d1       = _mm512_permutex2var_ps(lo, i1, hi),
                               d2       = _mm512_permutex2var_ps(lo, i2, hi),
                               d3       = _mm512_permutex2var_ps(lo, i3, hi);
                        cr[r][0]        = _mm512_sub_ps(d0, d2);
                        cr[r][1]        = _mm512_add_ps(d1, d2);
                        cr[r][2]        = _mm512_sub_ps(d2, d1);
                        cr[r][3]        = _mm512_sub_ps(d1, d3);
                    }
                    float *dst  = Vt + (size_t)c * T + (size_t)ti * z.tw + tj0;
                    size_t xs16 = vst; // between xi planes
                    UNROLL(4) for (int bb = 0; bb < 4; bb++) {
                        _mm512_mask_storeu_ps(dst + (0 * 4 + bb) * xs16, m,
                                              _mm512_sub_ps(cr[0][bb], cr[2][bb]));
                        _mm512_mask_storeu_ps(dst + (1 * 4 + bb) * xs16, m,
                                              _mm512_add_ps(cr[1][bb], cr[2][bb]));
                        _mm512_mask_storeu_ps(dst + (2 * 4 + bb) * xs16, m,
                                              _mm512_sub_ps(cr[2][bb], cr[1][bb]));
                        _mm512_mask_storeu_ps(dst + (3 * 4 + bb) * xs16, m,
                                              _mm512_sub_ps(cr[1][bb], cr[3][bb]));
                    }
                }
            }
        // M[xi][og][tile][lane] = sum_c V[xi][c][tile] * U[xi][c][og*lanes + lane]: the
        // register blocks write their tiles straight into M
        for (int xi = 0; xi < 16; xi++)
            for (int t0 = 0; t0 < T;) {
                int np = 0;
                for (int o0 = 0; o0 < cout; o0 += lanes)
                    np = core_run(V, T - t0, Vt + (size_t)xi * vst + t0, zero, zero, 1, cin,
                                  (size_t)T, U + (size_t)xi * cin * cout + o0, cout,
                                  M + (size_t)xi * mst + (size_t)o0 * T + (size_t)t0 * lanes);
                t0 += np;
            }
        // the 2x2 outputs of each tile, A^T M A, channels-last
        for (int ti = 0; ti < z.th; ti++)
            for (int tj = 0; tj < z.tw; tj++)
                for (int o0 = 0; o0 < cout; o0 += 16) {
                    const float *src = M + (size_t)(o0 / lanes) * lanes * T +
                                       ((size_t)ti * z.tw + tj) * lanes + o0 % lanes;
                    size_t xst = mst;
                    __m512 t[2][4];
                    UNROLL(4) for (int bb = 0; bb < 4; bb++) {
                        __m512 m0 = _mm512_loadu_ps(src + (0 * 4 + bb) * xst),
                               m1 = _mm512_loadu_ps(src + (1 * 4 + bb) * xst),
                               m2 = _mm512_loadu_ps(src + (2 * 4 + bb) * xst),
                               m3 = _mm512_loadu_ps(src + (3 * 4 + bb) * xst);
                        t[0][bb]  = _mm512_add_ps(_mm512_add_ps(m0, m1), m2);
                        t[1][bb]  = _mm512_sub_ps(_mm512_sub_ps(m1, m2), m3);
                    }
                    UNROLL(2) for (int r = 0; r < 2; r++) {
                        float *d = ycl + ((size_t)(2 * ti + r) * W2 + 2 * tj) * cout + o0;
                        _mm512_storeu_ps(d,
                                         _mm512_add_ps(_mm512_add_ps(t[r][0], t[r][1]), t[r][2]));
                        _mm512_storeu_ps(d + cout,
                                         _mm512_sub_ps(_mm512_sub_ps(t[r][1], t[r][2]), t[r][3]));
                    }
                }
        float *ys = y + (size_t)s * cout * ho * wo;
        for (int i = 0; i < ho; i++)
            for (int j0 = 0; j0 < wo; j0 += 16)
                for (int c0 = 0; c0 < cout; c0 += 16)
                    transpose16(ycl + ((size_t)i * W2 + j0) * cout + c0, (size_t)cout,
                                ys + ((size_t)c0 * ho + i) * wo + j0, (size_t)ho * wo,
                                p->bias ? b + c0 : NULL, wo - j0);
    }
}
#endif

// ------------------------------------------------------------------------- forward

// The stem (one input channel, 3x3, stride 1, rows of at most 32 pixels): 9 taps are
// too few to amortise a channels-last tile, so output pixels go in the lanes instead.
// The 9 shifted input rows of an output row (2 vectors each) stay in registers while
// 4 output channels at a time take their 9 weights as broadcasts; rows are stored
// straight into y with masks.

static bool stem_ok(const dt_nn_conv2d *p, int w) {
    return CL_KERNELS && p->cin == 1 && p->kh == 3 && p->kw == 3 && p->sh == 1 && p->sw == 1 &&
           p->cout % 4 == 0 && w + 2 * p->pw - 2 <= 32;
}

#if CL_KERNELS
CL_TARGET static void stem_forward(const dt_nn_conv2d *p, int n, int h, int w, const float *x,
                                   const float *wt, const float *b, float *y, float *xp) {
    int       ho = h + 2 * p->ph - 2, wo = w + 2 * p->pw - 2, hp = h + 2 * p->ph;
    __mmask16 m0 = wo >= 16 ? 0xFFFF : (__mmask16)((1u << wo) - 1),
              m1 = wo > 16 ? (__mmask16)((1u << (wo - 16)) - 1) : 0;
    memset(xp, 0, sizeof(float) * (size_t)hp * STEM_LD);
    for (int s = 0; s < n; s++) {
        for (int i = 0; i < h; i++)
            copy_row(xp + (size_t)(i + p->ph) * STEM_LD + p->pw, x + ((size_t)s * h + i) * w, w);
        float *ys = y + (size_t)s * p->cout * ho * wo;
        for (int i = 0; i < ho; i++) {
            __m512 xv[9][2];
            UNROLL(9) for (int t = 0; t < 9; t++) {
                const float *r = xp + (size_t)(i + t / 3) * STEM_LD + t % 3;
                xv[t][0]       = _mm512_loadu_ps(r);
                xv[t][1]       = _mm512_loadu_ps(r + 16);
            }
            for (int o0 = 0; o0 < p->cout; o0 += 4) {
                __m512 acc[4][2];
                UNROLL(4) for (int k = 0; k < 4; k++) acc[k][0] = acc[k][1] = _mm512_setzero_ps();
                UNROLL(9) for (int t = 0; t < 9; t++) UNROLL(4) for (int k = 0; k < 4; k++) {
                    __m512 wv = _mm512_set1_ps(wt[(size_t)(o0 + k) * 9 + t]);
                    acc[k][0] = _mm512_fmadd_ps(wv, xv[t][0], acc[k][0]);
                    acc[k][1] = _mm512_fmadd_ps(wv, xv[t][1], acc[k][1]);
                }
                UNROLL(4) for (int k = 0; k < 4; k++) {
                    __m512 bo  = _mm512_set1_ps(p->bias ? b[o0 + k] : 0.0f);
                    float *dst = ys + ((size_t)(o0 + k) * ho + i) * wo;
                    _mm512_mask_storeu_ps(dst, m0, _mm512_add_ps(acc[k][0], bo));
                    _mm512_mask_storeu_ps(dst + 16, m1, _mm512_add_ps(acc[k][1], bo));
                }
            }
        }
    }
}
#endif

CL_TARGET void dt_nn_conv_cl_forward(const dt_nn_conv2d *p, int n, int h, int w, const float *x,
                                     const float *wt, const float *b, float *y, float *scratch) {
#if CL_KERNELS
    if (stem_ok(p, w)) {
        stem_forward(p, n, h, w, x, wt, b, y, scratch);
        return;
    }
    if (wino_ok(p, h, w)) {
        wino_forward(p, n, h, w, x, wt, b, y, scratch);
        return;
    }
    geom   g  = geom_of(p, h, w);
    int    kk = g.kk, cin = p->cin, cout = p->cout, sh = p->sh, sw = p->sw;
    float *wk = scratch, *xq = wk + (size_t)kk * cin * cout;
    int   *toff = (int *)(void *)(xq + (size_t)cin * g.cst), *tw = toff + kk;
    // wk[(t*cin + c)*cout + o] = w[o][c][t]
    for (int o = 0; o < cout; o++)
        for (int c = 0; c < cin; c++)
            for (int t = 0; t < kk; t++)
                wk[((size_t)t * cin + c) * cout + o] = wt[((size_t)o * cin + c) * kk + t];
    size_t pl = (size_t)g.hq * g.wq;
    for (int ki = 0; ki < p->kh; ki++)
        for (int kj = 0; kj < p->kw; kj++) {
            int t   = ki * p->kw + kj;
            toff[t] = (int)(((ki % sh) * sw + kj % sw) * pl) + ki / sh * g.wq + kj / sw;
            tw[t]   = t;
        }
    memset(xq, 0, sizeof(float) * (size_t)cin * g.cst); // padding stays zero
    int   V = cout % 32 == 0 ? 2 : 1, lanes = 16 * V;
    float tile[TILE_MAX];
    for (int s = 0; s < n; s++) {
        const float *xs = x + (size_t)s * cin * h * w;
        for (int c = 0; c < cin; c++)
            for (int i = 0; i < h; i++) {
                int          Y   = i + p->ph;
                const float *src = xs + ((size_t)c * h + i) * w;
                float *row = xq + c * g.cst + (size_t)(Y % sh) * sw * pl + (size_t)(Y / sh) * g.wq;
                if (sw == 1)
                    copy_row(row + p->pw, src, w);
                else if (sw == 2) {
                    split2(src, w, p->pw, row, row + pl);
                } else // phase by phase: column j = X - pw with X % sw == rx
                    for (int rx = 0; rx < sw; rx++) {
                        int    j0  = ((rx - p->pw) % sw + sw) % sw;
                        float *dst = row + (size_t)rx * pl + (j0 + p->pw) / sw;
                        for (int j = j0, q = 0; j < w; j += sw, q++)
                            dst[q] = src[j];
                    }
            }
        float *ys = y + (size_t)s * cout * g.ho * g.wo;
        for (int i = 0; i < g.ho; i++) {
            if (V == 2 && g.wo == 7 && i + 1 < g.ho && !getenv_is("DT_CONV_2ROWS", "0")) {
                for (int o0 = 0; o0 < cout; o0 += lanes) {
                    core2_7x2(xq + (size_t)i * g.wq, (size_t)g.wq, toff, kk, cin, g.cst, wk + o0,
                              cout, tile);
                    for (int r = 0; r < 2; r++)
                        store_tile(tile + (size_t)16 * r * lanes, 7, lanes,
                                   ys + ((size_t)o0 * g.ho + i + r) * g.wo, (size_t)g.ho * g.wo,
                                   p->bias ? b + o0 : NULL);
                }
                i++;
                continue;
            }
            for (int j0 = 0; j0 < g.wo;) {
                int np = 0;
                for (int o0 = 0; o0 < cout; o0 += lanes) {
                    np = core_run(V, g.wo - j0, xq + (size_t)i * g.wq + j0, toff, tw, kk, cin,
                                  g.cst, wk + o0, cout, tile);
                    store_tile(tile, np, lanes, ys + ((size_t)o0 * g.ho + i) * g.wo + j0,
                               (size_t)g.ho * g.wo, p->bias ? b + o0 : NULL);
                }
                j0 += np;
            }
        }
    }
#else // never called: dt_nn_conv_cl_forward_ok says no
    (void)p, (void)n, (void)h, (void)w, (void)x, (void)wt, (void)b, (void)y, (void)scratch;
    (void)stem_ok;
#endif
}

// ------------------------------------------------------------------------ backward

// One weight-gradient block: dwt[(t*cin + c0 + r)*cout + o0 + lane] += sum over output
// pixels (i, j) of xcl[((i*sh + ki)*wp + j*sw + kj)*cin + c0 + r] * dycl[(i*wo + j)*cout
// + o0 + lane], r < R.
// clang-format off
#define DEFINE_DW(name, R, V)                                                                 \
    CL_TARGET static inline __attribute__((always_inline)) void name(                                \
        const float *restrict xcl, const float *restrict dycl, const geom *g, int cin,       \
        int cout, int sh, int sw, int ki, int kj, int c0, int o0, float *restrict dst) {     \
        dt_v16f acc[R][V];                                                                   \
        UNROLL(16) for (int r = 0; r < R; r++) UNROLL(4) for (int v = 0; v < V; v++)         \
            acc[r][v] = ZERO16();                                                    \
        size_t xstep = (size_t)sw * cin;                                                     \
        for (int i = 0; i < g->ho; i++) {                                                    \
            const float *xs = xcl + ((size_t)(i * sh + ki) * g->wp + kj) * cin + c0;         \
            const float *gs = dycl + (size_t)i * g->wo * cout + o0;                          \
            for (int j = 0; j < g->wo; j++, xs += xstep, gs += cout) {                       \
                dt_v16f gv[V];                                                               \
                UNROLL(4) for (int v = 0; v < V; v++) gv[v] = LOAD16(gs + 16 * v);        \
                UNROLL(16) for (int r = 0; r < R; r++) {                                     \
                    dt_v16f xb = BCAST(xs + r);                                          \
                    UNROLL(4) for (int v = 0; v < V; v++) acc[r][v] += xb * gv[v];           \
                }                                                                            \
            }                                                                                \
        }                                                                                    \
        UNROLL(16) for (int r = 0; r < R; r++) UNROLL(4) for (int v = 0; v < V; v++) {       \
            float *d = dst + (size_t)r * cout + 16 * v;                                      \
            STORE16(d, LOAD16(d) + acc[r][v]);                                         \
        }                                                                                    \
    }

// clang-format on
DEFINE_DW(dw_16x1, 16, 1)
DEFINE_DW(dw_8x1, 8, 1)
DEFINE_DW(dw_8x2, 8, 2)

CL_TARGET void dt_nn_conv_cl_backward(const dt_nn_conv2d *p, int n, int h, int w, const float *x,
                                      const float *wt, const float *dy, float *dx, float *dw,
                                      float *db, float *scratch) {
#if CL_KERNELS
    geom   g  = geom_of(p, h, w);
    int    kk = g.kk, cin = p->cin, cout = p->cout, sh = p->sh, sw = p->sw;
    size_t wsize = (size_t)kk * cin * cout, hwo = (size_t)g.ho * g.wo;
    float *wdx = scratch, *dwt = wdx + wsize, *dyp = dwt + wsize, *dycl = dyp + cout * g.gst,
          *xcl = dycl + hwo * cout;
    int *toff = (int *)(void *)(xcl + (size_t)g.hp * g.wp * cin), *tw = toff + kk,
        *ph0 = tw + kk; // taps of phase f: [ph0[f], ph0[f + 1])
    // strided input gradient, channels-last (16 pixels of slack for the transposes)
    float *dxcl = (float *)(void *)(ph0 + sh * sw + 1);
    if (dx && wino_dx(p, h, w)) {
        // dx first, as one Winograd convolution of dy; then dw alone below. Scratch:
        // the weight gradient's buffers, the flipped weights, Winograd's.
        dt_nn_conv2d t  = transposed_conv(p);
        float       *wf = xcl + (size_t)g.hp * g.wp * cin, *ws = wf + wsize;
        for (int o = 0; o < cout; o++) // wf[c][o][ki][kj] = w[o][c][kh-1-ki][kw-1-kj]
            for (int c = 0; c < cin; c++)
                for (int t2 = 0; t2 < kk; t2++)
                    wf[((size_t)c * cout + o) * kk + t2] =
                        wt[((size_t)o * cin + c) * kk + kk - 1 - t2];
        wino_forward(&t, n, g.ho, g.wo, dy, wf, NULL, dx, ws);
        dx = NULL;
    }
    if (dx) {
        // wdx[(t*cout + o)*cin + c] = w[o][c][t]
        for (int o = 0; o < cout; o++)
            for (int c = 0; c < cin; c++)
                for (int t = 0; t < kk; t++)
                    wdx[((size_t)t * cout + o) * cin + c] = wt[((size_t)o * cin + c) * kk + t];
        // input pixels with Y % sh == ry and X % sw == rx take taps ki = ry + m*sh,
        // kj = rx + q*sw, reading the output gradient m rows up and q columns left
        int nt = 0;
        for (int ry = 0; ry < sh; ry++)
            for (int rx = 0; rx < sw; rx++) {
                ph0[ry * sw + rx] = nt;
                for (int ki = ry; ki < p->kh; ki += sh)
                    for (int kj = rx; kj < p->kw; kj += sw) {
                        toff[nt] = -(ki - ry) / sh * g.wg - (kj - rx) / sw;
                        tw[nt++] = ki * p->kw + kj;
                    }
            }
        ph0[sh * sw] = nt;
        memset(dyp, 0, sizeof(float) * cout * g.gst); // margins stay zero
    }
    memset(dwt, 0, sizeof(float) * wsize);
    memset(xcl, 0, sizeof(float) * (size_t)g.hp * g.wp * cin);
    int   V = cin % 32 == 0 ? 2 : 1, lanes = 16 * V; // input gradient: cin in lanes
    int   Vw = cout % 32 == 0 ? 2 : 1, Rw = Vw == 1 && cin % 16 == 0 ? 16 : 8;
    float tile[TILE_MAX];
    for (int s = 0; s < n; s++) {
        const float *dys = dy + (size_t)s * cout * hwo, *xs = x + (size_t)s * cin * h * w;
        for (int o = 0; o < cout; o++) {
            const float *src = dys + (size_t)o * hwo;
            if (p->bias && db) {
                double acc = 0.0;
                for (size_t q = 0; q < hwo; q++)
                    acc += src[q];
                db[o] += (float)acc;
            }
            if (dx)
                for (int i = 0; i < g.ho; i++)
                    copy_row(dyp + o * g.gst + (size_t)(i + g.mg) * g.wg + g.mg,
                             src + (size_t)i * g.wo, g.wo);
        }
        // dycl (pixels, cout) and xcl (padded pixels, cin): 16x16 transposes, the last
        // pixels of a plane (or row) one by one
        size_t qf = hwo & ~(size_t)15;
        for (int o0 = 0; o0 < cout; o0 += 16) {
            for (size_t q0 = 0; q0 < qf; q0 += 16)
                transpose16(dys + (size_t)o0 * hwo + q0, hwo, dycl + q0 * cout + o0, (size_t)cout,
                            NULL, 16);
            for (int o = o0; o < o0 + 16; o++)
                for (size_t q = qf; q < hwo; q++)
                    dycl[q * cout + o] = dys[(size_t)o * hwo + q];
        }
        int jf = cin % 16 == 0 ? w & ~15 : 0;
        for (int i = 0; i < h; i++) {
            float *dst = xcl + ((size_t)(i + p->ph) * g.wp + p->pw) * cin;
            for (int c0 = 0; c0 < cin && jf; c0 += 16)
                for (int j0 = 0; j0 < jf; j0 += 16)
                    transpose16(xs + ((size_t)c0 * h + i) * w + j0, (size_t)h * w,
                                dst + (size_t)j0 * cin + c0, (size_t)cin, NULL, 16);
            for (int c = 0; c < cin; c++)
                for (int j = jf; j < w; j++)
                    dst[(size_t)j * cin + c] = xs[((size_t)c * h + i) * w + j];
        }
        for (int ki = 0; ki < p->kh; ki++)
            for (int kj = 0; kj < p->kw; kj++) {
                float *dst = dwt + (size_t)(ki * p->kw + kj) * cin * cout;
                for (int c0 = 0; c0 < cin; c0 += Rw)
                    for (int o0 = 0; o0 < cout; o0 += 16 * Vw) {
                        float *d = dst + (size_t)c0 * cout + o0;
                        if (Vw == 2)
                            dw_8x2(xcl, dycl, &g, cin, cout, sh, sw, ki, kj, c0, o0, d);
                        else if (Rw == 16)
                            dw_16x1(xcl, dycl, &g, cin, cout, sh, sw, ki, kj, c0, o0, d);
                        else
                            dw_8x1(xcl, dycl, &g, cin, cout, sh, sw, ki, kj, c0, o0, d);
                    }
            }
        if (!dx)
            continue;
        float *dxs = dx + (size_t)s * cin * h * w;
        for (int i = 0; i < h; i++) {
            int Y = i + p->ph, ry = Y % sh;
            for (int rx = 0; rx < sw; rx++) {
                int f = ry * sw + rx, nt = ph0[f + 1] - ph0[f];
                // the first input column of this phase, and how many there are
                int j0 = ((rx - p->pw) % sw + sw) % sw;
                if (j0 >= w)
                    continue;
                int np = (w - 1 - j0) / sw + 1;
                if (nt == 0) { // no tap reaches these pixels
                    for (int q = 0; q < np; q++)
                        memset(dxcl + ((size_t)i * w + j0 + (size_t)q * sw) * cin, 0,
                               sizeof(float) * (size_t)cin);
                    continue;
                }
                const float *base = dyp + (size_t)(Y / sh + g.mg) * g.wg + (j0 + p->pw) / sw + g.mg;
                for (int q0 = 0; q0 < np;) {
                    int done = 0;
                    for (int c0 = 0; c0 < cin; c0 += lanes) {
                        done = core_run(V, np - q0, base + q0, toff + ph0[f], tw + ph0[f], nt, cout,
                                        g.gst, wdx + c0, cin, tile);
                        float *d = dxs + ((size_t)c0 * h + i) * w + j0 + (size_t)q0 * sw;
                        if (sw == 1)
                            store_tile(tile, done, lanes, d, (size_t)h * w, NULL);
                        else // channels-last first, transposed below
                            for (int q = 0; q < done; q++)
                                copy_row(dxcl + ((size_t)i * w + j0 + (size_t)(q0 + q) * sw) * cin +
                                             c0,
                                         tile + (size_t)q * lanes, lanes);
                    }
                    q0 += done;
                }
            }
        }
        if (sw > 1)
            for (int i = 0; i < h; i++)
                for (int j0 = 0; j0 < w; j0 += 16)
                    for (int c0 = 0; c0 < cin; c0 += 16)
                        transpose16(dxcl + ((size_t)i * w + j0) * cin + c0, (size_t)cin,
                                    dxs + ((size_t)c0 * h + i) * w + j0, (size_t)h * w, NULL,
                                    w - j0);
    }
    // dw[o][c][t] += dwt[(t*cin + c)*cout + o]
    for (int o = 0; o < cout; o++)
        for (int c = 0; c < cin; c++)
            for (int t = 0; t < kk; t++)
                dw[((size_t)o * cin + c) * kk + t] += dwt[((size_t)t * cin + c) * cout + o];
#else // never called: dt_nn_conv_cl_backward_ok says no
    (void)p, (void)n, (void)h, (void)w, (void)x, (void)wt, (void)dy, (void)dx, (void)dw, (void)db;
    (void)scratch, (void)wino_dx;
#endif
}
