// optim.c: construction with PyTorch's option checks, and what every optimizer shares
// (step counting, zero_grad, learning rate, checkpoint access).
#include "dtrain/trace.h"
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

static dt_status check_params(const char *opt, dt_params *p) {
    if (!p || !dt_params_ready(p))
        return dt_fail(DT_ERR_ARG,
                       "%s: expected parameters with storage (dt_params_alloc, dt_params_bind or "
                       "a finalized model), found %s",
                       opt, p ? "none" : "NULL");
    if (dt_params_numel(p) > SIZE_MAX / sizeof(float) / 4)
        return dt_fail(DT_ERR_ARG, "%s: %zu parameters is too many", opt, dt_params_numel(p));
    return DT_OK;
}

// Consecutive tensors of one group become one call of the update rule.
static void build_ranges(dt_optim *o) {
    int nt     = dt_params_count(o->p);
    o->nranges = 0;
    for (int t = 0; t < nt; t++) {
        const dt_param_info *pi = dt_params_info(o->p, t);
        int                  g  = o->tgroup[t];
        if (g < 0 || pi->count == 0)
            continue;
        size_t       poff = o->flat_off ? o->flat_off[t] : pi->offset;
        optim_range *last = o->nranges ? &o->ranges[o->nranges - 1] : NULL;
        if (last && last->group == g && last->off + last->n == pi->offset &&
            last->poff + last->n == poff)
            last->n += pi->count;
        else
            o->ranges[o->nranges++] = (optim_range){pi->offset, poff, pi->count, g};
    }
}

dt_status dt_optim_alloc(dt_optim **out, dt_optim_kind kind, dt_params *p, size_t nstate, float lr,
                         float wd) {
    *out        = NULL;
    dt_optim *o = dt_alloc_zero(sizeof *o);
    if (!o)
        return DT_ERR_NOMEM;
    int nt = dt_params_count(p);
    // Page-backed: a state that ZeRO shards before the first step is never written whole.
    o->state  = nstate ? dt_alloc_pages(nstate * sizeof(float)) : NULL;
    o->tgroup = dt_alloc(sizeof(int) * (size_t)(nt ? nt : 1));
    o->ranges = dt_alloc(sizeof(optim_range) * (size_t)(nt ? nt : 1));
    if ((nstate && !o->state) || !o->tgroup || !o->ranges) {
        dt_free_pages(o->state, nstate * sizeof(float));
        dt_free(o->tgroup), dt_free(o->ranges), dt_free(o);
        return DT_ERR_NOMEM;
    }
    o->kind      = kind;
    o->p         = p;
    o->params    = dt_params_data(p);
    o->grads     = dt_params_grads(p);
    o->n         = dt_params_numel(p);
    o->nstate    = nstate;
    o->lr        = lr;
    o->groups[0] = (optim_group){lr, wd, lr};
    o->ngroups   = 1;
    for (int t = 0; t < nt; t++)
        o->tgroup[t] = dt_params_info(p, t)->trainable ? 0 : -1;
    build_ranges(o);
    *out = o;
    return DT_OK;
}

dt_status dt_sgd_new(dt_optim **out, dt_params *p, const dt_sgd_opts *opts) {
    *out          = NULL;
    dt_sgd_opts o = opts ? *opts : dt_sgd_opts_default();
    DT_TRY(check_params("sgd", p));
    DT_TRY(check_range("sgd", "lr", o.lr, 0, INFINITY, false));
    DT_TRY(check_range("sgd", "momentum", o.momentum, 0, INFINITY, false));
    DT_TRY(check_range("sgd", "dampening", o.dampening, -INFINITY, INFINITY, false));
    DT_TRY(check_range("sgd", "weight_decay", o.weight_decay, 0, INFINITY, false));
    if (o.nesterov && (o.momentum <= 0 || o.dampening != 0))
        return dt_fail(DT_ERR_ARG,
                       "sgd: expected momentum > 0 and dampening 0 with nesterov, found "
                       "momentum %g and dampening %g",
                       (double)o.momentum, (double)o.dampening);
    size_t n = dt_params_numel(p);
    DT_TRY(dt_optim_alloc(out, DT_OPTIM_SGD, p, o.momentum != 0 ? n : 0, o.lr, o.weight_decay));
    (*out)->opts.sgd = o;
    (*out)->step     = dt_optim_step_sgd;
    return DT_OK;
}

static dt_status new_adam(dt_optim **out, dt_optim_kind kind, dt_params *p,
                          const dt_adam_opts *opts) {
    *out              = NULL;
    const char  *name = kind_names[kind];
    dt_adam_opts o =
        opts ? *opts : (kind == DT_OPTIM_ADAMW ? dt_adamw_opts_default() : dt_adam_opts_default());
    DT_TRY(check_params(name, p));
    DT_TRY(check_range(name, "lr", o.lr, 0, INFINITY, false));
    DT_TRY(check_range(name, "eps", o.eps, 0, INFINITY, false));
    DT_TRY(check_range(name, "beta1", o.beta1, 0, 1, true));
    DT_TRY(check_range(name, "beta2", o.beta2, 0, 1, true));
    DT_TRY(check_range(name, "weight_decay", o.weight_decay, 0, INFINITY, false));
    size_t n = dt_params_numel(p);
    DT_TRY(dt_optim_alloc(out, kind, p, (o.amsgrad ? 3 : 2) * n, o.lr, o.weight_decay));
    (*out)->opts.adam = o;
    (*out)->step      = dt_optim_step_adam;
    return DT_OK;
}

dt_status dt_adam_new(dt_optim **out, dt_params *p, const dt_adam_opts *opts) {
    return new_adam(out, DT_OPTIM_ADAM, p, opts);
}

dt_status dt_adamw_new(dt_optim **out, dt_params *p, const dt_adam_opts *opts) {
    return new_adam(out, DT_OPTIM_ADAMW, p, opts);
}

dt_status dt_adadelta_new(dt_optim **out, dt_params *p, const dt_adadelta_opts *opts) {
    *out               = NULL;
    dt_adadelta_opts o = opts ? *opts : dt_adadelta_opts_default();
    DT_TRY(check_params("adadelta", p));
    DT_TRY(check_range("adadelta", "lr", o.lr, 0, INFINITY, false));
    DT_TRY(check_range("adadelta", "rho", o.rho, 0, 1, false));
    DT_TRY(check_range("adadelta", "eps", o.eps, 0, INFINITY, false));
    DT_TRY(check_range("adadelta", "weight_decay", o.weight_decay, 0, INFINITY, false));
    DT_TRY(dt_optim_alloc(out, DT_OPTIM_ADADELTA, p, 2 * dt_params_numel(p), o.lr, o.weight_decay));
    (*out)->opts.adadelta = o;
    (*out)->step          = dt_optim_step_adadelta;
    return DT_OK;
}

// ------------------------------------------------------------------------ groups

dt_param_group_opts dt_param_group_opts_default(void) {
    return (dt_param_group_opts){.lr = -1.0f, .weight_decay = -1.0f};
}

dt_status dt_optim_add_group(dt_optim *o, dt_param_pred select, void *user,
                             const dt_param_group_opts *opts, int *group) {
    const char         *name = kind_names[o->kind];
    dt_param_group_opts g    = opts ? *opts : dt_param_group_opts_default();
    if (!select)
        return dt_fail(DT_ERR_ARG, "%s: expected a tensor predicate for the group, found NULL",
                       name);
    if (o->ngroups == DT_OPTIM_MAX_GROUPS)
        return dt_fail(DT_ERR_ARG, "%s: expected at most %d parameter groups, found one more", name,
                       DT_OPTIM_MAX_GROUPS);
    float lr = g.lr < 0 ? o->groups[0].lr : g.lr;
    float wd = g.weight_decay < 0 ? o->groups[0].weight_decay : g.weight_decay;
    DT_TRY(check_range(name, "group lr", lr, 0, INFINITY, false));
    DT_TRY(check_range(name, "group weight_decay", wd, 0, INFINITY, false));
    int gi        = o->ngroups++;
    o->groups[gi] = (optim_group){lr, wd, lr};
    for (int t = 0; t < dt_params_count(o->p); t++) {
        const dt_param_info *pi = dt_params_info(o->p, t);
        if (pi->trainable && select(pi, user))
            o->tgroup[t] = gi;
    }
    build_ranges(o);
    if (group)
        *group = gi;
    return DT_OK;
}

int dt_optim_num_groups(const dt_optim *o) {
    return o->ngroups;
}

int dt_optim_tensor_group(const dt_optim *o, int tensor) {
    return tensor >= 0 && tensor < dt_params_count(o->p) ? o->tgroup[tensor] : -1;
}

float dt_optim_group_lr(const dt_optim *o, int g) {
    return g >= 0 && g < o->ngroups ? o->groups[g].lr : NAN;
}

float dt_optim_group_initial_lr(const dt_optim *o, int g) {
    return g >= 0 && g < o->ngroups ? o->groups[g].initial_lr : NAN;
}

float dt_optim_group_weight_decay(const dt_optim *o, int g) {
    return g >= 0 && g < o->ngroups ? o->groups[g].weight_decay : NAN;
}

static dt_status check_group(const dt_optim *o, int g) {
    if (g < 0 || g >= o->ngroups)
        return dt_fail(DT_ERR_ARG, "%s: expected a group in [0, %d), found %d", kind_names[o->kind],
                       o->ngroups, g);
    return DT_OK;
}

dt_status dt_optim_set_group_lr(dt_optim *o, int g, float lr) {
    DT_TRY(check_group(o, g));
    DT_TRY(check_range(kind_names[o->kind], "lr", lr, 0, INFINITY, false));
    o->groups[g].lr = lr;
    if (g == 0)
        o->lr = lr;
    return DT_OK;
}

dt_status dt_optim_set_group_weight_decay(dt_optim *o, int g, float wd) {
    DT_TRY(check_group(o, g));
    DT_TRY(check_range(kind_names[o->kind], "weight_decay", wd, 0, INFINITY, false));
    o->groups[g].weight_decay = wd;
    return DT_OK;
}

dt_params *dt_optim_params(dt_optim *o) {
    return o->p;
}

void dt_optim_free(dt_optim *o) {
    if (!o)
        return;
    dt_free_pages(o->state, o->nstate * sizeof(float));
    dt_free(o->tgroup);
    dt_free(o->ranges);
    dt_free(o->flat_off);
    dt_free(o);
}

dt_status dt_optim_shard(dt_optim *o, dt_params *shard, const int *src_tensor,
                         const size_t *flat_off) {
    const char *name = kind_names[o->kind];
    if (o->flat_off)
        return dt_fail(DT_ERR_STATE,
                       "%s: expected an optimizer over a whole table, found one "
                       "already sharded",
                       name);
    if (!shard || (dt_params_count(shard) && (!src_tensor || !flat_off)))
        return dt_fail(DT_ERR_ARG, "%s: expected a shard table and its pieces, found NULL", name);
    int    nt = dt_params_count(shard), full_nt = dt_params_count(o->p);
    size_t ns = dt_params_numel(shard), nblocks = o->n ? o->nstate / o->n : 0;
    for (int i = 0; i < nt; i++) {
        const dt_param_info *pi  = dt_params_info(shard, i);
        const dt_param_info *src = src_tensor[i] >= 0 && src_tensor[i] < full_nt
                                       ? dt_params_info(o->p, src_tensor[i])
                                       : NULL;
        if (!src || flat_off[i] < src->offset || flat_off[i] + pi->count > src->offset + src->count)
            return dt_fail(DT_ERR_ARG,
                           "%s: shard tensor %s: expected a piece of a tensor of the optimizer's "
                           "table, found tensor index %d at float %zu (+%zu)",
                           name, pi->name, src_tensor[i], flat_off[i], pi->count);
    }
    float       *state  = nblocks && ns ? dt_alloc_pages(nblocks * ns * sizeof(float)) : NULL;
    int         *tgroup = dt_alloc(sizeof(int) * (size_t)(nt ? nt : 1));
    size_t      *off    = dt_alloc(sizeof(size_t) * (size_t)(nt ? nt : 1));
    optim_range *ranges = dt_alloc(sizeof(optim_range) * (size_t)(nt ? nt : 1));
    if ((nblocks && ns && !state) || !tgroup || !off || !ranges) {
        dt_free_pages(state, nblocks * ns * sizeof(float));
        dt_free(tgroup), dt_free(off), dt_free(ranges);
        return DT_ERR_NOMEM;
    }
    for (int i = 0; i < nt; i++) {
        const dt_param_info *pi = dt_params_info(shard, i);
        tgroup[i]               = pi->trainable ? o->tgroup[src_tensor[i]] : -1;
        off[i]                  = flat_off[i];
        for (size_t b = 0; b < nblocks; b++) // the state so far (a loaded checkpoint's)
            memcpy(state + b * ns + pi->offset, o->state + b * o->n + flat_off[i],
                   pi->count * sizeof(float));
    }
    dt_free_pages(o->state, o->nstate * sizeof(float));
    dt_free(o->tgroup), dt_free(o->ranges);
    o->full_n   = o->n;
    o->state    = state;
    o->nstate   = nblocks * ns;
    o->tgroup   = tgroup;
    o->ranges   = ranges;
    o->flat_off = off;
    o->whole    = o->p;
    o->p        = shard; // o->params and o->grads stay the whole table's
    o->n        = ns;
    build_ranges(o);
    return DT_OK;
}

bool dt_optim_sharded(const dt_optim *o, size_t *full_numel, const size_t **flat_off) {
    if (full_numel)
        *full_numel = o->flat_off ? o->full_n : o->n;
    if (flat_off)
        *flat_off = o->flat_off;
    return o->flat_off != NULL;
}

void dt_optim_step(dt_optim *o) {
    DT_TRACE_BEGIN(tr);
    o->steps++;
    for (int i = 0; i < o->nranges; i++) {
        const optim_range *r = &o->ranges[i];
        const optim_group *g = &o->groups[r->group];
        o->step(o, r->off, r->poff, r->n, g->lr, g->weight_decay);
    }
    DT_TRACE_END(tr, "optim", "optimizer step", NULL, 0);
}

void dt_optim_zero_grad(dt_optim *o) {
    dt_params_zero_grad(o->whole ? o->whole : o->p); // as the table says (ZeRO-3 discards)
}

float dt_optim_lr(const dt_optim *o) {
    return o->lr;
}

dt_status dt_optim_set_lr(dt_optim *o, float lr) {
    DT_TRY(check_range(kind_names[o->kind], "lr", lr, 0, INFINITY, false));
    o->lr = lr;
    for (int g = 0; g < o->ngroups; g++)
        o->groups[g].lr = lr;
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
