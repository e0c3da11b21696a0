// test_device (GPU): the device API on a CUDA device: memory and the caching
// allocator, copies both ways and on the device, pinned memory on a stream, memset,
// events and timing. `--probe` only says whether a GPU is there (make test-gpu asks first).
#include "gpu_check.h"

static dt_device *dev;

static void test_memory(void) {
    enum { N = 1 << 20 };
    float *h = malloc(sizeof(float) * N), *back = malloc(sizeof(float) * N), *pin;
    float *a, *b;
    CHECK_OK(dt_device_alloc(dev, sizeof(float) * N, (void **)&a));
    CHECK_OK(dt_device_alloc(dev, sizeof(float) * N, (void **)&b));
    CHECK_OK(dt_device_alloc_host(dev, sizeof(float) * N, (void **)&pin));
    gpu_fill(h, N, 1, -1, 1);
    CHECK_OK(dt_device_copy(dev, a, h, sizeof(float) * N, NULL));    // host -> device
    CHECK_OK(dt_device_copy(dev, b, a, sizeof(float) * N, NULL));    // device -> device
    CHECK_OK(dt_device_memset(dev, a, 0, sizeof(float) * N, NULL));  // zeroes
    CHECK_OK(dt_device_copy(dev, back, b, sizeof(float) * N, NULL)); // device -> host
    CHECK(memcmp(back, h, sizeof(float) * N) == 0);
    CHECK_OK(dt_device_copy(dev, back, a, sizeof(float) * 16, NULL));
    CHECK(back[0] == 0.0f && back[15] == 0.0f);
    // pinned memory on a stream, timed by two events
    dt_stream *s;
    dt_event  *e0, *e1;
    CHECK_OK(dt_stream_new(dev, &s));
    CHECK_OK(dt_event_new(dev, &e0));
    CHECK_OK(dt_event_new(dev, &e1));
    memcpy(pin, h, sizeof(float) * N);
    CHECK_OK(dt_event_record(e0, s));
    CHECK_OK(dt_device_copy(dev, a, pin, sizeof(float) * N, s));
    CHECK_OK(dt_stream_sync(s));
    memset(pin, 0, sizeof(float) * N);
    CHECK_OK(dt_device_copy(dev, pin, a, sizeof(float) * N, s));
    CHECK_OK(dt_event_record(e1, s));
    CHECK_OK(dt_event_sync(e1));
    float ms = -1;
    CHECK_OK(dt_event_elapsed(e0, e1, &ms));
    printf("# 8 MiB to the GPU and back through pinned memory: %.3f ms\n", (double)ms);
    CHECK(ms >= 0.0f);
    CHECK(memcmp(pin, h, sizeof(float) * N) == 0);
    // the cache: a freed block comes back for the next request of its class
    size_t held = dt_device_mem_held(dev);
    CHECK(held >= 2 * sizeof(float) * N);
    dt_device_free(dev, b);
    float *c;
    CHECK_OK(dt_device_alloc(dev, sizeof(float) * N - 100, (void **)&c));
    CHECK(c == b);
    CHECK_EQ(dt_device_mem_held(dev), held);
    dt_device_free(dev, c), dt_device_free(dev, a), dt_device_free_host(dev, pin);
    dt_event_free(e0), dt_event_free(e1), dt_stream_free(s);
    CHECK_OK(dt_device_sync(dev));
    free(h), free(back);
}

// Another device's index is refused with the count.
static void test_names(void) {
    int n = 0;
    CHECK_OK(dt_device_cuda_count(&n));
    CHECK(n >= 1);
    dt_device *d;
    char       name[16];
    snprintf(name, sizeof name, "cuda:%d", n);
    if (n < 64)
        CHECK_ERR(dt_device_get(&d, name), DT_ERR_ARG, "CUDA device(s)");
    CHECK_OK(dt_device_get(&d, "cuda"));
    CHECK(d == dev);
}

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "--probe") == 0) {
        dt_device *d;
        if (dt_device_get(&d, "cuda:0") != DT_OK) {
            printf("%s\n", dt_last_error());
            return 1;
        }
        return 0;
    }
    if (!(dev = gpu_device()))
        return check_summary();
    GPU_RUN(test_memory);
    GPU_RUN(test_names);
    return check_summary();
}
