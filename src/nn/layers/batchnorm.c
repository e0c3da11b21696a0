// batchnorm.c: BatchNorm1d/2d (and its SyncBatchNorm hook), and the fused forms
// dt_graph_fuse (graph_pass.c) makes of a BatchNorm and what follows it in a ResNet:
// BatchNorm + ReLU, and BatchNorm + Add (a residual) + ReLU. A fused node saves the
// passes over memory of the nodes it replaces and their outputs (graph.h).
//
// The graph runs these layers whole on the calling thread (their statistics span the
// batch) and hands them its threads: the per-channel sums are shared out by channel, so
// every channel's sum is added in the same order whatever the thread count, and the
// element-wise passes by rows of the batch.
#include "nn/layers/layers_impl.h"

#include <stdio.h>
#include <string.h>

typedef struct bn_cfg {
    dt_nn_bn        p;
    int             dims; // 1 or 2
    dt_bn_reduce_fn reduce;
    void           *reduce_user;
    bool            relu;     // fused: max(0, .) of the result
    bool            residual; // fused: a second input added before the ReLU
} bn_cfg;

static const char *bn_kind(const bn_cfg *p) {
    static const char *const kinds[2][3] = {
        {"batchnorm1d", "batchnorm1d_relu", "batchnorm1d_add_relu"},
        {"batchnorm2d", "batchnorm2d_relu", "batchnorm2d_add_relu"}};
    return kinds[p->dims == 2][p->residual ? 2 : p->relu];
}

static dt_status bn_setup(const dt_layer *l, int nin, const dt_shape *in, dt_layer_setup *s) {
    const bn_cfg *p    = l->config;
    const char   *kind = bn_kind(p);
    int           want = p->residual ? 2 : 1;
    DT_TRY(lay_expect(kind, nin, in, want, p->dims == 1 ? 1 : 3, p->dims == 1 ? 2 : 3));
    char b[64], b2[64];
    if (in[0].d[0] != p->p.c)
        return dt_fail(DT_ERR_ARG, "%s: expected %d channels, found %s", kind, p->p.c,
                       dt_shape_str(&in[0], b, sizeof b));
    if (p->residual && dt_shape_numel(&in[1]) != dt_shape_numel(&in[0]))
        return dt_fail(DT_ERR_ARG, "%s: expected a residual of the input's shape %s, found %s",
                       kind, dt_shape_str(&in[0], b, sizeof b),
                       dt_shape_str(&in[1], b2, sizeof b2));
    s->out = in[0];
    if (p->p.affine) {
        lay_tensor(&s->params[0], "weight", DT_PARAM_NO_DECAY, 1, p->p.c, 0, 0, 0);
        lay_tensor(&s->params[1], "bias", DT_PARAM_NO_DECAY, 1, p->p.c, 0, 0, 0);
        s->nparams = 2;
    }
    lay_tensor(&s->buffers[0], "running_mean", 0, 1, p->p.c, 0, 0, 0);
    lay_tensor(&s->buffers[1], "running_var", 0, 1, p->p.c, 0, 0, 0);
    s->nbuffers      = 2;
    s->saved_fixed   = 2 * (size_t)p->p.c + 1; // mean, invstd, the (global) count
    s->batch_coupled = true;                   // a sample's output uses the batch's statistics
    s->scratch_fixed = 5 * (size_t)p->p.c + 1; // forward: 2c doubles, c + 1 floats
    return DT_OK;
}

static void bn_init(const dt_layer *l, dt_rng *rng, float *const *w, float *const *buf) {
    (void)rng;
    const bn_cfg *p = l->config;
    dt_nn_bn_init(&p->p, p->p.affine ? w[0] : NULL, p->p.affine ? w[1] : NULL, buf[0], buf[1]);
}

// One pass of a forward or backward, shared out over the graph's threads.
typedef enum bn_phase { STATS, APPLY, GRAD_STATS, GRAD_APPLY } bn_phase;

typedef struct bn_task {
    const bn_cfg        *p;
    const dt_layer_args *a;
    bn_phase             phase;
    int                  n, c, len;
    const float         *mean, *invstd, *gamma, *beta;
    float               *s1, *s2; // the per-channel sums of a backward
    double              *d1, *d2; // a forward's: sum and squared deviations (STATS)
    double               count;   // GRAD_APPLY: values per channel (0: evaluation)
} bn_task;

static void bn_run(void *arg, int i, int nth) {
    const bn_task       *t = arg;
    const dt_layer_args *a = t->a;
    int                  n = t->n, c = t->c, len = t->len;
    int                  c0 = (int)((int64_t)c * i / nth), c1 = (int)((int64_t)c * (i + 1) / nth);
    int                  rows = n * c;
    int          r0 = (int)((int64_t)rows * i / nth), r1 = (int)((int64_t)rows * (i + 1) / nth);
    const float *res = t->p->residual ? a->x[1] : NULL;
    // backward behind the ReLU: the mask from x again (the forward's affine; x is read
    // anyway), or with a residual from the forward's output
    dt_nn_bn_relu        mask = {t->p->residual ? a->y : NULL, t->gamma, t->beta};
    const dt_nn_bn_relu *relu = t->p->relu ? &mask : NULL;
    switch (t->phase) {
    case STATS:
        dt_nn_bn_stats_range(n, c, c0, c1, len, a->x[0], t->d1 + c0, t->d2 + c0);
        break;
    case APPLY:
        dt_nn_bn_apply_rows(n, c, len, r0, r1, a->x[0], t->mean, t->invstd, t->gamma, t->beta, res,
                            t->p->relu, a->y);
        break;
    case GRAD_STATS:
        dt_nn_bn_backward_stats_ex(n, c, c0, c1, len, a->x[0], a->dy, relu, t->mean, t->invstd,
                                   t->s1, t->s2, t->p->residual ? a->dx[1] : NULL);
        break;
    case GRAD_APPLY:
        dt_nn_bn_backward_apply_rows(n, c, len, r0, r1, a->x[0], a->dy, relu, t->mean, t->invstd,
                                     t->gamma, t->s1, t->s2, t->count, a->dx[0]);
        break;
    }
}

static void bn_pass(bn_task *t, bn_phase phase) {
    t->phase = phase;
    dt_layer_parallel(t->a, bn_run, t);
}

static int bn_l(const bn_cfg *p, const dt_layer_args *a) {
    return (int)(dt_shape_numel(&a->in[0]) / (size_t)p->p.c);
}

static dt_status bn_forward(const dt_layer *l, const dt_layer_args *a) {
    const bn_cfg *p    = l->config;
    int           c    = p->p.c;
    float        *mean = a->saved, *invstd = a->saved + c;
    bn_task       t     = {.p      = p,
                           .a      = a,
                           .n      = a->batch,
                           .c      = c,
                           .len    = bn_l(p, a),
                           .mean   = mean,
                           .invstd = invstd,
                           .gamma  = p->p.affine ? a->w[0] : NULL,
                           .beta   = p->p.affine ? a->w[1] : NULL};
    double        count = (double)t.n * t.len;
    // scratch: the sums in double (2c), then c + 1 floats for the group's
    DT_ASSERT(((uintptr_t)a->scratch & 7) == 0); // the graph's scratch is aligned
    double *sum = (double *)(void *)a->scratch, *m2 = sum + c;
    float  *v = (float *)(void *)(m2 + c);
    t.d1 = sum, t.d2 = m2;
    if (a->training && p->reduce) {
        // SyncBatchNorm in two all-reduces: the sums and counts give the group's mean;
        // then each process's squared deviations from that mean,
        //     m2_r + n_r (mean_r - mean)^2,
        // all non-negative, so their float sum keeps the variance to rounding (one
        // all-reduce of sum and sum of squares would cancel as dt_nn_bn_stats says)
        bn_pass(&t, STATS);
        for (int ch = 0; ch < c; ch++)
            v[ch] = (float)sum[ch];
        v[c] = (float)count;
        DT_TRY(p->reduce(p->reduce_user, v, (size_t)c + 1));
        double total = (double)v[c];
        if (total < 2)
            return dt_fail(DT_ERR_ARG,
                           "syncbatchnorm: expected more than 1 value per channel "
                           "over the group, found %g",
                           total);
        for (int ch = 0; ch < c; ch++) {
            double mean_g = (double)v[ch] / total, d = count > 0 ? sum[ch] / count - mean_g : 0;
            sum[ch] = (double)v[ch];
            v[ch]   = (float)(m2[ch] + count * d * d);
        }
        DT_TRY(p->reduce(p->reduce_user, v, (size_t)c));
        for (int ch = 0; ch < c; ch++)
            m2[ch] = (double)v[ch];
        count = total;
        dt_nn_bn_moments(&p->p, count, sum, m2, mean, invstd, a->buf[0], a->buf[1]);
    } else if (a->training) {
        if (count < 2)
            return dt_fail(DT_ERR_ARG,
                           "batchnorm: expected more than 1 value per channel in "
                           "training, found %g",
                           count);
        bn_pass(&t, STATS);
        dt_nn_bn_moments(&p->p, count, sum, m2, mean, invstd, a->buf[0], a->buf[1]);
    } else {
        dt_nn_bn_eval_moments(&p->p, a->buf[0], a->buf[1], mean, invstd);
    }
    bn_pass(&t, APPLY);
    a->saved[2 * c] = (float)count;
    return DT_OK;
}

static dt_status bn_backward(const dt_layer *l, const dt_layer_args *a) {
    const bn_cfg *p = l->config;
    int           c = p->p.c;
    bn_task       t = {.p      = p,
                       .a      = a,
                       .n      = a->batch,
                       .c      = c,
                       .len    = bn_l(p, a),
                       .mean   = a->saved,
                       .invstd = a->saved + c,
                       .gamma  = p->p.affine ? a->w[0] : NULL,
                       .beta   = p->p.affine ? a->w[1] : NULL,
                       .s1     = a->scratch,
                       .s2     = a->scratch + c};
    bn_pass(&t, GRAD_STATS); // sum of dy and of dy * xhat (and the residual's gradient)
    // The parameter gradients are local sums (under SyncBatchNorm too: DDP averages
    // them); dx needs the sums over the group.
    if (p->p.affine)
        for (int ch = 0; ch < c; ch++) {
            a->dw[0][ch] += t.s2[ch];
            a->dw[1][ch] += t.s1[ch];
        }
    if (!a->dx[0])
        return DT_OK;
    t.count = a->training ? (double)t.n * t.len : 0.0;
    if (a->training && p->reduce) {
        DT_TRY(p->reduce(p->reduce_user, a->scratch, 2 * (size_t)c));
        t.count = (double)a->saved[2 * c];
    }
    bn_pass(&t, GRAD_APPLY);
    return DT_OK;
}

static const dt_layer_ops bn_ops[2][3] = {
    {{"batchnorm1d", bn_setup, bn_init, bn_forward, bn_backward, NULL},
     {"batchnorm1d_relu", bn_setup, bn_init, bn_forward, bn_backward, NULL},
     {"batchnorm1d_add_relu", bn_setup, bn_init, bn_forward, bn_backward, NULL}},
    {{"batchnorm2d", bn_setup, bn_init, bn_forward, bn_backward, NULL},
     {"batchnorm2d_relu", bn_setup, bn_init, bn_forward, bn_backward, NULL},
     {"batchnorm2d_add_relu", bn_setup, bn_init, bn_forward, bn_backward, NULL}}};

dt_batchnorm_opts dt_batchnorm_opts_default(void) {
    return (dt_batchnorm_opts){.eps = 1e-5f, .momentum = 0.1f, .affine = true};
}

static dt_status bn_make(dt_layer **out, const bn_cfg *p) {
    return lay_new(out, &bn_ops[p->dims == 2][p->residual ? 2 : p->relu], p, sizeof *p);
}

static dt_status bn_new(dt_layer **out, int c, int dims, const dt_batchnorm_opts *opts) {
    dt_batchnorm_opts o = opts ? *opts : dt_batchnorm_opts_default();
    if (c < 1 || !(o.eps > 0.0f) || !(o.momentum >= 0.0f && o.momentum <= 1.0f))
        return dt_fail(DT_ERR_ARG,
                       "batchnorm: expected c >= 1, eps > 0 and momentum in [0, 1], "
                       "found %d, %g, %g",
                       c, (double)o.eps, (double)o.momentum);
    bn_cfg p = {{c, o.eps, o.momentum, o.affine}, dims, o.reduce, o.reduce_user, false, false};
    return bn_make(out, &p);
}

dt_status dt_layer_batchnorm1d_new(dt_layer **out, int c, const dt_batchnorm_opts *opts) {
    return bn_new(out, c, 1, opts);
}
dt_status dt_layer_batchnorm2d_new(dt_layer **out, int c, const dt_batchnorm_opts *opts) {
    return bn_new(out, c, 2, opts);
}

bool lay_is_batchnorm(const dt_layer *l) {
    return l && (l->ops == &bn_ops[0][0] || l->ops == &bn_ops[1][0]);
}

dt_status lay_bn_fused_new(dt_layer **out, const dt_layer *bn, bool residual) {
    if (!lay_is_batchnorm(bn))
        return dt_fail(DT_ERR_ARG, "batchnorm fusion: expected a BatchNorm layer");
    bn_cfg p   = *(const bn_cfg *)bn->config;
    p.relu     = true;
    p.residual = residual;
    return bn_make(out, &p);
}

bool lay_describe_bn(const dt_layer *l, dt_node_desc *d) {
    bool ours = false;
    for (int i = 0; i < 6; i++)
        ours |= l->ops == &bn_ops[i / 3][i % 3];
    if (!ours)
        return false;
    const bn_cfg *p = l->config;
    snprintf(d->kind, sizeof d->kind, "batchnorm");
    d->h.bn.eps = p->p.eps, d->h.bn.momentum = p->p.momentum, d->h.bn.affine = p->p.affine;
    d->h.bn.relu = p->relu, d->h.bn.residual = p->residual, d->h.bn.sync = p->reduce != NULL;
    return true;
}
