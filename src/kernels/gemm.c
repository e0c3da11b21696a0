// gemm.c: the blocking and packing of dtrain's GEMM (gemm.h); the microkernels that
// compute each tile are per target (kernels/ref, kernels/avx2, kernels/avx512,
// kernels/neon).
//
// Loops, outermost first (the usual order of BLIS-style GEMMs): columns of C in
// blocks of nc, the reduction in blocks of kc (op(B)'s block packed into panels of NR
// columns, kc x NR floats each, zero-padded), rows of C in blocks of mc, then each
// panel (which stays in L1) against micro-rows of MR rows of A read in place (A's
// block stays in L2). kc, mc and nc come from the cache sizes cpu.c reports. Blocking
// changes where the running sums are stored between blocks, never the order of the
// multiply-adds, so the result does not depend on it.
#include "kernels/gemm.h"
#include "kernels/fill.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

typedef struct gemm_kernel {
    int mr, nr;
    void (*tile)(const dt_gemm_tile *t);
    void (*pack_b)(bool trans_b, const float *b, size_t ldb, int kc, int nc, int nr, float *dst);
    void (*pack_at)(const float *a, size_t lda, int kc, int h, float *dst);
} gemm_kernel;

// avx512's tiles take avx2's packing (every CPU with AVX-512 has AVX2; their NR is a
// multiple of 8 and their MR at most 16).
static gemm_kernel kernel_of(dt_isa target) {
#if defined(__x86_64__)
    if (target >= DT_ISA_AVX512 && target <= DT_ISA_AMX)
        return (gemm_kernel){DT_GEMM_AVX512_MR, DT_GEMM_AVX512_NR, dt_gemm_tile_avx512,
                             dt_gemm_pack_b_avx2, dt_gemm_pack_at_avx2};
    if (target == DT_ISA_AVX2)
        return (gemm_kernel){DT_GEMM_AVX2_MR, DT_GEMM_AVX2_NR, dt_gemm_tile_avx2,
                             dt_gemm_pack_b_avx2, dt_gemm_pack_at_avx2};
#elif defined(__aarch64__)
    if (target == DT_ISA_NEON)
        return (gemm_kernel){DT_GEMM_NEON_MR, DT_GEMM_NEON_NR, dt_gemm_tile_neon,
                             dt_gemm_pack_b_ref, dt_gemm_pack_at_ref};
#endif
    (void)target;
    return (gemm_kernel){DT_GEMM_REF_MR, DT_GEMM_REF_NR, dt_gemm_tile_ref, dt_gemm_pack_b_ref,
                         dt_gemm_pack_at_ref};
}

typedef struct blocking {
    int kc, mc, nc;
} blocking;

// kc: a packed panel (kc x NR floats) in half of L1; mc: A's block (mc x kc) in half of
// L2; nc: the packed block of B (kc x nc) in a quarter of L3 (shared by the cores),
// at most 1024 columns so the per-thread buffer stays within 1 MiB.
static blocking blocking_of(gemm_kernel kn) {
    const dt_cpu *c  = dt_cpu_get();
    blocking      bl = {0};
    bl.kc            = (int)(c->l1d / 2 / (sizeof(float) * (size_t)kn.nr));
    bl.kc            = bl.kc < 64 ? 64 : bl.kc > 512 ? 512 : bl.kc;
    bl.mc            = (int)(c->l2 / 2 / (sizeof(float) * (size_t)bl.kc)) / kn.mr * kn.mr;
    bl.mc            = bl.mc < kn.mr ? kn.mr : bl.mc;
    size_t l3        = c->l3 ? c->l3 / 4 : c->l2;
    bl.nc            = (int)(l3 / (sizeof(float) * (size_t)bl.kc)) / kn.nr * kn.nr;
    bl.nc            = bl.nc < kn.nr ? kn.nr : bl.nc > 1024 ? 1024 : bl.nc;
    return bl;
}

// This thread's packing buffer, kept between calls and freed when the thread ends.
static pthread_key_t  buf_key;
static pthread_once_t buf_once = PTHREAD_ONCE_INIT;
typedef struct pack_buf {
    float *p;
    size_t cap;
} pack_buf;
static void buf_free(void *v) {
    pack_buf *b = v;
    free(b->p);
    free(b);
}
static void buf_init(void) {
    DT_ASSERT(pthread_key_create(&buf_key, buf_free) == 0);
}
static float *pack_space(size_t floats) {
    pthread_once(&buf_once, buf_init);
    pack_buf *b = pthread_getspecific(buf_key);
    if (!b) {
        DT_ASSERT((b = calloc(1, sizeof *b)) != NULL);
        DT_ASSERT(pthread_setspecific(buf_key, b) == 0);
    }
    if (b->cap < floats) {
        free(b->p);
        void *p = NULL;
        DT_ASSERT(posix_memalign(&p, 64, floats * sizeof(float)) == 0);
        b->p   = p;
        b->cap = floats;
    }
    return b->p;
}

void dt_k_sgemm(dt_isa target, bool trans_a, bool trans_b, int m, int n, int k, float alpha,
                const float *a, int lda, const float *b, int ldb, float beta, float *c, int ldc) {
    if (m <= 0 || n <= 0)
        return;
    DT_ASSERT(beta == 0.0f || beta == 1.0f);
    DT_ASSERT(alpha == 1.0f || beta == 0.0f); // no caller needs alpha with accumulation
    if (k <= 0) {
        if (beta == 0.0f)
            for (int i = 0; i < m; i++)
                memset(c + (size_t)i * ldc, 0, sizeof(float) * (size_t)n);
        return;
    }
    gemm_kernel kn = kernel_of(target);
    blocking    bl = blocking_of(kn);
    // row blocks of as equal a height as fit (m 128: 66 + 62, not 126 + 2, whose block
    // is one short tile against every panel)
    int nb      = (m + bl.mc - 1) / bl.mc;
    bl.mc       = ((m + nb - 1) / nb + kn.mr - 1) / kn.mr * kn.mr;
    size_t a_rs = trans_a ? 1 : (size_t)lda, a_cs = trans_a ? (size_t)lda : 1;
    // Few rows (a sample's convolution, a thread's rows of a small batch): packing B
    // would copy as many floats as the product has multiply-adds per row of A, so the
    // tiles read its rows in place (contiguous unless transposed)
    bool direct = !trans_b && m <= 64;
    // A transposed: a tile's rows are adjacent but its steps of k lda apart, so each
    // tile's slice of A is packed (MR floats per k) once per block and reused across
    // the block's columns; untransposed, its rows stream from L2 as they are
    size_t       pb       = direct ? 0 : (size_t)bl.kc * (size_t)bl.nc;
    float       *packed   = direct && !trans_a
                                ? NULL
                                : pack_space(pb + (trans_a ? (size_t)bl.kc * (size_t)(bl.mc + kn.mr) : 0));
    float       *packed_a = trans_a ? packed + pb : NULL; // tiles of MR rows x kc
    dt_gemm_tile t        = {.ldc = (size_t)ldc, .alpha = alpha};
    for (int j0 = 0; j0 < n; j0 += bl.nc) {
        int nc = n - j0 < bl.nc ? n - j0 : bl.nc;
        for (int p0 = 0; p0 < k; p0 += bl.kc) {
            int kc  = k - p0 < bl.kc ? k - p0 : bl.kc;
            t.kc    = kc;
            t.load  = p0 > 0 || beta != 0.0f;
            t.scale = alpha != 1.0f && p0 + kc == k;
            if (!direct)
                kn.pack_b(trans_b, trans_b ? b + (size_t)j0 * ldb + p0 : b + (size_t)p0 * ldb + j0,
                          (size_t)ldb, kc, nc, kn.nr, packed);
            for (int i0 = 0; i0 < m; i0 += bl.mc) {
                int mc = m - i0 < bl.mc ? m - i0 : bl.mc;
                // the block's rows in tiles of as equal a height as fits (32 rows:
                // 6 6 5 5 5 5, not 6 6 6 6 6 2, whose last tile has too few accumulators
                // to hide the FMA latency)
                int tiles = (mc + kn.mr - 1) / kn.mr;
                if (packed_a) // op(A)[i][p] = a[p][i]: tile ti's panel (kc, its rows)
                    for (int ti = 0, i = 0; ti < tiles; i += mc / tiles + (ti < mc % tiles), ti++)
                        kn.pack_at(a + (size_t)p0 * lda + i0 + i, (size_t)lda, kc,
                                   mc / tiles + (ti < mc % tiles),
                                   packed_a + (size_t)ti * kc * kn.mr);
                for (int q = 0; q < nc; q += kn.nr) {
                    t.nr = nc - q < kn.nr ? nc - q : kn.nr;
                    if (direct) {
                        t.b    = b + (size_t)p0 * ldb + j0 + q;
                        t.b_ks = (size_t)ldb;
                    } else {
                        t.b    = packed + (size_t)q * kc;
                        t.b_ks = (size_t)kn.nr;
                    }
                    for (int ti = 0, i = i0; ti < tiles; ti++, i += t.mr) {
                        t.mr = mc / tiles + (ti < mc % tiles);
                        if (packed_a) {
                            t.a    = packed_a + (size_t)ti * kc * kn.mr;
                            t.a_rs = 1;
                            t.a_cs = (size_t)t.mr;
                        } else {
                            t.a    = a + (size_t)i * a_rs + (size_t)p0 * a_cs;
                            t.a_rs = a_rs;
                            t.a_cs = a_cs;
                        }
                        t.c = c + (size_t)i * ldc + j0 + q;
                        kn.tile(&t);
                    }
                }
            }
        }
    }
}

// The rows (fill.h): the same GEMM on each target's tile.
void dt_k_sgemm_ref(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float *a,
                    int lda, const float *b, int ldb, float beta, float *c, int ldc) {
    dt_k_sgemm(DT_ISA_REF, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}
#if defined(__x86_64__)
void dt_k_sgemm_avx2(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float *a,
                     int lda, const float *b, int ldb, float beta, float *c, int ldc) {
    dt_k_sgemm(DT_ISA_AVX2, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}
void dt_k_sgemm_avx512(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float *a,
                       int lda, const float *b, int ldb, float beta, float *c, int ldc) {
    dt_k_sgemm(DT_ISA_AVX512, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}
#elif defined(__aarch64__)
void dt_k_sgemm_neon(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float *a,
                     int lda, const float *b, int ldb, float beta, float *c, int ldc) {
    dt_k_sgemm(DT_ISA_NEON, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}
#endif
