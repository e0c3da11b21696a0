// trainer.c: dt_trainer (train.h): the common flags, the launch (spawn, launcher's
// environment or one process), and the training loop's plumbing: preparation (--load,
// --resume, DDP), batches, accumulation windows, the optimizer step, checkpoints,
// the SIGTERM stop, and the end-of-run checks and reports.
#include "train_impl.h"

#include "kernels/cpu.h"
#include "kernels/table.h"

#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

dt_trainer_opts dt_trainer_opts_default(void) {
    return (dt_trainer_opts){.program = "dtrain"};
}

const dt_train_args *dt_trainer_args(const dt_trainer *t) {
    return &t->a;
}

// ------------------------------------------------------------------ the common table

static const char MP[] = "model parallelism"; // the section of the model-parallel flags

// Whether `name` is a word of the space-separated list.
static bool hidden(const char *list, const char *name) {
    size_t n = strlen(name);
    for (const char *p = list; p && *p;) {
        while (*p == ' ')
            p++;
        size_t k = strcspn(p, " ");
        if (k == n && !strncmp(p, name, n))
            return true;
        p += k;
    }
    return false;
}

static void build_common(dt_trainer *t) {
    dt_train_args *a = &t->a;
    const unsigned S = DT_FLAG_SHARED;
    snprintf(t->def_epochs, sizeof t->def_epochs, "%ld",
             t->o.default_epochs > 0 ? t->o.default_epochs : 1);
    snprintf(t->epochs_help, sizeof t->epochs_help, "passes over the training set (default %s)",
             t->def_epochs);
    const char *T = "training", *D = "distributed (the seed's flags)", *C = "checkpoints",
               *O = "output";
    dt_flag f[]   = {
          {"epochs", DT_FLAG_LONG, &a->epochs, t->def_epochs, 1, 100000, "N", t->epochs_help, T,
           S | DT_FLAG_CKPT_KEEP, 0, 0},
          {"seed", DT_FLAG_LONG, &a->seed, "0", 0, 9.3e18 /* LONG_MAX */, "S",
           "seed of initialisation, shuffling and dropout (default 0)", T, S | DT_FLAG_CKPT_REFUSE, 0,
           0},
          {"threads", DT_FLAG_LONG, &a->threads, NULL, 1, 256, "T",
           "threads splitting each batch (default: cores / local processes)", T, DT_FLAG_CKPT_WARN, 0,
           0},
          {"accumulate", DT_FLAG_LONG, &a->accumulate, "1", 1, 65536, "K",
           "micro-batches per optimizer step: gradients are summed locally and\n"
             "reduced over ranks on the K-th only (default 1)",
           T, S | DT_FLAG_CKPT_REFUSE, 0, 0},
          {"clip-grad", DT_FLAG_DOUBLE, &a->clip_grad, NULL, 0, 1e30, "X",
           "clip the gradients' global norm to X (default: no clipping)", T, S | DT_FLAG_CKPT_WARN, 0,
           0},
          {"invariant", DT_FLAG_LONG, &a->invariant, "-1", 0, 64, "V",
           "sum gradients as V shards of the global batch, by one fixed\n"
             "tree (V up to 64; 0: off, each thread sums its samples): any\n"
             "thread count and P processes (P dividing V and a power of two,\n"
             "or P = V; batch B/P each) then train bitwise the model of one\n"
             "process with batch B (V 6: P 1, 2 or 6; V 3: P 1 or 3).\n"
             "Default: the cores rounded up to a power of two,\n"
             "at least 8 (a thread per shard in backward); with P not\n"
             "dividing it, each process is one shard (thread-invariant only).\n"
             "It cost 0-3% of CPU time on the seed's ConvNet\n"
             "(bench/RESULTS.md); 0 turns it off",
           T, DT_FLAG_CKPT_WARN, 0, 0},
          {"precision", DT_FLAG_STRING, &a->precision, "fp32", 0, 0, "P",
           "arithmetic of the convolutions and linear layers: fp32, or bf16 /\n"
             "fp16 operands with fp32 sums and fp32 master weights, as\n"
             "torch.autocast (docs/precision.md); fp16 adds dynamic loss\n"
             "scaling (default fp32)",
           T, S | DT_FLAG_CKPT_WARN, "fp32 bf16 fp16", "fp32, bf16 or fp16"},
          {"data-parallel", DT_FLAG_LONG, &a->data_parallel, "1", 1, DT_DP_MAX_REPLICAS, "N",
           "DataParallel: N replicas of the model on N threads of this one\n"
             "process, each on a slice of every batch, gradients summed in\n"
             "memory in a fixed order, one optimizer step (default 1: off).\n"
             "--threads is shared among them. Instead of --num-processes on\n"
             "one machine, or inside each process (DDP between them); when\n"
             "threads win and when processes do: docs/trainer.md",
           T, DT_FLAG_CKPT_WARN, 0, 0},
          {"zero", DT_FLAG_LONG, &a->zero, "0", 0, 3, "S",
           "ZeRO stage over the data-parallel ranks: 0 plain DDP (default),\n"
             "1 optimizer state sharded (1/P per rank), 2 gradients\n"
             "reduce-scattered during backward too, 3 parameters and\n"
             "gradients sharded as well, each layer gathered just before\n"
             "use (FSDP; model graphs only; docs/zero.md)",
           D, S | DT_FLAG_CKPT_WARN, 0, 0},
          {"max-rank-memory", DT_FLAG_STRING, &a->max_rank_memory, NULL, 0, 0, "BYTES",
           "refuse to start when a rank's parameters, gradients and\n"
             "optimizer state (for this --zero stage and world size) need\n"
             "more than BYTES (K, M, G suffixes); --zero 3 keeps its\n"
             "gathered layers within it",
           D, S | DT_FLAG_SHARED_GIVEN, 0, 0}, // its bytes are compared
          {"num-processes", DT_FLAG_LONG, &a->num_processes, NULL, 1, 1024, "P",
           "fork P worker processes on this machine (default: none, or\n"
             "one worker of a launcher's job when RANK/WORLD_SIZE are set,\n"
             "or when started by mpirun or srun)",
           D, 0, 0, 0},
          {"num-gpu-processes", DT_FLAG_LONG, &a->num_gpu_processes, NULL, 1, 1024, "P",
           "fork P worker processes, each training on a GPU: --num-processes\n"
             "P with --device cuda (the seed's flag)",
           D, 0, 0, 0},
          {"device", DT_FLAG_STRING, &a->device, NULL, 0, 0, "DEV",
           "where the model trains: cpu (default), cuda (GPU LOCAL_RANK %\n"
             "the GPUs, as torchrun's users pick it) or cuda:N (docs/gpu.md)",
           D, 0, 0, 0},
          {"num-machines", DT_FLAG_LONG, &a->num_machines, "1", 1, 65536, "M",
           "machines taking part, P processes each (default 1)", D, 0, 0, 0},
          {"machine-id", DT_FLAG_LONG, &a->machine_id, NULL, 0, 65535, "K",
           "this machine's index in [0, M) (default 0)", D, 0, 0, 0},
          {"master-addr", DT_FLAG_STRING, &a->master_addr, NULL, 0, 0, "A",
           "host of rank 0 (default $MASTER_ADDR, else 127.0.0.1)", D, 0, 0, 0},
          {"master-port", DT_FLAG_LONG, &a->master_port, NULL, 1, 65535, "N",
           "port of rank 0's store (default $MASTER_PORT, else a free\n"
             "port on one machine and 29500 on several)",
           D, 0, 0, 0},
          {"job-token", DT_FLAG_STRING, &a->job_token, NULL, 0, 0, "T",
           "the job's shared secret (default $DT_JOB_TOKEN): give every\n"
             "machine the same one where strangers can reach the port.\n"
             "Without it, one machine draws a random token; several derive\n"
             "one from the port and sizes, which keeps other jobs out but\n"
             "is no secret (trusted networks only). Never sent on the wire.",
           D, 0, 0, 0},
          {"backend", DT_FLAG_STRING, &a->backend, NULL, 0, 0, "NAME",
           "auto (default: shm on one host, tcp across hosts, hybrid\n"
             "when hosts run several processes each), shm, tcp, hybrid\n"
             "(shm inside a host, tcp between), gloo (an alias of tcp,\n"
             "the name PyTorch scripts use),\n"
             "mpi (MPI's collectives; under mpirun or srun),\n"
             "nccl (NCCL on the GPUs; auto's choice with --device cuda\n"
             "when every process has a GPU of its own)",
           D, 0, "auto shm tcp hybrid gloo mpi nccl",
           "auto, shm, tcp, hybrid, mpi or nccl (gloo: an alias of tcp)"},
          {"no-overlap", DT_FLAG_BOOL, &a->no_overlap, NULL, 0, 0, "",
           "reduce gradients after backward instead of during it\n"
             "(for measuring how much communication overlap hides)",
           D, S, 0, 0},
          {"ddp-compress", DT_FLAG_STRING, &a->ddp_compress, "none", 0, 0, "MODE",
           "compress DDP's gradient all-reduce: none (default), bf16 or\n"
             "fp16 (PyTorch's bf16/fp16_compress_hook: half the bytes), or\n"
             "powersgd (low-rank, error feedback; --powersgd-rank). The\n"
             "ranks' sum is then no longer --invariant's tree (docs/precision.md)",
           D, S, "none bf16 fp16 powersgd", "none, bf16, fp16 or powersgd"},
          {"powersgd-rank", DT_FLAG_LONG, &a->powersgd_rank, "4", 1, 1024, "R",
           "PowerSGD's rank with --ddp-compress powersgd (default 4)", D, S, 0, 0},
          {"ps", DT_FLAG_LONG, &a->ps, "0", 0, 1023, "N",
           "parameter servers: the last N ranks of the world hold the\n"
             "parameters in shards and step the optimizer; the others push\n"
             "gradients and pull parameters each step (synchronous;\n"
             "docs/ps.md; default 0: all-reduce among all ranks)",
           D, S, 0, 0},
          {"ps-staleness", DT_FLAG_LONG, &a->ps_staleness, "0", 0, 1000000, "K",
           "with --ps: asynchronous, a server applies each worker's\n"
             "gradient as it arrives and a worker runs at most K steps\n"
             "ahead of the slowest (default 0: synchronous)",
           D, S, 0, 0},
          {"checkpoint-dir", DT_FLAG_STRING, &a->checkpoint_dir, NULL, 0, 0, "D",
           "save checkpoints under D (at the end, and see below)", C, S | DT_FLAG_SHARED_HOST, 0, 0},
          {"checkpoint-every", DT_FLAG_LONG, &a->checkpoint_every, NULL, 1, 1L << 40, "N",
           "also save every N steps (optimizer updates)", C, S, 0, 0},
          {"keep", DT_FLAG_LONG, &a->keep, "3", 1, 1000000, "K",
           "keep the K newest checkpoints (default 3)", C, 0, 0, 0},
          {"resume", DT_FLAG_BOOL, &a->resume, NULL, 0, 0, "",
           "continue from the newest complete checkpoint in D, or start\n"
             "fresh when D holds none (one command line for every restart)",
           C, S, 0, 0},
          {"fallback", DT_FLAG_BOOL, &a->fallback, NULL, 0, 0, "",
           "with --resume: when the newest checkpoint is refused (corrupt,\n"
             "truncated...), warn and resume from the previous complete one",
           C, S, 0, 0},
          {"max-steps", DT_FLAG_LONG, &a->max_steps, NULL, 1, 1L << 40, "N",
           "stop after N steps in all (steps before a resume count)", C, S, 0, 0},
          {"save-model", DT_FLAG_STRING, &a->save_model, NULL, 0, 0, "PATH",
           "write the final parameters to PATH (rank 0); its folder must\n"
             "exist and be writable (checked at start, like --checkpoint-dir,\n"
             "which is created when missing)",
           C, 0, 0, 0},
          {"load", DT_FLAG_STRING, &a->load, NULL, 0, 0, "PATH",
           "start from the parameters in PATH (a --save-model file, a\n"
             "checkpoint, or a checkpoint directory: its newest)",
           C, S | DT_FLAG_SHARED_GIVEN, 0, 0},
          {"eval-only", DT_FLAG_BOOL, &a->eval_only, NULL, 0, 0, "",
           "with --load: evaluate on the test set, no training", C, S, 0, 0},
          {"log-every", DT_FLAG_LONG, &a->log_every, "10", 1, 1L << 30, "K",
           "print the loss every K batches (default 10); on a terminal,\n"
             "a progress bar (rate, ETA, loss) instead",
           O, 0, 0, 0},
          {"no-test", DT_FLAG_BOOL, &a->no_test, NULL, 0, 0, "", "skip the test-set evaluation", O, S,
           0, 0},
          {"stats", DT_FLAG_BOOL, &a->stats, NULL, 0, 0, "",
           "print a STATS line (JSON: time, samples/s, GFLOP/s, peak RSS)", O, S, 0, 0},
          {"profile", DT_FLAG_BOOL, &a->profile, NULL, 0, 0, "",
           "print forward and backward time per layer (graph models: per node,\n"
             "then per kind of layer with its GFLOP/s) (rank 0)",
           O, 0, 0, 0},
          {"trace", DT_FLAG_STRING, &a->trace, NULL, 0, 0, "FILE",
           "write a Chrome-trace JSON of training, all ranks in one file\n"
             "(open it in https://ui.perfetto.dev or chrome://tracing)",
           O, 0, 0, 0},
          {"plot", DT_FLAG_STRING, &a->plot, NULL, 0, 0, "FILE.svg",
           "write the loss curves (training, and test after each epoch)\n"
             "as an SVG chart (rank 0)",
           O, 0, 0, 0},
          // Model parallelism: only where the program says it can (model_parallel).
          {"dp", DT_FLAG_LONG, &a->dp, NULL, 1, 65536, "N",
           "data-parallel replicas (default: the world size / (pp x tp))", MP, S, 0, 0},
          {"pp", DT_FLAG_LONG, &a->pp, NULL, 1, 1024, "N",
           "pipeline stages on consecutive ranks (default 1)", MP, S, 0, 0},
          {"tp", DT_FLAG_LONG, &a->tp, NULL, 1, 1024, "N",
           "tensor-parallel ranks per stage (default 1; dp x pp x tp\n"
             "must be the world size)",
           MP, S, 0, 0},
          {"micro-batches", DT_FLAG_LONG, &a->micro_batches, NULL, 1, 65536, "M",
           "micro-batches per pipeline step (default: the program's, else\n"
             "pp)",
           MP, S, 0, 0},
          {"schedule", DT_FLAG_STRING, &a->schedule, "1f1b", 0, 0, "S",
           "pipeline schedule: gpipe (all forwards, then all backwards)\n"
             "or 1f1b (bounded activations; the default)",
           MP, S, "gpipe 1f1b", "gpipe or 1f1b"},
          {"cuts", DT_FLAG_STRING, &a->cuts, "auto", 0, 0, "C",
           "where the pipeline cuts the model: auto (each stage's layers\n"
             "timed on a few micro-batches at start, the cuts that make the\n"
             "slowest stage fastest; the default), uniform (the model's cut\n"
             "points spread evenly) or the cut points' names, a,b,...\n"
             "(a resumed run keeps its checkpoints' cuts)",
           MP, S, 0, 0},
          {0},
    };
    int n = 0;
    for (int i = 0; f[i].name; i++) {
        // A program whose model has no cut or split: --dp alone is meaningful, --pp and
        // --tp say why they are refused, the pipeline's own flags are left out.
        if (t->o.no_model_split && f[i].section == MP) {
            if (!strcmp(f[i].name, "micro-batches") || !strcmp(f[i].name, "schedule") ||
                !strcmp(f[i].name, "cuts"))
                continue;
            if (!strcmp(f[i].name, "pp") || !strcmp(f[i].name, "tp")) {
                char *h = t->mp_help[f[i].name[0] == 't'];
                snprintf(h, sizeof t->mp_help[0], "%s: only 1 in %s: %s",
                         f[i].name[0] == 'p' ? "pipeline stages" : "tensor-parallel ranks",
                         t->o.program, t->o.no_model_split);
                // The help's lines: a break at the first space past every 48 columns.
                for (size_t at = 48, len = strlen(h); at < len; at += 48) {
                    char *c = strchr(h + at, ' ');
                    if (!c)
                        break;
                    *c = '\n';
                    at = (size_t)(c - h);
                }
                f[i].help = h;
            }
        }
        if (t->o.hide_accumulate &&
            (!strcmp(f[i].name, "accumulate") || !strcmp(f[i].name, "clip-grad")))
            continue;
        if ((!t->o.model_parallel && f[i].section == MP) || hidden(t->o.hide_flags, f[i].name))
            continue;
        t->common[n++] = f[i];
    }
    t->common[n]  = (dt_flag){0};
    a->accumulate = 1; // also when hidden
    a->epochs     = t->o.default_epochs > 0 ? t->o.default_epochs : 1;
}

static dt_status check_args(const dt_train_args *a) {
    if (a->job_token && !*a->job_token)
        return dt_fail(DT_ERR_ARG, "--job-token expects a non-empty token");
    if (a->machine_id >= a->num_machines)
        return dt_fail(DT_ERR_ARG,
                       "--machine-id expects a value below --num-machines (%ld), found %ld",
                       a->num_machines, a->machine_id);
    const char *needs = NULL;
    if (a->num_machines > 1 && a->num_processes == 0)
        needs = "--num-machines needs --num-processes";
    else if (a->checkpoint_every && !a->checkpoint_dir)
        needs = "--checkpoint-every needs --checkpoint-dir";
    else if (a->resume && !a->checkpoint_dir)
        needs = "--resume needs --checkpoint-dir";
    else if (a->fallback && !a->resume)
        needs = "--fallback needs --resume";
    else if (a->eval_only && !a->load)
        needs = "--eval-only needs --load PATH";
    else if (a->eval_only && a->no_test)
        needs = "--eval-only evaluates on the test set; it cannot go with --no-test";
    return needs ? dt_fail(DT_ERR_ARG, "%s", needs) : DT_OK;
}

// Output paths are checked before any data is read or any process started, so a typo
// costs seconds, not a training run. The model file is written by rank 0: checked where
// rank 0 runs. Checkpoints are written by every rank: checked everywhere.
static dt_status check_outputs(const dt_train_args *a) {
    dt_launch_env le;
    bool          env_ok    = dt_launch_env_read(&le) == DT_OK;
    bool          has_rank0 = a->num_processes > 0
                                  ? a->machine_id == 0
                                  : !env_ok || le.launcher == DT_LAUNCHER_NONE || le.rank == 0;
    if (has_rank0 && !a->eval_only)
        DT_TRY(dt_train_check_save_model(a->save_model));
    if (!a->eval_only)
        DT_TRY(dt_train_check_checkpoint_dir(a->checkpoint_dir));
    return DT_OK;
}

dt_status dt_trainer_new(dt_trainer **out, int argc, char **argv, const dt_trainer_opts *opts) {
    *out          = NULL;
    dt_trainer *t = dt_alloc_zero(sizeof *t);
    if (!t)
        return DT_ERR_NOMEM;
    t->o     = opts ? *opts : dt_trainer_opts_default();
    t->start = dt_now();
    if (!t->o.program)
        t->o.program = "dtrain";
    build_common(t);
    int n = 0;
    if (t->o.flags)
        t->tables[n++] = t->o.flags;
    t->tables[n++] = t->common;
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], "--help-env") == 0) { // like --help: print, *out stays NULL
            printf("%s reads these environment variables (DT_* settings):\n", t->o.program);
            dt_settings_print(stdout);
            fflush(stdout);
            dt_free(t);
            return DT_OK;
        }
    bool      help = false;
    dt_status st   = dt_flags_parse(t->tables, argc, argv, &help);
    if (!st && !help)
        st = dt_train_device_args(&t->a);
    if (!st && !help)
        st = check_args(&t->a);
    if (!st && !help && t->a.max_rank_memory)
        st = dt_train_parse_bytes(t->a.max_rank_memory, &t->budget);
    if (!st && !help) { // --dp --pp --tp against the world size, when it is known here
        dt_launch_env le;
        int           world = 1;
        if (t->a.num_processes > 0)
            world = (int)(t->a.num_processes * t->a.num_machines);
        else if (dt_launch_env_read(&le) == DT_OK && le.launcher != DT_LAUNCHER_NONE)
            world = le.world;
        st = dt_train_mesh_check(t, world);
    }
    if (st) {
        fprintf(stderr, "%s: %s\n", t->o.program, dt_last_error());
        dt_free(t);
        return DT_ERR_ARG;
    }
    if (help) {
        printf("usage: %s [options]\n", t->o.program);
        if (t->o.summary)
            fputs(t->o.summary, stdout);
        dt_flags_print_help(t->tables, stdout);
        printf("  --help              this text\n");
        printf("  --help-env          every DT_* environment setting, its default and value\n");
        if (t->o.epilogue)
            fputs(t->o.epilogue, stdout);
        fflush(stdout);
        dt_free(t);
        return DT_OK;
    }
    if (t->a.job_token)
        setenv("DT_JOB_TOKEN", t->a.job_token, 1); // read by dt_spawn and dt_pg_init
    // SIGTERM waits for a step boundary while training; blocked before any thread or
    // worker starts, so they all inherit it. dt_spawn forwards it to its workers;
    // elsewhere a watcher thread takes it.
    dt_train_preempt_block();
    if (t->a.num_processes == 0)
        dt_train_preempt_watch();
    if ((st = check_outputs(&t->a)) != DT_OK) {
        fprintf(stderr, "%s: %s\n", t->o.program, dt_last_error());
        dt_free(t);
        return dt_fail(DT_ERR_IO, "%s", dt_last_error());
    }
    *out = t;
    return DT_OK;
}

dt_status dt_trainer_add_setting(dt_trainer *t, const char *what, int64_t value) {
    if (t->nextra >= MAX_SETTINGS)
        return dt_fail(DT_ERR_ARG,
                       "dt_trainer_add_setting: expected at most %d settings, found "
                       "more (\"%s\")",
                       MAX_SETTINGS, what);
    snprintf(t->extra[t->nextra].what, sizeof t->extra[0].what, "%s", what);
    t->extra[t->nextra].hex     = false;
    t->extra[t->nextra++].value = value;
    return DT_OK;
}

dt_status dt_trainer_add_content(dt_trainer *t, const char *what, uint64_t hash) {
    DT_TRY(dt_trainer_add_setting(t, what, (int64_t)hash));
    t->extra[t->nextra - 1].hex = true;
    return DT_OK;
}

// The CPU and the kernel set this rank runs, on rank 0 (and in --stats). Ranks whose
// sets differ (another DT_ISA, another CPU family) are told that their results agree to
// rounding and not bit for bit: every kernel set rounds its own way.
static dt_status announce_kernels(dt_trainer *t) {
    char line[256];
    if (t->rank == 0)
        dt_trainer_print(t, "CPU: %s\n", dt_kernels_describe(line, sizeof line));
    if (!t->pg)
        return DT_OK;
    int32_t mine = (int32_t)dt_isa_top(), *all = dt_alloc(sizeof(int32_t) * (size_t)t->world);
    if (!all)
        return DT_ERR_NOMEM;
    dt_status st = dt_pg_all_gather(t->pg, &mine, all, 1, DT_INT32);
    for (int r = 1; st == DT_OK && r < t->world; r++)
        if (all[r] != all[0]) {
            if (t->rank == 0)
                DT_WARN("train",
                        "ranks run different kernel sets (rank 0: %s, rank %d: %s): their "
                        "results agree to rounding, not bit for bit (--invariant and bitwise "
                        "resumes hold within one kernel set)",
                        dt_isa_name((dt_isa)all[0]), r, dt_isa_name((dt_isa)all[r]));
            break;
        }
    dt_free(all);
    return st;
}

// ------------------------------------------------------------------------- launching

static void release_worker(dt_trainer *t) {
    dt_train_device_release(t);
    dt_grad_scaler_free(t->scaler);
    t->scaler = NULL;
    dt_strategy_free(t->strat);
    t->strat = NULL, t->has_replicas = false;
    dt_sched_free(t->sched);
    dt_optim_free(t->opt);
    dt_train_mesh_release(t); // before the graph: a pipeline owns its stage's
    if (t->m)
        dt_model_free(t->m);
    else if (t->g)
        dt_graph_free(t->g);
    else
        dt_params_free(t->p);
    for (int i = 0; i < t->neval; i++) {
        dt_loader_free(t->eld[i]);
        dt_sampler_free(t->esmp[i]);
    }
    dt_loader_free(t->ld);
    dt_sampler_free(t->smp);
    dt_free(t->keys);
    dt_progress_free(t->bar);
    dt_plot_free(t->plot);
    t->bar = NULL, t->plot = NULL;
    t->sched = NULL, t->opt = NULL, t->m = NULL, t->p = NULL, t->g = NULL;
    t->ld = NULL, t->smp = NULL, t->keys = NULL, t->neval = 0;
}

// A worker begins: rank `rank` of a group (pg, owned from here on), or the only process
// (pg NULL): its threads, its random streams, the shared flags compared, the mesh.
static dt_status begin_worker(dt_trainer *t, dt_pg *pg) {
    t->in_worker  = true;
    t->pg         = pg;
    t->world      = pg ? dt_pg_size(pg) : 1;
    t->rank       = pg ? dt_pg_rank(pg) : 0;
    t->local_rank = pg ? dt_pg_local_rank(pg) : 0;
    t->local_size = pg ? dt_pg_local_size(pg) : 1;
    t->threads    = (int)t->a.threads;
    if (!t->threads) {
        long cores = sysconf(_SC_NPROCESSORS_ONLN);
        t->threads = (int)(cores / (t->local_size > 0 ? t->local_size : 1));
        if (t->threads < 1)
            t->threads = 1;
    }
    t->inv_v = t->a.invariant;
    if (t->inv_v < 0) { // the default: at least 8, and at least the cores, so that threads
                        // have a shard each in the convolutions' backward
        long cores = sysconf(_SC_NPROCESSORS_ONLN);
        for (t->inv_v = 8; t->inv_v < cores && t->inv_v < 64; t->inv_v *= 2)
            ;
    }
    // The trainer's random streams: one of their own under the seed, split by epoch
    // (then, in a dt_model, by layer and by the sample's dataset index), so a sample
    // gets the same dropout masks whichever rank and batch it lands in and a run can
    // be replayed exactly. Checkpoints carry the root's state. The name is the one
    // dtrain-mnist's checkpoints have always used.
    t->base       = dt_rng_init((uint64_t)t->a.seed);
    t->root       = dt_rng_split(&t->base, 0x64726f70 /* "drop" */);
    t->rngs[0]    = (dt_ckpt_rng){"dropout", &t->root};
    t->last_saved = -1;
    DT_TRY(dt_train_check_shared(t));
    DT_TRY(announce_kernels(t));
    DT_TRY(dt_train_ps_start(t));  // --ps: t->pg becomes the workers' group
    return dt_train_mesh_start(t); // the mesh's groups (--pp, --tp)
}

// A worker ends: its exit code from the program's status (printed when it failed), then
// everything it held released, its group aborted (after a failure) and freed.
static int end_worker(dt_trainer *t, dt_status st) {
    int rc = 0;
    if (st && t->preempted)
        rc = DT_EXIT_PREEMPTED;
    else if (st && dt_train_elastic_ended(t)) // a standby of an elastic job: done
        printf("%s: %s\n", t->o.program, dt_last_error());
    else if (st) {
        rc = 1;
        if (t->pg)
            fprintf(stderr, "%s: rank %d: %s\n", t->o.program, t->rank, dt_last_error());
        else
            fprintf(stderr, "%s: %s\n", t->o.program, dt_last_error());
    }
    fflush(stdout);
    release_worker(t);
    if (t->pg && rc && rc != DT_EXIT_PREEMPTED)
        dt_pg_abort(t->pg, "a worker failed");
    dt_pg_free(t->pg);
    t->pg = NULL;
    dt_train_ps_end(t, rc);
    dt_train_elastic_close(t, rc == 0 && t->finish_called);
    t->in_worker = false;
    return rc;
}

// Under a launcher (or a forked worker): the group from the environment, then the worker.
static bool worker_from_env(dt_trainer *t) {
    if (dt_train_elastic_wanted()) {
        // Elastic membership: alone until dt_trainer_prepare joins the rendezvous, where
        // every group of the job forms (the first one too).
        dt_status st = dt_train_elastic_open(t);
        if (!st)
            st = begin_worker(t, NULL);
        if (st != DT_OK) {
            t->exit_code = end_worker(t, st);
            return false;
        }
        return true;
    }
    dt_pg_opts o = dt_pg_opts_default();
    o.backend    = dt_train_device_backend(t); // --backend, or nccl for GPUs (device.c)
    dt_pg *pg    = NULL;
    if (dt_pg_new_from_env(&pg, &o) != DT_OK) {
        fprintf(stderr, "%s: %s\n", t->o.program, dt_last_error());
        t->exit_code = 1;
        return false;
    }
    dt_status st = begin_worker(t, pg);
    if (st != DT_OK) {
        t->exit_code = end_worker(t, st);
        return false;
    }
    return true;
}

static void setenv_long(const char *name, long v) {
    char buf[32];
    snprintf(buf, sizeof buf, "%ld", v);
    setenv(name, buf, 1);
}

bool dt_trainer_start(dt_trainer *t) {
    const dt_train_args *a = &t->a;
    if (t->started) {
        dt_fail(DT_ERR_STATE, "dt_trainer_start: expected one call, found a second");
        return false;
    }
    t->started   = true;
    t->exit_code = 1;
    dt_launch_env le;
    bool          env_ok = dt_launch_env_read(&le) == DT_OK;
    if (a->num_processes > 0) {
        // The seed's launch: this process forks the local workers of machine K, which go
        // on from here; it waits for them and takes their exit code.
        if (a->master_addr)
            setenv("MASTER_ADDR", a->master_addr, 1);
        if (a->master_port)
            setenv_long("MASTER_PORT", a->master_port);
        else if (a->num_machines > 1 && !getenv("MASTER_PORT"))
            setenv("MASTER_PORT", "29500", 1); // torchrun's default, the same everywhere
        setenv_long("GROUP_RANK", a->machine_id);
        setenv_long("WORLD_SIZE", a->num_machines * a->num_processes);
        dt_spawn_result res;
        int             local = -1;
        dt_status       st    = dt_spawn_fork((int)a->num_processes, &local, &res);
        if (local >= 0) {
            t->forked = true;
            dt_train_preempt_watch(); // the parent's watcher did not survive the fork
            return worker_from_env(t);
        }
        // Workers stopped by SIGTERM have said so; their status is the job's.
        if (st == DT_OK)
            t->exit_code = 0;
        else if (res.exit_code == DT_EXIT_PREEMPTED)
            t->exit_code = DT_EXIT_PREEMPTED;
        else {
            fprintf(stderr, "%s: %s\n", t->o.program, dt_last_error());
            t->exit_code = 1;
        }
        return false;
    }
    if (!env_ok || le.launcher != DT_LAUNCHER_NONE) // bad values: reported by dt_pg_init
        return worker_from_env(t);
    dt_status st = begin_worker(t, NULL);
    if (st != DT_OK) {
        t->exit_code = end_worker(t, st);
        return false;
    }
    return true;
}

int dt_trainer_exit(dt_trainer *t, dt_status st) {
    if (!t)
        return st ? 1 : 0;
    int rc;
    if (t->in_worker) {
        if (st == DT_OK && t->prepared && !t->finish_called)
            st = dt_trainer_finish(t);
        rc = end_worker(t, st);
    } else if (t->started) { // the parent of forked workers, or a worker that never began
        rc = t->exit_code;
    } else { // before dt_trainer_start: reading the data, say
        rc = st ? 1 : 0;
        if (st)
            fprintf(stderr, "%s: %s\n", t->o.program, dt_last_error());
    }
    bool forked = t->forked;
    dt_free(t);
    if (forked) { // a worker this process forked ends here, as dt_spawn's do
        fflush(NULL);
        _exit(rc & 0xff);
    }
    return rc;
}

// ---------------------------------------------------------------------- data

dt_status dt_trainer_loader(dt_trainer *t, const dt_dataset *ds, size_t batch, dt_split split,
                            dt_loader **out) {
    *out = NULL;
    for (int i = 0; split == DT_SPLIT_EVAL && i < t->neval; i++)
        if (t->eds[i] == ds && t->ebatch[i] == batch) { // the same evaluation again
            *out = t->eld[i];
            return DT_OK;
        }
    if (split != DT_SPLIT_EVAL && t->ld)
        return dt_fail(DT_ERR_STATE, "dt_trainer_loader: expected one training loader, found a "
                                     "second");
    // dt_trainer_prepare* restores the training loader's position with --resume (and
    // sizes the model's buffers by its batch): a training loader made after it would
    // silently restart the epoch.
    if (split != DT_SPLIT_EVAL && t->prepared)
        return dt_fail(DT_ERR_STATE,
                       "dt_trainer_loader: expected the training loader before "
                       "dt_trainer_prepare*, found it after (call dt_trainer_loader first: "
                       "--resume restores its position in dt_trainer_prepare*)");
    if (split == DT_SPLIT_EVAL && t->neval >= MAX_EVAL)
        return dt_fail(DT_ERR_STATE, "dt_trainer_loader: expected at most %d evaluation loaders",
                       MAX_EVAL);
    dt_sampler_opts so = dt_sampler_opts_default();
    so.num_replicas    = dt_train_dp_size(t); // the replicas: the world without a mesh
    so.rank            = dt_trainer_mesh_coord(t, DT_MESH_DP);
    so.seed            = (uint64_t)t->a.seed;
    if (split == DT_SPLIT_EVAL)
        so.shuffle = false, so.eval = true;
    if (split == DT_SPLIT_TRAIN_UNEVEN) // no padding: every sample once, shares may differ
        so.eval = true;
    dt_loader_opts lo = dt_loader_opts_default();
    lo.batch_size     = batch;
    if (split != DT_SPLIT_EVAL && t->el) // elastic: batch is the global batch (docs/dtrun.md)
        t->gbatch = batch;
    dt_sampler *s  = NULL;
    dt_loader  *l  = NULL;
    dt_status   st = dt_sampler_new(&s, ds->n, &so);
    if (st == DT_OK)
        st = dt_loader_new(&l, ds, s, &lo);
    if (st != DT_OK) {
        dt_sampler_free(s);
        return st;
    }
    if (split != DT_SPLIT_EVAL) {
        t->join = split == DT_SPLIT_TRAIN_UNEVEN;
        t->smp = s, t->ld = l, t->batch = batch, t->tds = ds;
        t->nbatches = dt_loader_num_batches(l);
        if (!(t->keys = dt_alloc(sizeof *t->keys * batch)))
            return DT_ERR_NOMEM;
    } else {
        t->eds[t->neval] = ds, t->ebatch[t->neval] = batch;
        t->esmp[t->neval] = s, t->eld[t->neval++] = l;
    }
    *out = l;
    return DT_OK;
}
