// settings.c: every DT_* environment variable dtrain reads, in one table.
//
// A module asks for a setting by name (dt_setting_int, dt_setting_choice,
// dt_setting_str); the table holds its kind, range, default and one line of help, so
// the range check, the error message and `--help-env` come from one place. A DT_*
// variable that is set but not in the table is reported once, with the nearest known
// name: a mistyped DT_TIMOUT_MS would otherwise be silently ignored.
#include "dtrain/core.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MS_DAY (24L * 3600 * 1000)

// Sorted by module, then name. Defaults of 0 that mean "automatic" say so in the help.
static const dt_setting table[] = {
    // core
    {"DT_LOG_LEVEL", "core", DT_SETTING_CHOICE, 0, 0, 2, "debug|info|warn|error|off", "log level"},
    {"DT_FAIL_ALLOC_AFTER", "core", DT_SETTING_INT, -1, 1L << 40, -1, NULL,
     "tests: the allocation after this many fails (-1: never)"},
    // device
    {"DT_CUDA_GRAPH", "device", DT_SETTING_CHOICE, 0, 0, 0, "auto|0|1",
     "capture a training step as a CUDA graph and replay it (auto: when the shapes repeat)"},
    {"DT_CUDA_PLUGIN", "device", DT_SETTING_STRING, 0, 0, 0, NULL,
     "path of libdtrain_cuda.so, the CUDA plugin (default: beside the program's library, "
     "then the loader's path)"},
    {"DT_CUDA_TIMEOUT_MS", "device", DT_SETTING_INT, 1, 100 * MS_DAY, 10L * 60 * 1000, NULL,
     "bound of every wait for a GPU (a stream, an event, the device)"},
    // nn
    {"DT_ISA", "nn", DT_SETTING_CHOICE, 0, 0, 0, "auto|ref|avx2|avx512|avx512bf16|amx|neon",
     "caps the CPU kernel targets at this level and those below it (auto: the best the CPU "
     "has); ref is portable C alone"},
    {"DT_CONV", "nn", DT_SETTING_CHOICE, 0, 0, 0, "auto|direct|gemm",
     "convolution kernels: dtrain's shifted GEMMs (direct) or im2col and the GEMM (gemm); auto "
     "picks direct where the CPU has AVX2 or AVX-512"},
    {"DT_CONV_CL", "nn", DT_SETTING_CHOICE, 0, 0, 0, "auto|0|1",
     "new layers' convolutions: channels-in-lanes AVX-512 kernels where measured faster "
     "(auto), never (0), or also for rows wider than 14 (1)"},
    {"DT_CONV_DNNL", "nn", DT_SETTING_CHOICE, 0, 0, 1, "0|1",
     "oneDNN's convolutions, where dtrain was built with it: never (0), or on the shapes "
     "measured faster (1, the default)"},
    {"DT_CONV_WINO", "nn", DT_SETTING_CHOICE, 0, 0, 0, "auto|0|1",
     "Winograd F(2x2,3x3) for stride-1 3x3 convolutions: where it pays (auto), never (0), "
     "wherever it fits (1)"},
    {"DT_CONV_WINO_DW", "nn", DT_SETTING_CHOICE, 0, 0, 0, "auto|0|1",
     "Winograd F(2x2,3x3) for the weight gradient of stride-1 3x3 convolutions: where it "
     "pays (auto), never (0), wherever it fits (1); DT_CONV_WINO=0 turns it off too"},
    {"DT_CONV_2ROWS", "nn", DT_SETTING_CHOICE, 0, 0, 0, "auto|0",
     "7-wide stride-2 convolutions two output rows at a time (auto) or one (0)"},
    {"DT_PRECISION_PATH", "nn", DT_SETTING_STRING, 0, 0, 0, NULL,
     "16-bit matrix products: auto (AVX512-BF16 where the CPU has it, else fp32), "
     "avx512bf16, amx (opt-in: never run on real tiles yet) or fp32 (the fallback)"},
    {"DT_NO_POOL_FUSION", "nn", DT_SETTING_INT, 0, 1, 0, NULL,
     "1: keep 2x2 max pools out of the convolution before them (the graph's fusion pass)"},
    // data
    {"DT_DATA_DIR", "data", DT_SETTING_STRING, 0, 0, 0, NULL,
     "folder of MNIST-format files read when a program gives none (the examples: else "
     "/usr/share/datasets/fashion-mnist)"},
    // comm: stores, groups and launching
    {"DT_TIMEOUT_MS", "comm", DT_SETTING_INT, -1, 100 * MS_DAY, 30L * 60 * 1000, NULL,
     "bound of every store and collective wait (-1: none, 0: the default 30 min)"},
    {"DT_JOB_TOKEN", "comm", DT_SETTING_STRING, 0, 0, 0, NULL,
     "job token: only processes that know it join the job's store and peer connections"},
    {"DT_HOST_ID", "comm", DT_SETTING_STRING, 0, 0, 0, NULL,
     "overrides this host's identity (tests use it to fake several hosts)"},
    {"DT_ELASTIC", "comm", DT_SETTING_STRING, 0, 0, 0, NULL,
     "elastic membership, MIN:MAX workers (dtrun --nnodes MIN:MAX sets it): the trainer "
     "forms its group through the rendezvous store at MASTER_ADDR:MASTER_PORT and regroups "
     "at a step boundary when a worker dies or joins"},
    {"DT_ELASTIC_TIMEOUT_MS", "comm", DT_SETTING_INT, 1, 100 * MS_DAY, 600L * 1000, NULL,
     "elastic membership: how long a regrouping waits for MIN workers (dtrun's --rdzv-timeout)"},
    {"DT_ELASTIC_SETTLE_MS", "comm", DT_SETTING_INT, 0, 3600L * 1000, 300, NULL,
     "elastic membership: a regrouping closes when no worker arrived for this long (and MIN "
     "have), or at once when MAX have"},
    {"DT_SPAWN_GRACE_MS", "comm", DT_SETTING_INT, 0, 3600L * 1000, 3000, NULL,
     "dt_spawn: milliseconds between SIGTERM and SIGKILL when stopping workers"},
    {"DT_SPAWN_TERM_GRACE_MS", "comm", DT_SETTING_INT, 0, 3600L * 1000, 30000, NULL,
     "dt_spawn: after a SIGTERM forwarded to the workers (a preemption notice), how long they "
     "get to reach a step boundary and save before SIGKILL"},
    {"DT_MAX_LOCAL_PROCS", "comm", DT_SETTING_INT, 0, 4096, 0, NULL,
     "dt_spawn: local processes allowed (0: 4 per online CPU, at most 256; beyond, the "
     "workers only time-share the cores and the shm segment grows with the square)"},
    {"DT_STORE_AUTH_MS", "comm", DT_SETTING_INT, 1, 3600L * 1000, 10000, NULL,
     "store server: a client must prove the job token within this time"},
    {"DT_HEARTBEAT_MS", "comm", DT_SETTING_INT, 10, 24L * 3600 * 1000, 500, NULL,
     "liveness: interval of the peer-to-peer heartbeats"},
    {"DT_LIVENESS_MS", "comm", DT_SETTING_INT, 0, 24L * 3600 * 1000, 5000, NULL,
     "liveness: a peer silent (or a rank without progress) this long fails the group (0: off; "
     "else at least twice DT_HEARTBEAT_MS)"},
    {"DT_WAIT_NOTICE_MS", "comm", DT_SETTING_INT, 10, 3600L * 1000, 10000, NULL,
     "start-up: a rank that waits for others says this often whom it waits for and how much "
     "longer it will wait"},
    {"DT_RESTART_COUNT", "comm", DT_SETTING_INT, 0, 1L << 30, 0, NULL,
     "set by dtrun: restarts of the group so far"},
    // comm: algorithms
    {"DT_ALLGATHER_ALGO", "comm", DT_SETTING_CHOICE, 0, 0, 0, "auto|native|shm|ring",
     "all_gather algorithm, on every backend that offers it (auto: the table in "
     "docs/comm.md)"},
    {"DT_ALLREDUCE_ALGO", "comm", DT_SETTING_CHOICE, 0, 0, 0, "auto|native|hier|shm|rdouble|ring",
     "all_reduce algorithm, on every backend that offers it (auto: by size, world and "
     "backend)"},
    {"DT_ALLTOALL_ALGO", "comm", DT_SETTING_CHOICE, 0, 0, 0, "auto|native|shm|pairwise",
     "all_to_all algorithm"},
    {"DT_BARRIER_ALGO", "comm", DT_SETTING_CHOICE, 0, 0, 0, "auto|native|shm|dissemination",
     "barrier algorithm"},
    {"DT_BROADCAST_ALGO", "comm", DT_SETTING_CHOICE, 0, 0, 0, "auto|native|hier|shm|tree|chain",
     "broadcast algorithm"},
    {"DT_GATHER_ALGO", "comm", DT_SETTING_CHOICE, 0, 0, 0, "auto|native|shm|direct",
     "gather algorithm"},
    {"DT_REDUCESCATTER_ALGO", "comm", DT_SETTING_CHOICE, 0, 0, 0, "auto|native|shm|ring",
     "reduce_scatter algorithm"},
    {"DT_REDUCE_ALGO", "comm", DT_SETTING_CHOICE, 0, 0, 0, "auto|native|shm|tree|ring",
     "reduce algorithm"},
    {"DT_SCATTER_ALGO", "comm", DT_SETTING_CHOICE, 0, 0, 0, "auto|native|shm|direct",
     "scatter algorithm"},
    {"DT_SEGMENT_BYTES", "comm", DT_SETTING_INT, 8, 1L << 30, 1L << 20, NULL,
     "ring and chain segment size"},
    {"DT_SMALL_BYTES", "comm", DT_SETTING_INT, 0, 1L << 30, 64L << 10, NULL,
     "below this size the latency algorithms run (recursive doubling, trees)"},
    {"DT_RING_LAG", "comm", DT_SETTING_INT, 0, 1L << 30, 2, NULL,
     "ring wire order: segments of one step sent before the next step's first"},
    {"DT_HYBRID_MIN_BYTES", "comm", DT_SETTING_INT, 0, 1L << 40, 256L << 10, NULL,
     "hybrid backend: all_reduce from this size runs hierarchically (shm, tcp, shm)"},
    {"DT_HYBRID_BCAST_MIN_BYTES", "comm", DT_SETTING_INT, 0, 1L << 40, 1L << 20, NULL,
     "hybrid backend: broadcast from this size runs in two levels (tcp, then shm)"},
    // comm: tcp
    {"DT_TCP_CHUNK_BYTES", "comm", DT_SETTING_INT, 4096, 1L << 30, 128L << 10, NULL,
     "tcp: bytes per send or receive call"},
    {"DT_TCP_SPIN_US", "comm", DT_SETTING_INT, 0, 1000000, 0, NULL,
     "tcp: busy wait before sleeping in poll"},
    {"DT_TCP_CONGESTION", "comm", DT_SETTING_STRING, 0, 0, 0, NULL,
     "tcp: congestion control of every connection (default: the system's, reno instead of "
     "bbr between ranks of one host)"},
    {"DT_SOCKET_BUF_BYTES", "comm", DT_SETTING_INT, 0, 1L << 30, 0, NULL,
     "socket buffer sizes (0: the kernel's autotuning)"},
    {"DT_SOCKET_IFADDR", "comm", DT_SETTING_STRING, 0, 0, 0, NULL,
     "the address this rank publishes for its peers (default: the interface towards "
     "MASTER_ADDR)"},
    // comm: shm
    {"DT_SHM_CHUNK_BYTES", "comm", DT_SETTING_INT, 0, 1L << 40, 0, NULL,
     "shm: bytes per working buffer, the pipeline chunk (0: 1 MiB, less for large worlds)"},
    {"DT_SHM_SMALL_BYTES", "comm", DT_SETTING_INT, 0, 1L << 40, 0, NULL,
     "shm: all_reduce up to this x 2 / world uses one synchronisation (0: 64 KiB)"},
    {"DT_SHM_NT_KIB", "comm", DT_SETTING_INT, 0, 1L << 30, 0, NULL,
     "shm: results at least this large (KiB) are written with non-temporal stores (0: never)"},
    {"DT_SHM_SPIN_US", "comm", DT_SETTING_INT, 0, 1000000, 1000, NULL,
     "shm: spin and yield this long before sleeping on the futex"},
    {"DT_SHM_YIELD_AFTER_US", "comm", DT_SETTING_INT, -1, 1000000, -1, NULL,
     "shm: pure spinning before yielding (-1: 50, or 0 with more ranks than CPUs)"},
    // comm: mpi
    {"DT_MPI_WAIT", "comm", DT_SETTING_CHOICE, 0, 0, 0, "block|poll",
     "mpi: blocking MPI calls and a watchdog, or non-blocking calls tested in a loop"},
    {"DT_MPI_FINGERPRINT", "comm", DT_SETTING_CHOICE, 0, 0, 0, "on|off",
     "mpi: check that ranks call the same collective"},
    {"DT_MPI_CHUNK_COUNT", "comm", DT_SETTING_INT, 1, 2147483647L, 1L << 30, NULL,
     "mpi: elements per MPI call (tests use small values)"},
};

#define NSETTINGS (sizeof table / sizeof table[0])

const dt_setting *dt_settings(size_t *n) {
    *n = NSETTINGS;
    return table;
}

const dt_setting *dt_setting_find(const char *name) {
    for (size_t i = 0; i < NSETTINGS; i++)
        if (strcmp(table[i].name, name) == 0)
            return &table[i];
    return NULL;
}

// A name missing from the table is a bug in dtrain, not the user's: say so loudly.
static const dt_setting *must_find(const char *name, dt_setting_kind kind) {
    const dt_setting *s = dt_setting_find(name);
    if (!s || s->kind != kind) {
        fprintf(stderr, "dtrain: internal error: setting %s is not in the table as a %s\n", name,
                kind == DT_SETTING_INT      ? "number"
                : kind == DT_SETTING_CHOICE ? "choice"
                                            : "string");
        abort();
    }
    return s;
}

dt_status dt_setting_int(const char *name, long *out) {
    const dt_setting *s = must_find(name, DT_SETTING_INT);
    return dt_env_int(s->name, s->lo, s->hi, s->def, out);
}

// Choice i of "a|b|c" into buf; false when there is none.
static bool choice_at(const char *choices, int i, char *buf, size_t n) {
    const char *p = choices;
    for (; i > 0 && p; i--) {
        p = strchr(p, '|');
        if (p)
            p++;
    }
    if (!p)
        return false;
    size_t len = strcspn(p, "|");
    if (len >= n)
        len = n - 1;
    memcpy(buf, p, len);
    buf[len] = '\0';
    return true;
}

dt_status dt_setting_choice(const char *name, int *out) {
    const dt_setting *s = must_find(name, DT_SETTING_CHOICE);
    *out                = (int)s->def;
    const char *v       = getenv(name);
    if (!v || !*v)
        return DT_OK;
    char c[64];
    for (int i = 0; choice_at(s->choices, i, c, sizeof c); i++)
        if (strcasecmp(v, c) == 0) {
            *out = i;
            return DT_OK;
        }
    return dt_fail(DT_ERR_ARG, "environment variable %s expects one of %s, found \"%s\"", name,
                   s->choices, v);
}

const char *dt_setting_str(const char *name) {
    const dt_setting *s = must_find(name, DT_SETTING_STRING);
    const char       *v = getenv(s->name);
    return v && *v ? v : NULL;
}

// Edit distance, bounded to short names (settings are under 32 characters).
static int distance(const char *a, const char *b) {
    size_t la = strlen(a), lb = strlen(b);
    if (la > 63 || lb > 63)
        return 99;
    int row[64];
    for (size_t j = 0; j <= lb; j++)
        row[j] = (int)j;
    for (size_t i = 1; i <= la; i++) {
        int diag = row[0];
        row[0]   = (int)i;
        for (size_t j = 1; j <= lb; j++) {
            int up   = row[j];
            int cost = a[i - 1] == b[j - 1] ? 0 : 1;
            int best = diag + cost;
            if (row[j] + 1 < best)
                best = row[j] + 1;
            if (row[j - 1] + 1 < best)
                best = row[j - 1] + 1;
            row[j] = best;
            diag   = up;
        }
    }
    return row[lb];
}

// Variables that are DT_-prefixed but not settings of the library: the test suite's
// own and those of programs built on it.
static bool foreign(const char *name) {
    return strncmp(name, "DT_TEST_", 8) == 0 || strncmp(name, "DTRUN_", 6) == 0;
}

size_t dt_settings_check_unknown(char *msg, size_t n) {
    extern char **environ;
    size_t        found = 0, off = 0;
    if (n)
        msg[0] = '\0';
    for (char **e = environ; e && *e; e++) {
        if (strncmp(*e, "DT_", 3) != 0)
            continue;
        char   name[64];
        size_t len = strcspn(*e, "=");
        if (len >= sizeof name)
            len = sizeof name - 1;
        memcpy(name, *e, len);
        name[len] = '\0';
        if (dt_setting_find(name) || foreign(name))
            continue;
        const char *best = NULL;
        int         bd   = 4; // suggest only close names
        for (size_t i = 0; i < NSETTINGS; i++) {
            int d = distance(name, table[i].name);
            if (d < bd) {
                bd   = d;
                best = table[i].name;
            }
        }
        found++;
        if (off < n) {
            int w = best ? snprintf(msg + off, n - off,
                                    "%s%s is not a dtrain setting (did you "
                                    "mean %s?)",
                                    off ? "; " : "", name, best)
                         : snprintf(msg + off, n - off, "%s%s is not a dtrain setting",
                                    off ? "; " : "", name);
            off += w > 0 ? (size_t)w : 0;
        }
    }
    return found;
}

void dt_settings_print(FILE *f) {
    const char *module = "";
    for (size_t i = 0; i < NSETTINGS; i++) {
        const dt_setting *s = &table[i];
        if (strcmp(module, s->module) != 0) {
            module = s->module;
            fprintf(f, "%s%s:\n", i ? "\n" : "", module);
        }
        char dflt[64], range[96];
        switch (s->kind) {
        case DT_SETTING_INT:
            snprintf(dflt, sizeof dflt, "%ld", s->def);
            snprintf(range, sizeof range, "%ld..%ld", s->lo, s->hi);
            break;
        case DT_SETTING_CHOICE:
            choice_at(s->choices, (int)s->def, dflt, sizeof dflt);
            snprintf(range, sizeof range, "%s", s->choices);
            break;
        default:
            snprintf(dflt, sizeof dflt, "unset");
            snprintf(range, sizeof range, "text");
            break;
        }
        const char *now = getenv(s->name);
        fprintf(f, "  %-22s %s (default %s; %s)%s%s%s\n", s->name, s->help, dflt, range,
                now ? " [set: " : "", now ? now : "", now ? "]" : "");
    }
}
