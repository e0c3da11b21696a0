// optim_impl.h: the optimizer object shared by the update rules in sgd.c, adam.c and
// adadelta.c; optim.c owns its life cycle and the accessors.
#ifndef DTRAIN_OPTIM_IMPL_H
#define DTRAIN_OPTIM_IMPL_H

#include "dtrain/optim.h"
#include "kernels/table.h"

typedef enum dt_optim_kind {
    DT_OPTIM_SGD,
    DT_OPTIM_ADAM,
    DT_OPTIM_ADAMW,
    DT_OPTIM_ADADELTA,
    DT_OPTIM_KIND_COUNT_
} dt_optim_kind;

// One parameter group: PyTorch's param_groups entry (lr, weight_decay), plus the lr
// it was created with (a schedule's base, PyTorch's initial_lr).
typedef struct optim_group {
    float lr, weight_decay, initial_lr;
} optim_group;

// A run of consecutive tensors of one group: one call of the update rule. off indexes
// the state, poff the parameters and gradients (the same unless sharded).
typedef struct optim_range {
    size_t off, poff, n;
    int    group;
} optim_range;

#define DT_OPTIM_MAX_GROUPS 16

struct dt_optim {
    dt_optim_kind kind;
    // The update rule over floats [off, off + n) of the state and [poff, poff + n) of
    // the parameters and gradients with a group's lr and weight decay; the step count is
    // already incremented.
    void (*step)(dt_optim *o, size_t off, size_t poff, size_t n, float lr, float wd);
    dt_params   *p;      // borrowed
    float       *params; // (n) dt_params_data(p); sharded: the whole table's (full_n)
    float       *grads;  // (n) dt_params_grads(p); sharded: the whole table's (full_n)
    size_t       n;
    float       *state; // (nstate) owned
    size_t       nstate;
    int64_t      steps; // steps taken, including the one running
    float        lr;    // group 0's, mirrored for dt_optim_lr
    optim_group  groups[DT_OPTIM_MAX_GROUPS];
    int          ngroups;
    int         *tgroup; // [tensors] the group of each tensor, -1 for frozen ones
    optim_range *ranges;
    int          nranges;
    // Sharded (dt_optim_shard): p is the shard's table (a description without storage);
    // tensor i of it lies at float flat_off[i] of the full table's buffers (full_n
    // floats).
    size_t    *flat_off; // owned; NULL when not sharded
    size_t     full_n;
    dt_params *whole; // sharded: the whole table (its dt_params_zero_grad)
    union {
        dt_sgd_opts      sgd;
        dt_adam_opts     adam;
        dt_adadelta_opts adadelta;
    } opts;
};

// Allocates an optimizer over p with `nstate` zeroed state floats, one group (lr, wd)
// holding every trainable tensor.
dt_status dt_optim_alloc(dt_optim **out, dt_optim_kind kind, dt_params *p, size_t nstate, float lr,
                         float wd);

// Update loops work through the buffers in blocks of this many floats, keeping the
// values whose square roots they need in a stack buffer (the table's vsqrt row).
#define DT_OPTIM_BLOCK 512

void dt_optim_step_sgd(dt_optim *o, size_t off, size_t poff, size_t n, float lr, float wd);
void dt_optim_step_adam(dt_optim *o, size_t off, size_t poff, size_t n, float lr,
                        float wd); // and AdamW
void dt_optim_step_adadelta(dt_optim *o, size_t off, size_t poff, size_t n, float lr, float wd);

#endif // DTRAIN_OPTIM_IMPL_H
