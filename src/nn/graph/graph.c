// graph.c: the model graph (graph.h): building it and finalizing it. Values are graph
// inputs and nodes in one array, in the order they were declared: since a node may only
// name earlier values, that order is topological and forward walks it, backward walks
// it in reverse (graph_run.c). Finalize first applies the passes (graph_pass.c: the
// fusion of conv2d + ReLU (+ max pool)), then registers the tensors and initialises them.
#include "dtrain/graph.h"

#include "nn/graph/graph_impl.h"

#include "nn/blas.h"
#include "nn/ops.h"
#include "nn/pool.h"

#include <stdio.h>
#include <string.h>

dt_graph_opts dt_graph_opts_default(void) {
    return (dt_graph_opts){.max_nodes = 1024};
}

dt_status dt_graph_new(dt_graph **out, const dt_graph_opts *opts) {
    if (!out)
        return dt_fail(DT_ERR_ARG, "dt_graph_new: expected an output pointer, found NULL");
    *out            = NULL;
    dt_graph_opts o = opts ? *opts : dt_graph_opts_default();
    if (o.max_nodes <= 0)
        o.max_nodes = 1024;
    dt_graph *g = dt_alloc_zero(sizeof *g);
    if (!g)
        return DT_ERR_NOMEM;
    g->vals = dt_alloc_zero(sizeof(gval) * (size_t)o.max_nodes);
    if (!g->vals) {
        dt_free(g);
        return DT_ERR_NOMEM;
    }
    g->cap       = o.max_nodes;
    g->no_fusion = o.no_fusion;
    g->output    = -1;
    g->training  = true;
    g->rng       = dt_rng_init(0);
    g->nthreads  = 1;
    g->split     = 1;
    *out         = g;
    return DT_OK;
}

void dt_graph_release_slots(dt_graph *g) {
    for (int s = 0; s < g->nslots; s++) {
        dt_free(g->slots[s].y);
        if (s != g->slot)
            dt_free(g->slots[s].keys);
    }
    dt_free(g->slots);
    g->slots  = NULL;
    g->nslots = g->slot = 0;
}

void dt_graph_free(dt_graph *g) {
    if (!g)
        return;
    dt_graph_free_shadows(g);
    dt_graph_release_buffers(g);
    dt_graph_release_slots(g);
    dt_graph_free_thread_buffers(g);
    dt_pool_free(g->pool);
    for (int i = 0; i < g->nvals; i++)
        dt_layer_free(g->vals[i].layer);
    dt_params_free(g->params);
    dt_free(g->first_user);
    dt_free(g->shard_buf);
    dt_free(g->keys);
    dt_free(g->times);
    dt_free(g->vals);
    dt_free(g);
}

static int find_val(const dt_graph *g, const char *name) {
    for (int i = 0; i < g->nvals; i++)
        if (strcmp(g->vals[i].name, name) == 0)
            return i;
    return -1;
}

static dt_status check_new_name(dt_graph *g, const char *name) {
    if (g->finalized)
        return dt_fail(DT_ERR_STATE, "graph: '%s' added after dt_graph_finalize", name ? name : "");
    if (!name || !name[0] || strlen(name) > DT_GRAPH_NAME_MAX)
        return dt_fail(DT_ERR_ARG, "graph: expected a name of 1..%d bytes, found '%s'",
                       DT_GRAPH_NAME_MAX, name ? name : "(null)");
    if (find_val(g, name) >= 0)
        return dt_fail(DT_ERR_ARG, "graph: the name '%s' is taken", name);
    if (g->nvals == g->cap)
        return dt_fail(DT_ERR_ARG, "graph: more than %d nodes (dt_graph_opts.max_nodes)", g->cap);
    return DT_OK;
}

static dt_status check_shape(const char *what, const dt_shape *s) {
    if (s->ndim < 0 || s->ndim > DT_SHAPE_MAX_DIMS ||
        (s->dtype != DT_ELEM_F32 && s->dtype != DT_ELEM_I32))
        return dt_fail(DT_ERR_ARG, "%s: expected ndim 0..%d and dtype f32 or i32, found ndim %d",
                       what, DT_SHAPE_MAX_DIMS, s->ndim);
    for (int i = 0; i < s->ndim; i++)
        if (s->d[i] < 1 || s->d[i] > INT32_MAX)
            return dt_fail(DT_ERR_ARG, "%s: expected dimensions >= 1, found %lld at %d", what,
                           (long long)s->d[i], i);
    return DT_OK;
}

dt_status dt_graph_input(dt_graph *g, const char *name, const dt_shape *shape) {
    if (!g || !shape)
        return dt_fail(DT_ERR_ARG, "dt_graph_input: expected a graph and a shape, found NULL");
    DT_TRY(check_new_name(g, name));
    DT_TRY(check_shape(name, shape));
    gval *v = &g->vals[g->nvals];
    memset(v, 0, sizeof *v);
    snprintf(v->name, sizeof v->name, "%s", name);
    v->shape       = *shape;
    v->alias       = -1;
    v->param_layer = g->nvals;
    g->nvals++;
    return DT_OK;
}

dt_status dt_graph_add_node(dt_graph *g, const char *name, dt_layer *layer, int nin,
                            const char *const *inputs) {
    if (!g || !layer) {
        dt_layer_free(layer);
        return dt_fail(DT_ERR_ARG, "dt_graph_add_node: expected a graph and a layer, found NULL");
    }
    dt_status st = check_new_name(g, name);
    if (st == DT_OK && (nin < 1 || nin > DT_LAYER_MAX_INPUTS || !inputs))
        st = dt_fail(DT_ERR_ARG, "node '%s': expected 1..%d inputs, found %d", name,
                     DT_LAYER_MAX_INPUTS, nin);
    gval v = {0};
    for (int i = 0; st == DT_OK && i < nin; i++) {
        v.in[i] = inputs[i] ? find_val(g, inputs[i]) : -1;
        if (v.in[i] < 0)
            st = dt_fail(DT_ERR_ARG,
                         "node '%s': input %d '%s' is neither a graph input nor an "
                         "earlier node",
                         name, i, inputs[i] ? inputs[i] : "(null)");
    }
    if (st != DT_OK) {
        dt_layer_free(layer);
        return st;
    }
    snprintf(v.name, sizeof v.name, "%s", name);
    v.layer       = layer;
    v.nin         = nin;
    v.alias       = -1;
    v.param_layer = g->nvals;
    dt_shape in[DT_LAYER_MAX_INPUTS];
    for (int i = 0; i < nin; i++)
        in[i] = g->vals[v.in[i]].shape;
    v.su.precision = g->prec;
    st             = layer->ops->setup(layer, nin, in, &v.su);
    if (st == DT_OK)
        st = check_shape(name, &v.su.out);
    if (st == DT_OK && (v.su.nparams < 0 || v.su.nparams > DT_LAYER_MAX_TENSORS ||
                        v.su.nbuffers < 0 || v.su.nbuffers > DT_LAYER_MAX_TENSORS))
        st = dt_fail(DT_ERR_ARG, "node '%s': expected 0..%d parameters and buffers, found %d, %d",
                     name, DT_LAYER_MAX_TENSORS, v.su.nparams, v.su.nbuffers);
    if (st != DT_OK) {
        const char *kind = layer->ops->kind;
        dt_layer_free(layer);
        return dt_fail_context("node '%s' (%s)", name, kind);
    }
    v.shape = v.su.out;
    for (int k = 0; k < DT_LAYER_MAX_TENSORS; k++)
        v.tie_val[k] = -1;
    for (int i = 0; i < nin; i++)
        g->vals[v.in[i]].nconsumers++;
    v.layer_no = 0; // one past the last (dt_graph_fuse leaves gaps)
    for (int i = 0; i < g->nvals; i++)
        if (g->vals[i].layer && g->vals[i].layer_no >= v.layer_no)
            v.layer_no = g->vals[i].layer_no + 1;
    g->vals[g->nvals++] = v;
    g->output           = g->nvals - 1;
    return DT_OK;
}

// "node.tensor" -> (value, parameter index).
static dt_status find_param(const dt_graph *g, const char *full, int *val, int *k) {
    const char *dot = strrchr(full, '.');
    if (dot && (size_t)(dot - full) <= DT_GRAPH_NAME_MAX) {
        char node[DT_GRAPH_NAME_MAX + 1];
        memcpy(node, full, (size_t)(dot - full));
        node[dot - full] = 0;
        int v            = find_val(g, node);
        if (v >= 0 && g->vals[v].layer)
            for (int i = 0; i < g->vals[v].su.nparams; i++)
                if (strcmp(g->vals[v].su.params[i].name, dot + 1) == 0) {
                    *val = v;
                    *k   = i;
                    return DT_OK;
                }
    }
    return dt_fail(DT_ERR_ARG, "graph: no parameter named '%s' (expected '<node>.<tensor>')", full);
}

dt_status dt_graph_tie(dt_graph *g, const char *param, const char *owner) {
    if (!g || !param || !owner)
        return dt_fail(DT_ERR_ARG, "dt_graph_tie: expected a graph and two names, found NULL");
    if (g->finalized)
        return dt_fail(DT_ERR_STATE, "dt_graph_tie: '%s' tied after dt_graph_finalize", param);
    int pv, pk, ov, ok;
    DT_TRY(find_param(g, param, &pv, &pk));
    DT_TRY(find_param(g, owner, &ov, &ok));
    if (ov >= pv)
        return dt_fail(DT_ERR_ARG,
                       "dt_graph_tie: expected the owner '%s' declared by an earlier "
                       "node than '%s'",
                       owner, param);
    if (g->vals[ov].tie_val[ok] >= 0)
        return dt_fail(DT_ERR_ARG, "dt_graph_tie: the owner '%s' is itself tied", owner);
    const dt_layer_tensor *a = &g->vals[pv].su.params[pk], *b = &g->vals[ov].su.params[ok];
    bool                   same = a->ndim == b->ndim;
    for (int i = 0; same && i < a->ndim; i++)
        same = a->shape[i] == b->shape[i];
    if (!same)
        return dt_fail(DT_ERR_ARG,
                       "dt_graph_tie: '%s' and '%s' differ in shape (%lld x %lld vs "
                       "%lld x %lld)",
                       param, owner, (long long)a->shape[0],
                       (long long)(a->ndim > 1 ? a->shape[1] : 1), (long long)b->shape[0],
                       (long long)(b->ndim > 1 ? b->shape[1] : 1));
    g->vals[pv].tie_val[pk] = ov;
    g->vals[pv].tie_k[pk]   = ok;
    return DT_OK;
}

dt_status dt_graph_set_output(dt_graph *g, const char *node) {
    int v = g && node ? find_val(g, node) : -1;
    if (v < 0 || !g->vals[v].layer)
        return dt_fail(DT_ERR_ARG, "dt_graph_set_output: no node named '%s'", node ? node : "");
    g->output = v;
    dt_graph_release_buffers(g); // the gradients' sharing depends on the output
    g->batch = 0;
    return DT_OK;
}

static dt_status full_name(char *buf, const char *node, const char *t) {
    int n = snprintf(buf, DT_PARAM_NAME_MAX + 1, "%s.%s", node, t);
    if (n < 0 || n > DT_PARAM_NAME_MAX)
        return dt_fail(DT_ERR_ARG, "graph: tensor name '%s.%s' is longer than %d bytes", node, t,
                       DT_PARAM_NAME_MAX);
    return DT_OK;
}

int dt_graph_tensor_order(const dt_graph *g, int *order) {
    int m = 0;
    for (int i = 0; i < g->nvals; i++) {
        if (!g->vals[i].layer)
            continue;
        int k = m++;
        for (; k > 0 && g->vals[order[k - 1]].layer_no > g->vals[i].layer_no; k--)
            order[k] = order[k - 1];
        order[k] = i;
    }
    return m;
}

// Registers the parameters and buffers of the layer nodes order[0..m) in that order.
static dt_status register_tensors(dt_graph *g, const int *order, int m) {
    char name[DT_PARAM_NAME_MAX + 1];
    int  np = 0;
    for (int q = 0; q < m; q++) {
        gval *v = &g->vals[order[q]];
        for (int k = 0; k < v->su.nparams; k++) {
            if (v->tie_val[k] >= 0) {
                v->pidx[k] = g->vals[v->tie_val[k]].pidx[v->tie_k[k]];
                continue;
            }
            const dt_layer_tensor *t = &v->su.params[k];
            if (v->copy_of[k][0])
                snprintf(name, sizeof name, "%s", v->copy_of[k]);
            else
                DT_TRY(full_name(name, dt_graph_tensor_node(v), t->name));
            DT_TRY(dt_params_add_ex(g->params, name, t->ndim, t->shape, t->flags, v->param_layer,
                                    false));
            if (dt_param_split_on(&t->split))
                DT_TRY(dt_params_set_split(g->params, np, &t->split));
            v->pidx[k] = np++;
        }
        for (int k = 0; k < v->su.nbuffers; k++) {
            const dt_layer_tensor *t = &v->su.buffers[k];
            DT_TRY(full_name(name, dt_graph_tensor_node(v), t->name));
            DT_TRY(dt_params_add_ex(g->params, name, t->ndim, t->shape, t->flags, v->param_layer,
                                    true));
            v->bidx[k] = dt_params_buffer_count(g->params) - 1;
        }
    }
    return DT_OK;
}

dt_status dt_graph_finalize(dt_graph *g, uint64_t seed) {
    if (!g)
        return dt_fail(DT_ERR_ARG, "dt_graph_finalize: expected a graph, found NULL");
    if (g->finalized)
        return dt_fail(DT_ERR_STATE, "dt_graph_finalize: called twice");
    if (g->output < 0)
        return dt_fail(DT_ERR_ARG, "dt_graph_finalize: the graph has no node");
    for (int i = 0; i < g->nvals; i++)
        if (g->vals[i].moved)
            return dt_fail(DT_ERR_STATE,
                           "dt_graph_finalize: node '%s' went to another graph "
                           "(dt_graph_extract)",
                           g->vals[i].name);
    dt_params_free(g->params); // what a failed earlier call left
    dt_free(g->first_user);
    g->params     = NULL;
    g->first_user = NULL;
    DT_TRY(dt_blas_init());
    for (int i = 0; i < g->nvals; i++) // a precision set after the node was added
        if (g->vals[i].layer && g->vals[i].su.precision != g->prec)
            DT_TRY(dt_graph_setup_node(g, i));
    DT_TRY(dt_graph_run_passes(g));
    DT_TRY(dt_params_new(&g->params, NULL));
    int *order = dt_alloc(sizeof(int) * (size_t)g->nvals);
    if (!order)
        return DT_ERR_NOMEM;
    int       m  = dt_graph_tensor_order(g, order);
    dt_status st = register_tensors(g, order, m);
    dt_free(order);
    DT_TRY(st);
    DT_TRY(dt_params_alloc(g->params));
    dt_params_set_announces_use(g->params, true); // forward and backward call dt_params_use
    int np        = dt_params_count(g->params);
    g->first_user = dt_alloc(sizeof(int) * (size_t)(np ? np : 1));
    if (!g->first_user)
        return DT_ERR_NOMEM;
    for (int t = 0; t < np; t++)
        g->first_user[t] = -1;
    float *data = dt_params_data(g->params), *grads = dt_params_grads(g->params);
    float *bufs   = dt_params_buffers(g->params);
    size_t junk_n = 0;
    for (int i = 0; i < g->nvals; i++) {
        gval *v = &g->vals[i];
        if (!v->layer)
            continue;
        for (int k = 0; k < v->su.nparams; k++) {
            const dt_param_info *t = dt_params_info(g->params, v->pidx[k]);
            v->w[k]                = data + t->offset;
            v->dw[k]               = grads + t->offset;
            if (g->first_user[v->pidx[k]] < 0)
                g->first_user[v->pidx[k]] = i;
            if (v->tie_val[k] >= 0 && t->count > junk_n)
                junk_n = t->count;
        }
        for (int k = 0; k < v->su.nbuffers; k++)
            v->buf[k] = bufs + dt_params_buffer_info(g->params, v->bidx[k])->offset;
    }
    // Initialise: a tied parameter keeps its owner's values (its node's init writes a
    // throwaway copy, so every node draws the same stream as untied).
    float *junk = dt_alloc(sizeof(float) * (junk_n ? junk_n : 1));
    if (!junk)
        return DT_ERR_NOMEM;
    dt_rng root = dt_rng_init(seed);
    for (int i = 0; i < g->nvals; i++) {
        gval *v = &g->vals[i];
        if (!v->layer || !v->layer->ops->init)
            continue;
        float *w[DT_LAYER_MAX_TENSORS];
        for (int k = 0; k < v->su.nparams; k++)
            w[k] = v->tie_val[k] >= 0 ? junk : v->w[k];
        dt_rng r = dt_rng_split(&root, (uint64_t)v->layer_no);
        v->layer->ops->init(v->layer, &r, w, v->buf);
    }
    dt_free(junk);
    g->finalized = true;
    return DT_OK;
}

dt_params *dt_graph_params(dt_graph *g) {
    return g && g->finalized ? g->params : NULL;
}
int dt_graph_num_nodes(const dt_graph *g) {
    return g ? g->nvals : 0;
}
const char *dt_graph_node_name(const dt_graph *g, int node) {
    return g && node >= 0 && node < g->nvals ? g->vals[node].name : NULL;
}
const char *dt_graph_node_kind(const dt_graph *g, int node) {
    if (!g || node < 0 || node >= g->nvals)
        return NULL;
    return g->vals[node].layer ? g->vals[node].layer->ops->kind : "input";
}
int dt_graph_find(const dt_graph *g, const char *name) {
    return g && name ? find_val(g, name) : -1;
}
const dt_shape *dt_graph_node_shape(const dt_graph *g, int node) {
    if (!g)
        return NULL;
    if (node == -1)
        node = g->output;
    return node >= 0 && node < g->nvals ? &g->vals[node].shape : NULL;
}

void dt_graph_train(dt_graph *g, bool training) {
    if (g)
        g->training = training;
}
void dt_graph_set_rng(dt_graph *g, const dt_rng *rng) {
    if (g && rng)
        g->rng = *rng;
}
dt_status dt_graph_set_sample_keys(dt_graph *g, const uint64_t *keys, int n) {
    if (!g || n < 0)
        return dt_fail(DT_ERR_ARG, "dt_graph_set_sample_keys: expected a graph and n >= 0");
    dt_free(g->keys);
    g->keys  = NULL;
    g->nkeys = 0;
    if (!keys || n == 0)
        return DT_OK;
    g->keys = dt_alloc(sizeof(uint64_t) * (size_t)n);
    if (!g->keys)
        return DT_ERR_NOMEM;
    memcpy(g->keys, keys, sizeof(uint64_t) * (size_t)n);
    g->nkeys = n;
    return DT_OK;
}
void dt_graph_set_input_grad(dt_graph *g, bool on) {
    if (g)
        g->input_grad = on;
}

dt_status dt_loss_mse(const float *x, const float *t, size_t n, float *loss, float *dx) {
    if (!x || !t || !loss || n == 0)
        return dt_fail(DT_ERR_ARG, "dt_loss_mse: expected x, t, loss and n >= 1");
    *loss = dt_nn_mse_loss(n, x, t, dx);
    return DT_OK;
}
dt_status dt_loss_l1(const float *x, const float *t, size_t n, float *loss, float *dx) {
    if (!x || !t || !loss || n == 0)
        return dt_fail(DT_ERR_ARG, "dt_loss_l1: expected x, t, loss and n >= 1");
    *loss = dt_nn_l1_loss(n, x, t, dx);
    return DT_OK;
}
dt_status dt_loss_bce_logits(const float *x, const float *t, size_t n, float *loss, float *dx) {
    if (!x || !t || !loss || n == 0)
        return dt_fail(DT_ERR_ARG, "dt_loss_bce_logits: expected x, t, loss and n >= 1");
    *loss = dt_nn_bce_logits_loss(n, x, t, dx);
    return DT_OK;
}
dt_status dt_loss_cross_entropy_ex(const float *logits, const int32_t *target, int n, int k,
                                   int ignore_index, float label_smoothing, float *loss,
                                   float *dlogits) {
    if (!target)
        return dt_fail(DT_ERR_ARG,
                       "dt_loss_cross_entropy_ex: expected int32 class indices as targets, found "
                       "none (NULL): a dataset whose labels are floats has regression targets "
                       "(dt_batch.t); store the labels as integers or use a regression loss");
    if (!logits || !loss || n < 1 || k < 1 || !(label_smoothing >= 0.0f && label_smoothing <= 1.0f))
        return dt_fail(DT_ERR_ARG,
                       "dt_loss_cross_entropy_ex: expected logits, targets, n, k >= 1 "
                       "and label smoothing in [0, 1], found n %d k %d ls %g",
                       n, k, (double)label_smoothing);
    return dt_nn_cross_entropy(n, k, logits, target, ignore_index, label_smoothing, loss, dlogits);
}
