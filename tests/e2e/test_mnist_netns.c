// test_mnist_netns.c: the README's two-machine command lines, for real: two network
// namespaces on one switch (10.201.0.1/24 and 10.201.0.2/24), one
// `dtrain-mnist --num-machines 2 --num-processes 2 --machine-id K --master-addr A
// --master-port P` in each, nothing else.
//
// - As printed (no token anywhere): both machines train and exit 0.
// - Different --job-token values: machine 1 exits at once saying "job token mismatch"
//   and why, and machine 0 says at once that it refused the client at 10.201.0.2
//   (instead of waiting silently for the 30-minute timeout); neither output holds
//   either token.
//
// - --master-port alone (or MASTER_PORT exported) on one machine: 127.0.0.1.
//
// Needs root (ip netns) for the first two; skips them otherwise, like test_dtrun_netns.
#include "test_netns_lib.h"

static netns_net np;

// Machine i: the README's command line (plus a small run), inside namespace i.
static void start_machine(run *r, const char *dir, int i, const char *token) {
    char id[4];
    snprintf(id, sizeof id, "%d", i);
    char       *argv[32];
    int         k   = 0;
    const char *a[] = {
        mnist_path, "--num-machines", "2",          "--num-processes", "2",         "--machine-id",
        id,         "--master-addr",  "10.201.0.1", "--master-port",   "29511",     "--limit",
        "1024",     "--batch-size",   "64",         "--no-test",       "--threads", "1"};
    for (size_t j = 0; j < sizeof a / sizeof a[0]; j++)
        argv[k++] = (char *)(uintptr_t)a[j];
    if (token) {
        argv[k++] = "--job-token";
        argv[k++] = (char *)(uintptr_t)token;
    }
    argv[k] = NULL;
    char tag[8];
    snprintf(tag, sizeof tag, "m%d", i);
    start_in_ns(&np, r, dir, i, tag, argv, "60000", NULL);
}

static void test_readme_lines(void) {
    char dir[PATH_MAX];
    scenario_dir(dir, sizeof dir, "readme");
    run m0, m1;
    start_machine(&m1, dir, 1, NULL);
    start_machine(&m0, dir, 0, NULL);
    CHECK_EQ(run_wait(&m0, 120), 0);
    CHECK_EQ(run_wait(&m1, 120), 0);
    fprintf(stderr, "     README's two machines: trained in %.1f s\n", m0.end - m0.start);
    if (check_failed) {
        run_dump(&m0, "machine 0");
        run_dump(&m1, "machine 1");
    }
    run_free(&m0);
    run_free(&m1);
}

static void test_token_mismatch(void) {
    char dir[PATH_MAX];
    scenario_dir(dir, sizeof dir, "mismatch");
    run m0, m1;
    start_machine(&m0, dir, 0, "alpha-secret-1");
    start_machine(&m1, dir, 1, "bravo-secret-2");
    // The joiner exits by itself, at once, and says why.
    run_wait(&m1, 30);
    CHECK(m1.rc != 0 && m1.rc != -1);
    CHECK(m1.end - m1.start < 20);
    CHECK(strstr(m1.err, "job token mismatch") != NULL);
    CHECK(strstr(m1.err, "--job-token") != NULL);
    // Machine 0 has said so already.
    double deadline = mono_s() + 10;
    char  *e0       = NULL;
    for (;;) {
        free(e0);
        e0 = read_file(m0.err_path);
        if ((e0 && strstr(e0, "refused the client at 10.201.0.2")) || mono_s() > deadline)
            break;
        sleep_s(0.05);
    }
    CHECK(e0 && strstr(e0, "refused the client at 10.201.0.2") != NULL);
    CHECK(mono_s() - m1.start < 25);
    for (int i = 0; i < 2; i++) {
        const char *t = i ? m1.err : e0;
        CHECK(t && !strstr(t, "alpha-secret") && !strstr(t, "bravo-secret"));
    }
    kill(m0.pid, SIGKILL); // its workers die with it (PR_SET_PDEATHSIG)
    run_wait(&m0, 10);
    if (check_failed) {
        run_dump(&m0, "machine 0");
        run_dump(&m1, "machine 1");
    }
    free(e0);
    run_free(&m0);
    run_free(&m1);
}

// Bug 2: --master-port without --master-addr (or MASTER_PORT exported) on one machine
// means 127.0.0.1, as --help says. Needs no namespace.
static void test_master_port_alone(void) {
    for (int exported = 0; exported < 2; exported++) {
        char cmd[2 * PATH_MAX];
        snprintf(cmd, sizeof cmd,
                 "env -u MASTER_ADDR -u RANK -u WORLD_SIZE -u DT_JOB_TOKEN %s %s --num-processes "
                 "2 %s --limit 256 --no-test --threads 1 >/dev/null 2>&1",
                 exported ? "MASTER_PORT=29512" : "-u MASTER_PORT", mnist_path,
                 exported ? "" : "--master-port 29513");
        CHECK_EQ(netns_sh("%s", cmd), 0);
    }
}

int main(void) {
    if (!CHECK(find_bins()) || !CHECK(access(mnist_path, X_OK) == 0)) {
        fprintf(stderr, "dtrain-mnist not found next to the tests (make programs)\n");
        return check_summary();
    }
    unsetenv("DT_JOB_TOKEN"); // the machines get a token from the command line only
    RUN(test_master_port_alone);
    char why[200];
    if (!netns_setup(&np, 2, "mnist-test", "dmv", "10.201.0", why, sizeof why)) {
        if (np.made) {
            CHECK(!"network namespaces set up");
            fprintf(stderr, "     %s\n", why);
            netns_teardown(&np);
        } else {
            printf("SKIP test_mnist_netns: %s\n", why);
        }
        return check_summary();
    }
    make_tmp_root("mnist-netns-test");
    RUN(test_readme_lines);
    RUN(test_token_mismatch);
    netns_teardown(&np);
    if (!check_failed)
        remove_tree(tmp_root);
    return check_summary();
}
