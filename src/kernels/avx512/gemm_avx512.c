// gemm_avx512.c: the AVX-512 GEMM tile (gemm.h), 12 rows x 32 columns: 24 zmm
// accumulators, two loads of B and one broadcast of A at a time, 27 of the 32 zmm
// registers, so nothing spills. Per step of k, 24 FMAs against 2 loads and 12
// broadcasts. A partial tile runs the same instructions on fewer rows (the row count is
// a constant in each instance below) and masked columns, so every element sees the same
// FMAs: the chain of gemm.h, which is also the avx2 tile's, so the two targets give the
// same bits. Built for x86-64-v4 (the Makefile gives this folder -march=x86-64-v4).
#include "kernels/gemm.h"

#include <immintrin.h>

#define PRAGMA_(x) _Pragma(#x)
#define UNROLL(n)  PRAGMA_(GCC unroll n)

static inline __attribute__((always_inline)) void tile(const dt_gemm_tile *t, const int MR,
                                                       const bool full) {
    __mmask16 m0 = 0xffff, m1 = 0xffff;
    if (!full) { // lanes j < nr
        m0 = t->nr >= 16 ? 0xffff : (__mmask16)((1u << t->nr) - 1);
        m1 = t->nr > 16 ? (__mmask16)((1u << (t->nr - 16)) - 1) : 0;
    }
    __m512 acc[12][2];
    UNROLL(12) for (int i = 0; i < MR; i++) {
        float *c = t->c + (size_t)i * t->ldc;
        if (!t->load) {
            acc[i][0] = acc[i][1] = _mm512_setzero_ps();
        } else if (full) {
            acc[i][0] = _mm512_loadu_ps(c);
            acc[i][1] = _mm512_loadu_ps(c + 16);
        } else {
            acc[i][0] = _mm512_maskz_loadu_ps(m0, c);
            acc[i][1] = _mm512_maskz_loadu_ps(m1, c + 16);
        }
    }
    const float *a = t->a, *b = t->b;
    size_t       a_rs = t->a_rs, a_cs = t->a_cs, b_ks = t->b_ks;
    for (int p = 0; p < t->kc; p++, a += a_cs, b += b_ks) {
        __m512 b0, b1;
        if (full) {
            b0 = _mm512_loadu_ps(b);
            b1 = _mm512_loadu_ps(b + 16);
        } else {
            b0 = _mm512_maskz_loadu_ps(m0, b);
            b1 = _mm512_maskz_loadu_ps(m1, b + 16);
        }
        UNROLL(12) for (int i = 0; i < MR; i++) {
            __m512 av = _mm512_set1_ps(a[(size_t)i * a_rs]);
            acc[i][0] = _mm512_fmadd_ps(av, b0, acc[i][0]);
            acc[i][1] = _mm512_fmadd_ps(av, b1, acc[i][1]);
        }
    }
    __m512 al = _mm512_set1_ps(t->alpha);
    UNROLL(12) for (int i = 0; i < MR; i++) {
        float *c = t->c + (size_t)i * t->ldc;
        if (t->scale) {
            acc[i][0] = _mm512_mul_ps(acc[i][0], al);
            acc[i][1] = _mm512_mul_ps(acc[i][1], al);
        }
        if (full) {
            _mm512_storeu_ps(c, acc[i][0]);
            _mm512_storeu_ps(c + 16, acc[i][1]);
        } else {
            _mm512_mask_storeu_ps(c, m0, acc[i][0]);
            _mm512_mask_storeu_ps(c + 16, m1, acc[i][1]);
        }
    }
}

// One instance per (rows, full width): the row count and the masks are constants in each.
#define TILE_CASE(r)                                                                               \
    case 2 * (r) + 1:                                                                              \
        tile(t, r, true);                                                                          \
        break;                                                                                     \
    case 2 * (r):                                                                                  \
        tile(t, r, false);                                                                         \
        break;

void dt_gemm_tile_avx512(const dt_gemm_tile *t) {
    bool full = t->nr == DT_GEMM_AVX512_NR;
    switch (t->mr * 2 + full) {
        TILE_CASE(12)
        TILE_CASE(11)
        TILE_CASE(10)
        TILE_CASE(9)
        TILE_CASE(8)
        TILE_CASE(7)
        TILE_CASE(6)
        TILE_CASE(5)
        TILE_CASE(4)
        TILE_CASE(3)
        TILE_CASE(2)
    default:
        if (full)
            tile(t, 1, true);
        else
            tile(t, 1, false);
        break;
    }
}
