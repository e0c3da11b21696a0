// optim.h: optimizers over one flat float buffer of parameters and one of gradients
// (the model keeps all its parameters contiguous, DESIGN.md), with their state in one
// flat float buffer too, so a checkpoint saves it as one block.
//
// The update rules are PyTorch's documented ones (torch.optim.SGD, Adam, AdamW,
// Adadelta), computed in float32 element by element as PyTorch's CPU kernels do.
// Knows nothing about layers: any float buffer can be optimised.
#ifndef DTRAIN_OPTIM_H
#define DTRAIN_OPTIM_H

#include "dtrain/core.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dt_optim dt_optim;

// torch.optim.SGD: g += wd·p; with momentum μ: b = g on the first step, else
// b = μ·b + (1 − dampening)·g; g = nesterov ? g + μ·b : b; p −= lr·g.
// State: the momentum buffer b (n floats), none when momentum is 0.
typedef struct dt_sgd_opts {
    float lr;           // default 1e-3 (PyTorch's)
    float momentum;     // default 0
    float dampening;    // default 0
    float weight_decay; // default 0 (L2 added to the gradient)
    bool  nesterov;     // default false; needs momentum > 0 and dampening 0
} dt_sgd_opts;

// torch.optim.Adam / AdamW at step t: g += wd·p (Adam) or p ·= 1 − lr·wd (AdamW);
// m = β1·m + (1 − β1)·g; v = β2·v + (1 − β2)·g²; v̂ = amsgrad ? max(v̂, v) : v;
// p −= lr / (1 − β1^t) · m / (sqrt(v̂) / sqrt(1 − β2^t) + eps).
// State: m, v (and the running maximum v̂ with amsgrad), n floats each, in that order.
typedef struct dt_adam_opts {
    float lr;           // default 1e-3
    float beta1;        // default 0.9
    float beta2;        // default 0.999
    float eps;          // default 1e-8
    float weight_decay; // default 0 (Adam), 1e-2 (AdamW)
    bool  amsgrad;      // default false
} dt_adam_opts;

// torch.optim.Adadelta: g += wd·p; v = ρ·v + (1 − ρ)·g²;
// Δ = sqrt(u + eps) / sqrt(v + eps) · g; u = ρ·u + (1 − ρ)·Δ²; p −= lr·Δ.
// State: v (square average) then u (accumulated update), n floats each.
typedef struct dt_adadelta_opts {
    float lr;           // default 1.0 (the seed script uses 0.5)
    float rho;          // default 0.9
    float eps;          // default 1e-6
    float weight_decay; // default 0
} dt_adadelta_opts;

DT_API dt_sgd_opts      dt_sgd_opts_default(void);
DT_API dt_adam_opts     dt_adam_opts_default(void);
DT_API dt_adam_opts     dt_adamw_opts_default(void);
DT_API dt_adadelta_opts dt_adadelta_opts_default(void);

// Optimizers over params[0..n) with gradients grads[0..n), both borrowed (they must
// outlive the optimizer and must not overlap). `opts` NULL means the defaults. The
// state is allocated and zeroed here. Returns NULL with DT_ERR_ARG (an option out of
// range, as PyTorch rejects it) or DT_ERR_NOMEM. Free with dt_optim_free.
DT_API dt_optim *dt_optim_init_sgd(float *params, float *grads, size_t n, const dt_sgd_opts *opts);
DT_API dt_optim *dt_optim_init_adam(float *params, float *grads, size_t n,
                                    const dt_adam_opts *opts);
DT_API dt_optim *dt_optim_init_adamw(float *params, float *grads, size_t n,
                                     const dt_adam_opts *opts);
DT_API dt_optim *dt_optim_init_adadelta(float *params, float *grads, size_t n,
                                        const dt_adadelta_opts *opts);
DT_API void      dt_optim_free(dt_optim *o); // NULL is a no-op

// One update of params from grads; increments the step count. Allocates nothing.
DT_API void dt_optim_step(dt_optim *o);
// Sets every gradient to 0.
DT_API void dt_optim_zero_grad(dt_optim *o);

// The learning rate used by the next steps (for schedules). DT_ERR_ARG unless lr is
// finite and >= 0.
DT_API float     dt_optim_lr(const dt_optim *o);
DT_API dt_status dt_optim_set_lr(dt_optim *o, float lr);

// Checkpoint access: the flat state (layout in the opts comments above) and the number
// of steps taken. Restoring = copying the saved floats into dt_optim_state and calling
// dt_optim_set_step_count (DT_ERR_ARG if steps < 0). The pointer is NULL when there is
// no state (*nfloats 0).
DT_API float    *dt_optim_state(dt_optim *o, size_t *nfloats);
DT_API int64_t   dt_optim_step_count(const dt_optim *o);
DT_API dt_status dt_optim_set_step_count(dt_optim *o, int64_t steps);

// "sgd", "adam", "adamw" or "adadelta".
DT_API const char *dt_optim_name(const dt_optim *o);
DT_API size_t      dt_optim_num_params(const dt_optim *o);

#ifdef __cplusplus
}
#endif
#endif // DTRAIN_OPTIM_H
