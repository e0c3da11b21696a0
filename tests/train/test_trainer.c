// The one-object API (dt_trainer) against the hand-written loop it replaces: the same
// model bit for bit on 1, 2 and 4 processes (and 1 vs 2 vs 4 to rounding); gradient
// accumulation over k micro-batches of B equal to one batch of kB; whole-state save and
// --resume bitwise equal to an uninterrupted run; gather_for_metrics counting every
// evaluation sample once; the flag table's parser; dt_trainer_start and dt_trainer_exit
// (forked workers go on in the caller's code and end in dt_trainer_exit; their exit code
// is the parent's).
#include "../check.h"
#include "../lib/mp.h"
#include "dtrain/train.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

enum { H = 8, W = 8, NS = 100, MAXP = 4096 };

static dt_dataset train_set;
static char       tmp[256];

// A small MLP with dropout: its masks are keyed by sample, so the world size does not
// change them.
static dt_status make_model(dt_model **out, uint64_t seed) {
    dt_model *m  = NULL;
    dt_status st = dt_model_new(&m, 1, H, W);
    if (st != DT_OK)
        return st;
    if ((st = dt_model_add_flatten(m)) || (st = dt_model_add_linear(m, 16)) ||
        (st = dt_model_add_relu(m)) || (st = dt_model_add_dropout(m, 0.25f)) ||
        (st = dt_model_add_linear(m, 10)) || (st = dt_model_add_log_softmax(m)) ||
        (st = dt_model_finalize(m, seed)) || (st = dt_model_set_threads(m, 1))) {
        dt_model_free(m);
        return st;
    }
    *out = m;
    return DT_OK;
}

static dt_optim *make_sgd(dt_model *m) {
    dt_sgd_opts o = dt_sgd_opts_default();
    o.lr = 0.1f, o.momentum = 0.5f;
    dt_optim *opt = NULL;
    CHECK_OK(dt_sgd_new(&opt, dt_model_as_params(m), &o));
    return opt;
}

// ------------------------------------------------------------ the hand-written loop

typedef struct result {
    int     n;         // floats
    int64_t steps;     // optimizer steps
    int     gathered;  // gather_for_metrics: elements
    int     seen[NS];  // ... how often each index came back
    int     saw_first; // ranks that found rank 0's file after main_first_begin
    float   p[MAXP];   // rank 0's parameters at the end
} result;

static result *shared_result; // MAP_SHARED: written by forked workers

// dtrain-mnist's loop before the trainer, over the small model.
static void hand_loop(dt_pg *pg, long batch, long epochs, result *out) {
    int       world = pg ? dt_pg_size(pg) : 1, rank = pg ? dt_pg_rank(pg) : 0;
    dt_model *m;
    CHECK_OK(make_model(&m, 3));
    dt_optim       *opt = make_sgd(m);
    dt_sampler_opts so  = dt_sampler_opts_default();
    so.num_replicas = world, so.rank = rank, so.seed = 3;
    dt_loader_opts lo = dt_loader_opts_default();
    lo.batch_size     = (size_t)batch;
    dt_sampler *smp   = NULL;
    dt_loader  *ld    = NULL;
    CHECK_OK(dt_sampler_new(&smp, train_set.n, &so));
    CHECK_OK(dt_loader_new(&ld, &train_set, smp, &lo));
    dt_ddp *ddp = NULL;
    if (pg)
        CHECK_OK(dt_ddp_new(&ddp, dt_model_as_params(m), pg, NULL));
    float    dlogp[10 * 64];
    uint64_t keys[64];
    dt_rng   base = dt_rng_init(3), root = dt_rng_split(&base, 0x64726f70);
    int64_t  steps = 0;
    for (long e = 0; e < epochs; e++) {
        dt_loader_begin_epoch(ld, e);
        dt_rng er = dt_rng_split(&root, (uint64_t)e);
        dt_model_set_rng(m, &er);
        dt_batch b;
        while (dt_loader_next(ld, &b)) {
            float loss;
            for (size_t i = 0; i < b.size; i++)
                keys[i] = b.indices[i];
            CHECK_OK(dt_model_set_sample_keys(m, keys, (int)b.size));
            CHECK_OK(dt_model_forward(m, b.x, (int)b.size));
            CHECK_OK(dt_loss_nll(dt_model_output(m), b.y, (int)b.size, 10, &loss, dlogp));
            dt_model_zero_grad(m);
            CHECK_OK(dt_model_backward(m, dlogp));
            if (ddp)
                CHECK_OK(dt_ddp_sync(ddp));
            dt_optim_step(opt);
            steps++;
        }
    }
    if (rank == 0) {
        out->n     = (int)dt_model_num_params(m);
        out->steps = steps;
        memcpy(out->p, dt_model_params(m), sizeof(float) * dt_model_num_params(m));
    }
    dt_ddp_free(ddp);
    dt_loader_free(ld);
    dt_sampler_free(smp);
    dt_optim_free(opt);
    dt_model_free(m);
}

typedef struct hand_arg {
    long batch, epochs;
} hand_arg;

static void hand_rank(int rank, int world, void *arg) {
    (void)rank, (void)world;
    hand_arg *h  = arg;
    dt_pg    *pg = mp_pg_init(0);
    CHECK(pg != NULL);
    if (!pg)
        return;
    result *r = mp_shared();
    hand_loop(pg, h->batch, h->epochs, r);
    dt_pg_free(pg);
}

// ------------------------------------------------------------------- the trainer

typedef struct job {
    long batch;
    bool sched;  // a warmup + cosine schedule
    bool linear; // a hand-written linear regression over a dt_params (no dt_model)
    bool late;   // the training loader after dt_trainer_prepare_model (refused)
} job;

static void save_result(dt_trainer *t, dt_params *p, void *all, size_t total) {
    if (!dt_trainer_is_main(t))
        return;
    result *r   = shared_result;
    r->n        = (int)dt_params_numel(p);
    r->steps    = dt_trainer_step_count(t);
    r->gathered = (int)total;
    memset(r->seen, 0, sizeof r->seen);
    for (size_t i = 0; i < total; i++)
        if (((int32_t *)all)[i] >= 0 && ((int32_t *)all)[i] < NS)
            r->seen[((int32_t *)all)[i]]++;
    memcpy(r->p, dt_params_data(p), sizeof(float) * dt_params_numel(p));
}

// Bring your own gradients: y = w . x + b against label / 10, mean squared error, the
// backward written by hand and reported to DDP with dt_params_grad_ready.
static dt_status linear_fn(dt_trainer *t, const job *j) {
    dt_params *p;
    dt_loader *ld;
    int64_t    wshape[1] = {H * W}, bshape[1] = {1};
    DT_TRY(dt_trainer_loader(t, &train_set, (size_t)j->batch, DT_SPLIT_TRAIN, &ld));
    DT_TRY(dt_params_new(&p, NULL));
    dt_status st;
    if ((st = dt_params_add(p, "w", 1, wshape, 0)) ||
        (st = dt_params_add(p, "b", 1, bshape, DT_PARAM_NO_DECAY)) || (st = dt_params_alloc(p))) {
        dt_params_free(p);
        return st;
    }
    float *w = dt_params_data(p), *g = dt_params_grads(p);
    dt_rng r = dt_rng_init(5);
    for (int i = 0; i <= H * W; i++)
        w[i] = dt_rng_uniform_range(&r, -0.1f, 0.1f);
    dt_sgd_opts so = dt_sgd_opts_default();
    so.lr          = 0.01f;
    dt_optim *opt;
    if ((st = dt_sgd_new(&opt, p, &so))) {
        dt_params_free(p);
        return st;
    }
    DT_TRY(dt_trainer_prepare(t, p, opt, NULL));
    // main_process_first: rank 0 writes a file; every other rank finds it.
    char path[300];
    snprintf(path, sizeof path, "%s/first", tmp);
    DT_TRY(dt_trainer_main_first_begin(t));
    if (dt_trainer_is_main(t)) {
        FILE *f = fopen(path, "w");
        if (f)
            fclose(f);
    } else if (access(path, F_OK) == 0) {
        __atomic_fetch_add(&shared_result->saw_first, 1, __ATOMIC_SEQ_CST);
    }
    DT_TRY(dt_trainer_main_first_end(t));
    DT_TRY(dt_trainer_wait_for_everyone(t));
    if (dt_trainer_is_main(t))
        unlink(path);
    dt_batch b;
    while (dt_trainer_next(t, &b)) {
        float loss = 0;
        for (size_t s = 0; s < b.size; s++) {
            const float *x = b.x + s * H * W;
            float        y = w[H * W], d;
            for (int k = 0; k < H * W; k++)
                y += w[k] * x[k];
            d = y - (float)b.y[s] / 10.0f;
            loss += d * d / (float)b.size;
            for (int k = 0; k < H * W; k++)
                g[k] += 2 * d * x[k] / (float)b.size;
            g[H * W] += 2 * d / (float)b.size;
        }
        DT_TRY(dt_params_grad_ready(p, 0, H * W + 1));
        DT_TRY(dt_trainer_step(t, loss));
    }
    DT_TRY(dt_trainer_finish(t));
    int32_t none = 0;
    void   *all;
    size_t  total;
    DT_TRY(dt_trainer_gather_for_metrics(t, &none, 0, DT_INT32, &all, &total));
    save_result(t, p, all, total);
    dt_free(all);
    return DT_OK;
}

static dt_status train_fn(dt_trainer *t, void *user) {
    const job *j = user;
    if (j->linear)
        return linear_fn(t, j);
    dt_model  *m;
    dt_loader *ld;
    dt_sched  *sch = NULL;
    if (!j->late)
        DT_TRY(dt_trainer_loader(t, &train_set, (size_t)j->batch, DT_SPLIT_TRAIN, &ld));
    DT_TRY(make_model(&m, 3));
    if (j->sched) {
        dt_sched_opts so = dt_sched_opts_default();
        so.kind = DT_SCHED_COSINE, so.warmup_steps = 3, so.total_steps = 20, so.min_lr = 0.01f;
        if (dt_sched_new(&sch, &so)) {
            dt_model_free(m);
            return dt_last_status();
        }
    }
    DT_TRY(dt_trainer_prepare_model(t, m, make_sgd(m), sch));
    if (j->late)
        DT_TRY(dt_trainer_loader(t, &train_set, (size_t)j->batch, DT_SPLIT_TRAIN, &ld));
    float    dlogp[10 * 64];
    dt_batch b;
    while (dt_trainer_next(t, &b)) {
        float loss;
        DT_TRY(dt_model_forward(m, b.x, (int)b.size));
        DT_TRY(dt_loss_nll(dt_model_output(m), b.y, (int)b.size, 10, &loss, dlogp));
        DT_TRY(dt_model_backward(m, dlogp));
        DT_TRY(dt_trainer_step(t, loss));
    }
    DT_TRY(dt_trainer_finish(t));
    // Every index of an evaluation pass, gathered: each must come back exactly once.
    dt_loader *el;
    DT_TRY(dt_trainer_loader(t, &train_set, 7, DT_SPLIT_EVAL, &el));
    int32_t idx[NS];
    size_t  n = 0;
    dt_loader_begin_epoch(el, 0);
    while (dt_loader_next(el, &b))
        for (size_t i = 0; i < b.size && n < NS; i++)
            idx[n++] = (int32_t)b.indices[i];
    void  *all;
    size_t total;
    DT_TRY(dt_trainer_gather_for_metrics(t, idx, n, DT_INT32, &all, &total));
    save_result(t, dt_model_as_params(m), all, total);
    dt_free(all);
    return DT_OK;
}

// Runs the trainer on `flags` (space-separated), its result in *out; returns the exit code.
static int run_trainer(const char *flags, job *j, result *out) {
    char buf[512], *argv[40];
    int  argc    = 0;
    argv[argc++] = "test_trainer";
    snprintf(buf, sizeof buf, "--threads 1 --seed 3 --no-test --invariant 0 --backend %s %s",
             mp_backend(), flags);
    for (char *s = strtok(buf, " "); s && argc < 39; s = strtok(NULL, " "))
        argv[argc++] = s;
    argv[argc] = NULL;
    // Each run its own job: no port, token or ranks left over from the last one.
    const char *vars[] = {"MASTER_PORT", "MASTER_ADDR", "GROUP_RANK",       "WORLD_SIZE",
                          "RANK",        "LOCAL_RANK",  "LOCAL_WORLD_SIZE", "DT_JOB_TOKEN"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++)
        unsetenv(vars[i]);
    memset(shared_result, 0, sizeof *shared_result);
    dt_trainer     *t;
    dt_trainer_opts o = dt_trainer_opts_default();
    o.program         = "test_trainer";
    CHECK_OK(dt_trainer_new(&t, argc, argv, &o));
    if (!t)
        return -1;
    int rc = dt_trainer_exit(t, dt_trainer_start(t) ? train_fn(t, j) : DT_OK);
    *out   = *shared_result;
    return rc;
}

static float max_diff(const result *a, const result *b) {
    float d = a->n == b->n && a->n > 0 ? 0 : INFINITY;
    for (int i = 0; i < a->n && a->n == b->n; i++)
        d = fmaxf(d, fabsf(a->p[i] - b->p[i]));
    return d;
}

// ------------------------------------------------------------------------- tests

static result r_hand, r_tr, r_ref;

static void test_same_as_hand_loop(void) {
    job j = {.batch = 8};
    // One process, no group: the trainer's loop is the hand-written one.
    memset(&r_hand, 0, sizeof r_hand);
    hand_loop(NULL, 8, 2, &r_hand);
    CHECK_EQ(run_trainer("--epochs 2", &j, &r_tr), 0);
    CHECK_EQ(r_tr.steps, r_hand.steps);
    CHECK(r_tr.n > 0 && memcmp(r_tr.p, r_hand.p, sizeof(float) * (size_t)r_tr.n) == 0);
    r_ref = r_tr;
    // P processes: the same model as the hand-written DDP loop on P processes, bit for
    // bit, and as one process with P times the batch to rounding.
    for (int P = 1; P <= 4; P *= 2) {
        hand_arg h = {.batch = 8 / P, .epochs = 2};
        mp_opts  o = {.world = P};
        MP_RUN(&o, hand_rank, &h);
        r_hand = *(result *)mp_shared();
        char flags[64];
        j.batch = h.batch;
        snprintf(flags, sizeof flags, "--epochs 2 --num-processes %d", P);
        CHECK_EQ(run_trainer(flags, &j, &r_tr), 0);
        CHECK_EQ(r_tr.steps, r_hand.steps);
        CHECK(r_tr.n > 0 && memcmp(r_tr.p, r_hand.p, sizeof(float) * (size_t)r_tr.n) == 0);
        CHECK(max_diff(&r_tr, &r_ref) < 1e-5f);
        printf("     %d process(es): bitwise equal to the hand-written loop; max |diff| to one "
               "process %.2g\n",
               P, (double)max_diff(&r_tr, &r_ref));
        // Every evaluation sample once across ranks.
        CHECK_EQ(r_tr.gathered, NS);
        int once = 0;
        for (int i = 0; i < NS; i++)
            once += r_tr.seen[i] == 1;
        CHECK_EQ(once, NS);
    }
}

static void test_accumulation(void) {
    // 100 samples: 13 batches of 8 (the last of 4) in windows of 4, 4, 4, 1 against 4
    // batches of 32 (the last of 4): the same samples per optimizer step.
    job big = {.batch = 32}, small = {.batch = 8};
    CHECK_EQ(run_trainer("--epochs 2", &big, &r_ref), 0);
    CHECK_EQ(run_trainer("--epochs 2 --accumulate 4", &small, &r_tr), 0);
    CHECK_EQ(r_ref.steps, 8);
    CHECK_EQ(r_tr.steps, 8);
    float d = max_diff(&r_tr, &r_ref);
    CHECK(d < 1e-5f);
    // ... and the no-sync micro-steps on 2 ranks (2 x 8 per micro-batch, windows of 2).
    small.batch = 8;
    CHECK_EQ(run_trainer("--epochs 2 --accumulate 2 --num-processes 2", &small, &r_tr), 0);
    CHECK_EQ(r_tr.steps, 8);
    CHECK(max_diff(&r_tr, &r_ref) < 1e-5f);
    printf("     k=4 x B=8 vs B=32: max |diff| %.2g; 2 ranks x k=2 x B=8: %.2g\n", (double)d,
           (double)max_diff(&r_tr, &r_ref));
    // The reference is not trivially close: batches of 8 without accumulation end far
    // from it.
    CHECK_EQ(run_trainer("--epochs 2", &small, &r_tr), 0);
    CHECK(max_diff(&r_tr, &r_ref) > 1e-3f);
}

static void test_resume_bitwise(void) {
    // The whole state: parameters, SGD's momentum, the schedule's step, the dropout
    // stream, the loader's position (mid-epoch), with accumulation and clipping.
    job  j = {.batch = 8, .sched = true};
    char flags[512];
    snprintf(flags, sizeof flags,
             "--epochs 3 --accumulate 2 --clip-grad 0.5 --num-processes 2 --checkpoint-dir %s/a",
             tmp);
    CHECK_EQ(run_trainer(flags, &j, &r_ref), 0);
    snprintf(flags, sizeof flags,
             "--epochs 3 --accumulate 2 --clip-grad 0.5 --num-processes 2 --checkpoint-dir %s/b "
             "--max-steps 5",
             tmp);
    CHECK_EQ(run_trainer(flags, &j, &r_tr), 0);
    CHECK_EQ(r_tr.steps, 5);
    CHECK(max_diff(&r_tr, &r_ref) > 0); // stopped early: not yet the same
    snprintf(flags, sizeof flags,
             "--epochs 3 --accumulate 2 --clip-grad 0.5 --num-processes 2 --checkpoint-dir %s/b "
             "--resume",
             tmp);
    CHECK_EQ(run_trainer(flags, &j, &r_tr), 0);
    CHECK_EQ(r_tr.steps, r_ref.steps);
    CHECK(r_tr.n > 0 && memcmp(r_tr.p, r_ref.p, sizeof(float) * (size_t)r_tr.n) == 0);
    // A resume with another --accumulate computes other steps: refused.
    snprintf(flags, sizeof flags,
             "--epochs 4 --accumulate 1 --clip-grad 0.5 --num-processes 2 --checkpoint-dir %s/b "
             "--resume",
             tmp);
    CHECK_EQ(run_trainer(flags, &j, &r_tr), 1);
    // The training loader after dt_trainer_prepare_model: the mid-epoch resume would
    // restart the epoch (a model of more steps); refused, naming the order.
    snprintf(flags, sizeof flags, "--epochs 3 --checkpoint-dir %s/c --max-steps 5", tmp);
    CHECK_EQ(run_trainer(flags, &j, &r_tr), 0); // one process, mid-epoch (13 steps each)
    j.late = true;
    snprintf(flags, sizeof flags, "--epochs 3 --checkpoint-dir %s/c --resume", tmp);
    CHECK_EQ(run_trainer(flags, &j, &r_tr), 1);
    CHECK(strstr(dt_last_error(), "expected the training loader before dt_trainer_prepare*, "
                                  "found it after") != NULL);
    CHECK_EQ(r_tr.steps, 0);
}

static void test_own_gradients(void) {
    // A dt_params with a hand-written backward: 1 process with batch 8, 2 with 4 each,
    // 4 with 2 each and accumulation, with clipping: one model to rounding.
    job j = {.batch = 8, .linear = true};
    CHECK_EQ(run_trainer("--epochs 3 --clip-grad 0.5", &j, &r_ref), 0);
    CHECK_EQ(r_ref.steps, 39);
    CHECK_EQ(r_ref.gathered, 0);
    j.batch = 4;
    CHECK_EQ(run_trainer("--epochs 3 --clip-grad 0.5 --num-processes 2", &j, &r_tr), 0);
    CHECK_EQ(r_tr.steps, 39);
    float d2 = max_diff(&r_tr, &r_ref);
    CHECK(d2 < 1e-5f);
    j.batch = 1;
    CHECK_EQ(run_trainer("--epochs 3 --clip-grad 0.5 --num-processes 4 --accumulate 2", &j, &r_tr),
             0);
    CHECK_EQ(r_tr.steps, 39);
    CHECK_EQ(r_tr.saw_first, 3);
    float d4 = max_diff(&r_tr, &r_ref);
    CHECK(d4 < 1e-5f);
    printf("     own gradients: 2 x 4 vs 1 x 8: max |diff| %.2g; 4 x 1 x 2 micro-batches: %.2g\n",
           (double)d2, (double)d4);
    // ... and the model moved: the reference is not the starting point.
    CHECK_EQ(run_trainer("--epochs 3 --max-steps 1", &j, &r_tr), 0);
    CHECK(max_diff(&r_tr, &r_ref) > 1e-3f);
}

// The step-based mode (dt_trainer_set_steps): K micro-batches per step without a
// loader, gradients zeroed per step and averaged over its micro-batches, the clipping
// norm set by the program, the hidden common flags refused.
typedef struct steps_seen {
    int   micro, wrong_index, syncs;
    float w0;
} steps_seen;

static dt_status steps_fn(dt_trainer *t, void *user) {
    steps_seen *s    = user;
    dt_params  *p    = NULL;
    int64_t     d[1] = {4};
    DT_TRY(dt_params_new(&p, NULL));
    DT_TRY(dt_params_add(p, "w", 1, d, 0));
    DT_TRY(dt_params_alloc(p));
    for (int i = 0; i < 4; i++)
        dt_params_data(p)[i] = 1.0f;
    dt_sgd_opts o = dt_sgd_opts_default();
    o.lr          = 0.1f;
    dt_optim *opt = NULL;
    DT_TRY(dt_sgd_new(&opt, p, &o));
    DT_TRY(dt_trainer_set_steps(t, 5, 3, 2));
    dt_trainer_set_clip_grad(t, 0.5); // the gradient (1, 1, 1, 1) has norm 2
    DT_TRY(dt_trainer_prepare(t, p, opt, NULL));
    dt_batch b;
    while (dt_trainer_next(t, &b)) {
        s->wrong_index += b.index != (size_t)(s->micro % 3) || b.size != 2;
        for (int i = 0; i < 4; i++) // 1 on the second micro-batch only
            dt_params_grads(p)[i] += (float)(b.index == 1);
        s->micro++;
        s->syncs += dt_trainer_sync_step(t);
        DT_TRY(dt_trainer_step(t, 0.0f));
    }
    DT_TRY(dt_trainer_finish(t));
    s->w0 = dt_params_data(p)[0];
    return dt_trainer_step_count(t) == 5 ? DT_OK : dt_fail(DT_ERR_STATE, "steps");
}

static void test_steps(void) {
    // One process: what earlier --num-processes runs set in this process's environment
    // would make it a launcher's worker.
    unsetenv("WORLD_SIZE"), unsetenv("GROUP_RANK"), unsetenv("RANK");
    char           *argv[] = {"test", "--log-every", "100", NULL};
    dt_trainer_opts o      = dt_trainer_opts_default();
    o.hide_flags           = "epochs accumulate";
    o.own_progress         = true;
    dt_trainer *t          = NULL;
    CHECK_OK(dt_trainer_new(&t, 3, argv, &o));
    steps_seen s = {0};
    CHECK_EQ(dt_trainer_exit(t, dt_trainer_start(t) ? steps_fn(t, &s) : DT_OK), 0);
    CHECK_EQ(s.micro, 15);
    CHECK_EQ(s.wrong_index, 0);
    CHECK_EQ(s.syncs, 5);
    // Per step: the gradient summed over 3 micro-batches is (1, 1, 1, 1), averaged 1/3,
    // norm 2/3, clipped to 0.5: each element 0.25, times lr 0.1, over 5 steps.
    CHECK(fabsf(s.w0 - (1.0f - 5 * 0.1f * 0.25f)) < 1e-6f);
    char *hidden[] = {"test", "--epochs", "2", NULL};
    t              = NULL;
    CHECK_EQ(dt_trainer_new(&t, 3, hidden, &o), DT_ERR_ARG); // hidden: unknown here
    CHECK(t == NULL);
}

static void test_invariant(void) {
    // --invariant 8: gradient shards and DDP's tree over ranks make 1 x 8, 2 x 4 and
    // 4 x 2 one model bit for bit (with --invariant 0 they differ by rounding, above).
    job j = {.batch = 8};
    CHECK_EQ(run_trainer("--epochs 2 --invariant 8", &j, &r_ref), 0);
    for (int P = 1; P <= 4; P *= 2) {
        char flags[96];
        j.batch = 8 / P;
        snprintf(flags, sizeof flags, "--epochs 2 --invariant 8 --num-processes %d", P);
        CHECK_EQ(run_trainer(flags, &j, &r_tr), 0);
        CHECK(r_tr.n > 0 && memcmp(r_tr.p, r_ref.p, sizeof(float) * (size_t)r_tr.n) == 0);
    }
    // A world that does not divide an explicit V is refused.
    j.batch = 2;
    CHECK_EQ(run_trainer("--epochs 1 --invariant 2 --num-processes 4", &j, &r_tr), 1);
}

// --help tells the program's own default of --epochs (dt_trainer_opts.default_epochs),
// not the trainer's.
static void test_epochs_help(void) {
    char path[300];
    snprintf(path, sizeof path, "%s/help.txt", tmp);
    fflush(stdout);
    int   saved = dup(1);
    FILE *f     = fopen(path, "w");
    if (!CHECK(f != NULL && saved >= 0))
        return;
    dup2(fileno(f), 1);
    char           *argv[] = {"test", "--help", NULL};
    dt_trainer_opts o      = dt_trainer_opts_default();
    o.default_epochs       = 14;
    dt_trainer *t          = NULL;
    CHECK_OK(dt_trainer_new(&t, 2, argv, &o));
    CHECK(t == NULL); // --help: printed, nothing to run
    fflush(stdout);
    dup2(saved, 1);
    close(saved);
    fclose(f);
    char  text[16384] = "";
    FILE *r           = fopen(path, "r");
    if (r) {
        text[fread(text, 1, sizeof text - 1, r)] = '\0';
        fclose(r);
    }
    CHECK(strstr(text, "passes over the training set (default 14)") != NULL);
    CHECK(strstr(text, "passes over the training set (default 1)") == NULL);
}

static long        f_long;
static double      f_dbl;
static bool        f_bool;
static const char *f_str;

static void test_flags(void) {
    const dt_flag tab[] = {
        {"count", DT_FLAG_LONG, &f_long, "7", 1, 100, "N", "a count", "s", 0, 0, 0},
        {"rate", DT_FLAG_DOUBLE, &f_dbl, "0.5", 0, 1, "X", "a rate", "s", 0, 0, 0},
        {"on", DT_FLAG_BOOL, &f_bool, NULL, 0, 0, "", "a switch", "s", 0, 0, 0},
        {"mode", DT_FLAG_STRING, &f_str, "a", 0, 0, "M", "a mode", "s", 0, "a b", "a or b"},
        {0}};
    const dt_flag *tabs[] = {tab, NULL};
    bool           help;
    char          *a1[] = {"p", NULL};
    CHECK_OK(dt_flags_parse(tabs, 1, a1, &help));
    CHECK(f_long == 7 && f_dbl == 0.5 && !f_bool && f_str && !strcmp(f_str, "a") && !help);
    char *a2[] = {"p", "--count", "9", "--rate=0.25", "--on", "--mode", "b", NULL};
    CHECK_OK(dt_flags_parse(tabs, 7, a2, &help));
    CHECK(f_long == 9 && f_dbl == 0.25 && f_bool && !strcmp(f_str, "b"));
    char *a3[] = {"p", "--count", "101", NULL};
    CHECK_EQ(dt_flags_parse(tabs, 3, a3, &help), DT_ERR_ARG);
    CHECK(strstr(dt_last_error(), "--count expects an integer in [1, 100], found \"101\""));
    char *a4[] = {"p", "--mode", "c", NULL};
    CHECK_EQ(dt_flags_parse(tabs, 3, a4, &help), DT_ERR_ARG);
    CHECK(strstr(dt_last_error(), "--mode expects a or b, found \"c\""));
    char *a5[] = {"p", "--frob", NULL};
    CHECK_EQ(dt_flags_parse(tabs, 2, a5, &help), DT_ERR_ARG);
    CHECK(strstr(dt_last_error(), "unknown option \"--frob\""));
    char *a6[] = {"p", "--count", NULL};
    CHECK_EQ(dt_flags_parse(tabs, 2, a6, &help), DT_ERR_ARG);
    char *a7[] = {"p", "--on=1", NULL};
    CHECK_EQ(dt_flags_parse(tabs, 2, a7, &help), DT_ERR_ARG);
    char *a8[] = {"p", "--help", NULL};
    CHECK_OK(dt_flags_parse(tabs, 2, a8, &help));
    CHECK(help);
    CHECK(dt_flags_find(tabs, "rate") == &tab[1] && dt_flags_find(tabs, "nope") == NULL);
}

// dt_trainer_start with --num-processes 3: three forked workers run the code after it
// (rank r writes its slot) and end in dt_trainer_exit, so only the parent passes it; a
// failing worker makes the parent's code 1; a failure before the start is 1 too.
typedef struct starts {
    int workers[3], after_exit, parents;
} starts;

static int start_run(bool fail) {
    char       *argv[] = {"test_start", "--num-processes", "3", "--threads", "1", NULL};
    const char *vars[] = {"MASTER_PORT", "MASTER_ADDR", "GROUP_RANK",       "WORLD_SIZE",
                          "RANK",        "LOCAL_RANK",  "LOCAL_WORLD_SIZE", "DT_JOB_TOKEN"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++)
        unsetenv(vars[i]);
    dt_trainer_opts o = dt_trainer_opts_default();
    o.program         = "test_start";
    dt_trainer *t     = NULL;
    if (dt_trainer_new(&t, 5, argv, &o) || !t)
        return -1;
    starts   *sh = mp_shared();
    dt_status st = DT_OK;
    if (dt_trainer_start(t)) {
        int r          = dt_trainer_rank(t);
        sh->workers[r] = dt_trainer_world(t);
        if (fail && r == 1)
            st = dt_fail(DT_ERR_STATE, "worker 1 gives up");
    } else {
        sh->parents++;
    }
    int rc = dt_trainer_exit(t, st);
    sh->after_exit++; // only the parent gets here
    return rc;
}

static void test_start_exit(void) {
    starts *sh = mp_shared();
    memset(sh, 0, sizeof *sh);
    CHECK_EQ(start_run(false), 0);
    CHECK(sh->workers[0] == 3 && sh->workers[1] == 3 && sh->workers[2] == 3);
    CHECK_EQ(sh->after_exit, 1);
    CHECK_EQ(sh->parents, 1);
    memset(sh, 0, sizeof *sh);
    CHECK_EQ(start_run(true), 1);
    CHECK_EQ(sh->after_exit, 1);
    dt_trainer     *t      = NULL;
    char           *argv[] = {"test_start", NULL};
    dt_trainer_opts o      = dt_trainer_opts_default();
    CHECK_OK(dt_trainer_new(&t, 1, argv, &o));
    CHECK_EQ(dt_trainer_exit(t, dt_fail(DT_ERR_IO, "no data")), 1);
    CHECK_EQ(dt_trainer_exit(NULL, DT_OK), 0);
}

int main(void) {
    snprintf(tmp, sizeof tmp, "/tmp/dtrain-test-trainer-XXXXXX");
    if (!mkdtemp(tmp))
        return 1;
    shared_result =
        mmap(NULL, sizeof(result), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    uint8_t img[NS * H * W], lab[NS];
    dt_rng  r = dt_rng_init(11);
    for (int i = 0; i < NS; i++) {
        lab[i] = (uint8_t)dt_rng_below(&r, 10);
        for (int k = 0; k < H * W; k++) // a class-dependent pattern plus noise
            img[i * H * W + k] = (uint8_t)((k % 10 == lab[i] ? 160 : 20) + dt_rng_below(&r, 90));
    }
    if (shared_result == MAP_FAILED || dt_dataset_init(&train_set, img, lab, NS, H, W, NULL))
        return 1;
    RUN(test_flags);
    RUN(test_epochs_help);
    RUN(test_same_as_hand_loop);
    RUN(test_accumulation);
    RUN(test_resume_bitwise);
    RUN(test_own_gradients);
    RUN(test_invariant);
    RUN(test_steps);
    RUN(test_start_exit);
    dt_dataset_free(&train_set);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmp);
    CHECK_EQ(system(cmd), 0);
    return check_summary();
}
