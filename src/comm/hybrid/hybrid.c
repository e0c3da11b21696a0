// hybrid.c: the "hybrid" backend: shared memory inside a host, tcp between hosts.
//
// The world group runs on tcp (every pair of ranks connected, as the tcp backend
// does); after its init, two families of sub-groups (group.c) are made once:
//   node   the ranks of one host, on shm (a segment per host);
//   cross  the ranks with the same local index on every host, over the world's tcp
//          connections (no new sockets).
// An all_reduce of at least DT_HYBRID_MIN_BYTES then runs hierarchically:
//
//   step  group  what                                               bytes per rank moved
//   1     node   reduce_scatter: local rank l gets block l, reduced   (L-1)/L * n  (memory)
//                over the host (L = ranks per host)
//   2     cross  all_reduce of block l over the hosts (tcp ring or    2(H-1)/H * n/L (network)
//                recursive doubling by size; H = hosts)
//   3     node   all_gather of the blocks                             (L-1)/L * n  (memory)
//
// so each host's link carries 2(H-1)/H * n each way, in L parallel streams, where the
// flat ring over all P = H*L ranks (placed host by host) carries 2(P-1)/P * n in one
// stream: (P-1)H / (P(H-1)) times more (1.5x for 2 hosts of 2 ranks, nearly 2x for 2
// hosts of many). The ranks of a host exchange through memory, not loopback tcp, and
// the latency is 2(L-1) shm steps plus 2(H-1) network steps instead of 2(P-1). The
// buffer is copied into a padded scratch of L blocks of ceil(n/L) elements (the padding
// is reduced and dropped). Smaller all_reduces and every other collective run flat on
// the world's tcp (below DT_HYBRID_MIN_BYTES the extra steps cost more latency than the
// link time they save).
// The result is reduced once per element and all-gathered, so it is bitwise equal on
// every rank; it equals the flat backends' to float rounding (another order).
//
// Chosen by "auto" when the ranks span hosts and some host has more than one; every
// host must run the same number of ranks (else the cross groups would differ in size:
// auto then picks tcp, and "hybrid" asked by name is refused naming the hosts).
#include "comm/backends.h"
#include "comm/pg_impl.h"

#include <stdio.h>
#include <string.h>

bool dt_hybrid_fits(const dt_pg *pg, char *why, size_t n) {
    int first_count = -1, hosts = 0;
    for (int r = 0; r < pg->world; r++) {
        bool seen = false;
        for (int q = 0; q < r && !seen; q++)
            seen = strcmp(pg->host_ids[q], pg->host_ids[r]) == 0;
        if (seen)
            continue;
        hosts++;
        int count = 0;
        for (int q = r; q < pg->world; q++)
            count += strcmp(pg->host_ids[q], pg->host_ids[r]) == 0;
        if (first_count < 0) {
            first_count = count;
        } else if (count != first_count) {
            if (why)
                snprintf(why, n,
                         "host %s runs %d ranks but host %s runs %d; every host must run as "
                         "many",
                         pg->host_ids[0], first_count, pg->host_ids[r], count);
            return false;
        }
    }
    if (why)
        snprintf(why, n, "ok");
    // "auto" wants it only where it changes something; asked by name it always serves.
    return why ? true : hosts > 1 && first_count > 1;
}

dt_status dt_hybrid_setup(dt_pg *pg, uint64_t deadline_ns) {
    (void)deadline_ns;
    long min_bytes;
    DT_TRY(dt_setting_int("DT_HYBRID_MIN_BYTES", &min_bytes));
    pg->hy_min_bytes = (size_t)min_bytes;
    // Host index: the first rank on this host; local index: rank order on the host.
    int host = -1, local = 0;
    for (int r = 0; r < pg->world; r++)
        if (strcmp(pg->host_ids[r], pg->host_ids[pg->rank]) == 0) {
            if (host < 0)
                host = r;
            local += r < pg->rank;
        }
    const dt_backend_ops       *shm = NULL;
    extern const dt_backend_ops dt_backend_shm;
    shm = &dt_backend_shm;
    DT_TRY(dt_pg_split_on(&pg->hy_node, pg, host, pg->rank, shm));
    dt_status st = dt_pg_split(&pg->hy_cross, pg, local, pg->rank, NULL);
    if (st != DT_OK)
        return st;
    if (pg->rank == 0)
        DT_INFO("comm", "backend hybrid: %d hosts of %d ranks: shm inside a host, tcp between",
                dt_pg_size(pg->hy_cross), dt_pg_size(pg->hy_node));
    return DT_OK;
}

void dt_hybrid_free(dt_pg *pg) {
    dt_pg_free(pg->hy_cross);
    dt_pg_free(pg->hy_node);
    pg->hy_cross = pg->hy_node = NULL;
    dt_free(pg->hy_buf);
    pg->hy_buf = NULL;
}

bool dt_hybrid_takes(const dt_pg *pg, const dt_op *op) {
    return pg->hy_node && op->kind == DT_COLL_ALL_REDUCE && pg->hy_node->world > 1 &&
           pg->hy_cross->world > 1 && op->count * dt_dtype_size(op->dtype) >= pg->hy_min_bytes;
}

// One step on a sub-group, inside the world's operation (same deadline).
static dt_status step(dt_pg *g, const dt_op *outer, dt_coll kind, const void *src, void *dst,
                      size_t count) {
    dt_op o    = {.kind  = kind,
                  .root  = -1,
                  .peer  = -1,
                  .src   = src,
                  .dst   = dst,
                  .count = count,
                  .dtype = outer->dtype,
                  .op    = outer->op};
    o.fp.coll  = (uint8_t)kind;
    o.fp.dtype = (uint8_t)outer->dtype;
    o.fp.count = count;
    o.fp.root  = -1;
    o.fp.op    = kind == DT_COLL_ALL_GATHER ? 0 : (uint8_t)outer->op;
    dt_pg_stamp(g, &o);
    o.deadline_ns = outer->deadline_ns;
    char      msg[DT_PG_MSG_LEN];
    dt_status st = dt_pg_exec(g, &o, msg);
    if (st != DT_OK)
        dt_fail(st, "%s (hybrid step of %s)", msg, outer->name);
    return st;
}

dt_status dt_hybrid_all_reduce(dt_pg *pg, const dt_op *op) {
    dt_pg *node = pg->hy_node, *cross = pg->hy_cross;
    int    L = node->world, l = node->rank;
    size_t esz = dt_dtype_size(op->dtype), blk = (op->count + (size_t)L - 1) / (size_t)L;
    size_t need = (size_t)L * blk * esz;
    if (need > pg->hy_cap) {
        void *b = dt_alloc(need);
        if (!b)
            return dt_op_fail(op, DT_ERR_NOMEM, "out of memory for %zu bytes of scratch", need);
        dt_free(pg->hy_buf);
        pg->hy_buf = b;
        pg->hy_cap = need;
    }
    char *buf  = pg->hy_buf;
    char *mine = buf + (size_t)l * blk * esz;
    memcpy(buf, op->src, op->count * esz);
    memset(buf + op->count * esz, 0, need - op->count * esz);
    DT_TRY(step(node, op, DT_COLL_REDUCE_SCATTER, buf, mine, blk));
    DT_TRY(step(cross, op, DT_COLL_ALL_REDUCE, mine, mine, blk));
    DT_TRY(step(node, op, DT_COLL_ALL_GATHER, mine, buf, blk));
    memcpy(op->dst, buf, op->count * esz);
    return DT_OK;
}
