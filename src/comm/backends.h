// backends.h: what pg_init.c asks of the list of backends (backends.c). See
// backends.c for why the list and the MPI bootstrap are reached only through that file.
#ifndef DTRAIN_COMM_BACKENDS_H
#define DTRAIN_COMM_BACKENDS_H

#include "comm/mpi/mpi_hook.h"

// The backend named `name` ("shm", "hybrid", "tcp", "mpi"), built or a stand-in; NULL
// if unknown.
const dt_backend_ops *dt_backend_find(const char *name);
// The backend "auto" picks for pg: the first built one, in the order of preference of
// backends.c, whose usable() says yes for auto (tcp serves any group).
const dt_backend_ops *dt_backend_auto(const dt_pg *pg);
// dt_mpi_bootstrap (mpi_hook.h), or its stand-in when built without MPI.
dt_status dt_backend_mpi_bootstrap(const dt_mpi_boot_req *req, dt_mpi_boot_res *res /* out */);

#endif // DTRAIN_COMM_BACKENDS_H
