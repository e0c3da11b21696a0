// attn16.c: the causal self-attention of kernels/vec/attn.c with its matrix products in
// bf16 (the avx512bf16 target's rows behind nn/ops.h's dt_nn_attn16_*), as
// torch.autocast runs `q @ k^T` and `att @ v`: operands rounded to bf16, products summed
// in fp32 (VDPBF16PS); the scores, the online softmax, its log-sum-exp and every
// gradient stay fp32, and the probabilities (and their gradient) are rounded to bf16
// only as operands of the next product (ops.h).
//
// The blocking is vec/attn.c's (64 x 64 tiles, flash attention: forward keeps a running
// maximum and sum per row, backward recomputes the probabilities from the saved
// log-sum-exp). Every product is out[r][j] (+)= sum_p A(r, p) . B[p][j] over pair words,
// A's words broadcast and B's rows loaded as vectors (mm16), so each operand is laid out
// once per (sample, head) with the reduction's pairs in one word:
//   q16, dy16  rows of bf16 (the pair along d is a word of the row)      S = Q K^T, dP = dY V^T
//   kt, vt     (d/2, T) words: K, V transposed, pairs along d            (B of those two)
//   vp, kp, qp, dyp (T/2, d) words: neighbouring rows paired             P V, dS K, dS^T Q, P^T dY
// and per tile the probabilities P (and dS) as bf16 rows (A of P V and dS K) and as
// pairs of rows (A of P^T dY and dS^T Q, read down a column). Lengths are padded to
// whole tiles with zeros, so a tile is always 64 wide; the head size d must be a
// multiple of 16 (attention otherwise stays fp32: dt_nn_attn16_ok).
#include "kernels/avx512bf16/bf16k.h"
#include "kernels/vmath.h"

#include <immintrin.h>
#include <math.h>
#include <string.h>

enum { BLK = 64 };

static int tiles_of(int T) {
    return (T + BLK - 1) / BLK * BLK;
}

#define TARGET     __attribute__((target("avx512f,avx512bw,avx512bf16")))
#define PRAGMA_(x) _Pragma(#x)
#define UNROLL(n)  PRAGMA_(GCC unroll n)

// Rows [r0, r0 + NO) x columns [j, j + 16 NV) of mm16.
// clang-format off
#define DEFINE_MM(name, NO, NV)                                                               \
    TARGET static inline __attribute__((always_inline)) void name(                           \
        const uint32_t *restrict a, size_t ars, size_t aps, int r0, const uint32_t *restrict b, \
        size_t bps, int j, int np, float *restrict out, size_t ldo, bool add, float scale) { \
        __m512 acc[NO][NV];                                                                  \
        UNROLL(8) for (int o = 0; o < NO; o++) UNROLL(2) for (int v = 0; v < NV; v++)       \
            acc[o][v] = _mm512_setzero_ps();                                                 \
        const uint32_t *ar = a + (size_t)r0 * ars;                                           \
        for (int p = 0; p < np; p++) {                                                       \
            __m512i bv[NV];                                                                  \
            UNROLL(2) for (int v = 0; v < NV; v++)                                           \
                bv[v] = _mm512_loadu_si512(b + (size_t)p * bps + j + 16 * v);                \
            UNROLL(8) for (int o = 0; o < NO; o++) {                                         \
                __m512i av = _mm512_set1_epi32((int)ar[(size_t)o * ars + (size_t)p * aps]);  \
                UNROLL(2) for (int v = 0; v < NV; v++)                                       \
                    acc[o][v] = _mm512_dpbf16_ps(acc[o][v], (__m512bh)av, (__m512bh)bv[v]);  \
            }                                                                                \
        }                                                                                    \
        UNROLL(8) for (int o = 0; o < NO; o++) UNROLL(2) for (int v = 0; v < NV; v++) {     \
            float *d = out + (size_t)(r0 + o) * ldo + j + 16 * v;                             \
            _mm512_storeu_ps(d, add ? _mm512_add_ps(_mm512_loadu_ps(d), acc[o][v])           \
                                    : _mm512_mul_ps(acc[o][v], _mm512_set1_ps(scale)));      \
        }                                                                                    \
    }
// clang-format on
DEFINE_MM(mm_8x2, 8, 2)
DEFINE_MM(mm_8x1, 8, 1)
DEFINE_MM(mm_1x2, 1, 2)
DEFINE_MM(mm_1x1, 1, 1)

// out[r][j] (+)= sum_{p < np} A(r, p) . b[p * bps + j] for r < rows, j < cols (a multiple
// of 16), A(r, p) = a[r * ars + p * aps] (pair words); overwriting stores scale * sum.
TARGET __attribute__((noinline)) static void mm16(const uint32_t *a, size_t ars, size_t aps,
                                                  int rows, const uint32_t *b, size_t bps, int cols,
                                                  int np, float *out, size_t ldo, bool add,
                                                  float scale) {
    for (int r0 = 0; r0 < rows;) {
        bool full = rows - r0 >= 8;
        int  j    = 0;
        for (; j + 32 <= cols; j += 32)
            if (full)
                mm_8x2(a, ars, aps, r0, b, bps, j, np, out, ldo, add, scale);
            else
                mm_1x2(a, ars, aps, r0, b, bps, j, np, out, ldo, add, scale);
        for (; j < cols; j += 16)
            if (full)
                mm_8x1(a, ars, aps, r0, b, bps, j, np, out, ldo, add, scale);
            else
                mm_1x1(a, ars, aps, r0, b, bps, j, np, out, ldo, add, scale);
        r0 += full ? 8 : 1;
    }
}

// T rows of x (stride ld, d floats) -> bf16 rows of d, zero rows up to tp.
static void rows16(const float *x, int T, int tp, int d, size_t ld, uint16_t *out) {
    for (int r = 0; r < T; r++)
        dt_k()->f32_to_bf16(x + (size_t)r * ld, out + (size_t)r * d, (size_t)d);
    memset(out + (size_t)T * d, 0, sizeof(uint16_t) * (size_t)(tp - T) * d);
}
// T rows -> pairs of rows (tp/2, d) words, zero past the last pair.
static void row_pairs(const float *x, int T, int tp, int d, size_t ld, uint32_t *out) {
    int rp = (T + 1) / 2;
    dt_k16_rows_to_pairs(x, ld, T, d, 0, (size_t)d, out);
    memset(out + (size_t)rp * d, 0, sizeof(uint32_t) * (size_t)(tp / 2 - rp) * d);
}

// Scratch layouts of one (sample, head): operand layouts of tp * d / 2 words each, then
// the tiles.
typedef struct lay {
    uint16_t *q16, *dy16, *p16, *ds16;
    uint32_t *kt, *vt, *vp, *kp, *qp, *dyp, *ppair, *dspair;
    float    *S, *dP, *acc, *m, *l, *D;
} lay;

static lay layout(float *scratch, int T, int d) {
    size_t n = (size_t)tiles_of(T) * (size_t)d / 2, t = BLK * BLK / 2;
    lay    L;
    L.q16    = (uint16_t *)(void *)scratch;
    L.dy16   = (uint16_t *)(void *)(scratch + n);
    L.kt     = (uint32_t *)(void *)(scratch + 2 * n);
    L.vt     = L.kt + n;
    L.vp     = L.vt + n;
    L.kp     = L.vp + n;
    L.qp     = L.kp + n;
    L.dyp    = L.qp + n;
    L.ppair  = L.dyp + n;
    L.dspair = L.ppair + t;
    L.p16    = (uint16_t *)(void *)(L.dspair + t);
    L.ds16   = L.p16 + 2 * t;
    L.S      = (float *)(void *)(L.ds16 + 2 * t);
    L.dP     = L.S + BLK * BLK;
    L.acc    = L.dP + BLK * BLK;
    L.m      = L.acc + (size_t)BLK * d;
    L.l      = L.m + BLK;
    L.D      = L.l + BLK;
    return L;
}

static int min_int(int a, int b) {
    return a < b ? a : b;
}

// (The tile loops were multiversioned for the avx512bf16 path, which always took their
// x86-64-v4 version: this folder's flags.)
static void head_forward16(int T, int d, int ld, int yld, const float *q, const float *k,
                           const float *v, float *y, float *lse, const lay *L) {
    int   tp = tiles_of(T), dh = d / 2;
    float scale = 1.0f / sqrtf((float)d);
    rows16(q, T, tp, d, (size_t)ld, L->q16);
    dt_k16_rows_to_pair_cols(k, (size_t)ld, T, d, L->kt, tp);
    row_pairs(v, T, tp, d, (size_t)ld, L->vp);
    const uint32_t *q32 = (const uint32_t *)L->q16, *p32 = (const uint32_t *)L->p16;
    for (int i0 = 0; i0 < T; i0 += BLK) {
        int bq = min_int(BLK, T - i0);
        memset(L->acc, 0, sizeof(float) * (size_t)bq * d);
        for (int r = 0; r < bq; r++) {
            L->m[r] = -INFINITY;
            L->l[r] = 0.0f;
        }
        for (int j0 = 0; j0 < i0 + bq; j0 += BLK) {
            int bk = min_int(BLK, T - j0);
            // S (bq, 64) = scale * Q_i K_j^T; columns past bk are 0 (kt's padding)
            mm16(q32 + (size_t)i0 * dh, (size_t)dh, 1, bq, L->kt + j0, (size_t)tp, BLK, dh, L->S,
                 BLK, false, scale);
            for (int r = 0; r < bq; r++) {
                float *row  = L->S + (size_t)r * BLK;
                int    last = min_int(bk, i0 + r - j0 + 1); // keys s <= t = i0 + r
                float  mx   = vmax_row(row, (size_t)last);
                mx          = L->m[r] > mx ? L->m[r] : mx;
                float corr  = expf(L->m[r] - mx);
                float sum   = vexp_row(row, (size_t)last, mx);
                memset(row + last, 0, sizeof(float) * (size_t)(BLK - last));
                L->m[r] = mx;
                L->l[r] = L->l[r] * corr + sum;
                if (corr != 1.0f) // d is a multiple of 16
                    for (int e = 0; e < d; e += 16) {
                        float *a = L->acc + (size_t)r * d + e;
                        dt_store16(a, dt_load16(a) * corr);
                    }
            }
            // acc (bq, d) += P (bq, bk) V_j (bk, d), P rounded to bf16
            dt_k()->f32_to_bf16(L->S, L->p16, (size_t)bq * BLK);
            mm16(p32, BLK / 2, 1, bq, L->vp + (size_t)(j0 / 2) * d, (size_t)d, d, (bk + 1) / 2,
                 L->acc, (size_t)d, true, 1.0f);
        }
        for (int r = 0; r < bq; r++) {
            float  inv = 1.0f / L->l[r];
            float *yr  = y + (size_t)(i0 + r) * yld;
            for (int e = 0; e < d; e += 16)
                dt_store16(yr + e, dt_load16(L->acc + (size_t)r * d + e) * inv);
            lse[i0 + r] = L->m[r] + logf(L->l[r]);
        }
    }
}

static void head_backward16(int T, int d, int ld, int yld, const float *q, const float *k,
                            const float *v, const float *y, const float *lse, const float *dy,
                            float *dq, float *dk, float *dv, const lay *L) {
    int   tp = tiles_of(T), dh = d / 2;
    float scale = 1.0f / sqrtf((float)d);
    rows16(q, T, tp, d, (size_t)ld, L->q16);
    rows16(dy, T, tp, d, (size_t)yld, L->dy16);
    dt_k16_rows_to_pair_cols(k, (size_t)ld, T, d, L->kt, tp);
    dt_k16_rows_to_pair_cols(v, (size_t)ld, T, d, L->vt, tp);
    row_pairs(k, T, tp, d, (size_t)ld, L->kp);
    row_pairs(q, T, tp, d, (size_t)ld, L->qp);
    row_pairs(dy, T, tp, d, (size_t)yld, L->dyp);
    for (int r = 0; r < T; r++) {
        memset(dq + (size_t)r * ld, 0, sizeof(float) * (size_t)d);
        memset(dk + (size_t)r * ld, 0, sizeof(float) * (size_t)d);
        memset(dv + (size_t)r * ld, 0, sizeof(float) * (size_t)d);
    }
    const uint32_t *q32 = (const uint32_t *)L->q16, *dy32 = (const uint32_t *)L->dy16;
    const uint32_t *ds32 = (const uint32_t *)L->ds16;
    for (int i0 = 0; i0 < T; i0 += BLK) {
        int bq = min_int(BLK, T - i0), bqp = (bq + 1) / 2;
        for (int r = 0; r < bq; r++) {
            const float *yr = y + (size_t)(i0 + r) * yld, *gr = dy + (size_t)(i0 + r) * yld;
            dt_v16f      s = dt_splat16(0.0f);
            for (int e = 0; e < d; e += 16)
                s += dt_load16(yr + e) * dt_load16(gr + e);
            L->D[r] = dt_hsum16(s);
        }
        for (int j0 = 0; j0 < i0 + bq; j0 += BLK) {
            int bk = min_int(BLK, T - j0), bkp = (bk + 1) / 2;
            mm16(q32 + (size_t)i0 * dh, (size_t)dh, 1, bq, L->kt + j0, (size_t)tp, BLK, dh, L->S,
                 BLK, false, scale);
            for (int r = 0; r < bq; r++) {
                float *row  = L->S + (size_t)r * BLK;
                int    last = min_int(bk, i0 + r - j0 + 1);
                vexp_row(row, (size_t)last, lse[i0 + r]);
                memset(row + last, 0, sizeof(float) * (size_t)(BLK - last));
            }
            // dV_j (bk, d) += P^T (bk, bq) dY_i (bq, d): P's rows paired, read down a column
            dt_k16_rows_to_pairs(L->S, BLK, bq, BLK, 0, BLK, L->ppair);
            mm16(L->ppair, 1, BLK, bk, L->dyp + (size_t)(i0 / 2) * d, (size_t)d, d, bqp,
                 dv + (size_t)j0 * ld, (size_t)ld, true, 1.0f);
            // dP (bq, 64) = dY_i V_j^T; then dS = P (dP - D) scale
            mm16(dy32 + (size_t)i0 * dh, (size_t)dh, 1, bq, L->vt + j0, (size_t)tp, BLK, dh, L->dP,
                 BLK, false, 1.0f);
            for (int r = 0; r < bq; r++)
                for (int c = 0; c < BLK; c += 16) {
                    float *o = L->dP + (size_t)r * BLK + c;
                    dt_store16(o, dt_load16(L->S + (size_t)r * BLK + c) * (dt_load16(o) - L->D[r]) *
                                      scale);
                }
            // dQ_i (bq, d) += dS (bq, bk) K_j (bk, d); dK_j (bk, d) += dS^T Q_i
            dt_k()->f32_to_bf16(L->dP, L->ds16, (size_t)bq * BLK);
            mm16(ds32, BLK / 2, 1, bq, L->kp + (size_t)(j0 / 2) * d, (size_t)d, d, bkp,
                 dq + (size_t)i0 * ld, (size_t)ld, true, 1.0f);
            dt_k16_rows_to_pairs(L->dP, BLK, bq, BLK, 0, BLK, L->dspair);
            mm16(L->dspair, 1, BLK, bk, L->qp + (size_t)(i0 / 2) * d, (size_t)d, d, bqp,
                 dk + (size_t)j0 * ld, (size_t)ld, true, 1.0f);
        }
    }
}

void dt_k16_attn_forward(int B, int T, int C, int H, int ld, const float *q, const float *k,
                         const float *v, float *y, float *lse, float *scratch) {
    int d = C / H;
    lay L = layout(scratch, T, d);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++) {
            size_t in = (size_t)b * T * ld + (size_t)h * d;
            head_forward16(T, d, ld, C, q + in, k + in, v + in,
                           y + (size_t)b * T * C + (size_t)h * d, lse + ((size_t)b * H + h) * T,
                           &L);
        }
}

void dt_k16_attn_backward(int B, int T, int C, int H, int ld, const float *q, const float *k,
                          const float *v, const float *y, const float *lse, const float *dy,
                          float *dq, float *dk, float *dv, float *scratch) {
    int d = C / H;
    lay L = layout(scratch, T, d);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++) {
            size_t in = (size_t)b * T * ld + (size_t)h * d, out = (size_t)b * T * C + (size_t)h * d;
            head_backward16(T, d, ld, C, q + in, k + in, v + in, y + out,
                            lse + ((size_t)b * H + h) * T, dy + out, dq + in, dk + in, dv + in, &L);
        }
}
