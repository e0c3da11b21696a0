// graph_desc.c: dt_graph_describe (graph.h), a finalized graph's nodes as plain data
// for executors that run it elsewhere (the CUDA executor, src/cuda/exec*.c). The
// Sequential model's layers (seq.h) are described here from their nn_layer; the
// graph's own built-in layers describe themselves (layers_impl.h's lay_describe_*),
// next to their private configurations.
#include "nn/graph_impl.h"
#include "nn/layers_impl.h"
#include "nn/seq.h"

#include <stdio.h>
#include <string.h>

// A Sequential node: its nn_layer's kind and hyper-parameters.
static bool describe_seq(const dt_layer *l, dt_node_desc *d) {
    const nn_layer *nl   = dt_seq_nn(l);
    const char     *kind = nl->ops->kind;
    if (nl->ops == &dt_nn_conv2d_ops) {
        kind      = "conv2d";
        d->h.conv = (__typeof__(d->h.conv)){
            nl->in.c, nl->out_c, nl->k, nl->k, nl->stride,    nl->stride,
            nl->pad,  nl->pad,   1,     true,  nl->fuse_relu, nl->pool != NULL};
    } else if (nl->ops == &dt_nn_linear_ops) {
        d->h.linear.in   = (int)nn_shape_size(nl->in);
        d->h.linear.out  = nl->out_c;
        d->h.linear.bias = true;
    } else if (nl->ops == &dt_nn_maxpool2d_ops) {
        int s     = nl->stride ? nl->stride : nl->k;
        d->h.pool = (__typeof__(d->h.pool)){nl->k, nl->k, s, s, 0, 0};
    } else if (nl->ops == &dt_nn_dropout_ops || nl->ops == &dt_nn_dropout2d_ops) {
        d->h.dropout.p = nl->p;
    } else if (nl->ops != &dt_nn_relu_ops && nl->ops != &dt_nn_flatten_ops &&
               nl->ops != &dt_nn_log_softmax_ops) {
        return false;
    }
    snprintf(d->kind, sizeof d->kind, "%s", kind);
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
    const dt_layer *l  = v->layer;
    bool            ok = v->seq ? describe_seq(l, d)
                                : lay_describe_core(l, d) || lay_describe_bn(l, d) || lay_describe_misc(l, d);
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
