// layers_impl.h: helpers shared by the built-in layers (src/nn/layers).
#ifndef DTRAIN_NN_LAYERS_IMPL_H
#define DTRAIN_NN_LAYERS_IMPL_H

#include "dtrain/graph.h"
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
// An embedding's input check and output shape: one int32 input of token ids with room
// for one more dimension (DT_ERR_ARG naming `kind` otherwise); *out is its shape with d
// floats per id.
dt_status lay_expect_tokens(const char *kind, int nin, const dt_shape *in, int d, dt_shape *out);

// What the graph's fusion passes (graph_pass.c) ask of a node's layer: whether it is
// the built-in Conv2d (then its configuration), ReLU, MaxPool2d (then its window),
// BatchNorm (1d or 2d) or Add.
bool lay_as_conv2d(const dt_layer *l, dt_nn_conv2d *p);
bool lay_is_relu(const dt_layer *l);
bool lay_as_maxpool2d(const dt_layer *l, dt_nn_avgpool2d *p);
bool lay_is_batchnorm(const dt_layer *l);
bool lay_is_add(const dt_layer *l);
// dt_graph_fuse's layer made from a BatchNorm: its fusion with a ReLU after it
// (residual false: y = max(0, bn(x))) or with an Add of a second input and a ReLU
// (residual true: y = max(0, bn(x) + r), inputs x and r). The BatchNorm keeps its
// options, SyncBatchNorm's reducer included.
dt_status lay_bn_fused_new(dt_layer **out, const dt_layer *bn, bool residual);
// dt_graph_describe (graph_desc.c): the built-in layers of each file fill in their
// kind and hyper-parameters (graph.h's dt_node_desc); false for any other layer.
bool lay_describe_core(const dt_layer *l, dt_node_desc *d);   // layers.c
bool lay_describe_linear(const dt_layer *l, dt_node_desc *d); // linear.c
bool lay_describe_bn(const dt_layer *l, dt_node_desc *d);     // batchnorm.c
bool lay_describe_misc(const dt_layer *l, dt_node_desc *d);   // misc.c
// The kernel a built-in layer's forward runs on this CPU's table, for --profile
// ("conv2d fwd: avx2/direct", "linear: avx512/shifted"); "" for a user's layer. in: its
// first input's per-sample shape. kernel_name.c.
const char *lay_kernel_name(const dt_layer *l, const dt_shape *in, char *buf, size_t n);
bool        lay_linear_direct(const dt_layer *l); // linear.c: on the shifted tiles

#endif // DTRAIN_NN_LAYERS_IMPL_H
