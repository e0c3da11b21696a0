// test_wait_any.c: dt_pg_wait_any (comm.h), a receive from whichever peer sends first,
// on tcp, shm and hybrid (2 fake hosts), in real processes:
//  - rank 0 waits on peers {1, 2}; rank 2 sends at once and rank 1 400 ms later: the
//    first answer is 2 (the list's first peer is not ready), and it comes well before
//    rank 1's send; then 1. Each message is then received whole with dt_pg_recv.
//  - the same through a sub-group {0, 2} (its rank 1 is world rank 2): ranks translate.
//  - nothing sent within the group's timeout (600 ms): DT_ERR_TIMEOUT naming the peers,
//    after at least the timeout and within it plus 3 s.
//  - bad lists (this rank, a rank outside the group, none) are DT_ERR_ARG.
//  - a peer killed while rank 0 waits: the wait or the receive after it fails, naming it,
//    within the liveness bound (5 s) plus slack.
#include "../lib/mp.h"

#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define N       (1u << 18) // floats: 1 MiB, larger than a shm channel
#define LATE_S  0.4
#define TIME_MS 6000

static const char *backend;

static dt_pg *join(int rank, int64_t timeout_ms) {
    if (strcmp(backend, "hybrid") == 0)
        mp_fake_host(rank / 2); // 2 fake hosts of 2 ranks
    return mp_pg_open(backend, timeout_ms);
}

static void sleep_s(double s) {
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    while (nanosleep(&ts, &ts) != 0) {
    }
}

static double secs_since(uint64_t t0) {
    return (double)(dt_now_ns() - t0) / 1e9;
}

static void fill(float *x, int tag) {
    for (size_t i = 0; i < N; i++)
        x[i] = (float)i + 0.5f * (float)tag;
}

static bool same(const float *x, int tag) {
    for (size_t i = 0; i < N; i++)
        if (x[i] != (float)i + 0.5f * (float)tag)
            return false;
    return true;
}

// Rank 0 of `g` takes one message from each of its ranks `a` (late) and `b` (at once),
// in arrival order; the others send theirs.
static void arrival_order(dt_pg *g, int a, int b, float *buf) {
    int rank = dt_pg_rank(g);
    CHECK_OK(dt_pg_barrier(g));
    if (rank == a || rank == b) {
        if (rank == a)
            sleep_s(LATE_S);
        fill(buf, rank);
        CHECK_OK(dt_pg_send(g, buf, N, DT_FLOAT32, 0, 7));
    } else if (rank == 0) {
        uint64_t t0      = dt_now_ns();
        int      list[2] = {a, b}, from = -1;
        CHECK_OK(dt_pg_wait_any(g, list, 2, &from));
        double s = secs_since(t0);
        if (!CHECK(from == b && s < LATE_S * 0.75))
            fprintf(stderr, "     first: rank %d after %.3f s (expected %d)\n", from, s, b);
        memset(buf, 0, N * sizeof *buf);
        CHECK_OK(dt_pg_recv(g, buf, N, DT_FLOAT32, from, 7));
        CHECK(same(buf, from));
        CHECK_OK(dt_pg_wait_any(g, list, 2, &from));
        CHECK(from == a);
        CHECK_OK(dt_pg_recv(g, buf, N, DT_FLOAT32, from, 7));
        CHECK(same(buf, a));
    }
    CHECK_OK(dt_pg_barrier(g));
}

static void ranks_order(int rank, int world, void *arg) {
    (void)world, (void)arg;
    dt_pg *pg = join(rank, TIME_MS);
    if (!CHECK(pg != NULL))
        return;
    float *buf = dt_alloc(N * sizeof *buf);
    if (!CHECK(buf != NULL))
        return;
    arrival_order(pg, 1, 2, buf);
    static const int pair[2] = {0, 2};
    dt_pg           *g       = NULL;
    CHECK_OK(dt_pg_new_group(&g, pg, pair, 2, NULL));
    if (g) { // its rank 1 (world rank 2) sends; 1 is late and never sends: only b counts
        int rank_g = dt_pg_rank(g), from = -1, one[1] = {1};
        CHECK_OK(dt_pg_barrier(g));
        if (rank_g == 1) {
            fill(buf, 9);
            CHECK_OK(dt_pg_send(g, buf, N, DT_FLOAT32, 0, 8));
        } else {
            CHECK_OK(dt_pg_wait_any(g, one, 1, &from));
            CHECK(from == 1);
            CHECK_OK(dt_pg_recv(g, buf, N, DT_FLOAT32, 1, 8));
            CHECK(same(buf, 9));
        }
        CHECK_OK(dt_pg_barrier(g));
    }
    if (rank == 0) {
        int self[1] = {0}, out[1] = {world}, from = 5;
        CHECK_ERR(dt_pg_wait_any(pg, self, 1, &from), DT_ERR_ARG, "other than 0");
        CHECK(from == -1);
        CHECK_ERR(dt_pg_wait_any(pg, out, 1, &from), DT_ERR_ARG, "expected peer ranks");
        CHECK_ERR(dt_pg_wait_any(pg, out, 0, &from), DT_ERR_ARG, "at least one peer");
    }
    CHECK_OK(dt_pg_barrier(pg));
    dt_pg_free(g);
    dt_free(buf);
    dt_pg_free(pg);
}

static void test_order(void) {
    const char *backends[] = {"tcp", "shm", "hybrid"};
    for (int b = 0; b < 3; b++) {
        backend   = backends[b];
        mp_opts o = {.world = 4};
        fprintf(stderr, "   backend %s\n", backend);
        MP_RUN(&o, ranks_order, NULL);
    }
}

// Nothing comes: the group's timeout, naming the peers.
static void ranks_timeout(int rank, int world, void *arg) {
    (void)world, (void)arg;
    dt_pg *pg = join(rank, 600);
    if (!CHECK(pg != NULL))
        return;
    if (rank == 0) {
        int      list[2] = {1, 2}, from = -1;
        uint64_t t0 = dt_now_ns();
        CHECK_ERR(dt_pg_wait_any(pg, list, 2, &from), DT_ERR_TIMEOUT, "ranks 1, 2");
        double s = secs_since(t0);
        if (!CHECK(s >= 0.6 && s < 3.6))
            fprintf(stderr, "     timed out after %.2f s\n", s);
    } else
        sleep_s(1.5); // stays in the group (no bye) past rank 0's deadline
    dt_pg_free(pg);
}

// A peer killed while rank 0 waits on it.
static void ranks_dead(int rank, int world, void *arg) {
    (void)world, (void)arg;
    dt_pg *pg = join(rank, 30000);
    if (!CHECK(pg != NULL))
        return;
    CHECK_OK(dt_pg_barrier(pg));
    if (rank == 1) {
        sleep_s(0.3);
        raise(SIGKILL);
    }
    if (rank == 0) {
        int       list[1] = {1}, from = -1;
        float     x  = 0;
        uint64_t  t0 = dt_now_ns();
        dt_status st = dt_pg_wait_any(pg, list, 1, &from);
        if (st == DT_OK)
            st = dt_pg_recv(pg, &x, 1, DT_FLOAT32, from, 1);
        double s = secs_since(t0);
        CHECK(st != DT_OK && strstr(dt_last_error(), "rank 1"));
        if (!CHECK(s < 5.0 + 4.0))
            fprintf(stderr, "     the dead peer named after %.2f s: %s\n", s, dt_last_error());
    }
    dt_pg_free(pg);
}

static void test_timeout_and_dead(void) {
    const char *backends[] = {"tcp", "shm"};
    for (int b = 0; b < 2; b++) {
        backend = backends[b];
        fprintf(stderr, "   backend %s\n", backend);
        mp_opts o = {.world = 3};
        MP_RUN(&o, ranks_timeout, NULL);
        mp_opts d = {.world = 2, .may_die = 1u << 1};
        MP_RUN(&d, ranks_dead, NULL);
    }
}

int main(void) {
    RUN(test_order);
    RUN(test_timeout_and_dead);
    return check_summary();
}
