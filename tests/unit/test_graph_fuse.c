// test_graph_fuse.c: dt_graph_fuse, the fusion of BatchNorm + ReLU and BatchNorm + Add +
// ReLU into one node (graph.h).
//
// - A graph with both patterns, a strided shortcut (its BatchNorm feeds the fused Add:
//   left alone) and a BatchNorm read twice (left alone) makes exactly two fusions, of
//   the expected kinds and names; the parameters and buffers keep the unfused graph's
//   names, order and initial values.
// - The fused graph computes what the unfused one does, in training (outputs, running
//   statistics, every parameter gradient, the input gradient) and in evaluation, with
//   1, 2 and 3 threads (BatchNorm shares its channels and rows out over the threads);
//   gradient-ready comes once per tensor.
// - Under a parameter-use consumer (ZeRO-3's hook), each fused node announces its
//   BatchNorm's tensors together, every tensor once per pass, and the results stay.
// - A BatchNorm with a tied parameter is not fused (an Add's other BatchNorm then is);
//   calls on a finalized graph or NULL fail clearly; a node added after the pass gets
//   a layer position of its own.
#include "../check.h"
#include "dtrain/graph.h"

#include <stdlib.h>
#include <string.h>

enum { C = 8, H = 6, W = 5, B = 7 };

static void add(dt_graph *g, const char *name, dt_layer *l, const char *a, const char *b) {
    if (b)
        CHECK_OK(dt_graph_add(g, name, l, a, b));
    else
        CHECK_OK(dt_graph_add(g, name, l, a));
}

static dt_layer *conv(int cin, int cout, int k, int stride) {
    dt_conv2d_opts o = dt_conv2d_opts_default();
    o.ph = o.pw = k / 2, o.sh = o.sw = stride, o.bias = false;
    dt_layer *l = NULL;
    CHECK_OK(dt_layer_conv2d_new(&l, cin, cout, k, k, &o));
    return l;
}
static dt_layer *bn(int c) {
    dt_layer *l = NULL;
    CHECK_OK(dt_layer_batchnorm2d_new(&l, c, NULL));
    return l;
}
static dt_layer *relu(void) {
    dt_layer *l = NULL;
    CHECK_OK(dt_layer_act_new(&l, DT_ACT_RELU, NULL));
    return l;
}
static dt_layer *sum(void) {
    dt_layer *l = NULL;
    CHECK_OK(dt_layer_add_new(&l, NULL));
    return l;
}

// x (4, H, W) -> c1 (3x3, s2) -> b1 -> r1 -> c2 -> b2 -> add(b2, sb) -> out (ReLU), with
// the shortcut sc (1x1, s2) -> sb; then b3 on out, read by r3 and by add2(b3, r3).
static dt_graph *build(void) {
    dt_graph *g = NULL;
    CHECK_OK(dt_graph_new(&g, NULL));
    CHECK_OK(dt_graph_input(g, "x", &(dt_shape){3, {4, H, W}, DT_ELEM_F32}));
    add(g, "c1", conv(4, C, 3, 2), "x", NULL);
    add(g, "b1", bn(C), "c1", NULL);
    add(g, "r1", relu(), "b1", NULL);
    add(g, "c2", conv(C, C, 3, 1), "r1", NULL);
    add(g, "b2", bn(C), "c2", NULL);
    add(g, "sc", conv(4, C, 1, 2), "x", NULL);
    add(g, "sb", bn(C), "sc", NULL);
    add(g, "add", sum(), "b2", "sb");
    add(g, "out", relu(), "add", NULL);
    add(g, "b3", bn(C), "out", NULL);
    add(g, "r3", relu(), "b3", NULL);
    add(g, "add2", sum(), "b3", "r3");
    return g;
}

static float *rnd(uint64_t seed, size_t n) {
    dt_rng r = dt_rng_init(seed);
    float *x = malloc(sizeof(float) * n);
    for (size_t i = 0; i < n; i++)
        x[i] = dt_rng_normal(&r);
    return x;
}

// max |a - b| over n floats, relative to max(1, max |b|)
static double rel_diff(const float *a, const float *b, size_t n) {
    double d = 0, m = 1;
    for (size_t i = 0; i < n; i++) {
        d = fmax(d, fabs((double)a[i] - b[i]));
        m = fmax(m, fabs((double)b[i]));
    }
    return d / m;
}

static dt_status on_ready(void *user, size_t off, size_t cnt) {
    (void)off, (void)cnt;
    ++*(int *)user;
    return DT_OK;
}

static void structure(void) {
    dt_graph *g = build(), *u = build();
    int       nf = -1, n0 = dt_graph_num_nodes(g);
    CHECK_OK(dt_graph_fuse(g, &nf));
    CHECK_EQ(nf, 2);
    CHECK_EQ(dt_graph_num_nodes(g), n0 - 3);
    CHECK_EQ(dt_graph_find(g, "b1"), -1);
    CHECK_EQ(dt_graph_find(g, "b2"), -1);
    CHECK_EQ(dt_graph_find(g, "add"), -1);
    CHECK(strcmp(dt_graph_node_kind(g, dt_graph_find(g, "r1")), "batchnorm2d_relu") == 0);
    CHECK(strcmp(dt_graph_node_kind(g, dt_graph_find(g, "out")), "batchnorm2d_add_relu") == 0);
    CHECK(strcmp(dt_graph_node_kind(g, dt_graph_find(g, "sb")), "batchnorm2d") == 0);
    CHECK(strcmp(dt_graph_node_kind(g, dt_graph_find(g, "b3")), "batchnorm2d") == 0);
    CHECK(strcmp(dt_graph_node_kind(g, dt_graph_find(g, "r3")), "relu") == 0);
    dt_params *pt = NULL; // the table before finalize: finalize's names and order
    CHECK_OK(dt_graph_param_table(g, false, &pt));
    CHECK_OK(dt_graph_finalize(g, 11));
    CHECK_OK(dt_graph_finalize(u, 11));
    dt_params *pg = dt_graph_params(g), *pu = dt_graph_params(u);
    CHECK_EQ(dt_params_count(pg), dt_params_count(pu));
    CHECK_EQ(dt_params_buffer_count(pg), dt_params_buffer_count(pu));
    for (int i = 0; i < dt_params_count(pg) && i < dt_params_count(pu); i++)
        if (!CHECK(strcmp(dt_params_info(pg, i)->name, dt_params_info(pu, i)->name) == 0))
            fprintf(stderr, "     tensor %d: %s vs %s\n", i, dt_params_info(pg, i)->name,
                    dt_params_info(pu, i)->name);
    for (int i = 0; i < dt_params_buffer_count(pg) && i < dt_params_buffer_count(pu); i++)
        CHECK(strcmp(dt_params_buffer_info(pg, i)->name, dt_params_buffer_info(pu, i)->name) == 0);
    CHECK_EQ(dt_params_numel(pg), dt_params_numel(pu));
    CHECK(memcmp(dt_params_data(pg), dt_params_data(pu), sizeof(float) * dt_params_numel(pu)) == 0);
    CHECK_EQ(dt_params_count(pt), dt_params_count(pg));
    for (int i = 0; i < dt_params_count(pt) && i < dt_params_count(pg); i++)
        CHECK(strcmp(dt_params_info(pt, i)->name, dt_params_info(pg, i)->name) == 0);
    dt_params_free(pt);
    dt_graph_free(g);
    dt_graph_free(u);
}

// One training step (and then an evaluation forward) of the fused graph with `threads`
// against the unfused graph with one thread.
static void same_results(int threads) {
    dt_graph *g = build(), *u = build();
    CHECK_OK(dt_graph_fuse(g, NULL));
    CHECK_OK(dt_graph_finalize(g, 5));
    CHECK_OK(dt_graph_finalize(u, 5));
    CHECK_OK(dt_graph_set_threads(g, threads));
    dt_graph_set_input_grad(g, true);
    dt_graph_set_input_grad(u, true);
    size_t nx = (size_t)B * 4 * H * W, ny = (size_t)B * dt_shape_numel(dt_graph_node_shape(u, -1));
    float *x = rnd(1, nx), *dy = rnd(2, ny);
    dt_params *pg = dt_graph_params(g), *pu = dt_graph_params(u);
    int        ready = 0;
    CHECK_OK(dt_params_add_grad_hook(pg, on_ready, &ready));
    for (dt_graph *m = g; m; m = m == g ? u : NULL) {
        CHECK_OK(dt_graph_forward(m, (const void *[]){x}, B));
        dt_params_zero_grad(dt_graph_params(m));
        CHECK_OK(dt_graph_backward(m, dy));
    }
    CHECK_EQ(ready, dt_params_count(pg));
    double tol = threads == 1 ? 1e-6 : 2e-5, d;
    if (!CHECK((d = rel_diff(dt_graph_output(g), dt_graph_output(u), ny)) <= tol))
        fprintf(stderr, "     output: %.3g\n", d);
    if (!CHECK((d = rel_diff(dt_params_grads(pg), dt_params_grads(pu), dt_params_numel(pu))) <=
               tol))
        fprintf(stderr, "     parameter gradients: %.3g\n", d);
    if (!CHECK((d = rel_diff(dt_params_buffers(pg), dt_params_buffers(pu),
                             dt_params_buffer_numel(pu))) <= tol))
        fprintf(stderr, "     running statistics: %.3g\n", d);
    if (!CHECK((d = rel_diff(dt_graph_input_grad(g, 0), dt_graph_input_grad(u, 0), nx)) <= tol))
        fprintf(stderr, "     input gradient: %.3g\n", d);
    dt_graph_train(g, false);
    dt_graph_train(u, false);
    CHECK_OK(dt_graph_forward(g, (const void *[]){x}, B));
    CHECK_OK(dt_graph_forward(u, (const void *[]){x}, B));
    if (!CHECK((d = rel_diff(dt_graph_output(g), dt_graph_output(u), ny)) <= tol))
        fprintf(stderr, "     evaluation output: %.3g\n", d);
    free(x);
    free(dy);
    dt_graph_free(g);
    dt_graph_free(u);
}

static void threads_1(void) {
    same_results(1);
}
static void threads_2(void) {
    same_results(2);
}
static void threads_3(void) {
    same_results(3);
}

// What a use consumer saw: per pass, how often each tensor was acquired, and whether
// the fused nodes' BatchNorm tensors came in one step.
typedef struct uses {
    int count[2][16];
    int pair_b1, pair_b2; // steps acquiring weight and bias of b1, of b2
    int ib1, ib2;         // b1.weight's and b2.weight's indices (bias: the next)
    int open;             // acquired and not yet released
} uses;

static dt_status on_use(void *user, dt_param_use what, bool backward, const int *t, int n) {
    uses *u = user;
    if (what == DT_USE_RELEASE)
        u->open -= n;
    if (what != DT_USE_ACQUIRE)
        return DT_OK;
    u->open += n;
    bool w1 = false, b1 = false, w2 = false, b2 = false;
    for (int i = 0; i < n; i++) {
        if (t[i] >= 0 && t[i] < 16)
            u->count[backward][t[i]]++;
        w1 = w1 || t[i] == u->ib1, b1 = b1 || t[i] == u->ib1 + 1;
        w2 = w2 || t[i] == u->ib2, b2 = b2 || t[i] == u->ib2 + 1;
    }
    u->pair_b1 += w1 && b1;
    u->pair_b2 += w2 && b2;
    return DT_OK;
}

static void announced(void) {
    dt_graph *g = build(), *h = build();
    for (dt_graph *m = g; m; m = m == g ? h : NULL) {
        CHECK_OK(dt_graph_fuse(m, NULL));
        CHECK_OK(dt_graph_finalize(m, 5));
        CHECK_OK(dt_graph_set_threads(m, 2));
    }
    dt_params *ph = dt_graph_params(h);
    uses       u = {.ib1 = dt_params_find(ph, "b1.weight"), .ib2 = dt_params_find(ph, "b2.weight")};
    CHECK(u.ib1 >= 0 && u.ib2 >= 0 && dt_params_find(ph, "b1.bias") == u.ib1 + 1);
    CHECK(dt_params_count(ph) <= 16);
    CHECK_OK(dt_params_set_use_hook(ph, on_use, &u));
    size_t nx = (size_t)B * 4 * H * W, ny = (size_t)B * dt_shape_numel(dt_graph_node_shape(g, -1));
    float *x = rnd(3, nx), *dy = rnd(4, ny);
    for (dt_graph *m = g; m; m = m == g ? h : NULL) {
        CHECK_OK(dt_graph_forward(m, (const void *[]){x}, B));
        dt_params_zero_grad(dt_graph_params(m));
        CHECK_OK(dt_graph_backward(m, dy));
    }
    for (int t = 0; t < dt_params_count(ph) && t < 16; t++)
        if (!CHECK(u.count[0][t] == 1 && u.count[1][t] == 1))
            fprintf(stderr, "     tensor %d acquired %d, %d times\n", t, u.count[0][t],
                    u.count[1][t]);
    CHECK_EQ(u.pair_b1, 2); // the fused r1, forward and backward
    CHECK_EQ(u.pair_b2, 2); // the fused out
    CHECK_EQ(u.open, 0);
    dt_params *pg = dt_graph_params(g);
    CHECK(rel_diff(dt_graph_output(h), dt_graph_output(g), ny) <= 1e-6);
    CHECK(rel_diff(dt_params_grads(ph), dt_params_grads(pg), dt_params_numel(pg)) <= 1e-6);
    free(x);
    free(dy);
    dt_graph_free(g);
    dt_graph_free(h);
}

static void edges(void) {
    dt_graph *g = build();
    CHECK_OK(dt_graph_tie(g, "b2.weight", "b1.weight"));
    int nf = -1;
    CHECK_OK(dt_graph_fuse(g, &nf));
    // b1 owns a tie, b2 is tied: neither fuses, so the Add's other input, sb, does
    CHECK_EQ(nf, 1);
    CHECK(strcmp(dt_graph_node_kind(g, dt_graph_find(g, "b1")), "batchnorm2d") == 0);
    CHECK(strcmp(dt_graph_node_kind(g, dt_graph_find(g, "b2")), "batchnorm2d") == 0);
    CHECK(strcmp(dt_graph_node_kind(g, dt_graph_find(g, "out")), "batchnorm2d_add_relu") == 0);
    CHECK_EQ(dt_graph_find(g, "sb"), -1);
    // a node after the pass: its own layer position, so finalize draws its init apart
    dt_layer *l = NULL;
    CHECK_OK(dt_layer_flatten_new(&l, NULL));
    CHECK_OK(dt_graph_add(g, "flat", l, "add2"));
    CHECK_OK(dt_layer_linear_new(&l, C * 3 * 3, 3, NULL));
    CHECK_OK(dt_graph_add(g, "fc", l, "flat"));
    CHECK_OK(dt_graph_finalize(g, 3));
    CHECK_ERR(dt_graph_fuse(g, NULL), DT_ERR_STATE, "not yet finalized");
    CHECK_ERR(dt_graph_fuse(NULL, &nf), DT_ERR_ARG, "expected a graph");
    dt_graph_free(g);
    dt_graph *f = build(), *u = build();
    CHECK_OK(dt_graph_fuse(f, NULL));
    for (dt_graph *m = f; m; m = m == f ? u : NULL) {
        CHECK_OK(dt_layer_flatten_new(&l, NULL));
        CHECK_OK(dt_graph_add(m, "flat", l, "add2"));
        CHECK_OK(dt_layer_linear_new(&l, C * 3 * 3, 3, NULL));
        CHECK_OK(dt_graph_add(m, "fc", l, "flat"));
        CHECK_OK(dt_graph_finalize(m, 3));
    }
    dt_params *pf = dt_graph_params(f), *pu = dt_graph_params(u);
    int        k = dt_params_find(pu, "fc.weight");
    CHECK(k >= 0 && dt_params_find(pf, "fc.weight") == k);
    if (k >= 0 && dt_params_find(pf, "fc.weight") == k)
        CHECK(memcmp(dt_params_data(pf) + dt_params_info(pf, k)->offset,
                     dt_params_data(pu) + dt_params_info(pu, k)->offset,
                     sizeof(float) * dt_params_info(pu, k)->count) == 0);
    dt_graph_free(f);
    dt_graph_free(u);
}

int main(void) {
    RUN(structure);
    RUN(threads_1);
    RUN(threads_2);
    RUN(threads_3);
    RUN(announced);
    RUN(edges);
    return check_summary();
}
