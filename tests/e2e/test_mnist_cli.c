// test_mnist_cli.c: the dtrain-mnist program as a user runs it, in real processes.
//
// - --num-processes 2 on a few real samples: exits 0, rank 0 alone prints the loss
//   lines, the replicas end identical, the test accuracy is printed once.
// - The same job started as two workers with a launcher's environment (RANK,
//   WORLD_SIZE, MASTER_ADDR, MASTER_PORT) ends with the same parameter checksum as
//   the forked job: both launch styles are one computation.
// - --ddp-compress bf16 and powersgd train a 2-process job with identical replicas.
// - Bad flags are refused with exit code 2 and a message naming the flag.
// - --device: a bad name is a usage error; asking for CUDA where there is none (no
//   plugin in the build, or no GPU) fails at start with a message naming what is
//   missing; with a GPU the job trains.
#include "../check.h"
#include "../lib/mnist.h"
#include "../lib/mp.h"
#include "../lib/prog.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

static char bin[PATH_MAX + 64];

static bool find_bin(void) {
    return test_program_path("dtrain-mnist", bin, sizeof bin);
}

// Runs a shell command; returns its exit status and its output in *out (malloc'd).
static int run(const char *cmd, char **out) {
    return test_run(out, "%s", cmd);
}

static int count(const char *hay, const char *needle) {
    int n = 0;
    for (const char *p = hay; (p = strstr(p, needle)); p++)
        n++;
    return n;
}

static void crc_of(const char *out, char crc[16]) {
    const char *p = strstr(out, "(CRC32C ");
    crc[0]        = '\0';
    if (p)
        sscanf(p, "(CRC32C %8s", crc);
}

static void test_spawned(void) {
    char cmd[3 * PATH_MAX], *out;
    snprintf(cmd, sizeof cmd, "%s --limit 1024 --batch-size 32 --num-processes 2 2>&1", bin);
    int rc = run(cmd, &out);
    CHECK_EQ(rc, 0);
    // 1024 / 2 ranks / batch 32 = 16 batches: loss lines at 0 and 10, from rank 0 only
    CHECK_EQ(count(out, "training loss"), 2);
    CHECK_EQ(count(out, "Finished training in"), 1);
    CHECK_EQ(count(out, "Parameters identical on all 2 ranks"), 1);
    CHECK_EQ(count(out, "Test accuracy: "), 1);
    char crc1[16];
    crc_of(out, crc1);
    CHECK(crc1[0] != '\0');
    if (rc)
        fprintf(stderr, "%s\n", out);
    free(out);

    // The same job, as two workers of a launcher.
    int port = mp_free_port();
    snprintf(
        cmd, sizeof cmd,
        "export MASTER_ADDR=127.0.0.1 MASTER_PORT=%d WORLD_SIZE=2 DT_JOB_TOKEN=cli-test; "
        "RANK=1 LOCAL_RANK=1 %s --limit 1024 --batch-size 32 --no-test >/dev/null 2>&1 & "
        "RANK=0 LOCAL_RANK=0 %s --limit 1024 --batch-size 32 --no-test 2>&1; r=$?; wait; exit $r",
        port, bin, bin);
    rc = run(cmd, &out);
    CHECK_EQ(rc, 0);
    char crc2[16];
    crc_of(out, crc2);
    CHECK(strcmp(crc1, crc2) == 0);
    if (rc || strcmp(crc1, crc2))
        fprintf(stderr, "%s\n(spawned run's CRC %s)\n", out, crc1);
    free(out);
}

// --ddp-compress: bf16 and PowerSGD each train a 2-process job to the end, the replicas
// identical (every rank gets the same bits from either), and a loss line that differs
// from the uncompressed job's (the compression really ran). Two steps a rank: under
// ASan a longer job costs seconds per mode.
static void test_compressed(void) {
    char               cmd[3 * PATH_MAX], *out, first[3][160] = {{0}};
    static const char *modes[] = {"none", "bf16", "powersgd --powersgd-rank 2"};
    for (int m = 0; m < 3; m++) {
        snprintf(cmd, sizeof cmd,
                 "%s --limit 128 --batch-size 32 --num-processes 2 --no-test --log-every 1 "
                 "--ddp-compress %s 2>&1",
                 bin, modes[m]);
        int rc = run(cmd, &out);
        CHECK_EQ(rc, 0);
        CHECK_EQ(count(out, "Parameters identical on all 2 ranks"), 1);
        const char *l = strstr(out, "training loss");
        l             = l ? strstr(l + 1, "training loss") : NULL; // the second: after steps
        if (CHECK(l != NULL))
            snprintf(first[m], sizeof first[m], "%.40s", l);
        if (rc)
            fprintf(stderr, "%s\n", out);
        free(out);
    }
    CHECK(strcmp(first[0], first[1]) != 0 && strcmp(first[0], first[2]) != 0);
    snprintf(cmd, sizeof cmd, "%s --ddp-compress zip 2>&1", bin);
    CHECK_EQ(run(cmd, &out), 2);
    CHECK(strstr(out, "--ddp-compress expects none, bf16, fp16 or powersgd") != NULL);
    free(out);
}

static void test_bad_flags(void) {
    char cmd[2 * PATH_MAX], *out;
    snprintf(cmd, sizeof cmd, "%s --batch-size zero 2>&1", bin);
    CHECK_EQ(run(cmd, &out), 2);
    CHECK(strstr(out, "--batch-size expects an integer in [1, 65536], found \"zero\"") != NULL);
    free(out);
    snprintf(cmd, sizeof cmd, "%s --num-machines 2 --num-processes 1 --machine-id 2 2>&1", bin);
    CHECK_EQ(run(cmd, &out), 2);
    CHECK(strstr(out, "--machine-id expects a value below --num-machines (2), found 2") != NULL);
    free(out);
    snprintf(cmd, sizeof cmd, "%s --backend carrier-pigeon 2>&1", bin);
    CHECK_EQ(run(cmd, &out), 2);
    CHECK(strstr(out, "--backend expects auto, shm, tcp, hybrid, mpi or nccl") != NULL);
    free(out);
    snprintf(cmd, sizeof cmd, "%s --data-dir /nonexistent 2>&1", bin);
    CHECK_EQ(run(cmd, &out), 1);
    CHECK(strstr(out, "/nonexistent/train-images-idx3-ubyte") != NULL);
    free(out);
}

static void test_device_flags(void) {
    char cmd[2 * PATH_MAX], *out;
    snprintf(cmd, sizeof cmd, "%s --device gpu 2>&1", bin);
    CHECK_EQ(run(cmd, &out), 2);
    CHECK(strstr(out, "--device expects cpu, cuda or cuda:N, found \"gpu\"") != NULL);
    free(out);
    snprintf(cmd, sizeof cmd, "%s --num-gpu-processes 2 --device cpu 2>&1", bin);
    CHECK_EQ(run(cmd, &out), 2);
    CHECK(strstr(out, "--num-gpu-processes trains on GPUs") != NULL);
    free(out);
    snprintf(cmd, sizeof cmd, "%s --device cuda --limit 64 --no-test 2>&1", bin);
    int rc = run(cmd, &out);
    if (rc != 0) { // no GPU here: the reason, not a CPU run
        CHECK_EQ(rc, 1);
        CHECK(strstr(out, "dtrain-mnist: cuda: ") != NULL);
        CHECK(strstr(out, "Finished training") == NULL);
    }
    printf("--device cuda here: %s", out);
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
    RUN(test_spawned);
    RUN(test_compressed);
    RUN(test_bad_flags);
    RUN(test_device_flags);
    return check_summary();
}
