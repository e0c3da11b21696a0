// model.c: the Sequential model: building, flat parameter and gradient buffers,
// PyTorch's default initialisation, and forward/backward over the threads of a pool.
#include "dtrain/trace.h"
#include "nn/blas.h"
#include "nn/nn_impl.h"
#include "nn/prec.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_LAYERS 64

struct dt_model {
    nn_shape input;
    nn_layer layers[MAX_LAYERS];
    int      nlayers;
    bool     finalized;
    // flat buffers
    float     *params, *grads; // dt_params_data / dt_params_grads of pv
    size_t     nparams;
    dt_params *pv; // the parameter contract this model provides (params.h)
    // threads
    dt_pool *pool;
    int      nthreads;
    float  **partial; // [thread] gradient buffers of threads 1.. (thread 0 adds into grads)
    float  **scratch; // [thread] scratch, max over layers
    size_t   scratch_floats;
    // gradient shards (dt_model_set_grad_shards): 0 off, else S buffers of nparams
    int    shards;
    float *shard_buf;
    // activations: act[i] is layer i's input, act[nlayers] the output; in-place layers
    // share their input's buffer. Owned buffers are listed in act_own.
    int              capacity; // batch the buffers are sized for
    float           *act_own[MAX_LAYERS + 1];
    float           *act[MAX_LAYERS + 1]; // act[0] unused: the input is `x`
    const float     *x;
    float           *gbuf[2]; // gradient ping-pong, each capacity * max layer size
    float           *dx;      // input gradient when requested
    int              batch;   // of the last forward
    bool             training;
    bool             want_input_grad;
    bool             profile;
    dt_rng           rng;
    uint64_t        *keys; // per-sample dropout keys (dt_model_set_sample_keys), or NULL
    int              nkeys, keys_cap;
    dt_grad_ready_fn hook;
    void            *hook_user;
    dt_precision     prec; // dt_model_set_precision
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
    m->input    = (nn_shape){c, h, w};
    m->nthreads = 1;
    m->training = true;
    m->rng      = dt_rng_init(0);
    *out        = m;
    return DT_OK;
}

static nn_shape current_shape(const dt_model *m) {
    return m->nlayers ? m->layers[m->nlayers - 1].out : m->input;
}

static dt_status add_layer(dt_model *m, const nn_layer_ops *ops, nn_layer proto) {
    if (!m)
        return dt_fail(DT_ERR_ARG, "model: NULL model");
    if (m->finalized)
        return dt_fail(DT_ERR_STATE, "model: cannot add a %s layer after dt_model_finalize",
                       ops->kind);
    if (m->nlayers == MAX_LAYERS)
        return dt_fail(DT_ERR_ARG, "model: at most %d layers", MAX_LAYERS);
    nn_layer *l = &m->layers[m->nlayers];
    *l          = proto;
    l->ops      = ops;
    l->index    = m->nlayers;
    l->in       = current_shape(m);
    DT_TRY(ops->setup(l));
    if (nn_shape_size(l->out) == 0)
        return dt_fail(DT_ERR_ARG, "layer %d %s: output would be empty", l->index, ops->kind);
    m->nlayers++;
    return DT_OK;
}

dt_status dt_model_add_conv2d(dt_model *m, int out_channels, int kernel, int stride, int padding) {
    return add_layer(
        m, &dt_nn_conv2d_ops,
        (nn_layer){.out_c = out_channels, .k = kernel, .stride = stride, .pad = padding});
}
dt_status dt_model_add_linear(dt_model *m, int out_features) {
    return add_layer(m, &dt_nn_linear_ops, (nn_layer){.out_c = out_features});
}
dt_status dt_model_add_maxpool2d(dt_model *m, int kernel, int stride) {
    return add_layer(m, &dt_nn_maxpool2d_ops, (nn_layer){.k = kernel, .stride = stride});
}
dt_status dt_model_add_relu(dt_model *m) {
    return add_layer(m, &dt_nn_relu_ops, (nn_layer){0});
}
dt_status dt_model_add_dropout(dt_model *m, float p) {
    return add_layer(m, &dt_nn_dropout_ops, (nn_layer){.p = p});
}
dt_status dt_model_add_dropout2d(dt_model *m, float p) {
    return add_layer(m, &dt_nn_dropout2d_ops, (nn_layer){.p = p});
}
dt_status dt_model_add_flatten(dt_model *m) {
    return add_layer(m, &dt_nn_flatten_ops, (nn_layer){0});
}
dt_status dt_model_add_log_softmax(dt_model *m) {
    return add_layer(m, &dt_nn_log_softmax_ops, (nn_layer){0});
}

// Declares one tensor of the contract; its offset follows from the order.
static dt_status add_pinfo(dt_model *m, int layer, const char *what, int ndim, const int64_t *shape,
                           uint32_t flags) {
    char name[DT_PARAM_NAME_MAX + 1];
    snprintf(name, sizeof name, "%d.%s", layer, what);
    return dt_params_add_ex(m->pv, name, ndim, shape, flags, layer, false);
}

// Per-thread scratch: the largest of the layers' needs, with gradient shards included.
static size_t scratch_need(const dt_model *m) {
    size_t n = 0;
    for (int i = 0; i < m->nlayers; i++) {
        const nn_layer *l = &m->layers[i];
        size_t          f = l->scratch_floats;
        if (m->shards && l->shard_scratch * (size_t)m->shards > f)
            f = l->shard_scratch * (size_t)m->shards;
        if (f > n)
            n = f;
    }
    return n;
}

// Scratch and per-thread gradient buffers for `n` threads.
static dt_status alloc_thread_buffers(dt_model *m, int n) {
    m->partial = dt_alloc_zero(sizeof(float *) * (size_t)n);
    m->scratch = dt_alloc_zero(sizeof(float *) * (size_t)n);
    if (!m->partial || !m->scratch)
        return DT_ERR_NOMEM;
    for (int t = 0; t < n; t++) {
        m->scratch[t] = dt_alloc(sizeof(float) * (m->scratch_floats ? m->scratch_floats : 1));
        if (!m->scratch[t])
            return DT_ERR_NOMEM;
        if (t > 0) {
            m->partial[t] = dt_alloc_zero(sizeof(float) * (m->nparams ? m->nparams : 1));
            if (!m->partial[t])
                return DT_ERR_NOMEM;
        }
    }
    return DT_OK;
}

static void free_thread_buffers(dt_model *m) {
    for (int t = 0; t < m->nthreads; t++) {
        if (m->scratch)
            dt_free(m->scratch[t]);
        if (m->partial)
            dt_free(m->partial[t]);
    }
    dt_free(m->scratch);
    dt_free(m->partial);
    m->scratch = NULL;
    m->partial = NULL;
}

// DT_NO_POOL_FUSION=1 keeps the max pool a layer of its own (to measure the fusion).
static bool no_pool_fusion(void) {
    long v = 0;
    if (dt_setting_int("DT_NO_POOL_FUSION", &v) != DT_OK) {
        DT_WARN("nn", "%s; fusing", dt_last_error());
        dt_clear_error();
    }
    return v == 1;
}

dt_status dt_model_finalize(dt_model *m, uint64_t seed) {
    if (!m)
        return dt_fail(DT_ERR_ARG, "model: NULL model");
    if (m->finalized)
        return dt_fail(DT_ERR_STATE, "model: dt_model_finalize called twice");
    if (m->nlayers == 0)
        return dt_fail(DT_ERR_ARG, "model: expected at least one layer, found none");
    if (m->pv)
        return dt_fail(DT_ERR_STATE, "model: a failed dt_model_finalize cannot be retried");
    DT_TRY(dt_blas_init());
    // A ReLU right after a convolution is applied by the convolution, and so is a 2x2
    // stride-2 max pool right after that ReLU when the convolution has stride 1 and an
    // even output (conv2d.c): the full-size output then never goes to memory.
    for (int i = 0; i + 1 < m->nlayers; i++) {
        nn_layer *c = &m->layers[i], *r = &m->layers[i + 1];
        if (c->ops != &dt_nn_conv2d_ops || r->ops != &dt_nn_relu_ops)
            continue;
        c->fuse_relu = true;
        r->skip      = true;
        nn_layer *p  = i + 2 < m->nlayers ? &m->layers[i + 2] : NULL;
        if (p && p->ops == &dt_nn_maxpool2d_ops && p->k == 2 && p->stride == 2 && c->stride == 1 &&
            c->out.h % 2 == 0 && c->out.w % 2 == 0 && !no_pool_fusion()) {
            c->pool = p;
            p->skip = true;
        }
    }
    size_t off        = 0;
    m->scratch_floats = scratch_need(m);
    DT_TRY(dt_params_new(&m->pv, NULL));
    for (int i = 0; i < m->nlayers; i++) {
        nn_layer *l = &m->layers[i];
        if (!l->nparams)
            continue;
        l->param_off   = off;
        l->param_count = l->wcount + (size_t)l->bcount;
        DT_TRY(add_pinfo(m, i, "weight", l->wndim, l->wshape, 0));
        DT_TRY(add_pinfo(m, i, "bias", 1, &l->bcount, DT_PARAM_NO_DECAY));
        off += l->param_count;
    }
    DT_TRY(dt_params_alloc(m->pv));
    m->nparams = off;
    m->params  = dt_params_data(m->pv);
    m->grads   = dt_params_grads(m->pv);
    // PyTorch's reset_parameters: kaiming_uniform_(w, a=sqrt(5)) gives the bound
    // gain * sqrt(3 / fan_in) with gain = sqrt(2 / (1 + a^2)) = sqrt(1/3), that is
    // 1/sqrt(fan_in); the bias is uniform in +-1/sqrt(fan_in) too.
    dt_rng root = dt_rng_init(seed);
    for (int i = 0; i < m->nlayers; i++) {
        nn_layer *l = &m->layers[i];
        if (!l->nparams)
            continue;
        l->w         = m->params + l->param_off;
        l->b         = l->w + l->wcount;
        float  bound = 1.0f / sqrtf((float)l->fan_in);
        dt_rng rw    = dt_rng_split(&root, 2 * (uint64_t)i);
        dt_rng rb    = dt_rng_split(&root, 2 * (uint64_t)i + 1);
        for (size_t j = 0; j < l->wcount; j++)
            l->w[j] = dt_rng_uniform_range(&rw, -bound, bound);
        for (int64_t j = 0; j < l->bcount; j++)
            l->b[j] = dt_rng_uniform_range(&rb, -bound, bound);
    }
    DT_TRY(alloc_thread_buffers(m, m->nthreads));
    if (m->shards &&
        !(m->shard_buf = dt_alloc_zero(sizeof(float) * (size_t)m->shards * (off ? off : 1))))
        return DT_ERR_NOMEM;
    m->finalized = true;
    return DT_OK;
}

static void free_activations(dt_model *m) {
    for (int i = 0; i <= MAX_LAYERS; i++) {
        dt_free(m->act_own[i]);
        m->act_own[i] = NULL;
    }
    for (int i = 0; i < 2; i++) {
        dt_free(m->gbuf[i]);
        m->gbuf[i] = NULL;
    }
    dt_free(m->dx);
    m->dx = NULL;
    for (int i = 0; i < m->nlayers; i++) {
        dt_free(m->layers[i].aux);
        m->layers[i].aux = NULL;
    }
    m->capacity = 0;
}

void dt_model_free(dt_model *m) {
    if (!m)
        return;
    dt_pool_free(m->pool);
    free_activations(m);
    free_thread_buffers(m);
    for (int i = 0; i < m->nlayers; i++) {
        dt_free(m->layers[i].offsets);
        dt_free(m->layers[i].w16);
    }
    dt_params_free(m->pv);
    dt_free(m->shard_buf);
    dt_free(m->keys);
    dt_free(m);
}

// ---------------------------------------------------------------------- inspecting

size_t dt_model_num_params(const dt_model *m) {
    return m->nparams;
}
int dt_model_num_param_tensors(const dt_model *m) {
    return m->pv ? dt_params_count(m->pv) : 0;
}
const dt_param_info *dt_model_param_info(const dt_model *m, int i) {
    return m->pv ? dt_params_info(m->pv, i) : NULL;
}
dt_params *dt_model_as_params(dt_model *m) {
    return m->finalized ? m->pv : NULL;
}
float *dt_model_params(dt_model *m) {
    return m->params;
}
float *dt_model_grads(dt_model *m) {
    return m->grads;
}
int dt_model_num_layers(const dt_model *m) {
    return m->nlayers;
}
const char *dt_model_layer_kind(const dt_model *m, int layer) {
    return layer >= 0 && layer < m->nlayers ? m->layers[layer].ops->kind : NULL;
}
size_t dt_model_output_size(const dt_model *m) {
    return nn_shape_size(current_shape(m));
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
        const nn_layer *l = &m->layers[i];
        int w = snprintf(buf + off, n - off, "%2d %-12s (%d, %d, %d) -> (%d, %d, %d) %zu params\n",
                         i, l->ops->kind, l->in.c, l->in.h, l->in.w, l->out.c, l->out.h, l->out.w,
                         l->param_count);
        if (w < 0)
            break;
        off += (size_t)w;
    }
}

// ------------------------------------------------------------------------- running

dt_status dt_model_set_threads(dt_model *m, int threads) {
    if (threads < 1 || threads > 256)
        return dt_fail(DT_ERR_ARG, "model: expected 1 to 256 threads, found %d", threads);
    if (threads == m->nthreads)
        return DT_OK;
    dt_pool_free(m->pool);
    m->pool = NULL;
    if (m->finalized)
        free_thread_buffers(m);
    m->nthreads = threads;
    if (threads > 1 && !(m->pool = dt_pool_init(threads)))
        return dt_last_status();
    if (m->finalized)
        DT_TRY(alloc_thread_buffers(m, threads));
    return DT_OK;
}

dt_status dt_model_set_grad_shards(dt_model *m, int shards) {
    if (shards < 0 || shards > NN_MAX_SHARDS || (shards & (shards - 1)))
        return dt_fail(DT_ERR_ARG,
                       "model: expected 0 gradient shards (off) or a power of two up to %d, "
                       "found %d",
                       NN_MAX_SHARDS, shards);
    if (shards == m->shards)
        return DT_OK;
    dt_free(m->shard_buf);
    m->shard_buf = NULL;
    m->shards    = shards;
    if (!m->finalized)
        return DT_OK;
    free_thread_buffers(m);
    m->scratch_floats = scratch_need(m);
    DT_TRY(alloc_thread_buffers(m, m->nthreads));
    if (shards && !(m->shard_buf = dt_alloc_zero(sizeof(float) * (size_t)shards *
                                                 (m->nparams ? m->nparams : 1))))
        return DT_ERR_NOMEM;
    return DT_OK;
}

int dt_model_grad_shards(const dt_model *m) {
    return m->shards;
}

dt_status dt_model_set_precision(dt_model *m, dt_precision p) {
    if (!m || !m->finalized || (p != DT_PREC_FP32 && p != DT_PREC_BF16 && p != DT_PREC_FP16))
        return dt_fail(DT_ERR_ARG,
                       "model: dt_model_set_precision expects a finalized model and fp32, bf16 "
                       "or fp16, found %s and mode %d",
                       m && m->finalized ? "a finalized model" : "none", (int)p);
    if (p == m->prec)
        return DT_OK;
    // The layers' kernels depend on the mode (a 16-bit convolution takes the im2col
    // path): set them up again, then the scratch they need.
    for (int i = 0; i < m->nlayers; i++) {
        nn_layer *l = &m->layers[i];
        if (l->ops != &dt_nn_conv2d_ops && l->ops != &dt_nn_linear_ops)
            continue;
        l->prec = p;
        dt_free(l->w16);
        l->w16 = NULL;
        DT_TRY(l->ops->setup(l));
        if (p != DT_PREC_FP32 && !(l->w16 = dt_alloc(dt_ac_shadow_bytes(p, l->wcount))))
            return DT_ERR_NOMEM;
    }
    m->prec = p;
    free_activations(m); // a layer's aux may have changed size (bf16 Linear's copies)
    free_thread_buffers(m);
    m->scratch_floats = scratch_need(m);
    return alloc_thread_buffers(m, m->nthreads);
}

dt_precision dt_model_precision(const dt_model *m) {
    return m ? m->prec : DT_PREC_FP32;
}

// The 16-bit shadows of the weights, once per forward; DT_ERR_NOMEM if a layer's
// 16-bit product failed for want of memory in the last pass.
static dt_status lowp_begin(dt_model *m, bool forward) {
    dt_status st = DT_OK;
    for (int i = 0; i < m->nlayers; i++) {
        nn_layer *l = &m->layers[i];
        if (l->lowp_failed)
            st = dt_fail(DT_ERR_NOMEM,
                         "model: layer %d (%s) could not get memory for a %s "
                         "product",
                         i, l->ops->kind, dt_precision_name(l->prec));
        l->lowp_failed = false;
        if (forward && l->w16)
            dt_ac_shadow_fill(l->prec, l->w, l->wcount, l->w16);
    }
    return st;
}

void dt_model_train(dt_model *m, bool training) {
    m->training = training;
}
void dt_model_set_rng(dt_model *m, const dt_rng *rng) {
    m->rng = *rng;
}
dt_status dt_model_set_sample_keys(dt_model *m, const uint64_t *keys, int n) {
    if (n < 0 || (n > 0 && !keys))
        return dt_fail(DT_ERR_ARG,
                       "model sample keys: expected n >= 0 keys (and an array when n > 0), "
                       "found n = %d and %s",
                       n, keys ? "an array" : "NULL");
    if (n > m->keys_cap) {
        uint64_t *k = dt_alloc(sizeof *k * (size_t)n);
        if (!k)
            return DT_ERR_NOMEM;
        dt_free(m->keys);
        m->keys     = k;
        m->keys_cap = n;
    }
    if (n)
        memcpy(m->keys, keys, sizeof *keys * (size_t)n);
    m->nkeys = keys ? n : 0;
    return DT_OK;
}
void dt_model_set_input_grad(dt_model *m, bool on) {
    m->want_input_grad = on;
}
const float *dt_model_input_grad(const dt_model *m) {
    return m->dx;
}
void dt_model_set_grad_hook(dt_model *m, dt_grad_ready_fn fn, void *user) {
    m->hook      = fn;
    m->hook_user = user;
}
void dt_model_set_profile(dt_model *m, bool on) {
    m->profile = on;
    for (int i = 0; i < m->nlayers; i++)
        m->layers[i].fwd_ns = m->layers[i].bwd_ns = 0;
}
void dt_model_profile(const dt_model *m, int layer, double *fwd_s, double *bwd_s) {
    *fwd_s = *bwd_s = 0;
    if (layer >= 0 && layer < m->nlayers) {
        *fwd_s = (double)m->layers[layer].fwd_ns * 1e-9;
        *bwd_s = (double)m->layers[layer].bwd_ns * 1e-9;
    }
}

void dt_model_zero_grad(dt_model *m) {
    memset(m->grads, 0, sizeof(float) * m->nparams);
}

dt_status dt_model_reserve(dt_model *m, int batch) {
    if (!m->finalized)
        return dt_fail(DT_ERR_STATE, "model: call dt_model_finalize before running it");
    if (batch < 1)
        return dt_fail(DT_ERR_ARG, "model: expected a batch of at least 1 sample, found %d", batch);
    if (batch <= m->capacity && (!m->want_input_grad || m->dx))
        return DT_OK;
    free_activations(m);
    size_t b = (size_t)batch, maxsz = nn_shape_size(m->input);
    for (int i = 0; i < m->nlayers; i++) {
        nn_layer *l = &m->layers[i];
        if (l->skip && l->ops->in_place)
            continue; // a fused ReLU: no buffer of its own
        // A convolution with a fused pool writes the pool's output, and the gradient it
        // receives is the pool's; its own full-size output is never stored.
        size_t sz = nn_shape_size(l->pool ? l->pool->out : l->out);
        if (sz > maxsz && !l->skip)
            maxsz = sz;
        if (l->pool)
            continue;
        // An in-place first layer must not write into the caller's input.
        if (!l->ops->in_place || i == 0) {
            if (!(m->act_own[i + 1] = dt_alloc(sizeof(float) * b * sz)))
                return DT_ERR_NOMEM;
        }
        if (l->aux_per_sample && !(l->aux = dt_alloc(b * l->aux_per_sample)))
            return DT_ERR_NOMEM;
    }
    for (int i = 0; i < 2; i++)
        if (!(m->gbuf[i] = dt_alloc(sizeof(float) * b * maxsz)))
            return DT_ERR_NOMEM;
    if (m->want_input_grad && !(m->dx = dt_alloc(sizeof(float) * b * nn_shape_size(m->input))))
        return DT_ERR_NOMEM;
    m->capacity = batch;
    return DT_OK;
}

static const float *layer_input(const dt_model *m, int i) {
    return i == 0 ? m->x : m->act[i];
}

typedef struct run_args {
    dt_model    *m;
    const float *dout;
} run_args;

static nn_ctx make_ctx(dt_model *m, int ith, int nth, const dt_rng *rng) {
    nn_ctx c = {
        .ith      = ith,
        .nth      = nth,
        .s0       = (int)((long)m->batch * ith / nth),
        .s1       = (int)((long)m->batch * (ith + 1) / nth),
        .sstep    = 1,
        .shards   = m->shards,
        .batch    = m->batch,
        .training = m->training,
        .pool     = m->pool,
        .scratch  = m->scratch[ith],
        .rng      = rng,
        .keys     = m->nkeys ? m->keys : NULL,
    };
    return c;
}

// Where layer i's output goes: the pool's output for a convolution with a fused pool.
static float *layer_output(const dt_model *m, int i) {
    const nn_layer *l = &m->layers[i];
    return l->pool ? m->act[l->pool->index + 1] : m->act[i + 1];
}

static void forward_task(void *arg, int ith, int nth) {
    dt_model *m = ((run_args *)arg)->m;
    for (int i = 0; i < m->nlayers; i++) {
        nn_layer *l = &m->layers[i];
        if (l->skip)
            continue;
        uint64_t t0 = m->profile && ith == 0 ? dt_now_ns() : 0;
        dt_rng   r  = dt_rng_split(&m->rng, (uint64_t)i);
        nn_ctx   c  = make_ctx(m, ith, nth, &r);
        DT_TRACE_BEGIN(tr);
        l->ops->forward(l, &c, layer_input(m, i), layer_output(m, i));
        DT_TRACE_END(tr, "forward", l->ops->kind, "layer", i);
        if (t0)
            l->fwd_ns += dt_now_ns() - t0;
    }
}

dt_status dt_model_forward(dt_model *m, const float *x, int batch) {
    if (m->training && m->nkeys && m->nkeys != batch)
        return dt_fail(DT_ERR_ARG,
                       "model forward: expected a batch of %d samples, as many as the sample "
                       "keys set (dt_model_set_sample_keys), found %d",
                       m->nkeys, batch);
    DT_TRY(dt_model_reserve(m, batch));
    m->batch = batch;
    m->x     = x;
    for (int i = 0; i < m->nlayers; i++) {
        nn_layer *l = &m->layers[i];
        if (m->act_own[i + 1]) {
            m->act[i + 1] = m->act_own[i + 1];
            if (l->ops->in_place) // only the first layer: work on a copy of x
                memcpy(m->act_own[i + 1], x, sizeof(float) * (size_t)batch * nn_shape_size(l->in));
        } else {
            m->act[i + 1] = m->act[i]; // in place, or not stored (fused into a convolution)
        }
        l->last_training = m->training;
    }
    if (m->prec != DT_PREC_FP32)
        (void)lowp_begin(m, true);
    run_args a = {.m = m};
    DT_TRACE_BEGIN(tr);
    dt_pool_run(m->pool, forward_task, &a);
    DT_TRACE_END(tr, "model", "forward", "batch", batch);
    return m->prec != DT_PREC_FP32 ? lowp_begin(m, false) : DT_OK;
}

const float *dt_model_output(const dt_model *m) {
    return m->act[m->nlayers];
}

// Sums this thread's slice of layer l's gradient over the other threads' buffers,
// in thread order, into the model's gradient buffer.
static void reduce_partials(dt_model *m, const nn_layer *l, int ith, int nth) {
    size_t lo = l->param_off + l->param_count * (size_t)ith / (size_t)nth;
    size_t hi = l->param_off + l->param_count * (size_t)(ith + 1) / (size_t)nth;
    for (int t = 1; t < nth; t++) {
        const float *p = m->partial[t];
        for (size_t j = lo; j < hi; j++)
            m->grads[j] += p[j];
    }
}

// Combines this thread's slice of layer l's shard buffers by the fixed tree and adds
// the result into the model's gradient buffer.
static void reduce_shards(dt_model *m, const nn_layer *l, int ith, int nth) {
    size_t lo = l->param_off + l->param_count * (size_t)ith / (size_t)nth;
    size_t hi = l->param_off + l->param_count * (size_t)(ith + 1) / (size_t)nth;
    if (hi <= lo)
        return;
    dt_nn_shard_tree(m->shard_buf + lo, m->nparams, m->shards, hi - lo);
    for (size_t j = lo; j < hi; j++)
        m->grads[j] += m->shard_buf[j];
}

// A PARTIAL layer's backward with gradient shards: this thread takes shards ith,
// ith + nth, ...; each is one backward call over its samples into its own buffer.
static void backward_shards(dt_model *m, nn_layer *l, int i, const nn_ctx *c, float *dout,
                            float *din) {
    if (c->nth > 1) // the rows of a shard were written by every thread
        dt_pool_barrier(m->pool);
    for (int sh = c->ith; sh < m->shards; sh += c->nth) {
        nn_ctx cs = *c;
        cs.s0     = sh;
        cs.s1     = m->batch;
        cs.sstep  = m->shards;
        float *dp = m->shard_buf + (size_t)sh * m->nparams + l->param_off;
        memset(dp, 0, sizeof(float) * l->param_count);
        l->ops->backward(l, &cs, layer_input(m, i), layer_output(m, i), dout, din, dp);
    }
}

static void backward_task(void *arg, int ith, int nth) {
    run_args *a  = arg;
    dt_model *m  = a->m;
    size_t    no = dt_model_output_size(m);
    int       g  = 0; // gbuf[g] holds the gradient w.r.t. the current layer's output
    nn_ctx    c0 = make_ctx(m, ith, nth, NULL);
    memcpy(m->gbuf[0] + (size_t)c0.s0 * no, a->dout + (size_t)c0.s0 * no,
           sizeof(float) * (size_t)(c0.s1 - c0.s0) * no);
    for (int i = m->nlayers - 1; i >= 0; i--) {
        nn_layer *l = &m->layers[i];
        if (l->skip) // its gradient work is done by the layer it is fused into
            continue;
        uint64_t t0   = m->profile && ith == 0 ? dt_now_ns() : 0;
        nn_ctx   c    = make_ctx(m, ith, nth, NULL);
        float   *dout = m->gbuf[g], *din = NULL;
        bool     need_din = i > 0 || m->want_input_grad;
        if (l->ops->in_place)
            din = dout;
        else if (need_din)
            din = i > 0 ? m->gbuf[1 - g] : m->dx;
        bool   sharded = m->shards && l->nparams && l->ops->grad_mode == NN_GRAD_PARTIAL;
        float *dparams = NULL;
        if (!sharded && l->nparams) {
            bool own = l->ops->grad_mode == NN_GRAD_PARTIAL && ith > 0;
            dparams  = (own ? m->partial[ith] : m->grads) + l->param_off;
            if (own)
                memset(dparams, 0, sizeof(float) * l->param_count);
        }
        DT_TRACE_BEGIN(tr);
        if (sharded)
            backward_shards(m, l, i, &c, dout, din);
        else
            l->ops->backward(l, &c, layer_input(m, i), layer_output(m, i), dout, din, dparams);
        DT_TRACE_END(tr, "backward", l->ops->kind, "layer", i);
        if (l->ops->in_place && i == 0 && m->want_input_grad)
            memcpy(m->dx + (size_t)c.s0 * nn_shape_size(l->in),
                   din + (size_t)c.s0 * nn_shape_size(l->in),
                   sizeof(float) * (size_t)(c.s1 - c.s0) * nn_shape_size(l->in));
        // Meet after every layer that wrote a new gradient buffer: the two ping-pong
        // buffers hold each layer's rows at that layer's stride, so the next layer's
        // rows of one thread can overlap another thread's rows of this one.
        if (nth > 1 && (l->nparams || !l->ops->in_place))
            dt_pool_barrier(m->pool);
        if (sharded) {
            reduce_shards(m, l, ith, nth);
            if (nth > 1)
                dt_pool_barrier(m->pool);
        } else if (nth > 1 && l->nparams && l->ops->grad_mode == NN_GRAD_PARTIAL) {
            reduce_partials(m, l, ith, nth);
            dt_pool_barrier(m->pool);
        }
        if (l->nparams && ith == 0) {
            if (m->hook)
                m->hook(m->hook_user, l->param_off, l->param_count);
            dt_params_grad_ready(m->pv, l->param_off, l->param_count);
        }
        if (!l->ops->in_place && din && i > 0)
            g = 1 - g;
        if (t0)
            l->bwd_ns += dt_now_ns() - t0;
    }
}

dt_status dt_model_backward(dt_model *m, const float *dout) {
    if (!m->finalized || m->batch == 0)
        return dt_fail(DT_ERR_STATE, "model: backward needs a forward first");
    if (m->want_input_grad && !m->dx)
        DT_TRY(dt_model_reserve(m, m->capacity));
    run_args a = {.m = m, .dout = dout};
    DT_TRACE_BEGIN(tr);
    dt_pool_run(m->pool, backward_task, &a);
    DT_TRACE_END(tr, "model", "backward", "batch", m->batch);
    return m->prec != DT_PREC_FP32 ? lowp_begin(m, false) : DT_OK;
}
