// strategy.h: the one seam between the trainer (src/train) and the ways of spreading a
// training step over ranks and threads, which live beside each other in src/parallel
// and src/ddp: DDP (its bucketed all-reduce, compression, PowerSGD), ZeRO stages 1-3,
// a parameter server's worker (ps.h),
// DataParallel threads (dp.c), uneven inputs (DDP's join), and the dp x pp x tp mesh
// (mesh.c, pipe.c, tp.c: the norm over the model's parts, the replicas of each part).
// The trainer hands over the parameters once and then calls the strategy at the fixed
// points of a step, without knowing which of them runs:
//
//     dt_strategy_new                              the parameters wrapped (dt_trainer_prepare)
//     per micro-batch:  dt_strategy_share_buffers  at a window's first
//                       dt_strategy_set_sync       the window's last one reduces
//                       dt_strategy_loss_over      the divisor of the loss's mean
//                       dt_strategy_forward_backward    (DataParallel programs)
//     per step:         dt_strategy_reduce         the mean gradient over ranks and window
//                       dt_strategy_clip           the global norm
//                       dt_strategy_step           the optimizer step
//     at the end:       dt_strategy_share_buffers, dt_strategy_check_replicas
#ifndef DTRAIN_PARALLEL_STRATEGY_H
#define DTRAIN_PARALLEL_STRATEGY_H

#include "dtrain/ddp.h"
#include "dtrain/dp.h"
#include "dtrain/mesh.h"
#include "dtrain/pipe.h"
#include "dtrain/zero.h"

typedef struct dt_strategy dt_strategy;

typedef struct dt_strategy_opts {
    dt_zero_opts  zero;              // stage 0: DDP over the group; 1-3: ZeRO's stage (and plan)
    bool          overlap;           // DDP: reduce buckets during backward
    bool          tree_reduce;       // DDP: sum ranks in comm's tree order (the model's shards)
    const char   *compress;          // DDP's gradient compression: none, bf16, fp16, powersgd
    int           powersgd_rank;     // PowerSGD's rank
    bool          broadcast_buffers; // rank 0's buffers at each window's start and at the end
    bool          join;              // uneven inputs: gradients summed over samples after backward
    int           data_parallel;     // DataParallel replicas in threads (1: none)
    int           threads;           // this process's compute threads (the replicas share them)
    struct dt_ps *ps;                // a parameter server's worker (ps.h; borrowed): the step
                                     // pushes gradients and pulls parameters, no DDP
} dt_strategy_opts;

// What dt_strategy_new did, for the trainer's messages.
typedef struct dt_strategy_info {
    int    zero_stage;                // 0: none
    size_t optim_floats, full_floats; // this rank's optimizer state, and unsharded
} dt_strategy_info;

// Wraps p (with storage) and opt over `dp` (the group the data is sharded over; NULL:
// this process alone). `world` is the whole group (the norm and the replicas' check on a
// mesh), `mesh` and `pipe` the model's partition (NULL: the whole model on every rank).
// All are borrowed. Collective over dp.
dt_status dt_strategy_new(dt_strategy **out, dt_params *p, dt_optim *opt, dt_pg *world, dt_pg *dp,
                          const dt_mesh *mesh, dt_pipe *pipe, const dt_strategy_opts *o,
                          dt_strategy_info *info /* out, may be NULL */);
void      dt_strategy_free(dt_strategy *s); // NULL-safe

// Rank 0's buffers to every rank with broadcast_buffers (PyTorch DDP's): at each
// window's first micro-batch and at the end of training. COLLECTIVE.
dt_status dt_strategy_share_buffers(dt_strategy *s);
// Whether this micro-batch's backward ends the window (its reduction runs then).
void dt_strategy_set_sync(dt_strategy *s, bool sync);
// The divisor of the mean loss of this rank's micro-batch of n samples: n, or, under
// DDP's tree reduction (--invariant) in the plain loop, the global micro-batch (n times
// the ranks), and DDP then sums the ranks' gradients instead of averaging them until the
// window's reduction (dt_strategy_reduce): each sample's gradient has one divisor on
// every world size, so worlds that are not a power of two stay bitwise too.
size_t dt_strategy_loss_over(dt_strategy *s, size_t n);
// DataParallel: the program's replicas (dp.h). forward_backward runs ops->work on the
// master alone (data_parallel 1: the plain loop) or on the replicas, each on its slice
// (rng: the epoch's dropout stream), and reports the master's gradients for reduction.
dt_status dt_strategy_set_replicas(dt_strategy *s, const dt_dp_ops *ops,
                                   const dt_dp_replica *master);
dt_status dt_strategy_forward_backward(dt_strategy *s, const dt_batch *b, const dt_rng *rng,
                                       float *loss);
// The parameters' gradients are final (computed elsewhere: the replicas, a device):
// each tensor reported to the reduction, last first, as a backward reports them.
dt_status dt_strategy_grads_ready(dt_strategy *s);
// Whether forward_backward has run the replicas in threads (data_parallel > 1).
bool dt_strategy_replicas_ran(const dt_strategy *s);
// One step of a pipeline (dt_pipe_step), the strategy's reductions around it.
dt_status dt_strategy_pipe_step(dt_strategy *s, const void *const *inputs, int batch,
                                const uint64_t *keys, dt_pipe_loss_fn loss, void *user,
                                float *loss_out);

// The window's gradient: the mean over ranks and over its `window` micro-batches (join:
// the sum over the `samples` this rank had in it, divided by every rank's). COLLECTIVE.
dt_status dt_strategy_reduce(dt_strategy *s, int window, int64_t samples);
// The global gradient norm (each tensor once over shards, parts and replicas), clipped
// to max_norm. COLLECTIVE.
dt_status dt_strategy_clip(dt_strategy *s, float max_norm, float *norm);
// The optimizer step (ZeRO: this rank's shard, then the parameters gathered).
dt_status dt_strategy_step(dt_strategy *s);

// The replicas hold the same parameters: *crc this rank's CRC32C; `what` receives
// "Parameters identical on all 4 ranks (CRC32C ...)" or the mesh's or ZeRO-3's form
// (empty without a group). COLLECTIVE.
dt_status dt_strategy_check_replicas(dt_strategy *s, uint32_t *crc, char *what, size_t n);
// Asynchronous parameter servers' workers (collective over them): the servers' model,
// every push applied, on every worker (before an evaluation, a save, the end). A no-op
// otherwise, and when no push came since the last settle (the epoch's end settles once
// for the evaluation, the replica check and the save).
dt_status dt_strategy_settle(dt_strategy *s);
// --zero 3: the whole parameters on `root` (-1: every rank) and given back after; a
// parameter server's worker: the servers' optimizer state, on every worker. For a save.
dt_status dt_strategy_gather_params(dt_strategy *s, int root);
dt_status dt_strategy_release_params(dt_strategy *s);
// This rank's state at its peak and the payload of one step, in bytes (train.h's
// dt_trainer_state_bytes); seconds waited for reductions (and ZeRO's gathers).
void   dt_strategy_state_bytes(const dt_strategy *s, double *peak, double *moved_per_step);
double dt_strategy_wait_secs(const dt_strategy *s);

#endif // DTRAIN_PARALLEL_STRATEGY_H
