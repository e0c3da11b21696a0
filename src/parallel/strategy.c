// strategy.c: the one seam between the trainer and the parallel strategies (strategy.h):
// which of DDP, ZeRO, DataParallel threads and uneven inputs runs is decided once, in
// dt_strategy_new, and the step's fixed points dispatch here.
#include "parallel/strategy.h"

#include "parallel/ps.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

struct dt_strategy {
    dt_strategy_opts o;
    dt_params       *p;
    dt_optim        *opt;
    dt_pg           *world, *dp;
    const dt_mesh   *mesh;
    dt_pipe         *pipe;
    dt_ddp          *ddp;  // DDP over dp (no ZeRO)
    bool             tree; // DDP's tree_reduce as it runs (compression turns it off)
    dt_powersgd     *psgd; // DDP's comm hook with --ddp-compress powersgd
    dt_zero         *zero; // ZeRO over dp
    // DataParallel (dp.h): the program's master replica and how to make more; the
    // replicas themselves, made at the first forward_backward.
    dt_dp        *threads;
    dt_dp_ops     ops;
    dt_dp_replica master;
    bool          has_replicas;
};

dt_status dt_strategy_new(dt_strategy **out, dt_params *p, dt_optim *opt, dt_pg *world, dt_pg *dp,
                          const dt_mesh *mesh, dt_pipe *pipe, const dt_strategy_opts *o,
                          dt_strategy_info *info) {
    *out           = NULL;
    dt_strategy *s = dt_alloc_zero(sizeof *s);
    if (!s)
        return dt_fail_context("the parallel strategy");
    *s = (dt_strategy){
        .o = *o, .p = p, .opt = opt, .world = world, .dp = dp, .mesh = mesh, .pipe = pipe};
    dt_strategy_info in = {0};
    dt_status        st = DT_OK;
    if (dp && o->zero.stage > 0) {
        dt_optim_state(opt, &in.full_floats);
        st = dt_zero_new(&s->zero, p, dp, opt, &o->zero);
        dt_optim_state(opt, &in.optim_floats);
        in.zero_stage = o->zero.stage;
    } else if (dp && !o->ps) { // a parameter server's workers reduce through the servers
        dt_ddp_opts d    = dt_ddp_opts_default();
        d.overlap        = o->overlap;
        d.tree_reduce    = o->tree_reduce;
        const char *name = o->compress ? o->compress : "none";
        if (!strcmp(name, "powersgd")) { // a comm hook (ddp.h), the same on every rank
            dt_powersgd_opts po = dt_powersgd_opts_default();
            po.rank             = o->powersgd_rank;
            st                  = dt_powersgd_new(&s->psgd, p, dt_pg_size(dp), &po);
            d.comm_hook         = st == DT_OK ? dt_powersgd_hook(s->psgd) : NULL;
            d.tree_reduce       = false;
        } else if ((st = dt_ddp_compress_parse(name, &d.compress)) == DT_OK &&
                   d.compress != DT_DDP_COMPRESS_NONE) {
            d.tree_reduce = false; // compression sums ranks its own way
        }
        s->tree = d.tree_reduce;
        if (st == DT_OK)
            st = dt_ddp_new(&s->ddp, p, dp, &d);
        if (st == DT_OK)
            dt_pipe_set_ddp(pipe, s->ddp); // reduced in the last micro-batch's backward
    }
    if (st != DT_OK) {
        dt_strategy_free(s);
        return st;
    }
    if (info)
        *info = in;
    *out = s;
    return DT_OK;
}

void dt_strategy_free(dt_strategy *s) {
    if (!s)
        return;
    dt_dp_free(s->threads);
    dt_ddp_free(s->ddp);
    dt_powersgd_free(s->psgd);
    dt_zero_free(s->zero);
    dt_free(s);
}

// ------------------------------------------------------------------ micro-batches

dt_status dt_strategy_share_buffers(dt_strategy *s) {
    return s->ddp && s->o.broadcast_buffers ? dt_ddp_broadcast_buffers(s->ddp) : DT_OK;
}

void dt_strategy_set_sync(dt_strategy *s, bool sync) {
    if (s->ddp) // uneven inputs reduce in dt_strategy_reduce, once the counts are known
        dt_ddp_set_sync(s->ddp, sync && !s->o.join);
    if (s->zero)
        dt_zero_set_sync(s->zero, sync);
}

dt_status dt_strategy_set_replicas(dt_strategy *s, const dt_dp_ops *ops,
                                   const dt_dp_replica *master) {
    if (s->has_replicas)
        return dt_fail(DT_ERR_STATE, "dt_trainer_set_replicas: expected one call, found a second");
    s->ops = *ops, s->master = *master, s->has_replicas = true;
    return DT_OK;
}

bool dt_strategy_replicas_ran(const dt_strategy *s) {
    return s && s->threads;
}

dt_status dt_strategy_grads_ready(dt_strategy *s) {
    dt_params *p = s->p;
    for (int i = dt_params_count(p) - 1; i >= 0; i--) {
        const dt_param_info *pi = dt_params_info(p, i);
        if (pi->trainable)
            DT_TRY(dt_params_grad_ready(p, pi->offset, pi->count));
    }
    return DT_OK;
}

dt_status dt_strategy_forward_backward(dt_strategy *s, const dt_batch *b, const dt_rng *rng,
                                       float *loss) {
    if (!s->has_replicas)
        return dt_fail(DT_ERR_STATE,
                       "dt_trainer_forward_backward: expected dt_trainer_set_replicas first");
    if (s->o.data_parallel <= 1) // the plain loop: the master on the whole micro-batch
        return s->ops.work(s->ops.user, &s->master, b, loss);
    if (!s->threads) {
        dt_dp_opts o      = dt_dp_opts_default();
        int        n      = s->o.data_parallel;
        o.replica_threads = s->o.threads / n > 1 ? s->o.threads / n : 1;
        DT_TRY(dt_dp_new(&s->threads, s->p, n, &s->ops, &o));
    }
    dt_dp_set_rng(s->threads, rng); // the epoch's dropout stream, as the master's
    DT_TRY(dt_dp_forward_backward(s->threads, b, loss));
    // Replicas in each of several processes: DDP reduces the master's gradients over them.
    return s->ddp ? dt_strategy_grads_ready(s) : DT_OK;
}

dt_status dt_strategy_pipe_step(dt_strategy *s, const void *const *inputs, int batch,
                                const uint64_t *keys, dt_pipe_loss_fn loss, void *user,
                                float *loss_out) {
    // ZeRO's shards of a tie's two copies lie apart: the copies' gradients are summed
    // before any reduction, which waits for the end of the pipeline's backwards.
    if (s->zero)
        dt_zero_set_sync(s->zero, false);
    dt_status st = dt_pipe_step(s->pipe, inputs, batch, keys, loss, user, loss_out);
    if (!s->zero || st != DT_OK)
        return st;
    dt_zero_set_sync(s->zero, true);
    return dt_strategy_grads_ready(s);
}

// ------------------------------------------------------------------------ steps

size_t dt_strategy_loss_over(dt_strategy *s, size_t n) {
    // Only the plain loop under DDP's tree: DataParallel's replicas weigh their slices'
    // means (dp.c), join divides by the samples itself, a pipeline has its own losses.
    if (!s->ddp || !s->tree || s->o.data_parallel > 1 || s->o.join || s->pipe ||
        (s->world && dt_pg_size(s->dp) != dt_pg_size(s->world)))
        return n;
    dt_ddp_set_sum(s->ddp, true);
    return n * (size_t)dt_pg_size(s->dp);
}

static void scale_all(dt_params *p, float f) {
    float *g = dt_params_grads(p);
    size_t n = dt_params_numel(p);
    for (size_t i = 0; i < n; i++)
        g[i] *= f;
}

dt_status dt_strategy_reduce(dt_strategy *s, int window, int64_t samples) {
    if (s->o.join) { // the mean over every rank's samples of the window
        int64_t total = samples;
        if (s->dp) {
            DT_TRY(dt_pg_all_reduce(s->dp, &total, &total, 1, DT_INT64, DT_REDUCE_SUM));
            DT_TRY(dt_pg_all_reduce(s->dp, dt_params_grads(s->p), dt_params_grads(s->p),
                                    dt_params_numel(s->p), DT_FLOAT32, DT_REDUCE_SUM));
        }
        if (total > 0)
            scale_all(s->p, 1.0f / (float)total);
        return DT_OK;
    }
    if (s->ddp) {
        dt_status st = dt_ddp_sync(s->ddp);
        dt_ddp_set_sum(s->ddp, false); // the next window's loss asks again
        DT_TRY(st);
    } else if (s->zero) // this rank's shard of the averaged gradient
        DT_TRY(dt_zero_sync(s->zero));
    if (window > 1 && s->zero) // the mean over the window's micro-batches: the shard only
        dt_zero_scale_grad(s->zero, 1.0f / (float)window);
    else if (window > 1)
        scale_all(s->p, 1.0f / (float)window);
    return DT_OK;
}

// Each tensor counted once over the mesh: a tie's copy not at all, a tensor every tp
// rank holds whole by 1/tp from each, a part by 1. Summed over the world (the dp
// replicas hold the same averaged gradient: divided by dp; ZeRO's shards: summed).
static dt_status clip_parts(dt_strategy *s, float max_norm, float *norm) {
    dt_params *p = s->p;
    int        n = dt_params_count(p), tp = dt_mesh_size(s->mesh, DT_MESH_TP);
    float     *wt = dt_alloc(sizeof(float) * (size_t)(n ? n : 1));
    if (!wt)
        return DT_ERR_NOMEM;
    for (int i = 0; i < n; i++) {
        const dt_param_info *pi = dt_params_info(p, i);
        wt[i]                   = !pi->trainable || dt_pipe_is_tie_copy(s->pipe, i) ? 0.0f
                                  : dt_param_split_on(&pi->split)                   ? 1.0f
                                                                  : 1.0f / (float)tp;
    }
    double ss = 0;
    if (s->zero) {
        ss = dt_zero_shard_sumsq(s->zero, wt);
    } else {
        const float *g = dt_params_grads(p);
        for (int i = 0; i < n; i++) {
            const dt_param_info *pi = dt_params_info(p, i);
            double               x  = 0;
            for (size_t e = 0; wt[i] != 0.0f && e < pi->count; e++)
                x += (double)g[pi->offset + e] * g[pi->offset + e];
            ss += wt[i] * x;
        }
        ss /= dt_mesh_size(s->mesh, DT_MESH_DP);
    }
    float     total = (float)ss;
    dt_status st    = dt_pg_all_reduce(s->world, &total, &total, 1, DT_FLOAT32, DT_REDUCE_SUM);
    total           = sqrtf(total);
    if (norm)
        *norm = total;
    float coef = (float)((double)max_norm / ((double)total + 1e-6));
    if (st == DT_OK && isfinite(total) && coef < 1.0f) // the whole local buffer: under
        for (int i = 0; i < n; i++) {                  // ZeRO only the shard is read
            const dt_param_info *pi = dt_params_info(p, i);
            float               *g  = dt_params_grads(p) + pi->offset;
            for (size_t e = 0; pi->trainable && e < pi->count; e++)
                g[e] *= coef;
        }
    dt_free(wt);
    return st;
}

dt_status dt_strategy_clip(dt_strategy *s, float max_norm, float *norm) {
    if (s->mesh) // over the model's parts
        return clip_parts(s, max_norm, norm);
    if (s->zero)
        return dt_zero_clip_grad_norm(s->zero, max_norm, norm);
    return dt_clip_grad_norm(s->p, max_norm, norm);
}

dt_status dt_strategy_step(dt_strategy *s) {
    if (s->o.ps) // the servers average the workers' gradients and step
        return dt_ps_push_pull(s->o.ps);
    if (s->zero)
        return dt_zero_step(s->zero);
    dt_optim_step(s->opt);
    return DT_OK;
}

// ----------------------------------------------------------------------- the end

// The CRC32C of this rank's parameters against every rank's of `g` (NULL: none).
static dt_status same_crc(dt_pg *g, uint32_t crc, int32_t *first, int *bad, int32_t *theirs) {
    *bad = -1;
    if (!g)
        return DT_OK;
    int      n    = dt_pg_size(g);
    int32_t *all  = dt_alloc(sizeof(int32_t) * (size_t)n);
    int32_t  mine = (int32_t)crc;
    if (!all)
        return DT_ERR_NOMEM;
    dt_status st = dt_pg_all_gather(g, &mine, all, 1, DT_INT32);
    for (int r = 1; st == DT_OK && r < n && *bad < 0; r++)
        if (all[r] != all[0])
            *bad = r, *first = all[0], *theirs = all[r];
    dt_free(all);
    return st;
}

dt_status dt_strategy_check_replicas(dt_strategy *s, uint32_t *crc, char *what, size_t n) {
    DT_TRY(dt_strategy_settle(s)); // an asynchronous server's workers: its final model
    *crc          = dt_crc32c(0, dt_params_data(s->p), dt_params_numel(s->p) * sizeof(float));
    what[0]       = '\0';
    int     world = s->world ? dt_pg_size(s->world) : 1, bad;
    int32_t first, theirs;
    if (s->zero && dt_zero_stage(s->zero) == 3) { // no replicas: each rank its range
        snprintf(what, n, "Parameters sharded over %d ranks (ZeRO-3)", world);
        return DT_OK;
    }
    if (s->mesh) { // the replicas of each model part: its dp group
        DT_TRY(same_crc(s->dp, *crc, &first, &bad, &theirs));
        if (bad >= 0)
            return dt_fail(DT_ERR_INTERNAL,
                           "replicas diverged: model part pp %d tp %d has CRC32C %08x in replica "
                           "0 and %08x in replica %d",
                           dt_mesh_coord(s->mesh, DT_MESH_PP), dt_mesh_coord(s->mesh, DT_MESH_TP),
                           (uint32_t)first, (uint32_t)theirs, bad);
        int dp = dt_mesh_size(s->mesh, DT_MESH_DP);
        snprintf(what, n,
                 "Parameters identical on the %d replicas of each of the %d model parts (rank "
                 "0's CRC32C %08x)",
                 dp, world / dp, *crc);
        return DT_OK;
    }
    DT_TRY(same_crc(s->world, *crc, &first, &bad, &theirs));
    if (bad >= 0)
        return dt_fail(DT_ERR_INTERNAL,
                       "replicas diverged: rank 0's parameters have CRC32C %08x, rank %d's %08x",
                       (uint32_t)first, bad, (uint32_t)theirs);
    if (s->world)
        snprintf(what, n, "Parameters identical on all %d ranks (CRC32C %08x)", world, *crc);
    return DT_OK;
}

dt_status dt_strategy_settle(dt_strategy *s) {
    // Only an asynchronous server's workers differ, and only after a push: the end of an
    // epoch settles for its evaluation, and the replica check and a save after it find
    // the workers settled already.
    if (!s || !dt_ps_staleness(s->o.ps) || dt_ps_settled(s->o.ps))
        return DT_OK;
    DT_DEBUG("ps", "settling the workers' model after step %lld (a barrier and a pull)",
             (long long)dt_ps_step(s->o.ps));
    DT_TRY(dt_pg_barrier(s->world)); // every push applied: one model on every server
    return dt_ps_pull_params(s->o.ps);
}

dt_status dt_strategy_gather_params(dt_strategy *s, int root) {
    if (s && s->o.ps) { // the servers' optimizer state (every worker's parameters are whole)
        DT_TRY(dt_strategy_settle(s));
        return dt_ps_pull_state(s->o.ps);
    }
    return s && s->zero ? dt_zero_params_gather(s->zero, root) : DT_OK;
}

dt_status dt_strategy_release_params(dt_strategy *s) {
    return s && s->zero ? dt_zero_params_release(s->zero) : DT_OK;
}

void dt_strategy_state_bytes(const dt_strategy *s, double *peak, double *moved_per_step) {
    double pk = 0, mv = 0;
    if (s && s->zero) {
        dt_zero_usage u;
        dt_zero_get_usage(s->zero, &u);
        pk = (double)(u.resident_peak_bytes ? u.resident_peak_bytes : u.state_bytes);
        mv = u.steps ? u.moved_bytes / (double)u.steps : 0;
    } else if (s) { // the whole parameters, gradients and optimizer state
        size_t n = dt_params_numel(s->p), nf = 0;
        dt_optim_state(s->opt, &nf);
        pk = 4.0 * (double)(2 * n + nf);
        // A ring all-reduce: each rank receives 2 (N - 1) / N of the gradients.
        int w = s->dp ? dt_pg_size(s->dp) : 1;
        mv = s->ddp ? 4.0 * 2.0 * (double)(w - 1) / w * (double)n : dt_ps_bytes_per_step(s->o.ps);
    }
    if (peak)
        *peak = pk;
    if (moved_per_step)
        *moved_per_step = mv;
}

double dt_strategy_wait_secs(const dt_strategy *s) {
    double  wait_s = 0, gather_s = 0;
    int64_t steps = 0;
    if (s && s->ddp)
        dt_ddp_stats(s->ddp, &wait_s, &steps);
    if (s && s->zero) // the wait for gradients and for the parameters' all-gather
        dt_zero_stats(s->zero, &wait_s, &gather_s, &steps);
    return wait_s + gather_s + (s ? dt_ps_wait_secs(s->o.ps) : 0);
}
