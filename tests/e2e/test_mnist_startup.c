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
// - Hand-launched workers given different --batch-size (or --lr) stop at start-up with
//   a message naming the flag and both values, on every rank.
#include "../check.h"
#include "../lib/mp.h"
#include "../lib/prog.h"

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

static void test_flag_mismatch(void) {
    struct {
        const char *flags1, *want;
    } cases[] = {
        {"--batch-size 16", "--batch-size must be the same on every rank: rank 0 has 32, rank 1 "
                            "has 16"},
        {"--batch-size 32 --lr 0.25",
         "--lr must be the same on every rank: rank 0 has 0.5, rank 1 has 0.25"},
        {"--batch-size 32 --stats", "--stats must be the same on every rank: rank 0 has off, "
                                    "rank 1 has on"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *out;
        int   f0 = check_failed, port = mp_free_port();
        int   rc =
            test_run(&out,
                     "export MASTER_ADDR=127.0.0.1 MASTER_PORT=%d WORLD_SIZE=2 DT_JOB_TOKEN=mm "
                     "DT_TIMEOUT_MS=60000; "
                     "RANK=1 LOCAL_RANK=1 %s --limit 256 --no-test %s >%s/r1.log 2>&1 & "
                     "RANK=0 LOCAL_RANK=0 %s --limit 256 --no-test --batch-size 32 2>&1; "
                     "r=$?; wait $!; r1=$?; echo \"==== rank 1 exit $r1\"; cat %s/r1.log; "
                     "exit $r",
                     port, bin, cases[i].flags1, tmp, bin, tmp);
        CHECK_EQ(rc, 1);
        CHECK_EQ(count(out, "==== rank 1 exit 1"), 1);
        CHECK_EQ(count(out, cases[i].want), 2); // rank 0 and rank 1 say the same
        CHECK(strstr(out, "training loss") == NULL);
        show_on_failure(f0, out);
        free(out);
    }
}

int main(void) {
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
    char cmd[256];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmp);
    if (check_failed == 0)
        (void)!system(cmd);
    else
        fprintf(stderr, "files kept in %s\n", tmp);
    return check_summary();
}
