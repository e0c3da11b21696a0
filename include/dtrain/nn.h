// nn.h: layers with explicit forward and backward, losses, and the Sequential model.
//
// A model is a chain of layers whose shapes are inferred from the per-sample input
// shape given at creation: the one-liner for what graph.h builds in general. It is a
// dt_graph underneath, one node per layer named by its index, so it runs on the
// graph's engine: its fusion of conv2d + relu (+ maxpool2d), threads, gradient shards
// and precision (docs/graph.md, "Sequential models"). All parameters live in one contiguous float
// buffer and all gradients in another, in registration order (layer by layer, weight then bias), so
// an optimizer updates one buffer, a broadcast is one call, and gradient buckets are
// slices of the gradient buffer (DESIGN.md, "Flat parameters").
//
// Tensors are row-major (B, C, H, W) per batch; a flat layer input is (B, F).
// Semantics and initialisation follow PyTorch's torch.nn modules of the same name.
//
//     dt_model *m;  dt_model_new(&m, 1, 28, 28);
//     dt_model_add_conv2d(m, 16, 3, 1, 0);  dt_model_add_relu(m);  ...
//     dt_model_finalize(m, seed);
//     dt_model_forward(m, x, batch);                    // x: (B, 1, 28, 28)
//     dt_loss_nll(dt_model_output(m), y, batch, 10, &loss, dlogp);
//     dt_model_zero_grad(m);  dt_model_backward(m, dlogp);  optimizer step ...
#ifndef DTRAIN_NN_H
#define DTRAIN_NN_H

#include "dtrain/core.h"
#include "dtrain/params.h"
#include "dtrain/rng.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dt_model dt_model;

// A model's parameter tensors are described by dt_param_info (params.h): names follow
// PyTorch's nn.Sequential state_dict keys, "<layer index>.weight", "<layer index>.bias";
// biases carry DT_PARAM_NO_DECAY. dt_model_set_grad_hook's function is called during
// dt_model_backward, on the calling thread, each time the gradients of one layer are
// final: ranges arrive in decreasing offset order (last layer first).

// ------------------------------------------------------------------ building a model

// A new empty model taking per-sample inputs of shape (c, h, w); use (f, 1, 1) for
// flat inputs, into *out (free with dt_model_free); *out stays NULL on failure
// (DT_ERR_ARG for a shape that is not positive). A model has no options: they are
// its layers.
DT_API dt_status dt_model_new(dt_model **out, int c, int h, int w);
DT_API void      dt_model_free(dt_model *m); // NULL-safe

// Layers, appended in order. Each checks its input shape and fails with DT_ERR_ARG
// naming the layer, the shape it expected and the shape it found.
// Conv2d: square kernel, stride and zero padding; in_channels inferred. PyTorch
// nn.Conv2d(in, out, kernel, stride, padding).
DT_API dt_status dt_model_add_conv2d(dt_model *m, int out_channels, int kernel, int stride,
                                     int padding);
// Linear on a flat input (after flatten): y = x W^T + b, W (out, in). nn.Linear.
DT_API dt_status dt_model_add_linear(dt_model *m, int out_features);
// Max pooling, square window, no padding; stride 0 means stride = kernel. nn.MaxPool2d.
DT_API dt_status dt_model_add_maxpool2d(dt_model *m, int kernel, int stride);
DT_API dt_status dt_model_add_relu(dt_model *m);
// Element-wise dropout with probability p in [0, 1): kept values are scaled by 1/(1-p)
// in training, identity in evaluation. nn.Dropout.
DT_API dt_status dt_model_add_dropout(dt_model *m, float p);
// Channel dropout: zeroes whole (H, W) channels with probability p. nn.Dropout2d.
DT_API dt_status dt_model_add_dropout2d(dt_model *m, float p);
// (C, H, W) -> (C*H*W). nn.Flatten.
DT_API dt_status dt_model_add_flatten(dt_model *m);
// Log-softmax over the features of a flat input. nn.LogSoftmax(dim=1).
DT_API dt_status dt_model_add_log_softmax(dt_model *m);

// Allocates the flat parameter and gradient buffers and initialises parameters as
// PyTorch does by default: weights kaiming-uniform with a = sqrt(5) (that is, uniform
// in +-1/sqrt(fan_in)), biases uniform in +-1/sqrt(fan_in), drawn from a Philox stream
// split from `seed` per parameter tensor. After this no layer can be added.
DT_API dt_status dt_model_finalize(dt_model *m, uint64_t seed);

// ----------------------------------------------------------------------- inspecting

DT_API size_t               dt_model_num_params(const dt_model *m); // floats
DT_API int                  dt_model_num_param_tensors(const dt_model *m);
DT_API const dt_param_info *dt_model_param_info(const dt_model *m, int i);
DT_API float               *dt_model_params(dt_model *m); // the flat parameter buffer
DT_API float               *dt_model_grads(dt_model *m);  // the flat gradient buffer
// The model as a provider of the parameter contract (params.h): its tables and buffers,
// owned by the model (NULL before dt_model_finalize). Backward reports each layer's
// gradients to the consumers registered on it (DDP), as the hook above.
DT_API dt_params *dt_model_as_params(dt_model *m);
// The graph the model runs on (graph.h; NULL before finalize), e.g. for an executor on
// another device (exec.h). Owned by the model.
DT_API struct dt_graph *dt_model_graph(dt_model *m);
// The graph node that does layer `layer`'s work (after finalize), or -1 for a layer
// fused into another's node (a ReLU or pool after a convolution).
DT_API int dt_model_layer_node(const dt_model *m, int layer);
DT_API int dt_model_num_layers(const dt_model *m);
// "conv2d", "linear", ...; NULL when out of range.
DT_API const char *dt_model_layer_kind(const dt_model *m, int layer);
// Per-sample output size of the last layer (the number of classes for a classifier).
DT_API size_t dt_model_output_size(const dt_model *m);
DT_API size_t dt_model_input_size(const dt_model *m);
// The per-sample input shape (c, h, w) given to dt_model_new; any pointer may be NULL.
DT_API void dt_model_input_shape(const dt_model *m, int *c, int *h, int *w);
// Forward FLOPs per sample (multiply-add = 2), for throughput reports.
DT_API double dt_model_flops_per_sample(const dt_model *m);
// Forward + backward FLOPs per sample: three times the forward of each layer
// (output, weight gradient, input gradient) except the first, whose input gradient
// is not computed. About 18.1 MFLOP for the seed's ConvNet (1.085 TFLOP an epoch).
DT_API double dt_model_train_flops_per_sample(const dt_model *m);
// Writes a one-line-per-layer description ("0 conv2d (1,28,28) -> (16,26,26) 160 params").
DT_API void dt_model_describe(const dt_model *m, char *buf, size_t n);

// -------------------------------------------------------------------------- running

// Number of threads that split each batch between them (default 1). The calling
// thread is one of them. Results do not depend on timing; they depend on the thread
// count only through float rounding of summed weight gradients.
DT_API dt_status dt_model_set_threads(dt_model *m, int threads);
// Gradient shards, for results that do not depend on how a batch is split (DESIGN.md,
// "World-size invariance"). 0 (the default): threads sum their partial gradients, so
// the thread count changes the rounding. 1 <= S <= 64: sample s of a batch belongs to
// shard s % S; each shard's gradient is summed over its samples in increasing order,
// then the shards are combined by a fixed tree (shard k with k + h for h = the largest
// power of two below S, then h/2, ..., 1: core/tree.h) before being added into the
// gradient buffer. Gradients are then bitwise the same for any thread count. Across
// processes: one process with S = V and N processes with S = V/N each, batch B/N and a
// DistributedSampler, plus a DDP that continues the tree over ranks
// (dt_ddp_opts.tree_reduce), give bitwise the same averaged gradients when N divides V
// and is a power of two or V itself (V = 6: 1, 2 and 6 processes; V = 3: 1 and 3), the
// latter when each rank's loss divides by the global batch and DDP sums the ranks
// (dt_loss_nll_over, dt_ddp_set_sum; the trainer's dt_trainer_loss_over). Threads share
// the work of a convolution's weight gradient by shards, so S should be at least the
// thread count. DT_ERR_ARG for other values; DT_ERR_NOMEM (S parameter-sized buffers).
DT_API dt_status dt_model_set_grad_shards(dt_model *m, int shards);
DT_API int       dt_model_grad_shards(const dt_model *m);
// Mixed precision (torch.autocast; graph.h's dt_graph_set_precision): in DT_PREC_BF16
// or DT_PREC_FP16 the convolutions and linear layers multiply 16-bit operands with fp32
// accumulation (convolutions on the im2col path); parameters, gradients, dropout,
// log-softmax and the loss stay fp32. Weights are rounded into a shadow copy once per
// forward. With gradient shards the linear layers' weight gradients stay fp32 (the
// shards' fixed tree); the bitwise thread invariance is only promised in fp32. After
// dt_model_finalize, between steps. DT_ERR_ARG for an unknown mode.
DT_API dt_status    dt_model_set_precision(dt_model *m, dt_precision p);
DT_API dt_precision dt_model_precision(const dt_model *m);
// Training mode (dropout active; the default) or evaluation mode.
DT_API void dt_model_train(dt_model *m, bool training);
// The random stream of the dropout masks. Sample i of the batch in layer l draws from
// split(split(rng, l), key_i), key_i being the sample's key (below) or, when no keys
// are set, its position i in the batch; masks never depend on the thread count.
DT_API void dt_model_set_rng(dt_model *m, const dt_rng *rng);
// Per-sample keys of the next training forwards: keys[i] names sample i of the batch
// (n samples), e.g. its dataset index (dt_batch.indices). Copied. With a stream set per
// epoch and the dataset index as key, a sample's masks are a function of (seed, epoch,
// dataset index, layer) alone, whatever batch, rank or world size it lands in: N
// processes with batch B/N then train the model of one process with batch B (DESIGN.md,
// "World-size invariance"). A training forward whose batch is not n fails with
// DT_ERR_ARG; evaluation ignores the keys. keys NULL (or n 0) clears them (positions
// again). DT_ERR_ARG when n < 0, DT_ERR_NOMEM.
DT_API dt_status dt_model_set_sample_keys(dt_model *m, const uint64_t *keys, int n);
// Makes room for batches up to `batch` samples now (forward does it on demand).
DT_API dt_status dt_model_reserve(dt_model *m, int batch);

// Runs the model on x (batch, input shape). x is borrowed: it must stay valid and
// unchanged until the matching dt_model_backward returns.
DT_API dt_status dt_model_forward(dt_model *m, const float *x, int batch);
// The last forward's output, (batch, dt_model_output_size); valid until the next forward.
DT_API const float *dt_model_output(const dt_model *m);

// Back-propagates dout (batch, output size) of the last forward and ADDS the parameter
// gradients into the gradient buffer (call dt_model_zero_grad first unless accumulating).
DT_API dt_status dt_model_backward(dt_model *m, const float *dout);
DT_API void      dt_model_zero_grad(dt_model *m);
DT_API void      dt_model_set_grad_hook(dt_model *m, dt_grad_ready_fn fn, void *user);
// When on, backward also computes the gradient with respect to the input.
DT_API void         dt_model_set_input_grad(dt_model *m, bool on);
DT_API const float *dt_model_input_grad(const dt_model *m); // (batch, input shape)

// Per-layer timing of forward and backward on the calling thread, for profiles.
DT_API void dt_model_set_profile(dt_model *m, bool on);
// Seconds spent in layer `layer` since profiling was turned on.
DT_API void dt_model_profile(const dt_model *m, int layer, double *fwd_s, double *bwd_s);

// The fp32 GEMM in use, as the kernel table names it: "sgemm: avx512/dtrain" (dtrain's
// own GEMM on the avx512 target's tile).
DT_API const char *dt_blas_info(void);

// --------------------------------------------------------------------------- losses

// Mean negative log-likelihood of logp (batch, classes) log-probabilities for integer
// targets; nn.NLLLoss(reduction="mean"). Writes d loss / d logp into dlogp when not
// NULL. A target outside [0, classes) is DT_ERR_ARG naming the sample and the value.
DT_API dt_status dt_loss_nll(const float *logp, const int32_t *target, int batch, int classes,
                             float *loss, float *dlogp);
// Mean cross-entropy of raw logits (log-softmax + NLL); nn.CrossEntropyLoss.
DT_API dt_status dt_loss_cross_entropy(const float *logits, const int32_t *target, int batch,
                                       int classes, float *loss, float *dlogits);
// The same two losses as the gradient of a mean over `over` samples (over >= batch,
// else DT_ERR_ARG): d loss / d input is each sample's gradient divided by `over`, as if
// the batch were part of a larger one of `over` samples; *loss stays the batch's own mean.
// With `over` the global batch every rank computes each sample's gradient with the same
// divisor whatever the world size (dt_trainer_loss_over), which --invariant needs when a
// world is not a power of two. over = batch is dt_loss_nll and dt_loss_cross_entropy.
DT_API dt_status dt_loss_nll_over(const float *logp, const int32_t *target, int batch, int classes,
                                  int over, float *loss, float *dlogp);
DT_API dt_status dt_loss_cross_entropy_over(const float *logits, const int32_t *target, int batch,
                                            int classes, int over, float *loss, float *dlogits);
// Number of samples whose largest score is the target (ties: the first maximum).
DT_API int dt_count_correct(const float *scores, const int32_t *target, int batch, int classes);

#ifdef __cplusplus
}
#endif
#endif // DTRAIN_NN_H
