// backends.c: the list of backends the process group can choose from, and the door to
// MPI's bootstrap. Backends not built into the library are weak stand-ins
// (unbuilt_backends.c) that the real definitions replace. With the static library
// that replacement depends on which archive member the linker extracts first: this
// file is the only one that names the backends, and it sorts before every backend's
// folder (mpi/, shm/, tcp/: the Makefile sorts the sources by path) and after nothing
// that needs it, so by the time the linker pulls it in (a pass after pg.o), the real
// definitions come before the stand-ins in the archive and win. Keep backend names out
// of the other files, and backend folders sorting before unbuilt_backends.c.
#include "comm/backends.h"

#include <string.h>

// In auto's order of preference: the first built one whose usable() says yes for auto.
static const dt_backend_ops *const backends[] = {
    &dt_backend_shm, &dt_backend_hybrid, &dt_backend_tcp, &dt_backend_mpi, &dt_backend_nccl};

const dt_backend_ops *dt_backend_find(const char *name) {
    for (size_t i = 0; i < sizeof backends / sizeof backends[0]; i++)
        if (strcmp(backends[i]->name, name) == 0)
            return backends[i];
    return NULL;
}

const dt_backend_ops *dt_backend_auto(const dt_pg *pg) {
    for (size_t i = 0; i < sizeof backends / sizeof backends[0]; i++) {
        const dt_backend_ops *be = backends[i];
        if (be->built && (!be->usable || be->usable(pg, true, NULL, 0)))
            return be;
    }
    return &dt_backend_tcp;
}

dt_status dt_backend_mpi_bootstrap(const dt_mpi_boot_req *req, dt_mpi_boot_res *res) {
    return dt_mpi_bootstrap(req, res);
}
