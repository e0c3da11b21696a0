// ddp_compress.c: DDP gradient averaging of a GPT-sized model (0.85 M floats) with each
// compression of ddp.h, on the ranks bench/ddp_compress.sh starts in two network
// namespaces joined by a shaped link: median time of dt_ddp_sync per step and the bytes
// this rank's interface sent per step (its tx_bytes counter, so headers and the
// store's traffic count too). The modes are interleaved, 5 steps each, over 4 rounds.
//
//   environment: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT (tcp), BENCH_DEV (the
//   interface whose counter is read)
#include "dtrain/ddp.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static long long tx_bytes(void) {
    const char *dev = getenv("BENCH_DEV");
    char        path[256];
    snprintf(path, sizeof path, "/sys/class/net/%s/statistics/tx_bytes", dev ? dev : "lo");
    FILE     *f = fopen(path, "r");
    long long v = -1;
    if (f) {
        if (fscanf(f, "%lld", &v) != 1)
            v = -1;
        fclose(f);
    }
    return v;
}

static int cmp_d(const void *x, const void *y) {
    double a = *(const double *)x, b = *(const double *)y;
    return a < b ? -1 : a > b;
}

enum { MODES = 4, ROUNDS = 4, STEPS = 5 };

int main(void) {
    dt_pg_opts po = dt_pg_opts_default();
    po.backend    = "tcp";
    dt_pg *pg     = dt_pg_init_from_env(&po);
    if (!pg) {
        fprintf(stderr, "ddp_compress: %s\n", dt_last_error());
        return 1;
    }
    int        rank = dt_pg_rank(pg);
    dt_params *p;
    if (dt_params_new(&p, NULL))
        return 1;
    // A GPT of the peer's shape: embeddings, 4 blocks of qkv / proj / MLP, a head.
    int64_t emb[2] = {256, 128}, pos[2] = {256, 128}, qkv[2] = {384, 128}, proj[2] = {128, 128},
            up[2] = {512, 128}, down[2] = {128, 512}, vec[1] = {128}, vup[1] = {512},
            vqkv[1] = {384};
    dt_params_add(p, "wte", 2, emb, 0);
    dt_params_add(p, "wpe", 2, pos, 0);
    for (int l = 0; l < 4; l++) {
        char n[32];
        snprintf(n, sizeof n, "h%d.ln1", l), dt_params_add(p, n, 1, vec, DT_PARAM_NO_DECAY);
        snprintf(n, sizeof n, "h%d.qkv.w", l), dt_params_add(p, n, 2, qkv, 0);
        snprintf(n, sizeof n, "h%d.qkv.b", l), dt_params_add(p, n, 1, vqkv, DT_PARAM_NO_DECAY);
        snprintf(n, sizeof n, "h%d.proj.w", l), dt_params_add(p, n, 2, proj, 0);
        snprintf(n, sizeof n, "h%d.ln2", l), dt_params_add(p, n, 1, vec, DT_PARAM_NO_DECAY);
        snprintf(n, sizeof n, "h%d.up.w", l), dt_params_add(p, n, 2, up, 0);
        snprintf(n, sizeof n, "h%d.up.b", l), dt_params_add(p, n, 1, vup, DT_PARAM_NO_DECAY);
        snprintf(n, sizeof n, "h%d.down.w", l), dt_params_add(p, n, 2, down, 0);
    }
    if (dt_params_alloc(p))
        return 1;
    size_t       n = dt_params_numel(p);
    dt_powersgd *ps;
    if (dt_powersgd_new(&ps, p, dt_pg_size(pg), &(dt_powersgd_opts){.rank = 4}))
        return 1;
    const char *names[MODES] = {"fp32", "bf16", "fp16", "powersgd r=4"};
    dt_ddp     *ddp[MODES];
    for (int m = 0; m < MODES; m++) {
        dt_ddp_opts o = dt_ddp_opts_default();
        o.compress    = m == 1 ? DT_DDP_COMPRESS_BF16 : m == 2 ? DT_DDP_COMPRESS_FP16 : 0;
        o.comm_hook   = m == 3 ? dt_powersgd_hook(ps) : NULL;
        if (dt_ddp_new(&ddp[m], p, pg, &o)) {
            fprintf(stderr, "ddp_compress: %s\n", dt_last_error());
            return 1;
        }
    }
    float *g = dt_params_grads(p);
    srand(7u + (unsigned)rank);
    double    t[MODES][ROUNDS * STEPS];
    long long bytes[MODES] = {0};
    for (int r = 0; r < ROUNDS; r++)
        for (int m = 0; m < MODES; m++) {
            long long b0 = tx_bytes();
            for (int s = 0; s < STEPS; s++) {
                for (size_t i = 0; i < n; i++)
                    g[i] = (float)rand() / (float)RAND_MAX - 0.5f;
                if (dt_pg_barrier(pg))
                    return 1;
                double t0 = now();
                for (int k = dt_params_count(p) - 1; k >= 0; k--)
                    dt_ddp_mark_ready(ddp[m], dt_params_info(p, k)->offset,
                                      dt_params_info(p, k)->count);
                if (dt_ddp_sync(ddp[m])) {
                    fprintf(stderr, "ddp_compress: %s\n", dt_last_error());
                    return 1;
                }
                t[m][r * STEPS + s] = now() - t0;
            }
            bytes[m] += tx_bytes() - b0; // includes the barriers' few bytes
        }
    if (rank == 0) {
        printf("# %zu floats (%.2f MB fp32), %d ranks, tcp; medians of %d steps\n", n, n * 4e-6,
               dt_pg_size(pg), ROUNDS * STEPS);
        printf("%-14s %10s %14s %8s\n", "mode", "sync_ms", "tx_MB_per_step", "vs_fp32");
        double ms[MODES], mb[MODES];
        for (int m = 0; m < MODES; m++) {
            qsort(t[m], ROUNDS * STEPS, sizeof(double), cmp_d);
            ms[m] = 1e3 * t[m][ROUNDS * STEPS / 2];
            mb[m] = bytes[m] / 1e6 / (ROUNDS * STEPS);
            printf("%-14s %10.2f %14.3f %7.2fx\n", names[m], ms[m], mb[m], ms[m] / ms[0]);
        }
    }
    for (int m = 0; m < MODES; m++)
        dt_ddp_free(ddp[m]);
    dt_powersgd_free(ps);
    dt_params_free(p);
    dt_pg_free(pg);
    return 0;
}
