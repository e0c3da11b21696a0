// shm.c: the shared-memory collective engine (see shm.h for the contract and
// docs/shm.md for the algorithms with their step tables).
//
// Synchronisation in one sentence: every rank owns a 32-bit step counter in its own
// cache line, raises it after each phase of its work, and waits for the counters of
// the others (spin, then spin and yield, then futex sleep); a phase's data is published
// by the release store of the counter and read after the acquire load that sees it.
// Counters grow across collectives and wrap; all ranks raise them the same number of
// times per collective (a function of its fingerprint), so "rank j has passed step t"
// means the same thing on every rank.
#include "comm/shm.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <poll.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define SHM_MAGIC   0x316d6873746e7264ull // "drtnshm1"
#define SHM_VERSION 1u

// 1 MiB chunks: of 64 KiB .. 2 MiB, the fastest from 1 MiB to 64 MiB buffers with 2
// ranks here (fewer synchronisations beat finer overlap; measured, docs/shm.md). For
// large worlds the default shrinks so that the working buffers stay within 32 MiB
// (a container's /dev/shm is often 64 MiB).
#define DEFAULT_CHUNK_BYTES ((size_t)1 << 20)
#define MAX_DEFAULT_BUFS    ((size_t)32 << 20)
// Working buffers per rank: chunk k uses buffer k % NBUF. Three let the large
// all_reduce stage chunk k+1 while the others still read chunks k and k-1.
#define NBUF                3
#define DEFAULT_SMALL_BYTES ((size_t)64 << 10)
#define PEER_CHECK_NS       50000000ull // liveness checked at op start at most this often

#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
#endif

// ------------------------------------------------------------------- segment layout

typedef struct shm_word {
    _Atomic uint32_t value;   // written by one owner; a futex word
    _Atomic uint32_t waiters; // ranks asleep on value; the owner wakes them when > 0
    _Atomic int32_t  cpu;     // the CPU the owner ran on when it last wrote value
    uint32_t         pad_;
} shm_word;

// One per rank, written only by its rank (but for `step.waiters`). 256 bytes. The
// fingerprints share the step's cache line: a peer that sees the arrival step gets
// them with the same line transfer.
typedef struct shm_slot {
    _Alignas(64) shm_word step;
    // By the parity of the rank's collective count: a rank can be one collective ahead
    // of another, never two (it cannot finish one without the others arriving).
    dt_fingerprint fp[2];
    _Alignas(64) _Atomic int32_t pid;
    _Atomic uint32_t departed; // set by dt_shm_free: gone on purpose
    _Atomic uint32_t ncoll;    // collectives started, for "last seen in" messages
    char             pad[180];
} shm_slot;
_Static_assert(sizeof(shm_word) + 2 * sizeof(dt_fingerprint) == 64, "step line is one line");
_Static_assert(sizeof(shm_slot) == 256, "slot is four cache lines");

// One per ordered pair (i -> j) for send/recv: chunks posted by i, consumed by j.
typedef struct shm_chan {
    _Alignas(64) shm_word posted;
    _Alignas(64) shm_word consumed;
} shm_chan;
_Static_assert(sizeof(shm_chan) == 128, "channel is two cache lines");

// Precedes the data of every send/recv chunk.
typedef struct shm_msg {
    dt_fingerprint fp;    // the sender's (seq = message number on this channel, tag in root)
    uint32_t       chunk; // index within the message
    uint32_t       pad[9];
} shm_msg;
_Static_assert(sizeof(shm_msg) == 64, "message header is one cache line");

typedef struct shm_header {
    _Atomic uint64_t magic; // stored last by rank 0: the rest is valid once it is set
    uint32_t         version;
    uint32_t         world;
    uint64_t         nonce;
    uint64_t         seg_bytes;
    uint64_t         chunk_bytes; // per rank and buffer
    uint64_t         small_bytes;
    uint64_t         p2p_bytes; // data bytes per channel buffer
    uint64_t         slots_off, chans_off, bufs_off, pbufs_off;
    _Alignas(64) shm_word attached; // ranks that mapped the segment
    _Alignas(64) shm_word ready;    // 1 once all attached and the name is gone
    // The first failure anyone saw, for everyone: 0 none, 1 being written, 2 set.
    _Alignas(64) _Atomic uint32_t abort_state;
    int32_t abort_status;
    int32_t abort_rank; // the rank at fault, or -1
    int32_t abort_by;   // the rank that recorded it
    char    abort_msg[768];
} shm_header;
_Static_assert(sizeof(shm_header) <= 4096, "header fits a page");

struct dt_shm {
    int                  rank, world;
    unsigned char       *base;
    size_t               seg_bytes;
    shm_header          *hdr;
    shm_slot            *slots;
    shm_chan            *chans;
    unsigned char       *bufs;  // world x NBUF collective buffers of chunk bytes
    unsigned char       *pbufs; // world x world x 2 channel buffers of (64 + pchunk) bytes
    size_t               chunk, small, pchunk;
    uint32_t             step;            // mirror of slots[rank].step
    uint32_t             ncoll;           // collectives started (fingerprint slot parity)
    uint64_t             next_buf;        // chunks so far: the next uses buffer next_buf % NBUF
    uint32_t             free_step[NBUF]; // own buffer b is unread once all ranks pass this
    uint32_t            *sent;            // per peer: chunks posted to it
    struct shm_pending **pending;         // per peer: messages not yet wholly in the channel (FIFO)
    int                  npending;        // messages queued over all peers
    uint32_t            *taken;           // per peer: chunks consumed from it
    int                 *pidfds;          // per rank, -1 for self or unknown
    const void         **in;              // world input pointers for the reduction kernel
    int64_t              spin_ns;         // spin + yield before sleeping
    int64_t              yield_ns;        // spin before yielding
    size_t               nt_bytes;        // results at least this large use non-temporal stores
    uint64_t             last_check_ns;
    bool (*aborted)(void *arg);
    void     *aborted_arg;
    dt_status failed;
    char      fail_msg[1000];
};

// A sent message whose tail did not fit in the channel: the engine owns a copy and
// pushes its chunks whenever the receiver has made room (from any later wait).
typedef struct shm_pending {
    struct shm_pending *next;
    dt_fingerprint      fp;
    unsigned char      *data;   // a copy of the whole message (chunk k at k * pchunk)
    size_t              nbytes; // of the whole message
    size_t              chunk, nchunks;
} shm_pending;

typedef struct shm_op {
    dt_shm      *s;
    const dt_op *op;
    uint64_t     start_ns;
} shm_op;

// ---------------------------------------------------------------------- primitives

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

// Wrap-safe "a has reached b" for counters that stay within 2^31 of each other.
static inline bool reached(uint32_t a, uint32_t b) {
    return (int32_t)(a - b) >= 0;
}

static long futex_wait(_Atomic uint32_t *w, uint32_t val, int64_t timeout_ns) {
    struct timespec ts = {.tv_sec = timeout_ns / 1000000000, .tv_nsec = timeout_ns % 1000000000};
    return syscall(SYS_futex, (void *)(uintptr_t)w, FUTEX_WAIT, val, &ts, NULL, 0);
}

static void futex_wake(_Atomic uint32_t *w) {
    syscall(SYS_futex, (void *)(uintptr_t)w, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

// Publishes v. The seq_cst store and the seq_cst load of `waiters` pair with the
// waiter's increment and re-check (wait_word): either the waiter sees v, or the owner
// sees the waiter and wakes it. No syscall when nobody sleeps.
static void word_set(shm_word *w, uint32_t v) {
    atomic_store_explicit(&w->cpu, sched_getcpu(), memory_order_relaxed);
    atomic_store_explicit(&w->value, v, memory_order_seq_cst);
    if (atomic_load_explicit(&w->waiters, memory_order_seq_cst) != 0)
        futex_wake(&w->value);
}

static void set_step(dt_shm *s, uint32_t v) {
    s->step = v;
    word_set(&s->slots[s->rank].step, v);
}

// ------------------------------------------------------------------ abort and poison

static void wake_everyone(dt_shm *s) {
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
static void publish_abort(dt_shm *s, dt_status st, int culprit, const char *msg) {
    shm_header *h        = s->hdr;
    uint32_t    expected = 0;
    if (atomic_compare_exchange_strong(&h->abort_state, &expected, 1)) {
        h->abort_status = (int32_t)st;
        h->abort_rank   = culprit;
        h->abort_by     = s->rank;
        snprintf(h->abort_msg, sizeof h->abort_msg, "%s", msg);
        atomic_store_explicit(&h->abort_state, 2, memory_order_release);
    }
    wake_everyone(s);
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
    // A mismatch or a timeout means the same to everyone; any other failure here (an
    // abort of this rank's group included) is "this rank is gone" for the others.
    dt_status theirs = st == DT_ERR_MISMATCH || st == DT_ERR_TIMEOUT ? st : DT_ERR_PEER;
    publish_abort(s, theirs, s->rank, msg && *msg ? msg : "aborted");
    if (!s->failed) {
        s->failed = st == DT_OK ? DT_ERR_STATE : st;
        snprintf(s->fail_msg, sizeof s->fail_msg, "%s", msg ? msg : "aborted");
    }
}

// ------------------------------------------------------------------------- liveness

// The first rank whose process has ended (skipping those that left through
// dt_shm_free when skip_departed), or -1.
static int exited_peer(dt_shm *s, bool skip_departed) {
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
    int dead         = exited_peer(s, true);
    if (dead >= 0) {
        char msg[256];
        snprintf(msg, sizeof msg, "%s: rank %d died (process %d ended without leaving the group)",
                 op->name, dead, (int)atomic_load(&s->slots[dead].pid));
        publish_abort(s, DT_ERR_PEER, dead, msg);
        return fail_from_abort(o);
    }
    if (peer >= 0 && atomic_load(&s->slots[peer].departed)) {
        char msg[256];
        snprintf(msg, sizeof msg,
                 "%s: rank %d left the group (dt_pg_free) while rank %d still "
                 "needed it",
                 op->name, peer, s->rank);
        publish_abort(s, DT_ERR_PEER, peer, msg);
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
        publish_abort(s, DT_ERR_TIMEOUT, s->rank, msg);
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
static void push_pending(dt_shm *s);

static dt_status wait_word(shm_op *o, shm_word *w, uint32_t target, int peer, bool is_step) {
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
            if (s->npending)
                push_pending(s);
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
            if (s->npending && slice > 200000)
                slice = 200000;
            if (slice > 0)
                futex_wait(&w->value, v, slice);
        }
        atomic_fetch_sub_explicit(&w->waiters, 1, memory_order_seq_cst);
        if (s->npending)
            push_pending(s);
        if (reached(atomic_load_explicit(&w->value, memory_order_acquire), target))
            return DT_OK;
        DT_TRY(check_health(o, peer, target, is_step));
    }
}

static dt_status wait_step(shm_op *o, int r, uint32_t target) {
    return wait_word(o, &o->s->slots[r].step, target, r, true);
}

static dt_status wait_all(shm_op *o, uint32_t target) {
    dt_shm *s = o->s;
    for (int r = 0; r < s->world; r++)
        if (r != s->rank)
            DT_TRY(wait_step(o, r, target));
    return DT_OK;
}

// Before this rank writes its buffer b: everyone has finished reading what it held.
static dt_status acquire_buf(shm_op *o, uint64_t b) {
    return wait_all(o, o->s->free_step[b % NBUF]);
}

static inline unsigned char *buf_of(const dt_shm *s, int r, uint64_t b) {
    return s->bufs + ((size_t)r * NBUF + b % NBUF) * s->chunk;
}

static inline size_t min_sz(size_t a, size_t b) {
    return a < b ? a : b;
}
static inline size_t div_up(size_t a, size_t b) {
    return (a + b - 1) / b;
}

// Bytes of each of the world slots a buffer is cut into (scatter, reduce_scatter,
// all_to_all): a multiple of 64 so that slots do not share cache lines.
static inline size_t slot_bytes(const dt_shm *s) {
    return (s->chunk / (size_t)s->world) & ~(size_t)63;
}

// --------------------------------------------------------------------- op framing

static dt_status op_begin(dt_shm *s, shm_op *o, const dt_op *op) {
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
    if (s->npending)
        push_pending(s);
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
        publish_abort(s, DT_ERR_MISMATCH, r, msg);
        return poison(s, DT_ERR_MISMATCH, "%s", msg);
    }
    return DT_OK;
}

// The first synchronisation of every collective: publish step base+1 (after any data
// this rank had to stage first), wait until every rank did, compare fingerprints.
static dt_status arrive(shm_op *o, uint32_t base) {
    set_step(o->s, base + 1);
    DT_TRY(wait_all(o, base + 1));
    return check_fps(o);
}

// ---------------------------------------------------------------------- all_reduce

// Small buffers: one synchronisation. Every rank stages its whole input, waits for
// all, and reduces the whole buffer from the world staged copies itself (its own
// from src), in rank order, so every rank computes the same bits.
static dt_status all_reduce_small(shm_op *o, const unsigned char *src, unsigned char *dst,
                                  size_t count, size_t es, int root) {
    dt_shm      *s    = o->s;
    const dt_op *op   = o->op;
    uint32_t     base = s->step;
    uint64_t     b    = s->next_buf;
    DT_TRY(acquire_buf(o, b));
    memcpy(buf_of(s, s->rank, b), src, count * es);
    DT_TRY(arrive(o, base));
    if (root < 0 || root == s->rank) {
        for (int r = 0; r < s->world; r++)
            s->in[r] = r == s->rank ? (const void *)src : (const void *)buf_of(s, r, b);
        dt_shm_reduce_kernel(dst, NULL, false, s->in, s->world, count, op->dtype, op->op);
    }
    set_step(s, base + 2);
    s->free_step[b % NBUF] = base + 2;
    s->next_buf++;
    return DT_OK;
}

// Large buffers: chunks of `chunk` bytes stream through the NBUF (3) buffers of every
// rank. Chunk k is cut into world slices; slice r is rank r's share. Staging chunk k
// means copying every slice but one's own into one's buffer k % 3. Then, with one
// synchronisation per chunk (step base+1+k: "staged chunk k, reduced chunk k-1"):
//
//   step        every rank r does, between waiting for all at the step and raising it
//   base+1      stage 0 (and publish the fingerprint)
//   base+2      reduce slice r of chunk 0 (own part from src) -> dst and buffer; stage 1
//   base+2+k    reduce slice r of chunk k; gather chunk k-1 (others' reduced slices
//               from their buffers -> dst); stage chunk k+1
//   base+2+n    gather chunk n-1
//
// Staging chunk k+1 reuses the buffer of chunk k-2, whose last readers (the gathers
// of step base+1+k) are done once everyone passed base+1+k: the wait that opens the
// step. Each byte of src is read once and each byte of dst written once.
static dt_status all_reduce_large(shm_op *o, const unsigned char *src, unsigned char *dst,
                                  size_t count, size_t es, int root, bool *used_nt) {
    dt_shm      *s  = o->s;
    const dt_op *op = o->op;
    int          me = s->rank, world = s->world;
    size_t       ce      = s->chunk / es; // elements per chunk
    size_t       nchunks = div_up(count, ce);
    size_t       align   = 64 / es;
    uint32_t     base    = s->step;
    bool         want    = root < 0 || root == me;
    bool         nt      = want && count * es >= s->nt_bytes;
    *used_nt             = nt;
    const void **in      = s->in;
    dt_status    st      = DT_OK;

#define CHUNK_LEN(k) min_sz(ce, count - (size_t)(k)*ce)
#define SLICE(n)     (div_up(div_up((n), (size_t)world), align) * align)
#define STAGE(k)                                                                                   \
    do {                                                                                           \
        size_t               n_ = CHUNK_LEN(k), sl_ = SLICE(n_);                                   \
        size_t               lo_ = min_sz(n_, (size_t)me * sl_);                                   \
        size_t               hi_ = min_sz(n_, lo_ + sl_);                                          \
        uint64_t             b_  = s->next_buf + (uint64_t)(k);                                    \
        const unsigned char *p_  = src + (size_t)(k)*ce * es;                                      \
        unsigned char       *q_  = buf_of(s, me, b_);                                              \
        if ((st = acquire_buf(o, b_)))                                                             \
            goto out;                                                                              \
        memcpy(q_, p_, lo_ *es);                                                                   \
        memcpy(q_ + hi_ * es, p_ + hi_ * es, (n_ - hi_) * es);                                     \
    } while (0)

    STAGE(0);
    if ((st = arrive(o, base)))
        goto out;
    for (size_t k = 0; k <= nchunks; k++) {
        uint32_t at = base + 1 + (uint32_t)k; // everyone staged k and reduced k-1
        if (k > 0 && (st = wait_all(o, at)))
            goto out;
        if (k < nchunks) {
            size_t   n = CHUNK_LEN(k), sl = SLICE(n);
            size_t   lo = min_sz(n, (size_t)me * sl), hi = min_sz(n, lo + sl);
            uint64_t b   = s->next_buf + (uint64_t)k;
            size_t   off = k * ce * es;
            if (hi > lo) {
                for (int r = 0; r < world; r++)
                    in[r] = r == me ? (const void *)(src + off + lo * es)
                                    : (const void *)(buf_of(s, r, b) + lo * es);
                dt_shm_reduce_kernel(buf_of(s, me, b) + lo * es, want ? dst + off + lo * es : NULL,
                                     nt, in, world, hi - lo, op->dtype, op->op);
            }
        }
        if (k > 0 && want) {
            size_t   n = CHUNK_LEN(k - 1), sl = SLICE(n);
            uint64_t b   = s->next_buf + (uint64_t)(k - 1);
            size_t   off = (k - 1) * ce * es;
            for (int r = 0; r < world; r++) {
                size_t rlo = min_sz(n, (size_t)r * sl), rhi = min_sz(n, rlo + sl);
                if (r != me && rhi > rlo)
                    dt_shm_copy(dst + off + rlo * es, buf_of(s, r, b) + rlo * es, (rhi - rlo) * es,
                                nt);
            }
        }
        if (k > 0) // chunk k-1 is read by all once they pass this step
            s->free_step[(s->next_buf + k - 1) % NBUF] = at + 1;
        if (k + 1 < nchunks)
            STAGE(k + 1);
        set_step(s, at + 1);
    }
    s->next_buf += nchunks;
out:
    return st;
#undef STAGE
#undef SLICE
#undef CHUNK_LEN
}

static dt_status run_reduce(shm_op *o, int root) {
    dt_shm      *s  = o->s;
    const dt_op *op = o->op;
    size_t       es = dt_dtype_size(op->dtype);
    bool         nt = false;
    dt_status    st;
    // The small algorithm has every rank read all `world` staged copies: keep what it
    // reads near 2 * small_bytes (the measured 2-rank crossover) whatever the world.
    size_t nbytes = op->count * es;
    if (nbytes * (size_t)s->world <= 2 * s->small && nbytes <= s->chunk)
        st = all_reduce_small(o, op->src, op->dst, op->count, es, root);
    else
        st = all_reduce_large(o, op->src, op->dst, op->count, es, root, &nt);
    if (nt)
        dt_shm_store_fence(); // the results are read by whichever thread gets them
    return st;
}

// -------------------------------------------------------------- one-to-all, all-to-one

// broadcast and scatter: root stages piece k, the others copy it out. Piece k is
// ready at root's step base+1+k (base+1 is the arrival), and rank r has read it once
// r passes base+2+k. Broadcast pieces are whole buffers; scatter cuts root's buffer
// into world slots, slot r carrying piece k of block r.
static dt_status fan_out(shm_op *o, const unsigned char *src, unsigned char *dst, size_t nbytes,
                         int root, bool scatter) {
    dt_shm  *s  = o->s;
    int      me = s->rank, world = s->world;
    size_t   piece = scatter ? slot_bytes(s) : s->chunk;
    size_t   n     = div_up(nbytes, piece);
    uint32_t base  = s->step;
    bool     nt    = nbytes >= s->nt_bytes;
    int      nslot = scatter ? world : 1;
#define PIECE(k) min_sz(piece, nbytes - (size_t)(k)*piece)
#define STAGE(k)                                                                                   \
    do {                                                                                           \
        uint64_t b_ = s->next_buf + (uint64_t)(k);                                                 \
        DT_TRY(acquire_buf(o, b_));                                                                \
        for (int r_ = 0; r_ < nslot; r_++)                                                         \
            if (!scatter || r_ != me)                                                              \
                memcpy(buf_of(s, me, b_) + (size_t)r_ * piece,                                     \
                       src + (size_t)r_ * nbytes + (size_t)(k)*piece, PIECE(k));                   \
    } while (0)
    if (me == root) {
        if (n > 0)
            STAGE(0);
        if (scatter)
            dt_shm_copy(dst, src + (size_t)me * nbytes, nbytes, false);
    }
    DT_TRY(arrive(o, base));
    for (size_t k = 0; k < n; k++) {
        uint64_t b = s->next_buf + (uint64_t)(k);
        if (me == root) {
            s->free_step[b % NBUF] = base + 2 + (uint32_t)k;
            if (k + 1 < n)
                STAGE(k + 1);
        } else {
            if (k > 0)
                DT_TRY(wait_step(o, root, base + 1 + (uint32_t)k));
            dt_shm_copy(dst + k * piece, buf_of(s, root, b) + (scatter ? (size_t)me * piece : 0),
                        PIECE(k), nt);
        }
        set_step(s, base + 2 + (uint32_t)k);
    }
    s->next_buf += n;
    if (nt)
        dt_shm_store_fence();
    return DT_OK;
#undef STAGE
#undef PIECE
}

// gather (root reads) and all_gather (everyone reads): rank r stages piece k of its
// block, ready at r's step base+1+k; readers pass base+2+k after copying it.
static dt_status fan_in(shm_op *o, const unsigned char *src, unsigned char *dst, size_t nbytes,
                        int root) {
    dt_shm  *s  = o->s;
    int      me = s->rank, world = s->world;
    size_t   piece = s->chunk;
    size_t   n     = div_up(nbytes, piece);
    uint32_t base  = s->step;
    bool     reads = root < 0 || root == me;
    bool     stage = root < 0 || root != me;
    bool     nt    = reads && nbytes * (size_t)world >= s->nt_bytes;
#define PIECE(k) min_sz(piece, nbytes - (size_t)(k)*piece)
    if (stage && n > 0) {
        DT_TRY(acquire_buf(o, s->next_buf));
        memcpy(buf_of(s, me, s->next_buf), src, PIECE(0));
    }
    if (reads && dst + (size_t)me * nbytes != src)
        memcpy(dst + (size_t)me * nbytes, src, nbytes);
    DT_TRY(arrive(o, base));
    for (size_t k = 0; k < n; k++) {
        uint64_t b = s->next_buf + (uint64_t)(k);
        if (reads) {
            if (k > 0)
                DT_TRY(wait_all(o, base + 1 + (uint32_t)k));
            for (int r = 0; r < world; r++)
                if (r != me)
                    dt_shm_copy(dst + (size_t)r * nbytes + k * piece, buf_of(s, r, b), PIECE(k),
                                nt);
        }
        if (stage) {
            s->free_step[b % NBUF] = base + 2 + (uint32_t)k;
            if (k + 1 < n) {
                DT_TRY(acquire_buf(o, b + 1));
                memcpy(buf_of(s, me, b + 1), src + (k + 1) * piece, PIECE(k + 1));
            }
        }
        set_step(s, base + 2 + (uint32_t)k);
    }
    s->next_buf += n;
    if (nt)
        dt_shm_store_fence();
    return DT_OK;
#undef PIECE
}

// reduce_scatter and all_to_all: every rank stages piece k of each block j != r in
// slot j of its buffer; rank r then takes slot r of every buffer (reducing them with
// its own block from src, or copying each to its place in dst). One synchronisation
// per piece: the next pieces are staged right after this one is taken.
static dt_status exchange(shm_op *o, const unsigned char *src, unsigned char *dst, bool reduce) {
    dt_shm      *s  = o->s;
    const dt_op *op = o->op;
    int          me = s->rank, world = s->world;
    size_t       es     = dt_dtype_size(op->dtype);
    size_t       nbytes = op->count * es;
    size_t       piece  = slot_bytes(s);
    size_t       n      = div_up(nbytes, piece);
    uint32_t     base   = s->step;
    bool         nt     = nbytes * (reduce ? 1 : (size_t)world) >= s->nt_bytes;
    const void **in     = s->in;
    dt_status    st     = DT_OK;
#define PIECE(k) min_sz(piece, nbytes - (size_t)(k)*piece)
#define STAGE(k)                                                                                   \
    do {                                                                                           \
        uint64_t b_ = s->next_buf + (uint64_t)(k);                                                 \
        if ((st = acquire_buf(o, b_)))                                                             \
            goto out;                                                                              \
        for (int r_ = 0; r_ < world; r_++)                                                         \
            if (r_ != me)                                                                          \
                memcpy(buf_of(s, me, b_) + (size_t)r_ * piece,                                     \
                       src + (size_t)r_ * nbytes + (size_t)(k)*piece, PIECE(k));                   \
    } while (0)

    if (n > 0)
        STAGE(0);
    // all_to_all keeps its own block (in place, it is already where it belongs).
    if (!reduce)
        dt_shm_copy(dst + (size_t)me * nbytes, src + (size_t)me * nbytes, nbytes, false);
    if ((st = arrive(o, base)))
        goto out;
    for (size_t k = 0; k < n; k++) {
        uint64_t b   = s->next_buf + (uint64_t)(k);
        size_t   off = k * piece;
        if (k > 0 && (st = wait_all(o, base + 1 + (uint32_t)k)))
            goto out;
        if (reduce) {
            for (int r = 0; r < world; r++)
                in[r] = r == me ? (const void *)(src + (size_t)me * nbytes + off)
                                : (const void *)(buf_of(s, r, b) + (size_t)me * piece);
            dt_shm_reduce_kernel(dst + off, NULL, false, in, world, PIECE(k) / es, op->dtype,
                                 op->op);
        } else {
            for (int r = 0; r < world; r++)
                if (r != me)
                    dt_shm_copy(dst + (size_t)r * nbytes + off,
                                buf_of(s, r, b) + (size_t)me * piece, PIECE(k), nt);
        }
        s->free_step[b % NBUF] = base + 2 + (uint32_t)k;
        if (k + 1 < n)
            STAGE(k + 1);
        set_step(s, base + 2 + (uint32_t)k);
    }
    s->next_buf += n;
out:
    if (nt)
        dt_shm_store_fence();
    return st;
#undef STAGE
#undef PIECE
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

static void post_chunk(dt_shm *s, int peer, const dt_fingerprint *fp, size_t k,
                       const unsigned char *data, size_t len) {
    uint32_t       at = s->sent[peer];
    unsigned char *p  = chan_buf(s, s->rank, peer, at);
    shm_msg        h  = {.fp = *fp, .chunk = (uint32_t)k};
    memcpy(p, &h, sizeof h);
    memcpy(p + sizeof h, data, len);
    s->sent[peer] = at + 1;
    word_set(&chan(s, s->rank, peer)->posted, at + 1);
}

// Pushes queued chunks into every channel with room, oldest message first. Never waits.
static void push_pending(dt_shm *s) {
    for (int peer = 0; peer < s->world; peer++) {
        shm_pending *m;
        while ((m = s->pending[peer]) && chan_has_room(s, peer)) {
            size_t off = m->chunk * s->pchunk;
            post_chunk(s, peer, &m->fp, m->chunk, m->data + off,
                       min_sz(s->pchunk, m->nbytes - off));
            if (++m->chunk == m->nchunks) {
                s->pending[peer] = m->next;
                s->npending--;
                dt_free(m->data);
                dt_free(m);
            }
        }
    }
}

// Never waits for the receiver (comm.h: a send returns once its data is handed to the
// transport, so that a ring of sends followed by receives cannot deadlock): the chunks
// that fit go into the channel now, the rest is copied and pushed by later calls.
static dt_status run_send(shm_op *o) {
    dt_shm      *s      = o->s;
    const dt_op *op     = o->op;
    int          peer   = op->peer;
    size_t       nbytes = op->count * dt_dtype_size(op->dtype);
    size_t       n      = nbytes ? div_up(nbytes, s->pchunk) : 1;
    size_t       k      = 0;
    if (!s->pending[peer])
        for (; k < n && chan_has_room(s, peer); k++)
            post_chunk(s, peer, &op->fp, k, (const unsigned char *)op->src + k * s->pchunk,
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
        publish_abort(s, DT_ERR_NOMEM, s->rank, msg); // the receiver must not wait for it
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

static dt_status run_recv(shm_op *o) {
    dt_shm      *s      = o->s;
    const dt_op *op     = o->op;
    int          peer   = op->peer;
    shm_chan    *c      = chan(s, peer, s->rank);
    size_t       nbytes = op->count * dt_dtype_size(op->dtype);
    size_t       n      = nbytes ? div_up(nbytes, s->pchunk) : 1;
    for (size_t k = 0; k < n; k++) {
        uint32_t at = s->taken[peer];
        DT_TRY(wait_word(o, &c->posted, at + 1, peer, false));
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
            publish_abort(s, DT_ERR_MISMATCH, peer, msg);
            return poison(s, DT_ERR_MISMATCH, "%s", msg);
        }
        size_t len = min_sz(s->pchunk, nbytes - k * s->pchunk);
        memcpy((unsigned char *)op->dst + k * s->pchunk, p + sizeof h, len);
        s->taken[peer] = at + 1;
        word_set(&c->consumed, at + 1);
    }
    return DT_OK;
}

// ------------------------------------------------------------------------ dispatch

dt_status dt_shm_run(dt_shm *s, const dt_op *op) {
    shm_op o;
    DT_TRY(op_begin(s, &o, op));
    size_t es = dt_dtype_size(op->dtype);
    switch (op->kind) {
    case DT_COLL_ALL_REDUCE:
        return run_reduce(&o, -1);
    case DT_COLL_REDUCE:
        return run_reduce(&o, op->root);
    case DT_COLL_BROADCAST:
        return fan_out(&o, op->dst, op->dst, op->count * es, op->root, false);
    case DT_COLL_SCATTER:
        return fan_out(&o, op->src, op->dst, op->count * es, op->root, true);
    case DT_COLL_GATHER:
        return fan_in(&o, op->src, op->dst, op->count * es, op->root);
    case DT_COLL_ALL_GATHER:
        return fan_in(&o, op->src, op->dst, op->count * es, -1);
    case DT_COLL_REDUCE_SCATTER:
        return exchange(&o, op->src, op->dst, true);
    case DT_COLL_ALL_TO_ALL:
        return exchange(&o, op->src, op->dst, false);
    case DT_COLL_BARRIER:
    case DT_COLL_INIT:
        return arrive(&o, s->step);
    case DT_COLL_SEND:
        return run_send(&o);
    case DT_COLL_RECV:
        return run_recv(&o);
    default:
        return dt_fail(DT_ERR_ARG, "%s: unknown operation kind %d", op->name, (int)op->kind);
    }
}

// ------------------------------------------------------------------ init and free

int dt_shm_rank(const dt_shm *s) {
    return s->rank;
}
int dt_shm_world(const dt_shm *s) {
    return s->world;
}
size_t dt_shm_chunk_bytes(const dt_shm *s) {
    return s->chunk;
}

static size_t round_up(size_t a, size_t m) {
    return (a + m - 1) / m * m;
}

typedef struct shm_plan {
    size_t chunk, small, pchunk;
    size_t slots_off, chans_off, bufs_off, pbufs_off, total;
} shm_plan;

static dt_status plan_layout(int world, size_t chunk, size_t small, shm_plan *p) {
    // A chunk holds world slots of at least 64 bytes and is whole pages.
    size_t min_chunk = round_up((size_t)world * 64, 4096);
    p->chunk         = round_up(chunk < min_chunk ? min_chunk : chunk, 4096);
    p->small         = small;
    // Channels: world^2 of them with two buffers each; keep their total near 4 MiB.
    size_t w2    = (size_t)world * (size_t)world;
    size_t pc    = ((size_t)4 << 20) / (2 * w2);
    pc           = pc < 4096 ? 4096 : pc & ~(size_t)4095;
    p->pchunk    = pc > p->chunk ? p->chunk : pc;
    p->slots_off = 4096;
    p->chans_off = round_up(p->slots_off + sizeof(shm_slot) * (size_t)world, 4096);
    p->bufs_off  = round_up(p->chans_off + sizeof(shm_chan) * w2, 4096);
    size_t bufs, pbufs;
    if (!dt_size_mul(&bufs, (size_t)world * NBUF, p->chunk) ||
        !dt_size_mul(&pbufs, w2 * 2, sizeof(shm_msg) + p->pchunk) ||
        !dt_size_add(&p->pbufs_off, p->bufs_off, bufs) ||
        !dt_size_add(&p->total, p->pbufs_off, pbufs))
        return dt_fail(DT_ERR_ARG, "shm: segment for world %d and chunk %zu overflows", world,
                       chunk);
    p->total = round_up(p->total, 4096);
    return DT_OK;
}

static void map_views(dt_shm *s) {
    shm_header *h = s->hdr;
    s->slots      = (shm_slot *)(void *)(s->base + h->slots_off);
    s->chans      = (shm_chan *)(void *)(s->base + h->chans_off);
    s->bufs       = s->base + h->bufs_off;
    s->pbufs      = s->base + h->pbufs_off;
    s->chunk      = h->chunk_bytes;
    s->small      = h->small_bytes;
    s->pchunk     = h->p2p_bytes;
}

static int pidfd_open_(int pid) {
    return (int)syscall(SYS_pidfd_open, pid, 0);
}

// Sleeps on the init words (attached / ready), watching `watch` ranks for death.
static dt_status init_wait(dt_shm *s, shm_word *w, uint32_t target, uint64_t deadline,
                           const char *what) {
    for (;;) {
        uint32_t v = atomic_load_explicit(&w->value, memory_order_acquire);
        if (reached(v, target))
            return DT_OK;
        if (atomic_load(&s->hdr->abort_state) == 2)
            return dt_fail((dt_status)s->hdr->abort_status, "shm init: %s", s->hdr->abort_msg);
        if (s->aborted && s->aborted(s->aborted_arg))
            return dt_fail(DT_ERR_STATE, "shm init: interrupted: the group was aborted");
        // Open pidfds for ranks that appeared since the last look.
        for (int r = 0; r < s->world; r++) {
            int pid = atomic_load(&s->slots[r].pid);
            if (r != s->rank && s->pidfds[r] < 0 && pid > 0) {
                s->pidfds[r] = pidfd_open_(pid);
                if (s->pidfds[r] < 0 && errno == ESRCH)
                    return dt_fail(DT_ERR_PEER,
                                   "shm init: rank %d (process %d) died while "
                                   "the group was attaching",
                                   r, pid);
            }
        }
        int dead = exited_peer(s, 0);
        if (dead >= 0)
            return dt_fail(DT_ERR_PEER,
                           "shm init: rank %d (process %d) died while the group "
                           "was attaching",
                           dead, (int)atomic_load(&s->slots[dead].pid));
        uint64_t now = dt_now_ns();
        if (deadline != UINT64_MAX && now >= deadline) {
            char   who[256];
            size_t at = 0;
            who[0]    = '\0';
            for (int r = 0; r < s->world && at < sizeof who - 16; r++)
                if (atomic_load(&s->slots[r].pid) == 0)
                    at += (size_t)snprintf(who + at, sizeof who - at, "%s%d", at ? ", " : "", r);
            return dt_fail(DT_ERR_TIMEOUT,
                           "shm init: timed out waiting for %s (ranks not "
                           "attached: %s)",
                           what, who[0] ? who : "none");
        }
        atomic_fetch_add(&w->waiters, 1);
        if (!reached(atomic_load(&w->value), target)) {
            int64_t slice = 20 * 1000000;
            if (deadline != UINT64_MAX && (int64_t)(deadline - now) < slice)
                slice = (int64_t)(deadline - now);
            futex_wait(&w->value, v, slice);
        }
        atomic_fetch_sub(&w->waiters, 1);
    }
}

// A size setting whose 0 (the table's default) means `def`.
static dt_status env_size(const char *name, size_t def, size_t *out) {
    long v;
    DT_TRY(dt_setting_int(name, &v));
    *out = v > 0 ? (size_t)v : def;
    return DT_OK;
}

static size_t default_chunk(int world) {
    size_t def_chunk = DEFAULT_CHUNK_BYTES;
    if (def_chunk * NBUF * (size_t)world > MAX_DEFAULT_BUFS)
        def_chunk = MAX_DEFAULT_BUFS / (NBUF * (size_t)world);
    return def_chunk;
}

size_t dt_shm_segment_bytes(int world) {
    size_t   chunk;
    shm_plan p = {0};
    if (world < 1 || env_size("DT_SHM_CHUNK_BYTES", default_chunk(world), &chunk) != DT_OK ||
        plan_layout(world, chunk, DEFAULT_SMALL_BYTES, &p) != DT_OK) {
        dt_clear_error();
        return 0;
    }
    return p.total;
}

static dt_status shm_init_impl(const dt_shm_opts *o, dt_shm *s, int *fd_out) {
    int      fd       = -1;
    uint64_t deadline = o->deadline_ns;
    size_t   want_chunk, want_small;
    DT_TRY(env_size("DT_SHM_CHUNK_BYTES", o->chunk_bytes ? o->chunk_bytes : default_chunk(o->world),
                    &want_chunk));
    DT_TRY(env_size("DT_SHM_SMALL_BYTES", o->small_bytes ? o->small_bytes : DEFAULT_SMALL_BYTES,
                    &want_small));
    if (o->rank == 0) {
        shm_plan p = {0};
        DT_TRY(plan_layout(o->world, want_chunk, want_small, &p));
        // Free space first: a segment that cannot fit is refused before anything is
        // created (fallocate below still catches a race with another job).
        struct statvfs fs;
        if (statvfs("/dev/shm", &fs) == 0 &&
            (double)p.total > (double)fs.f_bavail * (double)fs.f_frsize)
            return dt_fail(DT_ERR_IO,
                           "shm: /dev/shm has %.1f MiB free, the segment of %d ranks needs %.1f "
                           "MiB (use fewer processes, lower DT_SHM_CHUNK_BYTES, the tcp backend, "
                           "or enlarge /dev/shm)",
                           (double)fs.f_bavail * (double)fs.f_frsize / 1048576.0, o->world,
                           (double)p.total / 1048576.0);
        fd = shm_open(o->name, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
        if (fd < 0)
            return dt_fail_errno(DT_ERR_IO, "shm: cannot create segment /dev/shm%s", o->name);
        *fd_out = fd;
        if (ftruncate(fd, (off_t)p.total) != 0)
            return dt_fail_errno(DT_ERR_IO, "shm: cannot size segment /dev/shm%s to %zu bytes",
                                 o->name, p.total);
        // Reserve the pages now: a full /dev/shm then fails here with a message instead
        // of killing a process with SIGBUS in the middle of a collective.
        int e = posix_fallocate(fd, 0, (off_t)p.total);
        if (e != 0) {
            struct statvfs v;
            double         avail = statvfs("/dev/shm", &v) == 0
                                       ? (double)v.f_bavail * (double)v.f_frsize / 1048576.0
                                       : -1.0;
            errno                = e;
            return dt_fail_errno(DT_ERR_IO,
                                 "shm: /dev/shm cannot hold the %.1f MiB segment "
                                 "(%.1f MiB free; lower DT_SHM_CHUNK_BYTES or enlarge "
                                 "/dev/shm)",
                                 (double)p.total / 1048576.0, avail);
        }
        void *m = mmap(NULL, p.total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (m == MAP_FAILED)
            return dt_fail_errno(DT_ERR_IO, "shm: cannot map %zu bytes of /dev/shm%s", p.total,
                                 o->name);
        s->base       = m;
        s->seg_bytes  = p.total;
        shm_header *h = s->hdr = m;
        h->version             = SHM_VERSION;
        h->world               = (uint32_t)o->world;
        h->nonce               = o->nonce;
        h->seg_bytes           = p.total;
        h->chunk_bytes         = p.chunk;
        h->small_bytes         = p.small;
        h->p2p_bytes           = p.pchunk;
        h->slots_off           = p.slots_off;
        h->chans_off           = p.chans_off;
        h->bufs_off            = p.bufs_off;
        h->pbufs_off           = p.pbufs_off;
        map_views(s);
        atomic_store(&s->slots[0].pid, (int32_t)getpid());
        atomic_store(&h->attached.value, 1);
        atomic_store_explicit(&h->magic, SHM_MAGIC, memory_order_release);
        return DT_OK;
    }
    // Other ranks: the name may not exist yet (rank 0 still creating it) when the
    // caller did not wait for rank 0 to publish it.
    unsigned sleep_us = 200;
    for (;;) {
        fd = shm_open(o->name, O_RDWR | O_CLOEXEC, 0);
        if (fd >= 0) {
            struct stat st;
            if (fstat(fd, &st) == 0 && (size_t)st.st_size >= 4096) {
                void *m = mmap(NULL, 4096, PROT_READ, MAP_SHARED, fd, 0);
                if (m == MAP_FAILED)
                    return dt_fail_errno(DT_ERR_IO, "shm: cannot map /dev/shm%s", o->name);
                const shm_header *h = m;
                uint64_t          magic =
                    atomic_load_explicit(&((shm_header *)m)->magic, memory_order_acquire);
                if (magic == SHM_MAGIC) {
                    shm_header copy;
                    memcpy(&copy, h, sizeof copy);
                    munmap(m, 4096);
                    if (copy.version != SHM_VERSION || copy.world != (uint32_t)o->world ||
                        (o->nonce && copy.nonce != o->nonce) ||
                        copy.seg_bytes != (uint64_t)st.st_size) {
                        close(fd);
                        return dt_fail(DT_ERR_MISMATCH,
                                       "shm: segment /dev/shm%s is not this group's: expected "
                                       "version %u, world %d, nonce %016llx, found version %u, "
                                       "world %u, nonce %016llx (%llu of %lld bytes)",
                                       o->name, SHM_VERSION, o->world, (unsigned long long)o->nonce,
                                       copy.version, copy.world, (unsigned long long)copy.nonce,
                                       (unsigned long long)copy.seg_bytes, (long long)st.st_size);
                    }
                    void *full =
                        mmap(NULL, copy.seg_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
                    if (full == MAP_FAILED) {
                        close(fd);
                        return dt_fail_errno(DT_ERR_IO,
                                             "shm: cannot map %llu bytes of "
                                             "/dev/shm%s",
                                             (unsigned long long)copy.seg_bytes, o->name);
                    }
                    *fd_out      = fd;
                    s->base      = full;
                    s->seg_bytes = copy.seg_bytes;
                    s->hdr       = full;
                    map_views(s);
                    atomic_store(&s->slots[o->rank].pid, (int32_t)getpid());
                    atomic_fetch_add(&s->hdr->attached.value, 1);
                    futex_wake(&s->hdr->attached.value);
                    return DT_OK;
                }
                munmap(m, 4096);
            }
            close(fd);
        } else if (errno != ENOENT) {
            return dt_fail_errno(DT_ERR_IO, "shm: cannot open segment /dev/shm%s", o->name);
        } else if (o->must_exist) {
            return dt_fail(DT_ERR_UNSUPPORTED,
                           "shm init: segment /dev/shm%s, created by rank 0, "
                           "does not exist for rank %d: the ranks do not "
                           "share /dev/shm (separate containers?); use "
                           "backend \"tcp\"",
                           o->name, o->rank);
        }
        if (dt_now_ns() >= deadline)
            return dt_fail(DT_ERR_TIMEOUT,
                           "shm init: rank %d timed out waiting for rank 0 to "
                           "create segment /dev/shm%s",
                           o->rank, o->name);
        usleep(sleep_us);
        if (sleep_us < 10000)
            sleep_us *= 2;
    }
}

dt_status dt_shm_init(const dt_shm_opts *o, dt_shm **out) {
    *out = NULL;
    if (!o || o->world < 1 || o->rank < 0 || o->rank >= o->world)
        return dt_fail(DT_ERR_ARG, "shm init: expected 0 <= rank < world, found rank %d, world %d",
                       o ? o->rank : -1, o ? o->world : -1);
    if (!o->name || o->name[0] != '/' || strchr(o->name + 1, '/') || strlen(o->name) > 200)
        return dt_fail(DT_ERR_ARG,
                       "shm init: expected a segment name like \"/dtrain-x\", "
                       "found \"%s\"",
                       o->name ? o->name : "(null)");
    dt_shm *s = dt_alloc_zero(sizeof *s);
    if (!s)
        return dt_last_status();
    s->rank    = o->rank;
    s->world   = o->world;
    size_t w   = (size_t)o->world;
    s->pidfds  = dt_alloc(sizeof(int) * w);
    s->sent    = dt_alloc_zero(sizeof(uint32_t) * w);
    s->pending = dt_alloc_zero(sizeof(shm_pending *) * w);
    s->in      = dt_alloc(sizeof(void *) * w);
    s->taken   = dt_alloc_zero(sizeof(uint32_t) * w);
    if (!s->pidfds || !s->sent || !s->taken || !s->pending || !s->in) {
        dt_shm_free(s);
        return DT_ERR_NOMEM;
    }
    for (int r = 0; r < o->world; r++) {
        s->pidfds[r] = -1;
        if (o->pids && r != o->rank && o->pids[r] > 0)
            s->pidfds[r] = pidfd_open_(o->pids[r]);
    }
    // 1 ms of spinning and yielding before sleeping: longer than a futex wake-up on a
    // VM (tens of microseconds, which would otherwise be paid at every step), short
    // enough not to matter when a peer is really late.
    // (The table's default DT_SHM_SPIN_US is 1000.)
    long      spin_us = 0;
    dt_status st      = dt_setting_int("DT_SHM_SPIN_US", &spin_us);
    s->spin_ns        = spin_us * 1000;
    // More ranks than CPUs: some peer is always descheduled, so yield from the start.
    long yield_us = -1; // -1, the default: automatic
    if (st == DT_OK)
        st = dt_setting_int("DT_SHM_YIELD_AFTER_US", &yield_us);
    if (yield_us < 0)
        yield_us = o->world > sysconf(_SC_NPROCESSORS_ONLN) ? 0 : 50;
    s->yield_ns = yield_us * 1000;
    // Non-temporal stores for results of at least DT_SHM_NT_KIB: off by default, since
    // plain stores were as fast or faster at every size here, in place or not (A/B in
    // docs/shm.md); kept as a knob for machines where writing around the cache pays.
    long nt_kib = 0;
    if (st == DT_OK)
        st = dt_setting_int("DT_SHM_NT_KIB", &nt_kib);
    s->nt_bytes = nt_kib > 0 ? (size_t)nt_kib << 10 : SIZE_MAX;
    int fd      = -1;
    if (st == DT_OK)
        st = shm_init_impl(o, s, &fd);
    s->aborted     = o->aborted;
    s->aborted_arg = o->aborted_arg;
    if (st == DT_OK && o->rank == 0 && o->created)
        st = o->created(o->created_arg);
    if (st == DT_OK) {
        uint64_t deadline = o->deadline_ns;
        if (o->rank == 0) {
            st = init_wait(s, &s->hdr->attached, (uint32_t)o->world, deadline,
                           "every rank to map the segment");
            if (st == DT_OK) {
                shm_unlink(o->name);
                word_set(&s->hdr->ready, 1);
            }
        } else {
            st = init_wait(s, &s->hdr->ready, 1, deadline, "rank 0 to finish setting up");
        }
    }
    if (fd >= 0)
        close(fd);
    if (st != DT_OK) {
        // Rank 0 owns the name; another rank removes it only when rank 0 is gone or late,
        // never when the segment belongs to someone else (a mismatch).
        if (o->rank == 0 || st == DT_ERR_TIMEOUT || st == DT_ERR_PEER)
            shm_unlink(o->name);
        if (s->hdr && s->slots && st != DT_ERR_MISMATCH) {
            char msg[400];
            snprintf(msg, sizeof msg, "rank %d failed while attaching: %s", o->rank,
                     dt_last_error());
            publish_abort(s, st, o->rank, msg);
        }
        dt_status keep = st;
        char      msg[1024];
        snprintf(msg, sizeof msg, "%s", dt_last_error());
        dt_shm_free(s);
        return dt_fail(keep, "%s", msg);
    }
    for (int r = 0; r < o->world; r++) {
        if (r == o->rank || s->pidfds[r] >= 0)
            continue;
        s->pidfds[r] = pidfd_open_(atomic_load(&s->slots[r].pid));
        if (s->pidfds[r] < 0 && errno != ESRCH)
            DT_WARN("comm",
                    "shm: cannot watch rank %d (pidfd_open: %s); its death will only "
                    "show as a timeout",
                    r, strerror(errno));
    }
    // Children forked later (data loader workers) do not inherit the mapping.
    madvise(s->base, s->seg_bytes, MADV_DONTFORK);
    s->last_check_ns = dt_now_ns();
    *out             = s;
    return DT_OK;
}

void dt_shm_free(dt_shm *s) {
    if (!s)
        return;
    if (s->base) {
        if (s->slots) {
            atomic_store(&s->slots[s->rank].departed, 1);
            wake_everyone(s); // whoever sleeps on us re-checks and sees we left
        }
        munmap(s->base, s->seg_bytes);
    }
    if (s->pidfds)
        for (int r = 0; r < s->world; r++)
            if (s->pidfds[r] >= 0)
                close(s->pidfds[r]);
    dt_free(s->pidfds);
    dt_free(s->sent);
    for (int r = 0; s->pending && r < s->world; r++)
        while (s->pending[r]) {
            shm_pending *m = s->pending[r];
            s->pending[r]  = m->next;
            dt_free(m->data);
            dt_free(m);
        }
    dt_free(s->pending);
    dt_free(s->in);
    dt_free(s->taken);
    dt_free(s);
}
