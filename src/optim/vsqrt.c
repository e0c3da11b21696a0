// vsqrt.c: in-place square roots of a float array with vector instructions.
//
// Adam and Adadelta need two square roots per parameter. The library is built with
// -O2 and errno-setting math, under which GCC calls sqrtf one element at a time and
// vectorizes nothing around it; so the update loops leave their square roots in a
// small block and this file takes them with sqrtps, which is correctly rounded like
// the scalar instruction: every path gives bitwise the same result.
#include "optim_impl.h"

#include <math.h>

#if defined(__x86_64__)
#include <immintrin.h>

__attribute__((target("avx512f"))) static void sqrt_avx512(float *x, size_t n) {
    size_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(x + i, _mm512_sqrt_ps(_mm512_loadu_ps(x + i)));
    for (; i < n; i++)
        x[i] = sqrtf(x[i]);
}

__attribute__((target("avx"))) static void sqrt_avx(float *x, size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(x + i, _mm256_sqrt_ps(_mm256_loadu_ps(x + i)));
    for (; i < n; i++)
        x[i] = sqrtf(x[i]);
}

static void sqrt_sse(float *x, size_t n) { // SSE is part of baseline x86-64
    size_t i = 0;
    for (; i + 4 <= n; i += 4)
        _mm_storeu_ps(x + i, _mm_sqrt_ps(_mm_loadu_ps(x + i)));
    for (; i < n; i++)
        x[i] = sqrtf(x[i]);
}

void dt_optim_sqrt(float *x, size_t n) {
    // Resolved once; a benign race at worst stores the same pointer twice.
    static void (*_Atomic impl)(float *, size_t);
    void (*f)(float *, size_t) = impl;
    if (!f) {
        __builtin_cpu_init();
        f    = __builtin_cpu_supports("avx512f") ? sqrt_avx512
               : __builtin_cpu_supports("avx")   ? sqrt_avx
                                                 : sqrt_sse;
        impl = f;
    }
    f(x, n);
}
#else
void dt_optim_sqrt(float *x, size_t n) {
    for (size_t i = 0; i < n; i++)
        x[i] = sqrtf(x[i]);
}
#endif
