// optim.c: construction with PyTorch's option checks, and what every optimizer shares
// (step counting, zero_grad, learning rate, checkpoint access).
#include "optim_impl.h"

#include <math.h>
#include <string.h>

static const char *const kind_names[DT_OPTIM_KIND_COUNT_] = {
    [DT_OPTIM_SGD]      = "sgd",
    [DT_OPTIM_ADAM]     = "adam",
    [DT_OPTIM_ADAMW]    = "adamw",
    [DT_OPTIM_ADADELTA] = "adadelta",
};

dt_sgd_opts dt_sgd_opts_default(void) {
    return (dt_sgd_opts){.lr = 1e-3f};
}

dt_adam_opts dt_adam_opts_default(void) {
    return (dt_adam_opts){.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f};
}

dt_adam_opts dt_adamw_opts_default(void) {
    dt_adam_opts o = dt_adam_opts_default();
    o.weight_decay = 1e-2f;
    return o;
}

dt_adadelta_opts dt_adadelta_opts_default(void) {
    return (dt_adadelta_opts){.lr = 1.0f, .rho = 0.9f, .eps = 1e-6f};
}

// A finite value in [lo, hi] (hi_open: [lo, hi)); else DT_ERR_ARG naming it.
static dt_status check_range(const char *opt, const char *what, float v, double lo, double hi,
                             bool hi_open) {
    bool ok = isfinite(v) && v >= lo && (hi_open ? v < hi : v <= hi);
    if (ok)
        return DT_OK;
    return dt_fail(DT_ERR_ARG, "%s: expected %s in [%g, %g%s, found %g", opt, what, lo, hi,
                   hi_open ? ")" : "]", (double)v);
}

static dt_status check_buffers(const char *opt, const float *params, const float *grads, size_t n) {
    if (n == 0)
        return DT_OK;
    if (!params || !grads)
        return dt_fail(DT_ERR_ARG, "%s: expected parameter and gradient buffers, found NULL", opt);
    if (params < grads + n && grads < params + n)
        return dt_fail(DT_ERR_ARG,
                       "%s: expected separate parameter and gradient buffers, found "
                       "overlapping ones",
                       opt);
    if (n > SIZE_MAX / sizeof(float) / 4)
        return dt_fail(DT_ERR_ARG, "%s: %zu parameters is too many", opt, n);
    return DT_OK;
}

dt_optim *dt_optim_alloc(dt_optim_kind kind, float *params, float *grads, size_t n, size_t nstate) {
    dt_optim *o = dt_alloc_zero(sizeof *o);
    if (!o)
        return NULL;
    o->state = nstate ? dt_alloc_zero(nstate * sizeof(float)) : NULL;
    if (nstate && !o->state) {
        dt_free(o);
        return NULL;
    }
    o->kind   = kind;
    o->params = params;
    o->grads  = grads;
    o->n      = n;
    o->nstate = nstate;
    return o;
}

#define TRY_NULL(expr)                                                                             \
    do {                                                                                           \
        if ((expr) != DT_OK)                                                                       \
            return NULL;                                                                           \
    } while (0)

dt_optim *dt_optim_init_sgd(float *params, float *grads, size_t n, const dt_sgd_opts *opts) {
    dt_sgd_opts o = opts ? *opts : dt_sgd_opts_default();
    TRY_NULL(check_buffers("sgd", params, grads, n));
    TRY_NULL(check_range("sgd", "lr", o.lr, 0, INFINITY, false));
    TRY_NULL(check_range("sgd", "momentum", o.momentum, 0, INFINITY, false));
    TRY_NULL(check_range("sgd", "dampening", o.dampening, -INFINITY, INFINITY, false));
    TRY_NULL(check_range("sgd", "weight_decay", o.weight_decay, 0, INFINITY, false));
    if (o.nesterov && (o.momentum <= 0 || o.dampening != 0)) {
        dt_fail(DT_ERR_ARG,
                "sgd: expected momentum > 0 and dampening 0 with nesterov, found "
                "momentum %g and dampening %g",
                (double)o.momentum, (double)o.dampening);
        return NULL;
    }
    dt_optim *opt = dt_optim_alloc(DT_OPTIM_SGD, params, grads, n, o.momentum != 0 ? n : 0);
    if (!opt)
        return NULL;
    opt->opts.sgd = o;
    opt->lr       = o.lr;
    opt->step     = dt_optim_step_sgd;
    return opt;
}

static dt_optim *init_adam(dt_optim_kind kind, float *params, float *grads, size_t n,
                           const dt_adam_opts *opts) {
    const char  *name = kind_names[kind];
    dt_adam_opts o =
        opts ? *opts : (kind == DT_OPTIM_ADAMW ? dt_adamw_opts_default() : dt_adam_opts_default());
    TRY_NULL(check_buffers(name, params, grads, n));
    TRY_NULL(check_range(name, "lr", o.lr, 0, INFINITY, false));
    TRY_NULL(check_range(name, "eps", o.eps, 0, INFINITY, false));
    TRY_NULL(check_range(name, "beta1", o.beta1, 0, 1, true));
    TRY_NULL(check_range(name, "beta2", o.beta2, 0, 1, true));
    TRY_NULL(check_range(name, "weight_decay", o.weight_decay, 0, INFINITY, false));
    dt_optim *opt = dt_optim_alloc(kind, params, grads, n, (o.amsgrad ? 3 : 2) * n);
    if (!opt)
        return NULL;
    opt->opts.adam = o;
    opt->lr        = o.lr;
    opt->step      = dt_optim_step_adam;
    return opt;
}

dt_optim *dt_optim_init_adam(float *params, float *grads, size_t n, const dt_adam_opts *opts) {
    return init_adam(DT_OPTIM_ADAM, params, grads, n, opts);
}

dt_optim *dt_optim_init_adamw(float *params, float *grads, size_t n, const dt_adam_opts *opts) {
    return init_adam(DT_OPTIM_ADAMW, params, grads, n, opts);
}

dt_optim *dt_optim_init_adadelta(float *params, float *grads, size_t n,
                                 const dt_adadelta_opts *opts) {
    dt_adadelta_opts o = opts ? *opts : dt_adadelta_opts_default();
    TRY_NULL(check_buffers("adadelta", params, grads, n));
    TRY_NULL(check_range("adadelta", "lr", o.lr, 0, INFINITY, false));
    TRY_NULL(check_range("adadelta", "rho", o.rho, 0, 1, false));
    TRY_NULL(check_range("adadelta", "eps", o.eps, 0, INFINITY, false));
    TRY_NULL(check_range("adadelta", "weight_decay", o.weight_decay, 0, INFINITY, false));
    dt_optim *opt = dt_optim_alloc(DT_OPTIM_ADADELTA, params, grads, n, 2 * n);
    if (!opt)
        return NULL;
    opt->opts.adadelta = o;
    opt->lr            = o.lr;
    opt->step          = dt_optim_step_adadelta;
    return opt;
}

void dt_optim_free(dt_optim *o) {
    if (!o)
        return;
    dt_free(o->state);
    dt_free(o);
}

void dt_optim_step(dt_optim *o) {
    o->steps++;
    o->step(o);
}

void dt_optim_zero_grad(dt_optim *o) {
    if (o->n)
        memset(o->grads, 0, o->n * sizeof *o->grads);
}

float dt_optim_lr(const dt_optim *o) {
    return o->lr;
}

dt_status dt_optim_set_lr(dt_optim *o, float lr) {
    DT_TRY(check_range(kind_names[o->kind], "lr", lr, 0, INFINITY, false));
    o->lr = lr;
    return DT_OK;
}

float *dt_optim_state(dt_optim *o, size_t *nfloats) {
    if (nfloats)
        *nfloats = o->nstate;
    return o->state;
}

int64_t dt_optim_step_count(const dt_optim *o) {
    return o->steps;
}

dt_status dt_optim_set_step_count(dt_optim *o, int64_t steps) {
    if (steps < 0)
        return dt_fail(DT_ERR_ARG, "%s: expected a step count >= 0, found %lld",
                       kind_names[o->kind], (long long)steps);
    o->steps = steps;
    return DT_OK;
}

const char *dt_optim_name(const dt_optim *o) {
    return kind_names[o->kind];
}
size_t dt_optim_num_params(const dt_optim *o) {
    return o->n;
}
