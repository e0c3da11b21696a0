// test_tcp_auth.c: the tcp backend's peer handshake against a stranger who knows a
// rank's address but not the job token.
//
// - test_refused: three ranks; while rank 2 waits for it in tcp init (a hook holds it
//   until the stranger sets a key in the store, so the order holds however slow the
//   machine is), a thread of rank 0 calls rank 1's port twice: once with the old hello
//   that carried the token's hash (accepted as proof of membership before), once with a
//   fresh nonce claiming to be rank 2 and, for its proof, the bytes rank 1 sent it (a
//   reflection). Rank 1 must close both connections and still take the real rank 2; the
//   group's all_reduce sums the three real ranks.
// - test_silent_strangers: two ranks; 10 connections to rank 0's port that never say a
//   word are open before rank 1 connects (the hook again). Rank 1's start-up must not
//   take noticeably longer than the same start without them, measured in the same
//   test: rank 0 once ran the handshakes one at a time with 2 s each (20 s here).
#include "../lib/mp.h"
#include "comm/comm_impl.h"
#include "comm/tcp/wire.h"
#include "core/le.h"

#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static void sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

typedef struct stranger {
    bool old_closed, reflect_closed, got_challenge;
} stranger;

static void hello_bytes(uint8_t *b, uint32_t step, uint32_t rank, uint64_t seq, size_t n) {
    dt_wire_header h = {.kind = DT_WIRE_HELLO, .src_rank = rank, .step = step};
    h.fp.seq         = seq;
    h.fp.count       = 3;
    h.nbytes         = n;
    dt_wire_encode(&h, b);
}

// True when the peer closes the connection within 5 s (after any bytes it sends).
static bool closes(int fd) {
    uint8_t b[256];
    for (;;) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (poll(&p, 1, 5000) <= 0)
            return false;
        ssize_t k = read(fd, b, sizeof b);
        if (k <= 0)
            return true;
    }
}

// A client of the job's store (rank 0 starts it), retried while it comes up.
static dt_store *store_client(void) {
    dt_store_opts o  = {.timeout_ms = 30000};
    dt_store     *st = NULL;
    for (int i = 0; i < 400 && !st; i++) {
        dt_store_new_tcp(&st, "127.0.0.1", atoi(getenv("MASTER_PORT")), false, &o);
        if (!st)
            sleep_ms(50);
    }
    return st;
}

static void *stranger_main(void *arg) {
    stranger *s  = arg;
    dt_store *st = store_client();
    void     *v  = NULL;
    if (!st || dt_store_get(st, "dt/tcp/addr/1", &v, NULL) != DT_OK) {
        if (st)
            dt_store_set(st, "test/stranger_done", "1", 1);
        dt_store_free(st);
        return NULL;
    }
    char *colon = strrchr(v, ':');
    *colon      = '\0';
    int port    = atoi(colon + 1);
    // (a) the old hello: the token's hash where the sequence number goes.
    int fd = -1;
    if (dt_sock_connect(v, port, dt_deadline_ns(5000), "stranger", NULL, &fd) == DT_OK) {
        uint8_t b[DT_WIRE_HEADER_BYTES];
        hello_bytes(b, 0, 2, dt_token_hash(getenv("DT_JOB_TOKEN")), 0);
        s->old_closed = write(fd, b, sizeof b) == sizeof b && closes(fd);
        close(fd);
    }
    // (b) a proper first step, then rank 1's own proof sent back as ours.
    if (dt_sock_connect(v, port, dt_deadline_ns(5000), "stranger", NULL, &fd) == DT_OK) {
        uint8_t b[DT_WIRE_HEADER_BYTES + 64], r[DT_WIRE_HEADER_BYTES + 64];
        hello_bytes(b, 1, 2, 0, 32);
        memset(b + DT_WIRE_HEADER_BYTES, 0x5a, 32);
        if (write(fd, b, DT_WIRE_HEADER_BYTES + 32) == DT_WIRE_HEADER_BYTES + 32 &&
            dt_sock_read_all(fd, r, sizeof r, dt_deadline_ns(5000), "stranger") == DT_OK) {
            s->got_challenge = true;
            hello_bytes(b, 3, 2, 0, 32);
            memcpy(b + DT_WIRE_HEADER_BYTES, r + DT_WIRE_HEADER_BYTES + 32, 32);
            s->reflect_closed =
                write(fd, b, DT_WIRE_HEADER_BYTES + 32) == DT_WIRE_HEADER_BYTES + 32 && closes(fd);
        }
        close(fd);
    }
    dt_free(v);
    dt_store_set(st, "test/stranger_done", "1", 1);
    dt_store_free(st);
    return NULL;
}

// Rank 2's tcp init waits here, after the rendezvous, until the stranger is done.
static void wait_for_stranger(int rank) {
    (void)rank;
    dt_store *st   = store_client();
    void     *done = NULL;
    CHECK(st && dt_store_get(st, "test/stranger_done", &done, NULL) == DT_OK);
    if (!done)
        fprintf(stderr, "     rank 2: %s\n", dt_last_error());
    dt_free(done);
    dt_store_free(st);
}

static void ranks(int rank, int world, void *arg) {
    (void)world, (void)arg;
    pthread_t t;
    stranger  s = {0};
    if (rank == 0)
        pthread_create(&t, NULL, stranger_main, &s);
    if (rank == 2) // late: the stranger calls rank 1 first
        dt_tcp_init_hook = wait_for_stranger;
    dt_pg_opts o = dt_pg_opts_default();
    o.backend    = "tcp";
    o.timeout_ms = 20000;
    dt_pg *pg    = NULL;
    dt_pg_new_from_env(&pg, &o);
    CHECK(pg != NULL);
    if (!pg)
        fprintf(stderr, "     rank %d: %s\n", rank, dt_last_error());
    float x = (float)(rank + 1), y = 0;
    if (pg)
        CHECK_OK(dt_pg_all_reduce(pg, &x, &y, 1, DT_FLOAT32, DT_REDUCE_SUM));
    CHECK_NEAR(y, 6.0, 0);
    if (rank == 0) {
        pthread_join(t, NULL);
        CHECK(s.old_closed);
        CHECK(s.got_challenge);
        CHECK(s.reflect_closed);
    }
    dt_pg_free(pg);
}

static void test_refused(void) {
    mp_opts o = {.world = 3, .timeout_ms = 60000};
    MP_RUN(&o, ranks, NULL);
}

// ------------------------------------------------------------------ silent strangers

#define STRANGERS 10

typedef struct timing {
    _Atomic uint64_t release_ns; // rank 1 leaves the hook: it connects now
    _Atomic uint64_t done_ns[2]; // dt_pg_new returned
} timing;

typedef struct silent {
    int n, fds[STRANGERS];
    int connected; // checked by the main thread after the join (CHECK is not thread-safe)
} silent;

// Opens s->n connections to rank 0's tcp port that send nothing, then lets rank 1 go on.
static void *silent_main(void *arg) {
    silent   *s  = arg;
    dt_store *st = store_client();
    void     *v  = NULL;
    if (st && dt_store_get(st, "dt/tcp/addr/0", &v, NULL) == DT_OK) {
        char *colon = strrchr(v, ':');
        *colon      = '\0';
        for (int i = 0; i < s->n; i++)
            s->connected += dt_sock_connect(v, atoi(colon + 1), dt_deadline_ns(5000), "stranger",
                                            NULL, &s->fds[i]) == DT_OK;
    }
    dt_free(v);
    if (st)
        dt_store_set(st, "test/strangers_ready", "1", 1);
    dt_store_free(st);
    return NULL;
}

// Rank 1's tcp init waits here until the strangers are connected.
static void wait_for_strangers(int rank) {
    (void)rank;
    dt_store *st = store_client();
    void     *ok = NULL;
    CHECK(st && dt_store_get(st, "test/strangers_ready", &ok, NULL) == DT_OK);
    dt_free(ok);
    dt_store_free(st);
    timing *t = mp_shared();
    atomic_store(&t->release_ns, dt_now_ns());
}

static void silent_ranks(int rank, int world, void *arg) {
    (void)world;
    silent    s = {.n = *(const int *)arg};
    pthread_t th;
    for (int i = 0; i < STRANGERS; i++)
        s.fds[i] = -1;
    if (rank == 0)
        pthread_create(&th, NULL, silent_main, &s);
    else
        dt_tcp_init_hook = wait_for_strangers;
    dt_pg_opts o = dt_pg_opts_default();
    o.backend    = "tcp";
    o.timeout_ms = 60000; // the old code's 20 s must show as time, not as a failure
    dt_pg *pg    = NULL;
    CHECK_OK(dt_pg_new_from_env(&pg, &o));
    timing *t = mp_shared();
    atomic_store(&t->done_ns[rank], dt_now_ns());
    if (rank == 0) {
        pthread_join(th, NULL);
        CHECK_EQ(s.connected, s.n);
        for (int i = 0; i < STRANGERS; i++)
            if (s.fds[i] >= 0)
                close(s.fds[i]);
    }
    float x = 1, y = 0;
    if (pg)
        CHECK_OK(dt_pg_all_reduce(pg, &x, &y, 1, DT_FLOAT32, DT_REDUCE_SUM));
    CHECK_NEAR(y, 2.0, 0);
    dt_pg_free(pg);
}

// Seconds from rank 1's release to the later of the two ranks' dt_pg_new return.
static double silent_start(int strangers) {
    mp_opts o = {.world = 2, .timeout_ms = 90000};
    MP_RUN(&o, silent_ranks, &strangers);
    timing  *t   = mp_shared();
    uint64_t rel = atomic_load(&t->release_ns), d0 = atomic_load(&t->done_ns[0]),
             d1 = atomic_load(&t->done_ns[1]);
    if (!rel || !d0 || !d1)
        return -1;
    uint64_t last = d0 > d1 ? d0 : d1;
    return last > rel ? (double)(last - rel) / 1e9 : 0;
}

static void test_silent_strangers(void) {
    double base = silent_start(0), with = silent_start(STRANGERS);
    fprintf(stderr,
            "     start-up after rank 1 connects: %.3f s alone, %.3f s with %d silent "
            "strangers on rank 0's port\n",
            base, with, STRANGERS);
    // The goal is under 0.5 s more: the handshakes run side by side, so the strangers
    // cost 10 accepts (microseconds). 1.5 s leaves room for the scheduling noise of two
    // processes starting on a loaded 2-core machine, and still fails the old serial
    // handshakes by far: one silent stranger cost 2 s there, ten cost 20 s.
    CHECK(base >= 0 && with >= 0);
    CHECK(with - base < 1.5);
}

int main(void) {
    RUN(test_refused);
    RUN(test_silent_strangers);
    return check_summary();
}
