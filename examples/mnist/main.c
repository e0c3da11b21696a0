// dtrain-mnist: the seed chapter's ConvNet on (Fashion-)MNIST, in one process or
// data-parallel over many.
//
//   conv(1->16, 3x3) -> ReLU -> conv(16->32, 3x3) -> ReLU -> maxpool 2 -> Dropout2d(0.10)
//   -> flatten (4608) -> linear(64) -> ReLU -> dropout(0.25) -> linear(10) -> log_softmax
//
// NLL loss, Adadelta (lr 0.5), batch 128 per process; the loss every 10 batches, the
// training time and the test accuracy, as the seed script prints them.
//
// Three ways to run:
//   dtrain-mnist                          one process, no process group
//   dtrain-mnist --num-processes P [--num-machines M --machine-id K]
//                                         the seed's launch style: P workers forked here,
//                                         rank = K*P + local rank, world = M*P
//   RANK=.. WORLD_SIZE=.. MASTER_ADDR=.. MASTER_PORT=.. dtrain-mnist
//                                         one worker of a job started by a launcher
//   mpirun -np N dtrain-mnist [--backend mpi]   (or srun): the same, rank and size from
//                                         MPI's variables, the store's address over MPI
//
// Checkpoints: --checkpoint-dir D --checkpoint-every N saves every N steps (and at the
// end); --resume continues from the newest complete checkpoint in D, or starts fresh
// when there is none, so one command line serves the first launch and every restart.
// A resumed run ends bitwise equal to an uninterrupted one (same seed, world size,
// batch size and threads): the state is parameters, Adadelta's state, each rank's
// sampler position, and the dropout stream, whose masks depend only on (seed, epoch,
// batch, rank).
#include "dtrain/ckpt.h"
#include "dtrain/data.h"
#include "dtrain/ddp.h"
#include "dtrain/nn.h"
#include "dtrain/optim.h"
#include "dtrain/trace.h"
#include "dtrain/watch.h"
#include "guard.h"

#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

typedef struct args {
    long        epochs, batch_size, limit, seed, threads, log_every;
    long        num_machines, num_processes, machine_id, master_port;
    long        checkpoint_every, keep, max_steps;
    long        invariant; // --invariant V: the virtual world of gradient shards
    double      lr;
    const char *data_dir, *backend, *master_addr;
    const char *checkpoint_dir, *save_model, *load, *trace, *plot;
    bool        no_test, stats, profile, no_overlap, resume, fallback, eval_only;
} args;

static const char usage[] =
    "usage: dtrain-mnist [options]\n"
    "training:\n"
    "  --epochs N          passes over the training set (default 1)\n"
    "  --batch-size B      samples per step and process (default 128)\n"
    "  --lr X              Adadelta learning rate (default 0.5)\n"
    "  --seed S            seed of initialisation, shuffling and dropout (default 0)\n"
    "  --data-dir D        folder of MNIST-format files, plain or .gz\n"
    "                      (default $DT_DATA_DIR, else " DT_DATA_DIR_DEFAULT ")\n"
    "  --limit N           train on the first N samples only (default all)\n"
    "  --threads T         threads splitting each batch (default: cores / local processes)\n"
    "  --invariant V       sum gradients as V shards of the global batch, by one fixed\n"
    "                      tree (V a power of two, up to 64; 0: off, each thread sums its\n"
    "                      samples): any thread count and any P processes (P dividing V,\n"
    "                      batch B/P each) then train bitwise the model of one process\n"
    "                      with batch B. Default: the cores rounded up to a power of two,\n"
    "                      at least 8 (a thread per shard in backward); with P not\n"
    "                      dividing it, each process is one shard (thread-invariant only).\n"
    "                      It cost 0-3% of CPU time on the seed's ConvNet\n"
    "                      (bench/RESULTS.md); 0 turns it off\n"
    "distributed (the seed's flags):\n"
    "  --num-processes P   fork P worker processes on this machine (default: none, or\n"
    "                      one worker of a launcher's job when RANK/WORLD_SIZE are set,\n"
    "                      or when started by mpirun or srun)\n"
    "  --num-machines M    machines taking part, P processes each (default 1)\n"
    "  --machine-id K      this machine's index in [0, M) (default 0)\n"
    "  --master-addr A     host of rank 0 (default $MASTER_ADDR, else 127.0.0.1)\n"
    "  --master-port N     port of rank 0's store (default $MASTER_PORT, else a free\n"
    "                      port on one machine and 29500 on several)\n"
    "  --job-token T       the job's shared secret (default $DT_JOB_TOKEN): give every\n"
    "                      machine the same one where strangers can reach the port.\n"
    "                      Without it, one machine draws a random token; several derive\n"
    "                      one from the port and sizes, which keeps other jobs out but\n"
    "                      is no secret (trusted networks only). Never sent on the wire.\n"
    "  --backend NAME      auto (default: shm on one host, tcp across hosts, hybrid\n"
    "                      when hosts run several processes each), shm, tcp, hybrid\n"
    "                      (shm inside a host, tcp between), gloo (an alias of tcp,\n"
    "                      the name PyTorch scripts use),\n"
    "                      mpi (MPI's collectives; under mpirun or srun)\n"
    "  --no-overlap        reduce gradients after backward instead of during it\n"
    "                      (for measuring how much communication overlap hides)\n"
    "checkpoints:\n"
    "  --checkpoint-dir D  save checkpoints under D (at the end, and see below)\n"
    "  --checkpoint-every N\n"
    "                      also save every N steps (optimizer updates)\n"
    "  --keep K            keep the K newest checkpoints (default 3)\n"
    "  --resume            continue from the newest complete checkpoint in D, or start\n"
    "                      fresh when D holds none (one command line for every restart)\n"
    "  --fallback          with --resume: when the newest checkpoint is refused (corrupt,\n"
    "                      truncated...), warn and resume from the previous complete one\n"
    "  --max-steps N       stop after N steps in all (steps before a resume count)\n"
    "  --save-model PATH   write the final parameters to PATH (rank 0); its folder must\n"
    "                      exist and be writable (checked at start, like --checkpoint-dir,\n"
    "                      which is created when missing)\n"
    "  --load PATH         start from the parameters in PATH (a --save-model file, a\n"
    "                      checkpoint, or a checkpoint directory: its newest)\n"
    "  --eval-only         with --load: evaluate on the test set, no training\n"
    "output:\n"
    "  --log-every K       print the loss every K batches (default 10); on a terminal,\n"
    "                      a progress bar (rate, ETA, loss) instead\n"
    "  --no-test           skip the test-set evaluation\n"
    "  --stats             print a STATS line (JSON: time, samples/s, GFLOP/s, peak RSS)\n"
    "  --profile           print forward and backward time per layer (rank 0)\n"
    "  --trace FILE        write a Chrome-trace JSON of training, all ranks in one file\n"
    "                      (open it in https://ui.perfetto.dev or chrome://tracing)\n"
    "  --plot FILE.svg     write the loss curves (training, and test after each epoch)\n"
    "                      as an SVG chart (rank 0)\n"
    "  --help              this text\n"
    "The sampler advances its epoch by itself every pass (and is told the epoch each\n"
    "epoch anyway), so no two epochs repeat an order. Every rank must be given the same\n"
    "training flags: they are compared at start-up.\n"
    "Preemption: SIGTERM to any worker (or to dtrun) stops every rank at the same step\n"
    "boundary, saves a checkpoint there when --checkpoint-dir is set, and exits with\n"
    "status 75 (EX_TEMPFAIL); --resume then continues bitwise. Local processes: at most\n"
    "4 per online CPU and 256 (DT_MAX_LOCAL_PROCS overrides).\n"
    "Exit status: 0 done, 1 failed, 2 usage error, 75 stopped by SIGTERM.\n";

static int parse_args(int argc, char **argv, args *a) {
    *a      = (args){.epochs = 1, .batch_size = 128, .lr = 0.5, .log_every = 10, .num_machines = 1};
    a->keep = 3;
    a->invariant = -1;
    enum {
        EPOCHS = 1000,
        BATCH,
        LR,
        SEED,
        DATA,
        LIMIT,
        THREADS,
        LOG_EVERY,
        NO_TEST,
        STATS,
        PROFILE,
        TRACE,
        PLOT,
        NPROC,
        NMACH,
        MACHID,
        MADDR,
        MPORT,
        BACKEND,
        NO_OVERLAP,
        HELP,
        CKPT_DIR,
        CKPT_EVERY,
        KEEP,
        RESUME,
        FALLBACK,
        MAX_STEPS,
        SAVE_MODEL,
        LOAD,
        EVAL_ONLY,
        JOB_TOKEN,
        INVARIANT
    };
    static const struct option opts[] = {{"epochs", required_argument, 0, EPOCHS},
                                         {"batch-size", required_argument, 0, BATCH},
                                         {"lr", required_argument, 0, LR},
                                         {"seed", required_argument, 0, SEED},
                                         {"data-dir", required_argument, 0, DATA},
                                         {"limit", required_argument, 0, LIMIT},
                                         {"threads", required_argument, 0, THREADS},
                                         {"log-every", required_argument, 0, LOG_EVERY},
                                         {"no-test", no_argument, 0, NO_TEST},
                                         {"stats", no_argument, 0, STATS},
                                         {"profile", no_argument, 0, PROFILE},
                                         {"trace", required_argument, 0, TRACE},
                                         {"plot", required_argument, 0, PLOT},
                                         {"num-processes", required_argument, 0, NPROC},
                                         {"num-machines", required_argument, 0, NMACH},
                                         {"machine-id", required_argument, 0, MACHID},
                                         {"master-addr", required_argument, 0, MADDR},
                                         {"master-port", required_argument, 0, MPORT},
                                         {"job-token", required_argument, 0, JOB_TOKEN},
                                         {"backend", required_argument, 0, BACKEND},
                                         {"no-overlap", no_argument, 0, NO_OVERLAP},
                                         {"checkpoint-dir", required_argument, 0, CKPT_DIR},
                                         {"checkpoint-every", required_argument, 0, CKPT_EVERY},
                                         {"keep", required_argument, 0, KEEP},
                                         {"resume", no_argument, 0, RESUME},
                                         {"fallback", no_argument, 0, FALLBACK},
                                         {"max-steps", required_argument, 0, MAX_STEPS},
                                         {"save-model", required_argument, 0, SAVE_MODEL},
                                         {"load", required_argument, 0, LOAD},
                                         {"eval-only", no_argument, 0, EVAL_ONLY},
                                         {"invariant", required_argument, 0, INVARIANT},
                                         {"help", no_argument, 0, HELP},
                                         {0, 0, 0, 0}};
    int                        c;
    opterr = 0;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        dt_status st = DT_OK;
        switch (c) {
        case EPOCHS:
            st = dt_parse_long(optarg, 1, 100000, "--epochs", &a->epochs);
            break;
        case BATCH:
            st = dt_parse_long(optarg, 1, 65536, "--batch-size", &a->batch_size);
            break;
        case LR:
            st = dt_parse_double(optarg, 0.0, 1e6, "--lr", &a->lr);
            break;
        case SEED:
            st = dt_parse_long(optarg, 0, 0x7fffffffffffffffL, "--seed", &a->seed);
            break;
        case DATA:
            a->data_dir = optarg;
            break;
        case LIMIT:
            st = dt_parse_long(optarg, 1, 1L << 32, "--limit", &a->limit);
            break;
        case THREADS:
            st = dt_parse_long(optarg, 1, 256, "--threads", &a->threads);
            break;
        case LOG_EVERY:
            st = dt_parse_long(optarg, 1, 1L << 30, "--log-every", &a->log_every);
            break;
        case NO_TEST:
            a->no_test = true;
            break;
        case STATS:
            a->stats = true;
            break;
        case TRACE:
            a->trace = optarg;
            break;
        case PLOT:
            a->plot = optarg;
            break;
        case PROFILE:
            a->profile = true;
            break;
        case NPROC:
            st = dt_parse_long(optarg, 1, 1024, "--num-processes", &a->num_processes);
            break;
        case NMACH:
            st = dt_parse_long(optarg, 1, 65536, "--num-machines", &a->num_machines);
            break;
        case MACHID:
            st = dt_parse_long(optarg, 0, 65535, "--machine-id", &a->machine_id);
            break;
        case MADDR:
            a->master_addr = optarg;
            break;
        case MPORT:
            st = dt_parse_long(optarg, 1, 65535, "--master-port", &a->master_port);
            break;
        case JOB_TOKEN:
            if (!*optarg) {
                fprintf(stderr, "dtrain-mnist: --job-token expects a non-empty token\n");
                return 2;
            }
            setenv("DT_JOB_TOKEN", optarg, 1); // read by dt_spawn and dt_pg_init
            break;
        case BACKEND:
            a->backend = optarg;
            if (strcmp(optarg, "auto") && strcmp(optarg, "shm") && strcmp(optarg, "tcp") &&
                strcmp(optarg, "hybrid") && strcmp(optarg, "gloo") && strcmp(optarg, "mpi"))
                st = dt_fail(DT_ERR_ARG,
                             "--backend expects auto, shm, tcp, hybrid or mpi (gloo: an alias of "
                             "tcp), found \"%s\"",
                             optarg);
            break;
        case NO_OVERLAP:
            a->no_overlap = true;
            break;
        case CKPT_DIR:
            a->checkpoint_dir = optarg;
            break;
        case CKPT_EVERY:
            st = dt_parse_long(optarg, 1, 1L << 40, "--checkpoint-every", &a->checkpoint_every);
            break;
        case KEEP:
            st = dt_parse_long(optarg, 1, 1000000, "--keep", &a->keep);
            break;
        case RESUME:
            a->resume = true;
            break;
        case FALLBACK:
            a->fallback = true;
            break;
        case MAX_STEPS:
            st = dt_parse_long(optarg, 1, 1L << 40, "--max-steps", &a->max_steps);
            break;
        case SAVE_MODEL:
            a->save_model = optarg;
            break;
        case LOAD:
            a->load = optarg;
            break;
        case EVAL_ONLY:
            a->eval_only = true;
            break;
        case INVARIANT:
            st = dt_parse_long(optarg, 0, 64, "--invariant", &a->invariant);
            if (!st && a->invariant & (a->invariant - 1))
                st = dt_fail(DT_ERR_ARG,
                             "--invariant: expected 0 or a power of two up to 64, "
                             "found %ld",
                             a->invariant);
            break;
        case HELP:
            fputs(usage, stdout);
            exit(0);
        default:
            fprintf(stderr, "dtrain-mnist: unknown option \"%s\"\n%s", argv[optind - 1], usage);
            return 2;
        }
        if (st != DT_OK) {
            fprintf(stderr, "dtrain-mnist: %s\n", dt_last_error());
            return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "dtrain-mnist: unexpected argument \"%s\"\n", argv[optind]);
        return 2;
    }
    if (a->machine_id >= a->num_machines) {
        fprintf(stderr,
                "dtrain-mnist: --machine-id expects a value below --num-machines (%ld), "
                "found %ld\n",
                a->num_machines, a->machine_id);
        return 2;
    }
    if (a->num_machines > 1 && a->num_processes == 0) {
        fprintf(stderr, "dtrain-mnist: --num-machines needs --num-processes\n");
        return 2;
    }
    const char *needs = NULL;
    if (a->checkpoint_every && !a->checkpoint_dir)
        needs = "--checkpoint-every needs --checkpoint-dir";
    else if (a->resume && !a->checkpoint_dir)
        needs = "--resume needs --checkpoint-dir";
    else if (a->fallback && !a->resume)
        needs = "--fallback needs --resume";
    else if (a->eval_only && !a->load)
        needs = "--eval-only needs --load PATH";
    else if (a->eval_only && a->no_test)
        needs = "--eval-only evaluates on the test set; it cannot go with --no-test";
    if (needs) {
        fprintf(stderr, "dtrain-mnist: %s\n", needs);
        return 2;
    }
    return 0;
}

// What every worker shares: arguments, the datasets (loaded once, before forking, so
// forked workers share the pages) and the start time (CLOCK_MONOTONIC is system-wide,
// so it means the same in the children).
typedef struct job {
    const args *a;
    dt_dataset  train, test;
    double      start;
} job;

static void print_profile(const dt_model *m, double train_secs) {
    double total = 0;
    printf("%-4s %-12s %10s %10s %7s\n", "layer", "kind", "forward_s", "backward_s", "share");
    for (int i = 0; i < dt_model_num_layers(m); i++) {
        double f, b;
        dt_model_profile(m, i, &f, &b);
        total += f + b;
        printf("%-4d %-12s %10.3f %10.3f %6.1f%%\n", i, dt_model_layer_kind(m, i), f, b,
               100.0 * (f + b) / train_secs);
    }
    printf("%-17s %21.3f %6.1f%%  (the rest: data, loss, optimizer, gradient sync)\n", "all layers",
           total, 100.0 * total / train_secs);
}

// Test-set loss and accuracy, each rank evaluating its share (every sample once across
// ranks), summed over ranks.
static dt_status evaluate(dt_model *m, dt_pg *pg, const dt_dataset *test, size_t batch,
                          int64_t *correct, double *mean_loss) {
    int             world = pg ? dt_pg_size(pg) : 1, rank = pg ? dt_pg_rank(pg) : 0;
    dt_sampler_opts so = dt_sampler_opts_default();
    so.num_replicas    = world;
    so.rank            = rank;
    so.shuffle         = false;
    so.eval            = true;
    dt_sampler    *s   = dt_sampler_init(test->n, &so);
    dt_loader_opts lo  = dt_loader_opts_default();
    lo.batch_size      = batch;
    dt_loader *l       = s ? dt_loader_init(test, s, &lo) : NULL;
    if (!l) {
        dt_sampler_free(s);
        return dt_last_status();
    }
    dt_model_train(m, false);
    dt_loader_begin_epoch(l, 0);
    dt_batch  b;
    double    total = 0;
    int64_t   hits  = 0;
    dt_status st    = DT_OK;
    while (st == DT_OK && dt_loader_next(l, &b)) {
        float loss;
        if ((st = dt_model_forward(m, b.x, (int)b.size)) ||
            (st = dt_loss_nll(dt_model_output(m), b.y, (int)b.size, 10, &loss, NULL)))
            break;
        total += (double)loss * (double)b.size;
        hits += dt_count_correct(dt_model_output(m), b.y, (int)b.size, 10);
    }
    if (st == DT_OK)
        st = dt_loader_status(l);
    dt_model_train(m, true);
    dt_loader_free(l);
    dt_sampler_free(s);
    if (st == DT_OK && pg) {
        float lsum = (float)total;
        if ((st = dt_pg_all_reduce(pg, &hits, &hits, 1, DT_INT64, DT_REDUCE_SUM)) ||
            (st = dt_pg_all_reduce(pg, &lsum, &lsum, 1, DT_FLOAT32, DT_REDUCE_SUM)))
            return st;
        total = lsum;
    }
    *correct   = hits;
    *mean_loss = total / (double)test->n;
    return st;
}

// Every replica must end with the same weights; a difference is a bug, said loudly.
static dt_status check_replicas(dt_model *m, dt_pg *pg, uint32_t *crc_out) {
    uint32_t crc = dt_crc32c(0, dt_model_params(m), dt_model_num_params(m) * sizeof(float));
    *crc_out     = crc;
    if (!pg)
        return DT_OK;
    int      world = dt_pg_size(pg);
    int32_t *all   = dt_alloc(sizeof(int32_t) * (size_t)world);
    int32_t  mine  = (int32_t)crc;
    if (!all)
        return DT_ERR_NOMEM;
    dt_status st = dt_pg_all_gather(pg, &mine, all, 1, DT_INT32);
    for (int r = 1; st == DT_OK && r < world; r++)
        if (all[r] != all[0])
            st = dt_fail(DT_ERR_INTERNAL,
                         "replicas diverged: rank 0's parameters have CRC32C %08x, rank %d's %08x",
                         (uint32_t)all[0], r, (uint32_t)all[r]);
    dt_free(all);
    return st;
}

// The configuration a resumed run must share with the checkpoint to continue the same
// computation, saved as key/values. Seed and batch size change what a step computes
// (sampler order, dropout masks, which samples a step sees): a mismatch is refused.
// Learning rate and threads may change deliberately: a warning says the run will not
// be bitwise equal to an uninterrupted one. The world size and the data set size are
// checked by the library (the checkpoint's header and the sampler's state).
typedef struct run_config {
    char seed[24], batch_size[24], lr[32], threads[24], epochs[24];
} run_config;

static void config_of(const args *a, long threads, run_config *c) {
    snprintf(c->seed, sizeof c->seed, "%ld", a->seed);
    snprintf(c->batch_size, sizeof c->batch_size, "%ld", a->batch_size);
    snprintf(c->lr, sizeof c->lr, "%.9g", a->lr);
    snprintf(c->threads, sizeof c->threads, "%ld", threads);
    snprintf(c->epochs, sizeof c->epochs, "%ld", a->epochs);
}

static dt_status check_config(const dt_ckpt_info *info, const run_config *c, bool lead) {
    struct {
        const char *key, *flag, *mine;
        bool        refuse;
    } items[] = {{"seed", "--seed", c->seed, true},
                 {"batch_size", "--batch-size", c->batch_size, true},
                 {"lr", "--lr", c->lr, false},
                 {"threads", "--threads", c->threads, false}};
    for (size_t i = 0; i < sizeof items / sizeof items[0]; i++) {
        const char *saved = dt_ckpt_info_get(info, items[i].key);
        if (!saved || strcmp(saved, items[i].mine) == 0)
            continue;
        if (items[i].refuse)
            return dt_fail(DT_ERR_MISMATCH,
                           "--resume: %s was written with %s %s, expected the same, found %s %s "
                           "in this run (hint: resume with the first run's flags, or use "
                           "another --checkpoint-dir)",
                           info->path, items[i].flag, saved, items[i].flag, items[i].mine);
        if (lead)
            fprintf(stderr,
                    "dtrain-mnist: warning: %s was written with %s %s, this run has %s %s; the "
                    "result will differ from an uninterrupted run\n",
                    info->path, items[i].flag, saved, items[i].flag, items[i].mine);
    }
    return DT_OK;
}

// The flags that change what a collective or a step computes: every rank must have
// rank 0's values, checked once at start-up instead of a mismatch (or a silent
// difference) later.
static dt_status check_shared_flags(const job *j, dt_pg *pg) {
    const args *a = j->a;
    int64_t     lr;
    memcpy(&lr, &a->lr, sizeof lr);
    const mnist_setting s[] = {
        {"--epochs", a->epochs, false, false},
        {"--batch-size", a->batch_size, false, false},
        {"--lr", lr, true, false},
        {"--seed", a->seed, false, false},
        {"--limit", a->limit, false, false},
        {"--max-steps", a->max_steps, false, false},
        {"--checkpoint-every", a->checkpoint_every, false, false},
        {"--checkpoint-dir", a->checkpoint_dir != NULL, false, true},
        {"--resume", a->resume, false, true},
        {"--fallback", a->fallback, false, true},
        {"--stats", a->stats, false, true},
        {"--no-test", a->no_test, false, true},
        {"--eval-only", a->eval_only, false, true},
        {"--load", a->load != NULL, false, true},
        {"--no-overlap", a->no_overlap, false, true},
        {"the training set's size (--data-dir, --limit)", (int64_t)j->train.n, false, false},
        {"the test set's size (--data-dir)", (int64_t)j->test.n, false, false},
    };
    return mnist_check_settings(pg, s, (int)(sizeof s / sizeof s[0]));
}

// One worker: rank `rank` of a group (pg), or the only process (pg NULL).
static int train_worker(job *j, dt_pg *pg) {
    const args *a     = j->a;
    int         world = pg ? dt_pg_size(pg) : 1, rank = pg ? dt_pg_rank(pg) : 0;
    bool        lead = rank == 0;
    // The first process of each machine prints the summary lines, as the seed's script
    // does on every machine (LOCAL_RANK from the launcher, else by host).
    bool         local_lead = !pg || dt_pg_local_rank(pg) == 0;
    bool         preempted  = false; // SIGTERM seen by some rank: stop at this step
    dt_model    *m          = NULL;
    dt_ddp      *ddp        = NULL;
    dt_optim    *opt        = NULL;
    dt_sampler  *smp        = NULL;
    dt_loader   *ld         = NULL;
    float       *dlogp      = NULL;
    uint64_t    *keys       = NULL; // dropout keys of a batch: its samples' dataset indices
    dt_progress *bar        = NULL; // rank 0's bar on a terminal, log lines elsewhere
    dt_plot     *plot       = NULL; // rank 0's loss curves (--plot)
    int          rc         = 1;
    double       accuracy = -1, ckpt_secs = 0;
    int64_t      step = 0, last_saved = -1, ckpt_saves = 0, samples_seen = 0;
    long         first_epoch = 0;

    if (check_shared_flags(j, pg))
        goto done;
    long threads = a->threads;
    if (!threads) {
        long cores = sysconf(_SC_NPROCESSORS_ONLN), local = pg ? dt_pg_local_size(pg) : 1;
        threads = cores / (local > 0 ? local : 1);
        if (threads < 1)
            threads = 1;
    }
    // Gradient shards (--invariant V): this rank holds shards rank + world * k of the
    // global batch's V, so its local positions j = k (mod V / world) form local shard k
    // (the sampler gives rank r global positions r + world * j); DDP continues the tree
    // over ranks. A world that does not divide the default V gets one shard per rank.
    long v = a->invariant, shards = 0;
    if (v < 0) { // the default: at least 8, and at least the cores, so that threads have
                 // a shard each in the convolutions' backward
        long cores = sysconf(_SC_NPROCESSORS_ONLN);
        for (v = 8; v < cores && v < 64; v *= 2)
            ;
    }
    if (v > 0 && v % world == 0)
        shards = v / world;
    else if (v > 0 && a->invariant > 0) {
        dt_fail(DT_ERR_ARG,
                "--invariant %ld: expected a world size dividing it, found %d processes", v, world);
        goto done;
    } else if (v > 0)
        shards = 1;
    if (dt_model_init_mnist_convnet(&m, (uint64_t)a->seed, 0.10f, 0.25f) ||
        dt_model_set_threads(m, (int)threads) || dt_model_set_grad_shards(m, (int)shards))
        goto done;
    dt_adadelta_opts ao = dt_adadelta_opts_default();
    ao.lr               = (float)a->lr;
    if (!(opt = dt_optim_init_adadelta(dt_model_params(m), dt_model_grads(m),
                                       dt_model_num_params(m), &ao)))
        goto done;
    dt_sampler_opts so = dt_sampler_opts_default();
    so.num_replicas    = world;
    so.rank            = rank;
    so.seed            = (uint64_t)a->seed;
    dt_loader_opts lo  = dt_loader_opts_default();
    lo.batch_size      = (size_t)a->batch_size;
    if (!(smp = dt_sampler_init(j->train.n, &so)) || !(ld = dt_loader_init(&j->train, smp, &lo)) ||
        !(dlogp = dt_alloc(sizeof(float) * 10 * (size_t)a->batch_size)) ||
        !(keys = dt_alloc(sizeof *keys * (size_t)a->batch_size)) ||
        dt_model_reserve(m, (int)a->batch_size))
        goto done;
    if (a->load) {
        if (dt_ckpt_load_model(a->load, m))
            goto done;
        if (lead)
            printf("Loaded parameters from %s\n", a->load);
    }

    // Dropout masks: a stream of their own under the seed, split by epoch, then by
    // layer and by the sample's dataset index (dt_model_set_sample_keys): a sample gets
    // the same masks whichever rank and batch it lands in, so 1 x 128, 2 x 64 and 4 x 32
    // train one model, and a run can be replayed exactly. Checkpoints carry the stream's
    // root state (the masks need nothing else).
    dt_rng     base = dt_rng_init((uint64_t)a->seed);
    dt_rng     root = dt_rng_split(&base, 0x64726f70 /* "drop" */);
    run_config cfg;
    config_of(a, threads, &cfg);
    dt_ckpt_rng   rngs[] = {{"dropout", &root}};
    dt_ckpt_kv    kvs[]  = {{"program", "dtrain-mnist"},    {"seed", cfg.seed},
                            {"batch_size", cfg.batch_size}, {"lr", cfg.lr},
                            {"threads", cfg.threads},       {"epochs", cfg.epochs}};
    dt_ckpt_state cs     = {.model   = m,
                            .optim   = opt,
                            .sampler = smp,
                            .rngs    = rngs,
                            .nrngs   = 1,
                            .kvs     = kvs,
                            .nkvs    = (int)(sizeof kvs / sizeof kvs[0])};
    dt_ckpt_opts  copts  = dt_ckpt_opts_default();
    copts.keep           = (int)a->keep;
    copts.fallback       = a->fallback;
    if (a->resume && !a->eval_only) {
        dt_ckpt_info info;
        dt_status    st = dt_ckpt_load(a->checkpoint_dir, pg, &cs, &copts, &info);
        if (!st && info.found)
            st = check_config(&info, &cfg, lead);
        if (!st && info.found) {
            step        = info.step;
            last_saved  = info.step;
            first_epoch = (long)info.epoch;
            if (lead)
                printf("resumed from %s (epoch %llu, batch %zu)%s\n", info.path,
                       (unsigned long long)info.epoch, info.position / (size_t)a->batch_size,
                       info.refused ? " after refusing newer checkpoints" : "");
        } else if (!st && lead) {
            printf("no checkpoint in %s: starting fresh\n", a->checkpoint_dir);
        }
        dt_ckpt_info_free(&info);
        if (st)
            goto done;
        fflush(stdout);
    }
    if (pg) {
        dt_ddp_opts o = dt_ddp_opts_default();
        o.overlap     = !a->no_overlap;
        o.tree_reduce = shards > 0 && v % world == 0;
        if (dt_ddp_init(&ddp, m, pg, &o))
            goto done;
    }

    size_t nbatches =
        (dt_sampler_num_samples(smp) + (size_t)a->batch_size - 1) / (size_t)a->batch_size;
    dt_model_set_profile(m, a->profile);
    dt_progress_opts po = dt_progress_opts_default();
    po.log_every        = a->log_every;
    if (lead && (dt_progress_new(&bar, &po) || (a->plot && dt_plot_new(&plot, NULL))))
        goto done;
    if (a->trace && dt_trace_start(NULL))
        goto done;
    double train_start = dt_now();
    mnist_preempt_arm(); // from here to the release, SIGTERM stops at a step boundary
    bool stop = a->eval_only || (a->max_steps && step >= a->max_steps);
    for (long epoch = first_epoch; !stop && epoch < a->epochs; epoch++) {
        dt_loader_begin_epoch(ld, epoch);
        dt_rng   er = dt_rng_split(&root, (uint64_t)epoch);
        dt_batch b;
        dt_model_set_rng(m, &er);
        dt_progress_begin_epoch(bar, epoch, nbatches);
        while (!stop && dt_loader_next(ld, &b)) {
            float loss;
            for (size_t i = 0; i < b.size; i++)
                keys[i] = b.indices[i];
            if (dt_model_set_sample_keys(m, keys, (int)b.size) ||
                dt_model_forward(m, b.x, (int)b.size) ||
                dt_loss_nll(dt_model_output(m), b.y, (int)b.size, 10, &loss, dlogp))
                goto done;
            dt_model_zero_grad(m);
            if (dt_model_backward(m, dlogp) || (ddp && dt_ddp_sync(ddp)))
                goto done;
            dt_optim_step(opt);
            step++;
            samples_seen += (int64_t)b.size;
            dt_progress_step(bar, b.index, b.size * (size_t)world, loss);
            if (plot && b.index % (size_t)a->log_every == 0 &&
                dt_plot_add(plot, DT_PLOT_TRAIN, (double)step, loss))
                goto done;
            if (a->checkpoint_every && step % a->checkpoint_every == 0) {
                double t0 = dt_now();
                cs.step   = step;
                if (dt_ckpt_save(a->checkpoint_dir, pg, &cs, &copts))
                    goto done;
                ckpt_secs += dt_now() - t0;
                ckpt_saves++;
                last_saved = step;
            }
            if (mnist_preempt_agree(pg, &preempted))
                goto done;
            stop = preempted || (a->max_steps && step >= a->max_steps);
        }
        dt_progress_end_epoch(bar);
        if (dt_loader_status(ld))
            goto done;
        if (a->plot && !a->no_test && !stop && epoch + 1 < a->epochs) { // a test-loss point
            int64_t c;
            double  vl;
            if (evaluate(m, pg, &j->test, (size_t)a->batch_size, &c, &vl) ||
                (plot && dt_plot_add(plot, DT_PLOT_VAL, (double)step, vl)))
                goto done;
        }
    }
    // A last checkpoint where training stopped, so a resume after the end (or after a
    // failure during evaluation) has nothing to redo.
    if (a->checkpoint_dir && !a->eval_only && step != last_saved) {
        double t0 = dt_now();
        cs.step   = step;
        if (dt_ckpt_save(a->checkpoint_dir, pg, &cs, &copts))
            goto done;
        ckpt_secs += dt_now() - t0;
        ckpt_saves++;
    }
    if (preempted) {
        if (local_lead)
            printf("Stopped by SIGTERM at step %lld: %s\n", (long long)step,
                   a->checkpoint_dir ? "checkpoint saved, run again with --resume to continue"
                                     : "nothing saved (no --checkpoint-dir)");
        rc = MNIST_EXIT_PREEMPTED;
        goto done;
    }
    mnist_preempt_release(); // from here on, SIGTERM ends the process at once
    if (pg && dt_pg_barrier(pg))
        goto done;
    double finished = dt_now();
    if (local_lead && !a->eval_only) {
        printf("Finished training in %.2f secs\n", finished - j->start);
        fflush(stdout);
        if (lead && a->profile)
            print_profile(m, finished - train_start);
    }
    if (a->trace && dt_trace_save(pg, a->trace))
        goto done;
    if (lead && a->trace)
        printf("Wrote the trace to %s\n", a->trace);
    uint32_t crc;
    if (check_replicas(m, pg, &crc))
        goto done;
    if (lead && pg)
        printf("Parameters identical on all %d ranks (CRC32C %08x)\n", world, crc);
    if (lead && a->save_model) {
        if (dt_ckpt_save_model(a->save_model, m))
            goto done;
        printf("Saved the model to %s\n", a->save_model);
    }
    if (!a->no_test) {
        int64_t correct   = 0;
        double  mean_loss = 0;
        if (evaluate(m, pg, &j->test, (size_t)a->batch_size, &correct, &mean_loss))
            goto done;
        accuracy = 100.0 * (double)correct / (double)j->test.n;
        if (plot && dt_plot_add(plot, DT_PLOT_VAL, (double)step, mean_loss))
            goto done;
        if (local_lead)
            printf("Test accuracy: %.2f%% (%lld/%zu), average loss %.4f\n", accuracy,
                   (long long)correct, j->test.n, mean_loss);
    }
    if (plot) {
        if (dt_plot_write_svg(plot, a->plot))
            goto done;
        printf("Wrote the loss curves to %s\n", a->plot);
    }
    if (a->stats) {
        struct rusage ru;
        getrusage(RUSAGE_SELF, &ru);
        int64_t rss = ru.ru_maxrss; // KiB; the largest over ranks is reported
        if (pg && dt_pg_all_reduce(pg, &rss, &rss, 1, DT_INT64, DT_REDUCE_MAX))
            goto done;
        double  wait_s = 0;
        int64_t steps  = 0;
        if (ddp)
            dt_ddp_stats(ddp, &wait_s, &steps);
        // Samples trained by this run (a resumed run trains fewer), padding included.
        double samples = (double)samples_seen * world;
        double flops   = samples * dt_model_train_flops_per_sample(m);
        double loop    = finished - train_start;
        if (lead)
            printf("STATS {\"secs\": %.3f, \"train_loop_secs\": %.3f, \"samples_per_sec\": %.1f, "
                   "\"gflops\": %.1f, \"peak_rss_mib\": %.1f, \"world\": %d, \"threads\": %ld, "
                   "\"backend\": \"%s\", \"ddp_wait_secs\": %.3f, \"accuracy\": %.2f, "
                   "\"checkpoints\": %lld, \"checkpoint_secs\": %.3f, \"blas\": \"%s\"}\n",
                   finished - j->start, loop, loop > 0 ? samples / loop : 0.0,
                   loop > 0 ? flops / loop * 1e-9 : 0.0, (double)rss / 1024.0, world, threads,
                   pg ? dt_pg_backend(pg) : "none", wait_s, accuracy, (long long)ckpt_saves,
                   ckpt_secs, dt_blas_info());
    }
    rc = 0;
done:
    if (rc == 1) {
        if (pg)
            fprintf(stderr, "dtrain-mnist: rank %d: %s\n", rank, dt_last_error());
        else
            fprintf(stderr, "dtrain-mnist: %s\n", dt_last_error());
    }
    fflush(stdout);
    dt_free(dlogp);
    dt_free(keys);
    dt_progress_free(bar);
    dt_plot_free(plot);
    dt_loader_free(ld);
    dt_sampler_free(smp);
    dt_optim_free(opt);
    dt_ddp_free(ddp);
    dt_model_free(m);
    return rc;
}

// The datasets against the model's input shape, before any process starts training:
// images of another size would be read past their end (smaller) or trained as garbage
// (larger). The model is built only to ask its shape.
static dt_status check_shapes(const job *j) {
    dt_model *m;
    int       c, h, w;
    DT_TRY(dt_model_init_mnist_convnet(&m, 0, 0.0f, 0.0f));
    dt_model_input_shape(m, &c, &h, &w);
    dt_model_free(m);
    DT_TRY(dt_dataset_check_shape(&j->train, "training set", c, h, w));
    if (!j->a->no_test)
        DT_TRY(dt_dataset_check_shape(&j->test, "test set", c, h, w));
    return DT_OK;
}

static int run_worker_from_env(job *j) {
    dt_pg_opts o = dt_pg_opts_default();
    o.backend    = j->a->backend;
    dt_pg *pg    = dt_pg_init_from_env(&o);
    if (!pg) {
        fprintf(stderr, "dtrain-mnist: %s\n", dt_last_error());
        return 1;
    }
    int rc = train_worker(j, pg);
    if (rc && rc != MNIST_EXIT_PREEMPTED)
        dt_pg_abort(pg, "a worker failed");
    dt_pg_free(pg);
    return rc;
}

static int spawned(int local_rank, void *arg) {
    (void)local_rank;      // dt_spawn has set RANK, LOCAL_RANK and the rest
    mnist_preempt_watch(); // the parent's watcher did not survive the fork
    return run_worker_from_env(arg);
}

static void setenv_long(const char *name, long v) {
    char buf[32];
    snprintf(buf, sizeof buf, "%ld", v);
    setenv(name, buf, 1);
}

// Output paths are checked before any data is read or any process started, so a typo
// costs seconds, not a training run. The model file is written by rank 0: checked where
// rank 0 runs. Checkpoints are written by every rank: checked everywhere.
static int check_outputs(const args *a, const dt_launch_env *le, bool env_ok) {
    bool has_rank0 = a->num_processes > 0
                         ? a->machine_id == 0
                         : !env_ok || le->launcher == DT_LAUNCHER_NONE || le->rank == 0;
    if ((has_rank0 && !a->eval_only && mnist_check_save_model(a->save_model)) ||
        (!a->eval_only && mnist_check_checkpoint_dir(a->checkpoint_dir))) {
        fprintf(stderr, "dtrain-mnist: %s\n", dt_last_error());
        return 1;
    }
    return 0;
}

int main(int argc, char **argv) {
    args a;
    int  rc = parse_args(argc, argv, &a);
    if (rc)
        return rc;
    // SIGTERM waits for a step boundary while training (guard.h); blocked before any
    // thread or worker starts, so they all inherit it. dt_spawn forwards it to its
    // workers; elsewhere a watcher thread takes it.
    mnist_preempt_block();
    if (a.num_processes == 0)
        mnist_preempt_watch();
    job           j = {.a = &a, .start = dt_now()};
    dt_launch_env le;
    bool          env_ok = dt_launch_env_read(&le) == DT_OK;
    if ((rc = check_outputs(&a, &le, env_ok)) != 0)
        return rc;
    dt_dataset_opts dopts = dt_dataset_opts_default();
    dopts.limit           = (size_t)a.limit;
    if (dt_dataset_load_mnist(&j.train, a.data_dir, true, &dopts) ||
        (!a.no_test && dt_dataset_load_mnist(&j.test, a.data_dir, false, NULL)) ||
        check_shapes(&j)) {
        fprintf(stderr, "dtrain-mnist: %s\n", dt_last_error());
        dt_dataset_free(&j.train);
        dt_dataset_free(&j.test);
        return 1;
    }
    if (a.num_processes > 0) {
        // The seed's launch: this process forks the local workers of machine K.
        if (a.master_addr)
            setenv("MASTER_ADDR", a.master_addr, 1);
        if (a.master_port)
            setenv_long("MASTER_PORT", a.master_port);
        else if (a.num_machines > 1 && !getenv("MASTER_PORT"))
            setenv("MASTER_PORT", "29500", 1); // torchrun's default, the same on every machine
        setenv_long("GROUP_RANK", a.machine_id);
        setenv_long("WORLD_SIZE", a.num_machines * a.num_processes);
        dt_spawn_result res;
        if (dt_spawn((int)a.num_processes, spawned, &j, &res) != DT_OK) {
            // Workers stopped by SIGTERM have said so; their status is the job's.
            if (res.exit_code == MNIST_EXIT_PREEMPTED) {
                rc = MNIST_EXIT_PREEMPTED;
            } else {
                fprintf(stderr, "dtrain-mnist: %s\n", dt_last_error());
                rc = 1;
            }
        }
    } else if (!env_ok || le.launcher != DT_LAUNCHER_NONE) {
        // RANK/WORLD_SIZE, or the variables of mpirun, mpiexec or srun (comm.h); bad
        // values are reported by dt_pg_init.
        rc = run_worker_from_env(&j);
    } else {
        rc = train_worker(&j, NULL);
    }
    dt_dataset_free(&j.train);
    dt_dataset_free(&j.test);
    return rc;
}
