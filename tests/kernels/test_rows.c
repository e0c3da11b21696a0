// test_rows.c: every row of the kernel table on every target this machine can run, in one
// process (each target's own rows, dt_ktab_only, whatever DT_ISA says), against the ref
// target's kernel on random inputs; and, on every target, the promise each row makes
// about splitting its work (a row, channel or sample computed in a call of its own gives
// the bits of the whole call).
//
// Bounds. A row is bit for bit the same on every target when its kernel has no multiply
// feeding an add (moves, compares, lone adds or multiplies, sums in a fixed order, integer
// work): FMA contraction (avx2 up) is the only thing a target's compiler changes. Where
// there is one, ref and the target each round every operation of a chain of length L
// over terms of magnitude M at most once more or less than the other: they differ by at
// most about L u M (u = 2^-24). Each check says its L and M; the polynomial of exp
// (kernels/vmath.h) is a chain of 10 over terms up to 1.5 times its result, so the maps
// built on it get k = 64 roundings of their inputs' scale.
#include "targets.h"

#include <math.h>

static const dt_ktab *R; // the ref target's rows

// --------------------------------------------------------------- element-wise maps

static void maps(const dt_ktab *t) {
    enum { N = 1003 };
    float *x = kt_floats(N, -9, 9), *dy = kt_floats(N, -2, 2);
    x[0] = 0.0f, x[1] = -0.0f, x[2] = 90.0f, x[3] = -90.0f;
    float  a[N], b[N];
    double mag[N], mag2[N];
    for (int i = 0; i < N; i++) {
        mag[i]  = fabs(x[i]) > 1 ? fabs(x[i]) : 1;
        mag2[i] = mag[i] * (fabs(dy[i]) > 1 ? fabs(dy[i]) : 1);
    }
    t->relu_fwd(N, x, a), R->relu_fwd(N, x, b);
    kt_same("relu fwd", a, b, sizeof a);
    memcpy(a, x, sizeof a);
    t->relu_fwd(N, a, a); // in place
    kt_same("relu fwd in place", a, b, sizeof a);
    t->relu_grad(N, x, dy, a), R->relu_grad(N, x, dy, b);
    kt_same("relu bwd", a, b, sizeof a);
    t->tanh_fwd(N, x, a), R->tanh_fwd(N, x, b); // libm's tanhf on every target
    kt_same("tanh fwd", a, b, sizeof a);
    t->gelu_fwd(N, false, x, a), R->gelu_fwd(N, false, x, b); // libm's erff; no multiply-add
    kt_same("gelu fwd", a, b, sizeof a);
    t->add(N, x, dy, a), R->add(N, x, dy, b);
    kt_same("add", a, b, sizeof a);
    memcpy(a, dy, sizeof a), memcpy(b, dy, sizeof b);
    t->accumulate(N, x, a), R->accumulate(N, x, b);
    kt_same("accumulate", a, b, sizeof a);
    // exp's polynomial: 64 roundings of max(1, |x|)
    t->sigmoid_fwd(N, x, a), R->sigmoid_fwd(N, x, b);
    kt_close("sigmoid fwd", a, b, N, 64, NULL, 1);
    t->silu_fwd(N, x, a), R->silu_fwd(N, x, b);
    kt_close("silu fwd", a, b, N, 64, mag, 1);
    t->gelu_fwd(N, true, x, a), R->gelu_fwd(N, true, x, b);
    kt_close("gelu tanh fwd", a, b, N, 64, mag, 1);
    t->gelu_bwd(N, true, x, dy, a), R->gelu_bwd(N, true, x, dy, b);
    kt_close("gelu tanh bwd", a, b, N, 64, mag2, 1);
    t->silu_bwd(N, x, dy, a), R->silu_bwd(N, x, dy, b);
    kt_close("silu bwd", a, b, N, 64, mag2, 1);
    // dy (cdf + x pdf): a chain of 4 over |dy| (1 + |x|)
    t->gelu_bwd(N, false, x, dy, a), R->gelu_bwd(N, false, x, dy, b);
    kt_close("gelu bwd", a, b, N, 8, mag2, 1);
    // from the outputs y in (-1, 1): dy (1 - y^2), dy y (1 - y): chains of 3 over |dy|
    float *y = kt_floats(N, -1, 1);
    for (int i = 0; i < N; i++)
        mag[i] = fabs(dy[i]);
    t->tanh_bwd(N, y, dy, a), R->tanh_bwd(N, y, dy, b);
    kt_close("tanh bwd", a, b, N, 4, mag, 0);
    t->sigmoid_bwd(N, y, dy, a), R->sigmoid_bwd(N, y, dy, b);
    kt_close("sigmoid bwd", a, b, N, 4, mag, 0);
    free(x), free(dy), free(y);
}

// Softmax over rows of d: forward within exp's 64 roundings of 1 (outputs sum to 1);
// backward dx = y (dy - s), s a sum of d products: |ds| <= 2 d u sum |dy y|.
static void softmax(const dt_ktab *t) {
    static const int ds[] = {1, 7, 16, 33, 100};
    for (int di = 0; di < 5; di++) {
        int     d = ds[di], rows = 9;
        size_t  n = (size_t)rows * d;
        float  *x = kt_floats(n, -20, 20), *dy = kt_floats(n, -1, 1);
        float  *a = malloc(sizeof(float) * n), *b = malloc(sizeof(float) * n);
        float  *p   = malloc(sizeof(float) * n);
        double *mag = malloc(sizeof(double) * n);
        t->softmax_fwd(rows, d, x, a), R->softmax_fwd(rows, d, x, b);
        kt_close("softmax fwd", a, b, n, 64, NULL, 1);
        for (int r = 0; r < rows; r++) // a row alone: the same bits
            t->softmax_fwd(1, d, x + (size_t)r * d, p + (size_t)r * d);
        kt_same("softmax fwd by rows", p, a, sizeof(float) * n);
        for (int r = 0; r < rows; r++) {
            double s = 0, sa = 0;
            for (int i = 0; i < d; i++) {
                s += (double)dy[r * d + i] * b[r * d + i];
                sa += fabs((double)dy[r * d + i] * b[r * d + i]);
            }
            for (int i = 0; i < d; i++)
                mag[r * d + i] = fabs(b[r * d + i]) * (2 * d * sa + fabs(dy[r * d + i]) + fabs(s));
        }
        t->softmax_bwd(rows, d, b, dy, a), R->softmax_bwd(rows, d, b, dy, p);
        kt_close("softmax bwd", a, p, n, 2, mag, 0);
        free(x), free(dy), free(a), free(b), free(p), free(mag);
    }
}

// Moves, lone adds and multiplies, sums in a fixed order: bit for bit.
static void exact_loops(const dt_ktab *t) {
    enum { ROWS = 13, COLS = 37, D = 19, COUNT = 40, NUM = 7 };
    float *x = kt_floats(ROWS * COLS, -4, 4), *b = kt_floats(ROWS, -1, 1);
    float  y1[ROWS * COLS], y2[ROWS * COLS], s1[ROWS], s2[ROWS];
    memcpy(y1, x, sizeof y1), memcpy(y2, x, sizeof y2);
    t->add_row_bias(y1, b, ROWS, COLS), R->add_row_bias(y2, b, ROWS, COLS);
    kt_same("bias add", y1, y2, sizeof y1);
    for (int r = 0; r < ROWS; r++)
        s1[r] = s2[r] = b[r];
    t->row_sums_add(x, ROWS, COLS, s1), R->row_sums_add(x, ROWS, COLS, s2);
    kt_same("row sums", s1, s2, sizeof s1);
    // column sums of (ROWS, COLS), any split of the columns giving the same bits
    // (in double, each column's chain of adds in row order: the scalar loop's bits)
    double c1[COLS] = {0}, c2[COLS] = {0}, c3[COLS] = {0}, want[COLS] = {0};
    t->col_sums_f64(x, COLS, ROWS, COLS, c1), R->col_sums_f64(x, COLS, ROWS, COLS, c2);
    kt_same("bias grad columns", c1, c2, sizeof c1);
    for (int r = 0; r < ROWS; r++)
        for (int o = 0; o < COLS; o++)
            want[o] += x[r * COLS + o];
    kt_same("bias grad columns, the scalar chain", c1, want, sizeof c1);
    // a split: the first 16 columns, then the rest, each read in place
    t->col_sums_f64(x, COLS, ROWS, 16, c3);
    t->col_sums_f64(x + 16, COLS, ROWS, COLS - 16, c3 + 16);
    kt_same("bias grad columns split", c3, c1, sizeof c1);
    // the gradient shards' tree over 8 buffers of COLS, rows COLS + 3 apart
    float tr1[8 * (COLS + 3)], tr2[8 * (COLS + 3)];
    for (int i = 0; i < 8 * (COLS + 3); i++)
        tr1[i] = tr2[i] = kt_uniform(-1, 1);
    t->shard_tree(tr1, COLS + 3, 8, COLS), R->shard_tree(tr2, COLS + 3, 8, COLS);
    kt_same("shard tree", tr1, tr2, sizeof tr1);
    // global average pool and its adjoint
    t->global_avg(ROWS, COLS, x, s1), R->global_avg(ROWS, COLS, x, s2);
    kt_same("global avgpool", s1, s2, sizeof s1);
    t->global_avg_bwd(ROWS, COLS, b, y1), R->global_avg_bwd(ROWS, COLS, b, y2);
    kt_same("global avgpool bwd", y1, y2, sizeof y1);
    // dropout mask
    uint8_t mask[ROWS];
    for (int r = 0; r < ROWS; r++)
        mask[r] = kt_bits() >> 31;
    memcpy(y1, x, sizeof y1), memcpy(y2, x, sizeof y2);
    t->mask_scale(y1, mask, ROWS, COLS, 1.25f), R->mask_scale(y2, mask, ROWS, COLS, 1.25f);
    kt_same("dropout mask", y1, y2, sizeof y1);
    // Embedding's gradient (indices repeat)
    int32_t idx[COUNT];
    for (int i = 0; i < COUNT; i++)
        idx[i] = (int32_t)(kt_bits() % NUM);
    float *g = kt_floats(COUNT * D, -1, 1), w1[NUM * D] = {0}, w2[NUM * D] = {0};
    t->embedding_bwd(COUNT, D, idx, g, w1), R->embedding_bwd(COUNT, D, idx, g, w2);
    kt_same("embedding bwd", w1, w2, sizeof w1);
    free(x), free(b), free(g);
}

static void im2col(const dt_ktab *t) {
    static const dt_kconv ps[] = {
        {.cin = 3, .kh = 3, .kw = 3, .sh = 1, .sw = 1, .ph = 1, .pw = 1},
        {.cin = 2, .kh = 5, .kw = 3, .sh = 2, .sw = 3, .ph = 2, .pw = 0},
        {.cin = 4, .kh = 1, .kw = 1, .sh = 2, .sw = 2, .ph = 0, .pw = 0},
    };
    for (int i = 0; i < 3; i++) {
        const dt_kconv *p = &ps[i];
        int             h = 11, w = 9;
        int    ho = (h + 2 * p->ph - p->kh) / p->sh + 1, wo = (w + 2 * p->pw - p->kw) / p->sw + 1;
        size_t ldc = (size_t)ho * wo + 5, rows = (size_t)p->cin * p->kh * p->kw;
        float *x  = kt_floats((size_t)p->cin * h * w, -1, 1);
        float *c1 = calloc(rows * ldc, sizeof(float)), *c2 = calloc(rows * ldc, sizeof(float));
        t->im2col(p, x, h, w, ho, wo, c1, ldc), R->im2col(p, x, h, w, ho, wo, c2, ldc);
        kt_same("im2col", c1, c2, sizeof(float) * rows * ldc);
        float *d1 = kt_floats((size_t)p->cin * h * w, -1, 1),
              *d2 = kt_copy(d1, (size_t)p->cin * h * w);
        t->col2im(p, c1, ldc, h, w, ho, wo, d1), R->col2im(p, c1, ldc, h, w, ho, wo, d2);
        kt_same("col2im", d1, d2, sizeof(float) * (size_t)p->cin * h * w);
        free(x), free(c1), free(c2), free(d1), free(d2);
    }
}

// The fused convolution's wide layout (conv_wide.c): moves, compares and the bias add
// (one rounding, no multiply feeding an add) except col2im's adjoint, whose sums are taken
// in the fixed (ki, kj) order on every target: all bit for bit the same as ref. A 3x3
// kernel over a 10x12 padded input, 4 channels; rows 7 floats longer than needed.
static void wide(const dt_ktab *t) {
    enum { C = 4, K = 3, HP = 10, WP = 12, HO = HP - K + 1, WO = WP - K + 1 };
    dt_kwide g  = {.hp = HP, .wp = WP, .n = HO * WP - (K - 1), .plane = HP * WP};
    size_t   ld = (size_t)g.n + 7, ny = (size_t)C * HO * WO, np = (size_t)C * (HO / 2) * (WO / 2);
    float   *col = kt_floats((size_t)C * K * K * g.n, -1, 1), *ext = kt_floats(C * ld, -2, 2);
    float   *b = kt_floats(C, -1, 1), *dy = kt_floats(ny, -1, 1), *y = kt_floats(ny, -1, 1);
    float    d1[C * HP * WP], d2[C * HP * WP], y1[C * HO * WO], y2[C * HO * WO];
    t->wide_col2im(col, C, K, &g, d1), R->wide_col2im(col, C, K, &g, d2);
    kt_same("wide col2im", d1, d2, sizeof d1);
    for (int relu = 0; relu < 2; relu++) {
        t->wide_to_out(ext, ld, b, C, HO, WO, &g, relu, y1);
        R->wide_to_out(ext, ld, b, C, HO, WO, &g, relu, y2);
        kt_same("wide out", y1, y2, sizeof y1);
        float *e1 = kt_floats(C * ld, 0, 0), *e2 = kt_floats(C * ld, 0, 0);
        t->grad_to_wide(dy, y, C, HO, WO, &g, relu, e1, ld);
        R->grad_to_wide(dy, y, C, HO, WO, &g, relu, e2, ld);
        kt_same("wide grad", e1, e2, sizeof(float) * C * ld);
        free(e1), free(e2);
    }
    // no bias (a convolution before a BatchNorm): the rows as they are, + 0
    t->wide_to_out(ext, ld, NULL, C, HO, WO, &g, false, y1);
    for (int o = 0; o < C; o++)
        for (int i = 0; i < HO; i++)
            for (int j = 0; j < WO; j++)
                y2[(o * HO + i) * WO + j] = ext[(size_t)o * ld + (size_t)i * WP + j] + 0.0f;
    kt_same("wide out, no bias", y1, y2, sizeof y1);
    float   p1[C * (HO / 2) * (WO / 2)], p2[C * (HO / 2) * (WO / 2)];
    uint8_t a1[C * (HO / 2) * (WO / 2)], a2[C * (HO / 2) * (WO / 2)];
    t->wide_to_pool(ext, ld, b, C, HO, WO, &g, p1, a1);
    R->wide_to_pool(ext, ld, b, C, HO, WO, &g, p2, a2);
    kt_same("wide pool", p1, p2, sizeof p1);
    kt_same("wide pool winners", a1, a2, sizeof a1);
    float *e1 = kt_floats(C * ld, 0, 0), *e2 = kt_floats(C * ld, 0, 0), *pg = kt_floats(np, -1, 1);
    t->pool_grad_to_wide(pg, p1, a1, C, HO, WO, &g, e1, ld);
    R->pool_grad_to_wide(pg, p1, a1, C, HO, WO, &g, e2, ld);
    kt_same("wide pool grad", e1, e2, sizeof(float) * C * ld);
    free(col), free(ext), free(b), free(dy), free(y), free(e1), free(e2), free(pg);
}

// ------------------------------------------------------------------ shifted GEMMs

// out[o][j] = sum_{r < R} w[o][r] src[off[r] + j]: R products and sums, so ref and a
// target differ by at most 2 (R + 1) u sum |w src|.
static void shifted(const dt_ktab *t) {
    enum { ROWS = 19, RR = 29, N = 117, SRC = 512 };
    int    off[RR];
    float *src = kt_floats(SRC, -1, 1), *w = kt_floats(ROWS * RR, -1, 1);
    for (int r = 0; r < RR; r++)
        off[r] = (int)(kt_bits() % (SRC - N));
    static float  a[ROWS * N], b[ROWS * N], c[ROWS * N];
    static double mag[ROWS * N];
    for (int o = 0; o < ROWS; o++)
        for (int j = 0; j < N; j++) {
            double m = 0;
            for (int r = 0; r < RR; r++)
                m += fabs((double)w[o * RR + r] * src[off[r] + j]);
            mag[o * N + j] = m;
        }
    for (int add = 0; add < 2; add++) {
        for (int i = 0; i < ROWS * N; i++)
            a[i] = b[i] = c[i] = add ? kt_uniform(-1, 1) : 0.0f;
        t->shifted_gemm(src, off, RR, w, ROWS, N, a, N, add),
            R->shifted_gemm(src, off, RR, w, ROWS, N, b, N, add);
        kt_close("shifted gemm", a, b, ROWS * N, 2 * (RR + 2), mag, 1e-30);
        // rows in calls of their own (other block shapes): the same bits
        for (int o0 = 0; o0 < ROWS; o0 += 5) {
            int nr = ROWS - o0 < 5 ? ROWS - o0 : 5;
            t->shifted_gemm(src, off, RR, w + o0 * RR, nr, N, c + o0 * N, N, add);
        }
        kt_same("shifted gemm by rows", c, a, sizeof a);
    }
    // dw[o][r] += sum_j a[o][j] src[off[r] + j]
    enum { NT = 53 };
    float        *g = kt_floats(ROWS * NT, -1, 1);
    static float  dw1[ROWS * RR], dw2[ROWS * RR], dw3[ROWS * RR];
    static double mdw[ROWS * RR];
    for (int i = 0; i < ROWS * RR; i++)
        dw1[i] = dw2[i] = dw3[i] = kt_uniform(-1, 1);
    for (int o = 0; o < ROWS; o++)
        for (int r = 0; r < RR; r++) {
            double m = fabs(dw1[o * RR + r]);
            for (int j = 0; j < NT; j++)
                m += fabs((double)g[o * NT + j] * src[off[r] + j]);
            mdw[o * RR + r] = m;
        }
    t->shifted_gemm_nt(g, NT, ROWS, src, off, RR, NT, dw1),
        R->shifted_gemm_nt(g, NT, ROWS, src, off, RR, NT, dw2);
    kt_close("shifted gemm nt", dw1, dw2, ROWS * RR, 2 * (NT + 2), mdw, 1e-30);
    for (int o0 = 0; o0 < ROWS; o0 += 3) {
        int nr = ROWS - o0 < 3 ? ROWS - o0 : 3;
        t->shifted_gemm_nt(g + o0 * NT, NT, nr, src, off, RR, NT, dw3 + o0 * RR);
    }
    kt_same("shifted gemm nt by rows", dw3, dw1, sizeof dw1);
    // gradient shards: 4 shards of the RR rows, out += their tree-combined products
    int   start[4] = {0, 7, 7, 20}, len[4] = {7, 0, 13, 9};
    float tile[4 * DT_KSHARD_ROWS * DT_KSHARD_COLS];
    enum { NS = 45 };
    static float  o1[ROWS * NS], o2[ROWS * NS];
    float        *ws = kt_floats(ROWS * RR, -1, 1);
    static double mo[ROWS * NS];
    for (int i = 0; i < ROWS * NS; i++)
        o1[i] = o2[i] = kt_uniform(-1, 1);
    for (int o = 0; o < ROWS; o++)
        for (int j = 0; j < NS; j++) {
            double m = fabs(o1[o * NS + j]);
            for (int s = 0; s < 4; s++)
                for (int r = 0; r < len[s]; r++)
                    m += fabs((double)ws[ROWS * start[s] + o * len[s] + r] *
                              src[off[start[s] + r] + j]);
            mo[o * NS + j] = m;
        }
    t->shifted_gemm_shards(src, off, start, len, 4, ws, ROWS, NS, tile, o1, NS);
    R->shifted_gemm_shards(src, off, start, len, 4, ws, ROWS, NS, tile, o2, NS);
    kt_close("shifted gemm shards", o1, o2, ROWS * NS, 2 * (RR + 4), mo, 1e-30);
    free(src), free(w), free(g), free(ws);
}

// A reduction longer than the kernels' chunks of it (avx2 walks r in chunks sized from
// L1, carrying sums through out): within the same bound of ref, and the same bits when
// rows or columns (a sample's positions) are computed in calls of their own.
static void shifted_long(const dt_ktab *t) {
    enum { ROWS = 13, RR = 300, N = 70, SRC = 1024 };
    int    off[RR];
    float *src = kt_floats(SRC, -1, 1), *w = kt_floats(ROWS * RR, -1, 1);
    for (int r = 0; r < RR; r++)
        off[r] = (int)(kt_bits() % (SRC - N));
    static float  a[ROWS * N], b[ROWS * N], c[ROWS * N], d[ROWS * N];
    static double mag[ROWS * N];
    for (int i = 0; i < ROWS * N; i++) {
        double m = 0;
        for (int r = 0; r < RR; r++)
            m += fabs((double)w[i / N * RR + r] * src[off[r] + i % N]);
        mag[i] = m;
    }
    t->shifted_gemm(src, off, RR, w, ROWS, N, a, N, false);
    R->shifted_gemm(src, off, RR, w, ROWS, N, b, N, false);
    kt_close("shifted gemm, long reduction", a, b, ROWS * N, 2 * (RR + 2), mag, 1e-30);
    for (int o0 = 0; o0 < ROWS; o0 += 4) {
        int nr = ROWS - o0 < 4 ? ROWS - o0 : 4;
        t->shifted_gemm(src, off, RR, w + o0 * RR, nr, N, c + o0 * N, N, false);
    }
    kt_same("shifted gemm, long reduction, by rows", c, a, sizeof a);
    // avx2's tiles promise it (a column's chain does not depend on n); vec's move their
    // last block back to end at n, so there a column's path depends on n
    if (strcmp(t->from[DT_KROW_shifted_gemm], dt_isa_name(DT_ISA_AVX2)) == 0) {
        t->shifted_gemm(src, off, RR, w, ROWS, 29, d, N, false);
        t->shifted_gemm(src + 29, off, RR, w, ROWS, N - 29, d + 29, N, false);
        kt_same("shifted gemm, long reduction, by columns", d, a, sizeof a);
    }
    free(src), free(w);
}

// Gradient shards over Linear's layout (rows of x `in` floats apart, 4096 bytes here, the
// stride that made avx2 pack them) and over rows far into `off` (avx2 packs only when
// every shard's rows lie within its buffer): within the shards' bound of ref, and the
// same bits packed or not and with the columns split into calls of their own.
static void shifted_shards_layout(const dt_ktab *t) {
    enum { ROWS = 11, IN = 1024, NR = 40, FAR = 400, NS = 45, S = 4 };
    float        *src = kt_floats((size_t)FAR * IN, -1, 1), *ws = kt_floats(ROWS * NR, -1, 1);
    static int    off_near[FAR], off_far[FAR];
    static float  a[ROWS * NS], b[ROWS * NS], c[ROWS * NS], d[ROWS * NS];
    static double mag[ROWS * NS];
    float         tile[S * DT_KSHARD_ROWS * DT_KSHARD_COLS];
    int           start[S] = {0, 9, 9, 25}, len[S] = {9, 0, 16, 15}, far[S];
    for (int r = 0; r < NR; r++) // the same rows of x: at the front of off, or at its end
        off_near[r] = off_far[FAR - NR + r] = r * IN;
    for (int m = 0; m < S; m++)
        far[m] = start[m] + FAR - NR;
    for (int i = 0; i < ROWS * NS; i++) {
        a[i] = b[i] = c[i] = d[i] = kt_uniform(-1, 1);
        double m                  = fabs(a[i]);
        for (int s = 0; s < S; s++)
            for (int r = 0; r < len[s]; r++)
                m += fabs((double)ws[ROWS * start[s] + i / NS * len[s] + r] *
                          src[off_near[start[s] + r] + i % NS]);
        mag[i] = m;
    }
    t->shifted_gemm_shards(src, off_near, start, len, S, ws, ROWS, NS, tile, a, NS);
    R->shifted_gemm_shards(src, off_near, start, len, S, ws, ROWS, NS, tile, b, NS);
    kt_close("shifted gemm shards, rows 4096 bytes apart", a, b, ROWS * NS, 2 * (NR + S), mag,
             1e-30);
    float *wf = kt_floats((size_t)ROWS * FAR, -1, 1); // shard m's weights at rows * far[m]
    memcpy(wf + ROWS * (FAR - NR), ws, sizeof(float) * ROWS * NR);
    t->shifted_gemm_shards(src, off_far, far, len, S, wf, ROWS, NS, tile, c, NS);
    kt_same("shifted gemm shards, rows far into off", c, a, sizeof a);
    // by columns: avx2's promise only (vec's tiles move their last block back to end at
    // n, so there a column's path depends on n; see shifted_long)
    if (strcmp(t->from[DT_KROW_shifted_gemm_shards], dt_isa_name(DT_ISA_AVX2)) == 0) {
        t->shifted_gemm_shards(src, off_near, start, len, S, ws, ROWS, 21, tile, d, NS);
        t->shifted_gemm_shards(src + 21, off_near, start, len, S, ws, ROWS, NS - 21, tile, d + 21,
                               NS);
        kt_same("shifted gemm shards, by columns", d, a, sizeof a);
    }
    free(src), free(ws), free(wf);
}

// The shifted GEMM over Linear's input-gradient layout (rows of W 1024 floats apart, which
// avx2 copies to consecutive lines block by block): within the bound of ref, and the same
// bits as calls of 16 columns, too narrow a block to be copied.
static void shifted_far_rows(const dt_ktab *t) {
    enum { ROWS = 7, RR = 90, N = 75, LD = 1024 };
    int           off[RR];
    float        *src = kt_floats((size_t)RR * LD, -1, 1), *w = kt_floats(ROWS * RR, -1, 1);
    static float  a[ROWS * N], b[ROWS * N], c[ROWS * N];
    static double mag[ROWS * N];
    for (int r = 0; r < RR; r++)
        off[r] = r * LD;
    for (int i = 0; i < ROWS * N; i++) {
        double m = 0;
        for (int r = 0; r < RR; r++)
            m += fabs((double)w[i / N * RR + r] * src[off[r] + i % N]);
        mag[i] = m;
    }
    t->shifted_gemm(src, off, RR, w, ROWS, N, a, N, false);
    R->shifted_gemm(src, off, RR, w, ROWS, N, b, N, false);
    kt_close("shifted gemm, rows a page apart", a, b, ROWS * N, 2 * (RR + 2), mag, 1e-30);
    if (strcmp(t->from[DT_KROW_shifted_gemm], dt_isa_name(DT_ISA_AVX2)) == 0) { // as above
        for (int j = 0; j < N; j += 16)
            t->shifted_gemm(src + j, off, RR, w, ROWS, N - j < 16 ? N - j : 16, c + j, N, false);
        kt_same("shifted gemm, rows a page apart, by 16 columns", c, a, sizeof a);
    }
    free(src), free(w);
}

// The sgemm row: within the bound of test_gemm ((k + 2) u sum |a b|) of a double product.
static void sgemm(const dt_ktab *t) {
    enum { M = 23, N = 37, K = 70 };
    float *a = kt_floats(M * K, -1, 1), *b = kt_floats(K * N, -1, 1), c[M * N];
    double mag[M * N];
    float  want[M * N];
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            double s = 0, m = 0;
            for (int p = 0; p < K; p++) {
                s += (double)a[i * K + p] * b[p * N + j];
                m += fabs((double)a[i * K + p] * b[p * N + j]);
            }
            want[i * N + j] = (float)s;
            mag[i * N + j]  = m;
        }
    t->sgemm(false, false, M, N, K, 1.0f, a, K, b, N, 0.0f, c, N);
    kt_close("sgemm", c, want, M * N, K + 3, mag, 1e-30);
    free(a), free(b);
}

// -------------------------------------------------------------------------- norms

// BatchNorm over (n, c, l): the statistics are float lane sums of a row (l terms) added
// in double, so |d sum| <= 2 l u sum |x - k| and |d m2| <= 4 l u sum (x - k)^2, k the
// shift near the mean; apply and backward are chains of a few over their terms.
static void batchnorm(const dt_ktab *t) {
    enum { NB = 5, C = 7, L = 45 };
    size_t n = (size_t)NB * C * L;
    float *x = kt_floats(n, 2, 4), *dy = kt_floats(n, -1, 1), *res = kt_floats(n, -1, 1);
    double s1[C], q1[C], s2[C], q2[C], s3[C], q3[C];
    t->bn_stats(NB, C, 0, C, L, x, s1, q1), R->bn_stats(NB, C, 0, C, L, x, s2, q2);
    for (int c = 0; c < C; c++) {
        double sa = 0, qa = 0;
        for (int i = 0; i < NB; i++)
            for (int j = 0; j < L; j++) {
                double v = x[((size_t)i * C + c) * L + j];
                sa += fabs(v);
                qa += (v - 3) * (v - 3) + 1;
            }
        CHECK(fabs(s1[c] - s2[c]) <= 2 * L * U * sa);
        CHECK(fabs(q1[c] - q2[c]) <= 4 * L * U * qa);
    }
    // channels [2, 5) alone: the same bits as in the whole call
    t->bn_stats(NB, C, 2, 5, L, x, s3, q3);
    CHECK(memcmp(s3, s1 + 2, 3 * sizeof(double)) == 0 &&
          memcmp(q3, q1 + 2, 3 * sizeof(double)) == 0);
    float mean[C], invstd[C], gamma[C], beta[C];
    for (int c = 0; c < C; c++) {
        mean[c]   = (float)(s2[c] / (NB * L));
        invstd[c] = (float)(1 / sqrt(q2[c] / (NB * L) + 1e-5));
        gamma[c]  = kt_uniform(0.5f, 1.5f);
        beta[c]   = kt_uniform(-1, 1);
    }
    float *y1 = malloc(sizeof(float) * n), *y2 = malloc(sizeof(float) * n),
          *y3   = malloc(sizeof(float) * n);
    double *mag = malloc(sizeof(double) * n);
    for (size_t i = 0; i < n; i++) {
        int c  = (int)(i / L % C);
        mag[i] = fabs(x[i] * invstd[c] * gamma[c]) + fabs(mean[c] * invstd[c] * gamma[c]) +
                 fabs(beta[c]) + fabs(res[i]);
    }
    for (int mode = 0; mode < 2; mode++) { // plain; + residual and ReLU
        const float *r = mode ? res : NULL;
        t->bn_apply(NB, C, L, 0, NB * C, x, mean, invstd, gamma, beta, r, mode, y1);
        R->bn_apply(NB, C, L, 0, NB * C, x, mean, invstd, gamma, beta, r, mode, y2);
        kt_close("batchnorm apply", y1, y2, n, 8, mag, 0);
        t->bn_apply(NB, C, L, 0, 11, x, mean, invstd, gamma, beta, r, mode, y3); // rows split
        t->bn_apply(NB, C, L, 11, NB * C, x, mean, invstd, gamma, beta, r, mode, y3);
        kt_same("batchnorm apply by rows", y3, y1, sizeof(float) * n);
    }
    // backward statistics and apply: plain, behind a ReLU from y, from x, with dres
    for (int mode = 0; mode < 3; mode++) {
        dt_kbn_relu        relu = {mode == 1 ? y2 : NULL, gamma, beta};
        const dt_kbn_relu *rp   = mode ? &relu : NULL;
        float              sd1[C], sx1[C], sd2[C], sx2[C], sd3[C], sx3[C];
        t->bn_bwd_stats(NB, C, 0, C, L, x, dy, rp, mean, invstd, sd1, sx1, mode == 2 ? y1 : NULL);
        R->bn_bwd_stats(NB, C, 0, C, L, x, dy, rp, mean, invstd, sd2, sx2, mode == 2 ? y3 : NULL);
        for (int c = 0; c < C; c++) {
            double da = 0, xa = 0;
            for (int i = 0; i < NB; i++)
                for (int j = 0; j < L; j++) {
                    size_t o = ((size_t)i * C + c) * L + j;
                    da += fabs(dy[o]);
                    xa += fabs(dy[o] * (x[o] - mean[c]) * invstd[c]) + fabs(dy[o]);
                }
            // a ReLU mask recomputed from x may differ where x sc + sh is within a
            // rounding of 0: a term of dy there moves both sums by at most its size
            CHECK(fabs(sd1[c] - sd2[c]) <= 2 * L * U * da + (mode == 2 ? 2.0 : 0.0));
            CHECK(fabs(sx1[c] - sx2[c]) <= 4 * L * U * xa + (mode == 2 ? 8.0 : 0.0));
        }
        // channels [3, C) alone (written at their own indices, unlike bn_stats' sums)
        t->bn_bwd_stats(NB, C, 3, C, L, x, dy, rp, mean, invstd, sd3, sx3, NULL);
        CHECK(memcmp(sd3 + 3, sd1 + 3, sizeof(float) * (C - 3)) == 0 &&
              memcmp(sx3 + 3, sx1 + 3, sizeof(float) * (C - 3)) == 0);
        for (int train = 0; train < 2; train++) {
            double count = train ? (double)NB * L : 0.0;
            t->bn_bwd_apply(NB, C, L, 0, NB * C, x, dy, rp, mean, invstd, gamma, sd2, sx2, count,
                            y1);
            R->bn_bwd_apply(NB, C, L, 0, NB * C, x, dy, rp, mean, invstd, gamma, sd2, sx2, count,
                            y3);
            for (size_t i = 0; i < n; i++) {
                int c  = (int)(i / L % C);
                mag[i] = fabs(gamma[c] * invstd[c]) *
                         (fabs(dy[i]) + fabs(sd2[c]) / (NB * L) +
                          fabs((x[i] - mean[c]) * sx2[c] * invstd[c]) / (NB * L) + 1);
            }
            kt_close("batchnorm bwd apply", y1, y3, n, 8, mag, 0);
            float *y4 = malloc(sizeof(float) * n);
            t->bn_bwd_apply(NB, C, L, 0, 20, x, dy, rp, mean, invstd, gamma, sd2, sx2, count, y4);
            t->bn_bwd_apply(NB, C, L, 20, NB * C, x, dy, rp, mean, invstd, gamma, sd2, sx2, count,
                            y4);
            kt_same("batchnorm bwd apply by rows", y4, y1, sizeof(float) * n);
            free(y4);
        }
    }
    free(x), free(dy), free(res), free(y1), free(y2), free(y3), free(mag);
}

// LayerNorm over rows of d: mean and variance are sums of d terms (2 d u of their
// magnitude), y a chain of 3 more; a row alone gives the bits of the whole call, and the
// parameter gradients, added row by row, the bits of one call over all rows.
static void layernorm(const dt_ktab *t) {
    enum { ROWS = 6, D = 83 };
    float *x = kt_floats(ROWS * D, -3, 5), *g = kt_floats(D, 0.5f, 1.5f), *b = kt_floats(D, -1, 1);
    float *dy = kt_floats(ROWS * D, -1, 1);
    float  y1[ROWS * D], y2[ROWS * D], y3[ROWS * D], m1[ROWS], m2[ROWS], r1[ROWS], r2[ROWS],
        m3[ROWS], r3[ROWS];
    double mag[ROWS * D];
    t->ln_fwd(ROWS, D, 1e-5f, x, g, b, y1, m1, r1), R->ln_fwd(ROWS, D, 1e-5f, x, g, b, y2, m2, r2);
    kt_close("layernorm mean", m1, m2, ROWS, 4 * D, NULL, 5);
    kt_close("layernorm rstd", r1, r2, ROWS, 8 * D, NULL, 0);
    for (int i = 0; i < ROWS * D; i++)
        mag[i] = (fabs(x[i]) + 5) * r2[i / D] * (4 * D) * fabs(g[i % D]) + fabs(b[i % D]);
    kt_close("layernorm fwd", y1, y2, ROWS * D, 1, mag, 0);
    for (int r = 0; r < ROWS; r++)
        t->ln_fwd(1, D, 1e-5f, x + r * D, g, b, y3 + r * D, m3 + r, r3 + r);
    kt_same("layernorm fwd by rows", y3, y1, sizeof y1);
    float dx1[ROWS * D], dx2[ROWS * D], dg1[D] = {0}, db1[D] = {0}, dg2[D] = {0}, db2[D] = {0},
                                        dg3[D] = {0}, db3[D] = {0};
    t->ln_bwd(ROWS, D, x, g, m2, r2, dy, dx1, dg1, db1);
    R->ln_bwd(ROWS, D, x, g, m2, r2, dy, dx2, dg2, db2);
    for (int i = 0; i < ROWS * D; i++)
        mag[i] = r2[i / D] * (fabs(dy[i] * g[i % D]) + 4 * D * 8.0);
    kt_close("layernorm bwd", dx1, dx2, ROWS * D, 4, mag, 0);
    for (int i = 0; i < D; i++)
        mag[i] = ROWS * 4 * 8.0;
    kt_close("layernorm dgamma", dg1, dg2, D, 4, mag, 0);
    kt_same("layernorm dbeta", db1, db2, sizeof db1);
    t->ln_bwd(2, D, x, g, m2, r2, dy, dx2, dg3, db3);
    t->ln_bwd(ROWS - 2, D, x + 2 * D, g, m2 + 2, r2 + 2, dy + 2 * D, dx2 + 2 * D, dg3, db3);
    kt_same("layernorm bwd by rows", dx2, dx1, sizeof dx1);
    kt_same("layernorm dgamma by rows", dg3, dg1, sizeof dg1);
    free(x), free(g), free(b), free(dy);
}

// --------------------------------------------------------------------- attention

// Causal attention of (B, T, C) with H heads: outputs are averages of v (|v| <= 1) with
// weights from exp, scores sums of d products: within 64 (T + d) roundings of 1, the
// gradients likewise of their magnitudes. A sample alone gives the bits of the batch.
static void attention(const dt_ktab *t) {
    enum { B = 2, T = 70, C = 32, H = 2, LD = 3 * C };
    size_t nq = (size_t)B * T * LD, ny = (size_t)B * T * C;
    float *qkv = kt_floats(nq, -1, 1), *dy = kt_floats(ny, -1, 1);
    float *scratch = malloc(
        sizeof(float) *
        (2 * DT_KATTN_BLOCK * DT_KATTN_BLOCK + DT_KATTN_BLOCK * (C / H) + 2 * DT_KATTN_BLOCK) * 2);
    float *y1 = malloc(sizeof(float) * ny), *y2 = malloc(sizeof(float) * ny),
          *y3 = malloc(sizeof(float) * ny);
    float l1[B * H * T], l2[B * H * T], l3[B * H * T];
    t->attn_fwd(B, T, C, H, LD, qkv, qkv + C, qkv + 2 * C, y1, l1, scratch);
    R->attn_fwd(B, T, C, H, LD, qkv, qkv + C, qkv + 2 * C, y2, l2, scratch);
    kt_close("attention fwd", y1, y2, ny, 64 * (T + C), NULL, 1);
    kt_close("attention lse", l1, l2, B * H * T, 64 * (T + C), NULL, 1);
    for (int b = 0; b < B; b++)
        t->attn_fwd(1, T, C, H, LD, qkv + (size_t)b * T * LD, qkv + (size_t)b * T * LD + C,
                    qkv + (size_t)b * T * LD + 2 * C, y3 + (size_t)b * T * C, l3 + b * H * T,
                    scratch);
    kt_same("attention fwd by samples", y3, y1, sizeof(float) * ny);
    float *g1 = calloc(nq, sizeof(float)), *g2 = calloc(nq, sizeof(float)),
          *g3 = calloc(nq, sizeof(float));
    t->attn_bwd(B, T, C, H, LD, qkv, qkv + C, qkv + 2 * C, y2, l2, dy, g1, g1 + C, g1 + 2 * C,
                scratch);
    R->attn_bwd(B, T, C, H, LD, qkv, qkv + C, qkv + 2 * C, y2, l2, dy, g2, g2 + C, g2 + 2 * C,
                scratch);
    kt_close("attention bwd", g1, g2, nq, 64 * (T + C), NULL, 4);
    for (int b = 0; b < B; b++) {
        size_t o = (size_t)b * T * LD, oy = (size_t)b * T * C;
        t->attn_bwd(1, T, C, H, LD, qkv + o, qkv + o + C, qkv + o + 2 * C, y2 + oy, l2 + b * H * T,
                    dy + oy, g3 + o, g3 + o + C, g3 + o + 2 * C, scratch);
    }
    kt_same("attention bwd by samples", g3, g1, sizeof(float) * nq);
    free(qkv), free(dy), free(scratch), free(y1), free(y2), free(y3), free(g1), free(g2), free(g3);
}

// Cross-entropy's rows: log-sum-exp over k logits (64 roundings of its size plus k of
// the sum's), and the gradient (exp's 64 roundings of 1).
static void cross_entropy(const dt_ktab *t) {
    static const int ks[] = {1, 10, 16, 77};
    for (int i = 0; i < 4; i++) {
        int    k  = ks[i];
        float *x  = kt_floats((size_t)k, -30, 30), d1[80], d2[80];
        double l1 = t->ce_row_lse(x, k), l2 = R->ce_row_lse(x, k);
        CHECK(fabs(l1 - l2) <= (64.0 + k) * U * (fabs(l2) + 1));
        t->ce_row_grad(x, k, (float)l2, 0.01f, 0.5f, d1, k / 2, 0.45f);
        R->ce_row_grad(x, k, (float)l2, 0.01f, 0.5f, d2, k / 2, 0.45f);
        kt_close("cross-entropy grad", d1, d2, (size_t)k, 64, NULL, 1);
        free(x);
    }
}

// -------------------------------------------------------------------- optimizers

// Each update is a chain of a few operations per element over its terms; the elements
// are independent, so any split of the buffer gives the same bits.
static void optimizers(const dt_ktab *t) {
    enum { N = 301 };
    float *p0 = kt_floats(N, -1, 1), *g = kt_floats(N, -1, 1), *s0 = kt_floats(N, 0, 1);
    float  p1[N], p2[N], p3[N], b1[N], b2[N], b3[N];
    double mag[N];
    for (unsigned f = 0; f < 16; f++) {
        if ((f & (DT_KSGD_NESTEROV | DT_KSGD_FIRST)) && !(f & DT_KSGD_MOMENTUM))
            continue; // not a flag set the optimizer forms
        dt_ksgd k = {0.1f, 0.01f, 0.9f, 0.9f};
        memcpy(p1, p0, sizeof p1), memcpy(p2, p0, sizeof p2), memcpy(p3, p0, sizeof p3);
        memcpy(b1, s0, sizeof b1), memcpy(b2, s0, sizeof b2), memcpy(b3, s0, sizeof b3);
        t->sgd(p1, g, b1, N, k, f), R->sgd(p2, g, b2, N, k, f);
        for (int i = 0; i < N; i++)
            mag[i] = fabs(p0[i]) + 4 * (fabs(g[i]) + fabs(p0[i]) + fabs(s0[i]));
        kt_close("sgd", p1, p2, N, 8, mag, 0);
        kt_close("sgd momentum", b1, b2, N, 8, mag, 0);
        t->sgd(p3, g, b3, 100, k, f), t->sgd(p3 + 100, g + 100, b3 + 100, N - 100, k, f);
        kt_same("sgd split", p3, p1, sizeof p1);
    }
    dt_kadam ka = {0.9f, 0.999f, 0.1f, 0.001f, 0.01f, 1.0f, 0.001f, 0.05f, 1e-8f};
    for (unsigned f = 0; f < 4; f++) {
        float m1[N], m2[N], v1[N], v2[N], x1[N], x2[N], d1[N], d2[N];
        memcpy(m1, g, sizeof m1), memcpy(m2, g, sizeof m2);
        memcpy(v1, s0, sizeof v1), memcpy(v2, s0, sizeof v2);
        memcpy(x1, s0, sizeof x1), memcpy(x2, s0, sizeof x2);
        t->adam_moments(p0, g, m1, v1, x1, d1, N, ka, f),
            R->adam_moments(p0, g, m2, v2, x2, d2, N, ka, f);
        kt_close("adam m", m1, m2, N, 4, NULL, 1);
        kt_close("adam v", v1, v2, N, 4, NULL, 1);
        kt_close("adam v hat", d1, d2, N, 4, NULL, 1);
        memcpy(p1, p0, sizeof p1), memcpy(p2, p0, sizeof p2);
        t->adam_apply(p1, m2, s0, N, ka), R->adam_apply(p2, m2, s0, N, ka);
        for (int i = 0; i < N; i++)
            mag[i] = fabs(p0[i]) + 4 * ka.step_size * fabs(m2[i]) / (s0[i] / ka.bc2_sqrt + ka.eps);
        kt_close("adam apply", p1, p2, N, 4, mag, 0);
    }
    dt_kadadelta kd = {1.0f, 0.9f, 0.1f, 1e-6f, 0.01f};
    for (int wd = 0; wd < 2; wd++) {
        kd.wd = wd ? 0.01f : 0.0f;
        float q1[N], q2[N], sv1[N], sv2[N], su1[N], su2[N], a1[N], a2[N];
        memcpy(q1, s0, sizeof q1), memcpy(q2, s0, sizeof q2);
        t->adadelta_sq(p0, g, q1, s0, sv1, su1, N, kd),
            R->adadelta_sq(p0, g, q2, s0, sv2, su2, N, kd);
        kt_close("adadelta square", q1, q2, N, 4, NULL, 1);
        kt_same("adadelta u + eps", su1, su2, sizeof su1);
        memcpy(p1, p0, sizeof p1), memcpy(p2, p0, sizeof p2), memcpy(a1, s0, sizeof a1),
            memcpy(a2, s0, sizeof a2);
        t->adadelta_delta(p1, g, a1, sv2, su2, N, kd),
            R->adadelta_delta(p2, g, a2, sv2, su2, N, kd);
        for (int i = 0; i < N; i++)
            mag[i] = fabs(p0[i]) +
                     4 * (fabs(g[i]) + fabs(p0[i])) * (su2[i] / sv2[i]) * (1 + su2[i] / sv2[i]);
        kt_close("adadelta delta", p1, p2, N, 4, mag, 0);
        kt_close("adadelta acc", a1, a2, N, 4, mag, 1);
    }
    // norms in double: n products and sums of squares, 2 n 2^-53 of their sum
    double ss1 = t->sum_squares(g, N), ss2 = R->sum_squares(g, N);
    CHECK(fabs(ss1 - ss2) <= 2.0 * N * 0x1p-53 * ss2);
    memcpy(p1, g, sizeof p1), memcpy(p2, g, sizeof p2);
    t->scale(p1, N, 0.3f), R->scale(p2, N, 0.3f);
    kt_same("grad scale", p1, p2, sizeof p1);
    memcpy(p1, g, sizeof p1), memcpy(p2, g, sizeof p2);
    CHECK(!t->unscale_check(p1, N, 0.25f) && !R->unscale_check(p2, N, 0.25f));
    kt_same("grad unscale", p1, p2, sizeof p1);
    p1[N - 1] = INFINITY, p1[0] = NAN;
    CHECK(t->unscale_check(p1, N, 0.25f));
    p1[0] = 1, p1[N - 1] = 1, p1[37] = -INFINITY;
    CHECK(t->unscale_check(p1, N, 0.25f));
    memcpy(p1, s0, sizeof p1), memcpy(p2, s0, sizeof p2);
    t->vsqrt(p1, N), R->vsqrt(p2, N); // correctly rounded everywhere
    kt_same("sqrt", p1, p2, sizeof p1);
    free(p0), free(g), free(s0);
}

// ------------------------------------------------------------ comm's reductions

// Lone adds, multiplies and compares: bit for bit, for every dtype and op, with the
// destination an operand too (in place), NaN and signed zeros among the floats.
static void reductions(const dt_ktab *t) {
    enum { N = 203 };
    static const dt_dtype     dts[] = {DT_FLOAT32, DT_INT32, DT_INT64};
    static const dt_reduce_op ops[] = {DT_REDUCE_SUM, DT_REDUCE_AVG, DT_REDUCE_PROD, DT_REDUCE_MAX,
                                       DT_REDUCE_MIN};
    for (int di = 0; di < 3; di++)
        for (int oi = 0; oi < 5; oi++) {
            size_t  es = dts[di] == DT_INT64 ? 8 : 4;
            uint8_t a[N * 8], b[N * 8], d1[N * 8], d2[N * 8];
            for (size_t i = 0; i < N * es / 4; i++) {
                uint32_t ua = kt_bits(), ub = kt_bits();
                if (dts[di] == DT_FLOAT32) {
                    float fa = kt_uniform(-4, 4), fb = i % 7 == 0 ? fa : kt_uniform(-4, 4);
                    fa = i == 3 ? NAN : i == 5 ? 0.0f : fa;
                    fb = i == 4 ? NAN : i == 5 ? -0.0f : fb;
                    memcpy(&ua, &fa, 4), memcpy(&ub, &fb, 4);
                }
                memcpy(a + 4 * i, &ua, 4), memcpy(b + 4 * i, &ub, 4);
            }
            t->reduce(dts[di], ops[oi], d1, a, b, N), R->reduce(dts[di], ops[oi], d2, a, b, N);
            kt_same("reduce", d1, d2, N * es);
            memcpy(d1, a, N * es);
            t->reduce(dts[di], ops[oi], d1, d1, b, N); // in place
            kt_same("reduce in place", d1, d2, N * es);
            if (oi == 0) {
                uint8_t o2[N * 8];
                t->reduce_sum2(dts[di], d1, o2, a, b, N);
                kt_same("reduce sum2", d1, d2, N * es);
                kt_same("reduce sum2 copy", o2, d2, N * es);
            }
        }
    float *x = kt_floats(N, -5, 5), y1[N], y2[N];
    for (int d = 2; d <= 3; d++) {
        memcpy(y1, x, sizeof y1), memcpy(y2, x, sizeof y2);
        t->reduce_div(y1, N, d), R->reduce_div(y2, N, d);
        kt_same("reduce div", y1, y2, sizeof y1);
    }
    free(x);
}

// ------------------------------------------------------------------------ main

typedef struct row_test {
    const char *name;
    void (*run)(const dt_ktab *t);
    bool (*has)(const dt_ktab *t);
} row_test;

static bool has_maps(const dt_ktab *t) {
    return t->relu_fwd != NULL;
}
static bool has_softmax(const dt_ktab *t) {
    return t->softmax_fwd != NULL;
}
static bool has_exact(const dt_ktab *t) {
    return t->add_row_bias != NULL;
}
static bool has_im2col(const dt_ktab *t) {
    return t->im2col != NULL;
}
static bool has_wide(const dt_ktab *t) {
    return t->wide_to_out != NULL;
}
static bool has_shifted(const dt_ktab *t) {
    return t->shifted_gemm != NULL;
}
static bool has_sgemm(const dt_ktab *t) {
    return t->sgemm != NULL;
}
static bool has_bn(const dt_ktab *t) {
    return t->bn_stats != NULL;
}
static bool has_ln(const dt_ktab *t) {
    return t->ln_fwd != NULL;
}
static bool has_attn(const dt_ktab *t) {
    return t->attn_fwd != NULL;
}
static bool has_ce(const dt_ktab *t) {
    return t->ce_row_lse != NULL;
}
static bool has_optim(const dt_ktab *t) {
    return t->sgd != NULL;
}
static bool has_reduce(const dt_ktab *t) {
    return t->reduce != NULL;
}

int main(void) {
    static const row_test tests[] = {
        {"element-wise", maps, has_maps},
        {"softmax", softmax, has_softmax},
        {"exact loops", exact_loops, has_exact},
        {"im2col", im2col, has_im2col},
        {"wide layout", wide, has_wide},
        {"shifted gemm", shifted, has_shifted},
        {"shifted gemm, long", shifted_long, has_shifted},
        {"shifted gemm shards, layout", shifted_shards_layout, has_shifted},
        {"shifted gemm, rows a page apart", shifted_far_rows, has_shifted},
        {"sgemm", sgemm, has_sgemm},
        {"batchnorm", batchnorm, has_bn},
        {"layernorm", layernorm, has_ln},
        {"attention", attention, has_attn},
        {"cross-entropy", cross_entropy, has_ce},
        {"optimizers", optimizers, has_optim},
        {"reductions", reductions, has_reduce},
    };
    char   line[320];
    dt_isa ts[DT_ISA_COUNT_];
    int    nt = kt_targets(ts);
    printf("# %s\n", dt_kernels_describe(line, sizeof line));
    R = dt_ktab_only(DT_ISA_REF);
    for (int i = 0; i < nt; i++) {
        const dt_ktab *t = dt_ktab_only(ts[i]);
        for (size_t j = 0; j < sizeof tests / sizeof tests[0]; j++) {
            if (!tests[j].has(t))
                continue;
            static char name[64];
            snprintf(name, sizeof name, "%s %s", dt_isa_name(ts[i]), tests[j].name);
            check_current = name;
            int f0        = check_failed;
            tests[j].run(t);
            fprintf(stderr, "%s %s\n", check_failed == f0 ? "ok  " : "FAIL", name);
        }
    }
    return check_summary();
}
