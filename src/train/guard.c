// guard.c: the trainer's start-up checks (output paths, settings shared by every rank)
// and the SIGTERM stop at an agreed step boundary (see train_impl.h).
#include "train_impl.h"

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

// Creates and removes a file in dir: the one test that also catches read-only mounts,
// ACLs and root on a file system that refuses it. `what` is the flag, for the message.
static dt_status probe_dir(const char *dir, const char *what, const char *shown) {
    char tmpl[PATH_MAX];
    if (snprintf(tmpl, sizeof tmpl, "%s/.dtrain-probe-XXXXXX", dir) >= (int)sizeof tmpl)
        return dt_fail(DT_ERR_ARG, "%s %s: path too long", what, shown);
    int fd = mkstemp(tmpl);
    if (fd < 0)
        return dt_fail_errno(DT_ERR_IO, "%s %s: cannot create a file in %s", what, shown, dir);
    close(fd);
    unlink(tmpl);
    return DT_OK;
}

dt_status dt_train_check_save_model(const char *path) {
    if (!path)
        return DT_OK;
    if (!*path)
        return dt_fail(DT_ERR_ARG, "--save-model expects a file path, found \"\"");
    struct stat st;
    if (stat(path, &st) == 0 && !S_ISREG(st.st_mode))
        return dt_fail(DT_ERR_ARG, "--save-model %s: expected a file path, found a %s", path,
                       S_ISDIR(st.st_mode) ? "directory" : "special file");
    char        dir[PATH_MAX];
    const char *slash = strrchr(path, '/');
    if (!slash)
        snprintf(dir, sizeof dir, ".");
    else if (slash == path)
        snprintf(dir, sizeof dir, "/");
    else
        snprintf(dir, sizeof dir, "%.*s", (int)(slash - path), path);
    if (stat(dir, &st) != 0)
        return dt_fail_errno(DT_ERR_IO, "--save-model %s: its directory %s", path, dir);
    if (!S_ISDIR(st.st_mode))
        return dt_fail(DT_ERR_IO, "--save-model %s: %s is not a directory", path, dir);
    return probe_dir(dir, "--save-model", path);
}

// mkdir -p: every missing component, 0777 & ~umask.
static dt_status make_dirs(const char *dir) {
    char p[PATH_MAX];
    if (snprintf(p, sizeof p, "%s", dir) >= (int)sizeof p)
        return dt_fail(DT_ERR_ARG, "--checkpoint-dir %s: path too long", dir);
    for (char *s = p + 1;; s++) {
        if (*s != '/' && *s != '\0')
            continue;
        char c = *s;
        *s     = '\0';
        if (mkdir(p, 0777) != 0 && errno != EEXIST)
            return dt_fail_errno(DT_ERR_IO, "--checkpoint-dir %s: cannot create %s", dir, p);
        *s = c;
        if (!c)
            return DT_OK;
    }
}

dt_status dt_train_check_checkpoint_dir(const char *dir) {
    if (!dir)
        return DT_OK;
    if (!*dir)
        return dt_fail(DT_ERR_ARG, "--checkpoint-dir expects a directory, found \"\"");
    struct stat st;
    if (stat(dir, &st) != 0) {
        if (errno != ENOENT)
            return dt_fail_errno(DT_ERR_IO, "--checkpoint-dir %s", dir);
        DT_TRY(make_dirs(dir));
        if (stat(dir, &st) != 0)
            return dt_fail_errno(DT_ERR_IO, "--checkpoint-dir %s", dir);
    }
    if (!S_ISDIR(st.st_mode))
        return dt_fail(DT_ERR_IO, "--checkpoint-dir %s: expected a directory, found a file", dir);
    return probe_dir(dir, "--checkpoint-dir", dir);
}

static void format_setting(const dt_train_setting *s, int64_t v, char *buf, size_t n) {
    if (s->is_double) {
        double d;
        memcpy(&d, &v, sizeof d);
        snprintf(buf, n, "%.9g", d);
    } else if (s->is_bool) {
        snprintf(buf, n, "%s", v ? "on" : "off");
    } else {
        snprintf(buf, n, "%lld", (long long)v);
    }
}

dt_status dt_train_check_settings(dt_pg *pg, const dt_train_setting *s, int n) {
    if (!pg || n <= 0)
        return DT_OK;
    int      world = dt_pg_size(pg);
    int64_t *mine  = dt_alloc(sizeof(int64_t) * (size_t)n);
    int64_t *all   = dt_alloc(sizeof(int64_t) * (size_t)n * (size_t)world);
    if (!mine || !all) {
        dt_free(mine);
        dt_free(all);
        return DT_ERR_NOMEM;
    }
    for (int i = 0; i < n; i++)
        mine[i] = s[i].value;
    dt_status st = dt_pg_all_gather(pg, mine, all, (size_t)n, DT_INT64);
    for (int r = 1; st == DT_OK && r < world; r++)
        for (int i = 0; st == DT_OK && i < n; i++)
            if (all[(size_t)r * (size_t)n + (size_t)i] != all[i]) {
                char v0[40], vr[40];
                format_setting(&s[i], all[i], v0, sizeof v0);
                format_setting(&s[i], all[(size_t)r * (size_t)n + (size_t)i], vr, sizeof vr);
                st = dt_fail(DT_ERR_MISMATCH,
                             "%s must be the same on every rank: rank 0 has %s, rank %d has %s "
                             "(start every rank with the same flags)",
                             s[i].flag, v0, r, vr);
            }
    dt_free(mine);
    dt_free(all);
    return st;
}

// SIGTERM is blocked in every thread the program starts (they inherit the mask). Where
// it lands:
//   - a watcher thread (dt_train_preempt_watch) takes it with sigwait: while training is
//     armed it becomes a stop request for the next step boundary; otherwise the process
//     ends at once, by the signal, as it would without any of this (a rank stuck in its
//     rendezvous can still be stopped with kill);
//   - without a watcher (the parent of --num-processes), it stays pending for dt_spawn,
//     which forwards it to the workers;
//   - threads started before main (a BLAS library's pool) do not block it, and the
//     kernel may pick one of them: the handler passes it on to the target thread.
static pid_t      target_tid; // the watcher, else the main thread
static atomic_int armed, requested;

static void pass_on(int sig) {
    int saved = errno;
    syscall(SYS_tgkill, getpid(), target_tid, sig);
    errno = saved;
}

static void term_set(sigset_t *set) {
    sigemptyset(set);
    sigaddset(set, SIGTERM);
}

// Ends the process by SIGTERM from the calling thread (default action, unblocked).
static void die_by_sigterm(void) {
    sigset_t         set;
    struct sigaction act = {.sa_handler = SIG_DFL};
    term_set(&set);
    fflush(NULL);
    sigaction(SIGTERM, &act, NULL);
    pthread_sigmask(SIG_UNBLOCK, &set, NULL);
    pthread_kill(pthread_self(), SIGTERM);
    _exit(128 + SIGTERM); // not reached
}

void dt_train_preempt_block(void) {
    sigset_t set;
    term_set(&set);
    target_tid           = (pid_t)syscall(SYS_gettid);
    struct sigaction act = {.sa_handler = pass_on, .sa_flags = SA_RESTART};
    sigfillset(&act.sa_mask);
    sigaction(SIGTERM, &act, NULL);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
}

static atomic_int watcher_tid;

static void *watch(void *arg) {
    (void)arg;
    atomic_store(&watcher_tid, (int)syscall(SYS_gettid));
    sigset_t set;
    term_set(&set);
    for (;;) {
        int sig = 0;
        if (sigwait(&set, &sig) != 0 || sig != SIGTERM)
            continue;
        if (atomic_load(&armed)) {
            atomic_store(&requested, 1);
            // The release may have run between the two lines above: whoever takes the
            // request acts on it (sequentially consistent atomics: exactly one does).
            if (!atomic_load(&armed) && atomic_exchange(&requested, 0))
                die_by_sigterm();
        } else {
            die_by_sigterm();
        }
    }
    return NULL;
}

void dt_train_preempt_watch(void) {
    pthread_t      t;
    pthread_attr_t attr;
    atomic_store(&watcher_tid, 0);
    atomic_store(&armed, 0);
    atomic_store(&requested, 0);
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    if (pthread_create(&t, &attr, watch, NULL) == 0) {
        while (!atomic_load(&watcher_tid)) // microseconds: the thread's first statement
            sched_yield();
        target_tid = (pid_t)atomic_load(&watcher_tid);
    }
    pthread_attr_destroy(&attr);
}

void dt_train_preempt_arm(void) {
    atomic_store(&armed, 1);
}

bool dt_train_preempt_pending(void) {
    if (atomic_exchange(&requested, 0))
        return true;
    // Without a watcher the signal waits, blocked, for this thread.
    sigset_t set;
    term_set(&set);
    struct timespec zero = {0, 0};
    return sigtimedwait(&set, NULL, &zero) == SIGTERM;
}

dt_status dt_train_preempt_agree(dt_pg *pg, bool *stop) {
    int64_t flag = *stop || dt_train_preempt_pending();
    if (pg)
        DT_TRY(dt_pg_all_reduce(pg, &flag, &flag, 1, DT_INT64, DT_REDUCE_MAX));
    *stop = flag != 0;
    return DT_OK;
}

void dt_train_preempt_release(void) {
    atomic_store(&armed, 0);
    if (dt_train_preempt_pending())
        die_by_sigterm(); // came after the last step's agreement: as without a watcher
}
