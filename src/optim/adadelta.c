// adadelta.c: torch.optim.Adadelta
// (https://pytorch.org/docs/stable/generated/torch.optim.Adadelta.html), the seed
// script's optimizer, in PyTorch's operation order.
#include "optim_impl.h"

#include <math.h>

void dt_optim_step_adadelta(dt_optim *o, size_t off, size_t poff, size_t n, float lr, float wd) {
    const dt_adadelta_opts *a  = &o->opts.adadelta;
    dt_kadadelta            k  = {lr, a->rho, 1.0f - a->rho, a->eps, wd};
    float                  *sq = o->state + off, *acc = o->state + o->n + off;
    float                  *p = o->params + poff, *g = o->grads + poff;
    float                   s[2 * DT_OPTIM_BLOCK];
    const dt_ktab          *kt = dt_k(); // the loops: kernels/vec/optim.c
    for (size_t at = 0; at < n; at += DT_OPTIM_BLOCK) {
        size_t len = n - at < DT_OPTIM_BLOCK ? n - at : DT_OPTIM_BLOCK;
        kt->adadelta_sq(p + at, g + at, sq + at, acc + at, s, s + len, len, k);
        kt->vsqrt(s, 2 * len);
        kt->adadelta_delta(p + at, g + at, acc + at, s, s + len, len, k);
    }
}
