// exec_ops.c: each kind of node (graph.h's dt_node_desc kinds) on the device: what it
// saves and needs, its forward and its backward, from the kernels of kernels.h and the
// GEMMs of blas.c. The formulas are the CPU's (ops.h); the comments say where the
// device's arithmetic differs in order (and so in rounding) from it.
#include "cuda/exec_impl.h"

#include <string.h>

#define ND(i) (&x->nodes[i])

static int batch(const cx *x) {
    return x->batch;
}

static dt_status unsupported(cx *x, int i, const char *why) {
    return cu_fail(DT_ERR_UNSUPPORTED, "node '%s' (%s): %s on a CUDA device", ND(i)->name,
                   ND(i)->kind, why);
}

static dt_status ok_check(cx *x, int i) {
    (void)x, (void)i;
    return DT_OK;
}

static void no_sizes(cx *x, int i, int n, size_t *per, size_t *fixed, size_t *scratch) {
    (void)x, (void)i, (void)n;
    *per = *fixed = *scratch = 0;
}

static dt_status no_pass(cx *x, int i) {
    (void)x, (void)i;
    return DT_OK;
}

// The last dimension of a shape (1 for a scalar per sample).
static int last_dim(const dt_shape *s) {
    return s->ndim ? (int)s->d[s->ndim - 1] : 1;
}

// ------------------------------------------------------------------------ Conv2d
// One matrix product over the whole batch (kernels.h's k_conv): im2col (K, N P), Yt
// (cout, N P) = W (cout, K) col, then bias, ReLU, pool and the (N, cout, ...) layout in
// one kernel. Backward: dYt from dy (through the pool's winners and the ReLU's mask),
// db from dYt's rows, dW += dYt col^T (im2col again), dcol = W^T dYt, col2im.

static k_conv conv_of(cx *x, int i, int n) {
    const dt_node_desc *d  = ND(i);
    const dt_shape     *in = &d->in_shape[0];
    int                 h = (int)in->d[1], w = (int)in->d[2];
    k_conv              c = {n,
                             d->h.conv.cin,
                             h,
                             w,
                             d->h.conv.cout,
                             d->h.conv.kh,
                             d->h.conv.kw,
                             d->h.conv.sh,
                             d->h.conv.sw,
                             d->h.conv.ph,
                             d->h.conv.pw,
                             0,
                             0,
                             d->h.conv.bias,
                             d->h.conv.relu,
                             d->h.conv.pool2};
    c.ho                  = (h + 2 * c.ph - c.kh) / c.sh + 1;
    c.wo                  = (w + 2 * c.pw - c.kw) / c.sw + 1;
    return c;
}

static dt_status conv_check(cx *x, int i) {
    if (ND(i)->h.conv.groups != 1)
        return unsupported(x, i, "grouped convolutions do not run yet");
    return DT_OK;
}

static void conv_sizes(cx *x, int i, int n, size_t *per, size_t *fixed, size_t *scratch) {
    k_conv c = conv_of(x, i, n);
    size_t K = (size_t)c.cin * c.kh * c.kw, NP = (size_t)n * c.ho * c.wo;
    *per     = c.pool2 ? cx_numel(&ND(i)->out_shape) : 0; // the winners, bytes
    *fixed   = 0;
    *scratch = sizeof(float) * (K + (size_t)c.cout) * NP;
}

static dt_status conv_forward(cx *x, int i) {
    k_conv c = conv_of(x, i, batch(x));
    size_t K = (size_t)c.cin * c.kh * c.kw, NP = (size_t)c.n * c.ho * c.wo;
    float *col = x->scratch, *yt = col + K * NP;
    CU_RT(k_im2col(x->s, &c, cx_in(x, i, 0)->y, col));
    DT_TRY(cx_gemm(x, false, false, c.cout, (int)NP, (int)K, cx_w(x, i, 0), (int)K, col, (int)NP,
                   0.0f, yt, (int)NP));
    CU_RT(k_conv_out(x->s, &c, yt, c.bias ? cx_w(x, i, 1) : NULL, cx_out(x, i)->y,
                     cx_out(x, i)->saved));
    return DT_OK;
}

static dt_status conv_backward(cx *x, int i) {
    k_conv  c = conv_of(x, i, batch(x));
    size_t  K = (size_t)c.cin * c.kh * c.kw, NP = (size_t)c.n * c.ho * c.wo;
    float  *col = x->scratch, *dyt = col + K * NP;
    cx_val *o = cx_out(x, i), *in = cx_in(x, i, 0);
    CU_RT(k_conv_dout(x->s, &c, o->dy, o->y, o->saved, dyt));
    if (c.bias)
        CU_RT(k_row_sums(x->s, dyt, c.cout, NP, cx_dw(x, i, 1)));
    CU_RT(k_im2col(x->s, &c, in->y, col));
    DT_TRY(cx_gemm(x, false, true, c.cout, (int)K, (int)NP, dyt, (int)NP, col, (int)NP, 1.0f,
                   cx_dw(x, i, 0), (int)K));
    bool   acc;
    float *dx = cx_dx(x, i, 0, &acc);
    if (!dx)
        return DT_OK;
    DT_TRY(cx_gemm(x, true, false, (int)K, (int)NP, c.cout, cx_w(x, i, 0), (int)K, dyt, (int)NP,
                   0.0f, col, (int)NP));
    CU_RT(k_col2im(x->s, &c, col, dx, acc));
    return DT_OK;
}

// ------------------------------------------------------------------------ Linear
// y (rows, out) = x (rows, in) W^T + b; in bf16 the operands are rounded copies (x
// into scratch, W from the per-forward copies), the sums fp32.

static int linear_rows(cx *x, int i, int n) {
    return (int)((size_t)n * cx_numel(&ND(i)->in_shape[0]) / (size_t)ND(i)->h.linear.in);
}

static void linear_sizes(cx *x, int i, int n, size_t *per, size_t *fixed, size_t *scratch) {
    size_t rows = (size_t)linear_rows(x, i, n);
    *per = *fixed = 0;
    *scratch      = x->prec == DT_PREC_BF16
                        ? sizeof(uint16_t) * rows * (size_t)(ND(i)->h.linear.in + ND(i)->h.linear.out)
                        : 0;
}

static dt_status linear_forward(cx *x, int i) {
    int    rows = linear_rows(x, i, batch(x)), in = ND(i)->h.linear.in, out = ND(i)->h.linear.out;
    float *y         = cx_out(x, i)->y;
    const float *xin = cx_in(x, i, 0)->y;
    if (x->prec == DT_PREC_BF16) {
        uint16_t *x16 = x->scratch;
        CU_RT(k_to_bf16(x->s, xin, x16, (size_t)rows * in));
        DT_TRY(
            cx_gemm16(x, false, true, rows, out, in, x16, in, cx_w16(x, i, 0), in, 0.0f, y, out));
    } else {
        DT_TRY(cx_gemm(x, false, true, rows, out, in, xin, in, cx_w(x, i, 0), in, 0.0f, y, out));
    }
    if (ND(i)->h.linear.bias)
        CU_RT(k_bias_rows(x->s, y, cx_w(x, i, 1), (size_t)rows, out));
    return DT_OK;
}

static dt_status linear_backward(cx *x, int i) {
    int          rows = linear_rows(x, i, batch(x));
    int          in = ND(i)->h.linear.in, out = ND(i)->h.linear.out;
    const float *dy = cx_out(x, i)->dy, *xin = cx_in(x, i, 0)->y;
    bool         acc;
    float       *dx = cx_dx(x, i, 0, &acc);
    if (ND(i)->h.linear.bias)
        CU_RT(k_col_sums(x->s, dy, (size_t)rows, out, cx_dw(x, i, 1)));
    if (x->prec == DT_PREC_BF16) {
        uint16_t *x16 = x->scratch, *dy16 = x16 + (size_t)rows * in;
        CU_RT(k_to_bf16(x->s, xin, x16, (size_t)rows * in));
        CU_RT(k_to_bf16(x->s, dy, dy16, (size_t)rows * out));
        DT_TRY(
            cx_gemm16(x, true, false, out, in, rows, dy16, out, x16, in, 1.0f, cx_dw(x, i, 0), in));
        if (dx)
            DT_TRY(cx_gemm16(x, false, false, rows, in, out, dy16, out, cx_w16(x, i, 0), in,
                             acc ? 1.0f : 0.0f, dx, in));
        return DT_OK;
    }
    DT_TRY(cx_gemm(x, true, false, out, in, rows, dy, out, xin, in, 1.0f, cx_dw(x, i, 0), in));
    if (dx)
        DT_TRY(cx_gemm(x, false, false, rows, in, out, dy, out, cx_w(x, i, 0), in,
                       acc ? 1.0f : 0.0f, dx, in));
    return DT_OK;
}

// -------------------------------------------------------------- element-wise, copies

static int act_of(const char *kind) {
    static const char *const names[] = {"relu", "gelu", "gelu_tanh", "tanh", "sigmoid", "silu"};
    for (int a = 0; a < 6; a++)
        if (strcmp(kind, names[a]) == 0)
            return a;
    return K_RELU;
}

static size_t count(cx *x, int i) {
    return (size_t)batch(x) * cx_out(x, i)->numel;
}

static dt_status act_forward(cx *x, int i) {
    CU_RT(
        k_act_forward(x->s, act_of(ND(i)->kind), cx_in(x, i, 0)->y, cx_out(x, i)->y, count(x, i)));
    return DT_OK;
}

static dt_status act_backward(cx *x, int i) {
    bool   acc;
    float *dx = cx_dx(x, i, 0, &acc);
    if (dx)
        CU_RT(k_act_backward(x->s, act_of(ND(i)->kind), cx_in(x, i, 0)->y, cx_out(x, i)->y,
                             cx_out(x, i)->dy, dx, count(x, i), acc));
    return DT_OK;
}

static dt_status copy_forward(cx *x, int i) { // flatten
    CU_RT(cudaMemcpyAsync(cx_out(x, i)->y, cx_in(x, i, 0)->y, sizeof(float) * count(x, i),
                          cudaMemcpyDeviceToDevice, x->s));
    return DT_OK;
}

static dt_status copy_backward(cx *x, int i) {
    bool   acc;
    float *dx = cx_dx(x, i, 0, &acc);
    if (dx)
        CU_RT(k_copy(x->s, dx, cx_out(x, i)->dy, count(x, i), acc));
    return DT_OK;
}

static dt_status add_forward(cx *x, int i) {
    float *y = cx_out(x, i)->y;
    size_t n = count(x, i);
    CU_RT(k_add(x->s, y, cx_in(x, i, 0)->y, cx_in(x, i, 1)->y, n));
    for (int j = 2; j < ND(i)->nin; j++)
        CU_RT(k_copy(x->s, y, cx_in(x, i, j)->y, n, true));
    return DT_OK;
}

static dt_status add_backward(cx *x, int i) {
    for (int j = 0; j < ND(i)->nin; j++) { // one input at a time: an input read twice adds
        bool   acc;
        float *dx = cx_dx(x, i, j, &acc);
        if (dx)
            CU_RT(k_copy(x->s, dx, cx_out(x, i)->dy, count(x, i), acc));
    }
    return DT_OK;
}

// ------------------------------------------------------------------ softmax family

static int softmax_d(cx *x, int i) {
    return strcmp(ND(i)->kind, "log_softmax") == 0 ? (int)cx_out(x, i)->numel
                                                   : last_dim(&ND(i)->out_shape);
}

static dt_status softmax_forward(cx *x, int i) {
    int d = softmax_d(x, i);
    CU_RT(k_softmax_forward(x->s, ND(i)->kind[0] == 'l', (int)(count(x, i) / (size_t)d), d,
                            cx_in(x, i, 0)->y, cx_out(x, i)->y));
    return DT_OK;
}

static dt_status softmax_backward(cx *x, int i) {
    bool   acc;
    float *dx = cx_dx(x, i, 0, &acc);
    int    d  = softmax_d(x, i);
    if (dx)
        CU_RT(k_softmax_backward(x->s, ND(i)->kind[0] == 'l', (int)(count(x, i) / (size_t)d), d,
                                 cx_out(x, i)->y, cx_out(x, i)->dy, dx, acc));
    return DT_OK;
}

// ------------------------------------------------------------------------ Dropout
// The masks of the CPU (k_rand.cu), saved as factors 0 or 1/(1 - p) per unit.

static void dropout_units(cx *x, int i, size_t *units, size_t *per) {
    size_t n = cx_out(x, i)->numel;
    if (strcmp(ND(i)->kind, "dropout2d") == 0) {
        *units = (size_t)ND(i)->in_shape[0].d[0];
        *per   = n / *units;
    } else {
        *units = n;
        *per   = 1;
    }
}

static void dropout_sizes(cx *x, int i, int n, size_t *per, size_t *fixed, size_t *scratch) {
    size_t units, each;
    (void)n;
    dropout_units(x, i, &units, &each);
    *per     = sizeof(float) * units;
    *fixed   = 0;
    *scratch = 0;
}

static bool dropping(cx *x, int i) {
    return x->training && ND(i)->h.dropout.p > 0.0f;
}

static dt_status dropout_forward(cx *x, int i) {
    if (!dropping(x, i))
        return copy_forward(x, i);
    size_t units, per;
    dropout_units(x, i, &units, &per);
    CU_RT(k_dropout_forward(x->s, &x->nk_dev[i], x->has_keys ? x->keys_dev : NULL, batch(x), units,
                            per, ND(i)->h.dropout.p, cx_in(x, i, 0)->y, cx_out(x, i)->y,
                            cx_out(x, i)->saved));
    return DT_OK;
}

static dt_status dropout_backward(cx *x, int i) {
    if (!dropping(x, i))
        return copy_backward(x, i);
    bool   acc;
    float *dx = cx_dx(x, i, 0, &acc);
    size_t units, per;
    dropout_units(x, i, &units, &per);
    if (dx)
        CU_RT(k_dropout_backward(x->s, batch(x), units, per, cx_out(x, i)->saved, cx_out(x, i)->dy,
                                 dx, acc));
    return DT_OK;
}

// ------------------------------------------------------------------------ Pooling

static k_pool pool_of(cx *x, int i) {
    const dt_node_desc *d  = ND(i);
    const dt_shape     *in = &d->in_shape[0], *out = &d->out_shape;
    k_pool              p = {batch(x) * (int)in->d[0],
                             (int)in->d[1],
                             (int)in->d[2],
                             (int)out->d[1],
                             (int)out->d[2],
                             d->h.pool.kh,
                             d->h.pool.kw,
                             d->h.pool.sh,
                             d->h.pool.sw,
                             d->h.pool.ph,
                             d->h.pool.pw};
    return p;
}

static void maxpool_sizes(cx *x, int i, int n, size_t *per, size_t *fixed, size_t *scratch) {
    (void)n;
    *per   = sizeof(int32_t) * cx_out(x, i)->numel;
    *fixed = *scratch = 0;
}

static dt_status maxpool_forward(cx *x, int i) {
    k_pool p = pool_of(x, i);
    CU_RT(k_maxpool_forward(x->s, &p, cx_in(x, i, 0)->y, cx_out(x, i)->y, cx_out(x, i)->saved));
    return DT_OK;
}

static dt_status maxpool_backward(cx *x, int i) {
    k_pool p = pool_of(x, i);
    bool   acc;
    float *dx = cx_dx(x, i, 0, &acc);
    if (dx)
        CU_RT(k_maxpool_backward(x->s, &p, cx_out(x, i)->dy, cx_out(x, i)->saved, dx, acc));
    return DT_OK;
}

static dt_status avgpool_forward(cx *x, int i) {
    k_pool p = pool_of(x, i);
    CU_RT(k_avgpool_forward(x->s, &p, ND(i)->kind[0] == 'a' && ND(i)->kind[1] == 'd',
                            cx_in(x, i, 0)->y, cx_out(x, i)->y));
    return DT_OK;
}

static dt_status avgpool_backward(cx *x, int i) {
    k_pool p = pool_of(x, i);
    bool   acc;
    float *dx = cx_dx(x, i, 0, &acc);
    if (dx)
        CU_RT(k_avgpool_backward(x->s, &p, ND(i)->kind[0] == 'a' && ND(i)->kind[1] == 'd',
                                 cx_out(x, i)->dy, dx, acc));
    return DT_OK;
}

// ---------------------------------------------------------------------- BatchNorm

static k_bn bn_of(cx *x, int i) {
    const dt_node_desc *d  = ND(i);
    const dt_shape     *in = &d->in_shape[0];
    int  l = in->ndim == 1 ? 1 : in->ndim == 2 ? (int)in->d[1] : (int)(in->d[1] * in->d[2]);
    k_bn b = {batch(x),     (int)in->d[0],   l, d->h.bn.eps, d->h.bn.momentum, x->training,
              d->h.bn.relu, d->h.bn.residual};
    return b;
}

static dt_status bn_check(cx *x, int i) {
    if (ND(i)->h.bn.residual && ND(i)->in[0] == ND(i)->in[1])
        return unsupported(x, i, "a residual that is the normalised input itself");
    return DT_OK;
}

static void bn_sizes(cx *x, int i, int n, size_t *per, size_t *fixed, size_t *scratch) {
    (void)n;
    size_t c = (size_t)ND(i)->in_shape[0].d[0];
    *per     = 0;
    *fixed   = sizeof(float) * 2 * c; // mean, invstd
    *scratch = sizeof(float) * 2 * c;
    (void)x;
}

static dt_status bn_forward(cx *x, int i) {
    k_bn   b    = bn_of(x, i);
    bool   af   = ND(i)->h.bn.affine;
    float *mean = cx_out(x, i)->saved, *invstd = mean + b.c;
    CU_RT(k_bn_forward(x->s, &b, cx_in(x, i, 0)->y, af ? cx_w(x, i, 0) : NULL,
                       af ? cx_w(x, i, 1) : NULL, b.residual ? cx_in(x, i, 1)->y : NULL,
                       cx_buf(x, i, 0), cx_buf(x, i, 1), mean, invstd, cx_out(x, i)->y));
    return DT_OK;
}

static dt_status bn_backward(cx *x, int i) {
    k_bn   b  = bn_of(x, i);
    bool   af = ND(i)->h.bn.affine, acc = false, racc = false;
    float *mean = cx_out(x, i)->saved, *invstd = mean + b.c;
    float *dres = b.residual ? cx_dx(x, i, 1, &racc) : NULL;
    float *dx   = cx_dx(x, i, 0, &acc);
    CU_RT(k_bn_backward(x->s, &b, cx_in(x, i, 0)->y, cx_out(x, i)->y, cx_out(x, i)->dy,
                        af ? cx_w(x, i, 0) : NULL, mean, invstd, dx, acc, dres, racc,
                        af ? cx_dw(x, i, 0) : NULL, af ? cx_dw(x, i, 1) : NULL, x->scratch));
    return DT_OK;
}

// ---------------------------------------------------------------------- LayerNorm

static void ln_sizes(cx *x, int i, int n, size_t *per, size_t *fixed, size_t *scratch) {
    int    d    = last_dim(&ND(i)->in_shape[0]);
    size_t rows = cx_out(x, i)->numel / (size_t)d;
    *per        = sizeof(float) * 2 * rows; // mean, rstd
    *fixed      = 0;
    *scratch    = sizeof(float) * k_ln_work((int)(rows * (size_t)n), d);
}

static dt_status ln_forward(cx *x, int i) {
    int    d    = last_dim(&ND(i)->in_shape[0]);
    int    rows = (int)(count(x, i) / (size_t)d);
    bool   af   = ND(i)->h.ln.affine;
    float *mean = cx_out(x, i)->saved, *rstd = mean + rows;
    CU_RT(k_ln_forward(x->s, rows, d, ND(i)->h.ln.eps, cx_in(x, i, 0)->y, af ? cx_w(x, i, 0) : NULL,
                       af ? cx_w(x, i, 1) : NULL, cx_out(x, i)->y, mean, rstd));
    return DT_OK;
}

static dt_status ln_backward(cx *x, int i) {
    int    d    = last_dim(&ND(i)->in_shape[0]);
    int    rows = (int)(count(x, i) / (size_t)d);
    bool   af   = ND(i)->h.ln.affine, acc;
    float *mean = cx_out(x, i)->saved, *rstd = mean + rows;
    float *dx = cx_dx(x, i, 0, &acc);
    CU_RT(k_ln_backward(x->s, rows, d, cx_in(x, i, 0)->y, af ? cx_w(x, i, 0) : NULL, mean, rstd,
                        cx_out(x, i)->dy, dx, acc, af ? cx_dw(x, i, 0) : NULL,
                        af ? cx_dw(x, i, 1) : NULL, x->scratch));
    return DT_OK;
}

// ---------------------------------------------------------------------- Embedding

static dt_status emb_forward(cx *x, int i) {
    size_t n = (size_t)batch(x) * cx_in(x, i, 0)->numel;
    CU_RT(k_embed_forward(x->s, n, ND(i)->h.emb.d, cx_in(x, i, 0)->y, cx_w(x, i, 0),
                          cx_out(x, i)->y));
    return DT_OK;
}

static dt_status emb_backward(cx *x, int i) {
    size_t n = (size_t)batch(x) * cx_in(x, i, 0)->numel;
    CU_RT(k_embed_backward(x->s, n, ND(i)->h.emb.num, ND(i)->h.emb.d, cx_in(x, i, 0)->y,
                           cx_out(x, i)->dy, cx_dw(x, i, 0)));
    return DT_OK;
}

// ---------------------------------------------------------------------- Attention

static void attn_dims(cx *x, int i, int *T, int *C, int *H) {
    *T = (int)ND(i)->out_shape.d[0], *C = (int)ND(i)->out_shape.d[1], *H = ND(i)->h.attn.heads;
    (void)x;
}

static dt_status attn_check(cx *x, int i) {
    int T, C, H;
    attn_dims(x, i, &T, &C, &H);
    if (C % H || C / H > 128)
        return unsupported(x, i, "heads of more than 128 components do not run yet");
    return DT_OK;
}

static void attn_sizes(cx *x, int i, int n, size_t *per, size_t *fixed, size_t *scratch) {
    int T, C, H;
    attn_dims(x, i, &T, &C, &H);
    *per     = sizeof(float) * (size_t)H * T; // log-sum-exp per (head, row)
    *fixed   = 0;
    *scratch = sizeof(float) * k_attn_work(n, T, C, H);
}

static dt_status attn_forward(cx *x, int i) {
    int T, C, H;
    attn_dims(x, i, &T, &C, &H);
    CU_RT(k_attn_forward(x->s, batch(x), T, C, H, cx_in(x, i, 0)->y, cx_out(x, i)->y,
                         cx_out(x, i)->saved));
    return DT_OK;
}

static dt_status attn_backward(cx *x, int i) {
    int    T, C, H;
    bool   acc;
    float *dx = cx_dx(x, i, 0, &acc);
    attn_dims(x, i, &T, &C, &H);
    if (dx)
        CU_RT(k_attn_backward(x->s, batch(x), T, C, H, cx_in(x, i, 0)->y, cx_out(x, i)->y,
                              cx_out(x, i)->saved, cx_out(x, i)->dy, dx, acc, x->scratch));
    return DT_OK;
}

// ------------------------------------------------------------------------- Concat
// Per sample, each input is `outer` runs of its block along dim; the output interleaves
// them: a 2-D copy per input (and back, through scratch when adding).

static void concat_geom(cx *x, int i, int j, size_t *outer, size_t *inner, size_t *total,
                        size_t *off) {
    const dt_node_desc *d   = ND(i);
    int                 dim = d->h.concat.dim;
    size_t              o = 1, tail = 1;
    for (int k = 0; k < dim; k++)
        o *= (size_t)d->out_shape.d[k];
    for (int k = dim + 1; k < d->out_shape.ndim; k++)
        tail *= (size_t)d->out_shape.d[k];
    *outer = o * (size_t)batch(x);
    *inner = (size_t)d->in_shape[j].d[dim] * tail;
    *total = (size_t)d->out_shape.d[dim] * tail;
    *off   = 0;
    for (int k = 0; k < j; k++)
        *off += (size_t)d->in_shape[k].d[dim] * tail;
}

static void concat_sizes(cx *x, int i, int n, size_t *per, size_t *fixed, size_t *scratch) {
    *per = *fixed = 0;
    *scratch      = sizeof(float) * (size_t)n * cx_out(x, i)->numel;
}

static dt_status concat_forward(cx *x, int i) {
    float *y = cx_out(x, i)->y;
    for (int j = 0; j < ND(i)->nin; j++) {
        size_t outer, inner, total, off;
        concat_geom(x, i, j, &outer, &inner, &total, &off);
        CU_RT(cudaMemcpy2DAsync(y + off, total * sizeof(float), cx_in(x, i, j)->y,
                                inner * sizeof(float), inner * sizeof(float), outer,
                                cudaMemcpyDeviceToDevice, x->s));
    }
    return DT_OK;
}

static dt_status concat_backward(cx *x, int i) {
    const float *dy = cx_out(x, i)->dy;
    for (int j = 0; j < ND(i)->nin; j++) {
        bool   acc;
        float *dx = cx_dx(x, i, j, &acc);
        if (!dx)
            continue;
        size_t outer, inner, total, off;
        concat_geom(x, i, j, &outer, &inner, &total, &off);
        float *dst = acc ? (float *)x->scratch : dx;
        CU_RT(cudaMemcpy2DAsync(dst, inner * sizeof(float), dy + off, total * sizeof(float),
                                inner * sizeof(float), outer, cudaMemcpyDeviceToDevice, x->s));
        if (acc)
            CU_RT(k_copy(x->s, dx, dst, outer * inner, true));
    }
    return DT_OK;
}

// ------------------------------------------------------------------------ the table

static const cx_op ops[] = {
    {"input", ok_check, no_sizes, no_pass, no_pass, false},
    {"conv2d", conv_check, conv_sizes, conv_forward, conv_backward, true},
    {"linear", ok_check, linear_sizes, linear_forward, linear_backward, true},
    {"relu", ok_check, no_sizes, act_forward, act_backward, true},
    {"gelu", ok_check, no_sizes, act_forward, act_backward, true},
    {"gelu_tanh", ok_check, no_sizes, act_forward, act_backward, true},
    {"tanh", ok_check, no_sizes, act_forward, act_backward, true},
    {"sigmoid", ok_check, no_sizes, act_forward, act_backward, true},
    {"silu", ok_check, no_sizes, act_forward, act_backward, true},
    {"softmax", ok_check, no_sizes, softmax_forward, softmax_backward, true},
    {"log_softmax", ok_check, no_sizes, softmax_forward, softmax_backward, true},
    {"dropout", ok_check, dropout_sizes, dropout_forward, dropout_backward, true},
    {"dropout2d", ok_check, dropout_sizes, dropout_forward, dropout_backward, true},
    {"maxpool2d", ok_check, maxpool_sizes, maxpool_forward, maxpool_backward, true},
    {"avgpool2d", ok_check, no_sizes, avgpool_forward, avgpool_backward, true},
    {"adaptive_avgpool2d", ok_check, no_sizes, avgpool_forward, avgpool_backward, true},
    {"flatten", ok_check, no_sizes, copy_forward, copy_backward, true},
    {"batchnorm", bn_check, bn_sizes, bn_forward, bn_backward, true},
    {"layernorm", ok_check, ln_sizes, ln_forward, ln_backward, true},
    {"embedding", ok_check, no_sizes, emb_forward, emb_backward, false},
    {"attention", attn_check, attn_sizes, attn_forward, attn_backward, true},
    {"add", ok_check, no_sizes, add_forward, add_backward, true},
    {"concat", ok_check, concat_sizes, concat_forward, concat_backward, true},
};

const cx_op *cx_op_of(const char *kind) {
    for (size_t k = 0; k < sizeof ops / sizeof ops[0]; k++)
        if (strcmp(ops[k].kind, kind) == 0)
            return &ops[k];
    return NULL;
}
