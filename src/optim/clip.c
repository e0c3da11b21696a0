// clip.c: gradient-norm clipping over the parameter contract, PyTorch's
// torch.nn.utils.clip_grad_norm_ (norm_type 2): the norm of all trainable gradients
// taken together, and every gradient scaled by min(1, max_norm / (norm + 1e-6)).
#include "dtrain/optim.h"

#include "core/simd.h"

#include <math.h>

// Sum of squares of g[0, n) in double (in 4 lanes, so the compiler can vectorise).
DT_CLONES static double sum_squares(const float *g, size_t n) {
    double s[4] = {0, 0, 0, 0};
    size_t i    = 0;
    for (; i + 4 <= n; i += 4)
        for (int k = 0; k < 4; k++)
            s[k] += (double)g[i + k] * (double)g[i + k];
    for (; i < n; i++)
        s[0] += (double)g[i] * (double)g[i];
    return (s[0] + s[1]) + (s[2] + s[3]);
}

DT_CLONES static void scale(float *g, size_t n, float c) {
    for (size_t i = 0; i < n; i++)
        g[i] *= c;
}

dt_status dt_grad_norm(dt_params *p, float *norm) {
    if (!p || !dt_params_ready(p) || !norm)
        return dt_fail(DT_ERR_ARG, "clip: expected parameters with storage and an output, found "
                                   "NULL or none");
    const float *g  = dt_params_grads(p);
    double       ss = 0;
    for (int t = 0; t < dt_params_count(p); t++) {
        const dt_param_info *pi = dt_params_info(p, t);
        if (pi->trainable)
            ss += sum_squares(g + pi->offset, pi->count);
    }
    *norm = (float)sqrt(ss);
    return DT_OK;
}

dt_status dt_clip_grad_norm(dt_params *p, float max_norm, float *norm) {
    if (!(max_norm > 0) || !isfinite(max_norm))
        return dt_fail(DT_ERR_ARG, "clip: expected a finite max_norm > 0, found %g",
                       (double)max_norm);
    float total;
    DT_TRY(dt_grad_norm(p, &total));
    if (norm)
        *norm = total;
    if (!isfinite(total))
        return DT_OK; // left unchanged: the caller sees the norm and may skip the step
    float coef = (float)((double)max_norm / ((double)total + 1e-6));
    if (coef < 1.0f) {
        float *g = dt_params_grads(p);
        for (int t = 0; t < dt_params_count(p); t++) {
            const dt_param_info *pi = dt_params_info(p, t);
            if (pi->trainable)
                scale(g + pi->offset, pi->count, coef);
        }
    }
    return DT_OK;
}
