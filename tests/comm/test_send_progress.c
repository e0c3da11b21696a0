// test_send_progress.c: dt_pg_send returns once its data is handed to the transport, and
// the transport then delivers it without further calls by the sender (comm.h, "Point to
// point"). On shm (a message larger than its channel is held by the sender's engine),
// tcp and hybrid (2 fake hosts x 2 ranks), in real processes, rank 1 sends rank 0
// messages several times a shm channel's size, and
//  - then waits in a world barrier that rank 0 reaches only after its receive on the
//    sub-group completed; and the reverse (send on the world, barrier on the sub-group);
//  - then computes for 1.5 s without calling into comm: rank 0's receive must complete
//    well before that ends;
//  - frees the sub-group (then the world) right after a send while rank 0 receives
//    300 ms late: the data arrives whole.
// shm only (a send there never waits for its receiver): a group freed with a send its
// receiver never takes fails loudly (an error logged naming the receiver) when the
// receiver leaves, or at the group's timeout, and stops the process; a receiver killed
// with a send held for it fails the sender's next operation, naming it.
#include "../lib/mp.h"

#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define BIG     (1u << 20) // floats: 4 MiB, 4x a 2-rank shm channel (2 x 512 KiB)
#define TIME_MS 6000       // group timeouts: a lost message fails in seconds, never hangs
#define SLEEP_S 1.5

typedef struct shared {
    _Atomic uint64_t sent_ns; // rank 1: its send returned
    _Atomic uint64_t got_ns;  // rank 0: its receive completed
    _Atomic int      freed;   // rank 1: its dt_pg_free returned
} shared;

static const char *backend; // for the ranks: "shm", "tcp", "hybrid"

static dt_pg *join(int rank, int64_t timeout_ms) {
    if (strcmp(backend, "hybrid") == 0)
        mp_fake_host(rank / 2); // 2 fake hosts of 2 ranks
    return mp_pg_open(backend, timeout_ms);
}

static void fill(float *x, size_t n, int tag) {
    for (size_t i = 0; i < n; i++)
        x[i] = (float)(i % 100003) + 0.25f * (float)tag;
}

static bool same(const float *x, size_t n, int tag) {
    for (size_t i = 0; i < n; i++)
        if (x[i] != (float)(i % 100003) + 0.25f * (float)tag)
            return false;
    return true;
}

static double secs_since(uint64_t t0) {
    return (double)(dt_now_ns() - t0) / 1e9;
}

static void sleep_s(double s) {
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    while (nanosleep(&ts, &ts) != 0) {
    }
}

// The pair {0, 1} as a sub-group of its own (on shm: a segment of its own).
static dt_pg *pair_of(dt_pg *pg, int64_t timeout_ms) {
    static const int two[2] = {0, 1};
    dt_pg_opts       o      = dt_pg_opts_default();
    o.timeout_ms            = timeout_ms;
    dt_pg *g                = NULL;
    CHECK_OK(dt_pg_new_group(&g, pg, two, 2, &o));
    return g;
}

// Rank 1 sends on `on`, then waits in a barrier of `then`, which rank 0 enters only after
// its receive on `on` completed.
static void send_then_other_group(int rank, dt_pg *on, dt_pg *then, float *buf, int tag) {
    uint64_t t0 = dt_now_ns();
    if (rank == 1) {
        fill(buf, BIG, tag);
        CHECK_OK(dt_pg_send(on, buf, BIG, DT_FLOAT32, 0, tag));
    } else if (rank == 0) {
        memset(buf, 0, BIG * sizeof *buf);
        CHECK_OK(dt_pg_recv(on, buf, BIG, DT_FLOAT32, 1, tag));
        CHECK(same(buf, BIG, tag));
    }
    if (then)
        CHECK_OK(dt_pg_barrier(then));
    double s = secs_since(t0);
    if (!CHECK(s < 3.0))
        fprintf(stderr, "     rank %d: send, then a barrier of another group: %.2f s\n", rank, s);
}

static void ranks_progress(int rank, int world, void *arg) {
    (void)world, (void)arg;
    shared *sh = mp_shared();
    dt_pg  *pg = join(rank, TIME_MS);
    if (!CHECK(pg != NULL))
        return;
    dt_pg *g   = pair_of(pg, TIME_MS); // NULL on ranks 2, 3 (hybrid)
    float *buf = dt_alloc(BIG * sizeof *buf);
    CHECK(buf != NULL);
    if (!buf)
        return;

    // Sent on the sub-group, then a barrier of the world; and the other way round.
    send_then_other_group(rank, g ? g : pg, pg, buf, 1);
    send_then_other_group(rank, pg, g, buf, 2);

    // Sent, then 1.5 s without a call into comm: the receive completes meanwhile.
    if (rank == 1) {
        fill(buf, BIG, 3);
        CHECK_OK(dt_pg_send(g, buf, BIG, DT_FLOAT32, 0, 3));
        atomic_store(&sh->sent_ns, dt_now_ns());
        sleep_s(SLEEP_S);
    } else if (rank == 0) {
        memset(buf, 0, BIG * sizeof *buf);
        CHECK_OK(dt_pg_recv(g, buf, BIG, DT_FLOAT32, 1, 3));
        atomic_store(&sh->got_ns, dt_now_ns());
        CHECK(same(buf, BIG, 3));
    }
    uint64_t t0 = dt_now_ns();
    CHECK_OK(dt_pg_barrier(pg));
    if (rank == 0) {
        // Both times are in once the world barrier passed.
        double late = ((double)atomic_load(&sh->got_ns) - (double)atomic_load(&sh->sent_ns)) / 1e9;
        if (!CHECK(late < SLEEP_S / 2))
            fprintf(stderr,
                    "     the receive completed %.2f s after the send returned, while "
                    "the sender computed for %.1f s\n",
                    late, SLEEP_S);
        CHECK(secs_since(t0) > SLEEP_S / 3); // the sender did compute meanwhile
    }

    // Sent, then the group freed at once; the receiver comes 300 ms later.
    if (rank == 1) {
        fill(buf, BIG, 4);
        CHECK_OK(dt_pg_send(g, buf, BIG, DT_FLOAT32, 0, 4));
        memset(buf, 0, BIG * sizeof *buf); // the send's copy is the transport's
        dt_pg_free(g);
        g = NULL;
    } else if (rank == 0) {
        sleep_s(0.3);
        CHECK_OK(dt_pg_recv(g, buf, BIG, DT_FLOAT32, 1, 4));
        CHECK(same(buf, BIG, 4));
    }
    dt_pg_free(g);
    CHECK_OK(dt_pg_barrier(pg));

    // The same on the world: sent, then the world freed at once.
    if (rank == 1) {
        fill(buf, BIG, 5);
        CHECK_OK(dt_pg_send(pg, buf, BIG, DT_FLOAT32, 0, 5));
        memset(buf, 0, BIG * sizeof *buf);
    } else if (rank == 0) {
        sleep_s(0.3);
        CHECK_OK(dt_pg_recv(pg, buf, BIG, DT_FLOAT32, 1, 5));
        CHECK(same(buf, BIG, 5));
    }
    dt_pg_free(pg);
    dt_free(buf);
}

static void test_progress(void) {
    static const char *backends[] = {"shm", "tcp", "hybrid"};
    for (size_t i = 0; i < sizeof backends / sizeof *backends; i++) {
        backend   = backends[i];
        mp_opts o = {.world = strcmp(backend, "hybrid") == 0 ? 4 : 2, .timeout_ms = 60000};
        fprintf(stderr, "  %s\n", backend);
        MP_RUN(&o, ranks_progress, NULL);
    }
}

// ------------------------------------------------------ shm: a send nobody receives

static char logged[1024];

static void sink(dt_log_level level, const char *line, void *user) {
    (void)user;
    if (level >= DT_LOG_ERROR && !logged[0])
        snprintf(logged, sizeof logged, "%s", line);
}

typedef struct lost_case {
    bool        leave;   // rank 0 frees the group at once (else: stays, never receives)
    int64_t     timeout; // the group's
    const char *needle;  // in rank 1's error
} lost_case;

static void ranks_lost(int rank, int world, void *arg) {
    (void)world;
    const lost_case *lc = arg;
    shared          *sh = mp_shared();
    dt_pg           *pg = join(rank, TIME_MS);
    if (!CHECK(pg != NULL))
        return;
    dt_pg *g   = pair_of(pg, lc->timeout);
    float *buf = dt_alloc(BIG * sizeof *buf);
    if (!CHECK(buf != NULL && g != NULL))
        return;
    if (rank == 1) {
        fill(buf, BIG, 5);
        CHECK_OK(dt_pg_send(g, buf, BIG, DT_FLOAT32, 0, 5));
        dt_log_set_sink(sink, NULL);
        uint64_t t0 = dt_now_ns();
        dt_pg_free(g);
        double s = secs_since(t0);
        dt_log_set_sink(NULL, NULL);
        atomic_store(&sh->freed, 1);
        bool named = strstr(logged, "rank 0") && strstr(logged, lc->needle);
        if (!CHECK(named && s < (double)lc->timeout / 1000 + 3))
            fprintf(stderr, "     dt_pg_free after %.2f s logged \"%s\"\n", s, logged);
        if (!lc->leave)
            CHECK(s > (double)lc->timeout / 1000 * 0.8);
    } else {
        uint64_t t0 = dt_now_ns();
        while (!lc->leave && !atomic_load(&sh->freed) && secs_since(t0) < 20)
            sleep_s(0.01);
        dt_pg_free(g);
    }
    // The lost message stops the sender's process, and its peers learn of it.
    dt_status st = dt_pg_barrier(pg);
    if (!CHECK(st != DT_OK))
        fprintf(stderr, "     rank %d: the world barrier passed\n", rank);
    dt_free(buf);
    dt_pg_free(pg);
}

static void test_lost_send(void) {
    backend           = "shm";
    lost_case cases[] = {{.leave = true, .timeout = TIME_MS, .needle = "left the group"},
                         {.leave = false, .timeout = 700, .needle = "timed out"}};
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        mp_opts o = {.world = 2, .timeout_ms = 60000};
        MP_RUN(&o, ranks_lost, &cases[i]);
    }
}

// A receiver killed while a send for it is held: the sender's next operation fails,
// naming it, within the liveness bound.
static void ranks_dead_receiver(int rank, int world, void *arg) {
    (void)world, (void)arg;
    dt_pg *pg = join(rank, 30000);
    if (!CHECK(pg != NULL))
        return;
    dt_pg *g   = pair_of(pg, 30000);
    float *buf = dt_alloc(BIG * sizeof *buf);
    if (!CHECK(buf != NULL && g != NULL))
        return;
    CHECK_OK(dt_pg_barrier(pg));
    if (rank == 0) {
        sleep_s(0.2);
        raise(SIGKILL);
    }
    fill(buf, BIG, 6);
    CHECK_OK(dt_pg_send(g, buf, BIG, DT_FLOAT32, 0, 6));
    sleep_s(0.5);
    uint64_t t0 = dt_now_ns();
    CHECK_ERR(dt_pg_barrier(pg), DT_ERR_PEER, "rank 0");
    CHECK(secs_since(t0) < 5.0);
    dt_pg_free(g);
    dt_free(buf);
    dt_pg_free(pg);
}

static void test_dead_receiver(void) {
    backend   = "shm";
    mp_opts o = {.world = 2, .timeout_ms = 60000, .may_die = 1u << 0};
    MP_RUN(&o, ranks_dead_receiver, NULL);
}

int main(void) {
    RUN(test_progress);
    RUN(test_lost_send);
    RUN(test_dead_receiver);
    return check_summary();
}
