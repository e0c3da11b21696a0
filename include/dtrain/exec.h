// exec.h: a finalized model graph run on a device. The executor reads the graph's
// description (graph.h's dt_graph_describe), copies its parameters and buffers to the
// device, and runs forward, the loss, backward and the optimizer's update there; the
// graph keeps the host copies that checkpoints, --save-model and --load use, refreshed
// with dt_exec_pull and sent back with dt_exec_push.
//
//     dt_device *d;  dt_device_get(&d, "cuda:0");
//     dt_exec *x;    dt_exec_new(&x, g, d, NULL);          // parameters to the GPU
//     dt_loss_spec ls = dt_loss_spec_default(DT_LOSS_NLL);
//     per micro-batch:
//         dt_exec_set_rng(x, &epoch_rng);  dt_exec_set_sample_keys(x, keys, n);
//         dt_exec_train_step(x, (const void *[]){images}, labels, n, &ls, &loss);
//     per optimizer step:
//         dt_exec_optim_step(x, opt);   dt_exec_zero_grad(x);
//     dt_exec_pull(x, DT_EXEC_PARAMS | DT_EXEC_BUFFERS, NULL);  // host copies, to save
//
// On the "cpu" device the executor is the graph itself (its forward, backward and the
// optimizer's own step), so a program written against this API runs anywhere. On a GPU
// (the CUDA plugin, docs/gpu.md): a caching allocator holds every buffer, cuBLAS does
// the matrix products (fp32 with TF32 off, so results compare with the CPU's; bf16
// operands under DT_PREC_BF16), the plugin's own kernels the rest; dropout draws the
// CPU's masks (the same Philox streams, keyed by seed, epoch, sample and layer); a
// whole training step can be captured as a CUDA graph and replayed.
#ifndef DTRAIN_EXEC_H
#define DTRAIN_EXEC_H

#include "dtrain/device.h"
#include "dtrain/graph.h"
#include "dtrain/nn.h"
#include "dtrain/optim.h"
#include "dtrain/rng.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dt_exec dt_exec;

// The loss over the graph's output (batch, out): what the trainer's programs use.
typedef enum dt_loss_kind {
    DT_LOSS_NLL,           // nn.NLLLoss on log-probabilities (batch, classes), int32 targets
    DT_LOSS_CROSS_ENTROPY, // nn.CrossEntropyLoss(ignore_index, label_smoothing) on logits
                           // (rows, classes): rows = batch * out numel / classes
    DT_LOSS_MSE,           // nn.MSELoss: float targets of the output's shape
} dt_loss_kind;

typedef struct dt_loss_spec {
    dt_loss_kind kind;
    int          ignore_index;    // cross-entropy: default -100
    float        label_smoothing; // cross-entropy: default 0
    float        grad_scale;      // the loss gradient's factor (fp16's loss scale); default 1
} dt_loss_spec;
DT_API dt_loss_spec dt_loss_spec_default(dt_loss_kind kind);

typedef struct dt_exec_opts {
    int max_batch;           // samples per call at most (0: the first call's batch; a larger
                             // one later re-plans the buffers)
    dt_precision precision;  // the matrix products' operands (default DT_PREC_FP32)
    int          cuda_graph; // capture a training step as a CUDA graph and replay it:
                             // -1 DT_CUDA_GRAPH's choice (default auto: once a batch size
                             // repeats), 0 never, 1 always
} dt_exec_opts;
DT_API dt_exec_opts dt_exec_opts_default(void);

// An executor of finalized graph g (borrowed: it must outlive x) on device d. Copies
// the parameters and buffers there. DT_ERR_UNSUPPORTED naming the node for a layer the
// device cannot run (a user's own layer, a SyncBatchNorm, a tensor-parallel shard).
DT_API dt_status  dt_exec_new(dt_exec **out, dt_graph *g, dt_device *d, const dt_exec_opts *o);
DT_API void       dt_exec_free(dt_exec *x); // NULL-safe
DT_API dt_device *dt_exec_device(const dt_exec *x);
DT_API dt_graph  *dt_exec_graph(const dt_exec *x);
// The parameters on the device: the graph's table bound to the device's storage
// (params.h: dt_params_device_data and _grads for the pointers). On the CPU, the
// graph's own dt_params.
DT_API dt_params *dt_exec_params(dt_exec *x);

// Mode and randomness, as the graph's (dt_graph_train, dt_graph_set_rng,
// dt_graph_set_sample_keys): dropout on in training, and its masks keyed the same way.
DT_API void      dt_exec_train(dt_exec *x, bool training);
DT_API void      dt_exec_set_rng(dt_exec *x, const dt_rng *rng);
DT_API dt_status dt_exec_set_sample_keys(dt_exec *x, const uint64_t *keys, int n);

// Forward over host inputs (one per graph input, in dt_graph_input order, (batch,
// shape) floats or int32). The output stays on the device: dt_exec_output copies it.
DT_API dt_status dt_exec_forward(dt_exec *x, const void *const *inputs, int batch);
DT_API dt_status dt_exec_output(dt_exec *x, float *host, size_t n); // n = batch * out numel
// The loss of the last forward against host targets (int32 classes, or floats for MSE);
// keeps its gradient for dt_exec_backward. *loss (may be NULL: not waited for) is the
// mean loss. DT_ERR_ARG naming the row for a class outside [0, classes).
DT_API dt_status dt_exec_loss(dt_exec *x, const dt_loss_spec *l, const void *targets, float *loss);
// Back-propagates the loss gradient and ADDS the parameter gradients.
DT_API dt_status dt_exec_backward(dt_exec *x);
// All three at once (what a training loop calls): on a GPU one stream of work that a
// CUDA graph can capture.
DT_API dt_status dt_exec_train_step(dt_exec *x, const void *const *inputs, const void *targets,
                                    int batch, const dt_loss_spec *l, float *loss);

// The optimizer's update on the device: o (built over the graph's dt_params) gives the
// rule, its options, the groups' learning rates and weight decays (a schedule's too)
// and counts the step; its state lives on the device from the first step (dt_exec_pull
// with DT_EXEC_OPTIM brings it back into o). SGD, Adam, AdamW and Adadelta, in PyTorch's
// order of operations as the CPU's (a sharded optimizer is DT_ERR_UNSUPPORTED).
DT_API dt_status dt_exec_optim_step(dt_exec *x, dt_optim *o);
DT_API dt_status dt_exec_zero_grad(dt_exec *x);
// The L2 norm of the trainable gradients (dt_grad_norm's), and multiplying them by s
// (clipping, averaging over micro-batches or ranks).
DT_API dt_status dt_exec_grad_norm(dt_exec *x, float *norm);
DT_API dt_status dt_exec_scale_grads(dt_exec *x, float s);

// Copies between the device and the host copies: the graph's dt_params (parameters,
// gradients, buffers) and o's state. pull: device -> host; push: host -> device.
enum {
    DT_EXEC_PARAMS  = 1u << 0,
    DT_EXEC_GRADS   = 1u << 1,
    DT_EXEC_BUFFERS = 1u << 2,
    DT_EXEC_OPTIM   = 1u << 3, // o's state (o required)
};
DT_API dt_status dt_exec_pull(dt_exec *x, unsigned parts, dt_optim *o);
DT_API dt_status dt_exec_push(dt_exec *x, unsigned parts, dt_optim *o);
// Waits for everything queued (bounded: DT_CUDA_TIMEOUT_MS).
DT_API dt_status dt_exec_sync(dt_exec *x);

// What the executor did so far: steps replayed from a captured CUDA graph, and the
// bytes of device memory it holds.
typedef struct dt_exec_stats {
    int64_t steps, graph_replays;
    size_t  device_bytes;
} dt_exec_stats;
DT_API void dt_exec_get_stats(const dt_exec *x, dt_exec_stats *out);

#ifdef __cplusplus
}
#endif
#endif // DTRAIN_EXEC_H
