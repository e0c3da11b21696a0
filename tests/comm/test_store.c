// test_store.c: the TCP and file stores: every operation against the obvious model,
// many concurrent clients in separate processes, blocking get woken by another
// process, wait timeouts, token checks, a dead server, malformed bytes from a client,
// and a corrupt store file.
#include "../lib/mp.h"
#include "comm/comm_impl.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static void sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static bool contains(const char *hay, const char *needle) {
    return strstr(hay, needle) != NULL;
}

static dt_store *server(int *port, const char *token, int64_t timeout_ms) {
    dt_store_opts o = {.timeout_ms = timeout_ms, .token = token};
    dt_store     *s = NULL;
    dt_store_new_tcp(&s, NULL, 0, true, &o);
    if (!s)
        fprintf(stderr, "     server: %s\n", dt_last_error());
    *port = dt_store_port(s);
    return s;
}

static dt_store *client(int port, const char *token, int64_t timeout_ms) {
    dt_store_opts o = {.timeout_ms = timeout_ms, .token = token};
    dt_store     *s = NULL;
    dt_store_new_tcp(&s, "127.0.0.1", port, false, &o);
    return s;
}

// The same checks for any store: `s` and `t` are two handles on one store.
static void exercise(dt_store *s, dt_store *t) {
    void  *v = NULL;
    size_t n = 0;
    // set / get, overwrite, binary values with NUL bytes, an empty value
    CHECK_OK(dt_store_set(s, "alpha", "one", 3));
    CHECK_OK(dt_store_get(t, "alpha", &v, &n));
    CHECK(n == 3 && strcmp(v, "one") == 0);
    dt_free(v);
    const char bin[5] = {1, 0, 2, 0, 3};
    CHECK_OK(dt_store_set(t, "alpha", bin, 5));
    CHECK_OK(dt_store_get(s, "alpha", &v, &n));
    CHECK(n == 5 && memcmp(v, bin, 5) == 0);
    dt_free(v);
    CHECK_OK(dt_store_set(s, "empty", NULL, 0));
    CHECK_OK(dt_store_get(t, "empty", &v, &n));
    CHECK(n == 0 && ((char *)v)[0] == 0);
    dt_free(v);
    // a large value
    size_t big = 3u << 20;
    char  *b   = dt_alloc(big);
    for (size_t i = 0; i < big; i++)
        b[i] = (char)(i * 7 + 3);
    CHECK_OK(dt_store_set(s, "big", b, big));
    CHECK_OK(dt_store_get(t, "big", &v, &n));
    CHECK(n == big && memcmp(v, b, big) == 0);
    dt_free(v);
    dt_free(b);
    // check
    bool        all;
    const char *k2[2] = {"alpha", "beta"};
    CHECK_OK(dt_store_check(s, k2, 1, &all));
    CHECK(all);
    CHECK_OK(dt_store_check(s, k2, 2, &all));
    CHECK(!all);
    // add: missing = 0, negative deltas, new value returned
    int64_t c = 0;
    CHECK_OK(dt_store_add(s, "ctr", 5, &c));
    CHECK_EQ(c, 5);
    CHECK_OK(dt_store_add(t, "ctr", -12, &c));
    CHECK_EQ(c, -7);
    CHECK_OK(dt_store_get(s, "ctr", &v, NULL));
    CHECK(strcmp(v, "-7") == 0);
    dt_free(v);
    CHECK_ERR(dt_store_add(s, "alpha", 1, &c), DT_ERR_FORMAT, "not a decimal integer");
    // compare_set
    bool swapped;
    CHECK_OK(dt_store_compare_set(s, "cas", NULL, 0, "first", 5, &swapped));
    CHECK(swapped);
    CHECK_OK(dt_store_compare_set(t, "cas", NULL, 0, "second", 6, &swapped));
    CHECK(!swapped);
    CHECK_OK(dt_store_compare_set(t, "cas", "wrong", 5, "third", 5, &swapped));
    CHECK(!swapped);
    CHECK_OK(dt_store_compare_set(t, "cas", "first", 5, "fourth", 6, &swapped));
    CHECK(swapped);
    CHECK_OK(dt_store_get(s, "cas", &v, NULL));
    CHECK(strcmp(v, "fourth") == 0);
    dt_free(v);
    // delete
    bool deleted;
    CHECK_OK(dt_store_delete(s, "cas", &deleted));
    CHECK(deleted);
    CHECK_OK(dt_store_delete(t, "cas", &deleted));
    CHECK(!deleted);
    const char *kc[1] = {"cas"};
    CHECK_OK(dt_store_check(t, kc, 1, &all));
    CHECK(!all);
    // wait: present keys return at once; missing ones time out naming them
    CHECK_OK(dt_store_wait(s, k2, 1, 100));
    uint64_t t0 = dt_now_ns();
    CHECK_ERR(dt_store_wait(t, k2, 2, 300), DT_ERR_TIMEOUT, "\"beta\"");
    double ms = (double)(dt_now_ns() - t0) / 1e6;
    CHECK(ms >= 290 && ms < 2000);
    CHECK(!contains(dt_last_error(), "\"alpha\""));
    // prefix views
    dt_store *p = NULL;
    dt_store_new_prefix(&p, s, "job7");
    dt_store *pp = NULL;
    dt_store_new_prefix(&pp, p, "inner");
    CHECK_OK(dt_store_set(pp, "k", "x", 1));
    CHECK_OK(dt_store_get(t, "job7/inner/k", &v, NULL));
    CHECK(strcmp(v, "x") == 0);
    dt_free(v);
    const char *kp[1] = {"inner/k"};
    CHECK_OK(dt_store_check(p, kp, 1, &all));
    CHECK(all);
    CHECK_OK(dt_store_add(pp, "n", 2, &c));
    CHECK_OK(dt_store_get(s, "job7/inner/n", &v, NULL));
    CHECK(strcmp(v, "2") == 0);
    dt_free(v);
    dt_store_free(pp);
    dt_store_free(p);
    // argument errors
    CHECK_ERR(dt_store_set(s, "", "x", 1), DT_ERR_ARG, "1..4096 bytes");
    CHECK_ERR(dt_store_set(s, NULL, "x", 1), DT_ERR_ARG, "NULL");
    char longkey[5000];
    memset(longkey, 'k', sizeof longkey - 1);
    longkey[sizeof longkey - 1] = 0;
    CHECK_ERR(dt_store_get(s, longkey, &v, NULL), DT_ERR_ARG, "1..4096 bytes");
}

static void test_tcp_operations(void) {
    int       port;
    dt_store *s = server(&port, "tok", 5000);
    CHECK(s != NULL && port > 0);
    dt_store *t = client(port, "tok", 5000);
    CHECK(t != NULL);
    if (s && t)
        exercise(s, t);
    dt_store_free(t);
    dt_store_free(s);
}

static void test_file_operations(void) {
    char path[] = "/tmp/dtrain-store-XXXXXX";
    int  fd     = mkstemp(path);
    close(fd);
    dt_store_opts o = {.timeout_ms = 5000, .token = "tok"};
    dt_store     *s = NULL;
    dt_store_new_file(&s, path, &o);
    dt_store *t = NULL;
    dt_store_new_file(&t, path, &o);
    CHECK(s && t);
    if (s && t)
        exercise(s, t);
    dt_store_free(t);
    dt_store_free(s);
    // A stale file of another job is refused.
    dt_store_opts o2 = {.timeout_ms = 5000, .token = "another"};
    CHECK(dt_store_new_file(&(dt_store *){NULL}, path, &o2) != DT_OK);
    CHECK_EQ(dt_last_status(), DT_ERR_MISMATCH);
    CHECK(contains(dt_last_error(), "job token mismatch"));
    // A corrupt file is a format error naming the offset.
    int w = open(path, O_WRONLY | O_APPEND);
    CHECK(write(w, "garbage-garbage-garbage", 23) == 23);
    close(w);
    dt_store *u = NULL;
    dt_store_new_file(&u, path, &o);
    CHECK(u == NULL);
    CHECK_EQ(dt_last_status(), DT_ERR_FORMAT);
    CHECK(contains(dt_last_error(), path));
    unlink(path);
}

// Many clients in separate processes hammer one counter and their own keys, and each
// waits (blocking get) for a key the last client sets.
typedef struct conc_cfg {
    int  port;
    char path[64];
} conc_cfg;

enum { CLIENTS = 12, ADDS = 150 };

static dt_store *conc_open(const conc_cfg *cfg) {
    dt_store *s = NULL;
    if (!cfg->path[0])
        return client(cfg->port, NULL, 20000);
    dt_store_new_file(&s, cfg->path, &(dt_store_opts){.timeout_ms = 20000});
    return s;
}

static void conc_client(int rank, int world, void *arg) {
    const conc_cfg *cfg = arg;
    dt_store       *s   = conc_open(cfg);
    CHECK(s != NULL);
    if (!s)
        return;
    for (int i = 0; i < ADDS; i++)
        CHECK_OK(dt_store_add(s, "counter", 1, NULL));
    char k[32], v[32];
    snprintf(k, sizeof k, "client/%d", rank);
    snprintf(v, sizeof v, "value-%d", rank * 31);
    CHECK_OK(dt_store_set(s, k, v, strlen(v)));
    if (rank == world - 1) {
        sleep_ms(200);
        CHECK_OK(dt_store_set(s, "go", "1", 1));
    }
    void *g = NULL;
    CHECK_OK(dt_store_get(s, "go", &g, NULL));
    dt_free(g);
    dt_store_free(s);
}

static void concurrency(conc_cfg *cfg) {
    mp_opts o = {.world = CLIENTS, .timeout_ms = 60000};
    MP_RUN(&o, conc_client, cfg);
}

static void test_tcp_many_clients(void) {
    int       port;
    dt_store *s   = server(&port, NULL, 20000);
    conc_cfg  cfg = {.port = port};
    concurrency(&cfg);
    int64_t c = 0;
    CHECK_OK(dt_store_add(s, "counter", 0, &c));
    CHECK_EQ(c, CLIENTS * ADDS);
    for (int r = 0; r < CLIENTS; r++) {
        char k[32], want[32];
        snprintf(k, sizeof k, "client/%d", r);
        snprintf(want, sizeof want, "value-%d", r * 31);
        void *v = NULL;
        CHECK_OK(dt_store_get(s, k, &v, NULL));
        CHECK(v && strcmp(v, want) == 0);
        dt_free(v);
    }
    dt_store_free(s);
}

static void test_file_many_clients(void) {
    conc_cfg cfg = {0};
    snprintf(cfg.path, sizeof cfg.path, "/tmp/dtrain-store-conc-%d", (int)getpid());
    unlink(cfg.path);
    concurrency(&cfg);
    dt_store *s = conc_open(&cfg);
    int64_t   c = 0;
    CHECK_OK(dt_store_add(s, "counter", 0, &c));
    CHECK_EQ(c, CLIENTS * ADDS);
    dt_store_free(s);
    unlink(cfg.path);
}

static void test_tokens(void) {
    int       port;
    dt_store *s = server(&port, "right", 2000);
    dt_store *c = client(port, "wrong", 2000);
    CHECK(c == NULL);
    CHECK_EQ(dt_last_status(), DT_ERR_MISMATCH);
    CHECK(contains(dt_last_error(), "job token mismatch: the client's job token is not this"));
    // Nothing about the expected value: no token, no hash of it.
    CHECK(!contains(dt_last_error(), "right") && !contains(dt_last_error(), "wrong"));
    CHECK(!contains(dt_last_error(), "hash"));
    char hex[20];
    snprintf(hex, sizeof hex, "%016llx", (unsigned long long)dt_token_hash("right"));
    CHECK(!contains(dt_last_error(), hex));
    unsetenv("DT_JOB_TOKEN");
    c = client(port, NULL, 2000);
    CHECK(c == NULL);
    CHECK(contains(dt_last_error(), "the client has none"));
    c = client(port, "right", 2000);
    CHECK(c != NULL);
    dt_store_free(c);
    // DT_JOB_TOKEN from the environment when opts.token is NULL.
    setenv("DT_JOB_TOKEN", "right", 1);
    c = client(port, NULL, 2000);
    CHECK(c != NULL);
    dt_store_free(c);
    unsetenv("DT_JOB_TOKEN");
    dt_store_free(s);
}

static void test_server_dies(void) {
    int port = mp_free_port();
    int p[2];
    CHECK(pipe(p) == 0);
    pid_t pid = fork();
    if (pid == 0) {
        dt_store_opts o = {.timeout_ms = 20000};
        dt_store     *s = NULL;
        dt_store_new_tcp(&s, NULL, port, true, &o);
        char b = s ? 1 : 0;
        CHECK(write(p[1], &b, 1) == 1);
        sleep_ms(60000);
        _exit(0);
    }
    char b = 0;
    CHECK(read(p[0], &b, 1) == 1 && b == 1);
    dt_store *c = client(port, NULL, 20000);
    CHECK(c != NULL);
    CHECK_OK(dt_store_set(c, "k", "v", 1));
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    void    *v  = NULL;
    uint64_t t0 = dt_now_ns();
    CHECK_ERR(dt_store_get(c, "never", &v, NULL), DT_ERR_PEER, "closed the connection");
    CHECK((dt_now_ns() - t0) / 1000000 < 2000);
    CHECK_ERR(dt_store_set(c, "k", "v", 1), DT_ERR_PEER, "closed the connection");
    dt_store_free(c);
    close(p[0]);
    close(p[1]);
}

// Bytes that are not the protocol get an error reply and a closed connection; the
// server keeps serving everyone else.
static void test_malformed_client(void) {
    int         port;
    dt_store   *s         = server(&port, NULL, 5000);
    const char *garbage[] = {
        "GET / HTTP/1.1\r\nHost: x\r\n\r\n",
        "DTS1\x02\x00\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00\xff\xff\xff\x7f\x00\x00\x00\x00",
    };
    for (int g = 0; g < 2; g++) {
        int                fd = socket(AF_INET, SOCK_STREAM, 0);
        struct sockaddr_in a  = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
        a.sin_addr.s_addr     = htonl(INADDR_LOOPBACK);
        CHECK(connect(fd, (struct sockaddr *)&a, sizeof a) == 0);
        size_t len = g == 0 ? strlen(garbage[0]) : 24;
        CHECK(write(fd, garbage[g], len) == (ssize_t)len);
        char   buf[4096];
        size_t got = 0;
        for (;;) {
            ssize_t k = read(fd, buf + got, sizeof buf - 1 - got);
            if (k <= 0)
                break;
            got += (size_t)k;
        }
        buf[got] = 0;
        // A reply with status DT_ERR_FORMAT, then EOF.
        CHECK(got > 24 && buf[4] == DT_ERR_FORMAT);
        CHECK(contains(buf + 28, "store message") || contains(buf + 28, "magic"));
        close(fd);
    }
    dt_store *c = client(port, NULL, 5000);
    CHECK(c != NULL);
    CHECK_OK(dt_store_set(c, "still", "alive", 5));
    dt_store_free(c);
    dt_store_free(s);
}

static void test_port_in_use(void) {
    int           port;
    dt_store     *s = server(&port, NULL, 1000);
    dt_store_opts o = {.timeout_ms = 1000};
    CHECK(dt_store_new_tcp(&(dt_store *){NULL}, NULL, port, true, &o) != DT_OK);
    char want[64];
    snprintf(want, sizeof want, "port %d is already in use by pid %d", port, (int)getpid());
    CHECK_EQ(dt_last_status(), DT_ERR_IO);
    CHECK(contains(dt_last_error(), want));
    if (!contains(dt_last_error(), want))
        fprintf(stderr, "     \"%s\"\n", dt_last_error());
    dt_store_free(s);
}

int main(void) {
    RUN(test_tcp_operations);
    RUN(test_file_operations);
    RUN(test_tcp_many_clients);
    RUN(test_file_many_clients);
    RUN(test_tokens);
    RUN(test_server_dies);
    RUN(test_malformed_client);
    RUN(test_port_in_use);
    return check_summary();
}
