// test_mnist_data.c: dtrain-mnist on data sets that do not fit its model, and on data
// directories holding something else than files, as a user would run it.
//
// - 14x14 and 56x56 images (train and test), and a 28x28 training set with a 14x14
//   test set: exit 1 before the first step (no loss line), no signal, a message naming
//   the set, the model's input shape (1, 28, 28) and the shape found. Once with
//   --num-processes 2, which must stop before spawning (one message, not one a rank).
//   Before the check, 14x14 images were read past their end by the first convolution
//   (a segfault in release builds on larger sets) and 56x56 ones trained as garbage.
// - A directory under the training images' name: exit 1 naming it as a directory.
#include "../check.h"
#include "../lib/prog.h"
#include "dtrain/data.h"

#include <ftw.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static char bin[PATH_MAX + 64];
static char tmpdir[64];

static int rm_one(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb, (void)flag, (void)ftw;
    return remove(path);
}

// Runs a shell command; returns its exit status (128 + signal when killed) and its
// output in *out (malloc'd).
static int run(const char *cmd, char **out) {
    return test_run(out, "%s", cmd);
}

static int count(const char *hay, const char *needle) {
    int n = 0;
    for (const char *p = hay; (p = strstr(p, needle)); p++)
        n++;
    return n;
}

// Writes an MNIST-format set ("train" or "t10k") of n images of side x side pixels
// into dir, gzip-compressed.
static void write_set(const char *dir, const char *set, uint32_t n, uint32_t side) {
    char     path[256];
    uint8_t *img = malloc((size_t)n * side * side), *lab = malloc(n);
    for (size_t i = 0; i < (size_t)n * side * side; i++)
        img[i] = (uint8_t)(i * 37 + i / 7);
    for (uint32_t i = 0; i < n; i++)
        lab[i] = (uint8_t)(i % 10);
    uint32_t di[3] = {n, side, side}, dl[1] = {n};
    snprintf(path, sizeof path, "%s/%s-images-idx3-ubyte.gz", dir, set);
    CHECK_OK(dt_idx_write(path, img, 3, di, true));
    snprintf(path, sizeof path, "%s/%s-labels-idx1-ubyte.gz", dir, set);
    CHECK_OK(dt_idx_write(path, lab, 1, dl, true));
    free(img);
    free(lab);
}

static const char *make_dir(const char *name, int train_side, int test_side) {
    static char dirs[8][128];
    static int  next;
    char       *d = dirs[next++ % 8];
    snprintf(d, sizeof dirs[0], "%s/%s", tmpdir, name);
    CHECK(mkdir(d, 0700) == 0);
    if (train_side)
        write_set(d, "train", 256, (uint32_t)train_side);
    if (test_side)
        write_set(d, "t10k", 64, (uint32_t)test_side);
    return d;
}

// One refused run: exit 1, no signal, no training step, the message once.
static void expect_refused(const char *dir, const char *extra, const char *want) {
    char cmd[3 * PATH_MAX], *out;
    snprintf(cmd, sizeof cmd, "%s --data-dir %s --batch-size 32 %s 2>&1", bin, dir, extra);
    double t0 = dt_now();
    int    rc = run(cmd, &out);
    CHECK_EQ(rc, 1);
    CHECK(strstr(out, want) != NULL);
    CHECK_EQ(count(out, "dtrain-mnist: "), 1);
    CHECK_EQ(count(out, "training loss"), 0);
    CHECK(dt_now() - t0 < 20.0);
    if (rc != 1 || !strstr(out, want))
        fprintf(stderr, "--- %s\n%s--- expected \"%s\"\n", cmd, out, want);
    free(out);
}

static void test_wrong_shapes(void) {
    const char *d14 = make_dir("small", 14, 14), *d56 = make_dir("large", 56, 56);
    const char *dmix = make_dir("mixed", 28, 14);
    expect_refused(d14, "",
                   "dtrain-mnist: training set: expected samples of the model's input shape (1, "
                   "28, 28) (C, H, W), found (1, 14, 14)");
    expect_refused(d56, "",
                   "training set: expected samples of the model's input shape (1, 28, 28) (C, "
                   "H, W), found (1, 56, 56)");
    expect_refused(d56, "--num-processes 2", "found (1, 56, 56)");
    // The test set is checked before training too, not when evaluation starts.
    expect_refused(dmix, "",
                   "test set: expected samples of the model's input shape (1, 28, 28) (C, H, W), "
                   "found (1, 14, 14)");
    // --no-test skips the test set, so the same directory trains (and the check lets
    // 28x28 images through).
    char cmd[3 * PATH_MAX], *out;
    snprintf(cmd, sizeof cmd, "%s --data-dir %s --batch-size 32 --no-test 2>&1", bin, dmix);
    int rc = run(cmd, &out);
    CHECK_EQ(rc, 0);
    CHECK_EQ(count(out, "Finished training in"), 1);
    if (rc)
        fprintf(stderr, "%s\n", out);
    free(out);
}

static void test_not_a_file(void) {
    const char *d = make_dir("dir-for-file", 0, 28);
    char        name[256], want[320];
    snprintf(name, sizeof name, "%s/train-images-idx3-ubyte", d);
    CHECK(mkdir(name, 0700) == 0);
    snprintf(want, sizeof want, "%s is a directory, expected a regular file", name);
    expect_refused(d, "", want);
}

int main(void) {
    if (!CHECK(test_program_path("dtrain-mnist", bin, sizeof bin))) {
        fprintf(stderr, "dtrain-mnist not found next to the tests (make programs)\n");
        return check_summary();
    }
    snprintf(tmpdir, sizeof tmpdir, "/tmp/dtrain-test-mnist-data-XXXXXX");
    if (!mkdtemp(tmpdir)) {
        perror("mkdtemp");
        return 1;
    }
    RUN(test_wrong_shapes);
    RUN(test_not_a_file);
    nftw(tmpdir, rm_one, 8, FTW_DEPTH | FTW_PHYS);
    return check_summary();
}
