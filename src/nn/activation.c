// activation.c: ReLU, Flatten and LogSoftmax. ReLU and Flatten work in place: the
// model gives them the same buffer as input and output, and ReLU's backward reads the
// mask from its output (y > 0 exactly where x > 0).
#include "nn/nn_impl.h"

#include <math.h>

static dt_status same_shape_setup(nn_layer *l) {
    l->out = l->in;
    return DT_OK;
}

static void relu_forward(nn_layer *l, const nn_ctx *c, const float *in, float *out) {
    (void)in; // in place: in == out
    size_t n = nn_shape_size(l->in);
    dt_nn_relu_inplace(out + (size_t)c->s0 * n, (size_t)(c->s1 - c->s0) * n);
}

static void relu_backward(nn_layer *l, const nn_ctx *c, const float *in, const float *out,
                          float *dout, float *din, float *dparams) {
    (void)in;
    (void)din; // in place: din == dout
    (void)dparams;
    size_t n = nn_shape_size(l->in);
    dt_nn_relu_backward(out + (size_t)c->s0 * n, dout + (size_t)c->s0 * n,
                        (size_t)(c->s1 - c->s0) * n);
}

const nn_layer_ops dt_nn_relu_ops = {
    .kind      = "relu",
    .in_place  = true,
    .grad_mode = NN_GRAD_PARTIAL,
    .setup     = same_shape_setup,
    .forward   = relu_forward,
    .backward  = relu_backward,
};

static dt_status flatten_setup(nn_layer *l) {
    l->out = (nn_shape){(int)nn_shape_size(l->in), 1, 1};
    return DT_OK;
}

static void flatten_forward(nn_layer *l, const nn_ctx *c, const float *in, float *out) {
    (void)l, (void)c, (void)in, (void)out; // a reshape: the buffer is shared
}

static void flatten_backward(nn_layer *l, const nn_ctx *c, const float *in, const float *out,
                             float *dout, float *din, float *dparams) {
    (void)l, (void)c, (void)in, (void)out, (void)dout, (void)din, (void)dparams;
}

const nn_layer_ops dt_nn_flatten_ops = {
    .kind      = "flatten",
    .in_place  = true,
    .grad_mode = NN_GRAD_PARTIAL,
    .setup     = flatten_setup,
    .forward   = flatten_forward,
    .backward  = flatten_backward,
};

static dt_status log_softmax_setup(nn_layer *l) {
    if (l->in.h != 1 || l->in.w != 1)
        return dt_fail(DT_ERR_ARG,
                       "layer %d log_softmax: expected a flat input (features, 1, 1), found "
                       "(%d, %d, %d)",
                       l->index, l->in.c, l->in.h, l->in.w);
    l->out = l->in;
    return DT_OK;
}

// y = x - max - log(sum exp(x - max)), the stable form.
static void log_softmax_forward(nn_layer *l, const nn_ctx *c, const float *in, float *out) {
    int n = l->in.c;
    for (int s = c->s0; s < c->s1; s++) {
        const float *x = in + (size_t)s * n;
        float       *y = out + (size_t)s * n;
        float        m = x[0];
        for (int i = 1; i < n; i++)
            m = x[i] > m ? x[i] : m;
        double sum = 0.0;
        for (int i = 0; i < n; i++)
            sum += exp((double)(x[i] - m));
        float lse = m + (float)log(sum);
        for (int i = 0; i < n; i++)
            y[i] = x[i] - lse;
    }
}

// dx = dy - softmax * sum(dy), with softmax = exp(y).
static void log_softmax_backward(nn_layer *l, const nn_ctx *c, const float *in, const float *out,
                                 float *dout, float *din, float *dparams) {
    (void)in;
    (void)dparams;
    if (!din)
        return;
    int n = l->in.c;
    for (int s = c->s0; s < c->s1; s++) {
        const float *y   = out + (size_t)s * n;
        const float *dy  = dout + (size_t)s * n;
        float       *dx  = din + (size_t)s * n;
        float        sum = 0.0f;
        for (int i = 0; i < n; i++)
            sum += dy[i];
        for (int i = 0; i < n; i++)
            dx[i] = dy[i] - expf(y[i]) * sum;
    }
}

const nn_layer_ops dt_nn_log_softmax_ops = {
    .kind      = "log_softmax",
    .in_place  = false,
    .grad_mode = NN_GRAD_PARTIAL,
    .setup     = log_softmax_setup,
    .forward   = log_softmax_forward,
    .backward  = log_softmax_backward,
};
