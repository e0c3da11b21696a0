// shm_copy.c: the memory-bandwidth ceiling the shm backend is measured against: how
// fast this machine copies a large buffer, with memcpy and with non-temporal stores,
// in one process and in N processes at once (as N ranks of an all_reduce do).
//
//   make lib && cc -O2 -std=c11 -D_GNU_SOURCE -Iinclude -Isrc bench/shm_copy.c
//       build/release/lib/libdtrain.a -lpthread -o build/bench/shm_copy
//   build/bench/shm_copy [-n 2] [--bytes 64M]
//
// Prints GB/s of bytes copied per process (median of 15 copies) and summed over the
// processes. An all_reduce of B bytes in place must at least read B and write B per
// rank: its bus bandwidth with 2 ranks cannot exceed the per-process copy rate.
#include "comm/reduce.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

// Median GB/s of `reps` copies of nbytes (each process runs this at the same time).
static double copy_rate(unsigned char *dst, const unsigned char *src, size_t nbytes, bool nt,
                        volatile int *go, int nprocs) {
    enum { REPS = 15 };
    double t[REPS];
    __atomic_add_fetch(go, 1, __ATOMIC_SEQ_CST); // start together
    while (__atomic_load_n(go, __ATOMIC_SEQ_CST) < nprocs)
        ;
    for (int r = 0; r < REPS; r++) {
        uint64_t t0 = dt_now_ns();
        dt_copy_nt(dst, src, nbytes, nt);
        if (nt)
            dt_store_fence();
        t[r] = (double)(dt_now_ns() - t0) * 1e-9;
    }
    qsort(t, REPS, sizeof t[0], cmp_double);
    return (double)nbytes / t[REPS / 2] / 1e9;
}

int main(int argc, char **argv) {
    int    nprocs = 2;
    size_t nbytes = (size_t)64 << 20;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "-n") == 0)
            nprocs = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--bytes") == 0)
            nbytes = (size_t)atol(argv[i + 1]) << (strchr(argv[i + 1], 'M') ? 20 : 0);
    }
    if (nprocs < 1 || nprocs > 64 || nbytes < 4096) {
        fprintf(stderr, "usage: shm_copy [-n NPROCS] [--bytes 64M]\n");
        return 2;
    }
    // Shared results and start flags: [0..3] start counters, results from 64 on.
    volatile double *res =
        mmap(NULL, 65536, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (res == MAP_FAILED)
        return 1;
    memset((void *)res, 0, 65536);
    volatile int *go = (volatile int *)(void *)res;
    printf("# shm_copy: %zu MiB buffers, GB/s of bytes copied, median of 15 copies\n",
           nbytes >> 20);
    printf("%-26s %10s %10s\n", "case", "per_proc", "total");
    for (int pass = 0; pass < 4; pass++) {
        int  np = pass < 2 ? 1 : nprocs;
        bool nt = pass & 1;
        for (int p = 0; p < np; p++) {
            if (fork() == 0) {
                unsigned char *src = dt_alloc(nbytes), *dst = dt_alloc(nbytes);
                if (!src || !dst)
                    _exit(1);
                memset(src, 1, nbytes);
                memset(dst, 2, nbytes); // touch: page faults are not part of a copy
                res[64 + p] = copy_rate(dst, src, nbytes, nt, go + pass, np);
                _exit(0);
            }
        }
        while (wait(NULL) > 0) {
        }
        double sum = 0;
        for (int p = 0; p < np; p++)
            sum += res[64 + p];
        char name[64];
        snprintf(name, sizeof name, "%d process%s, %s", np, np > 1 ? "es" : "",
                 nt ? "non-temporal" : "memcpy");
        printf("%-26s %10.2f %10.2f\n", name, sum / np, sum);
        fflush(stdout);
    }
    return 0;
}
