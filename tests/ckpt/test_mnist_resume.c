// test_mnist_resume.c: dtrain-mnist's checkpoint flags, as a user (or dtrun) runs them,
// in real processes on a few real Fashion-MNIST samples.
//
// - Stopped mid-epoch (--max-steps) and resumed (--resume): the final parameters
//   (--save-model) are bitwise equal to an uninterrupted run's, in 1 process and with
//   --num-processes 2.
// - Killed with SIGKILL at random moments while saving a checkpoint every step, then
//   restarted with the same command line until it finishes: bitwise equal again, in
//   1 process and killing one of 2 workers.
// - A corrupt newest checkpoint stops --resume with a message naming the file; with
//   --fallback it resumes from the previous one, and still ends bitwise equal.
// - --eval-only --load evaluates the saved model with the accuracy training printed;
//   the flag combinations that make no sense are refused with exit code 2.
#include "../lib/mnist.h"
#include "../lib/prog.h"
#include "ckpt_test.h"

#include <fcntl.h>
#include <limits.h>
#include <linux/kcmp.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static char bin[PATH_MAX + 64];
static char common[256] = "--limit 256 --batch-size 16 --epochs 2 --threads 1 --seed 3";

static bool find_bin(void) {
    return test_program_path("dtrain-mnist", bin, sizeof bin);
}

// Runs `dtrain-mnist <args>` through the shell; exit status, output in *out (malloc'd).
static int run(char **out, const char *fmt, ...) DT_PRINTF(2, 3);
static int run(char **out, const char *fmt, ...) {
    char    args[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(args, sizeof args, fmt, ap);
    va_end(ap);
    return test_run(out, "%s %s 2>&1", bin, args);
}

// Parameters of a --save-model file, in a fresh ConvNet.
static dt_model *load_params(const char *path) {
    dt_model *m;
    if (mnist_convnet_new(&m, 99, 0.1f, 0.25f))
        return NULL;
    dt_status st = dt_ckpt_load_model(path, m);
    CHECK_OK(st);
    if (st) {
        dt_model_free(m);
        return NULL;
    }
    return m;
}

static bool same_model(const char *a, const char *b) {
    dt_model *x = load_params(a), *y = load_params(b);
    bool      same =
        x && y && memcmp(dt_model_params(x), dt_model_params(y), dt_model_num_params(x) * 4) == 0;
    dt_model_free(x);
    dt_model_free(y);
    return same;
}

static char tmp[128];
static char straight1[256], straight2[256];

static void test_stop_and_resume(void) {
    char *out, dir[256], model[256];
    snprintf(straight1, sizeof straight1, "%s/straight1.dtck", tmp);
    snprintf(straight2, sizeof straight2, "%s/straight2.dtck", tmp);
    CHECK_EQ(run(&out, "%s --no-test --save-model %s", common, straight1), 0);
    free(out);
    CHECK_EQ(run(&out, "%s --no-test --num-processes 2 --save-model %s", common, straight2), 0);
    free(out);
    CHECK(!same_model(straight1, straight2)); // another world size, another computation

    // 1 process: 256 / 16 = 16 steps an epoch; stop at 21 (epoch 1, batch 5).
    snprintf(dir, sizeof dir, "%s/one", tmp);
    snprintf(model, sizeof model, "%s/one.dtck", tmp);
    CHECK_EQ(run(&out,
                 "%s --no-test --checkpoint-dir %s --checkpoint-every 7 --max-steps 21 "
                 "--resume --save-model %s",
                 common, dir, model),
             0);
    CHECK(strstr(out, "no checkpoint in ") != NULL);
    free(out);
    CHECK(!same_model(model, straight1));
    CHECK_EQ(run(&out,
                 "%s --no-test --checkpoint-dir %s --checkpoint-every 7 --resume "
                 "--save-model %s",
                 common, dir, model),
             0);
    CHECK(strstr(out, "resumed from ") && strstr(out, "/one/step-000021 (epoch 1, batch 5)"));
    CHECK(strstr(out, "epoch: 0 [") == NULL); // nothing of epoch 0 was redone
    free(out);
    CHECK(same_model(model, straight1));
    // A resume after the end: nothing left to train, same model.
    CHECK_EQ(
        run(&out, "%s --no-test --checkpoint-dir %s --resume --save-model %s", common, dir, model),
        0);
    CHECK(strstr(out, "/one/step-000032 (epoch 1, batch 16)") != NULL);
    CHECK(strstr(out, "training loss") == NULL);
    free(out);
    CHECK(same_model(model, straight1));

    // 2 processes: 128 per rank, 8 steps an epoch; stop at 11 (epoch 1, batch 3), the
    // last checkpoint before it at 9: steps 10 and 11 are done again.
    snprintf(dir, sizeof dir, "%s/two", tmp);
    snprintf(model, sizeof model, "%s/two.dtck", tmp);
    CHECK_EQ(run(&out,
                 "%s --no-test --num-processes 2 --checkpoint-dir %s --checkpoint-every 3 "
                 "--max-steps 11 --save-model %s",
                 common, dir, model),
             0);
    free(out);
    char last[320];
    snprintf(last, sizeof last, "%s/step-000011", dir); // the end-of-run checkpoint
    CHECK_OK(dt_ckpt_verify(last));
    ct_rm_tree(last); // as if the run had been killed after step 11
    CHECK_EQ(run(&out,
                 "%s --no-test --num-processes 2 --checkpoint-dir %s --checkpoint-every 3 "
                 "--resume --save-model %s",
                 common, dir, model),
             0);
    CHECK(strstr(out, "/two/step-000009 (epoch 1, batch 1)") != NULL);
    free(out);
    CHECK(same_model(model, straight2));
}

// True when `kid` shares the address space of `pid`: not a forked worker but a clone
// such as the tracer LeakSanitizer starts while an ASan build exits (killing that one
// leaves the exiting process spinning forever). When kcmp is not available, false.
static bool same_vm(pid_t pid, pid_t kid) {
#ifdef SYS_kcmp
    return syscall(SYS_kcmp, pid, kid, KCMP_VM, 0, 0) == 0;
#else
    (void)pid, (void)kid;
    return false;
#endif
}

// Forked children of `pid` (from /proc), up to max.
static int children(pid_t pid, pid_t *out, int max) {
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/task/%d/children", (int)pid, (int)pid);
    FILE *f = fopen(path, "r");
    int   n = 0;
    if (!f)
        return 0;
    long c;
    while (n < max && fscanf(f, "%ld", &c) == 1)
        if (!same_vm(pid, (pid_t)c))
            out[n++] = (pid_t)c;
    fclose(f);
    return n;
}

static void sleep_ms(long ms) {
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000};
    nanosleep(&ts, NULL);
}

// Starts dtrain-mnist with `args` (split on spaces), output to `log`.
static pid_t start(const char *args, const char *log) {
    char buf[2048], *argv[64];
    int  argc = 0;
    snprintf(buf, sizeof buf, "%s", args);
    argv[argc++] = bin;
    for (char *t = strtok(buf, " "); t && argc < 63; t = strtok(NULL, " "))
        argv[argc++] = t;
    argv[argc] = NULL;
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        int fd = open(log, O_WRONLY | O_CREAT | O_APPEND, 0644);
        dup2(fd, 1);
        dup2(fd, 2);
        execv(bin, argv);
        _exit(127);
    }
    return pid;
}

// Runs the same command line again and again, killing it (or one of its workers) at a
// random moment, until a run finishes; then the model must equal the straight run's.
static void kill_until_done(bool two, const char *straight, uint64_t seed) {
    char dir[256], model[256], log[256], args[1024];
    snprintf(dir, sizeof dir, "%s/kill%d", tmp, two ? 2 : 1);
    snprintf(model, sizeof model, "%s/kill%d.dtck", tmp, two ? 2 : 1);
    snprintf(log, sizeof log, "%s/kill%d.log", tmp, two ? 2 : 1);
    snprintf(args, sizeof args,
             "%s --no-test %s --checkpoint-dir %s --checkpoint-every 1 "
             "--keep 2 --resume --save-model %s",
             common, two ? "--num-processes 2" : "", dir, model);
    dt_rng r     = dt_rng_init(seed ^ dt_now_ns());
    int    kills = 0, finished = 0, resumes = 0;
    for (int attempt = 0; attempt < 40 && !finished; attempt++) {
        int64_t before = -1;
        dt_ckpt_latest(dir, &before); // -1 stays when there is none yet
        pid_t pid = start(args, log);
        int   st;
        pid_t w = 0;
        if (attempt < 3) {
            // The first three attempts are killed while they train, whatever the
            // machine's speed: once this attempt has written a new checkpoint, at a
            // random moment of the next few steps (saves happen every step).
            int64_t latest = before;
            while ((w = waitpid(pid, &st, WNOHANG)) == 0 && latest <= before) {
                sleep_ms(1);
                if (dt_ckpt_latest(dir, &latest) != DT_OK)
                    latest = before;
            }
            uint64_t until = dt_now_ns() + dt_rng_below(&r, 30) * 1000000u;
            while (w == 0 && dt_now_ns() < until && (w = waitpid(pid, &st, WNOHANG)) == 0)
                sleep_ms(1);
        } else {
            // Later ones get more and more time, so the job finishes.
            long     delay = 20 + (long)dt_rng_below(&r, attempt < 6 ? 150 : 150u << (attempt - 5));
            uint64_t until = dt_now_ns() + (uint64_t)delay * 1000000u;
            while (dt_now_ns() < until && (w = waitpid(pid, &st, WNOHANG)) == 0)
                sleep_ms(2);
        }
        if (w == 0) {
            pid_t kids[4];
            int   nk = two ? children(pid, kids, 4) : 0;
            // With workers: kill one of them; the job must stop by itself.
            kill(nk ? kids[dt_rng_below(&r, (uint64_t)nk)] : pid, SIGKILL);
            kills++;
            uint64_t deadline = dt_deadline_ns(30000);
            while ((w = waitpid(pid, &st, WNOHANG)) == 0 && dt_now_ns() < deadline)
                sleep_ms(5);
            if (!CHECK(w == pid)) {
                fprintf(stderr,
                        "     the job did not stop within 30 s after a worker was killed\n");
                kill(pid, SIGKILL);
                waitpid(pid, &st, 0);
                break;
            }
            // A worker killed as it exited (a zombie) does not stop the job: it finished.
            finished = WIFEXITED(st) && WEXITSTATUS(st) == 0;
        } else if (WIFEXITED(st) && WEXITSTATUS(st) == 0) {
            finished = 1;
        } else {
            // Exited with a failure without being killed: a resume that failed.
            CHECK(false);
            break;
        }
    }
    size_t n;
    char  *text = (char *)ct_read(log, &n);
    if (text) {
        text[n] = '\0';
        for (char *p = text; (p = strstr(p, "resumed from ")); p++)
            resumes++;
    }
    CHECK(finished);
    CHECK(kills >= 3);
    CHECK(resumes >= 1);
    CHECK(same_model(model, straight));
    printf("dtrain-mnist%s, checkpoint every step, killed %d times at random moments, resumed "
           "%d times: final parameters bitwise equal to the uninterrupted run\n",
           two ? " --num-processes 2 (one worker killed)" : "", kills, resumes);
    if (!finished || !same_model(model, straight))
        fprintf(stderr, "%s\n", text ? text : "(no log)");
    free(text);
}

static void test_killed_and_restarted(void) {
    kill_until_done(false, straight1, 1);
    kill_until_done(true, straight2, 2);
}

static void test_corrupt_newest(void) {
    char *out, dir[256], model[256], path[512];
    snprintf(dir, sizeof dir, "%s/corrupt", tmp);
    snprintf(model, sizeof model, "%s/corrupt.dtck", tmp);
    CHECK_EQ(run(&out, "%s --no-test --checkpoint-dir %s --checkpoint-every 5 --max-steps 20",
                 common, dir),
             0);
    free(out);
    snprintf(path, sizeof path, "%s/step-000020/state.dtck", dir);
    size_t         n;
    unsigned char *b = ct_read(path, &n);
    ct_section     secs[8];
    CHECK_EQ(ct_sections(b, n, secs, 8), 6); // PTAB PARM BTAB BUFS OPTM KVAL
    CHECK(strcmp(secs[1].tag, "PARM") == 0);
    b[secs[1].payload_at + 4000] ^= 1;
    ct_write(path, b, n);
    free(b);
    CHECK_EQ(run(&out, "%s --no-test --checkpoint-dir %s --resume", common, dir), 1);
    CHECK(strstr(out, "step-000020/state.dtck: corrupt section 1 (PARM)") != NULL);
    free(out);
    CHECK_EQ(run(&out,
                 "%s --no-test --checkpoint-dir %s --checkpoint-every 5 --resume "
                 "--fallback --save-model %s",
                 common, dir, model),
             0);
    CHECK(strstr(out, "resumed from ") && strstr(out, "step-000015 (epoch 0, batch 15) after "
                                                      "refusing newer checkpoints"));
    free(out);
    CHECK(same_model(model, straight1));
}

static void test_eval_and_flags(void) {
    char *out, model[256];
    snprintf(model, sizeof model, "%s/eval.dtck", tmp);
    // Evaluations cover the whole test set (10,000 images): two of them, with big batches.
    CHECK_EQ(run(&out, "--limit 256 --batch-size 500 --seed 5 --save-model %s", model), 0);
    const char *acc       = strstr(out, "Test accuracy: ");
    char        line[128] = "";
    if (CHECK(acc != NULL))
        sscanf(acc, "%127[^\n]", line);
    free(out);
    CHECK_EQ(run(&out, "--eval-only --load %s --batch-size 1000 --num-processes 2", model), 0);
    CHECK(line[0] && strstr(out, line) != NULL);
    CHECK(strstr(out, "training loss") == NULL && strstr(out, "Finished training") == NULL);
    free(out);

    const char *bad[][2] = {
        {"--resume", "--resume needs --checkpoint-dir"},
        {"--checkpoint-every 5", "--checkpoint-every needs --checkpoint-dir"},
        {"--eval-only", "--eval-only needs --load PATH"},
        {"--eval-only --load x --no-test", "cannot go with --no-test"},
        {"--checkpoint-dir d --fallback", "--fallback needs --resume"},
        {"--checkpoint-dir d --keep 0", "--keep expects an integer in [1, 1000000], found \"0\""},
        {"--max-steps -1", "--max-steps expects an integer"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        CHECK_EQ(run(&out, "%s", bad[i][0]), 2);
        if (!CHECK(strstr(out, bad[i][1]) != NULL))
            fprintf(stderr, "     %s: %s\n", bad[i][0], out);
        free(out);
    }
    CHECK_EQ(run(&out, "--eval-only --load %s/missing.dtck", tmp), 1);
    CHECK(strstr(out, "missing.dtck") != NULL);
    free(out);
}

int main(void) {
#ifdef DT_SANITIZE // evaluations on 1,000 test images: no check here depends on the split's size
    CHECK(tl_fmnist_short_test(1000));
#endif
    if (!CHECK(find_bin())) {
        fprintf(stderr, "dtrain-mnist not found next to the tests (make programs)\n");
        return check_summary();
    }
    ct_tmpdir(tmp, sizeof tmp, "mnist-resume");
    RUN(test_stop_and_resume);
    RUN(test_killed_and_restarted);
    RUN(test_corrupt_newest);
    RUN(test_eval_and_flags);
    if (!check_failed)
        ct_rm_tree(tmp);
    else
        fprintf(stderr, "files kept in %s\n", tmp);
    return check_summary();
}
