// unbuilt_backends.c: weak stand-ins for backends whose source is not part of this
// build. backends.c lists every backend by name; when a backend's own file is linked, its
// strong definition replaces the stand-in here (docs/comm-backend.md). A stand-in has
// .built = false: "auto" skips it and asking for it by name is DT_ERR_UNSUPPORTED.
#include "comm/backend.h"
#include "comm/mpi/mpi_hook.h"

static dt_status unbuilt_init(dt_pg *pg, dt_store *store, uint64_t deadline_ns, void **ctx) {
    (void)pg, (void)store, (void)deadline_ns, (void)ctx;
    return dt_fail(DT_ERR_UNSUPPORTED, "this backend is not built into this library");
}

static void unbuilt_free(void *ctx) {
    (void)ctx;
}

__attribute__((weak)) const dt_backend_ops dt_backend_shm = {
    .name  = "shm",
    .init  = unbuilt_init,
    .free  = unbuilt_free,
    .built = false,
};

__attribute__((weak)) const dt_backend_ops dt_backend_mpi = {
    .name  = "mpi",
    .init  = unbuilt_init,
    .free  = unbuilt_free,
    .built = false,
};

__attribute__((weak)) dt_status dt_mpi_bootstrap(const dt_mpi_boot_req *req, dt_mpi_boot_res *res) {
    (void)req, (void)res;
    return dt_fail(DT_ERR_UNSUPPORTED,
                   "this library was built without MPI (no mpicc at build time): set "
                   "MASTER_ADDR and MASTER_PORT, or install libopenmpi-dev and rebuild");
}
