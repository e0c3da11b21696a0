// conv_fused.h: a Conv2d fused with the ReLU after it, and with the 2x2 stride-2 max
// pool after that (kinds "conv2d+relu", "conv2d+relu+maxpool2d"), which the graph's
// fusion pass (graph_pass.c) makes of a graph's Conv2d. It runs the kernels of
// conv_team.c, which apply the ReLU and the pool while writing the output, as a team
// layer (layer.h's DT_LAYER_TEAM): every thread calls it with the whole batch's buffers
// and its own samples (an nn_ctx made from dt_layer_args.team).
#ifndef DTRAIN_NN_LAYERS_CONV_FUSED_H
#define DTRAIN_NN_LAYERS_CONV_FUSED_H

#include "dtrain/layer.h"
#include "nn/nn_impl.h"
#include "nn/ops.h"

typedef struct fused_cfg {
    nn_layer  nl;   // the layer; a fused conv2d has fuse_relu set, and nl.pool = &pool
    nn_layer  pool; // the fused 2x2/2 max pool
    dt_layer *orig; // fused from a graph's Conv2d layer: it initialises the parameters
} fused_cfg;

static inline nn_layer *dt_fused_nn(const dt_layer *l) {
    return &((fused_cfg *)l->config)->nl;
}

// The fusion of a graph's Conv2d (square kernel, equal strides and paddings, one group,
// a bias) with the ReLU after it, and with the 2x2 stride-2 max pool after that when
// `pool` (stride 1, even output): a node taking over `conv` (which initialises the
// parameters, so the values are the Conv2d's). *out NULL on failure; conv is then
// still the caller's.
dt_status dt_fused_from_conv(dt_layer **out, dt_layer *conv, const dt_nn_conv2d *p, bool pool);
// Whether l is such a fused node; the Conv2d it took over (its configuration describes
// it) and whether it pools.
bool            dt_fused_is(const dt_layer *l);
const dt_layer *dt_fused_conv(const dt_layer *l);
bool            dt_fused_pools(const dt_layer *l);
#endif // DTRAIN_NN_LAYERS_CONV_FUSED_H
