// adam.c: torch.optim.Adam and torch.optim.AdamW
// (https://pytorch.org/docs/stable/generated/torch.optim.Adam.html, .../AdamW.html),
// in PyTorch's operation order: the scalars (bias corrections, step size) in double,
// every element in float.
#include "optim_impl.h"

#include <math.h>

void dt_optim_step_adam(dt_optim *o, size_t off, size_t poff, size_t n, float lr, float wd) {
    const dt_adam_opts *a   = &o->opts.adam;
    double              t   = (double)o->steps;
    double              bc1 = 1.0 - pow((double)a->beta1, t);
    double              bc2 = 1.0 - pow((double)a->beta2, t);
    bool                w   = o->kind == DT_OPTIM_ADAMW;
    dt_kadam            k   = {
                     .b1        = a->beta1,
                     .b2        = a->beta2,
                     .c1        = 1.0f - a->beta1,
                     .c2        = 1.0f - a->beta2,
                     .wd        = w ? 0.0f : wd,
                     .decay     = w ? (float)(1.0 - (double)lr * (double)wd) : 1.0f,
                     .step_size = (float)((double)lr / bc1),
                     .bc2_sqrt  = (float)sqrt(bc2),
                     .eps       = a->eps,
    };
    unsigned       flags = (unsigned)(k.wd != 0.0f) | (unsigned)a->amsgrad << 1;
    float         *m = o->state + off, *v = o->state + o->n + off;
    float         *vmax = a->amsgrad ? o->state + 2 * o->n + off : NULL;
    float         *p = o->params + poff, *g = o->grads + poff;
    float          d[DT_OPTIM_BLOCK];
    const dt_ktab *kt = dt_k(); // the loops: kernels/vec/optim.c
    for (size_t at = 0; at < n; at += DT_OPTIM_BLOCK) {
        size_t len = n - at < DT_OPTIM_BLOCK ? n - at : DT_OPTIM_BLOCK;
        kt->adam_moments(p + at, g + at, m + at, v + at, vmax ? vmax + at : NULL, d, len, k, flags);
        kt->vsqrt(d, len);
        kt->adam_apply(p + at, m + at, d, len, k);
    }
}
