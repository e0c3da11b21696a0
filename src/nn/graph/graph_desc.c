// graph_desc.c: dt_graph_describe (graph.h), a finalized graph's nodes as plain data
// for executors that run it elsewhere (the CUDA executor, src/cuda/exec*.c). The
// built-in layers describe themselves (layers_impl.h's lay_describe_*), next to their
// private configurations; a fused convolution is its Conv2d's description with the
// ReLU and pool it applies.
#include "nn/graph/graph_impl.h"
#include "nn/layers/conv_fused.h"
#include "nn/layers/layers_impl.h"

#include <stdio.h>
#include <string.h>

// A fused Conv2d + ReLU (+ 2x2 max pool): its Conv2d's description, with the ReLU
// (and the pool) it applies.
static bool describe_fused(const dt_layer *l, dt_node_desc *d) {
    if (!dt_fused_is(l) || !lay_describe_core(dt_fused_conv(l), d))
        return false;
    d->h.conv.relu  = true;
    d->h.conv.pool2 = dt_fused_pools(l);
    return true;
}

dt_status dt_graph_describe(const dt_graph *g, int i, dt_node_desc *out) {
    if (!g || !out)
        return dt_fail(DT_ERR_ARG, "dt_graph_describe: expected a graph and an output");
    if (!g->finalized)
        return dt_fail(DT_ERR_STATE, "dt_graph_describe: expected a finalized graph");
    if (i < 0 || i >= g->nvals)
        return dt_fail(DT_ERR_ARG, "dt_graph_describe: no node %d (the graph has %d)", i, g->nvals);
    const gval   *v = &g->vals[i];
    dt_node_desc *d = out;
    memset(d, 0, sizeof *d);
    d->name      = v->name;
    d->out_shape = v->shape;
    d->layer_no  = v->layer ? v->layer_no : -1;
    d->nin       = v->nin;
    for (int k = 0; k < v->nin; k++) {
        d->in[k]       = v->in[k];
        d->in_shape[k] = g->vals[v->in[k]].shape;
    }
    if (!v->layer) {
        snprintf(d->kind, sizeof d->kind, "input");
        return DT_OK;
    }
    d->nparams  = v->su.nparams;
    d->nbuffers = v->su.nbuffers;
    for (int k = 0; k < v->su.nparams; k++)
        d->params[k] = v->pidx[k];
    for (int k = 0; k < v->su.nbuffers; k++)
        d->buffers[k] = v->bidx[k];
    const dt_layer *l = v->layer;
    bool ok = describe_fused(l, d) || lay_describe_core(l, d) || lay_describe_linear(l, d) ||
              lay_describe_bn(l, d) || lay_describe_misc(l, d);
    if (!ok)
        return dt_fail(DT_ERR_UNSUPPORTED,
                       "node '%s': layer kind \"%s\" is not a built-in layer, so only its own code "
                       "can run it",
                       v->name, l->ops->kind);
    return DT_OK;
}

int dt_graph_output_node(const dt_graph *g) {
    return g && g->finalized ? g->output : -1;
}
