// test_dtrun_ckpt.c: a worker killed with SIGKILL at a random step of a dtrain-mnist
// job under `dtrun --max-restarts 1`, with checkpoints: the job finishes, resumed from
// the newest complete checkpoint, and its final weights are bitwise identical to an
// uninterrupted run with the same seed and world size (the "Parameters identical ...
// (CRC32C ...)" line, and the --save-model files compared byte for byte).
//
// Needs dtrain-mnist's checkpoint flags (--checkpoint-dir, --checkpoint-every, --resume,
// --save-model); a build without them skips with a message.
#include "test_dtrun_lib.h"

#define NPROC 2
#define LIMIT "2048" // 2048 samples / 2 ranks / batch 32 = 32 steps

static bool mnist_has_checkpoints(void) {
    char cmd[PATH_MAX + 128];
    snprintf(cmd, sizeof cmd, "%s --help 2>&1", mnist_path);
    FILE *p = popen(cmd, "r");
    char  line[512];
    bool  has = false;
    while (p && fgets(line, sizeof line, p))
        has |= strstr(line, "--checkpoint-dir") != NULL;
    if (p)
        pclose(p);
    return has;
}

static void test_kill_and_resume(void) {
    char dir[PATH_MAX], ref_model[PATH_MAX + 16], model[PATH_MAX + 16], ckpt[PATH_MAX + 16];
    scenario_dir(dir, sizeof dir, "ckpt");
    snprintf(ref_model, sizeof ref_model, "%s/ref.model", dir);
    snprintf(model, sizeof model, "%s/killed.model", dir);
    snprintf(ckpt, sizeof ckpt, "%s/checkpoints", dir);

    // The uninterrupted run.
    char *ref_argv[] = {dtrun_path,  "--nproc-per-node", "2",       mnist_path,  "--limit",
                        LIMIT,       "--batch-size",     "32",      "--threads", "1",
                        "--no-test", "--save-model",     ref_model, NULL};
    run   ref;
    run_start(&ref, dir, "reference", ref_argv, NULL);
    CHECK_EQ(run_wait(&ref, 120), 0);
    char ref_crc[16];
    crc_of(ref.out, ref_crc);
    CHECK(ref_crc[0] != '\0');

    // The same job, a worker killed at a random step, checkpoints every 4 steps.
    static unsigned seed;
    if (!seed)
        seed = (unsigned)getpid() * 2654435761u ^ (unsigned)time(NULL);
    int step   = 5 + (int)(rand_r(&seed) % 22); // in [5, 26] of 32
    int victim = (int)(rand_r(&seed) % NPROC);
    fprintf(stderr, "     killing rank %d after step %d\n", victim, step);
    char *argv[] = {dtrun_path,
                    "--nproc-per-node",
                    "2",
                    "--max-restarts",
                    "1",
                    mnist_path,
                    "--limit",
                    LIMIT,
                    "--batch-size",
                    "32",
                    "--threads",
                    "1",
                    "--no-test",
                    "--log-every",
                    "1",
                    "--checkpoint-dir",
                    ckpt,
                    "--checkpoint-every",
                    "4",
                    "--resume",
                    "--save-model",
                    model,
                    NULL};
    run   r;
    run_start(&r, dir, "killed", argv, NULL);
    char want[64];
    snprintf(want, sizeof want, "[rank 0] epoch: 0 [%d/", step);
    double deadline = mono_s() + 60;
    bool   reached  = false;
    while (!reached && mono_s() < deadline) {
        char *o = read_file(r.out_path);
        reached = strstr(o, want) != NULL || strstr(o, "Finished training") != NULL;
        free(o);
        if (!reached)
            sleep_s(0.001);
    }
    int pid = worker_pid(r.pid, victim);
    CHECK(reached && pid > 0);
    if (pid > 0)
        kill(pid, SIGKILL);
    CHECK_EQ(run_wait(&r, 120), 0);
    snprintf(want, sizeof want, "root cause: rank %d (local rank %d on node 0", victim, victim);
    CHECK(strstr(r.err, want) != NULL);
    CHECK(strstr(r.err, "was killed by signal 9 (SIGKILL)") != NULL);
    CHECK(strstr(r.err, "restarting the group (restart 1 of 1)") != NULL);
    CHECK(strstr(r.out, "[rank 0] resumed from ") != NULL);
    char crc[16];
    crc_of(r.out, crc);
    CHECK(crc[0] && strcmp(crc, ref_crc) == 0);
    CHECK(same_file(model, ref_model));
    if (crc[0] && strcmp(crc, ref_crc) == 0)
        fprintf(stderr, "     killed and resumed: same weights as uninterrupted (CRC32C %s)\n",
                crc);
    CHECK(no_marker_procs(ckpt, 2)); // the scenario's directory is in every command line
    if (check_failed) {
        run_dump(&ref, "uninterrupted");
        run_dump(&r, "killed");
    }
    run_free(&ref);
    run_free(&r);
}

// ------------------------------------------------------------------ measurements
//
// `test_dtrun_ckpt measure` (not part of the test run; prints, asserts nothing):
// - the time from a worker's SIGKILL to every other worker gone, median over 10 kills,
//   on one node (4 workers) and across two dtruns (2 + 2, the victim on node 1);
// - the time from a worker's SIGKILL to training resumed under --max-restarts 1 with
//   checkpoints: until rank 0 prints "resumed from", and until its first step after.

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static void print_stats(const char *what, double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    printf("%-58s median %7.1f ms  (min %.1f, max %.1f, n=%d)\n", what, v[n / 2] * 1000,
           v[0] * 1000, v[n - 1] * 1000, n);
    fflush(stdout);
}

// Waits until rank 0's output (in path) shows step `step`.
static bool wait_step(const char *path, int step, double timeout_s) {
    char want[64];
    snprintf(want, sizeof want, "[rank 0] epoch: 0 [%d/", step);
    double deadline = mono_s() + timeout_s;
    while (mono_s() < deadline) {
        char *o  = read_file(path);
        bool  ok = strstr(o, want) != NULL;
        free(o);
        if (ok)
            return true;
        sleep_s(0.001);
    }
    return false;
}

static double kill_and_time(const int *pids, int n, int victim) {
    double t0 = mono_s();
    kill(pids[victim], SIGKILL);
    for (;;) {
        bool any = false;
        for (int i = 0; i < n; i++)
            any |= i != victim && pid_alive(pids[i]);
        if (!any)
            return mono_s() - t0;
        if (mono_s() - t0 > 30)
            return -1;
        sleep_s(0.0002);
    }
}

static void measure_stop(bool two_nodes) {
    enum { KILLS = 10 };
    double   t[KILLS];
    unsigned seed = (unsigned)getpid();
    int      got  = 0;
    for (int k = 0; k < KILLS; k++) {
        char dir[PATH_MAX];
        scenario_dir(dir, sizeof dir, "measure-stop");
        char *common[] = {mnist_path,  "--limit", "60000",     "--batch-size", "32",
                          "--threads", "1",       "--no-test", "--log-every",  "1",
                          "--backend", "tcp",     NULL};
        run   r[2];
        int   nodes = two_nodes ? 2 : 1, port = free_port();
        for (int node = 0; node < nodes; node++) {
            char  nr[16], mp[16];
            char *argv[32];
            int   a = 0;
            snprintf(nr, sizeof nr, "%d", node);
            snprintf(mp, sizeof mp, "%d", port);
            argv[a++] = dtrun_path;
            argv[a++] = "--nproc-per-node";
            argv[a++] = two_nodes ? "2" : "4";
            if (two_nodes) {
                char *mf[] = {"--nnodes", "2", "--node-rank", nr, "--master-port", mp};
                for (int i = 0; i < 6; i++)
                    argv[a++] = mf[i];
            }
            for (int i = 0; common[i]; i++)
                argv[a++] = common[i];
            argv[a] = NULL;
            run_start(&r[node], dir, node ? "node1" : "node0", argv, NULL);
        }
        int  pids[4], n = 0;
        bool ok = wait_step(r[0].out_path, 3 + (int)(rand_r(&seed) % 20), 60);
        for (int node = 0; ok && node < nodes; node++)
            for (int rank = 0; rank < 4 / nodes; rank++)
                pids[n++] = worker_pid(r[node].pid, node * (4 / nodes) + rank);
        for (int i = 0; i < n; i++)
            ok &= pids[i] > 0;
        int victim = two_nodes ? 2 + (int)(rand_r(&seed) % 2) : (int)(rand_r(&seed) % 4);
        if (ok && n == 4 && (t[got] = kill_and_time(pids, 4, victim)) >= 0)
            got++;
        for (int node = 0; node < nodes; node++) {
            run_wait(&r[node], 60);
            run_free(&r[node]);
        }
    }
    if (got)
        print_stats(two_nodes ? "SIGKILL of a worker on node 1 -> the 3 others gone (2 nodes)"
                              : "SIGKILL of a worker -> the 3 others gone (1 node, 4 workers)",
                    t, got);
}

static void measure_resume(void) {
    enum { KILLS = 5 };
    double   t_resumed[KILLS], t_step[KILLS];
    unsigned seed = (unsigned)getpid() * 7u;
    int      got  = 0;
    for (int k = 0; k < KILLS; k++) {
        char dir[PATH_MAX], ckpt[PATH_MAX + 16];
        scenario_dir(dir, sizeof dir, "measure-resume");
        snprintf(ckpt, sizeof ckpt, "%s/checkpoints", dir);
        char *argv[] = {dtrun_path,
                        "--nproc-per-node",
                        "2",
                        "--max-restarts",
                        "1",
                        mnist_path,
                        "--limit",
                        "8192",
                        "--batch-size",
                        "32",
                        "--threads",
                        "1",
                        "--no-test",
                        "--log-every",
                        "1",
                        "--checkpoint-dir",
                        ckpt,
                        "--checkpoint-every",
                        "10",
                        "--resume",
                        NULL};
        run   r;
        run_start(&r, dir, "job", argv, NULL);
        int  step = 20 + (int)(rand_r(&seed) % 80);
        bool ok   = wait_step(r.out_path, step, 60);
        int  pid  = ok ? worker_pid(r.pid, (int)(rand_r(&seed) % 2)) : -1;
        if (pid > 0) {
            double t0 = mono_s();
            kill(pid, SIGKILL);
            double resumed = -1, stepped = -1;
            while (mono_s() - t0 < 60 && stepped < 0) {
                char       *o = read_file(r.out_path);
                const char *p = strstr(o, "[rank 0] resumed from ");
                if (p && resumed < 0)
                    resumed = mono_s() - t0;
                if (p && strstr(p, "training loss"))
                    stepped = mono_s() - t0;
                free(o);
                sleep_s(0.0005);
            }
            if (resumed >= 0 && stepped >= 0) {
                t_resumed[got] = resumed;
                t_step[got++]  = stepped;
            }
        }
        run_wait(&r, 120);
        run_free(&r);
    }
    if (got) {
        print_stats("SIGKILL of a worker -> \"resumed from\" printed (restart)", t_resumed, got);
        print_stats("SIGKILL of a worker -> first training step after the resume", t_step, got);
    }
}

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "measure") == 0) {
        if (!find_bins())
            return 1;
        make_tmp_root("dtrun-measure");
        measure_stop(false);
        measure_stop(true);
        if (mnist_has_checkpoints())
            measure_resume();
        remove_tree(tmp_root);
        return 0;
    }
    if (argc > 1 && strcmp(argv[1], "worker") == 0)
        return worker_main(argc, argv);
    if (!CHECK(find_bins()) || !CHECK(access(mnist_path, X_OK) == 0)) {
        fprintf(stderr, "dtrun or dtrain-mnist not found next to the tests (make programs)\n");
        return check_summary();
    }
    if (!mnist_has_checkpoints()) {
        printf("SKIP test_dtrun_ckpt: this dtrain-mnist has no --checkpoint-dir (the "
               "checkpoint work is not merged into this build)\n");
        return check_summary();
    }
    make_tmp_root("dtrun-ckpt-test");
#ifdef DT_SANITIZE // one random kill there (20 s a round); the release build's two vary the point
    RUN(test_kill_and_resume);
#else
    for (int i = 0; i < 2; i++) // two random kills
        RUN(test_kill_and_resume);
#endif
    if (!check_failed)
        remove_tree(tmp_root);
    return check_summary();
}
