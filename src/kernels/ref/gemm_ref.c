// gemm_ref.c: the portable GEMM tile (gemm.h): plain C, the sums of each element in k
// order. The compiler vectorises the column loop; without FMA in the baseline x86-64
// each step is a rounded multiply then a rounded add, with FMA targets (arm64) it may
// contract them: either way every element of every tile takes the same steps.
#include "kernels/gemm.h"

void dt_gemm_tile_ref(const dt_gemm_tile *t) {
    enum { MR = DT_GEMM_REF_MR, NR = DT_GEMM_REF_NR };
    float acc[MR][NR];
    for (int i = 0; i < t->mr; i++)
        for (int j = 0; j < NR; j++)
            acc[i][j] = t->load && j < t->nr ? t->c[(size_t)i * t->ldc + j] : 0.0f;
    for (int p = 0; p < t->kc; p++) {
        const float *b = t->b + (size_t)p * t->b_ks;
        float        bv[NR];
        for (int j = 0; j < NR; j++)
            bv[j] = j < t->nr ? b[j] : 0.0f;
        for (int i = 0; i < t->mr; i++) {
            float av = t->a[(size_t)i * t->a_rs + (size_t)p * t->a_cs];
            for (int j = 0; j < NR; j++)
                acc[i][j] += av * bv[j];
        }
    }
    for (int i = 0; i < t->mr; i++)
        for (int j = 0; j < t->nr; j++)
            t->c[(size_t)i * t->ldc + j] = t->scale ? acc[i][j] * t->alpha : acc[i][j];
}

void dt_gemm_pack_b_ref(bool trans_b, const float *b, size_t ldb, int kc, int nc, int nr,
                        float *dst) {
    for (int q = 0; q < nc; q += nr) {
        int    w = nc - q < nr ? nc - q : nr;
        float *d = dst + (size_t)q * kc;
        for (int p = 0; p < kc; p++, d += nr)
            for (int j = 0; j < nr; j++)
                d[j] = j >= w     ? 0.0f
                       : !trans_b ? b[(size_t)p * ldb + q + j]
                                  : b[(size_t)(q + j) * ldb + p];
    }
}

void dt_gemm_pack_at_ref(const float *a, size_t lda, int kc, int h, float *dst) {
    for (int p = 0; p < kc; p++)
        for (int i = 0; i < h; i++)
            dst[(size_t)p * h + i] = a[(size_t)p * lda + i];
}
