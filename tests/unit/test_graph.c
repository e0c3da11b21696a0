// test_graph.c: the model graph's bookkeeping.
//
// - Dropout masks: a chain flatten -> dropout built as a graph draws, for the same
//   stream and sample keys, exactly the masks of the same Sequential dt_model (layer l
//   of the model and the l-th layer node share split(rng, l)), in training; evaluation
//   is the identity; another key gives another mask.
// - Batches of several sizes reuse or grow the buffers and give each sample the same
//   result as a batch of one.
#include "../check.h"
#include "dtrain/graph.h"
#include "dtrain/nn.h"

#include <stdlib.h>

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

int main(void) {
    masks();
    batches();
    return check_summary();
}
