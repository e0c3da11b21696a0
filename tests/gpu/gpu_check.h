// gpu_check.h: what the GPU tests share: the device (or "no GPU" and a clean exit),
// fresh random inputs, and comparison against the CPU's result with a written bound.
//
// The bound. A sum of L products computed in float in any order is within
// gamma_L = L 2^-24 (to first order) of the exact sum, relative to the sum of the
// products' magnitudes S; two orders (the CPU's and the GPU's) are within twice that of
// each other. S is not known from the outputs; it is taken as the largest |value| M of
// the reference tensor (an element's terms are of its size where they do not cancel,
// and where they cancel strongly the bound is loose, never tight), so per element
//     tol = SAFETY * 2^-24 * (L * M + ULPS * |cpu_i|)
// with L the longest reduction that forms an element (a convolution's cin kh kw, a
// weight gradient's batch x pixels, a norm's row), M the tensor's largest |cpu| value,
// and ULPS the error of the transcendental functions on each side (CUDA's expf, erff and
// tanhf are within 2 ulps, the CPU's vector exp within 2: 8 in all). SAFETY 4 covers
// the few roundings around each sum (bias adds, scales). Each comparison prints its
// largest error against its bound, so a run shows the margins.
#ifndef DTRAIN_TESTS_GPU_CHECK_H
#define DTRAIN_TESTS_GPU_CHECK_H

#include "../check.h"
#include "dtrain/device.h"
#include "dtrain/exec.h"
#include "dtrain/nn.h"

#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#define GPU_SAFETY 4.0
#define GPU_ULPS   8.0

// A test binary's argument, when given, runs only the tests whose name contains it
// (compute-sanitizer runs a few: tools/gpu/check.sh).
static const char *gpu_filter __attribute__((unused));
#define GPU_RUN(fn)                                                                                \
    do {                                                                                           \
        if (!gpu_filter || strstr(#fn, gpu_filter))                                                \
            RUN(fn);                                                                               \
    } while (0)

// The GPU, or NULL after printing why there is none (the test then passes empty).
static inline dt_device *gpu_device(void) {
    dt_device *d;
    if (dt_device_get(&d, "cuda:0") != DT_OK) {
        printf("no GPU: %s\n", dt_last_error());
        return NULL;
    }
    char buf[256];
    printf("# %s\n", dt_device_describe(d, buf, sizeof buf));
    return d;
}

// The GPUs, counted in a child process: a test whose ranks are forked children must not
// start CUDA itself (a process that forks after CUDA started hands its children a dead
// one). 0, after the child printed why, where there is none.
static inline int gpu_count_forked(void) {
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        int n = 0;
        if (dt_device_cuda_count(&n) != DT_OK)
            printf("no GPU: %s\n", dt_last_error());
        fflush(NULL);
        _exit(n > 100 ? 100 : n);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 0;
}

// Uniform values in [lo, hi) from a seeded stream (fresh per test, printed on failure).
static inline void gpu_fill(float *x, size_t n, uint64_t seed, float lo, float hi) {
    dt_rng r = dt_rng_init(seed);
    for (size_t i = 0; i < n; i++)
        x[i] = dt_rng_uniform_range(&r, lo, hi);
}

static inline void gpu_fill_int(int32_t *x, size_t n, uint64_t seed, int below) {
    dt_rng r = dt_rng_init(seed);
    for (size_t i = 0; i < n; i++)
        x[i] = (int32_t)dt_rng_below(&r, (uint64_t)below);
}

// Compares got with the CPU's ref (n values) under the bound above; prints the largest
// error against its bound. L: the longest reduction forming an element. rel: a further
// allowance, relative to M (bf16 cases: the CPU rounds some operands the GPU keeps).
static inline bool gpu_close_impl(const char *what, const float *got, const float *ref, size_t n,
                                  double L, double rel, const char *file, int line) {
    double m = 0;
    for (size_t i = 0; i < n; i++)
        m = fabs(ref[i]) > m ? fabs(ref[i]) : m;
    double worst = 0, worst_err = 0, worst_tol = 0;
    size_t at  = 0;
    bool   nan = false;
    for (size_t i = 0; i < n; i++) {
        double tol = GPU_SAFETY * 0x1p-24 * (L * m + GPU_ULPS * fabs(ref[i])) + rel * m + 1e-30;
        double err = fabs((double)got[i] - ref[i]);
        if (isnan(got[i]) != isnan(ref[i]))
            nan = true;
        if (err / tol > worst)
            worst = err / tol, worst_err = err, worst_tol = tol, at = i;
    }
    bool ok = worst <= 1.0 && !nan;
    printf("#   %-34s n %-8zu max|cpu| %-10.3g err %-10.3g bound %-10.3g (%.2f of it)%s\n", what, n,
           m, worst_err, worst_tol, worst, nan ? " NaN!" : "");
    if (!check_report(ok, what, file, line))
        fprintf(stderr, "     at %zu: gpu %.9g, cpu %.9g\n", at, (double)got[at], (double)ref[at]);
    return ok;
}
#define GPU_CLOSE(what, got, ref, n, L, rel)                                                       \
    gpu_close_impl((what), (got), (ref), (n), (L), (rel), __FILE__, __LINE__)

// Bitwise equality (the same kernels twice: a CUDA graph's replay against direct runs).
static inline bool gpu_same_impl(const char *what, const float *a, const float *b, size_t n,
                                 const char *file, int line) {
    size_t diff = 0, first = n;
    for (size_t i = 0; i < n; i++)
        if (memcmp(&a[i], &b[i], sizeof(float)) != 0 && diff++ == 0)
            first = i;
    bool ok = diff == 0;
    if (!check_report(ok, what, file, line))
        fprintf(stderr, "     %zu of %zu differ, first at %zu: %.9g vs %.9g\n", diff, n, first,
                (double)a[first], (double)b[first]);
    return ok;
}
#define GPU_SAME(what, a, b, n) gpu_same_impl((what), (a), (b), (n), __FILE__, __LINE__)

// A copy of a graph's parameters (or buffers), to restore the starting point.
static inline float *gpu_dup(const float *p, size_t n) {
    float *c = malloc(sizeof(float) * (n ? n : 1));
    if (c && n)
        memcpy(c, p, sizeof(float) * n);
    return c;
}

#endif // DTRAIN_TESTS_GPU_CHECK_H
