// mpi_allreduce.c: Open MPI's MPI_Allreduce measured like dtrain-bench allreduce (same
// sizes, same iteration counts, same columns), for bench/allreduce.sh:
//
//   mpicc -O2 -o build/bench/mpi_allreduce bench/mpi_allreduce.c
//   mpirun --allow-run-as-root -np 2 build/bench/mpi_allreduce [min_bytes max_bytes
//                                                  [iters [warmup [factor]]]]
//
// iters 0 (the default) = by size as dtrain-bench; warmup 5 and factor 2 by default.
//
// time_us: median over iterations of the slowest rank's time for one in-place float
// sum (back-to-back blocking calls, each timed on every rank).
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static int iters_for(size_t bytes) {
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

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, n;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    size_t min_b = argc > 1 ? strtoull(argv[1], NULL, 10) : 4096;
    size_t max_b = argc > 2 ? strtoull(argv[2], NULL, 10) : (64u << 20);
    int    fixed = argc > 3 ? atoi(argv[3]) : 0;
    int    warm  = argc > 4 ? atoi(argv[4]) : 5;
    size_t fac   = argc > 5 ? strtoull(argv[5], NULL, 10) : 2;
    if (fixed < 0 || fixed > 1000 || warm < 0 || fac < 2) {
        fprintf(stderr, "mpi_allreduce: expected iters in 0..1000, warmup >= 0, factor >= 2\n");
        return 2;
    }
    float *buf = malloc(max_b);
    double t[1000], tmax[1000];
    for (size_t i = 0; i < max_b / 4; i++)
        buf[i] = (float)(rank + 1);
    if (rank == 0) {
        printf("# mpi_allreduce: Open MPI MPI_Allreduce, %d ranks, float32 sum, in place; time_us "
               "= median over iterations of the slowest rank; algbw and busbw in GB/s\n",
               n);
        printf("%12s %12s %8s %6s %12s %8s %8s %10s\n", "size", "count", "type", "redop", "time_us",
               "algbw", "busbw", "cpu_us");
        fflush(stdout);
    }
    for (size_t bytes = min_b; bytes <= max_b; bytes *= fac) {
        int count = (int)(bytes / 4), iters = fixed ? fixed : iters_for(bytes);
        for (int w = 0; w < warm; w++)
            MPI_Allreduce(MPI_IN_PLACE, buf, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        MPI_Barrier(MPI_COMM_WORLD);
        struct timespec c0, c1;
        clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &c0);
        for (int i = 0; i < iters; i++) {
            double t0 = MPI_Wtime();
            MPI_Allreduce(MPI_IN_PLACE, buf, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
            t[i] = MPI_Wtime() - t0;
        }
        clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &c1);
        double cpu = (double)(c1.tv_sec - c0.tv_sec) + (double)(c1.tv_nsec - c0.tv_nsec) * 1e-9,
               cpus;
        MPI_Reduce(&cpu, &cpus, 1, MPI_DOUBLE, MPI_SUM, 0, MPI_COMM_WORLD);
        MPI_Reduce(t, tmax, iters, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
        if (rank == 0) {
            qsort(tmax, (size_t)iters, sizeof *tmax, cmp_double);
            double med = tmax[iters / 2], algbw = (double)bytes / med / 1e9;
            printf("%12zu %12d %8s %6s %12.1f %8.3f %8.3f %10.1f\n", bytes, count, "float32", "sum",
                   med * 1e6, algbw, algbw * 2.0 * (n - 1) / n, cpus * 1e6 / iters);
            fflush(stdout);
        }
    }
    free(buf);
    MPI_Finalize();
    return 0;
}
