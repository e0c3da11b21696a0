// test_collectives.c: the collective suite (tests/lib/coll_suite.h: every collective
// against a serial reference, every dtype and op, in place, async) in real processes
// over real sockets, for world sizes 1..5, then with each all_reduce algorithm forced.
// DT_TEST_BACKEND picks the backend (tcp default).
#include "../lib/coll_suite.h"
#include "../lib/mp.h"

#include <stdlib.h>

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

static void test_worlds_default(void) {
    for (int w = 1; w <= 5; w++)
        run_world(w, w == 2 || w == 5);
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
    run_world(5, false);
    unsetenv("DT_RING_LAG");
    setenv("DT_ALLREDUCE_ALGO", "rdouble", 1);
    run_world(3, false);
    run_world(5, false);
    unsetenv("DT_ALLREDUCE_ALGO");
    unsetenv("DT_SEGMENT_BYTES");
    unsetenv("DT_SMALL_BYTES");
}

int main(void) {
    RUN(test_worlds_default);
    RUN(test_worlds_forced_algorithms);
    return check_summary();
}
