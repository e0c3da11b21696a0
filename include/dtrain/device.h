// device.h: where tensors live and run. The CPU device always exists; CUDA devices
// ("cuda", "cuda:N") come from a plugin, libdtrain_cuda.so, that the library loads the
// first time one is asked for, so a machine without CUDA's libraries runs every CPU
// program and only a request for a GPU says what is missing (docs/gpu.md):
//
//     dt_device *d;
//     if (dt_device_get(&d, "cuda:0")) { fprintf(stderr, "%s\n", dt_last_error()); ... }
//     void *buf;
//     dt_device_alloc(d, n * sizeof(float), &buf);        // device memory
//     dt_device_copy(d, buf, host, n * sizeof(float), NULL);  // host -> device, waits
//     dt_stream *s;  dt_stream_new(d, &s);
//     dt_device_copy(d, host, buf, n * sizeof(float), s); // queued on s (pinned host
//     dt_stream_sync(s);                                  // memory copies asynchronously)
//
// The plugin is looked for in this order: $DT_CUDA_PLUGIN (a path), the folder of the
// running program's ../lib and ../release/lib (build/bin programs find
// build/release/lib), then the dynamic loader's path ("libdtrain_cuda.so.1").
// Asking for "cuda" where it cannot be had fails with DT_ERR_UNSUPPORTED and a message
// naming what is missing: a build without CUDA ("this dtrain was built without CUDA
// (make CUDA=1 on a machine with nvcc)"), a CUDA library the plugin needs (the dynamic
// loader's own message), or a GPU ("no CUDA GPU found (cudaGetDeviceCount: ...)").
//
// Devices are process-wide and never freed. Every wait (stream, event, device) is
// bounded by DT_CUDA_TIMEOUT_MS and fails with DT_ERR_TIMEOUT naming what it waited for.
// A model runs on a device through an executor (exec.h).
#ifndef DTRAIN_DEVICE_H
#define DTRAIN_DEVICE_H

#include "dtrain/core.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dt_device dt_device;
typedef struct dt_stream dt_stream;
typedef struct dt_event  dt_event;

typedef enum dt_device_kind { DT_DEVICE_CPU = 0, DT_DEVICE_CUDA = 1 } dt_device_kind;

// "cpu", "cuda" (device 0) or "cuda:N". DT_ERR_ARG for another spelling or a CUDA index
// past the devices present; DT_ERR_UNSUPPORTED (see above) where CUDA cannot be had.
// The first CUDA request loads the plugin and creates the device's context.
DT_API dt_status      dt_device_get(dt_device **out, const char *spec);
DT_API const char    *dt_device_name(const dt_device *d); // "cpu", "cuda:1"
DT_API dt_device_kind dt_device_type(const dt_device *d);
DT_API int            dt_device_index(const dt_device *d); // 0 for the CPU
DT_API bool           dt_device_is_cuda(const dt_device *d);
// The number of CUDA devices (0 with the reason recorded, DT_ERR_UNSUPPORTED, where the
// plugin or a GPU is missing).
DT_API dt_status dt_device_cuda_count(int *n);
// One line: "cpu" or "NVIDIA H100 80GB HBM3 (sm_90, 132 SMs, 79.1 GiB; CUDA runtime
// 13.0, cuBLAS 13.0.0, NCCL 2.27.3)" into buf, which it returns.
DT_API const char *dt_device_describe(const dt_device *d, char *buf, size_t n);

// ------------------------------------------------------------------------ memory
// Device memory: dt_alloc on the CPU (64-byte aligned), the plugin's caching allocator
// on a GPU (freed blocks are kept in size classes and reused, so a training step
// makes no cudaMalloc). 0 bytes gives a valid unique pointer.
DT_API dt_status dt_device_alloc(dt_device *d, size_t bytes, void **out);
DT_API void      dt_device_free(dt_device *d, void *p); // NULL-safe
// Page-locked host memory, whose copies to and from a GPU run asynchronously on a
// stream (pin_memory); plain dt_alloc memory on the CPU device.
DT_API dt_status dt_device_alloc_host(dt_device *d, size_t bytes, void **out);
DT_API void      dt_device_free_host(dt_device *d, void *p);
// Bytes of d's memory that its allocator holds (in use and cached); 0 on the CPU.
DT_API size_t dt_device_mem_held(dt_device *d);

// Copies `bytes` from src to dst, each either host memory or d's memory (the pointer
// says which: CUDA's unified addressing). s NULL: returns when the copy is done; else
// queued on s (a copy from or to pageable host memory may still wait for the copy).
DT_API dt_status dt_device_copy(dt_device *d, void *dst, const void *src, size_t bytes,
                                dt_stream *s);
// Sets `bytes` of d's memory to `byte`; s as for dt_device_copy.
DT_API dt_status dt_device_memset(dt_device *d, void *p, int byte, size_t bytes, dt_stream *s);
// Waits until everything queued on d is done.
DT_API dt_status dt_device_sync(dt_device *d);

// --------------------------------------------------------------- streams and events
// A stream runs its work in order; work on two streams may overlap. On the CPU device
// everything runs at once, so streams and events are trivially complete.
DT_API dt_status  dt_stream_new(dt_device *d, dt_stream **out);
DT_API void       dt_stream_free(dt_stream *s); // NULL-safe; waits for its work first
DT_API dt_status  dt_stream_sync(dt_stream *s);
DT_API dt_device *dt_stream_device(const dt_stream *s);
// An event marks a point of a stream: record it, then let another stream wait for it
// (without blocking the host), or wait for it on the host, or time between two.
DT_API dt_status dt_event_new(dt_device *d, dt_event **out);
DT_API void      dt_event_free(dt_event *e); // NULL-safe
DT_API dt_status dt_event_record(dt_event *e, dt_stream *s);
DT_API dt_status dt_stream_wait_event(dt_stream *s, dt_event *e);
DT_API dt_status dt_event_sync(dt_event *e);
// Milliseconds between two recorded events of the same device (0 on the CPU).
DT_API dt_status dt_event_elapsed(dt_event *start, dt_event *end, float *ms);

#ifdef __cplusplus
}
#endif
#endif // DTRAIN_DEVICE_H
