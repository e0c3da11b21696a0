// test_compress.c: DDP's 16-bit gradient compression (dt_ddp_opts.compress) in real
// processes, 2 and 3 ranks. Each rank's gradients are random over six orders of
// magnitude, in tensors of odd sizes over several buckets. The compressed average must
// equal the uncompressed DDP all-reduce of the same gradients within the format's
// precision: |got - avg| <= 2.02 u mean_r |g_r| + 2 d, with u = 2^-8 (bf16) or 2^-11
// (fp16) for the two roundings (each rank's g/world, then the sum) and d the format's
// smallest denormal step (2^-24 for fp16, 0 for bf16 at these magnitudes); every value
// must be a 16-bit number of the format (so the compressed path ran), and every rank
// must hold the same bits.
#include "../check.h"
#include "../lib/mp.h"
#include "dtrain/ddp.h"
#include "nn/prec.h"

#include <math.h>
#include <stdlib.h>

static const int64_t sizes[] = {1, 7, 1001, 40000, 3, 20001};
#define NT ((int)(sizeof sizes / sizeof sizes[0]))

static void ranks(int rank, int world, void *arg) {
    dt_ddp_compress kind = *(const dt_ddp_compress *)arg;
    dt_pg          *pg   = mp_pg_init(0);
    if (!CHECK(pg != NULL))
        return;
    dt_params *p;
    CHECK_OK(dt_params_new(&p, NULL));
    for (int t = 0; t < NT; t++) {
        char name[16];
        snprintf(name, sizeof name, "t%d", t);
        CHECK_OK(dt_params_add(p, name, 1, &sizes[t], 0));
    }
    CHECK_OK(dt_params_alloc(p));
    size_t      n = dt_params_numel(p);
    dt_ddp_opts o = dt_ddp_opts_default();
    dt_ddp     *plain, *comp;
    o.bucket_cap_bytes = 64 * 1024; // several buckets
    CHECK_OK(dt_ddp_new(&plain, p, pg, &o));
    o.compress = kind;
    CHECK_OK(dt_ddp_new(&comp, p, pg, &o));
    CHECK(dt_ddp_num_buckets(comp) >= 2);
    dt_ddp *both  = NULL; // tree_reduce sums full-precision copies: not with compression
    o.tree_reduce = true;
    CHECK_ERR(dt_ddp_new(&both, p, pg, &o), DT_ERR_ARG, "tree_reduce");
    CHECK(both == NULL);
    o.tree_reduce = false;
    float *g = dt_params_grads(p), *mine = malloc(4 * n), *avg = malloc(4 * n),
          *all = malloc(4 * n * (size_t)world), *meanabs = malloc(4 * n);
    double u = kind == DT_DDP_COMPRESS_BF16 ? 0x1p-8 : 0x1p-11;
    double d = kind == DT_DDP_COMPRESS_BF16 ? 0 : 0x1p-24;
    srand(1234u + 77u * (unsigned)rank);
    for (int step = 0; step < 2; step++) {
        for (size_t i = 0; i < n; i++)
            mine[i] = (float)((rand() / (double)RAND_MAX - 0.5) * pow(10.0, rand() % 7 - 4));
        // the uncompressed all-reduce of the same gradients
        memcpy(g, mine, 4 * n);
        for (int t = NT - 1; t >= 0; t--)
            CHECK_OK(dt_ddp_mark_ready(plain, dt_params_info(p, t)->offset,
                                       dt_params_info(p, t)->count));
        CHECK_OK(dt_ddp_sync(plain));
        memcpy(avg, g, 4 * n);
        CHECK_OK(dt_pg_all_gather(pg, mine, all, n, DT_FLOAT32));
        for (size_t i = 0; i < n; i++) {
            double s = 0;
            for (int r = 0; r < world; r++)
                s += fabs(all[(size_t)r * n + i]);
            meanabs[i] = (float)(s / world);
        }
        // compressed
        memcpy(g, mine, 4 * n);
        for (int t = NT - 1; t >= 0; t--)
            CHECK_OK(
                dt_ddp_mark_ready(comp, dt_params_info(p, t)->offset, dt_params_info(p, t)->count));
        CHECK_OK(dt_ddp_sync(comp));
        int    bad = 0, not16 = 0, differ = 0;
        double worst = 0;
        for (size_t i = 0; i < n; i++) {
            double tol = 2.02 * u * meanabs[i] + 2 * d, err = fabs((double)g[i] - avg[i]);
            if (!(err <= tol) && bad++ < 3)
                fprintf(stderr, "  rank %d %s [%zu]: %.9g vs uncompressed %.9g (tol %.3g)\n", rank,
                        dt_ddp_compress_name(kind), i, g[i], avg[i], tol);
            if (meanabs[i] > 0 && err / meanabs[i] > worst)
                worst = err / meanabs[i];
            uint16_t h =
                kind == DT_DDP_COMPRESS_BF16 ? dt_f32_to_bf16_1(g[i]) : dt_f32_to_f16_1(g[i]);
            float back = kind == DT_DDP_COMPRESS_BF16 ? dt_bf16_to_f32_1(h) : dt_f16_to_f32_1(h);
            not16 += back != g[i];
            differ += g[i] != avg[i];
        }
        CHECK_EQ(bad, 0);
        CHECK_EQ(not16, 0);
        CHECK(differ > 0); // the 16-bit path really ran
        if (rank == 0 && step == 0)
            fprintf(stderr, "  %s, %d ranks: worst |error| / mean|g| = %.3g (u = %.3g)\n",
                    dt_ddp_compress_name(kind), world, worst, u);
        // the same bits on every rank
        CHECK_OK(dt_pg_all_gather(pg, g, all, n, DT_FLOAT32));
        for (int r = 1; r < world; r++)
            CHECK(memcmp(all, all + (size_t)r * n, 4 * n) == 0);
    }
    dt_ddp_free(comp);
    dt_ddp_free(plain);
    free(mine), free(avg), free(all), free(meanabs);
    dt_params_free(p);
    dt_pg_free(pg);
}

static void run(dt_ddp_compress kind, int world) {
    mp_opts o = {.world = world, .timeout_ms = 90000};
    MP_RUN(&o, ranks, &kind);
}

static void test_bf16_2(void) {
    run(DT_DDP_COMPRESS_BF16, 2);
}
static void test_fp16_2(void) {
    run(DT_DDP_COMPRESS_FP16, 2);
}
static void test_bf16_3(void) {
    run(DT_DDP_COMPRESS_BF16, 3);
}
static void test_fp16_3(void) {
    run(DT_DDP_COMPRESS_FP16, 3);
}

static void test_parse(void) {
    dt_ddp_compress c;
    CHECK_OK(dt_ddp_compress_parse("bf16", &c));
    CHECK_EQ(c, DT_DDP_COMPRESS_BF16);
    CHECK_OK(dt_ddp_compress_parse("none", &c));
    CHECK_EQ(c, DT_DDP_COMPRESS_NONE);
    CHECK_ERR(dt_ddp_compress_parse("powersgd", &c), DT_ERR_ARG, "powersgd");
}

int main(void) {
    RUN(test_parse);
    RUN(test_bf16_2);
    RUN(test_fp16_2);
    RUN(test_bf16_3);
    RUN(test_fp16_3);
    return check_summary();
}
