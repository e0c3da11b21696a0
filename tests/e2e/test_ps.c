// test_ps.c: the parameter server (--ps N, --ps-staleness K, docs/ps.md) through
// dtrain-mnist as a user runs it. K = 0 (synchronous) is what every test but the
// asynchronous ones runs, so its bitwise results below are K = 0's.
//
// - W workers and N servers end with the model of W processes under all-reduce. The
//   bound, from the summation order: a server sums the workers' slices in worker order
//   ((g0 + g1) + g2 ...) and divides by W, as the all-reduce's AVG does after its sum;
//   with W = 2 both add the same two floats once, and the optimizer (Adadelta) is
//   elementwise, so the models are bitwise equal whatever N. With W = 3 the all-reduce
//   adds in its own order, so each step's mean may differ by one rounding of the sum
//   (2 ulp of sum |g_i|): checked within 1e-5 relative L2 over 4 steps (measured 0,
//   bitwise equal: comm's order for 3 ranks is also (g0 + g1) + g2).
// - The same with the ranks launched by dtrun (servers like workers) over tcp.
// - Checkpoints hold the servers' optimizer state: a resume is bitwise the straight run.
// - Refusals: no group, as many servers as ranks, --zero.
// - A SIGTERM to the job stops it at an agreed step with code 75, servers included.
// - A server killed with SIGKILL is named by the workers ("rank 2 died") and the job
//   ends within 10 s; one stopped with SIGSTOP (silent) is named as unreachable within
//   the liveness bound (DT_LIVENESS_MS, 5 s) plus 7 s of slack for a loaded machine
//   (sanitizer builds: 20 s more on each bound). Asynchronous (K = 2): killed, named alike.
// - Asynchronous: the staleness bound held and reached, the loss falling (test_async_bound);
//   a bad K or one without --ps refused.
#include "../check.h"
#include "../lib/mnist.h"
#include "../lib/prog.h"
#include "dtrain/ckpt.h"
#include "dtrain/nn.h"

#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static char bin[PATH_MAX + 64], dtrun[PATH_MAX + 64];

// Sanitizer builds run several times slower: their bounds get this much slack (s).
#ifdef DT_SANITIZE
#define SLACK   20.0
#define SLOW_MS 400 // a step takes 100-300 ms there: 60 ms of delay left the fast worker 1 ahead
#else
#define SLACK   0.0
#define SLOW_MS 60
#endif
static char dir[] = "/tmp/dt-ps-XXXXXX";

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

// Loads a saved model's parameters (malloc'd; NULL on failure).
static float *load_params(const char *path, size_t *n) {
    dt_model *m      = NULL;
    float    *params = NULL;
    CHECK_OK(mnist_convnet_new(&m, 0, 0.10f, 0.25f));
    if (m && CHECK(dt_ckpt_load_model(path, m) == DT_OK)) {
        *n     = dt_model_num_params(m);
        params = malloc(sizeof(float) * *n);
        if (params)
            memcpy(params, dt_model_params(m), sizeof(float) * *n);
    }
    dt_model_free(m);
    unlink(path);
    return params;
}

// Trains 4 steps of 64 samples per worker on `procs` processes, `ps` of them servers
// (launched by --num-processes, or with `by_dtrun` by dtrun over tcp); the saved model's
// parameters in *params (malloc'd; NULL when the run failed).
static float *train_by(int procs, int ps, bool by_dtrun, size_t *n) {
    char path[PATH_MAX], *out = NULL;
    int  workers = procs - ps;
    snprintf(path, sizeof path, "%s/p%d-s%d.dtm", dir, procs, ps);
    char launch[3 * PATH_MAX];
    if (by_dtrun)
        snprintf(launch, sizeof launch, "%s --nproc-per-node %d %s --backend tcp", dtrun, procs,
                 bin);
    else
        snprintf(launch, sizeof launch, "%s --num-processes %d", bin, procs);
    int rc = test_run(&out,
                      "%s --limit %d --batch-size 64 --ps %d --threads 1 --no-test "
                      "--save-model %s 2>&1",
                      launch, 4 * 64 * workers, ps, path);
    if (!CHECK(rc == 0))
        fprintf(stderr, "%s\n", out ? out : "");
    if (ps)
        CHECK(out && strstr(out, "Parameter server: ") != NULL);
    free(out);
    if (rc != 0) {
        unlink(path);
        return NULL;
    }
    return load_params(path, n);
}

static float *train(int procs, int ps, size_t *n) {
    return train_by(procs, ps, false, n);
}

static double rel_l2(const float *a, const float *b, size_t n) {
    double d = 0, s = 0;
    for (size_t i = 0; i < n; i++) {
        double e = (double)a[i] - (double)b[i];
        d += e * e, s += (double)a[i] * (double)a[i];
    }
    return s > 0 ? sqrt(d / s) : sqrt(d);
}

static void compare(const char *what, const float *a, const float *b, size_t n, bool bitwise,
                    double max_rel) {
    if (!CHECK(a && b))
        return;
    bool   same = memcmp(a, b, sizeof(float) * n) == 0;
    double rel  = rel_l2(a, b, n);
    printf("  %s: relative L2 %.3g%s\n", what, rel, same ? " (bitwise equal)" : "");
    if (bitwise)
        CHECK(same);
    CHECK(rel <= max_rel);
}

static void test_sync_equals_all_reduce(void) {
    size_t n = 0, n1 = 0, n2 = 0;
    float *ar = train(2, 0, &n), *ps1 = train(3, 1, &n1), *ps2 = train(4, 2, &n2);
    CHECK_EQ(n, n1);
    CHECK_EQ(n, n2);
    compare("2 workers + 1 server vs 2 ranks all-reduce", ar, ps1, n, true, 0);
    compare("2 workers + 2 servers vs 2 ranks all-reduce", ar, ps2, n, true, 0);
    float *tcp = train_by(3, 1, true, &n1); // servers launched by dtrun, over tcp
    compare("dtrun: 2 workers + 1 server over tcp vs 2 ranks all-reduce", ar, tcp, n, true, 0);
    free(ar), free(ps1), free(ps2), free(tcp);
    float *ar3 = train(3, 0, &n), *ps3 = train(4, 1, &n1);
    compare("3 workers + 1 server vs 3 ranks all-reduce", ar3, ps3, n, false, 1e-5);
    free(ar3), free(ps3);
}

// Checkpoints hold the servers' optimizer state: 8 steps straight against 4, a
// checkpoint, and a resume for the other 4 (Adadelta's averages matter: without the
// state the resumed model differs), bitwise equal.
static void test_resume(void) {
    char        a[PATH_MAX], b[PATH_MAX], ck[PATH_MAX], *out = NULL;
    const char *run = "--limit 1024 --batch-size 64 --num-processes 3 --ps 1 --threads 1 "
                      "--no-test";
    snprintf(a, sizeof a, "%s/straight.dtm", dir);
    snprintf(b, sizeof b, "%s/resumed.dtm", dir);
    snprintf(ck, sizeof ck, "%s/ck", dir);
    int rc = test_run(&out, "%s %s --save-model %s 2>&1", bin, run, a);
    CHECK(rc == 0);
    free(out);
    rc = test_run(&out, "%s %s --checkpoint-dir %s --max-steps 4 2>&1", bin, run, ck);
    CHECK(rc == 0);
    free(out);
    rc = test_run(&out, "%s %s --checkpoint-dir %s --resume --save-model %s 2>&1", bin, run, ck, b);
    if (!CHECK(rc == 0 && out && strstr(out, "resumed from")))
        fprintf(stderr, "%s\n", out ? out : "");
    free(out);
    size_t n = 0, n2 = 0;
    float *x = load_params(a, &n), *y = load_params(b, &n2);
    CHECK_EQ(n, n2);
    compare("8 steps vs 4 + a resume for 4", x, y, n, true, 0);
    free(x), free(y);
    test_run(&out, "rm -rf '%s'", ck); // the test's own folder
    free(out);
}

static void refused(const char *flags, const char *needle) {
    char *out = NULL;
    int   rc  = test_run(&out, "%s --limit 128 --no-test %s 2>&1", bin, flags);
    CHECK(rc != 0);
    if (!CHECK(out && strstr(out, needle)))
        fprintf(stderr, "%s: expected \"%s\" in:\n%s\n", flags, needle, out ? out : "");
    free(out);
}

static void test_refusals(void) {
    refused("--ps 1", "--ps 1: expected a group");
    refused("--num-processes 2 --ps 2", "expected fewer servers than the 2 ranks");
    refused("--num-processes 3 --ps 1 --zero 1", "--ps 1: expected --zero 0");
    refused("--num-processes 3 --ps 1 --ps-staleness -1",
            "--ps-staleness expects an integer in [0, 1000000], found \"-1\"");
    refused("--num-processes 3 --ps-staleness 2", "--ps-staleness 2: expected --ps N with it");
}

// Starts a long run of 2 workers and a server with its output in `log`; returns the pid
// of the program (the parent of the forked ranks), or -1.
static pid_t start_long_run(const char *log, const char *staleness) {
    pid_t pid = fork();
    if (pid == 0) {
        setpgid(0, 0); // its own group: the test can end everything it started
        int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        if (fd < 0)
            _exit(127);
        dup2(fd, 1), dup2(fd, 2);
        execl(bin, bin, "--limit", "60000", "--batch-size", "64", "--num-processes", "3", "--ps",
              "1", "--ps-staleness", staleness, "--threads", "1", "--log-every", "1", "--no-test",
              (char *)NULL);
        _exit(127);
    }
    return pid;
}

// Whether `log` contains `needle` (read whole; small).
static bool log_has(const char *log, const char *needle) {
    FILE *f = fopen(log, "r");
    if (!f)
        return false;
    static char buf[1 << 16];
    size_t      k = fread(buf, 1, sizeof buf - 1, f);
    buf[k]        = '\0';
    fclose(f);
    return strstr(buf, needle) != NULL;
}

// The third child of `pid` (fork order: rank 2, the server), or -1.
static pid_t server_of(pid_t pid) {
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/task/%d/children", (int)pid, (int)pid);
    FILE *f    = fopen(path, "r");
    int   c[3] = {-1, -1, -1}, k = 0;
    if (f) {
        while (k < 3 && fscanf(f, "%d", &c[k]) == 1)
            k++;
        fclose(f);
    }
    return k == 3 ? (pid_t)c[2] : -1;
}

// Kills the server with `sig` once training is under way; the job must fail within
// `bound` seconds, its output naming the server with `needle`.
static void server_lost(int sig, const char *needle, double bound, const char *staleness) {
    char log[PATH_MAX];
    snprintf(log, sizeof log, "%s/run.log", dir);
    pid_t pid = start_long_run(log, staleness);
    if (!CHECK(pid > 0))
        return;
    double t0 = now();
    while (!log_has(log, "epoch: 0 [3/") && now() - t0 < 30) // a few steps: all ranks in
        usleep(50 * 1000);
    pid_t srv = server_of(pid);
    CHECK(srv > 0);
    double killed = now();
    if (srv > 0)
        kill(srv, sig);
    int   st = 0;
    pid_t w  = 0;
    while ((w = waitpid(pid, &st, WNOHANG)) == 0 && now() - killed < bound + 20)
        usleep(50 * 1000);
    double took = now() - killed;
    if (w == 0) { // still running past the bound: end what this test started
        kill(-pid, SIGKILL);
        waitpid(pid, &st, 0);
    }
    if (sig == SIGSTOP && srv > 0)
        kill(srv, SIGKILL);
    printf("  server %s: the job ended %.2f s later (bound %.0f s)\n",
           sig == SIGKILL ? "killed (SIGKILL)" : "stopped (SIGSTOP)", took, bound);
    CHECK(w == pid && WIFEXITED(st) && WEXITSTATUS(st) != 0);
    CHECK(took <= bound);
    if (!CHECK(log_has(log, needle)))
        fprintf(stderr, "expected \"%s\" in %s\n", needle, log);
    unlink(log);
}

static void test_server_killed(void) {
    server_lost(SIGKILL, "rank 2 died", 10 + SLACK, "0");
    server_lost(SIGKILL, "rank 2 died", 10 + SLACK, "2"); // asynchronous: named alike
}

static void test_server_stopped(void) {
    server_lost(SIGSTOP, "rank 2 (host", 12 + SLACK, "0");
}

// A SIGTERM to the job (the parent forwards it to every rank, as dtrun does): the
// workers agree on a step to stop at, the server waits for them, and the job ends with
// the preemption's code (75) within 20 s.
static void test_sigterm(void) {
    char log[PATH_MAX];
    snprintf(log, sizeof log, "%s/term.log", dir);
    pid_t pid = start_long_run(log, "0");
    if (!CHECK(pid > 0))
        return;
    double t0 = now();
    while (!log_has(log, "epoch: 0 [3/") && now() - t0 < 30)
        usleep(50 * 1000);
    kill(pid, SIGTERM);
    double sent = now();
    int    st   = 0;
    pid_t  w    = 0;
    while ((w = waitpid(pid, &st, WNOHANG)) == 0 && now() - sent < 20 + SLACK)
        usleep(50 * 1000);
    if (w == 0) {
        kill(-pid, SIGKILL);
        waitpid(pid, &st, 0);
    }
    printf("  SIGTERM: the job ended %.2f s later\n", now() - sent);
    CHECK(w == pid && WIFEXITED(st) && WEXITSTATUS(st) == 75);
    if (!CHECK(log_has(log, "Stopped by SIGTERM at step")))
        fprintf(stderr, "expected the stop in %s\n", log);
    unlink(log);
}

// Asynchronous, K = 2, worker 1 slowed by SLOW_MS a step (DT_PS_SLOW_WORKER): the server's
// log of every applied push (worker, step, the slowest worker's pushes applied) shows no
// push more than K steps ahead of the slowest (false if the bound were not enforced) and
// one exactly K ahead (false if the workers still ran in step, as the per-step SIGTERM
// agreement made them); every push applied once (2 x 24); a hold, when one is logged (how
// often depends on the machine's load), naming whom it waits for; the loss falls and is finite; the
// workers end with one model, settled once each (a barrier and a pull at the epoch's end,
// which the replica check after it skips: twice each if it did not).
static void test_async_bound(void) {
#ifdef DT_SANITIZE // 400 ms a step puts the fast worker K ahead within a few steps
    enum { K = 2, STEPS = 12 };
#else
    enum { K = 2, STEPS = 24 };
#endif
    char *out = NULL;
    int   rc  = test_run(&out,
                         "DT_LOG_LEVEL=debug DT_PS_SLOW_WORKER=1:%d %s --num-processes 3 --ps 1 "
                            "--ps-staleness %d --limit %d --batch-size 64 --threads 1 --log-every 4 "
                            "--no-test 2>&1",
                         SLOW_MS, bin, K, STEPS * 2 * 64);
    if (!CHECK(rc == 0 && out))
        fprintf(stderr, "%s\n", out ? out : "");
    if (!out)
        return;
    int    applied = 0, worst = -1, bad = 0;
    double first = NAN, last = NAN;
    for (char *l = out; l && *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL) {
        const char *a = strstr(l, "applied worker ");
        const char *e = strchr(l, '\n');
        int         w, m, k;
        long long   step, done;
        if (a && (!e || a < e) &&
            sscanf(a, "applied worker %d's step %lld (slowest: worker %d, %lld applied; bound %d)",
                   &w, &step, &m, &done, &k) == 5) {
            applied++;
            int ahead = (int)(step - done);
            worst     = ahead > worst ? ahead : worst;
            bad += ahead > K || k != K;
        }
        const char *s = strstr(l, "training loss: ");
        double      v;
        if (s && (!e || s < e) && sscanf(s, "training loss: %lf", &v) == 1) {
            if (isnan(first))
                first = v;
            last = v;
        }
    }
    printf("  async K=%d: %d pushes applied, at most %d steps ahead of the slowest; loss %.3f -> "
           "%.3f\n",
           K, applied, worst, first, last);
    CHECK_EQ(applied, 2 * STEPS);
    CHECK_EQ(bad, 0);
    CHECK_EQ(worst, K);
    const char *hold = strstr(out, "holds worker "); // how often depends on the load
    CHECK(!hold || (strstr(hold, "holds worker 0 before its step") &&
                    strstr(hold, "waiting for worker 1's next push")));
    CHECK(isfinite(first) && isfinite(last) && last < first);
    CHECK(strstr(out, "Parameters identical on all 2 ranks") != NULL);
    CHECK(strstr(out, "asynchronous, staleness 2") != NULL);
    int settles = 0;
    for (const char *l = out; (l = strstr(l, "settling the workers' model")) != NULL; l++)
        settles++;
    printf("  async K=%d: %d settles on 2 workers\n", K, settles);
    CHECK_EQ(settles, 2);
    free(out);
}

int main(void) {
#ifdef DT_SANITIZE // evaluations on 1,000 test images: no check here depends on the split's size
    CHECK(tl_fmnist_short_test(1000));
#endif
    if (!CHECK(test_program_path("dtrain-mnist", bin, sizeof bin))) {
        fprintf(stderr, "dtrain-mnist not found next to the tests (make programs)\n");
        return check_summary();
    }
    if (!CHECK(test_program_path("dtrun", dtrun, sizeof dtrun)))
        return check_summary();
    if (!CHECK(mkdtemp(dir) != NULL))
        return check_summary();
    RUN(test_sync_equals_all_reduce);
    RUN(test_resume);
    RUN(test_refusals);
    RUN(test_async_bound);
    RUN(test_server_killed);
    RUN(test_server_stopped);
    RUN(test_sigterm);
    rmdir(dir);
    return check_summary();
}
