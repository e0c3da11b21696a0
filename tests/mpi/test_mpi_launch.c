// test_mpi_launch.c: jobs started by mpirun without dtrain's own launcher.
// - backend auto, no MASTER_ADDR/MASTER_PORT: rank 0's store address and a job token go
//   through MPI, then shm (when built) or tcp moves the data, never mpi; ranks that
//   look like different hosts (DT_HOST_ID) reach rank 0 at its advertised address and
//   get tcp. The store works across ranks; local ranks come from Open MPI's variables.
// - MASTER_ADDR/MASTER_PORT set: the store is there, and MPI is not even initialised
//   unless backend mpi is asked for.
// - Ranks whose job tokens differ are refused by the store, and the job ends at once.
// - A lone process asking for backend mpi is a one-rank MPI job (MPI's singleton).
// - dtrain-mnist, 2 ranks, same seed: --backend mpi, tcp and auto (shm when built)
//   under mpirun and --num-processes 2 (forked, tcp) print the same losses and end with
//   the same parameter checksum. Bitwise, not "close": with 2 ranks every gradient element is
//   a + b, and IEEE addition commutes, so no reduction order can change a bit.
#include "../lib/mp.h"
#include "../lib/mpirun.h"

#include <stdlib.h>
#include <string.h>

// From the MPI library the test is linked with (no <mpi.h> here: tests are not
// compiled with mpicc's flags).
int MPI_Initialized(int *flag);

static bool mpi_initialised(void) {
    int flag = 0;
    MPI_Initialized(&flag);
    return flag != 0;
}

static dt_pg *group(const char *backend, int64_t timeout_ms) {
    dt_pg_opts o = dt_pg_opts_default();
    o.backend    = backend;
    o.timeout_ms = timeout_ms;
    dt_pg *pg    = NULL;
    dt_pg_new_from_env(&pg, &o);
    if (!pg)
        fprintf(stderr, "rank %d: init: %s\n", mpirun_child_rank(), dt_last_error());
    return pg;
}

// Whether this library has the shm backend: a one-rank group asking for it by name.
static bool shm_built(void) {
    dt_pg_opts o = dt_pg_opts_default();
    o.backend    = "shm";
    o.timeout_ms = 10000;
    char method[64];
    snprintf(method, sizeof method, "tcp://127.0.0.1:%d", mp_free_port());
    dt_pg *pg = NULL;
    dt_pg_new(&pg, method, 0, 1, &o);
    if (!pg && dt_last_status() != DT_ERR_UNSUPPORTED) {
        fprintf(stderr, "     probing for shm: %s\n", dt_last_error());
        CHECK(pg != NULL);
    }
    dt_pg_free(pg);
    return pg != NULL;
}

// Every rank sets a key in the group's store and reads everyone's; a sum goes through
// the backend.
static void check_group_works(dt_pg *pg) {
    int  rank = dt_pg_rank(pg), world = dt_pg_size(pg);
    char key[32], val[32];
    snprintf(key, sizeof key, "test/%d", rank);
    snprintf(val, sizeof val, "hello from %d", rank);
    CHECK_OK(dt_store_set(dt_pg_store(pg), key, val, strlen(val)));
    for (int r = 0; r < world; r++) {
        void *v = NULL;
        snprintf(key, sizeof key, "test/%d", r);
        snprintf(val, sizeof val, "hello from %d", r);
        CHECK_OK(dt_store_get(dt_pg_store(pg), key, &v, NULL));
        CHECK(v && strcmp(v, val) == 0);
        dt_free(v);
    }
    int64_t x = rank + 1, sum = 0;
    CHECK_OK(dt_pg_all_reduce(pg, &x, &sum, 1, DT_INT64, DT_REDUCE_SUM));
    CHECK_EQ(sum, (int64_t)world * (world + 1) / 2);
}

static void child_auto(void) {
    bool   shm = shm_built();
    dt_pg *pg  = group(NULL, 30000);
    CHECK(pg != NULL);
    if (!pg)
        return;
    CHECK(mpi_initialised());
    CHECK_EQ(dt_pg_rank(pg), mpirun_child_rank());
    CHECK_EQ(dt_pg_size(pg), mpirun_child_world());
    CHECK_EQ(dt_pg_local_rank(pg), mpirun_child_rank()); // OMPI_COMM_WORLD_LOCAL_RANK
    CHECK_EQ(dt_pg_local_size(pg), mpirun_child_world());
    CHECK(strcmp(dt_pg_backend(pg), shm ? "shm" : "tcp") == 0);
    if (strcmp(dt_pg_backend(pg), shm ? "shm" : "tcp") != 0)
        fprintf(stderr, "     backend auto chose %s, expected %s\n", dt_pg_backend(pg),
                shm ? "shm" : "tcp");
    check_group_works(pg);
    dt_pg_free(pg);
}

// Each rank claims a host of its own: auto must pick tcp, and ranks other than 0 reach
// the store at the address rank 0 advertised (not loopback).
static void child_auto_hosts(void) {
    char id[32];
    snprintf(id, sizeof id, "test-host-%d", mpirun_child_rank());
    setenv("DT_HOST_ID", id, 1);
    dt_pg *pg = group("auto", 30000);
    CHECK(pg != NULL);
    if (!pg)
        return;
    CHECK(strcmp(dt_pg_backend(pg), "tcp") == 0);
    CHECK_EQ(dt_pg_local_rank(pg), mpirun_child_rank()); // the launcher says so
    check_group_works(pg);
    dt_pg_free(pg);
}

static void child_master(void) {
    long   port = strtol(getenv("MASTER_PORT"), NULL, 10);
    dt_pg *pg   = group("tcp", 30000);
    CHECK(pg != NULL);
    if (!pg)
        return;
    CHECK(!mpi_initialised());
    CHECK_EQ(dt_store_port(dt_pg_store(pg)), port);
    check_group_works(pg);
    dt_pg_free(pg);
    // Asking for mpi initialises MPI; the store still comes from MASTER_*.
    CHECK((pg = group("mpi", 30000)) != NULL);
    if (!pg)
        return;
    CHECK(mpi_initialised());
    CHECK(strcmp(dt_pg_backend(pg), "mpi") == 0);
    CHECK_EQ(dt_store_port(dt_pg_store(pg)), port);
    check_group_works(pg);
    dt_pg_free(pg);
}

static void child_tokens(void) {
    if (mpirun_child_rank() == 1)
        setenv("DT_JOB_TOKEN", "a token of another job", 1);
    dt_pg *pg = group("auto", 15000); // the refusal comes at once; a slow start is not it
    CHECK(pg == NULL);
    if (mpirun_child_rank() == 1)
        CHECK(strstr(dt_last_error(), "token") != NULL);
    dt_pg_free(pg);
}

static void child_singleton(void) {
    dt_pg *pg = group("mpi", 30000);
    CHECK(pg != NULL);
    if (!pg)
        return;
    CHECK_EQ(dt_pg_size(pg), 1);
    CHECK_EQ(dt_pg_rank(pg), 0);
    CHECK(strcmp(dt_pg_backend(pg), "mpi") == 0);
    check_group_works(pg);
    dt_pg_free(pg);
}

// -------------------------------------------------------------------- the parent

static void run_child(int np, const char *child, const char *const *env) {
    mpirun_opts   o = {.np = np, .child = child, .env = env, .timeout_ms = 90000};
    mpirun_result r;
    fprintf(stderr, "  %s (np %d)\n", child, np);
    MPIRUN(&o, &r);
    mpirun_result_free(&r);
}

static void test_bootstrap(void) {
    run_child(3, "auto", NULL);
    run_child(2, "auto_hosts", NULL);
    char port[32];
    snprintf(port, sizeof port, "MASTER_PORT=%d", mp_free_port());
    const char *master[] = {"MASTER_ADDR=127.0.0.1", port, NULL};
    run_child(2, "master", master);
    // Rank 1 leaves at once without MPI_Finalize (a failed bootstrap), so mpirun stops
    // the job instead of rank 0 waiting for it until its timeout.
    mpirun_opts   o = {.np = 2, .child = "tokens", .timeout_ms = 90000, .expect_failure = true};
    mpirun_result r;
    fprintf(stderr, "  tokens (np 2)\n");
    MPIRUN(&o, &r);
    CHECK(r.exit_code != 0 && !r.timed_out && r.reported >= 1);
    CHECK(strstr(r.output, "job token mismatch") != NULL);
    mpirun_result_free(&r);
    run_child(0, "singleton", NULL);
}

// The lines two runs of dtrain-mnist must agree on: the losses and the checksum.
static char *key_lines(const char *out) {
    size_t      n   = strlen(out) + 1;
    char       *key = calloc(n, 1);
    const char *p   = out;
    while (*p) {
        const char *e   = strchr(p, '\n');
        size_t      len = e ? (size_t)(e - p) + 1 : strlen(p);
        if (strncmp(p, "epoch: ", 7) == 0 || strncmp(p, "Parameters identical", 20) == 0)
            strncat(key, p, len);
        p += len;
    }
    return key;
}

static void test_mnist(void) {
    const char *bin = mpirun_program("dtrain-mnist");
    CHECK(bin != NULL);
    if (!bin) {
        fprintf(stderr, "     dtrain-mnist is not built (make programs)\n");
        return;
    }
    const char *common[] = {"--limit",     "768", "--batch-size", "64", "--seed",    "7",
                            "--log-every", "1",   "--threads",    "1",  "--no-test", "--stats"};
    enum { NC = sizeof common / sizeof common[0] };
    // mpirun with mpi, tcp and auto (shm when built), and forked ranks with tcp.
    const char *how[4]  = {"mpi", "tcp", "auto", "tcp"};
    const char *used[4] = {"mpi", "tcp", shm_built() ? "shm" : "tcp", "tcp"};
    char       *keys[4];
    for (int k = 0; k < 4; k++) {
        const char *argv[NC + 6];
        int         n      = 0;
        bool        forked = k == 3;
        argv[n++]          = bin;
        for (int i = 0; i < NC; i++)
            argv[n++] = common[i];
        argv[n++] = "--backend";
        argv[n++] = how[k];
        if (forked) {
            argv[n++] = "--num-processes";
            argv[n++] = "2";
        }
        argv[n]       = NULL;
        mpirun_opts o = {
            .np = forked ? 0 : 2, .argv = argv, .timeout_ms = 120000, .expect_failure = true};
        mpirun_result r;
        fprintf(stderr, "  dtrain-mnist --backend %s, 2 ranks (%s)\n", how[k],
                forked ? "--num-processes 2" : "mpirun -np 2");
        MPIRUN(&o, &r);
        CHECK_EQ(r.exit_code, 0);
        CHECK(strstr(r.output, "Parameters identical on all 2 ranks") != NULL);
        char backend[48];
        snprintf(backend, sizeof backend, "\"backend\": \"%s\"", used[k]);
        CHECK(strstr(r.output, backend) != NULL); // from --stats
        if (r.exit_code != 0 || !strstr(r.output, backend))
            fprintf(stderr, "     expected %s in:\n%s\n", backend, r.output);
        keys[k] = key_lines(r.output);
        mpirun_result_free(&r);
    }
    // 768 samples over 2 ranks in batches of 64: 6 steps, one loss line each.
    CHECK_EQ(strlen(keys[0]) > 0, 1);
    for (int k = 1; k < 4; k++) {
        bool same = strcmp(keys[0], keys[k]) == 0;
        CHECK(same);
        if (!same)
            fprintf(stderr, "     --backend mpi printed:\n%s     --backend %s%s printed:\n%s",
                    keys[0], how[k], k == 3 ? " (forked)" : "", keys[k]);
    }
    int steps = 0;
    for (const char *p = keys[0]; (p = strstr(p, "epoch: ")); p++)
        steps++;
    CHECK_EQ(steps, 6);
    for (int k = 0; k < 4; k++)
        free(keys[k]);
}

int main(int argc, char **argv) {
    const char *c = mpirun_child_case(argc, argv);
    if (c) {
        static const struct {
            const char *name;
            void (*fn)(void);
        } cases[] = {{"auto", child_auto},
                     {"auto_hosts", child_auto_hosts},
                     {"master", child_master},
                     {"tokens", child_tokens},
                     {"singleton", child_singleton}};
        for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
            if (strcmp(c, cases[i].name) == 0)
                cases[i].fn();
        return MPIRUN_CHILD_DONE();
    }
    if (!mpirun_available()) {
        printf("SKIP test_mpi_launch: mpirun not found (apt-get install openmpi-bin)\n");
        return check_summary();
    }
    RUN(test_bootstrap);
    RUN(test_mnist);
    return check_summary();
}
