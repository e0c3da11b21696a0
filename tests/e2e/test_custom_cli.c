// test_custom_cli.c: examples/custom (dtrain-custom), the bring-your-own-gradients
// example, as a user runs it: 2 forked workers train its hand-written MLP through
// dt_params; rank 0 alone prints, the loss falls, and the saved file (format version 2,
// kind "model") loads into the same table described independently here. Bad flags exit
// 2 naming the flag.
#include "../check.h"
#include "../lib/prog.h"
#include "dtrain/ckpt.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

static char bin[PATH_MAX + 64];

static int run(const char *cmd, char **out) {
    return test_run(out, "%s", cmd);
}

static void test_two_workers(void) {
    char path[64] = "/tmp/dtrain-custom-XXXXXX", cmd[3 * PATH_MAX], *out;
    int  fd       = mkstemp(path);
    close(fd);
    snprintf(cmd, sizeof cmd,
             "%s --num-processes 2 --limit 2560 --batch-size 32 --lr 0.002 --save %s 2>&1", bin,
             path);
    int rc = run(cmd, &out);
    CHECK_EQ(rc, 0);
    // 2560 / 2 ranks / 32 = 40 steps: lines at 0, 20 and the last (39), from rank 0 only.
    const char *first = strstr(out, "step 0 loss "), *last = strstr(out, "step 39 loss ");
    CHECK(first && last && strstr(first + 1, "step 0 loss ") == NULL);
    float l0 = 0, l1 = 0;
    if (first && last && sscanf(first, "step 0 loss %f", &l0) == 1 &&
        sscanf(last, "step 39 loss %f", &l1) == 1)
        CHECK(l1 < 0.8f * l0);
    else
        fprintf(stderr, "     output:\n%s\n", out);
    dt_params *p = NULL;
    CHECK_OK(dt_params_new(&p, NULL));
    int64_t w1[2] = {128, 784}, b1[1] = {128}, w2[2] = {10, 128}, b2[1] = {10};
    CHECK_OK(dt_params_add(p, "fc1.weight", 2, w1, 0));
    CHECK_OK(dt_params_add(p, "fc1.bias", 1, b1, 0));
    CHECK_OK(dt_params_add(p, "fc2.weight", 2, w2, 0));
    CHECK_OK(dt_params_add(p, "fc2.bias", 1, b2, 0));
    CHECK_OK(dt_params_alloc(p));
    CHECK_OK(dt_ckpt_load_params(path, p));
    double s = 0;
    for (size_t i = 0; i < dt_params_numel(p); i++)
        s += fabs(dt_params_data(p)[i]);
    CHECK(s > 0);
    dt_params_free(p);
    free(out);
    unlink(path);
}

static void test_bad_flags(void) {
    char cmd[3 * PATH_MAX], *out;
    snprintf(cmd, sizeof cmd, "%s --bogus 2>&1", bin);
    CHECK_EQ(run(cmd, &out), 2);
    CHECK(strstr(out, "unknown option \"--bogus\"") != NULL);
    free(out);
    snprintf(cmd, sizeof cmd, "%s --epochs 0 2>&1", bin);
    CHECK_EQ(run(cmd, &out), 2);
    CHECK(strstr(out, "--epochs") != NULL);
    free(out);
}

int main(void) {
    if (!test_program_path("dtrain-custom", bin, sizeof bin)) {
        CHECK(!"dtrain-custom is not built");
        return check_summary();
    }
    RUN(test_two_workers);
    RUN(test_bad_flags);
    return check_summary();
}
