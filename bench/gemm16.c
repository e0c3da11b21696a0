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
// weight gradient dY^T X is TN. Then the convolution kernels without a column matrix
// on the seed ConvNet's second convolution (16 -> 32, 3x3 on 26x26), one sample: the
// bf16 ones (conv16.c) against the fp32 shifted GEMMs (shifted.c), kernel alone (packed
// operands) and with the repacking of that sample's operands; GFLOP/s over the useful
// 2 x 32 x 144 x 576 products (the wide layout computes 8% more).
#include "dtrain/nn.h"
#include "nn/blas.h"
#include "nn/conv16.h"
#include "nn/nn_impl.h"
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

// ---------------------------------------------------------------- convolution kernels
enum { CI = 16, CO = 32, HW = 26, KS = 3, WP = HW, PLANE = HW * HW, HO = HW - KS + 1 };
enum { NW = HO * WP - (KS - 1), KK = KS * KS, MARGIN = (KS - 1) * (WP + 1), LD = MARGIN + PLANE };
typedef struct conv_bufs {
    float    *x, *w, *wt, *g, *y, *dw, *dxp, *gw; // fp32: input, weights, wide gradient, ...
    uint16_t *w16, *xb;
    uint32_t *x2, *w2, *g2, *wt2, *gt;
    float    *dwt;
    int       of[CI * KK], ob[CO * KK], op[CI * KK], o2f[CI / 2 * KK], o2b[CO / 2 * KK];
} conv_bufs;
typedef void (*conv_fn)(conv_bufs *b);

static void c16_fwd(conv_bufs *b) {
    dt_c16_shifted(b->x2, b->o2f, CI / 2 * KK, b->w2, CO, NW, b->y, NW);
}
static void c16_fwd_pack(conv_bufs *b) {
    dt_c16_pack_pairs(b->x, CI, HW, HW, 0, b->x2);
    c16_fwd(b);
}
static void c16_dx(conv_bufs *b) {
    dt_c16_shifted(b->g2, b->o2b, CO / 2 * KK, b->wt2, CI, PLANE, b->dxp, PLANE);
}
static void c16_dx_pack(conv_bufs *b) {
    dt_c16_rows_to_pairs(b->g, NW, CO, NW, MARGIN, LD, b->g2);
    c16_dx(b);
}
static void c16_dw(conv_bufs *b) {
    dt_c16_shifted_tn(b->xb, b->op, CI * KK, NW, b->gt, CO, b->dwt);
}
static void c16_dw_pack(conv_bufs *b) {
    dt_c16_pack_plain(b->x, CI, HW, HW, 0, b->xb);
    dt_c16_rows_to_pair_cols(b->g, NW, CO, NW, b->gt, CO);
    c16_dw(b);
}
static void f32_fwd(conv_bufs *b) {
    dt_nn_shifted_gemm(b->x, b->of, CI * KK, b->w, CO, NW, b->y, NW, false);
}
static void f32_dx(conv_bufs *b) {
    dt_nn_shifted_gemm(b->gw, b->ob, CO * KK, b->wt, CI, PLANE, b->dxp, PLANE, false);
}
static void f32_dw(conv_bufs *b) {
    dt_nn_shifted_gemm_nt(b->g, NW, CO, b->x, b->of, CI * KK, NW, b->dw);
}

static double time_conv(conv_fn fn, conv_bufs *b) {
    fn(b);
    int    calls = 0;
    double t0    = now(), t;
    do {
        fn(b);
        calls++;
    } while ((t = now() - t0) < 0.05);
    return t / calls;
}

static void conv_kernels(int reps, double pk_bf) {
    if (!dt_c16_usable()) {
        printf("# conv kernels: no avx512bf16 path here, skipped\n");
        return;
    }
    conv_bufs b;
    b.x   = malloc(sizeof(float) * CI * PLANE);
    b.w   = malloc(sizeof(float) * CO * CI * KK);
    b.wt  = malloc(sizeof(float) * CO * CI * KK);
    b.g   = malloc(sizeof(float) * CO * NW);
    b.gw  = calloc((size_t)CO * LD, sizeof(float));
    b.y   = malloc(sizeof(float) * CO * NW);
    b.dw  = calloc((size_t)CO * CI * KK, sizeof(float));
    b.dxp = malloc(sizeof(float) * CI * PLANE);
    b.w16 = malloc(2 * CO * CI * KK);
    b.xb  = malloc(2 * CI * PLANE);
    b.gt  = malloc(4 * (NW + 1) / 2 * CO);
    b.dwt = calloc((size_t)CO * CI * KK, sizeof(float));
    b.x2  = malloc(4 * CI / 2 * PLANE);
    b.w2  = malloc(4 * CO * CI / 2 * KK);
    b.g2  = malloc(4 * CO / 2 * LD);
    b.wt2 = malloc(4 * CI * CO / 2 * KK);
    for (int i = 0; i < CI * PLANE; i++)
        b.x[i] = (float)((i * 2654435761u) % 1000) / 1000.0f;
    for (int i = 0; i < CO * CI * KK; i++)
        b.w[i] = (float)((i * 40503u) % 997) / 997.0f - 0.5f;
    for (int i = 0; i < CO * NW; i++)
        b.g[i] = (float)((i * 7919u) % 991) / 991.0f - 0.5f;
    for (int o = 0; o < CO; o++)
        memcpy(b.gw + (size_t)o * LD + MARGIN, b.g + (size_t)o * NW, sizeof(float) * NW);
    for (int o = 0; o < CO; o++)
        for (int c = 0; c < CI; c++)
            memcpy(b.wt + (size_t)c * CO * KK + o * KK, b.w + ((size_t)o * CI + c) * KK,
                   sizeof(float) * KK);
    dt_f32_to_bf16(b.w, b.w16, CO * CI * KK);
    dt_c16_weight_pairs(b.w16, CO, CI, KK, b.w2);
    dt_c16_weight_pairs_t(b.w16, CO, CI, KK, b.wt2);
    dt_c16_pack_pairs(b.x, CI, HW, HW, 0, b.x2);
    dt_c16_pack_plain(b.x, CI, HW, HW, 0, b.xb);
    dt_c16_rows_to_pair_cols(b.g, NW, CO, NW, b.gt, CO);
    dt_c16_rows_to_pairs(b.g, NW, CO, NW, MARGIN, LD, b.g2);
    for (int c = 0; c < CI; c++)
        for (int t = 0; t < KK; t++) {
            int sh                = t / KS * WP + t % KS;
            b.of[c * KK + t]      = c * PLANE + sh;
            b.op[c * KK + t]      = c * PLANE + sh;
            b.o2f[c / 2 * KK + t] = c / 2 * PLANE + sh;
        }
    for (int o = 0; o < CO; o++)
        for (int t = 0; t < KK; t++) {
            int sh           = t / KS * WP + t % KS;
            b.ob[o * KK + t] = o * LD + MARGIN - sh;
            if (o < CO / 2)
                b.o2b[o * KK + t] = o * LD + MARGIN - sh;
        }
    static const struct {
        const char *name;
        conv_fn     bf, bf_pack, f32;
    } ks[] = {{"conv2 forward", c16_fwd, c16_fwd_pack, f32_fwd},
              {"conv2 input gradient", c16_dx, c16_dx_pack, f32_dx},
              {"conv2 weight gradient", c16_dw, c16_dw_pack, f32_dw}};
    printf("# seed conv2 (16->32, 3x3, 26x26), one sample, median of %d: GFLOP/s of "
           "2*32*144*576\n",
           reps);
    printf("%-24s %9s %8s %12s %9s %9s\n", "kernel", "bf16_GF", "of_peak", "bf16+pack_GF",
           "fp32_GF", "bf16/fp32");
    double flop = 2.0 * CO * CI * KK * HO * HO;
    for (size_t i = 0; i < sizeof ks / sizeof ks[0]; i++) {
        double t1[101], t2[101], t3[101];
        for (int r = 0; r < reps; r++) {
            t1[r] = time_conv(ks[i].bf, &b);
            t2[r] = time_conv(ks[i].bf_pack, &b);
            t3[r] = time_conv(ks[i].f32, &b);
        }
        qsort(t1, (size_t)reps, sizeof(double), cmp_d);
        qsort(t2, (size_t)reps, sizeof(double), cmp_d);
        qsort(t3, (size_t)reps, sizeof(double), cmp_d);
        double g1 = flop / t1[reps / 2] / 1e9, g2 = flop / t2[reps / 2] / 1e9,
               g3 = flop / t3[reps / 2] / 1e9;
        printf("%-24s %9.1f %7.0f%% %12.1f %9.1f %8.2fx\n", ks[i].name, g1, 100 * g1 / pk_bf, g2,
               g3, g2 / g3);
    }
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
    conv_kernels(reps, pk_bf);
    return 0;
}
