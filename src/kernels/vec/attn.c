// attn.c: fused causal multi-head self-attention, flash-attention style (the rows
// behind nn/ops.h's dt_nn_attn_forward / _backward, which say what is computed; vec.h).
//
// Per (sample, head), queries are taken DT_KATTN_BLOCK rows at a time. Forward walks the
// key blocks at or left of the diagonal, keeping for each query row the running maximum
// m, the running sum l of exp(score - m) and the unnormalised output; a new block whose
// maximum is larger rescales both by exp(m_old - m_new) (the online softmax). Only one
// block x block tile of scores exists at a time, so memory is O(T d) instead of O(T^2),
// and the tile stays in L1/L2. The row's log-sum-exp m + log l is saved: backward
// recomputes each tile's probabilities exactly as exp(score - lse) and needs nothing
// else from forward but y (for D = rowsum(dy * y), the softmax's correction term):
//     dV += P^T dY,  dP = dY V^T,  dS = P (dP - D) / sqrt(d),  dQ += dS K,  dK += dS^T Q.
// Backward holds two tiles at a time (P and dP, the latter turned into dS in place).
// The products are the sgemm row of this target's table on the strided rows, so the
// packed (B, T, 3C) output of c_attn is read in place.
#include "kernels/vec/vec.h"

#include <math.h>
#include <string.h>

enum { BLOCK = DT_KATTN_BLOCK };

// The GEMM of this target's table (on the same target the attention runs on).
static void sgemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float *a,
                  int lda, const float *b, int ldb, float beta, float *c, int ldc) {
    dt_ktab_get(DT_KDEV_HOST, DT_KVEC_ISA)
        ->sgemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

static int min_int(int a, int b) {
    return a < b ? a : b;
}

// One (sample, head): q, k, v rows ld apart, y rows yld apart, lse T floats.
static void head_forward(int T, int d, int ld, int yld, const float *q, const float *k,
                         const float *v, float *y, float *lse, float *scratch) {
    float  scale = 1.0f / sqrtf((float)d);
    float *S = scratch, *acc = S + BLOCK * BLOCK, *m = acc + BLOCK * d, *l = m + BLOCK;
    for (int i0 = 0; i0 < T; i0 += BLOCK) {
        int bq = min_int(BLOCK, T - i0);
        memset(acc, 0, sizeof(float) * (size_t)bq * d);
        for (int r = 0; r < bq; r++) {
            m[r] = -INFINITY;
            l[r] = 0.0f;
        }
        for (int j0 = 0; j0 < i0 + bq; j0 += BLOCK) {
            int bk = min_int(BLOCK, T - j0);
            // S (bq, bk) = scale * Q_i (bq, d) K_j^T (d, bk)
            sgemm(false, true, bq, bk, d, scale, q + (size_t)i0 * ld, ld, k + (size_t)j0 * ld, ld,
                  0.0f, S, BLOCK);
            for (int r = 0; r < bq; r++) {
                float *row  = S + (size_t)r * BLOCK;
                int    last = min_int(bk, i0 + r - j0 + 1); // keys s <= t = i0 + r
                float  mx   = vmax_row(row, (size_t)last);
                mx          = m[r] > mx ? m[r] : mx;
                float corr  = expf(m[r] - mx); // exp(-inf) = 0 on the first block
                float sum   = vexp_row(row, (size_t)last, mx);
                for (int c = last; c < bk; c++)
                    row[c] = 0.0f;
                m[r] = mx;
                l[r] = l[r] * corr + sum;
                if (corr != 1.0f)
                    for (int e = 0; e < d; e++)
                        acc[(size_t)r * d + e] *= corr;
            }
            // acc (bq, d) += P (bq, bk) V_j (bk, d)
            sgemm(false, false, bq, d, bk, 1.0f, S, BLOCK, v + (size_t)j0 * ld, ld, 1.0f, acc, d);
        }
        for (int r = 0; r < bq; r++) {
            float  inv = 1.0f / l[r];
            float *yr  = y + (size_t)(i0 + r) * yld;
            for (int e = 0; e < d; e++)
                yr[e] = acc[(size_t)r * d + e] * inv;
            lse[i0 + r] = m[r] + logf(l[r]);
        }
    }
}

static void attn_fwd(int B, int T, int C, int H, int ld, const float *q, const float *k,
                     const float *v, float *y, float *lse, float *scratch) {
    int d = C / H;
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++) {
            size_t in = (size_t)b * T * ld + (size_t)h * d;
            head_forward(T, d, ld, C, q + in, k + in, v + in, y + (size_t)b * T * C + (size_t)h * d,
                         lse + ((size_t)b * H + h) * T, scratch);
        }
}

static void zero_rows(float *x, int rows, int d, int ld) {
    for (int r = 0; r < rows; r++)
        memset(x + (size_t)r * ld, 0, sizeof(float) * (size_t)d);
}

static void head_backward(int T, int d, int ld, int yld, const float *q, const float *k,
                          const float *v, const float *y, const float *lse, const float *dy,
                          float *dq, float *dk, float *dv, float *scratch) {
    float  scale = 1.0f / sqrtf((float)d);
    float *P = scratch, *dP = P + BLOCK * BLOCK, *D = dP + BLOCK * BLOCK;
    zero_rows(dq, T, d, ld);
    zero_rows(dk, T, d, ld);
    zero_rows(dv, T, d, ld);
    for (int i0 = 0; i0 < T; i0 += BLOCK) {
        int bq = min_int(BLOCK, T - i0);
        for (int r = 0; r < bq; r++) {
            const float *yr = y + (size_t)(i0 + r) * yld, *gr = dy + (size_t)(i0 + r) * yld;
            float        s = 0.0f;
            for (int e = 0; e < d; e++)
                s += yr[e] * gr[e];
            D[r] = s;
        }
        const float *qi = q + (size_t)i0 * ld, *dyi = dy + (size_t)i0 * yld;
        for (int j0 = 0; j0 < i0 + bq; j0 += BLOCK) {
            int          bk = min_int(BLOCK, T - j0);
            const float *kj = k + (size_t)j0 * ld, *vj = v + (size_t)j0 * ld;
            sgemm(false, true, bq, bk, d, scale, qi, ld, kj, ld, 0.0f, P, BLOCK);
            for (int r = 0; r < bq; r++) {
                float *row  = P + (size_t)r * BLOCK;
                int    last = min_int(bk, i0 + r - j0 + 1);
                vexp_row(row, (size_t)last, lse[i0 + r]);
                for (int c = last; c < bk; c++)
                    row[c] = 0.0f;
            }
            // dV_j (bk, d) += P^T (bk, bq) dY_i (bq, d)
            sgemm(true, false, bk, d, bq, 1.0f, P, BLOCK, dyi, yld, 1.0f, dv + (size_t)j0 * ld, ld);
            // dP (bq, bk) = dY_i (bq, d) V_j^T (d, bk); then dS = P (dP - D) scale
            sgemm(false, true, bq, bk, d, 1.0f, dyi, yld, vj, ld, 0.0f, dP, BLOCK);
            for (int r = 0; r < bq; r++)
                for (int c = 0; c < bk; c++) {
                    size_t o = (size_t)r * BLOCK + c;
                    dP[o]    = P[o] * (dP[o] - D[r]) * scale;
                }
            // dQ_i (bq, d) += dS (bq, bk) K_j (bk, d); dK_j (bk, d) += dS^T Q_i
            sgemm(false, false, bq, d, bk, 1.0f, dP, BLOCK, kj, ld, 1.0f, dq + (size_t)i0 * ld, ld);
            sgemm(true, false, bk, d, bq, 1.0f, dP, BLOCK, qi, ld, 1.0f, dk + (size_t)j0 * ld, ld);
        }
    }
}

static void attn_bwd(int B, int T, int C, int H, int ld, const float *q, const float *k,
                     const float *v, const float *y, const float *lse, const float *dy, float *dq,
                     float *dk, float *dv, float *scratch) {
    int d = C / H;
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++) {
            size_t in  = (size_t)b * T * ld + (size_t)h * d;
            size_t out = (size_t)b * T * C + (size_t)h * d;
            head_backward(T, d, ld, C, q + in, k + in, v + in, y + out,
                          lse + ((size_t)b * H + h) * T, dy + out, dq + in, dk + in, dv + in,
                          scratch);
        }
}

void DT_KV(fill_attn)(dt_ktab *t) {
    t->attn_fwd = attn_fwd;
    t->attn_bwd = attn_bwd;
}
