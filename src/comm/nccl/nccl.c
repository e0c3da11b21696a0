// nccl.c: the "nccl" backend (backend.h), a whole-operation backend: every collective
// and send/recv of a group runs as NCCL operations in the CUDA plugin (nccl_abi.h), on
// device buffers in place or host buffers through device scratch. This side holds the
// group's part: the rendezvous (rank 0's ncclUniqueId through the group's store), the
// GPU of each rank (LOCAL_RANK % the GPUs, as the trainer's --device cuda picks it),
// sub-groups by ncclCommSplit, and the failure rules: an operation waits within its
// deadline and gives up when the group is aborted (the liveness thread saw a rank die
// or freeze), aborting its communicator (ncclCommAbort) so nothing stays blocked.
//
// Never chosen by "auto" on its own (CPU jobs keep shm and tcp): the trainer asks for it
// when the parameters live on GPUs and every local rank has a GPU of its own (NCCL
// refuses two ranks on one GPU: "Duplicate GPU detected"), and --backend nccl asks for
// it outright.
#include "comm/backend.h"
#include "comm/nccl/nccl_abi.h"
#include "core/device_abi.h"
#include "dtrain/device.h"

#include <string.h>

typedef struct nccl_ctx {
    dt_pg             *pg;
    const dt_nccl_api *api;
    void              *comm;
} nccl_ctx;

static dt_status api_get(const dt_nccl_api **out) {
    const dt_cuda_api *cuda;
    DT_TRY(dt_cuda_api_get(&cuda));
    const dt_nccl_api *n = cuda->nccl;
    if (!n || n->abi != DT_NCCL_ABI || n->size < sizeof *n)
        return dt_fail(DT_ERR_UNSUPPORTED,
                       "the CUDA plugin has no NCCL backend of this "
                       "library's version (ABI %d): rebuild both from one tree",
                       DT_NCCL_ABI);
    *out = n;
    return DT_OK;
}

static int64_t ms_until(uint64_t deadline_ns) {
    if (deadline_ns == UINT64_MAX)
        return -1;
    uint64_t now = dt_now_ns();
    return now >= deadline_ns ? 1 : (int64_t)((deadline_ns - now) / 1000000u) + 1;
}

static dt_status nccl_init(dt_pg *pg, dt_store *store, uint64_t deadline_ns, void **out) {
    *out                   = NULL;
    const dt_nccl_api *api = NULL;
    DT_TRY(api_get(&api));
    int n = 0;
    DT_TRY(dt_device_cuda_count(&n));
    int  dev = dt_pg_local_rank(pg) % n;
    char id[DT_NCCL_ID_SIZE];
    if (dt_pg_rank(pg) == 0) {
        DT_TRY(api->unique_id(id));
        DT_TRY(dt_store_set(store, "id", id, sizeof id));
    } else {
        const char *key[1] = {"id"};
        void       *v      = NULL;
        size_t      len    = 0;
        DT_TRY(dt_store_wait(store, key, 1, ms_until(deadline_ns)));
        DT_TRY(dt_store_get(store, "id", &v, &len));
        if (len != sizeof id) {
            dt_free(v);
            return dt_fail(DT_ERR_FORMAT, "nccl: rank 0's NCCL id has %zu bytes, expected %zu", len,
                           sizeof id);
        }
        memcpy(id, v, sizeof id);
        dt_free(v);
    }
    nccl_ctx *c = dt_alloc_zero(sizeof *c);
    if (!c)
        return DT_ERR_NOMEM;
    c->pg = pg, c->api = api;
    dt_status st = api->init(&c->comm, dev, id, dt_pg_size(pg), dt_pg_rank(pg), deadline_ns);
    if (st) {
        dt_free(c);
        return dt_fail_context("nccl: rank %d on GPU %d", dt_pg_rank(pg), dev);
    }
    DT_INFO("comm", "nccl: rank %d of %d on GPU %d", dt_pg_rank(pg), dt_pg_size(pg), dev);
    *out = c;
    return DT_OK;
}

static void nccl_free(void *ctx) {
    nccl_ctx *c = ctx;
    if (c->comm)
        c->api->free(c->comm);
    dt_free(c);
}

static void nccl_abort(void *ctx, dt_status st, const char *msg) {
    (void)st, (void)msg;
    nccl_ctx *c = ctx;
    if (c->comm)
        c->api->abort(c->comm);
}

static dt_status nccl_group_new(void *parent_ctx, dt_pg *group, dt_store *store, int color, int key,
                                uint64_t deadline_ns, void **out) {
    (void)store;
    *out        = NULL;
    nccl_ctx *p = parent_ctx;
    if (!p) // a parent of one rank made no communicator
        return group ? dt_fail(DT_ERR_STATE, "nccl: a sub-group of a one-rank group") : DT_OK;
    void *comm = NULL;
    DT_TRY(p->api->split(p->comm, &comm, group ? color : -1, key, deadline_ns));
    if (!group || !comm)
        return DT_OK;
    nccl_ctx *c = dt_alloc_zero(sizeof *c);
    if (!c) {
        p->api->free(comm);
        return DT_ERR_NOMEM;
    }
    c->pg = group, c->api = p->api, c->comm = comm;
    *out = c;
    return DT_OK;
}

static bool aborted_cb(void *user) {
    return dt_pg_aborted(user);
}
static void progress_cb(void *user) {
    dt_pg_progress(user);
}

static dt_status nccl_run(void *ctx, const dt_op *op) {
    nccl_ctx   *c = ctx;
    dt_nccl_run r = {
        .kind        = (int)op->kind,
        .src         = op->src,
        .dst         = op->dst,
        .count       = op->count,
        .dtype       = (int)op->dtype,
        .op          = (int)(op->op == DT_REDUCE_AVG ? DT_REDUCE_SUM : op->op),
        .avg         = op->op == DT_REDUCE_AVG, // run_avg: the tables pass AVG on
        .root        = op->root,
        .peer        = op->peer,
        .deadline_ns = op->deadline_ns,
        .name        = op->name,
        .aborted     = aborted_cb,
        .progress    = progress_cb,
        .user        = c->pg,
    };
    return c->api->run(c->comm, &r);
}

const dt_backend_ops dt_backend_nccl = {
    .name             = "nccl",
    .init             = nccl_init,
    .free             = nccl_free,
    .abort            = nccl_abort,
    .group_new        = nccl_group_new,
    .run              = nccl_run,
    .reports_progress = true,
    .built            = true,
    .run_avg          = true, // ncclAvg: device buffers the host cannot divide
};
