// optim_impl.h: the optimizer object shared by the update rules in sgd.c, adam.c and
// adadelta.c; optim.c owns its life cycle and the accessors.
#ifndef DTRAIN_OPTIM_IMPL_H
#define DTRAIN_OPTIM_IMPL_H

#include "dtrain/optim.h"

typedef enum dt_optim_kind {
    DT_OPTIM_SGD,
    DT_OPTIM_ADAM,
    DT_OPTIM_ADAMW,
    DT_OPTIM_ADADELTA,
    DT_OPTIM_KIND_COUNT_
} dt_optim_kind;

struct dt_optim {
    dt_optim_kind kind;
    void (*step)(dt_optim *o); // the update rule; step count already incremented
    float  *params;            // (n) borrowed
    float  *grads;             // (n) borrowed
    size_t  n;
    float  *state; // (nstate) owned
    size_t  nstate;
    int64_t steps; // steps taken, including the one running
    float   lr;
    union {
        dt_sgd_opts      sgd;
        dt_adam_opts     adam;
        dt_adadelta_opts adadelta;
    } opts;
};

// Allocates an optimizer with `nstate` zeroed state floats; NULL on failure.
dt_optim *dt_optim_alloc(dt_optim_kind kind, float *params, float *grads, size_t n, size_t nstate);

// Update loops work through the buffers in blocks of this many floats, keeping the
// values whose square roots they need in a stack buffer (see vsqrt.c).
#define DT_OPTIM_BLOCK 512

// Main loops run over n rounded down to a multiple of 16: at -O2 GCC vectorizes a loop
// only when no scalar remainder is needed; the remainder gets its own short loop.
#define DT_OPTIM_VEC_SPLIT(n) ((n) & ~(size_t)15)

// x[i] = sqrtf(x[i]) for i < n, with the widest vector instructions the CPU has.
void dt_optim_sqrt(float *x, size_t n);

void dt_optim_step_sgd(dt_optim *o);
void dt_optim_step_adam(dt_optim *o); // Adam and AdamW
void dt_optim_step_adadelta(dt_optim *o);

#endif // DTRAIN_OPTIM_IMPL_H
