// mpi_hook.h: what the process group (pg_init.c) asks of MPI, without <mpi.h>. mpi_boot.c
// implements it when the library is built with MPI; otherwise unbuilt_backends.c stands
// in and refuses with DT_ERR_UNSUPPORTED. docs/mpi.md describes the bootstrap.
#ifndef DTRAIN_COMM_MPI_HOOK_H
#define DTRAIN_COMM_MPI_HOOK_H

#include "comm/backend.h"

// The backend (mpi.c), or its stand-in when built without MPI.
extern const dt_backend_ops dt_backend_mpi;

#define DT_MPI_TOKEN_MAX 256 // bytes of a job token carried by the bootstrap, NUL included

typedef struct dt_mpi_boot_req {
    const dt_launch_env *env;        // the launcher's view; DT_LAUNCHER_NONE: MPI's is taken
    bool                 need_store; // rank 0 starts the store, its address goes by MPI
    const char          *addr;       // MASTER_ADDR if set (rank 0 advertises it), else NULL
    int                  port;       // MASTER_PORT if set, else 0 (a free port)
    const char          *host_id;    // this process's host identity ("<hostname>/<boot id>")
    const char          *token;      // the token in effect here; NULL: take rank 0's (rank 0
                                     // makes a random one when it has none either)
    bool     no_token;               // the caller asked for no token at all ("")
    int64_t  timeout_ms;             // the store's timeout
    uint64_t deadline_ns;
} dt_mpi_boot_req;

typedef struct dt_mpi_boot_res {
    int       rank, world;             // MPI_COMM_WORLD's (equal to the launcher's, checked)
    dt_store *store;                   // owned; NULL unless need_store
    char      token[DT_MPI_TOKEN_MAX]; // the job token to use; "" = none
} dt_mpi_boot_res;

// Initialises MPI if it is not yet (MPI_THREAD_MULTIPLE asked; MPI_Finalize registered
// for exit), checks that MPI's rank and size are the launcher's, and with need_store
// hands rank 0's store address and a job token to every rank (MPI_Ibcast, bounded by
// deadline_ns). COLLECTIVE over MPI_COMM_WORLD. Errors: DT_ERR_UNSUPPORTED (built
// without MPI, or MPI's thread level too low), DT_ERR_MISMATCH (MPI and the launcher
// disagree on rank or size), DT_ERR_TIMEOUT, DT_ERR_IO (MPI failed; its message).
dt_status dt_mpi_bootstrap(const dt_mpi_boot_req *req, dt_mpi_boot_res *res /* out */);

#endif // DTRAIN_COMM_MPI_HOOK_H
