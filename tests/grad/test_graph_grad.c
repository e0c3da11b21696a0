// test_graph_grad.c: dt_graph_backward against central finite differences of
// dt_graph_forward, for every parameter and float input of graphs that use fan-out (an
// activation read by three nodes, one of them reading it twice: Add(t, t)), Concat,
// weight tying (a GPT head tied to its token embedding), and every built-in layer:
// Conv2d (groups, rectangular), BatchNorm2d (training), Tanh, Sigmoid, SiLU, GELU
// (exact and tanh), MaxPool2d (on well-separated inputs), AvgPool2d, AdaptiveAvgPool2d, Flatten,
// Linear, BatchNorm1d, Dropout (keyed masks: fixed across forwards), Softmax, LayerNorm, Embedding,
// attention, and a user layer with two inputs written against layer.h. As
// tests/grad/test_grad_ops.c: L = sum(y * r), eps = 5e-3 on the float32
// forward with L summed in double; per tensor ||g - fd|| / ||fd|| < 2e-3 and every
// element within 1e-2 of max(1, max|fd|). (eps is half of the ops test's: BatchNorm1d
// over 8 samples curves enough that eps = 1e-2 leaves 3e-3 of truncation error, which
// shrinks as eps^2: 1.1e-2 at 2e-2, 2.8e-3 at 1e-2.)
#include "../check.h"
#include "../lib/graphs.h"

#include <stdlib.h>

static double EPS = 5e-3; // FD_EPS overrides
#define NERR_MAX 2e-3
#define ELEM_MAX 1e-2

static float *rnd(dt_rng *r, size_t n, float scale) {
    float *x = calloc(n ? n : 1, sizeof(float));
    for (size_t i = 0; i < n; i++)
        x[i] = dt_rng_normal(r) * scale;
    return x;
}

static double objective(dt_graph *g, const void *const *in, int batch, const float *r) {
    if (dt_graph_forward(g, in, batch) != DT_OK)
        return NAN;
    size_t       n = dt_shape_numel(dt_graph_node_shape(g, -1)) * (size_t)batch;
    const float *y = dt_graph_output(g);
    double       s = 0.0;
    for (size_t i = 0; i < n; i++)
        s += (double)y[i] * r[i];
    return s;
}

// Compares analytic g (n) of variable v with finite differences.
static void compare(const char *what, dt_graph *g, const void *const *in, int batch, const float *r,
                    float *v, const float *ga, size_t n) {
    double *fd  = calloc(n, sizeof(double));
    double  num = 0.0, den = 0.0, maxfd = 0.0;
    for (size_t i = 0; i < n; i++) {
        float save = v[i];
        v[i]       = save + (float)EPS;
        double lp  = objective(g, in, batch, r);
        v[i]       = save - (float)EPS;
        double lm  = objective(g, in, batch, r);
        v[i]       = save;
        fd[i]      = (lp - lm) / (2 * EPS);
        maxfd      = fabs(fd[i]) > maxfd ? fabs(fd[i]) : maxfd;
    }
    double worst = 0.0;
    size_t wi    = 0;
    for (size_t i = 0; i < n; i++) {
        double e = fabs(ga[i] - fd[i]);
        num += e * e;
        den += fd[i] * fd[i];
        if (e > worst || isnan(e)) {
            worst = e;
            wi    = i;
        }
    }
    double nerr = den > 0 ? sqrt(num / den) : sqrt(num);
    bool   ok   = nerr < NERR_MAX && worst <= ELEM_MAX * (maxfd > 1 ? maxfd : 1) && !isnan(nerr);
    if (!check_report(ok, what, __FILE__, __LINE__))
        fprintf(stderr, "     %s: normalised error %.3g, worst element %zu: %.6g vs fd %.6g\n",
                what, nerr, wi, (double)ga[wi], fd[wi]);
    free(fd);
}

// Gradient shards (dt_graph_set_grad_shards): every layer's backward, called per shard
// of samples (or summing its shards itself), gives the gradient of the unsharded pass:
// the same sums added in another order, so per tensor ||g_S - g|| / ||g|| stays within
// float rounding grown by cancellation (1e-5; a layer reading another sample's saved
// state, as LayerNorm's statistics once did, is off by tens of percent), and 1, 2 and 3
// threads give the same bits.
static void sharded(dt_graph *g, const void *const *in, int batch, const float *r,
                    const float *ga) {
    dt_params *p  = dt_graph_params(g);
    size_t     np = dt_params_numel(p);
    float     *g1 = malloc(sizeof(float) * (np ? np : 1));
    for (int threads = 1; threads <= 3; threads++) {
        CHECK_OK(dt_graph_set_threads(g, threads));
        CHECK_OK(dt_graph_set_grad_shards(g, 4));
        CHECK_OK(dt_graph_forward(g, in, batch));
        dt_params_zero_grad(p);
        CHECK_OK(dt_graph_backward(g, r));
        const float *gs = dt_params_grads(p);
        if (threads == 1)
            memcpy(g1, gs, sizeof(float) * np);
        else if (!CHECK(memcmp(g1, gs, sizeof(float) * np) == 0))
            fprintf(stderr, "     shards: %d threads differ from 1\n", threads);
        for (int i = 0; threads == 1 && i < dt_params_count(p); i++) {
            const dt_param_info *t   = dt_params_info(p, i);
            double               num = 0, den = 0;
            for (size_t j = t->offset; j < t->offset + t->count; j++) {
                num += ((double)gs[j] - ga[j]) * ((double)gs[j] - ga[j]);
                den += (double)ga[j] * ga[j];
            }
            double e = den > 0 ? sqrt(num / den) : sqrt(num);
            if (!CHECK(e < 1e-5))
                fprintf(stderr, "     %s: with 4 gradient shards off by %.3g (relative)\n", t->name,
                        e);
        }
    }
    CHECK_OK(dt_graph_set_grad_shards(g, 0));
    CHECK_OK(dt_graph_set_threads(g, 1));
    CHECK_OK(dt_graph_forward(g, in, batch)); // the callers read the outputs after
    free(g1);
}

// All parameters and float inputs of g (finalized) against finite differences.
static void check_graph(const char *name, dt_graph *g, const void *const *in, float *const *fin,
                        const size_t *fin_n, int nfin, int batch, uint64_t seed) {
    check_current = name;
    dt_params *p  = dt_graph_params(g);
    dt_rng     rr = dt_rng_init(seed);
    size_t     ny = dt_shape_numel(dt_graph_node_shape(g, -1)) * (size_t)batch;
    float     *r  = rnd(&rr, ny, 1.0f);
    dt_graph_set_input_grad(g, true);
    CHECK_OK(dt_graph_forward(g, in, batch));
    dt_params_zero_grad(p);
    CHECK_OK(dt_graph_backward(g, r));
    size_t np = dt_params_numel(p);
    float *ga = malloc(sizeof(float) * (np ? np : 1));
    memcpy(ga, dt_params_grads(p), sizeof(float) * np);
    float *gx[4] = {0};
    for (int k = 0; k < nfin; k++) {
        gx[k] = malloc(sizeof(float) * fin_n[k]);
        CHECK(dt_graph_input_grad(g, k) != NULL);
        if (dt_graph_input_grad(g, k))
            memcpy(gx[k], dt_graph_input_grad(g, k), sizeof(float) * fin_n[k]);
    }
    for (int i = 0; i < dt_params_count(p); i++) {
        const dt_param_info *t = dt_params_info(p, i);
        compare(t->name, g, in, batch, r, dt_params_data(p) + t->offset, ga + t->offset, t->count);
    }
    for (int k = 0; k < nfin; k++) {
        compare("input", g, in, batch, r, fin[k], gx[k], fin_n[k]);
        free(gx[k]);
    }
    sharded(g, in, batch, r, ga);
    free(ga);
    free(r);
}

// x (2, 5, 6) -> conv (3x2 kernel, pad 1, groups 2) -> bn (train) -> t = tanh;
// t fans out to sigmoid(t), gelu(t) and Add(t, t); concat of the three on channels
// -> avgpool 2x2 stride 1 -> silu -> adaptive avgpool (2, 3) -> flatten -> linear ->
// bn1d -> dropout -> gelu(tanh) -> linear -> softmax.
static void fanout_graph(void) {
    dt_graph *g;
    dt_layer *l;
    CHECK_OK(dt_graph_new(&g, NULL));
    CHECK_OK(dt_graph_input(g, "x", &(dt_shape){3, {2, 5, 6, 1}, DT_ELEM_F32}));
    dt_conv2d_opts co = dt_conv2d_opts_default();
    co.ph = co.pw = 1;
    co.groups     = 2;
    co.bias       = false; // before BatchNorm its gradient is 0: nothing to difference
    CHECK_OK(dt_layer_conv2d_new(&l, 2, 4, 3, 2, &co));
    CHECK_OK(dt_graph_add(g, "conv", l, "x")); // (4, 5, 7)
    CHECK_OK(dt_layer_batchnorm2d_new(&l, 4, NULL));
    CHECK_OK(dt_graph_add(g, "bn", l, "conv"));
    CHECK_OK(dt_layer_act_new(&l, DT_ACT_TANH, NULL));
    CHECK_OK(dt_graph_add(g, "t", l, "bn"));
    CHECK_OK(dt_layer_act_new(&l, DT_ACT_SIGMOID, NULL));
    CHECK_OK(dt_graph_add(g, "sig", l, "t"));
    CHECK_OK(dt_layer_act_new(&l, DT_ACT_GELU, NULL));
    CHECK_OK(dt_graph_add(g, "gel", l, "t"));
    CHECK_OK(dt_layer_add_new(&l, NULL));
    CHECK_OK(dt_graph_add(g, "twice", l, "t", "t"));
    CHECK_OK(dt_layer_concat_new(&l, 0, NULL));
    CHECK_OK(dt_graph_add(g, "cat", l, "sig", "gel", "twice")); // (12, 5, 7)
    dt_pool2d_opts po = {.sh = 1, .sw = 1};
    CHECK_OK(dt_layer_avgpool2d_new(&l, 2, 2, &po));
    CHECK_OK(dt_graph_add(g, "avg", l, "cat")); // (12, 4, 6)
    CHECK_OK(dt_layer_act_new(&l, DT_ACT_SILU, NULL));
    CHECK_OK(dt_graph_add(g, "silu", l, "avg"));
    CHECK_OK(dt_layer_adaptive_avgpool2d_new(&l, 2, 3, NULL));
    CHECK_OK(dt_graph_add(g, "ada", l, "silu"));
    CHECK_OK(dt_layer_flatten_new(&l, NULL));
    CHECK_OK(dt_graph_add(g, "flat", l, "ada")); // 72
    CHECK_OK(dt_layer_linear_new(&l, 72, 6, &(dt_linear_opts){.bias = false}));
    CHECK_OK(dt_graph_add(g, "fc1", l, "flat"));
    CHECK_OK(dt_layer_batchnorm1d_new(&l, 6, NULL));
    CHECK_OK(dt_graph_add(g, "bn1d", l, "fc1"));
    CHECK_OK(dt_layer_dropout_new(&l, 0.3f, NULL));
    CHECK_OK(dt_graph_add(g, "drop", l, "bn1d"));
    CHECK_OK(dt_layer_act_new(&l, DT_ACT_GELU_TANH, NULL));
    CHECK_OK(dt_graph_add(g, "gelu", l, "drop"));
    CHECK_OK(dt_layer_linear_new(&l, 6, 5, NULL));
    CHECK_OK(dt_graph_add(g, "fc2", l, "gelu"));
    CHECK_OK(dt_layer_softmax_new(&l, NULL));
    CHECK_OK(dt_graph_add(g, "out", l, "fc2"));
    CHECK_OK(dt_graph_finalize(g, 7));
    dt_rng r = dt_rng_init(3);
    dt_graph_set_rng(g, &r);
    uint64_t keys[8] = {11, 5, 900, 3, 12, 77, 1, 0};
    CHECK_OK(dt_graph_set_sample_keys(g, keys, 8));
    dt_rng      xr    = dt_rng_init(5);
    size_t      nx    = 8 * 2 * 5 * 6;
    float      *x     = rnd(&xr, nx, 1.0f);
    const void *in[1] = {x};
    check_graph("fanout", g, in, (float *const[]){x}, &nx, 1, 8, 9);
    // The "twice" node's gradient reached t twice: check Add(t, t) = 2t explicitly.
    const float *t = dt_graph_node_output(g, dt_graph_find(g, "t"));
    const float *w = dt_graph_node_output(g, dt_graph_find(g, "twice"));
    CHECK_NEAR(w[17], 2 * t[17], 1e-6);
    free(x);
    dt_graph_free(g);
}

// MaxPool2d (3x3, stride 2, padding 1) on inputs spaced 0.05 apart (a perturbation of
// eps never changes a window's winner), then Flatten and a Linear.
static void maxpool_graph(void) {
    dt_graph *g;
    dt_layer *l;
    CHECK_OK(dt_graph_new(&g, NULL));
    CHECK_OK(dt_graph_input(g, "x", &(dt_shape){3, {2, 5, 6, 1}, DT_ELEM_F32}));
    dt_pool2d_opts po = {.sh = 2, .sw = 2, .ph = 1, .pw = 1};
    CHECK_OK(dt_layer_maxpool2d_new(&l, 3, 3, &po));
    CHECK_OK(dt_graph_add(g, "max", l, "x")); // (2, 3, 3)
    CHECK_OK(dt_layer_flatten_new(&l, NULL));
    CHECK_OK(dt_graph_add(g, "flat", l, "max"));
    CHECK_OK(dt_layer_linear_new(&l, 18, 4, NULL));
    CHECK_OK(dt_graph_add(g, "fc", l, "flat"));
    CHECK_OK(dt_graph_finalize(g, 2));
    size_t    nx   = 3 * 2 * 5 * 6;
    float    *x    = calloc(nx, sizeof(float));
    uint32_t *perm = calloc(nx, sizeof(uint32_t));
    dt_rng    r    = dt_rng_init(8);
    dt_rng_permutation(&r, perm, nx);
    for (size_t i = 0; i < nx; i++)
        x[i] = 0.05f * (float)perm[i] - 4.0f;
    check_graph("maxpool", g, (const void *[]){x}, (float *const[]){x}, &nx, 1, 3, 12);
    free(perm);
    free(x);
    dt_graph_free(g);
}

static void gpt_graph(void) {
    dt_graph *g;
    CHECK_OK(dt_graph_new(&g, NULL));
    CHECK_OK(tg_gpt(g, 5, 8, 2, 7, 0));
    CHECK_OK(dt_graph_finalize(g, 3));
    CHECK_EQ(dt_params_find(dt_graph_params(g), "head.weight"), -1); // tied: one tensor
    int32_t     idx[10] = {1, 3, 3, 0, 6, 2, 2, 5, 1, 4}, pos[10] = {0, 1, 2, 3, 4, 0, 1, 2, 3, 4};
    const void *in[2] = {idx, pos};
    check_graph("gpt_tied", g, in, NULL, NULL, 0, 2, 4);
    dt_graph_free(g);
}

static void transformer_input(void) {
    dt_graph *g;
    CHECK_OK(dt_graph_new(&g, NULL));
    CHECK_OK(dt_graph_input(g, "x", &(dt_shape){2, {6, 8, 1, 1}, DT_ELEM_F32}));
    CHECK_OK(tg_block(g, "", "x", 8, 2));
    CHECK_OK(dt_graph_finalize(g, 5));
    dt_rng      xr    = dt_rng_init(6);
    size_t      nx    = 2 * 6 * 8;
    float      *x     = rnd(&xr, nx, 1.0f);
    const void *in[1] = {x};
    check_graph("block", g, in, (float *const[]){x}, &nx, 1, 2, 10);
    free(x);
    dt_graph_free(g);
}

// A user layer through the public interface: y = x * scale + shift over the last
// dimension (d), with a scale drawn from its init stream; its two inputs are summed
// first, so it also shows a layer with several inputs.
typedef struct affine_cfg {
    int d;
} affine_cfg;

static dt_status affine_setup(const dt_layer *l, int nin, const dt_shape *in, dt_layer_setup *s) {
    const affine_cfg *c = l->config;
    if (nin != 2 || in[0].ndim < 1 || in[0].d[in[0].ndim - 1] != c->d)
        return dt_fail(DT_ERR_ARG, "affine: expected 2 inputs (..., %d)", c->d);
    s->out       = in[0];
    s->nparams   = 2;
    s->params[0] = (dt_layer_tensor){.name = "scale", .ndim = 1, .shape = {c->d, 1, 1, 1}};
    s->params[1] = (dt_layer_tensor){
        .name = "shift", .ndim = 1, .shape = {c->d, 1, 1, 1}, .flags = DT_PARAM_NO_DECAY};
    s->scratch_per_sample = dt_shape_numel(&in[0]); // x0 + x1
    return DT_OK;
}

static void affine_init(const dt_layer *l, dt_rng *rng, float *const *w, float *const *buf) {
    (void)buf;
    const affine_cfg *c = l->config;
    for (int i = 0; i < c->d; i++) {
        w[0][i] = 1.0f + 0.5f * dt_rng_normal(rng);
        w[1][i] = 0.0f;
    }
}

static dt_status affine_forward(const dt_layer *l, const dt_layer_args *a) {
    int    d = ((const affine_cfg *)l->config)->d;
    size_t n = (size_t)a->batch * dt_shape_numel(&a->in[0]);
    for (size_t i = 0; i < n; i++) {
        a->scratch[i] = a->x[0][i] + a->x[1][i];
        a->y[i]       = a->scratch[i] * a->w[0][i % (size_t)d] + a->w[1][i % (size_t)d];
    }
    return DT_OK;
}

static dt_status affine_backward(const dt_layer *l, const dt_layer_args *a) {
    int    d = ((const affine_cfg *)l->config)->d;
    size_t n = (size_t)a->batch * dt_shape_numel(&a->in[0]);
    for (size_t i = 0; i < n; i++) {
        float g = a->dy[i] * a->w[0][i % (size_t)d];
        for (int k = 0; k < 2; k++)
            if (a->dx[k])
                a->dx[k][i] = g;
        a->dw[0][i % (size_t)d] += a->dy[i] * (a->x[0][i] + a->x[1][i]);
        a->dw[1][i % (size_t)d] += a->dy[i];
    }
    return DT_OK;
}

static const dt_layer_ops affine_ops = {"affine",       affine_setup,    affine_init,
                                        affine_forward, affine_backward, NULL};

static void user_layer(void) {
    dt_graph *g;
    dt_layer *l;
    CHECK_OK(dt_graph_new(&g, NULL));
    CHECK_OK(dt_graph_input(g, "x", &(dt_shape){2, {3, 5, 1, 1}, DT_ELEM_F32}));
    CHECK_OK(dt_layer_act_new(&l, DT_ACT_TANH, NULL));
    CHECK_OK(dt_graph_add(g, "t", l, "x"));
    affine_cfg *cfg = dt_alloc(sizeof *cfg);
    cfg->d          = 5;
    CHECK_OK(dt_layer_new(&l, &affine_ops, cfg, NULL));
    CHECK_OK(dt_graph_add(g, "aff", l, "t", "x"));
    CHECK_OK(dt_layer_act_new(&l, DT_ACT_SIGMOID, NULL));
    CHECK_OK(dt_graph_add(g, "out", l, "aff"));
    CHECK_OK(dt_graph_finalize(g, 4));
    dt_params *p = dt_graph_params(g);
    CHECK_EQ(dt_params_count(p), 2);
    CHECK(strcmp(dt_params_info(p, 1)->name, "aff.shift") == 0);
    CHECK(dt_params_info(p, 1)->flags == DT_PARAM_NO_DECAY);
    CHECK(strcmp(dt_graph_node_kind(g, dt_graph_find(g, "aff")), "affine") == 0);
    dt_rng xr = dt_rng_init(14);
    size_t nx = 4 * 15;
    float *x  = rnd(&xr, nx, 1.0f);
    check_graph("user layer", g, (const void *[]){x}, (float *const[]){x}, &nx, 1, 4, 15);
    free(x);
    dt_graph_free(g);
}

static void errors(void) {
    check_current = "errors";
    dt_graph *g;
    dt_layer *l;
    CHECK_OK(dt_graph_new(&g, NULL));
    CHECK_OK(dt_graph_input(g, "x", &(dt_shape){3, {3, 4, 4, 1}, DT_ELEM_F32}));
    CHECK_OK(dt_layer_conv2d_new(&l, 2, 4, 3, 3, NULL));
    CHECK_ERR(dt_graph_add(g, "c", l, "x"), DT_ERR_ARG, "expected 2 input channels");
    CHECK_OK(dt_layer_act_new(&l, DT_ACT_RELU, NULL));
    CHECK_ERR(dt_graph_add(g, "r", l, "nope"), DT_ERR_ARG, "'nope' is neither");
    CHECK_OK(dt_layer_act_new(&l, DT_ACT_RELU, NULL));
    CHECK_OK(dt_graph_add(g, "r", l, "x"));
    CHECK_OK(dt_layer_act_new(&l, DT_ACT_RELU, NULL));
    CHECK_ERR(dt_graph_add(g, "r", l, "x"), DT_ERR_ARG, "taken");
    CHECK_OK(dt_layer_linear_new(&l, 4, 3, NULL));
    CHECK_OK(dt_graph_add(g, "fc", l, "r")); // over the last dimension: (3, 4, 3)
    CHECK_EQ(dt_graph_node_shape(g, -1)->d[2], 3);
    CHECK_OK(dt_layer_linear_new(&l, 4, 5, NULL));
    CHECK_OK(dt_graph_add(g, "fc2", l, "r"));
    CHECK_ERR(dt_graph_tie(g, "fc2.weight", "fc.weight"), DT_ERR_ARG, "differ in shape");
    CHECK_ERR(dt_graph_tie(g, "fc.weight", "fc2.weight"), DT_ERR_ARG, "earlier node");
    CHECK_OK(dt_graph_finalize(g, 1));
    float x[48] = {0};
    CHECK_ERR(dt_graph_forward(g, (const void *[]){x}, 0), DT_ERR_ARG, "batch >= 1");
    CHECK_OK(dt_layer_act_new(&l, DT_ACT_RELU, NULL));
    CHECK_ERR(dt_graph_add(g, "late", l, "x"), DT_ERR_STATE, "after dt_graph_finalize");
    dt_graph_free(g);
}

int main(void) {
    if (getenv("FD_EPS"))
        EPS = atof(getenv("FD_EPS"));
    fanout_graph();
    maxpool_graph();
    transformer_input();
    gpt_graph();
    user_layer();
    errors();
    return check_summary();
}
