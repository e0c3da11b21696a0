// device_abi.h: the interface between libdtrain and its CUDA plugin (src/cuda/,
// libdtrain_cuda.so). The plugin is not linked against libdtrain: a program links the
// library statically, and a second copy of its state (errors, logging, allocation
// counts) would be wrong. So the library hands the plugin a table of the host
// functions it may call, and gets back a table of the device's functions:
//
//     const dt_cuda_api *api;
//     dt_status st = dt_cuda_plugin_open(&host, &api);   // symbol DT_CUDA_PLUGIN_ENTRY
//
// Both tables start with the ABI version and their size: the library refuses a plugin
// of another version (built from another tree), and fields are only ever appended.
// Device memory, streams and events cross as plain pointers (a cudaStream_t is a
// pointer); the executor and the NCCL backend are sub-tables the plugin returns and
// the layers above (src/exec, src/comm/nccl) cast to their own ABI structs.
#ifndef DTRAIN_CORE_DEVICE_ABI_H
#define DTRAIN_CORE_DEVICE_ABI_H

#include "dtrain/core.h"

#include <stdarg.h>

#ifdef __cplusplus
extern "C" {
#endif

#define DT_CUDA_ABI          1
#define DT_CUDA_PLUGIN_ENTRY "dt_cuda_plugin_open"

// What the plugin may call in the library.
typedef struct dt_host_api {
    uint32_t abi, size;
    dt_status (*failv)(dt_status s, const char *fmt, va_list ap); // dt_failv
    dt_status (*fail_context)(const char *fmt, ...);              // dt_fail_context
    void (*log)(dt_log_level level, const char *module, const char *fmt, ...);
    bool (*log_enabled)(dt_log_level level);
    void *(*alloc)(size_t nbytes); // dt_alloc (records DT_ERR_NOMEM)
    void *(*alloc_zero)(size_t nbytes);
    void (*free)(void *p);
    dt_status (*setting_int)(const char *name, long *out); // dt_setting_int
    uint64_t (*now_ns)(void);
} dt_host_api;

// What the plugin offers. Device numbers are CUDA ordinals; streams and events are the
// runtime's handles (NULL stream: the device's default stream, used synchronously).
typedef struct dt_cuda_api {
    uint32_t    abi, size;
    const char *versions; // "CUDA runtime 13.0, driver 13.0, cuBLAS 13.1.0, NCCL 2.27.7"
    // Devices: how many (DT_ERR_UNSUPPORTED naming cudaGetDeviceCount's error where
    // none), and one line about one.
    dt_status (*count)(int *n);
    dt_status (*describe)(int dev, char *buf, size_t n);
    // Memory (the caching allocator) and pinned host memory.
    dt_status (*mem_alloc)(int dev, size_t bytes, void **out);
    void (*mem_free)(int dev, void *p);
    size_t (*mem_held)(int dev);
    dt_status (*host_alloc)(int dev, size_t bytes, void **out);
    void (*host_free)(int dev, void *p);
    dt_status (*copy)(int dev, void *dst, const void *src, size_t bytes, void *stream);
    dt_status (*memset)(int dev, void *p, int byte, size_t bytes, void *stream);
    dt_status (*device_sync)(int dev);
    // Streams and events; every wait bounded by DT_CUDA_TIMEOUT_MS.
    dt_status (*stream_new)(int dev, void **out);
    void (*stream_free)(int dev, void *s);
    dt_status (*stream_sync)(int dev, void *s);
    dt_status (*event_new)(int dev, void **out);
    void (*event_free)(int dev, void *e);
    dt_status (*event_record)(int dev, void *e, void *s);
    dt_status (*stream_wait)(int dev, void *s, void *e);
    dt_status (*event_sync)(int dev, void *e);
    dt_status (*event_elapsed)(int dev, void *a, void *b, float *ms);
    // Sub-tables (NULL when the plugin has none): src/exec/exec_abi.h's dt_exec_api and
    // src/comm/nccl/nccl_abi.h's dt_nccl_api.
    const void *exec;
    const void *nccl;
} dt_cuda_api;

// The plugin's one exported function. DT_OK and *out, or a failure recorded through
// host->failv (an ABI mismatch, no CUDA runtime the plugin can talk to).
typedef dt_status (*dt_cuda_plugin_open_fn)(const dt_host_api *host, const dt_cuda_api **out);

// ----------------------------------------------------------------- library side
// (src/core/device.c)

// The plugin's table, loading the plugin the first time (thread-safe). DT_ERR_UNSUPPORTED
// naming what is missing (see device.h). Layers above core reach the sub-tables here.
dt_status dt_cuda_api_get(const dt_cuda_api **out);

#ifdef __cplusplus
}
#endif
#endif // DTRAIN_CORE_DEVICE_ABI_H
