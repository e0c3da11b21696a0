// test_resume.c: a run resumed from a checkpoint ends bitwise equal to a run that was
// never interrupted, with the library's own training loop (model, DDP, Adam, sampler,
// loader, dropout), in 1 process and in 2 real processes over loopback.
//
// The loop uses every kind of state a checkpoint carries: Adam's moments and step count
// (bias correction depends on it), the sampler's epoch and position (runs stop
// mid-epoch and at an epoch's end), dropout masks keyed by (seed, epoch, batch, rank),
// and a stateful per-rank generator adding input noise, which only a restored RNG state
// reproduces. The reference is the same loop run straight through; parameters and
// optimizer state are compared with memcmp.
//
// Also collective behaviour with 2 ranks: a checkpoint of world 2 refused by a world-1
// job, a rank's refusal reaching every rank with its message, ranks saving different
// steps, and a rank's failing write reported on every rank.
#include "../lib/mp.h"
#include "ckpt_test.h"
#include "dtrain/ddp.h"

#define N_SAMPLES 200
#define BATCH     16
#define EPOCHS    3

static dt_dataset g_data; // inherited by the forked ranks

static void make_data(void) {
    uint8_t *img = malloc(N_SAMPLES * 36), *lab = malloc(N_SAMPLES);
    dt_rng   r = dt_rng_init(5);
    for (size_t i = 0; i < N_SAMPLES * 36; i++)
        img[i] = (uint8_t)dt_rng_below(&r, 256);
    for (size_t i = 0; i < N_SAMPLES; i++)
        lab[i] = (uint8_t)dt_rng_below(&r, 4);
    dt_dataset_opts o = dt_dataset_opts_default();
    o.num_classes     = 4;
    CHECK_OK(dt_dataset_init(&g_data, img, lab, N_SAMPLES, 6, 6, &o));
    free(img);
    free(lab);
}

static dt_model *dropout_model(void) {
    dt_model *m = NULL;
    dt_model_new(&m, 1, 6, 6);
    if (dt_model_add_conv2d(m, 4, 3, 1, 0) || dt_model_add_relu(m) ||
        dt_model_add_dropout2d(m, 0.2f) || dt_model_add_flatten(m) || dt_model_add_linear(m, 12) ||
        dt_model_add_relu(m) || dt_model_add_dropout(m, 0.3f) || dt_model_add_linear(m, 4) ||
        dt_model_add_log_softmax(m) || dt_model_finalize(m, 17))
        abort();
    return m;
}

typedef struct run_opts {
    const char *dir;   // checkpoint directory (NULL: none)
    int         every; // save every `every` steps
    int         stop;  // stop after this step (0: run all epochs)
    bool        resume;
    bool        forget_noise; // after loading, restart the noise stream (must diverge)
} run_opts;

typedef struct result {
    size_t  nparams, nstate;
    int64_t steps, resumed_from;
    float   params[4096];
    float   state[8192];
} result;

// The training loop of a user program. Returns the status of the first failure.
static dt_status train(dt_pg *pg, const run_opts *ro, result *res) {
    int          world = pg ? dt_pg_size(pg) : 1, rank = pg ? dt_pg_rank(pg) : 0;
    dt_model    *m   = dropout_model();
    dt_ddp      *ddp = NULL;
    dt_status    st  = DT_OK;
    dt_adam_opts ao  = dt_adam_opts_default();
    ao.lr            = 0.01f;
    dt_optim *opt    = NULL;
    dt_adam_new(&opt, dt_model_as_params(m), &ao);
    dt_sampler_opts so = dt_sampler_opts_default();
    so.num_replicas = world, so.rank = rank, so.seed = 3;
    dt_sampler *s = NULL;
    dt_sampler_new(&s, g_data.n, &so);
    dt_loader_opts lo = dt_loader_opts_default();
    lo.batch_size     = BATCH;
    dt_loader *l      = NULL;
    dt_loader_new(&l, &g_data, s, &lo);
    float        *dlogp  = malloc(sizeof(float) * 4 * BATCH);
    float        *x      = malloc(sizeof(float) * 36 * BATCH);
    dt_rng        base   = dt_rng_init(23);
    dt_rng        drop   = dt_rng_split(&base, 1);
    dt_rng        noise  = dt_rng_split(&base, 100 + (uint64_t)rank); // stateful, per rank
    dt_ckpt_rng   rngs[] = {{"dropout", &drop}, {"noise", &noise}};
    dt_ckpt_state cs     = {.model = m, .optim = opt, .sampler = s, .rngs = rngs, .nrngs = 2};
    int64_t       step   = 0;
    int64_t       epoch0 = 0;
    res->resumed_from    = -1;
    if (ro->resume) {
        dt_ckpt_info info;
        if ((st = dt_ckpt_load(ro->dir, pg, &cs, NULL, &info)))
            goto out;
        if (info.found) {
            step              = info.step;
            epoch0            = (int64_t)info.epoch;
            res->resumed_from = info.step;
        }
        if (ro->forget_noise)
            noise = dt_rng_split(&base, 100 + (uint64_t)rank);
        dt_ckpt_info_free(&info);
    }
    if (pg && (st = dt_ddp_new(&ddp, dt_model_as_params(m), pg, NULL)))
        goto out;
    for (int64_t epoch = epoch0; epoch < EPOCHS; epoch++) {
        dt_loader_begin_epoch(l, epoch);
        dt_rng   er = dt_rng_split(&drop, (uint64_t)epoch);
        dt_batch b;
        while (dt_loader_next(l, &b)) {
            dt_rng sr = dt_rng_split(&er, b.index), rr = dt_rng_split(&sr, (uint64_t)rank);
            for (size_t i = 0; i < b.size * 36; i++)
                x[i] = b.x[i] + 0.05f * dt_rng_normal(&noise);
            float loss;
            dt_model_set_rng(m, &rr);
            if ((st = dt_model_forward(m, x, (int)b.size)) ||
                (st = dt_loss_nll(dt_model_output(m), b.y, (int)b.size, 4, &loss, dlogp)))
                goto out;
            dt_model_zero_grad(m);
            if ((st = dt_model_backward(m, dlogp)) || (ddp && (st = dt_ddp_sync(ddp))))
                goto out;
            dt_optim_step(opt);
            step++;
            if (ro->dir && step % ro->every == 0) {
                cs.step = step;
                if ((st = dt_ckpt_save(ro->dir, pg, &cs, NULL)))
                    goto out;
            }
            if (step == ro->stop)
                goto out;
        }
        if ((st = dt_loader_status(l)))
            goto out;
    }
out:
    res->steps   = step;
    res->nparams = dt_model_num_params(m);
    memcpy(res->params, dt_model_params(m), res->nparams * 4);
    float *os = dt_optim_state(opt, &res->nstate);
    memcpy(res->state, os, res->nstate * 4);
    free(x);
    free(dlogp);
    dt_loader_free(l);
    dt_sampler_free(s);
    dt_optim_free(opt);
    dt_ddp_free(ddp);
    dt_model_free(m);
    return st;
}

static bool same_result(const result *a, const result *b) {
    return a->nparams == b->nparams && a->nstate == b->nstate && a->steps == b->steps &&
           memcmp(a->params, b->params, a->nparams * 4) == 0 &&
           memcmp(a->state, b->state, a->nstate * 4) == 0;
}

// ------------------------------------------------------------------ one process

static result straight, part, resumed;

static void test_one_process(void) {
    char     dir[128];
    run_opts none = {0};
    CHECK_OK(train(NULL, &none, &straight));
    CHECK(straight.nparams < 4096 && straight.nstate < 8192);
    // 200 samples / batch 16 = 13 batches an epoch (the last of 8), 39 steps.
    CHECK_EQ(straight.steps, 39);

    // Stop points: right at a checkpoint mid-epoch (20 = epoch 1 batch 7), between
    // checkpoints (23, resumed from 20), at an epoch's end (26 = 2 * 13), before the
    // first checkpoint (3: resume finds none and starts fresh), one step before the end.
    struct {
        int     every, stop;
        int64_t from;
    } cases[] = {{5, 20, 20}, {5, 23, 20}, {13, 26, 26}, {5, 3, -1}, {1, 38, 38}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        ct_tmpdir(dir, sizeof dir, "ckpt-resume1");
        run_opts a = {.dir = dir, .every = cases[c].every, .stop = cases[c].stop};
        CHECK_OK(train(NULL, &a, &part));
        CHECK_EQ(part.steps, cases[c].stop);
        CHECK(!same_result(&part, &straight));
        run_opts b = {.dir = dir, .every = cases[c].every, .resume = true};
        CHECK_OK(train(NULL, &b, &resumed));
        CHECK_EQ(resumed.resumed_from, cases[c].from);
        if (!CHECK(same_result(&resumed, &straight)))
            fprintf(stderr, "     case every %d stop %d\n", cases[c].every, cases[c].stop);
        ct_rm_tree(dir);
    }

    // A resume that does not restore the noise generator's state diverges: the check
    // above is sensitive to the RNG section.
    ct_tmpdir(dir, sizeof dir, "ckpt-resume1");
    run_opts a = {.dir = dir, .every = 5, .stop = 20};
    CHECK_OK(train(NULL, &a, &part));
    run_opts b = {.dir = dir, .every = 5, .resume = true, .forget_noise = true};
    CHECK_OK(train(NULL, &b, &resumed));
    CHECK_EQ(resumed.resumed_from, 20);
    CHECK(!same_result(&resumed, &straight));
    ct_rm_tree(dir);
}

// ------------------------------------------------------------------ two processes

typedef struct job {
    run_opts ro;
} job;

static void train_rank(int rank, int world, void *arg) {
    (void)world;
    job    *j  = arg;
    dt_pg  *pg = mp_pg_init(20000);
    result *r  = malloc(sizeof *r);
    if (!CHECK(pg != NULL))
        return;
    CHECK_OK(train(pg, &j->ro, r));
    if (rank == 0) // the shared page holds rank 0's result for the parent
        memcpy(mp_shared(), r, sizeof(int64_t) * 2 + sizeof(size_t) * 2 + r->nparams * 4);
    free(r);
    dt_pg_free(pg);
}

// What rank 0 left in the shared page, as a result (params only; state not compared).
static void shared_result(result *r) {
    memcpy(r, mp_shared(), sizeof(int64_t) * 2 + sizeof(size_t) * 2 + straight.nparams * 4);
    r->nstate = 0;
}

static bool same_params(const result *a, const result *b) {
    return a->nparams == b->nparams && a->steps == b->steps &&
           memcmp(a->params, b->params, a->nparams * 4) == 0;
}

static void test_two_processes(void) {
    char    dir[128];
    mp_opts o = {.world = 2};
    job     j = {0};
    MP_RUN(&o, train_rank, &j);
    result straight2;
    shared_result(&straight2);
    // 100 samples per rank / 16 = 7 batches an epoch (the last of 4), 21 steps.
    CHECK_EQ(straight2.steps, 21);

    int cases[][3] = {{4, 12, 12}, {4, 10, 8}, {7, 14, 14}}; // every, stop, resumed from
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        ct_tmpdir(dir, sizeof dir, "ckpt-resume2");
        j = (job){.ro = {.dir = dir, .every = cases[c][0], .stop = cases[c][1]}};
        MP_RUN(&o, train_rank, &j);
        result p;
        shared_result(&p);
        CHECK_EQ(p.steps, cases[c][1]);
        CHECK(!same_params(&p, &straight2));
        j = (job){.ro = {.dir = dir, .every = cases[c][0], .resume = true}};
        MP_RUN(&o, train_rank, &j);
        result r;
        shared_result(&r);
        CHECK_EQ(r.resumed_from, cases[c][2]);
        if (!CHECK(same_params(&r, &straight2)))
            fprintf(stderr, "     case every %d stop %d\n", cases[c][0], cases[c][1]);
        // Every file of the last checkpoint verifies.
        int64_t last;
        char    cdir[256];
        CHECK_OK(dt_ckpt_latest(dir, &last));
        CHECK_OK(dt_ckpt_path(dir, last, cdir, sizeof cdir));
        CHECK_OK(dt_ckpt_verify(cdir));
        if (c + 1 < sizeof cases / sizeof cases[0])
            ct_rm_tree(dir);
    }

    // The world-2 checkpoint left in dir is refused by a world-1 job.
    dt_model     *m  = dropout_model();
    dt_ckpt_state cs = {.model = m};
    CHECK_ERR(dt_ckpt_load(dir, NULL, &cs, NULL, NULL), DT_ERR_MISMATCH,
              "expected a checkpoint of world size 1 (this job's), found world size 2");
    dt_model_free(m);
    ct_rm_tree(dir);
}

// ------------------------------------------------------------------ collective errors

static char g_dir[128];

static void refusal_rank(int rank, int world, void *arg) {
    (void)world, (void)arg;
    dt_pg *pg = mp_pg_init(20000);
    if (!CHECK(pg != NULL))
        return;
    dt_model     *m  = dropout_model();
    dt_ckpt_state cs = {.model = m};
    // Rank 1's file is damaged: both ranks fail, with rank 1's message.
    CHECK_ERR(dt_ckpt_load(g_dir, pg, &cs, NULL, NULL), DT_ERR_FORMAT,
              rank == 0 ? "rank 1: " : "rank-00001.dtck: corrupt section 0 (SMPL)");
    CHECK(strstr(dt_last_error(), "rank-00001.dtck: corrupt section 0 (SMPL)") != NULL);
    // Ranks that disagree on the step.
    cs.step = 30 + rank;
    CHECK_ERR(dt_ckpt_save(g_dir, pg, &cs, NULL), DT_ERR_MISMATCH,
              "expected the same step on every rank, found 30 on rank 0 and 31 on rank 1");
    // Rank 1 alone passes something invalid: every rank fails with its message.
    dt_rng      g       = dt_rng_init(1);
    dt_ckpt_rng twice[] = {{"a", &g}, {"a", &g}};
    cs.step             = 40;
    cs.rngs             = twice;
    cs.nrngs            = rank == 1 ? 2 : 1;
    CHECK_ERR(dt_ckpt_save(g_dir, pg, &cs, NULL), DT_ERR_ARG,
              rank == 0 ? "rank 1: checkpoint: expected unique RNG names"
                        : "checkpoint: expected unique RNG names");
    // The group is still usable after refused checkpoints: a good save works.
    cs.nrngs = 1;
    CHECK_OK(dt_ckpt_save(g_dir, pg, &cs, NULL));
    dt_model_free(m);
    dt_pg_free(pg);
}

static void test_collective_errors(void) {
    ct_tmpdir(g_dir, sizeof g_dir, "ckpt-coll");
    mp_opts o = {.world = 2};
    job     j = {.ro = {.dir = g_dir, .every = 3, .stop = 3}};
    MP_RUN(&o, train_rank, &j);
    char cdir[256], path[512];
    CHECK_OK(dt_ckpt_path(g_dir, 3, cdir, sizeof cdir));
    snprintf(path, sizeof path, "%s/rank-00001.dtck", cdir);
    size_t         n;
    unsigned char *b = ct_read(path, &n);
    ct_section     secs[4];
    CHECK_EQ(ct_sections(b, n, secs, 4), 2);
    CHECK(strcmp(secs[0].tag, "SMPL") == 0);
    b[secs[0].payload_at + 9] ^= 0x40;
    ct_write(path, b, n);
    free(b);
    MP_RUN(&o, refusal_rank, NULL);
    int64_t *steps;
    CHECK_OK(dt_ckpt_list(g_dir, &steps, &n));
    CHECK(n == 2 && steps[0] == 3 && steps[1] == 40); // none of 30, 31 or a failed 40
    dt_free(steps);
    ct_rm_tree(g_dir);
}

int main(void) {
    make_data();
    RUN(test_one_process);
    RUN(test_two_processes);
    RUN(test_collective_errors);
    dt_dataset_free(&g_data);
    return check_summary();
}
