// coll_suite.h: the collective test suite, run by every rank of a group: every
// collective against a serial reference, for element counts 0, 1, 7, a prime above
// 1e5 and (optionally) 16 Mi, every dtype and reduce op, in place and out of place,
// the all_reduce in tree order bitwise, with several async operations in flight. Inputs are fresh
// random numbers: each element is a hash of (seed, rank, index), so every rank computes every other
// rank's input, and thus the reference, by itself. Used by tests/comm/test_collectives.c (forked
// ranks, tcp/shm) and tests/mpi (ranks started by mpirun).
//
//     coll_suite_opts o = {.seed = seed_shared_by_all_ranks, .big = true};
//     COLL_SUITE_RUN(pg, &o);
#ifndef DTRAIN_TESTS_COLL_SUITE_H
#define DTRAIN_TESTS_COLL_SUITE_H

#include "../check.h"
#include "dtrain/comm.h"

typedef struct coll_suite_opts {
    uint64_t seed; // the same on every rank of the run
    bool     big;  // also a 16 Mi element all_reduce (1 Mi + 3 under sanitizers)
} coll_suite_opts;

// Use COLL_SUITE_RUN: it adds the suite's CHECK results to the including test's counts.
void coll_suite_run_impl(dt_pg *pg, const coll_suite_opts *o, int *passed, int *failed);
#define COLL_SUITE_RUN(pg, o) coll_suite_run_impl((pg), (o), &check_passed, &check_failed)

#endif // DTRAIN_TESTS_COLL_SUITE_H
