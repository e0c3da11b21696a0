// test_train.c: training the seed's ConvNet on real Fashion-MNIST files.
//
// - Learning: one epoch on the first 3000 training images (batch 64, Adadelta lr 0.5)
//   must reach at least 60% test accuracy on the 10,000 test images (the first 1,000
//   under the sanitizers: 72% gives about 1.4 points of sampling noise). Chance is 10%;
//   runs with seeds 0-5 here reach 65-77%, and a wrong sign or a missing term in any
//   gradient leaves the network near chance, so 60% separates the two with margin.
// - Determinism: two runs with the same seed give bitwise-identical weights; another
//   seed gives other weights; 1 and 2 threads agree up to float rounding.
#include "../check.h"
#include "../lib/mnist.h"
#include "dtrain/data.h"
#include "dtrain/nn.h"
#include "dtrain/optim.h"

#include <stdlib.h>

static dt_dataset train_set, test_set;

// One epoch over the first `limit` training samples; returns the model (caller frees).
static dt_model *train(size_t limit, size_t batch, uint64_t seed, int threads, float drop) {
    dt_model *m = NULL;
    CHECK_OK(mnist_convnet_new(&m, seed, drop, drop));
    if (!m)
        return NULL;
    CHECK_OK(dt_model_set_threads(m, threads));
    dt_adadelta_opts ao = dt_adadelta_opts_default();
    ao.lr               = 0.5f;
    dt_optim *opt       = NULL;
    CHECK_OK(dt_adadelta_new(&opt, dt_model_as_params(m), &ao));
    dt_dataset sub     = train_set; // a view of the first `limit` samples
    sub.n              = limit;
    dt_sampler_opts so = dt_sampler_opts_default();
    so.seed            = seed;
    dt_sampler *s      = NULL;
    dt_sampler_new(&s, sub.n, &so);
    dt_loader_opts lo = dt_loader_opts_default();
    lo.batch_size     = batch;
    dt_loader *l      = NULL;
    dt_loader_new(&l, &sub, s, &lo);
    float *dlogp = malloc(sizeof(float) * 10 * batch);
    dt_rng root  = dt_rng_init(seed);
    dt_loader_begin_epoch(l, 0);
    dt_batch b;
    while (dt_loader_next(l, &b)) {
        dt_rng r = dt_rng_split(&root, b.index);
        float  loss;
        dt_model_set_rng(m, &r);
        CHECK_OK(dt_model_forward(m, b.x, (int)b.size));
        CHECK_OK(dt_loss_nll(dt_model_output(m), b.y, (int)b.size, 10, &loss, dlogp));
        dt_model_zero_grad(m);
        CHECK_OK(dt_model_backward(m, dlogp));
        dt_optim_step(opt);
    }
    CHECK_OK(dt_loader_status(l));
    free(dlogp);
    dt_loader_free(l);
    dt_sampler_free(s);
    dt_optim_free(opt);
    return m;
}

static double accuracy(dt_model *m) {
    dt_loader_opts lo = dt_loader_opts_default();
    lo.batch_size     = 500;
    dt_loader *l      = NULL;
    dt_loader_new(&l, &test_set, NULL, &lo);
    dt_model_train(m, false);
    dt_loader_begin_epoch(l, DT_EPOCH_AUTO);
    dt_batch b;
    int      correct = 0;
    while (dt_loader_next(l, &b)) {
        CHECK_OK(dt_model_forward(m, b.x, (int)b.size));
        correct += dt_count_correct(dt_model_output(m), b.y, (int)b.size, 10);
    }
    dt_loader_free(l);
    return (double)correct / (double)test_set.n;
}

static void test_learning(void) {
    dt_model *m = train(3000, 64, 0, 2, 0.0f);
    if (!m)
        return;
    double acc = accuracy(m);
    fprintf(stderr, "     test accuracy after 3000 samples: %.2f%%\n", 100 * acc);
    CHECK(acc >= 0.60);
    dt_model_free(m);
}

static void test_determinism(void) {
    dt_model *a = train(640, 64, 7, 2, 0.25f), *b = train(640, 64, 7, 2, 0.25f);
    dt_model *c = train(640, 64, 8, 2, 0.25f), *d = train(640, 64, 7, 1, 0.25f);
    if (!a || !b || !c || !d)
        return;
    size_t n = dt_model_num_params(a);
    CHECK(memcmp(dt_model_params(a), dt_model_params(b), n * sizeof(float)) == 0);
    CHECK(memcmp(dt_model_params(a), dt_model_params(c), n * sizeof(float)) != 0);
    // 1 thread against 2: the same computation up to the order of float sums, after
    // 10 steps (Adadelta's steps are ~lr in size whatever the gradient's scale, so
    // rounding differences do not grow much in so few steps).
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double e = (double)dt_model_params(a)[i] - dt_model_params(d)[i];
        num += e * e;
        den += (double)dt_model_params(a)[i] * dt_model_params(a)[i];
    }
    if (!CHECK(sqrt(num / den) < 1e-3))
        fprintf(stderr, "     1 vs 2 threads: relative difference %.3g\n", sqrt(num / den));
    dt_model_free(a), dt_model_free(b), dt_model_free(c), dt_model_free(d);
}

int main(void) {
#ifdef DT_SANITIZE // evaluations on 1,000 test images: no check here depends on the split's size
    CHECK(tl_fmnist_short_test(1000));
#endif
    dt_dataset_opts o = fmnist_opts(); // the seed's normalisation
    if (dt_dataset_load_mnist(&train_set, tl_fmnist_dir(), true, &o) ||
        dt_dataset_load_mnist(&test_set, tl_fmnist_dir(), false, &o)) {
        fprintf(stderr, "Fashion-MNIST is needed (Debian package dataset-fashion-mnist): %s\n",
                dt_last_error());
        CHECK(false);
        return check_summary();
    }
    RUN(test_learning);
    RUN(test_determinism);
    dt_dataset_free(&train_set);
    dt_dataset_free(&test_set);
    return check_summary();
}
