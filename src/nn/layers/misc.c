// misc.c: the built-in layers without parameters: element-wise activations,
// Softmax, Dropout, pooling, Flatten, Add, Concat and causal self-attention.
#include "kernels/table.h"
#include "nn/layers/layers_impl.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

static size_t numel_in(const dt_layer_args *a, int i) {
    return (size_t)a->batch * dt_shape_numel(&a->in[i]);
}

// ------------------------------------------------------------------------ activations

static dt_status act_setup(const dt_layer *l, int nin, const dt_shape *in, dt_layer_setup *s) {
    DT_TRY(lay_expect(l->ops->kind, nin, in, 1, 0, DT_SHAPE_MAX_DIMS));
    s->out = in[0];
    // ReLU works in place (its mask comes from its output's sign); tanh and sigmoid take
    // their gradient from their output's values; GELU and SiLU from their input
    if (l->config) {
        dt_act act          = *(const dt_act *)l->config;
        s->in_place         = act == DT_ACT_RELU;
        s->output_read_back = act == DT_ACT_TANH || act == DT_ACT_SIGMOID;
    }
    return DT_OK;
}

static dt_status act_forward(const dt_layer *l, const dt_layer_args *a) {
    dt_act       act = *(const dt_act *)l->config;
    size_t       n   = numel_in(a, 0);
    const float *x   = a->x[0];
    switch (act) {
    case DT_ACT_RELU:
        dt_nn_relu_forward(n, x, a->y);
        break;
    case DT_ACT_GELU:
    case DT_ACT_GELU_TANH:
        dt_nn_gelu_forward(n, act == DT_ACT_GELU_TANH, x, a->y);
        break;
    case DT_ACT_TANH:
        dt_nn_tanh_forward(n, x, a->y);
        break;
    case DT_ACT_SIGMOID:
        dt_nn_sigmoid_forward(n, x, a->y);
        break;
    case DT_ACT_SILU:
        dt_nn_silu_forward(n, x, a->y);
        break;
    }
    return DT_OK;
}

static dt_status act_backward(const dt_layer *l, const dt_layer_args *a) {
    dt_act act = *(const dt_act *)l->config;
    size_t n   = numel_in(a, 0);
    float *dx  = a->dx[0];
    if (!dx)
        return DT_OK;
    switch (act) {
    case DT_ACT_RELU:
        dt_nn_relu_grad(n, a->y, a->dy, dx);
        break;
    case DT_ACT_GELU:
    case DT_ACT_GELU_TANH:
        dt_nn_gelu_backward(n, act == DT_ACT_GELU_TANH, a->x[0], a->dy, dx);
        break;
    case DT_ACT_TANH:
        dt_nn_tanh_backward(n, a->y, a->dy, dx);
        break;
    case DT_ACT_SIGMOID:
        dt_nn_sigmoid_backward(n, a->y, a->dy, dx);
        break;
    case DT_ACT_SILU:
        dt_nn_silu_backward(n, a->x[0], a->dy, dx);
        break;
    }
    return DT_OK;
}

static const dt_layer_ops act_ops[] = {
    {"relu", act_setup, NULL, act_forward, act_backward, NULL},
    {"gelu", act_setup, NULL, act_forward, act_backward, NULL},
    {"gelu_tanh", act_setup, NULL, act_forward, act_backward, NULL},
    {"tanh", act_setup, NULL, act_forward, act_backward, NULL},
    {"sigmoid", act_setup, NULL, act_forward, act_backward, NULL},
    {"silu", act_setup, NULL, act_forward, act_backward, NULL},
};

bool lay_is_relu(const dt_layer *l) {
    return l && l->ops == &act_ops[DT_ACT_RELU];
}

dt_status dt_layer_act_new(dt_layer **out, dt_act act, const dt_layer_opts *opts) {
    (void)opts;
    if ((int)act < 0 || (int)act > DT_ACT_SILU)
        return dt_fail(DT_ERR_ARG, "activation: expected a dt_act, found %d", (int)act);
    return lay_new(out, &act_ops[act], &act, sizeof act);
}

// ------------------------------------------------------------------------------ Softmax

static int last_rows(const dt_layer_args *a, int *d) {
    const dt_shape *s = &a->in[0];
    *d                = s->ndim ? (int)s->d[s->ndim - 1] : 1;
    return (int)(numel_in(a, 0) / (size_t)*d);
}

static dt_status softmax_forward(const dt_layer *l, const dt_layer_args *a) {
    (void)l;
    int d, rows = last_rows(a, &d);
    dt_nn_softmax_forward(rows, d, a->x[0], a->y);
    return DT_OK;
}

static dt_status softmax_backward(const dt_layer *l, const dt_layer_args *a) {
    (void)l;
    int d, rows = last_rows(a, &d);
    if (a->dx[0])
        dt_nn_softmax_backward(rows, d, a->y, a->dy, a->dx[0]);
    return DT_OK;
}

static dt_status softmax_setup(const dt_layer *l, int nin, const dt_shape *in, dt_layer_setup *s) {
    DT_TRY(lay_expect(l->ops->kind, nin, in, 1, 0, DT_SHAPE_MAX_DIMS));
    s->out              = in[0];
    s->output_read_back = true; // dx = y (dy - sum(dy y)), from y
    return DT_OK;
}

static const dt_layer_ops softmax_ops = {"softmax",       softmax_setup,    NULL,
                                         softmax_forward, softmax_backward, NULL};

// --------------------------------------------------------------------------- LogSoftmax
// y = x - max - log(sum exp(x - max)) over the last dimension (not counting trailing
// ones), the stable form, the sum
// in double; backward dx = dy - exp(y) sum(dy), from y.

// Over the last dimension that is not 1: a Sequential model's (classes, 1, 1) is
// (classes).
static int feature_rows(const dt_layer_args *a, int *d) {
    const dt_shape *s  = &a->in[0];
    int             fd = s->ndim - 1;
    while (fd > 0 && s->d[fd] == 1)
        fd--;
    *d = fd >= 0 ? (int)s->d[fd] : 1;
    return (int)(numel_in(a, 0) / (size_t)*d);
}

static dt_status log_softmax_forward(const dt_layer *l, const dt_layer_args *a) {
    (void)l;
    int d, rows = feature_rows(a, &d);
    for (int r = 0; r < rows; r++) {
        const float *x = a->x[0] + (size_t)r * d;
        float       *y = a->y + (size_t)r * d;
        float        m = x[0];
        for (int i = 1; i < d; i++)
            m = x[i] > m ? x[i] : m;
        double sum = 0.0;
        for (int i = 0; i < d; i++)
            sum += exp((double)(x[i] - m));
        float lse = m + (float)log(sum);
        for (int i = 0; i < d; i++)
            y[i] = x[i] - lse;
    }
    return DT_OK;
}

static dt_status log_softmax_backward(const dt_layer *l, const dt_layer_args *a) {
    (void)l;
    int d, rows = feature_rows(a, &d);
    if (!a->dx[0])
        return DT_OK;
    for (int r = 0; r < rows; r++) {
        const float *y = a->y + (size_t)r * d, *dy = a->dy + (size_t)r * d;
        float       *dx  = a->dx[0] + (size_t)r * d;
        float        sum = 0.0f;
        for (int i = 0; i < d; i++)
            sum += dy[i];
        for (int i = 0; i < d; i++)
            dx[i] = dy[i] - expf(y[i]) * sum;
    }
    return DT_OK;
}

static const dt_layer_ops log_softmax_ops = {"log_softmax",       softmax_setup,        NULL,
                                             log_softmax_forward, log_softmax_backward, NULL};

dt_status dt_layer_log_softmax_new(dt_layer **out, const dt_layer_opts *opts) {
    (void)opts;
    int dummy = 0;
    return lay_new(out, &log_softmax_ops, &dummy, sizeof dummy);
}

dt_status dt_layer_softmax_new(dt_layer **out, const dt_layer_opts *opts) {
    (void)opts;
    int dummy = 0;
    return lay_new(out, &softmax_ops, &dummy, sizeof dummy);
}

// ------------------------------------------------------------------------------ Dropout
// The mask of sample s is drawn from split(node stream, key of s), unit by unit (keep
// when uniform >= p): an element for Dropout, a channel (the first per-sample
// dimension) for Dropout2d, so a sample gets the same mask whichever thread, batch or
// process holds it. saved keeps one byte per unit (kept or not); kept values are
// scaled by 1/(1-p), in place when the graph gives y == x.

typedef struct drop_cfg {
    float p;
    bool  channels; // Dropout2d
} drop_cfg;

// Units of a sample (elements or channels) and values per unit.
static size_t drop_units(const drop_cfg *c, const dt_shape *in, size_t *per) {
    size_t n = dt_shape_numel(in), u = c->channels ? (size_t)in->d[0] : n;
    *per = n / u;
    return u;
}

static dt_status dropout_setup(const dt_layer *l, int nin, const dt_shape *in, dt_layer_setup *s) {
    const drop_cfg *c = l->config;
    DT_TRY(lay_expect(c->channels ? "dropout2d" : "dropout", nin, in, 1, c->channels ? 2 : 0,
                      DT_SHAPE_MAX_DIMS));
    size_t per, u = drop_units(c, &in[0], &per);
    s->out              = in[0];
    s->saved_per_sample = (u + sizeof(float) - 1) / sizeof(float); // one byte a unit
    s->in_place         = true;
    return DT_OK;
}

// Sample s's mask of u bytes in the saved state (whole floats per sample).
static uint8_t *drop_mask(const dt_layer_args *a, int s, size_t u) {
    size_t floats = (u + sizeof(float) - 1) / sizeof(float);
    return (uint8_t *)(void *)(a->saved + (size_t)s * floats);
}

static dt_status dropout_forward(const dt_layer *l, const dt_layer_args *a) {
    const drop_cfg *c = l->config;
    size_t          per, u = drop_units(c, &a->in[0], &per), n = u * per;
    if (a->y != a->x[0])
        memcpy(a->y, a->x[0], sizeof(float) * n * (size_t)a->batch);
    if (!a->training || c->p == 0.0f)
        return DT_OK;
    float scale = 1.0f / (1.0f - c->p);
    for (int s = 0; s < a->batch; s++) {
        dt_rng   r    = dt_rng_split(a->rng, a->keys ? a->keys[s] : (uint64_t)s);
        uint8_t *mask = drop_mask(a, s, u);
        for (size_t k = 0; k < u; k++)
            mask[k] = dt_rng_uniform(&r) >= c->p;
        dt_k()->mask_scale(a->y + (size_t)s * n, mask, u, per, scale);
    }
    return DT_OK;
}

static dt_status dropout_backward(const dt_layer *l, const dt_layer_args *a) {
    const drop_cfg *c = l->config;
    size_t          per, u = drop_units(c, &a->in[0], &per), n = u * per;
    if (!a->dx[0])
        return DT_OK;
    if (a->dx[0] != a->dy)
        memcpy(a->dx[0], a->dy, sizeof(float) * n * (size_t)a->batch);
    if (!a->training || c->p == 0.0f)
        return DT_OK;
    float scale = 1.0f / (1.0f - c->p);
    for (int s = 0; s < a->batch; s++)
        dt_k()->mask_scale(a->dx[0] + (size_t)s * n, drop_mask(a, s, u), u, per, scale);
    return DT_OK;
}

static const dt_layer_ops dropout_ops[2] = {
    {"dropout", dropout_setup, NULL, dropout_forward, dropout_backward, NULL},
    {"dropout2d", dropout_setup, NULL, dropout_forward, dropout_backward, NULL},
};

static dt_status drop_new(dt_layer **out, float p, bool channels) {
    if (!(p >= 0.0f && p < 1.0f))
        return dt_fail(DT_ERR_ARG, "%s: expected p in [0, 1), found %g",
                       channels ? "dropout2d" : "dropout", (double)p);
    drop_cfg c = {p, channels};
    return lay_new(out, &dropout_ops[channels], &c, sizeof c);
}

dt_status dt_layer_dropout2d_new(dt_layer **out, float p, const dt_layer_opts *opts) {
    (void)opts;
    return drop_new(out, p, true);
}

dt_status dt_layer_dropout_new(dt_layer **out, float p, const dt_layer_opts *opts) {
    (void)opts;
    return drop_new(out, p, false);
}

// ------------------------------------------------------------------------------ Pooling

typedef struct pool_cfg {
    dt_nn_avgpool2d p;        // the window, for max pooling too
    int             aho, awo; // adaptive: the output size
} pool_cfg;

// Max pooling: PyTorch's window rule (padding <= half the kernel, floor), padding
// never wins (it is -inf), ties go to the first maximum in row-major window order.
static dt_status pool_setup(const dt_layer *l, int nin, const dt_shape *in, dt_layer_setup *s) {
    const pool_cfg *p = l->config;
    DT_TRY(lay_expect(l->ops->kind, nin, in, 1, 3, 3));
    int ho, wo;
    if (l->ops->kind[0] == 'a' && l->ops->kind[1] == 'd') { // adaptive
        ho = p->aho;
        wo = p->awo;
    } else {
        DT_TRY(dt_nn_avgpool2d_check(&p->p, (int)in[0].d[1], (int)in[0].d[2], &ho, &wo));
    }
    s->out = (dt_shape){3, {in[0].d[0], ho, wo, 1}, DT_ELEM_F32};
    if (l->ops->kind[0] == 'm') // argmax per output, as a float index (exact below 2^24)
        s->saved_per_sample = dt_shape_numel(&s->out);
    return DT_OK;
}

static dt_status avgpool_forward(const dt_layer *l, const dt_layer_args *a) {
    const pool_cfg *p = l->config;
    dt_nn_avgpool2d_forward(&p->p, a->batch, (int)a->in[0].d[0], (int)a->in[0].d[1],
                            (int)a->in[0].d[2], a->x[0], a->y);
    return DT_OK;
}

static dt_status avgpool_backward(const dt_layer *l, const dt_layer_args *a) {
    const pool_cfg *p = l->config;
    if (a->dx[0])
        dt_nn_avgpool2d_backward(&p->p, a->batch, (int)a->in[0].d[0], (int)a->in[0].d[1],
                                 (int)a->in[0].d[2], a->dy, a->dx[0]);
    return DT_OK;
}

static dt_status adaptive_forward(const dt_layer *l, const dt_layer_args *a) {
    const pool_cfg *p = l->config;
    dt_nn_adaptive_avgpool2d_forward(a->batch, (int)a->in[0].d[0], (int)a->in[0].d[1],
                                     (int)a->in[0].d[2], p->aho, p->awo, a->x[0], a->y);
    return DT_OK;
}

static dt_status adaptive_backward(const dt_layer *l, const dt_layer_args *a) {
    const pool_cfg *p = l->config;
    if (a->dx[0])
        dt_nn_adaptive_avgpool2d_backward(a->batch, (int)a->in[0].d[0], (int)a->in[0].d[1],
                                          (int)a->in[0].d[2], p->aho, p->awo, a->dy, a->dx[0]);
    return DT_OK;
}

static dt_status maxpool_forward(const dt_layer *l, const dt_layer_args *a) {
    const dt_nn_avgpool2d *p = &((const pool_cfg *)l->config)->p;
    int                    h = (int)a->in[0].d[1], w = (int)a->in[0].d[2];
    int                    ho = (int)a->out->d[1], wo = (int)a->out->d[2];
    int                    planes = a->batch * (int)a->in[0].d[0];
    for (int pl = 0; pl < planes; pl++) {
        const float *x   = a->x[0] + (size_t)pl * h * w;
        float       *y   = a->y + (size_t)pl * ho * wo;
        float       *arg = a->saved + (size_t)pl * ho * wo;
        for (int i = 0; i < ho; i++)
            for (int j = 0; j < wo; j++) {
                float best = -INFINITY;
                int   bi   = -1;
                for (int ki = 0; ki < p->kh; ki++) {
                    int r = i * p->sh - p->ph + ki;
                    if (r < 0 || r >= h)
                        continue;
                    for (int kj = 0; kj < p->kw; kj++) {
                        int c = j * p->sw - p->pw + kj;
                        if (c < 0 || c >= w)
                            continue;
                        float v = x[r * w + c];
                        if (bi < 0 || v > best || isnan(v)) {
                            best = v;
                            bi   = r * w + c;
                        }
                    }
                }
                y[i * wo + j]   = best;
                arg[i * wo + j] = (float)bi;
            }
    }
    return DT_OK;
}

static dt_status maxpool_backward(const dt_layer *l, const dt_layer_args *a) {
    (void)l;
    if (!a->dx[0])
        return DT_OK;
    size_t hw     = (size_t)(a->in[0].d[1] * a->in[0].d[2]);
    size_t ow     = (size_t)(a->out->d[1] * a->out->d[2]);
    int    planes = a->batch * (int)a->in[0].d[0];
    memset(a->dx[0], 0, sizeof(float) * hw * (size_t)planes);
    for (int pl = 0; pl < planes; pl++)
        for (size_t o = 0; o < ow; o++) {
            float g = a->dy[(size_t)pl * ow + o];
            int   i = (int)a->saved[(size_t)pl * ow + o];
            if (i >= 0)
                a->dx[0][(size_t)pl * hw + (size_t)i] += g;
        }
    return DT_OK;
}

static const dt_layer_ops avgpool_ops  = {"avgpool2d",     pool_setup,       NULL,
                                          avgpool_forward, avgpool_backward, NULL};
static const dt_layer_ops maxpool_ops  = {"maxpool2d",     pool_setup,       NULL,
                                          maxpool_forward, maxpool_backward, NULL};
static const dt_layer_ops adaptive_ops = {"adaptive_avgpool2d", pool_setup,        NULL,
                                          adaptive_forward,     adaptive_backward, NULL};

dt_pool2d_opts dt_pool2d_opts_default(void) {
    return (dt_pool2d_opts){0};
}

static dt_status pool_new(dt_layer **out, const dt_layer_ops *ops, int kh, int kw,
                          const dt_pool2d_opts *opts) {
    dt_pool2d_opts o = opts ? *opts : dt_pool2d_opts_default();
    pool_cfg       c = {{kh, kw, o.sh ? o.sh : kh, o.sw ? o.sw : kw, o.ph, o.pw}, 0, 0};
    int            ho, wo;
    if (kh < 1 || kw < 1 || o.sh < 0 || o.sw < 0)
        return dt_fail(DT_ERR_ARG,
                       "%s: expected a positive kernel and strides >= 0, found "
                       "%dx%d",
                       ops->kind, kh, kw);
    DT_TRY(dt_nn_avgpool2d_check(&c.p, kh, kw, &ho, &wo));
    return lay_new(out, ops, &c, sizeof c);
}

bool lay_as_maxpool2d(const dt_layer *l, dt_nn_avgpool2d *p) {
    if (!l || l->ops != &maxpool_ops)
        return false;
    *p = ((const pool_cfg *)l->config)->p;
    return true;
}

dt_status dt_layer_avgpool2d_new(dt_layer **out, int kh, int kw, const dt_pool2d_opts *opts) {
    return pool_new(out, &avgpool_ops, kh, kw, opts);
}
dt_status dt_layer_maxpool2d_new(dt_layer **out, int kh, int kw, const dt_pool2d_opts *opts) {
    return pool_new(out, &maxpool_ops, kh, kw, opts);
}
dt_status dt_layer_adaptive_avgpool2d_new(dt_layer **out, int ho, int wo,
                                          const dt_layer_opts *opts) {
    (void)opts;
    if (ho < 1 || wo < 1)
        return dt_fail(DT_ERR_ARG,
                       "adaptive_avgpool2d: expected a positive output size, found "
                       "%dx%d",
                       ho, wo);
    pool_cfg c = {{1, 1, 1, 1, 0, 0}, ho, wo};
    return lay_new(out, &adaptive_ops, &c, sizeof c);
}

// ------------------------------------------------------------------- Flatten, Add, Concat

static dt_status flatten_setup(const dt_layer *l, int nin, const dt_shape *in, dt_layer_setup *s) {
    (void)l;
    DT_TRY(lay_expect("flatten", nin, in, 1, 0, DT_SHAPE_MAX_DIMS));
    s->out      = (dt_shape){1, {(int64_t)dt_shape_numel(&in[0]), 1, 1, 1}, DT_ELEM_F32};
    s->in_place = true; // a reshape: nothing moves when the graph shares the buffer
    return DT_OK;
}

static dt_status copy_forward(const dt_layer *l, const dt_layer_args *a) {
    (void)l;
    if (a->y != a->x[0])
        memcpy(a->y, a->x[0], sizeof(float) * numel_in(a, 0));
    return DT_OK;
}

static dt_status copy_backward(const dt_layer *l, const dt_layer_args *a) {
    (void)l;
    if (a->dx[0] && a->dx[0] != a->dy)
        memcpy(a->dx[0], a->dy, sizeof(float) * numel_in(a, 0));
    return DT_OK;
}

static const dt_layer_ops flatten_ops = {"flatten",    flatten_setup, NULL,
                                         copy_forward, copy_backward, NULL};

dt_status dt_layer_flatten_new(dt_layer **out, const dt_layer_opts *opts) {
    (void)opts;
    int dummy = 0;
    return lay_new(out, &flatten_ops, &dummy, sizeof dummy);
}

static bool same_shape(const dt_shape *a, const dt_shape *b) {
    if (a->ndim != b->ndim)
        return false;
    for (int i = 0; i < a->ndim; i++)
        if (a->d[i] != b->d[i])
            return false;
    return true;
}

static dt_status add_setup(const dt_layer *l, int nin, const dt_shape *in, dt_layer_setup *s) {
    (void)l;
    if (nin < 2)
        return dt_fail(DT_ERR_ARG, "add: expected 2 or more inputs, found %d", nin);
    DT_TRY(lay_expect("add", nin, in, nin, 0, DT_SHAPE_MAX_DIMS));
    for (int i = 1; i < nin; i++)
        if (!same_shape(&in[0], &in[i])) {
            char b0[64], b1[64];
            return dt_fail(DT_ERR_ARG, "add: expected equal shapes, found %s and %s",
                           dt_shape_str(&in[0], b0, sizeof b0),
                           dt_shape_str(&in[i], b1, sizeof b1));
        }
    s->out = in[0];
    return DT_OK;
}

static dt_status add_forward(const dt_layer *l, const dt_layer_args *a) {
    (void)l;
    size_t n = numel_in(a, 0);
    dt_nn_add_forward(n, a->x[0], a->x[1], a->y);
    for (int i = 2; i < a->nin; i++)
        dt_nn_accumulate(n, a->x[i], a->y);
    return DT_OK;
}

static dt_status add_backward(const dt_layer *l, const dt_layer_args *a) {
    (void)l;
    size_t n = numel_in(a, 0);
    for (int i = 0; i < a->nin; i++)
        if (a->dx[i])
            memcpy(a->dx[i], a->dy, sizeof(float) * n);
    return DT_OK;
}

static const dt_layer_ops add_ops = {"add", add_setup, NULL, add_forward, add_backward, NULL};

bool lay_is_add(const dt_layer *l) {
    return l && l->ops == &add_ops;
}

dt_status dt_layer_add_new(dt_layer **out, const dt_layer_opts *opts) {
    (void)opts;
    int dummy = 0;
    return lay_new(out, &add_ops, &dummy, sizeof dummy);
}

static dt_status concat_setup(const dt_layer *l, int nin, const dt_shape *in, dt_layer_setup *s) {
    int dim = *(const int *)l->config;
    DT_TRY(lay_expect("concat", nin, in, nin, dim + 1, DT_SHAPE_MAX_DIMS));
    s->out = in[0];
    for (int i = 1; i < nin; i++) {
        dt_shape t = in[i];
        t.d[dim]   = in[0].d[dim];
        if (!same_shape(&in[0], &t)) {
            char b0[64], b1[64];
            return dt_fail(DT_ERR_ARG,
                           "concat: expected shapes equal but in dimension %d, "
                           "found %s and %s",
                           dim, dt_shape_str(&in[0], b0, sizeof b0),
                           dt_shape_str(&in[i], b1, sizeof b1));
        }
        s->out.d[dim] += in[i].d[dim];
    }
    return DT_OK;
}

// Per sample, dimension `dim` splits a tensor into `outer` blocks of d[dim] * inner.
static size_t inner_of(const dt_shape *s, int dim) {
    size_t n = 1;
    for (int i = dim + 1; i < s->ndim; i++)
        n *= (size_t)s->d[i];
    return n;
}

static void concat_copy(const dt_layer_args *a, int dim, bool back) {
    size_t outer = (size_t)a->batch, inner = inner_of(a->out, dim);
    for (int i = 0; i < dim; i++)
        outer *= (size_t)a->out->d[i];
    size_t ob = (size_t)a->out->d[dim] * inner, off = 0;
    for (int k = 0; k < a->nin; k++) {
        size_t kb = (size_t)a->in[k].d[dim] * inner;
        if (!back || a->dx[k])
            for (size_t o = 0; o < outer; o++) {
                if (back)
                    memcpy(a->dx[k] + o * kb, a->dy + o * ob + off, sizeof(float) * kb);
                else
                    memcpy(a->y + o * ob + off, a->x[k] + o * kb, sizeof(float) * kb);
            }
        off += kb;
    }
}

static dt_status concat_forward(const dt_layer *l, const dt_layer_args *a) {
    concat_copy(a, *(const int *)l->config, false);
    return DT_OK;
}
static dt_status concat_backward(const dt_layer *l, const dt_layer_args *a) {
    concat_copy(a, *(const int *)l->config, true);
    return DT_OK;
}

static const dt_layer_ops concat_ops = {"concat",       concat_setup,    NULL,
                                        concat_forward, concat_backward, NULL};

dt_status dt_layer_concat_new(dt_layer **out, int dim, const dt_layer_opts *opts) {
    (void)opts;
    if (dim < 0 || dim >= DT_SHAPE_MAX_DIMS)
        return dt_fail(DT_ERR_ARG, "concat: expected a dimension in [0, %d), found %d",
                       DT_SHAPE_MAX_DIMS, dim);
    return lay_new(out, &concat_ops, &dim, sizeof dim);
}

// ---------------------------------------------------------------------------- Attention

static dt_status attn_setup(const dt_layer *l, int nin, const dt_shape *in, dt_layer_setup *s) {
    s->output_read_back = true; // backward recomputes the tiles against y
    int heads           = *(const int *)l->config;
    DT_TRY(lay_expect("attention", nin, in, 1, 2, 2));
    char b[64];
    if (in[0].d[1] % 3 != 0)
        return dt_fail(DT_ERR_ARG, "attention: expected packed (T, 3C) q|k|v, found %s",
                       dt_shape_str(&in[0], b, sizeof b));
    int T = (int)in[0].d[0], C = (int)(in[0].d[1] / 3);
    DT_TRY(dt_nn_attn_check(1, T, C, heads, 3 * C));
    s->out              = (dt_shape){2, {T, C, 1, 1}, DT_ELEM_F32};
    s->saved_per_sample = (size_t)heads * (size_t)T; // log-sum-exp per (head, row)
    s->scratch_fixed    = dt_nn_attn_scratch(C / heads);
    if (dt_nn_attn16_scratch(T, C / heads) > s->scratch_fixed) // bf16 (attn16.c)
        s->scratch_fixed = dt_nn_attn16_scratch(T, C / heads);
    s->flops_per_sample = 2.0 * T * (double)T * C; // q k^T and p v, causal half each
    return DT_OK;
}

static dt_status attn_forward(const dt_layer *l, const dt_layer_args *a) {
    int          H = *(const int *)l->config;
    int          T = (int)a->out->d[0], C = (int)a->out->d[1];
    const float *q = a->x[0];
    if (a->precision == DT_PREC_BF16 && dt_nn_attn16_ok(C, H))
        dt_nn_attn16_forward(a->batch, T, C, H, 3 * C, q, q + C, q + 2 * C, a->y, a->saved,
                             a->scratch);
    else
        dt_nn_attn_forward(a->batch, T, C, H, 3 * C, q, q + C, q + 2 * C, a->y, a->saved,
                           a->scratch);
    return DT_OK;
}

static dt_status attn_backward(const dt_layer *l, const dt_layer_args *a) {
    int          H = *(const int *)l->config;
    int          T = (int)a->out->d[0], C = (int)a->out->d[1];
    const float *q = a->x[0];
    float       *d = a->dx[0];
    if (d && a->precision == DT_PREC_BF16 && dt_nn_attn16_ok(C, H))
        dt_nn_attn16_backward(a->batch, T, C, H, 3 * C, q, q + C, q + 2 * C, a->y, a->saved, a->dy,
                              d, d + C, d + 2 * C, a->scratch);
    else if (d)
        dt_nn_attn_backward(a->batch, T, C, H, 3 * C, q, q + C, q + 2 * C, a->y, a->saved, a->dy, d,
                            d + C, d + 2 * C, a->scratch);
    return DT_OK;
}

static const dt_layer_ops attn_ops = {"attention",  attn_setup,    NULL,
                                      attn_forward, attn_backward, NULL};

dt_status dt_layer_attention_new(dt_layer **out, int heads, const dt_layer_opts *opts) {
    (void)opts;
    if (heads < 1)
        return dt_fail(DT_ERR_ARG, "attention: expected heads >= 1, found %d", heads);
    return lay_new(out, &attn_ops, &heads, sizeof heads);
}

bool lay_describe_misc(const dt_layer *l, dt_node_desc *d) {
    const char *kind = l->ops->kind;
    bool        act  = false;
    for (size_t i = 0; i < sizeof act_ops / sizeof act_ops[0]; i++)
        act |= l->ops == &act_ops[i];
    if (act) {
        ; // the kind is the activation's name
    } else if (l->ops == &dropout_ops[0] || l->ops == &dropout_ops[1]) {
        d->h.dropout.p = ((const drop_cfg *)l->config)->p;
    } else if (l->ops == &avgpool_ops || l->ops == &maxpool_ops) {
        const dt_nn_avgpool2d *p = &((const pool_cfg *)l->config)->p;
        d->h.pool = (__typeof__(d->h.pool)){p->kh, p->kw, p->sh, p->sw, p->ph, p->pw};
    } else if (l->ops == &attn_ops) {
        d->h.attn.heads = *(const int *)l->config;
    } else if (l->ops == &concat_ops) {
        d->h.concat.dim = *(const int *)l->config;
    } else if (l->ops != &softmax_ops && l->ops != &log_softmax_ops && l->ops != &adaptive_ops &&
               l->ops != &flatten_ops && l->ops != &add_ops) {
        return false;
    }
    snprintf(d->kind, sizeof d->kind, "%s", kind);
    return true;
}
