// backend.h: the seam between the process group (pg.c) and a transport backend (tcp.c,
// shm.c, later mpi and hybrid). A backend is one `const dt_backend_ops` table; the
// generic layer owns argument checks, sequence numbers, fingerprints, deadlines, AVG,
// world size 1, the progress thread, poisoning and the generic algorithms (ring,
// recursive doubling, trees) that run over a backend's point-to-point slots.
// docs/comm-backend.md explains how a backend plugs in; read it with this file.
#ifndef DTRAIN_COMM_BACKEND_H
#define DTRAIN_COMM_BACKEND_H

#include "dtrain/comm.h"

// ----------------------------------------------------------------------- operations

// Kinds of operations; the order is part of the wire format (tcp headers carry it).
typedef enum dt_coll {
    DT_COLL_ALL_REDUCE,
    DT_COLL_BROADCAST,
    DT_COLL_REDUCE,
    DT_COLL_ALL_GATHER,
    DT_COLL_REDUCE_SCATTER,
    DT_COLL_GATHER,
    DT_COLL_SCATTER,
    DT_COLL_ALL_TO_ALL,
    DT_COLL_BARRIER,
    DT_COLL_SEND,
    DT_COLL_RECV,
    DT_COLL_INIT, // the barrier that ends dt_pg_new (sequence number 0)
    DT_COLL_COUNT_
} dt_coll;

// "all_reduce", "broadcast", ..., "send", "recv", "init".
const char *dt_coll_name(dt_coll c);

// What every rank taking part must agree on. For collectives `seq` counts the group's
// collectives from 1 (0 is the init barrier); for send/recv it counts the messages
// between the two ranks in that direction, from 1, and `root` holds the tag.
// `seq` also carries the group: bits 0..47 are the sequence number, bits 48..62 the
// group id (0 = the world group; sub-groups, group.c). A backend that carries and
// compares the whole fingerprint so tells groups apart without knowing of them.
typedef struct dt_fingerprint {
    uint64_t seq;   // DT_FP_SEQ | DT_FP_GROUP << 48
    uint64_t count; // elements (per rank for the *_gather/scatter/to_all kinds)
    int32_t  root;  // root rank, the tag for send/recv, -1 when meaningless
    uint8_t  coll;  // dt_coll
    uint8_t  dtype; // dt_dtype
    uint8_t  op;    // dt_reduce_op as the caller asked (AVG stays AVG here), 0 if none
    uint8_t  pad_;
} dt_fingerprint;

#define DT_FP_GROUP_SHIFT 48
#define DT_FP_MAX_GROUP   0x7fff
#define DT_FP_SEQ(fp)     ((fp)->seq & ((UINT64_C(1) << DT_FP_GROUP_SHIFT) - 1))
#define DT_FP_GROUP(fp)   ((uint32_t)((fp)->seq >> DT_FP_GROUP_SHIFT))

// True when `theirs` (from a peer) describes the same operation as `mine`; a send
// matches a recv with the same seq, count, dtype and tag.
bool dt_fp_match(const dt_fingerprint *mine, const dt_fingerprint *theirs);
// "all_reduce #42 (float32 sum, count 1000)"; "broadcast #7 (int64, count 3, root 1)";
// "send #2 (float32, count 5, tag 9)"; on a sub-group "all_reduce #3 on group 2 (...)".
// Returns buf.
const char *dt_fp_format(const dt_fingerprint *fp, char *buf, size_t n);

// One operation as the generic layer hands it to a backend. Read-only for backends.
typedef struct dt_op {
    dt_coll        kind;
    dt_fingerprint fp;  // the fingerprint to carry / compare (op as asked)
    const void    *src; // see each slot below for what src/dst hold
    void          *dst;
    size_t         count; // elements; per rank for the *_gather/scatter/to_all kinds
    dt_dtype       dtype;
    dt_reduce_op   op;    // never DT_REDUCE_AVG: the generic layer passes SUM
                          // and divides by the world size afterwards
    int      root;        // broadcast/reduce/gather/scatter; -1 otherwise
    int      peer;        // send/recv; -1 otherwise
    int      tag;         // send/recv; 0 otherwise
    uint64_t deadline_ns; // dt_now_ns() clock; UINT64_MAX = no limit. Past it the
                          // backend returns DT_ERR_TIMEOUT (dt_op_fail_timeout)
    char name[72];        // "all_reduce #42", "send #3 to rank 1", "barrier #2 on
                          // group 3": message prefix
} dt_op;

// -------------------------------------------------------------- point-to-point slots

// One message to or from one peer, posted by a generic algorithm. The generic layer
// owns the struct (it lives until the transfer completes or the op fails); `priv_`
// belongs to the backend.
typedef struct dt_xfer {
    int      peer; // the other rank
    bool     is_send;
    uint32_t step; // algorithm id << 24 | step index: carried on the wire and
                   // compared by the receiver (catches ranks running different
                   // algorithms, e.g. with different DT_ALLREDUCE_ALGO)
    void  *buf;    // send: data to send (not modified); recv: where it lands
    size_t nbytes; // sender's and receiver's nbytes must be equal (else MISMATCH)
    bool   done;   // set by the backend when complete
    // Backend scratch, untouched by the generic layer:
    struct dt_xfer *next_;       // queue link
    size_t          done_bytes_; // progress
    uint64_t        priv_[4];
} dt_xfer;

// ---------------------------------------------------------------------- the backend

typedef struct dt_backend_ops {
    const char *name; // "tcp", "shm": the name dt_pg_opts.backend selects

    // Whether the backend can serve this group; consulted by "auto" after the ranks
    // exchanged their host identities (e.g. shm: dt_pg_all_local(pg)). Every rank must
    // get the same answer from the same inputs. (optional: NULL = always)
    bool (*usable)(const dt_pg *pg);

    // COLLECTIVE: every rank calls it once, from the thread inside dt_pg_new. Sets up
    // connections or shared segments through `store` (a view private to this backend
    // and group: key names need no prefix) and returns the backend's state in *ctx.
    // Must give up by deadline_ns with DT_ERR_TIMEOUT naming the ranks it waited for.
    dt_status (*init)(dt_pg *pg, dt_store *store, uint64_t deadline_ns, void **ctx);
    // Releases everything, after the last operation; also after a failure or abort.
    // Must not block long (< ~1 s). NULL ctx never happens.
    void (*free)(void *ctx);

    // Called once, right after an operation of this backend failed (or the group was
    // aborted), before the group is poisoned: tell the peers (best effort, bounded
    // ~100 ms) so that ranks that are waiting on someone else fail fast too, and drop
    // every posted transfer. `st` and `msg` are the failure ("all_reduce #42: rank 3
    // closed the connection"). (optional)
    void (*abort)(void *ctx, dt_status st, const char *msg);

    // A sub-group (dt_pg_new_group, dt_pg_split; group.c). COLLECTIVE over the parent:
    // every rank of the parent calls it once, on the parent's execution lane (no
    // operation of any group runs meanwhile), with `group` NULL on ranks that are in
    // no new group (color < 0). `parent_ctx` is the parent's state (NULL when the
    // parent has one rank and the backend made none); `store` a view private to the
    // new group (NULL outside it); the group's ranks are ordered by (key, parent rank)
    // as MPI_Comm_split orders them. *ctx may stay NULL (nothing needed, e.g. for a
    // group of one rank). (optional: NULL = the group runs the generic algorithms over
    // the world's xfer_post / xfer_wait, with its ranks translated to the world's and
    // its id in every fingerprint: no new connection. Such a backend must then leave
    // every collective slot below NULL.)
    dt_status (*group_new)(void *parent_ctx, dt_pg *group, dt_store *store, int color, int key,
                           uint64_t deadline_ns, void **ctx);

    // Point-to-point transfers for the generic algorithms. xfer_post starts a transfer
    // without blocking (the backend keeps the pointer until it completes or abort);
    // xfer_wait makes progress on every posted transfer until `x` is done, the deadline
    // of `op` passes (DT_ERR_TIMEOUT), a peer fails (DT_ERR_PEER) or the fingerprint
    // or size of an incoming message differs (DT_ERR_MISMATCH). Transfers between two
    // ranks in one direction are matched in posting order. Messages must flow even
    // when nbytes is 0 (they carry the fingerprint). (optional when every collective
    // slot below is set; the tcp backend has them, shm may not)
    dt_status (*xfer_post)(void *ctx, const dt_op *op, dt_xfer *x);
    dt_status (*xfer_wait)(void *ctx, const dt_op *op, dt_xfer *x);

    // Whole collectives (each optional: NULL = the generic algorithm over xfer_*).
    // Called with world size >= 2 only. Buffers as in comm.h: all_reduce src/dst
    // count; broadcast dst (= buf); reduce src, dst (root only); all_gather src
    // (count), dst (world*count); reduce_scatter src (world*count), dst (count);
    // gather src, dst (root only); scatter src (root only), dst; all_to_all src, dst
    // (world*count each); barrier none; send src; recv dst. In-place forms as in comm.h.
    dt_status (*all_reduce)(void *ctx, const dt_op *op);
    dt_status (*broadcast)(void *ctx, const dt_op *op);
    dt_status (*reduce)(void *ctx, const dt_op *op);
    dt_status (*all_gather)(void *ctx, const dt_op *op);
    dt_status (*reduce_scatter)(void *ctx, const dt_op *op);
    dt_status (*gather)(void *ctx, const dt_op *op);
    dt_status (*scatter)(void *ctx, const dt_op *op);
    dt_status (*all_to_all)(void *ctx, const dt_op *op);
    dt_status (*barrier)(void *ctx, const dt_op *op);
    dt_status (*send)(void *ctx, const dt_op *op);
    dt_status (*recv)(void *ctx, const dt_op *op);

    // True when the backend calls dt_pg_progress while it waits inside an operation
    // (at least every ~500 ms): the liveness thread then takes an operation that makes
    // no progress for DT_LIVENESS_MS as a stuck communication thread. False for a
    // backend that blocks in calls it cannot interrupt (mpi's blocking mode).
    bool reports_progress;

    // False for a placeholder of a backend not built into this library (see
    // unbuilt_backends.c); "auto" skips it and asking for it is DT_ERR_UNSUPPORTED.
    bool built;
} dt_backend_ops;

// The backends. pg.c lists them; a backend not built into the library is replaced by
// a weak placeholder (unbuilt_backends.c).
extern const dt_backend_ops dt_backend_tcp;
extern const dt_backend_ops dt_backend_shm;

// ---------------------------------------------- what a backend may use from the group
// (plus the public dt_pg_rank, dt_pg_size, dt_pg_local_rank, dt_pg_local_size)

// True when every rank of the group runs on this host (same host identity).
bool dt_pg_all_local(const dt_pg *pg);
// The host identity of `rank` ("<hostname>/<boot id>"), exchanged at init; borrowed.
const char *dt_pg_host_id(const dt_pg *pg, int rank);
// The group's timeout in ms (< 0 = none).
int64_t dt_pg_timeout_ms(const dt_pg *pg);
// True once the group was aborted or poisoned. Cheap (one atomic load), any thread:
// a backend waiting in a spin or futex loop checks it at least every ~10 ms.
bool dt_pg_aborted(const dt_pg *pg);
// A file descriptor that becomes readable when the group is aborted or poisoned: a
// backend waiting in poll() adds it to its set. Never read it; owned by the group.
int dt_pg_abort_fd(const dt_pg *pg);
// Reports a failure noticed outside an operation (e.g. by a watcher thread of the
// backend): poisons the group from any thread, as dt_pg_abort does with `st`.
void dt_pg_fail(dt_pg *pg, dt_status st, const char *fmt, ...) DT_PRINTF(3, 4);

// Called by a backend while it waits or works inside an operation, at least every
// ~500 ms (tcp: every turn of its poll loop; shm: every futex slice and chunk), when it
// sets reports_progress. Cheap: one relaxed atomic add.
void dt_pg_progress(dt_pg *pg);

// Error helpers: record the message on the calling thread and return the status.
// "<op name>: <formatted message>"
dt_status dt_op_fail(const dt_op *op, dt_status st, const char *fmt, ...) DT_PRINTF(3, 4);
// DT_ERR_PEER "<op name>: rank <peer> <what>" (what: "closed the connection", ...).
dt_status dt_op_fail_peer(const dt_op *op, int peer, const char *what);
// DT_ERR_MISMATCH "<op name>: rank <peer> called <their fp> but this rank (<me>)
// called <my fp>; every rank must issue the same collectives in the same order".
dt_status dt_op_fail_mismatch(const dt_op *op, int peer, const dt_fingerprint *theirs);
// DT_ERR_TIMEOUT "<op name>: timed out after <ms> ms waiting for <waiting_for>".
dt_status dt_op_fail_timeout(const dt_op *op, const char *waiting_for);
// Milliseconds until the op's deadline for poll(): 0 when past, -1 when none, at most
// `cap_ms` when cap_ms >= 0.
int dt_op_poll_ms(const dt_op *op, int cap_ms);

#endif // DTRAIN_COMM_BACKEND_H
