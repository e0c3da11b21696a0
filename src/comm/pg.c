// pg.c: the process group. Rendezvous through a store (ranks, world size, hosts),
// backend selection, the progress thread and its work queue, argument checks,
// sequence numbers and fingerprints, deadlines, AVG, world size 1, poisoning and
// abort. Transport details live in the backends (tcp.c, shm*.c); algorithms over
// point-to-point messages in algo.c; sub-groups in group.c (they run on the world
// group's lane and share its poison: pg_impl.h).
#include "comm/backends.h"
#include "comm/pg_impl.h"
#include "comm/reduce.h"
#include "dtrain/trace.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#define MSG_LEN DT_PG_MSG_LEN
// After an operation's deadline, dt_work_wait gives the backend this long to report
// the timeout itself before it aborts the group.
#define WAIT_GRACE_MS 5000

// --------------------------------------------------------------------------- names

size_t dt_dtype_size(dt_dtype t) {
    switch (t) {
    case DT_FLOAT32:
        return 4;
    case DT_INT32:
        return 4;
    case DT_INT64:
        return 8;
    default:
        return 0;
    }
}

const char *dt_dtype_name(dt_dtype t) {
    switch (t) {
    case DT_FLOAT32:
        return "float32";
    case DT_INT32:
        return "int32";
    case DT_INT64:
        return "int64";
    default:
        return "invalid";
    }
}

const char *dt_reduce_op_name(dt_reduce_op op) {
    static const char *const names[DT_REDUCE_COUNT_] = {"sum", "avg", "max", "min", "prod"};
    return (unsigned)op < DT_REDUCE_COUNT_ ? names[op] : "invalid";
}

const char *dt_coll_name(dt_coll c) {
    static const char *const names[DT_COLL_COUNT_] = {
        "all_reduce", "broadcast",  "reduce",  "all_gather", "reduce_scatter", "gather",
        "scatter",    "all_to_all", "barrier", "send",       "recv",           "init"};
    return (unsigned)c < DT_COLL_COUNT_ ? names[c] : "invalid";
}

static bool is_p2p(dt_coll c) {
    return c == DT_COLL_SEND || c == DT_COLL_RECV;
}
static bool has_op(dt_coll c) {
    return c == DT_COLL_ALL_REDUCE || c == DT_COLL_REDUCE || c == DT_COLL_REDUCE_SCATTER;
}
static bool has_root(dt_coll c) {
    return c == DT_COLL_BROADCAST || c == DT_COLL_REDUCE || c == DT_COLL_GATHER ||
           c == DT_COLL_SCATTER;
}

bool dt_fp_match(const dt_fingerprint *a, const dt_fingerprint *b) {
    uint8_t ca = a->coll, cb = b->coll;
    if (is_p2p((dt_coll)ca) && is_p2p((dt_coll)cb))
        ca = cb = DT_COLL_SEND; // a send matches a recv
    return ca == cb && a->seq == b->seq && a->count == b->count && a->root == b->root &&
           a->dtype == b->dtype && a->op == b->op;
}

const char *dt_fp_format(const dt_fingerprint *fp, char *buf, size_t n) {
    dt_coll c   = (dt_coll)fp->coll;
    size_t  off = (size_t)snprintf(buf, n, "%s #%" PRIu64, dt_coll_name(c), DT_FP_SEQ(fp));
    if (off < n && DT_FP_GROUP(fp))
        off += (size_t)snprintf(buf + off, n - off, " on group %u", DT_FP_GROUP(fp));
    if (off < n)
        off += (size_t)snprintf(buf + off, n - off, " (%s", dt_dtype_name((dt_dtype)fp->dtype));
    if (off < n && has_op(c))
        off += (size_t)snprintf(buf + off, n - off, " %s", dt_reduce_op_name((dt_reduce_op)fp->op));
    if (off < n)
        off += (size_t)snprintf(buf + off, n - off, ", count %" PRIu64, fp->count);
    if (off < n && has_root(c))
        off += (size_t)snprintf(buf + off, n - off, ", root %d", fp->root);
    if (off < n && is_p2p(c))
        off += (size_t)snprintf(buf + off, n - off, ", tag %d", fp->root);
    if (off < n)
        snprintf(buf + off, n - off, ")");
    return buf;
}

// ----------------------------------------------------------------------- the group

// Freed work handles are kept for reuse, so that a training step that issues the same
// async operations every step allocates nothing. The pool outlives the group while
// handles are alive (they stay valid after dt_pg_free).
struct work_pool {
    pthread_mutex_t mu;
    struct dt_work *free; // guarded by mu
    atomic_int      refs; // the group + every live handle
};

struct dt_work {
    pthread_mutex_t mu;
    pthread_cond_t  cv;
    bool            done;   // guarded by mu
    atomic_bool     done_a; // same, readable without the lock (dt_work_test)
    dt_status       status; // valid once done
    char            msg[MSG_LEN];
    dt_op           op;
    atomic_int      refs; // the caller's handle + the queue's
    dt_pg          *pg;   // valid while not done
    dt_pg          *grp;  // the group it belongs to (the lane is grp->root's)
    struct dt_work *next; // queue link (pg->mu), or free-list link (pool->mu)
    work_pool      *pool;
};

int dt_pg_rank(const dt_pg *pg) {
    return pg ? pg->rank : -1;
}
int dt_pg_size(const dt_pg *pg) {
    return pg ? pg->world : 0;
}
int dt_pg_local_rank(const dt_pg *pg) {
    return pg ? pg->local_rank : -1;
}
int dt_pg_local_size(const dt_pg *pg) {
    return pg ? pg->local_world : 0;
}
const char *dt_pg_backend(const dt_pg *pg) {
    if (pg && pg->hybrid)
        return "hybrid";
    return pg && pg->be ? pg->be->name : "none";
}
dt_store *dt_pg_store(dt_pg *pg) {
    return pg ? pg->store : NULL;
}
bool dt_pg_all_local(const dt_pg *pg) {
    return pg->all_local;
}
const char *dt_pg_host_id(const dt_pg *pg, int rank) {
    return rank >= 0 && rank < pg->world ? pg->host_ids[rank] : "";
}
int64_t dt_pg_timeout_ms(const dt_pg *pg) {
    return pg->timeout_ms;
}
const char *dt_pg_token(const dt_pg *pg) {
    return pg->root->token;
}
// Poison, abort fd, progress and the operation in flight are the process's (the
// world group's), whichever group asks: see pg_impl.h.
bool dt_pg_aborted(const dt_pg *pg) {
    return atomic_load(&pg->root->poisoned);
}
int dt_pg_abort_fd(const dt_pg *pg) {
    return pg->root->abort_fd;
}

void dt_pg_progress(dt_pg *pg) {
    atomic_fetch_add_explicit(&pg->root->progress, 1, memory_order_relaxed);
}
uint64_t dt_pg_progress_count(const dt_pg *pg) {
    return atomic_load_explicit(&pg->root->progress, memory_order_relaxed);
}
uint64_t dt_pg_current_op(const dt_pg *pg) {
    return atomic_load_explicit(&pg->root->cur_op, memory_order_relaxed);
}
bool dt_pg_reports_progress(const dt_pg *pg) {
    return pg->be && pg->be->reports_progress;
}

dt_pg_opts dt_pg_opts_default(void) {
    return (dt_pg_opts){0};
}

// Records the process's first failure (later ones are consequences) and wakes waiters.
// Every group of the process shares it (pg_impl.h).
static void poison(dt_pg *pg, dt_status st, const char *msg) {
    pg = pg->root;
    pthread_mutex_lock(&pg->mu);
    if (!atomic_load(&pg->poisoned)) {
        pg->poison_st = st;
        snprintf(pg->poison_msg, sizeof pg->poison_msg, "%s", msg);
        atomic_store(&pg->poisoned, true);
        uint64_t one = 1;
        ssize_t  w   = write(pg->abort_fd, &one, sizeof one);
        (void)w;
    }
    pthread_mutex_unlock(&pg->mu);
}

void dt_pg_fail(dt_pg *pg, dt_status st, const char *fmt, ...) {
    char    msg[MSG_LEN];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    poison(pg, st, msg);
}

// ------------------------------------------------------------------- op error helpers

dt_status dt_op_fail(const dt_op *op, dt_status st, const char *fmt, ...) {
    char    msg[MSG_LEN];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return dt_fail(st, "%s: %s", op->name, msg);
}

dt_status dt_op_fail_peer(const dt_op *op, int peer, const char *what) {
    return dt_fail(DT_ERR_PEER, "%s: rank %d %s", op->name, peer, what);
}

dt_status dt_op_fail_mismatch(const dt_op *op, int peer, const dt_fingerprint *theirs) {
    char a[160], b[160];
    return dt_fail(DT_ERR_MISMATCH,
                   "%s: rank %d called %s but this rank called %s; every rank must issue the "
                   "same collectives in the same order with the same arguments",
                   op->name, peer, dt_fp_format(theirs, a, sizeof a),
                   dt_fp_format(&op->fp, b, sizeof b));
}

dt_status dt_op_fail_timeout(const dt_op *op, const char *waiting_for) {
    return dt_fail(DT_ERR_TIMEOUT,
                   "%s: timed out waiting for %s (deadline set by the group "
                   "timeout; DT_TIMEOUT_MS or dt_pg_opts.timeout_ms)",
                   op->name, waiting_for);
}

int dt_op_poll_ms(const dt_op *op, int cap_ms) {
    int ms = op->deadline_ns == UINT64_MAX ? -1 : dt_ms_left(op->deadline_ns);
    if (cap_ms >= 0 && (ms < 0 || ms > cap_ms))
        ms = cap_ms;
    return ms;
}

// ------------------------------------------------------------------------ execution

// World size 1: every collective is a copy (or nothing).
static void run_local(const dt_op *op) {
    size_t nbytes = op->count * dt_dtype_size(op->dtype);
    switch (op->kind) {
    case DT_COLL_ALL_REDUCE:
    case DT_COLL_REDUCE:
    case DT_COLL_ALL_GATHER:
    case DT_COLL_REDUCE_SCATTER:
    case DT_COLL_GATHER:
    case DT_COLL_SCATTER:
    case DT_COLL_ALL_TO_ALL:
        if (nbytes && op->src != op->dst)
            memcpy(op->dst, op->src, nbytes);
        break;
    default:
        break;
    }
}

typedef dt_status (*slot_fn)(void *ctx, const dt_op *op);

static slot_fn backend_slot(const dt_backend_ops *be, dt_coll kind) {
    switch (kind) {
    case DT_COLL_ALL_REDUCE:
        return be->all_reduce;
    case DT_COLL_BROADCAST:
        return be->broadcast;
    case DT_COLL_REDUCE:
        return be->reduce;
    case DT_COLL_ALL_GATHER:
        return be->all_gather;
    case DT_COLL_REDUCE_SCATTER:
        return be->reduce_scatter;
    case DT_COLL_GATHER:
        return be->gather;
    case DT_COLL_SCATTER:
        return be->scatter;
    case DT_COLL_ALL_TO_ALL:
        return be->all_to_all;
    case DT_COLL_BARRIER:
    case DT_COLL_INIT:
        return be->barrier;
    case DT_COLL_SEND:
        return be->send;
    case DT_COLL_RECV:
        return be->recv;
    default:
        return NULL;
    }
}

// Tells the backend about a failure once (it informs the peers). Caller is busy.
static void tell_backend(dt_pg *pg) {
    if (pg->be_told || !pg->be || !pg->be->abort || !pg->be_ctx)
        return;
    pg->be_told = true;
    dt_status st;
    char      msg[MSG_LEN];
    dt_pg    *r = pg->root;
    pthread_mutex_lock(&r->mu);
    st = r->poison_st;
    snprintf(msg, sizeof msg, "%s", r->poison_msg);
    pthread_mutex_unlock(&r->mu);
    pg->be->abort(pg->be_ctx, st, msg);
}

void dt_pg_tell_backends(dt_pg *pg) {
    dt_pg *r = pg->root;
    tell_backend(pg);
    tell_backend(r);
    pthread_mutex_lock(&r->mu);
    dt_pg *g = r->next_group;
    pthread_mutex_unlock(&r->mu);
    // The list only changes on the lane (group creation and free take it), which the
    // caller holds.
    for (; g; g = g->next_group)
        tell_backend(g);
}

// A sub-group sharing the world's transport: the generic algorithms run in group
// ranks, the transfers go to the world ranks.
dt_status dt_pg_group_xfer_post(void *ctx, const dt_op *op, dt_xfer *x) {
    dt_pg *g = ctx;
    x->peer  = g->world_ranks[x->peer];
    return g->root->be->xfer_post(g->root->be_ctx, op, x);
}
dt_status dt_pg_group_xfer_wait(void *ctx, const dt_op *op, dt_xfer *x) {
    dt_pg *g = ctx;
    return g->root->be->xfer_wait(g->root->be_ctx, op, x);
}

// Runs one operation; only one runs at a time (pg->busy). Message in `msg`.
dt_status dt_pg_exec(dt_pg *pg, const dt_op *op, char msg[MSG_LEN]) {
    msg[0]   = '\0';
    dt_pg *R = pg->root;
    if (atomic_load(&R->poisoned)) {
        dt_pg_tell_backends(pg);
        pthread_mutex_lock(&R->mu);
        dt_status st = R->poison_st;
        snprintf(msg, MSG_LEN, "%s", R->poison_msg);
        pthread_mutex_unlock(&R->mu);
        return st;
    }
    dt_status st = DT_OK;
    DT_TRACE_BEGIN(tr);
    if (pg->world == 1) {
        run_local(op);
    } else {
        dt_clear_error();
        slot_fn fn = backend_slot(pg->be, op->kind);
        atomic_store_explicit(&R->cur_op, op->fp.seq << 8 | ((uint64_t)op->kind + 1),
                              memory_order_relaxed);
        if (dt_hybrid_takes(pg, op))
            st = dt_hybrid_all_reduce(pg, op);
        else if (pg->shared)
            st = dt_algo_run(&pg->xlate, pg, &pg->algo, pg->rank, pg->world, op);
        else if (fn)
            st = fn(pg->be_ctx, op);
        else if (pg->be->xfer_post && pg->be->xfer_wait)
            st = dt_algo_run(pg->be, pg->be_ctx, &pg->algo, pg->rank, pg->world, op);
        else
            st = dt_op_fail(op, DT_ERR_UNSUPPORTED, "backend %s cannot run %s", pg->be->name,
                            dt_coll_name(op->kind));
        atomic_store_explicit(&R->cur_op, 0, memory_order_relaxed);
        if (st != DT_OK) {
            if (st == DT_ERR_STATE && atomic_load(&R->poisoned)) {
                // Aborted from another thread while running: report that reason.
                pthread_mutex_lock(&R->mu);
                st = R->poison_st;
                snprintf(msg, MSG_LEN, "%s", R->poison_msg);
                pthread_mutex_unlock(&R->mu);
            } else {
                size_t off = (size_t)snprintf(msg, MSG_LEN, "%s",
                                              dt_last_error()[0] ? dt_last_error() : "failed");
                if (pg != R && off < MSG_LEN)
                    dt_pg_group_describe(pg, msg + off, MSG_LEN - off);
                poison(pg, st, msg);
            }
            dt_pg_tell_backends(pg);
            return st;
        }
    }
    DT_TRACE_END(tr, "comm", dt_coll_name(op->kind), "count", op->count);
    if (op->fp.op == DT_REDUCE_AVG && op->dst) {
        size_t n = op->kind == DT_COLL_REDUCE && pg->rank != op->root ? 0 : op->count;
        dt_reduce_div(op->dtype, op->dst, n, pg->world);
    }
    return DT_OK;
}

static void pool_unref(work_pool *p) {
    if (atomic_fetch_sub(&p->refs, 1) != 1)
        return;
    for (dt_work *w = p->free; w;) {
        dt_work *next = w->next;
        pthread_mutex_destroy(&w->mu);
        pthread_cond_destroy(&w->cv);
        dt_free(w);
        w = next;
    }
    pthread_mutex_destroy(&p->mu);
    dt_free(p);
}

static dt_work *work_get(work_pool *p) {
    pthread_mutex_lock(&p->mu);
    dt_work *w = p->free;
    if (w)
        p->free = w->next;
    pthread_mutex_unlock(&p->mu);
    if (!w) {
        w = dt_alloc_zero(sizeof *w);
        if (!w)
            return NULL;
        pthread_mutex_init(&w->mu, NULL);
        pthread_cond_init(&w->cv, NULL);
    }
    w->done   = false;
    w->status = DT_OK;
    w->msg[0] = '\0';
    w->next   = NULL;
    w->pool   = p;
    atomic_init(&w->refs, 2);
    atomic_init(&w->done_a, false);
    atomic_fetch_add(&p->refs, 1);
    return w;
}

static void work_release(dt_work *w) {
    if (atomic_fetch_sub(&w->refs, 1) != 1)
        return;
    work_pool *p = w->pool;
    pthread_mutex_lock(&p->mu);
    w->next = p->free;
    p->free = w;
    pthread_mutex_unlock(&p->mu);
    pool_unref(p);
}

static void work_run(dt_pg *pg, dt_work *w) {
    char      msg[MSG_LEN];
    dt_status st = dt_pg_exec(pg, &w->op, msg);
    pthread_mutex_lock(&w->mu);
    w->status = st;
    memcpy(w->msg, msg, sizeof msg);
    w->done = true;
    w->pg   = NULL;
    atomic_store(&w->done_a, true);
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

// After the caller's thread ran an operation itself: the progress thread waits only for
// queued work or a stop, so it is woken only then. Waking it for nothing made every
// small blocking call pay for a thread that then competed with the peer ranks for the
// cores (a 4 KiB all_reduce on shm: 34 us with the wake-up, 0.5 us without).
// Called with pg->mu held.
static void wake_progress_if_needed(dt_pg *pg) {
    if (pg->head || pg->stop)
        pthread_cond_broadcast(&pg->cv);
}

static void *progress_main(void *arg) {
    dt_pg *pg = arg;
    pthread_setname_np(pthread_self(), "dt-progress"); // for top -H, gdb, and the tests
    pthread_mutex_lock(&pg->mu);
    for (;;) {
        while (!(pg->head && !pg->busy) && !(pg->stop && !pg->head))
            pthread_cond_wait(&pg->cv, &pg->mu);
        if (!pg->head)
            break; // stop requested and the queue is drained
        dt_work *w = pg->head;
        pg->head   = w->next;
        if (!pg->head)
            pg->tail = NULL;
        pg->busy = true;
        pthread_mutex_unlock(&pg->mu);
        dt_pg *g = w->grp;
        work_run(g, w);
        work_release(w);
        pthread_mutex_lock(&pg->mu);
        g->pending--;
        pg->busy = false;
        pthread_cond_broadcast(&pg->cv);
    }
    pthread_mutex_unlock(&pg->mu);
    return NULL;
}

// ------------------------------------------------------------------------- the lane

dt_status dt_pg_lane_take(dt_pg *L, uint64_t deadline_ns, const char *what) {
    pthread_mutex_lock(&L->mu);
    while ((L->busy || L->head) && !L->stop) {
        int ms = deadline_ns == UINT64_MAX ? 1000 : dt_ms_left(deadline_ns);
        if (ms <= 0) {
            pthread_mutex_unlock(&L->mu);
            return dt_fail(DT_ERR_TIMEOUT,
                           "%s: timed out waiting for this rank's earlier operations to finish",
                           what);
        }
        if (ms > 1000)
            ms = 1000;
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_sec += ms / 1000;
        ts.tv_nsec += (long)(ms % 1000) * 1000000L;
        if (ts.tv_nsec >= 1000000000L)
            ts.tv_sec++, ts.tv_nsec -= 1000000000L;
        pthread_cond_timedwait(&L->cv, &L->mu, &ts);
    }
    if (L->stop) {
        pthread_mutex_unlock(&L->mu);
        return dt_fail(DT_ERR_STATE, "%s: the world group is being freed", what);
    }
    L->busy = true;
    pthread_mutex_unlock(&L->mu);
    return DT_OK;
}

void dt_pg_lane_give(dt_pg *L) {
    pthread_mutex_lock(&L->mu);
    L->busy = false;
    pthread_cond_broadcast(&L->cv);
    pthread_mutex_unlock(&L->mu);
}

// --------------------------------------------------------------------- submission

static dt_status check_pg(const dt_pg *pg, const char *what) {
    if (!pg)
        return dt_fail(DT_ERR_ARG, "%s: the group is NULL", what);
    return DT_OK;
}

static bool overlaps(const void *a, size_t an, const void *b, size_t bn) {
    if (!an || !bn || !a || !b)
        return false;
    const char *x = a, *y = b;
    return x < y + bn && y < x + an;
}

// Checks arguments before anything is queued: errors here leave the group usable.
static dt_status validate(const dt_pg *pg, const dt_op *op) {
    const char *name = dt_coll_name(op->kind);
    if ((unsigned)op->dtype >= DT_DTYPE_COUNT_)
        return dt_fail(DT_ERR_ARG, "%s: expected a dtype in [0, %d), found %d", name,
                       DT_DTYPE_COUNT_, (int)op->dtype);
    if (has_op(op->kind)) {
        if ((unsigned)op->fp.op >= DT_REDUCE_COUNT_)
            return dt_fail(DT_ERR_ARG, "%s: expected a reduce op in [0, %d), found %d", name,
                           DT_REDUCE_COUNT_, (int)op->fp.op);
        if (op->fp.op == DT_REDUCE_AVG && op->dtype != DT_FLOAT32)
            return dt_fail(DT_ERR_ARG, "%s: avg needs a floating-point dtype, found %s", name,
                           dt_dtype_name(op->dtype));
    }
    int world = pg->world, rank = pg->rank;
    if (has_root(op->kind) && (op->root < 0 || op->root >= world))
        return dt_fail(DT_ERR_ARG, "%s: expected a root in [0, %d), found %d", name, world,
                       op->root);
    if (is_p2p(op->kind)) {
        if (op->peer < 0 || op->peer >= world)
            return dt_fail(DT_ERR_ARG, "%s: expected a peer rank in [0, %d), found %d", name, world,
                           op->peer);
        if (op->peer == rank)
            return dt_fail(DT_ERR_ARG, "%s: peer %d is this rank; a rank cannot %s itself", name,
                           op->peer, op->kind == DT_COLL_SEND ? "send to" : "receive from");
    }
    size_t esz = dt_dtype_size(op->dtype), one, all;
    if (!dt_size_mul(&one, op->count, esz) || !dt_size_mul(&all, one, (size_t)world))
        return dt_fail(DT_ERR_ARG, "%s: count %zu of %s overflows the address space", name,
                       op->count, dt_dtype_name(op->dtype));
    bool        is_root = has_root(op->kind) && rank == op->root;
    size_t      src_n = 0, dst_n = 0;
    const char *shape = "";
    switch (op->kind) {
    case DT_COLL_ALL_REDUCE:
        src_n = dst_n = one;
        break;
    case DT_COLL_BROADCAST:
        dst_n = one;
        break;
    case DT_COLL_REDUCE:
        src_n = one, dst_n = is_root ? one : 0;
        break;
    case DT_COLL_ALL_GATHER:
        src_n = one, dst_n = all, shape = "dst + rank * count";
        break;
    case DT_COLL_REDUCE_SCATTER:
        src_n = all, dst_n = one, shape = "src + rank * count";
        break;
    case DT_COLL_GATHER:
        src_n = one, dst_n = is_root ? all : 0, shape = "dst + rank * count";
        break;
    case DT_COLL_SCATTER:
        src_n = is_root ? all : 0, dst_n = one, shape = "src + rank * count";
        break;
    case DT_COLL_ALL_TO_ALL:
        src_n = dst_n = all;
        break;
    case DT_COLL_SEND:
        src_n = one;
        break;
    case DT_COLL_RECV:
        dst_n = one;
        break;
    default:
        break;
    }
    if (src_n && !op->src)
        return dt_fail(DT_ERR_ARG, "%s: src is NULL but %zu bytes are to be read", name, src_n);
    if (dst_n && !op->dst)
        return dt_fail(DT_ERR_ARG, "%s: dst is NULL but %zu bytes are to be written", name, dst_n);
    if (src_n && dst_n && overlaps(op->src, src_n, op->dst, dst_n)) {
        bool        ok = false;
        const char *s = op->src, *d = op->dst;
        switch (op->kind) {
        case DT_COLL_ALL_REDUCE:
        case DT_COLL_REDUCE:
            ok = s == d;
            break;
        case DT_COLL_ALL_GATHER:
        case DT_COLL_GATHER:
            ok = s == d + (size_t)rank * one;
            break;
        case DT_COLL_REDUCE_SCATTER:
        case DT_COLL_SCATTER:
            ok = d == s + (size_t)rank * one;
            break;
        default:
            break;
        }
        if (!ok)
            return dt_fail(
                DT_ERR_ARG, "%s: src and dst overlap; expected them disjoint or %s", name,
                shape[0] ? shape : (op->kind == DT_COLL_ALL_TO_ALL ? "disjoint" : "equal"));
    }
    return DT_OK;
}

static void op_set_name(dt_op *op) {
    uint64_t seq = DT_FP_SEQ(&op->fp);
    int      off;
    if (op->kind == DT_COLL_SEND)
        off = snprintf(op->name, sizeof op->name, "send #%" PRIu64 " to rank %d", seq, op->peer);
    else if (op->kind == DT_COLL_RECV)
        off = snprintf(op->name, sizeof op->name, "recv #%" PRIu64 " from rank %d", seq, op->peer);
    else
        off = snprintf(op->name, sizeof op->name, "%s #%" PRIu64, dt_coll_name(op->kind), seq);
    if (DT_FP_GROUP(&op->fp) && off > 0 && (size_t)off < sizeof op->name)
        snprintf(op->name + off, sizeof op->name - (size_t)off, " on group %u",
                 DT_FP_GROUP(&op->fp));
}

// Fills in what depends on the group's order: sequence numbers and the deadline.
// Caller holds pg->mu.
static void op_stamp(dt_pg *pg, dt_op *op);

void dt_pg_stamp(dt_pg *pg, dt_op *op) {
    pthread_mutex_lock(&pg->root->mu);
    op_stamp(pg, op);
    pthread_mutex_unlock(&pg->root->mu);
}

static void op_stamp(dt_pg *pg, dt_op *op) {
    if (op->kind == DT_COLL_SEND)
        op->fp.seq = ++pg->send_seq[op->peer];
    else if (op->kind == DT_COLL_RECV)
        op->fp.seq = ++pg->recv_seq[op->peer];
    else if (op->kind != DT_COLL_INIT)
        op->fp.seq = ++pg->seq;
    op->fp.seq |= (uint64_t)pg->gid << DT_FP_GROUP_SHIFT;
    op_set_name(op);
    op->deadline_ns = pg->timeout_ms < 0 ? UINT64_MAX : dt_deadline_ns(pg->timeout_ms);
}

dt_status dt_pg_submit(dt_pg *pg, dt_op *op, dt_work **out) {
    if (out)
        *out = NULL;
    DT_TRY(check_pg(pg, dt_coll_name(op->kind)));
    dt_pg *L     = pg->root; // the lane
    op->fp.coll  = (uint8_t)op->kind;
    op->fp.dtype = (uint8_t)op->dtype;
    op->fp.count = op->count;
    op->fp.root  = is_p2p(op->kind) ? op->tag : (has_root(op->kind) ? op->root : -1);
    if (!has_op(op->kind))
        op->fp.op = 0;
    DT_TRY(validate(pg, op));
    op->op = op->fp.op == DT_REDUCE_AVG ? DT_REDUCE_SUM : (dt_reduce_op)op->fp.op;
    if (!has_op(op->kind))
        op->op = DT_REDUCE_SUM;

    pthread_mutex_lock(&L->mu);
    if (L->stop) {
        pthread_mutex_unlock(&L->mu);
        return dt_fail(DT_ERR_STATE, "%s: the group is being freed", dt_coll_name(op->kind));
    }
    op_stamp(pg, op);
    pg->pending++;
    if (!out && !L->busy && !L->head) {
        // Idle group and a blocking call: run it on this thread, which saves two thread
        // hand-offs. L->busy keeps the progress thread out meanwhile.
        L->busy = true;
        pthread_mutex_unlock(&L->mu);
        char      msg[MSG_LEN];
        dt_status st = dt_pg_exec(pg, op, msg);
        pthread_mutex_lock(&L->mu);
        L->busy = false;
        pg->pending--;
        if (pg != L)
            pthread_cond_broadcast(&L->cv); // dt_pg_free of the group may wait for it
        else
            wake_progress_if_needed(L);
        pthread_mutex_unlock(&L->mu);
        if (st != DT_OK)
            dt_fail(st, "%s", msg);
        return st;
    }
    dt_work *w = work_get(L->pool);
    if (!w) {
        pg->pending--;
        pthread_mutex_unlock(&L->mu);
        return dt_fail_context("%s", op->name);
    }
    w->op  = *op;
    w->pg  = pg;
    w->grp = pg;
    if (L->tail)
        L->tail->next = w;
    else
        L->head = w;
    L->tail = w;
    pthread_cond_broadcast(&L->cv);
    pthread_mutex_unlock(&L->mu);
    if (out) {
        *out = w;
        return DT_OK;
    }
    dt_status st = dt_work_wait(w);
    char      msg[MSG_LEN];
    snprintf(msg, sizeof msg, "%s", w->msg);
    dt_work_free(w);
    if (st != DT_OK)
        dt_fail(st, "%s", msg);
    return st;
}

// ---------------------------------------------------------------------- work handles

dt_status dt_work_wait(dt_work *w) {
    if (!w)
        return dt_fail(DT_ERR_ARG, "dt_work_wait: the handle is NULL");
    pthread_mutex_lock(&w->mu);
    if (!w->done && w->op.deadline_ns != UINT64_MAX) {
        uint64_t limit = w->op.deadline_ns + (uint64_t)WAIT_GRACE_MS * 1000000ull;
        while (!w->done && dt_now_ns() < limit) {
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            int ms = dt_ms_left(limit);
            if (ms > 1000)
                ms = 1000;
            ts.tv_sec += ms / 1000;
            ts.tv_nsec += (long)(ms % 1000) * 1000000L;
            if (ts.tv_nsec >= 1000000000L) {
                ts.tv_sec++;
                ts.tv_nsec -= 1000000000L;
            }
            pthread_cond_timedwait(&w->cv, &w->mu, &ts);
        }
        if (!w->done) {
            // The backend missed its deadline: abort the group so it returns, then wait
            // for it (the buffers are borrowed until it does).
            dt_pg *pg = w->pg;
            char   reason[160];
            snprintf(reason, sizeof reason, "%s did not finish %d ms after its deadline",
                     w->op.name, WAIT_GRACE_MS);
            pthread_mutex_unlock(&w->mu);
            dt_pg_abort(pg, reason);
            pthread_mutex_lock(&w->mu);
        }
    }
    while (!w->done)
        pthread_cond_wait(&w->cv, &w->mu);
    dt_status st = w->status;
    char      msg[MSG_LEN];
    memcpy(msg, w->msg, sizeof msg);
    pthread_mutex_unlock(&w->mu);
    if (st != DT_OK)
        dt_fail(st, "%s", msg);
    return st;
}

bool dt_work_test(dt_work *w) {
    return w && atomic_load(&w->done_a);
}

void dt_work_free(dt_work *w) {
    if (!w)
        return;
    if (!atomic_load(&w->done_a)) {
        dt_status st = dt_last_status();
        char      msg[MSG_LEN];
        snprintf(msg, sizeof msg, "%s", dt_last_error());
        dt_work_wait(w);
        dt_fail(st, "%s", msg); // freeing does not change the caller's last error
    }
    work_release(w);
}

// ------------------------------------------------------------------------ the API

#define OP_INIT(k)                                                                                 \
    (dt_op) {                                                                                      \
        .kind = (k), .root = -1, .peer = -1                                                        \
    }

dt_status dt_pg_all_reduce_async(dt_pg *pg, const void *src, void *dst, size_t count,
                                 dt_dtype dtype, dt_reduce_op op, dt_work **out) {
    dt_op o = OP_INIT(DT_COLL_ALL_REDUCE);
    o.src = src, o.dst = dst, o.count = count, o.dtype = dtype, o.fp.op = (uint8_t)op;
    if ((unsigned)op >= DT_REDUCE_COUNT_)
        o.fp.op = 0xff;
    return dt_pg_submit(pg, &o, out);
}

dt_status dt_pg_broadcast_async(dt_pg *pg, void *buf, size_t count, dt_dtype dtype, int root,
                                dt_work **out) {
    dt_op o = OP_INIT(DT_COLL_BROADCAST);
    o.dst = buf, o.count = count, o.dtype = dtype, o.root = root;
    return dt_pg_submit(pg, &o, out);
}

dt_status dt_pg_reduce_async(dt_pg *pg, const void *src, void *dst, size_t count, dt_dtype dtype,
                             dt_reduce_op op, int root, dt_work **out) {
    dt_op o = OP_INIT(DT_COLL_REDUCE);
    o.src = src, o.dst = dst, o.count = count, o.dtype = dtype, o.root = root;
    o.fp.op = (unsigned)op < DT_REDUCE_COUNT_ ? (uint8_t)op : 0xff;
    if (pg && root != pg->rank)
        o.dst = NULL; // not written on other ranks
    return dt_pg_submit(pg, &o, out);
}

dt_status dt_pg_all_gather_async(dt_pg *pg, const void *src, void *dst, size_t count_per_rank,
                                 dt_dtype dtype, dt_work **out) {
    dt_op o = OP_INIT(DT_COLL_ALL_GATHER);
    o.src = src, o.dst = dst, o.count = count_per_rank, o.dtype = dtype;
    return dt_pg_submit(pg, &o, out);
}

dt_status dt_pg_reduce_scatter_async(dt_pg *pg, const void *src, void *dst, size_t count_per_rank,
                                     dt_dtype dtype, dt_reduce_op op, dt_work **out) {
    dt_op o = OP_INIT(DT_COLL_REDUCE_SCATTER);
    o.src = src, o.dst = dst, o.count = count_per_rank, o.dtype = dtype;
    o.fp.op = (unsigned)op < DT_REDUCE_COUNT_ ? (uint8_t)op : 0xff;
    return dt_pg_submit(pg, &o, out);
}

dt_status dt_pg_gather_async(dt_pg *pg, const void *src, void *dst, size_t count_per_rank,
                             dt_dtype dtype, int root, dt_work **out) {
    dt_op o = OP_INIT(DT_COLL_GATHER);
    o.src = src, o.dst = dst, o.count = count_per_rank, o.dtype = dtype, o.root = root;
    if (pg && root != pg->rank)
        o.dst = NULL;
    return dt_pg_submit(pg, &o, out);
}

dt_status dt_pg_scatter_async(dt_pg *pg, const void *src, void *dst, size_t count_per_rank,
                              dt_dtype dtype, int root, dt_work **out) {
    dt_op o = OP_INIT(DT_COLL_SCATTER);
    o.src = src, o.dst = dst, o.count = count_per_rank, o.dtype = dtype, o.root = root;
    if (pg && root != pg->rank)
        o.src = NULL;
    return dt_pg_submit(pg, &o, out);
}

dt_status dt_pg_all_to_all_async(dt_pg *pg, const void *src, void *dst, size_t count_per_rank,
                                 dt_dtype dtype, dt_work **out) {
    dt_op o = OP_INIT(DT_COLL_ALL_TO_ALL);
    o.src = src, o.dst = dst, o.count = count_per_rank, o.dtype = dtype;
    return dt_pg_submit(pg, &o, out);
}

dt_status dt_pg_barrier_async(dt_pg *pg, dt_work **out) {
    dt_op o = OP_INIT(DT_COLL_BARRIER);
    return dt_pg_submit(pg, &o, out);
}

dt_status dt_pg_send_async(dt_pg *pg, const void *buf, size_t count, dt_dtype dtype, int peer,
                           int tag, dt_work **out) {
    dt_op o = OP_INIT(DT_COLL_SEND);
    o.src = buf, o.count = count, o.dtype = dtype, o.peer = peer, o.tag = tag;
    return dt_pg_submit(pg, &o, out);
}

dt_status dt_pg_recv_async(dt_pg *pg, void *buf, size_t count, dt_dtype dtype, int peer, int tag,
                           dt_work **out) {
    dt_op o = OP_INIT(DT_COLL_RECV);
    o.dst = buf, o.count = count, o.dtype = dtype, o.peer = peer, o.tag = tag;
    return dt_pg_submit(pg, &o, out);
}

dt_status dt_pg_all_reduce(dt_pg *pg, const void *src, void *dst, size_t count, dt_dtype dtype,
                           dt_reduce_op op) {
    return dt_pg_all_reduce_async(pg, src, dst, count, dtype, op, NULL);
}
dt_status dt_pg_broadcast(dt_pg *pg, void *buf, size_t count, dt_dtype dtype, int root) {
    return dt_pg_broadcast_async(pg, buf, count, dtype, root, NULL);
}
dt_status dt_pg_reduce(dt_pg *pg, const void *src, void *dst, size_t count, dt_dtype dtype,
                       dt_reduce_op op, int root) {
    return dt_pg_reduce_async(pg, src, dst, count, dtype, op, root, NULL);
}
dt_status dt_pg_all_gather(dt_pg *pg, const void *src, void *dst, size_t count_per_rank,
                           dt_dtype dtype) {
    return dt_pg_all_gather_async(pg, src, dst, count_per_rank, dtype, NULL);
}
dt_status dt_pg_reduce_scatter(dt_pg *pg, const void *src, void *dst, size_t count_per_rank,
                               dt_dtype dtype, dt_reduce_op op) {
    return dt_pg_reduce_scatter_async(pg, src, dst, count_per_rank, dtype, op, NULL);
}
dt_status dt_pg_gather(dt_pg *pg, const void *src, void *dst, size_t count_per_rank, dt_dtype dtype,
                       int root) {
    return dt_pg_gather_async(pg, src, dst, count_per_rank, dtype, root, NULL);
}
dt_status dt_pg_scatter(dt_pg *pg, const void *src, void *dst, size_t count_per_rank,
                        dt_dtype dtype, int root) {
    return dt_pg_scatter_async(pg, src, dst, count_per_rank, dtype, root, NULL);
}
dt_status dt_pg_all_to_all(dt_pg *pg, const void *src, void *dst, size_t count_per_rank,
                           dt_dtype dtype) {
    return dt_pg_all_to_all_async(pg, src, dst, count_per_rank, dtype, NULL);
}
dt_status dt_pg_barrier(dt_pg *pg) {
    return dt_pg_barrier_async(pg, NULL);
}
dt_status dt_pg_send(dt_pg *pg, const void *buf, size_t count, dt_dtype dtype, int peer, int tag) {
    return dt_pg_send_async(pg, buf, count, dtype, peer, tag, NULL);
}
dt_status dt_pg_recv(dt_pg *pg, void *buf, size_t count, dt_dtype dtype, int peer, int tag) {
    return dt_pg_recv_async(pg, buf, count, dtype, peer, tag, NULL);
}

void dt_pg_abort(dt_pg *pg, const char *reason) {
    if (!pg)
        return;
    char msg[MSG_LEN];
    snprintf(msg, sizeof msg, "the group was aborted: %s", reason ? reason : "no reason given");
    poison(pg, DT_ERR_STATE, msg);
    // If nothing runs, tell the backends (and so the peers) now; a running operation
    // sees the abort fd and does it itself. The abort stops every group of the
    // process: they share one lane and, on tcp, one set of connections.
    dt_pg *L = pg->root;
    pthread_mutex_lock(&L->mu);
    if (L->busy) {
        pthread_mutex_unlock(&L->mu);
        return;
    }
    L->busy = true;
    pthread_mutex_unlock(&L->mu);
    dt_pg_tell_backends(pg);
    pthread_mutex_lock(&L->mu);
    L->busy = false;
    wake_progress_if_needed(L);
    pthread_mutex_unlock(&L->mu);
}

// ------------------------------------------------------------------ init and free

static void host_identity(char *buf, size_t n) {
    const char *o = dt_setting_str("DT_HOST_ID"); // tests: pretend ranks are on other hosts
    if (o && *o) {
        snprintf(buf, n, "%s", o);
        return;
    }
    char host[160] = "unknown", boot[64] = "";
    gethostname(host, sizeof host - 1);
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
    if (f) {
        if (fgets(boot, sizeof boot, f))
            boot[strcspn(boot, "\n")] = '\0';
        fclose(f);
    }
    snprintf(buf, n, "%s/%s", host, boot);
}

// Waits for keys while watching "dt/abort" (set by a rank that found a problem, so the
// others fail at once instead of at the timeout).
static dt_status rendezvous_wait(dt_pg *pg, const char *const *keys, size_t nkeys,
                                 uint64_t deadline) {
    for (;;) {
        int64_t slice = 200;
        int     left  = dt_ms_left(deadline);
        if (deadline != UINT64_MAX && left < slice)
            slice = left > 0 ? left : 1;
        dt_status st = dt_store_wait(pg->store, keys, nkeys, slice);
        if (st == DT_OK)
            return DT_OK;
        if (st != DT_ERR_TIMEOUT)
            return st;
        const char *ak[1] = {"dt/abort"};
        bool        have  = false;
        DT_TRY(dt_store_check(pg->store, ak, 1, &have));
        if (have) {
            void  *v = NULL;
            size_t n = 0;
            DT_TRY(dt_store_get(pg->store, "dt/abort", &v, &n));
            dt_fail(DT_ERR_MISMATCH, "init: %s", (char *)v);
            dt_free(v);
            return DT_ERR_MISMATCH;
        }
        if (dt_now_ns() >= deadline) {
            // Name the ranks that did not come.
            char   msg[600];
            size_t off     = 0;
            int    missing = 0;
            for (size_t i = 0; i < nkeys; i++) {
                bool        ok   = false;
                const char *k[1] = {keys[i]};
                dt_store_check(pg->store, k, 1, &ok);
                if (!ok && off < sizeof msg - 40) {
                    const char *r = strrchr(keys[i], '/');
                    off += (size_t)snprintf(msg + off, sizeof msg - off, "%s%s",
                                            missing ? ", " : "", r ? r + 1 : keys[i]);
                    missing++;
                }
            }
            return dt_fail(DT_ERR_TIMEOUT,
                           "init: timed out after %lld ms waiting for rank%s %s to join (%d of "
                           "%d joined); are they started, with the same MASTER_ADDR, "
                           "MASTER_PORT and job token?",
                           (long long)pg->timeout_ms, missing > 1 ? "s" : "", msg,
                           pg->world - missing, pg->world);
        }
    }
}

static dt_status publish_abort(dt_pg *pg, const char *msg) {
    bool swapped;
    return dt_store_compare_set(pg->store, "dt/abort", NULL, 0, msg, strlen(msg), &swapped);
}

static dt_status rendezvous(dt_pg *pg, uint64_t deadline) {
    char key[64], me[300], hid[256];
    host_identity(hid, sizeof hid);
    // One process per rank: the first to claim a rank keeps it.
    snprintf(key, sizeof key, "dt/claim/%d", pg->rank);
    snprintf(me, sizeof me, "pid %d on %s", (int)getpid(), hid);
    bool swapped;
    DT_TRY(dt_store_compare_set(pg->store, key, NULL, 0, me, strlen(me), &swapped));
    if (!swapped) {
        void *v = NULL;
        DT_TRY(dt_store_get(pg->store, key, &v, NULL));
        dt_fail(DT_ERR_MISMATCH,
                "init: rank %d is already taken by %s (two processes with RANK=%d, or a "
                "store left from an earlier run?)",
                pg->rank, (char *)v, pg->rank);
        dt_free(v);
        return DT_ERR_MISMATCH;
    }
    // The first rank to arrive fixes the world size; the others compare.
    char w[32];
    snprintf(w, sizeof w, "%d", pg->world);
    DT_TRY(dt_store_compare_set(pg->store, "dt/world", NULL, 0, w, strlen(w), &swapped));
    if (!swapped) {
        void *v = NULL;
        DT_TRY(dt_store_get(pg->store, "dt/world", &v, NULL));
        if (strcmp(v, w) != 0) {
            char msg[300];
            snprintf(msg, sizeof msg,
                     "world size mismatch: rank %d has WORLD_SIZE=%d, but the ranks before it "
                     "have WORLD_SIZE=%s",
                     pg->rank, pg->world, (char *)v);
            dt_free(v);
            publish_abort(pg, msg);
            return dt_fail(DT_ERR_MISMATCH, "init: %s", msg);
        }
        dt_free(v);
    }
    snprintf(key, sizeof key, "dt/rank/%d", pg->rank);
    DT_TRY(dt_store_set(pg->store, key, hid, strlen(hid)));
    // Wait for everyone, then read the hosts.
    char        *kbuf = dt_alloc((size_t)pg->world * 32);
    const char **keys = dt_alloc((size_t)pg->world * sizeof *keys);
    if (!kbuf || !keys) {
        dt_free(kbuf);
        dt_free(keys);
        return DT_ERR_NOMEM;
    }
    for (int r = 0; r < pg->world; r++) {
        snprintf(kbuf + r * 32, 32, "dt/rank/%d", r);
        keys[r] = kbuf + r * 32;
    }
    dt_status st = rendezvous_wait(pg, keys, (size_t)pg->world, deadline);
    for (int r = 0; st == DT_OK && r < pg->world; r++) {
        void *v = NULL;
        st      = dt_store_get(pg->store, keys[r], &v, NULL);
        if (st == DT_OK)
            pg->host_ids[r] = v;
    }
    dt_free(kbuf);
    dt_free(keys);
    return st;
}

static dt_status choose_backend(dt_pg *pg, const char *want) {
    const dt_backend_ops *shm    = dt_backend_find("shm");
    bool                  shm_ok = shm && shm->built;
    if (!want || !*want || strcmp(want, "auto") == 0) {
        if (pg->all_local && shm_ok && (!shm->usable || shm->usable(pg)))
            pg->be = shm;
        else
            pg->be = &dt_backend_tcp;
        // Ranks on several hosts, more than one on a host: shm inside, tcp between.
        pg->hybrid = !pg->all_local && shm_ok && dt_hybrid_fits(pg, NULL, 0);
        if (pg->rank == 0)
            DT_INFO("comm", "backend auto: chose %s (%d ranks, %s%s)", dt_pg_backend(pg), pg->world,
                    pg->all_local ? "all on one host" : "on more than one host",
                    pg->store_via_mpi ? "; store address through MPI" : "");
        return DT_OK;
    }
    // "gloo" is what PyTorch scripts name their CPU backend (init_process_group(backend=
    // 'gloo')): the same role as tcp here (point-to-point sockets, any host), so it is
    // accepted as its alias and the group reports "tcp".
    if (strcmp(want, "gloo") == 0)
        want = "tcp";
    if (strcmp(want, "hybrid") == 0) {
        char why[160];
        if (!shm_ok)
            return dt_fail(DT_ERR_UNSUPPORTED, "init: backend hybrid needs shm, which is not "
                                               "built into this library");
        if (!dt_hybrid_fits(pg, why, sizeof why))
            return dt_fail(DT_ERR_UNSUPPORTED, "init: backend hybrid cannot serve this group: %s",
                           why);
        pg->be     = &dt_backend_tcp;
        pg->hybrid = true;
        return DT_OK;
    }
    const dt_backend_ops *be = dt_backend_find(want);
    if (!be)
        return dt_fail(DT_ERR_ARG,
                       "init: expected backend \"auto\", \"shm\", \"tcp\" (alias \"gloo\"), "
                       "\"hybrid\" or \"mpi\", found \"%s\"",
                       want);
    if (!be->built)
        return dt_fail(DT_ERR_UNSUPPORTED, "init: backend %s is not built into this library", want);
    if (be->usable && !be->usable(pg))
        return dt_fail(DT_ERR_UNSUPPORTED, "init: backend %s cannot serve this group (%s)", want,
                       pg->all_local ? "refused by the backend"
                                     : "the ranks are on more than one host");
    pg->be = be;
    return DT_OK;
}

// Parses "tcp://host:port" into host and port.
static dt_status parse_tcp_method(const char *m, char *host, size_t n, int *port) {
    const char *hp    = m + strlen("tcp://");
    const char *colon = strrchr(hp, ':');
    if (!colon || colon == hp || (size_t)(colon - hp) >= n)
        return dt_fail(DT_ERR_ARG, "init: expected \"tcp://host:port\", found \"%s\"", m);
    memcpy(host, hp, (size_t)(colon - hp));
    host[colon - hp] = '\0';
    long p;
    DT_TRY(dt_parse_long(colon + 1, 1, 65535, "init: the port of tcp://host:port", &p));
    *port = (int)p;
    return DT_OK;
}

void dt_pg_free(dt_pg *pg) {
    if (!pg)
        return;
    if (pg->root != pg) {
        dt_pg_group_free(pg);
        return;
    }
    if (pg->thread_started) {
        pthread_mutex_lock(&pg->mu);
        pg->stop = true;
        pthread_cond_broadcast(&pg->cv);
        pthread_mutex_unlock(&pg->mu);
        pthread_join(pg->thread, NULL);
    }
    dt_hybrid_free(pg);
    if (pg->next_group)
        DT_WARN("comm",
                "dt_pg_free: the world group is freed before its sub-groups (group %u "
                "is still alive); free sub-groups first",
                pg->next_group->gid);
    // Liveness first: its "bye" tells the peers this rank leaves on purpose.
    dt_live_free(pg->live);
    if (pg->be && pg->be_ctx)
        pg->be->free(pg->be_ctx);
    dt_algo_cfg_free(&pg->algo);
    dt_store_free(pg->be_store);
    dt_store_free(pg->store);
    if (pg->host_ids)
        for (int r = 0; r < pg->world; r++)
            dt_free(pg->host_ids[r]);
    dt_free(pg->host_ids);
    dt_free(pg->send_seq);
    dt_free(pg->recv_seq);
    dt_free(pg->token);
    if (pg->abort_fd >= 0)
        close(pg->abort_fd);
    if (pg->pool)
        pool_unref(pg->pool);
    pthread_mutex_destroy(&pg->mu);
    pthread_cond_destroy(&pg->cv);
    dt_free(pg);
}

// Creates the group; NULL with the error recorded (every failure path calls dt_fail).
static dt_pg *pg_create(const char *method, int rank, int world, const dt_pg_opts *opts) {
    dt_pg_opts o = opts ? *opts : dt_pg_opts_default();
    if (!method || !*method)
        method = "env://";
    bool          env      = strncmp(method, "env://", 6) == 0;
    bool          want_mpi = o.backend && strcmp(o.backend, "mpi") == 0;
    dt_launch_env le;
    if (dt_launch_env_read(&le) != DT_OK)
        return NULL;
    // The store's address goes through MPI when an MPI launcher started this process
    // and MASTER_ADDR / MASTER_PORT do not give it (docs/mpi.md).
    const char *maddr = getenv("MASTER_ADDR"), *mport = getenv("MASTER_PORT");
    // (A lone process asking for mpi is a one-rank MPI job: MPI's singleton.)
    bool mpi_store = env && (le.is_mpi || (want_mpi && le.launcher == DT_LAUNCHER_NONE)) &&
                     !(maddr && *maddr && mport && *mport);
    if (world < 0 && le.launcher == DT_LAUNCHER_NONE && !want_mpi) {
        dt_fail(DT_ERR_ARG, "init: environment variable WORLD_SIZE is not set (expected the "
                            "number of ranks, e.g. WORLD_SIZE=2, or a start by mpirun or srun)");
        return NULL;
    }
    if (world < 0)
        world = le.world;
    if (rank < 0 && le.launcher == DT_LAUNCHER_NONE && !want_mpi) {
        dt_fail(DT_ERR_ARG,
                "init: environment variable RANK is not set (expected this "
                "process's rank in [0, %d), e.g. RANK=0)",
                world);
        return NULL;
    }
    if (rank < 0)
        rank = le.rank;
    if (le.launcher != DT_LAUNCHER_NONE && world > 0 && rank >= world) {
        dt_fail(DT_ERR_ARG, "init: %s=%d is out of range: expected 0 <= rank < %d", le.rank_var,
                rank, world);
        return NULL;
    }
    int64_t timeout = o.timeout_ms;
    if (timeout == 0 && dt_default_timeout_ms(&timeout) != DT_OK)
        return NULL;
    uint64_t deadline = timeout < 0 ? UINT64_MAX : dt_deadline_ns(timeout);
    int64_t  hb_ms, live_ms; // checked before anything else is reached (liveness.c)
    if (dt_live_config(&hb_ms, &live_ms) != DT_OK)
        return NULL;

    // MPI: initialised only for the mpi backend or to hand out the store's address.
    dt_mpi_boot_res boot = {.rank = -1};
    if (want_mpi || mpi_store) {
        char hid[256];
        host_identity(hid, sizeof hid);
        long port = 0;
        if (mport && *mport &&
            dt_parse_long(mport, 0, 65535, "environment variable MASTER_PORT", &port) != DT_OK)
            return NULL;
        dt_mpi_boot_req req = {.env         = &le,
                               .need_store  = mpi_store,
                               .addr        = maddr && *maddr ? maddr : NULL,
                               .port        = (int)port,
                               .host_id     = hid,
                               .token       = dt_token_resolve(o.token),
                               .no_token    = o.token && !*o.token,
                               .timeout_ms  = timeout,
                               .deadline_ns = deadline};
        if (dt_backend_mpi_bootstrap(&req, &boot) != DT_OK) {
            dt_fail_context("init (%s)", want_mpi ? "backend mpi" : "store address through MPI");
            return NULL;
        }
        if (world < 0)
            world = boot.world;
        if (rank < 0)
            rank = boot.rank;
    }
    if (world < 1 || rank < 0 || rank >= world) {
        if (world < 1)
            dt_fail(DT_ERR_ARG, "init: expected a world size >= 1, found %d", world);
        else
            dt_fail(DT_ERR_ARG, "init: rank %d is out of range: expected 0 <= rank < %d", rank,
                    world);
        dt_store_free(boot.store);
        return NULL;
    }

    dt_pg *pg = dt_alloc_zero(sizeof *pg);
    if (!pg) {
        dt_store_free(boot.store);
        return NULL;
    }
    pg->rank       = rank;
    pg->world      = world;
    pg->root       = pg;
    pg->next_gid   = 1;
    pg->timeout_ms = timeout;
    pg->abort_fd   = -1;
    pthread_mutex_init(&pg->mu, NULL);
    pthread_cond_init(&pg->cv, NULL);
    atomic_init(&pg->poisoned, false);
    dt_log_set_rank(rank, world);
    pg->store         = boot.store;
    pg->store_via_mpi = boot.store != NULL;
    pg->abort_fd      = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    pg->pool          = dt_alloc_zero(sizeof *pg->pool);
    if (!pg->pool)
        goto fail;
    pthread_mutex_init(&pg->pool->mu, NULL);
    atomic_init(&pg->pool->refs, 1);
    pg->host_ids = dt_alloc_zero((size_t)world * sizeof *pg->host_ids);
    pg->send_seq = dt_alloc_zero((size_t)world * sizeof *pg->send_seq);
    pg->recv_seq = dt_alloc_zero((size_t)world * sizeof *pg->recv_seq);
    if (pg->abort_fd < 0) {
        dt_fail_errno(DT_ERR_IO, "init: eventfd");
        goto fail;
    }
    if (!pg->host_ids || !pg->send_seq || !pg->recv_seq)
        goto fail;
    const char *tok = boot.store ? (boot.token[0] ? boot.token : NULL) : dt_token_resolve(o.token);
    if (tok && !(pg->token = dt_strdup(tok)))
        goto fail;

    dt_store_opts so = {.timeout_ms = timeout, .token = o.token};
    if (pg->store) {
        // reached through MPI above
    } else if (env || strncmp(method, "tcp://", 6) == 0) {
        char host[256];
        int  port = 0;
        if (env) {
            const char *p = getenv("MASTER_PORT");
            if (!p || !*p) {
                dt_fail(DT_ERR_ARG, "init: environment variable MASTER_PORT is not set (expected "
                                    "the port of rank 0's store, e.g. MASTER_PORT=29500)");
                goto fail;
            }
            long pv;
            if (dt_parse_long(p, rank == 0 ? 0 : 1, 65535, "environment variable MASTER_PORT",
                              &pv) != DT_OK)
                goto fail;
            port          = (int)pv;
            const char *a = getenv("MASTER_ADDR");
            if ((!a || !*a) && rank != 0) {
                dt_fail(DT_ERR_ARG, "init: environment variable MASTER_ADDR is not set (expected "
                                    "the host of rank 0, e.g. MASTER_ADDR=10.0.0.1)");
                goto fail;
            }
            snprintf(host, sizeof host, "%s", a && *a ? a : "127.0.0.1");
        } else if (parse_tcp_method(method, host, sizeof host, &port) != DT_OK) {
            goto fail;
        }
        // Clients that reach rank 0 at a loopback address are all on this host: the
        // store need not listen anywhere else.
        so.loopback_only = rank == 0 && dt_sock_is_loopback(host);
        if (dt_store_new_tcp(&pg->store, host, port, rank == 0, &so) != DT_OK) {
            dt_fail_context("init (rank %d of %d)", rank, world);
            goto fail;
        }
    } else if (strncmp(method, "file://", 7) == 0) {
        if (dt_store_new_file(&pg->store, method + 7, &so) != DT_OK) {
            dt_fail_context("init (rank %d of %d)", rank, world);
            goto fail;
        }
    } else {
        dt_fail(DT_ERR_ARG,
                "init: expected an init method \"env://\", \"tcp://host:port\" or "
                "\"file:///path\", found \"%s\"",
                method);
        goto fail;
    }
    if (rendezvous(pg, deadline) != DT_OK)
        goto fail;

    // Hosts: local rank and size (the environment wins when it says).
    pg->all_local  = true;
    pg->local_rank = pg->local_world = 0;
    for (int r = 0; r < world; r++) {
        bool same = strcmp(pg->host_ids[r], pg->host_ids[rank]) == 0;
        pg->all_local &= same;
        if (same) {
            if (r < rank)
                pg->local_rank++;
            pg->local_world++;
        }
    }
    if (le.local_rank >= 0)
        pg->local_rank = le.local_rank;
    if (le.local_world >= 0)
        pg->local_world = le.local_world;

    if (choose_backend(pg, o.backend) != DT_OK || dt_algo_cfg_init(&pg->algo) != DT_OK)
        goto fail;
    // Heartbeats between the ranks, from now on: a rank that freezes during the
    // backend's set-up is found too.
    char live_addr[256];
    dt_sock_public_addr(pg->store, rank, pg->all_local, live_addr, sizeof live_addr);
    if (dt_live_new(&pg->live, pg, pg->store, live_addr, deadline) != DT_OK)
        goto fail;
    char prefix[64];
    snprintf(prefix, sizeof prefix, "dt/%s", pg->be->name);
    if (dt_store_new_prefix(&pg->be_store, pg->store, prefix) != DT_OK)
        goto fail;
    if (pg->be->init(pg, pg->be_store, deadline, &pg->be_ctx) != DT_OK) {
        dt_fail_context("init: backend %s", pg->be->name);
        goto fail;
    }
    if (pthread_create(&pg->thread, NULL, progress_main, pg) != 0) {
        dt_fail(DT_ERR_IO, "init: could not start the progress thread");
        goto fail;
    }
    pg->thread_started = true;
    // The init barrier: everyone has a working backend before anyone returns.
    dt_op ob    = OP_INIT(DT_COLL_INIT);
    ob.fp.coll  = DT_COLL_INIT;
    ob.fp.dtype = DT_FLOAT32;
    ob.fp.root  = -1;
    if (dt_pg_submit(pg, &ob, NULL) != DT_OK) {
        dt_fail_context("init");
        goto fail;
    }
    if (dt_live_wait_peers(pg->live, deadline) != DT_OK)
        goto fail;
    if (pg->hybrid && dt_hybrid_setup(pg, deadline) != DT_OK) {
        dt_fail_context("init: backend hybrid");
        goto fail;
    }
    return pg;
fail:;
    dt_status st = dt_last_status();
    char      msg[MSG_LEN];
    snprintf(msg, sizeof msg, "%s", dt_last_error());
    if (st == DT_OK)
        st = DT_ERR_NOMEM, snprintf(msg, sizeof msg, "init: out of memory");
    dt_pg_free(pg);
    dt_fail(st, "%s", msg);
    return NULL;
}

// DT_* variables that are not settings (a typo: DT_TIMOUT_MS) are named once per
// process, with the nearest setting, when the first group is created.
static void warn_unknown_settings(void) {
    static atomic_bool said;
    if (atomic_exchange(&said, true))
        return;
    char msg[1024];
    if (dt_settings_check_unknown(msg, sizeof msg) > 0)
        DT_WARN("comm", "%s (dtrain-mnist --help-env lists every setting)", msg);
}

dt_status dt_pg_new(dt_pg **out, const char *init_method, int rank, int world,
                    const dt_pg_opts *opts) {
    warn_unknown_settings();
    *out = pg_create(init_method, rank, world, opts);
    if (*out)
        return DT_OK;
    dt_status st = dt_last_status();
    return st != DT_OK ? st : dt_fail(DT_ERR_STATE, "init: failed without a message");
}

dt_status dt_pg_new_from_env(dt_pg **out, const dt_pg_opts *opts) {
    return dt_pg_new(out, "env://", -1, -1, opts);
}
