// mpi.c: the "mpi" backend. Every collective of the process group is the matching MPI
// call on a communicator of the group's own (a duplicate of MPI_COMM_WORLD), so MPI's
// tuned algorithms (shared memory, InfiniBand, hierarchical) move the data; send/recv
// are MPI point-to-point messages on a second duplicate. What MPI does not do for us:
// - fingerprints: before each collective, one small MPI_Allreduce of (seq, kind, dtype,
//   op, count, root) with MPI_MAX over the values and their negations tells every rank
//   whether all agree; on a difference an MPI_Allgather names a rank that differs.
//   Send/recv carry the fingerprint in a header message. DT_MPI_FINGERPRINT=off skips
//   both (then MPI's own checks are all there is: a bigger message than the receive
//   buffer is MPI_ERR_TRUNCATE, anything else is undefined).
// - timeouts: MPI cannot cancel a collective. DT_MPI_WAIT=block (default) makes the
//   blocking MPI calls (the fastest algorithms) and a watchdog thread aborts the MPI job
//   (MPI_Abort, after logging why) when a call outlives its deadline, or 2 s after the
//   group was aborted. DT_MPI_WAIT=poll posts the non-blocking form (MPI_Iallreduce ...)
//   and tests it, so a timeout or an abort returns DT_ERR_TIMEOUT / DT_ERR_STATE like the
//   other backends; the unfinished request is left to MPI and the process must not
//   finalise MPI (mpi_boot.c sees to it). Non-blocking collectives of Open MPI 4 are
//   slower (libnbc): docs/mpi.md has the numbers.
// - errors: the communicators return MPI's errors (MPI_ERRORS_RETURN) and each one
//   becomes a dt_status with MPI's own message.
// AVG arrives here as SUM (the generic layer divides), world size 1 never arrives.
#include "comm/comm_impl.h"
#include "comm/mpi/mpi_impl.h"

#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

// After the group is aborted, a blocking MPI call gets this long to finish by itself
// before the watchdog aborts the MPI job.
#define ABORT_GRACE_MS 2000
// Sends still unfinished in the backend's free (flush waited for them already unless the
// group failed) get this long: the free must not block long.
#define FREE_WAIT_MS 1000

// One send handed to MPI: a copy of the data (the caller's buffer is free once
// dt_pg_send returns) and its requests.
typedef struct pending_send {
    MPI_Request          req[2]; // header, data
    dt_fingerprint       hdr;
    int                  peer; // for flush's message
    size_t               nbytes;
    struct pending_send *next;
    // the copy of the data follows
} pending_send;

// How an operation waits for MPI (DT_MPI_WAIT). The same on every rank (checked at
// init): MPI never matches a blocking collective with a non-blocking one, so ranks that
// mixed them would wait for each other forever.
typedef enum wait_mode {
    WAIT_BLOCK, // blocking MPI calls, bounded by the watchdog
    WAIT_POLL,  // non-blocking MPI calls, tested until the deadline
} wait_mode;

typedef struct mpi_ctx {
    dt_pg        *pg;
    MPI_Comm      coll, p2p; // collectives; send/recv
    int           rank, world;
    wait_mode     wait;
    bool          fingerprint; // DT_MPI_FINGERPRINT
    size_t        chunk;       // elements per MPI call for all_reduce, broadcast, reduce
    bool          broken;      // an MPI operation was left unfinished: no more MPI calls here
    void         *scratch;     // in-place reduce_scatter (grow-only)
    size_t        scratch_cap;
    pending_send *sends; // oldest first

    // The watchdog (block mode). Guarded by mu:
    pthread_t       wd;
    bool            wd_started, stop, inflight;
    uint64_t        gen;         // counts operations, so a late check skips a new one
    uint64_t        deadline_ns; // of the operation in flight
    char            what[80];    // its name
    pthread_mutex_t mu;
    pthread_cond_t  cv;
} mpi_ctx;

// --------------------------------------------------------------------- MPI types

static MPI_Datatype mpi_type(dt_dtype t, bool wraps) {
    // Integer SUM and PROD wrap around in two's complement (comm.h): that is unsigned
    // arithmetic on the same bits, which MPI defines; signed overflow it does not.
    switch (t) {
    case DT_FLOAT32:
        return MPI_FLOAT;
    case DT_INT32:
        return wraps ? MPI_UINT32_T : MPI_INT32_T;
    default:
        return wraps ? MPI_UINT64_T : MPI_INT64_T;
    }
}

static MPI_Op mpi_op(dt_reduce_op op) {
    switch (op) {
    case DT_REDUCE_MAX:
        return MPI_MAX;
    case DT_REDUCE_MIN:
        return MPI_MIN;
    case DT_REDUCE_PROD:
        return MPI_PROD;
    default:
        return MPI_SUM;
    }
}

// ------------------------------------------------------------------ one MPI call

typedef enum call_kind {
    C_ALLREDUCE,
    C_BCAST,
    C_REDUCE,
    C_ALLGATHER,
    C_REDUCE_SCATTER,
    C_GATHER,
    C_SCATTER,
    C_ALLTOALL,
    C_BARRIER,
    C_RECV,
} call_kind;

static const char *const call_names[][2] = {
    {"MPI_Allreduce", "MPI_Iallreduce"},
    {"MPI_Bcast", "MPI_Ibcast"},
    {"MPI_Reduce", "MPI_Ireduce"},
    {"MPI_Allgather", "MPI_Iallgather"},
    {"MPI_Reduce_scatter_block", "MPI_Ireduce_scatter_block"},
    {"MPI_Gather", "MPI_Igather"},
    {"MPI_Scatter", "MPI_Iscatter"},
    {"MPI_Alltoall", "MPI_Ialltoall"},
    {"MPI_Barrier", "MPI_Ibarrier"},
    {"MPI_Recv", "MPI_Irecv"},
};

typedef struct call {
    call_kind    kind;
    const void  *s;
    void        *r;
    int          n; // elements (per rank for the gathers, scatters and all-to-all)
    MPI_Datatype t;
    MPI_Op       o;
    int          root; // or the peer for C_RECV
    MPI_Comm     comm;
} call;

// Issues the call: blocking when req is NULL, else its non-blocking form.
static int issue(const call *k, MPI_Request *req, MPI_Status *status) {
    switch (k->kind) {
    case C_ALLREDUCE:
        return req ? MPI_Iallreduce(k->s, k->r, k->n, k->t, k->o, k->comm, req)
                   : MPI_Allreduce(k->s, k->r, k->n, k->t, k->o, k->comm);
    case C_BCAST:
        return req ? MPI_Ibcast(k->r, k->n, k->t, k->root, k->comm, req)
                   : MPI_Bcast(k->r, k->n, k->t, k->root, k->comm);
    case C_REDUCE:
        return req ? MPI_Ireduce(k->s, k->r, k->n, k->t, k->o, k->root, k->comm, req)
                   : MPI_Reduce(k->s, k->r, k->n, k->t, k->o, k->root, k->comm);
    case C_ALLGATHER:
        return req ? MPI_Iallgather(k->s, k->n, k->t, k->r, k->n, k->t, k->comm, req)
                   : MPI_Allgather(k->s, k->n, k->t, k->r, k->n, k->t, k->comm);
    case C_REDUCE_SCATTER:
        return req ? MPI_Ireduce_scatter_block(k->s, k->r, k->n, k->t, k->o, k->comm, req)
                   : MPI_Reduce_scatter_block(k->s, k->r, k->n, k->t, k->o, k->comm);
    case C_GATHER:
        return req ? MPI_Igather(k->s, k->n, k->t, k->r, k->n, k->t, k->root, k->comm, req)
                   : MPI_Gather(k->s, k->n, k->t, k->r, k->n, k->t, k->root, k->comm);
    case C_SCATTER:
        return req ? MPI_Iscatter(k->s, k->n, k->t, k->r, k->n, k->t, k->root, k->comm, req)
                   : MPI_Scatter(k->s, k->n, k->t, k->r, k->n, k->t, k->root, k->comm);
    case C_ALLTOALL:
        return req ? MPI_Ialltoall(k->s, k->n, k->t, k->r, k->n, k->t, k->comm, req)
                   : MPI_Alltoall(k->s, k->n, k->t, k->r, k->n, k->t, k->comm);
    case C_BARRIER:
        return req ? MPI_Ibarrier(k->comm, req) : MPI_Barrier(k->comm);
    case C_RECV:
        return req ? MPI_Irecv(k->r, k->n, k->t, k->root, 0, k->comm, req)
                   : MPI_Recv(k->r, k->n, k->t, k->root, 0, k->comm, status);
    }
    return MPI_ERR_OTHER;
}

static dt_status fail_mpi(const dt_op *op, int rc, const char *call_name) {
    char es[MPI_MAX_ERROR_STRING];
    return dt_op_fail(op, dt_mpi_status_of(rc), "%s failed: %s", call_name,
                      dt_mpi_error_string(rc, es, sizeof es));
}

// Runs one MPI call to completion in the group's wait mode.
static dt_status run_call(mpi_ctx *c, const dt_op *op, const call *k, MPI_Status *status) {
    if (dt_pg_aborted(c->pg))
        return DT_ERR_STATE; // the generic layer reports the abort's reason
    if (c->wait == WAIT_BLOCK) {
        int rc = issue(k, NULL, status); // the watchdog bounds it
        return rc == MPI_SUCCESS ? DT_OK : fail_mpi(op, rc, call_names[k->kind][0]);
    }
    MPI_Request req;
    dt_mpi_lock();
    int rc = issue(k, &req, status);
    dt_mpi_unlock();
    if (rc != MPI_SUCCESS)
        return fail_mpi(op, rc, call_names[k->kind][1]);
    dt_status st = dt_mpi_wait(&req, op->deadline_ns, c->pg, status, &rc);
    if (st != DT_OK) {
        c->broken = true; // the request stays with MPI, which may still write the buffer
        if (st == DT_ERR_TIMEOUT) {
            char w[96];
            snprintf(w, sizeof w, "the other ranks in %s (MPI cannot tell which rank is late)",
                     call_names[k->kind][1]);
            return dt_op_fail_timeout(op, w);
        }
        return dt_op_fail(op, st, "aborted while waiting in %s", call_names[k->kind][1]);
    }
    return rc == MPI_SUCCESS ? DT_OK : fail_mpi(op, rc, call_names[k->kind][1]);
}

// ---------------------------------------------------------------------- watchdog

static void *watchdog_main(void *arg) {
    mpi_ctx *c = arg;
    pthread_mutex_lock(&c->mu);
    uint64_t abort_at = 0, seen_gen = 0;
    while (!c->stop) {
        if (c->gen != seen_gen)
            seen_gen = c->gen, abort_at = 0;
        uint64_t now = dt_now_ns();
        if (!c->inflight)
            abort_at = 0;
        if (c->inflight && !abort_at && dt_pg_aborted(c->pg))
            abort_at = now + (uint64_t)ABORT_GRACE_MS * 1000000ull;
        bool late = c->inflight && now >= c->deadline_ns, gave_up = abort_at && now >= abort_at;
        if (late || gave_up) {
            char msg[256];
            snprintf(msg, sizeof msg,
                     "%s: %s; MPI cannot cancel a collective, so the MPI job is aborted "
                     "(MPI_Abort)",
                     c->what,
                     late ? "timed out in MPI (deadline set by the group timeout; "
                            "DT_TIMEOUT_MS or dt_pg_opts.timeout_ms)"
                          : "the group was aborted while an MPI call was in flight");
            DT_ERROR("comm", "%s", msg);
            dt_mpi_mark_stuck();
            pthread_mutex_unlock(&c->mu);
            MPI_Abort(MPI_COMM_WORLD, 1);
            pthread_mutex_lock(&c->mu); // not reached
            break;
        }
        // Wake every 10 ms, busy or idle: operations never wake this thread (a wake-up
        // per operation costs a context switch, several microseconds on a small host),
        // and 100 checks a second cost nothing measurable.
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 10 * 1000000L;
        if (ts.tv_nsec >= 1000000000L)
            ts.tv_sec++, ts.tv_nsec -= 1000000000L;
        pthread_cond_timedwait(&c->cv, &c->mu, &ts);
    }
    pthread_mutex_unlock(&c->mu);
    return NULL;
}

static void watch_begin(mpi_ctx *c, const dt_op *op) {
    if (!c->wd_started)
        return;
    pthread_mutex_lock(&c->mu);
    c->inflight = true;
    c->gen++;
    c->deadline_ns = op->deadline_ns;
    snprintf(c->what, sizeof c->what, "%s", op->name);
    pthread_mutex_unlock(&c->mu);
}

static void watch_end(mpi_ctx *c) {
    if (!c->wd_started)
        return;
    pthread_mutex_lock(&c->mu);
    c->inflight = false;
    pthread_mutex_unlock(&c->mu);
}

// ----------------------------------------------------------------- fingerprints

enum { FP_FIELDS = 6 };

static void fp_pack(const dt_fingerprint *fp, int64_t v[FP_FIELDS]) {
    v[0] = (int64_t)fp->seq;
    v[1] = (int64_t)fp->count;
    v[2] = fp->root;
    v[3] = fp->coll;
    v[4] = fp->dtype;
    v[5] = fp->op | fp->order << 8;
}

static dt_fingerprint fp_unpack(const int64_t v[FP_FIELDS]) {
    dt_fingerprint fp = {0};
    fp.seq            = (uint64_t)v[0];
    fp.count          = (uint64_t)v[1];
    fp.root           = (int32_t)v[2];
    fp.coll           = (uint8_t)v[3];
    fp.dtype          = (uint8_t)v[4];
    fp.op             = (uint8_t)v[5];
    fp.order          = (uint8_t)(v[5] >> 8);
    return fp;
}

// One MPI_Allreduce(MAX) of the fields and their negations: every rank learns the
// largest and the smallest value of each field, so every rank sees a difference.
static dt_status check_fingerprint(mpi_ctx *c, const dt_op *op) {
    int64_t v[2 * FP_FIELDS];
    fp_pack(&op->fp, v);
    for (int i = 0; i < FP_FIELDS; i++)
        v[FP_FIELDS + i] = -v[i];
    call k = {.kind = C_ALLREDUCE,
              .s    = MPI_IN_PLACE,
              .r    = v,
              .n    = 2 * FP_FIELDS,
              .t    = MPI_INT64_T,
              .o    = MPI_MAX,
              .comm = c->coll};
    DT_TRY(run_call(c, op, &k, MPI_STATUS_IGNORE));
    bool same = true;
    for (int i = 0; i < FP_FIELDS; i++)
        same &= v[i] == -v[FP_FIELDS + i];
    if (same)
        return DT_OK;
    // Everyone saw the difference, so everyone takes part in naming a culprit.
    int64_t *all = dt_alloc(sizeof(int64_t) * FP_FIELDS * (size_t)c->world);
    if (!all)
        return dt_op_fail(op, DT_ERR_NOMEM,
                          "fingerprints differ between ranks, and there is "
                          "no memory to say which");
    int64_t mine[FP_FIELDS];
    fp_pack(&op->fp, mine);
    call      g  = {.kind = C_ALLGATHER,
                    .s    = mine,
                    .r    = all,
                    .n    = FP_FIELDS,
                    .t    = MPI_INT64_T,
                    .comm = c->coll};
    dt_status st = run_call(c, op, &g, MPI_STATUS_IGNORE);
    if (st == DT_OK) {
        int culprit = c->rank == 0 ? 1 : 0; // someone else differs when nobody else does
        for (int r = 0; r < c->world; r++)
            if (r != c->rank && memcmp(all + r * FP_FIELDS, mine, sizeof mine) != 0) {
                culprit = r;
                break;
            }
        dt_fingerprint theirs = fp_unpack(all + culprit * FP_FIELDS);
        st                    = dt_op_fail_mismatch(op, culprit, &theirs);
    }
    dt_free(all);
    return st;
}

// ------------------------------------------------------------------ collectives

static dt_status need_int_count(const dt_op *op, size_t count) {
    if (count > INT_MAX)
        return dt_op_fail(op, DT_ERR_UNSUPPORTED,
                          "the mpi backend takes at most %d elements per rank here, found %zu "
                          "(MPI counts are int)",
                          INT_MAX, count);
    return DT_OK;
}

// all_reduce, broadcast and reduce in pieces of at most c->chunk elements.
static dt_status run_chunked(mpi_ctx *c, const dt_op *op, call_kind kind) {
    size_t       esz   = dt_dtype_size(op->dtype);
    bool         wraps = op->op == DT_REDUCE_SUM || op->op == DT_REDUCE_PROD;
    MPI_Datatype t     = mpi_type(op->dtype, kind != C_BCAST && wraps);
    bool         root  = kind == C_REDUCE && c->rank == op->root;
    size_t       off   = 0;
    do {
        size_t      n   = op->count - off < c->chunk ? op->count - off : c->chunk;
        call        k   = {.kind = kind,
                           .n    = (int)n,
                           .t    = t,
                           .o    = mpi_op(op->op),
                           .root = op->root,
                           .comm = c->coll};
        char       *dst = op->dst ? (char *)op->dst + off * esz : NULL;
        const char *src = op->src ? (const char *)op->src + off * esz : NULL;
        if (kind == C_BCAST) {
            k.r = dst;
        } else if (kind == C_ALLREDUCE || root) {
            k.s = op->src == op->dst ? MPI_IN_PLACE : src;
            k.r = dst;
        } else {
            k.s = src; // reduce, not the root: nothing is received
        }
        DT_TRY(run_call(c, op, &k, MPI_STATUS_IGNORE));
        off += n;
    } while (off < op->count);
    return DT_OK;
}

static void *scratch(mpi_ctx *c, size_t nbytes) {
    if (nbytes > c->scratch_cap) {
        dt_free(c->scratch);
        c->scratch     = dt_alloc(nbytes);
        c->scratch_cap = c->scratch ? nbytes : 0;
    }
    return c->scratch;
}

static dt_status run_gathers(mpi_ctx *c, const dt_op *op) {
    DT_TRY(need_int_count(op, op->count));
    size_t      one  = op->count * dt_dtype_size(op->dtype);
    bool        root = c->rank == op->root;
    const char *src  = op->src;
    char       *dst  = op->dst;
    call        k    = {.n    = (int)op->count,
                        .t    = mpi_type(op->dtype, false),
                        .s    = src,
                        .r    = dst,
                        .root = op->root,
                        .comm = c->coll};
    switch (op->kind) {
    case DT_COLL_ALL_GATHER:
        k.kind = C_ALLGATHER;
        if (src == dst + (size_t)c->rank * one)
            k.s = MPI_IN_PLACE;
        break;
    case DT_COLL_GATHER:
        k.kind = C_GATHER;
        if (root && src == dst + (size_t)c->rank * one)
            k.s = MPI_IN_PLACE;
        break;
    case DT_COLL_SCATTER:
        k.kind = C_SCATTER;
        if (root && dst == src + (size_t)c->rank * one)
            k.r = MPI_IN_PLACE;
        break;
    case DT_COLL_ALL_TO_ALL:
        k.kind = C_ALLTOALL;
        break;
    case DT_COLL_REDUCE_SCATTER: {
        bool wraps = op->op == DT_REDUCE_SUM || op->op == DT_REDUCE_PROD;
        k.kind     = C_REDUCE_SCATTER;
        k.t        = mpi_type(op->dtype, wraps);
        k.o        = mpi_op(op->op);
        // In place (dst inside src) MPI would read and write the same block: go
        // through scratch. MPI's own in-place form puts the result at src[0] instead.
        bool inside = one && dst >= src && dst < src + one * (size_t)c->world;
        if (inside && !(k.r = scratch(c, one)))
            return dt_op_fail(op, DT_ERR_NOMEM, "no memory for %zu bytes of scratch", one);
        DT_TRY(run_call(c, op, &k, MPI_STATUS_IGNORE));
        if (inside)
            memcpy(dst, k.r, one);
        return DT_OK;
    }
    default:
        return dt_op_fail(op, DT_ERR_INTERNAL, "not a gather or scatter");
    }
    return run_call(c, op, &k, MPI_STATUS_IGNORE);
}

// ------------------------------------------------------------------ send / recv

// Tests the sends handed to MPI and releases those that completed.
static void progress_sends(mpi_ctx *c) {
    for (pending_send **pp = &c->sends; *pp;) {
        pending_send *p    = *pp;
        int           done = 0;
        MPI_Status    sts[2]; // not MPI_STATUSES_IGNORE: gcc misreads MPICH's as an array
        dt_mpi_lock();
        MPI_Testall(2, p->req, &done, sts);
        dt_mpi_unlock();
        if (done) {
            *pp = p->next;
            dt_free(p);
        } else {
            pp = &p->next;
        }
    }
}

// Copies the data and hands it to MPI (MPI_Isend): dt_pg_send returns at once, the
// copy lives until MPI is done with it (tested at every later operation and at free).
static dt_status run_send(mpi_ctx *c, const dt_op *op) {
    DT_TRY(need_int_count(op, op->count));
    size_t        nbytes = op->count * dt_dtype_size(op->dtype);
    pending_send *p      = dt_alloc(sizeof *p + nbytes);
    if (!p)
        return dt_op_fail(op, DT_ERR_NOMEM, "no memory to copy %zu bytes", nbytes);
    p->hdr    = op->fp;
    p->peer   = op->peer;
    p->nbytes = nbytes;
    p->next   = NULL;
    p->req[0] = p->req[1] = MPI_REQUEST_NULL;
    if (nbytes)
        memcpy(p + 1, op->src, nbytes);
    int rc = MPI_SUCCESS;
    dt_mpi_lock();
    if (c->fingerprint)
        rc = MPI_Isend(&p->hdr, (int)sizeof p->hdr, MPI_BYTE, op->peer, 0, c->p2p, &p->req[0]);
    if (rc == MPI_SUCCESS)
        rc = MPI_Isend(p + 1, (int)op->count, mpi_type(op->dtype, false), op->peer, 0, c->p2p,
                       &p->req[1]);
    dt_mpi_unlock();
    pending_send **tail = &c->sends;
    while (*tail)
        tail = &(*tail)->next;
    *tail = p; // even after a failure: a posted header must outlive its request
    return rc == MPI_SUCCESS ? DT_OK : fail_mpi(op, rc, "MPI_Isend");
}

static dt_status run_recv(mpi_ctx *c, const dt_op *op) {
    DT_TRY(need_int_count(op, op->count));
    MPI_Status st;
    if (c->fingerprint) {
        dt_fingerprint theirs;
        call           h = {.kind = C_RECV,
                            .r    = &theirs,
                            .n    = (int)sizeof theirs,
                            .t    = MPI_BYTE,
                            .root = op->peer,
                            .comm = c->p2p};
        DT_TRY(run_call(c, op, &h, &st));
        if (!dt_fp_match(&op->fp, &theirs))
            return dt_op_fail_mismatch(op, op->peer, &theirs);
    }
    MPI_Datatype t = mpi_type(op->dtype, false);
    call         d = {.kind = C_RECV,
                      .r    = op->dst,
                      .n    = (int)op->count,
                      .t    = t,
                      .root = op->peer,
                      .comm = c->p2p};
    DT_TRY(run_call(c, op, &d, &st));
    int got = 0;
    MPI_Get_count(&st, t, &got);
    if ((size_t)got != op->count)
        return dt_op_fail(op, DT_ERR_MISMATCH,
                          "rank %d sent %d elements of %s but this rank expected %zu", op->peer,
                          got, dt_dtype_name(op->dtype), op->count);
    return DT_OK;
}

// ------------------------------------------------------------------ transfer slots
//
// xfer_post / xfer_wait (backend.h) for the point-to-point algorithms that DT_*_ALGO
// forces and for the all_reduce in tree order (MPI's own reduces in an order of its
// choosing): two messages per transfer on the p2p communicator with tag 1 (dt_pg_send's
// use tag 0, so the two never match each other), a header (the operation's fingerprint,
// the transfer's step and size, checked by the receiver as tcp checks its headers) and
// the data. The requests and the header live in the transfer's backend scratch; MPI
// moves every request whenever any is tested.

#define XFER_TAG 1

typedef struct xfer_hdr {
    dt_fingerprint fp;
    uint32_t       step, pad;
    uint64_t       nbytes;
} xfer_hdr;

typedef struct xfer_priv {
    MPI_Request req[2]; // header, data
    xfer_hdr    hdr;
} xfer_priv;
_Static_assert(sizeof(xfer_priv) <= sizeof(((dt_xfer *)0)->priv_), "fits dt_xfer.priv_");

static xfer_priv *priv_of(dt_xfer *x) {
    return (xfer_priv *)(void *)x->priv_;
}

static dt_status mpi_xfer_post(void *ctx, const dt_op *op, dt_xfer *x) {
    mpi_ctx   *c = ctx;
    xfer_priv *p = priv_of(x);
    if (c->broken)
        return dt_op_fail(op, DT_ERR_STATE,
                          "an earlier MPI operation of this group did not finish");
    if (x->nbytes > INT_MAX)
        return dt_op_fail(op, DT_ERR_UNSUPPORTED,
                          "a transfer of %zu bytes is beyond one MPI message (INT_MAX bytes)",
                          x->nbytes);
    p->req[0] = p->req[1] = MPI_REQUEST_NULL;
    p->hdr                = (xfer_hdr){.fp = op->fp, .step = x->step, .nbytes = x->nbytes};
    x->done               = false;
    int rc;
    dt_mpi_lock();
    if (x->is_send) {
        rc =
            MPI_Isend(&p->hdr, (int)sizeof p->hdr, MPI_BYTE, x->peer, XFER_TAG, c->p2p, &p->req[0]);
        if (rc == MPI_SUCCESS)
            rc = MPI_Isend(x->buf, (int)x->nbytes, MPI_BYTE, x->peer, XFER_TAG, c->p2p, &p->req[1]);
    } else {
        rc =
            MPI_Irecv(&p->hdr, (int)sizeof p->hdr, MPI_BYTE, x->peer, XFER_TAG, c->p2p, &p->req[0]);
        if (rc == MPI_SUCCESS)
            rc = MPI_Irecv(x->buf, (int)x->nbytes, MPI_BYTE, x->peer, XFER_TAG, c->p2p, &p->req[1]);
    }
    dt_mpi_unlock();
    return rc == MPI_SUCCESS ? DT_OK : fail_mpi(op, rc, x->is_send ? "MPI_Isend" : "MPI_Irecv");
}

static dt_status mpi_xfer_wait(void *ctx, const dt_op *op, dt_xfer *x) {
    mpi_ctx   *c = ctx;
    xfer_priv *p = priv_of(x);
    if (x->done)
        return DT_OK;
    for (int i = 0; i < 2; i++) {
        MPI_Status st;
        int        rc;
        dt_status  ws = dt_mpi_wait(&p->req[i], op->deadline_ns, c->pg, &st, &rc);
        if (ws == DT_ERR_TIMEOUT) {
            char who[48];
            snprintf(who, sizeof who, "rank %d (%s)", x->peer, x->is_send ? "a send" : "a receive");
            return dt_op_fail_timeout(op, who);
        }
        if (ws != DT_OK)
            return ws; // aborted: the generic layer reports why
        if (rc != MPI_SUCCESS) {
            c->broken = true;
            return fail_mpi(op, rc, x->is_send ? "MPI_Isend" : "MPI_Irecv");
        }
        if (x->is_send)
            continue;
        if (i == 0 && !dt_fp_match(&op->fp, &p->hdr.fp))
            return dt_op_fail_mismatch(op, x->peer, &p->hdr.fp);
        if (i == 0 && (p->hdr.step != x->step || p->hdr.nbytes != x->nbytes))
            return dt_op_fail(op, DT_ERR_MISMATCH,
                              "rank %d sent message %u.%u of %llu bytes, this rank expected "
                              "message %u.%u of %zu bytes (ranks chose different algorithms: are "
                              "the DT_*_ALGO settings equal on every rank?)",
                              x->peer, p->hdr.step >> 24, p->hdr.step & 0xffffff,
                              (unsigned long long)p->hdr.nbytes, x->step >> 24, x->step & 0xffffff,
                              x->nbytes);
    }
    x->done = true;
    return DT_OK;
}

// Asked by name only: "auto" never picks mpi (docs/mpi.md).
static bool mpi_usable(const dt_pg *pg, bool for_auto, char *why, size_t n) {
    (void)pg;
    if (for_auto && why)
        snprintf(why, n, "auto does not pick mpi");
    return !for_auto;
}

// ------------------------------------------------------------------ the slots

// Every collective slot and send/recv: one function, dispatching on the kind.
static dt_status mpi_run(void *ctx, const dt_op *op) {
    mpi_ctx *c = ctx;
    if (c->broken)
        return dt_op_fail(op, DT_ERR_STATE,
                          "an earlier MPI operation of this group did not "
                          "finish; the group cannot be used");
    watch_begin(c, op);
    dt_status st  = DT_OK;
    bool      p2p = op->kind == DT_COLL_SEND || op->kind == DT_COLL_RECV;
    if (c->fingerprint && !p2p)
        st = check_fingerprint(c, op);
    if (st == DT_OK) {
        switch (op->kind) {
        case DT_COLL_ALL_REDUCE:
            st = run_chunked(c, op, C_ALLREDUCE);
            break;
        case DT_COLL_BROADCAST:
            st = run_chunked(c, op, C_BCAST);
            break;
        case DT_COLL_REDUCE:
            st = run_chunked(c, op, C_REDUCE);
            break;
        case DT_COLL_BARRIER:
        case DT_COLL_INIT: {
            call k = {.kind = C_BARRIER, .comm = c->coll};
            st     = run_call(c, op, &k, MPI_STATUS_IGNORE);
            break;
        }
        case DT_COLL_SEND:
            st = run_send(c, op);
            break;
        case DT_COLL_RECV:
            st = run_recv(c, op);
            break;
        default:
            st = run_gathers(c, op);
            break;
        }
    }
    watch_end(c);
    if (!c->broken && c->sends)
        progress_sends(c);
    return st;
}

// backend.h's push: an MPI_Isend larger than MPI's eager limit may need the sender's MPI
// to make progress (a rendezvous over a transport without single-copy or an async
// progress thread), and comm.h promises delivery without further calls by the sender:
// the progress thread tests them while the lane is idle. Never waits.
static bool mpi_push(void *ctx, bool *moved) {
    mpi_ctx *c = ctx;
    if (c->broken || !c->sends)
        return false;
    const pending_send *first = c->sends;
    progress_sends(c);
    if (c->sends != first)
        *moved = true;
    return c->sends != NULL;
}

// backend.h's flush: dt_pg_free waits, testing, until MPI is done with every send, the
// deadline, or a failure of the group (reported already).
static dt_status mpi_flush(void *ctx, uint64_t deadline_ns) {
    mpi_ctx *c = ctx;
    while (!c->broken && c->sends && !dt_pg_aborted(c->pg)) {
        progress_sends(c);
        if (!c->sends)
            break;
        if (dt_now_ns() >= deadline_ns)
            return dt_fail(DT_ERR_TIMEOUT,
                           "dt_pg_free: send #%llu to rank %d (%zu bytes) timed out: MPI did "
                           "not deliver it (the receiver never received it)",
                           (unsigned long long)DT_FP_SEQ(&c->sends->hdr), c->sends->peer,
                           c->sends->nbytes);
        struct timespec ts = {0, 100000};
        nanosleep(&ts, NULL);
    }
    return DT_OK;
}

static void mpi_abort(void *ctx, dt_status st, const char *msg) {
    (void)st, (void)msg;
    // MPI has no way to tell one peer to stop waiting short of MPI_Abort, which would
    // end this process before the caller sees the error. The peers learn it when this
    // process exits: it leaves without MPI_Finalize (failing exit status) and the
    // launcher stops the job; until then their watchdogs bound their waits.
    mpi_ctx *c = ctx;
    if (c->broken)
        dt_mpi_mark_stuck();
}

static void mpi_free(void *ctx) {
    mpi_ctx *c = ctx;
    if (c->wd_started) {
        pthread_mutex_lock(&c->mu);
        c->stop = true;
        pthread_cond_signal(&c->cv);
        pthread_mutex_unlock(&c->mu);
        pthread_join(c->wd, NULL);
    }
    uint64_t until = dt_deadline_ns(FREE_WAIT_MS);
    while (!c->broken && c->sends && dt_now_ns() < until) {
        progress_sends(c);
        if (c->sends)
            sched_yield();
    }
    if (c->sends || c->broken) {
        // MPI still holds requests on these communicators: leave the communicators, the
        // send copies and the scratch buffer to MPI (and do not finalise it at exit).
        dt_mpi_mark_stuck();
    } else {
        dt_mpi_lock();
        if (c->coll != MPI_COMM_NULL)
            MPI_Comm_free(&c->coll);
        if (c->p2p != MPI_COMM_NULL)
            MPI_Comm_free(&c->p2p);
        dt_mpi_unlock();
    }
    pthread_mutex_destroy(&c->mu);
    pthread_cond_destroy(&c->cv);
    if (!c->broken) // else an unfinished reduce_scatter may still write it
        dt_free(c->scratch);
    dt_free(c);
}

// Every rank must run with the same DT_MPI_WAIT, DT_MPI_FINGERPRINT and
// DT_MPI_CHUNK_COUNT: each changes which MPI calls an operation makes, and ranks that
// differ would match the wrong calls. One non-blocking MPI_Iallreduce (MAX) of the
// values and their negations, whatever the wait mode, tells every rank.
static dt_status check_settings(mpi_ctx *c, uint64_t deadline_ns) {
    int64_t mine[3] = {c->wait, c->fingerprint, (int64_t)c->chunk}, v[6];
    for (int i = 0; i < 3; i++)
        v[i] = mine[i], v[3 + i] = -mine[i];
    MPI_Request req;
    int         rc;
    char        es[MPI_MAX_ERROR_STRING];
    dt_mpi_lock();
    rc = MPI_Iallreduce(MPI_IN_PLACE, v, 6, MPI_INT64_T, MPI_MAX, c->coll, &req);
    dt_mpi_unlock();
    if (rc == MPI_SUCCESS) {
        dt_status st = dt_mpi_wait(&req, deadline_ns, c->pg, MPI_STATUS_IGNORE, &rc);
        if (st != DT_OK)
            return dt_fail(st, "mpi backend: %s while the ranks compared their settings",
                           st == DT_ERR_TIMEOUT ? "timed out" : "aborted");
    }
    if (rc != MPI_SUCCESS)
        return dt_fail(dt_mpi_status_of(rc), "mpi backend: MPI_Iallreduce failed: %s",
                       dt_mpi_error_string(rc, es, sizeof es));
    static const char *const names[3] = {"DT_MPI_WAIT", "DT_MPI_FINGERPRINT", "DT_MPI_CHUNK_COUNT"};
    char                     here[3][24];
    snprintf(here[0], sizeof here[0], "%s", c->wait == WAIT_POLL ? "poll" : "block");
    snprintf(here[1], sizeof here[1], "%s", c->fingerprint ? "on" : "off");
    snprintf(here[2], sizeof here[2], "%zu", c->chunk);
    for (int i = 0; i < 3; i++)
        if (v[i] != -v[3 + i])
            return dt_fail(DT_ERR_MISMATCH,
                           "mpi backend: %s differs between ranks (this rank: %s); every rank "
                           "must use the same value, or their MPI calls would not match",
                           names[i], here[i]);
    return DT_OK;
}

// A duplicate of the library's world, bounded by the deadline.
static dt_status dup_world(MPI_Comm *out, uint64_t deadline_ns) {
    MPI_Request req;
    int         rc;
    char        es[MPI_MAX_ERROR_STRING];
    dt_mpi_lock();
    rc = MPI_Comm_idup(dt_mpi_world(), out, &req);
    dt_mpi_unlock();
    if (rc == MPI_SUCCESS) {
        dt_status st = dt_mpi_wait(&req, deadline_ns, NULL, MPI_STATUS_IGNORE, &rc);
        if (st == DT_ERR_TIMEOUT)
            return dt_fail(st, "mpi backend: timed out waiting for every rank in "
                               "MPI_Comm_idup; MPI cannot tell which rank is missing");
    }
    if (rc != MPI_SUCCESS)
        return dt_fail(dt_mpi_status_of(rc), "mpi backend: MPI_Comm_idup failed: %s",
                       dt_mpi_error_string(rc, es, sizeof es));
    MPI_Comm_set_errhandler(*out, MPI_ERRORS_RETURN);
    return DT_OK;
}

static dt_status make_ctx(dt_pg *pg, MPI_Comm coll, MPI_Comm p2p, uint64_t deadline_ns, void **out);

static dt_status mpi_init(dt_pg *pg, dt_store *store, uint64_t deadline_ns, void **out) {
    (void)store;
    DT_TRY(dt_mpi_init(deadline_ns, "mpi backend"));
    int level = dt_mpi_thread_level();
    if (level < MPI_THREAD_SERIALIZED)
        return dt_fail(DT_ERR_UNSUPPORTED,
                       "mpi backend: MPI runs at thread level %d, below MPI_THREAD_SERIALIZED; "
                       "the backend calls MPI from the group's progress thread (initialise MPI "
                       "with MPI_Init_thread and MPI_THREAD_MULTIPLE, or let dtrain do it)",
                       level);
    int mrank, mworld;
    MPI_Comm_rank(dt_mpi_world(), &mrank);
    MPI_Comm_size(dt_mpi_world(), &mworld);
    if (mrank != dt_pg_rank(pg) || mworld != dt_pg_size(pg))
        return dt_fail(DT_ERR_MISMATCH,
                       "mpi backend: this process is rank %d of %d in the group but rank %d of "
                       "%d in MPI_COMM_WORLD; the mpi backend needs the group's ranks to be "
                       "MPI's",
                       dt_pg_rank(pg), dt_pg_size(pg), mrank, mworld);
    return make_ctx(pg, MPI_COMM_NULL, MPI_COMM_NULL, deadline_ns, out);
}

// The backend state over communicators `coll` and `p2p` (MPI_COMM_NULL: duplicates of
// the library's world), taking them over (freed with the state, also on failure).
static dt_status make_ctx(dt_pg *pg, MPI_Comm coll, MPI_Comm p2p, uint64_t deadline_ns,
                          void **out) {
    int       level = dt_mpi_thread_level();
    int       mrank = dt_pg_rank(pg), mworld = dt_pg_size(pg);
    int       wait, fp_off; // block|poll, on|off
    long      chunk;
    dt_status st = dt_setting_choice("DT_MPI_WAIT", &wait);
    if (st == DT_OK)
        st = dt_setting_choice("DT_MPI_FINGERPRINT", &fp_off);
    if (st == DT_OK)
        st = dt_setting_int("DT_MPI_CHUNK_COUNT", &chunk);
    mpi_ctx *c = st == DT_OK ? dt_alloc_zero(sizeof *c) : NULL;
    if (!c) {
        dt_mpi_lock();
        if (coll != MPI_COMM_NULL)
            MPI_Comm_free(&coll);
        if (p2p != MPI_COMM_NULL)
            MPI_Comm_free(&p2p);
        dt_mpi_unlock();
        return st != DT_OK ? st : DT_ERR_NOMEM;
    }
    c->pg          = pg;
    c->rank        = mrank;
    c->world       = mworld;
    c->wait        = (wait_mode)wait;
    c->fingerprint = !fp_off;
    c->chunk       = (size_t)chunk;
    c->coll        = coll;
    c->p2p         = p2p;
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->cv, NULL);
    if (c->wait != WAIT_POLL && level < MPI_THREAD_MULTIPLE) {
        // The watchdog would call MPI_Abort beside a blocking call: not allowed here.
        c->wait = WAIT_POLL;
        if (mrank == 0 && coll == MPI_COMM_NULL)
            DT_INFO("comm",
                    "mpi backend: MPI thread level %d is below MPI_THREAD_MULTIPLE, "
                    "waiting by polling (DT_MPI_WAIT=poll)",
                    level);
    }
    bool fresh = coll == MPI_COMM_NULL;
    if (fresh)
        st = dup_world(&c->coll, deadline_ns);
    if (st == DT_OK && fresh)
        st = dup_world(&c->p2p, deadline_ns);
    if (st == DT_OK)
        st = check_settings(c, deadline_ns);
    if (st == DT_OK && c->wait != WAIT_POLL) {
        if (pthread_create(&c->wd, NULL, watchdog_main, c) == 0)
            c->wd_started = true;
        else
            st = dt_fail(DT_ERR_IO, "mpi backend: could not start the watchdog thread");
    }
    if (st != DT_OK) {
        dt_mpi_mark_stuck();
        mpi_free(c);
        return st;
    }
    if (mrank == 0 && fresh)
        DT_INFO("comm", "mpi backend: %d ranks, wait %s, fingerprints %s, thread level %d", mworld,
                c->wait == WAIT_POLL ? "poll" : "block", c->fingerprint ? "on" : "off", level);
    *out = c;
    return DT_OK;
}

// A sub-group: MPI_Comm_split of the parent's two communicators (every rank of the
// parent calls it; MPI_UNDEFINED outside the group). MPI_Comm_split has no
// non-blocking form: it runs right after the parent's all_gather that agreed on the
// groups, so every rank is there; a rank that dies in between is left to MPI.
static dt_status mpi_group_new(void *parent_ctx, dt_pg *group, dt_store *store, int color, int key,
                               uint64_t deadline_ns, void **out) {
    (void)store;
    mpi_ctx *p = parent_ctx;
    *out       = NULL;
    if (!p)
        return dt_fail(DT_ERR_STATE, "mpi backend: the parent group has no MPI state");
    if (p->broken)
        return dt_fail(DT_ERR_STATE, "mpi backend: the parent group's MPI state is broken "
                                     "(an operation was left unfinished)");
    MPI_Comm coll = MPI_COMM_NULL, p2p = MPI_COMM_NULL;
    int      c = color < 0 ? MPI_UNDEFINED : color;
    char     es[MPI_MAX_ERROR_STRING];
    dt_mpi_lock();
    int rc = MPI_Comm_split(p->coll, c, key, &coll);
    if (rc == MPI_SUCCESS)
        rc = MPI_Comm_split(p->p2p, c, key, &p2p);
    dt_mpi_unlock();
    if (rc != MPI_SUCCESS) {
        dt_mpi_lock();
        if (coll != MPI_COMM_NULL)
            MPI_Comm_free(&coll);
        dt_mpi_unlock();
        return dt_fail(dt_mpi_status_of(rc), "mpi backend: MPI_Comm_split failed: %s",
                       dt_mpi_error_string(rc, es, sizeof es));
    }
    if (!group)
        return DT_OK; // MPI_COMM_NULL both
    MPI_Comm_set_errhandler(coll, MPI_ERRORS_RETURN);
    MPI_Comm_set_errhandler(p2p, MPI_ERRORS_RETURN);
    int mrank = -1, mworld = 0;
    MPI_Comm_rank(coll, &mrank);
    MPI_Comm_size(coll, &mworld);
    if (mrank != dt_pg_rank(group) || mworld != dt_pg_size(group)) {
        dt_mpi_lock();
        MPI_Comm_free(&coll);
        MPI_Comm_free(&p2p);
        dt_mpi_unlock();
        return dt_fail(DT_ERR_MISMATCH,
                       "mpi backend: MPI_Comm_split made this rank %d of %d, the group expects "
                       "%d of %d",
                       mrank, mworld, dt_pg_rank(group), dt_pg_size(group));
    }
    return make_ctx(group, coll, p2p, deadline_ns, out);
}

const dt_backend_ops dt_backend_mpi = {
    .name      = "mpi",
    .usable    = mpi_usable,
    .init      = mpi_init,
    .group_new = mpi_group_new,
    .free      = mpi_free,
    .abort     = mpi_abort,
    .run       = mpi_run,
    .xfer_post = mpi_xfer_post,
    .xfer_wait = mpi_xfer_wait,
    .push      = mpi_push,
    .flush     = mpi_flush,
    .built     = true,
};
