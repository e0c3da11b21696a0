// exec_abi.h: the executor's part of the CUDA plugin's interface (core/device_abi.h's
// dt_cuda_api.exec). Everything crosses as plain data: the graph's description and
// tables once (dt_exec_plan), then per call what changes (dt_exec_run, dt_exec_optim),
// so the plugin needs nothing of the NN core's code.
#ifndef DTRAIN_EXEC_ABI_H
#define DTRAIN_EXEC_ABI_H

#include "dtrain/exec.h" // DT_EXEC_PARAMS ... (the parts a copy moves)
#include "dtrain/graph.h"
#include "dtrain/params.h"

#ifdef __cplusplus
extern "C" {
#endif

#define DT_EXEC_ABI 1

// The model, once.
typedef struct dt_exec_plan {
    int                  nnodes;
    const dt_node_desc  *nodes; // node order (topological)
    int                  output;
    int                  ninputs;
    const int           *inputs; // the graph inputs' node indices, in dt_graph_input order
    int                  nparams, nbuffers;
    const dt_param_info *params, *buffers; // the dt_params tables
    size_t               numel, buffer_numel;
    const float         *init_params, *init_buffers; // host values to start from
    int                  max_batch;
    dt_precision         precision;
    int                  cuda_graph; // -1 auto, 0 off, 1 on
} dt_exec_plan;

// The losses (exec.h's dt_loss_kind values).
typedef struct dt_exec_loss {
    int         kind;
    int         classes; // NLL / cross-entropy: the last dimension of the output
    int         ignore_index;
    float       label_smoothing, grad_scale;
    const void *targets; // host: int32 (rows) or float (output's size)
} dt_exec_lossdesc;

// One call's data. node_keys[i]: the dropout stream of node i (split(rng, layer_no) as
// two words: key[0] | key[1] << 32), 0 for other nodes.
typedef struct dt_exec_run {
    int                     batch;
    bool                    training;
    const void *const      *inputs; // host, one per graph input
    const uint64_t         *keys;   // batch sample keys, or NULL: positions
    const uint64_t         *node_keys;
    bool                    forward, backward;
    const dt_exec_lossdesc *loss; // NULL: no loss
} dt_exec_run;

// An optimizer step, as the host's dt_optim describes it (optim_impl.h). kind:
// 0 SGD, 1 Adam, 2 AdamW, 3 Adadelta (dt_optim_kind). Scalars PyTorch computes in double
// per step (Adam's step size and bias correction) come computed.
#define DT_EXEC_MAX_GROUPS 16
typedef struct dt_exec_optim {
    int        kind;
    int64_t    step; // the step being taken (1 for the first)
    int        ngroups;
    float      lr[DT_EXEC_MAX_GROUPS], wd[DT_EXEC_MAX_GROUPS];
    const int *tgroup; // [nparams] each tensor's group, -1 frozen
    float      momentum, dampening;
    bool       nesterov;
    float      beta1, beta2, eps, rho;
    bool       amsgrad;
    float      step_size[DT_EXEC_MAX_GROUPS]; // Adam: lr / (1 - beta1^t)
    float      decay[DT_EXEC_MAX_GROUPS];     // AdamW: 1 - lr wd; else 1
    float      bc2_sqrt;                      // Adam: sqrt(1 - beta2^t)
    size_t     state_floats;                  // the host state's size (blocks of numel)
} dt_exec_optim;

// What dt_exec_api.copy moves (exec.h's DT_EXEC_* bits, one at a time), and the output.
enum { DT_EXEC_PART_OUTPUT = 1u << 8 };

typedef struct dt_exec_api {
    uint32_t abi, size;
    dt_status (*create)(void **x, int dev, const dt_exec_plan *p);
    void (*destroy)(void *x);
    dt_status (*run)(void *x, const dt_exec_run *r);
    dt_status (*loss_value)(void *x, float *loss); // waits for the last run's loss
    // One part between host and device: part's floats [off, off + n).
    dt_status (*copy)(void *x, unsigned part, bool to_host, void *host, size_t off, size_t n);
    void *(*device_ptr)(void *x, unsigned part); // params, grads, buffers
    dt_status (*zero_grad)(void *x);
    dt_status (*grad_norm)(void *x, float *norm);
    dt_status (*scale_grads)(void *x, float s);
    dt_status (*optim_step)(void *x, const dt_exec_optim *o);
    dt_status (*sync)(void *x);
    void (*stats)(void *x, int64_t *replays, size_t *bytes);
} dt_exec_api;

#ifdef __cplusplus
}
#endif
#endif // DTRAIN_EXEC_ABI_H
