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

static inline nn_layer *dt_seq_nn(const dt_layer *l) {
    return &((seq_cfg *)l->config)->nl;
}

// The fusion of a graph's Conv2d (square kernel, equal strides and paddings, one group,
// a bias) with the ReLU after it, and with the 2x2 stride-2 max pool after that when
// `pool` (stride 1, even output): a node taking over `conv` (which initialises the
// parameters, so the values are the Conv2d's). *out NULL on failure; conv is then
// still the caller's.
dt_status dt_seq_from_conv(dt_layer **out, dt_layer *conv, const dt_nn_conv2d *p, bool pool);
#endif // DTRAIN_NN_SEQ_H
