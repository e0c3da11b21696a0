// linear.c: torch.nn.Linear (y = x W^T + b over the last dimension of any input, but
// for trailing dimensions of 1, W (out, in), b (out)) as one team layer (layer.h's DT_LAYER_TEAM):
// every thread of the graph calls it at once, with the whole batch's buffers.
//
// A sample of per-sample shape (..., in) is R = numel / in rows. Forward multiplies
// this thread's samples' rows. Backward first lets every thread write its rows of the
// output gradient, then splits the weight gradient dW = dy^T x by input columns: each
// thread forms its columns over all rows with one product, so no per-thread copy of a
// large weight gradient is ever summed; the bias gradient by outputs likewise; dx by
// rows again.
//
// The products: with AVX-512, and with AVX2 for long rows (linear_direct), the
// shifted-GEMM tiles with plain row offsets (forward y += x W^T with rows of x and W both
// contiguous, dW = dy^T x over a transposed copy of dy, dx = dy W); elsewhere dtrain's GEMM
// (dt_sgemm, whose rows do not depend on how many a call gets); in bf16 the bf16 GEMM
// over bf16 copies of x and dy, each rounded once (the 16-bit saved state); fp16 through
// prec.h's autocast product.
//
// Gradient shards (dt_graph_set_grad_shards, S shards, sample s in shard s % S): the
// weight gradient is each shard's sum over its samples' rows in increasing order, the
// shards combined by the fixed tree of dt_nn_shard_tree, whatever the thread split: a
// transposed copy of dy in shard-major order, then per chunk of columns (at fixed
// places: a column takes the same kernel path whatever the thread count) every shard's
// product into a tile of its own, the tree over the tiles, the sum added into dW.
#include "core/tree.h"
#include "kernels/cpu.h"
#include "nn/blas.h"
#include "nn/layers/layers_impl.h"
#include "nn/nn_impl.h"
#include "nn/prec.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

typedef struct linear_cfg {
    int  in, out;
    bool bias;
    // set by setup
    int  rows;    // R: rows per sample
    bool direct;  // the shifted-GEMM tiles (AVX2, AVX-512)
    int *offsets; // the rows of W (out rows of `in` floats), for the shifted tiles; owned
} linear_cfg;

// Columns of the weight gradient one chunk of the sharded path covers.
#define CHUNK NN_SHARD_COLS

static int shard_len(int batch, int shards, int m) { // samples of shard m
    return m < batch ? (batch - m + shards - 1) / shards : 0;
}
static int shard_start(int batch, int shards, int m) { // its first, shard-major
    int q = batch / shards, r = batch % shards;        // shards below r hold q + 1
    return m * q + (m < r ? m : r);
}

// The saved state of a batch: the transposed output gradient (out, rows) in floats, then
// Whether the shifted tiles take this layer. With AVX-512 they do, as tuned there. With
// AVX2 (16 ymm registers) they win on long rows of x and lose on short ones, as measured
// on an AMD EPYC Zen 3: the ConvNet's fc1 (rows of 4608 floats) gains on them, its
// sharded weight gradient walking short per-shard reductions over rows the tiles copy
// together, while dtrain-gpt's rows of 128 and 512 run faster on the GEMM's packed tiles
// (20 steps in 13.2-13.3 s of CPU against 16.2-17.5 s). The cut lies between the two:
// rows longer than a quarter of L1 (2048 floats on 32 KiB). DT_CONV=gemm turns the
// shifted tiles off everywhere.
static bool linear_direct(int in) {
    if (!dt_nn_want_direct())
        return false;
    if (dt_isa_on(DT_ISA_AVX512))
        return true;
    return (size_t)in * sizeof(float) > dt_cpu_get()->l1d / 4;
}

// one int offset per row (the shifted tiles' and the sharded path's row table).
static float *dyt_of(const dt_layer_args *a) {
    return a->saved;
}
static int *xoff_of(const linear_cfg *p, const dt_layer_args *a) {
    return (int *)(void *)(a->saved + (size_t)p->out * (size_t)p->rows * (size_t)a->batch);
}
// bf16: the batch's x then dy rounded once (16-bit saved state), NULL without it.
static uint16_t *x16_of(const linear_cfg *p, const dt_layer_args *a) {
    (void)p;
    return a->saved16;
}
static uint16_t *dy16_of(const linear_cfg *p, const dt_layer_args *a) {
    return a->saved16 ? a->saved16 + (size_t)p->in * (size_t)p->rows * (size_t)a->batch : NULL;
}

static dt_status linear_setup(const dt_layer *l, int nin, const dt_shape *in, dt_layer_setup *s) {
    linear_cfg *p = l->config;
    DT_TRY(lay_expect("linear", nin, in, 1, 1, DT_SHAPE_MAX_DIMS));
    // the features are the last dimension but for trailing ones: a Sequential model's
    // flat (features, 1, 1) is (features)
    int fd = in[0].ndim - 1;
    while (fd > 0 && in[0].d[fd] == 1 && p->in != 1)
        fd--;
    char b[64];
    if (in[0].d[fd] != p->in)
        return dt_fail(DT_ERR_ARG, "linear: expected %d input features (last dimension), found %s",
                       p->in, dt_shape_str(&in[0], b, sizeof b));
    s->out       = in[0];
    s->out.d[fd] = p->out;
    lay_tensor(&s->params[0], "weight", 0, 2, p->out, p->in, 0, 0);
    lay_tensor(&s->params[1], "bias", DT_PARAM_NO_DECAY, 1, p->out, 0, 0, 0);
    s->nparams = p->bias ? 2 : 1;
    p->rows    = (int)(dt_shape_numel(&in[0]) / (size_t)p->in);
    p->direct  = linear_direct(p->in);
    dt_free(p->offsets);
    if (!(p->offsets = dt_alloc(sizeof(int) * (size_t)p->out)))
        return DT_ERR_NOMEM;
    for (int o = 0; o < p->out; o++)
        p->offsets[o] = o * p->in;
    size_t r              = (size_t)p->rows;
    s->saved_per_sample   = ((size_t)p->out + 1) * r;             // dy transposed, then row offsets
    s->saved16_per_sample = ((size_t)p->in + (size_t)p->out) * r; // bf16: x then dy
    s->flops_per_sample   = 2.0 * (double)dt_shape_numel(&in[0]) * p->out;
    s->lowp_params        = 1u; // the weight's 16-bit shadow
    s->run                = DT_LAYER_TEAM;
    s->grad               = DT_LAYER_GRAD_SHARED;
    // per shard: its tile of the weight gradient (out x CHUNK); per sample: the rows of
    // x of one chunk, gathered for a shard's product on the GEMM path
    s->scratch_per_shard  = (size_t)(p->out > NN_SHARD_ROWS ? p->out : NN_SHARD_ROWS) * CHUNK;
    s->scratch_per_sample = r * CHUNK;
    s->scratch_fixed      = 2 * (size_t)p->out; // the bias gradient's sums, in double
    return DT_OK;
}

static void linear_init(const dt_layer *l, dt_rng *rng, float *const *w, float *const *buf) {
    (void)buf;
    const linear_cfg *p = l->config;
    dt_nn_linear_init(p->in, p->out, rng, w[0], p->bias ? w[1] : NULL);
}

static void linear_free(void *config) {
    linear_cfg *p = config;
    if (p)
        dt_free(p->offsets);
    dt_free(p);
}

// This thread's rows [r0, r1) of the batch.
static void rows_of(const linear_cfg *p, const dt_layer_team *t, int *r0, int *r1) {
    *r0 = t->s0 * p->rows;
    *r1 = t->s1 * p->rows;
}

static dt_status linear_forward(const dt_layer *l, const dt_layer_args *a) {
    const linear_cfg *p = l->config;
    int               r0, r1, fin = p->in, fout = p->out;
    rows_of(p, a->team, &r0, &r1);
    int n = r1 - r0;
    if (n <= 0)
        return DT_OK;
    const float *x = a->x[0] + (size_t)r0 * fin, *b = p->bias ? a->w[1] : NULL;
    float       *y = a->y + (size_t)r0 * fout;
    if (a->precision == DT_PREC_BF16 && a->saved16) { // y = x16 W16^T + b
        uint16_t *x16 = x16_of(p, a) + (size_t)r0 * fin;
        dt_f32_to_bf16(x, x16, (size_t)n * fin);
        return dt_gemm_bf16_bias(false, true, n, fout, fin, x16, fin, a->w16[0], fin, b, y, fout);
    }
    for (int r = 0; r < n; r++) // the sums start from the bias
        if (b)
            memcpy(y + (size_t)r * fout, b, sizeof(float) * (size_t)fout);
        else
            memset(y + (size_t)r * fout, 0, sizeof(float) * (size_t)fout);
    if (a->precision != DT_PREC_FP32) // y += x W^T with 16-bit operands (prec.h)
        return dt_ac_gemm(a->precision, false, true, n, fout, fin, x, NULL, fin, a->w[0],
                          a->w16 ? a->w16[0] : NULL, fin, y, fout, true);
    if (p->direct) // y[r][o] += sum_i x[r][i] W[o][i], a fixed order whatever n
        dt_nn_shifted_gemm_nt(x, (size_t)fin, n, a->w[0], p->offsets, fout, fin, y);
    else // y (n, out) += x (n, in) W^T (in, out)
        dt_sgemm(false, true, n, fout, fin, 1.0f, x, fin, a->w[0], fin, 1.0f, y, fout);
    return DT_OK;
}

// dx (n, in) = dy (n, out) W (out, in), rows [r0, r1).
static dt_status input_grad(const linear_cfg *p, const dt_layer_args *a, int r0, int r1) {
    int          n = r1 - r0, fin = p->in, fout = p->out;
    const float *dy = a->dy + (size_t)r0 * fout;
    float       *dx = a->dx[0] + (size_t)r0 * fin;
    if (n <= 0)
        return DT_OK;
    if (a->precision == DT_PREC_BF16 && a->saved16)
        return dt_gemm_bf16(false, false, n, fin, fout, dy16_of(p, a) + (size_t)r0 * fout, fout,
                            a->w16[0], fin, dx, fin, false);
    if (a->precision != DT_PREC_FP32)
        return dt_ac_gemm(a->precision, false, false, n, fin, fout, dy, NULL, fout, a->w[0],
                          a->w16 ? a->w16[0] : NULL, fin, dx, fin, false);
    if (p->direct) // dx[r][i] = sum_o dy[r][o] W[o][i]
        dt_nn_shifted_gemm(a->w[0], p->offsets, fout, dy, n, fin, dx, (size_t)fin, false);
    else
        dt_sgemm(false, false, n, fin, fout, 1.0f, dy, fout, a->w[0], fin, 0.0f, dx, fin);
    return DT_OK;
}

// The bias gradient's outputs [o0, o1): each shard's sum over its samples' rows (S 0:
// one sum over all rows) in increasing order, in double, the shards by the fixed tree.
// Rows are walked in memory order; sums holds (o1 - o0) doubles per shard.
static void bias_grad(const linear_cfg *p, const dt_layer_args *a, int S, int o0, int o1,
                      double *sums) {
    int batch = a->batch, R = p->rows, fout = p->out, nm = S ? S : 1, w = o1 - o0;
    if (w <= 0)
        return;
    memset(sums, 0, sizeof(double) * (size_t)nm * (size_t)w);
    for (int s = 0; s < batch; s++)
        dt_k()->col_sums_f64(a->dy + (size_t)s * R * fout + o0, (size_t)fout, R, w,
                             sums + (size_t)(s % nm) * w);
    for (int o = 0; o < w; o++) {
        float acc[NN_MAX_SHARDS];
        for (int m = 0; m < nm; m++)
            acc[m] = (float)sums[(size_t)m * w + o];
        if (S)
            dt_nn_shard_tree(acc, 1, S, 1);
        a->dw[1][o0 + o] += acc[0];
    }
}

// dst[r][c] += src[r][c] for rows x cols, rows ld_src and ld_dst floats apart.
static void add_rows(const float *src, size_t ld_src, float *dst, size_t ld_dst, int rows,
                     int cols) {
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++)
            dst[(size_t)r * ld_dst + c] += src[(size_t)r * ld_src + c];
}

// The weight gradient's columns [jc, jc + cw) under S shards on dtrain's GEMM: shard
// m's rows of x (the chunk's columns) gathered in its order, one product into its tile.
static void shard_chunk_gemm(const linear_cfg *p, const dt_layer_args *a, int S, const int *st,
                             const int *len, int jc, int cw, float *tile, float *xg) {
    int          fout = p->out;
    const float *dyt  = dyt_of(a);
    const int   *xoff = xoff_of(p, a);
    for (int m = 0; m < S; m++) {
        float *t = tile + (size_t)m * fout * CHUNK;
        int    n = len[m];
        for (int q = 0; q < n; q++)
            memcpy(xg + (size_t)q * cw, a->x[0] + xoff[st[m] + q] + jc, sizeof(float) * (size_t)cw);
        // tile (out, cw) = dyt_m (out, n) xg (n, cw): the shard's rows in increasing order
        dt_sgemm(false, false, fout, cw, n, 1.0f, dyt + (size_t)fout * st[m], n, xg, cw, 0.0f, t,
                 CHUNK);
    }
    for (int h = dt_tree_top(S); h >= 1; h /= 2) // the fixed tree over the shards' tiles
        for (int k = 0; k < h && k + h < S; k++)
            add_rows(tile + (size_t)(k + h) * fout * CHUNK, CHUNK, tile + (size_t)k * fout * CHUNK,
                     CHUNK, fout, cw);
    add_rows(tile, CHUNK, a->dw[0] + jc, (size_t)p->in, fout, cw);
}

static dt_status backward_sharded(const linear_cfg *p, const dt_layer_args *a) {
    const dt_layer_team *t   = a->team;
    int                  fin = p->in, fout = p->out, batch = a->batch, S = t->shards, R = p->rows;
    float               *dyt  = dyt_of(a); // shard-major (out, n_m) blocks of rows
    int                 *xoff = xoff_of(p, a);
    for (int s = t->s0; s < t->s1; s++) {
        int m = s % S, i = s / S, st = shard_start(batch, S, m) * R, n = shard_len(batch, S, m) * R;
        for (int j = 0; j < R; j++) {
            int pos = st + i * R + j, row = s * R + j;
            for (int o = 0; o < fout; o++)
                dyt[(size_t)fout * st + (size_t)o * n + (pos - st)] = a->dy[(size_t)row * fout + o];
            xoff[pos] = row * fin;
        }
    }
    dt_layer_team_meet(a); // every thread's rows of dy are written
    int st[NN_MAX_SHARDS], len[NN_MAX_SHARDS];
    for (int m = 0; m < S; m++) {
        st[m]  = shard_start(batch, S, m) * R;
        len[m] = shard_len(batch, S, m) * R;
    }
    int nch = (fin + CHUNK - 1) / CHUNK;
    int k0 = (int)((long)nch * t->ith / t->nth), k1 = (int)((long)nch * (t->ith + 1) / t->nth);
    for (int k = k0; k < k1; k++) {
        int jc = k * CHUNK, cw = fin - jc < CHUNK ? fin - jc : CHUNK;
        if (p->direct) // the shifted tiles: per band of rows, every shard's tile in L1
            dt_nn_shifted_gemm_shards(a->x[0] + jc, xoff, st, len, S, dyt, fout, cw, a->scratch,
                                      a->dw[0] + jc, (size_t)fin);
        else
            shard_chunk_gemm(p, a, S, st, len, jc, cw, a->scratch,
                             a->scratch + (size_t)S * fout * CHUNK);
    }
    if (p->bias) { // the scratch's tiles are done with: its start holds the sums
        int o0 = (int)((long)fout * t->ith / t->nth),
            o1 = (int)((long)fout * (t->ith + 1) / t->nth);
        bias_grad(p, a, S, o0, o1, (double *)(void *)a->scratch);
    }
    if (!a->dx[0])
        return DT_OK;
    int r0, r1;
    rows_of(p, t, &r0, &r1);
    return input_grad(p, a, r0, r1);
}

static dt_status linear_backward(const dt_layer *l, const dt_layer_args *a) {
    const linear_cfg    *p = l->config;
    const dt_layer_team *t = a->team;
    bool bf16 = a->precision == DT_PREC_BF16 && a->saved16, lowp = a->precision != DT_PREC_FP32;
    // bf16 takes the unsharded path with gradient shards too: its weight gradient is one
    // bf16 product over the batch (invariance is promised in fp32 only), where the
    // shards' fixed tree would keep it in fp32 (as fp16 does)
    if (t->shards && a->precision != DT_PREC_BF16)
        return backward_sharded(p, a);
    int    fin = p->in, fout = p->out, rows = p->rows * a->batch, r0, r1;
    float *dw   = a->dw[0];
    float *dyt  = dyt_of(a); // (out, rows), then the row offsets
    int   *xoff = xoff_of(p, a);
    rows_of(p, t, &r0, &r1);
    if (bf16 && r1 > r0) // this thread's rows of dy, rounded once for both products
        dt_f32_to_bf16(a->dy + (size_t)r0 * fout, dy16_of(p, a) + (size_t)r0 * fout,
                       (size_t)(r1 - r0) * fout);
    if (p->direct && !lowp) // this thread's rows of dy, transposed, for dW = dy^T x
        for (int r = r0; r < r1; r++) {
            for (int o = 0; o < fout; o++)
                dyt[(size_t)o * rows + r] = a->dy[(size_t)r * fout + o];
            xoff[r] = r * fin;
        }
    dt_layer_team_meet(a); // every thread's rows of dy are written
    // This thread's input columns [j0, j1) of dW (out, in) += dy^T (out, rows) x (rows, in)
    int j0 = (int)((long)fin * t->ith / t->nth), j1 = (int)((long)fin * (t->ith + 1) / t->nth);
    dt_status st = DT_OK;
    if (j1 > j0 && bf16)
        st = dt_gemm_bf16(true, false, fout, j1 - j0, rows, dy16_of(p, a), fout, x16_of(p, a) + j0,
                          fin, dw + j0, fin, true);
    else if (j1 > j0 && lowp)
        st = dt_ac_gemm(a->precision, true, false, fout, j1 - j0, rows, a->dy, NULL, fout,
                        a->x[0] + j0, NULL, fin, dw + j0, fin, true);
    else if (j1 > j0 && p->direct) // dW[o][i] += sum_r dy^T[o][r] x[r][i]
        dt_nn_shifted_gemm(a->x[0] + j0, xoff, rows, dyt, fout, j1 - j0, dw + j0, (size_t)fin,
                           true);
    else if (j1 > j0)
        dt_sgemm(true, false, fout, j1 - j0, rows, 1.0f, a->dy, fout, a->x[0] + j0, fin, 1.0f,
                 dw + j0, fin);
    DT_TRY(st);
    if (p->bias) { // this thread's outputs [o0, o1) of the bias gradient
        int o0 = (int)((long)fout * t->ith / t->nth),
            o1 = (int)((long)fout * (t->ith + 1) / t->nth);
        bias_grad(p, a, 0, o0, o1, (double *)(void *)a->scratch);
    }
    return a->dx[0] ? input_grad(p, a, r0, r1) : DT_OK;
}

static const dt_layer_ops linear_ops = {"linear",       linear_setup,    linear_init,
                                        linear_forward, linear_backward, linear_free};

dt_linear_opts dt_linear_opts_default(void) {
    return (dt_linear_opts){.bias = true};
}

dt_status dt_layer_linear_new(dt_layer **out, int in, int out_features,
                              const dt_linear_opts *opts) {
    dt_linear_opts o = opts ? *opts : dt_linear_opts_default();
    if (in < 1 || out_features < 1)
        return dt_fail(DT_ERR_ARG, "linear: expected positive sizes, found in %d out %d", in,
                       out_features);
    linear_cfg p = {.in = in, .out = out_features, .bias = o.bias};
    return lay_new(out, &linear_ops, &p, sizeof p);
}

bool lay_describe_linear(const dt_layer *l, dt_node_desc *d) {
    if (l->ops != &linear_ops)
        return false;
    const linear_cfg *p = l->config;
    snprintf(d->kind, sizeof d->kind, "linear");
    d->h.linear.in = p->in, d->h.linear.out = p->out, d->h.linear.bias = p->bias;
    return true;
}

bool lay_linear_direct(const dt_layer *l) {
    return l && l->ops == &linear_ops && ((const linear_cfg *)l->config)->direct;
}
