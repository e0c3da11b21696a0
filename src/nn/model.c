// model.c: the Sequential model, a builder of the model graph. dt_model_new makes a
// dt_graph with one input ("x", the per-sample (c, h, w)); each dt_model_add_* adds the
// built-in layer of that kind (layer.h) as node "<index>" reading the node before it, so
// its tensors are PyTorch's nn.Sequential keys ("0.weight") and layer l draws its
// dropout masks from the streams of node l. Finalize runs the graph's passes, which
// fuse conv2d + relu (+ maxpool2d) and run ReLU, dropout and flatten in place, then
// draws the parameters from the Sequential model's own streams (init_sequential); the
// graph runs everything else: threads, gradient shards, precision. What stays here is
// the list of layers as added, for the questions asked by layer index (kind, shapes,
// FLOPs, profile), and the API's own messages.
#include "nn/graph/graph_impl.h"
#include "nn/nn_impl.h"

#include <math.h>

#include <stdio.h>
#include <string.h>

#define MAX_LAYERS 64

typedef struct mlayer {
    const char *kind;
    nn_shape    in, out;
    size_t      nparams;
    double      flops;
    int         node; // after finalize: the graph node doing its work, or -1 (fused away)
} mlayer;

struct dt_model {
    dt_graph        *g;
    nn_shape         input;
    mlayer           layers[MAX_LAYERS];
    int              nlayers;
    bool             finalized, failed;
    bool             want_input_grad;
    dt_grad_ready_fn hook;
    void            *hook_user;
};

// ------------------------------------------------------------------------ building

dt_status dt_model_new(dt_model **out, int c, int h, int w) {
    *out = NULL;
    if (c < 1 || h < 1 || w < 1)
        return dt_fail(DT_ERR_ARG,
                       "model: expected a positive input shape (c, h, w), found (%d, %d, %d)", c, h,
                       w);
    dt_model *m = dt_alloc_zero(sizeof *m);
    if (!m)
        return DT_ERR_NOMEM;
    m->input     = (nn_shape){c, h, w};
    dt_status st = dt_graph_new(&m->g, NULL);
    if (st == DT_OK)
        st = dt_graph_input(m->g, "x", &(dt_shape){3, {c, h, w, 1}, DT_ELEM_F32});
    if (st != DT_OK) {
        dt_model_free(m);
        return st;
    }
    m->g->merge_ready = true; // one gradient-ready call per layer (nn.h)
    *out              = m;
    return DT_OK;
}

// The per-sample shape of the last layer's output (the input's before any layer).
static nn_shape last_shape(const dt_model *m) {
    return m->nlayers ? m->layers[m->nlayers - 1].out : m->input;
}

static dt_status check_adding(const dt_model *m, const char *kind) {
    if (!m)
        return dt_fail(DT_ERR_ARG, "model: NULL model");
    if (m->finalized)
        return dt_fail(DT_ERR_STATE, "model: cannot add a %s layer after dt_model_finalize", kind);
    if (m->nlayers == MAX_LAYERS)
        return dt_fail(DT_ERR_ARG, "model: at most %d layers", MAX_LAYERS);
    return DT_OK;
}

// Adds built-in layer l (taking it) as node "<index>" reading the node before it.
static dt_status add_layer(dt_model *m, const char *kind, dt_layer *l) {
    char name[16], prev[16];
    int  index = m->nlayers;
    snprintf(name, sizeof name, "%d", index);
    snprintf(prev, sizeof prev, "%d", index - 1);
    dt_status st = dt_graph_add(m->g, name, l, index ? prev : "x");
    if (st != DT_OK)
        return dt_fail_context("layer %d %s", index, kind);
    const gval *v                           = &m->g->vals[m->g->nvals - 1];
    m->g->vals[m->g->nvals - 1].param_layer = index; // dt_param_info.layer
    size_t np                               = 0;
    for (int k = 0; k < v->su.nparams; k++) {
        size_t c = 1;
        for (int d = 0; d < v->su.params[k].ndim; d++)
            c *= (size_t)v->su.params[k].shape[d];
        np += c;
    }
    nn_shape out          = {(int)v->shape.d[0], v->shape.ndim > 1 ? (int)v->shape.d[1] : 1,
                    v->shape.ndim > 2 ? (int)v->shape.d[2] : 1};
    nn_shape in           = last_shape(m);
    m->layers[m->nlayers] = (mlayer){kind, in, out, np, v->su.flops_per_sample, -1};
    m->nlayers++;
    return DT_OK;
}

dt_status dt_model_add_conv2d(dt_model *m, int out_channels, int kernel, int stride, int padding) {
    DT_TRY(check_adding(m, "conv2d"));
    if (stride < 1 || kernel < 1 || padding < 0 || out_channels < 1)
        return dt_fail(DT_ERR_ARG,
                       "layer %d conv2d: expected out_channels, kernel, stride >= 1 and padding "
                       ">= 0, found %d, %d, %d, %d",
                       m->nlayers, out_channels, kernel, stride, padding);
    dt_conv2d_opts o = dt_conv2d_opts_default();
    o.sh = o.sw = stride;
    o.ph = o.pw = padding;
    dt_layer *l = NULL;
    DT_TRY(dt_layer_conv2d_new(&l, last_shape(m).c, out_channels, kernel, kernel, &o));
    return add_layer(m, "conv2d", l);
}
dt_status dt_model_add_linear(dt_model *m, int out_features) {
    DT_TRY(check_adding(m, "linear"));
    nn_shape in = last_shape(m);
    if (in.h != 1 || in.w != 1)
        return dt_fail(DT_ERR_ARG,
                       "layer %d linear: expected a flat input (features, 1, 1), found (%d, %d, "
                       "%d); add a flatten layer first",
                       m->nlayers, in.c, in.h, in.w);
    if (out_features < 1)
        return dt_fail(DT_ERR_ARG, "layer %d linear: expected out_features >= 1, found %d",
                       m->nlayers, out_features);
    dt_layer *l = NULL;
    DT_TRY(dt_layer_linear_new(&l, in.c, out_features, NULL));
    return add_layer(m, "linear", l);
}
dt_status dt_model_add_maxpool2d(dt_model *m, int kernel, int stride) {
    DT_TRY(check_adding(m, "maxpool2d"));
    dt_pool2d_opts o = dt_pool2d_opts_default();
    o.sh = o.sw = stride; // 0: the kernel
    dt_layer *l = NULL;
    DT_TRY(dt_layer_maxpool2d_new(&l, kernel, kernel, &o));
    return add_layer(m, "maxpool2d", l);
}
dt_status dt_model_add_relu(dt_model *m) {
    DT_TRY(check_adding(m, "relu"));
    dt_layer *l = NULL;
    DT_TRY(dt_layer_act_new(&l, DT_ACT_RELU, NULL));
    return add_layer(m, "relu", l);
}
dt_status dt_model_add_dropout(dt_model *m, float p) {
    DT_TRY(check_adding(m, "dropout"));
    dt_layer *l = NULL;
    DT_TRY(dt_layer_dropout_new(&l, p, NULL));
    return add_layer(m, "dropout", l);
}
dt_status dt_model_add_dropout2d(dt_model *m, float p) {
    DT_TRY(check_adding(m, "dropout2d"));
    dt_layer *l = NULL;
    DT_TRY(dt_layer_dropout2d_new(&l, p, NULL));
    return add_layer(m, "dropout2d", l);
}
dt_status dt_model_add_flatten(dt_model *m) {
    DT_TRY(check_adding(m, "flatten"));
    dt_layer *l = NULL;
    DT_TRY(dt_layer_flatten_new(&l, NULL));
    return add_layer(m, "flatten", l);
}
dt_status dt_model_add_log_softmax(dt_model *m) {
    DT_TRY(check_adding(m, "log_softmax"));
    nn_shape in = last_shape(m);
    if (in.h != 1 || in.w != 1)
        return dt_fail(DT_ERR_ARG,
                       "layer %d log_softmax: expected a flat input (features, 1, 1), found "
                       "(%d, %d, %d)",
                       m->nlayers, in.c, in.h, in.w);
    dt_layer *l = NULL;
    DT_TRY(dt_layer_log_softmax_new(&l, NULL));
    return add_layer(m, "log_softmax", l);
}

// PyTorch's reset_parameters from the Sequential model's own streams: layer l's weight
// from split(root, 2 l) and its bias from split(root, 2 l + 1), each U(-1/sqrt(fan_in),
// +) (kaiming_uniform_(a = sqrt(5)) gives that bound for the weight), fan_in the weight's
// elements per output. Models saved by earlier versions start from these values.
static void init_sequential(dt_model *m, uint64_t seed) {
    dt_rng     root = dt_rng_init(seed);
    dt_params *p    = m->g->params;
    for (int l = 0; l < m->nlayers; l++) {
        char name[32];
        snprintf(name, sizeof name, "%d.weight", l);
        int wi = dt_params_find(p, name);
        snprintf(name, sizeof name, "%d.bias", l);
        int bi = dt_params_find(p, name);
        if (wi < 0)
            continue;
        const dt_param_info *w     = dt_params_info(p, wi);
        float                bound = 1.0f / sqrtf((float)(w->count / (size_t)w->shape[0]));
        dt_rng               rw    = dt_rng_split(&root, 2 * (uint64_t)l),
               rb                  = dt_rng_split(&root, 2 * (uint64_t)l + 1);
        for (size_t j = 0; j < w->count; j++)
            dt_params_data(p)[w->offset + j] = dt_rng_uniform_range(&rw, -bound, bound);
        if (bi < 0)
            continue;
        const dt_param_info *b = dt_params_info(p, bi);
        for (size_t j = 0; j < b->count; j++)
            dt_params_data(p)[b->offset + j] = dt_rng_uniform_range(&rb, -bound, bound);
    }
}

dt_status dt_model_finalize(dt_model *m, uint64_t seed) {
    if (!m)
        return dt_fail(DT_ERR_ARG, "model: NULL model");
    if (m->finalized)
        return dt_fail(DT_ERR_STATE, "model: dt_model_finalize called twice");
    if (m->nlayers == 0)
        return dt_fail(DT_ERR_ARG, "model: expected at least one layer, found none");
    if (m->failed)
        return dt_fail(DT_ERR_STATE, "model: a failed dt_model_finalize cannot be retried");
    m->failed = true;
    DT_TRY(dt_graph_finalize(m->g, seed));
    init_sequential(m, seed);
    // Each layer's node: the one whose tensors carry its index (a fused conv2d keeps the
    // convolution's index and takes the pool's name).
    for (int i = 0; i < m->g->nvals; i++) {
        const gval *v = &m->g->vals[i];
        int         l = -1;
        if (v->layer && sscanf(dt_graph_tensor_node(v), "%d", &l) == 1 && l >= 0 && l < m->nlayers)
            m->layers[l].node = i;
    }
    if (m->hook)
        DT_TRY(dt_params_add_grad_hook(dt_graph_params(m->g), m->hook, m->hook_user));
    m->failed    = false;
    m->finalized = true;
    return DT_OK;
}

void dt_model_free(dt_model *m) {
    if (!m)
        return;
    dt_graph_free(m->g);
    dt_free(m);
}

// ---------------------------------------------------------------------- inspecting

static dt_params *params(const dt_model *m) {
    return m->finalized ? m->g->params : NULL;
}

size_t dt_model_num_params(const dt_model *m) {
    return params(m) ? dt_params_numel(params(m)) : 0;
}
int dt_model_num_param_tensors(const dt_model *m) {
    return params(m) ? dt_params_count(params(m)) : 0;
}
const dt_param_info *dt_model_param_info(const dt_model *m, int i) {
    return params(m) ? dt_params_info(params(m), i) : NULL;
}
dt_params *dt_model_as_params(dt_model *m) {
    return params(m);
}
int dt_model_layer_node(const dt_model *m, int layer) {
    return m && m->finalized && layer >= 0 && layer < m->nlayers ? m->layers[layer].node : -1;
}

dt_graph *dt_model_graph(dt_model *m) {
    return m && m->finalized ? m->g : NULL;
}
float *dt_model_params(dt_model *m) {
    return params(m) ? dt_params_data(params(m)) : NULL;
}
float *dt_model_grads(dt_model *m) {
    return params(m) ? dt_params_grads(params(m)) : NULL;
}
int dt_model_num_layers(const dt_model *m) {
    return m->nlayers;
}
const char *dt_model_layer_kind(const dt_model *m, int layer) {
    return layer >= 0 && layer < m->nlayers ? m->layers[layer].kind : NULL;
}
size_t dt_model_output_size(const dt_model *m) {
    return nn_shape_size(m->nlayers ? m->layers[m->nlayers - 1].out : m->input);
}
size_t dt_model_input_size(const dt_model *m) {
    return nn_shape_size(m->input);
}
void dt_model_input_shape(const dt_model *m, int *c, int *h, int *w) {
    if (c)
        *c = m->input.c;
    if (h)
        *h = m->input.h;
    if (w)
        *w = m->input.w;
}

double dt_model_flops_per_sample(const dt_model *m) {
    double f = 0;
    for (int i = 0; i < m->nlayers; i++)
        f += m->layers[i].flops;
    return f;
}

double dt_model_train_flops_per_sample(const dt_model *m) {
    double f = 0;
    for (int i = 0; i < m->nlayers; i++)
        f += (i == 0 && !m->want_input_grad ? 2.0 : 3.0) * m->layers[i].flops;
    return f;
}

void dt_model_describe(const dt_model *m, char *buf, size_t n) {
    size_t off = 0;
    buf[0]     = '\0';
    for (int i = 0; i < m->nlayers && off < n; i++) {
        const mlayer *l = &m->layers[i];
        int           w =
            snprintf(buf + off, n - off, "%2d %-12s (%d, %d, %d) -> (%d, %d, %d) %zu params\n", i,
                     l->kind, l->in.c, l->in.h, l->in.w, l->out.c, l->out.h, l->out.w, l->nparams);
        if (w < 0)
            break;
        off += (size_t)w;
    }
}

// ------------------------------------------------------------------------- running

dt_status dt_model_set_threads(dt_model *m, int threads) {
    if (threads < 1 || threads > 256)
        return dt_fail(DT_ERR_ARG, "model: expected 1 to 256 threads, found %d", threads);
    return dt_graph_set_threads(m->g, threads);
}

dt_status dt_model_set_grad_shards(dt_model *m, int shards) {
    if (shards < 0 || shards > NN_MAX_SHARDS)
        return dt_fail(DT_ERR_ARG, "model: expected 0 gradient shards (off) or 1 to %d, found %d",
                       NN_MAX_SHARDS, shards);
    return dt_graph_set_grad_shards(m->g, shards);
}

int dt_model_grad_shards(const dt_model *m) {
    return dt_graph_grad_shards(m->g);
}

dt_status dt_model_set_precision(dt_model *m, dt_precision p) {
    if (!m || !m->finalized || (p != DT_PREC_FP32 && p != DT_PREC_BF16 && p != DT_PREC_FP16))
        return dt_fail(DT_ERR_ARG,
                       "model: dt_model_set_precision expects a finalized model and fp32, bf16 "
                       "or fp16, found %s and mode %d",
                       m && m->finalized ? "a finalized model" : "none", (int)p);
    return dt_graph_set_precision(m->g, p);
}

dt_precision dt_model_precision(const dt_model *m) {
    return m ? dt_graph_precision(m->g) : DT_PREC_FP32;
}

void dt_model_train(dt_model *m, bool training) {
    dt_graph_train(m->g, training);
}
void dt_model_set_rng(dt_model *m, const dt_rng *rng) {
    dt_graph_set_rng(m->g, rng);
}
dt_status dt_model_set_sample_keys(dt_model *m, const uint64_t *keys, int n) {
    if (n < 0 || (n > 0 && !keys))
        return dt_fail(DT_ERR_ARG,
                       "model sample keys: expected n >= 0 keys (and an array when n > 0), "
                       "found n = %d and %s",
                       n, keys ? "an array" : "NULL");
    return dt_graph_set_sample_keys(m->g, keys, n);
}
void dt_model_set_input_grad(dt_model *m, bool on) {
    m->want_input_grad = on;
    dt_graph_set_input_grad(m->g, on);
}
const float *dt_model_input_grad(const dt_model *m) {
    return dt_graph_input_grad(m->g, 0);
}
void dt_model_set_grad_hook(dt_model *m, dt_grad_ready_fn fn, void *user) {
    if (m->finalized && m->hook)
        dt_params_remove_grad_hook(params(m), m->hook, m->hook_user);
    m->hook      = fn;
    m->hook_user = user;
    if (m->finalized && fn && dt_params_add_grad_hook(params(m), fn, user) != DT_OK) {
        DT_WARN("nn", "model: gradient hook not set: %s", dt_last_error());
        dt_clear_error();
        m->hook = NULL;
    }
}
void dt_model_set_profile(dt_model *m, bool on) {
    dt_graph_set_profile(m->g, on);
}
void dt_model_profile(const dt_model *m, int layer, double *fwd_s, double *bwd_s) {
    *fwd_s = *bwd_s = 0;
    dt_graph_profile p;
    if (layer >= 0 && layer < m->nlayers && m->layers[layer].node >= 0 &&
        dt_graph_node_profile(m->g, m->layers[layer].node, &p) == DT_OK) {
        *fwd_s = p.fwd_s;
        *bwd_s = p.bwd_s;
    }
}

void dt_model_zero_grad(dt_model *m) {
    if (params(m))
        dt_params_zero_grad(params(m));
}

dt_status dt_model_reserve(dt_model *m, int batch) {
    if (!m->finalized)
        return dt_fail(DT_ERR_STATE, "model: call dt_model_finalize before running it");
    if (batch < 1)
        return dt_fail(DT_ERR_ARG, "model: expected a batch of at least 1 sample, found %d", batch);
    return dt_graph_reserve(m->g, batch);
}

dt_status dt_model_forward(dt_model *m, const float *x, int batch) {
    DT_TRY(dt_model_reserve(m, batch));
    if (m->g->training && m->g->keys && m->g->nkeys != batch)
        return dt_fail(DT_ERR_ARG,
                       "model forward: expected a batch of %d samples, as many as the sample "
                       "keys set (dt_model_set_sample_keys), found %d",
                       m->g->nkeys, batch);
    return dt_graph_forward(m->g, (const void *[]){x}, batch);
}

const float *dt_model_output(const dt_model *m) {
    return dt_graph_output(m->g);
}

dt_status dt_model_backward(dt_model *m, const float *dout) {
    if (!m->finalized || m->g->batch == 0)
        return dt_fail(DT_ERR_STATE, "model: backward needs a forward first");
    return dt_graph_backward(m->g, dout);
}
