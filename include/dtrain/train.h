// train.h: the one object a training loop creates (dt_trainer, Accelerate's Accelerator
// in C). It parses the common flags from one table (plus the program's own), starts the
// job (dtrun, torchrun-style RANK/WORLD_SIZE, mpirun, srun, or --num-processes workers
// it forks itself), joins the group, shards the data, hands the parameters to the
// parallel strategy the flags ask for (DDP, ZeRO, DataParallel threads, a dp x pp x tp
// mesh: src/parallel), accumulates and clips gradients, steps the optimizer and its
// schedule, saves and resumes the whole state (parameters, buffers, optimizer, schedule
// step, RNG, loader position) with the atomic checkpoints, stops at an agreed step on
// SIGTERM, prints on rank 0 (summaries on each machine's local rank 0), and checks and
// reports at the end (replica checksum, STATS).
//
// The happy path, in the order of this header (seven calls; examples/mnist/main.c):
//
//     int main(int argc, char **argv) {
//         dt_trainer *t;
//         dt_status   st = dt_trainer_new(&t, argc, argv, &opts);       // 1 the flags
//         if (st || !t) return st == DT_ERR_ARG ? 2 : st ? 1 : 0;      // usage, --help
//         ... read the data (once: the workers forked below share it) ...
//         if (!dt_trainer_start(t)) return dt_trainer_exit(t, DT_OK);  // 2 the workers
//         dt_loader *ld;                                                // (below: a worker)
//         st = dt_trainer_loader(t, &ds, batch, DT_SPLIT_TRAIN, &ld);   // 3 sharded
//         ... build the model and the optimizer ...
//         if (!st) st = dt_trainer_prepare_model(t, model, opt, NULL);  // 4 --load, --resume
//         dt_batch b;
//         while (!st && dt_trainer_next(t, &b)) {                       // 5 epochs, steps
//             ... forward, loss, backward (the trainer zeroes the gradients) ...
//             st = dt_trainer_step(t, loss);                            // 6 sync, step, ckpt
//         }
//         return dt_trainer_exit(t, st);                                // 7 finish, exit code
//     }
//
// The single-process program is the same text: without a launcher and without
// --num-processes, dt_trainer_start returns true in this process, with no group, and
// every collective of the trainer is a no-op. docs/trainer.md lists the few lines that
// separate a plain loop from this one.
//
// After the happy path come, in this order: what a worker may ask (ranks, printing,
// collective helpers, counters), step-based runs, model parallelism, evaluation for
// --plot, and the flag tables for tools. Watching (watch.h, trace.h): rank 0's progress
// bar on a terminal, or the seed's loss lines elsewhere (every --log-every batches), is
// drawn by dt_trainer_step; --trace FILE records from dt_trainer_prepare to
// dt_trainer_finish, which writes one Chrome-trace file for all ranks; --plot FILE.svg
// collects the training loss in dt_trainer_step and the validation losses the program
// gives dt_trainer_log_val, and dt_trainer_report writes it.
#ifndef DTRAIN_TRAIN_H
#define DTRAIN_TRAIN_H

#include "dtrain/comm.h"
#include "dtrain/core.h"
#include "dtrain/data.h"
#include "dtrain/ddp.h"
#include "dtrain/dp.h"
#include "dtrain/exec.h"
#include "dtrain/graph.h"
#include "dtrain/mesh.h"
#include "dtrain/nn.h"
#include "dtrain/optim.h"
#include "dtrain/params.h"
#include "dtrain/pipe.h"
#include "dtrain/rng.h"
#include "dtrain/watch.h"

#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

// Exit status of a run stopped by SIGTERM at a step boundary agreed by every rank
// (EX_TEMPFAIL: "run again with --resume"). dtrun ends the job without a restart.
#define DT_EXIT_PREEMPTED 75

// ------------------------------------------------------------- 1. create: the flags
//
// A program's own flags are a table of dt_flag (dt_trainer_opts.flags), parsed with the
// trainer's common ones; --help is generated from both.

typedef enum dt_flag_type {
    DT_FLAG_BOOL,   // no value; target: bool
    DT_FLAG_LONG,   // target: long, value in [lo, hi]
    DT_FLAG_DOUBLE, // target: double, value in [lo, hi]
    DT_FLAG_STRING, // target: const char * (points into argv or at def)
} dt_flag_type;

enum {
    DT_FLAG_SHARED = 1u << 0,      // every rank must have rank 0's value (compared at
                                   // start; strings by their text, NULL for none)
    DT_FLAG_CKPT_KEEP   = 1u << 1, // saved in checkpoints as a key/value
    DT_FLAG_CKPT_REFUSE = 1u << 2, // saved; a resume with another value is refused
    DT_FLAG_CKPT_WARN   = 1u << 3, // saved; a resume with another value warns
    // With DT_FLAG_SHARED, for strings: _GIVEN compares only whether it was given (paths
    // that may differ between machines and name the same thing: --load); _HOST, for a
    // path, compares the file or folder it names (device and inode, so two spellings of
    // one folder agree) among the ranks of one machine only, and whether it was given
    // on every rank (--checkpoint-dir: one folder, which other machines may mount
    // elsewhere).
    DT_FLAG_SHARED_GIVEN = 1u << 4,
    DT_FLAG_SHARED_HOST  = 1u << 5,
};

// One flag: "--name VALUE". A table is an array ending with {0} (name NULL).
typedef struct dt_flag {
    const char  *name; // without the dashes: "batch-size"
    dt_flag_type type;
    void        *target;  // where the value goes (the default is written first)
    const char  *def;     // the default, as text (NULL: 0, false or NULL)
    double       lo, hi;  // accepted range of numbers (both 0: any long / double)
    const char  *metavar; // "N" in the help ("" for booleans)
    const char  *help;    // its text; lines after the first are indented to match
    const char  *section; // a heading in the help, printed where it changes
    unsigned     flags;   // DT_FLAG_SHARED, DT_FLAG_CKPT_*
    const char  *choices; // strings: the accepted words, space-separated ("a b c")
    const char  *expects; // strings: how a refusal names them ("a, b or c")
} dt_flag;

// The common flags, as parsed (the trainer's table; programs read them here).
typedef struct dt_train_args {
    long        epochs, seed, threads, log_every;
    long        num_processes, num_machines, machine_id, master_port;
    const char *master_addr, *backend, *job_token;
    bool        no_overlap;
    const char *checkpoint_dir;
    long        checkpoint_every, keep, max_steps;
    bool        resume, fallback;
    const char *save_model, *load, *trace, *plot;
    bool        eval_only, no_test, stats, profile;
    long        accumulate;      // micro-batches per optimizer step (default 1)
    double      clip_grad;       // max gradient norm (0: no clipping)
    long        invariant;       // gradient shards of a dt_model (-1: the default, see --help)
    long        data_parallel;   // DataParallel replicas (threads) in this process (default 1)
    long        zero;            // ZeRO stage of the data-parallel group (0: plain DDP; zero.h)
    const char *max_rank_memory; // --max-rank-memory as given (NULL: no budget)
    // Model parallelism (programs with dt_trainer_opts.model_parallel; mesh.h, pipe.h,
    // tp.h): mesh sizes (0: pp and tp 1, dp the rest), micro-batches per pipeline step
    // (0: pp) and the pipeline schedule ("gpipe" or "1f1b").
    long        dp, pp, tp, micro_batches;
    const char *schedule;
    const char *cuts;      // "auto" (balanced by measured cost), "uniform" or node names, a,b,...
    const char *precision; // "fp32", "bf16" or "fp16" (--precision)
    // DDP's gradient compression (--ddp-compress "none", "bf16", "fp16" or "powersgd";
    // ddp.h) and PowerSGD's rank (--powersgd-rank)
    const char *ddp_compress;
    long        powersgd_rank;
    // --ps N: the last N ranks serve the parameters (a synchronous parameter server,
    // docs/ps.md; 0: none); --ps-staleness K: asynchronous, a worker at most K steps
    // ahead of the slowest (0: synchronous)
    long ps;
    long ps_staleness;
    // --device (NULL: cpu) and --num-gpu-processes (0: none; else --num-processes with
    // --device cuda): where the model trains (see "devices" below)
    const char *device;
    long        num_gpu_processes;
} dt_train_args;

typedef struct dt_trainer dt_trainer;

typedef struct dt_trainer_opts {
    const char    *program;                // "dtrain-mnist": messages, the checkpoints' "program"
    const char    *summary;                // printed after the usage line of --help (may be NULL)
    const char    *epilogue;               // printed after the flags (may be NULL)
    const dt_flag *flags;                  // the program's own flags (ends with {0}), or NULL
    long           default_epochs;         // 0: 1
    bool           hide_accumulate;        // leave --accumulate and --clip-grad out
    double         train_flops_per_sample; // for STATS' gflops (0: the dt_model's, if any)
    bool           model_parallel;         // offer --dp --pp --tp --micro-batches --schedule
                                           // --cuts (the mesh; see "model parallelism")
    const char *no_model_split;            // with model_parallel: why this program's model
                                           // cannot be cut or split ("its BatchNorm ..."):
                                           // --dp and --zero apply, --pp/--tp > 1 are
                                           // refused at start with this reason
    const char *hide_flags;   // common flags left out, space-separated ("epochs stats"), or NULL
    bool        own_progress; // the program prints its own progress lines: no bar, no
                              // loss lines from dt_trainer_step
    bool loop_time;           // "Finished training in S secs" times the training loop
                              // only (from the end of dt_trainer_prepare, less the time
                              // given to dt_trainer_exclude_time), as PyTorch peers
                              // do, and adds the time from start-up; default: from
                              // start-up (the seed's)
    bool broadcast_buffers;   // PyTorch DDP's broadcast_buffers: rank 0's buffers
                              // (BatchNorm running statistics) to every rank at
                              // each step's first micro-batch and at the finish
} dt_trainer_opts;

DT_API dt_trainer_opts dt_trainer_opts_default(void);

// Parses the flags, checks them (--machine-id below --num-machines, --resume needs
// --checkpoint-dir ...), blocks SIGTERM for the preemption stop (call it before any
// thread starts), and checks the output paths (--save-model's folder takes a file,
// --checkpoint-dir is created and writable) before any data is read. Usage errors are
// printed and returned as DT_ERR_ARG (exit 2); output-path errors are printed and
// returned as DT_ERR_IO (exit 1). --help prints the help and returns DT_OK with *out
// NULL (exit 0). A trainer that never starts ends with dt_trainer_exit too.
DT_API dt_status            dt_trainer_new(dt_trainer **out, int argc, char **argv,
                                           const dt_trainer_opts *opts);
DT_API const dt_train_args *dt_trainer_args(const dt_trainer *t);

// A value every rank must share, compared at start with the shared flags (a data set's
// size, say). Call before dt_trainer_start; at most 16.
DT_API dt_status dt_trainer_add_setting(dt_trainer *t, const char *what, int64_t value);
// The same for a hash of data every rank must hold the same of (dt_dataset.content_hash,
// dt_tokens.hash: files of the same size and other bytes), named in hexadecimal. The
// training loader's dataset, and the evaluation loaders' made before it, are compared
// by dt_trainer_prepare* without this (their size and content hash); this is for data
// the trainer does not see, or to compare before any process starts.
DT_API dt_status dt_trainer_add_content(dt_trainer *t, const char *what, uint64_t hash);

// ------------------------------------------------------- 2. start the workers, exit

// Starts the job. With --num-processes P, forks P workers here (rank = machine * P +
// local rank), which return true and go on with the caller's code; this process waits
// for them and returns false (their exit code is then dt_trainer_exit's). Under a
// launcher (RANK/WORLD_SIZE, mpirun, srun) joins its group and returns true; otherwise
// returns true in this process, without a group. Before it returns true, the shared
// flags and settings are compared across ranks and the mesh's groups are made. false
// also when the start failed (printed; the exit code is 1). Call it once.
DT_API bool dt_trainer_start(dt_trainer *t);
// Ends this process's part and frees the trainer (NULL: the exit code of st alone). In
// a worker: with st DT_OK, dt_trainer_finish if the program prepared a model and did not
// call it; a failure
// is printed ("<program>: rank R: <message>") and aborts the group, so the other ranks
// stop at once; everything the trainer owns is released. Returns the exit code: 0, 1, or
// DT_EXIT_PREEMPTED (a SIGTERM stop); in the parent of forked workers, theirs; before
// dt_trainer_start, 1 for a failure (printed) else 0. A worker that dt_trainer_start
// forked does not return: its process ends here with that code (as a dt_spawn worker's
// does), whoever called it.
DT_API int dt_trainer_exit(dt_trainer *t, dt_status st);

// --------------------------------------------------------------------- 3. the data

typedef enum dt_split {
    DT_SPLIT_TRAIN,        // shuffled with --seed, padded to equal shares, epoch-aware;
                           // the loader dt_trainer_next drives and checkpoints save
    DT_SPLIT_EVAL,         // in order, no padding: every sample once across ranks
    DT_SPLIT_TRAIN_UNEVEN, // shuffled like DT_SPLIT_TRAIN but not padded: every sample
                           // exactly once per epoch, so ranks' shares (and batch counts)
                           // may differ; the trainer then joins (DDP's join):
                           // a rank whose data runs out shadows the others' steps (zero
                           // gradient, the same reductions, optimizer steps and
                           // checkpoints) until every rank's epoch is over, and each
                           // step's gradient is the mean over the samples all ranks had
                           // in it (with --accumulate too: samples, not micro-batches,
                           // weigh equally): the model of one process with batch
                           // world * B and this split. A dataset of a different size on
                           // each rank is allowed. Gradients are reduced after backward
                           // (no overlap with it).
} dt_split;

// A loader over this rank's share of ds (owned by the trainer; valid until
// dt_trainer_exit).
// The training loader (DT_SPLIT_TRAIN*) comes before dt_trainer_prepare*, which restores
// its position on --resume: after it, DT_ERR_STATE naming that order. Evaluation
// loaders may come at any time.
// Under elastic membership (dtrun --nnodes MIN:MAX, docs/dtrun.md) the training
// loader's batch is the global batch (each of W ranks takes batch / W), the trainer
// keeps the training loader cut for the current world itself, and a regrouping drops the
// evaluation loaders: ask for them again after training steps (the same call).
DT_API dt_status dt_trainer_loader(dt_trainer *t, const dt_dataset *ds, size_t batch,
                                   dt_split split, dt_loader **out);

// ------------------------------------------------- 4. the model and its optimizer

// Registers the parameters (and an optimizer over them, and optionally a schedule),
// owned by the trainer from here on, after the training loader: applies --load,
// --resume (the whole state; prints where it resumed), and hands them to the parallel
// strategy of the flags (DDP over the group, --zero, --data-parallel, the mesh).
// Collective.
DT_API dt_status dt_trainer_prepare(dt_trainer *t, dt_params *p, dt_optim *opt, dt_sched *sched);
// The same for a dt_model, which the trainer also gives its threads, its dropout
// stream (per epoch) and its per-sample keys (per batch), and profiles with --profile.
DT_API dt_status dt_trainer_prepare_model(dt_trainer *t, dt_model *m, dt_optim *opt,
                                          dt_sched *sched);
// The same for a finalized dt_graph (graph.h), owned by the trainer from here on (freed
// with the worker, parameters included), which the trainer also gives its threads, its
// dropout stream (per epoch) and its per-sample keys (per batch).
DT_API dt_status dt_trainer_prepare_graph(dt_trainer *t, dt_graph *g, dt_optim *opt,
                                          dt_sched *sched);

// ---------------------------------------------------------------------- 5. the loop

// The next micro-batch of this rank; false when training is over (epochs done,
// --max-steps, an agreed SIGTERM, --eval-only, or an error, which dt_trainer_finish
// returns). Begins epochs, zeroes the gradients at the start of each accumulation
// window, and turns DDP's reduction off for all but the window's last micro-batch.
DT_API bool dt_trainer_next(dt_trainer *t, dt_batch *b);
// After the micro-batch's backward: draws rank 0's progress (bar or loss line), and at
// the end of an accumulation window averages the gradients over ranks (and over the
// window's micro-batches), clips (--clip-grad), sets the schedule's rate, steps the
// optimizer, saves a checkpoint every --checkpoint-every steps, and agrees on a SIGTERM
// stop. Collective.
DT_API dt_status dt_trainer_step(dt_trainer *t, float loss);

// --precision: what dt_trainer_prepare_model sets on the dt_model; a program on a
// dt_graph passes it to dt_graph_set_precision itself. With fp16 the trainer keeps a
// GradScaler (optim.h): multiply the loss gradient by dt_trainer_loss_scale before
// backward; dt_trainer_step unscales, agrees on inf/NaN across ranks and skips the
// optimizer step (the step still counts) when any rank saw one; its state is in the
// checkpoints. The scale is 1 in fp32 and bf16.
DT_API dt_precision dt_trainer_precision(const dt_trainer *t);
DT_API float        dt_trainer_loss_scale(const dt_trainer *t);
// Multiplies the loss gradient dloss[0..n) by that scale before backward (nothing in
// fp32 and bf16): what a program on dt_trainer_prepare_graph does with its loss.
DT_API void dt_trainer_scale_loss_grad(const dt_trainer *t, float *dloss, size_t n);
// The divisor of the mean loss of this rank's micro-batch of n samples, for
// dt_loss_nll_over and dt_loss_cross_entropy_over (nn.h): n, or, when --invariant's
// tree sums the ranks' gradients (DDP in the plain loop), the global micro-batch
// (n x world), and the ranks' gradients are then summed, not averaged, at the window's
// end. Each sample's gradient so has one divisor whatever the world, and a world of N
// ranks trains bitwise the model of one process for every N that --invariant V's tree
// takes, N = 3 of V = 3 or 6 included (the local mean averaged over ranks rounds
// differently unless N is a power of two). Call it for every micro-batch before its
// backward; a program that does not gets the local mean averaged over ranks, as before.
DT_API size_t dt_trainer_loss_over(dt_trainer *t, size_t n);
// Optimizer steps skipped by the fp16 scaler so far.
DT_API int64_t dt_trainer_skipped_steps(const dt_trainer *t);

// DataParallel (--data-parallel N; dp.h): threads instead of processes. The program
// describes its model as a replica (`master`: the object it trains, whose parameters
// are the ones given to dt_trainer_prepare) and how to build more (ops->make) and to run
// forward and backward on a slice (ops->work; the gradient of the slice's mean loss,
// added). Then dt_trainer_forward_backward, in place of the loop's own forward, loss and
// backward, runs ops->work on the master for the whole micro-batch (the default:
// bitwise the plain loop), or with --data-parallel N on N replicas, threads of this
// process, each on its slice, their gradients summed into the master's in replica
// order (with several processes, DDP then reduces the master's over them).
// --data-parallel N > 1 needs a program that calls these two (examples/dataparallel).
// In a worker, before the first batch.
DT_API dt_status dt_trainer_set_replicas(dt_trainer *t, const dt_dp_ops *ops,
                                         const dt_dp_replica *master);
// The micro-batch's forward and backward (after dt_trainer_next); *loss its mean loss.
DT_API dt_status dt_trainer_forward_backward(dt_trainer *t, const dt_batch *b, float *loss);
DT_API int       dt_trainer_data_parallel(const dt_trainer *t); // replicas (1: none)

// ----------------------------------------------------------------------- 6. the end

// After the loop (dt_trainer_exit calls it when the program does not, to evaluate or
// report after it): the last checkpoint; on an agreed SIGTERM, prints where it stopped
// and returns DT_ERR_STATE (dt_trainer_exit then gives DT_EXIT_PREEMPTED); else a
// barrier, "Finished training in S secs" (each machine), the --profile table, the
// replica checksum ("Parameters identical on all N ranks (CRC32C ...)") and
// --save-model.
DT_API dt_status dt_trainer_finish(dt_trainer *t);
DT_API bool      dt_trainer_preempted(const dt_trainer *t);

// The end-of-run reports: --plot's SVG (rank 0, "Wrote the loss curves to PATH") and,
// with --stats, the STATS line (rank 0; collective for the peak RSS): time,
// samples/s, GFLOP/s, peak RSS, world, threads, backend, DDP wait, `metric` as
// "accuracy", checkpoints. Collective with --stats.
DT_API dt_status dt_trainer_report(dt_trainer *t, double metric);

// ------------------------------------------------------ what a worker may ask

DT_API dt_pg *dt_trainer_pg(dt_trainer *t); // NULL in a single process
DT_API int    dt_trainer_rank(const dt_trainer *t);
DT_API int    dt_trainer_world(const dt_trainer *t);
DT_API int    dt_trainer_local_rank(const dt_trainer *t);
DT_API bool   dt_trainer_is_main(const dt_trainer *t);       // rank 0
DT_API bool   dt_trainer_is_local_main(const dt_trainer *t); // local rank 0 (per machine)
DT_API int    dt_trainer_threads(const dt_trainer *t);       // --threads, else cores / local ranks
DT_API double dt_trainer_start_time(const dt_trainer *t);    // dt_now() at dt_trainer_new

// printf on rank 0 (dt_trainer_print) or on each machine's local rank 0
// (dt_trainer_print_local), flushed.
DT_API void dt_trainer_print(const dt_trainer *t, const char *fmt, ...) DT_PRINTF(2, 3);
DT_API void dt_trainer_print_local(const dt_trainer *t, const char *fmt, ...) DT_PRINTF(2, 3);

// Collective helpers (no-ops without a group): a barrier; rank 0 first (the others
// wait at _begin until rank 0 reaches _end: downloads, caches); a reduction in place.
DT_API dt_status dt_trainer_wait_for_everyone(dt_trainer *t);
DT_API dt_status dt_trainer_main_first_begin(dt_trainer *t);
DT_API dt_status dt_trainer_main_first_end(dt_trainer *t);
DT_API dt_status dt_trainer_all_reduce(dt_trainer *t, void *buf, size_t count, dt_dtype dtype,
                                       dt_reduce_op op);
// Accelerate's gather_for_metrics: every rank's `count` elements (counts may differ),
// concatenated in rank order into *out (owned: dt_free), *total elements. With the
// evaluation loader (no padding), each test sample is counted exactly once.
DT_API dt_status dt_trainer_gather_for_metrics(dt_trainer *t, const void *src, size_t count,
                                               dt_dtype dtype, void **out, size_t *total);

// The gradient clipping norm (0: none), for programs that name the flag otherwise
// (the PyTorch peer's --grad-clip); overrides --clip-grad.
DT_API void dt_trainer_set_clip_grad(dt_trainer *t, double max_norm);
// Time inside the training loop that is not training (evaluations): left out of the
// loop time with opts.loop_time.
DT_API void dt_trainer_exclude_time(dt_trainer *t, double secs);
// Seconds of the training loop so far (opts.loop_time's measure; final after finish).
DT_API double dt_trainer_loop_secs(const dt_trainer *t);
// This rank's parameters, gradients and optimizer state in bytes at their peak (--zero
// 3: the resident pages measured during the steps; otherwise the buffers' sizes), and
// the collective payload per optimizer step of this rank (bytes received in gathers
// and sent in reductions; plain DDP: a ring all-reduce's 2 (N - 1) / N of the
// gradients). Zeros before dt_trainer_prepare.
DT_API void dt_trainer_state_bytes(const dt_trainer *t, double *peak, double *moved_per_step);

DT_API int64_t dt_trainer_step_count(const dt_trainer *t);  // optimizer steps so far
DT_API long    dt_trainer_epoch(const dt_trainer *t);       // of the current batch
DT_API size_t  dt_trainer_num_batches(const dt_trainer *t); // per epoch, this rank
DT_API float   dt_trainer_grad_norm(const dt_trainer *t);   // before clipping, last step
DT_API bool    dt_trainer_sync_step(const dt_trainer *t);   // this micro-batch steps
// Random streams derived from --seed alone: the epoch's (what a dt_model's dropout
// gets) and one per optimizer step and `id` (the same on every rank).
DT_API dt_rng dt_trainer_epoch_rng(const dt_trainer *t);
DT_API dt_rng dt_trainer_step_rng(const dt_trainer *t, uint64_t id);

// ------------------------------------------------------------------ step-based runs

// A step-based run (language models, which draw their own batches; no training loader):
// after it, dt_trainer_next returns `micro_batches` micro-batches per optimizer step
// until `steps` steps in all (steps before a resume count; --max-steps may stop
// sooner). b is zeroed but for b->index (the micro-batch within the step) and b->size
// (`samples`, this rank's samples per micro-batch, for the statistics); the program
// fills its own inputs. Gradients are zeroed before a step's first micro-batch, DDP
// reduces after its last, and dt_trainer_step averages over the micro-batches, as
// --accumulate does. Call before dt_trainer_prepare.
// Under elastic membership (dtrun --nnodes MIN:MAX) `samples` is the GLOBAL batch, as a
// training loader's batch is then: each member takes samples / world per micro-batch,
// world being the current group's size (b->size says it, dt_trainer_world the world, and
// dt_trainer_rank the member's share: read them at every step, they change).
DT_API dt_status dt_trainer_set_steps(dt_trainer *t, int64_t steps, int micro_batches,
                                      size_t samples);
// Elastic membership: whether the group changed since the last dt_trainer_step began (in
// dt_trainer_prepare, where every elastic group forms first and a joiner is admitted, or
// at the end of the last step). The members of the new group are then at different
// places of the program: one that was training returns from dt_trainer_step, a joiner
// from dt_trainer_prepare. Until its next step a program makes no collective call of its
// own (a barrier, the loss's mean over ranks); when dt_trainer_step_count did not move,
// the step was lost with a member and is done again by the new group. False otherwise.
DT_API bool dt_trainer_regrouped(const dt_trainer *t);
// ------------------------------------------------------------------ model parallelism
// Programs with dt_trainer_opts.model_parallel train on a device mesh (mesh.h): --dp x
// --pp x --tp = the world size (unspecified: pp and tp 1, dp the rest). The trainer
// builds the mesh's groups when the job starts. Data is sharded over the dp group
// (dt_trainer_loader; a program that draws its own batches takes slice
// dt_trainer_mesh_coord(DP) of dt_trainer_mesh_size(DP)), DDP or ZeRO (--zero 1|2)
// reduce over it, the model is cut into --pp stages on consecutive ranks
// (dt_trainer_pipeline), and the program splits its layers over the tp group (tp.h).
// Checkpoints hold each rank's part (<dir>/pp<S>-tp<R>/step-N, one per model part,
// written by its dp group); --save-model gathers the whole model into one file, --load
// cuts one into the parts, so model files are the same in every layout. docs/parallel.md.
//
//     DT_TRY(dt_trainer_set_steps(t, steps, 1, b));       // the pipeline micro-batches
//     dt_graph *g;                                        // this rank's stage
//     DT_TRY(dt_trainer_pipeline(t, build, &cfg, ncand, cand, 16, &g));
//     DT_TRY(dt_trainer_init_params(t, my_init, &rng));   // optional: the whole model's draws
//     dt_adamw_new(&opt, dt_graph_params(g), &ao);
//     DT_TRY(dt_trainer_prepare_graph(t, g, opt, sched));
//     while (dt_trainer_next(t, &b)) {
//         DT_TRY(dt_trainer_pipe_step(t, inputs, batch, NULL, loss_fn, &tgt, &loss));
//         DT_TRY(dt_trainer_step(t, loss));
//     }

// This rank's coordinate along a dimension of the mesh and the dimension's size;
// without a mesh (data parallelism alone) dp is the rank and the world, pp and tp 0 and 1.
DT_API int dt_trainer_mesh_coord(const dt_trainer *t, dt_mesh_dim dim);
DT_API int dt_trainer_mesh_size(const dt_trainer *t, dt_mesh_dim dim);
// The group along `dim` (the world group for dp without a mesh); NULL where the
// dimension has size 1 or there is no group: build whole layers then.
DT_API dt_pg *dt_trainer_mesh_group(dt_trainer *t, dt_mesh_dim dim);

// Builds the whole model (a graph, not finalized) into *whole; called once, or twice
// when the cuts are balanced by measured cost (a first cut is timed, then the model is
// built again and cut where the times say), so it must build the same graph each time.
typedef dt_status (*dt_trainer_build_fn)(void *user, dt_graph **whole);
// The model as a pipeline over the mesh's pp group (one stage without one): builds it,
// chooses pp - 1 cuts among the `ncand` candidate nodes `cand` (in node order: where a
// stage may end, such as each transformer block's output) as --cuts says: auto (the
// default: each stage's nodes timed on a few micro-batches, the cuts that minimise the
// slowest stage, the same on every rank), uniform (candidates spread evenly) or names;
// a resumed run takes the cuts its checkpoints were written with. *stage: this rank's
// stage graph, finalized with --seed (owned by the trainer; give it to
// dt_trainer_prepare_graph). Micro-batches per step: --micro-batches, else
// `micro_batches` (0: --pp). Call after dt_trainer_set_steps or the training loader
// (the micro-batch size of the timing), before dt_trainer_prepare_graph. Collective.
DT_API dt_status dt_trainer_pipeline(dt_trainer *t, dt_trainer_build_fn build, void *user,
                                     int ncand, const char *const *cand, int micro_batches,
                                     dt_graph **stage);
// Initialisation in the whole model's order: fill(user, t, v) is called for every tensor
// t of the whole model (unsplit, in the order one process would register it) to write
// its t->count values into v, and this rank keeps its part of those it holds, so every
// layout starts from the same weights as one process. After dt_trainer_pipeline.
typedef void (*dt_trainer_fill_fn)(void *user, const dt_param_info *whole, float *values);
DT_API dt_status dt_trainer_init_params(dt_trainer *t, dt_trainer_fill_fn fill, void *user);
// One step's forwards and backwards through the pipeline (dt_pipe_step): inputs (the
// whole local batch, on the first stage; may be given everywhere), loss on the last
// stage (pipe.h's callback), *loss_out the batch's mean loss on every rank of the
// pipeline. Then dt_trainer_step(t, *loss_out). COLLECTIVE over the mesh.
DT_API dt_status dt_trainer_pipe_step(dt_trainer *t, const void *const *inputs, int batch,
                                      const uint64_t *keys, dt_pipe_loss_fn loss, void *user,
                                      float *loss_out);
// The forwards alone in evaluation mode (dt_pipe_eval): *loss_out the batch's mean loss on
// every stage. COLLECTIVE over the pp and tp groups of this rank's replica.
DT_API dt_status dt_trainer_pipe_eval(dt_trainer *t, const void *const *inputs, int batch,
                                      dt_pipe_loss_fn loss, void *user, float *loss_out);
// The pipeline (NULL before dt_trainer_pipeline): dt_pipe_stats for the bubble.
DT_API dt_pipe *dt_trainer_pipe(dt_trainer *t);

// ----------------------------------------------------------------------- devices
// --device cuda[:N] trains the model's graph on a GPU through an executor (exec.h;
// docs/gpu.md): "cuda" is GPU LOCAL_RANK % the GPUs, as torchrun's users pick it, and
// --num-gpu-processes N forks N workers so (the seed's flag). The trainer places the
// parameters, buffers and optimizer state on the GPU after --load and --resume, steps
// the optimizer there, and brings the host copies up to date before each checkpoint,
// evaluation and the end (programs evaluate on the CPU as before). The program says its
// loss before dt_trainer_prepare*, and runs each micro-batch with
// dt_trainer_device_step instead of its own forward, loss and backward
// (dt_trainer_forward_backward does so by itself, with the batch's labels). Not with
// --precision fp16, --zero, --pp/--tp, --data-parallel, --ddp-compress or uneven
// inputs yet: refused at start, naming which.
DT_API bool      dt_trainer_on_gpu(const dt_trainer *t); // --device names a GPU
DT_API dt_status dt_trainer_set_loss(dt_trainer *t, const dt_loss_spec *l);
// One micro-batch (after dt_trainer_next) on the device: inputs in dt_graph_input order
// and targets in host memory; *loss its mean loss. Then dt_trainer_step as usual.
DT_API dt_status dt_trainer_device_step(dt_trainer *t, const void *const *inputs,
                                        const void *targets, int batch, float *loss);
// The executor (NULL on the CPU or before dt_trainer_prepare*).
DT_API dt_exec *dt_trainer_exec(dt_trainer *t);

// ---------------------------------------------------------------- evaluation, --plot

// A validation loss at the current step (--plot's validation series; rank 0 keeps it):
// after each epoch (when dt_trainer_epoch moves on) and at the end, say.
DT_API dt_status dt_trainer_log_val(dt_trainer *t, double loss);

// ---------------------------------------------------------------- flag tables for tools

// Parses argv[1..argc) against the tables (NULL-terminated list of tables): writes every
// default first, then the values given. "--help" sets *help and stops. Errors
// (DT_ERR_ARG) name the flag and the value: "--batch-size expects an integer in [1,
// 65536], found \"zero\"", "unknown option \"--frob\"", "unexpected argument \"x\"".
// tools/dtrun's parser can take the same tables.
DT_API dt_status dt_flags_parse(const dt_flag *const *tables, int argc, char **argv,
                                bool *help /* out */);
// The help text of the tables, flags grouped under their sections, into f.
DT_API void dt_flags_print_help(const dt_flag *const *tables, FILE *f);
// The flag named `name` in the tables, or NULL.
DT_API const dt_flag *dt_flags_find(const dt_flag *const *tables, const char *name);

#ifdef __cplusplus
}
#endif
#endif // DTRAIN_TRAIN_H
