// ps.c: the trainer's side of the parameter server (--ps N; src/parallel/ps.h, docs/ps.md):
// the world split into workers and servers, what does not fit refused, a server's loop
// run in place of the program's, and the end.
#include "parallel/ps.h"
#include "train/train_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// What a parameter server does not support yet, or NULL.
static const char *refused(const dt_trainer *t) {
    const dt_train_args *a = &t->a;
    if (!t->pg)
        return "a group (--num-processes, or a launcher)";
    if (dt_train_elastic_wanted() || t->el)
        return "a fixed group (an elastic job's membership changes)";
    if (a->zero > 0)
        return "--zero 0 (the servers already shard the optimizer state)";
    if (a->pp > 1 || a->tp > 1)
        return "--pp 1 --tp 1 (the servers shard the whole model's flat parameters)";
    if (a->data_parallel > 1)
        return "--data-parallel 1";
    if (a->clip_grad > 0)
        return "no --clip-grad (the norm of the mean gradient is known on no one rank)";
    if ((a->device && strcmp(a->device, "cpu")) || a->num_gpu_processes)
        return "--device cpu";
    if (a->precision && strcmp(a->precision, "fp32"))
        return "--precision fp32";
    if (a->ddp_compress && strcmp(a->ddp_compress, "none"))
        return "--ddp-compress none";
    if (t->o.broadcast_buffers)
        return "a program without shared buffers (BatchNorm's would stay each worker's)";
    return NULL;
}

dt_status dt_train_ps_start(dt_trainer *t) {
    if (t->a.ps <= 0 && t->a.ps_staleness > 0)
        return dt_fail(DT_ERR_ARG,
                       "--ps-staleness %ld: expected --ps N with it (the staleness bound of "
                       "parameter servers), found no --ps",
                       t->a.ps_staleness);
    if (t->a.ps <= 0)
        return DT_OK;
    const char *why = refused(t);
    if (why)
        return dt_fail(DT_ERR_ARG, "--ps %ld: expected %s", t->a.ps, why);
    int world = t->world, servers = (int)t->a.ps, workers = world - servers;
    if (workers < 1)
        return dt_fail(DT_ERR_ARG,
                       "--ps %d: expected fewer servers than the %d ranks (a worker "
                       "at least)",
                       servers, world);
    int *ranks = dt_alloc(sizeof(int) * (size_t)workers);
    if (!ranks)
        return DT_ERR_NOMEM;
    for (int r = 0; r < workers; r++)
        ranks[r] = r;
    dt_pg    *wg = NULL;
    dt_status st = dt_pg_new_group(&wg, t->pg, ranks, workers, NULL);
    dt_free(ranks);
    DT_TRY(st);
    t->ps_world  = t->pg;
    t->ps_server = t->rank >= workers;
    t->pg        = wg; // NULL on a server: it trains nothing itself
    if (wg) {
        t->world = dt_pg_size(wg), t->rank = dt_pg_rank(wg);
        t->local_rank = dt_pg_local_rank(wg), t->local_size = dt_pg_local_size(wg);
        char mode[64] = "synchronous";
        if (t->a.ps_staleness)
            snprintf(mode, sizeof mode, "asynchronous, staleness %ld", t->a.ps_staleness);
        dt_trainer_print(t, "Parameter server: %d worker%s, %d server%s (ranks %d to %d), %s\n",
                         workers, workers > 1 ? "s" : "", servers, servers > 1 ? "s" : "", workers,
                         world - 1, mode);
    } else { // keeps its world rank (never 0: it prints nothing of the program's), so
             // that loaders made before dt_trainer_prepare take a valid, unused shard
        t->local_rank = t->local_size = 1;
    }
    return DT_OK;
}

// The workers' agreement on a SIGTERM is a point where they all meet: an asynchronous
// server's workers meet every max(16, 2K) steps only, so that each may run ahead.
bool dt_train_ps_agrees(const dt_trainer *t) {
    long k = t->ps_world ? t->a.ps_staleness : 0, every = 2 * k > 16 ? 2 * k : 16;
    return k == 0 || t->step % every == 0;
}

dt_status dt_train_ps_prepare(dt_trainer *t) {
    if (!t->ps_world)
        return DT_OK;
    if (t->join)
        return dt_fail(DT_ERR_ARG, "--ps %ld: expected even shards, found DT_SPLIT_TRAIN_UNEVEN",
                       t->a.ps);
    if (t->pg) { // the workers start from worker 0's model, as DDP's replicas do
        DT_TRY(dt_pg_broadcast(t->pg, dt_params_data(t->p), dt_params_numel(t->p), DT_FLOAT32, 0));
        if (dt_params_buffer_numel(t->p))
            DT_TRY(dt_pg_broadcast(t->pg, dt_params_buffers(t->p), dt_params_buffer_numel(t->p),
                                   DT_FLOAT32, 0));
    }
    DT_TRY(dt_ps_new(&t->ps, t->p, t->opt, t->ps_world, (int)t->a.ps, (int)t->a.ps_staleness));
    if (!t->ps_server)
        return DT_OK;
    // A SIGTERM (dtrun's or the parent's, to every rank) waits for the workers, who
    // agree on a step to stop at and then say DONE: the server ends with them.
    dt_train_preempt_arm();
    dt_status st = dt_ps_serve(t->ps);
    if (dt_train_preempt_pending()) { // consumed here: the release would end the process
        t->preempted = true;          // with the signal; the job's code is the stop's, 75
        if (st == DT_OK)
            st = dt_fail(DT_ERR_STATE, "stopped by SIGTERM with the workers at step %lld",
                         (long long)dt_ps_step(t->ps));
    }
    dt_train_preempt_release();
    t->finish_called = true; // a server has no model of its own to save or report
    exit(dt_trainer_exit(t, st));
}

void dt_train_ps_end(dt_trainer *t, int rc) {
    if (!t->ps_world)
        return;
    if (t->ps && (rc == 0 || rc == DT_EXIT_PREEMPTED))
        (void)dt_ps_close(t->ps); // a failure here is the servers' to report
    dt_ps_free(t->ps);
    t->ps = NULL;
    if (rc && rc != DT_EXIT_PREEMPTED)
        dt_pg_abort(t->ps_world, t->ps_server ? "a server failed" : "a worker failed");
    dt_pg_free(t->ps_world);
    t->ps_world = NULL, t->ps_server = false;
}
