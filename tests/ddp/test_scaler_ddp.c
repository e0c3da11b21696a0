// test_scaler_ddp.c: the loss scaler's inf check agreed across ranks (dt_ddp_agree_inf)
// in 2 real processes. Rank 1 alone sees inf at step 2 (its gradients are not averaged
// here, so rank 0's stay finite): both ranks must skip that step and back off, and end
// with the same scale, tracker and weights. Without the agreement rank 0 would step
// (checked: a scaler without the callback on rank 0 takes the step).
#include "../check.h"
#include "../lib/mp.h"
#include "dtrain/ddp.h"
#include "dtrain/optim.h"

#include <math.h>

static void ranks(int rank, int world, void *arg) {
    (void)world, (void)arg;
    dt_pg *pg = mp_pg_init(0);
    if (!CHECK(pg != NULL))
        return;
    dt_params *p;
    int64_t    shape[1] = {4};
    CHECK_OK(dt_params_new(&p, NULL));
    CHECK_OK(dt_params_add(p, "w", 1, shape, 0));
    CHECK_OK(dt_params_alloc(p));
    dt_optim *o;
    CHECK_OK(dt_sgd_new(&o, p, &(dt_sgd_opts){.lr = 1.0f}));
    dt_grad_scaler_opts so = dt_grad_scaler_opts_default();
    so.growth_interval     = 2;
    so.agree               = dt_ddp_agree_inf;
    so.agree_user          = pg;
    dt_grad_scaler *s, *alone;
    CHECK_OK(dt_grad_scaler_new(&s, &so));
    so.agree = NULL;
    CHECK_OK(dt_grad_scaler_new(&alone, &so));
    // steps 0..4; rank 1 sees inf at step 2. By hand (interval 2):
    // 0 good (2^16,1), 1 good (2^17,0), 2 inf (2^16,0), 3 good (2^16,1), 4 good (2^17,0)
    const float   want_scale[] = {65536, 131072, 65536, 65536, 131072};
    const int64_t want_track[] = {1, 0, 0, 1, 0};
    float        *g = dt_params_grads(p), *w = dt_params_data(p);
    int           took = 0;
    for (int t = 0; t < 5; t++) {
        float sc = dt_grad_scaler_scale(s);
        for (int i = 0; i < 4; i++)
            g[i] = (t == 2 && rank == 1 && i == 3) ? INFINITY : 0.25f * sc;
        bool stepped;
        CHECK_OK(dt_grad_scaler_step(s, o, &stepped));
        CHECK_EQ(stepped, t != 2);
        took += stepped;
        CHECK_OK(dt_grad_scaler_update(s));
        dt_grad_scaler_state st;
        dt_grad_scaler_get_state(s, &st);
        CHECK(st.scale == want_scale[t]);
        CHECK_EQ(st.growth_tracker, want_track[t]);
        if (t == 2 && rank == 0) { // the same gradients, no agreement: rank 0 alone steps
            for (int i = 0; i < 4; i++)
                g[i] = 1.0f;
            CHECK_OK(dt_grad_scaler_unscale(alone, p));
            CHECK(!dt_grad_scaler_found_inf(alone));
            CHECK_OK(dt_grad_scaler_update(alone));
        }
    }
    CHECK_EQ(took, 4);
    CHECK(w[0] == -1.0f); // 4 steps of lr 1 x 0.25
    // every rank ends with the same weights and state
    float mine[2] = {w[0], dt_grad_scaler_scale(s)}, all[4];
    CHECK_OK(dt_pg_all_gather(pg, mine, all, 2, DT_FLOAT32));
    CHECK(all[0] == all[2] && all[1] == all[3]);
    dt_grad_scaler_free(s);
    dt_grad_scaler_free(alone);
    dt_optim_free(o);
    dt_params_free(p);
    dt_pg_free(pg);
}

static void test_rank_alone_sees_inf(void) {
    mp_opts o = {.world = 2, .timeout_ms = 60000};
    MP_RUN(&o, ranks, NULL);
}

int main(void) {
    RUN(test_rank_alone_sees_inf);
    return check_summary();
}
