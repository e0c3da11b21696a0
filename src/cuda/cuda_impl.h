// cuda_impl.h: what the files of the CUDA plugin share (src/cuda/: libdtrain_cuda.so).
//
// The plugin is a room of its own: it is not linked against libdtrain and calls the
// library only through the host table it is handed when loaded (core/device_abi.h),
// so errors and logs go through cu_fail / CU_LOG into the library's own thread-local
// error and log line. Every CUDA, cuBLAS and NCCL call's status is checked, and a
// failure names the call (CU_RT, CU_BLAS, CU_NCCL). Files:
//   plugin.c     the entry point, the device table, devices, streams, events, waits
//   alloc.c      the caching allocator (size-class free lists: no cudaMalloc per step)
//   blas.c       cuBLAS / cuBLASLt GEMMs (fp32 with TF32 off, bf16 operands)
//   exec*.c      the executor: a model graph's description run on the device
//   k_*.cu       kernels, each file one family, launched through the C functions of
//                kernels.h
//   nccl.c       the NCCL backend's operations
// Host code is C (.c, compiled by the host compiler against CUDA's C headers);
// kernels are CUDA C++ (.cu) behind extern "C" launchers.
#ifndef DTRAIN_CUDA_IMPL_H
#define DTRAIN_CUDA_IMPL_H

#include "core/device_abi.h"

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

extern const dt_host_api *cu_host;

// Records status s with a formatted message in the library (its dt_last_error) and
// returns s.
dt_status cu_fail(dt_status s, const char *fmt, ...) DT_PRINTF(2, 3);
// The dt_status a CUDA runtime error maps to: DT_ERR_NOMEM for memory, DT_ERR_UNSUPPORTED
// for a missing device, driver or kernel image, DT_ERR_IO for the rest (the device
// failed: an illegal address, an ECC error, a launch failure).
dt_status cu_status_of(cudaError_t e);
// cu_fail(cu_status_of(e), "<what>: <error name>: <error string>").
dt_status cu_rt_fail(cudaError_t e, const char *what);

// A runtime call checked: on failure, returns its status from the enclosing function
// with a message naming the call.
#define CU_RT(call)                                                                                \
    do {                                                                                           \
        cudaError_t cu_e_ = (call);                                                                \
        if (cu_e_ != cudaSuccess)                                                                  \
            return cu_rt_fail(cu_e_, #call);                                                       \
    } while (0)
// The same for a kernel launch just made (its configuration errors).
#define CU_LAUNCHED(what)                                                                          \
    CU_RT(cudaPeekAtLastError() == cudaSuccess ? cudaSuccess : cudaGetLastError())

#define CU_LOG(level, ...) cu_host->log((level), "cuda", __VA_ARGS__)

// Makes dev the calling thread's current device (once per thread and device).
dt_status cu_use(int dev);
// Waits for a stream (NULL: the device) with the bound of DT_CUDA_TIMEOUT_MS,
// DT_ERR_TIMEOUT naming `what` when it passes.
dt_status cu_stream_wait(int dev, cudaStream_t s, const char *what);
dt_status cu_event_wait(cudaEvent_t e, const char *what);
// The device's properties (read once).
const struct cudaDeviceProp *cu_props(int dev);

// ------------------------------------------------------------- the allocator (alloc.c)
dt_status cu_mem_alloc(int dev, size_t bytes, void **out);
void      cu_mem_free(int dev, void *p);
size_t    cu_mem_held(int dev);
// Gives every cached block back to CUDA (after a failed cudaMalloc, before retrying).
void cu_mem_trim(int dev);
// Registers (once) an exit handler giving every cached block back to CUDA.
void cu_mem_trim_at_exit(void);

// ---------------------------------------------------------------- sub-tables
extern const void *const cu_exec_api; // exec.c
extern const void *const cu_nccl_api; // nccl.c

#ifdef __cplusplus
}
#endif
#endif // DTRAIN_CUDA_IMPL_H
