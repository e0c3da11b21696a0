// mpirun.c: running a test's ranks under mpirun (see mpirun.h).
#include "mpirun.h"
#include "prog.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define DIR_VAR  "DT_TEST_MPIRUN_DIR"
#define MAX_ARGS 96

#ifdef DT_SANITIZE
// Open MPI keeps allocations of its own until the process exits (component tables,
// hwloc topology, the runtime's and libevent's state) and LeakSanitizer reports them at
// exit. Only the Open MPI libraries whose frames such leaks were seen to start from are
// named, so a leak of dtrain's (or the test's) memory is still reported. Open MPI is
// built without frame pointers, so the ranks unwind malloc stacks slowly but exactly
// (fast_unwind_on_malloc=0): the fast unwinder loses those frames and the suppressions
// would not match.
static const char lsan_suppressions[] = "leak:libmpi.so\n"
                                        "leak:libopen-pal.so\n"
                                        "leak:libopen-rte.so\n"
                                        "leak:libhwloc.so\n"
                                        "leak:libevent\n";
#endif

bool mpirun_available(void) {
    const char *path = getenv("PATH");
    if (!path)
        return false;
    char *p = strdup(path), *save = NULL;
    bool  found = false;
    for (char *d = strtok_r(p, ":", &save); d && !found; d = strtok_r(NULL, ":", &save)) {
        char f[PATH_MAX];
        snprintf(f, sizeof f, "%s/mpirun", *d ? d : ".");
        found = access(f, X_OK) == 0;
    }
    free(p);
    return found;
}

const char *mpirun_child_case(int argc, char **argv) {
    for (int i = 1; i + 1 < argc; i++)
        if (strcmp(argv[i], "--mpirun-child") == 0) {
            prctl(PR_SET_PDEATHSIG, SIGKILL); // die with mpirun
            return argv[i + 1];
        }
    return NULL;
}

int mpirun_child_rank(void) {
    dt_launch_env le;
    return dt_launch_env_read(&le) == DT_OK && le.rank >= 0 ? le.rank : 0;
}

int mpirun_child_world(void) {
    dt_launch_env le;
    return dt_launch_env_read(&le) == DT_OK && le.world >= 1 ? le.world : 1;
}

int mpirun_child_done_impl(int passed, int failed) {
    const char *dir = getenv(DIR_VAR);
    if (!dir)
        return 0;
    char path[PATH_MAX], tmp[PATH_MAX + 8];
    snprintf(path, sizeof path, "%s/rank.%d", dir, mpirun_child_rank());
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    if (f) {
        fprintf(f, "%d %d\n", passed, failed);
        fclose(f);
        rename(tmp, path); // the parent never reads half a report
    }
    fflush(NULL);
    return 0;
}

const char *mpirun_program(const char *name) {
    static char bin[PATH_MAX + 64];
    return test_program_path(name, bin, sizeof bin) ? bin : NULL;
}

static char *read_file(const char *path) {
    FILE *f = fopen(path, "r");
    if (!f)
        return strdup("");
    size_t cap = 1 << 16, len = 0, k;
    char  *buf = malloc(cap);
    while (buf && (k = fread(buf + len, 1, cap - len - 1, f)) > 0) {
        len += k;
        if (len + 1 >= cap)
            buf = realloc(buf, cap *= 2);
    }
    fclose(f);
    if (!buf)
        return strdup("");
    buf[len] = '\0';
    return buf;
}

static void print_tail(const char *out, size_t max_lines) {
    size_t      lines = 0;
    const char *p     = out + strlen(out);
    while (p > out && lines <= max_lines)
        if (*--p == '\n')
            lines++;
    fprintf(stderr, "     --- mpirun output (last %zu lines) ---\n%s\n     ---\n", max_lines,
            p == out ? p : p + 1);
}

static void remove_dir(const char *dir, int nranks) {
    char        f[PATH_MAX];
    const char *names[] = {"out.txt", "lsan.supp"};
    for (int i = 0; i < 2; i++) {
        snprintf(f, sizeof f, "%s/%s", dir, names[i]);
        unlink(f);
    }
    for (int r = 0; r < nranks; r++) {
        snprintf(f, sizeof f, "%s/rank.%d", dir, r);
        unlink(f);
        snprintf(f, sizeof f, "%s/rank.%d.tmp", dir, r);
        unlink(f);
    }
    rmdir(dir);
}

void mpirun_run_impl(const mpirun_opts *o, mpirun_result *res, int *passed, int *failed) {
    memset(res, 0, sizeof *res);
    res->exit_code = -1;
    int     nranks = o->np > 0 ? o->np : 1;
    int64_t limit  = o->timeout_ms ? o->timeout_ms : 120000;
    char    dir[]  = "/tmp/dtrain-mpirun-XXXXXX";
    if (!mkdtemp(dir)) {
        perror("mpirun: mkdtemp");
        (*failed)++;
        res->output = strdup("");
        return;
    }
    char out_path[PATH_MAX], supp_path[PATH_MAX], exe[PATH_MAX];
    snprintf(out_path, sizeof out_path, "%s/out.txt", dir);
    snprintf(supp_path, sizeof supp_path, "%s/lsan.supp", dir);
    ssize_t n          = readlink("/proc/self/exe", exe, sizeof exe - 1);
    exe[n > 0 ? n : 0] = '\0';
#ifdef DT_SANITIZE
    FILE *sf = fopen(supp_path, "w");
    if (sf) {
        fputs(lsan_suppressions, sf);
        fclose(sf);
    }
#endif

    const char *args[MAX_ARGS];
    int         na = 0;
    char        np[16];
    if (o->np > 0) {
        snprintf(np, sizeof np, "%d", o->np);
        args[na++] = "mpirun";
        args[na++] = "--allow-run-as-root";
        args[na++] = "--oversubscribe";
        args[na++] = "-np";
        args[na++] = np;
    }
    // Variables for the ranks: set in the child before exec (local ranks inherit
    // mpirun's environment), and named with -x as a remote launch would need.
    char names[16][64];
    int  nnames = 0;
    for (int i = 0; o->env && o->env[i] && nnames < 16; i++) {
        const char *eq = strchr(o->env[i], '=');
        snprintf(names[nnames], sizeof names[0], "%.*s", (int)(eq - o->env[i]), o->env[i]);
        if (o->np > 0 && na + 2 < MAX_ARGS) {
            args[na++] = "-x";
            args[na++] = names[nnames];
        }
        nnames++;
    }
    if (o->argv) {
        for (int i = 0; o->argv[i] && na + 1 < MAX_ARGS; i++)
            args[na++] = o->argv[i];
    } else {
        args[na++] = exe;
        args[na++] = "--mpirun-child";
        args[na++] = o->child;
    }
    args[na] = NULL;

    fflush(NULL);
    uint64_t t0  = dt_now_ns();
    pid_t    pid = fork();
    if (pid == 0) {
        setpgid(0, 0);
        int fd = open(out_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
        }
        // A launcher's variables of the test's own would take precedence over mpirun's.
        const char *drop[] = {"RANK",         "WORLD_SIZE",     "LOCAL_RANK", "LOCAL_WORLD_SIZE",
                              "MASTER_ADDR",  "MASTER_PORT",    "GROUP_RANK", "NODE_RANK",
                              "DT_JOB_TOKEN", "DT_TEST_BACKEND"};
        for (size_t i = 0; i < sizeof drop / sizeof drop[0]; i++)
            unsetenv(drop[i]);
        setenv(DIR_VAR, dir, 1);
        for (int i = 0; i < nnames; i++)
            setenv(names[i], strchr(o->env[i], '=') + 1, 1);
#ifdef DT_SANITIZE
        char lsan[PATH_MAX + 64];
        snprintf(lsan, sizeof lsan, "suppressions=%s:fast_unwind_on_malloc=0:print_suppressions=0",
                 supp_path);
        setenv("LSAN_OPTIONS", lsan, 1);
#endif
        char *argv_copy[MAX_ARGS]; // execvp wants non-const strings
        for (int i = 0; i <= na; i++)
            argv_copy[i] = args[i] ? strdup(args[i]) : NULL;
        execvp(argv_copy[0], argv_copy);
        fprintf(stderr, "mpirun: cannot run %s: %s\n", args[0], strerror(errno));
        _exit(127);
    }
    if (pid < 0) {
        perror("mpirun: fork");
        (*failed)++;
        res->output = strdup("");
        remove_dir(dir, nranks);
        return;
    }
    setpgid(pid, pid);
    uint64_t deadline = dt_deadline_ns(limit);
    int      st       = 0;
    for (;;) {
        pid_t p = waitpid(pid, &st, WNOHANG);
        if (p == pid)
            break;
        if (dt_now_ns() > deadline) {
            res->timed_out = true;
            kill(-pid, SIGTERM); // mpirun passes it on to its ranks
            uint64_t grace = dt_deadline_ns(5000);
            while (waitpid(pid, &st, WNOHANG) == 0 && dt_now_ns() < grace) {
                struct timespec ts = {0, 20 * 1000000L};
                nanosleep(&ts, NULL);
            }
            kill(-pid, SIGKILL);
            waitpid(pid, &st, 0);
            break;
        }
        struct timespec ts = {0, 5 * 1000000L};
        nanosleep(&ts, NULL);
    }
    res->secs         = (double)(dt_now_ns() - t0) * 1e-9;
    res->exit_code    = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    res->output       = read_file(out_path);
    int rank_failures = 0;
    for (int r = 0; r < nranks; r++) {
        char f[PATH_MAX];
        snprintf(f, sizeof f, "%s/rank.%d", dir, r);
        FILE *rf = fopen(f, "r");
        int   c[2];
        if (rf && fscanf(rf, "%d %d", &c[0], &c[1]) == 2) {
            *passed += c[0];
            *failed += c[1];
            rank_failures += c[1];
            res->reported++;
        }
        if (rf)
            fclose(rf);
    }
    remove_dir(dir, nranks);
    if (o->expect_failure)
        return;
    bool bad = res->timed_out || res->exit_code != 0 || res->reported != nranks;
    if (bad) {
        (*failed)++;
        fprintf(stderr, "FAIL mpirun -np %d %s: %s (exit %d, %d of %d ranks reported, %.1f s)\n",
                o->np, o->argv ? o->argv[0] : o->child,
                res->timed_out ? "did not finish in time, killed" : "failed", res->exit_code,
                res->reported, nranks, res->secs);
        print_tail(res->output, 40);
    } else if (rank_failures) {
        fprintf(stderr, "FAIL mpirun -np %d %s: %d checks failed in the ranks\n", o->np,
                o->argv ? o->argv[0] : o->child, rank_failures);
        print_tail(res->output, 40);
    }
}

void mpirun_result_free(mpirun_result *r) {
    free(r->output);
    r->output = NULL;
}
