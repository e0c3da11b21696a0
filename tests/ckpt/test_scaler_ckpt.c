// test_scaler_ckpt.c: the loss scaler's state through a checkpoint (its text in the
// checkpoint's key/values): a run saved mid-way and resumed continues with the same
// scale and good-step count, so the resumed scaler makes the same decisions as the one
// that kept running (a lost tracker would grow the scale at another step).
#include "ckpt_test.h"
#include "dtrain/optim.h"

static dt_params *small(void) {
    dt_params *p    = NULL;
    int64_t    s[1] = {4};
    CHECK_OK(dt_params_new(&p, NULL));
    CHECK_OK(dt_params_add(p, "w", 1, s, 0));
    CHECK_OK(dt_params_alloc(p));
    return p;
}

// One step with gradient `v` (inf for a bad step).
static void step(dt_grad_scaler *s, dt_optim *o, dt_params *p, float v) {
    float *g = dt_params_grads(p);
    for (int i = 0; i < 4; i++)
        g[i] = v * dt_grad_scaler_scale(s);
    CHECK_OK(dt_grad_scaler_step(s, o, NULL));
    CHECK_OK(dt_grad_scaler_update(s));
}

static void test_resume(void) {
    char dir[128];
    ct_tmpdir(dir, sizeof dir, "scl");
    dt_grad_scaler_opts so = dt_grad_scaler_opts_default();
    so.growth_interval     = 5;
    dt_params      *pa = small(), *pb = small();
    dt_optim       *oa, *ob;
    dt_grad_scaler *sa, *sb;
    CHECK_OK(dt_sgd_new(&oa, pa, &(dt_sgd_opts){.lr = 0.5f}));
    CHECK_OK(dt_sgd_new(&ob, pb, &(dt_sgd_opts){.lr = 0.5f}));
    CHECK_OK(dt_grad_scaler_new(&sa, &so));
    CHECK_OK(dt_grad_scaler_new(&sb, &so));
    const float seq[] = {1, INFINITY, 1, 1, 1}; // scale 2^15, tracker 3 after these
    for (int t = 0; t < 5; t++)
        step(sa, oa, pa, seq[t]);
    char text[64];
    CHECK(dt_grad_scaler_state_str(sa, text, sizeof text) < (int)sizeof text);
    dt_ckpt_kv    kv = {"grad_scaler", text};
    dt_ckpt_state st = {.params = pa, .optim = oa, .step = 5, .kvs = &kv, .nkvs = 1};
    CHECK_OK(dt_ckpt_save(dir, NULL, &st, NULL));
    dt_ckpt_state ld = {.params = pb, .optim = ob};
    dt_ckpt_info  info;
    CHECK_OK(dt_ckpt_load(dir, NULL, &ld, NULL, &info));
    CHECK(info.found);
    const char *saved = dt_ckpt_info_get(&info, "grad_scaler");
    CHECK(saved != NULL);
    if (saved)
        CHECK_OK(dt_grad_scaler_load_str(sb, saved));
    dt_ckpt_info_free(&info);
    dt_grad_scaler_state a, b;
    dt_grad_scaler_get_state(sb, &b);
    CHECK(b.scale == 32768.0f);
    CHECK_EQ(b.growth_tracker, 3);
    // both go on: the 2nd good step from here grows the scale in both
    for (int t = 0; t < 3; t++) {
        step(sa, oa, pa, 1);
        step(sb, ob, pb, 1);
        dt_grad_scaler_get_state(sa, &a);
        dt_grad_scaler_get_state(sb, &b);
        CHECK(a.scale == b.scale);
        CHECK_EQ(a.growth_tracker, b.growth_tracker);
    }
    CHECK(a.scale == 65536.0f);
    CHECK(memcmp(dt_params_data(pa), dt_params_data(pb), 4 * sizeof(float)) == 0);
    dt_grad_scaler_free(sa);
    dt_grad_scaler_free(sb);
    dt_optim_free(oa);
    dt_optim_free(ob);
    dt_params_free(pa);
    dt_params_free(pb);
    ct_rm_tree(dir);
}

int main(void) {
    RUN(test_resume);
    return check_summary();
}
