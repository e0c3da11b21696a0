// test_hybrid.c: the hybrid backend (shm inside a host, tcp between hosts) on hosts
// faked with DT_HOST_ID: "auto" picks it for 2 hosts x 2 ranks; the collective suite
// (serial references, results bitwise equal on every rank) with the hierarchical
// all_reduce and broadcast taken from 16 bytes up, on 2 x 2 and on 2 x 3 ranks (blocks
// of uneven size); sub-groups of a hybrid world; a rank killed mid all_reduce stops every rank;
// auto picking tcp and "hybrid" refused when the hosts run different numbers of ranks.
#include "../lib/coll_suite.h"
#include "../lib/group_suite.h"
#include "../lib/mp.h"

#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct cfg {
    int      per_host; // ranks per fake host; 0: 3 ranks on host a, 1 on b
    uint64_t seed;
} cfg;

static dt_pg *join(int rank, const cfg *c, const char *backend) {
    mp_fake_host(c->per_host ? rank / c->per_host : rank < 3 ? 0 : 1);
    return mp_pg_open(backend, 30000);
}

static void suite_ranks(int rank, int world, void *arg) {
    const cfg *c  = arg;
    dt_pg     *pg = join(rank, c, NULL);
    CHECK(pg != NULL);
    if (!pg) {
        fprintf(stderr, "rank %d: %s\n", rank, dt_last_error());
        return;
    }
    CHECK(strcmp(dt_pg_backend(pg), "hybrid") == 0);
    CHECK_EQ(dt_pg_local_size(pg), c->per_host);
    coll_suite_opts so = {.seed = c->seed};
    COLL_SUITE_RUN(pg, &so);
    if (world == 4)
        GROUP_SUITE_RUN(pg, c->seed ^ 7);
    dt_pg_free(pg);
}

static void test_suite(void) {
    setenv("DT_HYBRID_MIN_BYTES", "16", 1);
    setenv("DT_HYBRID_BCAST_MIN_BYTES", "16", 1);
    for (int per = 2; per <= 3; per++) {
        cfg     c = {.per_host = per, .seed = dt_now_ns()};
        mp_opts o = {.world = 2 * per, .timeout_ms = 120000};
        fprintf(stderr, "  2 hosts x %d ranks\n", per);
        MP_RUN(&o, suite_ranks, &c);
    }
    unsetenv("DT_HYBRID_MIN_BYTES");
    unsetenv("DT_HYBRID_BCAST_MIN_BYTES");
}

static void uneven_ranks(int rank, int world, void *arg) {
    (void)world;
    cfg    c  = {.per_host = 0};
    dt_pg *pg = join(rank, &c, arg);
    if (arg) {
        CHECK(pg == NULL);
        // Every rank refuses; rank 0 (which runs the store) always itself, the others
        // may first see the store close as rank 0 leaves.
        bool ok = (dt_last_status() == DT_ERR_UNSUPPORTED &&
                   strstr(dt_last_error(), "every host must run as many")) ||
                  (rank != 0 && strstr(dt_last_error(), "closed the connection"));
        CHECK(ok);
        if (!ok)
            fprintf(stderr, "     rank %d: %s\n", rank, dt_last_error());
        return;
    }
    CHECK(pg != NULL);
    if (!pg)
        return;
    CHECK(strcmp(dt_pg_backend(pg), "tcp") == 0);
    float x = 1;
    CHECK_OK(dt_pg_all_reduce(pg, &x, &x, 1, DT_FLOAT32, DT_REDUCE_SUM));
    CHECK_EQ(x, 4.0f);
    dt_pg_free(pg);
}

static void test_uneven_hosts(void) {
    mp_opts o = {.world = 4, .timeout_ms = 60000};
    MP_RUN(&o, uneven_ranks, NULL);
    MP_RUN(&o, uneven_ranks, "hybrid");
}

// A rank SIGKILLed while every rank runs hierarchical all_reduces: every rank stops
// within the liveness bound, naming the dead rank.
static void kill_ranks(int rank, int world, void *arg) {
    (void)world, (void)arg;
    _Atomic uint64_t *kill_ns = mp_shared();
    cfg               c       = {.per_host = 2};
    dt_pg            *pg      = join(rank, &c, NULL);
    CHECK(pg != NULL);
    if (!pg)
        return;
    enum { N = 1 << 16 };
    static float buf[N];
    for (int i = 0; i < N; i++)
        buf[i] = 1;
    dt_status st = dt_pg_all_reduce(pg, buf, buf, N, DT_FLOAT32, DT_REDUCE_MAX);
    CHECK_OK(st);
    if (rank == 3) {
        struct timespec ts = {0, 50 * 1000000L};
        nanosleep(&ts, NULL);
        atomic_store(kill_ns, dt_now_ns());
        raise(SIGKILL);
    }
    uint64_t t0 = dt_now_ns();
    while (st == DT_OK && dt_now_ns() - t0 < 30ull * 1000000000ull)
        st = dt_pg_all_reduce(pg, buf, buf, N, DT_FLOAT32, DT_REDUCE_MAX);
    double secs = (double)(dt_now_ns() - atomic_load(kill_ns)) / 1e9;
    CHECK(st == DT_ERR_PEER && strstr(dt_last_error(), "rank") != NULL);
    CHECK(atomic_load(kill_ns) != 0 && secs < 8.0);
    if (st != DT_ERR_PEER || secs >= 8.0)
        fprintf(stderr, "     rank %d after %.2f s: %s: %s\n", rank, secs, dt_status_str(st),
                dt_last_error());
    dt_pg_free(pg);
}

static void test_killed_rank(void) {
    setenv("DT_LIVENESS_MS", "1500", 1);
    setenv("DT_HEARTBEAT_MS", "200", 1);
    setenv("DT_HYBRID_MIN_BYTES", "1024", 1);
    mp_opts o = {.world = 4, .may_die = 1u << 3, .timeout_ms = 60000};
    MP_RUN(&o, kill_ranks, NULL);
    unsetenv("DT_LIVENESS_MS");
    unsetenv("DT_HEARTBEAT_MS");
    unsetenv("DT_HYBRID_MIN_BYTES");
}

int main(void) {
    RUN(test_suite);
    RUN(test_killed_rank);
    RUN(test_uneven_hosts);
    return check_summary();
}
