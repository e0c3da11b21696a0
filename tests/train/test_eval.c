// Exact distributed evaluation (Accelerate's gather_for_metrics): with a test set that
// no world size here divides (101 samples on 1 to 4 processes), the trainer's
// evaluation loader gives every sample to exactly one rank, so the accuracy summed over
// ranks equals one process's exactly, and gathered per-sample predictions come back
// once each and equal to one process's.
#include "../check.h"
#include "../lib/mp.h"
#include "dtrain/train.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

enum { H = 8, W = 8, NS = 101 };

static dt_dataset test_set;

typedef struct result {
    int64_t hits;     // correct predictions, summed over ranks
    int64_t gathered; // (index, prediction) pairs gathered on rank 0
    int     seen[NS]; // how often each index came back
    int     pred[NS]; // its prediction
} result;

static result *shared_result;

static dt_status eval_fn(dt_trainer *t, void *user) {
    (void)user;
    dt_model *m;
    DT_TRY(dt_model_new(&m, 1, H, W));
    dt_status st;
    if ((st = dt_model_add_flatten(m)) || (st = dt_model_add_linear(m, 10)) ||
        (st = dt_model_add_log_softmax(m)) || (st = dt_model_finalize(m, 5))) {
        dt_model_free(m);
        return st;
    }
    dt_sgd_opts so  = dt_sgd_opts_default();
    dt_optim   *opt = NULL;
    DT_TRY(dt_sgd_new(&opt, dt_model_as_params(m), &so));
    DT_TRY(dt_trainer_prepare_model(t, m, opt, NULL));
    DT_TRY(dt_trainer_finish(t)); // no training: the initial model
    dt_model_train(m, false);
    dt_loader *l;
    DT_TRY(dt_trainer_loader(t, &test_set, 7, DT_SPLIT_EVAL, &l));
    dt_loader_begin_epoch(l, 0);
    int32_t  pairs[2 * NS];
    size_t   n    = 0;
    int64_t  hits = 0;
    dt_batch b;
    while (dt_loader_next(l, &b)) {
        DT_TRY(dt_model_forward(m, b.x, (int)b.size));
        hits += dt_count_correct(dt_model_output(m), b.y, (int)b.size, 10);
        for (size_t s = 0; s < b.size && n < NS; s++, n++) {
            const float *o = dt_model_output(m) + s * 10;
            int          k = 0;
            for (int c = 1; c < 10; c++)
                k = o[c] > o[k] ? c : k;
            pairs[2 * n] = (int32_t)b.indices[s], pairs[2 * n + 1] = k;
        }
    }
    DT_TRY(dt_loader_status(l));
    DT_TRY(dt_trainer_all_reduce(t, &hits, 1, DT_INT64, DT_REDUCE_SUM));
    void  *all;
    size_t total;
    DT_TRY(dt_trainer_gather_for_metrics(t, pairs, 2 * n, DT_INT32, &all, &total));
    if (dt_trainer_is_main(t)) {
        result *r   = shared_result;
        r->hits     = hits;
        r->gathered = (int64_t)total / 2;
        for (size_t i = 0; i + 1 < total; i += 2) {
            int32_t idx = ((int32_t *)all)[i];
            if (idx >= 0 && idx < NS)
                r->seen[idx]++, r->pred[idx] = ((int32_t *)all)[i + 1];
        }
    }
    dt_free(all);
    return DT_OK;
}

static int run(int P, result *out) {
    char flags[160], *argv[20];
    int  argc    = 0;
    argv[argc++] = "test_eval";
    snprintf(flags, sizeof flags, "--threads 1 --backend %s --num-processes %d", mp_backend(), P);
    for (char *s = strtok(flags, " "); s && argc < 19; s = strtok(NULL, " "))
        argv[argc++] = s;
    argv[argc]         = NULL;
    const char *vars[] = {"MASTER_PORT", "MASTER_ADDR", "GROUP_RANK",       "WORLD_SIZE",
                          "RANK",        "LOCAL_RANK",  "LOCAL_WORLD_SIZE", "DT_JOB_TOKEN"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++)
        unsetenv(vars[i]);
    memset(shared_result, 0, sizeof *shared_result);
    dt_trainer     *t;
    dt_trainer_opts o = dt_trainer_opts_default();
    o.program         = "test_eval";
    if (dt_trainer_new(&t, argc, argv, &o) || !t)
        return -1;
    int rc = dt_trainer_exit(t, dt_trainer_start(t) ? eval_fn(t, NULL) : DT_OK);
    *out   = *shared_result;
    return rc;
}

static result one, many;

static void test_exact(void) {
    CHECK_EQ(run(1, &one), 0);
    CHECK_EQ(one.gathered, NS);
    CHECK(one.hits > 0 && one.hits < NS); // a real count: neither none nor all
    for (int P = 2; P <= 4; P++) {
        CHECK_EQ(run(P, &many), 0);
        CHECK_EQ(many.hits, one.hits); // the accuracy, exactly
        CHECK_EQ(many.gathered, NS);
        int once = 0, same = 0;
        for (int i = 0; i < NS; i++)
            once += many.seen[i] == 1, same += many.pred[i] == one.pred[i];
        CHECK_EQ(once, NS);
        CHECK_EQ(same, NS);
        printf("     %d processes: %lld/%d correct (one process: %lld), every sample once\n", P,
               (long long)many.hits, NS, (long long)one.hits);
    }
}

int main(void) {
    shared_result =
        mmap(NULL, sizeof(result), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    static uint8_t img[NS * H * W], lab[NS];
    dt_rng         r = dt_rng_init(13);
    for (int i = 0; i < NS; i++) {
        lab[i] = (uint8_t)dt_rng_below(&r, 10);
        for (int k = 0; k < H * W; k++)
            img[i * H * W + k] = (uint8_t)((k % 10 == lab[i] ? 160 : 20) + dt_rng_below(&r, 90));
    }
    if (shared_result == MAP_FAILED || dt_dataset_init(&test_set, img, lab, NS, H, W, NULL))
        return 1;
    RUN(test_exact);
    dt_dataset_free(&test_set);
    return check_summary();
}
