// shm.h: the shared-memory engine behind the "shm" backend, for ranks that share one
// host. One segment in /dev/shm, created by rank 0 and mapped by every rank, holds a
// control slot per rank (a step counter that doubles as a futex word, and the
// fingerprints of its last collectives), working buffers per rank, and a channel per
// ordered pair of ranks for point-to-point messages. Data never touches a socket.
//
// The engine is a transport: the algorithm layer runs its "shm" algorithms over the
// segment (src/comm/algo/staged.c, with the engine's insides of shm_impl.h) and its
// point-to-point algorithms over the channels (dt_shm_xfer_post / _wait below).
// shm_backend.c plugs the engine into the backend table.
//
// Contract shared by every operation (each takes the dt_op of backend.h: buffers,
// count, dtype, op, root, peer, tag, deadline, fingerprint, name):
//   - One thread at a time per dt_shm.
//   - Collectives are collective: every rank calls the same ones in the same order;
//     a rank whose fingerprint (op->fp) differs makes every rank fail with
//     DT_ERR_MISMATCH printing both fingerprints.
//   - Past op->deadline_ns a wait fails with DT_ERR_TIMEOUT naming the ranks not there
//     (and what they were last doing); the other ranks then fail fast as well.
//   - A rank that dies (any signal, or exit without dt_shm_free) makes the pending and
//     later operations of every other rank fail with DT_ERR_PEER naming it, within
//     about 100 ms of the moment someone waits on it.
//   - After any failure the engine is poisoned: later calls fail at once with the
//     same status and message.
//   - src == dst means in place, with the in-place forms of comm.h. count 0 is valid
//     and still synchronises (and compares fingerprints).
// The algorithms and the memory layout are described in docs/shm.md.
#ifndef DTRAIN_COMM_SHM_H
#define DTRAIN_COMM_SHM_H

#include "comm/backend.h"

typedef struct dt_shm_opts {
    int         rank;        // 0 <= rank < world
    int         world;       // >= 1
    const char *name;        // segment name "/dtrain-..." (shm_open rules); rank 0 creates it
    uint64_t    nonce;       // written by rank 0 and checked by the others; 0 = no check
    const int  *pids;        // world process ids (liveness during the attach), or NULL
    size_t      chunk_bytes; // per-rank working buffer; 0 = DT_SHM_CHUNK_BYTES env or default
    size_t      small_bytes; // all_reduce up to this size synchronises once; 0 = default
    uint64_t    deadline_ns; // for the attach; UINT64_MAX = none
    bool        must_exist;  // ranks > 0: the name was published after creation, so a
                             // missing segment means another /dev/shm: fail at once
    // Rank 0 only, optional: called once the segment can be opened by the others
    // (e.g. to publish its name through the store), before waiting for them.
    dt_status (*created)(void *arg);
    void *created_arg;
    // Optional: true once the caller's group was aborted from elsewhere; checked
    // every ~10 ms while sleeping, then the wait returns DT_ERR_STATE.
    bool (*aborted)(void *arg);
    void *aborted_arg;
    // Optional: pushes the sends held by every engine of the process (this one's
    // included, through dt_shm_push); true while some remain. Called at the start of
    // operations and between the checks of every wait. NULL: each engine pushes its own.
    bool (*push)(void *arg);
    void *push_arg;
} dt_shm_opts;

// Creates (rank 0) or opens (others) the segment, waits until all `world` ranks have
// mapped it, then removes its name so nothing is left in /dev/shm whatever happens
// later. Returns an owned engine in *out; free with dt_shm_free. Errors: DT_ERR_ARG,
// DT_ERR_IO (/dev/shm full or missing: names the size), DT_ERR_MISMATCH (a segment
// of another group or world size), DT_ERR_TIMEOUT (names the ranks that never came),
// DT_ERR_PEER (a rank died meanwhile).
dt_status dt_shm_init(const dt_shm_opts *opts, dt_shm **out);
// dt_shm_init for rank `rank` of `world` ranks that meet through `store` (a view of
// their own): they publish their process ids (a rank in another pid namespace is
// DT_ERR_UNSUPPORTED), rank 0 creates the segment and publishes its name. The engine
// calls back into `pg` (dt_pg_aborted, dt_pg_progress, dt_pg_push_sends) while it waits.
// COLLECTIVE over the `world` ranks; bounded by deadline_ns. (shm_backend.c)
dt_status dt_shm_join(dt_pg *pg, int rank, int world, dt_store *store, uint64_t deadline_ns,
                      dt_shm **out);
// Marks this rank as gone (peers that still wait on it fail with "left the group"),
// and unmaps. NULL is a no-op. Not collective.
void dt_shm_free(dt_shm *s);

// Bytes of /dev/shm that a segment for `world` ranks takes with the default (or
// DT_SHM_CHUNK_BYTES) sizing; 0 if it cannot be sized. Grows with world^2 (the
// point-to-point channels): about 8 GiB for 1000 ranks.
size_t dt_shm_segment_bytes(int world);

int    dt_shm_rank(const dt_shm *s);
int    dt_shm_world(const dt_shm *s);
size_t dt_shm_chunk_bytes(const dt_shm *s);

// The transfer slots of backend.h over the channels: xfer_post queues a transfer
// (never waits), xfer_wait moves every queued one until `x` is done. ctx is the dt_shm.
dt_status dt_shm_xfer_post(void *ctx, const dt_op *op, dt_xfer *x);
dt_status dt_shm_xfer_wait(void *ctx, const dt_op *op, dt_xfer *x);
// backend.h's xfer_ready: a chunk from `peer` waits in its channel (or the segment
// records a failure, which the receive that follows reports).
bool dt_shm_xfer_ready(void *ctx, int peer);

// Point to point: messages between two ranks arrive in the order they were sent; the
// receiver's count, dtype and tag must equal the sender's, or both fail with
// DT_ERR_MISMATCH. A send never waits for the receiver: what does not fit in the
// channel is copied and held, and pushed as the receiver makes room by this rank's
// later operations (of any engine, through opts.push) and by dt_shm_push.

// Pushes held chunks into channels with room; never waits. Sets *moved when it posted
// some. Returns true while some remain held; false after a failure of the engine (they
// will never be taken; dt_shm_free drops them). The engine's one-thread rule holds.
bool dt_shm_push(dt_shm *s, bool *moved);
// Waits until nothing is held (every chunk posted), pushing as the receivers make room,
// until deadline_ns (DT_ERR_TIMEOUT naming the receiver), a receiver that died or left
// (DT_ERR_PEER naming it) or a failure of the group. The message names the send and the
// bytes never delivered. DT_OK at once when nothing is held or the engine failed before.
dt_status dt_shm_flush(dt_shm *s, uint64_t deadline_ns);

// Makes every rank's pending and later calls fail (the process group calls it after
// a failure it saw, or dt_pg_abort): they get DT_ERR_PEER (st itself for a mismatch or
// a timeout) with "<msg> (reported by rank r)". Idempotent: the first failure recorded
// in the segment wins; failures the engine sees itself are recorded the same way.
void dt_shm_abort(dt_shm *s, dt_status st, const char *msg);

#endif // DTRAIN_COMM_SHM_H
