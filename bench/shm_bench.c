// shm_bench.c: the shm engine's all_reduce alone (no process group, no progress thread),
// timed exactly as dtrain-bench and bench/mpi_allreduce.c time theirs: float32 sum in
// place, per-call times, the slowest rank's time per iteration, the median over
// iterations; same columns (size count type redop time_us algbw busbw).
//
//   make lib && cc -O2 -std=c11 -D_GNU_SOURCE -Iinclude -Isrc bench/shm_bench.c
//       build/release/lib/libdtrain.a -lpthread -o build/bench/shm_bench
//   build/bench/shm_bench [-n 2] [--min 4096] [--max 67108864]
//
// The DT_SHM_* knobs of docs/shm.md apply. Comparing it with `dtrain-bench allreduce
// --backend shm` shows what the process group adds per call. The engine is driven as
// the process group drives it: through the algorithm layer, over its segment.
#include "comm/algo/algo.h"
#include "comm/shm/shm.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#define MAX_ITERS 1000
#define MAX_RANKS 16

static int iters_for(size_t bytes) { // as dtrain-bench
    if (bytes <= (64u << 10))
        return 1000;
    if (bytes <= (1u << 20))
        return 200;
    if (bytes <= (16u << 20))
        return 30;
    return 12;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

typedef struct ctx {
    dt_shm  *s;
    uint64_t seq;
} ctx;

static dt_status run(ctx *c, dt_coll kind, float *buf, size_t count) {
    dt_op op    = {.kind        = kind,
                   .src         = buf,
                   .dst         = buf,
                   .count       = count,
                   .dtype       = DT_FLOAT32,
                   .op          = DT_REDUCE_SUM,
                   .root        = -1,
                   .peer        = -1,
                   .deadline_ns = dt_deadline_ns(60000)};
    op.fp.seq   = ++c->seq;
    op.fp.coll  = (uint8_t)kind;
    op.fp.count = count;
    op.fp.root  = -1;
    snprintf(op.name, sizeof op.name, "%s #%llu", dt_coll_name(kind), (unsigned long long)c->seq);
    return dt_algo_staged(c->s, &op,
                          dt_algo_staged_flat_fits(c->s, &op) ? DT_STAGED_FLAT : DT_STAGED_CHUNKED);
}

int main(int argc, char **argv) {
    int    world = 2;
    size_t minb = 4096, maxb = (size_t)64 << 20;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "-n") == 0)
            world = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--min") == 0)
            minb = (size_t)atoll(argv[i + 1]);
        else if (strcmp(argv[i], "--max") == 0)
            maxb = (size_t)atoll(argv[i + 1]);
    }
    if (world < 1 || world > MAX_RANKS || minb < 4 || maxb < minb) {
        fprintf(stderr, "usage: shm_bench [-n 1..%d] [--min BYTES] [--max BYTES]\n", MAX_RANKS);
        return 2;
    }
    // Per-call times of every rank, shared so that rank 0 can take the slowest.
    double *times = mmap(NULL, sizeof(double) * MAX_ITERS * MAX_RANKS, PROT_READ | PROT_WRITE,
                         MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (times == MAP_FAILED)
        return 1;
    char name[64];
    snprintf(name, sizeof name, "/dtrain-bench-%d", (int)getpid());
    for (int r = 0; r < world; r++) {
        if (fork() != 0)
            continue;
        ctx         c = {0};
        dt_shm_opts o = {
            .rank = r, .world = world, .name = name, .deadline_ns = dt_deadline_ns(20000)};
        if (dt_shm_init(&o, &c.s) != DT_OK) {
            fprintf(stderr, "shm_bench: rank %d: %s\n", r, dt_last_error());
            _exit(1);
        }
        float *buf = dt_alloc(maxb);
        if (!buf)
            _exit(1);
        for (size_t i = 0; i < maxb / 4; i++)
            buf[i] = (float)(r + 1);
        if (r == 0) {
            printf("# shm_bench: shm engine, %d ranks, float32 sum, in place, chunk %zu KiB; "
                   "time_us = median over iterations of the slowest rank\n",
                   world, dt_shm_chunk_bytes(c.s) >> 10);
            printf("%12s %12s %8s %6s %12s %8s %8s\n", "size", "count", "type", "redop", "time_us",
                   "algbw", "busbw");
            fflush(stdout);
        }
        for (size_t bytes = minb; bytes <= maxb; bytes *= 2) {
            size_t count = bytes / 4;
            int    iters = iters_for(bytes);
            for (int w = 0; w < 5; w++)
                if (run(&c, DT_COLL_ALL_REDUCE, buf, count))
                    goto fail;
            if (run(&c, DT_COLL_BARRIER, NULL, 0))
                goto fail;
            for (int i = 0; i < iters; i++) {
                uint64_t t0 = dt_now_ns();
                if (run(&c, DT_COLL_ALL_REDUCE, buf, count))
                    goto fail;
                times[r * MAX_ITERS + i] = (double)(dt_now_ns() - t0) * 1e-9;
            }
            if (run(&c, DT_COLL_BARRIER, NULL, 0))
                goto fail;
            if (r == 0) {
                double t[MAX_ITERS];
                for (int i = 0; i < iters; i++) {
                    t[i] = 0;
                    for (int q = 0; q < world; q++)
                        if (times[q * MAX_ITERS + i] > t[i])
                            t[i] = times[q * MAX_ITERS + i];
                }
                qsort(t, (size_t)iters, sizeof t[0], cmp_double);
                double med = t[iters / 2], algbw = (double)bytes / med / 1e9;
                printf("%12zu %12zu %8s %6s %12.1f %8.3f %8.3f\n", bytes, count, "float32", "sum",
                       med * 1e6, algbw, algbw * 2.0 * (world - 1) / world);
                fflush(stdout);
            }
            // Nobody overwrites `times` before rank 0 has read it.
            if (run(&c, DT_COLL_BARRIER, NULL, 0))
                goto fail;
        }
        dt_shm_free(c.s);
        _exit(0);
    fail:
        fprintf(stderr, "shm_bench: rank %d: %s\n", r, dt_last_error());
        _exit(1);
    }
    int rc = 0, status;
    while (wait(&status) > 0)
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
            rc = 1;
    return rc;
}
