// test_compat.c: files written by an earlier dtrain load into today's, and mean the
// same model. The fixtures in tests/compat/data were written by this program's --write
// mode on main before the NN core became one layer system (a Sequential model's layers
// and the graph's were two implementations then); the checks below keep today's code to
// them:
// - a model built today from the same seed starts from the very same parameters (the
//   initialisation draws from the random streams only: bit for bit on any CPU);
// - the trained parameters the old code saved load into today's model, and its output
//   on a fixed input is the old output to rounding: the fp32 products of these layers
//   sum at most 288 terms of magnitude below 2 (inputs N(0, 1), weights below 1/3), so
//   two kernel sets that add them in other orders differ by under 288 x 2^-24 x 2 per
//   product and layer; through the four products of model A and the log-softmax that is
//   below 1e-4 (3e-6 seen between two CPUs);
// - two SGD steps from the initial parameters on today's code land on the old trained
//   parameters to the same rounding, grown by the two steps (lr 0.1): 1e-4.
// Model A is the Sequential ConvNet of test_model (conv, relu, conv, relu, maxpool,
// dropout2d, flatten, linear, relu, dropout, linear, log_softmax); model B a graph of
// the graph's own layers (conv, batchnorm, relu, avgpool, flatten, linear).
#include "../check.h"
#include "dtrain/ckpt.h"
#include "dtrain/graph.h"
#include "dtrain/nn.h"

#include <stdlib.h>
#include <string.h>

#define DATA "tests/compat/data/" // the tests run from the repository's root

enum { B = 8, PIX = 144 };

static dt_model *model_a(void) {
    dt_model *m = NULL;
    CHECK_OK(dt_model_new(&m, 1, 12, 12));
    CHECK_OK(dt_model_add_conv2d(m, 4, 3, 1, 0));
    CHECK_OK(dt_model_add_relu(m));
    CHECK_OK(dt_model_add_conv2d(m, 8, 3, 1, 1));
    CHECK_OK(dt_model_add_relu(m));
    CHECK_OK(dt_model_add_maxpool2d(m, 2, 0));
    CHECK_OK(dt_model_add_dropout2d(m, 0.25f));
    CHECK_OK(dt_model_add_flatten(m));
    CHECK_OK(dt_model_add_linear(m, 16));
    CHECK_OK(dt_model_add_relu(m));
    CHECK_OK(dt_model_add_dropout(m, 0.5f));
    CHECK_OK(dt_model_add_linear(m, 10));
    CHECK_OK(dt_model_add_log_softmax(m));
    CHECK_OK(dt_model_finalize(m, 5));
    return m;
}

static dt_graph *model_b(void) {
    dt_graph      *g = NULL;
    dt_layer      *l;
    dt_conv2d_opts co = dt_conv2d_opts_default();
    co.ph = co.pw = 1;
    CHECK_OK(dt_graph_new(&g, NULL));
    CHECK_OK(dt_graph_input(g, "x", &(dt_shape){3, {1, 12, 12, 1}, DT_ELEM_F32}));
    CHECK_OK(dt_layer_conv2d_new(&l, 1, 6, 3, 3, &co));
    CHECK_OK(dt_graph_add(g, "conv", l, "x"));
    CHECK_OK(dt_layer_batchnorm2d_new(&l, 6, NULL));
    CHECK_OK(dt_graph_add(g, "bn", l, "conv"));
    CHECK_OK(dt_layer_act_new(&l, DT_ACT_RELU, NULL));
    CHECK_OK(dt_graph_add(g, "relu", l, "bn"));
    CHECK_OK(dt_layer_avgpool2d_new(&l, 4, 4, NULL));
    CHECK_OK(dt_graph_add(g, "pool", l, "relu"));
    CHECK_OK(dt_layer_flatten_new(&l, NULL));
    CHECK_OK(dt_graph_add(g, "flat", l, "pool"));
    CHECK_OK(dt_layer_linear_new(&l, 6 * 9, 10, NULL));
    CHECK_OK(dt_graph_add(g, "fc", l, "flat"));
    CHECK_OK(dt_graph_finalize(g, 9));
    return g;
}

static void inputs(float *x, int32_t *y) {
    dt_rng r = dt_rng_init(77);
    for (int i = 0; i < B * PIX; i++)
        x[i] = dt_rng_normal(&r);
    for (int i = 0; i < B; i++)
        y[i] = (int32_t)(dt_rng_uniform(&r) * 10) % 10;
}

// One SGD step (lr 0.1) of model A on (x, y), dropout keyed by position.
static void step_a(dt_model *m, const float *x, const int32_t *y) {
    float loss, dl[B * 10];
    dt_model_train(m, true);
    dt_rng e = dt_rng_init(3);
    dt_model_set_rng(m, &e);
    dt_model_zero_grad(m);
    CHECK_OK(dt_model_forward(m, x, B));
    CHECK_OK(dt_loss_nll(dt_model_output(m), y, B, 10, &loss, dl));
    CHECK_OK(dt_model_backward(m, dl));
    float *p = dt_model_params(m), *g = dt_model_grads(m);
    for (size_t i = 0; i < dt_model_num_params(m); i++)
        p[i] -= 0.1f * g[i];
}

// The same for model B, its loss cross-entropy on the logits.
static void step_b(dt_graph *g, const float *x, const int32_t *y) {
    float loss, dl[B * 10];
    dt_graph_train(g, true);
    dt_params_zero_grad(dt_graph_params(g));
    CHECK_OK(dt_graph_forward(g, (const void *const[]){x}, B));
    CHECK_OK(dt_loss_cross_entropy(dt_graph_output(g), y, B, 10, &loss, dl));
    CHECK_OK(dt_graph_backward(g, dl));
    dt_params *ps = dt_graph_params(g);
    float     *p = dt_params_data(ps), *gr = dt_params_grads(ps);
    for (size_t i = 0; i < dt_params_numel(ps); i++)
        p[i] -= 0.1f * gr[i];
}

static bool write_floats(const char *path, const float *v, size_t n) {
    FILE *f  = fopen(path, "wb");
    bool  ok = f && fwrite(v, sizeof(float), n, f) == n;
    return f && fclose(f) == 0 && ok;
}
static bool read_floats(const char *path, float *v, size_t n) {
    FILE *f  = fopen(path, "rb");
    bool  ok = f && fread(v, sizeof(float), n, f) == n;
    if (f)
        fclose(f);
    return ok;
}

static double maxdiff(const float *a, const float *b, size_t n) {
    double d = 0;
    for (size_t i = 0; i < n; i++)
        d = fmax(d, fabs((double)a[i] - b[i]));
    return d;
}

static void write_all(void) {
    float   x[B * PIX];
    int32_t y[B];
    inputs(x, y);
    dt_model *a = model_a();
    CHECK_OK(dt_ckpt_save_params(DATA "a-init.bin", dt_model_as_params(a)));
    step_a(a, x, y);
    step_a(a, x, y);
    CHECK_OK(dt_ckpt_save_params(DATA "a-trained.bin", dt_model_as_params(a)));
    dt_model_train(a, false);
    CHECK_OK(dt_model_forward(a, x, B));
    CHECK(write_floats(DATA "a-output.f32", dt_model_output(a), B * 10));
    dt_model_free(a);
    dt_graph *g = model_b();
    CHECK_OK(dt_ckpt_save_params(DATA "b-init.bin", dt_graph_params(g)));
    step_b(g, x, y);
    step_b(g, x, y);
    CHECK_OK(dt_ckpt_save_params(DATA "b-trained.bin", dt_graph_params(g)));
    dt_graph_train(g, false);
    CHECK_OK(dt_graph_forward(g, (const void *const[]){x}, B));
    CHECK(write_floats(DATA "b-output.f32", dt_graph_output(g), B * 10));
    dt_graph_free(g);
}

// A fresh model's parameters against a fixture's, bit for bit.
static void same_init(dt_params *fresh, const char *path) {
    size_t n   = dt_params_numel(fresh);
    float *now = malloc(sizeof(float) * n);
    memcpy(now, dt_params_data(fresh), sizeof(float) * n);
    CHECK_OK(dt_ckpt_load_params(path, fresh)); // names, shapes and order must match
    CHECK(memcmp(now, dt_params_data(fresh), sizeof(float) * n) == 0);
    free(now);
}

static void test_model_a(void) {
    float   x[B * PIX], out[B * 10];
    int32_t y[B];
    inputs(x, y);
    dt_model *m = model_a();
    same_init(dt_model_as_params(m), DATA "a-init.bin");
    step_a(m, x, y);
    step_a(m, x, y);
    size_t n   = dt_model_num_params(m);
    float *now = malloc(sizeof(float) * n);
    memcpy(now, dt_model_params(m), sizeof(float) * n);
    CHECK_OK(dt_ckpt_load_params(DATA "a-trained.bin", dt_model_as_params(m)));
    double dp = maxdiff(now, dt_model_params(m), n);
    dt_model_train(m, false);
    CHECK_OK(dt_model_forward(m, x, B));
    CHECK(read_floats(DATA "a-output.f32", out, B * 10));
    double dout = maxdiff(out, dt_model_output(m), B * 10);
    fprintf(stderr, "     model A: trained parameters off by %.3g, output by %.3g\n", dp, dout);
    CHECK(dp < 1e-4);
    CHECK(dout < 1e-4);
    free(now);
    dt_model_free(m);
}

static void test_model_b(void) {
    float   x[B * PIX], out[B * 10];
    int32_t y[B];
    inputs(x, y);
    dt_graph *g = model_b();
    same_init(dt_graph_params(g), DATA "b-init.bin");
    step_b(g, x, y);
    step_b(g, x, y);
    dt_params *ps  = dt_graph_params(g);
    size_t     n   = dt_params_numel(ps);
    float     *now = malloc(sizeof(float) * n);
    memcpy(now, dt_params_data(ps), sizeof(float) * n);
    CHECK_OK(dt_ckpt_load_params(DATA "b-trained.bin", ps));
    double dp = maxdiff(now, dt_params_data(ps), n);
    dt_graph_train(g, false);
    CHECK_OK(dt_graph_forward(g, (const void *const[]){x}, B));
    CHECK(read_floats(DATA "b-output.f32", out, B * 10));
    double dout = maxdiff(out, dt_graph_output(g), B * 10);
    fprintf(stderr, "     model B: trained parameters off by %.3g, output by %.3g\n", dp, dout);
    CHECK(dp < 1e-4);
    CHECK(dout < 1e-4);
    free(now);
    dt_graph_free(g);
}

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "--write") == 0) {
        write_all();
        return check_summary();
    }
    RUN(test_model_a);
    RUN(test_model_b);
    return check_summary();
}
