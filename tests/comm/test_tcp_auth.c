// test_tcp_auth.c: the tcp backend's peer handshake against a stranger who knows a
// rank's address but not the job token. Three ranks; while rank 2 waits for it in tcp
// init (a hook holds it until the stranger sets a key in the store, so the order holds
// however slow the machine is), a thread of rank 0 calls rank 1's port twice: once with the old
// hello that carried the token's hash (accepted as proof of membership before), once with a fresh
// nonce claiming to be rank 2 and, for its proof, the bytes rank 1 sent it (a reflection). Rank 1
// must close both connections and still take the real rank 2; the group's all_reduce sums the three
// real ranks.
#include "../lib/mp.h"
#include "comm/comm_impl.h"
#include "comm/tcp/wire.h"
#include "core/le.h"

#include <poll.h>
#include <pthread.h>
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

int main(void) {
    mp_opts o = {.world = 3, .timeout_ms = 60000};
    MP_RUN(&o, ranks, NULL);
    return check_summary();
}
