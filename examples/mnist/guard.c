// guard.c: dtrain-mnist's start-up checks (output paths, settings shared by every rank)
// and the SIGTERM stop at an agreed step boundary (see guard.h).
#include "guard.h"

#include <errno.h>
#include <limits.h>
#include <signal.h>
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
    if (snprintf(tmpl, sizeof tmpl, "%s/.dtrain-mnist-probe-XXXXXX", dir) >= (int)sizeof tmpl)
        return dt_fail(DT_ERR_ARG, "%s %s: path too long", what, shown);
    int fd = mkstemp(tmpl);
    if (fd < 0)
        return dt_fail_errno(DT_ERR_IO, "%s %s: cannot create a file in %s", what, shown, dir);
    close(fd);
    unlink(tmpl);
    return DT_OK;
}

dt_status mnist_check_save_model(const char *path) {
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

dt_status mnist_check_checkpoint_dir(const char *dir) {
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

static void format_setting(const mnist_setting *s, int64_t v, char *buf, size_t n) {
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

dt_status mnist_check_settings(dt_pg *pg, const mnist_setting *s, int n) {
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

// Threads started before main (a BLAS library's pool) do not have SIGTERM blocked, and
// the kernel may hand a process-wide SIGTERM to one of them: this handler passes it on
// to the main thread, where it stays pending (blocked) until the next step boundary.
static pid_t main_tid;

static void pass_to_main(int sig) {
    int saved = errno;
    syscall(SYS_tgkill, getpid(), main_tid, sig);
    errno = saved;
}

void mnist_preempt_block(void) {
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    main_tid             = (pid_t)syscall(SYS_gettid);
    struct sigaction act = {.sa_handler = pass_to_main, .sa_flags = SA_RESTART};
    sigfillset(&act.sa_mask);
    sigaction(SIGTERM, &act, NULL);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
}

bool mnist_preempt_pending(void) {
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    struct timespec zero = {0, 0};
    return sigtimedwait(&set, NULL, &zero) == SIGTERM;
}

dt_status mnist_preempt_agree(dt_pg *pg, bool *stop) {
    int64_t flag = *stop || mnist_preempt_pending();
    if (pg)
        DT_TRY(dt_pg_all_reduce(pg, &flag, &flag, 1, DT_INT64, DT_REDUCE_MAX));
    *stop = flag != 0;
    return DT_OK;
}

void mnist_preempt_release(void) {
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    struct sigaction act = {.sa_handler = SIG_DFL};
    sigaction(SIGTERM, &act, NULL);
    pthread_sigmask(SIG_UNBLOCK, &set, NULL);
}
