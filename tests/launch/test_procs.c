// test_procs.c: the process supervisor (dt_procs, launch.h) that dt_spawn and dtrun
// share: exit codes and signals as the children really ended, a wait that keeps its
// bound, a stop that escalates to SIGKILL only for the child that ignores the signal
// (and only after the grace), the polling path without pidfds, process groups whose
// leftovers die with dt_procs_free, and the argument errors.
#include "../check.h"
#include "dtrain/launch.h"

#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

// What a child does, by index: exit with a code, kill itself, or sleep (optionally
// ignoring or catching SIGTERM) after telling the parent it is ready.
typedef enum act {
    EXIT,
    SELF_KILL,
    SLEEP,
    SLEEP_IGNORE_TERM,
    SLEEP_EXIT_ON_TERM,
    FORK_SLEEPER
} act;

typedef struct plan {
    act  acts[8];
    int  codes[8];
    int  ready_fd; // write end: one byte (or a pid) per child once set up
    bool reached_main[8];
} plan;

static void on_term_exit(int sig) {
    (void)sig;
    _exit(75);
}

static void sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static void child(int i, void *arg) {
    const plan *p = arg;
    switch (p->acts[i]) {
    case EXIT:
        _exit(p->codes[i]);
    case SELF_KILL:
        kill(getpid(), SIGKILL);
        break;
    case SLEEP_IGNORE_TERM:
        signal(SIGTERM, SIG_IGN);
        break;
    case SLEEP_EXIT_ON_TERM:
        signal(SIGTERM, on_term_exit);
        break;
    case FORK_SLEEPER: {
        pid_t g = fork(); // left behind in this child's process group
        if (g == 0) {
            for (;;)
                pause();
        }
        int32_t v = (int32_t)g;
        if (write(p->ready_fd, &v, sizeof v) != sizeof v)
            _exit(3);
        _exit(0);
    }
    case SLEEP:
        break;
    }
    char b = 1;
    if (write(p->ready_fd, &b, 1) != 1)
        _exit(3);
    for (;;)
        pause();
}

// Reads n one-byte "ready" messages (bounded: 10 s).
static bool await_ready(int fd, int n) {
    uint64_t dl = dt_deadline_ns(10000);
    while (n > 0 && dt_now_ns() < dl) {
        char    b[8];
        ssize_t k = read(fd, b, (size_t)n < sizeof b ? (size_t)n : sizeof b);
        if (k > 0)
            n -= (int)k;
        else if (k < 0 && errno != EINTR && errno != EAGAIN)
            return false;
    }
    return n == 0;
}

typedef struct ends {
    int count[8];
    int order[8], n;
} ends;

static void count_end(dt_procs *ps, int i, void *ctx) {
    ends *e = ctx;
    e->count[i]++;
    e->order[e->n++] = i;
    CHECK(!dt_procs_at(ps, i)->alive);
    CHECK_EQ(dt_procs_at(ps, i)->pidfd, -1);
}

// Waits (bounded) until every child was reaped.
static void wait_all(dt_procs *ps, ends *e, int bound_ms) {
    uint64_t dl = dt_deadline_ns(bound_ms);
    while (dt_procs_alive(ps) > 0 && dt_now_ns() < dl)
        dt_procs_wait(ps, 100, count_end, e);
    CHECK_EQ(dt_procs_alive(ps), 0);
}

static void how(const dt_proc *p, char *buf, size_t n) {
    dt_procs_describe_end(p->exit_code, p->term_signal, buf, n);
}

static void check_ends(bool no_pidfd) {
    int fds[2];
    CHECK(pipe(fds) == 0);
    plan          p = {.acts = {EXIT, EXIT, SELF_KILL}, .codes = {0, 3}, .ready_fd = fds[1]};
    dt_procs     *ps;
    dt_procs_opts o = {.no_pidfd = no_pidfd};
    CHECK_OK(dt_procs_new(&ps, 3, &o));
    CHECK_EQ(dt_procs_count(ps), 3);
    CHECK_EQ(dt_procs_at(ps, 0)->pid, -1);
    for (int i = 0; i < 3; i++)
        CHECK_OK(dt_procs_start(ps, i, child, &p));
    CHECK_EQ(dt_procs_alive(ps), 3);
    for (int i = 0; i < 3; i++) {
        CHECK(dt_procs_at(ps, i)->pid > 0);
        CHECK(no_pidfd ? dt_procs_at(ps, i)->pidfd == -1 : dt_procs_at(ps, i)->pidfd >= 0);
    }
    // Without pidfds the children are looked at every 50 ms, even when asked for no bound.
    CHECK_EQ(dt_procs_poll_ms(ps, -1), no_pidfd ? 50 : -1);
    CHECK_EQ(dt_procs_poll_ms(ps, 20), 20);
    ends e = {0};
    wait_all(ps, &e, 10000);
    CHECK(e.count[0] == 1 && e.count[1] == 1 && e.count[2] == 1);
    char buf[64];
    how(dt_procs_at(ps, 0), buf, sizeof buf);
    CHECK(strcmp(buf, "exited with code 0") == 0);
    how(dt_procs_at(ps, 1), buf, sizeof buf);
    CHECK(strcmp(buf, "exited with code 3") == 0);
    how(dt_procs_at(ps, 2), buf, sizeof buf);
    CHECK(strcmp(buf, "was killed by signal 9 (SIGKILL)") == 0);
    CHECK(!dt_procs_at(ps, 0)->signalled && !dt_procs_stopping(ps));
    // Nothing left to wait for: returns at once.
    uint64_t t0 = dt_now_ns();
    CHECK_EQ(dt_procs_wait(ps, 5000, count_end, &e), 0);
    CHECK(dt_now_ns() - t0 < 1000000000ull);
    dt_procs_free(ps);
    close(fds[0]);
    close(fds[1]);
}

static void test_ends(void) {
    check_ends(false);
}

static void test_ends_without_pidfd(void) {
    check_ends(true);
}

// A wait keeps its bound while the child lives; dt_procs_free kills and reaps it.
static void test_wait_bound(void) {
    int fds[2];
    CHECK(pipe(fds) == 0);
    plan      p = {.acts = {SLEEP}, .ready_fd = fds[1]};
    dt_procs *ps;
    CHECK_OK(dt_procs_new(&ps, 1, NULL));
    CHECK_OK(dt_procs_start(ps, 0, child, &p));
    CHECK(await_ready(fds[0], 1));
    int      pid = dt_procs_at(ps, 0)->pid;
    uint64_t t0  = dt_now_ns();
    CHECK_EQ(dt_procs_wait(ps, 80, NULL, NULL), 0);
    uint64_t waited = dt_now_ns() - t0;
    CHECK(waited >= 70000000ull && waited < 3000000000ull);
    CHECK_EQ(dt_procs_alive(ps), 1);
    dt_procs_free(ps);
    CHECK(kill(pid, 0) != 0 && errno == ESRCH); // killed and reaped: no zombie left
    close(fds[0]);
    close(fds[1]);
}

// SIGTERM to all: the child that dies of it goes at once, the one that saves and
// exits goes by itself within the grace, the one that ignores it gets SIGKILL once
// the grace is over, not before.
static void test_stop_escalates(void) {
    int fds[2];
    CHECK(pipe(fds) == 0);
    plan      p = {.acts = {SLEEP, SLEEP_EXIT_ON_TERM, SLEEP_IGNORE_TERM}, .ready_fd = fds[1]};
    dt_procs *ps;
    CHECK_OK(dt_procs_new(&ps, 3, NULL));
    for (int i = 0; i < 3; i++)
        CHECK_OK(dt_procs_start(ps, i, child, &p));
    CHECK(await_ready(fds[0], 3));
    const int64_t grace = 400;
    uint64_t      t0    = dt_now_ns();
    CHECK(dt_procs_stop(ps, SIGTERM, grace));
    CHECK(dt_procs_stopping(ps));
    CHECK(!dt_procs_stop(ps, SIGINT, 0)); // only the first stop counts
    // The poll bound is cut to the SIGKILL's due time.
    int ms = dt_procs_poll_ms(ps, -1);
    CHECK(ms > 0 && ms <= grace + 1);
    ends     e        = {0};
    uint64_t third_at = 0;
    uint64_t dl       = dt_deadline_ns(10000);
    while (dt_procs_alive(ps) > 0 && dt_now_ns() < dl) {
        dt_procs_wait(ps, -1, count_end, &e);
        if (!dt_procs_at(ps, 2)->alive && !third_at)
            third_at = dt_now_ns();
    }
    CHECK_EQ(dt_procs_alive(ps), 0);
    CHECK(dt_procs_at(ps, 0)->term_signal == SIGTERM);
    CHECK(dt_procs_at(ps, 1)->exit_code == 75 && dt_procs_at(ps, 1)->term_signal == 0);
    CHECK(dt_procs_at(ps, 2)->term_signal == SIGKILL);
    for (int i = 0; i < 3; i++)
        CHECK(dt_procs_at(ps, i)->signalled);
    // The first two ended before the third.
    CHECK(e.n == 3 && e.order[2] == 2);
    double after = (double)(third_at - t0) / 1e6;
    CHECK(after >= (double)grace - 5 && after < (double)grace + 3000);
    if (!(after >= (double)grace - 5))
        fprintf(stderr, "SIGKILL came %.1f ms after the stop, before the %lld ms grace\n", after,
                (long long)grace);
    dt_procs_free(ps);
    close(fds[0]);
    close(fds[1]);
}

// dt_procs_kill: SIGKILL now, and nothing is pending afterwards.
static void test_kill_now(void) {
    int fds[2];
    CHECK(pipe(fds) == 0);
    plan      p = {.acts = {SLEEP_IGNORE_TERM, SLEEP}, .ready_fd = fds[1]};
    dt_procs *ps;
    CHECK_OK(dt_procs_new(&ps, 2, NULL));
    for (int i = 0; i < 2; i++)
        CHECK_OK(dt_procs_start(ps, i, child, &p));
    CHECK(await_ready(fds[0], 2));
    dt_procs_kill(ps);
    CHECK(dt_procs_stopping(ps));
    ends e = {0};
    wait_all(ps, &e, 5000);
    for (int i = 0; i < 2; i++)
        CHECK(dt_procs_at(ps, i)->term_signal == SIGKILL && dt_procs_at(ps, i)->signalled);
    dt_procs_free(ps);
    close(fds[0]);
    close(fds[1]);
}

// own_groups: each child leads its own group; what it leaves behind there survives it
// until dt_procs_free, which kills the group.
static void test_own_groups(void) {
    int fds[2];
    CHECK(pipe(fds) == 0);
    CHECK(prctl(PR_SET_CHILD_SUBREAPER, 1) == 0); // the orphaned grandchild comes to us
    plan          p = {.acts = {FORK_SLEEPER}, .ready_fd = fds[1]};
    dt_procs     *ps;
    dt_procs_opts o = {.own_groups = true};
    CHECK_OK(dt_procs_new(&ps, 1, &o));
    CHECK_OK(dt_procs_start(ps, 0, child, &p));
    int pid = dt_procs_at(ps, 0)->pid;
    CHECK_EQ(getpgid(pid), pid); // (a zombie until reaped keeps its group)
    int32_t g = 0;
    CHECK(read(fds[0], &g, sizeof g) == sizeof g && g > 0);
    ends e = {0};
    wait_all(ps, &e, 5000);
    CHECK_EQ(dt_procs_at(ps, 0)->exit_code, 0);
    CHECK_EQ(getpgid(g), pid); // still there, in the child's group
    dt_procs_free(ps);
    int      st = 0;
    pid_t    r  = 0;
    uint64_t dl = dt_deadline_ns(5000);
    while ((r = waitpid(g, &st, WNOHANG)) == 0 && dt_now_ns() < dl)
        sleep_ms(2);
    CHECK(r == g && WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL);
    if (r == 0)
        kill(g, SIGKILL), waitpid(g, NULL, 0);
    prctl(PR_SET_CHILD_SUBREAPER, 0);
    close(fds[0]);
    close(fds[1]);
}

static void never(int i, void *arg) {
    (void)i, (void)arg;
    _exit(0);
}

static void test_errors(void) {
    dt_procs *ps = (dt_procs *)&ps;
    CHECK_ERR(dt_procs_new(&ps, 0, NULL), DT_ERR_ARG, "expected 1..65536 children, found 0");
    CHECK(ps == NULL);
    CHECK_OK(dt_procs_new(&ps, 1, NULL));
    CHECK_ERR(dt_procs_start(ps, 1, never, NULL), DT_ERR_ARG, "start of child 1");
    CHECK_ERR(dt_procs_start(ps, 0, NULL, NULL), DT_ERR_ARG, "child function");
    CHECK_OK(dt_procs_start(ps, 0, never, NULL));
    CHECK_ERR(dt_procs_start(ps, 0, never, NULL), DT_ERR_ARG, "child 0 was started already");
    CHECK(dt_procs_at(ps, 1) == NULL && dt_procs_at(ps, -1) == NULL);
    dt_procs_free(ps); // reaps the child whatever it is doing
    dt_procs_free(NULL);
    char buf[64];
    dt_procs_describe_end(-1, 0, buf, sizeof buf);
    CHECK(strcmp(buf, "ended (status unknown)") == 0);
    dt_procs_describe_end(-1, SIGTERM, buf, sizeof buf);
    CHECK(strcmp(buf, "was killed by signal 15 (SIGTERM)") == 0);
}

int main(void) {
    signal(SIGPIPE, SIG_IGN);
    RUN(test_ends);
    RUN(test_ends_without_pidfd);
    RUN(test_wait_bound);
    RUN(test_stop_escalates);
    RUN(test_kill_now);
    RUN(test_own_groups);
    RUN(test_errors);
    return check_summary();
}
