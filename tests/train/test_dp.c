// DataParallel in one process (dp.h, --data-parallel): N replicas on N threads give the
// gradient of the whole batch, bitwise for N = 1 and to rounding for N > 1 (dropout
// included: masks keyed by dataset index), for a dt_model (convolutional, with
// dropout), a dt_graph and uneven or empty slices; a replica's failure and bad
// replica counts are refused with clear messages; through the trainer, --data-parallel
// N trains the model of one thread and of N processes with DDP to rounding, and so do
// replicas inside each of several processes.
//
// Tolerance: parameters after the trainer's runs (2 epochs of SGD with momentum on a
// small MLP, values ~0.1) within 1e-5 absolute, the bound the trainer's tests use for
// 1 vs 2 vs 4 processes; single gradients within 1e-6 relative to their largest value.
#include "../check.h"
#include "../lib/mp.h"
#include "dtrain/train.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

enum { H = 8, W = 8, NS = 100, MAXP = 4096, MAXB = 64 };

static dt_dataset train_set;

// --------------------------------------------------------------- models as replicas

// A small ConvNet with dropout (kind 0) or an MLP with dropout (kind 1).
static dt_status make_model(dt_model **out, int kind, uint64_t seed) {
    dt_model *m  = NULL;
    dt_status st = dt_model_new(&m, 1, H, W);
    if (st != DT_OK)
        return st;
    if (kind == 0)
        st = dt_model_add_conv2d(m, 4, 3, 1, 1);
    if (!st && kind == 0)
        st = dt_model_add_relu(m);
    if (!st && kind == 0)
        st = dt_model_add_maxpool2d(m, 2, 2);
    if (st || (st = dt_model_add_flatten(m)) || (st = dt_model_add_linear(m, 16)) ||
        (st = dt_model_add_relu(m)) || (st = dt_model_add_dropout(m, 0.25f)) ||
        (st = dt_model_add_linear(m, 10)) || (st = dt_model_add_log_softmax(m)) ||
        (st = dt_model_finalize(m, seed)) || (st = dt_model_set_threads(m, 1))) {
        dt_model_free(m);
        return st;
    }
    *out = m;
    return DT_OK;
}

typedef struct rep {
    dt_model *m;
    dt_graph *g;
    float     dout[MAXB * 10];
} rep;

typedef struct factory {
    int kind;      // 0, 1: dt_model kinds; 2: a dt_graph
    int fail_at;   // work fails on the replica whose slice holds this sample (-1: none)
    int bad_index; // make builds a wrong layout for this replica (-1: none)
} factory;

static dt_status make_graph(dt_graph **out, int hidden, uint64_t seed) {
    dt_graph *g;
    dt_layer *l;
    DT_TRY(dt_graph_new(&g, NULL));
    dt_status st;
    if ((st = dt_graph_input(g, "x", &(dt_shape){.ndim = 1, .d = {H * W}})) ||
        (st = dt_layer_linear_new(&l, H * W, hidden, NULL)) ||
        (st = dt_graph_add(g, "fc1", l, "x")) || (st = dt_layer_act_new(&l, DT_ACT_GELU, NULL)) ||
        (st = dt_graph_add(g, "act", l, "fc1")) || (st = dt_layer_dropout_new(&l, 0.2f, NULL)) ||
        (st = dt_graph_add(g, "drop", l, "act")) ||
        (st = dt_layer_linear_new(&l, hidden, 10, NULL)) ||
        (st = dt_graph_add(g, "fc2", l, "drop")) || (st = dt_graph_finalize(g, seed))) {
        dt_graph_free(g);
        return st;
    }
    *out = g;
    return DT_OK;
}

static dt_status make_rep(void *user, int index, dt_dp_replica *out) {
    factory *f = user;
    rep     *r = dt_alloc_zero(sizeof *r);
    if (!r)
        return DT_ERR_NOMEM;
    dt_status st =
        f->kind == 2
            ? make_graph(&r->g, index >= 0 && index == f->bad_index ? 12 : 16, 100 + index)
            : make_model(&r->m, index >= 0 && index == f->bad_index ? 1 - f->kind : f->kind,
                         100 + (uint64_t)index);
    if (st) {
        dt_free(r);
        return st;
    }
    *out = (dt_dp_replica){.obj    = r,
                           .params = r->g ? dt_graph_params(r->g) : dt_model_as_params(r->m),
                           .model  = r->m,
                           .graph  = r->g};
    return DT_OK;
}

static void drop_rep(void *user, dt_dp_replica *d) {
    (void)user;
    rep *r = d->obj;
    dt_model_free(r->m);
    dt_graph_free(r->g);
    dt_free(r);
}

static dt_status work(void *user, dt_dp_replica *d, const dt_batch *b, float *loss) {
    factory *f = user;
    rep     *r = d->obj;
    for (size_t s = 0; s < b->size; s++)
        if ((int)b->indices[s] == f->fail_at)
            return dt_fail(DT_ERR_FORMAT, "sample %d is unreadable", f->fail_at);
    if (r->g) {
        DT_TRY(dt_graph_forward(r->g, (const void *[]){b->x}, (int)b->size));
        DT_TRY(dt_loss_cross_entropy_ex(dt_graph_output(r->g), b->y, (int)b->size, 10, -1, 0.0f,
                                        loss, r->dout));
        return dt_graph_backward(r->g, r->dout);
    }
    DT_TRY(dt_model_forward(r->m, b->x, (int)b->size));
    DT_TRY(dt_loss_nll(dt_model_output(r->m), b->y, (int)b->size, 10, loss, r->dout));
    return dt_model_backward(r->m, r->dout);
}

// A batch of n samples (dataset indices spread over the set, some repeated).
static float    bx[MAXB * H * W];
static int32_t  by[MAXB];
static uint32_t bi[MAXB];

static dt_batch make_batch(size_t n) {
    for (size_t s = 0; s < n; s++) {
        bi[s] = (uint32_t)((s * 37 + 11) % NS);
        by[s] = train_set.labels[bi[s]];
        for (int k = 0; k < H * W; k++)
            bx[s * H * W + (size_t)k] = (float)train_set.images[bi[s] * H * W + (size_t)k] / 255.0f;
    }
    return (dt_batch){.x            = bx,
                      .y            = by,
                      .indices      = bi,
                      .size         = n,
                      .h            = H,
                      .w            = W,
                      .sample_elems = H * W,
                      .ndim         = 3,
                      .shape        = {1, H, W}};
}

static float ref_g[MAXP], dp_g[MAXP];
static int   numel;

// The master's gradient for batch b: the plain loop (n = 0), or n replicas. Both start
// from the same master (seed 7) and the same dropout stream. *loss the batch's loss.
static dt_status gradient(factory *f, int n, size_t batch, float *out, float *loss) {
    dt_dp_replica master;
    DT_TRY(make_rep(f, -1, &master));
    dt_params *p = master.params;
    // The master's own values: replicas must copy them (theirs are seeded otherwise).
    dt_rng r = dt_rng_init(7);
    for (size_t i = 0; i < dt_params_numel(p); i++)
        dt_params_data(p)[i] = dt_rng_uniform_range(&r, -0.3f, 0.3f);
    dt_rng    drop = dt_rng_init(42);
    dt_batch  b    = make_batch(batch);
    dt_status st   = DT_OK;
    dt_params_zero_grad(p);
    if (n == 0) {
        uint64_t keys[MAXB];
        for (size_t s = 0; s < batch; s++)
            keys[s] = bi[s];
        if (master.model) {
            dt_model_set_rng(master.model, &drop);
            st = dt_model_set_sample_keys(master.model, keys, (int)batch);
        } else {
            dt_graph_set_rng(master.graph, &drop);
            st = dt_graph_set_sample_keys(master.graph, keys, (int)batch);
        }
        if (!st)
            st = work(f, &master, &b, loss);
    } else {
        dt_dp    *dp;
        dt_dp_ops ops = {make_rep, drop_rep, work, f};
        st            = dt_dp_new(&dp, p, n, &ops, NULL);
        if (!st) {
            dt_dp_set_rng(dp, &drop);
            st = dt_dp_forward_backward(dp, &b, loss);
            dt_dp_free(dp);
        }
    }
    numel = (int)dt_params_numel(p);
    if (!st)
        memcpy(out, dt_params_grads(p), sizeof(float) * (size_t)numel);
    drop_rep(f, &master);
    return st;
}

static float rel_diff(const float *a, const float *b, int n) {
    float d = 0, m = 0;
    for (int i = 0; i < n; i++) {
        d = fmaxf(d, fabsf(a[i] - b[i]));
        m = fmaxf(m, fabsf(a[i]));
    }
    return m > 0 ? d / m : INFINITY;
}

static void test_gradients(void) {
    const char *names[] = {"ConvNet (dt_model)", "MLP (dt_model)", "MLP (dt_graph)"};
    for (int kind = 0; kind < 3; kind++) {
        factory f = {kind, -1, -1};
        float   lref, l;
        CHECK_OK(gradient(&f, 0, 24, ref_g, &lref));
        CHECK(numel > 0 && numel <= MAXP);
        // One replica: bitwise the plain loop.
        CHECK_OK(gradient(&f, 1, 24, dp_g, &l));
        CHECK(memcmp(dp_g, ref_g, sizeof(float) * (size_t)numel) == 0);
        CHECK(l == lref);
        // Even (2, 3, 4, 8) and uneven (5, 7) slices; 24 samples on 32 replicas leaves 8
        // replicas without samples.
        int ns[] = {2, 3, 4, 5, 7, 8, 32};
        for (size_t k = 0; k < sizeof ns / sizeof ns[0]; k++) {
            CHECK_OK(gradient(&f, ns[k], 24, dp_g, &l));
            float d = rel_diff(ref_g, dp_g, numel);
            CHECK(d < 1e-6f);
            CHECK_NEAR(l, lref, 1e-6 * fabs(lref));
            if (ns[k] == 4 || ns[k] == 32)
                printf("     %s, %d replicas: max |diff| / max |g| = %.2g\n", names[kind], ns[k],
                       (double)d);
        }
        // Timing does not matter: the same run twice is bitwise the same.
        CHECK_OK(gradient(&f, 5, 24, ref_g, &lref));
        CHECK_OK(gradient(&f, 5, 24, dp_g, &l));
        CHECK(memcmp(dp_g, ref_g, sizeof(float) * (size_t)numel) == 0);
    }
}

static void test_refusals(void) {
    factory       f = {0, -1, -1};
    dt_dp_replica master;
    CHECK_OK(make_rep(&f, -1, &master));
    dt_dp    *dp  = (dt_dp *)&f; // must come back NULL
    dt_dp_ops ops = {make_rep, drop_rep, work, &f};
    CHECK_ERR(dt_dp_new(&dp, master.params, 0, &ops, NULL), DT_ERR_ARG,
              "expected 1 to 256 replicas, found 0");
    CHECK(dp == NULL);
    CHECK_ERR(dt_dp_new(&dp, master.params, -3, &ops, NULL), DT_ERR_ARG, "found -3");
    CHECK_ERR(dt_dp_new(&dp, master.params, 257, &ops, NULL), DT_ERR_ARG, "found 257");
    dt_dp_ops none = {0};
    CHECK_ERR(dt_dp_new(&dp, master.params, 2, &none, NULL), DT_ERR_ARG, "no make or work");
    // A replica of another architecture (the MLP instead of the ConvNet) is named.
    f.bad_index = 2;
    CHECK_ERR(dt_dp_new(&dp, master.params, 3, &ops, NULL), DT_ERR_MISMATCH,
              "replica 2: expected the master's layout");
    CHECK(dp == NULL);
    f.bad_index = -1;
    // A replica's failure comes back with its message, from its thread; the master's
    // gradients stay untouched.
    f.fail_at = (int)((17 * 37 + 11) % NS); // sample 17 of 24: replica 2 of 4 (18..23 is 3)
    CHECK_OK(dt_dp_new(&dp, master.params, 4, &ops, NULL));
    dt_batch b = make_batch(24);
    float    l;
    dt_params_zero_grad(master.params);
    CHECK_ERR(dt_dp_forward_backward(dp, &b, &l), DT_ERR_FORMAT, "replica 2 (samples 12..18)");
    CHECK(strstr(dt_last_error(), "is unreadable") != NULL);
    float gmax = 0;
    for (size_t i = 0; i < dt_params_numel(master.params); i++)
        gmax = fmaxf(gmax, fabsf(dt_params_grads(master.params)[i]));
    CHECK(gmax == 0);
    b.size = 0;
    CHECK_ERR(dt_dp_forward_backward(dp, &b, &l), DT_ERR_ARG, "at least one sample");
    dt_dp_free(dp);
    drop_rep(&f, &master);
}

// ------------------------------------------------------------ through the trainer

typedef struct result {
    int     n;
    int64_t steps;
    float   p[MAXP];
} result;

static result *shared_result; // MAP_SHARED: written by forked workers
static long    t_batch;
static bool    t_own_loop; // train without dt_trainer_forward_backward
static rep    *t_master;   // the master replica's scratch (its model is the trainer's)

static dt_status train_fn(dt_trainer *t, void *user) {
    factory   *f = user;
    dt_loader *ld;
    DT_TRY(dt_trainer_loader(t, &train_set, (size_t)t_batch, DT_SPLIT_TRAIN, &ld));
    dt_dp_replica master;
    DT_TRY(make_rep(f, -1, &master));
    rep *r = t_master = master.obj; // freed by run_trainer, also when training fails
    {
        dt_model *tmp;
        DT_TRY(make_model(&tmp, f->kind, 3)); // the seed's model, whatever make_rep seeded
        memcpy(dt_params_data(master.params), dt_params_data(dt_model_as_params(tmp)),
               sizeof(float) * dt_params_numel(master.params));
        dt_model_free(tmp);
    }
    dt_sgd_opts o = dt_sgd_opts_default();
    o.lr = 0.1f, o.momentum = 0.5f;
    dt_optim *opt = NULL;
    DT_TRY(dt_sgd_new(&opt, master.params, &o));
    DT_TRY(dt_trainer_prepare_model(t, r->m, opt, NULL));
    dt_dp_ops ops = {make_rep, NULL, work, f}; // r is freed below, replicas by drop
    ops.drop      = drop_rep;
    DT_TRY(dt_trainer_set_replicas(t, &ops, &master));
    dt_batch b;
    while (dt_trainer_next(t, &b)) {
        float loss;
        if (t_own_loop)
            DT_TRY(work(f, &master, &b, &loss));
        else
            DT_TRY(dt_trainer_forward_backward(t, &b, &loss));
        DT_TRY(dt_trainer_step(t, loss));
    }
    DT_TRY(dt_trainer_finish(t));
    if (dt_trainer_is_main(t)) {
        shared_result->n     = (int)dt_params_numel(master.params);
        shared_result->steps = dt_trainer_step_count(t);
        memcpy(shared_result->p, dt_params_data(master.params),
               sizeof(float) * dt_params_numel(master.params));
    }
    return DT_OK;
}

static int run_trainer(const char *flags, factory *f, result *out) {
    char buf[512], *argv[40];
    int  argc    = 0;
    argv[argc++] = "test_dp";
    snprintf(buf, sizeof buf, "--seed 3 --no-test --invariant 0 --backend %s %s", mp_backend(),
             flags);
    for (char *s = strtok(buf, " "); s && argc < 39; s = strtok(NULL, " "))
        argv[argc++] = s;
    argv[argc]         = NULL;
    const char *vars[] = {"MASTER_PORT", "MASTER_ADDR", "GROUP_RANK",       "WORLD_SIZE",
                          "RANK",        "LOCAL_RANK",  "LOCAL_WORLD_SIZE", "DT_JOB_TOKEN"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++)
        unsetenv(vars[i]);
    memset(shared_result, 0, sizeof *shared_result);
    dt_trainer     *t;
    dt_trainer_opts o = dt_trainer_opts_default();
    o.program         = "test_dp";
    dt_status st      = dt_trainer_new(&t, argc, argv, &o);
    if (st || !t)
        return st == DT_ERR_ARG ? 2 : -1;
    int rc = dt_trainer_exit(t, dt_trainer_start(t) ? train_fn(t, f) : DT_OK);
    dt_free(t_master);
    t_master = NULL;
    *out     = *shared_result;
    return rc;
}

static float max_diff(const result *a, const result *b) {
    float d = a->n == b->n && a->n > 0 ? 0 : INFINITY;
    for (int i = 0; i < a->n && a->n == b->n; i++)
        d = fmaxf(d, fabsf(a->p[i] - b->p[i]));
    return d;
}

static result r_one, r_dp, r_ddp;

static void test_trainer(void) {
    factory f = {1, -1, -1};
    t_batch   = 8;
    // One thread, batch 8 (the plain loop); the program's loop without
    // dt_trainer_forward_backward gives bitwise the same.
    CHECK_EQ(run_trainer("--epochs 2 --threads 1", &f, &r_one), 0);
    CHECK_EQ(r_one.steps, 26);
    t_own_loop = true;
    CHECK_EQ(run_trainer("--epochs 2 --threads 1", &f, &r_dp), 0);
    t_own_loop = false;
    CHECK(r_one.n > 0 && memcmp(r_one.p, r_dp.p, sizeof(float) * (size_t)r_one.n) == 0);
    CHECK_EQ(run_trainer("--epochs 2 --threads 1 --data-parallel 1", &f, &r_dp), 0);
    CHECK(memcmp(r_one.p, r_dp.p, sizeof(float) * (size_t)r_one.n) == 0);
    for (int n = 2; n <= 4; n += 2) {
        char flags[96];
        snprintf(flags, sizeof flags, "--epochs 2 --threads %d --data-parallel %d", n, n);
        CHECK_EQ(run_trainer(flags, &f, &r_dp), 0);
        CHECK_EQ(r_dp.steps, r_one.steps);
        CHECK(max_diff(&r_dp, &r_one) < 1e-5f);
        // N processes with DDP, batch 8 / N each: the same global batches.
        t_batch = 8 / n;
        snprintf(flags, sizeof flags, "--epochs 2 --threads 1 --num-processes %d", n);
        CHECK_EQ(run_trainer(flags, &f, &r_ddp), 0);
        t_batch = 8;
        CHECK_EQ(r_ddp.steps, r_one.steps);
        CHECK(max_diff(&r_dp, &r_ddp) < 1e-5f);
        printf("     --data-parallel %d: max |diff| to one thread %.2g, to %d processes (DDP) "
               "%.2g\n",
               n, (double)max_diff(&r_dp, &r_one), n, (double)max_diff(&r_dp, &r_ddp));
    }
    // Replicas inside processes: 2 processes of batch 4, each with 2 replicas of 2
    // samples (DDP between the processes), against 4 processes of batch 2.
    t_batch = 4;
    CHECK_EQ(run_trainer("--epochs 2 --threads 2 --data-parallel 2 --num-processes 2", &f, &r_dp),
             0);
    t_batch = 2;
    CHECK_EQ(run_trainer("--epochs 2 --threads 1 --num-processes 4", &f, &r_ddp), 0);
    t_batch = 8;
    CHECK_EQ(r_dp.steps, r_one.steps);
    CHECK(max_diff(&r_dp, &r_ddp) < 1e-5f);
    CHECK(max_diff(&r_dp, &r_one) < 1e-5f);
    printf("     2 processes x --data-parallel 2: max |diff| to 4 processes %.2g, to one thread "
           "%.2g\n",
           (double)max_diff(&r_dp, &r_ddp), (double)max_diff(&r_dp, &r_one));
    // The ConvNet with dropout, 3 replicas on batch 8 (slices 2, 3, 3).
    f.kind = 0;
    CHECK_EQ(run_trainer("--epochs 1 --threads 1", &f, &r_one), 0);
    CHECK_EQ(run_trainer("--epochs 1 --threads 3 --data-parallel 3", &f, &r_dp), 0);
    CHECK(max_diff(&r_dp, &r_one) < 1e-5f);
}

static void test_trainer_refusals(void) {
    factory f = {1, -1, -1};
    t_batch   = 8;
    // Bad N: refused by the flag parser (exit status 2, usage).
    CHECK_EQ(run_trainer("--data-parallel 0", &f, &r_dp), 2);
    CHECK_EQ(run_trainer("--data-parallel 257", &f, &r_dp), 2);
    CHECK_EQ(run_trainer("--data-parallel two", &f, &r_dp), 2);
    // A program that runs its own forward and backward: refused, not silently ignored.
    t_own_loop = true;
    CHECK_EQ(run_trainer("--data-parallel 2 --threads 1", &f, &r_dp), 1);
    t_own_loop = false;
    CHECK_EQ(r_dp.steps, 0);
}

int main(void) {
    shared_result =
        mmap(NULL, sizeof(result), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    uint8_t img[NS * H * W], lab[NS];
    dt_rng  r = dt_rng_init(11);
    for (int i = 0; i < NS; i++) {
        lab[i] = (uint8_t)dt_rng_below(&r, 10);
        for (int k = 0; k < H * W; k++)
            img[i * H * W + k] = (uint8_t)((k % 10 == lab[i] ? 160 : 20) + dt_rng_below(&r, 90));
    }
    if (shared_result == MAP_FAILED || dt_dataset_init(&train_set, img, lab, NS, H, W, NULL))
        return 1;
    RUN(test_gradients);
    RUN(test_refusals);
    RUN(test_trainer);
    RUN(test_trainer_refusals);
    dt_dataset_free(&train_set);
    return check_summary();
}
