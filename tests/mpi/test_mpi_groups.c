// test_mpi_groups.c: the sub-group suite (tests/lib/group_suite.h: every collective on
// pairs, a split, a group of 3, singletons and a split of a split against serial
// references; interleaving with the world; async on two groups at once; errors) on the
// mpi backend (MPI_Comm_split), in 4 ranks started by a real mpirun, waiting both ways
// (DT_MPI_WAIT block and poll); and (block, Open MPI's single-copy off) a send that
// arrives without further calls by its sender. Skipped with a message when mpirun is missing.
#include "../lib/group_suite.h"
#include "../lib/mpirun.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static void send_progress(dt_pg *pg);

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
    if (!getenv("DT_MPI_WAIT"))
        send_progress(pg);
    GROUP_SUITE_ERRORS(pg);
    dt_pg_free(pg);
}

// A send returns once its data is handed to MPI, and arrives without further calls by
// the sender (comm.h): rank 1 sends 4 MiB on a sub-group, then waits in a world barrier
// that rank 0 reaches only after its receive; then sends and computes for 1.5 s without
// calling into comm: rank 0's receive completes well before that ends.
#define BIG (1u << 20)

static void send_progress(dt_pg *pg) {
    static const int two[2] = {0, 1};
    dt_pg_opts       o      = dt_pg_opts_default();
    o.timeout_ms            = 6000;
    dt_pg *g                = NULL;
    CHECK_OK(dt_pg_new_group(&g, pg, two, 2, &o));
    int    rank = dt_pg_rank(pg);
    float *buf  = dt_alloc(BIG * sizeof *buf);
    if (!CHECK(buf != NULL))
        return;
    for (int tag = 1; tag <= 2; tag++) {
        for (size_t i = 0; i < BIG; i++)
            buf[i] = rank == 1 ? (float)(i % 1009) + (float)tag : 0;
        CHECK_OK(dt_pg_barrier(pg));
        uint64_t t0 = dt_now_ns();
        if (rank == 1) {
            CHECK_OK(dt_pg_send(g, buf, BIG, DT_FLOAT32, 0, tag));
            if (tag == 2) {
                struct timespec ts = {1, 500000000L};
                nanosleep(&ts, NULL);
            }
        } else if (rank == 0) {
            CHECK_OK(dt_pg_recv(g, buf, BIG, DT_FLOAT32, 1, tag));
            double s  = (double)(dt_now_ns() - t0) / 1e9;
            bool   ok = true;
            for (size_t i = 0; i < BIG; i++)
                ok = ok && buf[i] == (float)(i % 1009) + (float)tag;
            CHECK(ok);
            if (!CHECK(s < 0.75))
                fprintf(stderr, "     the receive of message %d took %.2f s\n", tag, s);
        }
        CHECK_OK(dt_pg_barrier(pg));
    }
    dt_free(buf);
    dt_pg_free(g);
}

// Open MPI's shared-memory transport without single-copy (CMA): a large send moves in
// fragments only while the sender's MPI is called, as across hosts, so that
// send_progress sees whether the backend drives it (other MPIs ignore the variable).
#define NO_SINGLE_COPY "OMPI_MCA_btl_vader_single_copy_mechanism=none"

static void run(const char *extra) {
    char seed[48];
    snprintf(seed, sizeof seed, "DT_TEST_SEED=%" PRIu64, dt_now_ns());
    const char *env[3] = {seed, extra ? extra : NO_SINGLE_COPY, NULL};
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
