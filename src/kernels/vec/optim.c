// optim.c: the element loops of the optimizers, gradient clipping and the gradient
// scaler (src/optim computes the per-step constants in PyTorch's operation order and
// calls these rows; vec.h). Each update is one loop body per option set: the flags are
// compile-time constants in each instance, so every instance is a branch-free loop the
// vectorizer accepts.
#include "kernels/vec/vec.h"

#include <math.h>

// Main loops run over n rounded down to a multiple of 16: at -O2 GCC vectorizes a loop
// only when no scalar remainder is needed; the remainder gets its own short loop.
#define VEC_SPLIT(n) ((n) & ~(size_t)15)

// One loop body for every option set. The flags are compile-time constants at each
// call below, so each instance is a branch-free loop the vectorizer accepts. With
// decay off the wd·p term is not formed at all (0·inf would be NaN), as in PyTorch.
static inline __attribute__((always_inline)) void
sgd_range(float *restrict p, const float *restrict g, float *restrict b, size_t lo, size_t hi,
          dt_ksgd k, const bool decay, const bool momentum, const bool nesterov, const bool first) {
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

static void sgd(float *restrict p, const float *restrict g, float *restrict b, size_t n, dt_ksgd k,
                unsigned flags) {
    size_t n16 = VEC_SPLIT(n);
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

// Moments of one block; leaves v̂ in d for the square root.
static inline __attribute__((always_inline)) void
moments_range(const float *restrict p, const float *restrict g, float *restrict m,
              float *restrict v, float *restrict vmax, float *restrict d, size_t lo, size_t hi,
              dt_kadam k, const bool l2, const bool amsgrad) {
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

static void adam_moments(const float *restrict p, const float *restrict g, float *restrict m,
                         float *restrict v, float *restrict vmax, float *restrict d, size_t n,
                         dt_kadam k, unsigned flags) {
    size_t n16 = VEC_SPLIT(n);
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
                                                              size_t hi, dt_kadam k) {
    for (size_t i = lo; i < hi; i++) {
        float denom = s[i] / k.bc2_sqrt + k.eps;
        p[i]        = p[i] * k.decay - k.step_size * (m[i] / denom);
    }
}

static void adam_apply(float *restrict p, const float *restrict m, const float *restrict s,
                       size_t n, dt_kadam k) {
    size_t n16 = VEC_SPLIT(n);
    apply_range(p, m, s, 0, n16, k);
    apply_range(p, m, s, n16, n, k);
}

// v = ρ·v + (1 − ρ)·g²; leaves v + eps in sv and u + eps in su (two restrict pointers
// into one block, so the vectorizer needs no overlap check).
static inline __attribute__((always_inline)) void
square_range(const float *restrict p, const float *restrict g, float *restrict sq,
             const float *restrict acc, float *restrict sv, float *restrict su, size_t lo,
             size_t hi, dt_kadadelta k, const bool decay) {
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
            dt_kadadelta k, const bool decay) {
    for (size_t i = lo; i < hi; i++) {
        float gi    = decay ? g[i] + k.wd * p[i] : g[i];
        float delta = su[i] / sv[i] * gi;
        acc[i]      = k.rho * acc[i] + k.c * delta * delta;
        p[i]        = p[i] - k.lr * delta;
    }
}

static void adadelta_sq(const float *restrict p, const float *restrict g, float *restrict sq,
                        const float *restrict acc, float *restrict sv, float *restrict su, size_t n,
                        dt_kadadelta k) {
    size_t n16 = VEC_SPLIT(n);
    if (k.wd != 0.0f) {
        square_range(p, g, sq, acc, sv, su, 0, n16, k, true);
        square_range(p, g, sq, acc, sv, su, n16, n, k, true);
    } else {
        square_range(p, g, sq, acc, sv, su, 0, n16, k, false);
        square_range(p, g, sq, acc, sv, su, n16, n, k, false);
    }
}

static void adadelta_delta(float *restrict p, const float *restrict g, float *restrict acc,
                           const float *restrict sv, const float *restrict su, size_t n,
                           dt_kadadelta k) {
    size_t n16 = VEC_SPLIT(n);
    if (k.wd != 0.0f) {
        delta_range(p, g, acc, sv, su, 0, n16, k, true);
        delta_range(p, g, acc, sv, su, n16, n, k, true);
    } else {
        delta_range(p, g, acc, sv, su, 0, n16, k, false);
        delta_range(p, g, acc, sv, su, n16, n, k, false);
    }
}

// Sum of squares of g[0, n) in double (in 4 lanes, so the compiler can vectorise).
static double sum_squares(const float *g, size_t n) {
    double s[4] = {0, 0, 0, 0};
    size_t i    = 0;
    for (; i + 4 <= n; i += 4)
        for (int k = 0; k < 4; k++)
            s[k] += (double)g[i + k] * (double)g[i + k];
    for (; i < n; i++)
        s[0] += (double)g[i] * (double)g[i];
    return (s[0] + s[1]) + (s[2] + s[3]);
}

static void scale(float *g, size_t n, float c) {
    for (size_t i = 0; i < n; i++)
        g[i] *= c;
}

// g *= inv; returns whether any input was inf or NaN (checked before the multiply, as
// PyTorch's _amp_foreach_non_finite_check_and_unscale_ does).
static bool unscale_check(float *g, size_t n, float inv) {
    int bad = 0;
    for (size_t i = 0; i < n; i++) {
        float v = g[i];
        bad |= (v - v) != 0.0f || v != v; // inf - inf and NaN are NaN
        g[i] = v * inv;
    }
    return bad != 0;
}

// The square roots of Adam and Adadelta (sqrtf is correctly rounded: every target gives
// the same bits), in the split loops the vectorizer takes (-fno-math-errno: no call).
static void vsqrt(float *x, size_t n) {
    size_t n16 = VEC_SPLIT(n);
    for (size_t i = 0; i < n16; i++)
        x[i] = sqrtf(x[i]);
    for (size_t i = n16; i < n; i++)
        x[i] = sqrtf(x[i]);
}

void DT_KV(fill_optim)(dt_ktab *t) {
    t->sgd            = sgd;
    t->adam_moments   = adam_moments;
    t->adam_apply     = adam_apply;
    t->adadelta_sq    = adadelta_sq;
    t->adadelta_delta = adadelta_delta;
    t->sum_squares    = sum_squares;
    t->scale          = scale;
    t->unscale_check  = unscale_check;
    t->vsqrt          = vsqrt;
}
