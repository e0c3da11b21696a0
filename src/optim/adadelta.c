// adadelta.c: torch.optim.Adadelta
// (https://pytorch.org/docs/stable/generated/torch.optim.Adadelta.html), the seed
// script's optimizer, in PyTorch's operation order.
#include "optim_impl.h"

#include "core/simd.h"

#include <math.h>

typedef struct adadelta_consts {
    float lr, rho, c, eps, wd; // c = 1 - rho
} adadelta_consts;

// v = ρ·v + (1 − ρ)·g²; leaves v + eps in sv and u + eps in su (two restrict pointers
// into one block, so the vectorizer needs no overlap check).
static inline __attribute__((always_inline)) void
square_range(const float *restrict p, const float *restrict g, float *restrict sq,
             const float *restrict acc, float *restrict sv, float *restrict su, size_t lo,
             size_t hi, adadelta_consts k, const bool decay) {
    for (size_t i = lo; i < hi; i++) {
        float gi = decay ? g[i] + k.wd * p[i] : g[i];
        float si = k.rho * sq[i] + k.c * gi * gi;
        sq[i]    = si;
        sv[i]    = si + k.eps;
        su[i]    = acc[i] + k.eps;
    }
}

// Δ = sqrt(u + eps) / sqrt(v + eps) · g; u = ρ·u + (1 − ρ)·Δ²; p −= lr·Δ.
static inline __attribute__((always_inline)) void
delta_range(float *restrict p, const float *restrict g, float *restrict acc,
            const float *restrict sv, const float *restrict su, size_t lo, size_t hi,
            adadelta_consts k, const bool decay) {
    for (size_t i = lo; i < hi; i++) {
        float gi    = decay ? g[i] + k.wd * p[i] : g[i];
        float delta = su[i] / sv[i] * gi;
        acc[i]      = k.rho * acc[i] + k.c * delta * delta;
        p[i]        = p[i] - k.lr * delta;
    }
}

DT_CLONES static void adadelta_square(const float *restrict p, const float *restrict g,
                                      float *restrict sq, const float *restrict acc,
                                      float *restrict sv, float *restrict su, size_t n,
                                      adadelta_consts k) {
    size_t n16 = DT_OPTIM_VEC_SPLIT(n);
    if (k.wd != 0.0f) {
        square_range(p, g, sq, acc, sv, su, 0, n16, k, true);
        square_range(p, g, sq, acc, sv, su, n16, n, k, true);
    } else {
        square_range(p, g, sq, acc, sv, su, 0, n16, k, false);
        square_range(p, g, sq, acc, sv, su, n16, n, k, false);
    }
}

DT_CLONES static void adadelta_delta(float *restrict p, const float *restrict g,
                                     float *restrict acc, const float *restrict sv,
                                     const float *restrict su, size_t n, adadelta_consts k) {
    size_t n16 = DT_OPTIM_VEC_SPLIT(n);
    if (k.wd != 0.0f) {
        delta_range(p, g, acc, sv, su, 0, n16, k, true);
        delta_range(p, g, acc, sv, su, n16, n, k, true);
    } else {
        delta_range(p, g, acc, sv, su, 0, n16, k, false);
        delta_range(p, g, acc, sv, su, n16, n, k, false);
    }
}

void dt_optim_step_adadelta(dt_optim *o, size_t off, size_t poff, size_t n, float lr, float wd) {
    const dt_adadelta_opts *a  = &o->opts.adadelta;
    adadelta_consts         k  = {lr, a->rho, 1.0f - a->rho, a->eps, wd};
    float                  *sq = o->state + off, *acc = o->state + o->n + off;
    float                  *p = o->params + poff, *g = o->grads + poff;
    float                   s[2 * DT_OPTIM_BLOCK];
    for (size_t at = 0; at < n; at += DT_OPTIM_BLOCK) {
        size_t len = n - at < DT_OPTIM_BLOCK ? n - at : DT_OPTIM_BLOCK;
        adadelta_square(p + at, g + at, sq + at, acc + at, s, s + len, len, k);
        dt_optim_sqrt(s, 2 * len);
        adadelta_delta(p + at, g + at, acc + at, s, s + len, len, k);
    }
}
