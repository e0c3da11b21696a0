// workers.c: the local workers of one attempt: exec with torchrun's environment, their
// output (relayed line by line with a "[rank N] " prefix, written to per-rank log
// files, the last lines kept for the summary), and their records for the summary.
//
// Forking, watching, stopping and reaping them is the library's process supervisor
// (dt_procs, launch.h), the one dt_spawn uses too. Every worker runs in a process group
// of its own (so a stop reaches what it started too, and the terminal's Ctrl-C reaches
// dtrun alone, which then stops the job in order), dies with dtrun (PR_SET_PDEATHSIG)
// and is registered with the reaper. Between fork and exec the child only makes
// async-signal-safe calls: dtrun has other threads (the store server, the monitor), so
// everything is prepared before fork.
#include "dtrun.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

int64_t dtrun_wall_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

// ------------------------------------------------------------------ environment

// Variables dtrun sets for every worker (any inherited value is replaced).
static const char *const set_vars[] = {"RANK",
                                       "LOCAL_RANK",
                                       "WORLD_SIZE",
                                       "LOCAL_WORLD_SIZE",
                                       "GROUP_RANK",
                                       "GROUP_WORLD_SIZE",
                                       "ROLE_RANK",
                                       "ROLE_WORLD_SIZE",
                                       "ROLE_NAME",
                                       "MASTER_ADDR",
                                       "MASTER_PORT",
                                       "TORCHELASTIC_RESTART_COUNT",
                                       "TORCHELASTIC_MAX_RESTARTS",
                                       "TORCHELASTIC_RUN_ID",
                                       "TORCHELASTIC_USE_AGENT_STORE",
                                       "DT_RESTART_COUNT",
                                       "DT_JOB_TOKEN",
                                       "DT_ELASTIC",
                                       "DT_ELASTIC_TIMEOUT_MS",
                                       NULL};
#define NVAR (sizeof set_vars / sizeof set_vars[0]) // (the NULL's slot: OMP_NUM_THREADS)

static bool is_set_var(const char *entry) {
    for (int i = 0; set_vars[i]; i++) {
        size_t n = strlen(set_vars[i]);
        if (strncmp(entry, set_vars[i], n) == 0 && entry[n] == '=')
            return true;
    }
    return false;
}

// The environment of one worker: the inherited one without set_vars, then ours.
// One allocation holding the pointer array and the strings.
static char **worker_env(const dtrun_launch *l, int local_rank) {
    const dtrun_args *a    = l->a;
    size_t            nenv = 0;
    while (environ[nenv])
        nenv++;
    size_t nptr   = nenv + NVAR + 1;
    size_t strcap = (size_t)NVAR * 320;
    char **env    = dt_alloc(nptr * sizeof(char *) + strcap);
    if (!env)
        return NULL;
    char  *s = (char *)(env + nptr), *end = s + strcap;
    size_t k = 0;
    for (size_t i = 0; i < nenv; i++)
        if (!is_set_var(environ[i]))
            env[k++] = environ[i];
    long rank  = (long)a->node_rank * a->nproc + local_rank;
    long world = (long)a->nnodes * a->nproc;
#define ADD(...)                                                                                   \
    do {                                                                                           \
        int w_   = snprintf(s, (size_t)(end - s), __VA_ARGS__);                                    \
        env[k++] = s;                                                                              \
        s += (w_ < 0 ? 0 : w_) + 1;                                                                \
    } while (0)
    ADD("RANK=%ld", rank);
    ADD("LOCAL_RANK=%d", local_rank);
    ADD("WORLD_SIZE=%ld", world);
    ADD("LOCAL_WORLD_SIZE=%d", a->nproc);
    ADD("GROUP_RANK=%d", a->node_rank);
    ADD("GROUP_WORLD_SIZE=%d", a->nnodes);
    ADD("ROLE_RANK=%ld", rank);
    ADD("ROLE_WORLD_SIZE=%ld", world);
    ADD("ROLE_NAME=default");
    ADD("MASTER_ADDR=%.255s", l->master_addr);
    ADD("MASTER_PORT=%d", l->master_port);
    ADD("TORCHELASTIC_RESTART_COUNT=%d", l->attempt);
    ADD("TORCHELASTIC_MAX_RESTARTS=%d", a->max_restarts);
    ADD("TORCHELASTIC_RUN_ID=%.200s", a->run_id);
    if (a->elastic_min) { // the workers meet in the agents' store (elastic.c)
        ADD("TORCHELASTIC_USE_AGENT_STORE=True");
        ADD("DT_ELASTIC=%d:%d", a->elastic_min * a->nproc, a->elastic_max * a->nproc);
        ADD("DT_ELASTIC_TIMEOUT_MS=%lld", (long long)a->rdzv_timeout_ms);
    } else { // each rank 0 worker serves its own store: never the agent's (PyTorch would try)
        ADD("TORCHELASTIC_USE_AGENT_STORE=False");
    }
    ADD("DT_RESTART_COUNT=%d", l->attempt);
    ADD("DT_JOB_TOKEN=%.200s", l->token);
    const char *omp = getenv("OMP_NUM_THREADS");
    if (!omp || !*omp)
        ADD("OMP_NUM_THREADS=1");
#undef ADD
    env[k] = NULL;
    return env;
}

// ------------------------------------------------------------------ start

// Writes a decimal number into buf (async-signal-safe); returns the length.
static size_t fmt_int(char *buf, long v) {
    char          tmp[24];
    size_t        n  = 0;
    bool          ng = v < 0;
    unsigned long u  = ng ? 0UL - (unsigned long)v : (unsigned long)v;
    do {
        tmp[n++] = (char)('0' + u % 10);
        u /= 10;
    } while (u);
    size_t k = 0;
    if (ng)
        buf[k++] = '-';
    while (n)
        buf[k++] = tmp[--n];
    return k;
}

// What one worker's child needs, prepared before fork.
typedef struct exec_args {
    const char  *path;
    char *const *argv, *const *env;
    int in_fd, out_fd, err_fd;
} exec_args;

// In the child between fork and exec (the supervisor has put it in its own process
// group and made it die with dtrun): async-signal-safe calls only. Never returns.
static void child_exec(int index, void *arg) {
    (void)index;
    const exec_args *x = arg;
    // dtrun blocks its stop signals and ignores SIGPIPE; both would survive exec.
    struct sigaction dfl    = {.sa_handler = SIG_DFL};
    int              sigs[] = {SIGPIPE, SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGCHLD};
    for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++)
        sigaction(sigs[i], &dfl, NULL);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    if (dup2(x->in_fd, 0) < 0 || dup2(x->out_fd, 1) < 0 || dup2(x->err_fd, 2) < 0)
        _exit(127);
    execve(x->path, x->argv, x->env);
    char        msg[600];
    size_t      k  = 0;
    const char *p1 = "dtrun: cannot execute ";
    for (const char *p = p1; *p && k < 400; p++)
        msg[k++] = *p;
    for (const char *p = x->path; *p && k < 500; p++)
        msg[k++] = *p;
    const char *p2 = " (errno ";
    for (const char *p = p2; *p; p++)
        msg[k++] = *p;
    k += fmt_int(msg + k, errno);
    msg[k++]  = ')';
    msg[k++]  = '\n';
    ssize_t w = write(2, msg, k);
    (void)w;
    _exit(127);
}

static dt_status mkdir_p(const char *dir) {
    char buf[4096];
    snprintf(buf, sizeof buf, "%s", dir);
    for (char *p = buf + 1;; p++) {
        if (*p == '/' || *p == '\0') {
            char c = *p;
            *p     = '\0';
            if (mkdir(buf, 0755) != 0 && errno != EEXIST)
                return dt_fail_errno(DT_ERR_IO, "cannot create directory %s", buf);
            *p = c;
            if (!c)
                break;
        }
    }
    return DT_OK;
}

static void close_fd(int *fd) {
    if (*fd >= 0)
        close(*fd);
    *fd = -1;
}

dt_status dtrun_group_start(dtrun_group *g, const dtrun_launch *l) {
    const dtrun_args *a = l->a;
    memset(g, 0, sizeof *g);
    g->n         = a->nproc;
    g->console   = !a->log_dir || a->tee;
    g->reaper_fd = l->reaper_fd;
    g->w         = dt_alloc_zero((size_t)g->n * sizeof *g->w);
    if (!g->w)
        return dt_last_status();
    for (int i = 0; i < g->n; i++) {
        dtrun_worker *w = &g->w[i];
        w->pid = -1, w->log_fd = -1, w->out.fd = -1, w->err.fd = -1;
        w->local_rank = i;
        w->rank       = a->node_rank * a->nproc + i;
        w->err.is_err = true;
    }
    // Kernels before 5.3 have no pidfd: the workers are then polled every 50 ms
    // (DTRUN_NO_PIDFD=1 exercises that path).
    const char   *no      = getenv("DTRUN_NO_PIDFD");
    dt_procs_opts popts   = {.own_groups = true, .no_pidfd = no && *no == '1'};
    dt_status     st      = dt_procs_new(&g->procs, g->n, &popts);
    int           null_fd = -1;
    if (st == DT_OK && l->attempt_log_dir)
        st = mkdir_p(l->attempt_log_dir);
    if (st == DT_OK && (null_fd = open("/dev/null", O_RDONLY | O_CLOEXEC)) < 0)
        st = dt_fail_errno(DT_ERR_IO, "cannot open /dev/null");
    if (st != DT_OK) {
        dtrun_group_free(g);
        return st;
    }

    for (int i = 0; i < g->n && st == DT_OK; i++) {
        dtrun_worker *w     = &g->w[i];
        int           po[2] = {-1, -1}, pe[2] = {-1, -1};
        char        **env = worker_env(l, i);
        if (!env) {
            st = dt_last_status();
            break;
        }
        if (l->attempt_log_dir) {
            char path[4200];
            snprintf(path, sizeof path, "%s/rank_%d.log", l->attempt_log_dir, w->rank);
            w->log_fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0644);
            if (w->log_fd < 0)
                st = dt_fail_errno(DT_ERR_IO, "cannot create log file %s", path);
        }
        if (st == DT_OK && (pipe2(po, O_CLOEXEC) != 0 || pipe2(pe, O_CLOEXEC) != 0))
            st = dt_fail_errno(DT_ERR_IO, "cannot create a pipe for rank %d", w->rank);
        if (st == DT_OK) {
            exec_args x = {.path   = a->prog_path,
                           .argv   = a->prog_argv,
                           .env    = env,
                           .in_fd  = null_fd,
                           .out_fd = po[1],
                           .err_fd = pe[1]};
            if (dt_procs_start(g->procs, i, child_exec, &x) != DT_OK) {
                st = dt_fail_errno(DT_ERR_IO, "cannot fork rank %d", w->rank);
            } else {
                w->pid = dt_procs_at(g->procs, i)->pid;
                g->nalive++;
                dtrun_reaper_add(g->reaper_fd, w->pid);
                w->out.fd = po[0], po[0] = -1;
                w->err.fd = pe[0], pe[0] = -1;
                fcntl(w->out.fd, F_SETFL, O_NONBLOCK);
                fcntl(w->err.fd, F_SETFL, O_NONBLOCK);
            }
        }
        for (int k = 0; k < 2; k++)
            close_fd(&po[k]), close_fd(&pe[k]);
        dt_free(env);
    }
    close(null_fd);
    if (st != DT_OK) {
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", dt_last_error());
        dtrun_group_finish(g, 0); // kills and reaps the workers already started
        dtrun_group_free(g);
        return dt_fail(st, "%s", msg);
    }
    return DT_OK;
}

// ------------------------------------------------------------------ output

static void tail_push(dtrun_tail *t, const char *line, size_t len) {
    int slot = (t->start + t->count) % DTRUN_TAIL_LINES;
    if (t->count == DTRUN_TAIL_LINES)
        t->start = (t->start + 1) % DTRUN_TAIL_LINES;
    else
        t->count++;
    if (len > DTRUN_LINE_MAX - 1)
        len = DTRUN_LINE_MAX - 1;
    memcpy(t->lines[slot], line, len);
    t->lines[slot][len] = '\0';
}

static void write_all(int fd, const struct iovec *iov, int n) {
    struct iovec v[4];
    memcpy(v, iov, (size_t)n * sizeof *v);
    int i = 0;
    while (i < n) {
        ssize_t k = writev(fd, v + i, n - i);
        if (k < 0) {
            if (errno == EINTR)
                continue;
            return; // a closed console (EPIPE) does not stop the job
        }
        while (i < n && (size_t)k >= v[i].iov_len)
            k -= (ssize_t)v[i++].iov_len;
        if (i < n) {
            v[i].iov_base = (char *)v[i].iov_base + k;
            v[i].iov_len -= (size_t)k;
        }
    }
}

static void emit_line(dtrun_group *g, dtrun_worker *w, bool is_err, char *line, size_t len) {
    if (len && line[len - 1] == '\r')
        len--;
    tail_push(&w->tail, line, len);
    char nl = '\n';
    if (w->log_fd >= 0) {
        struct iovec v[2] = {{line, len}, {&nl, 1}};
        write_all(w->log_fd, v, 2);
    }
    if (g->console) {
        char         prefix[32];
        int          pn   = snprintf(prefix, sizeof prefix, "[rank %d] ", w->rank);
        struct iovec v[3] = {{prefix, (size_t)pn}, {line, len}, {&nl, 1}};
        write_all(is_err ? 2 : 1, v, 3);
    }
}

static void flush_stream(dtrun_group *g, dtrun_worker *w, dtrun_stream *s) {
    if (s->len > 0)
        emit_line(g, w, s->is_err, s->buf, s->len);
    s->len = 0;
}

// Reads once from the stream; returns false at end-of-file or error (stream closed).
static bool read_stream(dtrun_group *g, dtrun_worker *w, dtrun_stream *s) {
    ssize_t k = read(s->fd, s->buf + s->len, sizeof s->buf - s->len);
    if (k < 0 && (errno == EAGAIN || errno == EINTR))
        return true;
    if (k <= 0) {
        flush_stream(g, w, s);
        close_fd(&s->fd);
        return false;
    }
    s->len += (size_t)k;
    size_t start = 0;
    for (size_t i = 0; i < s->len; i++)
        if (s->buf[i] == '\n') {
            emit_line(g, w, s->is_err, s->buf + start, i - start);
            start = i + 1;
        }
    memmove(s->buf, s->buf + start, s->len - start);
    s->len -= start;
    if (s->len == sizeof s->buf) // a line longer than the buffer: pass it on in pieces
        flush_stream(g, w, s);
    return true;
}

void dtrun_group_pump(dtrun_group *g, int fd) {
    for (int i = 0; i < g->n; i++) {
        dtrun_worker *w = &g->w[i];
        if (w->out.fd == fd && fd >= 0)
            read_stream(g, w, &w->out);
        else if (w->err.fd == fd && fd >= 0)
            read_stream(g, w, &w->err);
    }
}

// ------------------------------------------------------------------ stop and reap

void dtrun_group_stop(dtrun_group *g, int sig, int64_t grace_ms) {
    dt_procs_stop(g->procs, sig, grace_ms);
}

void dtrun_group_kill(dtrun_group *g) {
    dt_procs_kill(g->procs);
}

int dtrun_group_pidfd(const dtrun_group *g, int i) {
    const dt_proc *p = dt_procs_at(g->procs, i);
    return p ? p->pidfd : -1;
}

int dtrun_group_poll_ms(const dtrun_group *g, int timeout_ms) {
    return dt_procs_poll_ms(g->procs, timeout_ms);
}

typedef struct reap_ctx {
    dtrun_group *g;
    void (*on_end)(dtrun_worker *w, void *ctx);
    void *ctx;
} reap_ctx;

// The supervisor reaped worker i: its record, then the caller's on_end.
static void worker_ended(dt_procs *ps, int i, void *arg) {
    reap_ctx      *c = arg;
    dtrun_worker  *w = &c->g->w[i];
    const dt_proc *p = dt_procs_at(ps, i);
    w->signalled     = p->signalled;
    w->exit_code     = p->exit_code;
    w->term_signal   = p->term_signal;
    w->end_wall_ms   = dtrun_wall_ms();
    c->g->nalive--;
    if (c->on_end)
        c->on_end(w, c->ctx);
}

int dtrun_group_reap(dtrun_group *g, void (*on_end)(dtrun_worker *w, void *ctx), void *ctx) {
    reap_ctx c = {.g = g, .on_end = on_end, .ctx = ctx};
    return dt_procs_reap(g->procs, worker_ended, &c);
}

void dtrun_group_finish(dtrun_group *g, int drain_ms) {
    if (!g->w)
        return;
    // Whatever the workers started and left behind goes with them (and a worker still
    // alive, after a failed start, is killed and reaped).
    dt_procs_free(g->procs);
    g->procs = NULL;
    for (int i = 0; i < g->n; i++)
        if (g->w[i].pid > 0)
            dtrun_reaper_remove(g->reaper_fd, g->w[i].pid);
    // The output still in the pipes.
    uint64_t      deadline = dt_deadline_ns(drain_ms);
    struct pollfd pf[256];
    for (;;) {
        int n = 0;
        for (int i = 0; i < g->n && n < 255; i++) {
            if (g->w[i].out.fd >= 0)
                pf[n++] = (struct pollfd){.fd = g->w[i].out.fd, .events = POLLIN};
            if (g->w[i].err.fd >= 0)
                pf[n++] = (struct pollfd){.fd = g->w[i].err.fd, .events = POLLIN};
        }
        int left = dt_ms_left(deadline);
        if (n == 0 || left <= 0)
            break;
        if (poll(pf, (nfds_t)n, left) <= 0)
            continue;
        for (int k = 0; k < n; k++)
            if (pf[k].revents)
                dtrun_group_pump(g, pf[k].fd);
    }
    for (int i = 0; i < g->n; i++) {
        dtrun_worker *w = &g->w[i];
        if (w->out.fd >= 0)
            flush_stream(g, w, &w->out);
        if (w->err.fd >= 0)
            flush_stream(g, w, &w->err);
        close_fd(&w->out.fd);
        close_fd(&w->err.fd);
        close_fd(&w->log_fd);
    }
}

void dtrun_group_free(dtrun_group *g) {
    dt_procs_free(g->procs);
    g->procs = NULL;
    dt_free(g->w);
    g->w = NULL;
    g->n = 0;
}

void dtrun_worker_failure(const dtrun_worker *w, int node, const char *host, dtrun_failure *f) {
    memset(f, 0, sizeof *f);
    f->rank       = w->rank;
    f->local_rank = w->local_rank;
    f->node       = node;
    f->pid        = (int)w->pid;
    f->exit_code  = w->exit_code;
    f->signal     = w->term_signal;
    f->wall_ms    = w->end_wall_ms;
    snprintf(f->host, sizeof f->host, "%s", host);
    f->nlines = w->tail.count;
    for (int i = 0; i < w->tail.count; i++)
        memcpy(f->lines[i], w->tail.lines[(w->tail.start + i) % DTRUN_TAIL_LINES], DTRUN_LINE_MAX);
}
