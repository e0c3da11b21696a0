// test_loader.c: the loader yields exactly the sampler's order in batches (with and
// without drop_last, last short batch), normalised as the direct formula says, the
// same with and without the prefetch thread and whatever the caller's timing; an epoch
// allocates nothing; restart mid-epoch, resume from a saved position, shutdown with
// batches in flight, the bounded wait. Runs under ThreadSanitizer (make tsan).
#include "../check.h"
#include "dtrain/data.h"
#include "dtrain/rng.h"

#include <stdlib.h>
#include <time.h>

#define H 6
#define W 5

static dt_dataset make_dataset(size_t n, uint64_t seed) {
    uint8_t *img = malloc(n * H * W + 1), *lab = malloc(n + 1);
    dt_rng   rng = dt_rng_init(seed);
    for (size_t i = 0; i < n * H * W; i++)
        img[i] = (uint8_t)dt_rng_u32(&rng);
    for (size_t i = 0; i < n; i++)
        lab[i] = (uint8_t)dt_rng_below(&rng, 10);
    dt_dataset ds;
    CHECK_OK(dt_dataset_init(&ds, img, lab, n, H, W, NULL));
    free(img);
    free(lab);
    return ds;
}

static dt_sampler *make_sampler(size_t n, int R, int r, uint64_t seed) {
    dt_sampler_opts o = dt_sampler_opts_default();
    o.num_replicas    = R;
    o.rank            = r;
    o.seed            = seed;
    dt_sampler *s     = NULL;
    dt_sampler_new(&s, n, &o);
    return s;
}

// Checks one batch against the dataset directly: x = (p / 255 - mean) / std.
static int check_batch_content(const dt_dataset *ds, const dt_batch *b) {
    int bad = 0;
    for (size_t i = 0; i < b->size; i++) {
        uint32_t       ix = b->indices[i];
        const uint8_t *p  = ds->images + (size_t)ix * H * W;
        for (int j = 0; j < H * W; j++) {
            float want = ((float)p[j] / 255.0f - ds->mean) / ds->std;
            bad += fabsf(b->x[i * H * W + (size_t)j] - want) > 1e-6f;
        }
        bad += b->y[i] != ds->labels[ix];
    }
    return bad;
}

static void sleep_us(long us) {
    struct timespec ts = {us / 1000000, (us % 1000000) * 1000};
    nanosleep(&ts, NULL);
}

static void test_order_and_content(void) {
    size_t     N  = 203;
    dt_dataset ds = make_dataset(N, 1);
    for (int variant = 0; variant < 12; variant++) {
        bool           prefetch = variant & 1 || variant >= 8, drop_last = variant & 2;
        size_t         B = variant & 4 ? 16 : 7;
        dt_sampler    *s = make_sampler(N, 3, 1, 9); // 68 samples per rank
        dt_loader_opts o = dt_loader_opts_default();
        o.batch_size     = B;
        o.drop_last      = drop_last;
        o.prefetch       = prefetch;
        o.caller_helps   = variant < 8;
        dt_loader *l     = NULL;
        dt_loader_new(&l, &ds, s, &o);
        CHECK(l != NULL);
        size_t ns = dt_sampler_num_samples(s);
        CHECK_EQ(ns, 68);
        CHECK_EQ(dt_loader_num_batches(l), drop_last ? ns / B : (ns + B - 1) / B);
        for (int epoch = 0; epoch < 3; epoch++) {
            dt_loader_begin_epoch(l, DT_EPOCH_AUTO);
            CHECK_EQ(dt_sampler_epoch(s), (uint64_t)epoch);
            const uint32_t *order = dt_sampler_indices(s, NULL);
            size_t          pos = 0, nb = 0, bad = 0;
            dt_batch        b;
            while (dt_loader_next(l, &b)) {
                CHECK_EQ(b.index, nb);
                CHECK_EQ(b.h, H);
                CHECK_EQ(b.w, W);
                size_t want = ns - pos < B ? ns - pos : B;
                CHECK_EQ(b.size, want);
                for (size_t i = 0; i < b.size; i++)
                    bad += b.indices[i] != order[pos + i];
                bad += (size_t)check_batch_content(&ds, &b);
                pos += b.size;
                nb++;
                CHECK_EQ(dt_sampler_position(s), pos);
            }
            CHECK_EQ(bad, 0);
            CHECK(dt_loader_status(l) == DT_OK);
            CHECK_EQ(nb, dt_loader_num_batches(l));
            CHECK_EQ(pos, drop_last ? (ns / B) * B : ns);
            CHECK(!dt_loader_next(l, &b)); // stays at the end
        }
        dt_loader_free(l);
        dt_sampler_free(s);
    }
    dt_dataset_free(&ds);
}

// Runs `epochs` epochs and appends every batch's x, y and indices to out.
static size_t record(dt_loader *l, int epochs, float *out, size_t cap, long jitter_seed) {
    size_t   n   = 0;
    dt_rng   rng = dt_rng_init((uint64_t)jitter_seed);
    dt_batch b;
    for (int e = 0; e < epochs; e++) {
        dt_loader_begin_epoch(l, e);
        while (dt_loader_next(l, &b)) {
            for (size_t i = 0; i < b.size * H * W && n < cap; i++)
                out[n++] = b.x[i];
            for (size_t i = 0; i < b.size && n < cap; i++)
                out[n++] = (float)b.y[i] + 1000.0f * (float)b.indices[i];
            if (jitter_seed) // a caller with uneven step times
                sleep_us((long)dt_rng_below(&rng, 300));
        }
    }
    return n;
}

static void test_prefetch_identical(void) {
    size_t     N   = 150;
    dt_dataset ds  = make_dataset(N, 2);
    size_t     cap = 4 * N * (H * W + 1);
    float     *a = malloc(cap * sizeof *a), *b = malloc(cap * sizeof *b);
    // Without the thread; with it, the caller helping or not; with an uneven caller.
    for (int run = 0; run < 5; run++) {
        dt_sampler    *s = make_sampler(N, 2, 0, 3);
        dt_loader_opts o = dt_loader_opts_default();
        o.batch_size     = 8;
        o.prefetch       = run > 0;
        o.caller_helps   = run % 2 == 1;
        dt_loader *l     = NULL;
        dt_loader_new(&l, &ds, s, &o);
        size_t n = record(l, 3, run == 0 ? a : b, cap, run >= 3 ? 77 + run : 0);
        CHECK_EQ(n, 3 * 75 * (H * W + 1));
        if (run > 0)
            CHECK(memcmp(a, b, n * sizeof *a) == 0);
        dt_loader_free(l);
        dt_sampler_free(s);
    }
    free(a);
    free(b);
    dt_dataset_free(&ds);
}

static void test_no_allocation(void) {
    dt_dataset     ds = make_dataset(500, 4);
    dt_sampler    *s  = make_sampler(500, 1, 0, 1);
    dt_loader_opts o  = dt_loader_opts_default();
    o.batch_size      = 32;
    dt_loader *l      = NULL;
    dt_loader_new(&l, &ds, s, &o);
    dt_batch b;
    size_t   before = dt_alloc_total_count(), nb = 0;
    for (int e = 0; e < 3; e++) {
        dt_loader_begin_epoch(l, DT_EPOCH_AUTO);
        while (dt_loader_next(l, &b))
            nb++;
    }
    CHECK_EQ(nb, 3 * 16);
    CHECK_EQ(dt_alloc_total_count(), before);
    dt_loader_free(l);
    dt_sampler_free(s);
    dt_dataset_free(&ds);
}

static void test_restart_and_resume(void) {
    size_t     N  = 301;
    dt_dataset ds = make_dataset(N, 5);
    dt_batch   b;
    for (int mode = 0; mode < 3; mode++) {
        dt_loader_opts o = dt_loader_opts_default();
        o.batch_size     = 10;
        o.prefetch       = mode > 0;
        o.caller_helps   = mode == 1;
        // Reference: epoch 2 uninterrupted.
        dt_sampler *s = make_sampler(N, 2, 1, 8); // 151 per rank: 16 batches
        dt_loader  *l = NULL;
        dt_loader_new(&l, &ds, s, &o);
        uint32_t full[151];
        size_t   k = 0;
        dt_loader_begin_epoch(l, 2);
        while (dt_loader_next(l, &b))
            for (size_t i = 0; i < b.size; i++)
                full[k++] = b.indices[i];
        CHECK_EQ(k, 151);
        // Abandon an epoch after 2 batches (worker may be mid-batch): the next begin
        // starts cleanly.
        dt_loader_begin_epoch(l, 2);
        CHECK(dt_loader_next(l, &b));
        CHECK(dt_loader_next(l, &b));
        dt_loader_begin_epoch(l, 2);
        k = 0;
        while (dt_loader_next(l, &b))
            for (size_t i = 0; i < b.size; i++)
                CHECK_EQ(b.indices[i], full[k++]);
        CHECK_EQ(k, 151);
        // Stop after 6 batches and save the state.
        dt_loader_begin_epoch(l, 2);
        for (int i = 0; i < 6; i++)
            CHECK(dt_loader_next(l, &b));
        uint64_t epoch = dt_sampler_epoch(s);
        size_t   pos   = dt_sampler_position(s);
        CHECK_EQ(pos, 60);
        dt_loader_free(l); // with batch 7 possibly prepared: clean shutdown
        dt_sampler_free(s);

        // A new process resumes: the remaining batches equal the uninterrupted ones.
        s = make_sampler(N, 2, 1, 8);
        CHECK_OK(dt_sampler_resume(s, epoch, pos));
        dt_loader_new(&l, &ds, s, &o);
        dt_loader_begin_epoch(l, DT_EPOCH_AUTO);
        k         = 60;
        size_t nb = 0;
        while (dt_loader_next(l, &b)) {
            CHECK_EQ(b.index, 6 + nb);
            nb++;
            for (size_t i = 0; i < b.size; i++)
                CHECK_EQ(b.indices[i], full[k++]);
        }
        CHECK_EQ(k, 151);
        CHECK_EQ(nb, 10);
        CHECK_EQ(dt_sampler_position(s), 151);
        // The next epoch is whole again.
        dt_loader_begin_epoch(l, DT_EPOCH_AUTO);
        CHECK_EQ(dt_sampler_epoch(s), 3);
        nb = 0;
        while (dt_loader_next(l, &b))
            nb++;
        CHECK_EQ(nb, 16);
        dt_loader_free(l);
        dt_sampler_free(s);
    }
    dt_dataset_free(&ds);
}

static void test_sequential_and_errors(void) {
    dt_dataset ds = make_dataset(25, 6);
    dt_batch   b;
    // No sampler: the whole dataset in order.
    dt_loader_opts o = dt_loader_opts_default();
    o.batch_size     = 10;
    dt_loader *l     = NULL;
    dt_loader_new(&l, &ds, NULL, &o);
    CHECK(l != NULL);
    CHECK(!dt_loader_next(l, &b)); // not begun
    CHECK(dt_loader_status(l) == DT_ERR_STATE);
    CHECK(strstr(dt_last_error(), "expected dt_loader_begin_epoch before dt_loader_next") != NULL);
    dt_loader_begin_epoch(l, DT_EPOCH_AUTO);
    CHECK(dt_loader_status(l) == DT_OK);
    size_t k = 0;
    while (dt_loader_next(l, &b))
        for (size_t i = 0; i < b.size; i++)
            CHECK_EQ(b.indices[i], k++);
    CHECK_EQ(k, 25);
    dt_loader_free(l);

    // A sampler over another dataset size.
    dt_sampler *s = make_sampler(26, 1, 0, 0);
    CHECK(dt_loader_new(&(dt_loader *){NULL}, &ds, s, &o) != DT_OK);
    CHECK(dt_last_status() == DT_ERR_ARG);
    CHECK(strstr(dt_last_error(),
                 "expected a sampler over the dataset's 25 samples, found one over 26") != NULL);
    dt_sampler_free(s);
    o.batch_size = 0;
    CHECK(dt_loader_new(&(dt_loader *){NULL}, &ds, NULL, &o) != DT_OK);
    CHECK(strstr(dt_last_error(), "expected a batch size in [1, 16777216], found 0") != NULL);
    // Loaders freed without an epoch, and in the middle of one.
    o.batch_size = 4;
    dt_loader_new(&l, &ds, NULL, &o);
    dt_loader_free(l);
    dt_loader_new(&l, &ds, NULL, &o);
    dt_loader_begin_epoch(l, 0);
    CHECK(dt_loader_next(l, &b));
    dt_loader_free(l);
    dt_loader_free(NULL);
    dt_dataset_free(&ds);
}

// A batch that takes longer to prepare than the timeout, with the caller told to wait
// for the thread: a bounded wait, a clear DT_ERR_TIMEOUT, and a loader that still
// starts the next epoch and shuts down cleanly.
static void test_timeout(void) {
    size_t     n = 2 * 2048, hw = 64 * 64;
    uint8_t   *img = calloc(n * hw, 1), *lab = calloc(n, 1);
    dt_dataset ds;
    CHECK_OK(dt_dataset_init(&ds, img, lab, n, 64, 64, NULL));
    free(img);
    free(lab);
    dt_loader_opts o = dt_loader_opts_default();
    o.batch_size     = 2048; // 32 MB of floats per batch: milliseconds of work
    o.timeout_ms     = 1;
    o.caller_helps   = false; // always wait for the thread
    dt_loader *l     = NULL;
    dt_loader_new(&l, &ds, NULL, &o);
    CHECK(l != NULL);
    dt_batch b;
    dt_loader_begin_epoch(l, 0);
    uint64_t t0 = dt_now_ns();
    CHECK(!dt_loader_next(l, &b));
    CHECK(dt_now_ns() - t0 < 1000000000ull);
    CHECK(dt_loader_status(l) == DT_ERR_TIMEOUT);
    CHECK(strstr(dt_last_error(), "loader: expected batch 0 of 2 within 1 ms") != NULL);
    CHECK(!dt_loader_next(l, &b)); // the failed epoch stays failed
    CHECK(strstr(dt_last_error(), "already failed") != NULL);
    dt_loader_begin_epoch(l, 1);
    CHECK(dt_loader_status(l) == DT_OK);
    dt_loader_free(l);
    dt_dataset_free(&ds);
}

int main(void) {
    RUN(test_order_and_content);
    RUN(test_prefetch_identical);
    RUN(test_no_allocation);
    RUN(test_restart_and_resume);
    RUN(test_sequential_and_errors);
    RUN(test_timeout);
    return check_summary();
}
