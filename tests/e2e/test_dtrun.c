// test_dtrun.c: the dtrun launcher on one node, with this binary as the worker program
// (test_dtrun_lib.h), in real processes.
//
// - The environment every worker sees (torchrun's variables, the restart count, one job
//   token, OMP_NUM_THREADS=1 only when unset, inherited variables kept, stale RANK
//   replaced); "[rank N]" prefixes on the right stream; per-rank log files; --tee.
// - A worker exiting 3 / killed by SIGKILL: the others (and their children) are gone
//   within 2 s, dtrun exits 1, the summary names the rank, the exit code or signal and
//   the victim's last lines.
// - Workers ignoring SIGTERM are killed after --stop-grace.
// - --max-restarts: a worker failing once, then success with restart count 1 seen by
//   everyone; a worker failing every time exhausts the budget.
// - SIGINT to dtrun stops everything (exit 130); SIGTERM too, and dtrun then exits 75
//   like workers that stop for a preemption (143 when a worker had to be killed after
//   --term-grace); SIGKILL to dtrun: the reaper kills every worker and their children.
// - SIGTERM to a worker at its first moments (it dies by the signal): a preemption, not
//   a crash: no restart, the others stopped, exit 75.
// - After every scenario no process with the scenario's marker is left (/proc).
// - Usage errors name the flag (exit 2).
#include "test_dtrun_lib.h"

// ------------------------------------------------------------------ environment and output

static void test_env_and_output(void) {
    char dir[PATH_MAX];
    scenario_dir(dir, sizeof dir, "env");
    new_mark("env");
    const char *flags[] = {"--nproc-per-node", "3", "--rdzv-id", "job42", NULL};
    const char *env[]   = {"RANK=77", "DTRUN_TEST_INHERITED=yes", NULL};
    unsetenv("OMP_NUM_THREADS");
    run r;
    run_start(&r, dir, "dtrun", dtrun_argv(flags, "env", dir, NULL), env);
    CHECK_EQ(run_wait(&r, 30), 0);
    char port0[128] = "", token0[128] = "";
    for (int rank = 0; rank < 3; rank++) {
        char path[PATH_MAX + 32], v[128], want[160];
        snprintf(path, sizeof path, "%s/env.%d", dir, rank);
        char *dump = read_file(path);
        CHECK(*dump);
        struct {
            const char *name;
            const char *value;
        } expect[] = {
            {"RANK", NULL},
            {"LOCAL_RANK", NULL},
            {"ROLE_RANK", NULL},
            {"WORLD_SIZE", "3"},
            {"LOCAL_WORLD_SIZE", "3"},
            {"ROLE_WORLD_SIZE", "3"},
            {"GROUP_RANK", "0"},
            {"GROUP_WORLD_SIZE", "1"},
            {"MASTER_ADDR", "127.0.0.1"},
            {"TORCHELASTIC_RESTART_COUNT", "0"},
            {"DT_RESTART_COUNT", "0"},
            {"TORCHELASTIC_MAX_RESTARTS", "0"},
            {"TORCHELASTIC_RUN_ID", "job42"},
            {"OMP_NUM_THREADS", "1"},
            {"DTRUN_TEST_INHERITED", "yes"},
        };
        for (size_t i = 0; i < sizeof expect / sizeof expect[0]; i++) {
            env_value(dump, expect[i].name, v, sizeof v);
            if (expect[i].value)
                snprintf(want, sizeof want, "%s", expect[i].value);
            else
                snprintf(want, sizeof want, "%d", rank);
            if (!CHECK(strcmp(v, want) == 0))
                fprintf(stderr, "     rank %d: %s=\"%s\", expected \"%s\"\n", rank, expect[i].name,
                        v, want);
        }
        // One port and one token for the whole job; a port a worker can bind.
        env_value(dump, "MASTER_PORT", v, sizeof v);
        long port = atol(v);
        CHECK(port >= 1 && port <= 65535);
        if (rank == 0)
            snprintf(port0, sizeof port0, "%s", v);
        CHECK(strcmp(v, port0) == 0);
        env_value(dump, "DT_JOB_TOKEN", v, sizeof v);
        CHECK(strlen(v) >= 16);
        if (rank == 0)
            snprintf(token0, sizeof token0, "%s", v);
        CHECK(strcmp(v, token0) == 0);
        free(dump);
        // Each line on its own stream, prefixed; the unfinished last line too.
        snprintf(want, sizeof want, "[rank %d] hello from rank %d\n", rank, rank);
        CHECK_EQ(count_of(r.out, want), 1);
        snprintf(want, sizeof want, "[rank %d] unfinished line from rank %d\n", rank, rank);
        CHECK_EQ(count_of(r.out, want), 1);
        snprintf(want, sizeof want, "[rank %d] note from rank %d\n", rank, rank);
        CHECK_EQ(count_of(r.err, want), 1);
        CHECK_EQ(count_of(r.out, "note from"), 0);
    }
    // Success does not leave the workers' children behind, nor wait for them.
    CHECK(r.end - r.start < 10);
    for (int rank = 0; rank < 3; rank++) {
        char path[PATH_MAX + 32];
        snprintf(path, sizeof path, "%s/cpid.%d", dir, rank);
        CHECK(!pid_file_alive(path));
    }
    CHECK(no_marker_procs(mark, 2));
    if (check_failed)
        run_dump(&r, "env");
    run_free(&r);

    // A user's OMP_NUM_THREADS is kept; a given --master-port is the workers' port.
    scenario_dir(dir, sizeof dir, "env-omp");
    new_mark("omp");
    const char *flags2[] = {"--nproc-per-node", "1", "--master-port", "23456", NULL};
    const char *env2[]   = {"OMP_NUM_THREADS=4", NULL};
    run_start(&r, dir, "dtrun", dtrun_argv(flags2, "env", dir, NULL), env2);
    CHECK_EQ(run_wait(&r, 30), 0);
    char path[PATH_MAX + 32], v[64];
    snprintf(path, sizeof path, "%s/env.0", dir);
    char *dump = read_file(path);
    env_value(dump, "OMP_NUM_THREADS", v, sizeof v);
    CHECK(strcmp(v, "4") == 0);
    env_value(dump, "MASTER_PORT", v, sizeof v);
    CHECK(strcmp(v, "23456") == 0);
    free(dump);
    run_free(&r);
}

static void test_log_dir(void) {
    for (int tee = 0; tee < 2; tee++) {
        char dir[PATH_MAX], logs[PATH_MAX + 8];
        scenario_dir(dir, sizeof dir, tee ? "tee" : "logdir");
        snprintf(logs, sizeof logs, "%s/logs", dir);
        new_mark("log");
        const char *flags[] = {"--nproc-per-node",   "2", "--log-dir", logs,
                               tee ? "--tee" : NULL, NULL};
        run         r;
        run_start(&r, dir, "dtrun", dtrun_argv(flags, "env", dir, NULL), NULL);
        CHECK_EQ(run_wait(&r, 30), 0);
        for (int rank = 0; rank < 2; rank++) {
            char path[PATH_MAX + 64], want[96];
            snprintf(path, sizeof path, "%s/attempt_0/rank_%d.log", logs, rank);
            char *log = read_file(path);
            snprintf(want, sizeof want, "hello from rank %d\n", rank);
            CHECK_EQ(count_of(log, want), 1);
            snprintf(want, sizeof want, "note from rank %d\n", rank);
            CHECK_EQ(count_of(log, want), 1);
            CHECK_EQ(count_of(log, "[rank"), 0); // files are per rank: no prefix
            free(log);
            snprintf(want, sizeof want, "[rank %d] hello from rank %d\n", rank, rank);
            CHECK_EQ(count_of(r.out, want), tee);
        }
        CHECK(no_marker_procs(mark, 2));
        run_free(&r);
    }
}

// ------------------------------------------------------------------ failures

typedef struct fail_case {
    const char *how;  // "exit3" or "kill9"
    const char *mode; // "fail" or "stubborn"
    int         nproc, victim;
    const char *grace;  // --stop-grace
    const char *expect; // in the summary
    const char *env;    // one more variable for dtrun, or NULL
} fail_case;

static void run_fail_case(const fail_case *fc) {
    char dir[PATH_MAX], n[16], victim[16];
    scenario_dir(dir, sizeof dir, fc->how);
    new_mark(fc->how);
    snprintf(n, sizeof n, "%d", fc->nproc);
    snprintf(victim, sizeof victim, "%d", fc->victim);
    const char *flags[] = {"--nproc-per-node", n, "--stop-grace", fc->grace, NULL};
    const char *extra[] = {n, victim, fc->how, NULL};
    const char *env[]   = {fc->env, NULL};
    run         r;
    run_start(&r, dir, "dtrun", dtrun_argv(flags, fc->mode, dir, extra), env);
    CHECK_EQ(run_wait(&r, 60), 1);
    char path[PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/death", dir);
    char  *d     = read_file(path);
    double death = atof(d);
    free(d);
    double stopped = r.end - death; // every worker reaped before dtrun exits
    CHECK(death > 0 && stopped >= 0 && stopped < 2.0);
    fprintf(stderr,
            "     %s of rank %d (%s): dtrun had stopped every worker and exited "
            "%.0f ms after the death\n",
            fc->how, fc->victim, fc->mode, stopped * 1000);
    char want[200];
    snprintf(want, sizeof want, "root cause: rank %d (local rank %d on node 0, host ", fc->victim,
             fc->victim);
    CHECK(strstr(r.err, want) != NULL);
    CHECK(strstr(r.err, fc->expect) != NULL);
    snprintf(want, sizeof want, "last lines of rank %d:", fc->victim);
    CHECK(strstr(r.err, want) != NULL);
    snprintf(want, sizeof want, "  | rank %d: about to fail\n", fc->victim);
    CHECK(strstr(r.err, want) != NULL);
    CHECK(strstr(r.err, "the job stops") != NULL);
    CHECK(strstr(r.err, "also failed") == NULL); // the others were stopped, not failures
    // Nobody left: workers, their children, the reaper.
    for (int rank = 0; rank < fc->nproc; rank++) {
        snprintf(path, sizeof path, "%s/pid.%d", dir, rank);
        CHECK(!pid_file_alive(path));
        snprintf(path, sizeof path, "%s/cpid.%d", dir, rank);
        CHECK(!pid_file_alive(path));
    }
    CHECK(no_marker_procs(mark, 2));
    if (check_failed)
        run_dump(&r, fc->how);
    run_free(&r);
}

static void test_worker_exits_3(void) {
    fail_case fc = {"exit3", "fail", 3, 1, "1", "exited with code 3 at ", NULL};
    run_fail_case(&fc);
}

static void test_worker_killed(void) {
    fail_case fc = {"kill9", "fail", 4, 2, "1", "was killed by signal 9 (SIGKILL) at ", NULL};
    run_fail_case(&fc);
    // The same where the kernel has no pidfd (dtrun then polls every 100 ms).
    fc.env = "DTRUN_NO_PIDFD=1";
    run_fail_case(&fc);
}

// Workers that ignore SIGTERM: SIGKILL after --stop-grace, still within 2 s.
static void test_stubborn_workers(void) {
    fail_case fc = {"exit3", "stubborn", 3, 0, "0.3", "exited with code 3 at ", NULL};
    run_fail_case(&fc);
}

// ------------------------------------------------------------------ restarts

static void test_restart_once(void) {
    char dir[PATH_MAX];
    scenario_dir(dir, sizeof dir, "restart");
    new_mark("restart");
    const char *flags[] = {"--nproc-per-node", "3", "--max-restarts", "2", NULL};
    const char *extra[] = {"1", "1", NULL}; // rank 1 fails while the count is below 1
    run         r;
    run_start(&r, dir, "dtrun", dtrun_argv(flags, "restart", dir, extra), NULL);
    CHECK_EQ(run_wait(&r, 60), 0);
    char path[PATH_MAX + 32];
    for (int rank = 0; rank < 3; rank++) {
        snprintf(path, sizeof path, "%s/restart.%d", dir, rank);
        CHECK_EQ(read_long(path), 1); // the last attempt was restart 1
    }
    CHECK_EQ(count_of(r.out, "[rank 0] rank 0: restart count 0\n"), 1);
    CHECK_EQ(count_of(r.out, "[rank 0] rank 0: restart count 1\n"), 1);
    CHECK_EQ(count_of(r.out, "restart count 2"), 0);
    CHECK(strstr(r.err, "restarting the group (restart 1 of 2)") != NULL);
    CHECK(strstr(r.err, "root cause: rank 1 (local rank 1 on node 0") != NULL);
    CHECK(strstr(r.err, "exited with code 1") != NULL);
    CHECK(strstr(r.err, "  | rank 1: failing on purpose") != NULL);
    CHECK(no_marker_procs(mark, 2));
    if (check_failed)
        run_dump(&r, "restart once");
    run_free(&r);
}

static void test_restarts_exhausted(void) {
    char dir[PATH_MAX];
    scenario_dir(dir, sizeof dir, "restart-all");
    new_mark("restart-all");
    const char *flags[] = {"--nproc-per-node", "2", "--max-restarts", "2", NULL};
    const char *extra[] = {"0", "99", NULL}; // rank 0 always fails
    run         r;
    run_start(&r, dir, "dtrun", dtrun_argv(flags, "restart", dir, extra), NULL);
    CHECK_EQ(run_wait(&r, 60), 1);
    char path[PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/restart.1", dir);
    CHECK_EQ(read_long(path), 2); // attempts 0, 1, 2
    CHECK_EQ(count_of(r.err, "job failed in attempt"), 3);
    CHECK(strstr(r.err, "restarting the group (restart 2 of 2)") != NULL);
    CHECK(strstr(r.err, "job failed in attempt 3 (restart count 2); no restarts left "
                        "(--max-restarts 2)") != NULL);
    CHECK(no_marker_procs(mark, 2));
    if (check_failed)
        run_dump(&r, "restarts exhausted");
    run_free(&r);
}

// ------------------------------------------------------------------ signals to dtrun

static void test_sigint(void) {
    for (int sig_i = 0; sig_i < 2; sig_i++) {
        int  sig = sig_i ? SIGTERM : SIGINT;
        char dir[PATH_MAX];
        scenario_dir(dir, sizeof dir, "sigint");
        new_mark("sigint");
        const char *flags[] = {"--nproc-per-node", "3", "--max-restarts", "3", NULL};
        run         r;
        run_start(&r, dir, "dtrun", dtrun_argv(flags, "hang", dir, NULL), NULL);
        CHECK(wait_files(dir, "pid", 3, 20));
        double t0 = mono_s();
        kill(r.pid, sig);
        // The workers end by the SIGTERM dtrun passes on: a clean stop, as a preemption.
        int status = sig == SIGTERM ? 75 : 128 + sig;
        CHECK_EQ(run_wait(&r, 20), status);
        fprintf(stderr, "     SIG%s to dtrun: everything gone after %.0f ms\n", sigabbrev_np(sig),
                (r.end - t0) * 1000);
        CHECK(r.end - t0 < 2.0);
        char want[96];
        snprintf(want, sizeof want, "interrupted by SIG%s on node 0", sigabbrev_np(sig));
        CHECK(strstr(r.err, want) != NULL);
        CHECK(strstr(r.err, "restarting") == NULL); // a signal is not a failure to retry
        CHECK(no_marker_procs(mark, 2));
        if (check_failed)
            run_dump(&r, "sigint");
        run_free(&r);
    }
}

// SIGTERM to dtrun whose workers ignore it: killed after --term-grace, and dtrun says so
// with 143 (not 75: they did not stop as asked).
static void test_sigterm_deaf_workers(void) {
    char dir[PATH_MAX];
    scenario_dir(dir, sizeof dir, "deaf");
    new_mark("deaf");
    const char *flags[] = {"--nproc-per-node", "2", "--term-grace", "0.5", NULL};
    run         r;
    run_start(&r, dir, "dtrun", dtrun_argv(flags, "deaf", dir, NULL), NULL);
    CHECK(wait_files(dir, "pid", 2, 20));
    kill(r.pid, SIGTERM);
    CHECK_EQ(run_wait(&r, 20), 128 + SIGTERM);
    CHECK(no_marker_procs(mark, 2));
    if (check_failed)
        run_dump(&r, "deaf workers");
    run_free(&r);
}

// SIGTERM to one worker as soon as it runs, and a little later: before any program could
// take it as a stop request it simply ends the worker. That is a preemption notice, as
// for a worker that saved and exited 75: the others are stopped, nothing restarts (with
// --max-restarts 3), dtrun exits 75.
static void test_worker_early_sigterm(void) {
    const double delays[] = {0, 0.05, 0.2};
    for (size_t i = 0; i < sizeof delays / sizeof delays[0]; i++) {
        char dir[PATH_MAX];
        scenario_dir(dir, sizeof dir, "early-term");
        new_mark("early-term");
        const char *flags[] = {"--nproc-per-node", "2", "--max-restarts", "3", NULL};
        run         r;
        run_start(&r, dir, "dtrun", dtrun_argv(flags, "hang", dir, NULL), NULL);
        int w = -1;
        for (double end = mono_s() + 20; w < 0 && mono_s() < end;)
            if ((w = worker_pid(r.pid, 1)) < 0)
                sleep_s(0.0005);
        CHECK(w > 0);
        sleep_s(delays[i]);
        if (w > 0)
            kill(w, SIGTERM);
        CHECK_EQ(run_wait(&r, 20), 75);
        CHECK(strstr(r.err, "rank 1 was ended by a SIGTERM that dtrun did not send") != NULL);
        CHECK(strstr(r.err, "restarting the group") == NULL);
        CHECK(strstr(r.err, "root cause") == NULL); // not a failure
        CHECK(no_marker_procs(mark, 2));
        if (check_failed)
            run_dump(&r, "early SIGTERM to a worker");
        run_free(&r);
    }
}

static void test_dtrun_killed(void) {
    char dir[PATH_MAX];
    scenario_dir(dir, sizeof dir, "sigkill");
    new_mark("sigkill");
    const char *flags[] = {"--nproc-per-node", "3", NULL};
    run         r;
    run_start(&r, dir, "dtrun", dtrun_argv(flags, "hang", dir, NULL), NULL);
    CHECK(wait_files(dir, "cpid", 3, 20));
    kill(r.pid, SIGKILL);
    CHECK_EQ(run_wait(&r, 20), 128 + SIGKILL);
    // Workers die with dtrun (PR_SET_PDEATHSIG); their children by the reaper.
    CHECK(no_marker_procs(mark, 2));
    run_free(&r);
}

// ------------------------------------------------------------------ usage

static void test_usage_errors(void) {
    struct {
        const char *args[6];
        const char *expect;
    } cases[] = {
        {{"--nproc-per-node", "two", "true"},
         "--nproc-per-node expects an integer in [1, 4096], "
         "found \"two\""},
        {{"--nproc-per-node", "0", "true"},
         "--nproc-per-node expects an integer in [1, 4096], "
         "found \"0\""},
        {{"--max-restarts", "-1", "true"}, "--max-restarts expects an integer"},
        {{"--master-port", "70000", "true"}, "--master-port expects an integer in [1, 65535]"},
        {{"--nnodes", "3:2", "true"}, "--nnodes expects MIN:MAX with MIN <= MAX, found \"3:2\""},
        {{"--nnodes", "1:4", "--standalone", "true"},
         "--standalone is for a single node, but "
         "--nnodes is an elastic range"},
        {{"--nnodes", "2", "--node-rank", "2", "true"},
         "--node-rank expects a value below --nnodes (2), found 2"},
        {{"--standalone", "--nnodes", "2", "true"}, "--standalone is for a single node"},
        {{"--stop-grace", "soon", "true"}, "--stop-grace expects a number"},
        {{"--rdzv-endpoint", "host:99999", "true"}, "--rdzv-endpoint's port expects an integer"},
        {{"--rdzv-endpoint", ":1", "true"}, "--rdzv-endpoint expects HOST[:PORT]"},
        {{"--rdzv-endpoint", "h:1", "--master-port", "2", "true"}, "expected one or the other"},
        {{"--frobnicate", "true"}, "unknown option \"--frobnicate\""},
        {{"--max-restarts"}, "option \"--max-restarts\" expects a value"},
        {{"--nproc-per-node", "2"}, "expected a PROGRAM to run"},
        {{"no-such-program-xyz"}, "cannot run \"no-such-program-xyz\": not found in PATH"},
    };
    char dir[PATH_MAX];
    scenario_dir(dir, sizeof dir, "usage");
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *argv[8];
        int   k   = 0;
        argv[k++] = dtrun_path;
        for (int j = 0; j < 6 && cases[i].args[j]; j++)
            argv[k++] = (char *)(uintptr_t)cases[i].args[j];
        argv[k] = NULL;
        run r;
        run_start(&r, dir, "usage", argv, NULL);
        CHECK_EQ(run_wait(&r, 10), 2);
        if (!CHECK(strstr(r.err, cases[i].expect) != NULL))
            fprintf(stderr, "     expected \"%s\" in:\n%s\n", cases[i].expect, r.err);
        run_free(&r);
    }
    // --help comes from the same table that parses: every flag is listed.
    char *argv[] = {dtrun_path, "--help", NULL};
    run   r;
    run_start(&r, dir, "help", argv, NULL);
    CHECK_EQ(run_wait(&r, 10), 0);
    const char *names[] = {"--nproc-per-node N", "--nnodes M",      "--node-rank K",
                           "--master-addr A",    "--master-port P", "--standalone",
                           "--max-restarts R",   "--log-dir D",     "--tee"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        CHECK(strstr(r.out, names[i]) != NULL);
    run_free(&r);
    // PET_<FLAG> (Kubeflow's PyTorchJob, torchrun's convention): read as the flag, with
    // the flag's error naming the variable; a flag on the command line wins.
    struct {
        const char *env[3];
        const char *args[4];
        int         rc;
        const char *expect; // in stderr, or NULL
    } pet[] = {
        {{"PET_NNODES=abc"},
         {"true"},
         2,
         "--nnodes expects an integer in [1, 65536], found \"abc\" (from environment variable "
         "PET_NNODES)"},
        {{"PET_TEE=maybe"},
         {"true"},
         2,
         "environment variable PET_TEE expects 1, true, 0 or false, found \"maybe\""},
        {{"PET_MASTER_PORT=0"}, {"true"}, 2, "(from environment variable PET_MASTER_PORT)"},
        // PET_NNODES=2 alone would wait for node 1 and fail after PET_RDZV_TIMEOUT.
        {{"PET_NNODES=2", "PET_RDZV_TIMEOUT=1"}, {"--nnodes", "1", "true"}, 0, NULL},
        {{"PET_NNODES=2", "PET_RDZV_TIMEOUT=0.5"}, {"true"}, 1, "--rdzv-timeout"},
        // The endpoint (an elastic PyTorchJob's PET_RDZV_ENDPOINT) is node 0's store.
        {{"PET_NNODES=2", "PET_RDZV_TIMEOUT=0.5", "PET_RDZV_ENDPOINT=127.0.0.1:29533"},
         {"true"},
         1,
         "127.0.0.1:29533"},
        // A classic pod's WORLD_SIZE and RANK are the nodes when nothing else says.
        {{"WORLD_SIZE=2", "RANK=1"},
         {"--rdzv-timeout", "0.5", "true"},
         1,
         "--nnodes 2 --node-rank 1 from WORLD_SIZE and RANK"},
    };
    for (size_t i = 0; i < sizeof pet / sizeof pet[0]; i++) {
        char *pargv[8];
        int   k    = 0;
        pargv[k++] = dtrun_path;
        for (int j = 0; j < 4 && pet[i].args[j]; j++)
            pargv[k++] = (char *)(uintptr_t)pet[i].args[j];
        pargv[k] = NULL;
        run_start(&r, dir, "pet", pargv, pet[i].env);
        CHECK_EQ(run_wait(&r, 20), pet[i].rc);
        if (pet[i].expect && !CHECK(strstr(r.err, pet[i].expect) != NULL))
            fprintf(stderr, "     expected \"%s\" in:\n%s\n", pet[i].expect, r.err);
        run_free(&r);
    }
    // torchrun's underscore spellings work too.
    char *argv2[] = {dtrun_path, "--nproc_per_node", "2", "--max_restarts", "0", "true", NULL};
    run_start(&r, dir, "underscore", argv2, NULL);
    CHECK_EQ(run_wait(&r, 10), 0);
    run_free(&r);
}

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "worker") == 0)
        return worker_main(argc, argv);
    if (!CHECK(find_bins())) {
        fprintf(stderr, "dtrun not found next to the tests (make programs)\n");
        return check_summary();
    }
    make_tmp_root("dtrun-test");
    RUN(test_env_and_output);
    RUN(test_log_dir);
    RUN(test_worker_exits_3);
    RUN(test_worker_killed);
    RUN(test_stubborn_workers);
    RUN(test_restart_once);
    RUN(test_restarts_exhausted);
    RUN(test_sigint);
    RUN(test_sigterm_deaf_workers);
    RUN(test_worker_early_sigterm);
    RUN(test_dtrun_killed);
    RUN(test_usage_errors);
    if (!check_failed)
        remove_tree(tmp_root);
    return check_summary();
}
