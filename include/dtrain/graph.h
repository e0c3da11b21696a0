// graph.h: models as graphs of named nodes. Each node applies one layer (layer.h) to
// one or more named inputs: graph inputs or earlier nodes. Nodes can only name what
// exists already, so the order of dt_graph_add is a topological order and the graph is
// acyclic by construction. A residual block adds two nodes, a concatenation takes
// several; an activation read by several nodes (fan-out) gets the sum of their
// gradients; dt_graph_tie makes two nodes share one parameter tensor (a GPT's head and
// its token embedding), whose gradient is the sum of both uses.
//
//     dt_graph *g;  dt_graph_new(&g, NULL);
//     dt_graph_input(g, "x", &(dt_shape){3, {16, 8, 8}});
//     dt_layer *l;
//     dt_layer_conv2d_new(&l, 16, 16, 3, 3, &conv_opts);  dt_graph_add(g, "c1", l, "x");
//     dt_layer_batchnorm2d_new(&l, 16, NULL);             dt_graph_add(g, "bn1", l, "c1");
//     ...
//     dt_layer_add_new(&l, NULL);                         dt_graph_add(g, "sum", l, "bn2", "x");
//     dt_graph_finalize(g, seed);      // dt_params: "c1.weight", "bn1.running_mean", ...
//     dt_graph_forward(g, (const void *[]){x}, batch);
//     dt_loss_mse(dt_graph_output(g), t, n, &loss, dout);
//     dt_params_zero_grad(dt_graph_params(g));  dt_graph_backward(g, dout);
//
// The parameters and buffers (BatchNorm running statistics) live in a dt_params
// (params.h): "<node>.<tensor>" in node order, so DDP (dt_ddp_new), optimizers and
// checkpoints (dt_ckpt_save_params) take a graph as they take any provider. Backward
// runs the nodes in reverse and reports each parameter tensor with
// dt_params_grad_ready as soon as its gradient is final: after its node, or for a tied
// tensor after the earliest node using it.
//
// Threads (dt_graph_set_threads): each node's forward and backward splits the batch in
// contiguous ranges of samples, one per thread; threads 1.. add their parameter
// gradients into partial buffers that are summed into the gradient in thread order
// after the node, so results do not depend on timing, and differ between thread counts
// only by float rounding (dt_graph_set_grad_shards removes that too). Layers with
// batch-wide state (BatchNorm) run whole on the calling thread.
//
// nn.h's Sequential dt_model is a graph of this kind underneath (docs/graph.md).
#ifndef DTRAIN_GRAPH_H
#define DTRAIN_GRAPH_H

#include "dtrain/layer.h"
#include "dtrain/params.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dt_graph dt_graph;

#define DT_GRAPH_NAME_MAX 47 // bytes of a node or input name

typedef struct dt_graph_opts {
    int  max_nodes; // 0: 1024
    bool no_fusion; // keep every node as added (default false: dt_graph_finalize fuses
                    // Conv2d -> ReLU -> MaxPool2d(2), see there)
} dt_graph_opts;
DT_API dt_graph_opts dt_graph_opts_default(void);

DT_API dt_status dt_graph_new(dt_graph **out, const dt_graph_opts *opts);
DT_API void      dt_graph_free(dt_graph *g); // NULL-safe; frees its layers

// A graph input of per-sample shape `shape` (dtype DT_ELEM_F32, or DT_ELEM_I32 for indices).
DT_API dt_status dt_graph_input(dt_graph *g, const char *name, const dt_shape *shape);
// Node `name` applying `layer` (owned by the graph from now on, even on failure) to the
// named inputs, in order. Fails naming the node when an input is unknown, the name is
// taken, or the layer's setup rejects the input shapes.
DT_API dt_status dt_graph_add_node(dt_graph *g, const char *name, dt_layer *layer, int nin,
                                   const char *const *inputs);
#define dt_graph_add(g, name, layer, ...)                                                          \
    dt_graph_add_node((g), (name), (layer),                                                        \
                      (int)(sizeof((const char *[]){__VA_ARGS__}) / sizeof(const char *)),         \
                      (const char *[]){__VA_ARGS__})
// Makes parameter `param` ("head.weight") an alias of `owner` ("wte.weight"), declared
// by an earlier node, before dt_graph_finalize. Shapes must be equal. The tensor keeps
// the owner's name, flags and initialisation; its gradient sums both uses.
DT_API dt_status dt_graph_tie(dt_graph *g, const char *param, const char *owner);
// The node whose output dt_graph_output returns and dt_graph_backward takes a gradient
// for (default: the last node added).
DT_API dt_status dt_graph_set_output(dt_graph *g, const char *node);

// BatchNorm fusion, when the caller asks (finalize's own pass below fuses convolutions),
// after the last dt_graph_add (and any dt_graph_tie) and before dt_graph_finalize: each
// BatchNorm whose output only a ReLU reads becomes one node
// (kind "batchnorm2d_relu"), and each BatchNorm whose output only an Add of two inputs
// reads, whose output only a ReLU reads, becomes one node reading the BatchNorm's input
// and the Add's other input ("batchnorm2d_add_relu": max(0, bn(x) + r)). Same results
// up to float rounding, fewer passes over memory, and no memory for the values in
// between. The fused node takes the ReLU's name (later nodes read it as before) and
// keeps the BatchNorm's tensor names ("<bn>.weight", "<bn>.running_mean"): checkpoints,
// DDP and SyncBatchNorm are unchanged. The BatchNorm and Add nodes are gone (node
// indices after them shift; dt_graph_find of their names gives -1). *fused (may be NULL):
// how many fusions were made. BatchNorms with tied parameters are left alone.
DT_API dt_status dt_graph_fuse(dt_graph *g, int *fused);

// Registers the tensors in a dt_params, allocates it and initialises every layer from
// dt_rng_split(dt_rng_init(seed), l), l the node's position among the layer nodes (0
// for the first dt_graph_add; graph inputs do not count). No node can be added
// afterwards.
//
// First it fuses (unless dt_graph_opts.no_fusion): a Conv2d (square kernel, stride 1,
// equal padding, one group, bias) whose only reader is a ReLU whose only reader is a
// MaxPool2d(2) (2x2, stride 2, no padding; the convolution's output even-sized) becomes
// one node that computes the pooled output straight from the convolution's, without
// writing the full-size output to memory (the kernels of the Sequential dt_model). The
// node keeps the Conv2d's tensors and their names ("conv.weight"), its initialisation
// and position, and takes the pool's name: the values equal the unfused graph's up to
// float rounding (another convolution kernel). The ReLU's name no longer finds a node.
// DT_NO_POOL_FUSION=1 leaves such nodes apart too. (A dt_model's conv2d -> relu
// (-> maxpool2d) layers fuse the same way.)
DT_API dt_status dt_graph_finalize(dt_graph *g, uint64_t seed);

DT_API dt_params  *dt_graph_params(dt_graph *g); // NULL before finalize
DT_API int         dt_graph_num_nodes(const dt_graph *g);
DT_API const char *dt_graph_node_name(const dt_graph *g, int node);
DT_API const char *dt_graph_node_kind(const dt_graph *g, int node);
// Index of the node named `name`, or -1.
DT_API int dt_graph_find(const dt_graph *g, const char *name);
// Per-sample output shape of a node (-1: the output node).
DT_API const dt_shape *dt_graph_node_shape(const dt_graph *g, int node);

// Training (dropout on, BatchNorm batch statistics; the default) or evaluation.
DT_API void dt_graph_train(dt_graph *g, bool training);
// The dropout stream: the l-th layer node (as above), sample s, draws from
// split(split(rng, l), key_s), key_s the sample's key (below) or its position: what
// layer l of a dt_model draws (dt_model_set_rng / _set_sample_keys), so a chain of
// nodes draws the masks of the Sequential model it mirrors.
DT_API void      dt_graph_set_rng(dt_graph *g, const dt_rng *rng);
DT_API dt_status dt_graph_set_sample_keys(dt_graph *g, const uint64_t *keys, int n);
// Threads that split each batch (default 1; the calling thread is one of them). Set it
// between steps, not between a forward and its backward.
DT_API dt_status dt_graph_set_threads(dt_graph *g, int threads);
DT_API int       dt_graph_threads(const dt_graph *g);
// Mixed precision (torch.autocast): in DT_PREC_BF16 or DT_PREC_FP16, Linear and Conv2d
// multiply 16-bit operands with fp32 accumulation (docs/precision.md); parameters,
// gradients, norms, softmax, attention and losses stay fp32. Each forward first rounds
// the Linear/Conv2d weights into shadow copies (once per forward, shared by all threads
// and by the backward). fp16 needs loss scaling (optim.h's dt_grad_scaler). Set it
// between steps; DT_ERR_ARG for an unknown mode.
DT_API dt_status    dt_graph_set_precision(dt_graph *g, dt_precision p);
DT_API dt_precision dt_graph_precision(const dt_graph *g);
// Per-node profile (the trainer's --profile): with `on`, every forward and backward adds
// each node's wall time (as the calling thread sees it: a node split over threads counts
// once) and the floating-point operations its layer declares (setup's flops_per_sample
// per sample in forward; in backward once for the parameters' gradient and once for
// the inputs', where each is computed). Turning it on or off clears the sums.
typedef struct dt_graph_profile {
    double fwd_s, bwd_s;       // seconds
    double fwd_flop, bwd_flop; // operations (a multiply-add is 2; 0: the layer did not say)
    char   kernel[64];         // a built-in layer's forward kernel on this CPU ("conv2d fwd:
                               // avx2/direct"), "" for a user's layer
} dt_graph_profile;
DT_API void      dt_graph_set_profile(dt_graph *g, bool on);
DT_API dt_status dt_graph_node_profile(const dt_graph *g, int node, dt_graph_profile *out);
// Whether backward also computes the gradients of the graph's float inputs.
DT_API void dt_graph_set_input_grad(dt_graph *g, bool on);
// Gradient shards, for gradients that do not depend on how a batch is split (nn.h's
// dt_model_set_grad_shards says what for): 0 (the default) off; 1 <= S <= 64: sample s
// of a batch belongs to shard s % S, each shard's parameter gradient is summed over its
// samples in increasing order, and the shards are combined by a fixed tree (shard k
// with k + h for h = the largest power of two below S, then h/2, ..., 1) before being
// added to the gradient, so it is bitwise the same for any thread count, and with a
// DDP that continues the tree over ranks (dt_ddp_opts.tree_reduce), for a world of N
// ranks with S/N shards each when N is a power of two or S itself (the latter with the
// loss divided by the global batch and the ranks summed: train.h, dt_trainer_loss_over). Layers are
// called once per sample in backward then (a dt_model's in one call per shard), so the invariance
// is that of the layers' per-sample arithmetic: exact for a dt_model's layers; for a graph's own,
// as long as a sample's forward and input gradient do not depend on the other samples of a call
// (BatchNorm's do; a GEMM library may round differently for another number of rows). A parameter
// used by several nodes (dt_graph_tie) gets each node's tree in turn: thread-invariant, not
// world-size invariant. Between steps; DT_ERR_ARG for other values.
DT_API dt_status dt_graph_set_grad_shards(dt_graph *g, int shards);
DT_API int       dt_graph_grad_shards(const dt_graph *g);
// The first node whose output for a sample depends on the other samples of the batch
// (BatchNorm's statistics: dt_layer_setup.batch_coupled), or -1. Gradient shards keep
// such a model's gradient deterministic for a thread count but cannot make it
// independent of how the batch is split; the trainer's --invariant refuses it.
DT_API int dt_graph_batch_coupled(const dt_graph *g);
// Makes room for batches up to `batch` samples now (forward does it on demand).
DT_API dt_status dt_graph_reserve(dt_graph *g, int batch);

// Runs the graph on one buffer per graph input (in dt_graph_input order; float or
// int32 as declared), each (batch, shape). Inputs are borrowed until backward returns.
DT_API dt_status dt_graph_forward(dt_graph *g, const void *const *inputs, int batch);
// The output node's (or any node's) output of the last forward, (batch, shape).
DT_API const float *dt_graph_output(const dt_graph *g);
DT_API const float *dt_graph_node_output(const dt_graph *g, int node);
// Back-propagates dout (batch, output shape) and ADDS the parameter gradients into the
// dt_params gradient buffer (zero it first unless accumulating).
DT_API dt_status dt_graph_backward(dt_graph *g, const float *dout);
// Gradient of graph input i of the last backward (with dt_graph_set_input_grad).
DT_API const float *dt_graph_input_grad(const dt_graph *g, int input);

// ------------------------------------------------------------------ pipeline support
// (pipe.h builds on these; a user rarely calls them.)

// A new graph of nodes first..last (positions in dt_graph_add order, graph inputs
// counted) of `whole`, which must not be finalized: their layers MOVE to it (`whole`
// can then only be extracted from again, over other nodes, or freed). Values the range
// reads from before `first` become its inputs (same names and shapes, in the order of
// their first reader); graph inputs inside the range stay inputs. The output is the
// range's last node. Nodes keep their layer positions, so dt_graph_finalize with the
// same seed initialises them as `whole` would have, and dropout draws the same masks.
// A parameter tied to a node before the range becomes a tensor of its own, named as its
// owner ("wte.weight"), initialised by its own node: the pipeline copies the owner's
// values into it and sums the two gradients (pipe.h).
DT_API dt_status dt_graph_extract(dt_graph **out, dt_graph *whole, int first, int last);
// The ties (dt_graph_tie) of a graph, in node order: tie t's owner tensor name
// (DT_PARAM_NAME_MAX + 1 bytes), the owner's node and the tied node.
DT_API int       dt_graph_num_ties(const dt_graph *g);
DT_API dt_status dt_graph_tie_at(const dt_graph *g, int t, char *owner, int *owner_node,
                                 int *param_node);

// The table of tensors dt_graph_finalize registers (or registered), without storage:
// names, shapes, flags, each tensor's node (dt_param_info.layer) and its tensor-parallel
// split, in the same order, ties once; buffers too. Works before finalize (a whole
// model's layout before it is cut into stages). whole: the unsplit shapes of split
// tensors (dt_param_info.split still says which part this graph's layer holds).
// Free with dt_params_free.
DT_API dt_status dt_graph_param_table(const dt_graph *g, bool whole, dt_params **out);

// Per-node timing (pipeline balancing measures layer cost with it): on, every forward
// and backward adds each node's seconds to its counters (off: none kept; on again:
// reset to 0). dt_graph_node_seconds reads them (0 when off). The seconds are this
// process's CPU time (every thread's) during the node: what the node costs, which other
// jobs on the machine do not inflate; with one thread and an idle machine, its wall time.
DT_API dt_status dt_graph_set_timing(dt_graph *g, bool on);
DT_API void dt_graph_node_seconds(const dt_graph *g, int node, double *forward, double *backward);

// Activation slots: n sets of the values and saved state a forward leaves for its
// backward (default 1). dt_graph_use_slot(g, s) selects the set the next forward writes
// and the next backward reads (with its batch and sample keys), so several forwards
// (micro-batches) can wait for their backwards. Gradients of the values stay shared:
// backwards run one at a time. The buffers are sized by the first forward after
// dt_graph_set_slots, for all slots at once: run the largest batch first (a larger one
// later reallocates and loses the slots' values). After dt_graph_finalize.
DT_API dt_status dt_graph_set_slots(dt_graph *g, int n);
DT_API dt_status dt_graph_use_slot(dt_graph *g, int slot);

// ----------------------------------------------------------------- description
// What a node computes, as plain data: how another executor (a GPU's, device.h and
// exec.h) runs a finalized graph without knowing its layers' code. Every built-in
// layer is described, under one canonical kind whichever way it was built (a
// Sequential model's layers and a graph's own alike):
//   "input"               a graph input (no layer)
//   "conv2d"              h.conv; relu and pool2 say whether a ReLU and a 2x2 stride-2
//                         max pool follow inside the node (the fused Sequential kinds
//                         "conv2d+relu", "conv2d+relu+maxpool2d" and the graph's fusion)
//   "linear"              h.linear, over the last dimension (a Sequential Linear: over
//                         the whole flattened sample)
//   "relu" "gelu" "gelu_tanh" "tanh" "sigmoid" "silu"   element-wise
//   "softmax" "log_softmax"   over the last dimension (log_softmax: the Sequential's)
//   "dropout" "dropout2d" h.dropout.p; dropout2d drops whole channels of (c, h, w)
//   "maxpool2d" "avgpool2d"   h.pool (no padding and ties to the first maximum in a
//                         Sequential max pool; a graph's max pool may pad)
//   "adaptive_avgpool2d"  the output shape says the size
//   "flatten"             a copy to (numel)
//   "batchnorm"           h.bn: 1d on (c) or (c, l), 2d on (c, h, w); relu and residual
//                         for dt_graph_fuse's forms (inputs x and the residual r)
//   "layernorm"           h.ln, over the last dimension
//   "embedding"           h.emb; int32 input
//   "attention"           h.attn: causal multi-head on packed (T, 3C) q|k|v
//   "add"                 the sum of its inputs
//   "concat"              h.concat.dim
// params / buffers index the graph's dt_params tables (params.h) in the layer's order
// (weight, bias; BatchNorm's running_mean, running_var); a tied parameter gives its
// owner's index, so two nodes name one tensor. layer_no is the node's position among
// the layer nodes: its dropout stream is split(rng, layer_no) (dt_graph_set_rng).
typedef struct dt_node_desc {
    char        kind[24];
    const char *name; // the node's (borrowed from the graph)
    int         nin;
    int         in[DT_LAYER_MAX_INPUTS]; // the nodes it reads (graph inputs are nodes)
    dt_shape    in_shape[DT_LAYER_MAX_INPUTS], out_shape; // per sample
    int         layer_no;                                 // -1 for an input
    int         nparams, nbuffers;
    int         params[DT_LAYER_MAX_TENSORS], buffers[DT_LAYER_MAX_TENSORS];
    union {
        struct {
            int  cin, cout, kh, kw, sh, sw, ph, pw, groups;
            bool bias, relu, pool2;
        } conv;
        struct {
            int  in, out;
            bool bias;
        } linear;
        struct {
            int kh, kw, sh, sw, ph, pw;
        } pool;
        struct {
            float p;
        } dropout;
        struct {
            float eps, momentum;
            bool  affine, relu, residual;
            bool  sync; // a SyncBatchNorm (statistics reduced over a group)
        } bn;
        struct {
            float eps;
            bool  affine;
        } ln;
        struct {
            int num, d;
        } emb;
        struct {
            int heads;
        } attn;
        struct {
            int dim;
        } concat;
    } h;
} dt_node_desc;

// Node i's description (after dt_graph_finalize; the node indices of dt_graph_find).
// DT_ERR_UNSUPPORTED naming the node and its kind for a layer that is not built in (a
// user's own, a tensor-parallel shard): nothing but its code knows what it computes.
// DT_ERR_ARG for i out of range, DT_ERR_STATE before finalize.
DT_API dt_status dt_graph_describe(const dt_graph *g, int i, dt_node_desc *out);
// The output node (dt_graph_set_output; default the last), -1 before finalize.
DT_API int dt_graph_output_node(const dt_graph *g);

// --------------------------------------------------------------------------- losses
// Over a graph's output: each returns the mean loss in *loss and writes d loss / d x
// into dx when not NULL (PyTorch's reduction='mean').
DT_API dt_status dt_loss_mse(const float *x, const float *t, size_t n, float *loss, float *dx);
DT_API dt_status dt_loss_l1(const float *x, const float *t, size_t n, float *loss, float *dx);
DT_API dt_status dt_loss_bce_logits(const float *x, const float *t, size_t n, float *loss,
                                    float *dx);
// nn.CrossEntropyLoss(ignore_index, label_smoothing) over logits (n, k).
DT_API dt_status dt_loss_cross_entropy_ex(const float *logits, const int32_t *target, int n, int k,
                                          int ignore_index, float label_smoothing, float *loss,
                                          float *dlogits);

#ifdef __cplusplus
}
#endif
#endif // DTRAIN_GRAPH_H
