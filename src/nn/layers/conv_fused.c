// conv_fused.c: the fused convolution (conv_fused.h) as a layer of the graph.
#include "nn/layers/conv_fused.h"

#include <math.h>
#include <string.h>

enum {
    K_CONV_RELU,
    K_CONV_RELU_POOL,
    K_N,
};

static dt_status fused_setup(const dt_layer *l, int nin, const dt_shape *in, dt_layer_setup *s);
static dt_status fused_forward(const dt_layer *l, const dt_layer_args *a);
static dt_status fused_backward(const dt_layer *l, const dt_layer_args *a);
static void      fused_free(void *config);
static void      fused_init(const dt_layer *l, dt_rng *rng, float *const *w, float *const *buf);

#define FUSED_OPS(kind)                                                                            \
    { kind, fused_setup, fused_init, fused_forward, fused_backward, fused_free }
static const dt_layer_ops fused_ops[K_N] = {
    FUSED_OPS("conv2d+relu"),
    FUSED_OPS("conv2d+relu+maxpool2d"),
};

static fused_cfg *cfg(const dt_layer *l) {
    return l->config;
}

static void fused_free(void *config) {
    fused_cfg *c = config;
    if (!c)
        return;
    dt_free(c->nl.offsets);
    dt_layer_free(c->orig);
    dt_free(c);
}

static dt_status fused_setup(const dt_layer *l, int nin, const dt_shape *in, dt_layer_setup *s) {
    fused_cfg *c  = cfg(l);
    nn_layer  *nl = &c->nl;
    char       b[64];
    if (nin != 1 || in[0].dtype != DT_ELEM_F32 || in[0].ndim != 3)
        return dt_fail(DT_ERR_ARG, "layer %d %s: expected one float (c, h, w) input, found %s",
                       nl->index, l->ops->kind, nin >= 1 ? dt_shape_str(&in[0], b, sizeof b) : "");
    nl->in   = (nn_shape){(int)in[0].d[0], (int)in[0].d[1], (int)in[0].d[2]};
    nl->prec = s->precision; // a 16-bit conv2d takes other kernels
    DT_TRY(dt_team_conv_setup(nl));
    nn_shape out = nl->out;
    size_t   aux = nl->aux_per_sample;
    if (nl->pool) {
        c->pool.in = nl->out;
        DT_TRY(dt_team_pool_setup(&c->pool));
        out = c->pool.out;
        aux = c->pool.aux_per_sample;
    }
    if (nn_shape_size(out) == 0)
        return dt_fail(DT_ERR_ARG, "layer %d %s: output would be empty", nl->index, l->ops->kind);
    s->out = (dt_shape){3, {out.c, out.h, out.w, 1}, DT_ELEM_F32};
    if (nl->nparams) {
        dt_layer_tensor *w = &s->params[0], *bias = &s->params[1];
        memset(s->params, 0, 2 * sizeof *w);
        snprintf(w->name, sizeof w->name, "weight");
        snprintf(bias->name, sizeof bias->name, "bias");
        w->ndim = nl->wndim;
        for (int i = 0; i < DT_PARAM_MAX_DIMS; i++)
            w->shape[i] = i < nl->wndim ? nl->wshape[i] : 1;
        bias->ndim     = 1;
        bias->shape[0] = nl->bcount;
        for (int i = 1; i < DT_PARAM_MAX_DIMS; i++)
            bias->shape[i] = 1;
        bias->flags    = DT_PARAM_NO_DECAY;
        s->nparams     = 2;
        s->lowp_params = 1u; // the weight's 16-bit shadow
    }
    s->saved_per_sample  = (aux + sizeof(float) - 1) / sizeof(float);
    s->scratch_fixed     = nl->scratch_floats;
    s->scratch_per_shard = nl->shard_scratch;
    s->flops_per_sample  = nl->flops;
    // Run by every thread at once on the whole batch (nn_impl.h's threading)
    s->run  = DT_LAYER_TEAM;
    s->grad = DT_LAYER_GRAD_PARTIAL; // per shard: the graph sums them
    return DT_OK;
}

// ------------------------------------------------------------------------------ fusion

dt_status dt_fused_from_conv(dt_layer **out, dt_layer *conv, const dt_nn_conv2d *p, bool pool) {
    *out         = NULL;
    fused_cfg *c = dt_alloc_zero(sizeof *c);
    if (!c)
        return DT_ERR_NOMEM;
    c->nl = (nn_layer){.out_c     = p->cout,
                       .k         = p->kh,
                       .stride    = p->sh,
                       .pad       = p->ph,
                       .index     = -1,
                       .fuse_relu = true};
    if (pool) {
        c->pool    = (nn_layer){.k = 2, .stride = 2, .index = -1};
        c->nl.pool = &c->pool;
    }
    dt_status st = dt_layer_new(out, &fused_ops[pool ? K_CONV_RELU_POOL : K_CONV_RELU], c, NULL);
    if (st == DT_OK)
        c->orig = conv; // it initialises the parameters, so the values are the Conv2d's
    return st;
}

// ------------------------------------------------------------------------- calling

// The configuration bound to this call's tensors and mode: a copy per call, so the
// threads of a team share nothing they write (the pool's too, for a fused pool).
static nn_layer bind(const dt_layer *l, const dt_layer_args *a, nn_layer *pool) {
    const fused_cfg *c  = cfg(l);
    nn_layer         nl = c->nl;
    if (nl.nparams) {
        nl.w   = a->w[0];
        nl.b   = a->w[1];
        nl.w16 = a->w16 ? (void *)(uintptr_t)a->w16[0] : NULL; // the graph's
    }
    nl.aux           = (uint8_t *)a->saved;
    nl.last_training = a->training;
    nl.lowp_failed   = false;
    if (nl.pool) {
        *pool     = c->pool;
        pool->aux = (uint8_t *)a->saved;
        nl.pool   = pool;
    }
    return nl;
}

// This thread's part (a DT_LAYER_TEAM call), or all of it on one thread.
static nn_ctx ctx_of(const dt_layer_args *a) {
    dt_layer_team        one = {.ith = 0, .nth = 1, .s0 = 0, .s1 = a->batch, .step = 1};
    const dt_layer_team *t   = a->team ? a->team : &one;
    return (nn_ctx){
        .ith      = t->ith,
        .nth      = t->nth,
        .s0       = t->s0,
        .s1       = t->s1,
        .sstep    = t->step,
        .shards   = t->shards,
        .batch    = a->batch,
        .training = a->training,
        .pool     = a->team ? a->pool : NULL,
        .scratch  = a->scratch,
        .rng      = a->rng,
        .keys     = a->keys,
    };
}

static dt_status lowp_status(const nn_layer *nl, const dt_layer *l) {
    if (nl->lowp_failed)
        return dt_fail(DT_ERR_NOMEM, "layer %s: no memory for a %s product", l->ops->kind,
                       dt_precision_name(nl->prec));
    return DT_OK;
}

static dt_status fused_forward(const dt_layer *l, const dt_layer_args *a) {
    nn_layer pool, nl = bind(l, a, &pool);
    nn_ctx   c = ctx_of(a);
    dt_team_conv_forward(&nl, &c, a->x[0], a->y);
    return lowp_status(&nl, l);
}

// The graph's gradient buffer dy is the team's to overwrite (a team layer's backward
// works on it in place: ReLU's mask, the wide layout of a convolution).
static dt_status fused_backward(const dt_layer *l, const dt_layer_args *a) {
    nn_layer pool, nl = bind(l, a, &pool);
    nn_ctx   c    = ctx_of(a);
    float   *dout = (float *)(uintptr_t)a->dy, *din = a->dx[0];
    // weight then bias: one span of the parameter buffers (graph.c registers them so)
    dt_team_conv_backward(&nl, &c, a->x[0], a->y, dout, din, nl.nparams ? a->dw[0] : NULL);
    return lowp_status(&nl, l);
}

// The Conv2d's own initialisation, from the node's stream (graph.h).
static void fused_init(const dt_layer *l, dt_rng *rng, float *const *w, float *const *buf) {
    const fused_cfg *c = cfg(l);
    if (c->orig && c->orig->ops->init)
        c->orig->ops->init(c->orig, rng, w, buf);
}

bool dt_fused_is(const dt_layer *l) {
    return l && l->ops >= fused_ops && l->ops < fused_ops + K_N;
}
const dt_layer *dt_fused_conv(const dt_layer *l) {
    return cfg(l)->orig;
}
bool dt_fused_pools(const dt_layer *l) {
    return cfg(l)->nl.pool != NULL;
}
