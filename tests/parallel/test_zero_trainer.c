// test_zero_trainer.c: --zero in the trainer's flag table, through dtrain-mnist (the
// seed ConvNet, Adadelta, clipping, gradient accumulation) on a few real samples in 2
// processes:
// - --zero 1, 2 and 3 end with plain DDP's parameters (--zero 0) to rounding (the
//   Sequential dt_model is a graph, so it announces its reads to ZeRO-3), and
//   print the optimizer state per rank at half the unsharded size;
// - --zero 2 stopped by --max-steps and resumed (--resume) ends bitwise equal to the
//   uninterrupted --zero 2 run, and its checkpoint also resumes under --zero 0;
// - dtrain-gpt (AdamW, no-decay group, clipping, micro-batches) with --zero 1, 2 and 3
//   on 2 processes ends with the validation loss of 1 process on the same global batch;
//   --zero 3 stopped by --max-steps and resumed ends with the uninterrupted run's losses
//   (its checkpoints gather the sharded parameters on rank 0);
// - --max-rank-memory: plain DDP over the budget is refused naming both numbers, and
//   --zero 3 under the same budget runs with its measured peak inside it.
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
static double     g_peak; // the largest "state_peak_mib" of the last dtrain-gpt runs
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
    for (int z = 1; z <= 3; z++) {
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
    const char *peak = strstr(out, "\"state_peak_mib\": ");
    double      pk   = 0;
    if (peak && sscanf(peak, "\"state_peak_mib\": %lf", &pk) == 1 && pk > g_peak)
        g_peak = pk;
    const char *line = strstr(out, "val loss:");
    CHECK_EQ(rc, 0);
    bool ok = line && sscanf(line, "val loss: %lf", &v) == 1;
    if (!CHECK(ok))
        fprintf(stderr, "%s\n", out);
    free(out);
    return v;
}

static void test_gpt_zero3(const char *gpt) {
    // Resumed at the same world size: the uninterrupted run's losses (bitwise: the
    // printed digits), through checkpoints that gather the shards on rank 0.
    char       *full = NULL, *part = NULL, *rest = NULL;
    const char *flags =
        "--num-processes 2 --zero 3 --steps 6 --n-layer 1 --n-embd 32 --block-size 32 "
        "--batch-size 4 --eval-every 0 --log-every 1 --threads 1";
    CHECK_EQ(test_run(&full, "%s %s 2>&1", gpt, flags), 0);
    CHECK_EQ(test_run(&part, "%s %s --checkpoint-dir %s/g3 --max-steps 3 2>&1", gpt, flags, dir),
             0);
    CHECK_EQ(test_run(&rest, "%s %s --checkpoint-dir %s/g3 --resume 2>&1", gpt, flags, dir), 0);
    const char *a  = full ? strstr(full, "step 6/6 | loss") : NULL;
    const char *b  = rest ? strstr(rest, "step 6/6 | loss") : NULL;
    const char *v1 = full ? strstr(full, "val loss:") : NULL,
               *v2 = rest ? strstr(rest, "val loss:") : NULL;
    CHECK(rest && strstr(rest, "resumed from") != NULL);
    if (!CHECK(a && b && !strncmp(a, b, 24) && v1 && v2 && !strncmp(v1, v2, 16)))
        fprintf(stderr, "     uninterrupted:\n%s\n     resumed:\n%s\n", full, rest);
    free(full), free(part), free(rest);

    // Saved at 4 ranks, resumed at 2 (ZeRO-3) and in 1 process: the same next step, to
    // rounding, as the uninterrupted run at 4.
    const char *m4 = "--zero 3 --steps 5 --n-layer 1 --n-embd 32 --block-size 32 --batch-size 4 "
                     "--eval-every 0 --log-every 1 --threads 1";
    char       *u4 = NULL, *s4 = NULL, *r2 = NULL, *r1 = NULL;
    CHECK_EQ(test_run(&u4, "%s %s --num-processes 4 2>&1", gpt, m4), 0);
    CHECK_EQ(test_run(&s4, "%s %s --num-processes 4 --checkpoint-dir %s/w4 --max-steps 3 2>&1", gpt,
                      m4, dir),
             0);
    char cp[400];
    snprintf(cp, sizeof cp, "cp -r %s/w4 %s/w4b", dir, dir);
    CHECK(system(cp) == 0);
    CHECK_EQ(
        test_run(&r2, "%s %s --num-processes 2 --checkpoint-dir %s/w4 --resume 2>&1", gpt, m4, dir),
        0);
    CHECK_EQ(test_run(&r1, "%s %s --checkpoint-dir %s/w4b --resume 2>&1", gpt, m4, dir), 0);
    double      l4 = NAN, l2 = NAN, l1 = NAN;
    const char *p4 = u4 ? strstr(u4, "step 4/5 | loss") : NULL;
    const char *p2 = r2 ? strstr(r2, "step 4/5 | loss") : NULL;
    const char *p1 = r1 ? strstr(r1, "step 4/5 | loss") : NULL;
    if (p4)
        sscanf(p4, "step 4/5 | loss %lf", &l4);
    if (p2)
        sscanf(p2, "step 4/5 | loss %lf", &l2);
    if (p1)
        sscanf(p1, "step 4/5 | loss %lf", &l1);
    CHECK(r2 && strstr(r2, "saved by 4 ranks") && r1 && strstr(r1, "saved by 4 ranks"));
    if (!CHECK(fabs(l2 - l4) < 2e-5 * fabs(l4) && fabs(l1 - l4) < 2e-5 * fabs(l4)))
        fprintf(stderr, "     step 4 after 4 -> 2 -> 1: %.6f, %.6f, uninterrupted %.6f\n%s\n%s\n",
                l2, l1, l4, r2 ? r2 : "", r1 ? r1 : "");
    else
        fprintf(stderr,
                "     --zero 3 saved at 4 ranks: next step's loss %.6f at 2 ranks, %.6f in 1 "
                "process, %.6f uninterrupted\n",
                l2, l1, l4);
    free(u4), free(s4), free(r2), free(r1);

    // The budget: DDP needs 4 floats per parameter and is refused; ZeRO-3 fits.
    const char *model =
        "--steps 3 --n-layer 2 --n-embd 64 --block-size 64 --batch-size 8 --micro-batch 0 "
        "--eval-every 0 --threads 1 --num-processes 2 --max-rank-memory 1.2M";
    char *out = NULL;
    CHECK(test_run(&out, "%s %s --zero 0 2>&1", gpt, model) != 0);
    if (!CHECK(out && strstr(out, "plain DDP (--zero 0) needs 1.84 MiB per rank") &&
               strstr(out, "over the budget of 1.20 MiB") && strstr(out, "--zero 3 needs")))
        fprintf(stderr, "%s\n", out);
    free(out);
    g_peak   = 0;
    double v = gpt_val(gpt, "--num-processes 2 --zero 3 --max-rank-memory 1.2M");
    CHECK(isfinite(v));
    if (!CHECK(g_peak > 0.5 && g_peak <= 1.2))
        fprintf(stderr, "     --zero 3 under 1.2 MiB: peak %.3f MiB\n", g_peak);
    else
        fprintf(stderr, "     --max-rank-memory 1.2M: DDP refused, ZeRO-3 peaked at %.3f MiB\n",
                g_peak);
    // A size it cannot read is a usage error naming what it expects.
    CHECK_EQ(test_run(&out, "%s --max-rank-memory 12Q 2>&1", gpt), 2);
    CHECK(out && strstr(out, "expects a size in bytes") && strstr(out, "\"12Q\""));
    free(out);
}

static void test_gpt(void) {
    char gpt[PATH_MAX + 64];
    if (!CHECK(test_program_path("dtrain-gpt", gpt, sizeof gpt)))
        return;
    double one = gpt_val(gpt, "");
    for (int z = 1; z <= 3; z++) {
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
    test_gpt_zero3(gpt);
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
