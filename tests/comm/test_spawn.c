// test_spawn.c: dt_spawn starts workers with their rank variables (and they can form a
// group from them), stops the others when one fails and names it, escalates to
// SIGKILL for a worker that ignores SIGTERM, and its workers die with their parent;
// dt_spawn_fork's workers go on in the caller's code, and the parent gets their ends.
#include "../lib/mp.h"

#include <errno.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

typedef struct slot {
    _Atomic int pid;
    int         rank, local_rank, world, local_world;
    int         has_port, has_token;
    float       sum; // result of an all_reduce among the workers
} slot;

static slot *slots(void) {
    return mp_shared();
}

static void sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static int env_int(const char *name) {
    const char *v = getenv(name);
    return v ? atoi(v) : -1;
}

// Gone: no such process, or a zombie nobody reaped.
static bool gone(int pid) {
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/stat", pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return true;
    char   buf[512] = "";
    size_t n        = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n]      = 0;
    char *paren = strrchr(buf, ')');
    return paren && paren[1] == ' ' && (paren[2] == 'Z' || paren[2] == 'X');
}

static int worker_ok(int local_rank, void *arg) {
    (void)arg;
    slot *s = &slots()[local_rank];
    atomic_store(&s->pid, (int)getpid());
    s->rank        = env_int("RANK");
    s->local_rank  = env_int("LOCAL_RANK");
    s->world       = env_int("WORLD_SIZE");
    s->local_world = env_int("LOCAL_WORLD_SIZE");
    s->has_port    = getenv("MASTER_PORT") != NULL;
    s->has_token   = getenv("DT_JOB_TOKEN") != NULL;
    dt_pg_opts o   = dt_pg_opts_default();
    o.backend      = mp_backend();
    o.timeout_ms   = 20000;
    dt_pg *pg      = NULL;
    dt_pg_new_from_env(&pg, &o);
    if (!pg)
        return 10;
    float x = (float)(local_rank + 1);
    if (dt_pg_all_reduce(pg, &x, &s->sum, 1, DT_FLOAT32, DT_REDUCE_SUM) != DT_OK)
        return 11;
    dt_pg_free(pg);
    return 0;
}

static void test_success(void) {
    memset(slots(), 0, 4096);
    unsetenv("MASTER_PORT");
    unsetenv("DT_JOB_TOKEN");
    dt_spawn_result res;
    CHECK_OK(dt_spawn(3, worker_ok, NULL, &res));
    CHECK_EQ(res.failed_rank, -1);
    for (int i = 0; i < 3; i++) {
        slot *s = &slots()[i];
        CHECK_EQ(s->rank, i);
        CHECK_EQ(s->local_rank, i);
        CHECK_EQ(s->world, 3);
        CHECK_EQ(s->local_world, 3);
        CHECK(s->has_port && s->has_token);
        CHECK_NEAR(s->sum, 6.0, 0);
        CHECK(gone(s->pid));
    }
    // The parent's own environment is left alone.
    CHECK(getenv("MASTER_PORT") == NULL);
}

// dt_spawn_fork: every child returns from the call with its local rank and its rank
// variables, runs the code after it (the same worker as test_success) and exits with
// its status; the parent returns after them with -1 and their result: DT_OK, then a
// failure naming the child that exited with 11.
static void test_fork(void) {
    for (int fail = 0; fail < 2; fail++) {
        memset(slots(), 0, 4096);
        unsetenv("MASTER_PORT");
        unsetenv("DT_JOB_TOKEN");
        setenv("DT_SPAWN_GRACE_MS", "500", 1);
        dt_spawn_result res;
        int             local = -2;
        dt_status       st    = dt_spawn_fork(3, &local, &res);
        if (local >= 0) { // a child: the caller's code from here on
            int rc = st == DT_OK ? worker_ok(local, NULL) : 12;
            exit(fail && local == 2 ? 11 : rc);
        }
        CHECK_EQ(local, -1);
        if (!fail) {
            CHECK_OK(st);
            CHECK_EQ(res.failed_rank, -1);
            for (int i = 0; i < 3; i++) {
                CHECK_EQ(slots()[i].rank, i);
                CHECK_EQ(slots()[i].world, 3);
                CHECK_NEAR(slots()[i].sum, 6.0, 0);
                CHECK(gone(slots()[i].pid));
            }
        } else {
            CHECK_ERR(st, DT_ERR_PEER, "local rank 2 (rank 2) exited with code 11");
            CHECK_EQ(res.failed_rank, 2);
            CHECK_EQ(res.exit_code, 11);
        }
        unsetenv("DT_SPAWN_GRACE_MS");
    }
}

// Node 1 of a 2-node job of 2 processes each: RANK = 2 + local rank, WORLD_SIZE kept.
static int worker_ranks_only(int local_rank, void *arg) {
    (void)arg;
    slot *s  = &slots()[local_rank];
    s->rank  = env_int("RANK");
    s->world = env_int("WORLD_SIZE");
    return 0;
}

static void test_multi_node_ranks(void) {
    memset(slots(), 0, 4096);
    setenv("GROUP_RANK", "1", 1);
    setenv("WORLD_SIZE", "4", 1);
    CHECK_OK(dt_spawn(2, worker_ranks_only, NULL, NULL));
    CHECK_EQ(slots()[0].rank, 2);
    CHECK_EQ(slots()[1].rank, 3);
    CHECK_EQ(slots()[1].world, 4);
    setenv("WORLD_SIZE", "3", 1);
    CHECK_ERR(dt_spawn(2, worker_ranks_only, NULL, NULL), DT_ERR_ARG, "WORLD_SIZE >= 4");
    unsetenv("GROUP_RANK");
    unsetenv("WORLD_SIZE");
}

// --master-port without --master-addr on one machine: MASTER_PORT set, MASTER_ADDR not.
static void test_port_without_addr(void) {
    memset(slots(), 0, 4096);
    char port[16];
    snprintf(port, sizeof port, "%d", mp_free_port());
    setenv("MASTER_PORT", port, 1);
    unsetenv("MASTER_ADDR");
    unsetenv("DT_JOB_TOKEN");
    CHECK_OK(dt_spawn(2, worker_ok, NULL, NULL));
    CHECK_NEAR(slots()[1].sum, 3.0, 0);
    unsetenv("MASTER_PORT");
}

// One rank of a multi-node job: all_reduce of RANK + 1 into the slot of its rank.
static int worker_rank_sum(int local_rank, void *arg) {
    (void)arg, (void)local_rank;
    int        rank = env_int("RANK");
    dt_pg_opts o    = dt_pg_opts_default();
    o.backend       = mp_backend();
    o.timeout_ms    = 15000;
    dt_pg *pg       = NULL;
    dt_pg_new_from_env(&pg, &o);
    if (!pg) {
        fprintf(stderr, "rank %d: %s\n", rank, dt_last_error());
        return 10;
    }
    float x = (float)(rank + 1), y = 0;
    if (dt_pg_all_reduce(pg, &x, &y, 1, DT_FLOAT32, DT_REDUCE_SUM) != DT_OK)
        return 11;
    slots()[rank].sum = y;
    dt_pg_free(pg);
    return 0;
}

// Two nodes of one job, each its own dt_spawn with the same environment but no
// DT_JOB_TOKEN (the README's two-machine command lines): they must agree on a token.
static void test_two_nodes_without_token(void) {
    memset(slots(), 0, 4096);
    char port[16];
    snprintf(port, sizeof port, "%d", mp_free_port());
    pid_t node[2];
    for (int k = 0; k < 2; k++) {
        node[k] = fork();
        if (node[k] == 0) {
            char gr[16];
            snprintf(gr, sizeof gr, "%d", k);
            setenv("GROUP_RANK", gr, 1);
            setenv("WORLD_SIZE", "4", 1);
            setenv("MASTER_ADDR", "127.0.0.1", 1);
            setenv("MASTER_PORT", port, 1);
            unsetenv("DT_JOB_TOKEN");
            setenv("DT_TIMEOUT_MS", "15000", 1);
            _exit(dt_spawn(2, worker_rank_sum, NULL, NULL) == DT_OK ? 0 : 1);
        }
    }
    for (int k = 0; k < 2; k++) {
        int status = -1;
        waitpid(node[k], &status, 0);
        CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    }
    for (int r = 0; r < 4; r++)
        CHECK_NEAR(slots()[r].sum, 10.0, 0); // 1 + 2 + 3 + 4
}

static int worker_fail(int local_rank, void *arg) {
    int mode = *(int *)arg;
    atomic_store(&slots()[local_rank].pid, (int)getpid());
    if (local_rank == 1) {
        sleep_ms(200);
        if (mode == 1)
            raise(SIGKILL);
        return 3;
    }
    if (mode == 2)
        signal(SIGTERM, SIG_IGN); // stubborn: needs the SIGKILL
    sleep_ms(30000);
    return 0;
}

static void test_child_fails(void) {
    for (int mode = 0; mode < 3; mode++) {
        memset(slots(), 0, 4096);
        setenv("DT_SPAWN_GRACE_MS", "500", 1);
        dt_spawn_result res;
        uint64_t        t0 = dt_now_ns();
        dt_status       st = dt_spawn(4, worker_fail, &mode, &res);
        double          s  = (double)(dt_now_ns() - t0) / 1e9;
        CHECK_EQ(st, DT_ERR_PEER);
        CHECK_EQ(res.failed_rank, 1);
        if (mode == 1) {
            CHECK_EQ(res.term_signal, SIGKILL);
            CHECK_EQ(res.exit_code, -1);
            CHECK(strstr(dt_last_error(), "local rank 1 (rank 1) was killed by signal 9") != NULL);
        } else {
            CHECK_EQ(res.exit_code, 3);
            CHECK_EQ(res.term_signal, 0);
            CHECK(strstr(dt_last_error(), "local rank 1 (rank 1) exited with code 3") != NULL);
        }
        // The others were stopped (mode 2 only after the grace period), not waited for.
        CHECK(s < 5.0);
        if (mode == 2)
            CHECK(s >= 0.6);
        for (int i = 0; i < 4; i++)
            CHECK(atomic_load(&slots()[i].pid) > 0 && gone(atomic_load(&slots()[i].pid)));
        unsetenv("DT_SPAWN_GRACE_MS");
    }
    CHECK_ERR(dt_spawn(0, worker_fail, NULL, NULL), DT_ERR_ARG, "1..4096");
    CHECK_ERR(dt_spawn(2, NULL, NULL, NULL), DT_ERR_ARG, "NULL");
}

// Far more processes than cores are refused before anything is forked, with what their
// shm segment would cost; DT_MAX_LOCAL_PROCS lifts the bound (and is range-checked).
static void test_local_bound(void) {
    long cpus  = sysconf(_SC_NPROCESSORS_ONLN);
    long bound = cpus * 4 < 256 ? cpus * 4 : 256;
    memset(slots(), 0, 4096);
    CHECK_ERR(dt_spawn(1000, worker_ok, NULL, NULL), DT_ERR_ARG,
              "1000 local processes exceed the bound of");
    CHECK(strstr(dt_last_error(), "DT_MAX_LOCAL_PROCS") != NULL);
    CHECK(strstr(dt_last_error(), "8244.4 MiB of /dev/shm") != NULL); // 1000^2 channels
    CHECK(atomic_load(&slots()[0].pid) == 0);                         // nothing started
    CHECK_ERR(dt_spawn((int)bound + 1, worker_ok, NULL, NULL), DT_ERR_ARG, "exceed the bound");
    setenv("DT_MAX_LOCAL_PROCS", "1", 1);
    CHECK_ERR(dt_spawn(2, worker_ok, NULL, NULL), DT_ERR_ARG, "the bound of 1 ");
    setenv("DT_MAX_LOCAL_PROCS", "5000", 1);
    CHECK_ERR(dt_spawn(2, worker_ok, NULL, NULL), DT_ERR_ARG, "DT_MAX_LOCAL_PROCS");
    setenv("DT_MAX_LOCAL_PROCS", "0", 1); // the automatic bound
    CHECK_ERR(dt_spawn(1000, worker_ok, NULL, NULL), DT_ERR_ARG, "exceed the bound of");
    setenv("DT_MAX_LOCAL_PROCS", "3", 1);
    CHECK_OK(dt_spawn(3, worker_ok, NULL, NULL));
    unsetenv("DT_MAX_LOCAL_PROCS");
}

static int worker_sleep(int local_rank, void *arg) {
    (void)arg;
    atomic_store(&slots()[local_rank].pid, (int)getpid());
    sleep_ms(60000);
    return 0;
}

// The parent of the workers is killed: the workers must not outlive it.
static void test_parent_killed(void) {
    memset(slots(), 0, 4096);
    // Orphans come to us, so we can reap them and see how they died.
    CHECK(prctl(PR_SET_CHILD_SUBREAPER, 1) == 0);
    pid_t mid = fork();
    if (mid == 0) {
        dt_spawn(3, worker_sleep, NULL, NULL);
        _exit(0);
    }
    uint64_t dl = dt_deadline_ns(10000);
    while (dt_now_ns() < dl && !(atomic_load(&slots()[0].pid) && atomic_load(&slots()[1].pid) &&
                                 atomic_load(&slots()[2].pid)))
        sleep_ms(5);
    kill(mid, SIGKILL);
    waitpid(mid, NULL, 0);
    int reaped = 0;
    dl         = dt_deadline_ns(5000);
    for (int i = 0; i < 3; i++) {
        int pid = atomic_load(&slots()[i].pid);
        CHECK(pid > 0);
        int st = 0;
        while (pid > 0 && dt_now_ns() < dl) {
            pid_t r = waitpid(pid, &st, WNOHANG);
            if (r == pid) {
                reaped++;
                CHECK(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL);
                break;
            }
            if (r < 0 && errno == ECHILD && gone(pid)) {
                reaped++; // reaped by someone else: at least it is gone
                break;
            }
            sleep_ms(5);
        }
        CHECK(gone(pid));
    }
    CHECK_EQ(reaped, 3);
    prctl(PR_SET_CHILD_SUBREAPER, 0);
}

int main(void) {
    RUN(test_success);
    RUN(test_fork);
    RUN(test_multi_node_ranks);
    RUN(test_port_without_addr);
    RUN(test_two_nodes_without_token);
    RUN(test_child_fails);
    RUN(test_parent_killed);
    RUN(test_local_bound);
    return check_summary();
}
