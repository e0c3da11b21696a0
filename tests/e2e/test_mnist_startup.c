// test_mnist_startup.c: what dtrain-mnist checks before it trains, and what each machine
// prints, in real processes on a few real samples.
//
// - Two machines (two processes on loopback, --num-machines 2): the first process of
//   each machine prints its own "Finished training" and test result, as the seed's
//   script does on every machine.
// - An unwritable --save-model or --checkpoint-dir is refused before the first step,
//   naming the path and the errno text; an existing model file is left untouched.
// - --num-processes far above the cores is refused with what the shm segment costs.
// - --backend gloo is accepted (an alias of tcp) and said so in --help.
// - Hand-launched workers given different --batch-size (or --lr, --precision, a string
//   compared by its text) stop at start-up with a message naming the flag and both
//   values, on every rank; so do workers that read data files of the same size and
//   other bytes, and workers of one machine with different --checkpoint-dir folders
//   (other machines may reach the folder under another path; two spellings of one
//   folder are one folder).
// - --backend tcp on one rank and shm on the other: refused within seconds, both
//   backends named, instead of waiting for the whole timeout.
#include "../check.h"
#include "../lib/mnist.h"
#include "../lib/mp.h"
#include "../lib/prog.h"
#include "dtrain/data.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static char bin[PATH_MAX + 64], dtrun[PATH_MAX + 64], tmp[128];

static int count(const char *hay, const char *needle) {
    int n = 0;
    for (const char *p = hay; (p = strstr(p, needle)); p++)
        n++;
    return n;
}

static void show_on_failure(int before, const char *out) {
    if (check_failed != before)
        fprintf(stderr, "---- output:\n%s\n----\n", out);
}

static void test_two_machines_print(void) {
    char *out;
    int   f0 = check_failed, port = mp_free_port();
    // Machine 1's output goes to a file; machine 0's to the pipe.
    int rc =
        test_run(&out,
                 "export DT_JOB_TOKEN=startup-test; "
                 "%s --num-machines 2 --num-processes 1 --machine-id 1 --master-addr 127.0.0.1 "
                 "--master-port %d --limit 256 --batch-size 32 >%s/m1.log 2>&1 & "
                 "%s --num-machines 2 --num-processes 1 --machine-id 0 --master-addr 127.0.0.1 "
                 "--master-port %d --limit 256 --batch-size 32 2>&1; r=$?; wait $! || r=9; "
                 "echo '==== machine 1'; cat %s/m1.log; exit $r",
                 bin, port, tmp, bin, port, tmp);
    CHECK_EQ(rc, 0);
    const char *m1 = strstr(out, "==== machine 1");
    CHECK(m1 != NULL);
    if (m1) {
        CHECK(strstr(out, "Finished training in") < m1); // machine 0's
        CHECK_EQ(count(m1, "Finished training in"), 1);  // machine 1's own
        CHECK_EQ(count(m1, "Test accuracy: "), 1);
        CHECK_EQ(count(m1, "training loss"), 0); // the loss lines stay rank 0's
    }
    CHECK_EQ(count(out, "Finished training in"), 2);
    CHECK_EQ(count(out, "Test accuracy: "), 2);
    show_on_failure(f0, out);
    free(out);
}

static void test_output_paths(void) {
    char *out, model[256];
    int   f0 = check_failed;
    // A missing folder: refused before the first step (no loss line with --log-every 1).
    CHECK_EQ(test_run(&out,
                      "%s --limit 64 --log-every 1 --no-test --save-model %s/no/such/m.dtck 2>&1",
                      bin, tmp),
             1);
    CHECK(strstr(out, "--save-model ") && strstr(out, "/no/such/m.dtck: its directory ") &&
          strstr(out, "No such file or directory"));
    CHECK(strstr(out, "training loss") == NULL);
    show_on_failure(f0, out);
    free(out);
    // A folder given as the model file.
    CHECK_EQ(test_run(&out, "%s --limit 64 --no-test --save-model %s 2>&1", bin, tmp), 1);
    CHECK(strstr(out, "expected a file path, found a directory") != NULL);
    free(out);
    // A checkpoint folder that cannot be created (its parent is a file), with an
    // existing model file: refused at once, and the model file left as it was.
    snprintf(model, sizeof model, "%s/keep.dtck", tmp);
    FILE *f = fopen(model, "w");
    CHECK(f != NULL);
    if (f) {
        fputs("precious", f);
        fclose(f);
    }
    CHECK_EQ(
        test_run(&out,
                 "%s --limit 64 --log-every 1 --no-test --save-model %s --checkpoint-dir %s/x 2>&1",
                 bin, model, model),
        1);
    CHECK(strstr(out, "--checkpoint-dir ") && strstr(out, "/keep.dtck/x") &&
          strstr(out, "Not a directory"));
    CHECK(strstr(out, "training loss") == NULL);
    free(out);
    char        buf[32] = "";
    struct stat st;
    f = fopen(model, "r");
    if (f) {
        CHECK(fgets(buf, sizeof buf, f) != NULL);
        fclose(f);
    }
    CHECK(strcmp(buf, "precious") == 0);
    CHECK(stat(model, &st) == 0 && st.st_size == 8);
    // A missing checkpoint folder is created, parents included, before training.
    CHECK_EQ(test_run(&out, "%s --limit 64 --no-test --max-steps 1 --checkpoint-dir %s/a/b/c 2>&1",
                      bin, tmp),
             0);
    free(out);
    char made[256];
    snprintf(made, sizeof made, "%s/a/b/c/step-000001", tmp);
    CHECK(stat(made, &st) == 0 && S_ISDIR(st.st_mode));
}

static void test_process_bound(void) {
    char *out;
    int   f0 = check_failed;
    CHECK_EQ(test_run(&out, "%s --limit 64 --no-test --num-processes 1000 2>&1", bin), 1);
    CHECK(strstr(out, "1000 local processes exceed the bound of") != NULL);
    CHECK(strstr(out, "DT_MAX_LOCAL_PROCS") != NULL);
    CHECK(strstr(out, "8244.4 MiB of /dev/shm") != NULL);
    show_on_failure(f0, out);
    free(out);
}

static void test_gloo(void) {
    char *out;
    int   f0 = check_failed;
    CHECK_EQ(test_run(&out, "%s --help", bin), 0);
    CHECK(strstr(out, "gloo (an alias of tcp") != NULL);
    CHECK(strstr(out, "75") != NULL);
    free(out);
    CHECK_EQ(test_run(&out,
                      "%s --limit 256 --batch-size 32 --no-test --stats --num-processes 2 "
                      "--backend gloo 2>&1",
                      bin),
             0);
    CHECK(strstr(out, "\"backend\": \"tcp\"") != NULL);
    show_on_failure(f0, out);
    free(out);
    CHECK_EQ(test_run(&out, "%s --help", dtrun), 0);
    CHECK(strstr(out, "--term-grace") != NULL);
    free(out);
}

// --help-env prints the settings table (src/core/settings.c) with the current values,
// from the training program and from dtrun alike.
static void test_help_env(void) {
    char *out;
    int   f0 = check_failed;
    CHECK_EQ(test_run(&out, "DT_RING_LAG=3 %s --help-env", bin), 0);
    CHECK(strstr(out, "DT_TIMEOUT_MS") && strstr(out, "default 1800000"));
    CHECK(strstr(out, "DT_LIVENESS_MS") && strstr(out, "DT_STORE_AUTH_MS"));
    CHECK(strstr(out, "DT_RING_LAG") && strstr(out, "[set: 3]"));
    CHECK(!strstr(out, "DT_TEST_")); // the test suite's own variables are not settings
    show_on_failure(f0, out);
    free(out);
    CHECK_EQ(test_run(&out, "%s --help", bin), 0);
    CHECK(strstr(out, "--help-env") != NULL);
    free(out);
    CHECK_EQ(test_run(&out, "%s --help-env", dtrun), 0);
    CHECK(strstr(out, "DT_MAX_LOCAL_PROCS") != NULL);
    free(out);
}

// A copy of the Fashion-MNIST files in dir (plain IDX) with one byte of the first
// training image changed: the same sizes, other bytes.
static bool write_changed_copy(const char *dir) {
    static const char *const names[] = {"train-images-idx3-ubyte", "train-labels-idx1-ubyte",
                                        "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"};
    for (int i = 0; i < 4; i++) {
        char from[PATH_MAX], to[PATH_MAX];
        snprintf(from, sizeof from, "%s/%s.gz", tl_fmnist_dir(), names[i]);
        snprintf(to, sizeof to, "%s/%s", dir, names[i]);
        dt_idx x;
        if (!CHECK(dt_idx_read(from, &x) == DT_OK))
            return false;
        if (i == 0)
            x.data[100] ^= 1;
        bool ok = CHECK(dt_idx_write(to, x.data, x.ndim, x.dims, false) == DT_OK);
        dt_idx_free(&x);
        if (!ok)
            return false;
    }
    return true;
}

static void test_flag_mismatch(void) {
    char data[256], ck[256], link[256], other_ck[600], same_ck[600], data_flag[300];
    snprintf(data, sizeof data, "%s/changed-data", tmp);
    snprintf(ck, sizeof ck, "%s/ck", tmp);
    snprintf(link, sizeof link, "%s/ck-link", tmp);
    mkdir(data, 0755);
    mkdir(ck, 0755);
    CHECK(symlink(ck, link) == 0); // another spelling of the same folder
    if (!write_changed_copy(data))
        return;
    snprintf(data_flag, sizeof data_flag, "--data-dir %s", data);
    snprintf(other_ck, sizeof other_ck, "--checkpoint-dir %s/b", tmp);
    snprintf(same_ck, sizeof same_ck, "--checkpoint-dir %s --max-steps 1", link);
    char ck0[300];
    snprintf(ck0, sizeof ck0, "--checkpoint-dir %s --max-steps 1", ck);
    struct {
        const char *env1, *flags0, *flags1, *want;
        int         rc;
    } cases[] = {
        {"", "", "--batch-size 16",
         "--batch-size must be the same on every rank: rank 0 has 32, rank 1 has 16", 1},
        {"", "", "--lr 0.25",
         "--lr must be the same on every rank: rank 0 has 0.5, rank 1 has 0.25", 1},
        {"", "", "--stats", "--stats must be the same on every rank: rank 0 has off, rank 1 has on",
         1},
        // Strings by their text, not by whether they were given.
        {"", "--precision fp32", "--precision bf16",
         "--precision must be the same on every rank: rank 0 has \"fp32\", rank 1 has "
         "\"bf16\"",
         1},
        // Files of the same size, one byte apart.
        {"", "", data_flag,
         "the training set's content (--data-dir, --limit) must be the same on every rank: "
         "rank 0 has 0x",
         1},
        // One machine, two folders; then another machine's path to the same folder, and
        // one machine's two spellings of one folder.
        {"", ck0, other_ck,
         "--checkpoint-dir must name the same folder on the ranks of one "
         "machine: rank 0 has \"",
         1},
        {"DT_HOST_ID=elsewhere", ck0, same_ck, "Finished training", 0},
        {"", ck0, same_ck, "Finished training", 0},
        {"", ck0, "", "--checkpoint-dir must be given on every rank or on none: rank 0 has \"", 1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *out;
        int   f0 = check_failed, port = mp_free_port();
        int   rc = test_run(
              &out,
              "export MASTER_ADDR=127.0.0.1 MASTER_PORT=%d WORLD_SIZE=2 DT_JOB_TOKEN=mm "
                "DT_TIMEOUT_MS=60000; "
                "%s RANK=1 LOCAL_RANK=1 %s --limit 256 --no-test --batch-size 32 %s >%s/r1.log 2>&1 & "
                "RANK=0 LOCAL_RANK=0 %s --limit 256 --no-test --batch-size 32 %s 2>&1; "
                "r=$?; wait $!; r1=$?; echo \"==== rank 1 exit $r1\"; cat %s/r1.log; "
                "exit $r",
              port, cases[i].env1, bin, cases[i].flags1, tmp, bin, cases[i].flags0, tmp);
        CHECK_EQ(rc, cases[i].rc);
        char exit1[64];
        snprintf(exit1, sizeof exit1, "==== rank 1 exit %d", cases[i].rc);
        CHECK_EQ(count(out, exit1), 1);
        CHECK_EQ(count(out, cases[i].want), cases[i].rc ? 2 : 1); // rank 0 and rank 1 alike
        if (cases[i].rc)
            CHECK(strstr(out, "training loss") == NULL);
        show_on_failure(f0, out);
        free(out);
    }
}

// tcp on one rank, shm on the other: each would wait in its own backend's set-up for
// the other until the timeout (60 s here; 30 min by default).
static void test_backend_mismatch(void) {
    char  *out;
    int    f0 = check_failed, port = mp_free_port();
    double t0   = dt_now();
    int    rc   = test_run(&out,
                           "export MASTER_ADDR=127.0.0.1 MASTER_PORT=%d WORLD_SIZE=2 DT_JOB_TOKEN=bk "
                                "DT_TIMEOUT_MS=60000; "
                                "RANK=1 LOCAL_RANK=1 %s --limit 64 --no-test --backend shm >%s/b1.log 2>&1 & "
                                "RANK=0 LOCAL_RANK=0 %s --limit 64 --no-test --backend tcp 2>&1; "
                                "r=$?; wait $!; r1=$?; echo \"==== rank 1 exit $r1\"; cat %s/b1.log; exit $r",
                           port, bin, tmp, bin, tmp);
    double secs = dt_now() - t0;
    CHECK_EQ(rc, 1);
    CHECK_EQ(count(out, "==== rank 1 exit 1"), 1);
    CHECK_EQ(count(out, "backend mismatch: rank 1 asks for backend shm, rank 0 for tcp"), 2);
    CHECK(secs < 20.0);
    show_on_failure(f0, out);
    free(out);
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
    snprintf(tmp, sizeof tmp, "/tmp/dt_startup_XXXXXX");
    if (!CHECK(mkdtemp(tmp)))
        return check_summary();
    RUN(test_two_machines_print);
    RUN(test_output_paths);
    RUN(test_process_bound);
    RUN(test_gloo);
    RUN(test_help_env);
    RUN(test_flag_mismatch);
    RUN(test_backend_mismatch);
    char cmd[256];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmp);
    if (check_failed == 0)
        (void)!system(cmd);
    else
        fprintf(stderr, "files kept in %s\n", tmp);
    return check_summary();
}
