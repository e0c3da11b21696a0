// test_graph_golden.c: whole graphs against PyTorch (tests/golden/gen_graph.py): a ResNet
// basic block (conv-BN-ReLU-conv-BN + shortcut, ReLU; BatchNorm in training mode, with
// the running statistics checked), a pre-LN transformer block (LN, qkv Linear, causal
// attention, proj, residual, LN, Linear-GELU-Linear, residual) and a one-block GPT with
// token and position embeddings and a head tied to the token embedding. Each checks the
// output, every parameter gradient (the tied one sums two uses), the buffers and the
// input gradient, per tensor max|dtrain - torch| <= 1e-5 * max|torch|; and that
// backward reports every parameter tensor to the gradient-ready hook exactly once, the
// tied one after its earliest user. A fourth, in evaluation mode, covers BatchNorm
// with loaded running statistics, grouped rectangular convolution with bias, MaxPool2d
// and AvgPool2d fanned out from one activation and concatenated, AdaptiveAvgPool2d,
// Flatten, BatchNorm1d, Tanh, and the cross-entropy (ignore_index, label smoothing) of
// the output. The ResNet block runs twice: as built, and with its BatchNorm + ReLU and
// BatchNorm + Add + ReLU fused (dt_graph_fuse).
#include "../lib/graphs.h"
#include "fixture.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#define TOL 1e-5

// Copies "p:<name>" of every parameter into the graph.
static void load_params(fixture *f, dt_graph *g) {
    dt_params *p = dt_graph_params(g);
    char       key[80];
    for (int i = 0; i < dt_params_count(p); i++) {
        const dt_param_info *t = dt_params_info(p, i);
        snprintf(key, sizeof key, "p:%s", t->name);
        gtensor *gt = fx_get(f, key);
        CHECK_EQ(gt->count, t->count);
        memcpy(dt_params_data(p) + t->offset, gt->data, sizeof(float) * t->count);
    }
}

static void check_grads(fixture *f, dt_graph *g) {
    dt_params *p = dt_graph_params(g);
    char       key[80];
    for (int i = 0; i < dt_params_count(p); i++) {
        const dt_param_info *t = dt_params_info(p, i);
        snprintf(key, sizeof key, "g:%s", t->name);
        fx_expect(f, key, dt_params_grads(p) + t->offset, TOL);
    }
    for (int i = 0; i < dt_params_buffer_count(p); i++) {
        const dt_param_info *t = dt_params_buffer_info(p, i);
        snprintf(key, sizeof key, "b:%s", t->name);
        fx_expect(f, key, dt_params_buffers(p) + t->offset, TOL);
    }
}

typedef struct ready_log {
    int    n;
    size_t off[64], cnt[64];
} ready_log;

static dt_status on_ready(void *user, size_t off, size_t cnt) {
    ready_log *r = user;
    if (r->n < 64) {
        r->off[r->n] = off;
        r->cnt[r->n] = cnt;
    }
    r->n++;
    return DT_OK;
}

// Every tensor reported once, whole; returns the position of `name` in the order.
static int check_ready(dt_graph *g, const ready_log *r, const char *name) {
    dt_params *p = dt_graph_params(g);
    CHECK_EQ(r->n, dt_params_count(p));
    int pos = -1;
    for (int i = 0; i < dt_params_count(p); i++) {
        const dt_param_info *t    = dt_params_info(p, i);
        int                  seen = 0;
        for (int k = 0; k < r->n && k < 64; k++)
            if (r->off[k] == t->offset && r->cnt[k] == t->count) {
                seen++;
                if (name && strcmp(t->name, name) == 0)
                    pos = k;
            }
        if (!CHECK(seen == 1))
            fprintf(stderr, "     %s reported %d times\n", t->name, seen);
    }
    return pos;
}

static gtensor *find(fixture *f, const char *name) {
    for (int k = 0; k < f->n; k++)
        if (strcmp(f->t[k].name, name) == 0)
            return &f->t[k];
    return NULL;
}

// Loads "b0:<name>" into each buffer the fixture sets before the forward.
static void load_buffers(fixture *f, dt_graph *g) {
    dt_params *p = dt_graph_params(g);
    char       key[80];
    for (int i = 0; i < dt_params_buffer_count(p); i++) {
        const dt_param_info *t = dt_params_buffer_info(p, i);
        snprintf(key, sizeof key, "b0:%s", t->name);
        gtensor *gt = find(f, key);
        if (gt && CHECK(gt->count == t->count))
            memcpy(dt_params_buffers(p) + t->offset, gt->data, sizeof(float) * t->count);
    }
}

static void run_case(const char *name, dt_graph *g, int batch, int ninputs, const char **inputs,
                     const char *tied) {
    fixture f;
    check_current = name;
    if (!fx_load(&f, name))
        return;
    CHECK_OK(dt_graph_finalize(g, 1));
    load_params(&f, g);
    load_buffers(&f, g);
    const void *in[4];
    for (int i = 0; i < ninputs; i++) {
        char key[80];
        snprintf(key, sizeof key, "in:%s", inputs[i]);
        in[i] = fx_get(&f, key)->data;
    }
    dt_graph_set_input_grad(g, true);
    ready_log log = {0};
    CHECK_OK(dt_params_add_grad_hook(dt_graph_params(g), on_ready, &log));
    CHECK_OK(dt_graph_forward(g, in, batch));
    fx_expect(&f, "y", dt_graph_output(g), TOL);
    dt_params_zero_grad(dt_graph_params(g));
    CHECK_OK(dt_graph_backward(g, fx_f32(&f, "dy")));
    check_grads(&f, g);
    for (int i = 0; i < ninputs; i++) {
        char key[80];
        snprintf(key, sizeof key, "dx:%s", inputs[i]);
        for (int k = 0; k < f.n; k++)
            if (strcmp(f.t[k].name, key) == 0)
                fx_expect(&f, key, dt_graph_input_grad(g, i), TOL);
    }
    gtensor *target = find(&f, "target");
    if (target) { // cross-entropy of the output: nn.CrossEntropyLoss(ignore_index=2, ls=0.1)
        int   k = (int)(dt_shape_numel(dt_graph_node_shape(g, -1)));
        float loss, *dl = malloc(sizeof(float) * (size_t)batch * (size_t)k);
        CHECK_OK(dt_loss_cross_entropy_ex(dt_graph_output(g), target->data, batch, k, 2, 0.1f,
                                          &loss, dl));
        fx_expect(&f, "loss", &loss, TOL);
        fx_expect(&f, "dlogits", dl, TOL);
        free(dl);
    }
    int pos = check_ready(g, &log, tied);
    if (tied) // the tied tensor is final only after its earliest user, the first node
        CHECK_EQ(pos, log.n - 1);
    fx_free(&f);
}

// The graph of gen_graph.py's cnn_eval, in evaluation mode.
static dt_status cnn_eval(dt_graph *g) {
    dt_layer      *l;
    dt_conv2d_opts co = dt_conv2d_opts_default();
    co.ph             = 1;
    co.groups         = 2;
    dt_pool2d_opts po = {.sh = 2, .sw = 2, .ph = 1, .pw = 1};
    DT_TRY(dt_graph_input(g, "x", &(dt_shape){3, {4, 7, 6, 1}, DT_ELEM_F32}));
    DT_TRY(dt_layer_conv2d_new(&l, 4, 6, 3, 2, &co));
    DT_TRY(dt_graph_add(g, "conv", l, "x"));
    DT_TRY(dt_layer_batchnorm2d_new(&l, 6, NULL));
    DT_TRY(dt_graph_add(g, "bn", l, "conv"));
    DT_TRY(dt_layer_act_new(&l, DT_ACT_SILU, NULL));
    DT_TRY(dt_graph_add(g, "silu", l, "bn"));
    DT_TRY(dt_layer_maxpool2d_new(&l, 3, 3, &po));
    DT_TRY(dt_graph_add(g, "max", l, "silu"));
    DT_TRY(dt_layer_avgpool2d_new(&l, 3, 3, &po));
    DT_TRY(dt_graph_add(g, "avg", l, "silu"));
    DT_TRY(dt_layer_concat_new(&l, 0, NULL));
    DT_TRY(dt_graph_add(g, "cat", l, "max", "avg"));
    DT_TRY(dt_layer_adaptive_avgpool2d_new(&l, 2, 2, NULL));
    DT_TRY(dt_graph_add(g, "ada", l, "cat"));
    DT_TRY(dt_layer_flatten_new(&l, NULL));
    DT_TRY(dt_graph_add(g, "flat", l, "ada"));
    DT_TRY(dt_layer_linear_new(&l, 48, 9, NULL));
    DT_TRY(dt_graph_add(g, "fc1", l, "flat"));
    DT_TRY(dt_layer_batchnorm1d_new(&l, 9, NULL));
    DT_TRY(dt_graph_add(g, "bn1d", l, "fc1"));
    DT_TRY(dt_layer_act_new(&l, DT_ACT_TANH, NULL));
    DT_TRY(dt_graph_add(g, "tanh", l, "bn1d"));
    DT_TRY(dt_layer_linear_new(&l, 9, 5, NULL));
    DT_TRY(dt_graph_add(g, "fc2", l, "tanh"));
    dt_graph_train(g, false);
    return DT_OK;
}

// The public losses (graph.h) on gen.py's loss fixtures: MSE, L1, BCE-with-logits.
static void losses(void) {
    const char *names[]        = {"mse", "l1", "bce_logits"};
    dt_status (*fn[])(const float *, const float *, size_t, float *,
                      float *) = {dt_loss_mse, dt_loss_l1, dt_loss_bce_logits};
    for (int i = 0; i < 3; i++) {
        fixture f;
        check_current = names[i];
        if (!fx_load(&f, names[i]))
            continue;
        size_t n  = fx_get(&f, "x")->count;
        float *dx = malloc(sizeof(float) * n), loss;
        CHECK_OK(fn[i](fx_f32(&f, "x"), fx_f32(&f, "t"), n, &loss, dx));
        fx_expect(&f, "loss", &loss, TOL);
        fx_expect(&f, "dx", dx, TOL);
        free(dx);
        fx_free(&f);
    }
}

int main(void) {
    dt_graph *g;

    losses();

    CHECK_OK(dt_graph_new(&g, NULL));
    CHECK_OK(cnn_eval(g));
    run_case("graph_cnn_eval", g, 5, 1, (const char *[]){"x"}, NULL);
    dt_graph_free(g);

    CHECK_OK(dt_graph_new(&g, NULL));
    CHECK_OK(tg_resblock(g, 4, 6, 5, NULL));
    run_case("graph_resblock", g, 3, 1, (const char *[]){"x"}, NULL);
    dt_graph_free(g);

    // the same block through dt_graph_fuse: bn1 + relu1 and bn2 + add + out as one node each
    int fused = 0;
    CHECK_OK(dt_graph_new(&g, NULL));
    CHECK_OK(tg_resblock(g, 4, 6, 5, NULL));
    CHECK_OK(dt_graph_fuse(g, &fused));
    CHECK_EQ(fused, 2);
    run_case("graph_resblock", g, 3, 1, (const char *[]){"x"}, NULL);
    dt_graph_free(g);

    CHECK_OK(dt_graph_new(&g, NULL));
    CHECK_OK(dt_graph_input(g, "x", &(dt_shape){2, {7, 8, 1, 1}, DT_ELEM_F32}));
    CHECK_OK(tg_block(g, "", "x", 8, 2));
    run_case("graph_transformer", g, 2, 1, (const char *[]){"x"}, NULL);
    dt_graph_free(g);

    CHECK_OK(dt_graph_new(&g, NULL));
    CHECK_OK(tg_gpt(g, 6, 8, 2, 13, 0));
    run_case("graph_gpt_tied", g, 2, 2, (const char *[]){"idx", "pos"}, "wte.weight");
    dt_graph_free(g);
    return check_summary();
}
