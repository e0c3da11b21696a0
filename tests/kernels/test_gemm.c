// test_gemm.c: dtrain's own GEMM (kernels/gemm.h) on every target this machine can run
// (ref always; avx2 and avx512, or neon, where the CPU has them, whatever DT_ISA says), in
// one process.
//
// - Accuracy: each element against a double-precision product, within the bound of a
//   float sum of k products accumulated one after another: |err| <= (k + 2) u sum |a b|
//   (u = 2^-24; k roundings of the running sum, one of each product when it is not
//   fused, one of alpha), for every shape class: full and partial tiles, both
//   transposes, beta 0 and 1, alpha, k across the reduction blocks.
// - The promise that makes threads and ranks agree: any rows or columns of C computed
//   on their own (a sub-product at another offset, with another m or n, in another
//   tile position) are bit for bit those of the whole product, on each target.
// - The chain itself: every element is bit for bit the chain gemm.h promises, computed
//   here one operation at a time: a rounded multiply then a rounded add on ref (no
//   contraction on either machine family's baseline; a NATIVE=1 build may fuse them, and
//   then either chain is taken), fmaf on every other target.
#include "../check.h"
#include "kernels/gemm.h"

#include <stdlib.h>

static float frand(unsigned *s) {
    *s = *s * 1664525u + 1013904223u;
    return (float)((*s >> 8) & 0xffff) / 65536.0f - 0.5f;
}

// op(X)[i][p] of a row-major X with leading dimension ld
static float at(const float *x, bool trans, int ld, int i, int p) {
    return trans ? x[(size_t)p * ld + i] : x[(size_t)i * ld + p];
}

// The targets with a GEMM tile of their own that this CPU has (avx512bf16 and amx run
// avx512's).
static int targets(dt_isa *out) {
    static const dt_isa tiled[] = {DT_ISA_REF, DT_ISA_AVX2, DT_ISA_AVX512, DT_ISA_NEON};
    int                 n       = 0;
    for (size_t i = 0; i < sizeof tiled / sizeof tiled[0]; i++)
        if (dt_cpu_get()->has[tiled[i]])
            out[n++] = tiled[i];
    return n;
}

static void accuracy(dt_isa t, int m, int n, int k, bool ta, bool tb, float alpha, float beta) {
    unsigned s   = (unsigned)(m * 131 + n * 7 + k);
    int      lda = ta ? m : k, ldb = tb ? k : n, ldc = n + 3;
    float   *a = malloc(sizeof(float) * (size_t)m * k), *b = malloc(sizeof(float) * (size_t)k * n);
    float   *c = malloc(sizeof(float) * (size_t)m * ldc),
          *c0  = malloc(sizeof(float) * (size_t)m * ldc);
    for (size_t i = 0; i < (size_t)m * k; i++)
        a[i] = frand(&s);
    for (size_t i = 0; i < (size_t)k * n; i++)
        b[i] = frand(&s);
    for (size_t i = 0; i < (size_t)m * ldc; i++)
        c[i] = c0[i] = frand(&s);
    dt_k_sgemm(t, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    const double u   = 1.0 / (1 << 24);
    int          bad = 0;
    for (int i = 0; i < m; i++)
        for (int j = 0; j < n; j++) {
            double exact = 0, mag = 0;
            for (int p = 0; p < k; p++) {
                double v = (double)at(a, ta, lda, i, p) * at(b, tb, ldb, p, j);
                exact += v;
                mag += fabs(v);
            }
            double init  = beta != 0.0f ? c0[(size_t)i * ldc + j] : 0.0;
            exact        = alpha * exact + init;
            double bound = (k + 2) * u * (fabs(alpha) * mag + fabs(init)) + 1e-30;
            if (fabs(c[(size_t)i * ldc + j] - exact) > bound && bad++ < 3)
                fprintf(stderr, "     %s %dx%dx%d ta%d tb%d: c[%d][%d] %.9g, exact %.9g\n",
                        dt_isa_name(t), m, n, k, ta, tb, i, j, c[(size_t)i * ldc + j], exact);
        }
    CHECK(bad == 0);
    for (int i = 0; i < m; i++) // the padding columns are never written
        for (int j = n; j < ldc; j++)
            CHECK(c[(size_t)i * ldc + j] == c0[(size_t)i * ldc + j]);
    free(a), free(b), free(c), free(c0);
}

static void test_accuracy(void) {
    dt_isa ts[DT_ISA_COUNT_];
    int    nt = targets(ts);
    for (int ti = 0; ti < nt; ti++) {
        check_current = dt_isa_name(ts[ti]);
        for (int tr = 0; tr < 4; tr++) {
            bool ta = tr & 1, tb = tr & 2;
            accuracy(ts[ti], 1, 1, 1, ta, tb, 1, 0);
            accuracy(ts[ti], 7, 19, 5, ta, tb, 1, 0);
            accuracy(ts[ti], 13, 33, 70, ta, tb, 1, 1);
            accuracy(ts[ti], 70, 17, 600, ta, tb, 1, 1); // k over one reduction block
            accuracy(ts[ti], 100, 48, 31, ta, tb, 0.125f, 0);
            accuracy(ts[ti], 6, 16, 9, ta, tb, 1, 1);
        }
        accuracy(ts[ti], 5, 3, 0, false, false, 1, 0); // k = 0: C = 0
    }
}

// Rows [r0, r1) and columns [j0, j1) of the product as a product of their own.
static void part(dt_isa t, bool ta, bool tb, const float *a, int lda, const float *b, int ldb,
                 int k, int r0, int r1, int j0, int j1, float beta, float *c, int ldc) {
    const float *pa = ta ? a + r0 : a + (size_t)r0 * lda;
    const float *pb = tb ? b + (size_t)j0 * ldb : b + j0;
    dt_k_sgemm(t, ta, tb, r1 - r0, j1 - j0, k, 1.0f, pa, lda, pb, ldb, beta,
               c + (size_t)r0 * ldc + j0, ldc);
}

static void test_partitions(void) {
    dt_isa ts[DT_ISA_COUNT_];
    int    nt = targets(ts);
    enum { M = 75, N = 70, K = 300 };
    static float a[M * K], b[K * N], whole[M * N], c[M * N], init[M * N];
    unsigned     s = 5;
    for (int i = 0; i < M * K; i++)
        a[i] = frand(&s);
    for (int i = 0; i < K * N; i++)
        b[i] = frand(&s);
    for (int i = 0; i < M * N; i++)
        init[i] = frand(&s);
    for (int ti = 0; ti < nt; ti++) {
        check_current = dt_isa_name(ts[ti]);
        for (int tr = 0; tr < 8; tr++) {
            bool  ta = tr & 1, tb = tr & 2;
            float beta = tr & 4 ? 1.0f : 0.0f;
            int   lda = ta ? M : K, ldb = tb ? K : N;
            memcpy(whole, init, sizeof whole);
            dt_k_sgemm(ts[ti], ta, tb, M, N, K, 1.0f, a, lda, b, ldb, beta, whole, N);
            // row splits of every height from 1 to M (each a thread's or rank's rows),
            // then column splits (a thread's columns of a weight gradient)
            int bad = 0;
            for (int h = 1; h <= M; h += h < 8 ? 1 : 9) {
                memcpy(c, init, sizeof c);
                for (int r0 = 0; r0 < M; r0 += h)
                    part(ts[ti], ta, tb, a, lda, b, ldb, K, r0, r0 + h < M ? r0 + h : M, 0, N, beta,
                         c, N);
                bad += memcmp(c, whole, sizeof c) != 0;
            }
            for (int w = 1; w <= N; w += w < 17 ? 1 : 13) {
                memcpy(c, init, sizeof c);
                for (int j0 = 0; j0 < N; j0 += w)
                    part(ts[ti], ta, tb, a, lda, b, ldb, K, 0, M, j0, j0 + w < N ? j0 + w : N, beta,
                         c, N);
                bad += memcmp(c, whole, sizeof c) != 0;
            }
            if (!CHECK(bad == 0))
                fprintf(stderr, "     ta %d tb %d beta %g: %d splits differ\n", ta, tb,
                        (double)beta, bad);
        }
    }
}

// Every element against its chain, one operation at a time (volatile keeps the compiler
// from fusing ref's multiply and add), for every shape class and both values of beta;
// k = 600 crosses a reduction block, so the running sums go through C between blocks.
static void chain(dt_isa t, int m, int n, int k, bool ta, bool tb, float alpha, float beta) {
    unsigned s   = (unsigned)(m * 17 + n * 3 + k + ta + 2 * tb);
    int      lda = ta ? m : k, ldb = tb ? k : n, ldc = n + 1;
    float   *a = malloc(sizeof(float) * (size_t)m * k), *b = malloc(sizeof(float) * (size_t)k * n);
    float   *c = malloc(sizeof(float) * (size_t)m * ldc),
          *c0  = malloc(sizeof(float) * (size_t)m * ldc);
    for (size_t i = 0; i < (size_t)m * k; i++)
        a[i] = frand(&s);
    for (size_t i = 0; i < (size_t)k * n; i++)
        b[i] = frand(&s);
    for (size_t i = 0; i < (size_t)m * ldc; i++)
        c[i] = c0[i] = frand(&s);
    dt_k_sgemm(t, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    int bad = 0;
    for (int i = 0; i < m; i++)
        for (int j = 0; j < n; j++) {
            volatile float acc = beta != 0.0f ? c0[(size_t)i * ldc + j] : 0.0f, fused = acc;
            for (int p = 0; p < k; p++) {
                float          x = at(a, ta, lda, i, p), y = at(b, tb, ldb, p, j);
                volatile float prod = x * y;
                acc                 = acc + prod;
                fused               = fmaf(x, y, fused);
            }
            float want = t == DT_ISA_REF ? acc : fused, other = want;
#if defined(DT_NATIVE)
            other = t == DT_ISA_REF ? fused : acc;
#endif
            want  = alpha != 1.0f ? want * alpha : want;
            other = alpha != 1.0f ? other * alpha : other;
            if (memcmp(&want, &c[(size_t)i * ldc + j], sizeof want) != 0 &&
                memcmp(&other, &c[(size_t)i * ldc + j], sizeof want) != 0 && bad++ < 3)
                fprintf(stderr, "     %s %dx%dx%d ta%d tb%d: c[%d][%d] %.9g, its chain %.9g\n",
                        dt_isa_name(t), m, n, k, ta, tb, i, j, c[(size_t)i * ldc + j], want);
        }
    CHECK(bad == 0);
    free(a), free(b), free(c), free(c0);
}

static void test_chains(void) {
    dt_isa ts[DT_ISA_COUNT_];
    int    nt = targets(ts);
    for (int ti = 0; ti < nt; ti++) {
        check_current = dt_isa_name(ts[ti]);
        for (int tr = 0; tr < 4; tr++) {
            bool ta = tr & 1, tb = tr & 2;
            chain(ts[ti], 29, 37, 41, ta, tb, 1, 0);    // partial tiles of every target
            chain(ts[ti], 16, 48, 23, ta, tb, 1, 1);    // whole tiles of every target
            chain(ts[ti], 9, 13, 600, ta, tb, 1, 1);    // two reduction blocks
            chain(ts[ti], 70, 25, 7, ta, tb, 0.5f, 0);  // packed B (m > 64), alpha
            chain(ts[ti], 520, 1030, 20, ta, tb, 1, 1); // row blocks (L2 <= 1 MiB), column blocks
        }
    }
}

// avx512's tile runs avx2's chains on wider vectors: the same bits for every shape class.
static void test_avx2_avx512_agree(void) {
    if (!dt_cpu_get()->has[DT_ISA_AVX512])
        return;
    enum { M = 75, N = 70, K = 300 };
    static float a[M * K], b[K * N], c2[M * N], c5[M * N];
    unsigned     s = 11;
    for (int i = 0; i < M * K; i++)
        a[i] = frand(&s);
    for (int i = 0; i < K * N; i++)
        b[i] = frand(&s);
    for (int tr = 0; tr < 8; tr++) {
        bool  ta = tr & 1, tb = tr & 2;
        float beta = tr & 4 ? 1.0f : 0.0f;
        int   lda = ta ? M : K, ldb = tb ? K : N;
        for (int i = 0; i < M * N; i++)
            c2[i] = c5[i] = frand(&s);
        dt_k_sgemm(DT_ISA_AVX2, ta, tb, M, N, K, 1.0f, a, lda, b, ldb, beta, c2, N);
        dt_k_sgemm(DT_ISA_AVX512, ta, tb, M, N, K, 1.0f, a, lda, b, ldb, beta, c5, N);
        CHECK(memcmp(c2, c5, sizeof c2) == 0);
    }
}

int main(void) {
    char line[256];
    printf("# %s\n", dt_cpu_describe(line, sizeof line));
    test_accuracy();
    test_partitions();
    test_chains();
    test_avx2_avx512_agree();
    return check_summary();
}
