// gemm16.c: the avx512bf16 target's bf16 GEMM, C (fp32) (+)= op(A) op(B) with A, B in
// bf16 (nn/prec.h's dt_gemm_bf16 on its avx512bf16 path; the bf16 gemm row).
//
// VDPBF16PS multiplies pairs of bf16 along k and adds both products to
// one fp32 lane: lane j of the result gains a[2p] * b[2p][j] + a[2p+1] * b[2p+1][j]. So
// both operands are packed in k-pairs:
//   B block (KC x NC) -> panels of NR = 48 columns; inside a panel, for each k-pair p,
//     48 (b[2p][j], b[2p+1][j]) pairs = three 64-byte vectors;
//   A block (MC x KC) -> micro-panels of MR = 8 rows; for each k-pair p, 8 32-bit words
//     (a[i][2p], a[i][2p+1]), each broadcast to all lanes.
// The micro-kernel keeps an 8 x 48 tile of C in 24 of the 32 vector registers; each
// k-pair loads 3 B vectors and broadcasts 8 A words for 24 VDPBF16PS (as shifted.c does
// for fp32 FMAs). Blocking (Goto's): a B micro-panel (KC/2 pairs x 48 x 4 bytes = 24 KiB)
// stays in L1 while the micro-panels of the A block (MC x KC x 2 = 48 KiB) stream from
// L2; the B block (KC x NC x 2 = 384 KiB) stays in L2 (1 MiB per core on Zen 4).
// Padding (odd k, rows past m, columns past n) is packed as zeros, and edge tiles go
// through a small buffer, so any shape is valid.
//
// The instruction treats bf16 denormal inputs as zero and flushes denormal results
// (Intel's definition: DAZ/FTZ implied), and sums the two products of a pair before
// adding them to the lane: results differ from an fp32 FMA sequence in the last bits,
// well inside the bf16 tolerance (tests/unit/test_prec.c). The summation order is fixed
// by the shapes alone, so results are reproducible run to run.
#include "kernels/avx512bf16/bf16k.h"
#include "kernels/avx512bf16/simd16.h"
#include "kernels/half.h"
#include "kernels/vmath.h"

#include <immintrin.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define KC 256 // k per block (even)
#define MC 96  // rows per A block (a multiple of MR)
#define NC 768 // columns per B block (a multiple of NR)
#define MR 8
#define NR 48

// ------------------------------------------------------------------ packing
// Each loop walks its source contiguously: a k-pair of an untransposed A row (or of a
// transposed B's row) is one 32-bit word; otherwise the pair comes from two adjacent
// rows read side by side. Compiled for AVX-512 (only the avx512bf16 path packs).
#define TARGET_BF16 __attribute__((target("avx512f,avx512bw,avx512bf16")))

static inline uint32_t pair(uint16_t lo, uint16_t hi) {
    return (uint32_t)lo | (uint32_t)hi << 16;
}

// Round an fp32 to bf16 (as dt_f32_to_bf16_1, inlined for the packing loops).
static inline uint16_t rnd16(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    uint32_t r = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16, q = (u >> 16) | 0x40u;
    return (uint16_t)((u & 0x7fffffffu) > 0x7f800000u ? q : r);
}

// Words w[p * stride + i] = (x[i][2p], x[i][2p+1]) for i < rows, p < kcp, where row i of
// x is src + i * ld (k contiguous); kc may be odd (the last high half is 0). With a
// stride of whole vectors (B's panels) sixteen rows go at a time through a 16 x 16
// transpose of words (a last partial group stores its rows' lanes only).
TARGET_BF16 static void pack_rows_k(const uint16_t *src, size_t ld, int rows, int kc, uint32_t *w,
                                    int stride) {
    int kp = kc / 2, done = 0; // pairs packed by the vector loop
    if (stride % 16 == 0 && kp >= 16 && rows >= 8) {
        done = kp / 16 * 16;
        for (int g0 = 0; g0 < rows; g0 += 16) {
            __mmask16 keep = rows - g0 >= 16 ? 0xffff : (__mmask16)((1u << (rows - g0)) - 1);
            for (int p0 = 0; p0 < done; p0 += 16) {
                __m512i r[16];
                for (int i = 0; i < 16; i++)
                    r[i] = g0 + i < rows
                               ? _mm512_loadu_si512(src + (size_t)(g0 + i) * ld + 2 * (size_t)p0)
                               : _mm512_setzero_si512();
                dt_transpose16_epi32(r);
                for (int j = 0; j < 16; j++)
                    _mm512_mask_storeu_epi32(w + (size_t)(p0 + j) * stride + g0, keep, r[j]);
            }
        }
    }
    for (int i = 0; i < rows; i++) {
        const uint16_t *r = src + (size_t)i * ld;
        for (int p = done; p < kp; p++) {
            uint32_t v;
            memcpy(&v, r + 2 * p, 4);
            w[(size_t)p * stride + i] = v;
        }
        if (kc & 1)
            w[(size_t)kp * stride + i] = pair(r[kc - 1], 0);
    }
}
// fp32 row segments are first rounded into this (kc <= KC, or cols <= NR, MR).
#define ROW_TMP (KC > NR ? KC : NR)

TARGET_BF16 static void round_row(const float *src, uint16_t *dst, int n) {
    int i = 0;
    for (; i + 16 <= n; i += 16)
        dt_f32_to_bf16_16(src + i, dst + i);
    for (; i < n; i++)
        dst[i] = rnd16(src[i]);
}

// The same from fp32, rounded to bf16.
TARGET_BF16 static void pack_rows_k_f32(const float *src, size_t ld, int rows, int kc, uint32_t *w,
                                        int stride) {
    uint16_t tmp[ROW_TMP];
    for (int i = 0; i < rows; i++) {
        round_row(src + (size_t)i * ld, tmp, kc);
        pack_rows_k(tmp, 0, 1, kc, w + i, stride);
    }
}

// Words w[p * stride + i] = (x[2p][i], x[2p+1][i]) for i < cols, where row kk of x is
// src + kk * ld (the other index contiguous).
TARGET_BF16 static void pack_cols_k(const uint16_t *src, size_t ld, int cols, int kc, uint32_t *w,
                                    int stride) {
    int kcp = (kc + 1) / 2;
    for (int p = 0; p < kcp; p++) {
        const uint16_t *r0 = src + (size_t)(2 * p) * ld;
        uint32_t       *o  = w + (size_t)p * stride;
        if (2 * p + 1 < kc) {
            const uint16_t *r1 = r0 + ld;
            int             i  = 0;
            for (; i + 16 <= cols; i += 16) {
                dt_v16h lo, hi;
                memcpy(&lo, r0 + i, sizeof lo);
                memcpy(&hi, r1 + i, sizeof hi);
                dt_v16u v = __builtin_convertvector(lo, dt_v16u) |
                            __builtin_convertvector(hi, dt_v16u) << 16;
                memcpy(o + i, &v, sizeof v);
            }
            for (; i < cols; i++)
                o[i] = pair(r0[i], r1[i]);
        } else {
            for (int i = 0; i < cols; i++)
                o[i] = pair(r0[i], 0);
        }
    }
}
TARGET_BF16 static void pack_cols_k_f32(const float *src, size_t ld, int cols, int kc, uint32_t *w,
                                        int stride) {
    uint16_t tmp[2][ROW_TMP];
    int      kcp = (kc + 1) / 2;
    for (int p = 0; p < kcp; p++) {
        int two = 2 * p + 1 < kc ? 2 : 1;
        round_row(src + (size_t)(2 * p) * ld, tmp[0], cols);
        if (two == 2)
            round_row(src + (size_t)(2 * p + 1) * ld, tmp[1], cols);
        pack_cols_k(tmp[0], (size_t)(tmp[1] - tmp[0]), cols, two, w + (size_t)p * stride, stride);
    }
}

// One operand: bf16 or fp32 (rounded to bf16 as it is packed).
typedef dt_gemm_opnd opnd;

// Rows [r0, ...) of an operand stored with k contiguous, from column k0.
TARGET_BF16 static void pack_rows(opnd x, size_t r0, int k0, int rows, int kc, uint32_t *w,
                                  int stride) {
    if (x.f32)
        pack_rows_k_f32((const float *)x.p + r0 * x.ld + k0, x.ld, rows, kc, w, stride);
    else
        pack_rows_k((const uint16_t *)x.p + r0 * x.ld + k0, x.ld, rows, kc, w, stride);
}
// Rows k0.. (k) of an operand stored with the other index contiguous, from column c0.
TARGET_BF16 static void pack_cols(opnd x, int k0, size_t c0, int cols, int kc, uint32_t *w,
                                  int stride) {
    if (x.f32)
        pack_cols_k_f32((const float *)x.p + (size_t)k0 * x.ld + c0, x.ld, cols, kc, w, stride);
    else
        pack_cols_k((const uint16_t *)x.p + (size_t)k0 * x.ld + c0, x.ld, cols, kc, w, stride);
}

// The width of the next B panel when `left` columns remain: NR, except that the last 64
// go as two panels of 32 rather than 48 + 16 (a one-vector panel keeps a third of the
// micro-kernel busy: 8 products per 9 loads).
static int panel_width(int left) {
    return left == 64 ? 32 : left < NR ? left : NR;
}

// Zero words [from, to) of each of kcp rows of w.
static void zero_tail(uint32_t *w, int kcp, int stride, int from, int to) {
    if (from < to)
        for (int p = 0; p < kcp; p++)
            memset(w + (size_t)p * stride + from, 0, sizeof(uint32_t) * (size_t)(to - from));
}

// B rows [k0, k0 + kc), columns [n0, n0 + nc) into panels of NR columns (the last one
// rounded up to a multiple of 16), zero-padded.
TARGET_BF16 static void pack_b(bool tb, opnd b, int k0, int kc, int n0, int nc, uint16_t *out) {
    int       kcp = (kc + 1) / 2;
    uint32_t *w   = (uint32_t *)out;
    for (int jp = 0, width; jp < nc; jp += width) {
        width    = panel_width(nc - jp);
        int wpad = (width + 15) / 16 * 16;
        if (tb) // B stored (N, K): column j of op(B) is a row
            pack_rows(b, (size_t)(n0 + jp), k0, width, kc, w, wpad);
        else
            pack_cols(b, k0, (size_t)(n0 + jp), width, kc, w, wpad);
        zero_tail(w, kcp, wpad, width, wpad);
        w += (size_t)kcp * wpad;
    }
}

// op(A) = A^T (A stored (K, M)) with fp32 values: each stored row's span [m0, m0 + mc)
// is rounded once (vectorised) and then dealt out to the micro-panels, rather than
// rounding MR values at a time.
TARGET_BF16 static void pack_a_trans_f32(const float *a, size_t lda, int m0, int mc, int k0, int kc,
                                         uint32_t *w) {
    uint16_t tmp[2][MC];
    int      kcp = (kc + 1) / 2;
    for (int p = 0; p < kcp; p++) {
        const float *r0 = a + (size_t)(k0 + 2 * p) * lda + m0;
        round_row(r0, tmp[0], mc);
        if (2 * p + 1 < kc)
            round_row(r0 + lda, tmp[1], mc);
        else
            memset(tmp[1], 0, sizeof tmp[1]);
        for (int ip = 0; ip < mc; ip += MR) {
            int       rows = mc - ip < MR ? mc - ip : MR;
            uint32_t *o    = w + (size_t)(ip / MR) * kcp * MR + (size_t)p * MR;
            for (int i = 0; i < rows; i++)
                o[i] = pair(tmp[0][ip + i], tmp[1][ip + i]);
            for (int i = rows; i < MR; i++)
                o[i] = 0;
        }
    }
}

// op(A) = A^T with bf16 values: per k-pair, sixteen columns (two micro-panels) of the two
// stored rows interleaved into words at once; the last columns of the block one by one.
TARGET_BF16 static void pack_a_trans_bf16(const uint16_t *a, size_t lda, int m0, int mc, int k0,
                                          int kc, uint32_t *w) {
    int kcp = (kc + 1) / 2;
    for (int p = 0; p < kcp; p++) {
        const uint16_t *r0 = a + (size_t)(k0 + 2 * p) * lda + m0;
        const uint16_t *r1 = 2 * p + 1 < kc ? r0 + lda : NULL;
        int             ip = 0;
        for (; ip + 16 <= mc; ip += 16) {
            dt_v16h lo, hi = {0};
            memcpy(&lo, r0 + ip, sizeof lo);
            if (r1)
                memcpy(&hi, r1 + ip, sizeof hi);
            dt_v16u v = __builtin_convertvector(lo, dt_v16u) | __builtin_convertvector(hi, dt_v16u)
                                                                   << 16;
            uint32_t *o = w + (size_t)(ip / MR) * kcp * MR + (size_t)p * MR;
            memcpy(o, &v, 8 * sizeof(uint32_t));                                    // panel ip / MR
            memcpy(o + (size_t)kcp * MR, (uint32_t *)&v + 8, 8 * sizeof(uint32_t)); // the next
        }
        for (; ip < mc; ip += MR) {
            uint32_t *o = w + (size_t)(ip / MR) * kcp * MR + (size_t)p * MR;
            for (int i = 0; i < MR; i++)
                o[i] = ip + i < mc ? pair(r0[ip + i], r1 ? r1[ip + i] : 0) : 0;
        }
    }
}

// A rows [m0, m0 + mc), columns [k0, k0 + kc) into micro-panels of MR rows.
TARGET_BF16 static void pack_a(bool ta, opnd a, int m0, int mc, int k0, int kc, uint16_t *out) {
    int       kcp = (kc + 1) / 2;
    uint32_t *w   = (uint32_t *)out;
    if (ta && a.f32) {
        pack_a_trans_f32(a.p, a.ld, m0, mc, k0, kc, w);
        return;
    }
    if (ta) {
        pack_a_trans_bf16(a.p, a.ld, m0, mc, k0, kc, w);
        return;
    }
    for (int ip = 0; ip < mc; ip += MR) {
        int rows = mc - ip < MR ? mc - ip : MR;
        if (ta) // A stored (K, M)
            pack_cols(a, k0, (size_t)(m0 + ip), rows, kc, w, MR);
        else
            pack_rows(a, (size_t)(m0 + ip), k0, rows, kc, w, MR);
        zero_tail(w, kcp, MR, rows, MR);
        w += (size_t)kcp * MR;
    }
}

// ------------------------------------------------------------------ micro-kernels
#define PRAGMA_(x) _Pragma(#x)
#define UNROLL(n)  PRAGMA_(GCC unroll n)

// C tile (MR x 16 NV) at c (row stride ldc) (+)= packed A micro-panel x B micro-panel.
// clang-format off
#define DEFINE_KERNEL(name, NV)                                                              \
    TARGET_BF16 static inline __attribute__((always_inline)) void name(                      \
        int kcp, const uint16_t *restrict ap, const uint16_t *restrict bp, float *restrict c, \
        size_t ldc, bool add, const float *bias) {                                           \
        __m512 acc[MR][NV];                                                                  \
        UNROLL(8) for (int o = 0; o < MR; o++) UNROLL(3) for (int v = 0; v < NV; v++)       \
            acc[o][v] = add    ? _mm512_loadu_ps(c + (size_t)o * ldc + 16 * v)               \
                        : bias ? _mm512_loadu_ps(bias + 16 * v)                              \
                               : _mm512_setzero_ps();                                        \
        const uint32_t *aw = (const uint32_t *)ap;                                           \
        for (int p = 0; p < kcp; p++) {                                                      \
            __m512i bv[NV];                                                                  \
            UNROLL(3) for (int v = 0; v < NV; v++)                                           \
                bv[v] = _mm512_loadu_si512(bp + ((size_t)p * NV + v) * 32);                  \
            UNROLL(8) for (int o = 0; o < MR; o++) {                                         \
                __m512i av = _mm512_set1_epi32((int)aw[(size_t)p * MR + o]);                 \
                UNROLL(3) for (int v = 0; v < NV; v++)                                       \
                    acc[o][v] = _mm512_dpbf16_ps(acc[o][v], (__m512bh)av, (__m512bh)bv[v]);  \
            }                                                                                \
        }                                                                                    \
        UNROLL(8) for (int o = 0; o < MR; o++) UNROLL(3) for (int v = 0; v < NV; v++)       \
            _mm512_storeu_ps(c + (size_t)o * ldc + 16 * v, acc[o][v]);                       \
    }
// clang-format on
DEFINE_KERNEL(kernel3, 3)
DEFINE_KERNEL(kernel2, 2)
DEFINE_KERNEL(kernel1, 1)

// The same with A read in place: untransposed bf16 A with an even k, so that each
// (a[i][2p], a[i][2p+1]) is the 32-bit word at a + i * lda + 2p (any alignment) and no
// A block is packed. Rows past `rows` read row 0 (their results are dropped).
// clang-format off
#define DEFINE_KERNEL_DA(name, NV)                                                           \
    TARGET_BF16 static inline __attribute__((always_inline)) void name(                      \
        int kcp, const uint16_t *restrict a, size_t lda, int rows,                           \
        const uint16_t *restrict bp, float *restrict c, size_t ldc, bool add,                \
        const float *bias) {                                                                 \
        __m512          acc[MR][NV];                                                         \
        const uint16_t *ar[MR];                                                              \
        UNROLL(8) for (int o = 0; o < MR; o++) ar[o] = a + (size_t)(o < rows ? o : 0) * lda; \
        UNROLL(8) for (int o = 0; o < MR; o++) UNROLL(3) for (int v = 0; v < NV; v++)       \
            acc[o][v] = add    ? _mm512_loadu_ps(c + (size_t)o * ldc + 16 * v)               \
                        : bias ? _mm512_loadu_ps(bias + 16 * v)                              \
                               : _mm512_setzero_ps();                                        \
        for (int p = 0; p < kcp; p++) {                                                      \
            __m512i bv[NV];                                                                  \
            UNROLL(3) for (int v = 0; v < NV; v++)                                           \
                bv[v] = _mm512_loadu_si512(bp + ((size_t)p * NV + v) * 32);                  \
            UNROLL(8) for (int o = 0; o < MR; o++) {                                         \
                uint32_t wd;                                                                 \
                memcpy(&wd, ar[o] + 2 * p, sizeof wd);                                       \
                __m512i av = _mm512_set1_epi32((int)wd);                                     \
                UNROLL(3) for (int v = 0; v < NV; v++)                                       \
                    acc[o][v] = _mm512_dpbf16_ps(acc[o][v], (__m512bh)av, (__m512bh)bv[v]);  \
            }                                                                                \
        }                                                                                    \
        UNROLL(8) for (int o = 0; o < MR; o++) UNROLL(3) for (int v = 0; v < NV; v++)       \
            _mm512_storeu_ps(c + (size_t)o * ldc + 16 * v, acc[o][v]);                       \
    }
// clang-format on
DEFINE_KERNEL_DA(kernel_da3, 3)
DEFINE_KERNEL_DA(kernel_da2, 2)
DEFINE_KERNEL_DA(kernel_da1, 1)

TARGET_BF16 static void kernel(int nv, int kcp, const uint16_t *ap, const uint16_t *bp, float *c,
                               size_t ldc, bool add, const float *bias) {
    if (nv == 3)
        kernel3(kcp, ap, bp, c, ldc, add, bias);
    else if (nv == 2)
        kernel2(kcp, ap, bp, c, ldc, add, bias);
    else
        kernel1(kcp, ap, bp, c, ldc, add, bias);
}

// One micro-tile: A packed (ap) or, when ap is NULL, read in place at a (row stride lda);
// without `add`, the sums start from the row vector `bias` (NULL: zero).
TARGET_BF16 static void tile(int nv, int kcp, const uint16_t *ap, const uint16_t *a, size_t lda,
                             int rows, const uint16_t *bp, float *c, size_t ldc, bool add,
                             const float *bias) {
    if (ap)
        kernel(nv, kcp, ap, bp, c, ldc, add, bias);
    else if (nv == 3)
        kernel_da3(kcp, a, lda, rows, bp, c, ldc, add, bias);
    else if (nv == 2)
        kernel_da2(kcp, a, lda, rows, bp, c, ldc, add, bias);
    else
        kernel_da1(kcp, a, lda, rows, bp, c, ldc, add, bias);
}

// Asks for the lines of a rows x w block of C (row stride ldc) ahead of the tile that
// stores or accumulates into it: C is written once per block, usually far from the
// cache (the GPT's activations), and the tile's 24 cold stores or loads otherwise wait
// on memory one after another.
static inline void prefetch_c(const float *c, size_t ldc, int rows, int w) {
    for (int i = 0; i < rows; i++)
        for (int j = 0; j < w; j += 16)
            __builtin_prefetch(c + (size_t)i * ldc + j, 1, 3);
}

// Per-thread packing buffers, kept for the thread's life (fresh pages cost ~2.4 us each).
static pthread_key_t  buf_key;
static pthread_once_t buf_once = PTHREAD_ONCE_INIT;
static void           buf_make_key(void) {
              (void)pthread_key_create(&buf_key, free);
}
#define PACK_B_ELEMS ((size_t)KC * NC)
#define PACK_A_ELEMS ((size_t)KC * MC)

static uint16_t *pack_buffers(void) {
    pthread_once(&buf_once, buf_make_key);
    uint16_t *p = pthread_getspecific(buf_key);
    if (!p) {
        p = aligned_alloc(64, (PACK_B_ELEMS + PACK_A_ELEMS) * sizeof(uint16_t));
        if (p && pthread_setspecific(buf_key, p) != 0) {
            free(p);
            p = NULL;
        }
    }
    return p;
}

TARGET_BF16 dt_status dt_k16_gemm(bool ta, bool tb, int m, int n, int k, opnd a, opnd b,
                                  const float *bias, float *c, int ldc, bool accumulate) {
    uint16_t *buf = pack_buffers();
    if (!buf)
        return dt_fail(DT_ERR_NOMEM,
                       "bf16 GEMM: expected %zu bytes of packing buffers, found "
                       "none free",
                       (PACK_B_ELEMS + PACK_A_ELEMS) * 2);
    uint16_t *pb = buf, *pa = buf + PACK_B_ELEMS;
    float     tbuf[MR * NR];
    // untransposed bf16 A with an even k is read in place (kernel_da*): no A packing
    bool in_place = !ta && !a.f32 && k % 2 == 0;
    for (int k0 = 0; k0 < k; k0 += KC) {
        int          kc = k - k0 < KC ? k - k0 : KC, kcp = (kc + 1) / 2;
        bool         add = accumulate || k0 > 0;
        const float *bi  = add ? NULL : bias; // the first block starts from the bias
        for (int n0 = 0; n0 < n; n0 += NC) {
            int nc = n - n0 < NC ? n - n0 : NC;
            pack_b(tb, b, k0, kc, n0, nc, pb);
            for (int m0 = 0; m0 < m; m0 += MC) {
                int mc = m - m0 < MC ? m - m0 : MC;
                if (!in_place)
                    pack_a(ta, a, m0, mc, k0, kc, pa);
                const uint16_t *bpanel = pb;
                for (int jp = 0, w; jp < nc; jp += w) {
                    w      = panel_width(nc - jp);
                    int nv = (w + 15) / 16;
                    // C's first lines of this panel are likely cold: ask for them now
                    prefetch_c(c + (size_t)m0 * ldc + n0 + jp, (size_t)ldc, mc < MR ? mc : MR, w);
                    for (int ip = 0; ip < mc; ip += MR) {
                        int rows = mc - ip < MR ? mc - ip : MR;
                        if (ip + MR < mc) // the next tile's C while this one computes
                            prefetch_c(c + (size_t)(m0 + ip + MR) * ldc + n0 + jp, (size_t)ldc,
                                       mc - ip - MR < MR ? mc - ip - MR : MR, w);
                        const uint16_t *apanel =
                            in_place ? NULL : pa + (size_t)(ip / MR) * kcp * MR * 2;
                        const uint16_t *arow =
                            in_place ? (const uint16_t *)a.p + (size_t)(m0 + ip) * a.ld + k0 : NULL;
                        float       *cp = c + (size_t)(m0 + ip) * ldc + n0 + jp;
                        const float *bj = bi ? bi + n0 + jp : NULL;
                        if (rows == MR && w == nv * 16) {
                            tile(nv, kcp, apanel, arow, a.ld, rows, bpanel, cp, (size_t)ldc, add,
                                 bj);
                            continue;
                        }
                        for (int i = 0; i < MR; i++)
                            for (int j = 0; j < nv * 16; j++)
                                tbuf[i * NR + j] = j >= w ? 0.0f
                                                   : add
                                                       ? (i < rows ? cp[(size_t)i * ldc + j] : 0.0f)
                                                   : bj ? bj[j]
                                                        : 0.0f;
                        tile(nv, kcp, apanel, arow, a.ld, rows, bpanel, tbuf, NR, true, NULL);
                        for (int i = 0; i < rows; i++)
                            memcpy(cp + (size_t)i * ldc, tbuf + i * NR, sizeof(float) * (size_t)w);
                    }
                    bpanel += (size_t)kcp * nv * 16 * 2;
                }
            }
        }
    }
    return DT_OK;
}
