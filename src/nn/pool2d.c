// pool2d.c: max pooling over square windows without padding (torch.nn.MaxPool2d with
// padding 0, dilation 1, floor mode). Forward records which element of each window
// won (its index inside the window, one byte), backward routes the gradient there.
// Ties go to the first maximum in row-major window order, as PyTorch's CPU kernel.
#include "core/simd.h"
#include "nn/nn_impl.h"

#include <string.h>

static dt_status maxpool_setup(nn_layer *l) {
    if (l->stride == 0)
        l->stride = l->k;
    if (l->k < 1 || l->k > 15 || l->stride < 1)
        return dt_fail(DT_ERR_ARG,
                       "layer %d maxpool2d: expected kernel in [1, 15] and stride >= 1, found "
                       "kernel %d, stride %d",
                       l->index, l->k, l->stride);
    if (l->in.h < l->k || l->in.w < l->k)
        return dt_fail(DT_ERR_ARG,
                       "layer %d maxpool2d: window %d does not fit the input (%d, %d, %d)",
                       l->index, l->k, l->in.c, l->in.h, l->in.w);
    l->out.c          = l->in.c;
    l->out.h          = (l->in.h - l->k) / l->stride + 1;
    l->out.w          = (l->in.w - l->k) / l->stride + 1;
    l->aux_per_sample = nn_shape_size(l->out); // one byte per output: the winner's index
    return DT_OK;
}

// The common 2x2, stride-2 case, written so the compiler vectorises across outputs.
DT_CLONES static void pool2x2(const float *x, int c, int h, int w, int ho, int wo, float *y,
                              uint8_t *arg) {
    for (int ch = 0; ch < c; ch++) {
        const float *plane = x + (size_t)ch * h * w;
        for (int oh = 0; oh < ho; oh++) {
            const float *r0 = plane + (size_t)(2 * oh) * w;
            const float *r1 = r0 + w;
            float       *yo = y + ((size_t)ch * ho + oh) * wo;
            uint8_t     *ao = arg + ((size_t)ch * ho + oh) * wo;
            for (int ow = 0; ow < wo; ow++) {
                float   a = r0[2 * ow], b = r0[2 * ow + 1], cc = r1[2 * ow], d = r1[2 * ow + 1];
                float   m = a;
                uint8_t i = 0;
                if (b > m) {
                    m = b;
                    i = 1;
                }
                if (cc > m) {
                    m = cc;
                    i = 2;
                }
                if (d > m) {
                    m = d;
                    i = 3;
                }
                yo[ow] = m;
                ao[ow] = i;
            }
        }
    }
}

static void maxpool_forward(nn_layer *l, const nn_ctx *c, const float *in, float *out) {
    size_t insz = nn_shape_size(l->in), outsz = nn_shape_size(l->out);
    int    k = l->k, st = l->stride, ho = l->out.h, wo = l->out.w, h = l->in.h, w = l->in.w;
    for (int s = c->s0; s < c->s1; s++) {
        const float *x   = in + (size_t)s * insz;
        float       *y   = out + (size_t)s * outsz;
        uint8_t     *arg = l->aux + (size_t)s * l->aux_per_sample;
        if (k == 2 && st == 2) {
            pool2x2(x, l->in.c, h, w, ho, wo, y, arg);
            continue;
        }
        for (int ch = 0; ch < l->in.c; ch++) {
            const float *plane = x + (size_t)ch * h * w;
            for (int oh = 0; oh < ho; oh++)
                for (int ow = 0; ow < wo; ow++) {
                    const float *win  = plane + (size_t)(oh * st) * w + ow * st;
                    float        best = win[0];
                    int          bi   = 0;
                    for (int i = 0; i < k; i++)
                        for (int j = 0; j < k; j++)
                            if (win[(size_t)i * w + j] > best) {
                                best = win[(size_t)i * w + j];
                                bi   = i * k + j;
                            }
                    size_t o = ((size_t)ch * ho + oh) * wo + ow;
                    y[o]     = best;
                    arg[o]   = (uint8_t)bi;
                }
        }
    }
}

static void maxpool_backward(nn_layer *l, const nn_ctx *c, const float *in, const float *out,
                             float *dout, float *din, float *dparams) {
    (void)in;
    (void)out;
    (void)dparams;
    if (!din)
        return;
    size_t insz = nn_shape_size(l->in), outsz = nn_shape_size(l->out);
    int    k = l->k, st = l->stride, ho = l->out.h, wo = l->out.w, h = l->in.h, w = l->in.w;
    for (int s = c->s0; s < c->s1; s++) {
        float         *dx  = din + (size_t)s * insz;
        const float   *dy  = dout + (size_t)s * outsz;
        const uint8_t *arg = l->aux + (size_t)s * l->aux_per_sample;
        memset(dx, 0, sizeof(float) * insz);
        for (int ch = 0; ch < l->in.c; ch++) {
            float *plane = dx + (size_t)ch * h * w;
            for (int oh = 0; oh < ho; oh++)
                for (int ow = 0; ow < wo; ow++) {
                    size_t o = ((size_t)ch * ho + oh) * wo + ow;
                    int    i = arg[o] / k, j = arg[o] % k;
                    plane[(size_t)(oh * st + i) * w + ow * st + j] += dy[o];
                }
        }
    }
}

const nn_layer_ops dt_nn_maxpool2d_ops = {
    .kind      = "maxpool2d",
    .in_place  = false,
    .grad_mode = NN_GRAD_PARTIAL,
    .setup     = maxpool_setup,
    .forward   = maxpool_forward,
    .backward  = maxpool_backward,
};
