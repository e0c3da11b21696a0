// test_ops (GPU): every kind of node the CUDA executor runs, one training step against
// the CPU's kernels (the graph's own) on fresh random inputs: outputs, losses, every
// parameter's gradient (through a layer before the node: its input gradient too) and
// running statistics, within the bound of gpu_check.h.
#include "../lib/graphs.h"
#include "gpu_graph.h"

static dt_device *dev;

// ------------------------------------------------------------------ graph pieces

// Input "x" (c, h, w) and a 1x1 convolution "pre" (c -> c) reading it; without a bias
// before a BatchNorm in training, which subtracts the batch's mean: that bias's
// gradient is zero, its computed value rounding noise on both devices, with nothing to
// compare (the graph's finite-difference test leaves it out for the same reason).
static dt_status img_b(dt_graph *g, int c, int h, int w, bool bias) {
    dt_layer      *l;
    dt_conv2d_opts o = dt_conv2d_opts_default();
    o.bias           = bias;
    DT_TRY(dt_graph_input(g, "x", &(dt_shape){3, {c, h, w, 1}, DT_ELEM_F32}));
    DT_TRY(dt_layer_conv2d_new(&l, c, c, 1, 1, &o));
    return dt_graph_add(g, "pre", l, "x");
}
static dt_status img(dt_graph *g, int c, int h, int w) {
    return img_b(g, c, h, w, true);
}

// Input "x" (t, d) and a Linear "pre" (d -> d) (without a bias: as img_b).
static dt_status flat_b(dt_graph *g, int t, int d, bool bias) {
    dt_layer      *l;
    dt_linear_opts o = dt_linear_opts_default();
    o.bias           = bias;
    DT_TRY(dt_graph_input(g, "x", &(dt_shape){2, {t, d, 1, 1}, DT_ELEM_F32}));
    DT_TRY(dt_layer_linear_new(&l, d, d, &o));
    return dt_graph_add(g, "pre", l, "x");
}
static dt_status flat(dt_graph *g, int t, int d) {
    return flat_b(g, t, d, true);
}

static dt_graph *start(void) {
    dt_graph     *g = NULL;
    dt_graph_opts o = dt_graph_opts_default();
    o.no_fusion     = true; // each node as added; fused kinds have cases of their own
    CHECK_OK(dt_graph_new(&g, &o));
    return g;
}

static void run(dt_graph *g, const char *name, int batch, double L_out, double L_grad) {
    if (!g)
        return;
    gpu_case c = {name,         batch, dt_loss_spec_default(DT_LOSS_MSE), L_out, L_grad, false,
                  DT_PREC_FP32, 0};
    if (dt_graph_finalize(g, 7) == DT_OK)
        gpu_case_run(dev, g, &c, 0, 1234);
    else
        CHECK_OK(dt_last_status());
    dt_graph_free(g);
}

// --------------------------------------------------------------------- the cases

static void test_conv(void) {
    dt_layer      *l;
    dt_graph      *g  = start();
    dt_conv2d_opts co = dt_conv2d_opts_default();
    co.ph = co.pw = 1;
    CHECK_OK(img(g, 3, 9, 9));
    CHECK_OK(dt_layer_conv2d_new(&l, 3, 5, 3, 3, &co));
    CHECK_OK(dt_graph_add(g, "conv", l, "pre"));
    run(g, "conv 3->5, 3x3, padding 1", 4, 40, 4 * 81 * 50);

    g     = start();
    co    = dt_conv2d_opts_default();
    co.sh = co.sw = 2, co.bias = false;
    CHECK_OK(img(g, 4, 10, 10));
    CHECK_OK(dt_layer_conv2d_new(&l, 4, 6, 3, 3, &co));
    CHECK_OK(dt_graph_add(g, "conv", l, "pre"));
    run(g, "conv 4->6, 3x3, stride 2, no bias", 3, 40, 3 * 100 * 60);

    g     = start();
    co    = dt_conv2d_opts_default();
    co.sw = 2, co.pw = 1;
    CHECK_OK(img(g, 3, 5, 7));
    CHECK_OK(dt_layer_conv2d_new(&l, 3, 4, 1, 3, &co));
    CHECK_OK(dt_graph_add(g, "conv", l, "pre"));
    run(g, "conv 3->4, 1x3, stride (1, 2), padding (0, 1)", 5, 20, 5 * 35 * 20);

    // the graph's fusion: conv + ReLU + 2x2 max pool as one node
    dt_graph_opts go = dt_graph_opts_default();
    CHECK_OK(dt_graph_new(&g, &go));
    co = dt_conv2d_opts_default();
    CHECK_OK(img(g, 2, 10, 10));
    CHECK_OK(dt_layer_conv2d_new(&l, 2, 8, 3, 3, &co));
    CHECK_OK(dt_graph_add(g, "conv", l, "pre"));
    CHECK_OK(dt_layer_act_new(&l, DT_ACT_RELU, NULL));
    CHECK_OK(dt_graph_add(g, "relu", l, "conv"));
    CHECK_OK(dt_layer_maxpool2d_new(&l, 2, 2, NULL));
    CHECK_OK(dt_graph_add(g, "pool", l, "relu"));
    run(g, "conv + ReLU + 2x2 max pool (fused)", 4, 30, 4 * 100 * 80);
}

static void test_linear(void) {
    dt_layer *l;
    dt_graph *g = start();
    CHECK_OK(flat(g, 5, 12));
    CHECK_OK(dt_layer_linear_new(&l, 12, 7, NULL));
    CHECK_OK(dt_graph_add(g, "fc", l, "pre"));
    run(g, "linear 12->7 over (5, 12)", 6, 30, 6 * 5 * 20);
    g = start();
    CHECK_OK(flat(g, 3, 33));
    CHECK_OK(dt_layer_linear_new(&l, 33, 65, &(dt_linear_opts){.bias = false}));
    CHECK_OK(dt_graph_add(g, "fc", l, "pre"));
    run(g, "linear 33->65, no bias", 7, 70, 7 * 3 * 100);
}

static void test_activations(void) {
    static const char *const names[] = {"relu", "gelu", "gelu_tanh", "tanh", "sigmoid", "silu"};
    for (int a = DT_ACT_RELU; a <= DT_ACT_SILU; a++) {
        dt_layer *l;
        dt_graph *g = start();
        CHECK_OK(flat(g, 3, 16));
        CHECK_OK(dt_layer_act_new(&l, (dt_act)a, NULL));
        CHECK_OK(dt_graph_add(g, "act", l, "pre"));
        run(g, names[a], 5, 20, 5 * 3 * 20);
    }
    dt_layer *l;
    dt_graph *g = start();
    CHECK_OK(flat(g, 4, 9));
    CHECK_OK(dt_layer_softmax_new(&l, NULL));
    CHECK_OK(dt_graph_add(g, "sm", l, "pre"));
    run(g, "softmax over 9", 5, 20, 5 * 4 * 20);
}

static void test_pools(void) {
    dt_layer      *l;
    dt_graph      *g  = start();
    dt_pool2d_opts po = dt_pool2d_opts_default();
    po.sh = po.sw = 2, po.ph = po.pw = 1;
    CHECK_OK(img(g, 3, 9, 9));
    CHECK_OK(dt_layer_maxpool2d_new(&l, 3, 3, &po));
    CHECK_OK(dt_graph_add(g, "mp", l, "pre"));
    run(g, "maxpool 3x3, stride 2, padding 1", 4, 5, 4 * 81 * 5);

    g = start();
    CHECK_OK(img(g, 3, 8, 8));
    CHECK_OK(dt_layer_avgpool2d_new(&l, 2, 2, NULL));
    CHECK_OK(dt_graph_add(g, "ap", l, "pre"));
    run(g, "avgpool 2x2", 4, 10, 4 * 64 * 10);

    g     = start();
    po    = dt_pool2d_opts_default();
    po.sh = po.sw = 1, po.ph = po.pw = 1;
    CHECK_OK(img(g, 2, 7, 7));
    CHECK_OK(dt_layer_avgpool2d_new(&l, 3, 3, &po));
    CHECK_OK(dt_graph_add(g, "ap", l, "pre"));
    run(g, "avgpool 3x3, stride 1, padding 1", 3, 20, 3 * 49 * 20);

    g = start();
    CHECK_OK(img(g, 3, 7, 7));
    CHECK_OK(dt_layer_adaptive_avgpool2d_new(&l, 3, 3, NULL));
    CHECK_OK(dt_graph_add(g, "ad", l, "pre"));
    run(g, "adaptive avgpool 7x7 -> 3x3", 4, 20, 4 * 49 * 20);

    g = start();
    CHECK_OK(img(g, 5, 4, 6));
    CHECK_OK(dt_layer_adaptive_avgpool2d_new(&l, 1, 1, NULL));
    CHECK_OK(dt_graph_add(g, "ad", l, "pre"));
    run(g, "adaptive avgpool to 1x1", 4, 30, 4 * 24 * 30);
}

static void test_norms(void) {
    dt_layer *l;
    dt_graph *g = start();
    CHECK_OK(img_b(g, 4, 6, 6, false));
    CHECK_OK(dt_layer_batchnorm2d_new(&l, 4, NULL));
    CHECK_OK(dt_graph_add(g, "bn", l, "pre"));
    run(g, "batchnorm2d (training)", 5, 5 * 36, 5 * 36 * 20);

    g = start();
    CHECK_OK(flat_b(g, 1, 6, false));
    CHECK_OK(dt_layer_batchnorm1d_new(&l, 1, NULL)); // (1, 6): one channel of 6
    CHECK_OK(dt_graph_add(g, "bn", l, "pre"));
    run(g, "batchnorm1d on (c, l)", 8, 8 * 6, 8 * 6 * 20);

    dt_batchnorm_opts bo = dt_batchnorm_opts_default();
    bo.affine            = false;
    bo.momentum          = 0.3f;
    g                    = start();
    CHECK_OK(img_b(g, 3, 5, 5, false));
    CHECK_OK(dt_layer_batchnorm2d_new(&l, 3, &bo));
    CHECK_OK(dt_graph_add(g, "bn", l, "pre"));
    run(g, "batchnorm2d without affine, momentum 0.3", 4, 4 * 25, 4 * 25 * 20);

    // evaluation: the running statistics
    g = start();
    CHECK_OK(img(g, 4, 6, 6));
    CHECK_OK(dt_layer_batchnorm2d_new(&l, 4, NULL));
    CHECK_OK(dt_graph_add(g, "bn", l, "pre"));
    if (dt_graph_finalize(g, 7) == DT_OK) {
        float *rv = dt_params_buffers(dt_graph_params(g)) + 4; // running_var != 1
        for (int c = 0; c < 4; c++)
            rv[c] = 0.5f + (float)c;
        gpu_case c = {"batchnorm2d (evaluation)",
                      3,
                      dt_loss_spec_default(DT_LOSS_MSE),
                      10,
                      3 * 36 * 10,
                      true,
                      DT_PREC_FP32,
                      0};
        gpu_case_run(dev, g, &c, 0, 77);
    }
    dt_graph_free(g);

    g = start();
    CHECK_OK(flat(g, 6, 20));
    CHECK_OK(dt_layer_layernorm_new(&l, 20, NULL));
    CHECK_OK(dt_graph_add(g, "ln", l, "pre"));
    run(g, "layernorm over 20", 5, 40, 5 * 6 * 40);
}

// A ResNet basic block fused by dt_graph_fuse: BatchNorm + ReLU, BatchNorm + Add + ReLU.
static void test_resblock(void) {
    dt_graph *g;
    CHECK_OK(dt_graph_new(&g, NULL));
    CHECK_OK(tg_resblock(g, 4, 6, 6, NULL));
    int fused = 0;
    CHECK_OK(dt_graph_fuse(g, &fused));
    CHECK_EQ(fused, 2);
    run(g, "ResNet block (fused BatchNorm forms)", 4, 4 * 36 * 40, 4 * 36 * 400);
}

// Fan-out (one value read by three nodes), a three-way add, concatenation.
static void test_structure(void) {
    dt_layer *l;
    dt_graph *g = start();
    CHECK_OK(flat(g, 3, 8));
    CHECK_OK(dt_layer_act_new(&l, DT_ACT_RELU, NULL));
    CHECK_OK(dt_graph_add(g, "a", l, "pre"));
    CHECK_OK(dt_layer_act_new(&l, DT_ACT_TANH, NULL));
    CHECK_OK(dt_graph_add(g, "b", l, "pre"));
    CHECK_OK(dt_layer_add_new(&l, NULL));
    CHECK_OK(dt_graph_add(g, "sum", l, "a", "b", "pre"));
    run(g, "fan-out into a three-way add", 4, 20, 4 * 3 * 30);

    for (int dim = 0; dim < 2; dim++) {
        g = start();
        CHECK_OK(img(g, 2, 4, 5));
        CHECK_OK(dt_layer_act_new(&l, DT_ACT_SIGMOID, NULL));
        CHECK_OK(dt_graph_add(g, "s", l, "pre"));
        CHECK_OK(dt_layer_concat_new(&l, dim, NULL));
        CHECK_OK(dt_graph_add(g, "cat", l, "pre", "s", "pre"));
        run(g, dim ? "concat along height, an input twice" : "concat along channels", 3, 10,
            3 * 20 * 30);
    }
}

// Dropout: the CPU's masks (the outputs agree to the upstream rounding, so a mask that
// differs anywhere is an error of the input's size).
static void test_dropout(void) {
    dt_layer *l;
    dt_graph *g = start();
    CHECK_OK(flat(g, 4, 32));
    CHECK_OK(dt_layer_dropout_new(&l, 0.3f, NULL));
    CHECK_OK(dt_graph_add(g, "drop", l, "pre"));
    run(g, "dropout 0.3 (the CPU's masks)", 9, 40, 9 * 4 * 40);
}

static void test_attention(void) {
    static const int cases[][3] = {{40, 64, 2}, {33, 96, 3}, {70, 128, 2}, {20, 128, 1}};
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        int       T = cases[k][0], C = cases[k][1], H = cases[k][2];
        dt_layer *l;
        dt_graph *g = start();
        CHECK_OK(flat(g, T, 3 * C));
        CHECK_OK(dt_layer_attention_new(&l, H, NULL));
        CHECK_OK(dt_graph_add(g, "attn", l, "pre"));
        char name[64];
        snprintf(name, sizeof name, "attention T %d, C %d, %d heads (d %d)", T, C, H, C / H);
        run(g, name, 3, 3.0 * C * T, 3.0 * T * 3 * C * T);
    }
}

static void test_losses(void) {
    dt_graph *g = start();
    CHECK_OK(flat(g, 5, 11));
    if (dt_graph_finalize(g, 3) == DT_OK) {
        gpu_case c             = {"cross-entropy, ignore_index and label smoothing 0.1",
                                  6,
                                  dt_loss_spec_default(DT_LOSS_CROSS_ENTROPY),
                                  20,
                                  6 * 5 * 20,
                                  false,
                                  DT_PREC_FP32,
                                  0};
        c.loss.label_smoothing = 0.1f;
        gpu_case_run(dev, g, &c, 0, 5);
        c.name                 = "cross-entropy, plain";
        c.loss.label_smoothing = 0.0f;
        c.loss.ignore_index    = -1000; // none ignored... but targets set to it are
        gpu_case_run(dev, g, &c, 0, 6);
        c.name              = "cross-entropy, gradient scaled by 1024 (fp16's loss scale)";
        c.loss.grad_scale   = 1024.0f;
        c.loss.ignore_index = -100;
        gpu_case_run(dev, g, &c, 0, 7);
    }
    dt_graph_free(g);
}

int main(int argc, char **argv) {
    gpu_filter = argc > 1 ? argv[1] : NULL;
    if (!(dev = gpu_device()))
        return check_summary();
    GPU_RUN(test_conv);
    GPU_RUN(test_linear);
    GPU_RUN(test_activations);
    GPU_RUN(test_pools);
    GPU_RUN(test_norms);
    GPU_RUN(test_resblock);
    GPU_RUN(test_structure);
    GPU_RUN(test_dropout);
    GPU_RUN(test_attention);
    GPU_RUN(test_losses);
    return check_summary();
}
