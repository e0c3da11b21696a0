// Uneven inputs (DDP's join, DT_SPLIT_TRAIN_UNEVEN): ranks whose data runs out early
// shadow the others' steps instead of hanging them. P processes with batch B train the
// model of one process with batch P * B on the same split (every sample once per epoch,
// no padding) to rounding, with and without --accumulate; ranks with very different
// amounts of data (a dataset of another size on each) finish, in bounded time, with
// identical parameters (the trainer's CRC32C check) and the longest rank's step count.
//
// Tolerance: parameters within 1e-5 absolute (values ~0.1, 2 epochs of SGD), as for the
// trainer's 1 vs 2 vs 4 processes.
#include "../check.h"
#include "../lib/mp.h"
#include "dtrain/train.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

enum { H = 8, W = 8, NS = 101, MAXP = 2048, NR = 4 };

static dt_dataset full_set, rank_set[NR]; // rank_set[r]: 10 + 30 r samples

typedef struct result {
    int     n;
    int64_t steps;
    int64_t batches; // real micro-batches the training function saw, all ranks
    int64_t samples; // and their samples
    float   p[MAXP];
} result;

static result *shared_result;
static long    t_batch;
static bool    t_per_rank; // each rank its own data set

static dt_status make_model(dt_model **out) {
    dt_model *m  = NULL;
    dt_status st = dt_model_new(&m, 1, H, W);
    if (st != DT_OK)
        return st;
    if ((st = dt_model_add_flatten(m)) || (st = dt_model_add_linear(m, 16)) ||
        (st = dt_model_add_relu(m)) || (st = dt_model_add_dropout(m, 0.25f)) ||
        (st = dt_model_add_linear(m, 10)) || (st = dt_model_add_log_softmax(m)) ||
        (st = dt_model_finalize(m, 3)) || (st = dt_model_set_threads(m, 1))) {
        dt_model_free(m);
        return st;
    }
    *out = m;
    return DT_OK;
}

static dt_status train_fn(dt_trainer *t, void *user) {
    (void)user;
    const dt_dataset *ds = t_per_rank ? &rank_set[dt_trainer_rank(t) % NR] : &full_set;
    dt_loader        *ld;
    dt_model         *m;
    DT_TRY(dt_trainer_loader(t, ds, (size_t)t_batch, DT_SPLIT_TRAIN_UNEVEN, &ld));
    DT_TRY(make_model(&m));
    dt_sgd_opts o = dt_sgd_opts_default();
    o.lr = 0.1f, o.momentum = 0.5f;
    dt_optim *opt = NULL;
    DT_TRY(dt_sgd_new(&opt, dt_model_as_params(m), &o));
    DT_TRY(dt_trainer_prepare_model(t, m, opt, NULL));
    float    dlogp[10 * 64];
    dt_batch b;
    while (dt_trainer_next(t, &b)) {
        float loss;
        DT_TRY(dt_model_forward(m, b.x, (int)b.size));
        DT_TRY(dt_loss_nll(dt_model_output(m), b.y, (int)b.size, 10, &loss, dlogp));
        DT_TRY(dt_model_backward(m, dlogp));
        DT_TRY(dt_trainer_step(t, loss));
        __atomic_fetch_add(&shared_result->batches, 1, __ATOMIC_SEQ_CST);
        __atomic_fetch_add(&shared_result->samples, (int64_t)b.size, __ATOMIC_SEQ_CST);
    }
    DT_TRY(dt_trainer_finish(t)); // fails when the replicas' parameters differ
    if (dt_trainer_is_main(t)) {
        dt_params *p         = dt_model_as_params(m);
        shared_result->n     = (int)dt_params_numel(p);
        shared_result->steps = dt_trainer_step_count(t);
        memcpy(shared_result->p, dt_params_data(p), sizeof(float) * dt_params_numel(p));
    }
    return DT_OK;
}

static int run_trainer(const char *flags, result *out) {
    char buf[512], *argv[40];
    int  argc    = 0;
    argv[argc++] = "test_join";
    snprintf(buf, sizeof buf, "--seed 3 --no-test --threads 1 --invariant 0 --backend %s %s",
             mp_backend(), flags);
    for (char *s = strtok(buf, " "); s && argc < 39; s = strtok(NULL, " "))
        argv[argc++] = s;
    argv[argc]         = NULL;
    const char *vars[] = {"MASTER_PORT", "MASTER_ADDR", "GROUP_RANK",       "WORLD_SIZE",
                          "RANK",        "LOCAL_RANK",  "LOCAL_WORLD_SIZE", "DT_JOB_TOKEN"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++)
        unsetenv(vars[i]);
    memset(shared_result, 0, sizeof *shared_result);
    dt_trainer     *t;
    dt_trainer_opts o = dt_trainer_opts_default();
    o.program         = "test_join";
    if (dt_trainer_new(&t, argc, argv, &o) || !t)
        return -1;
    int rc = dt_trainer_exit(t, dt_trainer_start(t) ? train_fn(t, NULL) : DT_OK);
    *out   = *shared_result;
    return rc;
}

static float max_diff(const result *a, const result *b) {
    float d = a->n == b->n && a->n > 0 ? 0 : INFINITY;
    for (int i = 0; i < a->n && a->n == b->n; i++)
        d = fmaxf(d, fabsf(a->p[i] - b->p[i]));
    return d;
}

static result r_ref, r_p;

static void test_same_as_serial(void) {
    // 101 samples. 4 ranks, batch 5: rank 0 has 26 samples (6 batches, the last of 1),
    // ranks 1-3 have 25 (5 batches): they shadow rank 0's sixth step. 3 ranks, batch 7:
    // 34, 34, 33 samples, last batches of 6, 6, 5. Against one process, batch 20 and 21.
    struct {
        int         P, b;
        const char *acc;
        int64_t     steps;
    } c[] = {
        {4, 5, "", 12}, {3, 7, "", 10}, {4, 5, "--accumulate 2", 6}, {4, 5, "--accumulate 4", 4}};
    for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
        char flags[160];
        t_batch = c[i].P * c[i].b;
        snprintf(flags, sizeof flags, "--epochs 2 %s", c[i].acc);
        CHECK_EQ(run_trainer(flags, &r_ref), 0);
        CHECK_EQ(r_ref.steps, c[i].steps);
        CHECK_EQ(r_ref.samples, 2 * NS);
        t_batch = c[i].b;
        snprintf(flags, sizeof flags, "--epochs 2 %s --num-processes %d", c[i].acc, c[i].P);
        double t0 = dt_now();
        CHECK_EQ(run_trainer(flags, &r_p), 0);
        CHECK(dt_now() - t0 < 60); // nothing hangs
        CHECK_EQ(r_p.steps, r_ref.steps);
        CHECK_EQ(r_p.samples, 2 * NS); // every sample once per epoch, no padding
        float d = max_diff(&r_p, &r_ref);
        CHECK(d < 1e-5f);
        printf("     %d processes, batch %d %s: %lld steps, max |diff| to one process %.2g\n",
               c[i].P, c[i].b, c[i].acc, (long long)r_p.steps, (double)d);
    }
}

static void test_very_uneven(void) {
    // Rank r holds 10 + 30 r samples: shares of 3, 10, 17 and 25 samples, 1 to 7 batches
    // of 4. Every rank runs 7 steps per epoch; the replicas stay identical.
    t_per_rank = true;
    t_batch    = 4;
    double t0  = dt_now();
    CHECK_EQ(run_trainer("--epochs 2 --num-processes 4", &r_p), 0);
    CHECK(dt_now() - t0 < 60);
    CHECK_EQ(r_p.steps, 14);
    CHECK_EQ(r_p.samples, 2 * (3 + 10 + 17 + 25));
    CHECK_EQ(r_p.batches, 2 * (1 + 3 + 5 + 7));
    // With accumulation and a checkpoint every step (collective: shadowed too).
    char flags[200];
    snprintf(flags, sizeof flags,
             "--epochs 2 --num-processes 4 --accumulate 3 --checkpoint-dir /tmp/dt-join-%d "
             "--checkpoint-every 1",
             (int)getpid());
    CHECK_EQ(run_trainer(flags, &r_p), 0);
    CHECK_EQ(r_p.steps, 6);
    // Stopped at step 9 (in the second epoch, rank 0 already out of data) and resumed:
    // bitwise the uninterrupted run.
    result whole;
    snprintf(flags, sizeof flags,
             "--epochs 2 --num-processes 4 --checkpoint-dir /tmp/dt-join-%d/a --checkpoint-every 1",
             (int)getpid());
    CHECK_EQ(run_trainer(flags, &whole), 0);
    CHECK_EQ(whole.steps, 14);
    snprintf(flags, sizeof flags,
             "--epochs 2 --num-processes 4 --checkpoint-dir /tmp/dt-join-%d/b --checkpoint-every 1 "
             "--max-steps 9",
             (int)getpid());
    CHECK_EQ(run_trainer(flags, &r_p), 0);
    CHECK_EQ(r_p.steps, 9);
    snprintf(flags, sizeof flags,
             "--epochs 2 --num-processes 4 --checkpoint-dir /tmp/dt-join-%d/b --checkpoint-every 1 "
             "--resume",
             (int)getpid());
    CHECK_EQ(run_trainer(flags, &r_p), 0);
    CHECK_EQ(r_p.steps, 14);
    CHECK_EQ(r_p.batches, 2 + 4 + 7 - 3 - 1); // the batches left after step 9 (epoch 2)
    CHECK(whole.n > 0 && memcmp(whole.p, r_p.p, sizeof(float) * (size_t)whole.n) == 0);
    char cmd[96];
    snprintf(cmd, sizeof cmd, "rm -rf /tmp/dt-join-%d", (int)getpid());
    CHECK_EQ(system(cmd), 0);
    t_per_rank = false;
}

int main(void) {
    shared_result =
        mmap(NULL, sizeof(result), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    static uint8_t img[NS * H * W], lab[NS];
    dt_rng         r = dt_rng_init(11);
    for (int i = 0; i < NS; i++) {
        lab[i] = (uint8_t)dt_rng_below(&r, 10);
        for (int k = 0; k < H * W; k++)
            img[i * H * W + k] = (uint8_t)((k % 10 == lab[i] ? 160 : 20) + dt_rng_below(&r, 90));
    }
    if (shared_result == MAP_FAILED || dt_dataset_init(&full_set, img, lab, NS, H, W, NULL))
        return 1;
    for (int k = 0; k < NR; k++)
        if (dt_dataset_init(&rank_set[k], img, lab, (size_t)(10 + 30 * k), H, W, NULL))
            return 1;
    RUN(test_same_as_serial);
    RUN(test_very_uneven);
    dt_dataset_free(&full_set);
    for (int k = 0; k < NR; k++)
        dt_dataset_free(&rank_set[k]);
    return check_summary();
}
