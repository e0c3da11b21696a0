// nccl_abi.h: the NCCL backend's part of the CUDA plugin's interface (core/device_abi.h's
// dt_cuda_api.nccl): communicators and whole operations. The plugin holds the NCCL calls
// (src/cuda/nccl.c); the backend's host side (nccl.c here) does the rendezvous through the
// group's store and translates dt_op into these calls.
#ifndef DTRAIN_COMM_NCCL_ABI_H
#define DTRAIN_COMM_NCCL_ABI_H

#include "dtrain/core.h"

#ifdef __cplusplus
extern "C" {
#endif

#define DT_NCCL_ABI     1
#define DT_NCCL_ID_SIZE 128 // NCCL_UNIQUE_ID_BYTES

// One operation (comm/op.h's dt_op, translated). Buffers may be host or device memory:
// host ones travel through device scratch. `avg`: the reduction is a mean (NCCL's own
// ncclAvg; the group does not divide afterwards). While it waits, the plugin calls
// progress(user) and gives up when aborted(user) turns true (the group was aborted: the
// liveness thread saw a peer die) or the deadline passes, aborting the communicator so
// that no NCCL call stays blocked.
typedef struct dt_nccl_run {
    int         kind; // dt_coll
    const void *src;
    void       *dst;
    size_t      count; // elements; per rank for the gather/scatter kinds
    int         dtype; // dt_dtype
    int         op;    // dt_reduce_op (SUM, MAX, MIN, PROD)
    bool        avg;
    int         root, peer;
    uint64_t    deadline_ns; // UINT64_MAX: none
    const char *name;        // "all_reduce #42": messages
    bool (*aborted)(void *user);
    void (*progress)(void *user);
    void *user;
} dt_nccl_run;

typedef struct dt_nccl_api {
    uint32_t abi, size;
    dt_status (*unique_id)(void *id); // DT_NCCL_ID_SIZE bytes
    // A communicator of `world` ranks on device `dev` (every rank calls it, within the
    // deadline); a split of a parent's (color < 0: in no new group, *comm NULL).
    dt_status (*init)(void **comm, int dev, const void *id, int world, int rank,
                      uint64_t deadline_ns);
    dt_status (*split)(void *parent, void **comm, int color, int key, uint64_t deadline_ns);
    dt_status (*run)(void *comm, const dt_nccl_run *r);
    void (*abort)(void *comm); // ncclCommAbort: pending and later operations fail at once
    void (*free)(void *comm);
} dt_nccl_api;

#ifdef __cplusplus
}
#endif
#endif // DTRAIN_COMM_NCCL_ABI_H
