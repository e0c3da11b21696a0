// linear.c: y = x W^T + b on flat inputs, with OpenBLAS GEMMs.
//
// Forward splits the batch by samples. The weight gradient dW = dy^T x sums over the
// whole batch, so backward first lets all threads finish writing dy, then splits dW by
// input columns: each thread computes its columns over all samples with one GEMM,
// with no per-thread copy of the (large) weight gradient to sum afterwards.
// On AVX-512 CPUs the three products run on the shifted-GEMM kernels (shifted.c) with
// plain row offsets, as the convolutions do: forward as y += x W^T with rows of x and W
// both contiguous; dW = dy^T x over the batch; dx = dy W. Elsewhere, OpenBLAS. In bf16
// the three are bf16 GEMMs (gemm16.c) over bf16 copies of x and dy (lin16 below).
// Matches torch.nn.Linear (weight (out, in), bias (out)).
#include "nn/blas.h"
#include "nn/nn_impl.h"
#include "nn/prec.h"

#include <stdlib.h>
#include <string.h>

static dt_status linear_setup(nn_layer *l) {
    if (l->in.h != 1 || l->in.w != 1)
        return dt_fail(DT_ERR_ARG,
                       "layer %d linear: expected a flat input (features, 1, 1), found (%d, %d, "
                       "%d); add a flatten layer first",
                       l->index, l->in.c, l->in.h, l->in.w);
    if (l->out_c < 1)
        return dt_fail(DT_ERR_ARG, "layer %d linear: expected out_features >= 1, found %d",
                       l->index, l->out_c);
    l->out       = (nn_shape){l->out_c, 1, 1};
    l->nparams   = 2;
    l->wndim     = 2;
    l->wshape[0] = l->out_c;
    l->wshape[1] = l->in.c;
    l->fan_in    = (size_t)l->in.c;
    l->wcount    = (size_t)l->out_c * l->in.c;
    l->bcount    = l->out_c;
    l->flops     = 2.0 * (double)l->wcount;
    l->direct    = dt_nn_want_direct();
    // Row offsets of W (out rows of `in` floats), and per sample of a batch of x
    // (filled per call); the transposed output gradient (out, batch) lives in aux.
    // Needed by the shifted kernels: always on AVX-512, and with gradient shards.
    dt_free(l->offsets);
    if (!(l->offsets = dt_alloc(sizeof(int) * (size_t)l->out_c)))
        return DT_ERR_NOMEM;
    for (int o = 0; o < l->out_c; o++)
        l->offsets[o] = o * l->in.c;
    l->aux_per_sample = sizeof(float) * (size_t)l->out_c + sizeof(int);
    // bf16: the batch's input and output gradient rounded once, after the above (lin16)
    if (l->prec == DT_PREC_BF16)
        l->aux_per_sample += sizeof(uint16_t) * ((size_t)l->in.c + (size_t)l->out_c);
    l->shard_scratch = (size_t)NN_SHARD_ROWS * NN_SHARD_COLS;
    return DT_OK;
}

// bf16 (as the graph's Linear, linear16.c): forward rounds this thread's rows of x into
// x16 once and multiplies that; backward rounds its rows of dy into dy16 once, and both
// products read the two copies (no fp32 operand is rounded again while packed). Both
// live in aux after the transposed gradient and the offsets, for the whole batch.
static uint16_t *lin16_x(const nn_layer *l, int batch) {
    float *dyt  = (float *)(void *)l->aux;
    int   *xoff = (int *)(void *)(dyt + (size_t)l->out_c * (size_t)batch);
    return (uint16_t *)(void *)(xoff + batch);
}
static uint16_t *lin16_dy(const nn_layer *l, int batch) {
    return lin16_x(l, batch) + (size_t)l->in.c * (size_t)batch;
}
static void lin16_failed(nn_layer *l, dt_status st) {
    if (st)
        __atomic_store_n(&l->lowp_failed, true, __ATOMIC_RELAXED); // any thread
}

static void linear_forward(nn_layer *l, const nn_ctx *c, const float *in, float *out) {
    int n = c->s1 - c->s0, fin = l->in.c, fout = l->out_c;
    if (n <= 0)
        return;
    float *y = out + (size_t)c->s0 * fout;
    if (l->prec == DT_PREC_BF16) { // y = x16 W16^T + b
        uint16_t *x16 = lin16_x(l, c->batch) + (size_t)c->s0 * fin;
        dt_f32_to_bf16(in + (size_t)c->s0 * fin, x16, (size_t)n * fin);
        lin16_failed(
            l, dt_gemm_bf16_bias(false, true, n, fout, fin, x16, fin, l->w16, fin, l->b, y, fout));
        return;
    }
    for (int s = 0; s < n; s++)
        memcpy(y + (size_t)s * fout, l->b, sizeof(float) * (size_t)fout);
    if (l->prec != DT_PREC_FP32) { // y += x W^T with 16-bit operands (prec.h)
        if (dt_ac_gemm(l->prec, false, true, n, fout, fin, in + (size_t)c->s0 * fin, NULL, fin,
                       l->w, l->w16, fin, y, fout, true))
            __atomic_store_n(&l->lowp_failed, true, __ATOMIC_RELAXED); // any thread
        return;
    }
    // With gradient shards the shifted kernel runs everywhere: each y[s][o] is summed in
    // one fixed order whatever the number of rows n (a GEMM library may not promise it).
    if (l->direct || c->shards) { // y[s][o] += sum_i x[s][i] W[o][i]
        dt_nn_shifted_gemm_nt(in + (size_t)c->s0 * fin, (size_t)fin, n, l->w, l->offsets, fout, fin,
                              y);
        return;
    }
    // y (n, out) = x (n, in) x W^T (in, out) + y
    dt_sgemm(false, true, n, fout, fin, 1.0f, in + (size_t)c->s0 * fin, fin, l->w, fin, 1.0f, y,
             fout);
}

// Gradient shards (nn_impl.h): shard m holds samples m, m + S, ... of the batch. Its
// slice of the transposed output gradient is (out, n_m) at column start_m of a
// shard-major layout, so that dW_m = dy_m^T x_m is one shifted GEMM over its samples in
// increasing order. Each thread forms whole column chunks of NN_SHARD_COLS (at fixed
// places, so a column takes the same kernel path, vector block or scalar edge, whatever
// the thread count: they may round differently, FMA or not), with
// dt_nn_shifted_gemm_shards: per band of rows, every shard's tile in L1, the fixed tree
// over shards, added into dW.
static int shard_len(int batch, int shards, int m) {
    return m < batch ? (batch - m + shards - 1) / shards : 0;
}
static int shard_start(int batch, int shards, int m) {
    int q = batch / shards, r = batch % shards; // shards below r hold q + 1 samples
    return m * q + (m < r ? m : r);
}

// dx (n, in) = dy (n, out) x W (out, in) with 16-bit operands, this thread's rows.
static void lowp_dx(nn_layer *l, const nn_ctx *c, const float *dout, float *din) {
    int fin = l->in.c, fout = l->out_c, n = c->s1 - c->s0;
    if (dt_ac_gemm(l->prec, false, false, n, fin, fout, dout + (size_t)c->s0 * fout, NULL, fout,
                   l->w, l->w16, fin, din + (size_t)c->s0 * fin, fin, false))
        __atomic_store_n(&l->lowp_failed, true, __ATOMIC_RELAXED); // any thread
}

static void linear_backward_sharded(nn_layer *l, const nn_ctx *c, const float *in, float *dout,
                                    float *din, float *dparams) {
    int    fin = l->in.c, fout = l->out_c, batch = c->batch, S = c->shards;
    float *dw = dparams, *db = dparams + l->wcount;
    float *dyt  = (float *)(void *)l->aux; // shard-major (out, n_m) blocks, then offsets
    int   *xoff = (int *)(void *)(dyt + (size_t)fout * (size_t)batch);
    for (int s = c->s0; s < c->s1; s++) {
        int m = s % S, i = s / S, st = shard_start(batch, S, m), n = shard_len(batch, S, m);
        for (int o = 0; o < fout; o++)
            dyt[(size_t)fout * st + (size_t)o * n + i] = dout[(size_t)s * fout + o];
        xoff[st + i] = s * fin;
    }
    dt_pool_barrier(c->pool); // every thread's rows of dout are written
    // Chunks of columns at fixed places, whole chunks per thread: a column is computed by
    // the same kernel path (vector block or scalar edge, which may round differently:
    // FMA or not) whatever the thread count.
    int st[NN_MAX_SHARDS], len[NN_MAX_SHARDS];
    for (int m = 0; m < S; m++) {
        st[m]  = shard_start(batch, S, m);
        len[m] = shard_len(batch, S, m);
    }
    int nch = (fin + NN_SHARD_COLS - 1) / NN_SHARD_COLS;
    int k0 = (int)((long)nch * c->ith / c->nth), k1 = (int)((long)nch * (c->ith + 1) / c->nth);
    for (int k = k0; k < k1; k++) {
        int jc = k * NN_SHARD_COLS, cw = fin - jc < NN_SHARD_COLS ? fin - jc : NN_SHARD_COLS;
        dt_nn_shifted_gemm_shards(in + jc, xoff, st, len, S, dyt, fout, cw, c->scratch, dw + jc,
                                  (size_t)fin);
    }
    int o0 = (int)((long)fout * c->ith / c->nth), o1 = (int)((long)fout * (c->ith + 1) / c->nth);
    for (int o = o0; o < o1; o++) {
        float acc[NN_MAX_SHARDS];
        for (int m = 0; m < S; m++) {
            acc[m] = 0.0f;
            for (int s = m; s < batch; s += S)
                acc[m] += dout[(size_t)s * fout + o];
        }
        dt_nn_shard_tree(acc, 1, S, 1);
        db[o] += acc[0];
    }
    int n = c->s1 - c->s0;
    if (din && n > 0 && l->prec != DT_PREC_FP32) // the weight gradient above stays fp32
        lowp_dx(l, c, dout, din);
    else if (din && n > 0) // dx[s][i] = sum_o dy[s][o] W[o][i]
        dt_nn_shifted_gemm(l->w, l->offsets, fout, dout + (size_t)c->s0 * fout, n, fin,
                           din + (size_t)c->s0 * fin, (size_t)fin, false);
}

static void linear_backward(nn_layer *l, const nn_ctx *c, const float *in, const float *out,
                            float *dout, float *din, float *dparams) {
    (void)out;
    // bf16 takes the unsharded path with gradient shards too: its weight gradient is one
    // bf16 product over the batch (invariance is promised in fp32 only), where the
    // shards' fixed tree would keep it in fp32 (as fp16 does)
    if (c->shards && l->prec != DT_PREC_BF16) {
        linear_backward_sharded(l, c, in, dout, din, dparams);
        return;
    }
    int    fin = l->in.c, fout = l->out_c, batch = c->batch;
    float *dw = dparams, *db = dparams + l->wcount;
    float *dyt  = (float *)(void *)l->aux; // (out, batch), then `batch` sample offsets
    int   *xoff = (int *)(void *)(dyt + (size_t)fout * (size_t)batch);
    bool   lowp = l->prec != DT_PREC_FP32, bf16 = l->prec == DT_PREC_BF16;
    if (bf16 && c->s1 > c->s0) // this thread's rows of dy, rounded once for both products
        dt_f32_to_bf16(dout + (size_t)c->s0 * fout, lin16_dy(l, batch) + (size_t)c->s0 * fout,
                       (size_t)(c->s1 - c->s0) * fout);
    if (l->direct && !lowp) { // this thread's rows of dy, transposed, for dW = dy^T x
        for (int s = c->s0; s < c->s1; s++) {
            for (int o = 0; o < fout; o++)
                dyt[(size_t)o * batch + s] = dout[(size_t)s * fout + o];
            xoff[s] = s * fin;
        }
    }
    dt_pool_barrier(c->pool); // every thread's rows of dout are written
    // This thread's input columns [j0, j1) of dW (out, in) += dy^T (out, B) x x (B, in)
    int j0 = (int)((long)fin * c->ith / c->nth), j1 = (int)((long)fin * (c->ith + 1) / c->nth);
    if (j1 > j0 && bf16) // dW (out, in) += dy16^T x16
        lin16_failed(l, dt_gemm_bf16(true, false, fout, j1 - j0, batch, lin16_dy(l, batch), fout,
                                     lin16_x(l, batch) + j0, fin, dw + j0, fin, true));
    else if (j1 > j0 && lowp) { // dW (out, in) += dy^T x, 16-bit operands
        if (dt_ac_gemm(l->prec, true, false, fout, j1 - j0, batch, dout, NULL, fout, in + j0, NULL,
                       fin, dw + j0, fin, true))
            __atomic_store_n(&l->lowp_failed, true, __ATOMIC_RELAXED); // any thread
    } else if (j1 > j0 && l->direct) // dW[o][i] += sum_s dy^T[o][s] x[s][i]
        dt_nn_shifted_gemm(in + j0, xoff, batch, dyt, fout, j1 - j0, dw + j0, (size_t)fin, true);
    else if (j1 > j0)
        dt_sgemm(true, false, fout, j1 - j0, batch, 1.0f, dout, fout, in + j0, fin, 1.0f, dw + j0,
                 fin);
    // This thread's share of the bias gradient: sums over the batch for outputs [o0, o1).
    int o0 = (int)((long)fout * c->ith / c->nth), o1 = (int)((long)fout * (c->ith + 1) / c->nth);
    for (int s = 0; s < batch; s++) {
        const float *dy = dout + (size_t)s * fout;
        for (int o = o0; o < o1; o++)
            db[o] += dy[o];
    }
    int n = c->s1 - c->s0;
    if (din && n > 0 && bf16) // dx = dy16 W16, this thread's rows
        lin16_failed(l, dt_gemm_bf16(false, false, n, fin, fout,
                                     lin16_dy(l, batch) + (size_t)c->s0 * fout, fout, l->w16, fin,
                                     din + (size_t)c->s0 * fin, fin, false));
    else if (din && n > 0 && lowp)
        lowp_dx(l, c, dout, din);
    else if (din && n > 0 && l->direct) // dx[s][i] = sum_o dy[s][o] W[o][i]
        dt_nn_shifted_gemm(l->w, l->offsets, fout, dout + (size_t)c->s0 * fout, n, fin,
                           din + (size_t)c->s0 * fin, (size_t)fin, false);
    else if (din && n > 0) // dx (n, in) = dy (n, out) x W (out, in)
        dt_sgemm(false, false, n, fin, fout, 1.0f, dout + (size_t)c->s0 * fout, fout, l->w, fin,
                 0.0f, din + (size_t)c->s0 * fin, fin);
}

const nn_layer_ops dt_nn_linear_ops = {
    .kind      = "linear",
    .in_place  = false,
    .grad_mode = NN_GRAD_SHARED,
    .setup     = linear_setup,
    .forward   = linear_forward,
    .backward  = linear_backward,
};
