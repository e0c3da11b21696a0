// test_mpi_faults.c: what goes wrong on the mpi backend, under a real mpirun.
// - Mismatched collectives (count, kind, root) fail on every rank with DT_ERR_MISMATCH
//   naming a rank that differs and both fingerprints; a mismatched send/recv names the
//   sender. Several groups are formed one after another in the same processes.
// - Without fingerprints, MPI's own error comes back (MPI_ERRORS_RETURN) as
//   DT_ERR_MISMATCH with MPI's message instead of aborting the process.
// - Timeouts: polling returns DT_ERR_TIMEOUT at the deadline; blocking calls are ended
//   by the watchdog, which aborts the MPI job with a message (MPI cannot cancel a
//   collective). An aborted group does the same after the grace period (block) or at
//   once (poll).
// - A rank killed by SIGKILL: mpirun stops the job; nobody waits for the timeout.
// - Bad settings: DT_MPI_WAIT with an unknown value, or different on two ranks;
//   RANK/WORLD_SIZE that MPI does not share (a lone process asking for backend mpi
//   with WORLD_SIZE=2).
#include "../lib/mpirun.h"

#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static dt_pg *group(int64_t timeout_ms) {
    dt_pg_opts o = dt_pg_opts_default();
    o.backend    = "mpi";
    o.timeout_ms = timeout_ms;
    dt_pg *pg    = NULL;
    dt_pg_new_from_env(&pg, &o);
    if (!pg)
        fprintf(stderr, "rank %d: init: %s\n", mpirun_child_rank(), dt_last_error());
    return pg;
}

static bool contains(const char *hay, const char *needle) {
    return strstr(hay, needle) != NULL;
}

static void sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

// --------------------------------------------------------------------- the cases

static void child_mismatch(void) {
    int   rank    = mpirun_child_rank();
    float buf[16] = {0};
    char  want[96];

    // 1. count: rank 1 reduces 10 elements, the others 11.
    dt_pg *pg = group(30000);
    CHECK(pg != NULL);
    if (!pg)
        return;
    CHECK_OK(dt_pg_all_reduce(pg, buf, buf, 4, DT_FLOAT32, DT_REDUCE_SUM)); // in step first
    CHECK_ERR(dt_pg_all_reduce(pg, buf, buf, rank == 1 ? 10 : 11, DT_FLOAT32, DT_REDUCE_SUM),
              DT_ERR_MISMATCH, "all_reduce #2");
    const char *m = dt_last_error();
    if (rank == 1)
        snprintf(want, sizeof want, "called all_reduce #2 (float32 sum, count 11)");
    else
        snprintf(want, sizeof want, "rank 1 called all_reduce #2 (float32 sum, count 10)");
    CHECK(contains(m, want));
    CHECK(contains(m, "every rank must issue the same collectives"));
    // The group is poisoned: the next call fails at once with the same error.
    uint64_t t0 = dt_now_ns();
    CHECK_ERR(dt_pg_barrier(pg), DT_ERR_MISMATCH, "all_reduce #2");
    CHECK(dt_now_ns() - t0 < 100000000ull);
    dt_pg_free(pg);

    // 2. kind: rank 2 broadcasts while the others reduce.
    CHECK((pg = group(30000)) != NULL);
    if (!pg)
        return;
    dt_status st = rank == 2 ? dt_pg_broadcast(pg, buf, 4, DT_FLOAT32, 0)
                             : dt_pg_all_reduce(pg, buf, buf, 4, DT_FLOAT32, DT_REDUCE_SUM);
    CHECK_EQ(st, DT_ERR_MISMATCH);
    CHECK(contains(dt_last_error(),
                   rank == 2 ? "called all_reduce #1" : "rank 2 called broadcast #1"));
    dt_pg_free(pg);

    // 3. root: rank 0 reduces to root 0, the others to root 1.
    CHECK((pg = group(30000)) != NULL);
    if (!pg)
        return;
    CHECK_ERR(dt_pg_reduce(pg, buf, buf, 4, DT_INT32, DT_REDUCE_MAX, rank == 0 ? 0 : 1),
              DT_ERR_MISMATCH,
              rank == 0 ? "root 1)" : "rank 0 called reduce #1 (int32 max, count 4, root 0)");
    dt_pg_free(pg);

    // 4. send/recv: rank 0 sends 5 elements with tag 1, rank 1 expects 6.
    CHECK((pg = group(30000)) != NULL);
    if (!pg)
        return;
    if (rank == 0)
        CHECK_OK(dt_pg_send(pg, buf, 5, DT_FLOAT32, 1, 1));
    if (rank == 1)
        CHECK_ERR(dt_pg_recv(pg, buf, 6, DT_FLOAT32, 0, 1), DT_ERR_MISMATCH,
                  "rank 0 called send #1 (float32, count 5, tag 1)");
    // Matched ones still work on the other ranks' side of the group.
    if (rank == 0)
        CHECK_OK(dt_pg_recv(pg, buf, 3, DT_INT64, 2, 7));
    if (rank == 2)
        CHECK_OK(dt_pg_send(pg, buf, 3, DT_INT64, 0, 7));
    dt_pg_free(pg);
}

// Without fingerprints: MPI's own truncation error, returned instead of aborting.
static void child_truncate(void) {
    int    rank = mpirun_child_rank();
    float  buf[16];
    dt_pg *pg = group(30000);
    CHECK(pg != NULL);
    if (!pg)
        return;
    for (int i = 0; i < 16; i++)
        buf[i] = (float)i;
    if (rank == 0) {
        CHECK_OK(dt_pg_send(pg, buf, 10, DT_FLOAT32, 1, 0));
        CHECK_OK(dt_pg_send(pg, buf, 5, DT_FLOAT32, 1, 0));
    } else {
        CHECK_ERR(dt_pg_recv(pg, buf, 5, DT_FLOAT32, 0, 0), DT_ERR_MISMATCH, "MPI_Recv failed");
        CHECK(contains(dt_last_error(), "truncat")); // MPI's words: "message truncated"
    }
    dt_pg_free(pg);
    // A receive larger than the message: MPI accepts it, the element count does not.
    CHECK((pg = group(30000)) != NULL);
    if (!pg)
        return;
    if (rank == 0)
        CHECK_OK(dt_pg_send(pg, buf, 5, DT_FLOAT32, 1, 0));
    else
        CHECK_ERR(dt_pg_recv(pg, buf, 10, DT_FLOAT32, 0, 0), DT_ERR_MISMATCH,
                  "rank 0 sent 5 elements of float32 but this rank expected 10");
    dt_pg_free(pg);
}

// Polling: rank 1 never joins; rank 0 gets DT_ERR_TIMEOUT at its deadline.
static void child_timeout_poll(void) {
    int    rank = mpirun_child_rank();
    dt_pg *pg   = group(1000);
    CHECK(pg != NULL);
    if (!pg)
        return;
    if (rank == 0) {
        float    x  = 1;
        uint64_t t0 = dt_now_ns();
        CHECK_ERR(dt_pg_all_reduce(pg, &x, &x, 1, DT_FLOAT32, DT_REDUCE_SUM), DT_ERR_TIMEOUT,
                  "all_reduce #1: timed out waiting for the other ranks in MPI_Iallreduce");
        double secs = (double)(dt_now_ns() - t0) * 1e-9;
        CHECK(secs > 0.9 && secs < 5);
        CHECK_ERR(dt_pg_barrier(pg), DT_ERR_TIMEOUT, "all_reduce #1");
        dt_pg_free(pg);
        MPIRUN_CHILD_DONE();
    } else {
        MPIRUN_CHILD_DONE();
        sleep_ms(3000);
        dt_pg_free(pg);
    }
}

// Blocking: rank 1 never joins; rank 0's watchdog aborts the job at the deadline.
static void child_timeout_block(void) {
    int    rank = mpirun_child_rank();
    dt_pg *pg   = group(1500);
    CHECK(pg != NULL);
    MPIRUN_CHILD_DONE();
    if (!pg)
        return;
    if (rank == 0) {
        float x = 1;
        dt_pg_all_reduce(pg, &x, &x, 1, DT_FLOAT32, DT_REDUCE_SUM);
        fprintf(stderr, "rank 0: all_reduce returned: %s\n", dt_last_error());
    } else {
        sleep_ms(30000);
    }
    dt_pg_free(pg);
}

// The group is aborted while an operation waits for a rank that never comes.
static void child_abort(void) {
    int    rank = mpirun_child_rank();
    dt_pg *pg   = group(60000);
    CHECK(pg != NULL);
    MPIRUN_CHILD_DONE();
    if (!pg)
        return;
    if (rank == 0) {
        float    x = 1;
        dt_work *w = NULL;
        CHECK_OK(dt_pg_all_reduce_async(pg, &x, &x, 1, DT_FLOAT32, DT_REDUCE_SUM, &w));
        sleep_ms(200);
        uint64_t t0 = dt_now_ns();
        dt_pg_abort(pg, "stopped by the test");
        // poll: returns now; block: the watchdog ends the job ~2 s later.
        CHECK_ERR(dt_work_wait(w), DT_ERR_STATE, "stopped by the test");
        CHECK(dt_now_ns() - t0 < 1000000000ull);
        dt_work_free(w);
        MPIRUN_CHILD_DONE();
        dt_pg_free(pg);
    } else {
        sleep_ms(30000);
        dt_pg_free(pg);
    }
}

// Rank 1 dies by SIGKILL while rank 0 waits in a collective with a long timeout.
static void child_kill(void) {
    int    rank = mpirun_child_rank();
    dt_pg *pg   = group(60000);
    CHECK(pg != NULL);
    MPIRUN_CHILD_DONE();
    if (!pg)
        return;
    if (rank == 1) {
        sleep_ms(300);
        raise(SIGKILL);
    }
    float x = 1;
    dt_pg_all_reduce(pg, &x, &x, 1, DT_FLOAT32, DT_REDUCE_SUM);
    dt_pg_free(pg);
}

// Rank 1 polls, rank 0 blocks: refused at init on both (MPI would never match them).
static void child_settings_differ(void) {
    if (mpirun_child_rank() == 1)
        setenv("DT_MPI_WAIT", "poll", 1);
    dt_pg_opts o = dt_pg_opts_default();
    o.backend    = "mpi";
    o.timeout_ms = 20000;
    CHECK(dt_pg_new_from_env(&(dt_pg *){NULL}, &o) != DT_OK);
    CHECK_EQ(dt_last_status(), DT_ERR_MISMATCH);
    CHECK(contains(dt_last_error(), mpirun_child_rank() == 1
                                        ? "DT_MPI_WAIT differs between ranks (this rank: poll)"
                                        : "DT_MPI_WAIT differs between ranks (this rank: block)"));
}

static void child_bad_wait(void) {
    dt_pg_opts o = dt_pg_opts_default();
    o.backend    = "mpi";
    o.timeout_ms = 10000;
    CHECK(dt_pg_new_from_env(&(dt_pg *){NULL}, &o) != DT_OK);
    CHECK_EQ(dt_last_status(), DT_ERR_ARG);
    CHECK(contains(dt_last_error(),
                   "environment variable DT_MPI_WAIT expects one of block|poll, found "
                   "\"sometimes\""));
}

// Not under mpirun: MPI's singleton is one rank, the environment says two.
static void child_not_mpi_world(void) {
    dt_pg_opts o = dt_pg_opts_default();
    o.backend    = "mpi";
    o.timeout_ms = 10000;
    CHECK(dt_pg_new_from_env(&(dt_pg *){NULL}, &o) != DT_OK);
    CHECK_EQ(dt_last_status(), DT_ERR_MISMATCH);
    CHECK(contains(dt_last_error(), "MPI sees rank 0 of 1, but RANK=0 and WORLD_SIZE=2 say rank "
                                    "0 of 2"));
}

// -------------------------------------------------------------------- the parent

static mpirun_result run(int np, const char *child, const char *const *env, bool may_fail) {
    mpirun_opts o = {
        .np = np, .child = child, .env = env, .timeout_ms = 90000, .expect_failure = may_fail};
    mpirun_result r;
    fprintf(stderr, "  %s (np %d)\n", child, np);
    MPIRUN(&o, &r);
    return r;
}

static void test_mismatch(void) {
    mpirun_result r = run(3, "mismatch", NULL, false);
    mpirun_result_free(&r);
    const char *env[] = {"DT_MPI_FINGERPRINT=off", NULL};
    r                 = run(2, "truncate", env, false);
    mpirun_result_free(&r);
}

static void test_timeouts(void) {
    const char *poll[] = {"DT_MPI_WAIT=poll", NULL};
    // Rank 0 leaves without MPI_Finalize (an MPI request is stuck): mpirun reports it.
    mpirun_result r = run(2, "timeout_poll", poll, true);
    CHECK_EQ(r.reported, 2);
    CHECK(!r.timed_out);
    mpirun_result_free(&r);

    const char *block[] = {"DT_MPI_WAIT=block", NULL};
    r                   = run(2, "timeout_block", block, true);
    CHECK_EQ(r.reported, 2);
    CHECK(r.exit_code != 0 && !r.timed_out);
    CHECK(contains(r.output, "all_reduce #1: timed out in MPI"));
    CHECK(contains(r.output, "MPI_Abort"));
    CHECK(!contains(r.output, "all_reduce returned"));
    CHECK(r.secs < 20); // rank 1 would sleep 30 s: the job was stopped
    if (r.secs >= 20 || !contains(r.output, "timed out in MPI"))
        fprintf(stderr, "%s\n", r.output);
    mpirun_result_free(&r);
}

static void test_abort(void) {
    const char   *poll[] = {"DT_MPI_WAIT=poll", NULL};
    mpirun_result r      = run(2, "abort", poll, true);
    CHECK_EQ(r.reported, 2);
    CHECK(r.secs < 20);
    mpirun_result_free(&r);

    // Blocking: dt_work_wait cannot return before the call does; the watchdog ends the
    // job after the grace period, saying why.
    const char *block[] = {"DT_MPI_WAIT=block", NULL};
    r                   = run(2, "abort", block, true);
    CHECK(r.exit_code != 0 && !r.timed_out);
    CHECK(contains(r.output, "the group was aborted while an MPI call was in flight"));
    CHECK(r.secs < 20);
    mpirun_result_free(&r);
}

static void test_killed_rank(void) {
    mpirun_result r = run(2, "kill", NULL, true);
    CHECK_EQ(r.reported, 2);
    CHECK(r.exit_code != 0 && !r.timed_out);
    CHECK(r.secs < 20); // not the 60 s timeout
    mpirun_result_free(&r);
}

static void test_bad_settings(void) {
    const char   *bad[] = {"DT_MPI_WAIT=sometimes", NULL};
    mpirun_result r     = run(1, "bad_wait", bad, false);
    mpirun_result_free(&r);
    // Ranks that disagree on DT_MPI_WAIT fail at init; the failed processes leave
    // without MPI_Finalize and mpirun ends the job (a rank may be stopped before it
    // reports).
    r = run(2, "settings_differ", NULL, true);
    CHECK(r.reported >= 1 && !r.timed_out && r.secs < 20);
    mpirun_result_free(&r);
    const char *two[] = {"RANK=0", "WORLD_SIZE=2", NULL};
    // The process exits 0 (it only checks); MPI is not finalised after the mismatch.
    r = run(0, "not_mpi_world", two, true);
    CHECK_EQ(r.reported, 1);
    CHECK(!r.timed_out);
    mpirun_result_free(&r);
}

int main(int argc, char **argv) {
    const char *c = mpirun_child_case(argc, argv);
    if (c) {
        static const struct {
            const char *name;
            void (*fn)(void);
        } cases[] = {{"mismatch", child_mismatch},
                     {"truncate", child_truncate},
                     {"timeout_poll", child_timeout_poll},
                     {"timeout_block", child_timeout_block},
                     {"abort", child_abort},
                     {"kill", child_kill},
                     {"bad_wait", child_bad_wait},
                     {"not_mpi_world", child_not_mpi_world},
                     {"settings_differ", child_settings_differ}};
        for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
            if (strcmp(c, cases[i].name) == 0)
                cases[i].fn();
        return MPIRUN_CHILD_DONE();
    }
    if (!mpirun_available()) {
        printf("SKIP test_mpi_faults: mpirun not found (apt-get install openmpi-bin)\n");
        return check_summary();
    }
    RUN(test_mismatch);
    RUN(test_timeouts);
    RUN(test_abort);
    RUN(test_killed_rank);
    RUN(test_bad_settings);
    return check_summary();
}
