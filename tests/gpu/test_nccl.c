// test_nccl (GPU): the nccl backend.
//   - world size 1 (one GPU is enough): the group's set-up (a one-rank NCCL
//     communicator), collectives on device buffers and host buffers;
//   - two ranks on two GPUs: the whole collective suite (coll_suite.h: every collective,
//     dtype and op against a serial reference, host buffers through device scratch),
//     an all-reduce on device buffers in place with AVG, and a sub-group by split;
//   - a rank killed during an all-reduce: the other fails within the liveness bound,
//     naming it, instead of hanging in NCCL.
// The two-rank parts need two GPUs (NCCL refuses two ranks on one GPU) and say they were
// skipped where there is one.
#include "../lib/coll_suite.h"
#include "../lib/mp.h"
#include "gpu_check.h"

#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

static int ngpus;

static dt_pg *nccl_pg(int64_t timeout_ms) {
    setenv("DT_TEST_BACKEND", "nccl", 1);
    return mp_pg_init(timeout_ms);
}

// On device d: n floats of rank r's pattern, reduced and compared on the host.
static void device_all_reduce(dt_pg *pg, dt_device *d, int rank, int world) {
    enum { N = 1 << 16 };
    float *h = malloc(sizeof(float) * N), *g;
    for (int i = 0; i < N; i++)
        h[i] = (float)(rank + 1) * (float)(i % 7);
    CHECK_OK(dt_device_alloc(d, sizeof(float) * N, (void **)&g));
    CHECK_OK(dt_device_copy(d, g, h, sizeof(float) * N, NULL));
    CHECK_OK(dt_pg_all_reduce(pg, g, g, N, DT_FLOAT32, DT_REDUCE_AVG));
    CHECK_OK(dt_device_copy(d, h, g, sizeof(float) * N, NULL));
    float mean = (float)(world + 1) / 2.0f; // (1 + ... + world) / world
    int   bad  = 0;
    for (int i = 0; i < N; i++)
        bad += fabsf(h[i] - mean * (float)(i % 7)) > 1e-5f * (float)(i % 7 + 1);
    CHECK_EQ(bad, 0);
    dt_device_free(d, g);
    free(h);
}

static void one_rank(int rank, int world, void *arg) {
    (void)arg;
    dt_pg *pg = nccl_pg(0);
    if (!CHECK(pg != NULL))
        return;
    CHECK(strcmp(dt_pg_backend(pg), "nccl") == 0);
    dt_device *d;
    CHECK_OK(dt_device_get(&d, "cuda:0"));
    device_all_reduce(pg, d, rank, world);
    float x[4] = {1, 2, 3, 4}, y[4];
    CHECK_OK(dt_pg_all_reduce(pg, x, y, 4, DT_FLOAT32, DT_REDUCE_SUM));
    CHECK(y[3] == 4.0f);
    CHECK_OK(dt_pg_barrier(pg));
    dt_pg_free(pg);
}

static void test_world_one(void) {
    mp_opts o = {.world = 1};
    MP_RUN(&o, one_rank, NULL);
}

static void two_ranks(int rank, int world, void *arg) {
    (void)arg;
    dt_pg *pg = nccl_pg(0);
    if (!CHECK(pg != NULL))
        return;
    char name[16];
    snprintf(name, sizeof name, "cuda:%d", rank);
    dt_device *d;
    CHECK_OK(dt_device_get(&d, name));
    coll_suite_opts co = {.seed = 77, .big = true};
    COLL_SUITE_RUN(pg, &co);
    device_all_reduce(pg, d, rank, world);
    dt_pg *sub = NULL; // both ranks again, in reverse order: ncclCommSplit
    CHECK_OK(dt_pg_split(&sub, pg, 0, world - rank, NULL));
    if (CHECK(sub != NULL)) {
        CHECK_EQ(dt_pg_rank(sub), world - 1 - rank);
        int32_t v = rank + 1, s = 0;
        CHECK_OK(dt_pg_all_reduce(sub, &v, &s, 1, DT_INT32, DT_REDUCE_SUM));
        CHECK_EQ(s, 3);
    }
    dt_pg_free(sub);
    CHECK_OK(dt_pg_barrier(pg));
    dt_pg_free(pg);
}

// Rank 1 dies while rank 0 waits in a large all-reduce: rank 0 must fail, naming rank 1,
// within the liveness bound (DT_LIVENESS_MS, 10 s here), not hang in NCCL.
static void killed_rank(int rank, int world, void *arg) {
    (void)arg, (void)world;
    dt_pg *pg = nccl_pg(60000);
    if (!CHECK(pg != NULL))
        return;
    char name[16];
    snprintf(name, sizeof name, "cuda:%d", rank);
    dt_device *d;
    CHECK_OK(dt_device_get(&d, name));
    CHECK_OK(dt_pg_barrier(pg));
    if (rank == 1) {
        usleep(200000);
        raise(SIGKILL);
    }
    enum { N = 1 << 24 };
    float *g;
    CHECK_OK(dt_device_alloc(d, sizeof(float) * N, (void **)&g));
    double    t0 = dt_now();
    dt_status st = DT_OK;
    for (int i = 0; i < 100 && st == DT_OK; i++)
        st = dt_pg_all_reduce(pg, g, g, N, DT_FLOAT32, DT_REDUCE_SUM);
    double secs = dt_now() - t0;
    printf("# rank 0: %s after %.1f s: %s\n", dt_status_str(st), secs, dt_last_error());
    CHECK(st != DT_OK);
    CHECK(strstr(dt_last_error(), "rank 1") != NULL);
    CHECK(secs < 30.0);
    dt_pg_free(pg);
}

static void test_two_gpus(void) {
    int n = ngpus;
    if (n < 2) {
        printf("# two ranks on two GPUs: skipped (this machine has %d GPU; NCCL refuses two "
               "ranks on one)\n",
               n);
        return;
    }
    mp_opts o = {.world = 2};
    MP_RUN(&o, two_ranks, NULL);
    setenv("DT_LIVENESS_MS", "10000", 1);
    mp_opts k = {.world = 2, .may_die = 2, .timeout_ms = 90000};
    MP_RUN(&k, killed_rank, NULL);
}

int main(int argc, char **argv) {
    gpu_filter = argc > 1 ? argv[1] : NULL;
    if ((ngpus = gpu_count_forked()) < 1)
        return check_summary();
    GPU_RUN(test_world_one);
    GPU_RUN(test_two_gpus);
    return check_summary();
}
