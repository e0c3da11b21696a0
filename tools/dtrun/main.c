// dtrun: the launcher, torchrun's interface for dtrain programs (and any program that
// reads torchrun's environment).
//
//   dtrun --nproc-per-node 4 dtrain-mnist --batch-size 32
//   dtrun --nnodes 2 --node-rank K --master-addr 10.0.0.1 --nproc-per-node 2 prog ...
//
// The attempt loop: agree on the workers' port, start the local workers, watch them
// (and, across nodes, the monitor's news) until they all succeed or one fails; on a
// failure stop every worker (SIGTERM, then SIGKILL after --stop-grace), collect every
// node's report, print the summary, and restart the whole group while --max-restarts
// allows.
#include "dtrun.h"

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/signalfd.h>
#include <unistd.h>

typedef struct attempt {
    dtrun_rdzv *r;
    dtrun_group g;
    bool       *failed; // per local worker: failed on its own (not stopped by us)
    int         nfailed;
    bool        stopping;      // the workers have been told to stop
    int64_t     grace_ms;      // from the stop's signal to SIGKILL
    int64_t     term_grace_ms; // --term-grace
    uint64_t    stop_ns;       // when the stop began
    int         sig;           // a stop signal dtrun received (0 if none)
    char        reason[640];   // why the job stops for good ("" for worker failures)
    bool        local_done;    // every local worker exited 0
    bool        all_done;      // (several nodes) every node's workers exited 0
    bool        preempted;     // a worker was preempted on its own (exit 75, or SIGTERM)
    bool        term_stop;     // the job stops for a SIGTERM (here, elsewhere, a worker's)
    bool        unclean;       // a worker stopped by dtrun ended otherwise than with 0,
                               // 75 or by the SIGTERM itself (killed after the grace...)
} attempt;

// A worker's "stopped on SIGTERM, state saved, run me again later" (EX_TEMPFAIL).
#define EXIT_PREEMPTED 75

static void begin_stop(attempt *t, int sig) {
    if (t->stopping)
        return;
    t->stopping = true;
    t->stop_ns  = dt_now_ns();
    dtrun_group_stop(&t->g, sig, t->grace_ms);
}

static void on_end(dtrun_worker *w, void *ctx) {
    attempt *t = ctx;
    if (w->signalled) {
        // Stopped by dtrun: cleanly when it saved and said so (75), had finished (0), or
        // ended by the SIGTERM itself (before its program could set up a stop, or a
        // program without one: nothing of it was lost).
        bool exited = w->term_signal == 0;
        if (exited ? w->exit_code != 0 && w->exit_code != EXIT_PREEMPTED
                   : w->term_signal != SIGTERM)
            t->unclean = true;
        return;
    }
    if (w->exit_code == 0 && w->term_signal == 0)
        return;
    bool saved = w->exit_code == EXIT_PREEMPTED && w->term_signal == 0;
    if (saved || w->term_signal == SIGTERM) {
        // A preemption notice sent to the worker itself: it saved and stopped at a step
        // its peers agreed on (75), or the SIGTERM ended it before its program took
        // SIGTERM as a stop (its first moments): the same notice, nothing to restart.
        t->preempted = t->term_stop = true;
        if (!t->reason[0] && saved)
            snprintf(t->reason, sizeof t->reason,
                     "rank %d stopped on SIGTERM with exit status %d (preempted): not "
                     "restarting; run again with the program's resume flag",
                     w->rank, EXIT_PREEMPTED);
        else if (!t->reason[0])
            snprintf(t->reason, sizeof t->reason,
                     "rank %d was ended by a SIGTERM that dtrun did not send (preempted "
                     "before it could save; its last checkpoint stands): not restarting; run "
                     "again with the program's resume flag",
                     w->rank);
        if (!t->stopping && t->term_grace_ms > t->grace_ms)
            t->grace_ms = t->term_grace_ms; // the others get the time to save
        begin_stop(t, SIGTERM);
        dtrun_rdzv_post_stop(t->r, t->reason);
        return;
    }
    t->failed[w->local_rank] = true;
    t->nfailed++;
    if (!t->stopping) {
        begin_stop(t, SIGTERM);
        dtrun_rdzv_post_failed(t->r);
    }
}

static void stop_for(attempt *t, const char *reason) {
    // Another node's SIGTERM (a preemption of the whole job): the same time to save.
    if (strstr(reason, "SIGTERM"))
        t->term_stop = true;
    if (!t->stopping && strstr(reason, "SIGTERM") && t->term_grace_ms > t->grace_ms)
        t->grace_ms = t->term_grace_ms;
    if (!t->reason[0])
        snprintf(t->reason, sizeof t->reason, "%s", reason);
    begin_stop(t, SIGTERM);
}

// Runs one attempt; fills *mine with this node's report. Returns true on success.
// *preempted: a worker was preempted on its own. *term_clean: the job stopped for a
// SIGTERM (to dtrun, to another node's, to a worker) and every local worker stopped
// cleanly (0, 75, or by the SIGTERM; none failed or had to be killed).
static bool run_attempt(dtrun_rdzv *r, const dtrun_args *a, int n, int port, int reaper_fd,
                        int sig_fd, dtrun_report *mine, int *sig_out, bool *preempted,
                        bool *term_clean) {
    attempt t = {.r = r, .grace_ms = a->stop_grace_ms, .term_grace_ms = a->term_grace_ms};
    char    dir[4200];
    if (a->log_dir)
        snprintf(dir, sizeof dir, "%s/attempt_%d", a->log_dir, n);
    dtrun_launch l = {.a               = a,
                      .attempt         = n,
                      .master_addr     = a->master_addr,
                      .master_port     = port,
                      .token           = r->token,
                      .attempt_log_dir = a->log_dir ? dir : NULL,
                      .reaper_fd       = reaper_fd};
    memset(mine, 0, sizeof *mine);
    mine->node = a->node_rank;
    t.failed   = dt_alloc_zero((size_t)a->nproc * sizeof *t.failed);
    if (!t.failed || dtrun_group_start(&t.g, &l) != DT_OK) {
        snprintf(mine->reason, sizeof mine->reason, "could not start the workers: %s",
                 dt_last_error());
        dtrun_rdzv_post_stop(r, mine->reason);
        dt_free(t.failed);
        return false;
    }

    int            cap = 2 + 3 * t.g.n;
    struct pollfd *pf  = dt_alloc((size_t)cap * sizeof *pf);
    while (pf) {
        if (t.g.nalive == 0 && (t.stopping || !r->multi || t.all_done))
            break;
        int np   = 0;
        pf[np++] = (struct pollfd){.fd = sig_fd, .events = POLLIN};
        if (r->multi)
            pf[np++] = (struct pollfd){.fd = r->event_fd, .events = POLLIN};
        for (int i = 0; i < t.g.n; i++) {
            dtrun_worker *w     = &t.g.w[i];
            int           pidfd = dtrun_group_pidfd(&t.g, i);
            if (pidfd >= 0)
                pf[np++] = (struct pollfd){.fd = pidfd, .events = POLLIN};
            if (w->out.fd >= 0)
                pf[np++] = (struct pollfd){.fd = w->out.fd, .events = POLLIN};
            if (w->err.fd >= 0)
                pf[np++] = (struct pollfd){.fd = w->err.fd, .events = POLLIN};
        }
        // 100 ms at most: the store's silence is checked (and less while the stop's
        // SIGKILL is due sooner, or workers have no pidfd).
        int ready = poll(pf, (nfds_t)np, dtrun_group_poll_ms(&t.g, 100));
        if (ready < 0 && errno != EINTR)
            break;
        for (int k = r->multi ? 2 : 1; ready > 0 && k < np; k++)
            if (pf[k].revents && pf[k].fd >= 0)
                dtrun_group_pump(&t.g, pf[k].fd);

        int sig = dtrun_take_signal(sig_fd);
        if (sig) {
            if (t.sig) {
                dtrun_say("second signal: killing the workers now");
                dtrun_group_kill(&t.g);
            } else {
                t.sig = sig;
                char why[200];
                snprintf(why, sizeof why, "interrupted by SIG%s on node %d (host %s)",
                         sigabbrev_np(sig) ? sigabbrev_np(sig) : "?", a->node_rank, r->host);
                snprintf(t.reason, sizeof t.reason, "%s", why);
                // SIGTERM is a preemption notice: the workers get time to save.
                if (sig == SIGTERM && a->term_grace_ms > t.grace_ms && !t.stopping)
                    t.grace_ms = a->term_grace_ms;
                t.term_stop |= sig == SIGTERM;
                begin_stop(&t, sig); // the workers get the signal dtrun got, as from a tty
                dtrun_rdzv_post_stop(r, why);
            }
        }
        char     text[600];
        unsigned ev = dtrun_rdzv_take_events(r, text, sizeof text);
        if (ev & (DTRUN_EV_STOP | DTRUN_EV_NODE_LOST | DTRUN_EV_STORE_LOST))
            stop_for(&t, text);
        if (ev & DTRUN_EV_FAILED)
            begin_stop(&t, SIGTERM);
        if (ev & DTRUN_EV_ALL_DONE)
            t.all_done = true;
        int64_t silent_ms;
        if (dtrun_rdzv_silent(r, &silent_ms)) {
            r->store_lost = true;
            snprintf(text, sizeof text,
                     "lost contact with the store of node 0 at %s:%d: no answer for %.1f s "
                     "(node 0 is dead, or the link to it is cut)",
                     a->master_addr, a->master_port, (double)silent_ms / 1000.0);
            stop_for(&t, text);
        }

        dtrun_group_reap(&t.g, on_end, &t); // and the stop's SIGKILL once due
        if (t.g.nalive == 0 && !t.stopping && !t.local_done) {
            t.local_done = true;
            dtrun_rdzv_post_done(r);
        }
    }
    uint64_t gone_ns = dt_now_ns();
    dt_free(pf);
    dtrun_group_finish(&t.g, 500);

    bool ok = !t.stopping && t.nfailed == 0;
    if (t.stopping && t.stop_ns)
        DT_INFO("dtrun", "every local worker was gone %.1f ms after the stop began",
                (double)(gone_ns - t.stop_ns) / 1e6);
    // This node's report: its own failures, with the lines drained after they ended.
    snprintf(mine->reason, sizeof mine->reason, "%s", t.reason);
    if (t.nfailed && (mine->fail = dt_alloc_zero((size_t)t.nfailed * sizeof *mine->fail)))
        for (int i = 0; i < t.g.n; i++)
            if (t.failed[i])
                dtrun_worker_failure(&t.g.w[i], a->node_rank, r->host, &mine->fail[mine->nfail++]);
    dtrun_group_free(&t.g);
    dt_free(t.failed);
    *sig_out    = t.sig;
    *preempted  = t.preempted;
    *term_clean = t.term_stop && !t.unclean && t.nfailed == 0;
    return ok;
}

int main(int argc, char **argv) {
    dtrun_args a;
    int        rc = dtrun_args_parse(argc, argv, &a);
    if (rc)
        return rc == 1 ? 0 : rc;
    signal(SIGPIPE, SIG_IGN); // a closed console must not kill the launcher

    pid_t reaper_pid;
    int   reaper_fd = dtrun_reaper_start(&reaper_pid);

    // Stop signals arrive on a signalfd, in the main loop; blocked before any thread
    // starts, so no other thread takes them.
    sigset_t stop_sigs;
    sigemptyset(&stop_sigs);
    sigaddset(&stop_sigs, SIGINT);
    sigaddset(&stop_sigs, SIGTERM);
    sigaddset(&stop_sigs, SIGHUP);
    sigprocmask(SIG_BLOCK, &stop_sigs, NULL);
    int sig_fd = signalfd(-1, &stop_sigs, SFD_CLOEXEC | SFD_NONBLOCK);
    if (sig_fd < 0) {
        dtrun_say("cannot create a signalfd: %s", strerror(errno));
        dtrun_reaper_stop(reaper_fd, reaper_pid);
        return 1;
    }

    dtrun_rdzv r;
    rc = dtrun_rdzv_join(&r, &a, sig_fd);
    for (int n = 0; rc == 0; n++) {
        int port;
        if ((rc = dtrun_rdzv_begin(&r, n, &port)) != 0)
            break;
        dtrun_report mine;
        int          sig       = 0;
        bool         preempted = false, term_clean = false;
        if (run_attempt(&r, &a, n, port, reaper_fd, sig_fd, &mine, &sig, &preempted, &term_clean)) {
            dtrun_report_clear(&mine);
            break; // rc 0
        }
        dtrun_report *all;
        int           nall;
        bool          stop;
        dtrun_rdzv_end(&r, n, &mine, &all, &nall, &stop);
        bool restart =
            !stop && !preempted && n < a.max_restarts && dtrun_root_cause(all, nall) != NULL;
        dtrun_print_summary(all, nall, n, a.max_restarts, restart, a.log_dir);
        for (int j = 0; j < nall; j++)
            dtrun_report_clear(&all[j]);
        dt_free(all);
        dtrun_report_clear(&mine);
        if (!sig)
            sig = r.late_signal;
        if (!restart || sig) {
            // Stopped for a SIGTERM, every worker cleanly: the workers' own status, 75
            // ("run me again"), the same whichever process got the notice. Otherwise a
            // signal's 128+N (a worker had to be killed, or SIGINT/SIGHUP).
            rc = term_clean ? EXIT_PREEMPTED : sig ? 128 + sig : preempted ? EXIT_PREEMPTED : 1;
            break;
        }
    }
    dtrun_rdzv_leave(&r);
    if (rc == 0 && r.late_signal)
        rc = 128 + r.late_signal;
    dtrun_reaper_stop(reaper_fd, reaper_pid);
    return rc;
}
