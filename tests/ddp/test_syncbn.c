// test_syncbn.c: SyncBatchNorm (dt_syncbn_opts) on N ranks with batch B/N against
// BatchNorm on one process with batch B, in real processes.
//
// A ResNet basic block (conv-BN-ReLU-conv-BN + x, ReLU) trains STEPS steps of SGD on
// MSE under DDP, its two BatchNorms synchronised over the group, for N = 2 and 3. The
// reference is the same block with plain BatchNorm trained here on the whole batch.
// Each rank's first output must equal its slice of the reference's (batch statistics
// over the group, not the rank: plain BatchNorm on B/N samples is off by ~1e-1), and
// the final parameters and running statistics must equal the reference's, to rounding
// (1e-5 of scale). The replicas must be bitwise equal.
#include "../check.h"
#include "../lib/graphs.h"
#include "../lib/mp.h"
#include "dtrain/ddp.h"

#include <stdlib.h>

enum { C = 3, H = 5, W = 4, B = 6, STEPS = 3, SLOT = 2048 };
#define LR  0.05f
#define PER (C * H * W)

static float g_x[STEPS][B * PER], g_t[STEPS][B * PER];

static dt_graph *build(dt_pg *pg) {
    dt_graph         *g = NULL;
    dt_batchnorm_opts o = dt_batchnorm_opts_default();
    if (pg)
        CHECK_OK(dt_syncbn_opts(&o, pg));
    CHECK_OK(dt_graph_new(&g, NULL));
    CHECK_OK(tg_resblock(g, C, H, W, &o));
    CHECK_OK(dt_graph_finalize(g, 17));
    return g;
}

// Trains on samples [lo, lo + n) of every step; writes the first output into y0.
static void train(dt_graph *g, dt_ddp *ddp, int lo, int n, float *y0) {
    dt_params *p  = dt_graph_params(g);
    float     *dl = malloc(sizeof(float) * B * PER);
    for (int s = 0; s < STEPS; s++) {
        CHECK_OK(dt_graph_forward(g, (const void *[]){g_x[s] + lo * PER}, n));
        if (s == 0)
            memcpy(y0, dt_graph_output(g), sizeof(float) * (size_t)n * PER);
        float loss;
        CHECK_OK(dt_loss_mse(dt_graph_output(g), g_t[s] + lo * PER, (size_t)n * PER, &loss, dl));
        dt_params_zero_grad(p);
        CHECK_OK(dt_graph_backward(g, dl));
        if (ddp)
            CHECK_OK(dt_ddp_sync(ddp));
        for (size_t i = 0; i < dt_params_numel(p); i++)
            dt_params_data(p)[i] -= LR * dt_params_grads(p)[i];
    }
    free(dl);
}

// Slot layout: parameters, buffers, then the first output.
static void ranks(int rank, int world, void *arg) {
    (void)arg;
    dt_pg *pg = mp_pg_init(0);
    if (!CHECK(pg != NULL))
        return;
    dt_graph *g = build(pg);
    dt_ddp   *ddp;
    CHECK_OK(dt_ddp_new(&ddp, dt_graph_params(g), pg, NULL));
    dt_params *p   = dt_graph_params(g);
    float     *out = (float *)mp_shared() + (size_t)rank * SLOT;
    size_t     np = dt_params_numel(p), nb = dt_params_buffer_numel(p);
    int        n = B / world;
    train(g, ddp, rank * n, n, out + np + nb);
    memcpy(out, dt_params_data(p), sizeof(float) * np);
    memcpy(out + np, dt_params_buffers(p), sizeof(float) * nb);
    dt_ddp_free(ddp);
    dt_graph_free(g);
    dt_pg_free(pg);
}

static double maxdiff(const float *a, const float *b, size_t n, double *scale) {
    double e = 0.0;
    *scale   = 0.0;
    for (size_t i = 0; i < n; i++) {
        e      = fmax(e, fabs((double)a[i] - b[i]));
        *scale = fmax(*scale, fabs((double)b[i]));
    }
    return e;
}

int main(void) {
    dt_rng r = dt_rng_init(12);
    for (int s = 0; s < STEPS; s++)
        for (int i = 0; i < B * PER; i++) {
            g_x[s][i] = dt_rng_normal(&r) * 2.0f + 1.0f;
            g_t[s][i] = dt_rng_normal(&r);
        }
    check_current  = "reference";
    dt_graph  *ref = build(NULL);
    dt_params *p   = dt_graph_params(ref);
    size_t     np = dt_params_numel(p), nb = dt_params_buffer_numel(p);
    CHECK(np + nb + B * PER <= SLOT);
    float *y0 = malloc(sizeof(float) * B * PER);
    train(ref, NULL, 0, B, y0);

    // Plain BatchNorm on half the batch normalises differently: the check has teeth.
    dt_graph *half = build(NULL);
    CHECK_OK(dt_graph_forward(half, (const void *[]){g_x[0]}, B / 2));
    double sc, local = maxdiff(dt_graph_output(half), y0, B / 2 * PER, &sc);
    CHECK(local > 1e-2 * sc);
    dt_graph_free(half);

    for (int world = 2; world <= 3; world++) {
        char name[32];
        snprintf(name, sizeof name, "syncbn %d ranks", world);
        check_current = name;
        mp_opts o     = {.world = world, .timeout_ms = 60000};
        MP_RUN(&o, ranks, NULL);
        const float *r0 = mp_shared();
        double       scale, e;
        for (int k = 1; k < world; k++)
            CHECK(memcmp(r0, r0 + (size_t)k * SLOT, sizeof(float) * (np + nb)) == 0);
        e = maxdiff(r0, dt_params_data(p), np, &scale);
        if (!CHECK(e <= 1e-5 * scale))
            fprintf(stderr, "     parameters: max error %.3g (scale %.3g)\n", e, scale);
        e = maxdiff(r0 + np, dt_params_buffers(p), nb, &scale);
        if (!CHECK(e <= 1e-5 * scale))
            fprintf(stderr, "     running statistics: max error %.3g (scale %.3g)\n", e, scale);
        int n = B / world;
        for (int k = 0; k < world; k++) {
            e = maxdiff(r0 + (size_t)k * SLOT + np + nb, y0 + (size_t)k * n * PER, (size_t)n * PER,
                        &scale);
            if (!CHECK(e <= 1e-5 * scale))
                fprintf(stderr, "     rank %d output: max error %.3g (scale %.3g)\n", k, e, scale);
        }
    }
    free(y0);
    dt_graph_free(ref);
    return check_summary();
}
