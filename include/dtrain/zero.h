// zero.h: ZeRO data parallelism (Rajbhandari et al. 2020; DeepSpeed's ZeRO stages,
// PyTorch's ZeroRedundancyOptimizer and FSDP's SHARD_GRAD_OP). Like DDP (ddp.h) every
// rank holds the whole parameters and computes gradients on its share of the batch, but
// the optimizer state is cut into one shard per rank: each rank averages and keeps only
// its shard of the gradients, steps the optimizer on its shard of the parameters (with
// state for that shard only: 1/N of DDP's), and the updated shards are all-gathered so
// every rank holds the whole new parameters again.
//
//     dt_optim *opt;
//     dt_adamw_new(&opt, params, &ao);                         // over the whole table,
//     dt_optim_add_group(opt, dt_param_no_decay, NULL, &nd, NULL); // groups as usual
//     dt_zero *z;
//     dt_zero_opts zo = dt_zero_opts_default();                // stage 2
//     dt_zero_new(&z, params, pg, opt, &zo);                   // collective: broadcasts,
//                                                              // shards the optimizer
//     for each step:
//         dt_params_zero_grad(params); forward; loss; backward;  // stage 2: buckets are
//                                                                // reduce-scattered now
//         dt_zero_sync(z);                        // this rank's shard of the average
//         dt_zero_clip_grad_norm(z, 1.0f, &norm); // the global norm, over every shard
//         dt_zero_step(z);                        // step the shard, all-gather parameters
//
// Shards. The gradient buffer is cut into DDP's buckets (reverse parameter order, the
// first 1 MiB, then 25 MiB). A bucket of c floats at offset a, over N ranks, with
// q = floor(c / N): rank r owns floats [a + r q, a + (r + 1) q), and every rank owns the
// remainder [a + N q, a + c) (fewer than N floats, so nothing is padded on the wire: the
// remainder is all-reduced and stepped identically on every rank). With one bucket
// holding the whole model the shard of rank r is the r-th contiguous N-th of the flat
// buffer. A rank's shard is described by a table of its own (dt_zero_shard_params): one
// tensor per piece of a parameter tensor that falls in it, with the tensor's name and
// flags, in bucket order. The parameters are never copied: the optimizer updates the
// pieces in place in the whole buffer and the all-gather fills in the other ranks'. The optimizer,
// sharded by dt_optim_shard, keeps each piece in its tensor's group (weight decay groups see whole
// tensors) and its element-wise state (Adam's m and v) for the shard's floats alone: element-wise
// rules need nothing else.
//
// Stage 1 reduce-scatters every bucket in dt_zero_sync, after backward; stage 2
// reduce-scatters each bucket as soon as backward reports its last gradient
// (dt_params_grad_ready), overlapping backward as DDP does. Both reduce in place: after
// dt_zero_sync, this rank's shard of the whole gradient buffer holds the average over
// ranks and the rest holds this rank's own gradients, which nothing reads. No buffer is
// added: the whole gradient buffer is backward's output and the reduce-scatter's (docs/
// zero.md says what that means for memory).
//
// Checkpoints (ckpt.h) of a sharded optimizer gather the shards into the whole state,
// written in the same format as DDP's; loading takes this rank's shard out of it, so a
// checkpoint saved at one world size loads at any other (dt_ckpt_opts.reshard), and
// plain DDP's checkpoints load into ZeRO and back.
//
// A loss scaler (optim.h) works on the whole table: after dt_zero_sync,
// dt_grad_scaler_unscale(sc, params) (with dt_ddp_agree_inf, every rank sees any rank's
// inf), then dt_zero_step unless dt_grad_scaler_found_inf, then dt_grad_scaler_update.
// (dt_grad_scaler_step would unscale the optimizer's shard table, which has no storage:
// DT_ERR_ARG.)
//
// Stage 3 (FSDP's FULL_SHARD) shards the parameters and gradients too. Rank r owns the
// floats [own_r, own_r+1) of the flat buffers, own_r = r numel / N rounded down to whole
// pages (shard_align), and keeps only those written: its optimizer state, parameters
// and gradients are 1/N of DDP's. The rest of both buffers stays mapped (the layers'
// views do not move) but given back to the system (dt_params_discard). The provider
// (the graph: dt_params_announces_use) announces each step of a forward and backward
// (params.h's parameter-use hook), and ZeRO-3 brings in the units holding the tensors
// that step reads: units are runs of whole nodes' tensors, each closed once it holds
// unit_bytes. A unit is gathered by one broadcast per rank whose range it meets, from
// that rank, in place; it stays until a step needs other units, then its pages are
// given back. The next unit of the pass (the first pass of each kind records the order)
// is gathered on the progress thread while the current one computes. After a backward
// step, the unit's gradients are reduced (summed) to their owners in place, in the
// background, and the rest given back. A tied tensor (a GPT's head and wte) is simply
// gathered again, and its gradient reduced after each use: the owner's range sums them.
// max_live_bytes bounds the units gathered and gradients unreduced at once (prefetch is
// skipped and reductions waited for to stay below it), trading overlap for memory;
// every decision depends only on sizes and the recorded order, so every rank issues the
// same collectives. dt_zero_sync waits for the reductions and scales this rank's range
// by 1/N; dt_zero_step steps it (no all-gather: the next forward gathers what it
// reads). dt_zero_set_sync(false) only defers that wait: stage 3 reduces every backward
// (micro-batches add into the owner's range), so gradients stay sharded. Checkpoints:
// dt_zero_params_gather brings the whole parameters to one rank (or all) for
// dt_ckpt_save or a saved model, dt_zero_params_release gives them back; after
// dt_ckpt_load (which writes every float) release them too.
//
// Every call that talks to other ranks is collective. A rank that fails in a collective
// aborts the group, so every other rank fails at once, naming it (comm.h). Under stage
// 3 a forward or backward step is such a call: a rank that dies or freezes makes every
// other rank's gather or reduction fail within the group's bound, naming it.
#ifndef DTRAIN_ZERO_H
#define DTRAIN_ZERO_H

#include "dtrain/comm.h"
#include "dtrain/optim.h"
#include "dtrain/params.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dt_zero dt_zero;

typedef struct dt_zero_opts {
    int    stage;              // 1, 2 or 3 (default 2); stage 0 is plain DDP (ddp.h)
    size_t bucket_cap_bytes;   // 0: 25 MiB (DDP's rule, ddp.h)
    size_t first_bucket_bytes; // 0: 1 MiB when the cap is the default, else the cap
    bool   broadcast_params;   // rank 0's parameters and buffers to every rank at start
                               // (default true)
    // Stage 3:
    size_t unit_bytes;     // a unit closes once it holds this much (0: 64 KiB)
    size_t max_live_bytes; // units' parameters gathered and gradients unreduced at once,
                           // whole units counted (0: no bound; then one unit is
                           // prefetched and two reductions at most are in flight)
    size_t shard_align;    // floats; rank ranges start at multiples (0: a page's worth)
    bool   track_resident; // measure the resident pages at each step (mincore; usage)
} dt_zero_opts;

DT_API dt_zero_opts dt_zero_opts_default(void);

// Wraps `params` (with storage) for ZeRO over `pg` and shards `opt`, an optimizer built
// over `params` (groups already added; its state so far, a loaded checkpoint's say, is
// kept for this rank's shard and the rest freed); all three are borrowed
// and must outlive the wrapper. Collective: checks that every rank has the same tensors
// (DT_ERR_MISMATCH naming the rank and the counts), broadcasts rank 0's parameters and
// buffers, and, with stage 2, registers a gradient-ready consumer on `params`.
// DT_ERR_ARG for a stage other than 1, 2 or 3, an optimizer over another table, or
// stage 3 over parameters whose provider does not announce their use (params.h).
// Stage 3 registers the parameter-use consumer, makes dt_params_zero_grad discard, and
// gives back the pages outside this rank's range.
DT_API dt_status dt_zero_new(dt_zero **out, dt_params *params, dt_pg *pg, dt_optim *opt,
                             const dt_zero_opts *opts);
// Waits for reductions still in flight; removes the consumer. The optimizer stays
// sharded (free it after). NULL-safe.
DT_API void dt_zero_free(dt_zero *z);

// Gradient accumulation (DDP's no_sync): with sync off, backward only accumulates into
// the whole gradient buffer and dt_zero_sync is a no-op.
DT_API void dt_zero_set_sync(dt_zero *z, bool sync);

// After backward: starts the reduce-scatters not started yet and waits for all;
// afterwards this rank's shard of the gradient buffer holds the average over ranks.
// Collective. Stage 2: a trainable tensor never reported ready is DT_ERR_STATE
// naming it (the group is aborted).
DT_API dt_status dt_zero_sync(dt_zero *z);

// The L2 norm of the whole averaged gradient (every shard's sum of squares, summed over
// ranks) and, like dt_clip_grad_norm, every shard gradient scaled by
// max_norm / (norm + 1e-6) when that is below 1; *norm (may be NULL) gets the norm, the
// same on every rank. A non-finite norm leaves the gradients alone. Collective.
// dt_zero_grad_norm only measures. DT_ERR_ARG unless max_norm is finite and > 0.
DT_API dt_status dt_zero_clip_grad_norm(dt_zero *z, float max_norm, float *norm);
DT_API dt_status dt_zero_grad_norm(dt_zero *z, float *norm);

// This rank's share of the sum of squares of the averaged gradient, each tensor's
// weighted by weight[tensor] (an index of the wrapped table; NULL: all 1): summed over
// the ranks it gives the weighted norm squared. Not collective (a model split further
// over other groups sums it over those too: the trainer's mesh, docs/parallel.md).
DT_API double dt_zero_shard_sumsq(const dt_zero *z, const float *weight);

// Steps the optimizer on this rank's shard (in place in the whole parameter buffer),
// then all-gathers the updated shards, so every rank holds the whole new parameters.
// Collective.
DT_API dt_status dt_zero_step(dt_zero *z);

// This rank's shard as a table of tensor pieces (names, flags; a description without
// storage: parameters and gradients stay in the whole buffers, piece k of the table at
// the offset dt_optim_sharded gives).
DT_API const dt_params *dt_zero_shard_params(const dt_zero *z);
DT_API int              dt_zero_stage(const dt_zero *z);
// Buckets: bucket i covers floats [offset, offset + count) of the whole buffers.
DT_API int  dt_zero_num_buckets(const dt_zero *z);
DT_API void dt_zero_bucket(const dt_zero *z, int i, size_t *offset, size_t *count);
// Seconds spent waiting in dt_zero_sync and in dt_zero_step's all-gather (stage 3: in
// the gathers of forward and backward steps), summed over calls, and the number of steps.
DT_API void dt_zero_stats(const dt_zero *z, double *sync_wait_s, double *gather_s, int64_t *steps);

// Multiplies this rank's shard of the gradients by s (gradient accumulation's mean over
// micro-batches, after dt_zero_sync): the rest of the buffer is not read.
DT_API void dt_zero_scale_grad(dt_zero *z, float s);

// Stage 3: the whole parameters on rank `root` (every rank with root -1), for a
// checkpoint or a saved model; collective. dt_zero_params_release gives every page
// outside this rank's range back (after it, or after a dt_ckpt_load). Both are no-ops
// in stages 1 and 2, whose ranks hold the whole parameters.
DT_API dt_status dt_zero_params_gather(dt_zero *z, int root);
DT_API dt_status dt_zero_params_release(dt_zero *z);

typedef struct dt_zero_usage {
    size_t shard_floats;        // this rank's share of the buffers (stage 3: its range)
    size_t state_bytes;         // parameters, gradients (stage 3: its range of each; else
                                // whole) and optimizer state held between steps
    size_t live_peak_bytes;     // stage 3: gathered units' parameters and unreduced
                                // gradients at most, whole units (as max_live_bytes)
    size_t resident_peak_bytes; // stage 3 with track_resident: parameter and gradient
                                // pages resident at most (mincore), plus optimizer state
    double moved_bytes;         // per rank, all steps: floats received in gathers and sent in
                                // reductions (stage 3), or a ring's share of the reduce-scatter
                                // and all-gather (1, 2), times 4
    int64_t steps, gathers, prefetches, reductions;
    int64_t over_limit; // stage 3: steps whose units alone exceeded max_live_bytes
} dt_zero_usage;
DT_API void dt_zero_get_usage(const dt_zero *z, dt_zero_usage *out);

// What a rank holds for `opts->stage` (0: plain DDP) at `world` ranks, before anything
// is built: parameters, gradients and optimizer state (opt's, over p) between steps,
// and for stage 3 the least working set (the largest unit's parameters and gradients),
// in bytes; the largest rank's. Stage 3's max_live_bytes must leave room for `working`.
typedef struct dt_zero_memory {
    size_t params, grads, optim, working, total;
} dt_zero_memory;
DT_API dt_status dt_zero_plan_memory(dt_params *p, dt_optim *opt, int world,
                                     const dt_zero_opts *opts, dt_zero_memory *out);

#ifdef __cplusplus
}
#endif
#endif // DTRAIN_ZERO_H
