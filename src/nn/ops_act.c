// ops_act.c: element-wise activations, softmax over the last dimension, the residual
// add and Embedding (ops.h). Memory-bound loops; DT_CLONES gives them wide versions.
#include "core/simd.h"
#include "nn/ops.h"

#include <math.h>
#include <string.h>

#define SQRT_2_OVER_PI 0.7978845608028654f
#define INV_SQRT_2     0.7071067811865476f
#define INV_SQRT_2PI   0.3989422804014327f
#define GELU_CUBIC     0.044715f

DT_CLONES void dt_nn_gelu_forward(size_t n, bool tanh_approx, const float *x, float *y) {
    if (tanh_approx) {
        for (size_t i = 0; i < n; i++) {
            float v = x[i];
            y[i]    = 0.5f * v * (1.0f + tanhf(SQRT_2_OVER_PI * (v + GELU_CUBIC * v * v * v)));
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
        for (size_t i = 0; i < n; i++) {
            float v = x[i], v2 = v * v;
            float t = tanhf(SQRT_2_OVER_PI * (v + GELU_CUBIC * v2 * v));
            float g = 0.5f * (1.0f + t) +
                      0.5f * v * (1.0f - t * t) * SQRT_2_OVER_PI * (1.0f + 3.0f * GELU_CUBIC * v2);
            dx[i] = dy[i] * g;
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

DT_CLONES void dt_nn_tanh_forward(size_t n, const float *x, float *y) {
    for (size_t i = 0; i < n; i++)
        y[i] = tanhf(x[i]);
}

DT_CLONES void dt_nn_tanh_backward(size_t n, const float *y, const float *dy, float *dx) {
    for (size_t i = 0; i < n; i++)
        dx[i] = dy[i] * (1.0f - y[i] * y[i]);
}

// 1/(1 + e^-x) for x >= 0 and e^x/(1 + e^x) below: exp never overflows.
static inline float sigmoid(float x) {
    if (x >= 0.0f)
        return 1.0f / (1.0f + expf(-x));
    float e = expf(x);
    return e / (1.0f + e);
}

DT_CLONES void dt_nn_sigmoid_forward(size_t n, const float *x, float *y) {
    for (size_t i = 0; i < n; i++)
        y[i] = sigmoid(x[i]);
}

DT_CLONES void dt_nn_sigmoid_backward(size_t n, const float *y, const float *dy, float *dx) {
    for (size_t i = 0; i < n; i++)
        dx[i] = dy[i] * y[i] * (1.0f - y[i]);
}

DT_CLONES void dt_nn_silu_forward(size_t n, const float *x, float *y) {
    for (size_t i = 0; i < n; i++)
        y[i] = x[i] * sigmoid(x[i]);
}

// d/dx x s(x) = s (1 + x (1 - s))
DT_CLONES void dt_nn_silu_backward(size_t n, const float *x, const float *dy, float *dx) {
    for (size_t i = 0; i < n; i++) {
        float s = sigmoid(x[i]);
        dx[i]   = dy[i] * s * (1.0f + x[i] * (1.0f - s));
    }
}

DT_CLONES void dt_nn_softmax_forward(int rows, int d, const float *x, float *y) {
    for (int r = 0; r < rows; r++) {
        const float *xr = x + (size_t)r * d;
        float       *yr = y + (size_t)r * d;
        float        m  = -INFINITY;
        for (int i = 0; i < d; i++)
            m = xr[i] > m ? xr[i] : m;
        float s = 0.0f;
        for (int i = 0; i < d; i++) {
            yr[i] = expf(xr[i] - m);
            s += yr[i];
        }
        float inv = 1.0f / s;
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
