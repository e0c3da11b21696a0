// test_groups.c: sub-groups (dt_pg_new_group, dt_pg_split) in 4 forked processes over
// the backend named by DT_TEST_BACKEND (tcp by default; test_shm_groups.c runs shm):
// the sub-group suite (tests/lib/group_suite.h: every collective on pairs, a split, a
// group of 3, singletons and a split of a split against serial references; world and
// groups interleaved; async on two groups at once; errors), then a rank SIGKILLed
// while every rank works in a sub-group: every rank of the world must stop within the
// liveness bound, also those whose group does not contain the dead rank.
#include "../lib/group_suite.h"
#include "../lib/mp.h"

#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct shared {
    _Atomic uint64_t kill_ns; // when the victim killed itself
} shared;

static void suite_ranks(int rank, int world, void *arg) {
    (void)rank, (void)world;
    dt_pg *pg = mp_pg_init(30000);
    CHECK(pg != NULL);
    if (!pg)
        return;
    GROUP_SUITE_RUN(pg, *(const uint64_t *)arg);
    GROUP_SUITE_ERRORS(pg);
    dt_pg_free(pg);
}

static void test_group_suite(void) {
    uint64_t seed = dt_now_ns();
    mp_opts  o    = {.world = 4, .timeout_ms = 120000};
    fprintf(stderr, "  backend %s\n", mp_backend());
    MP_RUN(&o, suite_ranks, &seed);
}

// Liveness bound of this test (DT_LIVENESS_MS) and the time every rank must stop in.
#define LIVE_MS 1500
#define BOUND_S 8.0
#define VICTIM  3

static void kill_ranks(int rank, int world, void *arg) {
    (void)world, (void)arg;
    shared *sh = mp_shared();
    dt_pg  *pg = mp_pg_init(30000);
    CHECK(pg != NULL);
    if (!pg)
        return;
    dt_pg *pair = NULL; // {0,1}, {2,3}: ranks 0 and 1 never talk to the victim
    CHECK_OK(dt_pg_split(&pair, pg, rank / 2, rank, NULL));
    if (!pair)
        return;
    float     buf[256];
    dt_status st = DT_OK;
    for (int i = 0; i < 256; i++)
        buf[i] = 1;
    for (int i = 0; i < 20 && st == DT_OK; i++)
        st = dt_pg_all_reduce(pair, buf, buf, 256, DT_FLOAT32, DT_REDUCE_MAX);
    CHECK_OK(st);
    CHECK_OK(dt_pg_barrier(pg));
    if (rank == VICTIM) {
        struct timespec ts = {0, 50 * 1000000L};
        nanosleep(&ts, NULL);
        atomic_store(&sh->kill_ns, dt_now_ns());
        raise(SIGKILL);
    }
    uint64_t t0 = dt_now_ns();
    while (st == DT_OK && dt_now_ns() - t0 < 30ull * 1000000000ull)
        st = dt_pg_all_reduce(pair, buf, buf, 256, DT_FLOAT32, DT_REDUCE_MAX);
    uint64_t now = dt_now_ns(), kill = atomic_load(&sh->kill_ns);
    double   secs = kill ? (double)(now - kill) / 1e9 : -1;
    char     msg[1024];
    snprintf(msg, sizeof msg, "%s", dt_last_error());
    CHECK(st == DT_ERR_PEER);
    // The dead rank, named by its world rank or by its group rank with the group's
    // world ranks listed (shm's group segment knows group ranks only).
    bool named =
        strstr(msg, "rank 3") || (strstr(msg, "rank 1 ") && strstr(msg, "world ranks 2, 3"));
    CHECK(named);
    CHECK(kill != 0 && secs < BOUND_S);
    if (st != DT_ERR_PEER || !named || secs >= BOUND_S)
        fprintf(stderr, "     rank %d after %.2f s: %s: %s\n", rank, secs, dt_status_str(st), msg);
    // Every group of the process is stopped: the world too, at once.
    CHECK(dt_pg_barrier(pg) != DT_OK);
    dt_pg_free(pair);
    dt_pg_free(pg);
}

static void test_killed_rank_in_group(void) {
    char live[16];
    snprintf(live, sizeof live, "%d", LIVE_MS);
    setenv("DT_LIVENESS_MS", live, 1);
    setenv("DT_HEARTBEAT_MS", "200", 1);
    mp_opts o = {.world = 4, .may_die = 1u << VICTIM, .timeout_ms = 60000};
    MP_RUN(&o, kill_ranks, NULL);
    unsetenv("DT_LIVENESS_MS");
    unsetenv("DT_HEARTBEAT_MS");
}

// A group's own timeout: rank 1 of a pair comes 2 s late to a group with a 400 ms
// timeout (the world's is 30 s): rank 0 times out in the group's bound, naming it, and
// every rank's world fails after.
static void timeout_ranks(int rank, int world, void *arg) {
    (void)world, (void)arg;
    dt_pg *pg = mp_pg_init(30000);
    CHECK(pg != NULL);
    if (!pg)
        return;
    dt_pg     *pair = NULL;
    dt_pg_opts o    = dt_pg_opts_default();
    o.timeout_ms    = 400;
    CHECK_OK(dt_pg_split(&pair, pg, rank / 2, rank, &o));
    if (!pair)
        return;
    float x = 1;
    if (rank == 0) {
        uint64_t t0 = dt_now_ns();
        CHECK_ERR(dt_pg_all_reduce(pair, &x, &x, 1, DT_FLOAT32, DT_REDUCE_SUM), DT_ERR_TIMEOUT,
                  "on group");
        double secs = (double)(dt_now_ns() - t0) / 1e9;
        CHECK(secs > 0.3 && secs < 3.0);
        if (!(secs > 0.3 && secs < 3.0))
            fprintf(stderr, "     timed out after %.2f s\n", secs);
    } else if (rank == 1) {
        // Its all_reduce may still complete (rank 0's data waits in the socket) or
        // fail (rank 0's abort came first): either is right.
        struct timespec ts = {2, 0};
        nanosleep(&ts, NULL);
        dt_pg_all_reduce(pair, &x, &x, 1, DT_FLOAT32, DT_REDUCE_SUM);
    } else {
        CHECK_OK(dt_pg_all_reduce(pair, &x, &x, 1, DT_FLOAT32, DT_REDUCE_SUM));
        CHECK_EQ(x, 2.0f);
    }
    // The timeout stopped rank 0's world too, and its peers learn it.
    CHECK(dt_pg_barrier(pg) != DT_OK);
    dt_pg_free(pair);
    dt_pg_free(pg);
}

// tcp: groups share the world's connections, so a rank that runs a group collective
// while its partner runs a world collective is told at once: a mismatch naming the
// group (shm and mpi keep groups apart and time out instead: docs/comm.md).
static void cross_ranks(int rank, int world, void *arg) {
    (void)world, (void)arg;
    dt_pg *pg = mp_pg_init(10000);
    CHECK(pg != NULL);
    if (!pg)
        return;
    // Ranks 2 and 3 may learn of the failure while still splitting: only ranks 0 and 1
    // are checked.
    dt_pg    *pair = NULL;
    dt_status sst  = dt_pg_split(&pair, pg, rank / 2, rank, NULL);
    if (rank < 2)
        CHECK_OK(sst);
    float     x  = 1;
    uint64_t  t0 = dt_now_ns();
    dt_status st = rank == 0 ? dt_pg_all_reduce(pair, &x, &x, 1, DT_FLOAT32, DT_REDUCE_SUM)
                             : dt_pg_all_reduce(pg, &x, &x, 1, DT_FLOAT32, DT_REDUCE_SUM);
    if (rank < 2) {
        CHECK(st == DT_ERR_MISMATCH || st == DT_ERR_PEER);
        CHECK((dt_now_ns() - t0) / 1000000 < 5000);
        bool named = strstr(dt_last_error(), "on group") != NULL;
        CHECK(named);
        if (!named)
            fprintf(stderr, "     rank %d: %s\n", rank, dt_last_error());
    }
    dt_pg_free(pair);
    dt_pg_free(pg);
}

static void test_group_against_world(void) {
    if (strcmp(mp_backend(), "tcp") != 0)
        return;
    mp_opts o = {.world = 4, .timeout_ms = 60000};
    MP_RUN(&o, cross_ranks, NULL);
}

static void test_group_timeout(void) {
    mp_opts o = {.world = 4, .timeout_ms = 60000};
    MP_RUN(&o, timeout_ranks, NULL);
}

int main(void) {
    RUN(test_group_suite);
    RUN(test_group_timeout);
    RUN(test_group_against_world);
    RUN(test_killed_rank_in_group);
    return check_summary();
}
