// test_liveness.c: hung peers are found in seconds with default settings, and a slow
// step is not taken for one.
//
// - A rank SIGSTOPped (a frozen VM) while the others run collectives: every other rank
//   fails within 10 s naming the frozen rank and its host, never a healthy rank
//   (shm and tcp; the frozen rank is rank 0, which runs the store, for tcp). In the
//   shm run a stranger sprays rank 0's heartbeat port with garbage and forged
//   heartbeats meanwhile: they must neither crash it nor hide the frozen rank.
// - A rank that computes 15 s between two collectives (its peer waits inside one) is
//   not declared dead.
// - A communication thread that stops making progress inside an operation (blocked in
//   a signal handler here: a deadlock) is named by its peer.
// - Two network namespaces on one switch (tests/lib/netns.h), the link cut mid-run: both
//   sides stop within the same bound naming the other "unreachable (frozen, dead or link
//   cut)"; with liveness off and DT_TIMEOUT_MS=3000, both stop by ~T (the abort path
//   once blocked on the unreachable store for another T + 10 s).
//
// `test_liveness --slow` or DT_TEST_SLOW=1 (make test-slow) runs the matrices instead: 2 and 4
// ranks, shm and tcp, every victim position, and 10 link cuts; it prints the detection times.
#include "../lib/mp.h"
#include "../lib/netns.h"
#include "comm/backend.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAX_RANKS 8

typedef struct shared {
    _Atomic uint64_t event_ns; // the freeze, the cut
    _Atomic int      victim_pid;
    _Atomic int      reported; // healthy ranks that got their error
    _Atomic uint64_t err_ns[MAX_RANKS];
    _Atomic uint64_t free_ns[MAX_RANKS];
    _Atomic int      blamed_healthy; // a message named a healthy rank
    char             msg[MAX_RANKS][600];
} shared;

static bool slow_mode;

static void sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static void set_backend(const char *b) {
    setenv("DT_TEST_BACKEND", b, 1);
}

// True when msg names rank r as the culprit ("rank 2 (host ").
static bool names_rank(const char *msg, int r) {
    char pat[32];
    snprintf(pat, sizeof pat, "rank %d (host ", r);
    return strstr(msg, pat) != NULL;
}

static void my_host(char *buf, size_t n) {
    char h[128] = "";
    gethostname(h, sizeof h - 1);
    const char *id = getenv("DT_HOST_ID");
    snprintf(buf, n, "%s", id && *id ? id : h);
}

// ------------------------------------------------------------------ frozen rank

typedef struct freeze_cfg {
    int  victim;
    bool spray; // a stranger sprays rank 0's UDP port (see spray_main)
} freeze_cfg;

typedef struct spray_arg {
    int          port, victim, world;
    _Atomic bool stop;
    _Atomic long sent;
} spray_arg;

// A stranger on rank 0's liveness port: random bytes of random sizes, and well-formed
// heartbeats claiming to come from the victim with guessed MACs. None may crash the
// rank or keep the frozen victim "alive".
static void *spray_main(void *arg) {
    spray_arg         *a  = arg;
    int                fd = socket(AF_INET, SOCK_DGRAM, 0);
    struct sockaddr_in to = {.sin_family = AF_INET, .sin_port = htons((uint16_t)a->port)};
    to.sin_addr.s_addr    = htonl(INADDR_LOOPBACK);
    uint64_t x            = 0x9E3779B97F4A7C15ull ^ dt_now_ns();
    uint8_t  b[2048];
    while (!atomic_load(&a->stop)) {
        for (size_t i = 0; i < sizeof b; i += 8) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            memcpy(b + i, &x, 8);
        }
        size_t n = (size_t)(x % sizeof b);
        if (x & 1) { // a forged heartbeat: right layout (version 2), random MAC
            n = 72;
            memcpy(b, "DTL1", 4);
            b[4] = 2, b[5] = 0, b[6] = 0, b[7] = 0;
            uint32_t r = (uint32_t)a->victim, w = (uint32_t)a->world, dst = 0;
            memcpy(b + 8, &r, 4);
            memcpy(b + 12, &w, 4);
            memcpy(b + 16, &dst, 4);
        }
        sendto(fd, b, n, 0, (struct sockaddr *)&to, sizeof to);
        atomic_fetch_add(&a->sent, 1);
        sleep_ms(1);
    }
    close(fd);
    return NULL;
}

static void freeze_ranks(int rank, int world, void *arg) {
    const freeze_cfg *cfg = arg;
    shared           *sh  = mp_shared();
    dt_pg            *pg  = mp_pg_init(600000); // the group timeout is not what finds it
    CHECK(pg != NULL);
    if (!pg)
        return;
    float buf[256];
    for (int i = 0; i < 256; i++)
        buf[i] = (float)rank;
    if (rank == cfg->victim)
        atomic_store(&sh->victim_pid, (int)getpid());
    pthread_t spray;
    spray_arg sa = {.victim = cfg->victim, .world = world};
    if (cfg->spray && rank == 0) {
        void *v = NULL;
        CHECK_OK(dt_store_get(dt_pg_store(pg), "dt/live/0", &v, NULL));
        char ip[64];
        if (v)
            CHECK(sscanf(v, "%63s %d", ip, &sa.port) == 2 && sa.port > 0);
        dt_free(v);
        pthread_create(&spray, NULL, spray_main, &sa);
    }
    dt_status st = DT_OK;
    for (int i = 0; st == DT_OK && i < 100000; i++) {
        if (rank == cfg->victim && i == 50) {
            atomic_store(&sh->event_ns, dt_now_ns());
            raise(SIGSTOP); // killed by the last healthy rank to report
        }
        st = dt_pg_all_reduce(pg, buf, buf, 256, DT_FLOAT32, DT_REDUCE_AVG);
        if (i > 50 && i % 16 == 0)
            sleep_ms(1);
    }
    uint64_t now = dt_now_ns(), ev = atomic_load(&sh->event_ns);
    atomic_store(&sh->err_ns[rank], now);
    snprintf(sh->msg[rank], sizeof sh->msg[rank], "%s", dt_last_error());
    const char *m = sh->msg[rank];
    CHECK_EQ(st, DT_ERR_PEER);
    CHECK(names_rank(m, cfg->victim) && strstr(m, "unreachable (frozen, dead or link cut)"));
    char host[128];
    my_host(host, sizeof host);
    host[strcspn(host, "/")] = '\0';
    CHECK(strstr(m, host) != NULL);
    for (int r = 0; r < world; r++)
        if (r != cfg->victim && names_rank(m, r)) {
            atomic_store(&sh->blamed_healthy, 1);
            CHECK(!"a healthy rank was named");
        }
    double secs = ev ? (double)(now - ev) / 1e9 : -1;
    CHECK(ev != 0 && secs < 10.0);
    if (!(names_rank(m, cfg->victim)) || secs >= 10.0)
        fprintf(stderr, "     rank %d after %.2f s: \"%s\"\n", rank, secs, m);
    if (cfg->spray && rank == 0) {
        atomic_store(&sa.stop, true);
        pthread_join(spray, NULL);
        fprintf(stderr,
                "     %ld hostile datagrams did not hide the frozen rank (found after %.2f s)\n",
                atomic_load(&sa.sent), secs);
        CHECK(atomic_load(&sa.sent) > 100);
    }
    dt_pg_free(pg);
    if (atomic_fetch_add(&sh->reported, 1) + 1 == world - 1)
        kill(atomic_load(&sh->victim_pid), SIGKILL);
}

// One run; returns the slowest healthy rank's time (s), -1 when it failed.
static double freeze_once(const char *backend, int world, int victim, bool *blamed) {
    set_backend(backend);
    freeze_cfg cfg   = {.victim = victim, .spray = victim != 0 && !slow_mode};
    mp_opts    o     = {.world = world, .may_die = 1u << victim, .timeout_ms = 60000};
    int        bad   = MP_RUN(&o, freeze_ranks, &cfg);
    shared    *sh    = mp_shared();
    double     worst = 0;
    uint64_t   ev    = atomic_load(&sh->event_ns);
    for (int r = 0; r < world; r++) {
        if (r == victim)
            continue;
        double s = ev && sh->err_ns[r] ? (double)(sh->err_ns[r] - ev) / 1e9 : -1;
        if (s < 0)
            return -1;
        if (s > worst)
            worst = s;
    }
    *blamed = atomic_load(&sh->blamed_healthy) != 0;
    return bad ? -1 : worst;
}

static void test_frozen_rank_shm(void) {
    bool   blamed = false;
    double s      = freeze_once("shm", 2, 1, &blamed);
    fprintf(stderr, "     shm, 2 ranks, rank 1 frozen: the other failed after %.2f s\n", s);
    CHECK(s > 0 && s < 10 && !blamed);
}

static void test_frozen_rank_tcp(void) {
    bool   blamed = false;
    double s      = freeze_once("tcp", 2, 0, &blamed); // rank 0 runs the store
    fprintf(stderr, "     tcp, 2 ranks, rank 0 (the store) frozen: the other failed after %.2f s\n",
            s);
    CHECK(s > 0 && s < 10 && !blamed);
}

// ------------------------------------------------------------------ slow step

static void slow_step_ranks(int rank, int world, void *arg) {
    (void)world, (void)arg;
    dt_pg *pg = mp_pg_init(600000);
    CHECK(pg != NULL);
    if (!pg)
        return;
    float x = 1;
    CHECK_OK(dt_pg_all_reduce(pg, &x, &x, 1, DT_FLOAT32, DT_REDUCE_SUM));
    if (rank == 1)
        sleep_ms(15000); // a long compute step: no collective, no progress thread work
    x = 1;
    CHECK_OK(dt_pg_all_reduce(pg, &x, &x, 1, DT_FLOAT32, DT_REDUCE_SUM));
    CHECK_EQ(x, 2.0f);
    CHECK_OK(dt_pg_barrier(pg));
    dt_pg_free(pg);
}

static void test_slow_step_not_dead(void) {
    const char *backends[] = {"tcp", "shm"};
    for (int i = 0; i < (slow_mode ? 2 : 1); i++) {
        set_backend(backends[i]);
        mp_opts o = {.world = 2, .timeout_ms = 60000};
        MP_RUN(&o, slow_step_ranks, NULL);
    }
}

// ------------------------------------------------------------------ stuck comm thread

static void block_forever(int sig) {
    (void)sig;
    for (;;)
        pause();
}

// The thread of this process named `name`, or -1.
static int thread_named(const char *name) {
    DIR *d   = opendir("/proc/self/task");
    int  tid = -1;
    if (!d)
        return -1;
    struct dirent *e;
    while (tid < 0 && (e = readdir(d))) {
        char path[300], comm[64] = "";
        snprintf(path, sizeof path, "/proc/self/task/%s/comm", e->d_name);
        FILE *f = fopen(path, "r");
        if (!f)
            continue;
        if (fgets(comm, sizeof comm, f))
            comm[strcspn(comm, "\n")] = '\0';
        fclose(f);
        if (strcmp(comm, name) == 0)
            tid = atoi(e->d_name);
    }
    closedir(d);
    return tid;
}

static void stuck_ranks(int rank, int world, void *arg) {
    (void)world, (void)arg;
    shared *sh = mp_shared();
    setenv("DT_LIVENESS_MS", "2000", 1);
    dt_pg *pg = mp_pg_init(600000);
    CHECK(pg != NULL);
    if (!pg)
        return;
    float x[64] = {0};
    if (rank == 1) {
        atomic_store(&sh->victim_pid, (int)getpid());
        signal(SIGUSR1, block_forever);
        dt_work *w = NULL;
        CHECK_OK(dt_pg_all_reduce_async(pg, x, x, 64, DT_FLOAT32, DT_REDUCE_SUM, &w));
        sleep_ms(100);
        int tid = thread_named("dt-progress");
        CHECK(tid > 0);
        atomic_store(&sh->event_ns, dt_now_ns());
        syscall(SYS_tgkill, getpid(), tid, SIGUSR1); // the comm thread deadlocks
        dt_work_wait(w);                             // never returns: killed by rank 0
        return;
    }
    sleep_ms(300);
    dt_status st = DT_OK;
    for (int i = 0; i < 3 && st == DT_OK; i++)
        st = dt_pg_all_reduce(pg, x, x, 64, DT_FLOAT32, DT_REDUCE_SUM);
    double secs = (double)(dt_now_ns() - atomic_load(&sh->event_ns)) / 1e9;
    CHECK_ERR(st, DT_ERR_PEER, "communication thread made no progress");
    CHECK(names_rank(dt_last_error(), 1));
    CHECK(secs < 8);
    fprintf(stderr, "     rank 0 named the stuck rank after %.2f s: %s\n", secs, dt_last_error());
    dt_pg_free(pg);
    kill(atomic_load(&sh->victim_pid), SIGKILL);
}

static void test_stuck_comm_thread(void) {
    set_backend("tcp");
    mp_opts o = {.world = 2, .may_die = 2, .timeout_ms = 60000};
    MP_RUN(&o, stuck_ranks, NULL);
}

// ------------------------------------------------------------------ settings

static void settings_ranks(int rank, int world, void *arg) {
    (void)world, (void)arg;
    if (rank == 1)
        setenv("DT_LIVENESS_MS", "0", 1);
    uint64_t   t0 = dt_now_ns();
    dt_pg_opts o  = dt_pg_opts_default();
    o.backend     = mp_backend();
    o.timeout_ms  = 20000;
    dt_pg *pg     = NULL;
    dt_pg_new_from_env(&pg, &o);
    CHECK(pg == NULL);
    CHECK_ERR(dt_last_status(), DT_ERR_MISMATCH, "set them alike on every rank");
    CHECK(strstr(dt_last_error(), "DT_LIVENESS_MS=0") && strstr(dt_last_error(), "=5000"));
    CHECK((dt_now_ns() - t0) / 1000000 < 5000); // at once, not at the timeout
    dt_pg_free(pg);
    setenv("DT_LIVENESS_MS", "100", 1);
    setenv("DT_HEARTBEAT_MS", "80", 1);
    CHECK(dt_pg_new_from_env(&(dt_pg *){NULL}, &o) != DT_OK);
    CHECK_ERR(dt_last_status(), DT_ERR_ARG, "at least twice DT_HEARTBEAT_MS=80");
    unsetenv("DT_LIVENESS_MS");
    unsetenv("DT_HEARTBEAT_MS");
}

static void test_settings_must_agree(void) {
    set_backend("tcp");
    mp_opts o = {.world = 2, .timeout_ms = 30000};
    MP_RUN(&o, settings_ranks, NULL);
}

// ------------------------------------------------------------------ slow matrices

static void test_freeze_matrix(void) {
    const char *backends[] = {"shm", "tcp"};
    int         worlds[]   = {2, 4};
    for (int b = 0; b < 2; b++)
        for (int wi = 0; wi < 2; wi++) {
            int    world = worlds[wi], trials = 10, blamed_runs = 0, failed = 0;
            double t[10];
            for (int k = 0; k < trials; k++) {
                bool blamed = false;
                t[k]        = freeze_once(backends[b], world, k % world, &blamed);
                blamed_runs += blamed;
                failed += t[k] < 0;
            }
            // sort for the median
            for (int i = 1; i < trials; i++)
                for (int j = i; j > 0 && t[j] < t[j - 1]; j--) {
                    double s = t[j];
                    t[j]     = t[j - 1];
                    t[j - 1] = s;
                }
            printf("RESULT freeze backend=%s world=%d trials=%d median_s=%.2f max_s=%.2f "
                   "healthy_blamed=%d failed=%d\n",
                   backends[b], world, trials, (t[4] + t[5]) / 2, t[trials - 1], blamed_runs,
                   failed);
            fflush(stdout);
            CHECK(blamed_runs == 0 && failed == 0 && t[trials - 1] < 10);
        }
}

// ------------------------------------------------------------------ network namespaces

static netns_net np;

static bool ns_link_up(void) {
    return netns_sh("ip -n %s link set %s up", np.ns[0], np.veth[0]) == 0 &&
           netns_sh("ip -n %s link set %s up", np.ns[1], np.veth[1]) == 0;
}

typedef struct cut_cfg {
    bool liveness_off; // DT_LIVENESS_MS=0, DT_TIMEOUT_MS=3000: the timeout path (bug 4)
} cut_cfg;

// Rank r runs in namespace r; rank 0 (the store) at 10.201.0.1.
static void cut_ranks(int rank, int world, void *arg) {
    (void)world;
    const cut_cfg *cfg = arg;
    shared        *shd = mp_shared();
    char           path[128];
    snprintf(path, sizeof path, "/var/run/netns/%s", np.ns[rank]);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (!CHECK(fd >= 0 && setns(fd, CLONE_NEWNET) == 0))
        return;
    close(fd);
    setenv("MASTER_ADDR", "10.201.0.1", 1);
    setenv("DT_HOST_ID", rank ? "node-b" : "node-a", 1);
    setenv("DT_TEST_BACKEND", "tcp", 1);
    if (cfg->liveness_off)
        setenv("DT_LIVENESS_MS", "0", 1);
    dt_pg *pg = mp_pg_init(cfg->liveness_off ? 3000 : 600000);
    CHECK(pg != NULL);
    if (!pg)
        return;
    // 4 MiB messages: the socket buffers are full when the link goes, so the abort
    // message cannot be sent whole and the abort path turns to the (unreachable) store.
    size_t n   = 1 << 20;
    float *buf = dt_alloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++)
        buf[i] = 1;
    dt_status st = DT_OK;
    for (int i = 0; st == DT_OK && i < 100000; i++) {
        if (rank == 0 && i == 5) {
            atomic_store(&shd->event_ns, dt_now_ns());
            if (netns_sh("ip -n %s link set %s down", np.ns[0], np.veth[0]) != 0)
                CHECK(!"link cut");
        }
        st = dt_pg_all_reduce(pg, buf, buf, n, DT_FLOAT32, DT_REDUCE_AVG);
    }
    atomic_store(&shd->err_ns[rank], dt_now_ns());
    snprintf(shd->msg[rank], sizeof shd->msg[rank], "%s", dt_last_error());
    dt_pg_free(pg);
    atomic_store(&shd->free_ns[rank], dt_now_ns());
    dt_free(buf);
    const char *m = shd->msg[rank];
    if (cfg->liveness_off) {
        CHECK_EQ(st, DT_ERR_TIMEOUT);
    } else {
        CHECK_EQ(st, DT_ERR_PEER);
        CHECK(names_rank(m, 1 - rank) && strstr(m, "unreachable (frozen, dead or link cut)") &&
              strstr(m, rank ? "node-a" : "node-b"));
        CHECK(!names_rank(m, rank));
    }
}

// Returns the later of the two ranks' stop times after the cut (s), -1 on failure.
static double cut_once(bool liveness_off, bool verbose) {
    cut_cfg cfg   = {.liveness_off = liveness_off};
    mp_opts o     = {.world = 2, .timeout_ms = 90000};
    int     bad   = MP_RUN(&o, cut_ranks, &cfg);
    shared *s     = mp_shared();
    double  worst = 0;
    for (int r = 0; r < 2; r++) {
        double e = (double)(s->err_ns[r] - s->event_ns) / 1e9;
        double f = (double)(s->free_ns[r] - s->event_ns) / 1e9;
        if (verbose)
            fprintf(stderr, "     rank %d: error after %.2f s, dt_pg_free done after %.2f s: %s\n",
                    r, e, f, s->msg[r]);
        if (!s->free_ns[r] || !s->event_ns)
            return -1;
        if (f > worst)
            worst = f;
    }
    if (!ns_link_up())
        return -1;
    return bad ? -1 : worst;
}

static void test_link_cut(void) {
    double s = cut_once(false, true);
    CHECK(s > 0 && s < 10);
}

static void test_link_cut_timeout_bounded(void) {
    double s = cut_once(true, true);
    // DT_TIMEOUT_MS=3000: both stop by T + the abort budgets (200 ms to peers, 1 s for
    // the store), not 2T + 10 s.
    CHECK(s > 0 && s < 3.0 + 2.5);
}

static void test_link_cut_matrix(void) {
    double t[10];
    int    failed = 0;
    for (int k = 0; k < 10; k++) {
        t[k] = cut_once(false, false);
        failed += t[k] < 0;
    }
    for (int i = 1; i < 10; i++)
        for (int j = i; j > 0 && t[j] < t[j - 1]; j--) {
            double x = t[j];
            t[j]     = t[j - 1];
            t[j - 1] = x;
        }
    printf("RESULT cut trials=10 median_s=%.2f max_s=%.2f failed=%d\n", (t[4] + t[5]) / 2, t[9],
           failed);
    fflush(stdout);
    CHECK(failed == 0 && t[9] < 10);
}

int main(int argc, char **argv) {
    const char *slow = getenv("DT_TEST_SLOW");
    slow_mode        = (argc > 1 && strcmp(argv[1], "--slow") == 0) || (slow && !strcmp(slow, "1"));
    // Default liveness settings, whatever the caller's environment says.
    unsetenv("DT_LIVENESS_MS");
    unsetenv("DT_HEARTBEAT_MS");
    if (slow_mode) {
        RUN(test_freeze_matrix);
        RUN(test_slow_step_not_dead);
    } else {
        RUN(test_frozen_rank_shm);
        RUN(test_frozen_rank_tcp);
        RUN(test_slow_step_not_dead);
        RUN(test_stuck_comm_thread);
        RUN(test_settings_must_agree);
    }
    char why[200];
    if (!netns_setup(&np, 2, "dtlive", "dtl", "10.201.0", why, sizeof why)) {
        if (np.made)
            CHECK(!"network namespaces set up");
        else
            printf("SKIP the link cut tests: %s\n", why);
        netns_teardown(&np);
        return check_summary();
    }
    if (slow_mode) {
        RUN(test_link_cut_matrix);
    } else {
        RUN(test_link_cut);
        RUN(test_link_cut_timeout_bounded);
    }
    netns_teardown(&np);
    return check_summary();
}
