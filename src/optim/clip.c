// clip.c: gradient-norm clipping over the parameter contract, PyTorch's
// torch.nn.utils.clip_grad_norm_ (norm_type 2): the norm of all trainable gradients
// taken together, and every gradient scaled by min(1, max_norm / (norm + 1e-6)).
#include "dtrain/optim.h"
#include "kernels/table.h"

#include <math.h>

dt_status dt_grad_norm(dt_params *p, float *norm) {
    if (!p || !dt_params_ready(p) || !norm)
        return dt_fail(DT_ERR_ARG, "clip: expected parameters with storage and an output, found "
                                   "NULL or none");
    const float *g  = dt_params_grads(p);
    double       ss = 0;
    for (int t = 0; t < dt_params_count(p); t++) {
        const dt_param_info *pi = dt_params_info(p, t);
        if (pi->trainable)
            ss += dt_k()->sum_squares(g + pi->offset, pi->count); // in double
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
                dt_k()->scale(g + pi->offset, pi->count, coef);
        }
    }
    return DT_OK;
}
