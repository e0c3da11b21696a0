// test_grad_shards.c: gradient shards (dt_model_set_grad_shards) make weight gradients
// bitwise independent of how a batch is split: over threads, and over "ranks" emulated
// in one process (rank r of N takes positions r, r + N, ... with S = V / N shards, its
// loss a mean over its own samples, and the ranks' gradients combined by the tree that
// ddp.c continues across ranks). Both kernel families are run: dtrain's shifted GEMMs
// (DT_CONV=direct) and OpenBLAS (DT_CONV=gemm).
#include "../check.h"
#include "core/tree.h"
#include "dtrain/nn.h"

#include <stdlib.h>

#define B       32 // the global batch
#define CLASSES 10

static dt_model *convnet(int threads, int shards) {
    dt_model *m = NULL;
    CHECK_OK(dt_model_new(&m, 1, 12, 12));
    CHECK_OK(dt_model_add_conv2d(m, 4, 3, 1, 0));
    CHECK_OK(dt_model_add_relu(m));
    CHECK_OK(dt_model_add_conv2d(m, 8, 3, 1, 1));
    CHECK_OK(dt_model_add_relu(m));
    CHECK_OK(dt_model_add_maxpool2d(m, 2, 0));
    CHECK_OK(dt_model_add_dropout2d(m, 0.25f));
    CHECK_OK(dt_model_add_flatten(m));
    CHECK_OK(dt_model_add_linear(m, 24));
    CHECK_OK(dt_model_add_relu(m));
    CHECK_OK(dt_model_add_dropout(m, 0.25f));
    CHECK_OK(dt_model_add_linear(m, CLASSES));
    CHECK_OK(dt_model_add_log_softmax(m));
    CHECK_OK(dt_model_finalize(m, 3));
    CHECK_OK(dt_model_set_threads(m, threads));
    CHECK_OK(dt_model_set_grad_shards(m, shards));
    return m;
}

typedef struct data {
    float    x[B * 144];
    int32_t  y[B];
    uint64_t key[B];
} data;

static void make_data(data *d) {
    dt_rng r = dt_rng_init(11);
    for (int i = 0; i < B * 144; i++)
        d->x[i] = dt_rng_normal(&r);
    for (int i = 0; i < B; i++) {
        d->y[i]   = (int32_t)dt_rng_below(&r, CLASSES);
        d->key[i] = 5000 + (uint64_t)i * 7;
    }
}

// One training step of m on the positions first, first + stride, ... of the global
// batch (n of them): forward, NLL summed over those n and divided by `over` (the mean
// over a batch of `over` samples), backward into a zeroed gradient.
static void step_over(dt_model *m, const data *d, int first, int stride, int n, int over) {
    float    x[B * 144], dlogp[B * CLASSES], loss;
    int32_t  y[B];
    uint64_t key[B];
    for (int j = 0; j < n; j++) {
        int p = first + stride * j;
        memcpy(x + j * 144, d->x + p * 144, sizeof(float) * 144);
        y[j]   = d->y[p];
        key[j] = d->key[p];
    }
    dt_rng epoch = dt_rng_init(21);
    dt_model_set_rng(m, &epoch);
    CHECK_OK(dt_model_set_sample_keys(m, key, n));
    CHECK_OK(dt_model_forward(m, x, n));
    CHECK_OK(dt_loss_nll_over(dt_model_output(m), y, n, CLASSES, over, &loss, dlogp));
    dt_model_zero_grad(m);
    CHECK_OK(dt_model_backward(m, dlogp));
}

// The same with the mean over its own n samples (dt_loss_nll).
static void step(dt_model *m, const data *d, int first, int stride, int n) {
    step_over(m, d, first, stride, n, n);
}

static bool same_bits(const float *a, const float *b, size_t n, const char *what) {
    for (size_t i = 0; i < n; i++)
        if (memcmp(&a[i], &b[i], sizeof(float)) != 0) {
            fprintf(stderr, "     %s: element %zu differs: %.9g vs %.9g\n", what, i, a[i], b[i]);
            return false;
        }
    return true;
}

static double rel_l2(const float *a, const float *b, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)a[i] - b[i];
        num += d * d;
        den += (double)b[i] * b[i];
    }
    return sqrt(num / den);
}

// Any thread count, and repeated runs, give the same bits for a given shard count;
// the sums are the gradient (close to the unsharded one).
static void test_threads(const data *d, const char *conv) {
    check_current   = conv;
    dt_model *plain = convnet(1, 0);
    step(plain, d, 0, 1, B);
    size_t n = dt_model_num_params(plain);
    for (int s = 1; s <= 8; s *= 2) {
        dt_model *ref = convnet(1, s);
        step(ref, d, 0, 1, B);
        double e = rel_l2(dt_model_grads(ref), dt_model_grads(plain), n);
        if (!CHECK(e < 1e-5))
            fprintf(stderr, "     %d shards: gradient off the unsharded one by %.3g\n", s, e);
        for (int t = 2; t <= 5; t++) {
            dt_model *m = convnet(t, s);
            for (int rep = 0; rep < 2; rep++) { // a race would show as a difference
                step(m, d, 0, 1, B);
                CHECK(same_bits(dt_model_output(m), dt_model_output(ref), B * CLASSES, "output"));
                if (!CHECK(same_bits(dt_model_grads(m), dt_model_grads(ref), n, "gradient")))
                    fprintf(stderr, "     %d shards, %d threads vs 1\n", s, t);
            }
            dt_model_free(m);
        }
        dt_model_free(ref);
    }
    // A partial batch (fewer samples than shards in some shards) too.
    dt_model *a = convnet(1, 8), *b = convnet(3, 8);
    step(a, d, 0, 1, 13);
    step(b, d, 0, 1, 13);
    CHECK(same_bits(dt_model_grads(a), dt_model_grads(b), n, "13 samples"));
    step(a, d, 0, 1, 5);
    step(b, d, 0, 1, 5);
    CHECK(same_bits(dt_model_grads(a), dt_model_grads(b), n, "5 samples"));
    dt_model_free(a);
    dt_model_free(b);
    dt_model_free(plain);
}

// One process with V shards against N emulated ranks with V / N shards each: rank r
// holds positions r + N j (DistributedSampler's split of the global batch) and takes
// the mean over its B / N samples; the ranks' gradients combined by the tree over r
// (core/tree.h) and divided by N are the one-process gradient, bit for bit. V need not
// be a power of two (6: 3 shards on each of 2 ranks).
static void test_ranks(const data *d, const char *conv) {
    check_current               = conv;
    static const int cases[][2] = {{4, 2}, {4, 4}, {6, 2}}; // V, N (B / N a power of two)
    size_t           n          = 0;
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        int       V = cases[c][0], N = cases[c][1];
        dt_model *one = convnet(2, V);
        step(one, d, 0, 1, B);
        n = dt_model_num_params(one);
        float *g[8];
        for (int r = 0; r < N; r++) {
            dt_model *m = convnet(1 + r % 2, V / N);
            step(m, d, r, N, B / N);
            g[r] = malloc(sizeof(float) * n);
            memcpy(g[r], dt_model_grads(m), sizeof(float) * n);
            dt_model_free(m);
        }
        for (int h = dt_tree_top(N); h >= 1; h /= 2)
            for (int k = 0; k < h && k + h < N; k++)
                for (size_t i = 0; i < n; i++)
                    g[k][i] += g[k + h][i];
        for (size_t i = 0; i < n; i++)
            g[0][i] /= (float)N;
        if (!CHECK(same_bits(g[0], dt_model_grads(one), n, "ranks vs one process")))
            fprintf(stderr, "     V %d, %d ranks\n", V, N);
        for (int r = 0; r < N; r++)
            free(g[r]);
        dt_model_free(one);
    }
    // Without shards the same emulation differs in the last bits (what the shards fix).
    dt_model *plain = convnet(2, 0), *half = convnet(1, 0);
    step(plain, d, 0, 1, B);
    float *g0 = malloc(sizeof(float) * n);
    step(half, d, 0, 2, B / 2);
    memcpy(g0, dt_model_grads(half), sizeof(float) * n);
    step(half, d, 1, 2, B / 2);
    for (size_t i = 0; i < n; i++)
        g0[i] = (g0[i] + dt_model_grads(half)[i]) / 2;
    size_t differ = 0;
    for (size_t i = 0; i < n; i++)
        differ += g0[i] != dt_model_grads(plain)[i];
    CHECK(differ > 0);
    free(g0);
    dt_model_free(plain);
    dt_model_free(half);
}

// The ranks of each world that V's tree splits into (core/tree.h), every rank's loss
// divided by the global batch G and the ranks' gradients summed by the tree over r, not
// averaged (what DDP does under --invariant: dt_trainer_loss_over, dt_ddp_set_sum): the
// one-process gradient, bit for bit, for worlds that are not a power of two too (3 of 3,
// 6 of 6). The local mean averaged over 3 ranks differs in the last bits: 1/8 then /3
// rounds unlike 1/24.
static void test_ranks_global(const data *d, const char *conv) {
    check_current = conv;
    enum { G = 24 }; // divided by 1, 2, 3, 4, 6
    static const int cases[][2] = {{3, 3}, {6, 2}, {6, 6}, {4, 2}, {4, 4}}; // V, N
    size_t           n          = 0;
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        int V = cases[c][0], N = cases[c][1];
        CHECK(dt_tree_splits(V, N));
        dt_model *one = convnet(2, V);
        step(one, d, 0, 1, G);
        n = dt_model_num_params(one);
        float *g[8], *avg[8];
        for (int r = 0; r < N; r++) {
            dt_model *m = convnet(1 + r % 2, V / N);
            step_over(m, d, r, N, G / N, G);
            g[r] = malloc(sizeof(float) * n);
            memcpy(g[r], dt_model_grads(m), sizeof(float) * n);
            step(m, d, r, N, G / N);
            avg[r] = malloc(sizeof(float) * n);
            memcpy(avg[r], dt_model_grads(m), sizeof(float) * n);
            dt_model_free(m);
        }
        for (int h = dt_tree_top(N); h >= 1; h /= 2)
            for (int k = 0; k < h && k + h < N; k++)
                for (size_t i = 0; i < n; i++)
                    g[k][i] += g[k + h][i], avg[k][i] += avg[k + h][i];
        if (!CHECK(same_bits(g[0], dt_model_grads(one), n, "ranks summed vs one process")))
            fprintf(stderr, "     V %d, %d ranks, each over the global batch\n", V, N);
        size_t differ = 0;
        for (size_t i = 0; i < n; i++)
            differ += avg[0][i] / (float)N != dt_model_grads(one)[i];
        if (N == 3 && !CHECK(differ > 0)) // the average: exact only for a power of two
            fprintf(stderr, "     V %d, %d ranks: the local means' average matched\n", V, N);
        if ((N & (N - 1)) == 0 && !CHECK(differ == 0))
            fprintf(stderr, "     V %d, %d ranks: the local means' average: %zu differ\n", V, N,
                    differ);
        for (int r = 0; r < N; r++)
            free(g[r]), free(avg[r]);
        dt_model_free(one);
    }
}

static void test_errors(void) {
    check_current = "errors";
    dt_model *m   = convnet(1, 0);
    CHECK_ERR(dt_model_set_grad_shards(m, 65), DT_ERR_ARG, "1 to 64, found 65");
    CHECK_ERR(dt_model_set_grad_shards(m, 128), DT_ERR_ARG, "found 128");
    CHECK_ERR(dt_model_set_grad_shards(m, -1), DT_ERR_ARG, "found -1");
    CHECK_EQ(dt_model_grad_shards(m), 0);
    CHECK_OK(dt_model_set_grad_shards(m, 16));
    CHECK_EQ(dt_model_grad_shards(m), 16);
    CHECK_OK(dt_model_set_grad_shards(m, 3)); // any count: the tree of core/tree.h
    CHECK_EQ(dt_model_grad_shards(m), 3);
    float   logp[2 * CLASSES] = {0}, dlogp[2 * CLASSES], loss;
    int32_t y[2]              = {1, 2};
    CHECK_ERR(dt_loss_nll_over(logp, y, 2, CLASSES, 1, &loss, dlogp), DT_ERR_ARG,
              "at least the batch (2), found 1");
    CHECK_OK(dt_loss_nll_over(logp, y, 2, CLASSES, 6, &loss, dlogp)); // 1/6: not a power of 2
    CHECK(dlogp[1] == -1.0f / 6.0f && dlogp[CLASSES + 2] == -1.0f / 6.0f && dlogp[0] == 0.0f);
    dt_model_free(m);
}

int main(void) {
    static data d;
    make_data(&d);
    setenv("DT_CONV", "direct", 1);
    test_threads(&d, "direct");
    test_ranks(&d, "direct");
    test_ranks_global(&d, "direct");
    setenv("DT_CONV", "gemm", 1);
    test_threads(&d, "gemm");
    test_ranks(&d, "gemm");
    test_ranks_global(&d, "gemm");
    unsetenv("DT_CONV");
    test_errors();
    return check_summary();
}
