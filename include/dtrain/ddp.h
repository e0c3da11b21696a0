// ddp.h: DistributedDataParallel. Where the parameters (params.h: a dt_model's, or any
// network's that describes its buffers) meet the process group (comm.h): every rank
// holds a replica; gradients are averaged over ranks during backward, so every replica
// takes the same optimizer step.
//
//     dt_ddp *ddp;
//     dt_ddp_new(&ddp, params, pg, NULL);        // collective: checks shapes, broadcasts
//     (params = dt_model_as_params(model) for a dt_model)
//     for each step:
//         dt_model_forward(...); loss ...; dt_model_zero_grad(model);
//         dt_model_backward(model, dloss);       // buckets start reducing during backward
//         dt_ddp_sync(ddp);                      // waits; gradients are now averages
//         dt_optim_step(opt);
//
// A hand-written backward reports each finished range with dt_params_grad_ready (whole
// tensors), exactly what dt_model_backward does per layer; a range that is never
// reported is an error in dt_ddp_sync, naming the tensor.
//
// Buckets are slices of the flat gradient buffer (no copies), formed as
// PyTorch forms them (torch/nn/parallel/distributed.py, reducer.cpp): parameters are
// walked in definition order, a bucket closes when its size reaches the limit (the
// first at 1 MiB, the others at the cap, 25 MiB by default), and the list is reversed,
// so bucket 0 holds the last parameters, whose gradients backward produces first. A
// bucket's all-reduce starts on the group's progress thread as soon as its last
// gradient is final, in bucket order on every rank, while backward goes on.
//
// The buckets, their ready tracking, the launch and the error handling are the one
// gradient reducer that ZeRO stages 1 and 2 use too (src/ddp/reducer.h). Every call here
// that talks to other ranks is collective: all ranks must make it, in the same order.
// Errors name what went wrong on which rank: a refused report (a range that cuts a
// tensor, a tensor reported twice) is returned by the dt_params_grad_ready that made it,
// so by the backward; a rank that fails in dt_ddp_sync aborts the group so the others
// fail at once instead of waiting.
#ifndef DTRAIN_DDP_H
#define DTRAIN_DDP_H

#include "dtrain/comm.h"
#include "dtrain/layer.h"
#include "dtrain/nn.h"
#include "dtrain/params.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dt_ddp dt_ddp;

// Gradient compression of the buckets' all-reduce (PyTorch's fp16_compress_hook and
// bf16_compress_hook): each rank divides its bucket by the world size in fp32 and
// rounds it to 16 bits; the 16-bit values are reduce-scattered (an all-to-all of
// 16-bit blocks, summed in fp32 in rank order and rounded to 16 bits again) and
// all-gathered, then widened back into the gradient buffer. Half the bytes of the fp32
// all-reduce on the wire; every rank gets the same bits. Error against the fp32
// average: at most about 2u times the mean of |gradient| over ranks, u = 2^-8 (bf16) or
// 2^-11 (fp16). fp16 overflows past 65504 (inf: a loss scaler skips that step) and
// loses values below 2^-24; bf16 keeps fp32's range.
typedef enum dt_ddp_compress {
    DT_DDP_COMPRESS_NONE = 0, // fp32 all-reduce
    DT_DDP_COMPRESS_BF16,
    DT_DDP_COMPRESS_FP16,
} dt_ddp_compress;

// "none", "bf16", "fp16" -> *out; DT_ERR_ARG naming the accepted names otherwise.
DT_API dt_status   dt_ddp_compress_parse(const char *name, dt_ddp_compress *out);
DT_API const char *dt_ddp_compress_name(dt_ddp_compress c);

// A communication hook (PyTorch's register_comm_hook): replaces each bucket's
// all-reduce. start is called when bucket `bucket` (floats grad[0, count)) is final, on
// the thread that reported its last gradient, in bucket order on every rank; it may
// queue asynchronous operations on pg and return the last one's handle in *work. finish
// (may be NULL) is called in dt_ddp_sync once *work has completed, in bucket order on
// every rank, and may run blocking collectives; when it returns, grad must hold the
// average over ranks. A start that leaves *work NULL has finished the bucket itself
// (finish is not called for it).
typedef struct dt_ddp_comm_hook {
    dt_status (*start)(void *state, dt_pg *pg, int bucket, float *grad, size_t count,
                       dt_work **work);
    dt_status (*finish)(void *state, dt_pg *pg, int bucket, float *grad, size_t count);
    void *state;
} dt_ddp_comm_hook;

// PowerSGD (Vogels et al. 2019; PyTorch's powerSGD_hook) as a comm hook. For each
// parameter matrix of a bucket (ndim >= 2, viewed as shape[0] x the rest, and only when
// rank r compresses it at least 2x: 2 r (n + m) <= n m), with this rank's error e:
//   M = grad + e;  P = M Q;  all-reduce P (average);  orthonormalise P's columns;
//   Q = M^T P;  all-reduce Q (average);  grad = P Q^T;  e = M - grad.
// Q is kept from step to step (warm start; the first Q is normal random from `seed`,
// the same on every rank). Vectors (biases) and matrices not worth compressing are
// all-reduced uncompressed, in the same message as P. The first start_iter steps are
// plain all-reduces (no error accumulates). Every rank gets the same bits.
typedef struct dt_powersgd_opts {
    int      rank;       // r, default 1
    int      start_iter; // default 0
    uint64_t seed;       // default 0
} dt_powersgd_opts;

typedef struct dt_powersgd dt_powersgd;

DT_API dt_powersgd_opts dt_powersgd_opts_default(void);
// State for the buckets of `params` over a group of `world` ranks (borrowed; params
// must outlive it). Pass dt_powersgd_hook(ps) as dt_ddp_opts.comm_hook.
DT_API dt_status               dt_powersgd_new(dt_powersgd **out, dt_params *params, int world,
                                               const dt_powersgd_opts *opts);
DT_API const dt_ddp_comm_hook *dt_powersgd_hook(dt_powersgd *ps);
// Floats on the wire per step (P, Q and the uncompressed part) against the fp32
// all-reduce's (the gradient count), summed over the last step's buckets.
DT_API void dt_powersgd_stats(const dt_powersgd *ps, size_t *sent_floats, size_t *full_floats);
DT_API void dt_powersgd_free(dt_powersgd *ps); // NULL-safe

typedef struct dt_ddp_opts {
    size_t bucket_cap_bytes;           // 0: 25 MiB (PyTorch's bucket_cap_mb=25)
    size_t first_bucket_bytes;         // 0: 1 MiB when the cap is the default, else the cap
                                       // (PyTorch's _DEFAULT_FIRST_BUCKET_BYTES rule)
    bool broadcast_params;             // rank 0's parameters to every rank at init (default true)
    bool overlap;                      // reduce buckets during backward (default true); false
                                       // reduces them all in dt_ddp_sync, for measuring overlap
    bool tree_reduce;                  // sum the ranks' gradients by a fixed tree over ranks
                                       // (rank r with r + N/2 first, then r + N/4, ...): with
                                       // the model's gradient shards (dt_model_set_grad_shards)
                                       // N ranks then give bitwise the one-process gradients
                                       // (for N not a power of two with dt_ddp_set_sum and
                                       // the loss divided by the global batch).
                                       // Buckets then all-reduce in comm's tree order
                                       // (dt_pg_all_reduce_ordered, DT_ORDER_TREE).
    dt_ddp_compress compress;          // 16-bit gradient all-reduce (default NONE); not with
                                       // tree_reduce
    const dt_ddp_comm_hook *comm_hook; // a hook of the caller's (borrowed; overrides
                                       // compress); NULL: none
} dt_ddp_opts;

DT_API dt_ddp_opts dt_ddp_opts_default(void);

// Wraps `params` (with storage) for data-parallel training over `pg`; both are borrowed
// and must outlive the wrapper. Collective. Checks that every rank has the same
// parameter and buffer tensors (count, names, shapes, trainability) — a mismatch is
// DT_ERR_MISMATCH on every rank, naming the first differing tensor with both shapes —
// then broadcasts rank 0's parameters and buffers, and registers a gradient-ready
// consumer on `params`. Frozen tensors (DT_PARAM_FROZEN) are broadcast but get no
// bucket and are never waited for. *out is NULL on failure.
DT_API dt_status dt_ddp_new(dt_ddp **out, dt_params *params, dt_pg *pg, const dt_ddp_opts *opts);
// Rank 0's non-trainable buffers (running statistics) to every rank. Collective. What
// dt_ddp_new does at start; PyTorch's broadcast_buffers=True does it every forward.
DT_API dt_status dt_ddp_broadcast_buffers(dt_ddp *ddp);
// Waits for reductions still in flight; removes the consumer. NULL is a no-op.
DT_API void dt_ddp_free(dt_ddp *ddp);

// Gradient accumulation (PyTorch's no_sync): with sync off, backward only accumulates
// locally; the first backward with sync on again reduces the accumulated gradients.
DT_API void dt_ddp_set_sync(dt_ddp *ddp, bool sync);
// Sum the ranks' gradients instead of averaging them (default off), from the next
// bucket started on: for gradients whose loss is already the mean over the global batch
// (nn.h, dt_loss_nll_over). With tree_reduce, each sample's gradient then has the same
// divisor on every world size, and a world of N ranks gives bitwise the gradients of one
// process for any N the shards' tree splits into, not only powers of two (the average
// would round once more, by 1/N). Ignored with a comm hook or compression.
DT_API void dt_ddp_set_sum(dt_ddp *ddp, bool sum);

// Completes the step's gradient averaging: starts what is not started yet (all
// buckets when overlap is off), waits for every bucket, and returns when the
// gradient buffer holds the average over ranks. Collective. A parameter that received
// no gradient in this backward is DT_ERR_STATE naming it (and the group is aborted so
// other ranks fail at once); a failed or timed-out reduction is its comm error. A
// no-op when sync is off.
DT_API dt_status dt_ddp_sync(dt_ddp *ddp);

// Marks floats [offset, offset + count) of the gradient buffer final for this backward,
// for this wrapper alone (dt_params_grad_ready tells every consumer). The range must
// cover whole parameter tensors.
DT_API dt_status dt_ddp_mark_ready(dt_ddp *ddp, size_t offset, size_t count);

// Buckets as formed: bucket i covers floats [offset, offset + count) of the buffers.
DT_API int  dt_ddp_num_buckets(const dt_ddp *ddp);
DT_API void dt_ddp_bucket(const dt_ddp *ddp, int i, size_t *offset, size_t *count);

// Seconds spent in dt_ddp_sync waiting for reductions (communication not hidden
// behind backward), summed over calls, and the number of synced steps.
DT_API void dt_ddp_stats(const dt_ddp *ddp, double *wait_s, int64_t *steps);

// The loss scaler's agreement callback (optim.h, dt_grad_scaler_opts.agree) over a
// process group: user is the dt_pg; *found_inf becomes the maximum of every rank's flag
// (one all-reduce of one float). Collective: every rank calls it once per step.
DT_API dt_status dt_ddp_agree_inf(void *pg, float *found_inf);

// SyncBatchNorm: makes a BatchNorm (layer.h) reduce its batch statistics over `pg`
// (borrowed: it must outlive the layer) by setting opts->reduce. In training, forward
// all-reduces each channel's sum, sum of squares and count, and backward the sums of
// dy and dy * xhat, so N ranks with batch B/N normalise as one rank with batch B; the
// weight and bias gradients stay local sums, which DDP then averages. Every forward
// and backward of such a layer is collective: all ranks must run them together.
// Evaluation uses the running statistics and talks to nobody.
//     dt_batchnorm_opts o = dt_batchnorm_opts_default();
//     dt_syncbn_opts(&o, pg);
//     dt_layer_batchnorm2d_new(&layer, 64, &o);
DT_API dt_status dt_syncbn_opts(dt_batchnorm_opts *opts, dt_pg *pg);

#ifdef __cplusplus
}
#endif
#endif // DTRAIN_DDP_H
