// pg_state.c: what the layers below the dispatcher read from a group (rank, size, hosts,
// timeout, token, the abort flag and fd, the progress counter: backend.h), the poison
// every group of a process shares (pg_impl.h), and the held sends every backend's waits
// move (dt_pg_push_sends). It calls nothing above it: tcp, shm, mpi, hybrid, liveness,
// the dispatcher and the sub-groups call down into it.
#include "comm/pg_impl.h"

#include <stdarg.h>
#include <stdio.h>
#include <unistd.h>

int dt_pg_rank(const dt_pg *pg) {
    return pg ? pg->rank : -1;
}
int dt_pg_size(const dt_pg *pg) {
    return pg ? pg->world : 0;
}
int dt_pg_local_rank(const dt_pg *pg) {
    return pg ? pg->local_rank : -1;
}
int dt_pg_local_size(const dt_pg *pg) {
    return pg ? pg->local_world : 0;
}
const char *dt_pg_backend(const dt_pg *pg) {
    return pg && pg->be ? pg->be->name : "none";
}
dt_store *dt_pg_store(dt_pg *pg) {
    return pg ? pg->store : NULL;
}
bool dt_pg_all_local(const dt_pg *pg) {
    return pg->all_local;
}
const char *dt_pg_host_id(const dt_pg *pg, int rank) {
    return rank >= 0 && rank < pg->world ? pg->host_ids[rank] : "";
}
int64_t dt_pg_timeout_ms(const dt_pg *pg) {
    return pg->timeout_ms;
}
const char *dt_pg_token(const dt_pg *pg) {
    return pg->root->token;
}
// Poison, abort fd, progress and the operation in flight are the process's (the
// world group's), whichever group asks: see pg_impl.h.
bool dt_pg_aborted(const dt_pg *pg) {
    return atomic_load(&pg->root->poisoned);
}
int dt_pg_abort_fd(const dt_pg *pg) {
    return pg->root->abort_fd;
}

void dt_pg_progress(dt_pg *pg) {
    atomic_fetch_add_explicit(&pg->root->progress, 1, memory_order_relaxed);
}
uint64_t dt_pg_progress_count(const dt_pg *pg) {
    return atomic_load_explicit(&pg->root->progress, memory_order_relaxed);
}
uint64_t dt_pg_current_op(const dt_pg *pg) {
    return atomic_load_explicit(&pg->root->cur_op, memory_order_relaxed);
}
bool dt_pg_reports_progress(const dt_pg *pg) {
    return pg->be && pg->be->reports_progress;
}

dt_pg_opts dt_pg_opts_default(void) {
    return (dt_pg_opts){0};
}

// Records the process's first failure (later ones are consequences) and wakes waiters.
// Every group of the process shares it (pg_impl.h).
void dt_pg_poison(dt_pg *pg, dt_status st, const char *msg) {
    pg = pg->root;
    pthread_mutex_lock(&pg->mu);
    if (!atomic_load(&pg->poisoned)) {
        pg->poison_st = st;
        snprintf(pg->poison_msg, sizeof pg->poison_msg, "%s", msg);
        atomic_store(&pg->poisoned, true);
        uint64_t one = 1;
        ssize_t  w   = write(pg->abort_fd, &one, sizeof one);
        (void)w;
    }
    pthread_mutex_unlock(&pg->mu);
}

void dt_pg_fail(dt_pg *pg, dt_status st, const char *fmt, ...) {
    char    msg[DT_PG_MSG_LEN];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    dt_pg_poison(pg, st, msg);
}

// ------------------------------------------------------------------ held sends

// New groups are linked at the head of the root's list under R->mu and unlinked on the
// lane, so the walk from the head read under R->mu is safe for the lane's holder.
bool dt_pg_push_all(dt_pg *R, bool *moved) {
    pthread_mutex_lock(&R->mu);
    dt_pg *first = R->next_group;
    pthread_mutex_unlock(&R->mu);
    bool held = false;
    for (dt_pg *g = R; g; g = g == R ? first : g->next_group)
        if (g->be && g->be->push && g->be_ctx && g->be->push(g->be_ctx, moved))
            held = true;
    if (!held)
        atomic_store(&R->sends_held, false);
    return held;
}

bool dt_pg_push_sends(dt_pg *pg) {
    dt_pg *R = pg->root;
    if (!atomic_load_explicit(&R->sends_held, memory_order_relaxed))
        return false;
    bool moved = false;
    return dt_pg_push_all(R, &moved);
}

// ------------------------------------------------------------------ messages

void dt_pg_group_describe(const dt_pg *g, char *buf, size_t n) {
    size_t off = (size_t)snprintf(buf, n, " [group %u: world ranks ", g->gid);
    for (int i = 0; i < g->world && off < n; i++) {
        if (i == 8 && g->world > 9) {
            off += (size_t)snprintf(buf + off, n - off, "..., %d", g->world_ranks[g->world - 1]);
            break;
        }
        off += (size_t)snprintf(buf + off, n - off, "%s%d", i ? ", " : "", g->world_ranks[i]);
    }
    if (off < n)
        snprintf(buf + off, n - off, "; this rank: rank %d of the group, world rank %d]", g->rank,
                 g->world_ranks[g->rank]);
}
