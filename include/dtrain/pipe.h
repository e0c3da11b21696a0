// pipe.h: pipeline parallelism. A model graph (graph.h) is cut into stages at nodes the
// user names; stage s runs on rank s of a pipeline group (a dt_mesh's pp group, or any
// dt_pg), and a step splits the batch into micro-batches that flow through the stages:
// activations forward by dt_pg_send/recv, their gradients backward, the loss on the
// last stage. Gradients accumulate over the micro-batches, so a step's gradients are
// the whole batch's, as in one process, up to rounding.
//
//     dt_graph *whole;  ... dt_graph_add(whole, "h.1.out", ...) ...   // not finalized
//     dt_pipe *pp;
//     dt_pipe_opts po = dt_pipe_opts_default();  po.micro_batches = 8;
//     po.schedule = DT_PIPE_1F1B;
//     dt_pipe_new(&pp, whole, 1, (const char *[]){"h.1.out"}, pp_group, seed, &po);
//     dt_params *p = dt_pipe_params(pp);          // this stage's parameters only
//     for each step:
//         dt_params_zero_grad(p);
//         dt_pipe_step(pp, stage == 0 ? inputs : NULL, batch, keys, loss_fn, user, &loss);
//         dt_optim_step(opt);                     // an optimizer over p, on every stage
//
// Stage s holds the nodes after cut s-1 up to and including cut s (stage 0 from the
// first node, the last stage to the end). Each stage after the first must read exactly
// one value from before it, the output of the previous stage's last node (a residual
// stream cut between blocks); other cuts fail naming the node and the value. A
// parameter tied across stages (a GPT's head tied to its token embedding) lives on
// both: the owner's stage keeps it, the other holds a copy under the owner's name
// ("wte.weight"), which the first step fills with the owner's values; after each
// step's backwards the two stages exchange the tensor's gradient and both hold
// owner + copy (Megatron-LM's embedding all-reduce), so the two stay bitwise equal
// under the same optimizer.
//
// Schedules (opts.schedule):
//   GPipe  every stage runs all M forwards, then all M backwards; each stage keeps M
//          micro-batches of activations.
//   1F1B   stage s runs min(P-s-1, M) forwards, then alternates one forward and one
//          backward, then drains the backwards (PipeDream-Flush, Megatron-LM's
//          default): at most min(P-s, M) micro-batches of activations are held.
// Both run every backward in micro-batch order, so they give the same gradients,
// bitwise. The bubble is (P-1)/(M+P-1) of the step for both.
//
// Every send and receive is bounded by the group's timeout; a dead or frozen stage
// fails the step on every rank with DT_ERR_PEER or DT_ERR_TIMEOUT naming it.
#ifndef DTRAIN_PIPE_H
#define DTRAIN_PIPE_H

#include "dtrain/comm.h"
#include "dtrain/ddp.h"
#include "dtrain/graph.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dt_pipe dt_pipe;

typedef enum dt_pipe_schedule {
    DT_PIPE_GPIPE = 0,
    DT_PIPE_1F1B  = 1,
    DT_PIPE_SCHEDULE_COUNT_
} dt_pipe_schedule;

// "gpipe" / "1f1b"; DT_ERR_ARG naming both for anything else.
DT_API dt_status   dt_pipe_schedule_parse(const char *name, dt_pipe_schedule *out);
DT_API const char *dt_pipe_schedule_name(dt_pipe_schedule s);

// The last stage's loss over micro-batch samples [first, first + n) of the batch:
// writes their mean loss into *loss and d(mean loss)/d(out) into dout (n x the output
// shape). The pipeline weights both by n / batch, so the step's loss and gradients
// are those of the mean over the batch.
typedef dt_status (*dt_pipe_loss_fn)(void *user, const float *out, int first, int n, float *loss,
                                     float *dout);

typedef struct dt_pipe_opts {
    dt_pipe_schedule schedule;      // default DT_PIPE_GPIPE
    int              micro_batches; // M; 0 = the number of stages
} dt_pipe_opts;
DT_API dt_pipe_opts dt_pipe_opts_default(void);

// Cuts `whole` (built, NOT finalized; consumed: freed on success and on failure) after
// each of the ncuts named nodes (in node order; ncuts = size of `pg` - 1) and keeps
// stage dt_pg_rank(pg), finalized with `seed` (its parameters as `whole` would have
// initialised them). `pg` is borrowed and must outlive the pipeline; NULL: one stage in
// this process (the micro-batches and the loss weighting alone: gradient accumulation). Not
// collective: every stage cuts alike, nothing is exchanged. *out stays NULL on failure.
DT_API dt_status dt_pipe_new(dt_pipe **out, dt_graph *whole, int ncuts, const char *const *cuts,
                             dt_pg *pg, uint64_t seed, const dt_pipe_opts *opts);
DT_API void      dt_pipe_free(dt_pipe *p); // NULL-safe; frees the stage graph

DT_API dt_graph  *dt_pipe_graph(dt_pipe *p);  // this stage's graph (owned by the pipeline)
DT_API dt_params *dt_pipe_params(dt_pipe *p); // = dt_graph_params(dt_pipe_graph(p))
DT_API int        dt_pipe_stage(const dt_pipe *p);
DT_API int        dt_pipe_stages(const dt_pipe *p);
DT_API dt_status  dt_pipe_set_micro_batches(dt_pipe *p, int m); // between steps
// Data parallelism over replicas of the pipeline (a dt_mesh's dp group): `ddp` wraps
// this stage's parameters (dt_pipe_params) over the stage's replicas; the pipeline
// turns its sync off for every micro-batch's backward but the last (dt_ddp_set_sync),
// so each bucket is reduced once per step. Call dt_ddp_sync after dt_pipe_step. NULL:
// none. Borrowed.
DT_API void dt_pipe_set_ddp(dt_pipe *p, dt_ddp *ddp);

// One step: forward and backward of every micro-batch, ADDING the batch's gradients
// into this stage's dt_params (zero them first). COLLECTIVE over the pipeline group:
// every stage calls it with the same batch. inputs: on stage 0 one buffer per graph
// input of the whole batch (as dt_graph_forward takes them), NULL elsewhere. keys: the
// batch's sample keys for dropout (NULL: their positions in the batch), on every stage.
// loss/user: called on the last stage. *loss_out (may be NULL): the batch's mean loss,
// on every stage (broadcast from the last). Needs micro_batches <= batch.
DT_API dt_status dt_pipe_step(dt_pipe *p, const void *const *inputs, int batch,
                              const uint64_t *keys, dt_pipe_loss_fn loss, void *user,
                              float *loss_out);

// Evaluation: the forwards of every micro-batch (no backward, no gradient), the graph
// in evaluation mode for the call (dropout off, BatchNorm's running statistics; it is
// left in training mode), the
// loss callback's dout ignored (the callback gets a scratch buffer). *loss_out: the
// batch's mean loss on every stage. COLLECTIVE over the pipeline group, like
// dt_pipe_step; holds one micro-batch of activations at a time.
DT_API dt_status dt_pipe_eval(dt_pipe *p, const void *const *inputs, int batch,
                              dt_pipe_loss_fn loss, void *user, float *loss_out);

// This stage's nodes in the whole graph given to dt_pipe_new: positions first..last (in
// dt_graph_add order, graph inputs counted).
DT_API void dt_pipe_range(const dt_pipe *p, int *first, int *last);
// Whether tensor `tensor` of dt_pipe_params is this stage's copy of a tensor tied across
// stages (the owner's stage holds the original): count it once in norms and whole models.
DT_API bool dt_pipe_is_tie_copy(const dt_pipe *p, int tensor);

// ------------------------------------------------------------------- balancing
// Cuts chosen by measured layer cost: time every stage's nodes (dt_pipe_time_nodes on a
// pipeline cut anyhow), sum the costs over the ranks (every rank must hold the same
// vector), choose the cuts (dt_pipe_balance), and cut the model again there.

// Times this stage's nodes: one untimed round, then `reps` forwards and backwards of
// `micro_batch` samples of zeros (layer cost does not depend on the values), nothing
// sent to other stages. cost[nwhole] (nwhole: the whole graph's node count) gets, for
// this stage's nodes, their forward + backward CPU seconds per micro-batch (graph.h's
// timing; the fastest of the rounds); the others
// are left as they are. Gradients are zeroed after. Collective over the groups of the
// stage's own layers (a tensor-parallel stage's ranks time together), not over the
// pipeline.
DT_API dt_status dt_pipe_time_nodes(dt_pipe *p, int micro_batch, int reps, int nwhole,
                                    double *cost);
// The stages - 1 cuts among `ncand` candidate nodes (positions, increasing, each before
// the last node) that minimise the largest stage cost, a stage's cost the sum of its
// nodes' cost[0..nnodes): chosen[k] is an index into cand (ties: the earliest cut);
// *slowest (may be NULL) the largest stage cost. Pure: ranks given the same costs
// choose the same cuts.
DT_API dt_status dt_pipe_balance(int nnodes, const double *cost, int ncand, const int *cand,
                                 int stages, int *chosen, double *slowest);

// Seconds this stage spent computing (forwards, backwards, the loss) and in whole
// steps, summed over steps since the last call with reset: 1 - compute / total is the
// stage's measured bubble (plus communication).
DT_API void dt_pipe_stats(dt_pipe *p, double *compute_s, double *total_s, bool reset);

#ifdef __cplusplus
}
#endif
#endif // DTRAIN_PIPE_H
