// shm.c: the shared-memory collective engine (see shm.h for the contract and
// docs/shm.md for the algorithms with their step tables).
//
// Synchronisation in one sentence: every rank owns a 32-bit step counter in its own
// cache line, raises it after each phase of its work, and waits for the counters of
// the others with a short spin and then a futex sleep; a phase's data is published by
// the release store of the counter and read after the acquire load that sees it.
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

#define SHM_MAGIC   0x316d6873746e7264ull  // "drtnshm1"
#define SHM_VERSION 1u

#define DEFAULT_CHUNK_BYTES ((size_t)256 << 10)
#define DEFAULT_SMALL_BYTES ((size_t)64 << 10)
#define POLL_MS             100  // futex sleep slice: bounds how late a death is noticed
#define PEER_CHECK_NS       50000000ull  // liveness checked at op start at most this often

#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
#endif

// ------------------------------------------------------------------- segment layout

enum shm_kind {
    K_NONE,
    K_ALL_REDUCE,
    K_REDUCE,
    K_BROADCAST,
    K_ALL_GATHER,
    K_GATHER,
    K_SCATTER,
    K_REDUCE_SCATTER,
    K_ALL_TO_ALL,
    K_BARRIER,
    K_SEND,
    K_RECV,
};

static const char *const kind_names[] = {
    [K_NONE] = "none",           [K_ALL_REDUCE] = "all_reduce", [K_REDUCE] = "reduce",
    [K_BROADCAST] = "broadcast", [K_ALL_GATHER] = "all_gather", [K_GATHER] = "gather",
    [K_SCATTER] = "scatter",     [K_REDUCE_SCATTER] = "reduce_scatter",
    [K_ALL_TO_ALL] = "all_to_all", [K_BARRIER] = "barrier",     [K_SEND] = "send",
    [K_RECV] = "recv",
};

// What a rank says it is doing; compared field by field across ranks.
typedef struct shm_fp {
    uint64_t seq;    // collectives issued so far by this rank, this one included
    uint64_t count;  // elements (per rank for the gather/scatter family)
    uint32_t kind;   // enum shm_kind
    uint32_t dtype;
    uint32_t op;     // dt_reduce_op, or 0 where none
    int32_t  root;   // root rank, or -1 where none
} shm_fp;

typedef struct shm_word {
    _Atomic uint32_t value;    // written by one owner; a futex word
    _Atomic uint32_t waiters;  // ranks asleep on value; the owner wakes them when > 0
} shm_word;

// One per rank, written only by its rank (but for `step.waiters`). 256 bytes: the step
// line is apart from the fingerprints so readers of one do not bounce the other.
typedef struct shm_slot {
    _Alignas(64) shm_word step;
    _Alignas(64) shm_fp fp[2];  // by seq parity: a rank can be one collective ahead
    _Alignas(64) _Atomic int32_t pid;
    _Atomic uint32_t departed;  // set by dt_shm_free: gone on purpose
    char pad[120];
} shm_slot;
_Static_assert(sizeof(shm_slot) == 256, "slot is four cache lines");

// One per ordered pair (i -> j) for send/recv: chunks posted by i, consumed by j.
typedef struct shm_chan {
    _Alignas(64) shm_word posted;
    _Alignas(64) shm_word consumed;
} shm_chan;
_Static_assert(sizeof(shm_chan) == 128, "channel is two cache lines");

// Precedes the data of every send/recv chunk.
typedef struct shm_msg {
    uint64_t msg;    // message number on this channel, from 1
    uint64_t count;  // elements of the whole message
    uint32_t dtype;
    int32_t  tag;
    uint32_t chunk;  // index within the message
    uint32_t pad[9];
} shm_msg;
_Static_assert(sizeof(shm_msg) == 64, "message header is one cache line");

typedef struct shm_header {
    _Atomic uint64_t magic;  // stored last by rank 0: the rest is valid once it is set
    uint32_t         version;
    uint32_t         world;
    uint64_t         nonce;
    uint64_t         seg_bytes;
    uint64_t         chunk_bytes;  // per rank and buffer
    uint64_t         small_bytes;
    uint64_t         p2p_bytes;    // data bytes per channel buffer
    uint64_t         slots_off, chans_off, bufs_off, pbufs_off;
    _Alignas(64) shm_word attached;  // ranks that mapped the segment
    _Alignas(64) shm_word ready;     // 1 once all attached and the name is gone
    // The first failure anyone saw, for everyone: 0 none, 1 being written, 2 set.
    _Alignas(64) _Atomic uint32_t abort_state;
    int32_t  abort_status;
    int32_t  abort_rank;  // the rank at fault, or -1
    char     abort_msg[512];
} shm_header;
_Static_assert(sizeof(shm_header) <= 4096, "header fits a page");

struct dt_shm {
    int            rank, world;
    unsigned char *base;
    size_t         seg_bytes;
    shm_header    *hdr;
    shm_slot      *slots;
    shm_chan      *chans;
    unsigned char *bufs;   // world x 2 collective buffers of chunk bytes
    unsigned char *pbufs;  // world x world x 2 channel buffers of (64 + pchunk) bytes
    size_t         chunk, small, pchunk;
    uint32_t       step;          // mirror of slots[rank].step
    uint64_t       seq;           // collectives issued
    uint32_t       next_buf;      // which buffer the next chunk uses (same on all ranks)
    uint32_t       free_step[2];  // own buffer b is unread once all ranks pass this
    uint32_t      *sent;          // per peer: chunks posted to it
    uint32_t      *taken;         // per peer: chunks consumed from it
    uint64_t      *send_msgs, *recv_msgs;
    int           *pidfds;        // per rank, -1 for self or unknown
    int64_t        spin_ns;
    size_t         nt_bytes;      // results at least this large use non-temporal stores
    uint64_t       last_check_ns;
    dt_status      failed;
    char           fail_msg[900];
};

typedef struct shm_op {
    dt_shm  *s;
    shm_fp   fp;
    uint64_t deadline_ns;
    uint64_t start_ns;
    int      peer;  // send/recv
} shm_op;

// ---------------------------------------------------------------------- primitives

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

// Wrap-safe "a has reached b" for counters that stay within 2^31 of each other.
static inline bool reached(uint32_t a, uint32_t b) { return (int32_t)(a - b) >= 0; }

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
    atomic_store_explicit(&w->value, v, memory_order_seq_cst);
    if (atomic_load_explicit(&w->waiters, memory_order_seq_cst) != 0)
        futex_wake(&w->value);
}

static void set_step(dt_shm *s, uint32_t v) {
    s->step = v;
    word_set(&s->slots[s->rank].step, v);
}

static const char *kind_name(uint32_t k) {
    return k < sizeof kind_names / sizeof kind_names[0] ? kind_names[k] : "?";
}

// "all_reduce #5 (count 100, float32, sum)"
static void fp_describe(const shm_fp *f, char *buf, size_t n) {
    switch (f->kind) {
    case K_BARRIER:
        snprintf(buf, n, "barrier #%llu", (unsigned long long)f->seq);
        break;
    case K_ALL_REDUCE:
    case K_REDUCE_SCATTER:
        snprintf(buf, n, "%s #%llu (count %llu, %s, %s)", kind_name(f->kind),
                 (unsigned long long)f->seq, (unsigned long long)f->count,
                 dt_shm_dtype_name((dt_dtype)f->dtype), dt_shm_op_name((dt_reduce_op)f->op));
        break;
    case K_REDUCE:
        snprintf(buf, n, "reduce #%llu (count %llu, %s, %s, root %d)", (unsigned long long)f->seq,
                 (unsigned long long)f->count, dt_shm_dtype_name((dt_dtype)f->dtype),
                 dt_shm_op_name((dt_reduce_op)f->op), f->root);
        break;
    case K_BROADCAST:
    case K_GATHER:
    case K_SCATTER:
        snprintf(buf, n, "%s #%llu (count %llu, %s, root %d)", kind_name(f->kind),
                 (unsigned long long)f->seq, (unsigned long long)f->count,
                 dt_shm_dtype_name((dt_dtype)f->dtype), f->root);
        break;
    case K_SEND:
    case K_RECV:
        snprintf(buf, n, "%s #%llu %s rank %d (count %llu, %s, tag %d)", kind_name(f->kind),
                 (unsigned long long)f->seq, f->kind == K_SEND ? "to" : "from", f->root,
                 (unsigned long long)f->count, dt_shm_dtype_name((dt_dtype)f->dtype), (int)f->op);
        break;
    default:
        snprintf(buf, n, "%s #%llu (count %llu, %s)", kind_name(f->kind),
                 (unsigned long long)f->seq, (unsigned long long)f->count,
                 dt_shm_dtype_name((dt_dtype)f->dtype));
    }
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

// Records the group's first failure in the segment for every rank to see.
static void publish_abort(dt_shm *s, dt_status st, int culprit, const char *msg) {
    shm_header *h        = s->hdr;
    uint32_t    expected = 0;
    if (atomic_compare_exchange_strong(&h->abort_state, &expected, 1)) {
        h->abort_status = (int32_t)st;
        h->abort_rank   = culprit;
        snprintf(h->abort_msg, sizeof h->abort_msg, "%s", msg);
        atomic_store_explicit(&h->abort_state, 2, memory_order_release);
    }
    wake_everyone(s);
}

// Records a failure of this rank's current call; every later call repeats it.
static dt_status poison(dt_shm *s, dt_status st, const char *fmt, ...) DT_PRINTF(3, 4);
static dt_status poison(dt_shm *s, dt_status st, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(s->fail_msg, sizeof s->fail_msg, fmt, ap);
    va_end(ap);
    s->failed = st;
    return dt_fail(st, "%s", s->fail_msg);
}

static dt_status fail_from_abort(shm_op *op) {
    dt_shm     *s = op->s;
    shm_header *h = s->hdr;
    char        what[160];
    fp_describe(&op->fp, what, sizeof what);
    // The writer is between its two stores; if it died there, say so.
    uint64_t t0 = dt_now_ns();
    while (atomic_load_explicit(&h->abort_state, memory_order_acquire) != 2) {
        if (dt_now_ns() - t0 > 100000000ull)
            return poison(s, DT_ERR_PEER, "%s: a rank died while recording a failure", what);
        cpu_relax();
    }
    return poison(s, (dt_status)h->abort_status, "%s: %s", what, h->abort_msg);
}

void dt_shm_abort(dt_shm *s, dt_status status, const char *reason) {
    if (!s)
        return;
    char msg[512];
    snprintf(msg, sizeof msg, "rank %d aborted the group: %s", s->rank, reason ? reason : "");
    publish_abort(s, status == DT_OK ? DT_ERR_STATE : status, s->rank, msg);
    if (!s->failed) {
        s->failed = status == DT_OK ? DT_ERR_STATE : status;
        snprintf(s->fail_msg, sizeof s->fail_msg, "%s", msg);
    }
}

// ------------------------------------------------------------------------- liveness

// Returns the ranks whose process has ended, as a bitmask of the first 64 and the
// first such rank in *first (-1 if none).
static int exited_peer(dt_shm *s, int skip_departed) {
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
            int r = idx[i];
            if (skip_departed && atomic_load(&s->slots[r].departed))
                continue;
            return r;
        }
    }
    return -1;
}

// Called between sleeps of a wait on rank `peer` (or while idle with peer -1):
// a published abort, a dead rank, a departed rank we need, or the deadline.
static dt_status check_health(shm_op *op, int peer, uint32_t target, bool is_step) {
    dt_shm *s = op->s;
    if (atomic_load_explicit(&s->hdr->abort_state, memory_order_acquire) != 0)
        return fail_from_abort(op);
    s->last_check_ns = dt_now_ns();
    int dead         = exited_peer(s, 1);
    if (dead >= 0) {
        char msg[256];
        snprintf(msg, sizeof msg, "rank %d died (process %d ended without leaving the group)",
                 dead, (int)atomic_load(&s->slots[dead].pid));
        publish_abort(s, DT_ERR_PEER, dead, msg);
        return fail_from_abort(op);
    }
    char what[160];
    if (peer >= 0 && atomic_load(&s->slots[peer].departed)) {
        fp_describe(&op->fp, what, sizeof what);
        return poison(s, DT_ERR_PEER,
                      "%s: rank %d left the group (dt_pg_free) while rank %d still needs it",
                      what, peer, s->rank);
    }
    if (op->deadline_ns != UINT64_MAX && s->last_check_ns >= op->deadline_ns) {
        fp_describe(&op->fp, what, sizeof what);
        char who[400];
        size_t at = 0;
        who[0]    = '\0';
        if (is_step) {
            for (int r = 0; r < s->world && at < sizeof who - 80; r++) {
                uint32_t v = atomic_load(&s->slots[r].step.value);
                if (r == s->rank || reached(v, target))
                    continue;
                const shm_fp *f0 = &s->slots[r].fp[0], *f1 = &s->slots[r].fp[1];
                const shm_fp *f  = f0->seq > f1->seq ? f0 : f1;
                char          theirs[160];
                if (f->seq == 0)
                    snprintf(theirs, sizeof theirs, "no collective yet");
                else
                    fp_describe(f, theirs, sizeof theirs);
                at += (size_t)snprintf(who + at, sizeof who - at, "%srank %d (last seen in %s)",
                                       at ? ", " : "", r, theirs);
            }
        } else {
            snprintf(who, sizeof who, "rank %d", peer);
        }
        double waited = (double)(s->last_check_ns - op->start_ns) / 1e6;
        char   msg[700];
        snprintf(msg, sizeof msg, "%s: timed out after %.0f ms waiting for %s", what, waited,
                 who[0] ? who : "its peers");
        char shared[512];
        snprintf(shared, sizeof shared, "rank %d gave up: %.480s", s->rank, msg);
        publish_abort(s, DT_ERR_TIMEOUT, s->rank, shared);
        return poison(s, DT_ERR_TIMEOUT, "%s", msg);
    }
    return DT_OK;
}

// Waits until `w` reaches `target`: spin first (the peer is usually a few hundred
// nanoseconds away), then sleep on the futex in POLL_MS slices, checking health
// between slices.
static dt_status wait_word(shm_op *op, shm_word *w, uint32_t target, int peer, bool is_step) {
    if (reached(atomic_load_explicit(&w->value, memory_order_acquire), target))
        return DT_OK;
    dt_shm  *s  = op->s;
    uint64_t t0 = dt_now_ns();
    for (unsigned i = 1;; i++) {
        cpu_relax();
        if (reached(atomic_load_explicit(&w->value, memory_order_acquire), target))
            return DT_OK;
        if ((i & 255) == 0) {
            if ((int64_t)(dt_now_ns() - t0) >= s->spin_ns)
                break;
            if (atomic_load_explicit(&s->hdr->abort_state, memory_order_relaxed))
                break;
        }
    }
    for (;;) {
        atomic_fetch_add_explicit(&w->waiters, 1, memory_order_seq_cst);
        uint32_t v = atomic_load_explicit(&w->value, memory_order_seq_cst);
        if (!reached(v, target) && !atomic_load(&s->hdr->abort_state)) {
            int64_t slice = (int64_t)POLL_MS * 1000000;
            if (op->deadline_ns != UINT64_MAX) {
                uint64_t now = dt_now_ns();
                int64_t left = now >= op->deadline_ns ? 0 : (int64_t)(op->deadline_ns - now);
                if (left < slice)
                    slice = left;
            }
            if (slice > 0)
                futex_wait(&w->value, v, slice);
        }
        atomic_fetch_sub_explicit(&w->waiters, 1, memory_order_seq_cst);
        if (reached(atomic_load_explicit(&w->value, memory_order_acquire), target))
            return DT_OK;
        DT_TRY(check_health(op, peer, target, is_step));
    }
}

static dt_status wait_step(shm_op *op, int r, uint32_t target) {
    return wait_word(op, &op->s->slots[r].step, target, r, true);
}

static dt_status wait_all(shm_op *op, uint32_t target) {
    dt_shm *s = op->s;
    for (int r = 0; r < s->world; r++)
        if (r != s->rank)
            DT_TRY(wait_step(op, r, target));
    return DT_OK;
}

// Before this rank writes its buffer b: everyone has finished reading what it held.
static dt_status acquire_buf(shm_op *op, uint32_t b) {
    return wait_all(op, op->s->free_step[b & 1]);
}

static inline unsigned char *buf_of(const dt_shm *s, int r, uint32_t b) {
    return s->bufs + ((size_t)r * 2 + (b & 1)) * s->chunk;
}

// --------------------------------------------------------------------- op framing

static dt_status op_begin(dt_shm *s, shm_op *op, enum shm_kind kind, size_t count,
                          dt_dtype dtype, int op_or_tag, int root, uint64_t deadline_ns) {
    memset(op, 0, sizeof *op);
    op->s           = s;
    op->deadline_ns = deadline_ns;
    op->fp.kind     = kind;
    op->fp.count    = count;
    op->fp.dtype    = (uint32_t)dtype;
    op->fp.op       = (uint32_t)op_or_tag;
    op->fp.root     = root;
    op->fp.seq      = s->seq + 1;
    if (s->failed) {
        char what[160];
        fp_describe(&op->fp, what, sizeof what);
        return dt_fail(s->failed, "%s: the group failed earlier: %s", what, s->fail_msg);
    }
    if (dt_shm_dtype_size(dtype) == 0)
        return dt_fail(DT_ERR_ARG, "shm %s: expected a dtype in [0, %d), found %d",
                       kind_name(kind), (int)DT_DTYPE_COUNT_, (int)dtype);
    if ((kind == K_ALL_REDUCE || kind == K_REDUCE || kind == K_REDUCE_SCATTER) &&
        (unsigned)op_or_tag >= (unsigned)DT_REDUCE_COUNT_)
        return dt_fail(DT_ERR_ARG, "shm %s: expected a reduce op in [0, %d), found %d",
                       kind_name(kind), (int)DT_REDUCE_COUNT_, op_or_tag);
    if (root != -1 && (root < 0 || root >= s->world))
        return dt_fail(DT_ERR_ARG, "shm %s: expected %s in [0, %d), found %d", kind_name(kind),
                       kind == K_SEND || kind == K_RECV ? "a peer rank" : "a root rank",
                       s->world, root);
    if (count > (SIZE_MAX >> 4) / (size_t)s->world)
        return dt_fail(DT_ERR_ARG, "shm %s: count %zu is too large", kind_name(kind), count);
    op->start_ns = dt_now_ns();
    // A dead rank nobody waits on is still noticed by the next call, at a bounded cost.
    if (op->start_ns - s->last_check_ns > PEER_CHECK_NS || atomic_load(&s->hdr->abort_state)) {
        op->deadline_ns = UINT64_MAX;
        dt_status st    = check_health(op, -1, 0, false);
        op->deadline_ns = deadline_ns;
        DT_TRY(st);
    }
    if (kind != K_SEND && kind != K_RECV) {
        s->seq++;
        s->slots[s->rank].fp[s->seq & 1] = op->fp;  // published by the next set_step
    }
    return DT_OK;
}

// After every rank published its fingerprint (all passed the arrival step): compare.
static dt_status check_fps(shm_op *op) {
    dt_shm *s = op->s;
    for (int r = 0; r < s->world; r++) {
        if (r == s->rank)
            continue;
        const shm_fp *f = &s->slots[r].fp[op->fp.seq & 1];
        if (f->seq == op->fp.seq && f->kind == op->fp.kind && f->count == op->fp.count &&
            f->dtype == op->fp.dtype && f->op == op->fp.op && f->root == op->fp.root)
            continue;
        char mine[160], theirs[160], msg[480];
        fp_describe(&op->fp, mine, sizeof mine);
        fp_describe(f, theirs, sizeof theirs);
        snprintf(msg, sizeof msg, "collective mismatch: rank %d called %s, rank %d called %s",
                 s->rank, mine, r, theirs);
        publish_abort(s, DT_ERR_MISMATCH, r, msg);
        return poison(s, DT_ERR_MISMATCH, "%s: %s", mine, msg);
    }
    return DT_OK;
}

// The first synchronisation of every collective: publish step base+1 (after any data
// this rank had to stage first), wait until every rank did, compare fingerprints.
static dt_status arrive(shm_op *op, uint32_t base) {
    set_step(op->s, base + 1);
    DT_TRY(wait_all(op, base + 1));
    return check_fps(op);
}

static void op_end(dt_shm *s, bool nt) {
    if (nt)
        dt_shm_store_fence();  // results visible to whichever thread the caller hands them
    (void)s;
}

static inline size_t min_sz(size_t a, size_t b) { return a < b ? a : b; }
static inline size_t div_up(size_t a, size_t b) { return (a + b - 1) / b; }

// Bytes of each of the world slots a chunk is cut into (gather-scatter family):
// a multiple of 64 so that slots do not share cache lines.
static inline size_t slot_bytes(const dt_shm *s) {
    return (s->chunk / (size_t)s->world) & ~(size_t)63;
}

// ---------------------------------------------------------------------- all_reduce

// Small buffers: one synchronisation. Every rank stages its whole input, waits for
// all, and reduces the whole buffer from the world staged copies itself.
static dt_status all_reduce_small(shm_op *op, const unsigned char *src, unsigned char *dst,
                                  size_t count, size_t es, dt_dtype dtype, dt_reduce_op rop,
                                  int root) {
    dt_shm  *s    = op->s;
    uint32_t base = s->step;
    uint32_t b    = s->next_buf;
    DT_TRY(acquire_buf(op, b));
    memcpy(buf_of(s, s->rank, b), src, count * es);
    DT_TRY(arrive(op, base));
    if (root < 0 || root == s->rank) {
        const void *in[256];
        const void **inp = s->world <= 256 ? in : dt_alloc(sizeof(void *) * (size_t)s->world);
        if (!inp)
            return poison(s, DT_ERR_NOMEM, "all_reduce: no memory for %d pointers", s->world);
        for (int r = 0; r < s->world; r++)
            inp[r] = r == s->rank ? (const void *)src : (const void *)buf_of(s, r, b);
        dt_shm_reduce_kernel(dst, NULL, false, inp, s->world, count, dtype, rop);
        if (inp != in)
            dt_free(inp);
    }
    set_step(s, base + 2);
    s->free_step[b & 1] = base + 2;
    s->next_buf++;
    return DT_OK;
}

// Large buffers: chunks of `chunk` bytes stream through the two buffers of every rank.
// Per chunk k (slice r of a chunk is rank r's share):
//   copy-in  : rank r stages every slice but its own                -> step base+2k+1
//   reduce   : rank r reduces slice r over all ranks (its own from src) into dst and
//              into its buffer                                      -> step base+2k+2
//   gather   : rank r copies the reduced slices of the others to dst, and stages the
//              next chunk                                           -> step base+2k+3
// so two synchronisations per chunk; the next chunk's staging overlaps this gather.
static dt_status all_reduce_large(shm_op *op, const unsigned char *src, unsigned char *dst,
                                  size_t count, size_t es, dt_dtype dtype, dt_reduce_op rop,
                                  int root, bool *used_nt) {
    dt_shm  *s       = op->s;
    int      me      = s->rank, world = s->world;
    size_t   ce      = s->chunk / es;  // elements per chunk
    size_t   nchunks = div_up(count, ce);
    size_t   align   = 64 / es;
    uint32_t base    = s->step;
    bool     want    = root < 0 || root == me;
    bool     nt      = want && count * es >= s->nt_bytes;
    *used_nt         = nt;
    const void  *in_stack[64];
    const void **in = world <= 64 ? in_stack : dt_alloc(sizeof(void *) * (size_t)world);
    if (!in)
        return poison(s, DT_ERR_NOMEM, "all_reduce: no memory for %d pointers", world);
    dt_status st = DT_OK;

#define CHUNK_LEN(k) min_sz(ce, count - (size_t)(k) * ce)
#define SLICE(n)     ((div_up(div_up((n), (size_t)world), align)) * align)

    // Stage chunk k: every slice but our own, which we reduce straight from src.
#define STAGE(k)                                                                         \
    do {                                                                                 \
        size_t               n_  = CHUNK_LEN(k), sl_ = SLICE(n_);                        \
        size_t               lo_ = min_sz(n_, (size_t)me * sl_), hi_ = min_sz(n_, lo_ + sl_); \
        uint32_t             b_  = s->next_buf + (uint32_t)(k);                          \
        const unsigned char *p_  = src + (size_t)(k) * ce * es;                          \
        unsigned char       *q_  = buf_of(s, me, b_);                                    \
        st                       = acquire_buf(op, b_);                                  \
        if (st)                                                                          \
            goto out;                                                                    \
        memcpy(q_, p_, lo_ * es);                                                        \
        memcpy(q_ + hi_ * es, p_ + hi_ * es, (n_ - hi_) * es);                           \
    } while (0)

    STAGE(0);
    st = arrive(op, base);
    if (st)
        goto out;
    for (size_t k = 0; k < nchunks; k++) {
        uint32_t s1 = base + 2 * (uint32_t)k + 1;
        if (k > 0 && (st = wait_all(op, s1)))
            goto out;
        size_t   n   = CHUNK_LEN(k), sl = SLICE(n);
        size_t   lo  = min_sz(n, (size_t)me * sl), hi = min_sz(n, lo + sl);
        uint32_t b   = s->next_buf + (uint32_t)k;
        size_t   off = k * ce * es;
        if (hi > lo) {
            for (int r = 0; r < world; r++)
                in[r] = r == me ? (const void *)(src + off + lo * es)
                                : (const void *)(buf_of(s, r, b) + lo * es);
            dt_shm_reduce_kernel(buf_of(s, me, b) + lo * es, want ? dst + off + lo * es : NULL,
                                 nt, in, world, hi - lo, dtype, rop);
        }
        set_step(s, s1 + 1);
        if ((st = wait_all(op, s1 + 1)))
            goto out;
        if (want) {
            for (int r = 0; r < world; r++) {
                size_t rlo = min_sz(n, (size_t)r * sl), rhi = min_sz(n, rlo + sl);
                if (r != me && rhi > rlo)
                    dt_shm_copy(dst + off + rlo * es, buf_of(s, r, b) + rlo * es,
                                (rhi - rlo) * es, nt);
            }
        }
        s->free_step[b & 1] = s1 + 2;
        if (k + 1 < nchunks)
            STAGE(k + 1);
        set_step(s, s1 + 2);
    }
    s->next_buf += (uint32_t)nchunks;
out:
    if (in != in_stack)
        dt_free(in);
    return st;
#undef STAGE
#undef SLICE
#undef CHUNK_LEN
}

static dt_status reduce_common(dt_shm *s, enum shm_kind kind, const void *src, void *dst,
                               size_t count, dt_dtype dtype, dt_reduce_op op, int root,
                               uint64_t deadline_ns) {
    shm_op o;
    DT_TRY(op_begin(s, &o, kind, count, dtype, (int)op, root, deadline_ns));
    size_t es = dt_shm_dtype_size(dtype);
    if (count && (!src || ((root < 0 || root == s->rank) && !dst)))
        return dt_fail(DT_ERR_ARG, "shm %s: NULL buffer for %zu elements", kind_name(kind), count);
    bool      nt = false;
    dt_status st;
    if (count * es <= s->small && count * es <= s->chunk)
        st = all_reduce_small(&o, src, dst, count, es, dtype, op, root);
    else
        st = all_reduce_large(&o, src, dst, count, es, dtype, op, root, &nt);
    op_end(s, nt);
    return st;
}

dt_status dt_shm_all_reduce(dt_shm *s, const void *src, void *dst, size_t count, dt_dtype dtype,
                            dt_reduce_op op, uint64_t deadline_ns) {
    return reduce_common(s, K_ALL_REDUCE, src, dst, count, dtype, op, -1, deadline_ns);
}

dt_status dt_shm_reduce(dt_shm *s, const void *src, void *dst, size_t count, dt_dtype dtype,
                        dt_reduce_op op, int root, uint64_t deadline_ns) {
    if (root < 0 || root >= s->world)
        return dt_fail(DT_ERR_ARG, "shm reduce: expected a root rank in [0, %d), found %d",
                       s->world, root);
    return reduce_common(s, K_REDUCE, src, dst, count, dtype, op, root, deadline_ns);
}

// -------------------------------------------------------------- one-to-all, all-to-one

// broadcast (per = 0) and scatter (per = slot bytes): root stages piece k, the others
// copy it out. Piece k is ready at root step base+1+k (base+1 is the arrival), and
// read by rank r when r passes base+2+k.
static dt_status fan_out(shm_op *op, const unsigned char *src, unsigned char *dst, size_t nbytes,
                         int root, bool scatter) {
    dt_shm  *s     = op->s;
    int      me    = s->rank, world = s->world;
    size_t   piece = scatter ? slot_bytes(s) : s->chunk;
    size_t   n     = div_up(nbytes, piece);
    uint32_t base  = s->step;
    bool     nt    = nbytes >= s->nt_bytes;
#define PIECE(k) min_sz(piece, nbytes - (size_t)(k) * piece)
    if (me == root) {
        if (n > 0) {
            DT_TRY(acquire_buf(op, s->next_buf));
            for (int r = 0; r < (scatter ? world : 1); r++)
                if (!scatter || r != me)
                    memcpy(buf_of(s, me, s->next_buf) + (size_t)r * piece,
                           src + (size_t)r * nbytes, PIECE(0));
        }
        if (scatter)
            dt_shm_copy(dst, src + (size_t)me * nbytes, nbytes, false);
    }
    DT_TRY(arrive(op, base));
    for (size_t k = 0; k < n; k++) {
        uint32_t b = s->next_buf + (uint32_t)k;
        if (me == root) {
            s->free_step[b & 1] = base + 2 + (uint32_t)k;
            if (k + 1 < n) {
                uint32_t b2 = b + 1;
                DT_TRY(acquire_buf(op, b2));
                size_t off = (k + 1) * piece;
                for (int r = 0; r < (scatter ? world : 1); r++)
                    if (!scatter || r != me)
                        memcpy(buf_of(s, me, b2) + (size_t)r * piece,
                               src + (size_t)r * nbytes + off, PIECE(k + 1));
            }
        } else {
            if (k > 0)
                DT_TRY(wait_step(op, root, base + 1 + (uint32_t)k));
            dt_shm_copy(dst + k * piece, buf_of(s, root, b) + (scatter ? (size_t)me * piece : 0),
                        PIECE(k), nt);
        }
        set_step(s, base + 2 + (uint32_t)k);
    }
    s->next_buf += (uint32_t)n;
    op_end(s, nt);
    return DT_OK;
#undef PIECE
}

// gather (root only) and all_gather (everyone): rank r stages piece k of its block,
// which is ready at r's step base+1+k; readers pass base+2+k after copying it.
static dt_status fan_in(shm_op *op, const unsigned char *src, unsigned char *dst, size_t nbytes,
                        int root) {
    dt_shm  *s     = op->s;
    int      me    = s->rank, world = s->world;
    size_t   piece = s->chunk;
    size_t   n     = div_up(nbytes, piece);
    uint32_t base  = s->step;
    bool     reads = root < 0 || root == me;
    bool     nt    = reads && nbytes * (size_t)world >= s->nt_bytes;
    bool     stage = root < 0 || root != me;
#define PIECE(k) min_sz(piece, nbytes - (size_t)(k) * piece)
    if (stage && n > 0) {
        DT_TRY(acquire_buf(op, s->next_buf));
        memcpy(buf_of(s, me, s->next_buf), src, PIECE(0));
    }
    if (reads && dst + (size_t)me * nbytes != src)
        memmove(dst + (size_t)me * nbytes, src, nbytes);
    DT_TRY(arrive(op, base));
    for (size_t k = 0; k < n; k++) {
        uint32_t b = s->next_buf + (uint32_t)k;
        if (reads) {
            if (k > 0)
                DT_TRY(wait_all(op, base + 1 + (uint32_t)k));
            for (int r = 0; r < world; r++)
                if (r != me)
                    dt_shm_copy(dst + (size_t)r * nbytes + k * piece, buf_of(s, r, b), PIECE(k),
                                nt);
        }
        if (stage) {
            s->free_step[b & 1] = base + 2 + (uint32_t)k;
            if (k + 1 < n) {
                DT_TRY(acquire_buf(op, b + 1));
                memcpy(buf_of(s, me, b + 1), src + (k + 1) * piece, PIECE(k + 1));
            }
        }
        set_step(s, base + 2 + (uint32_t)k);
    }
    s->next_buf += (uint32_t)n;
    op_end(s, nt);
    return DT_OK;
#undef PIECE
}

// reduce_scatter and all_to_all: every rank stages piece k of each block j != r in
// slot j of its buffer; rank r then takes slot r of every buffer (reducing them, or
// copying each to its own place). One synchronisation per piece: the next pieces are
// staged right after this one is taken.
static dt_status exchange(shm_op *op, const unsigned char *src, unsigned char *dst, size_t count,
                          size_t es, dt_dtype dtype, int rop /* -1: all_to_all */) {
    dt_shm  *s      = op->s;
    int      me     = s->rank, world = s->world;
    size_t   nbytes = count * es;
    size_t   piece  = slot_bytes(s);
    size_t   n      = div_up(nbytes, piece);
    uint32_t base   = s->step;
    bool     nt     = nbytes * (rop < 0 ? (size_t)world : 1) >= s->nt_bytes;
    const void  *in_stack[64];
    const void **in = world <= 64 ? in_stack : dt_alloc(sizeof(void *) * (size_t)world);
    if (!in)
        return poison(s, DT_ERR_NOMEM, "%s: no memory for %d pointers", kind_name(op->fp.kind),
                      world);
    dt_status st = DT_OK;
#define PIECE(k) min_sz(piece, nbytes - (size_t)(k) * piece)
#define STAGE(k)                                                                         \
    do {                                                                                 \
        uint32_t b_ = s->next_buf + (uint32_t)(k);                                       \
        if ((st = acquire_buf(op, b_)))                                                  \
            goto out;                                                                    \
        for (int r_ = 0; r_ < world; r_++)                                               \
            if (r_ != me)                                                                \
                memcpy(buf_of(s, me, b_) + (size_t)r_ * piece,                           \
                       src + (size_t)r_ * nbytes + (size_t)(k) * piece, PIECE(k));       \
    } while (0)

    if (n > 0)
        STAGE(0);
    // all_to_all keeps its own block; in place that is already where it belongs.
    if (rop < 0)
        dt_shm_copy(dst + (size_t)me * nbytes, src + (size_t)me * nbytes, nbytes, false);
    if ((st = arrive(op, base)))
        goto out;
    for (size_t k = 0; k < n; k++) {
        uint32_t b   = s->next_buf + (uint32_t)k;
        size_t   off = k * piece;
        if (k > 0 && (st = wait_all(op, base + 1 + (uint32_t)k)))
            goto out;
        if (rop >= 0) {
            for (int r = 0; r < world; r++)
                in[r] = r == me ? (const void *)(src + (size_t)me * nbytes + off)
                                : (const void *)(buf_of(s, r, b) + (size_t)me * piece);
            dt_shm_reduce_kernel(dst + off, NULL, false, in, world, PIECE(k) / es, dtype,
                                 (dt_reduce_op)rop);
        } else {
            for (int r = 0; r < world; r++)
                if (r != me)
                    dt_shm_copy(dst + (size_t)r * nbytes + off,
                                buf_of(s, r, b) + (size_t)me * piece, PIECE(k), nt);
        }
        s->free_step[b & 1] = base + 2 + (uint32_t)k;
        if (k + 1 < n)
            STAGE(k + 1);
        set_step(s, base + 2 + (uint32_t)k);
    }
    s->next_buf += (uint32_t)n;
out:
    if (in != in_stack)
        dt_free(in);
    op_end(s, nt);
    return st;
#undef STAGE
#undef PIECE
}

static dt_status need_bufs(const char *what, size_t count, const void *a, const void *b) {
    if (count && (!a || !b))
        return dt_fail(DT_ERR_ARG, "shm %s: NULL buffer for %zu elements", what, count);
    return DT_OK;
}

dt_status dt_shm_broadcast(dt_shm *s, void *buf, size_t count, dt_dtype dtype, int root,
                           uint64_t deadline_ns) {
    shm_op o;
    DT_TRY(op_begin(s, &o, K_BROADCAST, count, dtype, 0, root, deadline_ns));
    DT_TRY(need_bufs("broadcast", count, buf, buf));
    return fan_out(&o, buf, buf, count * dt_shm_dtype_size(dtype), root, false);
}

dt_status dt_shm_scatter(dt_shm *s, const void *src, void *dst, size_t count, dt_dtype dtype,
                         int root, uint64_t deadline_ns) {
    shm_op o;
    DT_TRY(op_begin(s, &o, K_SCATTER, count, dtype, 0, root, deadline_ns));
    DT_TRY(need_bufs("scatter", count, s->rank == root ? src : dst, dst));
    return fan_out(&o, src, dst, count * dt_shm_dtype_size(dtype), root, true);
}

dt_status dt_shm_gather(dt_shm *s, const void *src, void *dst, size_t count, dt_dtype dtype,
                        int root, uint64_t deadline_ns) {
    shm_op o;
    DT_TRY(op_begin(s, &o, K_GATHER, count, dtype, 0, root, deadline_ns));
    DT_TRY(need_bufs("gather", count, src, s->rank == root ? dst : src));
    return fan_in(&o, src, dst, count * dt_shm_dtype_size(dtype), root);
}

dt_status dt_shm_all_gather(dt_shm *s, const void *src, void *dst, size_t count, dt_dtype dtype,
                            uint64_t deadline_ns) {
    shm_op o;
    DT_TRY(op_begin(s, &o, K_ALL_GATHER, count, dtype, 0, -1, deadline_ns));
    DT_TRY(need_bufs("all_gather", count, src, dst));
    return fan_in(&o, src, dst, count * dt_shm_dtype_size(dtype), -1);
}

dt_status dt_shm_reduce_scatter(dt_shm *s, const void *src, void *dst, size_t count,
                                dt_dtype dtype, dt_reduce_op op, uint64_t deadline_ns) {
    shm_op o;
    DT_TRY(op_begin(s, &o, K_REDUCE_SCATTER, count, dtype, (int)op, -1, deadline_ns));
    DT_TRY(need_bufs("reduce_scatter", count, src, dst));
    return exchange(&o, src, dst, count, dt_shm_dtype_size(dtype), dtype, (int)op);
}

dt_status dt_shm_all_to_all(dt_shm *s, const void *src, void *dst, size_t count, dt_dtype dtype,
                            uint64_t deadline_ns) {
    shm_op o;
    DT_TRY(op_begin(s, &o, K_ALL_TO_ALL, count, dtype, 0, -1, deadline_ns));
    DT_TRY(need_bufs("all_to_all", count, src, dst));
    return exchange(&o, src, dst, count, dt_shm_dtype_size(dtype), dtype, -1);
}

dt_status dt_shm_barrier(dt_shm *s, uint64_t deadline_ns) {
    shm_op o;
    DT_TRY(op_begin(s, &o, K_BARRIER, 0, DT_FLOAT32, 0, -1, deadline_ns));
    return arrive(&o, s->step);
}

// ------------------------------------------------------------------- send and recv

static inline shm_chan *chan(const dt_shm *s, int from, int to) {
    return &s->chans[(size_t)from * (size_t)s->world + (size_t)to];
}

static inline unsigned char *chan_buf(const dt_shm *s, int from, int to, uint32_t b) {
    size_t idx = ((size_t)from * (size_t)s->world + (size_t)to) * 2 + (b & 1);
    return s->pbufs + idx * (sizeof(shm_msg) + s->pchunk);
}

// A message is cut into chunks of pchunk bytes (at least one, carrying the header);
// chunk c of the channel uses buffer c % 2, which is free once the receiver has
// consumed chunk c - 2.
dt_status dt_shm_send(dt_shm *s, const void *buf, size_t count, dt_dtype dtype, int peer, int tag,
                      uint64_t deadline_ns) {
    shm_op o;
    DT_TRY(op_begin(s, &o, K_SEND, count, dtype, tag, peer, deadline_ns));
    DT_TRY(need_bufs("send", count, buf, buf));
    if (peer == s->rank)
        return dt_fail(DT_ERR_ARG, "shm send: rank %d cannot send to itself", peer);
    shm_chan *c      = chan(s, s->rank, peer);
    size_t    nbytes = count * dt_shm_dtype_size(dtype);
    size_t    n      = nbytes ? div_up(nbytes, s->pchunk) : 1;
    uint64_t  msg    = ++s->send_msgs[peer];
    o.fp.seq         = msg;
    for (size_t k = 0; k < n; k++) {
        uint32_t at = s->sent[peer];
        DT_TRY(wait_word(&o, &c->consumed, at - 1, peer, false));
        unsigned char *p = chan_buf(s, s->rank, peer, at);
        shm_msg        h = {.msg = msg, .count = count, .dtype = (uint32_t)dtype, .tag = tag,
                            .chunk = (uint32_t)k};
        memcpy(p, &h, sizeof h);
        size_t len = min_sz(s->pchunk, nbytes - k * s->pchunk);
        memcpy(p + sizeof h, (const unsigned char *)buf + k * s->pchunk, len);
        s->sent[peer] = at + 1;
        word_set(&c->posted, at + 1);
    }
    return DT_OK;
}

dt_status dt_shm_recv(dt_shm *s, void *buf, size_t count, dt_dtype dtype, int peer, int tag,
                      uint64_t deadline_ns) {
    shm_op o;
    DT_TRY(op_begin(s, &o, K_RECV, count, dtype, tag, peer, deadline_ns));
    DT_TRY(need_bufs("recv", count, buf, buf));
    if (peer == s->rank)
        return dt_fail(DT_ERR_ARG, "shm recv: rank %d cannot receive from itself", peer);
    shm_chan *c      = chan(s, peer, s->rank);
    size_t    nbytes = count * dt_shm_dtype_size(dtype);
    size_t    n      = nbytes ? div_up(nbytes, s->pchunk) : 1;
    uint64_t  msg    = ++s->recv_msgs[peer];
    o.fp.seq         = msg;
    for (size_t k = 0; k < n; k++) {
        uint32_t at = s->taken[peer];
        DT_TRY(wait_word(&o, &c->posted, at + 1, peer, false));
        const unsigned char *p = chan_buf(s, peer, s->rank, at);
        shm_msg              h;
        memcpy(&h, p, sizeof h);
        if (h.msg != msg || h.count != count || h.dtype != (uint32_t)dtype || h.tag != tag ||
            h.chunk != k) {
            char mine[160], msgtxt[480];
            fp_describe(&o.fp, mine, sizeof mine);
            snprintf(msgtxt, sizeof msgtxt,
                     "message mismatch: rank %d expects message #%llu (count %llu, %s, tag %d) "
                     "from rank %d, which sent #%llu (count %llu, %s, tag %d)",
                     s->rank, (unsigned long long)msg, (unsigned long long)count,
                     dt_shm_dtype_name(dtype), tag, peer, (unsigned long long)h.msg,
                     (unsigned long long)h.count, dt_shm_dtype_name((dt_dtype)h.dtype), h.tag);
            publish_abort(s, DT_ERR_MISMATCH, peer, msgtxt);
            return poison(s, DT_ERR_MISMATCH, "%s: %s", mine, msgtxt);
        }
        size_t len = min_sz(s->pchunk, nbytes - k * s->pchunk);
        memcpy((unsigned char *)buf + k * s->pchunk, p + sizeof h, len);
        s->taken[peer] = at + 1;
        word_set(&c->consumed, at + 1);
    }
    return DT_OK;
}

// ------------------------------------------------------------------ init and free

int    dt_shm_rank(const dt_shm *s) { return s->rank; }
int    dt_shm_world(const dt_shm *s) { return s->world; }
size_t dt_shm_chunk_bytes(const dt_shm *s) { return s->chunk; }

static size_t round_up(size_t a, size_t m) { return (a + m - 1) / m * m; }

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
    size_t w2  = (size_t)world * (size_t)world;
    size_t pc  = ((size_t)4 << 20) / (2 * w2);
    pc         = pc < 4096 ? 4096 : pc & ~(size_t)4095;
    p->pchunk  = pc > p->chunk ? p->chunk : pc;
    p->slots_off = 4096;
    p->chans_off = round_up(p->slots_off + sizeof(shm_slot) * (size_t)world, 4096);
    p->bufs_off  = round_up(p->chans_off + sizeof(shm_chan) * w2, 4096);
    size_t bufs, pbufs;
    if (!dt_size_mul(&bufs, (size_t)world * 2, p->chunk) ||
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

static int pidfd_open_(int pid) { return (int)syscall(SYS_pidfd_open, pid, 0); }

// Sleeps on the init words (attached / ready), watching `watch` ranks for death.
static dt_status init_wait(dt_shm *s, shm_word *w, uint32_t target, uint64_t deadline,
                           const char *what) {
    for (;;) {
        uint32_t v = atomic_load_explicit(&w->value, memory_order_acquire);
        if (reached(v, target))
            return DT_OK;
        if (atomic_load(&s->hdr->abort_state) == 2)
            return dt_fail((dt_status)s->hdr->abort_status, "shm init: %s", s->hdr->abort_msg);
        // Open pidfds for ranks that appeared since the last look.
        for (int r = 0; r < s->world; r++) {
            int pid = atomic_load(&s->slots[r].pid);
            if (r != s->rank && s->pidfds[r] < 0 && pid > 0) {
                s->pidfds[r] = pidfd_open_(pid);
                if (s->pidfds[r] < 0 && errno == ESRCH)
                    return dt_fail(DT_ERR_PEER, "shm init: rank %d (process %d) died while "
                                                "the group was attaching", r, pid);
            }
        }
        int dead = exited_peer(s, 0);
        if (dead >= 0)
            return dt_fail(DT_ERR_PEER, "shm init: rank %d (process %d) died while the group "
                                        "was attaching", dead, (int)atomic_load(&s->slots[dead].pid));
        uint64_t now = dt_now_ns();
        if (deadline != UINT64_MAX && now >= deadline) {
            char   who[256];
            size_t at = 0;
            who[0]    = '\0';
            for (int r = 0; r < s->world && at < sizeof who - 16; r++)
                if (atomic_load(&s->slots[r].pid) == 0)
                    at += (size_t)snprintf(who + at, sizeof who - at, "%s%d", at ? ", " : "", r);
            return dt_fail(DT_ERR_TIMEOUT, "shm init: timed out waiting for %s (ranks not "
                                           "attached: %s)", what, who[0] ? who : "none");
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

static dt_status env_size(const char *name, size_t def, size_t *out) {
    long v;
    DT_TRY(dt_env_int(name, 0, 1L << 40, (long)def, &v));
    *out = v > 0 ? (size_t)v : def;
    return DT_OK;
}

static dt_status shm_init_impl(const dt_shm_opts *o, dt_shm *s, int *fd_out) {
    int      fd       = -1;
    uint64_t deadline = dt_deadline_ns(o->timeout_ms);
    size_t   want_chunk, want_small;
    DT_TRY(env_size("DT_SHM_CHUNK_BYTES", o->chunk_bytes ? o->chunk_bytes : DEFAULT_CHUNK_BYTES,
                    &want_chunk));
    DT_TRY(env_size("DT_SHM_SMALL_BYTES", o->small_bytes ? o->small_bytes : DEFAULT_SMALL_BYTES,
                    &want_small));
    if (o->rank == 0) {
        shm_plan p = {0};
        DT_TRY(plan_layout(o->world, want_chunk, want_small, &p));
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
            errno = e;
            return dt_fail_errno(DT_ERR_IO, "shm: /dev/shm cannot hold the %.1f MiB segment "
                                            "(%.1f MiB free; lower DT_SHM_CHUNK_BYTES or enlarge "
                                            "/dev/shm)", (double)p.total / 1048576.0, avail);
        }
        void *m = mmap(NULL, p.total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (m == MAP_FAILED)
            return dt_fail_errno(DT_ERR_IO, "shm: cannot map %zu bytes of /dev/shm%s", p.total,
                                 o->name);
        s->base       = m;
        s->seg_bytes  = p.total;
        shm_header *h = s->hdr = m;
        h->version     = SHM_VERSION;
        h->world       = (uint32_t)o->world;
        h->nonce       = o->nonce;
        h->seg_bytes   = p.total;
        h->chunk_bytes = p.chunk;
        h->small_bytes = p.small;
        h->p2p_bytes   = p.pchunk;
        h->slots_off   = p.slots_off;
        h->chans_off   = p.chans_off;
        h->bufs_off    = p.bufs_off;
        h->pbufs_off   = p.pbufs_off;
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
                const shm_header *h     = m;
                uint64_t          magic = atomic_load_explicit(&((shm_header *)m)->magic,
                                                               memory_order_acquire);
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
                                       o->name, SHM_VERSION, o->world,
                                       (unsigned long long)o->nonce, copy.version, copy.world,
                                       (unsigned long long)copy.nonce,
                                       (unsigned long long)copy.seg_bytes, (long long)st.st_size);
                    }
                    void *full = mmap(NULL, copy.seg_bytes, PROT_READ | PROT_WRITE, MAP_SHARED,
                                      fd, 0);
                    if (full == MAP_FAILED) {
                        close(fd);
                        return dt_fail_errno(DT_ERR_IO, "shm: cannot map %llu bytes of "
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
        }
        if (dt_now_ns() >= deadline)
            return dt_fail(DT_ERR_TIMEOUT, "shm init: rank %d timed out waiting for rank 0 to "
                                           "create segment /dev/shm%s", o->rank, o->name);
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
        return dt_fail(DT_ERR_ARG, "shm init: expected a segment name like \"/dtrain-x\", "
                                   "found \"%s\"", o->name ? o->name : "(null)");
    dt_shm *s = dt_alloc_zero(sizeof *s);
    if (!s)
        return dt_last_status();
    s->rank  = o->rank;
    s->world = o->world;
    size_t w = (size_t)o->world;
    s->pidfds    = dt_alloc(sizeof(int) * w);
    s->sent      = dt_alloc_zero(sizeof(uint32_t) * w);
    s->taken     = dt_alloc_zero(sizeof(uint32_t) * w);
    s->send_msgs = dt_alloc_zero(sizeof(uint64_t) * w);
    s->recv_msgs = dt_alloc_zero(sizeof(uint64_t) * w);
    if (!s->pidfds || !s->sent || !s->taken || !s->send_msgs || !s->recv_msgs) {
        dt_shm_free(s);
        return DT_ERR_NOMEM;
    }
    for (int r = 0; r < o->world; r++) {
        s->pidfds[r] = -1;
        if (o->pids && r != o->rank && o->pids[r] > 0)
            s->pidfds[r] = pidfd_open_(o->pids[r]);
    }
    long spin_us;
    long ncpu           = sysconf(_SC_NPROCESSORS_ONLN);
    long def_spin       = o->world <= ncpu ? 50 : 2;  // oversubscribed: sleep, let peers run
    dt_status st        = dt_env_int("DT_SHM_SPIN_US", 0, 1000000, def_spin, &spin_us);
    s->spin_ns          = spin_us * 1000;
    long nt_kib         = 0;
    if (st == DT_OK)
        st = dt_env_int("DT_SHM_NT_KIB", 0, 1L << 30, 16 * 1024, &nt_kib);
    s->nt_bytes = nt_kib > 0 ? (size_t)nt_kib << 10 : SIZE_MAX;
    int fd      = -1;
    if (st == DT_OK)
        st = shm_init_impl(o, s, &fd);
    if (st == DT_OK) {
        uint64_t deadline = dt_deadline_ns(o->timeout_ms);
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
            DT_WARN("comm", "shm: cannot watch rank %d (pidfd_open: %s); its death will only "
                            "show as a timeout", r, strerror(errno));
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
            wake_everyone(s);  // whoever sleeps on us re-checks and sees we left
        }
        munmap(s->base, s->seg_bytes);
    }
    if (s->pidfds)
        for (int r = 0; r < s->world; r++)
            if (s->pidfds[r] >= 0)
                close(s->pidfds[r]);
    dt_free(s->pidfds);
    dt_free(s->sent);
    dt_free(s->taken);
    dt_free(s->send_msgs);
    dt_free(s->recv_msgs);
    dt_free(s);
}
