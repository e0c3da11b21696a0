// gemm_neon.c: the arm64 Advanced SIMD GEMM tile (gemm.h), 8 rows x 12 columns: 24
// accumulators of four lanes, three loads of B and one element of A at a time (fmla by
// element), 28 of the 32 vector registers, so nothing spills. Per step of k, 24 FMAs
// against 3 vector loads and 8 scalar loads: bound by the FMA pipes on the usual cores
// (two on Neoverse N1 / Cortex-A76 class, four on V1 / V2), not by loads.
//
// Every element of C is the chain c = fma(a[i][p], b[p][j], c) for p in k order, then
// c *= alpha when the tile scales, in any position of the tile: a partial tile runs the
// same instructions on fewer rows (the row count is a constant in each instance below)
// and, with fewer than 12 columns, on B rows and C rows copied through a zero-padded
// buffer, so the lanes past nr only ever meet zeros and are never stored.
// Built with contraction on (the Makefile's KFLAGS_neon); the intrinsics fuse anyway.
#include "kernels/gemm.h"

#include <arm_neon.h>
#include <string.h>

#define PRAGMA_(x) _Pragma(#x)
#define UNROLL(n)  PRAGMA_(GCC unroll n)

enum { MR = DT_GEMM_NEON_MR, NR = DT_GEMM_NEON_NR };

static inline __attribute__((always_inline)) void tile(const dt_gemm_tile *t, const int mr,
                                                       const bool full) {
    float32x4_t acc[MR][3];
    float       pad[NR] = {0}; // a partial row of B or C, lanes past nr zero
    UNROLL(8) for (int i = 0; i < mr; i++) {
        const float *c = t->c + (size_t)i * t->ldc;
        if (!t->load) {
            acc[i][0] = acc[i][1] = acc[i][2] = vdupq_n_f32(0.0f);
            continue;
        }
        if (!full) {
            memcpy(pad, c, sizeof(float) * (size_t)t->nr);
            c = pad;
        }
        acc[i][0] = vld1q_f32(c);
        acc[i][1] = vld1q_f32(c + 4);
        acc[i][2] = vld1q_f32(c + 8);
    }
    const float *a = t->a, *b = t->b;
    size_t       a_rs = t->a_rs, a_cs = t->a_cs, b_ks = t->b_ks;
    for (int p = 0; p < t->kc; p++, a += a_cs, b += b_ks) {
        const float *br = b;
        if (!full) {
            memcpy(pad, b, sizeof(float) * (size_t)t->nr);
            br = pad;
        }
        float32x4_t b0 = vld1q_f32(br), b1 = vld1q_f32(br + 4), b2 = vld1q_f32(br + 8);
        UNROLL(8) for (int i = 0; i < mr; i++) {
            float av  = a[(size_t)i * a_rs];
            acc[i][0] = vfmaq_n_f32(acc[i][0], b0, av);
            acc[i][1] = vfmaq_n_f32(acc[i][1], b1, av);
            acc[i][2] = vfmaq_n_f32(acc[i][2], b2, av);
        }
    }
    UNROLL(8) for (int i = 0; i < mr; i++) {
        if (t->scale) {
            acc[i][0] = vmulq_n_f32(acc[i][0], t->alpha);
            acc[i][1] = vmulq_n_f32(acc[i][1], t->alpha);
            acc[i][2] = vmulq_n_f32(acc[i][2], t->alpha);
        }
        float *c = t->c + (size_t)i * t->ldc, *dst = full ? c : pad;
        vst1q_f32(dst, acc[i][0]);
        vst1q_f32(dst + 4, acc[i][1]);
        vst1q_f32(dst + 8, acc[i][2]);
        if (!full)
            memcpy(c, pad, sizeof(float) * (size_t)t->nr);
    }
}

void dt_gemm_tile_neon(const dt_gemm_tile *t) {
    bool full = t->nr == NR;
    switch (t->mr * 2 + full) {
    case 17:
        tile(t, 8, true);
        break;
    case 16:
        tile(t, 8, false);
        break;
    case 15:
        tile(t, 7, true);
        break;
    case 14:
        tile(t, 7, false);
        break;
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
