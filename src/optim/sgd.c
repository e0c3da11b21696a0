// sgd.c: torch.optim.SGD (https://pytorch.org/docs/stable/generated/torch.optim.SGD.html),
// one pass over the flat buffers per step.
#include "optim_impl.h"

#include "core/simd.h"

typedef struct sgd_consts {
    float lr, wd, mu;
    float one_minus_damp;
} sgd_consts;

// One loop body for every option set. The flags are compile-time constants at each
// call below, so each instance is a branch-free loop the vectorizer accepts. With
// decay off the wd·p term is not formed at all (0·inf would be NaN), as in PyTorch.
static inline __attribute__((always_inline)) void
sgd_range(float *restrict p, const float *restrict g, float *restrict b, size_t lo, size_t hi,
          sgd_consts k, const bool decay, const bool momentum, const bool nesterov,
          const bool first) {
    for (size_t i = lo; i < hi; i++) {
        float gi = decay ? g[i] + k.wd * p[i] : g[i];
        if (momentum) {
            // PyTorch creates the buffer as a copy of the first gradient.
            float bi = first ? gi : k.mu * b[i] + k.one_minus_damp * gi;
            b[i]     = bi;
            gi       = nesterov ? gi + k.mu * bi : bi;
        }
        p[i] = p[i] - k.lr * gi;
    }
}

#define SGD_CASE(d, m, ne, f)                                                                      \
    case (d) | (m) << 1 | (ne) << 2 | (f) << 3:                                                    \
        sgd_range(p, g, b, 0, n16, k, d, m, ne, f);                                                \
        sgd_range(p, g, b, n16, n, k, d, m, ne, f);                                                \
        break;

DT_CLONES static void sgd_update(float *restrict p, const float *restrict g, float *restrict b,
                                 size_t n, sgd_consts k, unsigned flags) {
    size_t n16 = DT_OPTIM_VEC_SPLIT(n);
    switch (flags) {
        SGD_CASE(0, 0, 0, 0)
        SGD_CASE(1, 0, 0, 0)
        SGD_CASE(0, 1, 0, 0)
        SGD_CASE(1, 1, 0, 0)
        SGD_CASE(0, 1, 1, 0)
        SGD_CASE(1, 1, 1, 0)
        SGD_CASE(0, 1, 0, 1)
        SGD_CASE(1, 1, 0, 1)
        SGD_CASE(0, 1, 1, 1)
        SGD_CASE(1, 1, 1, 1)
    default:
        DT_ASSERT(!"unreachable SGD flag set");
    }
}

void dt_optim_step_sgd(dt_optim *o, size_t off, size_t poff, size_t n, float lr, float wd) {
    const dt_sgd_opts *s     = &o->opts.sgd;
    sgd_consts         k     = {lr, wd, s->momentum, 1.0f - s->dampening};
    bool               mom   = s->momentum != 0.0f;
    unsigned           flags = (unsigned)(wd != 0.0f) | (unsigned)mom << 1 |
                     (unsigned)(mom && s->nesterov) << 2 | (unsigned)(mom && o->steps == 1) << 3;
    sgd_update(o->params + poff, o->grads + poff, o->state ? o->state + off : NULL, n, k, flags);
}
