// loop.c: the trainer's loop (train.h): preparation (--load, --resume, DDP), batches and
// accumulation windows, the optimizer step with checkpoints and the SIGTERM stop, and
// the end of a run (last checkpoint, replica checksum, --save-model, STATS).
#include "train_impl.h"

#include "core/tree.h"
#include "kernels/cpu.h"
#include "nn/prec.h"

#include "dtrain/trace.h"

#include <string.h>
#include <sys/resource.h>

// ------------------------------------------------------------------ checkpoint config

// The configuration a resumed run must share with the checkpoint to continue the same
// computation: the flags marked DT_FLAG_CKPT_*, saved as key/values named like the
// flag ("batch-size" -> "batch_size"). REFUSE flags change what a step computes (seed,
// batch size: sampler order, dropout masks, which samples a step sees): a mismatch is
// refused. WARN flags (learning rate, threads) may change deliberately: a warning says
// the run will not be bitwise equal to an uninterrupted one. The world size and the data
// set size are checked by the checkpoints (the header and the sampler's state).
static void build_kvs(dt_trainer *t) {
    int n       = 0;
    t->kvs[n++] = (dt_ckpt_kv){"program", t->o.program};
    for (int k = 0; t->tables[k]; k++)
        for (const dt_flag *f = t->tables[k]; f->name && n < MAX_KVS; f++) {
            unsigned pol = f->flags & (DT_FLAG_CKPT_KEEP | DT_FLAG_CKPT_REFUSE | DT_FLAG_CKPT_WARN);
            if (!pol || !f->target)
                continue;
            snprintf(t->kvkey[n], sizeof t->kvkey[n], "%s", f->name);
            for (char *c = t->kvkey[n]; *c; c++)
                *c = *c == '-' ? '_' : *c;
            char *v = t->kvval[n];
            if (!strcmp(f->name, "threads")) // as resolved
                snprintf(v, sizeof t->kvval[n], "%d", t->threads);
            else if (!strcmp(f->name, "invariant"))
                snprintf(v, sizeof t->kvval[n], "%ld", t->inv_v);
            else if (f->type == DT_FLAG_LONG)
                snprintf(v, sizeof t->kvval[n], "%ld", *(long *)f->target);
            else if (f->type == DT_FLAG_DOUBLE)
                snprintf(v, sizeof t->kvval[n], "%.9g", *(double *)f->target);
            else if (f->type == DT_FLAG_BOOL)
                snprintf(v, sizeof t->kvval[n], "%d", *(bool *)f->target);
            else
                snprintf(v, sizeof t->kvval[n], "%s",
                         *(const char **)f->target ? *(const char **)f->target : "");
            t->kvpolicy[n] = pol;
            t->kvflag[n]   = f->name;
            t->kvs[n]      = (dt_ckpt_kv){t->kvkey[n], v};
            n++;
        }
    // The kernel set the steps ran on (another one rounds otherwise: a resume on it
    // continues the run to rounding, not bit for bit; check_config warns)
    if (n < MAX_KVS) {
        snprintf(t->kvkey[n], sizeof t->kvkey[n], "kernels");
        snprintf(t->kvval[n], sizeof t->kvval[n], "%s", dt_isa_name(dt_isa_top()));
        t->kvpolicy[n] = DT_FLAG_CKPT_WARN;
        t->kvflag[n]   = NULL;
        t->kvs[n]      = (dt_ckpt_kv){t->kvkey[n], t->kvval[n]};
        n++;
    }
    t->nkvs = n;
}

// The key/values are checked from the first, the program's name: another program's
// checkpoint holds another model and other flags. A REFUSE flag's key must be there: a
// checkpoint without it (a key/value section emptied by hand) says nothing about what
// its steps computed.
static dt_status check_config(const dt_trainer *t, const dt_ckpt_info *info) {
    const char *prog = dt_ckpt_info_get(info, t->kvs[0].key);
    if (!prog || strcmp(prog, t->kvs[0].value) != 0)
        return dt_fail(DT_ERR_MISMATCH,
                       "--resume: %s/state.dtck: expected the key %s = %s (a checkpoint of this "
                       "program), found %s%s%s",
                       info->path, t->kvs[0].key, t->kvs[0].value, prog ? "" : "no such key",
                       prog ? "a checkpoint of " : "", prog ? prog : "");
    for (int pass = 0; pass < 2; pass++) // refusals first, then warnings
        for (int i = 1; i < t->nkvs; i++) {
            const char *saved = dt_ckpt_info_get(info, t->kvs[i].key);
            if (!saved && pass == 0 && (t->kvpolicy[i] & DT_FLAG_CKPT_REFUSE))
                return dt_fail(DT_ERR_MISMATCH,
                               "--resume: %s/state.dtck: expected the key %s (--%s, %s in this "
                               "run), found no such key",
                               info->path, t->kvs[i].key, t->kvflag[i], t->kvs[i].value);
            if (!saved || strcmp(saved, t->kvs[i].value) == 0)
                continue;
            if (pass == 0 && (t->kvpolicy[i] & DT_FLAG_CKPT_REFUSE))
                return dt_fail(DT_ERR_MISMATCH,
                               "--resume: %s was written with --%s %s, expected the same, found "
                               "--%s %s in this run (hint: resume with the first run's flags, "
                               "or use another --checkpoint-dir)",
                               info->path, t->kvflag[i], saved, t->kvflag[i], t->kvs[i].value);
            if (pass == 1 && !t->kvflag[i] && t->rank == 0) // the kernel set
                fprintf(stderr,
                        "%s: warning: %s was written on the %s kernels, this run uses %s: it "
                        "continues the run to rounding, not bit for bit\n",
                        t->o.program, info->path, saved, t->kvs[i].value);
            else if (pass == 1 && (t->kvpolicy[i] & DT_FLAG_CKPT_WARN) && t->rank == 0)
                fprintf(stderr,
                        "%s: warning: %s was written with --%s %s, this run has --%s %s; the "
                        "result will differ from an uninterrupted run\n",
                        t->o.program, info->path, t->kvflag[i], saved, t->kvflag[i],
                        t->kvs[i].value);
        }
    return DT_OK;
}

// The counts a checkpoint restores, against its step: the trainer takes at most one
// optimizer step per step (none when fp16 skips one), and every epoch takes a step at
// least. A count beyond (a forged optimizer step of 2^62, an epoch of 2^63 - 1 that
// would resume past the last epoch and train nothing) is refused.
static dt_status check_counts(dt_trainer *t, const dt_ckpt_info *info) {
    int64_t steps = t->opt ? dt_optim_step_count(t->opt) : 0;
    if (steps > info->step)
        return dt_fail(DT_ERR_FORMAT,
                       "--resume: %s/state.dtck: section OPTM: expected an optimizer step count "
                       "<= %lld (the checkpoint's step: one optimizer step per step at most), "
                       "found %lld",
                       info->path, (long long)info->step, (long long)steps);
    dt_pg *dp = dt_train_dp_group(t);
    if (info->has_sampler && t->nbatches > 0 && info->epoch > (uint64_t)info->step)
        return dt_fail(DT_ERR_FORMAT,
                       "--resume: %s/rank-%05d.dtck: section SMPL: expected an epoch <= %lld "
                       "(the checkpoint's step: every epoch takes a step at least), found %llu",
                       info->path, dp ? dt_pg_rank(dp) : 0, (long long)info->step,
                       (unsigned long long)info->epoch);
    return DT_OK;
}

static dt_ckpt_state ckpt_state(dt_trainer *t) {
    return (dt_ckpt_state){.params  = t->p,
                           .optim   = t->opt,
                           .sampler = t->smp,
                           .step    = t->step,
                           .rngs    = t->rngs,
                           .nrngs   = 1,
                           .kvs     = t->kvs,
                           .nkvs    = t->nkvs};
}

static dt_ckpt_opts ckpt_opts(const dt_trainer *t) {
    dt_ckpt_opts o = dt_ckpt_opts_default();
    o.keep         = (int)t->a.keep;
    o.fallback     = t->a.fallback;
    return o;
}

static dt_status save(dt_trainer *t) {
    DT_TRY(dt_train_device_pull(t)); // --device cuda: the host copies the checkpoint writes
    if (t->scaler)                   // the scaler's state as of this step (its key/value)
        dt_grad_scaler_state_str(t->scaler, t->scaler_kv, sizeof t->scaler_kv);
    double        t0 = dt_now();
    dt_ckpt_state cs = ckpt_state(t);
    dt_ckpt_opts  co = ckpt_opts(t);
    if (dt_train_mesh_on(t)) { // each model part's own checkpoints
        DT_TRY(dt_train_mesh_save(t, &cs, &co));
    } else {
        DT_TRY(dt_strategy_gather_params(t->strat, 0)); // --zero 3: the whole on rank 0
        DT_TRY(dt_ckpt_save(t->a.checkpoint_dir, t->pg, &cs, &co));
        DT_TRY(dt_strategy_release_params(t->strat));
    }
    t->ckpt_secs += dt_now() - t0;
    t->ckpt_saves++;
    t->last_saved = t->step;
    return DT_OK;
}

// ------------------------------------------------------------------------- prepare

// The training loader's dataset and the evaluation loaders' made so far: the same size
// and content (the hash its reader took of the files' samples and labels) on every
// rank, or two files of the same size and other bytes would train a blend. A dataset of
// each rank's own (DT_SPLIT_TRAIN_UNEVEN) is left out. Collective; the table has the same
// length on every rank (absent loaders count as zeros).
static dt_status check_data(dt_trainer *t) {
    dt_train_setting s[2 * (MAX_EVAL + 1)];
    char             what[2 * MAX_EVAL][96];
    const bool       train = t->tds && !t->join;
    s[0]                   = (dt_train_setting){.flag  = "the training set's size (samples)",
                                                .value = train ? (int64_t)t->tds->n : 0};
    s[1]                   = (dt_train_setting){
                          .flag   = "the training set's content (a hash of the samples and labels read from its "
                                                      "files)",
                          .value  = train ? (int64_t)t->tds->content_hash : 0,
                          .is_hex = true};
    for (int i = 0; i < MAX_EVAL; i++) {
        const dt_dataset *e = i < t->neval ? t->eds[i] : NULL;
        snprintf(what[2 * i], sizeof what[0], "evaluation set %d's size (samples)", i + 1);
        snprintf(what[2 * i + 1], sizeof what[0],
                 "evaluation set %d's content (a hash of the samples and labels read from its "
                 "files)",
                 i + 1);
        s[2 + 2 * i] = (dt_train_setting){.flag = what[2 * i], .value = e ? (int64_t)e->n : 0};
        s[3 + 2 * i] = (dt_train_setting){
            .flag = what[2 * i + 1], .value = e ? (int64_t)e->content_hash : 0, .is_hex = true};
    }
    return dt_train_check_settings(t->pg, s, 2 * (MAX_EVAL + 1));
}

// The parallel strategy for the current group (src/parallel/strategy.h): at the
// preparation, and again when an elastic job's group changes.
static dt_status make_strategy(dt_trainer *t) {
    const dt_train_args *a   = &t->a;
    dt_pg               *dpg = dt_train_dp_group(t); // the world's group without a mesh
    if (dpg && a->zero == 3 && (a->data_parallel > 1 || dt_train_mesh_on(t)))
        return dt_fail(DT_ERR_ARG, "--zero 3 with %s: not supported yet (%s)",
                       a->data_parallel > 1 ? "--data-parallel" : "--pp or --tp",
                       a->data_parallel > 1 ? "replicas copy the whole parameters, which "
                                              "ZeRO-3 shards"
                                            : "a pipeline's micro-batches and a tensor "
                                              "split's parts are not gathered by units");
    dt_strategy_opts so    = {.zero              = dt_zero_opts_default(),
                              .overlap           = !a->no_overlap,
                              .tree_reduce       = t->tree_reduce,
                              .compress          = a->ddp_compress,
                              .powersgd_rank     = (int)a->powersgd_rank,
                              .broadcast_buffers = t->o.broadcast_buffers,
                              .join              = t->join,
                              .data_parallel     = dt_trainer_data_parallel(t),
                              .threads           = t->threads,
                              .ps                = t->ps};
    so.zero.stage          = dpg ? (int)a->zero : 0;
    so.zero.track_resident = so.zero.stage == 3; // the peak dt_trainer_state_bytes reports
    DT_TRY(dt_train_plan_memory(t, t->p, t->opt, &so.zero)); // --max-rank-memory
    dt_strategy_info info;
    DT_TRY(dt_strategy_new(&t->strat, t->p, t->opt, t->pg, dpg, t->mesh, t->pipe, &so, &info));
    if (info.zero_stage)
        dt_trainer_print(t, "ZeRO-%d: optimizer state %.3f MiB per rank (%.3f MiB unsharded)\n",
                         info.zero_stage, (double)info.optim_floats * 4 / 1048576,
                         (double)info.full_floats * 4 / 1048576);
    if (t->has_replicas)
        DT_TRY(dt_strategy_set_replicas(t->strat, &t->dp_ops, &t->dp_master));
    return DT_OK;
}

static dt_status elastic_start(dt_trainer *t);
static dt_status invariant_shards(dt_trainer *t, int *shards);
static dt_status elastic_boundary(dt_trainer *t, dt_status st, bool leaving, size_t next);

dt_status dt_trainer_prepare(dt_trainer *t, dt_params *p, dt_optim *opt, dt_sched *sched) {
    const dt_train_args *a = &t->a;
    if (t->prepared)
        return dt_fail(DT_ERR_STATE, "dt_trainer_prepare: expected one call, found a second");
    t->prepared = true;
    t->p = p, t->opt = opt, t->sched = sched; // owned from here on
    if (!p || !opt)
        return dt_fail(DT_ERR_ARG,
                       "dt_trainer_prepare: expected parameters and an optimizer, "
                       "found %s (%s)",
                       p ? "no optimizer" : "no parameters", dt_last_error());
    DT_TRY(check_data(t));
    if (a->load) {
        if (dt_train_mesh_on(t)) // the whole model's file, cut into this rank's part
            DT_TRY(dt_train_mesh_load_model(t, a->load));
        else
            DT_TRY(dt_ckpt_load_params(a->load, p));
        dt_trainer_print(t, "Loaded parameters from %s\n", a->load);
    }
    build_kvs(t);
    t->prec = dt_trainer_precision(t);
    if (t->prec != DT_PREC_FP32) {
        char how[160];
        dt_trainer_print(t, "Precision: %s\n", dt_prec_describe(t->prec, how, sizeof how));
    }
    if (t->prec == DT_PREC_FP16 && a->zero > 0)
        return dt_fail(DT_ERR_ARG,
                       "--precision fp16 with --zero %ld: not supported yet (the loss "
                       "scaler would check each rank's gradient shard)",
                       a->zero);
    if (t->prec == DT_PREC_FP16) { // GradScaler, its inf check agreed over the group
        dt_grad_scaler_opts so = dt_grad_scaler_opts_default();
        if (t->pg)
            so.agree = dt_ddp_agree_inf, so.agree_user = t->pg;
        DT_TRY(dt_grad_scaler_new(&t->scaler, &so));
        dt_grad_scaler_state_str(t->scaler, t->scaler_kv, sizeof t->scaler_kv);
        t->kvs[t->nkvs++] = (dt_ckpt_kv){"grad_scaler", t->scaler_kv};
    }
    DT_TRY(dt_train_mesh_check_layout(t)); // before anything is written there
    if (a->resume && !a->eval_only && !t->ps_server) {
        dt_ckpt_info  info;
        dt_ckpt_state cs = ckpt_state(t);
        dt_ckpt_opts  co = ckpt_opts(t);
        // A step-based run without a sampler (dtrain-gpt) resumes at any world size: its
        // batches follow the seed and the step, and the trainer's stream is the seed's
        // (restoring it changes nothing), so only the shared state is loaded.
        bool any_world = t->total_steps > 0 && !t->smp && !dt_train_mesh_on(t);
        if (any_world)
            co.reshard = true, cs.nrngs = 0;
        dt_status st = dt_train_mesh_on(t)
                           ? dt_train_mesh_load(t, &cs, &co, &info)
                           : dt_ckpt_load(a->checkpoint_dir, t->pg, &cs, &co, &info);
        if (!st && info.found)
            st = check_config(t, &info);
        if (!st && info.found)
            st = check_counts(t, &info);
        const char *sc = info.found ? dt_ckpt_info_get(&info, "grad_scaler") : NULL;
        if (!st && t->scaler && sc) // a checkpoint of another precision has none: fresh
            st = dt_grad_scaler_load_str(t->scaler, sc);
        if (!st && info.found) {
            t->step = t->last_saved = info.step;
            t->epoch                = (long)info.epoch;
            char by[48]             = "";
            if (info.world != t->world)
                snprintf(by, sizeof by, ", saved by %d ranks", info.world);
            if (t->smp) // where the training loader goes on
                dt_trainer_print(t, "resumed from %s (epoch %llu, batch %zu%s)%s\n", info.path,
                                 (unsigned long long)info.epoch,
                                 t->batch ? info.position / t->batch : (size_t)0, by,
                                 info.refused ? " after refusing newer checkpoints" : "");
            else // a step-based run (or a training loader to come, which is refused)
                dt_trainer_print(t, "resumed from %s (step %lld%s)%s\n", info.path,
                                 (long long)info.step, by,
                                 info.refused ? " after refusing newer checkpoints" : "");
        } else if (!st) {
            dt_trainer_print(t, "no checkpoint in %s: starting fresh\n", a->checkpoint_dir);
        }
        dt_ckpt_info_free(&info);
        DT_TRY(st);
        fflush(stdout);
    }
    if (t->pg && a->zero > 0 && t->join)
        return dt_fail(DT_ERR_ARG,
                       "--zero %ld: expected even shards (uneven inputs reduce whole "
                       "gradients after backward), found DT_SPLIT_TRAIN_UNEVEN",
                       a->zero);
    DT_TRY(dt_train_ps_prepare(t)); // a server serves here and ends its process
    DT_TRY(make_strategy(t));
    if (t->m)
        dt_model_set_profile(t->m, a->profile);
    if (t->g)
        dt_graph_set_profile(t->g, a->profile);
    dt_progress_opts po = dt_progress_opts_default();
    po.log_every        = a->log_every;
    if (t->rank == 0) {
        DT_TRY(dt_progress_new(&t->bar, &po));
        if (a->plot)
            DT_TRY(dt_plot_new(&t->plot, NULL));
    }
    if (a->trace)
        DT_TRY(dt_trace_start(NULL));
    DT_TRY(dt_train_device_start(t)); // --device cuda: the executor, with what was loaded
    if (t->el) // elastic: the first group forms here (and takes rank 0's state)
        DT_TRY(elastic_start(t));
    t->train_start = dt_now();
    dt_train_preempt_arm(); // from here to the release, SIGTERM stops at a step boundary
    t->stop = a->eval_only || (a->max_steps && t->step >= a->max_steps);
    return DT_OK;
}

// Gradient shards (--invariant V): this rank holds shards rank + world * k of the
// global batch's V, so its local positions j = k (mod V / world) form local shard k
// (the sampler gives rank r global positions r + world * j); DDP continues the tree
// over ranks. That is the one tree over V only for the worlds of dt_tree_splits (a
// divisor of V that is a power of two, or V); a world the default V does not split
// into gets one shard per rank (thread-invariant only), a given --invariant refuses it.
// The same for a Sequential model and a graph: the promise is the trainer's.
static dt_status invariant_shards(dt_trainer *t, int *shards) {
    long v  = t->inv_v;
    *shards = 0;
    if (v > 0 && dt_tree_splits(v, t->world)) {
        *shards = (int)(v / t->world);
    } else if (v > 0 && t->a.invariant > 0) {
        char ok[160] = "";
        for (long n = 1; n <= v; n++)
            if (dt_tree_splits(v, n))
                snprintf(ok + strlen(ok), sizeof ok - strlen(ok), "%s%ld", ok[0] ? ", " : "", n);
        return dt_fail(DT_ERR_ARG,
                       "--invariant %ld: %d processes cannot share the %ld gradient shards' "
                       "fixed tree (world sizes that can: %s; for %d processes, --invariant %d%s)",
                       v, t->world, v, ok, t->world, t->world,
                       (t->world & (t->world - 1)) ? "" : " or a multiple of it");
    } else if (v > 0) {
        *shards = 1;
    }
    t->tree_reduce = *shards > 0 && dt_tree_splits(v, t->world);
    return DT_OK;
}

// The training set's samples against the model's input: a model reads its input's
// numel floats per sample, so other samples would be read past their end or trained as
// garbage (dt_dataset_check_dims). Nothing to compare without a training loader (a
// step-based program feeds its own batches).
static dt_status check_input(const dt_trainer *t, const dt_shape *in) {
    if (!t->tds || !in)
        return DT_OK;
    if (in->dtype != DT_ELEM_F32)
        return dt_fail(DT_ERR_ARG,
                       "training set: expected a model whose input is float samples, found one "
                       "of int32 (token ids); feed it from a token stream, not a dataset loader");
    return dt_dataset_check_dims(t->tds, "training set", in->ndim, in->d);
}

dt_status dt_trainer_prepare_model(dt_trainer *t, dt_model *m, dt_optim *opt, dt_sched *sched) {
    t->m = m, t->opt = opt, t->sched = sched, t->prepared = true; // owned from here on
    if (!m || !opt)
        return dt_fail(DT_ERR_ARG,
                       "dt_trainer_prepare_model: expected a model and an optimizer, "
                       "found %s (%s)",
                       m ? "no optimizer" : "no model", dt_last_error());
    int c, h, w, shards;
    dt_model_input_shape(m, &c, &h, &w);
    DT_TRY(check_input(t, &(dt_shape){3, {c, h, w, 1}, DT_ELEM_F32}));
    DT_TRY(invariant_shards(t, &shards));
    dt_status st = dt_model_set_threads(m, t->threads);
    if (!st)
        st = dt_model_set_grad_shards(m, shards);
    if (!st)
        st = dt_model_set_precision(m, dt_trainer_precision(t));
    if (!st && t->batch)
        st = dt_model_reserve(m, (int)t->batch);
    if (st)
        return st;
    t->prepared = false;
    return dt_trainer_prepare(t, dt_model_as_params(m), opt, sched);
}

dt_status dt_trainer_prepare_graph(dt_trainer *t, dt_graph *g, dt_optim *opt, dt_sched *sched) {
    t->g = g, t->opt = opt, t->sched = sched; // owned from here on
    if (!g || !opt || !dt_graph_params(g)) {
        t->prepared = true;
        return dt_fail(DT_ERR_ARG,
                       "dt_trainer_prepare_graph: expected a finalized graph and an optimizer, "
                       "found %s (%s)",
                       !g     ? "no graph"
                       : !opt ? "no optimizer"
                              : "a graph not finalized",
                       dt_last_error());
    }
    int first_input = 0, shards;
    while (first_input < dt_graph_num_nodes(g) &&
           strcmp(dt_graph_node_kind(g, first_input), "input") != 0)
        first_input++;
    t->prepared = true; // a refusal below still leaves the graph owned
    DT_TRY(check_input(t, dt_graph_node_shape(g, first_input)));
    DT_TRY(invariant_shards(t, &shards));
    int coupled = dt_graph_batch_coupled(g);
    if (shards && coupled >= 0 && t->a.invariant > 0)
        return dt_fail(DT_ERR_ARG,
                       "--invariant %ld: node '%s' (%s) computes statistics over the batch, so "
                       "no split of the batch into gradient shards makes its gradient "
                       "independent of how the batch is divided; run with --invariant 0",
                       t->a.invariant, dt_graph_node_name(g, coupled),
                       dt_graph_node_kind(g, coupled));
    if (shards && coupled >= 0) { // the default: off for such a model, and said once
        DT_INFO("train",
                "world-size invariance off: node '%s' (%s) computes statistics over the batch",
                dt_graph_node_name(g, coupled), dt_graph_node_kind(g, coupled));
        shards = 0, t->tree_reduce = false;
    }
    DT_TRY(dt_graph_set_threads(g, t->threads));
    DT_TRY(dt_graph_set_grad_shards(g, shards)); // --invariant, as for a Sequential model
    DT_TRY(dt_graph_set_precision(g, dt_trainer_precision(t))); // --precision
    t->prepared = false;
    return dt_trainer_prepare(t, dt_graph_params(g), opt, sched);
}

// ------------------------------------------------------------------------- the loop

// The end of an epoch's pass (exhausted, or stopped): the bar's newline.
static dt_status end_epoch(dt_trainer *t, bool exhausted) {
    t->in_epoch = false;
    dt_progress_end_epoch(t->bar);
    if (exhausted) // --ps-staleness: the servers' model for the program's evaluation
        DT_TRY(dt_strategy_settle(t->strat));
    if (exhausted && t->a.plot && !t->a.no_test) // --device cuda: --plot's evaluation
        DT_TRY(dt_train_device_pull(t));         // (the program's) reads the host copies
    return exhausted ? dt_loader_status(t->ld) : DT_OK;
}

static void      scale_grads(dt_params *p, float s);
static dt_status shadow_step(dt_trainer *t);

// Uneven inputs: the window of micro-batch mb of the epoch, by the epoch's largest batch
// count, so that every rank cuts the same windows.
static void join_window(dt_trainer *t, long k) {
    if (t->micro == 0) {
        size_t left    = t->nb_all > t->mb ? t->nb_all - t->mb : 1;
        t->window      = (int)(left < (size_t)k ? left : (size_t)k);
        t->win_samples = 0;
        dt_params_zero_grad(t->p);
    }
    t->sync = t->micro == t->window - 1;
    t->mb++;
}

dt_status dt_trainer_set_steps(dt_trainer *t, int64_t steps, int micro_batches, size_t samples) {
    if (t->prepared || t->ld)
        return dt_fail(DT_ERR_STATE, "dt_trainer_set_steps: expected a call before "
                                     "dt_trainer_prepare and without a training loader");
    if (steps < 1 || micro_batches < 1)
        return dt_fail(DT_ERR_ARG,
                       "dt_trainer_set_steps: expected at least one step and one micro-batch, "
                       "found %lld and %d",
                       (long long)steps, micro_batches);
    t->total_steps = steps, t->step_micro = micro_batches, t->step_samples = samples;
    if (t->el) // elastic: the global batch, shared out at each regrouping
        t->gbatch = samples;
    return DT_OK;
}

bool dt_trainer_regrouped(const dt_trainer *t) {
    return t->regrouped;
}

// dt_trainer_next of a step-based run: micro-batch t->micro of step t->step.
static bool next_step(dt_trainer *t, dt_batch *b) {
    if (t->stop || t->step >= t->total_steps) {
        t->stop = true;
        return false;
    }
    if (t->micro == 0) {
        t->window = t->step_micro;
        dt_params_zero_grad(t->p);
    }
    t->sync = t->micro == t->window - 1;
    dt_strategy_set_sync(t->strat, t->sync);
    memset(b, 0, sizeof *b);
    b->index     = (size_t)t->micro;
    b->size      = t->step_samples;
    t->cur_size  = t->step_samples;
    t->cur_index = (size_t)t->step * (size_t)t->window + (size_t)t->micro;
    return true;
}

bool dt_trainer_next(dt_trainer *t, dt_batch *b) {
    if (t->total_steps > 0 && !t->err && t->prepared)
        return next_step(t, b);
    if (t->err || !t->ld || !t->prepared)
        return false;
    if (t->stop) {
        if (t->in_epoch)
            t->err = end_epoch(t, false);
        return false;
    }
    for (;;) {
        if (!t->in_epoch) {
            if (t->epoch >= t->a.epochs) {
                t->stop = true;
                return false;
            }
            dt_loader_begin_epoch(t->ld, t->epoch);
            t->er = dt_rng_split(&t->root, (uint64_t)t->epoch);
            if (t->m)
                dt_model_set_rng(t->m, &t->er);
            if (t->g)
                dt_graph_set_rng(t->g, &t->er);
            dt_progress_begin_epoch(t->bar, t->epoch, t->nbatches);
            t->in_epoch = true;
            if (t->join) {
                // The epoch's largest batch count, which every rank runs, and after a
                // resume the micro-batches done (the ranks with data left have done
                // them all; a rank that had run out, fewer).
                size_t  pos  = dt_sampler_position(t->smp);
                int64_t v[2] = {(int64_t)t->nbatches, (int64_t)((pos + t->batch - 1) / t->batch)};
                if (t->pg && (t->err = dt_pg_all_reduce(t->pg, v, v, 2, DT_INT64, DT_REDUCE_MAX)))
                    return false;
                t->nb_all = (size_t)v[0], t->mb = (size_t)v[1], t->exhausted = false;
            }
        }
        if (t->join) {
            if (!t->exhausted && t->mb < t->nb_all && dt_loader_next(t->ld, b))
                break;
            t->exhausted = true;
            if (t->mb < t->nb_all) { // out of data: shadow the others' micro-batch
                if ((t->err = shadow_step(t)) != DT_OK)
                    return false;
                if (t->stop) {
                    t->err = end_epoch(t, false);
                    return false;
                }
                continue;
            }
        } else if (dt_loader_next(t->ld, b)) {
            break;
        }
        if ((t->err = end_epoch(t, true)) != DT_OK)
            return false;
        t->epoch++;
    }
    long k = t->a.accumulate > 1 ? t->a.accumulate : 1;
    if (t->join) {
        join_window(t, k);
        if (t->micro > 0) // the window's sum so far, over this batch's size (see the step)
            scale_grads(t->p, 1.0f / (float)b->size);
    } else if (t->micro == 0) {
        // A window of k micro-batches, cut short by the end of the epoch; checkpoints
        // fall on window ends, so a resume starts a window where it started.
        size_t left = t->nbatches > b->index ? t->nbatches - b->index : 1;
        t->window   = (int)(left < (size_t)k ? left : (size_t)k);
        dt_params_zero_grad(t->p);
        if ((t->err = dt_strategy_share_buffers(t->strat)) != DT_OK)
            return false;
    }
    if (!t->join)
        t->sync = t->micro == t->window - 1;
    dt_strategy_set_sync(t->strat, t->sync);
    if (t->m) {
        for (size_t i = 0; i < b->size; i++)
            t->keys[i] = b->indices[i];
        if ((t->err = dt_model_set_sample_keys(t->m, t->keys, (int)b->size)) != DT_OK)
            return false;
    }
    if (t->g) {
        for (size_t i = 0; i < b->size; i++)
            t->keys[i] = b->indices[i];
        if ((t->err = dt_graph_set_sample_keys(t->g, t->keys, (int)b->size)) != DT_OK)
            return false;
    }
    t->cur_size  = b->size;
    t->cur_index = b->index;
    return true;
}

static void scale_grads(dt_params *p, float s) {
    float *g = dt_params_grads(p);
    size_t n = dt_params_numel(p);
    for (size_t i = 0; i < n; i++)
        g[i] *= s;
}

dt_status dt_trainer_step(dt_trainer *t, float loss) {
    t->regrouped = false;
    if (t->a.data_parallel > 1 && !dt_strategy_replicas_ran(t->strat))
        return dt_fail(DT_ERR_ARG,
                       "--data-parallel %ld: expected a program that trains through "
                       "dt_trainer_set_replicas and dt_trainer_forward_backward, found one "
                       "that runs its own forward and backward",
                       t->a.data_parallel);
    t->last_loss = loss;
    t->samples_seen += (int64_t)t->cur_size;
    if (t->join && !t->shadow) { // the gradient as a sum over the window's samples
        if (t->cur_size != 1)
            scale_grads(t->p, (float)t->cur_size);
        t->win_samples += (int64_t)t->cur_size;
    }
    if (t->sync && t->exec) { // --device cuda: the same steps on the device
        t->micro = 0;
        DT_TRY(dt_train_device_update(t));
        t->step++;
    } else if (t->sync) {
        t->micro = 0;
        // The mean over ranks (and the window's micro-batches, or its samples when uneven).
        dt_status rs = dt_strategy_reduce(t->strat, t->window, t->win_samples);
        if (rs && t->el) { // a peer is gone: this step again, by the new world
            t->samples_seen -= (int64_t)t->cur_size;
            return elastic_boundary(t, rs, false, t->cur_index);
        }
        DT_TRY(rs);
        // fp16: unscale, agree on inf/NaN over the ranks; a bad step is skipped by all
        bool skip = false;
        if (t->scaler) {
            DT_TRY(dt_grad_scaler_unscale(t->scaler, t->p));
            skip = dt_grad_scaler_found_inf(t->scaler);
            DT_TRY(dt_grad_scaler_update(t->scaler));
            t->skipped += skip;
        }
        if (t->a.clip_grad > 0 && !skip) // the global norm (over shards and parts)
            DT_TRY(dt_strategy_clip(t->strat, (float)t->a.clip_grad, &t->grad_norm));
        if (t->sched && t->opt)
            DT_TRY(dt_sched_apply(t->sched, t->opt, t->step));
        if (!skip) // else the optimizer step is skipped on every rank
            DT_TRY(dt_strategy_step(t->strat));
        t->step++;
    } else {
        t->micro++;
    }
    // Rank 0's bar or loss line, and the training curve (every --log-every batches).
    if (!t->shadow && !t->o.own_progress)
        dt_progress_step(t->bar, t->cur_index, t->cur_size * (size_t)dt_train_dp_size(t), loss);
    if (t->plot && !t->shadow && t->cur_index % (size_t)t->a.log_every == 0)
        DT_TRY(dt_plot_add(t->plot, DT_PLOT_TRAIN, (double)t->step, loss));
    if (!t->sync)
        return DT_OK;
    if (t->a.checkpoint_every && t->step % t->a.checkpoint_every == 0)
        DT_TRY(save(t));
    if (t->el) { // the step is applied: the next one, by the group of this boundary
        bool      others = false;
        dt_status as     = dt_train_elastic_agree(t, &others);
        if (!as && t->preempted) { // SIGTERM: this worker leaves, the others go on
            dt_strategy_free(t->strat);
            t->strat = NULL;
            dt_pg_free(t->pg);
            t->pg = NULL, t->stop = true;
            return DT_OK;
        }
        DT_TRY(elastic_boundary(t, as, others, t->cur_index + 1));
    } else if (dt_train_ps_agrees(t)) {
        DT_TRY(dt_train_preempt_agree(t->pg, &t->preempted));
    }
    t->stop = t->preempted || (t->a.max_steps && t->step >= t->a.max_steps);
    return DT_OK;
}

// ------------------------------------------------------------------ DataParallel

dt_status dt_trainer_set_replicas(dt_trainer *t, const dt_dp_ops *ops,
                                  const dt_dp_replica *master) {
    if (!ops || !ops->work || !master || (t->a.data_parallel > 1 && !ops->make))
        return dt_fail(DT_ERR_ARG,
                       "dt_trainer_set_replicas: expected a work function, a master replica%s, "
                       "found %s",
                       t->a.data_parallel > 1 ? " and a factory (--data-parallel)" : "",
                       !ops || !ops->work ? "no work function"
                       : !master          ? "no master"
                                          : "no factory");
    if (t->strat) // after dt_trainer_prepare: the strategy has them from here
        return dt_strategy_set_replicas(t->strat, ops, master);
    if (t->has_replicas)
        return dt_fail(DT_ERR_STATE, "dt_trainer_set_replicas: expected one call, found a second");
    t->dp_ops = *ops, t->dp_master = *master, t->has_replicas = true;
    return DT_OK;
}

int dt_trainer_data_parallel(const dt_trainer *t) {
    return t->a.data_parallel > 1 ? (int)t->a.data_parallel : 1;
}

dt_status dt_trainer_forward_backward(dt_trainer *t, const dt_batch *b, float *loss) {
    if (t->exec) // --device cuda: the executor, on the batch's images and labels
        return dt_trainer_device_step(t, (const void *[]){b->x}, b->y, (int)b->size, loss);
    if (!t->strat)
        return dt_fail(DT_ERR_STATE,
                       "dt_trainer_forward_backward: expected dt_trainer_prepare first");
    return dt_strategy_forward_backward(t->strat, b, &t->er, loss);
}

// A micro-batch of a rank whose data ran out (uneven inputs): no samples, the same
// reductions, optimizer step, checkpoints and stop agreement as the others'.
static dt_status shadow_step(dt_trainer *t) {
    join_window(t, t->a.accumulate > 1 ? t->a.accumulate : 1);
    t->cur_size  = 0;
    t->shadow    = true;
    dt_status st = dt_trainer_step(t, 0.0f);
    t->shadow    = false;
    return st;
}

dt_status dt_trainer_log_val(dt_trainer *t, double loss) {
    return t->plot ? dt_plot_add(t->plot, DT_PLOT_VAL, (double)t->step, loss) : DT_OK;
}

// ------------------------------------------------------------------ elastic membership

// Regroups (elastic.c) and rebuilds what depends on the group: the gradient shards of
// the new world, the strategy, rank 0's progress bar, the training loader re-cut at
// batch next_batch of the epoch with the global batch shared out anew (each rank takes
// gbatch / world), and the evaluation loaders dropped (dt_trainer_loader makes them
// anew for the new world); a step-based run's share of the step (gbatch / world), its
// batches the program's (drawn from the seed and the step). A regrouping that fails again and again
// without a step between them (a world that never forms) stops after 8.
static dt_status elastic_regroup(dt_trainer *t, int64_t next_batch) {
    if (++t->regroups > 8)
        return dt_fail(DT_ERR_STATE, "elastic: 8 regroupings in a row without a step");
    dt_strategy_free(t->strat);
    t->strat = NULL;
    // A member lost while the group forms or the state moves: form the next one.
    dt_status st;
    while ((st = dt_train_elastic_regroup(t, &next_batch)) == DT_ERR_PEER) {
        if (++t->regroups > 8)
            return dt_fail(DT_ERR_STATE, "elastic: 8 regroupings in a row without a step");
        fprintf(stderr, "%s: rank %d: %s: regrouping again\n", t->o.program, t->rank,
                dt_last_error());
    }
    DT_TRY(st);
    t->msize[DT_MESH_DP] = t->world; // no mesh under elastic membership: the world's replicas
    DT_TRY(check_data(t));           // the same data on every member (a joiner's too)
    int shards;
    if (t->gbatch % (size_t)t->world)
        return dt_fail(DT_ERR_ARG,
                       "elastic: %d workers cannot share the global batch of %zu (--batch-size "
                       "under --nnodes MIN:MAX is the global batch: give one every world size "
                       "from MIN to MAX divides)",
                       t->world, t->gbatch);
    DT_TRY(invariant_shards(t, &shards));
    t->batch = t->gbatch / (size_t)t->world;
    if (t->m) {
        DT_TRY(dt_model_set_grad_shards(t->m, shards));
        DT_TRY(dt_model_reserve(t->m, (int)t->batch));
    } else if (t->g) {
        DT_TRY(dt_graph_set_grad_shards(t->g, shards));
    }
    DT_TRY(make_strategy(t));
    t->regrouped = true;
    if (t->rank != 0) {
        dt_progress_free(t->bar);
        t->bar = NULL;
    } else if (!t->bar) {
        dt_progress_opts po = dt_progress_opts_default();
        po.log_every        = t->a.log_every;
        DT_TRY(dt_progress_new(&t->bar, &po));
    }
    if (t->total_steps > 0) { // a step-based run: the program draws the step's share itself
        t->step_samples = t->batch, t->micro = 0;
        return DT_OK;
    }
    // The sampler of the new world, at the same global position (every world size divides
    // the global batch, so the epoch's samples are not padded differently).
    dt_sampler_opts so = dt_sampler_opts_default();
    so.num_replicas    = t->world;
    so.rank            = t->rank;
    so.seed            = (uint64_t)t->a.seed;
    dt_loader_opts lo  = dt_loader_opts_default();
    lo.batch_size      = t->batch;
    dt_loader_free(t->ld);
    dt_sampler_free(t->smp);
    t->ld = NULL, t->smp = NULL;
    for (int i = 0; i < t->neval; i++) { // cut for the old world: made anew when asked
        dt_loader_free(t->eld[i]);
        dt_sampler_free(t->esmp[i]);
    }
    t->neval = 0;
    DT_TRY(dt_sampler_new(&t->smp, t->tds->n, &so));
    size_t pos = (size_t)next_batch * t->batch, n = dt_sampler_num_samples(t->smp);
    DT_TRY(dt_sampler_resume(t->smp, (uint64_t)t->epoch, pos < n ? pos : n));
    DT_TRY(dt_loader_new(&t->ld, t->tds, t->smp, &lo));
    t->nbatches = dt_loader_num_batches(t->ld);
    t->in_epoch = false, t->micro = 0;
    return DT_OK;
}

// The first group of an elastic job, after the checks of what it cannot re-cut yet.
static dt_status elastic_start(dt_trainer *t) {
    const dt_train_args *a   = &t->a;
    const char          *why = a->zero > 0            ? "--zero (a lost shard would come "
                                                        "from a checkpoint: not bitwise)"
                               : a->checkpoint_dir    ? "--checkpoint-dir (the state "
                                                        "lives in memory and moves by "
                                                        "broadcast)"
                               : a->accumulate > 1    ? "--accumulate"
                               : a->data_parallel > 1 ? "--data-parallel"
                               : dt_train_mesh_on(t)  ? "--pp or --tp"
                               : t->scaler            ? "--precision fp16"
                               : t->exec              ? "--device cuda"
                               : t->join              ? "uneven inputs"
                               : !t->smp && !t->total_steps ? "a program without a training loader or steps"
                                                            : NULL;
    if (why)
        return dt_fail(DT_ERR_ARG,
                       "elastic membership (--nnodes MIN:MAX): %s is not supported "
                       "yet",
                       why);
    DT_TRY(elastic_regroup(t, 0));
    t->regroups = 0;
    return DT_OK;
}

// A step boundary of an elastic job: after a failed collective (st, from the step's
// reduction: nothing was applied, the step is done again by the new world), when a
// member leaves (a SIGTERM: `leaving`) or when the generation moved on (a joiner, or a
// member that regrouped after a failure), the new group goes on from batch `next` of
// the epoch.
static dt_status elastic_boundary(dt_trainer *t, dt_status st, bool leaving, size_t next) {
    bool changed = st != DT_OK || leaving;
    if (st)
        fprintf(stderr, "%s: rank %d: %s: regrouping\n", t->o.program, t->rank, dt_last_error());
    else if (!changed)
        DT_TRY(dt_train_elastic_poll(t, &changed));
    if (!changed) {
        t->regroups = 0;
        return DT_OK;
    }
    return elastic_regroup(t, (int64_t)next);
}

// ---------------------------------------------------------------------- the end

// Every replica must end with the same weights; a difference is a bug, said loudly.
dt_status dt_trainer_finish(dt_trainer *t) {
    const dt_train_args *a = &t->a;
    t->finish_called       = true;
    if (t->err)
        return t->err;
    if (!t->prepared || !t->p)
        return dt_fail(DT_ERR_STATE, "dt_trainer_finish: expected dt_trainer_prepare first");
    DT_TRY(dt_train_device_pull(t)); // --device cuda: the parameters, for checks and saving
    // A last checkpoint where training stopped, so a resume after the end (or after a
    // failure during evaluation) has nothing to redo.
    if (a->checkpoint_dir && !a->eval_only && t->step != t->last_saved)
        DT_TRY(save(t));
    if (t->preempted) {
        dt_trainer_print_local(t, "Stopped by SIGTERM at step %lld: %s\n", (long long)t->step,
                               a->checkpoint_dir
                                   ? "checkpoint saved, run again with --resume to continue"
                                   : "nothing saved (no --checkpoint-dir)");
        return dt_fail(DT_ERR_STATE, "stopped by SIGTERM at step %lld", (long long)t->step);
    }
    dt_train_preempt_release(); // from here on, SIGTERM ends the process at once
    DT_TRY(dt_trainer_wait_for_everyone(t));
    t->finished = dt_now();
    DT_TRY(dt_strategy_share_buffers(t->strat)); // rank 0's buffers everywhere
    if (t->local_rank == 0 && !a->eval_only) {
        if (t->o.loop_time)
            printf("Finished training in %.3f secs (the training loop; %.2f secs from start-up)\n",
                   dt_trainer_loop_secs(t), t->finished - t->start);
        else
            printf("Finished training in %.2f secs\n", t->finished - t->start);
        fflush(stdout);
        if (t->rank == 0 && a->profile && t->prec != DT_PREC_FP32) {
            char how[160];
            printf("profile: precision %s\n", dt_prec_describe(t->prec, how, sizeof how));
        }
        if (t->rank == 0 && a->profile && t->m)
            dt_train_print_profile(t->m, t->finished - t->train_start);
        if (t->rank == 0 && a->profile && t->g)
            dt_train_print_graph_profile(t->g, t->finished - t->train_start);
    }
    if (a->trace) {
        DT_TRY(dt_trace_save(t->pg, a->trace));
        dt_trainer_print(t, "Wrote the trace to %s\n", a->trace);
    }
    uint32_t crc;
    char     same[160];
    DT_TRY(dt_strategy_check_replicas(t->strat, &crc, same, sizeof same));
    if (same[0])
        dt_trainer_print(t, "%s\n", same);
    if (a->save_model && dt_train_mesh_on(t)) { // the parts gathered: the whole model's file
        DT_TRY(dt_train_mesh_save_model(t, a->save_model));
    } else if (a->save_model) { // --zero 3: the shards gathered on rank 0 for it
        DT_TRY(dt_strategy_gather_params(t->strat, 0));
        if (t->rank == 0)
            DT_TRY(dt_ckpt_save_params(a->save_model, t->p));
        DT_TRY(dt_strategy_release_params(t->strat));
    }
    if (a->save_model)
        dt_trainer_print(t, "Saved the model to %s\n", a->save_model);
    return DT_OK;
}

dt_status dt_trainer_report(dt_trainer *t, double metric) {
    if (t->plot) {
        DT_TRY(dt_plot_write_svg(t->plot, t->a.plot));
        printf("Wrote the loss curves to %s\n", t->a.plot);
        fflush(stdout);
    }
    if (!t->a.stats)
        return DT_OK;
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    int64_t rss = ru.ru_maxrss; // KiB; the largest over ranks is reported
    DT_TRY(dt_trainer_all_reduce(t, &rss, 1, DT_INT64, DT_REDUCE_MAX));
    double wait_s = dt_strategy_wait_secs(t->strat); // for gradients (and ZeRO's gathers)
    double per    = t->o.train_flops_per_sample;
    if (per <= 0 && t->m)
        per = dt_model_train_flops_per_sample(t->m);
    // Samples trained by this run (a resumed run trains fewer), padding included.
    double samples = (double)t->samples_seen * dt_train_dp_size(t);
    double flops   = samples * per;
    double loop    = t->finished - t->train_start;
    dt_trainer_print(t,
                     "STATS {\"secs\": %.3f, \"train_loop_secs\": %.3f, \"samples_per_sec\": %.1f, "
                     "\"gflops\": %.1f, \"peak_rss_mib\": %.1f, \"world\": %d, \"threads\": %d, "
                     "\"backend\": \"%s\", \"ddp_wait_secs\": %.3f, \"accuracy\": %.2f, "
                     "\"checkpoints\": %lld, \"checkpoint_secs\": %.3f, \"blas\": \"%s\", "
                     "\"kernels\": \"%s\", \"cpu\": \"%s\"}\n",
                     t->finished - t->start, loop, loop > 0 ? samples / loop : 0.0,
                     loop > 0 ? flops / loop * 1e-9 : 0.0, (double)rss / 1024.0, t->world,
                     t->threads, t->pg ? dt_pg_backend(t->pg) : "none", wait_s, metric,
                     (long long)t->ckpt_saves, t->ckpt_secs, dt_blas_info(),
                     dt_isa_name(dt_isa_top()), dt_cpu_get()->model);
    return DT_OK;
}
