// test_ddp.c: DistributedDataParallel in real processes over loopback.
//
// - Buckets: PyTorch's assignment, checked against an independent walk.
// - Equivalence: world 2 with batch 64 per rank ends with the same weights as one
//   process with batch 128 (dropout off, same seed), on a small model and on the
//   ConvNet with real data. The gradients differ only in the order of float sums
//   (a mean of two means of 64 instead of one mean of 128), about 1e-7 relative per
//   step; Adadelta's step is bounded by lr whatever the gradient's scale, so after 5
//   steps the normalised weight difference stays far below the 1e-4 asserted (seen:
//   ~1e-7), while one missed or doubled gradient moves weights by ~1e-2.
// - World 3 on a data set that does not divide evenly: identical weights on every
//   rank (checksums compared), and two runs with the same seed are bitwise equal.
// - no_sync, overlap off, the parameter broadcast, the unused-parameter error, the
//   shape-mismatch error, the tree order of tree_reduce bitwise, and refused gradient
//   reports returned to the backward that made them.
#include "../check.h"
#include "../lib/mnist.h"
#include "../lib/mp.h"
#include "dtrain/data.h"
#include "dtrain/ddp.h"

#include "dtrain/optim.h"
#include <unistd.h>

#include <stdlib.h>

// ---------------------------------------------------------------- helpers

static dt_dataset g_data; // inherited by the forked ranks

// A small model for fast checks: 1x8x8 inputs.
static dt_model *small_model(uint64_t seed, int hidden) {
    dt_model *m = NULL;
    dt_model_new(&m, 1, 8, 8);
    CHECK_OK(dt_model_add_conv2d(m, 3, 3, 1, 1));
    CHECK_OK(dt_model_add_relu(m));
    CHECK_OK(dt_model_add_flatten(m));
    CHECK_OK(dt_model_add_linear(m, hidden));
    CHECK_OK(dt_model_add_relu(m));
    CHECK_OK(dt_model_add_linear(m, 10));
    CHECK_OK(dt_model_add_log_softmax(m));
    CHECK_OK(dt_model_finalize(m, seed));
    return m;
}

static void make_small_data(dt_dataset *ds, size_t n) {
    uint8_t *img = malloc(n * 64), *lab = malloc(n);
    dt_rng   r = dt_rng_init(99);
    for (size_t i = 0; i < n * 64; i++)
        img[i] = (uint8_t)dt_rng_below(&r, 256);
    for (size_t i = 0; i < n; i++)
        lab[i] = (uint8_t)dt_rng_below(&r, 10);
    CHECK_OK(dt_dataset_init(ds, img, lab, n, 8, 8, NULL));
    free(img);
    free(lab);
}

// Trains `steps` steps (or a whole epoch when steps < 0) of batch `batch` on `ds`, as
// rank `rank` of `pg` (NULL: alone). Returns 0 or the failing status.
static dt_status train(dt_model *m, dt_pg *pg, const dt_dataset *ds, size_t batch, int steps,
                       const dt_ddp_opts *o) {
    int       world = pg ? dt_pg_size(pg) : 1, rank = pg ? dt_pg_rank(pg) : 0;
    dt_ddp   *ddp = NULL;
    dt_status st  = DT_OK;
    if (pg && (st = dt_ddp_new(&ddp, dt_model_as_params(m), pg, o)))
        return st;
    dt_adadelta_opts ao = dt_adadelta_opts_default();
    ao.lr               = 0.5f;
    dt_optim *opt       = NULL;
    dt_adadelta_new(&opt, dt_model_as_params(m), &ao);
    dt_sampler_opts so = dt_sampler_opts_default();
    so.num_replicas = world, so.rank = rank, so.seed = 3;
    dt_sampler *s = NULL;
    dt_sampler_new(&s, ds->n, &so);
    dt_loader_opts lo = dt_loader_opts_default();
    lo.batch_size     = batch;
    dt_loader *l      = NULL;
    dt_loader_new(&l, ds, s, &lo);
    float *dlogp = malloc(sizeof(float) * 10 * batch);
    dt_loader_begin_epoch(l, 0);
    dt_batch b;
    for (int i = 0; (steps < 0 || i < steps) && st == DT_OK && dt_loader_next(l, &b); i++) {
        float loss;
        if ((st = dt_model_forward(m, b.x, (int)b.size)) ||
            (st = dt_loss_nll(dt_model_output(m), b.y, (int)b.size, 10, &loss, dlogp)))
            break;
        dt_model_zero_grad(m);
        if ((st = dt_model_backward(m, dlogp)) || (ddp && (st = dt_ddp_sync(ddp))))
            break;
        dt_optim_step(opt);
    }
    free(dlogp);
    dt_loader_free(l);
    dt_sampler_free(s);
    dt_optim_free(opt);
    dt_ddp_free(ddp);
    return st;
}

static double rel_diff(const float *a, const float *b, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        num += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        den += (double)b[i] * b[i];
    }
    return sqrt(num / (den > 0 ? den : 1));
}

// Checksums of every rank's parameters must agree.
static void check_same_everywhere(dt_pg *pg, dt_model *m) {
    int      world = dt_pg_size(pg);
    int32_t  mine  = (int32_t)dt_crc32c(0, dt_model_params(m), dt_model_num_params(m) * 4);
    int32_t *all   = calloc((size_t)world, sizeof(int32_t));
    CHECK_OK(dt_pg_all_gather(pg, &mine, all, 1, DT_INT32));
    int same = 1;
    for (int r = 1; r < world; r++)
        same &= all[r] == all[0];
    CHECK(same);
    free(all);
}

// ---------------------------------------------------------------- buckets

// PyTorch's rule, written again independently: sizes in definition order, limits
// [first, cap, cap, ...], close at >= limit, reverse.
static int expected_buckets(const dt_model *m, size_t first, size_t cap, size_t *offs,
                            size_t *counts) {
    int    n = dt_model_num_param_tensors(m), nb = 0;
    size_t acc = 0, start = 0, limit = first;
    size_t o[64], c[64];
    for (int t = 0; t < n; t++) {
        const dt_param_info *p = dt_model_param_info(m, t);
        if (acc == 0)
            start = p->offset;
        acc += p->count * 4;
        if (acc >= limit || t == n - 1) {
            o[nb]   = start;
            c[nb++] = p->offset + p->count - start;
            acc     = 0;
            limit   = cap;
        }
    }
    for (int i = 0; i < nb; i++) {
        offs[i]   = o[nb - 1 - i];
        counts[i] = c[nb - 1 - i];
    }
    return nb;
}

static void buckets_rank(int rank, int world, void *arg) {
    (void)rank, (void)world, (void)arg;
    dt_pg *pg = mp_pg_init(0);
    if (!pg)
        return;
    dt_model *m = NULL;
    CHECK_OK(mnist_convnet_new(&m, 0, 0, 0));
    struct {
        size_t first, cap;
    } cases[] = {{0, 0}, {16 << 10, 64 << 10}, {1, 1}, {4096, 4096}};
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        dt_ddp_opts o        = dt_ddp_opts_default();
        o.first_bucket_bytes = cases[k].first;
        o.bucket_cap_bytes   = cases[k].cap;
        dt_ddp *d            = NULL;
        CHECK_OK(dt_ddp_new(&d, dt_model_as_params(m), pg, &o));
        if (!d)
            continue;
        size_t eo[64], ec[64];
        size_t first = cases[k].first ? cases[k].first : cases[k].cap ? cases[k].cap : 1 << 20;
        size_t cap   = cases[k].cap ? cases[k].cap : 25 << 20;
        int    nb    = expected_buckets(m, first, cap, eo, ec);
        CHECK_EQ(dt_ddp_num_buckets(d), nb);
        int same = dt_ddp_num_buckets(d) == nb;
        for (int i = 0; same && i < nb; i++) {
            size_t off, cnt;
            dt_ddp_bucket(d, i, &off, &cnt);
            same &= off == eo[i] && cnt == ec[i];
        }
        CHECK(same);
        dt_ddp_free(d);
    }
    // The defaults on the ConvNet: [7.bias, 8.*] then everything up to 7.weight, which
    // crosses 1 MiB (PyTorch's 2 buckets for this model).
    dt_ddp *d = NULL;
    CHECK_OK(dt_ddp_new(&d, dt_model_as_params(m), pg, NULL));
    size_t off, cnt;
    dt_ddp_bucket(d, 0, &off, &cnt);
    CHECK_EQ(off, dt_model_param_info(m, 5)->offset);
    CHECK_EQ(off + cnt, dt_model_num_params(m));
    CHECK_EQ(dt_ddp_num_buckets(d), 2);
    dt_ddp_free(d);
    dt_model_free(m);
    dt_pg_free(pg);
}

static void test_buckets(void) {
    mp_opts o = {.world = 1};
    MP_RUN(&o, buckets_rank, NULL);
}

// ---------------------------------------------------------------- equivalence

typedef struct equiv_arg {
    bool   convnet;
    int    steps;
    double tol;
} equiv_arg;

static void equivalence_rank(int rank, int world, void *arg) {
    const equiv_arg *e  = arg;
    dt_pg           *pg = mp_pg_init(0);
    if (!pg)
        return;
    dt_dataset small = {0};
    if (!e->convnet)
        make_small_data(&small, 1000);
    const dt_dataset *ds  = e->convnet ? &g_data : &small;
    dt_model         *ref = NULL, *m = NULL;
    if (e->convnet) {
        CHECK_OK(mnist_convnet_new(&ref, 5, 0, 0));
        CHECK_OK(mnist_convnet_new(&m, 5 + (uint64_t)rank, 0, 0)); // broadcast fixes it
    } else {
        ref = small_model(5, 16);
        m   = small_model(5 + (uint64_t)rank, 16);
    }
    // the reference: this process alone, batch 128
    CHECK_OK(train(ref, NULL, ds, 128, e->steps, NULL));
    // world `world`, batch 128 / world each
    CHECK_OK(train(m, pg, ds, (size_t)(128 / world), e->steps, NULL));
    double d = rel_diff(dt_model_params(m), dt_model_params(ref), dt_model_num_params(m));
    if (!CHECK(d < e->tol))
        fprintf(stderr, "     rank %d: weights differ from 1 process by %.3g (tolerance %.1g)\n",
                rank, d, e->tol);
    check_same_everywhere(pg, m);
    if (rank == 0)
        fprintf(stderr, "     world %d vs 1 process after %d steps: relative difference %.2g\n",
                world, e->steps, d);
    dt_model_free(ref);
    dt_model_free(m);
    dt_dataset_free(&small);
    dt_pg_free(pg);
}

static void test_equivalence(void) {
    equiv_arg small = {.convnet = false, .steps = 6, .tol = 1e-4};
    mp_opts   o2    = {.world = 2};
    MP_RUN(&o2, equivalence_rank, &small);
    mp_opts o4 = {.world = 4};
    MP_RUN(&o4, equivalence_rank, &small);
    if (g_data.n) {
        equiv_arg conv = {.convnet = true, .steps = 5, .tol = 1e-4};
        MP_RUN(&o2, equivalence_rank, &conv);
    }
}

// World 3 on 1000 samples (not a multiple of 3 x batch): identical everywhere, and a
// second run with the same seed is bitwise the same; overlap off gives the same bits.
static void uneven_rank(int rank, int world, void *arg) {
    (void)world, (void)arg;
    dt_pg *pg = mp_pg_init(0);
    if (!pg)
        return;
    dt_dataset ds = {0};
    make_small_data(&ds, 1000);
    dt_model *a = small_model(9, 12), *b = small_model(9, 12), *c = small_model(9, 12);
    CHECK_OK(train(a, pg, &ds, 40, -1, NULL));
    CHECK_OK(train(b, pg, &ds, 40, -1, NULL));
    dt_ddp_opts no_overlap = dt_ddp_opts_default();
    no_overlap.overlap     = false;
    CHECK_OK(train(c, pg, &ds, 40, -1, &no_overlap));
    size_t n = dt_model_num_params(a);
    CHECK(memcmp(dt_model_params(a), dt_model_params(b), n * 4) == 0);
    CHECK(memcmp(dt_model_params(a), dt_model_params(c), n * 4) == 0);
    check_same_everywhere(pg, a);
    (void)rank;
    dt_model_free(a), dt_model_free(b), dt_model_free(c);
    dt_dataset_free(&ds);
    dt_pg_free(pg);
}

static void test_uneven_world3(void) {
    mp_opts o = {.world = 3};
    MP_RUN(&o, uneven_rank, NULL);
}

// ---------------------------------------------------------------- no_sync

static void no_sync_rank(int rank, int world, void *arg) {
    (void)arg;
    dt_pg *pg = mp_pg_init(0);
    if (!pg)
        return;
    dt_model *m = small_model(4, 8);
    dt_ddp   *d = NULL;
    CHECK_OK(dt_ddp_new(&d, dt_model_as_params(m), pg, NULL));
    if (!d)
        return;
    size_t  n = dt_model_num_params(m);
    float   x[2 * 64], dl[20];
    int32_t y[2] = {1, 7};
    dt_rng  r    = dt_rng_init(100 + (uint64_t)rank); // different data on every rank
    for (int i = 0; i < 128; i++)
        x[i] = dt_rng_uniform_range(&r, -1, 1);
    float loss;
    dt_model_zero_grad(m);
    // micro-step 1 without sync: the gradient stays local
    dt_ddp_set_sync(d, false);
    CHECK_OK(dt_model_forward(m, x, 2));
    CHECK_OK(dt_loss_nll(dt_model_output(m), y, 2, 10, &loss, dl));
    CHECK_OK(dt_model_backward(m, dl));
    CHECK_OK(dt_ddp_sync(d)); // a no-op while sync is off
    float *g1 = malloc(n * 4);
    memcpy(g1, dt_model_grads(m), n * 4);
    // micro-step 2 with sync: the accumulated gradient is averaged
    dt_ddp_set_sync(d, true);
    for (int i = 0; i < 128; i++)
        x[i] = dt_rng_uniform_range(&r, -1, 1);
    CHECK_OK(dt_model_forward(m, x, 2));
    CHECK_OK(dt_loss_nll(dt_model_output(m), y, 2, 10, &loss, dl));
    // what the average must be: this rank's g1 + g2, averaged with a separate call
    dt_model *twin = small_model(4, 8); // same weights: same seed, rank 0's broadcast
    memcpy(dt_model_params(twin), dt_model_params(m), n * 4);
    CHECK_OK(dt_model_forward(twin, x, 2));
    dt_model_zero_grad(twin);
    CHECK_OK(dt_model_backward(twin, dl));
    float *expect = malloc(n * 4);
    for (size_t i = 0; i < n; i++)
        expect[i] = g1[i] + dt_model_grads(twin)[i];
    CHECK_OK(dt_pg_all_reduce(pg, expect, expect, n, DT_FLOAT32, DT_REDUCE_AVG));
    CHECK_OK(dt_model_backward(m, dl));
    CHECK_OK(dt_ddp_sync(d));
    double diff = rel_diff(dt_model_grads(m), expect, n);
    if (!CHECK(diff < 1e-6))
        fprintf(stderr, "     rank %d/%d: no_sync gradient differs by %.3g\n", rank, world, diff);
    // after the synced step every rank holds the same gradient
    int32_t mine = (int32_t)dt_crc32c(0, dt_model_grads(m), n * 4), other = 0;
    CHECK_OK(dt_pg_all_reduce(pg, &mine, &other, 1, DT_INT32, DT_REDUCE_MAX));
    CHECK_EQ(mine, other);
    free(g1), free(expect);
    dt_ddp_free(d);
    dt_model_free(m), dt_model_free(twin);
    dt_pg_free(pg);
}

static void test_no_sync(void) {
    mp_opts o = {.world = 2};
    MP_RUN(&o, no_sync_rank, NULL);
}

// ---------------------------------------------------------------- errors

// A two-layer model (6 -> 5 -> 3) under DDP with one bucket per tensor; NULL (and the
// model freed) when DDP could not be made.
static dt_ddp *two_layer_ddp(dt_pg *pg, dt_model **m) {
    *m = NULL;
    dt_model_new(m, 6, 1, 1);
    CHECK_OK(dt_model_add_linear(*m, 5));
    CHECK_OK(dt_model_add_linear(*m, 3));
    CHECK_OK(dt_model_finalize(*m, 1));
    dt_ddp_opts o        = dt_ddp_opts_default();
    o.bucket_cap_bytes   = 16; // one bucket per tensor
    o.first_bucket_bytes = 16;
    dt_ddp *d            = NULL;
    CHECK_OK(dt_ddp_new(&d, dt_model_as_params(*m), pg, &o));
    if (!d)
        dt_model_free(*m);
    return d;
}

// Every rank builds a two-layer model but its hand-written "backward" only produces
// the last layer's gradient: sync must name the first layer's parameters. The rank that
// finds it first aborts the group (so a rank waiting on the missing bucket cannot
// hang): the other one reports the same names, either found itself or received.
static void unused_rank(int rank, int world, void *arg) {
    (void)rank, (void)world, (void)arg;
    dt_pg *pg = mp_pg_init(10000);
    if (!pg)
        return;
    dt_model *m;
    dt_ddp   *d = two_layer_ddp(pg, &m);
    if (!d)
        return;
    const dt_param_info *w1 = dt_model_param_info(m, 2);
    CHECK_OK(dt_ddp_mark_ready(d, w1->offset, dt_model_num_params(m) - w1->offset));
    dt_status st = dt_ddp_sync(d);
    CHECK(st == DT_ERR_STATE || st == DT_ERR_PEER);
    CHECK(strstr(dt_last_error(), "2 parameter tensor(s) received no gradient") != NULL);
    CHECK(strstr(dt_last_error(), "0.weight, 0.bias") != NULL);
    CHECK(st == DT_ERR_STATE || strstr(dt_last_error(), "reported by rank") != NULL);
    // a range that cuts a tensor is refused
    CHECK_ERR(dt_ddp_mark_ready(d, 1, 3), DT_ERR_ARG, "cuts parameter 0.weight");
    dt_ddp_free(d);
    dt_model_free(m);
    dt_pg_free(pg);
}

static void test_unused_parameter(void) {
    mp_opts o = {.world = 2};
    MP_RUN(&o, unused_rank, NULL);
}

// A report DDP refuses reaches the backward that made it (dt_params_grad_ready returns
// it; it used to be kept for the sync): a range that cuts a tensor, a tensor reported
// twice. The step then cannot be reduced: rank 0's sync says why and aborts the group,
// and rank 1, waiting in its sync for buckets rank 0 never started, fails at once with
// that reason. Rank 0 keeps its group open until rank 1's sync has returned (a flag in
// the runs' shared page, waited for 10 s at most), so that rank 1 reads the abort's
// reason rather than a group already torn down.
static void report_rank(int rank, int world, void *arg) {
    (void)world, (void)arg;
    dt_pg *pg = mp_pg_init(10000);
    if (!pg)
        return;
    dt_model *m;
    dt_ddp   *d = two_layer_ddp(pg, &m);
    if (!d)
        return;
    dt_params           *p  = dt_model_as_params(m);
    const dt_param_info *b2 = dt_model_param_info(m, 3);
    CHECK_OK(dt_params_grad_ready(p, b2->offset, b2->count));
    if (rank == 0) {
        CHECK_ERR(dt_params_grad_ready(p, b2->offset, b2->count), DT_ERR_STATE,
                  "ddp: parameter 1.bias was marked ready twice");
        CHECK_ERR(dt_params_grad_ready(p, 1, 3), DT_ERR_ARG, "cuts parameter 0.weight");
        CHECK_ERR(dt_ddp_sync(d), DT_ERR_STATE, "a gradient report of this step failed");
        double t0 = dt_now();
        while (!__atomic_load_n((int *)mp_shared(), __ATOMIC_ACQUIRE) && dt_now() - t0 < 10.0)
            usleep(1000);
    } else {
        CHECK_OK(dt_params_grad_ready(p, 0, b2->offset));
        double    t0 = dt_now();
        dt_status st = dt_ddp_sync(d);
        CHECK(st != DT_OK);
        CHECK(dt_now() - t0 < 8.0);
        CHECK(strstr(dt_last_error(), "a gradient report of this step failed") != NULL);
        __atomic_store_n((int *)mp_shared(), 1, __ATOMIC_RELEASE);
    }
    dt_ddp_free(d);
    dt_model_free(m);
    dt_pg_free(pg);
}

static void test_report_errors(void) {
    mp_opts o = {.world = 2};
    MP_RUN(&o, report_rank, NULL);
}

static void mismatch_rank(int rank, int world, void *arg) {
    (void)world, (void)arg;
    dt_pg *pg = mp_pg_init(10000);
    if (!pg)
        return;
    dt_model *m = small_model(1, rank == 1 ? 12 : 16); // rank 1 has a narrower hidden layer
    dt_ddp   *d = NULL;
    CHECK_ERR(dt_ddp_new(&d, dt_model_as_params(m), pg, NULL), DT_ERR_MISMATCH,
              "parameter 3.weight has shape (16, 192) on rank 0 but (12, 192) on rank 1");
    CHECK(d == NULL);
    dt_model_free(m);
    dt_pg_free(pg);
}

static void test_shape_mismatch(void) {
    mp_opts o = {.world = 3};
    MP_RUN(&o, mismatch_rank, NULL);
}

static dt_status finish_only(void *state, dt_pg *pg, int bucket, float *grad, size_t count) {
    (void)state, (void)pg, (void)bucket, (void)grad, (void)count;
    return DT_OK;
}

// Options that cannot work are refused before any collective: a comm hook without a
// start (its buckets would never be reduced), tree_reduce with compression.
static void bad_opts_rank(int rank, int world, void *arg) {
    (void)rank, (void)world, (void)arg;
    dt_pg *pg = mp_pg_init(10000);
    if (!pg)
        return;
    dt_model        *m = small_model(1, 16);
    dt_ddp          *d = NULL;
    dt_ddp_comm_hook h = {.finish = finish_only};
    dt_ddp_opts      o = dt_ddp_opts_default();
    o.comm_hook        = &h;
    CHECK_ERR(dt_ddp_new(&d, dt_model_as_params(m), pg, &o), DT_ERR_ARG,
              "ddp: expected a comm hook with a start, found none");
    o             = dt_ddp_opts_default();
    o.tree_reduce = true;
    o.compress    = DT_DDP_COMPRESS_BF16;
    CHECK_ERR(dt_ddp_new(&d, dt_model_as_params(m), pg, &o), DT_ERR_ARG,
              "tree_reduce and gradient compression");
    CHECK(d == NULL);
    dt_model_free(m);
    dt_pg_free(pg);
}

static void test_bad_opts(void) {
    mp_opts o = {.world = 2};
    MP_RUN(&o, bad_opts_rank, NULL);
}

// tree_reduce: every element is ((g0 + g2) + (g1 + g3)) / 4 on every rank, bit for bit:
// the tree that continues the model's gradient shards over ranks. The values are
// chosen so that rank order ((g0 + g1) + g2) + g3 rounds differently.
static float tree_value(int rank, size_t i) {
    static const float v[4] = {1.0f, 3e-8f, -1.0f, 3e-8f}; // rank order: 0; tree: 6e-8
    return v[rank] * (float)(1 + i % 3);
}

static void tree_rank(int rank, int world, void *arg) {
    (void)arg;
    dt_pg *pg = mp_pg_init(10000);
    if (!pg)
        return;
    dt_model   *m      = small_model(1, 8);
    dt_ddp_opts o      = dt_ddp_opts_default();
    o.tree_reduce      = true;
    o.bucket_cap_bytes = 512; // several buckets
    dt_ddp *d          = NULL;
    CHECK_OK(dt_ddp_new(&d, dt_model_as_params(m), pg, &o));
    if (!d)
        return;
    size_t n = dt_model_num_params(m);
    float *g = dt_model_grads(m);
    for (int step = 0; step < 2; step++) {
        for (size_t i = 0; i < n; i++)
            g[i] = tree_value(rank, i);
        for (int t = dt_model_num_param_tensors(m) - 1; t >= 0; t--) {
            const dt_param_info *p = dt_model_param_info(m, t);
            CHECK_OK(dt_ddp_mark_ready(d, p->offset, p->count));
        }
        CHECK_OK(dt_ddp_sync(d));
        size_t wrong = 0;
        for (size_t i = 0; i < n; i++) {
            float x[4];
            for (int r = 0; r < world; r++)
                x[r] = tree_value(r, i);
            float want = ((x[0] + x[2]) + (x[1] + x[3])) / 4.0f;
            wrong += memcmp(&g[i], &want, sizeof want) != 0;
        }
        if (!CHECK(wrong == 0))
            fprintf(stderr, "     rank %d: %zu of %zu elements off the tree sum\n", rank, wrong, n);
    }
    float rank_order =
        ((tree_value(0, 0) + tree_value(1, 0)) + tree_value(2, 0)) + tree_value(3, 0);
    CHECK(rank_order !=
          (tree_value(0, 0) + tree_value(2, 0)) + (tree_value(1, 0) + tree_value(3, 0)));
    dt_ddp_free(d);
    dt_model_free(m);
    dt_pg_free(pg);
}

static void test_tree_reduce(void) {
    mp_opts o = {.world = 4};
    MP_RUN(&o, tree_rank, NULL);
}

int main(void) {
    dt_dataset_opts lim = fmnist_opts();
    lim.limit           = 1280;
    if (dt_dataset_load_mnist(&g_data, tl_fmnist_dir(), true, &lim) != DT_OK)
        fprintf(stderr, "Fashion-MNIST not found (%s): ConvNet equivalence skipped\n",
                dt_last_error());
    RUN(test_buckets);
    RUN(test_equivalence);
    RUN(test_uneven_world3);
    RUN(test_no_sync);
    RUN(test_unused_parameter);
    RUN(test_shape_mismatch);
    RUN(test_bad_opts);
    RUN(test_tree_reduce);
    RUN(test_report_errors);
    dt_dataset_free(&g_data);
    return check_summary();
}
