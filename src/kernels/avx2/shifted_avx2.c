// shifted_avx2.c: the shifted GEMMs (table.h's shifted_gemm, shifted_gemm_nt,
// shifted_gemm_shards; vec/shifted.c says what they compute and why a stride-1
// convolution is one) with register tiles for AVX2's 16 ymm registers. vec/shifted.c's
// blocks (24 accumulators of 16 lanes) are shaped for AVX-512's 32 zmm registers: built
// for AVX2 each is two ymm and they spill.
//
// Forward (out[o][j] (+)= sum_r w[o][r] src[off[r] + j]): a tile is up to 6 rows x 16
// columns, 12 accumulators; per r it loads the 2 vectors of the shifted row and
// broadcasts the 6 weights from memory, 12 FMAs (the GEMM tile's shape: 15 registers).
// Columns are walked in blocks of NCOL outermost and the reduction in chunks sized from
// L1 (r_chunk), so the shifted rows of a (block, chunk) stay in L1 while every band of
// rows passes over them; a chunk after the first continues from the sums the one before
// stored (a float stored and loaded back is the same float, so chunking does not change
// any result). Shifted rows a page or more apart (Linear's) are first copied to a buffer
// of consecutive lines per (block, chunk); the gradient shards copy theirs once per call.
// Partial tiles (fewer rows, or the last n % 16 columns under masks, which
// read nothing at or past column n) run the same FMAs on fewer lanes.
//
// Weight gradient (dw[o][r] += sum_j a[o][j] src[off[r] + j]): dot products along j,
// 4 rows of a x 3 shifts, 12 accumulators of 8 lanes, 3 shifted vectors held and one
// vector of a at a time (16 registers); per 8 positions 7 loads for 12 FMAs. The last
// n % 8 positions are loaded under a mask (zeros beyond n), and each accumulator's
// lanes are summed by one fixed tree at the end.
//
// Every output element is one fixed chain, whatever tile it falls in and however many
// rows, columns or shards a call has: forward, fma over r ascending from 0 (or the old
// value when adding); weight gradient, 8 lane chains over j ascending, then
// ((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7)), added to dw. So a sample's result
// does not depend on how the batch is split (partition independence, kernels/gemm.h).
// Built for x86-64-v3 (the Makefile gives this folder -march=x86-64-v3).
#include "core/tree.h"
#include "kernels/fill.h"

#include <immintrin.h>
#include <stdlib.h>
#include <string.h>

#define PRAGMA_(x) _Pragma(#x)
#define UNROLL(n)  PRAGMA_(GCC unroll n)
#define AI         static inline __attribute__((always_inline))

#define FR   6  // forward tile rows
#define FV   2  // forward tile vectors (16 columns)
#define NCOL 32 // columns per block of the forward's outer loop

#define RMAX 256 // the most shifts in a chunk

// The forward's reduction in chunks of this many shifts: a chunk's shifted rows over a
// block of columns (NCOL floats and the lines they straddle) fill half of L1.
static int r_chunk(void) {
    int rc = (int)(dt_cpu_get()->l1d / 2 / (sizeof(float) * (NCOL + 16))) / 8 * 8;
    return rc < 32 ? 32 : rc > RMAX ? RMAX : rc;
}

// Lane masks for the first `len` lanes of v vectors of 8 (len may exceed 8 * v).
AI void lane_masks(int len, __m256i *m, int v) {
    const __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    for (int i = 0; i < v; i++)
        m[i] = _mm256_cmpgt_epi32(_mm256_set1_epi32(len - 8 * i), idx);
}

// ------------------------------------------------------------------------ forward

// What a tile does with out: overwrite it, continue from it (acc starts at out), or add
// its finished sums to it (out = out + sum, one rounding: the shards' tree).
enum { T_SET, T_ACC, T_SUM };

// One tile: rows [0, MR) of w (rows R apart) x the 16 columns at j (`full`, or those
// the masks keep).
AI void fwd_tile(const float *restrict src, const int *restrict off, int R, int w_ld,
                 const float *restrict w, const int MR, const bool full, const __m256i *m, int j,
                 float *restrict out, size_t out_ld, int add) {
    __m256 acc[FR][FV];
    UNROLL(6) for (int i = 0; i < MR; i++) UNROLL(4) for (int v = 0; v < FV; v++) {
        float *c = out + (size_t)i * out_ld + j + 8 * v;
        if (add != T_ACC)
            acc[i][v] = _mm256_setzero_ps();
        else
            acc[i][v] = full ? _mm256_loadu_ps(c) : _mm256_maskload_ps(c, m[v]);
    }
    for (int r = 0; r < R; r++) {
        const float *x = src + off[r] + j;
        __m256       xv[FV];
        UNROLL(4)
        for (int v = 0; v < FV; v++)
            xv[v] = full ? _mm256_loadu_ps(x + 8 * v) : _mm256_maskload_ps(x + 8 * v, m[v]);
        UNROLL(6) for (int i = 0; i < MR; i++) {
            __m256 wv = _mm256_broadcast_ss(w + (size_t)i * w_ld + r);
            UNROLL(4)
            for (int v = 0; v < FV; v++)
                acc[i][v] = _mm256_fmadd_ps(wv, xv[v], acc[i][v]);
        }
    }
    UNROLL(6) for (int i = 0; i < MR; i++) UNROLL(4) for (int v = 0; v < FV; v++) {
        float *c = out + (size_t)i * out_ld + j + 8 * v;
        if (add == T_SUM)
            acc[i][v] =
                _mm256_add_ps(full ? _mm256_loadu_ps(c) : _mm256_maskload_ps(c, m[v]), acc[i][v]);
        if (full)
            _mm256_storeu_ps(c, acc[i][v]);
        else
            _mm256_maskstore_ps(c, m[v], acc[i][v]);
    }
}

// One instance per (rows, full width): the row count and the masks are constants in each.
#define FWD_CASE(r)                                                                                \
    case 2 * (r) + 1:                                                                              \
        fwd_tile(src, off, R, w_ld, w, r, true, m, j, out, out_ld, add);                           \
        break;                                                                                     \
    case 2 * (r):                                                                                  \
        fwd_tile(src, off, R, w_ld, w, r, false, m, j, out, out_ld, add);                          \
        break;

static void fwd_any(const float *src, const int *off, int R, int w_ld, const float *w, int mr,
                    int nr, int j, float *out, size_t out_ld, int add) {
    __m256i m[FV];
    bool    full = nr == 8 * FV;
    lane_masks(nr, m, FV);
    switch (mr * 2 + full) {
        FWD_CASE(6)
        FWD_CASE(5)
        FWD_CASE(4)
        FWD_CASE(3)
        FWD_CASE(2)
    default:
        if (full)
            fwd_tile(src, off, R, w_ld, w, 1, true, m, j, out, out_ld, add);
        else
            fwd_tile(src, off, R, w_ld, w, 1, false, m, j, out, out_ld, add);
        break;
    }
}

// out[o][j] (+)= sum_r w[o][r] * src[off[r] + j] for o < rows, j < n (vec/shifted.c).
void dt_k_shifted_gemm_avx2(const float *src, const int *off, int R, const float *w, int rows,
                            int n, float *out, size_t out_ld, bool add) {
    if (rows <= 0 || n <= 0)
        return;
    if (R <= 0) {
        if (!add)
            for (int o = 0; o < rows; o++)
                memset(out + (size_t)o * out_ld, 0, sizeof(float) * (size_t)n);
        return;
    }
    int rc = r_chunk();
    // bands of as equal a height as fits (64 rows: 6 x 9 + 5 x 2, never a band of 1)
    int bands = (rows + FR - 1) / FR;
    // A full (block, chunk)'s shifted rows lying a page or more apart on average (Linear's
    // input gradient: 9216 floats, so every row's block falls in the same few L1 sets and
    // they evict each other while the bands pass over them) are copied to consecutive
    // aligned lines first. Copies of the floats: the same sums. A convolution's rows lie
    // close (planes of a few hundred floats) and are read in place: copying them measured
    // slower.
    static _Thread_local float pk[RMAX * NCOL] __attribute__((aligned(64)));
    static _Thread_local int   pk_off[RMAX];
    for (int j0 = 0; j0 < n; j0 += NCOL) {
        int j1 = j0 + NCOL < n ? j0 + NCOL : n;
        for (int r0 = 0; r0 < R; r0 += rc) {
            int          nrr  = R - r0 < rc ? R - r0 : rc;
            bool         ad   = add || r0 > 0;
            const float *x    = src + j0; // column j of shift r0 + r: x + xo[r] + j - j0
            const int   *xo   = off + r0;
            long         span = nrr > 1 ? labs((long)off[r0 + nrr - 1] - off[r0]) / (nrr - 1) : 0;
            if (j1 - j0 == NCOL && span * (long)sizeof(float) >= 4096) {
                for (int r = 0; r < nrr; r++) {
                    const float *s = src + off[r0 + r] + j0;
                    UNROLL(4)
                    for (int v = 0; v < NCOL / 8; v++)
                        _mm256_store_ps(pk + (size_t)r * NCOL + 8 * v, _mm256_loadu_ps(s + 8 * v));
                    pk_off[r] = r * NCOL;
                }
                x = pk, xo = pk_off;
            }
            for (int b = 0, o = 0; b < bands; b++) {
                int mr = rows / bands + (b < rows % bands);
                for (int j = j0; j < j1; j += 8 * FV) {
                    int nr = j1 - j < 8 * FV ? j1 - j : 8 * FV;
                    fwd_any(x, xo, nrr, R, w + (size_t)o * R + r0, mr, nr, j - j0,
                            out + (size_t)o * out_ld + j0, out_ld, ad ? T_ACC : T_SET);
                }
                o += mr;
            }
        }
    }
}

// ------------------------------------------------------------------ weight gradient

#define GO 4 // rows of a per tile
#define GR 3 // shifts per tile

// The fixed lane tree of an accumulator.
AI float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1)); // l, l + 4
    s        = _mm_add_ps(s, _mm_movehl_ps(s, s));                                 // + l + 2
    s        = _mm_add_ss(s, _mm_movehdup_ps(s));                                  // + l + 1
    return _mm_cvtss_f32(s);
}

// One tile: dw rows [o0, o0 + MO) x columns [r0, r0 + MS).
AI void nt_tile(const float *restrict a, size_t a_ld, int o0, const float *restrict src,
                const int *restrict off, int r0, int n, __m256i tail, float *restrict dw, int R,
                const int MO, const int MS) {
    __m256       acc[GO][GR];
    const float *ar[GO], *xr[GR];
    UNROLL(4) for (int o = 0; o < MO; o++) ar[o] = a + (size_t)(o0 + o) * a_ld;
    UNROLL(3) for (int q = 0; q < MS; q++) xr[q] = src + off[r0 + q];
    UNROLL(4)
    for (int o = 0; o < MO; o++)
        UNROLL(3) for (int q = 0; q < MS; q++) acc[o][q] = _mm256_setzero_ps();
    int j = 0;
    for (; j + 8 <= n; j += 8) {
        __m256 xv[GR];
        UNROLL(3) for (int q = 0; q < MS; q++) xv[q] = _mm256_loadu_ps(xr[q] + j);
        UNROLL(4) for (int o = 0; o < MO; o++) {
            __m256 av = _mm256_loadu_ps(ar[o] + j);
            UNROLL(3)
            for (int q = 0; q < MS; q++)
                acc[o][q] = _mm256_fmadd_ps(av, xv[q], acc[o][q]);
        }
    }
    if (j < n) {
        __m256 xv[GR];
        UNROLL(3) for (int q = 0; q < MS; q++) xv[q] = _mm256_maskload_ps(xr[q] + j, tail);
        UNROLL(4) for (int o = 0; o < MO; o++) {
            __m256 av = _mm256_maskload_ps(ar[o] + j, tail);
            UNROLL(3)
            for (int q = 0; q < MS; q++)
                acc[o][q] = _mm256_fmadd_ps(av, xv[q], acc[o][q]);
        }
    }
    UNROLL(4)
    for (int o = 0; o < MO; o++) {
        UNROLL(3)
        for (int q = 0; q < MS; q++)
            dw[(size_t)(o0 + o) * R + r0 + q] += hsum8(acc[o][q]);
    }
}

#define NT_ROWS(MO)                                                                                \
    do {                                                                                           \
        int r0 = 0;                                                                                \
        for (; r0 + GR <= R; r0 += GR)                                                             \
            nt_tile(a, a_ld, o0, src, off, r0, n, tail, dw, R, MO, GR);                            \
        if (R - r0 == 2)                                                                           \
            nt_tile(a, a_ld, o0, src, off, r0, n, tail, dw, R, MO, 2);                             \
        else if (R - r0 == 1)                                                                      \
            nt_tile(a, a_ld, o0, src, off, r0, n, tail, dw, R, MO, 1);                             \
    } while (0)

// dw[o][r] += sum_j a[o][j] * src[off[r] + j] for o < rows, r < R, j < n
// (vec/shifted.c). Reads nothing at or past column n.
void dt_k_shifted_gemm_nt_avx2(const float *a, size_t a_ld, int rows, const float *src,
                               const int *off, int R, int n, float *dw) {
    if (rows <= 0 || R <= 0 || n <= 0)
        return;
    __m256i tail;
    lane_masks(n % 8, &tail, 1);
    int o0 = 0;
    for (; o0 + GO <= rows; o0 += GO)
        NT_ROWS(GO);
    if (rows - o0 == 3)
        NT_ROWS(3);
    else if (rows - o0 == 2)
        NT_ROWS(2);
    else if (rows - o0 == 1)
        NT_ROWS(1);
}

// --------------------------------------------------------------- gradient shards

// The shards' rows are packed (DT_KSHARD_COLS floats apart) when they fit this many
// floats: Linear's rows of x are `in` floats apart, and 9216 (the ConvNet's fc1) is a
// multiple of 4096 bytes, so every row's column block falls in the same few L1 sets and
// evicts the others; packed, a chunk's rows sit in consecutive lines.
#define PACK_FLOATS (256 * DT_KSHARD_COLS)

// d[x] += s[x] for x < n, 8 lanes at a time (the last n % 8 under a mask).
AI void add_row(float *restrict d, const float *restrict s, int n, __m256i tail) {
    int x = 0;
    for (; x + 8 <= n; x += 8)
        _mm256_storeu_ps(d + x, _mm256_add_ps(_mm256_loadu_ps(d + x), _mm256_loadu_ps(s + x)));
    if (x < n)
        _mm256_maskstore_ps(
            d + x, tail,
            _mm256_add_ps(_mm256_maskload_ps(d + x, tail), _mm256_maskload_ps(s + x, tail)));
}

// Rows [o0, o1) of out, columns [0, n), fetched into L1 ahead of the adds into them:
// Linear's rows are `in` floats apart in a dw of megabytes, read 192 bytes at a time,
// too scattered for the hardware's prefetchers.
AI void prefetch_rows(const float *out, size_t out_ld, int o0, int o1, int n) {
    for (int o = o0; o < o1; o++)
        for (int x = 0; x < n; x += 16)
            _mm_prefetch((const char *)(out + (size_t)o * out_ld + x), _MM_HINT_T0);
}

// out[o][j] += the fixed tree over shards m < S of sum_{r < len[m]} w_m[o][r]
// src[off[start[m] + r] + j], w_m = w + rows * start[m], for j < n <= DT_KSHARD_COLS
// (vec/shifted.c): per band of up to FR rows, every shard's product into its tile
// (S x DT_KSHARD_ROWS x DT_KSHARD_COLS floats, in L1) by the forward's tiles, the tree
// over the tiles, the sum added into out. Packing moves floats, never changes one, so
// the sums are the same bits packed or not.
void dt_k_shifted_gemm_shards_avx2(const float *src, const int *off, const int *start,
                                   const int *len, int S, const float *w, int rows, int n,
                                   float *tile, float *out, size_t out_ld) {
    _Static_assert(FR <= DT_KSHARD_ROWS, "a band fits a shard's tile");
    const size_t tl = (size_t)DT_KSHARD_ROWS * DT_KSHARD_COLS, ld = DT_KSHARD_COLS;
    if (n <= 0 || rows <= 0)
        return;
    __m256i tail;
    lane_masks(n % 8, &tail, 1);
    int rt = 0; // rows [0, rt) of off hold every shard's
    for (int m = 0; m < S; m++)
        if (len[m] && start[m] + len[m] > rt)
            rt = start[m] + len[m];
    static _Thread_local float pk[PACK_FLOATS] __attribute__((aligned(64)));
    static _Thread_local int   pk_off[PACK_FLOATS / DT_KSHARD_COLS];
    if ((size_t)rt * ld <= PACK_FLOATS) {
        for (int m = 0; m < S; m++)
            for (int r = start[m]; r < start[m] + len[m]; r++) {
                memcpy(pk + (size_t)r * ld, src + off[r], sizeof(float) * (size_t)n);
                pk_off[r] = r * (int)ld;
            }
        src = pk;
        off = pk_off;
    }
    int bands = (rows + FR - 1) / FR;
    prefetch_rows(out, out_ld, 0, rows / bands + (0 < rows % bands), n);
    for (int b = 0, o0 = 0; b < bands; b++) {
        int mr = rows / bands + (b < rows % bands);
        // the next band's rows of out, while this band's tiles run
        if (b + 1 < bands)
            prefetch_rows(out, out_ld, o0 + mr, o0 + mr + rows / bands + (b + 1 < rows % bands), n);
        // the tree's first level (tile k += tile k + h1, h1 = core/tree.h's top step) as
        // the second tile's sums end; the levels below it pair tiles under h1 only
        int h1 = dt_tree_top(S);
        for (int m = 0; m < S; m++) {
            bool   sum = h1 && m >= h1;
            float *t   = tile + (size_t)(sum ? m - h1 : m) * tl;
            int    R   = len[m];
            if (!R) {
                for (int o = 0; o < mr; o++)
                    if (sum)
                        for (int x = 0; x < n; x++)
                            t[(size_t)o * ld + x] += 0.0f; // what adding a zero tile does
                    else
                        memset(t + (size_t)o * ld, 0, sizeof(float) * (size_t)n);
                continue;
            }
            const float *wm = w + (size_t)rows * start[m] + (size_t)o0 * R;
            for (int j = 0; j < n; j += 8 * FV)
                fwd_any(src, off + start[m], R, R, wm, mr, n - j < 8 * FV ? n - j : 8 * FV, j, t,
                        ld, sum ? T_SUM : T_SET);
        }
        for (int h = h1 / 2; h >= 1; h /= 2)
            for (int k = 0; k < h; k++)
                for (int o = 0; o < mr; o++)
                    add_row(tile + (size_t)k * tl + (size_t)o * ld,
                            tile + (size_t)(k + h) * tl + (size_t)o * ld, n, tail);
        for (int o = 0; o < mr; o++)
            add_row(out + (size_t)(o0 + o) * out_ld, tile + (size_t)o * ld, n, tail);
        o0 += mr;
    }
}
