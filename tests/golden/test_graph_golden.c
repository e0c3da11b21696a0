// test_graph_golden.c: whole graphs against PyTorch (tests/golden/gen_graph.py): a ResNet
// basic block (conv-BN-ReLU-conv-BN + shortcut, ReLU; BatchNorm in training mode, with
// the running statistics checked), a pre-LN transformer block (LN, qkv Linear, causal
// attention, proj, residual, LN, Linear-GELU-Linear, residual) and a one-block GPT with
// token and position embeddings and a head tied to the token embedding. Each checks the
// output, every parameter gradient (the tied one sums two uses), the buffers and the
// input gradient, per tensor max|dtrain - torch| <= 1e-5 * max|torch|; and that
// backward reports every parameter tensor to the gradient-ready hook exactly once, the
// tied one after its earliest user. A fourth, in evaluation mode, covers BatchNorm
// with loaded running statistics, grouped rectangular convolution with bias, MaxPool2d
// and AvgPool2d fanned out from one activation and concatenated, AdaptiveAvgPool2d,
// Flatten, BatchNorm1d, Tanh, and the cross-entropy (ignore_index, label smoothing) of
// the output.
#include "../check.h"
#include "../lib/graphs.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#define TOL 1e-5

// --------------------------------------------------------------- the fixture reader

typedef struct gtensor {
    char   name[32];
    int    dtype; // 0 float32, 1 int32
    int    ndim;
    int    shape[8];
    size_t count;
    void  *data;
} gtensor;

typedef struct fixture {
    char    name[64];
    int     n;
    gtensor t[64];
} fixture;

static uint32_t rd_u32(const unsigned char *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static void fixture_free(fixture *f) {
    for (int i = 0; i < f->n; i++)
        free(f->t[i].data);
    f->n = 0;
}

// Reads <dir>/<name>.bin; false (with a failed check naming the problem) when absent or
// malformed.
static bool fixture_load(fixture *f, const char *name) {
    memset(f, 0, sizeof *f);
    snprintf(f->name, sizeof f->name, "%s", name);
    const char *env = getenv("DT_GOLDEN_DIR");
    char        dir[512], path[640];
    if (env) {
        snprintf(dir, sizeof dir, "%s", env);
    } else { // the directory of this source file, then data/
        snprintf(dir, sizeof dir, "%s", __FILE__);
        char *slash = strrchr(dir, '/');
        if (slash)
            snprintf(slash, sizeof dir - (size_t)(slash - dir), "/data");
        else
            snprintf(dir, sizeof dir, "data");
    }
    snprintf(path, sizeof path, "%s/%s.bin", dir, name);
    FILE *fp = fopen(path, "rb");
    if (!CHECK(fp != NULL)) {
        fprintf(stderr, "     cannot open %s\n", path);
        return false;
    }
    fseek(fp, 0, SEEK_END);
    long size = ftell(fp);
    fseek(fp, 0, SEEK_SET);
    unsigned char *buf = malloc((size_t)size);
    bool           ok  = buf && fread(buf, 1, (size_t)size, fp) == (size_t)size;
    fclose(fp);
    size_t pos = 12;
    ok         = ok && size >= 12 && memcmp(buf, "DTGF", 4) == 0 && rd_u32(buf + 4) == 1;
    int count  = ok ? (int)rd_u32(buf + 8) : 0;
    ok         = ok && count <= 64;
    for (int i = 0; ok && i < count; i++) {
        gtensor *t  = &f->t[i];
        ok          = pos + 4 <= (size_t)size;
        uint32_t nl = ok ? rd_u32(buf + pos) : 0;
        ok          = ok && nl < sizeof t->name && pos + 12 + nl <= (size_t)size;
        if (!ok)
            break;
        memcpy(t->name, buf + pos + 4, nl);
        pos += 4 + nl;
        t->dtype = (int)rd_u32(buf + pos);
        t->ndim  = (int)rd_u32(buf + pos + 4);
        pos += 8;
        ok       = t->dtype <= 1 && t->ndim <= 8 && pos + 4 * (size_t)t->ndim <= (size_t)size;
        t->count = 1;
        for (int d = 0; ok && d < t->ndim; d++) {
            t->shape[d] = (int)rd_u32(buf + pos + 4 * (size_t)d);
            t->count *= (size_t)t->shape[d];
        }
        pos += 4 * (size_t)t->ndim;
        ok = ok && pos + 4 * t->count <= (size_t)size;
        if (!ok)
            break;
        t->data = malloc(4 * t->count + 4);
        for (size_t j = 0; j < t->count; j++) { // little-endian on disk, host order here
            uint32_t v = rd_u32(buf + pos + 4 * j);
            memcpy((char *)t->data + 4 * j, &v, 4);
        }
        pos += 4 * t->count;
        f->n = i + 1;
    }
    free(buf);
    if (!CHECK(ok && pos == (size_t)size)) {
        fprintf(stderr, "     %s: malformed fixture (at byte %zu of %ld)\n", path, pos, size);
        fixture_free(f);
        return false;
    }
    return true;
}

static gtensor *get(fixture *f, const char *name) {
    for (int i = 0; i < f->n; i++)
        if (strcmp(f->t[i].name, name) == 0)
            return &f->t[i];
    fprintf(stderr, "     %s: no tensor \"%s\"\n", f->name, name);
    abort(); // a fixture/test mismatch is a bug in the test
}

static float *fl(fixture *f, const char *name) {
    return get(f, name)->data;
}
// max|got - want| <= tol * max|want|, reported with the tensor's name.
static void expect(fixture *f, const char *name, const float *got, double tol) {
    gtensor     *t      = get(f, name);
    double       maxref = 0.0, maxerr = 0.0;
    size_t       worst = 0;
    const float *want  = t->data;
    for (size_t i = 0; i < t->count; i++) {
        double r = fabs(want[i]), e = fabs((double)got[i] - want[i]);
        maxref = r > maxref ? r : maxref;
        if (e > maxerr || isnan(got[i])) {
            maxerr = isnan(got[i]) ? INFINITY : e;
            worst  = i;
        }
    }
    double bound = tol * (maxref > 0 ? maxref : 1.0);
    if (!check_report(maxerr <= bound, name, __FILE__, __LINE__))
        fprintf(stderr, "     %s/%s: max error %.3g > %.3g (element %zu: %.9g, torch %.9g)\n",
                f->name, name, maxerr, bound, worst, (double)got[worst], (double)want[worst]);
}

// Copies "p:<name>" of every parameter into the graph.
static void load_params(fixture *f, dt_graph *g) {
    dt_params *p = dt_graph_params(g);
    char       key[80];
    for (int i = 0; i < dt_params_count(p); i++) {
        const dt_param_info *t = dt_params_info(p, i);
        snprintf(key, sizeof key, "p:%s", t->name);
        gtensor *gt = get(f, key);
        CHECK_EQ(gt->count, t->count);
        memcpy(dt_params_data(p) + t->offset, gt->data, sizeof(float) * t->count);
    }
}

static void check_grads(fixture *f, dt_graph *g) {
    dt_params *p = dt_graph_params(g);
    char       key[80];
    for (int i = 0; i < dt_params_count(p); i++) {
        const dt_param_info *t = dt_params_info(p, i);
        snprintf(key, sizeof key, "g:%s", t->name);
        expect(f, key, dt_params_grads(p) + t->offset, TOL);
    }
    for (int i = 0; i < dt_params_buffer_count(p); i++) {
        const dt_param_info *t = dt_params_buffer_info(p, i);
        snprintf(key, sizeof key, "b:%s", t->name);
        expect(f, key, dt_params_buffers(p) + t->offset, TOL);
    }
}

typedef struct ready_log {
    int    n;
    size_t off[64], cnt[64];
} ready_log;

static void on_ready(void *user, size_t off, size_t cnt) {
    ready_log *r = user;
    if (r->n < 64) {
        r->off[r->n] = off;
        r->cnt[r->n] = cnt;
    }
    r->n++;
}

// Every tensor reported once, whole; returns the position of `name` in the order.
static int check_ready(dt_graph *g, const ready_log *r, const char *name) {
    dt_params *p = dt_graph_params(g);
    CHECK_EQ(r->n, dt_params_count(p));
    int pos = -1;
    for (int i = 0; i < dt_params_count(p); i++) {
        const dt_param_info *t    = dt_params_info(p, i);
        int                  seen = 0;
        for (int k = 0; k < r->n && k < 64; k++)
            if (r->off[k] == t->offset && r->cnt[k] == t->count) {
                seen++;
                if (name && strcmp(t->name, name) == 0)
                    pos = k;
            }
        if (!CHECK(seen == 1))
            fprintf(stderr, "     %s reported %d times\n", t->name, seen);
    }
    return pos;
}

static gtensor *find(fixture *f, const char *name) {
    for (int k = 0; k < f->n; k++)
        if (strcmp(f->t[k].name, name) == 0)
            return &f->t[k];
    return NULL;
}

// Loads "b0:<name>" into each buffer the fixture sets before the forward.
static void load_buffers(fixture *f, dt_graph *g) {
    dt_params *p = dt_graph_params(g);
    char       key[80];
    for (int i = 0; i < dt_params_buffer_count(p); i++) {
        const dt_param_info *t = dt_params_buffer_info(p, i);
        snprintf(key, sizeof key, "b0:%s", t->name);
        gtensor *gt = find(f, key);
        if (gt && CHECK(gt->count == t->count))
            memcpy(dt_params_buffers(p) + t->offset, gt->data, sizeof(float) * t->count);
    }
}

static void run_case(const char *name, dt_graph *g, int batch, int ninputs, const char **inputs,
                     const char *tied) {
    fixture f;
    check_current = name;
    if (!fixture_load(&f, name))
        return;
    CHECK_OK(dt_graph_finalize(g, 1));
    load_params(&f, g);
    load_buffers(&f, g);
    const void *in[4];
    for (int i = 0; i < ninputs; i++) {
        char key[80];
        snprintf(key, sizeof key, "in:%s", inputs[i]);
        in[i] = get(&f, key)->data;
    }
    dt_graph_set_input_grad(g, true);
    ready_log log = {0};
    CHECK_OK(dt_params_add_grad_hook(dt_graph_params(g), on_ready, &log));
    CHECK_OK(dt_graph_forward(g, in, batch));
    expect(&f, "y", dt_graph_output(g), TOL);
    dt_params_zero_grad(dt_graph_params(g));
    CHECK_OK(dt_graph_backward(g, fl(&f, "dy")));
    check_grads(&f, g);
    for (int i = 0; i < ninputs; i++) {
        char key[80];
        snprintf(key, sizeof key, "dx:%s", inputs[i]);
        for (int k = 0; k < f.n; k++)
            if (strcmp(f.t[k].name, key) == 0)
                expect(&f, key, dt_graph_input_grad(g, i), TOL);
    }
    gtensor *target = find(&f, "target");
    if (target) { // cross-entropy of the output: nn.CrossEntropyLoss(ignore_index=2, ls=0.1)
        int   k = (int)(dt_shape_numel(dt_graph_node_shape(g, -1)));
        float loss, *dl = malloc(sizeof(float) * (size_t)batch * (size_t)k);
        CHECK_OK(dt_loss_cross_entropy_ex(dt_graph_output(g), target->data, batch, k, 2, 0.1f,
                                          &loss, dl));
        expect(&f, "loss", &loss, TOL);
        expect(&f, "dlogits", dl, TOL);
        free(dl);
    }
    int pos = check_ready(g, &log, tied);
    if (tied) // the tied tensor is final only after its earliest user, the first node
        CHECK_EQ(pos, log.n - 1);
    fixture_free(&f);
}

// The graph of gen_graph.py's cnn_eval, in evaluation mode.
static dt_status cnn_eval(dt_graph *g) {
    dt_layer      *l;
    dt_conv2d_opts co = dt_conv2d_opts_default();
    co.ph             = 1;
    co.groups         = 2;
    dt_pool2d_opts po = {.sh = 2, .sw = 2, .ph = 1, .pw = 1};
    DT_TRY(dt_graph_input(g, "x", &(dt_shape){3, {4, 7, 6, 1}, DT_ELEM_F32}));
    DT_TRY(dt_layer_conv2d_new(&l, 4, 6, 3, 2, &co));
    DT_TRY(dt_graph_add(g, "conv", l, "x"));
    DT_TRY(dt_layer_batchnorm2d_new(&l, 6, NULL));
    DT_TRY(dt_graph_add(g, "bn", l, "conv"));
    DT_TRY(dt_layer_act_new(&l, DT_ACT_SILU, NULL));
    DT_TRY(dt_graph_add(g, "silu", l, "bn"));
    DT_TRY(dt_layer_maxpool2d_new(&l, 3, 3, &po));
    DT_TRY(dt_graph_add(g, "max", l, "silu"));
    DT_TRY(dt_layer_avgpool2d_new(&l, 3, 3, &po));
    DT_TRY(dt_graph_add(g, "avg", l, "silu"));
    DT_TRY(dt_layer_concat_new(&l, 0, NULL));
    DT_TRY(dt_graph_add(g, "cat", l, "max", "avg"));
    DT_TRY(dt_layer_adaptive_avgpool2d_new(&l, 2, 2, NULL));
    DT_TRY(dt_graph_add(g, "ada", l, "cat"));
    DT_TRY(dt_layer_flatten_new(&l, NULL));
    DT_TRY(dt_graph_add(g, "flat", l, "ada"));
    DT_TRY(dt_layer_linear_new(&l, 48, 9, NULL));
    DT_TRY(dt_graph_add(g, "fc1", l, "flat"));
    DT_TRY(dt_layer_batchnorm1d_new(&l, 9, NULL));
    DT_TRY(dt_graph_add(g, "bn1d", l, "fc1"));
    DT_TRY(dt_layer_act_new(&l, DT_ACT_TANH, NULL));
    DT_TRY(dt_graph_add(g, "tanh", l, "bn1d"));
    DT_TRY(dt_layer_linear_new(&l, 9, 5, NULL));
    DT_TRY(dt_graph_add(g, "fc2", l, "tanh"));
    dt_graph_train(g, false);
    return DT_OK;
}

// The public losses (graph.h) on gen.py's loss fixtures: MSE, L1, BCE-with-logits.
static void losses(void) {
    const char *names[]        = {"mse", "l1", "bce_logits"};
    dt_status (*fn[])(const float *, const float *, size_t, float *,
                      float *) = {dt_loss_mse, dt_loss_l1, dt_loss_bce_logits};
    for (int i = 0; i < 3; i++) {
        fixture f;
        check_current = names[i];
        if (!fixture_load(&f, names[i]))
            continue;
        size_t n  = get(&f, "x")->count;
        float *dx = malloc(sizeof(float) * n), loss;
        CHECK_OK(fn[i](fl(&f, "x"), fl(&f, "t"), n, &loss, dx));
        expect(&f, "loss", &loss, TOL);
        expect(&f, "dx", dx, TOL);
        free(dx);
        fixture_free(&f);
    }
}

int main(void) {
    dt_graph *g;

    losses();

    CHECK_OK(dt_graph_new(&g, NULL));
    CHECK_OK(cnn_eval(g));
    run_case("graph_cnn_eval", g, 5, 1, (const char *[]){"x"}, NULL);
    dt_graph_free(g);

    CHECK_OK(dt_graph_new(&g, NULL));
    CHECK_OK(tg_resblock(g, 4, 6, 5, NULL));
    run_case("graph_resblock", g, 3, 1, (const char *[]){"x"}, NULL);
    dt_graph_free(g);

    CHECK_OK(dt_graph_new(&g, NULL));
    CHECK_OK(dt_graph_input(g, "x", &(dt_shape){2, {7, 8, 1, 1}, DT_ELEM_F32}));
    CHECK_OK(tg_block(g, "", "x", 8, 2));
    run_case("graph_transformer", g, 2, 1, (const char *[]){"x"}, NULL);
    dt_graph_free(g);

    CHECK_OK(dt_graph_new(&g, NULL));
    CHECK_OK(tg_gpt(g, 6, 8, 2, 13, 0));
    run_case("graph_gpt_tied", g, 2, 2, (const char *[]){"idx", "pos"}, "wte.weight");
    dt_graph_free(g);
    return check_summary();
}
