// algo.h: the algorithm layer of src/comm, between the process group (pg.c, which
// checks, stamps and queues an operation) and the transports of backend.h. Every
// operation of every backend comes through dt_algo_run, where one decision table per
// collective (table.c) picks the algorithm by size, world and what the group's
// transport offers, and runs it:
//
//   family    runs over                          file        backends offering it
//   native    the backend library's whole call   (backend)   mpi (nccl: docs/comm-backend.md)
//   hier      two transports, node then cross    table.c     hybrid
//   shm       a shared-memory segment            staged.c    shm
//   ring ...  point-to-point transfers           p2p.c       tcp, shm, mpi, hybrid
//
// DT_ALLREDUCE_ALGO and its siblings (DT_BROADCAST_ALGO, ...: docs/comm.md) force a
// family on every backend that offers its transport; a group whose transport lacks it
// is refused when it is created. Every rank makes the same choice from the same
// arguments, and the ranks agree on the settings at the rendezvous (pg_init.c).
#ifndef DTRAIN_COMM_ALGO_H
#define DTRAIN_COMM_ALGO_H

#include "comm/backend.h"

// Algorithm ids of the point-to-point family, carried in dt_xfer.step (bits 24..31):
// part of tcp's wire format, so only ever appended to.
enum {
    DT_ALGO_RING = 1,
    DT_ALGO_RDOUBLE,
    DT_ALGO_TREE,
    DT_ALGO_CHAIN,
    DT_ALGO_DIRECT,
    DT_ALGO_PAIRWISE,
    DT_ALGO_DISSEMINATION,
};

// Tunables read once per group from the environment (docs/comm.md), and the scratch the
// algorithms reuse across operations (the steady state allocates nothing).
typedef struct dt_algo_cfg {
    const char *forced[DT_COLL_COUNT_]; // per kind: the algorithm DT_*_ALGO forces (NULL: auto)
    size_t      segment_bytes;          // ring/chain segment size (DT_SEGMENT_BYTES)
    size_t      small_bytes;            // auto: below this many bytes, latency algorithms
    size_t      hier_min_bytes;         // auto: hier all_reduce from this many bytes
    size_t      hier_bcast_min_bytes;   // auto: hier broadcast from this many bytes
    int         slots;                  // receive slots in flight in the ring
    size_t      ring_lag; // ring wire order: segment j of step s follows j + lag of step s-1
    // Grow-only buffers:
    void    *slot_buf; // slots * segment_bytes: ring receive slots
    size_t   slot_cap;
    void    *part_buf; // partial results (reduce_scatter, reduce, recursive doubling)
    size_t   part_cap;
    dt_xfer *xfers;
    size_t   xfer_cap;
    uint8_t *ready_buf; // ring: per transfer, received and (reduce-scatter) reduced
    size_t   ready_cap;
    void    *hier_buf; // hier: the padded copy of the buffer
    size_t   hier_cap;
} dt_algo_cfg;

dt_status dt_algo_cfg_init(dt_algo_cfg *cfg);
void      dt_algo_cfg_free(dt_algo_cfg *cfg);

// At a group's creation: DT_ERR_UNSUPPORTED when a forced family needs a transport the
// group lacks ("DT_ALLREDUCE_ALGO=shm: backend tcp has no shared-memory segment; here:
// auto, rdouble, ring"). `backend` names the backend in that message.
dt_status dt_algo_check(const dt_xport *t, const dt_algo_cfg *cfg, const char *backend);

// Runs one operation of a group of t->world >= 2 ranks. An AVG comes as op->op SUM with
// fp.op AVG: the sum is divided by the world size here (or the op goes to a library
// that averages itself, dt_xport.run_avg); op->op AVG itself (the shm engine's own
// test) is averaged by the kernels.
dt_status dt_algo_run(const dt_xport *t, dt_algo_cfg *cfg, const dt_op *op);

// The name of the algorithm dt_algo_run would run ("ring", "shm", "native", ...), for
// traces and tests.
const char *dt_algo_chosen(const dt_xport *t, const dt_algo_cfg *cfg, const dt_op *op);

// ---------------------------------------------------- the families (for table.c)

// p2p.c: algorithm `id` (DT_ALGO_*) over t's transfer slots.
dt_status dt_algo_p2p(const dt_xport *t, dt_algo_cfg *cfg, const dt_op *op, int id);

// staged.c: the shared-memory algorithms over a segment. all_reduce and reduce have two:
// one synchronisation for small buffers (dt_algo_staged_flat_fits), chunks streamed
// through the working buffers for large ones.
typedef enum dt_staged_id { DT_STAGED_FLAT = 1, DT_STAGED_CHUNKED } dt_staged_id;
bool      dt_algo_staged_flat_fits(const dt_shm *seg, const dt_op *op);
dt_status dt_algo_staged(dt_shm *seg, const dt_op *op, dt_staged_id id);

#endif // DTRAIN_COMM_ALGO_H
