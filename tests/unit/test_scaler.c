// test_scaler.c: the loss scaler's state machine (optim.h) against hand-computed
// sequences of GradScaler (torch.cuda.amp): initial 2^16, x0.5 and a skipped step on
// inf/NaN, x2 after growth_interval consecutive good steps; its state text round trip.
#include "../check.h"
#include "dtrain/optim.h"

#include <math.h>

static dt_params *make_params(void) {
    dt_params *p;
    int64_t    s1[1] = {5}, s2[1] = {3};
    CHECK_OK(dt_params_new(&p, NULL));
    CHECK_OK(dt_params_add(p, "w", 1, s1, 0));
    CHECK_OK(dt_params_add(p, "frozen", 1, s2, DT_PARAM_FROZEN));
    CHECK_OK(dt_params_alloc(p));
    return p;
}

static void fill_grads(dt_params *p, float v) {
    float *g = dt_params_grads(p);
    for (int i = 0; i < 8; i++)
        g[i] = v;
}

// A sequence: 'g' good step, 'i' inf, 'n' NaN. growth_interval 3.
static void test_sequence(void) {
    dt_params *p = make_params();
    dt_optim  *o;
    CHECK_OK(dt_sgd_new(&o, p, &(dt_sgd_opts){.lr = 1.0f}));
    dt_grad_scaler_opts so = dt_grad_scaler_opts_default();
    CHECK(so.init_scale == 65536.0f && so.growth_interval == 2000);
    CHECK(so.growth_factor == 2.0f && so.backoff_factor == 0.5f);
    so.growth_interval = 3;
    dt_grad_scaler *s;
    CHECK_OK(dt_grad_scaler_new(&s, &so));
    const char *seq = "ggigggnggg";
    // by hand: after each update (scale, tracker):
    // g: (2^16,1) g: (2^16,2) i: (2^15,0) g: (2^15,1) g: (2^15,2) g: (2^16,0)
    // n: (2^15,0) g: (2^15,1) g: (2^15,2) g: (2^16,0)
    const float   scale_after[]   = {65536, 65536, 32768, 32768, 32768,
                                     65536, 32768, 32768, 32768, 65536};
    const int64_t tracker_after[] = {1, 2, 0, 1, 2, 0, 0, 1, 2, 0};
    float        *w               = dt_params_data(p);
    int           steps           = 0;
    for (int t = 0; seq[t]; t++) {
        float sc = dt_grad_scaler_scale(s);
        // gradient 0.5 per element, as backward of a loss scaled by sc would give
        fill_grads(p, seq[t] == 'g' ? 0.5f * sc : seq[t] == 'i' ? INFINITY : NAN);
        float before = w[0];
        bool  stepped;
        CHECK_OK(dt_grad_scaler_step(s, o, &stepped));
        CHECK_EQ(stepped, seq[t] == 'g');
        CHECK_EQ(dt_grad_scaler_found_inf(s), seq[t] != 'g');
        if (stepped) {
            CHECK(w[0] == before - 0.5f); // unscaled exactly (power-of-two scale)
            steps++;
        } else {
            CHECK(w[0] == before);
        }
        CHECK_OK(dt_grad_scaler_update(s));
        dt_grad_scaler_state st;
        dt_grad_scaler_get_state(s, &st);
        CHECK(st.scale == scale_after[t]);
        CHECK_EQ(st.growth_tracker, tracker_after[t]);
    }
    CHECK_EQ(steps, 8);
    CHECK_EQ(dt_optim_step_count(o), 8);
    dt_grad_scaler_free(s);
    dt_optim_free(o);
    dt_params_free(p);
}

// The default: 2000 good steps double the scale, the 1999th does not; an inf in a
// frozen tensor's gradient is ignored (PyTorch unscales only what the optimizer owns).
static void test_default_interval(void) {
    dt_params      *p = make_params();
    dt_grad_scaler *s;
    CHECK_OK(dt_grad_scaler_new(&s, NULL));
    for (int t = 1; t <= 2000; t++) {
        fill_grads(p, 1.0f);
        dt_params_grads(p)[6] = INFINITY; // the frozen tensor
        CHECK_OK(dt_grad_scaler_unscale(s, p));
        CHECK(!dt_grad_scaler_found_inf(s));
        CHECK_OK(dt_grad_scaler_update(s));
        if (t == 1999)
            CHECK(dt_grad_scaler_scale(s) == 65536.0f);
    }
    CHECK(dt_grad_scaler_scale(s) == 131072.0f);
    // unscale divides by the scale
    fill_grads(p, 131072.0f * 3);
    CHECK_OK(dt_grad_scaler_unscale(s, p));
    CHECK(dt_params_grads(p)[0] == 3.0f);
    CHECK_ERR(dt_grad_scaler_unscale(s, p), DT_ERR_STATE, "already");
    CHECK_OK(dt_grad_scaler_update(s));
    CHECK_ERR(dt_grad_scaler_update(s), DT_ERR_STATE, "without unscale");
    dt_grad_scaler_free(s);
    dt_params_free(p);
}

// Growth that would overflow float keeps the old scale (PyTorch: only finite growth).
static void test_growth_capped(void) {
    dt_params          *p  = make_params();
    dt_grad_scaler_opts so = dt_grad_scaler_opts_default();
    so.init_scale          = 0x1p127f;
    so.growth_interval     = 1;
    dt_grad_scaler *s;
    CHECK_OK(dt_grad_scaler_new(&s, &so));
    fill_grads(p, 1.0f);
    CHECK_OK(dt_grad_scaler_unscale(s, p));
    CHECK_OK(dt_grad_scaler_update(s));
    CHECK(dt_grad_scaler_scale(s) == 0x1p127f);
    dt_grad_scaler_free(s);
    dt_params_free(p);
}

static void test_state_text(void) {
    dt_grad_scaler *s, *s2;
    CHECK_OK(dt_grad_scaler_new(&s, NULL));
    CHECK_OK(dt_grad_scaler_new(&s2, NULL));
    dt_grad_scaler_state st = {.scale = 0.000123f, .growth_tracker = 1999};
    CHECK_OK(dt_grad_scaler_set_state(s, &st));
    char buf[64];
    CHECK(dt_grad_scaler_state_str(s, buf, sizeof buf) < (int)sizeof buf);
    CHECK_OK(dt_grad_scaler_load_str(s2, buf));
    dt_grad_scaler_state st2;
    dt_grad_scaler_get_state(s2, &st2);
    CHECK(st2.scale == st.scale); // exact
    CHECK_EQ(st2.growth_tracker, 1999);
    CHECK_ERR(dt_grad_scaler_load_str(s2, "scale=1 tracker=2"), DT_ERR_FORMAT, "expected");
    CHECK_ERR(dt_grad_scaler_load_str(s2, "scale=0x1p+16 growth_tracker=2000"), DT_ERR_FORMAT,
              "growth_tracker");
    CHECK_ERR(dt_grad_scaler_load_str(s2, "scale=-0x1p+16 growth_tracker=0"), DT_ERR_FORMAT,
              "scale");
    CHECK_ERR(dt_grad_scaler_load_str(s2, "scale=0x1p+16 growth_tracker=0 junk"), DT_ERR_FORMAT,
              "expected");
    dt_grad_scaler_opts bad = dt_grad_scaler_opts_default();
    bad.backoff_factor      = 1.5f;
    dt_grad_scaler *s3      = (dt_grad_scaler *)1;
    CHECK_ERR(dt_grad_scaler_new(&s3, &bad), DT_ERR_ARG, "backoff_factor");
    CHECK(s3 == NULL);
    dt_grad_scaler_free(s);
    dt_grad_scaler_free(s2);
}

// Disabled: scale 1, inf never skips (as GradScaler(enabled=False) passes through).
static void test_disabled(void) {
    dt_params          *p  = make_params();
    dt_grad_scaler_opts so = dt_grad_scaler_opts_default();
    so.enabled             = false;
    dt_grad_scaler *s;
    CHECK_OK(dt_grad_scaler_new(&s, &so));
    CHECK(dt_grad_scaler_scale(s) == 1.0f);
    fill_grads(p, 2.0f);
    CHECK_OK(dt_grad_scaler_unscale(s, p));
    CHECK(dt_params_grads(p)[0] == 2.0f);
    CHECK_OK(dt_grad_scaler_update(s));
    dt_grad_scaler_free(s);
    dt_params_free(p);
}

int main(void) {
    RUN(test_sequence);
    RUN(test_default_interval);
    RUN(test_growth_capped);
    RUN(test_state_text);
    RUN(test_disabled);
    return check_summary();
}
