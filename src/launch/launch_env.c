// launch_env.c: which launcher started this process (torchrun-style variables, Open MPI,
// MVAPICH2, PMI, srun) and what it says about rank, world size and local rank. A pure
// function of the variables it looks up, so every launcher is tested without launching
// anything. The order of precedence is in launch.h; docs/mpi.md gives the reasons.
#include "dtrain/launch.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_WORLD (1L << 20)

const char *dt_launcher_name(dt_launcher l) {
    static const char *const names[DT_LAUNCHER_COUNT_] = {"none",    "env", "openmpi",
                                                          "mvapich", "pmi", "slurm"};
    return (unsigned)l < DT_LAUNCHER_COUNT_ ? names[l] : "invalid";
}

// One launcher's variables. local_world_var may be NULL (Slurm computes it).
typedef struct launcher_vars {
    dt_launcher kind;
    bool        is_mpi;
    const char *rank, *world, *local_rank, *local_world;
    const char *world_hint; // how to phrase the missing world size
} launcher_vars;

static const launcher_vars launchers[] = {
    {DT_LAUNCHER_ENV, false, "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
     "the number of ranks, e.g. WORLD_SIZE=2"},
    {DT_LAUNCHER_OPENMPI, true, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
     "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE", "set by mpirun"},
    {DT_LAUNCHER_MVAPICH, true, "MV2_COMM_WORLD_RANK", "MV2_COMM_WORLD_SIZE",
     "MV2_COMM_WORLD_LOCAL_RANK", "MV2_COMM_WORLD_LOCAL_SIZE", "set by mpirun_rsh"},
    {DT_LAUNCHER_PMI, true, "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS",
     "set by mpiexec"},
};

static const char *get(dt_env_lookup lookup, void *user, const char *name) {
    const char *v = name ? lookup(name, user) : NULL;
    return v && *v ? v : NULL;
}

static dt_status parse_var(const char *name, const char *v, long lo, long hi, long *out) {
    char what[80];
    snprintf(what, sizeof what, "environment variable %s", name);
    return dt_parse_long(v, lo, hi, what, out);
}

// Reads the rank and world size of one launcher whose variables are (partly) set.
static dt_status read_rank_world(dt_env_lookup lookup, void *user, const char *rank_var,
                                 const char *world_var, const char *hint, dt_launch_env *out) {
    const char *rv = get(lookup, user, rank_var), *wv = get(lookup, user, world_var);
    if (!wv)
        return dt_fail(DT_ERR_ARG,
                       "init: environment variable %s is not set but %s is (expected %s)",
                       world_var, rank_var, hint);
    if (!rv)
        return dt_fail(DT_ERR_ARG,
                       "init: environment variable %s is not set (expected this process's "
                       "rank; %s is set)",
                       rank_var, world_var);
    long world, rank;
    DT_TRY(parse_var(world_var, wv, 1, MAX_WORLD, &world));
    DT_TRY(parse_var(rank_var, rv, INT32_MIN, INT32_MAX, &rank));
    if (rank < 0 || rank >= world)
        return dt_fail(DT_ERR_ARG, "init: %s=%ld is out of range: expected 0 <= rank < %s=%ld",
                       rank_var, rank, world_var, world);
    out->rank      = (int)rank;
    out->world     = (int)world;
    out->rank_var  = rank_var;
    out->world_var = world_var;
    return DT_OK;
}

// Local rank and size when both variables are set and consistent with the world.
static dt_status read_local(dt_env_lookup lookup, void *user, const char *lrank_var,
                            const char *lworld_var, dt_launch_env *out) {
    const char *lr = get(lookup, user, lrank_var);
    const char *lw = get(lookup, user, lworld_var);
    long        v;
    if (lw) {
        DT_TRY(parse_var(lworld_var, lw, 1, out->world, &v));
        out->local_world = (int)v;
    }
    if (lr) {
        DT_TRY(parse_var(lrank_var, lr, 0, out->world - 1, &v));
        out->local_rank = (int)v;
    }
    if (out->local_rank >= 0 && out->local_world >= 0 && out->local_rank >= out->local_world)
        return dt_fail(DT_ERR_ARG, "init: %s=%d is out of range: expected 0 <= local rank < %s=%d",
                       lrank_var, out->local_rank, lworld_var, out->local_world);
    return DT_OK;
}

// Slurm's compressed per-node task counts, "2(x3),1" = 2, 2, 2, 1: the entry at `node`,
// or 0 when the list is shorter. DT_ERR_ARG for a malformed list.
static dt_status slurm_tasks_on_node(const char *name, const char *list, long node, long *out) {
    const char *p = list;
    long        i = 0;
    while (*p) {
        char *end;
        long  n = strtol(p, &end, 10), times = 1;
        if (end == p || n < 0)
            goto bad;
        p = end;
        if (*p == '(') {
            if (p[1] != 'x')
                goto bad;
            times = strtol(p + 2, &end, 10);
            if (end == p + 2 || *end != ')' || times < 1)
                goto bad;
            p = end + 1;
        }
        if (node >= i && node < i + times) {
            *out = n;
            return DT_OK;
        }
        i += times;
        if (*p == ',')
            p++;
        else if (*p)
            goto bad;
    }
    *out = 0;
    return DT_OK;
bad:
    return dt_fail(DT_ERR_ARG,
                   "init: environment variable %s expects per-node task counts such as "
                   "\"2(x3),1\", found \"%s\"",
                   name, list);
}

static dt_status read_slurm(dt_env_lookup lookup, void *user, dt_launch_env *out) {
    const char *world_var = get(lookup, user, "SLURM_STEP_NUM_TASKS") ? "SLURM_STEP_NUM_TASKS"
                            : get(lookup, user, "SLURM_NTASKS")       ? "SLURM_NTASKS"
                                                                      : "SLURM_NPROCS";
    DT_TRY(read_rank_world(lookup, user, "SLURM_PROCID", world_var, "set by srun", out));
    const char *lr = get(lookup, user, "SLURM_LOCALID");
    long        v;
    if (lr) {
        DT_TRY(parse_var("SLURM_LOCALID", lr, 0, out->world - 1, &v));
        out->local_rank = (int)v;
    }
    const char *per_node_var = get(lookup, user, "SLURM_STEP_TASKS_PER_NODE")
                                   ? "SLURM_STEP_TASKS_PER_NODE"
                                   : "SLURM_TASKS_PER_NODE";
    const char *per_node     = get(lookup, user, per_node_var);
    const char *node         = get(lookup, user, "SLURM_NODEID");
    const char *ntpn         = get(lookup, user, "SLURM_NTASKS_PER_NODE");
    if (per_node && node) {
        long nid, n;
        DT_TRY(parse_var("SLURM_NODEID", node, 0, MAX_WORLD, &nid));
        DT_TRY(slurm_tasks_on_node(per_node_var, per_node, nid, &n));
        if (n >= 1 && n <= out->world)
            out->local_world = (int)n;
    } else if (ntpn && strspn(ntpn, "0123456789") == strlen(ntpn)) {
        DT_TRY(parse_var("SLURM_NTASKS_PER_NODE", ntpn, 1, out->world, &v));
        out->local_world = (int)v;
    }
    if (out->local_rank >= 0 && out->local_world >= 0 && out->local_rank >= out->local_world)
        return dt_fail(DT_ERR_ARG,
                       "init: SLURM_LOCALID=%d is out of range: expected 0 <= local rank < %d "
                       "(the tasks on this node by %s)",
                       out->local_rank, out->local_world,
                       per_node && node ? per_node_var : "SLURM_NTASKS_PER_NODE");
    return DT_OK;
}

dt_status dt_launch_env_parse(dt_env_lookup lookup, void *user, dt_launch_env *out) {
    *out = (dt_launch_env){
        .launcher = DT_LAUNCHER_NONE, .rank = -1, .world = -1, .local_rank = -1, .local_world = -1};
    dt_launch_env e = *out;
    for (size_t i = 0; i < sizeof launchers / sizeof launchers[0]; i++) {
        const launcher_vars *l = &launchers[i];
        if (!get(lookup, user, l->rank) && !get(lookup, user, l->world))
            continue;
        e.launcher = l->kind;
        e.is_mpi   = l->is_mpi;
        DT_TRY(read_rank_world(lookup, user, l->rank, l->world, l->world_hint, &e));
        DT_TRY(read_local(lookup, user, l->local_rank, l->local_world, &e));
        *out = e;
        return DT_OK;
    }
    // srun: only inside a job step. A batch script's shell also has SLURM_PROCID=0 and
    // the allocation's SLURM_NTASKS, but a program it starts directly is alone.
    if (get(lookup, user, "SLURM_PROCID") &&
        (get(lookup, user, "SLURM_STEP_ID") || get(lookup, user, "SLURM_STEPID"))) {
        e.launcher = DT_LAUNCHER_SLURM;
        e.is_mpi   = true;
        DT_TRY(read_slurm(lookup, user, &e));
        *out = e;
    }
    return DT_OK;
}

static const char *lookup_getenv(const char *name, void *user) {
    (void)user;
    return getenv(name);
}

dt_status dt_launch_env_read(dt_launch_env *out) {
    return dt_launch_env_parse(lookup_getenv, NULL, out);
}
