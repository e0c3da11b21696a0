// table.c: the decision tables of the algorithm layer (algo.h) and the one entry every
// operation of every backend goes through. One table per collective lists its
// algorithms, best first; each row names what transport it needs and, for auto, when
// it pays. The first row the group's transport can run whose `when` holds is chosen (if
// none holds, the last row it can run); DT_<COLL>_ALGO=<name> keeps only the rows of that
// name. "hier" (the hybrid backend's two-level all_reduce and broadcast) is composed
// here of the other families, run on the node's and the cross transports.
//
// The tables in short (nbytes: of the buffer; small: DT_SMALL_BYTES, 64 KiB):
//
//   all_reduce       native | hier from DT_HYBRID_MIN_BYTES | shm (one sync when it
//                    fits, else chunked) | rdouble below small | ring
//   broadcast        native | hier from DT_HYBRID_BCAST_MIN_BYTES | shm | tree below
//                    small or on 2 ranks | chain
//   reduce           native | shm (as all_reduce) | tree below small | ring
//   all_gather       native | shm | ring
//   reduce_scatter   native | shm | ring
//   gather, scatter  native | shm | direct
//   all_to_all       native | shm | pairwise
//   barrier, init    native | shm | dissemination
//   send, recv       native | shm | direct
//
// An all_reduce in tree order (comm.h, DT_ORDER_TREE) on more than 2 ranks keeps only
// the rows that combine in that order (shm, rdouble), whatever DT_ALLREDUCE_ALGO says.
#include "comm/algo/algo.h"
#include "comm/reduce.h"

#include <stdio.h>
#include <string.h>

// ------------------------------------------------------------------------ the rows

enum { F_NATIVE = 1, F_HIER, F_SHM, F_P2P }; // family: what runs the row
enum { NEED_RUN = 1, NEED_LEVELS = 2, NEED_SEG = 4, NEED_XFER = 8 };

typedef struct choice {
    const dt_xport    *t;
    const dt_algo_cfg *cfg;
    const dt_op       *op;
    size_t             nbytes;
} choice;

typedef struct row {
    const char *name; // the DT_*_ALGO value that forces it (rows of a name: variants)
    int         family;
    int         id;                // DT_ALGO_* (p2p), dt_staged_id (shm)
    unsigned    needs;             // NEED_*
    bool        tree;              // combines an all_reduce in DT_ORDER_TREE
    bool (*when)(const choice *c); // auto: where it pays; NULL: always
} row;

static bool small(const choice *c) {
    return c->nbytes < c->cfg->small_bytes;
}
static bool small_or_pair(const choice *c) {
    return small(c) || c->t->world == 2;
}
static bool flat_fits(const choice *c) {
    return dt_algo_staged_flat_fits(c->t->seg, c->op);
}
// Below DT_HYBRID_MIN_BYTES (all_reduce) and DT_HYBRID_BCAST_MIN_BYTES (broadcast) the
// extra level costs more latency than the link time it saves (docs/comm.md, "hybrid").
static bool hier_pays(const choice *c) {
    size_t min =
        c->op->kind == DT_COLL_BROADCAST ? c->cfg->hier_bcast_min_bytes : c->cfg->hier_min_bytes;
    return c->nbytes >= min && c->t->node->world > 1 && c->t->cross->world > 1;
}

#define NATIVE                                                                                     \
    { "native", F_NATIVE, 0, NEED_RUN, false, NULL }
#define SHM                                                                                        \
    { "shm", F_SHM, DT_STAGED_CHUNKED, NEED_SEG, true, NULL }

static const row all_reduce_rows[] = {
    NATIVE,
    {"hier", F_HIER, 0, NEED_LEVELS, false, hier_pays},
    {"shm", F_SHM, DT_STAGED_FLAT, NEED_SEG, true, flat_fits},
    SHM,
    {"rdouble", F_P2P, DT_ALGO_RDOUBLE, NEED_XFER, true, small},
    {"ring", F_P2P, DT_ALGO_RING, NEED_XFER, false, NULL},
};
static const row broadcast_rows[] = {
    NATIVE,
    {"hier", F_HIER, 0, NEED_LEVELS, false, hier_pays},
    SHM,
    {"tree", F_P2P, DT_ALGO_TREE, NEED_XFER, false, small_or_pair},
    {"chain", F_P2P, DT_ALGO_CHAIN, NEED_XFER, false, NULL},
};
static const row reduce_rows[] = {
    NATIVE,
    {"shm", F_SHM, DT_STAGED_FLAT, NEED_SEG, false, flat_fits},
    SHM,
    {"tree", F_P2P, DT_ALGO_TREE, NEED_XFER, false, small},
    {"ring", F_P2P, DT_ALGO_RING, NEED_XFER, false, NULL},
};
static const row ring_rows[] = {NATIVE, SHM, {"ring", F_P2P, DT_ALGO_RING, NEED_XFER, false, NULL}};
static const row direct_rows[] = {
    NATIVE, SHM, {"direct", F_P2P, DT_ALGO_DIRECT, NEED_XFER, false, NULL}};
static const row pairwise_rows[] = {
    NATIVE, SHM, {"pairwise", F_P2P, DT_ALGO_PAIRWISE, NEED_XFER, false, NULL}};
static const row barrier_rows[] = {
    NATIVE, SHM, {"dissemination", F_P2P, DT_ALGO_DISSEMINATION, NEED_XFER, false, NULL}};

typedef struct table {
    const row  *rows;
    int         n;
    const char *setting; // DT_*_ALGO, NULL for send and recv
} table;

#define TABLE(r, s)                                                                                \
    { r, (int)(sizeof r / sizeof r[0]), s }

static const table tables[DT_COLL_COUNT_] = {
    [DT_COLL_ALL_REDUCE]     = TABLE(all_reduce_rows, "DT_ALLREDUCE_ALGO"),
    [DT_COLL_BROADCAST]      = TABLE(broadcast_rows, "DT_BROADCAST_ALGO"),
    [DT_COLL_REDUCE]         = TABLE(reduce_rows, "DT_REDUCE_ALGO"),
    [DT_COLL_ALL_GATHER]     = TABLE(ring_rows, "DT_ALLGATHER_ALGO"),
    [DT_COLL_REDUCE_SCATTER] = TABLE(ring_rows, "DT_REDUCESCATTER_ALGO"),
    [DT_COLL_GATHER]         = TABLE(direct_rows, "DT_GATHER_ALGO"),
    [DT_COLL_SCATTER]        = TABLE(direct_rows, "DT_SCATTER_ALGO"),
    [DT_COLL_ALL_TO_ALL]     = TABLE(pairwise_rows, "DT_ALLTOALL_ALGO"),
    [DT_COLL_BARRIER]        = TABLE(barrier_rows, "DT_BARRIER_ALGO"),
    [DT_COLL_SEND]           = TABLE(direct_rows, NULL),
    [DT_COLL_RECV]           = TABLE(direct_rows, NULL),
    [DT_COLL_INIT]           = TABLE(barrier_rows, NULL), // follows DT_BARRIER_ALGO
};

// ---------------------------------------------------------------------- choosing

static bool can_run(const dt_xport *t, const row *r, dt_coll kind) {
    switch (r->needs) {
    case NEED_RUN:
        return t->run && (!t->run_kinds || (t->run_kinds >> kind & 1u));
    case NEED_LEVELS:
        return t->node && t->cross;
    case NEED_SEG:
        return t->seg != NULL;
    default:
        return t->xfer_post != NULL;
    }
}

static const char *forced_for(const dt_algo_cfg *cfg, dt_coll kind) {
    return cfg->forced[kind == DT_COLL_INIT ? DT_COLL_BARRIER : kind];
}

// The row for op, or NULL when the transport can run none. `forced`: honour DT_*_ALGO
// (not for the steps of hier, which run on its levels).
static const row *choose(const dt_xport *t, const dt_algo_cfg *cfg, const dt_op *op, bool forced) {
    const table *tb   = &tables[op->kind];
    choice       c    = {.t = t, .cfg = cfg, .op = op};
    const char  *name = forced ? forced_for(cfg, op->kind) : NULL;
    bool tree = op->kind == DT_COLL_ALL_REDUCE && op->fp.order == DT_ORDER_TREE && t->world > 2;
    c.nbytes  = op->count * dt_dtype_size(op->dtype);
    for (int pass = 0; pass < 2; pass++) {
        const row *last = NULL;
        for (int i = 0; i < tb->n; i++) {
            const row *r = &tb->rows[i];
            if ((name && strcmp(r->name, name) != 0) || (tree && !r->tree) ||
                !can_run(t, r, op->kind))
                continue;
            if (!r->when || r->when(&c))
                return r;
            last = r;
        }
        if (last || !name)
            return last;
        name = NULL; // tree order wins over a forced algorithm that does not keep it
    }
    return NULL;
}

// ---------------------------------------------------------------------- hier
//
// The hybrid backend's all_reduce and broadcast (docs/comm.md, "hybrid"): the ranks of a
// host share a segment (node), the ranks of one local index on every host are
// connected (cross). The all_reduce:
//
//   step  level  what                                               bytes per rank moved
//   1     node   reduce_scatter: local rank l gets block l, reduced   (L-1)/L * n  (memory)
//                over the host (L = ranks per host)
//   2     cross  all_reduce of block l over the hosts (chosen by      2(H-1)/H * n/L (network)
//                its table: ring or recursive doubling by size)
//   3     node   all_gather of the blocks                             (L-1)/L * n  (memory)
//
// so each host's link carries 2(H-1)/H * n each way, in L parallel streams, where the
// flat ring over all P = H*L ranks carries 2(P-1)/P * n in one stream: (P-1)H / (P(H-1))
// times more (1.5x for 2 hosts of 2 ranks, nearly 2x for 2 hosts of many). The steps run
// in the result's buffer when L divides n; otherwise the buffer is copied into a
// padded scratch of L blocks of ceil(n/L) elements (the padding is reduced and
// dropped). The result is reduced once per element and all-gathered, so it is bitwise
// equal on every rank; it equals the flat algorithms' to float rounding.
//
// The broadcast, in the result's buffer (the root at host index h, local index l):
//
//   step  level  who                                what
//   1     cross  the ranks of local index l          broadcast from host h (its table:
//                (one per host)                      tree or chain by size)
//   2     node   every rank                         broadcast from local index l
//
// Each host receives the buffer once over the network, as the flat chain over all P
// ranks placed host by host does, but inside a host it moves through the segment
// instead of through tcp. From DT_HYBRID_BCAST_MIN_BYTES (1 MiB) only: below it, the
// segment's step (every rank of a host synchronises on the root's copy) cost more than
// the tcp messages it replaces, on 2 hosts of 2 ranks faked on one machine (bench/
// RESULTS.md, "Hybrid broadcast and the cells left": 256 KiB up to 2.7x slower, 1 MiB
// mostly faster).

static dt_status run_row(const row *r, const dt_xport *t, dt_algo_cfg *cfg, const dt_op *op);

// One step on a level, inside the whole operation (same deadline and fingerprint, but
// the step's kind, root (-1: none) and count: every rank of the level derives the same).
static dt_status level_step(const dt_xport *lvl, const char *level, dt_algo_cfg *cfg,
                            const dt_op *outer, dt_coll kind, int root, const void *src, void *dst,
                            size_t count) {
    dt_op o    = *outer;
    o.kind     = kind;
    o.root     = root;
    o.fp.root  = root;
    o.src      = src;
    o.dst      = dst;
    o.count    = count;
    o.fp.coll  = (uint8_t)kind;
    o.fp.count = count;
    if (kind == DT_COLL_ALL_GATHER)
        o.fp.op = o.fp.order = 0;
    snprintf(o.name, sizeof o.name, "%.32s, %s on the %s", outer->name, dt_coll_name(kind), level);
    if (lvl->world == 1) { // one host, or one rank per host: the step is the identity
        if (src != dst)
            memcpy(dst, src, count * dt_dtype_size(o.dtype));
        return DT_OK;
    }
    const row *r = choose(lvl, cfg, &o, false);
    if (!r)
        return dt_op_fail(&o, DT_ERR_INTERNAL, "the %s level offers no algorithm", level);
    return run_row(r, lvl, cfg, &o);
}

static dt_status hier_all_reduce(const dt_xport *t, dt_algo_cfg *cfg, const dt_op *op) {
    const dt_xport *node = t->node, *cross = t->cross;
    int             L = node->world, l = node->rank;
    size_t          esz = dt_dtype_size(op->dtype), blk = (op->count + (size_t)L - 1) / (size_t)L;
    size_t          need = (size_t)L * blk * esz;
    char           *buf  = op->dst; // L whole blocks: in the result's buffer, no scratch
    if (need != op->count * esz) {
        if (need > cfg->hier_cap) {
            void *b = dt_alloc(need);
            if (!b)
                return dt_op_fail(op, DT_ERR_NOMEM, "out of memory for %zu bytes of scratch", need);
            dt_free(cfg->hier_buf);
            cfg->hier_buf = b;
            cfg->hier_cap = need;
        }
        buf = cfg->hier_buf;
        memset(buf + op->count * esz, 0, need - op->count * esz);
    }
    char *mine = buf + (size_t)l * blk * esz;
    if (op->src != buf)
        memcpy(buf, op->src, op->count * esz);
    DT_TRY(level_step(node, "node", cfg, op, DT_COLL_REDUCE_SCATTER, -1, buf, mine, blk));
    DT_TRY(level_step(cross, "cross", cfg, op, DT_COLL_ALL_REDUCE, -1, mine, mine, blk));
    DT_TRY(level_step(node, "node", cfg, op, DT_COLL_ALL_GATHER, -1, mine, buf, blk));
    if (buf != op->dst)
        memcpy(op->dst, buf, op->count * esz);
    return DT_OK;
}

static dt_status hier_broadcast(const dt_xport *t, dt_algo_cfg *cfg, const dt_op *op) {
    int host = t->host_of[op->root], local = t->local_of[op->root];
    if (t->node->rank == local) // this rank's cross level is the root's
        DT_TRY(level_step(t->cross, "cross", cfg, op, DT_COLL_BROADCAST, host, op->dst, op->dst,
                          op->count));
    return level_step(t->node, "node", cfg, op, DT_COLL_BROADCAST, local, op->dst, op->dst,
                      op->count);
}

// ---------------------------------------------------------------------- running

static dt_status run_row(const row *r, const dt_xport *t, dt_algo_cfg *cfg, const dt_op *op) {
    switch (r->family) {
    case F_NATIVE:
        return t->run(t->run_ctx, op);
    case F_HIER:
        return op->kind == DT_COLL_BROADCAST ? hier_broadcast(t, cfg, op)
                                             : hier_all_reduce(t, cfg, op);
    case F_SHM:
        return dt_algo_staged(t->seg, op, (dt_staged_id)r->id);
    default:
        return dt_algo_p2p(t, cfg, op, r->id);
    }
}

dt_status dt_algo_run(const dt_xport *t, dt_algo_cfg *cfg, const dt_op *op) {
    if ((unsigned)op->kind >= DT_COLL_COUNT_)
        return dt_op_fail(op, DT_ERR_INTERNAL, "unknown operation kind %d", (int)op->kind);
    const row *r = choose(t, cfg, op, true);
    if (!r)
        return dt_op_fail(op, DT_ERR_UNSUPPORTED, "this group's transport can run no %s",
                          dt_coll_name(op->kind));
    // AVG as Gloo does it: the process group passes SUM and asks for the average
    // (fp.op); a library that averages itself gets AVG, every other row sums and the
    // result is divided here.
    bool avg = dt_coll_has_op(op->kind) && op->fp.op == DT_REDUCE_AVG && op->op != DT_REDUCE_AVG;
    if (avg && r->family == F_NATIVE && t->run_avg) {
        dt_op o = *op;
        o.op    = DT_REDUCE_AVG;
        return t->run(t->run_ctx, &o);
    }
    DT_TRY(run_row(r, t, cfg, op));
    if (avg && op->dst) {
        size_t n = op->kind == DT_COLL_REDUCE && t->rank != op->root ? 0 : op->count;
        dt_reduce_div(op->dtype, op->dst, n, t->world);
    }
    return DT_OK;
}

const char *dt_algo_chosen(const dt_xport *t, const dt_algo_cfg *cfg, const dt_op *op) {
    const row *r = (unsigned)op->kind < DT_COLL_COUNT_ ? choose(t, cfg, op, true) : NULL;
    return r ? r->name : "none";
}

// ---------------------------------------------------------------------- settings

// The idx-th name of a setting's "a|b|c" choices, if it is one of the table's rows
// (the static name, so that cfg keeps a pointer).
static const char *row_name(const table *tb, const char *choices, int idx) {
    const char *p = choices;
    for (int i = 0; i < idx && p; i++) {
        p = strchr(p, '|');
        if (p)
            p++;
    }
    if (!p)
        return NULL;
    size_t len = strcspn(p, "|");
    for (int i = 0; i < tb->n; i++)
        if (strlen(tb->rows[i].name) == len && strncmp(tb->rows[i].name, p, len) == 0)
            return tb->rows[i].name;
    return NULL;
}

// The tunables and their defaults are rows of the settings table (src/core/settings.c):
// DT_SEGMENT_BYTES, the ring segment (1 MiB: small enough that a segment is on the wire
// while the previous one is reduced, the pipeline needing >= 2 segments per chunk,
// large enough that per-message costs stay small; measured with bench/dtrain-bench);
// DT_SMALL_BYTES (64 KiB: below it all_reduce uses recursive doubling and
// broadcast/reduce a binomial tree, log2(P) latency-bound steps beating the ring's
// 2(P-1)); DT_RING_LAG (2: see ring_run in p2p.c; a lag >= the segment count is the
// plain step-by-step order); DT_HYBRID_MIN_BYTES; the DT_*_ALGO of each table.
// Receive slots the ring keeps in flight.
#define DEFAULT_SLOTS 4

dt_status dt_algo_cfg_init(dt_algo_cfg *cfg) {
    memset(cfg, 0, sizeof *cfg);
    for (int k = 0; k < DT_COLL_COUNT_; k++) {
        const table *tb = &tables[k];
        if (!tb->setting)
            continue;
        int idx;
        DT_TRY(dt_setting_choice(tb->setting, &idx));
        if (idx > 0) { // 0 is auto
            cfg->forced[k] = row_name(tb, dt_setting_find(tb->setting)->choices, idx);
            DT_ASSERT(cfg->forced[k] != NULL); // settings.c lists only the rows' names
        }
    }
    long v;
    DT_TRY(dt_setting_int("DT_SEGMENT_BYTES", &v));
    cfg->segment_bytes = (size_t)v;
    DT_TRY(dt_setting_int("DT_SMALL_BYTES", &v));
    cfg->small_bytes = (size_t)v;
    DT_TRY(dt_setting_int("DT_HYBRID_MIN_BYTES", &v));
    cfg->hier_min_bytes = (size_t)v;
    DT_TRY(dt_setting_int("DT_HYBRID_BCAST_MIN_BYTES", &v));
    cfg->hier_bcast_min_bytes = (size_t)v;
    cfg->slots                = DEFAULT_SLOTS;
    DT_TRY(dt_setting_int("DT_RING_LAG", &v));
    cfg->ring_lag = (size_t)v;
    return DT_OK;
}

void dt_algo_cfg_free(dt_algo_cfg *cfg) {
    dt_free(cfg->slot_buf);
    dt_free(cfg->part_buf);
    dt_free(cfg->xfers);
    dt_free(cfg->ready_buf);
    dt_free(cfg->hier_buf);
    memset(cfg, 0, sizeof *cfg);
}

static const char *const need_words[] = {
    [NEED_RUN]    = "no collectives of its own library",
    [NEED_LEVELS] = "no two levels (only the hybrid backend has them)",
    [NEED_SEG]    = "no shared-memory segment",
    [NEED_XFER]   = "no point-to-point transfers",
};

dt_status dt_algo_check(const dt_xport *t, const dt_algo_cfg *cfg, const char *backend) {
    for (int k = 0; k < DT_COLL_COUNT_; k++) {
        const table *tb   = &tables[k];
        const char  *name = cfg->forced[k];
        if (!name)
            continue;
        unsigned missing = 0;
        bool     ok      = false;
        for (int i = 0; i < tb->n && !ok; i++)
            if (strcmp(tb->rows[i].name, name) == 0) {
                ok = can_run(t, &tb->rows[i], (dt_coll)k);
                if (!ok)
                    missing = tb->rows[i].needs;
            }
        if (ok)
            continue;
        char   here[160] = "auto";
        size_t off       = strlen(here);
        for (int i = 0; i < tb->n && off < sizeof here; i++) {
            const row *r = &tb->rows[i];
            if (can_run(t, r, (dt_coll)k) && (i == 0 || strcmp(r->name, tb->rows[i - 1].name)))
                off += (size_t)snprintf(here + off, sizeof here - off, ", %s", r->name);
        }
        return dt_fail(DT_ERR_UNSUPPORTED, "%s=%s: backend %s has %s; expected one of %s",
                       tb->setting, name, backend, need_words[missing], here);
    }
    return DT_OK;
}
