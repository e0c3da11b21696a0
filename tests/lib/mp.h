// mp.h: run a test function in N real processes (fork) that form a job on loopback: a
// free MASTER_PORT, MASTER_ADDR=127.0.0.1, RANK, WORLD_SIZE, LOCAL_RANK,
// LOCAL_WORLD_SIZE and a fresh DT_JOB_TOKEN per run. Each rank's CHECK results are
// added to the calling test's counts; a rank that crashes, is killed (unless allowed)
// or outlives the deadline counts as a failure with a message naming it.
//
//     static void ranks(int rank, int world, void *arg) {
//         dt_pg *pg = mp_pg_init(0);
//         CHECK_OK(dt_pg_barrier(pg));
//         dt_pg_free(pg);
//     }
//     mp_opts o = {.world = 3};
//     MP_RUN(&o, ranks, NULL);
#ifndef DTRAIN_TESTS_MP_H
#define DTRAIN_TESTS_MP_H

#include "../check.h"
#include "dtrain/comm.h"

typedef struct mp_opts {
    int      world;      // processes
    int64_t  timeout_ms; // deadline for the whole run; 0 = 120000
    uint64_t may_die;    // bit r set: rank r may die by a signal (fault tests)
    int      port;       // 0 = pick a free port
} mp_opts;

typedef void (*mp_fn)(int rank, int world, void *arg);

// Use MP_RUN: it passes the including test's counters.
int mp_run_impl(const mp_opts *o, mp_fn fn, void *arg, int *passed, int *failed);
#define MP_RUN(o, fn, arg) mp_run_impl((o), (fn), (arg), &check_passed, &check_failed)

// One 64 KiB page shared by the parent and every rank of the current run (zeroed at
// the start of each run): for times, pids, or results a test compares across ranks.
void *mp_shared(void);

// A port that was free a moment ago (from 20000..32767, below the ephemeral range).
int mp_free_port(void);

// dt_pg_new_from_env with the backend named by DT_TEST_BACKEND (default: auto) and
// the given timeout (0 = 30000 ms). Returns NULL after printing the error.
dt_pg *mp_pg_init(int64_t timeout_ms);
// The same with the backend given (NULL: auto).
dt_pg *mp_pg_open(const char *backend, int64_t timeout_ms);

// This rank as if it ran on host h (DT_HOST_ID "fakehost-<h>"; the local rank and size
// then follow from the host ids, as on real hosts): the hybrid backend's two levels on
// one machine. Before mp_pg_open.
void mp_fake_host(int h);

// The backend the tests use ("tcp" unless DT_TEST_BACKEND says otherwise).
const char *mp_backend(void);

#endif // DTRAIN_TESTS_MP_H
