// mesh.c: the trainer's side of model parallelism (train.h, docs/parallel.md): the
// --dp --pp --tp flags checked and the job's mesh made, the cuts chosen by --cuts (or
// read from the checkpoints' layout file) and the pipeline built, and what the trainer
// keeps per model part: its checkpoints and the layout file. The cutting itself and the
// whole model's tensors carried to the parts and back are src/parallel/parts.c's; the
// step's work over the parts (the norm, the replicas' check) is the strategy's.
#include "train_impl.h"

#include "parallel/parts.h"

#include "core/file.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

enum { LAYOUT_MAX = 4096 };

static dt_mesh_opts mesh_opts(const dt_trainer *t) {
    return (dt_mesh_opts){(int)t->a.dp, (int)t->a.pp, (int)t->a.tp};
}

dt_status dt_train_mesh_check(const dt_trainer *t, int world) {
    const dt_train_args *a = &t->a;
    if (!t->o.model_parallel)
        return DT_OK;
    if (t->o.no_model_split && (a->pp > 1 || a->tp > 1))
        return dt_fail(DT_ERR_ARG, "--%s %ld: %s cannot be %s: %s (--dp and --zero apply)",
                       a->pp > 1 ? "pp" : "tp", a->pp > 1 ? a->pp : a->tp, t->o.program,
                       a->pp > 1 ? "cut into pipeline stages" : "split over tensor-parallel ranks",
                       t->o.no_model_split);
    int          sz[DT_MESH_DIM_COUNT_];
    dt_mesh_opts mo = mesh_opts(t);
    if (dt_mesh_sizes(world, &mo, sz) != DT_OK) {
        char   given[96] = "";
        size_t at        = 0;
        long   v[3]      = {a->dp, a->pp, a->tp};
        for (int d = 0; d < 3; d++)
            if (v[d])
                at += (size_t)snprintf(given + at, sizeof given - at, "%s--%s %ld", at ? " " : "",
                                       dt_mesh_dim_name((dt_mesh_dim)d), v[d]);
        return dt_fail(DT_ERR_ARG, "%s with %d rank(s): %s", given, world, dt_last_error());
    }
    const char *c = a->cuts;
    if (c && strcmp(c, "auto") && strcmp(c, "uniform")) {
        int n = *c != 0;
        for (; *c; c++)
            n += *c == ',';
        if (n != sz[DT_MESH_PP] - 1)
            return dt_fail(DT_ERR_ARG,
                           "--cuts %s: expected %d name(s) for %d pipeline stages, found %d",
                           a->cuts, sz[DT_MESH_PP] - 1, sz[DT_MESH_PP], n);
    }
    if (sz[DT_MESH_PP] * sz[DT_MESH_TP] > 1 && a->data_parallel > 1)
        return dt_fail(DT_ERR_ARG,
                       "--data-parallel %ld with --pp %d --tp %d: replicas in threads need the "
                       "whole model in each; use --dp instead",
                       a->data_parallel, sz[DT_MESH_PP], sz[DT_MESH_TP]);
    if (sz[DT_MESH_PP] * sz[DT_MESH_TP] > 1 && a->zero > 2)
        return dt_fail(DT_ERR_ARG,
                       "--zero %ld with --pp %d --tp %d: not supported yet (ZeRO stages 1 and 2 "
                       "shard the data dimension of a mesh)",
                       a->zero, sz[DT_MESH_PP], sz[DT_MESH_TP]);
    return DT_OK;
}

dt_status dt_train_mesh_start(dt_trainer *t) {
    t->msize[DT_MESH_DP] = t->world;
    t->msize[DT_MESH_PP] = t->msize[DT_MESH_TP] = 1;
    if (!t->o.model_parallel)
        return DT_OK;
    DT_TRY(dt_train_mesh_check(t, t->world));
    dt_mesh_opts mo = mesh_opts(t);
    DT_TRY(dt_mesh_sizes(t->world, &mo, t->msize));
    if (t->msize[DT_MESH_PP] * t->msize[DT_MESH_TP] == 1 || !t->pg)
        return DT_OK; // data parallelism over the whole group, as without a mesh
    return dt_mesh_new(&t->mesh, t->pg, &mo);
}

void dt_train_mesh_release(dt_trainer *t) {
    if (t->pipe) { // the stage graph is the pipeline's
        dt_pipe_free(t->pipe);
        t->g = NULL, t->p = NULL;
    }
    dt_params_free(t->whole);
    dt_free(t->cut_node);
    dt_mesh_free(t->mesh);
    t->pipe = NULL, t->whole = NULL, t->cut_node = NULL, t->mesh = NULL, t->ncuts = 0;
}

// ------------------------------------------------------------------ the layout file

// <dir>/layout: the mesh a checkpoint directory was written by ("pp P tp T cuts a,b"),
// so that a resumed run cuts the model where the checkpoints' parts were cut (balanced
// cuts follow timings, which change from run to run) and a run of another layout is
// refused instead of starting fresh beside the parts.
static dt_status layout_path(const dt_trainer *t, char *buf, size_t n) {
    if (snprintf(buf, n, "%s/layout", t->a.checkpoint_dir) >= (int)n)
        return dt_fail(DT_ERR_ARG, "--checkpoint-dir: a path too long");
    return DT_OK;
}

// Reads the layout file: *found false when there is none.
static dt_status layout_read(const dt_trainer *t, bool *found, int *pp, int *tp, char *cuts,
                             size_t ncuts) {
    char path[LAYOUT_MAX], line[LAYOUT_MAX];
    *found = false;
    DT_TRY(layout_path(t, path, sizeof path));
    struct stat sb;
    if (stat(path, &sb) != 0 && errno == ENOENT)
        return DT_OK;
    FILE    *f;
    uint64_t size;
    DT_TRY(dt_open_regular(path, &f, &size)); // a FIFO there is refused, not waited on
    bool ok = fgets(line, sizeof line, f) != NULL;
    fclose(f);
    char fmt[64];
    snprintf(fmt, sizeof fmt, "pp %%d tp %%d cuts %%%zus", ncuts - 1);
    if (!ok || sscanf(line, fmt, pp, tp, cuts) != 3)
        return dt_fail(DT_ERR_FORMAT,
                       "%s: expected \"pp P tp T cuts NAMES\" (the mesh the checkpoints were "
                       "written by), found something else",
                       path);
    *found = true;
    return DT_OK;
}

static dt_status layout_write(const dt_trainer *t) {
    char path[LAYOUT_MAX], tmp[LAYOUT_MAX + 32];
    DT_TRY(layout_path(t, path, sizeof path));
    snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid());
    FILE *f = fopen(tmp, "w");
    if (!f)
        return dt_fail_errno(DT_ERR_IO, "cannot write %s", tmp);
    int n = fprintf(f, "pp %d tp %d cuts %s\n", t->msize[DT_MESH_PP], t->msize[DT_MESH_TP],
                    t->ncuts ? t->cut_names : "-");
    if (fclose(f) != 0 || n < 0 || rename(tmp, path) != 0) {
        dt_status st = dt_fail_errno(DT_ERR_IO, "cannot write %s", path);
        unlink(tmp);
        return st;
    }
    return DT_OK;
}

// The layout of the checkpoints in --checkpoint-dir: its layout file's, else the whole
// model's when it holds checkpoints of its own (step-* and no layout file), else none
// (*found false: a new folder, or one without checkpoints).
static dt_status folder_layout(const dt_trainer *t, bool *found, int *pp, int *tp, char *cuts,
                               size_t ncuts) {
    DT_TRY(layout_read(t, found, pp, tp, cuts, ncuts));
    int64_t step = -1;
    if (!*found)
        DT_TRY(dt_ckpt_latest(t->a.checkpoint_dir, &step));
    if (step >= 0) {
        *found = true, *pp = *tp = 1;
        snprintf(cuts, ncuts, "-");
    }
    return DT_OK;
}

// A run that writes checkpoints into a folder of another layout's is refused before it
// writes anything there: a resume would start fresh beside the other parts and then
// overwrite them (and the layout file, after which the first job is refused).
static dt_status layout_refused(const dt_trainer *t, int pp, int tp) {
    int  mpp = t->msize[DT_MESH_PP], mtp = t->msize[DT_MESH_TP];
    bool cut = pp * tp > 1;
    return dt_fail(DT_ERR_MISMATCH,
                   "%s: %s holds the checkpoints of %s--pp %d --tp %d%s, expected --pp %d --tp "
                   "%d (this run's); %s with the first run's flags, or use another "
                   "--checkpoint-dir",
                   t->a.resume ? "--resume" : "--checkpoint-dir", t->a.checkpoint_dir,
                   cut ? "a model cut over " : "the whole model (", pp, tp, cut ? "" : ")",
                   mpp > 0 ? mpp : 1, mtp > 0 ? mtp : 1, t->a.resume ? "resume" : "run");
}

dt_status dt_train_mesh_check_layout(const dt_trainer *t) {
    if (!t->o.model_parallel || t->mesh || !t->a.checkpoint_dir || t->a.eval_only)
        return DT_OK;
    bool found;
    int  pp, tp;
    char cuts[LAYOUT_MAX];
    DT_TRY(layout_read(t, &found, &pp, &tp, cuts, sizeof cuts));
    return found && pp * tp > 1 ? layout_refused(t, pp, tp) : DT_OK;
}

// Every rank's status agreed over the world: the lowest failing rank's message reaches
// every rank, so that whichever rank's error the launcher shows first names the cause.
static dt_status agree_world(dt_trainer *t, dt_status mine) {
    int32_t why[256] = {0}, v = (int32_t)mine;
    if (mine) // before any call that may set another error
        snprintf((char *)why, sizeof why, "%s", dt_last_error());
    int32_t  *all = dt_alloc(sizeof(int32_t) * (size_t)t->world);
    dt_status cs  = all ? dt_pg_all_gather(t->pg, &v, all, 1, DT_INT32) : DT_ERR_NOMEM;
    int       bad = -1;
    for (int r = 0; !cs && r < t->world && bad < 0; r++)
        bad = all[r] != DT_OK ? r : -1;
    dt_status st = bad >= 0 ? (dt_status)all[bad] : DT_OK;
    dt_free(all);
    if (cs)
        return mine ? dt_fail(mine, "%s", (const char *)why) : cs;
    if (bad < 0)
        return DT_OK;
    cs = dt_pg_broadcast(t->pg, why, sizeof why / sizeof why[0], DT_INT32, bad);
    if (t->rank == bad)
        return dt_fail(mine, "%s", (const char *)why);
    if (cs)
        return cs;
    ((char *)why)[sizeof why - 1] = 0;
    if (st <= DT_OK || st >= DT_STATUS_COUNT_)
        st = DT_ERR_INTERNAL;
    return dt_fail(st, "rank %d: %s", bad, (const char *)why);
}

// ------------------------------------------------------------------------ the cuts

// Before anything is written into --checkpoint-dir, rank 0 reads the layout of the
// checkpoints there, agreed: another layout is refused on every rank. Resuming the same
// layout, *have is true when the checkpoints' cuts are in pick, and *same says that the
// layout file already records this run's layout (a resume that is refused later then
// leaves the folder as it was).
static dt_status folder_cuts(dt_trainer *t, int ncand, const char *const *cand, int *pick,
                             bool *have, bool *same) {
    char    cuts[LAYOUT_MAX] = "";
    int     pp = 0, tp = 0, npick = t->msize[DT_MESH_PP] - 1;
    int32_t got[1024], take[2] = {0, 0}; // cuts taken, layout file the same
    *have = *same = false;
    if (!t->a.checkpoint_dir || t->a.eval_only)
        return DT_OK;
    dt_status st = DT_OK;
    if (t->rank == 0) {
        bool found = false;
        st         = folder_layout(t, &found, &pp, &tp, cuts, sizeof cuts);
        if (st == DT_OK && found && (pp != t->msize[DT_MESH_PP] || tp != t->msize[DT_MESH_TP]))
            st = layout_refused(t, pp, tp);
        take[0] = st == DT_OK && found && t->a.resume && npick > 0;
        take[1] = st == DT_OK && found && t->a.resume;
        if (take[0])
            st = dt_parts_parse_cuts(cuts, ncand, cand, pp, pick, "the checkpoints' layout file");
        for (int k = 0; take[0] && k < npick; k++)
            got[k] = pick[k];
    }
    DT_TRY(agree_world(t, st));
    DT_TRY(dt_pg_broadcast(t->pg, take, 2, DT_INT32, 0));
    *same = take[1];
    if (!take[0])
        return DT_OK;
    DT_TRY(dt_pg_broadcast(t->pg, got, (size_t)npick, DT_INT32, 0)); // every rank cuts alike
    for (int k = 0; k < npick; k++)
        pick[k] = got[k];
    *have = true;
    return DT_OK;
}

dt_status dt_trainer_pipeline(dt_trainer *t, dt_trainer_build_fn build, void *user, int ncand,
                              const char *const *cand, int micro_batches, dt_graph **stage) {
    *stage    = NULL;
    int    pp = t->msize[DT_MESH_PP] > 0 ? t->msize[DT_MESH_PP] : 1;
    size_t b  = t->step_samples ? t->step_samples : t->batch;
    int    M  = t->a.micro_batches ? (int)t->a.micro_batches : micro_batches ? micro_batches : pp;
    if (!build || (ncand > 0 && !cand))
        return dt_fail(DT_ERR_ARG, "dt_trainer_pipeline: expected a build function and names");
    if (t->pipe || t->prepared)
        return dt_fail(DT_ERR_STATE, "dt_trainer_pipeline: expected one call, before "
                                     "dt_trainer_prepare_graph");
    if (!b)
        return dt_fail(DT_ERR_STATE, "dt_trainer_pipeline: expected dt_trainer_set_steps or the "
                                     "training loader first (the batch to cut)");
    if ((size_t)M > b)
        return dt_fail(DT_ERR_ARG,
                       "--micro-batches %d: expected at most the %zu samples of each replica's "
                       "batch",
                       M, b);
    if (pp - 1 > ncand || pp > 1024)
        return dt_fail(DT_ERR_ARG, "--pp %d: this model has %d cut point(s), so at most %d stages",
                       pp, ncand, ncand + 1 < 1024 ? ncand + 1 : 1024);
    dt_graph *whole = NULL;
    DT_TRY(build(user, &whole));
    int       nnodes = dt_graph_num_nodes(whole);
    int      *candn  = dt_alloc(sizeof(int) * (size_t)(ncand ? ncand : 1));
    int      *pick   = dt_alloc(sizeof(int) * (size_t)pp);
    dt_status st     = candn && pick ? dt_graph_param_table(whole, true, &t->whole) : DT_ERR_NOMEM;
    for (int i = 0; st == DT_OK && i < ncand; i++)
        if ((candn[i] = dt_graph_find(whole, cand[i])) < 0 || (i > 0 && candn[i] <= candn[i - 1]))
            st = dt_fail(DT_ERR_ARG,
                         "dt_trainer_pipeline: expected candidate cuts naming nodes in order, "
                         "found '%s' (%s)",
                         cand[i], candn[i] < 0 ? "no such node" : "out of order");
    bool have = false, same = false;
    if (st == DT_OK && t->mesh)
        st = folder_cuts(t, ncand, cand, pick, &have, &same);
    const char *spec = t->a.cuts ? t->a.cuts : "auto";
    if (st == DT_OK && pp > 1 && !have) {
        if (strcmp(spec, "auto") == 0 || strcmp(spec, "uniform") == 0)
            dt_parts_uniform_cuts(ncand, pp, pick);
        else
            st = dt_parts_parse_cuts(spec, ncand, cand, pp, pick, "--cuts");
    }
    if (st == DT_OK && pp > 1 && !have && strcmp(spec, "auto") == 0) {
        st = dt_parts_balance(whole, t->pg, t->mesh, (uint64_t)t->a.seed, t->threads, nnodes, ncand,
                              cand, candn, (int)((b + M - 1) / M), pick);
        whole = NULL;
        if (st == DT_OK)
            st = build(user, &whole);
    }
    const char **names = pp > 1 ? dt_alloc(sizeof(char *) * (size_t)(pp - 1)) : NULL;
    if (st == DT_OK && pp > 1 && !names)
        st = DT_ERR_NOMEM;
    t->ncuts    = st == DT_OK ? pp - 1 : 0;
    t->cut_node = candn; // positions of the candidates; the first ncuts become the cuts
    size_t at   = 0;
    for (int k = 0; k < t->ncuts; k++) {
        names[k]       = cand[pick[k]];
        t->cut_node[k] = candn[pick[k]];
        at += (size_t)snprintf(t->cut_names + at, sizeof t->cut_names - at, "%s%s", k ? "," : "",
                               names[k]);
        if (at >= sizeof t->cut_names)
            at = sizeof t->cut_names - 1;
    }
    dt_free(pick);
    dt_pipe_opts po  = dt_pipe_opts_default();
    po.micro_batches = M;
    if (st == DT_OK &&
        dt_pipe_schedule_parse(t->a.schedule ? t->a.schedule : "1f1b", &po.schedule) != DT_OK)
        st = DT_ERR_ARG;
    if (st == DT_OK) {
        st    = dt_pipe_new(&t->pipe, whole, t->ncuts, names,
                         t->mesh ? dt_mesh_group(t->mesh, DT_MESH_PP) : NULL, (uint64_t)t->a.seed,
                            &po);
        whole = NULL;
    }
    dt_graph_free(whole);
    dt_free(names);
    if (st == DT_OK && t->mesh && t->rank == 0 && t->a.checkpoint_dir && !t->a.eval_only && !same)
        st = layout_write(t);
    if (st == DT_OK && t->mesh && t->rank == 0) {
        printf("mesh: dp %d x pp %d x tp %d; %d micro-batches per step (%s)%s%s\n",
               t->msize[DT_MESH_DP], pp, t->msize[DT_MESH_TP], M,
               dt_pipe_schedule_name(po.schedule), pp > 1 ? ", cuts after " : "",
               pp > 1 ? t->cut_names : "");
        fflush(stdout);
    }
    if (st != DT_OK)
        return st;
    *stage = t->g = dt_pipe_graph(t->pipe);
    return DT_OK;
}

// ------------------------------------------------------------------ the whole model

static dt_parts parts_of(dt_trainer *t) {
    return (dt_parts){.world    = t->pg,
                      .mesh     = t->mesh,
                      .whole    = t->whole,
                      .local    = dt_graph_params(t->g),
                      .cut_node = t->cut_node,
                      .ncuts    = t->ncuts};
}

dt_status dt_trainer_init_params(dt_trainer *t, dt_trainer_fill_fn fill, void *user) {
    if (!t->pipe || !t->whole || !fill)
        return dt_fail(DT_ERR_STATE,
                       "dt_trainer_init_params: expected dt_trainer_pipeline first and a fill "
                       "function");
    dt_parts pt = parts_of(t);
    return dt_parts_init(&pt, fill, user);
}

dt_status dt_train_mesh_load_model(dt_trainer *t, const char *path) {
    if (!t->pipe || !t->whole)
        return dt_fail(DT_ERR_STATE, "--load on a mesh: expected the model from "
                                     "dt_trainer_pipeline");
    dt_parts pt = parts_of(t);
    return dt_parts_load_model(&pt, path);
}

dt_status dt_train_mesh_save_model(dt_trainer *t, const char *path) {
    if (!t->pipe || !t->whole)
        return dt_fail(DT_ERR_STATE, "--save-model on a mesh: expected the model from "
                                     "dt_trainer_pipeline");
    dt_parts pt = parts_of(t);
    return dt_parts_save_model(&pt, path);
}

// ------------------------------------------------------------------ checkpoints

static dt_status part_dir(const dt_trainer *t, char *buf, size_t n) {
    if (snprintf(buf, n, "%s/pp%d-tp%d", t->a.checkpoint_dir, dt_mesh_coord(t->mesh, DT_MESH_PP),
                 dt_mesh_coord(t->mesh, DT_MESH_TP)) >= (int)n)
        return dt_fail(DT_ERR_ARG, "--checkpoint-dir: a path too long");
    return DT_OK;
}

dt_status dt_train_mesh_save(dt_trainer *t, const dt_ckpt_state *cs, const dt_ckpt_opts *co) {
    char dir[LAYOUT_MAX];
    DT_TRY(part_dir(t, dir, sizeof dir));
    // One more than --keep: a save stopped between two parts' markers still leaves a
    // step every part has.
    dt_ckpt_opts o = *co;
    o.keep         = o.keep > 0 ? o.keep + 1 : o.keep;
    DT_TRY(dt_ckpt_save(dir, dt_train_dp_group(t), cs, &o));
    return dt_pg_barrier(t->pg); // every part's marker is down before anyone goes on
}

// The newest step of steps[0, n) below `below`, -1 when none.
static int64_t newest_below(const int64_t *steps, size_t n, int64_t below) {
    for (size_t i = n; i-- > 0;)
        if (steps[i] < below)
            return steps[i];
    return -1;
}

// Each part's newest step below `below` (and its coordinates), gathered: v holds 3 per
// rank. Every rank of a part lists the same folder.
static dt_status gather_newest(dt_trainer *t, const int64_t *steps, size_t n, int64_t below,
                               int64_t *v) {
    int64_t mine[3] = {newest_below(steps, n, below), dt_mesh_coord(t->mesh, DT_MESH_PP),
                       dt_mesh_coord(t->mesh, DT_MESH_TP)};
    return dt_pg_all_gather(t->pg, mine, v, 3, DT_INT64);
}

// Why no step of every part loads, with v the parts' newest steps (3 per rank): a part
// without any checkpoint while another has some (a part folder lost), or parts with no
// step in common.
static dt_status parts_apart(const dt_trainer *t, const int64_t *v) {
    int none = 0, most = 0;
    for (int r = 0; r < t->world; r++) {
        none = v[3 * r] < v[3 * none] ? r : none;
        most = v[3 * r] > v[3 * most] ? r : most;
    }
    char lack[48];
    snprintf(lack, sizeof lack, v[3 * none] < 0 ? "no checkpoint" : "steps up to %lld only",
             (long long)v[3 * none]);
    return dt_fail(DT_ERR_MISMATCH,
                   "--resume: %s/pp%lld-tp%lld holds %s while %s/pp%lld-tp%lld holds steps up to "
                   "%lld; expected a step that every part of the --pp %d --tp %d layout holds "
                   "(restore the missing part, or use another --checkpoint-dir)",
                   t->a.checkpoint_dir, (long long)v[3 * none + 1], (long long)v[3 * none + 2],
                   lack, t->a.checkpoint_dir, (long long)v[3 * most + 1],
                   (long long)v[3 * most + 2], (long long)v[3 * most], t->msize[DT_MESH_PP],
                   t->msize[DT_MESH_TP]);
}

// The checkpoints of every part, loaded at one step: the newest step that every part
// holds, or with --fallback the newest one that every part also loads. Parts that hold
// checkpoints but none of one step are refused: starting fresh would overwrite them.
dt_status dt_train_mesh_load(dt_trainer *t, const dt_ckpt_state *cs, const dt_ckpt_opts *co,
                             dt_ckpt_info *info) {
    char      dir[LAYOUT_MAX], first_msg[1024] = "";
    int64_t  *steps = NULL, below = INT64_MAX;
    size_t    n     = 0;
    int       world = t->world;
    dt_status first = DT_OK;
    memset(info, 0, sizeof *info);
    info->step   = -1;
    dt_status st = part_dir(t, dir, sizeof dir);
    if (st == DT_OK)
        st = dt_ckpt_list(dir, &steps, &n);
    int64_t *v = dt_alloc(sizeof(int64_t) * 6 * (size_t)world), *v0 = NULL;
    if (st == DT_OK && !v)
        st = DT_ERR_NOMEM;
    if (v)
        v0 = v + 3 * world; // the first round's: what each part holds at all
    st = agree_world(t, st);
    for (int round = 0; st == DT_OK; round++) {
        if ((st = gather_newest(t, steps, n, below, v)) != DT_OK)
            break;
        if (round == 0)
            memcpy(v0, v, sizeof(int64_t) * 3 * (size_t)world);
        int64_t cand = INT64_MAX;
        for (int r = 0; r < world; r++)
            cand = v[3 * r] < cand ? v[3 * r] : cand;
        bool any = false; // a checkpoint in some part at all
        for (int r = 0; r < world; r++)
            any = any || v0[3 * r] >= 0;
        if (cand < 0 && first) // every step that all parts hold was refused
            st = dt_fail(first,
                         "--resume: no step of every model part in %s could be loaded (%d "
                         "refused); the newest was refused: %s",
                         t->a.checkpoint_dir, info->refused, first_msg);
        else if (cand < 0 && any)
            st = parts_apart(t, v0);
        if (cand < 0) // nothing anywhere: a fresh start
            break;
        // cand is common only when every part holds it; else every common step is older.
        int64_t have = 0;
        for (size_t i = 0; i < n; i++)
            have |= steps[i] == cand;
        if ((st = dt_pg_all_reduce(t->pg, &have, &have, 1, DT_INT64, DT_REDUCE_MIN)) != DT_OK)
            break;
        if (!have) {
            below = cand;
            continue;
        }
        dt_ckpt_opts o = *co;
        o.below = cand + 1, o.fallback = false; // this step in every part, or none
        int refused = info->refused;
        dt_ckpt_info_free(info);
        st = dt_ckpt_load(dir, dt_train_dp_group(t), cs, &o, info);
        if (st == DT_OK && info->step != cand)
            st = dt_fail(DT_ERR_STATE, "--resume: %s: expected step %lld, loaded step %lld", dir,
                         (long long)cand, (long long)info->step);
        info->refused = refused;
        st            = agree_world(t, st);
        // A dead peer is not a refusal: nothing older would help.
        if (st == DT_OK || !co->fallback || st == DT_ERR_PEER || st == DT_ERR_TIMEOUT)
            break;
        if (!first) {
            first = st;
            snprintf(first_msg, sizeof first_msg, "%s", dt_last_error());
        }
        if (t->rank == 0)
            DT_WARN("train", "refusing step %lld of the model parts in %s: %s; trying an older one",
                    (long long)cand, t->a.checkpoint_dir, dt_last_error());
        info->refused++;
        st    = DT_OK;
        below = cand;
    }
    dt_free(v);
    dt_free(steps);
    return st;
}

// ------------------------------------------------------------------ the loop's calls

dt_status dt_trainer_pipe_step(dt_trainer *t, const void *const *inputs, int batch,
                               const uint64_t *keys, dt_pipe_loss_fn loss, void *user,
                               float *loss_out) {
    if (!t->pipe || !t->prepared)
        return dt_fail(DT_ERR_STATE, "dt_trainer_pipe_step: expected dt_trainer_pipeline and "
                                     "dt_trainer_prepare_graph first");
    if (t->exec)
        return dt_fail(DT_ERR_STATE,
                       "dt_trainer_pipe_step: --device %s trains through "
                       "dt_trainer_device_step",
                       t->a.device);
    return dt_strategy_pipe_step(t->strat, inputs, batch, keys, loss, user, loss_out);
}

dt_status dt_trainer_pipe_eval(dt_trainer *t, const void *const *inputs, int batch,
                               dt_pipe_loss_fn loss, void *user, float *loss_out) {
    if (!t->pipe)
        return dt_fail(DT_ERR_STATE, "dt_trainer_pipe_eval: expected dt_trainer_pipeline first");
    DT_TRY(dt_train_device_pull(t)); // --device cuda: the CPU evaluates the host copies
    return dt_pipe_eval(t->pipe, inputs, batch, loss, user, loss_out);
}
