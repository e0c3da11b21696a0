// mpi_impl.h: what mpi.c (the backend) and mpi_boot.c (MPI's life in this process and
// the bootstrap) share. Included only by src/comm/mpi/*.c, the files compiled
// with mpicc's flags (the Makefile's MPI_SRC).
#ifndef DTRAIN_COMM_MPI_IMPL_H
#define DTRAIN_COMM_MPI_IMPL_H

#include "comm/mpi/mpi_hook.h"

#include <mpi.h>

// Initialises MPI once per process unless the program already did (then its thread
// level is used and the program finalises MPI), and makes the library's own duplicate
// of MPI_COMM_WORLD with MPI_ERRORS_RETURN. COLLECTIVE over MPI_COMM_WORLD the first
// time. `what` prefixes messages. Bounded by deadline_ns.
dt_status dt_mpi_init(uint64_t deadline_ns, const char *what);
// The library's duplicate of MPI_COMM_WORLD (errors return); valid after dt_mpi_init.
MPI_Comm dt_mpi_world(void);
// The thread level MPI provides (MPI_THREAD_SINGLE ... MPI_THREAD_MULTIPLE).
int dt_mpi_thread_level(void);

// Below MPI_THREAD_MULTIPLE, every MPI call of the library is made under one process-wide
// lock (MPI_THREAD_SERIALIZED then suffices for any number of groups and threads); with
// MULTIPLE these do nothing.
void dt_mpi_lock(void);
void dt_mpi_unlock(void);

// Records that a non-blocking MPI operation was left unfinished (a timeout or an
// abort): MPI cannot cancel a collective, so MPI_Finalize would wait for it forever.
// The process then exits without finalising, and the MPI launcher stops the job.
void dt_mpi_mark_stuck(void);
bool dt_mpi_stuck(void);

// Waits for *req with MPI_Test (spin, then yield, then short sleeps), under the lock
// above. Returns DT_OK with *rc = MPI's return code (the request is complete, or MPI
// failed: the caller turns *rc into a message); DT_ERR_TIMEOUT past deadline_ns and
// DT_ERR_STATE when `pg` (may be NULL) is aborted, both without a message (the caller
// words it) and after dt_mpi_mark_stuck. status may be MPI_STATUS_IGNORE.
dt_status dt_mpi_wait(MPI_Request *req, uint64_t deadline_ns, const dt_pg *pg, MPI_Status *status,
                      int *rc /* out */);

// The status for an MPI return code (error class): MPI_ERR_TRUNCATE is DT_ERR_MISMATCH
// (ranks disagree on a size), MPI_ERR_NO_MEM DT_ERR_NOMEM, a failed process (ULFM)
// DT_ERR_PEER, anything else DT_ERR_IO.
dt_status dt_mpi_status_of(int rc);
// MPI's message for rc ("MPI_ERR_TRUNCATE: message truncated"), in buf.
const char *dt_mpi_error_string(int rc, char *buf, size_t n);

#endif // DTRAIN_COMM_MPI_IMPL_H
