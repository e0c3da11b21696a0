// test_collectives.c: the collective suite (tests/lib/coll_suite.h: every collective
// against a serial reference, every dtype and op, in place, async, the all_reduce in
// tree order) in real processes over real sockets, for world sizes 1..5 (1..3 under a
// sanitizer), then with each algorithm of every collective's table forced (DT_*_ALGO),
// then ranks that disagree on the reduce order, and a forced algorithm the backend cannot
// run.
// DT_TEST_BACKEND picks the backend (tcp default).
#include "../lib/coll_suite.h"
#include "../lib/mp.h"

#include <stdlib.h>
#include <string.h>

typedef struct run_cfg {
    bool     big;
    uint64_t seed;
} run_cfg;

static void ranks(int rank, int world, void *arg) {
    const run_cfg *cfg = arg;
    (void)world;
    dt_pg *pg = mp_pg_init(60000);
    CHECK(pg != NULL);
    if (!pg)
        return;
    CHECK_EQ(dt_pg_rank(pg), rank);
    coll_suite_opts so = {.seed = cfg->seed, .big = cfg->big};
    COLL_SUITE_RUN(pg, &so);
    dt_pg_free(pg);
}

static void run_world(int world, bool big) {
    run_cfg cfg = {.big = big, .seed = dt_now_ns()};
    mp_opts o   = {.world = world, .timeout_ms = 240000};
    fprintf(stderr, "  world %d, backend %s, algo %s, segment %s, ring lag %s\n", world,
            mp_backend(), getenv("DT_ALLREDUCE_ALGO") ? getenv("DT_ALLREDUCE_ALGO") : "auto",
            getenv("DT_SEGMENT_BYTES") ? getenv("DT_SEGMENT_BYTES") : "default",
            getenv("DT_RING_LAG") ? getenv("DT_RING_LAG") : "default");
    MP_RUN(&o, ranks, &cfg);
}

// The largest world: 5 ranks on 2 cores take most of this suite's time under a sanitizer,
// whose value is each process's threads (the release build runs every world).
#ifdef DT_SANITIZE
#define WORLD_MAX 3
#else
#define WORLD_MAX 5
#endif

static void test_worlds_default(void) {
    for (int w = 1; w <= WORLD_MAX; w++)
        run_world(w, w == 2 || w == WORLD_MAX);
}

// The same with each all_reduce algorithm forced and tiny segments, so that small
// buffers go through multi-segment ring pipelines and recursive doubling handles
// large ones.
static void test_worlds_forced_algorithms(void) {
    setenv("DT_SEGMENT_BYTES", "4096", 1);
    setenv("DT_SMALL_BYTES", "256", 1);
    setenv("DT_ALLREDUCE_ALGO", "ring", 1);
    run_world(3, false);
    run_world(4, false);
    // Other wire orders of the ring's steps (see ring_run): none interleaved, one ahead.
    setenv("DT_RING_LAG", "0", 1);
    run_world(2, false);
    setenv("DT_RING_LAG", "1", 1);
    run_world(WORLD_MAX, false);
    unsetenv("DT_RING_LAG");
    setenv("DT_ALLREDUCE_ALGO", "rdouble", 1);
    run_world(3, false);
    if (WORLD_MAX > 3)
        run_world(5, false);
    unsetenv("DT_ALLREDUCE_ALGO");
    // The point-to-point family of every other table, whatever the backend's auto picks
    // (on shm: over its channels instead of its segment).
    static const char *const p2p[][2] = {
        {"DT_BROADCAST_ALGO", "chain"},   {"DT_REDUCE_ALGO", "ring"},
        {"DT_ALLGATHER_ALGO", "ring"},    {"DT_REDUCESCATTER_ALGO", "ring"},
        {"DT_GATHER_ALGO", "direct"},     {"DT_SCATTER_ALGO", "direct"},
        {"DT_ALLTOALL_ALGO", "pairwise"}, {"DT_BARRIER_ALGO", "dissemination"},
        {"DT_ALLREDUCE_ALGO", "ring"}};
    for (size_t i = 0; i < sizeof p2p / sizeof p2p[0]; i++)
        setenv(p2p[i][0], p2p[i][1], 1);
    run_world(3, false);
    setenv("DT_BROADCAST_ALGO", "tree", 1);
    setenv("DT_REDUCE_ALGO", "tree", 1);
    run_world(4, false);
    for (size_t i = 0; i < sizeof p2p / sizeof p2p[0]; i++)
        unsetenv(p2p[i][0]);
    unsetenv("DT_SEGMENT_BYTES");
    unsetenv("DT_SMALL_BYTES");
}

// One rank asks for the tree order, the others do not: every rank fails with
// DT_ERR_MISMATCH naming both fingerprints.
static void order_ranks(int rank, int world, void *arg) {
    (void)world, (void)arg;
    dt_pg *pg = mp_pg_init(20000);
    if (!CHECK(pg != NULL))
        return;
    float x[300] = {1};
    CHECK_ERR(dt_pg_all_reduce_ordered(pg, x, x, 300, DT_FLOAT32, DT_REDUCE_SUM,
                                       rank == 1 ? DT_ORDER_TREE : DT_ORDER_ANY),
              DT_ERR_MISMATCH, "in tree order");
    CHECK_ERR(dt_pg_all_reduce_ordered(pg, x, x, 1, DT_FLOAT32, DT_REDUCE_SUM, (dt_reduce_order)7),
              DT_ERR_ARG, "expected a reduce order in [0, 2), found 7");
    dt_pg_free(pg);
}

// A forced algorithm the backend has no transport for is refused when the group is
// made, naming the setting and what the backend offers. arg: "DT_<COLL>_ALGO=hier".
static void forced_ranks(int rank, int world, void *arg) {
    (void)rank, (void)world;
    dt_pg *pg = mp_pg_init(20000);
    CHECK(pg == NULL);
    CHECK(dt_last_status() == DT_ERR_UNSUPPORTED);
    CHECK(strstr(dt_last_error(), (const char *)arg) != NULL);
    CHECK(strstr(dt_last_error(), "expected one of auto") != NULL);
    dt_pg_free(pg);
}

static void test_order_and_forcing(void) {
    mp_opts o = {.world = 3, .timeout_ms = 60000};
    MP_RUN(&o, order_ranks, NULL);
    o.world                         = 2;
    static const char *const hier[] = {"DT_ALLREDUCE_ALGO", "DT_BROADCAST_ALGO"};
    for (size_t i = 0; i < sizeof hier / sizeof hier[0]; i++) {
        char want[64];
        snprintf(want, sizeof want, "%s=hier: backend", hier[i]);
        setenv(hier[i], "hier", 1); // only the hybrid backend has two levels
        MP_RUN(&o, forced_ranks, want);
        unsetenv(hier[i]);
    }
}

int main(void) {
    RUN(test_worlds_default);
    RUN(test_worlds_forced_algorithms);
    RUN(test_order_and_forcing);
    return check_summary();
}
