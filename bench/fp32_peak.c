// fp32_peak.c: this machine's fp32 FMA peak, the ceiling bench/resnet_bench.sh holds the
// ResNet's layers against. Each thread runs a loop of 24 independent 512-bit
// VFMADD231PS chains (24 > the FMA latency x units, so the units never wait), 2^24
// instructions per run, best of 15 runs by the thread's CPU time (time descheduled does
// not count); 32 FLOP per instruction. Without AVX-512 (AMD Zen 2/3, Intel before Ice
// Lake) the same loop on 256-bit registers (12 chains: 16 ymm registers), 16 FLOP per
// instruction. With N threads, each runs its own loop at once and the sum of their
// rates is printed.
//
//   cc -O2 -pthread bench/fp32_peak.c -o build/bench/fp32_peak && build/bench/fp32_peak [N]
#define _GNU_SOURCE
#include <immintrin.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define NACC  24
#define ITERS ((1L << 24) / NACC)

static double cpu_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

__attribute__((target("avx512f,fma"), noinline)) static float chains(long iters) {
    __m512 acc[NACC];
    for (int i = 0; i < NACC; i++)
        acc[i] = _mm512_set1_ps((float)i);
    __m512 a = _mm512_set1_ps(1.0f), b = _mm512_set1_ps(1e-30f);
    for (long it = 0; it < iters; it++) {
#pragma GCC unroll 24
        for (int i = 0; i < NACC; i++)
            acc[i] = _mm512_fmadd_ps(a, b, acc[i]);
        __asm__ volatile("" : "+v"(a));
    }
    __m512 s = acc[0];
    for (int i = 1; i < NACC; i++)
        s = _mm512_add_ps(s, acc[i]);
    return _mm512_reduce_add_ps(s);
}

#define NACC2  12
#define ITERS2 ((1L << 24) / NACC2)

__attribute__((target("avx2,fma"), noinline)) static float chains2(long iters) {
    __m256 acc[NACC2];
    for (int i = 0; i < NACC2; i++)
        acc[i] = _mm256_set1_ps((float)i);
    __m256 a = _mm256_set1_ps(1.0f), b = _mm256_set1_ps(1e-30f);
    for (long it = 0; it < iters; it++) {
#pragma GCC unroll 12
        for (int i = 0; i < NACC2; i++)
            acc[i] = _mm256_fmadd_ps(a, b, acc[i]);
        __asm__ volatile("" : "+x"(a));
    }
    __m256 s = acc[0];
    for (int i = 1; i < NACC2; i++)
        s = _mm256_add_ps(s, acc[i]);
    float v[8];
    _mm256_storeu_ps(v, s);
    return v[0] + v[1] + v[2] + v[3] + v[4] + v[5] + v[6] + v[7];
}

static int wide; // 1: AVX-512, 0: AVX2

static void *run(void *arg) {
    double *gflops = arg, best = 1e30;
    for (int r = 0; r < 15; r++) {
        double         t0   = cpu_now();
        volatile float sink = wide ? chains(ITERS) : chains2(ITERS2);
        (void)sink;
        double t = cpu_now() - t0;
        best     = t < best ? t : best;
    }
    *gflops = (wide ? 32.0 * (double)ITERS * NACC : 16.0 * (double)ITERS2 * NACC2) / best * 1e-9;
    return NULL;
}

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 1;
    if (n < 1 || n > 64) {
        fprintf(stderr, "fp32_peak: expected 1 to 64 threads, found %s\n", argv[1]);
        return 2;
    }
    wide = __builtin_cpu_supports("avx512f");
    if (!wide && !(__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))) {
        printf("fp32_peak: neither AVX-512 nor AVX2 + FMA on this CPU\n");
        return 0;
    }
    pthread_t th[64];
    double    g[64], sum = 0;
    for (int i = 0; i < n; i++)
        pthread_create(&th[i], NULL, run, &g[i]);
    for (int i = 0; i < n; i++) {
        pthread_join(th[i], NULL);
        sum += g[i];
    }
    printf("fp32 FMA peak: %.1f GFLOP/s on %d thread(s) (%.1f per thread, %s)\n", sum, n, sum / n,
           wide ? "AVX-512" : "AVX2");
    return 0;
}
