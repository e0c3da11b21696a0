// linear_tp.c: the column- and row-parallel Linear shards of layer.h (Megatron-LM's
// ColumnParallelLinear and RowParallelLinear). The products are dt_nn_linear_*_prec's on
// the shard, in the graph's precision (so --precision bf16 --tp N multiplies in bf16); the sums
// across shards go through the caller's reducer, so src/nn stays free of process groups (as
// SyncBatchNorm's statistics do).
#include "nn/layers/layers_impl.h"

#include <math.h>
#include <string.h>

typedef struct tp_cfg {
    int       in, out; // the unsplit layer's
    int       mode, parts, part, groups;
    bool      bias;
    dt_sum_fn reduce;
    void     *user;
} tp_cfg;

// Local sizes: column: in x out/parts; row: in/parts x out.
static int loc_in(const tp_cfg *p) {
    return p->mode == DT_TP_ROW ? p->in / p->parts : p->in;
}
static int loc_out(const tp_cfg *p) {
    return p->mode == DT_TP_COLUMN ? p->out / p->parts : p->out;
}

static dt_status tp_setup(const dt_layer *l, int nin, const dt_shape *in, dt_layer_setup *s) {
    const tp_cfg *p = l->config;
    DT_TRY(lay_expect("linear_tp", nin, in, 1, 1, DT_SHAPE_MAX_DIMS));
    char b[64];
    if (in[0].d[in[0].ndim - 1] != loc_in(p))
        return dt_fail(DT_ERR_ARG,
                       "linear_tp (%s shard %d of %d): expected %d input features, found %s",
                       p->mode == DT_TP_ROW ? "row" : "column", p->part, p->parts, loc_in(p),
                       dt_shape_str(&in[0], b, sizeof b));
    s->out                   = in[0];
    s->out.d[in[0].ndim - 1] = loc_out(p);
    lay_tensor(&s->params[0], "weight", 0, 2, loc_out(p), loc_in(p), 0, 0);
    s->nparams = 1;
    if (p->bias)
        lay_tensor(&s->params[s->nparams++], "bias", DT_PARAM_NO_DECAY, 1, loc_out(p), 0, 0, 0);
    // The parts of the unsplit tensors this shard holds (the row shard's bias is whole).
    if (p->parts > 1) {
        bool col           = p->mode == DT_TP_COLUMN;
        s->params[0].split = (dt_param_split){col ? 0 : 1, p->parts, p->part, col ? p->groups : 1};
        if (p->bias && col)
            s->params[1].split = (dt_param_split){0, p->parts, p->part, p->groups};
    }
    // A batch-wide part of the saved state keeps the layer whole on the calling thread
    // (graph.h): its sums are collectives, one per call.
    s->saved_fixed      = 1;
    s->flops_per_sample = 2.0 * (double)dt_shape_numel(&in[0]) * loc_out(p);
    s->lowp_params      = 1u; // the weight's 16-bit shadow (--precision bf16|fp16)
    return DT_OK;
}

// Draws the unsplit weight (out, in) and bias in dt_nn_linear_init's order and keeps
// this shard's elements.
static void tp_init(const dt_layer *l, dt_rng *rng, float *const *w, float *const *buf) {
    (void)buf;
    const tp_cfg *p     = l->config;
    float         bound = 1.0f / sqrtf((float)p->in);
    int           blk = p->out / p->groups, lo = blk / p->parts; // column: rows per block
    size_t        k = 0;
    for (int o = 0; o < p->out; o++)
        for (int i = 0; i < p->in; i++) {
            float v    = dt_rng_uniform_range(rng, -bound, bound);
            bool  keep = p->mode == DT_TP_ROW ? i / (p->in / p->parts) == p->part
                                              : (o % blk) / lo == p->part;
            if (keep)
                w[0][k++] = v;
        }
    if (!p->bias)
        return;
    for (int o = 0, j = 0; o < p->out; o++) {
        float v = dt_rng_uniform_range(rng, -bound, bound);
        if (p->mode == DT_TP_ROW || (o % blk) / lo == p->part)
            w[1][j++] = v;
    }
}

static int rows_of(const dt_layer_args *a, int last) {
    return (int)((size_t)a->batch * dt_shape_numel(&a->in[0]) / (size_t)last);
}

static dt_status tp_forward(const dt_layer *l, const dt_layer_args *a) {
    const tp_cfg *p = l->config;
    int           n = rows_of(a, loc_in(p));
    // The products in the graph's precision (prec.h: fp32, or 16-bit operands over the
    // weight's shadow), as the unsplit Linear takes them on its operand path
    const void *w16 = a->w16 ? a->w16[0] : NULL;
    if (p->mode == DT_TP_COLUMN)
        return dt_nn_linear_forward_prec(a->precision, w16, n, loc_in(p), loc_out(p), a->x[0],
                                         a->w[0], p->bias ? a->w[1] : NULL, a->y);
    // Row: the partial products, summed over the shards, then the (replicated) bias.
    DT_TRY(dt_nn_linear_forward_prec(a->precision, w16, n, loc_in(p), p->out, a->x[0], a->w[0],
                                     NULL, a->y));
    if (p->parts > 1)
        DT_TRY(p->reduce(p->user, a->y, (size_t)n * (size_t)p->out));
    if (p->bias)
        for (int r = 0; r < n; r++)
            for (int o = 0; o < p->out; o++)
                a->y[(size_t)r * p->out + o] += a->w[1][o];
    return DT_OK;
}

static dt_status tp_backward(const dt_layer *l, const dt_layer_args *a) {
    const tp_cfg *p = l->config;
    int           n = rows_of(a, loc_in(p));
    DT_TRY(dt_nn_linear_backward_prec(a->precision, a->w16 ? a->w16[0] : NULL, n, loc_in(p),
                                      loc_out(p), a->x[0], a->w[0], a->dy, a->dx[0], a->dw[0],
                                      p->bias ? a->dw[1] : NULL));
    // Column: every shard's dx is a partial sum of the whole input's gradient.
    if (p->mode == DT_TP_COLUMN && p->parts > 1 && a->dx[0])
        DT_TRY(p->reduce(p->user, a->dx[0], (size_t)n * (size_t)p->in));
    return DT_OK;
}

static const dt_layer_ops tp_ops = {"linear_tp", tp_setup, tp_init, tp_forward, tp_backward, NULL};

dt_linear_tp_opts dt_linear_tp_opts_default(void) {
    return (dt_linear_tp_opts){.bias = true, .groups = 1};
}

dt_status dt_layer_linear_tp_new(dt_layer **out, int in, int out_features, dt_tp_mode mode,
                                 int parts, int part, const dt_linear_tp_opts *opts) {
    dt_linear_tp_opts o = opts ? *opts : dt_linear_tp_opts_default();
    if (o.groups == 0)
        o.groups = 1;
    int split = mode == DT_TP_ROW ? in : out_features / (o.groups > 0 ? o.groups : 1);
    if (in < 1 || out_features < 1 || parts < 1 || part < 0 || part >= parts || o.groups < 1 ||
        (mode != DT_TP_COLUMN && mode != DT_TP_ROW) || (mode == DT_TP_ROW && o.groups != 1) ||
        out_features % o.groups != 0 || split % parts != 0)
        return dt_fail(DT_ERR_ARG,
                       "linear_tp: expected positive sizes, 0 <= part %d < parts %d, and the %s "
                       "features (%d, in %d groups) divisible by the parts; found in %d out %d",
                       part, parts, mode == DT_TP_ROW ? "input" : "output",
                       mode == DT_TP_ROW ? in : out_features, o.groups, in, out_features);
    if (parts > 1 && !o.reduce)
        return dt_fail(DT_ERR_ARG, "linear_tp: %d shards need a reducer (tp.h fills it in)", parts);
    tp_cfg p = {in,       out_features, (int)mode, parts,        part,
                o.groups, o.bias,       o.reduce,  o.reduce_user};
    return lay_new(out, &tp_ops, &p, sizeof p);
}

// --------------------------------------------------------- the vocabulary-parallel embedding

typedef struct etp_cfg {
    int       num, d, parts, part; // num: the unsplit vocabulary
    dt_sum_fn reduce;
    void     *user;
} etp_cfg;

static dt_status etp_setup(const dt_layer *l, int nin, const dt_shape *in, dt_layer_setup *s) {
    const etp_cfg *p = l->config;
    DT_TRY(lay_expect_tokens("embedding_tp", nin, in, p->d, &s->out));
    lay_tensor(&s->params[0], "weight", 0, 2, p->num / p->parts, p->d, 0, 0);
    if (p->parts > 1)
        s->params[0].split = (dt_param_split){0, p->parts, p->part, 1};
    s->nparams       = 1;
    s->no_input_grad = true;
    s->saved_fixed   = 1; // whole on the calling thread: its sum is a collective
    return DT_OK;
}

// The unsplit nn.Embedding's draws (dt_nn_embedding_init's order), this shard's rows kept.
static void etp_init(const dt_layer *l, dt_rng *rng, float *const *w, float *const *buf) {
    (void)buf;
    const etp_cfg *p  = l->config;
    size_t         lo = (size_t)p->part * (size_t)(p->num / p->parts) * (size_t)p->d;
    size_t         hi = lo + (size_t)(p->num / p->parts) * (size_t)p->d;
    for (size_t i = 0; i < (size_t)p->num * (size_t)p->d; i++) {
        float v = dt_rng_normal(rng);
        if (i >= lo && i < hi)
            w[0][i - lo] = v;
    }
}

static dt_status etp_forward(const dt_layer *l, const dt_layer_args *a) {
    const etp_cfg *p     = l->config;
    const int32_t *idx   = (const int32_t *)(const void *)a->x[0];
    size_t         count = (size_t)a->batch * dt_shape_numel(&a->in[0]), d = (size_t)p->d;
    int            per = p->num / p->parts, lo = p->part * per;
    for (size_t i = 0; i < count; i++) {
        if (idx[i] < 0 || idx[i] >= p->num)
            return dt_fail(DT_ERR_ARG, "embedding_tp: index %d at position %zu, expected 0 to %d",
                           (int)idx[i], i, p->num - 1);
        int r = idx[i] - lo;
        if (r >= 0 && r < per)
            memcpy(a->y + i * d, a->w[0] + (size_t)r * d, sizeof(float) * d);
        else
            memset(a->y + i * d, 0, sizeof(float) * d);
    }
    // One shard holds each row, the others add zeros: the sum is exactly the lookup.
    return p->parts > 1 ? p->reduce(p->user, a->y, count * d) : DT_OK;
}

static dt_status etp_backward(const dt_layer *l, const dt_layer_args *a) {
    const etp_cfg *p     = l->config;
    const int32_t *idx   = (const int32_t *)(const void *)a->x[0];
    size_t         count = (size_t)a->batch * dt_shape_numel(&a->in[0]), d = (size_t)p->d;
    int            per = p->num / p->parts, lo = p->part * per;
    for (size_t i = 0; i < count; i++) {
        int r = idx[i] - lo;
        if (r < 0 || r >= per)
            continue;
        float       *row = a->dw[0] + (size_t)r * d;
        const float *g   = a->dy + i * d;
        for (size_t j = 0; j < d; j++)
            row[j] += g[j];
    }
    return DT_OK;
}

static const dt_layer_ops etp_ops = {"embedding_tp", etp_setup,    etp_init,
                                     etp_forward,    etp_backward, NULL};

dt_status dt_layer_embedding_tp_new(dt_layer **out, int num, int d, int parts, int part,
                                    const dt_linear_tp_opts *opts) {
    dt_linear_tp_opts o = opts ? *opts : dt_linear_tp_opts_default();
    if (num < 1 || d < 1 || parts < 1 || part < 0 || part >= parts || num % parts != 0)
        return dt_fail(DT_ERR_ARG,
                       "embedding_tp: expected num >= 1 divisible by parts %d, d >= 1 and 0 <= "
                       "part < parts; found num %d, d %d, part %d",
                       parts, num, d, part);
    if (parts > 1 && !o.reduce)
        return dt_fail(DT_ERR_ARG, "embedding_tp: %d shards need a reducer (tp.h fills it in)",
                       parts);
    etp_cfg p = {num, d, parts, part, o.reduce, o.reduce_user};
    return lay_new(out, &etp_ops, &p, sizeof p);
}
