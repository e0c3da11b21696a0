// pg.c: the dispatcher at the top of src/comm. The public collectives (comm.h) are
// checked (arguments, overlaps), stamped (sequence number, fingerprint, name, deadline:
// op.h) and queued on the process's one execution lane (pg_impl.h), where dt_pg_exec
// hands each to the algorithm layer (algo/algo.h: the tables choose and run the
// algorithm over the group's transport, and ends an AVG), records a failure as the
// process's poison. Work handles (dt_work) and abort are here too. Creating and freeing the
// world group is pg_init.c; what backends read from a group is pg_state.c; sub-groups
// are group.c. Calls go down only: nothing below calls back into this file.
#include "comm/pg_impl.h"
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

// ------------------------------------------------------------------ the transport

dt_status dt_pg_set_xport(dt_pg *g) {
    dt_pg                *R   = g->root;
    const dt_backend_ops *be  = g->shared ? R->be : g->be;
    void                 *ctx = g->shared ? R->be_ctx : g->be_ctx;
    g->xport                  = (dt_xport){.rank = g->rank, .world = g->world};
    if (g->world == 1)
        return DT_OK; // runs locally (run_local)
    if (be->xfer_post && be->xfer_wait) {
        g->xport.xfer_post  = be->xfer_post;
        g->xport.xfer_wait  = be->xfer_wait;
        g->xport.xfer_ready = be->xfer_ready;
        g->xport.xfer_ctx   = ctx;
        g->xport.peers      = g->shared ? g->world_ranks : NULL;
    }
    if (!g->shared) {
        if (be->run) {
            g->xport.run       = be->run;
            g->xport.run_ctx   = ctx;
            g->xport.run_kinds = be->run_kinds;
            g->xport.run_avg   = be->run_avg;
        }
        if (be->xport)
            be->xport(ctx, &g->xport);
    }
    // A forced algorithm the world's transport cannot run is refused at dt_pg_new; a
    // sub-group whose own transport lacks it (a hybrid world's groups have no levels)
    // runs auto's choice instead.
    return g == R ? dt_algo_check(&g->xport, &g->algo, be->name) : DT_OK;
}

// ------------------------------------------------------------------ held sends

// After a send that left part of its message held (a shm message larger than its
// channel), raise the process's flag: from now on the progress thread moves it while the
// lane is idle, and every backend's waits move it meanwhile (dt_pg_push_sends).
static void note_held_send(dt_pg *pg) {
    bool moved;
    if (pg->be && pg->be->push && pg->be_ctx && pg->be->push(pg->be_ctx, &moved))
        atomic_store(&pg->root->sends_held, true);
}

void dt_pg_flush_sends(dt_pg *g) {
    dt_pg *R = g->root;
    if (!g->be || !g->be->flush || !g->be_ctx || atomic_load(&R->poisoned))
        return;
    uint64_t  deadline = g->timeout_ms < 0 ? UINT64_MAX : dt_deadline_ns(g->timeout_ms);
    dt_status st       = g->be->flush(g->be_ctx, deadline);
    if (st == DT_OK)
        return;
    char   msg[MSG_LEN];
    size_t off =
        (size_t)snprintf(msg, sizeof msg, "%s",
                         dt_last_error()[0] ? dt_last_error() : "dt_pg_free: a send was lost");
    if (g != R && off < sizeof msg)
        dt_pg_group_describe(g, msg + off, sizeof msg - off);
    DT_ERROR("comm", "%s", msg);
    dt_pg_poison(g, st, msg);
    dt_pg_tell_backends(g);
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
        atomic_store_explicit(&R->cur_op, op->fp.seq << 8 | ((uint64_t)op->kind + 1),
                              memory_order_relaxed);
        st = dt_algo_run(&pg->xport, &pg->algo, op);
        if (st == DT_OK && op->kind == DT_COLL_SEND)
            note_held_send(pg);
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
                dt_pg_poison(pg, st, msg);
            }
            dt_pg_tell_backends(pg);
            return st;
        }
    }
    DT_TRACE_END(tr, "comm", dt_coll_name(op->kind), "count", op->count);
    return DT_OK;
}

work_pool *dt_work_pool_new(void) {
    work_pool *p = dt_alloc_zero(sizeof *p);
    if (!p)
        return NULL;
    pthread_mutex_init(&p->mu, NULL);
    atomic_init(&p->refs, 1);
    return p;
}

void dt_work_pool_unref(work_pool *p) {
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
    dt_work_pool_unref(p);
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
// Frees the lane; called with L->mu held, which it may drop and take again. dt_pg_abort
// leaves telling the backends (and so the peers) to the lane's holder: an abort that
// came while the lane was held is told here, before the lane is free, whatever the
// holder did meanwhile. Otherwise an operation that finished normally after the abort
// left a peer waiting in a later collective until its timeout.
static void lane_free(dt_pg *L) {
    if (atomic_load(&L->poisoned)) {
        pthread_mutex_unlock(&L->mu);
        dt_pg_tell_backends(L); // once per backend
        pthread_mutex_lock(&L->mu);
    }
    L->busy = false;
}

// Called with pg->mu held.
static void wake_progress_if_needed(dt_pg *pg) {
    if (pg->head || pg->stop || atomic_load_explicit(&pg->sends_held, memory_order_relaxed))
        pthread_cond_broadcast(&pg->cv);
}

// How long the idle progress thread sleeps between pushes of held sends: from
// PUSH_NAP_MIN_NS while they move, doubling up to PUSH_NAP_MAX_NS while the receiver
// is busy elsewhere (the bound on the delay once it comes to its receive).
#define PUSH_NAP_MIN_NS 20000ll
#define PUSH_NAP_MAX_NS 5000000ll

static void cond_wait_ns(pthread_cond_t *cv, pthread_mutex_t *mu, int64_t ns) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += (time_t)(ns / 1000000000ll);
    ts.tv_nsec += (long)(ns % 1000000000ll);
    if (ts.tv_nsec >= 1000000000L)
        ts.tv_sec++, ts.tv_nsec -= 1000000000L;
    pthread_cond_timedwait(cv, mu, &ts);
}

// The idle lane with sends held: move them (non-blocking), then nap. Called with pg->mu
// held and the lane free; returns with pg->mu held.
static void push_while_idle(dt_pg *pg, int64_t *nap) {
    pg->busy = pg->pushing = true;
    pthread_mutex_unlock(&pg->mu);
    bool moved = false, held = dt_pg_push_all(pg, &moved);
    pthread_mutex_lock(&pg->mu);
    lane_free(pg);
    pg->pushing = false;
    pthread_cond_broadcast(&pg->cv);
    if (!held || pg->head || pg->stop) {
        *nap = PUSH_NAP_MIN_NS;
        return;
    }
    *nap = moved ? PUSH_NAP_MIN_NS : (*nap * 2 > PUSH_NAP_MAX_NS ? PUSH_NAP_MAX_NS : *nap * 2);
    cond_wait_ns(&pg->cv, &pg->mu, *nap);
}

void *dt_pg_progress_main(void *arg) {
    dt_pg *pg = arg;
    pthread_setname_np(pthread_self(), "dt-progress"); // for top -H, gdb, and the tests
    int64_t nap = PUSH_NAP_MIN_NS;
    pthread_mutex_lock(&pg->mu);
    for (;;) {
        if (!pg->head || pg->busy) {
            if (pg->stop && !pg->head)
                break; // stop requested and the queue is drained
            if (!pg->busy && atomic_load(&pg->sends_held) && !atomic_load(&pg->poisoned))
                push_while_idle(pg, &nap);
            else
                pthread_cond_wait(&pg->cv, &pg->mu);
            continue;
        }
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
        lane_free(pg);
        g->pending--;
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
    lane_free(L);
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
    if (dt_coll_has_op(op->kind)) {
        if ((unsigned)op->fp.op >= DT_REDUCE_COUNT_)
            return dt_fail(DT_ERR_ARG, "%s: expected a reduce op in [0, %d), found %d", name,
                           DT_REDUCE_COUNT_, (int)op->fp.op);
        if (op->fp.op == DT_REDUCE_AVG && op->dtype != DT_FLOAT32)
            return dt_fail(DT_ERR_ARG, "%s: avg needs a floating-point dtype, found %s", name,
                           dt_dtype_name(op->dtype));
    }
    if (op->fp.order >= DT_ORDER_COUNT_)
        return dt_fail(DT_ERR_ARG, "%s: expected a reduce order in [0, %d), found %d", name,
                       DT_ORDER_COUNT_, (int)op->fp.order);
    int world = pg->world, rank = pg->rank;
    if (dt_coll_has_root(op->kind) && (op->root < 0 || op->root >= world))
        return dt_fail(DT_ERR_ARG, "%s: expected a root in [0, %d), found %d", name, world,
                       op->root);
    if (dt_coll_is_p2p(op->kind)) {
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
    bool        is_root = dt_coll_has_root(op->kind) && rank == op->root;
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
    dt_op_set_name(op);
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
    op->fp.root = dt_coll_is_p2p(op->kind) ? op->tag : (dt_coll_has_root(op->kind) ? op->root : -1);
    if (!dt_coll_has_op(op->kind))
        op->fp.op = 0;
    DT_TRY(validate(pg, op));
    op->op = op->fp.op == DT_REDUCE_AVG ? DT_REDUCE_SUM : (dt_reduce_op)op->fp.op;
    if (!dt_coll_has_op(op->kind))
        op->op = DT_REDUCE_SUM;

    pthread_mutex_lock(&L->mu);
    if (L->stop) {
        pthread_mutex_unlock(&L->mu);
        return dt_fail(DT_ERR_STATE, "%s: the group is being freed", dt_coll_name(op->kind));
    }
    // A push of held sends is short and never waits: let it end rather than hand this
    // blocking call over to the progress thread.
    while (!out && L->pushing && !L->stop)
        pthread_cond_wait(&L->cv, &L->mu);
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
        lane_free(L);
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

#define OP_INIT(k) DT_OP_INIT(k)

dt_status dt_pg_all_reduce_ordered_async(dt_pg *pg, const void *src, void *dst, size_t count,
                                         dt_dtype dtype, dt_reduce_op op, dt_reduce_order order,
                                         dt_work **out) {
    dt_op o = OP_INIT(DT_COLL_ALL_REDUCE);
    o.src = src, o.dst = dst, o.count = count, o.dtype = dtype, o.fp.op = (uint8_t)op;
    if ((unsigned)op >= DT_REDUCE_COUNT_)
        o.fp.op = 0xff;
    o.fp.order = (unsigned)order < 0xff ? (uint8_t)order : 0xff; // validate() refuses it
    return dt_pg_submit(pg, &o, out);
}

dt_status dt_pg_all_reduce_async(dt_pg *pg, const void *src, void *dst, size_t count,
                                 dt_dtype dtype, dt_reduce_op op, dt_work **out) {
    return dt_pg_all_reduce_ordered_async(pg, src, dst, count, dtype, op, DT_ORDER_ANY, out);
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
dt_status dt_pg_all_reduce_ordered(dt_pg *pg, const void *src, void *dst, size_t count,
                                   dt_dtype dtype, dt_reduce_op op, dt_reduce_order order) {
    return dt_pg_all_reduce_ordered_async(pg, src, dst, count, dtype, op, order, NULL);
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

// Polls the transport between the process's operations (it holds the lane only to
// look), napping 20 us doubling to 1 ms, so a peer's message is seen within ~1 ms.
dt_status dt_pg_wait_any(dt_pg *pg, const int *peers, int n, int *from) {
    *from = -1;
    DT_TRY(check_pg(pg, "wait_any"));
    if (n < 1 || !peers)
        return dt_fail(DT_ERR_ARG, "wait_any: expected at least one peer, found %d", n);
    for (int i = 0; i < n; i++)
        if (peers[i] < 0 || peers[i] >= pg->world || peers[i] == pg->rank)
            return dt_fail(DT_ERR_ARG,
                           "wait_any: expected peer ranks in [0, %d) other than %d, found %d",
                           pg->world, pg->rank, peers[i]);
    const dt_xport *x = &pg->xport;
    if (!x->xfer_ready)
        return dt_fail(DT_ERR_UNSUPPORTED,
                       "wait_any: backend %s cannot tell which peer has a message for this "
                       "rank; expected tcp, shm or hybrid",
                       (pg->shared ? pg->root->be : pg->be)->name);
    dt_pg   *R        = pg->root;
    uint64_t deadline = pg->timeout_ms < 0 ? UINT64_MAX : dt_deadline_ns(pg->timeout_ms);
    unsigned nap_us   = 20;
    for (;;) {
        if (atomic_load(&R->poisoned)) {
            char msg[MSG_LEN];
            pthread_mutex_lock(&R->mu);
            dt_status st = R->poison_st;
            snprintf(msg, sizeof msg, "%s", R->poison_msg);
            pthread_mutex_unlock(&R->mu);
            return dt_fail(st, "%s", msg);
        }
        DT_TRY(dt_pg_lane_take(R, deadline, "wait_any"));
        for (int i = 0; i < n && *from < 0; i++)
            if (x->xfer_ready(x->xfer_ctx, x->peers ? x->peers[peers[i]] : peers[i]))
                *from = peers[i];
        dt_pg_lane_give(R);
        if (*from >= 0)
            return DT_OK;
        if (dt_now_ns() >= deadline) {
            char   who[256];
            size_t off = 0;
            who[0]     = '\0';
            for (int i = 0; i < n && off < sizeof who - 16; i++)
                off +=
                    (size_t)snprintf(who + off, sizeof who - off, "%s%d", i ? ", " : "", peers[i]);
            return dt_fail(DT_ERR_TIMEOUT,
                           "wait_any: timed out waiting for a message from any of ranks %s "
                           "(deadline set by the group timeout; DT_TIMEOUT_MS or "
                           "dt_pg_opts.timeout_ms)",
                           who);
        }
        usleep(nap_us);
        nap_us = nap_us < 500 ? 2 * nap_us : 1000;
    }
}

void dt_pg_abort(dt_pg *pg, const char *reason) {
    if (!pg)
        return;
    char msg[MSG_LEN];
    snprintf(msg, sizeof msg, "the group was aborted: %s", reason ? reason : "no reason given");
    dt_pg_poison(pg, DT_ERR_STATE, msg);
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
