// gemm_avx2.c: the AVX2 + FMA GEMM tile (gemm.h), 6 rows x 16 columns: 12 ymm
// accumulators, two loads of B and one broadcast of A at a time, 15 of the 16 ymm
// registers, so nothing spills. Per step of k, 12 FMAs against 2 loads and 6
// broadcasts: bound by the two FMA pipes of Zen 3 / Haswell-class cores. A partial
// tile runs the same instructions on fewer rows (the row count is a constant in each
// instance below) and masked columns, so every element sees the same FMAs.
// Built for x86-64-v3 (the Makefile gives this folder -march=x86-64-v3).
#include "kernels/gemm.h"

#include <immintrin.h>

#define PRAGMA_(x) _Pragma(#x)
#define UNROLL(n)  PRAGMA_(GCC unroll n)

static inline __attribute__((always_inline)) void tile(const dt_gemm_tile *t, const int MR,
                                                       const bool full) {
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
    for (int p = 0; p < t->kc; p++, a += a_cs, b += b_ks) {
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

void dt_gemm_tile_avx2(const dt_gemm_tile *t) {
    bool full = t->nr == DT_GEMM_AVX2_NR;
    switch (t->mr * 2 + full) {
    case 13:
        tile(t, 6, true);
        break;
    case 12:
        tile(t, 6, false);
        break;
    case 11:
        tile(t, 5, true);
        break;
    case 10:
        tile(t, 5, false);
        break;
    case 9:
        tile(t, 4, true);
        break;
    case 8:
        tile(t, 4, false);
        break;
    case 7:
        tile(t, 3, true);
        break;
    case 6:
        tile(t, 3, false);
        break;
    case 5:
        tile(t, 2, true);
        break;
    case 4:
        tile(t, 2, false);
        break;
    case 3:
        tile(t, 1, true);
        break;
    default:
        tile(t, 1, false);
        break;
    }
}
