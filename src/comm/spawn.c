// spawn.c: dt_spawn, the C form of torch.multiprocessing.spawn: fork the workers with
// their rank variables, watch them through pidfds, and when one fails stop the
// others (SIGTERM, then SIGKILL after a grace period) and report the first failure.
#include "comm/comm_impl.h"
#include "comm/shm/shm.h"
#include "core/hmac.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
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

// Runs in the child: never returns.
static _Noreturn void child_main(int i, int nprocs, long rank_base, long world, pid_t parent,
                                 const char *addr, const char *port, const char *token,
                                 dt_spawn_fn fn, void *arg) {
    // Die with the parent; if it died before prctl took effect, go now.
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent)
        _exit(128 + SIGKILL);
    setenv_int("LOCAL_RANK", i);
    setenv_int("LOCAL_WORLD_SIZE", nprocs);
    setenv_int("RANK", rank_base + i);
    setenv_int("WORLD_SIZE", world);
    if (addr)
        setenv("MASTER_ADDR", addr, 1);
    if (port)
        setenv("MASTER_PORT", port, 1);
    if (token)
        setenv("DT_JOB_TOKEN", token, 1);
    int rc = fn(i, arg);
    fflush(NULL);
    _exit(rc & 0xff);
}

static void describe(int status, int *code, int *sig) {
    if (WIFEXITED(status)) {
        *code = WEXITSTATUS(status);
        *sig  = 0;
    } else {
        *code = -1;
        *sig  = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
    }
}

dt_status dt_spawn(int nprocs, dt_spawn_fn fn, void *arg, dt_spawn_result *out) {
    dt_spawn_result res = {.failed_rank = -1, .exit_code = 0, .term_signal = 0};
    if (out)
        *out = res;
    if (nprocs < 1 || nprocs > 4096)
        return dt_fail(DT_ERR_ARG, "spawn: expected 1..4096 processes, found %d", nprocs);
    if (!fn)
        return dt_fail(DT_ERR_ARG, "spawn: the worker function is NULL");
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

    pid_t *pids   = dt_alloc_zero((size_t)nprocs * sizeof *pids);
    int   *pidfds = dt_alloc((size_t)nprocs * sizeof *pidfds);
    bool  *alive  = dt_alloc_zero((size_t)nprocs * sizeof *alive);
    if (!pids || !pidfds || !alive) {
        dt_free(pids);
        dt_free(pidfds);
        dt_free(alive);
        return DT_ERR_NOMEM;
    }
    pid_t     parent = getpid();
    dt_status st     = DT_OK;
    int       nalive = 0;
    fflush(NULL); // or the children inherit and re-print buffered output
    for (int i = 0; i < nprocs; i++) {
        pidfds[i] = -1;
        pid_t pid = fork();
        if (pid == 0)
            child_main(i, nprocs, base, world, parent, addr, port, token, fn, arg);
        if (pid < 0) {
            st = dt_fail_errno(DT_ERR_IO, "spawn: fork of local rank %d of %d", i, nprocs);
            res.failed_rank = i;
            res.exit_code   = -1;
            break;
        }
        pids[i]   = pid;
        pidfds[i] = dt_pidfd_open(pid);
        alive[i]  = true;
        nalive++;
    }

    // Watch: a child that exits non-zero or dies stops the job.
    uint64_t kill_at   = 0; // when stopping: SIGKILL after the grace period
    bool     stopping  = st != DT_OK;
    bool     forwarded = false; // a SIGTERM for the caller was passed on to the workers
    if (stopping) {
        for (int i = 0; i < nprocs; i++)
            if (alive[i])
                kill(pids[i], SIGTERM);
        kill_at = dt_now_ns() + (uint64_t)grace * 1000000ull;
    }
    struct pollfd *pf = dt_alloc((size_t)nprocs * sizeof *pf);
    while (nalive > 0) {
        int n = 0;
        for (int i = 0; i < nprocs && pf; i++)
            if (alive[i] && pidfds[i] >= 0)
                pf[n++] = (struct pollfd){.fd = pidfds[i], .events = POLLIN};
        int ms = -1;
        if (stopping && kill_at != UINT64_MAX)
            ms = dt_ms_left(kill_at) + 1;
        if (n < nalive && (ms < 0 || ms > 50))
            ms = 50; // children without a pidfd are polled with WNOHANG
        if (!stopping && (ms < 0 || ms > 100))
            ms = 100; // a blocked SIGTERM does not wake poll: looked for below
        if (pf && n > 0)
            poll(pf, (nfds_t)n, ms);
        else {
            struct timespec ts = {0, 20 * 1000000L};
            nanosleep(&ts, NULL);
        }
        for (int i = 0; i < nprocs; i++) {
            if (!alive[i])
                continue;
            int   status;
            pid_t r = waitpid(pids[i], &status, WNOHANG);
            if (r == 0 || (r < 0 && errno == EINTR))
                continue;
            alive[i] = false;
            nalive--;
            int code = 0, sig = 0;
            if (r > 0)
                describe(status, &code, &sig);
            else
                code = -1; // reaped elsewhere: unknown
            if ((code != 0 || sig != 0) && res.failed_rank < 0 && forwarded) {
                res.failed_rank = i; // how the workers ended after the forwarded SIGTERM
                res.exit_code   = code;
                res.term_signal = sig;
            } else if ((code != 0 || sig != 0) && res.failed_rank < 0 && !stopping) {
                res.failed_rank = i;
                res.exit_code   = code;
                res.term_signal = sig;
                stopping        = true;
                kill_at         = dt_now_ns() + (uint64_t)grace * 1000000ull;
                for (int j = 0; j < nprocs; j++)
                    if (alive[j])
                        kill(pids[j], SIGTERM);
            }
        }
        if (!stopping && take_blocked_sigterm()) {
            // The caller blocks SIGTERM (its workers inherit the mask and stop at a step
            // boundary of their own): forward it, and give them time to save.
            stopping  = true;
            forwarded = true;
            kill_at   = dt_now_ns() + (uint64_t)term_grace * 1000000ull;
            for (int j = 0; j < nprocs; j++)
                if (alive[j])
                    kill(pids[j], SIGTERM);
        }
        if (stopping && nalive > 0 && dt_now_ns() >= kill_at) {
            for (int j = 0; j < nprocs; j++)
                if (alive[j])
                    kill(pids[j], SIGKILL);
            kill_at = UINT64_MAX; // killed: now just reap
        }
    }
    for (int i = 0; i < nprocs; i++)
        if (pidfds[i] >= 0)
            close(pidfds[i]);
    dt_free(pf);
    dt_free(pids);
    dt_free(pidfds);
    dt_free(alive);
    if (out)
        *out = res;
    if (st != DT_OK)
        return st;
    if (res.failed_rank >= 0) {
        if (res.term_signal)
            return dt_fail(DT_ERR_PEER,
                           "spawn: local rank %d (rank %ld) was killed by signal %d (%s); the "
                           "other ranks were stopped",
                           res.failed_rank, base + res.failed_rank, res.term_signal,
                           strsignal(res.term_signal));
        return dt_fail(DT_ERR_PEER,
                       "spawn: local rank %d (rank %ld) exited with code %d; the other ranks were "
                       "stopped",
                       res.failed_rank, base + res.failed_rank, res.exit_code);
    }
    return DT_OK;
}
