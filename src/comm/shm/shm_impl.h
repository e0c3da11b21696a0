// shm_impl.h: the insides of the shared-memory engine: the segment's layout and the
// engine's state, shared by shm.c (synchronisation, failures, channels, transfer slots),
// shm_init.c (creating and attaching the segment, freeing) and the algorithms that run
// over the segment (src/comm/algo/staged.c), as the ring runs over transfer slots.
// Internal to src/comm; the contract is shm.h.
#ifndef DTRAIN_COMM_SHM_IMPL_H
#define DTRAIN_COMM_SHM_IMPL_H

#include "comm/shm/shm.h"

#include <limits.h>
#include <linux/futex.h>
#include <sched.h>
#include <stdatomic.h>
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

// Precedes the data of every chunk on a channel.
typedef struct shm_msg {
    dt_fingerprint fp; // the sender's: dt_pg_send's (seq = message number on this
                       // channel, tag in root) or the operation's (transfer slots)
    uint32_t chunk;    // index within the message
    uint32_t step;     // the transfer's dt_xfer.step; 0 for dt_pg_send's messages
    uint64_t nbytes;   // of the whole message
    uint32_t pad[6];
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
    dt_xfer            **xs_head, **xs_tail; // per peer: transfers to send (xfer slots)
    dt_xfer            **xr_head, **xr_tail; // per peer: transfers to receive
    int                  nxsend, nxrecv;     // queued over all peers
    dt_fingerprint       xs_fp;              // the fingerprint the queued sends carry
    int                 *pidfds;             // per rank, -1 for self or unknown
    const void         **in;                 // world input pointers for the reduction kernel
    int64_t              spin_ns;            // spin + yield before sleeping
    int64_t              yield_ns;           // spin before yielding
    size_t               nt_bytes;           // results at least this large use non-temporal stores
    uint64_t             last_check_ns;
    bool (*aborted)(void *arg);
    void *aborted_arg;
    bool (*push)(void *arg); // dt_shm_opts.push
    void     *push_arg;
    dt_status failed;
    char      fail_msg[1000];
};

// A sent message whose tail did not fit in the channel: the engine owns a copy and
// pushes its chunks whenever the receiver has made room (from any later wait of any
// engine of the process, and from the owner's dt_shm_push and dt_shm_flush).
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

static inline long futex_wait(_Atomic uint32_t *w, uint32_t val, int64_t timeout_ns) {
    struct timespec ts = {.tv_sec = timeout_ns / 1000000000, .tv_nsec = timeout_ns % 1000000000};
    return syscall(SYS_futex, (void *)(uintptr_t)w, FUTEX_WAIT, val, &ts, NULL, 0);
}

static inline void futex_wake(_Atomic uint32_t *w) {
    syscall(SYS_futex, (void *)(uintptr_t)w, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

// Publishes v. The seq_cst store and the seq_cst load of `waiters` pair with the
// waiter's increment and re-check (wait_word): either the waiter sees v, or the owner
// sees the waiter and wakes it. No syscall when nobody sleeps.
static inline void word_set(shm_word *w, uint32_t v) {
    atomic_store_explicit(&w->cpu, sched_getcpu(), memory_order_relaxed);
    atomic_store_explicit(&w->value, v, memory_order_seq_cst);
    if (atomic_load_explicit(&w->waiters, memory_order_seq_cst) != 0)
        futex_wake(&w->value);
}

static inline void set_step(dt_shm *s, uint32_t v) {
    s->step = v;
    word_set(&s->slots[s->rank].step, v);
}

// Working buffer b (mod NBUF) of rank r.
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

// ------------------------------------------------------- what the algorithms use
// (shm.c; o is the operation under way, set up by dt_shm_begin)

// Starts an operation: checks its arguments and the engine's health, pushes held sends,
// and (collectives) publishes its fingerprint, which dt_shm_arrive compares.
dt_status dt_shm_begin(dt_shm *s, shm_op *o, const dt_op *op);
// The first synchronisation of every collective: publish step base+1 (after any data
// this rank had to stage first), wait until every rank did, compare fingerprints.
dt_status dt_shm_arrive(shm_op *o, uint32_t base);
// Waits until rank r (every other rank) has passed step `target`.
dt_status dt_shm_wait_step(shm_op *o, int r, uint32_t target);
dt_status dt_shm_wait_all(shm_op *o, uint32_t target);
// Before this rank writes its buffer b: everyone has finished reading what it held.
dt_status dt_shm_acquire_buf(shm_op *o, uint64_t b);
// dt_pg_send and dt_pg_recv over the channels (shm.h, "Point to point").
dt_status dt_shm_send(shm_op *o);
dt_status dt_shm_recv(shm_op *o);

// shm.c, for shm_init.c: wakes every sleeper of the segment; records the group's first
// failure in the segment (publish_abort); the first peer whose process is gone (-1: none).
void dt_shm_wake_everyone(dt_shm *s);
void dt_shm_publish_abort(dt_shm *s, dt_status st, int culprit, const char *msg);
int  dt_shm_exited_peer(dt_shm *s, bool skip_departed);

#endif // DTRAIN_COMM_SHM_IMPL_H
