// test_conv16.c: the bf16 shifted GEMMs and their packing (nn/conv16.h) against scalar
// references on odd shapes: every block shape and edge of the kernels (rows not a
// multiple of 8 or 4, columns below 16 and not a multiple of 16 or 48, reductions not a
// multiple of 6, masked tails of the weight gradient), then a whole convolution (forward,
// input gradient, weight gradient) composed as conv2d.c composes it, against a direct
// double-precision convolution of the same bf16-rounded operands.
//
// The bound: the kernels sum exact products of bf16 values in fp32, so each result is
// within (K + 4) 2^-23 sum |a_i b_i| of the exact sum (K terms, fp32 sums in any order;
// VDPBF16PS flushes bf16 denormals, absent here since operands are O(1)), and a
// packing that put a value in the wrong place would be off by far more.
#include "../check.h"
#include "nn/conv16.h"
#include "nn/prec.h"

#include <stdint.h>
#include <stdlib.h>

static uint64_t rng_state = 0x2545f4914f6cdd1dull;
static float    rndf(void) { // uniform in [-1, 1)
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (float)((double)(uint32_t)(rng_state >> 16) / 2147483648.0 - 1.0);
}
static uint16_t rnd_bf16(void) {
    return dt_f32_to_bf16_1(rndf());
}
static double bf(uint16_t h) {
    return (double)dt_bf16_to_f32_1(h);
}

// |got - exact| <= (k + 4) 2^-23 abs_sum, element by element.
static void near_sum(const char *what, float got, double exact, double abs_sum, int k) {
    double tol = (k + 4) * 0x1p-23 * abs_sum + 1e-30;
    if (!CHECK(fabs((double)got - exact) <= tol))
        fprintf(stderr, "  %s: %.9g vs %.9g (bound %.3g)\n", what, got, exact, tol);
}

// dt_c16_shifted on random pair words at random shifts.
static void shifted_case(int rows, int R, int n) {
    int       span = n + 40;
    uint32_t *src  = malloc(sizeof(uint32_t) * (size_t)span),
             *w2   = malloc(sizeof(uint32_t) * rows * R);
    int   *off     = malloc(sizeof(int) * (size_t)R);
    float *out     = malloc(sizeof(float) * (size_t)rows * (n + 3));
    for (int i = 0; i < span; i++)
        src[i] = (uint32_t)rnd_bf16() | (uint32_t)rnd_bf16() << 16;
    for (int i = 0; i < rows * R; i++)
        w2[i] = (uint32_t)rnd_bf16() | (uint32_t)rnd_bf16() << 16;
    for (int r = 0; r < R; r++)
        off[r] = (int)((uint32_t)(rng_state = rng_state * 6364136223846793005ull + 1) >> 27) % 41;
    size_t ld = (size_t)n + 3;
    for (size_t i = 0; i < (size_t)rows * ld; i++)
        out[i] = 1234.5f; // overwritten inside, kept past n
    dt_c16_shifted(src, off, R, w2, rows, n, out, ld);
    int bad = check_failed;
    for (int o = 0; o < rows && check_failed == bad; o++) {
        for (int j = 0; j < n && check_failed == bad; j++) {
            double e = 0, a = 0;
            for (int r = 0; r < R; r++) {
                uint32_t x = src[off[r] + j], w = w2[(size_t)o * R + r];
                double   p0 = bf((uint16_t)w) * bf((uint16_t)x);
                double   p1 = bf((uint16_t)(w >> 16)) * bf((uint16_t)(x >> 16));
                e += p0 + p1;
                a += fabs(p0) + fabs(p1);
            }
            near_sum("shifted", out[(size_t)o * ld + j], e, a, 2 * R);
        }
        for (size_t j = (size_t)n; j < ld; j++)
            CHECK(out[(size_t)o * ld + j] == 1234.5f);
    }
    free(src), free(w2), free(off), free(out);
}

// dt_c16_shifted_tn over dt_c16_rows_to_pair_cols's words; dwt starts non-zero (it adds).
static void shifted_tn_case(int rows, int R, int n) {
    int       span = n + 40, ldt = (rows + 15) / 16 * 16;
    float    *g   = malloc(sizeof(float) * (size_t)rows * (n + 1));
    uint16_t *src = malloc(sizeof(uint16_t) * (size_t)span);
    uint32_t *gt  = malloc(sizeof(uint32_t) * (size_t)(n + 1) / 2 * ldt);
    int      *off = malloc(sizeof(int) * (size_t)R);
    float    *dwt = malloc(sizeof(float) * (size_t)R * ldt);
    size_t    gld = (size_t)n + 1;
    for (size_t i = 0; i < (size_t)rows * gld; i++)
        g[i] = dt_bf16_to_f32_1(rnd_bf16());
    for (int i = 0; i < span; i++)
        src[i] = rnd_bf16();
    for (int r = 0; r < R; r++)
        off[r] = (int)((uint32_t)(rng_state = rng_state * 6364136223846793005ull + 1) >> 27) % 41;
    for (int i = 0; i < R * ldt; i++)
        dwt[i] = 0.5f * (float)(i % 3);
    dt_c16_rows_to_pair_cols(g, gld, rows, n, gt, ldt);
    int bad = check_failed;
    for (int m = 0; m < (n + 1) / 2 && check_failed == bad; m++) // the words, bit for bit
        for (int o = 0; o < ldt; o++) {
            uint32_t w  = gt[(size_t)m * ldt + o];
            uint16_t lo = o < rows ? dt_f32_to_bf16_1(g[o * gld + 2 * m]) : 0;
            uint16_t hi = o < rows && 2 * m + 1 < n ? dt_f32_to_bf16_1(g[o * gld + 2 * m + 1]) : 0;
            CHECK_EQ(w, (uint32_t)lo | (uint32_t)hi << 16);
        }
    dt_c16_shifted_tn(src, off, R, n, gt, ldt, dwt);
    for (int r = 0; r < R && check_failed == bad; r++)
        for (int o = 0; o < ldt && check_failed == bad; o++) {
            double e = 0.5 * ((r * ldt + o) % 3), s = fabs(e);
            for (int j = 0; j < n && o < rows; j++) {
                double p = (double)g[o * gld + j] * bf(src[off[r] + j]);
                e += p;
                s += fabs(p);
            }
            near_sum("shifted_tn", dwt[(size_t)r * ldt + o], e, s, n + 1);
        }
    free(g), free(src), free(gt), free(off), free(dwt);
}

static void test_kernels(void) {
    const int rows[] = {1, 3, 8, 9, 17}, Rs[] = {1, 5, 6, 13},
              ns[] = {1, 7, 15, 16, 17, 33, 47, 48, 49, 63, 64, 65, 97, 130};
    for (size_t i = 0; i < sizeof rows / sizeof *rows; i++)
        for (size_t k = 0; k < sizeof Rs / sizeof *Rs; k++)
            for (size_t m = 0; m < sizeof ns / sizeof *ns; m++) {
                shifted_case(rows[i], Rs[k], ns[m]);
                shifted_tn_case(rows[i], Rs[k], ns[m]);
            }
}

// The packings against their definitions, bit for bit.
static void test_packing(void) {
    enum { C = 3, H = 5, W = 19, P = 2, HP = H + 2 * P, WP = W + 2 * P };
    float x[C * H * W];
    for (int i = 0; i < C * H * W; i++)
        x[i] = rndf() * 3.0f;
    x[7] = 0x1p-130f; // an fp32 denormal: rounded, not flushed
    uint32_t x2[2 * HP * WP];
    uint16_t xb[C * HP * WP];
    dt_c16_pack_pairs(x, C, H, W, P, x2);
    dt_c16_pack_plain(x, C, H, W, P, xb);
    for (int c = 0; c < C; c++)
        for (int i = 0; i < HP; i++)
            for (int j = 0; j < WP; j++) {
                bool     in = i >= P && i < H + P && j >= P && j < W + P;
                uint16_t v  = in ? dt_f32_to_bf16_1(x[(c * H + i - P) * W + j - P]) : 0;
                CHECK_EQ(xb[(c * HP + i) * WP + j], v);
                uint32_t word = x2[(c / 2 * HP + i) * WP + j];
                CHECK_EQ(c % 2 ? word >> 16 : word & 0xffff, v);
                if (c == C - 1) // the missing odd channel is zero
                    CHECK_EQ(word >> 16, 0);
            }
    // rows to pairs with margins
    enum { ROWS = 5, N = 37, M = 9, LD2 = M + N + 4, GLD = N + 2 };
    float g[ROWS * GLD];
    for (int i = 0; i < ROWS * GLD; i++)
        g[i] = rndf();
    uint32_t g2[3 * LD2];
    dt_c16_rows_to_pairs(g, GLD, ROWS, N, M, LD2, g2);
    for (int r = 0; r < ROWS; r++)
        for (int p = 0; p < LD2; p++) {
            bool     in   = p >= M && p < M + N;
            uint16_t v    = in ? dt_f32_to_bf16_1(g[r * GLD + p - M]) : 0;
            uint32_t word = g2[r / 2 * LD2 + p];
            CHECK_EQ(r % 2 ? word >> 16 : word & 0xffff, v);
            if (r == ROWS - 1)
                CHECK_EQ(word >> 16, 0);
        }
    // both layouts from one pass: the same words as the two functions apart
    static const int both_rows[] = {1, 5, 16, 17, 33}, both_n[] = {1, 31, 32, 33, 70};
    for (int a = 0; a < 5; a++)
        for (int b = 0; b < 5; b++) {
            int       rows = both_rows[a], n = both_n[b], ldt = (rows + 15) / 16 * 16, mg = 3;
            size_t    l2 = (size_t)mg + n + 2, ng = (size_t)(rows + 1) / 2 * l2;
            size_t    nt  = (size_t)(n + 1) / 2 * ldt;
            float    *src = malloc(sizeof(float) * (size_t)rows * (n + 1));
            uint32_t *g2a = malloc(4 * ng), *g2b = malloc(4 * ng), *gta = malloc(4 * nt),
                     *gtb = malloc(4 * nt);
            for (int i = 0; i < rows * (n + 1); i++)
                src[i] = rndf();
            dt_c16_rows_to_pairs(src, (size_t)n + 1, rows, n, mg, l2, g2a);
            dt_c16_rows_to_pair_cols(src, (size_t)n + 1, rows, n, gta, ldt);
            memset(g2b, 0xab, 4 * ng);
            dt_c16_rows_to_both(src, (size_t)n + 1, rows, n, gtb, ldt, mg, l2, g2b);
            CHECK(memcmp(g2a, g2b, 4 * ng) == 0);
            CHECK(memcmp(gta, gtb, 4 * nt) == 0);
            free(src), free(g2a), free(g2b), free(gta), free(gtb);
        }
    // weights (o, c, kk): pairs of channels, and transposed pairs of output channels
    enum { O = 3, CI = 5, KK = 4 };
    uint16_t w[O * CI * KK];
    for (int i = 0; i < O * CI * KK; i++)
        w[i] = rnd_bf16();
    uint32_t w2[O * 3 * KK], wt2[CI * 2 * KK];
    dt_c16_weight_pairs(w, O, CI, KK, w2);
    dt_c16_weight_pairs_t(w, O, CI, KK, wt2);
    for (int o = 0; o < O; o++)
        for (int c = 0; c < CI; c++)
            for (int t = 0; t < KK; t++) {
                uint16_t v = w[(o * CI + c) * KK + t];
                uint32_t a = w2[o * 3 * KK + c / 2 * KK + t];
                uint32_t b = wt2[c * 2 * KK + o / 2 * KK + t];
                CHECK_EQ(c % 2 ? a >> 16 : a & 0xffff, v);
                CHECK_EQ(o % 2 ? b >> 16 : b & 0xffff, v);
            }
    CHECK_EQ(w2[0 * 3 * KK + 2 * KK] >> 16, 0);  // channel 5 does not exist
    CHECK_EQ(wt2[0 * 2 * KK + 1 * KK] >> 16, 0); // nor output channel 3
}

// A whole convolution (stride 1, padding p) composed as conv2d.c does, against a direct
// convolution in double of the same bf16 values.
static void conv_case(int ci, int co, int h, int w, int k, int p) {
    int    hp = h + 2 * p, wp = w + 2 * p, ho = hp - k + 1, wo = wp - k + 1, kk = k * k;
    int    n = ho * wp - (k - 1), c2 = (ci + 1) / 2, o2 = (co + 1) / 2;
    int    margin = (k - 1) * (wp + 1);
    size_t plane = (size_t)hp * wp, ld = (size_t)margin + plane;
    float *x = malloc(sizeof(float) * ci * h * w), *dyc = malloc(sizeof(float) * co * ho * wo);
    float *wf = malloc(sizeof(float) * co * ci * kk);
    for (int i = 0; i < ci * h * w; i++)
        x[i] = dt_bf16_to_f32_1(rnd_bf16());
    for (int i = 0; i < co * ho * wo; i++)
        dyc[i] = dt_bf16_to_f32_1(rnd_bf16());
    uint16_t *w16 = malloc(sizeof(uint16_t) * co * ci * kk);
    for (int i = 0; i < co * ci * kk; i++)
        wf[i] = dt_bf16_to_f32_1(w16[i] = rnd_bf16());
    // kernels
    uint32_t *x2  = malloc(sizeof(uint32_t) * c2 * plane),
             *w2  = malloc(sizeof(uint32_t) * co * c2 * kk);
    int       ldt = (co + 15) / 16 * 16;
    uint16_t *xb  = malloc(sizeof(uint16_t) * ci * plane);
    uint32_t *gt  = malloc(sizeof(uint32_t) * (n + 1) / 2 * ldt);
    float    *dwt = calloc((size_t)ci * kk * ldt, sizeof(float));
    uint32_t *g2  = malloc(sizeof(uint32_t) * o2 * ld),
             *wt2 = malloc(sizeof(uint32_t) * ci * o2 * kk);
    float *y = malloc(sizeof(float) * co * n), *dyw = calloc((size_t)co * n, sizeof(float));
    float *dxp = malloc(sizeof(float) * ci * plane),
          *dw  = calloc((size_t)co * ci * kk, sizeof(float));
    int *of = malloc(sizeof(int) * c2 * kk), *ob = malloc(sizeof(int) * o2 * kk),
        *op = malloc(sizeof(int) * ci * kk);
    for (int c = 0; c < ci; c++)
        for (int t = 0; t < kk; t++) {
            int sh             = t / k * wp + t % k;
            of[c / 2 * kk + t] = (int)(c / 2 * plane) + sh;
            op[c * kk + t]     = (int)(c * plane) + sh;
        }
    for (int o = 0; o < o2; o++)
        for (int t = 0; t < kk; t++)
            ob[o * kk + t] = (int)(o * ld) + margin - (t / k * wp + t % k);
    for (int o = 0; o < co; o++) // the output gradient in the wide layout, zero past wo
        for (int i = 0; i < ho; i++)
            for (int j = 0; j < wo; j++)
                dyw[(size_t)o * n + i * wp + j] = dyc[(o * ho + i) * wo + j];
    dt_c16_weight_pairs(w16, co, ci, kk, w2);
    dt_c16_pack_pairs(x, ci, h, w, p, x2);
    dt_c16_shifted(x2, of, c2 * kk, w2, co, n, y, (size_t)n);
    dt_c16_pack_plain(x, ci, h, w, p, xb);
    dt_c16_rows_to_pair_cols(dyw, (size_t)n, co, n, gt, ldt);
    dt_c16_shifted_tn(xb, op, ci * kk, n, gt, ldt, dwt);
    for (int o = 0; o < co; o++)
        for (int r = 0; r < ci * kk; r++)
            dw[o * ci * kk + r] = dwt[r * ldt + o];
    dt_c16_weight_pairs_t(w16, co, ci, kk, wt2);
    dt_c16_rows_to_pairs(dyw, (size_t)n, co, n, margin, ld, g2);
    dt_c16_shifted(g2, ob, o2 * kk, wt2, ci, (int)plane, dxp, plane);
    // reference: x padded in double
#define XP(c, i, j)                                                                                \
    ((i) < p || (i) >= h + p || (j) < p || (j) >= w + p ? 0.0                                      \
                                                        : (double)x[((c)*h + (i)-p) * w + (j)-p])
    int bad = check_failed;
    for (int o = 0; o < co && check_failed == bad; o++)
        for (int i = 0; i < ho; i++)
            for (int j = 0; j < wo; j++) {
                double e = 0, a = 0;
                for (int c = 0; c < ci; c++)
                    for (int t = 0; t < kk; t++) {
                        double v = (double)wf[(o * ci + c) * kk + t] * XP(c, i + t / k, j + t % k);
                        e += v;
                        a += fabs(v);
                    }
                near_sum("conv y", y[(size_t)o * n + i * wp + j], e, a, 2 * c2 * kk);
            }
    for (int o = 0; o < co && check_failed == bad; o++)
        for (int c = 0; c < ci; c++)
            for (int t = 0; t < kk; t++) {
                double e = 0, a = 0;
                for (int i = 0; i < ho; i++)
                    for (int j = 0; j < wo; j++) {
                        double v = (double)dyc[(o * ho + i) * wo + j] * XP(c, i + t / k, j + t % k);
                        e += v;
                        a += fabs(v);
                    }
                near_sum("conv dW", dw[(o * ci + c) * kk + t], e, a, n);
            }
    for (int c = 0; c < ci && check_failed == bad; c++)
        for (int i = 0; i < hp; i++)
            for (int j = 0; j < wp; j++) { // gradient of the padded input
                double e = 0, a = 0;
                for (int o = 0; o < co; o++)
                    for (int t = 0; t < kk; t++) {
                        int oi = i - t / k, oj = j - t % k;
                        if (oi < 0 || oi >= ho || oj < 0 || oj >= wo)
                            continue;
                        double v = (double)wf[(o * ci + c) * kk + t] * dyc[(o * ho + oi) * wo + oj];
                        e += v;
                        a += fabs(v);
                    }
                near_sum("conv dx", dxp[(size_t)c * plane + i * wp + j], e, a, 2 * o2 * kk);
            }
#undef XP
    free(x), free(dyc), free(wf), free(w16), free(x2), free(w2), free(xb), free(gt), free(g2);
    free(wt2), free(y), free(dyw), free(dxp), free(dw), free(dwt), free(of), free(ob), free(op);
}

static void test_conv(void) {
    conv_case(16, 32, 26, 26, 3, 0); // the seed ConvNet's second convolution
    conv_case(5, 7, 9, 11, 3, 1);    // odd channels both sides, padding
    conv_case(3, 17, 12, 13, 3, 0);  // 17 rows: two 8-row blocks and a single row
    conv_case(6, 40, 8, 9, 3, 1);    // 40 output channels: 32 + 16 lanes of the weight gradient
    conv_case(2, 9, 6, 5, 2, 0);     // even kernel, narrow rows (n < 16)
    conv_case(4, 3, 7, 20, 5, 2);    // 5x5, padding 2
}

int main(void) {
    if (!dt_c16_usable()) {
        printf("conv16: no AVX512-BF16 here (or the path is not avx512bf16), skipped\n");
        return check_summary();
    }
    RUN(test_packing);
    RUN(test_kernels);
    RUN(test_conv);
    return check_summary();
}
