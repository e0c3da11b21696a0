// test_mpi_collectives.c: the collective suite of tests/lib/coll_suite.h (every
// collective against a serial reference, every dtype and op, in place, async) on the
// mpi backend, in ranks started by a real mpirun: world sizes 1 to 4, then world 3
// waiting by polling (DT_MPI_WAIT=poll), world 3 with reductions and broadcasts split
// into many MPI calls (DT_MPI_CHUNK_COUNT), world 2 without fingerprint checks, and
// world 3 with the point-to-point algorithms forced (DT_*_ALGO) over MPI's transfer
// slots instead of MPI's own collectives.
// Skipped with a message when mpirun is missing.
#include "../lib/coll_suite.h"
#include "../lib/mpirun.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

static void child_suite(void) {
    dt_pg_opts o = dt_pg_opts_default();
    o.backend    = "mpi";
    o.timeout_ms = 60000;
    dt_pg *pg    = NULL;
    dt_pg_new_from_env(&pg, &o);
    CHECK(pg != NULL);
    if (!pg) {
        fprintf(stderr, "rank %d: %s\n", mpirun_child_rank(), dt_last_error());
        return;
    }
    CHECK(strcmp(dt_pg_backend(pg), "mpi") == 0);
    CHECK_EQ(dt_pg_rank(pg), mpirun_child_rank());
    CHECK_EQ(dt_pg_size(pg), mpirun_child_world());
    coll_suite_opts so = {.seed = strtoull(getenv("DT_TEST_SEED"), NULL, 10),
                          .big  = getenv("DT_TEST_BIG") != NULL};
    COLL_SUITE_RUN(pg, &so);
    dt_pg_free(pg);
}

// extra: settings for the children, separated by spaces ("A=1 B=2").
static void run(int np, bool big, const char *extra) {
    char seed[48], words[512];
    snprintf(seed, sizeof seed, "DT_TEST_SEED=%" PRIu64, dt_now_ns());
    snprintf(words, sizeof words, "%s", extra ? extra : "");
    const char *env[16] = {seed};
    int         k       = 1;
    if (big)
        env[k++] = "DT_TEST_BIG=1";
    for (char *w = strtok(words, " "); w && k < 15; w = strtok(NULL, " "))
        env[k++] = w;
    fprintf(stderr, "  mpirun -np %d, backend mpi%s%s%s\n", np, big ? ", 16 Mi all_reduce" : "",
            extra ? ", " : "", extra ? extra : "");
    mpirun_opts   o = {.np = np, .child = "suite", .env = env, .timeout_ms = 180000};
    mpirun_result r;
    MPIRUN(&o, &r);
    mpirun_result_free(&r);
}

static void test_worlds(void) {
    for (int np = 1; np <= 4; np++)
        run(np, np == 2, NULL);
}

static void test_variants(void) {
    run(3, false, "DT_MPI_WAIT=poll");
    run(3, false, "DT_MPI_CHUNK_COUNT=1000");
    run(2, false, "DT_MPI_FINGERPRINT=off");
    run(3, false,
        "DT_ALLREDUCE_ALGO=ring DT_BROADCAST_ALGO=chain DT_REDUCE_ALGO=tree "
        "DT_ALLGATHER_ALGO=ring DT_REDUCESCATTER_ALGO=ring DT_GATHER_ALGO=direct "
        "DT_SCATTER_ALGO=direct DT_ALLTOALL_ALGO=pairwise DT_BARRIER_ALGO=dissemination "
        "DT_SEGMENT_BYTES=4096");
}

int main(int argc, char **argv) {
    const char *c = mpirun_child_case(argc, argv);
    if (c) {
        if (strcmp(c, "suite") == 0)
            child_suite();
        return MPIRUN_CHILD_DONE();
    }
    if (!mpirun_available()) {
        printf("SKIP test_mpi_collectives: mpirun not found (apt-get install openmpi-bin)\n");
        return check_summary();
    }
    RUN(test_worlds);
    RUN(test_variants);
    return check_summary();
}
