// train_impl.h: what the trainer's files share (not public): the start-up checks of
// output paths and shared settings, and the SIGTERM stop at an agreed step boundary.
#ifndef DTRAIN_TRAIN_IMPL_H
#define DTRAIN_TRAIN_IMPL_H

#include "dtrain/ckpt.h"
#include "dtrain/exec.h"
#include "dtrain/mesh.h"
#include "dtrain/pipe.h"
#include "dtrain/train.h"
#include "dtrain/zero.h"
#include "parallel/strategy.h"

#include <stdbool.h>
#include <stdint.h>

// --save-model PATH: its directory exists and takes a new file (probed with a temporary
// file, removed at once; PATH itself is not touched), and PATH, when it exists, is a
// regular file. --checkpoint-dir DIR: created when missing (with its parents), a
// directory, and writable. Errors name the path and the errno text.
dt_status dt_train_check_save_model(const char *path);
dt_status dt_train_check_checkpoint_dir(const char *dir);

// A setting every rank must share, as a 64-bit value (doubles by their bits: is_double).
// A text (is_text: a string flag's value, NULL when not given) is compared by its hash
// (dt_train_text_hash) and named by its text. per_host: a path whose value identifies
// what it names (dt_train_path_hash), compared among the ranks of one machine only;
// given on all ranks or on none.
typedef struct dt_train_setting {
    const char *flag; // "--batch-size"
    int64_t     value;
    bool        is_double, is_bool; // printed as a number, or as "on"/"off"
    bool        is_hex;             // printed as 0x and 16 hex digits (hashes)
    bool        is_text, per_host;
    const char *text;
} dt_train_setting;

// The value of a text setting: 0 for NULL, else a 64-bit FNV-1a hash of its bytes
// (never 0).
int64_t dt_train_text_hash(const char *text);
// The value of a path setting: 0 for NULL, else the hash of the device and inode it
// names (two spellings of one folder are equal), or of its text when it cannot be
// stat'ed.
int64_t dt_train_path_hash(const char *path);

// Collective: every rank sends its settings to every other; on any difference every
// rank fails with the same message naming the flag, the reference rank's value (rank 0,
// or for per_host the first rank of the machine) and the first differing rank's. n must
// be the same on every rank (it is the program's table).
dt_status dt_train_check_settings(dt_pg *pg, const dt_train_setting *s, int n);
// The trainer's own table through it: every DT_FLAG_SHARED flag, the resolved
// --invariant, the budget and the program's settings (dt_trainer_add_setting). At a
// worker's start, and again for each group of an elastic job. No-op without a group.
dt_status dt_train_check_shared(dt_trainer *t);

// SIGTERM handling (guard.c). _block: blocks SIGTERM in the calling (main) thread before
// any other starts, so they all inherit the mask; call first. _watch: in a process that
// trains (not the parent of --num-processes, whose dt_spawn forwards the signal), starts
// the thread that takes SIGTERM: before _arm and after _release it ends the process at
// once, as usual; in between it is a request to stop at the next step boundary.
void dt_train_preempt_block(void);
void dt_train_preempt_watch(void);
void dt_train_preempt_arm(void);
// Whether a SIGTERM came since the last call (consumed: reported once).
bool dt_train_preempt_pending(void);
// Collective (pg may be NULL): whether any rank has seen a SIGTERM so far; every rank
// gets the same answer for the same step. *stop is sticky (true stays true).
dt_status dt_train_preempt_agree(dt_pg *pg, bool *stop);
// Training is over: a SIGTERM that came after the last agreement, or any later one,
// ends the process at once.
void dt_train_preempt_release(void);

// The memory budget and ZeRO-3's needs (memory.c). _parse_bytes: "512M", "1.5G" (K, M,
// G, T: powers of 1024). _plan_memory: what a rank holds for zo->stage at this world,
// refused (DT_ERR_ARG, naming both numbers) over the budget; stage 3's live units get
// what the shard leaves of it; printed under a budget or with stage 3.
dt_status dt_train_parse_bytes(const char *s, uint64_t *out);
dt_status dt_train_plan_memory(dt_trainer *t, dt_params *p, dt_optim *opt, dt_zero_opts *zo);

// The trainer (train.h); trainer.c builds and launches it, loop.c drives the loop,
// helpers.c answers its accessors and helpers (and calls nothing else of src/train).
#define MAX_SETTINGS 16
#define MAX_EVAL     8
#define MAX_COMMON   56
#define MAX_KVS      32

struct dt_trainer {
    dt_trainer_opts o;
    dt_train_args   a;
    dt_flag         common[MAX_COMMON];
    const dt_flag  *tables[3];
    char            def_epochs[24], epochs_help[64]; // the program's default, in the help
    double          start;
    struct {
        char    what[96];
        int64_t value;
        bool    hex; // a content hash (dt_trainer_add_content)
    } extra[MAX_SETTINGS];
    int nextra;

    // dt_trainer_start and dt_trainer_exit: started; this process trains (a worker); the
    // exit code of a process that does not (the parent of forked workers, or a worker
    // that could not begin); dt_trainer_finish was called.
    bool started, in_worker, finish_called;
    bool forked; // a worker dt_trainer_start forked: dt_trainer_exit ends the process
    int  exit_code;

    // A worker's state (from dt_trainer_start to dt_trainer_exit).
    dt_pg            *pg;
    int               rank, world, local_rank, local_size, threads;
    dt_params        *p;
    dt_model         *m;
    dt_graph         *g; // dt_trainer_prepare_graph's (p is its parameters)
    dt_optim         *opt;
    dt_sched         *sched;
    dt_strategy      *strat; // DDP, ZeRO, DataParallel, the mesh: src/parallel/strategy.h
    const dt_dataset *tds;   // the training loader's dataset
    dt_sampler       *smp, *esmp[MAX_EVAL];
    dt_loader        *ld, *eld[MAX_EVAL];
    int               neval;
    size_t            batch, nbatches, cur_size;
    uint64_t         *keys;
    dt_rng            base, root, er;
    long              epoch;
    bool              in_epoch, stop, preempted, prepared, sync;
    int               micro, window;
    long              inv_v;       // --invariant as resolved (the default from the cores)
    bool              tree_reduce; // DDP continues the model's shard tree over ranks
    int64_t           step, last_saved, ckpt_saves, samples_seen;
    double            ckpt_secs, train_start, finished;
    float             grad_norm, last_loss;
    dt_status         err;
    // Checkpoint key/values: the flags marked DT_FLAG_CKPT_*, by their values.
    char        kvkey[MAX_KVS][64], kvval[MAX_KVS][48];
    dt_ckpt_kv  kvs[MAX_KVS];
    unsigned    kvpolicy[MAX_KVS];
    const char *kvflag[MAX_KVS];
    int         nkvs;
    dt_ckpt_rng rngs[1];
    // --precision; fp16's loss scaler and its checkpoint text (key "grad_scaler")
    dt_precision    prec;
    dt_grad_scaler *scaler;
    char            scaler_kv[64];
    int64_t         skipped;
    // Watching: rank 0's progress and loss curves; the evaluation for --plot.
    dt_progress      *bar;
    dt_plot          *plot;
    size_t            cur_index;
    const dt_dataset *eds[MAX_EVAL];
    size_t            ebatch[MAX_EVAL];
    // DataParallel (--data-parallel N): the program's replicas, until the strategy is
    // made (dt_trainer_prepare hands them over).
    dt_dp_ops     dp_ops;
    dt_dp_replica dp_master;
    bool          has_replicas;
    // Uneven inputs (DT_SPLIT_TRAIN_UNEVEN, loop.c): every rank runs the
    // epoch's largest batch count (nb_all); past its own data, a rank shadows the
    // others' steps with no samples. Windows count micro-batches mb of the epoch, and
    // the gradient of a window is the sum over its samples (win_samples here), reduced
    // and divided by the window's samples over all ranks.
    bool    join, shadow, exhausted;
    size_t  nb_all, mb;
    int64_t win_samples;
    // A step-based run (dt_trainer_set_steps): steps in all, micro-batches per step,
    // samples per micro-batch; time left out of the loop time.
    int64_t total_steps;
    int     step_micro;
    size_t  step_samples;
    double  excluded;
    // Model parallelism (mesh.c): the mesh (NULL: data parallelism over the whole
    // group), its sizes, the pipeline of dt_trainer_pipeline (g is its stage graph,
    // which it owns), the whole model's table (unsplit, no storage) and the cuts.
    dt_mesh   *mesh;
    int        msize[DT_MESH_DIM_COUNT_];
    dt_pipe   *pipe;
    dt_params *whole;
    int       *cut_node, ncuts; // positions in the whole graph
    char       cut_names[1024]; // "a,b" for messages and the layout file
    char       mp_help[2][256]; // --pp's and --tp's help where the model has no cut
    // --device cuda (device.c): the executor of the model's graph, its device, the
    // program's loss, and whether the host copies are behind the device's.
    dt_exec     *exec;
    dt_device   *dev;
    dt_loss_spec dloss;
    bool         dloss_set, host_stale;
    // --max-rank-memory in bytes (0: none) and what the run's stage needs (memory.c).
    uint64_t budget;
    size_t   plan_bytes;
    // Elastic membership (elastic.c; NULL: a fixed group): the rendezvous, the global
    // batch the training loader's batch was given as (each rank takes gbatch / world),
    // and regroupings in a row without a step between them (bounded); regrouped: the
    // group changed since the program's last dt_trainer_step began (dt_trainer_regrouped).
    struct dt_elastic *el;
    size_t             gbatch;
    int                regroups;
    bool               regrouped;
    // --ps N (ps.c): the whole world (t->pg is then the workers' group, or NULL on a
    // server), whether this rank serves, and the exchange with the servers.
    dt_pg        *ps_world;
    bool          ps_server;
    struct dt_ps *ps;
};

// elastic.c: elastic membership (DT_ELASTIC, set by dtrun --nnodes MIN:MAX). _wanted:
// the variable is set. _open: the rendezvous store at MASTER_ADDR:MASTER_PORT (t->el).
// _poll: whether the generation moved on since this worker joined (one store read, at
// a step boundary). _regroup: drops the group, joins the next generation's (t->pg,
// world, ranks) and takes the state of the member with the most steps (counters,
// parameters, buffers, optimizer; *next_batch: the batch of the epoch to go on from).
// _close: says this member left (dtrun's host waits for every member), and when it
// finished training that the job is done (a later worker is refused), and closes.
bool      dt_train_elastic_wanted(void);
dt_status dt_train_elastic_open(dt_trainer *t);
dt_status dt_train_elastic_poll(dt_trainer *t, bool *changed);
dt_status dt_train_elastic_regroup(dt_trainer *t, int64_t *next_batch);
// A step's end (replaces dt_train_preempt_agree): t->preempted when this worker got a
// SIGTERM (it leaves the job alone), *others when another member did (the rest regroup
// without it). Collective over the group.
dt_status dt_train_elastic_agree(dt_trainer *t, bool *others);
void      dt_train_elastic_close(dt_trainer *t, bool finished);
// Whether the job finished while this worker stood by (its end is a success).
bool dt_train_elastic_ended(const dt_trainer *t);

// device.c: the trainer on a GPU. _wanted: --device names a GPU. _args: --num-gpu-processes
// into --num-processes and --device cuda. _start (end of dt_trainer_prepare): the checks
// and the executor. _pull: the host copies brought up to date when behind (before a
// checkpoint, an evaluation, the end). _update: a window's end (DDP's reduction, the
// mean, clipping, the schedule, the optimizer's step) on the device. _release: at the
// worker's end.
bool        dt_train_device_wanted(const dt_trainer *t);
const char *dt_train_device_backend(const dt_trainer *t); // the worker group's backend
dt_status   dt_train_device_args(dt_train_args *a);
dt_status   dt_train_device_start(dt_trainer *t);
dt_status   dt_train_device_pull(dt_trainer *t);
dt_status   dt_train_device_update(dt_trainer *t);
void        dt_train_device_release(dt_trainer *t);

// mesh.c: model parallelism in the trainer (train.h's "model parallelism").
// The checks of --dp --pp --tp against a world of `world` ranks (usage errors).
dt_status dt_train_mesh_check(const dt_trainer *t, int world);
// In a worker, before fn: the checks, and the mesh's groups when pp x tp > 1. Collective.
dt_status dt_train_mesh_start(dt_trainer *t);
void      dt_train_mesh_release(dt_trainer *t); // the pipeline, its graph, the mesh
// Whether the model is cut or split (pp x tp > 1): checkpoints per part, the norm over
// the parts, whole model files gathered and cut (an accessor: helpers.c).
bool dt_train_mesh_on(const dt_trainer *t);
// The group DDP and ZeRO reduce over (NULL: none), and its size (1 without one;
// accessors too: helpers.c).
dt_pg *dt_train_dp_group(dt_trainer *t);
int    dt_train_dp_size(const dt_trainer *t);
// Checkpoints of this rank's part (<dir>/pp<S>-tp<R>), by its dp group; loading agrees
// on the newest step every part has (with --fallback, that every part loads), and
// refuses parts without a step in common. Collective over the world.
dt_status dt_train_mesh_save(dt_trainer *t, const dt_ckpt_state *cs, const dt_ckpt_opts *co);
dt_status dt_train_mesh_load(dt_trainer *t, const dt_ckpt_state *cs, const dt_ckpt_opts *co,
                             dt_ckpt_info *info);
// A run without a mesh that writes into (or resumes) a checkpoint directory a mesh wrote:
// refused, naming both layouts. (A mesh run checks in dt_trainer_pipeline.)
dt_status dt_train_mesh_check_layout(const dt_trainer *t);
// The whole model: gathered to rank 0 and saved (--save-model), or loaded on every rank
// and cut into this rank's part (--load). Collective.
dt_status dt_train_mesh_save_model(dt_trainer *t, const char *path);
dt_status dt_train_mesh_load_model(dt_trainer *t, const char *path);

// --profile's tables (profile.c): the Sequential model's layers, or the graph's nodes
// and kinds, each against the training time.
void dt_train_print_profile(dt_model *m, double train_secs);
void dt_train_print_graph_profile(const dt_graph *g, double train_secs);

// The parameter server (ps.c; --ps N). _start: at a worker's start, after the world's
// checks: refuses what does not fit, and splits the world: t->pg becomes the workers'
// group (their sampler, evaluation and checkpoints' group), a server's is NULL.
// _prepare: in dt_trainer_prepare, before the strategy: a worker's exchange (t->ps,
// which the strategy's step uses); a server serves and ends its process there, with
// dt_trainer_exit's code (a server reads no checkpoint on --resume: worker 0 gives it
// its range of the state). _end: the servers told training is over (a worker that ends
// well or preempted), the world aborted after a failure, and freed.
dt_status dt_train_ps_start(dt_trainer *t);
dt_status dt_train_ps_prepare(dt_trainer *t);
// Whether this step's end agrees on a SIGTERM (every step, but every max(16, 2K) steps
// with --ps-staleness K, so that the agreement does not hold the workers in step).
bool dt_train_ps_agrees(const dt_trainer *t);
void dt_train_ps_end(dt_trainer *t, int rc);

#endif
