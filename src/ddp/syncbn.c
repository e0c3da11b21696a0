// syncbn.c: SyncBatchNorm's statistics reducer. BatchNorm (layer.h) takes an optional
// callback that sums its per-channel statistics over a group: forward's sum, sum of
// squares and count, backward's sums of dy and dy * xhat. Here that callback is an
// all-reduce over a dt_pg, so nn stays free of processes and ddp supplies the group.
#include "dtrain/ddp.h"

static dt_status syncbn_reduce(void *user, float *v, size_t n) {
    dt_status st = dt_pg_all_reduce((dt_pg *)user, v, v, n, DT_FLOAT32, DT_REDUCE_SUM);
    return st == DT_OK ? DT_OK : dt_fail_context("syncbatchnorm statistics (%zu floats)", n);
}

dt_status dt_syncbn_opts(dt_batchnorm_opts *opts, dt_pg *pg) {
    if (!opts || !pg)
        return dt_fail(DT_ERR_ARG, "dt_syncbn_opts: expected options and a group, found NULL");
    opts->reduce      = syncbn_reduce;
    opts->reduce_user = pg;
    return DT_OK;
}
