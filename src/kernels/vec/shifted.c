// shifted.c: GEMMs whose second operand is "shifted rows" of one buffer: row r of the
// implicit matrix is src + off[r]. With the wide-row layout of conv2d.c every im2col
// row of a stride-1 convolution is such a slice, so these kernels compute a
// convolution, its input gradient and its weight gradient without building the
// column matrix at all (direct convolution as an implicit GEMM).
//
// Blocking: 8 output rows x 48 columns are 24 vector accumulators, which stay in
// AVX-512's 32 registers; each step loads 3 input vectors and broadcasts 8 weights for
// 24 multiply-adds, so the loop is bound by FMA throughput rather than by loads.
// Measured on this machine's AVX-512 cores: the ConvNet's second convolution runs at
// ~240 GFLOP/s per core this way, against ~100 for im2col + OpenBLAS (which was pinned
// to its AVX2 kernels there). Without AVX-512 the 24 accumulators do not fit the
// registers (compiled for avx2 they spill): the avx2 target has tiles of its own
// (avx2/shifted_avx2.c), and ref runs these as plain loops.
//
// Summation order is fixed (r ascending, then lanes in a fixed tree), so results are
// the same from run to run and do not depend on thread timing.
#include "kernels/vec/vec.h"

#define OB 8 // output rows per block
#define JB 3 // 16-wide column vectors per block
_Static_assert(OB == DT_KSHARD_ROWS && 16 * JB == DT_KSHARD_COLS, "shard tiles are one block");

// One block: rows [o0, o0 + NO) x columns [j, j + 16*NV). NO and NV are constants in
// every instance, so the accumulators live in registers and the loop has no branches.
// (The kernels keep the unroll pragmas and loops as laid out: not reformatted.)
// clang-format off
#define DEFINE_BLOCK_NN(name, NO, NV)                                                        \
    static inline __attribute__((always_inline)) void name(                                 \
        const float *restrict src, const int *restrict off, int R, const float *restrict w, \
        int o0, int j, float *restrict out, size_t out_ld, bool add) {                      \
        dt_v16f acc[NO][NV];                                                                \
        UNROLL(8) for (int o = 0; o < NO; o++) UNROLL(3) for (int b = 0; b < NV; b++)       \
            acc[o][b] = add ? dt_load16(out + (size_t)(o0 + o) * out_ld + j + 16 * b)       \
                            : dt_splat16(0.0f);                                             \
        const float *wr = w + (size_t)o0 * R;                                               \
        for (int r = 0; r < R; r++) {                                                       \
            const float *xr = src + off[r] + j;                                             \
            dt_v16f      x[NV];                                                             \
            UNROLL(3) for (int b = 0; b < NV; b++) x[b] = dt_load16(xr + 16 * b);           \
            UNROLL(8) for (int o = 0; o < NO; o++) {                                        \
                dt_v16f wv = dt_splat16(wr[(size_t)o * R + r]);                             \
                UNROLL(3) for (int b = 0; b < NV; b++) acc[o][b] += wv * x[b];              \
            }                                                                               \
        }                                                                                   \
        UNROLL(8) for (int o = 0; o < NO; o++) UNROLL(3) for (int b = 0; b < NV; b++)       \
            dt_store16(out + (size_t)(o0 + o) * out_ld + j + 16 * b, acc[o][b]);            \
    }

// clang-format on
DEFINE_BLOCK_NN(block_8x3, OB, JB)
DEFINE_BLOCK_NN(block_1x3, 1, JB)
DEFINE_BLOCK_NN(block_8x1, OB, 1)
DEFINE_BLOCK_NN(block_1x1, 1, 1)

// One row band [o0, o0 + nrows) of the product over columns [j, j + width), width < 16,
// with plain loops (the columns no vector block covers): a multiply, then an add, on
// every target (DT_NO_FMA).
DT_NO_FMA static void narrow_columns(const float *src, const int *off, int R, const float *w,
                                     int o0, int nrows, int j, int width, float *out, size_t out_ld,
                                     bool add) {
    for (int o = o0; o < o0 + nrows; o++)
        for (int c = j; c < j + width; c++) {
            float acc = add ? out[(size_t)o * out_ld + c] : 0.0f;
            for (int r = 0; r < R; r++)
                acc += w[(size_t)o * R + r] * src[off[r] + c];
            out[(size_t)o * out_ld + c] = acc;
        }
}

// out[o][j] (+)= sum_r w[o][r] * src[off[r] + j] for o < rows, j < n; w is (rows, R)
// row-major, out rows are out_ld apart; `add` adds to out instead of overwriting it.
// Reads src[off[r] + j] only for j < n.
static void shifted_gemm(const float *src, const int *off, int R, const float *w, int rows, int n,
                         float *out, size_t out_ld, bool add) {
    for (int o0 = 0; o0 < rows;) {
        bool full = rows - o0 >= OB;
        int  nr = full ? OB : 1, j = 0;
        for (; j + 16 * JB <= n; j += 16 * JB)
            if (full)
                block_8x3(src, off, R, w, o0, j, out, out_ld, add);
            else
                block_1x3(src, off, R, w, o0, j, out, out_ld, add);
        for (; j + 16 <= n; j += 16)
            if (full)
                block_8x1(src, off, R, w, o0, j, out, out_ld, add);
            else
                block_1x1(src, off, R, w, o0, j, out, out_ld, add);
        if (j < n && n >= 16 && !add) {
            // The last columns: one more vector block moved back to end at n. The
            // columns it shares with the block before are written again with equal
            // values (which is why it is only done when overwriting).
            if (full)
                block_8x1(src, off, R, w, o0, n - 16, out, out_ld, false);
            else
                block_1x1(src, off, R, w, o0, n - 16, out, out_ld, false);
        } else if (j < n) {
            narrow_columns(src, off, R, w, o0, nr, j, n - j, out, out_ld, add);
        }
        o0 += nr;
    }
}

#define TB_O 4 // rows of a per block
// Shifted rows per block: 4x4 is 16 accumulators + 8 operands, which fit the registers
// (4x6 spilled).
#define TB_R 4

// The last n % 16 columns: vectors loaded so they end exactly at column n, their lanes
// moved down to the front (`tail_idx`) and, for a, the lanes past the row end zeroed
// (`tail_mask`), so nothing at or past column n is read and the extra lanes of x only
// ever meet zeros.
typedef struct tail {
    int     start; // first tail column (n rounded down to 16)
    int     len;   // n % 16
    dt_v16i idx, mask;
} tail;

// One block: dw rows [o0, o0 + NO) x columns [r0, r0 + NR); constants in every
// instance, as for the forward blocks.
// clang-format off
#define DEFINE_BLOCK_NT(name, NO, NR)                                                        \
    static inline __attribute__((always_inline)) void name(                                 \
        const float *restrict a, size_t a_ld, int o0, const float *restrict src,            \
        const int *restrict off, int r0, int n, const tail *t, float *restrict dw, int R) { \
        dt_v16f      acc[NO][NR];                                                           \
        const float *ar[NO], *xr[NR];                                                       \
        UNROLL(4) for (int o = 0; o < NO; o++) ar[o] = a + (size_t)(o0 + o) * a_ld;         \
        UNROLL(6) for (int q = 0; q < NR; q++) xr[q] = src + off[r0 + q];                   \
        UNROLL(4) for (int o = 0; o < NO; o++) UNROLL(6) for (int q = 0; q < NR; q++)       \
            acc[o][q] = dt_splat16(0.0f);                                                   \
        for (int j = 0; j < t->start; j += 16) {                                            \
            dt_v16f av[NO], xv[NR];                                                         \
            UNROLL(4) for (int o = 0; o < NO; o++) av[o] = dt_load16(ar[o] + j);            \
            UNROLL(6) for (int q = 0; q < NR; q++) xv[q] = dt_load16(xr[q] + j);            \
            UNROLL(4) for (int o = 0; o < NO; o++) UNROLL(6) for (int q = 0; q < NR; q++)   \
                acc[o][q] += av[o] * xv[q];                                                 \
        }                                                                                   \
        if (t->len) {                                                                       \
            int     back = n - 16;                                                          \
            dt_v16f av[NO], xv[NR];                                                         \
            UNROLL(4) for (int o = 0; o < NO; o++) av[o] = (dt_v16f)(                       \
                (dt_v16i)dt_shuffle16f(dt_load16(ar[o] + back), t->idx) & t->mask);     \
            UNROLL(6) for (int q = 0; q < NR; q++)                                          \
                xv[q] = dt_shuffle16f(dt_load16(xr[q] + back), t->idx);                 \
            UNROLL(4) for (int o = 0; o < NO; o++) UNROLL(6) for (int q = 0; q < NR; q++)   \
                acc[o][q] += av[o] * xv[q];                                                 \
        }                                                                                   \
        UNROLL(4) for (int o = 0; o < NO; o++) UNROLL(6) for (int q = 0; q < NR; q++)       \
            dw[(size_t)(o0 + o) * R + r0 + q] += dt_hsum16(acc[o][q]);                         \
    }

// clang-format on
DEFINE_BLOCK_NT(block_nt_4x6, TB_O, TB_R)
DEFINE_BLOCK_NT(block_nt_4x1, TB_O, 1)
DEFINE_BLOCK_NT(block_nt_1x6, 1, TB_R)
DEFINE_BLOCK_NT(block_nt_1x1, 1, 1)

// dw[o][r] += sum_j a[o][j] * src[off[r] + j] for o < rows, r < R, j < n; dw is
// (rows, R) row-major, a rows are a_ld apart. Reads nothing at or past column n.
static void shifted_gemm_nt(const float *a, size_t a_ld, int rows, const float *src, const int *off,
                            int R, int n, float *dw) {
    if (n < 16) {
        for (int o = 0; o < rows; o++)
            for (int r = 0; r < R; r++) {
                float acc = 0.0f;
                for (int j = 0; j < n; j++)
                    acc += a[(size_t)o * a_ld + j] * src[off[r] + j];
                dw[(size_t)o * R + r] += acc;
            }
        return;
    }
    tail t = {.start = n & ~15, .len = n & 15};
    for (int l = 0; l < 16; l++) {
        t.idx[l]  = (l + 16 - t.len) & 15;
        t.mask[l] = l < t.len ? -1 : 0;
    }
    int o0 = 0;
    for (; o0 + TB_O <= rows; o0 += TB_O) {
        int r0 = 0;
        for (; r0 + TB_R <= R; r0 += TB_R)
            block_nt_4x6(a, a_ld, o0, src, off, r0, n, &t, dw, R);
        for (; r0 < R; r0++)
            block_nt_4x1(a, a_ld, o0, src, off, r0, n, &t, dw, R);
    }
    for (; o0 < rows; o0++) {
        int r0 = 0;
        for (; r0 + TB_R <= R; r0 += TB_R)
            block_nt_1x6(a, a_ld, o0, src, off, r0, n, &t, dw, R);
        for (; r0 < R; r0++)
            block_nt_1x1(a, a_ld, o0, src, off, r0, n, &t, dw, R);
    }
}

// a[x] += b[x] for x < n, sixteen lanes at a time (element-wise: no reassociation).
static inline __attribute__((always_inline)) void add_row(float *restrict a,
                                                          const float *restrict b, int n) {
    int x = 0;
    for (; x + 16 <= n; x += 16)
        dt_store16(a + x, dt_load16(a + x) + dt_load16(b + x));
    for (; x < n; x++)
        a[x] += b[x];
}

// Gradient shards (linear.c): out[o][j] += the fixed tree over shards m < S of
// sum_{r < len[m]} w_m[o][r] * src[off[start[m] + r] + j], where w_m = w + rows * start[m]
// is shard m's (rows, len[m]) block, for o < rows and j < n <= DT_KSHARD_COLS. Each band
// of rows goes through the shards' tiles in `tile` (S x DT_KSHARD_ROWS x DT_KSHARD_COLS
// floats, in L1), so no per-shard product ever reaches memory; the kernels are the same
// blocks as dt_nn_shifted_gemm, and a column takes the same path for a given n.
static void shifted_gemm_shards(const float *src, const int *off, const int *start, const int *len,
                                int S, const float *w, int rows, int n, float *tile, float *out,
                                size_t out_ld) {
    const size_t tl = (size_t)DT_KSHARD_ROWS * DT_KSHARD_COLS, ld = DT_KSHARD_COLS;
    for (int o0 = 0; o0 < rows;) {
        bool full = rows - o0 >= OB;
        int  nr   = full ? OB : 1;
        for (int m = 0; m < S; m++) {
            float *t = tile + (size_t)m * tl;
            int    R = len[m], j = 0;
            if (!R) {
                for (int o = 0; o < nr; o++)
                    for (int x = 0; x < n; x++)
                        t[(size_t)o * ld + x] = 0.0f;
                continue;
            }
            const int   *om = off + start[m];
            const float *wm = w + (size_t)rows * start[m] + (size_t)o0 * R;
            for (; j + 16 * JB <= n; j += 16 * JB)
                if (full)
                    block_8x3(src, om, R, wm, 0, j, t, ld, false);
                else
                    block_1x3(src, om, R, wm, 0, j, t, ld, false);
            for (; j + 16 <= n; j += 16)
                if (full)
                    block_8x1(src, om, R, wm, 0, j, t, ld, false);
                else
                    block_1x1(src, om, R, wm, 0, j, t, ld, false);
            if (j < n)
                narrow_columns(src, om, R, wm, 0, nr, j, n - j, t, ld, false);
        }
        for (int h = S / 2; h >= 1; h /= 2)
            for (int k = 0; k < h; k++)
                for (int o = 0; o < nr; o++)
                    add_row(tile + (size_t)k * tl + (size_t)o * ld,
                            tile + (size_t)(k + h) * tl + (size_t)o * ld, n);
        for (int o = 0; o < nr; o++)
            add_row(out + (size_t)(o0 + o) * out_ld, tile + (size_t)o * ld, n);
        o0 += nr;
    }
}

void DT_KV(fill_shifted)(dt_ktab *t) {
    t->shifted_gemm        = shifted_gemm;
    t->shifted_gemm_nt     = shifted_gemm_nt;
    t->shifted_gemm_shards = shifted_gemm_shards;
}
