// test_device: the device API on the CPU device (device.h), parameters bound to a
// device (params.h), the executor on the CPU (exec.h: the graph's own path, so a
// program written for a GPU trains anywhere), and what asking for CUDA says where it
// cannot be had: a build without the plugin, a plugin that does not load (the loader's
// message), a machine without a GPU. Each CUDA case runs in a child process of its own:
// the plugin is looked for once per process.
#include "../check.h"
#include "dtrain/device.h"
#include "dtrain/exec.h"
#include "dtrain/nn.h"

#include <limits.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

static void test_cpu_device(void) {
    dt_device *d;
    CHECK_OK(dt_device_get(&d, "cpu"));
    CHECK(strcmp(dt_device_name(d), "cpu") == 0);
    CHECK_EQ(dt_device_type(d), DT_DEVICE_CPU);
    CHECK(!dt_device_is_cuda(d));
    char buf[64];
    CHECK(strcmp(dt_device_describe(d, buf, sizeof buf), "cpu") == 0);
    float *a, *b, *pin;
    CHECK_OK(dt_device_alloc(d, 64 * sizeof(float), (void **)&a));
    CHECK_OK(dt_device_alloc(d, 64 * sizeof(float), (void **)&b));
    CHECK_OK(dt_device_alloc_host(d, 64 * sizeof(float), (void **)&pin));
    for (int i = 0; i < 64; i++)
        pin[i] = (float)i;
    dt_stream *s;
    dt_event  *e0, *e1;
    CHECK_OK(dt_stream_new(d, &s));
    CHECK(dt_stream_device(s) == d);
    CHECK_OK(dt_event_new(d, &e0));
    CHECK_OK(dt_event_new(d, &e1));
    CHECK_OK(dt_event_record(e0, s));
    CHECK_OK(dt_device_copy(d, a, pin, 64 * sizeof(float), s));
    CHECK_OK(dt_device_memset(d, b, 0, 64 * sizeof(float), NULL));
    CHECK_OK(dt_device_copy(d, b + 1, a, 8 * sizeof(float), NULL));
    CHECK_OK(dt_event_record(e1, s));
    CHECK_OK(dt_stream_wait_event(s, e1));
    CHECK_OK(dt_stream_sync(s));
    CHECK_OK(dt_event_sync(e1));
    float ms = -1;
    CHECK_OK(dt_event_elapsed(e0, e1, &ms));
    CHECK(ms == 0.0f);
    CHECK(b[0] == 0.0f && b[1] == 0.0f && b[8] == 7.0f && b[9] == 0.0f && a[63] == 63.0f);
    CHECK_OK(dt_device_sync(d));
    CHECK_EQ(dt_device_mem_held(d), 0);
    dt_event_free(e0), dt_event_free(e1), dt_stream_free(s);
    dt_device_free(d, a), dt_device_free(d, b), dt_device_free_host(d, pin);
}

static void test_bad_names(void) {
    dt_device *d;
    CHECK_ERR(dt_device_get(&d, "gpu"), DT_ERR_ARG, "expected a device \"cpu\", \"cuda\"");
    CHECK_ERR(dt_device_get(&d, "cuda:x"), DT_ERR_ARG, "found \"cuda:x\"");
    CHECK_ERR(dt_device_get(&d, "cuda:64"), DT_ERR_ARG, "found \"cuda:64\"");
    CHECK_ERR(dt_device_get(&d, "cudax"), DT_ERR_ARG, "cudax");
    CHECK(d == NULL);
}

// Parameters bound to a device's storage (here the CPU device, the same code path):
// no host view, the device pointers, copies to and from a host table.
static void test_params_on_device(void) {
    dt_params *h, *p;
    int64_t    shape[1] = {5}, bshape[1] = {2};
    CHECK_OK(dt_params_new(&h, NULL));
    CHECK_OK(dt_params_new(&p, NULL));
    CHECK_OK(dt_params_add(h, "w", 1, shape, 0));
    CHECK_OK(dt_params_add_buffer(h, "m", 1, bshape, 0));
    CHECK_OK(dt_params_add(p, "w", 1, shape, 0));
    CHECK_OK(dt_params_add_buffer(p, "m", 1, bshape, 0));
    CHECK_OK(dt_params_alloc(h));
    dt_device *d;
    CHECK_OK(dt_device_get(&d, "cpu"));
    float dp[5] = {0}, dg[5] = {1, 1, 1, 1, 1}, db[2] = {0};
    CHECK_ERR(dt_params_bind_device(p, NULL, dp, dg, db), DT_ERR_ARG, "expected a device");
    CHECK_OK(dt_params_bind_device(p, d, dp, dg, db));
    CHECK(dt_params_device(p) == d && dt_params_device(h) == NULL);
    CHECK(dt_params_data(p) == NULL);
    CHECK(strstr(dt_last_error(), "live on cpu") != NULL);
    CHECK(dt_params_grads(p) == NULL);
    CHECK(dt_params_device_data(p) == dp && dt_params_device_grads(p) == dg);
    CHECK(dt_params_device_data(h) == dt_params_data(h));
    for (int i = 0; i < 5; i++)
        dt_params_data(h)[i] = (float)(i + 1);
    dt_params_buffers(h)[1] = 7.0f;
    CHECK_OK(dt_params_from_host(p, h));
    CHECK(dp[4] == 5.0f && db[1] == 7.0f);
    dp[0] = 9.0f;
    CHECK_OK(dt_params_to_host(p, h));
    CHECK(dt_params_data(h)[0] == 9.0f);
    dt_params_zero_grad(p);
    CHECK(dg[0] == 0.0f && dg[4] == 0.0f);
    CHECK_ERR(dt_params_discard(p, true, 0, 1), DT_ERR_UNSUPPORTED, "host storage only");
    CHECK_ERR(dt_params_to_host(h, p), DT_ERR_ARG, "the destination is on cpu");
    dt_params *q;
    CHECK_OK(dt_params_new(&q, NULL));
    CHECK_OK(dt_params_add(q, "w", 1, bshape, 0));
    CHECK_OK(dt_params_alloc(q));
    CHECK_ERR(dt_params_to_host(p, q), DT_ERR_MISMATCH, "one layout");
    dt_params_free(q), dt_params_free(p), dt_params_free(h);
}

// The executor on the CPU trains exactly as the model's own loop (the same calls).
static dt_model *convnet(void) {
    dt_model *m;
    if (dt_model_new(&m, 1, 8, 8) || dt_model_add_conv2d(m, 4, 3, 1, 0) || dt_model_add_relu(m) ||
        dt_model_add_maxpool2d(m, 2, 0) || dt_model_add_dropout2d(m, 0.2f) ||
        dt_model_add_flatten(m) || dt_model_add_linear(m, 5) || dt_model_add_log_softmax(m) ||
        dt_model_finalize(m, 11))
        return NULL;
    return m;
}

static void test_exec_cpu(void) {
    dt_model *a = convnet(), *b = convnet();
    CHECK(a && b);
    if (!a || !b)
        return;
    enum { N = 6 };
    float   x[N * 64];
    int32_t y[N];
    for (int i = 0; i < N * 64; i++)
        x[i] = (float)((i * 37) % 11) / 11.0f - 0.5f;
    for (int i = 0; i < N; i++)
        y[i] = i % 5;
    uint64_t   keys[N] = {3, 1, 4, 1, 5, 9};
    dt_rng     rng     = dt_rng_init(42);
    dt_device *d;
    CHECK_OK(dt_device_get(&d, "cpu"));
    dt_exec *x1;
    CHECK_OK(dt_exec_new(&x1, dt_model_graph(a), d, NULL));
    CHECK(dt_exec_device(x1) == d && dt_exec_graph(x1) == dt_model_graph(a));
    CHECK(dt_exec_params(x1) == dt_model_as_params(a));
    dt_adadelta_opts ao = dt_adadelta_opts_default();
    dt_optim        *o1, *o2;
    CHECK_OK(dt_adadelta_new(&o1, dt_model_as_params(a), &ao));
    CHECK_OK(dt_adadelta_new(&o2, dt_model_as_params(b), &ao));
    dt_loss_spec ls = dt_loss_spec_default(DT_LOSS_NLL);
    float        dl[N * 5];
    for (int step = 0; step < 3; step++) {
        float l1, l2;
        dt_exec_set_rng(x1, &rng);
        CHECK_OK(dt_exec_set_sample_keys(x1, keys, N));
        CHECK_OK(dt_exec_zero_grad(x1));
        CHECK_OK(dt_exec_train_step(x1, (const void *[]){x}, y, N, &ls, &l1));
        CHECK_OK(dt_exec_optim_step(x1, o1));
        dt_model_set_rng(b, &rng);
        CHECK_OK(dt_model_set_sample_keys(b, keys, N));
        dt_model_zero_grad(b);
        CHECK_OK(dt_model_forward(b, x, N));
        CHECK_OK(dt_loss_nll(dt_model_output(b), y, N, 5, &l2, dl));
        CHECK_OK(dt_model_backward(b, dl));
        dt_optim_step(o2);
        CHECK(l1 == l2);
    }
    CHECK(memcmp(dt_model_params(a), dt_model_params(b), sizeof(float) * dt_model_num_params(a)) ==
          0);
    float norm_a, norm_b;
    CHECK_OK(dt_exec_grad_norm(x1, &norm_a));
    CHECK_OK(dt_grad_norm(dt_model_as_params(b), &norm_b));
    CHECK(norm_a == norm_b);
    float out[N * 5];
    CHECK_OK(dt_exec_forward(x1, (const void *[]){x}, N));
    CHECK_OK(dt_exec_output(x1, out, N * 5));
    CHECK_ERR(dt_exec_output(x1, out, N * 5 + 1), DT_ERR_ARG, "the last forward has 30");
    int32_t bad[N] = {0, 1, 2, 3, 4, 5};
    CHECK_ERR(dt_exec_loss(x1, &ls, bad, NULL), DT_ERR_ARG, "target of row 5 is 5");
    CHECK_OK(dt_exec_pull(x1, DT_EXEC_PARAMS | DT_EXEC_OPTIM, o1)); // one storage: no-ops
    CHECK_OK(dt_exec_sync(x1));
    dt_exec_stats st;
    dt_exec_get_stats(x1, &st);
    CHECK_EQ(st.steps, 3);
    CHECK_EQ(st.graph_replays, 0);
    dt_exec_free(x1);
    dt_optim_free(o1), dt_optim_free(o2);
    dt_model_free(a), dt_model_free(b);
}

// ------------------------------------------------------------------------ CUDA asks

// Runs fn in a child with DT_CUDA_PLUGIN set to `plugin` (NULL: unset); its exit code.
static int in_child(const char *plugin, int (*fn)(void)) {
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        if (plugin)
            setenv("DT_CUDA_PLUGIN", plugin, 1);
        else
            unsetenv("DT_CUDA_PLUGIN");
        _exit(fn());
    }
    int status = 0;
    waitpid(pid, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 100;
}

// 0: failed with DT_ERR_UNSUPPORTED and a message containing the child's expectation.
static const char *expect;
static int         ask_cuda(void) {
            dt_device *d;
            int        n  = -1;
            dt_status  st = dt_device_get(&d, "cuda");
            if (st != DT_ERR_UNSUPPORTED || !strstr(dt_last_error(), expect)) {
                fprintf(stderr, "     cuda: %s: \"%s\" (expected \"%s\")\n", dt_status_str(st),
                        dt_last_error(), expect);
                return 1;
    }
            return dt_device_cuda_count(&n) == DT_ERR_UNSUPPORTED && n == 0 ? 0 : 2;
}

static void test_cuda_missing(void) {
    // No plugin anywhere this program looks (tests/unit is no place for one).
    expect = "this dtrain was built without CUDA (make CUDA=1 on a machine with nvcc)";
    CHECK_EQ(in_child(NULL, ask_cuda), 0);
    // A plugin path that does not exist: the loader's message names it.
    expect = "/nonexistent/libdtrain_cuda.so";
    CHECK_EQ(in_child("/nonexistent/libdtrain_cuda.so", ask_cuda), 0);
    // A file that is no shared library: the loader's message says why.
    char path[] = "/tmp/dtrain-test-plugin-XXXXXX";
    int  fd     = mkstemp(path);
    CHECK(fd >= 0 && write(fd, "not a library\n", 14) == 14);
    close(fd);
    expect = path;
    CHECK_EQ(in_child(path, ask_cuda), 0);
    unlink(path);
}

// The real plugin, when this build made one (../../lib beside this test): without a
// GPU the answer names cudaGetDeviceCount's error; with one, devices are there.
static int ask_real_plugin(void) {
    dt_device *d;
    dt_status  st = dt_device_get(&d, "cuda:0");
    if (st == DT_OK)
        return dt_device_is_cuda(d) && strcmp(dt_device_name(d), "cuda:0") == 0 ? 0 : 3;
    if (st != DT_ERR_UNSUPPORTED ||
        !strstr(dt_last_error(), "no CUDA GPU found (cudaGetDeviceCount: ")) {
        fprintf(stderr, "     cuda:0: %s: \"%s\"\n", dt_status_str(st), dt_last_error());
        return 1;
    }
    printf("(no GPU here: \"%s\")\n", dt_last_error());
    return 0;
}

static void test_real_plugin(void) {
    char    exe[PATH_MAX], plugin[PATH_MAX + 64];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0)
        return;
    exe[n]             = 0;
    *strrchr(exe, '/') = 0;
    snprintf(plugin, sizeof plugin, "%s/../../lib/libdtrain_cuda.so", exe);
    if (access(plugin, F_OK) != 0) {
        printf("(no CUDA plugin in this build: skipped)\n");
        return;
    }
    CHECK_EQ(in_child(plugin, ask_real_plugin), 0);
}

int main(void) {
    RUN(test_cpu_device);
    RUN(test_bad_names);
    RUN(test_params_on_device);
    RUN(test_exec_cpu);
    RUN(test_cuda_missing);
    RUN(test_real_plugin);
    return check_summary();
}
