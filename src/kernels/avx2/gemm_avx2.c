// gemm_avx2.c: the AVX2 + FMA GEMM tile (gemm.h), 6 rows x 16 columns: 12 ymm
// accumulators, two loads of B and one broadcast of A at a time, 15 of the 16 ymm
// registers, so nothing spills. Per step of k, 12 FMAs against 2 loads and 6
// broadcasts: bound by the two FMA pipes of Zen 3 / Haswell-class cores. A partial
// tile runs the same instructions on fewer rows (the row count is a constant in each
// instance below) and masked columns, so every element sees the same FMAs.
// The packing (gemm.h) moves whole vectors: rows of B 8 floats at a time, a transposed
// B in 8 x 8 blocks turned in registers, a transposed A's tile one masked vector per k.
// Built for x86-64-v3 (the Makefile gives this folder -march=x86-64-v3).
#include "kernels/gemm.h"

#include <immintrin.h>

#define PRAGMA_(x) _Pragma(#x)
#define UNROLL(n)  PRAGMA_(GCC unroll n)

// One step of k: B's row (two vectors) against MR broadcasts of A's column.
static inline __attribute__((always_inline)) void kstep(__m256 acc[6][2], const float *a,
                                                        size_t a_rs, const float *b, const int MR,
                                                        const bool full, __m256i m0, __m256i m1) {
    __m256 b0, b1;
    if (full) {
        b0 = _mm256_loadu_ps(b);
        b1 = _mm256_loadu_ps(b + 8);
    } else {
        b0 = _mm256_maskload_ps(b, m0);
        b1 = _mm256_maskload_ps(b + 8, m1);
    }
    UNROLL(6) for (int i = 0; i < MR; i++) {
        __m256 av = _mm256_broadcast_ss(a + (size_t)i * a_rs);
        acc[i][0] = _mm256_fmadd_ps(av, b0, acc[i][0]);
        acc[i][1] = _mm256_fmadd_ps(av, b1, acc[i][1]);
    }
}

// packed: B is the driver's packed panel (rows NR floats apart, a constant offset), whose
// k loop is unrolled four times (the large products' case: 5-18% on the GPT's shapes on a
// Zen 3); B read in place (a few rows of A) keeps the plain loop, which unrolled ran
// slower there.
static inline __attribute__((always_inline)) void tile(const dt_gemm_tile *t, const int MR,
                                                       const bool full, const bool packed) {
    __m256i m0 = _mm256_set1_epi32(-1), m1 = m0;
    if (!full) { // lanes j < nr
        const __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
        m0                = _mm256_cmpgt_epi32(_mm256_set1_epi32(t->nr), idx);
        m1                = _mm256_cmpgt_epi32(_mm256_set1_epi32(t->nr - 8), idx);
    }
    __m256 acc[6][2];
    UNROLL(6) for (int i = 0; i < MR; i++) {
        float *c = t->c + (size_t)i * t->ldc;
        if (!t->load) {
            acc[i][0] = acc[i][1] = _mm256_setzero_ps();
        } else if (full) {
            acc[i][0] = _mm256_loadu_ps(c);
            acc[i][1] = _mm256_loadu_ps(c + 8);
        } else {
            acc[i][0] = _mm256_maskload_ps(c, m0);
            acc[i][1] = _mm256_maskload_ps(c + 8, m1);
        }
    }
    const float *a = t->a, *b = t->b;
    size_t       a_rs = t->a_rs, a_cs = t->a_cs, b_ks = t->b_ks;
    const int    kc = t->kc;
    if (packed) {
        UNROLL(4)
        for (int p = 0; p < kc; p++, a += a_cs, b += DT_GEMM_AVX2_NR)
            kstep(acc, a, a_rs, b, MR, full, m0, m1);
    } else {
        for (int p = 0; p < kc; p++, a += a_cs, b += b_ks)
            kstep(acc, a, a_rs, b, MR, full, m0, m1);
    }
    __m256 al = _mm256_set1_ps(t->alpha);
    UNROLL(6) for (int i = 0; i < MR; i++) {
        float *c = t->c + (size_t)i * t->ldc;
        if (t->scale) {
            acc[i][0] = _mm256_mul_ps(acc[i][0], al);
            acc[i][1] = _mm256_mul_ps(acc[i][1], al);
        }
        if (full) {
            _mm256_storeu_ps(c, acc[i][0]);
            _mm256_storeu_ps(c + 8, acc[i][1]);
        } else {
            _mm256_maskstore_ps(c, m0, acc[i][0]);
            _mm256_maskstore_ps(c + 8, m1, acc[i][1]);
        }
    }
}

// The hot tile (6 full rows against a packed panel) unrolled; every other shape plain.
void dt_gemm_tile_avx2(const dt_gemm_tile *t) {
    bool full = t->nr == DT_GEMM_AVX2_NR;
    if (full && t->mr == 6 && t->b_ks == DT_GEMM_AVX2_NR) {
        tile(t, 6, true, true);
        return;
    }
    switch (t->mr * 2 + full) {
    case 13:
        tile(t, 6, true, false);
        break;
    case 12:
        tile(t, 6, false, false);
        break;
    case 11:
        tile(t, 5, true, false);
        break;
    case 10:
        tile(t, 5, false, false);
        break;
    case 9:
        tile(t, 4, true, false);
        break;
    case 8:
        tile(t, 4, false, false);
        break;
    case 7:
        tile(t, 3, true, false);
        break;
    case 6:
        tile(t, 3, false, false);
        break;
    case 5:
        tile(t, 2, true, false);
        break;
    case 4:
        tile(t, 2, false, false);
        break;
    case 3:
        tile(t, 1, true, false);
        break;
    default:
        tile(t, 1, false, false);
        break;
    }
}

// Lanes [0, n) set (n <= 8; none when n <= 0).
static inline __m256i lanes(int n) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

// 8 floats from s, of which the first n are read (the rest zero).
static inline __m256 load_first(const float *s, int n) {
    return n >= 8  ? _mm256_loadu_ps(s)
           : n > 0 ? _mm256_maskload_ps(s, lanes(n))
                   : _mm256_setzero_ps();
}

// r[x][y] -> r[y][x] for an 8 x 8 block held in 8 registers.
static inline void transpose8(__m256 r[8]) {
    __m256 t[8], u[8];
    for (int x = 0; x < 8; x += 2) {
        t[x]     = _mm256_unpacklo_ps(r[x], r[x + 1]);
        t[x + 1] = _mm256_unpackhi_ps(r[x], r[x + 1]);
    }
    for (int x = 0; x < 8; x += 4) {
        u[x]     = _mm256_shuffle_ps(t[x], t[x + 2], 0x44);
        u[x + 1] = _mm256_shuffle_ps(t[x], t[x + 2], 0xEE);
        u[x + 2] = _mm256_shuffle_ps(t[x + 1], t[x + 3], 0x44);
        u[x + 3] = _mm256_shuffle_ps(t[x + 1], t[x + 3], 0xEE);
    }
    for (int x = 0; x < 4; x++) {
        r[x]     = _mm256_permute2f128_ps(u[x], u[x + 4], 0x20);
        r[x + 4] = _mm256_permute2f128_ps(u[x], u[x + 4], 0x31);
    }
}

void dt_gemm_pack_b_avx2(bool trans_b, const float *b, size_t ldb, int kc, int nc, int nr,
                         float *dst) {
    for (int q = 0; q < nc; q += nr) {
        int    w = nc - q < nr ? nc - q : nr;
        float *d = dst + (size_t)q * kc;
        if (!trans_b) {
            const float *s = b + q;
            for (int p = 0; p < kc; p++, s += ldb, d += nr)
                for (int j = 0; j < nr; j += 8)
                    _mm256_storeu_ps(d + j, load_first(s + j, w - j));
            continue;
        }
        // op(B)[p][j] = b[j][p]: 8 rows of b (8 columns of the panel) x 8 steps of k
        for (int j = 0; j < nr; j += 8)
            for (int p = 0; p < kc; p += 8) {
                int    np = kc - p < 8 ? kc - p : 8;
                __m256 r[8];
                for (int x = 0; x < 8; x++)
                    r[x] = j + x < w ? load_first(b + (size_t)(q + j + x) * ldb + p, np)
                                     : _mm256_setzero_ps();
                transpose8(r);
                for (int y = 0; y < np; y++)
                    _mm256_storeu_ps(d + (size_t)(p + y) * nr + j, r[y]);
            }
    }
}

// Whole-vector stores (a masked store is slow on AMD cores): the lanes past h land on
// the next step's floats, which its own store then writes; the last step's is masked.
void dt_gemm_pack_at_avx2(const float *a, size_t lda, int kc, int h, float *dst) {
    __m256i m0 = lanes(h), m1 = lanes(h - 8);
    for (int p = 0; p < kc; p++, a += lda, dst += h) {
        __m256 v0 = _mm256_maskload_ps(a, m0), v1 = _mm256_setzero_ps();
        if (h > 8)
            v1 = _mm256_maskload_ps(a + 8, m1);
        if (p + 1 < kc) {
            _mm256_storeu_ps(dst, v0);
            if (h > 8)
                _mm256_storeu_ps(dst + 8, v1);
        } else {
            _mm256_maskstore_ps(dst, m0, v0);
            if (h > 8)
                _mm256_maskstore_ps(dst + 8, m1, v1);
        }
    }
}
