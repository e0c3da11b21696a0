// ops_loss.c: MSE, L1, BCE-with-logits and cross-entropy with ignore_index and label
// smoothing, mean reduction (ops.h). Sums over elements and rows in double; within a
// row of logits, float vectors (dt_vexp16) with the row's maximum subtracted first.
#include "nn/ops.h"
#include "nn/ops_math.h"

#include <math.h>
#include <string.h>

float dt_nn_mse_loss(size_t n, const float *x, const float *t, float *dx) {
    double s = 0.0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)x[i] - t[i];
        s += d * d;
        if (dx)
            dx[i] = (float)(2.0 * d / (double)n);
    }
    return n ? (float)(s / (double)n) : 0.0f;
}

float dt_nn_l1_loss(size_t n, const float *x, const float *t, float *dx) {
    double s = 0.0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)x[i] - t[i];
        s += fabs(d);
        if (dx)
            dx[i] = (float)((d > 0 ? 1.0 : d < 0 ? -1.0 : 0.0) / (double)n);
    }
    return n ? (float)(s / (double)n) : 0.0f;
}

// max(x, 0) - x t + log(1 + exp(-|x|)) is log(1 + e^x) - x t without overflow; its
// derivative is sigmoid(x) - t.
float dt_nn_bce_logits_loss(size_t n, const float *x, const float *t, float *dx) {
    double s = 0.0;
    for (size_t i = 0; i < n; i++) {
        double v = x[i];
        s += (v > 0 ? v : 0.0) - v * t[i] + log1p(exp(-fabs(v)));
        if (dx) {
            double sg = v >= 0 ? 1.0 / (1.0 + exp(-v)) : exp(v) / (1.0 + exp(v));
            dx[i]     = (float)((sg - t[i]) / (double)n);
        }
    }
    return n ? (float)(s / (double)n) : 0.0f;
}

static double row_sum(const float *x, int k) {
    double s = 0.0;
    for (int i = 0; i < k; i++)
        s += x[i];
    return s;
}

// log sum_i e^x[i], as max + log sum e^(x - max)
DT_CLONES static double row_lse(const float *x, int k) {
    float   m   = dt_vmax_row(x, (size_t)k);
    dt_v16f acc = dt_splat16(0.0f), mv = dt_splat16(m);
    int     i = 0;
    for (; i + 16 <= k; i += 16)
        acc += dt_vexp16(dt_load16(x + i) - mv);
    float z = dt_hsum16(acc);
    for (; i < k; i++) {
        dt_v16f e = dt_vexp16(dt_splat16(x[i] - m));
        z += e[0];
    }
    return (double)m + log((double)z);
}

// d = (e^(x - lse) - smooth) * inv, then d[t] -= hot
DT_CLONES static void row_grad(const float *x, int k, float lse, float smooth, float inv, float *d,
                               int t, float hot) {
    memcpy(d, x, sizeof(float) * (size_t)k);
    dt_vexp_row(d, (size_t)k, lse);
    for (int i = 0; i < k; i++)
        d[i] = (d[i] - smooth) * inv;
    d[t] -= hot;
}

dt_status dt_nn_cross_entropy(int n, int k, const float *logits, const int32_t *target,
                              int ignore_index, float label_smoothing, float *loss,
                              float *dlogits) {
    if (n < 0 || k < 1)
        return dt_fail(DT_ERR_ARG,
                       "cross_entropy: expected rows >= 0 and classes >= 1, found %d "
                       "and %d",
                       n, k);
    if (!(label_smoothing >= 0.0f && label_smoothing <= 1.0f))
        return dt_fail(DT_ERR_ARG, "cross_entropy: expected label_smoothing in [0, 1], found %g",
                       (double)label_smoothing);
    int counted = 0;
    for (int s = 0; s < n; s++) {
        if (target[s] == ignore_index)
            continue;
        if (target[s] < 0 || target[s] >= k)
            return dt_fail(DT_ERR_ARG,
                           "cross_entropy: target of row %d is %d, expected 0 to %d or the "
                           "ignore_index %d",
                           s, (int)target[s], k - 1, ignore_index);
        counted++;
    }
    double ls = label_smoothing, sum = 0.0, inv = counted ? 1.0 / counted : 0.0;
    for (int s = 0; s < n; s++) {
        const float *x = logits + (size_t)s * k;
        float       *d = dlogits ? dlogits + (size_t)s * k : NULL;
        if (target[s] == ignore_index) {
            if (d)
                memset(d, 0, sizeof(float) * (size_t)k);
            continue;
        }
        double sx  = ls > 0 ? row_sum(x, k) : 0.0;
        double lse = row_lse(x, k);
        // -log p[t] = lse - x[t]; sum_j -log p[j] = k lse - sum_j x[j]
        sum += (1.0 - ls) * (lse - x[target[s]]) + ls / k * (k * lse - sx);
        if (d) // (softmax - (1 - ls) onehot - ls/k) / counted
            row_grad(x, k, (float)lse, (float)(ls / k), (float)inv, d, target[s],
                     (float)((1.0 - ls) * inv));
    }
    *loss = (float)(sum * inv);
    return DT_OK;
}
