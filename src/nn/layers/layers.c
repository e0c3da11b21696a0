// layers.c: the layer interface (layer.h) and the built-in layers with parameters:
// Conv2d, Linear, LayerNorm, Embedding. Each wraps the kernels of ops.h; BatchNorm is
// in batchnorm.c, Linear in linear.c, the element-wise, pooling and structural layers in misc.c.
#include "nn/layers/layers_impl.h"
#include "nn/pool.h"

#include <stdio.h>
#include <string.h>

size_t dt_shape_numel(const dt_shape *s) {
    size_t n = 1;
    for (int i = 0; i < s->ndim; i++)
        n *= (size_t)s->d[i];
    return n;
}

const char *dt_shape_str(const dt_shape *s, char *buf, size_t n) {
    size_t o = 0;
    if (n == 0)
        return buf;
    buf[0] = 0;
    o += (size_t)snprintf(buf, n, "(");
    for (int i = 0; i < s->ndim && o < n; i++)
        o += (size_t)snprintf(buf + o, n - o, "%s%lld", i ? "," : "", (long long)s->d[i]);
    if (o < n)
        snprintf(buf + o, n - o, ")%s", s->dtype == DT_ELEM_I32 ? " i32" : "");
    return buf;
}

dt_layer_opts dt_layer_opts_default(void) {
    return (dt_layer_opts){0};
}

dt_status dt_layer_new(dt_layer **out, const dt_layer_ops *ops, void *config,
                       const dt_layer_opts *opts) {
    (void)opts;
    if (out)
        *out = NULL;
    if (!out || !ops || !ops->kind || !ops->setup || !ops->forward || !ops->backward) {
        if (ops && ops->free_config)
            ops->free_config(config);
        else
            dt_free(config);
        return dt_fail(DT_ERR_ARG, "dt_layer_new: expected an output pointer and ops with kind, "
                                   "setup, forward and backward");
    }
    dt_layer *l = dt_alloc_zero(sizeof *l);
    if (!l) {
        if (ops->free_config)
            ops->free_config(config);
        else
            dt_free(config);
        return DT_ERR_NOMEM;
    }
    l->ops    = ops;
    l->config = config;
    *out      = l;
    return DT_OK;
}

void dt_layer_free(dt_layer *l) {
    if (!l)
        return;
    if (l->ops && l->ops->free_config)
        l->ops->free_config(l->config);
    else
        dt_free(l->config);
    dt_free(l);
}

void dt_layer_parallel(const dt_layer_args *a, void (*fn)(void *arg, int i, int n), void *arg) {
    if (a && a->pool)
        dt_pool_run(a->pool, fn, arg);
    else
        fn(arg, 0, 1);
}

void dt_layer_team_meet(const dt_layer_args *a) {
    if (a && a->team && a->team->nth > 1 && a->pool)
        dt_pool_barrier(a->pool);
}

dt_status lay_new(dt_layer **out, const dt_layer_ops *ops, const void *cfg, size_t size) {
    if (!out)
        return dt_fail(DT_ERR_ARG, "%s: expected an output pointer, found NULL", ops->kind);
    *out    = NULL;
    void *c = dt_alloc(size ? size : 1);
    if (!c)
        return DT_ERR_NOMEM;
    memcpy(c, cfg, size);
    return dt_layer_new(out, ops, c, NULL);
}

void lay_tensor(dt_layer_tensor *t, const char *name, uint32_t flags, int ndim, int64_t d0,
                int64_t d1, int64_t d2, int64_t d3) {
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, "%s", name);
    t->ndim     = ndim;
    t->flags    = flags;
    int64_t d[] = {d0, d1, d2, d3};
    for (int i = 0; i < DT_PARAM_MAX_DIMS; i++)
        t->shape[i] = i < ndim ? d[i] : 1;
}

dt_status lay_expect(const char *kind, int nin, const dt_shape *in, int want_nin, int ndim_lo,
                     int ndim_hi) {
    if (nin != want_nin)
        return dt_fail(DT_ERR_ARG, "%s: expected %d input(s), found %d", kind, want_nin, nin);
    for (int i = 0; i < nin; i++) {
        char b[64];
        if (in[i].dtype != DT_ELEM_F32)
            return dt_fail(DT_ERR_ARG, "%s: expected a float input, found %s", kind,
                           dt_shape_str(&in[i], b, sizeof b));
        if (in[i].ndim < ndim_lo || in[i].ndim > ndim_hi)
            return dt_fail(DT_ERR_ARG,
                           "%s: expected a per-sample shape of %d..%d dimensions, "
                           "found %s",
                           kind, ndim_lo, ndim_hi, dt_shape_str(&in[i], b, sizeof b));
    }
    return DT_OK;
}

dt_status lay_expect_tokens(const char *kind, int nin, const dt_shape *in, int d, dt_shape *out) {
    char b[64];
    if (nin != 1 || in[0].dtype != DT_ELEM_I32 || in[0].ndim >= DT_SHAPE_MAX_DIMS)
        return dt_fail(DT_ERR_ARG,
                       "%s: expected one int32 input of at most %d dimensions, found %d inputs, "
                       "the first %s",
                       kind, DT_SHAPE_MAX_DIMS - 1, nin,
                       nin > 0 ? dt_shape_str(&in[0], b, sizeof b) : "none");
    *out               = in[0];
    out->dtype         = DT_ELEM_F32;
    out->d[in[0].ndim] = d;
    out->ndim          = in[0].ndim + 1;
    return DT_OK;
}

// ------------------------------------------------------------------------------ Conv2d

static dt_status conv_setup(const dt_layer *l, int nin, const dt_shape *in, dt_layer_setup *s) {
    const dt_nn_conv2d *p = l->config;
    DT_TRY(lay_expect("conv2d", nin, in, 1, 3, 3));
    char b[64];
    if (in[0].d[0] != p->cin)
        return dt_fail(DT_ERR_ARG, "conv2d: expected %d input channels, found %s", p->cin,
                       dt_shape_str(&in[0], b, sizeof b));
    int h = (int)in[0].d[1], w = (int)in[0].d[2], ho, wo;
    DT_TRY(dt_nn_conv2d_check(p, h, w, &ho, &wo));
    s->out = (dt_shape){3, {p->cout, ho, wo, 1}, DT_ELEM_F32};
    lay_tensor(&s->params[0], "weight", 0, 4, p->cout, p->cin / p->groups, p->kh, p->kw);
    s->nparams = 1;
    if (p->bias)
        lay_tensor(&s->params[s->nparams++], "bias", DT_PARAM_NO_DECAY, 1, p->cout, 0, 0, 0);
    s->scratch_fixed    = dt_nn_conv2d_scratch(p, h, w);
    s->lowp_params      = 1u; // the weight, in a 16-bit precision mode
    s->flops_per_sample = 2.0 * (double)dt_nn_conv2d_weight_count(p) * ho * wo;
    return DT_OK;
}

static void conv_init(const dt_layer *l, dt_rng *rng, float *const *w, float *const *buf) {
    (void)buf;
    const dt_nn_conv2d *p = l->config;
    dt_nn_conv2d_init(p, rng, w[0], p->bias ? w[1] : NULL);
}

static dt_status conv_forward(const dt_layer *l, const dt_layer_args *a) {
    const dt_nn_conv2d *p = l->config;
    return dt_nn_conv2d_forward_prec(p, a->precision, a->w16 ? a->w16[0] : NULL, a->batch,
                                     (int)a->in[0].d[1], (int)a->in[0].d[2], a->x[0], a->w[0],
                                     p->bias ? a->w[1] : NULL, a->y, a->scratch);
}

static dt_status conv_backward(const dt_layer *l, const dt_layer_args *a) {
    const dt_nn_conv2d *p = l->config;
    return dt_nn_conv2d_backward_prec(p, a->precision, a->w16 ? a->w16[0] : NULL, a->batch,
                                      (int)a->in[0].d[1], (int)a->in[0].d[2], a->x[0], a->w[0],
                                      a->dy, a->dx[0], a->dw[0], p->bias ? a->dw[1] : NULL,
                                      a->scratch);
}

static const dt_layer_ops conv_ops = {"conv2d",     conv_setup,    conv_init,
                                      conv_forward, conv_backward, NULL};

bool lay_as_conv2d(const dt_layer *l, dt_nn_conv2d *p) {
    if (!l || l->ops != &conv_ops)
        return false;
    *p = *(const dt_nn_conv2d *)l->config;
    return true;
}

dt_conv2d_opts dt_conv2d_opts_default(void) {
    return (dt_conv2d_opts){.sh = 1, .sw = 1, .groups = 1, .bias = true};
}

dt_status dt_layer_conv2d_new(dt_layer **out, int cin, int cout, int kh, int kw,
                              const dt_conv2d_opts *opts) {
    dt_conv2d_opts o = opts ? *opts : dt_conv2d_opts_default();
    dt_nn_conv2d   p = {cin, cout, kh, kw, o.sh, o.sw, o.ph, o.pw, o.groups, o.bias};
    int            ho, wo; // checks everything but the input size with a kernel-sized input
    if (cin < 1 || cout < 1 || kh < 1 || kw < 1 || o.groups < 1 || o.sh < 1 || o.sw < 1 ||
        o.ph < 0 || o.pw < 0)
        return dt_fail(DT_ERR_ARG,
                       "conv2d: expected positive sizes, strides and groups and "
                       "padding >= 0, found cin %d cout %d kernel %dx%d stride %dx%d groups %d",
                       cin, cout, kh, kw, o.sh, o.sw, o.groups);
    DT_TRY(dt_nn_conv2d_check(&p, kh, kw, &ho, &wo));
    return lay_new(out, &conv_ops, &p, sizeof p);
}

// --------------------------------------------------------------------------- LayerNorm

typedef struct ln_cfg {
    int   d;
    float eps;
    bool  affine;
} ln_cfg;

static dt_status ln_setup(const dt_layer *l, int nin, const dt_shape *in, dt_layer_setup *s) {
    const ln_cfg *p = l->config;
    DT_TRY(lay_expect("layernorm", nin, in, 1, 1, DT_SHAPE_MAX_DIMS));
    char b[64];
    if (in[0].d[in[0].ndim - 1] != p->d)
        return dt_fail(DT_ERR_ARG, "layernorm: expected a last dimension of %d, found %s", p->d,
                       dt_shape_str(&in[0], b, sizeof b));
    s->out = in[0];
    if (p->affine) {
        lay_tensor(&s->params[0], "weight", DT_PARAM_NO_DECAY, 1, p->d, 0, 0, 0);
        lay_tensor(&s->params[1], "bias", DT_PARAM_NO_DECAY, 1, p->d, 0, 0, 0);
        s->nparams = 2;
    }
    s->saved_per_sample = 2 * dt_shape_numel(&in[0]) / (size_t)p->d; // mean, rstd per row
    return DT_OK;
}

static void ln_init(const dt_layer *l, dt_rng *rng, float *const *w, float *const *buf) {
    (void)rng;
    (void)buf;
    const ln_cfg *p = l->config;
    if (p->affine)
        dt_nn_layernorm_init(p->d, w[0], w[1]);
}

// The saved state is per sample: the sample's R row means, then its R row rstds, so a
// call on any range of samples (a thread's, or one sample under gradient shards) finds
// its own at its own offset. (All means then all rstds of the call's rows, as before,
// put a shard's backward on another sample's statistics.)
static dt_status ln_forward(const dt_layer *l, const dt_layer_args *a) {
    const ln_cfg *p = l->config;
    int           R = (int)(dt_shape_numel(&a->in[0]) / (size_t)p->d);
    for (int s = 0; s < a->batch; s++) {
        size_t o  = (size_t)s * R * p->d;
        float *st = a->saved + (size_t)s * 2 * R;
        dt_nn_layernorm_forward(R, p->d, p->eps, a->x[0] + o, p->affine ? a->w[0] : NULL,
                                p->affine ? a->w[1] : NULL, a->y + o, st, st + R);
    }
    return DT_OK;
}

static dt_status ln_backward(const dt_layer *l, const dt_layer_args *a) {
    const ln_cfg *p = l->config;
    int           R = (int)(dt_shape_numel(&a->in[0]) / (size_t)p->d);
    for (int s = 0; s < a->batch; s++) {
        size_t       o  = (size_t)s * R * p->d;
        const float *st = a->saved + (size_t)s * 2 * R;
        dt_nn_layernorm_backward(R, p->d, a->x[0] + o, p->affine ? a->w[0] : NULL, st, st + R,
                                 a->dy + o, a->dx[0] ? a->dx[0] + o : NULL,
                                 p->affine ? a->dw[0] : NULL, p->affine ? a->dw[1] : NULL);
    }
    return DT_OK;
}

static const dt_layer_ops ln_ops = {"layernorm", ln_setup, ln_init, ln_forward, ln_backward, NULL};

dt_layernorm_opts dt_layernorm_opts_default(void) {
    return (dt_layernorm_opts){.eps = 1e-5f, .affine = true};
}

dt_status dt_layer_layernorm_new(dt_layer **out, int d, const dt_layernorm_opts *opts) {
    dt_layernorm_opts o = opts ? *opts : dt_layernorm_opts_default();
    if (d < 1 || !(o.eps > 0.0f))
        return dt_fail(DT_ERR_ARG, "layernorm: expected d >= 1 and eps > 0, found %d, %g", d,
                       (double)o.eps);
    ln_cfg p = {d, o.eps, o.affine};
    return lay_new(out, &ln_ops, &p, sizeof p);
}

// --------------------------------------------------------------------------- Embedding

typedef struct emb_cfg {
    int num, d;
} emb_cfg;

static dt_status emb_setup(const dt_layer *l, int nin, const dt_shape *in, dt_layer_setup *s) {
    const emb_cfg *p = l->config;
    DT_TRY(lay_expect_tokens("embedding", nin, in, p->d, &s->out));
    lay_tensor(&s->params[0], "weight", 0, 2, p->num, p->d, 0, 0);
    s->nparams       = 1;
    s->no_input_grad = true;
    return DT_OK;
}

static void emb_init(const dt_layer *l, dt_rng *rng, float *const *w, float *const *buf) {
    (void)buf;
    const emb_cfg *p = l->config;
    dt_nn_embedding_init(p->num, p->d, rng, w[0]);
}

static dt_status emb_forward(const dt_layer *l, const dt_layer_args *a) {
    const emb_cfg *p = l->config;
    return dt_nn_embedding_forward((int)((size_t)a->batch * dt_shape_numel(&a->in[0])), p->num,
                                   p->d, (const int32_t *)(const void *)a->x[0], a->w[0], a->y);
}

static dt_status emb_backward(const dt_layer *l, const dt_layer_args *a) {
    const emb_cfg *p = l->config;
    dt_nn_embedding_backward((int)((size_t)a->batch * dt_shape_numel(&a->in[0])), p->d,
                             (const int32_t *)(const void *)a->x[0], a->dy, a->dw[0]);
    return DT_OK;
}

static const dt_layer_ops emb_ops = {"embedding", emb_setup,    emb_init,
                                     emb_forward, emb_backward, NULL};

dt_status dt_layer_embedding_new(dt_layer **out, int num, int d, const dt_layer_opts *opts) {
    (void)opts;
    if (num < 1 || d < 1)
        return dt_fail(DT_ERR_ARG, "embedding: expected num >= 1 and d >= 1, found %d, %d", num, d);
    emb_cfg p = {num, d};
    return lay_new(out, &emb_ops, &p, sizeof p);
}

bool lay_describe_core(const dt_layer *l, dt_node_desc *d) {
    if (l->ops == &conv_ops) {
        const dt_nn_conv2d *p = l->config;
        snprintf(d->kind, sizeof d->kind, "conv2d");
        d->h.conv = (__typeof__(d->h.conv)){p->cin, p->cout, p->kh,     p->kw,   p->sh, p->sw,
                                            p->ph,  p->pw,   p->groups, p->bias, false, false};
    } else if (l->ops == &ln_ops) {
        const ln_cfg *p = l->config;
        snprintf(d->kind, sizeof d->kind, "layernorm");
        d->h.ln.eps = p->eps, d->h.ln.affine = p->affine;
    } else if (l->ops == &emb_ops) {
        const emb_cfg *p = l->config;
        snprintf(d->kind, sizeof d->kind, "embedding");
        d->h.emb.num = p->num, d->h.emb.d = p->d;
    } else {
        return false;
    }
    return true;
}
