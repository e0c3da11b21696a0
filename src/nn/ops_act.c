// ops_act.c: element-wise activations, softmax over the last dimension, the residual
// add and Embedding (ops.h). Memory-bound loops; DT_CLONES gives them wide versions, and
// the exponentials (tanh-GELU, sigmoid, SiLU, softmax) go through dt_vexp16, sixteen
// lanes at a time. Tanh keeps libm's tanhf: 1 - 2/(e^2x + 1) would lose the relative
// accuracy of tanh near 0; inside GELU only the absolute error matters (x/2 (1 + tanh)).
#include "nn/ops.h"
#include "nn/ops_math.h"

#include <math.h>
#include <string.h>

#define SQRT_2_OVER_PI 0.7978845608028654f
#define INV_SQRT_2     0.7071067811865476f
#define INV_SQRT_2PI   0.3989422804014327f
#define GELU_CUBIC     0.044715f

// tanh u = 1 - 2 / (e^2u + 1): exact at the ends (e^2u = 0 or saturated), absolute
// error ~1e-7 near 0.
DT_VINLINE dt_v16f vtanh16(dt_v16f u) {
    return 1.0f - 2.0f / (dt_vexp16(2.0f * u) + 1.0f);
}

DT_VINLINE dt_v16f vsigmoid16(dt_v16f x) {
    return 1.0f / (1.0f + dt_vexp16(-x));
}

DT_CLONES void dt_nn_gelu_forward(size_t n, bool tanh_approx, const float *x, float *y) {
    if (tanh_approx) {
        for (size_t i = 0; i < n; i += 16) {
            size_t  len = n - i < 16 ? n - i : 16;
            dt_v16f v   = len == 16 ? dt_load16(x + i) : dt_load16_part(x + i, len);
            dt_v16f t   = vtanh16(SQRT_2_OVER_PI * (v + GELU_CUBIC * v * v * v));
            dt_v16f r   = 0.5f * v * (1.0f + t);
            if (len == 16)
                dt_store16(y + i, r);
            else
                dt_store16_part(y + i, r, len);
        }
    } else {
        for (size_t i = 0; i < n; i++)
            y[i] = 0.5f * x[i] * (1.0f + erff(x[i] * INV_SQRT_2));
    }
}

// d/dx of x Phi(x) = Phi(x) + x phi(x); of the tanh form with u = sqrt(2/pi)(x + c x^3):
// 0.5 (1 + tanh u) + 0.5 x (1 - tanh^2 u) sqrt(2/pi) (1 + 3 c x^2).
DT_CLONES void dt_nn_gelu_backward(size_t n, bool tanh_approx, const float *x, const float *dy,
                                   float *dx) {
    if (tanh_approx) {
        for (size_t i = 0; i < n; i += 16) {
            size_t  len = n - i < 16 ? n - i : 16;
            dt_v16f v   = len == 16 ? dt_load16(x + i) : dt_load16_part(x + i, len);
            dt_v16f d   = len == 16 ? dt_load16(dy + i) : dt_load16_part(dy + i, len);
            dt_v16f v2  = v * v;
            dt_v16f t   = vtanh16(SQRT_2_OVER_PI * (v + GELU_CUBIC * v2 * v));
            dt_v16f g   = 0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * SQRT_2_OVER_PI *
                                                (1.0f + 3.0f * GELU_CUBIC * v2);
            if (len == 16)
                dt_store16(dx + i, d * g);
            else
                dt_store16_part(dx + i, d * g, len);
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
DT_CLONES void dt_nn_relu_forward(size_t n, const float *x, float *y) {
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        dt_v16f v = dt_load16(x + i);
        dt_store16(y + i, dt_keep_positive16(v, v));
    }
    for (; i < n; i++)
        y[i] = x[i] > 0.0f ? x[i] : 0.0f;
}

DT_CLONES void dt_nn_relu_grad(size_t n, const float *y, const float *dy, float *dx) {
    size_t i = 0;
    for (; i + 16 <= n; i += 16)
        dt_store16(dx + i, dt_keep_positive16(dt_load16(y + i), dt_load16(dy + i)));
    for (; i < n; i++)
        dx[i] = y[i] > 0.0f ? dy[i] : 0.0f;
}

DT_CLONES void dt_nn_tanh_forward(size_t n, const float *x, float *y) {
    for (size_t i = 0; i < n; i++)
        y[i] = tanhf(x[i]);
}

DT_CLONES void dt_nn_tanh_backward(size_t n, const float *y, const float *dy, float *dx) {
    for (size_t i = 0; i < n; i++)
        dx[i] = dy[i] * (1.0f - y[i] * y[i]);
}

// 1/(1 + e^-x): e^-x saturates at e^88 for x < -88, where sigmoid is below 1e-38.
DT_CLONES void dt_nn_sigmoid_forward(size_t n, const float *x, float *y) {
    for (size_t i = 0; i < n; i += 16) {
        size_t len = n - i < 16 ? n - i : 16;
        if (len == 16)
            dt_store16(y + i, vsigmoid16(dt_load16(x + i)));
        else
            dt_store16_part(y + i, vsigmoid16(dt_load16_part(x + i, len)), len);
    }
}

DT_CLONES void dt_nn_sigmoid_backward(size_t n, const float *y, const float *dy, float *dx) {
    for (size_t i = 0; i < n; i++)
        dx[i] = dy[i] * y[i] * (1.0f - y[i]);
}

DT_CLONES void dt_nn_silu_forward(size_t n, const float *x, float *y) {
    for (size_t i = 0; i < n; i += 16) {
        size_t  len = n - i < 16 ? n - i : 16;
        dt_v16f v   = len == 16 ? dt_load16(x + i) : dt_load16_part(x + i, len);
        dt_store16_part(y + i, v * vsigmoid16(v), len);
    }
}

// d/dx x s(x) = s (1 + x (1 - s))
DT_CLONES void dt_nn_silu_backward(size_t n, const float *x, const float *dy, float *dx) {
    for (size_t i = 0; i < n; i += 16) {
        size_t  len = n - i < 16 ? n - i : 16;
        dt_v16f v = dt_load16_part(x + i, len), d = dt_load16_part(dy + i, len);
        dt_v16f s = vsigmoid16(v);
        dt_store16_part(dx + i, d * s * (1.0f + v * (1.0f - s)), len);
    }
}

DT_CLONES void dt_nn_softmax_forward(int rows, int d, const float *x, float *y) {
    for (int r = 0; r < rows; r++) {
        const float *xr = x + (size_t)r * d;
        float       *yr = y + (size_t)r * d;
        if (yr != xr)
            memcpy(yr, xr, sizeof(float) * (size_t)d);
        float m   = dt_vmax_row(yr, (size_t)d);
        float inv = 1.0f / dt_vexp_row(yr, (size_t)d, m);
        for (int i = 0; i < d; i++)
            yr[i] *= inv;
    }
}

DT_CLONES void dt_nn_softmax_backward(int rows, int d, const float *y, const float *dy, float *dx) {
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

DT_CLONES void dt_nn_add_forward(size_t n, const float *a, const float *b, float *y) {
    for (size_t i = 0; i < n; i++)
        y[i] = a[i] + b[i];
}

DT_CLONES void dt_nn_accumulate(size_t n, const float *src, float *dst) {
    for (size_t i = 0; i < n; i++)
        dst[i] += src[i];
}

// --------------------------------------------------------------------------- Embedding

void dt_nn_embedding_init(int num, int d, dt_rng *rng, float *w) {
    for (size_t i = 0; i < (size_t)num * d; i++)
        w[i] = dt_rng_normal(rng);
}

dt_status dt_nn_embedding_forward(int count, int num, int d, const int32_t *idx, const float *w,
                                  float *y) {
    for (int i = 0; i < count; i++) {
        if (idx[i] < 0 || idx[i] >= num)
            return dt_fail(DT_ERR_ARG, "embedding: index %d at position %d, expected 0 to %d",
                           (int)idx[i], i, num - 1);
        memcpy(y + (size_t)i * d, w + (size_t)idx[i] * d, sizeof(float) * (size_t)d);
    }
    return DT_OK;
}

DT_CLONES void dt_nn_embedding_backward(int count, int d, const int32_t *idx, const float *dy,
                                        float *dw) {
    for (int i = 0; i < count; i++) {
        float       *row = dw + (size_t)idx[i] * d;
        const float *g   = dy + (size_t)i * d;
        for (int j = 0; j < d; j++)
            row[j] += g[j];
    }
}
