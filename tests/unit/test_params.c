// test_params.c: the parameter contract (params.h) and what optimizers do over it.
//
// - Tables: offsets in registration order, flags, lookups, every refused argument.
// - The gradient-ready hook: every consumer in order, removal, range checks; a dt_model
//   reports each layer's range, last layer first, through its dt_params.
// - Parameter groups: per-group lr and weight decay against hand-computed PyTorch
//   updates (SGD with L2 decay, AdamW's decoupled decay), frozen tensors untouched,
//   and two groups with equal settings bitwise equal to one.
// - Clipping: torch.nn.utils.clip_grad_norm_'s norm and scale, frozen tensors ignored.
// - Schedules: PyTorch's closed forms at chosen steps (values worked out by hand from
//   the formulas in the PyTorch documentation), warmup, and dt_sched_apply per group.
#include "../check.h"
#include "dtrain/nn.h"
#include "dtrain/optim.h"

#include <math.h>
#include <stdlib.h>

// a (5), frozen (3, 4), c (3) with DT_PARAM_NO_DECAY; buffer stats (2)
static dt_params *small_table(void) {
    dt_params *p = NULL;
    CHECK_OK(dt_params_new(&p, NULL));
    int64_t a[1] = {5}, f[2] = {3, 4}, c[1] = {3}, s[1] = {2};
    CHECK_OK(dt_params_add(p, "a", 1, a, 0));
    CHECK_OK(dt_params_add(p, "frozen", 2, f, DT_PARAM_FROZEN));
    CHECK_OK(dt_params_add(p, "c", 1, c, DT_PARAM_NO_DECAY));
    CHECK_OK(dt_params_add_buffer(p, "stats", 1, s, 0));
    CHECK_OK(dt_params_alloc(p));
    return p;
}

static void test_tables(void) {
    dt_params *p = small_table();
    CHECK_EQ(dt_params_count(p), 3);
    CHECK_EQ(dt_params_buffer_count(p), 1);
    CHECK_EQ(dt_params_numel(p), 20);
    CHECK_EQ(dt_params_buffer_numel(p), 2);
    CHECK_EQ(dt_params_trainable_numel(p), 8);
    CHECK_EQ(dt_params_info(p, 1)->offset, 5);
    CHECK_EQ(dt_params_info(p, 1)->count, 12);
    CHECK_EQ(dt_params_info(p, 1)->shape[1], 4);
    CHECK(!dt_params_info(p, 1)->trainable && dt_params_info(p, 2)->trainable);
    CHECK_EQ(dt_params_info(p, 2)->offset, 17);
    CHECK_EQ(dt_params_info(p, 2)->layer, -1);
    CHECK(!dt_params_buffer_info(p, 0)->trainable);
    CHECK(dt_params_info(p, 3) == NULL && dt_params_buffer_info(p, 1) == NULL);
    CHECK_EQ(dt_params_find(p, "c"), 2);
    CHECK_EQ(dt_params_find(p, "stats"), -1);
    CHECK(dt_param_no_decay(dt_params_info(p, 2), NULL));
    CHECK(!dt_param_no_decay(dt_params_info(p, 0), NULL));
    CHECK(dt_params_data(p) && dt_params_grads(p) && dt_params_buffers(p));
    int64_t one[1] = {1};
    CHECK_ERR(dt_params_add(p, "late", 1, one, 0), DT_ERR_STATE, "after the storage is set");
    dt_params_free(p);

    CHECK_OK(dt_params_new(&p, NULL));
    int64_t bad[2] = {3, 0};
    CHECK_ERR(dt_params_add(p, "x", 2, bad, 0), DT_ERR_ARG, "expected dimensions >= 1");
    CHECK_ERR(dt_params_add(p, "x", 5, one, 0), DT_ERR_ARG, "expected 1..4 dimensions");
    CHECK_ERR(dt_params_add(p, "", 1, one, 0), DT_ERR_ARG, "name of 1..63 bytes");
    CHECK_ERR(dt_params_add(p, "x", 1, one, 1u << 7), DT_ERR_ARG, "unknown flags");
    CHECK_OK(dt_params_add(p, "x", 1, one, 0));
    CHECK_ERR(dt_params_add_buffer(p, "x", 1, one, 0), DT_ERR_ARG, "\"x\" twice");
    float w[4], g[4];
    CHECK_ERR(dt_params_bind(p, w, w, NULL), DT_ERR_ARG, "overlapping");
    CHECK_OK(dt_params_bind(p, w, g, NULL));
    CHECK(dt_params_data(p) == w && dt_params_grads(p) == g);
    dt_params_free(p); // borrowed storage is not freed (ASan would say)
}

typedef struct calls {
    int    n;
    size_t off[8], cnt[8];
    int    who[8];
} calls;

static calls g_calls;

static dt_status hook_a(void *user, size_t off, size_t cnt) {
    int k = g_calls.n++;
    if (k < 8) {
        g_calls.off[k] = off, g_calls.cnt[k] = cnt;
        g_calls.who[k] = *(int *)user;
    }
    return DT_OK;
}

static dt_status hook_fail(void *user, size_t off, size_t cnt) {
    (void)user;
    g_calls.n++;
    return dt_fail(DT_ERR_STATE, "consumer refused [%zu, %zu)", off, off + cnt);
}

// A consumer's failure reaches the producer's caller (the backward that reported the
// range); the consumers after it are called all the same.
static void test_hook_error(void) {
    dt_params *p  = small_table();
    int        u1 = 1;
    g_calls       = (calls){0};
    CHECK_OK(dt_params_add_grad_hook(p, hook_fail, NULL));
    CHECK_OK(dt_params_add_grad_hook(p, hook_a, &u1));
    CHECK_ERR(dt_params_grad_ready(p, 17, 3), DT_ERR_STATE, "consumer refused [17, 20)");
    CHECK_EQ(g_calls.n, 2);
    CHECK_EQ(g_calls.who[1], 1);
    dt_params_free(p);
}

static void test_hook(void) {
    dt_params *p  = small_table();
    int        u1 = 1, u2 = 2;
    g_calls = (calls){0};
    CHECK_OK(dt_params_add_grad_hook(p, hook_a, &u1));
    CHECK_OK(dt_params_add_grad_hook(p, hook_a, &u2));
    CHECK_OK(dt_params_grad_ready(p, 17, 3));
    CHECK_EQ(g_calls.n, 2);
    CHECK(g_calls.who[0] == 1 && g_calls.who[1] == 2 && g_calls.off[1] == 17 &&
          g_calls.cnt[1] == 3);
    dt_params_remove_grad_hook(p, hook_a, &u1);
    CHECK_OK(dt_params_grad_ready(p, 0, 5));
    CHECK_EQ(g_calls.n, 3);
    CHECK_EQ(g_calls.who[2], 2);
    CHECK_ERR(dt_params_grad_ready(p, 18, 3), DT_ERR_ARG, "outside the 20 parameters");
    dt_params_free(p);

    dt_params_opts o = dt_params_opts_default();
    o.max_hooks      = 1;
    CHECK_OK(dt_params_new(&p, &o));
    CHECK_OK(dt_params_add_grad_hook(p, hook_a, &u1));
    CHECK_ERR(dt_params_add_grad_hook(p, hook_a, &u2), DT_ERR_STATE, "at most 1");
    dt_params_free(p);
}

// A dt_model is a provider: its tables, its buffers, its backward's reports.
static void test_model_provider(void) {
    dt_model *m = NULL;
    dt_model_new(&m, 1, 4, 4);
    CHECK(dt_model_as_params(m) == NULL); // not finalized
    CHECK_OK(dt_model_add_conv2d(m, 2, 3, 1, 0));
    CHECK_OK(dt_model_add_relu(m));
    CHECK_OK(dt_model_add_flatten(m));
    CHECK_OK(dt_model_add_linear(m, 3));
    CHECK_OK(dt_model_add_log_softmax(m));
    CHECK_OK(dt_model_finalize(m, 1));
    dt_params *p = dt_model_as_params(m);
    CHECK(p != NULL);
    CHECK(dt_params_data(p) == dt_model_params(m) && dt_params_grads(p) == dt_model_grads(m));
    CHECK_EQ(dt_params_numel(p), dt_model_num_params(m));
    CHECK_EQ(dt_params_count(p), 4);
    CHECK(strcmp(dt_params_info(p, 2)->name, "3.weight") == 0);
    CHECK_EQ(dt_params_info(p, 2)->layer, 3);
    CHECK(dt_params_info(p, 1)->flags & DT_PARAM_NO_DECAY);    // 0.bias
    CHECK(!(dt_params_info(p, 0)->flags & DT_PARAM_NO_DECAY)); // 0.weight
    CHECK(dt_model_param_info(m, 3) == dt_params_info(p, 3));
    int u   = 7;
    g_calls = (calls){0};
    CHECK_OK(dt_params_add_grad_hook(p, hook_a, &u));
    float   x[2 * 16], dl[2 * 3], loss;
    int32_t y[2] = {0, 2};
    for (int i = 0; i < 32; i++)
        x[i] = (float)i / 32.0f - 0.5f;
    CHECK_OK(dt_model_forward(m, x, 2));
    CHECK_OK(dt_loss_nll(dt_model_output(m), y, 2, 3, &loss, dl));
    dt_model_zero_grad(m);
    CHECK_OK(dt_model_backward(m, dl));
    CHECK_EQ(g_calls.n, 2); // linear first, then the convolution
    CHECK_EQ(g_calls.off[0], dt_params_info(p, 2)->offset);
    CHECK_EQ(g_calls.cnt[0], dt_params_numel(p) - dt_params_info(p, 2)->offset);
    CHECK(g_calls.off[1] == 0 && g_calls.cnt[1] == dt_params_info(p, 2)->offset);
    dt_model_free(m);
}

// ------------------------------------------------------------------- groups

static void fill(dt_params *p, float pv, float gv) {
    for (size_t i = 0; i < dt_params_numel(p); i++) {
        dt_params_data(p)[i]  = pv;
        dt_params_grads(p)[i] = gv;
    }
}

static void test_groups_sgd(void) {
    dt_params *p = small_table();
    fill(p, 1.0f, 0.5f);
    dt_sgd_opts so = dt_sgd_opts_default();
    so.lr = 0.1f, so.weight_decay = 0.1f;
    dt_optim *o = NULL;
    CHECK_OK(dt_sgd_new(&o, p, &so));
    dt_param_group_opts nd = dt_param_group_opts_default();
    nd.weight_decay        = 0;
    nd.lr                  = 0.2f;
    int g                  = -1;
    CHECK_OK(dt_optim_add_group(o, dt_param_no_decay, NULL, &nd, &g));
    CHECK_EQ(g, 1);
    CHECK_EQ(dt_optim_num_groups(o), 2);
    CHECK_EQ(dt_optim_tensor_group(o, 0), 0);
    CHECK_EQ(dt_optim_tensor_group(o, 1), -1);
    CHECK_EQ(dt_optim_tensor_group(o, 2), 1);
    dt_optim_step(o);
    const float *w = dt_params_data(p);
    // group 0: p -= lr (g + wd p) = 1 - 0.1 (0.5 + 0.1) = 0.94
    CHECK_NEAR(w[0], 0.94, 1e-7);
    CHECK_NEAR(w[4], 0.94, 1e-7);
    CHECK(w[5] == 1.0f && w[16] == 1.0f); // frozen
    // group 1: p -= 0.2 * 0.5 = 0.9
    CHECK_NEAR(w[17], 0.9, 1e-7);
    CHECK_NEAR(w[19], 0.9, 1e-7);
    CHECK_NEAR(dt_optim_group_weight_decay(o, 1), 0, 0);
    CHECK_NEAR(dt_optim_group_lr(o, 1), 0.2, 1e-7);
    CHECK_ERR(dt_optim_set_group_lr(o, 2, 0.1f), DT_ERR_ARG, "expected a group in [0, 2)");
    CHECK_ERR(dt_optim_add_group(o, NULL, NULL, NULL, NULL), DT_ERR_ARG, "predicate");
    dt_optim_free(o);
    dt_params_free(p);
}

static void test_groups_adamw(void) {
    dt_params *p = small_table();
    fill(p, 2.0f, -0.25f);
    dt_adam_opts ao = dt_adamw_opts_default();
    ao.lr = 0.01f, ao.weight_decay = 0.5f;
    dt_optim *o = NULL;
    CHECK_OK(dt_adamw_new(&o, p, &ao));
    dt_param_group_opts nd = dt_param_group_opts_default();
    nd.weight_decay        = 0;
    CHECK_OK(dt_optim_add_group(o, dt_param_no_decay, NULL, &nd, NULL));
    dt_optim_step(o);
    // First AdamW step: p (1 - lr wd) - lr g / (|g| + eps) (bias corrections cancel).
    double upd = 0.01 * -0.25 / (0.25 + 1e-7);
    CHECK_NEAR(dt_params_data(p)[0], 2.0 * (1 - 0.01 * 0.5) - upd, 2e-6);
    CHECK_NEAR(dt_params_data(p)[18], 2.0 - upd, 2e-6);
    CHECK(dt_params_data(p)[6] == 2.0f);
    dt_optim_free(o);
    dt_params_free(p);
}

// Splitting the buffers into runs changes nothing when the groups agree.
static bool select_c(const dt_param_info *t, void *user) {
    (void)user;
    return strcmp(t->name, "a") == 0;
}

static void test_groups_equal_settings(void) {
    dt_params *p1 = small_table(), *p2 = small_table();
    for (size_t i = 0; i < 20; i++) {
        dt_params_data(p1)[i] = dt_params_data(p2)[i] = sinf((float)i);
        dt_params_grads(p1)[i] = dt_params_grads(p2)[i] = cosf((float)i * 0.7f);
    }
    dt_adam_opts ao = dt_adam_opts_default();
    ao.weight_decay = 0.01f;
    dt_optim *a = NULL, *b = NULL;
    CHECK_OK(dt_adam_new(&a, p1, &ao));
    CHECK_OK(dt_adam_new(&b, p2, &ao));
    CHECK_OK(dt_optim_add_group(b, select_c, NULL, NULL, NULL)); // inherits lr and decay
    for (int s = 0; s < 3; s++) {
        dt_optim_step(a);
        dt_optim_step(b);
    }
    CHECK(memcmp(dt_params_data(p1), dt_params_data(p2), 20 * 4) == 0);
    dt_optim_free(a), dt_optim_free(b);
    dt_params_free(p1), dt_params_free(p2);
}

// ------------------------------------------------------------------- clipping

static void test_clip(void) {
    dt_params *p = small_table();
    fill(p, 0, 0);
    float *g = dt_params_grads(p);
    g[0] = 3, g[1] = 4, g[17] = 12;
    for (int i = 5; i < 17; i++)
        g[i] = 100; // frozen: ignored
    float norm = 0;
    CHECK_OK(dt_grad_norm(p, &norm));
    CHECK_NEAR(norm, 13, 1e-6);
    CHECK_OK(dt_clip_grad_norm(p, 20, &norm)); // below max: unchanged
    CHECK(g[0] == 3 && g[17] == 12);
    CHECK_OK(dt_clip_grad_norm(p, 6.5f, &norm));
    CHECK_NEAR(norm, 13, 1e-6);
    double coef = 6.5 / (13 + 1e-6);
    CHECK_NEAR(g[0], 3 * coef, 1e-6);
    CHECK_NEAR(g[1], 4 * coef, 1e-6);
    CHECK_NEAR(g[17], 12 * coef, 1e-6);
    CHECK(g[5] == 100);
    CHECK_OK(dt_grad_norm(p, &norm));
    CHECK_NEAR(norm, 6.5, 1e-5);
    g[2] = NAN;
    CHECK_OK(dt_clip_grad_norm(p, 1, &norm));
    CHECK(isnan(norm));
    CHECK_NEAR(g[17], 12 * coef, 1e-6); // untouched
    CHECK_ERR(dt_clip_grad_norm(p, 0, NULL), DT_ERR_ARG, "max_norm > 0");
    dt_params_free(p);
}

// ------------------------------------------------------------------- schedules

static dt_sched *sched(dt_sched_opts o) {
    dt_sched *s = NULL;
    CHECK_OK(dt_sched_new(&s, &o));
    return s;
}

static double halve(int64_t step, void *user) {
    (void)user;
    return 1.0 / (double)(1 + step);
}

static void test_schedules(void) {
    dt_sched_opts o = dt_sched_opts_default();
    o.base_lr       = 0.1f;
    // StepLR(step_size=3, gamma=0.5)
    o.kind         = DT_SCHED_STEP;
    o.step_size    = 3;
    o.gamma        = 0.5f;
    dt_sched *s    = sched(o);
    double    st[] = {0.1, 0.1, 0.1, 0.05, 0.05, 0.05, 0.025, 0.025};
    for (int t = 0; t < 8; t++)
        CHECK_NEAR(dt_sched_lr_at(s, t), st[t], 1e-7);
    dt_sched_free(s);
    // CosineAnnealingLR(T_max=10, eta_min=0.001): cos(pi/5) = 0.80901699
    o.kind        = DT_SCHED_COSINE;
    o.total_steps = 10;
    o.min_lr      = 0.001f;
    s             = sched(o);
    CHECK_NEAR(dt_sched_lr_at(s, 0), 0.1, 1e-7);
    CHECK_NEAR(dt_sched_lr_at(s, 2), 0.001 + 0.099 * (1 + 0.80901699) / 2, 1e-7);
    CHECK_NEAR(dt_sched_lr_at(s, 5), 0.0505, 1e-7);
    CHECK_NEAR(dt_sched_lr_at(s, 10), 0.001, 1e-7);
    CHECK_NEAR(dt_sched_lr_at(s, 15), 0.001, 1e-7); // held at the floor
    dt_sched_free(s);
    // LinearLR(start_factor=0.25, end_factor=1, total_iters=4)
    o.kind         = DT_SCHED_LINEAR;
    o.start_factor = 0.25f;
    o.end_factor   = 1.0f;
    o.total_steps  = 4;
    s              = sched(o);
    CHECK_NEAR(dt_sched_lr_at(s, 0), 0.025, 1e-7);
    CHECK_NEAR(dt_sched_lr_at(s, 2), 0.0625, 1e-7);
    CHECK_NEAR(dt_sched_lr_at(s, 9), 0.1, 1e-7);
    dt_sched_free(s);
    // SequentialLR([LinearLR(0.2, 1, 5), CosineAnnealingLR(10, 0)], milestones=[5])
    o.kind                = DT_SCHED_COSINE;
    o.total_steps         = 10;
    o.min_lr              = 0;
    o.warmup_steps        = 5;
    o.warmup_start_factor = 0.2f;
    s                     = sched(o);
    CHECK_NEAR(dt_sched_lr_at(s, 0), 0.02, 1e-7);
    CHECK_NEAR(dt_sched_lr_at(s, 3), 0.1 * (0.2 + 0.8 * 3 / 5.0), 1e-7);
    CHECK_NEAR(dt_sched_lr_at(s, 5), 0.1, 1e-7);
    CHECK_NEAR(dt_sched_lr_at(s, 10), 0.05, 1e-7);
    CHECK_NEAR(dt_sched_lr_at(s, 15), 0.0, 1e-7);
    // Per group: each group's initial lr is its base.
    dt_params  *p   = small_table();
    dt_optim   *opt = NULL;
    dt_sgd_opts so  = dt_sgd_opts_default();
    so.lr           = 0.1f;
    CHECK_OK(dt_sgd_new(&opt, p, &so));
    dt_param_group_opts go = dt_param_group_opts_default();
    go.lr                  = 0.4f;
    CHECK_OK(dt_optim_add_group(opt, dt_param_no_decay, NULL, &go, NULL));
    CHECK_OK(dt_sched_apply(s, opt, 10));
    CHECK_NEAR(dt_optim_group_lr(opt, 0), 0.05, 1e-7);
    CHECK_NEAR(dt_optim_group_lr(opt, 1), 0.2, 1e-7);
    CHECK_NEAR(dt_optim_lr(opt), 0.05, 1e-7);
    CHECK_NEAR(dt_optim_group_initial_lr(opt, 1), 0.4, 1e-7);
    dt_optim_free(opt);
    dt_params_free(p);
    dt_sched_free(s);
    // LambdaLR
    o         = dt_sched_opts_default();
    o.kind    = DT_SCHED_LAMBDA;
    o.lambda  = halve;
    o.base_lr = 0.3f;
    s         = sched(o);
    CHECK_NEAR(dt_sched_lr_at(s, 2), 0.1, 1e-7);
    dt_sched_free(s);
    // Refusals, as PyTorch's constructors refuse them.
    o              = dt_sched_opts_default();
    o.kind         = DT_SCHED_LINEAR;
    o.start_factor = 0;
    o.total_steps  = 3;
    s              = NULL;
    CHECK_ERR(dt_sched_new(&s, &o), DT_ERR_ARG, "start_factor in (0, 1]");
    CHECK(s == NULL);
    o      = dt_sched_opts_default();
    o.kind = DT_SCHED_COSINE;
    CHECK_ERR(dt_sched_new(&s, &o), DT_ERR_ARG, "T_max");
    o.kind = DT_SCHED_STEP;
    CHECK_ERR(dt_sched_new(&s, &o), DT_ERR_ARG, "step_size >= 1");
}

int main(void) {
    RUN(test_tables);
    RUN(test_hook);
    RUN(test_hook_error);
    RUN(test_model_provider);
    RUN(test_groups_sgd);
    RUN(test_groups_adamw);
    RUN(test_groups_equal_settings);
    RUN(test_clip);
    RUN(test_schedules);
    return check_summary();
}
