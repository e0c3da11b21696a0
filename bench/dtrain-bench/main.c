// dtrain-bench: collective benchmarks in the manner of nccl-tests. It starts its own
// ranks with dt_spawn (one host), so one command is a whole run:
//
//   dtrain-bench allreduce --backend tcp -n 2
//   dtrain-bench allgather --backend shm -n 4 --min 4K --max 16M --factor 64
//   dtrain-bench allreduce --backend hybrid -n 4 --hosts 2   (2 hosts faked by DT_HOST_ID)
//   dtrain-bench allreduce --backend mpi -n 2     (re-executes itself under mpirun)
//
// Collectives: allreduce (in place), broadcast, reduce, allgather, reducescatter, gather,
// scatter, alltoall (out of place), all float32 with sum where they reduce, root 0.
// Prints one comment line, one header line naming the columns and one row per size,
// size in bytes first:
//
//   size  count  type  redop  time_us  algbw  busbw  cpu_us
//
// size: the larger of a rank's input and output (as nccl-tests count it); count: its
// elements. time_us: median over the timed iterations of the slowest rank's time for
// one call (back-to-back blocking calls, each timed on every rank); algbw = size /
// time and busbw = algbw times the collective's factor (nccl-tests': 2(n-1)/n for
// allreduce, (n-1)/n for the gathers, scatters and alltoall, 1 for broadcast and
// reduce), both in GB/s (1e9 bytes per second); cpu_us: the CPU time (user + system,
// every thread) of all ranks' processes together per call, over the timed iterations
// (a link-bound run uses little of it; a CPU-bound one, all it gets).
#include "dtrain/comm.h"

#include <errno.h>
#include <getopt.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef enum coll {
    C_ALLREDUCE,
    C_BROADCAST,
    C_REDUCE,
    C_ALLGATHER,
    C_REDUCESCATTER,
    C_GATHER,
    C_SCATTER,
    C_ALLTOALL,
    C_COUNT,
} coll;

static const char *const coll_names[C_COUNT] = {"allreduce", "broadcast",     "reduce",
                                                "allgather", "reducescatter", "gather",
                                                "scatter",   "alltoall"};

typedef struct args {
    coll        coll;
    const char *backend;
    int         hosts; // > 1: fake this many hosts (DT_HOST_ID), for hybrid
    int         nprocs;
    size_t      min_bytes, max_bytes;
    int         iters; // 0 = by size
    int         warmup;
    int         factor; // size step: min, min*factor, ... up to max
    bool        check;
    bool        bind; // pin rank i to CPU i % online CPUs (as mpirun does by default)
} args;

static size_t parse_size(const char *s, const char *flag) {
    char  *end;
    double v    = strtod(s, &end);
    size_t mult = 1;
    if (*end == 'K' || *end == 'k')
        mult = 1u << 10, end++;
    else if (*end == 'M' || *end == 'm')
        mult = 1u << 20, end++;
    else if (*end == 'G' || *end == 'g')
        mult = 1u << 30, end++;
    if (*end == 'i')
        end++;
    if (*end == 'B')
        end++;
    if (*end || end == s || v * (double)mult < 4) {
        fprintf(stderr, "dtrain-bench: %s expects a size in bytes (4K, 64M, ...), found \"%s\"\n",
                flag, s);
        exit(2);
    }
    return (size_t)(v * (double)mult);
}

static int iters_for(size_t bytes) {
    // Roughly a second of work per size on a small machine, at least 10 samples.
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

// One call of the collective on `bytes` (the larger of input and output) of buffers.
static dt_status run_coll(dt_pg *pg, coll c, float *src, float *dst, size_t bytes) {
    size_t n = (size_t)dt_pg_size(pg), count = bytes / 4, part = count / n;
    switch (c) {
    case C_ALLREDUCE:
        return dt_pg_all_reduce(pg, dst, dst, count, DT_FLOAT32, DT_REDUCE_SUM);
    case C_BROADCAST:
        return dt_pg_broadcast(pg, dst, count, DT_FLOAT32, 0);
    case C_REDUCE:
        return dt_pg_reduce(pg, src, dst, count, DT_FLOAT32, DT_REDUCE_SUM, 0);
    case C_ALLGATHER:
        return dt_pg_all_gather(pg, src, dst, part, DT_FLOAT32);
    case C_REDUCESCATTER:
        return dt_pg_reduce_scatter(pg, src, dst, part, DT_FLOAT32, DT_REDUCE_SUM);
    case C_GATHER:
        return dt_pg_gather(pg, src, dst, part, DT_FLOAT32, 0);
    case C_SCATTER:
        return dt_pg_scatter(pg, src, dst, part, DT_FLOAT32, 0);
    default:
        return dt_pg_all_to_all(pg, src, dst, part, DT_FLOAT32);
    }
}

static double bus_factor(coll c, int n) {
    if (c == C_ALLREDUCE)
        return 2.0 * (n - 1) / n;
    if (c == C_BROADCAST || c == C_REDUCE)
        return 1.0;
    return (double)(n - 1) / n;
}

static int rank_main(int local_rank, void *arg) {
    const args *a = arg;
    if (a->hosts > 1) {
        char host[32];
        snprintf(host, sizeof host, "bench-host-%d", local_rank / (a->nprocs / a->hosts));
        setenv("DT_HOST_ID", host, 1);
        unsetenv("LOCAL_RANK"); // from the host ids, as on real hosts
        unsetenv("LOCAL_WORLD_SIZE");
    }
    if (a->bind) {
        long      ncpu = sysconf(_SC_NPROCESSORS_ONLN);
        cpu_set_t set;
        CPU_ZERO(&set);
        CPU_SET((int)(local_rank % (ncpu > 0 ? ncpu : 1)), &set);
        if (sched_setaffinity(0, sizeof set, &set) != 0)
            fprintf(stderr, "dtrain-bench: rank %d: could not bind to a CPU\n", local_rank);
    }
    dt_pg_opts o = dt_pg_opts_default();
    o.backend    = a->backend;
    o.timeout_ms = 120000;
    dt_pg *pg    = NULL;
    if (dt_pg_new_from_env(&pg, &o) != DT_OK) {
        fprintf(stderr, "dtrain-bench: rank %d: %s\n", local_rank, dt_last_error());
        return 1;
    }
    int     rank = dt_pg_rank(pg), n = dt_pg_size(pg);
    size_t  maxc = a->max_bytes / 4;
    float  *buf = dt_alloc(maxc * sizeof(float)), *src = dt_alloc(maxc * sizeof(float));
    int     cap = 1000;
    double *t   = dt_alloc((size_t)cap * sizeof(double));
    if (!buf || !src || !t) {
        fprintf(stderr, "dtrain-bench: out of memory\n");
        return 1;
    }
    for (size_t i = 0; i < maxc; i++)
        buf[i] = src[i] = (float)(rank + 1);
    if (rank == 0) {
        printf("# dtrain-bench %s: backend %s, %d ranks%s%s, float32%s; time_us = median over "
               "iterations of the slowest rank; algbw and busbw in GB/s\n",
               coll_names[a->coll], dt_pg_backend(pg), n, a->bind ? " bound to CPUs" : "",
               a->hosts > 1 ? " on fake hosts" : "",
               a->coll == C_ALLREDUCE ? " sum, in place" : "");
        printf("%12s %12s %8s %6s %12s %8s %8s %10s\n", "size", "count", "type", "redop", "time_us",
               "algbw", "busbw", "cpu_us");
        fflush(stdout);
    }
    int rc = 0;
    for (size_t bytes = a->min_bytes; bytes <= a->max_bytes; bytes *= (size_t)a->factor) {
        size_t count = bytes / 4;
        int    iters = a->iters ? a->iters : iters_for(bytes);
        if (iters > cap)
            iters = cap;
        for (int w = 0; w < a->warmup; w++)
            if (run_coll(pg, a->coll, src, buf, bytes) != DT_OK)
                goto fail;
        if (a->check && a->coll == C_ALLREDUCE) {
            // Fresh values: every element must be 1 + 2 + ... + n, exactly.
            for (size_t i = 0; i < count; i++)
                buf[i] = (float)(rank + 1);
            if (dt_pg_all_reduce(pg, buf, buf, count, DT_FLOAT32, DT_REDUCE_SUM) != DT_OK)
                goto fail;
            float want = (float)n * (float)(n + 1) / 2;
            for (size_t i = 0; i < count; i++)
                if (buf[i] != want) {
                    fprintf(stderr, "dtrain-bench: rank %d: wrong result at %zu: %g, expected %g\n",
                            rank, i, buf[i], want);
                    rc = 1;
                    break;
                }
        }
        if (dt_pg_barrier(pg) != DT_OK)
            goto fail;
        struct timespec c0, c1;
        clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &c0);
        for (int i = 0; i < iters; i++) {
            uint64_t t0 = dt_now_ns();
            if (run_coll(pg, a->coll, src, buf, bytes) != DT_OK)
                goto fail;
            t[i] = (double)(dt_now_ns() - t0) * 1e-9;
        }
        clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &c1);
        int64_t cpu_ns = (int64_t)(c1.tv_sec - c0.tv_sec) * 1000000000 + (c1.tv_nsec - c0.tv_nsec);
        if (dt_pg_all_reduce(pg, &cpu_ns, &cpu_ns, 1, DT_INT64, DT_REDUCE_SUM) != DT_OK)
            goto fail;
        // The collective is done when its slowest rank is.
        // (Positive doubles order like their bit patterns read as int64.)
        if (dt_pg_all_reduce(pg, t, t, (size_t)iters, DT_INT64, DT_REDUCE_MAX) != DT_OK)
            goto fail;
        if (rank == 0) {
            qsort(t, (size_t)iters, sizeof *t, cmp_double);
            double med   = t[iters / 2];
            double algbw = (double)bytes / med / 1e9;
            double busbw = algbw * bus_factor(a->coll, n);
            printf("%12zu %12zu %8s %6s %12.1f %8.3f %8.3f %10.1f\n", bytes, count, "float32",
                   a->coll == C_ALLREDUCE || a->coll == C_REDUCE || a->coll == C_REDUCESCATTER
                       ? "sum"
                       : "none",
                   med * 1e6, algbw, busbw, (double)cpu_ns * 1e-3 / iters);
            fflush(stdout);
        }
    }
    dt_free(buf);
    dt_free(src);
    dt_free(t);
    dt_pg_free(pg);
    return rc;
fail:
    fprintf(stderr, "dtrain-bench: rank %d: %s\n", rank, dt_last_error());
    dt_pg_free(pg);
    return 1;
}

// MPI ranks must be started by an MPI launcher: re-execute this command under mpirun.
static int run_under_mpirun(int argc, char **argv, int nprocs) {
    char    self[4096], np[16];
    ssize_t k = readlink("/proc/self/exe", self, sizeof self - 1);
    if (k <= 0) {
        perror("dtrain-bench: readlink /proc/self/exe");
        return 1;
    }
    self[k] = '\0';
    snprintf(np, sizeof np, "%d", nprocs);
    char *cmd[128];
    int   n  = 0;
    cmd[n++] = "mpirun";
    if (geteuid() == 0)
        cmd[n++] = "--allow-run-as-root";
    if (nprocs > sysconf(_SC_NPROCESSORS_ONLN))
        cmd[n++] = "--oversubscribe";
    cmd[n++] = "-np";
    cmd[n++] = np;
    cmd[n++] = self;
    for (int i = 1; i < argc && n < 127; i++)
        cmd[n++] = argv[i];
    cmd[n] = NULL;
    fflush(NULL);
    execvp(cmd[0], cmd);
    fprintf(stderr, "dtrain-bench: --backend mpi needs mpirun (apt-get install openmpi-bin): %s\n",
            strerror(errno));
    return 1;
}

static void usage(FILE *f) {
    fprintf(f,
            "usage: dtrain-bench COLLECTIVE [--backend auto|tcp|shm|hybrid|mpi] [-n NPROCS]\n"
            "                    [--hosts H] [--min SIZE] [--max SIZE] [--factor F]\n"
            "                    [--iters N] [--warmup N] [--check] [--bind]\n"
            "  COLLECTIVE: allreduce, broadcast, reduce, allgather, reducescatter, gather,\n"
            "  scatter, alltoall; --hosts H: the ranks pretend to run on H hosts (DT_HOST_ID)\n"
            "  sizes in bytes with K/M/G suffixes; defaults: --backend auto -n 2 --min 4K\n"
            "  --max 64M --factor 2 (each size F times the last) --warmup 5; iterations by\n"
            "  size unless --iters; --bind pins rank i to CPU i (as mpirun does by default)\n"
            "  --backend mpi runs the ranks under mpirun (this program re-executed); started\n"
            "  by a launcher (mpirun, srun, dtrun), each process is one rank and -n is unused\n");
}

int main(int argc, char **argv) {
    int which = -1;
    for (int c = 0; argc >= 2 && c < C_COUNT; c++)
        if (strcmp(argv[1], coll_names[c]) == 0)
            which = c;
    if (which < 0) {
        usage(stderr);
        return 2;
    }
    args                       a      = {.coll      = (coll)which,
                                         .backend   = "auto",
                                         .nprocs    = 2,
                                         .min_bytes = 4u << 10,
                                         .max_bytes = 64u << 20,
                                         .warmup    = 5,
                                         .factor    = 2};
    static const struct option opts[] = {
        {"backend", required_argument, NULL, 'b'}, {"nprocs", required_argument, NULL, 'n'},
        {"min", required_argument, NULL, 'm'},     {"max", required_argument, NULL, 'M'},
        {"iters", required_argument, NULL, 'i'},   {"warmup", required_argument, NULL, 'w'},
        {"check", no_argument, NULL, 'c'},         {"help", no_argument, NULL, 'h'},
        {"bind", no_argument, NULL, 'B'},          {"factor", required_argument, NULL, 'f'},
        {"hosts", required_argument, NULL, 'H'},   {NULL, 0, NULL, 0}};
    int c;
    optind = 2;
    while ((c = getopt_long(argc, argv, "b:n:m:M:i:w:ch", opts, NULL)) != -1) {
        long v;
        switch (c) {
        case 'b':
            a.backend = optarg;
            break;
        case 'n':
            if (dt_parse_long(optarg, 1, 64, "-n", &v) != DT_OK) {
                fprintf(stderr, "dtrain-bench: %s\n", dt_last_error());
                return 2;
            }
            a.nprocs = (int)v;
            break;
        case 'm':
            a.min_bytes = parse_size(optarg, "--min");
            break;
        case 'M':
            a.max_bytes = parse_size(optarg, "--max");
            break;
        case 'i':
            if (dt_parse_long(optarg, 1, 1000, "--iters", &v) != DT_OK) {
                fprintf(stderr, "dtrain-bench: %s\n", dt_last_error());
                return 2;
            }
            a.iters = (int)v;
            break;
        case 'w':
            if (dt_parse_long(optarg, 0, 1000, "--warmup", &v) != DT_OK) {
                fprintf(stderr, "dtrain-bench: %s\n", dt_last_error());
                return 2;
            }
            a.warmup = (int)v;
            break;
        case 'f':
            if (dt_parse_long(optarg, 2, 1024, "--factor", &v) != DT_OK) {
                fprintf(stderr, "dtrain-bench: %s\n", dt_last_error());
                return 2;
            }
            a.factor = (int)v;
            break;
        case 'c':
            a.check = true;
            break;
        case 'H':
            if (dt_parse_long(optarg, 1, 64, "--hosts", &v) != DT_OK) {
                fprintf(stderr, "dtrain-bench: %s\n", dt_last_error());
                return 2;
            }
            a.hosts = (int)v;
            break;
        case 'B':
            a.bind = true;
            break;
        case 'h':
            usage(stdout);
            return 0;
        default:
            usage(stderr);
            return 2;
        }
    }
    if (a.hosts > 1 && a.nprocs % a.hosts != 0) {
        fprintf(stderr, "dtrain-bench: --hosts %d expects -n to be a multiple of it, found %d\n",
                a.hosts, a.nprocs);
        return 2;
    }
    if (a.min_bytes > a.max_bytes) {
        fprintf(stderr, "dtrain-bench: --min %zu is above --max %zu\n", a.min_bytes, a.max_bytes);
        return 2;
    }
    dt_launch_env le;
    if (dt_launch_env_read(&le) == DT_OK && le.launcher != DT_LAUNCHER_NONE)
        return rank_main(le.local_rank, &a); // one rank of a launcher's job
    if (strcmp(a.backend, "mpi") == 0)
        return run_under_mpirun(argc, argv, a.nprocs);
    dt_spawn_result res;
    if (dt_spawn(a.nprocs, rank_main, &a, &res) != DT_OK) {
        fprintf(stderr, "dtrain-bench: %s\n", dt_last_error());
        return 1;
    }
    return 0;
}
