// ps.h: the synchronous parameter server (--ps N; docs/ps.md). The last N ranks of the
// world are servers; server s holds the contiguous range s of the flat parameters
// ([s*n/N, (s+1)*n/N) of n floats) and the optimizer's state for it. Each step every
// worker sends server s its slice s of its gradient; server s sums the slices in worker
// order, divides by the number of workers, steps its optimizer on its range and sends
// the range back to every worker. Everything goes over the world group's send/recv
// (the tcp or shm transport, authenticated with the job token); every wait is the
// group's timeout, and a dead peer is named by its liveness checks.
//
//     worker w                              server s
//     ctrl {STEP, lr} + grad[range s] --->  sum over w = 0..W-1 (in order), / W
//                                           optimizer step on range s
//     params[range s]                 <---  to every worker
//     a checkpoint: ctrl {STATE}      --->  its range of the optimizer's state, to each
//     at the end: ctrl {DONE}         --->  returns from dt_ps_serve once all said so
//
// Asynchronous (staleness K >= 1): a server takes the workers' messages in arrival order
// (dt_pg_wait_any) and applies each push at once (its gradient / W, the optimizer's step);
// after pushing to every server a worker sends ctrl {PULL}, and the server replies with
// its range unless the worker would then be more than K steps ahead of the slowest worker
// still training: that reply waits for the slowest one's pushes.
#ifndef DTRAIN_PARALLEL_PS_H
#define DTRAIN_PARALLEL_PS_H

#include "dtrain/comm.h"
#include "dtrain/optim.h"
#include "dtrain/params.h"

typedef struct dt_ps dt_ps;

// Collective over `world` (every rank, workers and servers): the last `servers` ranks
// serve. p and opt are borrowed (the same table on every rank). On a server the
// optimizer is restricted to its range (dt_optim_shard) and the range's parameters are
// taken from worker 0, so every rank starts from worker 0's model.
// staleness: 0 synchronous; K >= 1 asynchronous (below); < 0 refused (DT_ERR_ARG).
dt_status dt_ps_new(dt_ps **out, dt_params *p, dt_optim *opt, dt_pg *world, int servers,
                    int staleness);
void      dt_ps_free(dt_ps *ps); // NULL-safe
bool      dt_ps_is_server(const dt_ps *ps);
// A server: serves steps until every worker has said DONE (DT_OK), or the first error.
dt_status dt_ps_serve(dt_ps *ps);
// A worker: the step. The gradient (this worker's, already averaged over its window)
// pushed to the servers, the updated parameters pulled back into p.
dt_status dt_ps_push_pull(dt_ps *ps);
// A worker (every worker at once, at a checkpoint): the servers' optimizer state and
// step count into this worker's optimizer, the whole table's, which checkpoints save.
// dt_ps_new gives a resumed run's state (worker 0's) to the servers the same way.
dt_status dt_ps_pull_state(dt_ps *ps);
// Asynchronous: every worker (all at one step, after a barrier of theirs) takes the
// servers' parameters as they are, so that all hold one model (before an evaluation,
// a checkpoint, the end). A no-op when synchronous (every pull is that model already).
dt_status dt_ps_pull_params(dt_ps *ps);
// A worker: no push since its last dt_ps_pull_params (true before the first push, as
// every worker starts from worker 0's model; true for NULL). Every worker pushes at every
// step, so all workers agree on it, and a repeated settle can be skipped by all at once.
bool dt_ps_settled(const dt_ps *ps);
int  dt_ps_staleness(const dt_ps *ps); // 0: synchronous (or NULL)
// A worker: training is over (the servers end their loop).
dt_status dt_ps_close(dt_ps *ps);
// Steps served (a server) or taken (a worker) so far.
int64_t dt_ps_step(const dt_ps *ps);
// A worker's seconds in dt_ps_push_pull so far (0 for NULL).
double dt_ps_wait_secs(const dt_ps *ps);
// Bytes a worker receives per step (the whole parameters; it sends as many: the gradient),
// as strategy.h's moved_per_step counts a ring all-reduce's.
double dt_ps_bytes_per_step(const dt_ps *ps); // 0 for NULL

#endif // DTRAIN_PARALLEL_PS_H
