// plugin.c: the plugin's entry point and its table (core/device_abi.h): devices, pinned
// memory, copies, streams, events, and the bounded waits every one of them uses.
#include "cuda/cuda_impl.h"

#include <cublas_v2.h>
#include <nccl.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#define MAX_DEVICES 64

const dt_host_api *cu_host;

dt_status cu_fail(dt_status s, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    s = cu_host->failv(s, fmt, ap);
    va_end(ap);
    return s;
}

dt_status cu_status_of(cudaError_t e) {
    switch (e) {
    case cudaErrorMemoryAllocation:
        return DT_ERR_NOMEM;
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorNoKernelImageForDevice:
    case cudaErrorInvalidDevice:
    case cudaErrorUnsupportedPtxVersion:
        return DT_ERR_UNSUPPORTED;
    default:
        return DT_ERR_IO;
    }
}

dt_status cu_rt_fail(cudaError_t e, const char *what) {
    return cu_fail(cu_status_of(e), "%s: %s: %s", what, cudaGetErrorName(e), cudaGetErrorString(e));
}

// ------------------------------------------------------------------- devices

static int                   ndevices = -1;
static struct cudaDeviceProp props[MAX_DEVICES];
static pthread_once_t        props_once = PTHREAD_ONCE_INIT;
static __thread int          current    = -1; // this thread's device, once set

static void read_props(void) {
    for (int d = 0; d < ndevices && d < MAX_DEVICES; d++)
        if (cudaGetDeviceProperties(&props[d], d) != cudaSuccess)
            memset(&props[d], 0, sizeof props[d]);
}

const struct cudaDeviceProp *cu_props(int dev) {
    pthread_once(&props_once, read_props);
    return &props[dev];
}

dt_status cu_use(int dev) {
    if (dev == current)
        return DT_OK;
    if (dev < 0 || dev >= ndevices)
        return cu_fail(DT_ERR_ARG, "cuda: no device %d (this machine has %d)", dev, ndevices);
    CU_RT(cudaSetDevice(dev));
    current = dev;
    return DT_OK;
}

static dt_status count(int *n) {
    *n = 0;
    if (ndevices < 0) {
        int         k = 0;
        cudaError_t e = cudaGetDeviceCount(&k);
        if (e != cudaSuccess)
            return cu_fail(DT_ERR_UNSUPPORTED, "no CUDA GPU found (cudaGetDeviceCount: %s: %s)",
                           cudaGetErrorName(e), cudaGetErrorString(e));
        if (k == 0)
            return cu_fail(DT_ERR_UNSUPPORTED, "no CUDA GPU found (cudaGetDeviceCount: 0 devices)");
        ndevices = k < MAX_DEVICES ? k : MAX_DEVICES;
    }
    *n = ndevices;
    return DT_OK;
}

static dt_status describe(int dev, char *buf, size_t n) {
    DT_TRY(cu_use(dev));
    const struct cudaDeviceProp *p = cu_props(dev);
    snprintf(buf, n, "%s (sm_%d%d, %d SMs, %.1f GiB)", p->name, p->major, p->minor,
             p->multiProcessorCount, (double)p->totalGlobalMem / (1u << 30));
    return DT_OK;
}

static char versions[160];

static void read_versions(void) {
    int rt = 0, drv = 0, nccl = 0;
    int bmaj = 0, bmin = 0, bpatch = 0;
    cudaRuntimeGetVersion(&rt);
    cudaDriverGetVersion(&drv);
    cublasGetProperty(MAJOR_VERSION, &bmaj);
    cublasGetProperty(MINOR_VERSION, &bmin);
    cublasGetProperty(PATCH_LEVEL, &bpatch);
    ncclGetVersion(&nccl);
    snprintf(versions, sizeof versions,
             "CUDA runtime %d.%d, driver %d.%d, cuBLAS %d.%d.%d, NCCL %d.%d.%d", rt / 1000,
             rt % 1000 / 10, drv / 1000, drv % 1000 / 10, bmaj, bmin, bpatch, nccl / 10000,
             nccl % 10000 / 100, nccl % 100);
}

// --------------------------------------------------------------------- waits

static uint64_t timeout_ns(void) {
    long ms = 10L * 60 * 1000;
    if (cu_host->setting_int("DT_CUDA_TIMEOUT_MS", &ms) != DT_OK)
        ms = 10L * 60 * 1000; // the message stays recorded; the default applies
    return (uint64_t)ms * 1000000u;
}

// Polls `ready` until it says done or the bound passes: spinning for the first 50 us
// (a short step's end is then seen at once), then sleeping 20 us between looks.
typedef cudaError_t (*query_fn)(void *h);
static cudaError_t query_stream(void *h) {
    return cudaStreamQuery((cudaStream_t)h);
}
static cudaError_t query_event(void *h) {
    return cudaEventQuery((cudaEvent_t)h);
}

static dt_status poll_until(query_fn q, void *h, const char *what) {
    uint64_t start = cu_host->now_ns(), bound = timeout_ns();
    for (unsigned i = 0;; i++) {
        cudaError_t e = q(h);
        if (e == cudaSuccess)
            return DT_OK;
        if (e != cudaErrorNotReady)
            return cu_rt_fail(e, what);
        uint64_t waited = cu_host->now_ns() - start;
        if (waited > bound)
            return cu_fail(DT_ERR_TIMEOUT,
                           "%s: the GPU did not finish within DT_CUDA_TIMEOUT_MS (%.0f s)", what,
                           (double)bound * 1e-9);
        if (waited < 50000)
            sched_yield();
        else
            nanosleep(&(struct timespec){0, 20000}, NULL);
    }
}

dt_status cu_stream_wait(int dev, cudaStream_t s, const char *what) {
    DT_TRY(cu_use(dev));
    if (s)
        return poll_until(query_stream, s, what);
    // The whole device: an event recorded on the legacy default stream waits for every
    // blocking stream; our streams are non-blocking, so the device's own call is used,
    // after an event bounded wait on the legacy stream.
    cudaEvent_t e;
    CU_RT(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    cudaError_t r  = cudaEventRecord(e, 0);
    dt_status   st = r == cudaSuccess ? poll_until(query_event, e, what) : cu_rt_fail(r, what);
    cudaEventDestroy(e);
    if (st == DT_OK)
        CU_RT(cudaDeviceSynchronize());
    return st;
}

dt_status cu_event_wait(cudaEvent_t e, const char *what) {
    return poll_until(query_event, e, what);
}

// ------------------------------------------------------------ memory and copies

static dt_status host_alloc(int dev, size_t bytes, void **out) {
    *out = NULL;
    DT_TRY(cu_use(dev));
    CU_RT(cudaMallocHost(out, bytes ? bytes : 1));
    return DT_OK;
}

static void host_free(int dev, void *p) {
    (void)dev;
    cudaError_t e = cudaFreeHost(p);
    if (e != cudaSuccess)
        CU_LOG(DT_LOG_WARN, "cudaFreeHost: %s", cudaGetErrorString(e));
}

static dt_status copy(int dev, void *dst, const void *src, size_t bytes, void *stream) {
    DT_TRY(cu_use(dev));
    if (!stream) { // queued on a stream of our own, then a bounded wait
        cudaStream_t s;
        CU_RT(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
        cudaError_t e  = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, s);
        dt_status   st = e == cudaSuccess ? poll_until(query_stream, s, "dt_device_copy")
                                          : cu_rt_fail(e, "cudaMemcpyAsync");
        cudaStreamDestroy(s);
        return st;
    }
    CU_RT(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, (cudaStream_t)stream));
    return DT_OK;
}

static dt_status memset_(int dev, void *p, int byte, size_t bytes, void *stream) {
    DT_TRY(cu_use(dev));
    if (!stream) {
        cudaStream_t s;
        CU_RT(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
        cudaError_t e  = cudaMemsetAsync(p, byte, bytes, s);
        dt_status   st = e == cudaSuccess ? poll_until(query_stream, s, "dt_device_memset")
                                          : cu_rt_fail(e, "cudaMemsetAsync");
        cudaStreamDestroy(s);
        return st;
    }
    CU_RT(cudaMemsetAsync(p, byte, bytes, (cudaStream_t)stream));
    return DT_OK;
}

static dt_status device_sync(int dev) {
    return cu_stream_wait(dev, NULL, "dt_device_sync");
}

// --------------------------------------------------------------- streams, events

static dt_status stream_new(int dev, void **out) {
    DT_TRY(cu_use(dev));
    cudaStream_t s;
    CU_RT(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    *out = s;
    return DT_OK;
}

static void stream_free(int dev, void *s) {
    if (cu_stream_wait(dev, s, "dt_stream_free") != DT_OK)
        CU_LOG(DT_LOG_WARN, "dt_stream_free: the stream's work did not finish; freeing it anyway");
    cudaStreamDestroy((cudaStream_t)s);
}

static dt_status stream_sync(int dev, void *s) {
    return cu_stream_wait(dev, s, "dt_stream_sync");
}

static dt_status event_new(int dev, void **out) {
    DT_TRY(cu_use(dev));
    cudaEvent_t e;
    CU_RT(cudaEventCreate(&e));
    *out = e;
    return DT_OK;
}

static void event_free(int dev, void *e) {
    (void)dev;
    cudaEventDestroy((cudaEvent_t)e);
}

static dt_status event_record(int dev, void *e, void *s) {
    DT_TRY(cu_use(dev));
    CU_RT(cudaEventRecord((cudaEvent_t)e, (cudaStream_t)s));
    return DT_OK;
}

static dt_status stream_wait(int dev, void *s, void *e) {
    DT_TRY(cu_use(dev));
    CU_RT(cudaStreamWaitEvent((cudaStream_t)s, (cudaEvent_t)e, 0));
    return DT_OK;
}

static dt_status event_sync(int dev, void *e) {
    DT_TRY(cu_use(dev));
    return cu_event_wait((cudaEvent_t)e, "dt_event_sync");
}

static dt_status event_elapsed(int dev, void *a, void *b, float *ms) {
    DT_TRY(cu_use(dev));
    CU_RT(cudaEventElapsedTime(ms, (cudaEvent_t)a, (cudaEvent_t)b));
    return DT_OK;
}

// ---------------------------------------------------------------- the table

static dt_cuda_api api = {
    .abi           = DT_CUDA_ABI,
    .size          = sizeof(dt_cuda_api),
    .versions      = versions,
    .count         = count,
    .describe      = describe,
    .mem_alloc     = cu_mem_alloc,
    .mem_free      = cu_mem_free,
    .mem_held      = cu_mem_held,
    .host_alloc    = host_alloc,
    .host_free     = host_free,
    .copy          = copy,
    .memset        = memset_,
    .device_sync   = device_sync,
    .stream_new    = stream_new,
    .stream_free   = stream_free,
    .stream_sync   = stream_sync,
    .event_new     = event_new,
    .event_free    = event_free,
    .event_record  = event_record,
    .stream_wait   = stream_wait,
    .event_sync    = event_sync,
    .event_elapsed = event_elapsed,
};

__attribute__((visibility("default"))) dt_status dt_cuda_plugin_open(const dt_host_api  *host,
                                                                     const dt_cuda_api **out);

dt_status dt_cuda_plugin_open(const dt_host_api *host, const dt_cuda_api **out) {
    *out = NULL;
    if (!host || host->abi != DT_CUDA_ABI || host->size < sizeof(dt_host_api))
        return DT_ERR_UNSUPPORTED; // nothing to report through: the library says it
    cu_host = host;
    read_versions();
    api.exec = cu_exec_api;
    api.nccl = cu_nccl_api;
    *out     = &api;
    return DT_OK;
}
