// test_dtrun_multi.c: several dtruns forming one job (--nnodes 2 or 3) on loopback,
// one process per "node", with this binary as the worker program.
//
// - Ranks, group ranks, one MASTER_PORT and one job token across nodes; node 1 may
//   start before node 0's store exists.
// - A worker killed on node 1 stops node 0's workers too, within 2 s, and both nodes'
//   summaries name it (its last lines travel through the store).
// - --max-restarts restarts every node's workers; the count is seen on both nodes.
// - A node that never comes: the timeout message lists it. Two dtruns claiming one node
//   rank, and nodes with different --nproc-per-node, are refused.
// - SIGINT to one node's dtrun (node 0 or node 1) stops the other node's workers.
// - A node's dtrun killed with SIGKILL: node 0 notices the missing heartbeats within the
//   node timeout; node 0's dtrun killed: node 1 notices the lost store.
// - After every scenario no process with the scenario's marker is left.
#include "test_dtrun_lib.h"

// Starts the dtrun of one node: dtrun --nnodes NN --node-rank K --master-port P FLAGS...

// Every scenario's end: both nodes' output when anything has failed so far, then free.
static void end_nodes(run *n0, run *n1) {
    if (check_failed) {
        run_dump(n0, "node 0");
        run_dump(n1, "node 1");
    }
    run_free(n0);
    run_free(n1);
}

static void start_node(run *r, const char *dir, int nnodes, int node, int port,
                       const char *const *flags, const char *mode, const char *const *extra) {
    static char nn[16], nr[16], mp[16];
    snprintf(nn, sizeof nn, "%d", nnodes);
    snprintf(nr, sizeof nr, "%d", node);
    snprintf(mp, sizeof mp, "%d", port);
    const char *all[32] = {"--nnodes",      nn,          "--node-rank",   nr,
                           "--master-addr", "127.0.0.1", "--master-port", mp};
    int         k       = 8;
    for (int i = 0; flags && flags[i] && k < 31; i++)
        all[k++] = flags[i];
    all[k] = NULL;
    char tag[32];
    snprintf(tag, sizeof tag, "node%d", node);
    run_start(r, dir, tag, dtrun_argv(all, mode, dir, extra), NULL);
}

static void test_two_nodes_env(void) {
    char dir[PATH_MAX];
    scenario_dir(dir, sizeof dir, "env2");
    new_mark("env2");
    int         port    = free_port();
    const char *flags[] = {"--nproc-per-node", "2", NULL};
    run         n0, n1;
    start_node(&n1, dir, 2, 1, port, flags, "env", NULL); // before node 0's store exists
    sleep_s(0.3);
    start_node(&n0, dir, 2, 0, port, flags, "env", NULL);
    CHECK_EQ(run_wait(&n0, 30), 0);
    CHECK_EQ(run_wait(&n1, 30), 0);
    char port0[128] = "", token0[128] = "", v[128], want[128], path[PATH_MAX + 32];
    for (int rank = 0; rank < 4; rank++) {
        snprintf(path, sizeof path, "%s/env.%d", dir, rank);
        char *dump = read_file(path);
        struct {
            const char *name;
            int         value;
        } expect[] = {{"RANK", rank},         {"LOCAL_RANK", rank % 2}, {"GROUP_RANK", rank / 2},
                      {"WORLD_SIZE", 4},      {"LOCAL_WORLD_SIZE", 2},  {"GROUP_WORLD_SIZE", 2},
                      {"DT_RESTART_COUNT", 0}};
        for (size_t i = 0; i < sizeof expect / sizeof expect[0]; i++) {
            env_value(dump, expect[i].name, v, sizeof v);
            snprintf(want, sizeof want, "%d", expect[i].value);
            if (!CHECK(strcmp(v, want) == 0))
                fprintf(stderr, "     rank %d: %s=\"%s\", expected %s\n", rank, expect[i].name, v,
                        want);
        }
        env_value(dump, "MASTER_ADDR", v, sizeof v);
        CHECK(strcmp(v, "127.0.0.1") == 0);
        // The workers' store is rank 0's, on a port of its own (the agents' store holds
        // --master-port); one port and one token across both nodes.
        env_value(dump, "MASTER_PORT", v, sizeof v);
        CHECK(atoi(v) > 0 && atoi(v) != port);
        if (rank == 0)
            snprintf(port0, sizeof port0, "%s", v);
        CHECK(strcmp(v, port0) == 0);
        env_value(dump, "DT_JOB_TOKEN", v, sizeof v);
        if (rank == 0)
            snprintf(token0, sizeof token0, "%s", v);
        CHECK(strlen(v) >= 16 && strcmp(v, token0) == 0);
        free(dump);
        snprintf(want, sizeof want, "[rank %d] hello from rank %d\n", rank, rank);
        CHECK_EQ(count_of(rank < 2 ? n0.out : n1.out, want), 1);
    }
    CHECK(strstr(n0.err, "all 2 nodes joined (world size 4)") != NULL);
    CHECK(no_marker_procs(mark, 3));
    end_nodes(&n0, &n1);
}

// The victim (a global rank) fails; both nodes stop within 2 s and name it.
static void failure_case(int victim, const char *how, const char *expect) {
    char dir[PATH_MAX], v[16];
    scenario_dir(dir, sizeof dir, "fail2");
    new_mark("fail2");
    snprintf(v, sizeof v, "%d", victim);
    int         port    = free_port();
    const char *flags[] = {"--nproc-per-node", "2", NULL};
    const char *extra[] = {"4", v, how, NULL};
    run         n0, n1;
    start_node(&n0, dir, 2, 0, port, flags, "fail", extra);
    start_node(&n1, dir, 2, 1, port, flags, "fail", extra);
    CHECK_EQ(run_wait(&n0, 60), 1);
    CHECK_EQ(run_wait(&n1, 60), 1);
    char path[PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/death", dir);
    char  *d     = read_file(path);
    double death = atof(d);
    free(d);
    double last = n0.end > n1.end ? n0.end : n1.end;
    CHECK(death > 0 && last - death < 2.0);
    fprintf(stderr,
            "     rank %d %s on node %d: both nodes' dtruns had stopped everything "
            "%.0f ms after the death\n",
            victim, how, victim / 2, (last - death) * 1000);
    char want[200];
    snprintf(want, sizeof want, "root cause: rank %d (local rank %d on node %d, host ", victim,
             victim % 2, victim / 2);
    for (int i = 0; i < 2; i++) {
        const run *r = i ? &n1 : &n0;
        CHECK(strstr(r->err, want) != NULL);
        CHECK(strstr(r->err, expect) != NULL);
        snprintf(want + 150, 50, "  | rank %d: about to fail", victim);
        CHECK(strstr(r->err, want + 150) != NULL);
    }
    for (int rank = 0; rank < 4; rank++) {
        snprintf(path, sizeof path, "%s/cpid.%d", dir, rank);
        CHECK(!pid_file_alive(path));
    }
    CHECK(no_marker_procs(mark, 3));
    end_nodes(&n0, &n1);
}

static void test_failure_crosses_nodes(void) {
    failure_case(3, "kill9", "was killed by signal 9 (SIGKILL)");
    failure_case(0, "exit3", "exited with code 3");
}

static void test_restart_across_nodes(void) {
    char dir[PATH_MAX];
    scenario_dir(dir, sizeof dir, "restart2");
    new_mark("restart2");
    int         port    = free_port();
    const char *flags[] = {"--nproc-per-node", "2", "--max-restarts", "1", NULL};
    const char *extra[] = {"2", "1", NULL}; // rank 2 (node 1) fails in attempt 0
    run         n0, n1;
    start_node(&n0, dir, 2, 0, port, flags, "restart", extra);
    start_node(&n1, dir, 2, 1, port, flags, "restart", extra);
    CHECK_EQ(run_wait(&n0, 60), 0);
    CHECK_EQ(run_wait(&n1, 60), 0);
    char path[PATH_MAX + 32];
    for (int rank = 0; rank < 4; rank++) {
        snprintf(path, sizeof path, "%s/restart.%d", dir, rank);
        CHECK_EQ(read_long(path), 1);
    }
    CHECK(strstr(n0.err, "restarting the group (restart 1 of 1)") != NULL);
    CHECK(strstr(n0.err, "root cause: rank 2 (local rank 0 on node 1") != NULL);
    CHECK(no_marker_procs(mark, 3));
    end_nodes(&n0, &n1);
}

static void test_missing_node(void) {
    char dir[PATH_MAX];
    scenario_dir(dir, sizeof dir, "missing");
    new_mark("missing");
    int         port    = free_port();
    const char *flags[] = {"--rdzv-timeout", "2", NULL};
    const char *f0[]    = {"--rdzv-timeout", "4", NULL}; // outlasts node 2's wait
    run         n0, n2;
    start_node(&n0, dir, 3, 0, port, f0, "env", NULL);
    sleep_s(0.3);
    start_node(&n2, dir, 3, 2, port, flags, "env", NULL);
    CHECK_EQ(run_wait(&n0, 20), 1);
    CHECK_EQ(run_wait(&n2, 20), 1);
    CHECK(strstr(n0.err, "for 1 of 3 nodes to join the store at 127.0.0.1") != NULL);
    CHECK(strstr(n0.err, "missing: node 1\n") != NULL);
    CHECK(strstr(n2.err, "missing: node 1\n") != NULL);
    CHECK(n0.end - n0.start < 8);
    // Without node 0, a node says so.
    run n1;
    start_node(&n1, dir, 2, 1, free_port(), flags, "env", NULL);
    CHECK_EQ(run_wait(&n1, 20), 1);
    CHECK(strstr(n1.err, "for the store of node 0 at 127.0.0.1:") != NULL);
    CHECK(strstr(n1.err, "missing: node 0") != NULL);
    CHECK(no_marker_procs(mark, 3));
    if (check_failed) {
        run_dump(&n0, "node 0");
        run_dump(&n2, "node 2");
        run_dump(&n1, "lonely node 1");
    }
    run_free(&n0);
    run_free(&n1);
    run_free(&n2);
}

// Two dtruns claim node rank 1 (the second is refused); then SIGINT to node 0 stops
// the job everywhere.
// Two dtruns claim node rank 1: the second is refused, and does not speak for the
// node: when the real node 1's dtrun dies, node 0 still notices.
static void test_duplicate_rank(void) {
    char dir[PATH_MAX];
    scenario_dir(dir, sizeof dir, "dup");
    new_mark("dup");
    int         port    = free_port();
    const char *flags[] = {
        "--nproc-per-node", "2", "--rdzv-timeout", "10", "--node-timeout", "1", NULL};
    run n0, n1, dup;
    start_node(&n0, dir, 2, 0, port, flags, "hang", NULL);
    start_node(&n1, dir, 2, 1, port, flags, "hang", NULL);
    CHECK(wait_files(dir, "cpid", 4, 20));
    start_node(&dup, dir, 2, 1, port, flags, "hang", NULL);
    CHECK_EQ(run_wait(&dup, 10), 1);
    CHECK(strstr(dup.err, "node rank 1 is already taken by host ") != NULL);
    kill(n1.pid, SIGKILL);
    CHECK_EQ(run_wait(&n1, 10), 128 + SIGKILL);
    CHECK_EQ(run_wait(&n0, 20), 1);
    CHECK(strstr(n0.err, "sent no heartbeat for ") != NULL);
    CHECK(no_marker_procs(mark, 3));
    if (check_failed) {
        run_dump(&n0, "node 0");
        run_dump(&n1, "node 1");
        run_dump(&dup, "second node 1");
    }
    run_free(&n0);
    run_free(&n1);
    run_free(&dup);
}

// A stop signal to one node's dtrun stops the other node too, without a restart.
static void sigint_case(int victim_node) {
    char dir[PATH_MAX];
    scenario_dir(dir, sizeof dir, "sigint2");
    new_mark("sigint2");
    int         port    = free_port();
    const char *flags[] = {"--nproc-per-node", "2", "--max-restarts", "2", NULL};
    run         n[2];
    start_node(&n[0], dir, 2, 0, port, flags, "hang", NULL);
    start_node(&n[1], dir, 2, 1, port, flags, "hang", NULL);
    CHECK(wait_files(dir, "cpid", 4, 20));
    double t0 = mono_s();
    kill(n[victim_node].pid, SIGINT);
    const run *other = &n[1 - victim_node];
    CHECK_EQ(run_wait(&n[victim_node], 20), 128 + SIGINT);
    CHECK_EQ(run_wait(&n[1 - victim_node], 20), 1);
    fprintf(stderr, "     SIGINT to node %d's dtrun: node %d done after %.0f ms\n", victim_node,
            1 - victim_node, (other->end - t0) * 1000);
    CHECK(other->end - t0 < 2.0);
    char want[64];
    snprintf(want, sizeof want, "interrupted by SIGINT on node %d", victim_node);
    CHECK(strstr(other->err, want) != NULL);
    CHECK(strstr(other->err, "restarting") == NULL);
    CHECK(no_marker_procs(mark, 3));
    if (check_failed) {
        run_dump(&n[0], "node 0");
        run_dump(&n[1], "node 1");
    }
    run_free(&n[0]);
    run_free(&n[1]);
}

static void test_sigint_crosses_nodes(void) {
    sigint_case(0);
    sigint_case(1);
}

static void test_config_mismatch(void) {
    char dir[PATH_MAX];
    scenario_dir(dir, sizeof dir, "mismatch");
    new_mark("mismatch");
    int         port = free_port();
    const char *f0[] = {"--nproc-per-node", "2", NULL};
    const char *f1[] = {"--nproc-per-node", "1", NULL};
    run         n0, n1;
    start_node(&n0, dir, 2, 0, port, f0, "env", NULL);
    start_node(&n1, dir, 2, 1, port, f1, "env", NULL);
    CHECK_EQ(run_wait(&n0, 20), 1);
    CHECK_EQ(run_wait(&n1, 20), 1);
    CHECK(strstr(n0.err, "node 1 (host ") != NULL);
    CHECK(strstr(n0.err, "runs with --nproc-per-node 1 --max-restarts 0, but this node (0) with "
                         "2 and 0: every node must use the same") != NULL);
    CHECK(strstr(n1.err, "every node must use the same") != NULL);
    CHECK(no_marker_procs(mark, 3));
    end_nodes(&n0, &n1);
}

// victim_node's dtrun is killed (SIGKILL); the other must notice within the node timeout.
static void node_killed_case(int victim_node, const char *expect, const char *expect2) {
    char dir[PATH_MAX];
    scenario_dir(dir, sizeof dir, "nodekill");
    new_mark("nodekill");
    int         port    = free_port();
    const char *flags[] = {"--node-timeout", "1", NULL};
    run         n[2];
    start_node(&n[0], dir, 2, 0, port, flags, "hang", NULL);
    start_node(&n[1], dir, 2, 1, port, flags, "hang", NULL);
    CHECK(wait_files(dir, "cpid", 2, 20));
    double t0 = mono_s();
    kill(n[victim_node].pid, SIGKILL);
    CHECK_EQ(run_wait(&n[victim_node], 10), 128 + SIGKILL);
    const run *other = &n[1 - victim_node];
    CHECK_EQ(run_wait(&n[1 - victim_node], 20), 1);
    fprintf(stderr,
            "     node %d's dtrun killed: node %d stopped after %.0f ms (node timeout 1 s)\n",
            victim_node, 1 - victim_node, (other->end - t0) * 1000);
    CHECK(other->end - t0 < 4.0);
    CHECK(strstr(other->err, expect) != NULL);
    CHECK(strstr(other->err, expect2) != NULL);
    CHECK(no_marker_procs(mark, 3));
    if (check_failed) {
        run_dump(&n[0], "node 0");
        run_dump(&n[1], "node 1");
    }
    run_free(&n[0]);
    run_free(&n[1]);
}

static void test_node_killed(void) {
    node_killed_case(1, "node 1 (host ", "sent no heartbeat for ");
    node_killed_case(0, "lost contact with the store of node 0 at 127.0.0.1:", "the job stops");
}

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "worker") == 0)
        return worker_main(argc, argv);
    if (!CHECK(find_bins())) {
        fprintf(stderr, "dtrun not found next to the tests (make programs)\n");
        return check_summary();
    }
    make_tmp_root("dtrun-multi-test");
    RUN(test_two_nodes_env);
    RUN(test_failure_crosses_nodes);
    RUN(test_restart_across_nodes);
    RUN(test_missing_node);
    RUN(test_duplicate_rank);
    RUN(test_sigint_crosses_nodes);
    RUN(test_config_mismatch);
    RUN(test_node_killed);
    if (!check_failed)
        remove_tree(tmp_root);
    return check_summary();
}
