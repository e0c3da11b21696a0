// test_graph_fusion.c: what dt_graph_finalize does to a graph (the fusion pass), and
// gradient shards on a graph of the graph's own layers.
//
// - Fusion: Conv2d -> ReLU -> MaxPool2d(2) becomes one node (kind
//   "conv2d+relu+maxpool2d", the pool's name, the Conv2d's tensor names and initial
//   values, bit for bit); its outputs and gradients equal those of the same graph left
//   unfused (dt_graph_opts.no_fusion) up to float rounding, on 1 and 2 threads. A ReLU
//   read by two nodes, a stride-2 convolution and DT_NO_POOL_FUSION=1 fuse the
//   convolution with its ReLU only ("conv2d+relu").
// - Gradient shards (dt_graph_set_grad_shards) on Conv2d (fused) -> Flatten -> Linear
//   -> GELU -> Dropout -> Linear: 1, 2 and 3 threads give the same gradient bits, and
//   N emulated ranks (positions r + N j, V / N shards each, their gradients combined by
//   the tree DDP continues) give one process's bits; all close to the unsharded
//   gradient.
#include "../check.h"
#include "dtrain/graph.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

enum { C = 2, H = 8, K = 5, OUT = 6, B = 16 };

static dt_conv2d_opts pad1(void) {
    dt_conv2d_opts o = dt_conv2d_opts_default();
    o.ph = o.pw = 1;
    return o;
}

// x (C, H, H) -> c: Conv2d(C, K, 3, pad 1) -> r: ReLU -> p: MaxPool2d(2) -> f -> fc.
static dt_graph *convnet(bool no_fusion, int threads) {
    dt_graph     *g = NULL;
    dt_layer     *l;
    dt_graph_opts o   = dt_graph_opts_default();
    o.no_fusion       = no_fusion;
    dt_conv2d_opts co = pad1();
    CHECK_OK(dt_graph_new(&g, &o));
    CHECK_OK(dt_graph_input(g, "x", &(dt_shape){3, {C, H, H, 1}, DT_ELEM_F32}));
    CHECK_OK(dt_layer_conv2d_new(&l, C, K, 3, 3, &co));
    CHECK_OK(dt_graph_add(g, "c", l, "x"));
    CHECK_OK(dt_layer_act_new(&l, DT_ACT_RELU, NULL));
    CHECK_OK(dt_graph_add(g, "r", l, "c"));
    CHECK_OK(dt_layer_maxpool2d_new(&l, 2, 2, NULL));
    CHECK_OK(dt_graph_add(g, "p", l, "r"));
    CHECK_OK(dt_layer_flatten_new(&l, NULL));
    CHECK_OK(dt_graph_add(g, "f", l, "p"));
    CHECK_OK(dt_layer_linear_new(&l, K * (H / 2) * (H / 2), OUT, NULL));
    CHECK_OK(dt_graph_add(g, "fc", l, "f"));
    CHECK_OK(dt_graph_finalize(g, 7));
    CHECK_OK(dt_graph_set_threads(g, threads));
    return g;
}

static double rel(const float *a, const float *b, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        num += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        den += (double)b[i] * b[i];
    }
    return sqrt(num / (den > 0 ? den : 1));
}

static void input(float *x, size_t n, float *t, size_t nt) {
    dt_rng r = dt_rng_init(3);
    for (size_t i = 0; i < n; i++)
        x[i] = dt_rng_normal(&r);
    for (size_t i = 0; i < nt; i++)
        t[i] = dt_rng_normal(&r);
}

// Forward, MSE against t, backward into a zeroed gradient.
static void step(dt_graph *g, const float *x, const float *t, int n, size_t nout) {
    float *dy = malloc(sizeof(float) * nout * (size_t)n), loss;
    CHECK_OK(dt_graph_forward(g, (const void *[]){x}, n));
    CHECK_OK(dt_loss_mse(dt_graph_output(g), t, nout * (size_t)n, &loss, dy));
    dt_params_zero_grad(dt_graph_params(g));
    CHECK_OK(dt_graph_backward(g, dy));
    free(dy);
}

static void fused_equals_unfused(void) {
    check_current = "fusion";
    static float x[B * C * H * H], t[B * OUT];
    input(x, sizeof x / sizeof *x, t, B * OUT);
    dt_graph *plain = convnet(true, 1);
    CHECK_EQ(dt_graph_num_nodes(plain), 6);
    step(plain, x, t, B, OUT);
    for (int threads = 1; threads <= 2; threads++) {
        dt_graph *g = convnet(false, threads);
        CHECK_EQ(dt_graph_num_nodes(g), 4);
        CHECK(strcmp(dt_graph_node_kind(g, 1), "conv2d+relu+maxpool2d") == 0);
        CHECK(strcmp(dt_graph_node_name(g, 1), "p") == 0);
        CHECK_EQ(dt_graph_find(g, "r"), -1);
        CHECK_EQ(dt_graph_find(g, "c"), -1);
        CHECK_EQ(dt_graph_find(g, "f"), 2);
        dt_params *p = dt_graph_params(g), *q = dt_graph_params(plain);
        CHECK_EQ(dt_params_count(p), 4);
        CHECK(dt_params_find(p, "c.weight") == 0 && dt_params_find(p, "c.bias") == 1);
        size_t np = dt_params_numel(p);
        CHECK_EQ(np, dt_params_numel(q));
        // the same initial values (the Conv2d still initialises them)
        CHECK(memcmp(dt_params_data(p), dt_params_data(q), sizeof(float) * np) == 0);
        step(g, x, t, B, OUT);
        double eo = rel(dt_graph_output(g), dt_graph_output(plain), B * OUT);
        double eg = rel(dt_params_grads(p), dt_params_grads(q), np);
        if (!CHECK(eo < 1e-5 && eg < 1e-5))
            fprintf(stderr, "     %d threads: output off by %.3g, gradient by %.3g\n", threads, eo,
                    eg);
        dt_graph_free(g);
    }
    dt_graph_free(plain);
}

static void not_fused(void) {
    check_current    = "not fused";
    dt_graph      *g = NULL;
    dt_layer      *l;
    dt_conv2d_opts co = pad1();
    // the ReLU read twice
    CHECK_OK(dt_graph_new(&g, NULL));
    CHECK_OK(dt_graph_input(g, "x", &(dt_shape){3, {C, H, H, 1}, DT_ELEM_F32}));
    CHECK_OK(dt_layer_conv2d_new(&l, C, K, 3, 3, &co));
    CHECK_OK(dt_graph_add(g, "c", l, "x"));
    CHECK_OK(dt_layer_act_new(&l, DT_ACT_RELU, NULL));
    CHECK_OK(dt_graph_add(g, "r", l, "c"));
    CHECK_OK(dt_layer_maxpool2d_new(&l, 2, 2, NULL));
    CHECK_OK(dt_graph_add(g, "p", l, "r"));
    CHECK_OK(dt_layer_avgpool2d_new(&l, 2, 2, NULL));
    CHECK_OK(dt_graph_add(g, "a", l, "r"));
    CHECK_OK(dt_layer_add_new(&l, NULL));
    CHECK_OK(dt_graph_add(g, "s", l, "p", "a"));
    CHECK_OK(dt_graph_finalize(g, 1));
    CHECK_EQ(dt_graph_num_nodes(g), 5); // the pool not fused: the ReLU has two readers
    CHECK(strcmp(dt_graph_node_kind(g, 1), "conv2d+relu") == 0);
    dt_graph_free(g);
    // stride 2: the ReLU fuses, the pool does not (the fused pool needs stride 1)
    co.sh = co.sw = 2;
    CHECK_OK(dt_graph_new(&g, NULL));
    CHECK_OK(dt_graph_input(g, "x", &(dt_shape){3, {C, 2 * H, 2 * H, 1}, DT_ELEM_F32}));
    CHECK_OK(dt_layer_conv2d_new(&l, C, K, 3, 3, &co));
    CHECK_OK(dt_graph_add(g, "c", l, "x"));
    CHECK_OK(dt_layer_act_new(&l, DT_ACT_RELU, NULL));
    CHECK_OK(dt_graph_add(g, "r", l, "c"));
    CHECK_OK(dt_layer_maxpool2d_new(&l, 2, 2, NULL));
    CHECK_OK(dt_graph_add(g, "p", l, "r"));
    CHECK_OK(dt_graph_finalize(g, 1));
    CHECK_EQ(dt_graph_num_nodes(g), 3);
    CHECK(strcmp(dt_graph_node_kind(g, 1), "conv2d+relu") == 0);
    CHECK(strcmp(dt_graph_node_kind(g, 2), "maxpool2d") == 0);
    dt_graph_free(g);
    // DT_NO_POOL_FUSION=1: the ReLU only
    setenv("DT_NO_POOL_FUSION", "1", 1);
    g = convnet(false, 1);
    CHECK_EQ(dt_graph_num_nodes(g), 5);
    CHECK(strcmp(dt_graph_node_kind(g, 1), "conv2d+relu") == 0);
    dt_graph_free(g);
    unsetenv("DT_NO_POOL_FUSION");
}

// ------------------------------------------------------------------ gradient shards

enum { SB = 32, SH = 8, F1 = 12, F2 = 4 };

static dt_graph *shard_net(int threads, int shards) {
    dt_graph      *g = NULL;
    dt_layer      *l;
    dt_conv2d_opts co = dt_conv2d_opts_default();
    CHECK_OK(dt_graph_new(&g, NULL));
    CHECK_OK(dt_graph_input(g, "x", &(dt_shape){3, {1, SH, SH, 1}, DT_ELEM_F32}));
    CHECK_OK(dt_layer_conv2d_new(&l, 1, 3, 3, 3, &co)); // 6x6, pooled to 3x3
    CHECK_OK(dt_graph_add(g, "c", l, "x"));
    CHECK_OK(dt_layer_act_new(&l, DT_ACT_RELU, NULL));
    CHECK_OK(dt_graph_add(g, "r", l, "c"));
    CHECK_OK(dt_layer_maxpool2d_new(&l, 2, 2, NULL));
    CHECK_OK(dt_graph_add(g, "p", l, "r"));
    CHECK_OK(dt_layer_flatten_new(&l, NULL));
    CHECK_OK(dt_graph_add(g, "f", l, "p"));
    CHECK_OK(dt_layer_linear_new(&l, 27, F1, NULL));
    CHECK_OK(dt_graph_add(g, "fc1", l, "f"));
    CHECK_OK(dt_layer_act_new(&l, DT_ACT_GELU, NULL));
    CHECK_OK(dt_graph_add(g, "g", l, "fc1"));
    CHECK_OK(dt_layer_dropout_new(&l, 0.25f, NULL));
    CHECK_OK(dt_graph_add(g, "d", l, "g"));
    CHECK_OK(dt_layer_linear_new(&l, F1, F2, NULL));
    CHECK_OK(dt_graph_add(g, "fc2", l, "d"));
    CHECK_OK(dt_graph_finalize(g, 5));
    CHECK_OK(dt_graph_set_threads(g, threads));
    CHECK_OK(dt_graph_set_grad_shards(g, shards));
    return g;
}

typedef struct sdata {
    float    x[SB * SH * SH], t[SB * F2];
    uint64_t key[SB];
} sdata;

// A step on positions first, first + stride, ... (n of them), the loss a mean over them.
static void sstep(dt_graph *g, const sdata *d, int first, int stride, int n) {
    static float x[SB * SH * SH], t[SB * F2];
    uint64_t     key[SB];
    for (int j = 0; j < n; j++) {
        int p = first + stride * j;
        memcpy(x + j * SH * SH, d->x + p * SH * SH, sizeof(float) * SH * SH);
        memcpy(t + j * F2, d->t + p * F2, sizeof(float) * F2);
        key[j] = d->key[p];
    }
    dt_rng epoch = dt_rng_init(9);
    dt_graph_set_rng(g, &epoch);
    CHECK_OK(dt_graph_set_sample_keys(g, key, n));
    step(g, x, t, n, F2);
}

static bool same_bits(const float *a, const float *b, size_t n, const char *what) {
    for (size_t i = 0; i < n; i++)
        if (memcmp(&a[i], &b[i], sizeof(float)) != 0) {
            fprintf(stderr, "     %s: element %zu differs: %.9g vs %.9g\n", what, i, a[i], b[i]);
            return false;
        }
    return true;
}

static void shards(void) {
    check_current = "gradient shards";
    static sdata d;
    dt_rng       r = dt_rng_init(17);
    for (size_t i = 0; i < sizeof d.x / sizeof *d.x; i++)
        d.x[i] = dt_rng_normal(&r);
    for (size_t i = 0; i < sizeof d.t / sizeof *d.t; i++)
        d.t[i] = dt_rng_normal(&r);
    for (int i = 0; i < SB; i++)
        d.key[i] = 100 + 3 * (uint64_t)i;
    dt_graph *plain = shard_net(1, 0), *one = shard_net(1, 4);
    CHECK_EQ(dt_graph_grad_shards(one), 4);
    sstep(plain, &d, 0, 1, SB);
    sstep(one, &d, 0, 1, SB);
    size_t       n  = dt_params_numel(dt_graph_params(one));
    const float *g1 = dt_params_grads(dt_graph_params(one));
    CHECK(rel(g1, dt_params_grads(dt_graph_params(plain)), n) < 1e-5);
    for (int t = 2; t <= 3; t++) {
        dt_graph *g = shard_net(t, 4);
        for (int rep = 0; rep < 2; rep++) {
            sstep(g, &d, 0, 1, SB);
            if (!CHECK(same_bits(dt_params_grads(dt_graph_params(g)), g1, n, "gradient")))
                fprintf(stderr, "     %d threads vs 1\n", t);
        }
        dt_graph_free(g);
    }
    for (int N = 2; N <= 4; N *= 2) { // ranks: V / N shards each, tree over the ranks
        float *gr[4];
        for (int k = 0; k < N; k++) {
            dt_graph *g = shard_net(1 + k % 2, 4 / N);
            sstep(g, &d, k, N, SB / N);
            gr[k] = malloc(sizeof(float) * n);
            memcpy(gr[k], dt_params_grads(dt_graph_params(g)), sizeof(float) * n);
            dt_graph_free(g);
        }
        for (int h = N / 2; h >= 1; h /= 2)
            for (int k = 0; k < h; k++)
                for (size_t i = 0; i < n; i++)
                    gr[k][i] += gr[k + h][i];
        for (size_t i = 0; i < n; i++)
            gr[0][i] /= (float)N;
        if (!CHECK(same_bits(gr[0], g1, n, "ranks vs one process")))
            fprintf(stderr, "     %d ranks\n", N);
        for (int k = 0; k < N; k++)
            free(gr[k]);
    }
    // Without shards the same emulation differs in the last bits (what the shards fix).
    dt_graph *half = shard_net(1, 0);
    float    *h    = malloc(sizeof(float) * n);
    sstep(half, &d, 0, 2, SB / 2);
    memcpy(h, dt_params_grads(dt_graph_params(half)), sizeof(float) * n);
    sstep(half, &d, 1, 2, SB / 2);
    size_t differ = 0;
    for (size_t i = 0; i < n; i++)
        differ += (h[i] + dt_params_grads(dt_graph_params(half))[i]) / 2 !=
                  dt_params_grads(dt_graph_params(plain))[i];
    CHECK(differ > 0);
    free(h);
    dt_graph_free(half);
    CHECK_ERR(dt_graph_set_grad_shards(one, 65), DT_ERR_ARG, "1 to 64, found 65");
    dt_graph_free(one);
    dt_graph_free(plain);
}

int main(void) {
    RUN(fused_equals_unfused);
    RUN(not_fused);
    RUN(shards);
    return check_summary();
}
