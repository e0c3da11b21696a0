// shm.h: the shared-memory collective engine behind the "shm" backend, for ranks that
// share one host. One segment in /dev/shm, created by rank 0 and mapped by every rank,
// holds a control slot per rank (a step counter that doubles as a futex word, and the
// fingerprints of the last collectives), two working buffers per rank, and a channel
// per ordered pair of ranks for send/recv. Data never touches a socket.
//
// Contract shared by every call below:
//   - One thread at a time per dt_shm (the process group's progress thread).
//   - Collectives are collective: every rank calls the same ones in the same order;
//     a rank that calls a different one, or the same one with another count, dtype,
//     op or root, makes every rank fail with DT_ERR_MISMATCH printing both sides.
//   - `deadline_ns` is absolute on the dt_now_ns clock (dt_deadline_ns(-1): never).
//     A wait that passes it fails with DT_ERR_TIMEOUT naming the ranks not there.
//   - A rank that dies (any signal, exit without dt_shm_free) makes the pending and
//     later calls of every other rank fail with DT_ERR_PEER naming it, within about
//     DT_SHM_POLL_MS (100 ms) of the moment someone waits on it.
//   - After any failure the engine is poisoned: later calls fail at once with the
//     same status and message. Results are bitwise identical on every rank and from
//     run to run: reductions combine ranks in rank order, 0, 1, 2, ...
//   - src == dst means in place. count == 0 is valid and still synchronises.
// The algorithms and the memory layout are described in docs/shm.md.
#ifndef DTRAIN_COMM_SHM_H
#define DTRAIN_COMM_SHM_H

#include "dtrain/core.h"

#if __has_include("dtrain/comm.h")
#include "dtrain/comm.h"
#else
// Until the public communication header lands, the same names it will define.
typedef enum dt_dtype { DT_FLOAT32, DT_INT32, DT_INT64, DT_DTYPE_COUNT_ } dt_dtype;
typedef enum dt_reduce_op {
    DT_REDUCE_SUM,
    DT_REDUCE_AVG,
    DT_REDUCE_MAX,
    DT_REDUCE_MIN,
    DT_REDUCE_PROD,
    DT_REDUCE_COUNT_
} dt_reduce_op;
#endif

typedef struct dt_shm dt_shm;

typedef struct dt_shm_opts {
    int         rank;         // 0 <= rank < world
    int         world;        // >= 1
    const char *name;         // segment name, "/dtrain-..." (shm_open rules); rank 0 creates it
    uint64_t    nonce;        // written by rank 0 and checked by the others; 0 = no check
    const int  *pids;         // world process ids (liveness during attach), or NULL
    size_t      chunk_bytes;  // per-rank working buffer; 0 = DT_SHM_CHUNK_BYTES env or default
    size_t      small_bytes;  // all_reduce up to this size uses one synchronisation; 0 = default
    int64_t     timeout_ms;   // for the attach; < 0 = never
} dt_shm_opts;

// Creates (rank 0) or opens (others) the segment, waits until all `world` ranks have
// mapped it, then removes its name so nothing is left in /dev/shm whatever happens
// later. Returns an owned engine in *out; free with dt_shm_free. Errors: DT_ERR_ARG,
// DT_ERR_IO (/dev/shm full or missing: names the size), DT_ERR_MISMATCH (a segment
// of another job or world size), DT_ERR_TIMEOUT (names the ranks that never came),
// DT_ERR_PEER (a rank died meanwhile).
dt_status dt_shm_init(const dt_shm_opts *opts, dt_shm **out);
// Marks this rank as gone (peers waiting on it fail with "left the group") and unmaps.
// NULL is a no-op. Not collective.
void dt_shm_free(dt_shm *s);

int    dt_shm_rank(const dt_shm *s);
int    dt_shm_world(const dt_shm *s);
size_t dt_shm_chunk_bytes(const dt_shm *s);

// dst[i] = src_0[i] op src_1[i] op ... on every rank (AVG: the SUM divided by world).
dt_status dt_shm_all_reduce(dt_shm *s, const void *src, void *dst, size_t count,
                            dt_dtype dtype, dt_reduce_op op, uint64_t deadline_ns);
// Same result, on `root` only; dst is not touched (may be NULL) elsewhere.
dt_status dt_shm_reduce(dt_shm *s, const void *src, void *dst, size_t count, dt_dtype dtype,
                        dt_reduce_op op, int root, uint64_t deadline_ns);
// buf of `root` copied into buf of every rank.
dt_status dt_shm_broadcast(dt_shm *s, void *buf, size_t count, dt_dtype dtype, int root,
                           uint64_t deadline_ns);
// dst (world * count) = src of rank 0, src of rank 1, ...
dt_status dt_shm_all_gather(dt_shm *s, const void *src, void *dst, size_t count,
                            dt_dtype dtype, uint64_t deadline_ns);
// Same, on `root` only (dst ignored elsewhere).
dt_status dt_shm_gather(dt_shm *s, const void *src, void *dst, size_t count, dt_dtype dtype,
                        int root, uint64_t deadline_ns);
// dst (count) of rank r = block r of root's src (world * count).
dt_status dt_shm_scatter(dt_shm *s, const void *src, void *dst, size_t count, dt_dtype dtype,
                         int root, uint64_t deadline_ns);
// src is world blocks of `count`; dst (count) of rank r = block r reduced over ranks.
dt_status dt_shm_reduce_scatter(dt_shm *s, const void *src, void *dst, size_t count,
                                dt_dtype dtype, dt_reduce_op op, uint64_t deadline_ns);
// src and dst are world blocks of `count`; block j of src goes to rank j, and block j
// of dst comes from rank j.
dt_status dt_shm_all_to_all(dt_shm *s, const void *src, void *dst, size_t count,
                            dt_dtype dtype, uint64_t deadline_ns);
dt_status dt_shm_barrier(dt_shm *s, uint64_t deadline_ns);

// Point to point, not collective. Messages between two ranks arrive in the order they
// were sent; a recv must name the same tag, count and dtype as the matching send, or
// both sides fail with DT_ERR_MISMATCH. A send returns once its data is in the channel
// (up to two chunks are buffered; a longer message waits for the receiver).
dt_status dt_shm_send(dt_shm *s, const void *buf, size_t count, dt_dtype dtype, int peer,
                      int tag, uint64_t deadline_ns);
dt_status dt_shm_recv(dt_shm *s, void *buf, size_t count, dt_dtype dtype, int peer, int tag,
                      uint64_t deadline_ns);

// Makes every rank's pending and later calls fail with `status` and `reason` (the
// process group calls it when it learns of a failure elsewhere). Idempotent: the first
// reason recorded in the segment wins.
void dt_shm_abort(dt_shm *s, dt_status status, const char *reason);

// ---------------------------------------------------------------- kernels (shm_kernels.c)

size_t dt_shm_dtype_size(dt_dtype dtype);
const char *dt_shm_dtype_name(dt_dtype dtype);
const char *dt_shm_op_name(dt_reduce_op op);

// out = in[0] op in[1] op ... op in[nin-1], element by element, combining in that
// order (AVG: the SUM divided by nin). Written to out1 and to out2 when not NULL;
// outputs may alias an input at the same position (in place), never partially.
// nt: write out2 with non-temporal stores (large results nobody reads soon); the
// caller fences with dt_shm_store_fence before publishing.
void dt_shm_reduce_kernel(void *out1, void *out2, bool nt, const void *const *in, int nin,
                          size_t count, dt_dtype dtype, dt_reduce_op op);
// memcpy, with non-temporal stores when nt.
void dt_shm_copy(void *dst, const void *src, size_t nbytes, bool nt);
// Orders earlier non-temporal stores before later stores.
void dt_shm_store_fence(void);

#endif // DTRAIN_COMM_SHM_H
