// op.h: one operation of a process group, the unit every layer of src/comm shares:
// the kinds and their names, fingerprints (what the ranks must agree on), the operation
// handed to a backend, and the failure helpers that prefix its name. op.c depends on
// nothing above core: pg.c (the dispatcher), the algorithms (algo.c) and the backends
// (tcp, shm, mpi, hybrid) all call down into it, never the other way.
#ifndef DTRAIN_COMM_OP_H
#define DTRAIN_COMM_OP_H

#include "dtrain/comm.h"

// Kinds of operations; the order is part of the wire format (tcp headers carry it).
typedef enum dt_coll {
    DT_COLL_ALL_REDUCE,
    DT_COLL_BROADCAST,
    DT_COLL_REDUCE,
    DT_COLL_ALL_GATHER,
    DT_COLL_REDUCE_SCATTER,
    DT_COLL_GATHER,
    DT_COLL_SCATTER,
    DT_COLL_ALL_TO_ALL,
    DT_COLL_BARRIER,
    DT_COLL_SEND,
    DT_COLL_RECV,
    DT_COLL_INIT, // the barrier that ends dt_pg_new (sequence number 0)
    DT_COLL_COUNT_
} dt_coll;

// "all_reduce", "broadcast", ..., "send", "recv", "init".
const char *dt_coll_name(dt_coll c);

// What every rank taking part must agree on. For collectives `seq` counts the group's
// collectives from 1 (0 is the init barrier); for send/recv it counts the messages
// between the two ranks in that direction, from 1, and `root` holds the tag.
// `seq` also carries the group: bits 0..47 are the sequence number, bits 48..62 the
// group id (0 = the world group; sub-groups, group.c). A backend that carries and
// compares the whole fingerprint so tells groups apart without knowing of them.
typedef struct dt_fingerprint {
    uint64_t seq;   // DT_FP_SEQ | DT_FP_GROUP << 48
    uint64_t count; // elements (per rank for the *_gather/scatter/to_all kinds)
    int32_t  root;  // root rank, the tag for send/recv, -1 when meaningless
    uint8_t  coll;  // dt_coll
    uint8_t  dtype; // dt_dtype
    uint8_t  op;    // dt_reduce_op as the caller asked (AVG stays AVG here), 0 if none
    uint8_t  order; // dt_reduce_order of an all_reduce (comm.h), 0 otherwise
} dt_fingerprint;

#define DT_FP_GROUP_SHIFT 48
#define DT_FP_MAX_GROUP   0x7fff
#define DT_FP_SEQ(fp)     ((fp)->seq & ((UINT64_C(1) << DT_FP_GROUP_SHIFT) - 1))
#define DT_FP_GROUP(fp)   ((uint32_t)((fp)->seq >> DT_FP_GROUP_SHIFT))

// True when `theirs` (from a peer) describes the same operation as `mine`; a send
// matches a recv with the same seq, count, dtype and tag.
bool dt_fp_match(const dt_fingerprint *mine, const dt_fingerprint *theirs);
// "all_reduce #42 (float32 sum, count 1000)"; "broadcast #7 (int64, count 3, root 1)";
// "send #2 (float32, count 5, tag 9)"; on a sub-group "all_reduce #3 on group 2 (...)".
// Returns buf.
const char *dt_fp_format(const dt_fingerprint *fp, char *buf, size_t n);

// One operation as the generic layer hands it to a backend. Read-only for backends.
typedef struct dt_op {
    dt_coll        kind;
    dt_fingerprint fp;  // the fingerprint to carry / compare (op as asked)
    const void    *src; // see each slot below for what src/dst hold
    void          *dst;
    size_t         count; // elements; per rank for the *_gather/scatter/to_all kinds
    dt_dtype       dtype;
    dt_reduce_op   op;    // as run: the process group passes SUM for AVG and the
                          // algorithm layer divides by the world size afterwards
                          // (a backend with run_avg gets AVG in `run`)
    int      root;        // broadcast/reduce/gather/scatter; -1 otherwise
    int      peer;        // send/recv; -1 otherwise
    int      tag;         // send/recv; 0 otherwise
    uint64_t deadline_ns; // dt_now_ns() clock; UINT64_MAX = no limit. Past it the
                          // backend returns DT_ERR_TIMEOUT (dt_op_fail_timeout)
    char name[72];        // "all_reduce #42", "send #3 to rank 1", "barrier #2 on
                          // group 3": message prefix
} dt_op;

// Which kinds carry what in a fingerprint.
static inline bool dt_coll_is_p2p(dt_coll c) {
    return c == DT_COLL_SEND || c == DT_COLL_RECV;
}
static inline bool dt_coll_has_op(dt_coll c) {
    return c == DT_COLL_ALL_REDUCE || c == DT_COLL_REDUCE || c == DT_COLL_REDUCE_SCATTER;
}
static inline bool dt_coll_has_root(dt_coll c) {
    return c == DT_COLL_BROADCAST || c == DT_COLL_REDUCE || c == DT_COLL_GATHER ||
           c == DT_COLL_SCATTER;
}

// Sets op->name from its kind, peer and fingerprint: "all_reduce #42", "send #3 to rank
// 1", "barrier #2 on group 3".
void dt_op_set_name(dt_op *op);

// ---------------------------------------------------------------------------- failures

// Error helpers: record the message on the calling thread and return the status.
// "<op name>: <formatted message>"
dt_status dt_op_fail(const dt_op *op, dt_status st, const char *fmt, ...) DT_PRINTF(3, 4);
// DT_ERR_PEER "<op name>: rank <peer> <what>" (what: "closed the connection", ...).
dt_status dt_op_fail_peer(const dt_op *op, int peer, const char *what);
// DT_ERR_MISMATCH "<op name>: rank <peer> called <their fp> but this rank (<me>)
// called <my fp>; every rank must issue the same collectives in the same order".
dt_status dt_op_fail_mismatch(const dt_op *op, int peer, const dt_fingerprint *theirs);
// DT_ERR_TIMEOUT "<op name>: timed out after <ms> ms waiting for <waiting_for>".
dt_status dt_op_fail_timeout(const dt_op *op, const char *waiting_for);
// Milliseconds until the op's deadline for poll(): 0 when past, -1 when none, at most
// `cap_ms` when cap_ms >= 0.
int dt_op_poll_ms(const dt_op *op, int cap_ms);

#endif // DTRAIN_COMM_OP_H
