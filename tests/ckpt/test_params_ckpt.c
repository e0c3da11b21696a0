// test_params_ckpt.c: checkpoints of a dt_params (format version 2) and files of
// version 1.
//
// - Round trip: parameters, buffers (running statistics) and optimizer state of a
//   hand-described table through dt_ckpt_save/dt_ckpt_load, and through
//   dt_ckpt_save_params/dt_ckpt_load_params; the flags survive in the file.
// - Mismatches: another buffer table, or a version-1 file for a table with buffers.
// - Version 1: tests/ckpt/data/v1 was written by the previous release (format version
//   1) with gen_v1.c.txt beside it: ct_model(3, 5) whose parameter i is
//   i * 0.001 - 0.5, SGD with momentum whose state float i is i * 0.25 after 7 steps,
//   one RNG "dropout" (Philox seed 42, split once by 1) and key "program" = "gen-v1".
//   Both files still load, with exactly those values. The test runs from the
//   repository root (as `make test` does).
#include "ckpt_test.h"
#include "dtrain/optim.h"

#define V1_DIR "tests/ckpt/data/v1"

// a (2, 3), b (4) no-decay; buffers mean (4), var (4)
static dt_params *bn_like(void) {
    dt_params *p = NULL;
    CHECK_OK(dt_params_new(&p, NULL));
    int64_t a[2] = {2, 3}, b[1] = {4};
    CHECK_OK(dt_params_add(p, "a", 2, a, 0));
    CHECK_OK(dt_params_add(p, "b", 1, b, DT_PARAM_NO_DECAY));
    CHECK_OK(dt_params_add_buffer(p, "running_mean", 1, b, 0));
    CHECK_OK(dt_params_add_buffer(p, "running_var", 1, b, 0));
    CHECK_OK(dt_params_alloc(p));
    return p;
}

static void test_round_trip(void) {
    char dir[128], file[256];
    ct_tmpdir(dir, sizeof dir, "pck");
    dt_params *w = bn_like(), *r = bn_like();
    ct_fill(dt_params_data(w), 10, 1);
    ct_fill(dt_params_buffers(w), 8, 2);
    ct_fill(dt_params_grads(w), 10, 3);
    dt_optim *ow = NULL, * or = NULL;
    CHECK_OK(dt_adam_new(&ow, w, NULL));
    CHECK_OK(dt_adam_new(& or, r, NULL));
    dt_optim_step(ow);
    dt_optim_step(ow);
    dt_ckpt_state sw = {.params = w, .optim = ow, .step = 2};
    CHECK_OK(dt_ckpt_save(dir, NULL, &sw, NULL));
    dt_ckpt_state sr = {.params = r, .optim = or };
    dt_ckpt_info  info;
    CHECK_OK(dt_ckpt_load(dir, NULL, &sr, NULL, &info));
    CHECK(info.found && info.step == 2);
    dt_ckpt_info_free(&info);
    CHECK(memcmp(dt_params_data(r), dt_params_data(w), 10 * 4) == 0);
    CHECK(memcmp(dt_params_buffers(r), dt_params_buffers(w), 8 * 4) == 0);
    size_t n1, n2;
    float *s1 = dt_optim_state(ow, &n1), *s2 = dt_optim_state(or, &n2);
    CHECK(n1 == n2 && memcmp(s1, s2, n1 * 4) == 0);
    CHECK_EQ(dt_optim_step_count(or), 2);

    // A model file of the same: parameters and buffers.
    snprintf(file, sizeof file, "%s/m.dtck", dir);
    ct_fill(dt_params_buffers(w), 8, 9);
    CHECK_OK(dt_ckpt_save_params(file, w));
    CHECK_OK(dt_ckpt_verify(file));
    CHECK_OK(dt_ckpt_load_params(file, r));
    CHECK(memcmp(dt_params_buffers(r), dt_params_buffers(w), 8 * 4) == 0);
    // The file says version 2 and carries the flags of "b" (PTAB's last u32 is 2).
    size_t         n     = 0;
    unsigned char *bytes = ct_read(file, &n);
    if (!CHECK(bytes && n > 64))
        return;
    CHECK_EQ(ct_get32(bytes + 8), 2);
    ct_section secs[8];
    CHECK_EQ(ct_sections(bytes, n, secs, 8), 4);
    CHECK(strcmp(secs[0].tag, "PTAB") == 0 && strcmp(secs[2].tag, "BTAB") == 0 &&
          strcmp(secs[3].tag, "BUFS") == 0);
    CHECK_EQ(ct_get32(bytes + secs[0].payload_at + secs[0].len - 4), DT_PARAM_NO_DECAY);
    free(bytes);

    // Another buffer table is refused, naming it.
    dt_params *o = NULL;
    CHECK_OK(dt_params_new(&o, NULL));
    int64_t a[2] = {2, 3}, b[1] = {4}, c[1] = {5};
    CHECK_OK(dt_params_add(o, "a", 2, a, 0));
    CHECK_OK(dt_params_add(o, "b", 1, b, 0));
    CHECK_OK(dt_params_add_buffer(o, "running_mean", 1, c, 0));
    CHECK_OK(dt_params_add_buffer(o, "running_var", 1, b, 0));
    CHECK_OK(dt_params_alloc(o));
    CHECK_ERR(dt_ckpt_load_params(file, o), DT_ERR_MISMATCH,
              "buffer tensor 0: expected \"running_mean\" of shape (5)");
    dt_params_free(o);
    dt_optim_free(ow), dt_optim_free(or);
    dt_params_free(w), dt_params_free(r);
    ct_rm_tree(dir);
}

static void expect_v1_params(const float *p, size_t n) {
    int same = 1;
    for (size_t i = 0; i < n; i++)
        same &= p[i] == (float)i * 0.001f - 0.5f;
    CHECK(same);
}

static void test_version1(void) {
    if (!ct_exists(V1_DIR "/model.dtck")) {
        CHECK(!"tests/ckpt/data/v1 not found: run from the repository root");
        return;
    }
    CHECK_OK(dt_ckpt_verify(V1_DIR "/model.dtck"));
    CHECK_OK(dt_ckpt_verify(V1_DIR "/ckpt/step-000007"));
    dt_model *m = ct_model(99, 5);
    size_t    n = dt_model_num_params(m);
    CHECK_EQ(n, 299);
    CHECK_OK(dt_ckpt_load_model(V1_DIR "/model.dtck", m));
    expect_v1_params(dt_model_params(m), n);

    // The whole checkpoint: parameters, optimizer, RNG, key/values.
    dt_model   *m2 = ct_model(98, 5);
    dt_sgd_opts so = dt_sgd_opts_default();
    so.lr = 0.1f, so.momentum = 0.9f;
    dt_optim *o = NULL;
    CHECK_OK(dt_sgd_new(&o, dt_model_as_params(m2), &so));
    dt_rng        r      = dt_rng_init(0);
    dt_ckpt_rng   rngs[] = {{"dropout", &r}};
    dt_ckpt_state st     = {.model = m2, .optim = o, .rngs = rngs, .nrngs = 1};
    dt_ckpt_info  info;
    CHECK_OK(dt_ckpt_load(V1_DIR "/ckpt", NULL, &st, NULL, &info));
    CHECK(info.found && info.step == 7);
    CHECK(dt_ckpt_info_get(&info, "program") &&
          strcmp(dt_ckpt_info_get(&info, "program"), "gen-v1") == 0);
    dt_ckpt_info_free(&info);
    expect_v1_params(dt_model_params(m2), n);
    size_t nf;
    float *sf   = dt_optim_state(o, &nf);
    int    same = nf == n;
    for (size_t i = 0; same && i < nf; i++)
        same &= sf[i] == (float)i * 0.25f;
    CHECK(same);
    CHECK_EQ(dt_optim_step_count(o), 7);
    dt_rng want = dt_rng_init(42);
    dt_rng_split(&want, 1);
    CHECK(memcmp(&want, &r, sizeof r) == 0);

    // A version-1 file has no buffers: a table with buffers cannot take it.
    dt_params *p = NULL;
    CHECK_OK(dt_params_new(&p, NULL));
    for (int i = 0; i < dt_model_num_param_tensors(m); i++) {
        const dt_param_info *pi = dt_model_param_info(m, i);
        CHECK_OK(dt_params_add(p, pi->name, pi->ndim, pi->shape, 0));
    }
    int64_t four[1] = {4};
    CHECK_OK(dt_params_add_buffer(p, "stats", 1, four, 0));
    CHECK_OK(dt_params_alloc(p));
    CHECK_ERR(dt_ckpt_load_params(V1_DIR "/model.dtck", p), DT_ERR_MISMATCH,
              "a version-1 file has no buffers");
    dt_params_free(p);
    dt_optim_free(o);
    dt_model_free(m2);
    dt_model_free(m);
}

int main(void) {
    RUN(test_round_trip);
    RUN(test_version1);
    return check_summary();
}
