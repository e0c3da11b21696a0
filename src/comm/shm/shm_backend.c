// shm_backend.c: the "shm" backend: the engine of shm.c behind comm's backend table.
// This file only does the rendezvous through the store (who runs where, the segment's
// name); the engine offers the algorithms its segment and its channels' transfer slots.
#include "comm/comm_impl.h"
#include "comm/shm/shm.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

static bool shm_usable(const dt_pg *pg, bool for_auto, char *why, size_t n) {
    (void)for_auto;
    if (!dt_pg_all_local(pg) && why)
        snprintf(why, n, "the ranks are on more than one host");
    return dt_pg_all_local(pg);
}

// The engine calls it at the start of operations and between 10 ms futex sleeps: also
// the engine's sign of progress for the liveness thread.
static bool pg_aborted(void *pg) {
    dt_pg_progress(pg);
    return dt_pg_aborted(pg);
}

// The engine calls it from its waits: every group's held sends move while any waits.
static bool pg_push(void *pg) {
    return dt_pg_push_sends(pg);
}

// "pid:[4026531836]": ranks must share it, or their process ids (used to watch each
// other's liveness) would mean nothing to each other.
static void pid_namespace(char *buf, size_t n) {
    ssize_t len = readlink("/proc/self/ns/pid", buf, n - 1);
    if (len <= 0)
        len = snprintf(buf, n, "unknown");
    buf[len] = '\0';
}

typedef struct publish_arg {
    dt_store *store;
    char      value[160];
} publish_arg;

static dt_status publish_segment(void *arg) {
    publish_arg *p = arg;
    return dt_store_set(p->store, "segment", p->value, strlen(p->value));
}

dt_status dt_shm_join(dt_pg *pg, int rank, int world, dt_store *store, uint64_t deadline_ns,
                      dt_shm **out) {
    char key[32], mine[128], ns[64];
    *out = NULL;

    // Every rank's process id and pid namespace, so each can watch the others.
    pid_namespace(ns, sizeof ns);
    snprintf(key, sizeof key, "proc/%d", rank);
    snprintf(mine, sizeof mine, "%d %s", (int)getpid(), ns);
    DT_TRY(dt_store_set(store, key, mine, strlen(mine)));
    int *pids = dt_alloc_zero(sizeof(int) * (size_t)world);
    if (!pids)
        return DT_ERR_NOMEM;
    dt_status st = DT_OK;
    for (int r = 0; r < world && st == DT_OK; r++) {
        char whom[32];
        snprintf(key, sizeof key, "proc/%d", r);
        snprintf(whom, sizeof whom, "rank %d", r);
        st = dt_store_wait_noted(store, key, deadline_ns, "shm init", whom);
        if (st != DT_OK) {
            dt_fail_context("shm init: waiting for rank %d", r);
            break;
        }
        void  *val = NULL;
        size_t len = 0;
        if ((st = dt_store_get(store, key, &val, &len)) != DT_OK)
            break;
        int  pid       = 0;
        char their[64] = "";
        if (sscanf(val, "%d %63s", &pid, their) != 2 || pid <= 0)
            st = dt_fail(DT_ERR_FORMAT,
                         "shm init: expected \"<pid> <pid namespace>\" for rank "
                         "%d in the store, found \"%.60s\"",
                         r, (char *)val);
        else if (strcmp(their, ns) != 0)
            st = dt_fail(DT_ERR_UNSUPPORTED,
                         "shm init: rank %d runs in pid namespace %s, this "
                         "rank (%d) in %s: the shm backend needs one host "
                         "and one process namespace (use backend \"tcp\")",
                         r, their, rank, ns);
        pids[r] = pid;
        dt_free(val);
    }

    publish_arg pub = {.store = store};
    dt_shm_opts o   = {.rank        = rank,
                       .world       = world,
                       .pids        = pids,
                       .deadline_ns = deadline_ns,
                       .aborted     = pg_aborted,
                       .aborted_arg = pg,
                       .push        = pg_push,
                       .push_arg    = pg};
    char        name[96];
    if (st == DT_OK && rank == 0) {
        uint64_t rnd[2] = {0, 0};
        if (getrandom(rnd, sizeof rnd, 0) != (ssize_t)sizeof rnd)
            rnd[0] = dt_now_ns() ^ ((uint64_t)getpid() << 32),
            rnd[1] = rnd[0] * 0x9E3779B97F4A7C15ull;
        snprintf(name, sizeof name, "/dtrain-%d-%d-%016llx", (int)getuid(), (int)getpid(),
                 (unsigned long long)rnd[0]);
        o.name  = name;
        o.nonce = rnd[1] | 1;
        snprintf(pub.value, sizeof pub.value, "%s %016llx", name, (unsigned long long)o.nonce);
        o.created     = publish_segment;
        o.created_arg = &pub;
    } else if (st == DT_OK) {
        void *val = NULL;
        st        = dt_store_wait_noted(store, "segment", deadline_ns, "shm init",
                                        "rank 0 (its shared memory segment)");
        if (st == DT_OK)
            st = dt_store_get(store, "segment", &val, NULL);
        unsigned long long nonce = 0;
        if (st == DT_OK && (sscanf(val, "%95s %llx", name, &nonce) != 2 || name[0] != '/'))
            st = dt_fail(DT_ERR_FORMAT,
                         "shm init: expected \"/<name> <nonce>\" for the segment "
                         "in the store, found \"%.80s\"",
                         (char *)val);
        dt_free(val);
        o.name       = name;
        o.nonce      = nonce;
        o.must_exist = true;
    }
    dt_shm *s = NULL;
    if (st == DT_OK)
        st = dt_shm_init(&o, &s);
    dt_free(pids);
    if (st != DT_OK)
        return st;
    DT_DEBUG("comm", "shm: rank %d of %d mapped %s (%zu KiB chunks)", rank, world, name,
             dt_shm_chunk_bytes(s) >> 10);
    *out = s;
    return DT_OK;
}

static dt_status shm_init(dt_pg *pg, dt_store *store, uint64_t deadline_ns, void **ctx) {
    dt_shm   *s  = NULL;
    dt_status st = dt_shm_join(pg, dt_pg_rank(pg), dt_pg_size(pg), store, deadline_ns, &s);
    *ctx         = s;
    return st;
}

// A sub-group gets a segment of its own, made like the world's through the group's
// store view (the engine lays its slots out by rank and world size); one rank needs none.
static dt_status shm_group_new(void *parent_ctx, dt_pg *group, dt_store *store, int color, int key,
                               uint64_t deadline_ns, void **ctx) {
    (void)parent_ctx, (void)color, (void)key;
    *ctx = NULL;
    if (!group || dt_pg_size(group) == 1)
        return DT_OK;
    return shm_init(group, store, deadline_ns, ctx);
}

static void shm_free_ctx(void *ctx) {
    dt_shm_free(ctx);
}

static void shm_abort(void *ctx, dt_status st, const char *msg) {
    dt_shm_abort(ctx, st, msg);
}

static void shm_xport(void *ctx, dt_xport *t) {
    t->seg = ctx;
}

static bool shm_push(void *ctx, bool *moved) {
    return dt_shm_push(ctx, moved);
}

static dt_status shm_flush(void *ctx, uint64_t deadline_ns) {
    return dt_shm_flush(ctx, deadline_ns);
}

const dt_backend_ops dt_backend_shm = {
    .name             = "shm",
    .usable           = shm_usable,
    .init             = shm_init,
    .group_new        = shm_group_new,
    .free             = shm_free_ctx,
    .abort            = shm_abort,
    .xfer_post        = dt_shm_xfer_post,
    .xfer_wait        = dt_shm_xfer_wait,
    .xfer_ready       = dt_shm_xfer_ready,
    .xport            = shm_xport,
    .push             = shm_push,
    .flush            = shm_flush,
    .reports_progress = true,
    .built            = true,
};
