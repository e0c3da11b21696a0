// test_mpi_groups.c: the sub-group suite (tests/lib/group_suite.h: every collective on
// pairs, a split, a group of 3, singletons and a split of a split against serial
// references; interleaving with the world; async on two groups at once; errors) on the
// mpi backend (MPI_Comm_split), in 4 ranks started by a real mpirun, waiting both ways
// (DT_MPI_WAIT block and poll). Skipped with a message when mpirun is missing.
#include "../lib/group_suite.h"
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
    GROUP_SUITE_RUN(pg, strtoull(getenv("DT_TEST_SEED"), NULL, 10));
    GROUP_SUITE_ERRORS(pg);
    dt_pg_free(pg);
}

static void run(const char *extra) {
    char seed[48];
    snprintf(seed, sizeof seed, "DT_TEST_SEED=%" PRIu64, dt_now_ns());
    const char *env[3] = {seed, extra, NULL};
    fprintf(stderr, "  mpirun -np 4, backend mpi%s%s\n", extra ? ", " : "", extra ? extra : "");
    mpirun_opts   o = {.np = 4, .child = "suite", .env = env, .timeout_ms = 180000};
    mpirun_result r;
    MPIRUN(&o, &r);
    mpirun_result_free(&r);
}

static void test_groups_block(void) {
    run(NULL);
}

static void test_groups_poll(void) {
    run("DT_MPI_WAIT=poll");
}

int main(int argc, char **argv) {
    const char *c = mpirun_child_case(argc, argv);
    if (c) {
        if (strcmp(c, "suite") == 0)
            child_suite();
        return MPIRUN_CHILD_DONE();
    }
    if (!mpirun_available()) {
        printf("SKIP test_mpi_groups: mpirun not found (apt-get install openmpi-bin)\n");
        return check_summary();
    }
    RUN(test_groups_block);
    RUN(test_groups_poll);
    return check_summary();
}
