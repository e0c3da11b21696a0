// test_ddp (GPU): data parallelism with two processes sharing one GPU (NCCL refuses two
// ranks on one GPU, so they reduce through host memory over shm, as the trainer does
// then): each rank trains the seed's ConvNet on its half of every batch (sample keys are
// the samples' dataset indices, so the dropout masks are the whole batch's), the
// gradients go to the host, are averaged over the two ranks and come back before
// Adadelta's step. After three steps both ranks hold the same parameters (bitwise); the
// first step's averaged gradient equals that of one process on the whole batch on the
// same GPU up to the order of additions: compared as vectors, |a - b| / |b| <= 2 L 2^-24
// with L = 32 x 676 (conv1's weight gradient, the longest sum), 2.6e-3, where a wrong
// mean (a factor of 2, a lost half) is of order 1.
#include "../lib/mp.h"
#include "gpu_check.h"

#include <stdlib.h>

enum { B = 32, STEPS = 3, PIX = 28 * 28, CLASSES = 10 };

static dt_model *convnet(void) {
    dt_model *m;
    if (dt_model_new(&m, 1, 28, 28) || dt_model_add_conv2d(m, 8, 3, 1, 0) || dt_model_add_relu(m) ||
        dt_model_add_conv2d(m, 16, 3, 1, 0) || dt_model_add_relu(m) ||
        dt_model_add_maxpool2d(m, 2, 0) || dt_model_add_dropout2d(m, 0.1f) ||
        dt_model_add_flatten(m) || dt_model_add_linear(m, 32) || dt_model_add_relu(m) ||
        dt_model_add_dropout(m, 0.25f) || dt_model_add_linear(m, CLASSES) ||
        dt_model_add_log_softmax(m) || dt_model_finalize(m, 3))
        return NULL;
    return m;
}

// Samples [lo, lo + n) of step k's batch: images, labels, keys (their dataset indices).
static void slice(int k, int lo, int n, float *x, int32_t *y, uint64_t *keys) {
    float   *ax = malloc(sizeof(float) * B * PIX);
    int32_t *ay = malloc(sizeof(int32_t) * B);
    gpu_fill(ax, (size_t)B * PIX, 500 + (uint64_t)k, -0.5f, 2.5f);
    gpu_fill_int(ay, B, 600 + (uint64_t)k, CLASSES);
    memcpy(x, ax + (size_t)lo * PIX, sizeof(float) * (size_t)n * PIX);
    memcpy(y, ay + lo, sizeof(int32_t) * (size_t)n);
    for (int s = 0; s < n; s++)
        keys[s] = (uint64_t)k * 1000 + (uint64_t)(lo + s);
    free(ax), free(ay);
}

// STEPS steps of a model on samples [lo, lo + n) of each batch, averaging gradients over
// pg (NULL: alone); the first step's (averaged) gradient into grad0, the final
// parameters into out.
static void train(dt_device *d, dt_pg *pg, int lo, int n, float *grad0, float *out) {
    dt_model *m = convnet();
    if (!CHECK(m != NULL))
        return;
    dt_exec         *e;
    dt_optim        *o;
    dt_adadelta_opts ao = dt_adadelta_opts_default();
    CHECK_OK(dt_exec_new(&e, dt_model_graph(m), d, NULL));
    CHECK_OK(dt_adadelta_new(&o, dt_model_as_params(m), &ao));
    float       *x = malloc(sizeof(float) * B * PIX);
    int32_t      y[B];
    uint64_t     keys[B];
    dt_rng       rng = dt_rng_init(8);
    dt_loss_spec ls  = dt_loss_spec_default(DT_LOSS_NLL);
    size_t       np  = dt_model_num_params(m);
    for (int k = 0; k < STEPS; k++) {
        float loss;
        slice(k, lo, n, x, y, keys);
        dt_exec_set_rng(e, &rng);
        CHECK_OK(dt_exec_set_sample_keys(e, keys, n));
        CHECK_OK(dt_exec_zero_grad(e));
        CHECK_OK(dt_exec_train_step(e, (const void *[]){x}, y, n, &ls, &loss));
        if (pg) { // the mean of the ranks' mean gradients: the whole batch's mean
            CHECK_OK(dt_exec_pull(e, DT_EXEC_GRADS, NULL));
            CHECK_OK(dt_pg_all_reduce(pg, dt_model_grads(m), dt_model_grads(m), np, DT_FLOAT32,
                                      DT_REDUCE_AVG));
            CHECK_OK(dt_exec_push(e, DT_EXEC_GRADS, NULL));
        }
        if (k == 0) {
            CHECK_OK(dt_exec_pull(e, DT_EXEC_GRADS, NULL));
            memcpy(grad0, dt_model_grads(m), sizeof(float) * np);
        }
        CHECK_OK(dt_exec_optim_step(e, o));
    }
    CHECK_OK(dt_exec_pull(e, DT_EXEC_PARAMS, o));
    memcpy(out, dt_model_params(m), sizeof(float) * np);
    free(x);
    dt_exec_free(e);
    dt_optim_free(o);
    dt_model_free(m);
}

static void ranks(int rank, int world, void *arg) {
    (void)arg;
    setenv("DT_TEST_BACKEND", "shm", 1);
    dt_pg *pg = mp_pg_init(0);
    if (!CHECK(pg != NULL))
        return;
    dt_device *d;
    CHECK_OK(dt_device_get(&d, "cuda:0")); // both ranks on one GPU
    dt_model *shape = convnet();
    size_t    np    = dt_model_num_params(shape);
    dt_model_free(shape);
    float *mine = malloc(sizeof(float) * np), *all = malloc(sizeof(float) * np * 2);
    float *g2 = malloc(sizeof(float) * np), *g1 = malloc(sizeof(float) * np);
    train(d, pg, rank * (B / world), B / world, g2, mine);
    CHECK_OK(dt_pg_all_gather(pg, mine, all, np, DT_FLOAT32));
    GPU_SAME("parameters on the two ranks", all, all + np, np);
    if (rank == 0) { // one process, the whole batch, the same GPU
        train(d, NULL, 0, B, g1, all);
        double diff = 0, norm = 0;
        for (size_t i = 0; i < np; i++) {
            diff += ((double)g2[i] - g1[i]) * ((double)g2[i] - g1[i]);
            norm += (double)g1[i] * g1[i];
        }
        double rel = sqrt(diff / norm), bound = 2.0 * B * 676 * 0x1p-24;
        printf("# 2 ranks x %d against 1 x %d: gradients differ by %.3g of their norm (bound "
               "%.3g)\n",
               B / 2, B, rel, bound);
        CHECK(rel <= bound);
    }
    free(mine), free(all), free(g1), free(g2);
    dt_pg_free(pg);
}

int main(void) {
    if (gpu_count_forked() < 1)
        return check_summary();
    mp_opts o = {.world = 2, .timeout_ms = 120000};
    MP_RUN(&o, ranks, NULL);
    return check_summary();
}
