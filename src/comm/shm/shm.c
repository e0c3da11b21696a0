// shm.c: the shared-memory engine (see shm.h for the contract): waits, failures,
// operation framing and the channels (dt_pg_send's messages and the transfer slots).
// The algorithms over the segment are src/comm/algo/staged.c (docs/shm.md).
//
// Synchronisation in one sentence: every rank owns a 32-bit step counter in its own
// cache line, raises it after each phase of its work, and waits for the counters of
// the others (spin, then spin and yield, then futex sleep); a phase's data is published
// by the release store of the counter and read after the acquire load that sees it.
// Counters grow across collectives and wrap; all ranks raise them the same number of
// times per collective (a function of its fingerprint), so "rank j has passed step t"
// means the same thing on every rank.
//
// The segment's layout and its set-up are shm_init.c; what both share, shm_impl.h.
#include "comm/shm/shm_impl.h"

#include <errno.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// ------------------------------------------------------------------ abort and poison

void dt_shm_wake_everyone(dt_shm *s) {
    for (int r = 0; r < s->world; r++)
        futex_wake(&s->slots[r].step.value);
    for (int i = 0; i < s->world * s->world; i++) {
        futex_wake(&s->chans[i].posted.value);
        futex_wake(&s->chans[i].consumed.value);
    }
    futex_wake(&s->hdr->attached.value);
    futex_wake(&s->hdr->ready.value);
}

// Records the group's first failure in the segment for every rank to see, and wakes
// every sleeper. `msg` is the recording rank's own message; the others repeat it
// followed by "(reported by rank r)", as the tcp backend does.
void dt_shm_publish_abort(dt_shm *s, dt_status st, int culprit, const char *msg) {
    shm_header *h        = s->hdr;
    uint32_t    expected = 0;
    if (atomic_compare_exchange_strong(&h->abort_state, &expected, 1)) {
        h->abort_status = (int32_t)st;
        h->abort_rank   = culprit;
        h->abort_by     = s->rank;
        snprintf(h->abort_msg, sizeof h->abort_msg, "%s", msg);
        atomic_store_explicit(&h->abort_state, 2, memory_order_release);
    }
    dt_shm_wake_everyone(s);
}

// Records the failure of this rank's current operation; every later call repeats it.
static dt_status poison(dt_shm *s, dt_status st, const char *fmt, ...) DT_PRINTF(3, 4);
static dt_status poison(dt_shm *s, dt_status st, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(s->fail_msg, sizeof s->fail_msg, fmt, ap);
    va_end(ap);
    s->failed = st;
    return dt_fail(st, "%s", s->fail_msg);
}

static dt_status fail_from_abort(shm_op *o) {
    dt_shm     *s  = o->s;
    shm_header *h  = s->hdr;
    uint64_t    t0 = dt_now_ns();
    // The writer is between its two stores; if it died right there, say so.
    while (atomic_load_explicit(&h->abort_state, memory_order_acquire) != 2) {
        if (dt_now_ns() - t0 > 100000000ull)
            return poison(s, DT_ERR_PEER, "%s: a rank died while recording a failure", o->op->name);
        cpu_relax();
    }
    if (h->abort_by == s->rank)
        return poison(s, (dt_status)h->abort_status, "%s", h->abort_msg);
    return poison(s, (dt_status)h->abort_status, "%s (reported by rank %d)", h->abort_msg,
                  (int)h->abort_by);
}

void dt_shm_abort(dt_shm *s, dt_status st, const char *msg) {
    if (!s)
        return;
    // The queued transfers belong to an operation that failed: forget them.
    for (int r = 0; r < s->world; r++)
        s->xs_head[r] = s->xs_tail[r] = s->xr_head[r] = s->xr_tail[r] = NULL;
    s->nxsend = s->nxrecv = 0;
    // A mismatch or a timeout means the same to everyone; any other failure here (an
    // abort of this rank's group included) is "this rank is gone" for the others.
    dt_status theirs = st == DT_ERR_MISMATCH || st == DT_ERR_TIMEOUT ? st : DT_ERR_PEER;
    dt_shm_publish_abort(s, theirs, s->rank, msg && *msg ? msg : "aborted");
    if (!s->failed) {
        s->failed = st == DT_OK ? DT_ERR_STATE : st;
        snprintf(s->fail_msg, sizeof s->fail_msg, "%s", msg ? msg : "aborted");
    }
}

// ------------------------------------------------------------------------- liveness

// The first rank whose process has ended (skipping those that left through
// dt_shm_free when skip_departed), or -1.
int dt_shm_exited_peer(dt_shm *s, bool skip_departed) {
    struct pollfd pfd[64];
    int           idx[64];
    for (int base = 0; base < s->world; base += 64) {
        int n = 0;
        for (int r = base; r < s->world && r < base + 64; r++) {
            if (s->pidfds[r] < 0)
                continue;
            pfd[n].fd      = s->pidfds[r];
            pfd[n].events  = POLLIN;
            pfd[n].revents = 0;
            idx[n++]       = r;
        }
        if (n == 0 || poll(pfd, (nfds_t)n, 0) <= 0)
            continue;
        for (int i = 0; i < n; i++) {
            if (!(pfd[i].revents & (POLLIN | POLLHUP | POLLERR)))
                continue;
            if (skip_departed && atomic_load(&s->slots[idx[i]].departed))
                continue;
            return idx[i];
        }
    }
    return -1;
}

// "rank 2 (last seen in all_reduce #41 (...))"
static size_t describe_rank(const dt_shm *s, int r, char *buf, size_t n) {
    uint32_t              nc = atomic_load(&s->slots[r].ncoll);
    const dt_fingerprint *f  = &s->slots[r].fp[nc & 1];
    char                  fp[160];
    if (nc == 0)
        return (size_t)snprintf(buf, n, "rank %d (no collective yet)", r);
    return (size_t)snprintf(buf, n, "rank %d (last seen in %s)", r, dt_fp_format(f, fp, sizeof fp));
}

// Called between sleeps of a wait on rank `peer` (-1 at the start of an operation):
// a failure published by anyone, an abort of the caller's group, a dead rank, a
// departed rank we still need, the deadline.
static dt_status check_health(shm_op *o, int peer, uint32_t target, bool is_step) {
    dt_shm      *s  = o->s;
    const dt_op *op = o->op;
    if (atomic_load_explicit(&s->hdr->abort_state, memory_order_acquire) != 0)
        return fail_from_abort(o);
    if (s->aborted && s->aborted(s->aborted_arg))
        return poison(s, DT_ERR_STATE, "%s: interrupted: the group was aborted", op->name);
    s->last_check_ns = dt_now_ns();
    int dead         = dt_shm_exited_peer(s, true);
    if (dead >= 0) {
        char msg[256];
        snprintf(msg, sizeof msg, "%s: rank %d died (process %d ended without leaving the group)",
                 op->name, dead, (int)atomic_load(&s->slots[dead].pid));
        dt_shm_publish_abort(s, DT_ERR_PEER, dead, msg);
        return fail_from_abort(o);
    }
    if (peer >= 0 && atomic_load(&s->slots[peer].departed)) {
        char msg[256];
        snprintf(msg, sizeof msg,
                 "%s: rank %d left the group (dt_pg_free) while rank %d still "
                 "needed it",
                 op->name, peer, s->rank);
        dt_shm_publish_abort(s, DT_ERR_PEER, peer, msg);
        return fail_from_abort(o);
    }
    if (op->deadline_ns != UINT64_MAX && s->last_check_ns >= op->deadline_ns) {
        char   who[480];
        size_t at = 0;
        who[0]    = '\0';
        for (int r = 0; r < s->world && at < sizeof who - 200; r++) {
            if (r == s->rank || (!is_step && r != peer))
                continue;
            if (is_step && reached(atomic_load(&s->slots[r].step.value), target))
                continue;
            if (at)
                at += (size_t)snprintf(who + at, sizeof who - at, ", ");
            at += describe_rank(s, r, who + at, sizeof who - at);
        }
        double ms = (double)(s->last_check_ns - o->start_ns) / 1e6;
        char   msg[700];
        snprintf(msg, sizeof msg, "%s: timed out after %.0f ms waiting for %s", op->name, ms,
                 who[0] ? who : "its peers");
        dt_shm_publish_abort(s, DT_ERR_TIMEOUT, s->rank, msg);
        return poison(s, DT_ERR_TIMEOUT, "%s", msg);
    }
    return DT_OK;
}

// The futex sleep slice: how late an abort of the caller's group (and a death) is seen.
#define SLICE_NS 10000000ll

// Waits until `w` reaches `target`, in three stages:
//  1. spin yield_ns (DT_SHM_YIELD_AFTER_US, 50; 0 with more ranks than CPUs): a running
//     peer answers in well under a microsecond, a chunk of work within this. Skipped
//     when the peer last ran on this very CPU: it cannot answer until we let it run.
//  2. up to spin_ns (DT_SHM_SPIN_US), call sched_yield between checks: returns at once
//     when nobody else wants this CPU (so it answers like a spin), and runs the peer
//     at once when the peer waits for this very CPU (2 ranks on 1 busy vCPU);
//  3. sleep on the futex in SLICE_NS slices, checking health between them. A futex
//     wake-up costs tens of microseconds on a VM, hence stage 2.
// `once`: return DT_OK after the first sleep (of at most XFER_SLICE_NS) even if `w` has
// not reached `target`: the transfers' wait (below) has other channels to serve too.
#define XFER_SLICE_NS 200000ll
static bool push_held(dt_shm *s);

static dt_status wait_word(shm_op *o, shm_word *w, uint32_t target, int peer, bool is_step,
                           bool once) {
    if (reached(atomic_load_explicit(&w->value, memory_order_acquire), target))
        return DT_OK;
    dt_shm  *s  = o->s;
    uint64_t t0 = dt_now_ns();
    // A peer that last ran on this CPU cannot answer before we let it run.
    int64_t yield_ns =
        atomic_load_explicit(&w->cpu, memory_order_relaxed) == sched_getcpu() ? 0 : s->yield_ns;
    for (unsigned i = 1;; i++) {
        if (reached(atomic_load_explicit(&w->value, memory_order_acquire), target))
            return DT_OK;
        if ((i & 63) == 0) {
            push_held(s);
            int64_t spent = (int64_t)(dt_now_ns() - t0);
            if (spent >= s->spin_ns ||
                atomic_load_explicit(&s->hdr->abort_state, memory_order_relaxed))
                break;
            if (spent >= yield_ns)
                sched_yield();
        }
        cpu_relax();
    }
    for (;;) {
        bool held = push_held(s);
        atomic_fetch_add_explicit(&w->waiters, 1, memory_order_seq_cst);
        uint32_t v = atomic_load_explicit(&w->value, memory_order_seq_cst);
        if (!reached(v, target) && !atomic_load(&s->hdr->abort_state)) {
            int64_t slice = SLICE_NS;
            if (o->op->deadline_ns != UINT64_MAX) {
                uint64_t now  = dt_now_ns();
                int64_t  left = now >= o->op->deadline_ns ? 0 : (int64_t)(o->op->deadline_ns - now);
                if (left < slice)
                    slice = left;
            }
            // Sleeping with messages still to push: wake up often enough to push them.
            if ((held || once) && slice > XFER_SLICE_NS)
                slice = XFER_SLICE_NS;
            if (slice > 0)
                futex_wait(&w->value, v, slice);
        }
        atomic_fetch_sub_explicit(&w->waiters, 1, memory_order_seq_cst);
        if (reached(atomic_load_explicit(&w->value, memory_order_acquire), target))
            return DT_OK;
        DT_TRY(check_health(o, peer, target, is_step));
        if (once)
            return DT_OK;
    }
}

dt_status dt_shm_wait_step(shm_op *o, int r, uint32_t target) {
    return wait_word(o, &o->s->slots[r].step, target, r, true, false);
}

dt_status dt_shm_wait_all(shm_op *o, uint32_t target) {
    dt_shm *s = o->s;
    for (int r = 0; r < s->world; r++)
        if (r != s->rank)
            DT_TRY(dt_shm_wait_step(o, r, target));
    return DT_OK;
}

dt_status dt_shm_acquire_buf(shm_op *o, uint64_t b) {
    return dt_shm_wait_all(o, o->s->free_step[b % NBUF]);
}

// --------------------------------------------------------------------- op framing

dt_status dt_shm_begin(dt_shm *s, shm_op *o, const dt_op *op) {
    o->s  = s;
    o->op = op;
    if ((unsigned)op->kind >= (unsigned)DT_COLL_COUNT_)
        return dt_fail(DT_ERR_ARG, "%s: unknown operation kind %d", op->name, (int)op->kind);
    if (s->failed)
        return dt_fail(s->failed, "%s: the group failed earlier: %s", op->name, s->fail_msg);
    size_t es = dt_dtype_size(op->dtype);
    if (es == 0)
        return dt_fail(DT_ERR_ARG, "%s: expected a dtype in [0, %d), found %d", op->name,
                       (int)DT_DTYPE_COUNT_, (int)op->dtype);
    if ((op->kind == DT_COLL_ALL_REDUCE || op->kind == DT_COLL_REDUCE ||
         op->kind == DT_COLL_REDUCE_SCATTER) &&
        (unsigned)op->op >= (unsigned)DT_REDUCE_COUNT_)
        return dt_fail(DT_ERR_ARG, "%s: expected a reduce op in [0, %d), found %d", op->name,
                       (int)DT_REDUCE_COUNT_, (int)op->op);
    bool rooted = op->kind == DT_COLL_BROADCAST || op->kind == DT_COLL_REDUCE ||
                  op->kind == DT_COLL_GATHER || op->kind == DT_COLL_SCATTER;
    if (rooted && (op->root < 0 || op->root >= s->world))
        return dt_fail(DT_ERR_ARG, "%s: expected a root rank in [0, %d), found %d", op->name,
                       s->world, op->root);
    bool p2p = op->kind == DT_COLL_SEND || op->kind == DT_COLL_RECV;
    if (p2p && (op->peer < 0 || op->peer >= s->world || op->peer == s->rank))
        return dt_fail(DT_ERR_ARG, "%s: expected a peer rank in [0, %d) other than %d, found %d",
                       op->name, s->world, s->rank, op->peer);
    if (op->count > (SIZE_MAX >> 4) / es / (size_t)s->world)
        return dt_fail(DT_ERR_ARG, "%s: count %zu is too large", op->name, op->count);
    o->start_ns = dt_now_ns();
    push_held(s);
    // A dead rank nobody waits on is still noticed by the next call, at a bounded cost.
    if (o->start_ns - s->last_check_ns > PEER_CHECK_NS || atomic_load(&s->hdr->abort_state))
        DT_TRY(check_health(o, -1, 0, false));
    if (!p2p) {
        s->ncoll++;
        s->slots[s->rank].fp[s->ncoll & 1] = op->fp; // published by the next set_step
        atomic_store_explicit(&s->slots[s->rank].ncoll, s->ncoll, memory_order_relaxed);
    }
    return DT_OK;
}

// After every rank published its fingerprint (all passed the arrival step): compare.
// Every rank compares every other, so every rank sees a mismatch on its own.
static dt_status check_fps(shm_op *o) {
    dt_shm *s = o->s;
    for (int r = 0; r < s->world; r++) {
        if (r == s->rank)
            continue;
        const dt_fingerprint *f = &s->slots[r].fp[s->ncoll & 1];
        if (dt_fp_match(&o->op->fp, f))
            continue;
        char mine[160], theirs[160], msg[700];
        dt_fp_format(&o->op->fp, mine, sizeof mine);
        dt_fp_format(f, theirs, sizeof theirs);
        snprintf(msg, sizeof msg,
                 "%s: rank %d called %s but this rank (%d) called %s; every "
                 "rank must issue the same collectives in the same order",
                 o->op->name, r, theirs, s->rank, mine);
        dt_shm_publish_abort(s, DT_ERR_MISMATCH, r, msg);
        return poison(s, DT_ERR_MISMATCH, "%s", msg);
    }
    return DT_OK;
}

// The first synchronisation of every collective: publish step base+1 (after any data
// this rank had to stage first), wait until every rank did, compare fingerprints.
dt_status dt_shm_arrive(shm_op *o, uint32_t base) {
    set_step(o->s, base + 1);
    DT_TRY(dt_shm_wait_all(o, base + 1));
    return check_fps(o);
}

// ------------------------------------------------------------------- send and recv

static inline shm_chan *chan(const dt_shm *s, int from, int to) {
    return &s->chans[(size_t)from * (size_t)s->world + (size_t)to];
}

static inline unsigned char *chan_buf(const dt_shm *s, int from, int to, uint32_t b) {
    size_t idx = ((size_t)from * (size_t)s->world + (size_t)to) * 2 + (b & 1);
    return s->pbufs + idx * (sizeof(shm_msg) + s->pchunk);
}

// A message is cut into chunks of pchunk bytes (at least one, which carries the
// fingerprint even for zero bytes); chunk c of a channel uses buffer c % 2, free once
// the receiver has consumed chunk c - 2.
static bool chan_has_room(const dt_shm *s, int peer) {
    uint32_t at = s->sent[peer];
    return reached(
        atomic_load_explicit(&chan(s, s->rank, peer)->consumed.value, memory_order_acquire),
        at - 1);
}

// Chunk k of a message of `nbytes` (transfer `step`, 0 for dt_pg_send's).
static void post_chunk(dt_shm *s, int peer, const dt_fingerprint *fp, uint32_t step, size_t nbytes,
                       size_t k, const unsigned char *data, size_t len) {
    uint32_t       at = s->sent[peer];
    unsigned char *p  = chan_buf(s, s->rank, peer, at);
    shm_msg        h  = {.fp = *fp, .chunk = (uint32_t)k, .step = step, .nbytes = nbytes};
    memcpy(p, &h, sizeof h);
    if (len) // an empty message may come with no buffer
        memcpy(p + sizeof h, data, len);
    s->sent[peer] = at + 1;
    word_set(&chan(s, s->rank, peer)->posted, at + 1);
}

// Pushes queued chunks into every channel with room, oldest message first. Never waits.
// Returns the number of chunks posted.
static size_t push_pending(dt_shm *s) {
    size_t posted = 0;
    for (int peer = 0; peer < s->world; peer++) {
        shm_pending *m;
        while ((m = s->pending[peer]) && chan_has_room(s, peer)) {
            size_t off = m->chunk * s->pchunk;
            post_chunk(s, peer, &m->fp, 0, m->nbytes, m->chunk, m->data + off,
                       min_sz(s->pchunk, m->nbytes - off));
            posted++;
            if (++m->chunk == m->nchunks) {
                s->pending[peer] = m->next;
                s->npending--;
                dt_free(m->data);
                dt_free(m);
            }
        }
    }
    return posted;
}

static size_t push_xfers(dt_shm *s);

// From every wait and operation start: the transfers of the operation under way, and
// the held sends of the whole process through the owner's hook (a send of another engine
// must not wait for this one's operation), else this engine's. True while some remain.
static bool push_held(dt_shm *s) {
    if (s->nxsend)
        push_xfers(s);
    bool xfers = s->nxsend != 0;
    if (s->push)
        return s->push(s->push_arg) || xfers;
    if (s->npending)
        push_pending(s);
    return s->npending != 0 || xfers;
}

bool dt_shm_push(dt_shm *s, bool *moved) {
    if (!s->npending || s->failed ||
        atomic_load_explicit(&s->hdr->abort_state, memory_order_relaxed))
        return false; // after a failure nothing will take them: free drops them
    if (push_pending(s))
        *moved = true;
    return s->npending != 0;
}

dt_status dt_shm_flush(dt_shm *s, uint64_t deadline_ns) {
    if (!s->npending || s->failed)
        return DT_OK;
    dt_op  op = {.kind = DT_COLL_SEND, .root = -1, .deadline_ns = deadline_ns};
    shm_op o  = {.s = s, .op = &op, .start_ns = dt_now_ns()};
    for (int peer = 0; peer < s->world; peer++) {
        while (s->pending[peer]) {
            const shm_pending *m = s->pending[peer];
            op.peer              = peer;
            snprintf(op.name, sizeof op.name, "dt_pg_free: send #%llu to rank %d",
                     (unsigned long long)DT_FP_SEQ(&m->fp), peer);
            size_t    left = m->nbytes - min_sz(m->nbytes, m->chunk * s->pchunk);
            size_t    all  = m->nbytes;
            dt_status st = wait_word(&o, &chan(s, s->rank, peer)->consumed, s->sent[peer] - 1, peer,
                                     false, false);
            if (st != DT_OK)
                return dt_fail(st, "%s (%zu of its %zu bytes were never delivered)",
                               dt_last_error(), left, all);
            push_pending(s);
        }
    }
    return DT_OK;
}

// Never waits for the receiver (comm.h: a send returns once its data is handed to the
// transport, so that a ring of sends followed by receives cannot deadlock): the chunks
// that fit go into the channel now, the rest is copied and pushed by later calls.
dt_status dt_shm_send(shm_op *o) {
    dt_shm      *s      = o->s;
    const dt_op *op     = o->op;
    int          peer   = op->peer;
    size_t       nbytes = op->count * dt_dtype_size(op->dtype);
    size_t       n      = nbytes ? div_up(nbytes, s->pchunk) : 1;
    size_t       k      = 0;
    if (!s->pending[peer])
        for (; k < n && chan_has_room(s, peer); k++)
            post_chunk(s, peer, &op->fp, 0, nbytes, k,
                       (const unsigned char *)op->src + k * s->pchunk,
                       min_sz(s->pchunk, nbytes - k * s->pchunk));
    if (k == n)
        return DT_OK;
    shm_pending   *m    = dt_alloc_zero(sizeof *m);
    unsigned char *copy = m ? dt_alloc(nbytes) : NULL;
    if (!copy) {
        dt_free(m);
        char msg[200];
        snprintf(msg, sizeof msg, "%s: no memory to queue %zu bytes for rank %d", op->name, nbytes,
                 peer);
        dt_shm_publish_abort(s, DT_ERR_NOMEM, s->rank, msg); // the receiver must not wait for it
        return poison(s, DT_ERR_NOMEM, "%s", msg);
    }
    memcpy(copy, op->src, nbytes); // whole message: chunk offsets stay those of the message
    m->fp              = op->fp;
    m->data            = copy;
    m->nbytes          = nbytes;
    m->chunk           = k;
    m->nchunks         = n;
    shm_pending **tail = &s->pending[peer];
    while (*tail)
        tail = &(*tail)->next;
    *tail = m;
    s->npending++;
    return DT_OK;
}

dt_status dt_shm_recv(shm_op *o) {
    dt_shm      *s      = o->s;
    const dt_op *op     = o->op;
    int          peer   = op->peer;
    shm_chan    *c      = chan(s, peer, s->rank);
    size_t       nbytes = op->count * dt_dtype_size(op->dtype);
    size_t       n      = nbytes ? div_up(nbytes, s->pchunk) : 1;
    for (size_t k = 0; k < n; k++) {
        uint32_t at = s->taken[peer];
        DT_TRY(wait_word(o, &c->posted, at + 1, peer, false, false));
        const unsigned char *p = chan_buf(s, peer, s->rank, at);
        shm_msg              h;
        memcpy(&h, p, sizeof h);
        const dt_fingerprint *f = &h.fp;
        if (f->coll != DT_COLL_SEND || !dt_fp_match(&op->fp, f) || h.chunk != k) {
            char mine[160], theirs[160], msg[700];
            dt_fp_format(&op->fp, mine, sizeof mine);
            dt_fp_format(f, theirs, sizeof theirs);
            snprintf(msg, sizeof msg,
                     "%s: rank %d called %s but this rank (%d) called %s; the "
                     "receiver must name the sender's count, dtype and tag",
                     op->name, peer, theirs, s->rank, mine);
            dt_shm_publish_abort(s, DT_ERR_MISMATCH, peer, msg);
            return poison(s, DT_ERR_MISMATCH, "%s", msg);
        }
        size_t len = min_sz(s->pchunk, nbytes - k * s->pchunk);
        if (len) // an empty message may come into no buffer
            memcpy((unsigned char *)op->dst + k * s->pchunk, p + sizeof h, len);
        s->taken[peer] = at + 1;
        word_set(&c->consumed, at + 1);
    }
    return DT_OK;
}

// ------------------------------------------------------------------ transfer slots
//
// xfer_post / xfer_wait (backend.h) over the same channels, so that the point-to-point
// algorithms (a ring forced with DT_ALLREDUCE_ALGO, an all_reduce in tree order) run on
// shm too. A transfer is queued on its peer's list (its own next_ link; done_bytes_
// counts its chunks) and never copied: the algorithm keeps its buffer until it is done.
// Sends go out as their channel has room, behind any of dt_pg_send's held messages to
// that peer; receives take the channel's chunks in order. Every wait of the engine
// pushes the queued sends (push_held), and the transfers' own wait serves every queue
// between sleeps of at most XFER_SLICE_NS, so two ranks sending each other more than a
// channel holds both progress.

static void queue_append(dt_xfer **head, dt_xfer **tail, int peer, dt_xfer *x) {
    x->next_ = NULL;
    if (tail[peer])
        tail[peer]->next_ = x;
    else
        head[peer] = x;
    tail[peer] = x;
}

static void queue_pop(dt_xfer **head, dt_xfer **tail, int peer) {
    dt_xfer *x = head[peer];
    head[peer] = x->next_;
    if (!head[peer])
        tail[peer] = NULL;
    x->next_ = NULL;
    x->done  = true;
}

static size_t chunks_of(const dt_shm *s, size_t nbytes) {
    return nbytes ? div_up(nbytes, s->pchunk) : 1;
}

static size_t push_xfers(dt_shm *s) {
    size_t posted = 0;
    for (int peer = 0; peer < s->world && s->nxsend; peer++) {
        dt_xfer *x;
        while (!s->pending[peer] && (x = s->xs_head[peer]) && chan_has_room(s, peer)) {
            size_t k = x->done_bytes_, off = k * s->pchunk;
            post_chunk(s, peer, &s->xs_fp, x->step, x->nbytes, k, (unsigned char *)x->buf + off,
                       min_sz(s->pchunk, x->nbytes - off));
            posted++;
            if (++x->done_bytes_ == chunks_of(s, x->nbytes)) {
                queue_pop(s->xs_head, s->xs_tail, peer);
                s->nxsend--;
            }
        }
    }
    return posted;
}

// Takes every chunk that has arrived for a queued receive.
static dt_status pull_xfers(shm_op *o) {
    dt_shm      *s  = o->s;
    const dt_op *op = o->op;
    for (int peer = 0; peer < s->world && s->nxrecv; peer++) {
        dt_xfer  *x;
        shm_chan *c = chan(s, peer, s->rank);
        while ((x = s->xr_head[peer]) &&
               reached(atomic_load_explicit(&c->posted.value, memory_order_acquire),
                       s->taken[peer] + 1)) {
            uint32_t             at = s->taken[peer];
            const unsigned char *p  = chan_buf(s, peer, s->rank, at);
            shm_msg              h;
            memcpy(&h, p, sizeof h);
            size_t k = x->done_bytes_;
            char   msg[700];
            if (!dt_fp_match(&op->fp, &h.fp)) {
                char mine[160], theirs[160];
                snprintf(msg, sizeof msg,
                         "%s: rank %d called %s but this rank (%d) called %s; every rank must "
                         "issue the same collectives in the same order with the same arguments",
                         op->name, peer, dt_fp_format(&h.fp, theirs, sizeof theirs), s->rank,
                         dt_fp_format(&op->fp, mine, sizeof mine));
            } else if (h.step != x->step || h.nbytes != x->nbytes || h.chunk != k) {
                snprintf(msg, sizeof msg,
                         "%s: rank %d sent message %u.%u of %llu bytes, this rank expected "
                         "message %u.%u of %zu bytes (ranks chose different algorithms: are "
                         "the DT_*_ALGO settings equal on every rank?)",
                         op->name, peer, h.step >> 24, h.step & 0xffffff,
                         (unsigned long long)h.nbytes, x->step >> 24, x->step & 0xffffff,
                         x->nbytes);
            } else {
                size_t off = k * s->pchunk, len = min_sz(s->pchunk, x->nbytes - off);
                if (len) // an empty message may come into no buffer
                    memcpy((unsigned char *)x->buf + off, p + sizeof h, len);
                s->taken[peer] = at + 1;
                word_set(&c->consumed, at + 1);
                if (++x->done_bytes_ == chunks_of(s, x->nbytes)) {
                    queue_pop(s->xr_head, s->xr_tail, peer);
                    s->nxrecv--;
                }
                continue;
            }
            dt_shm_publish_abort(s, DT_ERR_MISMATCH, peer, msg);
            return poison(s, DT_ERR_MISMATCH, "%s", msg);
        }
    }
    return DT_OK;
}

dt_status dt_shm_xfer_post(void *ctx, const dt_op *op, dt_xfer *x) {
    dt_shm *s = ctx;
    if (s->failed)
        return dt_fail(s->failed, "%s: the group failed earlier: %s", op->name, s->fail_msg);
    x->done        = false;
    x->done_bytes_ = 0;
    s->xs_fp       = op->fp;
    if (x->is_send) {
        queue_append(s->xs_head, s->xs_tail, x->peer, x);
        s->nxsend++;
        push_xfers(s);
    } else {
        queue_append(s->xr_head, s->xr_tail, x->peer, x);
        s->nxrecv++;
    }
    return DT_OK;
}

bool dt_shm_xfer_ready(void *ctx, int peer) {
    dt_shm *s = ctx;
    return atomic_load_explicit(&chan(s, peer, s->rank)->posted.value, memory_order_acquire) !=
               s->taken[peer] ||
           atomic_load(&s->hdr->abort_state);
}

dt_status dt_shm_xfer_wait(void *ctx, const dt_op *op, dt_xfer *x) {
    dt_shm *s = ctx;
    shm_op  o = {.s = s, .op = op, .start_ns = dt_now_ns()};
    for (;;) {
        push_held(s);
        DT_TRY(pull_xfers(&o));
        if (x->done)
            return DT_OK;
        // Sleep on what `x` needs next: room in its channel, or its next chunk.
        if (x->is_send)
            DT_TRY(wait_word(&o, &chan(s, s->rank, x->peer)->consumed, s->sent[x->peer] - 1,
                             x->peer, false, true));
        else
            DT_TRY(wait_word(&o, &chan(s, x->peer, s->rank)->posted, s->taken[x->peer] + 1, x->peer,
                             false, true));
    }
}
