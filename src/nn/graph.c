// graph.c: the model graph (graph.h). Values are graph inputs and nodes in one array,
// in the order they were declared: since a node may only name earlier values, that
// order is topological and forward walks it, backward walks it in reverse.
//
// Memory per value: its output y (batch x numel), the layer's saved state; the
// gradients dy of the nodes share buffers by liveness (share_dy); scratch and the
// temporaries for fan-out are shared by all nodes.
//
// Gradients of fan-out: a value's dy is WRITTEN by the first consumer that backward
// reaches (the last in forward order) and every later consumer writes into a
// temporary that is then added (dt_nn_accumulate), so a value read k times gets the
// sum of k gradients without zeroing anything first.
//
// Fusion passes (next step: porting the Sequential model onto the graph) fit between
// dt_graph_add and dt_graph_finalize: a pass walks `vals`, finds a conv node whose only
// consumer is a ReLU whose only consumer is a 2x2 max pool (nconsumers == 1 on both),
// and replaces the three by one node of a fused layer reading the conv's inputs and
// exposing the pool's output under the pool's name: the names of parameters and of the
// values later nodes read stay as they were.
#include "dtrain/graph.h"
#include "dtrain/trace.h"

#include "nn/graph_impl.h"

#include "nn/blas.h"
#include "nn/ops.h"
#include "nn/pool.h"
#include "nn/prec.h"

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
    g->cap      = o.max_nodes;
    g->output   = -1;
    g->training = true;
    g->rng      = dt_rng_init(0);
    g->nthreads = 1;
    g->split    = 1;
    *out        = g;
    return DT_OK;
}

void dt_graph_release_buffers(dt_graph *g) {
    for (int i = 0; i < g->nvals; i++) {
        gval *v = &g->vals[i];
        if (!g->nslots) { // else the slots own them
            dt_free(v->y);
            dt_free(v->saved);
        }
        if (!v->layer) // a node's dy is one of the shared slots
            dt_free(v->dy);
        v->y = v->dy = v->saved = NULL;
    }
    for (int s = 0; s < g->nslots; s++)
        for (int i = 0; i < g->nvals; i++) {
            dt_free(g->slots[s].y[i]);
            dt_free(g->slots[s].saved[i]);
            g->slots[s].y[i] = g->slots[s].saved[i] = NULL;
        }
    dt_free(g->scratch);
    dt_free(g->tmp);
    g->scratch = g->tmp = NULL;
    dt_free(g->pos_keys);
    g->pos_keys = NULL;
    for (int k = 0; k < g->ndy; k++)
        dt_free(g->dyslot[k]);
    dt_free(g->dyslot);
    g->dyslot   = NULL;
    g->ndy      = 0;
    g->reserved = 0;
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

static void free_thread_buffers(dt_graph *g) {
    for (int t = 1; t < g->tbuf_n; t++) {
        if (g->partial)
            dt_free(g->partial[t]);
        if (g->tscratch)
            dt_free(g->tscratch[t]);
    }
    dt_free(g->partial);
    dt_free(g->tscratch);
    dt_free(g->tstatus);
    g->partial = g->tscratch = NULL;
    g->tstatus               = NULL;
    g->tbuf_n                = 0;
    g->tscratch_n            = 0;
}

static void free_shadows(dt_graph *g) {
    for (int i = 0; i < g->nvals; i++)
        for (int k = 0; k < DT_LAYER_MAX_TENSORS; k++) {
            dt_free(g->vals[i].w16[k]);
            g->vals[i].w16[k] = NULL;
        }
}

void dt_graph_free(dt_graph *g) {
    if (!g)
        return;
    free_shadows(g);
    dt_graph_release_buffers(g);
    dt_graph_release_slots(g);
    free_thread_buffers(g);
    dt_pool_free(g->pool);
    for (int i = 0; i < g->nvals; i++)
        dt_layer_free(g->vals[i].layer);
    dt_params_free(g->params);
    dt_free(g->first_user);
    dt_free(g->keys);
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
    v->shape = *shape;
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
    v.layer = layer;
    v.nin   = nin;
    dt_shape in[DT_LAYER_MAX_INPUTS];
    for (int i = 0; i < nin; i++)
        in[i] = g->vals[v.in[i]].shape;
    st = layer->ops->setup(layer, nin, in, &v.su);
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

static const char *tensor_node(const gval *v) { // dt_graph_fuse's fused nodes
    return v->tensor_node[0] ? v->tensor_node : v->name;
}

// Registers the parameters and buffers of the layer nodes order[0..m) in that order.
static dt_status register_tensors(dt_graph *g, const int *order, int m) {
    char name[DT_PARAM_NAME_MAX + 1];
    int  np = 0;
    for (int q = 0; q < m; q++) {
        int   i = order[q];
        gval *v = &g->vals[i];
        for (int k = 0; k < v->su.nparams; k++) {
            if (v->tie_val[k] >= 0) {
                v->pidx[k] = g->vals[v->tie_val[k]].pidx[v->tie_k[k]];
                continue;
            }
            const dt_layer_tensor *t = &v->su.params[k];
            if (v->copy_of[k][0])
                snprintf(name, sizeof name, "%s", v->copy_of[k]);
            else
                DT_TRY(full_name(name, tensor_node(v), t->name));
            DT_TRY(dt_params_add_ex(g->params, name, t->ndim, t->shape, t->flags, i, false));
            v->pidx[k] = np++;
        }
        for (int k = 0; k < v->su.nbuffers; k++) {
            const dt_layer_tensor *t = &v->su.buffers[k];
            DT_TRY(full_name(name, tensor_node(v), t->name));
            DT_TRY(dt_params_add_ex(g->params, name, t->ndim, t->shape, t->flags, i, true));
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
    DT_TRY(dt_params_new(&g->params, NULL));
    // Tensors in layer position order: node order, but for the nodes of dt_graph_fuse,
    // which keep their BatchNorm's place (and so the unfused model's parameter order).
    int *order = dt_alloc(sizeof(int) * (size_t)g->nvals), m = 0;
    if (!order)
        return DT_ERR_NOMEM;
    for (int i = 0; i < g->nvals; i++) {
        if (!g->vals[i].layer)
            continue;
        int k = m++;
        for (; k > 0 && g->vals[order[k - 1]].layer_no > g->vals[i].layer_no; k--)
            order[k] = order[k - 1];
        order[k] = i;
    }
    dt_status st = register_tensors(g, order, m);
    dt_free(order);
    DT_TRY(st);
    DT_TRY(dt_params_alloc(g->params));
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

static size_t val_floats(const gval *v, int batch) {
    return dt_shape_numel(&v->shape) * (size_t)batch;
}

// The gradient of node v is live in backward from its last consumer's backward (which
// writes it; the output: from the start) to v's own (which reads it last). Nodes whose
// intervals do not overlap share one buffer: greedily, in backward order, a node takes
// a slot whose last holder's own backward came before this node's first write (index
// above it). The live set of a chain of blocks is a few values, not all of them.
static dt_status share_dy(dt_graph *g, int batch) {
    int     n    = g->nvals;
    int    *last = dt_alloc(sizeof(int) * (size_t)n * 3), *order = last + n, *holder = last + 2 * n;
    size_t *size = dt_alloc_zero(sizeof(size_t) * (size_t)n);
    if (!last || !size) {
        dt_free(last);
        dt_free(size);
        return DT_ERR_NOMEM;
    }
    for (int i = 0; i < n; i++)
        last[i] = i == g->output ? n : i;
    for (int i = 0; i < n; i++)
        for (int j = 0; j < g->vals[i].nin; j++)
            if (last[g->vals[i].in[j]] < i)
                last[g->vals[i].in[j]] = i;
    int m = 0;
    for (int i = 0; i < n; i++)
        if (g->vals[i].layer) { // insertion by last consumer, latest first
            int k = m++;
            while (k > 0 && last[order[k - 1]] < last[i]) {
                order[k] = order[k - 1];
                k--;
            }
            order[k] = i;
        }
    int *slot_of = dt_alloc(sizeof(int) * (size_t)(n ? n : 1));
    if (!slot_of) {
        dt_free(last);
        dt_free(size);
        return DT_ERR_NOMEM;
    }
    int ns = 0;
    for (int q = 0; q < m; q++) {
        int v = order[q], s = -1;
        for (int k = 0; k < ns && s < 0; k++)
            if (holder[k] > last[v])
                s = k;
        if (s < 0)
            s = ns++;
        holder[s]  = v;
        slot_of[v] = s;
        size_t f   = val_floats(&g->vals[v], batch);
        if (f > size[s])
            size[s] = f;
    }
    dt_status st = DT_OK;
    g->dyslot    = dt_alloc_zero(sizeof(float *) * (size_t)(ns ? ns : 1));
    if (!g->dyslot)
        st = DT_ERR_NOMEM;
    for (int k = 0; !st && k < ns; k++) {
        g->ndy       = k + 1;
        g->dyslot[k] = dt_alloc(sizeof(float) * (size[k] ? size[k] : 1));
        if (!g->dyslot[k])
            st = DT_ERR_NOMEM;
    }
    for (int q = 0; !st && q < m; q++)
        g->vals[order[q]].dy = g->dyslot[slot_of[order[q]]];
    dt_free(slot_of);
    dt_free(last);
    dt_free(size);
    return st;
}

static dt_status reserve(dt_graph *g, int batch) {
    if (batch <= g->reserved)
        return DT_OK;
    dt_graph_release_buffers(g);
    DT_TRY(share_dy(g, batch));
    size_t scratch = 1, tmp = 1;
    for (int i = 0; i < g->nvals; i++) {
        gval  *v = &g->vals[i];
        size_t n = val_floats(v, batch);
        if (!v->layer) {
            v->dy = dt_alloc(sizeof(float) * (n ? n : 1));
            if (!v->dy)
                return DT_ERR_NOMEM;
            continue;
        }
        size_t s = v->su.saved_per_sample * (size_t)batch + v->su.saved_fixed;
        for (int k = 0; k < (g->nslots ? g->nslots : 1); k++) {
            v->y     = dt_alloc(sizeof(float) * (n ? n : 1));
            v->saved = dt_alloc(sizeof(float) * (s ? s : 1));
            if (g->nslots) {
                g->slots[k].y[i]     = v->y;
                g->slots[k].saved[i] = v->saved;
            }
            if (!v->y || !v->saved)
                return DT_ERR_NOMEM;
        }
        if (g->nslots) {
            v->y     = g->slots[g->slot].y[i];
            v->saved = g->slots[g->slot].saved[i];
        }
        size_t sc = v->su.scratch_per_sample * (size_t)batch + v->su.scratch_fixed, t = 0;
        if (sc > scratch)
            scratch = sc;
        for (int j = 0; j < v->nin; j++)
            t += val_floats(&g->vals[v->in[j]], batch);
        if (t > tmp)
            tmp = t;
    }
    g->scratch = dt_alloc(sizeof(float) * scratch);
    g->tmp     = dt_alloc(sizeof(float) * tmp);
    if (!g->scratch || !g->tmp)
        return DT_ERR_NOMEM;
    g->scratch_n = scratch;
    g->tmp_n     = tmp;
    g->reserved  = batch;
    return DT_OK;
}

static const float *val_data(const gval *v) {
    return v->layer ? v->y : v->ext;
}

dt_status dt_graph_set_threads(dt_graph *g, int threads) {
    if (!g || threads < 1 || threads > 256)
        return dt_fail(DT_ERR_ARG,
                       "dt_graph_set_threads: expected a graph and 1 to 256 threads, found %d",
                       threads);
    if (threads == g->nthreads)
        return DT_OK;
    dt_pool_free(g->pool);
    g->pool = NULL;
    free_thread_buffers(g);
    g->nthreads = threads;
    if (threads > 1 && !(g->pool = dt_pool_init(threads))) {
        g->nthreads = 1;
        return dt_fail_context("dt_graph_set_threads");
    }
    return DT_OK;
}

int dt_graph_threads(const dt_graph *g) {
    return g ? g->nthreads : 1;
}

// Scratch and gradient partials of threads 1.., the sample keys 0, 1, .. of a split batch.
static dt_status thread_buffers(dt_graph *g) {
    int n = g->nthreads;
    if (n > 1 && !g->pos_keys) {
        g->pos_keys = dt_alloc(sizeof(uint64_t) * (size_t)g->reserved);
        if (!g->pos_keys)
            return DT_ERR_NOMEM;
        for (int i = 0; i < g->reserved; i++)
            g->pos_keys[i] = (uint64_t)i;
    }
    if (g->tbuf_n == n && g->tscratch_n >= g->scratch_n)
        return DT_OK;
    free_thread_buffers(g);
    size_t np     = dt_params_numel(g->params);
    g->partial    = dt_alloc_zero(sizeof(float *) * (size_t)n);
    g->tscratch   = dt_alloc_zero(sizeof(float *) * (size_t)n);
    g->tstatus    = dt_alloc_zero(sizeof(dt_status) * (size_t)n);
    g->tbuf_n     = n;
    g->tscratch_n = g->scratch_n;
    if (!g->partial || !g->tscratch || !g->tstatus)
        return DT_ERR_NOMEM;
    for (int t = 1; t < n; t++) {
        g->partial[t]  = dt_alloc_zero(sizeof(float) * (np ? np : 1));
        g->tscratch[t] = dt_alloc(sizeof(float) * g->scratch_n);
        if (!g->partial[t] || !g->tscratch[t])
            return DT_ERR_NOMEM;
    }
    return DT_OK;
}

// A layer whose forward keeps batch-wide state (BatchNorm's statistics: saved_fixed)
// runs on the whole batch on the calling thread; every other layer is split by samples.
static bool splittable(const gval *v) {
    return v->su.saved_fixed == 0;
}

// One node's forward or backward over the samples of thread `t` of `n`.
typedef struct node_task {
    dt_graph *g;
    gval     *v;
    bool      backward;
    float    *dx[DT_LAYER_MAX_INPUTS]; // backward: where the whole batch's dx[j] go
    bool      direct[DT_LAYER_MAX_INPUTS];
} node_task;

static dt_status run_range(node_task *k, int t, int n) {
    dt_graph *g  = k->g;
    gval     *v  = k->v;
    int       b0 = (int)((int64_t)g->batch * t / n), b1 = (int)((int64_t)g->batch * (t + 1) / n);
    if (b1 <= b0)
        return DT_OK;
    size_t       off = (size_t)b0;
    dt_shape     in[DT_LAYER_MAX_INPUTS];
    const float *x[DT_LAYER_MAX_INPUTS];
    float       *dx[DT_LAYER_MAX_INPUTS];
    float       *dw[DT_LAYER_MAX_TENSORS];
    for (int j = 0; j < v->nin; j++) {
        const gval *u = &g->vals[v->in[j]];
        in[j]         = u->shape;
        x[j]          = val_data(u) + off * dt_shape_numel(&u->shape);
        dx[j]         = k->dx[j] ? k->dx[j] + off * dt_shape_numel(&u->shape) : NULL;
    }
    for (int p = 0; p < v->su.nparams; p++)
        dw[p] = t == 0 ? v->dw[p] : g->partial[t] + dt_params_info(g->params, v->pidx[p])->offset;
    size_t          ny   = dt_shape_numel(&v->shape);
    dt_rng          rng  = dt_rng_split(&g->rng, (uint64_t)v->layer_no);
    const uint64_t *keys = g->keys ? g->keys + off : (n > 1 ? g->pos_keys + off : NULL);
    dt_layer_args   a    = {
             .batch     = b1 - b0,
             .training  = v->fwd_training,
             .nin       = v->nin,
             .in        = in,
             .out       = &v->shape,
             .x         = x,
             .y         = v->y + off * ny,
             .dy        = k->backward ? v->dy + off * ny : NULL,
             .dx        = dx,
             .w         = v->w,
             .dw        = dw,
             .buf       = v->buf,
             .saved     = v->saved + off * v->su.saved_per_sample,
             .scratch   = t == 0 ? g->scratch : g->tscratch[t],
             .rng       = &rng,
             .keys      = keys,
             .precision = g->prec,
             .w16       = (const void *const *)v->w16,
             .pool      = n == 1 && g->split > 1 ? g->pool : NULL, // a node run whole
    };
    if (!k->backward)
        return v->layer->ops->forward(v->layer, &a);
    DT_TRY(v->layer->ops->backward(v->layer, &a));
    for (int j = 0; j < v->nin; j++) { // a later consumer's gradient, added in range
        gval  *u  = &g->vals[v->in[j]];
        size_t nu = dt_shape_numel(&u->shape);
        if (dx[j] && !k->direct[j])
            dt_nn_accumulate((size_t)(b1 - b0) * nu, dx[j], u->dy + off * nu);
    }
    return DT_OK;
}

static void pool_task(void *arg, int ith, int nth) {
    node_task *k       = arg;
    k->g->tstatus[ith] = run_range(k, ith, nth);
}

// Runs the node on the split of the last forward. A failure on another thread than
// the caller's keeps its status; its message stayed on that thread.
static dt_status run_node(node_task *k) {
    dt_graph *g = k->g;
    int       n = splittable(k->v) ? g->split : 1;
    if (n == 1)
        return run_range(k, 0, 1);
    dt_pool_run(g->pool, pool_task, k);
    for (int t = 0; t < n; t++)
        if (g->tstatus[t] != DT_OK)
            return t == 0 ? g->tstatus[t]
                          : dt_fail(g->tstatus[t], "thread %d of %d failed (status %d)", t, n,
                                    (int)g->tstatus[t]);
    return DT_OK;
}

void dt_graph_set_profile(dt_graph *g, bool on) {
    if (!g)
        return;
    g->profile = on;
    for (int i = 0; i < g->nvals; i++)
        g->vals[i].prof = (dt_graph_profile){0};
}

dt_status dt_graph_node_profile(const dt_graph *g, int node, dt_graph_profile *out) {
    if (!g || !out || node < 0 || node >= g->nvals)
        return dt_fail(DT_ERR_ARG,
                       "dt_graph_node_profile: expected a graph, a node in [0, %d) "
                       "and an output, found node %d",
                       g ? g->nvals : 0, node);
    *out = g->vals[node].prof;
    return DT_OK;
}

dt_status dt_graph_set_precision(dt_graph *g, dt_precision p) {
    if (!g || (p != DT_PREC_FP32 && p != DT_PREC_BF16 && p != DT_PREC_FP16))
        return dt_fail(DT_ERR_ARG,
                       "dt_graph_set_precision: expected a graph and fp32, bf16 or "
                       "fp16, found mode %d",
                       (int)p);
    g->prec = p;
    return DT_OK;
}

dt_precision dt_graph_precision(const dt_graph *g) {
    return g ? g->prec : DT_PREC_FP32;
}

// The weights' 16-bit shadows, made once per forward from the fp32 masters (the
// optimizer changes them between steps); backward reads the same copies.
static dt_status fill_shadows(dt_graph *g) {
    if (g->prec == DT_PREC_FP32)
        return DT_OK;
    if (g->w16_prec != g->prec)
        free_shadows(g);
    g->w16_prec = g->prec;
    for (int i = 0; i < g->nvals; i++) {
        gval *v = &g->vals[i];
        if (!v->layer)
            continue;
        for (int k = 0; k < v->su.nparams; k++) {
            if (!(v->su.lowp_params & (1u << k)))
                continue;
            size_t n = dt_params_info(g->params, v->pidx[k])->count;
            if (!v->w16[k] && !(v->w16[k] = dt_alloc(dt_ac_shadow_bytes(g->prec, n))))
                return DT_ERR_NOMEM;
            dt_ac_shadow_fill(g->prec, v->w[k], n, v->w16[k]);
        }
    }
    return DT_OK;
}

dt_status dt_graph_forward(dt_graph *g, const void *const *inputs, int batch) {
    if (!g || !g->finalized)
        return dt_fail(DT_ERR_STATE, "dt_graph_forward: expected a finalized graph");
    if (batch < 1 || !inputs)
        return dt_fail(DT_ERR_ARG, "dt_graph_forward: expected inputs and batch >= 1, found %d",
                       batch);
    if (g->training && g->keys && g->nkeys != batch)
        return dt_fail(DT_ERR_ARG, "dt_graph_forward: %d sample keys set, batch is %d", g->nkeys,
                       batch);
    DT_TRY(reserve(g, batch));
    DT_TRY(thread_buffers(g));
    DT_TRY(fill_shadows(g));
    g->batch = batch;
    g->split = g->nthreads;
    int ni   = 0;
    for (int i = 0; i < g->nvals; i++) {
        gval *v = &g->vals[i];
        if (!v->layer) {
            v->ext = inputs[ni];
            if (!v->ext)
                return dt_fail(DT_ERR_ARG, "dt_graph_forward: input '%s' is NULL", v->name);
            ni++;
            continue;
        }
        v->fwd_training = g->training;
        node_task k     = {.g = g, .v = v};
        DT_TRACE_BEGIN(tr);
        uint64_t  t0 = g->profile ? dt_now_ns() : 0;
        dt_status st = run_node(&k);
        if (g->profile) {
            v->prof.fwd_s += (double)(dt_now_ns() - t0) * 1e-9;
            v->prof.fwd_flop += v->su.flops_per_sample * batch;
        }
        DT_TRACE_END(tr, "forward", v->layer->ops->kind, "node", i);
        if (st != DT_OK)
            return dt_fail_context("node '%s' (%s) forward", v->name, v->layer->ops->kind);
    }
    return DT_OK;
}

const float *dt_graph_output(const dt_graph *g) {
    return g && g->output >= 0 ? val_data(&g->vals[g->output]) : NULL;
}
const float *dt_graph_node_output(const dt_graph *g, int node) {
    return g && node >= 0 && node < g->nvals ? val_data(&g->vals[node]) : NULL;
}
const float *dt_graph_input_grad(const dt_graph *g, int input) {
    if (!g || !g->input_grad)
        return NULL;
    for (int i = 0, k = 0; i < g->nvals; i++)
        if (!g->vals[i].layer && k++ == input)
            return g->vals[i].written ? g->vals[i].dy : NULL;
    return NULL;
}

static bool wants_grad(const dt_graph *g, const gval *v) {
    if (v->shape.dtype != DT_ELEM_F32)
        return false;
    return v->layer ? true : g->input_grad;
}

// Adds the partials of threads 1.. (in thread order) into the gradient of parameter
// k of node v and clears them.
static void reduce_partials(dt_graph *g, const gval *v, int k) {
    const dt_param_info *info  = dt_params_info(g->params, v->pidx[k]);
    float               *grads = dt_params_grads(g->params) + info->offset;
    for (int t = 1; t < g->split; t++) {
        float *p = g->partial[t] + info->offset;
        dt_nn_accumulate(info->count, p, grads);
        memset(p, 0, sizeof(float) * info->count);
    }
}

dt_status dt_graph_backward(dt_graph *g, const float *dout) {
    if (!g || !g->finalized || g->batch < 1)
        return dt_fail(DT_ERR_STATE, "dt_graph_backward: expected a forward first");
    if (!dout)
        return dt_fail(DT_ERR_ARG, "dt_graph_backward: expected dout, found NULL");
    if (g->split != g->nthreads)
        return dt_fail(DT_ERR_STATE,
                       "dt_graph_backward: the thread count changed since forward (%d, now %d)",
                       g->split, g->nthreads);
    int batch = g->batch;
    for (int i = 0; i < g->nvals; i++)
        g->vals[i].written = false;
    gval *o = &g->vals[g->output];
    memcpy(o->dy, dout, sizeof(float) * val_floats(o, batch));
    o->written = true;
    int np     = dt_params_count(g->params);
    for (int i = g->nvals - 1; i >= 0; i--) {
        gval *v = &g->vals[i];
        if (!v->layer)
            continue;
        if (!v->written) { // feeds nothing that reaches the output: a zero gradient
            memset(v->dy, 0, sizeof(float) * val_floats(v, batch));
            v->written = true;
        }
        node_task k    = {.g = g, .v = v, .backward = true};
        size_t    toff = 0;
        for (int j = 0; j < v->nin; j++) {
            gval *u = &g->vals[v->in[j]];
            if (v->su.no_input_grad || !wants_grad(g, u))
                continue;
            bool taken = u->written;
            for (int q = 0; q < j; q++)
                taken = taken || (v->in[q] == v->in[j] && k.direct[q]);
            if (!taken) {
                k.dx[j]     = u->dy;
                k.direct[j] = true;
            } else {
                k.dx[j] = g->tmp + toff;
                toff += val_floats(u, batch);
            }
        }
        DT_TRACE_BEGIN(tr);
        uint64_t  t0 = g->profile ? dt_now_ns() : 0;
        dt_status st = run_node(&k);
        if (g->profile) { // the weight gradient and the input gradient: a forward each
            bool dx = false;
            for (int j = 0; j < v->nin; j++)
                dx = dx || k.dx[j];
            v->prof.bwd_s += (double)(dt_now_ns() - t0) * 1e-9;
            v->prof.bwd_flop += v->su.flops_per_sample * batch * ((v->su.nparams > 0) + dx);
        }
        DT_TRACE_END(tr, "backward", v->layer->ops->kind, "node", i);
        if (st != DT_OK)
            return dt_fail_context("node '%s' (%s) backward", v->name, v->layer->ops->kind);
        for (int j = 0; j < v->nin; j++)
            if (k.dx[j])
                g->vals[v->in[j]].written = true;
        bool split = splittable(v) && g->split > 1;
        for (int q = 0; q < v->su.nparams; q++) {
            if (split)
                reduce_partials(g, v, q);
            int t = v->pidx[q];
            if (g->first_user[t] != i || t >= np)
                continue;
            const dt_param_info *info = dt_params_info(g->params, t);
            DT_TRY(dt_params_grad_ready(g->params, info->offset, info->count));
        }
    }
    return DT_OK;
}

// ------------------------------------------------------------------------ losses

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
    if (!logits || !target || !loss || n < 1 || k < 1 ||
        !(label_smoothing >= 0.0f && label_smoothing <= 1.0f))
        return dt_fail(DT_ERR_ARG,
                       "dt_loss_cross_entropy_ex: expected logits, targets, n, k >= 1 "
                       "and label smoothing in [0, 1], found n %d k %d ls %g",
                       n, k, (double)label_smoothing);
    return dt_nn_cross_entropy(n, k, logits, target, ignore_index, label_smoothing, loss, dlogits);
}
