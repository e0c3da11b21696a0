// test_shm_engine.c: the shared-memory engine on its own (no store, no process group),
// as the algorithm layer's transport (its segment and its channels' transfer slots):
// world sizes 1-5 as forked processes, every collective and send/recv against a serial
// reference on fresh pseudo-random data, every dtype and reduce op, in place and out of
// place, multi-chunk paths through a small chunk size, and the point-to-point
// algorithms over the channels; and the failure paths: a rank killed with SIGKILL,
// mismatched collectives, timeouts, a rank that left, bad arguments, a segment of
// another world size, nothing left behind in /dev/shm.
#include "../check.h"
#include "comm/algo/algo.h"
#include "comm/shm/shm.h"

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

// ----------------------------------------------------------------- forked worlds

typedef struct world_cfg {
    int     world;
    size_t  chunk_bytes; // 0: default
    int     kill_rank;   // >= 0: the parent SIGKILLs this rank after kill_after_ms
    int     kill_after_ms;
    int     skip_init; // this rank (>= 0) does not init (attach tests); -1 none
    int     bad_world; // this rank (>= 0) claims world + 1; -1 none
    int64_t init_timeout_ms;
} world_cfg;

// One rank's engine and its operation counters (what the process group keeps).
typedef struct tctx {
    dt_shm     *s;
    dt_xport    x;   // the segment and the channels' transfer slots
    dt_algo_cfg cfg; // DT_*_ALGO as the environment says
    int         me, world;
    uint64_t    seq;     // collectives, from 1
    uint64_t    sent[8]; // messages per peer, from 1
    uint64_t    recvd[8];
} tctx;

typedef void (*rank_fn)(tctx *t, int rank, int world, void *arg);

// Written by the parent before it kills a rank, read by the survivors.
static volatile uint64_t *shared_kill_ns;
static char               seg_name[64];
static int                seg_counter;

// Runs fn on `world` forked ranks; each rank's check counts come back through a pipe
// and join this process's. A run past 90 s is killed and counted as a failure.
static void run_world(const world_cfg *cfg, rank_fn fn, void *arg) {
    snprintf(seg_name, sizeof seg_name, "/dtrain-test-%d-%d", (int)getpid(), ++seg_counter);
    int   world = cfg->world;
    pid_t pids[8];
    int   fds[8];
    *shared_kill_ns = 0;
    fflush(stdout);
    fflush(stderr);
    for (int r = 0; r < world; r++) {
        int p[2];
        DT_ASSERT(pipe(p) == 0);
        pid_t pid = fork();
        DT_ASSERT(pid >= 0);
        if (pid == 0) {
            close(p[0]);
            check_passed = check_failed = 0;
            if (r != cfg->skip_init) {
                dt_shm_opts o  = {.rank        = r,
                                  .world       = r == cfg->bad_world ? world + 1 : world,
                                  .name        = seg_name,
                                  .chunk_bytes = cfg->chunk_bytes,
                                  .deadline_ns = dt_deadline_ns(
                                      cfg->init_timeout_ms ? cfg->init_timeout_ms : 20000)};
                tctx        t  = {.me = r, .world = world};
                dt_status   st = dt_shm_init(&o, &t.s);
                t.x            = (dt_xport){.rank      = r,
                                            .world     = world,
                                            .seg       = t.s,
                                            .xfer_post = dt_shm_xfer_post,
                                            .xfer_wait = dt_shm_xfer_wait,
                                            .xfer_ctx  = t.s};
                CHECK_OK(dt_algo_cfg_init(&t.cfg));
                fn(&t, r, world, arg);
                dt_algo_cfg_free(&t.cfg);
                if (st != DT_OK && !arg)
                    fprintf(stderr, "rank %d: init failed: %s\n", r, dt_last_error());
                dt_shm_free(t.s);
            }
            char line[64];
            int  n = snprintf(line, sizeof line, "%d %d\n", check_passed, check_failed);
            if (write(p[1], line, (size_t)n) != n)
                _exit(3);
            _exit(0);
        }
        close(p[1]);
        pids[r] = pid;
        fds[r]  = p[0];
    }
    if (cfg->kill_rank >= 0) {
        usleep((useconds_t)cfg->kill_after_ms * 1000);
        *shared_kill_ns = dt_now_ns();
        kill(pids[cfg->kill_rank], SIGKILL);
    }
    uint64_t deadline = dt_deadline_ns(90000);
    for (int r = 0; r < world; r++) {
        char          buf[64] = {0};
        size_t        got     = 0;
        struct pollfd pfd     = {.fd = fds[r], .events = POLLIN};
        while (got < sizeof buf - 1) {
            int left = dt_ms_left(deadline);
            if (left <= 0 || poll(&pfd, 1, left) <= 0)
                break;
            ssize_t n = read(fds[r], buf + got, sizeof buf - 1 - got);
            if (n <= 0)
                break;
            got += (size_t)n;
        }
        close(fds[r]);
        int p = 0, f = 0;
        if (r == cfg->kill_rank) {
            // killed on purpose: no report expected
        } else if (sscanf(buf, "%d %d", &p, &f) == 2) {
            check_passed += p;
            check_failed += f;
        } else {
            check_report(0, "rank reported its results before the deadline", __FILE__, __LINE__);
            fprintf(stderr, "     rank %d of %d sent \"%s\"\n", r, world, buf);
        }
    }
    for (int r = 0; r < world; r++) {
        int status = 0;
        if (dt_ms_left(deadline) <= 0)
            kill(pids[r], SIGKILL);
        waitpid(pids[r], &status, 0);
        if (r != cfg->kill_rank && !(WIFEXITED(status) && WEXITSTATUS(status) == 0)) {
            check_report(0, "rank exited cleanly", __FILE__, __LINE__);
            fprintf(stderr, "     rank %d: status 0x%x\n", r, status);
        }
    }
    // Whatever happened, the segment's name is gone.
    char path[128];
    snprintf(path, sizeof path, "/dev/shm%s", seg_name);
    struct stat st;
    if (!CHECK(stat(path, &st) != 0 && errno == ENOENT)) {
        fprintf(stderr, "     %s was left behind\n", path);
        unlink(path);
    }
}

// --------------------------------------------------------------- data and reference

static uint64_t mix(uint64_t x) {
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

// Element i of rank r's input in case `seed`: floats in [-2, 2) with 24 bits, or
// arbitrary 32/64-bit integers (sums and products overflow and wrap).
static void gen(void *buf, size_t count, dt_dtype dt, uint64_t seed, int r, size_t first) {
    uint64_t key = mix(seed * 1000003u + (uint64_t)r);
    for (size_t i = 0; i < count; i++) {
        uint64_t h = mix(key ^ (first + i));
        if (dt == DT_FLOAT32)
            ((float *)buf)[i] = (float)(h >> 40) / 16777216.0f * 4.0f - 2.0f;
        else if (dt == DT_INT32)
            ((int32_t *)buf)[i] = (int32_t)(uint32_t)h;
        else
            ((int64_t *)buf)[i] = (int64_t)h;
    }
}

// The serial reduction, rank 0 first, written independently of the kernels.
static void ref_reduce(void *out, size_t count, dt_dtype dt, dt_reduce_op op, uint64_t seed,
                       int world, size_t first) {
    size_t es  = dt_dtype_size(dt);
    void  *tmp = dt_alloc(count * es + 8);
    gen(out, count, dt, seed, 0, first);
    for (int r = 1; r < world; r++) {
        gen(tmp, count, dt, seed, r, first);
        for (size_t i = 0; i < count; i++) {
            if (dt == DT_FLOAT32) {
                float a = ((float *)out)[i], b = ((float *)tmp)[i], v;
                switch (op) {
                case DT_REDUCE_MAX:
                    v = a > b ? a : b;
                    break;
                case DT_REDUCE_MIN:
                    v = a < b ? a : b;
                    break;
                case DT_REDUCE_PROD:
                    v = a * b;
                    break;
                default:
                    v = a + b;
                }
                ((float *)out)[i] = v;
            } else if (dt == DT_INT32) {
                int32_t a = ((int32_t *)out)[i], b = ((int32_t *)tmp)[i], v;
                switch (op) {
                case DT_REDUCE_MAX:
                    v = a > b ? a : b;
                    break;
                case DT_REDUCE_MIN:
                    v = a < b ? a : b;
                    break;
                case DT_REDUCE_PROD:
                    v = (int32_t)((uint32_t)a * (uint32_t)b);
                    break;
                default:
                    v = (int32_t)((uint32_t)a + (uint32_t)b);
                }
                ((int32_t *)out)[i] = v;
            } else {
                int64_t a = ((int64_t *)out)[i], b = ((int64_t *)tmp)[i], v;
                switch (op) {
                case DT_REDUCE_MAX:
                    v = a > b ? a : b;
                    break;
                case DT_REDUCE_MIN:
                    v = a < b ? a : b;
                    break;
                case DT_REDUCE_PROD:
                    v = (int64_t)((uint64_t)a * (uint64_t)b);
                    break;
                default:
                    v = (int64_t)((uint64_t)a + (uint64_t)b);
                }
                ((int64_t *)out)[i] = v;
            }
        }
    }
    if (op == DT_REDUCE_AVG && world > 1)
        for (size_t i = 0; i < count; i++) {
            if (dt == DT_FLOAT32)
                ((float *)out)[i] /= (float)world;
            else if (dt == DT_INT32)
                ((int32_t *)out)[i] /= world;
            else
                ((int64_t *)out)[i] /= world;
        }
    dt_free(tmp);
}

// Bitwise comparison (the engine promises identical bits); reports the first difference.
static int same(const void *got, const void *want, size_t nbytes, const char *what, int rank,
                size_t count) {
    if (memcmp(got, want, nbytes) == 0)
        return check_report(1, what, __FILE__, __LINE__);
    size_t i = 0;
    while (((const unsigned char *)got)[i] == ((const unsigned char *)want)[i])
        i++;
    check_report(0, what, __FILE__, __LINE__);
    fprintf(stderr, "     rank %d, count %zu: first difference at byte %zu\n", rank, count, i);
    return 0;
}

static const size_t counts[] = {0, 1, 7, 100003};

#ifdef DT_SANITIZE
#define BIG_COUNT (((size_t)1 << 20) + 3) // sanitizers are 5-20x slower
#else
#define BIG_COUNT ((size_t)16 << 20) // 16 Mi elements
#endif

static uint64_t deadline(void) {
    return dt_deadline_ns(30000);
}

// The dt_op the process group would build: fingerprint, name, buffers.
static dt_status run_op(tctx *t, dt_coll kind, const void *src, void *dst, size_t count,
                        dt_dtype dt, dt_reduce_op rop, int root, int peer, int tag,
                        uint64_t deadline_ns) {
    dt_op op = {.kind        = kind,
                .src         = src,
                .dst         = dst,
                .count       = count,
                .dtype       = dt,
                .op          = rop,
                .root        = root,
                .peer        = peer,
                .tag         = tag,
                .deadline_ns = deadline_ns};
    bool  reducing =
        kind == DT_COLL_ALL_REDUCE || kind == DT_COLL_REDUCE || kind == DT_COLL_REDUCE_SCATTER;
    if (!reducing)
        op.op = DT_REDUCE_SUM;
    op.fp.coll  = (uint8_t)kind;
    op.fp.dtype = (uint8_t)dt;
    op.fp.op    = reducing ? (uint8_t)rop : 0;
    op.fp.count = count;
    op.fp.root  = root;
    if (kind == DT_COLL_SEND || kind == DT_COLL_RECV) {
        op.fp.seq  = kind == DT_COLL_SEND ? ++t->sent[peer & 7] : ++t->recvd[peer & 7];
        op.fp.root = tag;
        snprintf(op.name, sizeof op.name, "%s #%llu %s rank %d",
                 kind == DT_COLL_SEND ? "send" : "recv", (unsigned long long)op.fp.seq,
                 kind == DT_COLL_SEND ? "to" : "from", peer);
    } else {
        op.fp.seq                        = ++t->seq;
        static const char *const names[] = {"all_reduce", "broadcast",      "reduce",
                                            "all_gather", "reduce_scatter", "gather",
                                            "scatter",    "all_to_all",     "barrier"};
        snprintf(op.name, sizeof op.name, "%s #%llu", names[kind], (unsigned long long)op.fp.seq);
    }
    return dt_algo_run(&t->x, &t->cfg, &op);
}

static dt_status t_all_reduce(tctx *t, const void *src, void *dst, size_t n, dt_dtype dt,
                              dt_reduce_op op, uint64_t dl) {
    return run_op(t, DT_COLL_ALL_REDUCE, src, dst, n, dt, op, -1, -1, 0, dl);
}
static dt_status t_reduce(tctx *t, const void *src, void *dst, size_t n, dt_dtype dt,
                          dt_reduce_op op, int root, uint64_t dl) {
    return run_op(t, DT_COLL_REDUCE, src, dst, n, dt, op, root, -1, 0, dl);
}
static dt_status t_reduce_scatter(tctx *t, const void *src, void *dst, size_t n, dt_dtype dt,
                                  dt_reduce_op op, uint64_t dl) {
    return run_op(t, DT_COLL_REDUCE_SCATTER, src, dst, n, dt, op, -1, -1, 0, dl);
}
static dt_status t_broadcast(tctx *t, void *buf, size_t n, dt_dtype dt, int root, uint64_t dl) {
    return run_op(t, DT_COLL_BROADCAST, buf, buf, n, dt, 0, root, -1, 0, dl);
}
static dt_status t_all_gather(tctx *t, const void *src, void *dst, size_t n, dt_dtype dt,
                              uint64_t dl) {
    return run_op(t, DT_COLL_ALL_GATHER, src, dst, n, dt, 0, -1, -1, 0, dl);
}
static dt_status t_gather(tctx *t, const void *src, void *dst, size_t n, dt_dtype dt, int root,
                          uint64_t dl) {
    return run_op(t, DT_COLL_GATHER, src, dst, n, dt, 0, root, -1, 0, dl);
}
static dt_status t_scatter(tctx *t, const void *src, void *dst, size_t n, dt_dtype dt, int root,
                           uint64_t dl) {
    return run_op(t, DT_COLL_SCATTER, src, dst, n, dt, 0, root, -1, 0, dl);
}
static dt_status t_all_to_all(tctx *t, const void *src, void *dst, size_t n, dt_dtype dt,
                              uint64_t dl) {
    return run_op(t, DT_COLL_ALL_TO_ALL, src, dst, n, dt, 0, -1, -1, 0, dl);
}
static dt_status t_barrier(tctx *t, uint64_t dl) {
    return run_op(t, DT_COLL_BARRIER, NULL, NULL, 0, DT_FLOAT32, 0, -1, -1, 0, dl);
}
static dt_status t_send(tctx *t, const void *buf, size_t n, dt_dtype dt, int peer, int tag,
                        uint64_t dl) {
    return run_op(t, DT_COLL_SEND, buf, NULL, n, dt, 0, -1, peer, tag, dl);
}
static dt_status t_recv(tctx *t, void *buf, size_t n, dt_dtype dt, int peer, int tag, uint64_t dl) {
    return run_op(t, DT_COLL_RECV, NULL, buf, n, dt, 0, -1, peer, tag, dl);
}

// ------------------------------------------------------------------- collectives

typedef struct coll_arg {
    int big;     // also run 16 Mi float sums
    int all_ops; // every dtype x op (else float sum/max only)
} coll_arg;

static void body_reductions(tctx *t, int me, int world, const coll_arg *a) {
    for (int dt = 0; dt < DT_DTYPE_COUNT_; dt++) {
        for (int op = 0; op < DT_REDUCE_COUNT_; op++) {
            if (!a->all_ops && (dt != DT_FLOAT32 || (op != DT_REDUCE_SUM && op != DT_REDUCE_MAX)))
                continue;
            size_t es = dt_dtype_size((dt_dtype)dt);
            for (size_t ci = 0; ci < sizeof counts / sizeof counts[0]; ci++) {
                size_t   n    = counts[ci];
                uint64_t seed = (uint64_t)(dt * 100 + op * 10) + ci;
                void    *in   = dt_alloc(n * es * (size_t)world + 64);
                void    *out  = dt_alloc(n * es * (size_t)world + 64);
                void    *want = dt_alloc(n * es * (size_t)world + 64);
                ref_reduce(want, n, (dt_dtype)dt, (dt_reduce_op)op, seed, world, 0);
                // all_reduce out of place, then in place
                gen(in, n, (dt_dtype)dt, seed, me, 0);
                CHECK_OK(t_all_reduce(t, in, out, n, (dt_dtype)dt, (dt_reduce_op)op, deadline()));
                same(out, want, n * es, "all_reduce", me, n);
                CHECK_OK(t_all_reduce(t, in, in, n, (dt_dtype)dt, (dt_reduce_op)op, deadline()));
                same(in, want, n * es, "all_reduce in place", me, n);
                // reduce to a root that moves with the case
                int root = (int)(ci + (size_t)op) % world;
                gen(in, n, (dt_dtype)dt, seed, me, 0);
                memset(out, 0xAB, n * es);
                CHECK_OK(t_reduce(t, in, out, n, (dt_dtype)dt, (dt_reduce_op)op, root, deadline()));
                if (me == root)
                    same(out, want, n * es, "reduce", me, n);
                // reduce_scatter: rank r's result is block r of the reduction of everyone's input
                gen(in, n * (size_t)world, (dt_dtype)dt, seed + 7, me, 0);
                CHECK_OK(
                    t_reduce_scatter(t, in, out, n, (dt_dtype)dt, (dt_reduce_op)op, deadline()));
                ref_reduce(want, n, (dt_dtype)dt, (dt_reduce_op)op, seed + 7, world,
                           (size_t)me * n);
                same(out, want, n * es, "reduce_scatter", me, n);
                unsigned char *mine = (unsigned char *)in + (size_t)me * n * es;
                CHECK_OK(
                    t_reduce_scatter(t, in, mine, n, (dt_dtype)dt, (dt_reduce_op)op, deadline()));
                same(mine, want, n * es, "reduce_scatter in place", me, n);
                dt_free(in);
                dt_free(out);
                dt_free(want);
            }
        }
    }
    if (a->big) {
        size_t n    = BIG_COUNT;
        float *in   = dt_alloc(n * 4);
        float *want = dt_alloc(n * 4);
        ref_reduce(want, n, DT_FLOAT32, DT_REDUCE_SUM, 99, world, 0);
        gen(in, n, DT_FLOAT32, 99, me, 0);
        CHECK_OK(t_all_reduce(t, in, in, n, DT_FLOAT32, DT_REDUCE_SUM, deadline()));
        same(in, want, n * 4, "all_reduce big in place", me, n);
        dt_free(in);
        dt_free(want);
    }
}

static void body_moves(tctx *t, int me, int world) {
    for (int dt = 0; dt < DT_DTYPE_COUNT_; dt++) {
        size_t es = dt_dtype_size((dt_dtype)dt);
        for (size_t ci = 0; ci < sizeof counts / sizeof counts[0]; ci++) {
            size_t         n     = counts[ci];
            size_t         total = n * (size_t)world;
            uint64_t       seed  = 5000 + (uint64_t)dt * 10 + ci;
            unsigned char *in    = dt_alloc(total * es + 64);
            unsigned char *out   = dt_alloc(total * es + 64);
            unsigned char *want  = dt_alloc(total * es + 64);
            int            root  = (int)(ci + (size_t)dt) % world;

            // broadcast
            gen(want, n, (dt_dtype)dt, seed, root, 0);
            if (me == root)
                memcpy(out, want, n * es);
            else
                memset(out, 0xCD, n * es);
            CHECK_OK(t_broadcast(t, out, n, (dt_dtype)dt, root, deadline()));
            same(out, want, n * es, "broadcast", me, n);

            // all_gather, out of place and in place (src is our block of dst)
            for (int r = 0; r < world; r++)
                gen(want + (size_t)r * n * es, n, (dt_dtype)dt, seed + 1, r, 0);
            gen(in, n, (dt_dtype)dt, seed + 1, me, 0);
            memset(out, 0xCD, total * es);
            CHECK_OK(t_all_gather(t, in, out, n, (dt_dtype)dt, deadline()));
            same(out, want, total * es, "all_gather", me, n);
            memset(out, 0xCD, total * es);
            gen(out + (size_t)me * n * es, n, (dt_dtype)dt, seed + 1, me, 0);
            CHECK_OK(t_all_gather(t, out + (size_t)me * n * es, out, n, (dt_dtype)dt, deadline()));
            same(out, want, total * es, "all_gather in place", me, n);

            // gather
            memset(out, 0xCD, total * es);
            CHECK_OK(t_gather(t, in, me == root ? out : NULL, n, (dt_dtype)dt, root, deadline()));
            if (me == root)
                same(out, want, total * es, "gather", me, n);

            // scatter: block r of root's input goes to rank r
            gen(in, total, (dt_dtype)dt, seed + 2, root, 0);
            gen(want, n, (dt_dtype)dt, seed + 2, root, (size_t)me * n);
            memset(out, 0xCD, n * es);
            CHECK_OK(t_scatter(t, me == root ? in : NULL, out, n, (dt_dtype)dt, root, deadline()));
            same(out, want, n * es, "scatter", me, n);

            // all_to_all: block j of rank r's input goes to block r of rank j's output
            gen(in, total, (dt_dtype)dt, seed + 3, me, 0);
            for (int r = 0; r < world; r++)
                gen(want + (size_t)r * n * es, n, (dt_dtype)dt, seed + 3, r, (size_t)me * n);
            memset(out, 0xCD, total * es);
            CHECK_OK(t_all_to_all(t, in, out, n, (dt_dtype)dt, deadline()));
            same(out, want, total * es, "all_to_all", me, n);
            CHECK_OK(t_all_to_all(t, in, in, n, (dt_dtype)dt, deadline()));
            same(in, want, total * es, "all_to_all in place", me, n);

            // send/recv around a ring, even ranks sending first
            if (world > 1) {
                int to = (me + 1) % world, from = (me + world - 1) % world;
                gen(in, n, (dt_dtype)dt, seed + 4, me, 0);
                gen(want, n, (dt_dtype)dt, seed + 4, from, 0);
                memset(out, 0xCD, n * es);
                int tag = (int)ci * 3 + dt;
                if (me % 2 == 0) {
                    CHECK_OK(t_send(t, in, n, (dt_dtype)dt, to, tag, deadline()));
                    CHECK_OK(t_recv(t, out, n, (dt_dtype)dt, from, tag, deadline()));
                } else {
                    CHECK_OK(t_recv(t, out, n, (dt_dtype)dt, from, tag, deadline()));
                    CHECK_OK(t_send(t, in, n, (dt_dtype)dt, to, tag, deadline()));
                }
                same(out, want, n * es, "send/recv", me, n);
            }
            CHECK_OK(t_barrier(t, deadline()));
            dt_free(in);
            dt_free(out);
            dt_free(want);
        }
    }
}

static void body_all(tctx *t, int me, int world, void *arg) {
    if (!CHECK(t->s != NULL))
        return;
    CHECK_EQ(dt_shm_rank(t->s), me);
    CHECK_EQ(dt_shm_world(t->s), world);
    body_reductions(t, me, world, arg);
    body_moves(t, me, world);
}

static void test_collectives_small_chunk(void) {
    // 4 KiB chunks: the prime count streams through ~100 chunks per call.
    coll_arg a = {.big = 0, .all_ops = 1};
    for (int w = 1; w <= 5; w++) {
        world_cfg c = {
            .world = w, .chunk_bytes = 4096, .kill_rank = -1, .skip_init = -1, .bad_world = -1};
        run_world(&c, body_all, &a);
    }
}

static void test_collectives_default_chunk(void) {
    coll_arg a = {.big = 1, .all_ops = 0};
    for (int w = 1; w <= 5; w++) {
        world_cfg c = {.world = w, .kill_rank = -1, .skip_init = -1, .bad_world = -1};
        run_world(&c, body_all, &a);
    }
}

// Non-temporal stores (off by default) for every result of 1 KiB and more.
static void test_nontemporal(void) {
    coll_arg a = {.big = 0, .all_ops = 1};
    setenv("DT_SHM_NT_KIB", "1", 1);
    for (int w = 2; w <= 3; w++) {
        world_cfg c = {
            .world = w, .chunk_bytes = 8192, .kill_rank = -1, .skip_init = -1, .bad_world = -1};
        run_world(&c, body_all, &a);
    }
    unsetenv("DT_SHM_NT_KIB");
}

// Many small collectives back to back: buffer reuse across calls of different kinds.
static void body_churn(tctx *t, int me, int world, void *arg) {
    (void)arg;
    if (!CHECK(t->s != NULL))
        return;
    float in[300], out[300], want[300];
    int   bad = 0;
    for (int it = 0; it < 2000; it++) {
        size_t n = (size_t)(it * 37) % 300;
        gen(in, n, DT_FLOAT32, (uint64_t)it, me, 0);
        if (it % 3 == 0) {
            bad += t_all_reduce(t, in, out, n, DT_FLOAT32, DT_REDUCE_SUM, deadline()) != DT_OK;
            ref_reduce(want, n, DT_FLOAT32, DT_REDUCE_SUM, (uint64_t)it, world, 0);
        } else if (it % 3 == 1) {
            int root = it % world;
            gen(want, n, DT_FLOAT32, (uint64_t)it, root, 0);
            memcpy(out, me == root ? want : in, n * 4);
            bad += t_broadcast(t, out, n, DT_FLOAT32, root, deadline()) != DT_OK;
        } else {
            bad += t_barrier(t, deadline()) != DT_OK;
            continue;
        }
        bad += memcmp(out, want, n * 4) != 0;
    }
    CHECK_EQ(bad, 0);
}

// Everybody sends first, then receives: sends must not wait for the receiver (the
// message is far larger than the channel), nor may later messages overtake it.
static void body_send_ring(tctx *t, int me, int world, void *arg) {
    (void)arg;
    if (!CHECK(t->s != NULL))
        return;
    int    to = (me + 1) % world, from = (me + world - 1) % world;
    size_t n = 300007;
    float *a = dt_alloc(n * 4), *b = dt_alloc(n * 4), *want = dt_alloc(n * 4);
    for (int round = 0; round < 3; round++) {
        gen(a, n, DT_FLOAT32, 70 + (uint64_t)round, me, 0);
        CHECK_OK(t_send(t, a, n, DT_FLOAT32, to, round, deadline()));
        memset(a, 0, n * 4); // the send owns no reference to the caller's buffer
        CHECK_OK(t_send(t, a, 5, DT_FLOAT32, to, 100 + round, deadline()));
    }
    for (int round = 0; round < 3; round++) {
        CHECK_OK(t_recv(t, b, n, DT_FLOAT32, from, round, deadline()));
        gen(want, n, DT_FLOAT32, 70 + (uint64_t)round, from, 0);
        same(b, want, n * 4, "ring send/recv", me, n);
        CHECK_OK(t_recv(t, b, 5, DT_FLOAT32, from, 100 + round, deadline()));
        CHECK(b[0] == 0 && b[4] == 0);
    }
    CHECK_OK(t_barrier(t, deadline()));
    dt_free(a);
    dt_free(b);
    dt_free(want);
}

static void test_send_ring(void) {
    for (int w = 2; w <= 4; w++) {
        world_cfg c = {.world = w, .kill_rank = -1, .skip_init = -1, .bad_world = -1};
        run_world(&c, body_send_ring, NULL);
    }
}

static void test_churn(void) {
    for (int w = 2; w <= 4; w++) {
        world_cfg c = {.world = w, .kill_rank = -1, .skip_init = -1, .bad_world = -1};
        run_world(&c, body_churn, NULL);
    }
}

// ----------------------------------------------------------------------- failures

static void body_killed(tctx *t, int me, int world, void *arg) {
    (void)world, (void)arg;
    if (!CHECK(t->s != NULL))
        return;
    size_t    n  = (size_t)4 << 20;
    float    *in = dt_alloc(n * 4);
    dt_status st = DT_OK;
    gen(in, n, DT_FLOAT32, 1, me, 0);
    for (int it = 0; it < 100000 && st == DT_OK; it++)
        st = t_all_reduce(t, in, in, n, DT_FLOAT32, DT_REDUCE_SUM, dt_deadline_ns(60000));
    uint64_t now = dt_now_ns();
    CHECK_ERR(st, DT_ERR_PEER, "rank 2 died");
    CHECK(strstr(dt_last_error(), "all_reduce #") != NULL);
    CHECK(*shared_kill_ns != 0);
    double secs = (double)(now - *shared_kill_ns) / 1e9;
    if (!CHECK(secs < 5.0))
        fprintf(stderr, "     rank %d noticed the death after %.2f s\n", me, secs);
    // Poisoned: the next call fails at once with the same story.
    CHECK_ERR(t_barrier(t, deadline()), DT_ERR_PEER, "rank 2 died");
    dt_free(in);
}

static void test_killed_rank(void) {
    world_cfg c = {
        .world = 3, .kill_rank = 2, .kill_after_ms = 400, .skip_init = -1, .bad_world = -1};
    run_world(&c, body_killed, NULL);
}

static void body_mismatch(tctx *t, int me, int world, void *arg) {
    (void)world, (void)arg;
    if (!CHECK(t->s != NULL))
        return;
    float buf[64] = {0};
    CHECK_OK(t_all_reduce(t, buf, buf, 8, DT_FLOAT32, DT_REDUCE_SUM, deadline()));
    size_t n = me == 1 ? 20 : 10;
    CHECK_ERR(t_all_reduce(t, buf, buf, n, DT_FLOAT32, DT_REDUCE_SUM, deadline()), DT_ERR_MISMATCH,
              "all_reduce #2");
    // Both fingerprints are printed, whoever detected it.
    CHECK(strstr(dt_last_error(), "count 10") != NULL);
    CHECK(strstr(dt_last_error(), "count 20") != NULL);
}

static void body_mismatch_kind(tctx *t, int me, int world, void *arg) {
    (void)world, (void)arg;
    if (!CHECK(t->s != NULL))
        return;
    float     buf[4] = {0};
    dt_status st =
        me == 0 ? t_barrier(t, deadline()) : t_broadcast(t, buf, 4, DT_FLOAT32, 0, deadline());
    CHECK_ERR(st, DT_ERR_MISMATCH, "barrier #1");
    CHECK(strstr(dt_last_error(), "broadcast #1 (float32, count 4, root 0)") != NULL);
}

static void body_recv_mismatch(tctx *t, int me, int world, void *arg) {
    (void)world, (void)arg;
    if (!CHECK(t->s != NULL))
        return;
    int v[3] = {1, 2, 3};
    if (me == 0) {
        CHECK_OK(t_send(t, v, 3, DT_INT32, 1, 5, deadline()));
        CHECK_ERR(t_barrier(t, deadline()), DT_ERR_MISMATCH, "tag 6");
    } else {
        CHECK_ERR(t_recv(t, v, 3, DT_INT32, 0, 6, deadline()), DT_ERR_MISMATCH,
                  "recv #1 from rank 0: rank 0 called send #1 (int32, count 3, tag 5) but this "
                  "rank (1) called recv #1 (int32, count 3, tag 6)");
    }
}

static void test_mismatch(void) {
    world_cfg c = {.world = 2, .kill_rank = -1, .skip_init = -1, .bad_world = -1};
    run_world(&c, body_mismatch, NULL);
    c.world = 3;
    run_world(&c, body_mismatch, NULL);
    c.world = 2;
    run_world(&c, body_mismatch_kind, NULL);
    run_world(&c, body_recv_mismatch, NULL);
}

static void body_timeout(tctx *t, int me, int world, void *arg) {
    (void)world, (void)arg;
    if (!CHECK(t->s != NULL))
        return;
    if (me == 0) {
        uint64_t t0 = dt_now_ns();
        CHECK_ERR(t_barrier(t, dt_deadline_ns(300)), DT_ERR_TIMEOUT, "barrier #1: timed out after");
        CHECK(strstr(dt_last_error(), "waiting for rank 1 (no collective yet)"));
        double ms = (double)(dt_now_ns() - t0) / 1e6;
        CHECK(ms >= 290 && ms < 3000);
    } else {
        usleep(1200 * 1000);
        // Rank 0 gave up and said so in the segment: no 30 s wait here.
        uint64_t t0 = dt_now_ns();
        CHECK_ERR(t_barrier(t, deadline()), DT_ERR_TIMEOUT, "(reported by rank 0)");
        CHECK((double)(dt_now_ns() - t0) / 1e6 < 1000);
    }
}

static void body_left(tctx *t, int me, int world, void *arg) {
    (void)world, (void)arg;
    if (!CHECK(t->s != NULL))
        return;
    if (me == 0) {
        usleep(100 * 1000);
        CHECK_ERR(t_barrier(t, deadline()), DT_ERR_PEER, "rank 1 left the group");
    }
    // rank 1 returns at once and the harness frees its engine
}

static void body_abort(tctx *t, int me, int world, void *arg) {
    (void)world, (void)arg;
    if (!CHECK(t->s != NULL))
        return;
    if (me == 1)
        dt_shm_abort(t->s, DT_ERR_PEER, "rank 3 of another host is gone");
    else
        CHECK_ERR(t_barrier(t, deadline()), DT_ERR_PEER, "rank 3 of another host is gone");
}

static void test_timeout_left_abort(void) {
    world_cfg c = {.world = 2, .kill_rank = -1, .skip_init = -1, .bad_world = -1};
    run_world(&c, body_timeout, NULL);
    run_world(&c, body_left, NULL);
    run_world(&c, body_abort, NULL);
}

static void body_init_fails(tctx *t, int me, int world, void *arg) {
    (void)world;
    const char *want = arg;
    if (me == 0 && strcmp(want, "bad world") == 0) {
        // rank 1 found a segment of world 2 while it expects 3; rank 0 then times out
        CHECK(t->s == NULL);
        CHECK(dt_last_status() == DT_ERR_TIMEOUT || dt_last_status() == DT_ERR_MISMATCH);
        return;
    }
    if (me == 1 && strcmp(want, "bad world") == 0) {
        CHECK(t->s == NULL);
        CHECK(dt_last_status() == DT_ERR_MISMATCH);
        CHECK(strstr(dt_last_error(), "expected version 1, world 3") != NULL);
        CHECK(strstr(dt_last_error(), "world 2") != NULL);
        return;
    }
    // "missing": rank 1 never comes
    CHECK(t->s == NULL);
    CHECK(dt_last_status() == DT_ERR_TIMEOUT);
    CHECK(strstr(dt_last_error(), "ranks not attached: 1") != NULL);
}

static void test_init_failures(void) {
    world_cfg c = {
        .world = 2, .kill_rank = -1, .skip_init = -1, .bad_world = 1, .init_timeout_ms = 600};
    run_world(&c, body_init_fails, "bad world");
    world_cfg m = {
        .world = 2, .kill_rank = -1, .skip_init = 1, .bad_world = -1, .init_timeout_ms = 300};
    run_world(&m, body_init_fails, "missing");

    dt_shm     *s = NULL;
    dt_shm_opts o = {.rank = 0, .world = 1, .name = "no-slash", .deadline_ns = UINT64_MAX};
    CHECK_ERR(dt_shm_init(&o, &s), DT_ERR_ARG, "found \"no-slash\"");
    o.name  = "/dtrain-x";
    o.rank  = 2;
    o.world = 2;
    CHECK_ERR(dt_shm_init(&o, &s), DT_ERR_ARG, "found rank 2, world 2");
    CHECK(s == NULL);
}

static void body_bad_args(tctx *t, int me, int world, void *arg) {
    (void)me, (void)world, (void)arg;
    if (!CHECK(t->s != NULL))
        return;
    float b[4] = {0};
    CHECK_ERR(t_all_reduce(t, b, b, 4, (dt_dtype)7, DT_REDUCE_SUM, deadline()), DT_ERR_ARG,
              "expected a dtype");
    CHECK_ERR(t_all_reduce(t, b, b, 4, DT_FLOAT32, (dt_reduce_op)9, deadline()), DT_ERR_ARG,
              "expected a reduce op in [0, 5), found 9");
    CHECK_ERR(t_broadcast(t, b, 4, DT_FLOAT32, 5, deadline()), DT_ERR_ARG,
              "expected a root rank in [0, 2), found 5");
    CHECK_ERR(t_send(t, b, 4, DT_FLOAT32, me, 0, deadline()), DT_ERR_ARG,
              "expected a peer rank in [0, 2) other than");
    // Rejected arguments do not desynchronise the group.
    CHECK_OK(t_all_reduce(t, b, b, 4, DT_FLOAT32, DT_REDUCE_SUM, deadline()));
}

static void test_bad_args(void) {
    world_cfg c = {.world = 2, .kill_rank = -1, .skip_init = -1, .bad_world = -1};
    run_world(&c, body_bad_args, NULL);
}

int main(void) {
    shared_kill_ns = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    DT_ASSERT(shared_kill_ns != MAP_FAILED);
    RUN(test_collectives_small_chunk);
    RUN(test_collectives_default_chunk);
    RUN(test_nontemporal);
    RUN(test_churn);
    RUN(test_send_ring);
    RUN(test_mismatch);
    RUN(test_killed_rank);
    RUN(test_timeout_left_abort);
    RUN(test_init_failures);
    RUN(test_bad_args);
    return check_summary();
}
