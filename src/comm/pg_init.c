// pg_init.c: creating and freeing the world group: the init method (env://, tcp://,
// file://, the store's address through MPI), the rendezvous through the store (ranks,
// world size, host identities), the backend's choice and set-up, liveness, and the init
// barrier. It calls the layers below (stores, backends, liveness) and starts the
// lane of pg.c.
#include "comm/backends.h"
#include "comm/pg_impl.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#define MSG_LEN DT_PG_MSG_LEN

// ------------------------------------------------------------------ init and free

static void host_identity(char *buf, size_t n) {
    const char *o = dt_setting_str("DT_HOST_ID"); // tests: pretend ranks are on other hosts
    if (o && *o) {
        snprintf(buf, n, "%s", o);
        return;
    }
    char host[160] = "unknown", boot[64] = "";
    gethostname(host, sizeof host - 1);
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
    if (f) {
        if (fgets(boot, sizeof boot, f))
            boot[strcspn(boot, "\n")] = '\0';
        fclose(f);
    }
    snprintf(buf, n, "%s/%s", host, boot);
}

// Lists the ranks whose key ("dt/rank/<r>") is not in the store yet: "1, 3"; returns
// how many.
static int missing_ranks(dt_pg *pg, const char *const *keys, size_t nkeys, char *msg, size_t n) {
    size_t off     = 0;
    int    missing = 0;
    msg[0]         = '\0';
    for (size_t i = 0; i < nkeys; i++) {
        bool        ok   = false;
        const char *k[1] = {keys[i]};
        dt_store_check(pg->store, k, 1, &ok);
        if (!ok && off < n - 40) {
            const char *r = strrchr(keys[i], '/');
            off += (size_t)snprintf(msg + off, n - off, "%s%s", missing ? ", " : "",
                                    r ? r + 1 : keys[i]);
        } else if (!ok && off < n - 4) {
            off += (size_t)snprintf(msg + off, n - off, " ...");
        }
        missing += !ok;
    }
    return missing;
}

// Waits for keys while watching "dt/abort" (set by a rank that found a problem, so the
// others fail at once instead of at the timeout). Says every DT_WAIT_NOTICE_MS (10 s)
// which ranks have not joined: a job with a rank missing waits the whole timeout, 30
// minutes by default, and used to say nothing meanwhile.
static dt_status rendezvous_wait(dt_pg *pg, const char *const *keys, size_t nkeys,
                                 uint64_t deadline) {
    dt_wait_notice notice;
    dt_wait_notice_start(&notice, deadline);
    for (;;) {
        int64_t slice = 200;
        int     left  = dt_ms_left(deadline);
        if (deadline != UINT64_MAX && left < slice)
            slice = left > 0 ? left : 1;
        dt_status st = dt_store_wait(pg->store, keys, nkeys, slice);
        if (st == DT_OK)
            return DT_OK;
        if (st != DT_ERR_TIMEOUT)
            return st;
        const char *ak[1] = {"dt/abort"};
        bool        have  = false;
        DT_TRY(dt_store_check(pg->store, ak, 1, &have));
        if (have) {
            void  *v = NULL;
            size_t n = 0;
            DT_TRY(dt_store_get(pg->store, "dt/abort", &v, &n));
            dt_fail(DT_ERR_MISMATCH, "init: %s", (char *)v);
            dt_free(v);
            return DT_ERR_MISMATCH;
        }
        char msg[600];
        if (dt_now_ns() >= deadline) {
            int missing = missing_ranks(pg, keys, nkeys, msg, sizeof msg);
            return dt_fail(DT_ERR_TIMEOUT,
                           "init: timed out after %lld ms waiting for rank%s %s to join (%d of "
                           "%d joined); are they started, with the same MASTER_ADDR, "
                           "MASTER_PORT and job token?",
                           (long long)pg->timeout_ms, missing > 1 ? "s" : "", msg,
                           pg->world - missing, pg->world);
        }
        if (dt_wait_notice_due(&notice)) {
            char t[160];
            int  missing = missing_ranks(pg, keys, nkeys, msg, sizeof msg);
            dt_wait_notice_times(&notice, t, sizeof t);
            DT_WARN("comm",
                    "init: waiting for rank%s %s to join (%d of %d joined; are they started, "
                    "with the same MASTER_ADDR, MASTER_PORT and job token?); %s",
                    missing > 1 ? "s" : "", msg, pg->world - missing, pg->world, t);
        }
    }
}

static dt_status publish_abort(dt_pg *pg, const char *msg) {
    bool swapped;
    return dt_store_compare_set(pg->store, "dt/abort", NULL, 0, msg, strlen(msg), &swapped);
}

// `want`: dt_pg_opts.backend as given (NULL: auto).
static dt_status rendezvous(dt_pg *pg, const char *want, uint64_t deadline) {
    char key[64], me[300], hid[256];
    host_identity(hid, sizeof hid);
    // One process per rank: the first to claim a rank keeps it.
    snprintf(key, sizeof key, "dt/claim/%d", pg->rank);
    snprintf(me, sizeof me, "pid %d on %s", (int)getpid(), hid);
    bool swapped;
    DT_TRY(dt_store_compare_set(pg->store, key, NULL, 0, me, strlen(me), &swapped));
    if (!swapped) {
        void *v = NULL;
        DT_TRY(dt_store_get(pg->store, key, &v, NULL));
        dt_fail(DT_ERR_MISMATCH,
                "init: rank %d is already taken by %s (two processes with RANK=%d, or a "
                "store left from an earlier run?)",
                pg->rank, (char *)v, pg->rank);
        dt_free(v);
        return DT_ERR_MISMATCH;
    }
    // The first rank to arrive fixes the world size; the others compare.
    char w[32];
    snprintf(w, sizeof w, "%d", pg->world);
    DT_TRY(dt_store_compare_set(pg->store, "dt/world", NULL, 0, w, strlen(w), &swapped));
    if (!swapped) {
        void *v = NULL;
        DT_TRY(dt_store_get(pg->store, "dt/world", &v, NULL));
        if (strcmp(v, w) != 0) {
            char msg[300];
            snprintf(msg, sizeof msg,
                     "world size mismatch: rank %d has WORLD_SIZE=%d, but the ranks before it "
                     "have WORLD_SIZE=%s",
                     pg->rank, pg->world, (char *)v);
            dt_free(v);
            publish_abort(pg, msg);
            return dt_fail(DT_ERR_MISMATCH, "init: %s", msg);
        }
        dt_free(v);
    }
    // The backend asked for: ranks that ask for different ones would each wait in their
    // own backend's set-up until the timeout, saying nothing of why. Rank 0's is the
    // job's; the others compare theirs before they announce themselves, so a rank that
    // differs fails here and the rest, waiting for it below, see its abort (rank 0,
    // which keeps the store, included).
    const char *b     = want && *want ? want : "auto";
    b                 = strcmp(b, "gloo") == 0 ? "tcp" : b; // its alias
    const char *bk[1] = {"dt/backend/0"};
    if (pg->rank == 0) {
        DT_TRY(dt_store_set(pg->store, bk[0], b, strlen(b)));
    } else {
        void *v = NULL;
        DT_TRY(rendezvous_wait(pg, bk, 1, deadline));
        DT_TRY(dt_store_get(pg->store, bk[0], &v, NULL));
        if (strcmp(v, b) != 0) {
            char msg[300];
            snprintf(msg, sizeof msg,
                     "backend mismatch: rank %d asks for backend %s, rank 0 for %s (give every "
                     "rank the same --backend)",
                     pg->rank, b, (char *)v);
            dt_free(v);
            publish_abort(pg, msg);
            return dt_fail(DT_ERR_MISMATCH, "init: %s", msg);
        }
        dt_free(v);
    }
    snprintf(key, sizeof key, "dt/rank/%d", pg->rank);
    DT_TRY(dt_store_set(pg->store, key, hid, strlen(hid)));
    // Wait for everyone, then read the hosts.
    char        *kbuf = dt_alloc((size_t)pg->world * 32);
    const char **keys = dt_alloc((size_t)pg->world * sizeof *keys);
    if (!kbuf || !keys) {
        dt_free(kbuf);
        dt_free(keys);
        return DT_ERR_NOMEM;
    }
    for (int r = 0; r < pg->world; r++) {
        snprintf(kbuf + r * 32, 32, "dt/rank/%d", r);
        keys[r] = kbuf + r * 32;
    }
    dt_status st = rendezvous_wait(pg, keys, (size_t)pg->world, deadline);
    for (int r = 0; st == DT_OK && r < pg->world; r++) {
        void *v = NULL;
        st      = dt_store_get(pg->store, keys[r], &v, NULL);
        if (st == DT_OK)
            pg->host_ids[r] = v;
    }
    dt_free(kbuf);
    dt_free(keys);
    return st;
}

static dt_status choose_backend(dt_pg *pg, const char *want) {
    if (!want || !*want || strcmp(want, "auto") == 0) {
        pg->be = dt_backend_auto(pg);
        if (pg->rank == 0)
            DT_INFO("comm", "backend auto: chose %s (%d ranks, %s%s)", pg->be->name, pg->world,
                    pg->all_local ? "all on one host" : "on more than one host",
                    pg->store_via_mpi ? "; store address through MPI" : "");
        return DT_OK;
    }
    // "gloo" is what PyTorch scripts name their CPU backend (init_process_group(backend=
    // 'gloo')): the same role as tcp here (point-to-point sockets, any host), so it is
    // accepted as its alias and the group reports "tcp".
    if (strcmp(want, "gloo") == 0)
        want = "tcp";
    const dt_backend_ops *be = dt_backend_find(want);
    if (!be)
        return dt_fail(DT_ERR_ARG,
                       "init: expected backend \"auto\", \"shm\", \"tcp\" (alias \"gloo\"), "
                       "\"hybrid\", \"mpi\" or \"nccl\", found \"%s\"",
                       want);
    if (!be->built)
        return dt_fail(DT_ERR_UNSUPPORTED, "init: backend %s is not built into this library", want);
    char why[200] = "refused by the backend";
    if (be->usable && !be->usable(pg, false, why, sizeof why))
        return dt_fail(DT_ERR_UNSUPPORTED, "init: backend %s cannot serve this group: %s", want,
                       why);
    pg->be = be;
    return DT_OK;
}

// Parses "tcp://host:port" into host and port.
static dt_status parse_tcp_method(const char *m, char *host, size_t n, int *port) {
    const char *hp    = m + strlen("tcp://");
    const char *colon = strrchr(hp, ':');
    if (!colon || colon == hp || (size_t)(colon - hp) >= n)
        return dt_fail(DT_ERR_ARG, "init: expected \"tcp://host:port\", found \"%s\"", m);
    memcpy(host, hp, (size_t)(colon - hp));
    host[colon - hp] = '\0';
    long p;
    DT_TRY(dt_parse_long(colon + 1, 1, 65535, "init: the port of tcp://host:port", &p));
    *port = (int)p;
    return DT_OK;
}

void dt_pg_free(dt_pg *pg) {
    if (!pg)
        return;
    if (pg->root != pg) {
        dt_pg_group_free(pg);
        return;
    }
    if (pg->thread_started) {
        pthread_mutex_lock(&pg->mu);
        pg->stop = true;
        pthread_cond_broadcast(&pg->cv);
        pthread_mutex_unlock(&pg->mu);
        pthread_join(pg->thread, NULL);
    }
    // Sends the backend still holds reach their receivers before this rank says bye
    // (bounded by the timeout; the lane is ours alone now).
    dt_pg_flush_sends(pg);
    if (pg->next_group)
        DT_WARN("comm",
                "dt_pg_free: the world group is freed before its sub-groups (group %u "
                "is still alive); free sub-groups first",
                pg->next_group->gid);
    // Liveness first: its "bye" tells the peers this rank leaves on purpose.
    dt_live_free(pg->live);
    if (pg->be && pg->be_ctx)
        pg->be->free(pg->be_ctx);
    dt_algo_cfg_free(&pg->algo);
    dt_store_free(pg->be_store);
    dt_store_free(pg->store);
    if (pg->host_ids)
        for (int r = 0; r < pg->world; r++)
            dt_free(pg->host_ids[r]);
    dt_free(pg->host_ids);
    dt_free(pg->send_seq);
    dt_free(pg->recv_seq);
    dt_free(pg->token);
    if (pg->abort_fd >= 0)
        close(pg->abort_fd);
    if (pg->pool)
        dt_work_pool_unref(pg->pool);
    pthread_mutex_destroy(&pg->mu);
    pthread_cond_destroy(&pg->cv);
    dt_free(pg);
}

// Creates the group; NULL with the error recorded (every failure path calls dt_fail).
static dt_pg *pg_create(const char *method, int rank, int world, const dt_pg_opts *opts) {
    dt_pg_opts o = opts ? *opts : dt_pg_opts_default();
    if (!method || !*method)
        method = "env://";
    bool          env      = strncmp(method, "env://", 6) == 0;
    bool          want_mpi = o.backend && strcmp(o.backend, "mpi") == 0;
    dt_launch_env le;
    if (dt_launch_env_read(&le) != DT_OK)
        return NULL;
    // The store's address goes through MPI when an MPI launcher started this process
    // and MASTER_ADDR / MASTER_PORT do not give it (docs/mpi.md).
    const char *maddr = getenv("MASTER_ADDR"), *mport = getenv("MASTER_PORT");
    // (A lone process asking for mpi is a one-rank MPI job: MPI's singleton.)
    bool mpi_store = env && (le.is_mpi || (want_mpi && le.launcher == DT_LAUNCHER_NONE)) &&
                     !(maddr && *maddr && mport && *mport);
    if (world < 0 && le.launcher == DT_LAUNCHER_NONE && !want_mpi) {
        dt_fail(DT_ERR_ARG, "init: environment variable WORLD_SIZE is not set (expected the "
                            "number of ranks, e.g. WORLD_SIZE=2, or a start by mpirun or srun)");
        return NULL;
    }
    if (world < 0)
        world = le.world;
    if (rank < 0 && le.launcher == DT_LAUNCHER_NONE && !want_mpi) {
        dt_fail(DT_ERR_ARG,
                "init: environment variable RANK is not set (expected this "
                "process's rank in [0, %d), e.g. RANK=0)",
                world);
        return NULL;
    }
    if (rank < 0)
        rank = le.rank;
    if (le.launcher != DT_LAUNCHER_NONE && world > 0 && rank >= world) {
        dt_fail(DT_ERR_ARG, "init: %s=%d is out of range: expected 0 <= rank < %d", le.rank_var,
                rank, world);
        return NULL;
    }
    int64_t timeout = o.timeout_ms;
    if (timeout == 0 && dt_default_timeout_ms(&timeout) != DT_OK)
        return NULL;
    uint64_t deadline = timeout < 0 ? UINT64_MAX : dt_deadline_ns(timeout);
    int64_t  hb_ms, live_ms; // checked before anything else is reached (liveness.c)
    if (dt_live_config(&hb_ms, &live_ms) != DT_OK)
        return NULL;

    // MPI: initialised only for the mpi backend or to hand out the store's address.
    dt_mpi_boot_res boot = {.rank = -1};
    if (want_mpi || mpi_store) {
        char hid[256];
        host_identity(hid, sizeof hid);
        long port = 0;
        if (mport && *mport &&
            dt_parse_long(mport, 0, 65535, "environment variable MASTER_PORT", &port) != DT_OK)
            return NULL;
        dt_mpi_boot_req req = {.env         = &le,
                               .need_store  = mpi_store,
                               .addr        = maddr && *maddr ? maddr : NULL,
                               .port        = (int)port,
                               .host_id     = hid,
                               .token       = dt_token_resolve(o.token),
                               .no_token    = o.token && !*o.token,
                               .timeout_ms  = timeout,
                               .deadline_ns = deadline};
        if (dt_backend_mpi_bootstrap(&req, &boot) != DT_OK) {
            dt_fail_context("init (%s)", want_mpi ? "backend mpi" : "store address through MPI");
            return NULL;
        }
        if (world < 0)
            world = boot.world;
        if (rank < 0)
            rank = boot.rank;
    }
    if (world < 1 || rank < 0 || rank >= world) {
        if (world < 1)
            dt_fail(DT_ERR_ARG, "init: expected a world size >= 1, found %d", world);
        else
            dt_fail(DT_ERR_ARG, "init: rank %d is out of range: expected 0 <= rank < %d", rank,
                    world);
        dt_store_free(boot.store);
        return NULL;
    }

    dt_pg *pg = dt_alloc_zero(sizeof *pg);
    if (!pg) {
        dt_store_free(boot.store);
        return NULL;
    }
    pg->rank       = rank;
    pg->world      = world;
    pg->root       = pg;
    pg->next_gid   = 1;
    pg->timeout_ms = timeout;
    pg->abort_fd   = -1;
    pthread_mutex_init(&pg->mu, NULL);
    pthread_cond_init(&pg->cv, NULL);
    atomic_init(&pg->poisoned, false);
    atomic_init(&pg->sends_held, false);
    dt_log_set_rank(rank, world);
    pg->store         = boot.store;
    pg->store_via_mpi = boot.store != NULL;
    pg->abort_fd      = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    pg->pool          = dt_work_pool_new();
    if (!pg->pool)
        goto fail;
    pg->host_ids = dt_alloc_zero((size_t)world * sizeof *pg->host_ids);
    pg->send_seq = dt_alloc_zero((size_t)world * sizeof *pg->send_seq);
    pg->recv_seq = dt_alloc_zero((size_t)world * sizeof *pg->recv_seq);
    if (pg->abort_fd < 0) {
        dt_fail_errno(DT_ERR_IO, "init: eventfd");
        goto fail;
    }
    if (!pg->host_ids || !pg->send_seq || !pg->recv_seq)
        goto fail;
    const char *tok = boot.store ? (boot.token[0] ? boot.token : NULL) : dt_token_resolve(o.token);
    if (tok && !(pg->token = dt_strdup(tok)))
        goto fail;

    dt_store_opts so = {.timeout_ms = timeout, .token = o.token};
    if (pg->store) {
        // reached through MPI above
    } else if (env || strncmp(method, "tcp://", 6) == 0) {
        char host[256];
        int  port = 0;
        if (env) {
            const char *p = getenv("MASTER_PORT");
            if (!p || !*p) {
                dt_fail(DT_ERR_ARG, "init: environment variable MASTER_PORT is not set (expected "
                                    "the port of rank 0's store, e.g. MASTER_PORT=29500)");
                goto fail;
            }
            long pv;
            if (dt_parse_long(p, rank == 0 ? 0 : 1, 65535, "environment variable MASTER_PORT",
                              &pv) != DT_OK)
                goto fail;
            port          = (int)pv;
            const char *a = getenv("MASTER_ADDR");
            if ((!a || !*a) && rank != 0) {
                dt_fail(DT_ERR_ARG, "init: environment variable MASTER_ADDR is not set (expected "
                                    "the host of rank 0, e.g. MASTER_ADDR=10.0.0.1)");
                goto fail;
            }
            snprintf(host, sizeof host, "%s", a && *a ? a : "127.0.0.1");
        } else if (parse_tcp_method(method, host, sizeof host, &port) != DT_OK) {
            goto fail;
        }
        // Clients that reach rank 0 at a loopback address are all on this host: the
        // store need not listen anywhere else.
        so.loopback_only = rank == 0 && dt_sock_is_loopback(host);
        if (dt_store_new_tcp(&pg->store, host, port, rank == 0, &so) != DT_OK) {
            dt_fail_context("init (rank %d of %d)", rank, world);
            goto fail;
        }
    } else if (strncmp(method, "file://", 7) == 0) {
        if (dt_store_new_file(&pg->store, method + 7, &so) != DT_OK) {
            dt_fail_context("init (rank %d of %d)", rank, world);
            goto fail;
        }
    } else {
        dt_fail(DT_ERR_ARG,
                "init: expected an init method \"env://\", \"tcp://host:port\" or "
                "\"file:///path\", found \"%s\"",
                method);
        goto fail;
    }
    if (rendezvous(pg, o.backend, deadline) != DT_OK)
        goto fail;

    // Hosts: local rank and size (the environment wins when it says).
    pg->all_local  = true;
    pg->local_rank = pg->local_world = 0;
    for (int r = 0; r < world; r++) {
        bool same = strcmp(pg->host_ids[r], pg->host_ids[rank]) == 0;
        pg->all_local &= same;
        if (same) {
            if (r < rank)
                pg->local_rank++;
            pg->local_world++;
        }
    }
    if (le.local_rank >= 0)
        pg->local_rank = le.local_rank;
    if (le.local_world >= 0)
        pg->local_world = le.local_world;

    if (choose_backend(pg, o.backend) != DT_OK || dt_algo_cfg_init(&pg->algo) != DT_OK)
        goto fail;
    // Heartbeats between the ranks, from now on: a rank that freezes during the
    // backend's set-up is found too.
    char live_addr[256];
    dt_sock_public_addr(pg->store, rank, pg->all_local, live_addr, sizeof live_addr);
    if (dt_live_new(&pg->live, pg, pg->store, live_addr, deadline) != DT_OK)
        goto fail;
    char prefix[64];
    snprintf(prefix, sizeof prefix, "dt/%s", pg->be->name);
    if (dt_store_new_prefix(&pg->be_store, pg->store, prefix) != DT_OK)
        goto fail;
    if (pg->be->init(pg, pg->be_store, deadline, &pg->be_ctx) != DT_OK) {
        dt_fail_context("init: backend %s", pg->be->name);
        goto fail;
    }
    if (pthread_create(&pg->thread, NULL, dt_pg_progress_main, pg) != 0) {
        dt_fail(DT_ERR_IO, "init: could not start the progress thread");
        goto fail;
    }
    pg->thread_started = true;
    if (dt_pg_set_xport(pg) != DT_OK) {
        dt_fail_context("init: backend %s", pg->be->name);
        goto fail;
    }
    // The init barrier: everyone has a working backend before anyone returns.
    dt_op ob    = DT_OP_INIT(DT_COLL_INIT);
    ob.fp.coll  = DT_COLL_INIT;
    ob.fp.dtype = DT_FLOAT32;
    ob.fp.root  = -1;
    if (dt_pg_submit(pg, &ob, NULL) != DT_OK) {
        dt_fail_context("init");
        goto fail;
    }
    if (dt_live_wait_peers(pg->live, deadline) != DT_OK)
        goto fail;
    return pg;
fail:;
    dt_status st = dt_last_status();
    char      msg[MSG_LEN];
    snprintf(msg, sizeof msg, "%s", dt_last_error());
    if (st == DT_OK)
        st = DT_ERR_NOMEM, snprintf(msg, sizeof msg, "init: out of memory");
    dt_pg_free(pg);
    dt_fail(st, "%s", msg);
    return NULL;
}

// DT_* variables that are not settings (a typo: DT_TIMOUT_MS) are named once per
// process, with the nearest setting, when the first group is created.
static void warn_unknown_settings(void) {
    static atomic_bool said;
    if (atomic_exchange(&said, true))
        return;
    char msg[1024];
    if (dt_settings_check_unknown(msg, sizeof msg) > 0)
        DT_WARN("comm", "%s (dtrain-mnist --help-env lists every setting)", msg);
}

dt_status dt_pg_new(dt_pg **out, const char *init_method, int rank, int world,
                    const dt_pg_opts *opts) {
    warn_unknown_settings();
    *out = pg_create(init_method, rank, world, opts);
    if (*out)
        return DT_OK;
    dt_status st = dt_last_status();
    return st != DT_OK ? st : dt_fail(DT_ERR_STATE, "init: failed without a message");
}

dt_status dt_pg_new_from_env(dt_pg **out, const dt_pg_opts *opts) {
    return dt_pg_new(out, "env://", -1, -1, opts);
}
