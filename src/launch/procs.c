// procs.c: the one process supervisor (launch.h): fork a set of children, watch them
// through pidfds, stop them (a signal, then SIGKILL after a grace period), reap them and
// say how they ended. dt_spawn (src/comm/spawn.c) runs its workers through it, and so
// does dtrun (tools/dtrun/workers.c), whose poll loop also watches the workers' pipes:
// hence dt_procs_poll_ms and dt_procs_reap beside the self-contained dt_procs_wait.
//
// Between fork and the child's main only async-signal-safe calls happen (setpgid,
// prctl, getppid), so a parent with other threads (dtrun's store server and monitor)
// may use it; everything the child needs is prepared before fork.
#include "dtrain/launch.h"

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#define MAX_PROCS        65536
#define NO_PIDFD_POLL_MS 50 // how often children without a pidfd are looked at
#define NO_KILL          UINT64_MAX

struct dt_procs {
    int            n, nalive;
    bool           own_groups, no_pidfd;
    bool           stopping;
    uint64_t       kill_at; // SIGKILL for the live children then; NO_KILL: none pending
    dt_proc       *p;
    struct pollfd *pf; // n entries, for dt_procs_wait
};

dt_status dt_procs_new(dt_procs **out, int n, const dt_procs_opts *opts) {
    *out = NULL;
    if (n < 1 || n > MAX_PROCS)
        return dt_fail(DT_ERR_ARG, "procs: expected 1..%d children, found %d", MAX_PROCS, n);
    dt_procs *ps = dt_alloc_zero(sizeof *ps);
    if (!ps)
        return DT_ERR_NOMEM;
    ps->n          = n;
    ps->own_groups = opts && opts->own_groups;
    ps->no_pidfd   = opts && opts->no_pidfd;
    ps->kill_at    = NO_KILL;
    ps->p          = dt_alloc_zero((size_t)n * sizeof *ps->p);
    ps->pf         = dt_alloc((size_t)n * sizeof *ps->pf);
    if (!ps->p || !ps->pf) {
        dt_procs_free(ps);
        return DT_ERR_NOMEM;
    }
    for (int i = 0; i < n; i++)
        ps->p[i] = (dt_proc){.pid = -1, .pidfd = -1, .exit_code = -1};
    *out = ps;
    return DT_OK;
}

dt_status dt_procs_start(dt_procs *ps, int index, dt_proc_main child, void *arg) {
    if (!ps || !child || index < 0 || index >= ps->n)
        return dt_fail(DT_ERR_ARG,
                       "procs: start of child %d: expected a supervisor, a child "
                       "function and an index below the count",
                       index);
    dt_proc *p = &ps->p[index];
    if (p->pid > 0)
        return dt_fail(DT_ERR_ARG, "procs: child %d was started already (pid %d)", index, p->pid);
    pid_t parent = getpid();
    fflush(NULL); // or the child inherits what is buffered and prints it again
    pid_t pid = fork();
    if (pid == 0) {
        if (ps->own_groups)
            setpgid(0, 0);
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent) // the parent died before prctl took effect
            _exit(128 + SIGKILL);
        child(index, arg);
        _exit(127);
    }
    if (pid < 0) {
        int e = errno;
        dt_fail_errno(DT_ERR_IO, "procs: fork of child %d", index);
        errno = e;
        return DT_ERR_IO;
    }
    if (ps->own_groups)
        setpgid(pid, pid); // in both processes: no window where a signal misses the group
    p->pid   = pid;
    p->alive = true;
    ps->nalive++;
    p->pidfd = ps->no_pidfd ? -1 : dt_pidfd_open(pid);
    return DT_OK;
}

int dt_procs_count(const dt_procs *ps) {
    return ps ? ps->n : 0;
}

int dt_procs_alive(const dt_procs *ps) {
    return ps ? ps->nalive : 0;
}

const dt_proc *dt_procs_at(const dt_procs *ps, int index) {
    return ps && index >= 0 && index < ps->n ? &ps->p[index] : NULL;
}

static void send_one(const dt_procs *ps, const dt_proc *p, int sig) {
    if (!ps->own_groups || kill(-p->pid, sig) != 0)
        kill(p->pid, sig); // (a group: before the child's setpgid, the process alone)
}

void dt_procs_signal(dt_procs *ps, int sig) {
    for (int i = 0; ps && i < ps->n; i++) {
        dt_proc *p = &ps->p[i];
        if (!p->alive)
            continue;
        p->signalled = true;
        send_one(ps, p, sig);
    }
}

bool dt_procs_stop(dt_procs *ps, int sig, int64_t grace_ms) {
    if (!ps || ps->stopping)
        return false;
    ps->stopping = true;
    // A grace beyond 2^40 ms (35 years) is as good as none: no overflow below.
    bool never  = grace_ms < 0 || grace_ms > (INT64_C(1) << 40);
    ps->kill_at = never ? NO_KILL : dt_now_ns() + (uint64_t)grace_ms * 1000000ull;
    dt_procs_signal(ps, sig);
    return true;
}

bool dt_procs_stopping(const dt_procs *ps) {
    return ps && ps->stopping;
}

void dt_procs_kill(dt_procs *ps) {
    if (!ps)
        return;
    ps->stopping = true;
    ps->kill_at  = NO_KILL; // sent now: nothing left to send later
    dt_procs_signal(ps, SIGKILL);
}

// Records how child p ended from waitpid's answer r and status.
static void record_end(dt_procs *ps, dt_proc *p, pid_t r, int status) {
    p->alive = false;
    ps->nalive--;
    p->exit_code   = -1;
    p->term_signal = 0;
    if (r > 0 && WIFEXITED(status))
        p->exit_code = WEXITSTATUS(status);
    else if (r > 0 && WIFSIGNALED(status))
        p->term_signal = WTERMSIG(status);
    // r < 0: reaped elsewhere (a SIGCHLD handler, waitpid(-1)): unknown.
    if (p->pidfd >= 0)
        close(p->pidfd);
    p->pidfd = -1;
}

int dt_procs_reap(dt_procs *ps, dt_procs_end_fn on_end, void *ctx) {
    if (!ps)
        return 0;
    int ended = 0;
    for (int i = 0; i < ps->n; i++) {
        dt_proc *p = &ps->p[i];
        if (!p->alive)
            continue;
        int   status = 0;
        pid_t r      = waitpid(p->pid, &status, WNOHANG);
        if (r == 0 || (r < 0 && errno == EINTR))
            continue;
        record_end(ps, p, r, status);
        ended++;
        if (on_end)
            on_end(ps, i, ctx);
    }
    if (ps->stopping && ps->kill_at != NO_KILL && ps->nalive > 0 && dt_now_ns() >= ps->kill_at)
        dt_procs_kill(ps);
    return ended;
}

int dt_procs_poll_ms(const dt_procs *ps, int timeout_ms) {
    if (!ps || ps->nalive == 0)
        return timeout_ms;
    int ms = timeout_ms;
    if (ps->stopping && ps->kill_at != NO_KILL) {
        int left = dt_ms_left(ps->kill_at) + 1; // wake just after, not just before
        if (ms < 0 || left < ms)
            ms = left;
    }
    for (int i = 0; i < ps->n; i++)
        if (ps->p[i].alive && ps->p[i].pidfd < 0) {
            if (ms < 0 || ms > NO_PIDFD_POLL_MS)
                ms = NO_PIDFD_POLL_MS;
            break;
        }
    return ms;
}

int dt_procs_wait(dt_procs *ps, int timeout_ms, dt_procs_end_fn on_end, void *ctx) {
    if (!ps || ps->nalive == 0)
        return 0;
    int nfd = 0;
    for (int i = 0; i < ps->n; i++)
        if (ps->p[i].alive && ps->p[i].pidfd >= 0)
            ps->pf[nfd++] = (struct pollfd){.fd = ps->p[i].pidfd, .events = POLLIN};
    // A child that already ended is found without waiting: its pidfd is readable.
    poll(ps->pf, (nfds_t)nfd, dt_procs_poll_ms(ps, timeout_ms));
    return dt_procs_reap(ps, on_end, ctx);
}

void dt_procs_release(dt_procs *ps) {
    if (!ps)
        return;
    for (int i = 0; ps->p && i < ps->n; i++)
        if (ps->p[i].pidfd >= 0)
            close(ps->p[i].pidfd);
    dt_free(ps->pf);
    dt_free(ps->p);
    dt_free(ps);
}

void dt_procs_free(dt_procs *ps) {
    if (!ps)
        return;
    for (int i = 0; ps->p && i < ps->n; i++) {
        dt_proc *p = &ps->p[i];
        if (!p->alive)
            continue;
        send_one(ps, p, SIGKILL);
        int   status = 0;
        pid_t r;
        while ((r = waitpid(p->pid, &status, 0)) < 0 && errno == EINTR) {
        }
        record_end(ps, p, r, status);
    }
    // Whatever the children started and left behind in their groups goes with them.
    for (int i = 0; ps->own_groups && ps->p && i < ps->n; i++)
        if (ps->p[i].pid > 0)
            kill(-ps->p[i].pid, SIGKILL);
    dt_free(ps->pf);
    dt_free(ps->p);
    dt_free(ps);
}

void dt_procs_describe_end(int exit_code, int term_signal, char *buf, size_t n) {
    if (term_signal > 0) {
        const char *abbrev = sigabbrev_np(term_signal);
        snprintf(buf, n, "was killed by signal %d (SIG%s)", term_signal, abbrev ? abbrev : "?");
    } else if (exit_code >= 0) {
        snprintf(buf, n, "exited with code %d", exit_code);
    } else {
        snprintf(buf, n, "ended (status unknown)");
    }
}
