// seq.h: the Sequential model's layers (nn_impl.h: conv2d.c, linear.c, pool2d.c,
// activation.c, dropout.c) as nodes of the model graph.
//
// They are team layers (layer.h's DT_LAYER_TEAM): every thread calls the layer with the
// whole batch's buffers and its own part (an nn_ctx made from dt_layer_args.team: its
// samples s0..s1, its scratch, the pool to meet in), so a layer may split its work
// otherwise (Linear's weight gradient by columns) and sum gradient shards itself. This
// file is the glue: the dt_layer_ops of each kind, initialisation (a Sequential model's
// streams) and the fused kinds the graph's fusion pass makes.
#ifndef DTRAIN_NN_SEQ_H
#define DTRAIN_NN_SEQ_H

#include "dtrain/layer.h"
#include "nn/nn_impl.h"
#include "nn/ops.h"

typedef struct seq_cfg {
    nn_layer  nl;   // the layer; a fused conv2d has fuse_relu set, and nl.pool = &pool
    nn_layer  pool; // the fused 2x2/2 max pool
    dt_layer *orig; // fused from a graph's Conv2d layer: it initialises the parameters
} seq_cfg;

// A node of kind ops (dt_nn_conv2d_ops, ...) with proto's hyper-parameters (out_c, k,
// stride, pad, p; index: the Sequential position, for messages and the streams).
dt_status dt_seq_layer_new(dt_layer **out, const nn_layer_ops *ops, const nn_layer *proto);
bool      dt_seq_is(const dt_layer *l);
static inline nn_layer *dt_seq_nn(const dt_layer *l) {
    return &((seq_cfg *)l->config)->nl;
}

// Fusion (graph_pass.c). A Sequential conv2d absorbs the ReLU after it, and the 2x2
// stride-2 max pool after that when dt_seq_pool_fits (stride 1, even output).
bool      dt_seq_pool_fits(const dt_layer *conv, const dt_layer *pool);
dt_status dt_seq_fuse(dt_layer *conv, const dt_layer *pool);
// The same from a graph's Conv2d (square kernel, stride 1, even padding, one group,
// bias), ReLU and a 2x2/2 max pool: a fused node taking over `conv` (it still
// initialises the parameters, so the values are the graph's). *out NULL on failure;
// conv is then still the caller's.
dt_status dt_seq_from_conv(dt_layer **out, dt_layer *conv, const dt_nn_conv2d *p);

// PyTorch's default initialisation from the streams of Sequential layer `index`
// (weights split(root, 2 index), biases split(root, 2 index + 1)), or the original
// Conv2d's from split(root, index).
void dt_seq_init(const dt_layer *l, const dt_rng *root, int index, float *const *w,
                 float *const *buf);
#endif // DTRAIN_NN_SEQ_H
