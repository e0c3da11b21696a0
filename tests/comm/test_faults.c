// test_faults.c: failures must be loud and fast. A rank SIGKILLed in the middle of a
// large all_reduce, mismatched collectives, timeouts, aborts, a rank that leaves, and
// the init errors (port in use, unreachable master, wrong token, world size mismatch,
// rank out of range, missing variables, a rank claimed twice): each gets its own
// message, on every rank concerned, in seconds.
#include "../lib/mp.h"
#include "comm/backend.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define BIG ((size_t)16 << 20) // floats: 64 MiB, long enough to be killed inside

typedef struct shared {
    _Atomic uint64_t kill_ns; // when the victim killed itself
    _Atomic int      started;
    _Atomic int      waiting_pid; // test_sent_then_aborted: rank 0, about to wait
} shared;

static void sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static bool contains(const char *hay, const char *needle) {
    return strstr(hay, needle) != NULL;
}

// ------------------------------------------------------------------- peer death

typedef struct kill_cfg {
    int victim;
} kill_cfg;

static void kill_ranks(int rank, int world, void *arg) {
    const kill_cfg *cfg = arg;
    shared         *sh  = mp_shared();
    dt_pg          *pg  = mp_pg_init(60000);
    CHECK(pg != NULL);
    if (!pg)
        return;
    float *buf = dt_alloc(BIG * sizeof(float));
    for (size_t i = 0; i < BIG; i++)
        buf[i] = (float)rank;
    if (rank == cfg->victim) {
        dt_work *w;
        CHECK_OK(dt_pg_all_reduce_async(pg, buf, buf, BIG, DT_FLOAT32, DT_REDUCE_SUM, &w));
        sleep_ms(30);
        atomic_store(&sh->kill_ns, dt_now_ns());
        raise(SIGKILL);
    }
    dt_status st = DT_OK;
    for (int i = 0; i < 50 && st == DT_OK; i++)
        st = dt_pg_all_reduce(pg, buf, buf, BIG, DT_FLOAT32, DT_REDUCE_SUM);
    uint64_t now  = dt_now_ns();
    uint64_t kill = atomic_load(&sh->kill_ns);
    char     want[64], msg[1024];
    snprintf(want, sizeof want, "rank %d closed the connection", cfg->victim);
    snprintf(msg, sizeof msg, "%s", dt_last_error());
    CHECK_EQ(st, DT_ERR_PEER);
    CHECK(contains(msg, want) && contains(msg, "all_reduce #"));
    if (!contains(msg, want))
        fprintf(stderr, "     rank %d: \"%s\"\n", rank, msg);
    double secs = kill ? (double)(now - kill) / 1e9 : -1;
    CHECK(kill != 0 && secs < 5.0);
    if (secs >= 5.0)
        fprintf(stderr, "     rank %d noticed the death after %.2f s\n", rank, secs);
    // Poisoned: later calls fail at once with the same error.
    uint64_t t0 = dt_now_ns();
    CHECK_EQ(dt_pg_barrier(pg), st);
    CHECK(strcmp(dt_last_error(), msg) == 0);
    float one = 1;
    CHECK_EQ(dt_pg_all_reduce(pg, &one, &one, 1, DT_FLOAT32, DT_REDUCE_SUM), st);
    dt_work *w = NULL;
    CHECK_OK(dt_pg_broadcast_async(pg, &one, 1, DT_FLOAT32, 0, &w));
    CHECK_EQ(dt_work_wait(w), st);
    dt_work_free(w);
    CHECK((dt_now_ns() - t0) / 1000000 < 500);
    dt_free(buf);
    dt_pg_free(pg);
    (void)world;
}

static void test_killed_rank(void) {
    int cases[][2] = {{2, 1}, {3, 1}, {4, 2}, {4, 0}, {5, 3}}; // {world, victim}
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        kill_cfg cfg = {.victim = cases[i][1]};
        mp_opts  o   = {.world = cases[i][0], .may_die = 1u << cases[i][1], .timeout_ms = 60000};
        MP_RUN(&o, kill_ranks, &cfg);
    }
}

// ------------------------------------------------------------------- mismatches

static void mismatch_ranks(int rank, int world, void *arg) {
    (void)arg;
    dt_pg *pg = mp_pg_init(20000);
    CHECK(pg != NULL);
    if (!pg)
        return;
    float buf[300] = {0};
    // The last rank asks for 200 elements, the others for 100.
    size_t n = rank == world - 1 ? 200 : 100;
    // A rank that left the barrier first may find the mismatch and poison the group
    // while a slower rank still waits for its last barrier message from a third rank
    // (a relayed abort and that message travel on different sockets): the barrier then
    // fails with the same report, as every pending operation of a poisoned group does.
    dt_status st = dt_pg_barrier(pg);
    if (st == DT_OK)
        st = dt_pg_all_reduce(pg, buf, buf, n, DT_FLOAT32, DT_REDUCE_SUM);
    CHECK(st == DT_ERR_MISMATCH);
    const char *m = dt_last_error();
    CHECK(contains(m, "count 100") && contains(m, "count 200") && contains(m, "all_reduce #2"));
    if (!contains(m, "count 200"))
        fprintf(stderr, "     rank %d: \"%s\"\n", rank, m);
    dt_pg_free(pg);
}

static void test_mismatched_counts(void) {
    for (int w = 2; w <= 4; w++) {
        mp_opts o = {.world = w, .timeout_ms = 30000};
        MP_RUN(&o, mismatch_ranks, NULL);
    }
}

// Different collectives: rank 0 all_reduce, rank 1 broadcast (which only sends, so it
// may finish); rank 1 then learns of the mismatch at its next call.
static void mismatch_kind_ranks(int rank, int world, void *arg) {
    (void)arg, (void)world;
    dt_pg *pg = mp_pg_init(20000);
    CHECK(pg != NULL);
    if (!pg)
        return;
    float buf[10] = {0};
    if (rank == 0) {
        CHECK_ERR(dt_pg_all_reduce(pg, buf, buf, 10, DT_FLOAT32, DT_REDUCE_SUM), DT_ERR_MISMATCH,
                  "broadcast #1");
    } else {
        dt_pg_broadcast(pg, buf, 10, DT_FLOAT32, 1);
        CHECK_ERR(dt_pg_barrier(pg), DT_ERR_MISMATCH, "all_reduce #1");
    }
    dt_pg_free(pg);
}

static void test_mismatched_kinds(void) {
    mp_opts o = {.world = 2, .timeout_ms = 30000};
    MP_RUN(&o, mismatch_kind_ranks, NULL);
}

// ------------------------------------------------------------- timeouts and aborts

static void timeout_ranks(int rank, int world, void *arg) {
    (void)arg, (void)world;
    dt_pg *pg = mp_pg_init(rank == 0 ? 600 : 20000);
    CHECK(pg != NULL);
    if (!pg)
        return;
    float x = 1;
    if (rank == 0) {
        uint64_t t0 = dt_now_ns();
        CHECK_ERR(dt_pg_all_reduce(pg, &x, &x, 1, DT_FLOAT32, DT_REDUCE_SUM), DT_ERR_TIMEOUT,
                  "rank 1");
        double secs = (double)(dt_now_ns() - t0) / 1e9;
        CHECK(secs >= 0.5 && secs < 3.0);
    } else {
        sleep_ms(1500);
        // Rank 0's data for all_reduce #1 may already be here, so that call can still
        // succeed; then the next one fails with rank 0's reason.
        uint64_t t0 = dt_now_ns();
        if (dt_pg_all_reduce(pg, &x, &x, 1, DT_FLOAT32, DT_REDUCE_SUM) == DT_OK)
            CHECK_ERR(dt_pg_barrier(pg), DT_ERR_TIMEOUT, "reported by rank 0");
        else
            CHECK_ERR(dt_last_status(), DT_ERR_TIMEOUT, "reported by rank 0");
        CHECK((dt_now_ns() - t0) / 1000000 < 2000);
    }
    dt_pg_free(pg);
}

static void test_timeout(void) {
    mp_opts o = {.world = 2, .timeout_ms = 30000};
    MP_RUN(&o, timeout_ranks, NULL);
}

static void *abort_later(void *arg) {
    sleep_ms(300);
    dt_pg_abort(arg, "stopped by the test");
    return NULL;
}

static void abort_ranks(int rank, int world, void *arg) {
    (void)arg, (void)world;
    dt_pg *pg = mp_pg_init(20000);
    CHECK(pg != NULL);
    if (!pg)
        return;
    float x = 1;
    if (rank == 0) {
        pthread_t t;
        pthread_create(&t, NULL, abort_later, pg);
        uint64_t t0 = dt_now_ns();
        CHECK_ERR(dt_pg_all_reduce(pg, &x, &x, 1, DT_FLOAT32, DT_REDUCE_SUM), DT_ERR_STATE,
                  "stopped by the test");
        CHECK((dt_now_ns() - t0) / 1000000 < 2000);
        pthread_join(t, NULL);
    } else {
        sleep_ms(1000);
        if (dt_pg_all_reduce(pg, &x, &x, 1, DT_FLOAT32, DT_REDUCE_SUM) == DT_OK)
            CHECK_ERR(dt_pg_barrier(pg), DT_ERR_PEER, "stopped by the test");
        else
            CHECK_ERR(dt_last_status(), DT_ERR_PEER, "stopped by the test");
    }
    dt_pg_free(pg);
}

static void test_abort(void) {
    mp_opts o = {.world = 2, .timeout_ms = 30000};
    MP_RUN(&o, abort_ranks, NULL);
}

// A peer that sends a message and then aborts did send it: the receive completes with
// the data, and the abort is what the next call reports. Rank 0 is stopped (SIGSTOP)
// while it waits, so the data, the abort and the hang-up all reach it at once.
static void *cont_later(void *arg) {
    sleep_ms(200);
    kill(*(int *)arg, SIGCONT);
    return NULL;
}

static void sent_then_aborted_ranks(int rank, int world, void *arg) {
    (void)arg, (void)world;
    shared *sh = mp_shared();
    dt_pg  *pg = mp_pg_init(20000);
    CHECK(pg != NULL);
    if (!pg)
        return;
    float buf[1000];
    if (rank == 0) {
        atomic_store(&sh->waiting_pid, (int)getpid());
        CHECK_OK(dt_pg_recv(pg, buf, 1000, DT_FLOAT32, 1, 5));
        bool same = true;
        for (int i = 0; i < 1000; i++)
            same &= buf[i] == (float)(i * 3);
        CHECK(same);
        CHECK_ERR(dt_pg_barrier(pg), DT_ERR_PEER, "sent, then aborted (reported by rank 1)");
    } else {
        int      pid0;
        uint64_t until = dt_deadline_ns(20000);
        while (!(pid0 = atomic_load(&sh->waiting_pid)) && dt_now_ns() < until)
            sleep_ms(1);
        if (!CHECK(pid0 > 0)) {
            dt_pg_free(pg);
            return;
        }
        sleep_ms(100); // rank 0 is asleep in its receive by now
        kill(pid0, SIGSTOP);
        for (int i = 0; i < 1000; i++)
            buf[i] = (float)(i * 3);
        CHECK_OK(dt_pg_send(pg, buf, 1000, DT_FLOAT32, 0, 5));
        // Rank 0 also serves the store, which leaving may use: resume it from a thread.
        pthread_t t;
        pthread_create(&t, NULL, cont_later, &pid0);
        dt_pg_abort(pg, "sent, then aborted");
        dt_pg_free(pg);
        pg = NULL;
        pthread_join(t, NULL);
    }
    dt_pg_free(pg);
}

static void test_sent_then_aborted(void) {
    atomic_store(&((shared *)mp_shared())->waiting_pid, 0);
    mp_opts o = {.world = 2, .timeout_ms = 30000};
    MP_RUN(&o, sent_then_aborted_ranks, NULL);
}

// A rank that leaves (dt_pg_free) while another still calls a collective.
static void leave_ranks(int rank, int world, void *arg) {
    (void)arg, (void)world;
    dt_pg *pg = mp_pg_init(20000);
    CHECK(pg != NULL);
    if (!pg)
        return;
    CHECK_OK(dt_pg_barrier(pg));
    if (rank == 1) {
        dt_pg_free(pg);
        return;
    }
    sleep_ms(200);
    float x = 1;
    CHECK_ERR(dt_pg_all_reduce(pg, &x, &x, 1, DT_FLOAT32, DT_REDUCE_SUM), DT_ERR_PEER,
              "rank 1 left the group");
    dt_pg_free(pg);
}

static void test_rank_leaves(void) {
    mp_opts o = {.world = 3, .timeout_ms = 30000};
    MP_RUN(&o, leave_ranks, NULL);
}

// Ranks leaving one after another after their last collective is the normal case and
// must not be reported as a failure.
static void clean_exit_ranks(int rank, int world, void *arg) {
    (void)arg;
    dt_pg *pg = mp_pg_init(20000);
    CHECK(pg != NULL);
    if (!pg)
        return;
    float buf[1000];
    for (int k = 0; k < 5; k++) {
        for (int i = 0; i < 1000; i++)
            buf[i] = (float)rank;
        CHECK_OK(dt_pg_all_reduce(pg, buf, buf, 1000, DT_FLOAT32, DT_REDUCE_SUM));
        CHECK_NEAR(buf[7], world * (world - 1) / 2.0, 0);
    }
    sleep_ms(rank * 50);
    dt_pg_free(pg);
}

static void test_clean_exit(void) {
    mp_opts o = {.world = 4, .timeout_ms = 30000};
    MP_RUN(&o, clean_exit_ranks, NULL);
}

// ------------------------------------------------------------------- init errors

static void port_in_use_ranks(int rank, int world, void *arg) {
    (void)world;
    int  port = *(int *)arg;
    char b[16];
    snprintf(b, sizeof b, "%d", port);
    setenv("MASTER_PORT", b, 1);
    if (rank == 0) {
        dt_pg *pg = mp_pg_init(1000);
        CHECK(pg == NULL);
        char want[64];
        snprintf(want, sizeof want, "port %d is already in use", port);
        CHECK_EQ(dt_last_status(), DT_ERR_IO);
        CHECK(contains(dt_last_error(), want));
        CHECK(contains(dt_last_error(), "pid ")); // names the holder (the parent)
        if (!contains(dt_last_error(), want))
            fprintf(stderr, "     \"%s\"\n", dt_last_error());
    }
}

static void test_port_in_use(void) {
    int                port = mp_free_port();
    int                fd   = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a    = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr       = htonl(INADDR_ANY);
    CHECK(bind(fd, (struct sockaddr *)&a, sizeof a) == 0 && listen(fd, 1) == 0);
    mp_opts o = {.world = 1, .timeout_ms = 30000};
    MP_RUN(&o, port_in_use_ranks, &port);
    close(fd);
}

static void unreachable_ranks(int rank, int world, void *arg) {
    (void)rank, (void)world, (void)arg;
    setenv("RANK", "1", 1);
    setenv("WORLD_SIZE", "2", 1);
    uint64_t t0 = dt_now_ns();
    dt_pg   *pg = mp_pg_init(700);
    CHECK(pg == NULL);
    CHECK_EQ(dt_last_status(), DT_ERR_TIMEOUT);
    char want[64];
    snprintf(want, sizeof want, "could not connect to 127.0.0.1:%s", getenv("MASTER_PORT"));
    CHECK(contains(dt_last_error(), want));
    if (!contains(dt_last_error(), want))
        fprintf(stderr, "     \"%s\"\n", dt_last_error());
    double secs = (double)(dt_now_ns() - t0) / 1e9;
    CHECK(secs >= 0.6 && secs < 3);
}

static void test_unreachable_master(void) {
    mp_opts o = {.world = 1, .timeout_ms = 30000};
    MP_RUN(&o, unreachable_ranks, NULL);
}

static void token_ranks(int rank, int world, void *arg) {
    (void)world, (void)arg;
    if (rank == 1)
        setenv("DT_JOB_TOKEN", "some-other-job", 1);
    dt_pg *pg = mp_pg_init(1500);
    CHECK(pg == NULL);
    if (rank == 1) {
        CHECK_EQ(dt_last_status(), DT_ERR_MISMATCH);
        CHECK(contains(dt_last_error(), "job token mismatch"));
    } else {
        CHECK_EQ(dt_last_status(), DT_ERR_TIMEOUT);
        CHECK(contains(dt_last_error(), "waiting for rank 1 to join"));
    }
    if (!pg && rank == 1 && !contains(dt_last_error(), "job token mismatch"))
        fprintf(stderr, "     \"%s\"\n", dt_last_error());
    dt_pg_free(pg);
}

static void test_wrong_token(void) {
    mp_opts o = {.world = 2, .timeout_ms = 30000};
    MP_RUN(&o, token_ranks, NULL);
}

static void world_ranks(int rank, int world, void *arg) {
    (void)world, (void)arg;
    if (rank == 1) {
        sleep_ms(200); // rank 0 fixes the world size first
        setenv("WORLD_SIZE", "3", 1);
    }
    uint64_t t0 = dt_now_ns();
    dt_pg   *pg = mp_pg_init(10000);
    CHECK(pg == NULL);
    CHECK_EQ(dt_last_status(), DT_ERR_MISMATCH);
    CHECK(contains(dt_last_error(), "world size mismatch: rank 1 has WORLD_SIZE=3, but the "
                                    "ranks before it have WORLD_SIZE=2"));
    if (!contains(dt_last_error(), "world size mismatch"))
        fprintf(stderr, "     rank %d: \"%s\"\n", rank, dt_last_error());
    CHECK((dt_now_ns() - t0) / 1000000 < 3000); // rank 0 does not wait for its timeout
    dt_pg_free(pg);
}

static void test_world_size_mismatch(void) {
    mp_opts o = {.world = 2, .timeout_ms = 30000};
    MP_RUN(&o, world_ranks, NULL);
}

static void bad_env_ranks(int rank, int world, void *arg) {
    (void)rank, (void)world, (void)arg;
    setenv("RANK", "5", 1);
    setenv("WORLD_SIZE", "2", 1);
    CHECK(mp_pg_init(1000) == NULL);
    CHECK_EQ(dt_last_status(), DT_ERR_ARG);
    CHECK(contains(dt_last_error(), "RANK=5 is out of range: expected 0 <= rank < WORLD_SIZE=2"));
    setenv("RANK", "0", 1);
    unsetenv("MASTER_PORT");
    CHECK(mp_pg_init(1000) == NULL);
    CHECK(contains(dt_last_error(), "MASTER_PORT is not set"));
    setenv("MASTER_PORT", "not-a-port", 1);
    CHECK(mp_pg_init(1000) == NULL);
    CHECK(contains(dt_last_error(), "MASTER_PORT"));
    CHECK(contains(dt_last_error(), "not-a-port"));
    setenv("MASTER_PORT", "29999", 1);
    unsetenv("WORLD_SIZE");
    CHECK(mp_pg_init(1000) == NULL);
    CHECK(contains(dt_last_error(), "WORLD_SIZE is not set"));
    setenv("WORLD_SIZE", "2", 1);
    unsetenv("RANK");
    CHECK(mp_pg_init(1000) == NULL);
    CHECK(contains(dt_last_error(), "RANK is not set"));
    setenv("RANK", "1", 1);
    unsetenv("MASTER_ADDR");
    CHECK(mp_pg_init(1000) == NULL);
    CHECK(contains(dt_last_error(), "MASTER_ADDR is not set"));
    setenv("MASTER_ADDR", "127.0.0.1", 1);
    dt_pg_opts po = dt_pg_opts_default();
    po.backend    = "carrier-pigeon";
    setenv("RANK", "0", 1);
    setenv("WORLD_SIZE", "1", 1);
    CHECK(dt_pg_new_from_env(&(dt_pg *){NULL}, &po) != DT_OK);
    CHECK_EQ(dt_last_status(), DT_ERR_ARG);
    CHECK(contains(dt_last_error(), "\"carrier-pigeon\""));
    CHECK(dt_pg_new(&(dt_pg *){NULL}, "udp://x", 0, 1, NULL) != DT_OK);
    CHECK(contains(dt_last_error(), "\"udp://x\""));
}

static void test_bad_environment(void) {
    mp_opts o = {.world = 1, .timeout_ms = 30000};
    MP_RUN(&o, bad_env_ranks, NULL);
}

static void dup_ranks(int rank, int world, void *arg) {
    (void)world, (void)arg;
    if (rank == 2) {
        sleep_ms(300);
        setenv("RANK", "1", 1);
    }
    dt_pg *pg = mp_pg_init(1500);
    CHECK(pg == NULL);
    if (rank == 2) {
        CHECK_EQ(dt_last_status(), DT_ERR_MISMATCH);
        CHECK(contains(dt_last_error(), "rank 1 is already taken by pid"));
    }
    dt_pg_free(pg);
}

static void test_duplicate_rank(void) {
    mp_opts o = {.world = 3, .timeout_ms = 30000};
    MP_RUN(&o, dup_ranks, NULL);
}

// "auto" picks shm when every rank is on this host, hybrid for two hosts of two ranks
// (when shm is built); local ranks come from the host identities when LOCAL_RANK is
// not set.
static void auto_ranks(int rank, int world, void *arg) {
    bool two_hosts = *(bool *)arg;
    unsetenv("LOCAL_RANK");
    unsetenv("LOCAL_WORLD_SIZE");
    if (two_hosts)
        setenv("DT_HOST_ID", rank < 2 ? "host-a" : "host-b", 1);
    dt_pg_opts o = dt_pg_opts_default();
    o.timeout_ms = 20000;
    dt_pg *pg    = NULL;
    dt_pg_new_from_env(&pg, &o);
    CHECK(pg != NULL);
    if (!pg)
        return;
    // Two hosts of two ranks: shm inside each, tcp between (the hybrid backend).
    const char *want = !dt_backend_shm.built ? "tcp" : two_hosts ? "hybrid" : "shm";
    CHECK(strcmp(dt_pg_backend(pg), want) == 0);
    CHECK_EQ(dt_pg_local_rank(pg), two_hosts ? rank % 2 : rank);
    CHECK_EQ(dt_pg_local_size(pg), two_hosts ? 2 : world);
    float x = 1;
    CHECK_OK(dt_pg_all_reduce(pg, &x, &x, 1, DT_FLOAT32, DT_REDUCE_SUM));
    CHECK_NEAR(x, world, 0);
    dt_pg_free(pg);
}

static void test_auto_backend(void) {
    for (int two = 0; two < 2; two++) {
        bool    two_hosts = two;
        mp_opts o         = {.world = 4, .timeout_ms = 30000};
        MP_RUN(&o, auto_ranks, &two_hosts);
    }
}

int main(void) {
    RUN(test_auto_backend);
    RUN(test_killed_rank);
    RUN(test_mismatched_counts);
    RUN(test_mismatched_kinds);
    RUN(test_timeout);
    RUN(test_abort);
    RUN(test_sent_then_aborted);
    RUN(test_rank_leaves);
    RUN(test_clean_exit);
    RUN(test_port_in_use);
    RUN(test_unreachable_master);
    RUN(test_wrong_token);
    RUN(test_world_size_mismatch);
    RUN(test_bad_environment);
    RUN(test_duplicate_rank);
    return check_summary();
}
