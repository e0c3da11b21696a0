// test_gpt (GPU): the GPT's operations on the GPU against the CPU: token and position
// embeddings, LayerNorm, the qkv Linear, causal attention, GELU, the residual adds, the
// head tied to the token embedding, cross-entropy over the vocabulary (some positions
// ignored), dropout; one step in fp32 and in bf16 (cuBLAS's bf16 products against the
// CPU's), then AdamW steps with the GPT's options and a second group without decay.
#include "../lib/graphs.h"
#include "gpu_graph.h"

static dt_device *dev;

enum { T = 32, C = 64, H = 2, V = 256 };

static dt_graph *gpt(float drop) {
    dt_graph *g;
    if (dt_graph_new(&g, NULL) || tg_gpt(g, T, C, H, V, drop) || dt_graph_finalize(g, 17))
        return NULL;
    return g;
}

// The position input must be 0..T-1 per sample, as the programs feed it: the case's
// random indices below T are just as good for the comparison (any index into wpe).
static void test_step(void) {
    dt_graph *g = gpt(0.1f);
    CHECK(g != NULL);
    if (!g)
        return;
    // a row's logits come from C products (the head), the wte gradient from B T rows
    gpu_case c = {"GPT block, fp32",
                  4,
                  dt_loss_spec_default(DT_LOSS_CROSS_ENTROPY),
                  4.0 * C * C,
                  4.0 * T * 4 * C * 4,
                  false,
                  DT_PREC_FP32,
                  0};
    gpu_case_run(dev, g, &c, T, 21); // indices below T: valid tokens and positions
    c.name = "GPT block, evaluation (dropout off)";
    c.eval = true;
    gpu_case_run(dev, g, &c, T, 22);
    dt_graph_free(g);
}

// bf16: both sides round the Linear operands to bf16 and sum in fp32; the CPU's attention
// also multiplies in bf16 where its AVX512-BF16 path runs, the GPU's stays fp32: a
// further 2% of each tensor's largest value (bf16 keeps 8 bits: 0.4% a rounding).
static void test_bf16(void) {
    dt_graph *g = gpt(0.0f);
    CHECK(g != NULL);
    if (!g)
        return;
    gpu_case c = {"GPT block, bf16",
                  4,
                  dt_loss_spec_default(DT_LOSS_CROSS_ENTROPY),
                  4.0 * C * C,
                  4.0 * T * 4 * C * 4,
                  false,
                  DT_PREC_BF16,
                  0.02};
    gpu_case_run(dev, g, &c, T, 23);
    dt_graph_free(g);
}

// AdamW over the graph (betas 0.9, 0.95, weight decay 0.1 on matrices, none on biases
// and norms), five steps of training on both sides.
static void test_adamw(void) {
    dt_graph *gc = gpt(0.1f), *gg = gpt(0.1f);
    CHECK(gc && gg);
    if (!gc || !gg)
        return;
    dt_adam_opts ao = dt_adamw_opts_default();
    ao.lr = 1e-3f, ao.beta2 = 0.95f, ao.weight_decay = 0.1f;
    dt_optim           *oc, *og;
    dt_param_group_opts nd = dt_param_group_opts_default();
    nd.weight_decay        = 0.0f;
    CHECK_OK(dt_adamw_new(&oc, dt_graph_params(gc), &ao));
    CHECK_OK(dt_adamw_new(&og, dt_graph_params(gg), &ao));
    CHECK_OK(dt_optim_add_group(oc, dt_param_no_decay, NULL, &nd, NULL));
    CHECK_OK(dt_optim_add_group(og, dt_param_no_decay, NULL, &nd, NULL));
    dt_exec *e;
    CHECK_OK(dt_exec_new(&e, gg, dev, NULL));
    enum { B = 8 };
    int32_t      idx[B * T], pos[B * T], tgt[B * T];
    float        dout[B * T * V];
    dt_loss_spec ls  = dt_loss_spec_default(DT_LOSS_CROSS_ENTROPY);
    dt_rng       rng = dt_rng_init(3);
    float        lc = 0, lg = 0;
    for (int s = 0; s < B * T; s++)
        pos[s] = s % T;
    for (int k = 0; k < 5; k++) {
        gpu_fill_int(idx, B * T, 300 + (uint64_t)k, V);
        gpu_fill_int(tgt, B * T, 400 + (uint64_t)k, V);
        dt_exec_set_rng(e, &rng);
        CHECK_OK(dt_exec_zero_grad(e));
        CHECK_OK(dt_exec_train_step(e, (const void *[]){idx, pos}, tgt, B, &ls, &lg));
        CHECK_OK(dt_exec_grad_norm(e, &(float){0}));
        CHECK_OK(dt_exec_optim_step(e, og));
        dt_graph_set_rng(gc, &rng);
        dt_params_zero_grad(dt_graph_params(gc));
        CHECK_OK(dt_graph_forward(gc, (const void *[]){idx, pos}, B));
        CHECK_OK(
            dt_loss_cross_entropy_ex(dt_graph_output(gc), tgt, B * T, V, -100, 0.0f, &lc, dout));
        CHECK_OK(dt_graph_backward(gc, dout));
        dt_optim_step(oc);
        GPU_CLOSE("loss", &lg, &lc, 1, 1e4, 1e-5 * (k + 1));
    }
    float nc, ng;
    CHECK_OK(dt_grad_norm(dt_graph_params(gc), &nc));
    CHECK_OK(dt_exec_grad_norm(e, &ng));
    GPU_CLOSE("gradient norm", &ng, &nc, 1, 1e5, 1e-5);
    CHECK_OK(dt_exec_pull(e, DT_EXEC_PARAMS, og));
    // Adam's first steps move each parameter by about lr whatever its gradient's size,
    // so a gradient that rounding alone decides the sign of moves the two sides apart by
    // up to 2 lr a step: the parameters are compared to 2 lr x 5 steps, 1e-2, which is
    // 0.4% of the largest (about 3: wte's N(0, 1) draws); the losses above are the
    // sharp check
    size_t n = dt_params_numel(dt_graph_params(gc));
    GPU_CLOSE("parameters after 5 AdamW steps", dt_params_data(dt_graph_params(gg)),
              dt_params_data(dt_graph_params(gc)), n, 1e4, 0.004);
    dt_exec_free(e);
    dt_optim_free(oc), dt_optim_free(og);
    dt_graph_free(gc), dt_graph_free(gg);
}

int main(int argc, char **argv) {
    gpu_filter = argc > 1 ? argv[1] : NULL;
    if (!(dev = gpu_device()))
        return check_summary();
    GPU_RUN(test_step);
    GPU_RUN(test_bf16);
    GPU_RUN(test_adamw);
    return check_summary();
}
