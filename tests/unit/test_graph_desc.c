// test_graph_desc: dt_graph_describe (graph.h) gives every built-in layer's kind and
// hyper-parameters as an executor on another device needs them: a Sequential model's
// layers and their fused forms, a graph's own layers, dt_graph_fuse's BatchNorm forms,
// ties; and refuses a user's layer, naming it.
#include "../check.h"
#include "../lib/graphs.h"
#include "dtrain/graph.h"
#include "dtrain/nn.h"

static int find(dt_graph *g, const char *name) {
    return dt_graph_find(g, name);
}

// The seed's ConvNet as a dt_model: conv+relu, conv+relu+pool fused, dropouts, linear.
static void test_sequential(void) {
    dt_model *m;
    CHECK_OK(dt_model_new(&m, 1, 28, 28));
    CHECK_OK(dt_model_add_conv2d(m, 16, 3, 1, 0));
    CHECK_OK(dt_model_add_relu(m));
    CHECK_OK(dt_model_add_conv2d(m, 32, 3, 1, 1));
    CHECK_OK(dt_model_add_relu(m));
    CHECK_OK(dt_model_add_maxpool2d(m, 2, 0));
    CHECK_OK(dt_model_add_dropout2d(m, 0.1f));
    CHECK_OK(dt_model_add_flatten(m));
    CHECK_OK(dt_model_add_linear(m, 64));
    CHECK_OK(dt_model_add_relu(m));
    CHECK_OK(dt_model_add_dropout(m, 0.25f));
    CHECK_OK(dt_model_add_linear(m, 10));
    CHECK_OK(dt_model_add_log_softmax(m));
    CHECK_OK(dt_model_finalize(m, 1));
    dt_graph *g = dt_model_graph(m);
    CHECK(g != NULL);
    int n = dt_graph_num_nodes(g), convs = 0, kinds_seen = 0;
    CHECK_EQ(dt_graph_output_node(g), n - 1);
    for (int i = 0; i < n; i++) {
        dt_node_desc d;
        CHECK_OK(dt_graph_describe(g, i, &d));
        if (i == 0) {
            CHECK(strcmp(d.kind, "input") == 0);
            CHECK_EQ(d.layer_no, -1);
            continue;
        }
        CHECK_EQ(d.nin, 1);
        CHECK_EQ(d.in[0], i - 1);
        if (strcmp(d.kind, "conv2d") == 0) {
            convs++;
            CHECK(d.h.conv.relu); // both convolutions absorbed their ReLU
            CHECK_EQ(d.h.conv.kh, 3);
            CHECK_EQ(d.h.conv.groups, 1);
            CHECK(d.h.conv.bias);
            CHECK_EQ(d.nparams, 2);
            if (convs == 1) {
                CHECK_EQ(d.h.conv.cin, 1);
                CHECK_EQ(d.h.conv.cout, 16);
                CHECK(!d.h.conv.pool2);
                CHECK_EQ(d.out_shape.d[1], 26);
            } else {
                CHECK_EQ(d.h.conv.cin, 16);
                CHECK_EQ(d.h.conv.ph, 1);
                CHECK(d.h.conv.pool2); // and the pool after it
                CHECK_EQ(d.out_shape.d[1], 13);
            }
            kinds_seen |= 1;
        } else if (strcmp(d.kind, "dropout2d") == 0) {
            CHECK_NEAR(d.h.dropout.p, 0.1, 1e-7);
            kinds_seen |= 2;
        } else if (strcmp(d.kind, "dropout") == 0) {
            CHECK_NEAR(d.h.dropout.p, 0.25, 1e-7);
            kinds_seen |= 4;
        } else if (strcmp(d.kind, "linear") == 0) {
            CHECK(d.h.linear.in == 32 * 13 * 13 || d.h.linear.in == 64);
            CHECK(d.h.linear.bias);
            kinds_seen |= 8;
        } else if (strcmp(d.kind, "log_softmax") == 0) {
            CHECK_EQ(dt_shape_numel(&d.out_shape), 10);
            kinds_seen |= 16;
        }
    }
    CHECK_EQ(convs, 2);
    CHECK_EQ(kinds_seen, 31);
    dt_node_desc d;
    CHECK_ERR(dt_graph_describe(g, n, &d), DT_ERR_ARG, "no node");
    dt_model_free(m);
}

// A GPT block's kinds, and the head tied to the token embedding (one tensor index).
static void test_gpt(void) {
    dt_graph *g;
    CHECK_OK(dt_graph_new(&g, NULL));
    CHECK_OK(tg_gpt(g, 8, 16, 2, 32, 0.1f));
    dt_node_desc d;
    CHECK_ERR(dt_graph_describe(g, 0, &d), DT_ERR_STATE, "finalized");
    CHECK_OK(dt_graph_finalize(g, 3));
    dt_node_desc wte, head, attn, ln, drop, gelu, emb;
    CHECK_OK(dt_graph_describe(g, find(g, "wte"), &wte));
    CHECK_OK(dt_graph_describe(g, find(g, "head"), &head));
    CHECK_OK(dt_graph_describe(g, find(g, "h.attn"), &attn));
    CHECK_OK(dt_graph_describe(g, find(g, "h.ln1"), &ln));
    CHECK_OK(dt_graph_describe(g, find(g, "drop"), &drop));
    CHECK_OK(dt_graph_describe(g, find(g, "h.gelu"), &gelu));
    CHECK_OK(dt_graph_describe(g, find(g, "emb"), &emb));
    CHECK(strcmp(wte.kind, "embedding") == 0);
    CHECK_EQ(wte.h.emb.num, 32);
    CHECK_EQ(wte.h.emb.d, 16);
    CHECK_EQ(wte.in_shape[0].dtype, DT_ELEM_I32);
    CHECK(strcmp(head.kind, "linear") == 0);
    CHECK(!head.h.linear.bias);
    CHECK_EQ(head.params[0], wte.params[0]); // tied
    CHECK(strcmp(attn.kind, "attention") == 0);
    CHECK_EQ(attn.h.attn.heads, 2);
    CHECK(strcmp(ln.kind, "layernorm") == 0);
    CHECK_NEAR(ln.h.ln.eps, 1e-5, 1e-12);
    CHECK(ln.h.ln.affine);
    CHECK(strcmp(drop.kind, "dropout") == 0);
    CHECK_NEAR(drop.h.dropout.p, 0.1, 1e-7);
    CHECK(strcmp(gelu.kind, "gelu") == 0);
    CHECK(strcmp(emb.kind, "add") == 0);
    CHECK_EQ(emb.nin, 2);
    CHECK(drop.layer_no > wte.layer_no);
    dt_graph_free(g);
}

// A ResNet block after dt_graph_fuse: BatchNorm + ReLU, and BatchNorm + Add + ReLU.
static void test_resnet_fused(void) {
    dt_graph *g;
    CHECK_OK(dt_graph_new(&g, NULL));
    dt_batchnorm_opts bo = dt_batchnorm_opts_default();
    bo.momentum          = 0.2f;
    CHECK_OK(tg_resblock(g, 4, 6, 6, &bo));
    int fused = 0;
    CHECK_OK(dt_graph_fuse(g, &fused));
    CHECK_EQ(fused, 2);
    CHECK_OK(dt_graph_finalize(g, 5));
    dt_node_desc r1, out, c1;
    CHECK_OK(dt_graph_describe(g, find(g, "relu1"), &r1));
    CHECK_OK(dt_graph_describe(g, find(g, "out"), &out));
    CHECK_OK(dt_graph_describe(g, find(g, "conv1"), &c1));
    CHECK(strcmp(r1.kind, "batchnorm") == 0);
    CHECK(r1.h.bn.relu && !r1.h.bn.residual);
    CHECK_NEAR(r1.h.bn.momentum, 0.2, 1e-7);
    CHECK_EQ(r1.nbuffers, 2);
    CHECK(strcmp(out.kind, "batchnorm") == 0);
    CHECK(out.h.bn.relu && out.h.bn.residual);
    CHECK_EQ(out.nin, 2);
    CHECK(strcmp(c1.kind, "conv2d") == 0);
    CHECK(!c1.h.conv.bias && !c1.h.conv.relu);
    CHECK_EQ(c1.h.conv.ph, 1);
    dt_graph_free(g);
}

// Pools, flatten, concat, softmax, the activations.
static void test_misc(void) {
    dt_graph *g;
    dt_layer *l;
    CHECK_OK(dt_graph_new(&g, NULL));
    CHECK_OK(dt_graph_input(g, "x", &(dt_shape){3, {2, 8, 8, 1}, DT_ELEM_F32}));
    dt_pool2d_opts po = dt_pool2d_opts_default();
    po.sh = po.sw = 2, po.ph = po.pw = 1;
    CHECK_OK(dt_layer_maxpool2d_new(&l, 3, 3, &po));
    CHECK_OK(dt_graph_add(g, "mp", l, "x"));
    CHECK_OK(dt_layer_avgpool2d_new(&l, 2, 2, NULL));
    CHECK_OK(dt_graph_add(g, "ap", l, "x"));
    CHECK_OK(dt_layer_adaptive_avgpool2d_new(&l, 4, 4, NULL));
    CHECK_OK(dt_graph_add(g, "ad", l, "x"));
    CHECK_OK(dt_layer_concat_new(&l, 0, NULL));
    CHECK_OK(dt_graph_add(g, "cat", l, "ap", "ad"));
    CHECK_OK(dt_layer_act_new(&l, DT_ACT_SILU, NULL));
    CHECK_OK(dt_graph_add(g, "silu", l, "cat"));
    CHECK_OK(dt_layer_flatten_new(&l, NULL));
    CHECK_OK(dt_graph_add(g, "flat", l, "silu"));
    CHECK_OK(dt_layer_softmax_new(&l, NULL));
    CHECK_OK(dt_graph_add(g, "sm", l, "flat"));
    CHECK_OK(dt_graph_finalize(g, 1));
    dt_node_desc mp, ap, ad, cat, silu, flat, sm;
    CHECK_OK(dt_graph_describe(g, find(g, "mp"), &mp));
    CHECK_OK(dt_graph_describe(g, find(g, "ap"), &ap));
    CHECK_OK(dt_graph_describe(g, find(g, "ad"), &ad));
    CHECK_OK(dt_graph_describe(g, find(g, "cat"), &cat));
    CHECK_OK(dt_graph_describe(g, find(g, "silu"), &silu));
    CHECK_OK(dt_graph_describe(g, find(g, "flat"), &flat));
    CHECK_OK(dt_graph_describe(g, find(g, "sm"), &sm));
    CHECK(strcmp(mp.kind, "maxpool2d") == 0);
    CHECK(mp.h.pool.kh == 3 && mp.h.pool.sh == 2 && mp.h.pool.ph == 1);
    CHECK(strcmp(ap.kind, "avgpool2d") == 0);
    CHECK(ap.h.pool.kh == 2 && ap.h.pool.sh == 2 && ap.h.pool.ph == 0);
    CHECK(strcmp(ad.kind, "adaptive_avgpool2d") == 0);
    CHECK_EQ(ad.out_shape.d[1], 4);
    CHECK(strcmp(cat.kind, "concat") == 0);
    CHECK_EQ(cat.h.concat.dim, 0);
    CHECK_EQ(cat.out_shape.d[0], 4);
    CHECK(strcmp(silu.kind, "silu") == 0);
    CHECK(strcmp(flat.kind, "flatten") == 0);
    CHECK(strcmp(sm.kind, "softmax") == 0);
    dt_graph_free(g);
}

// A user's own layer: described as unsupported, naming the node and its kind.
static dt_status my_setup(const dt_layer *l, int nin, const dt_shape *in, dt_layer_setup *s) {
    (void)l, (void)nin;
    s->out = in[0];
    return DT_OK;
}
static dt_status my_pass(const dt_layer *l, const dt_layer_args *a) {
    (void)l, (void)a;
    return DT_OK;
}
static const dt_layer_ops my_ops = {"my_layer", my_setup, NULL, my_pass, my_pass, NULL};

static void test_user_layer(void) {
    dt_graph *g;
    dt_layer *l;
    CHECK_OK(dt_graph_new(&g, NULL));
    CHECK_OK(dt_graph_input(g, "x", &(dt_shape){1, {4, 1, 1, 1}, DT_ELEM_F32}));
    CHECK_OK(dt_layer_new(&l, &my_ops, dt_alloc_zero(8), NULL));
    CHECK_OK(dt_graph_add(g, "mine", l, "x"));
    CHECK_OK(dt_graph_finalize(g, 1));
    dt_node_desc d;
    CHECK_ERR(dt_graph_describe(g, 1, &d), DT_ERR_UNSUPPORTED,
              "node 'mine': layer kind \"my_layer\"");
    dt_graph_free(g);
}

int main(void) {
    RUN(test_sequential);
    RUN(test_gpt);
    RUN(test_resnet_fused);
    RUN(test_misc);
    RUN(test_user_layer);
    return check_summary();
}
