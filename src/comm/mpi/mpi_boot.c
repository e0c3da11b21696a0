// mpi_boot.c: MPI's life in this process (initialise once, finalise at a successful
// exit, never after a stuck operation), the waits every MPI call of the library goes
// through, MPI's errors as dt_status, and the bootstrap that hands rank 0's store
// address and a job token to every rank with MPI_Bcast (as llm.c hands out its NCCL id),
// so a job started by mpirun or srun needs no MASTER_ADDR / MASTER_PORT. The backend
// itself is mpi.c.
#include "comm/comm_impl.h"
#include "comm/mpi/mpi_impl.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static pthread_mutex_t init_mu = PTHREAD_MUTEX_INITIALIZER;
static bool            initialised;       // guarded by init_mu
static bool            init_by_us;        // we called MPI_Init_thread (we finalise)
static pid_t           init_pid;          // finalise only in that process, not in forks
static int             thread_level = -1; // as provided
static MPI_Comm        lib_world    = MPI_COMM_NULL;
static atomic_bool     stuck;
static pthread_mutex_t call_mu = PTHREAD_MUTEX_INITIALIZER;

void dt_mpi_lock(void) {
    if (thread_level < MPI_THREAD_MULTIPLE)
        pthread_mutex_lock(&call_mu);
}

void dt_mpi_unlock(void) {
    if (thread_level < MPI_THREAD_MULTIPLE)
        pthread_mutex_unlock(&call_mu);
}

void dt_mpi_mark_stuck(void) {
    atomic_store(&stuck, true);
}
bool dt_mpi_stuck(void) {
    return atomic_load(&stuck);
}
MPI_Comm dt_mpi_world(void) {
    return lib_world;
}
int dt_mpi_thread_level(void) {
    return thread_level;
}

const char *dt_mpi_error_string(int rc, char *buf, size_t n) {
    char s[MPI_MAX_ERROR_STRING];
    int  len = 0;
    if (MPI_Error_string(rc, s, &len) != MPI_SUCCESS)
        snprintf(s, sizeof s, "MPI error %d", rc);
    snprintf(buf, n, "%s", s);
    return buf;
}

dt_status dt_mpi_status_of(int rc) {
    int cls = MPI_ERR_OTHER;
    MPI_Error_class(rc, &cls);
    if (cls == MPI_ERR_TRUNCATE)
        return DT_ERR_MISMATCH;
    if (cls == MPI_ERR_NO_MEM)
        return DT_ERR_NOMEM;
#ifdef MPIX_ERR_PROC_FAILED
    if (cls == MPIX_ERR_PROC_FAILED)
        return DT_ERR_PEER;
#endif
    return DT_ERR_IO;
}

// At exit with status 0 only: a failing process leaves without MPI_Finalize, so the
// launcher stops the whole job at once instead of every rank waiting in MPI_Finalize
// for one that will not come. After a stuck operation MPI_Finalize would hang: skip it.
static void finalize_at_exit(int status, void *arg) {
    (void)arg;
    if (status != 0 || getpid() != init_pid || atomic_load(&stuck))
        return;
    int fin = 0;
    MPI_Finalized(&fin);
    if (!fin)
        MPI_Finalize();
}

dt_status dt_mpi_wait(MPI_Request *req, uint64_t deadline_ns, const dt_pg *pg, MPI_Status *status,
                      int *rc) {
    uint64_t start = dt_now_ns();
    for (;;) {
        int done = 0;
        dt_mpi_lock();
        int r = MPI_Test(req, &done, status);
        dt_mpi_unlock();
        if (r != MPI_SUCCESS || done) {
            *rc = r;
            return DT_OK;
        }
        uint64_t now = dt_now_ns();
        if (pg && dt_pg_aborted(pg)) {
            dt_mpi_mark_stuck();
            return DT_ERR_STATE;
        }
        if (now >= deadline_ns) {
            dt_mpi_mark_stuck();
            return DT_ERR_TIMEOUT;
        }
        // Spin while a reply is likely to be microseconds away, then give the core to
        // the other processes (an oversubscribed host), then sleep briefly.
        uint64_t waited = now - start;
        if (waited < 50000)
            continue;
        if (waited < 2000000) {
            sched_yield();
        } else {
            struct timespec ts = {0, 50000};
            nanosleep(&ts, NULL);
        }
    }
}

// Duplicates MPI_COMM_WORLD without blocking past the deadline (MPI_Comm_idup).
static dt_status make_lib_world(uint64_t deadline_ns, const char *what) {
    MPI_Request req;
    char        es[MPI_MAX_ERROR_STRING];
    int         rc = MPI_Comm_idup(MPI_COMM_WORLD, &lib_world, &req);
    if (rc != MPI_SUCCESS)
        return dt_fail(dt_mpi_status_of(rc), "%s: MPI_Comm_idup failed: %s", what,
                       dt_mpi_error_string(rc, es, sizeof es));
    dt_status st = dt_mpi_wait(&req, deadline_ns, NULL, MPI_STATUS_IGNORE, &rc);
    if (st == DT_ERR_TIMEOUT)
        return dt_fail(st,
                       "%s: timed out waiting for every rank to initialise MPI "
                       "(MPI_Comm_idup of MPI_COMM_WORLD); MPI cannot tell which rank is "
                       "missing",
                       what);
    if (rc != MPI_SUCCESS)
        return dt_fail(dt_mpi_status_of(rc), "%s: MPI_Comm_idup failed: %s", what,
                       dt_mpi_error_string(rc, es, sizeof es));
    MPI_Comm_set_errhandler(lib_world, MPI_ERRORS_RETURN);
    return DT_OK;
}

dt_status dt_mpi_init(uint64_t deadline_ns, const char *what) {
    pthread_mutex_lock(&init_mu);
    dt_status st = DT_OK;
    if (initialised)
        goto out;
    int flag = 0, fin = 0;
    MPI_Finalized(&fin);
    if (fin) {
        st = dt_fail(DT_ERR_UNSUPPORTED,
                     "%s: MPI was already finalised in this process and "
                     "cannot be initialised again",
                     what);
        goto out;
    }
    MPI_Initialized(&flag);
    if (!flag) {
        // MULTIPLE: the mpi backend's watchdog may call MPI_Abort while the progress
        // thread is inside a blocking collective (docs/mpi.md).
        int rc = MPI_Init_thread(NULL, NULL, MPI_THREAD_MULTIPLE, &thread_level);
        if (rc != MPI_SUCCESS) {
            char es[MPI_MAX_ERROR_STRING];
            st = dt_fail(DT_ERR_IO, "%s: MPI_Init_thread failed: %s", what,
                         dt_mpi_error_string(rc, es, sizeof es));
            goto out;
        }
        init_by_us = true;
        init_pid   = getpid();
        // The library owns MPI here: let its errors come back as codes.
        MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
        on_exit(finalize_at_exit, NULL);
    } else {
        MPI_Query_thread(&thread_level);
    }
    if ((st = make_lib_world(deadline_ns, what)) != DT_OK)
        goto out;
    initialised = true;
    DT_DEBUG("comm", "MPI initialised %s, thread level %d", init_by_us ? "here" : "by the program",
             thread_level);
out:
    pthread_mutex_unlock(&init_mu);
    return st;
}

// ------------------------------------------------------------------------- bootstrap

// What rank 0 broadcasts: fixed size, plain bytes.
typedef struct boot_msg {
    int32_t status; // dt_status of rank 0's store start
    int32_t port;
    char    addr[256];
    char    host_id[256];
    char    token[DT_MPI_TOKEN_MAX];
    char    error[512];
} boot_msg;

// An address of this host the other hosts can reach: DT_SOCKET_IFADDR when set (as the
// tcp backend uses it), else the first IPv4 address of an interface that is up and not
// loopback, else the host name.
static void pick_address(char *buf, size_t n) {
    const char *o = dt_setting_str("DT_SOCKET_IFADDR");
    if (o && *o) {
        snprintf(buf, n, "%s", o);
        return;
    }
    struct ifaddrs *ifs = NULL;
    buf[0]              = '\0';
    if (getifaddrs(&ifs) == 0) {
        for (struct ifaddrs *i = ifs; i; i = i->ifa_next) {
            if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET || !(i->ifa_flags & IFF_UP) ||
                (i->ifa_flags & IFF_LOOPBACK))
                continue;
            const struct sockaddr_in *a = (const struct sockaddr_in *)(const void *)i->ifa_addr;
            if (inet_ntop(AF_INET, &a->sin_addr, buf, (socklen_t)n))
                break;
            buf[0] = '\0';
        }
        freeifaddrs(ifs);
    }
    if (!buf[0] && gethostname(buf, n - 1) != 0)
        snprintf(buf, n, "127.0.0.1");
}

// A fresh job token: 128 random bits in hex.
static void make_token(char *buf, size_t n) {
    unsigned char r[16];
    int           fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
    ssize_t       k  = fd >= 0 ? read(fd, r, sizeof r) : -1;
    if (fd >= 0)
        close(fd);
    if (k != (ssize_t)sizeof r) {
        uint64_t a = dt_now_ns() ^ ((uint64_t)getpid() << 32), b = a * 0x9e3779b97f4a7c15ull;
        memcpy(r, &a, 8);
        memcpy(r + 8, &b, 8);
    }
    size_t off = (size_t)snprintf(buf, n, "mpi-");
    for (size_t i = 0; i < sizeof r && off + 2 < n; i++)
        off += (size_t)snprintf(buf + off, n - off, "%02x", r[i]);
}

// Checks that MPI's view of the job is the launcher's.
static dt_status check_world(const dt_launch_env *le, int rank, int world) {
    if (le->launcher == DT_LAUNCHER_NONE || (le->rank == rank && le->world == world))
        return DT_OK;
    return dt_fail(DT_ERR_MISMATCH,
                   "MPI sees rank %d of %d, but %s=%d and %s=%d say rank %d of %d: this MPI "
                   "library did not join the launcher's job (under srun, try srun --mpi=pmix; "
                   "or set MASTER_ADDR and MASTER_PORT and use backend auto, shm or tcp)",
                   rank, world, le->rank_var, le->rank, le->world_var, le->world, le->rank,
                   le->world);
}

dt_status dt_mpi_bootstrap(const dt_mpi_boot_req *req, dt_mpi_boot_res *res) {
    memset(res, 0, sizeof *res);
    DT_TRY(dt_mpi_init(req->deadline_ns, "MPI bootstrap"));
    MPI_Comm w = dt_mpi_world();
    MPI_Comm_rank(w, &res->rank);
    MPI_Comm_size(w, &res->world);
    if (check_world(req->env, res->rank, res->world) != DT_OK) {
        dt_mpi_mark_stuck(); // the job is broken: do not wait in MPI_Finalize
        return DT_ERR_MISMATCH;
    }
    if (!req->need_store)
        return DT_OK;

    boot_msg *m = dt_alloc_zero(sizeof *m);
    if (!m)
        return DT_ERR_NOMEM;
    dt_status st = DT_OK;
    if (res->rank == 0) {
        if (req->no_token)
            m->token[0] = '\0';
        else if (req->token)
            snprintf(m->token, sizeof m->token, "%s", req->token);
        else
            make_token(m->token, sizeof m->token);
        dt_store_opts so = {.timeout_ms = req->timeout_ms, .token = m->token};
        if (dt_store_new_tcp(&res->store, "127.0.0.1", req->port, true, &so) == DT_OK) {
            m->port = dt_store_port(res->store);
            if (req->addr)
                snprintf(m->addr, sizeof m->addr, "%s", req->addr);
            else
                pick_address(m->addr, sizeof m->addr);
            snprintf(m->host_id, sizeof m->host_id, "%s", req->host_id);
        } else {
            m->status = (int32_t)dt_last_status();
            snprintf(m->error, sizeof m->error, "%s", dt_last_error());
        }
    }
    // Every rank enters the broadcast, also when rank 0 failed: it carries the error.
    MPI_Request breq;
    char        es[MPI_MAX_ERROR_STRING];
    int         rc;
    dt_mpi_lock();
    rc = MPI_Ibcast(m, (int)sizeof *m, MPI_BYTE, 0, w, &breq);
    dt_mpi_unlock();
    if (rc == MPI_SUCCESS) {
        st = dt_mpi_wait(&breq, req->deadline_ns, NULL, MPI_STATUS_IGNORE, &rc);
        if (st == DT_ERR_TIMEOUT)
            dt_fail(st, "timed out waiting for every rank to enter the MPI bootstrap "
                        "(MPI_Ibcast of rank 0's store address); MPI cannot tell which rank "
                        "is missing");
    }
    if (st == DT_OK && rc != MPI_SUCCESS)
        st = dt_fail(dt_mpi_status_of(rc), "MPI_Ibcast of rank 0's store address failed: %s",
                     dt_mpi_error_string(rc, es, sizeof es));
    if (st == DT_OK && m->status != DT_OK)
        st = dt_fail(res->rank == 0 ? (dt_status)m->status : DT_ERR_PEER, "%s%s",
                     res->rank == 0 ? "" : "rank 0 could not start the store: ", m->error);
    if (st == DT_OK && res->rank != 0) {
        // Ranks on rank 0's host use loopback (the advertised address may be one that
        // only other hosts route, or a host name that resolves to 127.0.1.1 anyway).
        bool          same = strcmp(m->host_id, req->host_id) == 0;
        const char   *host = same ? "127.0.0.1" : m->addr;
        const char   *tok  = req->no_token ? "" : req->token ? req->token : m->token;
        dt_store_opts so   = {.timeout_ms = req->timeout_ms, .token = tok};
        if (dt_store_new_tcp(&res->store, host, m->port, false, &so) != DT_OK) {
            st = dt_fail_context("rank 0's store at %s:%d (address from the MPI bootstrap%s)", host,
                                 (int)m->port, same ? ", same host" : "");
        }
        snprintf(res->token, sizeof res->token, "%s", tok);
    } else if (st == DT_OK) {
        snprintf(res->token, sizeof res->token, "%s", m->token);
    }
    if (st == DT_OK && res->rank == 0)
        DT_INFO("comm", "store at %s:%d, address handed to %d ranks through MPI", m->addr,
                (int)m->port, res->world);
    dt_free(m);
    if (st != DT_OK) {
        dt_store_free(res->store);
        res->store = NULL;
        dt_mpi_mark_stuck();
    }
    return st;
}
