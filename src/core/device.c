// device.c: the devices of device.h. The CPU device is plain memory and synchronous
// streams; CUDA devices forward to the plugin (device_abi.h), which this file loads
// with dlopen the first time one is asked for and keeps for the life of the process.
#include "dtrain/device.h"

#include "core/device_abi.h"

#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MAX_CUDA_DEVICES 64

struct dt_device {
    dt_device_kind kind;
    int            index;
    char           name[16];
    bool           ready; // CUDA: its context was made (first dt_device_get)
};

struct dt_stream {
    dt_device *d;
    void      *h; // the plugin's handle; NULL on the CPU
};

struct dt_event {
    dt_device *d;
    void      *h;
};

static dt_device       cpu_device = {DT_DEVICE_CPU, 0, "cpu", true};
static dt_device       cuda_devices[MAX_CUDA_DEVICES];
static pthread_mutex_t devices_lock = PTHREAD_MUTEX_INITIALIZER;

// ------------------------------------------------------------------ the plugin

static pthread_once_t     plugin_once = PTHREAD_ONCE_INIT;
static const dt_cuda_api *plugin;
static dt_status          plugin_status;
static char               plugin_error[768];
static int                plugin_count; // devices, when the plugin loaded

static void host_log(dt_log_level level, const char *module, const char *fmt, ...) {
    if (!dt_log_enabled(level))
        return;
    char    line[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    dt_log(level, module, "%s", line);
}

static dt_status host_fail_context(const char *fmt, ...) {
    char    text[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    return dt_fail_context("%s", text);
}

static const dt_host_api host_api = {
    .abi          = DT_CUDA_ABI,
    .size         = sizeof(dt_host_api),
    .failv        = dt_failv,
    .fail_context = host_fail_context,
    .log          = host_log,
    .log_enabled  = dt_log_enabled,
    .alloc        = dt_alloc,
    .alloc_zero   = dt_alloc_zero,
    .free         = dt_free,
    .setting_int  = dt_setting_int,
    .now_ns       = dt_now_ns,
};

// The folder of the running program (/proc/self/exe), into dir; false when unknown.
static bool exe_dir(char *dir, size_t n) {
    char    path[PATH_MAX];
    ssize_t len = readlink("/proc/self/exe", path, sizeof path - 1);
    if (len <= 0)
        return false;
    path[len]   = 0;
    char *slash = strrchr(path, '/');
    if (!slash)
        return false;
    *slash = 0;
    return snprintf(dir, n, "%s", path) < (int)n;
}

// Tries one candidate: the handle, or NULL with the loader's message appended to `why`
// (a file that is there but cannot be loaded: a CUDA library it needs is missing).
static void *try_open(const char *path, bool must_exist, char *why, size_t n) {
    if (!must_exist && strchr(path, '/') && access(path, F_OK) != 0)
        return NULL; // not there: the next place
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        size_t used = strlen(why);
        snprintf(why + used, n - used, "%s%s", used ? "; " : "", dlerror());
    }
    return h;
}

static void *find_plugin(char *why, size_t n) {
    why[0]           = 0;
    const char *path = dt_setting_str("DT_CUDA_PLUGIN");
    if (path) // the user's choice: its failure is the answer
        return try_open(path, true, why, n);
    char dir[PATH_MAX], cand[PATH_MAX + 64];
    if (exe_dir(dir, sizeof dir)) {
        static const char *const rel[] = {"../lib/libdtrain_cuda.so", "../lib/libdtrain_cuda.so.1",
                                          "../release/lib/libdtrain_cuda.so"};
        for (size_t i = 0; i < sizeof rel / sizeof rel[0]; i++) {
            snprintf(cand, sizeof cand, "%s/%s", dir, rel[i]);
            void *h = try_open(cand, false, why, n);
            if (h || why[0])
                return h;
        }
    }
    void *h = dlopen("libdtrain_cuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        const char *e = dlerror();
        // "cannot open shared object file" for the plugin itself means it was not built
        // (or installed); any other message is about a library it needs.
        if (e && strstr(e, "libdtrain_cuda.so.1: cannot open shared object file"))
            snprintf(why, n,
                     "this dtrain was built without CUDA (make CUDA=1 on a machine with "
                     "nvcc)");
        else
            snprintf(why, n, "%s", e ? e : "dlopen failed");
    }
    return h;
}

static void load_plugin(void) {
    char  why[600];
    void *h = find_plugin(why, sizeof why);
    if (!h) {
        plugin_status = DT_ERR_UNSUPPORTED;
        snprintf(plugin_error, sizeof plugin_error, "cuda: %s", why);
        return;
    }
    dt_cuda_plugin_open_fn open_fn;
    *(void **)&open_fn = dlsym(h, DT_CUDA_PLUGIN_ENTRY);
    if (!open_fn) {
        plugin_status = DT_ERR_UNSUPPORTED;
        snprintf(plugin_error, sizeof plugin_error,
                 "cuda: the plugin has no %s (not a dtrain CUDA plugin?)", DT_CUDA_PLUGIN_ENTRY);
        return;
    }
    const dt_cuda_api *api = NULL;
    dt_status          st  = open_fn(&host_api, &api);
    if (st == DT_OK && (!api || api->abi != DT_CUDA_ABI || api->size < sizeof *api))
        st = dt_fail(DT_ERR_UNSUPPORTED,
                     "the CUDA plugin speaks ABI %u, this library %u: rebuild both from one tree",
                     api ? api->abi : 0, DT_CUDA_ABI);
    int count = 0;
    if (st == DT_OK)
        st = api->count(&count);
    if (st != DT_OK) { // the plugin is kept loaded: its code may be on a stack still
        plugin_status = st;
        snprintf(plugin_error, sizeof plugin_error, "cuda: %s", dt_last_error());
        return;
    }
    plugin       = api;
    plugin_count = count;
    DT_INFO("device", "cuda: %d device(s); %s", count, api->versions);
}

dt_status dt_cuda_api_get(const dt_cuda_api **out) {
    pthread_once(&plugin_once, load_plugin);
    *out = plugin;
    if (!plugin)
        return dt_fail(plugin_status, "%s", plugin_error);
    return DT_OK;
}

// --------------------------------------------------------------------- devices

dt_status dt_device_cuda_count(int *n) {
    const dt_cuda_api *api;
    *n = 0;
    DT_TRY(dt_cuda_api_get(&api));
    *n = plugin_count;
    return DT_OK;
}

dt_status dt_device_get(dt_device **out, const char *spec) {
    if (out)
        *out = NULL;
    if (!out || !spec)
        return dt_fail(DT_ERR_ARG, "dt_device_get: expected an output pointer and a device name");
    if (strcmp(spec, "cpu") == 0) {
        *out = &cpu_device;
        return DT_OK;
    }
    long index = 0;
    if (strncmp(spec, "cuda", 4) != 0 || (spec[4] != 0 && spec[4] != ':') ||
        (spec[4] == ':' &&
         dt_parse_long(spec + 5, 0, MAX_CUDA_DEVICES - 1, "a device index", &index) != DT_OK))
        return dt_fail(DT_ERR_ARG,
                       "expected a device \"cpu\", \"cuda\" or \"cuda:N\" (N in [0, %d]), found "
                       "\"%s\"",
                       MAX_CUDA_DEVICES - 1, spec);
    const dt_cuda_api *api;
    DT_TRY(dt_cuda_api_get(&api));
    if (index >= plugin_count)
        return dt_fail(DT_ERR_ARG, "device \"%s\": this machine has %d CUDA device(s)", spec,
                       plugin_count);
    dt_device *d = &cuda_devices[index];
    pthread_mutex_lock(&devices_lock);
    if (!d->ready) {
        d->kind  = DT_DEVICE_CUDA;
        d->index = (int)index;
        snprintf(d->name, sizeof d->name, "cuda:%ld", index);
        d->ready = true;
    }
    pthread_mutex_unlock(&devices_lock);
    *out = d;
    return DT_OK;
}

const char *dt_device_name(const dt_device *d) {
    return d ? d->name : "(none)";
}
dt_device_kind dt_device_type(const dt_device *d) {
    return d ? d->kind : DT_DEVICE_CPU;
}
int dt_device_index(const dt_device *d) {
    return d ? d->index : 0;
}
bool dt_device_is_cuda(const dt_device *d) {
    return d && d->kind == DT_DEVICE_CUDA;
}

const char *dt_device_describe(const dt_device *d, char *buf, size_t n) {
    if (n == 0)
        return buf;
    if (!dt_device_is_cuda(d) || plugin->describe(d->index, buf, n) != DT_OK)
        snprintf(buf, n, "%s", dt_device_name(d));
    return buf;
}

// ------------------------------------------------------------------------ memory

dt_status dt_device_alloc(dt_device *d, size_t bytes, void **out) {
    *out = NULL;
    if (dt_device_is_cuda(d))
        return plugin->mem_alloc(d->index, bytes, out);
    *out = dt_alloc(bytes);
    return *out ? DT_OK : DT_ERR_NOMEM;
}

void dt_device_free(dt_device *d, void *p) {
    if (!p)
        return;
    if (dt_device_is_cuda(d))
        plugin->mem_free(d->index, p);
    else
        dt_free(p);
}

dt_status dt_device_alloc_host(dt_device *d, size_t bytes, void **out) {
    *out = NULL;
    if (dt_device_is_cuda(d))
        return plugin->host_alloc(d->index, bytes, out);
    *out = dt_alloc(bytes);
    return *out ? DT_OK : DT_ERR_NOMEM;
}

void dt_device_free_host(dt_device *d, void *p) {
    if (!p)
        return;
    if (dt_device_is_cuda(d))
        plugin->host_free(d->index, p);
    else
        dt_free(p);
}

size_t dt_device_mem_held(dt_device *d) {
    return dt_device_is_cuda(d) ? plugin->mem_held(d->index) : 0;
}

dt_status dt_device_copy(dt_device *d, void *dst, const void *src, size_t bytes, dt_stream *s) {
    if (bytes == 0)
        return DT_OK;
    if (!dst || !src)
        return dt_fail(DT_ERR_ARG, "dt_device_copy: expected two buffers, found NULL");
    if (dt_device_is_cuda(d))
        return plugin->copy(d->index, dst, src, bytes, s ? s->h : NULL);
    memmove(dst, src, bytes);
    return DT_OK;
}

dt_status dt_device_memset(dt_device *d, void *p, int byte, size_t bytes, dt_stream *s) {
    if (bytes == 0)
        return DT_OK;
    if (dt_device_is_cuda(d))
        return plugin->memset(d->index, p, byte, bytes, s ? s->h : NULL);
    memset(p, byte, bytes);
    return DT_OK;
}

dt_status dt_device_sync(dt_device *d) {
    return dt_device_is_cuda(d) ? plugin->device_sync(d->index) : DT_OK;
}

// --------------------------------------------------------------- streams and events

dt_status dt_stream_new(dt_device *d, dt_stream **out) {
    *out = NULL;
    if (!d)
        return dt_fail(DT_ERR_ARG, "dt_stream_new: expected a device, found NULL");
    dt_stream *s = dt_alloc_zero(sizeof *s);
    if (!s)
        return DT_ERR_NOMEM;
    s->d = d;
    if (dt_device_is_cuda(d)) {
        dt_status st = plugin->stream_new(d->index, &s->h);
        if (st) {
            dt_free(s);
            return st;
        }
    }
    *out = s;
    return DT_OK;
}

void dt_stream_free(dt_stream *s) {
    if (!s)
        return;
    if (s->h)
        plugin->stream_free(s->d->index, s->h);
    dt_free(s);
}

dt_status dt_stream_sync(dt_stream *s) {
    return s && s->h ? plugin->stream_sync(s->d->index, s->h) : DT_OK;
}

dt_device *dt_stream_device(const dt_stream *s) {
    return s ? s->d : NULL;
}

dt_status dt_event_new(dt_device *d, dt_event **out) {
    *out = NULL;
    if (!d)
        return dt_fail(DT_ERR_ARG, "dt_event_new: expected a device, found NULL");
    dt_event *e = dt_alloc_zero(sizeof *e);
    if (!e)
        return DT_ERR_NOMEM;
    e->d = d;
    if (dt_device_is_cuda(d)) {
        dt_status st = plugin->event_new(d->index, &e->h);
        if (st) {
            dt_free(e);
            return st;
        }
    }
    *out = e;
    return DT_OK;
}

void dt_event_free(dt_event *e) {
    if (!e)
        return;
    if (e->h)
        plugin->event_free(e->d->index, e->h);
    dt_free(e);
}

// Both handles on one device (an event of one device cannot mark another's stream).
static dt_status same_device(const char *what, const dt_event *e, const dt_stream *s) {
    if (!e || !s)
        return dt_fail(DT_ERR_ARG, "%s: expected an event and a stream, found NULL", what);
    if (e->d != s->d)
        return dt_fail(DT_ERR_ARG, "%s: the event is on %s, the stream on %s", what, e->d->name,
                       s->d->name);
    return DT_OK;
}

dt_status dt_event_record(dt_event *e, dt_stream *s) {
    DT_TRY(same_device("dt_event_record", e, s));
    return e->h ? plugin->event_record(e->d->index, e->h, s->h) : DT_OK;
}

dt_status dt_stream_wait_event(dt_stream *s, dt_event *e) {
    DT_TRY(same_device("dt_stream_wait_event", e, s));
    return e->h ? plugin->stream_wait(e->d->index, s->h, e->h) : DT_OK;
}

dt_status dt_event_sync(dt_event *e) {
    return e && e->h ? plugin->event_sync(e->d->index, e->h) : DT_OK;
}

dt_status dt_event_elapsed(dt_event *start, dt_event *end, float *ms) {
    *ms = 0.0f;
    if (!start || !end || start->d != end->d)
        return dt_fail(DT_ERR_ARG, "dt_event_elapsed: expected two events of one device");
    return start->h ? plugin->event_elapsed(start->d->index, start->h, end->h, ms) : DT_OK;
}
