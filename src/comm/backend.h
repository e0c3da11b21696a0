// backend.h: the seam between the process group and a backend, each in a folder of its
// own (tcp/, shm/, mpi/, hybrid/). A backend is one `const dt_backend_ops` table; what it
// offers the algorithm layer (algo/algo.h) is a transport (dt_xport below): point-to-point
// transfers, a shared-memory segment, whole operations of its own library, or two
// levels of those. The generic layer owns argument checks, sequence numbers,
// fingerprints, deadlines, AVG, world size 1, the progress thread, poisoning, and the
// algorithms with the tables that choose them.
// docs/comm-backend.md explains how a backend plugs in; read it with this file.
#ifndef DTRAIN_COMM_BACKEND_H
#define DTRAIN_COMM_BACKEND_H

#include "comm/op.h"

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
    uint64_t        priv_[8];
} dt_xfer;

// ------------------------------------------------------------------- the transport

typedef struct dt_shm   dt_shm; // shm's engine (shm/shm.h)
typedef struct dt_xport dt_xport;

// What a group's algorithms may run over; the generic layer fills it from the backend's
// slots (and its xport slot) when the group is made. Every part is optional; a backend
// offers at least transfers or whole operations.
struct dt_xport {
    int rank, world; // of the group
    // Point-to-point transfers (xfer_post / xfer_wait of a backend state). peers[r] is
    // the rank that group rank r has for those slots (a sub-group over its world's
    // connections); NULL: the same.
    dt_status (*xfer_post)(void *ctx, const dt_op *op, dt_xfer *x);
    dt_status (*xfer_wait)(void *ctx, const dt_op *op, dt_xfer *x);
    bool (*xfer_ready)(void *ctx, int peer); // NULL: dt_pg_wait_any is unsupported
    void      *xfer_ctx;
    const int *peers;
    // Whole operations done by the backend's library (mpi; nccl), for the kinds in
    // run_kinds (bit 1 << dt_coll; 0 = every kind).
    dt_status (*run)(void *ctx, const dt_op *op);
    void    *run_ctx;
    uint32_t run_kinds;
    bool     run_avg;
    // A shared-memory segment of the group's ranks (shm).
    dt_shm *seg;
    // Two levels (hybrid): `node`, the ranks of this host (node->rank is the local index
    // l, node->world = L), and `cross`, the ranks of local index l on every host
    // (cross->rank is the host's index h, cross->world = H); rank = h * L + l is not
    // assumed: each level carries its own ranks. host_of[r] and local_of[r] are group
    // rank r's host index and local index (where a rooted collective's root sits).
    const dt_xport *node, *cross;
    const int      *host_of, *local_of;
};

// ---------------------------------------------------------------------- the backend

typedef struct dt_backend_ops {
    const char *name; // "tcp", "shm": the name dt_pg_opts.backend selects

    // Whether the backend can serve this group, after the ranks exchanged their host
    // identities (shm: dt_pg_all_local(pg)). for_auto: whether "auto" should pick it
    // (backends.c lists them in auto's order of preference; hybrid serves one host
    // when asked by name, but auto wants it only across hosts). When it cannot serve, it
    // says why in why[n] (why may be NULL). Every rank must get the same answer from the
    // same inputs. (optional: NULL = always)
    bool (*usable)(const dt_pg *pg, bool for_auto, char *why, size_t n);

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
    // group of one rank). (optional: NULL = the group's transport is the world's
    // transfer slots with its ranks translated (dt_xport.peers) and its id in every
    // fingerprint: no new connection; the backend's run and xport are not used for it.)
    dt_status (*group_new)(void *parent_ctx, dt_pg *group, dt_store *store, int color, int key,
                           uint64_t deadline_ns, void **ctx);

    // Point-to-point transfers for the generic algorithms. xfer_post starts a transfer
    // without blocking (the backend keeps the pointer until it completes or abort);
    // xfer_wait makes progress on every posted transfer until `x` is done, the deadline
    // of `op` passes (DT_ERR_TIMEOUT), a peer fails (DT_ERR_PEER) or the fingerprint
    // or size of an incoming message differs (DT_ERR_MISMATCH). Transfers between two
    // ranks in one direction are matched in posting order. Messages must flow even
    // when nbytes is 0 (they carry the fingerprint). Every algorithm but "native" and
    // "shm" runs over them. (optional when run is set, but then DT_*_ALGO can force
    // nothing else; tcp, shm, mpi and hybrid have them)
    dt_status (*xfer_post)(void *ctx, const dt_op *op, dt_xfer *x);
    dt_status (*xfer_wait)(void *ctx, const dt_op *op, dt_xfer *x);
    // Whether a receive from `peer` posted now would find something without waiting:
    // the start of a message from it, or the end of its connection (the receive then
    // reports why). Never waits; the caller holds the lane; no receive is posted. What
    // dt_pg_wait_any polls. (optional: NULL = unsupported; tcp, shm, hybrid have it)
    bool (*xfer_ready)(void *ctx, int peer);

    // A whole operation done by the backend's own library (optional): the "native"
    // algorithm of the tables (algo/table.c), which auto picks wherever the backend has
    // it, for the kinds in run_kinds. op->kind says which: every collective, send, recv,
    // and DT_COLL_INIT (the init barrier, run as a barrier). Called with world size >= 2
    // only. Buffers as in comm.h: all_reduce src/dst count; broadcast dst (= buf); reduce
    // src, dst (root only); all_gather src (count), dst (world*count); reduce_scatter src
    // (world*count), dst (count); gather src, dst (root only); scatter src (root only),
    // dst; all_to_all src, dst (world*count each); barrier and init none; send src; recv
    // dst. In-place forms as in comm.h. An all_reduce in tree order (op->fp.order) never
    // comes here: the tables run it where they know the order.
    dt_status (*run)(void *ctx, const dt_op *op);
    // The kinds `run` serves, bit 1 << dt_coll (0 = every kind); the others run the
    // generic algorithms over the transfer slots.
    uint32_t run_kinds;
    // True when `run` averages itself (NCCL's ncclAvg, on the device): it then gets
    // op->op == DT_REDUCE_AVG. False: it gets SUM, and the algorithm layer divides the
    // result on the host afterwards (dt_reduce_div).
    bool run_avg;

    // Adds what else the backend offers the algorithms to the transport of a group whose
    // state is ctx (shm: its segment; hybrid: its two levels); the generic layer has
    // filled rank, world and the slots above. (optional)
    void (*xport)(void *ctx, dt_xport *t);

    // Sends handed to the transport that the backend still holds after `run` returned
    // (shm: the tail of a message larger than its channel, moved as the receiver makes
    // room; mpi: an MPI_Isend that MPI may move only while it is called). comm.h promises
    // that such a send arrives without further calls by the sender, so the generic layer
    // moves them: the progress thread calls push while the lane is idle (polling with a
    // backoff until nothing is held), the shm engine's waits call it through
    // dt_pg_push_sends (a tcp world holds no send, an mpi world's groups are all mpi,
    // whose waits move every communicator's requests), and dt_pg_free calls flush
    // before free. Both run on the lane (no operation of the process runs
    // meanwhile). (optional, both or neither: NULL = a send is wholly in the transport
    // when run or xfer_wait returns, as on tcp)
    // push: moves what it can without waiting; sets *moved when it moved something;
    // returns true while sends remain held (false after a failure: nothing will move).
    bool (*push)(void *ctx, bool *moved);
    // flush: waits until no send is held, until deadline_ns (DT_ERR_TIMEOUT), or until a
    // receiver dies or leaves (DT_ERR_PEER); the message names the send and the receiver.
    // DT_OK at once after a failure of the group (it was reported already).
    dt_status (*flush)(void *ctx, uint64_t deadline_ns);

    // True when the backend calls dt_pg_progress while it waits inside an operation
    // (at least every ~500 ms): the liveness thread then takes an operation that makes
    // no progress for DT_LIVENESS_MS as a stuck communication thread. False for a
    // backend that blocks in calls it cannot interrupt (mpi's blocking mode).
    bool reports_progress;

    // False for a placeholder of a backend not built into this library (see
    // unbuilt_backends.c); "auto" skips it and asking for it is DT_ERR_UNSUPPORTED.
    bool built;
} dt_backend_ops;

// The backends. backends.c lists them; a backend not built into the library is replaced by
// a weak placeholder (unbuilt_backends.c).
extern const dt_backend_ops dt_backend_tcp;
extern const dt_backend_ops dt_backend_shm;
extern const dt_backend_ops dt_backend_hybrid;
extern const dt_backend_ops dt_backend_nccl; // nccl/: whole operations in the CUDA plugin

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
// Moves the sends that any backend of this process still holds (the push slot above),
// so that a send of one group never waits for an operation of another: a backend waiting
// inside an operation calls it between checks (the caller holds the lane). Returns true
// while some remain (a backend about to sleep then wakes up soon to call it again).
// Cheap when nothing is held: one atomic load.
bool dt_pg_push_sends(dt_pg *pg);

#endif // DTRAIN_COMM_BACKEND_H
