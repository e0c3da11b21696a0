// dtrun.h: the parts of the dtrun launcher and what they share.
//
// dtrun starts one worker process per local rank with torchrun's environment, relays
// and logs their output, stops the whole job when one worker fails, restarts it up to
// --max-restarts times, and with --nnodes > 1 agrees with the dtruns of the other nodes
// through a store hosted by node 0's dtrun. It uses the public dtrain API only.
//
//   args.c     command line (getopt_long; --help printed from the same table)
//   workers.c  the workers: their environment, exec, output and logs; forking,
//              stopping and reaping them is the library's supervisor (dt_procs)
//   reaper.c   the guard process that kills every worker if dtrun itself dies
//   rdzv.c     multi-node: join, heartbeats, failure news, restarts, exit barrier
//   report.c   failure records: text form for the store, the summary
//   main.c     the attempt loop
#ifndef DTRUN_DTRUN_H
#define DTRUN_DTRUN_H

#include "dtrain/comm.h"
#include "dtrain/launch.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

// ------------------------------------------------------------------ command line

typedef struct dtrun_args {
    int         nproc;       // --nproc-per-node
    int         nnodes;      // --nnodes (1 under elastic membership: this node alone)
    int         elastic_min; // --nnodes MIN:MAX with MIN < MAX (0: a fixed job)
    int         elastic_max;
    int         node_rank;       // --node-rank
    bool        node_rank_given; // from the flag or PET_NODE_RANK
    const char *master_addr;     // --master-addr, else $MASTER_ADDR, else 127.0.0.1
    int         master_port;     // --master-port, else $MASTER_PORT; 0 = a free port
    bool        port_given;      // master_port came from the flag or the environment
    bool        standalone;      // --standalone
    int         max_restarts;    // --max-restarts
    const char *log_dir;         // --log-dir or NULL
    bool        tee;             // --tee
    const char *run_id;          // --rdzv-id, default "none"
    int64_t     rdzv_timeout_ms; // --rdzv-timeout: nodes joining
    int64_t     node_timeout_ms; // --node-timeout: silence before a node counts as lost
    int64_t     stop_grace_ms;   // --stop-grace: SIGTERM to SIGKILL
    int64_t     term_grace_ms;   // --term-grace: the same after dtrun itself got SIGTERM
    char      **prog_argv;       // PROGRAM ARGS..., NULL-terminated (borrowed from argv)
    char        prog_path[4096]; // PROGRAM resolved through PATH
} dtrun_args;

// Parses the command line. Returns 0 to run, 1 when --help/--version printed what
// was asked (exit 0), 2 after printing a usage error (exit 2).
int dtrun_args_parse(int argc, char **argv, dtrun_args *a);

// ------------------------------------------------------------------ failures

#define DTRUN_TAIL_LINES 12  // lines of a worker's output kept for the summary
#define DTRUN_LINE_MAX   240 // bytes kept of each such line

// One worker that failed (exited non-zero or was killed) before dtrun stopped it.
typedef struct dtrun_failure {
    int     rank, local_rank, node, pid;
    int     exit_code; // -1 when killed by a signal
    int     signal;    // 0 when it exited
    int64_t wall_ms;   // when dtrun saw it end (CLOCK_REALTIME, ms)
    char    host[64];
    int     nlines; // its last lines, oldest first
    char    lines[DTRUN_TAIL_LINES][DTRUN_LINE_MAX];
} dtrun_failure;

// What one node says about an attempt that failed: its own failed workers and, when
// the job stops for another reason (a signal, a lost node), that reason.
typedef struct dtrun_report {
    int            node;
    char           reason[640]; // "" when workers failed on their own
    int            nfail;
    dtrun_failure *fail;       // nfail records, dt_alloc'd
    bool           missing;    // the node never reported
    char           where[160]; // "host H, address A" (not sent: each node knows it)
} dtrun_report;

// Text form of a report for the store; returns a dt_alloc'd NUL-terminated string.
char *dtrun_report_encode(const dtrun_report *r);
// Parses dtrun_report_encode's text (from another node: checked, never trusted).
dt_status dtrun_report_decode(const char *text, dtrun_report *r);
void      dtrun_report_clear(dtrun_report *r);
// "2024-05-01 12:00:00.123" in local time.
void dtrun_format_time(int64_t wall_ms, char *buf, size_t n);
// The failure summary for the reports of every node, on stderr. Picks the root cause
// (the earliest failure). attempt counts from 0; restarting says what happens next.
void dtrun_print_summary(const dtrun_report *reports, int nreports, int attempt, int max_restarts,
                         bool restarting, const char *log_dir);
// The root cause among all reports (earliest wall time; a signal death wins a tie),
// or NULL when no worker failed.
const dtrun_failure *dtrun_root_cause(const dtrun_report *reports, int nreports);

// ------------------------------------------------------------------ workers

// Keeps the last DTRUN_TAIL_LINES lines of a worker's output.
typedef struct dtrun_tail {
    char lines[DTRUN_TAIL_LINES][DTRUN_LINE_MAX];
    int  start, count;
} dtrun_tail;

// One output pipe of a worker and its unfinished last line.
typedef struct dtrun_stream {
    int    fd;     // read end, -1 once closed
    bool   is_err; // the worker's stderr (relayed to dtrun's stderr)
    size_t len;
    char   buf[4096];
} dtrun_stream;

typedef struct dtrun_worker {
    int          local_rank, rank;
    pid_t        pid;       // also its process group id; -1 until started
    bool         signalled; // dtrun sent it a stop signal before it ended
    int          exit_code; // once it ended (dt_proc's meaning: -1 when killed)
    int          term_signal;
    int64_t      end_wall_ms;
    int          log_fd; // -1 without --log-dir
    dtrun_stream out, err;
    dtrun_tail   tail;
} dtrun_worker;

// What every worker of one attempt gets.
typedef struct dtrun_launch {
    const dtrun_args *a;
    int               attempt; // restart count
    const char       *master_addr;
    int               master_port;
    const char       *token;           // DT_JOB_TOKEN
    const char       *attempt_log_dir; // NULL without --log-dir
    int               reaper_fd;       // -1 without a reaper
} dtrun_launch;

typedef struct dtrun_group {
    int           n, nalive;
    dtrun_worker *w;
    dt_procs     *procs; // the workers' processes (the library's supervisor); NULL once
                         // finished
    bool console;        // relay output to dtrun's stdout/stderr
    int  reaper_fd;
} dtrun_group;

// Starts the local workers under the library's supervisor (dt_procs, launch.h): each in
// its own process group, dying with dtrun and registered with the reaper. On failure
// the workers already started are killed and reaped, and the error is returned.
dt_status dtrun_group_start(dtrun_group *g, const dtrun_launch *l);
// Begins the stop of every live worker: `sig` to its process group now, SIGKILL after
// grace_ms (sent by dtrun_group_reap once due). Only the first call counts.
void dtrun_group_stop(dtrun_group *g, int sig, int64_t grace_ms);
// SIGKILL to every live worker's process group now.
void dtrun_group_kill(dtrun_group *g);
// The pidfd of worker i for the poll loop; -1 once it was reaped or without one.
int dtrun_group_pidfd(const dtrun_group *g, int i);
// The poll loop's timeout: timeout_ms cut to the stop's SIGKILL, and to 50 ms while a
// worker has no pidfd.
int dtrun_group_poll_ms(const dtrun_group *g, int timeout_ms);
// Reads what is available on a worker's pipe `fd` and relays whole lines.
void dtrun_group_pump(dtrun_group *g, int fd);
// Reaps the workers that have exited; calls on_end for each; sends the stop's SIGKILL
// when due. Returns how many ended.
int dtrun_group_reap(dtrun_group *g, void (*on_end)(dtrun_worker *w, void *ctx), void *ctx);
// After every worker is reaped: kills what is left in their process groups, drains
// the pipes (at most drain_ms), closes pipes and logs. The workers' records stay.
void dtrun_group_finish(dtrun_group *g, int drain_ms);
void dtrun_group_free(dtrun_group *g);
// Fills a failure record from a reaped worker.
void dtrun_worker_failure(const dtrun_worker *w, int node, const char *host, dtrun_failure *f);

// ------------------------------------------------------------------ reaper

// Forks the guard process. It kills (SIGKILL) every process group registered with it
// when dtrun ends without saying goodbye (crash, SIGKILL). Returns the pipe to it, or
// -1 (with a warning) if it could not be started; *pid receives its pid.
int  dtrun_reaper_start(pid_t *pid);
void dtrun_reaper_add(int fd, pid_t pgid);
void dtrun_reaper_remove(int fd, pid_t pgid);
// Tells it that every worker is gone, and waits for it to exit.
void dtrun_reaper_stop(int fd, pid_t pid);

// ------------------------------------------------------------------ multi-node

// Events the monitor thread reports to the main loop (bits).
enum {
    DTRUN_EV_FAILED     = 1 << 0, // another node says the attempt failed
    DTRUN_EV_STOP       = 1 << 1, // the job stops for good (reason in ev_text)
    DTRUN_EV_ALL_DONE   = 1 << 2, // every node's workers succeeded
    DTRUN_EV_NODE_LOST  = 1 << 3, // (node 0) a node fell silent (ev_text)
    DTRUN_EV_STORE_LOST = 1 << 4, // the store of node 0 is unreachable (ev_text)
};

typedef struct dtrun_node {
    char host[64], addr[64];
    int  pid, nproc, max_restarts;
    bool lost; // (node 0) declared lost: its reports are not awaited
} dtrun_node;

typedef struct dtrun_rdzv {
    const dtrun_args *a;
    bool              multi; // nnodes > 1
    int               node, nnodes;
    dt_store         *store;
    dtrun_node       *nodes; // nnodes entries once joined
    char              token[80];
    char              host[64], addr[64];
    int               sig_fd;     // signalfd of dtrun, watched while waiting
    bool              registered; // this dtrun holds its node rank in the store

    // Monitor thread (multi-node only).
    pthread_t       thread;
    bool            thread_started;
    pthread_mutex_t mu;
    int             event_fd;      // readable when events has bits
    unsigned        events;        // guarded by mu
    char            ev_text[600];  // guarded by mu
    int             attempt;       // guarded by mu
    bool            pub_failed;    // guarded by mu: tell the others attempt failed
    bool            pub_done;      // guarded by mu: this node's workers succeeded
    char            pub_stop[512]; // guarded by mu: the job stops for good, for this reason
    bool            quit;          // guarded by mu
    _Atomic int64_t last_ok_ns;    // last store call that succeeded (monitor thread)
    atomic_bool     monitor_done;  // the monitor thread has returned
    bool            store_lost;    // main thread: never touch the store again
    int             late_signal;   // a stop signal read outside an attempt (main thread)
    bool            elastic_host;  // elastic: this dtrun serves the rendezvous store
} dtrun_rdzv;

// Elastic membership (elastic.c, --nnodes MIN:MAX): each dtrun supervises its own
// workers alone; the workers regroup through the rendezvous store at --rdzv-endpoint,
// which the first dtrun on the endpoint's host serves. _join: the job's token, and the
// store when this dtrun is on the endpoint's host and its port is free (else another
// serves it). _leave: the host keeps the store up until every member of the last
// generation has left (bounded by --node-timeout).
int  dtrun_elastic_join(dtrun_rdzv *r, const dtrun_args *a);
void dtrun_elastic_leave(dtrun_rdzv *r);

// Single node: picks the token. Several: connects (node 0 serves the store), registers
// this node, waits for the others (listing those missing at the timeout), checks they
// run the same configuration, reads the token, and starts the monitor thread.
// Returns 0, or the exit code after printing why (1 runtime, 128+sig interrupted).
int dtrun_rdzv_join(dtrun_rdzv *r, const dtrun_args *a, int sig_fd);
// The MASTER_PORT of the workers of `attempt`: node 0 picks a free port (unless one
// was given for a single node) and publishes it; the others wait for it. Returns 0 or
// an exit code after printing why.
int dtrun_rdzv_begin(dtrun_rdzv *r, int attempt, int *port);
// Non-blocking: asks the monitor thread to tell the others.
void dtrun_rdzv_post_failed(dtrun_rdzv *r);
void dtrun_rdzv_post_done(dtrun_rdzv *r);
// Sets the job-wide stop reason (signals): no node restarts afterwards.
void dtrun_rdzv_post_stop(dtrun_rdzv *r, const char *reason);
// Takes the pending events (and their text) reported by the monitor thread.
unsigned dtrun_rdzv_take_events(dtrun_rdzv *r, char *text, size_t n);
// True when the monitor has not completed a store call for longer than the node
// timeout (the link or node 0 is gone).
bool dtrun_rdzv_silent(dtrun_rdzv *r, int64_t *silent_ms);
// After a failed attempt, once every local worker is gone: publishes this node's
// report and collects every node's (*out: nnodes reports, or 1 for a single node;
// free with dtrun_report_clear each and dt_free). *stop tells whether the job must
// stop rather than restart (a signal, a lost node, a missing report).
void dtrun_rdzv_end(dtrun_rdzv *r, int attempt, dtrun_report *mine, dtrun_report **out, int *nout,
                    bool *stop);
// The exit barrier: node 0 keeps its store up until the others have read the outcome.
void dtrun_rdzv_leave(dtrun_rdzv *r);

// ------------------------------------------------------------------ small helpers

// Realtime clock in milliseconds.
int64_t dtrun_wall_ms(void);
// Prints "dtrun: <message>\n" on stderr in one write.
void dtrun_say(const char *fmt, ...) DT_PRINTF(1, 2);
// Reads a pending signal from the signalfd; 0 when none.
int dtrun_take_signal(int sig_fd);

#endif // DTRUN_DTRUN_H
