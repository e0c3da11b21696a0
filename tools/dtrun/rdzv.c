// rdzv.c: how the dtruns of a multi-node job agree, through a store served by node 0's
// dtrun at --master-addr:--master-port (torchrun's static rendezvous).
//
// Keys (all under "dtrun/"):
//   node/<k>            node k's record "pid nproc max_restarts host address"; written
//                       with compare-and-set, so two dtruns claiming one rank are caught
//   token               the workers' DT_JOB_TOKEN, chosen by node 0
//   hb/<k>              node k's heartbeat counter (node 0 watches the others')
//   stop                why the job stops for good (a signal, a lost node)
//   a<n>/port           the workers' MASTER_PORT in attempt n (a free port on node 0)
//   a<n>/failed         set by the first node that sees attempt n fail
//   a<n>/done           how many nodes' workers all succeeded in attempt n
//   a<n>/report/<k>     node k's report once its workers of attempt n are gone
//   exit/<k>            node k has read the outcome (node 0 may close the store)
//
// The main thread never waits on the network while workers run: a monitor thread
// heartbeats, publishes what the main thread posts, and watches the keys above; the
// main thread only reads the monitor's events and the time of its last successful
// store call (a cut link shows as a monitor stuck in a call: "silent").
#include "dtrun.h"

#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/random.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define TICK_MS 50 // how often the monitor looks at the store

static void sleep_ms(int ms) {
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

int dtrun_take_signal(int sig_fd) {
    struct signalfd_siginfo si;
    if (sig_fd >= 0 && read(sig_fd, &si, sizeof si) == (ssize_t)sizeof si)
        return (int)si.ssi_signo;
    return 0;
}

// The address of this host on the way to host:port (no packet is sent).
static void local_addr_towards(const char *host, int port, char *buf, size_t n) {
    snprintf(buf, n, "?");
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_DGRAM}, *res = NULL;
    char            ps[16];
    snprintf(ps, sizeof ps, "%d", port);
    if (getaddrinfo(host, ps, &hints, &res) != 0 || !res)
        return;
    int                     fd = socket(res->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    struct sockaddr_storage ss;
    socklen_t               len = sizeof ss;
    if (fd >= 0 && connect(fd, res->ai_addr, res->ai_addrlen) == 0 &&
        getsockname(fd, (struct sockaddr *)&ss, &len) == 0) {
        void *a = ss.ss_family == AF_INET ? (void *)&((struct sockaddr_in *)&ss)->sin_addr
                                          : (void *)&((struct sockaddr_in6 *)&ss)->sin6_addr;
        inet_ntop(ss.ss_family, a, buf, (socklen_t)n);
    }
    if (fd >= 0)
        close(fd);
    freeaddrinfo(res);
}

static void random_token(char *buf, size_t n) {
    unsigned char rnd[16];
    if (getrandom(rnd, sizeof rnd, 0) != (ssize_t)sizeof rnd) {
        uint64_t t = dt_now_ns() ^ ((uint64_t)getpid() << 32);
        memcpy(rnd, &t, 8);
        memcpy(rnd + 8, &t, 8);
    }
    size_t k = 0;
    for (int i = 0; i < 16 && k + 3 <= n; i++)
        k += (size_t)snprintf(buf + k, n - k, "%02x", rnd[i]);
}

static void key_of(char *buf, size_t n, const char *fmt, int a, int b) {
    snprintf(buf, n, fmt, a, b);
}

// ------------------------------------------------------------------ monitor thread

// Posts events; FAILED and ALL_DONE belong to attempt `n` and are dropped when the main
// thread has moved on to another attempt meanwhile.
static void post_event(dtrun_rdzv *r, unsigned ev, const char *text, int n) {
    pthread_mutex_lock(&r->mu);
    if (n != r->attempt)
        ev &= ~(unsigned)(DTRUN_EV_FAILED | DTRUN_EV_ALL_DONE);
    r->events |= ev;
    if (text)
        snprintf(r->ev_text, sizeof r->ev_text, "%s", text);
    pthread_mutex_unlock(&r->mu);
    uint64_t one = 1;
    ssize_t  w   = write(r->event_fd, &one, sizeof one);
    (void)w;
}

static void mark_ok(dtrun_rdzv *r) {
    atomic_store(&r->last_ok_ns, (int64_t)dt_now_ns());
}

// Sets dtrun/stop unless a reason is already there (the first reason wins).
static dt_status publish_stop(dtrun_rdzv *r, const char *reason) {
    bool swapped;
    return dt_store_compare_set(r->store, "dtrun/stop", NULL, 0, reason, strlen(reason), &swapped);
}

static void *monitor_main(void *arg) {
    dtrun_rdzv *r       = arg;
    int64_t     hb_ms   = r->a->node_timeout_ms / 4;
    hb_ms               = hb_ms < TICK_MS ? TICK_MS : (hb_ms > 1000 ? 1000 : hb_ms);
    uint64_t  next_hb   = 0;
    int64_t  *last_val  = dt_alloc_zero((size_t)r->nnodes * sizeof *last_val);
    uint64_t *last_seen = dt_alloc_zero((size_t)r->nnodes * sizeof *last_seen);
    unsigned  reported  = 0;
    int       cur       = -1;
    int       done_att  = -1; // the attempt whose success this node published
    char      key[96], stop_text[512];
    for (int j = 0; j < r->nnodes && last_seen; j++)
        last_seen[j] = dt_now_ns();
    dt_status st = (last_val && last_seen) ? DT_OK : DT_ERR_NOMEM;
    while (st == DT_OK) {
        pthread_mutex_lock(&r->mu);
        bool quit = r->quit, pf = r->pub_failed, pd = r->pub_done;
        int  n = r->attempt;
        snprintf(stop_text, sizeof stop_text, "%s", r->pub_stop);
        r->pub_stop[0] = '\0';
        r->pub_failed = r->pub_done = false;
        pthread_mutex_unlock(&r->mu);
        if (quit && !stop_text[0] && !pf && !pd)
            break; // what was posted before the quit is published first
        if (stop_text[0]) {
            if ((st = publish_stop(r, stop_text)))
                break;
            pf = true;
            mark_ok(r);
        }
        if (n != cur)
            cur = n, reported &= ~(unsigned)(DTRUN_EV_FAILED | DTRUN_EV_ALL_DONE);
        if (pf) {
            key_of(key, sizeof key, "dtrun/a%d/failed", n, 0);
            char v[16];
            snprintf(v, sizeof v, "%d", r->node);
            if ((st = dt_store_set(r->store, key, v, strlen(v))))
                break;
            mark_ok(r);
        }
        if (pd) {
            key_of(key, sizeof key, "dtrun/a%d/done", n, 0);
            if ((st = dt_store_add(r->store, key, 1, NULL)))
                break;
            done_att = n;
            mark_ok(r);
        }
        if (quit)
            break;
        uint64_t now = dt_now_ns();
        if (now >= next_hb) {
            next_hb = now + (uint64_t)hb_ms * 1000000u;
            key_of(key, sizeof key, "dtrun/hb/%d", r->node, 0);
            if ((st = dt_store_add(r->store, key, 1, NULL)))
                break;
            mark_ok(r);
            for (int j = 1; r->node == 0 && j < r->nnodes; j++) {
                int64_t v;
                key_of(key, sizeof key, "dtrun/hb/%d", j, 0);
                if ((st = dt_store_add(r->store, key, 0, &v)))
                    break;
                now = dt_now_ns();
                if (v != last_val[j]) {
                    last_val[j] = v, last_seen[j] = now;
                    continue;
                }
                pthread_mutex_lock(&r->mu);
                bool lost = r->nodes[j].lost;
                pthread_mutex_unlock(&r->mu);
                double silent_s = (double)(now - last_seen[j]) * 1e-9;
                if (lost || silent_s * 1000.0 <= (double)r->a->node_timeout_ms)
                    continue;
                bool gone_ok = false; // a node that said goodbye is not lost
                key_of(key, sizeof key, "dtrun/exit/%d", j, 0);
                const char *keys[1] = {key};
                if ((st = dt_store_check(r->store, keys, 1, &gone_ok)))
                    break;
                if (gone_ok)
                    continue;
                snprintf(stop_text, sizeof stop_text,
                         "node %d (host %s, address %s) sent no heartbeat for %.1f s: it is lost "
                         "(dead, or the link to it is cut)",
                         j, r->nodes[j].host, r->nodes[j].addr, silent_s);
                pthread_mutex_lock(&r->mu);
                r->nodes[j].lost = true;
                pthread_mutex_unlock(&r->mu);
                if ((st = publish_stop(r, stop_text)))
                    break;
                key_of(key, sizeof key, "dtrun/a%d/failed", n, 0);
                if ((st = dt_store_set(r->store, key, "0", 1)))
                    break;
                post_event(r, DTRUN_EV_NODE_LOST, stop_text, n);
            }
            if (st)
                break;
        }
        if (!(reported & DTRUN_EV_STOP)) {
            const char *keys[1] = {"dtrun/stop"};
            bool        yes     = false;
            if ((st = dt_store_check(r->store, keys, 1, &yes)))
                break;
            if (yes) {
                void  *v = NULL;
                size_t nb;
                if ((st = dt_store_get(r->store, "dtrun/stop", &v, &nb)))
                    break;
                reported |= DTRUN_EV_STOP;
                post_event(r, DTRUN_EV_STOP, v, n);
                dt_free(v);
            }
            mark_ok(r);
        }
        if (done_att == n && !(reported & DTRUN_EV_ALL_DONE)) {
            int64_t v;
            key_of(key, sizeof key, "dtrun/a%d/done", n, 0);
            if ((st = dt_store_add(r->store, key, 0, &v)))
                break;
            mark_ok(r);
            if (v >= r->nnodes) {
                reported |= DTRUN_EV_ALL_DONE;
                post_event(r, DTRUN_EV_ALL_DONE, NULL, n);
            }
        }
        // The tick's pause is a wait on the failure key: news of a failure arrives at once.
        if (n >= 0 && !(reported & DTRUN_EV_FAILED)) {
            key_of(key, sizeof key, "dtrun/a%d/failed", n, 0);
            const char *keys[1] = {key};
            st                  = dt_store_wait(r->store, keys, 1, TICK_MS);
            if (st == DT_OK) {
                reported |= DTRUN_EV_FAILED;
                post_event(r, DTRUN_EV_FAILED, NULL, n);
            } else if (st != DT_ERR_TIMEOUT) {
                break;
            }
            st = DT_OK;
            mark_ok(r);
        } else {
            sleep_ms(TICK_MS);
        }
    }
    if (st != DT_OK) {
        char text[600];
        snprintf(text, sizeof text, "lost contact with the store of node 0 at %s:%d: %s",
                 r->a->master_addr, r->a->master_port, dt_last_error());
        post_event(r, DTRUN_EV_STORE_LOST, text, -2);
    }
    dt_free(last_val);
    dt_free(last_seen);
    atomic_store(&r->monitor_done, true);
    return NULL;
}

// ------------------------------------------------------------------ join

static int join_fail(const char *fmt, const char *detail) {
    char buf[1200];
    snprintf(buf, sizeof buf, fmt, detail);
    dtrun_say("%s", buf);
    return 1;
}

int dtrun_rdzv_join(dtrun_rdzv *r, const dtrun_args *a, int sig_fd) {
    memset(r, 0, sizeof *r);
    r->a        = a;
    r->multi    = a->nnodes > 1;
    r->node     = a->node_rank;
    r->nnodes   = a->nnodes;
    r->sig_fd   = sig_fd;
    r->attempt  = -1;
    r->event_fd = -1;
    pthread_mutex_init(&r->mu, NULL);
    if (gethostname(r->host, sizeof r->host - 1) != 0 || !r->host[0])
        snprintf(r->host, sizeof r->host, "unknown");
    for (char *p = r->host; *p; p++)
        if (*p == ' ')
            *p = '_';
    const char *env_token = dt_setting_str("DT_JOB_TOKEN");
    bool        have_env  = env_token != NULL;
    if (a->elastic_min)
        return dtrun_elastic_join(r, a);
    if (!r->multi) {
        if (have_env)
            snprintf(r->token, sizeof r->token, "%.79s", env_token);
        else
            random_token(r->token, sizeof r->token);
        snprintf(r->addr, sizeof r->addr, "%s", a->master_addr);
        return 0;
    }
    r->event_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    r->nodes    = dt_alloc_zero((size_t)r->nnodes * sizeof *r->nodes);
    if (r->event_fd < 0 || !r->nodes)
        return join_fail("cannot set up the rendezvous: %s", strerror(errno));

    // The agents' token: the user's, else one every node derives alike (it keeps other
    // jobs' dtruns out of this store; it is not a secret).
    char derived[300];
    snprintf(derived, sizeof derived, "dtrun:%s:%d:%d", a->run_id, a->nnodes, a->master_port);
    dt_store_opts so  = dt_store_opts_default();
    so.token          = have_env ? NULL : derived;
    uint64_t deadline = dt_deadline_ns(a->rdzv_timeout_ms);
    if (r->node == 0) {
        so.timeout_ms = a->node_timeout_ms;
        if (dt_store_new_tcp(&r->store, NULL, a->master_port, true, &so) != DT_OK)
            return join_fail("node 0 cannot serve the store: %s", dt_last_error());
        snprintf(r->addr, sizeof r->addr, "%s", a->master_addr);
    } else {
        so.timeout_ms      = 1000; // one connection try; the loop keeps signals answered
        uint64_t said      = dt_now_ns();
        char     last[600] = "";
        while (!r->store) {
            int sig = dtrun_take_signal(sig_fd);
            if (sig)
                return 128 + sig;
            dt_status st = dt_store_new_tcp(&r->store, a->master_addr, a->master_port, false, &so);
            if (st == DT_OK)
                break;
            snprintf(last, sizeof last, "%s", dt_last_error());
            if (st == DT_ERR_MISMATCH || st == DT_ERR_ARG)
                return join_fail("cannot join the store of node 0: %s", last);
            if (dt_ms_left(deadline) <= 0) {
                char msg[1200];
                snprintf(msg, sizeof msg,
                         "waited %.0f s for the store of node 0 at %s:%d; missing: node 0 (%s)",
                         (double)a->rdzv_timeout_ms / 1000.0, a->master_addr, a->master_port, last);
                dtrun_say("%s", msg);
                return 1;
            }
            if (dt_now_ns() - said > 10ull * 1000000000ull) {
                dtrun_say("node %d: still waiting for node 0's store at %s:%d", r->node,
                          a->master_addr, a->master_port);
                said = dt_now_ns();
            }
            sleep_ms(100);
        }
        dt_store_set_timeout(r->store, a->node_timeout_ms);
        local_addr_towards(a->master_addr, a->master_port, r->addr, sizeof r->addr);
    }

    char key[96], rec[256];
    if (r->node == 0) {
        if (have_env)
            snprintf(r->token, sizeof r->token, "%.79s", env_token);
        else
            random_token(r->token, sizeof r->token);
        if (dt_store_set(r->store, "dtrun/token", r->token, strlen(r->token)))
            return join_fail("cannot publish the job token: %s", dt_last_error());
    }
    snprintf(rec, sizeof rec, "%d %d %d %s %s", (int)getpid(), a->nproc, a->max_restarts, r->host,
             r->addr);
    key_of(key, sizeof key, "dtrun/node/%d", r->node, 0);
    bool swapped = false;
    if (dt_store_compare_set(r->store, key, NULL, 0, rec, strlen(rec), &swapped))
        return join_fail("cannot register with the store: %s", dt_last_error());
    r->registered = swapped;
    if (!swapped) {
        void  *v = NULL;
        size_t nb;
        int    pid   = 0;
        char   h[64] = "?", ad[64] = "?";
        if (dt_store_get(r->store, key, &v, &nb) == DT_OK)
            sscanf(v, "%d %*d %*d %63s %63s", &pid, h, ad);
        dt_free(v);
        dtrun_say("node rank %d is already taken by host %s (address %s, pid %d): give every "
                  "dtrun of the job its own --node-rank in [0, %d)",
                  r->node, h, ad, pid, r->nnodes);
        return 1;
    }

    // Wait for every node, saying who is missing.
    bool    *seen  = dt_alloc_zero((size_t)r->nnodes);
    uint64_t said  = dt_now_ns();
    int      nseen = 0;
    if (!seen)
        return join_fail("%s", dt_last_error());
    for (;;) {
        for (int j = 0; j < r->nnodes; j++) {
            if (seen[j])
                continue;
            key_of(key, sizeof key, "dtrun/node/%d", j, 0);
            const char *keys[1] = {key};
            bool        yes     = false;
            if (dt_store_check(r->store, keys, 1, &yes)) {
                dt_free(seen);
                return join_fail("lost the store while nodes were joining: %s", dt_last_error());
            }
            if (yes)
                seen[j] = true, nseen++;
        }
        if (nseen == r->nnodes)
            break;
        int  sig    = dtrun_take_signal(sig_fd);
        bool late   = dt_ms_left(deadline) <= 0;
        bool remind = dt_now_ns() - said > 10ull * 1000000000ull;
        if (sig || late || remind) {
            char   missing[600];
            size_t k   = 0;
            int    nm  = 0;
            missing[0] = '\0';
            for (int j = 0; j < r->nnodes && k < sizeof missing - 16; j++)
                if (!seen[j])
                    k += (size_t)snprintf(missing + k, sizeof missing - k, "%s%d", nm++ ? ", " : "",
                                          j);
            if (sig) {
                dt_free(seen);
                return 128 + sig;
            }
            if (late) {
                dtrun_say("waited %.0f s (--rdzv-timeout) for %d of %d nodes to join the store "
                          "at %s:%d; missing: node%s %s",
                          (double)a->rdzv_timeout_ms / 1000.0, nm, r->nnodes, a->master_addr,
                          a->master_port, nm > 1 ? "s" : "", missing);
                dt_free(seen);
                return 1;
            }
            dtrun_say("node %d: waiting for node%s %s to join (store at %s:%d)", r->node,
                      nm > 1 ? "s" : "", missing, a->master_addr, a->master_port);
            said = dt_now_ns();
        }
        sleep_ms(100);
    }
    dt_free(seen);

    // Every node must run the same configuration.
    int rc = 0;
    for (int j = 0; j < r->nnodes; j++) {
        void  *v = NULL;
        size_t nb;
        key_of(key, sizeof key, "dtrun/node/%d", j, 0);
        if (dt_store_get(r->store, key, &v, &nb))
            return join_fail("cannot read the node records: %s", dt_last_error());
        dtrun_node *nd = &r->nodes[j];
        if (sscanf(v, "%d %d %d %63s %63s", &nd->pid, &nd->nproc, &nd->max_restarts, nd->host,
                   nd->addr) != 5) {
            dtrun_say("node %d's record in the store is malformed: \"%.100s\"", j, (char *)v);
            rc = 1;
        } else if (nd->nproc != a->nproc || nd->max_restarts != a->max_restarts) {
            dtrun_say("node %d (host %s) runs with --nproc-per-node %d --max-restarts %d, but "
                      "this node (%d) with %d and %d: every node must use the same",
                      j, nd->host, nd->nproc, nd->max_restarts, r->node, a->nproc, a->max_restarts);
            rc = 1;
        }
        dt_free(v);
    }
    if (rc) {
        dtrun_rdzv_leave(r);
        return rc;
    }
    if (r->node != 0) {
        void  *v = NULL;
        size_t nb;
        if (dt_store_get(r->store, "dtrun/token", &v, &nb))
            return join_fail("cannot read the job token: %s", dt_last_error());
        snprintf(r->token, sizeof r->token, "%.79s", (char *)v);
        dt_free(v);
    }
    if (r->node == 0) {
        char   list[1500];
        size_t k = 0;
        for (int j = 0; j < r->nnodes && k < sizeof list - 200; j++)
            k += (size_t)snprintf(list + k, sizeof list - k, "%snode %d %s (%s)", j ? ", " : "", j,
                                  r->nodes[j].host, r->nodes[j].addr);
        dtrun_say("all %d nodes joined (world size %d): %s", r->nnodes, r->nnodes * a->nproc, list);
    }
    atomic_store(&r->last_ok_ns, (int64_t)dt_now_ns());
    if (pthread_create(&r->thread, NULL, monitor_main, r) != 0)
        return join_fail("cannot start the monitor thread: %s", strerror(errno));
    r->thread_started = true;
    return 0;
}

// ------------------------------------------------------------------ attempts

void dtrun_rdzv_post_failed(dtrun_rdzv *r) {
    if (!r->multi)
        return;
    pthread_mutex_lock(&r->mu);
    r->pub_failed = true;
    pthread_mutex_unlock(&r->mu);
}

void dtrun_rdzv_post_done(dtrun_rdzv *r) {
    if (!r->multi)
        return;
    pthread_mutex_lock(&r->mu);
    r->pub_done = true;
    pthread_mutex_unlock(&r->mu);
}

void dtrun_rdzv_post_stop(dtrun_rdzv *r, const char *reason) {
    if (!r->multi)
        return;
    pthread_mutex_lock(&r->mu);
    snprintf(r->pub_stop, sizeof r->pub_stop, "%s", reason);
    pthread_mutex_unlock(&r->mu);
}

unsigned dtrun_rdzv_take_events(dtrun_rdzv *r, char *text, size_t n) {
    if (!r->multi)
        return 0;
    uint64_t v;
    ssize_t  k = read(r->event_fd, &v, sizeof v);
    (void)k;
    pthread_mutex_lock(&r->mu);
    unsigned ev = r->events;
    r->events   = 0;
    if (text && n)
        snprintf(text, n, "%s", r->ev_text);
    pthread_mutex_unlock(&r->mu);
    if (ev & DTRUN_EV_STORE_LOST)
        r->store_lost = true;
    return ev;
}

bool dtrun_rdzv_silent(dtrun_rdzv *r, int64_t *silent_ms) {
    if (!r->multi || r->node == 0 || !r->thread_started)
        return false;
    int64_t ms = ((int64_t)dt_now_ns() - atomic_load(&r->last_ok_ns)) / 1000000;
    if (silent_ms)
        *silent_ms = ms;
    return ms > r->a->node_timeout_ms;
}

int dtrun_rdzv_begin(dtrun_rdzv *r, int attempt, int *port) {
    const dtrun_args *a = r->a;
    if (!r->multi) { // (elastic: the rendezvous store, where the workers meet)
        *port = a->port_given ? a->master_port : dt_free_port();
        if (!*port) {
            dtrun_say("no free TCP port found for the workers' store (tried 500 in 20000-32767)");
            return 1;
        }
        return 0;
    }
    pthread_mutex_lock(&r->mu);
    r->attempt = attempt;
    r->events &= ~(unsigned)(DTRUN_EV_FAILED | DTRUN_EV_ALL_DONE); // the last attempt's
    pthread_mutex_unlock(&r->mu);
    char key[96];
    key_of(key, sizeof key, "dtrun/a%d/port", attempt, 0);
    if (r->node == 0) {
        *port = dt_free_port();
        char v[16];
        snprintf(v, sizeof v, "%d", *port);
        if (!*port) {
            dtrun_say("no free TCP port found for the workers' store (tried 500 in 20000-32767)");
            publish_stop(r, "node 0 found no free port for the workers' store");
            return 1;
        }
        if (dt_store_set(r->store, key, v, strlen(v))) {
            dtrun_say("cannot publish the workers' port: %s", dt_last_error());
            return 1;
        }
        return 0;
    }
    const char *keys[1] = {key};
    for (;;) {
        int sig = dtrun_take_signal(r->sig_fd);
        if (sig) {
            char why[160];
            snprintf(why, sizeof why, "interrupted by SIG%s on node %d (host %s)",
                     sigabbrev_np(sig) ? sigabbrev_np(sig) : "?", r->node, r->host);
            dtrun_rdzv_post_stop(r, why);
            return 128 + sig;
        }
        char     text[600];
        unsigned ev = dtrun_rdzv_take_events(r, text, sizeof text);
        if (ev & (DTRUN_EV_STOP | DTRUN_EV_STORE_LOST)) {
            dtrun_say("%s", text);
            return 1;
        }
        if (dtrun_rdzv_silent(r, NULL)) {
            r->store_lost = true;
            dtrun_say("lost contact with the store of node 0 at %s:%d (silent for more than "
                      "%.1f s)",
                      a->master_addr, a->master_port, (double)a->node_timeout_ms / 1000.0);
            return 1;
        }
        dt_status st = dt_store_wait(r->store, keys, 1, 100);
        if (st == DT_ERR_TIMEOUT)
            continue;
        void  *v = NULL;
        size_t nb;
        long   p;
        if (st || (st = dt_store_get(r->store, key, &v, &nb)) ||
            (st = dt_parse_long(v, 1, 65535, "the workers' port from node 0", &p))) {
            dtrun_say("cannot learn the workers' port: %s", dt_last_error());
            dt_free(v);
            return 1;
        }
        dt_free(v);
        *port = (int)p;
        return 0;
    }
}

void dtrun_rdzv_end(dtrun_rdzv *r, int attempt, dtrun_report *mine, dtrun_report **out, int *nout,
                    bool *stop) {
    const dtrun_args *a   = r->a;
    int               n   = r->multi ? r->nnodes : 1;
    dtrun_report     *all = dt_alloc_zero((size_t)n * sizeof *all);
    *out                  = all;
    *nout                 = all ? n : 0;
    *stop                 = mine->reason[0] != '\0';
    if (!all)
        return;
    for (int j = 0; j < n; j++)
        all[j].node = r->multi ? j : r->node;
    int me      = r->multi ? r->node : 0;
    all[me]     = *mine; // takes its failure records
    mine->fail  = NULL;
    mine->nfail = 0;
    if (!r->multi) {
        snprintf(all[0].where, sizeof all[0].where, "host %s", r->host);
        return;
    }
    for (int j = 0; j < n; j++)
        snprintf(all[j].where, sizeof all[j].where, "host %s, address %s", r->nodes[j].host,
                 r->nodes[j].addr);
    if (r->store_lost) {
        *stop = true;
        for (int j = 0; j < n; j++)
            all[j].missing = j != me;
        return;
    }
    char  key[96];
    char *text = dtrun_report_encode(&all[me]);
    key_of(key, sizeof key, "dtrun/a%d/report/%d", attempt, r->node);
    dt_status st = text ? dt_store_set(r->store, key, text, strlen(text)) : DT_ERR_NOMEM;
    dt_free(text);
    key_of(key, sizeof key, "dtrun/a%d/failed", attempt, 0);
    if (st == DT_OK)
        st = dt_store_set(r->store, key, "1", 1);
    if (st != DT_OK) {
        dtrun_say("cannot publish this node's report: %s", dt_last_error());
        r->store_lost = true;
        *stop         = true;
        for (int j = 0; j < n; j++)
            all[j].missing = j != me;
        return;
    }
    // The others report once their workers are gone: allow them the stop grace.
    uint64_t deadline = dt_deadline_ns(a->node_timeout_ms + 2 * a->stop_grace_ms);
    bool    *got      = dt_alloc_zero((size_t)n);
    int      ngot     = 1;
    if (got)
        got[me] = true;
    while (got && ngot < n && dt_ms_left(deadline) > 0 && !dtrun_rdzv_silent(r, NULL)) {
        int sig = dtrun_take_signal(r->sig_fd);
        if (sig) {
            r->late_signal = sig; // the user is done waiting
            break;
        }
        for (int j = 0; j < n; j++) {
            pthread_mutex_lock(&r->mu);
            bool lost = r->nodes[j].lost;
            pthread_mutex_unlock(&r->mu);
            if (got[j] || lost)
                continue;
            key_of(key, sizeof key, "dtrun/a%d/report/%d", attempt, j);
            const char *keys[1] = {key};
            bool        yes     = false;
            if (dt_store_check(r->store, keys, 1, &yes))
                break;
            void  *v = NULL;
            size_t nb;
            if (yes && dt_store_get(r->store, key, &v, &nb) == DT_OK) {
                char where[sizeof all[j].where];
                memcpy(where, all[j].where, sizeof where);
                if (dtrun_report_decode(v, &all[j]) != DT_OK)
                    snprintf(all[j].reason, sizeof all[j].reason, "sent an unreadable report: %s",
                             dt_last_error());
                all[j].node = j;
                memcpy(all[j].where, where, sizeof where);
                got[j] = true;
                ngot++;
            }
            dt_free(v);
        }
        // Nodes declared lost by node 0 will not report: stop waiting for them.
        int expect = 0;
        for (int j = 0; j < n; j++) {
            pthread_mutex_lock(&r->mu);
            bool lost = r->nodes[j].lost;
            pthread_mutex_unlock(&r->mu);
            expect += got[j] || !lost;
        }
        if (ngot >= expect)
            break;
        sleep_ms(20);
    }
    for (int j = 0; j < n; j++)
        if (!got || !got[j]) {
            all[j].missing = true;
            *stop          = true;
            char why[200];
            snprintf(why, sizeof why, "node %d sent no report of attempt %d", j, attempt + 1);
            publish_stop(r, why); // the others must not restart without it either
            pthread_mutex_lock(&r->mu);
            bool lost = r->nodes[j].lost;
            pthread_mutex_unlock(&r->mu);
            if (lost)
                snprintf(all[j].reason, sizeof all[j].reason,
                         "lost: it sent no heartbeat for more than %.1f s (dead, or the link to "
                         "it is cut)",
                         (double)a->node_timeout_ms / 1000.0);
        }
    dt_free(got);
    for (int j = 0; j < n; j++)
        if (all[j].reason[0])
            *stop = true;
    const char *keys[1] = {"dtrun/stop"};
    bool        yes     = false;
    if (dt_store_check(r->store, keys, 1, &yes) != DT_OK || yes)
        *stop = true;
}

void dtrun_rdzv_leave(dtrun_rdzv *r) {
    if (r->a->elastic_min)
        dtrun_elastic_leave(r);
    if (!r->multi || !r->store)
        return;
    if (r->thread_started && !r->store_lost && !dtrun_rdzv_silent(r, NULL)) {
        pthread_mutex_lock(&r->mu);
        r->quit = true;
        pthread_mutex_unlock(&r->mu);
        pthread_join(r->thread, NULL);
        r->thread_started = false;
    }
    if (r->thread_started) {
        // The monitor gave up on the store (joinable), or is stuck in a call on a dead
        // link: it keeps the store, and the process ends anyway.
        if (atomic_load(&r->monitor_done))
            pthread_join(r->thread, NULL);
        else
            pthread_detach(r->thread);
        r->thread_started = false;
        return;
    }
    if (r->store_lost)
        return;
    char key[96];
    if (r->node != 0) {
        // Only the dtrun that holds this node rank speaks for it (not one refused as a
        // duplicate).
        key_of(key, sizeof key, "dtrun/exit/%d", r->node, 0);
        if (r->registered)
            dt_store_set(r->store, key, "1", 1);
    } else {
        // Node 0 serves the store: keep it until the others have read the outcome.
        uint64_t deadline = dt_deadline_ns(r->a->node_timeout_ms);
        for (int j = 1; j < r->nnodes; j++) {
            if (!r->nodes || r->nodes[j].lost || r->nodes[j].pid == 0)
                continue; // lost, or never joined
            key_of(key, sizeof key, "dtrun/exit/%d", j, 0);
            const char *keys[1] = {key};
            dt_status   st      = DT_ERR_TIMEOUT;
            while (st == DT_ERR_TIMEOUT && dt_ms_left(deadline) > 0 && !r->late_signal) {
                st      = dt_store_wait(r->store, keys, 1, 50);
                int sig = dtrun_take_signal(r->sig_fd);
                if (sig)
                    r->late_signal = sig;
            }
            if (st != DT_OK)
                break;
        }
    }
    dt_store_free(r->store);
    r->store = NULL;
    dt_free(r->nodes);
    r->nodes = NULL;
    if (r->event_fd >= 0)
        close(r->event_fd);
    r->event_fd = -1;
}
