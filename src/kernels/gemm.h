// gemm.h: dtrain's own single-precision GEMM, whose every output element is formed the
// same way wherever it sits in the matrix and however the caller splits the product:
//
//     c[i][j] = init; for k = 0 .. K-1: c[i][j] = fma(op(A)[i][k], op(B)[k][j], c[i][j]);
//     then c[i][j] *= alpha when alpha != 1,
//
// init being 0 (beta 0) or the old c[i][j] (beta 1). A row of C therefore comes out
// bit for bit the same whether the call has 1 row or 1,000, and a column likewise, so
// that threads and ranks that split a batch differently still compute each sample's
// numbers identically (world-size invariance). GEMM libraries do not promise this:
// OpenBLAS's AVX2 kernels round a row differently by its position in the last block
// (tests/unit/test_gemm shows it). Each target's kernel (ref: plain C, avx2: FMA
// microkernels) keeps that order; two targets differ from each other in rounding
// (ref has no fused multiply-add on x86-64), never within one; avx512's tile runs the
// same chains as avx2's on wider vectors, so those two agree bit for bit.
#ifndef DTRAIN_KERNELS_GEMM_H
#define DTRAIN_KERNELS_GEMM_H

#include "kernels/cpu.h"

// Row-major C (m, n) = alpha * op(A) (m, k) * op(B) (k, n) + beta * C, beta 0 or 1, on
// the kernels of `target` (which the CPU must have). Single-threaded; thread-safe.
void dt_k_sgemm(dt_isa target, bool trans_a, bool trans_b, int m, int n, int k, float alpha,
                const float *a, int lda, const float *b, int ldb, float beta, float *c, int ldc);

// The microkernels behind it (kernels/<target>/gemm_*.c): C tile (mr <= MR, nr <= NR)
// from A read as a[i * a_rs + p * a_cs] and B rows of NR (or nr) floats b_ks apart;
// init from c when load, and scaled by alpha when scale. A partial tile (mr < MR or
// nr < NR) must keep every element's order: the same FMAs on fewer lanes.
typedef struct dt_gemm_tile {
    int          kc, mr, nr;
    const float *a;
    size_t       a_rs, a_cs;
    const float *b;
    size_t       b_ks;
    float       *c;
    size_t       ldc;
    bool         load, scale;
    float        alpha;
} dt_gemm_tile;

#define DT_GEMM_REF_MR    4
#define DT_GEMM_REF_NR    16
#define DT_GEMM_AVX2_MR   6
#define DT_GEMM_AVX2_NR   16
#define DT_GEMM_AVX512_MR 12
#define DT_GEMM_AVX512_NR 32
#define DT_GEMM_NEON_MR   8
#define DT_GEMM_NEON_NR   12
void dt_gemm_tile_ref(const dt_gemm_tile *t);
void dt_gemm_tile_avx2(const dt_gemm_tile *t);
void dt_gemm_tile_avx512(const dt_gemm_tile *t);
void dt_gemm_tile_neon(const dt_gemm_tile *t);

// The packing behind the tiles, per target as they are. It copies values and never
// changes them, so it cannot change a result; it only has to be cheap beside the
// multiply-adds that read what it wrote. pack_b: op(B)'s rows [0, kc) x columns
// [0, nc) into panels of nr columns, panel q at dst + q * kc holding its row p at
// p * nr, the columns past nc zero; op(B)[p][j] is b[p * ldb + j], or b[j * ldb + p]
// when trans_b. pack_at: a transposed A's tile of h rows (h <= 16),
// dst[p * h + i] = a[p * lda + i] for p < kc, i < h. avx2's needs nr a multiple of 8.
void dt_gemm_pack_b_ref(bool trans_b, const float *b, size_t ldb, int kc, int nc, int nr,
                        float *dst);
void dt_gemm_pack_b_avx2(bool trans_b, const float *b, size_t ldb, int kc, int nc, int nr,
                         float *dst);
void dt_gemm_pack_at_ref(const float *a, size_t lda, int kc, int h, float *dst);
void dt_gemm_pack_at_avx2(const float *a, size_t lda, int kc, int h, float *dst);

#endif // DTRAIN_KERNELS_GEMM_H
