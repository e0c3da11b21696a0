// comm.h: rendezvous stores, process groups and collectives over plain buffers, and
// dt_spawn. Knows nothing about models: it moves and reduces bytes between processes.
// Launcher detection (dt_launch_env) and the process supervisor are launch.h, included
// here.
//
// Rules that hold for the whole header:
// - Every collective (dt_pg_all_reduce ... dt_pg_barrier and their _async forms) is
//   COLLECTIVE: every rank of the group must call it, in the same order, with the same
//   count, dtype, op and root. A rank that calls something else gets DT_ERR_MISMATCH
//   printing both sides' fingerprints (sequence number, op, dtype, count, root).
// - Every blocking call honours a timeout (the group's, or the store's): nothing waits
//   forever. Timeouts are DT_ERR_TIMEOUT naming the operation and whom it waited for.
// - When a peer dies or closes its connection, every pending and later operation of the
//   group fails within seconds with DT_ERR_PEER naming the rank and the operation
//   ("all_reduce #42: rank 3 closed the connection"). After any failure inside a
//   collective the group is poisoned: every later call returns the same error at once.
// - Buffers are borrowed, never kept: blocking calls use them until they return, async
//   calls until dt_work_wait (or dt_work_free) returns.
// - Errors return a dt_status; the message is in dt_last_error() on the calling thread.
#ifndef DTRAIN_COMM_H
#define DTRAIN_COMM_H

#include "dtrain/core.h"
#include "dtrain/launch.h"

#ifdef __cplusplus
extern "C" {
#endif

// ------------------------------------------------------------------------ data types

typedef enum dt_dtype { DT_FLOAT32, DT_INT32, DT_INT64, DT_DTYPE_COUNT_ } dt_dtype;

// Bytes per element (4, 4, 8); 0 for an invalid dtype.
DT_API size_t dt_dtype_size(dt_dtype t);
// "float32", "int32", "int64"; "invalid" otherwise. Never NULL.
DT_API const char *dt_dtype_name(dt_dtype t);

// Reduction operators. AVG is SUM divided by the world size afterwards (as Gloo does);
// it needs a floating-point dtype (DT_ERR_ARG for integers). Integer SUM and PROD wrap
// around in two's complement on overflow.
typedef enum dt_reduce_op {
    DT_REDUCE_SUM,
    DT_REDUCE_AVG,
    DT_REDUCE_MAX,
    DT_REDUCE_MIN,
    DT_REDUCE_PROD,
    DT_REDUCE_COUNT_
} dt_reduce_op;

// "sum", "avg", "max", "min", "prod"; "invalid" otherwise. Never NULL.
DT_API const char *dt_reduce_op_name(dt_reduce_op op);

// The order in which an all_reduce combines the ranks' values (it matters for floats
// only). ANY: whatever the algorithm chosen for the size, world and backend does; fixed
// by those, so results are still reproducible. TREE: a fixed tree over ranks, the order
// in which a dt_model sums its gradient shards (dt_model_set_grad_shards), so that N
// ranks give bitwise the sum of one process: value k takes value k + h for h = the
// largest power of two below the world size, then h/2, ..., 1; the result is value 0's
// (4 ranks: (x0 + x2) + (x1 + x3); 3 ranks: (x0 + x2) + x1). Two ranks: both are x0 + x1.
typedef enum dt_reduce_order { DT_ORDER_ANY, DT_ORDER_TREE, DT_ORDER_COUNT_ } dt_reduce_order;

typedef struct dt_store dt_store; // a key-value store shared by the ranks of a job
typedef struct dt_pg    dt_pg;    // a process group: ranks joined through a store
typedef struct dt_work  dt_work;  // one asynchronous operation in flight

// ----------------------------------------------------------------------------- store
//
// A small key-value store for rendezvous (PyTorch's TCPStore/FileStore): keys are
// NUL-terminated strings (1..4096 bytes), values are byte strings (up to 64 MiB).
// A dt_store handle may be used from several threads at once (calls are serialised).

typedef struct dt_store_opts {
    int64_t timeout_ms; // connect retries, get and wait; 0 = default: DT_TIMEOUT_MS
                        // env, else 30 min; < 0 = no limit
    const char *token;  // job token; NULL = DT_JOB_TOKEN env; "" = none. A server with
                        // a token refuses clients with another (or no) token and proves
                        // it holds the token to its clients; a server without one admits
                        // every client. The token
                        // never crosses the wire: each side proves it holds it by an
                        // HMAC-SHA256 of the other's fresh random nonce.
    bool loopback_only; // server: listen on 127.0.0.1 only (every client is on this host)
} dt_store_opts;

// Zeroed options: every field means "default".
DT_API dt_store_opts dt_store_opts_default(void);

// A TCP store. With is_server, this process runs the server on a thread of its own,
// listening on every interface at `port` (0 = a free port; see dt_store_port; only on
// 127.0.0.1 with opts->loopback_only), and
// the returned handle is also a client of it. Without, connects to host:port,
// retrying until the timeout (so clients may start before the server).
// *out: an owned handle (free with dt_store_free); NULL on failure, with DT_ERR_IO
// "port 29500 is already in use", DT_ERR_TIMEOUT "could not reach host:port ...",
// DT_ERR_MISMATCH "job token ...", DT_ERR_ARG bad host or port.
DT_API dt_status dt_store_new_tcp(dt_store **out, const char *host, int port, bool is_server,
                                  const dt_store_opts *opts);
// The port the server listens on (the one chosen when 0 was asked), or the port a
// client connected to; -1 for other stores.
DT_API int dt_store_port(const dt_store *store);
// A TCP port free on every interface now, picked at random below the kernel's
// ephemeral range (20000-32767, so outgoing connections do not take it first); 0 when
// 500 tries found none. Free when asked: bind it soon (a store or a group on it).
DT_API int dt_free_port(void);

// A store kept in one file (for a shared file system): an append-only log of records,
// read back under an advisory lock. The file is created if missing; use a fresh file
// per job (with a token, a stale file of another job is refused with DT_ERR_MISMATCH).
// Blocking gets poll the file. *out: an owned handle, NULL on failure (DT_ERR_IO names
// the path and the system error; DT_ERR_FORMAT a corrupt file).
DT_API dt_status dt_store_new_file(dt_store **out, const char *path, const dt_store_opts *opts);

// A view of `base` that puts "<prefix>/" before every key (PyTorch's PrefixStore).
// Borrows `base`, which must outlive the view; free the view with dt_store_free.
DT_API dt_status dt_store_new_prefix(dt_store **out, dt_store *base, const char *prefix);

// Sets key to the `nbytes` bytes at `value` (overwrites; wakes waiters).
DT_API dt_status dt_store_set(dt_store *store, const char *key, const void *value, size_t nbytes);
// Waits until key exists (up to the store's timeout), then returns a copy of its value
// in *value (owned: free with dt_free; a NUL byte follows the value, so text values are
// C strings) and its length in *nbytes (may be NULL). DT_ERR_TIMEOUT names the key.
DT_API dt_status dt_store_get(dt_store *store, const char *key, void **value /* out */,
                              size_t *nbytes /* out */);
// Waits until every one of the `nkeys` keys exists. timeout_ms: 0 = the store's
// timeout, < 0 = no limit. DT_ERR_TIMEOUT lists the keys still missing.
DT_API dt_status dt_store_wait(dt_store *store, const char *const *keys, size_t nkeys,
                               int64_t timeout_ms);
// Without waiting: *all_exist tells whether every key exists.
DT_API dt_status dt_store_check(dt_store *store, const char *const *keys, size_t nkeys,
                                bool *all_exist /* out */);
// Atomically adds `delta` to the integer counter `key` (a missing key counts as 0; the
// value is stored as decimal text) and returns the new value in *value (may be NULL).
// DT_ERR_FORMAT if the key holds something that is not a decimal integer.
DT_API dt_status dt_store_add(dt_store *store, const char *key, int64_t delta,
                              int64_t *value /* out */);
// Atomically: if key's value equals `expected` (expected == NULL: if key does not exist),
// sets it to `desired` and *swapped = true; otherwise leaves it and *swapped = false.
DT_API dt_status dt_store_compare_set(dt_store *store, const char *key, const void *expected,
                                      size_t expected_nbytes, const void *desired,
                                      size_t desired_nbytes, bool *swapped /* out */);
// Deletes key; *deleted (may be NULL) tells whether it existed.
DT_API dt_status dt_store_delete(dt_store *store, const char *key, bool *deleted /* out */);
// Changes the default timeout of blocking calls on this handle (0 = default, < 0 none).
DT_API void dt_store_set_timeout(dt_store *store, int64_t timeout_ms);
// Closes the connection (and, in the server's process, stops the server: every client
// then gets DT_ERR_PEER). NULL is a no-op. Free prefix views before their base.
DT_API void dt_store_free(dt_store *store);

// ---------------------------------------------------------------------- process group

typedef struct dt_pg_opts {
    const char *backend; // "auto" (NULL = auto): shm when every rank is on this host
                         // and shm is built; hybrid when the ranks span hosts and
                         // every host runs the same number (> 1) of them; tcp
                         // otherwise; or "shm", "tcp" ("gloo" is its alias, as
                         // PyTorch scripts name it), "hybrid" (shm inside a host,
                         // tcp between, hierarchical all_reduce), "mpi"
                         // (MPI's collectives; only when built with MPI and started
                         // by an MPI launcher; see docs/mpi.md)
    int64_t timeout_ms;  // per operation; 0 = default: DT_TIMEOUT_MS env, else 30 min
                         // (PyTorch's CPU backends); < 0 = no limit
    const char *token;   // job token; NULL = DT_JOB_TOKEN env; "" = none = no check
} dt_pg_opts;

// Zeroed options: every field means "default".
DT_API dt_pg_opts dt_pg_opts_default(void);

// Joins the group described by the environment (torch.distributed env://):
// MASTER_ADDR (required except on rank 0, which then uses 127.0.0.1), MASTER_PORT
// (required, except under an MPI launcher), the rank and world size from the launcher
// (dt_launch_env_read: RANK and WORLD_SIZE, else mpirun's, PMI's or srun's variables),
// the local rank and size (optional: computed from the hosts of the ranks when the
// launcher does not say). Rank 0 runs the store; the others retry connecting until the
// timeout. COLLECTIVE: returns once every rank has joined.
// Under an MPI launcher (mpirun, mpiexec, srun) without MASTER_ADDR and MASTER_PORT,
// the store's address goes through MPI: MPI is initialised, rank 0 starts the store on
// a free port and broadcasts its address and a job token (MPI_Bcast); data then moves
// through the chosen backend ("auto": shm or tcp). MPI is initialised only then or when
// backend is "mpi"; it is finalised at exit.
// *out: an owned group (dt_pg_free), NULL on failure: DT_ERR_ARG naming a missing or
// malformed variable or a rank out of range, DT_ERR_MISMATCH for a world size or a
// backend (opts->backend; "gloo" is "tcp", NULL "auto") that differs between ranks, or
// a wrong token, DT_ERR_IO for a port in use, DT_ERR_TIMEOUT
// for an unreachable master or ranks that never came. The first group of a process
// warns about DT_* variables that are not settings (a typo), naming the nearest one.
DT_API dt_status dt_pg_new_from_env(dt_pg **out, const dt_pg_opts *opts);
// Same from an explicit method: "env://" (rank/world < 0 mean "from the environment"),
// "tcp://host:port" (rank 0 serves the store on port) or "file:///path" (a file store
// on a shared file system; the file must be fresh for each job).
DT_API dt_status dt_pg_new(dt_pg **out, const char *init_method, int rank, int world,
                           const dt_pg_opts *opts);
// Leaves the group (a sub-group: see "sub-groups" below): waits for queued async operations (each
// bounded by its timeout) and for sends not yet delivered (bounded by the timeout; see dt_pg_send),
// joins the progress thread, closes connections, and in rank 0's process stops the store. Not
// collective, but a rank that leaves early makes the others' next collectives fail with
// DT_ERR_PEER. NULL is a no-op. Work handles stay valid.
DT_API void dt_pg_free(dt_pg *pg);

DT_API int dt_pg_rank(const dt_pg *pg);
DT_API int dt_pg_size(const dt_pg *pg);
DT_API int dt_pg_local_rank(const dt_pg *pg); // rank among the ranks on this host
DT_API int dt_pg_local_size(const dt_pg *pg); // number of ranks on this host
// Name of the backend in use ("shm", "tcp", "hybrid", "mpi"; a sub-group: "tcp" for a hybrid
// world); owned by the group.
DT_API const char *dt_pg_backend(const dt_pg *pg);
// The group's store (borrowed; lives until dt_pg_free; in ranks other than 0 it needs
// rank 0 alive). Keys under "dt/" are the group's own: use another prefix.
DT_API dt_store *dt_pg_store(dt_pg *pg);
// Poisons the group from any thread: pending and later operations fail with
// DT_ERR_STATE carrying `reason`, and the other ranks' with DT_ERR_PEER, within seconds.
DT_API void dt_pg_abort(dt_pg *pg, const char *reason);

// ------------------------------------------------------------------------ sub-groups
//
// A sub-group is a dt_pg like the world: every collective, blocking and async, and
// send/recv work on it with its own ranks [0, size), sequence numbers, fingerprints and
// timeout. Creating one is COLLECTIVE over the parent (every rank of the parent calls
// it, in the same order as its other collectives) and cheap: one all_gather on the
// parent, no new rendezvous; tcp groups use the world's connections, shm groups a small
// segment of their own, mpi groups MPI_Comm_split (docs/comm.md, "Sub-groups").
// Every group of a process shares one execution lane: operations of all groups run
// one at a time in issue order, so ranks must issue the operations they share in an
// order that cannot deadlock (as with MPI's blocking collectives on overlapping
// communicators); a send that returned is not such an operation: its data moves on its
// own (see dt_pg_send), so a rank may send on one group and then wait in another. A failure, a
// timeout or dt_pg_abort in any group stops every group of the process, and a dead or frozen rank
// anywhere stops every rank of the world. Free sub-groups (dt_pg_free) before their parent.

// torch.distributed.new_group: `ranks` (n distinct ranks of the parent, any order) form
// a group whose rank i is the i-th smallest of them. Every rank of the parent calls it
// with the same list (DT_ERR_MISMATCH otherwise); a rank not in the list gets
// *out = NULL and DT_OK. opts: timeout_ms (0 = the parent's); backend NULL or the
// parent's. The group is owned by the caller (dt_pg_free).
DT_API dt_status dt_pg_new_group(dt_pg **out, dt_pg *parent, const int *ranks, int n,
                                 const dt_pg_opts *opts);
// MPI_Comm_split: the ranks of the parent that pass the same color >= 0 form one group,
// ordered by key, then by parent rank; color < 0: in no group (*out = NULL, DT_OK).
DT_API dt_status dt_pg_split(dt_pg **out, dt_pg *parent, int color, int key,
                             const dt_pg_opts *opts);

// ----------------------------------------------------------------------- collectives
//
// All COLLECTIVE (see the top of this header). In place when src == dst (where src
// and dst have the same size); otherwise src and dst must not overlap. Counts are in
// elements of `dtype`; count 0 is valid and still synchronises fingerprints. Roots
// and peers are ranks in [0, size). Errors: DT_ERR_ARG (bad argument, checked before
// anything is sent: the group stays usable), DT_ERR_TIMEOUT, DT_ERR_PEER,
// DT_ERR_MISMATCH, DT_ERR_STATE (group poisoned or aborted).
// Results are bitwise identical on every rank and reproducible for a fixed world size:
// the reduction order depends on ranks, never on arrival order.

// dst[i] = src_0[i] op src_1[i] op ... for every rank; count elements each.
DT_API dt_status dt_pg_all_reduce(dt_pg *pg, const void *src, void *dst, size_t count,
                                  dt_dtype dtype, dt_reduce_op op);
// The same, combining the ranks' values in `order` (dt_reduce_order above); every rank
// must pass the same order (DT_ERR_MISMATCH otherwise).
DT_API dt_status dt_pg_all_reduce_ordered(dt_pg *pg, const void *src, void *dst, size_t count,
                                          dt_dtype dtype, dt_reduce_op op, dt_reduce_order order);
// Copies root's buf into every other rank's buf.
DT_API dt_status dt_pg_broadcast(dt_pg *pg, void *buf, size_t count, dt_dtype dtype, int root);
// Like all_reduce, but only root's dst receives the result (dst is unused elsewhere and
// may be NULL there).
DT_API dt_status dt_pg_reduce(dt_pg *pg, const void *src, void *dst, size_t count, dt_dtype dtype,
                              dt_reduce_op op, int root);
// dst (size * count_per_rank elements) = every rank's src (count_per_rank) in rank
// order. In place when src == dst + rank * count_per_rank.
DT_API dt_status dt_pg_all_gather(dt_pg *pg, const void *src, void *dst, size_t count_per_rank,
                                  dt_dtype dtype);
// src has size * count_per_rank elements; rank r's dst (count_per_rank) gets the
// reduction of every rank's block r. In place when dst == src + rank * count_per_rank.
DT_API dt_status dt_pg_reduce_scatter(dt_pg *pg, const void *src, void *dst, size_t count_per_rank,
                                      dt_dtype dtype, dt_reduce_op op);
// root's dst (size * count_per_rank) = every rank's src in rank order; dst unused (may
// be NULL) on other ranks.
DT_API dt_status dt_pg_gather(dt_pg *pg, const void *src, void *dst, size_t count_per_rank,
                              dt_dtype dtype, int root);
// Rank r's dst (count_per_rank) = block r of root's src (size * count_per_rank); src
// unused (may be NULL) on other ranks.
DT_API dt_status dt_pg_scatter(dt_pg *pg, const void *src, void *dst, size_t count_per_rank,
                               dt_dtype dtype, int root);
// Block j of rank i's src goes to block i of rank j's dst (both size * count_per_rank).
// Not in place: src and dst must not overlap.
DT_API dt_status dt_pg_all_to_all(dt_pg *pg, const void *src, void *dst, size_t count_per_rank,
                                  dt_dtype dtype);
// Returns once every rank has entered it.
DT_API dt_status dt_pg_barrier(dt_pg *pg);

// Point to point (NOT collective: only the two ranks take part). Messages between a
// pair of ranks are matched in issue order; the receiver's count, dtype and tag must
// equal the sender's (DT_ERR_MISMATCH otherwise). Like every operation, sends and
// receives run one at a time in issue order (async ones too), and a send may wait until
// the peer reaches the matching receive (always possible for large messages). So, as
// with MPI_Send, two ranks that both send to each other first can block each other
// until the timeout: order a ring exchange by rank parity (even ranks send first, odd
// ranks receive first). dt_pg_send returns once the data is handed to the transport
// (buf may be reused at once), and the transport then delivers it without further calls
// by the sender: the sender may go on with an operation of another group (even one the
// receiver enters only after this receive), compute, or wait, and the receiver gets the
// message within the group's timeout. dt_pg_free waits for sends not yet delivered,
// bounded by the group's timeout; a receiver that left or died, or the timeout, is an
// error logged at once and returned by the process's later calls (and passed to the
// peers), naming the send and the receiver (docs/comm.md, "Send and recv").
DT_API dt_status dt_pg_send(dt_pg *pg, const void *buf, size_t count, dt_dtype dtype, int peer,
                            int tag);
DT_API dt_status dt_pg_recv(dt_pg *pg, void *buf, size_t count, dt_dtype dtype, int peer, int tag);
// A receive from whichever peer sends first, in two calls: waits until a message from
// one of the n listed peers (ranks of the group other than this one) has begun to
// arrive, sets *from to that peer (the first of the list that has one: a caller serving
// several peers in arrival order rotates its list), and then dt_pg_recv(*from) takes it.
// Consumes nothing and takes no sequence number; runs between the process's operations.
// A peer whose connection ended counts as ready (the receive then says why). Bounded
// by the group's timeout (DT_ERR_TIMEOUT naming the peers); a failure of the group (a
// dead or frozen rank found by the liveness checks, an abort) ends it with that
// failure. DT_ERR_UNSUPPORTED on mpi and nccl (tcp, shm and hybrid have it).
DT_API dt_status dt_pg_wait_any(dt_pg *pg, const int *peers, int n, int *from /* out */);

// ------------------------------------------------------------------- async operations
//
// Each _async form checks its arguments, queues the operation and returns at once with
// an owned handle in *out (free with dt_work_free). Operations run on the group's
// progress thread one at a time in issue order (blocking calls keep their place in that
// order too), so the caller can compute meanwhile. Buffers stay borrowed until
// dt_work_wait returns. Argument errors are returned at once and queue nothing.

DT_API dt_status dt_pg_all_reduce_async(dt_pg *pg, const void *src, void *dst, size_t count,
                                        dt_dtype dtype, dt_reduce_op op, dt_work **out);
DT_API dt_status dt_pg_all_reduce_ordered_async(dt_pg *pg, const void *src, void *dst, size_t count,
                                                dt_dtype dtype, dt_reduce_op op,
                                                dt_reduce_order order, dt_work **out);
DT_API dt_status dt_pg_broadcast_async(dt_pg *pg, void *buf, size_t count, dt_dtype dtype, int root,
                                       dt_work **out);
DT_API dt_status dt_pg_reduce_async(dt_pg *pg, const void *src, void *dst, size_t count,
                                    dt_dtype dtype, dt_reduce_op op, int root, dt_work **out);
DT_API dt_status dt_pg_all_gather_async(dt_pg *pg, const void *src, void *dst,
                                        size_t count_per_rank, dt_dtype dtype, dt_work **out);
DT_API dt_status dt_pg_reduce_scatter_async(dt_pg *pg, const void *src, void *dst,
                                            size_t count_per_rank, dt_dtype dtype, dt_reduce_op op,
                                            dt_work **out);
DT_API dt_status dt_pg_gather_async(dt_pg *pg, const void *src, void *dst, size_t count_per_rank,
                                    dt_dtype dtype, int root, dt_work **out);
DT_API dt_status dt_pg_scatter_async(dt_pg *pg, const void *src, void *dst, size_t count_per_rank,
                                     dt_dtype dtype, int root, dt_work **out);
DT_API dt_status dt_pg_all_to_all_async(dt_pg *pg, const void *src, void *dst,
                                        size_t count_per_rank, dt_dtype dtype, dt_work **out);
DT_API dt_status dt_pg_barrier_async(dt_pg *pg, dt_work **out);
DT_API dt_status dt_pg_send_async(dt_pg *pg, const void *buf, size_t count, dt_dtype dtype,
                                  int peer, int tag, dt_work **out);
DT_API dt_status dt_pg_recv_async(dt_pg *pg, void *buf, size_t count, dt_dtype dtype, int peer,
                                  int tag, dt_work **out);

// Waits until the operation has finished and returns its status (its message goes to
// dt_last_error() of the calling thread). Bounded: an operation fails with
// DT_ERR_TIMEOUT at its deadline (issue time + group timeout). May be called again:
// returns the same status.
DT_API dt_status dt_work_wait(dt_work *w);
// True once the operation has finished (successfully or not). Does not wait.
DT_API bool dt_work_test(dt_work *w);
// Releases the handle; if the operation is still running, waits for it first (the
// buffers are borrowed until then). NULL is a no-op.
DT_API void dt_work_free(dt_work *w);

// ----------------------------------------------------------------------------- spawn

// The C form of torch.multiprocessing.spawn: runs fn(local_rank, arg) in `nprocs` forked
// child processes and waits for all of them. The return value of fn is the child's
// exit code.
typedef int (*dt_spawn_fn)(int local_rank, void *arg);

typedef struct dt_spawn_result {
    int failed_rank; // first child that failed (by local rank), -1 if none
    int exit_code;   // its exit code, or -1 if it was killed by a signal
    int term_signal; // the signal that killed it, 0 if it exited
} dt_spawn_result;

// Each child gets LOCAL_RANK = i and LOCAL_WORLD_SIZE = nprocs; RANK = GROUP_RANK *
// nprocs + i and WORLD_SIZE kept from the parent when the parent's environment has
// GROUP_RANK (or NODE_RANK) and WORLD_SIZE, else RANK = i and WORLD_SIZE = nprocs.
// MASTER_ADDR, MASTER_PORT and the rest of the environment are inherited; when
// MASTER_PORT is unset, a free port is picked; when MASTER_ADDR is unset and every rank
// is forked here, it is 127.0.0.1. When DT_JOB_TOKEN is unset: a random token when
// every rank is forked here; on one node of several, a token every node derives alike
// from MASTER_PORT, WORLD_SIZE and nprocs (not a secret: it keeps strangers of other
// jobs out, not attackers; set DT_JOB_TOKEN for that).
// A child dies with its parent (PR_SET_PDEATHSIG, SIGKILL; fork from the thread that
// stays alive). When a child fails (non-zero exit or signal), the others get SIGTERM
// and, DT_SPAWN_GRACE_MS (default 3000) later, SIGKILL. Waits for the children without
// a time limit (they carry their own timeouts). When the caller blocks SIGTERM (the
// children inherit the mask: a program that stops at its own step boundaries), a
// SIGTERM sent to the caller is forwarded to every child, which then get
// DT_SPAWN_TERM_GRACE_MS (default 30000) before SIGKILL.
// More than 4 processes per online CPU, or more than 256, are refused before anything
// starts (their shm segment grows with nprocs^2: the message says its size and the
// free space of /dev/shm); DT_MAX_LOCAL_PROCS sets another bound.
// Returns DT_OK when every child exited with 0; DT_ERR_PEER naming the first failed
// rank and its exit code or signal (also in *out, which may be NULL); DT_ERR_ARG for
// nprocs < 1, above the bound, or fn NULL; DT_ERR_IO if fork fails (children already
// started are stopped).
DT_API dt_status dt_spawn(int nprocs, dt_spawn_fn fn, void *arg, dt_spawn_result *out);
// dt_spawn as fork(2) is for one process: the same children, but each returns from this
// call (DT_OK, *local_rank = its local rank, its rank variables set) and goes on with
// the caller's code, which must end it with exit() (or by returning from main); the
// parent returns once every child has ended, with *local_rank = -1 and dt_spawn's
// status and result. What lets a program's main run its training loop itself in every
// worker (train.h, dt_trainer_start) instead of handing it over as a function.
DT_API dt_status dt_spawn_fork(int nprocs, int *local_rank /* out */, dt_spawn_result *out);

#ifdef __cplusplus
}
#endif
#endif // DTRAIN_COMM_H
