// test_gpt.c: examples/gpt (dtrain-gpt) as a user runs it, on a tiny model (1 layer,
// C 32, 2 heads, T 32) and a corpus written here: lines of words drawn from 20, so a
// byte is well predicted from the bytes before it in its word.
//
// - It learns: the validation loss after 300 steps is below the unigram entropy of the
//   training split (computed here), the loss of the best model that ignores context;
//   the first step's loss is near ln 256 (a uniform guess).
// - 2 processes (global batch 8, 4 each), and 1 process in 4 micro-batches of 2
//   (gradient accumulation), end with the model of 1 process and one batch of 8 up to
//   rounding (the gradient sums in another order).
// - Killed (SIGKILL) after its first checkpoint and resumed with --resume, a run with 2
//   threads ends with the bytes of the model of the same run uninterrupted.
// - Bad flags exit 2 naming the flag.
// - --sample: text from the saved model is the prompt and N more bytes, the same for the
//   same --seed (drawn with --temperature and --top-k), greedy text does not depend on
//   the seed, and bad input (no --load, out-of-range flags, a model of another shape) is
//   refused.
#include "../check.h"
#include "../lib/gpt.h"
#include "../lib/prog.h"
#include "dtrain/ckpt.h"

#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static char bin[PATH_MAX + 64], dir[64] = "/tmp/dtrain-gpt-XXXXXX", corpus[256];

#define TINY GPT_TINY

static int run(const char *cmd, char **out) {
    return test_run(out, "%s", cmd);
}

static float grab(const char *out, const char *key) {
    const char *p = strstr(out, key);
    float       v = NAN;
    if (p)
        sscanf(p + strlen(key), "%f", &v);
    return v;
}

static double unigram;

static void test_learns(void) {
    char cmd[4 * PATH_MAX], *out;
    snprintf(cmd, sizeof cmd, "%s --data %s " TINY "--steps 300 --eval-every 150 --threads 1 2>&1",
             bin, corpus);
    CHECK_EQ(run(cmd, &out), 0);
    float first = grab(out, "step 1/300 | loss "), val = grab(out, "val loss: ");
    CHECK(fabsf(first - logf(256)) < 0.1f);
    CHECK(val < unigram - 0.3); // context used: below what unigram statistics give
    CHECK(strstr(out, "step 150/300 | val loss ") != NULL);
    CHECK(strstr(out, "Finished training in ") != NULL);
    CHECK(strstr(out, "STATS {\"rank\": 0, \"world\": 1, \"steps\": 300") != NULL);
    CHECK(strstr(out, "\"params\": 21984") != NULL);
    if (!(val < unigram - 0.3))
        fprintf(stderr, "     unigram %.4f, output:\n%s\n", unigram, out);
    free(out);
}

static void test_world_invariance(void) {
    char cmd[2 * PATH_MAX + 2048], *out, m1[256], m2[256], m3[256];
    snprintf(m1, sizeof m1, "%s/one.bin", dir);
    snprintf(m2, sizeof m2, "%s/two.bin", dir);
    snprintf(m3, sizeof m3, "%s/micro.bin", dir);
    const char *extra[] = {"", "--num-processes 2 ", "--micro-batch 2 "}, *files[] = {m1, m2, m3};
    for (int k = 0; k < 3; k++) {
        snprintf(cmd, sizeof cmd,
                 "%s --data %s " TINY
                 "--steps 20 --eval-every 0 --threads 1 %s--save-model %s 2>&1",
                 bin, corpus, extra[k], files[k]);
        CHECK_EQ(run(cmd, &out), 0);
        if (k == 1) // one STATS line per rank, in rank order
            CHECK(strstr(out, "\"rank\": 0, \"world\": 2") &&
                  strstr(out, "\"rank\": 1, \"world\": 2") &&
                  strstr(out, "\"rank\": 0, \"world\": 2") <
                      strstr(out, "\"rank\": 1, \"world\": 2"));
        free(out);
    }
    // 2 processes, and 4 micro-batches of 2 (gradient accumulation), against 1 x 8.
    for (int k = 1; k < 3; k++) {
        double maxd = 1, moved = 0;
        CHECK(gpt_tiny_diff(m1, files[k], &maxd, &moved));
        CHECK(maxd < 1e-4); // 20 AdamW steps of lr <= 3e-3: rounding, not another batch
        CHECK(moved > 1);
    }
}

static bool exists(const char *p) {
    struct stat st;
    return stat(p, &st) == 0;
}

static void test_resume_after_kill(void) {
    char cmd[2 * PATH_MAX + 2048], *out, full[256], res[256], ck[256], mark[320];
    snprintf(full, sizeof full, "%s/full.bin", dir);
    snprintf(res, sizeof res, "%s/resumed.bin", dir);
    snprintf(ck, sizeof ck, "%s/ckpt", dir);
    const char *common = TINY "--steps 400 --eval-every 0 --threads 2 --log-every 100 ";
    snprintf(cmd, sizeof cmd, "%s --data %s %s--save-model %s 2>&1", bin, corpus, common, full);
    CHECK_EQ(run(cmd, &out), 0);
    free(out);
    // The interrupted run: SIGKILL as soon as its first checkpoint (step 10) is complete.
    pid_t pid = fork();
    if (pid == 0) {
        char a[2 * PATH_MAX + 2048];
        snprintf(a, sizeof a,
                 "exec %s --data %s %s--checkpoint-dir %s --checkpoint-every 10 >/dev/null 2>&1",
                 bin, corpus, common, ck);
        execl("/bin/sh", "sh", "-c", a, (char *)NULL);
        _exit(127);
    }
    int64_t first = -1;
    for (int i = 0; i < 6000 && first < 0; i++) { // 30 s at most
        int64_t *steps = NULL;
        size_t   n     = 0;
        if (dt_ckpt_list(ck, &steps, &n) == DT_OK && n > 0)
            first = steps[0];
        dt_free(steps);
        if (first < 0)
            usleep(5000);
    }
    kill(pid, SIGKILL);
    int status = 0;
    waitpid(pid, &status, 0);
    CHECK(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL); // stopped mid-run
    CHECK(first == 10);
    snprintf(mark, sizeof mark, "%s/step-000400", ck);
    CHECK(!exists(mark));
    snprintf(cmd, sizeof cmd,
             "%s --data %s %s--checkpoint-dir %s --checkpoint-every 10 --resume --save-model %s "
             "2>&1",
             bin, corpus, common, ck, res);
    CHECK_EQ(run(cmd, &out), 0);
    CHECK(strstr(out, "resumed from ") != NULL);
    free(out);
    FILE *fa = fopen(full, "rb"), *fb = fopen(res, "rb");
    CHECK(fa && fb);
    if (fa && fb) {
        int ca, cb, same = 1;
        do {
            ca = fgetc(fa), cb = fgetc(fb);
            same &= ca == cb;
        } while (ca != EOF && cb != EOF);
        CHECK(same); // bitwise
    }
    if (fa)
        fclose(fa);
    if (fb)
        fclose(fb);
}

static void test_bad_flags(void) {
    char cmd[3 * PATH_MAX], *out;
    snprintf(cmd, sizeof cmd, "%s --bogus 2>&1", bin);
    CHECK_EQ(run(cmd, &out), 2);
    CHECK(strstr(out, "--bogus") != NULL);
    free(out);
    snprintf(cmd, sizeof cmd, "%s --n-embd 30 --n-head 4 2>&1", bin);
    CHECK_EQ(run(cmd, &out), 2);
    CHECK(strstr(out, "--n-head") != NULL);
    free(out);
    snprintf(cmd, sizeof cmd, "%s --batch-size 7 --num-processes 2 2>&1", bin);
    CHECK_EQ(run(cmd, &out), 2);
    CHECK(strstr(out, "--batch-size") != NULL);
    free(out);
}

static void test_sample(void) {
    char cmd[3 * PATH_MAX], *out[4], model[256];
    snprintf(model, sizeof model, "%s/one.bin", dir); // test_world_invariance's 20 steps
    const char *how[] = {"--temperature 0.8 --top-k 12 --seed 3",
                         "--temperature 0.8 --top-k 12 --seed 3", "--seed 3", "--seed 4"};
    for (int k = 0; k < 4; k++) {
        snprintf(cmd, sizeof cmd, "%s " TINY "--load %s --sample 40 --prompt 'the fox ' %s", bin,
                 model, how[k]);
        CHECK_EQ(run(cmd, &out[k]), 0);
        CHECK_EQ(strlen(out[k]), strlen("the fox ") + 40 + 1); // and a newline
        CHECK(strncmp(out[k], "the fox ", 8) == 0);
    }
    CHECK(strcmp(out[0], out[1]) == 0); // the same seed, the same draws
    CHECK(strcmp(out[2], out[3]) == 0); // greedy: the seed is not used
    CHECK(strcmp(out[0], out[2]) != 0); // drawn text is not the argmax's
    for (int k = 0; k < 4; k++)
        free(out[k]);
    const char *bad[]   = {"--sample 10", "--load M --sample 10 --top-k 300",
                           "--load M --sample 10 --temperature -1", "--load M --sample 0",
                           "--load M --sample 10 --num-processes 2"};
    const char *names[] = {"--load", "--top-k", "--temperature", "--sample", "--num-processes"};
    for (size_t k = 0; k < sizeof bad / sizeof *bad; k++) {
        char flags[512];
        snprintf(flags, sizeof flags, "%s", bad[k]);
        char *m = strstr(flags, "M ");
        if (m) { // the model's path in place of M
            char rest[256];
            snprintf(rest, sizeof rest, "%s", m + 1);
            snprintf(m, sizeof flags - (size_t)(m - flags), "%s%s", model, rest);
        }
        snprintf(cmd, sizeof cmd, "%s " TINY "%s 2>&1", bin, flags);
        char *o;
        CHECK_EQ(run(cmd, &o), 2);
        CHECK(strstr(o, names[k]) != NULL);
        free(o);
    }
    // A model file of another shape: refused naming what was expected, exit 1.
    snprintf(cmd, sizeof cmd,
             "%s --n-layer 1 --n-embd 64 --n-head 2 --block-size 32 --load %s --sample 5 2>&1", bin,
             model);
    char *o;
    CHECK_EQ(run(cmd, &o), 1);
    CHECK(strstr(o, "dtrain-gpt: ") != NULL);
    free(o);
}

int main(void) {
    if (!test_program_path("dtrain-gpt", bin, sizeof bin)) {
        CHECK(!"dtrain-gpt is not built");
        return check_summary();
    }
    if (!mkdtemp(dir)) {
        CHECK(!"mkdtemp");
        return check_summary();
    }
    snprintf(corpus, sizeof corpus, "%s/corpus.txt", dir);
    CHECK(gpt_write_corpus(corpus, &unigram));
    RUN(test_learns);
    RUN(test_world_invariance);
    RUN(test_resume_after_kill);
    RUN(test_bad_flags);
    RUN(test_sample);
    char cmd[PATH_MAX];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", dir);
    return check_summary();
}
