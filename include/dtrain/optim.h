// optim.h: optimizers over the parameter contract (params.h: one flat float buffer of
// parameters and one of gradients, with a table of named tensors), with their state
// in one flat float buffer too, so a checkpoint saves it as one block. Parameter groups
// (per-group lr and weight decay), gradient-norm clipping and learning-rate schedules.
//
// The update rules are PyTorch's documented ones (torch.optim.SGD, Adam, AdamW,
// Adadelta), computed in float32 element by element as PyTorch's CPU kernels do.
// Knows nothing about layers: any float buffer can be optimised (bind it to a
// one-tensor dt_params with dt_params_bind).
//
//     dt_optim *opt;
//     dt_adamw_new(&opt, dt_model_as_params(m), &(dt_adam_opts){...});
//     dt_param_group_opts nd = dt_param_group_opts_default();
//     nd.weight_decay = 0;                                  // no decay on biases, norms
//     dt_optim_add_group(opt, dt_param_no_decay, NULL, &nd, NULL);
//     per step: backward; dt_ddp_sync; dt_clip_grad_norm(params, 1.0f, &norm);
//               dt_sched_apply(sched, opt, step); dt_optim_step(opt);
#ifndef DTRAIN_OPTIM_H
#define DTRAIN_OPTIM_H

#include "dtrain/core.h"
#include "dtrain/params.h"

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

// Optimizers over a parameter contract (borrowed: it must outlive the optimizer).
// Every trainable tensor starts in group 0 (the options' lr and weight_decay); frozen
// tensors are never updated. `opts` NULL means the defaults. The state (laid out as
// above, n = dt_params_numel floats per block, frozen tensors included) is allocated
// and zeroed here. DT_ERR_ARG for an option out of range, as PyTorch rejects it.
DT_API dt_status dt_sgd_new(dt_optim **out, dt_params *p, const dt_sgd_opts *opts);
DT_API dt_status dt_adam_new(dt_optim **out, dt_params *p, const dt_adam_opts *opts);
DT_API dt_status dt_adamw_new(dt_optim **out, dt_params *p, const dt_adam_opts *opts);
DT_API dt_status dt_adadelta_new(dt_optim **out, dt_params *p, const dt_adadelta_opts *opts);

DT_API void dt_optim_free(dt_optim *o); // NULL is a no-op

// One update of params from grads; increments the step count. Allocates nothing.
DT_API void dt_optim_step(dt_optim *o);
// Sets every gradient to 0.
DT_API void dt_optim_zero_grad(dt_optim *o);

// The learning rate used by the next steps: dt_optim_lr is group 0's; dt_optim_set_lr
// sets every group's. DT_ERR_ARG unless lr is finite and >= 0.
DT_API float     dt_optim_lr(const dt_optim *o);
DT_API dt_status dt_optim_set_lr(dt_optim *o, float lr);

// ----------------------------------------------------------------- parameter groups

// PyTorch's param_groups. A negative field inherits group 0's value at creation.
typedef struct dt_param_group_opts {
    float lr;           // default -1: group 0's
    float weight_decay; // default -1: group 0's
} dt_param_group_opts;

DT_API dt_param_group_opts dt_param_group_opts_default(void);
// A new group (at most 16) taking every trainable tensor for which select(info, user)
// is true, out of whichever group held it; *group (may be NULL) gets its index. E.g.
// dt_param_no_decay with weight_decay 0: no decay on biases and norms. The group's lr
// at creation is its schedule base (PyTorch's initial_lr).
DT_API dt_status dt_optim_add_group(dt_optim *o, dt_param_pred select, void *user,
                                    const dt_param_group_opts *g, int *group);
DT_API int       dt_optim_num_groups(const dt_optim *o);
// The group of parameter tensor i (-1: frozen, never updated).
DT_API int       dt_optim_tensor_group(const dt_optim *o, int tensor);
DT_API float     dt_optim_group_lr(const dt_optim *o, int g); // NaN out of range
DT_API float     dt_optim_group_initial_lr(const dt_optim *o, int g);
DT_API float     dt_optim_group_weight_decay(const dt_optim *o, int g);
DT_API dt_status dt_optim_set_group_lr(dt_optim *o, int g, float lr);
DT_API dt_status dt_optim_set_group_weight_decay(dt_optim *o, int g, float wd);
// The parameters it updates (the table it was created over).
DT_API dt_params *dt_optim_params(dt_optim *o);

// ------------------------------------------------------------------------- clipping

// The L2 norm of every trainable tensor's gradient taken together (summed in double).
DT_API dt_status dt_grad_norm(dt_params *p, float *norm);
// torch.nn.utils.clip_grad_norm_(params, max_norm) (norm_type 2): *norm (may be NULL)
// gets the total norm before clipping, and every trainable gradient is multiplied by
// max_norm / (norm + 1e-6) when that is below 1. Call it on the gradient the step
// applies: after dt_ddp_sync (the average over ranks), before dt_optim_step. A
// non-finite norm leaves the gradients unchanged (PyTorch would scale them by NaN or
// 0): check isfinite(*norm) to skip such a step. DT_ERR_ARG unless max_norm is finite
// and > 0.
DT_API dt_status dt_clip_grad_norm(dt_params *p, float max_norm, float *norm);

// ------------------------------------------------------------------------ schedules

typedef struct dt_sched dt_sched;

// `step` below is the number of scheduler steps taken, PyTorch's last_epoch: with
// scheduler.step() after every optimizer.step(), the lr of optimizer step k (k from 0)
// is lr(k). Every kind computes PyTorch's closed form for a group of initial lr base:
typedef enum dt_sched_kind {
    DT_SCHED_CONSTANT, // base
    DT_SCHED_LINEAR,   // LinearLR(start_factor, end_factor, total_iters = total_steps):
                       // base * (start + (end - start) * min(t, total) / total)
    DT_SCHED_COSINE,   // CosineAnnealingLR(T_max = total_steps, eta_min = min_lr):
                       // min + (base - min) * (1 + cos(pi t / T_max)) / 2 for t <= T_max,
                       // then held at min_lr (PyTorch's keeps following the cosine and
                       // rises again; the two agree up to T_max)
    DT_SCHED_STEP,     // StepLR(step_size, gamma): base * gamma^floor(t / step_size)
    DT_SCHED_LAMBDA,   // LambdaLR(lr_lambda): base * lambda(t, user)
} dt_sched_kind;

typedef double (*dt_sched_lambda_fn)(int64_t step, void *user);

typedef struct dt_sched_opts {
    dt_sched_kind kind;    // default DT_SCHED_CONSTANT
    float         base_lr; // the base of dt_sched_lr_at (default 1: values are factors)
    // Linear warmup first, when warmup_steps > 0: PyTorch's SequentialLR([LinearLR(
    // warmup_start_factor, 1.0, total_iters = warmup_steps), main], milestones =
    // [warmup_steps]): base * (f + (1 - f) t / W) for t < W, then main(t - W).
    int64_t            warmup_steps;
    float              warmup_start_factor;      // in (0, 1]; default 1/3 (LinearLR's)
    float              start_factor, end_factor; // LINEAR; defaults 1/3 and 1 (LinearLR's)
    int64_t            total_steps;              // LINEAR: total_iters; COSINE: T_max
    float              min_lr;                   // COSINE: eta_min (default 0)
    int64_t            step_size;                // STEP
    float              gamma;                    // STEP (default 0.1)
    dt_sched_lambda_fn lambda;                   // LAMBDA
    void              *user;
} dt_sched_opts;

DT_API dt_sched_opts dt_sched_opts_default(void);
// DT_ERR_ARG for an option out of range (as PyTorch rejects it). Free with dt_sched_free.
DT_API dt_status dt_sched_new(dt_sched **out, const dt_sched_opts *opts);
DT_API void      dt_sched_free(dt_sched *s); // NULL-safe
// The lr at `step` of a group whose initial lr is base_lr; _at uses opts.base_lr.
DT_API float dt_sched_lr(const dt_sched *s, float base_lr, int64_t step);
DT_API float dt_sched_lr_at(const dt_sched *s, int64_t step);
// Sets every group's lr to dt_sched_lr(its initial lr, step); call before each
// dt_optim_step with the number of steps already taken.
DT_API dt_status dt_sched_apply(const dt_sched *s, dt_optim *o, int64_t step);

// Checkpoint access: the flat state (layout in the opts comments above) and the number
// of steps taken. Restoring = copying the saved floats into dt_optim_state and calling
// dt_optim_set_step_count (DT_ERR_ARG if steps < 0). The pointer is NULL when there is
// no state (*nfloats 0).
DT_API float    *dt_optim_state(dt_optim *o, size_t *nfloats);
DT_API int64_t   dt_optim_step_count(const dt_optim *o);
DT_API dt_status dt_optim_set_step_count(dt_optim *o, int64_t steps);

// Sharding (ZeRO, zero.h, which calls this; a user rarely does): restricts the optimizer
// to a shard. `shard` (borrowed; a description: it needs no storage) is a table whose
// tensor i is a piece of tensor src_tensor[i] of the table the optimizer was built over,
// lying at float flat_off[i] of that table's flat buffers. Each piece keeps its tensor's
// group (so create the groups before sharding: predicates then see whole tensors);
// every later step reads the pieces' gradients and updates their parameters in place
// in the whole table's buffers, and nothing else; the state is reallocated for the
// shard: each block above holds dt_params_numel(shard) floats instead of the table's
// (the pieces' state so far, a loaded checkpoint's, is kept; the rest is freed).
// dt_optim_params then returns the shard table and dt_optim_num_params its numel.
// DT_ERR_STATE when already sharded; DT_ERR_ARG for a piece outside its tensor.
DT_API dt_status dt_optim_shard(dt_optim *o, dt_params *shard, const int *src_tensor,
                                const size_t *flat_off);
// Whether o is sharded; *full_numel (may be NULL) gets the whole table's numel (the
// shard's when not sharded) and *flat_off (may be NULL) the shard tensors' offsets into
// the whole table (NULL when not sharded). Checkpoints use it to save and load whole
// state from shards (ckpt.h).
DT_API bool dt_optim_sharded(const dt_optim *o, size_t *full_numel, const size_t **flat_off);

// "sgd", "adam", "adamw" or "adadelta".
DT_API const char *dt_optim_name(const dt_optim *o);
DT_API size_t      dt_optim_num_params(const dt_optim *o);

// ------------------------------------------------------------------ loss scaling
// Dynamic loss scaling for fp16 training, torch.cuda.amp.GradScaler's semantics:
//
//     dt_grad_scaler *sc;
//     dt_grad_scaler_opts so = dt_grad_scaler_opts_default();
//     so.agree = dt_ddp_agree_inf; so.agree_user = pg;   // ddp.h: agree across ranks
//     dt_grad_scaler_new(&sc, &so);
//     per step: dloss *= dt_grad_scaler_scale(sc); backward; dt_ddp_sync;
//               dt_grad_scaler_unscale(sc, params);   // optional: before clipping
//               dt_grad_scaler_step(sc, opt, &stepped); // skipped on inf/nan
//               dt_grad_scaler_update(sc);
//
// unscale multiplies every trainable gradient by 1/scale (the reciprocal rounded to
// float, as PyTorch does) and records whether any gradient was inf or NaN; with an
// agreement callback the flag becomes the maximum over ranks, so every rank skips the
// same steps. step unscales first if unscale was not called this step, then steps the
// optimizer unless inf/NaN was found. update: inf/NaN found -> scale *= backoff and the
// count of good steps restarts at 0; otherwise the count grows, and when it reaches
// growth_interval the scale *= growth (kept only if finite) and the count restarts.

// Makes *found_inf (0 or 1 on entry: this rank's flag) the maximum over all ranks.
// Called once per step by every rank (a collective when it talks to other ranks).
typedef dt_status (*dt_inf_agree_fn)(void *user, float *found_inf);

typedef struct dt_grad_scaler_opts {
    float           init_scale;      // default 65536 (2^16)
    float           growth_factor;   // default 2
    float           backoff_factor;  // default 0.5
    int             growth_interval; // default 2000
    bool            enabled;         // default true; false: scale 1, steps never skipped
    dt_inf_agree_fn agree;           // NULL: this process decides alone
    void           *agree_user;
} dt_grad_scaler_opts;

typedef struct dt_grad_scaler dt_grad_scaler;

// Checkpointable state: the scale and the count of consecutive good steps.
typedef struct dt_grad_scaler_state {
    float   scale;
    int64_t growth_tracker;
} dt_grad_scaler_state;

DT_API dt_grad_scaler_opts dt_grad_scaler_opts_default(void);
// DT_ERR_ARG for a scale that is not finite and > 0, growth <= 1, backoff outside
// (0, 1) or an interval < 1, naming the option.
DT_API dt_status dt_grad_scaler_new(dt_grad_scaler **out, const dt_grad_scaler_opts *opts);
DT_API void      dt_grad_scaler_free(dt_grad_scaler *s); // NULL-safe
// The factor to multiply the loss (or its gradient) by; 1 when disabled.
DT_API float dt_grad_scaler_scale(const dt_grad_scaler *s);
// Unscales p's trainable gradients and agrees on inf/NaN (see above). Once per step:
// a second call before update is DT_ERR_STATE. An error of the agreement callback is
// returned as is (the step must then not be taken).
DT_API dt_status dt_grad_scaler_unscale(dt_grad_scaler *s, dt_params *p);
// Whether this step's (agreed) gradients held inf or NaN; false before unscale.
DT_API bool dt_grad_scaler_found_inf(const dt_grad_scaler *s);
// Unscales o's parameters if not done this step, then dt_optim_step(o) unless inf/NaN
// was found; *stepped (may be NULL) says which.
DT_API dt_status dt_grad_scaler_step(dt_grad_scaler *s, dt_optim *o, bool *stepped);
// Adjusts the scale for the next step; DT_ERR_STATE if this step was never unscaled.
DT_API dt_status dt_grad_scaler_update(dt_grad_scaler *s);
DT_API void      dt_grad_scaler_get_state(const dt_grad_scaler *s, dt_grad_scaler_state *st);
// DT_ERR_ARG for a scale not finite and > 0 or a tracker outside [0, growth_interval).
DT_API dt_status dt_grad_scaler_set_state(dt_grad_scaler *s, const dt_grad_scaler_state *st);
// The state as text for a checkpoint's key/values (ckpt.h), exact (hexadecimal float):
// "scale=0x1p+16 growth_tracker=12". Returns the length snprintf would; n >= 64 suffices.
DT_API int dt_grad_scaler_state_str(const dt_grad_scaler *s, char *buf, size_t n);
// Parses that text back; DT_ERR_FORMAT naming what was expected and found.
DT_API dt_status dt_grad_scaler_load_str(dt_grad_scaler *s, const char *text);

#ifdef __cplusplus
}
#endif
#endif // DTRAIN_OPTIM_H
