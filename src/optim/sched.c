// sched.c: learning-rate schedules in closed form, with PyTorch's semantics
// (torch.optim.lr_scheduler LinearLR, CosineAnnealingLR, StepLR, LambdaLR, and
// SequentialLR for a linear warmup before any of them). Computed in double.
#include "dtrain/optim.h"

#include <math.h>

struct dt_sched {
    dt_sched_opts o;
};

dt_sched_opts dt_sched_opts_default(void) {
    return (dt_sched_opts){.kind                = DT_SCHED_CONSTANT,
                           .base_lr             = 1.0f,
                           .warmup_start_factor = 1.0f / 3.0f,
                           .start_factor        = 1.0f / 3.0f,
                           .end_factor          = 1.0f,
                           .gamma               = 0.1f};
}

static dt_status bad(const char *what, double v) {
    return dt_fail(DT_ERR_ARG, "schedule: expected %s, found %g", what, v);
}

dt_status dt_sched_new(dt_sched **out, const dt_sched_opts *opts) {
    *out            = NULL;
    dt_sched_opts o = opts ? *opts : dt_sched_opts_default();
    if (!isfinite(o.base_lr) || o.base_lr < 0)
        return bad("a finite base_lr >= 0", o.base_lr);
    if (o.warmup_steps < 0)
        return bad("warmup_steps >= 0", (double)o.warmup_steps);
    if (o.warmup_steps > 0 && !(o.warmup_start_factor > 0 && o.warmup_start_factor <= 1))
        return bad("warmup_start_factor in (0, 1] (LinearLR's start_factor)",
                   o.warmup_start_factor);
    switch (o.kind) {
    case DT_SCHED_CONSTANT:
        break;
    case DT_SCHED_LINEAR:
        if (!(o.start_factor > 0 && o.start_factor <= 1))
            return bad("start_factor in (0, 1] (as LinearLR)", o.start_factor);
        if (!(o.end_factor >= 0 && o.end_factor <= 1))
            return bad("end_factor in [0, 1] (as LinearLR)", o.end_factor);
        if (o.total_steps < 1)
            return bad("total_steps >= 1 (LinearLR's total_iters)", (double)o.total_steps);
        break;
    case DT_SCHED_COSINE:
        if (o.total_steps < 1)
            return bad("total_steps >= 1 (CosineAnnealingLR's T_max)", (double)o.total_steps);
        if (!isfinite(o.min_lr) || o.min_lr < 0)
            return bad("a finite min_lr >= 0 (CosineAnnealingLR's eta_min)", o.min_lr);
        break;
    case DT_SCHED_STEP:
        if (o.step_size < 1)
            return bad("step_size >= 1 (as StepLR)", (double)o.step_size);
        if (!isfinite(o.gamma) || o.gamma < 0)
            return bad("a finite gamma >= 0", o.gamma);
        break;
    case DT_SCHED_LAMBDA:
        if (!o.lambda)
            return dt_fail(DT_ERR_ARG, "schedule: expected a lambda function, found NULL");
        break;
    default:
        return bad("a kind DT_SCHED_*", o.kind);
    }
    dt_sched *s = dt_alloc_zero(sizeof *s);
    if (!s)
        return DT_ERR_NOMEM;
    s->o = o;
    *out = s;
    return DT_OK;
}

void dt_sched_free(dt_sched *s) {
    dt_free(s);
}

// The main schedule at step t >= 0 for a group whose initial lr is base.
static double main_lr(const dt_sched_opts *o, double base, int64_t t) {
    switch (o->kind) {
    case DT_SCHED_LINEAR: {
        double f = (double)(t < o->total_steps ? t : o->total_steps) / (double)o->total_steps;
        return base * ((double)o->start_factor + ((double)o->end_factor - o->start_factor) * f);
    }
    case DT_SCHED_COSINE: {
        if (t >= o->total_steps)
            return o->min_lr; // held (PyTorch's would rise again: see optim.h)
        double c = cos(M_PI * (double)t / (double)o->total_steps);
        return o->min_lr + (base - o->min_lr) * (1.0 + c) / 2.0;
    }
    case DT_SCHED_STEP:
        return base * pow((double)o->gamma, (double)(t / o->step_size));
    case DT_SCHED_LAMBDA:
        return base * o->lambda(t, o->user);
    default:
        return base;
    }
}

float dt_sched_lr(const dt_sched *s, float base_lr, int64_t step) {
    const dt_sched_opts *o = &s->o;
    if (step < 0)
        step = 0;
    if (step < o->warmup_steps) {
        double f = o->warmup_start_factor +
                   (1.0 - o->warmup_start_factor) * (double)step / (double)o->warmup_steps;
        return (float)((double)base_lr * f);
    }
    return (float)main_lr(o, base_lr, step - o->warmup_steps);
}

float dt_sched_lr_at(const dt_sched *s, int64_t step) {
    return dt_sched_lr(s, s->o.base_lr, step);
}

dt_status dt_sched_apply(const dt_sched *s, dt_optim *o, int64_t step) {
    for (int g = 0; g < dt_optim_num_groups(o); g++) {
        float lr = dt_sched_lr(s, dt_optim_group_initial_lr(o, g), step);
        if (!isfinite(lr) || lr < 0)
            return dt_fail(DT_ERR_ARG,
                           "schedule: group %d at step %lld: expected a finite lr >= 0, found %g",
                           g, (long long)step, (double)lr);
        DT_TRY(dt_optim_set_group_lr(o, g, lr));
    }
    return DT_OK;
}
