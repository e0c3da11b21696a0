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
// 2 threads: the shards' sums must still happen once per call. Each shard's declared
// split (dt_param_split) takes exactly its weights out of the unsplit tensor. Then the
// vocabulary split (embedding, tied head, cross-entropy) against the unsplit ones.
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
    // Each shard's declared split (params.h) finds its part of the unsplit tensor:
    // exactly the weights, and the whole shape back.
    for (int t = 0; t < dt_params_count(tpp); t++) {
        const dt_param_info *ti = dt_params_info(tpp, t);
        const dt_param_info *ri = dt_params_info(rp, dt_params_find(rp, ti->name));
        int64_t              whole[DT_PARAM_MAX_DIMS];
        dt_param_split_whole_shape(&ti->split, ti->ndim, ti->shape, whole);
        for (int d = 0; d < ti->ndim; d++)
            CHECK_EQ(whole[d], ri->shape[d]);
        CHECK_EQ(dt_param_split_on(&ti->split), ri->count != ti->count);
        float *part = malloc(sizeof(float) * ti->count);
        dt_param_split_copy(&ti->split, ti->ndim, ti->shape, dt_params_data(rp) + ri->offset, part,
                            false);
        CHECK(memcmp(part, dt_params_data(tpp) + ti->offset, sizeof(float) * ti->count) == 0);
        free(part);
    }
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

// The vocabulary split (Megatron's VocabParallelEmbedding, a column-parallel head tied
// to it, vocabulary-parallel cross-entropy): tokens -> wte -> LayerNorm -> head (tied to
// wte) -> logits -> cross-entropy with some targets ignored, unsplit and over the group.
// The loss is the same on every rank, and the shards' logits, logit gradients and wte
// gradients (both uses summed) are the unsplit ones' slices, to rounding; the
// embedding's output is exact (one shard adds its row to zeros).
enum { V = 12, D = 8, ROWS = 10 };

static void vocab_graph(dt_graph *g, dt_pg *tp) {
    dt_layer *l;
    CHECK_OK(dt_graph_input(g, "idx", &(dt_shape){1, {ROWS / 2}, DT_ELEM_I32}));
    if (tp) {
        dt_linear_tp_opts o = dt_linear_tp_opts_default();
        dt_tp_sum_opts(&o, tp);
        CHECK_OK(dt_layer_embedding_tp_new(&l, V, D, dt_pg_size(tp), dt_pg_rank(tp), &o));
        CHECK_OK(dt_graph_add(g, "wte", l, "idx"));
        CHECK_OK(dt_layer_layernorm_new(&l, D, NULL));
        CHECK_OK(dt_graph_add(g, "ln", l, "wte"));
        o.bias = false;
        CHECK_OK(
            dt_layer_linear_tp_new(&l, D, V, DT_TP_COLUMN, dt_pg_size(tp), dt_pg_rank(tp), &o));
    } else {
        CHECK_OK(dt_layer_embedding_new(&l, V, D, NULL));
        CHECK_OK(dt_graph_add(g, "wte", l, "idx"));
        CHECK_OK(dt_layer_layernorm_new(&l, D, NULL));
        CHECK_OK(dt_graph_add(g, "ln", l, "wte"));
        CHECK_OK(dt_layer_linear_new(&l, D, V, &(dt_linear_opts){.bias = false}));
    }
    CHECK_OK(dt_graph_add(g, "head", l, "ln"));
    CHECK_OK(dt_graph_tie(g, "head.weight", "wte.weight"));
    CHECK_OK(dt_graph_finalize(g, 5));
}

static void vocab(int rank, int world, void *arg) {
    (void)arg;
    dt_pg *pg = mp_pg_init(0);
    if (!CHECK(pg != NULL))
        return;
    dt_graph *ref = NULL, *tp = NULL;
    CHECK_OK(dt_graph_new(&ref, NULL));
    CHECK_OK(dt_graph_new(&tp, NULL));
    vocab_graph(ref, NULL);
    vocab_graph(tp, pg);
    int32_t idx[ROWS], tgt[ROWS];
    for (int i = 0; i < ROWS; i++) {
        idx[i] = (i * 5 + 3) % V;
        tgt[i] = i % 4 == 3 ? -100 : (i * 7 + 1) % V; // every 4th ignored
    }
    int   k = V / world, lo = rank * k;
    float rl = 0, tl = 0, *rd = malloc(sizeof(float) * ROWS * V),
          *td = malloc(sizeof(float) * ROWS * k);
    CHECK_OK(dt_graph_forward(ref, (const void *[]){idx}, 2));
    CHECK_OK(dt_graph_forward(tp, (const void *[]){idx}, 2));
    double err_e = 0, err_z = 0, err_d = 0, err_w = 0, sz = 0, sd = 0, sw = 0;
    for (int i = 0; i < ROWS * D; i++) // the embedding: exact
        err_e = fmax(err_e, fabs(dt_graph_node_output(ref, 1)[i] - dt_graph_node_output(tp, 1)[i]));
    CHECK_OK(dt_loss_cross_entropy_ex(dt_graph_output(ref), tgt, ROWS, V, -100, 0, &rl, rd));
    CHECK_OK(dt_tp_cross_entropy(pg, dt_graph_output(tp), tgt, ROWS, V, -100, &tl, td));
    for (int r = 0; r < ROWS; r++)
        for (int j = 0; j < k; j++) {
            err_z = fmax(
                err_z, fabs(dt_graph_output(ref)[r * V + lo + j] - dt_graph_output(tp)[r * k + j]));
            err_d = fmax(err_d, fabs(rd[r * V + lo + j] - td[r * k + j]));
            sz    = fmax(sz, fabs(dt_graph_output(ref)[r * V + lo + j]));
            sd    = fmax(sd, fabs(rd[r * V + lo + j]));
        }
    CHECK_OK(dt_graph_backward(ref, rd));
    CHECK_OK(dt_graph_backward(tp, td));
    dt_params *rp = dt_graph_params(ref), *tpp = dt_graph_params(tp);
    for (int t = 0; t < dt_params_count(tpp); t++) { // wte (both uses), LayerNorm
        const dt_param_info *ti = dt_params_info(tpp, t);
        const dt_param_info *ri = dt_params_info(rp, dt_params_find(rp, ti->name));
        float *pw = malloc(sizeof(float) * ti->count), *pg_ = malloc(sizeof(float) * ti->count);
        dt_param_split_copy(&ti->split, ti->ndim, ti->shape, dt_params_data(rp) + ri->offset, pw,
                            false);
        dt_param_split_copy(&ti->split, ti->ndim, ti->shape, dt_params_grads(rp) + ri->offset, pg_,
                            false);
        CHECK(memcmp(pw, dt_params_data(tpp) + ti->offset, sizeof(float) * ti->count) == 0);
        for (size_t e = 0; e < ti->count; e++) {
            err_w = fmax(err_w, fabs(pg_[e] - dt_params_grads(tpp)[ti->offset + e]));
            sw    = fmax(sw, fabs(pg_[e]));
        }
        free(pw), free(pg_);
    }
    CHECK(dt_param_split_on(&dt_params_info(tpp, 0)->split) == (world > 1));
    bool ok = CHECK(err_e == 0.0) && CHECK(fabs(rl - tl) <= 1e-6 * fabs(rl)) &&
              CHECK(err_z <= 1e-5 * sz) && CHECK(err_d <= 1e-5 * sd) && CHECK(err_w <= 1e-5 * sw);
    if (rank == 0 || !ok)
        fprintf(stderr,
                "%s vocabulary over %d: loss %.7f vs %.7f, |logits| %.2g, |dlogits| %.2g (scale "
                "%.2g), |dW| %.2g (scale %.2g)\n",
                ok ? "ok  " : "FAIL", world, (double)tl, (double)rl, err_z, err_d, sd, err_w, sw);
    // A target outside the vocabulary: refused on every rank, naming it.
    tgt[0] = V;
    CHECK_ERR(dt_tp_cross_entropy(pg, dt_graph_output(tp), tgt, ROWS, V, -100, &tl, td), DT_ERR_ARG,
              "target of row 0 is 12");
    free(rd), free(td);
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
    CHECK_ERR(dt_layer_embedding_tp_new(&l, 10, 4, 4, 0, NULL), DT_ERR_ARG, "divisible by parts 4");
    CHECK_ERR(dt_layer_embedding_tp_new(&l, 8, 4, 2, 0, NULL), DT_ERR_ARG, "need a reducer");
    float   lg[6] = {0, 1, 2, 3, 4, 5}, loss;
    int32_t tg[2] = {1, 2};
    CHECK_ERR(dt_tp_cross_entropy(NULL, lg, tg, 2, 0, -100, &loss, NULL), DT_ERR_ARG, "vocabulary");
    CHECK_OK(dt_tp_cross_entropy(NULL, lg, tg, 2, 3, -100, &loss, NULL)); // no group: whole
    float ref;
    CHECK_OK(dt_loss_cross_entropy_ex(lg, tg, 2, 3, -100, 0, &ref, NULL));
    CHECK(fabsf(loss - ref) < 1e-6f);
    // A split's copy puts each part where the whole keeps it: 2 groups of 4 rows over 2
    // parts, part 1 holds rows 2, 3 and 6, 7.
    dt_param_split sp    = {0, 2, 1, 2};
    float          w[16] = {0}, part[8] = {1, 1, 2, 2, 3, 3, 4, 4};
    dt_param_split_copy(&sp, 2, (int64_t[]){4, 2}, w, part, true);
    float want[16] = {0, 0, 0, 0, 1, 1, 2, 2, 0, 0, 0, 0, 3, 3, 4, 4};
    CHECK(memcmp(w, want, sizeof w) == 0);
}

// --precision bf16 reaches the shards (issue: it gave the fp32 result bit for bit): a
// column then a row shard (one part each: no reducer) in bf16 differ from fp32, by no
// more than bf16's rounding of both operands allows: each product's operands are
// rounded to 8 significant bits (2^-8 relative each), so an output differs by at most
// 2^-7 (plus fp32's own rounding, far smaller) of the sum of |x w| at each layer;
// through two layers, 2^-6 of the magnitudes is generous and 1e-7 differences would
// mean fp32 was kept.
static void precision(void) {
    enum { B = 8, IN = 32, MID = 64, OUT = 16 };
    float  out[2][B * OUT], x[B * IN];
    dt_rng r = dt_rng_init(3);
    for (int i = 0; i < B * IN; i++)
        x[i] = dt_rng_normal(&r);
    for (int k = 0; k < 2; k++) {
        dt_graph *g = NULL;
        dt_layer *l = NULL;
        CHECK_OK(dt_graph_new(&g, NULL));
        CHECK_OK(dt_graph_input(g, "x", &(dt_shape){1, {IN}, DT_ELEM_F32}));
        CHECK_OK(dt_layer_linear_tp_new(&l, IN, MID, DT_TP_COLUMN, 1, 0, NULL));
        CHECK_OK(dt_graph_add(g, "col", l, "x"));
        CHECK_OK(dt_layer_linear_tp_new(&l, MID, OUT, DT_TP_ROW, 1, 0, NULL));
        CHECK_OK(dt_graph_add(g, "row", l, "col"));
        CHECK_OK(dt_graph_finalize(g, 11));
        CHECK_OK(dt_graph_set_precision(g, k ? DT_PREC_BF16 : DT_PREC_FP32));
        CHECK_OK(dt_graph_forward(g, (const void *const[]){x}, B));
        memcpy(out[k], dt_graph_output(g), sizeof out[k]);
        dt_graph_free(g);
    }
    double diff = 0, mag = 0;
    for (int i = 0; i < B * OUT; i++) {
        diff = fmax(diff, fabs((double)out[1][i] - out[0][i]));
        mag  = fmax(mag, fabs((double)out[0][i]));
    }
    fprintf(stderr, "     tensor-parallel Linear, bf16 against fp32: %.3g (outputs up to %.3g)\n",
            diff, mag);
    CHECK(diff > 1e-4 * mag);             // rounded to bf16: not the fp32 result
    CHECK(diff < (1.0 / 64) * (mag + 1)); // within bf16's rounding of the operands
}

int main(void) {
    RUN(errors);
    RUN(precision);
    for (int tp = 2; tp <= 4; tp += 2) {
        check_current = tp == 2 ? "tp=2" : "tp=4";
        mp_opts o     = {.world = tp, .timeout_ms = 60000};
        MP_RUN(&o, ranks, NULL);
        check_current = tp == 2 ? "vocab tp=2" : "vocab tp=4";
        MP_RUN(&o, vocab, NULL);
    }
    return check_summary();
}
