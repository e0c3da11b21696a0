// nccl.c: the NCCL backend's operations in the plugin (comm/nccl/nccl_abi.h). Every
// communicator is non-blocking (its set-up and its operations return at once and are
// polled), so every wait is bounded: by the operation's deadline, and by the group's
// abort (a dead or frozen rank seen by the liveness thread), after which this thread
// aborts the communicator itself (ncclCommAbort) so that no kernel stays blocked on the
// dead rank. Buffers in host memory travel through device scratch; device buffers are
// used in place (DDP on a GPU's gradients).
#include "comm/nccl/nccl_abi.h"
#include "comm/op.h"
#include "cuda/cuda_impl.h"

#include <nccl.h>
#include <sched.h>
#include <stdatomic.h>
#include <string.h>
#include <time.h>

typedef struct ncomm {
    ncclComm_t   c;
    int          dev, world, rank;
    cudaStream_t s;
    void        *scratch;
    size_t       scratch_n;
    bool         dead;      // aborted: every later call fails at once
    atomic_bool  abort_req; // the backend's abort (any thread); the polling thread aborts
} ncomm;

// Aborts the communicator (on the thread that uses it); later calls fail at once.
static void kill_comm(ncomm *m) {
    if (m->c)
        ncclCommAbort(m->c);
    m->c    = NULL;
    m->dead = true;
}

// Whether the wait must end: the group aborted, or the backend asked to abort.
static bool told_to_stop(ncomm *m, const dt_nccl_run *r) {
    return atomic_load(&m->abort_req) || (r && r->aborted && r->aborted(r->user));
}

static dt_status nccl_fail(ncclComm_t c, ncclResult_t r, const char *what) {
    const char *last = c ? ncclGetLastError(c) : NULL;
    return cu_fail(r == ncclSystemError || r == ncclRemoteError ? DT_ERR_PEER : DT_ERR_IO,
                   "%s: %s%s%s", what, ncclGetErrorString(r), last && *last ? ": " : "",
                   last ? last : "");
}

static void pause_(uint64_t waited_ns) {
    if (waited_ns < 50000)
        sched_yield();
    else
        nanosleep(&(struct timespec){0, 20000}, NULL);
}

// Polls a non-blocking communicator (m's own) until its last call is done (no longer
// ncclInProgress); on an error, the group's abort or the deadline, aborts it.
static dt_status settle(ncomm *m, uint64_t deadline_ns, const dt_nccl_run *r, const char *what) {
    uint64_t t0 = cu_host->now_ns();
    for (;;) {
        ncclResult_t st;
        ncclResult_t e = ncclCommGetAsyncError(m->c, &st);
        if (e != ncclSuccess) {
            kill_comm(m);
            return nccl_fail(NULL, e, what);
        }
        if (st == ncclSuccess)
            return DT_OK;
        if (st != ncclInProgress) {
            kill_comm(m);
            return nccl_fail(NULL, st, what);
        }
        uint64_t now = cu_host->now_ns();
        if (told_to_stop(m, r)) {
            kill_comm(m);
            return cu_fail(DT_ERR_PEER, "%s: the group was aborted (NCCL aborted)", what);
        }
        if (now > deadline_ns) {
            kill_comm(m);
            return cu_fail(DT_ERR_TIMEOUT, "%s: NCCL did not finish in time (aborted)", what);
        }
        if (r && r->progress)
            r->progress(r->user);
        pause_(now - t0);
    }
}

static ncclConfig_t nonblocking(void) {
    ncclConfig_t c = NCCL_CONFIG_INITIALIZER;
    c.blocking     = 0;
    return c;
}

static dt_status unique_id(void *id) {
    ncclUniqueId u;
    ncclResult_t r = ncclGetUniqueId(&u);
    if (r != ncclSuccess)
        return nccl_fail(NULL, r, "ncclGetUniqueId");
    memcpy(id, &u, DT_NCCL_ID_SIZE);
    return DT_OK;
}

static dt_status make(ncomm **out, int dev) {
    ncomm *m = cu_host->alloc_zero(sizeof *m);
    if (!m)
        return DT_ERR_NOMEM;
    m->dev = dev;
    DT_TRY(cu_use(dev));
    cudaError_t e = cudaStreamCreateWithFlags(&m->s, cudaStreamNonBlocking);
    if (e != cudaSuccess) {
        cu_host->free(m);
        return cu_rt_fail(e, "cudaStreamCreateWithFlags (NCCL's stream)");
    }
    *out = m;
    return DT_OK;
}

static void drop(ncomm *m) {
    if (!m)
        return;
    kill_comm(m); // ncclCommAbort never blocks on a peer, unlike ncclCommDestroy
    cu_mem_free(m->dev, m->scratch);
    if (m->s)
        cudaStreamDestroy(m->s);
    cu_host->free(m);
}

static dt_status init(void **out, int dev, const void *id, int world, int rank,
                      uint64_t deadline_ns) {
    *out = NULL;
    ncomm *m;
    DT_TRY(make(&m, dev));
    ncclUniqueId u;
    memcpy(&u, id, DT_NCCL_ID_SIZE);
    ncclConfig_t cfg = nonblocking();
    ncclResult_t r   = ncclCommInitRankConfig(&m->c, world, u, rank, &cfg);
    dt_status    st  = DT_OK;
    if (r != ncclSuccess && r != ncclInProgress)
        st = nccl_fail(NULL, r, "ncclCommInitRankConfig");
    else
        st = settle(m, deadline_ns, NULL, "ncclCommInitRankConfig");
    if (st) {
        drop(m);
        return st;
    }
    m->world = world, m->rank = rank;
    *out = m;
    return DT_OK;
}

static dt_status split(void *parent, void **out, int color, int key, uint64_t deadline_ns) {
    *out     = NULL;
    ncomm *p = parent, *m;
    if (p->dead)
        return cu_fail(DT_ERR_STATE, "ncclCommSplit: the parent communicator was aborted");
    DT_TRY(make(&m, p->dev));
    ncclConfig_t cfg = nonblocking();
    ncclResult_t r  = ncclCommSplit(p->c, color < 0 ? NCCL_SPLIT_NOCOLOR : color, key, &m->c, &cfg);
    dt_status    st = DT_OK;
    if (r != ncclSuccess && r != ncclInProgress)
        st = nccl_fail(p->c, r, "ncclCommSplit");
    else if (m->c) // the new communicator's set-up; a rank in no group has none
        st = settle(m, deadline_ns, NULL, "ncclCommSplit");
    else
        st = settle(p, deadline_ns, NULL, "ncclCommSplit");
    if (st == DT_OK && m->c) {
        int n = 0, me = 0;
        if (ncclCommCount(m->c, &n) == ncclSuccess && ncclCommUserRank(m->c, &me) == ncclSuccess)
            m->world = n, m->rank = me;
    }
    if (st || !m->c) { // an error, or color < 0: in no new group
        drop(m);
        return st;
    }
    *out = m;
    return DT_OK;
}

// ------------------------------------------------------------------- operations

static bool to_nccl_type(int dtype, ncclDataType_t *t, size_t *size) {
    switch (dtype) {
    case DT_FLOAT32:
        *t = ncclFloat32, *size = 4;
        return true;
    case DT_INT32:
        *t = ncclInt32, *size = 4;
        return true;
    case DT_INT64:
        *t = ncclInt64, *size = 8;
        return true;
    default:
        return false;
    }
}

static ncclRedOp_t to_nccl_op(const dt_nccl_run *r) {
    if (r->avg)
        return ncclAvg;
    switch (r->op) {
    case DT_REDUCE_MAX:
        return ncclMax;
    case DT_REDUCE_MIN:
        return ncclMin;
    case DT_REDUCE_PROD:
        return ncclProd;
    default:
        return ncclSum;
    }
}

// Elements read from src and written to dst by this rank.
static void extents(const ncomm *m, const dt_nccl_run *r, size_t *in, size_t *out) {
    size_t n = r->count, w = (size_t)m->world;
    bool   root = m->rank == r->root;
    switch (r->kind) {
    case DT_COLL_ALL_REDUCE:
        *in = n, *out = n;
        break;
    case DT_COLL_BROADCAST: // the buffer is dst on every rank
        *in = root ? n : 0, *out = n;
        break;
    case DT_COLL_REDUCE:
        *in = n, *out = root ? n : 0;
        break;
    case DT_COLL_ALL_GATHER:
        *in = n, *out = w * n;
        break;
    case DT_COLL_REDUCE_SCATTER:
        *in = w * n, *out = n;
        break;
    case DT_COLL_GATHER:
        *in = n, *out = root ? w * n : 0;
        break;
    case DT_COLL_SCATTER:
        *in = root ? w * n : 0, *out = n;
        break;
    case DT_COLL_ALL_TO_ALL:
        *in = w * n, *out = w * n;
        break;
    case DT_COLL_SEND:
        *in = n, *out = 0;
        break;
    case DT_COLL_RECV:
        *in = 0, *out = n;
        break;
    default: // barrier, init: one float
        *in = 1, *out = 1;
        break;
    }
}

static bool on_device(const void *p) {
    struct cudaPointerAttributes a;
    if (!p || cudaPointerGetAttributes(&a, p) != cudaSuccess) {
        cudaGetLastError();
        return false;
    }
    return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
}

// The NCCL calls of one operation on device buffers `in` and `out`.
static ncclResult_t issue(ncomm *m, const dt_nccl_run *r, const void *in, void *out,
                          ncclDataType_t t, size_t es) {
    size_t       n = r->count;
    ncclResult_t e = ncclSuccess;
    switch (r->kind) {
    case DT_COLL_ALL_REDUCE:
        return ncclAllReduce(in, out, n, t, to_nccl_op(r), m->c, m->s);
    case DT_COLL_BROADCAST:
        return ncclBroadcast(m->rank == r->root ? in : out, out, n, t, r->root, m->c, m->s);
    case DT_COLL_REDUCE:
        return ncclReduce(in, out, n, t, to_nccl_op(r), r->root, m->c, m->s); // out: root's only
    case DT_COLL_ALL_GATHER:
        return ncclAllGather(in, out, n, t, m->c, m->s);
    case DT_COLL_REDUCE_SCATTER:
        return ncclReduceScatter(in, out, n, t, to_nccl_op(r), m->c, m->s);
    case DT_COLL_SEND:
        return ncclSend(in, n, t, r->peer, m->c, m->s);
    case DT_COLL_RECV:
        return ncclRecv(out, n, t, r->peer, m->c, m->s);
    case DT_COLL_GATHER:
    case DT_COLL_SCATTER:
    case DT_COLL_ALL_TO_ALL: {
        const char *src    = in;
        char       *dst    = out;
        bool        gather = r->kind == DT_COLL_GATHER, scatter = r->kind == DT_COLL_SCATTER;
        bool        root = m->rank == r->root;
        size_t      blk  = n * es;
        if ((e = ncclGroupStart()) != ncclSuccess)
            return e;
        for (int p = 0; p < m->world && e == ncclSuccess; p++) {
            if (p == m->rank) // this rank's own block: a copy on the stream
                continue;
            if (gather && root)
                e = ncclRecv(dst + (size_t)p * blk, n, t, p, m->c, m->s);
            else if (gather && p == r->root)
                e = ncclSend(src, n, t, p, m->c, m->s);
            else if (scatter && root)
                e = ncclSend(src + (size_t)p * blk, n, t, p, m->c, m->s);
            else if (scatter && p == r->root)
                e = ncclRecv(dst, n, t, p, m->c, m->s);
            else if (!gather && !scatter) {
                e = ncclSend(src + (size_t)p * blk, n, t, p, m->c, m->s);
                if (e == ncclSuccess)
                    e = ncclRecv(dst + (size_t)p * blk, n, t, p, m->c, m->s);
            }
        }
        ncclResult_t g = ncclGroupEnd();
        if (e != ncclSuccess)
            return e;
        if (g != ncclSuccess && g != ncclInProgress)
            return g;
        // This rank's own block: gather's root keeps its src, scatter's root its block r,
        // all-to-all its block r, each copied on the stream.
        const char *mine = NULL;
        char       *into = NULL;
        if (gather && root)
            mine = src, into = dst + (size_t)m->rank * blk;
        else if (scatter && root)
            mine = src + (size_t)m->rank * blk, into = dst;
        else if (!gather && !scatter)
            mine = src + (size_t)m->rank * blk, into = dst + (size_t)m->rank * blk;
        if (mine && blk && cudaMemcpyAsync(into, mine, blk, cudaMemcpyDeviceToDevice, m->s))
            return ncclUnhandledCudaError;
        return g;
    }
    default: // barrier, init: an all-reduce of one float
        return ncclAllReduce(in, out, 1, ncclFloat32, ncclSum, m->c, m->s);
    }
}

// Waits for the stream with the operation's bounds (see the top).
static dt_status wait_stream(ncomm *m, const dt_nccl_run *r) {
    uint64_t t0 = cu_host->now_ns();
    for (;;) {
        cudaError_t e = cudaStreamQuery(m->s);
        if (e == cudaSuccess)
            return DT_OK;
        if (e != cudaErrorNotReady)
            return cu_rt_fail(e, r->name);
        ncclResult_t st;
        if (ncclCommGetAsyncError(m->c, &st) == ncclSuccess && st != ncclSuccess &&
            st != ncclInProgress) {
            kill_comm(m);
            return nccl_fail(NULL, st, r->name);
        }
        uint64_t now = cu_host->now_ns();
        if (told_to_stop(m, r)) {
            kill_comm(m);
            return cu_fail(DT_ERR_PEER, "%s: the group was aborted (NCCL aborted)", r->name);
        }
        if (now > r->deadline_ns) {
            kill_comm(m);
            return cu_fail(DT_ERR_TIMEOUT, "%s: NCCL did not finish in time (aborted)", r->name);
        }
        if (r->progress)
            r->progress(r->user);
        pause_(now - t0);
    }
}

static dt_status run(void *h, const dt_nccl_run *r) {
    ncomm *m = h;
    if (atomic_load(&m->abort_req) && !m->dead)
        kill_comm(m);
    if (m->dead)
        return cu_fail(DT_ERR_STATE, "%s: the NCCL communicator was aborted earlier", r->name);
    DT_TRY(cu_use(m->dev));
    ncclDataType_t t;
    size_t         es, in_n, out_n;
    if (!to_nccl_type(r->kind == DT_COLL_BARRIER || r->kind == DT_COLL_INIT ? DT_FLOAT32 : r->dtype,
                      &t, &es))
        return cu_fail(DT_ERR_ARG, "%s: no NCCL type for dtype %d", r->name, r->dtype);
    extents(m, r, &in_n, &out_n);
    bool barrier = r->kind == DT_COLL_BARRIER || r->kind == DT_COLL_INIT;
    // Where the data is: device buffers in place; host ones (and the barrier's float)
    // through scratch, in then out.
    const void *src     = r->kind == DT_COLL_BROADCAST ? r->dst : r->src;
    bool        dev_in  = !barrier && (!in_n || on_device(src));
    bool        dev_out = !barrier && (!out_n || on_device(r->dst));
    size_t      need    = (dev_in ? 0 : in_n * es) + (dev_out ? 0 : out_n * es);
    if (need > m->scratch_n) {
        cu_mem_free(m->dev, m->scratch);
        m->scratch = NULL, m->scratch_n = 0;
        DT_TRY(cu_mem_alloc(m->dev, need, &m->scratch));
        m->scratch_n = need;
    }
    char       *s_in = m->scratch, *s_out = s_in + (dev_in ? 0 : in_n * es);
    const void *d_in  = dev_in ? src : s_in;
    void       *d_out = dev_out ? r->dst : s_out;
    if (barrier)
        CU_RT(cudaMemsetAsync(s_in, 0, es, m->s));
    else if (!dev_in && in_n)
        CU_RT(cudaMemcpyAsync(s_in, src, in_n * es, cudaMemcpyHostToDevice, m->s));
    ncclResult_t e = issue(m, r, d_in, d_out, t, es);
    if (e != ncclSuccess && e != ncclInProgress) {
        kill_comm(m);
        return nccl_fail(NULL, e, r->name);
    }
    if (e == ncclInProgress)
        DT_TRY(settle(m, r->deadline_ns, r, r->name));
    if (!dev_out && out_n && !barrier)
        CU_RT(cudaMemcpyAsync(r->dst, s_out, out_n * es, cudaMemcpyDeviceToHost, m->s));
    return wait_stream(m, r);
}

// From any thread: an operation waiting now ends within a poll (its thread aborts the
// communicator); one not started fails at once.
static void abort_(void *h) {
    ncomm *m = h;
    if (m)
        atomic_store(&m->abort_req, true);
}

static void free_(void *h) {
    drop(h);
}

static const dt_nccl_api table = {
    .abi       = DT_NCCL_ABI,
    .size      = sizeof(dt_nccl_api),
    .unique_id = unique_id,
    .init      = init,
    .split     = split,
    .run       = run,
    .abort     = abort_,
    .free      = free_,
};

const void *const cu_nccl_api = &table;
