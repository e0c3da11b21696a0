// test_dtrun_lib.h: what the dtrun tests share (static functions; included once per
// test binary).
//
// - The test binary is also the worker program: `test_x worker MODE DIR MARK ...`
//   (see worker_main), so a scenario needs no shell script and can record exactly what
//   each worker saw: its environment, its pid and its child's pid, its time of death.
// - run_dtrun starts build/bin/dtrun (of the same build variant) with stdout and
//   stderr in files, and waits with a deadline.
// - marker_procs scans the process table for processes whose command line holds a
//   scenario's marker: after every scenario there must be none.
#ifndef DTRAIN_TESTS_E2E_DTRUN_LIB_H
#define DTRAIN_TESTS_E2E_DTRUN_LIB_H

#include "../check.h"
#include "../lib/prog.h"

// Not every test binary uses every helper.
#define DTRUN_TEST_FN static __attribute__((unused))

#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static char self_path[PATH_MAX]; // this test binary (the worker program)
static char dtrun_path[PATH_MAX + 64];
static char mnist_path[PATH_MAX + 64] __attribute__((unused));
static char tmp_root[1024]; // scratch directory of this test run

DTRUN_TEST_FN double mono_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

DTRUN_TEST_FN void sleep_s(double s) {
    struct timespec ts = {.tv_sec = (time_t)s, .tv_nsec = (long)((s - (double)(time_t)s) * 1e9)};
    nanosleep(&ts, NULL);
}

// ------------------------------------------------------------------ files

DTRUN_TEST_FN void write_file(const char *path, const char *fmt, ...) {
    char    tmp[PATH_MAX + 16];
    va_list ap;
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    if (!f)
        return;
    va_start(ap, fmt);
    vfprintf(f, fmt, ap);
    va_end(ap);
    fclose(f);
    rename(tmp, path); // readers never see half a file
}

// The whole file as a malloc'd string ("" if missing).
DTRUN_TEST_FN char *read_file(const char *path) {
    FILE  *f   = fopen(path, "r");
    size_t cap = 4096, len = 0;
    char  *s = calloc(cap, 1);
    if (!f)
        return s;
    size_t k;
    while ((k = fread(s + len, 1, cap - len - 1, f)) > 0) {
        len += k;
        if (len + 1 >= cap)
            s = realloc(s, cap *= 2);
    }
    s[len] = '\0';
    fclose(f);
    return s;
}

DTRUN_TEST_FN bool file_exists(const char *path) {
    return access(path, F_OK) == 0;
}

DTRUN_TEST_FN long read_long(const char *path) {
    char *s = read_file(path);
    long  v = *s ? strtol(s, NULL, 10) : -1;
    free(s);
    return v;
}

DTRUN_TEST_FN int count_of(const char *hay, const char *needle) {
    int n = 0;
    for (const char *p = hay; (p = strstr(p, needle)); p++)
        n++;
    return n;
}

// A fresh directory under tmp_root.
DTRUN_TEST_FN void scenario_dir(char *out, size_t n, const char *name) {
    static int seq;
    snprintf(out, n, "%s/%s-%d", tmp_root, name, ++seq);
    mkdir(out, 0755);
}

// The value of NAME in an env dump written by the "env" worker; "" if absent.
DTRUN_TEST_FN void env_value(const char *dump, const char *name, char *out, size_t n) {
    out[0] = '\0';
    char key[128];
    snprintf(key, sizeof key, "\n%s=", name);
    const char *p = strstr(dump, key);
    if (!p)
        return;
    p += strlen(key);
    size_t len = strcspn(p, "\n");
    snprintf(out, n, "%.*s", (int)(len < n ? len : n - 1), p);
}

// ------------------------------------------------------------------ the worker
//
//   worker env DIR MARK                 dump the environment, print on both streams,
//                                       exit 0 leaving a child running
//   worker fail DIR MARK N VICTIM HOW   every rank records its pid and a child's; the
//                                       victim waits for all N ranks, then dies: HOW is
//                                       "exit3" or "kill9"; the others sleep
//   worker hang DIR MARK                record pids, sleep (for signals to dtrun)
//   worker deaf DIR MARK                the same, ignoring SIGTERM
//   worker stubborn DIR MARK N VICTIM   like fail/exit3, but the others ignore SIGTERM
//                                       and SIGINT
//   worker restart DIR MARK RANK UNTIL  rank RANK exits 1 while the restart count is
//                                       below UNTIL; everyone records the count

static const char *const env_names[] = {"RANK",
                                        "LOCAL_RANK",
                                        "WORLD_SIZE",
                                        "LOCAL_WORLD_SIZE",
                                        "GROUP_RANK",
                                        "GROUP_WORLD_SIZE",
                                        "ROLE_RANK",
                                        "ROLE_WORLD_SIZE",
                                        "MASTER_ADDR",
                                        "MASTER_PORT",
                                        "TORCHELASTIC_RESTART_COUNT",
                                        "TORCHELASTIC_MAX_RESTARTS",
                                        "TORCHELASTIC_RUN_ID",
                                        "DT_RESTART_COUNT",
                                        "DT_JOB_TOKEN",
                                        "OMP_NUM_THREADS",
                                        "DTRUN_TEST_INHERITED",
                                        NULL};

DTRUN_TEST_FN int env_rank(void) {
    const char *r = getenv("RANK");
    return r ? atoi(r) : -1;
}

DTRUN_TEST_FN void record_pids(const char *dir, int rank) {
    char  path[PATH_MAX + 64];
    pid_t child = fork();
    if (child == 0) { // a child of the worker: dtrun must stop it too
        for (int i = 0; i < 600; i++)
            sleep_s(0.1);
        _exit(0);
    }
    snprintf(path, sizeof path, "%s/cpid.%d", dir, rank);
    write_file(path, "%d\n", (int)child);
    snprintf(path, sizeof path, "%s/pid.%d", dir, rank);
    write_file(path, "%d\n", (int)getpid());
}

DTRUN_TEST_FN void wait_ranks(const char *dir, int n) {
    char path[PATH_MAX + 64];
    for (int tries = 0; tries < 3000; tries++) {
        int have = 0;
        for (int r = 0; r < n; r++) {
            snprintf(path, sizeof path, "%s/pid.%d", dir, r);
            have += file_exists(path);
        }
        if (have == n)
            return;
        sleep_s(0.01);
    }
}

DTRUN_TEST_FN int worker_main(int argc, char **argv) {
    if (argc < 5)
        return 100;
    const char *mode = argv[2], *dir = argv[3];
    int         rank = env_rank();
    char        path[PATH_MAX + 64];
    if (strcmp(mode, "env") == 0) {
        char   dump[8192] = "\n";
        size_t k          = 1;
        for (int i = 0; env_names[i]; i++) {
            const char *v = getenv(env_names[i]);
            if (v)
                k += (size_t)snprintf(dump + k, sizeof dump - k, "%s=%s\n", env_names[i], v);
        }
        snprintf(path, sizeof path, "%s/env.%d", dir, rank);
        write_file(path, "%s", dump);
        record_pids(dir, rank); // a child left running, holding the output pipes
        printf("hello from rank %d\n", rank);
        fflush(stdout);
        fprintf(stderr, "note from rank %d\n", rank);
        printf("unfinished line from rank %d", rank); // no newline: dtrun must still show it
        return 0;
    }
    if (strcmp(mode, "fail") == 0 || strcmp(mode, "stubborn") == 0) {
        if (argc < 7)
            return 100;
        int n = atoi(argv[5]), victim = atoi(argv[6]);
        if (strcmp(mode, "stubborn") == 0 && rank != victim) {
            signal(SIGTERM, SIG_IGN);
            signal(SIGINT, SIG_IGN);
        }
        record_pids(dir, rank);
        if (rank == victim) {
            wait_ranks(dir, n);
            printf("rank %d: first words\n", rank);
            printf("rank %d: about to fail\n", rank);
            fflush(stdout);
            snprintf(path, sizeof path, "%s/death", dir);
            write_file(path, "%.6f\n", mono_s());
            if (argc > 7 && strcmp(argv[7], "kill9") == 0)
                raise(SIGKILL);
            return 3;
        }
        for (int i = 0; i < 600; i++)
            sleep_s(0.1);
        return 0;
    }
    if (strcmp(mode, "hang") == 0 || strcmp(mode, "deaf") == 0) {
        if (mode[0] == 'd')
            signal(SIGTERM, SIG_IGN);
        record_pids(dir, rank);
        printf("rank %d: waiting\n", rank);
        fflush(stdout);
        for (int i = 0; i < 600; i++)
            sleep_s(0.1);
        return 0;
    }
    if (strcmp(mode, "restart") == 0) {
        if (argc < 7)
            return 100;
        int         bad = atoi(argv[5]), until = atoi(argv[6]);
        const char *rc  = getenv("DT_RESTART_COUNT");
        int         cnt = rc ? atoi(rc) : -1;
        snprintf(path, sizeof path, "%s/restart.%d", dir, rank);
        write_file(path, "%d\n", cnt);
        printf("rank %d: restart count %d\n", rank, cnt);
        fflush(stdout);
        if (rank == bad && cnt < until) {
            // Fail once every rank of this attempt has said its count (at most 10 s: a
            // loaded machine may start a rank late), so that the tests can read them all.
            const char *ws    = getenv("WORLD_SIZE");
            int         world = ws ? atoi(ws) : 1;
            for (double t0 = mono_s(); mono_s() - t0 < 10;) {
                int said = 0;
                for (int r = 0; r < world; r++) {
                    char p2[PATH_MAX + 32];
                    snprintf(p2, sizeof p2, "%s/restart.%d", dir, r);
                    said += read_long(p2) == cnt;
                }
                if (said == world)
                    break;
                sleep_s(0.01);
            }
            sleep_s(0.1);
            fprintf(stderr, "rank %d: failing on purpose\n", rank);
            return 1;
        }
        sleep_s(0.3);
        return 0;
    }
    return 100;
}

// ------------------------------------------------------------------ finding things

// This test binary (a worker program of its own) and the programs of its build variant.
DTRUN_TEST_FN bool find_bins(void) {
    ssize_t n = readlink("/proc/self/exe", self_path, sizeof self_path - 1);
    if (n <= 0)
        return false;
    self_path[n] = '\0';
    return test_program_path("dtrun", dtrun_path, sizeof dtrun_path) &&
           test_program_path("dtrain-mnist", mnist_path, sizeof mnist_path);
}

// Waits until files dir/prefix.0 .. dir/prefix.<n-1> all exist (workers drop them).
DTRUN_TEST_FN bool wait_files(const char *dir, const char *prefix, int n, double timeout_s) {
    double deadline = mono_s() + timeout_s;
    char   path[PATH_MAX + 32];
    while (mono_s() < deadline) {
        int have = 0;
        for (int i = 0; i < n; i++) {
            snprintf(path, sizeof path, "%s/%s.%d", dir, prefix, i);
            have += file_exists(path);
        }
        if (have == n)
            return true;
        sleep_s(0.01);
    }
    return false;
}

DTRUN_TEST_FN void make_tmp_root(const char *name) {
    const char *t = getenv("TMPDIR");
    snprintf(tmp_root, sizeof tmp_root, "%s/%s-%d", t && *t ? t : "/tmp", name, (int)getpid());
    mkdir(tmp_root, 0755);
}

DTRUN_TEST_FN void remove_tree(const char *path) {
    DIR *d = opendir(path);
    if (d) {
        struct dirent *e;
        while ((e = readdir(d))) {
            if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
                continue;
            char sub[PATH_MAX];
            snprintf(sub, sizeof sub, "%s/%s", path, e->d_name);
            remove_tree(sub);
        }
        closedir(d);
        rmdir(path);
    } else {
        unlink(path);
    }
}

// ------------------------------------------------------------------ running dtrun

typedef struct run {
    pid_t  pid;
    char   out_path[PATH_MAX], err_path[PATH_MAX];
    int    rc; // exit code, 128+signal, or -1 while running / after a timeout
    double start, end;
    char  *out, *err; // after run_wait
} run;

// Starts argv (NULL-terminated) with stdout/stderr in files under dir (named tag).
// extra_env: "NAME=value" strings set in the child only (NULL-terminated, or NULL).
DTRUN_TEST_FN void run_start(run *r, const char *dir, const char *tag, char *const *argv,
                             const char *const *extra_env) {
    memset(r, 0, sizeof *r);
    r->rc = -1;
    snprintf(r->out_path, sizeof r->out_path, "%s/%s.out", dir, tag);
    snprintf(r->err_path, sizeof r->err_path, "%s/%s.err", dir, tag);
    fflush(NULL);
    r->start = mono_s();
    r->pid   = fork();
    if (r->pid == 0) {
        int o = open(r->out_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        int e = open(r->err_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        dup2(o, 1);
        dup2(e, 2);
        for (int i = 0; extra_env && extra_env[i]; i++)
            putenv((char *)(uintptr_t)extra_env[i]);
        execv(argv[0], argv);
        _exit(127);
    }
}

// Waits up to timeout_s; on timeout kills it (SIGKILL) and leaves rc -1.
DTRUN_TEST_FN int run_wait(run *r, double timeout_s) {
    double deadline = mono_s() + timeout_s;
    int    status;
    for (;;) {
        pid_t p = waitpid(r->pid, &status, WNOHANG);
        if (p == r->pid) {
            r->rc = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
            break;
        }
        if (mono_s() > deadline) {
            kill(r->pid, SIGKILL);
            waitpid(r->pid, &status, 0);
            r->rc = -1;
            fprintf(stderr, "     dtrun (pid %d) did not finish within %.0f s: killed\n",
                    (int)r->pid, timeout_s);
            break;
        }
        sleep_s(0.002);
    }
    r->end = mono_s();
    r->out = read_file(r->out_path);
    r->err = read_file(r->err_path);
    return r->rc;
}

DTRUN_TEST_FN void run_free(run *r) {
    free(r->out);
    free(r->err);
    r->out = r->err = NULL;
}

// Shows a run's output after a failed check in a scenario.
DTRUN_TEST_FN void run_dump(const run *r, const char *what) {
    fprintf(stderr, "---- %s: exit %d\n---- stdout:\n%s\n---- stderr:\n%s\n----\n", what, r->rc,
            r->out ? r->out : "", r->err ? r->err : "");
}

// A TCP port that was free a moment ago (20000..32767, below the ephemeral range).
DTRUN_TEST_FN int free_port(void) {
    static unsigned seed;
    if (!seed)
        seed = (unsigned)getpid() * 2654435761u ^ (unsigned)time(NULL);
    for (int tries = 0; tries < 500; tries++) {
        int                port = 20000 + (int)(rand_r(&seed) % 12768);
        int                fd   = socket(AF_INET, SOCK_STREAM, 0);
        struct sockaddr_in a    = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
        a.sin_addr.s_addr       = htonl(INADDR_ANY);
        int ok                  = fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0;
        if (fd >= 0)
            close(fd);
        if (ok)
            return port;
    }
    return 29400;
}

// ------------------------------------------------------------------ scenarios

// Whether two files hold the same bytes (both must open).
static __attribute__((unused)) bool same_file(const char *a, const char *b) {
    FILE *fa = fopen(a, "rb"), *fb = fopen(b, "rb");
    bool  same = fa && fb;
    while (same) {
        int ca = fgetc(fa), cb = fgetc(fb);
        same = ca == cb;
        if (ca == EOF || cb == EOF)
            break;
    }
    if (fa)
        fclose(fa);
    if (fb)
        fclose(fb);
    return same;
}

// The CRC32C of the last "(CRC32C xxxxxxxx" in out (the attempt that finished); "" if none.
DTRUN_TEST_FN void crc_of(const char *out, char crc[16]) {
    const char *p = NULL, *q = out;
    while ((q = strstr(q, "(CRC32C ")))
        p = q++;
    crc[0] = '\0';
    if (p)
        sscanf(p, "(CRC32C %8s", crc);
}

// The uninterrupted run the elastic tests compare with: dtrain-mnist on 2 processes of
// `batch` samples, --invariant 4, --limit `limit`, its model saved to `model` (in a
// scenario folder "reference"); its CRC32C in crc ("" when it failed, dumped then).
DTRUN_TEST_FN bool fixed_reference(const char *limit, const char *batch, double wait_s,
                                   char crc[16], char *model, size_t model_n) {
    char dir[2048]; // tmp_root (1024) and a scenario's name: run_start's paths fit
    scenario_dir(dir, sizeof dir, "reference");
    snprintf(model, model_n, "%s/ref.model", dir);
    char *argv[] = {mnist_path,
                    "--num-processes",
                    "2",
                    "--limit",
                    (char *)(uintptr_t)limit,
                    "--batch-size",
                    (char *)(uintptr_t)batch,
                    "--invariant",
                    "4",
                    "--threads",
                    "1",
                    "--no-test",
                    "--save-model",
                    model,
                    NULL};
    run   ref;
    run_start(&ref, dir, "reference", argv, NULL);
    CHECK_EQ(run_wait(&ref, wait_s), 0);
    crc_of(ref.out, crc);
    if (!CHECK(crc[0] != '\0'))
        run_dump(&ref, "reference");
    run_free(&ref);
    return crc[0] != '\0';
}

// How often needle occurs in the stdout and stderr files of the runs (NULL entries
// skipped).
DTRUN_TEST_FN int count_in(run *const *rs, int n, const char *needle) {
    int c = 0;
    for (int i = 0; i < n; i++) {
        if (!rs[i])
            continue;
        char *o = read_file(rs[i]->out_path), *e = read_file(rs[i]->err_path);
        c += count_of(o, needle) + count_of(e, needle);
        free(o), free(e);
    }
    return c;
}

// Waits (polling each millisecond, at most timeout_s) until needle occurs `times` times
// in the runs' output; returns the seconds waited, or -1.
DTRUN_TEST_FN double wait_count(run *const *rs, int n, const char *needle, int times,
                                double timeout_s) {
    double t0 = mono_s();
    while (mono_s() - t0 < timeout_s) {
        if (count_in(rs, n, needle) >= times)
            return mono_s() - t0;
        sleep_s(0.001);
    }
    return -1;
}

static char mark[64];

DTRUN_TEST_FN void new_mark(const char *what) {
    static int seq;
    snprintf(mark, sizeof mark, "dtrun-test-%d-%s-%d", (int)getpid(), what, ++seq);
}

// argv for: dtrun FLAGS... SELF worker MODE DIR MARK EXTRA...
DTRUN_TEST_FN char **dtrun_argv(const char *const *flags, const char *mode, const char *dir,
                                const char *const *extra) {
    static char *v[64];
    int          k = 0;
    v[k++]         = dtrun_path;
    for (int i = 0; flags && flags[i]; i++)
        v[k++] = (char *)(uintptr_t)flags[i];
    v[k++] = self_path;
    v[k++] = "worker";
    v[k++] = (char *)(uintptr_t)mode;
    v[k++] = (char *)(uintptr_t)dir;
    v[k++] = mark;
    for (int i = 0; extra && extra[i]; i++)
        v[k++] = (char *)(uintptr_t)extra[i];
    v[k] = NULL;
    return v;
}

// ------------------------------------------------------------------ process table

// Pids of processes (other than this one) whose command line contains marker; returns
// how many (up to max in pids).
DTRUN_TEST_FN int marker_procs(const char *marker, int *pids, int max) {
    DIR *d = opendir("/proc");
    int  n = 0;
    if (!d)
        return 0;
    struct dirent *e;
    size_t         ml = strlen(marker);
    while ((e = readdir(d))) {
        int pid = atoi(e->d_name);
        if (pid <= 0 || pid == (int)getpid())
            continue;
        char path[64], buf[8192];
        snprintf(path, sizeof path, "/proc/%d/cmdline", pid);
        int fd = open(path, O_RDONLY);
        if (fd < 0)
            continue;
        ssize_t k = read(fd, buf, sizeof buf);
        close(fd);
        if (k > 0 && memmem(buf, (size_t)k, marker, ml)) {
            if (n < max)
                pids[n] = pid;
            n++;
        }
    }
    closedir(d);
    return n;
}

// True when no process holds the marker, waiting up to wait_s for stragglers to be
// reaped; prints what is left otherwise (and kills it, so later scenarios start clean).
DTRUN_TEST_FN bool no_marker_procs(const char *marker, double wait_s) {
    double deadline = mono_s() + wait_s;
    int    pids[64], n;
    while ((n = marker_procs(marker, pids, 64)) > 0 && mono_s() < deadline)
        sleep_s(0.01);
    for (int i = 0; i < n && i < 64; i++) {
        char path[64];
        snprintf(path, sizeof path, "/proc/%d/cmdline", pids[i]);
        char *c = read_file(path);
        for (char *p = c; p < c + 200 && *p; p += strlen(p) + 1)
            if (p[strlen(p) + 1])
                p[strlen(p)] = ' ';
        fprintf(stderr, "     left behind: pid %d: %s\n", pids[i], c);
        free(c);
        kill(pids[i], SIGKILL);
    }
    return n == 0;
}

DTRUN_TEST_FN bool pid_alive(int pid) {
    if (pid <= 0)
        return false;
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/stat", pid);
    char *s = read_file(path);
    // A zombie ("Z") has ended; it only waits for its parent to reap it.
    const char *p     = strrchr(s, ')');
    bool        alive = *s && !(p && p[1] == ' ' && p[2] == 'Z');
    free(s);
    return alive;
}

// Whether the process whose pid the file `path` holds (written by that process) is
// still alive: the pid, unless the process now under it started after the file was
// written (pids are reused, and with pid_max 32768 a busy machine reuses them within
// seconds: such a process is another one).
DTRUN_TEST_FN bool pid_file_alive(const char *path) {
    int         pid = (int)read_long(path);
    struct stat st;
    if (!pid_alive(pid) || stat(path, &st) != 0)
        return false;
    char sp[64];
    snprintf(sp, sizeof sp, "/proc/%d/stat", pid);
    char     *s = read_file(sp), *p = strrchr(s, ')');
    long long start_ticks = -1;
    for (int field = 2; p && *p && field < 22; field++) // field 22: starttime, in ticks
        p = strchr(p + 1, ' ');
    if (p)
        start_ticks = atoll(p + 1);
    free(s);
    char     *ps = read_file("/proc/stat"), *bt = strstr(ps, "btime ");
    long long boot = bt ? atoll(bt + 6) : 0;
    free(ps);
    if (start_ticks < 0 || boot <= 0)
        return true; // unknown: count it as alive
    double started = (double)boot + (double)start_ticks / (double)sysconf(_SC_CLK_TCK);
    return started <= (double)st.st_mtime + 1.0; // btime and ticks are coarse
}

// Pid of dtrun's worker of the given rank (a child of dtrun with RANK=<rank>).
DTRUN_TEST_FN int worker_pid(int dtrun_pid, int rank) {
    DIR           *d     = opendir("/proc");
    int            found = -1;
    char           want[32];
    int            wl = snprintf(want, sizeof want, "RANK=%d", rank) + 1; // with its NUL
    struct dirent *e;
    while (d && found < 0 && (e = readdir(d))) {
        int pid = atoi(e->d_name);
        if (pid <= 0)
            continue;
        char path[64];
        snprintf(path, sizeof path, "/proc/%d/stat", pid);
        char       *st   = read_file(path);
        const char *rp   = strrchr(st, ')');
        int         ppid = 0;
        if (rp)
            sscanf(rp + 2, "%*c %d", &ppid);
        free(st);
        if (ppid != dtrun_pid)
            continue;
        snprintf(path, sizeof path, "/proc/%d/environ", pid);
        int     fd = open(path, O_RDONLY);
        char    buf[65536];
        ssize_t k = fd >= 0 ? read(fd, buf, sizeof buf) : -1;
        if (fd >= 0)
            close(fd);
        for (ssize_t i = 0; k > 0 && i + wl <= k; i++)
            if ((i == 0 || buf[i - 1] == '\0') && memcmp(buf + i, want, (size_t)wl) == 0) {
                found = pid;
                break;
            }
    }
    if (d)
        closedir(d);
    return found;
}

#endif // DTRAIN_TESTS_E2E_DTRUN_LIB_H
