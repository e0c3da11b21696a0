// mp.c: the multi-process test runner (see mp.h).
#include "mp.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define SHARED_BYTES (64 << 10)

static void *shared_page;

void *mp_shared(void) {
    if (!shared_page) {
        shared_page =
            mmap(NULL, SHARED_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
        if (shared_page == MAP_FAILED) {
            perror("mp_shared: mmap");
            abort();
        }
    }
    return shared_page;
}

int mp_free_port(void) {
    static unsigned seed;
    if (!seed)
        seed = (unsigned)(getpid() * 2654435761u) ^ (unsigned)time(NULL);
    for (int tries = 0; tries < 200; tries++) {
        int port = 20000 + (int)(rand_r(&seed) % 12768);
        int fd   = socket(AF_INET, SOCK_STREAM, 0);
        if (fd < 0)
            continue;
        struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
        a.sin_addr.s_addr    = htonl(INADDR_ANY);
        int ok               = bind(fd, (struct sockaddr *)&a, sizeof a) == 0;
        close(fd);
        if (ok)
            return port;
    }
    fprintf(stderr, "mp_free_port: no free port found\n");
    abort();
}

const char *mp_backend(void) {
    const char *b = getenv("DT_TEST_BACKEND");
    return b && *b ? b : "tcp";
}

dt_pg *mp_pg_init(int64_t timeout_ms) {
    return mp_pg_open(mp_backend(), timeout_ms);
}

dt_pg *mp_pg_open(const char *backend, int64_t timeout_ms) {
    dt_pg_opts o = dt_pg_opts_default();
    o.backend    = backend;
    o.timeout_ms = timeout_ms ? timeout_ms : 30000;
    dt_pg *pg    = NULL;
    if (dt_pg_new_from_env(&pg, &o) != DT_OK)
        fprintf(stderr, "rank %s: dt_pg_new_from_env failed: %s\n", getenv("RANK"),
                dt_last_error());
    return pg;
}

void mp_fake_host(int h) {
    char host[32];
    snprintf(host, sizeof host, "fakehost-%d", h);
    setenv("DT_HOST_ID", host, 1);
    unsetenv("LOCAL_RANK");
    unsetenv("LOCAL_WORLD_SIZE");
}

static void set_int(const char *name, long v) {
    char b[32];
    snprintf(b, sizeof b, "%ld", v);
    setenv(name, b, 1);
}

int mp_run_impl(const mp_opts *o, mp_fn fn, void *arg, int *passed, int *failed) {
    int     world   = o->world;
    int64_t timeout = o->timeout_ms ? o->timeout_ms : 120000;
    int     port    = o->port ? o->port : mp_free_port();
    memset(mp_shared(), 0, SHARED_BYTES);
    char token[40];
    snprintf(token, sizeof token, "test-%d-%d-%lld", (int)getpid(), port, (long long)dt_now_ns());
    pid_t *pids    = calloc((size_t)world, sizeof *pids);
    int(*pipes)[2] = calloc((size_t)world, sizeof *pipes);
    fflush(NULL);
    pid_t parent = getpid();
    for (int r = 0; r < world; r++) {
        if (pipe(pipes[r]) != 0) {
            perror("mp: pipe");
            abort();
        }
        pid_t pid = fork();
        if (pid == 0) {
            prctl(PR_SET_PDEATHSIG, SIGKILL);
            if (getppid() != parent)
                _exit(99);
            close(pipes[r][0]);
            setenv("MASTER_ADDR", "127.0.0.1", 1);
            set_int("MASTER_PORT", port);
            set_int("RANK", r);
            set_int("WORLD_SIZE", world);
            set_int("LOCAL_RANK", r);
            set_int("LOCAL_WORLD_SIZE", world);
            setenv("DT_JOB_TOKEN", token, 1);
            *passed = *failed = 0;
            fn(r, world, arg);
            int     counts[2] = {*passed, *failed};
            ssize_t w         = write(pipes[r][1], counts, sizeof counts);
            (void)w;
            fflush(NULL);
            _exit(0);
        }
        if (pid < 0) {
            perror("mp: fork");
            abort();
        }
        close(pipes[r][1]);
        pids[r] = pid;
    }
    uint64_t deadline = dt_deadline_ns(timeout);
    int      left = world, bad = 0;
    bool    *done = calloc((size_t)world, sizeof *done);
    while (left > 0) {
        for (int r = 0; r < world; r++) {
            if (done[r])
                continue;
            int   st;
            pid_t p = waitpid(pids[r], &st, WNOHANG);
            if (p == 0)
                continue;
            done[r] = true;
            left--;
            int     counts[2] = {0, 0};
            ssize_t k         = read(pipes[r][0], counts, sizeof counts);
            close(pipes[r][0]);
            if (p > 0 && WIFSIGNALED(st)) {
                if (!(o->may_die >> r & 1)) {
                    fprintf(stderr, "FAIL rank %d of %d was killed by signal %d (%s)\n", r, world,
                            WTERMSIG(st), strsignal(WTERMSIG(st)));
                    bad++;
                }
                continue;
            }
            if (p < 0 || !WIFEXITED(st) || WEXITSTATUS(st) != 0 || k != (ssize_t)sizeof counts) {
                fprintf(stderr, "FAIL rank %d of %d exited with status %d without reporting\n", r,
                        world, p > 0 && WIFEXITED(st) ? WEXITSTATUS(st) : -1);
                bad++;
                continue;
            }
            *passed += counts[0];
            *failed += counts[1];
        }
        if (left == 0)
            break;
        if (dt_now_ns() > deadline) {
            for (int r = 0; r < world; r++)
                if (!done[r]) {
                    fprintf(stderr, "FAIL rank %d of %d did not finish within %lld ms; killed\n", r,
                            world, (long long)timeout);
                    kill(pids[r], SIGKILL);
                    waitpid(pids[r], NULL, 0);
                    close(pipes[r][0]);
                    done[r] = true;
                    bad++;
                }
            break;
        }
        struct timespec ts = {0, 2 * 1000000L};
        nanosleep(&ts, NULL);
    }
    *failed += bad;
    free(done);
    free(pids);
    free(pipes);
    return bad;
}
