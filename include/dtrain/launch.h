// launch.h: how this process was launched, and how it launches others. Launcher
// detection reads the variables torchrun, dtrun, dt_spawn, mpirun, PMI and srun set; the
// supervisor (dt_procs) forks child processes, watches them through pidfds, stops them
// (a signal, then SIGKILL after a grace period) and reaps them. dt_spawn (comm.h) and
// the dtrun launcher both run their workers through it. Knows nothing about stores or
// groups: comm.h builds on this header (and includes it).
#ifndef DTRAIN_LAUNCH_H
#define DTRAIN_LAUNCH_H

#include "dtrain/core.h"

#ifdef __cplusplus
extern "C" {
#endif

// -------------------------------------------------------------- launcher environment
//
// Which launcher started this process, read from the variables it sets. dt_pg_new
// ("env://") uses the first launcher found in this order (docs/mpi.md says why):
//   1. RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE    torchrun, dtrun, dt_spawn, by hand
//   2. OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK, _LOCAL_SIZE            Open MPI's mpirun
//   3. MV2_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK, _LOCAL_SIZE                       MVAPICH2
//   4. PMI_RANK, PMI_SIZE, MPI_LOCALRANKID, MPI_LOCALNRANKS   MPICH/Intel MPI (Hydra), PMI-2
//   5. SLURM_PROCID, SLURM_STEP_NUM_TASKS (else SLURM_NTASKS), SLURM_LOCALID, and the
//      local size from SLURM_STEP_TASKS_PER_NODE (else SLURM_TASKS_PER_NODE) at
//      SLURM_NODEID, else SLURM_NTASKS_PER_NODE                        srun (a job step)
// Rank and world size always come from one launcher, never mixed. Slurm counts only
// inside a job step (SLURM_STEP_ID set, as srun does): a batch script's own shell has
// SLURM_PROCID=0 and the allocation's SLURM_NTASKS but is not rank 0 of a job.

typedef enum dt_launcher {
    DT_LAUNCHER_NONE,    // no launcher variables: a process on its own
    DT_LAUNCHER_ENV,     // RANK / WORLD_SIZE
    DT_LAUNCHER_OPENMPI, // OMPI_COMM_WORLD_*
    DT_LAUNCHER_MVAPICH, // MV2_COMM_WORLD_*
    DT_LAUNCHER_PMI,     // PMI_RANK / PMI_SIZE
    DT_LAUNCHER_SLURM,   // SLURM_* in an srun step
    DT_LAUNCHER_COUNT_
} dt_launcher;

// "none", "env", "openmpi", "mvapich", "pmi", "slurm"; "invalid" otherwise. Never NULL.
DT_API const char *dt_launcher_name(dt_launcher l);

typedef struct dt_launch_env {
    dt_launcher launcher;
    int         rank, world;             // -1 when launcher is DT_LAUNCHER_NONE
    int         local_rank, local_world; // -1 when the launcher does not say
    bool        is_mpi;                  // an MPI launcher or srun: MPI_Init can join this job
    const char *rank_var;  // the variables read ("OMPI_COMM_WORLD_RANK"), for messages;
    const char *world_var; // static strings, NULL when launcher is DT_LAUNCHER_NONE
} dt_launch_env;

// Looks up one environment variable: its value, or NULL when unset. Empty values are
// treated as unset.
typedef const char *(*dt_env_lookup)(const char *name, void *user);

// Detects the launcher from `lookup` (a pure function of what lookup returns: tests
// pass a table). DT_ERR_ARG names the variable when a value is not an integer in range,
// when a launcher's rank is set without its world size (or the reverse), or when a
// rank is outside [0, world) or a local rank outside [0, local world).
DT_API dt_status dt_launch_env_parse(dt_env_lookup lookup, void *user,
                                     dt_launch_env *out /* out */);
// The same from this process's environment (getenv).
DT_API dt_status dt_launch_env_read(dt_launch_env *out /* out */);

// --------------------------------------------------------------- process supervision
//
// A set of child processes started, watched, stopped and reaped together. Each child
// dies with its parent (PR_SET_PDEATHSIG, SIGKILL; a child whose parent died before that
// took effect exits at once), so fork from the thread that stays alive. The parent
// watches each child through a pidfd (dt_pidfd_open; polled every 50 ms on kernels
// without pidfds). Nothing here waits without a bound unless asked to.
//
//   dt_procs *ps;
//   dt_procs_new(&ps, n, NULL);
//   for (int i = 0; i < n; i++) dt_procs_start(ps, i, child_main, arg);
//   while (dt_procs_alive(ps) > 0)
//       dt_procs_wait(ps, 100, on_end, ctx); // on_end may dt_procs_stop(ps, SIGTERM, 3000)
//   dt_procs_free(ps);

typedef struct dt_procs dt_procs;

typedef struct dt_procs_opts {
    bool own_groups; // each child leads a process group of its own: signals reach what it
                     // started too, a terminal's Ctrl-C reaches the parent alone, and
                     // dt_procs_free kills what the children left behind in their groups
    bool no_pidfd;   // watch by polling waitpid, as on kernels before 5.3 (for tests)
} dt_procs_opts;

// One child as the supervisor sees it (dt_procs_at); valid until dt_procs_free.
typedef struct dt_proc {
    int  pid;         // -1 until started
    int  pidfd;       // readable (POLLIN) once the child has ended; -1 without one or once reaped
    bool alive;       // started and not yet reaped
    bool signalled;   // the supervisor sent it a signal while it was alive
    int  exit_code;   // once reaped: its exit code; -1 when a signal killed it or unknown
    int  term_signal; // once reaped: the signal that killed it; 0 when it exited
} dt_proc;

// A supervisor for n (1..65536) children, none started. opts may be NULL (defaults: no
// process groups, pidfds). Errors: DT_ERR_ARG, DT_ERR_NOMEM.
DT_API dt_status dt_procs_new(dt_procs **out, int n, const dt_procs_opts *opts);

// What a child runs after fork. It must not return: it ends with exec or _exit (a return
// exits with 127). When the parent has other threads, only async-signal-safe calls are
// allowed until exec.
typedef void (*dt_proc_main)(int index, void *arg);

// Starts child `index` (each index once): flushes stdio (or the child would print what
// is buffered again), forks; the child joins its own process group (own_groups), asks to
// die with the parent and runs child(index, arg). The parent opens the child's pidfd.
// Errors: DT_ERR_ARG (index out of range or started, child NULL), DT_ERR_IO when fork
// fails (errno is kept, for the caller's own message).
DT_API dt_status dt_procs_start(dt_procs *ps, int index, dt_proc_main child, void *arg);

DT_API int            dt_procs_count(const dt_procs *ps);
DT_API int            dt_procs_alive(const dt_procs *ps); // started and not yet reaped
DT_API const dt_proc *dt_procs_at(const dt_procs *ps, int index);

// Sends sig now to every live child (to its process group with own_groups) and marks
// it signalled.
DT_API void dt_procs_signal(dt_procs *ps, int sig);
// Begins a stop: sig now to every live child, and SIGKILL to those still alive grace_ms
// later (< 0: never), sent by dt_procs_reap or dt_procs_wait once due. Only the first
// call of a supervisor's life does this; it returns true, later calls false.
DT_API bool dt_procs_stop(dt_procs *ps, int sig, int64_t grace_ms);
// True once a stop has begun (dt_procs_stop or dt_procs_kill).
DT_API bool dt_procs_stopping(const dt_procs *ps);
// SIGKILL now to every live child; no SIGKILL is pending afterwards. Counts as a stop.
DT_API void dt_procs_kill(dt_procs *ps);

// Called for each child as it is reaped; dt_procs_at(ps, index) tells how it ended.
typedef void (*dt_procs_end_fn)(dt_procs *ps, int index, void *ctx);

// Reaps every child that has ended, calling on_end (may be NULL) for each in index
// order, then sends the stop's SIGKILL if it is due. Never blocks. Returns how many ended.
DT_API int dt_procs_reap(dt_procs *ps, dt_procs_end_fn on_end, void *ctx);
// Waits until a child ends, the stop's SIGKILL falls due or timeout_ms pass (< 0: no
// bound but those two), then dt_procs_reap. Returns at once when no child is alive.
DT_API int dt_procs_wait(dt_procs *ps, int timeout_ms, dt_procs_end_fn on_end, void *ctx);
// For a caller that polls the children's pidfds among descriptors of its own:
// timeout_ms (< 0: none) cut to when the stop's SIGKILL is due, and to 50 ms while a
// live child has no pidfd. Then dt_procs_reap after each wake-up.
DT_API int dt_procs_poll_ms(const dt_procs *ps, int timeout_ms);

// SIGKILLs and reaps the children still alive, then, with own_groups, SIGKILLs what is
// left in every child's process group; closes the pidfds and frees. NULL is a no-op.
DT_API void dt_procs_free(dt_procs *ps);
// In a child forked by dt_procs_start that goes on in the caller's code: closes the
// copies of the pidfds and frees the table, signalling and waiting for no one (the
// siblings belong to the parent). NULL is a no-op.
DT_API void dt_procs_release(dt_procs *ps);

// How a child ended, for messages: "exited with code 3", "was killed by signal 9
// (SIGKILL)", or "ended (status unknown)" (exit_code -1 and no signal: reaped elsewhere).
DT_API void dt_procs_describe_end(int exit_code, int term_signal, char *buf, size_t n);

#ifdef __cplusplus
}
#endif
#endif // DTRAIN_LAUNCH_H
