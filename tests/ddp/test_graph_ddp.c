// test_graph_ddp.c: DDP over a model graph (graph.h), in real processes.
//
// A one-block GPT (token and position embeddings, dropout, a pre-LN transformer block,
// a head tied to the token embedding) trains STEPS steps of plain SGD on cross-entropy:
// once in this process with the whole batch B, and on 2 ranks under dt_ddp_new with B/2
// each. The dropout masks are keyed by the dataset index of each sample
// (dt_graph_set_sample_keys) and the stream is split per step, so both runs draw the
// same masks; DDP averages the ranks' mean-loss gradients, which is the gradient of the
// whole batch's mean. The final parameters must agree to rounding (1e-5 of scale; one
// gradient missed, doubled, not averaged or a mask drawn per rank moves them by ~1e-2)
// and the two replicas must be bitwise equal. The tied tensor is reported to DDP once,
// after its last user in backward.
#include "../check.h"
#include "../lib/graphs.h"
#include "../lib/mp.h"
#include "dtrain/ddp.h"

#include <stdlib.h>

enum { T = 6, C = 8, HEADS = 2, VOCAB = 11, B = 8, STEPS = 4, MAXP = 4096 };
#define LR 0.2f

static int32_t g_tok[STEPS * B][T + 1]; // inputs and, shifted by one, targets

static void make_data(void) {
    dt_rng r = dt_rng_init(21);
    for (int i = 0; i < STEPS * B; i++)
        for (int t = 0; t <= T; t++)
            g_tok[i][t] = (int32_t)dt_rng_below(&r, VOCAB);
}

static dt_graph *build(void) {
    dt_graph *g = NULL;
    CHECK_OK(dt_graph_new(&g, NULL));
    CHECK_OK(tg_gpt(g, T, C, HEADS, VOCAB, 0.2f));
    CHECK_OK(dt_graph_finalize(g, 99));
    return g;
}

// Runs STEPS steps on samples [lo, lo + n) of each step's B; ddp may be NULL.
static void train(dt_graph *g, dt_ddp *ddp, int lo, int n) {
    dt_params *p = dt_graph_params(g);
    int32_t    idx[B * T], pos[B * T], tgt[B * T];
    uint64_t   keys[B];
    float     *dl   = malloc(sizeof(float) * B * T * VOCAB);
    dt_rng     root = dt_rng_init(5);
    for (int s = 0; s < STEPS; s++) {
        for (int i = 0; i < n; i++) {
            int gi  = s * B + lo + i; // the dataset index
            keys[i] = (uint64_t)gi;
            for (int t = 0; t < T; t++) {
                idx[i * T + t] = g_tok[gi][t];
                pos[i * T + t] = t;
                tgt[i * T + t] = t == 0 ? -1 : g_tok[gi][t + 1]; // one ignored per sample
            }
        }
        dt_rng r = dt_rng_split(&root, (uint64_t)s);
        dt_graph_set_rng(g, &r);
        CHECK_OK(dt_graph_set_sample_keys(g, keys, n));
        CHECK_OK(dt_graph_forward(g, (const void *[]){idx, pos}, n));
        float loss;
        CHECK_OK(
            dt_loss_cross_entropy_ex(dt_graph_output(g), tgt, n * T, VOCAB, -1, 0.1f, &loss, dl));
        dt_params_zero_grad(p);
        CHECK_OK(dt_graph_backward(g, dl));
        if (ddp)
            CHECK_OK(dt_ddp_sync(ddp));
        float *w = dt_params_data(p), *gr = dt_params_grads(p);
        for (size_t i = 0; i < dt_params_numel(p); i++)
            w[i] -= LR * gr[i];
    }
    free(dl);
}

static void ranks(int rank, int world, void *arg) {
    (void)arg;
    dt_pg *pg = mp_pg_init(0);
    if (!CHECK(pg != NULL))
        return;
    dt_graph *g = build();
    dt_ddp   *ddp;
    CHECK_OK(dt_ddp_new(&ddp, dt_graph_params(g), pg, NULL));
    train(g, ddp, rank * (B / world), B / world);
    dt_params *p   = dt_graph_params(g);
    float     *out = (float *)mp_shared() + (size_t)rank * MAXP;
    memcpy(out, dt_params_data(p), sizeof(float) * dt_params_numel(p));
    dt_ddp_free(ddp);
    dt_graph_free(g);
    dt_pg_free(pg);
}

int main(void) {
    make_data();
    check_current = "reference";
    dt_graph *ref = build();
    size_t    n   = dt_params_numel(dt_graph_params(ref));
    CHECK(n <= MAXP);
    float *init = malloc(sizeof(float) * n);
    memcpy(init, dt_params_data(dt_graph_params(ref)), sizeof(float) * n);
    train(ref, NULL, 0, B);
    const float *w     = dt_params_data(dt_graph_params(ref));
    double       scale = 0.0, moved = 0.0;
    for (size_t i = 0; i < n; i++) {
        scale = fmax(scale, fabs(w[i]));
        moved = fmax(moved, fabs(w[i] - init[i]));
    }
    CHECK(moved > 1e-2); // training moved the weights: the comparison below means something

    check_current = "ddp 2 ranks";
    mp_opts o     = {.world = 2, .timeout_ms = 60000};
    MP_RUN(&o, ranks, NULL);
    const float *r0 = mp_shared(), *r1 = (const float *)mp_shared() + MAXP;
    CHECK(memcmp(r0, r1, sizeof(float) * n) == 0);
    double err = 0.0;
    for (size_t i = 0; i < n; i++)
        err = fmax(err, fabs((double)r0[i] - w[i]));
    if (!CHECK(err <= 1e-5 * scale))
        fprintf(stderr, "     max |2 ranks - 1 rank| = %.3g (scale %.3g)\n", err, scale);

    dt_graph_free(ref);
    free(init);
    return check_summary();
}
