// test_params_ddp.c: DDP through the parameter contract (params.h) in real processes.
//
// - A hand-written MLP (forward and backward in plain loops, llm.c style) describes its
//   buffers with dt_params, reports each layer's gradients with dt_params_grad_ready,
//   and trains under dt_ddp_new on 2 ranks with different data per rank. It must end
//   with the weights of the same network built as a dt_model and trained under
//   dt_ddp_new over dt_model_as_params with the same initial weights and the same batches (to float
//   rounding: the model's GEMMs sum in another order; one missed, doubled or unaveraged gradient
//   moves the weights by ~1e-2, far beyond the 1e-4 asserted), and the replicas must be bitwise
//   equal.
// - Buffers are broadcast from rank 0 at start; frozen tensors are broadcast but never
//   waited for; a tensor never reported is named by dt_ddp_sync.
#include "../check.h"
#include "../lib/mp.h"
#include "dtrain/data.h"
#include "dtrain/ddp.h"
#include "dtrain/optim.h"

#include <math.h>
#include <stdlib.h>

enum { IN = 64, HID = 16, OUT = 10, BATCH = 32, STEPS = 6 };

static dt_dataset g_data; // inherited by the forked ranks

static void make_data(dt_dataset *ds, size_t n) {
    uint8_t *img = malloc(n * IN), *lab = malloc(n);
    dt_rng   r = dt_rng_init(7);
    for (size_t i = 0; i < n * IN; i++)
        img[i] = (uint8_t)dt_rng_below(&r, 256);
    for (size_t i = 0; i < n; i++)
        lab[i] = (uint8_t)dt_rng_below(&r, 10);
    CHECK_OK(dt_dataset_init(ds, img, lab, n, 8, 8, NULL));
    free(img);
    free(lab);
}

// ------------------------------------------------------------ the hand-written MLP

// Parameters "1.weight" (HID, IN), "1.bias", "3.weight" (OUT, HID), "3.bias": the names
// and layout of dt_model's flatten-linear-relu-linear-log_softmax.
typedef struct mlp {
    dt_params *p;
    float     *h, *logp; // (B, HID), (B, OUT)
} mlp;

static void mlp_init(mlp *m) {
    CHECK_OK(dt_params_new(&m->p, NULL));
    int64_t w1[2] = {HID, IN}, b1[1] = {HID}, w2[2] = {OUT, HID}, b2[1] = {OUT};
    CHECK_OK(dt_params_add(m->p, "1.weight", 2, w1, 0));
    CHECK_OK(dt_params_add(m->p, "1.bias", 1, b1, DT_PARAM_NO_DECAY));
    CHECK_OK(dt_params_add(m->p, "3.weight", 2, w2, 0));
    CHECK_OK(dt_params_add(m->p, "3.bias", 1, b2, DT_PARAM_NO_DECAY));
    CHECK_OK(dt_params_alloc(m->p));
    m->h    = calloc(BATCH * HID, sizeof(float));
    m->logp = calloc(BATCH * OUT, sizeof(float));
}

static void mlp_free(mlp *m) {
    dt_params_free(m->p);
    free(m->h);
    free(m->logp);
}

static void mlp_forward(mlp *m, const float *x, int b) {
    const float *w1 = dt_params_data(m->p), *b1 = w1 + HID * IN;
    const float *w2 = b1 + HID, *b2 = w2 + OUT * HID;
    for (int i = 0; i < b; i++) {
        for (int j = 0; j < HID; j++) {
            float s = b1[j];
            for (int k = 0; k < IN; k++)
                s += x[i * IN + k] * w1[j * IN + k];
            m->h[i * HID + j] = s > 0 ? s : 0;
        }
        float *z = m->logp + i * OUT, mx = -INFINITY, se = 0;
        for (int o = 0; o < OUT; o++) {
            float s = b2[o];
            for (int j = 0; j < HID; j++)
                s += m->h[i * HID + j] * w2[o * HID + j];
            z[o] = s;
            mx   = s > mx ? s : mx;
        }
        for (int o = 0; o < OUT; o++)
            se += expf(z[o] - mx);
        for (int o = 0; o < OUT; o++)
            z[o] -= mx + logf(se);
    }
}

// Adds the gradients of the loss whose gradient w.r.t. logp is dlogp; reports layer 3,
// then layer 1, as final.
static void mlp_backward(mlp *m, const float *x, const float *dlogp, int b) {
    float *w1 = dt_params_data(m->p), *w2 = w1 + HID * IN + HID;
    float *g1 = dt_params_grads(m->p), *gb1 = g1 + HID * IN, *g2 = gb1 + HID, *gb2 = g2 + OUT * HID;
    float *dh = calloc((size_t)b * HID, sizeof(float));
    for (int i = 0; i < b; i++) {
        const float *d = dlogp + i * OUT, *lp = m->logp + i * OUT;
        float        sd = 0;
        for (int o = 0; o < OUT; o++)
            sd += d[o];
        for (int o = 0; o < OUT; o++) {
            float dz = d[o] - expf(lp[o]) * sd; // log_softmax backward
            gb2[o] += dz;
            for (int j = 0; j < HID; j++) {
                g2[o * HID + j] += dz * m->h[i * HID + j];
                dh[i * HID + j] += dz * w2[o * HID + j];
            }
        }
    }
    CHECK_OK(dt_params_grad_ready(m->p, HID * IN + HID, OUT * HID + OUT));
    for (int i = 0; i < b; i++)
        for (int j = 0; j < HID; j++) {
            float d = m->h[i * HID + j] > 0 ? dh[i * HID + j] : 0;
            gb1[j] += d;
            for (int k = 0; k < IN; k++)
                g1[j * IN + k] += d * x[i * IN + k];
        }
    CHECK_OK(dt_params_grad_ready(m->p, 0, HID * IN + HID));
    free(dh);
}

static dt_model *reference_model(uint64_t seed) {
    dt_model *m = NULL;
    dt_model_new(&m, 1, 8, 8);
    CHECK_OK(dt_model_add_flatten(m));
    CHECK_OK(dt_model_add_linear(m, HID));
    CHECK_OK(dt_model_add_relu(m));
    CHECK_OK(dt_model_add_linear(m, OUT));
    CHECK_OK(dt_model_add_log_softmax(m));
    CHECK_OK(dt_model_finalize(m, seed));
    return m;
}

// ------------------------------------------------------------ training either way

// STEPS steps of SGD with momentum on this rank's batches; the hand MLP when h is not
// NULL, else the model.
static void train(dt_pg *pg, dt_model *model, mlp *h) {
    int        world = dt_pg_size(pg), rank = dt_pg_rank(pg);
    dt_params *p   = h ? h->p : dt_model_as_params(model);
    dt_ddp    *ddp = NULL;
    if (h)
        CHECK_OK(dt_ddp_new(&ddp, p, pg, NULL));
    else
        CHECK_OK(dt_ddp_new(&ddp, dt_model_as_params(model), pg, NULL));
    dt_sgd_opts so = dt_sgd_opts_default();
    so.lr = 0.05f, so.momentum = 0.9f;
    dt_optim *opt = NULL;
    CHECK_OK(dt_sgd_new(&opt, p, &so));
    dt_sampler_opts smo = dt_sampler_opts_default();
    smo.num_replicas = world, smo.rank = rank, smo.seed = 11;
    dt_sampler *s = NULL;
    dt_sampler_new(&s, g_data.n, &smo);
    dt_loader_opts lo = dt_loader_opts_default();
    lo.batch_size     = BATCH;
    dt_loader *l      = NULL;
    dt_loader_new(&l, &g_data, s, &lo);
    float    dlogp[BATCH * OUT];
    dt_batch b;
    dt_loader_begin_epoch(l, 0);
    for (int i = 0; ddp && i < STEPS && dt_loader_next(l, &b); i++) {
        float loss;
        dt_params_zero_grad(p);
        if (h) {
            mlp_forward(h, b.x, (int)b.size);
            CHECK_OK(dt_loss_nll(h->logp, b.y, (int)b.size, OUT, &loss, dlogp));
            mlp_backward(h, b.x, dlogp, (int)b.size);
        } else {
            CHECK_OK(dt_model_forward(model, b.x, (int)b.size));
            CHECK_OK(dt_loss_nll(dt_model_output(model), b.y, (int)b.size, OUT, &loss, dlogp));
            CHECK_OK(dt_model_backward(model, dlogp));
        }
        CHECK_OK(dt_ddp_sync(ddp));
        dt_optim_step(opt);
    }
    dt_loader_free(l);
    dt_sampler_free(s);
    dt_optim_free(opt);
    dt_ddp_free(ddp);
}

static double rel_diff(const float *a, const float *b, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        num += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        den += (double)b[i] * b[i];
    }
    return sqrt(num / (den > 0 ? den : 1));
}

static void equivalence_rank(int rank, int world, void *arg) {
    (void)world, (void)arg;
    dt_pg *pg = mp_pg_init(0);
    if (!pg)
        return;
    dt_model *model = reference_model(21);
    mlp       h;
    mlp_init(&h);
    size_t n = dt_params_numel(h.p);
    CHECK_EQ(n, dt_model_num_params(model));
    // The same start on rank 0; other ranks start elsewhere (the broadcast fixes it).
    memcpy(dt_params_data(h.p), dt_model_params(model), n * 4);
    if (rank != 0)
        for (size_t i = 0; i < n; i++)
            dt_params_data(h.p)[i] += 0.5f;
    float *start = malloc(n * 4);
    memcpy(start, dt_model_params(model), n * 4);
    train(pg, model, NULL);
    train(pg, NULL, &h);
    double d = rel_diff(dt_params_data(h.p), dt_model_params(model), n);
    if (!CHECK(d < 1e-4))
        fprintf(stderr, "     rank %d: hand MLP differs from the dt_model by %.3g\n", rank, d);
    // It trained: the weights moved well beyond the tolerance.
    CHECK(rel_diff(dt_model_params(model), start, n) > 1e-2);
    int32_t mine = (int32_t)dt_crc32c(0, dt_params_data(h.p), n * 4), all[2] = {0, 0};
    CHECK_OK(dt_pg_all_gather(pg, &mine, all, 1, DT_INT32));
    CHECK(all[0] == all[1]);
    if (rank == 0)
        fprintf(stderr, "     hand-written MLP vs dt_model under DDP, world 2, %d steps: %.2g\n",
                STEPS, d);
    free(start);
    mlp_free(&h);
    dt_model_free(model);
    dt_pg_free(pg);
}

static void test_hand_written_equals_model(void) {
    mp_opts o = {.world = 2};
    MP_RUN(&o, equivalence_rank, NULL);
}

// ------------------------------------------------------------ buffers, frozen, errors

static dt_params *table_with_extras(void) {
    dt_params *p;
    CHECK_OK(dt_params_new(&p, NULL));
    int64_t a[1] = {5}, b[2] = {3, 4}, c[1] = {3};
    CHECK_OK(dt_params_add(p, "a", 1, a, 0));
    CHECK_OK(dt_params_add(p, "frozen", 2, b, DT_PARAM_FROZEN));
    CHECK_OK(dt_params_add(p, "c", 1, c, 0));
    CHECK_OK(dt_params_add_buffer(p, "running_mean", 1, c, 0));
    CHECK_OK(dt_params_alloc(p));
    return p;
}

static void extras_rank(int rank, int world, void *arg) {
    (void)world, (void)arg;
    dt_pg *pg = mp_pg_init(0);
    if (!pg)
        return;
    dt_params *p = table_with_extras();
    for (size_t i = 0; i < dt_params_numel(p); i++)
        dt_params_data(p)[i] = (float)(rank * 100 + (int)i);
    for (int i = 0; i < 3; i++)
        dt_params_buffers(p)[i] = (float)(rank * 10 + i);
    dt_ddp *d = NULL;
    CHECK_OK(dt_ddp_new(&d, p, pg, NULL));
    if (!d)
        return;
    // Rank 0's parameters and buffers everywhere.
    CHECK(dt_params_data(p)[7] == 7.0f && dt_params_buffers(p)[2] == 2.0f);
    // The frozen tensor is never waited for; the others are averaged.
    for (size_t i = 0; i < dt_params_numel(p); i++)
        dt_params_grads(p)[i] = (float)(rank + 1);
    CHECK_OK(dt_params_grad_ready(p, 17, 3)); // "c"
    CHECK_OK(dt_params_grad_ready(p, 5, 12)); // "frozen": nothing to wait for
    CHECK_OK(dt_params_grad_ready(p, 0, 5));  // "a"
    CHECK_OK(dt_ddp_sync(d));
    CHECK(dt_params_grads(p)[0] == 1.5f && dt_params_grads(p)[19] == 1.5f);
    // A tensor never reported is named.
    CHECK_OK(dt_params_grad_ready(p, 0, 5));
    CHECK_ERR(dt_ddp_sync(d), DT_ERR_STATE, "(c)");
    dt_ddp_free(d);
    dt_params_free(p);
    dt_pg_free(pg);
}

static void test_buffers_frozen_missing(void) {
    mp_opts o = {.world = 2};
    MP_RUN(&o, extras_rank, NULL);
}

// A buffer table that differs between ranks is refused on every rank, naming it.
static void buffer_mismatch_rank(int rank, int world, void *arg) {
    (void)world, (void)arg;
    dt_pg *pg = mp_pg_init(10000);
    if (!pg)
        return;
    dt_params *p;
    CHECK_OK(dt_params_new(&p, NULL));
    int64_t a[1] = {4}, b[1] = {rank == 0 ? 3 : 2};
    CHECK_OK(dt_params_add(p, "w", 1, a, 0));
    CHECK_OK(dt_params_add_buffer(p, "stats", 1, b, 0));
    CHECK_OK(dt_params_alloc(p));
    dt_ddp *d = NULL;
    CHECK_ERR(dt_ddp_new(&d, p, pg, NULL), DT_ERR_MISMATCH,
              "buffer stats has shape (3) on rank 0 but (2) on rank 1");
    CHECK(d == NULL);
    dt_params_free(p);
    dt_pg_free(pg);
}

static void test_buffer_mismatch(void) {
    mp_opts o = {.world = 2};
    MP_RUN(&o, buffer_mismatch_rank, NULL);
}

int main(void) {
    make_data(&g_data, 400);
    RUN(test_hand_written_equals_model);
    RUN(test_buffers_frozen_missing);
    RUN(test_buffer_mismatch);
    dt_dataset_free(&g_data);
    return check_summary();
}
