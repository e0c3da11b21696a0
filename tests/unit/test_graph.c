// test_graph.c: the model graph's bookkeeping.
//
// - Dropout masks: a chain flatten -> dropout built as a graph draws, for the same
//   stream and sample keys, exactly the masks of the same Sequential dt_model (layer l
//   of the model and the l-th layer node share split(rng, l)), in training; evaluation
//   is the identity; another key gives another mask.
// - Batches of several sizes reuse or grow the buffers and give each sample the same
//   result as a batch of one.
// - Threads: a GPT with dropout (masks keyed by sample position) and a ResNet block
//   (BatchNorm runs whole on the calling thread) give with 2 and 3 threads, batches not
//   divisible by them, the outputs of 1 thread and its gradients up to float rounding;
//   gradient-ready is still called once per tensor, and a graph's second step (partials
//   cleared) equals the first.
// - The per-node profile counts time and the layers' operations.
#include "../check.h"
#include "../lib/graphs.h"
#include "dtrain/graph.h"
#include "dtrain/nn.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

enum { F = 40, N = 5 };

static dt_graph *chain(void) {
    dt_graph *g = NULL;
    dt_layer *l;
    CHECK_OK(dt_graph_new(&g, NULL));
    CHECK_OK(dt_graph_input(g, "x", &(dt_shape){3, {F, 1, 1, 1}, DT_ELEM_F32}));
    CHECK_OK(dt_layer_flatten_new(&l, NULL));
    CHECK_OK(dt_graph_add(g, "0", l, "x"));
    CHECK_OK(dt_layer_dropout_new(&l, 0.4f, NULL));
    CHECK_OK(dt_graph_add(g, "1", l, "0"));
    CHECK_OK(dt_graph_finalize(g, 1));
    return g;
}

static void masks(void) {
    check_current = "dropout masks";
    dt_model *m   = NULL;
    dt_model_new(&m, F, 1, 1);
    CHECK(m != NULL);
    CHECK_OK(dt_model_add_flatten(m));
    CHECK_OK(dt_model_add_dropout(m, 0.4f));
    CHECK_OK(dt_model_finalize(m, 1));
    dt_graph *g = chain();
    float     x[N * F];
    for (int i = 0; i < N * F; i++)
        x[i] = 1.0f + (float)i;
    uint64_t keys[N] = {7, 123456, 3, 0, 99};
    dt_rng   r       = dt_rng_init(2024);
    dt_model_set_rng(m, &r);
    dt_graph_set_rng(g, &r);
    CHECK_OK(dt_model_set_sample_keys(m, keys, N));
    CHECK_OK(dt_graph_set_sample_keys(g, keys, N));
    CHECK_OK(dt_model_forward(m, x, N));
    CHECK_OK(dt_graph_forward(g, (const void *[]){x}, N));
    CHECK(memcmp(dt_model_output(m), dt_graph_output(g), sizeof x) == 0);
    int dropped = 0;
    for (int i = 0; i < N * F; i++)
        dropped += dt_graph_output(g)[i] == 0.0f;
    CHECK(dropped > N * F / 5 && dropped < N * F * 3 / 5); // p = 0.4 of them
    // Sample 0 keyed 7 alone in a batch of one: the same mask.
    CHECK_OK(dt_graph_set_sample_keys(g, keys, 1));
    CHECK_OK(dt_graph_forward(g, (const void *[]){x}, 1));
    CHECK(memcmp(dt_model_output(m), dt_graph_output(g), sizeof(float) * F) == 0);
    // Another key: another mask.
    uint64_t other = 8;
    CHECK_OK(dt_graph_set_sample_keys(g, &other, 1));
    CHECK_OK(dt_graph_forward(g, (const void *[]){x}, 1));
    CHECK(memcmp(dt_model_output(m), dt_graph_output(g), sizeof(float) * F) != 0);
    // A training batch that is not the keys' size is refused.
    CHECK_ERR(dt_graph_forward(g, (const void *[]){x}, 2), DT_ERR_ARG, "sample keys");
    dt_graph_train(g, false);
    CHECK_OK(dt_graph_forward(g, (const void *[]){x}, N));
    CHECK(memcmp(x, dt_graph_output(g), sizeof x) == 0);
    dt_graph_free(g);
    dt_model_free(m);
}

static void batches(void) {
    check_current = "batch sizes";
    dt_graph *g   = NULL;
    dt_layer *l;
    CHECK_OK(dt_graph_new(&g, NULL));
    CHECK_OK(dt_graph_input(g, "x", &(dt_shape){2, {3, 4, 1, 1}, DT_ELEM_F32}));
    CHECK_OK(dt_layer_layernorm_new(&l, 4, NULL));
    CHECK_OK(dt_graph_add(g, "ln", l, "x"));
    CHECK_OK(dt_layer_linear_new(&l, 4, 6, NULL));
    CHECK_OK(dt_graph_add(g, "fc", l, "ln"));
    CHECK_OK(dt_graph_finalize(g, 3));
    float  x[7 * 12], one[7 * 18];
    dt_rng r = dt_rng_init(1);
    for (int i = 0; i < 7 * 12; i++)
        x[i] = dt_rng_normal(&r);
    for (int s = 0; s < 7; s++) {
        CHECK_OK(dt_graph_forward(g, (const void *[]){x + s * 12}, 1));
        memcpy(one + s * 18, dt_graph_output(g), sizeof(float) * 18);
    }
    int sizes[] = {7, 2, 5};
    for (int k = 0; k < 3; k++) {
        CHECK_OK(dt_graph_forward(g, (const void *[]){x}, sizes[k]));
        CHECK(memcmp(one, dt_graph_output(g), sizeof(float) * 18 * (size_t)sizes[k]) == 0);
    }
    CHECK_EQ(dt_graph_num_nodes(g), 3);
    CHECK(strcmp(dt_graph_node_kind(g, 0), "input") == 0);
    CHECK(strcmp(dt_graph_node_kind(g, 2), "linear") == 0);
    CHECK_EQ(dt_graph_node_shape(g, -1)->d[1], 6);
    dt_graph_free(g);
}

typedef struct ready_count {
    size_t off[64];
    int    calls[64], n;
} ready_count;

static dt_status on_ready(void *user, size_t offset, size_t count) {
    (void)count;
    ready_count *r = user;
    for (int i = 0; i < r->n; i++)
        if (r->off[i] == offset) {
            r->calls[i]++;
            return DT_OK;
        }
    if (r->n < 64) {
        r->off[r->n]     = offset;
        r->calls[r->n++] = 1;
    }
    return DT_OK;
}

enum { GT = 8, GC = 16, GV = 24, GB = 7 };

// One forward + backward of a graph at `threads`; returns the output and gradient copies.
static void run_graph(dt_graph *g, int threads, const void *const *in, int batch, float *out,
                      size_t nout, float *grad, ready_count *rc) {
    CHECK_OK(dt_graph_set_threads(g, threads));
    CHECK_EQ(dt_graph_threads(g), threads);
    dt_params *p = dt_graph_params(g);
    if (rc)
        CHECK_OK(dt_params_add_grad_hook(p, on_ready, rc));
    for (int step = 0; step < 2; step++) { // the second step must equal the first
        CHECK_OK(dt_graph_forward(g, in, batch));
        float *dout = malloc(sizeof(float) * nout);
        for (size_t i = 0; i < nout; i++)
            dout[i] = (float)((i * 37) % 11) / 11.0f - 0.5f;
        dt_params_zero_grad(p);
        CHECK_OK(dt_graph_backward(g, dout));
        free(dout);
        if (step == 0) {
            memcpy(out, dt_graph_output(g), sizeof(float) * nout);
            memcpy(grad, dt_params_grads(p), sizeof(float) * dt_params_numel(p));
        } else {
            CHECK(memcmp(out, dt_graph_output(g), sizeof(float) * nout) == 0);
            CHECK(memcmp(grad, dt_params_grads(p), sizeof(float) * dt_params_numel(p)) == 0);
        }
        if (rc && step == 0) {
            CHECK_EQ(rc->n, dt_params_count(p));
            int once = 0;
            for (int i = 0; i < rc->n; i++)
                once += rc->calls[i] == 1;
            CHECK_EQ(once, rc->n);
            dt_params_remove_grad_hook(p, on_ready, rc);
        }
    }
}

static double max_rel(const float *a, const float *b, size_t n) {
    double m = 0, scale = 1e-3;
    for (size_t i = 0; i < n; i++)
        scale = fmax(scale, fabs(a[i]));
    for (size_t i = 0; i < n; i++)
        m = fmax(m, fabs((double)a[i] - b[i]) / scale);
    return m;
}

static void threads(void) {
    check_current = "threads: gpt";
    int32_t idx[GB * GT], pos[GB * GT];
    for (int i = 0; i < GB * GT; i++) {
        idx[i] = (i * 7 + 3) % GV;
        pos[i] = i % GT;
    }
    size_t nout = (size_t)GB * GT * GV;
    float *out[3], *grad[3];
    size_t np = 0;
    for (int k = 0; k < 3; k++) {
        dt_graph *g = NULL;
        CHECK_OK(dt_graph_new(&g, NULL));
        CHECK_OK(tg_gpt(g, GT, GC, 2, GV, 0.1f));
        CHECK_OK(dt_graph_finalize(g, 5));
        dt_rng r = dt_rng_init(77);
        dt_graph_set_rng(g, &r);
        np             = dt_params_numel(dt_graph_params(g));
        out[k]         = malloc(sizeof(float) * nout);
        grad[k]        = malloc(sizeof(float) * np);
        ready_count rc = {0};
        run_graph(g, k + 1, (const void *[]){idx, pos}, GB, out[k], nout, grad[k], &rc);
        dt_graph_free(g);
    }
    for (int k = 1; k < 3; k++) {
        CHECK(max_rel(out[0], out[k], nout) < 1e-5);
        CHECK(max_rel(grad[0], grad[k], np) < 1e-5);
        // Not trivially equal: the gradients are not all zero.
        double norm = 0;
        for (size_t i = 0; i < np; i++)
            norm += fabs(grad[k][i]);
        CHECK(norm > 1e-3);
    }
    for (int k = 0; k < 3; k++)
        free(out[k]), free(grad[k]);

    check_current = "threads: resblock (BatchNorm whole)";
    enum { RC = 4, RH = 6, RB = 5 };
    float  x[RB * RC * RH * RH];
    dt_rng r = dt_rng_init(9);
    for (size_t i = 0; i < sizeof x / sizeof *x; i++)
        x[i] = dt_rng_normal(&r);
    nout = sizeof x / sizeof *x;
    for (int k = 0; k < 2; k++) {
        dt_graph *g = NULL;
        CHECK_OK(dt_graph_new(&g, NULL));
        CHECK_OK(tg_resblock(g, RC, RH, RH, NULL));
        CHECK_OK(dt_graph_finalize(g, 5));
        np      = dt_params_numel(dt_graph_params(g));
        out[k]  = malloc(sizeof(float) * nout);
        grad[k] = malloc(sizeof(float) * np);
        run_graph(g, k ? 3 : 1, (const void *[]){x}, RB, out[k], nout, grad[k], NULL);
        dt_graph_free(g);
    }
    CHECK(max_rel(out[0], out[1], nout) < 1e-5);
    CHECK(max_rel(grad[0], grad[1], np) < 1e-5);
    for (int k = 0; k < 2; k++)
        free(out[k]), free(grad[k]);
    CHECK_ERR(dt_graph_set_threads(NULL, 2), DT_ERR_ARG, "threads");
}

// dt_graph_set_profile: time and operations per node, where the layers declare them
// (a 3x3 convolution of c -> c channels on h x w: 2 * 9 c^2 h w per sample; backward
// the same for the weight gradient and again for the input gradient where it is
// asked for: not for conv1, whose input is the graph's).
static void profile(void) {
    check_current = "profile";
    enum { PC = 4, PH = 5, PB = 3 };
    dt_graph *g = NULL;
    CHECK_OK(dt_graph_new(&g, NULL));
    CHECK_OK(tg_resblock(g, PC, PH, PH, NULL));
    CHECK_OK(dt_graph_finalize(g, 1));
    dt_graph_set_profile(g, true);
    float x[PB * PC * PH * PH], dy[PB * PC * PH * PH];
    for (int i = 0; i < PB * PC * PH * PH; i++)
        x[i] = (float)(i % 7) - 3.0f, dy[i] = (float)(i % 5) * 0.1f;
    for (int step = 0; step < 2; step++) {
        CHECK_OK(dt_graph_forward(g, (const void *[]){x}, PB));
        CHECK_OK(dt_graph_backward(g, dy));
    }
    double           conv = 2.0 * 9 * PC * PC * PH * PH * PB * 2; // two steps
    dt_graph_profile p1, p2, pb;
    CHECK_OK(dt_graph_node_profile(g, dt_graph_find(g, "conv1"), &p1));
    CHECK_OK(dt_graph_node_profile(g, dt_graph_find(g, "conv2"), &p2));
    CHECK_OK(dt_graph_node_profile(g, dt_graph_find(g, "bn1"), &pb));
    CHECK(p1.fwd_s > 0 && p1.bwd_s > 0 && pb.fwd_s > 0 && pb.bwd_s > 0);
    CHECK_NEAR(p1.fwd_flop, conv, 0.5);
    CHECK_NEAR(p1.bwd_flop, conv, 0.5); // no input gradient asked for
    CHECK_NEAR(p2.bwd_flop, 2 * conv, 0.5);
    CHECK_NEAR(pb.fwd_flop, 0, 0);
    dt_graph_set_profile(g, false); // clears
    CHECK_OK(dt_graph_node_profile(g, dt_graph_find(g, "conv1"), &p1));
    CHECK(p1.fwd_s == 0 && p1.fwd_flop == 0);
    CHECK_ERR(dt_graph_node_profile(g, 99, &p1), DT_ERR_ARG, "a node in [0,");
    dt_graph_free(g);
}

int main(void) {
    masks();
    batches();
    threads();
    profile();
    return check_summary();
}
