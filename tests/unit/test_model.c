// test_model.c: the Sequential model beyond single-layer gradients: initialisation
// statistics, determinism, thread-count independence, dropout masks (keyed by position
// or by sample key), the gradient hook, accumulation, steady-state allocation and
// error messages.
#include "../check.h"
#include "dtrain/nn.h"

#include <stdlib.h>

static dt_model *convnet(int threads, uint64_t seed, float p2d, float p) {
    dt_model *m = NULL;
    dt_model_new(&m, 1, 12, 12);
    CHECK_OK(dt_model_add_conv2d(m, 4, 3, 1, 0));
    CHECK_OK(dt_model_add_relu(m));
    CHECK_OK(dt_model_add_conv2d(m, 8, 3, 1, 1));
    CHECK_OK(dt_model_add_relu(m));
    CHECK_OK(dt_model_add_maxpool2d(m, 2, 0));
    CHECK_OK(dt_model_add_dropout2d(m, p2d));
    CHECK_OK(dt_model_add_flatten(m));
    CHECK_OK(dt_model_add_linear(m, 16));
    CHECK_OK(dt_model_add_relu(m));
    CHECK_OK(dt_model_add_dropout(m, p));
    CHECK_OK(dt_model_add_linear(m, 10));
    CHECK_OK(dt_model_add_log_softmax(m));
    CHECK_OK(dt_model_finalize(m, seed));
    CHECK_OK(dt_model_set_threads(m, threads));
    return m;
}

static float *random_input(int batch, uint64_t seed) {
    float *x = malloc(sizeof(float) * 144 * batch);
    dt_rng r = dt_rng_init(seed);
    for (int i = 0; i < 144 * batch; i++)
        x[i] = dt_rng_normal(&r);
    return x;
}

static void test_init(void) {
    // Linear 4608 -> 64: 294,912 weights uniform in +-1/sqrt(4608) (PyTorch's default).
    dt_model *m = NULL;
    dt_model_new(&m, 4608, 1, 1);
    CHECK_OK(dt_model_add_linear(m, 64));
    CHECK_OK(dt_model_finalize(m, 3));
    const dt_param_info *w = dt_model_param_info(m, 0), *b = dt_model_param_info(m, 1);
    CHECK(strcmp(w->name, "0.weight") == 0 && strcmp(b->name, "0.bias") == 0);
    CHECK_EQ(w->count, 4608 * 64);
    CHECK(w->ndim == 2 && w->shape[0] == 64 && w->shape[1] == 4608);
    CHECK_EQ(b->offset, w->count);
    double       bound = 1.0 / sqrt(4608.0), s = 0, s2 = 0, mx = 0;
    const float *p = dt_model_params(m);
    for (size_t i = 0; i < w->count; i++) {
        s += p[i];
        s2 += (double)p[i] * p[i];
        mx = fabs(p[i]) > mx ? fabs(p[i]) : mx;
    }
    double n = (double)w->count, var = bound * bound / 3;
    CHECK(mx <= bound);
    CHECK(mx > 0.99 * bound);
    CHECK_NEAR(s / n, 0.0, 5 * sqrt(var / n));
    CHECK_NEAR(s2 / n, var, 0.02 * var);
    int bias_ok = 1;
    for (size_t i = 0; i < b->count; i++)
        bias_ok &= fabs(p[b->offset + i]) <= bound;
    CHECK(bias_ok);
    dt_model_free(m);
}

static void test_determinism(void) {
    dt_model *a = convnet(1, 11, 0.1f, 0.25f), *b = convnet(1, 11, 0.1f, 0.25f),
             *c = convnet(1, 12, 0.1f, 0.25f);
    size_t n    = dt_model_num_params(a);
    CHECK(memcmp(dt_model_params(a), dt_model_params(b), n * sizeof(float)) == 0);
    CHECK(memcmp(dt_model_params(a), dt_model_params(c), n * sizeof(float)) != 0);
    dt_model_free(a);
    dt_model_free(b);
    dt_model_free(c);
}

// Forward/backward with 1..4 threads and batches that do not divide evenly (some
// threads get no sample): outputs, dropout masks and gradients agree with 1 thread.
static void test_threads(void) {
    int    batch = 7;
    float *x     = random_input(batch, 5);
    float  dout[70];
    dt_rng r = dt_rng_init(9);
    for (int i = 0; i < 70; i++)
        dout[i] = dt_rng_uniform_range(&r, -1, 1);
    dt_rng    step = dt_rng_init(77);
    dt_model *ref  = convnet(1, 1, 0.5f, 0.5f);
    dt_model_set_rng(ref, &step);
    CHECK_OK(dt_model_forward(ref, x, batch));
    dt_model_zero_grad(ref);
    CHECK_OK(dt_model_backward(ref, dout));
    size_t n = dt_model_num_params(ref);
    for (int t = 2; t <= 8; t *= 2) {
        dt_model *m = convnet(t, 1, 0.5f, 0.5f);
        dt_model_set_rng(m, &step);
        for (int rep = 0; rep < 3; rep++) { // repeated: a race would show up as a difference
            CHECK_OK(dt_model_forward(m, x, batch));
            const float *o = dt_model_output(m), *o1 = dt_model_output(ref);
            double       maxd      = 0;
            int          same_zero = 1;
            for (int i = 0; i < batch * 10; i++) {
                maxd = fmax(maxd, fabs(o[i] - o1[i]));
                same_zero &= (o[i] == 0) == (o1[i] == 0);
            }
            CHECK(maxd < 1e-5);
            CHECK(same_zero);
            dt_model_zero_grad(m);
            CHECK_OK(dt_model_backward(m, dout));
            double num = 0, den = 0;
            for (size_t i = 0; i < n; i++) {
                double d = dt_model_grads(m)[i] - dt_model_grads(ref)[i];
                num += d * d;
                den += (double)dt_model_grads(ref)[i] * dt_model_grads(ref)[i];
            }
            if (!CHECK(sqrt(num / den) < 1e-6))
                fprintf(stderr, "     %d threads: gradient differs by %.3g\n", t, sqrt(num / den));
        }
        dt_model_free(m);
    }
    dt_model_free(ref);
    free(x);
}

static void test_dropout_masks(void) {
    // Element dropout: the fraction dropped is p; evaluation is the identity.
    dt_model *m = NULL;
    dt_model_new(&m, 1000, 1, 1);
    CHECK_OK(dt_model_add_dropout(m, 0.3f));
    CHECK_OK(dt_model_finalize(m, 1));
    float *x = malloc(sizeof(float) * 1000 * 20);
    for (int i = 0; i < 20000; i++)
        x[i] = 1.0f + (float)(i % 7);
    dt_rng step = dt_rng_init(4);
    dt_model_set_rng(m, &step);
    CHECK_OK(dt_model_forward(m, x, 20));
    const float *y     = dt_model_output(m);
    int          zeros = 0, scaled = 1;
    for (int i = 0; i < 20000; i++) {
        zeros += y[i] == 0.0f;
        scaled &= y[i] == 0.0f || fabsf(y[i] - x[i] / 0.7f) < 1e-5f * x[i];
    }
    // Binomial(20000, 0.3): sd = 65; 5 sd.
    CHECK_NEAR(zeros, 6000, 5 * 65);
    CHECK(scaled);
    // A different step stream gives a different mask; the same one the same.
    dt_rng other = dt_rng_init(5);
    dt_model_set_rng(m, &other);
    CHECK_OK(dt_model_forward(m, x, 20));
    float *y2 = malloc(sizeof(float) * 20000);
    memcpy(y2, dt_model_output(m), sizeof(float) * 20000);
    dt_model_set_rng(m, &step);
    CHECK_OK(dt_model_forward(m, x, 20));
    CHECK(memcmp(y2, dt_model_output(m), sizeof(float) * 20000) != 0);
    dt_model_train(m, false);
    CHECK_OK(dt_model_forward(m, x, 20));
    CHECK(memcmp(x, dt_model_output(m), sizeof(float) * 20000) == 0);
    dt_model_free(m);
    // Channel dropout: every channel is all zero or all kept.
    dt_model_new(&m, 64, 5, 4);
    CHECK_OK(dt_model_add_dropout2d(m, 0.5f));
    CHECK_OK(dt_model_finalize(m, 1));
    dt_model_set_rng(m, &step);
    CHECK_OK(dt_model_forward(m, x, 10));
    y         = dt_model_output(m);
    int whole = 1, dropped = 0;
    for (int c = 0; c < 640; c++) {
        int z = 0;
        for (int i = 0; i < 20; i++)
            z += y[c * 20 + i] == 0.0f;
        whole &= z == 0 || z == 20;
        dropped += z == 20;
    }
    CHECK(whole);
    CHECK_NEAR(dropped, 320, 5 * sqrt(640 * 0.25));
    dt_model_free(m);
    free(x);
    free(y2);
}

// With sample keys, a sample's masks follow its key, not its position or its batch: a
// batch of 6 split into batches of 3 in another order gives each sample the same
// output, dropout and dropout2d on, on 1 and 2 threads.
static void test_sample_keys(void) {
    dt_model *m = NULL;
    dt_model_new(&m, 8, 4, 4);
    CHECK_OK(dt_model_add_dropout2d(m, 0.4f));
    CHECK_OK(dt_model_add_flatten(m));
    CHECK_OK(dt_model_add_dropout(m, 0.3f));
    CHECK_OK(dt_model_finalize(m, 1));
    enum { N = 6, F = 128 };
    float *x = malloc(sizeof(float) * F * N), *ref = malloc(sizeof(float) * F * N);
    for (int i = 0; i < F * N; i++)
        x[i] = 1.0f + (float)(i % 13);
    dt_rng   epoch   = dt_rng_init(9);
    uint64_t keys[N] = {40, 41, 42, 43, 44, 45};
    dt_model_set_rng(m, &epoch);
    CHECK_OK(dt_model_set_sample_keys(m, keys, N));
    CHECK_OK(dt_model_forward(m, x, N));
    memcpy(ref, dt_model_output(m), sizeof(float) * F * N);
    // Positions instead of keys give other masks.
    CHECK_OK(dt_model_set_sample_keys(m, NULL, 0));
    CHECK_OK(dt_model_forward(m, x, N));
    CHECK(memcmp(ref, dt_model_output(m), sizeof(float) * F * N) != 0);
    for (int threads = 1; threads <= 2; threads++) {
        CHECK_OK(dt_model_set_threads(m, threads));
        const int order[2][3] = {{3, 1, 5}, {4, 0, 2}};
        for (int h = 0; h < 2; h++) {
            float   *xs = malloc(sizeof(float) * F * 3);
            uint64_t ks[3];
            for (int i = 0; i < 3; i++) {
                memcpy(xs + i * F, x + order[h][i] * F, sizeof(float) * F);
                ks[i] = keys[order[h][i]];
            }
            CHECK_OK(dt_model_set_sample_keys(m, ks, 3));
            CHECK_OK(dt_model_forward(m, xs, 3));
            for (int i = 0; i < 3; i++)
                CHECK(memcmp(dt_model_output(m) + i * F, ref + order[h][i] * F,
                             sizeof(float) * F) == 0);
            free(xs);
        }
    }
    // Keys for 3 samples and a batch of 6: refused in training, ignored in evaluation.
    CHECK_ERR(dt_model_forward(m, x, N), DT_ERR_ARG, "expected a batch of 3 samples");
    dt_model_train(m, false);
    CHECK_OK(dt_model_forward(m, x, N));
    CHECK(memcmp(x, dt_model_output(m), sizeof(float) * F * N) == 0);
    CHECK_ERR(dt_model_set_sample_keys(m, keys, -1), DT_ERR_ARG, "expected n >= 0");
    CHECK_ERR(dt_model_set_sample_keys(m, NULL, 2), DT_ERR_ARG, "found n = 2 and NULL");
    dt_model_free(m);
    free(x);
    free(ref);
}

typedef struct hook_log {
    size_t       off[16], cnt[16];
    int          n;
    float       *snap;
    const float *grads;
} hook_log;

static dt_status on_ready(void *user, size_t off, size_t cnt) {
    hook_log *h = user;
    if (h->n < 16) {
        h->off[h->n] = off;
        h->cnt[h->n] = cnt;
        h->n++;
    }
    memcpy(h->snap + off, h->grads + off, cnt * sizeof(float));
    return DT_OK;
}

static void test_hook_and_accumulation(void) {
    for (int t = 1; t <= 3; t += 2) {
        dt_model *m = convnet(t, 2, 0.0f, 0.0f);
        float    *x = random_input(6, 8);
        float     dout[60];
        for (int i = 0; i < 60; i++)
            dout[i] = (float)((i * 37) % 11) / 11.0f - 0.5f;
        size_t   n = dt_model_num_params(m);
        hook_log h = {.snap = calloc(n, sizeof(float)), .grads = dt_model_grads(m)};
        dt_model_set_grad_hook(m, on_ready, &h);
        CHECK_OK(dt_model_forward(m, x, 6));
        dt_model_zero_grad(m);
        CHECK_OK(dt_model_backward(m, dout));
        // 4 layers with parameters, last first, covering the buffer exactly once
        CHECK_EQ(h.n, 4);
        size_t end   = n;
        int    order = 1;
        for (int i = 0; i < h.n; i++) {
            order &= h.off[i] + h.cnt[i] == end;
            end = h.off[i];
        }
        CHECK(order && end == 0);
        // what the hook saw is what backward left
        CHECK(memcmp(h.snap, dt_model_grads(m), n * sizeof(float)) == 0);
        // A second backward without zero_grad adds the same gradient again (up to
        // rounding: per-sample contributions now add onto g instead of onto 0).
        float *g1 = malloc(n * sizeof(float));
        memcpy(g1, dt_model_grads(m), n * sizeof(float));
        CHECK_OK(dt_model_backward(m, dout));
        double num = 0, den = 0;
        for (size_t i = 0; i < n; i++) {
            double d = dt_model_grads(m)[i] - 2.0 * g1[i];
            num += d * d;
            den += 4.0 * g1[i] * g1[i];
        }
        CHECK(sqrt(num / den) < 1e-6);
        // steady state: further steps allocate nothing
        size_t allocs = dt_alloc_total_count();
        for (int k = 0; k < 3; k++) {
            CHECK_OK(dt_model_forward(m, x, 6));
            dt_model_zero_grad(m);
            CHECK_OK(dt_model_backward(m, dout));
        }
        CHECK_EQ(dt_alloc_total_count(), allocs);
        free(g1);
        free(h.snap);
        free(x);
        dt_model_free(m);
    }
}

static void test_errors(void) {
    dt_model *m = NULL;
    dt_model_new(&m, 1, 8, 8);
    CHECK_OK(dt_model_add_conv2d(m, 2, 3, 1, 0));
    CHECK_ERR(dt_model_add_linear(m, 4), DT_ERR_ARG,
              "layer 1 linear: expected a flat input (features, 1, 1), found (2, 6, 6)");
    CHECK_ERR(dt_model_add_conv2d(m, 2, 9, 1, 0), DT_ERR_ARG,
              "layer 1 conv2d: node '1' (conv2d): conv2d: kernel (9, 9) does not fit the padded "
              "input (6, 6)");
    CHECK_ERR(dt_model_add_maxpool2d(m, 7, 0), DT_ERR_ARG,
              "layer 1 maxpool2d: node '1' (maxpool2d): pooling: kernel (7, 7) does not fit "
              "the input (6, 6)");
    CHECK_ERR(dt_model_add_dropout(m, 1.0f), DT_ERR_ARG, "expected p in [0, 1), found 1");
    CHECK_ERR(dt_model_add_conv2d(m, 0, 3, 1, 0), DT_ERR_ARG,
              "layer 1 conv2d: expected out_channels, kernel, stride >= 1 and padding >= 0, "
              "found 0, 3, 1, 0");
    CHECK_ERR(dt_model_forward(m, NULL, 1), DT_ERR_STATE, "dt_model_finalize");
    CHECK_OK(dt_model_finalize(m, 0));
    CHECK_ERR(dt_model_add_relu(m), DT_ERR_STATE, "after dt_model_finalize");
    CHECK_ERR(dt_model_set_threads(m, 0), DT_ERR_ARG, "expected 1 to 256 threads, found 0");
    CHECK_ERR(dt_model_backward(m, NULL), DT_ERR_STATE, "backward needs a forward first");
    float x[64] = {0};
    CHECK_ERR(dt_model_forward(m, x, 0), DT_ERR_ARG, "found 0");
    char buf[256];
    dt_model_describe(m, buf, sizeof buf);
    CHECK(strstr(buf, "conv2d") && strstr(buf, "(1, 8, 8) -> (2, 6, 6) 20 params"));
    CHECK(dt_model_new(&(dt_model *){NULL}, 0, 1, 1) != DT_OK);
    CHECK(strstr(dt_last_error(), "found (0, 1, 1)") != NULL);
    dt_model_free(m);
}

int main(void) {
    RUN(test_init);
    RUN(test_determinism);
    setenv("DT_CONV", "gemm", 1);
    RUN(test_threads);
    setenv("DT_CONV", "direct", 1);
    RUN(test_threads);
    setenv("DT_NO_POOL_FUSION", "1", 1);
    RUN(test_threads);
    unsetenv("DT_NO_POOL_FUSION");
    unsetenv("DT_CONV");
    RUN(test_dropout_masks);
    RUN(test_sample_keys);
    RUN(test_hook_and_accumulation);
    RUN(test_errors);
    return check_summary();
}
