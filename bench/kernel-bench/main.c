// kernel-bench: the GEMM and convolution rows of the kernel table on the shapes of the
// seed ConvNet, the ResNet and the GPT (bench/peer), one thread, against the machine's
// FMA peak. The rows are the table's under DT_ISA (kernels/cpu.h), so
//
//   kernel-bench [--reps N] [--filter SUBSTRING] [--peak GFLOPS]
//   DT_ISA=ref kernel-bench ...
//
// prints one line per case: name, the kernel the table runs, microseconds per call
// (median over N timed calls after two warm-ups, by the thread's CPU time, which a
// shared host's waits do not inflate), GFLOP/s (2 x the multiply-adds of the product
// the case computes) and, with --peak (bench/fp32_peak.c's per-thread figure), its
// fraction.
#include "dtrain/nn.h"
#include "kernels/table.h"
#include "nn/ops.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct kcase kcase;
struct kcase {
    const char *name;
    const char *row; // the kernel, as dt_krow_describe says (NULL: the case says)
    double      flops;
    void (*run)(kcase *c);
    int    a[12];
    float *x, *w, *y, *s;
    int   *off;
};

static double cpu_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static float *floats(size_t n) {
    float *p = dt_alloc(sizeof(float) * (n ? n : 1));
    if (!p) {
        fprintf(stderr, "kernel-bench: out of memory (%zu floats)\n", n);
        exit(1);
    }
    for (size_t i = 0; i < n; i++)
        p[i] = (float)((i * 2654435761u) % 1000) * 1e-3f - 0.5f;
    return p;
}

// ------------------------------------------------------------- shifted GEMMs

// A stride-1 k x k convolution of cin -> cout channels over an h x w input with padding
// p, in the wide layout (layers/conv_team.c): a[0..4] = cin, cout, k, hw, pad.
typedef struct wide {
    int    hp, wp, n, margin;
    size_t plane, ld;
} wide;
static wide geom(const int *a) {
    wide g;
    g.hp     = a[3] + 2 * a[4];
    g.wp     = a[3] + 2 * a[4];
    g.n      = (g.hp - a[2] + 1) * g.wp - (a[2] - 1);
    g.plane  = (size_t)g.hp * g.wp;
    g.margin = (a[2] - 1) * (g.wp + 1);
    g.ld     = (size_t)g.margin + g.plane;
    return g;
}

static void conv_fwd(kcase *c) {
    wide g = geom(c->a);
    dt_k()->shifted_gemm(c->x, c->off, c->a[0] * c->a[2] * c->a[2], c->w, c->a[1], g.n, c->y,
                         (size_t)g.n, false);
}
static void conv_dx(kcase *c) { // the output gradient with margins, weights transposed
    wide g = geom(c->a);
    dt_k()->shifted_gemm(c->y, c->off, c->a[1] * c->a[2] * c->a[2], c->w, c->a[0], (int)g.plane,
                         c->x, g.plane, false);
}
static void conv_dw(kcase *c) {
    wide g = geom(c->a);
    dt_k()->shifted_gemm_nt(c->y + g.margin, g.ld, c->a[1], c->x, c->off,
                            c->a[0] * c->a[2] * c->a[2], g.n, c->w);
}

static void conv_setup(kcase *c, int dir) {
    wide g   = geom(c->a);
    int  cin = c->a[0], cout = c->a[1], k = c->a[2], kk = k * k;
    c->x = floats((size_t)cin * g.plane + 64);
    c->y = floats((size_t)cout * g.ld + 64);
    c->w = floats((size_t)cin * cout * kk);
    if (dir == 1) { // input gradient: shifts into the gradient rows, back from their margin
        c->off = dt_alloc(sizeof(int) * (size_t)cout * kk);
        for (int o = 0; o < cout; o++)
            for (int t = 0; t < kk; t++)
                c->off[o * kk + t] = (int)((size_t)o * g.ld) + g.margin - (t / k * g.wp + t % k);
    } else {
        c->off = dt_alloc(sizeof(int) * (size_t)cin * kk);
        for (int ch = 0; ch < cin; ch++)
            for (int t = 0; t < kk; t++)
                c->off[ch * kk + t] = (int)((size_t)ch * g.plane) + t / k * g.wp + t % k;
    }
    int ho = g.hp - k + 1, wo = g.wp - k + 1;
    c->flops = 2.0 * cin * cout * kk * ho * wo;
}

// Linear (in -> out) over `rows` rows: a[0..2] = rows, in, out; the shifted tiles as
// layers/linear.c calls them on AVX-512 (forward y += x W^T; dx = dy W), and the
// sharded weight gradient over S = a[3] shards of the rows, one chunk of 48 columns.
static void lin_setup(kcase *c) {
    int rows = c->a[0], in = c->a[1], out = c->a[2];
    c->x     = floats((size_t)rows * in);
    c->w     = floats((size_t)out * in);
    c->y     = floats((size_t)rows * (in > out ? in : out));
    c->s     = floats((size_t)64 * DT_KSHARD_ROWS * DT_KSHARD_COLS);
    int nmax = rows > out ? rows : out;
    c->off   = dt_alloc(sizeof(int) * (size_t)nmax);
    c->flops = 2.0 * rows * in * out;
}
static void lin_fwd(kcase *c) {
    for (int o = 0; o < c->a[2]; o++)
        c->off[o] = o * c->a[1];
    dt_k()->shifted_gemm_nt(c->x, (size_t)c->a[1], c->a[0], c->w, c->off, c->a[2], c->a[1], c->y);
}
static void lin_dx(kcase *c) {
    for (int o = 0; o < c->a[2]; o++)
        c->off[o] = o * c->a[1];
    dt_k()->shifted_gemm(c->w, c->off, c->a[2], c->y, c->a[0], c->a[1], c->x, (size_t)c->a[1],
                         false);
}
static void lin_shards(kcase *c) { // dW (out, in) += dy^T x, in chunks of 48 columns
    int rows = c->a[0], in = c->a[1], out = c->a[2], S = c->a[3];
    int start[64], len[64];
    for (int m = 0; m < S; m++) {
        start[m] = rows / S * m;
        len[m]   = rows / S;
    }
    for (int r = 0; r < rows; r++)
        c->off[r] = r * in;
    for (int jc = 0; jc < in; jc += DT_KSHARD_COLS) {
        int cw = in - jc < DT_KSHARD_COLS ? in - jc : DT_KSHARD_COLS;
        dt_k()->shifted_gemm_shards(c->x + jc, c->off, start, len, S, c->y, out, cw, c->s,
                                    c->w + jc, (size_t)in);
    }
}

// ------------------------------------------------------------------------- sgemm

// a[0..4] = trans_a, trans_b, m, n, k
static void gemm_setup(kcase *c) {
    int m = c->a[2], n = c->a[3], k = c->a[4];
    c->x     = floats((size_t)m * k);
    c->w     = floats((size_t)k * n);
    c->y     = floats((size_t)m * n);
    c->flops = 2.0 * m * n * k;
}
static void gemm_run(kcase *c) {
    int m = c->a[2], n = c->a[3], k = c->a[4];
    dt_k()->sgemm(c->a[0], c->a[1], m, n, k, 1.0f, c->x, c->a[0] ? m : k, c->w, c->a[1] ? k : n,
                  0.0f, c->y, n);
}

// ------------------------------------------------------------------------ table

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void time_case(kcase *c, int reps, double peak) {
    double t[101];
    for (int i = 0; i < 2; i++)
        c->run(c);
    for (int i = 0; i < reps; i++) {
        double t0 = cpu_now();
        c->run(c);
        t[i] = cpu_now() - t0;
    }
    qsort(t, (size_t)reps, sizeof t[0], cmp_double);
    double med = t[reps / 2], gf = c->flops / med * 1e-9;
    printf("%-34s %-34s %10.1f %8.1f", c->name, c->row, med * 1e6, gf);
    if (peak > 0)
        printf(" %6.1f%%", 100.0 * gf / peak);
    printf("\n");
    fflush(stdout);
}

int main(int argc, char **argv) {
    int         reps   = 11;
    const char *filter = NULL;
    double      peak   = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--reps") == 0 && i + 1 < argc)
            reps = atoi(argv[++i]);
        else if (strcmp(argv[i], "--filter") == 0 && i + 1 < argc)
            filter = argv[++i];
        else if (strcmp(argv[i], "--peak") == 0 && i + 1 < argc)
            peak = atof(argv[++i]);
        else {
            fprintf(stderr, "usage: kernel-bench [--reps N (1-101)] [--filter SUBSTRING] "
                            "[--peak GFLOPS]\n");
            return 2;
        }
    }
    if (reps < 1 || reps > 101) {
        fprintf(stderr, "kernel-bench: --reps expects 1 to 101, found %d\n", reps);
        return 2;
    }
    char line[320];
    printf("# %s\n", dt_kernels_describe(line, sizeof line));
    printf("%-34s %-34s %10s %8s%s\n", "case", "kernel", "us", "GFLOP/s",
           peak > 0 ? "   peak" : "");
    // clang-format off
    static kcase cases[] = {
        {.name = "convnet conv1 fwd 1-32 k3 28", .run = conv_fwd, .a = {1, 32, 3, 28, 0}},
        {.name = "convnet conv1 dw 1-32 k3 28", .run = conv_dw, .a = {1, 32, 3, 28, 0}},
        {.name = "convnet conv2 fwd 32-64 k3 26", .run = conv_fwd, .a = {32, 64, 3, 26, 0}},
        {.name = "convnet conv2 dx 32-64 k3 26", .run = conv_dx, .a = {32, 64, 3, 26, 0}},
        {.name = "convnet conv2 dw 32-64 k3 26", .run = conv_dw, .a = {32, 64, 3, 26, 0}},
        {.name = "resnet fwd 16-16 k3 28 p1", .run = conv_fwd, .a = {16, 16, 3, 28, 1}},
        {.name = "resnet dx 16-16 k3 28 p1", .run = conv_dx, .a = {16, 16, 3, 28, 1}},
        {.name = "resnet dw 16-16 k3 28 p1", .run = conv_dw, .a = {16, 16, 3, 28, 1}},
        {.name = "resnet fwd 32-32 k3 14 p1", .run = conv_fwd, .a = {32, 32, 3, 14, 1}},
        {.name = "resnet dx 32-32 k3 14 p1", .run = conv_dx, .a = {32, 32, 3, 14, 1}},
        {.name = "resnet dw 32-32 k3 14 p1", .run = conv_dw, .a = {32, 32, 3, 14, 1}},
        {.name = "resnet fwd 64-64 k3 7 p1", .run = conv_fwd, .a = {64, 64, 3, 7, 1}},
        {.name = "resnet dx 64-64 k3 7 p1", .run = conv_dx, .a = {64, 64, 3, 7, 1}},
        {.name = "resnet dw 64-64 k3 7 p1", .run = conv_dw, .a = {64, 64, 3, 7, 1}},
        {.name = "fc1 fwd 64x9216->128", .run = lin_fwd, .a = {64, 9216, 128}},
        {.name = "fc1 dx 64x128->9216", .run = lin_dx, .a = {64, 9216, 128}},
        {.name = "fc1 dw shards 128 rows, S 8", .run = lin_shards, .a = {128, 9216, 128, 8}},
        {.name = "gpt qkv fwd 2048x128->384", .run = lin_fwd, .a = {2048, 128, 384}},
        {.name = "gpt qkv dx 2048x384->128", .run = lin_dx, .a = {2048, 128, 384}},
        {.name = "gpt mlp dw shards 2048, S 8", .run = lin_shards, .a = {2048, 128, 512, 8}},
        {.name = "sgemm NT 32x128x9216", .run = gemm_run, .a = {0, 1, 32, 128, 9216}},
        {.name = "sgemm NT 64x128x9216", .run = gemm_run, .a = {0, 1, 64, 128, 9216}},
        {.name = "sgemm TN 128x4608x128", .run = gemm_run, .a = {1, 0, 128, 4608, 128}},
        {.name = "sgemm NN 64x9216x128", .run = gemm_run, .a = {0, 0, 64, 9216, 128}},
        {.name = "sgemm NN 64x622x288 (conv2)", .run = gemm_run, .a = {0, 0, 64, 622, 288}},
        {.name = "sgemm NT 64x288x622 (conv2 dw)", .run = gemm_run, .a = {0, 1, 64, 288, 622}},
        {.name = "sgemm TN 288x622x64 (conv2 dx)", .run = gemm_run, .a = {1, 0, 288, 622, 64}},
        {.name = "sgemm NN 1024x1024x1024", .run = gemm_run, .a = {0, 0, 1024, 1024, 1024}},
        // the GPT's (bench/peer's defaults: 32 x 128 tokens, C 128, 4 heads): its Linear
        // layers' forward (NT), input gradient (NN) and weight gradient (TN), then one
        // (sample, head) block pair of attention (64 x 64 blocks, head width 32)
        {.name = "sgemm NT 4096x384x128 (gpt qkv)", .run = gemm_run, .a = {0, 1, 4096, 384, 128}},
        {.name = "sgemm NT 4096x128x512 (gpt proj)", .run = gemm_run, .a = {0, 1, 4096, 128, 512}},
        {.name = "sgemm NN 4096x128x384 (gpt qkv dx)", .run = gemm_run, .a = {0, 0, 4096, 128, 384}},
        {.name = "sgemm NN 4096x512x128 (gpt proj dx)", .run = gemm_run, .a = {0, 0, 4096, 512, 128}},
        {.name = "sgemm TN 384x128x4096 (gpt qkv dw)", .run = gemm_run, .a = {1, 0, 384, 128, 4096}},
        {.name = "sgemm TN 128x512x4096 (gpt proj dw)", .run = gemm_run, .a = {1, 0, 128, 512, 4096}},
        {.name = "sgemm NT 64x64x32 (gpt attn qk)", .run = gemm_run, .a = {0, 1, 64, 64, 32}},
        {.name = "sgemm NN 64x32x64 (gpt attn pv)", .run = gemm_run, .a = {0, 0, 64, 32, 64}},
        {.name = "sgemm TN 64x32x64 (gpt attn dv)", .run = gemm_run, .a = {1, 0, 64, 32, 64}},
    };
    // clang-format on
    const dt_ktab *t = dt_k();
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        kcase *c = &cases[i];
        if (filter && !strstr(c->name, filter))
            continue;
        static char desc[96];
        if (c->run == gemm_run) {
            gemm_setup(c);
            dt_krow_describe(t, DT_KROW_sgemm, desc, sizeof desc);
        } else if (c->run == lin_fwd || c->run == lin_dx || c->run == lin_shards) {
            lin_setup(c);
            dt_krow_describe(t,
                             c->run == lin_fwd  ? DT_KROW_shifted_gemm_nt
                             : c->run == lin_dx ? DT_KROW_shifted_gemm
                                                : DT_KROW_shifted_gemm_shards,
                             desc, sizeof desc);
        } else {
            conv_setup(c, c->run == conv_dx);
            dt_krow_describe(t, c->run == conv_dw ? DT_KROW_shifted_gemm_nt : DT_KROW_shifted_gemm,
                             desc, sizeof desc);
        }
        c->row = desc;
        time_case(c, reps, peak);
    }
    return 0;
}
