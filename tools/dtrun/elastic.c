// elastic.c: dtrun under elastic membership (--nnodes MIN:MAX; docs/dtrun.md "Elastic
// jobs"). Each dtrun supervises its own workers as on one node (a worker that fails is
// restarted under --max-restarts and comes back as a joiner); the workers meet, regroup
// and share their state through the rendezvous store at --rdzv-endpoint (the trainer's
// src/train/elastic.c). The first dtrun on the endpoint's host serves that store, for
// the whole job: the job lives as long as that node does.
#include "dtrun.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

// Whether host names an address of this machine (binding to it works).
static bool is_local(const char *host) {
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *res = NULL;
    if (getaddrinfo(host, NULL, &hints, &res) != 0 || !res)
        return false;
    bool local = false;
    for (struct addrinfo *ai = res; ai && !local; ai = ai->ai_next) {
        int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd < 0)
            continue;
        local = bind(fd, ai->ai_addr, ai->ai_addrlen) == 0; // port 0: any
        close(fd);
    }
    freeaddrinfo(res);
    return local;
}

int dtrun_elastic_join(dtrun_rdzv *r, const dtrun_args *a) {
    // The job's token: the user's, else one every node derives alike from the
    // rendezvous (it keeps other jobs out of the store; it is not a secret). The workers
    // prove it to the store and to each other.
    const char *env = dt_setting_str("DT_JOB_TOKEN");
    if (env)
        snprintf(r->token, sizeof r->token, "%.79s", env);
    else
        snprintf(r->token, sizeof r->token, "dtrun-elastic:%.40s:%d", a->run_id, a->master_port);
    snprintf(r->addr, sizeof r->addr, "%s", a->master_addr);
    if (!is_local(a->master_addr))
        return 0; // the workers reach the host's store themselves
    dt_store_opts so = dt_store_opts_default();
    so.token         = r->token;
    so.timeout_ms    = a->node_timeout_ms;
    dt_status st     = dt_store_new_tcp(&r->store, a->master_addr, a->master_port, true, &so);
    if (st == DT_ERR_IO) { // the port is taken: another dtrun of this host serves it
        dt_clear_error();
        r->store = NULL;
        return 0;
    }
    if (st) {
        dtrun_say("cannot serve the rendezvous store at %s:%d: %s", a->master_addr, a->master_port,
                  dt_last_error());
        return 1;
    }
    r->elastic_host = true;
    dtrun_say("serving the rendezvous store of job %s at %s:%d (elastic, %d to %d nodes)",
              a->run_id, a->master_addr, a->master_port, a->elastic_min, a->elastic_max);
    return 0;
}

void dtrun_elastic_leave(dtrun_rdzv *r) {
    if (!r->elastic_host)
        return;
    // Keep the store up until every arrival of the last generation has left (members
    // may still be finishing, a standby must see the end), at most --node-timeout.
    int64_t  g        = 0;
    uint64_t deadline = dt_deadline_ns(r->a->node_timeout_ms);
    if (dt_store_add(r->store, "elastic/gen", 0, &g) == DT_OK) {
        char ckey[64], lkey[64];
        snprintf(ckey, sizeof ckey, "elastic/g%lld/closed", (long long)g);
        snprintf(lkey, sizeof lkey, "elastic/g%lld/left", (long long)g);
        int64_t     world = 0, left = 0;
        void       *v       = NULL;
        const char *keys[1] = {ckey};
        bool        closed  = false;
        if (dt_store_check(r->store, keys, 1, &closed) == DT_OK && closed &&
            dt_store_get(r->store, ckey, &v, NULL) == DT_OK)
            world = strchr(v, ' ') ? atoll(strchr(v, ' ') + 1) : 0; // "W N": N arrived
        dt_free(v);
        while (dt_ms_left(deadline) > 0 && !r->late_signal &&
               dt_store_add(r->store, lkey, 0, &left) == DT_OK && left < world) {
            int sig = dtrun_take_signal(r->sig_fd);
            if (sig)
                r->late_signal = sig;
            struct timespec ts = {0, 20 * 1000000L};
            nanosleep(&ts, NULL);
        }
    }
    dt_store_free(r->store);
    r->store = NULL;
}
