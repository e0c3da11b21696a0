// adam.c: torch.optim.Adam and torch.optim.AdamW
// (https://pytorch.org/docs/stable/generated/torch.optim.Adam.html, .../AdamW.html),
// in PyTorch's operation order: the scalars (bias corrections, step size) in double,
// every element in float.
#include "optim_impl.h"

#include "core/simd.h"

#include <math.h>

typedef struct adam_consts {
    float b1, b2;
    float c1, c2;    // 1 - beta1, 1 - beta2
    float wd;        // Adam: g += wd·p; AdamW: 0
    float decay;     // AdamW: p ·= 1 - lr·wd; Adam: 1 (exact no-op)
    float step_size; // lr / (1 - beta1^t)
    float bc2_sqrt;  // sqrt(1 - beta2^t)
    float eps;
} adam_consts;

// Moments of one block; leaves v̂ in d for the square root.
static inline __attribute__((always_inline)) void
moments_range(const float *restrict p, const float *restrict g, float *restrict m,
              float *restrict v, float *restrict vmax, float *restrict d, size_t lo, size_t hi,
              adam_consts k, const bool l2, const bool amsgrad) {
    for (size_t i = lo; i < hi; i++) {
        float gi = l2 ? g[i] + k.wd * p[i] : g[i];
        float mi = k.b1 * m[i] + k.c1 * gi;
        float vi = k.b2 * v[i] + k.c2 * gi * gi;
        m[i]     = mi;
        v[i]     = vi;
        if (amsgrad) {
            vi      = vmax[i] > vi ? vmax[i] : vi;
            vmax[i] = vi;
        }
        d[i] = vi;
    }
}

#define MOMENTS_CASE(l2, ams)                                                                      \
    case (l2) | (ams) << 1:                                                                        \
        moments_range(p, g, m, v, vmax, d, 0, n16, k, l2, ams);                                    \
        moments_range(p, g, m, v, vmax, d, n16, n, k, l2, ams);                                    \
        break;

DT_CLONES static void adam_moments(const float *restrict p, const float *restrict g,
                                   float *restrict m, float *restrict v, float *restrict vmax,
                                   float *restrict d, size_t n, adam_consts k, unsigned flags) {
    size_t n16 = DT_OPTIM_VEC_SPLIT(n);
    switch (flags) {
        MOMENTS_CASE(0, 0)
        MOMENTS_CASE(1, 0)
        MOMENTS_CASE(0, 1)
        MOMENTS_CASE(1, 1)
    default:
        DT_ASSERT(!"unreachable Adam flag set");
    }
}

// p = p·decay − step_size · m / (sqrt(v̂) / sqrt(1 − β2^t) + eps), with sqrt(v̂) in s.
static inline __attribute__((always_inline)) void apply_range(float *restrict p,
                                                              const float *restrict m,
                                                              const float *restrict s, size_t lo,
                                                              size_t hi, adam_consts k) {
    for (size_t i = lo; i < hi; i++) {
        float denom = s[i] / k.bc2_sqrt + k.eps;
        p[i]        = p[i] * k.decay - k.step_size * (m[i] / denom);
    }
}

DT_CLONES static void adam_apply(float *restrict p, const float *restrict m,
                                 const float *restrict s, size_t n, adam_consts k) {
    size_t n16 = DT_OPTIM_VEC_SPLIT(n);
    apply_range(p, m, s, 0, n16, k);
    apply_range(p, m, s, n16, n, k);
}

void dt_optim_step_adam(dt_optim *o, size_t off, size_t poff, size_t n, float lr, float wd) {
    const dt_adam_opts *a   = &o->opts.adam;
    double              t   = (double)o->steps;
    double              bc1 = 1.0 - pow((double)a->beta1, t);
    double              bc2 = 1.0 - pow((double)a->beta2, t);
    bool                w   = o->kind == DT_OPTIM_ADAMW;
    adam_consts         k   = {
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
    unsigned flags = (unsigned)(k.wd != 0.0f) | (unsigned)a->amsgrad << 1;
    float   *m = o->state + off, *v = o->state + o->n + off;
    float   *vmax = a->amsgrad ? o->state + 2 * o->n + off : NULL;
    float   *p = o->params + poff, *g = o->grads + poff;
    float    d[DT_OPTIM_BLOCK];
    for (size_t at = 0; at < n; at += DT_OPTIM_BLOCK) {
        size_t len = n - at < DT_OPTIM_BLOCK ? n - at : DT_OPTIM_BLOCK;
        adam_moments(p + at, g + at, m + at, v + at, vmax ? vmax + at : NULL, d, len, k, flags);
        dt_optim_sqrt(d, len);
        adam_apply(p + at, m + at, d, len, k);
    }
}
