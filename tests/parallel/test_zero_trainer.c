// test_zero_trainer.c: --zero in the trainer's flag table, through dtrain-mnist (the
// seed ConvNet, Adadelta, clipping, gradient accumulation) on a few real samples in 2
// processes:
// - --zero 1 and --zero 2 end with plain DDP's parameters (--zero 0) to rounding, and
//   print the optimizer state per rank at half the unsharded size;
// - --zero 2 stopped by --max-steps and resumed (--resume) ends bitwise equal to the
//   uninterrupted --zero 2 run, and its checkpoint also resumes under --zero 0;
// - dtrain-gpt (AdamW, no-decay group, clipping, micro-batches) with --zero 1 and 2 on 2
//   processes ends with the validation loss of 1 process on the same global batch.
#include "../check.h"
#include "../lib/mnist.h"
#include "../lib/prog.h"
#include "dtrain/ckpt.h"
#include "dtrain/nn.h"

#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char       bin[PATH_MAX + 64];
static char       dir[128];
static const char common[] = "--num-processes 2 --limit 256 --batch-size 16 --threads 1 "
                             "--seed 3 --clip-grad 0.5 --accumulate 2 --no-test";

// Runs `dtrain-mnist <common flags> <args>`; exit status, output in *out (malloc'd).
static int run(char **out, const char *fmt, ...) DT_PRINTF(2, 3);
static int run(char **out, const char *fmt, ...) {
    char    args[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(args, sizeof args, fmt, ap);
    va_end(ap);
    return test_run(out, "%s %s %s 2>&1", bin, common, args);
}

static dt_model *load(const char *name) {
    char path[256];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    dt_model *m = NULL;
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

// Relative L2 distance of two saved models' parameters (INFINITY when one is missing).
static double distance(const char *a, const char *b) {
    dt_model *x = load(a), *y = load(b);
    double    num = 0, den = 0;
    if (!x || !y) {
        dt_model_free(x), dt_model_free(y);
        return INFINITY;
    }
    const float *p = dt_model_params(x), *q = dt_model_params(y);
    for (size_t i = 0; i < dt_model_num_params(x); i++) {
        num += ((double)p[i] - q[i]) * ((double)p[i] - q[i]);
        den += (double)q[i] * q[i];
    }
    dt_model_free(x), dt_model_free(y);
    return sqrt(num / den);
}

static void test_stages_equal_ddp(void) {
    char *out = NULL;
    CHECK_EQ(run(&out, "--zero 0 --save-model %s/z0.dtck", dir), 0);
    free(out);
    for (int z = 1; z <= 2; z++) {
        CHECK_EQ(run(&out, "--zero %d --save-model %s/z%d.dtck", z, dir, z), 0);
        double      full = 0, rank = 0;
        const char *line = strstr(out, "optimizer state");
        CHECK(line && sscanf(line, "optimizer state %lf MiB per rank (%lf", &rank, &full) == 2);
        CHECK(rank > 0 && fabs(rank * 2 - full) < 0.01 * full);
        char name[32];
        snprintf(name, sizeof name, "z%d.dtck", z);
        double d = distance(name, "z0.dtck");
        if (!CHECK(d < 1e-5))
            fprintf(stderr, "     --zero %d differs from --zero 0 by %.3g\n%s\n", z, d, out);
        else
            fprintf(stderr, "     --zero %d vs --zero 0: %.2g; optimizer state %.3f of %.3f MiB\n",
                    z, d, rank, full);
        free(out);
    }
}

static void test_resume(void) {
    char *out = NULL;
    CHECK_EQ(run(&out, "--zero 2 --checkpoint-dir %s/ck --checkpoint-every 3 --max-steps 3", dir),
             0);
    free(out);
    char cmd[400];
    snprintf(cmd, sizeof cmd, "cp -r %s/ck %s/ck0", dir, dir); // for the DDP resume below
    CHECK(system(cmd) == 0);
    CHECK_EQ(
        run(&out, "--zero 2 --checkpoint-dir %s/ck --resume --save-model %s/r2.dtck", dir, dir), 0);
    CHECK(strstr(out, "resumed from") != NULL);
    free(out);
    CHECK(distance("r2.dtck", "z2.dtck") == 0); // bitwise
    // The same checkpoint under plain DDP (the format does not depend on the stage).
    CHECK_EQ(
        run(&out, "--zero 0 --checkpoint-dir %s/ck0 --resume --save-model %s/r0.dtck", dir, dir),
        0);
    CHECK(strstr(out, "resumed from") != NULL);
    free(out);
    double d = distance("r0.dtck", "z2.dtck");
    if (!CHECK(d < 1e-5))
        fprintf(stderr, "     ZeRO-2 checkpoint resumed under DDP: %.3g\n", d);
}

static double gpt_val(const char *gpt, const char *flags) {
    char       *out  = NULL;
    double      v    = NAN;
    int         rc   = test_run(&out,
                                "%s --steps 12 --n-layer 2 --n-embd 64 --block-size 64 --batch-size 8 "
                                          "--micro-batch 2 --eval-every 0 --log-every 100 --threads 1 %s 2>&1",
                                gpt, flags);
    const char *line = strstr(out, "val loss:");
    CHECK_EQ(rc, 0);
    bool ok = line && sscanf(line, "val loss: %lf", &v) == 1;
    if (!CHECK(ok))
        fprintf(stderr, "%s\n", out);
    free(out);
    return v;
}

static void test_gpt(void) {
    char gpt[PATH_MAX + 64];
    if (!CHECK(test_program_path("dtrain-gpt", gpt, sizeof gpt)))
        return;
    double one = gpt_val(gpt, "");
    for (int z = 1; z <= 2; z++) {
        char flags[64];
        snprintf(flags, sizeof flags, "--num-processes 2 --zero %d", z);
        double v = gpt_val(gpt, flags);
        if (!CHECK(fabs(v - one) < 2e-4))
            fprintf(stderr, "     dtrain-gpt --zero %d: val loss %.4f, 1 process %.4f\n", z, v,
                    one);
        else
            fprintf(stderr,
                    "     dtrain-gpt --zero %d on 2 processes: val loss %.4f (1 process %.4f)\n", z,
                    v, one);
    }
}

int main(void) {
    if (!CHECK(test_program_path("dtrain-mnist", bin, sizeof bin))) {
        fprintf(stderr, "dtrain-mnist not found next to the tests (make programs)\n");
        return check_summary();
    }
    snprintf(dir, sizeof dir, "/tmp/dtrain-test-zero-trainer-%d", (int)getpid());
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s && mkdir -p %s", dir, dir);
    CHECK(system(cmd) == 0);
    test_stages_equal_ddp();
    test_resume();
    test_gpt();
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    CHECK(system(cmd) == 0);
    return check_summary();
}
