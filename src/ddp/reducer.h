// reducer.h: the one gradient reducer, shared by DDP (ddp.c, and through it the
// pipeline's stage replicas) and ZeRO stages 1 and 2 (src/parallel/zero.c). It owns
// what all of them do with a step's gradients:
//   - buckets: the trainable tensors grouped as PyTorch groups them (its
//     compute_bucket_assignment_by_size for one dtype), slices of the flat gradient
//     buffer, in reverse definition order;
//   - ready tracking: the gradient-ready consumer (params.h) counts each bucket's
//     tensors down; a range that cuts a tensor, or a tensor reported twice in a step, is
//     an error returned to the backward that reported it;
//   - launch: a bucket's reduction starts the moment its last gradient is final (or all
//     at sync without overlap), in bucket order on every rank;
//   - the reduction itself: the all-reduce average (in comm's tree order for DDP's
//     tree_reduce) or a comm hook (ddp.h's dt_ddp_comm_hook: DDP's 16-bit compression,
//     PowerSGD, ZeRO's reduce-scatter) started per bucket and finished at sync;
//   - errors: every failure reaches the caller of the call that caused it (the backward
//     for reports, dt_reducer_sync for the reductions), and a failed sync aborts the
//     group, so the other ranks fail at once instead of waiting.
#ifndef DTRAIN_DDP_REDUCER_H
#define DTRAIN_DDP_REDUCER_H

#include "dtrain/ddp.h"

typedef struct dt_reducer dt_reducer;

typedef struct dt_bucket_span {
    size_t offset, count;   // floats of the flat buffers
    int    first, ntensors; // parameter tensors [first, first + ntensors)
    int    ntrain;          // the trainable ones among them
} dt_bucket_span;

// The buckets alone, without a reducer (ZeRO's memory plan): spans has room for
// dt_params_count(p) entries; *nb gets their number. Caps as in dt_reducer_opts.
void dt_bucket_plan(const dt_params *p, size_t cap_bytes, size_t first_bytes, dt_bucket_span *spans,
                    int *nb);

typedef struct dt_reducer_opts {
    const char *who;                // "ddp", "zero": prefixes messages, the trace category
    const char *sync_span;          // the trace's name of the sync ("ddp sync")
    size_t      bucket_cap_bytes;   // 0: 25 MiB
    size_t      first_bucket_bytes; // 0: 1 MiB when the cap is the default, else the cap
    bool        track;              // register the gradient-ready consumer; sync then requires
                                    // every trainable tensor reported in the step
    bool             overlap;       // start buckets during backward (with track)
    dt_ddp_comm_hook hook;          // how a bucket is reduced; start NULL: the average
    dt_reduce_order  order;         // over the ranks, all_reduce in this order
} dt_reducer_opts;

// Plans the buckets of `p` (borrowed, with storage) and, with track, registers the
// consumer. Not collective. *out is NULL on failure.
dt_status dt_reducer_new(dt_reducer **out, dt_params *p, dt_pg *pg, const dt_reducer_opts *o);
// Waits for reductions in flight; removes the consumer. NULL is a no-op.
void dt_reducer_free(dt_reducer *r);

// Gradient accumulation: with sync off, reports are ignored and sync does nothing.
void dt_reducer_set_sync(dt_reducer *r, bool sync);
// The plain all-reduce (no hook) sums the ranks' gradients instead of averaging them
// from the next bucket started on (default off): the caller's gradients are already
// divided by the global batch (ddp.h, dt_ddp_set_sum).
void dt_reducer_set_sum(dt_reducer *r, bool sum);
// Floats [offset, offset + count) of the gradients are final for this backward: whole
// tensors. Starts every bucket now complete (with overlap). What the consumer calls.
dt_status dt_reducer_mark(dt_reducer *r, size_t offset, size_t count);
// COLLECTIVE: starts what is not started yet, waits for every bucket and finishes it
// (the hook's finish), then readies the next step. A tensor that got no gradient (with
// track) is DT_ERR_STATE naming it; any failure aborts the group.
dt_status dt_reducer_sync(dt_reducer *r);

int                   dt_reducer_num_buckets(const dt_reducer *r);
const dt_bucket_span *dt_reducer_bucket(const dt_reducer *r, int i);
// Seconds sync spent waiting for reductions, and the number of synced steps.
void dt_reducer_stats(const dt_reducer *r, double *wait_s, int64_t *steps);

#endif // DTRAIN_DDP_REDUCER_H
