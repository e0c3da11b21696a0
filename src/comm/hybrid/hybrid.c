// hybrid.c: the "hybrid" backend, shared memory inside a host and tcp between hosts: a
// backend composed of two transports.
//
//   tcp    every pair of ranks connected, as the tcp backend connects them (its state,
//          through a store view of this backend's own): the world's transfer slots,
//          which every flat algorithm and every sub-group runs over;
//   node   a shm segment among the ranks of this host (shm's engine, dt_shm_join).
//
// It offers the algorithm layer two levels besides the transfer slots (backend.h,
// dt_xport): `node` (this host's segment) and `cross` (the ranks with this rank's local
// index on every host, over the tcp connections with their ranks translated). The
// all_reduce table runs its "hier" algorithm over them from DT_HYBRID_MIN_BYTES up, the
// broadcast table from DT_HYBRID_BCAST_MIN_BYTES (algo/table.c explains the steps);
// smaller all_reduces and every other collective run flat over tcp.
//
// Chosen by "auto" when the ranks span hosts and every host runs the same number of
// ranks, more than one (else the cross levels would differ in size: auto then picks
// tcp, and "hybrid" asked by name is refused naming the hosts).
#include "comm/comm_impl.h"
#include "comm/shm/shm.h"

#include <stdio.h>
#include <string.h>

typedef struct hybrid {
    void     *tcp;         // the tcp backend's state
    dt_shm   *node;        // this host's segment; NULL when alone on its host
    dt_store *node_store;  // the store view the node's segment was made through
    int      *cross_ranks; // world rank of this local index on host h, by host index
    int      *host_of;     // by world rank: its host index, then (+ world) its local index
    dt_xport  node_x, cross_x;
} hybrid;

// Host index: hosts numbered by their first rank; local index: rank order on the host.
static void place(const dt_pg *pg, int rank, int *host, int *local, int *hosts, int *per_host) {
    *host = *hosts = *local = *per_host = 0;
    for (int r = 0; r < dt_pg_size(pg); r++) {
        bool first = true;
        for (int q = 0; q < r && first; q++)
            first = strcmp(dt_pg_host_id(pg, q), dt_pg_host_id(pg, r)) != 0;
        if (first && r <= rank && strcmp(dt_pg_host_id(pg, r), dt_pg_host_id(pg, rank)) != 0)
            ++*host;
        *hosts += first;
        if (strcmp(dt_pg_host_id(pg, r), dt_pg_host_id(pg, rank)) == 0) {
            *local += r < rank;
            ++*per_host;
        }
    }
}

// Every host must run as many ranks as the first (why: else which hosts differ).
static bool hosts_even(const dt_pg *pg, char *why, size_t n) {
    int h, l, hosts, first;
    place(pg, 0, &h, &l, &hosts, &first);
    for (int r = 1; r < dt_pg_size(pg); r++) {
        int count;
        place(pg, r, &h, &l, &hosts, &count);
        if (count != first) {
            if (why)
                snprintf(why, n,
                         "host %s runs %d ranks but host %s runs %d; every host must run as "
                         "many",
                         dt_pg_host_id(pg, 0), first, dt_pg_host_id(pg, r), count);
            return false;
        }
    }
    return true;
}

// Asked by name it serves any even layout; "auto" wants it only where it changes
// something: more than one host, and more than one rank on each.
static bool hybrid_usable(const dt_pg *pg, bool for_auto, char *why, size_t n) {
    int h, l, hosts, per_host;
    place(pg, dt_pg_rank(pg), &h, &l, &hosts, &per_host);
    if (!hosts_even(pg, why, n))
        return false;
    return !for_auto || (hosts > 1 && per_host > 1);
}

static dt_status hybrid_xfer_post(void *ctx, const dt_op *op, dt_xfer *x) {
    return dt_backend_tcp.xfer_post(((hybrid *)ctx)->tcp, op, x);
}
static dt_status hybrid_xfer_wait(void *ctx, const dt_op *op, dt_xfer *x) {
    return dt_backend_tcp.xfer_wait(((hybrid *)ctx)->tcp, op, x);
}
static bool hybrid_xfer_ready(void *ctx, int peer) {
    return dt_backend_tcp.xfer_ready(((hybrid *)ctx)->tcp, peer);
}

static void hybrid_free(void *ctx) {
    hybrid *h = ctx;
    if (h->tcp)
        dt_backend_tcp.free(h->tcp);
    dt_shm_free(h->node);
    dt_store_free(h->node_store);
    dt_free(h->cross_ranks);
    dt_free(h->host_of);
    dt_free(h);
}

static void hybrid_abort(void *ctx, dt_status st, const char *msg) {
    hybrid *h = ctx;
    if (h->tcp)
        dt_backend_tcp.abort(h->tcp, st, msg);
    dt_shm_abort(h->node, st, msg);
}

static dt_status hybrid_init(dt_pg *pg, dt_store *store, uint64_t deadline_ns, void **ctx) {
    char why[200];
    if (!hosts_even(pg, why, sizeof why))
        return dt_fail(DT_ERR_UNSUPPORTED, "backend hybrid cannot serve this group: %s", why);
    hybrid *h = dt_alloc_zero(sizeof *h);
    if (!h)
        return DT_ERR_NOMEM;
    *ctx = h;
    int host, local, hosts, per_host, world = dt_pg_size(pg);
    place(pg, dt_pg_rank(pg), &host, &local, &hosts, &per_host);
    DT_TRY(dt_backend_tcp.init(pg, store, deadline_ns, &h->tcp));
    h->cross_ranks = dt_alloc(sizeof(int) * (size_t)hosts);
    h->host_of     = dt_alloc(sizeof(int) * 2 * (size_t)world);
    if (!h->cross_ranks || !h->host_of)
        return DT_ERR_NOMEM;
    for (int r = 0; r < world; r++) {
        int n, c;
        place(pg, r, &h->host_of[r], &h->host_of[world + r], &n, &c);
        if (h->host_of[world + r] == local)
            h->cross_ranks[h->host_of[r]] = r;
    }
    if (per_host > 1) {
        char prefix[32];
        snprintf(prefix, sizeof prefix, "node/%d", host);
        DT_TRY(dt_store_new_prefix(&h->node_store, store, prefix));
        dt_status st = dt_shm_join(pg, local, per_host, h->node_store, deadline_ns, &h->node);
        if (st != DT_OK)
            return dt_fail_context("backend hybrid: the shared memory of host %s",
                                   dt_pg_host_id(pg, dt_pg_rank(pg)));
    }
    h->node_x  = (dt_xport){.rank = local, .world = per_host, .seg = h->node};
    h->cross_x = (dt_xport){.rank      = host,
                            .world     = hosts,
                            .xfer_post = dt_backend_tcp.xfer_post,
                            .xfer_wait = dt_backend_tcp.xfer_wait,
                            .xfer_ctx  = h->tcp,
                            .peers     = h->cross_ranks};
    if (dt_pg_rank(pg) == 0)
        DT_INFO("comm", "backend hybrid: %d hosts of %d ranks: shm inside a host, tcp between",
                hosts, per_host);
    return DT_OK;
}

static void hybrid_xport(void *ctx, dt_xport *t) {
    hybrid *h   = ctx;
    t->node     = &h->node_x;
    t->cross    = &h->cross_x;
    t->host_of  = h->host_of;
    t->local_of = h->host_of + t->world;
}

const dt_backend_ops dt_backend_hybrid = {
    .name             = "hybrid",
    .usable           = hybrid_usable,
    .init             = hybrid_init,
    .free             = hybrid_free,
    .abort            = hybrid_abort,
    .xfer_post        = hybrid_xfer_post,
    .xfer_wait        = hybrid_xfer_wait,
    .xfer_ready       = hybrid_xfer_ready,
    .xport            = hybrid_xport,
    .reports_progress = true,
    .built            = true,
};
