// ops_loss.c: MSE, L1, BCE-with-logits and cross-entropy with ignore_index and label
// smoothing, mean reduction (ops.h). Sums over elements and rows in double; within a
// row of logits, float vectors with the row's maximum subtracted first (the table's
// cross-entropy rows, kernels/vec/act.c).
#include "nn/ops.h"

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
    const dt_ktab *kt = dt_k(); // the rows' kernels: kernels/vec/act.c
    double         ls = label_smoothing, sum = 0.0, inv = counted ? 1.0 / counted : 0.0;
    for (int s = 0; s < n; s++) {
        const float *x = logits + (size_t)s * k;
        float       *d = dlogits ? dlogits + (size_t)s * k : NULL;
        if (target[s] == ignore_index) {
            if (d)
                memset(d, 0, sizeof(float) * (size_t)k);
            continue;
        }
        double sx  = ls > 0 ? row_sum(x, k) : 0.0;
        double lse = kt->ce_row_lse(x, k);
        // -log p[t] = lse - x[t]; sum_j -log p[j] = k lse - sum_j x[j]
        sum += (1.0 - ls) * (lse - x[target[s]]) + ls / k * (k * lse - sx);
        if (d) // (softmax - (1 - ls) onehot - ls/k) / counted
            kt->ce_row_grad(x, k, (float)lse, (float)(ls / k), (float)inv, d, target[s],
                            (float)((1.0 - ls) * inv));
    }
    *loss = (float)(sum * inv);
    return DT_OK;
}
