// graphs.c: see graphs.h.
#include "graphs.h"

#include <stdio.h>

dt_status tg_resblock(dt_graph *g, int c, int h, int w, const dt_batchnorm_opts *bn) {
    dt_layer      *l;
    dt_conv2d_opts co = dt_conv2d_opts_default();
    co.ph = co.pw = 1;
    co.bias       = false;
    DT_TRY(dt_graph_input(g, "x", &(dt_shape){3, {c, h, w, 1}, DT_ELEM_F32}));
    DT_TRY(dt_layer_conv2d_new(&l, c, c, 3, 3, &co));
    DT_TRY(dt_graph_add(g, "conv1", l, "x"));
    DT_TRY(dt_layer_batchnorm2d_new(&l, c, bn));
    DT_TRY(dt_graph_add(g, "bn1", l, "conv1"));
    DT_TRY(dt_layer_act_new(&l, DT_ACT_RELU, NULL));
    DT_TRY(dt_graph_add(g, "relu1", l, "bn1"));
    DT_TRY(dt_layer_conv2d_new(&l, c, c, 3, 3, &co));
    DT_TRY(dt_graph_add(g, "conv2", l, "relu1"));
    DT_TRY(dt_layer_batchnorm2d_new(&l, c, bn));
    DT_TRY(dt_graph_add(g, "bn2", l, "conv2"));
    DT_TRY(dt_layer_add_new(&l, NULL));
    DT_TRY(dt_graph_add(g, "add", l, "bn2", "x"));
    DT_TRY(dt_layer_act_new(&l, DT_ACT_RELU, NULL));
    return dt_graph_add(g, "out", l, "add");
}

static dt_status add1(dt_graph *g, const char *prefix, const char *name, dt_layer *l,
                      const char *in) {
    char n[64], i[64];
    snprintf(n, sizeof n, "%s%s", prefix, name);
    snprintf(i, sizeof i, "%s", in);
    return dt_graph_add(g, n, l, i);
}

dt_status tg_block(dt_graph *g, const char *p, const char *in, int c, int heads) {
    dt_layer *l;
    char      a[64], b[64];
#define NAME(buf, s) (snprintf(buf, sizeof buf, "%s%s", p, s), buf)
    DT_TRY(dt_layer_layernorm_new(&l, c, NULL));
    DT_TRY(add1(g, p, "ln1", l, in));
    DT_TRY(dt_layer_linear_new(&l, c, 3 * c, NULL));
    DT_TRY(add1(g, p, "qkv", l, NAME(a, "ln1")));
    DT_TRY(dt_layer_attention_new(&l, heads, NULL));
    DT_TRY(add1(g, p, "attn", l, NAME(a, "qkv")));
    DT_TRY(dt_layer_linear_new(&l, c, c, NULL));
    DT_TRY(add1(g, p, "proj", l, NAME(a, "attn")));
    DT_TRY(dt_layer_add_new(&l, NULL));
    DT_TRY(dt_graph_add(g, NAME(b, "r1"), l, in, NAME(a, "proj")));
    DT_TRY(dt_layer_layernorm_new(&l, c, NULL));
    DT_TRY(add1(g, p, "ln2", l, NAME(a, "r1")));
    DT_TRY(dt_layer_linear_new(&l, c, 4 * c, NULL));
    DT_TRY(add1(g, p, "fc", l, NAME(a, "ln2")));
    DT_TRY(dt_layer_act_new(&l, DT_ACT_GELU, NULL));
    DT_TRY(add1(g, p, "gelu", l, NAME(a, "fc")));
    DT_TRY(dt_layer_linear_new(&l, 4 * c, c, NULL));
    DT_TRY(add1(g, p, "fc2", l, NAME(a, "gelu")));
    DT_TRY(dt_layer_add_new(&l, NULL));
    char r1[64];
    return dt_graph_add(g, NAME(b, "out"), l, NAME(r1, "r1"), NAME(a, "fc2"));
#undef NAME
}

dt_status tg_gpt(dt_graph *g, int t, int c, int heads, int vocab, float drop) {
    dt_layer *l;
    DT_TRY(dt_graph_input(g, "idx", &(dt_shape){1, {t, 1, 1, 1}, DT_ELEM_I32}));
    DT_TRY(dt_graph_input(g, "pos", &(dt_shape){1, {t, 1, 1, 1}, DT_ELEM_I32}));
    DT_TRY(dt_layer_embedding_new(&l, vocab, c, NULL));
    DT_TRY(dt_graph_add(g, "wte", l, "idx"));
    DT_TRY(dt_layer_embedding_new(&l, t, c, NULL));
    DT_TRY(dt_graph_add(g, "wpe", l, "pos"));
    DT_TRY(dt_layer_add_new(&l, NULL));
    DT_TRY(dt_graph_add(g, "emb", l, "wte", "wpe"));
    if (drop > 0) {
        DT_TRY(dt_layer_dropout_new(&l, drop, NULL));
        DT_TRY(dt_graph_add(g, "drop", l, "emb"));
    }
    DT_TRY(tg_block(g, "h.", drop > 0 ? "drop" : "emb", c, heads));
    DT_TRY(dt_layer_layernorm_new(&l, c, NULL));
    DT_TRY(dt_graph_add(g, "ln_f", l, "h.out"));
    dt_linear_opts lo = {.bias = false};
    DT_TRY(dt_layer_linear_new(&l, c, vocab, &lo));
    DT_TRY(dt_graph_add(g, "head", l, "ln_f"));
    return dt_graph_tie(g, "head.weight", "wte.weight");
}
