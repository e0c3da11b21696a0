// test_convnet (GPU): the seed's ConvNet (examples/mnist: conv, ReLU, conv, ReLU, max
// pool, Dropout2d, flatten, linear, ReLU, dropout, linear, log-softmax; NLL; Adadelta)
// trained on the GPU against the same model on the CPU: same initialisation, batches,
// dropout streams and sample keys.
//   - one step: the loss, every gradient and every parameter after the update, within
//     the bound of gpu_check.h;
//   - 50 steps: the losses and the final parameters. Rounding differences grow through
//     the updates, and no tight bound holds over many steps; the yardstick is the CPU
//     against itself with another summation order (2 threads instead of 1): the GPU
//     must stay within 10 times that distance, or within a floor: 1e-4 on a loss near
//     2.3, and 2e-5 of the largest parameter. Adadelta (lr 0.5, eps 1e-6) moves a
//     parameter by about lr sqrt(eps) = 5e-4 a step at first, so one step's gradient
//     wrong by its own size (a dropout mask drawn differently, a wrong index, a missed
//     gradient) moves parameters apart by that much, and the losses by 1e-2: far above
//     the floors, while 50 steps of rounding (1e-7 relative a step) stay far below;
//   - a step captured as a CUDA graph and replayed equals the steps run directly;
//   - SGD (momentum, Nesterov, weight decay), Adam and AdamW steps on the GPU against
//     the CPU's update rules.
#include "gpu_check.h"

static dt_device *dev;

enum { B = 64, STEPS = 50, PIX = 28 * 28, CLASSES = 10 };

static dt_model *convnet(uint64_t seed) {
    dt_model *m;
    if (dt_model_new(&m, 1, 28, 28) || dt_model_add_conv2d(m, 16, 3, 1, 0) ||
        dt_model_add_relu(m) || dt_model_add_conv2d(m, 32, 3, 1, 0) || dt_model_add_relu(m) ||
        dt_model_add_maxpool2d(m, 2, 0) || dt_model_add_dropout2d(m, 0.1f) ||
        dt_model_add_flatten(m) || dt_model_add_linear(m, 64) || dt_model_add_relu(m) ||
        dt_model_add_dropout(m, 0.25f) || dt_model_add_linear(m, CLASSES) ||
        dt_model_add_log_softmax(m) || dt_model_finalize(m, seed))
        return NULL;
    return m;
}

// Batch k: images in [-0.5, 2.5) (the normalised range), labels, sample keys.
static void batch_of(int k, float *x, int32_t *y, uint64_t *keys) {
    gpu_fill(x, (size_t)B * PIX, 1000 + (uint64_t)k, -0.5f, 2.5f);
    gpu_fill_int(y, B, 2000 + (uint64_t)k, CLASSES);
    for (int s = 0; s < B; s++)
        keys[s] = (uint64_t)k * B + (uint64_t)s * 7 + 1;
}

// A CPU step of m; the loss.
static float cpu_step(dt_model *m, dt_optim *o, const dt_rng *rng, int k, float *x, int32_t *y,
                      uint64_t *keys) {
    float loss, dl[B * CLASSES];
    batch_of(k, x, y, keys);
    dt_model_set_rng(m, rng);
    CHECK_OK(dt_model_set_sample_keys(m, keys, B));
    dt_model_zero_grad(m);
    CHECK_OK(dt_model_forward(m, x, B));
    CHECK_OK(dt_loss_nll(dt_model_output(m), y, B, CLASSES, &loss, dl));
    CHECK_OK(dt_model_backward(m, dl));
    if (o)
        dt_optim_step(o);
    return loss;
}

static float gpu_step(dt_exec *e, dt_optim *o, const dt_rng *rng, int k, float *x, int32_t *y,
                      uint64_t *keys) {
    float        loss = NAN;
    dt_loss_spec ls   = dt_loss_spec_default(DT_LOSS_NLL);
    batch_of(k, x, y, keys);
    dt_exec_set_rng(e, rng);
    CHECK_OK(dt_exec_set_sample_keys(e, keys, B));
    CHECK_OK(dt_exec_zero_grad(e));
    CHECK_OK(dt_exec_train_step(e, (const void *[]){x}, y, B, &ls, &loss));
    if (o)
        CHECK_OK(dt_exec_optim_step(e, o));
    return loss;
}

static float    xs[B * PIX];
static int32_t  ys[B];
static uint64_t ks[B];

static void test_one_step(void) {
    dt_model *c = convnet(1), *g = convnet(1);
    dt_rng    root = dt_rng_init(5), rng = dt_rng_split(&root, 3);
    dt_exec  *e;
    CHECK_OK(dt_exec_new(&e, dt_model_graph(g), dev, NULL));
    dt_adadelta_opts ao = dt_adadelta_opts_default();
    ao.lr               = 0.5f;
    dt_optim *oc, *og;
    CHECK_OK(dt_adadelta_new(&oc, dt_model_as_params(c), &ao));
    CHECK_OK(dt_adadelta_new(&og, dt_model_as_params(g), &ao));
    float lg = gpu_step(e, NULL, &rng, 0, xs, ys, ks);
    float lc = cpu_step(c, NULL, &rng, 0, xs, ys, ks);
    GPU_CLOSE("loss", &lg, &lc, 1, B * 10, 0);
    dt_params *pc = dt_model_as_params(c), *pg = dt_model_as_params(g);
    CHECK_OK(dt_exec_pull(e, DT_EXEC_GRADS, NULL));
    // The longest sum forming a gradient: a convolution's weight gradient over the batch's
    // pixels, 64 x 676 for conv1 (the sums before it, through the layers above, are
    // shorter: 64 for a Linear's, 32 x 9 for a col2im)
    const double L = (double)B * 676;
    for (int t = 0; t < dt_params_count(pc); t++) {
        const dt_param_info *pi = dt_params_info(pc, t);
        char                 what[80];
        snprintf(what, sizeof what, "grad %s", pi->name);
        GPU_CLOSE(what, dt_params_grads(pg) + pi->offset, dt_params_grads(pc) + pi->offset,
                  pi->count, L, 0);
    }
    CHECK_OK(dt_exec_optim_step(e, og));
    dt_optim_step(oc);
    CHECK_OK(dt_exec_pull(e, DT_EXEC_PARAMS | DT_EXEC_OPTIM, og));
    GPU_CLOSE("parameters after Adadelta", dt_params_data(pg), dt_params_data(pc),
              dt_params_numel(pc), L, 0);
    size_t ns, ns2;
    float *sg = dt_optim_state(og, &ns), *sc = dt_optim_state(oc, &ns2);
    CHECK_EQ(ns, ns2);
    // v = 0.1 g^2: twice the gradient's relative error
    GPU_CLOSE("Adadelta state", sg, sc, ns, 2 * L, 0);
    dt_exec_free(e);
    dt_optim_free(oc), dt_optim_free(og);
    dt_model_free(c), dt_model_free(g);
}

static double max_abs_diff(const float *a, const float *b, size_t n, double *scale) {
    double d = 0, m = 0;
    for (size_t i = 0; i < n; i++) {
        d = fmax(d, fabs((double)a[i] - b[i]));
        m = fmax(m, fabs((double)b[i]));
    }
    *scale = m;
    return d;
}

static void test_fifty_steps(void) {
    dt_model *c1 = convnet(2), *c2 = convnet(2), *g = convnet(2);
    CHECK_OK(dt_model_set_threads(c2, 2));
    dt_adadelta_opts ao = dt_adadelta_opts_default();
    ao.lr               = 0.5f;
    dt_optim *o1, *o2, *og;
    CHECK_OK(dt_adadelta_new(&o1, dt_model_as_params(c1), &ao));
    CHECK_OK(dt_adadelta_new(&o2, dt_model_as_params(c2), &ao));
    CHECK_OK(dt_adadelta_new(&og, dt_model_as_params(g), &ao));
    dt_exec *e;
    CHECK_OK(dt_exec_new(&e, dt_model_graph(g), dev, NULL));
    dt_rng rng       = dt_rng_init(9);
    double worst_cpu = 0, worst_gpu = 0;
    float  first = 0, last = 0;
    for (int k = 0; k < STEPS; k++) {
        float l1  = cpu_step(c1, o1, &rng, k, xs, ys, ks);
        float l2  = cpu_step(c2, o2, &rng, k, xs, ys, ks);
        float lg  = gpu_step(e, og, &rng, k, xs, ys, ks);
        worst_cpu = fmax(worst_cpu, fabs((double)l1 - l2));
        worst_gpu = fmax(worst_gpu, fabs((double)l1 - lg));
        if (k == 0)
            first = l1;
        last = l1;
    }
    CHECK_OK(dt_exec_pull(e, DT_EXEC_PARAMS, og));
    size_t n = dt_model_num_params(c1);
    double scale, dc = max_abs_diff(dt_model_params(c2), dt_model_params(c1), n, &scale);
    double dg     = max_abs_diff(dt_model_params(g), dt_model_params(c1), n, &scale);
    double floor_ = 2e-5 * scale;
    printf("# 50 steps: loss %.4f -> %.4f; losses differ by %.3g (CPU 1 vs 2 threads) and %.3g "
           "(GPU vs CPU); parameters by %.3g and %.3g (max |p| %.3g, floor %.3g)\n",
           (double)first, (double)last, worst_cpu, worst_gpu, dc, dg, scale, floor_);
    CHECK(worst_gpu <= 10 * worst_cpu + 1e-4);
    CHECK(dg <= 10 * dc + floor_);
    CHECK(isfinite(last));
    dt_exec_stats st;
    dt_exec_get_stats(e, &st);
    printf("# %lld steps, %lld replayed from a CUDA graph, %.1f MiB of device memory\n",
           (long long)st.steps, (long long)st.graph_replays, (double)st.device_bytes / (1 << 20));
    dt_exec_free(e);
    dt_optim_free(o1), dt_optim_free(o2), dt_optim_free(og);
    dt_model_free(c1), dt_model_free(c2), dt_model_free(g);
}

// The same steps with CUDA graphs (captured from the first, then replayed) and without.
static void test_cuda_graph(void) {
    dt_model    *a = convnet(4), *b = convnet(4);
    dt_exec     *ea, *eb;
    dt_exec_opts oa = dt_exec_opts_default(), ob = dt_exec_opts_default();
    oa.cuda_graph = 1, ob.cuda_graph = 0;
    CHECK_OK(dt_exec_new(&ea, dt_model_graph(a), dev, &oa));
    CHECK_OK(dt_exec_new(&eb, dt_model_graph(b), dev, &ob));
    dt_optim        *pa, *pb;
    dt_adadelta_opts ao = dt_adadelta_opts_default();
    CHECK_OK(dt_adadelta_new(&pa, dt_model_as_params(a), &ao));
    CHECK_OK(dt_adadelta_new(&pb, dt_model_as_params(b), &ao));
    dt_rng rng = dt_rng_init(4);
    for (int k = 0; k < 6; k++) {
        float la = gpu_step(ea, pa, &rng, k, xs, ys, ks);
        float lb = gpu_step(eb, pb, &rng, k, xs, ys, ks);
        GPU_SAME("loss with and without a CUDA graph", &la, &lb, 1);
    }
    CHECK_OK(dt_exec_pull(ea, DT_EXEC_PARAMS, pa));
    CHECK_OK(dt_exec_pull(eb, DT_EXEC_PARAMS, pb));
    GPU_SAME("parameters with and without a CUDA graph", dt_model_params(a), dt_model_params(b),
             dt_model_num_params(a));
    dt_exec_stats st;
    dt_exec_get_stats(ea, &st);
    printf("# replays: %lld of 6 steps\n", (long long)st.graph_replays);
    CHECK(st.graph_replays >= 5);
    dt_exec_free(ea), dt_exec_free(eb);
    dt_optim_free(pa), dt_optim_free(pb);
    dt_model_free(a), dt_model_free(b);
}

// One update of each rule from the same gradients: SGD (momentum, Nesterov, weight
// decay, two steps for the momentum buffer), Adam (amsgrad), AdamW with a second group.
static void optimizer_case(const char *name, dt_optim *(*make)(dt_params *)) {
    dt_model *c = convnet(6), *g = convnet(6);
    dt_optim *oc = make(dt_model_as_params(c)), *og = make(dt_model_as_params(g));
    dt_exec  *e;
    CHECK_OK(dt_exec_new(&e, dt_model_graph(g), dev, NULL));
    size_t n = dt_model_num_params(c);
    for (int step = 0; step < 3; step++) {
        gpu_fill(dt_model_grads(c), n, 50 + (uint64_t)step, -0.1f, 0.1f);
        memcpy(dt_model_grads(g), dt_model_grads(c), sizeof(float) * n);
        CHECK_OK(dt_exec_push(e, DT_EXEC_GRADS, NULL));
        CHECK_OK(dt_exec_optim_step(e, og));
        dt_optim_step(oc);
    }
    CHECK_OK(dt_exec_pull(e, DT_EXEC_PARAMS | DT_EXEC_OPTIM, og));
    char what[96];
    snprintf(what, sizeof what, "%s: parameters", name);
    GPU_CLOSE(what, dt_model_params(g), dt_model_params(c), n, 8, 0);
    size_t ns, ns2;
    float *sg = dt_optim_state(og, &ns), *sc = dt_optim_state(oc, &ns2);
    snprintf(what, sizeof what, "%s: state", name);
    if (ns)
        GPU_CLOSE(what, sg, sc, ns, 8, 0);
    CHECK_EQ(dt_optim_step_count(og), dt_optim_step_count(oc));
    dt_exec_free(e);
    dt_optim_free(oc), dt_optim_free(og);
    dt_model_free(c), dt_model_free(g);
}

static dt_optim *make_sgd(dt_params *p) {
    dt_sgd_opts o = {.lr = 0.1f, .momentum = 0.9f, .weight_decay = 1e-3f, .nesterov = true};
    dt_optim   *r = NULL;
    CHECK_OK(dt_sgd_new(&r, p, &o));
    return r;
}
static dt_optim *make_sgd_damp(dt_params *p) {
    dt_sgd_opts o = {.lr = 0.05f, .momentum = 0.5f, .dampening = 0.25f};
    dt_optim   *r = NULL;
    CHECK_OK(dt_sgd_new(&r, p, &o));
    return r;
}
static dt_optim *make_adam(dt_params *p) {
    dt_adam_opts o = dt_adam_opts_default();
    o.weight_decay = 1e-2f, o.amsgrad = true;
    dt_optim *r = NULL;
    CHECK_OK(dt_adam_new(&r, p, &o));
    return r;
}
static dt_optim *make_adamw(dt_params *p) {
    dt_adam_opts o = dt_adamw_opts_default();
    o.beta2 = 0.95f, o.lr = 3e-3f, o.weight_decay = 0.1f;
    dt_optim *r = NULL;
    CHECK_OK(dt_adamw_new(&r, p, &o));
    dt_param_group_opts nd = dt_param_group_opts_default();
    nd.weight_decay = 0.0f, nd.lr = 1e-3f;
    CHECK_OK(dt_optim_add_group(r, dt_param_no_decay, NULL, &nd, NULL));
    return r;
}

static void test_optimizers(void) {
    optimizer_case("SGD momentum 0.9, Nesterov, weight decay", make_sgd);
    optimizer_case("SGD momentum 0.5, dampening 0.25", make_sgd_damp);
    optimizer_case("Adam, amsgrad, weight decay", make_adam);
    optimizer_case("AdamW, two groups", make_adamw);
}

int main(int argc, char **argv) {
    gpu_filter = argc > 1 ? argv[1] : NULL;
    if (!(dev = gpu_device()))
        return check_summary();
    GPU_RUN(test_one_step);
    GPU_RUN(test_fifty_steps);
    GPU_RUN(test_cuda_graph);
    GPU_RUN(test_optimizers);
    return check_summary();
}
