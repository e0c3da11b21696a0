// op.c: the operation unit (op.h): names of kinds, dtypes and reduce ops, fingerprints,
// operation names and the failure helpers. It calls nothing in src/comm: everything else
// (the dispatcher pg.c, algo.c, the backends) calls down into it.
#include "comm/op.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>

#define OP_MSG_LEN 1024

// --------------------------------------------------------------------------- names

size_t dt_dtype_size(dt_dtype t) {
    switch (t) {
    case DT_FLOAT32:
        return 4;
    case DT_INT32:
        return 4;
    case DT_INT64:
        return 8;
    default:
        return 0;
    }
}

const char *dt_dtype_name(dt_dtype t) {
    switch (t) {
    case DT_FLOAT32:
        return "float32";
    case DT_INT32:
        return "int32";
    case DT_INT64:
        return "int64";
    default:
        return "invalid";
    }
}

const char *dt_reduce_op_name(dt_reduce_op op) {
    static const char *const names[DT_REDUCE_COUNT_] = {"sum", "avg", "max", "min", "prod"};
    return (unsigned)op < DT_REDUCE_COUNT_ ? names[op] : "invalid";
}

const char *dt_coll_name(dt_coll c) {
    static const char *const names[DT_COLL_COUNT_] = {
        "all_reduce", "broadcast",  "reduce",  "all_gather", "reduce_scatter", "gather",
        "scatter",    "all_to_all", "barrier", "send",       "recv",           "init"};
    return (unsigned)c < DT_COLL_COUNT_ ? names[c] : "invalid";
}

bool dt_fp_match(const dt_fingerprint *a, const dt_fingerprint *b) {
    uint8_t ca = a->coll, cb = b->coll;
    if (dt_coll_is_p2p((dt_coll)ca) && dt_coll_is_p2p((dt_coll)cb))
        ca = cb = DT_COLL_SEND; // a send matches a recv
    return ca == cb && a->seq == b->seq && a->count == b->count && a->root == b->root &&
           a->dtype == b->dtype && a->op == b->op && a->order == b->order;
}

const char *dt_fp_format(const dt_fingerprint *fp, char *buf, size_t n) {
    dt_coll c   = (dt_coll)fp->coll;
    size_t  off = (size_t)snprintf(buf, n, "%s #%" PRIu64, dt_coll_name(c), DT_FP_SEQ(fp));
    if (off < n && DT_FP_GROUP(fp))
        off += (size_t)snprintf(buf + off, n - off, " on group %u", DT_FP_GROUP(fp));
    if (off < n)
        off += (size_t)snprintf(buf + off, n - off, " (%s", dt_dtype_name((dt_dtype)fp->dtype));
    if (off < n && dt_coll_has_op(c))
        off += (size_t)snprintf(buf + off, n - off, " %s", dt_reduce_op_name((dt_reduce_op)fp->op));
    if (off < n && fp->order == DT_ORDER_TREE)
        off += (size_t)snprintf(buf + off, n - off, " in tree order");
    if (off < n)
        off += (size_t)snprintf(buf + off, n - off, ", count %" PRIu64, fp->count);
    if (off < n && dt_coll_has_root(c))
        off += (size_t)snprintf(buf + off, n - off, ", root %d", fp->root);
    if (off < n && dt_coll_is_p2p(c))
        off += (size_t)snprintf(buf + off, n - off, ", tag %d", fp->root);
    if (off < n)
        snprintf(buf + off, n - off, ")");
    return buf;
}

// ------------------------------------------------------------------- op error helpers

dt_status dt_op_fail(const dt_op *op, dt_status st, const char *fmt, ...) {
    char    msg[OP_MSG_LEN];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return dt_fail(st, "%s: %s", op->name, msg);
}

dt_status dt_op_fail_peer(const dt_op *op, int peer, const char *what) {
    return dt_fail(DT_ERR_PEER, "%s: rank %d %s", op->name, peer, what);
}

dt_status dt_op_fail_mismatch(const dt_op *op, int peer, const dt_fingerprint *theirs) {
    char a[160], b[160];
    return dt_fail(DT_ERR_MISMATCH,
                   "%s: rank %d called %s but this rank called %s; every rank must issue the "
                   "same collectives in the same order with the same arguments",
                   op->name, peer, dt_fp_format(theirs, a, sizeof a),
                   dt_fp_format(&op->fp, b, sizeof b));
}

dt_status dt_op_fail_timeout(const dt_op *op, const char *waiting_for) {
    return dt_fail(DT_ERR_TIMEOUT,
                   "%s: timed out waiting for %s (deadline set by the group "
                   "timeout; DT_TIMEOUT_MS or dt_pg_opts.timeout_ms)",
                   op->name, waiting_for);
}

int dt_op_poll_ms(const dt_op *op, int cap_ms) {
    int ms = op->deadline_ns == UINT64_MAX ? -1 : dt_ms_left(op->deadline_ns);
    if (cap_ms >= 0 && (ms < 0 || ms > cap_ms))
        ms = cap_ms;
    return ms;
}

void dt_op_set_name(dt_op *op) {
    uint64_t seq = DT_FP_SEQ(&op->fp);
    int      off;
    if (op->kind == DT_COLL_SEND)
        off = snprintf(op->name, sizeof op->name, "send #%" PRIu64 " to rank %d", seq, op->peer);
    else if (op->kind == DT_COLL_RECV)
        off = snprintf(op->name, sizeof op->name, "recv #%" PRIu64 " from rank %d", seq, op->peer);
    else
        off = snprintf(op->name, sizeof op->name, "%s #%" PRIu64, dt_coll_name(op->kind), seq);
    if (DT_FP_GROUP(&op->fp) && off > 0 && (size_t)off < sizeof op->name)
        snprintf(op->name + off, sizeof op->name - (size_t)off, " on group %u",
                 DT_FP_GROUP(&op->fp));
}

// Fills in what depends on the group's order: sequence numbers and the deadline.
