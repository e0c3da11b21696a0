// act.c: element-wise activations, softmax over the last dimension, the residual add,
// the gradient sums of Embedding, and the cross-entropy's row kernels (the rows of
// nn/ops.h's element-wise functions; vec.h). Memory-bound loops; the exponentials
// (tanh-GELU, sigmoid, SiLU, softmax, the losses) go through vexp on the target's vector
// (vec.h). Tanh keeps libm's tanhf: 1 - 2/(e^2x + 1) would lose the relative accuracy of
// tanh near 0; inside GELU only the absolute error matters (x/2 (1 + tanh)).
#include "kernels/vec/vec.h"

#include <math.h>
#include <string.h>

#define SQRT_2_OVER_PI 0.7978845608028654f
#define INV_SQRT_2     0.7071067811865476f
#define INV_SQRT_2PI   0.3989422804014327f
#define GELU_CUBIC     0.044715f

// tanh u = 1 - 2 / (e^2u + 1): exact at the ends (e^2u = 0 or saturated), absolute
// error ~1e-7 near 0.
DT_VINLINE vf vtanh(vf u) {
    return 1.0f - 2.0f / (vexp(2.0f * u) + 1.0f);
}

DT_VINLINE vf vsigmoid(vf x) {
    return 1.0f / (1.0f + vexp(-x));
}

static void gelu_fwd(size_t n, bool tanh_approx, const float *x, float *y) {
    if (tanh_approx) {
        for (size_t i = 0; i < n; i += VL) {
            size_t len = n - i < VL ? n - i : VL;
            vf     v   = len == VL ? vload(x + i) : vload_part(x + i, len);
            vf     t   = vtanh(SQRT_2_OVER_PI * (v + GELU_CUBIC * v * v * v));
            vf     r   = 0.5f * v * (1.0f + t);
            if (len == VL)
                vstore(y + i, r);
            else
                vstore_part(y + i, r, len);
        }
    } else {
        for (size_t i = 0; i < n; i++)
            y[i] = 0.5f * x[i] * (1.0f + erff(x[i] * INV_SQRT_2));
    }
}

// d/dx of x Phi(x) = Phi(x) + x phi(x); of the tanh form with u = sqrt(2/pi)(x + c x^3):
// 0.5 (1 + tanh u) + 0.5 x (1 - tanh^2 u) sqrt(2/pi) (1 + 3 c x^2).
static void gelu_bwd(size_t n, bool tanh_approx, const float *x, const float *dy, float *dx) {
    if (tanh_approx) {
        for (size_t i = 0; i < n; i += VL) {
            size_t len = n - i < VL ? n - i : VL;
            vf     v   = len == VL ? vload(x + i) : vload_part(x + i, len);
            vf     d   = len == VL ? vload(dy + i) : vload_part(dy + i, len);
            vf     v2  = v * v;
            vf     t   = vtanh(SQRT_2_OVER_PI * (v + GELU_CUBIC * v2 * v));
            vf     g   = 0.5f * (1.0f + t) +
                   0.5f * v * (1.0f - t * t) * SQRT_2_OVER_PI * (1.0f + 3.0f * GELU_CUBIC * v2);
            if (len == VL)
                vstore(dx + i, d * g);
            else
                vstore_part(dx + i, d * g, len);
        }
    } else {
        for (size_t i = 0; i < n; i++) {
            float v   = x[i];
            float cdf = 0.5f * (1.0f + erff(v * INV_SQRT_2));
            float pdf = INV_SQRT_2PI * expf(-0.5f * v * v);
            dx[i]     = dy[i] * (cdf + v * pdf);
        }
    }
}

// Branch-free: a branch per element mispredicts on every other value of a trained
// network's activations (the scalar loop with `x > 0 ? x : 0` took a sixth of the
// ResNet's step).
static void relu_fwd(size_t n, const float *x, float *y) {
    size_t i = 0;
    for (; i + VL <= n; i += VL) {
        vf v = vload(x + i);
        vstore(y + i, vkeep_positive(v, v));
    }
    for (; i < n; i++)
        y[i] = x[i] > 0.0f ? x[i] : 0.0f;
}

static void relu_grad(size_t n, const float *y, const float *dy, float *dx) {
    size_t i = 0;
    for (; i + VL <= n; i += VL)
        vstore(dx + i, vkeep_positive(vload(y + i), vload(dy + i)));
    for (; i < n; i++)
        dx[i] = y[i] > 0.0f ? dy[i] : 0.0f;
}

static void tanh_fwd(size_t n, const float *x, float *y) {
    for (size_t i = 0; i < n; i++)
        y[i] = tanhf(x[i]);
}

static void tanh_bwd(size_t n, const float *y, const float *dy, float *dx) {
    for (size_t i = 0; i < n; i++)
        dx[i] = dy[i] * (1.0f - y[i] * y[i]);
}

// 1/(1 + e^-x): e^-x saturates at e^88 for x < -88, where sigmoid is below 1e-38.
static void sigmoid_fwd(size_t n, const float *x, float *y) {
    for (size_t i = 0; i < n; i += VL) {
        size_t len = n - i < VL ? n - i : VL;
        if (len == VL)
            vstore(y + i, vsigmoid(vload(x + i)));
        else
            vstore_part(y + i, vsigmoid(vload_part(x + i, len)), len);
    }
}

static void sigmoid_bwd(size_t n, const float *y, const float *dy, float *dx) {
    for (size_t i = 0; i < n; i++)
        dx[i] = dy[i] * y[i] * (1.0f - y[i]);
}

static void silu_fwd(size_t n, const float *x, float *y) {
    for (size_t i = 0; i < n; i += VL) {
        size_t len = n - i < VL ? n - i : VL;
        vf     v   = len == VL ? vload(x + i) : vload_part(x + i, len);
        if (len == VL)
            vstore(y + i, v * vsigmoid(v));
        else
            vstore_part(y + i, v * vsigmoid(v), len);
    }
}

// d/dx x s(x) = s (1 + x (1 - s))
static void silu_bwd(size_t n, const float *x, const float *dy, float *dx) {
    for (size_t i = 0; i < n; i += VL) {
        size_t len = n - i < VL ? n - i : VL;
        vf     v   = len == VL ? vload(x + i) : vload_part(x + i, len);
        vf     d   = len == VL ? vload(dy + i) : vload_part(dy + i, len);
        vf     s = vsigmoid(v), r = d * s * (1.0f + v * (1.0f - s));
        if (len == VL)
            vstore(dx + i, r);
        else
            vstore_part(dx + i, r, len);
    }
}

static void softmax_fwd(int rows, int d, const float *x, float *y) {
    for (int r = 0; r < rows; r++) {
        const float *xr = x + (size_t)r * d;
        float       *yr = y + (size_t)r * d;
        if (yr != xr)
            memcpy(yr, xr, sizeof(float) * (size_t)d);
        float m   = vmax_row(yr, (size_t)d);
        float inv = 1.0f / vexp_row(yr, (size_t)d, m);
        for (int i = 0; i < d; i++)
            yr[i] *= inv;
    }
}

static void softmax_bwd(int rows, int d, const float *y, const float *dy, float *dx) {
    for (int r = 0; r < rows; r++) {
        const float *yr = y + (size_t)r * d;
        const float *dr = dy + (size_t)r * d;
        float       *gr = dx + (size_t)r * d;
        float        s  = 0.0f;
        for (int i = 0; i < d; i++)
            s += dr[i] * yr[i];
        for (int i = 0; i < d; i++)
            gr[i] = yr[i] * (dr[i] - s);
    }
}

static void add(size_t n, const float *a, const float *b, float *y) {
    for (size_t i = 0; i < n; i++)
        y[i] = a[i] + b[i];
}

static void accumulate(size_t n, const float *src, float *dst) {
    for (size_t i = 0; i < n; i++)
        dst[i] += src[i];
}

static void embedding_bwd(int count, int d, const int32_t *idx, const float *dy, float *dw) {
    for (int i = 0; i < count; i++) {
        float       *row = dw + (size_t)idx[i] * d;
        const float *g   = dy + (size_t)i * d;
        for (int j = 0; j < d; j++)
            row[j] += g[j];
    }
}

// log sum_i e^x[i], as max + log sum e^(x - max)
static double ce_row_lse(const float *x, int k) {
    float m       = vmax_row(x, (size_t)k);
    vf    acc[VH] = {0}, mv = vsplat(m);
    int   i = 0;
    for (; i + 16 <= k; i += 16)
        UNROLL(2) for (int h = 0; h < VH; h++) acc[h] += vexp(vload(x + i + h * VL) - mv);
    float z = vhsum16(acc);
    for (; i < k; i++) {
        vf e = vexp(vsplat(x[i] - m));
        z += e[0];
    }
    return (double)m + log((double)z);
}

// d = (e^(x - lse) - smooth) * inv, then d[t] -= hot
static void ce_row_grad(const float *x, int k, float lse, float smooth, float inv, float *d, int t,
                        float hot) {
    memcpy(d, x, sizeof(float) * (size_t)k);
    vexp_row(d, (size_t)k, lse);
    for (int i = 0; i < k; i++)
        d[i] = (d[i] - smooth) * inv;
    d[t] -= hot;
}

void DT_KV(fill_act)(dt_ktab *t) {
    t->gelu_fwd      = gelu_fwd;
    t->gelu_bwd      = gelu_bwd;
    t->relu_fwd      = relu_fwd;
    t->relu_grad     = relu_grad;
    t->tanh_fwd      = tanh_fwd;
    t->tanh_bwd      = tanh_bwd;
    t->sigmoid_fwd   = sigmoid_fwd;
    t->sigmoid_bwd   = sigmoid_bwd;
    t->silu_fwd      = silu_fwd;
    t->silu_bwd      = silu_bwd;
    t->softmax_fwd   = softmax_fwd;
    t->softmax_bwd   = softmax_bwd;
    t->add           = add;
    t->accumulate    = accumulate;
    t->embedding_bwd = embedding_bwd;
    t->ce_row_lse    = ce_row_lse;
    t->ce_row_grad   = ce_row_grad;
}
