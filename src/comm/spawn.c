// spawn.c: dt_spawn and dt_spawn_fork, the C forms of torch.multiprocessing.spawn. What makes its
// workers a job is decided here, in comm: their rank variables, the store's port and address, the
// job token, and the bound on local processes (sized by the shm segment they would
// share). Forking, watching, stopping (SIGTERM, then SIGKILL after a grace period) and
// reaping them is src/launch's supervisor (dt_procs, launch.h); the first failure is
// reported.
#include "comm/comm_impl.h"
#include "comm/shm/shm.h"
#include "core/hmac.h"

#include <setjmp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

// Local processes allowed without DT_MAX_LOCAL_PROCS: 4 per online CPU, at most 256.
// Beyond that the workers only time-share the cores, and the shm segment (which grows
// with the square of the local world) eats /dev/shm: 1000 ranks take about 8 GiB.
#define PROCS_PER_CPU   4
#define MAX_LOCAL_PROCS 256

// A SIGTERM for the caller, when the caller blocks it (a program that stops at its own
// step boundaries does): consumed, so that it is forwarded once.
static bool take_blocked_sigterm(void) {
    sigset_t blocked, term;
    sigemptyset(&term);
    sigaddset(&term, SIGTERM);
    if (pthread_sigmask(SIG_BLOCK, NULL, &blocked) != 0 || !sigismember(&blocked, SIGTERM))
        return false;
    struct timespec zero = {0, 0};
    return sigtimedwait(&term, NULL, &zero) == SIGTERM;
}

// Refuses a local world far above the cores unless DT_MAX_LOCAL_PROCS allows it, and
// says what the shared-memory segment of that many ranks would cost.
static dt_status check_local_bound(int nprocs) {
    long cpus = sysconf(_SC_NPROCESSORS_ONLN), bound = MAX_LOCAL_PROCS, v;
    if (cpus > 0 && cpus * PROCS_PER_CPU < bound)
        bound = cpus * PROCS_PER_CPU;
    DT_TRY(dt_setting_int("DT_MAX_LOCAL_PROCS", &v));
    if (v == 0) // the default: the automatic bound
        v = bound;
    if (nprocs <= v)
        return DT_OK;
    double         seg = (double)dt_shm_segment_bytes(nprocs) / 1048576.0;
    struct statvfs fs;
    double         avail =
        statvfs("/dev/shm", &fs) == 0 ? (double)fs.f_bavail * (double)fs.f_frsize / 1048576.0 : -1;
    char free_txt[64] = "";
    if (avail >= 0)
        snprintf(free_txt, sizeof free_txt, "; /dev/shm has %.1f MiB free", avail);
    return dt_fail(DT_ERR_ARG,
                   "spawn: %d local processes exceed the bound of %ld (%d per online CPU, %ld "
                   "CPUs, at most %d; set DT_MAX_LOCAL_PROCS to allow more): their shared-memory "
                   "segment alone would take %.1f MiB of /dev/shm%s",
                   nprocs, v, PROCS_PER_CPU, cpus, MAX_LOCAL_PROCS, seg, free_txt);
}

static void setenv_int(const char *name, long v) {
    char buf[32];
    snprintf(buf, sizeof buf, "%ld", v);
    setenv(name, buf, 1);
}

// What every child needs, prepared before fork.
typedef struct spawn_child {
    int         nprocs;
    long        base, world;
    const char *addr, *port, *token;
    dt_spawn_fn fn; // NULL: dt_spawn_fork's child goes back to its caller (back)
    void       *arg;
    sigjmp_buf *back; // set by the parent before each fork
} spawn_child;

// dt_spawn_fork's child: its local rank, written before it jumps back (a file-scope
// volatile, not a local of the frame it jumps to, whose value would be indeterminate).
static volatile int forked_rank = -1;

// Runs in child i (the supervisor has made it die with its parent): never returns.
static void child_main(int i, void *arg) {
    const spawn_child *c = arg;
    setenv_int("LOCAL_RANK", i);
    setenv_int("LOCAL_WORLD_SIZE", c->nprocs);
    setenv_int("RANK", c->base + i);
    setenv_int("WORLD_SIZE", c->world);
    if (c->addr)
        setenv("MASTER_ADDR", c->addr, 1);
    if (c->port)
        setenv("MASTER_PORT", c->port, 1);
    if (c->token)
        setenv("DT_JOB_TOKEN", c->token, 1);
    if (!c->fn) { // back into dt_spawn_fork's frame, which this process holds too
        forked_rank = i;
        siglongjmp(*c->back, 1);
    }
    int rc = c->fn(i, c->arg);
    fflush(NULL);
    _exit(rc & 0xff);
}

// The watch: the first child to fail stops the others; after a forwarded SIGTERM, the
// first that did not end cleanly is how the job ended.
typedef struct watch {
    dt_spawn_result *res;
    long             grace_ms;
    bool             forwarded; // a SIGTERM for the caller was passed on to the workers
} watch;

static void on_end(dt_procs *ps, int i, void *ctx) {
    watch         *w = ctx;
    const dt_proc *p = dt_procs_at(ps, i);
    if ((p->exit_code == 0 && p->term_signal == 0) || w->res->failed_rank >= 0)
        return;
    if (!w->forwarded && dt_procs_stopping(ps))
        return; // stopped by us
    w->res->failed_rank = i;
    w->res->exit_code   = p->exit_code;
    w->res->term_signal = p->term_signal;
    dt_procs_stop(ps, SIGTERM, w->grace_ms);
}

// Both forms: fn NULL is dt_spawn_fork's (*local_rank >= 0 in a child that returns).
static dt_status spawn(int nprocs, dt_spawn_fn fn, void *arg, dt_spawn_result *out,
                       int *local_rank) {
    dt_spawn_result res = {.failed_rank = -1, .exit_code = 0, .term_signal = 0};
    if (out)
        *out = res;
    if (nprocs < 1 || nprocs > 4096)
        return dt_fail(DT_ERR_ARG, "spawn: expected 1..4096 processes, found %d", nprocs);
    DT_TRY(check_local_bound(nprocs));
    long grace, term_grace;
    DT_TRY(dt_setting_int("DT_SPAWN_GRACE_MS", &grace));
    DT_TRY(dt_setting_int("DT_SPAWN_TERM_GRACE_MS", &term_grace));

    // Ranks: a node of a multi-node job, or a job of its own.
    long        base = 0, world = nprocs, v;
    const char *gr = getenv("GROUP_RANK");
    if (!gr || !*gr)
        gr = getenv("NODE_RANK");
    const char *ws = getenv("WORLD_SIZE");
    if (gr && *gr && ws && *ws) {
        DT_TRY(dt_parse_long(gr, 0, 1 << 20, "spawn: GROUP_RANK/NODE_RANK", &v));
        base = v * nprocs;
        DT_TRY(dt_parse_long(ws, 1, 1 << 30, "spawn: WORLD_SIZE", &world));
        if (base + nprocs > world)
            return dt_fail(DT_ERR_ARG,
                           "spawn: node %ld with %d processes needs WORLD_SIZE >= %ld, found %ld",
                           v, nprocs, base + nprocs, world);
    }
    // A job of its own (every rank forked here): a free port unless MASTER_PORT gives
    // one, 127.0.0.1 unless MASTER_ADDR says otherwise, and a fresh random token.
    // One node of several: the other nodes' dt_spawn cannot know a random token, so
    // without DT_JOB_TOKEN every node derives the same one from the job's shape. That
    // token is no secret: it keeps a stray rank of another job (or one without a token)
    // out, not an attacker who can reach the port (docs/comm.md, "Job tokens").
    bool        alone = world == nprocs;
    char        port_buf[16], token_buf[96];
    const char *addr = NULL, *port = NULL, *token = NULL;
    const char *mp = getenv("MASTER_PORT"), *ma = getenv("MASTER_ADDR");
    if (!mp || !*mp) {
        int fd, p;
        DT_TRY(dt_sock_listen(0, 1, "spawn: picking a free port", &fd, &p));
        close(fd);
        snprintf(port_buf, sizeof port_buf, "%d", p);
        port = port_buf;
        mp   = port_buf;
        if (!ma || !*ma)
            addr = "127.0.0.1";
    } else if ((!ma || !*ma) && alone) {
        addr = "127.0.0.1";
    }
    const char *tk = dt_setting_str("DT_JOB_TOKEN");
    if ((!tk || !*tk) && alone) {
        unsigned char rnd[16];
        dt_random_bytes(rnd, sizeof rnd);
        for (int i = 0; i < 16; i++)
            snprintf(token_buf + 2 * i, 3, "%02x", rnd[i]);
        token = token_buf;
    } else if (!tk || !*tk) {
        snprintf(token_buf, sizeof token_buf, "dtrain-shared:port=%s:world=%ld:nproc=%d", mp, world,
                 nprocs);
        token = token_buf;
    }

    dt_procs *ps;
    DT_TRY(dt_procs_new(&ps, nprocs, NULL));
    sigjmp_buf  back;
    spawn_child c  = {.nprocs = nprocs,
                      .base   = base,
                      .world  = world,
                      .addr   = addr,
                      .port   = port,
                      .token  = token,
                      .fn     = fn,
                      .arg    = arg,
                      .back   = &back};
    watch       w  = {.res = &res, .grace_ms = grace};
    dt_status   st = DT_OK;
    for (int i = 0; i < nprocs; i++) {
        if (!fn && sigsetjmp(back, 0)) { // a child of dt_spawn_fork, back from child_main
            dt_procs_release(ps);        // the parent's table: the siblings are not ours
            *local_rank = forked_rank;
            return DT_OK;
        }
        if (dt_procs_start(ps, i, child_main, &c) != DT_OK) {
            st = dt_fail_errno(DT_ERR_IO, "spawn: fork of local rank %d of %d", i, nprocs);
            res.failed_rank = i;
            res.exit_code   = -1;
            dt_procs_stop(ps, SIGTERM, grace); // the ones already started
            break;
        }
    }
    // Without a time limit (the workers carry their own timeouts), but looking every
    // 100 ms for a SIGTERM the caller blocks: it does not wake the wait.
    while (dt_procs_alive(ps) > 0) {
        dt_procs_wait(ps, dt_procs_stopping(ps) ? -1 : 100, on_end, &w);
        if (!dt_procs_stopping(ps) && take_blocked_sigterm()) {
            // The caller blocks SIGTERM (its workers inherit the mask and stop at a step
            // boundary of their own): forward it, and give them time to save.
            w.forwarded = true;
            dt_procs_stop(ps, SIGTERM, term_grace);
        }
    }
    dt_procs_free(ps);
    if (out)
        *out = res;
    if (st != DT_OK)
        return st;
    if (res.failed_rank >= 0) {
        char how[80];
        dt_procs_describe_end(res.exit_code, res.term_signal, how, sizeof how);
        return dt_fail(DT_ERR_PEER,
                       "spawn: local rank %d (rank %ld) %s; the other ranks were stopped",
                       res.failed_rank, base + res.failed_rank, how);
    }
    return DT_OK;
}

dt_status dt_spawn(int nprocs, dt_spawn_fn fn, void *arg, dt_spawn_result *out) {
    if (!fn) {
        if (out)
            *out = (dt_spawn_result){.failed_rank = -1};
        return dt_fail(DT_ERR_ARG, "spawn: the worker function is NULL");
    }
    return spawn(nprocs, fn, arg, out, NULL);
}

dt_status dt_spawn_fork(int nprocs, int *local_rank, dt_spawn_result *out) {
    *local_rank = -1;
    return spawn(nprocs, NULL, NULL, out, local_rank);
}
