// test_tp.c: tensor parallelism (tp.h, dt_layer_linear_tp_new) in real processes.
//
// A pre-LN transformer block (LayerNorm, causal attention qkv -> attn -> proj, residual,
// LayerNorm, MLP fc -> GELU -> fc2, residual) is built once unsplit and once with its
// attention split by heads and its MLP column-then-row over tp = 2 and 4 ranks, both
// from the same seed, on the same input and output gradient. On every rank the
// shards' weights must be the slices of the unsplit weights (init), the output and the
// input gradient must equal the unsplit block's, and every weight gradient must equal
// its slice of the unsplit gradient, to rounding (1e-5 of scale; a missing all-reduce
// is off by the other shards' part, ~1e-1; a wrong slice by ~1). The tp graph runs on
// 2 threads: the shards' sums must still happen once per call.
#include "../check.h"
#include "../lib/mp.h"
#include "dtrain/tp.h"

#include <stdlib.h>

enum { T = 5, C = 16, HEADS = 4, HID = 32, N = 3 };

static void block(dt_graph *g, dt_pg *tp) {
    dt_layer *l;
    CHECK_OK(dt_graph_input(g, "x", &(dt_shape){2, {T, C, 1, 1}, DT_ELEM_F32}));
    CHECK_OK(dt_layer_layernorm_new(&l, C, NULL));
    CHECK_OK(dt_graph_add(g, "ln1", l, "x"));
    if (tp) {
        CHECK_OK(dt_tp_attention_add(g, "a.", "ln1", C, HEADS, tp));
    } else {
        CHECK_OK(dt_layer_linear_new(&l, C, 3 * C, NULL));
        CHECK_OK(dt_graph_add(g, "a.qkv", l, "ln1"));
        CHECK_OK(dt_layer_attention_new(&l, HEADS, NULL));
        CHECK_OK(dt_graph_add(g, "a.attn", l, "a.qkv"));
        CHECK_OK(dt_layer_linear_new(&l, C, C, NULL));
        CHECK_OK(dt_graph_add(g, "a.proj", l, "a.attn"));
    }
    CHECK_OK(dt_layer_add_new(&l, NULL));
    CHECK_OK(dt_graph_add(g, "r1", l, "x", "a.proj"));
    CHECK_OK(dt_layer_layernorm_new(&l, C, NULL));
    CHECK_OK(dt_graph_add(g, "ln2", l, "r1"));
    if (tp) {
        CHECK_OK(dt_tp_mlp_add(g, "m.", "ln2", C, HID, false, tp));
    } else {
        CHECK_OK(dt_layer_linear_new(&l, C, HID, NULL));
        CHECK_OK(dt_graph_add(g, "m.fc", l, "ln2"));
        CHECK_OK(dt_layer_act_new(&l, DT_ACT_GELU, NULL));
        CHECK_OK(dt_graph_add(g, "m.gelu", l, "m.fc"));
        CHECK_OK(dt_layer_linear_new(&l, HID, C, NULL));
        CHECK_OK(dt_graph_add(g, "m.fc2", l, "m.gelu"));
    }
    CHECK_OK(dt_layer_add_new(&l, NULL));
    CHECK_OK(dt_graph_add(g, "out", l, "r1", "m.fc2"));
    CHECK_OK(dt_graph_finalize(g, 11));
    dt_graph_set_input_grad(g, true);
}

// Element e of shard `part` of `parts` of tensor `ti` -> its index in the unsplit tensor
// `ri`: columns (qkv, fc) slice output rows (qkv per q/k/v block), rows (proj, fc2)
// slice input columns; replicated tensors map one to one.
static size_t unsplit_index(const dt_param_info *ti, const dt_param_info *ri, size_t e, int part,
                            int parts) {
    if (ti->count == ri->count)
        return e;
    bool column = strstr(ri->name, "qkv") || strstr(ri->name, "fc.");
    if (column) {
        int    groups = strstr(ri->name, "qkv") ? 3 : 1;
        size_t in     = ri->ndim == 2 ? (size_t)ri->shape[1] : 1;
        size_t row = e / in, col = e % in;
        size_t lo = (size_t)ri->shape[0] / (size_t)groups / (size_t)parts; // rows per group
        size_t g = row / lo, j = row % lo;
        return (g * lo * (size_t)parts + (size_t)part * lo + j) * in + col;
    }
    size_t in_l = (size_t)ti->shape[1], in = (size_t)ri->shape[1];
    return (e / in_l) * in + (size_t)part * in_l + e % in_l;
}

static void ranks(int rank, int world, void *arg) {
    (void)arg;
    dt_pg *pg = mp_pg_init(0);
    if (!CHECK(pg != NULL))
        return;
    dt_graph *ref = NULL, *tp = NULL;
    CHECK_OK(dt_graph_new(&ref, NULL));
    CHECK_OK(dt_graph_new(&tp, NULL));
    block(ref, NULL);
    block(tp, pg);
    CHECK_OK(dt_graph_set_threads(tp, 2));
    size_t n = (size_t)N * T * C;
    float *x = malloc(sizeof(float) * n), *dy = malloc(sizeof(float) * n);
    dt_rng r = dt_rng_init(3);
    for (size_t i = 0; i < n; i++) {
        x[i]  = dt_rng_uniform_range(&r, -1.0f, 1.0f);
        dy[i] = dt_rng_uniform_range(&r, -1.0f, 1.0f);
    }
    dt_params *rp = dt_graph_params(ref), *tpp = dt_graph_params(tp);
    for (int pass = 0; pass < 2; pass++) { // twice: the second accumulates
        CHECK_OK(dt_graph_forward(ref, (const void *[]){x}, N));
        CHECK_OK(dt_graph_forward(tp, (const void *[]){x}, N));
        CHECK_OK(dt_graph_backward(ref, dy));
        CHECK_OK(dt_graph_backward(tp, dy));
    }
    double err_y = 0, err_dx = 0, err_w = 0, err_g = 0, sy = 0, sg = 0;
    for (size_t i = 0; i < n; i++) {
        err_y  = fmax(err_y, fabs(dt_graph_output(ref)[i] - dt_graph_output(tp)[i]));
        err_dx = fmax(err_dx, fabs(dt_graph_input_grad(ref, 0)[i] - dt_graph_input_grad(tp, 0)[i]));
        sy     = fmax(sy, fabs(dt_graph_output(ref)[i]));
        sg     = fmax(sg, fabs(dt_graph_input_grad(ref, 0)[i]));
    }
    CHECK_EQ(dt_params_count(tpp), dt_params_count(rp));
    size_t shard = 0;
    for (int t = 0; t < dt_params_count(tpp); t++) {
        const dt_param_info *ti = dt_params_info(tpp, t);
        int                  k  = dt_params_find(rp, ti->name);
        if (!CHECK(k >= 0))
            continue;
        const dt_param_info *ri = dt_params_info(rp, k);
        if (ri->count != ti->count)
            shard += ti->count;
        CHECK_EQ(ri->count, ti->count * (ri->count == ti->count ? 1 : (size_t)world));
        for (size_t e = 0; e < ti->count; e++) {
            size_t u = ri->offset + unsplit_index(ti, ri, e, rank, world);
            err_w = fmax(err_w, fabs(dt_params_data(tpp)[ti->offset + e] - dt_params_data(rp)[u]));
            err_g =
                fmax(err_g, fabs(dt_params_grads(tpp)[ti->offset + e] - dt_params_grads(rp)[u]));
            sg = fmax(sg, fabs(dt_params_grads(rp)[u]));
        }
    }
    CHECK(shard > 0);
    CHECK(err_w == 0.0); // init: exact slices
    bool ok = CHECK(err_y <= 1e-5 * sy) && CHECK(err_dx <= 1e-5 * sg) && CHECK(err_g <= 1e-5 * sg);
    if (rank == 0 || !ok)
        fprintf(stderr,
                "%s tp=%d rank %d: |y| %.3g (scale %.3g), |dx| %.3g, |dW| %.3g (scale %.3g)\n",
                ok ? "ok  " : "FAIL", world, rank, err_y, sy, err_dx, err_g, sg);
    free(x);
    free(dy);
    dt_graph_free(ref);
    dt_graph_free(tp);
    dt_pg_free(pg);
}

static void errors(void) {
    dt_layer *l = NULL;
    CHECK_ERR(dt_layer_linear_tp_new(&l, 8, 6, DT_TP_COLUMN, 4, 0, NULL), DT_ERR_ARG,
              "divisible by the parts");
    CHECK_ERR(dt_layer_linear_tp_new(&l, 8, 8, DT_TP_ROW, 2, 0, NULL), DT_ERR_ARG,
              "need a reducer");
    CHECK_OK(dt_layer_linear_tp_new(&l, 8, 8, DT_TP_ROW, 1, 0, NULL)); // one shard: a Linear
    dt_layer_free(l);
}

int main(void) {
    RUN(errors);
    for (int tp = 2; tp <= 4; tp += 2) {
        check_current = tp == 2 ? "tp=2" : "tp=4";
        mp_opts o     = {.world = tp, .timeout_ms = 60000};
        MP_RUN(&o, ranks, NULL);
    }
    return check_summary();
}
