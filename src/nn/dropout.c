// dropout.c: element-wise dropout (torch.nn.Dropout) and channel dropout
// (torch.nn.Dropout2d), both in place. In training, kept values are scaled by
// 1/(1-p) so evaluation needs no rescaling. The mask of sample s is drawn from the
// stream split(layer stream, key of s), the key being the sample's own (its dataset
// index, set with dt_model_set_sample_keys) or else its position s in the batch: it
// does not depend on which thread runs the sample, nor, with keys, on which batch or
// process holds it.
#include "core/simd.h"
#include "nn/nn_impl.h"

static dt_status dropout_setup(nn_layer *l) {
    if (!(l->p >= 0.0f && l->p < 1.0f))
        return dt_fail(DT_ERR_ARG, "layer %d dropout: expected p in [0, 1), found %g", l->index,
                       (double)l->p);
    l->out            = l->in;
    l->aux_per_sample = nn_shape_size(l->in); // one byte per element: kept or not
    return DT_OK;
}

static dt_status dropout2d_setup(nn_layer *l) {
    DT_TRY(dropout_setup(l));
    l->aux_per_sample = (size_t)l->in.c; // one byte per channel
    return DT_OK;
}

// v[i] *= f for i < n, sixteen lanes at a time (the same products as the scalar loop).
DT_VINLINE void scale_run(float *v, size_t n, float f) {
    size_t i = 0;
    for (; i + 16 <= n; i += 16)
        dt_store16(v + i, dt_load16(v + i) * f);
    for (; i < n; i++)
        v[i] *= f;
}

// Draws the keep mask of `n` units of sample s (keep with probability 1 - p, the
// Bernoulli(1 - p) of PyTorch), then scales `per_unit` values of each unit.
DT_CLONES static void apply_mask(nn_layer *l, const nn_ctx *c, float *y, int s, size_t n,
                                 size_t per_unit) {
    uint8_t *mask  = l->aux + (size_t)s * l->aux_per_sample;
    dt_rng   r     = dt_rng_split(c->rng, c->keys ? c->keys[s] : (uint64_t)s);
    float    scale = 1.0f / (1.0f - l->p);
    for (size_t u = 0; u < n; u++) {
        mask[u] = dt_rng_uniform(&r) >= l->p;
        scale_run(y + u * per_unit, per_unit, mask[u] ? scale : 0.0f);
    }
}

DT_CLONES static void scale_by_mask(nn_layer *l, float *d, int s, size_t n, size_t per_unit) {
    const uint8_t *mask  = l->aux + (size_t)s * l->aux_per_sample;
    float          scale = 1.0f / (1.0f - l->p);
    for (size_t u = 0; u < n; u++)
        scale_run(d + u * per_unit, per_unit, mask[u] ? scale : 0.0f);
}

static size_t units(const nn_layer *l) {
    return l->aux_per_sample; // elements for dropout, channels for dropout2d
}

static void dropout_forward(nn_layer *l, const nn_ctx *c, const float *in, float *out) {
    (void)in; // in place; the model records c->training in l->last_training
    if (!c->training || l->p == 0.0f)
        return;
    size_t n = nn_shape_size(l->in), u = units(l);
    for (int s = c->s0; s < c->s1; s++)
        apply_mask(l, c, out + (size_t)s * n, s, u, n / u);
}

static void dropout_backward(nn_layer *l, const nn_ctx *c, const float *in, const float *out,
                             float *dout, float *din, float *dparams) {
    (void)in;
    (void)out;
    (void)din; // in place
    (void)dparams;
    if (!l->last_training || l->p == 0.0f)
        return;
    size_t n = nn_shape_size(l->in), u = units(l);
    for (int s = c->s0; s < c->s1; s++)
        scale_by_mask(l, dout + (size_t)s * n, s, u, n / u);
}

const nn_layer_ops dt_nn_dropout_ops = {
    .kind      = "dropout",
    .in_place  = true,
    .grad_mode = NN_GRAD_PARTIAL,
    .setup     = dropout_setup,
    .forward   = dropout_forward,
    .backward  = dropout_backward,
};

const nn_layer_ops dt_nn_dropout2d_ops = {
    .kind      = "dropout2d",
    .in_place  = true,
    .grad_mode = NN_GRAD_PARTIAL,
    .setup     = dropout2d_setup,
    .forward   = dropout_forward,
    .backward  = dropout_backward,
};
