// agree.c: the loss scaler's inf/NaN agreement over a process group (ddp.h). optim
// knows nothing of communication; this is the callback it is given.
#include "dtrain/ddp.h"

dt_status dt_ddp_agree_inf(void *pg, float *found_inf) {
    if (!pg || !found_inf)
        return dt_fail(DT_ERR_ARG, "agree_inf: expected a dt_pg and a flag, found NULL");
    float     flag = *found_inf != 0.0f ? 1.0f : 0.0f; // a NaN flag counts as found
    dt_status st   = dt_pg_all_reduce(pg, &flag, &flag, 1, DT_FLOAT32, DT_REDUCE_MAX);
    if (st != DT_OK)
        return dt_fail_context("grad scaler: agreeing on inf/NaN across ranks");
    *found_inf = flag;
    return DT_OK;
}
