// test_launch_env.c: launcher detection (dt_launch_env_parse) for each launcher's
// variables, the order of precedence on random mixes of launchers against a
// first-match reference, Slurm's per-node task lists against their brute-force
// expansion, the errors, and a process group formed from Open MPI's and Slurm's
// variables (forked ranks, tcp, no MPI involved).
#include "../lib/mp.h"
#include "dtrain/rng.h"

#include <stdlib.h>
#include <string.h>

// ---------------------------------------------------------------- a fake environment

#define MAX_VARS 32

typedef struct fake_env {
    int  n;
    char name[MAX_VARS][40];
    char value[MAX_VARS][64];
} fake_env;

static void put(fake_env *e, const char *name, const char *value) {
    for (int i = 0; i < e->n; i++)
        if (strcmp(e->name[i], name) == 0) {
            snprintf(e->value[i], sizeof e->value[i], "%s", value);
            return;
        }
    snprintf(e->name[e->n], sizeof e->name[0], "%s", name);
    snprintf(e->value[e->n], sizeof e->value[0], "%s", value);
    e->n++;
}

static void put_int(fake_env *e, const char *name, long v) {
    char b[32];
    snprintf(b, sizeof b, "%ld", v);
    put(e, name, b);
}

static const char *lookup(const char *name, void *user) {
    const fake_env *e = user;
    for (int i = 0; i < e->n; i++)
        if (strcmp(e->name[i], name) == 0)
            return e->value[i];
    return NULL;
}

// Builds an environment from "NAME=value" strings, NULL-terminated.
static fake_env env_of(const char *const *kv) {
    fake_env e = {0};
    for (int i = 0; kv[i]; i++) {
        const char *eq = strchr(kv[i], '=');
        char        name[40];
        snprintf(name, sizeof name, "%.*s", (int)(eq - kv[i]), kv[i]);
        put(&e, name, eq + 1);
    }
    return e;
}

static dt_launch_env parse_ok(const char *const *kv) {
    fake_env      e = env_of(kv);
    dt_launch_env le;
    CHECK_OK(dt_launch_env_parse(lookup, &e, &le));
    return le;
}

#define EXPECT(le, l, r, w, lr, lw, mpi)                                                           \
    do {                                                                                           \
        CHECK_EQ((le).launcher, l);                                                                \
        CHECK_EQ((le).rank, r);                                                                    \
        CHECK_EQ((le).world, w);                                                                   \
        CHECK_EQ((le).local_rank, lr);                                                             \
        CHECK_EQ((le).local_world, lw);                                                            \
        CHECK_EQ((le).is_mpi, mpi);                                                                \
    } while (0)

// ------------------------------------------------------------------ each launcher

static void test_each_launcher(void) {
    dt_launch_env le = parse_ok((const char *const[]){"PATH=/bin", NULL});
    EXPECT(le, DT_LAUNCHER_NONE, -1, -1, -1, -1, false);
    CHECK(le.rank_var == NULL);

    le = parse_ok((const char *const[]){"RANK=3", "WORLD_SIZE=4", "LOCAL_RANK=1",
                                        "LOCAL_WORLD_SIZE=2", NULL});
    EXPECT(le, DT_LAUNCHER_ENV, 3, 4, 1, 2, false);
    CHECK(strcmp(le.rank_var, "RANK") == 0 && strcmp(le.world_var, "WORLD_SIZE") == 0);

    le = parse_ok((const char *const[]){"OMPI_COMM_WORLD_RANK=5", "OMPI_COMM_WORLD_SIZE=6",
                                        "OMPI_COMM_WORLD_LOCAL_RANK=2",
                                        "OMPI_COMM_WORLD_LOCAL_SIZE=3", NULL});
    EXPECT(le, DT_LAUNCHER_OPENMPI, 5, 6, 2, 3, true);
    CHECK(strcmp(dt_launcher_name(le.launcher), "openmpi") == 0);

    le = parse_ok((const char *const[]){"MV2_COMM_WORLD_RANK=1", "MV2_COMM_WORLD_SIZE=2",
                                        "MV2_COMM_WORLD_LOCAL_RANK=0",
                                        "MV2_COMM_WORLD_LOCAL_SIZE=1", NULL});
    EXPECT(le, DT_LAUNCHER_MVAPICH, 1, 2, 0, 1, true);

    le = parse_ok((const char *const[]){"PMI_RANK=2", "PMI_SIZE=3", "MPI_LOCALRANKID=0",
                                        "MPI_LOCALNRANKS=1", NULL});
    EXPECT(le, DT_LAUNCHER_PMI, 2, 3, 0, 1, true);
    // Hydra without the local variables: the local rank is left to the hosts.
    le = parse_ok((const char *const[]){"PMI_RANK=0", "PMI_SIZE=1", NULL});
    EXPECT(le, DT_LAUNCHER_PMI, 0, 1, -1, -1, true);

    // srun: the step's task count, not the allocation's; local size from the step's
    // per-node list at this node.
    le = parse_ok((const char *const[]){
        "SLURM_PROCID=5", "SLURM_STEP_ID=0", "SLURM_STEP_NUM_TASKS=6", "SLURM_NTASKS=8",
        "SLURM_LOCALID=1", "SLURM_NODEID=2", "SLURM_STEP_TASKS_PER_NODE=2(x2),2",
        "SLURM_TASKS_PER_NODE=4(x2)", NULL});
    EXPECT(le, DT_LAUNCHER_SLURM, 5, 6, 1, 2, true);
    CHECK(strcmp(le.world_var, "SLURM_STEP_NUM_TASKS") == 0);
    // Older Slurm: SLURM_STEPID, SLURM_NTASKS and SLURM_NTASKS_PER_NODE only.
    le = parse_ok((const char *const[]){"SLURM_PROCID=3", "SLURM_STEPID=1", "SLURM_NTASKS=4",
                                        "SLURM_LOCALID=1", "SLURM_NTASKS_PER_NODE=2", NULL});
    EXPECT(le, DT_LAUNCHER_SLURM, 3, 4, 1, 2, true);
    CHECK(strcmp(le.world_var, "SLURM_NTASKS") == 0);
    // A batch script's shell (no job step): not a rank of a job.
    le = parse_ok((const char *const[]){"SLURM_PROCID=0", "SLURM_NTASKS=8", "SLURM_LOCALID=0",
                                        "SLURM_JOB_ID=42", NULL});
    EXPECT(le, DT_LAUNCHER_NONE, -1, -1, -1, -1, false);
    // mpirun inside an allocation: every rank inherits the script's SLURM_PROCID=0.
    le = parse_ok((const char *const[]){"SLURM_PROCID=0", "SLURM_STEP_ID=0", "SLURM_NTASKS=4",
                                        "OMPI_COMM_WORLD_RANK=3", "OMPI_COMM_WORLD_SIZE=4", NULL});
    EXPECT(le, DT_LAUNCHER_OPENMPI, 3, 4, -1, -1, true);
    // dt_spawn's children of an mpirun'd parent: RANK/WORLD_SIZE are theirs.
    le = parse_ok((const char *const[]){"RANK=1", "WORLD_SIZE=2", "OMPI_COMM_WORLD_RANK=0",
                                        "OMPI_COMM_WORLD_SIZE=1", NULL});
    EXPECT(le, DT_LAUNCHER_ENV, 1, 2, -1, -1, false);
    // Empty values count as unset.
    le = parse_ok((const char *const[]){"RANK=", "WORLD_SIZE=", "PMI_RANK=1", "PMI_SIZE=2", NULL});
    EXPECT(le, DT_LAUNCHER_PMI, 1, 2, -1, -1, true);
}

// ------------------------------------------------------------------------ errors

static void expect_error(const char *const *kv, const char *needle) {
    fake_env      e = env_of(kv);
    dt_launch_env le;
    CHECK_ERR(dt_launch_env_parse(lookup, &e, &le), DT_ERR_ARG, needle);
}

static void test_errors(void) {
    expect_error((const char *const[]){"RANK=abc", "WORLD_SIZE=2", NULL},
                 "RANK expects an integer");
    expect_error((const char *const[]){"RANK=5", "WORLD_SIZE=2", NULL},
                 "RANK=5 is out of range: expected 0 <= rank < WORLD_SIZE=2");
    expect_error((const char *const[]){"RANK=-1", "WORLD_SIZE=2", NULL}, "RANK=-1 is out of range");
    expect_error((const char *const[]){"RANK=0", "WORLD_SIZE=0", NULL}, "WORLD_SIZE expects");
    expect_error((const char *const[]){"RANK=1", NULL}, "WORLD_SIZE is not set but RANK is");
    expect_error((const char *const[]){"WORLD_SIZE=2", NULL}, "RANK is not set");
    expect_error((const char *const[]){"OMPI_COMM_WORLD_RANK=1", NULL},
                 "OMPI_COMM_WORLD_SIZE is not set but OMPI_COMM_WORLD_RANK is");
    expect_error((const char *const[]){"OMPI_COMM_WORLD_RANK=4", "OMPI_COMM_WORLD_SIZE=4", NULL},
                 "OMPI_COMM_WORLD_RANK=4 is out of range: expected 0 <= rank < "
                 "OMPI_COMM_WORLD_SIZE=4");
    expect_error(
        (const char *const[]){"RANK=0", "WORLD_SIZE=4", "LOCAL_RANK=2", "LOCAL_WORLD_SIZE=2", NULL},
        "LOCAL_RANK=2 is out of range: expected 0 <= local rank < LOCAL_WORLD_SIZE=2");
    expect_error((const char *const[]){"RANK=0", "WORLD_SIZE=4", "LOCAL_WORLD_SIZE=5", NULL},
                 "LOCAL_WORLD_SIZE expects an integer in [1, 4]");
    expect_error((const char *const[]){"PMI_RANK=0", "PMI_SIZE=2", "MPI_LOCALRANKID=x", NULL},
                 "MPI_LOCALRANKID expects");
    expect_error((const char *const[]){"SLURM_PROCID=0", "SLURM_STEP_ID=0",
                                       "SLURM_STEP_NUM_TASKS=4", "SLURM_NODEID=0",
                                       "SLURM_STEP_TASKS_PER_NODE=2(y3)", NULL},
                 "SLURM_STEP_TASKS_PER_NODE expects per-node task counts such as");
    expect_error((const char *const[]){"SLURM_PROCID=0", "SLURM_STEP_ID=0", NULL},
                 "SLURM_NPROCS is not set but SLURM_PROCID is");
    expect_error((const char *const[]){"SLURM_PROCID=1", "SLURM_STEP_ID=0",
                                       "SLURM_STEP_NUM_TASKS=4", "SLURM_LOCALID=3",
                                       "SLURM_NODEID=0", "SLURM_STEP_TASKS_PER_NODE=2,2", NULL},
                 "SLURM_LOCALID=3 is out of range: expected 0 <= local rank < 2");
}

// ------------------------------------------------- precedence on random mixtures

typedef struct lvars {
    dt_launcher l;
    const char *rank, *world, *lrank, *lworld;
} lvars;

// In the order of precedence comm.h documents.
static const lvars order[] = {
    {DT_LAUNCHER_ENV, "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"},
    {DT_LAUNCHER_OPENMPI, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
     "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"},
    {DT_LAUNCHER_MVAPICH, "MV2_COMM_WORLD_RANK", "MV2_COMM_WORLD_SIZE", "MV2_COMM_WORLD_LOCAL_RANK",
     "MV2_COMM_WORLD_LOCAL_SIZE"},
    {DT_LAUNCHER_PMI, "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"},
    {DT_LAUNCHER_SLURM, "SLURM_PROCID", "SLURM_STEP_NUM_TASKS", "SLURM_LOCALID",
     "SLURM_NTASKS_PER_NODE"},
};

static void test_precedence_random(void) {
    dt_rng rng = dt_rng_init(dt_now_ns());
    int    bad = 0;
    for (int trial = 0; trial < 2000; trial++) {
        fake_env e       = {0};
        int      first   = -1;
        int      want[4] = {-1, -1, -1, -1}; // rank, world, local rank, local world
        for (int i = 0; i < 5; i++) {
            if (dt_rng_u32(&rng) % 2)
                continue;
            int  world      = 1 + (int)(dt_rng_u32(&rng) % 64);
            int  rank       = (int)(dt_rng_u32(&rng) % (uint32_t)world);
            int  lw         = 1 + (int)(dt_rng_u32(&rng) % (uint32_t)world);
            int  lr         = (int)(dt_rng_u32(&rng) % (uint32_t)lw);
            bool with_local = dt_rng_u32(&rng) % 2;
            put_int(&e, order[i].rank, rank);
            put_int(&e, order[i].world, world);
            if (with_local) {
                put_int(&e, order[i].lrank, lr);
                put_int(&e, order[i].lworld, lw);
            }
            if (order[i].l == DT_LAUNCHER_SLURM)
                put(&e, "SLURM_STEP_ID", "0");
            if (first < 0) {
                first   = i;
                want[0] = rank, want[1] = world;
                want[2] = with_local ? lr : -1, want[3] = with_local ? lw : -1;
            }
        }
        dt_launch_env le;
        dt_status     st = dt_launch_env_parse(lookup, &e, &le);
        bool          ok = st == DT_OK && (first < 0 ? le.launcher == DT_LAUNCHER_NONE
                                                     : le.launcher == order[first].l && le.rank == want[0] &&
                                                  le.world == want[1] && le.local_rank == want[2] &&
                                                  le.local_world == want[3]);
        if (!ok && bad++ < 3)
            fprintf(stderr,
                    "     trial %d: expected %s rank %d/%d local %d/%d, found %s %d/%d "
                    "local %d/%d (%s)\n",
                    trial, first < 0 ? "none" : dt_launcher_name(order[first].l), want[0], want[1],
                    want[2], want[3], dt_launcher_name(le.launcher), le.rank, le.world,
                    le.local_rank, le.local_world, st == DT_OK ? "ok" : dt_last_error());
    }
    CHECK_EQ(bad, 0);
}

// Slurm's "2(x3),1" lists against their expansion, at every node index.
static void test_slurm_lists_random(void) {
    dt_rng rng = dt_rng_init(dt_now_ns() ^ 0x5107);
    int    bad = 0;
    for (int trial = 0; trial < 500; trial++) {
        int    counts[64], nodes = 0;
        char   list[400];
        size_t off   = 0;
        int    items = 1 + (int)(dt_rng_u32(&rng) % 5);
        for (int it = 0; it < items; it++) {
            int n = 1 + (int)(dt_rng_u32(&rng) % 9), times = 1 + (int)(dt_rng_u32(&rng) % 4);
            off += (size_t)snprintf(list + off, sizeof list - off, "%s%d", it ? "," : "", n);
            if (times > 1 || dt_rng_u32(&rng) % 2)
                off += (size_t)snprintf(list + off, sizeof list - off, "(x%d)", times);
            for (int t = 0; t < times; t++)
                counts[nodes++] = n;
        }
        for (int node = 0; node < nodes; node++) {
            fake_env e = {0};
            put(&e, "SLURM_PROCID", "0");
            put(&e, "SLURM_STEP_ID", "3");
            put_int(&e, "SLURM_STEP_NUM_TASKS", 64);
            put(&e, "SLURM_LOCALID", "0");
            put_int(&e, "SLURM_NODEID", node);
            put(&e, "SLURM_STEP_TASKS_PER_NODE", list);
            dt_launch_env le;
            dt_status     st = dt_launch_env_parse(lookup, &e, &le);
            if ((st != DT_OK || le.local_world != counts[node]) && bad++ < 3)
                fprintf(stderr, "     \"%s\" node %d: expected %d tasks, found %d (%s)\n", list,
                        node, counts[node], le.local_world, st == DT_OK ? "ok" : dt_last_error());
        }
    }
    CHECK_EQ(bad, 0);
}

// dt_launch_env_read reads the real environment.
static void test_read_getenv(void) {
    unsetenv("RANK");
    unsetenv("WORLD_SIZE");
    setenv("PMI_RANK", "1", 1);
    setenv("PMI_SIZE", "3", 1);
    dt_launch_env le;
    CHECK_OK(dt_launch_env_read(&le));
    EXPECT(le, DT_LAUNCHER_PMI, 1, 3, -1, -1, true);
    unsetenv("PMI_RANK");
    unsetenv("PMI_SIZE");
}

// ------------------------------------------ a group from the MPI launchers' variables

// Each rank trades mp's RANK/WORLD_SIZE for another launcher's variables, keeps
// MASTER_ADDR/MASTER_PORT (so no MPI is involved) and forms a tcp group.
static void ranks_from_launcher(int rank, int world, void *arg) {
    const char *which = arg;
    char        b[16];
    unsetenv("RANK");
    unsetenv("WORLD_SIZE");
    unsetenv("LOCAL_RANK");
    unsetenv("LOCAL_WORLD_SIZE");
    if (strcmp(which, "openmpi") == 0) {
        snprintf(b, sizeof b, "%d", rank);
        setenv("OMPI_COMM_WORLD_RANK", b, 1);
        setenv("OMPI_COMM_WORLD_LOCAL_RANK", b, 1);
        snprintf(b, sizeof b, "%d", world);
        setenv("OMPI_COMM_WORLD_SIZE", b, 1);
        setenv("OMPI_COMM_WORLD_LOCAL_SIZE", b, 1);
    } else {
        snprintf(b, sizeof b, "%d", rank);
        setenv("SLURM_PROCID", b, 1);
        setenv("SLURM_LOCALID", b, 1);
        setenv("SLURM_STEP_ID", "0", 1);
        setenv("SLURM_NODEID", "0", 1);
        snprintf(b, sizeof b, "%d", world);
        setenv("SLURM_STEP_NUM_TASKS", b, 1);
        setenv("SLURM_STEP_TASKS_PER_NODE", b, 1);
    }
    dt_pg_opts o = dt_pg_opts_default();
    o.backend    = "tcp";
    o.timeout_ms = 20000;
    dt_pg *pg    = NULL;
    dt_pg_new_from_env(&pg, &o);
    CHECK(pg != NULL);
    if (!pg) {
        fprintf(stderr, "     %s: %s\n", which, dt_last_error());
        return;
    }
    CHECK_EQ(dt_pg_rank(pg), rank);
    CHECK_EQ(dt_pg_size(pg), world);
    CHECK_EQ(dt_pg_local_rank(pg), rank);
    CHECK_EQ(dt_pg_local_size(pg), world);
    int64_t x = rank + 1, sum = 0;
    CHECK_OK(dt_pg_all_reduce(pg, &x, &sum, 1, DT_INT64, DT_REDUCE_SUM));
    CHECK_EQ(sum, (int64_t)world * (world + 1) / 2);
    dt_pg_free(pg);
}

// A DT_* variable that is not a setting (a typo) is named, with the nearest setting,
// by the first group the process creates, and only once.
static char g_warned[2048];
static int  g_warnings;
static void warn_sink(dt_log_level level, const char *line, void *user) {
    (void)user;
    if (level == DT_LOG_WARN && strstr(line, "is not a dtrain setting")) {
        snprintf(g_warned, sizeof g_warned, "%s", line);
        g_warnings++;
    }
}

static void test_unknown_setting_warned(void) {
    setenv("DT_TIMOUT_MS", "5000", 1);
    dt_log_set_sink(warn_sink, NULL);
    dt_pg_opts o = dt_pg_opts_default();
    o.backend    = "tcp";
    o.timeout_ms = 20000;
    for (int i = 0; i < 2; i++) {
        char method[64];
        snprintf(method, sizeof method, "tcp://127.0.0.1:%d", mp_free_port());
        dt_pg *pg = NULL;
        CHECK_OK(dt_pg_new(&pg, method, 0, 1, &o));
        dt_pg_free(pg);
    }
    dt_log_set_sink(NULL, NULL);
    unsetenv("DT_TIMOUT_MS");
    CHECK_EQ(g_warnings, 1);
    CHECK(strstr(g_warned, "DT_TIMOUT_MS is not a dtrain setting (did you mean DT_TIMEOUT_MS?)"));
    CHECK(strstr(g_warned, "--help-env"));
}

static void test_group_from_launchers(void) {
    mp_opts o = {.world = 3, .timeout_ms = 60000};
    MP_RUN(&o, ranks_from_launcher, "openmpi");
    MP_RUN(&o, ranks_from_launcher, "slurm");
}

int main(void) {
    RUN(test_unknown_setting_warned); // first: the warning is once per process
    RUN(test_each_launcher);
    RUN(test_errors);
    RUN(test_precedence_random);
    RUN(test_slurm_lists_random);
    RUN(test_read_getenv);
    RUN(test_group_from_launchers);
    return check_summary();
}
