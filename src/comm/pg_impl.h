// pg_impl.h: the process group's insides, shared by pg.c (the dispatcher: the execution
// lane, submission), pg_init.c (the world group's rendezvous and set-up), pg_state.c
// (accessors, poison, held sends) and group.c (sub-groups). Not for backends: they see
// the group only through backend.h. The files call one way: pg_init.c and group.c call
// pg.c, which calls the algorithm layer (algo/algo.h); every one of them calls
// pg_state.c; nothing calls back up.
//
// One execution lane per process: the world group's queue, progress thread and `busy`
// flag serve every group of the process, so the operations of all groups run one at a
// time in issue order. That is what lets a sub-group share the world's transport (its
// messages can never interleave with another group's on a connection) and what makes a
// failure anywhere one failure: the world group holds the poison, the abort fd and the
// liveness thread for every group of the process.
#ifndef DTRAIN_COMM_PG_IMPL_H
#define DTRAIN_COMM_PG_IMPL_H

#include "comm/algo/algo.h"
#include "comm/comm_impl.h"

#include <pthread.h>
#include <stdatomic.h>

#define DT_PG_MSG_LEN 1024

typedef struct work_pool work_pool;

struct dt_pg {
    int     rank, world, local_rank, local_world;
    char  **host_ids; // world entries (owned copies)
    bool    all_local;
    bool    store_via_mpi; // rank 0's store address came through MPI
    int64_t timeout_ms;
    char   *token; // NULL = none (world group only; groups ask their root)

    dt_store             *store;    // owned by the world group; borrowed by sub-groups
    dt_store             *be_store; // prefix view for the backend (owned)
    const dt_backend_ops *be;
    void                 *be_ctx; // NULL for a group that shares the world's transport
    dt_algo_cfg           algo;

    // Sub-groups (group.c). The world group has root == itself, gid 0.
    dt_pg   *root;        // the world group: lane, poison, liveness
    uint32_t gid;         // group id carried in fingerprints (0: the world)
    int     *world_ranks; // group rank -> world rank; NULL for the world
    bool     shared;      // runs over the root's transfer slots (xport.peers = world_ranks)
    dt_xport xport;       // what the algorithms run over (dt_pg_set_xport)
    dt_pg   *next_group;  // root's list of live sub-groups (root->mu)
    int      pending;     // this group's operations queued or running (root->mu)
    uint32_t next_gid;    // root only: the least id this rank may propose (root->mu)

    // The lane (used on the world group only), guarded by mu:
    pthread_mutex_t mu;
    pthread_cond_t  cv;
    uint64_t        seq;                 // last collective sequence number issued (per group)
    uint64_t       *send_seq, *recv_seq; // per peer (per group)
    struct dt_work *head, *tail;         // queued operations
    bool            busy;                // an operation is executing (thread or inline)
    bool            pushing;             // busy with held sends only (progress thread)
    bool            stop;                // dt_pg_free: the progress thread drains and exits
    dt_status       poison_st;
    char            poison_msg[DT_PG_MSG_LEN];
    // only while the lane is busy (per group: its backend state):
    bool be_told; // backend abort() was called

    dt_live         *live;     // heartbeats (liveness.c); NULL when off
    _Atomic uint64_t progress; // dt_pg_progress calls
    _Atomic uint64_t cur_op;   // the operation in the backend, dt_pg_current_op

    // Some backend of the process may hold sends (backend.h, push): set on the lane
    // after a send left some held, cleared by a sweep of every group that found none.
    atomic_bool sends_held;

    work_pool  *pool;
    atomic_bool poisoned;
    int         abort_fd; // eventfd, readable once poisoned
    pthread_t   thread;
    bool        thread_started;
};

// An operation of kind k with no root and no peer, before dt_pg_submit fills it in.
#define DT_OP_INIT(k)                                                                              \
    (dt_op) {                                                                                      \
        .kind = (k), .root = -1, .peer = -1                                                        \
    }

// pg_state.c: records the process's first failure (later ones are consequences) in the
// world group of `pg` and wakes every waiter (the abort fd). Any thread.
void dt_pg_poison(dt_pg *pg, dt_status st, const char *msg);

// pg.c: the reusable work handles (the group holds one reference, every live handle
// another) and the progress thread's body (arg: the world group), started by pg_init.c.
work_pool *dt_work_pool_new(void);
void       dt_work_pool_unref(work_pool *p);
void      *dt_pg_progress_main(void *arg);

// Runs one operation of `pg` now (the caller holds the lane): the backend dispatch,
// poisoning and AVG of pg.c. The message of a failure goes to msg.
dt_status dt_pg_exec(dt_pg *pg, const dt_op *op, char msg[DT_PG_MSG_LEN]);
// Gives `op` the group's next sequence number, its name and a deadline.
void dt_pg_stamp(dt_pg *pg, dt_op *op);
// Queues or runs one operation of `pg` (any group) on the lane; see pg.c.
dt_status dt_pg_submit(dt_pg *pg, dt_op *op, struct dt_work **out);
// Takes the lane of `root` for the calling thread (waits until no operation runs or is
// queued, bounded by deadline_ns), so that it may call into backends directly.
dt_status dt_pg_lane_take(dt_pg *root, uint64_t deadline_ns, const char *what);
void      dt_pg_lane_give(dt_pg *root);
// Before the backend of `g` is freed (the caller holds the lane, or is the world's last
// thread): waits, bounded by the group's timeout, until it holds no send (backend.h,
// flush). A failure is logged as an error naming the receiver, poisons the process and
// is passed to the peers, as a failed operation would be.
void dt_pg_flush_sends(dt_pg *g);
// Tells the backend of `pg` and of every live sub-group of its root that the process
// failed (once each). Caller holds the lane.
void dt_pg_tell_backends(dt_pg *pg);
// pg_state.c: appends " [group G: world ranks a, b, ...; this rank: rank r of the
// group, world rank w]" to buf (a failure's message names the group and both numberings).
void dt_pg_group_describe(const dt_pg *g, char *buf, size_t n);
// pg_state.c: moves the sends every group's backend of the process still holds
// (backend.h, push); the caller holds the lane. Returns true while some remain (*moved:
// something moved); clears root->sends_held once none remain.
bool dt_pg_push_all(dt_pg *root, bool *moved);
// pg.c: fills g->xport from its backend state (or, for a shared sub-group, from the
// root's transfer slots with its ranks translated) and checks that the algorithms
// DT_*_ALGO forces can run over it. At the group's creation.
dt_status dt_pg_set_xport(dt_pg *g);
// Frees a sub-group (group.c), called by dt_pg_free.
void dt_pg_group_free(dt_pg *g);

#endif // DTRAIN_COMM_PG_IMPL_H
