// gemm16.c: the bf16 GEMM (src/nn/gemm16.c) against this core's VDPBF16PS peak and
// against OpenBLAS sgemm, one thread, on the GEMM shapes of the GPT and the ConvNet.
//
//   make lib && cc -O2 -std=c11 -D_GNU_SOURCE -Iinclude -Isrc bench/gemm16.c
//       build/release/lib/libdtrain.a -lopenblas -lm -lpthread -o build/bench/gemm16
//   build/bench/gemm16 [--reps 7] [--wall]  (bench/gemm16.sh does both)
//
// Peaks: a loop of 24 independent VDPBF16PS (bf16: 64 FLOP each: 16 lanes x 2 pairs x
// multiply + add) and of 24 independent VFMADD231PS (fp32: 32 FLOP), each timed as the
// best of 15 runs of 2^24 instructions. GEMMs: median of --reps timings, each a loop of
// calls lasting >= 50 ms; GFLOP/s = 2 M N K / time. Shapes are M x K x N with the
// transposes a layer uses: forward x W^T is NT, the input gradient dY W is NN, the
// weight gradient dY^T X is TN.
#include "dtrain/nn.h"
#include "nn/blas.h"
#include "nn/prec.h"

#include <immintrin.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

// This thread's CPU time: the two vCPUs are shared with other work, and time spent
// descheduled would otherwise count against the kernel (--wall for wall-clock time).
static clockid_t clock_id = CLOCK_THREAD_CPUTIME_ID;
static double    now(void) {
       struct timespec t;
       clock_gettime(clock_id, &t);
       return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

#define NACC 24
__attribute__((target("avx512f,avx512bw,avx512bf16"), noinline)) static float
peak_bf16(long iters) {
    __m512 acc[NACC];
    for (int i = 0; i < NACC; i++)
        acc[i] = _mm512_set1_ps((float)i);
    __m512i a = _mm512_set1_epi32(0x3f803f80), b = _mm512_set1_epi32(0x00010001);
    for (long it = 0; it < iters; it++) {
#pragma GCC unroll 24
        for (int i = 0; i < NACC; i++)
            acc[i] = _mm512_dpbf16_ps(acc[i], (__m512bh)a, (__m512bh)b);
        __asm__ volatile("" : "+v"(a));
    }
    __m512 s = acc[0];
    for (int i = 1; i < NACC; i++)
        s = _mm512_add_ps(s, acc[i]);
    return _mm512_reduce_add_ps(s);
}

__attribute__((target("avx512f,fma"), noinline)) static float peak_fp32(long iters) {
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

static int cmp_d(const void *x, const void *y) {
    double a = *(const double *)x, b = *(const double *)y;
    return a < b ? -1 : a > b;
}

typedef struct shape {
    const char *name;
    int         m, k, n;
    bool        ta, tb;
} shape;

// One timing: calls of fn over >= 50 ms; returns seconds per call.
typedef void (*gemm_fn)(const shape *s, void *a, void *b, float *c);

static dt_prec_path bench_path;
static void         call_bf16(const shape *s, void *a, void *b, float *c) {
            int lda = s->ta ? s->m : s->k, ldb = s->tb ? s->k : s->n;
            if (dt_gemm_bf16_path(bench_path, s->ta, s->tb, s->m, s->n, s->k, a, lda, b, ldb, c, s->n,
                                  false) != DT_OK)
        abort();
}
static void call_f32in(const shape *s, void *a, void *b, float *c) {
    int lda = s->ta ? s->m : s->k, ldb = s->tb ? s->k : s->n;
    if (dt_gemm_bf16_mixed(bench_path, s->ta, s->tb, s->m, s->n, s->k, a, lda, true, b, ldb, true,
                           c, s->n, false) != DT_OK)
        abort();
}
static void call_sgemm(const shape *s, void *a, void *b, float *c) {
    int lda = s->ta ? s->m : s->k, ldb = s->tb ? s->k : s->n;
    dt_sgemm(s->ta, s->tb, s->m, s->n, s->k, 1.0f, a, lda, b, ldb, 0.0f, c, s->n);
}

static double time_one(gemm_fn fn, const shape *s, void *a, void *b, float *c) {
    fn(s, a, b, c); // warm
    int    calls = 0;
    double t0    = now(), t;
    do {
        fn(s, a, b, c);
        calls++;
    } while ((t = now() - t0) < 0.05);
    return t / calls;
}

int main(int argc, char **argv) {
    int reps = 7;
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], "--reps") == 0 && i + 1 < argc)
            reps = atoi(argv[++i]);
        else if (strcmp(argv[i], "--wall") == 0)
            clock_id = CLOCK_MONOTONIC;
    if (reps < 1 || reps > 101)
        reps = 7;
    dt_blas_init();
    bool   has_bf16 = dt_prec_path_supported(DT_PATH_AVX512BF16);
    double pk_bf = 0, pk_32 = 0;
    long   iters = 1L << 24 / 1; // instructions per accumulator chain
    iters /= NACC;
    for (int r = 0; r < 15; r++) {
        double         t0   = now();
        volatile float sink = peak_fp32(iters);
        (void)sink;
        double g = 32.0 * NACC * (double)iters / (now() - t0) / 1e9;
        pk_32    = g > pk_32 ? g : pk_32;
        if (has_bf16) {
            t0                = now();
            volatile float s2 = peak_bf16(iters);
            (void)s2;
            g     = 64.0 * NACC * (double)iters / (now() - t0) / 1e9;
            pk_bf = g > pk_bf ? g : pk_bf;
        }
    }
    printf("# peak, one core: fp32 FMA %.1f GFLOP/s, bf16 VDPBF16PS %.1f GFLOP/s (%.2fx)\n", pk_32,
           pk_bf, pk_bf / pk_32);
    printf("# times: %s\n", clock_id == CLOCK_MONOTONIC ? "wall clock" : "thread CPU time");
    printf("# GEMMs: one thread, median of %d; bf16 path %s; sgemm: %s\n", reps,
           has_bf16 ? "avx512bf16" : "(absent)", dt_blas_info());
    static const shape shapes[] = {
        {"gpt qkv fwd", 4096, 128, 384, false, true},
        {"gpt qkv dX", 4096, 384, 128, false, false},
        {"gpt qkv dW", 384, 4096, 128, true, false},
        {"gpt mlp-up fwd", 4096, 128, 512, false, true},
        {"gpt mlp-up dX", 4096, 512, 128, false, false},
        {"gpt mlp-up dW", 512, 4096, 128, true, false},
        {"gpt mlp-down fwd", 4096, 512, 128, false, true},
        {"gpt mlp-down dX", 4096, 128, 512, false, false},
        {"gpt mlp-down dW", 128, 4096, 512, true, false},
        {"convnet conv1/sample", 16, 9, 676, false, false},
        {"convnet conv2/sample", 32, 144, 576, false, false},
        {"convnet conv2 dW/sample", 32, 576, 144, false, true},
        {"convnet fc1 fwd b128", 128, 4608, 64, false, true},
        {"convnet fc1 dX b128", 128, 64, 4608, false, false},
        {"convnet fc1 dW b128", 64, 128, 4608, true, false},
    };
    printf("%-24s %5s %5s %5s %2s %9s %9s %8s %9s %9s\n", "shape", "M", "K", "N", "op", "bf16_GF",
           "of_peak", "fp32path", "sgemm_GF", "bf16/sgemm");
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        const shape *s  = &shapes[i];
        size_t       na = (size_t)s->m * s->k, nb = (size_t)s->k * s->n;
        float    *fa = malloc(4 * na), *fb = malloc(4 * nb), *c = malloc(4 * (size_t)s->m * s->n);
        uint16_t *ha = malloc(2 * na), *hb = malloc(2 * nb);
        for (size_t j = 0; j < na; j++)
            fa[j] = (float)((j * 2654435761u) % 1000) / 1000.0f - 0.5f;
        for (size_t j = 0; j < nb; j++)
            fb[j] = (float)((j * 40503u) % 997) / 997.0f - 0.5f;
        dt_f32_to_bf16(fa, ha, na);
        dt_f32_to_bf16(fb, hb, nb);
        double tb[101], tf[101], ts[101], ti[101];
        for (int r = 0; r < reps; r++) { // interleaved
            bench_path = has_bf16 ? DT_PATH_AVX512BF16 : DT_PATH_FP32;
            tb[r]      = time_one(call_bf16, s, ha, hb, c);
            ti[r]      = time_one(call_f32in, s, fa, fb, c);
            bench_path = DT_PATH_FP32;
            tf[r]      = time_one(call_bf16, s, ha, hb, c);
            ts[r]      = time_one(call_sgemm, s, fa, fb, c);
        }
        qsort(tb, (size_t)reps, sizeof(double), cmp_d);
        qsort(tf, (size_t)reps, sizeof(double), cmp_d);
        qsort(ts, (size_t)reps, sizeof(double), cmp_d);
        qsort(ti, (size_t)reps, sizeof(double), cmp_d);
        double flop = 2.0 * s->m * s->n * s->k, gb = flop / tb[reps / 2] / 1e9,
               gf = flop / tf[reps / 2] / 1e9, gs = flop / ts[reps / 2] / 1e9,
               gi = flop / ti[reps / 2] / 1e9;
        printf("%-24s %5d %5d %5d %c%c %9.1f %7.0f%% %9.1f %8.1f %9.1f %9.2fx\n", s->name, s->m,
               s->k, s->n, s->ta ? 'T' : 'N', s->tb ? 'T' : 'N', gb,
               pk_bf > 0 ? 100 * gb / pk_bf : 0, gi, gf, gs, gb / gs);
        free(fa), free(fb), free(c), free(ha), free(hb);
    }
    return 0;
}
