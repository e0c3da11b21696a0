// exec.c: the executor of exec.h. On the CPU it is the graph itself; on a GPU it
// describes the graph (dt_graph_describe), hands the plugin the plan (exec_abi.h) and
// translates each call: the dropout streams of the nodes from the epoch's stream, the
// optimizer's options and per-step scalars from the host dt_optim, the copies between
// the device and the graph's host dt_params.
#include "dtrain/exec.h"

#include "core/device_abi.h"
#include "exec/exec_abi.h"
#include "optim/optim_impl.h"

#include <math.h>
#include <string.h>

struct dt_exec {
    dt_graph  *g;
    dt_params *hp; // the graph's (host) parameters
    dt_device *d;
    bool       training;
    dt_rng     rng;
    uint64_t  *keys;
    int        nkeys;
    int        batch; // of the last forward
    int64_t    steps;
    // The output's layout for the losses: classes = its last dimension above 1.
    size_t out_numel;
    int    classes;
    // On the CPU: the loss gradient of the output, and the last loss.
    float *dout;
    size_t dout_n;
    float  loss;
    // On a GPU: the plugin's executor, the plan's copies, the device table.
    const dt_exec_api *api;
    void              *h;
    dt_node_desc      *nodes;
    int                nnodes;
    uint64_t          *node_keys;
    dt_params         *dp; // the graph's table bound to the device's storage
};

dt_loss_spec dt_loss_spec_default(dt_loss_kind kind) {
    return (dt_loss_spec){.kind = kind, .ignore_index = -100, .grad_scale = 1.0f};
}

dt_exec_opts dt_exec_opts_default(void) {
    return (dt_exec_opts){.cuda_graph = -1};
}

static bool on_gpu(const dt_exec *x) {
    return x->h != NULL;
}

// The plan: every node described (a node the device cannot run stops here, named), the
// tables, the host values to start from.
static dt_status make_plan(dt_exec *x, const dt_exec_opts *o, dt_exec_plan *p, int **inputs,
                           dt_param_info **pt, dt_param_info **bt) {
    dt_graph *g  = x->g;
    x->nnodes    = dt_graph_num_nodes(g);
    x->nodes     = dt_alloc_zero(sizeof *x->nodes * (size_t)x->nnodes);
    x->node_keys = dt_alloc_zero(sizeof *x->node_keys * (size_t)x->nnodes);
    *inputs      = dt_alloc(sizeof(int) * (size_t)x->nnodes);
    int np = dt_params_count(x->hp), nb = dt_params_buffer_count(x->hp);
    *pt = dt_alloc(sizeof **pt * (size_t)(np ? np : 1));
    *bt = dt_alloc(sizeof **bt * (size_t)(nb ? nb : 1));
    if (!x->nodes || !x->node_keys || !*inputs || !*pt || !*bt)
        return DT_ERR_NOMEM;
    int ninputs = 0;
    for (int i = 0; i < x->nnodes; i++) {
        DT_TRY(dt_graph_describe(g, i, &x->nodes[i]));
        if (strcmp(x->nodes[i].kind, "input") == 0)
            (*inputs)[ninputs++] = i;
        if (strcmp(x->nodes[i].kind, "batchnorm") == 0 && x->nodes[i].h.bn.sync)
            return dt_fail(DT_ERR_UNSUPPORTED,
                           "node '%s': a SyncBatchNorm cannot run on %s yet (its statistics are "
                           "reduced over the process group on the host)",
                           x->nodes[i].name, dt_device_name(x->d));
    }
    for (int i = 0; i < np; i++)
        (*pt)[i] = *dt_params_info(x->hp, i);
    for (int i = 0; i < nb; i++)
        (*bt)[i] = *dt_params_buffer_info(x->hp, i);
    *p = (dt_exec_plan){
        .nnodes       = x->nnodes,
        .nodes        = x->nodes,
        .output       = dt_graph_output_node(g),
        .ninputs      = ninputs,
        .inputs       = *inputs,
        .nparams      = np,
        .nbuffers     = nb,
        .params       = *pt,
        .buffers      = *bt,
        .numel        = dt_params_numel(x->hp),
        .buffer_numel = dt_params_buffer_numel(x->hp),
        .init_params  = dt_params_data(x->hp),
        .init_buffers = dt_params_buffers(x->hp),
        .max_batch    = o->max_batch,
        .precision    = o->precision,
        .cuda_graph   = o->cuda_graph,
    };
    return DT_OK;
}

static dt_status open_gpu(dt_exec *x, const dt_exec_opts *o) {
    const dt_cuda_api *cuda;
    DT_TRY(dt_cuda_api_get(&cuda));
    x->api = cuda->exec;
    if (!x->api || x->api->abi != DT_EXEC_ABI || x->api->size < sizeof *x->api)
        return dt_fail(DT_ERR_UNSUPPORTED,
                       "the CUDA plugin has no executor of this library's version (ABI %d): "
                       "rebuild both from one tree",
                       DT_EXEC_ABI);
    dt_exec_plan   p;
    int           *inputs = NULL;
    dt_param_info *pt = NULL, *bt = NULL;
    dt_status      st = make_plan(x, o, &p, &inputs, &pt, &bt);
    if (st == DT_OK)
        st = x->api->create(&x->h, dt_device_index(x->d), &p);
    dt_free(inputs), dt_free(pt), dt_free(bt);
    DT_TRY(st);
    DT_TRY(dt_graph_param_table(x->g, false, &x->dp));
    return dt_params_bind_device(x->dp, x->d, x->api->device_ptr(x->h, DT_EXEC_PARAMS),
                                 x->api->device_ptr(x->h, DT_EXEC_GRADS),
                                 x->api->device_ptr(x->h, DT_EXEC_BUFFERS));
}

dt_status dt_exec_new(dt_exec **out, dt_graph *g, dt_device *d, const dt_exec_opts *opts) {
    if (out)
        *out = NULL;
    if (!out || !g || !d)
        return dt_fail(DT_ERR_ARG, "dt_exec_new: expected an output, a graph and a device");
    dt_params *hp = dt_graph_params(g);
    if (!hp)
        return dt_fail(DT_ERR_STATE, "dt_exec_new: expected a finalized graph");
    dt_exec_opts o = opts ? *opts : dt_exec_opts_default();
    if (o.max_batch < 0 ||
        (o.precision != DT_PREC_FP32 && o.precision != DT_PREC_BF16 && o.precision != DT_PREC_FP16))
        return dt_fail(DT_ERR_ARG, "dt_exec_new: expected max_batch >= 0 and a precision");
    dt_exec *x = dt_alloc_zero(sizeof *x);
    if (!x)
        return DT_ERR_NOMEM;
    x->g = g, x->hp = hp, x->d = d, x->training = true, x->rng = dt_rng_init(0);
    const dt_shape *os = dt_graph_node_shape(g, -1);
    x->out_numel       = dt_shape_numel(os);
    x->classes         = 1;
    for (int i = os->ndim - 1; i >= 0 && x->classes == 1; i--)
        x->classes = (int)os->d[i];
    dt_status st = DT_OK;
    if (dt_device_is_cuda(d))
        st = open_gpu(x, &o);
    else
        st = dt_graph_set_precision(g, o.precision);
    if (st) {
        dt_exec_free(x);
        return st;
    }
    *out = x;
    return DT_OK;
}

void dt_exec_free(dt_exec *x) {
    if (!x)
        return;
    if (x->h)
        x->api->destroy(x->h);
    dt_params_free(x->dp);
    dt_free(x->nodes), dt_free(x->node_keys), dt_free(x->keys), dt_free(x->dout);
    dt_free(x);
}

dt_device *dt_exec_device(const dt_exec *x) {
    return x ? x->d : NULL;
}
dt_graph *dt_exec_graph(const dt_exec *x) {
    return x ? x->g : NULL;
}
dt_params *dt_exec_params(dt_exec *x) {
    return on_gpu(x) ? x->dp : x->hp;
}

void dt_exec_train(dt_exec *x, bool training) {
    x->training = training;
}
void dt_exec_set_rng(dt_exec *x, const dt_rng *rng) {
    if (rng)
        x->rng = *rng;
}
dt_status dt_exec_set_sample_keys(dt_exec *x, const uint64_t *keys, int n) {
    dt_free(x->keys);
    x->keys = NULL, x->nkeys = 0;
    if (!keys || n <= 0)
        return DT_OK;
    if (!(x->keys = dt_alloc(sizeof *keys * (size_t)n)))
        return DT_ERR_NOMEM;
    memcpy(x->keys, keys, sizeof *keys * (size_t)n);
    x->nkeys = n;
    return DT_OK;
}

// ------------------------------------------------------------------ the losses

// Targets checked on the host, naming the row (the device kernels trust them).
static dt_status check_targets(const dt_exec *x, const dt_loss_spec *l, const int32_t *t,
                               int rows) {
    for (int r = 0; r < rows; r++) {
        if (l->kind == DT_LOSS_CROSS_ENTROPY && t[r] == l->ignore_index)
            continue;
        if (t[r] < 0 || t[r] >= x->classes)
            return dt_fail(DT_ERR_ARG, "loss: target of row %d is %d, expected 0 to %d%s", r,
                           (int)t[r], x->classes - 1,
                           l->kind == DT_LOSS_CROSS_ENTROPY ? " or the ignore_index" : "");
    }
    return DT_OK;
}

static dt_status check_loss(const dt_exec *x, const dt_loss_spec *l, const void *targets,
                            int batch) {
    if (!l || !targets)
        return dt_fail(DT_ERR_ARG, "loss: expected a loss and targets");
    if (l->kind != DT_LOSS_NLL && l->kind != DT_LOSS_CROSS_ENTROPY && l->kind != DT_LOSS_MSE)
        return dt_fail(DT_ERR_ARG, "loss: unknown kind %d", (int)l->kind);
    if (!(l->label_smoothing >= 0.0f && l->label_smoothing <= 1.0f) || !isfinite(l->grad_scale))
        return dt_fail(DT_ERR_ARG, "loss: expected label_smoothing in [0, 1] and a finite scale");
    if (l->kind == DT_LOSS_MSE)
        return DT_OK;
    int rows = (int)((size_t)batch * x->out_numel / (size_t)x->classes);
    return check_targets(x, l, targets, rows);
}

// The CPU's loss over the graph's output: the kernels of nn.h and graph.h.
static dt_status cpu_loss(dt_exec *x, const dt_loss_spec *l, const void *targets) {
    size_t n = (size_t)x->batch * x->out_numel;
    if (n > x->dout_n) {
        dt_free(x->dout);
        if (!(x->dout = dt_alloc(sizeof(float) * n)))
            return DT_ERR_NOMEM;
        x->dout_n = n;
    }
    const float *y    = dt_graph_output(x->g);
    int          rows = (int)(n / (size_t)x->classes);
    if (l->kind == DT_LOSS_NLL)
        DT_TRY(dt_loss_nll(y, targets, rows, x->classes, &x->loss, x->dout));
    else if (l->kind == DT_LOSS_CROSS_ENTROPY)
        DT_TRY(dt_loss_cross_entropy_ex(y, targets, rows, x->classes, l->ignore_index,
                                        l->label_smoothing, &x->loss, x->dout));
    else
        DT_TRY(dt_loss_mse(y, targets, n, &x->loss, x->dout));
    for (size_t i = 0; l->grad_scale != 1.0f && i < n; i++)
        x->dout[i] *= l->grad_scale;
    return DT_OK;
}

// ------------------------------------------------------------------ running

// An embedding's indices, checked on the host where they are graph inputs (the device
// trusts them: an index outside the table would read outside it), as the CPU's
// dt_nn_embedding_forward refuses them.
static dt_status check_indices(const dt_exec *x, const void *const *inputs, int batch) {
    for (int i = 0; i < x->nnodes; i++) {
        const dt_node_desc *n = &x->nodes[i];
        if (strcmp(n->kind, "embedding") != 0 || strcmp(x->nodes[n->in[0]].kind, "input") != 0)
            continue;
        int k = 0; // the input's place among the graph inputs
        for (int j = 0; j < n->in[0]; j++)
            k += strcmp(x->nodes[j].kind, "input") == 0;
        const int32_t *idx = inputs[k];
        size_t         cnt = (size_t)batch * dt_shape_numel(&x->nodes[n->in[0]].out_shape);
        for (size_t p = 0; p < cnt; p++)
            if (idx[p] < 0 || idx[p] >= n->h.emb.num)
                return dt_fail(DT_ERR_ARG,
                               "node '%s': index %d at position %zu of input '%s' is outside "
                               "[0, %d)",
                               n->name, (int)idx[p], p, x->nodes[n->in[0]].name, n->h.emb.num);
    }
    return DT_OK;
}

// A GPU run: the dropout streams of this call's nodes, then the plugin.
static dt_status gpu_run(dt_exec *x, const void *const *inputs, int batch, bool fwd, bool bwd,
                         const dt_loss_spec *l, const void *targets) {
    if (fwd)
        DT_TRY(check_indices(x, inputs, batch));
    for (int i = 0; i < x->nnodes; i++) {
        const dt_node_desc *n = &x->nodes[i];
        x->node_keys[i]       = 0;
        if (strcmp(n->kind, "dropout") == 0 || strcmp(n->kind, "dropout2d") == 0) {
            dt_rng r        = dt_rng_split(&x->rng, (uint64_t)n->layer_no);
            x->node_keys[i] = (uint64_t)r.key[0] | (uint64_t)r.key[1] << 32;
        }
    }
    dt_exec_lossdesc el = {0};
    if (l)
        el = (dt_exec_lossdesc){(int)l->kind,       x->classes,    l->ignore_index,
                                l->label_smoothing, l->grad_scale, targets};
    dt_exec_run r = {
        .batch     = batch,
        .training  = x->training,
        .inputs    = inputs,
        .keys      = x->keys && x->nkeys >= batch ? x->keys : NULL,
        .node_keys = x->node_keys,
        .forward   = fwd,
        .backward  = bwd,
        .loss      = l ? &el : NULL,
    };
    return x->api->run(x->h, &r);
}

static dt_status check_batch(const dt_exec *x, const void *const *inputs, int batch) {
    if (!inputs || batch < 1)
        return dt_fail(DT_ERR_ARG, "dt_exec: expected inputs and a batch >= 1, found %d", batch);
    if (x->keys && x->nkeys < batch)
        return dt_fail(DT_ERR_ARG, "dt_exec: %d sample keys for a batch of %d", x->nkeys, batch);
    return DT_OK;
}

static void cpu_prepare(dt_exec *x) {
    dt_graph_train(x->g, x->training);
    dt_graph_set_rng(x->g, &x->rng);
}

dt_status dt_exec_forward(dt_exec *x, const void *const *inputs, int batch) {
    DT_TRY(check_batch(x, inputs, batch));
    x->batch = batch;
    if (on_gpu(x))
        return gpu_run(x, inputs, batch, true, false, NULL, NULL);
    cpu_prepare(x);
    DT_TRY(dt_graph_set_sample_keys(x->g, x->keys, x->keys ? batch : 0));
    return dt_graph_forward(x->g, inputs, batch);
}

dt_status dt_exec_output(dt_exec *x, float *host, size_t n) {
    if (!x->batch || n > (size_t)x->batch * x->out_numel)
        return dt_fail(DT_ERR_ARG, "dt_exec_output: %zu floats asked, the last forward has %zu", n,
                       (size_t)x->batch * x->out_numel);
    if (on_gpu(x))
        return x->api->copy(x->h, DT_EXEC_PART_OUTPUT, true, host, 0, n);
    memcpy(host, dt_graph_output(x->g), sizeof(float) * n);
    return DT_OK;
}

dt_status dt_exec_loss(dt_exec *x, const dt_loss_spec *l, const void *targets, float *loss) {
    if (!x->batch)
        return dt_fail(DT_ERR_STATE, "dt_exec_loss: expected a forward first");
    DT_TRY(check_loss(x, l, targets, x->batch));
    if (on_gpu(x)) {
        DT_TRY(gpu_run(x, NULL, x->batch, false, false, l, targets));
        return loss ? x->api->loss_value(x->h, loss) : DT_OK;
    }
    DT_TRY(cpu_loss(x, l, targets));
    if (loss)
        *loss = x->loss;
    return DT_OK;
}

dt_status dt_exec_backward(dt_exec *x) {
    if (!x->batch)
        return dt_fail(DT_ERR_STATE, "dt_exec_backward: expected a forward and a loss first");
    if (on_gpu(x))
        return gpu_run(x, NULL, x->batch, false, true, NULL, NULL);
    return dt_graph_backward(x->g, x->dout);
}

dt_status dt_exec_train_step(dt_exec *x, const void *const *inputs, const void *targets, int batch,
                             const dt_loss_spec *l, float *loss) {
    DT_TRY(check_batch(x, inputs, batch));
    DT_TRY(check_loss(x, l, targets, batch));
    x->steps++;
    if (!on_gpu(x)) {
        DT_TRY(dt_exec_forward(x, inputs, batch));
        DT_TRY(dt_exec_loss(x, l, targets, loss));
        return dt_exec_backward(x);
    }
    x->batch = batch;
    DT_TRY(gpu_run(x, inputs, batch, true, true, l, targets));
    return loss ? x->api->loss_value(x->h, loss) : DT_OK;
}

// ---------------------------------------------------------------- the optimizer

// The host optimizer's rule and this step's scalars, in PyTorch's arithmetic (adam.c).
static dt_status describe_optim(dt_exec *x, dt_optim *o, dt_exec_optim *e) {
    if (!o || o->p == NULL || dt_params_numel(o->p) != dt_params_numel(x->hp) ||
        dt_params_count(o->p) != dt_params_count(x->hp))
        return dt_fail(DT_ERR_ARG, "dt_exec_optim_step: expected an optimizer over the graph's "
                                   "parameters");
    if (o->flat_off)
        return dt_fail(DT_ERR_UNSUPPORTED,
                       "dt_exec_optim_step: a sharded optimizer (ZeRO) cannot step on %s yet",
                       dt_device_name(x->d));
    memset(e, 0, sizeof *e);
    e->kind         = (int)o->kind;
    e->step         = o->steps + 1;
    e->ngroups      = o->ngroups;
    e->tgroup       = o->tgroup;
    e->state_floats = o->nstate;
    double t = (double)e->step, bc1 = 1, bc2 = 1;
    if (o->kind == DT_OPTIM_ADAM || o->kind == DT_OPTIM_ADAMW) {
        const dt_adam_opts *a = &o->opts.adam;
        e->beta1 = a->beta1, e->beta2 = a->beta2, e->eps = a->eps, e->amsgrad = a->amsgrad;
        bc1 = 1.0 - pow((double)a->beta1, t), bc2 = 1.0 - pow((double)a->beta2, t);
        e->bc2_sqrt = (float)sqrt(bc2);
    } else if (o->kind == DT_OPTIM_SGD) {
        const dt_sgd_opts *s = &o->opts.sgd;
        e->momentum = s->momentum, e->dampening = s->dampening, e->nesterov = s->nesterov;
    } else {
        e->rho = o->opts.adadelta.rho, e->eps = o->opts.adadelta.eps;
    }
    for (int g = 0; g < o->ngroups; g++) {
        float lr = o->groups[g].lr, wd = o->groups[g].weight_decay;
        e->lr[g] = lr, e->wd[g] = wd;
        e->step_size[g] = (float)((double)lr / bc1);
        e->decay[g]     = o->kind == DT_OPTIM_ADAMW ? (float)(1.0 - (double)lr * (double)wd) : 1.0f;
    }
    return DT_OK;
}

dt_status dt_exec_optim_step(dt_exec *x, dt_optim *o) {
    if (!on_gpu(x)) {
        dt_optim_step(o);
        return DT_OK;
    }
    dt_exec_optim e;
    DT_TRY(describe_optim(x, o, &e));
    DT_TRY(x->api->optim_step(x->h, &e));
    o->steps++;
    return DT_OK;
}

dt_status dt_exec_zero_grad(dt_exec *x) {
    if (on_gpu(x))
        return x->api->zero_grad(x->h);
    dt_params_zero_grad(x->hp);
    return DT_OK;
}

dt_status dt_exec_grad_norm(dt_exec *x, float *norm) {
    return on_gpu(x) ? x->api->grad_norm(x->h, norm) : dt_grad_norm(x->hp, norm);
}

dt_status dt_exec_scale_grads(dt_exec *x, float s) {
    if (on_gpu(x))
        return x->api->scale_grads(x->h, s);
    float *g = dt_params_grads(x->hp);
    for (size_t i = 0, n = dt_params_numel(x->hp); i < n; i++)
        g[i] *= s;
    return DT_OK;
}

// ------------------------------------------------------------------ host copies

static dt_status move(dt_exec *x, unsigned parts, dt_optim *o, bool to_host) {
    if (!on_gpu(x))
        return DT_OK; // one storage
    if ((parts & DT_EXEC_OPTIM) && !o)
        return dt_fail(DT_ERR_ARG, "dt_exec: DT_EXEC_OPTIM needs the optimizer");
    if (parts & DT_EXEC_PARAMS)
        DT_TRY(x->api->copy(x->h, DT_EXEC_PARAMS, to_host, dt_params_data(x->hp), 0,
                            dt_params_numel(x->hp)));
    if (parts & DT_EXEC_GRADS)
        DT_TRY(x->api->copy(x->h, DT_EXEC_GRADS, to_host, dt_params_grads(x->hp), 0,
                            dt_params_numel(x->hp)));
    if ((parts & DT_EXEC_BUFFERS) && dt_params_buffer_numel(x->hp))
        DT_TRY(x->api->copy(x->h, DT_EXEC_BUFFERS, to_host, dt_params_buffers(x->hp), 0,
                            dt_params_buffer_numel(x->hp)));
    if ((parts & DT_EXEC_OPTIM) && o->nstate) {
        if (o->flat_off)
            return dt_fail(DT_ERR_UNSUPPORTED, "dt_exec: a sharded optimizer's state");
        DT_TRY(x->api->copy(x->h, DT_EXEC_OPTIM, to_host, o->state, 0, o->nstate));
    }
    return DT_OK;
}

dt_status dt_exec_pull(dt_exec *x, unsigned parts, dt_optim *o) {
    return move(x, parts, o, true);
}
dt_status dt_exec_push(dt_exec *x, unsigned parts, dt_optim *o) {
    return move(x, parts, o, false);
}

dt_status dt_exec_sync(dt_exec *x) {
    return on_gpu(x) ? x->api->sync(x->h) : DT_OK;
}

void dt_exec_get_stats(const dt_exec *x, dt_exec_stats *out) {
    memset(out, 0, sizeof *out);
    out->steps = x->steps;
    if (on_gpu(x))
        x->api->stats(x->h, &out->graph_replays, &out->device_bytes);
}
