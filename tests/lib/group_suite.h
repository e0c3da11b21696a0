// group_suite.h: sub-groups (dt_pg_new_group, dt_pg_split) on a world of 4 ranks, run
// by every rank: the collective suite (coll_suite.h, serial references) on pairs
// {0,1},{2,3} (new_group), {0,2},{1,3} (split), a group of 3, singletons, and a split of
// a split with its ranks reversed; ranks, sizes and local ranks; world and sub-group
// operations interleaved; async operations on two groups and the world at once;
// send/recv in group ranks; errors (a NULL group, bad lists, lists that differ between
// ranks, two ranks of a group calling different collectives). Used by
// tests/comm/test_groups.c (forked ranks, tcp and shm) and tests/mpi (mpirun).
#ifndef DTRAIN_TESTS_GROUP_SUITE_H
#define DTRAIN_TESTS_GROUP_SUITE_H

#include "../check.h"
#include "dtrain/comm.h"

// Use GROUP_SUITE_RUN. `world` must have 4 ranks; seed equal on every rank.
void group_suite_run_impl(dt_pg *world, uint64_t seed, int *passed, int *failed);
#define GROUP_SUITE_RUN(pg, seed) group_suite_run_impl((pg), (seed), &check_passed, &check_failed)

// The error part alone (it poisons the world at its end: run it last).
void group_suite_errors_impl(dt_pg *world, int *passed, int *failed);
#define GROUP_SUITE_ERRORS(pg) group_suite_errors_impl((pg), &check_passed, &check_failed)

#endif // DTRAIN_TESTS_GROUP_SUITE_H
