// test_elastic_netns.c: elastic membership (dtrun --nnodes MIN:MAX) on three machines:
// three network namespaces on one switch (10.202.0.1, .2, .3; tests/lib/netns.h), one
// dtrun of one dtrain-mnist worker in each, node 0 serving the rendezvous store.
//
// - Kill and join (--nnodes 1:3, global batch 48, --invariant 4): two nodes train, the
//   third stands by (3 is not a world --invariant 4 keeps bitwise; no V keeps both 2 and
//   3 today: bench/RESULTS.md "Elastic membership"); a member's dtrun and its worker are
//   killed with SIGKILL mid-epoch; the two others go on from their state in memory
//   within 3 s; a new node joins in the victim's namespace and is admitted at a step
//   boundary. The final model is bitwise the model of the uninterrupted run at the same
//   global batch (2 processes of 24 on one machine: CRC32C and the --save-model bytes).
// - Preempted, then below MIN (--nnodes 2:3, --invariant 0: any world dividing the
//   batch): SIGTERM to node 2's dtrun, its worker leaves at a step boundary and exits
//   75, nodes 0 and 1 go on as a world of 2; then node 1 is killed: node 0 waits
//   --rdzv-timeout for a second worker, then fails naming the member it waited for
//   (node 1's worker), within the timeout and a bound.
//
// `test_elastic_netns measure` prints, for bench/RESULTS.md, the time from a node's death
// to training going on and the steps lost: elastic (3 -> 2 in memory) against the fixed
// 3-node job that restarts from its last checkpoint (--max-restarts 1) after a worker of
// node 1 is killed; interleaved rounds.
//
// Needs root (ip netns); without it the test prints why and skips.
#include "test_netns_lib.h"

#define GLOBAL "48"
#define LIMIT  "3840" // 80 steps of 48

static netns_net net;
static int       port_seq; // each scenario's rendezvous on a port of its own

static const char *next_endpoint(void) {
    static char ep[32];
    snprintf(ep, sizeof ep, "10.202.0.1:%d", 29400 + port_seq++);
    return ep;
}

// An elastic dtrun as node i: `dtrun --nnodes NN --rdzv-endpoint EP ... dtrain-mnist ...`
// (model: --save-model, or NULL).
static void start_elastic(run *r, const char *dir, int i, const char *tag, const char *nn,
                          const char *ep, const char *inv, const char *rdzv_timeout,
                          const char *limit, char *model) {
    char *argv[] = {dtrun_path,
                    "--nnodes",
                    (char *)(uintptr_t)nn,
                    "--rdzv-endpoint",
                    (char *)(uintptr_t)ep,
                    "--rdzv-id",
                    "ns3",
                    "--rdzv-timeout",
                    (char *)(uintptr_t)rdzv_timeout,
                    mnist_path,
                    "--limit",
                    (char *)(uintptr_t)limit,
                    "--batch-size",
                    GLOBAL,
                    "--invariant",
                    (char *)(uintptr_t)inv,
                    "--threads",
                    "1",
                    "--no-test",
                    "--log-every",
                    "1",
                    model ? "--save-model" : NULL,
                    model,
                    NULL};
    start_in_ns(&net, r, dir, i, tag, argv, "30000", NULL);
}

// Starts node 0 (it serves the store) and, once it does, nodes 1 and 2.
static bool start_three(run *n, const char *dir, const char *nn, const char *ep, const char *inv,
                        const char *rdzv_timeout, const char *limit, char *model) {
    start_elastic(&n[0], dir, 0, NULL, nn, ep, inv, rdzv_timeout, limit, model);
    run *first[1] = {&n[0]};
    if (!CHECK(wait_count(first, 1, "serving the rendezvous store", 1, 30) >= 0))
        return false;
    start_elastic(&n[1], dir, 1, NULL, nn, ep, inv, rdzv_timeout, limit, model);
    start_elastic(&n[2], dir, 2, NULL, nn, ep, inv, rdzv_timeout, limit, model);
    return true;
}

// Steps logged in the runs' stdout after the first line holding `after` (in each run
// that has one).
static int steps_after(run *const *rs, int n, const char *after) {
    int c = 0;
    for (int i = 0; i < n; i++) {
        char       *o = read_file(rs[i]->out_path);
        const char *w = strstr(o, after);
        if (w)
            c += count_of(w, "training loss");
        free(o);
    }
    return c;
}

// Waits until some run logs a step after `after`; seconds since t0, or -1 after timeout_s.
static double wait_step_after(run *const *rs, int n, const char *after, double t0,
                              double timeout_s) {
    while (mono_s() - t0 < timeout_s) {
        if (steps_after(rs, n, after) > 0)
            return mono_s() - t0;
        sleep_s(0.002);
    }
    return -1;
}

// The highest step "epoch: 0 [K/" logged in the runs' stdout (-1: none).
static int last_step(run *const *rs, int n) {
    int k = -1;
    for (int i = 0; i < n; i++) {
        char *o = read_file(rs[i]->out_path);
        for (const char *p = o; (p = strstr(p, "epoch: 0 [")); p++) {
            int s = -1;
            if (sscanf(p, "epoch: 0 [%d/", &s) == 1 && s > k)
                k = s;
        }
        free(o);
    }
    return k;
}

// The step after `key` in the first run that has it ("world 3 -> 2 at step %d", "batch %d");
// -1 if none.
static int number_after(run *const *rs, int n, const char *line, const char *fmt) {
    int v = -1;
    for (int i = 0; i < n && v < 0; i++) {
        char       *o = read_file(rs[i]->out_path);
        const char *p = strstr(o, line);
        if (p && sscanf(p + strlen(line), fmt, &v) != 1)
            v = -1;
        free(o);
    }
    return v;
}

// Kills node r's dtrun and its worker with SIGKILL (the machine is gone).
static void kill_node(run *r) {
    int w = worker_pid(r->pid, 0);
    kill(r->pid, SIGKILL);
    if (w > 0)
        kill(w, SIGKILL);
}

static char ref_crc[16], ref_model[PATH_MAX + 16];

// The uninterrupted run on one machine: 2 processes of 24, --invariant 4 (the model of
// 3 nodes that train as 2 and 1 standing by, and of every world 1, 2 or 4).
static bool reference(void) {
    return fixed_reference(LIMIT, "24", 180, ref_crc, ref_model, sizeof ref_model);
}

// Waits until the runs logged a "world" line more than `lines` and then a step; seconds
// since t0, or -1 after timeout_s. (Steps stop while a group is lost, so a step logged
// after the new line is training going on.)
static double wait_regroup(run *const *rs, int n, int lines, double t0, double timeout_s) {
    if (wait_count(rs, n, "] world ", lines + 1, timeout_s) < 0)
        return -1;
    int steps = count_in(rs, n, "training loss");
    if (wait_count(rs, n, "training loss", steps + 1, timeout_s - (mono_s() - t0)) < 0)
        return -1;
    return mono_s() - t0;
}

static void test_kill_and_join(void) {
    char dir[PATH_MAX], model[PATH_MAX + 16];
    scenario_dir(dir, sizeof dir, "kill-join");
    snprintf(model, sizeof model, "%s/elastic.model", dir);
    new_mark("kill-join");
    if (!reference())
        return;
    const char *ep = next_endpoint();
    run         n[4];
    memset(n, 0, sizeof n);
    bool ok     = start_three(n, dir, "1:3", ep, "4", "30", LIMIT, model);
    run *all[4] = {&n[0], &n[1], &n[2], &n[3]};
    // Two train, the third stands by ("world 0 -> 2", or "0 -> 1" then "1 -> 2" when the
    // others came after node 0's first generation settled on a loaded machine).
    ok = ok && CHECK(wait_count(all, 3, "standing by", 1, 60) >= 0);
    if (!ok)
        fprintf(stderr, "FAIL: no node stood by within 60 s of the three starts\n");
    ok = ok &&
         CHECK(wait_count(all, 3, "training loss", count_in(all, 3, "training loss") + 3, 30) >= 0);
    int victim = -1; // a member (not node 0: it serves the store)
    for (int i = 1; i < 3 && victim < 0 && ok; i++) {
        char *e = read_file(n[i].err_path);
        if (!strstr(e, "standing by"))
            victim = i;
        free(e);
    }
    ok            = ok && CHECK(victim > 0);
    int    lines  = count_in(all, 3, "] world ");
    double t_kill = mono_s();
    if (ok)
        kill_node(&n[victim]);
    // The survivor and the standby train on: "world 2 -> 2", or "2 -> 1" and, once the
    // standby is back, "1 -> 2".
    double shrink = ok ? wait_regroup(all, 3, lines, t_kill, 30) : -1;
    if (ok && !CHECK(shrink >= 0))
        fprintf(stderr, "FAIL: no step after a new \"world\" line within 30 s of the kill\n");
    CHECK(!ok || shrink < 3); // the goal: training goes on within 3 s
    ok = ok && shrink >= 0;
    // A new node in the victim's namespace: the members regroup at a step boundary to
    // take it in (here as the one standing by).
    lines         = count_in(all, 3, "] world ");
    double t_join = mono_s();
    if (ok)
        start_elastic(&n[3], dir, victim, "node3", "1:3", ep, "4", "30", LIMIT, model);
    double grow = ok ? wait_regroup(all, 4, lines, t_join, 60) : -1;
    if (ok && !CHECK(grow >= 0))
        fprintf(stderr, "FAIL: the joiner was not admitted (no new \"world\" line) within "
                        "60 s\n");
    for (int i = 0; i < 4; i++)
        if (n[i].pid > 0)
            run_wait(&n[i], 120);
    for (int i = 0; i < 4; i++)
        if (i != victim)
            CHECK_EQ(n[i].rc, 0);
    CHECK_EQ(n[victim > 0 ? victim : 1].rc, 128 + SIGKILL);
    char crc[16] = "";
    for (int i = 0; i < 4 && !crc[0]; i++)
        if (i != victim && n[i].out)
            crc_of(n[i].out, crc);
    CHECK(crc[0] && strcmp(crc, ref_crc) == 0);
    CHECK(same_file(model, ref_model));
    fprintf(stderr,
            "     3 nodes (2 training, 1 standing by), node %d killed: training on %.2f s "
            "later; a joiner admitted %.2f s after its start; CRC32C %s (fixed run: %s)\n",
            victim, shrink, grow, crc, ref_crc);
    CHECK(none_left(5));
    if (check_failed)
        for (int i = 0; i < 4; i++)
            if (n[i].pid > 0)
                run_dump(&n[i], "node");
    for (int i = 0; i < 4; i++)
        run_free(&n[i]);
}

static void test_sigterm_then_below_min(void) {
    char dir[PATH_MAX];
    scenario_dir(dir, sizeof dir, "sigterm-min");
    new_mark("sigterm-min");
    const char *ep = next_endpoint();
    run         n[3];
    memset(n, 0, sizeof n);
    bool ok     = start_three(n, dir, "2:3", ep, "0", "5", LIMIT, NULL);
    run *all[3] = {&n[0], &n[1], &n[2]};
    ok          = ok && CHECK(wait_count(all, 3, " -> 3 at step", 1, 60) >= 0);
    ok          = ok && CHECK(wait_step_after(all, 3, " -> 3 at step", mono_s(), 30) >= 0);
    if (ok)
        kill(n[2].pid, SIGTERM); // node 2 preempted
    double t_term = mono_s();
    double shrink = ok ? wait_step_after(all, 2, "world 3 -> 2", t_term, 30) : -1;
    if (ok && !CHECK(shrink >= 0))
        fprintf(stderr, "FAIL: nodes 0 and 1 logged no step after \"world 3 -> 2\" within 30 s "
                        "of node 2's SIGTERM\n");
    ok = ok && shrink >= 0;
    run_wait(&n[2], 30);
    CHECK_EQ(n[2].rc, 75);
    CHECK(strstr(n[2].out, "Stopped by SIGTERM at step") != NULL);
    // The two go on: two more steps.
    ok = ok &&
         CHECK(wait_count(all, 2, "training loss", count_in(all, 2, "training loss") + 2, 30) >= 0);
    // Node 1 dies: node 0 alone is below MIN (2) and waits --rdzv-timeout (5 s).
    int w1 = worker_pid(n[1].pid, 0);
    CHECK(!ok || w1 > 0);
    double t_kill = mono_s();
    if (ok)
        kill_node(&n[1]);
    run_wait(&n[0], ok ? 40 : 5);
    double failed_after = n[0].end - t_kill;
    run_wait(&n[1], 10);
    CHECK(n[0].rc != 0 && n[0].rc != -1);
    CHECK(failed_after >= 4.5 && failed_after < 15);
    const char *msg = strstr(n[0].err, "for at least 2 workers, found 1");
    CHECK(msg != NULL);
    char w1s[24];
    snprintf(w1s, sizeof w1s, " %d ", w1);
    CHECK(msg && strstr(msg, w1s) != NULL); // names node 1's worker (host pid step)
    fprintf(stderr,
            "     SIGTERM to node 2: 3 -> 2 in %.2f s; node 1 killed: node 0 below MIN failed "
            "%.2f s later (--rdzv-timeout 5)\n",
            shrink, failed_after);
    if (msg)
        fprintf(stderr, "     its error: %.*s\n", (int)strcspn(msg, "\n"), msg);
    CHECK(none_left(5));
    if (check_failed)
        for (int i = 0; i < 3; i++)
            run_dump(&n[i], "node");
    for (int i = 0; i < 3; i++)
        run_free(&n[i]);
}

// ------------------------------------------------------------------ measure

#define MLIMIT "2880" // 60 steps of 48

typedef struct loss {
    double secs;  // the death -> the first step logged after training went on
    int    steps; // steps done before the death that were done again (the one in flight: 0)
} loss;

// Elastic: --nnodes 2:3, --invariant 0 (3 -> 2); node 1 killed after 5 steps together.
static bool measure_elastic(loss *m) {
    char dir[PATH_MAX];
    scenario_dir(dir, sizeof dir, "m-elastic");
    new_mark("m-elastic");
    run n[3];
    memset(n, 0, sizeof n);
    run *all[3] = {&n[0], &n[1], &n[2]};
    bool ok     = start_three(n, dir, "2:3", next_endpoint(), "0", "30", MLIMIT, NULL);
    ok          = ok && wait_count(all, 3, " -> 3 at step", 1, 60) >= 0;
    ok = ok && wait_count(all, 3, "training loss", count_in(all, 3, "training loss") + 5, 30) >= 0;
    double t_kill = mono_s();
    if (ok)
        kill_node(&n[1]);
    int last = last_step(all, 3); // logged when the node died
    m->secs  = ok ? wait_step_after(all, 3, "world 3 -> 2", t_kill, 30) : -1;
    int k    = number_after(all, 3, "world 3 -> 2 at step ", "%d");
    m->steps = last + 1 - k;
    run_wait(&n[0], 120), run_wait(&n[2], 120), run_wait(&n[1], 10);
    ok = ok && m->secs >= 0 && k >= 0 && n[0].rc == 0 && n[2].rc == 0 && none_left(5);
    if (!ok)
        for (int i = 0; i < 3; i++)
            run_dump(&n[i], "node (elastic)");
    for (int i = 0; i < 3; i++)
        run_free(&n[i]);
    return ok;
}

// The fixed 3-node job restarting from its last checkpoint (every 10 steps): node 1's
// worker killed when node 0 logs step `at`.
static bool measure_restart(loss *m, int at) {
    char dir[PATH_MAX], ckpt[PATH_MAX + 16], port[16], rank[3][4];
    scenario_dir(dir, sizeof dir, "m-restart");
    snprintf(ckpt, sizeof ckpt, "%s/checkpoints", dir);
    snprintf(port, sizeof port, "%d", 29400 + port_seq++);
    new_mark("m-restart");
    run n[3];
    for (int i = 0; i < 3; i++) {
        snprintf(rank[i], sizeof rank[i], "%d", i);
        char *argv[] = {dtrun_path,
                        "--nnodes",
                        "3",
                        "--node-rank",
                        rank[i],
                        "--master-addr",
                        "10.202.0.1",
                        "--master-port",
                        port,
                        "--nproc-per-node",
                        "1",
                        "--max-restarts",
                        "1",
                        "--rdzv-timeout",
                        "30",
                        mnist_path,
                        "--limit",
                        MLIMIT,
                        "--batch-size",
                        "16",
                        "--invariant",
                        "0",
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
        start_in_ns(&net, &n[i], dir, i, NULL, argv, "30000", NULL);
    }
    run *n0[1] = {&n[0]};
    char want[48];
    snprintf(want, sizeof want, "epoch: 0 [%d/", at);
    bool ok       = wait_count(n0, 1, want, 1, 90) >= 0;
    int  w        = ok ? worker_pid(n[1].pid, 1) : -1; // its global rank
    ok            = ok && w > 0;
    double t_kill = mono_s();
    if (ok)
        kill(w, SIGKILL);
    int last = last_step(n0, 1);
    m->secs  = ok ? wait_step_after(n0, 1, "resumed from", t_kill, 60) : -1;
    int r    = number_after(n0, 1, "resumed from ", "%*s (epoch %*d, batch %d");
    m->steps = last + 1 - r;
    for (int i = 0; i < 3; i++)
        run_wait(&n[i], 120);
    ok = ok && m->secs >= 0 && r >= 0 && n[0].rc == 0 && n[1].rc == 0 && n[2].rc == 0 &&
         none_left(5);
    if (!ok)
        for (int i = 0; i < 3; i++)
            run_dump(&n[i], "node (restart)");
    for (int i = 0; i < 3; i++)
        run_free(&n[i]);
    return ok;
}

static int cmp_loss(const void *x, const void *y) {
    double a = ((const loss *)x)->secs, b = ((const loss *)y)->secs;
    return (a > b) - (a < b);
}

static void print_losses(const char *what, loss *v, int n) {
    if (!n)
        return;
    qsort(v, (size_t)n, sizeof *v, cmp_loss);
    printf("%-44s median %6.0f ms (min %.0f, max %.0f, n=%d); steps lost:", what,
           v[n / 2].secs * 1000, v[0].secs * 1000, v[n - 1].secs * 1000, n);
    for (int i = 0; i < n; i++)
        printf(" %d", v[i].steps);
    printf("\n");
    fflush(stdout);
}

// Interleaved rounds: elastic, restart, elastic, restart, ...
static void measure(int rounds) {
    loss el[16], re[16];
    int  ne = 0, nr = 0;
    for (int i = 0; i < rounds && i < 16; i++) {
        if (measure_elastic(&el[ne]))
            ne++;
        if (measure_restart(&re[nr], 13 + (i * 3) % 10))
            nr++;
        fprintf(stderr, "round %d: elastic %.0f ms (%d lost), restart %.0f ms (%d lost)\n", i,
                el[ne ? ne - 1 : 0].secs * 1000, el[ne ? ne - 1 : 0].steps,
                re[nr ? nr - 1 : 0].secs * 1000, re[nr ? nr - 1 : 0].steps);
    }
    print_losses("SIGKILL of node 1 -> elastic 3 -> 2, a step", el, ne);
    print_losses("SIGKILL of node 1's worker -> restart, a step", re, nr);
}

int main(int argc, char **argv) {
    if (!CHECK(find_bins()) || !CHECK(access(mnist_path, X_OK) == 0)) {
        fprintf(stderr, "dtrun or dtrain-mnist not found next to the tests (make programs)\n");
        return check_summary();
    }
    char why[200];
    if (!netns_setup(&net, 3, "dtel3", "dt3", "10.202.0", why, sizeof why)) {
        if (net.made) {
            CHECK(!"network namespaces set up");
            fprintf(stderr, "     %s\n", why);
            netns_teardown(&net);
        } else {
            printf("SKIP test_elastic_netns: %s\n", why);
        }
        return check_summary();
    }
    bool measuring = argc > 1 && strcmp(argv[1], "measure") == 0;
    make_tmp_root(measuring ? "elastic-netns-measure" : "elastic-netns-test");
    if (measuring) {
        measure(argc > 2 ? atoi(argv[2]) : 5);
    } else {
        RUN(test_kill_and_join);
        RUN(test_sigterm_then_below_min);
    }
    netns_teardown(&net);
    if (!check_failed)
        remove_tree(tmp_root);
    return check_summary();
}
