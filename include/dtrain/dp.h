// dp.h: DataParallel in one process (PyTorch's nn.DataParallel, without the GIL): N
// threads, each with a replica of the model, each runs forward and backward on its
// contiguous slice of the batch; their gradients are reduced in memory, in replica
// order, into the master parameters' gradient buffer, and one optimizer step follows
// (the caller's). Any dt_params provider works: a dt_model, a dt_graph, or hand-written
// gradients, given a factory that builds a replica with the master's layout.
//
//     dt_dp_ops ops = {.make = make_replica, .drop = drop_replica, .work = fwd_bwd, .user = u};
//     dt_dp *dp;  dt_dp_new(&dp, master_params, 4, &ops, NULL);
//     per step:  dt_params_zero_grad(master_params);
//                dt_dp_forward_backward(dp, &batch, &loss);   // master grads += batch mean
//                dt_optim_step(opt);
//
// Replicas copy the master each step. Providers keep pointers into their own storage
// (a dt_model's layers, a dt_graph's nodes), so sharing the master's buffer would need
// a rebinding call in every provider; a copy needs nothing but the common layout, costs
// one pass over the parameters per replica per step (done by each replica's own thread,
// in parallel), and is what nn.DataParallel does (it replicates the module on every
// forward). Non-trainable buffers (BatchNorm running statistics) follow PyTorch too:
// every replica starts the step with the master's, and replica 0's updates are copied
// back afterwards (the other replicas' are dropped).
//
// Determinism: slice i of a batch of B samples is [i*B/N, (i+1)*B/N) (sizes differ by at
// most one; a replica with an empty slice sits the step out). The work function adds the
// gradient of its slice's MEAN loss; the master gets sum_i (n_i / B) * g_i, summed in
// replica order by every thread over its own range of the parameters, so results do
// not depend on timing. N = 1 gives bitwise the plain loop; N > 1 differs from it only
// by float rounding (the sum's order). Dropout masks are keyed by the sample's dataset
// index (dt_dp_set_rng, the batch's indices), so they do not depend on N either.
//
// When it beats processes, and when not: docs/trainer.md.
#ifndef DTRAIN_DP_H
#define DTRAIN_DP_H

#include "dtrain/core.h"
#include "dtrain/data.h"
#include "dtrain/graph.h"
#include "dtrain/nn.h"
#include "dtrain/params.h"
#include "dtrain/rng.h"

#ifdef __cplusplus
extern "C" {
#endif

#define DT_DP_MAX_REPLICAS 256

typedef struct dt_dp dt_dp;

// One replica, as the factory fills it.
typedef struct dt_dp_replica {
    void      *obj;    // the caller's replica (a model and its scratch), passed to work
    dt_params *params; // its parameters: the master's layout (tensors, sizes, buffers)
    dt_model  *model;  // when it is a dt_model (else NULL): dt_dp sets its dropout stream,
                       // its sample keys (each slice's dataset indices) and its threads
    dt_graph *graph;   // the same for a dt_graph
} dt_dp_replica;

typedef struct dt_dp_ops {
    // Builds replica `index` (0..N-1) into *out. Called N times in dt_dp_new.
    dt_status (*make)(void *user, int index, dt_dp_replica *out);
    // Frees what make built (may be NULL when nothing needs freeing).
    void (*drop)(void *user, dt_dp_replica *r);
    // Forward and backward of replica r on `slice` (a batch of slice->size >= 1
    // samples): ADDS the gradient of the slice's mean loss into r->params' gradients
    // (zeroed by dt_dp) and sets *loss to that mean. Runs on the replica's thread,
    // concurrently with the other replicas: it must touch only r and read-only data.
    dt_status (*work)(void *user, dt_dp_replica *r, const dt_batch *slice, float *loss);
    void *user;
} dt_dp_ops;

typedef struct dt_dp_opts {
    int replica_threads; // threads of each dt_model / dt_graph replica (default 1)
} dt_dp_opts;

DT_API dt_dp_opts dt_dp_opts_default(void);

// N replicas of `master` (borrowed: it must outlive dp), N in [1, DT_DP_MAX_REPLICAS]
// (DT_ERR_ARG otherwise, naming N). Fails (DT_ERR_MISMATCH) when a replica's layout
// differs from the master's, naming the replica and what differs. *out stays NULL on
// failure.
DT_API dt_status      dt_dp_new(dt_dp **out, dt_params *master, int n, const dt_dp_ops *ops,
                                const dt_dp_opts *opts);
DT_API void           dt_dp_free(dt_dp *dp); // NULL-safe; drops the replicas, joins the threads
DT_API int            dt_dp_size(const dt_dp *dp);
DT_API dt_dp_replica *dt_dp_replica_at(dt_dp *dp, int i); // NULL when out of range

// The dropout stream of dt_model / dt_graph replicas (the trainer's epoch stream).
DT_API void dt_dp_set_rng(dt_dp *dp, const dt_rng *rng);
// Training or evaluation mode of dt_model / dt_graph replicas (default training).
DT_API void dt_dp_train(dt_dp *dp, bool training);

// One data-parallel forward and backward of batch b (b->size >= 1): copies the master's
// parameters and buffers into every replica, runs work on each slice, and ADDS the
// batch's mean-loss gradient into the master's gradients (zero them first unless
// accumulating). *loss: the batch's mean loss (sum_i n_i / B * loss_i, in replica order).
// The first failing replica's status (in replica order) is returned, and the master's
// gradients are then left untouched.
DT_API dt_status dt_dp_forward_backward(dt_dp *dp, const dt_batch *b, float *loss);

#ifdef __cplusplus
}
#endif
#endif // DTRAIN_DP_H
