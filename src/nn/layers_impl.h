// layers_impl.h: helpers shared by the built-in layers (layers.c, layers_misc.c).
#ifndef DTRAIN_NN_LAYERS_IMPL_H
#define DTRAIN_NN_LAYERS_IMPL_H

#include "dtrain/layer.h"
#include "nn/ops.h"

// A layer of `ops` with a dt_alloc'ed copy of cfg (size bytes).
dt_status lay_new(dt_layer **out, const dt_layer_ops *ops, const void *cfg, size_t size);
// Fills a tensor declaration; dims past ndim are ignored.
void lay_tensor(dt_layer_tensor *t, const char *name, uint32_t flags, int ndim, int64_t d0,
                int64_t d1, int64_t d2, int64_t d3);
// DT_ERR_ARG naming `kind` unless there are want_nin float inputs of ndim_lo..ndim_hi dims.
dt_status lay_expect(const char *kind, int nin, const dt_shape *in, int want_nin, int ndim_lo,
                     int ndim_hi);

// What the graph's fusion pass (graph_pass.c) asks of a node's layer: whether it is the
// built-in Conv2d (then its configuration), ReLU, or MaxPool2d (then its window).
bool lay_as_conv2d(const dt_layer *l, dt_nn_conv2d *p);
bool lay_is_relu(const dt_layer *l);
bool lay_as_maxpool2d(const dt_layer *l, dt_nn_avgpool2d *p);

#endif // DTRAIN_NN_LAYERS_IMPL_H
