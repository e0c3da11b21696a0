// test_mnist_preempt.c: SIGTERM, the notice a scheduler sends before it takes the
// machine, in real processes on a few real Fashion-MNIST samples.
//
// - One process: SIGTERM mid-run stops it at a step boundary with exit status 75 and a
//   checkpoint of that step; --resume then ends bitwise equal to an uninterrupted run.
// - --num-processes 2, SIGTERM to local rank 1 only: both ranks agree on the stop step
//   (rank 0, which got no signal, says where it stopped), exit 75, and the resumed job
//   ends bitwise equal to an uninterrupted one.
// - SIGTERM to the parent of --num-processes 2: forwarded, the same clean stop.
// - Two dtrun nodes, SIGTERM to node 0's dtrun: every rank of both nodes stops at the
//   same step, and the resume is bitwise equal again.
// - Before the training loop (a rank waiting for its peers), SIGTERM still ends the
//   process at once.
// - dtrun --max-restarts 3: SIGTERM to dtrun is forwarded, the workers save and stop,
//   dtrun exits 75 like them without a restart, and the resume is bitwise equal again; a
//   SIGTERM to one of dtrun's workers ends the job with 75, without a restart either,
//   also in the worker's first moments (before its program takes SIGTERM as a stop
//   request, when the signal simply ends it): a preemption every time, never a crash.
#include "../check.h"
#include "../lib/mnist.h"
#include "../lib/mp.h"
#include "../lib/prog.h"
#include "dtrain/ckpt.h"
#include "dtrain/nn.h"

#include <dirent.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static char bin[PATH_MAX + 64], dtrun[PATH_MAX + 64], tmp[128];
#ifdef DT_SANITIZE // half the samples: the same stops and resumes in half the time
#define STEPS 64
#define LIMIT "512"
#define FIRST "epoch: 0 [0/16 " // the first line of an epoch of 2 ranks
#else
#define STEPS 128
#define LIMIT "1024"
#define FIRST "epoch: 0 [0/32 "
#endif
static const char common[] =
    "--limit " LIMIT " --batch-size 16 --epochs 2 --threads 1 --seed 3 --no-test --log-every 1";

static void sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

// Starts "prefix... bin common extra" with its output in `log`; returns the pid.
static pid_t start(const char *log, const char *prefix, const char *extra) {
    char line[3 * PATH_MAX], *argv[64];
    int  n = 0;
    snprintf(line, sizeof line, "%s %s %s %s", prefix, bin, common, extra);
    for (char *save, *t = strtok_r(line, " ", &save); t && n < 63; t = strtok_r(NULL, " ", &save))
        argv[n++] = t;
    argv[n]   = NULL;
    pid_t pid = fork();
    if (pid == 0) {
        int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        dup2(fd, 1);
        dup2(fd, 2);
        setpgid(0, 0); // the test's own process group stays out of any group signal
        execv(argv[0], argv);
        _exit(127);
    }
    return pid;
}

static char *slurp(const char *path) {
    FILE *f   = fopen(path, "r");
    char *buf = calloc(1 << 20, 1);
    if (f && buf) {
        size_t k = fread(buf, 1, (1 << 20) - 1, f);
        buf[k]   = '\0';
        fclose(f);
    }
    return buf;
}

// Waits (bounded) until `log` holds `needle`.
static bool wait_for(const char *log, const char *needle) {
    for (int i = 0; i < 1200; i++) {
        char *s  = slurp(log);
        bool  ok = s && strstr(s, needle);
        free(s);
        if (ok)
            return true;
        sleep_ms(25);
    }
    return false;
}

// Exit status (128+N for signal N), waiting at most 120 s.
static int finish(pid_t pid) {
    int st;
    for (int i = 0; i < 12000; i++) {
        pid_t r = waitpid(pid, &st, WNOHANG);
        if (r == pid)
            return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        sleep_ms(10);
    }
    kill(pid, SIGKILL);
    waitpid(pid, &st, 0);
    return -1;
}

static int run(const char *log, const char *prefix, const char *extra) {
    return finish(start(log, prefix, extra));
}

// The i-th child process of pid whose command is `comm` (-1 if none).
static pid_t child_of(pid_t pid, const char *comm, int which) {
    char path[128], buf[4096] = "";
    snprintf(path, sizeof path, "/proc/%d/task/%d/children", pid, pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    size_t k = fread(buf, 1, sizeof buf - 1, f);
    buf[k]   = '\0';
    fclose(f);
    int   seen = 0;
    char *save;
    for (char *t = strtok_r(buf, " \n", &save); t; t = strtok_r(NULL, " \n", &save)) {
        char name[64] = "";
        snprintf(path, sizeof path, "/proc/%s/comm", t);
        FILE *c = fopen(path, "r");
        if (c) {
            if (fgets(name, sizeof name, c))
                name[strcspn(name, "\n")] = '\0';
            fclose(c);
        }
        if (strcmp(name, comm) == 0 && seen++ == which)
            return (pid_t)atoi(t);
    }
    return -1;
}

static bool same_model(const char *a, const char *b) {
    dt_model *x = NULL, *y = NULL;
    bool      same = false;
    if (!mnist_convnet_new(&x, 99, 0.1f, 0.25f) && !mnist_convnet_new(&y, 98, 0.1f, 0.25f) &&
        !dt_ckpt_load_model(a, x) && !dt_ckpt_load_model(b, y))
        same = memcmp(dt_model_params(x), dt_model_params(y), dt_model_num_params(x) * 4) == 0;
    dt_model_free(x);
    dt_model_free(y);
    return same;
}

// The step of "Stopped by SIGTERM at step N" in log (-1 if absent), and how often it is said.
static long stopped_at(const char *log, int *times) {
    char *s    = slurp(log);
    long  step = -1;
    *times     = 0;
    for (const char *p = s; p && (p = strstr(p, "Stopped by SIGTERM at step ")); p++) {
        step = atol(p + strlen("Stopped by SIGTERM at step "));
        (*times)++;
    }
    free(s);
    return step;
}

static bool has_checkpoint(const char *dir, long step) {
    char        path[512];
    struct stat st;
    snprintf(path, sizeof path, "%s/step-%06ld", dir, step);
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

static bool log_has(const char *log, const char *needle) {
    char *s  = slurp(log);
    bool  ok = s && strstr(s, needle);
    free(s);
    return ok;
}

static int count(const char *log, const char *needle) {
    char *s = slurp(log);
    int   n = 0;
    for (const char *p = s; p && (p = strstr(p, needle)); p++)
        n++;
    free(s);
    return n;
}

static char straight1[256], straight2[256];

static void straight_runs(void) {
    char log[256], extra[512];
    snprintf(log, sizeof log, "%s/straight.log", tmp);
    snprintf(straight1, sizeof straight1, "%s/straight1.dtck", tmp);
    snprintf(straight2, sizeof straight2, "%s/straight2.dtck", tmp);
    snprintf(extra, sizeof extra, "--save-model %s", straight1);
    CHECK_EQ(run(log, "", extra), 0);
    snprintf(extra, sizeof extra, "--num-processes 2 --save-model %s", straight2);
    CHECK_EQ(run(log, "", extra), 0);
}

// Resumes `dir` with `launch` to the end and compares with `want`.
static void resume_and_compare(const char *dir, const char *launch, const char *want) {
    char log[256], extra[1024], model[256];
    snprintf(log, sizeof log, "%s/resume.log", tmp);
    snprintf(model, sizeof model, "%s/resumed.dtck", tmp);
    snprintf(extra, sizeof extra, "%s --checkpoint-dir %s --resume --save-model %s", launch, dir,
             model);
    CHECK_EQ(run(log, "", extra), 0);
    CHECK(log_has(log, "resumed from "));
    CHECK(same_model(model, want));
    unlink(model);
}

static void test_one_process(void) {
    char log[256], dir[256], extra[512];
    snprintf(log, sizeof log, "%s/one.log", tmp);
    snprintf(dir, sizeof dir, "%s/one", tmp);
    snprintf(extra, sizeof extra, "--checkpoint-dir %s", dir);
    pid_t pid = start(log, "", extra);
    CHECK(wait_for(log, "epoch: 0 [8/"));
    kill(pid, SIGTERM);
    CHECK_EQ(finish(pid), 75);
    int  times;
    long step = stopped_at(log, &times);
    CHECK_EQ(times, 1);
    CHECK(step >= 9 && step < STEPS); // LIMIT / 16 steps an epoch, 2 epochs
    CHECK(has_checkpoint(dir, step));
    CHECK(log_has(log, "run again with --resume"));
    CHECK(!log_has(log, "Finished training"));
    resume_and_compare(dir, "", straight1);
}

static void test_two_processes_one_signalled(void) {
    char log[256], dir[256], extra[512];
    snprintf(log, sizeof log, "%s/two.log", tmp);
    snprintf(dir, sizeof dir, "%s/two", tmp);
    snprintf(extra, sizeof extra, "--num-processes 2 --checkpoint-dir %s", dir);
    pid_t pid = start(log, "", extra);
    CHECK(wait_for(log, "epoch: 0 [5/"));
    pid_t rank1 = child_of(pid, "dtrain-mnist", 1);
    CHECK(rank1 > 0);
    if (rank1 > 0)
        kill(rank1, SIGTERM); // rank 1 only: rank 0 learns it from the agreement
    CHECK_EQ(finish(pid), 75);
    int  times;
    long step = stopped_at(log, &times);
    CHECK_EQ(times, 1); // said by rank 0, which got no signal
    CHECK(step >= 6 && step < STEPS / 2);
    CHECK(has_checkpoint(dir, step));
    CHECK(!log_has(log, "exited with code")); // a stop, not a failure
    resume_and_compare(dir, "--num-processes 2", straight2);

    // SIGTERM to the parent: forwarded to both workers.
    snprintf(log, sizeof log, "%s/parent.log", tmp);
    snprintf(dir, sizeof dir, "%s/parent", tmp);
    snprintf(extra, sizeof extra, "--num-processes 2 --checkpoint-dir %s", dir);
    pid = start(log, "", extra);
    CHECK(wait_for(log, "epoch: 0 [5/"));
    kill(pid, SIGTERM);
    CHECK_EQ(finish(pid), 75);
    step = stopped_at(log, &times);
    CHECK_EQ(times, 1);
    CHECK(step >= 6 && step < STEPS / 2 && has_checkpoint(dir, step));
}

static void test_dtrun(void) {
    char log[256], dir[256], extra[512], prefix[PATH_MAX + 128];
    snprintf(log, sizeof log, "%s/dtrun.log", tmp);
    snprintf(dir, sizeof dir, "%s/dtrun", tmp);
    snprintf(prefix, sizeof prefix, "%s --nproc-per-node 2 --max-restarts 3", dtrun);
    snprintf(extra, sizeof extra, "--checkpoint-dir %s", dir);
    pid_t pid = start(log, prefix, extra);
    CHECK(wait_for(log, "epoch: 0 [5/"));
    kill(pid, SIGTERM);
    CHECK_EQ(finish(pid), 75); // as its workers: stopped cleanly, run again to continue
    int  times;
    long step = stopped_at(log, &times);
    CHECK_EQ(times, 1);
    CHECK(step >= 6 && step < STEPS / 2 && has_checkpoint(dir, step));
    CHECK_EQ(count(log, FIRST), 1); // dtrun does not restart after a SIGTERM
    resume_and_compare(dir, "--num-processes 2", straight2);

    // SIGTERM to one worker of dtrun: the job ends with 75, without a restart.
    snprintf(log, sizeof log, "%s/dtrun-worker.log", tmp);
    snprintf(dir, sizeof dir, "%s/dtrun-worker", tmp);
    snprintf(extra, sizeof extra, "--checkpoint-dir %s", dir);
    pid = start(log, prefix, extra);
    CHECK(wait_for(log, "epoch: 0 [5/"));
    pid_t w = child_of(pid, "dtrain-mnist", 1);
    CHECK(w > 0);
    if (w > 0)
        kill(w, SIGTERM);
    CHECK_EQ(finish(pid), 75);
    step = stopped_at(log, &times);
    CHECK_EQ(times, 1);
    CHECK(step >= 6 && step < STEPS / 2 && has_checkpoint(dir, step));
    CHECK(log_has(log, "preempted"));
    CHECK_EQ(count(log, FIRST), 1); // a restart would train from the start again
}

// SIGTERM to a worker of dtrun at several moments of its first half second (from the
// moment dtrun's child runs dtrain-mnist): whether the signal ends it (before the
// trainer takes SIGTERM as a stop request) or it stops at a step and saves, dtrun takes
// it as a preemption: exit 75, no restart (--max-restarts 3), every process gone.
static void test_dtrun_early(void) {
    const int delays_ms[] = {0, 2, 10, 40, 100, 250, 500};
    char      prefix[PATH_MAX + 128];
    snprintf(prefix, sizeof prefix, "%s --nproc-per-node 2 --max-restarts 3", dtrun);
    for (size_t i = 0; i < sizeof delays_ms / sizeof delays_ms[0]; i++) {
        char log[256], dir[256], extra[512];
        snprintf(log, sizeof log, "%s/early-%d.log", tmp, delays_ms[i]);
        snprintf(dir, sizeof dir, "%s/early-%d", tmp, delays_ms[i]);
        snprintf(extra, sizeof extra, "--checkpoint-dir %s", dir);
        int   f0  = check_failed;
        pid_t pid = start(log, prefix, extra), w = -1;
        for (int k = 0; k < 20000 && w <= 0; k++) // its comm is the program's after exec
            if ((w = child_of(pid, "dtrain-mnist", 1)) <= 0)
                usleep(200);
        CHECK(w > 0);
        sleep_ms(delays_ms[i]);
        if (w > 0)
            kill(w, SIGTERM);
        CHECK_EQ(finish(pid), 75);
        CHECK(log_has(log, "preempted"));
        CHECK(!log_has(log, "restarting the group"));
        CHECK(count(log, FIRST) <= 1); // a restart would train from the start again
        fprintf(stderr, "     SIGTERM %3d ms after the worker started: %s\n", delays_ms[i],
                log_has(log, "was ended by a SIGTERM") ? "it ended by the signal"
                : log_has(log, "exit status 75")       ? "it stopped at a step (75)"
                                                       : "?");
        if (check_failed != f0) {
            char *s = slurp(log);
            fprintf(stderr, "---- SIGTERM %d ms after the worker started:\n%s\n----\n",
                    delays_ms[i], s ? s : "");
            free(s);
        }
    }
}

// Two dtrun nodes (on loopback), SIGTERM to node 0's dtrun: the ranks of both nodes
// stop at the same step and save it; the resume is bitwise equal to a straight run.
static void test_dtrun_two_nodes(void) {
    char log0[256], log1[256], dir[256], extra[512], p0[PATH_MAX + 256], p1[PATH_MAX + 256];
    int  port = mp_free_port();
    snprintf(log0, sizeof log0, "%s/node0.log", tmp);
    snprintf(log1, sizeof log1, "%s/node1.log", tmp);
    snprintf(dir, sizeof dir, "%s/nodes", tmp);
    snprintf(extra, sizeof extra, "--checkpoint-dir %s", dir);
    for (int k = 0; k < 2; k++)
        snprintf(k ? p1 : p0, sizeof p0,
                 "%s --nnodes 2 --node-rank %d --master-addr 127.0.0.1 --master-port %d "
                 "--nproc-per-node 1",
                 dtrun, k, port);
    pid_t n1 = start(log1, p1, extra), n0 = start(log0, p0, extra);
    CHECK(wait_for(log0, "epoch: 0 [5/"));
    kill(n0, SIGTERM);
    CHECK_EQ(finish(n0), 75);
    CHECK_EQ(finish(n1), 75); // the other node's dtrun ends too, for the same SIGTERM
    int  t0, t1;
    long s0 = stopped_at(log0, &t0), s1 = stopped_at(log1, &t1);
    CHECK_EQ(t0, 1);
    CHECK_EQ(t1, 1); // node 1's first process says it too
    CHECK_EQ(s0, s1);
    CHECK(s0 >= 6 && s0 < STEPS / 2 && has_checkpoint(dir, s0));
    resume_and_compare(dir, "--num-processes 2", straight2);
}

// Before training starts (here: waiting for a peer that never comes) SIGTERM ends the
// process at once, as it always did: only a training loop waits for a step boundary.
static void test_before_training(void) {
    char log[256], prefix[256];
    snprintf(log, sizeof log, "%s/alone.log", tmp);
    snprintf(prefix, sizeof prefix,
             "/usr/bin/env RANK=1 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=%d "
             "DT_JOB_TOKEN=alone DT_TIMEOUT_MS=60000",
             29000 + (int)(getpid() % 3000));
    pid_t pid = start(log, prefix, "");
    sleep_ms(1000);
    double t0 = (double)time(NULL);
    kill(pid, SIGTERM);
    CHECK_EQ(finish(pid), 128 + SIGTERM);
    CHECK((double)time(NULL) - t0 < 5.0);
}

int main(void) {
#ifdef DT_SANITIZE // evaluations on 1,000 test images: no check here depends on the split's size
    CHECK(tl_fmnist_short_test(1000));
#endif
    if (!CHECK(test_program_path("dtrain-mnist", bin, sizeof bin)) ||
        !CHECK(test_program_path("dtrun", dtrun, sizeof dtrun))) {
        fprintf(stderr, "dtrain-mnist or dtrun not found next to the tests (make programs)\n");
        return check_summary();
    }
    snprintf(tmp, sizeof tmp, "/tmp/dt_preempt_XXXXXX");
    if (!CHECK(mkdtemp(tmp)))
        return check_summary();
    RUN(straight_runs);
    RUN(test_one_process);
    RUN(test_two_processes_one_signalled);
    RUN(test_dtrun);
    RUN(test_dtrun_early);
    RUN(test_dtrun_two_nodes);
    RUN(test_before_training);
    char cmd[256];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmp);
    if (check_failed == 0)
        (void)!system(cmd);
    else
        fprintf(stderr, "logs kept in %s\n", tmp);
    return check_summary();
}
