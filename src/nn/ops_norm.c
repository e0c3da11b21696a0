// ops_norm.c: BatchNorm (1d/2d, split so SyncBatchNorm can reduce its statistics over
// processes) and LayerNorm over the last dimension (ops.h). The loops over the data are
// rows of the kernel table (kernels/vec/norm.c); this file holds their entry points, the
// moments from the sums and the compositions.
#include "nn/ops.h"

#include <math.h>

// --------------------------------------------------------------------------- BatchNorm

dt_nn_bn dt_nn_bn_default(int c) {
    return (dt_nn_bn){.c = c, .eps = 1e-5f, .momentum = 0.1f, .affine = true};
}

void dt_nn_bn_init(const dt_nn_bn *p, float *gamma, float *beta, float *running_mean,
                   float *running_var) {
    for (int c = 0; c < p->c; c++) {
        if (gamma)
            gamma[c] = 1.0f;
        if (beta)
            beta[c] = 0.0f;
        if (running_mean)
            running_mean[c] = 0.0f;
        if (running_var)
            running_var[c] = 1.0f;
    }
}

void dt_nn_bn_stats_range(int n, int c, int c0, int c1, int l, const float *x, double *sum,
                          double *m2) {
    dt_k()->bn_stats(n, c, c0, c1, l, x, sum, m2);
}

void dt_nn_bn_stats(int n, int c, int l, const float *x, double *sum, double *m2) {
    dt_nn_bn_stats_range(n, c, 0, c, l, x, sum, m2);
}

void dt_nn_bn_moments(const dt_nn_bn *p, double count, const double *sum, const double *m2,
                      float *mean, float *invstd, float *running_mean, float *running_var) {
    for (int c = 0; c < p->c; c++) {
        double m   = sum[c] / count;
        double var = m2[c] / count;
        mean[c]    = (float)m;
        invstd[c]  = (float)(1.0 / sqrt(var + p->eps));
        if (running_mean) {
            double unbiased = count > 1 ? var * count / (count - 1) : var;
            running_mean[c] = (float)((1.0 - p->momentum) * running_mean[c] + p->momentum * m);
            running_var[c] = (float)((1.0 - p->momentum) * running_var[c] + p->momentum * unbiased);
        }
    }
}

void dt_nn_bn_eval_moments(const dt_nn_bn *p, const float *running_mean, const float *running_var,
                           float *mean, float *invstd) {
    for (int c = 0; c < p->c; c++) {
        mean[c]   = running_mean[c];
        invstd[c] = (float)(1.0 / sqrt((double)running_var[c] + p->eps));
    }
}

void dt_nn_bn_apply_rows(int n, int c, int l, int r0, int r1, const float *x, const float *mean,
                         const float *invstd, const float *gamma, const float *beta,
                         const float *res, bool relu, float *y) {
    dt_k()->bn_apply(n, c, l, r0, r1, x, mean, invstd, gamma, beta, res, relu, y);
}

void dt_nn_bn_apply(int n, int c, int l, const float *x, const float *mean, const float *invstd,
                    const float *gamma, const float *beta, float *y) {
    dt_nn_bn_apply_rows(n, c, l, 0, n * c, x, mean, invstd, gamma, beta, NULL, false, y);
}

enum { CH_BLOCK = 64 }; // channels whose double sums stay on the stack at a time

void dt_nn_bn_forward(const dt_nn_bn *p, int n, int l, bool training, const float *x,
                      const float *gamma, const float *beta, float *running_mean,
                      float *running_var, float *mean, float *invstd, float *y) {
    if (training) { // a block of channels at a time, its sums on the stack
        for (int c0 = 0; c0 < p->c; c0 += CH_BLOCK) {
            int      c1 = c0 + CH_BLOCK < p->c ? c0 + CH_BLOCK : p->c;
            double   s[CH_BLOCK], q[CH_BLOCK];
            dt_nn_bn blk = *p;
            blk.c        = c1 - c0;
            dt_nn_bn_stats_range(n, p->c, c0, c1, l, x, s, q);
            dt_nn_bn_moments(&blk, (double)n * l, s, q, mean + c0, invstd + c0,
                             running_mean ? running_mean + c0 : NULL,
                             running_var ? running_var + c0 : NULL);
        }
    } else {
        dt_nn_bn_eval_moments(p, running_mean, running_var, mean, invstd);
    }
    dt_nn_bn_apply(n, p->c, l, x, mean, invstd, p->affine ? gamma : NULL, p->affine ? beta : NULL,
                   y);
}

void dt_nn_bn_backward_stats_ex(int n, int c, int c0, int c1, int l, const float *x,
                                const float *dy, const dt_nn_bn_relu *relu, const float *mean,
                                const float *invstd, float *sum_dy, float *sum_dyx, float *dres) {
    dt_k()->bn_bwd_stats(n, c, c0, c1, l, x, dy, relu, mean, invstd, sum_dy, sum_dyx, dres);
}

void dt_nn_bn_backward_stats(int n, int c, int l, const float *x, const float *dy,
                             const float *mean, const float *invstd, float *sum_dy,
                             float *sum_dyx) {
    dt_nn_bn_backward_stats_ex(n, c, 0, c, l, x, dy, NULL, mean, invstd, sum_dy, sum_dyx, NULL);
}

void dt_nn_bn_backward_apply_rows(int n, int c, int l, int r0, int r1, const float *x,
                                  const float *dy, const dt_nn_bn_relu *relu, const float *mean,
                                  const float *invstd, const float *gamma, const float *sum_dy,
                                  const float *sum_dyx, double count, float *dx) {
    dt_k()->bn_bwd_apply(n, c, l, r0, r1, x, dy, relu, mean, invstd, gamma, sum_dy, sum_dyx, count,
                         dx);
}

void dt_nn_bn_backward_apply(int n, int c, int l, const float *x, const float *dy,
                             const float *mean, const float *invstd, const float *gamma,
                             const float *sum_dy, const float *sum_dyx, double count, float *dx) {
    dt_nn_bn_backward_apply_rows(n, c, l, 0, n * c, x, dy, NULL, mean, invstd, gamma, sum_dy,
                                 sum_dyx, count, dx);
}

void dt_nn_bn_backward(const dt_nn_bn *p, int n, int l, bool training, const float *x,
                       const float *dy, const float *mean, const float *invstd, const float *gamma,
                       float *dx, float *dgamma, float *dbeta, float *scratch) {
    float *sum_dy = scratch, *sum_dyx = scratch + p->c;
    dt_nn_bn_backward_stats(n, p->c, l, x, dy, mean, invstd, sum_dy, sum_dyx);
    if (p->affine)
        for (int c = 0; c < p->c; c++) {
            dgamma[c] += sum_dyx[c];
            dbeta[c] += sum_dy[c];
        }
    if (dx)
        dt_nn_bn_backward_apply(n, p->c, l, x, dy, mean, invstd, p->affine ? gamma : NULL, sum_dy,
                                sum_dyx, training ? (double)n * l : 0.0, dx);
}

// --------------------------------------------------------------------------- LayerNorm

void dt_nn_layernorm_init(int d, float *gamma, float *beta) {
    for (int i = 0; i < d; i++) {
        if (gamma)
            gamma[i] = 1.0f;
        if (beta)
            beta[i] = 0.0f;
    }
}

void dt_nn_layernorm_forward(int rows, int d, float eps, const float *x, const float *gamma,
                             const float *beta, float *y, float *mean, float *rstd) {
    dt_k()->ln_fwd(rows, d, eps, x, gamma, beta, y, mean, rstd);
}

void dt_nn_layernorm_backward(int rows, int d, const float *x, const float *gamma,
                              const float *mean, const float *rstd, const float *dy, float *dx,
                              float *dgamma, float *dbeta) {
    dt_k()->ln_bwd(rows, d, x, gamma, mean, rstd, dy, dx, dgamma, dbeta);
}
