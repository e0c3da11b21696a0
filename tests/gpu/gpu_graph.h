// gpu_graph.h: one training step of a graph on the GPU (the executor) and on the CPU
// (the graph itself) from the same parameters, inputs and targets, compared tensor by
// tensor: the output, the loss, every parameter's gradient and the buffers (running
// statistics). A layer with parameters before the node under test turns the node's
// input gradient into that layer's weight gradient, so backward is checked whole.
#ifndef DTRAIN_TESTS_GPU_GRAPH_H
#define DTRAIN_TESTS_GPU_GRAPH_H

#include "gpu_check.h"

typedef struct gpu_case {
    const char  *name;
    int          batch;
    dt_loss_spec loss;
    double       L_out, L_grad; // the bound's reduction lengths (gpu_check.h)
    bool         eval;          // evaluation mode (dropout off, running statistics)
    dt_precision prec;
    double       rel; // a further allowance relative to a tensor's largest value (bf16)
} gpu_case;

// Random inputs for each graph input (floats in [-1, 1), or indices below `vocab`), and
// targets for the loss (classes, some ignored for cross-entropy; or floats).
static inline void gpu_case_data(dt_graph *g, const gpu_case *c, int vocab, uint64_t seed,
                                 void **in, int *nin, void **tgt, size_t *out_n) {
    *nin = 0;
    for (int i = 0; i < dt_graph_num_nodes(g); i++) {
        if (strcmp(dt_graph_node_kind(g, i), "input") != 0)
            continue;
        const dt_shape *s = dt_graph_node_shape(g, i);
        size_t          n = dt_shape_numel(s) * (size_t)c->batch;
        in[*nin]          = malloc(4 * n);
        if (s->dtype == DT_ELEM_I32)
            gpu_fill_int(in[*nin], n, seed + (uint64_t)i, vocab);
        else
            gpu_fill(in[*nin], n, seed + (uint64_t)i, -1, 1);
        (*nin)++;
    }
    const dt_shape *os = dt_graph_node_shape(g, -1);
    *out_n             = dt_shape_numel(os) * (size_t)c->batch;
    int classes        = 1;
    for (int k = os->ndim - 1; k >= 0 && classes == 1; k--)
        classes = (int)os->d[k];
    *tgt = malloc(4 * *out_n);
    if (c->loss.kind == DT_LOSS_MSE) {
        gpu_fill(*tgt, *out_n, seed + 99, -1, 1);
    } else {
        int32_t *t = *tgt;
        gpu_fill_int(t, *out_n / (size_t)classes, seed + 99, classes);
        if (c->loss.kind == DT_LOSS_CROSS_ENTROPY) // some rows ignored
            for (size_t r = 3; r < *out_n / (size_t)classes; r += 7)
                t[r] = c->loss.ignore_index;
    }
}

// The step on both devices and the comparisons. Returns the loss (CPU's).
static inline float gpu_case_run(dt_device *dev, dt_graph *g, const gpu_case *c, int vocab,
                                 uint64_t seed) {
    printf("# %s (batch %d%s)\n", c->name, c->batch, c->eval ? ", evaluation" : "");
    void      *in[8], *tgt;
    int        nin;
    size_t     out_n;
    dt_params *p  = dt_graph_params(g);
    size_t     np = dt_params_numel(p), nb = dt_params_buffer_numel(p);
    gpu_case_data(g, c, vocab, seed, in, &nin, &tgt, &out_n);
    float   *bufs0 = gpu_dup(dt_params_buffers(p), nb);
    uint64_t keys[512];
    for (int s = 0; s < c->batch && s < 512; s++)
        keys[s] = 1000003u * (uint64_t)s + seed;
    dt_rng rng = dt_rng_init(seed ^ 0x5eed);
    // GPU
    dt_exec_opts o = dt_exec_opts_default();
    o.cuda_graph = 0, o.precision = c->prec;
    dt_exec *x;
    float    gl = NAN, cl = NAN;
    float   *gout = malloc(sizeof(float) * out_n), *ggrad = malloc(sizeof(float) * (np ? np : 1));
    float   *gbuf = malloc(sizeof(float) * (nb ? nb : 1));
    CHECK_OK(dt_exec_new(&x, g, dev, &o));
    dt_exec_train(x, !c->eval);
    dt_exec_set_rng(x, &rng);
    CHECK_OK(dt_exec_set_sample_keys(x, keys, c->batch));
    CHECK_OK(dt_exec_train_step(x, (const void *const *)in, tgt, c->batch, &c->loss, &gl));
    CHECK_OK(dt_exec_output(x, gout, out_n));
    CHECK_OK(dt_exec_pull(x, DT_EXEC_GRADS | DT_EXEC_BUFFERS, NULL));
    memcpy(ggrad, dt_params_grads(p), sizeof(float) * np);
    if (nb)
        memcpy(gbuf, dt_params_buffers(p), sizeof(float) * nb);
    dt_exec_free(x);
    // CPU, from the same starting buffers
    if (nb)
        memcpy(dt_params_buffers(p), bufs0, sizeof(float) * nb);
    CHECK_OK(dt_graph_set_precision(g, c->prec));
    dt_graph_train(g, !c->eval);
    dt_graph_set_rng(g, &rng);
    CHECK_OK(dt_graph_set_sample_keys(g, keys, c->batch));
    dt_params_zero_grad(p);
    CHECK_OK(dt_graph_forward(g, (const void *const *)in, c->batch));
    float          *dout    = malloc(sizeof(float) * out_n);
    const float    *y       = dt_graph_output(g);
    const dt_shape *os      = dt_graph_node_shape(g, -1);
    int             classes = 1;
    for (int k = os->ndim - 1; k >= 0 && classes == 1; k--)
        classes = (int)os->d[k];
    int rows = (int)(out_n / (size_t)classes);
    if (c->loss.kind == DT_LOSS_NLL)
        CHECK_OK(dt_loss_nll(y, tgt, rows, classes, &cl, dout));
    else if (c->loss.kind == DT_LOSS_CROSS_ENTROPY)
        CHECK_OK(dt_loss_cross_entropy_ex(y, tgt, rows, classes, c->loss.ignore_index,
                                          c->loss.label_smoothing, &cl, dout));
    else
        CHECK_OK(dt_loss_mse(y, tgt, out_n, &cl, dout));
    GPU_CLOSE("output", gout, y, out_n, c->L_out, c->rel);
    GPU_CLOSE("loss", &gl, &cl, 1, (double)out_n, c->rel);
    for (size_t i = 0; c->loss.grad_scale != 1.0f && i < out_n; i++)
        dout[i] *= c->loss.grad_scale; // as the executor scales its loss gradient
    CHECK_OK(dt_graph_backward(g, dout));
    for (int t = 0; t < dt_params_count(p); t++) {
        const dt_param_info *pi = dt_params_info(p, t);
        char                 what[96];
        snprintf(what, sizeof what, "grad %s", pi->name);
        GPU_CLOSE(what, ggrad + pi->offset, dt_params_grads(p) + pi->offset, pi->count, c->L_grad,
                  c->rel);
    }
    for (int t = 0; t < dt_params_buffer_count(p); t++) {
        const dt_param_info *pi = dt_params_buffer_info(p, t);
        char                 what[96];
        snprintf(what, sizeof what, "buffer %s", pi->name);
        GPU_CLOSE(what, gbuf + pi->offset, dt_params_buffers(p) + pi->offset, pi->count, c->L_grad,
                  c->rel);
    }
    for (int k = 0; k < nin; k++)
        free(in[k]);
    free(tgt), free(dout), free(gout), free(ggrad), free(gbuf), free(bufs0);
    return cl;
}

#endif // DTRAIN_TESTS_GPU_GRAPH_H
