// group.c: sub-groups of a process group (dt_pg_new_group, dt_pg_split).
//
// Creation is collective over the parent and costs one parent all_gather, no new
// rendezvous: every rank of the parent contributes (color, key, the least group id it
// may use, a hash of the rank list for new_group); the members of a color, ordered by
// (key, parent rank) as MPI_Comm_split orders them, form one group. The id is the
// largest proposal: a rank's next proposal is always above every id it already has,
// so two groups that share a rank never share an id (disjoint groups may, as the groups
// of one split do), and the id in every fingerprint (backend.h) keeps their messages
// apart.
//
// How a group moves data depends on the parent's backend (backend.h, group_new):
// - tcp and hybrid: no slot: the group's transport is the world's transfer slots with its
//   ranks translated to world ranks (dt_xport.peers); nothing new is opened.
// - shm: a small segment of the group's own, created through the parent's store (the
//   shm engine lays out its slots by rank and world size; a segment for k ranks is
//   O(k^2) bytes, and a singleton gets none).
// - mpi: MPI_Comm_split of the parent's communicators.
// All groups of a process share the world group's execution lane, poison and
// liveness (pg_impl.h): operations of every group run one at a time in issue order, a
// failure or abort in any group stops every group, and a dead or frozen rank anywhere
// is found by the world's heartbeats.
#include "comm/pg_impl.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { F_COLOR, F_KEY, F_GID, F_CHECK, F_COUNT };

static int cmp_int(const void *a, const void *b) {
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

typedef struct member {
    int64_t key;
    int     prank; // parent rank
} member;

static int cmp_member(const void *a, const void *b) {
    const member *x = a, *y = b;
    if (x->key != y->key)
        return x->key < y->key ? -1 : 1;
    return (x->prank > y->prank) - (x->prank < y->prank);
}

static void unlink_group(dt_pg *g) {
    dt_pg *R = g->root;
    pthread_mutex_lock(&R->mu);
    for (dt_pg **pp = &R->next_group; *pp; pp = &(*pp)->next_group)
        if (*pp == g) {
            *pp = g->next_group;
            break;
        }
    pthread_mutex_unlock(&R->mu);
}

// Releases what a group owns; `linked`: it is on the root's list.
static void group_destroy(dt_pg *g, bool linked) {
    if (linked)
        unlink_group(g);
    if (g->be && g->be_ctx)
        g->be->free(g->be_ctx);
    dt_algo_cfg_free(&g->algo);
    dt_store_free(g->be_store);
    if (g->host_ids)
        for (int r = 0; r < g->world; r++)
            dt_free(g->host_ids[r]);
    dt_free(g->host_ids);
    dt_free(g->world_ranks);
    dt_free(g->send_seq);
    dt_free(g->recv_seq);
    dt_free(g);
}

void dt_pg_group_free(dt_pg *g) {
    dt_pg *R = g->root;
    // Freeing does not change the caller's last error.
    dt_status saved_st = dt_last_status();
    char      saved[DT_PG_MSG_LEN];
    snprintf(saved, sizeof saved, "%s", dt_last_error());
    // Wait for the group's queued operations (each bounded by its own deadline).
    pthread_mutex_lock(&R->mu);
    while (g->pending > 0)
        pthread_cond_wait(&R->cv, &R->mu);
    pthread_mutex_unlock(&R->mu);
    // The backend's free may talk to MPI: on the lane, bounded like any operation.
    bool lane = dt_pg_lane_take(R, dt_deadline_ns(g->timeout_ms < 0 ? 60000 : g->timeout_ms),
                                "dt_pg_free") == DT_OK;
    // Sends the backend still holds reach their receivers first (bounded by the timeout).
    if (lane)
        dt_pg_flush_sends(g);
    group_destroy(g, true);
    if (lane)
        dt_pg_lane_give(R);
    if (saved_st != DT_OK)
        dt_fail(saved_st, "%s", saved);
    else
        dt_clear_error();
}

// Fills the group's ranks, hosts and local ranks from the parent's.
static dt_status group_fill(dt_pg *g, const dt_pg *parent, const member *m, int n, int me) {
    g->world       = n;
    g->rank        = me;
    g->world_ranks = dt_alloc_zero((size_t)n * sizeof *g->world_ranks);
    g->host_ids    = dt_alloc_zero((size_t)n * sizeof *g->host_ids);
    g->send_seq    = dt_alloc_zero((size_t)n * sizeof *g->send_seq);
    g->recv_seq    = dt_alloc_zero((size_t)n * sizeof *g->recv_seq);
    if (!g->world_ranks || !g->host_ids || !g->send_seq || !g->recv_seq)
        return DT_ERR_NOMEM;
    for (int i = 0; i < n; i++) {
        int pr            = m[i].prank;
        g->world_ranks[i] = parent->world_ranks ? parent->world_ranks[pr] : pr;
        if (!(g->host_ids[i] = dt_strdup(parent->host_ids[pr])))
            return DT_ERR_NOMEM;
    }
    g->all_local  = true;
    g->local_rank = g->local_world = 0;
    for (int i = 0; i < n; i++) {
        bool same = strcmp(g->host_ids[i], g->host_ids[me]) == 0;
        g->all_local &= same;
        if (same) {
            g->local_rank += i < me;
            g->local_world++;
        }
    }
    return DT_OK;
}

static dt_status group_create(dt_pg **out, dt_pg *parent, int color, int key, int64_t check,
                              const dt_pg_opts *opts, const char *what) {
    *out = NULL;
    if (!parent)
        return dt_fail(DT_ERR_ARG, "%s: the parent group is NULL", what);
    dt_pg     *R = parent->root;
    dt_pg_opts o = opts ? *opts : dt_pg_opts_default();
    if (o.backend && *o.backend && strcmp(o.backend, parent->be->name) != 0 &&
        !(strcmp(o.backend, "gloo") == 0 && strcmp(parent->be->name, "tcp") == 0))
        return dt_fail(DT_ERR_UNSUPPORTED,
                       "%s: a sub-group uses its parent's backend (%s), found backend \"%s\"", what,
                       parent->be->name, o.backend);
    int64_t timeout = o.timeout_ms ? o.timeout_ms : parent->timeout_ms;

    // One all_gather over the parent: everyone's color, key, id proposal and check.
    int      pw = parent->world;
    int64_t  mine[F_COUNT];
    int64_t *all = dt_alloc((size_t)pw * F_COUNT * sizeof *all);
    member  *m   = dt_alloc((size_t)pw * sizeof *m);
    if (!all || !m) {
        dt_free(all), dt_free(m);
        return dt_fail_context("%s", what);
    }
    pthread_mutex_lock(&R->mu);
    mine[F_GID] = R->next_gid;
    pthread_mutex_unlock(&R->mu);
    mine[F_COLOR] = color < 0 ? -1 : color;
    mine[F_KEY]   = key;
    mine[F_CHECK] = check;
    dt_status st  = dt_pg_all_gather(parent, mine, all, F_COUNT, DT_INT64);
    if (st != DT_OK) {
        dt_free(all), dt_free(m);
        return dt_fail_context("%s (the parent's all_gather of colors and keys)", what);
    }
    int64_t gid = 0;
    for (int r = 0; r < pw; r++)
        if (all[r * F_COUNT + F_GID] > gid)
            gid = all[r * F_COUNT + F_GID];
    // Every rank of the parent moves past the id, members or not (see the top).
    pthread_mutex_lock(&R->mu);
    if ((uint64_t)gid + 1 > R->next_gid)
        R->next_gid = (uint32_t)gid + 1;
    pthread_mutex_unlock(&R->mu);
    if (gid > DT_FP_MAX_GROUP) {
        dt_free(all), dt_free(m);
        return dt_fail(DT_ERR_UNSUPPORTED, "%s: more than %d groups were created in this job", what,
                       DT_FP_MAX_GROUP);
    }
    // new_group: every rank must pass the same list.
    for (int r = 0; r < pw; r++)
        if (all[r * F_COUNT + F_CHECK] != check) {
            dt_free(all), dt_free(m);
            return dt_fail(DT_ERR_MISMATCH,
                           "%s: rank %d of the parent passed another list of ranks than this "
                           "rank (%d); every rank of the parent must pass the same list",
                           what, r, parent->rank);
        }
    int n = 0, me = -1;
    if (color >= 0) {
        for (int r = 0; r < pw; r++)
            if (all[r * F_COUNT + F_COLOR] == color)
                m[n++] = (member){.key = all[r * F_COUNT + F_KEY], .prank = r};
        qsort(m, (size_t)n, sizeof *m, cmp_member);
        for (int i = 0; i < n; i++)
            if (m[i].prank == parent->rank)
                me = i;
    }
    dt_free(all);

    dt_pg *g = NULL;
    if (color >= 0) {
        g = dt_alloc_zero(sizeof *g);
        if (!g) {
            dt_free(m);
            return dt_fail_context("%s", what);
        }
        g->root       = R;
        g->gid        = (uint32_t)gid;
        g->be         = parent->be;
        g->timeout_ms = timeout;
        g->store      = R->store;
        st            = group_fill(g, parent, m, n, me);
        if (st == DT_OK)
            st = dt_algo_cfg_init(&g->algo);
        // Groups that share an id are disjoint (see the top): their first world rank
        // tells them apart.
        char prefix[64];
        snprintf(prefix, sizeof prefix, "dt/g%" PRId64 "/%d/%s", gid, g->world_ranks[0],
                 g->be->name);
        if (st == DT_OK)
            st = dt_store_new_prefix(&g->be_store, R->store, prefix);
        if (st != DT_OK) {
            dt_free(m);
            group_destroy(g, false);
            return dt_fail_context("%s", what);
        }
    }
    dt_free(m);

    // The backend's part, on the lane (it may use the parent's transport).
    uint64_t deadline = timeout < 0 ? UINT64_MAX : dt_deadline_ns(timeout);
    if (parent->be->group_new) {
        st = dt_pg_lane_take(R, deadline, what);
        if (st == DT_OK) {
            void *ctx = NULL;
            st        = parent->be->group_new(parent->be_ctx, g, g ? g->be_store : NULL, color, key,
                                              deadline, &ctx);
            if (g)
                g->be_ctx = ctx;
            else if (ctx)
                parent->be->free(ctx);
            dt_pg_lane_give(R);
        }
    } else if (g && g->world > 1) {
        const dt_backend_ops *be = parent->be;
        if (!be->xfer_post || !be->xfer_wait)
            st = dt_fail(DT_ERR_UNSUPPORTED, "%s: backend %s cannot serve sub-groups", what,
                         be->name);
        g->shared = true;
    }
    if (st == DT_OK && g)
        st = dt_pg_set_xport(g);
    if (st != DT_OK) {
        if (g)
            group_destroy(g, false);
        return dt_fail_context("%s: backend %s", what, parent->be->name);
    }
    if (!g)
        return DT_OK;
    pthread_mutex_lock(&R->mu);
    g->next_group = R->next_group;
    R->next_group = g;
    pthread_mutex_unlock(&R->mu);
    // The group's init barrier: every member has its backend state before any returns.
    dt_op ob    = {.kind = DT_COLL_INIT, .root = -1, .peer = -1};
    ob.fp.coll  = DT_COLL_INIT;
    ob.fp.dtype = DT_FLOAT32;
    ob.fp.root  = -1;
    if ((st = dt_pg_submit(g, &ob, NULL)) != DT_OK) {
        dt_fail_context("%s: the new group's first barrier", what);
        char      msg[DT_PG_MSG_LEN];
        dt_status fst = dt_last_status();
        snprintf(msg, sizeof msg, "%s", dt_last_error());
        dt_pg_group_free(g);
        return dt_fail(fst, "%s", msg);
    }
    DT_DEBUG("comm", "%s: group %u, rank %d of %d (%s)", what, g->gid, g->rank, g->world,
             g->shared ? "over the world's connections" : g->be->name);
    *out = g;
    return DT_OK;
}

dt_status dt_pg_split(dt_pg **out, dt_pg *parent, int color, int key, const dt_pg_opts *opts) {
    if (!out)
        return dt_fail(DT_ERR_ARG, "dt_pg_split: out is NULL");
    return group_create(out, parent, color, key, 0, opts, "dt_pg_split");
}

dt_status dt_pg_new_group(dt_pg **out, dt_pg *parent, const int *ranks, int n,
                          const dt_pg_opts *opts) {
    if (!out)
        return dt_fail(DT_ERR_ARG, "dt_pg_new_group: out is NULL");
    *out = NULL;
    if (!parent)
        return dt_fail(DT_ERR_ARG, "dt_pg_new_group: the parent group is NULL");
    if (n < 1 || n > parent->world || !ranks)
        return dt_fail(DT_ERR_ARG,
                       "dt_pg_new_group: expected 1 to %d ranks of the parent, found %d%s",
                       parent->world, n, ranks ? "" : " (ranks is NULL)");
    int *sorted = dt_alloc((size_t)n * sizeof *sorted);
    if (!sorted)
        return dt_fail_context("dt_pg_new_group");
    memcpy(sorted, ranks, (size_t)n * sizeof *sorted);
    qsort(sorted, (size_t)n, sizeof *sorted, cmp_int);
    uint64_t h       = 1469598103934665603ull; // FNV-1a of the sorted list
    bool     in_list = false;
    for (int i = 0; i < n; i++) {
        if (sorted[i] < 0 || sorted[i] >= parent->world || (i && sorted[i] == sorted[i - 1])) {
            int bad = sorted[i];
            dt_free(sorted);
            return dt_fail(DT_ERR_ARG,
                           "dt_pg_new_group: expected distinct ranks in [0, %d), found %d%s",
                           parent->world, bad, bad >= 0 && bad < parent->world ? " twice" : "");
        }
        in_list |= sorted[i] == parent->rank;
        for (int b = 0; b < 4; b++)
            h = (h ^ (uint8_t)((unsigned)sorted[i] >> (8 * b))) * 1099511628211ull;
    }
    dt_free(sorted);
    // Group ranks follow parent ranks (torch sorts the list too).
    return group_create(out, parent, in_list ? 0 : -1, parent->rank, (int64_t)(h >> 1), opts,
                        "dt_pg_new_group");
}
