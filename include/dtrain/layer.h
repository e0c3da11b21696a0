// layer.h: the public layer interface. A layer is a vtable (dt_layer_ops) plus its
// configuration; the model graph (graph.h) owns its parameters, buffers, saved state
// and scratch, and calls the vtable with all of them, so a layer keeps no per-batch
// state of its own and a user writes a layer by filling five functions:
//
//   setup     from the per-sample input shape(s) to the output shape, and declares the
//             parameter and buffer tensors (name, shape, flags) and how many floats
//             forward saves for backward and how much scratch it needs;
//   init      PyTorch's default initialisation of the parameters and buffers, drawn
//             from the dt_rng it is handed;
//   forward   inputs -> output over a batch, saving what backward needs;
//   backward  WRITES the input gradients (a NULL dx[i]: nobody needs it) and ADDS the
//             parameter gradients (several calls accumulate, as torch's .grad does);
//   free      releases the configuration (NULL: dt_free of it).
//
// Shapes here are per sample: the batch is the leading dimension the graph adds. A
// tensor of batch n and per-sample shape s is n * dt_shape_numel(s) floats, row-major.
// Inputs of dtype DT_ELEM_I32 (token ids, class indices) hold int32_t values: cast x[i]
// to (const int32_t *).
//
// Every built-in layer (dt_layer_<kind>_new below) follows the PyTorch module of the
// same name (torch 1.13): semantics, default initialisation, parameter names
// ("weight", "bias"; BatchNorm's buffers "running_mean", "running_var").
#ifndef DTRAIN_LAYER_H
#define DTRAIN_LAYER_H

#include "dtrain/core.h"
#include "dtrain/params.h"
#include "dtrain/rng.h"

#ifdef __cplusplus
extern "C" {
#endif

#define DT_LAYER_MAX_INPUTS  8 // inputs of one node
#define DT_LAYER_MAX_TENSORS 4 // parameters of one layer; buffers likewise
#define DT_SHAPE_MAX_DIMS    4 // per-sample dimensions

typedef enum dt_elem { DT_ELEM_F32 = 0, DT_ELEM_I32 = 1 } dt_elem; // element types of graph values

// A per-sample shape: ndim 0 (a scalar per sample) .. 4; dims >= 1.
typedef struct dt_shape {
    int     ndim;
    int64_t d[DT_SHAPE_MAX_DIMS];
    dt_elem dtype;
} dt_shape;

DT_API size_t dt_shape_numel(const dt_shape *s); // product of the dims (1 when ndim 0)
// "(3,32,32)" into buf; returns buf.
DT_API const char *dt_shape_str(const dt_shape *s, char *buf, size_t n);

// A tensor a layer declares: "weight" becomes "<node>.weight" in the graph's dt_params.
typedef struct dt_layer_tensor {
    char     name[32];
    int      ndim;
    int64_t  shape[DT_PARAM_MAX_DIMS];
    uint32_t flags; // DT_PARAM_* (DT_PARAM_NO_DECAY for biases and norms)
    // A part of a tensor split over tensor-parallel ranks (params.h; zeroed: whole).
    // The graph records it in its dt_params (dt_param_info.split).
    dt_param_split split;
} dt_layer_tensor;

// How the graph calls a layer's forward and backward, on its threads
// (dt_graph_set_threads):
typedef enum dt_layer_run {
    // Each thread calls it for its own range of the samples: the buffers of
    // dt_layer_args start at the range's first sample and `batch` is the range's length.
    // In backward under gradient shards, a layer with parameters is called once per
    // sample. The default; most layers need nothing else.
    DT_LAYER_RANGE = 0,
    // Once per pass on the calling thread with the whole batch, between the threads'
    // runs: for batch-wide state (BatchNorm's statistics; a layer whose saved_fixed is not
    // 0 runs so whatever it declares). It may share its work out with dt_layer_parallel.
    DT_LAYER_WHOLE,
    // Every thread calls it at once with the WHOLE batch's buffers (batch: the whole
    // batch) and dt_layer_args.team saying which samples are its own; the threads may
    // meet inside (dt_layer_team_meet), so the layer may split its work otherwise (a
    // weight gradient by columns). See dt_layer_grad for its parameter gradients.
    DT_LAYER_TEAM,
} dt_layer_run;

// A DT_LAYER_TEAM layer's parameter gradients (dt_layer_args.dw):
typedef enum dt_layer_grad {
    // Each call ADDS its samples' contribution, in increasing sample order, into dw: a
    // buffer of the thread's own (the graph sums them in thread order) or, under
    // gradient shards, a shard's (backward is then called per shard, team.s0 the shard
    // and team.step the shard count, on whichever thread takes it: such a call must not
    // meet the other threads). The default.
    DT_LAYER_GRAD_PARTIAL = 0,
    // The layer forms the whole gradient itself in the one shared dw, the threads
    // writing disjoint parts of it after meeting; under gradient shards (team.shards S)
    // it forms each shard's sum over its samples in increasing order and combines the
    // shards by the fixed tree of the graph (highest bit first: shard k += shard k + h
    // for h = S/2, S/4, ... 1), whatever the thread split.
    DT_LAYER_GRAD_SHARED,
} dt_layer_grad;

// What setup fills in (zeroed by the caller).
typedef struct dt_layer_setup {
    dt_shape        out;
    int             nparams, nbuffers;
    dt_layer_tensor params[DT_LAYER_MAX_TENSORS];
    dt_layer_tensor buffers[DT_LAYER_MAX_TENSORS];
    size_t          saved_per_sample; // floats forward saves for backward, per sample
    size_t          saved_fixed;      // and independent of the batch (per-channel stats)
    size_t          scratch_per_sample, scratch_fixed; // floats of scratch (forward, backward)
    bool            no_input_grad;                     // inputs are indices: dx is never asked for
    double          flops_per_sample;                  // forward, multiply-add = 2 (0: unknown)
    // Bit k set: parameter k is a matrix-product weight that a 16-bit precision mode
    // (dt_graph_set_precision) reads rounded: the graph then hands the layer a shadow
    // copy, converted once per forward (dt_layer_args.w16). Linear and Conv2d set bit 0.
    uint32_t lowp_params;
    // 16-bit values (uint16_t) forward saves per sample for backward in a 16-bit precision
    // mode only, e.g. Linear's bf16 copy of its input: the graph hands them over as
    // dt_layer_args.saved16 when its precision is not fp32, and allocates none in fp32.
    size_t saved16_per_sample;
    // How the graph's threads call the layer (dt_layer_run below; 0: by ranges).
    dt_layer_run run;
    // The layer may work in place: the graph may hand it y == x[0] (and, in backward,
    // dx[0] == dy) when nothing else reads its input. One input, of the output's size.
    bool in_place;
    // DT_LAYER_TEAM with parameters: how their gradient is formed (dt_layer_grad).
    dt_layer_grad grad;
    // DT_LAYER_TEAM: scratch per thread (scratch_fixed) grows by this many floats per
    // gradient shard (dt_graph_set_grad_shards).
    size_t scratch_per_shard;
    // Backward reads the output's values (not only their signs, as ReLU's mask does): a
    // layer working in place after this one may not overwrite them (softmax, tanh).
    bool output_read_back;
    // A sample's output depends on the other samples of the batch (BatchNorm's batch
    // statistics): no split of the batch into gradient shards can make the gradient
    // independent of how the batch is divided (the trainer's --invariant says so).
    bool batch_coupled;
    // In: the graph's precision when setup runs (it runs again when that changes), for a
    // layer whose kernels or state depend on it.
    dt_precision precision;
} dt_layer_setup;

typedef struct dt_layer dt_layer;
struct dt_pool; // the threads of a graph (dt_graph_set_threads)

// Everything one forward or backward call sees.
typedef struct dt_layer_args {
    int                 batch;
    bool                training;
    int                 nin;
    const dt_shape     *in;      // nin per-sample input shapes
    const dt_shape     *out;     // the per-sample output shape
    const float *const *x;       // nin inputs, (batch, in[i])
    float              *y;       // forward: written; backward: the forward's output (read only)
    const float        *dy;      // backward: gradient of the output
    float *const       *dx;      // backward: input gradients to WRITE; dx[i] NULL: not needed
    float *const       *w;       // parameters, in setup's order
    float *const       *dw;      // backward: parameter gradients to ADD
    float *const       *buf;     // buffers, in setup's order
    float              *saved;   // saved_per_sample * batch + saved_fixed floats
    float              *scratch; // scratch_per_sample * batch + scratch_fixed floats
    // Random draws (dropout): sample s draws from dt_rng_split(rng, keys ? keys[s] : s);
    // rng is the graph's stream already split by the node's layer position (graph.h).
    const dt_rng   *rng;
    const uint64_t *keys;
    // The graph's precision (dt_graph_set_precision). When not DT_PREC_FP32, w16[k] is
    // the shadow of parameter k for each bit of setup's lowp_params (NULL otherwise):
    // bf16 bits (uint16_t) in bf16, fp16-rounded floats in fp16. A layer that ignores
    // the precision runs in fp32, which is always correct.
    dt_precision       precision;
    const void *const *w16;
    uint16_t          *saved16; // saved16_per_sample * batch values in a 16-bit mode, else NULL
    // The graph's threads, handed to a layer the graph runs whole on the calling thread
    // rather than split by samples (one with saved_fixed floats: batch-wide state such
    // as BatchNorm's statistics), which may share its work out with dt_layer_parallel.
    // NULL: one thread, or a layer already given a range of the samples.
    struct dt_pool *pool;
    // DT_LAYER_TEAM: this thread's place and samples (NULL for the other kinds).
    const struct dt_layer_team *team;
} dt_layer_args;

// What a DT_LAYER_TEAM layer's thread is given. Its samples are s0, s0 + step, ... < s1
// of the whole batch (step 1 but in a gradient shard's backward); the threads' ranges
// cover the batch once. shards: the graph's gradient shards (0: off).
typedef struct dt_layer_team {
    int ith, nth;
    int s0, s1, step;
    int shards;
} dt_layer_team;

// Waits until every thread of a DT_LAYER_TEAM call has reached it (nothing on one
// thread); every thread must call it the same number of times.
DT_API void dt_layer_team_meet(const dt_layer_args *a);

// Runs fn(arg, i, n) on each of the n threads of a->pool (i = 0 on the calling thread)
// and returns when all have finished; fn(arg, 0, 1) when a->pool is NULL.
DT_API void dt_layer_parallel(const dt_layer_args *a, void (*fn)(void *arg, int i, int n),
                              void                *arg);

typedef struct dt_layer_ops {
    const char *kind; // "conv2d", "my_layer", ...
    dt_status (*setup)(const dt_layer *l, int nin, const dt_shape *in, dt_layer_setup *s);
    // Parameters then buffers, in setup's order; NULL: all zero.
    void (*init)(const dt_layer *l, dt_rng *rng, float *const *w, float *const *buf);
    dt_status (*forward)(const dt_layer *l, const dt_layer_args *a);
    dt_status (*backward)(const dt_layer *l, const dt_layer_args *a);
    void (*free_config)(void *config); // NULL: dt_free(config)
} dt_layer_ops;

struct dt_layer {
    const dt_layer_ops *ops;
    void               *config; // the layer's own, owned
};

typedef struct dt_layer_opts {
    int reserved; // none yet
} dt_layer_opts;

DT_API dt_layer_opts dt_layer_opts_default(void);

// A layer of `ops` taking ownership of `config` (dt_alloc'ed, or freed by
// ops->free_config) even on failure. *out stays NULL on failure.
DT_API dt_status dt_layer_new(dt_layer **out, const dt_layer_ops *ops, void *config,
                              const dt_layer_opts *opts);
DT_API void      dt_layer_free(dt_layer *l); // NULL-safe

// ------------------------------------------------------------------- built-in layers

// nn.Conv2d(cin, cout, (kh, kw), stride, padding, groups, bias) on (cin, h, w).
typedef struct dt_conv2d_opts {
    int  sh, sw, ph, pw, groups; // default stride 1, padding 0, groups 1
    bool bias;                   // default true
} dt_conv2d_opts;
DT_API dt_conv2d_opts dt_conv2d_opts_default(void);
DT_API dt_status      dt_layer_conv2d_new(dt_layer **out, int cin, int cout, int kh, int kw,
                                          const dt_conv2d_opts *opts);

// nn.Linear(in, out, bias) over the last dimension of any input (..., in).
typedef struct dt_linear_opts {
    bool bias; // default true
} dt_linear_opts;
DT_API dt_linear_opts dt_linear_opts_default(void);
DT_API dt_status      dt_layer_linear_new(dt_layer **out, int in, int out_features,
                                          const dt_linear_opts *opts);

// Tensor (intra-layer) parallelism, Megatron-LM style: shard `part` of `parts` of
// nn.Linear(in, out). A column shard holds output features [part*out/parts, ...) (rows
// of the weight) and reads the whole input; a row shard holds input features
// [part*in/parts, ...) (columns of the weight) and the whole bias, and writes the whole
// output. Column then row (an MLP; qkv then proj around attention) needs one sum in
// forward (the row shards' partial outputs, before the bias) and one in backward (the
// column shards' partial input gradients): `reduce` does them, an all-reduce over the
// shards' group (tp.h fills it in). The layers run whole on the calling thread.
// groups > 1 (column only): the outputs are `groups` equal blocks, each sharded alike,
// so a qkv projection's shard holds q, k and v of its heads ((T, 3C/parts) packed as
// the attention layer reads). Init draws the whole layer's weight and bias as
// dt_layer_linear_new does and keeps this shard's part: the shards of a seed are the
// slices of the unsplit layer of that seed.
typedef dt_status (*dt_sum_fn)(void *user, float *v, size_t n); // v = sum over the shards
typedef enum dt_tp_mode { DT_TP_COLUMN = 0, DT_TP_ROW = 1 } dt_tp_mode;
typedef struct dt_linear_tp_opts {
    bool      bias;   // default true
    int       groups; // column only; default 1
    dt_sum_fn reduce; // required when parts > 1
    void     *reduce_user;
} dt_linear_tp_opts;
DT_API dt_linear_tp_opts dt_linear_tp_opts_default(void);
DT_API dt_status dt_layer_linear_tp_new(dt_layer **out, int in, int out_features, dt_tp_mode mode,
                                        int parts, int part, const dt_linear_tp_opts *opts);
// Megatron's VocabParallelEmbedding: shard `part` of `parts` of nn.Embedding(num, d),
// holding rows [part*num/parts, ...) of the weight. An index outside them looks up a
// zero row and opts->reduce sums the shards' outputs, so every shard writes the whole
// lookup, exactly (one shard adds its row to zeros). The weight gradient is this
// shard's rows of the unsplit one. With a column shard of Linear(d, num, bias false)
// over the same parts as the head, the two tie (dt_graph_tie: the same rows) and the
// logits come out split over the vocabulary, as dt_tp_cross_entropy (tp.h) reads them.
// opts: its reducer (bias and groups do not apply). Init draws the unsplit layer's.
DT_API dt_status dt_layer_embedding_tp_new(dt_layer **out, int num, int d, int parts, int part,
                                           const dt_linear_tp_opts *opts);

// Per-channel statistics reducer of a SyncBatchNorm: sums `v[0..n)` over the process
// group in place (forward: sum, sum of squares per channel and the count; backward:
// the sums of dy and dy*xhat per channel). Returns nonzero on failure.
typedef dt_status (*dt_bn_reduce_fn)(void *user, float *v, size_t n);

// nn.BatchNorm1d(c) on (c) or (c, l), nn.BatchNorm2d(c) on (c, h, w): training uses
// batch statistics and updates the running ones (buffers), evaluation the running ones.
typedef struct dt_batchnorm_opts {
    float           eps;      // default 1e-5
    float           momentum; // default 0.1
    bool            affine;   // default true
    dt_bn_reduce_fn reduce;   // NULL: local statistics (BatchNorm); else SyncBatchNorm
    void           *reduce_user;
} dt_batchnorm_opts;
DT_API dt_batchnorm_opts dt_batchnorm_opts_default(void);
DT_API dt_status dt_layer_batchnorm1d_new(dt_layer **out, int c, const dt_batchnorm_opts *opts);
DT_API dt_status dt_layer_batchnorm2d_new(dt_layer **out, int c, const dt_batchnorm_opts *opts);

// nn.LayerNorm(d, eps, elementwise_affine) over the last dimension.
typedef struct dt_layernorm_opts {
    float eps;    // default 1e-5
    bool  affine; // default true
} dt_layernorm_opts;
DT_API dt_layernorm_opts dt_layernorm_opts_default(void);
DT_API dt_status dt_layer_layernorm_new(dt_layer **out, int d, const dt_layernorm_opts *opts);

// nn.Embedding(num, d): DT_ELEM_I32 input of any shape s -> (s..., d).
DT_API dt_status dt_layer_embedding_new(dt_layer **out, int num, int d, const dt_layer_opts *opts);

// Element-wise activations (nn.ReLU, nn.GELU(), nn.GELU('tanh'), nn.Tanh, nn.Sigmoid,
// nn.SiLU), any shape.
typedef enum dt_act {
    DT_ACT_RELU,
    DT_ACT_GELU,
    DT_ACT_GELU_TANH,
    DT_ACT_TANH,
    DT_ACT_SIGMOID,
    DT_ACT_SILU,
} dt_act;
DT_API dt_status dt_layer_act_new(dt_layer **out, dt_act act, const dt_layer_opts *opts);
// nn.Softmax(dim=-1).
DT_API dt_status dt_layer_softmax_new(dt_layer **out, const dt_layer_opts *opts);
// nn.Dropout(p): masks keyed per sample (dt_graph_set_sample_keys), identity in eval.
DT_API dt_status dt_layer_dropout_new(dt_layer **out, float p, const dt_layer_opts *opts);
// nn.Dropout2d(p) on (c, ...): whole channels kept or zeroed, one draw per channel.
DT_API dt_status dt_layer_dropout2d_new(dt_layer **out, float p, const dt_layer_opts *opts);
// nn.LogSoftmax(dim=-1).
DT_API dt_status dt_layer_log_softmax_new(dt_layer **out, const dt_layer_opts *opts);

// nn.AvgPool2d / nn.MaxPool2d((kh, kw), stride, padding) on (c, h, w); stride 0 is the
// kernel. AvgPool2d counts padding in the divisor (count_include_pad).
typedef struct dt_pool2d_opts {
    int sh, sw, ph, pw; // default stride = kernel, padding 0
} dt_pool2d_opts;
DT_API dt_pool2d_opts dt_pool2d_opts_default(void);
DT_API dt_status dt_layer_avgpool2d_new(dt_layer **out, int kh, int kw, const dt_pool2d_opts *opts);
DT_API dt_status dt_layer_maxpool2d_new(dt_layer **out, int kh, int kw, const dt_pool2d_opts *opts);
// nn.AdaptiveAvgPool2d((ho, wo)).
DT_API dt_status dt_layer_adaptive_avgpool2d_new(dt_layer **out, int ho, int wo,
                                                 const dt_layer_opts *opts);
// nn.Flatten(): any shape -> (numel).
DT_API dt_status dt_layer_flatten_new(dt_layer **out, const dt_layer_opts *opts);
// a + b (+ ...) of equal shapes: the residual add.
DT_API dt_status dt_layer_add_new(dt_layer **out, const dt_layer_opts *opts);
// torch.cat along per-sample dimension `dim` (0: channels of (c, h, w) images).
DT_API dt_status dt_layer_concat_new(dt_layer **out, int dim, const dt_layer_opts *opts);
// Causal multi-head self-attention on packed (T, 3C) q|k|v rows (the output of a qkv
// Linear) -> (T, C), heads dividing C; flash-style, one tile of scores at a time.
DT_API dt_status dt_layer_attention_new(dt_layer **out, int heads, const dt_layer_opts *opts);

#ifdef __cplusplus
}
#endif
#endif // DTRAIN_LAYER_H
