// ops-bench: forward and backward time of each op of src/nn/ops.h on the shapes of the
// GPT (B=32, T=128, C=128, H=4) and ResNet (batch 128, 28x28 Fashion-MNIST) workloads
// of bench/peer, one thread. bench/ops_peer.py times the same in PyTorch; bench/ops.sh
// runs both and prints the table of bench/RESULTS.md.
//
//   ops-bench [--reps N] [--filter SUBSTRING]
//
// prints one line per case: name, forward us, backward us (medians over N timed
// repetitions after two warm-ups). Backward is everything backward computes: the input
// gradient and the parameter gradients. Times are the thread's CPU time
// (CLOCK_THREAD_CPUTIME_ID), not wall time: on a shared, oversubscribed host the wall
// time of a single-threaded kernel mostly measures how long it waited for a core.
#include "dtrain/nn.h"
#include "nn/blas.h"
#include "nn/ops.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct bcase bcase;
struct bcase {
    const char *name;
    void (*fwd)(bcase *c);
    void (*bwd)(bcase *c);
    int      a[16];
    float   *x, *w, *b, *y, *dy, *dx, *dw, *db, *s0, *s1, *s2;
    int32_t *idx;
};

static float *buf(size_t n, dt_rng *rng) {
    float *p = dt_alloc(sizeof(float) * (n ? n : 1));
    if (!p) {
        fprintf(stderr, "ops-bench: out of memory (%zu floats)\n", n);
        exit(1);
    }
    for (size_t i = 0; i < n; i++)
        p[i] = rng ? dt_rng_normal(rng) : 0.0f;
    return p;
}

// ------------------------------------------------------------------------------ cases

static void conv_fwd(bcase *c) {
    dt_nn_conv2d p = {c->a[0], c->a[1], c->a[2], c->a[2], c->a[3],
                      c->a[3], c->a[4], c->a[4], 1,       false};
    dt_nn_conv2d_forward(&p, c->a[5], c->a[6], c->a[6], c->x, c->w, NULL, c->y, c->s0);
}
static void conv_bwd(bcase *c) {
    dt_nn_conv2d p = {c->a[0], c->a[1], c->a[2], c->a[2], c->a[3],
                      c->a[3], c->a[4], c->a[4], 1,       false};
    dt_nn_conv2d_backward(&p, c->a[5], c->a[6], c->a[6], c->x, c->w, c->dy, c->a[7] ? c->dx : NULL,
                          c->dw, NULL, c->s0);
}
// cin, cout, k, stride, pad, n, hw, input gradient?
static void conv_setup(bcase *c, dt_rng *rng) {
    dt_nn_conv2d p = {c->a[0], c->a[1], c->a[2], c->a[2], c->a[3],
                      c->a[3], c->a[4], c->a[4], 1,       false};
    int          ho, wo, n = c->a[5], h = c->a[6];
    if (dt_nn_conv2d_check(&p, h, h, &ho, &wo)) {
        fprintf(stderr, "ops-bench: %s\n", dt_last_error());
        exit(1);
    }
    c->x  = buf((size_t)n * p.cin * h * h, rng);
    c->dx = buf((size_t)n * p.cin * h * h, NULL);
    c->w  = buf(dt_nn_conv2d_weight_count(&p), rng);
    c->dw = buf(dt_nn_conv2d_weight_count(&p), NULL);
    c->y  = buf((size_t)n * p.cout * ho * wo, NULL);
    c->dy = buf((size_t)n * p.cout * ho * wo, rng);
    c->s0 = buf(dt_nn_conv2d_scratch(&p, h, h), NULL);
}

static void bn_fwd(bcase *c) {
    dt_nn_bn p = dt_nn_bn_default(c->a[1]);
    dt_nn_bn_forward(&p, c->a[0], c->a[2], true, c->x, c->w, c->b, c->s1, c->s1 + c->a[1], c->s0,
                     c->s0 + c->a[1], c->y);
}
static void bn_bwd(bcase *c) {
    dt_nn_bn p = dt_nn_bn_default(c->a[1]);
    dt_nn_bn_backward(&p, c->a[0], c->a[2], true, c->x, c->dy, c->s0, c->s0 + c->a[1], c->w, c->dx,
                      c->dw, c->db, c->s2);
}
// BatchNorm + ReLU as dtrain-resnet runs it (dt_graph_fuse: one node, the mask from x)
static void bnrelu_fwd(bcase *c) {
    dt_nn_bn p = dt_nn_bn_default(c->a[1]);
    int      n = c->a[0], ch = c->a[1], l = c->a[2];
    float   *mean = c->s0, *invstd = c->s0 + ch;
    double  *sum = (double *)(void *)c->s2, *m2 = sum + ch; // s2 holds 2 ch doubles
    dt_nn_bn_stats_range(n, ch, 0, ch, l, c->x, sum, m2);
    dt_nn_bn_moments(&p, (double)n * l, sum, m2, mean, invstd, c->s1, c->s1 + ch);
    dt_nn_bn_apply_rows(n, ch, l, 0, n * ch, c->x, mean, invstd, c->w, c->b, NULL, true, c->y);
}
static void bnrelu_bwd(bcase *c) {
    int           n = c->a[0], ch = c->a[1], l = c->a[2];
    dt_nn_bn_relu relu = {NULL, c->w, c->b};
    float        *sdy = c->s2, *sdyx = c->s2 + ch;
    dt_nn_bn_backward_stats_ex(n, ch, 0, ch, l, c->x, c->dy, &relu, c->s0, c->s0 + ch, sdy, sdyx,
                               NULL);
    for (int i = 0; i < ch; i++)
        c->dw[i] += sdyx[i], c->db[i] += sdy[i];
    dt_nn_bn_backward_apply_rows(n, ch, l, 0, n * ch, c->x, c->dy, &relu, c->s0, c->s0 + ch, c->w,
                                 sdy, sdyx, (double)n * l, c->dx);
}
static void relu_fwd(bcase *c) {
    dt_nn_relu_forward((size_t)c->a[0], c->x, c->y);
}
static void relu_bwd(bcase *c) {
    dt_nn_relu_grad((size_t)c->a[0], c->y, c->dy, c->dx);
}

static void bn_setup(bcase *c, dt_rng *rng) {
    size_t n = (size_t)c->a[0] * c->a[1] * c->a[2], ch = (size_t)c->a[1];
    c->x = buf(n, rng), c->dy = buf(n, rng), c->y = buf(n, NULL), c->dx = buf(n, NULL);
    c->w = buf(ch, rng), c->b = buf(ch, rng), c->dw = buf(ch, NULL), c->db = buf(ch, NULL);
    c->s0 = buf(2 * ch, NULL), c->s1 = buf(2 * ch, NULL), c->s2 = buf(4 * ch, NULL);
    for (size_t i = 0; i < ch; i++)
        c->s1[ch + i] = 1.0f;
}

static void pool_fwd(bcase *c) {
    dt_nn_adaptive_avgpool2d_forward(c->a[0], c->a[1], c->a[2], c->a[2], 1, 1, c->x, c->y);
}
static void pool_bwd(bcase *c) {
    dt_nn_adaptive_avgpool2d_backward(c->a[0], c->a[1], c->a[2], c->a[2], 1, 1, c->dy, c->dx);
}
static void pool_setup(bcase *c, dt_rng *rng) {
    size_t n = (size_t)c->a[0] * c->a[1] * c->a[2] * c->a[2], no = (size_t)c->a[0] * c->a[1];
    c->x = buf(n, rng), c->dx = buf(n, NULL), c->y = buf(no, NULL), c->dy = buf(no, rng);
}

static void linear_fwd(bcase *c) {
    dt_nn_linear_forward(c->a[0], c->a[1], c->a[2], c->x, c->w, c->b, c->y);
}
static void linear_bwd(bcase *c) {
    dt_nn_linear_backward(c->a[0], c->a[1], c->a[2], c->x, c->w, c->dy, c->dx, c->dw, c->db);
}
static void linear_setup(bcase *c, dt_rng *rng) {
    size_t n = (size_t)c->a[0], in = (size_t)c->a[1], out = (size_t)c->a[2];
    c->x = buf(n * in, rng), c->dx = buf(n * in, NULL), c->w = buf(in * out, rng);
    c->dw = buf(in * out, NULL), c->b = buf(out, rng), c->db = buf(out, NULL);
    c->y = buf(n * out, NULL), c->dy = buf(n * out, rng);
}

static void ln_fwd(bcase *c) {
    dt_nn_layernorm_forward(c->a[0], c->a[1], 1e-5f, c->x, c->w, c->b, c->y, c->s0,
                            c->s0 + c->a[0]);
}
static void ln_bwd(bcase *c) {
    dt_nn_layernorm_backward(c->a[0], c->a[1], c->x, c->w, c->s0, c->s0 + c->a[0], c->dy, c->dx,
                             c->dw, c->db);
}
static void ln_setup(bcase *c, dt_rng *rng) {
    size_t n = (size_t)c->a[0] * c->a[1], d = (size_t)c->a[1];
    c->x = buf(n, rng), c->dx = buf(n, NULL), c->y = buf(n, NULL), c->dy = buf(n, rng);
    c->w = buf(d, rng), c->b = buf(d, rng), c->dw = buf(d, NULL), c->db = buf(d, NULL);
    c->s0 = buf(2 * (size_t)c->a[0], NULL);
}

static void gelu_fwd(bcase *c) {
    dt_nn_gelu_forward((size_t)c->a[0], true, c->x, c->y);
}
static void gelu_bwd(bcase *c) {
    dt_nn_gelu_backward((size_t)c->a[0], true, c->x, c->dy, c->dx);
}
static void ew_setup(bcase *c, dt_rng *rng) {
    size_t n = (size_t)c->a[0];
    c->x = buf(n, rng), c->dx = buf(n, NULL), c->y = buf(n, NULL), c->dy = buf(n, rng);
}

static void attn_fwd(bcase *c) {
    int C = c->a[2];
    dt_nn_attn_forward(c->a[0], c->a[1], C, c->a[3], 3 * C, c->x, c->x + C, c->x + 2 * C, c->y,
                       c->s0, c->s1);
}
static void attn_bwd(bcase *c) {
    int C = c->a[2];
    dt_nn_attn_backward(c->a[0], c->a[1], C, c->a[3], 3 * C, c->x, c->x + C, c->x + 2 * C, c->y,
                        c->s0, c->dy, c->dx, c->dx + C, c->dx + 2 * C, c->s1);
}
static void attn_setup(bcase *c, dt_rng *rng) {
    size_t bt = (size_t)c->a[0] * c->a[1], C = (size_t)c->a[2];
    c->x = buf(bt * 3 * C, rng), c->dx = buf(bt * 3 * C, NULL), c->y = buf(bt * C, NULL);
    c->dy = buf(bt * C, rng), c->s0 = buf(bt * c->a[3], NULL);
    c->s1 = buf(dt_nn_attn_scratch(c->a[2] / c->a[3]), NULL);
}

static void emb_fwd(bcase *c) {
    if (dt_nn_embedding_forward(c->a[0], c->a[1], c->a[2], c->idx, c->w, c->y))
        exit(1);
}
static void emb_bwd(bcase *c) {
    dt_nn_embedding_backward(c->a[0], c->a[2], c->idx, c->dy, c->dw);
}
static void emb_setup(bcase *c, dt_rng *rng) {
    size_t n = (size_t)c->a[0], d = (size_t)c->a[2];
    c->idx = dt_alloc(sizeof(int32_t) * n);
    for (size_t i = 0; i < n; i++)
        c->idx[i] = (int32_t)dt_rng_below(rng, (uint64_t)c->a[1]);
    c->w = buf((size_t)c->a[1] * d, rng), c->dw = buf((size_t)c->a[1] * d, NULL);
    c->y = buf(n * d, NULL), c->dy = buf(n * d, rng);
}

static void ce_fwd(bcase *c) {
    float loss;
    if (dt_nn_cross_entropy(c->a[0], c->a[1], c->x, c->idx, -100, 0.0f, &loss, NULL))
        exit(1);
}
static void ce_bwd(bcase *c) { // torch's backward recomputes nothing: this times both
    float loss;
    if (dt_nn_cross_entropy(c->a[0], c->a[1], c->x, c->idx, -100, 0.0f, &loss, c->dx))
        exit(1);
}
static void ce_setup(bcase *c, dt_rng *rng) {
    size_t n = (size_t)c->a[0], k = (size_t)c->a[1];
    c->x = buf(n * k, rng), c->dx = buf(n * k, NULL);
    c->idx = dt_alloc(sizeof(int32_t) * n);
    for (size_t i = 0; i < n; i++)
        c->idx[i] = (int32_t)dt_rng_below(rng, k);
}

typedef struct entry {
    bcase c;
    void (*setup)(bcase *c, dt_rng *rng);
} entry;

#define CONV(nm, ci, co, k, s, p, hw, dx)                                                          \
    {                                                                                              \
        .c = {.name = nm, .fwd = conv_fwd, .bwd = conv_bwd, .a = {ci, co, k, s, p, 128, hw, dx}},  \
        .setup = conv_setup                                                                        \
    }

static entry cases[] = {
    // ResNet (resnet_fmnist.py), batch 128
    CONV("resnet stem conv3x3 1->16 28x28", 1, 16, 3, 1, 1, 28, 0),
    CONV("resnet conv3x3 16->16 28x28", 16, 16, 3, 1, 1, 28, 1),
    CONV("resnet conv3x3 16->32 s2 28x28", 16, 32, 3, 2, 1, 28, 1),
    CONV("resnet conv1x1 16->32 s2 28x28", 16, 32, 1, 2, 0, 28, 1),
    CONV("resnet conv3x3 32->32 14x14", 32, 32, 3, 1, 1, 14, 1),
    CONV("resnet conv3x3 32->64 s2 14x14", 32, 64, 3, 2, 1, 14, 1),
    CONV("resnet conv3x3 64->64 7x7", 64, 64, 3, 1, 1, 7, 1),
    {.c =
         {.name = "resnet batchnorm2d 16x28x28", .fwd = bn_fwd, .bwd = bn_bwd, .a = {128, 16, 784}},
     .setup = bn_setup},
    {.c = {.name = "resnet batchnorm2d 64x7x7", .fwd = bn_fwd, .bwd = bn_bwd, .a = {128, 64, 49}},
     .setup = bn_setup},
    {.c = {.name = "resnet relu 16x28x28", .fwd = relu_fwd, .bwd = relu_bwd, .a = {128 * 16 * 784}},
     .setup = ew_setup},
    {.c     = {.name = "resnet batchnorm2d+relu 16x28x28",
               .fwd  = bnrelu_fwd,
               .bwd  = bnrelu_bwd,
               .a    = {128, 16, 784}},
     .setup = bn_setup},
    {.c     = {.name = "resnet adaptive avgpool 64x7x7->1",
               .fwd  = pool_fwd,
               .bwd  = pool_bwd,
               .a    = {128, 64, 7}},
     .setup = pool_setup},
    {.c =
         {.name = "resnet linear 64->10", .fwd = linear_fwd, .bwd = linear_bwd, .a = {128, 64, 10}},
     .setup = linear_setup},
    {.c     = {.name = "resnet cross-entropy 128x10", .fwd = ce_fwd, .bwd = ce_bwd, .a = {128, 10}},
     .setup = ce_setup},
    // GPT (gpt_bytes.py), B=32, T=128: 4096 rows
    {.c = {.name = "gpt embedding 256x128", .fwd = emb_fwd, .bwd = emb_bwd, .a = {4096, 256, 128}},
     .setup = emb_setup},
    {.c     = {.name = "gpt layernorm 128", .fwd = ln_fwd, .bwd = ln_bwd, .a = {4096, 128}},
     .setup = ln_setup},
    {.c     = {.name = "gpt linear qkv 128->384",
               .fwd  = linear_fwd,
               .bwd  = linear_bwd,
               .a    = {4096, 128, 384}},
     .setup = linear_setup},
    {.c     = {.name = "gpt attention causal H=4 d=32",
               .fwd  = attn_fwd,
               .bwd  = attn_bwd,
               .a    = {32, 128, 128, 4}},
     .setup = attn_setup},
    {.c     = {.name = "gpt linear proj 128->128",
               .fwd  = linear_fwd,
               .bwd  = linear_bwd,
               .a    = {4096, 128, 128}},
     .setup = linear_setup},
    {.c     = {.name = "gpt linear fc 128->512",
               .fwd  = linear_fwd,
               .bwd  = linear_bwd,
               .a    = {4096, 128, 512}},
     .setup = linear_setup},
    {.c = {.name = "gpt gelu tanh 4096x512", .fwd = gelu_fwd, .bwd = gelu_bwd, .a = {4096 * 512}},
     .setup = ew_setup},
    {.c     = {.name = "gpt linear fc 512->128",
               .fwd  = linear_fwd,
               .bwd  = linear_bwd,
               .a    = {4096, 512, 128}},
     .setup = linear_setup},
    {.c     = {.name = "gpt linear head 128->256",
               .fwd  = linear_fwd,
               .bwd  = linear_bwd,
               .a    = {4096, 128, 256}},
     .setup = linear_setup},
    {.c = {.name = "gpt cross-entropy 4096x256", .fwd = ce_fwd, .bwd = ce_bwd, .a = {4096, 256}},
     .setup = ce_setup},
};

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static uint64_t cpu_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static double median_us(bcase *c, void (*fn)(bcase *c), int reps) {
    double t[101];
    for (int i = 0; i < 2; i++)
        fn(c);
    for (int i = 0; i < reps; i++) {
        uint64_t t0 = cpu_ns();
        fn(c);
        t[i] = (double)(cpu_ns() - t0) / 1e3;
    }
    qsort(t, (size_t)reps, sizeof t[0], cmp_double);
    return t[reps / 2];
}

int main(int argc, char **argv) {
    int         reps   = 11;
    const char *filter = NULL;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--reps") == 0 && i + 1 < argc)
            reps = atoi(argv[++i]);
        else if (strcmp(argv[i], "--filter") == 0 && i + 1 < argc)
            filter = argv[++i];
        else {
            fprintf(stderr, "usage: ops-bench [--reps N (1-101)] [--filter SUBSTRING]\n");
            return 2;
        }
    }
    if (reps < 1 || reps > 101) {
        fprintf(stderr, "ops-bench: --reps must be 1 to 101, found %d\n", reps);
        return 2;
    }
    dt_blas_init(); // one OpenBLAS thread: the ops run on the caller's thread
    printf("# dtrain ops, 1 thread, thread CPU time, median of %d; %s\n", reps, dt_blas_info());
    printf("%-40s %12s %12s\n", "op", "fwd_us", "bwd_us");
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        bcase *c = &cases[i].c;
        if (filter && !strstr(c->name, filter))
            continue;
        dt_rng rng = dt_rng_init(i + 1);
        cases[i].setup(c, &rng);
        c->fwd(c); // backward reads what forward saved
        double f = median_us(c, c->fwd, reps), b = median_us(c, c->bwd, reps);
        printf("%-40s %12.1f %12.1f\n", c->name, f, b);
        fflush(stdout);
    }
    return 0;
}
