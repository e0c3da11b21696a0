// reaper.c: the guard process that makes "no worker outlives dtrun" hold even when
// dtrun itself is killed with SIGKILL.
//
// Each worker gets PR_SET_PDEATHSIG, so it dies with dtrun; but what the worker started
// (a shell's children, data-loader processes) does not. Every worker runs in a process
// group of its own, and dtrun registers each group with this small process over a
// pipe. When the pipe reaches end-of-file without a goodbye - dtrun died, however - the
// guard kills every registered group with SIGKILL and exits. It ignores the terminal's
// signals (Ctrl-C reaches it too, as it shares dtrun's process group) so that it is
// still there when dtrun is gone.
#include "dtrun.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

// One message: 8 bytes, written in one write(2) (atomic on a pipe).
typedef struct msg {
    char    op; // '+' register, '-' unregister, 'q' goodbye
    char    pad[3];
    int32_t pgid;
} msg;

static _Noreturn void reaper_main(int fd) {
    struct sigaction ign = {.sa_handler = SIG_IGN};
    int sigs[]           = {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGPIPE, SIGTSTP, SIGTTIN, SIGTTOU};
    for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++)
        sigaction(sigs[i], &ign, NULL);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    prctl(PR_SET_NAME, "dtrun-reaper", 0, 0, 0);
    // Hold nothing of dtrun's: a reader of dtrun's output must see end-of-file when
    // dtrun is gone.
    int null = open("/dev/null", O_RDWR);
    for (int i = 0; i < 3; i++)
        if (null >= 0 && null != i)
            dup2(null, i);
    for (int i = 3; i < 1024; i++)
        if (i != fd)
            close(i);

    size_t   cap = 64, n = 0;
    int32_t *groups = malloc(cap * sizeof *groups);
    msg      m;
    for (;;) {
        ssize_t k = read(fd, &m, sizeof m);
        if (k < 0 && errno == EINTR)
            continue;
        if (k != (ssize_t)sizeof m)
            break; // end-of-file: dtrun is gone
        if (m.op == 'q')
            _exit(0);
        if (m.op == '+' && groups) {
            if (n == cap) {
                int32_t *g = realloc(groups, 2 * cap * sizeof *groups);
                if (!g)
                    continue;
                groups = g, cap *= 2;
            }
            groups[n++] = m.pgid;
        } else if (m.op == '-') {
            for (size_t i = 0; i < n; i++)
                if (groups[i] == m.pgid) {
                    groups[i] = groups[--n];
                    break;
                }
        }
    }
    for (size_t i = 0; i < n; i++)
        if (groups[i] > 1)
            kill(-groups[i], SIGKILL);
    _exit(0);
}

int dtrun_reaper_start(pid_t *pid) {
    int p[2];
    *pid = -1;
    if (pipe2(p, O_CLOEXEC) != 0) {
        dtrun_say("warning: no guard process (pipe: %s); workers' children may outlive a "
                  "killed dtrun",
                  strerror(errno));
        return -1;
    }
    pid_t r = fork();
    if (r == 0) {
        close(p[1]);
        reaper_main(p[0]);
    }
    close(p[0]);
    if (r < 0) {
        dtrun_say("warning: no guard process (fork: %s); workers' children may outlive a "
                  "killed dtrun",
                  strerror(errno));
        close(p[1]);
        return -1;
    }
    *pid = r;
    return p[1];
}

static void send_msg(int fd, char op, pid_t pgid) {
    if (fd < 0)
        return;
    msg m = {.op = op, .pgid = (int32_t)pgid};
    while (write(fd, &m, sizeof m) < 0 && errno == EINTR)
        ;
}

void dtrun_reaper_add(int fd, pid_t pgid) {
    send_msg(fd, '+', pgid);
}
void dtrun_reaper_remove(int fd, pid_t pgid) {
    send_msg(fd, '-', pgid);
}

void dtrun_reaper_stop(int fd, pid_t pid) {
    if (fd < 0)
        return;
    send_msg(fd, 'q', 0);
    close(fd);
    if (pid > 0)
        while (waitpid(pid, NULL, 0) < 0 && errno == EINTR)
            ;
}
