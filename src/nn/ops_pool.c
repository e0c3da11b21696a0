// ops_pool.c: AvgPool2d and AdaptiveAvgPool2d (ops.h), forward and the adjoint; the
// global average of the ResNet's head is a row of the kernel table (kernels/vec/conv.c).
#include "nn/ops.h"

#include <string.h>

dt_status dt_nn_avgpool2d_check(const dt_nn_avgpool2d *p, int h, int w, int *ho, int *wo) {
    if (p->kh < 1 || p->kw < 1 || p->sh < 1 || p->sw < 1 || p->ph < 0 || p->pw < 0 || h < 1 ||
        w < 1)
        return dt_fail(DT_ERR_ARG,
                       "pooling: expected positive kernel (%d, %d), stride (%d, %d) and input "
                       "(%d, %d), padding (%d, %d) >= 0",
                       p->kh, p->kw, p->sh, p->sw, h, w, p->ph, p->pw);
    if (2 * p->ph > p->kh || 2 * p->pw > p->kw)
        return dt_fail(DT_ERR_ARG,
                       "pooling: padding (%d, %d) must be at most half the kernel (%d, %d)", p->ph,
                       p->pw, p->kh, p->kw);
    if (h + 2 * p->ph < p->kh || w + 2 * p->pw < p->kw)
        return dt_fail(DT_ERR_ARG, "pooling: kernel (%d, %d) does not fit the input (%d, %d)",
                       p->kh, p->kw, h, w);
    *ho = (h + 2 * p->ph - p->kh) / p->sh + 1;
    *wo = (w + 2 * p->pw - p->kw) / p->sw + 1;
    return DT_OK;
}

// The window of output (i, j) clipped to the input: rows [r0, r1), columns [c0, c1).
static void window(const dt_nn_avgpool2d *p, int h, int w, int i, int j, int *r0, int *r1, int *c0,
                   int *c1) {
    int a = i * p->sh - p->ph, b = j * p->sw - p->pw;
    *r0 = a < 0 ? 0 : a;
    *r1 = a + p->kh > h ? h : a + p->kh;
    *c0 = b < 0 ? 0 : b;
    *c1 = b + p->kw > w ? w : b + p->kw;
}

void dt_nn_avgpool2d_forward(const dt_nn_avgpool2d *p, int n, int c, int h, int w, const float *x,
                             float *y) {
    int   ho = (h + 2 * p->ph - p->kh) / p->sh + 1, wo = (w + 2 * p->pw - p->kw) / p->sw + 1;
    float inv = 1.0f / (float)(p->kh * p->kw); // count_include_pad
    for (size_t pl = 0; pl < (size_t)n * c; pl++) {
        const float *xp = x + pl * h * w;
        float       *yp = y + pl * ho * wo;
        for (int i = 0; i < ho; i++)
            for (int j = 0; j < wo; j++) {
                int r0, r1, c0, c1;
                window(p, h, w, i, j, &r0, &r1, &c0, &c1);
                float s = 0.0f;
                for (int r = r0; r < r1; r++)
                    for (int q = c0; q < c1; q++)
                        s += xp[(size_t)r * w + q];
                yp[(size_t)i * wo + j] = s * inv;
            }
    }
}

void dt_nn_avgpool2d_backward(const dt_nn_avgpool2d *p, int n, int c, int h, int w, const float *dy,
                              float *dx) {
    int   ho = (h + 2 * p->ph - p->kh) / p->sh + 1, wo = (w + 2 * p->pw - p->kw) / p->sw + 1;
    float inv = 1.0f / (float)(p->kh * p->kw);
    memset(dx, 0, sizeof(float) * (size_t)n * c * h * w);
    for (size_t pl = 0; pl < (size_t)n * c; pl++) {
        float       *xp = dx + pl * h * w;
        const float *yp = dy + pl * ho * wo;
        for (int i = 0; i < ho; i++)
            for (int j = 0; j < wo; j++) {
                int r0, r1, c0, c1;
                window(p, h, w, i, j, &r0, &r1, &c0, &c1);
                float g = yp[(size_t)i * wo + j] * inv;
                for (int r = r0; r < r1; r++)
                    for (int q = c0; q < c1; q++)
                        xp[(size_t)r * w + q] += g;
            }
    }
}

// torch's adaptive bounds: start floor(i*in/out), end ceil((i+1)*in/out).
static int ad_start(int i, int in, int out) {
    return (int)(((long)i * in) / out);
}
static int ad_end(int i, int in, int out) {
    return (int)(((long)(i + 1) * in + out - 1) / out);
}

void dt_nn_adaptive_avgpool2d_forward(int n, int c, int h, int w, int ho, int wo, const float *x,
                                      float *y) {
    if (ho == 1 && wo == 1) {
        dt_k()->global_avg((size_t)n * c, (size_t)h * w, x, y); // one sum per plane
        return;
    }
    for (size_t pl = 0; pl < (size_t)n * c; pl++) {
        const float *xp = x + pl * h * w;
        float       *yp = y + pl * ho * wo;
        for (int i = 0; i < ho; i++) {
            int r0 = ad_start(i, h, ho), r1 = ad_end(i, h, ho);
            for (int j = 0; j < wo; j++) {
                int   c0 = ad_start(j, w, wo), c1 = ad_end(j, w, wo);
                float s = 0.0f;
                for (int r = r0; r < r1; r++)
                    for (int q = c0; q < c1; q++)
                        s += xp[(size_t)r * w + q];
                yp[(size_t)i * wo + j] = s / (float)((r1 - r0) * (c1 - c0));
            }
        }
    }
}

void dt_nn_adaptive_avgpool2d_backward(int n, int c, int h, int w, int ho, int wo, const float *dy,
                                       float *dx) {
    if (ho == 1 && wo == 1) {
        dt_k()->global_avg_bwd((size_t)n * c, (size_t)h * w, dy, dx);
        return;
    }
    memset(dx, 0, sizeof(float) * (size_t)n * c * h * w);
    for (size_t pl = 0; pl < (size_t)n * c; pl++) {
        float       *xp = dx + pl * h * w;
        const float *yp = dy + pl * ho * wo;
        for (int i = 0; i < ho; i++) {
            int r0 = ad_start(i, h, ho), r1 = ad_end(i, h, ho);
            for (int j = 0; j < wo; j++) {
                int   c0 = ad_start(j, w, wo), c1 = ad_end(j, w, wo);
                float g = yp[(size_t)i * wo + j] / (float)((r1 - r0) * (c1 - c0));
                for (int r = r0; r < r1; r++)
                    for (int q = c0; q < c1; q++)
                        xp[(size_t)r * w + q] += g;
            }
        }
    }
}
