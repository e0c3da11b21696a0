// dp_gpt.c: dtrain-gpt's training loop with DataParallel threads (dp.h) instead of
// processes, for bench/dp_vs_procs.sh: the example's own model, data, optimizer and
// schedule (its source is included, not copied), the global batch split over N
// replicas exactly as N DDP ranks split it (dt_tokens_batch with rank = replica), one
// AdamW step per batch on the master. Its loss lines match `dtrain-gpt --num-processes
// N` to rounding. Usage: dp_gpt --data-parallel N [dtrain-gpt's training flags].
#define main dtrain_gpt_main
#include "../examples/gpt/main.c"
#undef main

#include "dtrain/dp.h"

typedef struct dp_job {
    const args *a;
    dt_tokens  *train;
    int         n;
    int64_t     step;
} dp_job;

static dt_status make_gpt(void *user, int index, dt_dp_replica *out) {
    (void)index;
    dp_job *j = user;
    gpt    *m = calloc(1, sizeof *m);
    if (!m)
        return DT_ERR_NOMEM;
    dt_status st = gpt_new(m, j->a, j->n); // this replica's b = batch / N sequences
    if (!st) {
        long th = j->a->threads / j->n;
        st      = dt_graph_set_threads(m->g, th > 1 ? (int)th : 1);
    }
    if (st) {
        gpt_free(m), free(m);
        return st;
    }
    *out = (dt_dp_replica){.obj = m, .params = m->p}; // its threads and keys are its own
    return DT_OK;
}

static void drop_gpt(void *user, dt_dp_replica *r) {
    (void)user;
    gpt_free(r->obj), free(r->obj);
}

// Replica i is rank i of N: the same sequences a DDP rank would train on.
static dt_status work_gpt(void *user, dt_dp_replica *r, const dt_batch *slice, float *loss) {
    dp_job *j = user;
    gpt    *m = r->obj;
    DT_TRY(dt_tokens_batch(j->train, (uint64_t)(j->a->seed * 1000 + j->step), (size_t)j->a->batch,
                           (size_t)m->T, (int)slice->indices[0], j->n, m->offsets, m->x, m->y));
    return gpt_forward_backward(m, NULL, loss);
}

int main(int argc, char **argv) {
    int n = 0;
    for (int i = 1; i + 1 < argc; i++)
        if (!strcmp(argv[i], "--data-parallel")) {
            n = atoi(argv[i + 1]);
            memmove(argv + i, argv + i + 2, sizeof(char *) * (size_t)(argc - i - 1));
            argc -= 2;
            break;
        }
    args a;
    int  rc = parse_args(argc, argv, &a);
    if (rc)
        return rc < 0 ? 0 : rc;
    if (n < 1 || a.batch % n) {
        fprintf(stderr, "dp_gpt: expected --data-parallel N dividing --batch-size, found %d\n", n);
        return 2;
    }
    job j = {.a = &a, .world = 1, .start = dt_now()};
    if (dt_corpus_read(a.data, (size_t)a.limit, &j.all, &j.nfiles)) {
        fprintf(stderr, "dp_gpt: %s\n", dt_last_error());
        return 1;
    }
    dt_tokens_split(&j.all, &j.train, &j.val);
    gpt        master = {0};
    dt_dp     *dp     = NULL;
    dt_optim  *opt    = NULL;
    dt_sched  *sch    = NULL;
    dp_job     dj     = {&a, &j.train, n, 0};
    dt_dp_ops  ops    = {make_gpt, drop_gpt, work_gpt, &dj};
    dt_status  st     = gpt_new(&master, &a, 1);
    dt_dp_opts dpo    = dt_dp_opts_default();
    if (!st)
        st = dt_dp_new(&dp, master.p, n, &ops, &dpo);
    dt_adam_opts ao = dt_adamw_opts_default();
    ao.lr = (float)a.lr, ao.beta2 = 0.95f, ao.weight_decay = (float)a.weight_decay;
    dt_param_group_opts nd = dt_param_group_opts_default();
    nd.weight_decay        = 0;
    if (!st && !(st = dt_adamw_new(&opt, master.p, &ao)))
        st = dt_optim_add_group(opt, dt_param_no_decay, NULL, &nd, NULL);
    dt_sched_opts so = dt_sched_opts_default();
    args          la = a;
    so.kind = DT_SCHED_LAMBDA, so.lambda = lr_at, so.user = &la;
    if (!st)
        st = dt_sched_new(&sch, &so);
    // One "sample" per replica: dt_dp gives replica i the slice [i, i + 1), whose index
    // names the rank whose sequences it trains on.
    uint32_t *ranks = calloc((size_t)n, sizeof *ranks);
    float     dummy = 0;
    for (int i = 0; ranks && i < n; i++)
        ranks[i] = (uint32_t)i;
    dt_batch b  = {.x = &dummy, .indices = ranks, .size = (size_t)n};
    double   t0 = dt_now(), tok = (double)a.batch * (double)a.block;
    float    loss = 0, norm;
    for (; !st && ranks && dj.step < a.steps; dj.step++) {
        dt_params_zero_grad(master.p);
        if ((st = dt_dp_forward_backward(dp, &b, &loss)) ||
            (st = dt_clip_grad_norm(master.p, (float)a.grad_clip, &norm)) ||
            (st = dt_sched_apply(sch, opt, dj.step)))
            break;
        dt_optim_step(opt);
        int64_t s = dj.step + 1;
        if (s == 1 || s % a.log_every == 0 || s == a.steps)
            printf("step %lld/%ld | loss %.6f\n", (long long)s, a.steps, (double)loss);
    }
    double loop = dt_now() - t0;
    if (!st)
        printf("STATS {\"train_loop_secs\": %.3f, \"tokens_per_sec\": %.1f, \"data_parallel\": "
               "%d, \"peak_rss_mib\": %.1f}\n",
               loop, tok * (double)a.steps / loop, n, peak_rss_mib());
    else
        fprintf(stderr, "dp_gpt: %s\n", dt_last_error());
    free(ranks);
    dt_sched_free(sch), dt_optim_free(opt), dt_dp_free(dp), gpt_free(&master);
    dt_tokens_free(&j.all);
    return st ? 1 : 0;
}
