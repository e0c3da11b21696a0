// sgd.c: torch.optim.SGD (https://pytorch.org/docs/stable/generated/torch.optim.SGD.html),
// one pass over the flat buffers per step.
#include "optim_impl.h"

void dt_optim_step_sgd(dt_optim *o, size_t off, size_t poff, size_t n, float lr, float wd) {
    const dt_sgd_opts *s     = &o->opts.sgd;
    dt_ksgd            k     = {lr, wd, s->momentum, 1.0f - s->dampening};
    bool               mom   = s->momentum != 0.0f;
    unsigned           flags = (unsigned)(wd != 0.0f) | (unsigned)mom << 1 |
                     (unsigned)(mom && s->nesterov) << 2 | (unsigned)(mom && o->steps == 1) << 3;
    // the loop: a row of the kernel table (kernels/vec/optim.c), one instance per flag set
    dt_k()->sgd(o->params + poff, o->grads + poff, o->state ? o->state + off : NULL, n, k, flags);
}
